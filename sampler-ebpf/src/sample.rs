//! `pyebpf_sample` and `pyebpf_sample_bounded`: the CPU-clock perf-event program, in the two
//! variants of `variant.rs` (user space loads one).
//!
//! Input: the perf context of a software CPU-clock sample on any CPU, plus `CONFIG` and
//! `PY_PROCS`.
//! Output: one record in `EVENTS`: `SampleEvent | stack bytes [stack_cap] | PyCapture`, where
//! the stack copy is present when configured and the user registers are known, and the
//! `PyCapture` (see `python`) when the process is in `PY_PROCS` — independently of the stack
//! copy; counters for every dropped or degraded sample.
//!
//! Constraints: the ring-buffer reservation size must be a verifier-visible constant, so there is
//! one monomorphised record type per (stack class or none) × (with or without Python capture).
//! The stack class is a frozen `CONFIG` constant, so the verifier walks only the configured
//! class's two variants (and the no-stack pair for samples without user registers). User memory
//! is read in whole pages at constant offsets, starting from the page that holds `sp`, because
//! one large read from `sp` fails whenever the mapped stack ends before `sp + len`.
use core::{ffi::c_void, ptr::addr_of_mut};

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, generated},
    macros::perf_event,
    programs::{PerfEventContext, tracing::StackIdContext as _},
};
use sampler_common::{
    Config, Counter, EventHeader, PyCapture, PyProcInfo, STACK_PAGE, STACK_SIZE_CLASSES,
    SampleEvent, UserRegs, event_kind, sample_flags,
};

use crate::{
    maps::{EVENTS, KSTACKS, PY_PROCS, config, count, current_comm, is_target},
    python,
    variant::{Bounded, Modern, Variant},
};

/// `-EFAULT`: what `get_stackid` returns for a sample taken in user mode (no kernel stack).
const NEG_EFAULT: i32 = -14;
/// `-EEXIST`: what `get_stackid` (without `BPF_F_REUSE_STACKID`) returns when the stack's hash
/// bucket holds another stack.
pub(crate) const NEG_EEXIST: i32 = -17;
/// `-ENOENT`: stored as the kernel stack id when kernel stacks are disabled.
const KSTACK_DISABLED: i32 = -2;
/// Mask that rounds an address down to the start of its page.
const PAGE_MASK: u64 = !(STACK_PAGE as u64 - 1);
/// Low two bits of `cs` are the privilege level; 3 is user mode.
const CPL_MASK: u64 = 3;

const CLASS_0: u32 = STACK_SIZE_CLASSES[0];
const CLASS_1: u32 = STACK_SIZE_CLASSES[1];
const CLASS_2: u32 = STACK_SIZE_CLASSES[2];
const CLASS_3: u32 = STACK_SIZE_CLASSES[3];
// `try_sample` has one match arm per class: a new class must get its arm.
const _: () = assert!(STACK_SIZE_CLASSES.len() == 4);

/// A sample record with `N` bytes of user stack after the header (`N == 0`: none), reserved in
/// one piece.
#[repr(C)]
struct SampleWithStack<const N: usize> {
    event: SampleEvent,
    stack: [u8; N],
}

/// As [`SampleWithStack`], followed by the Python capture (`N` is a multiple of 8, so `py` sits
/// at `size_of::<SampleEvent>() + N` with no padding: the layout user space decodes).
#[repr(C)]
struct SampleWithPython<const N: usize> {
    event: SampleEvent,
    stack: [u8; N],
    py: PyCapture,
}
const _: () = assert!(size_of::<SampleEvent>().is_multiple_of(8));

/// The [`Modern`] variant (kernel ≥ 5.17).
#[perf_event]
pub fn pyebpf_sample(ctx: PerfEventContext) -> u32 {
    sample::<Modern>(&ctx)
}

/// The [`Bounded`] variant (kernel ≥ 5.10 without `bpf_loop`).
#[perf_event]
pub fn pyebpf_sample_bounded(ctx: PerfEventContext) -> u32 {
    sample::<Bounded>(&ctx)
}

#[inline(always)]
fn sample<V: Variant>(ctx: &PerfEventContext) -> u32 {
    count(Counter::Runs);
    match try_sample::<V>(ctx) {
        Ok(()) => count(Counter::Sent),
        Err(reason) => count(reason),
    }
    0
}

/// Filter, build and emit one sample. `Err` names the counter for why it was not sent.
#[inline(always)]
fn try_sample<V: Variant>(ctx: &PerfEventContext) -> Result<(), Counter> {
    let cfg = config();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let thread = pid_tgid as u32;
    if thread == 0 {
        return Err(Counter::Idle);
    }
    if cfg.self_pid != 0 && tgid == cfg.self_pid {
        return Err(Counter::SelfSamples);
    }
    if cfg.filter_pids == 1 && !is_target(tgid) {
        return Err(Counter::Filtered);
    }

    let (flags, regs) = user_regs::<V>(ctx);
    let mut event = SampleEvent {
        header: EventHeader {
            kind: event_kind::SAMPLE,
            flags,
        },
        // SAFETY: helpers without arguments.
        time_ns: unsafe { generated::bpf_ktime_get_ns() },
        pid: tgid,
        tid: thread,
        cpu: unsafe { generated::bpf_get_smp_processor_id() },
        kernel_stack_id: kernel_stack_id(ctx, &cfg, flags),
        regs,
        stack_base: 0,
        stack_len: 0,
        stack_cap: 0,
        comm: current_comm(),
        py_cap: 0,
        _pad: 0,
    };
    // SAFETY: a pointer to a value of this map, valid for the whole program run.
    let py = PY_PROCS.get_ptr(tgid).map(|info| unsafe { &*info });
    if flags & sample_flags::NO_USER_REGS != 0 {
        return emit::<V, 0>(&mut event, py);
    }
    match cfg.stack_bytes {
        CLASS_0 => emit::<V, { CLASS_0 as usize }>(&mut event, py),
        CLASS_1 => emit::<V, { CLASS_1 as usize }>(&mut event, py),
        CLASS_2 => emit::<V, { CLASS_2 as usize }>(&mut event, py),
        CLASS_3 => emit::<V, { CLASS_3 as usize }>(&mut event, py),
        _ => emit::<V, 0>(&mut event, py),
    }
}

/// Emit `event` with `N` stack bytes (0: none), plus the Python capture when `py` is known.
#[inline(always)]
fn emit<V: Variant, const N: usize>(
    event: &mut SampleEvent,
    py: Option<&PyProcInfo>,
) -> Result<(), Counter> {
    match py {
        Some(info) => emit_with_python::<V, N>(event, info),
        None => emit_with_stack::<N>(event),
    }
}

/// Kernel stack id, or a negative errno. User-mode samples have no kernel stack: the kernel
/// answers `-EFAULT` for them, so the helper call is skipped and that value stored directly.
#[inline(always)]
fn kernel_stack_id(ctx: &PerfEventContext, cfg: &Config, flags: u32) -> i32 {
    if cfg.kernel_stacks != 1 {
        return KSTACK_DISABLED;
    }
    if flags & sample_flags::USER_MODE != 0 {
        return NEG_EFAULT;
    }
    match ctx.get_stackid(&KSTACKS, 0) {
        Ok(id) => id as i32,
        Err(errno) => {
            if errno == NEG_EEXIST {
                count(Counter::KernelStackCollisions);
            } else if errno != NEG_EFAULT {
                count(Counter::KernelStackErrors);
            }
            errno
        }
    }
}

/// User registers at the sample and the `sample_flags` saying where they came from.
///
/// A sample that interrupted user mode carries them in the perf context. Otherwise the task's
/// saved user frame (`task_pt_regs`) holds them. Kernel threads have a zeroed frame (x86
/// `copy_thread()` clears it for `PF_KTHREAD`), so a non-user `cs` there means a kernel thread;
/// `io_uring`/vhost workers keep a user `cs` but have `sp == 0` and no user stack. Where the
/// frame is depends on the variant ([`Variant::saved_user_regs`]).
#[inline(always)]
fn user_regs<V: Variant>(ctx: &PerfEventContext) -> (u32, UserRegs) {
    // SAFETY: `ctx.ctx` is the program's `bpf_perf_event_data`; 8-byte loads from its `regs`
    // are valid context accesses. Volatile keeps LLVM from merging them into wider copies.
    let (cs, ip, sp, bp) = unsafe {
        let regs = &raw const (*ctx.ctx).regs;
        (
            (&raw const (*regs).cs).read_volatile(),
            (&raw const (*regs).rip).read_volatile(),
            (&raw const (*regs).rsp).read_volatile(),
            (&raw const (*regs).rbp).read_volatile(),
        )
    };
    if cs & CPL_MASK == CPL_MASK {
        return (sample_flags::USER_MODE, UserRegs { ip, sp, bp });
    }
    match V::saved_user_regs() {
        Ok(frame) if frame.cs & CPL_MASK == CPL_MASK && frame.sp != 0 => (
            sample_flags::REGS_FROM_TASK,
            UserRegs {
                ip: frame.ip,
                sp: frame.sp,
                bp: frame.bp,
            },
        ),
        Ok(frame) if frame.cs & CPL_MASK == CPL_MASK => {
            (sample_flags::NO_USER_REGS, UserRegs::default())
        }
        Ok(_) => (
            sample_flags::KERNEL_THREAD | sample_flags::NO_USER_REGS,
            UserRegs::default(),
        ),
        Err(()) => {
            count(Counter::NoUserRegs);
            (sample_flags::NO_USER_REGS, UserRegs::default())
        }
    }
}

/// Emit `event` followed by up to `N` bytes of user stack, copied straight into the record.
#[inline(always)]
fn emit_with_stack<const N: usize>(event: &mut SampleEvent) -> Result<(), Counter> {
    let Some(mut entry) = EVENTS.reserve::<SampleWithStack<N>>(0) else {
        return Err(Counter::LostSamples);
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points to a reserved, writable `SampleWithStack<N>`.
    fill_stack::<N>(event, unsafe { addr_of_mut!((*record).stack) }.cast::<u8>());
    // SAFETY: as above; the header is written last so it reports the final lengths.
    unsafe { addr_of_mut!((*record).event).write(*event) };
    entry.submit(wakeup_flags());
    Ok(())
}

/// Submit flags of a sample: no wake-up of user space until `CONFIG.wakeup_bytes` wait in the
/// ring (then a forced one), so user space wakes per batch, not per sample; it also drains on
/// its own at least every flush interval, which bounds the latency of a quiet ring.
#[inline(always)]
pub fn wakeup_flags() -> u64 {
    let threshold = u64::from(config().wakeup_bytes);
    if threshold == 0 {
        0
    } else if EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) >= threshold {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// Emit `event`, up to `N` bytes of user stack and the Python capture of the sampled thread.
#[inline(always)]
fn emit_with_python<V: Variant, const N: usize>(
    event: &mut SampleEvent,
    info: &PyProcInfo,
) -> Result<(), Counter> {
    let Some(mut entry) = EVENTS.reserve::<SampleWithPython<N>>(0) else {
        return Err(Counter::LostSamples);
    };
    let record = entry.as_mut_ptr();
    // The capture first: its walks end in many verifier states, and the stack copy's page
    // loop after them is short; the other way round, every early exit of the copy loop made
    // the verifier walk the capture again (5.10 then passed 1M instructions at 64 KiB).
    // SAFETY: `record` points to a reserved, writable `SampleWithPython<N>`.
    unsafe { python::capture::<V>(info, event.tid, addr_of_mut!((*record).py)) };
    // SAFETY: as above.
    fill_stack::<N>(event, unsafe { addr_of_mut!((*record).stack) }.cast::<u8>());
    event.py_cap = size_of::<PyCapture>() as u32;
    // SAFETY: as above; the header is written last so it reports the final lengths.
    unsafe { addr_of_mut!((*record).event).write(*event) };
    entry.submit(wakeup_flags());
    Ok(())
}

/// Copy up to `N` bytes of user stack to `dst` (nothing when `N == 0`) and record the copy in
/// `event`.
#[inline(always)]
fn fill_stack<const N: usize>(event: &mut SampleEvent, dst: *mut u8) {
    if N == 0 {
        return;
    }
    let base = event.regs.sp & PAGE_MASK;
    let copied = copy_user_pages::<N>(dst, base);
    event.stack_base = base;
    event.stack_len = copied;
    event.stack_cap = N as u32;
    if (copied as usize) < N {
        event.header.flags |= sample_flags::STACK_SHORT;
    }
    if copied == 0 {
        count(Counter::StackCopyEmpty);
    }
}

/// Copy whole pages of user memory from `base` to `dst` until `N` bytes or the first fault.
/// Returns the number of bytes copied (a multiple of the page size).
#[inline(always)]
fn copy_user_pages<const N: usize>(dst: *mut u8, base: u64) -> u32 {
    let mut copied: u32 = 0;
    let mut page = 0;
    // Constant trip count: LLVM unrolls it into constant-offset reads.
    while page < N / STACK_PAGE {
        let offset = page * STACK_PAGE;
        // SAFETY: `dst + offset .. + STACK_PAGE` lies inside the reserved `[u8; N]`; the source
        // is a user address, which the helper validates (a fault returns an error).
        let ret = unsafe {
            generated::bpf_probe_read_user(
                dst.add(offset).cast::<c_void>(),
                STACK_PAGE as u32,
                (base + offset as u64) as *const c_void,
            )
        };
        if ret != 0 {
            break;
        }
        copied += STACK_PAGE as u32;
        page += 1;
    }
    copied
}
