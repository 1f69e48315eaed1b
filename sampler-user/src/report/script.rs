//! `pyebpf script`: every sample of a saved profile in the `perf script` text layout (default
//! fields), so tools that read perf's text read ours: FlameGraph's `stackcollapse-perf.pl`,
//! inferno's `collapse-perf`, Firefox Profiler's and speedscope's importers.
//!
//! Layout:
//!
//! ```text
//! # ========
//! # captured on    : 2025-01-01 12:00:00 UTC
//! # hostname : HOST
//! # os release : KERNEL
//! # cmdline : pyebpf record …
//! # nrcpus online : 2
//! # pyebpf : 1234 samples, 99 Hz (period 10101010 ns), 5.00 s, 0 lost; addresses not kept (0)
//! # ========
//! #
//! python3 1234/1234 [001] 5123.456789: 10101010 cpu-clock:
//! \t0 py::spin:/app/w.py:12+0x0 (/app/w.py)
//! \t0 py::<module>:/app/w.py:30+0x0 (/app/w.py)
//!
//! ```
//!
//! - The `# ========` block is `perf script --header`'s: Firefox Profiler recognises a file
//!   starting with it; everyone skips `#` lines. As in perf's output, no empty line follows it
//!   (inferno's collapse-perf takes the first blank-line-terminated block for a sample and
//!   asserts on one without a header line).
//! - Header line, one per sample, in arrival order: `comm pid/tid [cpu] secs.usecs: period
//!   cpu-clock:`. `comm` is the process name (the root of the collapsed output); the thread
//!   level of `--threads` profiles is not printed (the tid is in the header). Time is the
//!   sample's kernel monotonic time; period is 1e9 / rate in ns (1 when the rate is unknown),
//!   which stackcollapse-perf and inferno sum as the stack's weight.
//! - Then the frames, leaf first, one per line: `\t<address> <symbol>+0x0 (<module>)`. The
//!   profile keeps no addresses, so the address is `0`; the `+0x0` symbol offset is perf's
//!   default since Linux 4.8, and every reader strips one trailing `+0x<hex>`, which keeps a
//!   name that itself ends in `+0x…` (`libfoo.so+0x1a2b`, an unresolved native frame) whole.
//! - Symbols: Python frames use CPython's perf-trampoline convention `py::<qualname>:<file>`,
//!   extended with `:<line>`, and their module is the source file (as the Shared Object column
//!   of `report`); not a `[…]` name, because stackcollapse-perf `--kernel`/`--all` marks every
//!   `[…]` module as kernel. Native frames: their name and module (`[unknown]` if none).
//!   Kernel frames: module `[kernel.kallsyms]`, which stackcollapse-perf `--kernel`/`--all`
//!   marks with `_[k]`, our collapsed convention. Markers (`[truncated]`, `[merge mismatch]`):
//!   their name, module `[unknown]`. Process and Thread frames are not frames here (the header
//!   names the process). A sample with no other frame gets one `[unknown]` frame, as perf prints
//!   an unknown ip: importers that drop empty stacks (Firefox Profiler, inferno) then still
//!   count it.
//! - Sanitising, so that every line parses in every reader: in comm, symbols and modules,
//!   control characters (line breaks, tabs) become spaces; modules have no spaces or
//!   parentheses (`_` instead: the readers take the module from the last ` (…)` and speedscope
//!   wants no space in it); an empty comm, symbol or module is `[unknown]`; a comm that starts
//!   with a space or `#` gets a leading `_`; a one-character comm is followed by two spaces
//!   (stackcollapse-perf and speedscope need a comm of two characters or more; perf's own
//!   output has the same trap). Symbols keep spaces, parentheses and `;` (the
//!   readers handle those: stackcollapse-perf drops a C++ argument list `(…)` and turns `;`
//!   into `:`, as for perf's own output).
//!
//! Known limits (shared with perf's own output): a comm containing a separate all-digit word
//! (`worker 2`) is split there by stackcollapse-perf, inferno and speedscope; a symbol that
//! starts with `(` is skipped and one containing `->` split by stackcollapse-perf and inferno.

use std::io::{self, Write};

use super::meta;
use crate::profile::{FileNames, Frame, FrameKind, Profile, Sample};

/// Event name on every header line.
pub const EVENT: &str = "cpu-clock";
/// Module of kernel frames.
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";
/// Module (and symbol) when unknown.
pub const UNKNOWN: &str = "[unknown]";

/// The period printed on every header line: 1e9 / rate in ns (1 when the rate is unknown).
pub fn period_ns(rate_hz: u64) -> u64 {
    1_000_000_000u64
        .checked_div(rate_hz)
        .map_or(1, |p| p.max(1))
}

/// Unsafe characters ([`crate::printable::is_unsafe`]) as spaces.
fn no_controls(s: &str) -> String {
    s.chars()
        .map(|c| {
            if crate::printable::is_unsafe(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// The comm as printed on a header line.
pub fn comm_field(comm: &str) -> String {
    let s = no_controls(comm);
    if s.trim().is_empty() {
        return UNKNOWN.to_string();
    }
    if s.starts_with([' ', '#']) {
        return format!("_{s}");
    }
    if s.chars().count() == 1 {
        // stackcollapse-perf and speedscope read the comm as `\S.+?`: at least two characters.
        // A second space keeps a one-character comm whole (readers trim it).
        return format!("{s} ");
    }
    s
}

/// A symbol as printed on a frame line.
pub fn symbol_field(name: &str) -> String {
    let s = no_controls(name);
    if s.trim().is_empty() {
        UNKNOWN.to_string()
    } else {
        s
    }
}

/// A module as printed on a frame line (inside its parentheses).
pub fn module_field(module: &str) -> String {
    let s: String = module
        .chars()
        .map(|c| {
            if crate::printable::is_unsafe(c) || c.is_whitespace() || c == '(' || c == ')' {
                '_'
            } else {
                c
            }
        })
        .collect();
    if s.is_empty() { UNKNOWN.to_string() } else { s }
}

/// The (symbol, module) of a frame, or `None` for the synthetic Process and Thread frames;
/// Python files as `names` says.
pub fn frame_fields(f: &Frame, names: FileNames) -> Option<(String, String)> {
    let (symbol, module) = match f.kind {
        FrameKind::Process | FrameKind::Thread => return None,
        FrameKind::Python => {
            let mut s = format!("py::{}", f.name);
            let file = f.display_file(names);
            if let Some(file) = file {
                s.push(':');
                s.push_str(file);
                if let Some(line) = f.line {
                    s.push(':');
                    s.push_str(&line.to_string());
                }
            }
            (s, file.unwrap_or(UNKNOWN).to_string())
        }
        FrameKind::Native => (
            f.name.to_string(),
            f.module.as_deref().unwrap_or(UNKNOWN).to_string(),
        ),
        FrameKind::Kernel => (f.name.to_string(), KERNEL_MODULE.to_string()),
        FrameKind::Marker | FrameKind::State => (f.name.to_string(), UNKNOWN.to_string()),
    };
    Some((symbol_field(&symbol), module_field(&module)))
}

/// Writes the `# ========` header block.
fn write_header(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let m = &profile.meta;
    writeln!(out, "# ========")?;
    writeln!(out, "# captured on    : {}", meta::utc(m.start_unix_s))?;
    writeln!(out, "# hostname : {}", no_controls(&m.host))?;
    writeln!(out, "# os release : {}", no_controls(&m.kernel))?;
    writeln!(
        out,
        "# cmdline : {}",
        no_controls(&meta::command_line(&m.command_line))
    )?;
    writeln!(out, "# nrcpus online : {}", m.cpus)?;
    writeln!(
        out,
        "# pyebpf : {} samples, {} Hz (period {} ns), {:.2} s, {} lost; addresses not kept (0){}",
        profile.total_weight(),
        m.rate_hz,
        period_ns(m.rate_hz),
        m.duration_s,
        m.lost_samples,
        if m.idle {
            "; wall clock (--idle): an off-CPU sample's period is its weight times the period"
        } else {
            ""
        }
    )?;
    writeln!(out, "# ========")?;
    writeln!(out, "#")
}

/// Writes one sample's block (header line, frames leaf first, empty line).
fn write_sample(
    profile: &Profile,
    s: &Sample,
    period: u64,
    fields: &[Option<(String, String)>],
    out: &mut dyn Write,
) -> io::Result<()> {
    let period = period.saturating_mul(u64::from(s.weight));
    writeln!(
        out,
        "{} {}/{} [{:03}] {}.{:06}: {period} {EVENT}:",
        comm_field(profile.comm(&s.key)),
        s.key.pid,
        s.key.tid,
        s.cpu,
        s.time_ns / 1_000_000_000,
        s.time_ns % 1_000_000_000 / 1000
    )?;
    let mut printed = 0;
    for id in profile.stack(s.key.stack).iter().rev() {
        if let Some(Some((symbol, module))) = fields.get(id.0 as usize) {
            writeln!(out, "\t0 {symbol}+0x0 ({module})")?;
            printed += 1;
        }
    }
    if printed == 0 {
        writeln!(out, "\t0 {UNKNOWN}+0x0 ({UNKNOWN})")?;
    }
    writeln!(out)
}

/// Writes every sample in `perf script` layout: the profile must have kept its timeline
/// (`saved::load_with`).
pub fn render(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let samples = profile
        .timeline()
        .ok_or_else(|| io::Error::other("script needs the samples one by one (the timeline)"))?;
    write_header(profile, out)?;
    let period = period_ns(profile.meta.rate_hz);
    let fields: Vec<Option<(String, String)>> = profile
        .frames()
        .iter()
        .map(|f| frame_fields(f, profile.file_names))
        .collect();
    for s in samples {
        write_sample(profile, s, period, &fields, out)?;
    }
    Ok(())
}
