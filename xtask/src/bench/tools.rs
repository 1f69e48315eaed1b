//! What the benchmark runs: pyebpf built in release mode from this checkout, py-spy 0.4.3 from
//! PyPI in its own virtual environment, and a recent CPython from the test-interpreter manifest;
//! plus the facts the report starts with (date, machine, kernel, versions).
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::interpreters::Cache;
use crate::sh::{self, say};
use crate::{rust, setup};

pub const PYSPY_VERSION: &str = "0.4.3";
/// Overrides the benchmark interpreter (a CPython that py-spy and pyebpf both support).
pub const PYTHON_ENV: &str = "PYEBPF_BENCH_PYTHON";
/// Uses this pyebpf binary instead of building one (e.g. to compare two builds).
pub const BIN_ENV: &str = "PYEBPF_BENCH_BIN";
/// Manifest entries tried in order: recent, with the GIL, runnable without a chroot.
const PREFERRED: [&str; 2] = ["3.13", "3.12"];

pub struct Tools {
    pub pyebpf: PathBuf,
    /// How `pyebpf` was obtained, for the report.
    pub pyebpf_origin: String,
    pub pyspy: PathBuf,
    pub python: PathBuf,
    pub python_version: String,
    pub workloads: PathBuf,
}

impl Tools {
    pub fn prepare() -> Result<Self> {
        let (python, python_version) = python()?;
        say(
            "bench",
            format!("interpreter: {} ({python_version})", python.display()),
        );
        let pyspy = ensure_pyspy(&python)?;
        let (pyebpf, pyebpf_origin) = match std::env::var_os(BIN_ENV) {
            Some(bin) => {
                let bin = PathBuf::from(bin);
                say(
                    "bench",
                    format!("{BIN_ENV}={}: not building", bin.display()),
                );
                let origin = format!("binary from {BIN_ENV}={}", bin.display());
                (bin, origin)
            }
            None => (build_pyebpf()?, "release build".to_owned()),
        };
        Ok(Self {
            pyebpf,
            pyebpf_origin,
            pyspy,
            python,
            python_version,
            workloads: sh::workspace_root().join("tests/workloads/bench"),
        })
    }

    /// `python -u <workload> ARGS` with a clean environment.
    pub fn workload(&self, script: &str, args: &[String]) -> std::process::Command {
        let mut cmd = sh::clean(&self.python);
        cmd.env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(&self.workloads)
            .arg("-u")
            .arg(self.workloads.join(script))
            .args(args);
        cmd
    }
}

/// `$PYEBPF_BENCH_PYTHON`, else the manifest's 3.13 or 3.12 (`cargo xtask setup --interpreters`).
fn python() -> Result<(PathBuf, String)> {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        let p = PathBuf::from(p);
        let v = sh::capture(
            sh::clean(&p).args(["-c", "import platform; print(platform.python_version())"]),
        )
        .with_context(|| format!("{PYTHON_ENV}={}", p.display()))?;
        return Ok((p, v.trim().to_owned()));
    }
    let manifest = Cache::from_env().manifest();
    let text = std::fs::read_to_string(&manifest).with_context(|| {
        format!(
            "reading {} (run `cargo xtask setup --interpreters`, or set {PYTHON_ENV})",
            manifest.display()
        )
    })?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    for want in PREFERRED {
        if let Some(e) = entries
            .iter()
            .find(|e| e["name"] == want && e["root"].is_null())
            && let (Some(p), Some(v)) = (e["python"].as_str(), e["version"].as_str())
            && Path::new(p).is_file()
        {
            return Ok((PathBuf::from(p), v.to_owned()));
        }
    }
    bail!(
        "no CPython {} in {}: run `cargo xtask setup --interpreters`, or set {PYTHON_ENV}",
        PREFERRED.join(" or "),
        manifest.display()
    )
}

fn pyspy_version(bin: &Path) -> Option<String> {
    sh::probe(sh::clean(bin).arg("--version")).map(|s| s.trim().to_owned())
}

/// py-spy from PyPI in `<cache>/bench-venv` (created with the benchmark interpreter, which
/// has `venv`); a no-op when the right version is there.
fn ensure_pyspy(python: &Path) -> Result<PathBuf> {
    let venv = Cache::from_env().0.join("bench-venv");
    let bin = venv.join("bin/py-spy");
    let want = format!("py-spy {PYSPY_VERSION}");
    if pyspy_version(&bin).as_deref() == Some(want.as_str()) {
        say("bench", format!("{} is {want} - skip", bin.display()));
        return Ok(bin);
    }
    if !venv.join("bin/python").is_file() {
        sh::run(sh::clean(python).args(["-m", "venv"]).arg(&venv))?;
    }
    sh::run(sh::clean(venv.join("bin/python")).args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--quiet",
        &format!("py-spy=={PYSPY_VERSION}"),
    ]))
    .context("installing py-spy from PyPI")?;
    match pyspy_version(&bin) {
        Some(v) if v == want => Ok(bin),
        other => bail!(
            "{} reports {other:?} after the install, not {want}",
            bin.display()
        ),
    }
}

/// The release `pyebpf`, built by the same step as `cargo xtask install`.
fn build_pyebpf() -> Result<PathBuf> {
    let ready = setup::Ready {
        ebpf_toolchain: rust::ensure_ebpf_toolchain()?,
        missing_interpreters: Vec::new(),
        missing_kernels: Vec::new(),
    };
    crate::install::build_release(&ready)
}

/// The facts a result is read against.
pub struct Facts {
    pub date: String,
    pub cpu: String,
    pub cpus: usize,
    pub mem_gib: f64,
    pub kernel: String,
    pub pyebpf: String,
    pub commit: String,
    pub pyspy: String,
}

impl Facts {
    pub fn gather(tools: &Tools) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")?
                    .split_once(':')
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let mem_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0);
        let root = sh::workspace_root();
        let git = |args: &[&str]| {
            sh::probe(
                std::process::Command::new("git")
                    .arg("-C")
                    .arg(&root)
                    .args(args),
            )
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
        };
        let head = git(&["rev-parse", "--short=12", "HEAD"]);
        let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
        Self {
            date: sh::probe(std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            cpu,
            cpus: cpus(),
            mem_gib: mem_kib / (1024.0 * 1024.0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            pyebpf: sh::probe(sh::clean(&tools.pyebpf).arg("--version"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            commit: if dirty {
                format!("{head} + uncommitted changes in the working tree")
            } else {
                head
            },
            pyspy: pyspy_version(&tools.pyspy).unwrap_or_default(),
        }
    }
}

pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// `/proc/loadavg`'s first three fields.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
