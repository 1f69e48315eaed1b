//! `pyebpf_switch` / `pyebpf_switch_bounded` (`sched_switch`) and `pyebpf_wakeup`
//! (`sched_wakeup`), BTF tracepoints loaded with `--idle`: where target Python threads spend
//! their time off a CPU.
//!
//! Input: `sched_switch(preempt, prev, next[, prev_state])` and `sched_wakeup(p)`, `CONFIG`,
//! `PY_PROCS`, `TARGET_PIDS`. Output: `OFFCPU` entries, and per off-CPU interval that holds
//! at least one sampling instant one `OffCpuRecord` in `EVENTS`; the `OffCpu*` counters.
//!
//! - Switch-out (`prev`, the current task): a thread of a process in `PY_PROCS` (and in
//!   `TARGET_PIDS` under a pid filter) gets its `OFFCPU` entry filled in place: the switch-out
//!   as a sample (time, ids, comm, kernel stack with `--kernel`, user registers), its Python
//!   frames by the same walk and caches as a CPU-clock sample (`python::capture`), the task
//!   state (`prev_state`, or the state word before Linux 5.18), `preempt`, the system call it
//!   is in (`orig_ax` of its saved user registers when they were saved by `syscall`: there
//!   `cx == ip` and `r11 == flags`) and whether that call is a `futex` wait inside its
//!   interpreter's GIL struct (waiting for the GIL). A dying thread (`TASK_DEAD`) has its entry
//!   removed.
//! - Wake-up: the first `sched_wakeup` of a thread with an open interval stamps `t_wake`.
//! - Switch-in (`next`): an open interval is closed; when a multiple of
//!   `Config::offcpu_period_ns` falls inside it, the entry goes to `EVENTS` as it is (one
//!   `bpf_ringbuf_output` of the map value), so the cost per emitted interval is bounded by the
//!   rate, not by the number of switches.
//!
//! Constraints: every switch on the host runs this; a switch of a non-target thread costs a
//! `bpf_get_current_pid_tgid`, one `PY_PROCS` lookup, one 4-byte kernel read (`next->pid`) and
//! one `OFFCPU` lookup. The tracepoints run with interrupts off, so the CPU-clock program never
//! interrupts them on their CPU (they share its per-CPU scratch maps). Nothing larger than a
//! few words lives on the BPF stack: the record is written in the map value.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated},
    macros::btf_tracepoint,
    programs::{BtfTracePointContext, tracing::StackIdContext as _},
};
use sampler_common::{
    Config, Counter, EventHeader, OffCpuInfo, OffCpuRecord, PY_MAX_FRAMES, PyCapture,
    PyFrameRecord, SampleEvent, UserRegs, event_kind, offcpu_flags, sample_flags,
};

use crate::{
    maps::{
        EVENTS, KSTACKS, OFFCPU, OFFCPU_ZERO, PY_PROCS, config, count, count_n, current_comm,
        is_target,
    },
    python,
    sample::wakeup_flags,
    variant::{Bounded, Modern, Variant},
};

/// `TASK_DEAD` (`include/linux/sched.h`): the thread is exiting and never runs again.
const TASK_DEAD: u32 = 0x0080;
/// x86-64 `__NR_futex`.
const NR_FUTEX: u64 = 202;
/// Low two bits of `cs` are the privilege level; 3 is user mode.
const CPL_MASK: u64 = 3;
/// `-ENOENT`: stored as the kernel stack id when kernel stacks are disabled.
const KSTACK_DISABLED: i32 = -2;
/// Bytes of an `OffCpuRecord` before its first frame record.
const RECORD_HEAD: usize =
    core::mem::offset_of!(OffCpuRecord, py) + core::mem::offset_of!(PyCapture, frames);

/// The [`Modern`] variant (kernel ≥ 5.17).
#[btf_tracepoint(function = "sched_switch")]
pub fn pyebpf_switch(ctx: BtfTracePointContext) -> i32 {
    switch::<Modern>(&ctx);
    0
}

/// The [`Bounded`] variant (kernel ≥ 5.10 without `bpf_loop`).
#[btf_tracepoint(function = "sched_switch")]
pub fn pyebpf_switch_bounded(ctx: BtfTracePointContext) -> i32 {
    switch::<Bounded>(&ctx);
    0
}

/// Stamps the wake-up of an off-CPU target thread.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn pyebpf_wakeup(ctx: BtfTracePointContext) -> i32 {
    let cfg = config();
    if cfg.offcpu != 1 {
        return 0;
    }
    let task: u64 = ctx.arg(0);
    let Some(tid) = task_tid(task, &cfg) else {
        return 0;
    };
    if let Some(rec) = OFFCPU.get_ptr_mut(tid) {
        // SAFETY: a value of this map, valid for the program run; only these programs write
        // it, and never for the same thread at once (see `switch`).
        let off = unsafe { &mut (*rec).off };
        if off.t_out != 0 && off.t_wake == 0 {
            // SAFETY: helper without arguments.
            off.t_wake = unsafe { generated::bpf_ktime_get_ns() };
        }
    }
    0
}

#[inline(always)]
fn switch<V: Variant>(ctx: &BtfTracePointContext) {
    let cfg = config();
    if cfg.offcpu != 1 || cfg.offcpu_period_ns == 0 {
        return;
    }
    // SAFETY: helper without arguments.
    let now = unsafe { generated::bpf_ktime_get_ns() };
    // `next` cannot be `prev`, and `next` is not running yet: its entry is written by no one
    // else now (its own switch-out finished before it could be picked again).
    let next: u64 = ctx.arg(2);
    switch_in(next, &cfg, now);
    switch_out::<V>(ctx, &cfg, now);
}

/// The host tid of `task` (`task->pid`).
#[inline(always)]
fn task_tid(task: u64, cfg: &Config) -> Option<u32> {
    // SAFETY: the helper validates the kernel address.
    unsafe { bpf_probe_read_kernel((task + u64::from(cfg.task_pid_offset)) as *const i32) }
        .ok()
        .map(|tid| tid as u32)
}

/// Closes `next`'s open interval, emitting it when it holds a sampling instant.
#[inline(always)]
fn switch_in(next: u64, cfg: &Config, now: u64) {
    let Some(tid) = task_tid(next, cfg) else {
        return;
    };
    let Some(rec) = OFFCPU.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: a value of this map, valid for the program run (see `switch`).
    let rec = unsafe { &mut *rec };
    let t_out = rec.off.t_out;
    if t_out == 0 {
        return;
    }
    let period = cfg.offcpu_period_ns;
    let ticks = now / period - t_out / period;
    if ticks == 0 {
        count(Counter::OffCpuShort);
    } else {
        rec.off.t_in = now;
        // Only the captured frames: a 20-frame stack sends 0.6 KiB, not the 6 KiB of the whole
        // value (user space accepts an off-CPU record cut after its last frame).
        let frames = (rec.py.nframes as usize).min(PY_MAX_FRAMES);
        let len = RECORD_HEAD + frames * size_of::<PyFrameRecord>();
        // SAFETY: `len` ≤ the size of the map value `rec` points into.
        let bytes = unsafe { core::slice::from_raw_parts((&raw const *rec).cast::<u8>(), len) };
        if EVENTS.output::<[u8]>(bytes, wakeup_flags()).is_ok() {
            count(Counter::OffCpuSent);
        } else {
            count(Counter::OffCpuLost);
            count_n(Counter::LostSamples, ticks);
        }
    }
    rec.off.t_out = 0;
}

/// Opens an interval for the current task (`prev`) when it is a target Python thread.
#[inline(always)]
fn switch_out<V: Variant>(ctx: &BtfTracePointContext, cfg: &Config, now: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tid == 0 || (cfg.filter_pids == 1 && !is_target(tgid)) {
        return;
    }
    let Some(info) = PY_PROCS.get_ptr(tgid) else {
        return;
    };
    // SAFETY: a value of this map, valid for the program run.
    let info = unsafe { &*info };
    let task_state = prev_state(ctx, cfg);
    if task_state & TASK_DEAD != 0 {
        let _ = OFFCPU.remove(tid);
        return;
    }
    count(Counter::OffCpuSwitches);
    let Some(rec) = entry(tid) else {
        count(Counter::OffCpuMapFull);
        return;
    };
    // SAFETY: a value of this map, valid for the program run; `prev` is still on this CPU, so
    // no other program run touches its entry (a wake-up comes only after this switch).
    let rec = unsafe { &mut *rec };
    let preempt = ctx.arg::<u64>(0) & 0xff != 0;
    let mut off = OffCpuInfo {
        t_out: now,
        t_wake: 0,
        t_in: 0,
        syscall: 0,
        task_state,
        flags: if preempt { offcpu_flags::PREEMPT } else { 0 },
    };
    let (flags, regs, args0) = user_regs::<V>(&mut off);
    write_event(rec, tgid, tid, now, flags, regs, kernel_stack_id(ctx, cfg));
    // SAFETY: `rec.py` is a writable `PyCapture` inside the map value.
    let gil = unsafe { python::capture::<V>(info, tid, &raw mut rec.py) };
    let gil_end = gil.wrapping_add(u64::from(info.gil_size));
    if !preempt
        && off.flags & offcpu_flags::IN_SYSCALL != 0
        && off.syscall == NR_FUTEX
        && gil != 0
        && args0 >= gil
        && args0 < gil_end
    {
        off.flags |= offcpu_flags::GIL_WAIT;
    }
    rec.off = off;
}

/// The `OFFCPU` entry of `tid`, created (zeroed) when it has none; `None` when the map is full.
#[inline(always)]
fn entry(tid: u32) -> Option<*mut OffCpuRecord> {
    if let Some(rec) = OFFCPU.get_ptr_mut(tid) {
        return Some(rec);
    }
    let zero = OFFCPU_ZERO.get_ptr(0)?;
    // SAFETY: this CPU's never-written value of `OFFCPU_ZERO`, valid for the program run.
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value the record would be copied onto the 512-byte BPF stack"
    )]
    OFFCPU
        .insert(tid, unsafe { &*zero }, u64::from(BPF_NOEXIST))
        .ok()?;
    OFFCPU.get_ptr_mut(tid)
}

/// The switch-out's task state: `prev_state` when the tracepoint passes it (Linux 5.18+, where
/// the kernel stopped re-reading the state word, which a concurrent wake-up may already have
/// reset), else the state word.
#[inline(always)]
fn prev_state(ctx: &BtfTracePointContext, cfg: &Config) -> u32 {
    if cfg.switch_prev_state == 1 {
        return ctx.arg::<u64>(3) as u32;
    }
    // SAFETY: the helper takes no arguments; the address is only read through the helper,
    // which validates it.
    unsafe {
        let task = generated::bpf_get_current_task();
        bpf_probe_read_kernel((task + u64::from(cfg.task_state_offset)) as *const u32)
    }
    .unwrap_or(0)
}

/// The current task's saved user registers as `sample_flags` and `UserRegs`, and its first
/// system-call argument (`di`); records the system call in `off` when the registers were
/// saved by `syscall` (the instruction leaves the return address in `cx` and the flags in
/// `r11`, and the entry code saves both; an exception or interrupt frame has other values
/// there, and `orig_ax` then holds an error code or -1).
#[inline(always)]
fn user_regs<V: Variant>(off: &mut OffCpuInfo) -> (u32, UserRegs, u64) {
    match V::saved_user_regs() {
        Ok(frame) if frame.cs & CPL_MASK == CPL_MASK => {
            if (frame.orig_ax as i64) >= 0 && frame.cx == frame.ip && frame.r11 == frame.flags {
                off.flags |= offcpu_flags::IN_SYSCALL;
                off.syscall = frame.orig_ax;
            }
            let regs = UserRegs {
                ip: frame.ip,
                sp: frame.sp,
                bp: frame.bp,
            };
            let flags = if frame.sp == 0 {
                sample_flags::NO_USER_REGS
            } else {
                sample_flags::REGS_FROM_TASK
            };
            (flags, regs, frame.di)
        }
        _ => (sample_flags::NO_USER_REGS, UserRegs::default(), 0),
    }
}

/// The kernel stack of the switch-out, with `--kernel`.
#[inline(always)]
fn kernel_stack_id(ctx: &BtfTracePointContext, cfg: &Config) -> i32 {
    if cfg.kernel_stacks != 1 {
        return KSTACK_DISABLED;
    }
    match ctx.get_stackid(&KSTACKS, 0) {
        Ok(id) => id as i32,
        Err(errno) => {
            count(if errno == crate::sample::NEG_EEXIST {
                Counter::KernelStackCollisions
            } else {
                Counter::KernelStackErrors
            });
            errno
        }
    }
}

/// Writes the switch-out as a sample header into `rec.event`, field by field (a whole
/// `SampleEvent` on the BPF stack would crowd the walk's frame).
#[inline(always)]
fn write_event(
    rec: &mut OffCpuRecord,
    tgid: u32,
    tid: u32,
    now: u64,
    flags: u32,
    regs: UserRegs,
    kernel_stack_id: i32,
) {
    let ev: &mut SampleEvent = &mut rec.event;
    ev.header = EventHeader {
        kind: event_kind::OFFCPU,
        flags,
    };
    ev.time_ns = now;
    ev.pid = tgid;
    ev.tid = tid;
    // SAFETY: helper without arguments.
    ev.cpu = unsafe { generated::bpf_get_smp_processor_id() };
    ev.kernel_stack_id = kernel_stack_id;
    ev.regs = regs;
    ev.stack_base = 0;
    ev.stack_len = 0;
    ev.stack_cap = 0;
    ev.comm = current_comm();
    ev.py_cap = size_of::<PyCapture>() as u32;
    ev._pad = 0;
}
