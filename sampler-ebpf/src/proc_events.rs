//! Process life-cycle programs: `pyebpf_exec`, `pyebpf_exit`, `pyebpf_fork` (raw tracepoints)
//! and `pyebpf_fork_tracepoint` (the perf-event tracepoint, for kernels without BTF).
//!
//! Input: the `sched_process_exec`, `sched_process_exit` and `task_newtask` tracepoints and
//! `CONFIG`. Output: `ProcEvent` records in `EVENTS`; the fork programs also add children of
//! target processes to `TARGET_PIDS` so they are sampled from their first tick.
//!
//! Constraints: these run in the context of the task concerned (exec: the new image; exit: the
//! exiting thread; new task: the parent), so pids and `comm` come from helpers. Raw tracepoints
//! rather than perf-event ones: detaching a perf-event tracepoint waits for RCU grace periods
//! (`perf_trace_event_unreg` → `tracepoint_synchronize_unregister`, 80–100 ms per tracepoint at
//! the end of every run), a raw one frees its probe after the grace period without waiting.
//! Following uses `task_newtask` rather than `sched_process_fork` because both fire for new
//! threads too, and only `task_newtask` carries `clone_flags` to tell a thread
//! (`CLONE_THREAD`) from a process. It fires at the end of `copy_process()`, after the last
//! failure point and before the child first runs. Its raw arguments are `(struct task_struct
//! *task, unsigned long clone_flags)`; the child's pid is read at `CONFIG.task_pid_offset` (from
//! the kernel BTF). Without BTF, user space loads the perf-event version, whose record offsets
//! come from the tracepoint's `format` file (`CONFIG.fork_*_offset`).
use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated},
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use sampler_common::{
    CLONE_THREAD, Counter, EventHeader, ProcEvent, TRACEPOINT_OFFSET_MAX, event_kind,
};

use crate::maps::{EVENTS, TARGET_PIDS, config, count, current_comm, is_target};

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn pyebpf_exec(_ctx: RawTracePointContext) -> i32 {
    shim(try_exec())
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn pyebpf_exit(_ctx: RawTracePointContext) -> i32 {
    shim(try_exit())
}

#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn pyebpf_fork(ctx: RawTracePointContext) -> i32 {
    shim(try_fork(|| {
        let task: *const u8 = ctx.arg(0);
        let clone_flags: u64 = ctx.arg(1);
        let offset = config().task_pid_offset;
        if offset == 0 {
            return Err(Counter::ProcEventErrors);
        }
        // SAFETY: a kernel read at a BTF offset inside the new task, through the helper.
        #[allow(
            clippy::cast_ptr_alignment,
            reason = "bpf_probe_read_kernel copies bytes: the source needs no alignment"
        )]
        let pid =
            unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize).cast::<i32>()) }
                .map_err(|_| Counter::ProcEventErrors)?;
        Ok((clone_flags, pid))
    }))
}

#[tracepoint(category = "task", name = "task_newtask")]
pub fn pyebpf_fork_tracepoint(ctx: TracePointContext) -> i32 {
    shim(try_fork(|| {
        let cfg = config();
        let (pid_offset, flags_offset) = (cfg.fork_pid_offset, cfg.fork_flags_offset);
        if pid_offset > TRACEPOINT_OFFSET_MAX || flags_offset > TRACEPOINT_OFFSET_MAX {
            return Err(Counter::ProcEventErrors);
        }
        // SAFETY: both read a few bytes of the tracepoint record through bpf_probe_read_kernel.
        let clone_flags = unsafe { ctx.read_at::<u64>(flags_offset as usize) }
            .map_err(|_| Counter::ProcEventErrors)?;
        let pid = unsafe { ctx.read_at::<i32>(pid_offset as usize) }
            .map_err(|_| Counter::ProcEventErrors)?;
        Ok((clone_flags, pid))
    }))
}

#[inline(always)]
fn shim(result: Result<(), Counter>) -> i32 {
    if let Err(counter) = result {
        count(counter);
    }
    0
}

/// A process replaced its image: report it (only targets when filtering).
#[inline(always)]
fn try_exec() -> Result<(), Counter> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if config().filter_pids == 1 && !is_target(tgid) {
        return Ok(());
    }
    // Wake user space at once, whatever waits in the ring: a new Python process is captured
    // only once user space has attached it, and a short-lived one (a cron job, a CLI tool)
    // would otherwise run unseen until the next flush of the ring (samples do not wake it).
    emit(event_kind::EXEC, tgid, 0, u64::from(BPF_RB_FORCE_WAKEUP))
}

/// A thread exited: report it when it is a thread-group leader (only targets when filtering,
/// which then stop being targets).
#[inline(always)]
fn try_exit() -> Result<(), Counter> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if pid_tgid as u32 != tgid {
        return Ok(());
    }
    if config().filter_pids == 1 {
        if !is_target(tgid) {
            return Ok(());
        }
        // The process is gone: free its slot (the table is bounded, and a later process could
        // reuse the pid). A leader that exits before its other threads (rare) stops their
        // sampling too.
        let _ = TARGET_PIDS.remove(tgid);
    }
    emit(event_kind::EXIT, tgid, 0, 0)
}

/// A target created a new process: make it a target and report it. New threads are ignored
/// (their samples already match through the shared tgid). `read` gives the new task's
/// `clone_flags` and pid (the two programs find them in different places).
///
/// The parent is the current task's tgid: the forking thread may not be the main thread.
#[inline(always)]
fn try_fork(read: impl FnOnce() -> Result<(u64, i32), Counter>) -> Result<(), Counter> {
    if config().follow_children != 1 {
        return Ok(());
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_target(parent) {
        return Ok(());
    }
    let (clone_flags, child) = read()?;
    if clone_flags & CLONE_THREAD != 0 {
        return Ok(());
    }
    if child <= 0 {
        return Err(Counter::ProcEventErrors);
    }
    let child = child as u32;
    TARGET_PIDS
        .insert(child, 1u8, 0)
        .map_err(|_| Counter::FollowFailed)?;
    emit(event_kind::FORK, child, parent, 0)
}

/// Writes one event; `flags` as for `bpf_ringbuf_submit` (0: wake user space only when the
/// ring was empty).
#[inline(always)]
fn emit(kind: u32, pid: u32, parent_pid: u32, flags: u64) -> Result<(), Counter> {
    let Some(mut entry) = EVENTS.reserve::<ProcEvent>(0) else {
        return Err(Counter::LostProcEvents);
    };
    let event = ProcEvent {
        header: EventHeader { kind, flags: 0 },
        // SAFETY: helper without arguments.
        time_ns: unsafe { generated::bpf_ktime_get_ns() },
        pid,
        parent_pid,
        comm: current_comm(),
    };
    entry.write(event);
    entry.submit(flags);
    Ok(())
}
