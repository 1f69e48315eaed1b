//! The wire contract between pyebpf's eBPF programs and user space.
//!
//! Owns: every `#[repr(C)]` type that crosses the kernel/user boundary, map names, map sizes and
//! counter indices. Nothing here has behaviour beyond constructors and size checks.
//!
//! Rules (style guide §3): fixed-width fields, explicit padding, flags as integers (never `bool`),
//! each event starts with an [`EventHeader`] carrying its kind, addresses are opaque `u64`.
//! Every type has a compile-time size assertion; user-space round-trip tests live in `tests` below.
#![no_std]
#![allow(
    clippy::pub_underscore_fields,
    reason = "explicit padding fields are public so that struct literals can zero them; the \
              underscore says they carry nothing"
)]

/// Names of the maps in the eBPF object. User space looks maps up only through these.
pub mod maps {
    /// Ring buffer carrying [`super::SampleEvent`] (+ stack bytes) and [`super::ProcEvent`].
    pub const EVENTS: &str = "EVENTS";
    /// `BPF_MAP_TYPE_STACK_TRACE` for kernel stacks.
    pub const KERNEL_STACKS: &str = "KSTACKS";
    /// `HashMap<u32 pid, u8>`: the pids to sample when [`super::Config::filter_pids`] is set.
    pub const TARGET_PIDS: &str = "TARGET_PIDS";
    /// `PerCpuArray<u64>` indexed by [`super::Counter`].
    pub const COUNTERS: &str = "COUNTERS";
    /// `HashMap<u32 host pid, PyProcInfo>`: Python processes and the offsets their walk needs.
    pub const PY_PROCS: &str = "PY_PROCS";
    /// `LruHashMap<u32 host tid, u64 tstate address>`: thread-state cache, validated on use.
    pub const PY_TSTATES: &str = "PY_TSTATES";
    /// `HashMap<u32 host tid, OffCpuRecord>`: with `--idle`, the capture of each target
    /// thread taken at its last switch-out ([`super::OffCpuInfo::t_out`] 0: on a CPU now).
    pub const OFFCPU: &str = "OFFCPU";
    /// `PerCpuArray<[u64; 16]>` (one entry): the kernel walk's frame-header scratch buffer.
    /// Kernel-internal; user space never touches it.
    pub const PY_SCRATCH: &str = "PY_SCRATCH";
    /// `PerCpuArray` (one entry): the kernel walk's thread-list walk state. Kernel-internal.
    pub const PY_WALK: &str = "PY_WALK";
    /// Name of the `Config` global set at load time.
    pub const CONFIG: &str = "CONFIG";
}

/// Program names in the eBPF object.
pub mod programs {
    /// `perf_event` program attached to the CPU clock on every CPU (kernel ≥ 5.17: `bpf_loop`).
    pub const SAMPLE: &str = "pyebpf_sample";
    /// The same program for kernels without `bpf_loop` (bounded loops); user space loads one
    /// of the two.
    pub const SAMPLE_BOUNDED: &str = "pyebpf_sample_bounded";
    /// `sched_process_exec` raw tracepoint. (Raw tracepoints, not perf-event ones: closing a
    /// perf-event tracepoint waits for RCU grace periods, 80–100 ms each at the end of a run.)
    pub const EXEC: &str = "pyebpf_exec";
    /// `sched_process_exit` raw tracepoint.
    pub const EXIT: &str = "pyebpf_exit";
    /// `task_newtask` raw tracepoint: follows children of target pids (the child's pid read
    /// at `Config::task_pid_offset`). (Not `sched_process_fork`: that also fires for new
    /// threads and cannot tell them apart; `task_newtask` carries `clone_flags`.)
    pub const FORK: &str = "pyebpf_fork";
    /// The same on the `task/task_newtask` perf-event tracepoint, for kernels without BTF (the
    /// child's pid from the record at `Config::fork_pid_offset`).
    pub const FORK_TRACEPOINT: &str = "pyebpf_fork_tracepoint";
    /// `sched_switch` BTF tracepoint (`--idle`): off-CPU captures, kernel ≥ 5.17 (`bpf_loop`).
    pub const SWITCH: &str = "pyebpf_switch";
    /// The same for kernels without `bpf_loop` (bounded loops).
    pub const SWITCH_BOUNDED: &str = "pyebpf_switch_bounded";
    /// `sched_wakeup` BTF tracepoint (`--idle`): when an off-CPU target thread became runnable.
    pub const WAKEUP: &str = "pyebpf_wakeup";
}

/// Number of entries in the kernel stack-trace map.
pub const KERNEL_STACKS_ENTRIES: u32 = 16 * 1024;
/// Maximum kernel stack depth (the kernel's `PERF_MAX_STACK_DEPTH` is 127).
pub const KERNEL_STACK_DEPTH: usize = 127;
/// Maximum number of pids in [`maps::TARGET_PIDS`].
pub const TARGET_PIDS_ENTRIES: u32 = 4096;
/// Entries of [`maps::OFFCPU`] with `--idle` (1 otherwise): target threads followed off-CPU at
/// once. Preallocated: about 12.4 KiB each (a Python capture of 256 48-byte frames; 50 MiB of
/// kernel memory in all).
pub const OFFCPU_ENTRIES: u32 = 4096;
/// Default ring buffer size in bytes (power of two multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 16 << 20;

/// Page size used for the page-wise user-stack copy.
pub const STACK_PAGE: usize = 4096;
/// Supported user-stack copy sizes. The eBPF program has one constant-size reservation per
/// class (the verifier needs constant sizes), so the CLI rounds up to one of these.
pub const STACK_SIZE_CLASSES: [u32; 4] = [8 << 10, 16 << 10, 32 << 10, 64 << 10];
/// Default user-stack copy size (32 KiB).
pub const DEFAULT_STACK_BYTES: u32 = 32 << 10;

/// Offset of `pid` in the `task_newtask` record (`common_*` 8 bytes, then `pid`), unchanged
/// since the tracepoint appeared in 3.14. Used only when its `format` file cannot be read.
pub const FORK_PID_OFFSET_DEFAULT: u32 = 8;
/// Offset of `clone_flags` in the `task_newtask` record (after `pid` and `comm[16]`).
pub const FORK_FLAGS_OFFSET_DEFAULT: u32 = 32;
/// Largest accepted tracepoint field offset (records are far smaller; this bounds a bad parse).
pub const TRACEPOINT_OFFSET_MAX: u32 = 256;
/// `CLONE_THREAD` from `<linux/sched.h>`: the new task is a thread of its parent's process.
pub const CLONE_THREAD: u64 = 0x0001_0000;

/// Configuration written into the eBPF object's `CONFIG` global before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// 1: sample only pids in `TARGET_PIDS`; 0: every process but the idle task.
    pub filter_pids: u32,
    /// 1: the fork program (`task_newtask`) adds children of target pids to `TARGET_PIDS`.
    pub follow_children: u32,
    /// 0: no user stack copy; otherwise one of [`STACK_SIZE_CLASSES`].
    pub stack_bytes: u32,
    /// 1: collect kernel stack ids.
    pub kernel_stacks: u32,
    /// pid of the profiler itself (never sampled), 0 for none.
    pub self_pid: u32,
    /// Byte offset of `pid` (the new task) in the `task_newtask` tracepoint record, read by user
    /// space from the event's `format` file (see [`FORK_PID_OFFSET_DEFAULT`]).
    pub fork_pid_offset: u32,
    /// Byte offset of the 8-byte `clone_flags` in the `task_newtask` record.
    pub fork_flags_offset: u32,
    /// Samples are submitted without waking user space (`BPF_RB_NO_WAKEUP`) until this many
    /// bytes wait in `EVENTS` (then `BPF_RB_FORCE_WAKEUP`): user space wakes per batch, and
    /// drains at least every flush interval on its own. 0: the kernel's default (a wake-up for
    /// each record that finds user space caught up).
    pub wakeup_bytes: u32,
    /// Byte offset of `stack` in the kernel's `task_struct` (from its BTF), for the
    /// `pyebpf_sample_bounded` variant; 0 when unknown.
    pub task_stack_offset: u32,
    /// 1: `--idle` (the `sched_switch`/`sched_wakeup` programs record off-CPU intervals).
    pub offcpu: u32,
    /// Byte offset of `pid` (the thread id) in `task_struct`, from the kernel's BTF.
    pub task_pid_offset: u32,
    /// Byte offset of the task's state word in `task_struct` (`__state`, Linux 5.14+; `state`
    /// before), from the kernel's BTF.
    pub task_state_offset: u32,
    /// 1: the `sched_switch` tracepoint passes `prev_state` as its fourth argument (Linux
    /// 5.18+; read from the state word otherwise).
    pub switch_prev_state: u32,
    /// Explicit padding.
    pub pad: u32,
    /// Off-CPU sampling period in ns (`1e9 / rate`): an off-CPU interval weighs as many samples
    /// as multiples of it fall inside (see [`OffCpuInfo`]).
    pub offcpu_period_ns: u64,
}
const _: () = assert!(core::mem::size_of::<Config>() == 64);

/// Maximum Python frames captured per sample; deeper stacks are marked truncated.
pub const PY_MAX_FRAMES: usize = 256;
/// Maximum Python processes in `PY_PROCS`.
pub const PY_PROCS_ENTRIES: u32 = 4096;
/// Entries of the `PY_TSTATES` cache.
pub const PY_TSTATES_ENTRIES: u32 = 65536;
/// Steps of the thread-state walk on a `PY_TSTATES` miss: thread states visited plus hops to
/// the next interpreter.
pub const PY_MAX_THREADS_WALKED: u32 = 256;
/// Offset value meaning "this field does not exist in this build".
pub const PY_NO_OFFSET: u32 = u32::MAX;
/// Most bytes of a frame the kernel reads in one piece ([`PyProcInfo::frame_read_bytes`]: 112
/// for a 3.8/3.9 `PyFrameObject` up to `f_lasti`, 72–80 for a `_PyInterpreterFrame`). Frame
/// field offsets must lie inside the bytes read ([`PyProcInfo::frame_offsets_fit`]).
pub const PY_FRAME_HEADER_BYTES: u32 = 128;
/// Most bytes of a code object the kernel reads in one piece to check a frame
/// ([`PyProcInfo::code_read_bytes`]: up to `co_qualname`, 136 bytes in default builds and 152
/// in free-threaded ones). Code field offsets must lie inside the bytes read.
pub const PY_CODE_HEADER_BYTES: u32 = 192;

/// What the in-kernel Python walk needs for one process; derived by user space from the
/// process's `RuntimeLayout` (its `_Py_DebugOffsets`) and written to `PY_PROCS`.
/// All offsets are in bytes; [`PY_NO_OFFSET`] marks an absent field. The walk visits every
/// interpreter (`interpreters.head` → `next`…, newest first) and every thread state of each.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcInfo {
    /// Address of `_PyRuntime` in the target.
    pub runtime_addr: u64,
    /// Address of `PyCode_Type` in the target: a frame whose code object has another type is
    /// invalid (the walk stops there). 0 when unknown (then the type is not checked).
    pub code_type: u64,
    /// Device of the target's pid namespace (for `bpf_get_ns_current_pid_tgid`); 0 when the
    /// target shares the initial pid namespace (compare host tids directly).
    pub pidns_dev: u64,
    /// Inode of the target's pid namespace; 0 as above.
    pub pidns_ino: u64,
    /// `_PyRuntimeState.interpreters.head` (the newest interpreter).
    pub interpreters_head: u32,
    /// `PyInterpreterState.next` (the next older interpreter; NULL after the main one).
    pub interp_next: u32,
    /// `PyInterpreterState.threads.head`.
    pub threads_head: u32,
    /// `PyInterpreterState.ceval.gil`: pointer to the `_gil_runtime_state` the interpreter
    /// uses (its own `_gil`, or the main interpreter's when it shares that one); NULL → use
    /// the embedded one at [`PyProcInfo::interp_gil_struct`].
    pub interp_ceval_gil: u32,
    /// `PyInterpreterState._gil`: the embedded `_gil_runtime_state`.
    pub interp_gil_struct: u32,
    /// ≤ 3.11: `_PyRuntimeState.ceval.gil`, the one GIL of the process (then
    /// `interp_ceval_gil` and `interp_gil_struct` are `PY_NO_OFFSET`); else `PY_NO_OFFSET`.
    pub runtime_gil: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.interp`: the interpreter the thread state belongs to.
    pub tstate_interp: u32,
    /// `PyThreadState.native_thread_id` (3.11+), matched against the sampled thread's id in
    /// the target's pid namespace; `PY_NO_OFFSET` before 3.11 (then `tstate_pthread_id`).
    pub tstate_native_thread_id: u32,
    /// `PyThreadState.thread_id` (`pthread_t`), matched against the sampled task's
    /// `thread.fsbase` (the thread pointer, which is the `pthread_t` of glibc and musl on
    /// x86-64) when `tstate_native_thread_id` is `PY_NO_OFFSET`.
    pub tstate_pthread_id: u32,
    /// Offset of `thread.fsbase` in the kernel's `task_struct` (from its BTF), for the
    /// `pthread_t` match; `PY_NO_OFFSET` when unknown.
    pub task_fsbase: u32,
    /// 3.13+: `PyThreadState.current_frame`; 3.11, 3.12: `PyThreadState.cframe`; ≤ 3.10:
    /// `PyThreadState.frame`.
    pub tstate_current_frame: u32,
    /// 3.11, 3.12: `_PyCFrame.current_frame` (read through the `cframe` pointer); else
    /// `PY_NO_OFFSET`.
    pub cframe_current_frame: u32,
    /// `_PyInterpreterFrame.previous` (≤ 3.10: `PyFrameObject.f_back`).
    pub frame_previous: u32,
    /// `_PyInterpreterFrame.f_executable` (≤ 3.12: `f_code`).
    pub frame_executable: u32,
    /// `_PyInterpreterFrame.instr_ptr` (3.11, 3.12: `prev_instr`; ≤ 3.10: the word that starts
    /// with `int f_lasti`).
    pub frame_instr_ptr: u32,
    /// `_PyInterpreterFrame.owner` (one byte, 3.11+); else `PY_NO_OFFSET` (recorded as 0).
    pub frame_owner: u32,
    /// `_PyInterpreterFrame.is_entry` (one byte, 3.11); else `PY_NO_OFFSET` (recorded as 0).
    pub frame_is_entry: u32,
    /// Bytes read per frame: every frame field lies inside them; at most
    /// [`PY_FRAME_HEADER_BYTES`].
    pub frame_read_bytes: u32,
    /// `_PyInterpreterFrame.tlbc_index` (i32, 3.14t); else `PY_NO_OFFSET`.
    pub frame_tlbc_index: u32,
    /// `_gil_runtime_state.locked` (int), relative to the GIL struct; `PY_NO_OFFSET` if unknown.
    pub gil_locked: u32,
    /// `_gil_runtime_state.last_holder` (pointer), relative to the GIL struct.
    pub gil_holder: u32,
    /// `_gil_runtime_state.enabled` (int, free-threaded builds), relative to the GIL struct;
    /// else `PY_NO_OFFSET`.
    pub gil_enabled: u32,
    /// Bytes of the `_gil_runtime_state` struct (its mutexes and condition variables
    /// included): a thread blocked in `futex` on an address inside it waits for the GIL. 0
    /// when unknown.
    pub gil_size: u32,
    /// `_PyStackRef` tag bits of `f_executable` (3.14+: 3), masked off before it is read as a
    /// code object pointer; 0 before.
    pub executable_tag_mask: u32,
    /// `PyObject.ob_type`, in the code object (8; 24 in free-threaded builds).
    pub code_ob_type: u32,
    /// `PyCodeObject.co_qualname` (3.11+), else `co_name`: recorded per frame.
    pub code_name: u32,
    /// `PyCodeObject.co_filename`: recorded per frame.
    pub code_filename: u32,
    /// `PyCodeObject.co_firstlineno` (int): its low 16 bits are recorded per frame.
    pub code_firstlineno: u32,
    /// Bytes of the code object read per frame: every code field lies inside them; at most
    /// [`PY_CODE_HEADER_BYTES`].
    pub code_read_bytes: u32,
    /// The largest valid `owner` (3.11: 2, 3.12/3.13/3.15: 3, 3.14: 4); a frame with a larger
    /// one is invalid. `PY_NO_OFFSET` when frames have no owner (≤ 3.10).
    pub owner_max: u32,
    /// Frames with `owner >= shim_owner` are entry (shim) frames: no Python code, no code
    /// object to check. `PY_NO_OFFSET` when there are none (≤ 3.11).
    pub shim_owner: u32,
    /// `_PyInterpreterFrame.f_globals` (≤ 3.10: `PyFrameObject.f_globals`); `PY_NO_OFFSET`
    /// when unknown.
    pub frame_globals: u32,
    /// `_PyInterpreterFrame.f_locals`; `PY_NO_OFFSET` when unknown.
    pub frame_locals: u32,
}
// 4 words and 34 ints: no implicit padding.
const _: () = assert!(core::mem::size_of::<PyProcInfo>() == 4 * 8 + 34 * 4);

impl PyProcInfo {
    /// Whether the frame offsets fit the kernel's one-read frame header: `frame_read_bytes` a
    /// multiple of 8 in `8..=PY_FRAME_HEADER_BYTES`, the 8-byte fields (`previous`,
    /// `executable`, `instr_ptr`) 8-aligned inside it, `owner` and `is_entry` absent or inside
    /// it, `tlbc_index` absent or 4-aligned inside it. The kernel refuses (and counts,
    /// `Counter::PyBadProcInfo`) an entry that does not.
    #[must_use]
    pub const fn frame_offsets_fit(&self) -> bool {
        const fn word(off: u32, size: u32, n: u32) -> bool {
            off.is_multiple_of(size) && off <= n - size
        }
        const fn byte(off: u32, n: u32) -> bool {
            off == PY_NO_OFFSET || off < n
        }
        let n = self.frame_read_bytes;
        if n < 8 || n > PY_FRAME_HEADER_BYTES || !n.is_multiple_of(8) {
            return false;
        }
        word(self.frame_previous, 8, n)
            && word(self.frame_executable, 8, n)
            && word(self.frame_instr_ptr, 8, n)
            && byte(self.frame_owner, n)
            && byte(self.frame_is_entry, n)
            && (self.frame_tlbc_index == PY_NO_OFFSET || word(self.frame_tlbc_index, 4, n))
            && (self.frame_globals == PY_NO_OFFSET || word(self.frame_globals, 8, n))
            && (self.frame_locals == PY_NO_OFFSET || word(self.frame_locals, 8, n))
            && self.code_fields_fit()
    }

    /// Whether the code fields fit the kernel's one-read code header: `code_read_bytes` a
    /// multiple of 8 in `8..=PY_CODE_HEADER_BYTES`, the pointers (`ob_type`, name, file name)
    /// 8-aligned inside it, `co_firstlineno` 4-aligned inside it.
    #[must_use]
    pub const fn code_fields_fit(&self) -> bool {
        const fn word(off: u32, size: u32, n: u32) -> bool {
            off.is_multiple_of(size) && off <= n - size
        }
        let n = self.code_read_bytes;
        if n < 8 || n > PY_CODE_HEADER_BYTES || !n.is_multiple_of(8) {
            return false;
        }
        word(self.code_ob_type, 8, n)
            && word(self.code_name, 8, n)
            && word(self.code_filename, 8, n)
            && word(self.code_firstlineno, 4, n)
    }
}

/// One Python frame as captured in the kernel: raw values, decoded by user space. The kernel
/// has checked the frame (see [`py_flags::INVALID_FRAME`]); the code object's name, file name
/// and first line as they were at the sample identify it later, when user space reads it (a
/// code object can be freed, and its address reused, before then: a module body once its
/// import finished, code run by `exec`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrameRecord {
    /// Raw `f_executable` bits (a tagged `_PyStackRef` on 3.14+; user space masks).
    pub executable: u64,
    /// Raw `instr_ptr` (3.12: `prev_instr`).
    pub instr_ptr: u64,
    /// The code object's `co_qualname` (≤ 3.10: `co_name`) pointer at the sample; 0 for an
    /// entry frame.
    pub name: u64,
    /// The code object's `co_filename` pointer at the sample; 0 for an entry frame.
    pub filename: u64,
    /// `f_globals` when it is also the frame's `f_locals` (module-level code: a module body,
    /// code run by `exec` in one namespace), else 0: names such a frame by its module when its
    /// code object and names were freed before user space read them.
    pub globals: u64,
    /// `tlbc_index` (3.14t), else 0.
    pub tlbc_index: i32,
    /// `owner` byte (0 where frames have none).
    pub owner: u8,
    /// `is_entry` byte (3.11; 0 elsewhere).
    pub is_entry: u8,
    /// The low 16 bits of the code object's `co_firstlineno` at the sample (0 for an entry
    /// frame).
    pub first_line: u16,
}
const _: () = assert!(core::mem::size_of::<PyFrameRecord>() == 48);

/// Flags of a [`PyCapture`].
pub mod py_flags {
    /// A thread state was found and its frame chain walked: to its end (`previous == NULL`),
    /// to the frame budget (then also [`TRUNCATED`]) or to a failed read (then also
    /// [`READ_ERROR`]; the frames before it are valid).
    pub const CAPTURED: u32 = 1 << 0;
    /// More than `PY_MAX_FRAMES` frames: the outermost ones are missing.
    pub const TRUNCATED: u32 = 1 << 1;
    /// The sampled thread has no thread state in any interpreter of the process (not a Python
    /// thread), or the walk of the thread lists took more than `PY_MAX_THREADS_WALKED` steps.
    pub const NO_TSTATE: u32 = 1 << 2;
    /// A read of target memory failed (the frames before it are kept), or the `PY_PROCS`
    /// entry was unusable (bad frame offsets, wrong pid namespace); see the `Py*` counters.
    pub const READ_ERROR: u32 = 1 << 3;
    /// The thread state came from the `PY_TSTATES` cache.
    pub const CACHE_HIT: u32 = 1 << 4;
    /// The walk stopped at an invalid frame (the frames before it are valid): its code object
    /// was unreadable, misaligned or not of type `PyCode_Type`, its `owner` out of range, or
    /// its `previous` pointed at itself. A frame being pushed at the sample instant (3.11/3.12
    /// link a new activation's first frame into the chain in two stores) shows this way.
    pub const INVALID_FRAME: u32 = 1 << 5;
    /// With [`INVALID_FRAME`]: the frame it stopped at had a code object pointer that could
    /// not be read. A garbage pointer and a page that was not present at the sample instant
    /// (swapped out, being migrated by compaction, being collapsed into a huge page) look the
    /// same to `bpf_probe_read_user`, which cannot fault a page in; the flag tells either from
    /// a frame whose readable header failed the checks.
    pub const CODE_UNREADABLE: u32 = 1 << 6;
}

/// The Python part of a sample of a known Python process. Follows the stack bytes in the
/// record when `SampleEvent::py_cap != 0` (at byte `size_of::<SampleEvent>() + stack_cap`,
/// 8-aligned because every stack class is), and then `py_cap == size_of::<PyCapture>()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyCapture {
    /// Thread state address (0 if none).
    pub tstate: u64,
    /// `last_holder` of the GIL of the thread state's interpreter, read at the sample (0 if
    /// unknown).
    pub gil_holder: u64,
    /// `locked` of that GIL, read at the sample (-1 if unknown).
    pub gil_locked: i32,
    /// Free-threaded GIL `enabled` (-1 if not applicable).
    pub gil_enabled: i32,
    /// Frames captured (innermost first), at most `PY_MAX_FRAMES`.
    pub nframes: u32,
    /// [`py_flags`].
    pub flags: u32,
    /// The frames; only the first `nframes` are valid.
    pub frames: [PyFrameRecord; PY_MAX_FRAMES],
}
const _: () = assert!(core::mem::size_of::<PyCapture>() == 32 + 48 * PY_MAX_FRAMES);

/// Kinds of events in the `EVENTS` ring buffer.
pub mod event_kind {
    /// [`super::SampleEvent`], followed by its stack bytes when `stack_cap > 0`.
    pub const SAMPLE: u32 = 1;
    /// [`super::ProcEvent`]: a process called `execve`.
    pub const EXEC: u32 = 2;
    /// [`super::ProcEvent`]: a thread-group leader exited.
    pub const EXIT: u32 = 3;
    /// [`super::ProcEvent`]: a target process forked a child that is now a target too.
    pub const FORK: u32 = 4;
    /// An off-CPU interval of a target thread (`--idle`): a [`super::SampleEvent`] taken at
    /// its switch-out, then an [`super::OffCpuInfo`], then the stack bytes and the Python
    /// capture as in a sample (`super::OffCpuRecord`).
    pub const OFFCPU: u32 = 5;
}

/// Flags of an [`OffCpuInfo`].
pub mod offcpu_flags {
    /// The switch-out was involuntary (`sched_switch`'s `preempt`): the thread stayed
    /// runnable.
    pub const PREEMPT: u32 = 1 << 0;
    /// The thread was blocked in `futex` on an address inside its interpreter's GIL struct:
    /// waiting for the GIL (or, having dropped it on request, for the next holder to take it).
    pub const GIL_WAIT: u32 = 1 << 1;
    /// Written by user space for a thread already off-CPU when it was first seen (its Python
    /// capture is empty: user space read the stack itself).
    pub const SEEDED: u32 = 1 << 2;
    /// `syscall` holds the system call the thread was in at its switch-out.
    pub const IN_SYSCALL: u32 = 1 << 3;
}

/// An off-CPU interval: from the switch-out (`t_out`) to the switch-in (`t_in`), with the
/// wake-up in between when there was one. Times are `bpf_ktime_get_ns()`.
///
/// Weight: the interval stands for the number of multiples of `Config::offcpu_period_ns`
/// in `(t_out, t_in]` (`t_in / P - t_out / P`): over many intervals that is the off-CPU time
/// times the rate, and an interval without one is never sent. `(t_out, t_wake]` is spent in
/// the state of the switch-out, `(t_wake, t_in]` runnable (woken, waiting for a CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuInfo {
    /// Switch-out time; 0 in `OFFCPU` while the thread is on a CPU.
    pub t_out: u64,
    /// `sched_wakeup` time (0: none: preempted, yielded, or not woken yet).
    pub t_wake: u64,
    /// Switch-in time (0 while off-CPU; user space sets the end of the run for a flush).
    pub t_in: u64,
    /// The system call number (`orig_ax`) when [`offcpu_flags::IN_SYSCALL`]; else 0.
    pub syscall: u64,
    /// The task's state word at the switch-out (`TASK_INTERRUPTIBLE` 1,
    /// `TASK_UNINTERRUPTIBLE` 2, …; 0 when runnable).
    pub task_state: u32,
    /// [`offcpu_flags`].
    pub flags: u32,
}
const _: () = assert!(core::mem::size_of::<OffCpuInfo>() == 40);

/// One `OFFCPU` map value, and the ring-buffer record sent at the switch-in (kind
/// [`event_kind::OFFCPU`]; no stack copy: `event.stack_cap == 0`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OffCpuRecord {
    /// The switch-out as a sample (time, pid, tid, CPU, comm, kernel stack id, registers).
    pub event: SampleEvent,
    /// The interval.
    pub off: OffCpuInfo,
    /// The Python capture at the switch-out (`event.py_cap` says whether it is valid).
    pub py: PyCapture,
}
const _: () = assert!(
    core::mem::size_of::<OffCpuRecord>()
        == core::mem::size_of::<SampleEvent>()
            + core::mem::size_of::<OffCpuInfo>()
            + core::mem::size_of::<PyCapture>()
);

/// First field of every event in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// One of [`event_kind`].
    pub kind: u32,
    /// Flags, per kind ([`sample_flags`] for samples).
    pub flags: u32,
}
const _: () = assert!(core::mem::size_of::<EventHeader>() == 8);

/// Flags of a [`SampleEvent`].
pub mod sample_flags {
    /// The sample interrupted user mode; registers came from the perf context.
    pub const USER_MODE: u32 = 1 << 0;
    /// The sample interrupted kernel mode; user registers came from the task's `pt_regs`.
    pub const REGS_FROM_TASK: u32 = 1 << 1;
    /// No user registers could be read (kernel thread, or `pt_regs` unavailable).
    pub const NO_USER_REGS: u32 = 1 << 2;
    /// The user-stack copy stopped early at a fault (normal: the stack's top page was reached).
    pub const STACK_SHORT: u32 = 1 << 3;
    /// The task is a kernel thread (no user address space).
    pub const KERNEL_THREAD: u32 = 1 << 4;
}

/// User-mode registers needed to start an unwind (x86-64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    /// Instruction pointer (`rip`).
    pub ip: u64,
    /// Stack pointer (`rsp`).
    pub sp: u64,
    /// Frame pointer (`rbp`).
    pub bp: u64,
}
const _: () = assert!(core::mem::size_of::<UserRegs>() == 24);

/// One CPU-clock sample. When `stack_cap > 0` it is immediately followed, in the same ring
/// buffer record, by `stack_cap` bytes of which the first `stack_len` hold the user stack from
/// address `stack_base` upward.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleEvent {
    /// `kind == event_kind::SAMPLE`.
    pub header: EventHeader,
    /// `bpf_ktime_get_ns()` at the sample.
    pub time_ns: u64,
    /// Thread-group id (the process id, as the host sees it).
    pub pid: u32,
    /// Thread id (host view).
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Kernel stack id in `KSTACKS`, or a negative errno (`-14` for user-mode samples).
    pub kernel_stack_id: i32,
    /// User registers at the sample (see [`sample_flags`] for their origin).
    pub regs: UserRegs,
    /// User address of the first copied stack byte (page-aligned start of the page holding `sp`).
    pub stack_base: u64,
    /// Number of valid bytes of the copy.
    pub stack_len: u32,
    /// Number of stack bytes that follow this struct in the record (0, or a size class).
    pub stack_cap: u32,
    /// `bpf_get_current_comm()` (thread name, NUL-padded).
    pub comm: [u8; 16],
    /// Size of the [`PyCapture`] that follows the stack bytes (0: not a known Python process).
    pub py_cap: u32,
    /// Explicit padding.
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<SampleEvent>() == 96);

/// A process life-cycle event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    /// `kind` is `EXEC`, `EXIT` or `FORK`.
    pub header: EventHeader,
    /// `bpf_ktime_get_ns()`.
    pub time_ns: u64,
    /// The process (for `FORK`: the child).
    pub pid: u32,
    /// For `FORK`: the parent process; otherwise 0.
    pub parent_pid: u32,
    /// `comm` at the event.
    pub comm: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<ProcEvent>() == 40);

/// Per-CPU counters in `COUNTERS`. Values are indices.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// perf-event program runs (all samples, before filtering).
    Runs = 0,
    /// Samples of the idle task, dropped in the kernel.
    Idle = 1,
    /// Samples of pids outside the `-p` filter, dropped in the kernel.
    Filtered = 2,
    /// Samples sent to user space.
    Sent = 3,
    /// Samples lost: the ring buffer had no room.
    LostSamples = 4,
    /// Process events lost: the ring buffer had no room.
    LostProcEvents = 5,
    /// Kernel-mode samples whose task `pt_regs` could not be read.
    NoUserRegs = 6,
    /// `get_stackid` failed with something other than `-EFAULT` (user-mode sample) or
    /// `-EEXIST` (a collision, [`Counter::KernelStackCollisions`]).
    KernelStackErrors = 7,
    /// User-stack copies whose first page faulted (nothing copied).
    StackCopyEmpty = 8,
    /// Samples of the profiler itself, dropped in the kernel.
    SelfSamples = 9,
    /// Children of target processes that could not be added to `TARGET_PIDS` (map full).
    FollowFailed = 10,
    /// Process-event programs that could not read their tracepoint record (or found an
    /// implausible offset in `Config`).
    ProcEventErrors = 11,
    /// Samples of processes in `PY_PROCS` (each carries a [`PyCapture`]).
    PySamples = 12,
    /// Python-process samples whose thread has no thread state (`py_flags::NO_TSTATE`).
    PyNoTstate = 13,
    /// Python-process samples with a failed read of target memory (`py_flags::READ_ERROR`).
    PyReadErrors = 14,
    /// Python-process samples with more than `PY_MAX_FRAMES` frames (`py_flags::TRUNCATED`).
    PyTruncated = 15,
    /// Thread-list walks: `PY_TSTATES` had no valid entry for the sampled thread.
    PyTstateWalks = 16,
    /// Thread-list walks that gave up after `PY_MAX_THREADS_WALKED` steps (thread states
    /// visited plus interpreter hops).
    PyThreadBudget = 17,
    /// `PY_PROCS` entries the walk cannot use ([`PyProcInfo::frame_offsets_fit`] is false).
    PyBadProcInfo = 18,
    /// `bpf_get_ns_current_pid_tgid` failed for the entry's pid namespace.
    PyPidNsErrors = 19,
    /// Switch-outs of target Python threads captured (`--idle`).
    OffCpuSwitches = 20,
    /// Off-CPU intervals sent (each weighs at least one sample).
    OffCpuSent = 21,
    /// Off-CPU intervals too short to hold a sampling instant (nothing sent: not an error).
    OffCpuShort = 22,
    /// Off-CPU intervals lost: the ring buffer had no room (their weight is added to
    /// `LostSamples`).
    OffCpuLost = 23,
    /// Target threads not followed off-CPU: `OFFCPU` was full.
    OffCpuMapFull = 24,
    /// Kernel stacks not kept: `get_stackid` found their hash bucket in `KSTACKS` taken by
    /// another stack (`-EEXIST`; replacing it would give earlier samples that name the bucket
    /// the wrong stack). The sample is kept without its kernel frames.
    KernelStackCollisions = 25,
    /// Python-process samples whose walk stopped at an invalid frame
    /// (`py_flags::INVALID_FRAME`).
    PyInvalidFrames = 26,
    /// Of [`Counter::PyInvalidFrames`]: samples whose invalid frame's code object could not be
    /// read (`py_flags::CODE_UNREADABLE`).
    PyCodeUnreadable = 27,
}

/// Number of counters (length of the `COUNTERS` array).
pub const COUNTERS_LEN: u32 = 28;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; COUNTERS_LEN as usize] = [
        Counter::Runs,
        Counter::Idle,
        Counter::Filtered,
        Counter::Sent,
        Counter::LostSamples,
        Counter::LostProcEvents,
        Counter::NoUserRegs,
        Counter::KernelStackErrors,
        Counter::StackCopyEmpty,
        Counter::SelfSamples,
        Counter::FollowFailed,
        Counter::ProcEventErrors,
        Counter::PySamples,
        Counter::PyNoTstate,
        Counter::PyReadErrors,
        Counter::PyTruncated,
        Counter::PyTstateWalks,
        Counter::PyThreadBudget,
        Counter::PyBadProcInfo,
        Counter::PyPidNsErrors,
        Counter::OffCpuSwitches,
        Counter::OffCpuSent,
        Counter::OffCpuShort,
        Counter::OffCpuLost,
        Counter::OffCpuMapFull,
        Counter::KernelStackCollisions,
        Counter::PyInvalidFrames,
        Counter::PyCodeUnreadable,
    ];

    /// Short, stable name for summaries.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Runs => "runs",
            Counter::Idle => "idle",
            Counter::Filtered => "filtered",
            Counter::Sent => "sent",
            Counter::LostSamples => "lost_samples",
            Counter::LostProcEvents => "lost_proc_events",
            Counter::NoUserRegs => "no_user_regs",
            Counter::KernelStackErrors => "kernel_stack_errors",
            Counter::StackCopyEmpty => "stack_copy_empty",
            Counter::SelfSamples => "self_samples",
            Counter::FollowFailed => "follow_failed",
            Counter::ProcEventErrors => "proc_event_errors",
            Counter::PySamples => "py_samples",
            Counter::PyNoTstate => "py_no_tstate",
            Counter::PyReadErrors => "py_read_errors",
            Counter::PyTruncated => "py_truncated",
            Counter::PyTstateWalks => "py_tstate_walks",
            Counter::PyThreadBudget => "py_thread_budget",
            Counter::PyBadProcInfo => "py_bad_proc_info",
            Counter::PyPidNsErrors => "py_pidns_errors",
            Counter::OffCpuSwitches => "offcpu_switches",
            Counter::OffCpuSent => "offcpu_sent",
            Counter::OffCpuShort => "offcpu_short",
            Counter::OffCpuLost => "offcpu_lost",
            Counter::OffCpuMapFull => "offcpu_map_full",
            Counter::KernelStackCollisions => "kernel_stack_collisions",
            Counter::PyInvalidFrames => "py_invalid_frames",
            Counter::PyCodeUnreadable => "py_code_unreadable",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are `#[repr(C)]`, `Copy`, contain only integers and byte arrays, and have no
    // implicit padding (checked by the size assertions above).
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::UserRegs {}
    unsafe impl aya::Pod for super::SampleEvent {}
    unsafe impl aya::Pod for super::ProcEvent {}
    unsafe impl aya::Pod for super::PyProcInfo {}
    unsafe impl aya::Pod for super::PyFrameRecord {}
    unsafe impl aya::Pod for super::PyCapture {}
    unsafe impl aya::Pod for super::OffCpuInfo {}
    unsafe impl aya::Pod for super::OffCpuRecord {}
}

/// Decode a `T` from the start of `bytes` (user side). `None` if too short.
///
/// The ring buffer gives byte slices with no alignment guarantee for our types, so this copies
/// with an unaligned read.
#[cfg(feature = "user")]
pub fn decode<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < core::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; `T: Pod` is valid for any bit pattern.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// View a `T` as its bytes (user side, tests and map writes).
#[cfg(feature = "user")]
pub fn encode<T: aya::Pod>(value: &T) -> &[u8] {
    // SAFETY: `T: Pod` has no padding and is valid to read as bytes.
    unsafe {
        core::slice::from_raw_parts(
            core::ptr::from_ref(value).cast::<u8>(),
            core::mem::size_of::<T>(),
        )
    }
}

#[cfg(all(test, feature = "user"))]
mod tests {
    use super::*;

    #[test]
    fn sample_event_round_trips() {
        let ev = SampleEvent {
            header: EventHeader {
                kind: event_kind::SAMPLE,
                flags: sample_flags::USER_MODE,
            },
            time_ns: 123,
            pid: 4,
            tid: 5,
            cpu: 1,
            kernel_stack_id: -14,
            regs: UserRegs {
                ip: 0xdead,
                sp: 0x7ff0,
                bp: 0,
            },
            stack_base: 0x7000,
            stack_len: 4096,
            stack_cap: 32768,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
            py_cap: 0,
            _pad: 0,
        };
        let bytes = encode(&ev);
        assert_eq!(bytes.len(), 96);
        assert_eq!(decode::<SampleEvent>(bytes), Some(ev));
        assert_eq!(decode::<SampleEvent>(&bytes[..95]), None);
    }

    #[test]
    fn proc_event_round_trips() {
        let ev = ProcEvent {
            header: EventHeader {
                kind: event_kind::FORK,
                flags: 0,
            },
            time_ns: 9,
            pid: 10,
            parent_pid: 11,
            comm: [b'x'; 16],
        };
        assert_eq!(decode::<ProcEvent>(encode(&ev)), Some(ev));
    }

    #[test]
    fn header_is_first() {
        let ev = ProcEvent {
            header: EventHeader {
                kind: event_kind::EXIT,
                flags: 7,
            },
            ..Default::default()
        };
        let h = decode::<EventHeader>(encode(&ev)).unwrap();
        assert_eq!(h.kind, event_kind::EXIT);
        assert_eq!(h.flags, 7);
    }

    #[test]
    fn config_round_trips() {
        let cfg = Config {
            filter_pids: 1,
            follow_children: 1,
            stack_bytes: DEFAULT_STACK_BYTES,
            kernel_stacks: 1,
            self_pid: 77,
            fork_pid_offset: FORK_PID_OFFSET_DEFAULT,
            fork_flags_offset: FORK_FLAGS_OFFSET_DEFAULT,
            wakeup_bytes: 1 << 20,
            task_stack_offset: 40,
            offcpu: 1,
            task_pid_offset: 2000,
            task_state_offset: 24,
            switch_prev_state: 1,
            pad: 0,
            offcpu_period_ns: 10_101_010,
        };
        assert_eq!(encode(&cfg).len(), 64);
        assert_eq!(decode::<Config>(encode(&cfg)), Some(cfg));
    }

    #[test]
    fn stack_classes_are_whole_pages() {
        for class in STACK_SIZE_CLASSES {
            assert_eq!(class as usize % STACK_PAGE, 0);
        }
        assert!(STACK_SIZE_CLASSES.contains(&DEFAULT_STACK_BYTES));
    }

    /// The frame offsets of 3.12/3.13 (owner @70), 3.14/3.15 (@74) and 3.14t (@78, tlbc @72),
    /// read as 80 bytes.
    fn info(owner: u32, tlbc: u32) -> PyProcInfo {
        PyProcInfo {
            frame_previous: 8,
            frame_executable: 0,
            frame_instr_ptr: 56,
            frame_owner: owner,
            frame_is_entry: PY_NO_OFFSET,
            frame_tlbc_index: tlbc,
            frame_read_bytes: 80,
            ..CODE_312
        }
    }

    /// The code fields of a 3.12–3.15 default build: `ob_type` @8, `co_firstlineno` @68,
    /// `co_filename` @112, `co_qualname` @128, read as 136 bytes.
    const CODE_312: PyProcInfo = PyProcInfo {
        runtime_addr: 0,
        code_type: 0,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: 0,
        interp_next: 0,
        threads_head: 0,
        interp_ceval_gil: 0,
        interp_gil_struct: 0,
        runtime_gil: 0,
        tstate_next: 0,
        tstate_interp: 0,
        tstate_native_thread_id: 0,
        tstate_pthread_id: 0,
        task_fsbase: 0,
        tstate_current_frame: 0,
        cframe_current_frame: 0,
        frame_previous: 0,
        frame_executable: 0,
        frame_instr_ptr: 0,
        frame_owner: 0,
        frame_is_entry: 0,
        frame_read_bytes: 0,
        frame_tlbc_index: 0,
        gil_locked: 0,
        gil_holder: 0,
        gil_enabled: 0,
        gil_size: 0,
        executable_tag_mask: 0,
        code_ob_type: 8,
        code_name: 128,
        code_filename: 112,
        code_firstlineno: 68,
        code_read_bytes: 136,
        owner_max: 3,
        shim_owner: 3,
        frame_globals: 24,
        frame_locals: 40,
    };

    #[test]
    fn code_fields_outside_the_header_or_misaligned_do_not_fit() {
        assert!(CODE_312.code_fields_fit());
        // 3.13t: +16 for the longer object header; read as 152 bytes.
        let ft = PyProcInfo {
            code_ob_type: 24,
            code_name: 144,
            code_filename: 128,
            code_firstlineno: 84,
            code_read_bytes: 152,
            ..CODE_312
        };
        assert!(ft.code_fields_fit());
        for bad_len in [0, 4, 132, PY_CODE_HEADER_BYTES + 8] {
            let i = PyProcInfo {
                code_read_bytes: bad_len,
                ..CODE_312
            };
            assert!(!i.code_fields_fit(), "read {bad_len}");
            assert!(!info(70, PY_NO_OFFSET).with_code(i).frame_offsets_fit());
        }
        for (field, bad) in [(0, 12), (1, 132), (2, 4), (3, 134), (3, 66)] {
            let mut i = CODE_312;
            match field {
                0 => i.code_ob_type = bad,
                1 => i.code_name = bad,
                2 => i.code_filename = bad,
                _ => i.code_firstlineno = bad,
            }
            assert!(!i.code_fields_fit(), "field {field} @{bad}");
        }
    }

    impl PyProcInfo {
        /// `self` with the code fields of `c`.
        fn with_code(self, c: PyProcInfo) -> PyProcInfo {
            PyProcInfo {
                code_ob_type: c.code_ob_type,
                code_name: c.code_name,
                code_filename: c.code_filename,
                code_firstlineno: c.code_firstlineno,
                code_read_bytes: c.code_read_bytes,
                ..self
            }
        }
    }

    #[test]
    fn real_frame_layouts_fit_the_header_read() {
        assert!(info(70, PY_NO_OFFSET).frame_offsets_fit());
        assert!(info(74, PY_NO_OFFSET).frame_offsets_fit());
        assert!(info(78, 72).frame_offsets_fit());
        // 3.11 `_PyInterpreterFrame`: f_code @32, previous @48, prev_instr @56, is_entry @68,
        // owner @69, read as 72 bytes.
        let v311 = PyProcInfo {
            frame_previous: 48,
            frame_executable: 32,
            frame_instr_ptr: 56,
            frame_owner: 69,
            frame_is_entry: 68,
            frame_tlbc_index: PY_NO_OFFSET,
            frame_read_bytes: 72,
            ..CODE_312
        };
        assert!(v311.frame_offsets_fit());
        // 3.8/3.9 `PyFrameObject`: f_back @24, f_code @32, f_lasti @104, no owner, 112 bytes.
        let v39 = PyProcInfo {
            frame_previous: 24,
            frame_executable: 32,
            frame_instr_ptr: 104,
            frame_owner: PY_NO_OFFSET,
            frame_is_entry: PY_NO_OFFSET,
            frame_tlbc_index: PY_NO_OFFSET,
            frame_read_bytes: 112,
            ..CODE_312
        };
        assert!(v39.frame_offsets_fit());
        for bad_len in [0, 4, 108, 136] {
            assert!(
                !PyProcInfo {
                    frame_read_bytes: bad_len,
                    ..v39
                }
                .frame_offsets_fit(),
                "read {bad_len}"
            );
        }
        assert!(
            !PyProcInfo {
                frame_read_bytes: 104,
                ..v39
            }
            .frame_offsets_fit(),
            "f_lasti outside the bytes read"
        );
    }

    #[test]
    fn frame_offsets_outside_the_header_or_misaligned_do_not_fit() {
        assert!(!info(80, PY_NO_OFFSET).frame_offsets_fit());
        assert!(
            !info(70, 78).frame_offsets_fit(),
            "tlbc_index crosses the end"
        );
        assert!(!info(70, 73).frame_offsets_fit(), "tlbc_index misaligned");
        for bad in [4, 76, 80, PY_NO_OFFSET] {
            let mut i = info(70, PY_NO_OFFSET);
            i.frame_previous = bad;
            assert!(!i.frame_offsets_fit(), "previous @{bad}");
            let mut i = info(70, PY_NO_OFFSET);
            i.frame_executable = bad;
            assert!(!i.frame_offsets_fit(), "executable @{bad}");
            let mut i = info(70, PY_NO_OFFSET);
            i.frame_instr_ptr = bad;
            assert!(!i.frame_offsets_fit(), "instr_ptr @{bad}");
        }
    }

    #[test]
    fn python_types_round_trip() {
        let info = PyProcInfo {
            runtime_addr: 0xba_07c0,
            pidns_dev: 4,
            pidns_ino: 0xf000_0001,
            interpreters_head: 808,
            interp_next: 0,
            threads_head: 7344,
            interp_ceval_gil: 7784,
            interp_gil_struct: 7792,
            tstate_next: 8,
            tstate_interp: 16,
            runtime_gil: PY_NO_OFFSET,
            tstate_native_thread_id: 160,
            tstate_pthread_id: 152,
            task_fsbase: 5000,
            tstate_current_frame: 72,
            cframe_current_frame: PY_NO_OFFSET,
            frame_previous: 8,
            frame_executable: 0,
            frame_instr_ptr: 56,
            frame_owner: 74,
            frame_is_entry: PY_NO_OFFSET,
            frame_read_bytes: 80,
            frame_tlbc_index: PY_NO_OFFSET,
            gil_locked: 8,
            gil_holder: 0,
            gil_enabled: PY_NO_OFFSET,
            gil_size: 208,
            code_type: 0x9a_0000,
            executable_tag_mask: 3,
            code_ob_type: 8,
            code_name: 128,
            code_filename: 112,
            code_firstlineno: 68,
            code_read_bytes: 136,
            owner_max: 4,
            shim_owner: 3,
            frame_globals: 24,
            frame_locals: 40,
        };
        assert_eq!(decode::<PyProcInfo>(encode(&info)), Some(info));
        let mut cap = PyCapture {
            tstate: 1,
            gil_holder: 2,
            gil_locked: 1,
            gil_enabled: -1,
            nframes: 2,
            flags: py_flags::CAPTURED | py_flags::CACHE_HIT,
            frames: [PyFrameRecord::default(); PY_MAX_FRAMES],
        };
        cap.frames[1] = PyFrameRecord {
            executable: 0x7f00_1234_5679,
            instr_ptr: 0x7f00_1234_6000,
            name: 0x7f00_0000_0010,
            filename: 0x7f00_0000_0020,
            globals: 0x7f00_0000_0030,
            tlbc_index: -1,
            owner: 3,
            is_entry: 1,
            first_line: 0xbeef,
        };
        let bytes = encode(&cap);
        assert_eq!(bytes.len(), 32 + 48 * PY_MAX_FRAMES);
        let back = decode::<PyCapture>(bytes).unwrap();
        assert_eq!(
            (
                back.tstate,
                back.gil_holder,
                back.gil_locked,
                back.gil_enabled
            ),
            (1, 2, 1, -1)
        );
        assert_eq!((back.nframes, back.flags), (cap.nframes, cap.flags));
        assert_eq!(back.frames, cap.frames);
        // The frame records start right after the 32-byte header, 48 bytes each.
        let f1 = 32 + 48;
        assert_eq!(&bytes[f1 + 16..f1 + 24], &0x7f00_0000_0010u64.to_le_bytes());
        assert_eq!(&bytes[f1 + 24..f1 + 32], &0x7f00_0000_0020u64.to_le_bytes());
        assert_eq!(&bytes[f1 + 32..f1 + 40], &0x7f00_0000_0030u64.to_le_bytes());
        assert_eq!(&bytes[f1 + 40..f1 + 44], &(-1i32).to_le_bytes());
        assert_eq!(bytes[f1 + 44], 3, "owner of frame 1");
        assert_eq!(bytes[f1 + 45], 1, "is_entry of frame 1");
        assert_eq!(&bytes[f1 + 46..f1 + 48], &0xbeefu16.to_le_bytes());
    }

    #[test]
    fn offcpu_record_round_trips_and_is_laid_out_as_decoded() {
        let rec = OffCpuRecord {
            event: SampleEvent {
                header: EventHeader {
                    kind: event_kind::OFFCPU,
                    flags: sample_flags::REGS_FROM_TASK,
                },
                time_ns: 5,
                pid: 7,
                tid: 8,
                py_cap: core::mem::size_of::<PyCapture>() as u32,
                ..SampleEvent::default()
            },
            off: OffCpuInfo {
                t_out: 5,
                t_wake: 6,
                t_in: 9,
                syscall: 202,
                task_state: 1,
                flags: offcpu_flags::GIL_WAIT | offcpu_flags::IN_SYSCALL,
            },
            py: PyCapture {
                tstate: 3,
                gil_holder: 4,
                gil_locked: 1,
                gil_enabled: -1,
                nframes: 0,
                flags: py_flags::CAPTURED,
                frames: [PyFrameRecord::default(); PY_MAX_FRAMES],
            },
        };
        let bytes = encode(&rec);
        assert_eq!(bytes.len(), 96 + 40 + 32 + 48 * PY_MAX_FRAMES);
        let back = decode::<OffCpuRecord>(bytes).unwrap();
        assert_eq!((back.event, back.off), (rec.event, rec.off));
        // The interval right after the sample header, the capture right after it.
        assert_eq!(decode::<OffCpuInfo>(&bytes[96..]), Some(rec.off));
        assert_eq!(u64::from_le_bytes(bytes[136..144].try_into().unwrap()), 3);
        assert_eq!(decode::<OffCpuInfo>(&bytes[96..135]), None);
    }

    #[test]
    fn counter_names_are_unique() {
        for (i, a) in Counter::ALL.iter().enumerate() {
            for b in &Counter::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn counters_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
