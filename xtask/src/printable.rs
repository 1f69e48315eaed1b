//! `cargo xtask gen-printable`: CPython's `Py_UNICODE_ISPRINTABLE`, as data for `dump --locals`.
//!
//! `repr()` of a `str` escapes every character that is not printable; which characters are
//! printable depends on the Unicode database the interpreter was built with (one per CPython
//! minor version). This command runs `xtask/scripts/printable.py` under every interpreter given
//! (default: the test interpreters of the manifest and pyenv's 3.8–3.11 where present), which
//! prints the code points its own `repr()` leaves unescaped, checks that interpreters with the
//! same Unicode version agree, and writes `sampler-user/src/python/printable_table.rs`: the
//! printable ranges of the newest Unicode version, and per older version the ranges that differ.
//! The table is checked against the live interpreters by `python::repr` tests.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::interpreters::Cache;
use crate::sh::{self, say};

const OUT: &str = "sampler-user/src/python/printable_table.rs";
const CODE_POINTS: usize = 0x11_0000;

/// One interpreter to ask: its executable as it sees itself, and the root to chroot into.
struct Python {
    exe: String,
    root: Option<PathBuf>,
}

fn manifest_pythons(cache: &Cache) -> Vec<Python> {
    let Ok(text) = std::fs::read_to_string(cache.manifest()) else {
        return Vec::new();
    };
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str(&text) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            Some(Python {
                exe: e["python"].as_str()?.to_owned(),
                root: e["root"].as_str().map(PathBuf::from),
            })
        })
        .collect()
}

fn pyenv_pythons() -> Vec<Python> {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".pyenv"),
        PathBuf::from,
    );
    let Ok(dir) = std::fs::read_dir(root.join("versions")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let minor: Vec<&str> = name.split('.').take(2).collect();
            let wanted = minor.len() == 2
                && minor[0] == "3"
                && (8..=11).contains(&minor[1].parse::<u32>().ok()?);
            let exe = e.path().join("bin/python3");
            (wanted && exe.exists()).then(|| Python {
                exe: exe.display().to_string(),
                root: None,
            })
        })
        .collect()
}

struct Answer {
    version: String,
    unicode: String,
    printable: Vec<bool>,
}

fn ask(p: &Python, script: &Path) -> Result<Answer> {
    // The source goes on the command line: nothing is written inside a chroot.
    let source =
        std::fs::read_to_string(script).with_context(|| format!("read {}", script.display()))?;
    let mut cmd = match &p.root {
        Some(root) => {
            let mut c = Command::new("chroot");
            c.arg(root).arg(&p.exe);
            c
        }
        None => Command::new(&p.exe),
    };
    cmd.arg("-c").arg(source);
    let out = sh::capture(&mut cmd)?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context("printable.py output")?;
    let mut printable = vec![false; CODE_POINTS];
    for r in v["ranges"].as_array().context("ranges")? {
        let lo = r[0].as_u64().context("range start")? as usize;
        let hi = r[1].as_u64().context("range end")? as usize;
        if lo > hi || hi >= CODE_POINTS {
            bail!("bad range {r}");
        }
        printable[lo..=hi].fill(true);
    }
    Ok(Answer {
        version: v["version"].as_str().context("version")?.to_owned(),
        unicode: v["unicode"].as_str().context("unicode")?.to_owned(),
        printable,
    })
}

/// Inclusive ranges where `f` holds.
fn ranges(f: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for c in 0..CODE_POINTS {
        match (f(c), start) {
            (true, None) => start = Some(c),
            (false, Some(s)) => {
                out.push((s, c - 1));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, CODE_POINTS - 1));
    }
    out
}

fn write_ranges(out: &mut String, r: &[(usize, usize)]) {
    for chunk in r.chunks(6) {
        out.push_str("    ");
        for (lo, hi) in chunk {
            let _ = write!(out, "(0x{lo:x}, 0x{hi:x}), ");
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
}

/// Unicode versions sort numerically ("9.0.0" < "15.1.0").
fn unicode_key(v: &str) -> Vec<u32> {
    v.split('.').filter_map(|p| p.parse().ok()).collect()
}

pub fn run(extra: &[String]) -> Result<()> {
    let mut pythons = manifest_pythons(&Cache::from_env());
    pythons.extend(pyenv_pythons());
    pythons.extend(extra.iter().map(|e| match e.split_once('@') {
        Some((exe, root)) => Python {
            exe: exe.to_owned(),
            root: Some(PathBuf::from(root)),
        },
        None => Python {
            exe: e.clone(),
            root: None,
        },
    }));
    if pythons.is_empty() {
        bail!("no interpreters: run `cargo xtask setup --interpreters` or pass PYTHON[@ROOT]");
    }
    let script = sh::workspace_root().join("xtask/scripts/printable.py");
    let mut by_unicode: BTreeMap<Vec<u32>, (String, Vec<String>, Vec<bool>)> = BTreeMap::new();
    for p in &pythons {
        let a = ask(p, &script).with_context(|| format!("running {}", p.exe))?;
        say(
            "gen-printable",
            format!("{} ({}): Unicode {}", p.exe, a.version, a.unicode),
        );
        let entry = by_unicode
            .entry(unicode_key(&a.unicode))
            .or_insert_with(|| (a.unicode.clone(), Vec::new(), a.printable.clone()));
        if entry.2 != a.printable {
            bail!(
                "{} disagrees with {:?} on Unicode {}",
                a.version,
                entry.1,
                a.unicode
            );
        }
        entry.1.push(a.version);
    }
    let Some((_, (latest, latest_by, base))) = by_unicode.iter().next_back() else {
        bail!("no answers");
    };
    let mut out = String::new();
    out.push_str(
        "//! Generated by `cargo xtask gen-printable`, do not edit.\n//!\n\
         //! Which code points CPython's `repr()` of a `str` leaves unescaped\n\
         //! (`Py_UNICODE_ISPRINTABLE`, plus the backslash), per Unicode database version, as\n\
         //! the interpreters themselves answered (`xtask/scripts/printable.py`).\n",
    );
    let _ = writeln!(
        out,
        "\n/// The newest Unicode version below ({}).",
        latest_by.join(", ")
    );
    let _ = writeln!(out, "pub(crate) const LATEST: &str = \"{latest}\";");
    let _ = writeln!(
        out,
        "\n/// Printable code points of Unicode {latest}, as inclusive ranges.\n#[rustfmt::skip]\n\
         pub(crate) static PRINTABLE: &[(u32, u32)] = &["
    );
    write_ranges(&mut out, &ranges(|c| base[c]));
    out.push_str("];\n");
    out.push_str(
        "\n/// Older Unicode versions: the inclusive ranges whose printability differs from\n\
         /// [`LATEST`] (mostly characters assigned since), with the CPython versions asked.\n\
         #[rustfmt::skip]\npub(crate) static DIFFERENCES: &[(&str, &[(u32, u32)])] = &[\n",
    );
    for (unicode, by, table) in by_unicode.values().rev().skip(1) {
        let _ = writeln!(out, "    // {}", by.join(", "));
        let _ = writeln!(out, "    (\"{unicode}\", &[");
        let mut inner = String::new();
        write_ranges(&mut inner, &ranges(|c| table[c] != base[c]));
        for line in inner.lines() {
            let _ = writeln!(out, "    {line}");
        }
        out.push_str("    ]),\n");
    }
    out.push_str("];\n");
    let path = sh::workspace_root().join(OUT);
    std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
    say("gen-printable", format!("wrote {}", path.display()));
    Ok(())
}
