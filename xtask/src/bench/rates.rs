//! Figure 3, rate limits: each round climbs a ladder of sample rates, stopping at the first step that
//! fails. pyebpf: `record --all -r R/CPUs -d STEP` while one busy Python process per CPU keeps
//! every CPU sampled; a step fails when the summary reports lost samples. py-spy:
//! `record --pid P -r R -d STEP` on one of those single-threaded processes; a step fails when
//! py-spy prints "behind in sampling" (it does so once it is a whole second late).
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::Ctx;
use super::proc::Proc;
use super::profilers::{self, Finished, Spec, Target, Who};
use super::report::Table;
use super::slowdown::{ProfNums, cost_row};
use super::stats::{self, Runs};

/// One round's ladder.
#[derive(Default)]
struct Ladder {
    /// Highest step that passed, with its achieved samples/s and cost.
    best: Option<(u64, f64, ProfNums)>,
    /// First step that failed.
    failed_at: Option<u64>,
}

fn hogs(ctx: &Ctx, round: usize) -> Result<Vec<Proc>> {
    (0..ctx.cpus)
        .map(|i| {
            let args = ["--seconds", "100000", "--no-wait"].map(str::to_owned);
            ctx.workload("split.py", &args, &format!("hog-{round}-{i}"))
                .map(|(p, _)| p)
        })
        .collect()
}

fn pyebpf_step(ctx: &Ctx, total: u64) -> Result<(bool, f64, Finished)> {
    let per_cpu = total.div_ceil(ctx.cpus as u64);
    let spec = Spec::new(Who::Pyebpf, Target::All, per_cpu).duration(ctx.plan.rate_step_s);
    let run = profilers::start(ctx, &spec, &format!("rate-pyebpf-{total}"))?;
    let f = run.finish(Some(Duration::from_secs(ctx.plan.rate_step_s + 60)))?;
    let achieved = match (f.samples, f.duration_s) {
        (Some(n), Some(d)) if d > 0.0 => n as f64 / d,
        _ => 0.0,
    };
    Ok((f.lost == Some(0), achieved, f))
}

fn pyspy_step(ctx: &Ctx, pid: u32, rate: u64) -> Result<(bool, f64, Finished)> {
    let spec = Spec::new(Who::PySpy, Target::Pid(pid), rate).duration(ctx.plan.rate_step_s);
    let run = profilers::start(ctx, &spec, &format!("rate-pyspy-{rate}"))?;
    let t0 = Instant::now();
    // py-spy's -d counts samples (rate × seconds): a late py-spy runs longer; bound it.
    let f = run.finish(Some(Duration::from_secs(ctx.plan.rate_step_s * 3 + 5)))?;
    let achieved = f.samples.unwrap_or(0) as f64 / t0.elapsed().as_secs_f64();
    Ok((!f.behind, achieved, f))
}

fn climb(
    who: Who,
    steps: &[u64],
    mut step: impl FnMut(u64) -> Result<(bool, f64, Finished)>,
) -> Result<Ladder> {
    let mut l = Ladder::default();
    for &rate in steps {
        let (ok, achieved, f) = step(rate)?;
        crate::sh::say(
            "bench",
            format!(
                "  {} {rate}/s: {} ({achieved:.0} samples/s{})",
                who.name(),
                if ok { "ok" } else { "FAILED" },
                f.lost.map(|n| format!(", lost {n}")).unwrap_or_default()
            ),
        );
        if !ok {
            l.failed_at = Some(rate);
            break;
        }
        l.best = Some((rate, achieved, ProfNums::of(&f, who)));
    }
    Ok(l)
}

type Ladders = Vec<Result<Ladder, String>>;

/// Interleaved rounds of both ladders (alternating which goes first) on fresh busy processes.
fn rounds(ctx: &Ctx) -> (Ladders, Ladders) {
    let mut ours: Vec<Result<Ladder, String>> = Vec::new();
    let mut theirs: Vec<Result<Ladder, String>> = Vec::new();
    for round in 0..ctx.plan.runs {
        let hogs = match hogs(ctx, round) {
            Ok(h) => h,
            Err(e) => {
                let e = format!("busy workloads: {e:#}");
                ours.push(Err(e.clone()));
                theirs.push(Err(e));
                continue;
            }
        };
        let pid = hogs[0].pid;
        // Alternate who goes first: A B, B A, A B, …
        for i in super::rotation(2, round) {
            if i == 0 {
                let a = climb(Who::Pyebpf, ctx.plan.pyebpf_rates, |r| pyebpf_step(ctx, r))
                    .map_err(|e| format!("{e:#}"));
                report(ctx, "rate ladder pyebpf", round, &a);
                ours.push(a);
            } else {
                let b = climb(Who::PySpy, ctx.plan.pyspy_rates, |r| {
                    pyspy_step(ctx, pid, r)
                })
                .map_err(|e| format!("{e:#}"));
                report(ctx, "rate ladder py-spy", round, &b);
                theirs.push(b);
            }
        }
        drop(hogs);
    }
    (ours, theirs)
}

/// The rate table and two cost-table rows (at the highest step that passed).
pub fn measure(ctx: &Ctx) -> (Table, Vec<Vec<String>>) {
    let (ours, theirs) = rounds(ctx);
    let mut t = Table::new(
        "3. Rate limits",
        &[
            "Figure",
            "pyebpf (`record --all`, total over all CPUs)",
            "py-spy (one single-threaded process)",
        ],
    );
    t.method(format!(
        "Ladders of {} s steps — pyebpf: {} samples/s in total (`-r` is per CPU: the total \
         divided by {} CPUs), with one busy Python process per CPU so every tick is a sample; \
         py-spy: {} samples/s on one of those processes. A round stops at its first failing \
         step; a round whose lowest step already fails counts as 0 sustained (and has no \
         achieved rate or cost figure). Both profilers compete for CPU with the machine's \
         other load: pyebpf samples in the kernel and buffers, py-spy's sampling thread has \
         to be scheduled for every sample. py-spy warns only once it is ≥ 1 s late, so with {} s steps a shortfall under \
         about {:.0} % of the rate goes unreported.",
        ctx.plan.rate_step_s,
        list(ctx.plan.pyebpf_rates),
        ctx.cpus,
        list(ctx.plan.pyspy_rates),
        ctx.plan.rate_step_s,
        100.0 / (ctx.plan.rate_step_s as f64 + 1.0),
    ));
    let best = |v: &[Result<Ladder, String>]| -> Runs {
        v.iter()
            .map(|l| match l {
                Ok(l) => Ok(l.best.map_or(0.0, |b| b.0 as f64)),
                Err(e) => Err(e.clone()),
            })
            .collect()
    };
    let achieved = |v: &[Result<Ladder, String>]| -> Runs {
        v.iter()
            .map(|l| match l {
                Ok(l) => l
                    .best
                    .map(|b| b.1)
                    .ok_or_else(|| "the lowest step failed".to_owned()),
                Err(e) => Err(e.clone()),
            })
            .collect()
    };
    t.row(vec![
        "Highest rate sustained (pyebpf: 0 lost samples; py-spy: no \"behind in sampling\"), samples/s".into(),
        stats::cell(&best(&ours), 0, ""),
        stats::cell(&best(&theirs), 0, ""),
    ]);
    t.row(vec![
        "First rate that failed (pyebpf: lost samples; py-spy: \"behind in sampling\"), samples/s"
            .into(),
        failed_cell(&ours, ctx.plan.pyebpf_rates),
        failed_cell(&theirs, ctx.plan.pyspy_rates),
    ]);
    t.row(vec![
        "Samples/s achieved at the highest sustained step".into(),
        stats::cell(&achieved(&ours), 0, ""),
        stats::cell(&achieved(&theirs), 0, ""),
    ]);
    for (who, v) in [("pyebpf", &ours), ("py-spy", &theirs)] {
        if let Some(Err(e)) = v.iter().find(|l| l.is_err()) {
            t.note(format!("{who}: {e}"));
        }
    }
    let cost_nums = |v: &[Result<Ladder, String>]| -> Vec<Result<ProfNums, String>> {
        v.iter()
            .map(|l| match l {
                Ok(l) => l
                    .best
                    .map(|b| b.2)
                    .ok_or_else(|| "the lowest step failed".to_owned()),
                Err(e) => Err(e.clone()),
            })
            .collect()
    };
    let rows = vec![
        cost_row(
            "pyebpf record --all, highest lossless ladder step",
            &cost_nums(&ours),
        ),
        cost_row(
            "py-spy record, highest ladder step without warning",
            &cost_nums(&theirs),
        ),
    ];
    (t, rows)
}

fn report(ctx: &Ctx, what: &str, round: usize, l: &Result<Ladder, String>) {
    let r = l
        .as_ref()
        .map(|l| {
            format!(
                "highest ok {}, first failure {}",
                l.best.map_or("none".into(), |b| b.0.to_string()),
                l.failed_at.map_or("none".into(), |f| f.to_string())
            )
        })
        .map_err(Clone::clone);
    ctx.progress(what, round, &r);
}

fn list(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

/// Median (min–max) of the first failing step over the rounds that failed somewhere, and how
/// many rounds never failed up to the top step.
fn failed_cell(v: &[Result<Ladder, String>], steps: &[u64]) -> String {
    let top = steps.last().copied().unwrap_or(0);
    let oks: Vec<&Ladder> = v.iter().filter_map(|l| l.as_ref().ok()).collect();
    if oks.is_empty() {
        return stats::cell(
            &vec![Err(stats::first_error(
                &v.iter()
                    .map(|l| l.as_ref().map(|_| 0.0).map_err(Clone::clone))
                    .collect(),
            )
            .unwrap_or("no runs")
            .to_owned())],
            0,
            "",
        );
    }
    let failed: Runs = oks
        .iter()
        .filter_map(|l| l.failed_at.map(|f| Ok(f as f64)))
        .collect();
    let never = oks.len() - failed.len();
    if failed.is_empty() {
        return format!("none up to {top} (all {never} rounds)");
    }
    let mut c = stats::cell(&failed, 0, "");
    if never > 0 {
        let _ = write!(c, " [{never} of {} rounds: none up to {top}]", oks.len());
    }
    c
}
