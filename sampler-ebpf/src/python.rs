//! The in-kernel Python walk (issue 4): the sampled thread's Python frames at the sample instant.
//!
//! Input: the `PY_PROCS` entry of the sampled process (offsets derived by user space from the
//! target's `_Py_DebugOffsets`, see `sampler_common::PyProcInfo`), the host tid, and a
//! `PyCapture` inside the reserved ring-buffer record. Output: that `PyCapture` filled in
//! (thread state, GIL words, raw frame records innermost first, `py_flags`), the `PY_TSTATES`
//! cache, and the `Py*` counters.
//!
//! Chain (`docs/cpython-layouts.md` §3, 3.8–3.15): `*(runtime + interpreters_head)` →
//! `*(interp + threads_head)` → `next`…, then `*(interp + interp_next)` and its threads, …
//! (every interpreter, newest first), matching the sampled thread (§7.1: 3.11+
//! `native_thread_id` against the tid *as the target sees it*, in its pid namespace; ≤ 3.10
//! `thread_id`, the `pthread_t`, against the task's `thread.fsbase`) → top frame
//! `*(tstate + current_frame)` (3.11/3.12: through `cframe`) → `previous`…. A frame is one read of
//! `frame_read_bytes` (a ≤ 3.10 `PyFrameObject` up to `f_lasti`, or an `_PyInterpreterFrame`
//! header); absent fields (`owner` before 3.11, `is_entry` but in 3.11) are recorded as 0.
//! Frames are recorded raw (stackref tags, owners ≥ 3 and the `__init__` shim included): user
//! space masks, filters and resolves them. Each frame is checked first (issue 17,
//! `docs/cpython-layouts.md` §3.5): an `owner` above `owner_max`, or — for a frame that is no
//! entry frame — a code object that is misaligned, unreadable (one more read, of
//! `code_read_bytes`) or not of type `code_type`, is invalid: the walk stops there
//! (`INVALID_FRAME`, plus `CODE_UNREADABLE` when the code object's read failed: a page that
//! is not present at the sample instant fails as a garbage pointer does); with the code
//! object's name, file name and first line and the module namespace of module-level code
//! recorded, so that user space can tell (and name) a code object freed before it reads it.
//!
//! Sub-interpreters: a thread can have a thread state in several interpreters. The first match
//! with a frame wins; a match without one (3.12's `_xxsubinterpreters` keeps a sub-interpreter's
//! initial thread state, which carries the id of the thread that created it and has no frames)
//! is used only when no other match exists, and is not cached. The GIL words are those of the
//! found thread state's interpreter: `*(tstate + tstate_interp)` → `*(interp + ceval.gil)` (a
//! sub-interpreter sharing the main GIL points at the main one's; NULL → the embedded `_gil`).
//! When no thread state matches, the GIL of the last interpreter walked (the main one, at the
//! end of the list) is read, so that a free-threaded `enabled` is known for every sample.
//!
//! Constraints: every loop has a named constant budget; its body is a `bpf_loop`-style
//! callback, driven by the program variant (`variant.rs`): as `bpf_loop` (kernel ≥ 5.17), where
//! the verifier checks a callback body once, or as a bounded loop on older kernels, where it
//! walks every iteration (the walk state below is what keeps that affordable). Each frame costs one
//! `bpf_probe_read_user` of its header into a per-CPU scratch buffer, from which the fields are
//! picked at the runtime offsets through masked indices (bounds the verifier can see, checked
//! against `PyProcInfo::frame_offsets_fit` once per sample). The frame step is one global
//! function (`variant::pyebpf_frame_step`) whose state is per-CPU `PY_FRAME_WALK` and whose
//! frames go to per-CPU `PY_FRAMES`, copied into the record at the end: the verifier checks
//! its branches once, whichever variant drives it. Every failure sets a flag in the
//! capture and bumps a counter; frames read before a failure are kept. Verifier states: the
//! thread walk keeps its state in per-CPU map memory (`PY_WALK`), which the verifier does not
//! track, and the flags are counted without a branch on them (`count_flag`), so that paths
//! differing only in such values merge (~4.3k verified instructions, against ~25k without).
//! A thread running code in another interpreter (`exec`/`run_string` on a thread that has a
//! thread state elsewhere) has two thread states with frames: the sample shows one of them —
//! the cached one, or on a walk the newer interpreter's.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user, generated},
};
use sampler_common::{
    Counter, PY_MAX_FRAMES, PY_MAX_THREADS_WALKED, PY_NO_OFFSET, PyCapture, PyFrameRecord,
    PyProcInfo, py_flags,
};

use crate::{
    maps::{
        PY_FRAME_WALK, PY_FRAMES, PY_SCRATCH, PY_TSTATES, PY_WALK, SCRATCH_HALF_WORDS, count,
        count_n,
    },
    variant::Variant,
};

/// Frame budget per sample (named here for the loop; the wire type sizes the record with it).
pub const FRAME_BUDGET: usize = PY_MAX_FRAMES;
/// Steps of the thread-state walk on a cache miss (thread states visited plus interpreter
/// hops) before giving up.
pub const THREAD_BUDGET: u32 = PY_MAX_THREADS_WALKED;
/// `bpf_loop` callback results.
const LOOP_CONTINUE: i64 = 0;
pub const LOOP_STOP: i64 = 1;
/// [`frame_step`] results besides `LOOP_CONTINUE` and `LOOP_STOP` (end of the chain or of the
/// budget): distinct stop reasons, so that the result is no 0-or-1 to the compiler (which
/// would then hand it to `bpf_loop` unchecked, and the verifier wants to see that range).
const STEP_READ_ERROR: i64 = 2;
const STEP_INVALID: i64 = 3;
/// Invalid: the code object pointer is aligned but its read failed (`CODE_UNREADABLE`).
const STEP_CODE_UNREADABLE: i64 = 4;
/// `gil_locked` / `gil_enabled` when unknown or not applicable; `gil_holder` is then 0.
const GIL_UNKNOWN: i32 = -1;
/// Index masks into one half of the scratch buffer for 8-, 4- and 1-byte fields.
const WORD_MASK: usize = SCRATCH_HALF_WORDS - 1;
const INT_MASK: usize = SCRATCH_HALF_WORDS * 2 - 1;
const BYTE_MASK: usize = SCRATCH_HALF_WORDS * 8 - 1;
/// Mask of the per-frame and per-code read lengths: a multiple of 8 below the size of a
/// scratch half (the verifier needs a bound it can see; `frame_offsets_fit` has checked the
/// real values).
const READ_LEN_MASK: u32 = 0xf8;
const _: () = assert!(READ_LEN_MASK as usize <= SCRATCH_HALF_WORDS * 8);

/// Why the walk stopped before the end of the frame chain.
#[derive(Clone, Copy)]
enum Stop {
    /// No thread state of any interpreter has the sampled thread's id (not a Python thread).
    NoTstate,
    /// The thread lists took more than [`THREAD_BUDGET`] steps.
    ThreadBudget,
    /// `bpf_probe_read_user` failed.
    Read,
    /// The `PY_PROCS` entry's frame offsets do not fit the one-read frame header.
    BadProcInfo,
    /// The entry's pid namespace is not the sampled task's.
    PidNs,
}

impl Stop {
    /// Flag it in `h` and count the cause (`PyReadErrors` is counted once per sample later).
    #[inline(always)]
    fn record(self, h: &mut Header) {
        match self {
            Stop::NoTstate => {
                h.flags |= py_flags::NO_TSTATE;
                count(Counter::PyNoTstate);
            }
            Stop::ThreadBudget => {
                h.flags |= py_flags::NO_TSTATE;
                count(Counter::PyNoTstate);
                count(Counter::PyThreadBudget);
            }
            Stop::Read => h.flags |= py_flags::READ_ERROR,
            Stop::BadProcInfo => {
                h.flags |= py_flags::READ_ERROR;
                count(Counter::PyBadProcInfo);
            }
            Stop::PidNs => {
                h.flags |= py_flags::READ_ERROR;
                count(Counter::PyPidNsErrors);
            }
        }
    }
}

/// The fixed part of a `PyCapture`, built on the BPF stack and written once at the end.
struct Header {
    /// Address of the GIL struct whose words were read (0: none); not part of the capture.
    gil: u64,
    tstate: u64,
    gil_holder: u64,
    gil_locked: i32,
    gil_enabled: i32,
    nframes: u32,
    flags: u32,
}

/// Fill `out` for a sample of host thread `host_tid` of the process described by `info`.
/// Returns the address of the GIL struct whose words were read (0 when none was).
///
/// # Safety
/// `out` must point to a writable `PyCapture` (inside a reserved ring-buffer record or an
/// `OFFCPU` map value).
#[inline(always)]
pub unsafe fn capture<V: Variant>(info: &PyProcInfo, host_tid: u32, out: *mut PyCapture) -> u64 {
    count(Counter::PySamples);
    let mut h = Header {
        gil: 0,
        tstate: 0,
        gil_holder: 0,
        gil_locked: GIL_UNKNOWN,
        gil_enabled: GIL_UNKNOWN,
        nframes: 0,
        flags: 0,
    };
    // SAFETY: forwarded from the caller.
    if let Err(stop) = unsafe { try_capture::<V>(info, host_tid, out, &mut h) } {
        stop.record(&mut h);
    }
    // Added, not branched on: a branch would make the verifier keep every combination of
    // flags apart up to here (see `count_flag`).
    count_flag(Counter::PyReadErrors, h.flags, py_flags::READ_ERROR);
    count_flag(Counter::PyTruncated, h.flags, py_flags::TRUNCATED);
    count_flag(Counter::PyInvalidFrames, h.flags, py_flags::INVALID_FRAME);
    // SAFETY: `out` is writable (caller); the frames were written by `walk_frames`.
    unsafe {
        (&raw mut (*out).tstate).write(h.tstate);
        (&raw mut (*out).gil_holder).write(h.gil_holder);
        (&raw mut (*out).gil_locked).write(h.gil_locked);
        (&raw mut (*out).gil_enabled).write(h.gil_enabled);
        (&raw mut (*out).nframes).write(h.nframes);
        (&raw mut (*out).flags).write(h.flags);
    }
    h.gil
}

/// Count one sample in `counter` if `flags` has `flag` (a single bit), without a branch on
/// `flags`: the verifier tracks `flags` as a constant on each path, and a branch on it would
/// mark it precise, so that paths differing only in their flags would never be merged (and the
/// frame walk's callback would be verified once per combination).
#[inline(always)]
fn count_flag(counter: Counter, flags: u32, flag: u32) {
    count_n(counter, u64::from((flags & flag) >> flag.trailing_zeros()));
}

/// Thread state, GIL and frames; `Err` says why the chain was not walked to its end.
#[inline(always)]
unsafe fn try_capture<V: Variant>(
    info: &PyProcInfo,
    host_tid: u32,
    out: *mut PyCapture,
    h: &mut Header,
) -> Result<(), Stop> {
    if !info.frame_offsets_fit() {
        return Err(Stop::BadProcInfo);
    }
    let key = thread_key(info, host_tid)?;
    let head = read_u64(info.runtime_addr, info.interpreters_head)?;
    let mut found = Found {
        tstate: 0,
        top: 0,
        interp: head,
    };
    let result = find_tstate::<V>(info, host_tid, key, &mut found, h);
    // The GIL of the thread state's own interpreter; without one, of the last one walked.
    let gil_interp = if result.is_ok() {
        read_u64(found.tstate, info.tstate_interp)
    } else {
        Ok(found.interp)
    };
    match gil_interp {
        Ok(interp) => read_gil(info, interp, h),
        Err(stop) => stop.record(h),
    }
    result?;
    h.tstate = found.tstate;
    h.flags |= py_flags::CAPTURED;
    // SAFETY: forwarded from the caller.
    unsafe { walk_frames::<V>(info, &found, out, h) }
}

/// What identifies the sampled thread in a thread state: (the value, its offset in
/// `PyThreadState`). 3.11+: `native_thread_id`, the tid in the target's pid namespace. Before:
/// `thread_id`, the `pthread_t`, which on x86-64 (glibc and musl) is the thread pointer the
/// kernel keeps in `task->thread.fsbase`.
#[inline(always)]
fn thread_key(info: &PyProcInfo, host_tid: u32) -> Result<(u64, u32), Stop> {
    if info.tstate_native_thread_id != PY_NO_OFFSET {
        return Ok((target_tid(info, host_tid)?, info.tstate_native_thread_id));
    }
    if info.task_fsbase == PY_NO_OFFSET {
        return Err(Stop::BadProcInfo);
    }
    // SAFETY: the helper takes no arguments; it returns the current task's address.
    let task = unsafe { generated::bpf_get_current_task() };
    // SAFETY: the helper validates the kernel address (a fault is an error, not a crash).
    let fsbase =
        unsafe { bpf_probe_read_kernel((task as usize + info.task_fsbase as usize) as *const u64) }
            .map_err(|_| Stop::Read)?;
    Ok((fsbase, info.tstate_pthread_id))
}

/// The sampled thread's id in the target's pid namespace (`native_thread_id` holds that one).
#[inline(always)]
fn target_tid(info: &PyProcInfo, host_tid: u32) -> Result<u64, Stop> {
    if info.pidns_dev == 0 {
        return Ok(u64::from(host_tid));
    }
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: `ns` is a writable `bpf_pidns_info` of the size passed.
    let ret = unsafe {
        generated::bpf_get_ns_current_pid_tgid(
            info.pidns_dev,
            info.pidns_ino,
            &raw mut ns,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    if ret != 0 {
        return Err(Stop::PidNs);
    }
    Ok(u64::from(ns.pid))
}

/// Words of the GIL `interp` uses: ≤ 3.11 the process's one `_PyRuntime.ceval.gil`; 3.12+
/// the struct `ceval.gil` points at, or the embedded `_gil` when that is NULL. A failed read
/// flags the capture, nothing more.
#[inline(always)]
fn read_gil(info: &PyProcInfo, interp: u64, h: &mut Header) {
    let gil = if info.runtime_gil == PY_NO_OFFSET {
        read_u64(interp, info.interp_ceval_gil)
    } else {
        Ok(info.runtime_addr.wrapping_add(u64::from(info.runtime_gil)))
    };
    let gil = match gil {
        Ok(0) => interp.wrapping_add(u64::from(info.interp_gil_struct)),
        Ok(gil) => gil,
        Err(stop) => {
            stop.record(h);
            return;
        }
    };
    h.gil = gil;
    if info.gil_enabled != PY_NO_OFFSET {
        match read_i32(gil, info.gil_enabled) {
            Ok(v) => h.gil_enabled = v,
            Err(stop) => stop.record(h),
        }
    }
    if info.gil_locked != PY_NO_OFFSET {
        match read_i32(gil, info.gil_locked) {
            Ok(v) => h.gil_locked = v,
            Err(stop) => stop.record(h),
        }
    }
    if info.gil_holder != PY_NO_OFFSET {
        match read_u64(gil, info.gil_holder) {
            Ok(v) => h.gil_holder = v,
            Err(stop) => stop.record(h),
        }
    }
}

/// What [`find_tstate`] found.
struct Found {
    /// The sampled thread's thread state.
    tstate: u64,
    /// Its innermost frame (0: none).
    top: u64,
    /// In: the head of the interpreter list. Out, when no thread state was found: the last
    /// interpreter walked.
    interp: u64,
}

/// The sampled thread's thread state (`key` at `key_off`, see [`thread_key`]) and top frame: from
/// the cache if the entry still matches, else by walking every interpreter's thread list from
/// `found.interp` (a match with a frame wins and is cached; else a frameless one).
#[inline(always)]
fn find_tstate<V: Variant>(
    info: &PyProcInfo,
    host_tid: u32,
    (key, key_off): (u64, u32),
    found: &mut Found,
    h: &mut Header,
) -> Result<(), Stop> {
    if let Some(cached) = PY_TSTATES.get_ptr(host_tid) {
        // SAFETY: a pointer to a value of this map, valid for the program run.
        let tstate = unsafe { *cached };
        // A stale entry (thread gone, memory reused or unmapped) just falls through to the walk.
        if matches!(read_u64(tstate, key_off), Ok(id) if id == key) {
            h.flags |= py_flags::CACHE_HIT;
            found.tstate = tstate;
            found.top = top_frame(tstate, info.tstate_current_frame, info.cframe_current_frame)?;
            return Ok(());
        }
    }
    count(Counter::PyTstateWalks);
    let Some(walk) = PY_WALK.get_ptr_mut(0) else {
        return Err(Stop::Read);
    };
    // SAFETY: this CPU's `PY_WALK` value, valid for the program run and not shared with
    // another program running on this CPU (only this one uses it).
    let walk = unsafe { &mut *walk };
    *walk = ThreadWalk {
        tstate: read_u64(found.interp, info.threads_head)?,
        interp: found.interp,
        ns_tid: key,
        top: 0,
        fallback: 0,
        id_off: key_off,
        next_off: info.tstate_next,
        interp_next_off: info.interp_next,
        threads_head_off: info.threads_head,
        frame_off: info.tstate_current_frame,
        cframe_off: info.cframe_current_frame,
        status: WALKING,
        _pad: 0,
    };
    V::walk_threads(walk);
    found.interp = walk.interp;
    match walk.status {
        FOUND => {
            // A full cache evicts its least recently used entry; a failed insert only costs
            // the next sample another walk.
            let _ = PY_TSTATES.insert(host_tid, walk.tstate, 0);
            found.tstate = walk.tstate;
            found.top = walk.top;
            Ok(())
        }
        WALKED => {
            if walk.fallback == 0 {
                return Err(Stop::NoTstate);
            }
            // Not cached: a thread state with frames may appear for this thread later.
            found.tstate = walk.fallback;
            Ok(())
        }
        READ_FAILED => Err(Stop::Read),
        _ => Err(Stop::ThreadBudget),
    }
}

/// [`ThreadWalk::status`]: still walking (the budget ran out if the loop ended so).
const WALKING: u32 = 0;
/// A thread state of the thread, with a frame: `ThreadWalk::tstate`, `top`.
const FOUND: u32 = 1;
/// Every list walked to its end (`fallback` is the answer, 0 if none).
const WALKED: u32 = 2;
/// A read failed.
const READ_FAILED: u32 = 3;

/// State of the thread-list walk, shared with its `bpf_loop` callback. It lives in map memory
/// (`PY_WALK`), whose contents the verifier does not track: on the BPF stack, every
/// combination of its fields (a fallback or not, a hop or not, each status) made a state of
/// its own at every iteration and after the loop, and verification took ~4× the instructions.
#[repr(C)]
pub struct ThreadWalk {
    /// The thread state to look at next (0: end of `interp`'s list); the match when [`FOUND`].
    tstate: u64,
    /// The interpreter whose list is walked.
    interp: u64,
    /// The thread key to find (`native_thread_id` or `pthread_t`, see [`thread_key`]).
    ns_tid: u64,
    /// The match's top frame when [`FOUND`].
    top: u64,
    /// A match without a frame (the last one seen; 0: none yet).
    fallback: u64,
    /// Offsets (of the thread key, `PyProcInfo::tstate_next`, `interp_next`,
    /// `threads_head`, `tstate_current_frame`, `cframe_current_frame`).
    id_off: u32,
    next_off: u32,
    interp_next_off: u32,
    threads_head_off: u32,
    frame_off: u32,
    cframe_off: u32,
    /// [`WALKING`], [`FOUND`], [`WALKED`] or [`READ_FAILED`].
    status: u32,
    _pad: u32,
}

/// One step: a thread state (stop on a match with a frame), or at the end of an interpreter's
/// list the hop to the next interpreter's first thread state (stop after the last one).
#[inline(never)]
pub extern "C" fn thread_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes the pointer to the `PY_WALK` value given to it in
    // `find_tstate`.
    let walk = unsafe { &mut **ctx.cast::<*mut ThreadWalk>() };
    let next = if walk.tstate == 0 {
        match read_u64(walk.interp, walk.interp_next_off) {
            Ok(0) => {
                walk.status = WALKED;
                return LOOP_STOP;
            }
            Ok(interp) => {
                walk.interp = interp;
                read_u64(interp, walk.threads_head_off)
            }
            Err(e) => Err(e),
        }
    } else {
        match read_u64(walk.tstate, walk.id_off) {
            Ok(id) if id == walk.ns_tid => {
                match top_frame(walk.tstate, walk.frame_off, walk.cframe_off) {
                    Ok(0) => walk.fallback = walk.tstate,
                    Ok(top) => {
                        walk.top = top;
                        walk.status = FOUND;
                        return LOOP_STOP;
                    }
                    Err(_) => {
                        walk.status = READ_FAILED;
                        return LOOP_STOP;
                    }
                }
                read_u64(walk.tstate, walk.next_off)
            }
            Ok(_) => read_u64(walk.tstate, walk.next_off),
            Err(e) => Err(e),
        }
    };
    if let Ok(next) = next {
        walk.tstate = next;
        LOOP_CONTINUE
    } else {
        walk.status = READ_FAILED;
        LOOP_STOP
    }
}

/// The innermost frame of `tstate` (0: none), `frame_off`/`cframe_off` as
/// `PyProcInfo::tstate_current_frame`/`cframe_current_frame`. 3.12 reaches it through
/// `tstate->cframe`.
#[inline(always)]
fn top_frame(tstate: u64, frame_off: u32, cframe_off: u32) -> Result<u64, Stop> {
    let current = read_u64(tstate, frame_off)?;
    if cframe_off == PY_NO_OFFSET || current == 0 {
        return Ok(current);
    }
    read_u64(current, cframe_off)
}

/// Record up to [`FRAME_BUDGET`] frames from `top` outward into `out.frames`; marks
/// `TRUNCATED` when the chain goes on, `INVALID_FRAME` when it stopped at an invalid frame.
/// `h.nframes` counts the frames written, also on error. The walk state lives in per-CPU
/// `PY_FRAME_WALK` and the frames are written to per-CPU `PY_FRAMES` by the global step
/// function (`variant::pyebpf_frame_step`, verified once on its own whichever variant drives
/// it), then copied into the record.
#[inline(always)]
unsafe fn walk_frames<V: Variant>(
    info: &PyProcInfo,
    found: &Found,
    out: *mut PyCapture,
    h: &mut Header,
) -> Result<(), Stop> {
    let (Some(state), Some(frames)) = (PY_FRAME_WALK.get_ptr_mut(0), PY_FRAMES.get_ptr(0)) else {
        return Err(Stop::Read);
    };
    // SAFETY: this CPU's value, valid for the program run; only this program uses it.
    let state = unsafe { &mut *state };
    *state = FrameWalk {
        frame: found.top,
        code_type: info.code_type,
        tag_mask: u64::from(info.executable_tag_mask),
        nframes: 0,
        flags: 0,
        exec: info.frame_executable,
        ip: info.frame_instr_ptr,
        prev: info.frame_previous,
        owner: info.frame_owner,
        is_entry: info.frame_is_entry,
        tlbc: info.frame_tlbc_index,
        len: info.frame_read_bytes,
        owner_max: info.owner_max,
        shim_owner: info.shim_owner,
        code_ob_type: info.code_ob_type,
        code_name: info.code_name,
        code_filename: info.code_filename,
        code_firstlineno: info.code_firstlineno,
        code_len: info.code_read_bytes,
        globals: info.frame_globals,
        locals: info.frame_locals,
        _pad: 0,
        next: 0,
    };
    V::walk_frames();
    // Not `min(FRAME_BUDGET)`: the copy's size is a precise register for the verifier, and a
    // `min` gives it two ranges (exactly the budget, or below it) that no later state can prune
    // against each other — 6.1 verified the rest of the program twice (104k instructions, not
    // 50k). A count beyond the budget cannot happen (the step stops there); refusing it keeps
    // one range.
    let count = state.nframes;
    if count > FRAME_BUDGET as u32 {
        return Err(Stop::Read);
    }
    h.nframes = count;
    // SAFETY: `out.frames` holds FRAME_BUDGET records (the reserved record); `count` ≤
    // FRAME_BUDGET records are copied from this CPU's `PY_FRAMES` value.
    unsafe {
        generated::bpf_probe_read_kernel(
            (&raw mut (*out).frames).cast(),
            count * size_of::<PyFrameRecord>() as u32,
            frames.cast(),
        );
    }
    // The step set the flags (read error, invalid frame, truncated): no branch on them here,
    // where every branch would multiply the verifier's paths through the rest of the program.
    h.flags |= state.flags;
    Ok(())
}

/// State of the frame walk between steps (this CPU's `PY_FRAME_WALK` value): map memory, whose
/// contents the verifier does not track.
#[repr(C)]
pub struct FrameWalk {
    /// The frame to read next (0: end of the chain).
    pub frame: u64,
    /// `PyProcInfo::code_type` (0: not checked).
    code_type: u64,
    /// `PyProcInfo::executable_tag_mask`.
    tag_mask: u64,
    /// Frames written.
    pub nframes: u32,
    /// `py_flags` the walk ended with: `READ_ERROR`, `INVALID_FRAME` (the invalid frame is
    /// not recorded) or `TRUNCATED` (the chain goes on past the budget).
    pub flags: u32,
    /// Frame field offsets (`PyProcInfo::frame_*`).
    exec: u32,
    ip: u32,
    prev: u32,
    owner: u32,
    is_entry: u32,
    tlbc: u32,
    /// Bytes read per frame (`PyProcInfo::frame_read_bytes`).
    len: u32,
    /// `PyProcInfo::owner_max`, `shim_owner`.
    owner_max: u32,
    shim_owner: u32,
    /// Code object field offsets and bytes read (`PyProcInfo::code_*`).
    code_ob_type: u32,
    code_name: u32,
    code_filename: u32,
    code_firstlineno: u32,
    code_len: u32,
    /// `PyProcInfo::frame_globals`, `frame_locals`.
    globals: u32,
    locals: u32,
    _pad: u32,
    /// The last frame read's `previous`.
    next: u64,
}

/// One frame of the walk in `PY_FRAME_WALK`: read its header, check it, record it at `index`
/// of `PY_FRAMES`, move to `previous`. A frame is invalid (the walk stops before recording
/// it) when its `owner` is out of range, or, unless it is an entry frame, when its code object
/// is misaligned, unreadable or not of type `PyCode_Type`; one whose `previous` is itself is
/// recorded, then the walk stops as invalid. Returns `LOOP_CONTINUE` or a non-zero reason to
/// stop.
#[inline(always)]
pub fn frame_step(index: u64) -> i64 {
    let (Some(walk), Some(frames), Some(scratch)) = (
        PY_FRAME_WALK.get_ptr_mut(0),
        PY_FRAMES.get_ptr_mut(0),
        PY_SCRATCH.get_ptr_mut(0),
    ) else {
        return LOOP_STOP;
    };
    // SAFETY: this CPU's value, valid for the program run; only this program uses it.
    let walk = unsafe { &mut *walk };
    // The bounds are for the verifier (the drivers never pass more than FRAME_BUDGET).
    let at = walk.nframes;
    if walk.frame == 0 || index >= FRAME_BUDGET as u64 || at >= FRAME_BUDGET as u32 {
        return LOOP_STOP;
    }
    // SAFETY: `at < FRAME_BUDGET`, the length of `PY_FRAMES`.
    let record = unsafe { frames.cast::<PyFrameRecord>().add(at as usize) };
    // The record's last word written at once: the pointer is then computed here, right after
    // the bound check, not after the frame read's helper call with `at` spilled — a spilled
    // copy taken before the check has no bound on 6.1's verifier ("unbounded memory access").
    // SAFETY: as above; a record is six 8-aligned words.
    unsafe { record.cast::<u64>().add(5).write(0) };
    let mut stop = read_frame(walk, scratch.cast(), record);
    if stop == LOOP_CONTINUE {
        walk.nframes = at + 1;
        if walk.next != walk.frame {
            walk.frame = walk.next;
            if walk.next != 0 && at + 1 >= FRAME_BUDGET as u32 {
                walk.flags |= py_flags::TRUNCATED;
            }
            return LOOP_CONTINUE;
        }
        stop = STEP_INVALID;
    }
    walk.flags |= if stop == STEP_READ_ERROR {
        py_flags::READ_ERROR
    } else if stop == STEP_CODE_UNREADABLE {
        // Once per sample: the walk stops here. Counted here, off the common path.
        count(Counter::PyCodeUnreadable);
        py_flags::INVALID_FRAME | py_flags::CODE_UNREADABLE
    } else {
        py_flags::INVALID_FRAME
    };
    stop
}

/// Reads and checks the frame at `walk.frame` and writes its record at `record`; sets
/// `walk.next` (its `previous`). Returns
/// `LOOP_CONTINUE`, or the step result to stop with (the record is then garbage, and not
/// counted). Everything goes to memory as soon as it is known: the BPF stack of this call adds
/// to its callers' (512 bytes in all).
#[inline(always)]
fn read_frame(walk: &mut FrameWalk, scratch: *mut u64, record: *mut PyFrameRecord) -> i64 {
    // SAFETY: the scratch value's first half holds `SCRATCH_HALF_WORDS * 8` bytes, more than
    // the masked length; the source is a target address the helper validates.
    let ret = unsafe {
        generated::bpf_probe_read_user(
            scratch.cast::<c_void>(),
            walk.len & READ_LEN_MASK,
            walk.frame as *const c_void,
        )
    };
    if ret != 0 {
        return STEP_READ_ERROR;
    }
    let owner = opt_byte(scratch, walk.owner);
    if walk.owner != PY_NO_OFFSET && u32::from(owner) > walk.owner_max {
        return STEP_INVALID;
    }
    let rec = record.cast::<u64>();
    let executable = word(scratch, walk.exec);
    let shim = u32::from(owner) >= walk.shim_owner;
    // SAFETY: `record` is a record of `PY_FRAMES` (caller); a record is six 8-aligned words.
    unsafe {
        rec.write(executable);
        rec.add(1).write(word(scratch, walk.ip));
    }
    let first_line = if shim {
        // An entry frame: no Python code (3.13+: `f_executable` is None).
        // SAFETY: as above.
        unsafe {
            rec.add(2).write(0);
            rec.add(3).write(0);
        }
        0
    } else {
        let code = executable & !walk.tag_mask;
        let read = read_code(walk, scratch, code);
        if read != LOOP_CONTINUE {
            return read;
        }
        // SAFETY: the second half starts inside the scratch value (`read_code`).
        let half = unsafe { scratch.add(SCRATCH_HALF_WORDS) };
        if walk.code_type != 0 && word(half, walk.code_ob_type) != walk.code_type {
            return STEP_INVALID;
        }
        // SAFETY: as above.
        unsafe {
            rec.add(2).write(word(half, walk.code_name));
            rec.add(3).write(word(half, walk.code_filename));
        }
        int(half, walk.code_firstlineno) as u16
    };
    // Module-level code runs with `f_locals == f_globals` (function frames: NULL locals).
    let globals = if walk.globals == PY_NO_OFFSET || walk.locals == PY_NO_OFFSET {
        0
    } else {
        let globals = word(scratch, walk.globals);
        if globals == word(scratch, walk.locals) {
            globals
        } else {
            0
        }
    };
    let tlbc_index = if walk.tlbc == PY_NO_OFFSET {
        0
    } else {
        int(scratch, walk.tlbc)
    };
    let is_entry = opt_byte(scratch, walk.is_entry);
    // SAFETY: as above.
    unsafe {
        rec.add(4).write(globals);
        rec.add(5)
            .write(tail_word(tlbc_index, owner, is_entry, first_line));
    }
    walk.next = word(scratch, walk.prev);
    LOOP_CONTINUE
}

/// Reads the code object at `code` into the scratch buffer's second half: `LOOP_CONTINUE`,
/// `STEP_INVALID` when it is NULL or misaligned, `STEP_CODE_UNREADABLE` when the read failed.
#[inline(always)]
fn read_code(walk: &FrameWalk, scratch: *mut u64, code: u64) -> i64 {
    if code == 0 || code & 7 != 0 {
        return STEP_INVALID;
    }
    // SAFETY: the second half of the scratch value holds `SCRATCH_HALF_WORDS * 8` bytes, more
    // than the masked length; the source is a target address the helper validates.
    let ret = unsafe {
        let half = scratch.add(SCRATCH_HALF_WORDS);
        generated::bpf_probe_read_user(
            half.cast::<c_void>(),
            walk.code_len & READ_LEN_MASK,
            code as *const c_void,
        )
    };
    if ret == 0 {
        LOOP_CONTINUE
    } else {
        STEP_CODE_UNREADABLE
    }
}

/// The last word of a `PyFrameRecord`: `tlbc_index` (bytes 0-3), `owner` (byte 4),
/// `is_entry` (byte 5), `first_line` (bytes 6-7, little-endian). Writing the record as whole
/// words keeps LLVM from emitting a `memset` call for it.
#[inline(always)]
fn tail_word(tlbc_index: i32, owner: u8, is_entry: u8, first_line: u16) -> u64 {
    u64::from(tlbc_index as u32)
        | u64::from(owner) << 32
        | u64::from(is_entry) << 40
        | u64::from(first_line) << 48
}

/// The byte at `off`, or 0 for an absent field (`PY_NO_OFFSET`).
#[inline(always)]
fn opt_byte(scratch: *const u64, off: u32) -> u8 {
    if off == PY_NO_OFFSET {
        0
    } else {
        byte(scratch, off)
    }
}
const _: () = {
    assert!(size_of::<PyFrameRecord>() == 48);
    assert!(core::mem::offset_of!(PyFrameRecord, executable) == 0);
    assert!(core::mem::offset_of!(PyFrameRecord, instr_ptr) == 8);
    assert!(core::mem::offset_of!(PyFrameRecord, name) == 16);
    assert!(core::mem::offset_of!(PyFrameRecord, filename) == 24);
    assert!(core::mem::offset_of!(PyFrameRecord, globals) == 32);
    assert!(core::mem::offset_of!(PyFrameRecord, tlbc_index) == 40);
    assert!(core::mem::offset_of!(PyFrameRecord, owner) == 44);
    assert!(core::mem::offset_of!(PyFrameRecord, is_entry) == 45);
    assert!(core::mem::offset_of!(PyFrameRecord, first_line) == 46);
};

/// The 8-byte field at byte offset `off` of a scratch half (`off` 8-aligned, checked by
/// `frame_offsets_fit`; the mask is for the verifier).
#[inline(always)]
fn word(scratch: *const u64, off: u32) -> u64 {
    // SAFETY: the masked index is inside the `SCRATCH_HALF_WORDS`-word half.
    unsafe { *scratch.add((off as usize >> 3) & WORD_MASK) }
}

/// The 4-byte field at byte offset `off` (4-aligned).
#[inline(always)]
fn int(scratch: *const u64, off: u32) -> i32 {
    // SAFETY: as `word`, in 4-byte units.
    unsafe { *scratch.cast::<i32>().add((off as usize >> 2) & INT_MASK) }
}

/// The byte at offset `off`.
#[inline(always)]
fn byte(scratch: *const u64, off: u32) -> u8 {
    // SAFETY: as `word`, in bytes.
    unsafe { *scratch.cast::<u8>().add(off as usize & BYTE_MASK) }
}

/// `*(u64 *)(base + off)` in the target.
#[inline(always)]
fn read_u64(base: u64, off: u32) -> Result<u64, Stop> {
    // SAFETY: the helper validates the user address (a fault is an error, not a crash).
    unsafe { bpf_probe_read_user(base.wrapping_add(u64::from(off)) as *const u64) }
        .map_err(|_| Stop::Read)
}

/// `*(i32 *)(base + off)` in the target.
#[inline(always)]
fn read_i32(base: u64, off: u32) -> Result<i32, Stop> {
    // SAFETY: as `read_u64`.
    unsafe { bpf_probe_read_user(base.wrapping_add(u64::from(off)) as *const i32) }
        .map_err(|_| Stop::Read)
}
