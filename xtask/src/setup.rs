//! `cargo xtask setup`: every prerequisite, idempotently, each step saying what it does or why
//! it skips. Order: host packages (LLVM 22 first: bpf-linker links it), the eBPF nightly with
//! `rust-src`, bpf-linker, then (with `--interpreters`) the test interpreters and their manifest,
//! and the kernel matrix's Debian kernels (`vm/kernels.rs`).
use anyhow::{Result, bail};

use crate::interpreters::{self, Cache};
use crate::sh::{self, Timings, say};
use crate::{apt, rust};

pub struct Options {
    /// Also the test packages, the six test interpreters and the manifest.
    pub interpreters: bool,
    /// Never run apt-get; only report missing packages.
    pub no_apt: bool,
}

/// What later steps (install, test) need from setup.
pub struct Ready {
    /// The eBPF toolchain chosen by [`rust::ensure_ebpf_toolchain`].
    pub ebpf_toolchain: String,
    /// Test interpreters that could not be provisioned, with the reason. Fatal for
    /// `setup --interpreters` under CI; `test` still runs the tests, then fails.
    pub missing_interpreters: Vec<String>,
    /// Kernels of the matrix that could not be fetched, with the reason (same policy).
    pub missing_kernels: Vec<String>,
}

impl Ready {
    /// Sets `PYEBPF_EBPF_TOOLCHAIN` on a cargo build when the choice is not build.rs's default
    /// (left unset otherwise, so plain `cargo build` and xtask builds share one build cache).
    pub fn apply(&self, cmd: &mut std::process::Command) {
        if self.ebpf_toolchain != "nightly" {
            cmd.env(rust::TOOLCHAIN_ENV, &self.ebpf_toolchain);
        }
    }
}

/// `CI=true`, exactly as `.ci/run` sets it (the tests' own policy, crate `prereq`).
pub fn in_ci() -> bool {
    prereq::in_ci()
}

pub fn run(opts: &Options) -> Result<Ready> {
    let mut t = Timings::default();
    let mut errors = Vec::new();
    let mut missing_interpreters = Vec::new();
    let mut missing_kernels = Vec::new();
    let mut want: Vec<&str> = apt::BASE.to_vec();
    if opts.interpreters {
        want.extend(
            apt::TESTS
                .iter()
                .filter(|p| !want.contains(p))
                .collect::<Vec<_>>(),
        );
    }
    if let Err(e) = t.phase("apt packages", || apt::ensure(&want, !opts.no_apt)) {
        errors.push(format!("apt: {e:#}"));
    }
    let toolchain = t.phase("rustup (eBPF nightly)", rust::ensure_ebpf_toolchain);
    if let Err(e) = &toolchain {
        errors.push(format!("rustup: {e:#}"));
    }
    if let Err(e) = t.phase("bpf-linker", rust::ensure_bpf_linker) {
        errors.push(format!("bpf-linker: {e:#}"));
    }
    if opts.interpreters
        && let Err(e) = t.phase("cargo-fuzz", rust::ensure_cargo_fuzz)
    {
        errors.push(format!("cargo-fuzz: {e:#}"));
    }
    if opts.interpreters {
        let cache = Cache::from_env();
        say(
            "interpreters",
            format!("cache {} (PYEBPF_TEST_CACHE overrides)", cache.0.display()),
        );
        match interpreters::ensure(&cache, opts.no_apt, &mut t) {
            Ok(missing) if missing.is_empty() => say("interpreters", "all present"),
            Ok(missing) => {
                for m in &missing {
                    say("interpreters", format!("MISSING {m}"));
                }
                let how = if in_ci() {
                    "an error under CI=true"
                } else {
                    "a warning (an error under CI=true)"
                };
                say(
                    "interpreters",
                    format!("{} problem(s): {how}", missing.len()),
                );
                missing_interpreters = missing;
            }
            Err(e) => errors.push(format!("interpreters: {e:#}")),
        }
        missing_kernels = t.phase("kernels (vm-test)", || Ok(crate::vm::fetch_kernels(&cache)))?;
        for m in &missing_kernels {
            say("kernels", format!("MISSING {m}"));
        }
    }
    t.print("setup");
    if !errors.is_empty() {
        for e in &errors {
            say("setup", format!("FAILED {e}"));
        }
        bail!("setup failed: {} step(s) (above)", errors.len());
    }
    say("setup", "done");
    Ok(Ready {
        ebpf_toolchain: toolchain?,
        missing_interpreters,
        missing_kernels,
    })
}

/// `setup --interpreters` chroots and writes under /var/cache: it needs root.
pub fn needs_root(opts: &Options) -> bool {
    opts.interpreters && !sh::is_root()
}
