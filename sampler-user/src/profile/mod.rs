//! The profile model: interned frames and stacks plus per-sample metadata.
//!
//! Owns: [`Profile`]. Input: fully resolved stacks (root first) and the sample's metadata from
//! `record`. Output: read-only views for every output format (`output`), and later `report`,
//! pprof and the saved file — all render from this one model, so their counts agree.
//!
//! Frames and stacks are interned: a sample costs one stack id plus a few integers. Interning
//! happens once per unique stack; names are never recomputed per sample.
//!
//! Weights (`record --idle`): an off-CPU sample stands for as many sampling instants as fell in
//! its interval ([`Sample::weight`]); every count of every output is a sum of weights (a
//! CPU-clock sample weighs 1), so shares stay shares of wall-clock time.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::lru::{FastHasher, FastMap, FastSet};

/// What a frame stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// The synthetic root `comm (pid)` of every sample.
    Process,
    /// The synthetic `name (tid)` level added by `--threads`.
    Thread,
    /// A Python function.
    Python,
    /// A native user-space function.
    Native,
    /// A kernel function.
    Kernel,
    /// A marker such as `[truncated]` or `[unknown]`.
    Marker,
    /// The thread state that ends an off-CPU sample's stack (`[off-CPU: sleeping in futex]`,
    /// `record --idle`): shown by the flame graph and every stack output, skipped where a
    /// function is looked for (`report`'s keys, `top`'s rows).
    State,
}

/// One frame, as every output shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Kind of frame.
    pub kind: FrameKind,
    /// Function (or process / thread / marker) name.
    pub name: Arc<str>,
    /// Module (file basename) for native and kernel frames.
    pub module: Option<Arc<str>>,
    /// Source file, when known.
    pub file: Option<Arc<str>>,
    /// Python frames: `file` relative to the `sys.path` entry it was imported from
    /// (`sympy/core/expr.py`), when that is shorter (`python::syspath`).
    pub short_file: Option<Arc<str>>,
    /// Source line, when known.
    pub line: Option<u32>,
}

/// Which file names the outputs show: short by default (as py-spy does), whole with
/// `--full-filenames`. Saved profiles keep both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FileNames {
    /// A Python file relative to its `sys.path` entry.
    #[default]
    Short,
    /// The whole path.
    Full,
}

impl Frame {
    /// A frame with only a kind and a name.
    pub fn new(kind: FrameKind, name: impl Into<Arc<str>>) -> Self {
        Frame {
            kind,
            name: name.into(),
            module: None,
            file: None,
            short_file: None,
            line: None,
        }
    }

    /// The file name shown under `names`.
    pub fn display_file(&self, names: FileNames) -> Option<&str> {
        match names {
            FileNames::Short => self.short_file.as_deref().or(self.file.as_deref()),
            FileNames::Full => self.file.as_deref(),
        }
    }

    /// [`Frame::label_as`] with short file names.
    pub fn label(&self) -> String {
        self.label_as(FileNames::Short)
    }

    /// The label used in flame graphs and folded stacks: `function (file:line)` for Python,
    /// `name_[k]` for kernel frames (the FlameGraph convention that colours them), else the name.
    pub fn label_as(&self, names: FileNames) -> String {
        match (self.kind, self.display_file(names), self.line) {
            (FrameKind::Python, Some(f), Some(l)) => format!("{} ({f}:{l})", self.name),
            (FrameKind::Python, Some(f), None) => format!("{} ({f})", self.name),
            (FrameKind::Kernel, ..) => format!("{}_[k]", self.name),
            _ => self.name.to_string(),
        }
    }
}

/// Index of a frame in [`Profile::frames`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// Index of a stack in [`Profile::stacks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

/// Whether the sampled thread held the GIL (from the words the eBPF program read with the
/// sample's Python frames).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GilState {
    /// Not a Python sample, or the GIL words could not be read.
    #[default]
    Unknown,
    /// The thread held the GIL.
    Held,
    /// The GIL was free or held by another thread.
    Released,
    /// A free-threaded interpreter running without a GIL.
    Disabled,
}

impl GilState {
    /// Short lower-case name (`unknown`, `held`, `released`, `disabled`).
    pub fn as_str(self) -> &'static str {
        match self {
            GilState::Unknown => "unknown",
            GilState::Held => "held",
            GilState::Released => "released",
            GilState::Disabled => "disabled",
        }
    }
}

/// Where a thread was at a sample (`record --idle`; a plain run has only [`ThreadState::OnCpu`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ThreadState {
    /// Running on a CPU (every CPU-clock sample).
    #[default]
    #[serde(rename = "on-cpu")]
    OnCpu,
    /// Off a CPU but runnable: preempted, yielded, or woken and waiting for a CPU.
    #[serde(rename = "runnable")]
    Runnable,
    /// Off a CPU by its own choice, interruptibly: sleeping, waiting on a lock, a socket, a
    /// pipe, a child…
    #[serde(rename = "sleeping")]
    Sleeping,
    /// Off a CPU uninterruptibly (`D`): disk I/O, page faults, some kernel locks.
    #[serde(rename = "blocked")]
    Blocked,
    /// Off a CPU waiting for the GIL (GIL builds).
    #[serde(rename = "gil-wait")]
    GilWait,
}

impl ThreadState {
    /// Every state, in the order reports list them.
    pub const ALL: [ThreadState; 5] = [
        ThreadState::OnCpu,
        ThreadState::Runnable,
        ThreadState::Sleeping,
        ThreadState::Blocked,
        ThreadState::GilWait,
    ];

    /// The state's name in reports and options (`on-cpu`, `runnable`, `sleeping`, `blocked`,
    /// `gil-wait`).
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadState::OnCpu => "on-cpu",
            ThreadState::Runnable => "runnable",
            ThreadState::Sleeping => "sleeping",
            ThreadState::Blocked => "blocked",
            ThreadState::GilWait => "gil-wait",
        }
    }

    /// Parses a name of [`ThreadState::as_str`].
    pub fn parse(name: &str) -> Option<ThreadState> {
        ThreadState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether the thread was off a CPU.
    pub fn is_off_cpu(self) -> bool {
        self != ThreadState::OnCpu
    }
}

/// One sample: its stack and who/where/when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Interned stack, root first.
    pub stack: StackId,
    /// Kernel monotonic time of the sample, in ns.
    pub time_ns: u64,
    /// Process id (host view).
    pub pid: u32,
    /// Thread id (host view).
    pub tid: u32,
    /// CPU.
    pub cpu: u32,
    /// Process name.
    pub comm: Arc<str>,
    /// Thread name (the OS thread name, or the Python `threading` name where known).
    pub thread_name: Arc<str>,
    /// GIL state of the thread at the sample.
    pub gil: GilState,
    /// Where the thread was (on a CPU, or off it and why).
    pub state: ThreadState,
    /// Sampling instants this sample stands for: 1 for a CPU-clock sample, the number that
    /// fell in its interval for an off-CPU one.
    pub weight: u32,
}

/// Run metadata that every output can show.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RunMeta {
    /// Host name.
    pub host: String,
    /// Kernel release.
    pub kernel: String,
    /// Wall-clock start, seconds since the Unix epoch.
    pub start_unix_s: u64,
    /// Duration of sampling, in seconds.
    pub duration_s: f64,
    /// Sampling rate per CPU, in Hz.
    pub rate_hz: u64,
    /// Online CPUs sampled.
    pub cpus: usize,
    /// The profiler's command line.
    pub command_line: Vec<String>,
    /// Samples lost in the kernel (ring buffer full).
    pub lost_samples: u64,
    /// Errors by kind (counted, never silent).
    pub errors: BTreeMap<String, u64>,
    /// A wall-clock profile (`record --idle`): target threads were sampled off a CPU too.
    pub idle: bool,
}

/// Interned stacks with per-sample metadata.
#[derive(Debug, Default)]
pub struct Profile {
    frames: Vec<Frame>,
    frame_ids: FastMap<Frame, FrameId>,
    stacks: Vec<Box<[FrameId]>>,
    stack_ids: FastMap<Box<[FrameId]>, StackId>,
    samples: Vec<Sample>,
    /// Processes with samples (kept up to date: no scan of the samples per tick).
    pids: FastSet<u32>,
    /// Sum of the samples' weights.
    weight: u64,
    /// Run metadata.
    pub meta: RunMeta,
    /// Which file names the outputs show (a view setting, not saved).
    pub file_names: FileNames,
}

impl Profile {
    /// An empty profile.
    pub fn new(meta: RunMeta) -> Self {
        Profile {
            meta,
            ..Profile::default()
        }
    }

    /// Interns a frame.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        if let Some(id) = self.frame_ids.get(&frame) {
            return *id;
        }
        let id = FrameId(u32::try_from(self.frames.len()).expect("more than 4G unique frames"));
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// Interns a stack given root first.
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(id) = self.stack_ids.get(frames) {
            return *id;
        }
        let id = StackId(u32::try_from(self.stacks.len()).expect("more than 4G unique stacks"));
        let boxed: Box<[FrameId]> = frames.into();
        self.stacks.push(boxed.clone());
        self.stack_ids.insert(boxed, id);
        id
    }

    /// Adds a sample.
    pub fn add_sample(&mut self, sample: Sample) {
        self.pids.insert(sample.pid);
        self.weight += u64::from(sample.weight);
        self.samples.push(sample);
    }

    /// The samples' total weight (the number of samples for a run without `--idle`); what
    /// every share is a share of.
    pub fn total_weight(&self) -> u64 {
        self.weight
    }

    /// All samples in arrival order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Takes the samples added so far, keeping the interned frames and stacks (their ids stay
    /// valid): a live view (`top`) consumes samples as they come and stays bounded in memory.
    pub fn drain_samples(&mut self) -> Vec<Sample> {
        self.weight = 0;
        std::mem::take(&mut self.samples)
    }

    /// The frame behind an id.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.0 as usize]
    }

    /// All interned frames, indexable by `FrameId.0`.
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The frames of a stack, root first.
    pub fn stack(&self, id: StackId) -> &[FrameId] {
        &self.stacks[id.0 as usize]
    }

    /// All interned stacks (root first), indexable by `StackId.0`.
    pub fn stacks(&self) -> &[Box<[FrameId]>] {
        &self.stacks
    }

    /// A profile from its parts, as [`Profile::frames`], [`Profile::stacks`] and
    /// [`Profile::samples`] return them (the saved file), keeping every id: frame `i` gets
    /// `FrameId(i)`, stack `i` gets `StackId(i)`. Every index is checked, and frames and stacks
    /// must be unique (as interning keeps them).
    pub fn from_parts(
        meta: RunMeta,
        frames: Vec<Frame>,
        stacks: Vec<Box<[FrameId]>>,
        samples: Vec<Sample>,
    ) -> Result<Profile, PartsError> {
        if u32::try_from(frames.len()).is_err() || u32::try_from(stacks.len()).is_err() {
            return Err(PartsError::TooMany);
        }
        let mut frame_ids = FastMap::with_capacity_and_hasher(frames.len(), FastHasher::default());
        for (i, f) in frames.iter().enumerate() {
            if frame_ids.insert(f.clone(), FrameId(i as u32)).is_some() {
                return Err(PartsError::DuplicateFrame { frame: i });
            }
        }
        let mut stack_ids = FastMap::with_capacity_and_hasher(stacks.len(), FastHasher::default());
        for (i, s) in stacks.iter().enumerate() {
            if let Some(f) = s.iter().find(|f| f.0 as usize >= frames.len()) {
                return Err(PartsError::FrameOutOfRange {
                    stack: i,
                    frame: f.0,
                    frames: frames.len(),
                });
            }
            if stack_ids.insert(s.clone(), StackId(i as u32)).is_some() {
                return Err(PartsError::DuplicateStack { stack: i });
            }
        }
        if let Some((i, s)) = samples
            .iter()
            .enumerate()
            .find(|(_, s)| s.stack.0 as usize >= stacks.len())
        {
            return Err(PartsError::StackOutOfRange {
                sample: i,
                stack: s.stack.0,
                stacks: stacks.len(),
            });
        }
        let pids = samples.iter().map(|s| s.pid).collect();
        let weight = samples.iter().map(|s| u64::from(s.weight)).sum();
        Ok(Profile {
            frames,
            frame_ids,
            stacks,
            stack_ids,
            samples,
            pids,
            weight,
            meta,
            file_names: FileNames::default(),
        })
    }

    /// Sample weight per stack, in first-seen order of the stacks.
    pub fn stack_counts(&self) -> Vec<(StackId, u64)> {
        let mut counts = vec![0u64; self.stacks.len()];
        for s in &self.samples {
            counts[s.stack.0 as usize] += u64::from(s.weight);
        }
        counts
            .into_iter()
            .enumerate()
            .filter(|(_, c)| *c > 0)
            .map(|(i, c)| (StackId(i as u32), c))
            .collect()
    }

    /// Number of distinct processes with samples.
    pub fn process_count(&self) -> usize {
        self.pids.len()
    }

    /// Folded-stack lines (`a;b;c count`), sorted, as FlameGraph's stackcollapse tools print.
    /// `;` inside a label is replaced by `:` and line breaks by spaces, so every line parses.
    pub fn folded_lines(&self) -> Vec<String> {
        let mut agg: BTreeMap<String, u64> = BTreeMap::new();
        for (sid, count) in self.stack_counts() {
            let key = self
                .stack(sid)
                .iter()
                .map(|f| sanitize_label(&self.frame(*f).label_as(self.file_names)))
                .collect::<Vec<_>>()
                .join(";");
            *agg.entry(key).or_default() += count;
        }
        agg.into_iter().map(|(k, c)| format!("{k} {c}")).collect()
    }
}

/// Why [`Profile::from_parts`] refused its parts. Displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartsError {
    /// More frames or stacks than a 32-bit id can name.
    #[error("more than 2^32 frames or stacks")]
    TooMany,
    /// A frame equal to an earlier one.
    #[error("frame {frame} is a duplicate of an earlier frame")]
    DuplicateFrame {
        /// Its index.
        frame: usize,
    },
    /// A stack equal to an earlier one.
    #[error("stack {stack} is a duplicate of an earlier stack")]
    DuplicateStack {
        /// Its index.
        stack: usize,
    },
    /// A stack names a frame that does not exist.
    #[error("stack {stack} refers to frame {frame}, but there are {frames} frames")]
    FrameOutOfRange {
        /// The stack's index.
        stack: usize,
        /// The frame id it names.
        frame: u32,
        /// Number of frames.
        frames: usize,
    },
    /// A sample names a stack that does not exist.
    #[error("sample {sample} refers to stack {stack}, but there are {stacks} stacks")]
    StackOutOfRange {
        /// The sample's index.
        sample: usize,
        /// The stack id it names.
        stack: u32,
        /// Number of stacks.
        stacks: usize,
    },
}

/// Makes a label safe for the folded format (and so for the flame graph built from it): `;`
/// becomes `:`, every unsafe character ([`crate::printable::is_unsafe`]: ESC, BEL, CR, LF…)
/// `?`, so each sample stays on one line and no control character reaches a terminal or an
/// XML document.
pub fn sanitize_label(label: &str) -> String {
    label
        .chars()
        .map(|c| match c {
            ';' => ':',
            c if crate::printable::is_unsafe(c) => '?',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(p: &mut Profile, names: &[&str], pid: u32) {
        let ids: Vec<FrameId> = names
            .iter()
            .map(|n| p.intern_frame(Frame::new(FrameKind::Native, *n)))
            .collect();
        let stack = p.intern_stack(&ids);
        p.add_sample(Sample {
            stack,
            time_ns: 0,
            pid,
            tid: pid,
            cpu: 0,
            comm: "x".into(),
            thread_name: "x".into(),
            gil: GilState::Unknown,
            state: ThreadState::OnCpu,
            weight: 1,
        });
    }

    #[test]
    fn interning_dedups_frames_and_stacks() {
        let mut p = Profile::default();
        sample(&mut p, &["a", "b"], 1);
        sample(&mut p, &["a", "b"], 1);
        sample(&mut p, &["a", "c"], 2);
        assert_eq!(p.frames().len(), 3);
        assert_eq!(p.stack_counts(), vec![(StackId(0), 2), (StackId(1), 1)]);
        assert_eq!(p.process_count(), 2);
        assert_eq!(
            p.folded_lines(),
            vec!["a;b 2".to_string(), "a;c 1".to_string()]
        );
    }

    #[test]
    fn from_parts_keeps_ids_and_checks_indices() {
        let mut orig = Profile::default();
        sample(&mut orig, &["a", "b"], 1);
        sample(&mut orig, &["a", "c"], 2);
        let parts = || {
            (
                orig.meta.clone(),
                orig.frames().to_vec(),
                orig.stacks().to_vec(),
                orig.samples().to_vec(),
            )
        };
        let (meta, frames, stacks, samples) = parts();
        let copy = Profile::from_parts(meta, frames, stacks, samples).unwrap();
        assert_eq!(copy.frames(), orig.frames());
        assert_eq!(copy.stacks(), orig.stacks());
        assert_eq!(copy.samples(), orig.samples());
        assert_eq!(copy.folded_lines(), orig.folded_lines());

        let (meta, mut frames, stacks, samples) = parts();
        frames[2] = frames[0].clone();
        assert_eq!(
            Profile::from_parts(meta, frames, stacks, samples).unwrap_err(),
            PartsError::DuplicateFrame { frame: 2 }
        );
        let (meta, frames, mut stacks, samples) = parts();
        stacks[1] = vec![FrameId(0), FrameId(3)].into();
        assert_eq!(
            Profile::from_parts(meta, frames, stacks, samples).unwrap_err(),
            PartsError::FrameOutOfRange {
                stack: 1,
                frame: 3,
                frames: 3
            }
        );
        let (meta, frames, mut stacks, samples) = parts();
        stacks[1] = stacks[0].clone();
        assert_eq!(
            Profile::from_parts(meta, frames, stacks, samples).unwrap_err(),
            PartsError::DuplicateStack { stack: 1 }
        );
        let (meta, frames, stacks, mut samples) = parts();
        samples[1].stack = StackId(2);
        assert_eq!(
            Profile::from_parts(meta, frames, stacks, samples).unwrap_err(),
            PartsError::StackOutOfRange {
                sample: 1,
                stack: 2,
                stacks: 2
            }
        );
    }

    #[test]
    fn drain_samples_keeps_interned_ids() {
        let mut p = Profile::default();
        sample(&mut p, &["a", "b"], 1);
        let taken = p.drain_samples();
        assert_eq!(taken.len(), 1);
        assert!(p.samples().is_empty());
        sample(&mut p, &["a", "b"], 1);
        assert_eq!(p.samples()[0].stack, taken[0].stack);
        assert_eq!(p.frames().len(), 2);
    }

    #[test]
    fn labels_follow_conventions() {
        let mut f = Frame::new(FrameKind::Python, "Worker.run");
        f.file = Some("/a/w.py".into());
        f.line = Some(12);
        assert_eq!(f.label(), "Worker.run (/a/w.py:12)");
        assert_eq!(
            Frame::new(FrameKind::Kernel, "vfs_read").label(),
            "vfs_read_[k]"
        );
        assert_eq!(sanitize_label("a;b\nc\u{1b}[2J\u{7}"), "a:b?c?[2J?");
    }
}
