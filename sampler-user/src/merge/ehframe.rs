//! Eval-loop pieces of a stripped file without its debug file, from `.eh_frame` and the code of
//! the exported `_PyEval_EvalFrameDefault`.
//!
//! Why it works: GCC moves the cold blocks of a function into a `.cold` part with its own FDE.
//! Such a part is no function: it runs on its parent's frame, so its FDE's CFA at its first
//! address is frame-based (Debian 3.14: `rbp+16`), never the `rsp+8` of a function entry. The
//! parent reaches it with plain jumps (`jmp`/`jcc rel32`), not calls. So: every rel32 jump of
//! the exported hot part whose target lies in such a *fragment* FDE names a piece of the eval
//! loop (cpython-layouts §11: Debian's 3.14 jumps from `0x598b92` to its `.cold` at `0x43fb58`).
//!
//! Owns: a bounded `.eh_frame` reader (CIE/FDE records, pointer encodings, the CFA rule at each
//! FDE's first address) and the jump scan. Input: the section bytes and the function's bytes.
//! Output: the fragment FDE ranges the function jumps into.
//! Constraints: untrusted bytes — every read is bounded, malformed records end the walk, nothing
//! panics. The jump scan reads every byte offset (no instruction decoder): a false target would
//! have to land inside a fragment FDE, which random bytes practically never do (`.text` is a
//! few MB of a ±2 GB displacement range), and calls are ignored. x86-64 only.

/// `DW_CFA_*` register numbers on x86-64.
const RSP: u64 = 7;

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

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let v = *self.b.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let v = self
            .b
            .get(self.pos..self.pos.checked_add(N)?)?
            .try_into()
            .ok()?;
        self.pos += N;
        Some(v)
    }
    fn uleb(&mut self) -> Option<u64> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
    }
    fn sleb(&mut self) -> Option<i64> {
        let (mut v, mut shift) = (0i64, 0u32);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= i64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Some(v);
            }
        }
    }
    /// A pointer in `DW_EH_PE` encoding `enc`; `base` is the address of `b[0]` (for pcrel).
    fn pointer(&mut self, enc: u8, base: u64) -> Option<u64> {
        let at = base.wrapping_add(self.pos as u64);
        let v = match enc & 0x0f {
            0x00 | 0x04 => u64::from_le_bytes(self.bytes::<8>()?),
            0x01 => self.uleb()?,
            0x02 => u64::from(u16::from_le_bytes(self.bytes::<2>()?)),
            0x03 => u64::from(u32::from_le_bytes(self.bytes::<4>()?)),
            0x09 => self.sleb()? as u64,
            0x0a => i64::from(i16::from_le_bytes(self.bytes::<2>()?)) as u64,
            0x0b => i64::from(i32::from_le_bytes(self.bytes::<4>()?)) as u64,
            0x0c => i64::from_le_bytes(self.bytes::<8>()?) as u64,
            _ => return None,
        };
        match enc & 0x70 {
            0x00 => Some(v),
            0x10 => Some(v.wrapping_add(at)),
            _ => None, // datarel/textrel/funcrel: not used by x86-64 toolchains for FDEs
        }
    }
}

/// What a CIE contributes to its FDEs.
#[derive(Clone, Copy)]
struct Cie {
    fde_encoding: u8,
    has_z: bool,
    data_align: i64,
    /// CFA register and offset after the CIE's initial instructions.
    cfa: Option<(u64, i64)>,
}

/// Applies CFA instructions up to the first location advance; returns the CFA rule, `None`
/// when it is not a plain register+offset (an expression, or an op we do not know).
fn cfa_at_start(insns: &[u8], mut cfa: Option<(u64, i64)>, data_align: i64) -> Option<(u64, i64)> {
    let mut r = Reader { b: insns, pos: 0 };
    while let Some(op) = r.u8() {
        match (op >> 6, op & 0x3f) {
            // advance_loc, set_loc, advance_loc1/2/4: the first address is behind us.
            (1, _) | (0, 0x01..=0x04) => break,
            // restore(reg), nop, remember_state, restore_state
            (3, _) | (0, 0x00 | 0x0a | 0x0b) => {}
            (0, 0x05 | 0x09 | 0x14) => {
                r.uleb()?;
                r.uleb()?;
            }
            // offset(reg) ULEB; restore_extended, undefined, same_value, GNU_args_size
            (2, _) | (0, 0x06 | 0x07 | 0x08 | 0x2e) => {
                r.uleb()?;
            }
            (0, 0x0c) => cfa = Some((r.uleb()?, r.uleb()? as i64)),
            (0, 0x0d) => cfa = Some((r.uleb()?, cfa.map_or(0, |c| c.1))),
            (0, 0x0e) => cfa = Some((cfa?.0, r.uleb()? as i64)),
            (0, 0x10 | 0x16) => {
                r.uleb()?;
                let n = r.uleb()? as usize;
                r.pos = r.pos.checked_add(n)?;
            }
            (0, 0x11 | 0x15) => {
                r.uleb()?;
                r.sleb()?;
            }
            (0, 0x12) => cfa = Some((r.uleb()?, r.sleb()?.wrapping_mul(data_align))),
            (0, 0x13) => cfa = Some((cfa?.0, r.sleb()?.wrapping_mul(data_align))),
            // def_cfa_expression (0x0f), or an op we do not know
            _ => return None,
        }
    }
    cfa
}

fn parse_cie(body: &[u8], base: u64) -> Option<Cie> {
    let mut r = Reader { b: body, pos: 0 };
    let version = r.u8()?;
    let aug_start = r.pos;
    while r.u8()? != 0 {}
    let aug = &body[aug_start..r.pos - 1];
    if aug.windows(2).any(|w| w == b"eh") {
        return None;
    }
    let _code_align = r.uleb()?;
    let data_align = r.sleb()?;
    if version == 1 {
        r.u8()?;
    } else {
        r.uleb()?;
    }
    let mut fde_encoding = 0;
    let has_z = aug.first() == Some(&b'z');
    if has_z {
        let len = r.uleb()? as usize;
        let end = r.pos.checked_add(len)?;
        for &c in &aug[1..] {
            match c {
                b'R' => fde_encoding = r.u8()?,
                b'L' => {
                    r.u8()?;
                }
                b'P' => {
                    let enc = r.u8()?;
                    r.pointer(enc & 0x7f, base)?;
                }
                _ => {}
            }
        }
        r.pos = end;
    }
    let insns = body.get(r.pos..)?;
    Some(Cie {
        fde_encoding,
        has_z,
        data_align,
        cfa: cfa_at_start(insns, None, data_align),
    })
}

/// Every FDE of an `.eh_frame` section loaded at `addr`, sorted by start. Stops at the first
/// malformed record (what was read before it is kept).
pub fn fdes(section: &[u8], addr: u64) -> Vec<Fde> {
    let mut out = Vec::new();
    let mut cies: Vec<(usize, Option<Cie>)> = Vec::new();
    let mut pos = 0usize;
    while let Some(len) = section.get(pos..pos + 4) {
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        if len == 0 || len == 0xffff_ffff {
            break; // terminator, or a 64-bit record (not emitted for x86-64 .eh_frame)
        }
        let Some(body) = section.get(pos + 4..(pos + 4).saturating_add(len)) else {
            break;
        };
        let id = u32::from_le_bytes(
            body.get(..4)
                .and_then(|b| b.try_into().ok())
                .unwrap_or_default(),
        );
        let base = addr.wrapping_add(pos as u64 + 8);
        if id == 0 {
            cies.push((pos, parse_cie(&body[4..], base)));
        } else if let Some(cie_pos) = (pos + 4).checked_sub(id as usize)
            && let Some(Some(cie)) = cies
                .iter()
                .rev()
                .find(|(p, _)| *p == cie_pos)
                .map(|(_, c)| *c)
            && let Some(fde) = parse_fde(&body[4..], base, &cie)
        {
            out.push(fde);
        }
        pos += 4 + len;
    }
    out.sort_by_key(|f| f.start);
    out
}

fn parse_fde(body: &[u8], base: u64, cie: &Cie) -> Option<Fde> {
    let mut r = Reader { b: body, pos: 0 };
    let start = r.pointer(cie.fde_encoding, base)?;
    let range = r.pointer(cie.fde_encoding & 0x0f, base)?;
    if cie.has_z {
        let n = r.uleb()? as usize;
        r.pos = r.pos.checked_add(n)?;
    }
    let cfa = cfa_at_start(body.get(r.pos..)?, cie.cfa, cie.data_align);
    Some(Fde {
        start,
        end: start.checked_add(range)?,
        // Only a known register rule counts: expression CFAs (PLT stubs) are no fragments.
        fragment: cfa.is_some_and(|c| c != (RSP, 8)),
    })
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
