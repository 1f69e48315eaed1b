//! Walker tests on synthetic images of every flavor (3.8–3.15, 3.13t, 3.14t).
//!
//! Each image holds two threads: a worker in a method, under an `__init__` shim and an entry
//! frame, with non-ASCII names (string kinds 1, 2 and 4), a backwards line table and a CALL that
//! starts a location entry; and a main thread. The walk must give exactly the expected frames,
//! lines, names and GIL states. 3.14t adds thread-local bytecode with `tlbc_index != 0`.

use std::collections::HashMap;

use super::code::{CodeCache, Ctx};
use super::errors::{ErrorCounts, ErrorKind};
use super::layout::{GilAt, LineTableKind};
use super::testimage::{CodeSpec, Flavor, ImageBuilder};
use super::walker::{Limits, walk, walk_frames};
use super::{GilState, PyThread, assemble};

/// (function, file, line) innermost first.
type Stack = Vec<(&'static str, &'static str, i32)>;

struct Built {
    b: ImageBuilder,
    worker_stack: Stack,
    main_stack: Stack,
    worker_ts: u64,
    main_ts: u64,
}

const MAIN_IDENT: u64 = 0x7f3a_1c00_0740;
const WORKER_IDENT: u64 = 0x7f3a_1b7f_f6c0;

fn build(flavor: Flavor) -> Built {
    let mut b = ImageBuilder::new(flavor);
    // Main thread: `<module>` at line 40 (called from C: entry frame below).
    let module = b.code(&CodeSpec::simple(
        "<module>",
        "/opt/w.py",
        1,
        &[(1, 2), (40, 4)],
    ));
    let entry = b.entry_frame(0);
    let main_top = b.frame(module, 3, entry);
    // Worker: Thread._bootstrap → _bootstrap_inner → [entry] → Thread.run → level1 (backwards
    // table) → level2 (CALL at an entry start) → [shim] → K.__init__ → Worker.spin.
    let boot = b.code(&CodeSpec::simple(
        "Thread._bootstrap",
        "/usr/lib/python3/threading.py",
        1010,
        &[(1010, 2), (1032, 4)],
    ));
    let inner = b.code(&CodeSpec::simple(
        "Thread._bootstrap_inner",
        "/usr/lib/python3/threading.py",
        1040,
        &[(1040, 2), (1075, 4)],
    ));
    let run = b.code(&CodeSpec::simple(
        "Thread.run",
        "/usr/lib/python3/threading.py",
        990,
        &[(990, 1), (1012, 3)],
    ));
    let level1 = b.code(&CodeSpec::simple(
        "данные_🚀",
        "/opt/пример.py",
        20,
        &[(20, 2), (5, 2), (21, 2)],
    ));
    let level2 = b.code(&CodeSpec::simple(
        "café.<locals>.inner",
        "/opt/w.py",
        30,
        &[(30, 2), (31, 1), (32, 2)],
    ));
    let init = b.code(&CodeSpec::simple(
        "K.__init__",
        "/opt/w.py",
        8,
        &[(8, 1), (9, 3)],
    ));
    let spin = b.code(&CodeSpec::simple(
        "Worker.spin",
        "/opt/w.py",
        12,
        &[(12, 1), (13, 2), (14, 3)],
    ));
    let shim = b.init_shim_code();
    let e0 = b.entry_frame(0);
    let f_boot = b.frame(boot, 3, e0);
    let f_inner = b.frame(inner, 2, f_boot);
    let e1 = b.entry_frame(f_inner);
    let f_run = b.frame(run, 1, e1);
    let f_l1 = b.frame(level1, 3, f_run);
    let f_l2 = b.frame(level2, 2, f_l1);
    let shim_exec = shim | u64::from(b.layout().frame.stackref_tag_mask != 0);
    let shim_instr = b.instr_value(shim, 0);
    // The shim exists from 3.13 (tolerated on 3.11/3.12 images); ≤ 3.10 line tables cannot
    // express its "no location", so those images have none.
    let f_shim = if b.layout().code.linetable_kind == LineTableKind::Locations {
        b.frame_raw(shim_exec, shim_instr, 0, f_l2, 0)
    } else {
        f_l2
    };
    let f_init = b.frame(init, 2, f_shim);
    let f_spin = b.frame(spin, 4, f_init);
    let main_ts = b.thread(101, MAIN_IDENT, main_top);
    let worker_ts = b.thread(102, WORKER_IDENT, f_spin);
    b.thread_flags(worker_ts, true, true);
    b.thread_flags(main_ts, false, false);
    b.set_gil(Some(worker_ts), Some(1));
    b.threading_active(
        &[(MAIN_IDENT, "MainThread"), (WORKER_IDENT, "wörker-1")],
        true,
    );
    let worker_stack = vec![
        ("Worker.spin", "/opt/w.py", 14),
        ("K.__init__", "/opt/w.py", 9),
        ("café.<locals>.inner", "/opt/w.py", 31),
        ("данные_🚀", "/opt/пример.py", 5),
        ("Thread.run", "/usr/lib/python3/threading.py", 1012),
        (
            "Thread._bootstrap_inner",
            "/usr/lib/python3/threading.py",
            1075,
        ),
        ("Thread._bootstrap", "/usr/lib/python3/threading.py", 1032),
    ];
    Built {
        b,
        worker_stack,
        main_stack: vec![("<module>", "/opt/w.py", 40)],
        worker_ts,
        main_ts,
    }
}

fn snapshot(b: &ImageBuilder, limits: Limits) -> (Vec<PyThread>, ErrorCounts) {
    let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
    let ctx = Ctx {
        mem: &mem,
        layout: &layout,
        target: &target,
    };
    let (mut cache, mut counts) = (CodeCache::default(), ErrorCounts::default());
    let interps = walk(ctx, b.runtime_addr(), &mut cache, &mut counts, limits).unwrap();
    let host: HashMap<u32, u32> = [(101, 5101), (102, 5102)].into();
    let threads = assemble(ctx, &interps, &host, &|_| None, &mut counts, limits);
    (threads, counts)
}

fn stack_of(t: &PyThread) -> Vec<(&str, &str, i32)> {
    t.frames
        .iter()
        .map(|f| (f.function.as_str(), f.file.as_str(), f.line))
        .collect()
}

#[test]
fn every_flavor_gives_the_expected_stacks_names_and_gil() {
    for flavor in Flavor::ALL {
        let built = build(flavor);
        let (threads, counts) = snapshot(&built.b, Limits::default());
        assert_eq!(threads.len(), 2, "{flavor:?}");
        let (main, worker) = (&threads[0], &threads[1]);
        assert_eq!(stack_of(worker), built.worker_stack, "{flavor:?}");
        assert_eq!(stack_of(main), built.main_stack, "{flavor:?}");
        assert_eq!(
            (main.native_thread_id, main.host_tid, main.python_thread_id),
            (101, Some(5101), MAIN_IDENT)
        );
        assert_eq!(
            (worker.tstate_addr, main.tstate_addr),
            (built.worker_ts, built.main_ts)
        );
        assert_eq!(worker.name.as_deref(), Some("wörker-1"), "{flavor:?}");
        assert_eq!(main.name.as_deref(), Some("MainThread"));
        assert!(!worker.truncated && !main.truncated);
        assert_eq!(
            (worker.gil, main.gil),
            (GilState::Holds, GilState::DoesNotHold),
            "{flavor:?}"
        );
        assert_eq!(counts.total(), 0, "{flavor:?}: {counts:?}");
    }
}

#[test]
fn free_threaded_without_gil_is_no_gil_and_attached_is_reported() {
    for flavor in Flavor::ALL.into_iter().filter(|f| f.is_ft()) {
        let mut built = build(flavor);
        built.b.set_gil(Some(built.worker_ts), Some(0));
        let (threads, _) = snapshot(&built.b, Limits::default());
        assert!(
            threads.iter().all(|t| t.gil == GilState::NoGil),
            "{flavor:?}"
        );
        assert_eq!(threads[1].attached, Some(true));
        assert_eq!(threads[0].attached, Some(false));
    }
}

#[test]
fn unreadable_gil_falls_back_to_the_thread_flag() {
    for flavor in [Flavor::V313, Flavor::V314, Flavor::V315] {
        let mut built = build(flavor);
        let l = built.b.layout().clone();
        // `ceval.gil` pointing nowhere: the interpreter's GIL is unreadable.
        let GilAt::Interpreter { ceval_gil, .. } = l.gil.at else {
            unreachable!("3.13+ GILs are per interpreter")
        };
        built.b.w64(built.b.interp_addr() + ceval_gil, 0x10);
        let (threads, counts) = snapshot(&built.b, Limits::default());
        assert_eq!(
            (threads[1].gil, threads[0].gil),
            (GilState::Holds, GilState::DoesNotHold),
            "{flavor:?}"
        );
        assert_eq!(counts.get(ErrorKind::GilUnreadable), 1);
    }
}

#[test]
fn thread_local_bytecode_lines_and_fallback_314t() {
    let mut b = ImageBuilder::new(Flavor::V314T);
    let code = b.code(&CodeSpec::simple(
        "Worker.spin",
        "/opt/w.py",
        12,
        &[(12, 1), (13, 2), (14, 3)],
    ));
    let copy = b.tlbc_copy(code, 2);
    let entry = b.entry_frame(0);
    let good = b.tlbc_frame(code, copy, 2, 4, entry);
    // Index 5 is beyond `_PyCodeArray.size`: fall back to `co_code_adaptive`; the pointer is then
    // outside that bytecode, so the line is unknown and both events are counted.
    let bad = b.tlbc_frame(code, copy, 5, 4, entry);
    let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
    let ctx = Ctx {
        mem: &mem,
        layout: &layout,
        target: &target,
    };
    let (mut cache, mut counts) = (CodeCache::default(), ErrorCounts::default());
    let (frames, _) = walk_frames(ctx, good, &mut cache, &mut counts, 10).unwrap();
    assert_eq!(frames[0].line, 14);
    assert_eq!(counts.total(), 0);
    let (frames, _) = walk_frames(ctx, bad, &mut cache, &mut counts, 10).unwrap();
    assert_eq!(frames[0].line, -1);
    assert_eq!(
        (
            counts.get(ErrorKind::TlbcFallback),
            counts.get(ErrorKind::TornInstrPtr)
        ),
        (1, 1)
    );
}

#[test]
fn every_314t_code_reference_is_tagged_and_masked() {
    let mut b = ImageBuilder::new(Flavor::V314T);
    let code = b.code(&CodeSpec::simple("f", "/a.py", 1, &[(1, 2)]));
    let f = b.frame(code, 1, 0);
    let l = b.layout().clone();
    let mem = b.memory();
    let raw = super::memory::ReadMemory::read_u64(&mem, f + l.frame.executable).unwrap();
    assert_eq!(raw & 3, 1, "the builder tags like 3.14t");
    assert_eq!(l.frame.owner, Some(78));
    assert_eq!(l.object.header_size, 32);
    assert_eq!(
        (
            l.unicode.kind_shift,
            l.unicode.compact_bit,
            l.unicode.ascii_bit
        ),
        (8, 11, 12)
    );
    let target = b.target();
    let ctx = Ctx {
        mem: &mem,
        layout: &l,
        target: &target,
    };
    let (frames, _) = walk_frames(
        ctx,
        f,
        &mut CodeCache::default(),
        &mut ErrorCounts::default(),
        10,
    )
    .unwrap();
    assert_eq!(frames[0].function, "f");
}

#[test]
fn deep_recursion_is_complete_or_explicitly_truncated() {
    for flavor in [Flavor::V312, Flavor::V314T, Flavor::V315] {
        let mut b = ImageBuilder::new(flavor);
        let code = b.code(&CodeSpec::simple(
            "recurse",
            "/opt/r.py",
            3,
            &[(3, 1), (4, 3)],
        ));
        let mut top = b.entry_frame(0);
        for _ in 0..3000 {
            top = b.frame(code, 2, top);
        }
        let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &layout,
            target: &target,
        };
        let mut counts = ErrorCounts::default();
        let (frames, truncated) =
            walk_frames(ctx, top, &mut CodeCache::default(), &mut counts, 4096).unwrap();
        assert_eq!((frames.len(), truncated), (3000, false));
        assert!(frames.iter().all(|f| f.line == 4));
        let (frames, truncated) =
            walk_frames(ctx, top, &mut CodeCache::default(), &mut counts, 1000).unwrap();
        assert_eq!((frames.len(), truncated), (1000, true));
        assert_eq!(counts.get(ErrorKind::DepthTruncated), 1);
    }
}

#[test]
fn loops_bad_executables_and_unreadable_frames_are_counted() {
    for flavor in Flavor::ALL {
        let mut b = ImageBuilder::new(flavor);
        let code = b.code(&CodeSpec::simple("f", "/a.py", 1, &[(1, 2)]));
        let l = b.layout().clone();
        let a = b.frame(code, 0, 0);
        let c = b.frame(code, 0, a);
        b.w64(a + l.frame.previous, c); // a → c → a
        let null_exec = u64::from(l.frame.stackref_tag_mask != 0);
        let bad = b.frame_raw(null_exec, 0, 0, 0xdead_0000, 0); // unreadable `previous`
        let not_code = b.str_object("nope");
        let wrong = b.frame_raw(not_code, 0, 0, bad, 0);
        let (mem, target) = (b.memory(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &l,
            target: &target,
        };
        let mut counts = ErrorCounts::default();
        let (frames, truncated) =
            walk_frames(ctx, c, &mut CodeCache::default(), &mut counts, 100).unwrap();
        assert_eq!(
            (frames.len(), truncated, counts.get(ErrorKind::FrameLoop)),
            (2, true, 1),
            "{flavor:?}"
        );
        // A frame whose executable is no code object is no frame: the walk stops there.
        let (frames, truncated) =
            walk_frames(ctx, wrong, &mut CodeCache::default(), &mut counts, 100).unwrap();
        assert!(frames.is_empty() && truncated);
        assert_eq!(counts.get(ErrorKind::NotCode), 1);
        assert_eq!(counts.get(ErrorKind::BadExecutable), 0);
        let (frames, truncated) =
            walk_frames(ctx, bad, &mut CodeCache::default(), &mut counts, 100).unwrap();
        assert!(frames.is_empty() && truncated);
        assert_eq!(counts.get(ErrorKind::BadExecutable), 1);
        assert_eq!(counts.get(ErrorKind::MemoryRead), 1);
    }
}

#[test]
fn thread_cap_and_thread_list_loops() {
    let mut b = ImageBuilder::new(Flavor::V313);
    for i in 0..10 {
        b.thread(200 + i, 300 + i, 0);
    }
    let limits = Limits {
        max_threads: 4,
        ..Limits::default()
    };
    let (threads, counts) = snapshot(&b, limits);
    assert_eq!(threads.len(), 4);
    assert_eq!(counts.get(ErrorKind::TooManyThreads), 1);
    // Make the list circular.
    let l = b.layout().clone();
    let head =
        super::memory::ReadMemory::read_u64(&b.memory(), b.interp_addr() + l.interp.threads_head)
            .unwrap();
    let last = b.thread(999, 999, 0);
    b.w64(last + l.tstate.next, head);
    b.w64(b.interp_addr() + l.interp.threads_head, head);
    let mut first = head;
    for _ in 0..9 {
        first = super::memory::ReadMemory::read_u64(&b.memory(), first + l.tstate.next).unwrap();
    }
    b.w64(first + l.tstate.next, head);
    let (threads, counts) = snapshot(&b, Limits::default());
    assert_eq!(threads.len(), 10);
    assert_eq!(counts.get(ErrorKind::BadThreadList), 1);
}

/// The chain keeps the eval-loop activations (for the `--native` merge): up to 3.10 every
/// frame ends one; 3.11 the frame with `is_entry` set; from 3.12 an entry frame (owner 3), the
/// 3.15 base frame not counting.
#[test]
fn chain_items_mark_every_activation() {
    use super::walker::{ChainItem, walk_thread};
    use ChainItem::{Entry as E, Frame as F};
    for flavor in Flavor::ALL {
        let mut b = ImageBuilder::new(flavor);
        let (outer, inner) = (
            b.code(&CodeSpec::simple("outer", "/a.py", 1, &[(1, 4)])),
            b.code(&CodeSpec::simple("inner", "/a.py", 5, &[(5, 4)])),
        );
        // outer, called from C (an activation), calls inner through C (another activation).
        let bottom = b.entry_frame(0);
        let f_outer = b.frame(outer, 1, bottom);
        let middle = b.entry_frame(f_outer);
        let f_inner = b.frame(inner, 1, middle);
        let l = b.layout().clone();
        if let Some(off) = l.frame.is_entry {
            b.write(f_outer + off, &[1]);
            b.write(f_inner + off, &[1]);
        }
        let ts = b.thread(7, 0x70, f_inner);
        let (mem, target) = (b.memory(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &l,
            target: &target,
        };
        let (mut cache, mut counts) = (CodeCache::default(), ErrorCounts::default());
        let w = walk_thread(ctx, ts, &mut cache, &mut counts, Limits::default()).unwrap();
        assert_eq!(w.frames.len(), 2, "{flavor:?}");
        assert_eq!(w.items, [F(0), E, F(1), E], "{flavor:?}: two activations");
    }
}

/// ≤ 3.10 frames are `PyFrameObject`s: one whose `ob_type` is not `PyFrame_Type` (a stale
/// `f_back`, a freed frame) ends the stack there, marked truncated and counted as a wrong
/// type; 3.11+ frames have no type and are not checked.
#[test]
fn frame_objects_of_another_type_end_the_stack() {
    for flavor in Flavor::ALL {
        let mut b = ImageBuilder::new(flavor);
        let code = b.code(&CodeSpec::simple("f", "/a.py", 1, &[(1, 2)]));
        let l = b.layout().clone();
        // On the entry frame of its eval loop, as every real chain (3.12+) ends.
        let entry = b.entry_frame(0);
        let outer = b.frame(code, 0, entry);
        let middle = b.frame(code, 0, outer);
        let inner = b.frame(code, 0, middle);
        let (mem, target) = (b.memory(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &l,
            target: &target,
        };
        let mut counts = ErrorCounts::default();
        let (frames, truncated) =
            walk_frames(ctx, inner, &mut CodeCache::default(), &mut counts, 100).unwrap();
        assert_eq!((frames.len(), truncated), (3, false), "{flavor:?}");
        assert_eq!(counts.total(), 0, "{flavor:?}");
        assert_eq!(
            target.pyframe_type.is_some(),
            l.frame.is_object,
            "{flavor:?}"
        );
        // The middle frame's type becomes `str`.
        let str_type = target.known.get(super::objects::Known::Str).unwrap();
        b.w64(middle + l.object.ob_type, str_type);
        let mem = b.memory();
        let ctx = Ctx { mem: &mem, ..ctx };
        let (frames, truncated) =
            walk_frames(ctx, inner, &mut CodeCache::default(), &mut counts, 100).unwrap();
        if l.frame.is_object {
            assert_eq!((frames.len(), truncated), (1, true), "{flavor:?}");
            assert_eq!(counts.get(ErrorKind::WrongType), 1, "{flavor:?}");
        } else {
            // 3.11+: the word at offset 8 of an interpreter frame is another field.
            assert_eq!(counts.get(ErrorKind::WrongType), 0, "{flavor:?}");
        }
    }
}

/// 3.12+: a chain that ends on a Python frame instead of its eval loop's entry frame was read
/// while it changed (a generator that yielded cleared its `previous`): marked truncated and
/// counted, so `dump` reads the thread again; ≤ 3.11 chains have no entry frames to check.
#[test]
fn chain_without_its_entry_frame_is_cut_short() {
    for flavor in Flavor::ALL {
        let mut b = ImageBuilder::new(flavor);
        let code = b.code(&CodeSpec::simple("g", "/a.py", 1, &[(1, 2)]));
        let l = b.layout().clone();
        let detached = b.frame(code, 0, 0);
        let (mem, target) = (b.memory(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &l,
            target: &target,
        };
        let mut counts = ErrorCounts::default();
        let (frames, truncated) =
            walk_frames(ctx, detached, &mut CodeCache::default(), &mut counts, 100).unwrap();
        let has_entry_frames = l.frame.is_shim_owner(3);
        assert_eq!(frames.len(), 1, "{flavor:?}");
        assert_eq!(truncated, has_entry_frames, "{flavor:?}");
        assert_eq!(
            counts.get(ErrorKind::NotAFrame),
            u64::from(has_entry_frames),
            "{flavor:?}"
        );
    }
}
