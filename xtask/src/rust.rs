//! The eBPF half of the toolchain (see the team's toolchain notes): a nightly with `rust-src`
//! (`-Z build-std=core` for `bpfel-unknown-none`) and `bpf-linker` 0.13.0 built against the
//! system's LLVM 22. bpf-linker reads the bitcode rustc emits, so the nightly's LLVM major must
//! be 22 as well; this is checked, not assumed.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::apt::LLVM_DEV;
use crate::sh::{self, say};

/// LLVM major shared by the eBPF nightly and bpf-linker.
pub const LLVM_MAJOR: u32 = 22;
/// Where Debian's `llvm-22-dev` lives (bpf-linker's `LLVM_PREFIX`).
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const BPF_LINKER_VERSION: &str = "0.13.0";
/// A nightly verified with aya 0.14 and LLVM 22 (rustc 1.97.0-nightly e50aa6fba 2026-05-19,
/// LLVM 22.1.4). Used when "nightly" is missing or has moved to another LLVM major: rustup's
/// current nightly is newer, and its LLVM may no longer match bpf-linker's.
pub const PINNED_NIGHTLY: &str = "nightly-2026-05-20";
/// `sampler-user/build.rs` builds the eBPF crate with this toolchain (default "nightly").
pub const TOOLCHAIN_ENV: &str = "PYEBPF_EBPF_TOOLCHAIN";

fn rustup() -> Result<PathBuf> {
    sh::which("rustup").or_else(|| Some(sh::cargo_home().join("bin/rustup")).filter(|p| p.is_file())).context(
        "rustup not found: install it (https://rustup.rs; .ci/run does this on a fresh machine) and re-run",
    )
}

fn installed_toolchains(rustup: &Path) -> Result<Vec<String>> {
    let out = sh::capture(std::process::Command::new(rustup).args(["toolchain", "list"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// `toolchain` ("nightly", "nightly-2026-05-20") is in `rustup toolchain list`, whose entries
/// carry the host triple ("nightly-x86_64-unknown-linux-gnu"); a dated entry is not "nightly".
fn is_installed(list: &[String], toolchain: &str) -> bool {
    list.iter().any(|t| {
        t == toolchain
            || t.strip_prefix(toolchain)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|triple| !triple.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// `(short version, LLVM major)` of `rustc` in `toolchain`.
fn rustc_info(rustup: &Path, toolchain: &str) -> Result<(String, u32)> {
    let out =
        sh::capture(std::process::Command::new(rustup).args(["run", toolchain, "rustc", "-vV"]))?;
    let release = out.lines().next().unwrap_or_default().to_owned();
    let llvm = out
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next()?.trim().parse().ok())
        .with_context(|| format!("no LLVM version in `rustc +{toolchain} -vV`"))?;
    Ok((release, llvm))
}

/// Makes sure the eBPF toolchain exists with `rust-src` and LLVM 22; returns its name.
/// Choice: `$PYEBPF_EBPF_TOOLCHAIN` if set; else "nightly" if installed with LLVM 22; else
/// [`PINNED_NIGHTLY`] (installed if needed). xtask passes the choice to its own builds.
pub fn ensure_ebpf_toolchain() -> Result<String> {
    let rustup = rustup()?;
    let list = installed_toolchains(&rustup)?;
    let explicit = std::env::var(TOOLCHAIN_ENV).ok().filter(|s| !s.is_empty());
    let toolchain = if let Some(t) = explicit {
        say(
            "rustup",
            format!("eBPF toolchain from ${TOOLCHAIN_ENV}: {t}"),
        );
        t
    } else if is_installed(&list, "nightly") {
        let (release, llvm) = rustc_info(&rustup, "nightly")?;
        if llvm == LLVM_MAJOR {
            say(
                "rustup",
                format!("nightly present ({release}, LLVM {llvm}) - skip"),
            );
            "nightly".to_owned()
        } else {
            say(
                "rustup",
                format!(
                    "nightly is {release} with LLVM {llvm}, bpf-linker needs LLVM {LLVM_MAJOR}: using {PINNED_NIGHTLY}"
                ),
            );
            PINNED_NIGHTLY.to_owned()
        }
    } else {
        say(
            "rustup",
            format!("no nightly installed: using the verified {PINNED_NIGHTLY}"),
        );
        PINNED_NIGHTLY.to_owned()
    };
    if is_installed(&list, &toolchain) {
        if toolchain != "nightly" {
            say("rustup", format!("{toolchain} present - skip"));
        }
    } else {
        // --no-self-update: installing a toolchain must not replace the machine's rustup
        // (its update server may even offer an older one than installed).
        sh::run(std::process::Command::new(&rustup).args([
            "toolchain",
            "install",
            &toolchain,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--no-self-update",
        ]))?;
    }
    let comps = sh::capture(std::process::Command::new(&rustup).args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &toolchain,
    ]))?;
    if comps.lines().any(|l| l.trim() == "rust-src") {
        say("rustup", format!("rust-src for {toolchain} present - skip"));
    } else {
        sh::run(std::process::Command::new(&rustup).args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            &toolchain,
        ]))?;
    }
    let (release, llvm) = rustc_info(&rustup, &toolchain)?;
    if llvm != LLVM_MAJOR {
        bail!(
            "eBPF toolchain {toolchain} ({release}) uses LLVM {llvm}, but bpf-linker is built for LLVM \
             {LLVM_MAJOR}: unset ${TOOLCHAIN_ENV} or point it at a nightly with LLVM {LLVM_MAJOR} (e.g. {PINNED_NIGHTLY})"
        );
    }
    if toolchain != "nightly" && std::env::var(TOOLCHAIN_ENV).is_err() {
        say(
            "rustup",
            format!(
                "note: xtask builds pass {TOOLCHAIN_ENV}={toolchain}; for plain `cargo build` export it too"
            ),
        );
    }
    Ok(toolchain)
}

/// The first `bpf-linker` on PATH, else in `$CARGO_HOME/bin`, with its `--version` output.
fn find_bpf_linker() -> Option<(PathBuf, Option<String>)> {
    let path = sh::which("bpf-linker")
        .or_else(|| Some(sh::cargo_home().join("bin/bpf-linker")).filter(|p| p.is_file()))?;
    let version = sh::probe(sh::clean(&path).arg("--version")).map(|s| s.trim().to_owned());
    Some((path, version))
}

/// The libLLVM a dynamically linked bpf-linker loads, from `ldd` (None: static or unknown).
fn linked_llvm(bin: &Path) -> Option<(u32, String)> {
    parse_ldd_llvm(&sh::probe(sh::clean("ldd").arg(bin))?)
}

fn parse_ldd_llvm(ldd: &str) -> Option<(u32, String)> {
    let line = ldd.lines().find(|l| l.contains("libLLVM"))?;
    // "libLLVM.so.22.1 => /usr/lib/llvm-22/lib/libLLVM.so.22.1 (0x...)": drop the load address.
    let line = line.split(" (0x").next().unwrap_or(line).trim().to_owned();
    let after = &line[line.find("libLLVM")? + "libLLVM".len()..];
    let major = after
        .trim_start_matches(['.', '-', 's', 'o'])
        .split(['.', '-', ' '])
        .next()?
        .parse()
        .ok()?;
    Some((major, line))
}

/// Installs bpf-linker 0.13.0 for LLVM 22 unless `bpf-linker --version` already reports it
/// (and, when dynamically linked, it loads an LLVM 22).
pub fn ensure_bpf_linker() -> Result<()> {
    let found = find_bpf_linker();
    let mut force = false;
    if let Some((path, version)) = &found {
        match version {
            Some(v) if v.split_whitespace().any(|w| w == BPF_LINKER_VERSION) => {
                match linked_llvm(path) {
                    Some((major, line)) if major != LLVM_MAJOR => {
                        say(
                            "bpf-linker",
                            format!(
                                "{} loads LLVM {major} ({line}): reinstalling",
                                path.display()
                            ),
                        );
                        force = true;
                    }
                    llvm => {
                        let how =
                            llvm.map_or_else(|| "no dynamic libLLVM".to_owned(), |(_, line)| line);
                        say(
                            "bpf-linker",
                            format!("{v} at {} ({how}) - skip", path.display()),
                        );
                        if sh::which("bpf-linker").is_none() {
                            say(
                                "bpf-linker",
                                "note: $CARGO_HOME/bin is not on PATH; xtask adds it for its builds",
                            );
                        }
                        return Ok(());
                    }
                }
            }
            Some(v) => {
                say(
                    "bpf-linker",
                    format!(
                        "{} reports `{v}`, want {BPF_LINKER_VERSION}: reinstalling",
                        path.display()
                    ),
                );
                force = true;
            }
            None => {
                say(
                    "bpf-linker",
                    format!(
                        "{} does not run (`--version` failed): reinstalling",
                        path.display()
                    ),
                );
                force = true;
            }
        }
    }
    if !Path::new(LLVM_PREFIX).join("bin/llvm-config").is_file() {
        bail!(
            "bpf-linker needs LLVM {LLVM_MAJOR} in {LLVM_PREFIX} ({LLVM_DEV}), which is not installed: \
             run `cargo xtask setup` without --no-apt, or `apt-get install {LLVM_DEV}`"
        );
    }
    let mut cmd = sh::cargo();
    cmd.env("LLVM_PREFIX", LLVM_PREFIX)
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--locked",
        ])
        .args(["--no-default-features", "--features", "llvm-22"]);
    if force {
        cmd.arg("--force");
    }
    say(
        "bpf-linker",
        "building bpf-linker (a few minutes on 2 cores)",
    );
    sh::run(&mut cmd)?;
    match find_bpf_linker() {
        Some((path, Some(v))) if v.contains(BPF_LINKER_VERSION) => {
            say("bpf-linker", format!("installed {v} at {}", path.display()));
            Ok(())
        }
        other => bail!(
            "after `cargo install`, the first bpf-linker found is {:?}: put {} first on PATH",
            other,
            sh::cargo_home().join("bin").display()
        ),
    }
}

/// The cargo-fuzz that `cargo xtask fuzz` drives (built with the stable toolchain; it runs
/// the nightly for the targets itself).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Installs cargo-fuzz unless `cargo fuzz --version` already reports [`CARGO_FUZZ_VERSION`].
pub fn ensure_cargo_fuzz() -> Result<()> {
    let bin = sh::which("cargo-fuzz")
        .or_else(|| Some(sh::cargo_home().join("bin/cargo-fuzz")).filter(|p| p.is_file()));
    let version = bin
        .as_ref()
        .and_then(|b| sh::probe(sh::clean(b).arg("--version")))
        .map(|v| v.trim().to_owned());
    if let Some(v) = version.as_deref()
        && v.split_whitespace().any(|w| w == CARGO_FUZZ_VERSION)
    {
        say("cargo-fuzz", format!("{v} present - skip"));
        return Ok(());
    }
    say(
        "cargo-fuzz",
        format!("installing cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)"),
    );
    sh::run(sh::cargo().args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
        "--force",
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchain_names_match_rustup_list() {
        let list = [
            "stable-x86_64-unknown-linux-gnu",
            "nightly-2026-05-20-x86_64-unknown-linux-gnu",
        ]
        .map(str::to_owned);
        assert!(is_installed(&list, "stable"));
        assert!(is_installed(&list, "nightly-2026-05-20"));
        assert!(
            !is_installed(&list, "nightly"),
            "a dated nightly is not `nightly`"
        );
        assert!(is_installed(
            &["nightly-x86_64-unknown-linux-gnu".to_owned()],
            "nightly"
        ));
    }

    #[test]
    fn llvm_major_from_ldd() {
        let debian =
            "\tlibLLVM.so.22.1 => /usr/lib/llvm-22/lib/libLLVM.so.22.1 (0x00007f6991c00000)\n";
        assert_eq!(parse_ldd_llvm(debian).map(|x| x.0), Some(22));
        let rust = "\tlibLLVM.so.22.1-rust-1.97.0-nightly => /x/libLLVM.so.22.1-rust-1.97.0-nightly (0x1)\n";
        assert_eq!(parse_ldd_llvm(rust).map(|x| x.0), Some(22));
        assert_eq!(
            parse_ldd_llvm("\tlibLLVM-21.so => /usr/lib/libLLVM-21.so (0x1)").map(|x| x.0),
            Some(21)
        );
        assert_eq!(parse_ldd_llvm("\tlibc.so.6 => /lib/libc.so.6 (0x1)"), None);
    }
}
