//! The lint gate of `cargo xtask test` (also `cargo xtask lint`): `cargo fmt --check` on the
//! workspace and the fuzz crate, clippy with warnings as errors on the workspace (all targets)
//! and on the eBPF crate for its own target, built the way `sampler-user/build.rs` builds it
//! (aya-build: `bpfel-unknown-none`, `-Z build-std=core`, release, `bpf_target_arch`).
use anyhow::{Result, bail};

use crate::sh::{self, say};

/// Runs every check; the error names the ones that failed (all are run either way).
pub fn run(ebpf_toolchain: &str) -> Result<()> {
    let root = sh::workspace_root();
    let mut failed = Vec::new();
    let mut check = |name: &'static str, cmd: &mut std::process::Command| match sh::status(cmd) {
        Ok(st) if st.success() => say("lint", format!("{name}: clean")),
        Ok(_) => failed.push(name),
        Err(e) => {
            say("lint", format!("{name}: {e:#}"));
            failed.push(name);
        }
    };
    check(
        "cargo fmt --check",
        sh::cargo().args(["fmt", "--all", "--check"]),
    );
    check(
        "cargo fmt --check (fuzz)",
        sh::cargo()
            .current_dir(root.join("fuzz"))
            .args(["fmt", "--check"]),
    );
    check(
        "clippy (workspace)",
        sh::cargo().args([
            "clippy",
            "--workspace",
            "--exclude",
            "sampler-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    );
    // The eBPF crate is no host crate: checked for its target, through rustup's cargo with the
    // eBPF nightly (as aya-build builds it), in a target dir of its own.
    let mut ebpf = sh::clean("cargo");
    ebpf.current_dir(&root)
        .env("PATH", sh::path_with_cargo_bin())
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env("RUSTUP_TOOLCHAIN", ebpf_toolchain)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "--cfg=bpf_target_arch=\"x86_64\"",
        )
        .args([
            "clippy",
            "--package",
            "sampler-ebpf",
            "--bins",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--target-dir",
        ])
        .arg(sh::target_dir()?.join("ebpf-clippy"))
        .args(["--", "-D", "warnings"]);
    check("clippy (eBPF crate, bpfel-unknown-none)", &mut ebpf);
    if !failed.is_empty() {
        bail!("lint failed: {}", failed.join(", "));
    }
    Ok(())
}
