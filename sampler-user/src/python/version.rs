//! Which CPython a process runs, and whether a built-in layout fits it.
//!
//! Owns: [`read_version`] (the `_Py_DebugOffsets` header from 3.13, `Py_Version` in 3.11 and
//! 3.12, the string `Py_GetVersion()` leaves in `.bss` up to 3.10 and before 3.7) and
//! [`check_binary`] (the sizes `PyCode_Type`/`PyFrame_Type` give and, on a live runtime, the
//! thread list the table describes: `docs/cpython-layouts.md` §1.3, §1.5).
//! Input: target memory and a [`Detected`] interpreter. Output: a [`PyVersion`], or
//! `Unsupported` (by name: "unsupported CPython 3.7"), `NotRecognised` ("CPython 3.9.2: layout
//! not recognised (…)"), `Invalid`.
//! Constraints: `.bss` is read in bounded chunks (at most [`MAX_BSS`]); every count from the
//! target is capped; versions found in `.bss` are cached per file.

use std::sync::{LazyLock, Mutex};

use crate::lru::Lru;
use crate::procs::FileId;

use super::detect::Detected;
use super::errors::PyError;
use super::facts::version_facts;
use super::layout::{
    DEBUG_COOKIE, DEBUG_OFFSETS_HEADER, PyVersion, RuntimeLayout, debug_offsets_len,
};
use super::memory::{self, ReadMemory};

/// Reads the version of the runtime at `d`: the debug-offsets header (3.13+), else
/// `Py_Version` (3.11, 3.12), else the version string `Py_GetVersion()` left in `.bss`
/// (≤ 3.10, and the older versions refused by name; from the per-file cache when `cached`).
pub(crate) fn read_version(
    mem: &dyn ReadMemory,
    pid: u32,
    d: &Detected,
    cached: bool,
) -> Result<PyVersion, PyError> {
    if d.pre_runtime {
        let v = bss_version(mem, pid, d, cached)?;
        return Err(PyError::Unsupported { version: v.short() });
    }
    let mut hdr = [0u8; DEBUG_OFFSETS_HEADER];
    mem.read(d.runtime_addr, &mut hdr)
        .map_err(|e| PyError::from_mem(pid, e))?;
    let py_version = match d.py_version_addr {
        Some(a) => Some(mem.read_u64(a).map_err(|e| PyError::from_mem(pid, e))?),
        None => None,
    };
    let word = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap_or_default());
    let invalid = |detail: String| PyError::Invalid {
        what: "_PyRuntime",
        addr: d.runtime_addr,
        detail,
    };
    if &hdr[..8] == DEBUG_COOKIE {
        let v = PyVersion::from_hex(word(8), word(16) == 1);
        if let Some(pv) = py_version.map(|h| PyVersion::from_hex(h, v.free_threaded))
            && (pv.major, pv.minor) != (v.major, v.minor)
        {
            return Err(invalid(format!(
                "debug offsets say {v}, Py_Version says {pv}"
            )));
        }
        return Ok(v);
    }
    let v = if let Some(hex) = py_version {
        PyVersion::from_hex(hex, false)
    } else {
        let v = bss_version(mem, pid, d, cached)?;
        if (v.major, v.minor) >= (3, 11) {
            return Err(invalid(format!("{v} without Py_Version")));
        }
        v
    };
    // Unknown minors are refused here; a version that carries debug offsets but has no cookie
    // is refused rather than guessed.
    if debug_offsets_len(&version_facts(v.major, v.minor, false)?) > 0 {
        return Err(invalid(format!("{v} without the \"xdebugpy\" cookie")));
    }
    Ok(v)
}

/// Versions read from `.bss`, per interpreter file (device, inode).
static BSS_VERSIONS: LazyLock<Mutex<Lru<FileId, PyVersion>>> =
    LazyLock::new(|| Mutex::new(Lru::new(1024)));
/// Most `.bss` bytes searched for the version string.
const MAX_BSS: u64 = 16 << 20;

/// The version in the buffer `Py_GetVersion()` fills at start-up (`static char
/// version[250]` in `Python/getversion.c`: "3.9.18 (main, …) \n[GCC …]", in `.bss`). From the
/// per-file cache only when `cached` (a snapshot records, and reads back, the `.bss` bytes).
fn bss_version(
    mem: &dyn ReadMemory,
    pid: u32,
    d: &Detected,
    cached: bool,
) -> Result<PyVersion, PyError> {
    let key = d.file.clone();
    if cached
        && let Some(v) = BSS_VERSIONS
            .lock()
            .ok()
            .and_then(|mut c| c.get(&key).copied())
    {
        return Ok(v);
    }
    let Some((start, size)) = d.bss else {
        return Err(PyError::Invalid {
            what: "interpreter",
            addr: d.runtime_addr,
            detail: "no Py_Version and no .bss to find the version in".into(),
        });
    };
    let size = size.min(MAX_BSS);
    let mut at = 0;
    loop {
        let len = (size - at).min(memory::MAX_READ as u64);
        let bytes = mem
            .read_vec(start + at, len as usize)
            .map_err(|e| PyError::from_mem(pid, e))?;
        if let Some(v) = version_in(&bytes) {
            if cached && let Ok(mut c) = BSS_VERSIONS.lock() {
                c.insert(key, v);
            }
            return Ok(v);
        }
        if at + len >= size {
            break;
        }
        // The next chunk overlaps this one by a version string's length, so none is cut.
        at += len - VERSION_WINDOW;
    }
    // Not filled yet (the interpreter has not started), or not CPython.
    Err(PyError::Invalid {
        what: "interpreter",
        addr: start,
        detail: "no version string in .bss (not initialised yet?)".into(),
    })
}

/// Bytes a version string may span ("3.10.13 (main, …) [GCC …]" fits in 250).
const VERSION_WINDOW: u64 = 256;

/// The first "M.m.p[aN|bN|rcN][+] (" followed by printable text and a NUL in `bytes`.
fn version_in(bytes: &[u8]) -> Option<PyVersion> {
    let digits = |b: &[u8], i: &mut usize, max: usize| -> Option<u32> {
        let s = *i;
        while *i < b.len() && b[*i].is_ascii_digit() && *i - s < max {
            *i += 1;
        }
        std::str::from_utf8(&b[s..*i]).ok()?.parse().ok()
    };
    for start in 0..bytes.len().saturating_sub(8) {
        if !(bytes[start] == b'2' || bytes[start] == b'3') || bytes[start + 1] != b'.' {
            continue;
        }
        if start > 0 && (bytes[start - 1].is_ascii_digit() || bytes[start - 1] == b'.') {
            continue;
        }
        let b = bytes;
        let mut i = start + 2;
        let Some(minor) = digits(b, &mut i, 2) else {
            continue;
        };
        if b.get(i) != Some(&b'.') {
            continue;
        }
        i += 1;
        let Some(micro) = digits(b, &mut i, 2) else {
            continue;
        };
        let (mut level, mut serial) = (0xF, 0);
        for (tag, lv) in [(&b"rc"[..], 0xC), (b"a", 0xA), (b"b", 0xB)] {
            if b[i..].starts_with(tag) {
                i += tag.len();
                level = lv;
                serial = digits(b, &mut i, 2).unwrap_or(0);
                break;
            }
        }
        if b.get(i) == Some(&b'+') {
            i += 1;
        }
        if !b[i..].starts_with(b" (") {
            continue;
        }
        let rest = &b[i..b.len().min(start + 250)];
        let Some(nul) = rest.iter().position(|&c| c == 0) else {
            continue;
        };
        if !rest[..nul]
            .iter()
            .all(|&c| c == b'\n' || (0x20..0x7f).contains(&c))
        {
            continue;
        }
        return Some(PyVersion {
            major: b[start] - b'0',
            minor: minor as u8,
            micro: micro as u8,
            level,
            serial: serial as u8,
            free_threaded: false,
        });
    }
    None
}

/// Checks a built-in table against the running binary before it is used: the sizes
/// `PyCode_Type` and `PyFrame_Type` give, and on an initialised runtime the chain the table
/// describes (every thread state of the main interpreter points back at it, and one of them
/// is the runtime's `main_thread`). A patch release that moved what the table says fails here.
pub(crate) fn check_binary(
    mem: &dyn ReadMemory,
    pid: u32,
    d: &Detected,
    version: PyVersion,
    layout: &RuntimeLayout,
) -> Result<(), PyError> {
    let refuse = |detail: String| PyError::NotRecognised {
        version: version.to_string(),
        detail,
    };
    let read = |a: u64| mem.read_u64(a).map_err(|e| PyError::from_mem(pid, e));
    for (what, ty, want) in [
        (
            "PyCode_Type",
            d.pycode_type_addr,
            layout.checks.code_basicsize,
        ),
        (
            "PyFrame_Type",
            d.pyframe_type_addr,
            layout.checks.frame_basicsize,
        ),
    ] {
        let (Some(ty), Some(want)) = (ty, want) else {
            continue;
        };
        let got = read(ty.wrapping_add(layout.types.tp_basicsize))?;
        if got != want {
            return Err(refuse(format!(
                "{what}.tp_basicsize is {got}, the table says {want}"
            )));
        }
    }
    let Some(main_thread_off) = layout.runtime.main_thread else {
        return Ok(());
    };
    let rt = d.runtime_addr;
    let mut interp = read(rt.wrapping_add(layout.runtime.interpreters_head))?;
    if interp == 0 {
        return Ok(()); // not initialised yet: the type checks are all there is
    }
    for _ in 0..64 {
        match read(interp.wrapping_add(layout.interp.next))? {
            0 => break,
            next => interp = next,
        }
    }
    let main_thread = read(rt.wrapping_add(main_thread_off))?;
    let mut ts = read(interp.wrapping_add(layout.interp.threads_head))?;
    let (mut seen, mut main_seen) = (0, false);
    while ts != 0 && seen < 4096 {
        if read(ts.wrapping_add(layout.tstate.interp))? != interp {
            return Err(refuse(
                "a thread state does not point back at its interpreter".into(),
            ));
        }
        main_seen |= read(ts.wrapping_add(layout.tstate.thread_id))? == main_thread;
        ts = read(ts.wrapping_add(layout.tstate.next))?;
        seen += 1;
    }
    if seen > 0 && !main_seen {
        return Err(refuse(format!(
            "no thread state has the main thread's id {main_thread:#x}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::{Mapping, Perms};
    use crate::python::memory::ImageMemory;
    use crate::python::objects::KnownObjects;
    use crate::python::testimage::{Flavor, ImageBuilder};

    #[test]
    fn version_strings_as_getversion_writes_them() {
        let v = |s: &[u8]| version_in(s).map(|v| (v.to_string(), v.short()));
        let mut buf = vec![7u8; 40];
        buf.extend_from_slice(b"3.9.18 (main, May  9 2026, 07:33:49) \n[GCC 12.2.0]\0\0");
        assert_eq!(v(&buf), Some(("3.9.18".into(), "3.9".into())));
        assert_eq!(
            v(b"\x003.10.0rc2+ (heads/3.10:abc, Oct 1) [GCC]\0"),
            Some(("3.10.0rc2".into(), "3.10".into()))
        );
        assert_eq!(
            v(b"2.7.18 (default, Jan 1 2026, 00:00:00) \n[GCC 12]\0").map(|x| x.1),
            Some("2.7".into())
        );
        // Not a version buffer: no " (", no NUL within 250 bytes, a control byte, a longer
        // number before it.
        assert_eq!(v(b"3.9.18\0"), None);
        assert_eq!(v(&[b"3.9.1 (".as_slice(), &[b'x'; 300]].concat()), None);
        assert_eq!(v(b"3.9.1 (a\x01b)\0"), None);
        assert_eq!(v(b"13.9.1 (x)\0").map(|x| x.1), None);
        // Arbitrary bytes never panic.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let junk: Vec<u8> = (0..64)
                .map(|i| b"3.9 (\0"[(x >> (i % 60)) as usize % 6])
                .collect();
            let _ = version_in(&junk);
        }
    }

    /// A 3.9 image with a main interpreter, one thread state and the fields the checks read.
    fn image(code_basicsize: u64) -> (ImageBuilder, Detected) {
        let mut b = ImageBuilder::new(Flavor::V39);
        let l = b.layout().clone();
        let target = b.target();
        let code_type = target.pycode_type.unwrap();
        b.w64(code_type + l.types.tp_basicsize, code_basicsize);
        b.thread(11, 0x7f00_1234_0000, 0);
        b.w64(
            b.runtime_addr() + l.runtime.main_thread.unwrap(),
            0x7f00_1234_0000,
        );
        let m = Mapping {
            start: 0,
            end: 0,
            file_offset: 0,
            perms: Perms::default(),
            dev: (0, 0),
            inode: 1,
            path: None,
        };
        let d = Detected {
            path: String::new(),
            file: FileId::new(&m, None),
            mapping: m,
            bias: 0,
            runtime_addr: b.runtime_addr(),
            runtime_size: 0,
            py_version_addr: None,
            pycode_type_addr: Some(code_type),
            none_addr: None,
            known: KnownObjects::default(),
            pyframe_type_addr: None,
            bss: None,
            pre_runtime: false,
            pthread_tid_desc: None,
            image: Vec::new(),
        };
        (b, d)
    }

    fn check(mem: &ImageMemory, d: &Detected, layout: &RuntimeLayout) -> Result<(), String> {
        let v = PyVersion::from_hex(0x0309_02f0, false);
        check_binary(mem, 1, d, v, layout).map_err(|e| e.to_string())
    }

    #[test]
    fn built_in_tables_are_checked_against_the_binary() {
        let (b, d) = image(176);
        let layout = b.layout().clone();
        assert_eq!(check(&b.memory(), &d, &layout), Ok(()));
        // A build whose code objects have another size.
        let (b, d) = image(184);
        assert_eq!(
            check(&b.memory(), &d, &layout),
            Err(
                "CPython 3.9.2: layout not recognised (PyCode_Type.tp_basicsize is 184, the \
                 table says 176)"
                    .into()
            )
        );
        // A thread list that does not point back at its interpreter (`interp` moved).
        let (mut b, d) = image(176);
        let ts = b.thread(12, 0x7f00_5678_0000, 0);
        b.w64(ts + layout.tstate.interp, 0x1234);
        let e = check(&b.memory(), &d, &layout).unwrap_err();
        assert!(e.contains("does not point back"), "{e}");
        // `thread_id` elsewhere: no thread state carries the runtime's main thread.
        let (mut b, d) = image(176);
        b.w64(b.runtime_addr() + layout.runtime.main_thread.unwrap(), 0x99);
        let e = check(&b.memory(), &d, &layout).unwrap_err();
        assert!(e.contains("main thread"), "{e}");
    }
}
