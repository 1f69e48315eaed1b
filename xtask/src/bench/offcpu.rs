//! Figure 8: `record --idle` (issue 13) on a context-switch-heavy target, beside `py-spy
//! --idle`: the target's slowdown, the `sched_switch` program's cost per context switch (for a
//! target's switches and for everyone else's), intervals sent and lost.
//!
//! Each run starts `switchy.py` (two Python threads handing a token back and forth through
//! semaphores: tens of thousands of switches a second, each with a Python stack), attaches the
//! profiler and waits until it samples, then says go; the workload times its fixed work. In
//! "non-target switches" pyebpf `--idle` follows another Python process (a sleeper), so every
//! switch it sees on the host is someone else's: the cost the program adds to a host. Slowdown
//! is paired by round against "alone". pyebpf's `off-CPU (--idle)` summary line gives the
//! program's mean run time per context switch (kernel BPF statistics) and the interval counts.
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use super::Ctx;
use super::profilers::{self, Spec, Target, Who};
use super::report::Table;
use super::stats::{self, Runs};

const RATE: u64 = 99;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Alone,
    Pyebpf {
        idle: bool,
    },
    PySpyIdle,
    /// pyebpf --idle on a sleeping Python process, the switchy one unprofiled.
    PyebpfOther,
}

const CONFIGS: [(&str, Setup); 5] = [
    ("alone", Setup::Alone),
    ("pyebpf record -p, 99 Hz", Setup::Pyebpf { idle: false }),
    (
        "pyebpf record -p --idle, 99 Hz",
        Setup::Pyebpf { idle: true },
    ),
    ("py-spy record --idle, 99 Hz", Setup::PySpyIdle),
    (
        "pyebpf record --idle -p <a sleeping Python process> (non-target switches)",
        Setup::PyebpfOther,
    ),
];

/// What pyebpf's off-CPU summary line says.
#[derive(Clone, Copy, Default)]
struct OffCpu {
    sent: f64,
    switches: f64,
    lost: f64,
    ns_per_switch: Option<f64>,
    host_switches: f64,
}

/// `pyebpf: off-CPU (--idle): N intervals sent of M switch-outs captured (K too short …), L
/// lost, F not followed (map full); eBPF sched_switch program: X ns per context switch (mean of
/// R switches on the host), …`.
fn parse_offcpu(stderr: &str) -> Option<OffCpu> {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("pyebpf: off-CPU (--idle): "))?;
    let before = |s: &str, needle: &str| -> Option<f64> {
        s.split(needle)
            .next()?
            .split_whitespace()
            .last()?
            .trim_start_matches('(')
            .parse()
            .ok()
    };
    let after = |needle: &str| line.split_once(needle).map(|(_, t)| t);
    Some(OffCpu {
        sent: before(line, " intervals sent")?,
        switches: before(after(" of ")?, " switch-outs")?,
        lost: before(after("), ")?, " lost")?,
        ns_per_switch: after("program: ").and_then(|t| before(t, " ns per context switch")),
        host_switches: after("(mean of ")
            .and_then(|t| before(t, " switches on the host"))
            .unwrap_or(0.0),
    })
}

struct RunOut {
    wall_s: f64,
    cpu_s: f64,
    off: Option<OffCpu>,
    samples: Option<u64>,
}

fn one_run(ctx: &Ctx, setup: Setup, label: &str) -> Result<RunOut> {
    let tag = format!("offcpu-{label}");
    let scale = if ctx.plan.quick { 10.0 } else { 40.0 };
    let args = vec!["--scale".to_owned(), scale.to_string()];
    let (mut w, _) = ctx.workload("switchy.py", &args, &tag)?;
    let mut sleeper = None;
    let spec = match setup {
        Setup::Alone => None,
        Setup::Pyebpf { idle } => Some(
            Spec::new(Who::Pyebpf, Target::Pid(w.pid), RATE).flags(if idle {
                &["--idle"]
            } else {
                &[]
            }),
        ),
        Setup::PySpyIdle => {
            Some(Spec::new(Who::PySpy, Target::Pid(w.pid), RATE).flags(&["--idle"]))
        }
        Setup::PyebpfOther => {
            let (s, _) = ctx.workload("switchy.py", &["--sleeper".to_owned()], &tag)?;
            let spec = Spec::new(Who::Pyebpf, Target::Pid(s.pid), RATE).flags(&["--idle"]);
            sleeper = Some(s);
            Some(spec)
        }
    };
    let running = spec
        .as_ref()
        .map(|s| profilers::start(ctx, s, &tag))
        .transpose()?;
    w.send("go")?;
    let done = w.event("done", Duration::from_mins(10))?;
    let wall_s = done["wall_s"]
        .as_f64()
        .ok_or_else(|| anyhow!("no wall_s in {done}"))?;
    let cpu_s = done["cpu_s"]
        .as_f64()
        .ok_or_else(|| anyhow!("no cpu_s in {done}"))?;
    let _ = w.wait(Duration::from_secs(10));
    let (mut off, mut samples) = (None, None);
    if let Some(r) = running {
        let who = r.who;
        let f = r.finish((who == Who::PySpy).then_some(Duration::from_secs(10)))?;
        samples = f.samples;
        if who == Who::Pyebpf && spec.as_ref().is_some_and(|s| s.flags.contains(&"--idle")) {
            off = Some(parse_offcpu(&f.stderr).ok_or_else(|| anyhow!("no off-CPU line"))?);
        }
    }
    if let Some(mut s) = sleeper {
        let _ = s.send("");
        let _ = s.wait(Duration::from_secs(5));
    }
    if off.is_none() && matches!(setup, Setup::PyebpfOther) {
        bail!("no off-CPU line");
    }
    Ok(RunOut {
        wall_s,
        cpu_s,
        off,
        samples,
    })
}

pub fn measure(ctx: &Ctx) -> Table {
    let mut results: Vec<Vec<Result<RunOut, String>>> =
        CONFIGS.iter().map(|_| Vec::new()).collect();
    for round in 0..ctx.plan.runs {
        for i in super::rotation(CONFIGS.len(), round) {
            let (label, setup) = CONFIGS[i];
            let r = one_run(ctx, setup, label).map_err(|e| format!("{e:#}"));
            ctx.progress(
                &format!("off-CPU {label}"),
                round,
                &r.as_ref()
                    .map(|o| {
                        format!(
                            "{:.2} s wall{}",
                            o.wall_s,
                            o.off
                                .and_then(|x| x.ns_per_switch)
                                .map_or_else(String::new, |n| format!(", {n:.0} ns per switch"))
                        )
                    })
                    .map_err(Clone::clone),
            );
            results[i].push(r);
        }
    }
    table(ctx, &results)
}

fn table(ctx: &Ctx, results: &[Vec<Result<RunOut, String>>]) -> Table {
    let mut t = Table::new(
        "8. Off-CPU profiling (`--idle`) on a switch-heavy target",
        &[
            "Configuration",
            "Wall time of the work",
            "Slowdown (wall)",
            "Target CPU change",
            "Samples",
            "sched_switch program per context switch",
            "Switch-outs captured / intervals sent / lost",
        ],
    );
    t.method(format!(
        "`tests/workloads/bench/switchy.py --scale {}`: two Python threads hand a token back and \
         forth through semaphores (a `futex` wait and wake per hand-off), a fixed number of times, \
         timed by the workload after the profiler samples. Changes are against \"alone\", paired \
         run by run. The `sched_switch` program's time per context switch is its mean run time \
         (`run_time_ns / run_cnt`, kernel BPF statistics, every context switch on the host, \
         pyebpf's `off-CPU` summary line): in the `--idle -p` row most switches are the target's \
         (a Python walk each at the switch-out), in the last row none are (pyebpf follows a \
         sleeping Python process: the cost `--idle` adds to every other task). Lost: intervals \
         the ring buffer had no room for. py-spy `--idle` samples every thread whatever its \
         state from user space; it has no per-switch cost.",
        if ctx.plan.quick { 10 } else { 40 }
    ));
    let col = |i: usize, f: &dyn Fn(&RunOut) -> Result<f64, String>| -> Runs {
        results[i]
            .iter()
            .map(|r| r.as_ref().map_err(Clone::clone).and_then(f))
            .collect()
    };
    let alone_wall = col(0, &|o| Ok(o.wall_s));
    let alone_cpu = col(0, &|o| Ok(o.cpu_s));
    for (i, (label, setup)) in CONFIGS.iter().enumerate() {
        let wall = col(i, &|o| Ok(o.wall_s));
        let cpu = col(i, &|o| Ok(o.cpu_s));
        let change = |v: &Runs, base: &Runs| {
            if i == 0 {
                "—".to_owned()
            } else {
                stats::signed_cell(&super::slowdown::paired_change(v, base), 1, " %")
            }
        };
        let off = |f: &dyn Fn(&OffCpu) -> Option<f64>| {
            col(i, &|o| {
                o.off
                    .as_ref()
                    .and_then(f)
                    .ok_or_else(|| "no off-CPU line".to_owned())
            })
        };
        let is_idle = matches!(setup, Setup::Pyebpf { idle: true } | Setup::PyebpfOther);
        t.row(vec![
            (*label).to_owned(),
            stats::cell(&wall, 2, " s"),
            change(&wall, &alone_wall),
            change(&cpu, &alone_cpu),
            if *setup == Setup::Alone || *setup == Setup::PyebpfOther {
                "—".to_owned()
            } else {
                stats::cell(
                    &col(i, &|o| {
                        o.samples
                            .map(|n| n as f64)
                            .ok_or_else(|| "no samples".to_owned())
                    }),
                    0,
                    "",
                )
            },
            if is_idle {
                format!(
                    "{} ({} switches)",
                    stats::cell(&off(&|x| x.ns_per_switch), 0, " ns"),
                    stats::cell(&off(&|x| Some(x.host_switches)), 0, "")
                )
            } else {
                "—".to_owned()
            },
            if is_idle {
                format!(
                    "{} / {} / {}",
                    stats::cell(&off(&|x| Some(x.switches)), 0, ""),
                    stats::cell(&off(&|x| Some(x.sent)), 0, ""),
                    stats::cell(&off(&|x| Some(x.lost)), 0, "")
                )
            } else {
                "—".to_owned()
            },
        ]);
        if let Some(e) = stats::first_error(&wall) {
            t.note(format!("{label}: {e}"));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_summary_line() {
        let o = parse_offcpu(
            "pyebpf: x\npyebpf: off-CPU (--idle): 293 intervals sent of 991 switch-outs captured \
             (694 too short to hold a sampling instant), 2 lost, 0 not followed (map full); eBPF \
             sched_switch program: 1020 ns per context switch (mean of 4018 switches on the \
             host), 8045 instructions verified, variant bpf_loop\n",
        )
        .unwrap();
        assert_eq!(
            (o.sent, o.switches, o.lost, o.ns_per_switch, o.host_switches),
            (293.0, 991.0, 2.0, Some(1020.0), 4018.0)
        );
        assert!(parse_offcpu("pyebpf: 5 samples\n").is_none());
    }
}
