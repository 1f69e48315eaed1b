//! The profile model: interned frames, stacks and names, and the samples aggregated by who and
//! where they were ([`SampleKey`]), with their counts and weights.
//!
//! Owns: [`Profile`] (in [`model`]) and the types every stage and output shares: [`Frame`],
//! [`FrameId`], [`StackId`], [`NameId`], [`SampleKey`], [`Sample`], [`GilState`],
//! [`ThreadState`], [`RunMeta`]. Input: fully resolved stacks (root first) and each sample's
//! key from `record` (or from a saved file). Output: read-only views for every output format
//! (`output`), `report`, `top` and the saved file — all render from this one model, so their
//! counts agree.
//!
//! Memory follows unique things, not samples: frames, stacks and names are interned once (and
//! stored once: the index that finds them holds ids, not copies); a sample adds to the counts
//! of its key (stack, process, thread, names, GIL state, thread state), so a long run costs
//! what its distinct stacks and threads cost. Each process is its own `comm (pid)` root, so on
//! a host with process churn every process sampled adds its root, its stacks and its keys
//! (measured in docs/benchmarks.md); the other stages drop what they keep per process when it
//! exits, or bound it. The per-sample timeline (time and CPU of each sample) is not kept:
//! `record` streams it to a `.pyebpf` output as it goes, and a saved file's loader keeps it
//! only when asked ([`Profile::timeline`], for `script` and for writing the saved format
//! again).
//!
//! Weights (`record --idle`): an off-CPU sample stands for as many sampling instants as fell in
//! its interval ([`Sample::weight`]); every count of every output is a sum of weights (a
//! CPU-clock sample weighs 1), so shares stay shares of wall-clock time.

mod model;

use std::sync::Arc;

use crate::failure::Failures;

pub use model::{Counts, PartsError, Profile};

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

/// Index of a process or thread name in [`Profile::names`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameId(pub u32);

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

/// Who and where a sample was: what the profile counts samples under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Interned stack, root first.
    pub stack: StackId,
    /// Process id (host view).
    pub pid: u32,
    /// Thread id (host view).
    pub tid: u32,
    /// Process name.
    pub comm: NameId,
    /// Thread name (the OS thread name, or the Python `threading` name where known).
    pub thread: NameId,
    /// GIL state of the thread at the sample.
    pub gil: GilState,
    /// Where the thread was (on a CPU, or off it and why).
    pub state: ThreadState,
}

/// One sample: its key and when and where it was taken (an element of the timeline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// What it is counted under.
    pub key: SampleKey,
    /// Kernel monotonic time of the sample, in ns.
    pub time_ns: u64,
    /// CPU.
    pub cpu: u32,
    /// Sampling instants this sample stands for: 1 for a CPU-clock sample, the number that
    /// fell in its interval for an off-CPU one.
    pub weight: u32,
}

/// A sample with its names spelled out, for tests that build profiles by hand
/// ([`Profile::add_sample`]).
#[cfg(test)]
#[derive(Clone, Debug)]
pub(crate) struct NamedSample {
    pub stack: StackId,
    pub time_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: Arc<str>,
    pub thread_name: Arc<str>,
    pub gil: GilState,
    pub state: ThreadState,
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
    /// Failures by kind (counted, never silent).
    pub errors: Failures,
    /// A wall-clock profile (`record --idle`): target threads were sampled off a CPU too.
    pub idle: bool,
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
