//! `pyebpf dump -p PID [--json]`: every thread's Python stack, now. No eBPF needed.
//!
//! Owns: the `dump` command logic ([`run`]), its text (py-spy `dump` style) and JSON renderings.
//! Input: [`DumpOptions`] (the CLI wiring in `main.rs` builds them). Output: text or JSON on
//! `out`; errors as [`DumpError`], whose `Display` is one line.
//! Constraints: the JSON shape is a contract (end-to-end tests parse it):
//! `{"pid", "python": {"version", "free_threaded", "gil_enabled"}, "threads": [{"tid",
//! "native_thread_id", "python_thread_id", "name", "gil", "truncated", "frames": [{"function",
//! "file", "line", "first_line"}]}]}`; `tid` is the host TID (null if unknown). With
//! `--locals` every frame also has `"locals": [{"name", "arg", "value"}]` (value: `repr()`,
//! `<unbound>` or `<unreadable>`); the text output lists them under each frame.

use std::io::Write;

use serde::Serialize;

use crate::printable::printable;

use super::locals::Local;
use super::values::ValueLimits;
use super::walker::Limits;
use super::{GilState, PyError, PyThread, PythonProcess};

/// What to dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpOptions {
    pub pid: u32,
    pub json: bool,
    /// Arguments and locals of every frame, with these caps (`--locals`).
    pub locals: Option<ValueLimits>,
}

/// A failed dump; `Display` is one clear line.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Python(#[from] PyError),
    #[error("cannot write the dump: {0}")]
    Write(#[from] std::io::Error),
    #[error("cannot encode the dump as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// `--locals` on a CPython without `co_localsplusnames` (before 3.11).
    #[error("dump --locals needs CPython 3.11 or newer (pid {pid} runs {version})")]
    LocalsUnsupported { pid: u32, version: String },
}

#[derive(Serialize)]
struct JsonDump<'a> {
    pid: u32,
    python: JsonPython,
    threads: Vec<JsonThread<'a>>,
}

#[derive(Serialize)]
struct JsonPython {
    version: String,
    free_threaded: bool,
    gil_enabled: bool,
}

#[derive(Serialize)]
struct JsonThread<'a> {
    tid: Option<u32>,
    native_thread_id: u64,
    python_thread_id: u64,
    name: Option<&'a str>,
    gil: &'static str,
    truncated: bool,
    frames: Vec<JsonFrame<'a>>,
}

#[derive(Serialize)]
struct JsonFrame<'a> {
    function: &'a str,
    file: &'a str,
    line: i32,
    first_line: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    locals: Option<Vec<JsonLocal<'a>>>,
}

#[derive(Serialize)]
struct JsonLocal<'a> {
    name: &'a str,
    arg: bool,
    value: &'a str,
}

fn gil_json(g: GilState) -> &'static str {
    match g {
        GilState::Holds => "holds",
        GilState::DoesNotHold => "does_not_hold",
        GilState::NoGil => "no_gil",
        GilState::Unknown => "unknown",
    }
}

/// The bracketed state of a thread header: `holds GIL`, `waiting`, `no GIL` or `active`
/// (free-threaded, GIL disabled, attached to the interpreter = running Python).
fn gil_text(t: &PyThread) -> &'static str {
    match (t.gil, t.attached) {
        (GilState::Holds, _) => "holds GIL",
        (GilState::DoesNotHold, _) => "waiting",
        (GilState::NoGil, Some(true)) => "active",
        (GilState::NoGil, _) => "no GIL",
        (GilState::Unknown, _) => "unknown",
    }
}

fn cmdline(pid: u32) -> String {
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

/// Attaches to `opts.pid`, takes one snapshot and writes it to `out`.
pub fn run(opts: &DumpOptions, out: &mut dyn Write) -> Result<(), DumpError> {
    let mut proc = PythonProcess::attach(opts.pid)?;
    if opts.locals.is_some() && proc.layout().code.localsplusnames.is_none() {
        return Err(DumpError::LocalsUnsupported {
            pid: opts.pid,
            version: proc.version().to_string(),
        });
    }
    proc.set_limits(Limits {
        locals: opts.locals,
        ..proc.limits()
    });
    let threads = proc.threads()?;
    let gil_enabled = proc.gil_enabled().unwrap_or(true);
    if opts.json {
        write_json(&proc, &threads, gil_enabled, out)
    } else {
        write_text(&proc, &threads, gil_enabled, out)
    }
}

fn write_json(
    proc: &PythonProcess,
    threads: &[PyThread],
    gil_enabled: bool,
    out: &mut dyn Write,
) -> Result<(), DumpError> {
    let v = proc.version();
    let opts_locals = proc.limits().locals.is_some();
    let dump = JsonDump {
        pid: proc.pid(),
        python: JsonPython {
            version: v.to_string(),
            free_threaded: v.free_threaded,
            gil_enabled,
        },
        threads: threads
            .iter()
            .map(|t| JsonThread {
                tid: t.host_tid,
                native_thread_id: t.native_thread_id,
                python_thread_id: t.python_thread_id,
                name: t.name.as_deref(),
                gil: gil_json(t.gil),
                truncated: t.truncated,
                frames: t
                    .frames
                    .iter()
                    .enumerate()
                    .map(|(i, f)| JsonFrame {
                        function: &f.function,
                        file: &f.file,
                        line: f.line,
                        first_line: f.first_line,
                        locals: opts_locals.then(|| {
                            t.locals
                                .get(i)
                                .map(|l| {
                                    l.iter()
                                        .map(|l| JsonLocal {
                                            name: &l.name,
                                            arg: l.arg,
                                            value: &l.value,
                                        })
                                        .collect()
                                })
                                .unwrap_or_default()
                        }),
                    })
                    .collect(),
            })
            .collect(),
    };
    serde_json::to_writer(&mut *out, &dump)?;
    writeln!(out)?;
    Ok(())
}

fn write_text(
    proc: &PythonProcess,
    threads: &[PyThread],
    gil_enabled: bool,
    out: &mut dyn Write,
) -> Result<(), DumpError> {
    let v = proc.version();
    let ft = if !v.free_threaded {
        ""
    } else if gil_enabled {
        ", free-threaded, GIL enabled"
    } else {
        ", free-threaded"
    };
    writeln!(
        out,
        "Process {}: {} (Python {v}{ft})",
        proc.pid(),
        printable(&cmdline(proc.pid()))
    )?;
    for t in threads {
        let tid = t.host_tid.map_or_else(
            || format!("{} (in its namespace)", t.native_thread_id),
            |h| h.to_string(),
        );
        writeln!(out)?;
        writeln!(
            out,
            "Thread {tid} ({}) [{}]",
            printable(t.name.as_deref().unwrap_or("?")),
            gil_text(t)
        )?;
        // Names come from the target: printable, never terminal commands or forged lines.
        for (i, f) in t.frames.iter().enumerate() {
            let (function, file) = (printable(&f.function), printable(&f.file));
            if f.line >= 0 {
                writeln!(out, "    {function} ({file}:{})", f.line)?;
            } else {
                writeln!(out, "    {function} ({file})")?;
            }
            if let Some(locals) = t.locals.get(i) {
                write_locals(locals, out)?;
            }
        }
        if t.truncated {
            writeln!(out, "    ... truncated at {} frames", t.frames.len())?;
        }
    }
    let counts = proc.error_counts();
    if counts.total() > 0 {
        let list: Vec<String> = counts
            .nonzero()
            .map(|(k, n)| format!("{}={n}", k.name()))
            .collect();
        writeln!(out, "\n(read errors: {})", list.join(", "))?;
    }
    Ok(())
}

/// `Arguments:` and `Locals:` under a frame, one `name = value` per line.
fn write_locals(locals: &[Local], out: &mut dyn Write) -> std::io::Result<()> {
    for (title, args) in [("Arguments", true), ("Locals", false)] {
        let mut group = locals.iter().filter(|l| l.arg == args).peekable();
        if group.peek().is_none() {
            continue;
        }
        writeln!(out, "        {title}:")?;
        for l in group {
            // Values are `repr()`s (no control characters); names come from the target.
            writeln!(out, "            {} = {}", printable(&l.name), l.value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_python_and_gone_processes_are_one_line_errors() {
        let mut out = Vec::new();
        let e = run(
            &DumpOptions {
                pid: std::process::id(),
                json: true,
                locals: None,
            },
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("pid {} is not a Python process", std::process::id())
        );
        let e = run(
            &DumpOptions {
                pid: 0x7fff_fff0,
                json: false,
                locals: Some(ValueLimits::default()),
            },
            &mut out,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), format!("process {} is gone", 0x7fff_fff0));
        assert!(out.is_empty());
    }
}
