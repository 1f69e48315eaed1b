//! Per-sample stack building for `record`: a sample with its Python part resolved → an
//! interned stack and its key in the [`Profile`].
//!
//! Owns: the native unwinding, symbolization and `--native` merge of each sample (their
//! caches: (pid, address) → frame for native frames, address → frame for kernel frames, pid →
//! root frame and name, tid → thread name, and the eval-loop ranges per process
//! ([`EvalLoops`], merge's)), the merge-mismatch counts per process and this stage's failures.
//! Input: a [`Staged`] sample (Python frames already profile frame ids) and the process
//! registry. Output: the sample's [`Sample`]s (one; one per state part for an off-CPU
//! interval), counted in the profile and handed to the caller (the timeline of a streamed
//! `.pyebpf`).
//!
//! Stack order in the profile is root first: `comm (pid)`, [thread], then
//! - default: the Python frames, outermost first (nothing for a thread not running Python);
//! - `--native`: the native user frames, outermost first, with each eval-loop activation
//!   replaced by the Python frames it ran (`merge`); a sample that cannot be merged exactly
//!   keeps its native frames, then `[merge mismatch]`, then its Python frames;
//!
//! and kernel frames on top; an off-CPU interval (`--idle`) then ends in its state frame
//! (`[off-CPU: sleeping in futex]`), one sample per state part, weighted (`idle`).
//! Constraints: no allocation per sample once the caches are warm (the stack is built in a
//! reused buffer, names are interned once per process and thread); caches are bounded.

use std::sync::Arc;

use sampler_common::sample_flags;

use crate::collect::RawSample;
use crate::failure::{Failure, Failures};
use crate::lru::{FastMap, Lru};
use crate::merge::{self, EvalLoops, EvalRangeIssue, MergeOutcome, NativeItem, Role};
use crate::procs::ProcessRegistry;
use crate::profile::{
    Frame, FrameId, FrameKind, GilState, NameId, Profile, Sample, SampleKey, ThreadState,
};
use crate::python::Detected;
use crate::symbolize::Symbolizer;
use crate::unwind::{NativeUnwinder, UnwindFailure};

use super::python::PyStack;

/// Maximum native frames per sample; deeper stacks are marked truncated.
pub const MAX_NATIVE_FRAMES: usize = 256;
/// The marker between the native and the Python half of an unmergeable sample.
pub const MISMATCH_MARKER: &str = "[merge mismatch]";
/// Most cached native and kernel frames.
const MAX_FRAMES: usize = 1 << 20;
/// Most processes and threads whose names are cached.
const MAX_NAMES: usize = 1 << 16;
/// Most threads of one process whose cached names are dropped with it (the most recent; the
/// names of older threads of a process with many leave the cache as least recently used).
const MAX_TIDS_PER_PROCESS: usize = 64;

/// What the builder needs from the run's configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildConfig {
    /// `--native`.
    pub native: bool,
    /// `--kernel`.
    pub kernel: bool,
    /// `--threads`.
    pub threads: bool,
    /// `--idle`: the off-CPU sampling period in ns (0 without `--idle`).
    pub offcpu_period_ns: u64,
}

/// One sample for the builder, its Python part resolved.
pub struct Staged<'a> {
    /// The sample.
    pub raw: &'a RawSample,
    /// Its kernel stack, innermost first.
    pub kernel: Option<&'a [u64]>,
    /// Its Python frames.
    pub py: Option<&'a PyStack>,
    /// The interpreter file of its process (for the eval-loop ranges, with `--native`).
    pub interp: Option<&'a Detected>,
    /// The Python `threading` name of the thread, with `--threads`.
    pub thread_name: Option<Arc<str>>,
    /// GIL state of the thread at the sample.
    pub gil: GilState,
}

/// A process's root frame and name, as last built, and the threads whose names are cached.
struct Root {
    comm: Arc<str>,
    frame: FrameId,
    name: NameId,
    /// Its threads in `thread_names` (at most [`MAX_TIDS_PER_PROCESS`], the most recent).
    tids: Vec<u32>,
}

/// Builds profile stacks from staged samples.
pub struct StackBuilder {
    cfg: BuildConfig,
    unwinder: NativeUnwinder,
    symbolizer: Symbolizer,
    eval: EvalLoops,
    native_frames: Lru<(u32, u64), FrameId>,
    kernel_frames: Lru<u64, FrameId>,
    roots: Lru<u32, Root>,
    /// tid → (name, its id, its `--threads` frame).
    thread_names: Lru<u32, (Arc<str>, NameId, Option<FrameId>)>,
    failures: Failures,
    mismatches: FastMap<u32, u64>,
    scratch: Vec<FrameId>,
    native_scratch: Vec<NativeItem<FrameId>>,
}

impl StackBuilder {
    /// A builder for one run.
    pub fn new(cfg: BuildConfig) -> Self {
        StackBuilder {
            cfg,
            unwinder: NativeUnwinder::new(),
            symbolizer: Symbolizer::new(),
            eval: EvalLoops::default(),
            native_frames: Lru::new(MAX_FRAMES),
            kernel_frames: Lru::new(MAX_FRAMES),
            roots: Lru::new(MAX_NAMES),
            thread_names: Lru::new(MAX_NAMES),
            failures: Failures::default(),
            mismatches: FastMap::default(),
            scratch: Vec::new(),
            native_scratch: Vec::new(),
        }
    }

    /// Failures counted by this stage, with the files whose unwind sections the unwinder
    /// withheld (counted once per load, by the unwinder: not a per-sample count).
    pub fn failures(&self) -> Failures {
        let mut f = self.failures.clone();
        f.add(
            Failure::Unwind(UnwindFailure::UnsafeUnwindInfo),
            self.unwinder.stats().modules.unsafe_unwind_info,
        );
        f
    }

    /// Merge mismatches by pid.
    pub fn mismatches(&self) -> &FastMap<u32, u64> {
        &self.mismatches
    }

    /// Forgets per-process caches (the process exec'd or exited): its root, its threads'
    /// names, its native frames, eval-loop ranges, unwind and symbolization state.
    pub fn forget_process(&mut self, pid: u32) {
        if let Some(root) = self.roots.remove(&pid) {
            for tid in root.tids {
                self.thread_names.remove(&tid);
            }
        }
        self.thread_names.remove(&pid);
        self.native_frames.retain(|(p, _), _| *p != pid);
        self.eval.forget(pid);
        self.unwinder.forget_process(pid);
        self.symbolizer.forget_process(pid);
    }

    /// How many processes and threads have cached names (tests: after every
    /// process exited, none).
    #[cfg(test)]
    pub fn sizes(&self) -> (usize, usize) {
        (self.roots.len(), self.thread_names.len())
    }

    /// Builds one sample's stack into `profile`; `out` gets each [`Sample`] counted (one, or
    /// one per state part of an off-CPU interval). Returns what the eval-loop ranges of the
    /// process lack, the first time they are looked up.
    pub fn add(
        &mut self,
        profile: &mut Profile,
        registry: &mut ProcessRegistry,
        s: &Staged<'_>,
        out: &mut impl FnMut(&Sample),
    ) -> Option<EvalRangeIssue> {
        let raw = s.raw;
        let thread_comm = comm_str(&raw.comm);
        let root = self.root(profile, registry, raw.pid, &thread_comm);
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        stack.push(root.0);
        let (thread, thread_frame) = self.thread(
            profile,
            raw.pid,
            raw.tid,
            s.thread_name.as_ref(),
            &thread_comm,
        );
        if let Some(f) = thread_frame {
            stack.push(f);
        }
        let mut issue = None;
        // An off-CPU interval carries no stack copy (a copy at every context switch would cost
        // more than the switch): its Python frames stand alone, as without `--native`.
        if self.cfg.native && raw.off_cpu.is_none() {
            let ranges = match s.interp {
                Some(interp) if s.py.is_some() => {
                    let (r, i) = self.eval.get(raw.pid, interp);
                    issue = i;
                    r
                }
                _ => None,
            };
            let truncated = self.unwind(profile, registry, raw, ranges.as_deref());
            if truncated {
                stack.push(profile.intern_frame(Frame::new(FrameKind::Marker, "[truncated]")));
            }
            let native = std::mem::take(&mut self.native_scratch);
            if let Some(py) = s.py {
                let marker = profile.intern_frame(Frame::new(FrameKind::Marker, MISMATCH_MARKER));
                if let MergeOutcome::Mismatch { .. } =
                    merge::merge(&native, &py.items, !py.truncated, marker, &mut stack)
                {
                    self.failures.one(Failure::MergeMismatch);
                    *self.mismatches.entry(raw.pid).or_default() += 1;
                }
            } else {
                stack.extend(native.iter().rev().map(|n| n.frame));
            }
            self.native_scratch = native;
        } else if let Some(py) = s.py {
            if py.truncated {
                let marker = if py.invalid {
                    super::python::INVALID_PY_FRAME
                } else {
                    "[truncated]"
                };
                stack.push(profile.intern_frame(Frame::new(FrameKind::Marker, marker)));
            }
            merge::python_only(&py.items, &mut stack);
        }
        if self.cfg.kernel {
            self.push_kernel(profile, s.kernel, raw, &mut stack);
        }
        let mut sample = Sample {
            key: SampleKey {
                stack: crate::profile::StackId(0),
                pid: raw.pid,
                tid: raw.tid,
                comm: root.1,
                thread,
                gil: s.gil,
                state: ThreadState::OnCpu,
            },
            time_ns: raw.time_ns,
            cpu: raw.cpu,
            weight: 1,
        };
        if let Some(off) = &raw.off_cpu {
            for (state, weight) in super::idle::split(off, self.cfg.offcpu_period_ns) {
                let label = super::idle::state_label(state, off);
                stack.push(profile.intern_frame(Frame::new(FrameKind::State, label)));
                sample.key.stack = profile.intern_stack(&stack);
                stack.pop();
                sample.key.state = state;
                sample.weight = weight;
                profile.add(&sample);
                out(&sample);
            }
        } else {
            sample.key.stack = profile.intern_stack(&stack);
            profile.add(&sample);
            out(&sample);
        }
        self.scratch = stack;
        issue
    }

    /// The root frame `comm (pid)` and the process name of `pid` (from the registry; the
    /// thread's comm when the process is gone).
    fn root(
        &mut self,
        profile: &mut Profile,
        registry: &mut ProcessRegistry,
        pid: u32,
        thread_comm: &str,
    ) -> (FrameId, NameId) {
        let comm = if let Some(p) = registry.get_or_load(pid) {
            p.comm.as_str()
        } else {
            self.failures.one(Failure::ProcessGone);
            // The main thread's comm is the process name; others' are thread names.
            thread_comm
        };
        let tids = match self.roots.get_mut(&pid) {
            Some(r) if *r.comm == *comm => return (r.frame, r.name),
            Some(r) => std::mem::take(&mut r.tids),
            None => Vec::new(),
        };
        let frame = profile.intern_frame(Frame::new(FrameKind::Process, format!("{comm} ({pid})")));
        let name = profile.intern_name(comm);
        self.roots.insert(
            pid,
            Root {
                comm: comm.into(),
                frame,
                name,
                tids,
            },
        );
        (frame, name)
    }

    /// The thread's name (its Python name when given, else its comm) and, with `--threads`, its
    /// frame `name (tid)`.
    fn thread(
        &mut self,
        profile: &mut Profile,
        pid: u32,
        tid: u32,
        python_name: Option<&Arc<str>>,
        comm: &str,
    ) -> (NameId, Option<FrameId>) {
        let name: &str = python_name.map_or(comm, |n| &**n);
        if let Some((n, id, frame)) = self.thread_names.get(&tid)
            && **n == *name
        {
            return (*id, *frame);
        }
        let id = profile.intern_name(name);
        let frame = self.cfg.threads.then(|| {
            profile.intern_frame(Frame::new(FrameKind::Thread, format!("{name} ({tid})")))
        });
        self.thread_names.insert(tid, (name.into(), id, frame));
        // Remembered with its process, so that the process's exit drops it.
        if tid != pid
            && let Some(r) = self.roots.get_mut(&pid)
            && !r.tids.contains(&tid)
        {
            if r.tids.len() >= MAX_TIDS_PER_PROCESS {
                r.tids.remove(0);
            }
            r.tids.push(tid);
        }
        (id, frame)
    }

    /// Unwinds and symbolizes the native stack into `native_scratch` (innermost first, with
    /// eval-loop roles from `ranges`). Returns whether it was truncated.
    fn unwind(
        &mut self,
        profile: &mut Profile,
        registry: &mut ProcessRegistry,
        s: &RawSample,
        ranges: Option<&merge::EvalRanges>,
    ) -> bool {
        self.native_scratch.clear();
        if s.flags & sample_flags::KERNEL_THREAD != 0 {
            return false;
        }
        let Some(copy) = s.stack.as_ref().filter(|c| !c.bytes.is_empty()) else {
            self.failures.one(Failure::NoUserStack);
            return false;
        };
        let native = self
            .unwinder
            .unwind(registry, s.pid, &s.regs, copy, MAX_NATIVE_FRAMES);
        if let Some(e) = &native.error {
            self.failures.one(Failure::Unwind(e.kind()));
        }
        let Some(proc) = registry.get(s.pid) else {
            return native.truncated;
        };
        for f in &native.frames {
            let addr = f.lookup_address();
            let id = if let Some(id) = self.native_frames.get(&(s.pid, addr)) {
                *id
            } else {
                let sym = self.symbolizer.native(proc, addr);
                let mut frame = Frame::new(FrameKind::Native, sym.name.as_str());
                frame.module = Some(sym.module.as_str().into());
                frame.file = sym.file.as_deref().map(Into::into);
                frame.line = sym.line;
                let id = profile.intern_frame(frame);
                self.native_frames.insert((s.pid, addr), id);
                id
            };
            let role = ranges.map_or(Role::Other, |r| r.role(addr));
            self.native_scratch.push(NativeItem { frame: id, role });
        }
        if self.native_scratch.is_empty() {
            self.failures.one(Failure::NoNativeFrames);
        }
        native.truncated
    }

    fn push_kernel(
        &mut self,
        profile: &mut Profile,
        kernel: Option<&[u64]>,
        s: &RawSample,
        out: &mut Vec<FrameId>,
    ) {
        if s.kernel_stack_id < 0 {
            return; // user-mode sample: no kernel frames (not an error)
        }
        let Some(addrs) = kernel else {
            self.failures.one(Failure::KernelStackMissing);
            return;
        };
        let start = out.len();
        for &addr in addrs.iter().rev() {
            let id = if let Some(id) = self.kernel_frames.get(&addr) {
                *id
            } else {
                let sym = self.symbolizer.kernel(addr);
                let id = profile.intern_frame(Frame::new(FrameKind::Kernel, sym.name.as_str()));
                self.kernel_frames.insert(addr, id);
                id
            };
            out.push(id);
        }
        if s.off_cpu.is_some() {
            // Taken in the `sched_switch` program: its own frames and the tracepoint's are not
            // where the thread waits (`__schedule` is its innermost frame).
            while out.len() > start && is_tracing_frame(&profile.frame(out[out.len() - 1]).name) {
                out.pop();
            }
        }
    }
}

/// A kernel frame of the BPF program or of the tracepoint that ran it.
fn is_tracing_frame(name: &str) -> bool {
    [
        "bpf_prog_",
        "bpf_trace_run",
        "__bpf_trace_",
        "__traceiter_",
        "bpf_dispatcher",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// The NUL-terminated comm as a string (lossy).
pub fn comm_str(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}
