//! `cargo xtask bench [--quick] [--runs N]`: pyebpf against py-spy on this machine — target
//! slowdown, profiler cost per sample, rate limits, attribution accuracy, start-up latency and
//! peak RSS — each as the median (min–max) over interleaved runs. The results table is printed
//! and written to `docs/benchmarks.md`. Nothing here is a test: no figure is asserted.
//!
//! | file          | what                                                                  |
//! |---------------|-----------------------------------------------------------------------|
//! | `tools.rs`    | release pyebpf, py-spy in a venv, the interpreter, machine facts      |
//! | `proc.rs`     | started programs: stdout lines, wait4 rusage, bounded waits, BPF stats |
//! | `profilers.rs`| starting each profiler alike, readiness, reading its summary          |
//! | `slowdown.rs` | 1. target slowdown and 2. profiler cost                               |
//! | `rates.rs`    | 3. rate limits                                                        |
//! | `accuracy.rs` | 4. attribution accuracy                                               |
//! | `startup.rs`  | 5. start-up latency and peak RSS                                      |
//! | `versions.rs` | 6. the eBPF program's cost per sample by CPython version (3.8–3.15)   |
//! | `offcpu.rs`   | 8. `--idle` on a switch-heavy target beside `py-spy --idle`           |
//! | `realworld.rs`| 9. third-party programs (sympy, docutils, the stdlib's C modules) on 3.12–3.14 beside py-spy; `--native` merge mismatches |
//! | `folded.rs`, `stats.rs`, `report.rs`, `sys.rs` | parsing, medians, Markdown, syscalls |
//!
//! Figures that need work still in progress (Python frames in pyebpf's output) print
//! "n/a: reason", decided at run time from the outputs, so they fill in once it lands.
mod accuracy;
mod folded;
mod offcpu;
mod pipeline;
mod proc;
mod profilers;
mod rates;
mod realworld;
mod report;
mod slowdown;
mod startup;
mod stats;
mod sys;
mod tools;
mod versions;

use std::cell::Cell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::sh::{self, Timings, say};
use proc::Proc;
use tools::Tools;

pub struct Options {
    pub quick: bool,
    pub runs: usize,
    /// Only these figures (empty: all).
    pub only: Vec<u8>,
}

/// Lines of `docs/benchmarks.md` from this marker on are hand-written (one-off measurements)
/// and kept when the harness rewrites the file.
const KEEP_MARKER: &str = "<!-- hand-written below: kept by cargo xtask bench -->";

/// Sizes of everything, by mode.
pub struct Plan {
    pub quick: bool,
    pub runs: usize,
    /// `kernels.py --scale` (one unit ≈ 0.4 s of CPU).
    pub scale: f64,
    /// Seconds per step of a rate ladder.
    pub rate_step_s: u64,
    /// Total samples/s tried with pyebpf `--all` (divided over the CPUs for `-r`).
    pub pyebpf_rates: &'static [u64],
    /// Samples/s tried with py-spy on one single-threaded process.
    pub pyspy_rates: &'static [u64],
    /// Seconds of the 60/30/10 workload per run.
    pub accuracy_s: u64,
    /// Seconds of each start-up / peak-RSS recording.
    pub record_s: u64,
}

impl Plan {
    fn new(o: &Options) -> Self {
        if o.quick {
            Self {
                quick: true,
                runs: o.runs,
                scale: 3.0,
                rate_step_s: 3,
                pyebpf_rates: &[2000, 5000, 10_000],
                pyspy_rates: &[1000, 2500, 5000, 10_000],
                accuracy_s: 5,
                record_s: 4,
            }
        } else {
            Self {
                quick: false,
                runs: o.runs,
                scale: 15.0,
                rate_step_s: 5,
                pyebpf_rates: &[1000, 2000, 4000, 6000, 8000, 10_000],
                pyspy_rates: &[250, 500, 1000, 2000, 3000, 5000, 7500, 10_000],
                accuracy_s: 20,
                record_s: 30,
            }
        }
    }
}

/// What every measurement shares.
pub struct Ctx {
    pub tools: Tools,
    pub plan: Plan,
    pub cpus: usize,
    dir: PathBuf,
    seq: Cell<u32>,
}

impl Ctx {
    /// A fresh file in the run directory, `<n>-<tag>.<ext>`.
    pub fn path(&self, tag: &str, ext: &str) -> PathBuf {
        let n = self.seq.get() + 1;
        self.seq.set(n);
        let tag: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        self.dir.join(format!("{n:04}-{tag}.{ext}"))
    }

    /// Starts a workload and waits for its "ready" line (slow Python start-ups on a busy
    /// machine get a minute). Its lifetime is bounded by `--max-seconds` whatever happens.
    pub fn workload(
        &self,
        script: &str,
        args: &[String],
        tag: &str,
    ) -> Result<(Proc, serde_json::Value)> {
        let mut cmd = self.tools.workload(script, args);
        cmd.args(["--max-seconds", "900"]);
        let mut p = Proc::spawn(script, cmd, &self.path(tag, "workload-stderr"), true)?;
        let ready = p.event("ready", Duration::from_mins(1))?;
        Ok((p, ready))
    }

    pub fn progress(&self, what: &str, round: usize, result: &Result<String, String>) {
        match result {
            Ok(s) => say(
                "bench",
                format!("{what} [{}/{}]: {s}", round + 1, self.plan.runs),
            ),
            Err(e) => say(
                "bench",
                format!("{what} [{}/{}]: FAILED {e}", round + 1, self.plan.runs),
            ),
        }
    }
}

/// The order of `n` configurations in round `round`: every configuration once, the start
/// rotated by one each round, so that none always runs first or right after the same one.
pub fn rotation(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |j| (j + round) % n)
}

pub fn run(opts: &Options) -> Result<()> {
    if opts.runs < 5 {
        bail!("--runs must be at least 5 (medians with min–max over at least 5 runs)");
    }
    if !sh::is_root() {
        sh::reexec_as_root("`cargo xtask bench` (eBPF and ptrace)")?;
    }
    let t0 = Instant::now();
    let load_start = tools::loadavg();
    let mut t = Timings::default();
    let tools = t.phase("tools (pyebpf release, py-spy)", Tools::prepare)?;
    let facts = tools::Facts::gather(&tools);
    let dir = std::env::temp_dir().join(format!("pyebpf-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ctx = Ctx {
        plan: Plan::new(opts),
        cpus: tools::cpus(),
        tools,
        dir: dir.clone(),
        seq: Cell::new(0),
    };
    say(
        "bench",
        format!(
            "{} run, {} runs per configuration, load average {load_start}; files in {}",
            if opts.quick { "quick" } else { "full" },
            opts.runs,
            dir.display()
        ),
    );
    let tables = figures(&ctx, opts, &mut t)?;
    let load_end = tools::loadavg();
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let md = report::render(
        &report::Context {
            facts: &facts,
            plan: &ctx.plan,
            python: &ctx.tools.python_version,
            pyebpf_origin: &ctx.tools.pyebpf_origin,
            load_start: &load_start,
            load_end: &load_end,
            minutes,
        },
        &tables,
    );
    t.print("bench");
    println!("\n{md}");
    let doc = sh::workspace_root().join("docs/benchmarks.md");
    if opts.only.is_empty() {
        let old = std::fs::read_to_string(&doc).unwrap_or_default();
        // The hand-written part (one-off measurements, before/after tables) stays.
        let kept = old
            .find(KEEP_MARKER)
            .map_or_else(|| format!("{KEEP_MARKER}\n"), |i| old[i..].to_owned());
        // The kernel matrix's section is `vm-test`'s: kept as it is.
        let md = match crate::vm::report::section_of(&old) {
            Some(section) if !kept.contains(section) => crate::vm::report::splice(&md, section),
            _ => md,
        };
        std::fs::write(&doc, format!("{}\n\n{kept}", md.trim_end()))
            .with_context(|| format!("writing {}", doc.display()))?;
        say(
            "bench",
            format!("wrote {} ({minutes:.1} min)", doc.display()),
        );
    } else {
        say("bench", "--only: docs/benchmarks.md left alone");
    }
    if std::env::var_os("PYEBPF_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        say(
            "bench",
            format!("kept {} (PYEBPF_BENCH_KEEP)", dir.display()),
        );
    }
    Ok(())
}

/// The figures asked for (every one without `--only`), in order.
fn figures(ctx: &Ctx, opts: &Options, t: &mut Timings) -> Result<Vec<report::Table>> {
    let wanted = |n: u8| opts.only.is_empty() || opts.only.contains(&n);
    let mut tables = Vec::new();
    let mut cost = None;
    if wanted(1) || wanted(2) {
        let (slow, c) = t.phase("1-2. slowdown and cost", || Ok(slowdown::measure(ctx)))?;
        tables.push(slow);
        cost = Some(c);
    }
    if wanted(3) {
        let (rate_table, rate_cost_rows) = t.phase("3. rate limits", || Ok(rates::measure(ctx)))?;
        if let Some(c) = cost.as_mut() {
            for r in rate_cost_rows {
                c.row(r);
            }
        }
        tables.extend(cost.take());
        tables.push(rate_table);
    }
    tables.extend(cost.take());
    if wanted(4) {
        tables.push(t.phase("4. accuracy", || Ok(accuracy::measure(ctx)))?);
    }
    if wanted(5) {
        tables.push(t.phase("5. start-up and RSS", || Ok(startup::measure(ctx)))?);
    }
    if wanted(6) {
        tables.push(t.phase("6. eBPF cost by version", || Ok(versions::measure(ctx)))?);
    }
    if wanted(7) {
        tables.push(t.phase("7. record pipeline", || Ok(pipeline::measure(ctx)))?);
    }
    if wanted(8) {
        tables.push(t.phase("8. off-CPU (--idle)", || Ok(offcpu::measure(ctx)))?);
    }
    if wanted(9) {
        tables.extend(t.phase("9. third-party programs", || Ok(realworld::measure(ctx)))?);
    }
    Ok(tables)
}
