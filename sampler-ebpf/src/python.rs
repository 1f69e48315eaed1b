//! The in-kernel Python walk (issue 4): the sampled thread's Python frames at the sample instant.
//!
//! Input: the `PY_PROCS` entry of the sampled process (offsets derived by user space from the
//! target's `_Py_DebugOffsets`, see `sampler_common::PyProcInfo`), the host tid, and a
//! `PyCapture` inside the reserved ring-buffer record. Output: that `PyCapture` filled in
//! (thread state, GIL words, raw frame records innermost first, `py_flags`), the `PY_TSTATES`
//! cache, and the `Py*` counters.
//!
//! Chain (cpython-layouts §3): `*(runtime + interpreters_head)` → `*(interp + threads_head)` →
//! `next`… matching `native_thread_id` against the tid *as the target sees it* (its pid
//! namespace, gotcha 12) → top frame `*(tstate + current_frame)` (3.12: through `cframe`) →
//! `previous`…. Frames are recorded raw (stackref tags, owners ≥ 3 and the `__init__` shim
//! included): user space masks, filters and resolves them.
//!
//! Constraints: every loop has a named constant budget and runs as `bpf_loop` (kernel ≥ 5.17):
//! the verifier checks a callback body once instead of every iteration of an open loop —
//! open loops of 256 frames and 256 threads cost ~100k verified instructions per call site,
//! because every early exit re-verified the rest of the program. Each frame costs one
//! `bpf_probe_read_user` of its header into a per-CPU scratch buffer, from which the fields are
//! picked at the runtime offsets through masked indices (bounds the verifier can see, checked
//! against `PyProcInfo::frame_offsets_fit` once per sample). Every failure sets a flag in the
//! capture and bumps a counter; frames read before a failure are kept.
//! Only the first interpreter of `interpreters.head` is walked: `PyProcInfo` carries neither
//! `PyInterpreterState.next` nor `PyThreadState.interp`, so sub-interpreters' threads other
//! than the newest interpreter's are reported `NO_TSTATE`.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{bpf_probe_read_user, generated},
};
use sampler_common::{
    Counter, PY_FRAME_HEADER_BYTES, PY_MAX_FRAMES, PY_MAX_THREADS_WALKED, PY_NO_OFFSET, PyCapture,
    PyFrameRecord, PyProcInfo, py_flags,
};

use crate::maps::{PY_SCRATCH, PY_TSTATES, SCRATCH_WORDS, count};

/// Frame budget per sample (named here for the loop; the wire type sizes the record with it).
const FRAME_BUDGET: usize = PY_MAX_FRAMES;
/// Thread states visited on a cache miss before giving up.
const THREAD_BUDGET: u32 = PY_MAX_THREADS_WALKED;
/// `bpf_loop` callback results.
const LOOP_CONTINUE: i64 = 0;
const LOOP_STOP: i64 = 1;
/// `gil_locked` / `gil_enabled` when unknown or not applicable; `gil_holder` is then 0.
const GIL_UNKNOWN: i32 = -1;
/// Index masks into the scratch buffer for 8-, 4- and 1-byte fields.
const WORD_MASK: usize = SCRATCH_WORDS - 1;
const INT_MASK: usize = SCRATCH_WORDS * 2 - 1;
const BYTE_MASK: usize = SCRATCH_WORDS * 8 - 1;

/// Why the walk stopped before the end of the frame chain.
#[derive(Clone, Copy)]
enum Stop {
    /// No thread state has the sampled thread's id (not a Python thread).
    NoTstate,
    /// The thread list was longer than [`THREAD_BUDGET`].
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
    tstate: u64,
    gil_holder: u64,
    gil_locked: i32,
    gil_enabled: i32,
    nframes: u32,
    flags: u32,
}

/// Fill `out` for a sample of host thread `host_tid` of the process described by `info`.
///
/// # Safety
/// `out` must point to a writable `PyCapture` (inside a reserved ring-buffer record).
#[inline(always)]
pub unsafe fn capture(info: &PyProcInfo, host_tid: u32, out: *mut PyCapture) {
    count(Counter::PySamples);
    let mut h = Header {
        tstate: 0,
        gil_holder: 0,
        gil_locked: GIL_UNKNOWN,
        gil_enabled: GIL_UNKNOWN,
        nframes: 0,
        flags: 0,
    };
    // SAFETY: forwarded from the caller.
    if let Err(stop) = unsafe { try_capture(info, host_tid, out, &mut h) } {
        stop.record(&mut h);
    }
    if h.flags & py_flags::READ_ERROR != 0 {
        count(Counter::PyReadErrors);
    }
    if h.flags & py_flags::TRUNCATED != 0 {
        count(Counter::PyTruncated);
    }
    // SAFETY: `out` is writable (caller); the frames were written by `walk_frames`.
    unsafe {
        (&raw mut (*out).tstate).write(h.tstate);
        (&raw mut (*out).gil_holder).write(h.gil_holder);
        (&raw mut (*out).gil_locked).write(h.gil_locked);
        (&raw mut (*out).gil_enabled).write(h.gil_enabled);
        (&raw mut (*out).nframes).write(h.nframes);
        (&raw mut (*out).flags).write(h.flags);
    }
}

/// Thread state, GIL and frames; `Err` says why the chain was not walked to its end.
#[inline(always)]
unsafe fn try_capture(
    info: &PyProcInfo,
    host_tid: u32,
    out: *mut PyCapture,
    h: &mut Header,
) -> Result<(), Stop> {
    if !info.frame_offsets_fit() {
        return Err(Stop::BadProcInfo);
    }
    let ns_tid = target_tid(info, host_tid)?;
    let interp = read_u64(info.runtime_addr, info.interpreters_head)?;
    read_gil(info, interp, h);
    let tstate = find_tstate(info, interp, host_tid, ns_tid, h)?;
    h.tstate = tstate;
    h.flags |= py_flags::CAPTURED;
    let top = top_frame(info, tstate)?;
    // SAFETY: forwarded from the caller.
    unsafe { walk_frames(info, top, out, h) }
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

/// GIL words of `interp` (cpython-layouts §6); a failed read flags the capture, nothing more.
#[inline(always)]
fn read_gil(info: &PyProcInfo, interp: u64, h: &mut Header) {
    if info.gil_enabled != PY_NO_OFFSET {
        match read_i32(interp, info.gil_enabled) {
            Ok(v) => h.gil_enabled = v,
            Err(stop) => stop.record(h),
        }
    }
    if info.gil_locked != PY_NO_OFFSET {
        match read_i32(interp, info.gil_locked) {
            Ok(v) => h.gil_locked = v,
            Err(stop) => stop.record(h),
        }
    }
    if info.gil_holder != PY_NO_OFFSET {
        match read_u64(interp, info.gil_holder) {
            Ok(v) => h.gil_holder = v,
            Err(stop) => stop.record(h),
        }
    }
}

/// The thread state whose `native_thread_id` is `ns_tid`: from the cache if it still matches,
/// else by walking `interp`'s thread list (and caching the result).
#[inline(always)]
fn find_tstate(
    info: &PyProcInfo,
    interp: u64,
    host_tid: u32,
    ns_tid: u64,
    h: &mut Header,
) -> Result<u64, Stop> {
    if let Some(cached) = PY_TSTATES.get_ptr(host_tid) {
        // SAFETY: a pointer to a value of this map, valid for the program run.
        let tstate = unsafe { *cached };
        // A stale entry (thread gone, memory reused or unmapped) just falls through to the walk.
        if matches!(read_u64(tstate, info.tstate_native_thread_id), Ok(id) if id == ns_tid) {
            h.flags |= py_flags::CACHE_HIT;
            return Ok(tstate);
        }
    }
    count(Counter::PyTstateWalks);
    let mut walk = ThreadWalk {
        tstate: read_u64(interp, info.threads_head)?,
        ns_tid,
        id_off: info.tstate_native_thread_id,
        next_off: info.tstate_next,
        found: 0,
        read_error: 0,
    };
    // SAFETY: the callback is a static function taking a `ThreadWalk`, which `walk` is.
    unsafe {
        generated::bpf_loop(
            THREAD_BUDGET,
            thread_step as *mut c_void,
            (&raw mut walk).cast(),
            0,
        );
    }
    if walk.found != 0 {
        // A full cache evicts its least recently used entry; a failed insert only costs the
        // next sample another walk.
        let _ = PY_TSTATES.insert(host_tid, walk.tstate, 0);
        return Ok(walk.tstate);
    }
    Err(if walk.read_error != 0 {
        Stop::Read
    } else if walk.tstate == 0 {
        Stop::NoTstate
    } else {
        Stop::ThreadBudget
    })
}

/// State of the thread-list walk, shared with its `bpf_loop` callback.
#[repr(C)]
struct ThreadWalk {
    /// The thread state to look at next (0: end of the list); the match when `found`.
    tstate: u64,
    /// `native_thread_id` to find.
    ns_tid: u64,
    id_off: u32,
    next_off: u32,
    found: u32,
    read_error: u32,
}

/// One thread state of the list: stop on a match, at the end or on a failed read.
#[inline(never)]
extern "C" fn thread_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes the `ThreadWalk` given to it in `find_tstate`.
    let walk = unsafe { &mut *ctx.cast::<ThreadWalk>() };
    if walk.tstate == 0 {
        return LOOP_STOP;
    }
    match read_u64(walk.tstate, walk.id_off) {
        Ok(id) if id == walk.ns_tid => {
            walk.found = 1;
            return LOOP_STOP;
        }
        Ok(_) => {}
        Err(_) => {
            walk.read_error = 1;
            return LOOP_STOP;
        }
    }
    if let Ok(next) = read_u64(walk.tstate, walk.next_off) {
        walk.tstate = next;
        LOOP_CONTINUE
    } else {
        walk.read_error = 1;
        LOOP_STOP
    }
}

/// The innermost frame of `tstate` (0: none). 3.12 reaches it through `tstate->cframe`.
#[inline(always)]
fn top_frame(info: &PyProcInfo, tstate: u64) -> Result<u64, Stop> {
    let current = read_u64(tstate, info.tstate_current_frame)?;
    if info.cframe_current_frame == PY_NO_OFFSET || current == 0 {
        return Ok(current);
    }
    read_u64(current, info.cframe_current_frame)
}

/// Record up to [`FRAME_BUDGET`] frames from `top` outward into `out.frames`; marks
/// `TRUNCATED` when the chain goes on. `h.nframes` counts the frames written, also on error.
#[inline(always)]
unsafe fn walk_frames(
    info: &PyProcInfo,
    top: u64,
    out: *mut PyCapture,
    h: &mut Header,
) -> Result<(), Stop> {
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return Err(Stop::Read);
    };
    let mut walk = FrameWalk {
        // SAFETY: `out` is writable (caller); `frames` is an array of `FRAME_BUDGET` records.
        frames: unsafe { (&raw mut (*out).frames).cast::<PyFrameRecord>() },
        scratch: scratch.cast::<u64>(),
        frame: top,
        nframes: 0,
        read_error: 0,
        exec: info.frame_executable,
        ip: info.frame_instr_ptr,
        prev: info.frame_previous,
        owner: info.frame_owner,
        tlbc: info.frame_tlbc_index,
        _pad: 0,
    };
    // SAFETY: the callback is a static function taking a `FrameWalk`, which `walk` is.
    unsafe {
        generated::bpf_loop(
            FRAME_BUDGET as u32,
            frame_step as *mut c_void,
            (&raw mut walk).cast(),
            0,
        );
    }
    h.nframes = walk.nframes;
    if walk.read_error != 0 {
        return Err(Stop::Read);
    }
    if walk.frame != 0 {
        h.flags |= py_flags::TRUNCATED;
    }
    Ok(())
}

/// State of the frame walk, shared with its `bpf_loop` callback.
#[repr(C)]
struct FrameWalk {
    /// `PyCapture::frames` in the reserved record.
    frames: *mut PyFrameRecord,
    /// This CPU's `PY_SCRATCH` value.
    scratch: *mut u64,
    /// The frame to read next (0: end of the chain).
    frame: u64,
    /// Frames written.
    nframes: u32,
    read_error: u32,
    /// Frame field offsets (`PyProcInfo::frame_*`).
    exec: u32,
    ip: u32,
    prev: u32,
    owner: u32,
    tlbc: u32,
    _pad: u32,
}

/// One frame: read its header, record it at `index`, move to `previous`.
#[inline(never)]
extern "C" fn frame_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes the `FrameWalk` given to it in `walk_frames`.
    let walk = unsafe { &mut *ctx.cast::<FrameWalk>() };
    // The index bound is for the verifier (`bpf_loop` never passes more than FRAME_BUDGET).
    if walk.frame == 0 || index >= FRAME_BUDGET as u64 {
        return LOOP_STOP;
    }
    let scratch = walk.scratch;
    // SAFETY: the scratch value holds `SCRATCH_WORDS * 8 >= PY_FRAME_HEADER_BYTES` bytes; the
    // source is a target address the helper validates.
    let ret = unsafe {
        generated::bpf_probe_read_user(
            scratch.cast::<c_void>(),
            PY_FRAME_HEADER_BYTES,
            walk.frame as *const c_void,
        )
    };
    if ret != 0 {
        walk.read_error = 1;
        return LOOP_STOP;
    }
    let tlbc_index = if walk.tlbc == PY_NO_OFFSET {
        0
    } else {
        int(scratch, walk.tlbc)
    };
    // SAFETY: `index < FRAME_BUDGET`, the length of `frames`; a record is three 8-aligned words.
    unsafe {
        let record = walk.frames.add(index as usize).cast::<u64>();
        record.write(word(scratch, walk.exec));
        record.add(1).write(word(scratch, walk.ip));
        record
            .add(2)
            .write(tail_word(tlbc_index, byte(scratch, walk.owner)));
    }
    walk.frame = word(scratch, walk.prev);
    walk.nframes = index as u32 + 1;
    LOOP_CONTINUE
}

/// The last word of a `PyFrameRecord`: `tlbc_index` (bytes 0-3), `owner` (byte 4), zero
/// padding (little-endian). Writing the record as three words keeps LLVM from emitting a
/// `memset` call for the padding.
#[inline(always)]
fn tail_word(tlbc_index: i32, owner: u8) -> u64 {
    u64::from(tlbc_index as u32) | u64::from(owner) << 32
}
const _: () = {
    assert!(size_of::<PyFrameRecord>() == 24);
    assert!(core::mem::offset_of!(PyFrameRecord, executable) == 0);
    assert!(core::mem::offset_of!(PyFrameRecord, instr_ptr) == 8);
    assert!(core::mem::offset_of!(PyFrameRecord, tlbc_index) == 16);
    assert!(core::mem::offset_of!(PyFrameRecord, owner) == 20);
};

/// The 8-byte field at byte offset `off` of the scratch buffer (`off` 8-aligned, checked by
/// `frame_offsets_fit`; the mask is for the verifier).
#[inline(always)]
fn word(scratch: *const u64, off: u32) -> u64 {
    // SAFETY: the masked index is inside the `SCRATCH_WORDS`-word buffer.
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
