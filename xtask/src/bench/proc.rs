//! One started program (workload or profiler): its stdout lines on a channel, its stderr in a
//! file, and its end reaped with `wait4` so that its CPU time and peak RSS are the kernel's.
//! Every wait is bounded; a process still running when its `Proc` is dropped is killed by pid
//! and reaped, so a failed run leaves nothing behind.
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::sys::{self, Reaped};

pub struct Proc {
    pub name: String,
    pub pid: u32,
    /// `CLOCK_MONOTONIC` just before the spawn.
    pub spawned_at: f64,
    stdin: Option<ChildStdin>,
    lines: Option<Receiver<String>>,
    stderr_path: PathBuf,
    reaped: Option<Reaped>,
}

impl Proc {
    /// Starts `cmd` with stderr to `stderr_path`; with `talk`, stdin and stdout are pipes
    /// (the workload protocol), otherwise stdin is null and stdout joins the stderr file.
    pub fn spawn(name: &str, mut cmd: Command, stderr_path: &Path, talk: bool) -> Result<Self> {
        let err = std::fs::File::create(stderr_path)
            .with_context(|| format!("creating {}", stderr_path.display()))?;
        if talk {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        } else {
            cmd.stdin(Stdio::null()).stdout(err.try_clone()?);
        }
        cmd.stderr(err);
        let spawned_at = sys::monotonic_s();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", cmd.get_program().display()))?;
        let lines = child.stdout.take().map(|out| {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        });
        Ok(Self {
            name: name.to_owned(),
            pid: child.id(),
            spawned_at,
            stdin: child.stdin.take(),
            lines,
            stderr_path: stderr_path.to_path_buf(),
            reaped: None,
        })
    }

    /// The next stdout line, waiting until `deadline`.
    fn line(&mut self, deadline: Instant) -> Result<String> {
        let Some(rx) = &self.lines else {
            bail!("{}: stdout is not a pipe", self.name)
        };
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => bail!("{}: no output in time", self.name),
            Err(RecvTimeoutError::Disconnected) => {
                let _ = self.wait(Duration::from_secs(2));
                bail!(
                    "{} ended ({}): {}",
                    self.name,
                    self.reaped.map_or_else(|| "?".into(), |r| r.describe()),
                    self.stderr_tail()
                )
            }
        }
    }

    /// Reads stdout lines until a JSON object with `"event": event` arrives.
    pub fn event(&mut self, event: &str, timeout: Duration) -> Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let line = self.line(deadline)?;
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && v["event"] == event
            {
                return Ok(v);
            }
        }
    }

    /// Writes a line to stdin.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin is not a pipe")?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// Reaps the process if it has ended.
    pub fn poll(&mut self) -> Option<Reaped> {
        if self.reaped.is_none()
            && let Ok(Some(r)) = sys::reap(self.pid, false)
        {
            self.reaped = Some(r);
        }
        self.reaped
    }

    /// Waits at most `timeout` for the end; `None` if it is still running.
    pub fn wait(&mut self, timeout: Duration) -> Option<Reaped> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.poll() {
                return Some(r);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends a signal unless it has been reaped already.
    pub fn signal(&mut self, sig: i32) {
        if self.poll().is_none() {
            let _ = sys::signal(self.pid, sig);
        }
    }

    /// SIGINT, then up to `grace` for a clean end (a profiler writes its output), then SIGKILL.
    /// Returns how it ended and whether it ended by itself within `grace`.
    pub fn stop(&mut self, grace: Duration) -> (Reaped, bool) {
        self.signal(sys::SIGINT);
        if let Some(r) = self.wait(grace) {
            return (r, true);
        }
        (self.kill(), false)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> Reaped {
        if let Some(r) = self.poll() {
            return r;
        }
        let _ = sys::signal(self.pid, sys::SIGKILL);
        match sys::reap(self.pid, true) {
            Ok(Some(r)) => {
                self.reaped = Some(r);
                r
            }
            // Not our child any more (cannot happen): report a kill without usage.
            _ => Reaped {
                status: sys::SIGKILL,
                cpu_s: 0.0,
                maxrss_kib: 0,
            },
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The last few stderr lines, on one line (for error messages).
    pub fn stderr_tail(&self) -> String {
        let text = self.stderr();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        if tail.is_empty() {
            "(no stderr)".into()
        } else {
            tail
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.poll().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stdin = None;
        if self.reaped.is_none() {
            self.kill();
        }
    }
}

/// Statistics of the perf-event BPF program a process holds, from `/proc/<pid>/fdinfo`
/// (run time and count need `kernel.bpf_stats_enabled`, which pyebpf turns on while it runs).
#[derive(Clone, Copy, Debug, Default)]
pub struct BpfStats {
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub verified_insns: Option<u64>,
}

/// `BPF_PROG_TYPE_PERF_EVENT`: pyebpf's sampling program (its tracepoints are type 5).
const PROG_TYPE_PERF_EVENT: u64 = 7;

/// The perf-event program among `pid`'s file descriptors (summed if there are several).
pub fn bpf_perf_prog_stats(pid: u32) -> Option<BpfStats> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut found: Option<BpfStats> = None;
    for fd in fds.flatten() {
        let Ok(link) = std::fs::read_link(fd.path()) else {
            continue;
        };
        if link.to_str() != Some("anon_inode:bpf-prog") {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        )) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if field("prog_type") != Some(PROG_TYPE_PERF_EVENT) {
            continue;
        }
        let s = found.get_or_insert_with(BpfStats::default);
        s.run_time_ns += field("run_time_ns").unwrap_or(0);
        s.run_cnt += field("run_cnt").unwrap_or(0);
        s.verified_insns = s.verified_insns.or(field("verified_insns"));
    }
    found
}
