//! Maps, the `CONFIG` global and the counter helper shared by all programs.
//!
//! Names must equal `sampler_common::maps::*` (the `#[map]` attribute needs a literal); user
//! space looks every map up by those constants and fails with the name if one is missing.
//! Sizes here are defaults: user space resizes `EVENTS` at load time.
use aya_ebpf::{
    Global,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf, StackTrace},
};
use sampler_common::{
    COUNTERS_LEN, Config, Counter, DEFAULT_RING_BYTES, KERNEL_STACKS_ENTRIES, OffCpuRecord,
    PY_MAX_FRAMES, PY_PROCS_ENTRIES, PY_TSTATES_ENTRIES, PyFrameRecord, PyProcInfo,
    TARGET_PIDS_ENTRIES,
};

/// Samples and process events (see `sampler_common::SampleEvent` / `ProcEvent`).
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// Kernel stacks, keyed by the id stored in `SampleEvent::kernel_stack_id`.
#[map(name = "KSTACKS")]
pub static KSTACKS: StackTrace = StackTrace::with_max_entries(KERNEL_STACKS_ENTRIES, 0);

/// Processes (thread-group ids) to sample when `Config::filter_pids == 1`; value unused.
#[map(name = "TARGET_PIDS")]
pub static TARGET_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(TARGET_PIDS_ENTRIES, 0);

/// Python processes (host pid) and the offsets their walk needs; written by user space.
#[map(name = "PY_PROCS")]
pub static PY_PROCS: HashMap<u32, PyProcInfo> = HashMap::with_max_entries(PY_PROCS_ENTRIES, 0);

/// Host tid → thread-state address, filled by the walk and validated on every use.
#[map(name = "PY_TSTATES")]
pub static PY_TSTATES: LruHashMap<u32, u64> = LruHashMap::with_max_entries(PY_TSTATES_ENTRIES, 0);

/// Words of each half of the scratch buffer (the frame header in the first, the code object
/// header in the second): a power of two, so that masking a word index with
/// `SCRATCH_HALF_WORDS - 1` keeps every access inside its half (the verifier wants bounds it
/// can see), and twice the largest header read, so that a read length masked with
/// `python::READ_LEN_MASK` (at most 248) fits too.
pub const SCRATCH_HALF_WORDS: usize = 32;
/// Words of the whole scratch buffer.
pub const SCRATCH_WORDS: usize = 2 * SCRATCH_HALF_WORDS;
const _: () = assert!(
    SCRATCH_HALF_WORDS.is_power_of_two()
        && SCRATCH_HALF_WORDS * 8 >= 2 * sampler_common::PY_FRAME_HEADER_BYTES as usize
        && SCRATCH_HALF_WORDS * 8 >= sampler_common::PY_CODE_HEADER_BYTES as usize
        && SCRATCH_HALF_WORDS * 8 > 0xf8
);

/// One frame header and the header of its code object, read from the target. Per-CPU map
/// memory rather than the 512-byte BPF stack, and because variable-offset reads of map values
/// are what the verifier handles best.
#[map(name = "PY_SCRATCH")]
pub static PY_SCRATCH: PerCpuArray<[u64; SCRATCH_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// The thread-state walk's state (see `python::ThreadWalk`): per-CPU map memory, which the
/// verifier does not track, rather than the BPF stack.
#[map(name = "PY_WALK")]
pub static PY_WALK: PerCpuArray<crate::python::ThreadWalk> = PerCpuArray::with_max_entries(1, 0);

/// The frame walk's state between calls of the global step function
/// (`variant::pyebpf_frame_step`, both variants).
#[map(name = "PY_FRAME_WALK")]
pub static PY_FRAME_WALK: PerCpuArray<crate::python::FrameWalk> =
    PerCpuArray::with_max_entries(1, 0);

/// The frames of the walk, copied into the ring-buffer record at its end (a global function
/// cannot write into the record).
#[map(name = "PY_FRAMES")]
pub static PY_FRAMES: PerCpuArray<[PyFrameRecord; PY_MAX_FRAMES]> =
    PerCpuArray::with_max_entries(1, 0);

/// Target threads followed off-CPU (`--idle`): host tid → the capture of its last switch-out
/// (`off.t_out == 0`: on a CPU now). User space sizes it at load (1 entry without `--idle`),
/// seeds it for threads already asleep, and reads what is left at the end.
#[map(name = "OFFCPU")]
pub static OFFCPU: HashMap<u32, OffCpuRecord> = HashMap::with_max_entries(1, 0);

/// A zeroed `OffCpuRecord` (never written): the value a thread's `OFFCPU` entry is created
/// with (a value that large cannot live on the BPF stack).
#[map(name = "OFFCPU_ZERO")]
pub static OFFCPU_ZERO: PerCpuArray<OffCpuRecord> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU event counters indexed by `Counter`.
#[map(name = "COUNTERS")]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS_LEN, 0);

/// Written by user space before load (`EbpfLoader::override_global`). It lives in `.rodata`,
/// which aya freezes, so the verifier sees its fields as constants and prunes disabled paths.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(Config {
    filter_pids: 0,
    follow_children: 0,
    stack_bytes: 0,
    kernel_stacks: 0,
    self_pid: 0,
    fork_pid_offset: sampler_common::FORK_PID_OFFSET_DEFAULT,
    fork_flags_offset: sampler_common::FORK_FLAGS_OFFSET_DEFAULT,
    wakeup_bytes: 0,
    task_stack_offset: 0,
    offcpu: 0,
    task_pid_offset: 0,
    task_state_offset: 0,
    switch_prev_state: 0,
    pad: 0,
    offcpu_period_ns: 0,
});

/// The load-time configuration.
#[inline(always)]
pub fn config() -> Config {
    CONFIG.load()
}

/// Add one to `counter` on this CPU.
#[inline(always)]
pub fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the pointer is this CPU's slot of a per-CPU array; programs that can preempt
        // each other on one CPU (tracepoint vs. perf event) never bump the same counter.
        unsafe { *slot += 1 };
    }
}

/// Add `n` to `counter` on this CPU.
#[inline(always)]
pub fn count_n(counter: Counter, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: as in `count`.
        unsafe { *slot += n };
    }
}

/// Whether `tgid` is in `TARGET_PIDS`.
#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    TARGET_PIDS.get_ptr(tgid).is_some()
}

/// The current thread's name, NUL-padded.
///
/// The buffer is left uninitialised for the helper (it writes all 16 bytes, zeroing them itself on
/// failure): zero-initialising a `[u8; 16]` makes LLVM emit a `memset` call on this target.
#[inline(always)]
pub fn current_comm() -> [u8; 16] {
    let mut comm = core::mem::MaybeUninit::<[u8; 16]>::uninit();
    // SAFETY: the helper fills exactly 16 bytes on success and on failure.
    unsafe {
        aya_ebpf::helpers::generated::bpf_get_current_comm(comm.as_mut_ptr().cast(), 16);
        comm.assume_init()
    }
}
