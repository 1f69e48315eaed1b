//! The walk: runtime → interpreters → thread states → frames → code objects.
//!
//! Owns: [`walk`] and [`walk_frames`]. It knows no CPython versions: every offset and rule comes
//! from the [`RuntimeLayout`] (the 3.11/3.12 `cframe` indirection, ≤ 3.10 `PyFrameObject`
//! chains without owners, stackref tag masks, the shim-owner threshold and the instruction
//! pointer semantics are layout fields).
//! Input: a [`Ctx`] (memory, layout, target), the `_PyRuntime` address, the code cache.
//! Output: [`RawInterp`]s with their [`RawThread`]s, innermost frame first; per-frame failures
//! are counted in [`ErrorCounts`] and cost that frame only; a broken chain ends the stack with
//! `truncated` set.
//! Constraints: bounded by [`Limits`] (frames per thread, threads, interpreters); loops in any
//! list are detected; a vanished or forbidden process is an error, not a short stack.
//! Algorithm: docs/cpython-layouts.md §3.2 (walk), §3.4 (owners: skip `owner >= 3`, drop the
//! `__init__` shim), §5.4 (stackrefs: `bits & ~3`, `bits == 1` and tagged ints are not code).

use std::collections::HashSet;

use super::PyFrame;
use super::code::{CodeCache, CodeError, Ctx, resolve};
use super::errors::{ErrorCounts, ErrorKind, PyError};
use super::layout::{EntryRule, HoldsGil};
use super::locals::{Local, frame_locals};
use super::memory::{MemError, field_u8, field_u32, field_u64};
use super::values::ValueLimits;

/// Caps of one snapshot, and what to read besides the frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Python frames kept per thread; deeper stacks are cut and marked truncated.
    pub max_depth: usize,
    /// Thread states read per interpreter.
    pub max_threads: usize,
    pub max_interpreters: usize,
    /// Read every frame's arguments and locals, with these caps (`dump --locals`).
    pub locals: Option<ValueLimits>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_depth: 4096,
            max_threads: 4096,
            max_interpreters: 64,
            locals: None,
        }
    }
}

/// One element of a captured frame chain, innermost first: a Python frame (index into the
/// frames) or an entry frame (owner ≥ 3), which delimits one eval-loop activation (`merge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainItem {
    Frame(u32),
    Entry,
}

/// A walked frame chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkedFrames {
    /// Python frames, innermost first.
    pub frames: Vec<PyFrame>,
    /// The chain with its entry frames.
    pub items: Vec<ChainItem>,
    /// Per frame (same index) its arguments and locals, when asked for; else empty.
    pub locals: Vec<Vec<Local>>,
    /// The chain was cut (depth cap, loop or unreadable frame).
    pub truncated: bool,
}

/// One thread state as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawThread {
    pub tstate: u64,
    pub native_thread_id: u64,
    pub thread_id: u64,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    /// The chain with its entry frames (for the native merge).
    pub items: Vec<ChainItem>,
    /// Per frame its arguments and locals, when [`Limits::locals`] asks for them.
    pub locals: Vec<Vec<Local>>,
    pub truncated: bool,
    /// `holds_gil` of the thread state (3.13+).
    pub holds_gil: Option<bool>,
    /// `state == _Py_THREAD_ATTACHED` (3.13+).
    pub attached: Option<bool>,
}

/// One interpreter as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawInterp {
    pub addr: u64,
    pub id: i64,
    /// Newest thread first (the order of `threads.head`).
    pub threads: Vec<RawThread>,
}

fn fatal(pid: u32, e: MemError) -> Option<PyError> {
    matches!(e, MemError::Gone | MemError::Permission).then(|| PyError::from_mem(pid, e))
}

/// `f_executable` → code object address, or `None` for NULL, the stackref NULL (`bits == 1`)
/// and tagged ints (low bits `11`).
pub fn code_from_executable(bits: u64, tag_mask: u64) -> Option<u64> {
    if tag_mask != 0 && (bits == 1 || bits & 3 == 3) {
        return None;
    }
    Some(bits & !tag_mask).filter(|&p| p != 0)
}

/// Walks every interpreter and thread of the runtime at `runtime`.
pub fn walk(
    ctx: Ctx<'_>,
    runtime: u64,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    limits: Limits,
) -> Result<Vec<RawInterp>, PyError> {
    let (mem, l, pid) = (ctx.mem, ctx.layout, ctx.target.pid);
    let to_py = |e| PyError::from_mem(pid, e);
    let mut interp = mem
        .read_u64(runtime.wrapping_add(l.runtime.interpreters_head))
        .map_err(to_py)?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    while interp != 0 {
        if out.len() >= limits.max_interpreters || !seen.insert(interp) {
            counts.add(ErrorKind::TooManyThreads);
            break;
        }
        let word = |off| mem.read_u64(interp.wrapping_add(off));
        let id = word(l.interp.id).map_err(to_py)? as i64;
        if let Some(off) = l.interp.code_object_generation.filter(|_| id == 0) {
            cache.set_generation(word(off).map_err(to_py)?);
        }
        let threads = walk_threads(ctx, interp, cache, counts, limits)?;
        out.push(RawInterp {
            addr: interp,
            id,
            threads,
        });
        interp = word(l.interp.next).map_err(to_py)?;
    }
    Ok(out)
}

/// An interpreter and the `(native_thread_id, thread_id)` of each of its thread states.
pub type InterpThreadIds = (u64, Vec<(u64, u64)>);

/// Every interpreter's thread list without frames: (interpreter, `(native_thread_id,
/// thread_id)` per thread state). What thread names need: much less to read than [`walk`],
/// and no frame of a thread that ends meanwhile is read (its failures would say nothing about
/// any sample). A list that keeps changing gives its validated prefix; nothing is counted.
pub fn thread_ids(
    ctx: Ctx<'_>,
    runtime: u64,
    limits: Limits,
) -> Result<Vec<InterpThreadIds>, PyError> {
    let (mem, l, pid) = (ctx.mem, ctx.layout, ctx.target.pid);
    let to_py = |e| PyError::from_mem(pid, e);
    let mut counts = ErrorCounts::default();
    let mut interp = mem
        .read_u64(runtime.wrapping_add(l.runtime.interpreters_head))
        .map_err(to_py)?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    while interp != 0 && out.len() < limits.max_interpreters && seen.insert(interp) {
        let mut list = Vec::new();
        for attempt in 0..THREAD_LIST_ATTEMPTS {
            if attempt > 0 {
                mem.refresh();
            }
            let (read, consistent) = read_thread_list(ctx, interp, &mut counts, limits)?;
            list = read;
            if consistent {
                break;
            }
        }
        let t = &l.tstate;
        let ids = list
            .iter()
            .map(|c| {
                let thread_id = field_u64(&c.buf, t.thread_id).unwrap_or(0);
                let native = match t.native_thread_id {
                    Some(off) => field_u64(&c.buf, off).unwrap_or(0),
                    None => pthread_tid(ctx, thread_id).unwrap_or(0),
                };
                (native, thread_id)
            })
            .collect();
        out.push((interp, ids));
        interp = mem
            .read_u64(interp.wrapping_add(l.interp.next))
            .map_err(to_py)?;
    }
    Ok(out)
}

/// Linux's largest possible pid (`PID_MAX_LIMIT` on 64-bit): a larger `native_thread_id` can
/// only come from a torn read of a thread list that changed under us.
const PID_MAX_LIMIT: u64 = 1 << 22;
/// Reads of a changing thread list before we settle for its validated prefix.
const THREAD_LIST_ATTEMPTS: usize = 4;

/// One thread state copied out of the target.
struct TstateCopy {
    addr: u64,
    buf: Vec<u8>,
}

/// Reads an interpreter's thread list, then walks each thread's frames.
///
/// The list is read completely and validated first — every thread state must point back at
/// this interpreter and carry a plausible thread id — and read afresh when a check fails: a
/// target that starts and ends threads while we read would otherwise hand us freed memory as
/// threads (seen in about 1 % of dumps under thread churn). Frames are walked only afterwards,
/// which keeps the window in which the list can change short.
fn walk_threads(
    ctx: Ctx<'_>,
    interp: u64,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    limits: Limits,
) -> Result<Vec<RawThread>, PyError> {
    let (mem, l) = (ctx.mem, ctx.layout);
    let t = &l.tstate;
    let mut list = Vec::new();
    let mut consistent = false;
    for attempt in 0..THREAD_LIST_ATTEMPTS {
        if attempt > 0 {
            mem.refresh();
        }
        (list, consistent) = read_thread_list(ctx, interp, counts, limits)?;
        if consistent {
            break;
        }
    }
    if !consistent {
        // Still changing (or corrupt) after every attempt: keep the validated prefix.
        counts.add(ErrorKind::BadThreadList);
    }
    let mut threads = Vec::with_capacity(list.len());
    for TstateCopy { addr: ts, buf } in list {
        let f64_ = |off| field_u64(&buf, off).unwrap_or(0);
        let frame = top_frame(ctx, &buf, counts)?;
        let holds_gil = match t.holds_gil {
            HoldsGil::Unknown => None,
            HoldsGil::StatusBit { offset, bit } => {
                field_u32(&buf, offset).map(|w| (w >> bit) & 1 == 1)
            }
            HoldsGil::Int { offset } => field_u32(&buf, offset).map(|w| w != 0),
        };
        let attached = t.state.and_then(|off| field_u32(&buf, off)).map(|s| s == 1);
        let base = base_frame(ctx, &buf);
        let walked = walk_frames_with(ctx, frame, base, cache, counts, limits)?;
        let thread_id = f64_(t.thread_id);
        let native_thread_id = match t.native_thread_id {
            Some(off) => f64_(off),
            None => pthread_tid(ctx, thread_id).unwrap_or(0),
        };
        threads.push(RawThread {
            tstate: ts,
            native_thread_id,
            thread_id,
            frames: walked.frames,
            items: walked.items,
            locals: walked.locals,
            truncated: walked.truncated,
            holds_gil,
            attached,
        });
    }
    Ok(threads)
}

/// 3.15+: the address of the thread state's base frame (0 before 3.15).
fn base_frame(ctx: Ctx<'_>, buf: &[u8]) -> u64 {
    ctx.layout
        .tstate
        .base_frame
        .and_then(|off| field_u64(buf, off))
        .unwrap_or(0)
}

/// The innermost frame of the thread state copied in `buf` (3.12: through `cframe`).
fn top_frame(ctx: Ctx<'_>, buf: &[u8], counts: &mut ErrorCounts) -> Result<u64, PyError> {
    let t = &ctx.layout.tstate;
    let frame = field_u64(buf, t.current_frame).unwrap_or(0);
    let (Some(inner), true) = (t.cframe_current_frame, frame != 0) else {
        return Ok(frame);
    };
    match ctx.mem.read_u64(frame.wrapping_add(inner)) {
        Ok(f) => Ok(f),
        Err(e) => {
            if let Some(f) = fatal(ctx.target.pid, e) {
                return Err(f);
            }
            counts.add(ErrorKind::MemoryRead);
            Ok(0)
        }
    }
}

/// The frames of one thread state, read afresh (`dump --native` reads each thread again while
/// it is stopped).
pub fn walk_thread(
    ctx: Ctx<'_>,
    tstate: u64,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    limits: Limits,
) -> Result<WalkedFrames, PyError> {
    let mut buf = vec![0u8; ctx.layout.tstate.size as usize];
    ctx.mem
        .read(tstate, &mut buf)
        .map_err(|e| PyError::from_mem(ctx.target.pid, e))?;
    let frame = top_frame(ctx, &buf, counts)?;
    let base = base_frame(ctx, &buf);
    walk_frames_with(ctx, frame, base, cache, counts, limits)
}

/// Copies the thread states of `interp`'s list. Returns the copies that passed validation and
/// whether the whole list did (`false`: the list changed while we read it).
fn read_thread_list(
    ctx: Ctx<'_>,
    interp: u64,
    counts: &mut ErrorCounts,
    limits: Limits,
) -> Result<(Vec<TstateCopy>, bool), PyError> {
    let (mem, l, pid) = (ctx.mem, ctx.layout, ctx.target.pid);
    let t = &l.tstate;
    let mut ts = mem
        .read_u64(interp.wrapping_add(l.interp.threads_head))
        .map_err(|e| PyError::from_mem(pid, e))?;
    let mut copies: Vec<TstateCopy> = Vec::new();
    let mut seen = HashSet::new();
    while ts != 0 {
        if copies.len() >= limits.max_threads {
            counts.add(ErrorKind::TooManyThreads);
            return Ok((copies, true));
        }
        if !seen.insert(ts) {
            return Ok((copies, false));
        }
        let mut buf = vec![0u8; t.size as usize];
        if let Err(e) = mem.read(ts, &mut buf) {
            if let Some(f) = fatal(pid, e) {
                return Err(f);
            }
            return Ok((copies, false));
        }
        let back = field_u64(&buf, t.interp).unwrap_or(0);
        // ≤ 3.10 has no `native_thread_id`: a `pthread_t` is never 0.
        let plausible = match t.native_thread_id {
            Some(off) => field_u64(&buf, off).is_some_and(|n| n <= PID_MAX_LIMIT),
            None => field_u64(&buf, t.thread_id).is_some_and(|id| id != 0),
        };
        if back != interp || !plausible {
            return Ok((copies, false));
        }
        let next = field_u64(&buf, t.next).unwrap_or(0);
        copies.push(TstateCopy { addr: ts, buf });
        ts = next;
    }
    Ok((copies, true))
}

/// The Linux TID of the thread whose `pthread_t` is `thread_id` (≤ 3.10 thread states have
/// no `native_thread_id`): `pthread_t` is the address of the thread's `struct pthread`, whose
/// `tid` field is at the offset glibc publishes for debuggers (`Target::pthread_tid`).
pub fn pthread_tid(ctx: Ctx<'_>, thread_id: u64) -> Option<u64> {
    let off = ctx.target.pthread_tid?;
    let tid = ctx.mem.read_i32(thread_id.wrapping_add(off)).ok()?;
    u64::try_from(tid)
        .ok()
        .filter(|&t| t != 0 && t <= PID_MAX_LIMIT)
}

/// Follows `previous` from `first`: Python frames innermost first, and whether the chain was
/// cut (depth cap, loop or unreadable frame).
pub fn walk_frames(
    ctx: Ctx<'_>,
    first: u64,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    max_depth: usize,
) -> Result<(Vec<PyFrame>, bool), PyError> {
    let limits = Limits {
        max_depth,
        ..Limits::default()
    };
    let w = walk_frames_with(ctx, first, 0, cache, counts, limits)?;
    Ok((w.frames, w.truncated))
}

/// Follows `previous` from `first`, keeping entry frames and, when `limits.locals` asks for
/// them, every Python frame's arguments and locals (read right after the frame itself).
/// `base` (3.15+: the thread state's base frame, else 0) ends the chain without being an
/// entry frame: it belongs to no eval-loop activation.
pub fn walk_frames_with(
    ctx: Ctx<'_>,
    first: u64,
    base: u64,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    limits: Limits,
) -> Result<WalkedFrames, PyError> {
    let (mem, l, pid) = (ctx.mem, ctx.layout, ctx.target.pid);
    let f = &l.frame;
    let max_depth = limits.max_depth;
    let mut buf = vec![0u8; f.size as usize];
    let mut out = WalkedFrames::default();
    let mut seen = HashSet::new();
    // Entry frames interleave with Python frames (one per C→Python call at most).
    let max_steps = max_depth.saturating_mul(2).saturating_add(64);
    let mut addr = first;
    let mut steps = 0usize;
    while addr != 0 {
        if out.frames.len() >= max_depth || steps >= max_steps {
            counts.add(ErrorKind::DepthTruncated);
            out.truncated = true;
            return Ok(out);
        }
        steps += 1;
        if !seen.insert(addr) {
            counts.add(ErrorKind::FrameLoop);
            out.truncated = true;
            return Ok(out);
        }
        if let Err(e) = mem.read(addr, &mut buf) {
            if let Some(fatal) = fatal(pid, e) {
                return Err(fatal);
            }
            counts.add(ErrorKind::MemoryRead);
            out.truncated = true;
            return Ok(out);
        }
        // ≤ 3.10: a `PyFrameObject` of another type is no frame (a stale `f_back`, freed
        // memory): counted, and the chain ends here (what it points to cannot be trusted).
        if f.is_object
            && let Some(want) = ctx.target.pyframe_type
            && field_u64(&buf, l.object.ob_type) != Some(want)
        {
            counts.add(ErrorKind::WrongType);
            out.truncated = true;
            return Ok(out);
        }
        let previous = field_u64(&buf, f.previous).unwrap_or(0);
        let owner = f.owner.map_or(Some(0), |o| field_u8(&buf, o));
        // An owner CPython never uses: this memory is no frame (a chain read while it changed,
        // docs/cpython-layouts.md §3.5); what was read above it stays.
        if owner.zip(f.owner_max).is_some_and(|(o, max)| o > max) {
            counts.add(ErrorKind::NotAFrame);
            out.truncated = true;
            return Ok(out);
        }
        if owner.is_some_and(|o| !f.is_shim_owner(o)) {
            let exec = field_u64(&buf, f.executable).unwrap_or(0);
            let instr = field_u64(&buf, f.instr_ptr).unwrap_or(0);
            let tlbc = f
                .tlbc_index
                .and_then(|o| field_u32(&buf, o))
                .map_or(0, |v| v as i32);
            match code_from_executable(exec, f.stackref_tag_mask) {
                None => {
                    counts.add(ErrorKind::BadExecutable);
                    // A Python frame without code that also ends the chain is not a frame at
                    // all (memory that was zeroed, e.g. a core file that lacks it): what was
                    // below it is lost.
                    if previous == 0 {
                        out.truncated = true;
                    }
                }
                Some(code) => match resolve(ctx, cache, counts, code, instr, tlbc) {
                    Ok(r) if r.is_init_shim => {}
                    Ok(r) => {
                        if let Some(v) = limits.locals {
                            out.locals
                                .push(frame_locals(ctx, cache, addr, code, v, counts));
                        }
                        out.items.push(ChainItem::Frame(out.frames.len() as u32));
                        out.frames.push(r.frame);
                    }
                    // Not a code object: this memory is no frame either (as above).
                    Err(e @ CodeError::NotCode { .. }) => {
                        counts.add(e.kind());
                        out.truncated = true;
                        return Ok(out);
                    }
                    Err(e) => counts.add(e.kind()),
                },
            }
            // ≤ 3.11 has no entry frames: the outermost frame of each eval-loop activation
            // ends it (every frame up to 3.10; the one with `is_entry` set in 3.11).
            let ends = match f.entry {
                EntryRule::EveryFrame => true,
                EntryRule::EntryFlag => f
                    .is_entry
                    .and_then(|o| field_u8(&buf, o))
                    .is_some_and(|v| v != 0),
                EntryRule::OwnerAtLeast(_) => false,
            };
            if ends {
                out.items.push(ChainItem::Entry);
            }
        } else if addr != base {
            out.items.push(ChainItem::Entry);
        }
        addr = previous;
    }
    // 3.12+: every eval-loop activation's frames sit on its entry frame, so a chain that ends
    // on another frame was read while it changed (a generator that yields clears its frame's
    // `previous` after the thread moved on: a running thread read without a pause).
    if matches!(f.entry, EntryRule::OwnerAtLeast(_))
        && !out.frames.is_empty()
        && !matches!(out.items.last(), Some(ChainItem::Entry))
    {
        counts.add(ErrorKind::NotAFrame);
        out.truncated = true;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executable_decoding() {
        assert_eq!(code_from_executable(0x1000, 0), Some(0x1000));
        assert_eq!(code_from_executable(0, 0), None);
        assert_eq!(
            code_from_executable(0x1001, 3),
            Some(0x1000),
            "deferred/immortal bit"
        );
        assert_eq!(code_from_executable(1, 3), None, "PyStackRef_NULL");
        assert_eq!(code_from_executable((42 << 2) | 3, 3), None, "tagged int");
        assert_eq!(code_from_executable(0x1000, 3), Some(0x1000));
    }
}
