//! The guard on synthetic sections (one property each), on the fuzz input that found the
//! problem, and on the real files of this machine (no false positives).

use std::sync::Arc;

use framehop::x86_64::UnwindRegsX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};

use super::*;
use crate::procs::elf::{ElfInfo, LoadSegment, Section};
use crate::unwind::modules::FileUnwindData;
use crate::unwind::{Cache, Unwinder};

/// Where the synthetic `.eh_frame` is linked, and its code.
const EH_ADDR: u64 = 0x2000;
const TEXT: u64 = 0x1000;
const HDR_ADDR: u64 = 0x3000;

/// `DW_CFA_def_cfa_expression` with `expr`.
fn def_cfa_expression(expr: &[u8]) -> Vec<u8> {
    let mut v = vec![0x0f];
    leb(&mut v, expr.len());
    v.extend_from_slice(expr);
    v
}

fn leb(v: &mut Vec<u8>, mut n: usize) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            v.push(b);
            return;
        }
        v.push(b | 0x80);
    }
}

/// An `.eh_frame` at [`EH_ADDR`]: one CIE (`zR`, pc-relative sdata4 pointers, CFA = rsp+8,
/// return address at CFA-8, then `cie_extra`), and one FDE per `(start, len, instructions)`.
/// Returns the section and each FDE's offset.
fn eh_frame(cie_extra: &[u8], fdes: &[(u64, u32, Vec<u8>)]) -> (Vec<u8>, Vec<usize>) {
    let mut s = Vec::new();
    let mut body = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 0x10, 1, 0x1b];
    body.extend_from_slice(&[0x0c, 0x07, 0x08, 0x90, 0x01]);
    body.extend_from_slice(cie_extra);
    while !(body.len() + 4).is_multiple_of(8) {
        body.push(0); // DW_CFA_nop
    }
    s.extend_from_slice(&(body.len() as u32).to_le_bytes());
    s.extend_from_slice(&body);
    let mut offsets = Vec::new();
    for (start, len, instructions) in fdes {
        let at = s.len();
        offsets.push(at);
        let cie_pointer = (at + 4) as u32; // from this field back to the CIE at 0
        let pc_field = EH_ADDR + at as u64 + 8;
        let mut body = cie_pointer.to_le_bytes().to_vec();
        body.extend_from_slice(&((*start as i64 - pc_field as i64) as i32).to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.push(0); // augmentation data length
        body.extend_from_slice(instructions);
        while !(body.len() + 4).is_multiple_of(8) {
            body.push(0);
        }
        s.extend_from_slice(&(body.len() as u32).to_le_bytes());
        s.extend_from_slice(&body);
    }
    s.extend_from_slice(&[0, 0, 0, 0]); // terminator
    (s, offsets)
}

/// A `.debug_frame`: one CIE (version 1, no augmentation, CFA = rsp+8), one FDE for
/// `TEXT..TEXT+0x40` with `instructions`.
fn debug_frame(instructions: &[u8]) -> Vec<u8> {
    let mut s = Vec::new();
    let mut cie = vec![
        0xff, 0xff, 0xff, 0xff, 1, 0, 1, 0x78, 0x10, 0x0c, 0x07, 0x08,
    ];
    while !(cie.len() + 4).is_multiple_of(8) {
        cie.push(0);
    }
    s.extend_from_slice(&(cie.len() as u32).to_le_bytes());
    s.extend_from_slice(&cie);
    let mut fde = 0u32.to_le_bytes().to_vec(); // the CIE at offset 0
    fde.extend_from_slice(&TEXT.to_le_bytes());
    fde.extend_from_slice(&0x40u64.to_le_bytes());
    fde.extend_from_slice(instructions);
    while !(fde.len() + 4).is_multiple_of(8) {
        fde.push(0);
    }
    s.extend_from_slice(&(fde.len() as u32).to_le_bytes());
    s.extend_from_slice(&fde);
    s
}

/// An `.eh_frame_hdr` at [`HDR_ADDR`] whose table maps each `(start, FDE offset)`.
fn eh_frame_hdr(rows: &[(u64, usize)]) -> Vec<u8> {
    // version 1; eh_frame_ptr pcrel sdata4; fde_count udata4; table datarel sdata4
    let mut h = vec![1, 0x1b, 0x03, 0x3b];
    h.extend_from_slice(&((EH_ADDR as i64 - (HDR_ADDR as i64 + 4)) as i32).to_le_bytes());
    h.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for (start, fde) in rows {
        h.extend_from_slice(&((*start as i64 - HDR_ADDR as i64) as i32).to_le_bytes());
        let fde_addr = EH_ADDR + *fde as u64;
        h.extend_from_slice(&((fde_addr as i64 - HDR_ADDR as i64) as i32).to_le_bytes());
    }
    h
}

fn test_bases(eh: &[u8], hdr: Option<&[u8]>) -> BaseAddresses {
    bases(
        Some(&(EH_ADDR..EH_ADDR + eh.len() as u64)),
        hdr.map(|h| HDR_ADDR..HDR_ADDR + h.len() as u64).as_ref(),
        Some(&(TEXT..TEXT + 0x100)),
        None,
    )
}

fn verdict(eh: &[u8], hdr: Option<&[u8]>) -> Verdict {
    check_eh_frame(eh, hdr, &test_bases(eh, hdr))
}

/// What x86-64 PLTs use: `rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)`.
const PLT: [u8; 11] = [
    0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
];
/// `DW_OP_breg7 8; DW_OP_lit13; DW_OP_and; DW_OP_lit11; DW_OP_skip -6` (the fuzz input's loop:
/// one more value on the stack per turn).
const PUSHING_LOOP: [u8; 8] = [0x77, 0x08, 0x3d, 0x1a, 0x3b, 0x2f, 0xfa, 0xff];
/// `DW_OP_breg7 8; DW_OP_nop; DW_OP_skip -4`: a loop that pushes nothing.
const SPIN: [u8; 6] = [0x77, 0x08, 0x96, 0x2f, 0xfc, 0xff];
/// `DW_OP_breg7 8; DW_OP_lit0; DW_OP_bra 0`: a conditional branch.
const BRA: [u8; 6] = [0x77, 0x08, 0x30, 0x28, 0x00, 0x00];

#[test]
fn straight_line_expressions_are_safe() {
    let (eh, _) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(&PLT))]);
    assert_eq!(verdict(&eh, None), Verdict::Safe);
    // Register rules too: DW_CFA_expression r6 and DW_CFA_val_expression r3.
    let mut rules = vec![0x10, 0x06, 2, 0x77, 0x10];
    rules.extend_from_slice(&[0x16, 0x03, 2, 0x77, 0x20]);
    let (eh, _) = eh_frame(&[], &[(TEXT, 0x40, rules)]);
    assert_eq!(verdict(&eh, None), Verdict::Safe);
}

#[test]
fn branching_expressions_are_unsafe_wherever_they_are() {
    for (what, expr) in [
        ("pushing loop", &PUSHING_LOOP[..]),
        ("spin", &SPIN[..]),
        ("bra", &BRA[..]),
    ] {
        // As a CFA rule of an FDE.
        let (eh, _) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(expr))]);
        assert_eq!(verdict(&eh, None), Verdict::Unsafe, "{what} in an FDE");
        // As a register rule (DW_CFA_expression r6), after a harmless FDE.
        let mut rule = vec![0x10, 0x06];
        leb(&mut rule, expr.len());
        rule.extend_from_slice(expr);
        let (eh, _) = eh_frame(
            &[],
            &[
                (TEXT, 0x10, def_cfa_expression(&PLT)),
                (TEXT + 0x10, 0x10, rule),
            ],
        );
        assert_eq!(verdict(&eh, None), Verdict::Unsafe, "{what} in a rule");
        // In the CIE's initial instructions (every FDE of it runs them).
        let (eh, _) = eh_frame(&def_cfa_expression(expr), &[(TEXT, 0x40, vec![])]);
        assert_eq!(verdict(&eh, None), Verdict::Unsafe, "{what} in the CIE");
        // In a .debug_frame (framehop indexes it by walking).
        let df = debug_frame(&def_cfa_expression(expr));
        assert_eq!(
            check_debug_frame(&df, &test_bases(&df, None)),
            Verdict::Unsafe,
            "{what} in .debug_frame"
        );
    }
    let df = debug_frame(&def_cfa_expression(&PLT));
    assert_eq!(
        check_debug_frame(&df, &test_bases(&df, None)),
        Verdict::Safe
    );
}

#[test]
fn long_expressions_are_unsafe() {
    let mut long = vec![0x77, 0x08];
    long.resize(MAX_EXPRESSION, 0x96); // DW_OP_nop
    let (eh, _) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(&long))]);
    assert_eq!(verdict(&eh, None), Verdict::Safe, "exactly the limit");
    long.push(0x96);
    let (eh, _) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(&long))]);
    assert_eq!(verdict(&eh, None), Verdict::Unsafe, "one byte over");
}

#[test]
fn a_header_table_may_only_name_walked_fdes() {
    let (eh, fdes) = eh_frame(
        &[],
        &[
            (TEXT, 0x10, def_cfa_expression(&PLT)),
            (TEXT + 0x10, 0x10, vec![]),
        ],
    );
    let good = eh_frame_hdr(&[(TEXT, fdes[0]), (TEXT + 0x10, fdes[1])]);
    assert_eq!(verdict(&eh, Some(&good)), Verdict::Safe);
    // A row pointing into the middle of an entry: framehop would parse an FDE there that no
    // walk sees (a hostile file can hide a looping expression that way).
    let hidden = eh_frame_hdr(&[(TEXT, fdes[0]), (TEXT + 0x10, fdes[1] + 4)]);
    assert_eq!(verdict(&eh, Some(&hidden)), Verdict::WithoutHdr);
    // A header that does not parse finds nothing in framehop either.
    assert_eq!(verdict(&eh, Some(&[2, 0, 0])), Verdict::Safe);
}

/// The input `cargo xtask fuzz` found (fuzz/regressions/eh_frame): its FDE's CFA rule is a
/// pushing loop, reachable only with the base addresses framehop uses (its pointers are
/// pc-relative).
#[test]
fn the_fuzz_input_is_unsafe() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/regressions/eh_frame/oom-branching-cfa-expression"
    );
    let data = std::fs::read(path).unwrap();
    let addr = u64::from_le_bytes(data[0..8].try_into().unwrap());
    let len = usize::from(u16::from_le_bytes([data[8], data[9]]));
    let section = &data[10..10 + len];
    let base = addr & !0xfff;
    let b = bases(
        Some(&(addr..addr + len as u64)),
        None,
        Some(&(base..addr)),
        None,
    );
    assert_eq!(check_eh_frame(section, None, &b), Verdict::Unsafe);
}

/// The frame framehop unwinds to from `TEXT + 4` when that address's CFA rule is `expr`, over
/// a stack whose return address is 0x1111 at `rsp` (what `rsp + 8` as CFA finds) and whose
/// frame-pointer chain, `rbp = rsp + 16`, leads to 0x2222 (framehop's fallback when the DWARF
/// rule fails).
fn caller_of(expr: &[u8]) -> Option<u64> {
    let (eh, _) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(expr))]);
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(TEXT..TEXT + 0x100),
        eh_frame_svma: Some(EH_ADDR..EH_ADDR + eh.len() as u64),
        eh_frame: Some(Arc::<[u8]>::from(&eh[..])),
        ..ExplicitModuleSectionInfo::default()
    };
    let mut unwinder = Unwinder::new();
    unwinder.add_module(Module::new("loop".into(), 0..0x4000, 0, info));
    let mut cache = Cache::new_in();
    let mut stack = [0u8; 64];
    stack[0..8].copy_from_slice(&0x1111u64.to_le_bytes());
    stack[24..32].copy_from_slice(&0x2222u64.to_le_bytes());
    let sp = 0x7000_0000u64;
    let mut read = |a: u64| -> Result<u64, ()> {
        let off = usize::try_from(a.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        let w = stack.get(off..off + 8).ok_or(())?;
        Ok(u64::from_le_bytes(w.try_into().unwrap()))
    };
    let ip = TEXT + 4;
    let mut frames = unwinder.iter_frames(
        ip,
        UnwindRegsX86_64::new(ip, sp, sp + 16),
        &mut cache,
        &mut read,
    );
    assert!(
        matches!(frames.next(), Ok(Some(_))),
        "the first frame is the ip"
    );
    match frames.next() {
        Ok(Some(f)) => Some(f.address()),
        _ => None,
    }
}

/// Even without the guard, framehop's fixed-size storage ends a pushing loop at 64 values: the
/// rule fails (framehop falls back to frame pointers) instead of growing memory until the
/// process dies, as the fuzz input did with on-heap storage.
#[test]
fn the_unwinder_storage_bounds_a_pushing_loop() {
    assert_eq!(
        caller_of(&PLT),
        Some(0x1111),
        "the DWARF rule is found and evaluated"
    );
    assert_eq!(
        caller_of(&PUSHING_LOOP),
        Some(0x2222),
        "the looping rule fails"
    );
}

/// A file built around a looping `.eh_frame` (as a sampled process could map): the section is
/// withheld at load, and counted as such.
#[test]
fn load_withholds_an_unsafe_section() {
    let (eh, fdes) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(&SPIN))]);
    let hdr = eh_frame_hdr(&[(TEXT, fdes[0])]);
    let mut image = vec![0u8; 0x4000];
    image[EH_ADDR as usize..EH_ADDR as usize + eh.len()].copy_from_slice(&eh);
    image[HDR_ADDR as usize..HDR_ADDR as usize + hdr.len()].copy_from_slice(&hdr);
    let section = |name: &str, addr: u64, size: usize| Section {
        name: name.as_bytes().to_vec(),
        sh_type: 1,
        flags: 2,
        addr,
        offset: addr,
        size: size as u64,
        link: 0,
    };
    let elf = |eh_bytes: usize| ElfInfo {
        elf_type: 3,
        loads: vec![LoadSegment {
            vaddr: 0,
            offset: 0,
            filesz: 0x4000,
            memsz: 0x4000,
            flags: 5,
        }],
        sections: vec![
            section(".text", TEXT, 0x100),
            section(".eh_frame", EH_ADDR, eh_bytes),
            section(".eh_frame_hdr", HDR_ADDR, hdr.len()),
        ],
        build_id: None,
    };
    let d = FileUnwindData::load(&image[..], elf(eh.len()));
    assert_eq!(d.withheld(), Some(Verdict::Unsafe));
    assert!(!d.has_unwind_info());

    // The same file with a straight-line rule keeps everything.
    let (eh2, _) = eh_frame(&[], &[(TEXT, 0x40, def_cfa_expression(&PLT))]);
    assert_eq!(eh2.len(), eh.len(), "same layout, so the header still fits");
    image[EH_ADDR as usize..EH_ADDR as usize + eh2.len()].copy_from_slice(&eh2);
    let d = FileUnwindData::load(&image[..], elf(eh2.len()));
    assert_eq!(d.withheld(), None);
    assert!(d.has_unwind_info());
}

/// Real binaries pass: this test's own executable and every shared library it maps as code
/// (libc, the loader), with their `.eh_frame_hdr` (the files the unwinder loads; other tests
/// also map separate debug files, whose unwind sections are `NOBITS`).
#[test]
fn real_files_are_safe() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut files: Vec<&str> = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .collect();
    files.sort_unstable();
    files.dedup();
    let mut checked = 0;
    for path in files {
        let Ok(f) = std::fs::File::open(path) else {
            continue;
        };
        let Ok(elf) = crate::procs::elf::read_elf_info(&f) else {
            continue;
        };
        let has_hdr = elf.section(b".eh_frame_hdr").is_some();
        let d = FileUnwindData::load(&f, elf);
        assert_eq!(d.withheld(), None, "{path}");
        if has_hdr {
            assert!(d.has_unwind_info(), "{path}");
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} files with .eh_frame_hdr checked");
}
