//! Figures 1 (target slowdown) and 2 (profiler cost), from the same runs.
//!
//! Each run starts `kernels.py` (fixed work), attaches the profiler and waits until it samples,
//! then says go; the workload times its own work (perf_counter). The profiler is stopped after
//! the work (pyebpf: SIGINT; py-spy ends with its target) and reaped with wait4: its user+sys
//! CPU time and the samples it reports give the cost per 1000 samples; pyebpf's perf-event
//! program statistics (fdinfo) give the eBPF run time per run. Slowdown is paired by round:
//! run i of a configuration against run i of "alone" on the same target.
use std::time::Duration;

use anyhow::{Result, bail};

use super::Ctx;
use super::profilers::{self, Finished, Spec, Target, Who};
use super::report::Table;
use super::stats::{self, Runs};

pub const RATE: u64 = 99;

#[derive(Clone, Copy)]
enum Setup {
    Alone,
    /// Unprofiled too, compared with "alone" like a profiler: the method's noise floor.
    Control,
    Pyebpf {
        all: bool,
        native: bool,
    },
    PySpy {
        nonblocking: bool,
    },
}

struct Config {
    label: &'static str,
    setup: Setup,
    threads: usize,
}

const CONFIGS: [Config; 10] = [
    Config {
        label: "alone",
        setup: Setup::Alone,
        threads: 1,
    },
    Config {
        label: "alone again (unprofiled control)",
        setup: Setup::Control,
        threads: 1,
    },
    Config {
        label: "pyebpf record -p, 99 Hz",
        setup: Setup::Pyebpf {
            all: false,
            native: false,
        },
        threads: 1,
    },
    Config {
        label: "py-spy record, 99 Hz",
        setup: Setup::PySpy { nonblocking: false },
        threads: 1,
    },
    Config {
        label: "pyebpf record --all, 99 Hz",
        setup: Setup::Pyebpf {
            all: true,
            native: false,
        },
        threads: 1,
    },
    Config {
        label: "py-spy record --nonblocking, 99 Hz",
        setup: Setup::PySpy { nonblocking: true },
        threads: 1,
    },
    Config {
        label: "pyebpf record -p --native, 99 Hz",
        setup: Setup::Pyebpf {
            all: false,
            native: true,
        },
        threads: 1,
    },
    Config {
        label: "alone",
        setup: Setup::Alone,
        threads: 100,
    },
    Config {
        label: "pyebpf record -p, 99 Hz",
        setup: Setup::Pyebpf {
            all: false,
            native: false,
        },
        threads: 100,
    },
    Config {
        label: "py-spy record, 99 Hz",
        setup: Setup::PySpy { nonblocking: false },
        threads: 100,
    },
];

/// What one profiled run cost, for the cost table.
#[derive(Clone, Copy)]
pub struct ProfNums {
    pub who: Who,
    pub cpu_s: f64,
    pub samples: u64,
    pub bpf: Option<super::proc::BpfStats>,
}

impl ProfNums {
    pub fn of(f: &Finished, who: Who) -> Self {
        Self {
            who,
            cpu_s: f.reaped.cpu_s,
            samples: f.samples.unwrap_or(0),
            bpf: f.bpf,
        }
    }
}

struct RunOut {
    wall_s: f64,
    /// The target's CPU time (all threads) during the work.
    cpu_s: f64,
    prof: Option<ProfNums>,
}

fn one_run(ctx: &Ctx, cfg: &Config) -> Result<RunOut> {
    let tag = format!("slow-{}-{}t", cfg.label, cfg.threads);
    let args = vec![
        "--scale".to_owned(),
        ctx.plan.scale.to_string(),
        "--threads".to_owned(),
        cfg.threads.to_string(),
    ];
    let (mut w, _) = ctx.workload("kernels.py", &args, &tag)?;
    let spec = match cfg.setup {
        Setup::Alone | Setup::Control => None,
        Setup::Pyebpf { all, native } => Some(
            Spec::new(
                Who::Pyebpf,
                if all { Target::All } else { Target::Pid(w.pid) },
                RATE,
            )
            .flags(if native { &["--native"] } else { &[] }),
        ),
        Setup::PySpy { nonblocking } => Some(
            Spec::new(Who::PySpy, Target::Pid(w.pid), RATE).flags(if nonblocking {
                &["--nonblocking"]
            } else {
                &[]
            }),
        ),
    };
    let running = spec
        .as_ref()
        .map(|s| profilers::start(ctx, s, &tag))
        .transpose()?;
    w.send("go")?;
    // Generous: a busy 2-core machine and a profiler that stops the target can stretch it.
    let budget = Duration::from_secs_f64((ctx.plan.scale * 0.4 * 40.0).max(300.0));
    let done = w.event("done", budget)?;
    if let Some(errors) = done["errors"].as_array()
        && !errors.is_empty()
    {
        bail!("workload errors: {errors:?}");
    }
    let wall_s = done["wall_s"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no wall_s in {done}"))?;
    let _ = w.wait(Duration::from_secs(10));
    let prof = match running {
        None => None,
        Some(r) => {
            let who = r.who;
            // py-spy ends with its target; pyebpf -p/--all runs until stopped.
            let own_end = (who == Who::PySpy).then_some(Duration::from_secs(10));
            Some(ProfNums::of(&r.finish(own_end)?, who))
        }
    };
    let cpu_s = done["cpu_s"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("no cpu_s in {done}"))?;
    Ok(RunOut {
        wall_s,
        cpu_s,
        prof,
    })
}

type Results = Vec<Vec<Result<RunOut, String>>>;

/// The slowdown table and the cost table (rate-ladder rows are added to it later).
pub fn measure(ctx: &Ctx) -> (Table, Table) {
    let results = rounds(ctx);
    (slowdown_table(ctx, &results), cost_of(&results))
}

/// Every configuration once per round, in rotated `CONFIGS` order.
fn rounds(ctx: &Ctx) -> Results {
    let mut results: Vec<Vec<Result<RunOut, String>>> =
        CONFIGS.iter().map(|_| Vec::new()).collect();
    for round in 0..ctx.plan.runs {
        for i in super::rotation(CONFIGS.len(), round) {
            let cfg = &CONFIGS[i];
            let r = one_run(ctx, cfg).map_err(|e| format!("{e:#}"));
            ctx.progress(
                &format!(
                    "slowdown {} ({} thread{})",
                    cfg.label,
                    cfg.threads,
                    if cfg.threads > 1 { "s" } else { "" }
                ),
                round,
                &r.as_ref()
                    .map(|o| format!("{:.2} s wall, {:.2} s CPU", o.wall_s, o.cpu_s))
                    .map_err(Clone::clone),
            );
            results[i].push(r);
        }
    }
    results
}

fn slowdown_table(ctx: &Ctx, results: &Results) -> Table {
    let mut slow = Table::new(
        "1. Target slowdown",
        &[
            "Target",
            "Configuration",
            "Wall time of the work",
            "Slowdown (wall)",
            "Target CPU time",
            "Target CPU time change",
        ],
    );
    slow.method(format!(
        "`tests/workloads/bench/kernels.py --scale {}`: n-body, Richards, spectral norm and a \
         dict/str loop, a fixed amount of work timed by the workload itself \
         (`time.perf_counter`, and `time.process_time` for its CPU time), after the profiler is \
         attached and sampling. \"100 threads\" splits the same work over 100 threads (py-spy \
         stops every thread for each sample; `--nonblocking` does not). Changes are against \
         \"alone\" on the same target, paired run by run (round i against round i). Wall time \
         is what a user sees, but on a shared machine it mostly measures the other load; the \
         target's CPU time is steadier and includes costs paid in the target's context (the \
         BPF program, interrupts, cache disturbance), not time the target spends stopped.",
        ctx.plan.scale
    ));
    let column = |f: fn(&RunOut) -> f64| -> Vec<Runs> {
        results
            .iter()
            .map(|rs| {
                rs.iter()
                    .map(|r| r.as_ref().map(f).map_err(Clone::clone))
                    .collect()
            })
            .collect()
    };
    let walls = column(|o| o.wall_s);
    let cpus = column(|o| o.cpu_s);
    let mut alone_idx = 0;
    for (i, cfg) in CONFIGS.iter().enumerate() {
        if matches!(cfg.setup, Setup::Alone) {
            alone_idx = i;
        }
        let change = |v: &[Runs]| -> String {
            if i == alone_idx {
                return "—".into();
            }
            stats::signed_cell(&paired_change(&v[i], &v[alone_idx]), 1, " %")
        };
        slow.row(vec![
            if cfg.threads == 1 {
                "1 thread".into()
            } else {
                format!("{} threads", cfg.threads)
            },
            cfg.label.to_owned(),
            stats::cell(&walls[i], 2, " s"),
            change(&walls),
            stats::cell(&cpus[i], 2, " s"),
            change(&cpus),
        ]);
        if let Some(e) = stats::first_error(&walls[i]) {
            slow.note(format!("{} ({} threads): {e}", cfg.label, cfg.threads));
        }
    }
    slow
}

/// Per round: value / alone − 1, in percent.
pub(super) fn paired_change(v: &Runs, alone: &Runs) -> Runs {
    v.iter()
        .zip(alone)
        .map(|(w, a)| match (w, a) {
            (Ok(w), Ok(a)) => Ok((w / a - 1.0) * 100.0),
            (Err(e), _) => Err(e.clone()),
            (_, Err(e)) => Err(format!("alone run failed: {e}")),
        })
        .collect()
}

fn cost_of(results: &Results) -> Table {
    let mut cost = cost_table();
    for (i, cfg) in CONFIGS.iter().enumerate() {
        if matches!(cfg.setup, Setup::Alone) {
            continue;
        }
        let nums: Vec<Result<ProfNums, String>> = results[i]
            .iter()
            .map(|r| match r {
                Ok(o) => o.prof.ok_or_else(|| "no profiler".to_owned()),
                Err(e) => Err(e.clone()),
            })
            .collect();
        let target = if cfg.threads == 1 {
            ""
        } else {
            ", 100 threads"
        };
        cost.row(cost_row(&format!("{}{target}", cfg.label), &nums));
    }
    cost
}

pub fn cost_table() -> Table {
    let mut t = Table::new(
        "2. Profiler cost",
        &[
            "Configuration",
            "Profiler CPU (user+sys)",
            "Samples",
            "CPU s per 1000 samples",
            "eBPF run time per program run",
            "eBPF CPU s per 1000 samples",
            "BPF verified instructions",
        ],
    );
    t.method(
        "CPU time of the profiler process (user + system, from `wait4`'s rusage, start-up and \
         output writing included) divided by the samples it reports (pyebpf: one per CPU tick that found a target \
         thread running; py-spy: one stack trace per active thread per tick, so 100 threads \
         give many per tick). pyebpf's BPF program runs \
         in the sampled task's context, so its time is not in the process's rusage: it is read \
         from the kernel's BPF statistics (`run_time_ns`/`run_cnt` in `/proc/<pid>/fdinfo`, \
         enabled by pyebpf while it runs) just before the stop. With `-p` the program also runs \
         (and returns early) for every other task on the CPUs, so runs outnumber samples. The \
         first rows come from the slowdown runs above (99 Hz, start-up cost amortised over a \
         short run); the last from the highest lossless step of the rate ladders below. \
         Verified instructions: `verified_insns` of the perf-event program as loaded for that \
         configuration (the verifier prunes what the configuration switches off).",
    );
    t
}

/// One cost-table row from a configuration's profiled runs.
pub fn cost_row(label: &str, nums: &[Result<ProfNums, String>]) -> Vec<String> {
    let pick = |f: &dyn Fn(&ProfNums) -> Result<f64, String>| -> Runs {
        nums.iter()
            .map(|n| n.as_ref().map_err(Clone::clone).and_then(f))
            .collect()
    };
    let is_pyebpf =
        nums.iter().flatten().any(|n| n.who == Who::Pyebpf) || label.starts_with("pyebpf");
    let per_1000 = |n: &ProfNums| {
        if n.samples == 0 {
            Err("no samples".to_owned())
        } else {
            Ok(n.cpu_s / n.samples as f64 * 1000.0)
        }
    };
    let bpf_ns = |n: &ProfNums| match n.bpf {
        Some(b) if b.run_cnt > 0 => Ok(b.run_time_ns as f64 / b.run_cnt as f64),
        _ => Err("no BPF run-time statistics (kernel.bpf_stats_enabled)".to_owned()),
    };
    let bpf_per_1000 = |n: &ProfNums| match n.bpf {
        Some(b) if b.run_cnt > 0 && n.samples > 0 => {
            Ok(b.run_time_ns as f64 * 1e-9 / n.samples as f64 * 1000.0)
        }
        _ => Err("no BPF run-time statistics (kernel.bpf_stats_enabled)".to_owned()),
    };
    vec![
        label.to_owned(),
        stats::cell(&pick(&|n| Ok(n.cpu_s)), 3, " s"),
        stats::cell(&pick(&|n| Ok(n.samples as f64)), 0, ""),
        stats::cell(&pick(&per_1000), 4, " s"),
        if is_pyebpf {
            stats::cell(&pick(&bpf_ns), 0, " ns")
        } else {
            "— (no BPF)".into()
        },
        if is_pyebpf {
            stats::cell(&pick(&bpf_per_1000), 5, " s")
        } else {
            "—".into()
        },
        if is_pyebpf {
            stats::same_cell(&pick(&|n| {
                n.bpf
                    .and_then(|b| b.verified_insns)
                    .map(|v| v as f64)
                    .ok_or_else(|| "no verified_insns in fdinfo (kernel < 5.16)".to_owned())
            }))
        } else {
            "—".into()
        },
    ]
}
