//! Per-sample stack building for `record`: raw sample → interned stack in the [`Profile`].
//!
//! Owns: the frame caches of a run — (pid, address) → frame for native frames, address →
//! frame for kernel frames, pid → root frame — and the per-run error counts of this stage.
//! Input: a [`RawSample`] and the process registry. Output: one [`Sample`] in the profile.
//!
//! Stack order in the profile is root first: `comm (pid)`, [thread], native user frames
//! (outermost first), kernel frames on top.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sampler_common::sample_flags;

use crate::collect::RawSample;
use crate::config::RecordConfig;
use crate::procs::ProcessRegistry;
use crate::profile::{Frame, FrameId, FrameKind, Profile, Sample};
use crate::symbolize::Symbolizer;
use crate::unwind::NativeUnwinder;

/// Maximum native frames per sample; deeper stacks are marked truncated.
pub const MAX_NATIVE_FRAMES: usize = 256;

/// Builds profile stacks from raw samples.
pub struct StackBuilder {
    native: bool,
    kernel: bool,
    threads: bool,
    unwinder: NativeUnwinder,
    symbolizer: Symbolizer,
    native_frames: HashMap<(u32, u64), FrameId>,
    kernel_frames: HashMap<u64, FrameId>,
    roots: HashMap<u32, (Arc<str>, FrameId)>,
    thread_names: HashMap<u32, Arc<str>>,
    errors: BTreeMap<String, u64>,
    scratch: Vec<FrameId>,
}

impl StackBuilder {
    /// A builder for one run.
    pub fn new(cfg: &RecordConfig) -> Self {
        StackBuilder {
            native: cfg.native,
            kernel: cfg.kernel,
            threads: cfg.threads,
            unwinder: NativeUnwinder::new(),
            symbolizer: Symbolizer::new(),
            native_frames: HashMap::new(),
            kernel_frames: HashMap::new(),
            roots: HashMap::new(),
            thread_names: HashMap::new(),
            errors: BTreeMap::new(),
            scratch: Vec::new(),
        }
    }

    /// Errors counted by this stage, by kind.
    pub fn errors(&self) -> &BTreeMap<String, u64> {
        &self.errors
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
    pub fn add(&mut self, profile: &mut Profile, registry: &mut ProcessRegistry, kernel: Option<&[u64]>, s: RawSample) {
        let thread_comm = comm_str(&s.comm);
        let comm: Arc<str> = match registry.get_or_load(s.pid) {
            Some(p) => p.comm.as_str().into(),
            None => {
                self.count("process_gone");
                // The main thread's comm is the process name; others' are thread names.
                thread_comm.as_str().into()
            }
        };
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        stack.push(self.root_frame(profile, s.pid, &comm));
        let thread_name = self.thread_name(s.tid, &thread_comm);
        if self.threads {
            stack.push(profile.intern_frame(Frame::new(FrameKind::Thread, format!("{thread_name} ({})", s.tid))));
        }
        if self.native {
            self.push_native(profile, registry, &s, &mut stack);
        }
        if self.kernel {
            self.push_kernel(profile, kernel, &s, &mut stack);
        }
        let id = profile.intern_stack(&stack);
        self.scratch = stack;
        profile.add_sample(Sample {
            stack: id,
            time_ns: s.time_ns,
            pid: s.pid,
            tid: s.tid,
            cpu: s.cpu,
            comm,
            thread_name,
        });
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
        match self.thread_names.get(&tid) {
            Some(n) if &**n == comm => n.clone(),
            _ => {
                let n: Arc<str> = comm.into();
                self.thread_names.insert(tid, n.clone());
                n
            }
        }
    }

    fn push_native(&mut self, profile: &mut Profile, registry: &mut ProcessRegistry, s: &RawSample, out: &mut Vec<FrameId>) {
        if s.flags & sample_flags::KERNEL_THREAD != 0 {
            return;
        }
        let Some(copy) = s.stack.as_ref().filter(|c| !c.bytes.is_empty()) else {
            self.count("no_user_stack");
            return;
        };
        let native = self.unwinder.unwind(registry, s.pid, &s.regs, copy, MAX_NATIVE_FRAMES);
        if let Some(e) = &native.error {
            self.count(e.kind());
        }
        let start = out.len();
        if native.truncated {
            out.push(profile.intern_frame(Frame::new(FrameKind::Marker, "[truncated]")));
        }
        let Some(proc) = registry.get(s.pid) else {
            return;
        };
        for f in native.frames.iter().rev() {
            let addr = f.lookup_address();
            let id = match self.native_frames.get(&(s.pid, addr)) {
                Some(id) => *id,
                None => {
                    let sym = self.symbolizer.native(proc, addr);
                    let mut frame = Frame::new(FrameKind::Native, sym.name.as_str());
                    frame.module = Some(sym.module.as_str().into());
                    frame.file = sym.file.as_deref().map(Into::into);
                    frame.line = sym.line;
                    let id = profile.intern_frame(frame);
                    self.native_frames.insert((s.pid, addr), id);
                    id
                }
            };
            out.push(id);
        }
        if out.len() == start {
            self.count("no_native_frames");
        }
    }

    fn push_kernel(&mut self, profile: &mut Profile, kernel: Option<&[u64]>, s: &RawSample, out: &mut Vec<FrameId>) {
        if s.kernel_stack_id < 0 {
            return; // user-mode sample: no kernel frames (not an error)
        }
        let Some(addrs) = kernel else {
            self.count("kernel_stack_missing");
            return;
        };
        for &addr in addrs.iter().rev() {
            let id = match self.kernel_frames.get(&addr) {
                Some(id) => *id,
                None => {
                    let sym = self.symbolizer.kernel(addr);
                    let id = profile.intern_frame(Frame::new(FrameKind::Kernel, sym.name.as_str()));
                    self.kernel_frames.insert(addr, id);
                    id
                }
            };
            out.push(id);
        }
    }
}

/// The NUL-terminated comm as a string (lossy).
pub fn comm_str(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}
