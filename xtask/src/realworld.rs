//! Third-party Python programs for the real-world tests and benchmark (issue 17): pinned,
//! pure-Python packages from PyPI, installed once into one directory that every test
//! interpreter imports from (`PYTHONPATH`): pyenv's 3.12 and 3.13 on the host, and Debian's
//! 3.14/3.15 chrooted into the sid root, which is why the directory lives inside that root.
//!
//! | package | why |
//! |---|---|
//! | sympy 1.13.3 + mpmath 1.3.0 | deep pure-Python call stacks, much C → Python (`__hash__`, `__eq__`); the program of the junk-sample report |
//! | docutils 0.21.2 | a parser and writer: many small functions |
//! | Django 5.2.8 + asgiref 3.9.2 + sqlparse 0.5.3 | templates, and a thread-per-request web server (`runserver`) under `ab` |
//!
//! Only `py3-none-any` wheels are accepted (`--only-binary=:all:`, no dependencies resolved:
//! the list is complete), so one install serves every interpreter; the pip of a venv made with
//! the host's `python3` installs them. A marker file holding the pin list makes the step a
//! no-op when the cache is warm.
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::interpreters::Cache;
use crate::sh::{self, say};

/// The packages, pinned.
pub const PACKAGES: &[&str] = &[
    "sympy==1.13.3",
    "mpmath==1.3.0",
    "docutils==0.21.2",
    "Django==5.2.8",
    "asgiref==3.9.2",
    "sqlparse==0.5.3",
];

/// Inside the sid root (so that chrooted interpreters see it at [`SITE_IN_ROOT`]).
pub const SITE_IN_ROOT: &str = "/opt/pyebpf-realworld/site";
/// Written after a complete install: the pin list.
const MARKER: &str = ".pyebpf-realworld";

/// The directory on the host.
pub fn site(cache: &Cache) -> PathBuf {
    cache
        .0
        .join("roots/sid")
        .join(SITE_IN_ROOT.trim_start_matches('/'))
}

/// Installs [`PACKAGES`] into [`site`] unless the marker says they are there.
pub fn ensure(cache: &Cache) -> Result<()> {
    let site = site(cache);
    let marker = site.join(MARKER);
    let want = PACKAGES.join("\n");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == want) {
        say("realworld", format!("{} complete - skip", site.display()));
        return Ok(());
    }
    let venv = cache.0.join("realworld-venv");
    if !venv.join("bin/python").is_file() {
        sh::run(sh::clean("python3").args(["-m", "venv"]).arg(&venv))
            .context("creating the venv whose pip installs the real-world packages")?;
    }
    if site.exists() {
        std::fs::remove_dir_all(&site).with_context(|| format!("clearing {}", site.display()))?;
    }
    std::fs::create_dir_all(&site).with_context(|| format!("creating {}", site.display()))?;
    sh::run(
        sh::clean(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                "--no-deps",
                "--no-compile",
                "--only-binary=:all:",
                "--target",
            ])
            .arg(&site)
            .args(PACKAGES),
    )
    .context("installing the real-world packages from PyPI")?;
    std::fs::write(&marker, want).with_context(|| format!("writing {}", marker.display()))?;
    say("realworld", format!("installed into {}", site.display()));
    Ok(())
}
