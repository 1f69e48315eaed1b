//! The CPython interpreters the end-to-end tests run, and the manifest that tells the tests
//! where they are (`$PYEBPF_TEST_CACHE/interpreters.json`).
//!
//! | name         | from                                                                   |
//! |--------------|------------------------------------------------------------------------|
//! | 3.8 – 3.13   | pyenv 3.8.18, 3.9.18, 3.10.13, 3.11.7, 3.12.1, 3.13.0 (`$PYENV_ROOT`)  |
//! | 3.11-debian  | Debian 12's own `/usr/bin/python3.11` (+ `python3.11-dbg`), apt        |
//! | 3.9-bullseye | Debian 11's python3.9 (+ -dbg) in a debootstrapped bullseye root       |
//! | 3.13t        | Debian's python3.13 source, `--enable-shared --disable-gil`            |
//! | 3.13t-static | Debian's python3.13 source, `--disable-gil`                            |
//! | 3.14, 3.15   | Debian sid's python3.14 / python3.15 (+ -dbg) in a debootstrapped root |
//! | 2.7, 3.7     | pyenv 2.7.18 / 3.7.16: versions pyebpf refuses (the "unsupported" test) |
//!
//! The heavy work is in `xtask/scripts/` (ported from the team's verified recipes); this module
//! decides from their completion markers whether to run them, so a warm cache costs nothing.
//! Version and free-threading in the manifest come from running each interpreter; linkage from
//! its ELF `NEEDED` entries.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use crate::sh::{self, say};

/// Default cache; `PYEBPF_TEST_CACHE` overrides it (the tests read the same variable).
pub const DEFAULT_CACHE: &str = "/var/cache/pyebpf-test";
/// Written by `build-pythons.sh` into a prefix as its last step.
const BUILD_MARKER: &str = ".pyebpf-build-complete";

/// Where interpreters and their build state live.
pub struct Cache(pub PathBuf);

impl Cache {
    pub fn from_env() -> Self {
        Self(
            std::env::var_os("PYEBPF_TEST_CACHE")
                .map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from),
        )
    }
    fn prefix(&self, variant: &str) -> PathBuf {
        self.0.join("pythons").join(variant)
    }
    fn root(&self, suite: &str) -> PathBuf {
        self.0.join("roots").join(suite)
    }
    pub fn manifest(&self) -> PathBuf {
        self.0.join("interpreters.json")
    }
}

enum Source {
    /// pyenv version and executable name.
    Pyenv(&'static str, &'static str),
    /// build-pythons.sh variant (= prefix name) and executable name.
    Built(&'static str, &'static str),
    /// Executable in a debootstrapped root of this Debian suite.
    Root(&'static str, &'static str),
    /// The host's own interpreter (from apt).
    System(&'static str),
}

/// Suites of the debootstrapped roots and the CPython minors each gets.
const ROOTS: [(&str, &str); 2] = [("sid", "3.14 3.15"), ("bullseye", "3.9")];

const WANTED: [(&str, Source); 15] = [
    ("3.8", Source::Pyenv("3.8.18", "python3.8")),
    ("3.9", Source::Pyenv("3.9.18", "python3.9")),
    ("3.10", Source::Pyenv("3.10.13", "python3.10")),
    ("3.11", Source::Pyenv("3.11.7", "python3.11")),
    ("3.11-debian", Source::System("/usr/bin/python3.11")),
    ("3.9-bullseye", Source::Root("bullseye", "python3.9")),
    ("3.12", Source::Pyenv("3.12.1", "python3.12")),
    ("3.13", Source::Pyenv("3.13.0", "python3.13")),
    ("3.13t", Source::Built("3.13t", "python3.13t")),
    ("3.13t-static", Source::Built("3.13t-static", "python3.13t")),
    ("3.14", Source::Root("sid", "python3.14")),
    ("3.15", Source::Root("sid", "python3.15")),
    ("2.7", Source::Pyenv("2.7.18", "python2.7")),
    ("3.6", Source::Pyenv("3.6.15", "python3.6")),
    ("3.7", Source::Pyenv("3.7.16", "python3.7")),
];

/// One manifest entry. `python` is the path as the interpreter sees it; with a `root`, the
/// host path is `root` + `python` and it must be run chrooted (or pivoted) into `root`.
#[derive(Serialize, PartialEq, Debug)]
pub struct Entry {
    name: String,
    python: String,
    root: Option<String>,
    version: String,
    free_threaded: bool,
    linkage: &'static str,
}

fn pyenv_root() -> PathBuf {
    std::env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        PathBuf::from,
    )
}

fn script(name: &str) -> PathBuf {
    sh::workspace_root().join("xtask/scripts").join(name)
}

/// Installs pyenv `version` unless `$PYENV_ROOT/versions/<version>/bin/<exe>` runs.
fn ensure_pyenv(version: &str, exe: &str) -> Result<()> {
    let root = pyenv_root();
    let python = root.join("versions").join(version).join("bin").join(exe);
    if sh::probe(sh::clean(&python).args(["-c", "pass"])).is_some() {
        say("pyenv", format!("{} present - skip", python.display()));
        return Ok(());
    }
    let Some(pyenv) =
        sh::which("pyenv").or_else(|| Some(root.join("bin/pyenv")).filter(|p| p.is_file()))
    else {
        bail!(
            "{} is missing and pyenv is not installed: install pyenv (https://github.com/pyenv/pyenv) and \
             re-run, or `pyenv install {version}` yourself (PYENV_ROOT={})",
            python.display(),
            root.display()
        );
    };
    // The machine's pyenv builds are --enable-shared (libpython3.X.so); build the same way.
    let opts = std::env::var("PYTHON_CONFIGURE_OPTS").unwrap_or_else(|_| "--enable-shared".into());
    say(
        "pyenv",
        format!("building {version} with pyenv (several minutes; needs python.org reachable)"),
    );
    sh::run(
        sh::clean(pyenv)
            .env("PYENV_ROOT", &root)
            .env("PYTHON_CONFIGURE_OPTS", opts)
            .args(["install", "--skip-existing", version]),
    )
    .context("pyenv downloads CPython from www.python.org: is it reachable?")?;
    if sh::probe(sh::clean(&python).args(["-c", "pass"])).is_none() {
        bail!(
            "`pyenv install {version}` finished but {} does not run",
            python.display()
        );
    }
    Ok(())
}

/// Runs build-pythons.sh for the variants whose prefix lacks the completion marker.
fn ensure_built(cache: &Cache) -> Result<()> {
    let missing: Vec<&str> = WANTED
        .iter()
        .filter_map(|(_, s)| match s {
            Source::Built(v, exe) => Some((*v, *exe)),
            _ => None,
        })
        .filter(|(v, exe)| {
            let p = cache.prefix(v);
            let done = p.join(BUILD_MARKER).is_file() && p.join("bin").join(exe).is_file();
            if done {
                say(
                    "pythons",
                    format!("{v}: {} present - skip", p.join(BUILD_MARKER).display()),
                );
            }
            !done
        })
        .map(|(v, _)| v)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    say(
        "pythons",
        format!(
            "building {} from Debian's python3.13 source (~5 min each on 2 cores)",
            missing.join(" ")
        ),
    );
    sh::run(
        sh::clean("bash")
            .arg(script("build-pythons.sh"))
            .env("PYEBPF_TEST_CACHE", &cache.0)
            .env("VARIANTS", missing.join(" "))
            // `apt::TESTS` already holds CPython's build deps (or --no-apt was asked for).
            .env("SKIP_APT_INSTALL", "1"),
    )
}

/// Runs provision-sid-root.sh for `suite` unless its summary file exists and its
/// interpreters are there (sid: 3.14 and 3.15; bullseye: 3.9).
fn ensure_root(cache: &Cache, suite: &str, versions: &str, no_apt: bool) -> Result<()> {
    let root = cache.root(suite);
    let state = PathBuf::from(format!("{}.provisioned", root.display()));
    let exes: Vec<PathBuf> = WANTED
        .iter()
        .filter_map(|(_, s)| match s {
            Source::Root(r, e) if *r == suite => Some(root.join("usr/bin").join(e)),
            _ => None,
        })
        .collect();
    let what = format!("{suite} root");
    if state.is_file() && exes.iter().all(|e| e.is_file()) {
        say(
            &what,
            format!(
                "{} present - skip (delete it to re-provision and re-verify)",
                state.display()
            ),
        );
        return Ok(());
    }
    say(
        &what,
        format!(
            "provisioning {} with debootstrap (~1-2 min, ~300-800 MB)",
            root.display()
        ),
    );
    let mut cmd = sh::clean("bash");
    cmd.arg(script("provision-sid-root.sh"))
        .env("PYEBPF_TEST_CACHE", &cache.0)
        .env("ROOT", &root)
        .env("SUITE", suite)
        .env("VERSIONS", versions);
    if suite != "sid" {
        // The verification reads `_Py_DebugOffsets` (3.13+); older roots are checked by the
        // tests (they attach to their interpreter).
        cmd.env("VERIFY", "0");
    }
    if no_apt {
        cmd.env("NO_HOST_APT", "1");
    }
    sh::run(&mut cmd)
}

#[derive(serde::Deserialize)]
struct Probe {
    version: String,
    free_threaded: bool,
}

const PROBE: &str = "import json, platform, sysconfig; print(json.dumps({'version': platform.python_version(), \
                     'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED'))}))";

/// Runs the interpreter (chrooted when it has a root) and reads its ELF linkage.
fn describe(name: &str, python: &Path, root: Option<&Path>) -> Result<Entry> {
    let host_path = root.map_or_else(
        || python.to_path_buf(),
        |r| r.join(python.strip_prefix("/").unwrap_or(python)),
    );
    if !host_path.is_file() {
        bail!("{}: not found", host_path.display());
    }
    let mut cmd = if let Some(r) = root {
        let mut c = sh::clean("chroot");
        c.arg(r).arg(python);
        c
    } else {
        sh::clean(python)
    };
    let out = sh::capture(
        cmd.env_remove("PYTHONHOME")
            .env_remove("PYTHONPATH")
            .args(["-c", PROBE]),
    )?;
    let probe: Probe = serde_json::from_str(out.trim())
        .with_context(|| format!("{name}: probe printed {out:?}"))?;
    let dynamic = sh::capture(sh::clean("readelf").args(["-d", "-W"]).arg(&host_path))?;
    let shared = dynamic
        .lines()
        .any(|l| l.contains("(NEEDED)") && l.contains("libpython"));
    Ok(Entry {
        name: name.to_owned(),
        python: python.display().to_string(),
        root: root.map(|r| r.display().to_string()),
        version: probe.version,
        free_threaded: probe.free_threaded,
        linkage: if shared { "shared" } else { "static" },
    })
}

/// Describes every wanted interpreter that exists and writes the manifest (atomically).
/// Returns the names that are missing or broken, with the reason.
fn write_manifest(cache: &Cache) -> Result<Vec<String>> {
    let mut entries = Vec::new();
    let mut problems = Vec::new();
    for (name, src) in &WANTED {
        let (python, root) = match src {
            Source::Pyenv(v, exe) => (
                pyenv_root().join("versions").join(v).join("bin").join(exe),
                None,
            ),
            Source::Built(v, exe) => (cache.prefix(v).join("bin").join(exe), None),
            Source::Root(suite, exe) => (Path::new("/usr/bin").join(exe), Some(cache.root(suite))),
            Source::System(path) => (PathBuf::from(path), None),
        };
        match describe(name, &python, root.as_deref()) {
            Ok(e) => entries.push(e),
            Err(e) => problems.push(format!("{name}: {e:#}")),
        }
    }
    for e in &entries {
        say(
            "manifest",
            format!(
                "{:<13} {:<8} {:<7} {:<6} {}{}",
                e.name,
                e.version,
                if e.free_threaded { "ft" } else { "gil" },
                e.linkage,
                e.root
                    .as_deref()
                    .map(|r| format!("{r} : "))
                    .unwrap_or_default(),
                e.python
            ),
        );
    }
    let json = serde_json::to_string_pretty(&entries)? + "\n";
    let path = cache.manifest();
    if std::fs::read_to_string(&path).is_ok_and(|old| old == json) {
        say("manifest", format!("{} unchanged - skip", path.display()));
    } else {
        std::fs::create_dir_all(&cache.0)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, &json).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)?;
        say(
            "manifest",
            format!("wrote {} ({} interpreters)", path.display(), entries.len()),
        );
    }
    Ok(problems)
}

/// Provisions every test interpreter and writes the manifest. Each part is attempted even if
/// an earlier one failed; the returned list names what is missing (empty: all present).
pub fn ensure(cache: &Cache, no_apt: bool, timings: &mut sh::Timings) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for (_, src) in &WANTED {
        if let Source::Pyenv(v, exe) = src
            && let Err(e) = timings.phase(&format!("pyenv {v}"), || ensure_pyenv(v, exe))
        {
            problems.push(format!("pyenv {v}: {e:#}"));
        }
    }
    if let Err(e) = timings.phase("3.13t builds", || ensure_built(cache)) {
        problems.push(format!("3.13t builds: {e:#}"));
    }
    for (suite, versions) in ROOTS {
        if let Err(e) = timings.phase(&format!("{suite} root ({versions})"), || {
            ensure_root(cache, suite, versions, no_apt)
        }) {
            problems.push(format!("{suite} root: {e:#}"));
        }
    }
    if let Err(e) = timings.phase("real-world packages", || crate::realworld::ensure(cache)) {
        problems.push(format!("real-world packages: {e:#}"));
    }
    let missing = timings.phase("manifest", || write_manifest(cache))?;
    problems.extend(missing);
    Ok(problems)
}
