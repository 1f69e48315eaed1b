//! Table 6, the eBPF program's cost per sample by CPython version: the same depth-20 spinner on
//! every interpreter of the test manifest (3.8 to 3.15, free-threaded, static, in roots),
//! recorded by pyebpf with `-p`; the kernel's BPF statistics divided by the samples of the
//! target.
//!
//! The program is one for every version (layout differences are data in `PY_PROCS`); what
//! differs per version is the walk it does: a `PyFrameObject` chain matched by `pthread_t` up to
//! 3.10, `cframe` in 3.11/3.12, `current_frame` from 3.13.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::Ctx;
use super::proc::Proc;
use super::profilers::{self, Spec, Target, Who};
use super::report::Table;
use super::stats::{self, Runs};
use crate::interpreters::Cache;

/// Interpreters measured, by manifest name, in version order.
const VERSIONS: [&str; 11] = [
    "3.8",
    "3.9",
    "3.9-bullseye",
    "3.10",
    "3.11",
    "3.11-debian",
    "3.12",
    "3.13",
    "3.13t",
    "3.14",
    "3.15",
];
/// Python frames of the spinning thread (`<module>`, 18 × `rec`, `spin`).
const DEPTH: u32 = 20;
/// Seconds per recording, and samples per second per CPU.
const SECONDS: u64 = 3;
const RATE: u64 = 499;

/// Spins at depth `DEPTH` after printing the ready line.
const SPINNER: &str = "import json, os, signal, sys\n\
signal.alarm(300)\n\
def spin():\n    n = 0\n    while True:\n        n += 1\n\
def rec(k):\n    return spin() if k <= 0 else rec(k - 1)\n\
sys.stdout.write(json.dumps({'event': 'ready', 'pid': os.getpid()}) + '\\n')\n\
sys.stdout.flush()\n\
rec(int(sys.argv[1]) - 2)\n";

/// One manifest entry: name, path as the interpreter sees it, root to chroot into.
fn manifest() -> Result<Vec<(String, String, Option<String>)>> {
    let path = Cache::from_env().manifest();
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (`cargo xtask setup --interpreters`)",
            path.display()
        )
    })?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    Ok(entries
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["python"].as_str()?.to_owned(),
                e["root"].as_str().map(str::to_owned),
            ))
        })
        .collect())
}

/// (eBPF ns per program run, eBPF ns per sample of the target, samples) of one recording.
fn one_run(ctx: &Ctx, name: &str, python: &str, root: Option<&str>) -> Result<(f64, f64, f64)> {
    let mut cmd = match root {
        Some(r) => {
            let mut c = crate::sh::clean("chroot");
            c.arg(r).arg(python);
            c
        }
        None => crate::sh::clean(python),
    };
    cmd.args(["-c", SPINNER, &DEPTH.to_string()]);
    let mut w = Proc::spawn(name, cmd, &ctx.path(&format!("ver-{name}"), "stderr"), true)?;
    w.event("ready", Duration::from_mins(1))?;
    let spec = Spec::new(Who::Pyebpf, Target::Pid(w.pid), RATE).duration(SECONDS);
    let run = profilers::start(ctx, &spec, &format!("ver-{name}"))?;
    let done = run.finish(Some(Duration::from_secs(SECONDS + 30)));
    let _ = w.stop(Duration::from_secs(5));
    let done = done?;
    let (Some(bpf), Some(samples)) = (done.bpf, done.samples) else {
        bail!("no BPF statistics or no sample count");
    };
    if bpf.run_cnt == 0 || samples == 0 {
        bail!("no program runs or no samples (kernel.bpf_stats_enabled?)");
    }
    Ok((
        bpf.run_time_ns as f64 / bpf.run_cnt as f64,
        bpf.run_time_ns as f64 / samples as f64,
        samples as f64,
    ))
}

pub fn measure(ctx: &Ctx) -> Table {
    let mut t = Table::new(
        "6. eBPF cost by CPython version",
        &[
            "Interpreter",
            "eBPF run time per program run",
            "eBPF run time per sample of the target (upper bound)",
            "Samples",
        ],
    );
    t.method(format!(
        "One thread spinning at a depth-{DEPTH} Python stack (`<module>`, 18 × `rec`, `spin`) on \
         each interpreter of the test manifest, recorded with `pyebpf record -p PID -r {RATE} -d \
         {SECONDS}`. The program's run time is the kernel's BPF statistics (`run_time_ns` / \
         `run_cnt`); with `-p` it also runs (and returns early) on every other task of the \
         CPUs, so the run time divided by the target's samples is an upper bound of one walk \
         (thread-state lookup, GIL words, {DEPTH} frames). One program serves every version: \
         a `PyFrameObject` chain matched by `pthread_t` (3.8–3.10), `cframe` (3.11, 3.12), \
         `current_frame` (3.13+)."
    ));
    let all = match manifest() {
        Ok(m) => m,
        Err(e) => {
            t.note(format!("n/a: {e:#}"));
            return t;
        }
    };
    for name in VERSIONS {
        let Some((_, python, root)) = all.iter().find(|(n, _, _)| n == name) else {
            t.row(vec![
                name.into(),
                "n/a: not in the manifest".into(),
                "—".into(),
                "—".into(),
            ]);
            continue;
        };
        let runs: Vec<Result<(f64, f64, f64), String>> = (0..ctx.plan.runs.min(5))
            .map(|round| {
                let r = one_run(ctx, name, python, root.as_deref()).map_err(|e| format!("{e:#}"));
                ctx.progress(
                    &format!("eBPF cost {name}"),
                    round,
                    &r.as_ref()
                        .map(|(run, per, n)| {
                            format!("{run:.0} ns/run, ≤ {per:.0} ns/sample, {n} samples")
                        })
                        .map_err(Clone::clone),
                );
                r
            })
            .collect();
        let pick = |f: fn(&(f64, f64, f64)) -> f64| -> Runs {
            runs.iter()
                .map(|r| r.as_ref().map(f).map_err(Clone::clone))
                .collect()
        };
        t.row(vec![
            name.into(),
            stats::cell(&pick(|r| r.0), 0, " ns"),
            stats::cell(&pick(|r| r.1), 0, " ns"),
            stats::cell(&pick(|r| r.2), 0, ""),
        ]);
    }
    t
}
