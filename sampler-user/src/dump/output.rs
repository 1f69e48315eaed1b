//! The text and JSON renderings of a [`Snapshot`].
//!
//! Owns: the `dump` output formats. Text: py-spy `dump` style — a process line, then per thread
//! `Thread <tid> (<name>) [holds GIL|waiting|no GIL|active]` and its frames innermost first
//! (`function (file:line)`; native frames `function (module)`: their source lines, when debug
//! information has them, are in the JSON), `Arguments:`/`Locals:` under a frame with `--locals`.
//! JSON: the contract below.
//! Constraints: the JSON shape is a contract (end-to-end tests parse it):
//! `{"pid", "python": {"version", "free_threaded", "gil_enabled"}, "threads": [{"tid",
//! "native_thread_id", "python_thread_id", "name", "gil", "truncated", "torn", "rereads",
//! "frames": [{"function", "file", "line", "first_line"}]}]}`; `tid` is the host TID (null if
//! unknown); `torn`: the chain kept changing while it was read (`rereads` more times), the
//! frames are what was read. With `--pause` the top level has `"pause": {"threads_stopped",
//! "pause_us_max", "pause_us_total"}`; `threads_ended`: threads without a Python frame that
//! ended while the dump read them (left out). With
//! `--locals` every Python frame also has `"locals": [{"name", "arg", "value"}]`. With `--core`
//! the top level also has `"core": {"path", "compressed"}` (`pid` is the pid the process had).
//! With `--native` the top level has `"native": {"threads_stopped", "pause_us_max",
//! "pause_us_total"}` (0 for a core: nothing is stopped), every thread `"native": {"pause_us",
//! "merge", "truncated", "error"}` (`merge`: `merged`, `mismatch`, `native_only`), and the
//! frames are the merged stack, each with `"kind"`: `python` (the keys above), `native`
//! (`function`, `module`, `file`, `line`, `address`) or `marker` (`function`:
//! `[merge mismatch]`). Names from the target are shown printable in text (control
//! characters replaced); JSON escapes them.

use std::io::Write;

use serde::Serialize;

use super::native::{MISMATCH_MARKER, MixedFrame};
use super::{DumpError, Snapshot, ThreadDump};
use crate::merge::MergeOutcome;
use crate::printable::printable;
use crate::python::locals::Local;
use crate::python::{GilState, PyFrame, PyThread};

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

fn merge_name(o: MergeOutcome) -> &'static str {
    match o {
        MergeOutcome::NativeOnly => "native_only",
        MergeOutcome::Merged { .. } => "merged",
        MergeOutcome::Mismatch { .. } => "mismatch",
    }
}

#[derive(Serialize)]
struct JsonDump<'a> {
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    core: Option<JsonCore<'a>>,
    python: JsonPython,
    #[serde(skip_serializing_if = "Option::is_none")]
    native: Option<JsonNativeSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pause: Option<JsonNativeSummary>,
    /// Threads that ended while the dump read them (left out of `threads`).
    threads_ended: u32,
    threads: Vec<JsonThread<'a>>,
}

#[derive(Serialize)]
struct JsonCore<'a> {
    path: &'a str,
    compressed: bool,
}

#[derive(Serialize)]
struct JsonPython {
    version: String,
    free_threaded: bool,
    gil_enabled: bool,
}

#[derive(Serialize)]
struct JsonNativeSummary {
    threads_stopped: usize,
    pause_us_max: u64,
    pause_us_total: u64,
}

#[derive(Serialize)]
struct JsonThread<'a> {
    tid: Option<u32>,
    native_thread_id: u64,
    python_thread_id: u64,
    name: Option<&'a str>,
    gil: &'static str,
    truncated: bool,
    torn: bool,
    rereads: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    native: Option<JsonNativeThread>,
    frames: Vec<JsonFrame<'a>>,
}

#[derive(Serialize)]
struct JsonNativeThread {
    pause_us: Option<u64>,
    merge: &'static str,
    truncated: bool,
    error: Option<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum JsonFrame<'a> {
    Python {
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<&'static str>,
        function: &'a str,
        file: &'a str,
        line: i32,
        first_line: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        locals: Option<Vec<JsonLocal<'a>>>,
    },
    Native {
        kind: &'static str,
        function: &'a str,
        module: &'a str,
        file: Option<&'a str>,
        line: Option<u32>,
        address: u64,
    },
    Marker {
        kind: &'static str,
        function: &'static str,
    },
}

#[derive(Serialize)]
struct JsonLocal<'a> {
    name: &'a str,
    arg: bool,
    value: &'a str,
}

fn python_frame<'a>(
    f: &'a PyFrame,
    locals: Option<&'a [Local]>,
    with_locals: bool,
    kind: Option<&'static str>,
) -> JsonFrame<'a> {
    JsonFrame::Python {
        kind,
        function: &f.function,
        file: &f.file,
        line: f.line,
        first_line: f.first_line,
        locals: with_locals.then(|| {
            locals
                .unwrap_or_default()
                .iter()
                .map(|l| JsonLocal {
                    name: &l.name,
                    arg: l.arg,
                    value: &l.value,
                })
                .collect()
        }),
    }
}

fn json_thread(t: &ThreadDump, with_locals: bool) -> JsonThread<'_> {
    let py = &t.py;
    let locals = |i: usize| py.locals.get(i).map(Vec::as_slice);
    let frames = match &t.native {
        None => py
            .frames
            .iter()
            .enumerate()
            .map(|(i, f)| python_frame(f, locals(i), with_locals, None))
            .collect(),
        Some(n) => n
            .merged
            .frames
            .iter()
            .map(|m| match *m {
                MixedFrame::Python(i) => {
                    python_frame(&py.frames[i], locals(i), with_locals, Some("python"))
                }
                MixedFrame::Native(i) => {
                    let f = &n.merged.native[i];
                    JsonFrame::Native {
                        kind: "native",
                        function: &f.symbol.name,
                        module: &f.symbol.module,
                        file: f.symbol.file.as_deref(),
                        line: f.symbol.line,
                        address: f.addr,
                    }
                }
                MixedFrame::Mismatch => JsonFrame::Marker {
                    kind: "marker",
                    function: MISMATCH_MARKER,
                },
            })
            .collect(),
    };
    JsonThread {
        tid: py.host_tid,
        native_thread_id: py.native_thread_id,
        python_thread_id: py.python_thread_id,
        name: py.name.as_deref(),
        gil: gil_json(py.gil),
        truncated: py.truncated,
        torn: t.torn,
        rereads: t.rereads,
        native: t.native.as_ref().map(|n| JsonNativeThread {
            pause_us: n.pause_us,
            merge: merge_name(n.merged.outcome),
            truncated: n.merged.truncated,
            error: n.error.clone().or_else(|| n.merged.unwind_error.clone()),
        }),
        frames,
    }
}

pub fn write_json(s: &Snapshot, out: &mut dyn Write) -> Result<(), DumpError> {
    let dump = JsonDump {
        pid: s.pid,
        core: s.core.as_ref().map(|(path, compressed)| JsonCore {
            path,
            compressed: *compressed,
        }),
        python: JsonPython {
            version: s.version.to_string(),
            free_threaded: s.version.free_threaded,
            gil_enabled: s.gil_enabled,
        },
        native: s.pauses.map(|p| JsonNativeSummary {
            threads_stopped: p.threads,
            pause_us_max: p.max_us,
            pause_us_total: p.total_us,
        }),
        threads_ended: s.ended,
        pause: s.paused.map(|p| JsonNativeSummary {
            threads_stopped: p.threads,
            pause_us_max: p.max_us,
            pause_us_total: p.total_us,
        }),
        threads: s
            .threads
            .iter()
            .map(|t| json_thread(t, s.with_locals))
            .collect(),
    };
    serde_json::to_writer(&mut *out, &dump)?;
    writeln!(out)?;
    Ok(())
}

fn write_python_frame(
    f: &PyFrame,
    locals: Option<&Vec<Local>>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let (function, file) = (printable(&f.function), printable(&f.file));
    if f.line >= 0 {
        writeln!(out, "    {function} ({file}:{})", f.line)?;
    } else {
        writeln!(out, "    {function} ({file})")?;
    }
    if let Some(locals) = locals {
        write_locals(locals, out)?;
    }
    Ok(())
}

#[allow(
    clippy::many_single_char_names,
    reason = "s(napshot), v(ersion), t(hread), p(auses), n(ative)"
)]
pub fn write_text(s: &Snapshot, out: &mut dyn Write) -> Result<(), DumpError> {
    let v = s.version;
    let ft = if !v.free_threaded {
        ""
    } else if s.gil_enabled {
        ", free-threaded, GIL enabled"
    } else {
        ", free-threaded"
    };
    match &s.core {
        Some((path, _)) => writeln!(
            out,
            "Core {} of process {}: {} (Python {v}{ft})",
            printable(path),
            s.pid,
            printable(&s.cmdline)
        )?,
        None => writeln!(
            out,
            "Process {}: {} (Python {v}{ft})",
            s.pid,
            printable(&s.cmdline)
        )?,
    }
    match (s.pauses, &s.core) {
        (Some(_), Some(_)) => {
            writeln!(out, "Native stacks from the threads' registers in the core")?;
        }
        (Some(p), None) => writeln!(
            out,
            "Native stacks: {} threads stopped one at a time, {} µs at most, {} µs in all",
            p.threads, p.max_us, p.total_us
        )?,
        (None, _) => {}
    }
    if let Some(p) = s.paused {
        writeln!(
            out,
            "Each thread stopped while its stack was read: {} threads, {} µs at most, {} µs in all",
            p.threads, p.max_us, p.total_us
        )?;
    }
    for t in &s.threads {
        let py = &t.py;
        let tid = py.host_tid.map_or_else(
            || format!("{} (in its namespace)", py.native_thread_id),
            |h| h.to_string(),
        );
        writeln!(out)?;
        writeln!(
            out,
            "Thread {tid} ({}) [{}]",
            printable(py.name.as_deref().unwrap_or("?")),
            gil_text(py)
        )?;
        match &t.native {
            None => {
                for (i, f) in py.frames.iter().enumerate() {
                    write_python_frame(f, py.locals.get(i), out)?;
                }
            }
            Some(n) => {
                for m in &n.merged.frames {
                    match *m {
                        MixedFrame::Python(i) => {
                            write_python_frame(&py.frames[i], py.locals.get(i), out)?;
                        }
                        MixedFrame::Native(i) => {
                            let f = &n.merged.native[i].symbol;
                            writeln!(out, "    {} ({})", printable(&f.name), printable(&f.module))?;
                        }
                        MixedFrame::Mismatch => writeln!(out, "    {MISMATCH_MARKER}")?,
                    }
                }
                if let Some(e) = &n.error {
                    writeln!(out, "    ... no native frames: {e}")?;
                } else if n.merged.truncated {
                    writeln!(out, "    ... native stack cut short")?;
                }
            }
        }
        write_cut(t, out)?;
    }
    if s.ended > 0 {
        writeln!(
            out,
            "\n({} threads without Python frames ended while the dump read them: not shown)",
            s.ended
        )?;
    }
    let counts = &s.counts;
    if counts.total() > 0 {
        let list: Vec<String> = counts
            .nonzero()
            .map(|(k, n)| format!("{}={n}", k.name()))
            .collect();
        writeln!(out, "\n(read errors: {})", list.join(", "))?;
    }
    Ok(())
}

/// The line under a thread whose stack was torn (changed while it was read) or truncated.
fn write_cut(t: &ThreadDump, out: &mut dyn Write) -> std::io::Result<()> {
    let n = t.py.frames.len();
    if t.torn {
        writeln!(
            out,
            "    ... torn: the stack changed while it was read ({} reads); the {n} frames above \
             are what was read (--pause stops the thread for a consistent stack)",
            t.rereads + 1,
        )
    } else if t.py.truncated {
        writeln!(out, "    ... truncated at {n} frames")
    } else {
        Ok(())
    }
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
