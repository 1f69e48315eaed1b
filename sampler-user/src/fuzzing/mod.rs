//! Fuzzing entry points: one function per untrusted input pyebpf parses, shared by the
//! coverage-guided targets (`fuzz/fuzz_targets/*.rs`, `cargo xtask fuzz`) and the regression
//! unit tests that replay every saved crash and seed (`fuzz/regressions/`, `fuzz_regressions`).
//!
//! Owns: [`TARGETS`] (name → entry) and the invariants each entry checks beyond "no panic":
//! the reader's caps (frames, threads, names, locals, the largest single read), the saved
//! loader's ratios, the ELF layer's bounded reads. Input: arbitrary bytes. Output: nothing; a
//! broken invariant panics (that is how libFuzzer and the tests see it).
//! Constraints: deterministic (no clock, no randomness, no live process), no file is written,
//! each run bounded in time and memory by the caps of the code under test. The byte layouts of
//! the inputs are documented on each entry; seeds are written by the `fuzz_seeds` tests.

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::merge::{ehframe, evalrange};
use crate::procs::elf::{SymbolTableKind, read_elf_info, read_section, read_symbols};
use crate::python::code::{MAX_FILE_CHARS, MAX_NAME_CHARS};
use crate::python::layout::{PyVersion, RuntimeLayout};
use crate::python::locals::{MAX_LOCALS, MAX_NAME_CHARS as MAX_LOCAL_NAME};
use crate::python::memory::{ImageMemory, MAX_READ, MemError, ReadMemory};
use crate::python::snapshot::Snapshot;
use crate::python::values::ValueLimits;
use crate::python::{Limits, PyThread, kernel};

/// A fuzzing entry point.
pub type Entry = fn(&[u8]);

/// Every target: its name (the `fuzz/fuzz_targets/NAME.rs` file and corpus directory) and entry.
pub const TARGETS: [(&str, Entry); 6] = [
    ("python_reader", python_reader),
    ("debug_offsets", debug_offsets),
    ("elf", elf),
    ("eh_frame", eh_frame),
    ("saved", saved),
    ("core", core),
];

/// The entry of target `name`.
pub fn target(name: &str) -> Option<Entry> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, e)| *e)
}

/// Reads as the wrapped image does and keeps the largest read asked for (the reader must
/// bound every length below [`MAX_READ`] itself, not rely on the memory refusing it).
struct Watched {
    inner: ImageMemory,
    largest: Arc<AtomicUsize>,
}

impl ReadMemory for Watched {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.largest.fetch_max(buf.len(), Ordering::Relaxed);
        self.inner.read(addr, buf)
    }
}

/// The caps every snapshot of threads must respect.
pub fn check_bounds(threads: &[PyThread], limits: Limits) {
    assert!(threads.len() <= limits.max_threads * limits.max_interpreters);
    for t in threads {
        assert!(t.frames.len() <= limits.max_depth);
        match limits.locals {
            Some(v) => {
                assert_eq!(t.locals.len(), t.frames.len());
                for l in t.locals.iter().flatten() {
                    assert!(l.value.chars().count() <= v.max_len, "{}", l.value);
                    assert!(l.name.chars().count() <= MAX_LOCAL_NAME + 1);
                }
                assert!(t.locals.iter().all(|f| f.len() <= MAX_LOCALS));
            }
            None => assert!(t.locals.is_empty()),
        }
        assert!(t.name.as_ref().is_none_or(|n| n.chars().count() <= 257));
        for f in &t.frames {
            assert!(f.function.chars().count() <= MAX_NAME_CHARS + 1);
            assert!(f.file.chars().count() <= MAX_FILE_CHARS + 1);
        }
    }
}

/// The Python reader over arbitrary memory: attach (version from `_Py_DebugOffsets`,
/// `Py_Version` or the `.bss` version string; layout from the debug offsets or a built-in
/// table checked against the memory), every thread's frames (code objects, line tables,
/// strings, thread names, the GIL), optionally every frame's locals, then frames resolved as
/// the kernel's captures are.
///
/// Input: one options byte (bit 0: small limits; bit 1: read locals), an encoded
/// [`Snapshot`], then any number of 20-byte (`u64` code object, `u64` instruction pointer,
/// `i32` tlbc index) triples (at most 32 are resolved).
pub fn python_reader(data: &[u8]) {
    let Some((&opts, rest)) = data.split_first() else {
        return;
    };
    let Ok((snapshot, used)) = Snapshot::decode_prefix(rest) else {
        return;
    };
    let mut limits = if opts & 1 == 1 {
        Limits {
            max_depth: 16,
            max_threads: 3,
            max_interpreters: 2,
            locals: None,
        }
    } else {
        Limits::default()
    };
    if opts & 2 == 2 {
        limits.locals = Some(ValueLimits {
            max_len: 40,
            ..ValueLimits::default()
        });
    }
    let largest = Arc::new(AtomicUsize::new(0));
    let mem = Watched {
        inner: snapshot.memory(),
        largest: Arc::clone(&largest),
    };
    if let Ok(mut proc) = snapshot.attach_with(Box::new(mem)) {
        proc.set_limits(limits);
        let mut codes = Vec::new();
        if let Ok(threads) = proc.threads() {
            check_bounds(&threads, limits);
            codes.extend(threads.iter().flat_map(|t| &t.frames).map(|f| f.code_addr));
        }
        let _ = proc.gil_enabled();
        for code in codes.into_iter().take(32) {
            let _ = proc.resolve_frame(code, 0, 0);
        }
        for t in rest[used..].chunks_exact(20).take(32) {
            let word = |i: usize| u64::from_le_bytes(t[i..i + 8].try_into().unwrap_or_default());
            let tlbc = i32::from_le_bytes(t[16..20].try_into().unwrap_or_default());
            if let Ok(f) = proc.resolve_frame(word(0), word(8), tlbc) {
                assert!(f.function.chars().count() <= MAX_NAME_CHARS + 1);
                assert!(f.file.chars().count() <= MAX_FILE_CHARS + 1);
            }
        }
        let _ = kernel::offsets_from_layout(proc.layout(), snapshot.runtime_addr, 0);
    }
    let largest = largest.load(Ordering::Relaxed);
    assert!(largest <= MAX_READ, "a read of {largest} bytes");
}

/// `_Py_DebugOffsets` parsing (3.13+) and the built-in tables (3.8–3.12): a layout from
/// arbitrary offsets is either refused or converted to the kernel's offsets without panicking.
///
/// Input: minor version (taken modulo 8, plus 8: 3.8–3.15), a free-threaded flag byte, then
/// the bytes found at `_PyRuntime`.
pub fn debug_offsets(data: &[u8]) {
    let [minor, ft, bytes @ ..] = data else {
        return;
    };
    let version = PyVersion {
        major: 3,
        minor: 8 + minor % 8,
        micro: 0,
        level: 0xF,
        serial: 0,
        free_threaded: ft & 1 == 1,
    };
    if let Ok(layout) = RuntimeLayout::build(version, bytes) {
        let _ = layout.family();
        let _ = kernel::offsets_from_layout(&layout, 0x1000, 0x2000);
    }
}

/// Bytes past the end of a file read as much as there is (the ELF layer's reads are bounded).
const MAX_SECTION_READ: u64 = 1 << 20;

/// The ELF layer: headers, every section, both symbol tables, the CPython detection, the
/// eval-loop pieces (symbols, `.eh_frame` fragments) and the unwind sections framehop gets.
///
/// Input: the file.
pub fn elf(data: &[u8]) {
    let Ok(info) = read_elf_info(data) else {
        return;
    };
    let _ = info.has_symtab();
    let _ = info.bias_for_mapping(0x40_0000, 0);
    for s in &info.sections {
        if let Ok(bytes) = read_section(data, s, MAX_SECTION_READ) {
            assert!(bytes.len() as u64 <= MAX_SECTION_READ.max(s.size));
        }
    }
    for kind in [SymbolTableKind::Dynamic, SymbolTableKind::Static] {
        if let Ok(Some(table)) = read_symbols(data, &info, kind, MAX_SECTION_READ) {
            for sym in table.iter().take(1 << 16) {
                let _ = sym.name.len();
            }
        }
    }
    let _ = crate::python::detect::python_elf(data);
    if let Ok(pieces) = evalrange::ranges_in_elf(data) {
        let _ = evalrange::fragments_from_eh_frame(data, &pieces.ranges);
    }
    let unwind = crate::unwind::modules::FileUnwindData::load(data, info);
    let _ = unwind.has_unwind_info();
}

/// Most frames one fuzzed unwind may produce (what `record --native` allows).
const MAX_UNWIND_FRAMES: usize = 256;

/// `.eh_frame` as the merge reads it (gimli: every FDE's CFA rule at its start, the jumps of a
/// function into fragment FDEs) and as the unwinder reads it (framehop, over a copied stack).
///
/// Input: `u64` section address, `u16` section length, the section, `u64` instruction
/// pointer, stack pointer and frame pointer, then the stack bytes (also scanned as the
/// function's code).
pub fn eh_frame(data: &[u8]) {
    use crate::unwind::cfi_guard::{self, Verdict};
    use crate::unwind::{Cache, Unwinder};
    use framehop::x86_64::UnwindRegsX86_64;
    use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};

    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
    };
    let Some(addr) = word(0) else { return };
    let Some(len) = data
        .get(8..10)
        .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
    else {
        return;
    };
    let Some(section) = data.get(10..10 + len) else {
        return;
    };
    let at = 10 + len;
    let (Some(ip), Some(sp), Some(bp)) = (word(at), word(at + 8), word(at + 16)) else {
        return;
    };
    let stack = &data[at + 24..];
    let fdes = ehframe::fdes(section, addr);
    let _ = ehframe::jumped_fragments(stack, ip, &fdes);

    let base = addr & !0xfff;
    let text = base..addr;
    let eh_frame_svma = addr..addr.saturating_add(section.len() as u64);
    // As `unwind::modules`: framehop never sees a section the guard withholds.
    let bases = cfi_guard::bases(Some(&eh_frame_svma), None, Some(&text), None);
    if cfi_guard::check_eh_frame(section, None, &bases) != Verdict::Safe {
        return;
    }
    let bytes: Arc<[u8]> = Arc::from(section);
    let info = ExplicitModuleSectionInfo {
        base_svma: base,
        text_svma: Some(text),
        eh_frame_svma: Some(eh_frame_svma),
        eh_frame: Some(bytes),
        ..ExplicitModuleSectionInfo::default()
    };
    let mut unwinder = Unwinder::new();
    unwinder.add_module(Module::new(
        "fuzz".to_owned(),
        base..addr
            .saturating_add(section.len() as u64)
            .max(base.saturating_add(1)),
        base,
        info,
    ));
    let mut cache = Cache::new_in();
    let mut read_stack = |a: u64| -> Result<u64, ()> {
        let off = usize::try_from(a.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let w = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(w.try_into().map_err(|_| ())?))
    };
    let mut iter = unwinder.iter_frames(
        ip,
        UnwindRegsX86_64::new(ip, sp, bp),
        &mut cache,
        &mut read_stack,
    );
    for _ in 0..MAX_UNWIND_FRAMES {
        match iter.next() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
}

/// A sink that counts what it is given (the renderers' output is checked for size only).
struct Counting(u64);

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The saved-file loader, then one renderer (chosen by the input's length: each output
/// format, `report` and `script` in turn), whose output must stay within the ratios the loader
/// promises (a crafted file cannot make rendering cost much more than its size).
///
/// Input: the file.
pub fn saved(data: &[u8]) {
    use crate::output::Format;
    let Ok(loaded) = crate::saved::reader::load_from_with(data, true) else {
        return;
    };
    let p = &loaded.profile;
    let mut out = Counting(0);
    let _ = match data.len() % 7 {
        0 => Format::Flamegraph.render(p, &mut out),
        1 => Format::Collapsed.render(p, &mut out),
        2 => Format::Speedscope.render(p, &mut out),
        3 => Format::Pprof.render(p, &mut out),
        4 => Format::Pyebpf.render(p, &mut out),
        5 => crate::report::script::render(p, &mut out),
        _ => crate::report::ReportConfig::new(&crate::report::ReportOptions {
            children: true,
            call_graph: Some("caller".into()),
            ..crate::report::ReportOptions::default()
        })
        .map_err(|e| io::Error::other(e.0))
        .and_then(|cfg| crate::report::render(p, &cfg, &mut out)),
    };
    // Generous: text per byte of file as the loader allows it, the fixed allowance, and the
    // flame graph's SVG markup around each frame.
    let cap = (data.len() as u64 + crate::saved::reader::SLACK)
        .saturating_mul(crate::saved::reader::TEXT_PER_BYTE * 4);
    assert!(out.0 <= cap, "{} bytes rendered from {}", out.0, data.len());
}

/// The core-file reader (`dump --core`): the file's headers and notes, its memory, the Python
/// runtime found through the mapped files it names (looked up under `/`, so a core of one of
/// the test interpreters finds its libpython), every thread's stack with locals, and the
/// native unwind of each thread from its registers.
///
/// Input: the core file (written to an unnamed in-memory file: the reader takes a path).
pub fn core(data: &[u8]) {
    let Some(file) = memfd_with(data) else {
        return;
    };
    let opts = crate::dump::DumpOptions {
        target: crate::dump::DumpTarget::Core {
            path: file.path.clone(),
            root: "/".into(),
        },
        json: data.len().is_multiple_of(2),
        locals: Some(ValueLimits::default()),
        native: data.len().is_multiple_of(3),
        pause: false,
    };
    let mut out = Counting(0);
    let _ = crate::dump::run(&opts, &mut out);
}

/// An in-memory file holding some bytes, named by a path (`/proc/self/fd/N`); closed when
/// dropped.
struct MemFile {
    fd: i32,
    path: std::path::PathBuf,
}

impl Drop for MemFile {
    fn drop(&mut self) {
        // SAFETY: `fd` was returned by memfd_create and is closed once, here.
        unsafe { libc::close(self.fd) };
    }
}

fn memfd_with(data: &[u8]) -> Option<MemFile> {
    // SAFETY: the name is a NUL-terminated literal; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"pyebpf-fuzz-core".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let f = MemFile {
        fd,
        path: format!("/proc/self/fd/{fd}").into(),
    };
    // SAFETY: `data` is valid for `data.len()` bytes; `fd` is ours.
    let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0) };
    (usize::try_from(n).ok() == Some(data.len())).then_some(f)
}

#[cfg(test)]
mod live_seeds;
#[cfg(test)]
mod seeds;
