//! `cargo xtask`: pyebpf's orchestration (style rule 4: `build.rs` builds, xtask orchestrates).
//!
//! - `setup [--interpreters] [--no-apt]`: prerequisites, idempotently (`setup.rs`).
//! - `install [--prefix DIR]`: release build to `DIR/bin/pyebpf` (`install.rs`).
//! - `run-quickstart [ARGS...]`: setup, install, `pyebpf record --all -d 30 ARGS...`.
//! - `test [FILTER...]`: setup with interpreters, build, all tests as root, then the kernel
//!   matrix (`test.rs`).
//! - `vm-test [--kernel 5.10|6.1|6.12|host|all]`: the kernel matrix in qemu (`vm/`).
//! - `fuzz [--secs N] [--jobs J] [TARGET...]`: coverage-guided fuzzing (`fuzz.rs`).
//! - `soak [--mins N] [--count K] [--release]`: `record --all -r 1000` on a churning host
//!   (`soak.rs`).
//! - `lint`: `cargo fmt --check` and clippy (warnings as errors) on the workspace and the
//!   eBPF crate (`lint.rs`); `test` runs it first.
//! - `gen-printable [PYTHON[@ROOT]...]`: regenerate the printable-character table (`printable.rs`).
//!
//! Heavy provisioning lives in `xtask/scripts/*.sh`; caches live outside the clone
//! (`/var/cache/pyebpf-test`, cargo's registry), so a fresh clone re-uses them.
mod apt;
mod bench;
mod fuzz;
mod install;
mod interpreters;
mod lint;
mod printable;
mod realworld;
mod rust;
mod setup;
mod sh;
mod soak;
mod test;
mod vm;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "pyebpf set-up, install and test orchestration"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install every prerequisite (LLVM 22, eBPF nightly + rust-src, bpf-linker 0.13.0);
    /// skips what is already there.
    Setup {
        /// Also test packages, the six test interpreters and their manifest (needs root).
        #[arg(long)]
        interpreters: bool,
        /// Never run apt-get; report missing packages instead.
        #[arg(long)]
        no_apt: bool,
    },
    /// Build pyebpf in release mode and copy it to PREFIX/bin/pyebpf.
    Install {
        #[arg(long, default_value = "/usr/local")]
        prefix: PathBuf,
    },
    /// Setup, install, then `pyebpf record --all -d 30 [ARGS...]` into the current directory.
    RunQuickstart {
        #[arg(long)]
        no_apt: bool,
        /// Passed on to `pyebpf record` (a `-d` here replaces the default 30 s).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// pyebpf against py-spy: overhead, cost, rate limits, accuracy, start-up and RSS (as
    /// root); prints the results and writes docs/benchmarks.md.
    Bench {
        /// Shorter runs (well under 10 minutes on the 2-core VM).
        #[arg(long)]
        quick: bool,
        /// Interleaved runs per configuration (at least 5).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Only these figures (comma list of 1-9; figure 2 comes with 1): printed, and
        /// docs/benchmarks.md is left alone.
        #[arg(long, value_delimiter = ',')]
        only: Vec<u8>,
    },
    /// Regenerate `sampler-user/src/python/printable_table.rs` (which characters CPython's
    /// `repr()` prints unescaped, per Unicode version) by asking real interpreters.
    GenPrintable {
        /// More interpreters to ask: `PYTHON` or `PYTHON@ROOT` (run chrooted into ROOT).
        #[arg(value_name = "PYTHON[@ROOT]")]
        pythons: Vec<String>,
    },
    /// Setup (incl. interpreters and kernels), build, then the tests in the kernel matrix (qemu)
    /// on Debian's 5.10, 6.1, 6.12 and the host's kernel, as root.
    VmTest {
        /// 5.10, 6.1, 6.12, host or all (repeatable, or comma-separated).
        #[arg(long, default_value = "all")]
        kernel: Vec<String>,
        /// kvm or tcg (default: KVM if a guest really boots on it, else TCG).
        #[arg(long)]
        accel: Option<String>,
        /// Guests booted at once.
        #[arg(long, default_value_t = vm::DEFAULT_JOBS)]
        jobs: usize,
    },
    /// Coverage-guided fuzzing (cargo fuzz): seeds, one build, then every target (or the
    /// ones named) for SECS seconds; prints executions, coverage and crashes per target.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Targets fuzzed at once.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// python_reader, debug_offsets, elf, eh_frame, saved, core (default: all).
        targets: Vec<String>,
    },
    /// `record --all -r 1000` while short-lived Python processes (3.12, 3.13, 3.13t) come and
    /// go, a 3.13t process churns threads and a shell execs in a loop; reports crashes, lost
    /// samples, errors, RSS every 10 s and the share of short-lived processes seen with their
    /// Python frames (as root).
    Soak {
        /// Minutes of churn.
        #[arg(long, default_value_t = 10.0)]
        mins: f64,
        /// Short-lived processes started over the run (default: 100 a minute).
        #[arg(long)]
        count: Option<usize>,
        /// Soak the release build (default: the debug build the tests use).
        #[arg(long)]
        release: bool,
    },
    /// `cargo fmt --check`, clippy with warnings as errors on the workspace and on the eBPF
    /// crate for its target.
    Lint,
    /// Setup (incl. interpreters), build, then unit and end-to-end tests as root, then the
    /// kernel matrix (`vm-test --kernel all`).
    Test {
        #[arg(long)]
        no_apt: bool,
        /// Passed to the test binaries (a name filter, `--nocapture`, ...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// Gives SIGINT and SIGQUIT their default action back if they arrive ignored. A background job
/// of a non-interactive shell (`cmd &` in a script, as a CI runner may start us) starts with
/// both ignored, and every process we start would inherit that: the tests send them to their
/// workloads (SIGQUIT for a kernel core, SIGINT for Ctrl-C) and would wait forever.
fn default_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: sigaction only reads into `old`; signal() sets a default action.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &raw mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
            {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

fn main() {
    default_stop_signals();
    // One line per error (with its causes), not anyhow's backtrace: cargo sets RUST_BACKTRACE
    // for `cargo run`, and CI logs are read by people.
    if let Err(e) = run(Cli::parse()) {
        eprintln!("[xtask] error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Setup {
            interpreters,
            no_apt,
        } => {
            let opts = setup::Options {
                interpreters,
                no_apt,
            };
            if setup::needs_root(&opts) {
                sh::reexec_as_root("`cargo xtask setup --interpreters`")?;
            }
            let ready = setup::run(&opts)?;
            if setup::in_ci() && !ready.missing_interpreters.is_empty() {
                anyhow::bail!("CI=true: test interpreters missing (above)");
            }
            if setup::in_ci() && !ready.missing_kernels.is_empty() {
                anyhow::bail!("CI=true: kernels of the matrix missing (above)");
            }
            Ok(())
        }
        Cmd::Install { prefix } => {
            let ready = setup::Ready {
                ebpf_toolchain: rust::ensure_ebpf_toolchain()?,
                missing_interpreters: Vec::new(),
                missing_kernels: Vec::new(),
            };
            install::install(&ready, &prefix).map(drop)
        }
        Cmd::RunQuickstart { no_apt, args } => install::quickstart(no_apt, &args),
        Cmd::Test { no_apt, args } => test::run(no_apt, &args),
        Cmd::VmTest {
            kernel,
            accel,
            jobs,
        } => {
            let accel = match accel.as_deref() {
                None => None,
                Some("kvm") => Some(vm::Accel::Kvm),
                Some("tcg") => Some(vm::Accel::Tcg),
                Some(other) => anyhow::bail!("--accel {other}: use kvm or tcg"),
            };
            vm::run(&vm::parse_kernels(&kernel)?, accel, jobs)
        }
        Cmd::Bench { quick, runs, only } => bench::run(&bench::Options { quick, runs, only }),
        Cmd::GenPrintable { pythons } => printable::run(&pythons),
        Cmd::Soak {
            mins,
            count,
            release,
        } => soak::run(&soak::Options {
            mins,
            count: count.unwrap_or((mins * 100.0).round() as usize),
            release,
        })
        .map(drop),
        Cmd::Lint => lint::run(&rust::ensure_ebpf_toolchain()?),
        Cmd::Fuzz {
            secs,
            jobs,
            targets,
        } => {
            let toolchain = rust::ensure_ebpf_toolchain()?;
            fuzz::run(&fuzz::Options {
                secs,
                jobs,
                targets,
                toolchain,
            })
            .map(drop)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: Cmd) -> Vec<OsString> {
        match cmd {
            Cmd::RunQuickstart { args, .. } | Cmd::Test { args, .. } => args,
            _ => panic!("not a pass-through command"),
        }
    }

    #[test]
    fn unknown_flags_pass_through() {
        let cli =
            Cli::try_parse_from(["cargo xtask", "run-quickstart", "--threads", "-d", "5"]).unwrap();
        assert_eq!(args(cli.cmd), ["--threads", "-d", "5"]);
        let cli = Cli::try_parse_from([
            "cargo xtask",
            "test",
            "--no-apt",
            "e2e::native",
            "--nocapture",
        ])
        .unwrap();
        assert!(matches!(cli.cmd, Cmd::Test { no_apt: true, .. }));
        let cli = Cli::try_parse_from(["cargo xtask", "test", "--", "--exact", "x"]).unwrap();
        assert_eq!(args(cli.cmd), ["--exact", "x"]);
    }
}
