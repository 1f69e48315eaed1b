//! Finding the interpreter in a process, by content (never by file name).
//!
//! Owns: a small `/proc/PID/maps` parser, a minimal ELF64 reader (section headers, `.dynsym`,
//! `.symtab`, build-id) and the per-file cache of what a file is ([`ElfInfo`], or "not Python").
//! Input: a pid. Output: the [`Detected`] candidates — every mapped ELF that holds a `.PyRuntime`
//! section or defines `_PyRuntime` — with their load bias, runtime address and the addresses of
//! `Py_Version`, `PyCode_Type` and the [`KnownObjects`] (built-in types and singletons).
//! Constraints: ELF files are untrusted: every offset and size is checked, reads are bounded
//! ([`MAX_TABLE`]), nothing is memory-mapped (no SIGBUS on a truncated file). Files are opened
//! as `/proc/PID/map_files/<start>-<end>`, then `/proc/PID/root/<path>`, then `<path>`
//! (cpython-layouts §1.2: right for containers and for plain chroots). Results are cached per
//! file identity (device, inode) from the maps, so a non-Python process costs one read of its
//! maps once its libraries have been seen.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, LazyLock, Mutex};

use super::PyError;
use super::objects::{KNOWN_SYMBOLS, Known, KnownObjects};

/// Largest symbol or string table read from a file.
const MAX_TABLE: u64 = 64 << 20;
/// Bound of the per-file cache (cleared when full).
const MAX_CACHED_FILES: usize = 8192;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    /// `major << 32 | minor` of the device.
    pub dev: u64,
    pub inode: u64,
    pub path: Option<String>,
}

/// Parses `/proc/PID/maps`; malformed lines are skipped.
pub fn parse_maps(text: &str) -> Vec<MapEntry> {
    text.lines().filter_map(parse_map_line).collect()
}

fn parse_map_line(line: &str) -> Option<MapEntry> {
    let mut it = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let path = it
        .next()
        .map(str::trim_start)
        .filter(|p| !p.is_empty())
        .map(str::to_owned);
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    Some(MapEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms: perms.to_owned(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (u64::from_str_radix(major, 16).ok()? << 32) | u64::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        path,
    })
}

/// A `PT_LOAD` segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

/// What a Python ELF file says about itself (virtual addresses before the load bias).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
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
    pub loads: Vec<Load>,
    pub build_id: Option<Vec<u8>>,
}

/// A mapped Python ELF in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    /// The path as the maps show it (relative to the reader's root).
    pub path: String,
    pub dev: u64,
    pub inode: u64,
    pub bias: u64,
    pub runtime_addr: u64,
    pub runtime_size: u64,
    pub py_version_addr: Option<u64>,
    pub pycode_type_addr: Option<u64>,
    pub none_addr: Option<u64>,
    /// [`ElfInfo::known`] in the process.
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
    pub build_id: Option<Vec<u8>>,
}

type Cache = Mutex<HashMap<(u64, u64), Option<Arc<ElfInfo>>>>;
static CACHE: LazyLock<Cache> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Reads `/proc/PID/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<MapEntry>, PyError> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).map_err(|e| PyError::from_proc_io(pid, path, e))?;
    Ok(parse_maps(&text))
}

/// Every mapped ELF of `pid` that holds a CPython runtime, in maps order.
pub fn detect(pid: u32) -> Result<Vec<Detected>, PyError> {
    let maps = read_maps(pid)?;
    if maps.is_empty() {
        // Kernel threads and zombies have no mappings.
        return Err(PyError::NotPython { pid });
    }
    let mut files: Vec<(u64, u64)> = Vec::new();
    for m in &maps {
        if m.inode != 0
            && m.path.as_deref().is_some_and(|p| p.starts_with('/'))
            && !files.contains(&(m.dev, m.inode))
        {
            files.push((m.dev, m.inode));
        }
    }
    let mut found = Vec::new();
    let mut pthread_tid_desc = None;
    for (dev, inode) in files {
        let mine: Vec<&MapEntry> = maps
            .iter()
            .filter(|m| (m.dev, m.inode) == (dev, inode))
            .collect();
        let Some(info) = elf_info_cached(pid, &mine) else {
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
    Ok(found)
}

fn elf_info_cached(pid: u32, mappings: &[&MapEntry]) -> Option<Arc<ElfInfo>> {
    let first = mappings.first()?;
    let key = (first.dev, first.inode);
    if let Some(hit) = CACHE.lock().ok()?.get(&key) {
        return hit.clone();
    }
    // Unreadable files are not cached: the next attach (e.g. as root) may succeed.
    let file = open_mapped(pid, first)?;
    let info = elf_info(&file).ok().flatten().map(Arc::new);
    let mut cache = CACHE.lock().ok()?;
    if cache.len() >= MAX_CACHED_FILES {
        cache.clear();
    }
    cache.insert(key, info.clone());
    info
}

/// Opens a mapped file in the robust order of cpython-layouts §1.2.
fn open_mapped(pid: u32, m: &MapEntry) -> Option<File> {
    let path = m.path.as_deref()?;
    let candidates = [
        format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end),
        format!("/proc/{pid}/root{path}"),
        path.to_owned(),
    ];
    candidates.iter().find_map(|p| File::open(p).ok())
}

/// Load bias and addresses of a Python ELF as mapped by these mappings.
fn place(info: &ElfInfo, mappings: &[&MapEntry]) -> Detected {
    let lowest = mappings.iter().min_by_key(|m| m.offset).copied();
    let bias = lowest.map_or(0, |m| {
        let load = info.loads.iter().find(|l| {
            (l.offset & !0xfff) <= m.offset && m.offset < l.offset.saturating_add(l.filesz.max(1))
        });
        match load {
            // p_vaddr ≡ p_offset (mod page size), so the page-aligned difference is exact.
            Some(l) => m
                .start
                .wrapping_sub(m.offset)
                .wrapping_add(l.offset)
                .wrapping_sub(l.vaddr),
            None => m.start.wrapping_sub(m.offset),
        }
    });
    Detected {
        path: mappings
            .first()
            .and_then(|m| m.path.clone())
            .unwrap_or_default(),
        dev: mappings.first().map_or(0, |m| m.dev),
        inode: mappings.first().map_or(0, |m| m.inode),
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
        build_id: info.build_id.clone(),
    }
}

/// A malformed ELF (only used internally: such files are "not Python").
#[derive(Debug)]
struct BadElf;

fn read_at(file: &File, off: u64, len: u64) -> Result<Vec<u8>, BadElf> {
    if len > MAX_TABLE {
        return Err(BadElf);
    }
    let mut v = vec![0u8; len as usize];
    file.read_exact_at(&mut v, off).map_err(|_| BadElf)?;
    Ok(v)
}

fn le16(b: &[u8], at: usize) -> Result<u64, BadElf> {
    Ok(u64::from(u16::from_le_bytes(
        b.get(at..at + 2)
            .ok_or(BadElf)?
            .try_into()
            .map_err(|_| BadElf)?,
    )))
}

fn le32(b: &[u8], at: usize) -> Result<u64, BadElf> {
    Ok(u64::from(u32::from_le_bytes(
        b.get(at..at + 4)
            .ok_or(BadElf)?
            .try_into()
            .map_err(|_| BadElf)?,
    )))
}

fn le64(b: &[u8], at: usize) -> Result<u64, BadElf> {
    Ok(u64::from_le_bytes(
        b.get(at..at + 8)
            .ok_or(BadElf)?
            .try_into()
            .map_err(|_| BadElf)?,
    ))
}

struct Section {
    name: u64,
    kind: u64,
    addr: u64,
    offset: u64,
    size: u64,
    link: u64,
}

const SHT_SYMTAB: u64 = 2;
const SHT_NOTE: u64 = 7;
const SHT_DYNSYM: u64 = 11;
const SHT_NOBITS: u64 = 8;
const PT_LOAD: u64 = 1;

/// `Some` when the file is an ELF64 little-endian object that holds a CPython runtime.
fn elf_info(file: &File) -> Result<Option<ElfInfo>, BadElf> {
    let eh = read_at(file, 0, 64)?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Ok(None);
    }
    let (phoff, shoff) = (le64(&eh, 32)?, le64(&eh, 40)?);
    let (phentsize, phnum, shentsize, shnum, shstrndx) = (
        le16(&eh, 54)?,
        le16(&eh, 56)?,
        le16(&eh, 58)?,
        le16(&eh, 60)?,
        le16(&eh, 62)?,
    );
    if shentsize != 64 || shnum == 0 || shstrndx >= shnum || phentsize != 56 {
        return Ok(None);
    }
    let sh = read_at(file, shoff, shnum * 64)?;
    let sections: Vec<Section> = (0..shnum as usize)
        .map(|i| {
            let b = i * 64;
            Ok(Section {
                name: le32(&sh, b)?,
                kind: le32(&sh, b + 4)?,
                addr: le64(&sh, b + 16)?,
                offset: le64(&sh, b + 24)?,
                size: le64(&sh, b + 32)?,
                link: le32(&sh, b + 40)?,
            })
        })
        .collect::<Result<_, BadElf>>()?;
    let shstr = &sections[shstrndx as usize];
    let names = read_at(file, shstr.offset, shstr.size)?;
    let name_of = |s: &Section| -> &[u8] {
        let lo = (s.name as usize).min(names.len());
        let rest = &names[lo..];
        &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
    };
    let mut runtime = sections
        .iter()
        .find(|s| name_of(s) == b".PyRuntime" && s.size > 0)
        .map(|s| (s.addr, s.size));
    let mut wanted: Vec<&[u8]> = vec![b"_PyRuntime", b"Py_Version", b"PyCode_Type"];
    wanted.extend(KNOWN_SYMBOLS.iter().map(|(name, _)| name.as_bytes()));
    // After the known objects: `PyFrame_Type`, `Py_GetVersion`, `_thread_db_pthread_tid`.
    let extra = wanted.len();
    wanted.extend([
        &b"PyFrame_Type"[..],
        b"Py_GetVersion",
        b"_thread_db_pthread_tid",
    ]);
    let mut syms: Vec<Option<(u64, u64)>> = vec![None; wanted.len()];
    let has_symtab = sections.iter().any(|s| s.kind == SHT_SYMTAB);
    for kind in [SHT_DYNSYM, SHT_SYMTAB] {
        // `.symtab` only when `.dynsym` did not settle it (stripped builds keep `.dynsym`).
        let found = runtime.is_some() || syms[0].is_some();
        // (`Py_GetVersion` and the glibc descriptor do not need `.symtab`: both are exported.)
        let settled = found && syms[..=extra].iter().all(Option::is_some);
        // Not Python: every CPython since 3.7 has a `.PyRuntime` section or exports
        // `_PyRuntime` (older ones export `Py_GetVersion`, in `.dynsym`), so a file with
        // neither is rejected without reading its `.symtab` (large in big non-Python binaries).
        if kind == SHT_SYMTAB && (settled || !found || !has_symtab) {
            break;
        }
        for s in sections.iter().filter(|s| s.kind == kind) {
            let strtab = sections.get(s.link as usize).ok_or(BadElf)?;
            find_symbols(file, s, strtab, &wanted, &mut syms)?;
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
        None => return Ok(None),
    };
    let mut known = KnownObjects::default();
    for ((_, k), sym) in KNOWN_SYMBOLS.iter().zip(&syms[3..]) {
        if let Some((addr, _)) = sym {
            known.set(*k, *addr);
        }
    }
    let loads = load_segments(file, phoff, phnum)?;
    let bss = sections
        .iter()
        .find(|s| s.kind == SHT_NOBITS && name_of(s) == b".bss" && s.size > 0)
        .map(|s| (s.addr, s.size));
    let build_id = sections
        .iter()
        .find(|s| s.kind == SHT_NOTE && name_of(s) == b".note.gnu.build-id")
        .and_then(|s| build_id(file, s));
    Ok(Some(ElfInfo {
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
        loads,
        build_id,
    }))
}

/// The `PT_LOAD` segments of the program headers at `phoff`.
fn load_segments(file: &File, phoff: u64, phnum: u64) -> Result<Vec<Load>, BadElf> {
    let ph = read_at(file, phoff, phnum * 56)?;
    let mut loads = Vec::new();
    for i in 0..phnum as usize {
        let b = i * 56;
        if le32(&ph, b)? == PT_LOAD {
            loads.push(Load {
                offset: le64(&ph, b + 8)?,
                vaddr: le64(&ph, b + 16)?,
                filesz: le64(&ph, b + 32)?,
            });
        }
    }
    Ok(loads)
}

fn find_symbols(
    file: &File,
    symtab: &Section,
    strtab: &Section,
    wanted: &[&[u8]],
    out: &mut [Option<(u64, u64)>],
) -> Result<(), BadElf> {
    let syms = read_at(file, symtab.offset, symtab.size)?;
    let strs = read_at(file, strtab.offset, strtab.size)?;
    for sym in syms.chunks_exact(24) {
        let (name, value, size) = (le32(sym, 0)? as usize, le64(sym, 8)?, le64(sym, 16)?);
        let shndx = le16(sym, 6)?;
        if value == 0 || shndx == 0 || name >= strs.len() {
            continue;
        }
        let rest = &strs[name..];
        let n = &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())];
        if let Some(i) = wanted.iter().position(|w| *w == n) {
            out[i].get_or_insert((value, size));
        }
    }
    Ok(())
}

fn build_id(file: &File, s: &Section) -> Option<Vec<u8>> {
    let note = read_at(file, s.offset, s.size.min(256)).ok()?;
    let (namesz, descsz) = (le32(&note, 0).ok()? as usize, le32(&note, 4).ok()? as usize);
    let desc = 12 + namesz.div_ceil(4) * 4;
    note.get(desc..desc + descsz).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let text = "00400000-00452000 r-xp 00000000 fe:00 856707                             /usr/bin/python3.14\n\
                    7f00-8f00 rw-p 00000000 00:00 0 \n\
                    7ffd000-7ffe000 rw-p 00000000 00:00 0                          [stack]\n\
                    garbage\n\
                    1000-2000 r--p 00001000 08:01 42 /tmp/a file (deleted)\n";
        let m = parse_maps(text);
        assert_eq!(m.len(), 4);
        assert_eq!(
            (m[0].start, m[0].dev, m[0].inode),
            (0x40_0000, 0xfe << 32, 856_707)
        );
        assert_eq!(m[0].path.as_deref(), Some("/usr/bin/python3.14"));
        assert_eq!(m[1].path, None);
        assert_eq!(m[3].path.as_deref(), Some("/tmp/a file (deleted)"));
        assert_eq!(m[3].offset, 0x1000);
    }

    #[test]
    fn bias_from_the_lowest_mapping() {
        let info = ElfInfo {
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
            loads: vec![
                Load {
                    offset: 0,
                    vaddr: 0,
                    filesz: 0x1000,
                },
                Load {
                    offset: 0x64_2000,
                    vaddr: 0x64_3000,
                    filesz: 0x1_0000,
                },
            ],
            build_id: None,
        };
        let m = MapEntry {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
            perms: "r--p".into(),
            offset: 0,
            dev: 1,
            inode: 2,
            path: Some("/lib/x.so".into()),
        };
        let d = place(&info, &[&m]);
        assert_eq!(d.bias, 0x7f00_0000_0000);
        assert_eq!(d.runtime_addr, 0x7f00_0064_3340);
        // Only the data mapping is visible: the bias must come out the same.
        let data = MapEntry {
            start: 0x7f00_0064_3000,
            offset: 0x64_2000,
            ..m
        };
        assert_eq!(place(&info, &[&data]).bias, 0x7f00_0000_0000);
    }

    #[test]
    fn rejects_non_elf_and_finds_nothing_in_a_non_python_elf() {
        let me = File::open("/proc/self/exe").unwrap();
        assert!(
            elf_info(&me).unwrap().is_none(),
            "the test binary has no _PyRuntime"
        );
        let text = File::open("/proc/self/maps").unwrap();
        assert!(matches!(elf_info(&text), Ok(None) | Err(BadElf)));
        let maps = read_maps(std::process::id()).unwrap();
        assert!(
            maps.iter()
                .any(|m| m.path.as_deref().is_some_and(|p| p.starts_with('/')))
        );
        assert!(detect(std::process::id()).unwrap().is_empty());
    }
}
