//! The program variants: how a walk's loop is driven and where a task's saved user registers
//! come from, per kernel generation. One entry point per variant (`sample.rs`); user space
//! probes the kernel and loads exactly one (`sampler-user/src/collect/variant.rs`, whose table
//! names the same programs and says what each needs).
//!
//! - [`Modern`] (`pyebpf_sample`, kernel ≥ 5.17): every walk is a `bpf_loop` (5.17), so the
//!   verifier checks each callback body once; user registers of a sample taken in kernel mode
//!   come from `bpf_task_pt_regs(bpf_get_current_task_btf())` (5.15, 5.11; needs kernel BTF).
//! - [`Bounded`] (`pyebpf_sample_bounded`, kernel ≥ 5.10 without `bpf_loop`): bounded loops
//!   (5.3) with the same budgets (256 frames, 256 thread-list steps, so the full frame budget
//!   is kept), each iteration calling a *global* function (5.6) that runs the same callback:
//!   the verifier checks a global function once, on its own, so an iteration costs the caller
//!   a few instructions: 12k verified instructions on 6.18 and 6.12, 438k on 6.1 (whose
//!   verifier prunes less; `bpf_loop`: 5.5k, 5.6k, 48k), below the 1M limit. Calling the
//!   callbacks directly from the loops instead (static functions, verified again in every
//!   iteration) measured 153k on 6.18 and did not finish verifying in 5 minutes on 5.10 under
//!   emulation; a smaller frame budget would drop frames, and tail calls would add a program
//!   per step and a per-CPU copy of the whole capture. The price: the
//!   frames are written to per-CPU `PY_FRAMES` (a global function cannot write into the
//!   ring-buffer record) and copied into the record once per sample. The saved user
//!   registers are read where `task_pt_regs()` finds them on x86-64 before FRED (6.9):
//!   the last `pt_regs` below `task->stack + THREAD_SIZE` (docs/kernels.md); user space
//!   passes the offset of `stack` in `task_struct` from the kernel's BTF
//!   (`Config::task_stack_offset`, 0 when unknown: such samples then carry no user registers
//!   and are counted as `NoUserRegs`).
use core::ffi::c_void;

use crate::{
    maps::{PY_SCRATCH, PY_WALK, SCRATCH_HALF_WORDS, config},
    python::{FRAME_BUDGET, LOOP_STOP, THREAD_BUDGET, ThreadWalk, frame_step, thread_step},
};
use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_probe_read_kernel, generated},
};

/// What a variant differs in.
pub trait Variant {
    /// Run the thread-list walk whose state is `walk` (this CPU's `PY_WALK` value) for up to
    /// [`THREAD_BUDGET`] steps of `python::thread_step`.
    fn walk_threads(walk: *mut ThreadWalk);
    /// Run the frame walk in `PY_FRAME_WALK` for up to [`FRAME_BUDGET`] calls of the global
    /// [`pyebpf_frame_step`]; the frames end up in `PY_FRAMES`.
    fn walk_frames();
    /// The current task's saved user registers (the frame at the top of its kernel stack),
    /// read when the sample interrupted kernel mode.
    fn saved_user_regs() -> Result<SavedRegs, ()>;
}

/// Kernel ≥ 5.17: `bpf_loop` and `bpf_task_pt_regs`.
pub struct Modern;

/// Kernel ≥ 5.10: bounded loops over global step functions, and the saved registers found
/// through `task->stack`.
pub struct Bounded;

impl Variant for Modern {
    #[inline(always)]
    fn walk_threads(walk: *mut ThreadWalk) {
        // The callback context (on the stack, as `bpf_loop` wants): the map value's address.
        let mut ctx = walk;
        // SAFETY: `thread_step` takes a pointer to a `*mut ThreadWalk`, which `ctx` is.
        unsafe {
            generated::bpf_loop(
                THREAD_BUDGET,
                thread_step as *mut c_void,
                (&raw mut ctx).cast(),
                0,
            );
        }
    }

    #[inline(always)]
    fn walk_frames() {
        // SAFETY: the callback ignores its context.
        unsafe {
            generated::bpf_loop(
                FRAME_BUDGET as u32,
                frame_loop_step as *mut c_void,
                core::ptr::null_mut(),
                0,
            );
        }
    }

    #[inline(always)]
    fn saved_user_regs() -> Result<SavedRegs, ()> {
        // SAFETY: both helpers take/return kernel pointers checked by the verifier; the frame
        // is read with bpf_probe_read_kernel, which tolerates any address.
        let regs = unsafe {
            let task = generated::bpf_get_current_task_btf();
            generated::bpf_task_pt_regs(task) as u64
        };
        read_saved_regs(regs)
    }
}

/// x86-64 `THREAD_SIZE` without KASAN (`PAGE_SIZE << (2 + KASAN_STACK_ORDER)`).
const THREAD_SIZE: u64 = 16 << 10;

impl Variant for Bounded {
    #[inline(always)]
    fn walk_threads(_walk: *mut ThreadWalk) {
        // The state is already in `PY_WALK`, where the step function finds it.
        let mut index = 0;
        while index < u64::from(THREAD_BUDGET) {
            if pyebpf_thread_step(index) != 0 {
                break;
            }
            index += 1;
        }
    }

    #[inline(always)]
    fn walk_frames() {
        let mut index = 0;
        while index < FRAME_BUDGET as u64 {
            if pyebpf_frame_step(index) != 0 {
                break;
            }
            index += 1;
        }
    }

    #[inline(always)]
    fn saved_user_regs() -> Result<SavedRegs, ()> {
        let offset = config().task_stack_offset;
        if offset == 0 {
            return Err(());
        }
        // SAFETY: the task pointer is only used as an address for bpf_probe_read_kernel,
        // which tolerates any address.
        let stack = unsafe {
            let task = generated::bpf_get_current_task();
            bpf_probe_read_kernel((task + u64::from(offset)) as *const u64).map_err(|_| ())?
        };
        read_saved_regs(stack + THREAD_SIZE - size_of::<pt_regs>() as u64)
    }
}

/// The registers the programs need from a saved `pt_regs`: the user frame (`ip`, `cs`, `sp`,
/// `bp`) and, for the off-CPU program, what tells a `syscall` entry (`orig_ax`, `cx`, `r11`,
/// `flags`) and the first argument (`di`). Unused fields cost nothing (the reads are inlined).
pub struct SavedRegs {
    pub ip: u64,
    pub cs: u64,
    pub sp: u64,
    pub bp: u64,
    pub orig_ax: u64,
    pub cx: u64,
    pub r11: u64,
    pub flags: u64,
    pub di: u64,
}

/// The [`SavedRegs`] of the `pt_regs` at `regs`: one read of `rbp`..`rsp` (128
/// bytes) into the per-CPU scratch buffer (the Python walk uses it later), never onto the BPF
/// stack, which the program and the walk's calls share (512 bytes; 6.1 counts each frame
/// rounded up to 32), and one branch, not one per field (each is a path the verifier follows
/// through the rest of the program).
#[inline(always)]
fn read_saved_regs(regs: u64) -> Result<SavedRegs, ()> {
    const FROM: usize = core::mem::offset_of!(pt_regs, rbp);
    const WORDS: usize = (core::mem::offset_of!(pt_regs, rsp) + 8 - FROM) / 8;
    const fn at(offset: usize) -> usize {
        (offset - FROM) / 8
    }
    const _: () = assert!(WORDS <= SCRATCH_HALF_WORDS);
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return Err(());
    };
    let w = scratch.cast::<u64>();
    // SAFETY: the scratch value holds more than WORDS words; bpf_probe_read_kernel tolerates
    // any source address (a fault is an error).
    let ret = unsafe {
        generated::bpf_probe_read_kernel(
            w.cast(),
            (WORDS * 8) as u32,
            (regs + FROM as u64) as *const c_void,
        )
    };
    if ret != 0 {
        return Err(());
    }
    // SAFETY: every index is below WORDS.
    unsafe {
        Ok(SavedRegs {
            ip: *w.add(at(core::mem::offset_of!(pt_regs, rip))),
            cs: *w.add(at(core::mem::offset_of!(pt_regs, cs))),
            sp: *w.add(at(core::mem::offset_of!(pt_regs, rsp))),
            bp: *w.add(at(FROM)),
            orig_ax: *w.add(at(core::mem::offset_of!(pt_regs, orig_rax))),
            cx: *w.add(at(core::mem::offset_of!(pt_regs, rcx))),
            r11: *w.add(at(core::mem::offset_of!(pt_regs, r11))),
            flags: *w.add(at(core::mem::offset_of!(pt_regs, eflags))),
            di: *w.add(at(core::mem::offset_of!(pt_regs, rdi))),
        })
    }
}

/// One step of the thread walk in `PY_WALK`. A global function (exported, so its BTF linkage
/// is global): the verifier checks its body once, on its own, and a call costs the caller a
/// few instructions — what `bpf_loop` gives newer kernels.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyebpf_thread_step(index: u64) -> i64 {
    let Some(walk) = PY_WALK.get_ptr_mut(0) else {
        return LOOP_STOP;
    };
    let mut ctx = walk;
    thread_step(index, (&raw mut ctx).cast())
}

/// One step of the frame walk in `PY_FRAME_WALK`, writing into `PY_FRAMES` (global, as
/// [`pyebpf_thread_step`]), for both variants: its body — a frame's reads and checks — is
/// verified once, not once per state of the caller (6.1's verifier, which prunes less, took
/// 250k instructions for the `bpf_loop` program with it inlined into the callback).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn pyebpf_frame_step(index: u64) -> i64 {
    frame_step(index)
}

/// The `bpf_loop` callback of the frame walk: one global step (whose result the verifier
/// knows only as a number: a callback must return 0 or 1 visibly).
#[inline(never)]
extern "C" fn frame_loop_step(index: u64, _ctx: *mut c_void) -> i64 {
    if pyebpf_frame_step(index) == 0 {
        0
    } else {
        LOOP_STOP
    }
}
