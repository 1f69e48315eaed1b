//! dump: the `pyebpf dump` command — every thread's Python stack now, of a live process or of
//! a core file; with `--locals` every frame's arguments and locals; with `--native` the native
//! frames merged exactly with the Python ones. No eBPF needed.
//!
//! Owns: the command's options ([`DumpOptions`]), its errors ([`DumpError`], one line each),
//! the snapshot it renders ([`Snapshot`]) and the order of the work: attach (`python`, over a
//! live process or a [`coredump`](crate::coredump) image), walk, then for `--native` per thread
//! the registers and stack (`ptrace` for a live thread, `NT_PRSTATUS` and the core's memory for
//! a core) and the merge (`native`). Renderings: `output`.
//! Input: [`DumpOptions`] (the CLI wiring in `main.rs` builds them). Output: text or JSON on
//! `out`.
//! Constraints: a live target is never stopped except with `--native` or `--pause`, and then
//! one thread at a time for as long as it takes to read its registers, copy its stack and walk
//! its Python frames (measured and reported); without them, a thread whose frame chain
//! changed while it was read is read again (at most [`live::MAX_REREADS`] times) and, if it
//! still changes, shown as torn with what was read; a core's mapped file missing under `--root` is named in one
//! line after the output (exit 1), the rest of the dump is still printed.

mod corefile;
mod live;
pub mod native;
pub mod output;
pub mod ptrace;

use std::io::Write;
use std::path::PathBuf;

use crate::coredump::CoreError;
use crate::python::errors::ErrorCounts;
use crate::python::values::ValueLimits;
use crate::python::{PyError, PyThread, PyVersion};
use native::Merged;

/// What to dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpTarget {
    /// A live process.
    Pid(u32),
    /// A core file (plain or gzip), its mapped files found under `root`.
    Core { path: PathBuf, root: PathBuf },
}

/// What to dump and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpOptions {
    pub target: DumpTarget,
    pub json: bool,
    /// Arguments and locals of every frame, with these caps (`--locals`).
    pub locals: Option<ValueLimits>,
    /// Native frames merged with the Python frames (`--native`).
    pub native: bool,
    /// Each thread stopped while its Python frames are read (`--pause`; `--native` does it
    /// anyway): a consistent snapshot of each thread.
    pub pause: bool,
}

/// A failed dump; `Display` is one clear line.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Python(#[from] PyError),
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error("{path} is not a core of a Python process")]
    CoreNotPython { path: String },
    #[error(
        "{first}{} missing under {root}: the dump above lacks what only {}",
        if *more > 0 { format!(" (and {more} more mapped files)") } else { String::new() },
        if *more > 0 { "they hold" } else { "it holds" }
    )]
    MissingFiles {
        first: String,
        more: usize,
        root: String,
    },
    #[error(
        "cannot find the Python runtime in {path}: {first}{} missing under {root}",
        if *more > 0 { format!(" (and {more} more mapped files)") } else { String::new() }
    )]
    RuntimeFileMissing {
        path: String,
        first: String,
        more: usize,
        root: String,
    },
    #[error("process {pid} exited during the dump")]
    Exited { pid: u32 },
    #[error("cannot write the dump: {0}")]
    Write(#[from] std::io::Error),
    #[error("cannot encode the dump as JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// How long the threads of a live process were stopped (`--native`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pauses {
    pub threads: usize,
    pub max_us: u64,
    pub total_us: u64,
}

/// The native part of one thread.
#[derive(Debug, Clone)]
pub struct NativeDump {
    pub merged: Merged,
    /// How long the thread was stopped (live processes).
    pub pause_us: Option<u64>,
    /// Why there are no native frames (the thread could not be stopped, no registers, …).
    pub error: Option<String>,
}

/// One thread of a snapshot.
#[derive(Debug, Clone)]
pub struct ThreadDump {
    pub py: PyThread,
    pub native: Option<NativeDump>,
    /// Walks of its frames after the first one: a walk cut short by a frame that changed
    /// under it (a running thread pushes and pops frames while it is read) is done again.
    pub rereads: u32,
    /// Still cut short by a changing chain after every reread: the frames shown are what was
    /// read (never a made-up or empty stack in place of it).
    pub torn: bool,
}

/// What a dump shows.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub pid: u32,
    /// The core file (path, was gzip-compressed), for a core.
    pub core: Option<(String, bool)>,
    pub cmdline: String,
    pub version: PyVersion,
    pub gil_enabled: bool,
    pub with_locals: bool,
    pub threads: Vec<ThreadDump>,
    pub counts: ErrorCounts,
    /// `--native` on a live process: the pauses; on a core: zero.
    pub pauses: Option<Pauses>,
    /// `--pause` (without `--native`): the pauses.
    pub paused: Option<Pauses>,
    /// Threads without a Python frame that ended while the dump read them (left out).
    pub ended: u32,
}

/// Takes one snapshot and writes it to `out`.
pub fn run(opts: &DumpOptions, out: &mut dyn Write) -> Result<(), DumpError> {
    let (snapshot, after) = match &opts.target {
        DumpTarget::Pid(pid) => (live::snapshot(*pid, opts)?, None),
        DumpTarget::Core { path, root } => {
            let (s, missing) = corefile::snapshot(path, root, opts)?;
            (s, missing)
        }
    };
    if opts.json {
        output::write_json(&snapshot, out)?;
    } else {
        output::write_text(&snapshot, out)?;
    }
    out.flush()?;
    match after {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The process's command line, for the text header.
fn live_cmdline(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let s: String = String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim_end()
        .chars()
        .take(200)
        .collect();
    if s.is_empty() {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim_end()
            .to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_python_and_gone_processes_are_one_line_errors() {
        let mut out = Vec::new();
        let opts = |target, json| DumpOptions {
            target,
            json,
            locals: None,
            native: false,
            pause: false,
        };
        let e = run(&opts(DumpTarget::Pid(std::process::id()), true), &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("pid {} is not a Python process", std::process::id())
        );
        let e = run(&opts(DumpTarget::Pid(0x7fff_fff0), false), &mut out).unwrap_err();
        assert_eq!(e.to_string(), format!("process {} is gone", 0x7fff_fff0));
        assert!(out.is_empty());
        let e = DumpError::MissingFiles {
            first: "/usr/lib/libpython3.12.so.1.0".into(),
            more: 2,
            root: "/containers/c1".into(),
        };
        assert_eq!(
            e.to_string(),
            "/usr/lib/libpython3.12.so.1.0 (and 2 more mapped files) missing under \
             /containers/c1: the dump above lacks what only they hold"
        );
    }
}
