//! coredump: ELF core files as a source of target memory (`dump --core FILE [--root DIR]`).
//!
//! Owns: opening a core file (plain, or gzip-compressed: decompressed into an unnamed temporary
//! file), checking that it is an x86-64 Linux core that is complete, and its contents: the
//! `PT_LOAD` segments (memory), the threads (`NT_PRSTATUS`: ids and registers), the process
//! (`NT_PRPSINFO`) and the mapped files (`NT_FILE`); and [`CoreMemory`], the implementation of
//! the reader's memory trait over them.
//! Input: a path (and, for [`CoreMemory`], the directory the process's files are found under).
//! Output: a [`CoreFile`]; failures are [`CoreError`]s whose `Display` is one line.
//! Constraints: the file is untrusted. Headers and notes are decoded with `object` (the same
//! ELF crate as `procs`), every count and offset is checked against the file, reads are `pread`s
//! (no memory mapping: a file truncated under us cannot raise SIGBUS), a segment that extends
//! past the end of the file makes the core "truncated". Sources: `fs/binfmt_elf.c`
//! (`elf_core_dump`), gdb's `gcore` (`gdb/linux-tdep.c`), `include/uapi/linux/elf.h`.

pub mod memory;
pub mod notes;
#[cfg(test)]
pub(crate) mod testcore;

use std::fs::File;
use std::io::{self, Read as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use object::LittleEndian;
use object::elf::{FileHeader32, FileHeader64, PT_LOAD, PT_NOTE};
use object::read::elf::{FileHeader as _, NoteIterator, ProgramHeader as _};

pub use memory::{CoreMemory, MappedFiles};

use crate::procs::{Mapping, Perms};

/// The device number given to a core's mapped files (cores do not record it; no file system
/// has this one, so per-file caches keyed by device and inode never mix them with live files).
pub const CORE_DEVICE: (u32, u32) = (u32::MAX, u32::MAX);
pub use notes::{FileMapping, ProcessInfo, Registers, ThreadStatus};

/// Most program headers accepted (one per mapping: `vm.max_map_count` is 65530 by default).
const MAX_PHNUM: usize = 1 << 20;
/// Largest note segment read.
const MAX_NOTES: u64 = 256 << 20;
/// Largest decompressed size of a gzip-compressed core.
pub const MAX_DECOMPRESSED: u64 = 256 << 30;

/// A core file that cannot be used; `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is not a core file (not ELF)")]
    NotElf { path: String },
    #[error("{path} is {}, not a core dump", elf_kind(*kind))]
    NotCore { path: String, kind: u16 },
    #[error("{path} is a core dump of {machine}; this pyebpf reads x86-64 cores")]
    OtherArchitecture { path: String, machine: String },
    #[error(
        "{path} is truncated: its contents end at byte {needed}, the file has {size} bytes (core size limit or a full disk?)"
    )]
    Truncated {
        path: String,
        needed: u64,
        size: u64,
    },
    #[error("{path} is a malformed core file: {detail}")]
    Malformed { path: String, detail: String },
    #[error("{path} holds no thread (no NT_PRSTATUS note)")]
    NoThreads { path: String },
    #[error("{path}: cannot decompress: {source}")]
    Gzip { path: String, source: io::Error },
    #[error("{path} decompresses to more than {max} bytes")]
    TooLarge { path: String, max: u64 },
}

/// One `PT_LOAD` segment: `memsz` bytes at `vaddr`, of which the first `filesz` are in the core
/// at `offset` (0 when the dumper left the mapping out, e.g. read-only file-backed code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
    /// `p_flags`: `PF_X` 1, `PF_W` 2, `PF_R` 4 (the mapping's permissions).
    pub flags: u32,
}

/// An opened, checked core file.
#[derive(Debug)]
pub struct CoreFile {
    /// The path given (for messages).
    pub path: PathBuf,
    /// The core's bytes (the file itself, or its decompressed copy).
    data: File,
    /// It was gzip-compressed.
    pub compressed: bool,
    /// `PT_LOAD` segments, sorted by address.
    pub loads: Vec<Load>,
    /// Threads in note order (the kernel and gdb write the crashing/first thread first).
    pub threads: Vec<ThreadStatus>,
    pub process: ProcessInfo,
    /// `NT_FILE` entries, sorted by address.
    pub files: Vec<FileMapping>,
}

fn elf_kind(kind: u16) -> String {
    match kind {
        object::elf::ET_REL => "an ELF object file".into(),
        object::elf::ET_EXEC => "an ELF executable".into(),
        object::elf::ET_DYN => "an ELF shared object or executable".into(),
        other => format!("an ELF file of type {other}"),
    }
}

fn machine_name(m: u16) -> String {
    match m {
        object::elf::EM_386 => "i386".into(),
        object::elf::EM_ARM => "arm".into(),
        object::elf::EM_AARCH64 => "aarch64".into(),
        object::elf::EM_PPC64 => "ppc64".into(),
        object::elf::EM_S390 => "s390x".into(),
        object::elf::EM_RISCV => "riscv".into(),
        object::elf::EM_LOONGARCH => "loongarch".into(),
        other => format!("ELF machine {other}"),
    }
}

impl CoreFile {
    /// Opens and checks `path` (see the module header).
    pub fn open(path: &Path) -> Result<CoreFile, CoreError> {
        let name = path.display().to_string();
        let io_err = |source| CoreError::Io {
            path: name.clone(),
            source,
        };
        let mut file = File::open(path).map_err(io_err)?;
        let mut magic = [0u8; 2];
        let n = file.read_at(&mut magic, 0).map_err(io_err)?;
        let compressed = n == 2 && magic == [0x1f, 0x8b];
        let data = if compressed {
            decompress(&mut file, &name)?
        } else {
            file
        };
        parse(path, data, compressed)
    }

    /// `pread` from the core's bytes: all of `buf` or an error.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.data.read_exact_at(buf, offset)
    }

    /// The load segment that contains `addr`, if any.
    pub fn load_for(&self, addr: u64) -> Option<&Load> {
        let i = self.loads.partition_point(|l| l.vaddr <= addr);
        let l = self.loads.get(i.checked_sub(1)?)?;
        (addr - l.vaddr < l.memsz).then_some(l)
    }

    /// The `NT_FILE` entry that maps `addr`, if any.
    pub fn file_for(&self, addr: u64) -> Option<&FileMapping> {
        let i = self.files.partition_point(|f| f.start <= addr);
        let f = self.files.get(i.checked_sub(1)?)?;
        (addr < f.end).then_some(f)
    }

    /// The process's mappings, as `procs` describes them: one per `NT_FILE` entry (permissions
    /// from the `PT_LOAD` segment at its start; gdb writes no segment at all for the mappings
    /// it leaves out, so then from `file_flags`, the flags of the mapped file's own segment;
    /// device and inode are not in cores, so every path gets a device no file system has and an
    /// inode of its own), and one per `PT_LOAD` segment no file maps (anonymous memory: stacks,
    /// heap, JIT code).
    pub fn mappings(&self, file_flags: &dyn Fn(&FileMapping) -> Option<u32>) -> Vec<Mapping> {
        let flags_of = |f: &FileMapping| {
            self.load_for(f.start)
                .map(|l| l.flags)
                .or_else(|| file_flags(f))
                .unwrap_or(object::elf::PF_R)
        };
        let perms = |flags: u32| Perms {
            read: flags & object::elf::PF_R != 0,
            write: flags & object::elf::PF_W != 0,
            exec: flags & object::elf::PF_X != 0,
            shared: false,
        };
        let mut ids: Vec<&str> = Vec::new();
        let mut out: Vec<Mapping> = Vec::new();
        for f in &self.files {
            let inode = if let Some(i) = ids.iter().position(|p| *p == f.path) {
                i as u64 + 1
            } else {
                ids.push(&f.path);
                ids.len() as u64
            };
            out.push(Mapping {
                start: f.start,
                end: f.end,
                file_offset: f.offset,
                perms: perms(flags_of(f)),
                dev: CORE_DEVICE,
                inode,
                path: Some(PathBuf::from(&f.path)),
            });
        }
        for l in &self.loads {
            let end = l.vaddr.saturating_add(l.memsz);
            if self.files.iter().any(|f| f.start < end && l.vaddr < f.end) {
                continue;
            }
            out.push(Mapping {
                start: l.vaddr,
                end,
                file_offset: 0,
                perms: perms(l.flags),
                dev: (0, 0),
                inode: 0,
                path: None,
            });
        }
        out.sort_by_key(|m| m.start);
        out
    }

    /// The pid the process had (from `NT_PRPSINFO`, else the first thread's id).
    pub fn pid(&self) -> u32 {
        if self.process.pid != 0 {
            self.process.pid
        } else {
            self.threads.first().map_or(0, |t| t.tid)
        }
    }
}

/// Decompresses a gzip core into an unnamed temporary file (deleted when closed).
fn decompress(file: &mut File, name: &str) -> Result<File, CoreError> {
    let gz = |source| CoreError::Gzip {
        path: name.to_owned(),
        source,
    };
    let mut out = tempfile::tempfile().map_err(|source| CoreError::Io {
        path: "a temporary file".into(),
        source,
    })?;
    let decoder = flate2::read::MultiGzDecoder::new(io::BufReader::new(&mut *file));
    let copied = io::copy(&mut decoder.take(MAX_DECOMPRESSED + 1), &mut out).map_err(gz)?;
    if copied > MAX_DECOMPRESSED {
        return Err(CoreError::TooLarge {
            path: name.to_owned(),
            max: MAX_DECOMPRESSED,
        });
    }
    Ok(out)
}

fn read_vec(data: &File, offset: u64, len: u64, name: &str) -> Result<Vec<u8>, CoreError> {
    let mut v = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX).min(1 << 40)];
    data.read_exact_at(&mut v, offset)
        .map_err(|source| CoreError::Io {
            path: name.to_owned(),
            source,
        })?;
    Ok(v)
}

/// Checks the ELF header: a little-endian ELF64 x86-64 core. Returns the header bytes.
fn check_header(data: &File, name: &str) -> Result<[u8; 64], CoreError> {
    let malformed = |detail: &str| CoreError::Malformed {
        path: name.to_owned(),
        detail: detail.to_owned(),
    };
    let name = name.to_owned();
    let mut head = [0u8; 64];
    let got = data.read_at(&mut head, 0).unwrap_or(0);
    if got < 20 || &head[..4] != b"\x7fELF" {
        return Err(CoreError::NotElf { path: name });
    }
    let le = LittleEndian;
    // Class and byte order first: a 32-bit or big-endian core is another architecture.
    let (kind, machine) = match (head[4], head[5]) {
        (object::elf::ELFCLASS64, object::elf::ELFDATA2LSB) if got == 64 => {
            let h = FileHeader64::<LittleEndian>::parse(&head[..])
                .map_err(|e| malformed(&e.to_string()))?;
            (h.e_type(le), h.e_machine(le))
        }
        (object::elf::ELFCLASS32, object::elf::ELFDATA2LSB) => {
            let h = FileHeader32::<LittleEndian>::parse(&head[..])
                .map_err(|e| malformed(&e.to_string()))?;
            (h.e_type(le), h.e_machine(le))
        }
        (_, object::elf::ELFDATA2MSB) => {
            let m = u16::from_be_bytes([head[18], head[19]]);
            (u16::from_be_bytes([head[16], head[17]]), m)
        }
        _ => return Err(malformed("unknown ELF class")),
    };
    if kind != object::elf::ET_CORE {
        return Err(CoreError::NotCore { path: name, kind });
    }
    if machine != object::elf::EM_X86_64 || head[4] != object::elf::ELFCLASS64 {
        return Err(CoreError::OtherArchitecture {
            path: name,
            machine: if head[4] == object::elf::ELFCLASS32 && machine == object::elf::EM_X86_64 {
                "x32".into()
            } else {
                machine_name(machine)
            },
        });
    }
    Ok(head)
}

fn parse(path: &Path, data: File, compressed: bool) -> Result<CoreFile, CoreError> {
    let name = path.display().to_string();
    let size = data
        .metadata()
        .map_err(|source| CoreError::Io {
            path: name.clone(),
            source,
        })?
        .len();
    let malformed = |detail: &str| CoreError::Malformed {
        path: name.clone(),
        detail: detail.to_owned(),
    };
    let head = check_header(&data, &name)?;
    let le = LittleEndian;
    let h =
        FileHeader64::<LittleEndian>::parse(&head[..]).map_err(|e| malformed(&e.to_string()))?;
    let phoff = h.e_phoff(le);
    let phnum = usize::from(h.e_phnum(le));
    if usize::from(h.e_phentsize(le)) != size_of::<object::elf::ProgramHeader64<LittleEndian>>()
        || phnum > MAX_PHNUM
    {
        return Err(malformed("bad program header table"));
    }
    let table_len = (phnum * 56) as u64;
    let needed = phoff.saturating_add(table_len);
    if needed > size {
        return Err(CoreError::Truncated {
            path: name,
            needed,
            size,
        });
    }
    let table = read_vec(&data, phoff, table_len, &name)?;
    let phdrs: &[object::elf::ProgramHeader64<LittleEndian>] =
        object::pod::slice_from_all_bytes(&table)
            .map_err(|()| malformed("bad program header table"))?;
    let mut core = CoreFile {
        path: path.to_owned(),
        data,
        compressed,
        loads: Vec::new(),
        threads: Vec::new(),
        process: ProcessInfo::default(),
        files: Vec::new(),
    };
    let mut end = needed;
    for ph in phdrs {
        let (offset, filesz) = (ph.p_offset(le), ph.p_filesz(le));
        let seg_end = offset
            .checked_add(filesz)
            .ok_or_else(|| malformed("segment overflows"))?;
        end = end.max(seg_end);
        match ph.p_type(le) {
            PT_LOAD => core.loads.push(Load {
                vaddr: ph.p_vaddr(le),
                memsz: ph.p_memsz(le),
                offset,
                filesz: filesz.min(ph.p_memsz(le)),
                flags: ph.p_flags(le),
            }),
            PT_NOTE if seg_end <= size => {
                if filesz > MAX_NOTES {
                    return Err(malformed("note segment too large"));
                }
                let bytes = read_vec(&core.data, offset, filesz, &name)?;
                read_notes(&mut core, &bytes, ph.p_align(le)).map_err(|d| malformed(&d))?;
            }
            _ => {}
        }
    }
    if end > size {
        return Err(CoreError::Truncated {
            path: name,
            needed: end,
            size,
        });
    }
    if core.threads.is_empty() {
        return Err(CoreError::NoThreads { path: name });
    }
    core.loads.sort_by_key(|l| l.vaddr);
    core.files.sort_by_key(|f| f.start);
    Ok(core)
}

fn read_notes(core: &mut CoreFile, bytes: &[u8], align: u64) -> Result<(), String> {
    let mut it = NoteIterator::<FileHeader64<LittleEndian>>::new(LittleEndian, align, bytes)
        .map_err(|e| e.to_string())?;
    while let Some(note) = it.next().map_err(|e| e.to_string())? {
        // The kernel and gdb name these notes "CORE" (the name has no NUL here).
        if note.name() != b"CORE" {
            continue;
        }
        let desc = note.desc();
        match note.n_type(LittleEndian) {
            notes::NT_PRSTATUS => core
                .threads
                .push(notes::prstatus(desc).map_err(|e| e.to_string())?),
            notes::NT_PRPSINFO => {
                core.process = notes::prpsinfo(desc).map_err(|e| e.to_string())?;
            }
            notes::NT_FILE => core.files = notes::files(desc).map_err(|e| e.to_string())?,
            _ => {}
        }
    }
    Ok(())
}
