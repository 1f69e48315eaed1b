//! Figure 4, attribution accuracy: `split.py` spends its time in split_sixty / split_thirty /
//! split_ten (60/30/10 by design) and measures the true split itself, both in CPU time
//! (`time.thread_time`) and in wall time (`time.perf_counter`). A profiler's share of a
//! function is the fraction of the samples containing any of the three whose stack contains
//! that function; its error is |share − true share| in percentage points. pyebpf samples CPU
//! time (a CPU-clock perf event), so it is compared with the CPU split; py-spy samples
//! wall-clock time (a runnable but preempted thread counts), so with the wall split. On an idle
//! machine the two splits agree.
use std::time::Duration;

use anyhow::{Result, bail};

use super::Ctx;
use super::folded::Folded;
use super::profilers::{self, Spec, Target, Who};
use super::report::Table;
use super::slowdown::RATE;
use super::stats::{self, Runs};

const FUNCS: [&str; 3] = ["split_sixty", "split_thirty", "split_ten"];
/// Why pyebpf has no figure until its output carries Python frames.
const NO_PY_FRAMES: &str = "no Python function names in pyebpf's output yet (issue 4)";

struct Run {
    /// Measured share per function (0..1).
    share: [f64; 3],
    /// The workload's true split (CPU or wall, matching the profiler).
    truth: [f64; 3],
    truth_cpu: [f64; 3],
    truth_wall: [f64; 3],
}

impl Run {
    fn errors_pp(&self) -> [f64; 3] {
        std::array::from_fn(|i| (self.share[i] - self.truth[i]).abs() * 100.0)
    }
}

fn one_run(ctx: &Ctx, who: Who) -> Result<Run> {
    let tag = format!("accuracy-{}", who.name());
    let out = ctx.path(&tag, "json");
    let args = vec![
        "--seconds".to_owned(),
        ctx.plan.accuracy_s.to_string(),
        "--out".to_owned(),
        out.display().to_string(),
    ];
    let (mut w, _) = ctx.workload("split.py", &args, &tag)?;
    let running = profilers::start(ctx, &Spec::new(who, Target::Pid(w.pid), RATE), &tag)?;
    w.send("go")?;
    let done = w.event("done", Duration::from_secs(ctx.plan.accuracy_s * 10 + 120))?;
    let _ = w.wait(Duration::from_secs(10));
    let own_end = (who == Who::PySpy).then_some(Duration::from_secs(10));
    let f = running.finish(own_end)?;
    let folded = Folded::read(&f.out)?;
    let any = folded.containing_any(&FUNCS);
    if any == 0 {
        if who == Who::Pyebpf {
            bail!("{NO_PY_FRAMES}");
        }
        bail!(
            "no sample of the three functions in {}'s output",
            who.name()
        );
    }
    let split = |key: &str| -> Result<[f64; 3]> {
        let mut v = [0.0; 3];
        for (i, f) in FUNCS.iter().enumerate() {
            v[i] = done[key][f]
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("no {key}.{f} in {done}"))?;
        }
        Ok(v)
    };
    let truth_cpu = split("share_cpu")?;
    let truth_wall = split("share_wall")?;
    Ok(Run {
        share: std::array::from_fn(|i| folded.containing(FUNCS[i]) as f64 / any as f64),
        truth: if who == Who::Pyebpf {
            truth_cpu
        } else {
            truth_wall
        },
        truth_cpu,
        truth_wall,
    })
}

pub fn measure(ctx: &Ctx) -> Table {
    let mut ours: Vec<Result<Run, String>> = Vec::new();
    let mut theirs: Vec<Result<Run, String>> = Vec::new();
    for round in 0..ctx.plan.runs {
        // Alternate who goes first; A B, B A, A B, …
        for i in super::rotation(2, round) {
            if i == 0 {
                // Once pyebpf's output shows it has no Python frames, more runs cannot differ.
                let a = if matches!(ours.first(), Some(Err(e)) if e == NO_PY_FRAMES) {
                    Err(NO_PY_FRAMES.to_owned())
                } else {
                    one_run(ctx, Who::Pyebpf).map_err(|e| format!("{e:#}"))
                };
                ctx.progress("accuracy pyebpf", round, &describe(&a));
                ours.push(a);
            } else {
                let b = one_run(ctx, Who::PySpy).map_err(|e| format!("{e:#}"));
                ctx.progress("accuracy py-spy", round, &describe(&b));
                theirs.push(b);
            }
        }
    }

    let mut t = Table::new(
        "4. Attribution accuracy",
        &[
            "Function",
            "True share: CPU",
            "True share: wall",
            "pyebpf share",
            "pyebpf error (vs CPU)",
            "py-spy share",
            "py-spy error (vs wall)",
        ],
    );
    t.method(format!(
        "`tests/workloads/bench/split.py` for {} s per run, profiled at {RATE} Hz (pyebpf \
         `record -p`, py-spy `record`). Shares are of the samples inside the three functions; \
         errors are in percentage points.",
        ctx.plan.accuracy_s
    ));
    let col = |v: &[Result<Run, String>], f: &dyn Fn(&Run) -> f64| -> Runs {
        v.iter()
            .map(|r| r.as_ref().map(f).map_err(Clone::clone))
            .collect()
    };
    let truth_src = if theirs.iter().any(Result::is_ok) {
        &theirs
    } else {
        &ours
    };
    for (i, name) in FUNCS.iter().enumerate() {
        t.row(vec![
            format!("`{name}`"),
            stats::cell(&col(truth_src, &|r| r.truth_cpu[i] * 100.0), 1, " %"),
            stats::cell(&col(truth_src, &|r| r.truth_wall[i] * 100.0), 1, " %"),
            stats::cell(&col(&ours, &|r| r.share[i] * 100.0), 1, " %"),
            stats::cell(&col(&ours, &|r| r.errors_pp()[i]), 1, " pp"),
            stats::cell(&col(&theirs, &|r| r.share[i] * 100.0), 1, " %"),
            stats::cell(&col(&theirs, &|r| r.errors_pp()[i]), 1, " pp"),
        ]);
    }
    let worst = |r: &Run| r.errors_pp().into_iter().fold(0.0, f64::max);
    t.row(vec![
        "largest of the three errors".into(),
        String::new(),
        String::new(),
        String::new(),
        stats::cell(&col(&ours, &worst), 1, " pp"),
        String::new(),
        stats::cell(&col(&theirs, &worst), 1, " pp"),
    ]);
    for (who, v) in [("pyebpf", &ours), ("py-spy", &theirs)] {
        if let Some(e) = v.iter().find_map(|r| r.as_ref().err()) {
            t.note(format!("{who}: {e}"));
        }
    }
    t
}

fn describe(r: &Result<Run, String>) -> Result<String, String> {
    r.as_ref()
        .map(|r| {
            let e = r.errors_pp();
            format!(
                "shares {:.1}/{:.1}/{:.1} %, errors {:.1}/{:.1}/{:.1} pp",
                r.share[0] * 100.0,
                r.share[1] * 100.0,
                r.share[2] * 100.0,
                e[0],
                e[1],
                e[2]
            )
        })
        .map_err(Clone::clone)
}
