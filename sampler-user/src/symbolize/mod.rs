//! symbolize stage: names for native and kernel addresses, with blazesym.
//!
//! Owns: one blazesym `Symbolizer` (it caches parsed files itself), one open descriptor per
//! mapped file identity, the (file identity, file offset) → frame cache and the kernel address
//! → frame cache. Each unique frame is symbolized once; nothing here runs per sample.
//! Input: a [`Process`] and a lookup address (ip, or return address − 1), or a kernel address.
//! Output: `Arc<SymbolizedFrame>`.
//! Constraints: files are opened through `/proc/PID/map_files` (then the process's root, then
//! the printed path; see `procs`), which works for containers and chroots alike, and handed to
//! blazesym as `/proc/self/fd/N` so the name stays valid after the target exits. A symbol is
//! accepted only if the address lies within its size: a stripped binary's local code (e.g.
//! `_PyEval_EvalFrameDefault.cold`, docs/cpython-layouts.md §9) would otherwise take the name of the
//! preceding exported function. Unknown addresses are named `module+0xFILE_OFFSET`. `[vdso]`
//! frames are symbolized against our own vDSO image (the kernel maps one image everywhere).
//! Split debug files are found by blazesym through the build-id and `.gnu_debuglink` of a
//! stripped file, in the *target's* `/usr/lib/debug` first (a container or chroot ships its
//! own `-dbg` packages), then the host's: one blazesym instance per distinct root directory.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::sync::Arc;

use blazesym::MaybeDefault;
use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Sym, Symbolized};

use crate::lru::Lru;
use crate::procs::{FileId, Mapping, Process};

/// Most files kept open (each also holds blazesym's parsed data). Beyond this, files are
/// symbolized through the per-process path, which stops working when the process exits.
const MAX_OPEN_FILES: usize = 1024;
/// Most cached frames (least recently used dropped first; bounds memory on huge runs).
const MAX_CACHED_FRAMES: usize = 1 << 20;
/// Most cached (process, mapping) → file entries.
const MAX_MAPPING_ENTRIES: usize = 1 << 16;

/// A symbolized frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolizedFrame {
    /// Function name, demangled; `module+0xOFFSET` when unknown.
    pub name: String,
    /// File basename of the module (`libc.so.6`), `[vdso]`, `[anon]`, `[kernel]`, …
    pub module: String,
    /// Source file, when debug info has it.
    pub file: Option<String>,
    /// Source line, when debug info has it.
    pub line: Option<u32>,
    /// Whether a symbol was found.
    pub resolved: bool,
}

impl SymbolizedFrame {
    fn unresolved(module: &str, offset: u64) -> Self {
        Self {
            name: format!("{module}+{offset:#x}"),
            module: module.to_owned(),
            file: None,
            line: None,
            resolved: false,
        }
    }
}

/// Work and failure counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizeStats {
    /// `native` calls.
    pub native_lookups: u64,
    /// `native` calls answered from the frame cache.
    pub native_cache_hits: u64,
    /// Frames handed to blazesym.
    pub native_symbolized: u64,
    /// Frames left as `module+0x…`.
    pub native_unresolved: u64,
    /// The nearest symbol did not cover the address (size check).
    pub past_symbol_size: u64,
    /// Mapped files that could not be opened.
    pub open_failed: u64,
    /// blazesym returned an error.
    pub blazesym_errors: u64,
    /// Kernel addresses symbolized (cache misses).
    pub kernel_symbolized: u64,
    /// Kernel addresses left as `[kernel]+0x…`.
    pub kernel_unresolved: u64,
}

struct OpenFile {
    id: Arc<FileId>,
    /// Keeps the descriptor behind `path` alive.
    file: Option<File>,
    /// What blazesym opens: `/proc/self/fd/N`, or the per-process path past the fd cap.
    path: PathBuf,
}

/// Our own vDSO image in a memfd, standing in for every target's `[vdso]` (same kernel image).
#[derive(Default)]
enum VdsoFile {
    #[default]
    NotRead,
    Unavailable,
    /// Image length and the file.
    Ready(u64, Arc<OpenFile>),
}

/// Write our vDSO image to a memfd that blazesym can open as `/proc/self/fd/N`.
fn vdso_memfd() -> Option<(u64, Arc<OpenFile>)> {
    use std::io::Write as _;
    use std::os::fd::FromRawFd as _;
    let image = crate::procs::read_own_vdso()?;
    let build_id = crate::procs::elf::read_elf_info(&image[..]).ok()?.build_id;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"pyebpf-vdso".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(&image).ok()?;
    let path = PathBuf::from(format!("/proc/self/fd/{fd}"));
    let id = Arc::new(FileId {
        dev: (0, 0),
        inode: 0,
        build_id,
    });
    Some((
        image.len() as u64,
        Arc::new(OpenFile {
            id,
            file: Some(file),
            path,
        }),
    ))
}

/// Process identity plus mapping identity.
type MappingSlot = (u32, u64, u64, u64, u64);

/// Most distinct root directories (containers, chroots) with their own blazesym instance;
/// beyond this, processes in further roots use the host's debug directories only.
const MAX_ROOTS: usize = 64;

/// A root directory's identity: (st_dev, st_ino) of `/proc/PID/root`.
type RootKey = (u64, u64);

/// Native and kernel symbolizer with caches.
pub struct Symbolizer {
    blaze: blazesym::symbolize::Symbolizer,
    /// Our own root's identity (processes in it use `blaze`).
    host_root: Option<RootKey>,
    /// One blazesym per other root, whose debug directories come first.
    rooted: HashMap<RootKey, blazesym::symbolize::Symbolizer>,
    by_mapping: Lru<MappingSlot, Option<Arc<OpenFile>>>,
    by_file: HashMap<Arc<FileId>, Arc<OpenFile>>,
    frames: Lru<(Arc<FileId>, u64), Arc<SymbolizedFrame>>,
    kernel: Lru<u64, Arc<SymbolizedFrame>>,
    kernel_source: Source<'static>,
    vdso: VdsoFile,
    stats: SymbolizeStats,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a symbol found for an address really covers it.
///
/// With a size, the address must fall inside it. Without one, an ELF symbol only names its
/// first byte (there is no telling where it ends), but a DWARF answer (`from_debug_info`) is
/// trustworthy: blazesym found the function by the address ranges of its DIE. blazesym reports
/// such functions with no size when they have several ranges — e.g. a hot part and a `.cold`
/// part, as `_PyEval_EvalFrameDefault` has in GCC builds.
pub fn symbol_covers(offset_in_symbol: usize, size: Option<usize>, from_debug_info: bool) -> bool {
    match size {
        Some(size) if size > 0 => offset_in_symbol < size,
        _ => offset_in_symbol == 0 || from_debug_info,
    }
}

impl Symbolizer {
    /// A symbolizer with empty caches (demangling, DWARF lines, default debug directories).
    pub fn new() -> Self {
        let blaze = blaze_builder().build();
        let kernel_source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            // vmlinux discovery searches several directories per call: kallsyms has what we need.
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        Self {
            blaze,
            host_root: root_key(std::path::Path::new("/")),
            rooted: HashMap::new(),
            by_mapping: Lru::new(MAX_MAPPING_ENTRIES),
            by_file: HashMap::new(),
            frames: Lru::new(MAX_CACHED_FRAMES),
            kernel: Lru::new(MAX_CACHED_FRAMES),
            kernel_source,
            vdso: VdsoFile::default(),
            stats: SymbolizeStats::default(),
        }
    }

    /// Work and failure counters.
    pub fn stats(&self) -> SymbolizeStats {
        self.stats
    }

    /// Drop the (process, mapping) → file entries of `pid`. Frames stay cached per file.
    pub fn forget_process(&mut self, pid: u32) {
        self.by_mapping.retain(|k, _| k.0 != pid);
    }

    /// Symbolize a user address of `proc` (already a lookup address: ip, or return address − 1).
    pub fn native(&mut self, proc: &Process, addr: u64) -> Arc<SymbolizedFrame> {
        self.stats.native_lookups += 1;
        let Some(m) = proc.mapping_for(addr) else {
            self.stats.native_unresolved += 1;
            return Arc::new(SymbolizedFrame::unresolved("[unknown]", addr));
        };
        let module = m.module_name();
        if m.is_vdso()
            && let Some(file) = self.vdso_file(m.end - m.start)
        {
            return self.cached_or_symbolize(None, &file, addr - m.start, &module);
        }
        if !m.is_file_backed() {
            // vDSO, anonymous (JIT) code: offset within the mapping.
            self.stats.native_unresolved += 1;
            return Arc::new(SymbolizedFrame::unresolved(
                &module,
                addr - m.start + m.file_offset,
            ));
        }
        let offset = m.file_offset_of(addr);
        let Some(file) = self.file_for(proc, m) else {
            self.stats.native_unresolved += 1;
            return Arc::new(SymbolizedFrame::unresolved(&module, offset));
        };
        let root = self.root_of(proc);
        self.cached_or_symbolize(root, &file, offset, &module)
    }

    /// The root of `proc` when it differs from ours (and a blazesym instance exists for it).
    fn root_of(&mut self, proc: &Process) -> Option<RootKey> {
        let key = root_key(&proc.root)?;
        if Some(key) == self.host_root {
            return None;
        }
        if !self.rooted.contains_key(&key) {
            if self.rooted.len() >= MAX_ROOTS {
                return None;
            }
            let dirs: Vec<PathBuf> = ["usr/lib/debug", "lib/debug"]
                .iter()
                .map(|d| proc.root.join(d))
                .chain(["/usr/lib/debug", "/lib/debug"].map(PathBuf::from))
                .collect();
            self.rooted
                .insert(key, blaze_builder().set_debug_dirs(Some(dirs)).build());
        }
        Some(key)
    }

    fn cached_or_symbolize(
        &mut self,
        root: Option<RootKey>,
        file: &OpenFile,
        offset: u64,
        module: &str,
    ) -> Arc<SymbolizedFrame> {
        let key = (file.id.clone(), offset);
        if let Some(f) = self.frames.get(&key) {
            self.stats.native_cache_hits += 1;
            return f.clone();
        }
        let frame = Arc::new(self.symbolize_file_offset(root, &file.path, offset, module));
        self.frames.insert(key, frame.clone());
        frame
    }

    /// Our vDSO as a file, if the target's `[vdso]` has its length.
    fn vdso_file(&mut self, target_len: u64) -> Option<Arc<OpenFile>> {
        if matches!(self.vdso, VdsoFile::NotRead) {
            self.vdso =
                vdso_memfd().map_or(VdsoFile::Unavailable, |(len, f)| VdsoFile::Ready(len, f));
        }
        match &self.vdso {
            VdsoFile::Ready(len, f) if *len == target_len => Some(f.clone()),
            _ => None,
        }
    }

    fn symbolize_file_offset(
        &mut self,
        root: Option<RootKey>,
        path: &std::path::Path,
        offset: u64,
        module: &str,
    ) -> SymbolizedFrame {
        self.stats.native_symbolized += 1;
        let src = Source::Elf(Elf::new(path));
        let blaze = root
            .and_then(|r| self.rooted.get(&r))
            .unwrap_or(&self.blaze);
        let result = blaze.symbolize_single(&src, Input::FileOffset(offset));
        let frame = match result {
            Ok(Symbolized::Sym(sym))
                if symbol_covers(sym.offset, sym.size, sym.code_info.is_some()) =>
            {
                Some(frame_from_sym(&sym, module))
            }
            Ok(Symbolized::Sym(_)) => {
                self.stats.past_symbol_size += 1;
                None
            }
            Ok(Symbolized::Unknown(_)) => None,
            Err(_) => {
                self.stats.blazesym_errors += 1;
                None
            }
        };
        frame.unwrap_or_else(|| {
            self.stats.native_unresolved += 1;
            SymbolizedFrame::unresolved(module, offset)
        })
    }

    /// The open file behind `m` of `proc`, cached per process mapping and per file identity.
    fn file_for(&mut self, proc: &Process, m: &Mapping) -> Option<Arc<OpenFile>> {
        let slot = (
            proc.pid,
            proc.start_time_ticks,
            m.start,
            m.file_offset,
            m.inode,
        );
        if let Some(f) = self.by_mapping.get(&slot) {
            return f.clone();
        }
        let opened = proc.open_mapping(m).ok();
        if opened.is_none() {
            self.stats.open_failed += 1;
        }
        let file = opened.map(|o| {
            let id = Arc::new(o.id);
            if let Some(f) = self.by_file.get(&id) {
                return f.clone();
            }
            let f = if self.by_file.len() < MAX_OPEN_FILES {
                let path = PathBuf::from(format!("/proc/self/fd/{}", o.file.as_raw_fd()));
                OpenFile {
                    id: id.clone(),
                    file: Some(o.file),
                    path,
                }
            } else {
                OpenFile {
                    id: id.clone(),
                    file: None,
                    path: o.opened_via,
                }
            };
            let f = Arc::new(f);
            if f.file.is_some() {
                self.by_file.insert(id, f.clone());
            }
            f
        });
        self.by_mapping.insert(slot, file.clone());
        file
    }

    /// Symbolize a kernel address from `/proc/kallsyms`; unknown → `[kernel]+0x…`.
    pub fn kernel(&mut self, addr: u64) -> Arc<SymbolizedFrame> {
        if let Some(f) = self.kernel.get(&addr) {
            return f.clone();
        }
        let result = self
            .blaze
            .symbolize_single(&self.kernel_source, Input::AbsAddr(addr));
        let frame = match result {
            Ok(Symbolized::Sym(sym)) => {
                self.stats.kernel_symbolized += 1;
                let module = sym.module.as_deref().map_or_else(
                    || "[kernel]".to_owned(),
                    |m| {
                        format!(
                            "[{}]",
                            m.to_string_lossy().trim_matches(|c| c == '[' || c == ']')
                        )
                    },
                );
                frame_from_sym(&sym, &module)
            }
            Ok(Symbolized::Unknown(_)) | Err(_) => {
                if result.is_err() {
                    self.stats.blazesym_errors += 1;
                }
                self.stats.kernel_unresolved += 1;
                SymbolizedFrame::unresolved("[kernel]", addr)
            }
        };
        let frame = Arc::new(frame);
        self.kernel.insert(addr, frame.clone());
        frame
    }
}

/// blazesym as we use it: demangling and DWARF lines, no inlined functions.
fn blaze_builder() -> blazesym::symbolize::Builder {
    blazesym::symbolize::Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(false)
        .enable_demangling(true)
}

/// (st_dev, st_ino) of a directory.
fn root_key(dir: &std::path::Path) -> Option<RootKey> {
    use std::os::unix::fs::MetadataExt as _;
    let md = std::fs::metadata(dir).ok()?;
    Some((md.dev(), md.ino()))
}

fn frame_from_sym(sym: &Sym<'_>, module: &str) -> SymbolizedFrame {
    let (file, line) = sym.code_info.as_ref().map_or((None, None), |ci| {
        (Some(ci.to_path().to_string_lossy().into_owned()), ci.line)
    });
    SymbolizedFrame {
        name: sym.name.to_string(),
        module: module.to_owned(),
        file,
        line,
        resolved: true,
    }
}
