//! framehop modules for a process's executable mappings.
//!
//! Owns: the per-file cache of unwind sections (keyed by [`FileId`], read once per file, not per
//! process or sample), the vDSO's unwind sections (read once from our own vDSO: the kernel maps
//! the same image into every 64-bit process), and the translation of mappings to framehop
//! [`Module`]s with their load bias.
//! Input: a [`Process`] with its mappings.
//! Output: a list of [`Module`]s, one per executable file mapping.
//! Constraints: files are untrusted; sections are bounded by [`MAX_SECTION`]; a file whose unwind
//! data cannot be read still becomes a module (framehop then falls back to frame pointers in
//! it), and the failure is counted.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use framehop::{ExplicitModuleSectionInfo, Module};

use super::cfi_guard::{self, Verdict};
use crate::lru::Lru;
use crate::procs::elf::{ElfInfo, ReadAt, read_elf_info, read_section};
use crate::procs::{FileId, Mapping, Process, read_own_vdso};

/// Section bytes shared between all modules of one file (framehop only needs `Deref<[u8]>`).
pub type SectionBytes = Arc<[u8]>;

/// Largest unwind section read (libxul-sized `.eh_frame` is ~10 MiB).
const MAX_SECTION: u64 = 256 << 20;
/// Most files whose unwind data is kept; the least recently used is dropped beyond this
/// (re-reading is cheap compared to unbounded growth on a busy host).
const MAX_FILES: usize = 4096;

/// Unwind data of one ELF file, independent of where it is mapped.
#[derive(Debug)]
pub struct FileUnwindData {
    elf: ElfInfo,
    base_svma: u64,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    eh_frame_svma: Option<Range<u64>>,
    eh_frame_hdr_svma: Option<Range<u64>>,
    eh_frame: Option<SectionBytes>,
    eh_frame_hdr: Option<SectionBytes>,
    debug_frame: Option<SectionBytes>,
    /// What [`cfi_guard`] kept from framehop: `Unsafe` (a section) or `WithoutHdr`.
    withheld: Option<Verdict>,
}

impl FileUnwindData {
    /// Read the unwind sections of an ELF file whose headers are `elf`.
    pub fn load(r: &(impl ReadAt + ?Sized), elf: ElfInfo) -> Self {
        let read = |name: &[u8]| -> Option<SectionBytes> {
            let s = elf.section(name)?;
            read_section(r, s, MAX_SECTION).ok().map(Arc::from)
        };
        let range = |name: &[u8]| {
            elf.section(name)
                .map(crate::procs::elf::Section::svma_range)
        };
        let text_svma = range(b".text");
        let got_svma = range(b".got");
        let eh_frame_svma = range(b".eh_frame");
        let eh_frame_hdr_svma = range(b".eh_frame_hdr");
        // The base addresses framehop will use (from the same ranges `module_for` gives it).
        let bases = cfi_guard::bases(
            eh_frame_svma.as_ref(),
            eh_frame_hdr_svma.as_ref(),
            text_svma.as_ref(),
            got_svma.as_ref(),
        );
        let mut withheld = None;
        let mut eh_frame = read(b".eh_frame");
        let mut eh_frame_hdr = eh_frame.as_ref().and_then(|_| read(b".eh_frame_hdr"));
        if let Some(eh) = &eh_frame {
            match cfi_guard::check_eh_frame(eh, eh_frame_hdr.as_deref(), &bases) {
                Verdict::Safe => {}
                Verdict::WithoutHdr => {
                    eh_frame_hdr = None;
                    withheld = Some(Verdict::WithoutHdr);
                }
                Verdict::Unsafe => {
                    eh_frame = None;
                    eh_frame_hdr = None;
                    withheld = Some(Verdict::Unsafe);
                }
            }
        }
        // framehop uses .debug_frame only without .eh_frame; don't read it otherwise.
        let debug_frame = if eh_frame.is_none() {
            read(b".debug_frame").filter(|d| {
                let safe = cfi_guard::check_debug_frame(d, &bases) == Verdict::Safe;
                if !safe {
                    withheld = Some(Verdict::Unsafe);
                }
                safe
            })
        } else {
            None
        };
        Self {
            base_svma: elf.base_svma(),
            text_svma,
            got_svma,
            eh_frame_svma,
            eh_frame_hdr_svma,
            eh_frame,
            eh_frame_hdr,
            debug_frame,
            withheld,
            elf,
        }
    }

    /// What the unwind-section check kept from framehop, if anything.
    pub fn withheld(&self) -> Option<Verdict> {
        self.withheld
    }

    /// Whether any unwind section was found.
    pub fn has_unwind_info(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// A framehop module for `m` mapped at its address, or `None` if `m`'s file offset is in no
    /// `PT_LOAD` (then the bias is unknown).
    pub fn module_for(&self, m: &Mapping, name: String) -> Option<Module<SectionBytes>> {
        let bias = self.elf.bias_for_mapping(m.start, m.file_offset)?;
        let info = ExplicitModuleSectionInfo {
            base_svma: self.base_svma,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: self.eh_frame_svma.clone(),
            eh_frame: self.eh_frame.clone(),
            eh_frame_hdr_svma: self.eh_frame_hdr_svma.clone(),
            eh_frame_hdr: self.eh_frame_hdr.clone(),
            debug_frame: self.debug_frame.clone(),
            ..ExplicitModuleSectionInfo::default()
        };
        // Relative addresses are avma - base_avma = svma - base_svma.
        Some(Module::new(
            name,
            m.start..m.end,
            self.base_svma.wrapping_add(bias),
            info,
        ))
    }
}

/// Counts of module-building work and failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleStats {
    /// Files whose unwind sections were read.
    pub files_loaded: u64,
    /// Executable file mappings that could not be opened.
    pub open_failed: u64,
    /// Files that are not ELF64 or whose headers are unreadable.
    pub not_elf: u64,
    /// ELF files without `.eh_frame` or `.debug_frame`.
    pub no_unwind_info: u64,
    /// Mappings whose file offset is in no `PT_LOAD`.
    pub no_bias: u64,
    /// Files whose `.eh_frame`/`.debug_frame` was withheld from framehop: an expression that
    /// branches or is too long (see [`cfi_guard`]); they unwind with frame pointers.
    pub unsafe_unwind_info: u64,
}

/// Our own vDSO image, read at most once.
#[derive(Default)]
enum VdsoState {
    #[default]
    NotRead,
    Unavailable,
    /// Image length and its unwind data.
    Read(u64, Arc<FileUnwindData>),
}

/// Builds modules, caching per file.
pub struct ModuleBuilder {
    files: Lru<FileId, Option<Arc<FileUnwindData>>>,
    vdso: VdsoState,
    stats: ModuleStats,
}

impl Default for ModuleBuilder {
    fn default() -> Self {
        ModuleBuilder {
            files: Lru::new(MAX_FILES),
            vdso: VdsoState::default(),
            stats: ModuleStats::default(),
        }
    }
}

/// Identity of a mapping within one process, to reuse modules across rebuilds.
pub type MappingKey = (u64, u64, u64, (u32, u32), u64);

/// The key of a mapping.
pub fn mapping_key(m: &Mapping) -> MappingKey {
    (m.start, m.end, m.file_offset, m.dev, m.inode)
}

impl ModuleBuilder {
    /// Work and failure counts.
    pub fn stats(&self) -> ModuleStats {
        self.stats
    }

    /// Modules for every executable mapping of `proc`, reusing those in `previous` whose mapping
    /// is unchanged.
    pub fn modules_for(
        &mut self,
        proc: &Process,
        previous: &HashMap<MappingKey, Module<SectionBytes>>,
    ) -> HashMap<MappingKey, Module<SectionBytes>> {
        let mut out = HashMap::new();
        for m in proc.mappings.iter().filter(|m| m.perms.exec) {
            let key = mapping_key(m);
            if let Some(module) = previous.get(&key) {
                out.insert(key, module.clone());
                continue;
            }
            let data = if m.is_vdso() {
                self.vdso_data(m.end - m.start)
            } else if m.is_file_backed() {
                self.file_data(proc, m)
            } else {
                None // anonymous code (JIT): framehop falls back to frame pointers there
            };
            let Some(data) = data else { continue };
            match data.module_for(m, m.module_name()) {
                Some(module) => {
                    out.insert(key, module);
                }
                None => self.stats.no_bias += 1,
            }
        }
        out
    }

    fn file_data(&mut self, proc: &Process, m: &Mapping) -> Option<Arc<FileUnwindData>> {
        let Ok(opened) = proc.open_mapping(m) else {
            self.stats.open_failed += 1;
            return None;
        };
        if let Some(cached) = self.files.get(&opened.id) {
            return cached.clone();
        }
        let data = if let Some(elf) = opened.elf {
            let d = FileUnwindData::load(&opened.file, elf);
            self.stats.files_loaded += 1;
            if d.withheld() == Some(Verdict::Unsafe) {
                self.stats.unsafe_unwind_info += 1;
            }
            if !d.has_unwind_info() {
                self.stats.no_unwind_info += 1;
            }
            Some(Arc::new(d))
        } else {
            self.stats.not_elf += 1;
            None
        };
        self.files.insert(opened.id, data.clone());
        data
    }

    /// Our own vDSO's unwind data, if the target's vDSO has the same size (same kernel image).
    fn vdso_data(&mut self, target_len: u64) -> Option<Arc<FileUnwindData>> {
        if matches!(self.vdso, VdsoState::NotRead) {
            self.vdso =
                load_own_vdso().map_or(VdsoState::Unavailable, |(len, d)| VdsoState::Read(len, d));
        }
        match &self.vdso {
            VdsoState::Read(len, data) if *len == target_len => Some(data.clone()),
            _ => None,
        }
    }
}

/// Our own vDSO's length and unwind sections.
fn load_own_vdso() -> Option<(u64, Arc<FileUnwindData>)> {
    let image = read_own_vdso()?;
    let elf = read_elf_info(&image[..]).ok()?;
    let data = FileUnwindData::load(&image[..], elf);
    data.has_unwind_info()
        .then(|| (image.len() as u64, Arc::new(data)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::ProcessRegistry;

    #[test]
    fn own_vdso_has_unwind_info() {
        let (len, data) = load_own_vdso().expect("vdso");
        assert!(len >= 4096);
        assert!(data.eh_frame.is_some());
    }

    #[test]
    fn modules_for_the_test_process() {
        if !crate::procs::tests::require_root("modules_for_the_test_process") {
            return;
        }
        let mut reg = ProcessRegistry::new();
        let proc = reg.get_or_load(std::process::id()).unwrap();
        let mut b = ModuleBuilder::default();
        let mods = b.modules_for(proc, &HashMap::new());
        let here = modules_for_the_test_process as *const () as u64;
        let m = proc.mapping_for(here).unwrap();
        let module = mods.get(&mapping_key(m)).expect("module for own text");
        assert_eq!(module.avma_range(), m.start..m.end);
        assert!(b.stats().files_loaded >= 2, "{:?}", b.stats());
        assert_eq!(b.stats().open_failed, 0);
        // A second build reuses everything: no more files read.
        let loaded = b.stats().files_loaded;
        let again = b.modules_for(proc, &HashMap::new());
        assert_eq!(again.len(), mods.len());
        assert_eq!(
            b.stats().files_loaded,
            loaded,
            "unwind data is cached per file"
        );
    }
}
