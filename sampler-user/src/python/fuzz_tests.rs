//! Robustness: random and randomly corrupted memory images and layouts, in bounded time.
//!
//! A seeded xorshift generator (reproducible: the seed and iteration are printed on failure)
//! corrupts valid images of every flavor — bytes, pointers redirected into other objects or to
//! themselves, NULLs, stackref tags, huge lengths, truncated objects — and also builds layouts
//! from random `_Py_DebugOffsets` values. Every third snapshot also reads every frame's locals
//! (values of every kind, nested containers, cells). The reader must never panic, every output
//! must respect the caps (frames, threads, string lengths, value lengths, locals per frame), no
//! single read may exceed `MAX_READ`, and failures must show up in the error counts.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use super::assemble;
use super::code::{CodeCache, Ctx, Target};
use super::errors::ErrorCounts;
use super::layout::RuntimeLayout;
use super::memory::{ImageMemory, MAX_READ};
use super::testimage::{CodeSpec, Flavor, ImageBuilder, debug_offsets_bytes};
use super::testlocals::{CELL, FREE, LOCAL};
use super::values::ValueLimits;
use super::walker::{Limits, walk};
use crate::fuzzing::check_bounds;

/// A valid image, its object addresses and its non-zero words.
type Base = (ImageBuilder, Vec<u64>, Vec<(u64, usize)>);

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// A realistic image: two threads with deep stacks, TLBC copies where the layout has them,
/// names in `threading._active`, the GIL held.
pub(crate) fn rich_image(flavor: Flavor) -> ImageBuilder {
    let mut b = ImageBuilder::new(flavor);
    let f = b.code(&CodeSpec::simple(
        "f",
        "/opt/ф.py",
        3,
        &[(3, 1), (4, 2), (2, 3), (9, 8)],
    ));
    let g = b.code(&CodeSpec::simple(
        "Klass.g🚀",
        "/opt/g.py",
        10,
        &[(10, 2), (11, 2)],
    ));
    let mut top = b.entry_frame(0);
    for i in 0..40 {
        top = if i % 2 == 0 {
            b.frame(f, i % 14, top)
        } else {
            b.frame(g, i % 4, top)
        };
    }
    if b.layout().code.tlbc.is_some() {
        let copy = b.tlbc_copy(f, 3);
        top = b.tlbc_frame(f, copy, 3, 5, top);
    }
    top = locals_frame(&mut b, top);
    let t1 = b.thread(11, 0x1000, top);
    let t2 = b.thread(12, 0x2000, top);
    b.thread_flags(t1, true, true);
    b.set_gil(Some(t2), Some(1));
    b.threading_active(&[(0x1000, "MainThread"), (0x2000, "w-ü")], true);
    b
}

/// A frame with arguments and locals of every kind of value (containers nested, a cell).
#[allow(
    clippy::many_single_char_names,
    reason = "short names mirror the Python values"
)]
fn locals_frame(b: &mut ImageBuilder, previous: u64) -> u64 {
    if b.layout().code.localsplusnames.is_none() {
        // ≤ 3.10: named by co_varnames/co_cellvars/co_freevars, the cells after the locals.
        let code = b.code_with_classic_locals(
            &CodeSpec::simple("h", "/opt/h.py", 1, &[(1, 2), (2, 2)]),
            (&["a", "é", "l"], &["a", "c"], &["f"]),
            (1, 0, 0),
        );
        let one = b.small_int(1);
        let text = b.str_object("ключ 🐍 'q'");
        let t = b.tuple_object(&[one, text]);
        let l = b.list_object(&[t, text, one, one, one, one, one, one, one, one]);
        let d = b.dict_of(&[(text, l), (one, t)]);
        let (ca, cc, cf) = (b.cell_object(one), b.cell_object(d), b.cell_object(l));
        return b.frame_with_locals(code, 2, previous, &[0, text, l, ca, cc, cf]);
    }
    let code = b.code_with_locals(
        &CodeSpec::simple("h", "/opt/h.py", 1, &[(1, 2), (2, 2)]),
        &[
            ("a", LOCAL),
            ("é", LOCAL),
            ("l", LOCAL),
            ("d", LOCAL),
            ("s", LOCAL),
            ("c", CELL),
            ("f", FREE),
        ],
        (1, 0, 0),
    );
    let one = b.small_int(1);
    let big = b.big_int(true, &[1, 2, 3, 4, 5]);
    let text = b.str_object("ключ 🐍 'q'");
    let fl = b.float_object(0.1);
    let by = b.bytes_object(b"\x00\xff");
    let t = b.tuple_object(&[one, big]);
    let inner = b.list_object(&[t, fl, by]);
    let l = b.list_object(&[inner, text, one, one, one, one, one, one, one, one]);
    let d = b.dict_of(&[(text, l), (one, inner)]);
    let s = b.set_of(false, &[one, text, fl]);
    let obj = b.instance("Thing");
    let c = b.cell_object(obj);
    let f = b.cell_object(d);
    let slots = [one, text, l, d, s, c, f].map(|o| b.slot(Some(o), true));
    b.frame_with_locals(code, 2, previous, &slots)
}

/// Every non-zero aligned word of an image (pointers, lengths, flags): the interesting targets.
fn live_words(mem: &ImageMemory) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    for (start, region) in mem.regions() {
        for (i, w) in region.chunks_exact(8).enumerate() {
            if w.iter().any(|&b| b != 0) {
                out.push((start, i * 8));
            }
        }
    }
    out
}

fn corrupt(rng: &mut XorShift, mem: &mut ImageMemory, anchors: &[u64], words: &[(u64, usize)]) {
    for _ in 0..=rng.below(6) {
        // Mostly words that hold something; sometimes anywhere.
        let (start, at) = if rng.below(5) != 0 {
            words[rng.below(words.len() as u64) as usize]
        } else {
            let start = anchors[rng.below(anchors.len() as u64) as usize];
            (start, rng.below(4096) as usize & !7)
        };
        let Some(region) = mem.regions_mut().find(|(a, _)| *a == start).map(|(_, v)| v) else {
            continue;
        };
        if at >= region.len() {
            continue;
        }
        let word = match rng.below(10) {
            0 => rng.next(),
            1 => 0,
            2 => 1,
            3 => (rng.next() << 2) | 3,
            4 => start + at as u64, // points at itself: loops
            5 => anchors[rng.below(anchors.len() as u64) as usize] + rng.below(64) * 8,
            6 => u64::MAX - rng.below(16),
            7 => 1 << (20 + rng.below(40)),
            8 => {
                region.truncate(at);
                continue;
            }
            _ => {
                let i = at + rng.below(8) as usize;
                if let Some(b) = region.get_mut(i) {
                    *b ^= 1 << rng.below(8);
                }
                continue;
            }
        };
        let end = (at + 8).min(region.len());
        region[at..end].copy_from_slice(&word.to_le_bytes()[..end - at]);
    }
}

fn snapshot(
    mem: &ImageMemory,
    layout: &RuntimeLayout,
    target: &Target,
    runtime: u64,
    limits: Limits,
    counts: &mut ErrorCounts,
) {
    let ctx = Ctx {
        mem,
        layout,
        target,
    };
    let mut cache = CodeCache::default();
    if let Ok(interps) = walk(ctx, runtime, &mut cache, counts, limits) {
        let threads = assemble(
            ctx,
            &interps,
            &std::collections::HashMap::<u32, u32>::new(),
            &|_| None,
            counts,
            limits,
        );
        check_bounds(&threads, limits);
    }
    assert!(
        mem.max_read() <= MAX_READ,
        "a read of {} bytes",
        mem.max_read()
    );
}

/// Random `_Py_DebugOffsets` values: rejected, or a layout the walker survives.
fn random_layout_round(rng: &mut XorShift, b: &ImageBuilder, counts: &mut ErrorCounts) {
    let with_offsets: Vec<Flavor> = Flavor::ALL
        .into_iter()
        .filter(|f| !f.0.fields.is_empty())
        .collect();
    let v = with_offsets[rng.below(with_offsets.len() as u64) as usize].version();
    let mut bytes = debug_offsets_bytes(v.minor, v.free_threaded);
    for _ in 0..=rng.below(4) {
        let at = 24 + 8 * rng.below(((bytes.len() - 24) / 8) as u64) as usize;
        let value = if rng.below(2) == 0 {
            rng.below(1 << 20)
        } else {
            rng.next()
        };
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    if let Ok(layout) = RuntimeLayout::build(v, &bytes) {
        let limits = Limits {
            max_depth: 16,
            max_threads: 3,
            max_interpreters: 2,
            locals: None,
        };
        snapshot(
            &b.memory(),
            &layout,
            &b.target(),
            b.runtime_addr(),
            limits,
            counts,
        );
    }
}

/// Fully random bytes at the runtime's address and at other objects' addresses.
fn random_memory_round(
    rng: &mut XorShift,
    b: &ImageBuilder,
    anchors: &[u64],
    counts: &mut ErrorCounts,
) {
    let mut mem = ImageMemory::new();
    for _ in 0..8 {
        let len = rng.below(4096) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let base = if rng.below(2) == 0 {
            b.runtime_addr()
        } else {
            anchors[rng.below(anchors.len() as u64) as usize]
        };
        mem.insert(base, bytes);
    }
    snapshot(
        &mem,
        b.layout(),
        &b.target(),
        b.runtime_addr(),
        Limits::default(),
        counts,
    );
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn corrupted_and_random_images_never_panic_and_stay_bounded() {
    let seed = env_u64("PYEBPF_FUZZ_SEED", 0x5eed_cafe_f00d_d00d);
    let budget = Duration::from_millis(env_u64("PYEBPF_FUZZ_MS", 5000));
    let deadline = Instant::now() + budget;
    let mut rng = XorShift(seed);
    let bases: Vec<Base> = Flavor::ALL
        .into_iter()
        .map(|f| {
            let b = rich_image(f);
            let mem = b.memory();
            let anchors = mem.regions().map(|(a, _)| a).collect();
            let words = live_words(&mem);
            (b, anchors, words)
        })
        .collect();
    let small = Limits {
        max_depth: 16,
        max_threads: 3,
        max_interpreters: 2,
        locals: None,
    };
    let (mut iterations, mut counts) = (0u64, ErrorCounts::default());
    while Instant::now() < deadline {
        iterations += 1;
        let (b, anchors, words) = &bases[rng.below(bases.len() as u64) as usize];
        let state = rng.0;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let mut mem = b.memory();
            corrupt(&mut rng, &mut mem, anchors, words);
            let limits = match iterations % 3 {
                0 => small,
                1 => Limits::default(),
                _ => Limits {
                    locals: Some(ValueLimits {
                        max_len: 40,
                        ..ValueLimits::default()
                    }),
                    ..small
                },
            };
            snapshot(
                &mem,
                b.layout(),
                &b.target(),
                b.runtime_addr(),
                limits,
                &mut counts,
            );
            if iterations % 8 == 0 {
                random_layout_round(&mut rng, b, &mut counts);
            }
            if iterations % 16 == 0 {
                random_memory_round(&mut rng, b, anchors, &mut counts);
            }
        }));
        assert!(
            result.is_ok(),
            "panic with PYEBPF_FUZZ_SEED={seed}, iteration {iterations} (rng state {state:#x})"
        );
    }
    eprintln!(
        "fuzz: {iterations} iterations in {budget:?}; counts {:?}",
        counts.nonzero().collect::<Vec<_>>()
    );
    assert!(
        iterations > 50,
        "too few iterations to mean anything: {iterations}"
    );
    assert!(
        counts.total() > 0,
        "corruption must show up in the error counts"
    );
}
