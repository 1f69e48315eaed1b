//! One Python process during `record`: its attached reader, the caches that make per-sample
//! work a hash lookup, and its counts for the per-process summary.
//!
//! Owns: [`PyProc`] (the [`PythonProcess`], a (executable, instr_ptr, tlbc_index) → frame
//! cache, its `--threads` names ([`ThreadNames`])) and its [`PyProcStats`].
//! Input: the frames the eBPF program captured for one sample ([`PyCaptured`]). Output: a
//! [`PyStack`] — frames innermost first as ids of the run's one frame table (the
//! [`Profile`]'s), entry frames kept as merge delimiters, the `__init__` shim dropped,
//! unresolvable frames as `[unknown python frame]`.
//! Constraints: resolution happens when the sample arrives (milliseconds after it was taken),
//! so a process that exits later keeps its names, and a code object freed meanwhile is
//! recognised by the identity the kernel recorded (never named after what lives at its
//! address now); every failure is counted by kind in [`PyProcStats`], once per sample (a
//! sample with three unreadable frames is one `memory_read`); caches are bounded ([`Lru`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sampler_common::{PyFrameRecord, py_flags};

use crate::collect::PyCaptured;
use crate::failure::PyFailure;
use crate::lru::{FastMap, Lru};
use crate::merge::PyItem;
use crate::profile::{Frame, FrameId, FrameKind, Profile};
use crate::python::code::CodeIdentity;

use super::names::ThreadNames;
use crate::python::layout::EntryRule;
use crate::python::syspath::ShortNames;
use crate::python::walker::{ChainItem, code_from_executable};
use crate::python::{ErrorCounts, ErrorKind, PyFrame, PythonProcess};

/// Label of a captured frame that could not be resolved.
pub const UNKNOWN_PY_FRAME: &str = "[unknown python frame]";
/// The marker below the frames of a sample whose walk stopped at an invalid frame.
pub const INVALID_PY_FRAME: &str = "[truncated: invalid python frame]";
/// Most cached (executable, instr_ptr, tlbc_index, code identity) keys per process.
const MAX_FRAME_KEYS: usize = 1 << 16;
/// Samples without a capture this soon after the attach are expected (taken before the
/// kernel knew the process); later ones are counted.
pub const CAPTURE_WARMUP: Duration = Duration::from_millis(200);
/// How often `sys.path` is read again (a program may change it; until the first read works,
/// file names are not shortened).
const SYS_PATH_EVERY: Duration = Duration::from_secs(5);

/// The Python part of one sample, for the stack builder.
#[derive(Clone, Debug, Default)]
pub struct PyStack {
    /// Innermost first; entry frames as [`PyItem::Entry`].
    pub items: Vec<PyItem<FrameId>>,
    /// The capture stopped at the frame cap, at a read error or at an invalid frame: outer
    /// frames are missing.
    pub truncated: bool,
    /// It stopped at an invalid frame (see `py_flags::INVALID_FRAME`).
    pub invalid: bool,
}

/// Counts of one Python process, for the summary.
#[derive(Clone, Debug, Default)]
pub struct PyProcStats {
    /// Process name at attach.
    pub comm: String,
    /// "3.12", "3.13t", …
    pub version: String,
    /// [`crate::python::RuntimeLayout::family`].
    pub family: &'static str,
    /// Samples of the process since it was attached.
    pub samples: u64,
    /// Samples whose whole Python stack was captured and resolved.
    pub full: u64,
    /// Samples cut at the frame cap.
    pub truncated: u64,
    /// Samples of threads without a thread state (not running Python).
    pub no_tstate: u64,
    /// Samples dropped by `--gil`.
    pub gil_dropped: u64,
    /// Excluded from a `--gil` run (free-threaded, GIL disabled).
    pub gil_excluded: bool,
    /// Samples with a failure, by kind (a sample counts once per kind).
    pub errors: BTreeMap<PyFailure, u64>,
}

impl PyProcStats {
    /// Counts one failure of `kind`.
    pub fn count(&mut self, kind: PyFailure) {
        *self.errors.entry(kind).or_default() += 1;
    }

    /// Adds what the reader counted between `before` and `after`.
    fn count_reader(&mut self, before: &ErrorCounts, after: &ErrorCounts) {
        for k in ErrorKind::ALL {
            if after.get(k) > before.get(k) {
                *self.errors.entry(PyFailure::Reader(k)).or_default() += 1;
            }
        }
    }

    /// Adds `b` into `self` (the bucket of the processes beyond the per-process bound).
    pub fn merge(&mut self, b: &PyProcStats) {
        self.samples += b.samples;
        self.full += b.full;
        self.truncated += b.truncated;
        self.no_tstate += b.no_tstate;
        self.gil_dropped += b.gil_dropped;
        for (k, v) in &b.errors {
            *self.errors.entry(*k).or_default() += v;
        }
    }
}

/// The Python stack of a thread found off a CPU when its process was attached (`--idle`), as
/// the reader walked it then: it is the stack of its first off-CPU interval.
#[derive(Clone, Debug)]
pub struct SeedStack {
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    /// The chain with its entry frames.
    pub items: Vec<ChainItem>,
    /// The walk was cut.
    pub truncated: bool,
}

/// An attached Python process.
pub struct PyProc {
    /// The reader.
    pub process: PythonProcess,
    /// Counts for the summary.
    pub stats: PyProcStats,
    /// When it was attached (and announced to the kernel).
    pub attached_at: Instant,
    /// When its exit was seen (caches are dropped a little later).
    pub exited_at: Option<Instant>,
    /// Which frames end an eval-loop activation (owners, `is_entry`, or every frame).
    entry: EntryRule,
    /// `_PyStackRef` tag bits of `f_executable`.
    tag_mask: u64,
    /// 3.15+: every chain ends in the thread state's embedded base frame (owner 3, not an
    /// eval-loop activation).
    has_base_frame: bool,
    /// (executable, instr_ptr, tlbc_index, code identity) → frame (`None`: the shim).
    frames: Lru<(u64, u64, i32, CodeIdentity), Option<FrameId>>,
    /// `--idle`: threads seeded off a CPU (host tid → stack), until their first interval.
    pub seeds: FastMap<u32, SeedStack>,
    /// `--threads` names.
    names: ThreadNames,
    /// The short-name rule (from `sys.path`) and when it was read.
    short_names: Option<(ShortNames, Instant)>,
    sys_path_tried_at: Option<Instant>,
}

/// Why a captured frame could not be resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// `f_executable` was NULL or a tagged non-pointer.
    BadExecutable,
    /// The reader failed (and counted why).
    Unresolved,
}

/// `_Py_InitCleanup`, the `__init__` shim of 3.13+ (docs/cpython-layouts.md §3.4): dropped.
fn is_init_shim(f: &PyFrame) -> bool {
    f.first_line == 0 && f.line == -1 && f.function == "__init__" && f.file == "__init__"
}

fn python_frame(f: PyFrame, short_file: Option<String>) -> Frame {
    let mut frame = Frame::new(FrameKind::Python, f.function);
    frame.file = Some(f.file.into());
    frame.short_file = short_file.map(Into::into);
    frame.line = u32::try_from(f.line).ok();
    frame
}

impl PyProc {
    /// Wraps an attached process.
    pub fn new(process: PythonProcess, comm: String) -> Self {
        let l = process.layout();
        let stats = PyProcStats {
            comm,
            version: l.version.short(),
            family: l.family(),
            ..PyProcStats::default()
        };
        PyProc {
            entry: l.frame.entry,
            tag_mask: l.frame.stackref_tag_mask,
            has_base_frame: l.table.iter().any(|(n, _)| *n == "thread_state.base_frame"),
            process,
            stats,
            attached_at: Instant::now(),
            exited_at: None,
            frames: Lru::new(MAX_FRAME_KEYS),
            seeds: FastMap::default(),
            names: ThreadNames::default(),
            short_names: None,
            sys_path_tried_at: None,
        }
    }

    /// The short form of `file` (see `python::syspath`), reading `sys.path` when it is due.
    fn short_file(&mut self, file: &str) -> Option<String> {
        let now = Instant::now();
        let stale = self
            .short_names
            .as_ref()
            .is_none_or(|(_, at)| now.duration_since(*at) >= SYS_PATH_EVERY);
        let due = self
            .sys_path_tried_at
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if stale && due {
            self.sys_path_tried_at = Some(now);
            if let Ok(path) = self.process.sys_path() {
                let root = format!("/proc/{}/root", self.process.pid()).into();
                self.short_names = Some((ShortNames::new(&path, Some(root)), now));
            }
        }
        self.short_names.as_mut()?.0.short(file)
    }

    /// Resolves one captured stack, its frames interned in `profile`.
    pub fn resolve(&mut self, cap: &PyCaptured, profile: &mut Profile) -> PyStack {
        self.stats.samples += 1;
        let invalid = cap.flags & py_flags::INVALID_FRAME != 0;
        let mut out = PyStack {
            items: Vec::with_capacity(cap.frames.len()),
            truncated: invalid || cap.flags & (py_flags::TRUNCATED | py_flags::READ_ERROR) != 0,
            invalid,
        };
        if cap.flags & py_flags::NO_TSTATE != 0 {
            self.stats.no_tstate += 1;
            return out;
        }
        if cap.flags & py_flags::CAPTURED == 0 {
            self.stats.count(PyFailure::NotCaptured);
            return out;
        }
        if cap.flags & py_flags::TRUNCATED != 0 {
            self.stats.truncated += 1;
        }
        if cap.flags & py_flags::READ_ERROR != 0 {
            self.stats.count(PyFailure::KernelReadError);
        }
        if invalid {
            self.stats.count(PyFailure::InvalidFrame);
            if cap.flags & py_flags::CODE_UNREADABLE != 0 {
                self.stats.count(PyFailure::CodeUnreadable);
            }
        }
        // Reader failures are counted once per sample and kind, after the walk.
        let before = self.process.error_counts().clone();
        let (mut unknown, mut bad_executable) = (false, false);
        for rec in &cap.frames {
            if matches!(self.entry, EntryRule::OwnerAtLeast(n) if rec.owner >= n) {
                out.items.push(PyItem::Entry);
                continue;
            }
            match self.frame(rec, profile) {
                Ok(Some(i)) => out.items.push(PyItem::Frame(i)),
                Ok(None) => {} // the `__init__` shim
                Err(failure) => {
                    unknown = true;
                    bad_executable |= failure == Failure::BadExecutable;
                    out.items.push(PyItem::Frame(
                        profile.intern_frame(Frame::new(FrameKind::Python, UNKNOWN_PY_FRAME)),
                    ));
                }
            }
            // ≤ 3.11 has no entry frames: the outermost frame of each activation ends it
            // (every frame up to 3.10; the one with `is_entry` set in 3.11).
            let ends = match self.entry {
                EntryRule::EveryFrame => true,
                EntryRule::EntryFlag => rec.is_entry != 0,
                EntryRule::OwnerAtLeast(_) => false,
            };
            if ends {
                out.items.push(PyItem::Entry);
            }
        }
        self.stats
            .count_reader(&before, self.process.error_counts());
        if bad_executable {
            self.stats
                .count(PyFailure::Reader(ErrorKind::BadExecutable));
        }
        // 3.15: a complete chain ends in the base frame right after the outermost entry frame;
        // it belongs to no activation.
        if self.has_base_frame
            && !out.truncated
            && matches!(out.items[..], [.., PyItem::Entry, PyItem::Entry])
        {
            out.items.pop();
        }
        let has_frames = out.items.iter().any(|i| matches!(i, PyItem::Frame(_)));
        if !out.truncated && !unknown && has_frames {
            self.stats.full += 1;
        }
        out
    }

    /// The stack of host thread `tid` as seeded (`--idle`): its first off-CPU interval began
    /// before the kernel saw it. `take`: that interval ends here (the seed is dropped).
    pub fn seed_stack(&mut self, tid: u32, profile: &mut Profile, take: bool) -> Option<PyStack> {
        let seed = if take {
            self.seeds.remove(&tid)?
        } else {
            self.seeds.get(&tid)?.clone()
        };
        self.stats.samples += 1;
        let mut out = PyStack {
            items: Vec::with_capacity(seed.items.len()),
            truncated: seed.truncated,
            invalid: false,
        };
        for item in &seed.items {
            match item {
                ChainItem::Entry => out.items.push(PyItem::Entry),
                ChainItem::Frame(i) => {
                    if let Some(f) = seed.frames.get(*i as usize).filter(|f| !is_init_shim(f)) {
                        let short = self.short_file(&f.file);
                        out.items.push(PyItem::Frame(
                            profile.intern_frame(python_frame(f.clone(), short)),
                        ));
                    }
                }
            }
        }
        if out.truncated {
            self.stats.truncated += 1;
        } else {
            self.stats.full += 1;
        }
        Some(out)
    }

    /// The frame of one captured record: `Ok(None)` for the shim, `Err` when unresolvable
    /// (the reader counted why, unless it is [`Failure::BadExecutable`]).
    fn frame(
        &mut self,
        rec: &PyFrameRecord,
        profile: &mut Profile,
    ) -> Result<Option<FrameId>, Failure> {
        let id = CodeIdentity {
            name: rec.name,
            filename: rec.filename,
            first_line: rec.first_line,
            globals: rec.globals,
        };
        let key = (rec.executable, rec.instr_ptr, rec.tlbc_index, id);
        if let Some(hit) = self.frames.get(&key) {
            return Ok(*hit);
        }
        let Some(code) = code_from_executable(rec.executable, self.tag_mask) else {
            return Err(Failure::BadExecutable);
        };
        // Failures are not cached: a code object being created or a racing read may succeed
        // next time, and they are rare.
        let frame = self
            .process
            .resolve_sampled_frame(code, rec.instr_ptr, rec.tlbc_index, id)
            .map_err(|e| {
                tracing::debug!(
                    "pid {}: frame of code {code:#x} ({id:x?}) unresolved: {e}",
                    self.process.pid()
                );
                Failure::Unresolved
            })?;
        let value = if is_init_shim(&frame) {
            None
        } else {
            let short = self.short_file(&frame.file);
            Some(profile.intern_frame(python_frame(frame, short)))
        };
        self.frames.insert(key, value);
        Ok(value)
    }

    /// The `threading` name of host thread `tid`, else its OS name (see [`ThreadNames::name`]).
    pub fn thread_name(&mut self, tid: u32, python_thread: bool) -> Option<Arc<str>> {
        self.names.name(&mut self.process, tid, python_thread)
    }

    /// When the thread names of this process are next polled (`None`: not polled; never
    /// after its exit).
    pub fn names_due(&self) -> Option<Instant> {
        if self.exited_at.is_some() {
            return None;
        }
        self.names.due()
    }

    /// Polls the thread names when due.
    pub fn poll_names(&mut self, now: Instant) {
        if self.exited_at.is_none() {
            self.names.poll(&mut self.process, now);
        }
    }
}
