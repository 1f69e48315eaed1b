//! unwind stage: native user stacks from copied stack bytes, with framehop.
//!
//! Owns: one framehop `UnwinderX86_64` per process (its module list), the shared framehop rule
//! cache, and the per-file unwind sections (through [`modules::ModuleBuilder`]).
//! Input: pid, user registers and the copy of the user stack made by the eBPF program
//! ([`StackBytes`]: `bytes[0]` is the byte at user address `base`), plus the process registry.
//! Output: [`NativeStack`] — the instruction pointer, then return addresses, innermost first —
//! with `truncated` and the reason it stopped.
//! Constraints: CPython builds here have no frame pointers (toolchain.md), so unwinding follows
//! `.eh_frame`/`.debug_frame`; framehop falls back to frame pointers only where a module has no
//! entry for the address. Reads outside the copy fail (never touch the live process). A return
//! address in no executable mapping triggers one rate-limited mapping refresh (a `dlopen` since
//! the last read) and is otherwise treated as garbage: the stack is cut there.

pub mod cfi_guard;
pub mod modules;
#[cfg(test)]
mod ns_tests;
#[cfg(test)]
pub(crate) mod test_target;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder as _};
use sampler_common::UserRegs;

use crate::lru::Lru;
use crate::procs::{Process, ProcessRegistry};
use modules::{MappingKey, ModuleBuilder, SectionBytes};

/// Default frame cap.
pub const DEFAULT_MAX_FRAMES: usize = 256;
/// Most processes with a module list; an [`Lru`] drops the least recently used beyond this (a
/// host-wide run sees many short-lived processes, and `forget_process` may not be called for
/// every one of them).
const MAX_PROCS: usize = 4096;

/// framehop's gimli storage: fixed arrays, not vectors. A DWARF expression's value stack holds
/// at most 64 values, so no expression can grow memory (see [`cfi_guard`]); the unwind context
/// has the same bounds as gimli's on-heap storage (192 register rules, 4 remembered rows).
pub type Policy = MustNotAllocateDuringUnwind;
/// One process's framehop unwinder.
pub type Unwinder = UnwinderX86_64<SectionBytes, Policy>;
/// framehop's rule cache and gimli context, shared by every process.
pub type Cache = CacheX86_64<Policy>;

/// Read access to a copied user stack (implemented by `collect::StackCopy`).
pub trait StackBytes {
    /// User address of `bytes()[0]`.
    fn base(&self) -> u64;
    /// The copied bytes (upward from `base`).
    fn bytes(&self) -> &[u8];
}

/// One native frame address. The first frame of a stack is where the thread was; the others
/// are return addresses, which point after the call and must be looked up one byte earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NativeFrameAddr {
    /// The interrupted instruction (the first frame).
    InstructionPointer(u64),
    /// A return address (every later frame).
    ReturnAddress(u64),
}

impl NativeFrameAddr {
    /// The raw address.
    pub fn address(self) -> u64 {
        match self {
            Self::InstructionPointer(a) | Self::ReturnAddress(a) => a,
        }
    }

    /// The address to symbolize: the ip itself, or `ra - 1` (inside the call instruction, so
    /// that a call at the very end of a function is attributed to that function).
    pub fn lookup_address(self) -> u64 {
        match self {
            Self::InstructionPointer(a) => a,
            Self::ReturnAddress(a) => a.saturating_sub(1),
        }
    }
}

/// Why an unwind stopped early.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnwindError {
    /// The process is not in the registry and could not be loaded.
    #[error("process {pid} is gone")]
    ProcessGone {
        /// Host pid.
        pid: u32,
    },
    /// No user registers (ip 0).
    #[error("no instruction pointer for pid {pid}")]
    NoInstructionPointer {
        /// Host pid.
        pid: u32,
    },
    /// The unwind rules asked for stack memory outside the copy.
    #[error("stack read at {addr:#x} is outside the copy [{base:#x}, {base:#x}+{len:#x})")]
    StackRead {
        /// Address asked for.
        addr: u64,
        /// Start of the copy.
        base: u64,
        /// Bytes in the copy.
        len: u64,
    },
    /// A return address lies in no executable mapping, even after a refresh.
    #[error("return address {addr:#x} of pid {pid} is in no executable mapping")]
    UnmappedAddress {
        /// Host pid.
        pid: u32,
        /// The address.
        addr: u64,
    },
    /// framehop refused to continue for another reason.
    #[error("framehop stopped after {addr:#x}: {error}")]
    Framehop {
        /// Last good frame address.
        addr: u64,
        /// framehop's error.
        error: framehop::Error,
    },
    /// The frame cap was reached.
    #[error("stack deeper than {max} frames")]
    TooDeep {
        /// The cap.
        max: usize,
    },
}

/// The kinds of [`UnwindError`], as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnwindFailure {
    /// [`UnwindError::ProcessGone`].
    ProcessGone,
    /// [`UnwindError::NoInstructionPointer`].
    NoInstructionPointer,
    /// [`UnwindError::StackRead`].
    StackRead,
    /// [`UnwindError::UnmappedAddress`].
    UnmappedAddress,
    /// [`UnwindError::Framehop`].
    Framehop,
    /// [`UnwindError::TooDeep`].
    TooDeep,
    /// Not a failed unwind but a file (counted once when it is read): its `.eh_frame` or
    /// `.debug_frame` holds a DWARF expression that branches or is too long, so framehop was not
    /// given it and the file unwinds with frame pointers ([`cfi_guard`]).
    UnsafeUnwindInfo,
}

impl UnwindFailure {
    /// Every kind.
    pub const ALL: [UnwindFailure; 7] = [
        Self::ProcessGone,
        Self::NoInstructionPointer,
        Self::StackRead,
        Self::UnmappedAddress,
        Self::Framehop,
        Self::TooDeep,
        Self::UnsafeUnwindInfo,
    ];

    /// Short stable name for counters.
    pub fn name(self) -> &'static str {
        match self {
            Self::ProcessGone => "unwind_process_gone",
            Self::NoInstructionPointer => "unwind_no_ip",
            Self::StackRead => "unwind_stack_read",
            Self::UnmappedAddress => "unwind_unmapped_address",
            Self::Framehop => "unwind_framehop",
            Self::TooDeep => "unwind_too_deep",
            Self::UnsafeUnwindInfo => "unwind_section_withheld",
        }
    }
}

impl UnwindError {
    /// Its kind, as counted.
    pub fn kind(&self) -> UnwindFailure {
        match self {
            Self::ProcessGone { .. } => UnwindFailure::ProcessGone,
            Self::NoInstructionPointer { .. } => UnwindFailure::NoInstructionPointer,
            Self::StackRead { .. } => UnwindFailure::StackRead,
            Self::UnmappedAddress { .. } => UnwindFailure::UnmappedAddress,
            Self::Framehop { .. } => UnwindFailure::Framehop,
            Self::TooDeep { .. } => UnwindFailure::TooDeep,
        }
    }
}

/// The unwound native stack of one sample, innermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NativeStack {
    /// Frames: an instruction pointer, then return addresses.
    pub frames: Vec<NativeFrameAddr>,
    /// The stack did not end at a root function.
    pub truncated: bool,
    /// Why it stopped early, if it did.
    pub error: Option<UnwindError>,
}

/// Work counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Stacks unwound.
    pub unwinds: u64,
    /// Stacks that ended early.
    pub truncated: u64,
    /// Module lists (re)built.
    pub module_rebuilds: u64,
    /// Mapping refreshes that found new mappings.
    pub refreshes: u64,
    /// Module building work and failures.
    pub modules: modules::ModuleStats,
}

struct ProcState {
    start_time_ticks: u64,
    mappings_generation: u64,
    unwinder: Unwinder,
    modules: HashMap<MappingKey, Module<SectionBytes>>,
    /// Sorted, executable mapping ranges (file-backed or not).
    exec_ranges: Vec<(u64, u64)>,
}

impl ProcState {
    fn is_code(&self, addr: u64) -> bool {
        let i = self.exec_ranges.partition_point(|r| r.0 <= addr);
        i > 0 && addr < self.exec_ranges[i - 1].1
    }
}

/// The native unwinder for all processes.
pub struct NativeUnwinder {
    builder: ModuleBuilder,
    cache: Cache,
    procs: Lru<u32, ProcState>,
    stats: UnwindStats,
}

impl Default for NativeUnwinder {
    fn default() -> Self {
        Self::new()
    }
}

/// Result of one walk: the stack plus an address that was in no mapping at all.
struct Walk {
    stack: NativeStack,
    unknown: Option<u64>,
}

impl NativeUnwinder {
    /// An unwinder with empty caches.
    pub fn new() -> Self {
        Self {
            builder: ModuleBuilder::default(),
            cache: Cache::new_in(),
            procs: Lru::new(MAX_PROCS),
            stats: UnwindStats::default(),
        }
    }

    /// Work counters.
    pub fn stats(&self) -> UnwindStats {
        UnwindStats {
            modules: self.builder.stats(),
            ..self.stats
        }
    }

    /// Drop the state of `pid` (it exited or exec'd).
    pub fn forget_process(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Unwind one sample of `pid`. Never fails: problems end the stack early and are reported in
    /// [`NativeStack::error`].
    pub fn unwind(
        &mut self,
        procs: &mut ProcessRegistry,
        pid: u32,
        regs: &UserRegs,
        stack: &(impl StackBytes + ?Sized),
        max_frames: usize,
    ) -> NativeStack {
        self.stats.unwinds += 1;
        let result = self.unwind_inner(procs, pid, regs, stack, max_frames.max(1));
        if result.truncated {
            self.stats.truncated += 1;
        }
        result
    }

    fn unwind_inner(
        &mut self,
        procs: &mut ProcessRegistry,
        pid: u32,
        regs: &UserRegs,
        stack: &(impl StackBytes + ?Sized),
        max_frames: usize,
    ) -> NativeStack {
        if regs.ip == 0 {
            return NativeStack {
                frames: Vec::new(),
                truncated: true,
                error: Some(UnwindError::NoInstructionPointer { pid }),
            };
        }
        let Some(proc) = procs.get_or_load(pid) else {
            return NativeStack {
                frames: vec![NativeFrameAddr::InstructionPointer(regs.ip)],
                truncated: true,
                error: Some(UnwindError::ProcessGone { pid }),
            };
        };
        self.ensure_state(proc);
        let walk = self.walk(pid, regs, stack, max_frames);
        let Some(_unknown) = walk.unknown else {
            return walk.stack;
        };
        // An address in no mapping: perhaps a library loaded since the last read.
        if !procs.refresh_mappings(pid) {
            return walk.stack;
        }
        self.stats.refreshes += 1;
        let Some(proc) = procs.get(pid) else {
            return walk.stack;
        };
        self.ensure_state(proc);
        self.walk(pid, regs, stack, max_frames).stack
    }

    /// (Re)build the module list of `proc` if it is new, exec'd, or its mappings changed.
    fn ensure_state(&mut self, proc: &Process) {
        if let Some(s) = self.procs.get(&proc.pid)
            && s.start_time_ticks == proc.start_time_ticks
            && s.mappings_generation == proc.mappings_generation
        {
            return;
        }
        self.stats.module_rebuilds += 1;
        let previous = self
            .procs
            .remove(&proc.pid)
            .filter(|s| s.start_time_ticks == proc.start_time_ticks)
            .map(|s| s.modules)
            .unwrap_or_default();
        let modules = self.builder.modules_for(proc, &previous);
        let mut unwinder = Unwinder::new();
        for m in modules.values() {
            unwinder.add_module(m.clone());
        }
        let mut exec_ranges: Vec<(u64, u64)> = proc
            .mappings
            .iter()
            .filter(|m| m.perms.exec)
            .map(|m| (m.start, m.end))
            .collect();
        exec_ranges.sort_unstable();
        self.procs.insert(
            proc.pid,
            ProcState {
                start_time_ticks: proc.start_time_ticks,
                mappings_generation: proc.mappings_generation,
                unwinder,
                modules,
                exec_ranges,
            },
        );
    }

    fn walk(
        &mut self,
        pid: u32,
        regs: &UserRegs,
        stack: &(impl StackBytes + ?Sized),
        max_frames: usize,
    ) -> Walk {
        let mut out = Walk {
            stack: NativeStack::default(),
            unknown: None,
        };
        let Some(state) = self.procs.get_mut(&pid) else {
            return out;
        };
        let state = &*state;
        let base = stack.base();
        let bytes = stack.bytes();
        let len = bytes.len() as u64;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
            let word = bytes.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            let mut a = [0u8; 8];
            a.copy_from_slice(word);
            Ok(u64::from_le_bytes(a))
        };
        let mut iter = state.unwinder.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut self.cache,
            &mut read_stack,
        );
        let frames = &mut out.stack.frames;
        loop {
            if frames.len() >= max_frames {
                out.stack.truncated = true;
                out.stack.error = Some(UnwindError::TooDeep { max: max_frames });
                break;
            }
            match iter.next() {
                Ok(Some(FrameAddress::InstructionPointer(ip))) => {
                    if !state.is_code(ip) {
                        out.unknown = Some(ip);
                    }
                    frames.push(NativeFrameAddr::InstructionPointer(ip));
                }
                Ok(Some(FrameAddress::ReturnAddress(ra))) => {
                    let ra = ra.get();
                    if !state.is_code(ra - 1) {
                        // Garbage from a frame-pointer fallback, or a new library.
                        out.unknown = Some(ra);
                        out.stack.truncated = true;
                        out.stack.error = Some(UnwindError::UnmappedAddress { pid, addr: ra });
                        break;
                    }
                    frames.push(NativeFrameAddr::ReturnAddress(ra));
                }
                // A null return address ends frame-pointer chains and thread roots.
                Ok(None) | Err(framehop::Error::ReturnAddressIsNull) => break,
                Err(framehop::Error::CouldNotReadStack(addr)) => {
                    out.stack.truncated = true;
                    out.stack.error = Some(UnwindError::StackRead { addr, base, len });
                    break;
                }
                Err(error) => {
                    let addr = frames.last().map_or(regs.ip, |f| f.address());
                    out.stack.truncated = true;
                    out.stack.error = Some(UnwindError::Framehop { addr, error });
                    break;
                }
            }
        }
        out
    }
}
