//! Starting pyebpf and py-spy the same way in every measurement, knowing when each is really
//! sampling, and reading what they report at the end.
//!
//! Ready means: pyebpf's perf-event BPF program has run at least once (its `run_cnt` in
//! `/proc/<pid>/fdinfo`, counted because pyebpf turns `kernel.bpf_stats_enabled` on); py-spy has
//! printed "Sampling process …" (after it attached and found the interpreter).
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::Ctx;
use super::proc::{self, BpfStats, Proc};
use super::sys::Reaped;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Pyebpf,
    PySpy,
}

impl Who {
    pub fn name(self) -> &'static str {
        match self {
            Who::Pyebpf => "pyebpf",
            Who::PySpy => "py-spy",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Target {
    Pid(u32),
    /// Every process (pyebpf only).
    All,
}

pub struct Spec {
    pub who: Who,
    pub target: Target,
    /// Hz: per CPU for pyebpf, per process for py-spy.
    pub rate: u64,
    /// The profiler's own `-d` (whole seconds: py-spy takes an integer).
    pub duration_s: Option<u64>,
    pub flags: Vec<&'static str>,
}

impl Spec {
    pub fn new(who: Who, target: Target, rate: u64) -> Self {
        Self {
            who,
            target,
            rate,
            duration_s: None,
            flags: Vec::new(),
        }
    }

    pub fn flags(mut self, flags: &[&'static str]) -> Self {
        self.flags.extend_from_slice(flags);
        self
    }

    pub fn duration(mut self, secs: u64) -> Self {
        self.duration_s = Some(secs);
        self
    }
}

/// A profiler that is sampling.
pub struct Running {
    pub who: Who,
    pub proc: Proc,
    pub out: PathBuf,
    /// `CLOCK_MONOTONIC` when it was seen sampling (polled every 10 ms).
    pub ready_at: f64,
}

/// What a profiler run produced.
pub struct Finished {
    pub reaped: Reaped,
    /// Samples it reports (pyebpf's summary, py-spy's "Samples: N").
    pub samples: Option<u64>,
    /// pyebpf's "lost samples: N".
    pub lost: Option<u64>,
    /// py-spy printed "behind in sampling".
    pub behind: bool,
    /// pyebpf's "in X s".
    pub duration_s: Option<f64>,
    /// The perf-event program's statistics read just before the stop (pyebpf).
    pub bpf: Option<BpfStats>,
    pub out: PathBuf,
    /// Everything it printed on stderr (its summary).
    pub stderr: String,
}

/// Spawns the profiler and waits until it samples (at most `ready_timeout`).
pub fn start(ctx: &Ctx, spec: &Spec, tag: &str) -> Result<Running> {
    let out = ctx.path(
        tag,
        if spec.who == Who::Pyebpf {
            "collapsed"
        } else {
            "raw"
        },
    );
    let mut cmd = match spec.who {
        Who::Pyebpf => {
            let mut c = crate::sh::clean(&ctx.tools.pyebpf);
            c.arg("record");
            match spec.target {
                Target::Pid(pid) => c.args(["-p", &pid.to_string()]),
                Target::All => c.arg("--all"),
            };
            c.args(["-r", &spec.rate.to_string(), "-q", "-f", "collapsed", "-o"])
                .arg(&out);
            c
        }
        Who::PySpy => {
            let Target::Pid(pid) = spec.target else {
                bail!("py-spy has no whole-machine mode")
            };
            let mut c = crate::sh::clean(&ctx.tools.pyspy);
            c.args([
                "record",
                "--pid",
                &pid.to_string(),
                "-r",
                &spec.rate.to_string(),
            ])
            .args(["-f", "raw", "-o"])
            .arg(&out);
            c
        }
    };
    if let Some(d) = spec.duration_s {
        cmd.args(["-d", &d.to_string()]);
    }
    cmd.args(&spec.flags);
    let mut p = Proc::spawn(spec.who.name(), cmd, &ctx.path(tag, "stderr"), false)?;
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut prog_seen: Option<Instant> = None;
    loop {
        if !p.is_running() {
            bail!(
                "{} ended before sampling: {}",
                spec.who.name(),
                p.stderr_tail()
            );
        }
        let ready = match spec.who {
            Who::Pyebpf => match proc::bpf_perf_prog_stats(p.pid) {
                Some(s) if s.run_cnt > 0 => true,
                // Run-time stats off: the program is loaded; give attaching a moment.
                Some(_) => {
                    prog_seen.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(2)
                }
                None => false,
            },
            Who::PySpy => p.stderr().contains("Sampling process"),
        };
        if ready {
            return Ok(Running {
                who: spec.who,
                proc: p,
                out,
                ready_at: super::sys::monotonic_s(),
            });
        }
        if Instant::now() > deadline {
            bail!(
                "{} not sampling after 60 s: {}",
                spec.who.name(),
                p.stderr_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Running {
    /// Stops it now (SIGINT, as Ctrl-C) unless `wait_for_own_end` (its `-d` or the target's
    /// exit): then it gets up to that long first. Reads the BPF statistics before the stop.
    pub fn finish(mut self, wait_for_own_end: Option<Duration>) -> Result<Finished> {
        let mut bpf = None;
        if let Some(d) = wait_for_own_end {
            let deadline = Instant::now() + d;
            while self.proc.is_running() && Instant::now() < deadline {
                if self.who == Who::Pyebpf {
                    bpf = proc::bpf_perf_prog_stats(self.proc.pid).or(bpf);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if self.who == Who::Pyebpf && self.proc.is_running() {
            bpf = proc::bpf_perf_prog_stats(self.proc.pid).or(bpf);
        }
        let (reaped, clean) = self.proc.stop(Duration::from_mins(1));
        let stderr = self.proc.stderr();
        if !clean || reaped.code() != Some(0) {
            bail!(
                "{} {}{}: {}",
                self.who.name(),
                reaped.describe(),
                if clean {
                    ""
                } else {
                    " (killed: no clean stop within 60 s)"
                },
                self.proc.stderr_tail()
            );
        }
        let mut f = Finished {
            reaped,
            samples: None,
            lost: None,
            behind: stderr.contains("behind in sampling"),
            duration_s: None,
            bpf,
            out: self.out,
            stderr: stderr.clone(),
        };
        for line in stderr.lines() {
            match self.who {
                // "pyebpf: N samples from M processes in X s (…)", "pyebpf: lost samples: N"
                Who::Pyebpf => {
                    if let Some(rest) = line.strip_prefix("pyebpf: ") {
                        if let Some(n) = rest.strip_prefix("lost samples: ") {
                            f.lost = n.trim().parse().ok();
                        } else if f.samples.is_none()
                            && let Some((n, tail)) = rest.split_once(" samples from ")
                        {
                            f.samples = n.trim().parse().ok();
                            f.duration_s = tail
                                .split_once(" in ")
                                .and_then(|(_, t)| t.split_whitespace().next()?.parse().ok());
                        }
                    }
                }
                // "py-spy> Wrote raw flamegraph data to '…'. Samples: N Errors: M"
                Who::PySpy => {
                    if let Some((_, n)) = line.split_once("Samples: ") {
                        f.samples = n.split_whitespace().next().and_then(|n| n.parse().ok());
                    }
                }
            }
        }
        if f.samples.is_none() {
            bail!(
                "{}: no sample count in its output: {}",
                self.who.name(),
                self.proc.stderr_tail()
            );
        }
        Ok(f)
    }
}
