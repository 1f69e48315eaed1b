//! Figure 7, the record pipeline's acceptance figures (issue 14), beside py-spy in the same
//! rounds:
//!
//! - user + system CPU of the profiler per sample at 10 000 samples/s: pyebpf `record --all`
//!   at 10 000 / CPUs Hz with two `deep.py` processes spinning 50 frames deep, py-spy
//!   `record --pid` at 10 000 Hz on one of them (its CPU time includes everything it does per
//!   sample, as pyebpf's does; pyebpf's BPF program runs in the sampled task and is not in its
//!   rusage: figure 2 has it), with pyebpf's lost samples;
//! - start + stop of `record -p PID -d 1`: the profiler's wall time from spawn to exit, less
//!   the time it reports having sampled (py-spy: less its 1 s);
//! - peak RSS of a 99 Hz `record -p` of 10 s (`ru_maxrss`);
//! - the RSS of a long `record --all` on a host with process churn (`churn.py`: a new
//!   20-frame-deep Python process every 0.5 s, each living 0.3 s), read from
//!   `/proc/PID/status` once a minute (every 10 s with `--quick`).
//!
//! CPU time per sample survives a loaded machine; wall-clock figures (start + stop) do not.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Ctx;
use super::profilers::{self, Spec, Target, Who};
use super::report::Table;
use super::stats::{self, Runs};

/// Total samples per second of the cost measurement.
const TOTAL_RATE: u64 = 10_000;
/// Depth of the `deep.py` stacks.
const DEPTH: &str = "50";

fn deep(ctx: &Ctx, tag: &str) -> Result<super::proc::Proc> {
    let (p, _) = ctx.workload("deep.py", &["--depth".into(), DEPTH.into()], tag)?;
    Ok(p)
}

/// (CPU µs per sample, lost samples) of one cost run.
fn cost_run(ctx: &Ctx, who: Who, secs: u64) -> Result<(f64, f64)> {
    let tag = format!("pipeline-cost-{}", who.name());
    let a = deep(ctx, &tag)?;
    let b = deep(ctx, &tag)?;
    let spec = match who {
        Who::Pyebpf => Spec::new(who, Target::All, TOTAL_RATE / ctx.cpus.max(1) as u64),
        Who::PySpy => Spec::new(who, Target::Pid(a.pid), TOTAL_RATE),
    }
    .duration(secs);
    let running = profilers::start(ctx, &spec, &tag)?;
    let f = running.finish(Some(Duration::from_secs(secs + 60)))?;
    drop((a, b));
    let samples = f.samples.unwrap_or(0);
    if samples == 0 {
        bail!("no samples");
    }
    Ok((
        f.reaped.cpu_s * 1e6 / samples as f64,
        f.lost.unwrap_or(0) as f64,
    ))
}

/// (wall ms from spawn to exit, start + stop in ms, peak RSS in MiB) of `record -p PID -d
/// secs`. Start + stop is the wall time less the time the profiler says it sampled (pyebpf's
/// summary); py-spy does not say, and its `-d` is not exact, so it has none.
fn short_run(ctx: &Ctx, who: Who, secs: u64) -> Result<(f64, Option<f64>, f64)> {
    let tag = format!("pipeline-short-{}", who.name());
    let w = deep(ctx, &tag)?;
    let spec = Spec::new(who, Target::Pid(w.pid), 99).duration(secs);
    let running = profilers::start(ctx, &spec, &tag)?;
    let spawned = running.proc.spawned_at;
    let f = running.finish(Some(Duration::from_secs(secs + 60)))?;
    let exited = super::sys::monotonic_s();
    drop(w);
    // `finish` polls every 50 ms: the exit is dated within that.
    let wall = exited - spawned;
    Ok((
        wall * 1000.0,
        f.duration_s.map(|sampled| (wall - sampled) * 1000.0),
        f.reaped.maxrss_kib as f64 / 1024.0,
    ))
}

/// VmRSS of `pid` in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The RSS series of one long `record --all` with process churn: (seconds, MiB).
fn churn_series(ctx: &Ctx) -> Result<(Vec<(u64, f64)>, f64)> {
    let (total, every) = if ctx.plan.quick { (60, 10) } else { (600, 60) };
    let (churn, _) = ctx.workload("churn.py", &[], "pipeline-churn")?;
    let spec = Spec::new(Who::Pyebpf, Target::All, 99).duration(total);
    let running = profilers::start(ctx, &spec, "pipeline-churn")?;
    let pid = running.proc.pid;
    let start = Instant::now();
    let mut series = Vec::new();
    for k in 1..=total / every {
        let at = Duration::from_secs(k * every);
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let rss = rss_mib(pid).context("pyebpf ended early")?;
        series.push((k * every, rss));
    }
    let f = running.finish(Some(Duration::from_mins(2)))?;
    drop(churn);
    Ok((series, f.reaped.maxrss_kib as f64 / 1024.0))
}

/// Per-run figures: `[pyebpf, py-spy]` each.
#[derive(Default)]
struct Figures {
    cost: [Runs; 2],
    lost: Runs,
    startstop: Runs,
    wall: [Runs; 2],
    rss: [Runs; 2],
}

fn rounds(ctx: &Ctx, secs: u64) -> Figures {
    let whos = [Who::Pyebpf, Who::PySpy];
    let mut fig = Figures::default();
    let Figures {
        cost,
        lost,
        startstop,
        wall,
        rss,
    } = &mut fig;
    for round in 0..ctx.plan.runs {
        // Four configurations per round, rotated: pyebpf/py-spy cost, pyebpf/py-spy -d 1.
        for i in super::rotation(4, round) {
            let who = whos[i % 2];
            if i < 2 {
                let r = cost_run(ctx, who, secs).map_err(|e| format!("{e:#}"));
                ctx.progress(
                    &format!("pipeline cost {} at {TOTAL_RATE}/s", who.name()),
                    round,
                    &r.as_ref()
                        .map(|(us, lost)| format!("{us:.2} µs per sample, {lost} lost"))
                        .map_err(Clone::clone),
                );
                if who == Who::Pyebpf {
                    lost.push(r.as_ref().map(|x| x.1).map_err(Clone::clone));
                }
                cost[i % 2].push(r.map(|x| x.0));
            } else {
                let r = short_run(ctx, who, 1).map_err(|e| format!("{e:#}"));
                ctx.progress(
                    &format!("pipeline record -p -d 1 {}", who.name()),
                    round,
                    &r.as_ref()
                        .map(|(ms, _, mib)| format!("wall {ms:.0} ms, {mib:.1} MiB"))
                        .map_err(Clone::clone),
                );
                wall[i % 2].push(r.as_ref().map(|x| x.0).map_err(Clone::clone));
                if who == Who::Pyebpf {
                    startstop.push(r.as_ref().map_err(Clone::clone).and_then(|x| {
                        x.1.ok_or_else(|| "no sampling time in the summary".to_owned())
                    }));
                }
                let long = short_run(ctx, who, 10).map_err(|e| format!("{e:#}"));
                rss[i % 2].push(long.map(|x| x.2));
            }
        }
    }
    fig
}

pub fn measure(ctx: &Ctx) -> Table {
    let secs = if ctx.plan.quick { 5 } else { 10 };
    let Figures {
        cost,
        lost,
        startstop,
        wall,
        rss,
    } = rounds(ctx, secs);
    let churn = churn_series(ctx).map_err(|e| format!("{e:#}"));
    let mut t = Table::new(
        "7. The record pipeline (issue 14 acceptance figures)",
        &["Figure", "pyebpf", "py-spy"],
    );
    t.method(format!(
        "`xtask/src/bench/pipeline.rs`. CPU per sample: user + system CPU time of the profiler \
         process (`wait4`) over the samples it reports, recording {secs} s at {TOTAL_RATE} \
         samples/s in total — pyebpf `record --all -r {}` while two \
         `tests/workloads/bench/deep.py --depth {DEPTH}` processes spin, py-spy `record --pid` \
         at {TOTAL_RATE} Hz on one of them; pyebpf's BPF program is not in this figure (it runs \
         in the sampled task; see figure 2). Start + stop: wall time from spawn to exit of \
         `record -p PID -d 1` at 99 Hz (dated within the harness's 50 ms polls), and for pyebpf that \
         less the time it reports having sampled. Peak RSS: `ru_maxrss` of a \
         99 Hz `record -p` of 10 s. The rows are interleaved with the rest of this figure's \
         rounds; CPU per sample survives a loaded machine, the wall-clock row does not.",
        TOTAL_RATE / ctx.cpus.max(1) as u64
    ));
    t.row(vec![
        format!("User-space CPU per sample at {TOTAL_RATE} samples/s"),
        stats::cell(&cost[0], 2, " µs"),
        stats::cell(&cost[1], 2, " µs"),
    ]);
    t.row(vec![
        format!("Lost samples at {TOTAL_RATE} samples/s"),
        stats::cell(&lost, 0, ""),
        "—".into(),
    ]);
    t.row(vec![
        "Wall time of `record -p PID -d 1`, spawn to exit".into(),
        stats::cell(&wall[0], 0, " ms"),
        stats::cell(&wall[1], 0, " ms"),
    ]);
    t.row(vec![
        "Start + stop of `record -p PID -d 1` (wall less the time sampled)".into(),
        stats::cell(&startstop, 0, " ms"),
        "— (py-spy does not report it)".into(),
    ]);
    t.row(vec![
        "Peak RSS of a 99 Hz `record -p` (10 s)".into(),
        stats::cell(&rss[0], 1, " MiB"),
        stats::cell(&rss[1], 1, " MiB"),
    ]);
    match &churn {
        Ok((series, peak)) => {
            let cells: Vec<String> = series
                .iter()
                .map(|(s, mib)| format!("{}: {mib:.1}", fmt_at(*s)))
                .collect();
            let first_rss = series.first().map_or(0.0, |x| x.1);
            let final_rss = series.last().map_or(0.0, |x| x.1);
            t.row(vec![
                "RSS of a long `record --all` with process churn (MiB at each time)".into(),
                format!(
                    "{}; after the first reading {:+.1} MiB; peak {peak:.1} MiB",
                    cells.join(", "),
                    final_rss - first_rss
                ),
                "— (no whole-host mode)".into(),
            ]);
        }
        Err(e) => t.note(format!("churn series: {e}")),
    }
    for (what, runs) in [
        ("pyebpf cost", &cost[0]),
        ("py-spy cost", &cost[1]),
        ("pyebpf -d 1", &wall[0]),
        ("py-spy -d 1", &wall[1]),
    ] {
        if let Some(e) = stats::first_error(runs) {
            t.note(format!("{what}: {e}"));
        }
    }
    t
}

fn fmt_at(s: u64) -> String {
    if s.is_multiple_of(60) {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}
