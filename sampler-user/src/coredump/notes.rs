//! The notes of an x86-64 Linux core file that `dump --core` reads.
//!
//! Owns: decoding the descriptors of `NT_PRSTATUS` (one per thread: its id and registers),
//! `NT_PRPSINFO` (the process: pid, command name and arguments) and `NT_FILE` (the mapped
//! files: address ranges, file offsets, paths).
//! Input: a note's descriptor bytes. Output: [`ThreadStatus`], [`ProcessInfo`],
//! [`FileMapping`]s; malformed descriptors are [`NoteError`]s.
//! Constraints: the bytes come from an untrusted file: every count is checked against the
//! descriptor's length before it sizes anything. Layouts (x86-64): `struct elf_prstatus` and
//! `struct elf_prpsinfo` in the kernel's `include/linux/elfcore.h`, `user_regs_struct` in
//! `arch/x86/include/asm/user_64.h`, and `NT_FILE` as `fs/binfmt_elf.c` `fill_files_note`
//! writes it (<https://github.com/torvalds/linux/blob/v6.12/fs/binfmt_elf.c>): `count`,
//! `page_size`, `count` × {start, end, file offset in pages}, then `count` NUL-terminated names.

/// `NT_PRSTATUS`, `NT_PRPSINFO` and `NT_FILE` (`include/uapi/linux/elf.h`).
pub const NT_PRSTATUS: u32 = 1;
pub const NT_PRPSINFO: u32 = 3;
pub const NT_FILE: u32 = 0x4649_4c45;

/// Size of `struct elf_prstatus` on x86-64.
const PRSTATUS_SIZE: usize = 336;
/// `pr_pid` and `pr_reg` in `struct elf_prstatus`.
const PR_PID: usize = 32;
const PR_REG: usize = 112;
/// Size of `struct elf_prpsinfo` on x86-64; `pr_pid`, `pr_fname[16]`, `pr_psargs[80]`.
const PRPSINFO_SIZE: usize = 136;
const PS_PID: usize = 24;
const PS_FNAME: usize = 40;
const PS_PSARGS: usize = 56;
/// Most `NT_FILE` entries accepted (the kernel's own cap is `sysctl_max_map_count`, 65530 by
/// default; gdb writes at most as many).
const MAX_FILES: u64 = 1 << 20;

/// Registers of one thread, as `user_regs_struct` orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registers {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    /// The thread pointer: `pthread_self()` on glibc (= CPython's `thread_id`).
    pub fs_base: u64,
}

/// One `NT_PRSTATUS` note: a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadStatus {
    /// `pr_pid`: the thread id, in the pid namespace of whoever wrote the core.
    pub tid: u32,
    pub regs: Registers,
}

/// `NT_PRPSINFO`: the process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessInfo {
    pub pid: u32,
    /// `pr_fname` (the command name, 15 bytes at most).
    pub comm: String,
    /// `pr_psargs` (the first 80 bytes of the command line).
    pub args: String,
}

/// One `NT_FILE` entry: `[start, end)` maps `path` from byte `offset` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// The path as the process saw it (in its own root and mount namespace).
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("{what} note of {len} bytes is too short")]
    Short { what: &'static str, len: usize },
    #[error("NT_FILE note is malformed: {0}")]
    BadFiles(&'static str),
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// A fixed-size C string field: up to the first NUL (lossy UTF-8).
fn c_field(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

pub fn prstatus(desc: &[u8]) -> Result<ThreadStatus, NoteError> {
    if desc.len() < PRSTATUS_SIZE {
        return Err(NoteError::Short {
            what: "NT_PRSTATUS",
            len: desc.len(),
        });
    }
    let reg = |i: usize| u64_at(desc, PR_REG + 8 * i).unwrap_or(0);
    Ok(ThreadStatus {
        tid: u32_at(desc, PR_PID).unwrap_or(0),
        // user_regs_struct: r15 r14 r13 r12 rbp(4) rbx r11 r10 r9 r8 rax rcx rdx rsi rdi
        // orig_rax rip(16) cs eflags rsp(19) ss fs_base(21) gs_base ds es fs gs.
        regs: Registers {
            rip: reg(16),
            rsp: reg(19),
            rbp: reg(4),
            fs_base: reg(21),
        },
    })
}

pub fn prpsinfo(desc: &[u8]) -> Result<ProcessInfo, NoteError> {
    if desc.len() < PRPSINFO_SIZE {
        return Err(NoteError::Short {
            what: "NT_PRPSINFO",
            len: desc.len(),
        });
    }
    Ok(ProcessInfo {
        pid: u32_at(desc, PS_PID).unwrap_or(0),
        comm: c_field(&desc[PS_FNAME..PS_FNAME + 16]),
        args: c_field(&desc[PS_PSARGS..PS_PSARGS + 80]),
    })
}

pub fn files(desc: &[u8]) -> Result<Vec<FileMapping>, NoteError> {
    let bad = NoteError::BadFiles;
    let count = u64_at(desc, 0).ok_or(bad("no count"))?;
    let page = u64_at(desc, 8).ok_or(bad("no page size"))?;
    // The kernel writes its page size and offsets in pages; gdb writes 1 and offsets in bytes.
    if count > MAX_FILES || !(page.is_power_of_two() && page <= 1 << 30) {
        return Err(bad("implausible count or page size"));
    }
    let table_end = 16 + 24 * count as usize;
    if desc.len() < table_end {
        return Err(bad("the table is longer than the note"));
    }
    let mut names = &desc[table_end..];
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let at = 16 + 24 * i;
        let (start, end, pages) = (
            u64_at(desc, at).unwrap_or(0),
            u64_at(desc, at + 8).unwrap_or(0),
            u64_at(desc, at + 16).unwrap_or(0),
        );
        let nul = names
            .iter()
            .position(|&c| c == 0)
            .ok_or(bad("fewer NUL-terminated names than entries"))?;
        let name = &names[..nul];
        names = &names[nul + 1..];
        if end < start {
            return Err(bad("an entry ends before it starts"));
        }
        out.push(FileMapping {
            start,
            end,
            offset: pages
                .checked_mul(page)
                .ok_or(bad("file offset overflows"))?,
            path: String::from_utf8_lossy(name).into_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An `NT_FILE` descriptor as the kernel writes it.
    pub(crate) fn files_desc(page: u64, entries: &[(u64, u64, u64, &str)]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend((entries.len() as u64).to_le_bytes());
        d.extend(page.to_le_bytes());
        for (s, e, pages, _) in entries {
            d.extend(s.to_le_bytes());
            d.extend(e.to_le_bytes());
            d.extend(pages.to_le_bytes());
        }
        for (.., name) in entries {
            d.extend(name.as_bytes());
            d.push(0);
        }
        d
    }

    /// An `NT_PRSTATUS` descriptor with these values.
    pub(crate) fn prstatus_desc(tid: u32, rip: u64, rsp: u64, rbp: u64, fs_base: u64) -> Vec<u8> {
        let mut d = vec![0u8; PRSTATUS_SIZE];
        d[PR_PID..PR_PID + 4].copy_from_slice(&tid.to_le_bytes());
        for (i, v) in [(16, rip), (19, rsp), (4, rbp), (21, fs_base)] {
            d[PR_REG + 8 * i..PR_REG + 8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        d
    }

    #[test]
    fn decodes_the_kernel_layouts() {
        let t = prstatus(&prstatus_desc(
            77,
            0x40_1000,
            0x7ffc_0000,
            0x7ffc_0100,
            0x7f00_0740,
        ))
        .unwrap();
        assert_eq!(t.tid, 77);
        assert_eq!(
            t.regs,
            Registers {
                rip: 0x40_1000,
                rsp: 0x7ffc_0000,
                rbp: 0x7ffc_0100,
                fs_base: 0x7f00_0740
            }
        );
        assert!(prstatus(&[0; 100]).is_err());
        let f = files(&files_desc(
            4096,
            &[
                (0x40_0000, 0x40_1000, 0, "/usr/bin/python3.14"),
                (0x7f00, 0x8f00, 3, "/lib/x é.so"),
            ],
        ))
        .unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[1].offset, 3 * 4096);
        assert_eq!(f[1].path, "/lib/x é.so");
        let mut ps = vec![0u8; PRPSINFO_SIZE];
        ps[PS_PID..PS_PID + 4].copy_from_slice(&1234u32.to_le_bytes());
        ps[PS_FNAME..PS_FNAME + 7].copy_from_slice(b"python3");
        ps[PS_PSARGS..PS_PSARGS + 12].copy_from_slice(b"python3 a.py");
        let p = prpsinfo(&ps).unwrap();
        assert_eq!(
            (p.pid, p.comm.as_str(), p.args.as_str()),
            (1234, "python3", "python3 a.py")
        );
    }

    #[test]
    fn malformed_file_notes_are_errors() {
        assert!(files(&[]).is_err());
        let mut d = files_desc(4096, &[(1, 2, 0, "a")]);
        d[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(files(&d).is_err(), "huge count");
        let d = files_desc(4096, &[(1, 2, 0, "a"), (3, 4, 0, "b")]);
        assert!(files(&d[..d.len() - 2]).is_err(), "a name missing");
        assert!(files(&files_desc(3000, &[])).is_err(), "page size");
        let gdb = files(&files_desc(1, &[(0x1000, 0x2000, 0x5000, "/a")])).unwrap();
        assert_eq!(gdb[0].offset, 0x5000, "gdb: page size 1, offsets in bytes");
        assert!(
            files(&files_desc(4096, &[(5, 4, 0, "x")])).is_err(),
            "end before start"
        );
        assert!(
            files(&files_desc(4096, &[(1, 2, u64::MAX, "x")])).is_err(),
            "offset overflow"
        );
    }
}
