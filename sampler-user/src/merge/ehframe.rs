//! Eval-loop pieces of a stripped file without its debug file, from `.eh_frame` and the code of
//! the exported `_PyEval_EvalFrameDefault`.
//!
//! Why it works: GCC moves the cold blocks of a function into a `.cold` part with its own FDE.
//! Such a part is no function: it runs on its parent's frame, so its FDE's CFA at its first
//! address is frame-based (Debian 3.14: `rbp+16`), never the `rsp+8` of a function entry. The
//! parent reaches it with plain jumps (`jmp`/`jcc rel32`), not calls. So: every rel32 jump of
//! the exported hot part whose target lies in such a *fragment* FDE names a piece of the eval
//! loop (docs/cpython-layouts.md §9: Debian's 3.14 jumps from `0x598b92` to its `.cold` at `0x43fb58`).
//!
//! Owns: the FDE list of a `.eh_frame` section with the CFA rule at each FDE's first address
//! (read with gimli) and the jump scan. Input: the section bytes and the function's bytes.
//! Output: the fragment FDE ranges the function jumps into.
//! Constraints: untrusted bytes — gimli bounds every read, malformed records end the walk, the
//! FDE count is bounded, nothing panics. The jump scan reads every byte offset (no instruction
//! decoder): a false target would have to land inside a fragment FDE, which random bytes
//! practically never do (`.text` is a few MB of a ±2 GB displacement range), and calls are
//! ignored. x86-64 only.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection as _,
    X86_64,
};

/// Most FDEs read from one section (a large binary has ~100 000).
const MAX_FDES: usize = 1 << 20;

/// One FDE: its address range and whether it starts as a function entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fde {
    /// First address (link-time).
    pub start: u64,
    /// One past the last.
    pub end: u64,
    /// The CFA at `start` is not `rsp+8`: a part of a function, not its entry.
    pub fragment: bool,
}

/// Every FDE of an `.eh_frame` section loaded at `addr`, sorted by start. Stops at the first
/// malformed record (what was read before it is kept); an FDE that cannot be parsed or
/// evaluated is skipped.
pub fn fdes(section: &[u8], addr: u64) -> Vec<Fde> {
    let eh = EhFrame::new(section, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(addr);
    let mut ctx = UnwindContext::new();
    let mut entries = eh.entries(&bases);
    let mut out = Vec::new();
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            continue;
        };
        // The CIE's initial instructions plus the FDE's up to its first location advance.
        let fragment = fde
            .unwind_info_for_address(&eh, &bases, &mut ctx, start)
            .is_ok_and(|row| match row.cfa() {
                CfaRule::RegisterAndOffset { register, offset } => {
                    (*register, *offset) != (X86_64::RSP, 8)
                }
                // Only a known register rule counts: expression CFAs (PLT stubs) are no
                // fragments.
                CfaRule::Expression(_) => false,
            });
        out.push(Fde {
            start,
            end,
            fragment,
        });
        if out.len() >= MAX_FDES {
            break;
        }
    }
    out.sort_by_key(|f| f.start);
    out
}

/// The fragment FDEs that `code` (the bytes of a function at `addr`) reaches with a rel32
/// `jmp` (`e9`) or `jcc` (`0f 80`–`0f 8f`) outside itself.
pub fn jumped_fragments(code: &[u8], addr: u64, fdes: &[Fde]) -> Vec<Fde> {
    let end = addr.wrapping_add(code.len() as u64);
    let mut out: Vec<Fde> = Vec::new();
    for i in 0..code.len() {
        let (disp_at, len) = match (code[i], code.get(i + 1)) {
            (0xe9, _) => (i + 1, 5),
            (0x0f, Some(0x80..=0x8f)) => (i + 2, 6),
            _ => continue,
        };
        let Some(disp) = code.get(disp_at..disp_at + 4) else {
            continue;
        };
        let disp = i64::from(i32::from_le_bytes(disp.try_into().unwrap_or_default()));
        let target = addr
            .wrapping_add((i + len) as u64)
            .wrapping_add(disp as u64);
        if (addr..end).contains(&target) {
            continue;
        }
        let k = fdes.partition_point(|f| f.start <= target);
        if let Some(f) = k.checked_sub(1).map(|k| fdes[k])
            && target < f.end
            && f.fragment
            && !out.contains(&f)
        {
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.eh_frame` at `base`: one "zR" CIE (pcrel sdata4, CFA rsp+8), then FDEs for
    /// `(start, len, insns)`.
    fn eh_frame(base: u64, fdes: &[(u64, u32, &[u8])]) -> Vec<u8> {
        let mut s = Vec::new();
        let mut cie = vec![0, 0, 0, 0, 1];
        cie.extend_from_slice(b"zR\0");
        cie.extend_from_slice(&[1, 0x78, 16, 1, 0x1b]); // code 1, data -8, ra 16, aug len 1, R
        cie.extend_from_slice(&[0x0c, 7, 8, 0x90, 1]); // def_cfa rsp+8; offset rip cfa-8
        s.extend_from_slice(&(cie.len() as u32).to_le_bytes());
        s.extend_from_slice(&cie);
        for &(start, len, insns) in fdes {
            let at = s.len();
            let mut body = Vec::new();
            body.extend_from_slice(&((at + 4) as u32).to_le_bytes()); // CIE pointer → offset 0
            let field = base + at as u64 + 8;
            body.extend_from_slice(&((start.wrapping_sub(field)) as i32).to_le_bytes());
            body.extend_from_slice(&len.to_le_bytes());
            body.push(0); // augmentation data length
            body.extend_from_slice(insns);
            s.extend_from_slice(&(body.len() as u32).to_le_bytes());
            s.extend_from_slice(&body);
        }
        s.extend_from_slice(&[0, 0, 0, 0]);
        s
    }

    #[test]
    fn fragments_are_fdes_that_start_on_a_frame() {
        let base = 0x40_0000;
        let sec = eh_frame(
            base,
            &[
                (0x1000, 0x100, &[0x41, 0x0e, 16][..]), // entry: advance, then push
                (0x5000, 0x200, &[0x0c, 6, 16, 0x86, 2]), // .cold: def_cfa rbp+16 at once
                (0x9000, 0x10, &[0x0f, 1, 0x30]),       // expression CFA (a PLT stub)
            ],
        );
        let f = fdes(&sec, base);
        assert_eq!(
            f,
            [
                Fde {
                    start: 0x1000,
                    end: 0x1100,
                    fragment: false
                },
                Fde {
                    start: 0x5000,
                    end: 0x5200,
                    fragment: true
                },
                Fde {
                    start: 0x9000,
                    end: 0x9010,
                    fragment: false
                },
            ]
        );
        // Garbage and cut sections never panic.
        for cut in 0..sec.len() {
            let _ = fdes(&sec[..cut], base);
        }
        assert!(fdes(&[0xff; 64], base).is_empty());
    }

    #[test]
    fn only_jumps_into_fragments_count() {
        let fdes = [
            Fde {
                start: 0x1000,
                end: 0x1100,
                fragment: false,
            },
            Fde {
                start: 0x5000,
                end: 0x5200,
                fragment: true,
            },
            Fde {
                start: 0x6000,
                end: 0x6100,
                fragment: true,
            },
            Fde {
                start: 0x7000,
                end: 0x7100,
                fragment: false,
            },
        ];
        let rel = |from_end: u64, to: u64| (to.wrapping_sub(from_end) as i32).to_le_bytes();
        let mut code = vec![0x55, 0x48, 0x89, 0xe5]; // push rbp; mov rbp, rsp
        let at = |code: &Vec<u8>, n: usize| 0x1000 + (code.len() + n) as u64;
        let je = rel(at(&code, 6), 0x5010); // je into the first fragment
        code.extend_from_slice(&[0x0f, 0x84]);
        code.extend_from_slice(&je);
        let call = rel(at(&code, 5), 0x6000); // a call into the other fragment: not a jump
        code.push(0xe8);
        code.extend_from_slice(&call);
        let tail = rel(at(&code, 5), 0x7000); // a tail call to a function entry
        code.push(0xe9);
        code.extend_from_slice(&tail);
        let inside = rel(at(&code, 5), 0x1002); // a jump inside itself
        code.push(0xe9);
        code.extend_from_slice(&inside);
        let found = jumped_fragments(&code, 0x1000, &fdes);
        assert_eq!(found, [fdes[1]]);
    }

    /// Debian's stripped 3.14 and 3.15: the hot part jumps into exactly its `.cold` part.
    #[test]
    fn debian_stripped_interpreters() {
        use crate::procs::elf::{read_elf_info, read_section};
        let sid = "/var/cache/pyebpf-test/roots/sid/usr/bin";
        // (file, hot start, hot size, .cold start, .cold end) from the -dbg symbols.
        let cases = [
            (
                "python3.14",
                0x0059_8b80_u64,
                1184_u64,
                0x0043_fb58_u64,
                0x0045_451f_u64,
            ),
            (
                "python3.15",
                0x005c_6d90,
                844,
                0x0044_26eb,
                0x0044_26eb + 82_341,
            ),
        ];
        for (exe, hot, size, cold, cold_end) in cases {
            let Ok(f) = std::fs::File::open(format!("{sid}/{exe}")) else {
                crate::procs::tests::missing(&format!("no {exe} in the sid root"));
                continue;
            };
            let info = read_elf_info(&f).unwrap();
            let eh = info.section(b".eh_frame").unwrap();
            let all = fdes(&read_section(&f, eh, 64 << 20).unwrap(), eh.addr);
            assert!(all.len() > 1000, "{exe}: {} FDEs", all.len());
            let text = info.section(b".text").unwrap();
            let mut code = vec![0u8; size as usize];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut code, text.offset + hot - text.addr)
                .unwrap();
            let found = jumped_fragments(&code, hot, &all);
            assert_eq!(found.len(), 1, "{exe}: {found:x?}");
            assert_eq!(found[0].start, cold, "{exe}");
            assert!(
                found[0].end >= cold_end - 16 && found[0].end <= cold_end + 16,
                "{exe}: {found:x?}"
            );
        }
    }
}
