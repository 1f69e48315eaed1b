//! Figure 9, third-party programs (issue 17): pinned PyPI packages (`xtask/src/realworld.rs`)
//! run by `tests/workloads/realworld/*_loop.py` on 3.12, 3.13 and 3.14, each process profiled
//! by pyebpf and py-spy in turn (the same process, alternating, `ROUNDS` times each). Shares
//! are of the samples with a Python frame, pooled over the rounds: the leaf share of a
//! function is the share of samples whose innermost Python frame it is, its inclusive share
//! the share of samples with it anywhere in the stack. Functions are compared by name and file
//! base name (both profilers print `name (file:line)`; lines are left out: a function's samples
//! spread over its lines). pyebpf's junk samples are those with a run of two or more
//! `[unknown python frame]` or more Python frames than the program's deepest stack (measured
//! by the workload under `sys.setprofile`); its SVG is the flame graph of one round. One more
//! pyebpf recording with `--native` gives the share of samples whose native and Python stacks
//! could not be merged (`[merge mismatch]`).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::Ctx;
use super::proc::Proc;
use super::profilers::{self, Spec, Target, Who};
use super::report::Table;
use super::slowdown::RATE;
use crate::interpreters::Cache;

/// Programs: (name in the table, workload script).
const PROGRAMS: &[(&str, &str)] = &[
    ("sympy 1.13.3 (algebra)", "sympy_loop.py"),
    ("docutils 0.21.2 (reST → HTML)", "docutils_loop.py"),
    (
        "stdlib C modules (json, re, zlib, hashlib, pickle, sqlite3)",
        "stdlib_c_loop.py",
    ),
];
/// Interpreters by manifest name.
const INTERPRETERS: &[&str] = &["3.12", "3.13", "3.14"];
/// Recordings per profiler and program.
const ROUNDS: usize = 3;
/// Functions per table.
const TOP: usize = 10;

/// One profiler's pooled samples of one program: leaf and inclusive counts per function.
#[derive(Default)]
struct Shares {
    /// Samples with a Python frame.
    total: u64,
    leaf: HashMap<String, u64>,
    inclusive: HashMap<String, u64>,
    /// pyebpf: junk samples, and samples cut at an invalid frame (a marker, not junk).
    junk: u64,
    invalid: u64,
}

/// `name (file:line)` → `name (file base name)`; `None` for anything else (roots, markers).
fn function_key(frame: &str) -> Option<String> {
    let inner = frame.strip_suffix(')')?;
    let (name, loc) = inner.rsplit_once(" (")?;
    let (file, line) = loc.rsplit_once(':')?;
    if name.is_empty() || line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let base = file.rsplit('/').next().unwrap_or(file);
    Some(format!("{name} ({base})"))
}

impl Shares {
    /// Adds a folded-stack file (`frame;frame;… count` per line).
    fn add(&mut self, text: &str, max_depth: usize) {
        for line in text.lines() {
            let Some((stack, count)) = line.trim_end().rsplit_once(' ') else {
                continue;
            };
            let Ok(n) = count.parse::<u64>() else {
                continue;
            };
            let frames: Vec<&str> = stack.split(';').collect();
            let keys: Vec<String> = frames.iter().filter_map(|f| function_key(f)).collect();
            let mut run = 0;
            let mut longest = 0;
            for f in &frames {
                run = if *f == "[unknown python frame]" {
                    run + 1
                } else {
                    0
                };
                longest = longest.max(run);
            }
            if longest >= 2 || keys.len() > max_depth {
                self.junk += n;
            }
            if frames.iter().any(|f| f.contains("invalid python frame")) {
                self.invalid += n;
            }
            let Some(leaf) = keys.last() else { continue };
            self.total += n;
            *self.leaf.entry(leaf.clone()).or_default() += n;
            let mut seen: Vec<&String> = Vec::new();
            for k in &keys {
                if !seen.contains(&k) {
                    seen.push(k);
                    *self.inclusive.entry(k.clone()).or_default() += n;
                }
            }
        }
    }

    fn share(map: &HashMap<String, u64>, total: u64, key: &str) -> f64 {
        if total == 0 {
            return 0.0;
        }
        map.get(key).copied().unwrap_or(0) as f64 * 100.0 / total as f64
    }
}

/// What one program on one interpreter gave.
struct Outcome {
    ours: Shares,
    theirs: Result<Shares, String>,
    max_depth: usize,
    svg_height: Option<u64>,
    /// `record --native`: samples with `[merge mismatch]`, and all samples.
    native: Result<(u64, u64), String>,
}

/// (samples with `[merge mismatch]`, all samples) of a folded-stack file.
fn mismatches(text: &str) -> (u64, u64) {
    let (mut bad, mut all) = (0, 0);
    for line in text.lines() {
        let Some((stack, count)) = line.trim_end().rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = count.parse::<u64>() else {
            continue;
        };
        all += n;
        if stack.split(';').any(|f| f == "[merge mismatch]") {
            bad += n;
        }
    }
    (bad, all)
}

/// inferno's height for a graph whose deepest stack has `frames` frames (as in the e2e test).
fn svg_height_for(frames: usize) -> u64 {
    (frames as u64 + 1) * 16 + 12 * 3 + 12 * 2 + 12 * 2 + 10
}

fn svg_height(svg: &str) -> Option<u64> {
    let at = svg.find("height=\"")? + 8;
    svg[at..at + svg[at..].find('"')?].parse().ok()
}

/// A manifest entry: the interpreter as it sees itself and its root, if any.
fn interpreter(name: &str) -> Result<(String, Option<PathBuf>)> {
    let path = Cache::from_env().manifest();
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (`cargo xtask setup`)", path.display()))?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    let e = entries
        .iter()
        .find(|e| e["name"] == name)
        .with_context(|| format!("{name} is not in the manifest"))?;
    Ok((
        e["python"].as_str().context("no python")?.to_owned(),
        e["root"].as_str().map(PathBuf::from),
    ))
}

/// Starts `script` on `name` and waits for its ready file: the process and its ready JSON.
fn start(ctx: &Ctx, name: &str, script: &str, dir: &Path) -> Result<(Proc, serde_json::Value)> {
    let (python, root) = interpreter(name)?;
    let cache = Cache::from_env();
    let site = crate::realworld::site(&cache);
    if !site.is_dir() {
        bail!(
            "{} missing (`cargo xtask setup --interpreters`)",
            site.display()
        );
    }
    // The scripts and the ready file live in the sid root's /tmp, which both a host
    // interpreter (by its host path) and a chrooted one see.
    let inner = |p: &Path| -> String {
        match &root {
            Some(r) => format!("/{}", p.strip_prefix(r).unwrap_or(p).display()),
            None => p.display().to_string(),
        }
    };
    let workloads = crate::sh::workspace_root().join("tests/workloads/realworld");
    // The script and the loop protocol it imports.
    for file in [script, "measured_loop.py"] {
        let src = workloads.join(file);
        std::fs::copy(&src, dir.join(file))
            .with_context(|| format!("copying {}", src.display()))?;
    }
    let installed = dir.join(script);
    let ready = dir.join(format!("{name}-{script}.ready"));
    let _ = std::fs::remove_file(&ready);
    let site_seen = match &root {
        Some(_) => crate::realworld::SITE_IN_ROOT.to_owned(),
        None => site.display().to_string(),
    };
    let mut cmd = match &root {
        Some(r) => {
            let mut c = crate::sh::clean("chroot");
            c.arg(r).arg(&python);
            c
        }
        None => crate::sh::clean(&python),
    };
    cmd.env("PYTHONPATH", site_seen)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(inner(&installed))
        .arg(inner(&ready));
    let tag = format!("rw-{name}-{script}");
    let mut p = Proc::spawn(&tag, cmd, &ctx.path(&tag, "stderr"), false)?;
    let deadline = Instant::now() + Duration::from_mins(3);
    while !ready.exists() {
        if !p.is_running() {
            bail!(
                "{script} on {name} ended before it was ready: {}",
                p.stderr_tail()
            );
        }
        if Instant::now() > deadline {
            bail!("{script} on {name} not ready after 3 min");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = serde_json::from_str(&std::fs::read_to_string(&ready)?)?;
    Ok((p, v))
}

/// pyebpf `record -p PID -d SECONDS` (with `--native` when `native`) into a collapsed file
/// (and an SVG when `svg`).
fn record_pyebpf(
    ctx: &Ctx,
    pid: u32,
    secs: u64,
    svg: Option<&Path>,
    native: bool,
) -> Result<String> {
    let out = ctx.path("rw-pyebpf", "txt");
    let mut cmd = crate::sh::clean(&ctx.tools.pyebpf);
    cmd.args([
        "record",
        "-q",
        "-p",
        &pid.to_string(),
        "-r",
        &RATE.to_string(),
    ])
    .args(["-d", &secs.to_string(), "-o"])
    .arg(&out);
    if native {
        cmd.arg("--native");
    }
    if let Some(svg) = svg {
        cmd.arg("-o").arg(svg);
    }
    let mut p = Proc::spawn("pyebpf", cmd, &ctx.path("rw-pyebpf", "stderr"), false)?;
    let Some(r) = p.wait(Duration::from_secs(secs + 60)) else {
        p.kill();
        bail!("pyebpf did not end");
    };
    if r.code() != Some(0) {
        bail!("pyebpf {}: {}", r.describe(), p.stderr_tail());
    }
    std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))
}

fn record_pyspy(ctx: &Ctx, pid: u32, secs: u64) -> Result<String> {
    let spec = Spec::new(Who::PySpy, Target::Pid(pid), RATE).duration(secs);
    let run = profilers::start(ctx, &spec, "rw-pyspy")?;
    let f = run.finish(Some(Duration::from_secs(secs + 30)))?;
    std::fs::read_to_string(&f.out).with_context(|| format!("reading {}", f.out.display()))
}

fn one_program(ctx: &Ctx, name: &str, script: &str, dir: &Path) -> Result<Outcome> {
    let secs = if ctx.plan.quick { 4 } else { 10 };
    let (mut w, ready) = start(ctx, name, script, dir)?;
    let max_depth = usize::try_from(ready["max_depth"].as_u64().context("max_depth")?)?;
    let mut out = Outcome {
        ours: Shares::default(),
        theirs: Ok(Shares::default()),
        max_depth,
        svg_height: None,
        native: Err("not run".into()),
    };
    let svg = ctx.path(&format!("rw-{name}-{script}"), "svg");
    let result = (|| -> Result<()> {
        for round in 0..ROUNDS {
            for i in super::rotation(2, round) {
                if i == 0 {
                    let svg = (round == 0).then_some(&*svg);
                    let text = record_pyebpf(ctx, w.pid, secs, svg, false)?;
                    out.ours.add(&text, max_depth);
                } else if let Ok(theirs) = &mut out.theirs {
                    match record_pyspy(ctx, w.pid, secs) {
                        Ok(text) => theirs.add(&text, max_depth),
                        Err(e) => out.theirs = Err(format!("{e:#}")),
                    }
                }
            }
        }
        out.native = record_pyebpf(ctx, w.pid, secs, None, true)
            .map(|text| mismatches(&text))
            .map_err(|e| format!("{e:#}"));
        Ok(())
    })();
    let _ = w.stop(Duration::from_secs(5));
    result?;
    out.svg_height = std::fs::read_to_string(&svg)
        .ok()
        .and_then(|s| svg_height(&s));
    Ok(out)
}

/// The `TOP` keys of `map` by count.
fn top(map: &HashMap<String, u64>) -> Vec<String> {
    let mut v: Vec<(&String, &u64)> = map.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.into_iter().take(TOP).map(|(k, _)| k.clone()).collect()
}

/// Rows of one table of shares (leaf or inclusive): the top functions of py-spy (else
/// pyebpf), each profiler's share and the difference; returns the largest difference.
fn share_rows(
    table: &mut Table,
    label: &str,
    outcome: &Outcome,
    pick: fn(&Shares) -> &HashMap<String, u64>,
) -> Option<(f64, String)> {
    let theirs = outcome.theirs.as_ref().ok();
    let keys = top(pick(theirs.unwrap_or(&outcome.ours)));
    let mut worst: Option<(f64, String)> = None;
    for k in keys {
        let ours = Shares::share(pick(&outcome.ours), outcome.ours.total, &k);
        let (theirs_cell, d) = match theirs {
            Some(s) => {
                let share = Shares::share(pick(s), s.total, &k);
                (format!("{share:.1} %"), Some(ours - share))
            }
            None => ("n/a".into(), None),
        };
        if let Some(d) = d
            && worst.as_ref().is_none_or(|(w, _)| d.abs() > *w)
        {
            worst = Some((d.abs(), k.clone()));
        }
        table.row(vec![
            label.into(),
            format!("`{k}`"),
            format!("{ours:.1} %"),
            theirs_cell,
            d.map_or_else(|| "—".into(), |d| format!("{d:+.1} pp")),
        ]);
    }
    worst
}

pub fn measure(ctx: &Ctx) -> Vec<Table> {
    let mut summary = Table::new(
        "9. Third-party programs beside py-spy",
        &[
            "Program",
            "Python",
            "Samples pyebpf / py-spy",
            "Largest top-10 leaf difference",
            "Largest top-10 inclusive difference",
            "pyebpf junk samples",
            "Cut at an invalid frame",
            "SVG height (deepest real stack needs)",
            "`--native`: samples with `[merge mismatch]`",
        ],
    );
    summary.method(format!(
        "Each program runs on each interpreter; the same process is profiled by pyebpf (`record \
         -p PID -r {RATE}`) and py-spy (`record --pid PID -r {RATE} -f raw`) in turn, {ROUNDS} \
         recordings each, alternating. Shares are of the samples with a Python frame, pooled \
         over the recordings; functions compare by name and file base name. Junk: a run of \
         unknown frames or a stack deeper than the program's deepest (the workload measures it \
         under `sys.setprofile`). One more pyebpf recording of the same length with \
         `--native` counts the samples whose native and Python stacks could not be merged. The \
         tables after this one list the top-10 functions."
    ));
    let mut leaf = share_table("9a. Top-10 leaf functions");
    let mut incl = share_table("9b. Top-10 inclusive functions");
    let dir = Cache::from_env()
        .0
        .join("roots/sid/tmp")
        .join(format!("pyebpf-bench-rw-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        summary.note(format!("n/a: creating {}: {e}", dir.display()));
        return vec![summary];
    }
    for (program, script) in PROGRAMS {
        for name in INTERPRETERS {
            let label = format!("{program}, {name}");
            let o = match one_program(ctx, name, script, &dir) {
                Ok(o) => o,
                Err(e) => {
                    say_progress(&label, &Err(format!("{e:#}")));
                    let mut row = vec![(*program).into(), (*name).into(), format!("n/a: {e:#}")];
                    row.resize(9, "—".into());
                    summary.row(row);
                    continue;
                }
            };
            let worst_leaf = share_rows(&mut leaf, &label, &o, |s| &s.leaf);
            let worst_incl = share_rows(&mut incl, &label, &o, |s| &s.inclusive);
            let theirs = match &o.theirs {
                Ok(s) => s.total.to_string(),
                Err(e) => {
                    summary.note(format!("py-spy on {label}: {e}"));
                    "n/a".into()
                }
            };
            let native = match &o.native {
                Ok((bad, all)) => format!(
                    "{bad} of {all} ({:.2} %)",
                    *bad as f64 * 100.0 / (*all).max(1) as f64
                ),
                Err(e) => format!("n/a: {e}"),
            };
            say_progress(
                &label,
                &Ok(format!(
                    "{} / {theirs} samples, leaf {}, junk {}, --native mismatches {native}",
                    o.ours.total,
                    fmt(worst_leaf.clone()),
                    o.ours.junk,
                )),
            );
            summary.row(vec![
                (*program).into(),
                (*name).into(),
                format!("{} / {theirs}", o.ours.total),
                fmt(worst_leaf),
                fmt(worst_incl),
                o.ours.junk.to_string(),
                o.ours.invalid.to_string(),
                format!(
                    "{} px ({} px)",
                    o.svg_height.map_or_else(|| "?".into(), |h| h.to_string()),
                    svg_height_for(o.max_depth + 1)
                ),
                native,
            ]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    vec![summary, leaf, incl]
}

/// A table of top-10 shares.
fn share_table(title: &str) -> Table {
    Table::new(
        title,
        &[
            "Program, Python",
            "Function",
            "pyebpf",
            "py-spy",
            "Difference",
        ],
    )
}

/// A largest difference as a cell.
fn fmt(w: Option<(f64, String)>) -> String {
    w.map_or_else(|| "n/a".into(), |(d, k)| format!("{d:.1} pp (`{k}`)"))
}

fn say_progress(label: &str, r: &Result<String, String>) {
    match r {
        Ok(s) => crate::sh::say("bench", format!("real-world {label}: {s}")),
        Err(e) => crate::sh::say("bench", format!("real-world {label}: FAILED {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_inclusive_and_junk() {
        let mut s = Shares::default();
        s.add(
            "py (1);<module> (a.py:3);f (b/c.py:4);g (c.py:9) 3\n\
             py (1);<module> (a.py:3);f (c.py:5) 1\n\
             py (1);[unknown python frame];[unknown python frame];f (c.py:5) 2\n\
             py (1);[truncated: invalid python frame];g (c.py:1) 1\n\
             py (1);native 5\n",
            3,
        );
        assert_eq!(s.total, 7);
        assert_eq!(s.leaf["g (c.py)"], 4);
        assert_eq!(s.leaf["f (c.py)"], 3);
        assert_eq!(s.inclusive["f (c.py)"], 6);
        assert_eq!((s.junk, s.invalid), (2, 1));
        assert_eq!(function_key("x (y)"), None);
        assert_eq!(svg_height(r#"<svg height="120" w"#), Some(120));
        assert_eq!(
            mismatches("py (1);main;f (a.py:1) 3\npy (1);eval;[merge mismatch];f (a.py:1) 1\n"),
            (1, 4)
        );
    }
}
