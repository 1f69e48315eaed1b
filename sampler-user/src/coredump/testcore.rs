//! Synthetic core files (tests only): an ELF64 `ET_CORE` with `CORE` notes and `PT_LOAD`
//! segments laid out as the kernel writes them, so the parser, the memory and the error paths
//! can be tested without a crash. Real cores (gcore and the kernel's) are tested end to end.

use std::io::Write as _;

use super::notes::{NT_FILE, NT_PRPSINFO, NT_PRSTATUS};

/// Builds the bytes of a core file.
pub struct CoreBuilder {
    pub machine: u16,
    pub class: u8,
    pub e_type: u16,
    notes: Vec<u8>,
    /// (vaddr, memsz, bytes in the file)
    loads: Vec<(u64, u64, Vec<u8>)>,
}

impl Default for CoreBuilder {
    fn default() -> Self {
        CoreBuilder {
            machine: object::elf::EM_X86_64,
            class: object::elf::ELFCLASS64,
            e_type: object::elf::ET_CORE,
            notes: Vec::new(),
            loads: Vec::new(),
        }
    }
}

fn pad4(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
}

impl CoreBuilder {
    pub fn note(&mut self, n_type: u32, desc: &[u8]) -> &mut Self {
        self.notes.extend(5u32.to_le_bytes());
        self.notes.extend((desc.len() as u32).to_le_bytes());
        self.notes.extend(n_type.to_le_bytes());
        self.notes.extend(b"CORE\0");
        pad4(&mut self.notes);
        self.notes.extend(desc);
        pad4(&mut self.notes);
        self
    }

    pub fn thread(&mut self, tid: u32, rip: u64, rsp: u64, rbp: u64, fs_base: u64) -> &mut Self {
        let d = super::notes::tests::prstatus_desc(tid, rip, rsp, rbp, fs_base);
        self.note(NT_PRSTATUS, &d)
    }

    pub fn process(&mut self, pid: u32, comm: &str) -> &mut Self {
        let mut d = vec![0u8; 136];
        d[24..28].copy_from_slice(&pid.to_le_bytes());
        d[40..40 + comm.len()].copy_from_slice(comm.as_bytes());
        self.note(NT_PRPSINFO, &d)
    }

    pub fn files(&mut self, entries: &[(u64, u64, u64, &str)]) -> &mut Self {
        let d = super::notes::tests::files_desc(4096, entries);
        self.note(NT_FILE, &d)
    }

    /// Memory at `vaddr` held by the core.
    pub fn load(&mut self, vaddr: u64, bytes: Vec<u8>) -> &mut Self {
        self.loads.push((vaddr, bytes.len() as u64, bytes));
        self
    }

    /// A mapping the dumper left out (`p_filesz` 0).
    pub fn hole(&mut self, vaddr: u64, memsz: u64) -> &mut Self {
        self.loads.push((vaddr, memsz, Vec::new()));
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let phnum = 1 + self.loads.len();
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = self.class;
        out[5] = object::elf::ELFDATA2LSB;
        out[6] = 1;
        out[16..18].copy_from_slice(&self.e_type.to_le_bytes());
        out[18..20].copy_from_slice(&self.machine.to_le_bytes());
        out[20..24].copy_from_slice(&1u32.to_le_bytes());
        out[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        out[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        out[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        out[56..58].copy_from_slice(&(phnum as u16).to_le_bytes());
        let mut data_at = 64 + 56 * phnum as u64;
        let mut phdrs = Vec::new();
        let mut body: Vec<u8> = Vec::new();
        let mut ph = |p_type: u32, offset: u64, vaddr: u64, filesz: u64, memsz: u64, align: u64| {
            let mut h = vec![0u8; 56];
            h[0..4].copy_from_slice(&p_type.to_le_bytes());
            h[8..16].copy_from_slice(&offset.to_le_bytes());
            h[16..24].copy_from_slice(&vaddr.to_le_bytes());
            h[32..40].copy_from_slice(&filesz.to_le_bytes());
            h[40..48].copy_from_slice(&memsz.to_le_bytes());
            h[48..56].copy_from_slice(&align.to_le_bytes());
            phdrs.extend(h);
        };
        ph(
            object::elf::PT_NOTE,
            data_at,
            0,
            self.notes.len() as u64,
            0,
            4,
        );
        body.extend(&self.notes);
        data_at += self.notes.len() as u64;
        for (vaddr, memsz, bytes) in &self.loads {
            let off = if bytes.is_empty() { 0 } else { data_at };
            ph(
                object::elf::PT_LOAD,
                off,
                *vaddr,
                bytes.len() as u64,
                *memsz,
                4096,
            );
            body.extend(bytes);
            data_at += bytes.len() as u64;
        }
        out.extend(phdrs);
        out.extend(body);
        out
    }
}

/// Gzip-compresses `bytes`.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::coredump::{CoreError, CoreFile, CoreMemory, MappedFiles};
    use crate::python::memory::{MemError, ReadMemory};

    fn sample() -> CoreBuilder {
        let mut b = CoreBuilder::default();
        b.process(4242, "python3")
            .thread(4242, 0x40_1000, 0x7ffc_1000, 0, 0x7f00_0740)
            .thread(4243, 0x40_2000, 0x7ffc_9000, 0, 0x7f00_1740)
            .files(&[
                (0x40_0000, 0x40_2000, 0, "/usr/bin/fake"),
                (0x50_0000, 0x50_1000, 0, "/usr/lib/missing.so"),
                (0x60_0000, 0x60_1000, 0, "/../etc/shadow"),
                (0x70_0000, 0x70_1000, 0, "/memfd:x (deleted)"),
            ])
            .load(0x1000_0000, (0..8192u32).map(|i| i as u8).collect())
            .hole(0x40_0000, 0x2000)
            .hole(0x50_0000, 0x1000);
        b
    }

    #[test]
    fn parses_and_reads_core_and_mapped_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        // The mapped file: page 1 starts with "PAGE1", and it ends 100 bytes into page 1.
        let mut f = vec![0xaau8; 4096];
        f.extend(b"PAGE1");
        f.resize(4096 + 100, 0xbb);
        std::fs::write(root.join("usr/bin/fake"), &f).unwrap();
        for (name, bytes) in [
            ("core", sample().bytes()),
            ("core.gz", gzip(&sample().bytes())),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let core = Arc::new(CoreFile::open(&path).unwrap());
            assert_eq!(core.compressed, name == "core.gz");
            assert_eq!(core.pid(), 4242);
            assert_eq!(core.process.comm, "python3");
            assert_eq!(core.threads.len(), 2);
            assert_eq!(core.threads[1].regs.fs_base, 0x7f00_1740);
            assert_eq!(core.files.len(), 4);
            let mem = CoreMemory::new(core, Arc::new(MappedFiles::new(&root)));
            // From the core, across a page boundary.
            let mut b = [0u8; 8];
            mem.read(0x1000_0ffc, &mut b).unwrap();
            assert_eq!(b, [0xfc, 0xfd, 0xfe, 0xff, 0, 1, 2, 3]);
            // Left out of the core: from the file, zeros past its end.
            mem.read(0x40_1000, &mut b).unwrap();
            assert_eq!(&b[..5], b"PAGE1");
            let mut tail = [0xffu8; 4];
            mem.read(0x40_1000 + 100, &mut tail).unwrap();
            assert_eq!(tail, [0; 4]);
            // A missing file, a path leaving the root, nothing mapped at all.
            assert!(matches!(
                mem.read_u64(0x50_0000),
                Err(MemError::Fault { .. })
            ));
            assert!(mem.read_u64(0x60_0000).is_err());
            assert!(mem.read_u64(0x9999_0000).is_err());
            assert!(mem.read_u64(0x1000_2000).is_err(), "past the segment");
            assert_eq!(mem.files().missing(), ["/usr/lib/missing.so"]);
        }
    }

    /// A core naming a FIFO at a mapped path: the lookup neither blocks (opening a FIFO for
    /// reading waits for a writer) nor reads it; the path counts as missing.
    #[test]
    fn a_fifo_at_a_mapped_path_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        let fifo = dir.path().join("usr/bin/fake");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let files = MappedFiles::new(dir.path());
        let t0 = std::time::Instant::now();
        assert!(files.open("/usr/bin/fake").is_none());
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(files.missing(), ["/usr/bin/fake"]);
    }

    fn open_err(b: &[u8]) -> CoreError {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c");
        std::fs::write(&p, b).unwrap();
        CoreFile::open(&p).unwrap_err()
    }

    #[test]
    fn every_bad_core_is_a_one_line_error() {
        let good = sample().bytes();
        let e = open_err(b"#!/bin/sh\n");
        assert!(matches!(e, CoreError::NotElf { .. }), "{e}");
        let mut b = sample();
        b.e_type = object::elf::ET_EXEC;
        let e = open_err(&b.bytes());
        assert!(matches!(e, CoreError::NotCore { kind: 2, .. }), "{e}");
        assert!(
            e.to_string()
                .ends_with(" is an ELF executable, not a core dump"),
            "{e}"
        );
        let mut b = sample();
        b.machine = object::elf::EM_AARCH64;
        let e = open_err(&b.bytes());
        assert!(
            e.to_string()
                .contains("core dump of aarch64; this pyebpf reads x86-64 cores"),
            "{e}"
        );
        let mut b = sample();
        b.class = object::elf::ELFCLASS32;
        b.machine = object::elf::EM_386;
        let e = open_err(&b.bytes()[..52]);
        assert!(matches!(e, CoreError::OtherArchitecture { .. }), "{e}");
        let e = open_err(&good[..good.len() - 10]);
        assert!(
            matches!(e, CoreError::Truncated { needed, size, .. } if needed == good.len() as u64 && size + 10 == needed),
            "{e}"
        );
        let e = open_err(&gzip(&good[..good.len() - 10]));
        assert!(matches!(e, CoreError::Truncated { .. }), "{e}");
        let e = open_err(&gzip(&good)[..40]);
        assert!(matches!(e, CoreError::Gzip { .. }), "{e}");
        let mut b = CoreBuilder::default();
        b.process(1, "x").load(0x1000, vec![0; 16]);
        let e = open_err(&b.bytes());
        assert!(matches!(e, CoreError::NoThreads { .. }), "{e}");
        let mut bad_notes = sample();
        bad_notes.note(super::NT_FILE, &[1, 2, 3]);
        let e = open_err(&bad_notes.bytes());
        assert!(matches!(e, CoreError::Malformed { .. }), "{e}");
        for e in [open_err(&good[..30]), open_err(&[])] {
            assert_eq!(e.to_string().lines().count(), 1, "{e}");
        }
    }

    /// Seeded corruption of a valid core (bytes flipped, words replaced by extremes, the file
    /// cut): opening never panics, and a core that opens can be read anywhere without panic.
    #[test]
    fn corrupted_cores_never_panic() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/fake"), vec![7u8; 5000]).unwrap();
        let good = sample().bytes();
        let path = dir.path().join("c");
        let mut x: u64 = 0x5eed_c0de_0bad_f00d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut opened, mut refused) = (0, 0);
        for _ in 0..800 {
            let mut b = good.clone();
            for _ in 0..=next() % 4 {
                // Mostly the headers and notes, where the counts and offsets are.
                let span = if next() % 4 == 0 {
                    b.len()
                } else {
                    b.len().min(1024)
                };
                let at = (next() % span as u64) as usize;
                match next() % 4 {
                    0 => b[at] ^= 1 << (next() % 8),
                    1 if at + 8 <= b.len() => {
                        b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
                    }
                    2 if at + 8 <= b.len() => b[at..at + 8].copy_from_slice(&next().to_le_bytes()),
                    _ => b.truncate(at.max(1)),
                }
            }
            std::fs::write(&path, &b).unwrap();
            match CoreFile::open(&path) {
                Ok(core) => {
                    opened += 1;
                    let core = Arc::new(core);
                    let maps = core.mappings(&|_| Some(object::elf::PF_R | object::elf::PF_X));
                    assert!(maps.len() <= core.files.len() + core.loads.len());
                    let mem = CoreMemory::new(Arc::clone(&core), Arc::new(MappedFiles::new(&root)));
                    for _ in 0..8 {
                        let addr = match next() % 3 {
                            0 => next(),
                            1 => core.loads.first().map_or(0, |l| l.vaddr) + next() % 0x3000,
                            _ => 0x40_0000 + next() % 0x3000,
                        };
                        let _ = mem.read_vec(addr, (next() % 5000) as usize);
                    }
                }
                Err(e) => {
                    refused += 1;
                    assert_eq!(e.to_string().lines().count(), 1, "{e}");
                }
            }
        }
        assert!(
            opened > 0 && refused > 0,
            "opened {opened}, refused {refused}"
        );
    }
}
