//! The Python stage of `record`: which processes are Python and what each sample's captured
//! frames are, resolved into the run's one frame table (the [`Profile`]'s).
//!
//! Owns: the [`Tracker`] (which pids are Python, `PY_PROCS`; attaches run on the [`attach`]
//! workers, whose results come back through the stage's input), each attached process
//! ([`process`]: its reader and caches, its counts), the `--gil` filter and the `--threads`
//! names of Python threads ([`names`], polled through the tracker's timed work).
//! Input: a drained sample (its [`RawSample`] with the kernel's capture), process events and
//! attach results, in the order the pipeline receives them. Output: [`Resolved`] — the Python
//! frames as profile frame ids (the stack builder merges them with native frames), the GIL
//! state and the thread name — and at the end the per-process stats ([`StageReport`]).
//! Constraints: runs on the pipeline's thread, a sample as soon as it is drained (a process
//! that exits keeps its names: its code objects are read while it lives); `--gil` keeps a
//! sample only when its thread held the GIL at the sample (`locked && last_holder == tstate`,
//! read in the kernel at that instant); a process whose runtime runs without a GIL is excluded
//! entirely and reported once on stderr.

pub mod attach;
mod names;
mod process;
#[cfg(test)]
mod process_tests;
mod tracker;
pub use tracker::Skipped;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sampler_common::py_flags;

use crate::collect::{PyCaptured, RawSample};
use crate::failure::{Failure, Failures, PyFailure};
use crate::lru::FastMap;
use crate::profile::{GilState, Profile};
use crate::python::Detected;

pub use process::{CAPTURE_WARMUP, INVALID_PY_FRAME, PyProc, PyProcStats, PyStack, SeedStack};
pub use tracker::Tracker;

/// A sample's Python part, resolved.
pub struct Resolved {
    /// The Python frames, for a sample of an attached Python process that carried a capture.
    pub py: Option<PyStack>,
    /// The Python `threading` name (or OS name) of the thread, with `--threads`.
    pub thread_name: Option<Arc<str>>,
    /// GIL state of the thread at the sample.
    pub gil: GilState,
}

/// What the stage needs from the run's configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct StageConfig {
    /// `--gil`.
    pub gil: bool,
    /// `--threads`.
    pub threads: bool,
}

/// What the stage reports at the end.
#[derive(Debug, Default)]
pub struct StageReport {
    /// Per Python process.
    pub procs: Vec<(u32, PyProcStats)>,
    /// Sum of the processes beyond the per-process bound.
    pub overflow: Option<PyProcStats>,
    /// Attach failures and stage-level failures.
    pub failures: Failures,
    /// The processes whose attach failed (not Python aside), by pid.
    pub skipped: Vec<tracker::Skipped>,
    /// From an exec to the attach of the Python process it started.
    pub exec_to_attach: crate::record::latency::Latency,
}

/// The Python stage.
pub struct PythonStage {
    cfg: StageConfig,
    tracker: Tracker,
    failures: Failures,
    /// `--idle`: host tid → (the open interval's `t_out`, accounted up to), by
    /// [`Self::account_open`].
    accounted: FastMap<u32, (u64, u64)>,
    /// When the open intervals were last accounted.
    open_at: Instant,
    /// Resolving an open interval: a seeded stack stays for the rest of it.
    keep_seed: bool,
}

/// How often the open off-CPU intervals are accounted (`--idle`): a thread asleep for the whole
/// run shows in a live view and in a streamed file within about this long.
const OPEN_EVERY: Duration = Duration::from_secs(1);

impl PythonStage {
    /// A stage over `tracker` (which may already hold processes, and have attaches in flight).
    pub fn new(cfg: StageConfig, tracker: Tracker) -> Self {
        PythonStage {
            cfg,
            tracker,
            failures: Failures::default(),
            accounted: FastMap::default(),
            open_at: Instant::now(),
            keep_seed: false,
        }
    }

    /// The tracker (process events, attach results, the start-up waits).
    pub fn tracker(&mut self) -> &mut Tracker {
        &mut self.tracker
    }

    /// The tracker, read-only.
    pub fn tracker_ref(&self) -> &Tracker {
        &self.tracker
    }

    /// The interpreter file of attached process `pid` (for the merge's eval-loop ranges).
    pub fn detected(&self, pid: u32) -> Option<&Detected> {
        self.tracker.peek(pid).map(|p| p.process.detected())
    }

    /// Counts a failure of process `pid`'s samples (the merge's, say).
    pub fn count(&mut self, pid: u32, kind: PyFailure) {
        if let Some(p) = self.tracker.peek_mut(pid) {
            p.stats.count(kind);
        }
    }

    /// Resolves one sample (its capture is taken out of `raw`) into `profile`'s frames;
    /// `None` when `--gil` drops it.
    pub fn resolve(&mut self, raw: &mut RawSample, profile: &mut Profile) -> Option<Resolved> {
        if self.cfg.threads {
            self.tracker.poll_names(Instant::now());
        }
        let cap = raw.python.take();
        let (pid, tid) = (raw.pid, raw.tid);
        let gil = self.cfg.gil;
        let Some(proc) = self.tracker.get(pid) else {
            if cap.is_some() {
                // The kernel knew the pid but we no longer do (exec/exit race): no names.
                self.failures.one(Failure::PythonCaptureUnattached);
            }
            return (!gil).then_some(Resolved {
                py: None,
                thread_name: None,
                gil: GilState::Unknown,
            });
        };
        if gil && !gil_keep(pid, proc, cap.as_ref()) {
            return None;
        }
        let seeded = raw
            .off_cpu
            .is_some_and(|o| o.flags & sampler_common::offcpu_flags::SEEDED != 0);
        let py = if let Some(c) = &cap {
            Some(proc.resolve(c, profile))
        } else if seeded {
            let stack = proc.seed_stack(tid, profile, !self.keep_seed);
            if stack.is_none() {
                proc.stats.count(PyFailure::OffCpuSeedMissing);
            }
            stack
        } else {
            proc.stats.samples += 1;
            if proc.attached_at.elapsed() > CAPTURE_WARMUP {
                proc.stats.count(PyFailure::NoCapture);
            }
            None
        };
        let running_python = seeded
            || cap
                .as_ref()
                .is_some_and(|c| c.flags & py_flags::CAPTURED != 0);
        let thread_name = if self.cfg.threads {
            proc.thread_name(tid, running_python)
        } else {
            None
        };
        let gil = gil_state(cap.as_ref());
        if proc.names_due().is_some() {
            self.tracker.poll_names_of(pid);
        }
        Some(Resolved {
            py,
            thread_name,
            gil,
        })
    }

    /// `--idle`: when the open intervals are next due to be accounted ([`Self::account_open`]).
    pub fn open_due(&self) -> Option<Instant> {
        self.tracker.offcpu().map(|_| self.open_at + OPEN_EVERY)
    }

    /// `--idle`: the intervals still open (a thread asleep for seconds), as samples up to now,
    /// each from where the previous call left it; `last`: the end of the run (the collector is
    /// gone: nothing writes `OFFCPU` any more). The kernel sends such an interval whole at its
    /// switch-in; [`Self::after_accounted`] then keeps only what was not accounted here (the
    /// weight of `(a, b]` is the weight of `(a, m]` plus that of `(m, b]` on the sampling grid,
    /// so nothing is lost or counted twice). Until the next call, a seeded stack resolved for
    /// them stays for the rest of its interval (unless `last`).
    pub fn account_open(&mut self, last: bool) -> Vec<(RawSample, Option<Vec<u64>>)> {
        self.open_at = Instant::now();
        self.keep_seed = !last;
        let Some(map) = self.tracker.offcpu() else {
            return Vec::new();
        };
        let now = crate::record::idle::monotonic_ns();
        let open = map.open_intervals(now);
        let mut out = Vec::with_capacity(open.len());
        for (mut raw, kernel) in open {
            let Some(off) = raw.off_cpu.as_mut() else {
                continue;
            };
            let t_out = off.t_out;
            let from = match self.accounted.get(&raw.tid) {
                Some(&(t, to)) if t == t_out => to,
                _ => t_out,
            };
            if !crate::record::idle::clip(off, from) {
                continue;
            }
            raw.time_ns = off.t_out;
            if last {
                self.accounted.remove(&raw.tid);
            } else {
                self.accounted.insert(raw.tid, (t_out, now));
            }
            out.push((raw, kernel));
        }
        out
    }

    /// The open intervals of [`Self::account_open`] are resolved: seeds are taken again.
    pub fn open_accounted(&mut self) {
        self.keep_seed = false;
    }

    /// An interval the kernel sent whole: the part [`Self::account_open`] did not take
    /// already; `false` when nothing is left.
    pub fn after_accounted(&mut self, raw: &mut RawSample) -> bool {
        let Some(off) = raw.off_cpu.as_mut() else {
            return true;
        };
        match self.accounted.remove(&raw.tid) {
            Some((t_out, to)) if t_out == off.t_out => {
                let left = crate::record::idle::clip(off, to);
                raw.time_ns = off.t_out;
                left
            }
            _ => true,
        }
    }

    /// The per-process stats and the stage's failures.
    pub fn report(self) -> StageReport {
        let mut failures = self.failures;
        for (k, n) in &self.tracker.attach_errors {
            failures.add(Failure::Attach(*k), *n);
        }
        let skipped = self.tracker.skipped();
        let exec_to_attach = self.tracker.exec_to_attach.clone();
        let (procs, overflow) = self.tracker.finish();
        StageReport {
            procs,
            overflow,
            failures,
            skipped,
            exec_to_attach,
        }
    }
}

/// The GIL state recorded with a sample, from the words captured with its Python frames.
fn gil_state(cap: Option<&PyCaptured>) -> GilState {
    match cap {
        Some(c) if c.flags & py_flags::CAPTURED != 0 => {
            if c.gil_enabled == 0 {
                GilState::Disabled
            } else if c.gil_locked < 0 {
                GilState::Unknown
            } else if c.gil_locked != 0 && c.gil_holder == c.tstate {
                GilState::Held
            } else {
                GilState::Released
            }
        }
        _ => GilState::Unknown,
    }
}

/// `--gil`: whether to keep a sample of Python process `proc` (reporting and excluding a
/// free-threaded process whose GIL is disabled, once).
fn gil_keep(pid: u32, proc: &mut PyProc, cap: Option<&PyCaptured>) -> bool {
    if proc.stats.gil_excluded {
        return false;
    }
    let disabled = match cap {
        Some(c) if c.gil_enabled >= 0 => c.gil_enabled == 0,
        // No capture yet: ask the reader once, when the process is free-threaded.
        _ => proc.process.version().free_threaded && proc.process.gil_enabled().is_ok_and(|e| !e),
    };
    if disabled {
        proc.stats.gil_excluded = true;
        eprintln!("pyebpf: --gil does not apply to PID {pid}: free-threaded, GIL disabled");
        return false;
    }
    let keep = match cap {
        Some(c) if c.flags & py_flags::CAPTURED != 0 => {
            if c.gil_locked < 0 {
                proc.stats.count(PyFailure::GilUnknown);
                false
            } else {
                c.gil_locked != 0 && c.gil_holder == c.tstate
            }
        }
        _ => false,
    };
    if !keep {
        proc.stats.samples += 1;
        proc.stats.gil_dropped += 1;
    }
    keep
}

/// Waits at most `timeout` for the attaches of `pids` to settle, taking every attach result
/// `next` yields meanwhile (the start of `-p`, before anything else flows).
pub fn wait_attached(
    tracker: &mut Tracker,
    pids: &[u32],
    timeout: Duration,
    mut next: impl FnMut(Duration) -> Option<attach::Attached>,
) {
    let deadline = std::time::Instant::now() + timeout;
    while tracker.attaching(pids) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        if let Some(a) = next(left) {
            tracker.accept(a);
        }
    }
}
