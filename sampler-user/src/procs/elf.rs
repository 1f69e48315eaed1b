//! The one ELF layer: the parts of an ELF file that the identity ([`super::FileId`]), the
//! unwinder (unwind sections, load bias), the eval-loop ranges (symbol tables) and the Python
//! reader (`.PyRuntime`, `_PyRuntime` and friends) need, read without mapping the file.
//!
//! Owns: [`ElfInfo`] (load segments, section headers, GNU build-id), section bytes
//! ([`read_section`]) and symbol tables ([`read_symbols`]). Input: anything that can be read at
//! an offset ([`ReadAt`]): an open file, or bytes copied out of memory (the vDSO). Output: owned
//! values; nothing borrows the file.
//! Constraints: the file is untrusted (a target process chose it): every count and length is
//! bounded, every read is checked, nothing panics, nothing is memory-mapped (a file truncated
//! under us gives an error, never a SIGBUS). x86-64 only: ELF64 little-endian.
//!
//! Decoding is the `object` crate's (its low-level ELF API: header, program and section
//! headers, notes, `Elf64_Sym`, string tables). Why `object` and not `goblin`, measured on a
//! 153 MB `librustc_driver` (docs/elf-layer.md): goblin parses a slice of the
//! whole file (150 MB read, ~180 ms, for a "is this Python?" check), while `object` reads on
//! demand — the headers through its `ReadCache`, then each needed table in one read (2.9 MB,
//! ~1 ms). `object` is also already built for aya.

use std::io;
use std::os::unix::fs::FileExt;

use object::elf::{
    FileHeader64, NT_GNU_BUILD_ID, PT_LOAD, SHT_DYNSYM, SHT_NOTE, SHT_SYMTAB, Sym64,
};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _};
use object::read::{ReadCache, ReadCacheOps, ReadRef, StringTable};
use object::{LittleEndian, pod};

/// Most program headers accepted (real files have about 10–15).
const MAX_PHDRS: usize = 256;
/// Most section headers accepted (debug files have about 40; `-ffunction-sections` objects
/// are never mapped).
const MAX_SHDRS: usize = 8192;
/// Largest section-name table accepted.
const MAX_SHSTRTAB: u64 = 1 << 20;
/// Most note bytes examined when looking for the build-id.
const MAX_NOTES: u64 = 64 << 10;
/// Longest build-id accepted (GNU ld writes 20 bytes for sha1).
const MAX_BUILD_ID: usize = 64;

/// `SHT_NOBITS`: the section occupies no file bytes (`.bss`, and every section of a split
/// debug file that lives in the stripped binary).
pub const SHT_NOBITS: u32 = object::elf::SHT_NOBITS;
/// `SHF_COMPRESSED`: section data starts with a `Elf64_Chdr`.
pub const SHF_COMPRESSED: u64 = object::elf::SHF_COMPRESSED as u64;
/// `PF_X`.
pub const PF_X: u32 = object::elf::PF_X;
/// `STT_FUNC`.
pub const STT_FUNC: u8 = object::elf::STT_FUNC;

/// Reading at an absolute offset.
pub trait ReadAt {
    /// Like `pread`: fill as much of `buf` as possible from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Total length in bytes.
    fn byte_len(&self) -> io::Result<u64>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
    fn byte_len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(0);
        };
        let Some(src) = self.get(start..) else {
            return Ok(0);
        };
        let n = src.len().min(buf.len());
        buf[..n].copy_from_slice(&src[..n]);
        Ok(n)
    }
    fn byte_len(&self) -> io::Result<u64> {
        Ok(<[u8]>::len(self) as u64)
    }
}

/// A [`ReadAt`] seen as the stream `object`'s [`ReadCache`] reads from (headers only: the
/// cache keeps every block it read until it is dropped, at the end of [`read_elf_info`]).
struct Stream<'a, R: ?Sized> {
    r: &'a R,
    pos: u64,
}

impl<R: ReadAt + ?Sized> ReadCacheOps for Stream<'_, R> {
    fn len(&mut self) -> Result<u64, ()> {
        self.r.byte_len().map_err(|_| ())
    }
    fn seek(&mut self, pos: u64) -> Result<u64, ()> {
        self.pos = pos;
        Ok(pos)
    }
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, ()> {
        let n = self.r.read_at(buf, self.pos).map_err(|_| ())?;
        self.pos += n as u64;
        Ok(n)
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ()> {
        let n = self.r.read_at(buf, self.pos).map_err(|_| ())?;
        if n != buf.len() {
            return Err(());
        }
        self.pos += n as u64;
        Ok(())
    }
}

/// Why an ELF file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// An I/O error at a given offset.
    #[error("read of {len} bytes at offset {offset:#x} failed: {source}")]
    Io {
        /// File offset of the read.
        offset: u64,
        /// Length requested.
        len: usize,
        /// The error.
        source: io::Error,
    },
    /// The file ended before the requested bytes.
    #[error("file too short: needed {len} bytes at offset {offset:#x}")]
    Short {
        /// File offset of the read.
        offset: u64,
        /// Length requested.
        len: usize,
    },
    /// Not an ELF64 little-endian file.
    #[error("not an ELF64 little-endian file")]
    NotElf64,
    /// A header or table is inconsistent (the `object` crate's reason).
    #[error("malformed ELF: {what}")]
    Malformed {
        /// What was wrong.
        what: String,
    },
    /// A count or size is beyond our bounds.
    #[error("{what} too large: {value}")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// The section has no bytes in the file or is compressed.
    #[error("section {name} has no plain file data")]
    NoData {
        /// Section name.
        name: String,
    },
}

impl From<object::Error> for ElfError {
    fn from(e: object::Error) -> Self {
        ElfError::Malformed {
            what: e.to_string(),
        }
    }
}

/// One `PT_LOAD` program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_vaddr`
    pub vaddr: u64,
    /// `p_offset`
    pub offset: u64,
    /// `p_filesz`
    pub filesz: u64,
    /// `p_memsz`
    pub memsz: u64,
    /// `p_flags` (`PF_X` = 1, `PF_W` = 2, `PF_R` = 4)
    pub flags: u32,
}

/// One section header with its name resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// Name from `.shstrtab` (raw bytes).
    pub name: Vec<u8>,
    /// `sh_type`
    pub sh_type: u32,
    /// `sh_flags`
    pub flags: u64,
    /// `sh_addr` (an SVMA)
    pub addr: u64,
    /// `sh_offset`
    pub offset: u64,
    /// `sh_size`
    pub size: u64,
    /// `sh_link` (for a symbol table: its string table's index)
    pub link: u32,
}

impl Section {
    /// The section's SVMA range.
    pub fn svma_range(&self) -> std::ops::Range<u64> {
        self.addr..self.addr.saturating_add(self.size)
    }
}

/// What we know about an ELF file after reading its headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_type` (2 = `ET_EXEC`, 3 = `ET_DYN`).
    pub elf_type: u16,
    /// `PT_LOAD` segments in header order.
    pub loads: Vec<LoadSegment>,
    /// Section headers (empty if the file has none).
    pub sections: Vec<Section>,
    /// `NT_GNU_BUILD_ID` payload.
    pub build_id: Option<Vec<u8>>,
}

impl ElfInfo {
    /// The first section named `name`.
    pub fn section(&self, name: &[u8]) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// Whether the file has a non-empty `.symtab` (is not stripped).
    pub fn has_symtab(&self) -> bool {
        self.sections
            .iter()
            .any(|s| s.sh_type == SHT_SYMTAB && s.size > 0)
    }

    /// Lowest `PT_LOAD` vaddr, rounded down to a page: the module's base SVMA.
    pub fn base_svma(&self) -> u64 {
        self.loads
            .iter()
            .map(|l| l.vaddr)
            .min()
            .map_or(0, |v| v & !0xfff)
    }

    /// Load bias (`avma - svma`) of a mapping that starts at `map_start` and maps the file from
    /// `map_file_offset`: find the `PT_LOAD` whose file range holds that offset (the kernel maps
    /// segments page-aligned, so `p_vaddr - p_offset` is the same for every page of it).
    /// `None` if no segment covers the offset. Non-PIE executables give 0.
    pub fn bias_for_mapping(&self, map_start: u64, map_file_offset: u64) -> Option<u64> {
        let seg = self
            .loads
            .iter()
            .filter(|l| {
                let page_off = l.offset & !0xfff;
                page_off <= map_file_offset
                    && map_file_offset < l.offset.saturating_add(l.filesz.max(1))
            })
            // Prefer the executable segment when two share a page.
            .max_by_key(|l| l.flags & PF_X)?;
        // svma of map_start = p_vaddr - p_offset + map_file_offset (all modulo 2^64).
        let svma_at_start = seg
            .vaddr
            .wrapping_sub(seg.offset)
            .wrapping_add(map_file_offset);
        Some(map_start.wrapping_sub(svma_at_start))
    }
}

fn read_exact(r: &(impl ReadAt + ?Sized), offset: u64, len: usize) -> Result<Vec<u8>, ElfError> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = r
            .read_at(&mut buf[done..], offset + done as u64)
            .map_err(|source| ElfError::Io {
                offset,
                len,
                source,
            })?;
        if n == 0 {
            return Err(ElfError::Short { offset, len });
        }
        done += n;
    }
    Ok(buf)
}

type Header = FileHeader64<LittleEndian>;

/// Read the ELF header, program headers, section headers and build-id.
pub fn read_elf_info(r: &(impl ReadAt + ?Sized)) -> Result<ElfInfo, ElfError> {
    let ident = read_exact(r, 0, 64)?;
    // ELFCLASS64 = 2, ELFDATA2LSB = 1.
    if &ident[..4] != b"\x7fELF" || ident[4] != 2 || ident[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let cache = ReadCache::new(Stream { r, pos: 0 });
    let data = &cache;
    let hdr = Header::parse(data).map_err(|_| ElfError::NotElf64)?;
    let e = LittleEndian;
    let mut info = ElfInfo {
        elf_type: hdr.e_type(e),
        ..ElfInfo::default()
    };
    let phnum = hdr.phnum(e, data)?;
    if phnum > MAX_PHDRS {
        return Err(ElfError::TooLarge {
            what: "program header table",
            value: phnum as u64,
        });
    }
    let mut notes = Vec::new();
    for ph in hdr.program_headers(e, data)? {
        let seg = LoadSegment {
            vaddr: ph.p_vaddr(e),
            offset: ph.p_offset(e),
            filesz: ph.p_filesz(e),
            memsz: ph.p_memsz(e),
            flags: ph.p_flags(e),
        };
        match ph.p_type(e) {
            PT_LOAD => info.loads.push(seg),
            object::elf::PT_NOTE => notes.push((seg.offset, seg.filesz, ph.p_align(e))),
            _ => {}
        }
    }
    let shnum = hdr.shnum(e, data)?;
    if shnum > MAX_SHDRS {
        return Err(ElfError::TooLarge {
            what: "section header table",
            value: shnum as u64,
        });
    }
    // A file without section headers (or with unreadable ones) still has its segments.
    if let Ok(headers) = hdr.section_headers(e, data) {
        let names = hdr
            .section_strings_index(e, data)
            .ok()
            .and_then(|i| headers.get(i.0))
            .filter(|s| s.sh_type(e) != SHT_NOBITS && s.sh_size(e) <= MAX_SHSTRTAB)
            .and_then(|s| data.read_bytes_at(s.sh_offset(e), s.sh_size(e)).ok())
            .unwrap_or_default();
        let strings = StringTable::new(names, 0, names.len() as u64);
        info.sections = headers
            .iter()
            .map(|s| Section {
                name: s.name(e, strings).unwrap_or_default().to_vec(),
                sh_type: s.sh_type(e),
                flags: s.sh_flags(e),
                addr: s.sh_addr(e),
                offset: s.sh_offset(e),
                size: s.sh_size(e),
                link: s.sh_link(e),
            })
            .collect();
    }
    if notes.is_empty() {
        notes.extend(
            info.sections
                .iter()
                .filter(|s| s.sh_type == SHT_NOTE)
                .map(|s| (s.offset, s.size, 4)),
        );
    }
    drop(cache);
    let mut budget = MAX_NOTES;
    for (offset, size, align) in notes {
        let size = size.min(budget);
        budget -= size;
        let Ok(bytes) = read_exact(r, offset, size as usize) else {
            continue;
        };
        if let Some(id) = find_build_id(&bytes, align) {
            info.build_id = Some(id);
            break;
        }
    }
    Ok(info)
}

/// The GNU build-id among the notes in `notes` (aligned to `align`).
fn find_build_id(notes: &[u8], align: u64) -> Option<Vec<u8>> {
    let mut it = object::read::elf::NoteIterator::<Header>::new(LittleEndian, align, notes).ok()?;
    while let Ok(Some(note)) = it.next() {
        if note.n_type(LittleEndian) == NT_GNU_BUILD_ID && note.name() == b"GNU" {
            let desc = note.desc();
            return (!desc.is_empty() && desc.len() <= MAX_BUILD_ID).then(|| desc.to_vec());
        }
    }
    None
}

/// Read a section's bytes (uncompressed sections with file data only), at most `max_len`.
pub fn read_section(
    r: &(impl ReadAt + ?Sized),
    sec: &Section,
    max_len: u64,
) -> Result<Vec<u8>, ElfError> {
    if sec.sh_type == SHT_NOBITS || sec.flags & SHF_COMPRESSED != 0 {
        return Err(ElfError::NoData {
            name: String::from_utf8_lossy(&sec.name).into_owned(),
        });
    }
    if sec.size > max_len {
        return Err(ElfError::TooLarge {
            what: "section",
            value: sec.size,
        });
    }
    read_exact(r, sec.offset, sec.size as usize)
}

/// Which symbol table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolTableKind {
    /// `.symtab` (`SHT_SYMTAB`): every symbol, absent from stripped files.
    Static,
    /// `.dynsym` (`SHT_DYNSYM`): the exported ones.
    Dynamic,
}

/// One symbol table and its strings, read whole (one read each).
pub struct SymbolTable {
    syms: Vec<u8>,
    strs: Vec<u8>,
}

/// One defined or undefined symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol<'a> {
    /// Its name (raw bytes).
    pub name: &'a [u8],
    /// `st_value`: an SVMA for a defined symbol of an executable or shared object.
    pub value: u64,
    /// `st_size`.
    pub size: u64,
    /// `STT_*` of `st_info`.
    pub kind: u8,
    /// `st_shndx != SHN_UNDEF`.
    pub defined: bool,
}

impl SymbolTable {
    /// A table from the raw bytes of an `Elf64_Sym` array and its string table (as
    /// [`read_symbols`] reads them; also for synthetic tables in tests).
    pub fn from_bytes(syms: Vec<u8>, strs: Vec<u8>) -> Self {
        SymbolTable { syms, strs }
    }

    /// Every symbol with a readable name, in table order.
    pub fn iter(&self) -> impl Iterator<Item = Symbol<'_>> + '_ {
        let e = LittleEndian;
        let syms: &[Sym64<LittleEndian>] =
            pod::slice_from_all_bytes(&self.syms[..self.syms.len() / 24 * 24]).unwrap_or(&[]);
        let strings = StringTable::new(&self.strs[..], 0, self.strs.len() as u64);
        syms.iter().filter_map(move |s| {
            Some(Symbol {
                name: s.name(e, strings).ok()?,
                value: s.st_value(e),
                size: s.st_size(e),
                kind: s.st_type(),
                defined: s.st_shndx(e) != object::elf::SHN_UNDEF,
            })
        })
    }

    /// No symbols.
    pub fn is_empty(&self) -> bool {
        self.syms.len() < 24
    }
}

/// Reads the first symbol table of `kind` and its string table, each at most `max_len`
/// bytes; `Ok(None)` when the file has none.
pub fn read_symbols(
    r: &(impl ReadAt + ?Sized),
    info: &ElfInfo,
    kind: SymbolTableKind,
    max_len: u64,
) -> Result<Option<SymbolTable>, ElfError> {
    let wanted = match kind {
        SymbolTableKind::Static => SHT_SYMTAB,
        SymbolTableKind::Dynamic => SHT_DYNSYM,
    };
    let Some(sec) = info.sections.iter().find(|s| s.sh_type == wanted) else {
        return Ok(None);
    };
    let strtab = info
        .sections
        .get(sec.link as usize)
        .ok_or(ElfError::Malformed {
            what: "symbol table without a string table".into(),
        })?;
    Ok(Some(SymbolTable {
        syms: read_section(r, sec, max_len)?,
        strs: read_section(r, strtab, max_len)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_executable() {
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        let info = read_elf_info(&exe).unwrap();
        assert!(!info.loads.is_empty());
        assert!(info.loads.iter().any(|l| l.flags & PF_X != 0));
        let text = info.section(b".text").expect(".text");
        assert!(text.size > 0);
        assert!(info.section(b".eh_frame").is_some());
        let eh = read_section(&exe, info.section(b".eh_frame").unwrap(), 1 << 30).unwrap();
        assert!(!eh.is_empty());
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(matches!(
            read_elf_info(&b"hello"[..]),
            Err(ElfError::Short { .. })
        ));
        let mut junk = [0u8; 64];
        assert!(matches!(read_elf_info(&junk[..]), Err(ElfError::NotElf64)));
        // Valid ident, absurd counts and offsets.
        junk[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        junk[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        junk[54..56].copy_from_slice(&56u16.to_le_bytes());
        junk[56..58].copy_from_slice(&3u16.to_le_bytes());
        assert!(read_elf_info(&junk[..]).is_err());
        junk[56..58].copy_from_slice(&0xfffeu16.to_le_bytes());
        assert!(matches!(
            read_elf_info(&junk[..]),
            Err(ElfError::TooLarge { .. })
        ));
    }

    #[test]
    fn build_id_notes() {
        let mut n = Vec::new();
        // An unrelated note first (name "Go", 4-byte desc), then the GNU build-id.
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(b"Go\0\0abcd");
        n.extend_from_slice(&4u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(&3u32.to_le_bytes());
        n.extend_from_slice(b"GNU\0\x01\x02\x03\0");
        assert_eq!(find_build_id(&n, 4), Some(vec![1, 2, 3]));
        // Truncated descriptor.
        assert_eq!(find_build_id(&n[..n.len() - 3], 4), None);
        // Absurd sizes.
        let mut bad = vec![0xff; 12];
        bad.extend_from_slice(&[0; 8]);
        assert_eq!(find_build_id(&bad, 4), None);
    }

    #[test]
    fn bias_of_pie_and_non_pie() {
        let info = ElfInfo {
            elf_type: 3,
            loads: vec![
                LoadSegment {
                    vaddr: 0,
                    offset: 0,
                    filesz: 0x1000,
                    memsz: 0x1000,
                    flags: 4,
                },
                LoadSegment {
                    vaddr: 0x1000,
                    offset: 0x1000,
                    filesz: 0x5000,
                    memsz: 0x5000,
                    flags: 5,
                },
                LoadSegment {
                    vaddr: 0x7df0,
                    offset: 0x6df0,
                    filesz: 0x300,
                    memsz: 0x400,
                    flags: 6,
                },
            ],
            ..ElfInfo::default()
        };
        assert_eq!(
            info.bias_for_mapping(0x5555_5555_5000, 0x1000),
            Some(0x5555_5555_4000)
        );
        assert_eq!(
            info.bias_for_mapping(0x5555_5555_a000, 0x6000),
            Some(0x5555_5555_3000)
        );
        assert_eq!(info.bias_for_mapping(0x5555_5555_4000, 0x9000), None);
        assert_eq!(info.base_svma(), 0);
        let exec = ElfInfo {
            elf_type: 2,
            loads: vec![LoadSegment {
                vaddr: 0x40_1000,
                offset: 0x1000,
                filesz: 0x10000,
                memsz: 0x10000,
                flags: 5,
            }],
            ..ElfInfo::default()
        };
        assert_eq!(exec.bias_for_mapping(0x40_1000, 0x1000), Some(0));
        assert_eq!(exec.base_svma(), 0x40_1000);
    }
}
