//! One Python process during `record`: its attached reader, the caches that make per-sample
//! work a hash lookup, and its counts for the per-process summary.
//!
//! Owns: [`PyProc`] (the [`PythonProcess`], a (executable, instr_ptr, tlbc_index) → frame
//! cache, a tid → thread-name cache) and its [`PyProcStats`].
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
/// Most cached thread names per process.
const MAX_THREAD_NAMES: usize = 4096;
/// Samples without a capture this soon after the attach are expected (taken before the
/// kernel knew the process); later ones are counted.
pub const CAPTURE_WARMUP: Duration = Duration::from_millis(200);
/// Least time between two thread-list reads of one process (for names of new threads).
const THREADS_EVERY: Duration = Duration::from_millis(100);
/// Lookups of a Python thread's `threading` name before its OS name is final.
const NAME_TRIES: u8 = 4;
/// Least time between two reads when a Python thread without a known name shows up: a
/// thread-per-request server's threads live for one request.
const UNKNOWN_THREAD_EVERY: Duration = Duration::from_millis(5);
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
    thread_names: Lru<u32, Arc<str>>,
    /// Threads named by their OS name while they ran Python: looked up again (tries so far).
    provisional: Lru<u32, u8>,
    threads_read_at: Option<Instant>,
    /// The short-name rule (from `sys.path`) and when it was read.
    short_names: Option<(ShortNames, Instant)>,
    sys_path_tried_at: Option<Instant>,
    /// Whether the target shares our pid namespace (known after the first name lookup).
    own_pidns: Option<bool>,
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
            thread_names: Lru::new(MAX_THREAD_NAMES),
            provisional: Lru::new(MAX_THREAD_NAMES),
            threads_read_at: None,
            short_names: None,
            sys_path_tried_at: None,
            own_pidns: None,
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

    /// The `threading` name of host thread `tid`, else its OS name. `python_thread` says
    /// whether the sample showed it running Python: then a name not known yet (a thread that
    /// just started, e.g. one per request) is looked up at once — every [`UNKNOWN_THREAD_EVERY`]
    /// at most — and again a few times while it only has its OS name. Lookups read thread
    /// lists and `threading._active` only; their failures (threads come and go while they
    /// read) are not sample errors and are not counted.
    pub fn thread_name(&mut self, tid: u32, python_thread: bool) -> Option<Arc<str>> {
        let now = Instant::now();
        let since = self.threads_read_at.map(|t| now.duration_since(t));
        let known = self.thread_names.get(&tid).cloned();
        let provisional = self.provisional.contains(&tid);
        let every = if known.is_none() && python_thread {
            UNKNOWN_THREAD_EVERY
        } else {
            THREADS_EVERY
        };
        let may_read = since.is_none_or(|s| s >= every);
        match known {
            Some(n) if !provisional || !may_read => return Some(n),
            _ => {}
        }
        if may_read {
            self.threads_read_at = Some(now);
            if let Ok(names) = self.process.thread_names() {
                let map = self.host_tid_map(!names.is_empty());
                for (native, name) in names {
                    let host = u32::try_from(native).ok().and_then(|n| match &map {
                        None => Some(n),
                        Some(m) => m.get(&n).copied(),
                    });
                    if let Some(h) = host {
                        self.thread_names.insert(h, name.into());
                        self.provisional.remove(&h);
                    }
                }
            }
            if !self.provisional.contains(&tid)
                && let Some(n) = self.thread_names.get(&tid)
            {
                return Some(n.clone());
            }
        }
        let os: Arc<str> = crate::python::os_thread_name(self.process.pid(), tid)?.into();
        self.thread_names.insert(tid, os.clone());
        let tries = self.provisional.peek(&tid).copied().unwrap_or(0) + 1;
        if !python_thread || tries >= NAME_TRIES {
            self.provisional.remove(&tid);
        } else {
            self.provisional.insert(tid, tries);
        }
        Some(os)
    }

    /// Native thread id (the target's pid namespace) → host tid: `None` when they are the
    /// same (the target shares our pid namespace), else the map from `/proc/PID/task/*/status`
    /// (read only then, and only when `needed`).
    fn host_tid_map(&mut self, needed: bool) -> Option<std::collections::HashMap<u32, u32>> {
        let pid = self.process.pid();
        let own = *self.own_pidns.get_or_insert_with(|| {
            crate::python::kernel::pid_namespace(pid).is_ok_and(|ns| ns == (0, 0))
        });
        (!own && needed).then(|| crate::python::host_tid_map(pid))
    }
}
