//! The program variants: how a walk's loop is driven and where a task's saved user registers
//! come from, per kernel generation. One entry point per variant (`sample.rs`); user space
//! probes the kernel and loads exactly one (`sampler-user/src/collect/variant.rs`, whose table
//! names the same programs and says what each needs).
//!
//! - [`Modern`] (`pyebpf_sample`, kernel ≥ 5.17): every walk is a `bpf_loop` (5.17), so the
//!   verifier checks each callback body once; user registers of a sample taken in kernel mode
//!   come from `bpf_task_pt_regs(bpf_get_current_task_btf())` (5.15, 5.11; needs kernel BTF).
//! - [`Bounded`] (`pyebpf_sample_bounded`, kernel ≥ 5.10 without `bpf_loop`): the same
//!   callbacks are called from bounded loops (5.3) with the same budgets (256 frames, 256
//!   thread-list steps), so the full frame budget is kept. The verifier then walks every
//!   iteration: measured at ~21k verified instructions on 6.1 against ~4.4k for [`Modern`]
//!   (docs/benchmarks.md has the numbers per kernel), far below the 1M limit, so neither a
//!   smaller frame budget nor tail calls (which would move the capture out of the ring-buffer
//!   record into per-CPU scratch and add a copy per sample) are needed. The saved user
//!   registers are read where `task_pt_regs()` finds them on x86-64 before FRED (6.9):
//!   the last `pt_regs` below `task->stack + THREAD_SIZE` (docs/kernels.md); user space
//!   passes the offset of `stack` in `task_struct` from the kernel's BTF
//!   (`Config::task_stack_offset`, 0 when unknown: such samples then carry no user registers
//!   and are counted as `NoUserRegs`).
use core::ffi::c_void;

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_probe_read_kernel, generated},
};

use crate::maps::config;

/// A `bpf_loop`-style callback: `(index, ctx) → 0` to go on, `1` to stop.
pub type Callback = extern "C" fn(u64, *mut c_void) -> i64;

/// What a variant differs in.
pub trait Variant {
    /// Call `cb(i, ctx)` for `i` in `0..N` until it returns non-zero.
    fn run<const N: u32>(cb: Callback, ctx: *mut c_void);
    /// The current task's saved user registers (the frame at the top of its kernel stack),
    /// read when the sample interrupted kernel mode.
    fn saved_user_regs() -> Result<pt_regs, ()>;
}

/// Kernel ≥ 5.17: `bpf_loop` and `bpf_task_pt_regs`.
pub struct Modern;

/// Kernel ≥ 5.10: bounded loops, and the saved registers found through `task->stack`.
pub struct Bounded;

impl Variant for Modern {
    #[inline(always)]
    fn run<const N: u32>(cb: Callback, ctx: *mut c_void) {
        // SAFETY: `cb` is a static function of the `bpf_loop` callback type; `ctx` is what it
        // expects (the caller pairs them).
        unsafe {
            generated::bpf_loop(N, cb as *mut c_void, ctx, 0);
        }
    }

    #[inline(always)]
    fn saved_user_regs() -> Result<pt_regs, ()> {
        // SAFETY: both helpers take/return kernel pointers checked by the verifier; the frame
        // is read with bpf_probe_read_kernel, which tolerates any address.
        unsafe {
            let task = generated::bpf_get_current_task_btf();
            let regs = generated::bpf_task_pt_regs(task) as *const pt_regs;
            bpf_probe_read_kernel(regs).map_err(|_| ())
        }
    }
}

/// x86-64 `THREAD_SIZE` without KASAN (`PAGE_SIZE << (2 + KASAN_STACK_ORDER)`).
const THREAD_SIZE: u64 = 16 << 10;

impl Variant for Bounded {
    #[inline(always)]
    fn run<const N: u32>(cb: Callback, ctx: *mut c_void) {
        let mut index = 0;
        while index < u64::from(N) {
            if cb(index, ctx) != 0 {
                break;
            }
            index += 1;
        }
    }

    #[inline(always)]
    fn saved_user_regs() -> Result<pt_regs, ()> {
        let offset = config().task_stack_offset;
        if offset == 0 {
            return Err(());
        }
        // SAFETY: the task pointer is only used as an address for bpf_probe_read_kernel,
        // which tolerates any address.
        unsafe {
            let task = generated::bpf_get_current_task();
            let stack = bpf_probe_read_kernel((task + u64::from(offset)) as *const u64)
                .map_err(|_| ())?;
            let regs = stack + THREAD_SIZE - size_of::<pt_regs>() as u64;
            bpf_probe_read_kernel(regs as *const pt_regs).map_err(|_| ())
        }
    }
}
