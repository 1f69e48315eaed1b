//! Finding the interpreter in a process, by content (never by file name).
//!
//! Owns: what makes a mapped ELF file a CPython runtime ([`PythonElf`]: a `.PyRuntime` section
//! or a defined `_PyRuntime`, with `Py_Version`, `PyCode_Type`, `PyFrame_Type`, `.bss` (the
//! version string of ≤ 3.10) and the [`KnownObjects`]: built-in types and singletons such as
//! `_Py_NoneStruct`; or, before 3.7, an exported `Py_GetVersion`), glibc's
//! `_thread_db_pthread_tid` descriptor in whichever file has it, the
//! per-file cache of that verdict, and placing it in a process ([`Detected`]: load bias and
//! absolute addresses).
//! Input: a pid. Output: the [`Detected`] candidates, in maps order.
//! Constraints: everything about processes and files is asked of `procs` — its maps parser
//! ([`crate::procs::read_mappings`]), its file opening order (`map_files`, then the process's
//! root, then the printed path: right for containers and for plain chroots) and its ELF layer
//! (bounded reads, nothing mapped). Results are cached per file identity (device, inode) from
//! the maps, so a non-Python process costs one read of its maps once its libraries were seen.

use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use crate::lru::Lru;
use crate::procs::elf::{
    ElfInfo, ReadAt, SymbolTable, SymbolTableKind, read_elf_info, read_symbols,
};
use crate::procs::{FileId, Mapping, open_mapped_file_in};

use super::PyError;
use super::objects::{KNOWN_SYMBOLS, Known, KnownObjects};

/// Largest symbol or string table read from a file.
const MAX_TABLE: u64 = 64 << 20;
/// `SHT_NOBITS` (`.bss`).
const SHT_NOBITS: u32 = 8;
/// Files whose verdict is remembered.
const MAX_CACHED_FILES: usize = 8192;

/// What a Python ELF file says about itself (virtual addresses before the load bias).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonElf {
    /// `_PyRuntime` (== the `.PyRuntime` section start where there is one).
    pub runtime: u64,
    /// `sizeof(_PyRuntimeState)` from the section or symbol size (0 if unknown).
    pub runtime_size: u64,
    pub py_version: Option<u64>,
    pub pycode_type: Option<u64>,
    /// `_Py_NoneStruct` (entry frames of 3.13+ carry it as their executable).
    pub none: Option<u64>,
    /// The static types and singletons the reader recognises by address.
    pub known: KnownObjects,
    /// `PyFrame_Type` (its `tp_basicsize` is checked against built-in tables).
    pub pyframe_type: Option<u64>,
    /// `.bss` (address, size): holds `Py_GetVersion()`'s buffer, the version of builds
    /// without `Py_Version` (≤ 3.10).
    pub bss: Option<(u64, u64)>,
    /// The file exports `Py_GetVersion` but no `_PyRuntime`: a CPython older than 3.7.
    pub pre_runtime: bool,
    /// glibc's `_thread_db_pthread_tid` (any file, Python or not).
    pub pthread_tid_desc: Option<u64>,
    /// The file's headers (load segments for the bias, build-id for its identity).
    pub elf: ElfInfo,
}

/// A mapped Python ELF in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The path as the maps show it (relative to the reader's root), for messages.
    pub path: String,
    /// Device, inode and build-id: the key of every per-file cache.
    pub file: FileId,
    /// The file's first mapping in maps order (how `procs` opens the file again).
    pub mapping: Mapping,
    pub bias: u64,
    pub runtime_addr: u64,
    pub runtime_size: u64,
    pub py_version_addr: Option<u64>,
    pub pycode_type_addr: Option<u64>,
    pub none_addr: Option<u64>,
    /// [`PythonElf::known`] in the process.
    pub known: KnownObjects,
    pub pyframe_type_addr: Option<u64>,
    /// `.bss` of the file in the target (address, size).
    pub bss: Option<(u64, u64)>,
    /// A CPython older than 3.7 (no `_PyRuntime`; `runtime_addr` is 0).
    pub pre_runtime: bool,
    /// Where glibc's `_thread_db_pthread_tid` descriptor is in the target (any mapped file).
    pub pthread_tid_desc: Option<u64>,
    /// Address ranges of the file's mappings.
    pub image: Vec<(u64, u64)>,
}

/// Per (device, inode): the file's verdict (`None`: not Python).
type Cache = Mutex<Lru<((u32, u32), u64), Option<Arc<PythonElf>>>>;
static CACHE: LazyLock<Cache> = LazyLock::new(|| Mutex::new(Lru::new(MAX_CACHED_FILES)));

/// Every mapped ELF of `pid` that holds a CPython runtime, in maps order.
pub fn detect(pid: u32) -> Result<Vec<Detected>, PyError> {
    let maps = crate::procs::read_mappings(pid)
        .map_err(|e| PyError::from_proc_io(pid, format!("/proc/{pid}/maps"), e))?;
    if maps.is_empty() {
        // Kernel threads and zombies have no mappings.
        return Err(PyError::NotPython { pid });
    }
    Ok(detect_in(&maps, &|mine| python_elf_cached(pid, mine)))
}

/// The CPython runtimes among `maps` (grouped by file), in maps order; `python_elf` says what
/// one file's mappings hold (`detect` caches it per file; a core's files are not cached).
pub fn detect_in(
    maps: &[Mapping],
    python_elf: &dyn Fn(&[&Mapping]) -> Option<Arc<PythonElf>>,
) -> Vec<Detected> {
    let mut files: Vec<((u32, u32), u64)> = Vec::new();
    for m in maps.iter().filter(|m| m.is_file_backed()) {
        if !files.contains(&(m.dev, m.inode)) {
            files.push((m.dev, m.inode));
        }
    }
    let mut found = Vec::new();
    let mut pthread_tid_desc = None;
    for key in files {
        let mine: Vec<&Mapping> = maps.iter().filter(|m| (m.dev, m.inode) == key).collect();
        let Some(info) = python_elf(&mine) else {
            continue;
        };
        let placed = place(&info, &mine);
        if let Some(d) = info.pthread_tid_desc {
            pthread_tid_desc.get_or_insert(d.wrapping_add(placed.bias));
        }
        if info.runtime != 0 || info.pre_runtime {
            found.push(placed);
        }
    }
    for d in &mut found {
        d.pthread_tid_desc = pthread_tid_desc;
    }
    found
}

fn python_elf_cached(pid: u32, mappings: &[&Mapping]) -> Option<Arc<PythonElf>> {
    let first = mappings.first()?;
    let key = (first.dev, first.inode);
    if let Some(hit) = CACHE.lock().ok()?.get(&key) {
        return hit.clone();
    }
    // Unreadable files are not cached: the next attach (e.g. as root) may succeed.
    let (file, _) = open_mapped_file_in(Path::new("/proc"), pid, first).ok()?;
    let info = python_elf(&file).map(Arc::new);
    CACHE.lock().ok()?.insert(key, info.clone());
    info
}

/// The CPython runtime an ELF file holds, if any (malformed files are not Python).
pub fn python_elf(file: &(impl ReadAt + ?Sized)) -> Option<PythonElf> {
    let elf = read_elf_info(file).ok()?;
    let mut runtime = elf
        .section(b".PyRuntime")
        .filter(|s| s.size > 0)
        .map(|s| (s.addr, s.size));
    let mut wanted: Vec<&[u8]> = vec![b"_PyRuntime", b"Py_Version", b"PyCode_Type"];
    wanted.extend(KNOWN_SYMBOLS.iter().map(|(name, _)| name.as_bytes()));
    // After the known objects: `PyFrame_Type`, `Py_GetVersion`, `_thread_db_pthread_tid`,
    // `pthread_create`.
    let extra = wanted.len();
    wanted.extend([
        &b"PyFrame_Type"[..],
        b"Py_GetVersion",
        b"_thread_db_pthread_tid",
        b"pthread_create",
    ]);
    let mut syms: Vec<Option<(u64, u64)>> = vec![None; wanted.len()];
    for kind in [SymbolTableKind::Dynamic, SymbolTableKind::Static] {
        // `.symtab` only when `.dynsym` did not settle it (stripped builds keep `.dynsym`;
        // `Py_GetVersion` is always exported).
        let found = runtime.is_some() || syms[0].is_some();
        let settled = found && syms[..=extra].iter().all(Option::is_some);
        // glibc before 2.34 keeps the descriptor as a local symbol of libpthread's `.symtab`
        // (Debian leaves it there for debuggers): read it in the file that defines
        // `pthread_create`.
        let want_tid = syms[extra + 2].is_none() && syms[extra + 3].is_some();
        // Not Python: every CPython since 3.7 has a `.PyRuntime` section or exports
        // `_PyRuntime` (older ones export `Py_GetVersion`, in `.dynsym`), so a file with
        // neither is rejected without reading its `.symtab` (large in big non-Python binaries).
        if kind == SymbolTableKind::Static
            && ((settled || !found) && !want_tid || !elf.has_symtab())
        {
            break;
        }
        let table = read_symbols(file, &elf, kind, MAX_TABLE).ok()?;
        for sym in table.iter().flat_map(SymbolTable::iter) {
            if sym.value == 0 || !sym.defined {
                continue;
            }
            if let Some(i) = wanted.iter().position(|w| *w == sym.name) {
                syms[i].get_or_insert((sym.value, sym.size));
            }
        }
    }
    if runtime.is_none() {
        runtime = syms[0];
    }
    // glibc's descriptor of `struct pthread`'s `tid` (libc.so.6 from 2.34, libpthread.so.0
    // before): files that carry it are kept for it, Python or not.
    let pthread_tid_desc = syms[extra + 2].map(|s| s.0);
    // A CPython older than 3.7 has no `_PyRuntime` but exports `Py_GetVersion`.
    let pre_runtime = runtime.is_none() && syms[extra + 1].is_some() && syms[2].is_some();
    let (runtime, runtime_size) = match runtime {
        Some(r) => r,
        None if pre_runtime || pthread_tid_desc.is_some() => (0, 0),
        None => return None,
    };
    let bss = elf
        .section(b".bss")
        .filter(|s| s.sh_type == SHT_NOBITS && s.size > 0)
        .map(|s| (s.addr, s.size));
    let mut known = KnownObjects::default();
    for ((_, k), sym) in KNOWN_SYMBOLS.iter().zip(&syms[3..]) {
        if let Some((addr, _)) = sym {
            known.set(*k, *addr);
        }
    }
    Some(PythonElf {
        runtime,
        runtime_size,
        py_version: syms[1].map(|s| s.0),
        pycode_type: syms[2].map(|s| s.0),
        none: known.get(Known::None),
        known,
        pyframe_type: syms[extra].map(|s| s.0),
        bss,
        pre_runtime,
        pthread_tid_desc,
        elf,
    })
}

/// Load bias and addresses of a Python ELF as mapped by these mappings.
fn place(info: &PythonElf, mappings: &[&Mapping]) -> Detected {
    let lowest = mappings.iter().min_by_key(|m| m.file_offset).copied();
    let bias = lowest.map_or(0, |m| {
        let load = info.elf.loads.iter().find(|l| {
            (l.offset & !0xfff) <= m.file_offset
                && m.file_offset < l.offset.saturating_add(l.filesz.max(1))
        });
        match load {
            // p_vaddr ≡ p_offset (mod page size), so the page-aligned difference is exact.
            Some(l) => m
                .start
                .wrapping_sub(m.file_offset)
                .wrapping_add(l.offset)
                .wrapping_sub(l.vaddr),
            None => m.start.wrapping_sub(m.file_offset),
        }
    });
    let first = mappings[0];
    Detected {
        path: first
            .path
            .as_deref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        file: FileId::new(first, info.elf.build_id.clone()),
        mapping: first.clone(),
        bias,
        runtime_addr: info.runtime.wrapping_add(bias),
        runtime_size: info.runtime_size,
        py_version_addr: info.py_version.map(|a| a.wrapping_add(bias)),
        pycode_type_addr: info.pycode_type.map(|a| a.wrapping_add(bias)),
        none_addr: info.none.map(|a| a.wrapping_add(bias)),
        known: info.known.biased(bias),
        pyframe_type_addr: info.pyframe_type.map(|a| a.wrapping_add(bias)),
        bss: info.bss.map(|(a, n)| (a.wrapping_add(bias), n)),
        pre_runtime: info.pre_runtime,
        pthread_tid_desc: None,
        image: mappings.iter().map(|m| (m.start, m.end)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::Perms;
    use crate::procs::elf::LoadSegment;

    #[test]
    fn bias_from_the_lowest_mapping() {
        let load = |offset, vaddr, filesz| LoadSegment {
            offset,
            vaddr,
            filesz,
            memsz: filesz,
            flags: 4,
        };
        let info = PythonElf {
            runtime: 0x64_3340,
            runtime_size: 1,
            py_version: None,
            pycode_type: None,
            none: None,
            known: KnownObjects::default(),
            pyframe_type: None,
            bss: None,
            pre_runtime: false,
            pthread_tid_desc: None,
            elf: ElfInfo {
                loads: vec![load(0, 0, 0x1000), load(0x64_2000, 0x64_3000, 0x1_0000)],
                ..ElfInfo::default()
            },
        };
        let m = Mapping {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
            perms: Perms::default(),
            file_offset: 0,
            dev: (0, 1),
            inode: 2,
            path: Some("/lib/x.so".into()),
        };
        let d = place(&info, &[&m]);
        assert_eq!(d.bias, 0x7f00_0000_0000);
        assert_eq!(d.runtime_addr, 0x7f00_0064_3340);
        assert_eq!(d.path, "/lib/x.so");
        // Only the data mapping is visible: the bias must come out the same.
        let data = Mapping {
            start: 0x7f00_0064_3000,
            file_offset: 0x64_2000,
            ..m
        };
        assert_eq!(place(&info, &[&data]).bias, 0x7f00_0000_0000);
    }

    #[test]
    fn rejects_non_elf_and_finds_nothing_in_a_non_python_elf() {
        let me = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(
            python_elf(&me).is_none(),
            "the test binary has no _PyRuntime"
        );
        let text = std::fs::File::open("/proc/self/maps").unwrap();
        assert!(python_elf(&text).is_none());
        let maps = crate::procs::read_mappings(std::process::id()).unwrap();
        assert!(maps.iter().any(Mapping::is_file_backed));
        assert!(detect(std::process::id()).unwrap().is_empty());
    }
}
