//! Which unwind sections framehop may evaluate.
//!
//! Why: framehop evaluates DWARF expressions (`DW_CFA_def_cfa_expression`, `DW_CFA_expression`,
//! `DW_CFA_val_expression`) through gimli's `Evaluation` without a step bound. An expression
//! that branches backwards (`DW_OP_skip`, `DW_OP_bra`) loops: a 271-byte `.eh_frame` found by
//! `cargo xtask fuzz` pushed values until one unwind held 4 GB (with framehop's on-heap storage),
//! and a loop that pushes nothing would spin forever. Any file a sampled process maps can carry
//! such a section. Compilers emit only short straight-line expressions (PLT stubs, signal
//! trampolines), so a section with a branch or a long expression is withheld from framehop
//! (the file is then unwound with frame pointers) and counted.
//!
//! How the check sees what framehop sees: it walks the section front to back as framehop's own
//! index does (same gimli version, same base addresses, same address size), and checks the
//! initial instructions of every CIE an FDE names and every FDE's instructions. framehop finds
//! an FDE either through that walk (no `.eh_frame_hdr`, or `.debug_frame`) or through the
//! `.eh_frame_hdr` table, which may point anywhere in the section; so every table entry must
//! name an FDE the walk found, or the table is withheld too (framehop then indexes the walked
//! FDEs itself). With no branch, gimli runs each operation at most once: the cost of one
//! evaluation is bounded by [`MAX_EXPRESSION`]. The unwinder also uses framehop's
//! `MustNotAllocateDuringUnwind` policy (a 64-value stack), so even a missed loop cannot grow
//! memory.
//!
//! Input: the section bytes, the `.eh_frame_hdr` bytes, and the section addresses framehop
//! derives its base addresses from. Output: a [`Verdict`].
//! Constraints: untrusted bytes; every walk consumes input, so the cost is linear in the
//! section's size (each CIE is checked once, however many FDEs name it); nothing panics.
//! Measured (release, once per file, cached with its unwind data): libpython3.12's 312 KiB
//! `.eh_frame` in 1.3 ms, libc's 149 KiB in 0.6 ms, libLLVM's 7.4 MiB in 32 ms.

use std::collections::HashSet;
use std::ops::Range;

use gimli::{
    BaseAddresses, CallFrameInstruction, CieOrFde, DebugFrame, EhFrame, EhFrameHdr, Encoding,
    EndianSlice, LittleEndian, Operation, UnwindSection,
};

/// Longest DWARF expression framehop may evaluate. x86-64 compilers emit at most ~20 bytes (the
/// PLT's CFA expression is 11).
pub const MAX_EXPRESSION: usize = 256;

/// What framehop may be given of one file's unwind sections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every expression framehop can reach is straight-line and short.
    Safe,
    /// As `Safe` for the walked FDEs, but the `.eh_frame_hdr` table names an FDE the walk did not
    /// find: give framehop the section without the table.
    WithoutHdr,
    /// Some expression branches or is longer than [`MAX_EXPRESSION`]: withhold the section.
    Unsafe,
}

/// The start addresses framehop derives its base addresses from (its
/// `base_addresses_for_sections`: a missing section counts as address 0).
pub fn bases(
    eh_frame: Option<&Range<u64>>,
    eh_frame_hdr: Option<&Range<u64>>,
    text: Option<&Range<u64>>,
    got: Option<&Range<u64>>,
) -> BaseAddresses {
    let start = |r: Option<&Range<u64>>| r.map_or(0, |r| r.start);
    BaseAddresses::default()
        .set_eh_frame(start(eh_frame))
        .set_eh_frame_hdr(start(eh_frame_hdr))
        .set_text(start(text))
        .set_got(start(got))
}

/// The verdict on an `.eh_frame` section and its optional `.eh_frame_hdr`.
pub fn check_eh_frame(eh_frame: &[u8], hdr: Option<&[u8]>, bases: &BaseAddresses) -> Verdict {
    let mut section = EhFrame::new(eh_frame, LittleEndian);
    section.set_address_size(8);
    let Some(walked) = walk(&section, bases) else {
        return Verdict::Unsafe;
    };
    let Some(hdr) = hdr else {
        return Verdict::Safe;
    };
    // As framehop: an unparsable header or one without a table finds no FDE at all.
    let Ok(parsed) = EhFrameHdr::new(hdr, LittleEndian).parse(bases, 8) else {
        return Verdict::Safe;
    };
    let Some(table) = parsed.table() else {
        return Verdict::Safe;
    };
    let mut rows = table.iter(bases);
    // Rows are fixed-size: one that fails to parse means the rest cannot be read either (the
    // lookup's binary search fails on them the same way). Each row consumes bytes.
    while let Ok(Some((_, fde))) = rows.next() {
        let Ok(offset) = table.pointer_to_offset(fde) else {
            continue;
        };
        if !walked.contains(&offset.0) {
            return Verdict::WithoutHdr;
        }
    }
    Verdict::Safe
}

/// The verdict on a `.debug_frame` section (framehop always indexes it by walking).
pub fn check_debug_frame(debug_frame: &[u8], bases: &BaseAddresses) -> Verdict {
    let mut section = DebugFrame::new(debug_frame, LittleEndian);
    section.set_address_size(8);
    match walk(&section, bases) {
        Some(_) => Verdict::Safe,
        None => Verdict::Unsafe,
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The offsets of every FDE a front-to-back walk parses, or `None` if an instruction of one of
/// them (or of its CIE) holds an expression framehop must not evaluate. A malformed entry ends
/// the walk (framehop's index stops there too; later FDEs are reachable only through a header
/// table, which [`check_eh_frame`] checks against this set).
fn walk<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
) -> Option<HashSet<usize>> {
    let mut fdes = HashSet::new();
    let mut cies = HashSet::new();
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        match entry {
            CieOrFde::Cie(cie) => {
                if cies.insert(cie.offset()) {
                    check(cie.instructions(section, bases), section, cie.encoding())?;
                }
            }
            CieOrFde::Fde(partial) => {
                // framehop parses an FDE with the CIE at the offset it names, as here.
                let Ok(fde) = partial.parse(S::cie_from_offset) else {
                    continue;
                };
                fdes.insert(fde.offset());
                let cie = fde.cie();
                if cies.insert(cie.offset()) {
                    check(cie.instructions(section, bases), section, cie.encoding())?;
                }
                check(fde.instructions(section, bases), section, cie.encoding())?;
            }
        }
    }
    Some(fdes)
}

/// `None` if an instruction of `instructions` (up to the first that does not parse, where
/// gimli's row evaluation stops too) has a branching or over-long expression.
fn check<'a, S: UnwindSection<Slice<'a>>>(
    mut instructions: gimli::CallFrameInstructionIter<'_, Slice<'a>>,
    section: &S,
    encoding: Encoding,
) -> Option<()> {
    while let Ok(Some(i)) = instructions.next() {
        let (CallFrameInstruction::DefCfaExpression { expression }
        | CallFrameInstruction::Expression { expression, .. }
        | CallFrameInstruction::ValExpression { expression, .. }) = i
        else {
            continue;
        };
        let Ok(expr) = expression.get(section) else {
            continue; // framehop's `get` fails the same way: nothing is evaluated
        };
        if expr.0.len() > MAX_EXPRESSION {
            return None;
        }
        let mut ops = expr.operations(encoding);
        // Evaluation parses the same operations in the same order; it fails at the first
        // that does not parse.
        while let Ok(Some(op)) = ops.next() {
            if matches!(op, Operation::Skip { .. } | Operation::Bra { .. }) {
                return None;
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests;
