//! The native frames of one thread, merged exactly with its Python frames (`dump --native`).
//!
//! Owns: the glue of the native stages for one thread of a dump: the stack copy
//! ([`CopiedStack`]), the unwind (`unwind`), the symbols (`symbolize`) and the exact merge with
//! the Python frames read while the thread was stopped (`merge`, the same rule as `record
//! --native`: the k-th eval-loop activation from the innermost is replaced by the k-th group of
//! Python frames, counted by entry frames; counts that differ keep both halves around a
//! `[merge mismatch]` marker).
//! Input: the registers and stack copy of a stopped thread (live: ptrace; core: `NT_PRSTATUS`
//! and the core's memory), its Python chain (frames and entry frames). Output: [`Merged`].
//! Constraints: no I/O on the target here (the copy is all the unwinder sees); symbol files are
//! opened through `procs` (live: `/proc/PID/map_files`; core: under `--root`).

use std::sync::Arc;

use sampler_common::UserRegs;

use crate::merge::{self, EvalRanges, MergeOutcome, NativeItem, PyItem, Role};
use crate::procs::ProcessRegistry;
use crate::python::walker::ChainItem;
use crate::symbolize::{SymbolizedFrame, Symbolizer};
use crate::unwind::{NativeUnwinder, StackBytes};

/// Native frames unwound per thread at most.
pub const MAX_NATIVE_FRAMES: usize = 512;
/// The marker between the two halves of a stack that could not be merged.
pub const MISMATCH_MARKER: &str = "[merge mismatch]";

/// A copy of a thread's stack: `bytes[0]` is the byte at `base` (the stack pointer).
#[derive(Debug, Clone, Default)]
pub struct CopiedStack {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl StackBytes for CopiedStack {
    fn base(&self) -> u64 {
        self.base
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// One frame of a merged stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixedFrame {
    /// The thread's Python frame with this index (innermost first, as the walk gave them).
    Python(usize),
    /// The native frame with this index in [`Merged::native`].
    Native(usize),
    /// `[merge mismatch]`.
    Mismatch,
}

/// A native frame: its address (the lookup address: the ip, or a return address − 1) and name.
#[derive(Debug, Clone)]
pub struct NativeFrame {
    pub addr: u64,
    pub symbol: Arc<SymbolizedFrame>,
}

/// The merged stack of one thread.
#[derive(Debug, Clone)]
pub struct Merged {
    /// Innermost first.
    pub frames: Vec<MixedFrame>,
    pub native: Vec<NativeFrame>,
    pub outcome: MergeOutcome,
    /// The native unwind stopped before the thread's root.
    pub truncated: bool,
    /// Why it stopped early.
    pub unwind_error: Option<String>,
}

impl Merged {
    /// A thread without native frames: its Python frames only.
    pub fn python_only(python_frames: usize) -> Merged {
        Merged {
            frames: (0..python_frames).map(MixedFrame::Python).collect(),
            native: Vec::new(),
            outcome: MergeOutcome::NativeOnly,
            truncated: true,
            unwind_error: None,
        }
    }
}

/// The native stages of one dump (they cache per file).
pub struct NativeStages {
    pub registry: ProcessRegistry,
    unwinder: NativeUnwinder,
    symbolizer: Symbolizer,
    eval: Option<Arc<EvalRanges>>,
}

impl NativeStages {
    /// Stages over `registry` (holding the process), with the interpreter's eval-loop ranges.
    pub fn new(registry: ProcessRegistry, eval: Option<Arc<EvalRanges>>) -> NativeStages {
        NativeStages {
            registry,
            unwinder: NativeUnwinder::new(),
            symbolizer: Symbolizer::new(),
            eval,
        }
    }

    /// Whether the eval-loop ranges are known (without them nothing can be merged).
    pub fn has_eval_ranges(&self) -> bool {
        self.eval.is_some()
    }

    /// Unwinds, symbolizes and merges one thread of process `pid`.
    pub fn thread(
        &mut self,
        pid: u32,
        regs: UserRegs,
        stack: &CopiedStack,
        chain: &[ChainItem],
        chain_complete: bool,
    ) -> Merged {
        let unwound =
            self.unwinder
                .unwind(&mut self.registry, pid, &regs, stack, MAX_NATIVE_FRAMES);
        let mut native = Vec::with_capacity(unwound.frames.len());
        let mut items = Vec::with_capacity(unwound.frames.len());
        if let Some(proc) = self.registry.get(pid) {
            for (i, f) in unwound.frames.iter().enumerate() {
                let addr = f.lookup_address();
                native.push(NativeFrame {
                    addr,
                    symbol: self.symbolizer.native(proc, addr),
                });
                let role = self.eval.as_ref().map_or(Role::Other, |r| r.role(addr));
                items.push(NativeItem {
                    frame: MixedFrame::Native(i),
                    role,
                });
            }
        }
        let py: Vec<PyItem<MixedFrame>> = chain
            .iter()
            .map(|c| match c {
                ChainItem::Frame(i) => PyItem::Frame(MixedFrame::Python(*i as usize)),
                ChainItem::Entry => PyItem::Entry,
            })
            .collect();
        let mut root_first = Vec::with_capacity(items.len() + py.len() + 1);
        let outcome = merge::merge(
            &items,
            &py,
            chain_complete,
            MixedFrame::Mismatch,
            &mut root_first,
        );
        root_first.reverse();
        Merged {
            frames: root_first,
            native,
            outcome,
            truncated: unwound.truncated,
            unwind_error: unwound.error.map(|e| e.to_string()),
        }
    }
}
