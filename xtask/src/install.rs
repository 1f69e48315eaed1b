//! `cargo xtask install` (release build, copied to `<prefix>/bin/pyebpf`) and
//! `cargo xtask run-quickstart` (setup, install, then a 30 s machine-wide recording).
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::setup::{self, Ready};
use crate::sh::{self, say};

/// `cargo build --release -p sampler-user --bin pyebpf` into the workspace's target directory;
/// returns the binary.
pub fn build_release(ready: &Ready) -> Result<PathBuf> {
    let mut build = sh::cargo();
    build.args([
        "build",
        "--release",
        "-p",
        "sampler-user",
        "--bin",
        "pyebpf",
    ]);
    ready.apply(&mut build);
    sh::run(&mut build)?;
    let artifact = sh::target_dir()?.join("release/pyebpf");
    if !artifact.is_file() {
        bail!("{} missing after the build", artifact.display());
    }
    Ok(artifact)
}

/// Builds `pyebpf` in release mode and installs it as `<prefix>/bin/pyebpf`; returns that path.
pub fn install(ready: &Ready, prefix: &Path) -> Result<PathBuf> {
    let artifact = build_release(ready)?;
    let bindir = prefix.join("bin");
    let dest = bindir.join("pyebpf");
    // Copy next to the destination, then rename: replaces a running pyebpf without ETXTBSY.
    let direct = || -> std::io::Result<()> {
        std::fs::create_dir_all(&bindir)?;
        let tmp = bindir.join(".pyebpf.xtask-tmp");
        std::fs::copy(&artifact, &tmp)?;
        std::fs::rename(&tmp, &dest)
    };
    if let Err(e) = direct() {
        if sh::is_root() {
            return Err(e).with_context(|| format!("installing {}", dest.display()));
        }
        say(
            "install",
            format!("{} not writable ({e}): using sudo", bindir.display()),
        );
        let mut cmd = sh::privileged("install", &[])?;
        sh::run(cmd.args(["-D", "-m", "0755"]).arg(&artifact).arg(&dest))?;
    }
    say(
        "install",
        format!("installed {} (from {})", dest.display(), artifact.display()),
    );
    match sh::which("pyebpf") {
        Some(p) if p == dest => {}
        Some(p) => say(
            "install",
            format!(
                "note: `pyebpf` on PATH is {}, not {}",
                p.display(),
                dest.display()
            ),
        ),
        None => say(
            "install",
            format!("note: {} is not on PATH", bindir.display()),
        ),
    }
    Ok(dest)
}

/// README command 1: setup, install, then `pyebpf record --all -d 30 [ARGS...]` in the current
/// directory (pyebpf's default output name), as root or through sudo.
pub fn quickstart(no_apt: bool, extra: &[OsString]) -> Result<()> {
    let ready = setup::run(&setup::Options {
        interpreters: false,
        no_apt,
    })?;
    let bin = install(&ready, Path::new("/usr/local"))?;
    let has_duration = extra.iter().any(|a| {
        a.to_str().is_some_and(|a| {
            a == "-d"
                || a == "--duration"
                || a.starts_with("--duration=")
                || (a.starts_with("-d") && a.len() > 2)
        })
    });
    let mut cmd = if sh::is_root() {
        sh::clean(&bin)
    } else {
        let Some(sudo) = sh::which("sudo") else {
            bail!("`pyebpf record` needs root and there is no sudo: run as root")
        };
        let mut c = sh::clean(sudo);
        c.arg(&bin);
        c
    };
    cmd.args(["record", "--all"]);
    if !has_duration {
        cmd.args(["-d", "30"]);
    }
    cmd.args(extra);
    let st = sh::status(&mut cmd)?;
    std::process::exit(st.code().unwrap_or(1));
}
