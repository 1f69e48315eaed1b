//! Builds the eBPF programs of `sampler-ebpf` for `bpfel-unknown-none` with aya-build and puts
//! the object in `OUT_DIR/pyebpf-sampler`, where `collect` embeds it with `include_bytes_aligned!`.
//!
//! Needs `bpf-linker` on PATH and a nightly toolchain with `rust-src`; `cargo xtask setup`
//! installs both. The toolchain is `PYEBPF_EBPF_TOOLCHAIN` if set; else the nightly pinned by
//! xtask (`nightly-2026-05-20`, LLVM 22 like bpf-linker 0.13.0) when it is installed — a newer
//! rustup nightly may be on LLVM 23, which bpf-linker cannot read; else `nightly`.
//! Keep `PINNED_NIGHTLY` equal to `xtask/src/rust.rs`.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PYEBPF_EBPF_TOOLCHAIN");
    let toolchain = std::env::var("PYEBPF_EBPF_TOOLCHAIN")
        .ok()
        .or_else(|| pinned_installed().then(|| PINNED_NIGHTLY.to_string()));
    let toolchain = match toolchain.as_deref() {
        Some(t) => aya_build::Toolchain::Custom(t),
        None => aya_build::Toolchain::Nightly,
    };
    println!("cargo:rerun-if-env-changed=PYEBPF_SKIP_EBPF");
    if std::env::var_os("PYEBPF_SKIP_EBPF").is_some_and(|v| v == "1") {
        // For unit-test loops on machines without bpf-linker: an empty object; `collect`
        // refuses to load it with a clear message.
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("pyebpf-sampler");
        std::fs::write(out, [])?;
        println!(
            "cargo:warning=PYEBPF_SKIP_EBPF=1: built without eBPF programs; `record` will refuse to run"
        );
        return Ok(());
    }
    if which_bpf_linker().is_none() {
        return Err(anyhow!(
            "bpf-linker is not on PATH: run `cargo xtask setup` (it installs bpf-linker for LLVM 22)"
        ));
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .join("sampler-ebpf");
    let root = root.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "sampler-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        toolchain,
    )
}

/// The nightly xtask installs when rustup's current nightly is not on LLVM 22.
const PINNED_NIGHTLY: &str = "nightly-2026-05-20";

/// Whether rustup lists the pinned nightly (no download is ever triggered here).
fn pinned_installed() -> bool {
    std::process::Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with(PINNED_NIGHTLY))
        })
}

fn which_bpf_linker() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|p| p.join("bpf-linker"))
        .find(|p| p.is_file())
}
