//! Figure 5, start-up latency and peak RSS. `slots.py` runs before the profiler starts and
//! dates its own stacks: during each 10 ms slot k after its epoch (CLOCK_MONOTONIC) it runs
//! `bslot_<k>` and names its thread the same. The profiler is spawned at a known
//! CLOCK_MONOTONIC time and records for a fixed time (`-d`); the earliest slot in its output
//! dates its first sample: latency = epoch + (k + ½) × slot − spawn time (±5 ms; a lower bound
//! when the target was preempted: its stack still shows the slot it stopped in). Also reported:
//! spawn → the moment the harness sees the profiler sampling. pyebpf is run with `--threads`
//! (thread names work without Python frames), py-spy shows the function names. Peak RSS is the
//! profiler's `ru_maxrss` from `wait4`.
use std::time::Duration;

use anyhow::{Result, bail};

use super::Ctx;
use super::folded::Folded;
use super::profilers::{self, Spec, Target, Who};
use super::report::Table;
use super::slowdown::RATE;
use super::stats::{self, Runs};

struct Config {
    label: String,
    who: Who,
    all: bool,
}

struct Run {
    latency_ms: f64,
    ready_ms: f64,
    rss_mib: f64,
    samples: f64,
}

fn one_run(ctx: &Ctx, cfg: &Config) -> Result<Run> {
    let tag = format!("startup-{}", cfg.label);
    let (w, ready) = ctx.workload("slots.py", &[], &tag)?;
    let (Some(epoch), Some(slot)) = (
        ready["epoch_monotonic_s"].as_f64(),
        ready["slot_s"].as_f64(),
    ) else {
        bail!("slots.py ready line without epoch/slot: {ready}");
    };
    let target = if cfg.all {
        Target::All
    } else {
        Target::Pid(w.pid)
    };
    let mut spec = Spec::new(cfg.who, target, RATE).duration(ctx.plan.record_s);
    if cfg.who == Who::Pyebpf {
        spec = spec.flags(&["--threads"]);
    }
    let running = profilers::start(ctx, &spec, &tag)?;
    let spawned_at = running.proc.spawned_at;
    let ready_ms = (running.ready_at - spawned_at) * 1000.0;
    let f = running.finish(Some(Duration::from_secs(ctx.plan.record_s + 60)))?;
    drop(w);
    let Some(k) = Folded::read(&f.out)?.first_slot() else {
        bail!(
            "no slot marker (bslot_NNNNN thread or function name) in {}'s output",
            cfg.who.name()
        );
    };
    Ok(Run {
        latency_ms: (epoch + (f64::from(k) + 0.5) * slot - spawned_at) * 1000.0,
        ready_ms,
        rss_mib: f.reaped.maxrss_kib as f64 / 1024.0,
        samples: f.samples.unwrap_or(0) as f64,
    })
}

pub fn measure(ctx: &Ctx) -> Table {
    let d = ctx.plan.record_s;
    let configs = [
        Config {
            label: format!("pyebpf record -p PID --threads -d {d}"),
            who: Who::Pyebpf,
            all: false,
        },
        Config {
            label: format!("py-spy record --pid PID -d {d}"),
            who: Who::PySpy,
            all: false,
        },
        Config {
            label: format!("pyebpf record --all --threads -d {d}"),
            who: Who::Pyebpf,
            all: true,
        },
    ];
    let mut results: Vec<Vec<Result<Run, String>>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..ctx.plan.runs {
        for i in super::rotation(configs.len(), round) {
            let cfg = &configs[i];
            let r = one_run(ctx, cfg).map_err(|e| format!("{e:#}"));
            ctx.progress(
                &format!("start-up {}", cfg.label),
                round,
                &r.as_ref()
                    .map(|r| {
                        format!(
                            "sampling after {:.0} ms, first target sample {:.0} ms, {:.1} MiB",
                            r.ready_ms, r.latency_ms, r.rss_mib
                        )
                    })
                    .map_err(Clone::clone),
            );
            results[i].push(r);
        }
    }
    let mut t = Table::new(
        "5. Start-up latency and peak RSS",
        &[
            "Configuration",
            "Spawn → sampling (seen by the harness)",
            "Spawn → first target sample (dated by the target)",
            "Peak RSS",
            "Samples",
        ],
    );
    t.method(format!(
        "The target (`tests/workloads/bench/slots.py`) is already running; each profiler \
         records it for {d} s at {RATE} Hz{}. \"Sampling\": the harness sees pyebpf's \
         perf-event BPF program run (its `run_cnt`) or py-spy print \"Sampling process\" \
         (polled every 10 ms). \"First target sample\": the earliest 10 ms slot marker in \
         the profile; a stack read while the target was preempted still shows the slot it was \
         preempted in, so on a busy machine this is a lower bound. pyebpf's `--all` row is \
         the whole-machine recording: its RSS includes symbolising every process sampled \
         meanwhile.",
        if ctx.plan.quick {
            " (a full run records 30 s)"
        } else {
            ""
        }
    ));
    for (cfg, rs) in configs.iter().zip(&results) {
        let col = |f: &dyn Fn(&Run) -> f64| -> Runs {
            rs.iter()
                .map(|r| r.as_ref().map(f).map_err(Clone::clone))
                .collect()
        };
        t.row(vec![
            cfg.label.clone(),
            stats::cell(&col(&|r| r.ready_ms), 0, " ms"),
            stats::cell(&col(&|r| r.latency_ms), 0, " ms"),
            stats::cell(&col(&|r| r.rss_mib), 1, " MiB"),
            stats::cell(&col(&|r| r.samples), 0, ""),
        ]);
        if let Some(e) = rs.iter().find_map(|r| r.as_ref().err()) {
            t.note(format!("{}: {e}", cfg.label));
        }
    }
    t
}
