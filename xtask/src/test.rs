//! `cargo xtask test`: setup (with interpreters and kernels; a no-op when cached), the lint gate
//! (`lint.rs`), a debug build of `pyebpf`, the workspace's unit and integration tests, then the
//! privileged end-to-end tests one at a time (they sample the whole machine), then (without
//! test arguments) every fuzz target for a bounded time, the soak for a minute and the kernel
//! matrix (`vm-test --kernel all`: Debian's 5.10, 6.1, 6.12 in qemu, and the host's kernel).
//! Runs as root. Output is cargo test's own, so CI can read its "test result:" lines; then a
//! phase table and the summary: tests that ran, and those that skipped for a missing
//! prerequisite (each test's `prereq::missing` writes to the skip log named by
//! `PYEBPF_SKIP_LOG`; under `CI=true` a skip fails the test, and the run).
use std::ffi::OsString;

use anyhow::{Result, bail};

use crate::interpreters::Cache;
use crate::setup;
use crate::sh::{self, Timings, say};

/// Seconds each fuzz target runs in `cargo xtask test` (two at a time): a regression check
/// from the kept corpora; the long runs are `cargo xtask fuzz --secs 600`.
const FUZZ_SECS: u64 = 20;

pub fn run(no_apt: bool, args: &[OsString]) -> Result<()> {
    if !sh::is_root() {
        sh::reexec_as_root("`cargo xtask test`")?;
    }
    let mut t = Timings::default();
    let result = phases(&mut t, no_apt, args);
    t.print("test");
    if result.is_ok() {
        say("test", "all passed");
    }
    result
}

fn phases(t: &mut Timings, no_apt: bool, args: &[OsString]) -> Result<()> {
    let ready = t.phase("setup", || {
        setup::run(&setup::Options {
            interpreters: true,
            no_apt,
        })
    })?;
    let cache = Cache::from_env();
    let target = sh::target_dir()?;
    let mut failed = Vec::new();
    if t.phase("lint (fmt, clippy)", || {
        crate::lint::run(&ready.ebpf_toolchain)
    })
    .is_err()
    {
        failed.push("lint");
    }
    let skip_log = target.join("pyebpf-skips.log");
    std::fs::write(&skip_log, "")?;
    let mut results = Vec::new();
    let bin = target.join("debug/pyebpf");
    let env = |cmd: &mut std::process::Command| {
        ready.apply(cmd);
        cmd.env("PYEBPF_BIN", &bin)
            .env(prereq::SKIP_LOG_ENV, &skip_log)
            .env("PYEBPF_TEST_CACHE", &cache.0)
            .env("PYEBPF_TEST_MANIFEST", cache.manifest());
    };
    t.phase("build pyebpf (debug)", || {
        let mut cmd = sh::cargo();
        cmd.args(["build", "-p", "sampler-user", "--bin", "pyebpf"]);
        env(&mut cmd);
        sh::run(&mut cmd)?;
        if !bin.is_file() {
            bail!("{} missing after the build", bin.display());
        }
        Ok(())
    })?;
    say(
        "test",
        format!(
            "PYEBPF_BIN={} PYEBPF_TEST_CACHE={}",
            bin.display(),
            cache.0.display()
        ),
    );
    // sampler-ebpf is built for bpfel-unknown-none by sampler-user/build.rs, not for the host;
    // integration-tests is the e2e tier, run below one test at a time.
    let mut unit = sh::cargo();
    unit.args([
        "test",
        "--workspace",
        "--no-fail-fast",
        "--exclude",
        "sampler-ebpf",
        "--exclude",
        "integration-tests",
    ]);
    env(&mut unit);
    unit.arg("--").args(args);
    if !tier(t, "unit + integration tests", &mut unit, &mut results) {
        failed.push("unit + integration tests");
    }
    let mut e2e = sh::cargo();
    e2e.args(["test", "-p", "integration-tests", "--no-fail-fast"]);
    env(&mut e2e);
    e2e.args(["--", "--test-threads=1"]).args(args);
    if !tier(t, "e2e tests (root)", &mut e2e, &mut results) {
        failed.push("e2e tests");
    }
    if args.is_empty() {
        bounded_phases(t, &ready, &mut failed);
    } else {
        say(
            "test",
            "fuzzing and the kernel matrix skipped: test arguments were given (`cargo xtask fuzz`, `cargo xtask vm-test` run them)",
        );
    }
    let summary = Summary::new(&results, &std::fs::read_to_string(&skip_log)?);
    summary.print();
    if setup::in_ci() && summary.skipped > 0 {
        failed.push("tests skipped under CI=true (listed above)");
    }
    if setup::in_ci() && !ready.missing_interpreters.is_empty() {
        failed.push("setup (CI=true: test interpreters missing, see the setup output)");
    }
    if setup::in_ci() && !ready.missing_kernels.is_empty() {
        failed.push("setup (CI=true: kernels of the matrix missing, see the setup output)");
    }
    if !failed.is_empty() {
        bail!("FAILED: {}", failed.join(", "));
    }
    Ok(())
}

/// Runs one tier of tests as phase `name`, keeping its `test result:` lines; whether it passed.
fn tier(
    t: &mut Timings,
    name: &str,
    cmd: &mut std::process::Command,
    results: &mut Vec<String>,
) -> bool {
    t.phase(name, || {
        let (st, lines) = sh::status_tee(cmd, "test result:")?;
        results.extend(lines);
        if st.success() {
            Ok(())
        } else {
            bail!("failed")
        }
    })
    .is_ok()
}

/// The phases that run only without test arguments: every fuzz target for [`FUZZ_SECS`], the
/// soak for a minute, then the kernel matrix.
fn bounded_phases(t: &mut Timings, ready: &setup::Ready, failed: &mut Vec<&'static str>) {
    let fuzz = t.phase("fuzz (bounded)", || {
        crate::fuzz::run(&crate::fuzz::Options {
            secs: FUZZ_SECS,
            jobs: 2,
            targets: Vec::new(),
            toolchain: ready.ebpf_toolchain.clone(),
        })
    });
    if fuzz.is_err() {
        failed.push("fuzz");
    }
    let soak = t.phase("soak (1 min)", || {
        crate::soak::run(&crate::soak::Options {
            mins: 1.0,
            count: 100,
            release: false,
        })
    });
    if soak.is_err() {
        failed.push("soak");
    }
    let matrix = t.phase("kernel matrix (vm-test)", || {
        let bins = crate::vm::build(ready)?;
        let kernels = crate::vm::parse_kernels(&["all".to_string()])?;
        let rows = crate::vm::matrix(&bins, &kernels, None, crate::vm::DEFAULT_JOBS)?;
        if rows.iter().all(|r| r.passed) {
            Ok(())
        } else {
            bail!("failed")
        }
    });
    if matrix.is_err() {
        failed.push("kernel matrix");
    }
}

/// What the test binaries reported (their `test result:` lines) and which tests skipped.
#[derive(Debug, PartialEq, Eq)]
struct Summary {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// Distinct tests that skipped for a missing prerequisite (they count as passed to libtest).
    skipped: u64,
    skips: Vec<String>,
}

impl Summary {
    fn new(results: &[String], skip_log: &str) -> Summary {
        let count = |line: &str, what: &str| -> u64 {
            line.split(';')
                .find_map(|part| {
                    let part = part.trim().trim_start_matches("test result:").trim();
                    let part = part.rsplit(". ").next().unwrap_or(part);
                    part.strip_suffix(what)?.trim().parse().ok()
                })
                .unwrap_or(0)
        };
        let mut skips: Vec<String> = skip_log.lines().map(str::to_owned).collect();
        skips.sort();
        skips.dedup();
        let tests: std::collections::BTreeSet<&str> = skips
            .iter()
            .filter_map(|l| l.strip_prefix("SKIPPED ")?.split(": ").next())
            .collect();
        Summary {
            passed: results.iter().map(|l| count(l, "passed")).sum(),
            failed: results.iter().map(|l| count(l, "failed")).sum(),
            ignored: results.iter().map(|l| count(l, "ignored")).sum(),
            skipped: tests.len() as u64,
            skips,
        }
    }

    fn print(&self) {
        for s in &self.skips {
            say("test", s);
        }
        let ran = (self.passed + self.failed).saturating_sub(self.skipped);
        say(
            "test",
            format!(
                "{ran} tests ran, {} skipped for a missing prerequisite (of {} passed, {} failed, {} ignored)",
                self.skipped, self.passed, self.failed, self.ignored
            ),
        );
        // The plain closing line CI reads.
        println!(
            "summary: {} passed, {} failed, {} skipped",
            self.passed.saturating_sub(self.skipped),
            self.failed,
            self.skipped
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_results_and_distinct_skipped_tests() {
        let results = [
            "test result: ok. 300 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.00s".to_owned(),
            "test result: FAILED. 120 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out".to_owned(),
        ];
        let log = "SKIPPED e2e::a: no go\nSKIPPED e2e::a: no go\nSKIPPED e2e::b: no tmux\nSKIPPED e2e::a: no root\n";
        let s = Summary::new(&results, log);
        assert_eq!((s.passed, s.failed, s.ignored, s.skipped), (420, 3, 2, 2));
        assert_eq!(s.skips.len(), 3);
        assert_eq!(Summary::new(&[], "").skipped, 0);
    }
}
