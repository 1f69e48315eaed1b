//! `cargo xtask fuzz [--secs N] [--jobs J] [TARGET...]`: coverage-guided fuzzing of every input
//! pyebpf parses (`fuzz/`, cargo fuzz + libFuzzer on the eBPF nightly), then a table of
//! executions, coverage and crashes per target.
//!
//! Steps: cargo-fuzz (installed by `setup`), the seed tests (`fuzzing::` and, as root with the
//! test interpreters, `live_seeds`) write the seeds into the corpora, one build of every
//! target, then each target for N seconds (J at a time). Corpora live in
//! `$PYEBPF_TEST_CACHE/fuzz/corpus/TARGET` (kept between runs, so CI starts from what long runs
//! found); the build in `$PYEBPF_TEST_CACHE/fuzz/target`. A crash leaves its input in
//! `fuzz/artifacts/TARGET/` and fails the command: fix it, then add the input to
//! `fuzz/regressions/TARGET/` (the `fuzz_regressions` unit test replays every file there).
//!
//! Sanitizer: none. The targets are safe Rust (the few `unsafe` blocks are libc calls on our
//! own buffers); what is looked for is panics, overflow (debug assertions are on), unbounded
//! time and memory — ASan would halve the executions without finding more of those.
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::interpreters::Cache;
use crate::sh::{self, say};

/// Every target with its largest input (libFuzzer's `-max_len`): the seeds fit.
pub const TARGETS: [(&str, usize); 6] = [
    ("python_reader", 256 << 10),
    ("debug_offsets", 4 << 10),
    ("elf", 64 << 10),
    ("eh_frame", 64 << 10),
    ("saved", 64 << 10),
    ("core", 1 << 20),
];

pub struct Options {
    pub secs: u64,
    pub jobs: usize,
    pub targets: Vec<String>,
    /// The nightly toolchain (`setup`'s eBPF nightly).
    pub toolchain: String,
}

/// What one target's run found.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub target: String,
    pub secs: f64,
    pub execs: u64,
    pub cov: u64,
    pub features: u64,
    pub corpus: u64,
    pub crash: Option<String>,
}

fn fuzz_dir() -> PathBuf {
    sh::workspace_root().join("fuzz")
}

/// A `cargo +TOOLCHAIN fuzz ...` command in `fuzz/`, building against the cached target dir
/// without the eBPF object (the targets never load it).
/// Through rustup's `cargo` (not `$CARGO`, the stable cargo running xtask), so that the
/// toolchain is the nightly cargo fuzz needs.
fn cargo_fuzz(opts: &Options, cache: &Cache) -> Command {
    let mut cmd = sh::clean("cargo");
    cmd.current_dir(fuzz_dir())
        .env("PATH", sh::path_with_cargo_bin())
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env("RUSTUP_TOOLCHAIN", &opts.toolchain)
        .env("PYEBPF_SKIP_EBPF", "1")
        .env("CARGO_TARGET_DIR", cache.0.join("fuzz/target"));
    cmd
}

/// The libFuzzer flags shared by `build` and `run`. `-O`: cargo fuzz's own debug assertions
/// and overflow checks come as RUSTFLAGS for every crate; `fuzz/Cargo.toml`'s release profile
/// turns them on per package instead, so that one dependency can be exempted (framehop: see
/// there).
const BUILD_FLAGS: [&str; 5] = ["-O", "-s", "none", "--codegen-units", "4"];

pub fn run(opts: &Options) -> Result<Vec<Outcome>> {
    let cache = Cache::from_env();
    let targets: Vec<(&str, usize)> = if opts.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        opts.targets
            .iter()
            .map(|t| {
                TARGETS
                    .iter()
                    .find(|(n, _)| n == t)
                    .copied()
                    .with_context(|| format!("no fuzz target {t} (targets: {})", names()))
            })
            .collect::<Result<_>>()?
    };
    crate::rust::ensure_cargo_fuzz()?;
    let corpora = cache.0.join("fuzz/corpus");
    seeds(&corpora)?;
    let mut build = cargo_fuzz(opts, &cache);
    build.args(["fuzz", "build"]).args(BUILD_FLAGS);
    sh::run(&mut build)?;
    let mut outcomes = Vec::new();
    for chunk in targets.chunks(opts.jobs.max(1)) {
        let running: Vec<_> = chunk
            .iter()
            .map(|(name, max_len)| start(opts, &cache, &corpora, name, *max_len))
            .collect::<Result<_>>()?;
        for r in running {
            outcomes.push(r.finish()?);
        }
    }
    print_table(&outcomes);
    let crashed: Vec<&Outcome> = outcomes.iter().filter(|o| o.crash.is_some()).collect();
    if !crashed.is_empty() {
        for o in &crashed {
            say(
                "fuzz",
                format!(
                    "CRASH in {}: {} (fix it, then add the input to fuzz/regressions/{}/)",
                    o.target,
                    o.crash.as_deref().unwrap_or_default(),
                    o.target
                ),
            );
        }
        bail!("{} fuzz target(s) crashed", crashed.len());
    }
    Ok(outcomes)
}

fn names() -> String {
    TARGETS.map(|(n, _)| n).join(", ")
}

/// Runs the seed tests with `PYEBPF_FUZZ_SEEDS` set: the synthetic seeds always, the live
/// ones as root (they need the test interpreters; `cargo xtask test` provides them).
fn seeds(corpora: &Path) -> Result<()> {
    std::fs::create_dir_all(corpora).with_context(|| format!("creating {}", corpora.display()))?;
    let mut cmd = sh::cargo();
    cmd.env("PYEBPF_FUZZ_SEEDS", corpora).args([
        "test",
        "-p",
        "sampler-user",
        "--lib",
        "--",
        "fuzzing::",
    ]);
    if !sh::is_root() {
        cmd.args(["--skip", "live_seeds"]);
        say("fuzz", "not root: seeds from live interpreters skipped");
    }
    sh::run(&mut cmd)
}

struct Running {
    target: String,
    child: std::process::Child,
    started: Instant,
    log: PathBuf,
}

fn start(
    opts: &Options,
    cache: &Cache,
    corpora: &Path,
    name: &str,
    max_len: usize,
) -> Result<Running> {
    let artifacts = fuzz_dir().join("artifacts").join(name);
    std::fs::create_dir_all(&artifacts)?;
    let log = cache.0.join(format!("fuzz/{name}.log"));
    let mut cmd = cargo_fuzz(opts, cache);
    cmd.args(["fuzz", "run"])
        .args(BUILD_FLAGS)
        .arg(name)
        .arg(corpora.join(name))
        .arg("--")
        .arg(format!("-max_total_time={}", opts.secs))
        .arg(format!("-max_len={max_len}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(["-timeout=20", "-rss_limit_mb=2048", "-print_final_stats=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    say(
        "fuzz",
        format!("{name}: {}s, log {}", opts.secs, log.display()),
    );
    println!("+ {}", sh::show(&cmd));
    let child = cmd.spawn().context("starting cargo fuzz run")?;
    Ok(Running {
        target: name.to_owned(),
        child,
        started: Instant::now(),
        log,
    })
}

impl Running {
    fn finish(mut self) -> Result<Outcome> {
        let status = self.child.wait()?;
        // Wall time until libFuzzer says how long it fuzzed (a crash ends it early).
        let mut o = Outcome {
            target: self.target.clone(),
            secs: self.started.elapsed().as_secs_f64(),
            ..Outcome::default()
        };
        let log = std::fs::File::open(&self.log)?;
        let mut tail = Vec::new();
        for line in BufReader::new(log).lines().map_while(Result::ok) {
            parse_line(&line, &mut o);
            if tail.len() >= 30 {
                tail.remove(0);
            }
            tail.push(line);
        }
        if !status.success() {
            o.crash = Some(
                tail.iter()
                    .rev()
                    .find(|l| l.contains("Test unit written to"))
                    .cloned()
                    .unwrap_or_else(|| format!("{status}; log {}", self.log.display())),
            );
            for l in &tail {
                println!("[{}] {l}", self.target);
            }
        }
        Ok(o)
    }
}

/// Reads libFuzzer's status lines (`#N DONE cov: C ft: F corp: K/...`) and final stats.
fn parse_line(line: &str, o: &mut Outcome) {
    if let Some(v) = line.strip_prefix("stat::number_of_executed_units:") {
        o.execs = v.trim().parse().unwrap_or(o.execs);
    }
    // "Done 662533 runs in 631 second(s)": the fuzzing time, without the build before it.
    if let Some(rest) = line.strip_prefix("Done ")
        && let Some(secs) = rest.split(" in ").nth(1)
    {
        o.secs = secs
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(o.secs);
    }
    if !line.starts_with('#') {
        return;
    }
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        let value = |v: Option<&str>| {
            v.and_then(|v| v.split('/').next()?.parse().ok())
                .unwrap_or_default()
        };
        match w {
            "cov:" => o.cov = value(words.next()),
            "ft:" => o.features = value(words.next()),
            "corp:" => o.corpus = value(words.next()),
            _ => {}
        }
    }
}

fn print_table(outcomes: &[Outcome]) {
    say("fuzz", "results:");
    println!(
        "| target | seconds | executions | exec/s | coverage (edges) | features | corpus | crashes |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for o in outcomes {
        println!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {} | {} |",
            o.target,
            o.secs,
            o.execs,
            o.execs as f64 / o.secs.max(1.0),
            o.cov,
            o.features,
            o.corpus,
            usize::from(o.crash.is_some())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libfuzzer_status_lines() {
        let mut o = Outcome::default();
        parse_line(
            "#207070\tDONE   cov: 2079 ft: 6368 corp: 835/13931Kb lim: 24687 exec/s: 6679 rss: 62Mb",
            &mut o,
        );
        parse_line("stat::number_of_executed_units: 207070", &mut o);
        assert_eq!(
            (o.cov, o.features, o.corpus, o.execs),
            (2079, 6368, 835, 207_070)
        );
        parse_line("INFO: Seed: 1234", &mut o);
        assert_eq!(o.cov, 2079);
        parse_line("Done 207070 runs in 31 second(s)", &mut o);
        assert!((o.secs - 31.0).abs() < 1e-9);
    }
}
