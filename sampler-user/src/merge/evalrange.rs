//! Eval-loop address ranges: which native addresses are `_PyEval_EvalFrameDefault`.
//!
//! Owns: finding every piece of the eval loop in the interpreter's ELF file — the symbol itself
//! and each `_PyEval_EvalFrameDefault.<suffix>` piece (`.cold`, `.part.N`, …) from `.symtab`
//! and `.dynsym` — and, for a stripped file, in its separate debug file
//! (`/usr/lib/debug/.build-id/xx/yyyy.debug`, looked up inside the target's root first, then
//! on the host; its build-id must match), else from `.eh_frame`: the `.cold` parts the exported
//! symbol jumps into ([`ehframe`]). Results are cached per file identity (device, inode,
//! build-id), so each build is read once per run (style rule 7).
//! Input: an attached interpreter's [`Detected`] file. Output: [`FileEvalRanges`] (file
//! addresses), turned into absolute [`EvalRanges`] per process with its load bias, which
//! [`EvalLoops`] keeps for the merge (the one place that asks for them, when it first merges
//! a sample of the process).
//! Constraints: files are untrusted: tables are bounded ([`MAX_TABLE`]); no panics. Why the
//! pieces matter: Debian's 3.14/3.15 run their bytecode handlers in a `.cold` part 1.4 MB below
//! the hot symbol, and only the debug file names it (docs/cpython-layouts.md §9).

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use crate::lru::Lru;
use crate::procs::elf::{
    ElfError, ReadAt, SHT_NOBITS, STT_FUNC, SymbolTable, SymbolTableKind, read_elf_info,
    read_section, read_symbols,
};
use crate::procs::{FileId, Process, open_mapped_file};
use crate::python::Detected;

use super::{Role, ehframe};

/// Largest symbol or string table read.
const MAX_TABLE: u64 = 64 << 20;
/// Most cached files.
const MAX_CACHED: usize = 256;
/// The eval loop's symbol.
const EVAL: &[u8] = b"_PyEval_EvalFrameDefault";

/// One piece of the eval loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvalRange {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// [`Role::Eval`], or [`Role::EvalClone`] for a `.part` body called by the eval loop.
    pub role: Role,
}

/// The eval-loop pieces of one file, in file (link-time) addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEvalRanges {
    /// The pieces, sorted by address.
    pub ranges: Vec<EvalRange>,
    /// The file the symbols came from (the debug file for a stripped binary).
    pub symbols_from: String,
    /// The file has no `.symtab`, no debug file was found and `.eh_frame` showed no `.cold`
    /// part: local pieces may be missing, and merges of samples in them will be counted as
    /// mismatches.
    pub incomplete: bool,
}

/// Why no ranges could be found.
#[derive(Debug, thiserror::Error)]
pub enum EvalRangeError {
    /// The interpreter file could not be opened by any path.
    #[error("cannot open {path}")]
    Open {
        /// Its path in the target.
        path: String,
    },
    /// The file is not a readable ELF.
    #[error("{path}: {source}")]
    Elf {
        /// Its path.
        path: String,
        /// Why.
        source: ElfError,
    },
    /// No `_PyEval_EvalFrameDefault` symbol anywhere.
    #[error("no _PyEval_EvalFrameDefault symbol in {path}")]
    NoSymbol {
        /// The file.
        path: String,
    },
}

/// Absolute eval-loop ranges of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvalRanges {
    ranges: Vec<EvalRange>,
}

impl EvalRanges {
    /// The ranges of `file` loaded with `bias`.
    pub fn new(file: &FileEvalRanges, bias: u64) -> Self {
        let mut ranges: Vec<EvalRange> = file
            .ranges
            .iter()
            .map(|r| EvalRange {
                start: r.start.wrapping_add(bias),
                end: r.end.wrapping_add(bias),
                role: r.role,
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        EvalRanges { ranges }
    }

    /// The role of the code at `addr` (a lookup address: the ip, or a return address − 1).
    pub fn role(&self, addr: u64) -> Role {
        let i = self.ranges.partition_point(|r| r.start <= addr);
        match i.checked_sub(1).map(|i| &self.ranges[i]) {
            Some(r) if addr < r.end => r.role,
            _ => Role::Other,
        }
    }

    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// No pieces.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// The role of a symbol named `name`, if it is a piece of the eval loop: the symbol itself and
/// its `.cold`/`.lto_priv`/`.constprop`/`.isra` pieces and clones run an activation on their own
/// frame; a `.part` body is called by the function's head (partial inlining).
pub fn symbol_role(name: &[u8]) -> Option<Role> {
    let rest = name.strip_prefix(EVAL)?;
    if rest.is_empty() {
        return Some(Role::Eval);
    }
    let suffix = rest.strip_prefix(b".")?;
    let is_part = suffix.split(|&c| c == b'.').any(|c| c == b"part");
    Some(if is_part { Role::EvalClone } else { Role::Eval })
}

/// Eval-loop pieces among `symbols`.
pub fn ranges_from_symbols(symbols: &SymbolTable) -> Vec<EvalRange> {
    let mut out = Vec::new();
    for sym in symbols.iter() {
        if sym.kind != STT_FUNC || !sym.defined || sym.size == 0 || sym.value == 0 {
            continue;
        }
        if let Some(role) = symbol_role(sym.name) {
            let r = EvalRange {
                start: sym.value,
                end: sym.value.saturating_add(sym.size),
                role,
            };
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// What one ELF file says about the eval loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfEvalPieces {
    /// The pieces found, sorted by address.
    pub ranges: Vec<EvalRange>,
    /// The file has a `.symtab` (is not stripped): its local pieces are all there.
    pub has_symtab: bool,
    /// Its GNU build-id.
    pub build_id: Option<Vec<u8>>,
}

/// Eval-loop pieces in one ELF file.
pub fn ranges_in_elf(r: &(impl ReadAt + ?Sized)) -> Result<ElfEvalPieces, ElfError> {
    let info = read_elf_info(r)?;
    let mut out = Vec::new();
    let mut has_symtab = false;
    for kind in [SymbolTableKind::Static, SymbolTableKind::Dynamic] {
        let Ok(Some(symbols)) = read_symbols(r, &info, kind, MAX_TABLE) else {
            continue;
        };
        has_symtab |= kind == SymbolTableKind::Static && !symbols.is_empty();
        for range in ranges_from_symbols(&symbols) {
            if !out.contains(&range) {
                out.push(range);
            }
        }
    }
    out.sort_by_key(|r| r.start);
    Ok(ElfEvalPieces {
        ranges: out,
        has_symtab,
        build_id: info.build_id,
    })
}

/// Largest function whose code is scanned for jumps into its `.cold` parts.
const MAX_SCANNED_CODE: u64 = 1 << 20;

/// The fragment FDEs (`.cold` parts) that the eval-loop pieces in `known` jump into.
pub fn fragments_from_eh_frame(r: &(impl ReadAt + ?Sized), known: &[EvalRange]) -> Vec<EvalRange> {
    let Ok(info) = read_elf_info(r) else {
        return Vec::new();
    };
    let Some(all) = info.section(b".eh_frame").and_then(|eh| {
        Some(ehframe::fdes(
            &read_section(r, eh, MAX_TABLE).ok()?,
            eh.addr,
        ))
    }) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for k in known.iter().filter(|k| k.role == Role::Eval) {
        let len = k.end.saturating_sub(k.start);
        // The code bytes, through the section that holds them.
        let Some(sec) = info
            .sections
            .iter()
            .find(|s| s.sh_type != SHT_NOBITS && s.svma_range().contains(&k.start))
        else {
            continue;
        };
        if len == 0 || len > MAX_SCANNED_CODE || k.end > sec.svma_range().end {
            continue;
        }
        // The section header is untrusted: its file offset may be anything.
        let Some(offset) = k
            .start
            .checked_sub(sec.addr)
            .and_then(|d| sec.offset.checked_add(d))
        else {
            continue;
        };
        let mut code = vec![0u8; len as usize];
        if !matches!(r.read_at(&mut code, offset), Ok(n) if n == code.len()) {
            continue;
        }
        for f in ehframe::jumped_fragments(&code, k.start, &all) {
            let piece = EvalRange {
                start: f.start,
                end: f.end,
                role: Role::Eval,
            };
            if !out.contains(&piece) && !known.contains(&piece) {
                out.push(piece);
            }
        }
    }
    out
}

/// Candidate paths of the debug file of `build_id`: inside the target's root, then the host's.
pub fn debug_file_paths(root: &Path, build_id: &[u8]) -> Vec<PathBuf> {
    let Some((first, rest)) = build_id.split_first() else {
        return Vec::new();
    };
    let hex = rest.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    let rel = format!("usr/lib/debug/.build-id/{first:02x}/{hex}.debug");
    vec![root.join(&rel), Path::new("/").join(rel)]
}

/// Most processes whose ranges [`EvalLoops`] keeps.
const MAX_PROCESSES: usize = 4096;

/// What may be wrong with a process's eval-loop ranges, reported once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalRangeIssue {
    /// None were found: the merge cannot place that process's Python frames.
    Missing,
    /// Local pieces may be missing (a stripped file without its debug file).
    Incomplete,
}

/// The eval-loop ranges of the processes of a run, as the merge asks for them: found the first
/// time a process's sample is merged (the file's pieces are read once per build, see
/// [`file_eval_ranges`]), kept per process, forgotten when it execs or exits.
pub struct EvalLoops {
    by_pid: Lru<u32, Option<Arc<EvalRanges>>>,
}

impl Default for EvalLoops {
    fn default() -> Self {
        EvalLoops {
            by_pid: Lru::new(MAX_PROCESSES),
        }
    }
}

impl EvalLoops {
    /// The ranges of process `pid`, whose interpreter file is `interp`; the first time, also
    /// what is wrong with them.
    pub fn get(
        &mut self,
        pid: u32,
        interp: &Detected,
    ) -> (Option<Arc<EvalRanges>>, Option<EvalRangeIssue>) {
        if let Some(r) = self.by_pid.get(&pid) {
            return (r.clone(), None);
        }
        let (ranges, issue) = match file_eval_ranges(pid, interp) {
            Ok(f) => (
                Some(Arc::new(EvalRanges::new(&f, interp.bias))),
                f.incomplete.then_some(EvalRangeIssue::Incomplete),
            ),
            Err(e) => {
                tracing::debug!("pid {pid}: no eval-loop ranges: {e}");
                (None, Some(EvalRangeIssue::Missing))
            }
        };
        self.by_pid.insert(pid, ranges.clone());
        (ranges, issue)
    }

    /// Forgets `pid` (it exec'd or exited).
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }
}

type Cache = Mutex<Lru<FileId, Arc<FileEvalRanges>>>;
static CACHE: LazyLock<Cache> = LazyLock::new(|| Mutex::new(Lru::new(MAX_CACHED)));

/// The eval-loop pieces of the interpreter file `d` of `pid`, computed once per file.
pub fn file_eval_ranges(pid: u32, d: &Detected) -> Result<Arc<FileEvalRanges>, EvalRangeError> {
    ranges_with(
        d,
        || open_mapped_file(pid, &d.mapping),
        &PathBuf::from(format!("/proc/{pid}/root")),
    )
}

/// [`file_eval_ranges`] for a process of the registry that is not read through `/proc` (one
/// known from a core file): its files are opened the way the process opens them.
pub fn file_eval_ranges_of(
    proc: &Process,
    d: &Detected,
) -> Result<Arc<FileEvalRanges>, EvalRangeError> {
    ranges_with(
        d,
        || proc.open_mapping(&d.mapping).map(|m| m.file),
        &proc.root,
    )
}

/// The eval-loop pieces of `d`, opened by `open`; debug files under `root` (then the host's).
fn ranges_with(
    d: &Detected,
    open: impl FnOnce() -> std::io::Result<File>,
    root: &Path,
) -> Result<Arc<FileEvalRanges>, EvalRangeError> {
    if let Some(hit) = CACHE.lock().ok().and_then(|mut c| c.get(&d.file).cloned()) {
        return Ok(hit);
    }
    let file = open().map_err(|_| EvalRangeError::Open {
        path: d.path.clone(),
    })?;
    let ElfEvalPieces {
        mut ranges,
        has_symtab,
        build_id,
    } = ranges_in_elf(&file).map_err(|source| EvalRangeError::Elf {
        path: d.path.clone(),
        source,
    })?;
    let mut symbols_from = d.path.clone();
    let mut incomplete = false;
    if !has_symtab {
        incomplete = true;
        let id = build_id
            .or_else(|| d.file.build_id.clone())
            .unwrap_or_default();
        for p in debug_file_paths(root, &id) {
            let Ok(f) = File::open(&p) else { continue };
            // A debug file of another build would give wrong addresses.
            let Ok(dbg) = ranges_in_elf(&f) else {
                continue;
            };
            if dbg.build_id.as_deref() != Some(&id[..]) {
                continue;
            }
            for r in dbg.ranges {
                if !ranges.contains(&r) {
                    ranges.push(r);
                }
            }
            ranges.sort_by_key(|r| r.start);
            symbols_from = p.display().to_string();
            incomplete = false;
            break;
        }
        if incomplete {
            // No debug file: the `.cold` parts the exported symbol jumps into, from `.eh_frame`.
            let extra = fragments_from_eh_frame(&file, &ranges);
            incomplete = extra.is_empty();
            if !incomplete {
                symbols_from = format!("{} (.dynsym + .eh_frame)", d.path);
            }
            ranges.extend(extra);
            ranges.sort_by_key(|r| r.start);
        }
    }
    if ranges.is_empty() {
        return Err(EvalRangeError::NoSymbol {
            path: d.path.clone(),
        });
    }
    let out = Arc::new(FileEvalRanges {
        ranges,
        symbols_from,
        incomplete,
    });
    if let Ok(mut c) = CACHE.lock() {
        c.insert(d.file.clone(), Arc::clone(&out));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name_off: u32, info: u8, shndx: u16, value: u64, size: u64) -> Vec<u8> {
        let mut s = Vec::new();
        s.extend_from_slice(&name_off.to_le_bytes());
        s.push(info);
        s.push(0);
        s.extend_from_slice(&shndx.to_le_bytes());
        s.extend_from_slice(&value.to_le_bytes());
        s.extend_from_slice(&size.to_le_bytes());
        s
    }

    #[test]
    fn roles_of_symbol_names() {
        assert_eq!(symbol_role(b"_PyEval_EvalFrameDefault"), Some(Role::Eval));
        assert_eq!(
            symbol_role(b"_PyEval_EvalFrameDefault.cold"),
            Some(Role::Eval)
        );
        assert_eq!(
            symbol_role(b"_PyEval_EvalFrameDefault.lto_priv.0"),
            Some(Role::Eval)
        );
        assert_eq!(
            symbol_role(b"_PyEval_EvalFrameDefault.part.0"),
            Some(Role::EvalClone)
        );
        assert_eq!(
            symbol_role(b"_PyEval_EvalFrameDefault.part.0.cold"),
            Some(Role::EvalClone)
        );
        assert_eq!(symbol_role(b"_PyEval_EvalFrameDefaultX"), None);
        assert_eq!(symbol_role(b"_PyEval_EvalFrame"), None);
        assert_eq!(symbol_role(b"_PyEvalFramePushAndInit.cold"), None);
    }

    #[test]
    fn cold_piece_far_below_the_hot_symbol() {
        const HOT: u64 = 0x0059_8b80;
        const COLD: u64 = 0x0043_fb58;
        // Debian 3.14.10's layout: hot 0x598b80 (1184 bytes), .cold 0x43fb58 (84423 bytes).
        let strs = b"\0_PyEval_EvalFrameDefault\0_PyEval_EvalFrameDefault.cold\0other\0";
        let mut syms = sym(0, 0, 0, 0, 0); // the null symbol
        syms.extend(sym(1, 0x12, 12, HOT, 1184)); // GLOBAL FUNC
        syms.extend(sym(26, 0x02, 12, COLD, 84423)); // LOCAL FUNC
        syms.extend(sym(56, 0x12, 12, COLD + 84423, 64)); // right after .cold
        syms.extend(sym(1, 0x11, 12, 0x1000, 8)); // an OBJECT named like it: ignored
        syms.extend(sym(1, 0x12, 0, 0x2000, 8)); // undefined: ignored
        let found = ranges_from_symbols(&SymbolTable::from_bytes(syms, strs.to_vec()));
        assert_eq!(found.len(), 2, "{found:?}");
        let file = FileEvalRanges {
            ranges: found,
            symbols_from: "x".into(),
            incomplete: false,
        };
        for bias in [0, 0x7f00_0000_0000] {
            let r = EvalRanges::new(&file, bias);
            assert_eq!(r.len(), 2);
            assert_eq!(r.role(bias + HOT), Role::Eval);
            assert_eq!(r.role(bias + HOT + 1183), Role::Eval);
            assert_eq!(r.role(bias + HOT + 1184), Role::Other);
            assert_eq!(
                r.role(bias + COLD + 40_000),
                Role::Eval,
                ".cold is the eval loop"
            );
            assert_eq!(
                r.role(bias + COLD + 84423),
                Role::Other,
                "the next function"
            );
            assert_eq!(r.role(bias + COLD - 1), Role::Other);
            assert_eq!(r.role(0), Role::Other);
        }
    }

    #[test]
    fn garbage_tables_do_not_panic() {
        let table = |syms: Vec<u8>, strs: &[u8]| SymbolTable::from_bytes(syms, strs.to_vec());
        assert!(ranges_from_symbols(&table(vec![0xff; 100], b"")).is_empty());
        let syms = sym(u32::MAX, 0x12, 1, 0x10, 0x10);
        assert!(ranges_from_symbols(&table(syms, b"\0")).is_empty());
        assert!(ranges_in_elf(&b"\x7fELF garbage"[..]).is_err());
    }

    #[test]
    fn debug_paths_inside_the_root_first() {
        let p = debug_file_paths(Path::new("/proc/42/root"), &[0xcc, 0xcd, 0xa1]);
        assert_eq!(
            p,
            [
                PathBuf::from("/proc/42/root/usr/lib/debug/.build-id/cc/cda1.debug"),
                PathBuf::from("/usr/lib/debug/.build-id/cc/cda1.debug")
            ]
        );
        assert!(debug_file_paths(Path::new("/"), &[]).is_empty());
    }

    /// Real files: the pyenv 3.12 libpython has a `.symtab` (with a small `.cold`); Debian's
    /// 3.14 in the sid root is stripped and its `-dbg` debug file gives the `.cold` part.
    #[test]
    fn real_interpreter_files() {
        let lib = "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0";
        if let Ok(f) = File::open(lib) {
            let p = ranges_in_elf(&f).unwrap();
            assert!(p.has_symtab);
            assert!(p.ranges.len() >= 2, "3.12 libpython: {:?}", p.ranges);
        } else {
            crate::procs::tests::missing(&format!("{lib} not found"));
        }
        let sid = "/var/cache/pyebpf-test/roots/sid";
        let Ok(f) = File::open(format!("{sid}/usr/bin/python3.14")) else {
            crate::procs::tests::missing(&format!("no Debian 3.14 in {sid}"));
            return;
        };
        let exe = ranges_in_elf(&f).unwrap();
        assert!(!exe.has_symtab, "Debian's python3.14 is stripped");
        assert_eq!(
            exe.ranges.len(),
            1,
            "only the exported hot part: {:?}",
            exe.ranges
        );
        let id = exe.build_id.expect("build-id");
        let dbg = debug_file_paths(Path::new(sid), &id).remove(0);
        let Ok(d) = File::open(&dbg) else {
            crate::procs::tests::missing(&format!("no debug file for python3.14 in {sid}"));
            return;
        };
        let dbg_pieces = ranges_in_elf(&d).unwrap();
        assert_eq!(dbg_pieces.build_id.as_deref(), Some(&id[..]));
        assert!(
            dbg_pieces.ranges.len() >= 2,
            "hot + .cold: {:?}",
            dbg_pieces.ranges
        );
        // Without the debug file, `.eh_frame` finds the same `.cold` piece.
        let from_eh = fragments_from_eh_frame(&f, &exe.ranges);
        let mut both = exe.ranges.clone();
        both.extend(from_eh);
        both.sort_by_key(|r| r.start);
        assert_eq!(
            both, dbg_pieces.ranges,
            "the debug file's pieces, found without it"
        );
        let file = FileEvalRanges {
            ranges: dbg_pieces.ranges,
            symbols_from: dbg.display().to_string(),
            incomplete: false,
        };
        let abs = EvalRanges::new(&file, 0);
        let hot = abs
            .ranges
            .iter()
            .find(|x| x.end - x.start < 10_000)
            .unwrap()
            .start;
        let cold = abs
            .ranges
            .iter()
            .find(|x| x.end - x.start > 10_000)
            .unwrap()
            .start;
        assert!(cold < hot, "the .cold part lies below the hot symbol");
    }
}
