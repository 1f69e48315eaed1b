//! Per-sample stack building for `record`: staged sample → interned stack in the [`Profile`].
//!
//! Owns: the frame caches of a run — (pid, address) → frame for native frames, address →
//! frame for kernel frames, pid → root frame, Python frame index → frame — the merge-mismatch
//! counts (per process too) and the per-run error counts of this stage.
//! Input: a [`StagedSample`] (Python frames already resolved by the Python stage) and the
//! process registry. Output: one [`Sample`] in the profile.
//!
//! Stack order in the profile is root first: `comm (pid)`, [thread], then
//! - default: the Python frames, outermost first (nothing for a thread not running Python);
//! - `--native`: the native user frames, outermost first, with each eval-loop activation
//!   replaced by the Python frames it ran (`merge`); a sample that cannot be merged exactly
//!   keeps its native frames, then `[merge mismatch]`, then its Python frames;
//!
//! and kernel frames on top; an off-CPU interval (`--idle`) then ends in its state frame
//! (`[off-CPU: sleeping in futex]`), one sample per state part, weighted (`idle`).

use std::collections::BTreeMap;

use crate::lru::FastMap;
use std::sync::Arc;

use sampler_common::sample_flags;

use crate::merge::{self, MergeOutcome, NativeItem, PyItem, Role};
use crate::procs::ProcessRegistry;
use crate::profile::{Frame, FrameId, FrameKind, Profile, Sample, ThreadState};
use crate::symbolize::Symbolizer;
use crate::unwind::NativeUnwinder;

use super::pystage::StagedSample;

/// Maximum native frames per sample; deeper stacks are marked truncated.
pub const MAX_NATIVE_FRAMES: usize = 256;
/// The marker between the native and the Python half of an unmergeable sample.
pub const MISMATCH_MARKER: &str = "[merge mismatch]";

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

/// Builds profile stacks from staged samples.
pub struct StackBuilder {
    cfg: BuildConfig,
    unwinder: NativeUnwinder,
    symbolizer: Symbolizer,
    native_frames: FastMap<(u32, u64), FrameId>,
    kernel_frames: FastMap<u64, FrameId>,
    roots: FastMap<u32, (Arc<str>, FrameId)>,
    thread_names: FastMap<u32, Arc<str>>,
    /// Python frame index (from the Python stage) → profile frame.
    py_frames: Vec<FrameId>,
    errors: BTreeMap<String, u64>,
    mismatches: FastMap<u32, u64>,
    scratch: Vec<FrameId>,
    native_scratch: Vec<NativeItem<FrameId>>,
    py_scratch: Vec<PyItem<FrameId>>,
}

impl StackBuilder {
    /// A builder for one run.
    pub fn new(cfg: BuildConfig) -> Self {
        StackBuilder {
            cfg,
            unwinder: NativeUnwinder::new(),
            symbolizer: Symbolizer::new(),
            native_frames: FastMap::default(),
            kernel_frames: FastMap::default(),
            roots: FastMap::default(),
            thread_names: FastMap::default(),
            py_frames: Vec::new(),
            errors: BTreeMap::new(),
            mismatches: FastMap::default(),
            scratch: Vec::new(),
            native_scratch: Vec::new(),
            py_scratch: Vec::new(),
        }
    }

    /// Errors counted by this stage, by kind.
    pub fn errors(&self) -> &BTreeMap<String, u64> {
        &self.errors
    }

    /// Merge mismatches by pid.
    pub fn mismatches(&self) -> &FastMap<u32, u64> {
        &self.mismatches
    }

    fn count(&mut self, kind: &str) {
        *self.errors.entry(kind.to_string()).or_default() += 1;
    }

    /// Forgets per-process caches (the process exec'd or exited).
    pub fn forget_process(&mut self, pid: u32) {
        self.roots.remove(&pid);
        self.native_frames.retain(|(p, _), _| *p != pid);
        self.unwinder.forget_process(pid);
        self.symbolizer.forget_process(pid);
    }

    /// Adds one sample to the profile.
    pub fn add(&mut self, profile: &mut Profile, registry: &mut ProcessRegistry, s: StagedSample) {
        let StagedSample {
            raw: s,
            kernel,
            py,
            thread_name,
            new_frames,
            gil,
        } = s;
        for f in new_frames {
            self.py_frames.push(profile.intern_frame(f));
        }
        let thread_comm = comm_str(&s.comm);
        let comm: Arc<str> = if let Some(p) = registry.get_or_load(s.pid) {
            p.comm.as_str().into()
        } else {
            self.count("process_gone");
            // The main thread's comm is the process name; others' are thread names.
            thread_comm.as_str().into()
        };
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        stack.push(self.root_frame(profile, s.pid, &comm));
        let thread_name = thread_name.unwrap_or_else(|| self.thread_name(s.tid, &thread_comm));
        if self.cfg.threads {
            let label = format!("{thread_name} ({})", s.tid);
            stack.push(profile.intern_frame(Frame::new(FrameKind::Thread, label)));
        }
        let py_items = self.py_items(profile, py.as_ref());
        // An off-CPU interval carries no stack copy (a copy at every context switch would cost
        // more than the switch): its Python frames stand alone, as without `--native`.
        if self.cfg.native && s.off_cpu.is_none() {
            let ranges = py.as_ref().and_then(|p| p.eval.clone());
            let truncated = self.unwind(profile, registry, &s, ranges.as_deref());
            if truncated {
                stack.push(profile.intern_frame(Frame::new(FrameKind::Marker, "[truncated]")));
            }
            let native = std::mem::take(&mut self.native_scratch);
            if py.is_some() {
                let marker = profile.intern_frame(Frame::new(FrameKind::Marker, MISMATCH_MARKER));
                if let MergeOutcome::Mismatch { .. } =
                    merge::merge(&native, &py_items, marker, &mut stack)
                {
                    self.count("merge_mismatch");
                    *self.mismatches.entry(s.pid).or_default() += 1;
                }
            } else {
                stack.extend(native.iter().rev().map(|n| n.frame));
            }
            self.native_scratch = native;
        } else if let Some(py) = &py {
            if py.truncated {
                let marker = if py.invalid {
                    super::pyproc::INVALID_PY_FRAME
                } else {
                    "[truncated]"
                };
                stack.push(profile.intern_frame(Frame::new(FrameKind::Marker, marker)));
            }
            merge::python_only(&py_items, &mut stack);
        }
        self.py_scratch = py_items;
        if self.cfg.kernel {
            self.push_kernel(profile, kernel.as_deref(), &s, &mut stack);
        }
        let mut sample = Sample {
            stack: crate::profile::StackId(0),
            time_ns: s.time_ns,
            pid: s.pid,
            tid: s.tid,
            cpu: s.cpu,
            comm,
            thread_name,
            gil,
            state: ThreadState::OnCpu,
            weight: 1,
        };
        if let Some(off) = &s.off_cpu {
            for (state, weight) in super::idle::split(off, self.cfg.offcpu_period_ns) {
                let label = super::idle::state_label(state, off);
                stack.push(profile.intern_frame(Frame::new(FrameKind::State, label)));
                sample.stack = profile.intern_stack(&stack);
                stack.pop();
                sample.state = state;
                sample.weight = weight;
                profile.add_sample(sample.clone());
            }
        } else {
            sample.stack = profile.intern_stack(&stack);
            profile.add_sample(sample);
        }
        self.scratch = stack;
    }

    /// The Python items of a capture with the profile's frame ids (in `py_scratch`'s buffer).
    fn py_items(
        &mut self,
        profile: &mut Profile,
        py: Option<&super::pyproc::PyStack>,
    ) -> Vec<PyItem<FrameId>> {
        let mut py_items = std::mem::take(&mut self.py_scratch);
        py_items.clear();
        for item in py.iter().flat_map(|p| &p.items) {
            py_items.push(match *item {
                PyItem::Frame(f) => {
                    PyItem::Frame(if let Some(id) = self.py_frames.get(f.0 as usize) {
                        *id
                    } else {
                        // Cannot happen (numbers travel before their first use); never guess.
                        *self.errors.entry("python_frame_index".into()).or_default() += 1;
                        profile.intern_frame(Frame::new(
                            FrameKind::Python,
                            super::pyproc::UNKNOWN_PY_FRAME,
                        ))
                    })
                }
                PyItem::Entry => PyItem::Entry,
            });
        }
        py_items
    }

    fn root_frame(&mut self, profile: &mut Profile, pid: u32, comm: &Arc<str>) -> FrameId {
        if let Some((c, id)) = self.roots.get(&pid)
            && c == comm
        {
            return *id;
        }
        let id = profile.intern_frame(Frame::new(FrameKind::Process, format!("{comm} ({pid})")));
        self.roots.insert(pid, (comm.clone(), id));
        id
    }

    fn thread_name(&mut self, tid: u32, comm: &str) -> Arc<str> {
        if let Some(n) = self.thread_names.get(&tid)
            && &**n == comm
        {
            return n.clone();
        }
        let n: Arc<str> = comm.into();
        self.thread_names.insert(tid, n.clone());
        n
    }

    /// Unwinds and symbolizes the native stack into `native_scratch` (innermost first, with
    /// eval-loop roles from `ranges`). Returns whether it was truncated.
    fn unwind(
        &mut self,
        profile: &mut Profile,
        registry: &mut ProcessRegistry,
        s: &crate::collect::RawSample,
        ranges: Option<&merge::EvalRanges>,
    ) -> bool {
        self.native_scratch.clear();
        if s.flags & sample_flags::KERNEL_THREAD != 0 {
            return false;
        }
        let Some(copy) = s.stack.as_ref().filter(|c| !c.bytes.is_empty()) else {
            self.count("no_user_stack");
            return false;
        };
        let native = self
            .unwinder
            .unwind(registry, s.pid, &s.regs, copy, MAX_NATIVE_FRAMES);
        if let Some(e) = &native.error {
            self.count(e.kind());
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
            *self.errors.entry("no_native_frames".into()).or_default() += 1;
        }
        native.truncated
    }

    fn push_kernel(
        &mut self,
        profile: &mut Profile,
        kernel: Option<&[u64]>,
        s: &crate::collect::RawSample,
        out: &mut Vec<FrameId>,
    ) {
        if s.kernel_stack_id < 0 {
            return; // user-mode sample: no kernel frames (not an error)
        }
        let Some(addrs) = kernel else {
            self.count("kernel_stack_missing");
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
