//! `cargo xtask test`: setup (with interpreters and kernels; a no-op when cached), a debug build
//! of `pyebpf`, the workspace's unit and integration tests, then the privileged end-to-end tests
//! one at a time (they sample the whole machine), then the kernel matrix (`vm-test --kernel
//! all`: Debian's 5.10, 6.1, 6.12 in qemu, and the host's kernel). Runs as root. Output is
//! cargo test's own, so CI can read its "test result:" lines; a phase table follows.
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
    let bin = target.join("debug/pyebpf");
    let env = |cmd: &mut std::process::Command| {
        ready.apply(cmd);
        cmd.env("PYEBPF_BIN", &bin)
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
    let mut failed = Vec::new();
    // sampler-ebpf is built for bpfel-unknown-none by sampler-user/build.rs, not for the host;
    // integration-tests is the e2e tier, run below one test at a time.
    let unit = t.phase("unit + integration tests", || {
        let mut cmd = sh::cargo();
        cmd.args([
            "test",
            "--workspace",
            "--no-fail-fast",
            "--exclude",
            "sampler-ebpf",
            "--exclude",
            "integration-tests",
        ]);
        env(&mut cmd);
        cmd.arg("--").args(args);
        if sh::status(&mut cmd)?.success() {
            Ok(())
        } else {
            bail!("failed")
        }
    });
    if unit.is_err() {
        failed.push("unit + integration tests");
    }
    let e2e = t.phase("e2e tests (root)", || {
        let mut cmd = sh::cargo();
        cmd.args(["test", "-p", "integration-tests", "--no-fail-fast"]);
        env(&mut cmd);
        cmd.args(["--", "--test-threads=1"]).args(args);
        if sh::status(&mut cmd)?.success() {
            Ok(())
        } else {
            bail!("failed")
        }
    });
    if e2e.is_err() {
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

/// The phases that run only without test arguments: every fuzz target for [`FUZZ_SECS`],
/// then the kernel matrix.
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
