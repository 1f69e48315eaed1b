//! Minimal, bounded ELF64 header reader.
//!
//! Owns: reading the parts of an ELF file that the identity ([`super::FileId`]), the unwinder
//! (unwind sections, load bias) and the Python reader need, without mapping the whole file.
//! Input: anything that can be read at an offset ([`ReadAt`]): an open file, or bytes copied out
//! of memory (the vDSO).
//! Output: [`ElfInfo`] (load segments, section headers, GNU build-id) and section bytes.
//! Constraints: the file is untrusted (a target process chose it): every count and length is
//! bounded, every read is checked, nothing panics. x86-64 only: ELF64 little-endian.

use std::io;
use std::os::unix::fs::FileExt;

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

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const SHT_NOTE: u32 = 7;
/// `SHT_NOBITS`: the section occupies no file bytes (`.bss`, and every section of a split
/// debug file that lives in the stripped binary).
pub const SHT_NOBITS: u32 = 8;
/// `SHF_COMPRESSED`: section data starts with a `Elf64_Chdr`.
pub const SHF_COMPRESSED: u64 = 0x800;
/// `PF_X`.
pub const PF_X: u32 = 1;
const NT_GNU_BUILD_ID: u32 = 3;

/// Reading at an absolute offset.
pub trait ReadAt {
    /// Like `pread`: fill as much of `buf` as possible from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
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

fn u16_at(b: &[u8], off: usize) -> u16 {
    b.get(off..off + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    })
}

/// Read the ELF header, program headers, section headers and build-id.
pub fn read_elf_info(r: &(impl ReadAt + ?Sized)) -> Result<ElfInfo, ElfError> {
    let eh = read_exact(r, 0, 64)?;
    // ELFCLASS64 = 2, ELFDATA2LSB = 1.
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let elf_type = u16_at(&eh, 16);
    let phoff = u64_at(&eh, 32);
    let phentsize = usize::from(u16_at(&eh, 54));
    let phnum = usize::from(u16_at(&eh, 56));

    let mut info = ElfInfo {
        elf_type,
        ..ElfInfo::default()
    };
    let mut notes = Vec::new();
    if phoff != 0 && phnum != 0 {
        if phnum > MAX_PHDRS || !(56..=256).contains(&phentsize) {
            return Err(ElfError::TooLarge {
                what: "program header table",
                value: phnum as u64,
            });
        }
        let ph = read_exact(r, phoff, phnum * phentsize)?;
        for i in 0..phnum {
            let p = &ph[i * phentsize..];
            let seg = LoadSegment {
                vaddr: u64_at(p, 16),
                offset: u64_at(p, 8),
                filesz: u64_at(p, 32),
                memsz: u64_at(p, 40),
                flags: u32_at(p, 4),
            };
            match u32_at(p, 0) {
                PT_LOAD => info.loads.push(seg),
                PT_NOTE => notes.push((seg.offset, seg.filesz)),
                _ => {}
            }
        }
    }

    info.sections = read_sections(r, &eh)?;
    if notes.is_empty() {
        notes.extend(
            info.sections
                .iter()
                .filter(|s| s.sh_type == SHT_NOTE)
                .map(|s| (s.offset, s.size)),
        );
    }

    let mut budget = MAX_NOTES;
    for (offset, size) in notes {
        let size = size.min(budget);
        budget -= size;
        let Ok(bytes) = read_exact(r, offset, size as usize) else {
            continue;
        };
        if let Some(id) = find_build_id(&bytes) {
            info.build_id = Some(id);
            break;
        }
    }
    Ok(info)
}

/// Section headers with names; empty if the file has none.
fn read_sections(r: &(impl ReadAt + ?Sized), eh: &[u8]) -> Result<Vec<Section>, ElfError> {
    let shoff = u64_at(eh, 40);
    let shentsize = usize::from(u16_at(eh, 58));
    let mut shnum = usize::from(u16_at(eh, 60));
    let mut shstrndx = usize::from(u16_at(eh, 62));
    if shoff == 0 || !(64..=256).contains(&shentsize) {
        return Ok(Vec::new());
    }
    // Extended numbering: the real counts live in section 0.
    if shnum == 0 || shstrndx == 0xffff {
        let s0 = read_exact(r, shoff, 64)?;
        if shnum == 0 {
            shnum = usize::try_from(u64_at(&s0, 32)).unwrap_or(usize::MAX);
        }
        if shstrndx == 0xffff {
            shstrndx = u32_at(&s0, 40) as usize;
        }
    }
    if shnum > MAX_SHDRS {
        return Err(ElfError::TooLarge {
            what: "section header table",
            value: shnum as u64,
        });
    }
    let sh = read_exact(r, shoff, shnum * shentsize)?;
    let raw: Vec<(u32, Section)> = (0..shnum)
        .map(|i| {
            let s = &sh[i * shentsize..];
            let sec = Section {
                name: Vec::new(),
                sh_type: u32_at(s, 4),
                flags: u64_at(s, 8),
                addr: u64_at(s, 16),
                offset: u64_at(s, 24),
                size: u64_at(s, 32),
            };
            (u32_at(s, 0), sec)
        })
        .collect();
    let strtab = match raw.get(shstrndx) {
        Some((_, s)) if s.sh_type != SHT_NOBITS && s.size <= MAX_SHSTRTAB => {
            read_exact(r, s.offset, s.size as usize).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    Ok(raw
        .into_iter()
        .map(|(name_off, mut sec)| {
            if let Some(tail) = strtab.get(name_off as usize..) {
                let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
                sec.name = tail[..end].to_vec();
            }
            sec
        })
        .collect())
}

/// Walk `Elf64_Nhdr` records (4-byte aligned name and descriptor) for a GNU build-id.
fn find_build_id(notes: &[u8]) -> Option<Vec<u8>> {
    let align4 = |n: usize| n.checked_add(3).map(|v| v & !3);
    let mut pos = 0usize;
    while pos + 12 <= notes.len() {
        let namesz = u32_at(notes, pos) as usize;
        let descsz = u32_at(notes, pos + 4) as usize;
        let ntype = u32_at(notes, pos + 8);
        let name_start = pos + 12;
        let desc_start = name_start.checked_add(align4(namesz)?)?;
        let desc_end = desc_start.checked_add(descsz)?;
        if desc_end > notes.len() {
            return None;
        }
        if ntype == NT_GNU_BUILD_ID && notes.get(name_start..name_start + namesz) == Some(b"GNU\0")
        {
            return (descsz > 0 && descsz <= MAX_BUILD_ID)
                .then(|| notes[desc_start..desc_end].to_vec());
        }
        pos = desc_start.checked_add(align4(descsz)?)?;
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
        junk[..6].copy_from_slice(b"\x7fELF\x02\x01");
        junk[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        junk[54..56].copy_from_slice(&56u16.to_le_bytes());
        junk[56..58].copy_from_slice(&3u16.to_le_bytes());
        assert!(read_elf_info(&junk[..]).is_err());
        junk[56..58].copy_from_slice(&0xffffu16.to_le_bytes());
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
        assert_eq!(find_build_id(&n), Some(vec![1, 2, 3]));
        // Truncated descriptor.
        assert_eq!(find_build_id(&n[..n.len() - 3]), None);
        // Absurd sizes.
        let mut bad = vec![0xff; 12];
        bad.extend_from_slice(&[0; 8]);
        assert_eq!(find_build_id(&bad), None);
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
