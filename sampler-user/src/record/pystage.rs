//! The Python stage of `record`, on its own thread between the drain thread and the stack
//! builder: Python names are resolved as soon as a sample arrives, whatever the stack builder
//! is busy with (a first symbolization of a large library can take a second; a process that
//! lives 200 ms must not lose its names meanwhile).
//!
//! Owns: the [`Tracker`] (which pids are Python, `PY_PROCS`), the run's [`FrameTable`], the
//! `--gil` filter and the `--threads` names of Python threads.
//! Input: batches of [`Drained`] items. Output: one [`StagedBatch`] per input batch, items in
//! the same order, on a bounded channel (when it is full this thread waits; the drain thread
//! then counts drops, never silently). The thread sleeps until a batch comes, and wakes on a
//! short timer only while attaches are in flight or retries are due.
//! At the end: the off-CPU intervals still open (`--idle`: threads asleep when the run
//! stopped), closed at that time, as a last batch; the per-process stats.
//! Constraints: `--gil` keeps a sample only when its thread held the GIL at the sample
//! (`locked && last_holder == tstate`, read in the kernel at that instant); a process whose
//! runtime runs without a GIL is excluded entirely and reported once on stderr.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sampler_common::py_flags;

use crate::collect::{Event, PyCaptured, RawSample};
use crate::profile::{Frame, GilState};

use super::drain::{Batch, Drained, samples_in};
use super::pyproc::{PyProcStats, PyStack};
use super::pytrack::Tracker;

/// One sample with its Python part resolved.
pub struct StagedSample {
    /// The sample (its `python` capture taken out).
    pub raw: RawSample,
    /// Kernel stack, innermost first.
    pub kernel: Option<Vec<u64>>,
    /// The Python frames, for a sample of an attached Python process that carried a capture.
    pub py: Option<PyStack>,
    /// The Python `threading` name (or OS name) of the thread, with `--threads`.
    pub thread_name: Option<Arc<str>>,
    /// Python frames numbered since the previous item (indices continue the run's table).
    pub new_frames: Vec<Frame>,
    /// GIL state of the thread at the sample.
    pub gil: GilState,
}

/// One item for the stack builder.
pub enum Staged {
    /// A sample.
    Sample(StagedSample),
    /// A process event (after the stage acted on it).
    Proc(Event),
}

/// The staged items of one drained batch.
pub struct StagedBatch {
    /// In ring order (samples dropped by `--gil` left out).
    pub items: Vec<Staged>,
    /// Samples of the drained batch it came from (for the drain's backlog).
    pub drained: usize,
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
    /// Attach failures and stage-level failures by kind.
    pub errors: Vec<(&'static str, u64)>,
    /// The processes whose attach failed (not Python aside), by pid.
    pub skipped: Vec<super::pytrack::Skipped>,
    /// Samples handled, and the time spent on them.
    pub samples: u64,
    /// Total time spent per sample in this stage.
    pub busy: Duration,
}

/// Handle of the running stage.
pub struct PyStageHandle {
    handle: JoinHandle<StageReport>,
}

impl PyStageHandle {
    /// Waits for the stage to finish (after its input closed) and returns its report.
    pub fn finish(self) -> StageReport {
        self.handle.join().unwrap_or_default()
    }

    /// Whether the thread has ended.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// Starts the stage on `input` with `tracker` (which may already hold processes, and have
/// attaches in flight).
pub fn start(
    cfg: StageConfig,
    tracker: Tracker,
    input: Receiver<Batch>,
    capacity: usize,
) -> (PyStageHandle, Receiver<StagedBatch>) {
    let (tx, rx) = sync_channel(capacity);
    let handle = std::thread::Builder::new()
        .name("pyebpf-python".into())
        .spawn(move || {
            let mut stage = Stage {
                cfg,
                accounted: crate::lru::FastMap::default(),
                open_at: Instant::now(),
                keep_seed: false,
                tracker,
                table: super::pyproc::FrameTable::default(),
                errors: std::collections::BTreeMap::new(),
                samples: 0,
                busy: Duration::ZERO,
            };
            stage.run(&input, &tx);
            stage.report()
        })
        .expect("spawn python stage thread");
    (PyStageHandle { handle }, rx)
}

/// How often the open off-CPU intervals are accounted (`--idle`): a thread asleep for the whole
/// run shows in a live view and in a streamed file within about this long.
const OPEN_EVERY: Duration = Duration::from_secs(1);

struct Stage {
    cfg: StageConfig,
    /// `--idle`: host tid → (the open interval's `t_out`, accounted up to) by
    /// [`Stage::account_open`].
    accounted: crate::lru::FastMap<u32, (u64, u64)>,
    /// When the open intervals were last accounted.
    open_at: Instant,
    /// Resolving an open interval: a seeded stack stays for the rest of it.
    keep_seed: bool,
    tracker: Tracker,
    table: super::pyproc::FrameTable,
    errors: std::collections::BTreeMap<&'static str, u64>,
    samples: u64,
    busy: Duration,
}

impl Stage {
    fn run(&mut self, input: &Receiver<Batch>, tx: &SyncSender<StagedBatch>) {
        loop {
            // Attaches in flight or retries due: look at their results soon. Otherwise sleep
            // until the next batch (results are also taken then).
            let batch = if self.tracker.busy() {
                match input.recv_timeout(Duration::from_millis(5)) {
                    Ok(b) => Some(b),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return self.flush_open(tx),
                }
            } else if self.tracker.offcpu().is_some() {
                // --idle: wake for the open intervals even when no batch comes.
                match input.recv_timeout(OPEN_EVERY) {
                    Ok(b) => Some(b),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return self.flush_open(tx),
                }
            } else {
                match input.recv() {
                    Ok(b) => Some(b),
                    Err(_) => return self.flush_open(tx),
                }
            };
            self.tracker.tick(Instant::now());
            if self.open_at.elapsed() >= OPEN_EVERY && self.tracker.offcpu().is_some() {
                self.open_at = Instant::now();
                let items = self.account_open(false);
                if !items.is_empty() && tx.send(StagedBatch { items, drained: 0 }).is_err() {
                    return;
                }
            }
            let Some(batch) = batch else { continue };
            let drained = samples_in(&batch);
            let mut items = Vec::with_capacity(batch.len());
            let t0 = Instant::now();
            for item in batch {
                match item {
                    Drained::Sample(mut s, kernel) => {
                        self.samples += 1;
                        if !self.after_accounted(&mut s) {
                            continue;
                        }
                        if let Some(s) = self.sample(s, kernel) {
                            items.push(Staged::Sample(s));
                        }
                    }
                    Drained::Proc(ev) => {
                        match &ev {
                            Event::Exec(p) => self.tracker.on_exec(p.pid),
                            Event::Exit(p) => self.tracker.on_exit(p.pid),
                            Event::Fork(p) => self.tracker.on_fork(p.pid),
                            Event::Sample(_) => {}
                        }
                        items.push(Staged::Proc(ev));
                    }
                }
            }
            self.busy += t0.elapsed();
            if tx.send(StagedBatch { items, drained }).is_err() {
                return;
            }
        }
    }

    /// The end of a `--idle` run (the drain thread, and with it the collector and its programs,
    /// are gone: nothing writes `OFFCPU` any more): the intervals still open, closed now, as a
    /// last batch.
    fn flush_open(&mut self, tx: &SyncSender<StagedBatch>) {
        let items = self.account_open(true);
        if !items.is_empty() {
            let _ = tx.send(StagedBatch { items, drained: 0 });
        }
    }

    /// `--idle`: the intervals still open (a thread asleep for seconds), as samples up to now,
    /// each from where the previous call left it; `last`: the end of the run. The kernel
    /// sends such an interval whole at its switch-in; [`Self::after_accounted`] then keeps
    /// only what was not accounted here (the weight of `(a, b]` is the weight of `(a, m]` plus
    /// that of `(m, b]` on the sampling grid, so nothing is lost or counted twice).
    fn account_open(&mut self, last: bool) -> Vec<Staged> {
        let Some(map) = self.tracker.offcpu() else {
            return Vec::new();
        };
        let now = super::idle::monotonic_ns();
        let open = map.open_intervals(now);
        let mut items = Vec::with_capacity(open.len());
        for (mut raw, kernel) in open {
            let Some(off) = raw.off_cpu.as_mut() else {
                continue;
            };
            let t_out = off.t_out;
            let from = match self.accounted.get(&raw.tid) {
                Some(&(t, to)) if t == t_out => to,
                _ => t_out,
            };
            if !super::idle::clip(off, from) {
                continue;
            }
            raw.time_ns = off.t_out;
            if last {
                self.accounted.remove(&raw.tid);
            } else {
                self.accounted.insert(raw.tid, (t_out, now));
            }
            // The seeded stack stays for the rest of the interval.
            self.keep_seed = !last;
            if let Some(s) = self.sample(raw, kernel) {
                items.push(Staged::Sample(s));
            }
            self.keep_seed = false;
        }
        items
    }

    /// An interval the kernel sent whole: the part [`Self::account_open`] did not take
    /// already; `false` when nothing is left.
    fn after_accounted(&mut self, raw: &mut RawSample) -> bool {
        let Some(off) = raw.off_cpu.as_mut() else {
            return true;
        };
        match self.accounted.remove(&raw.tid) {
            Some((t_out, to)) if t_out == off.t_out => {
                let left = super::idle::clip(off, to);
                raw.time_ns = off.t_out;
                left
            }
            _ => true,
        }
    }

    fn count(&mut self, kind: &'static str) {
        *self.errors.entry(kind).or_default() += 1;
    }

    /// Resolves one sample; `None` when `--gil` drops it.
    fn sample(&mut self, mut raw: RawSample, kernel: Option<Vec<u64>>) -> Option<StagedSample> {
        let cap = raw.python.take();
        let (pid, tid) = (raw.pid, raw.tid);
        let gil = self.cfg.gil;
        let Some(proc) = self.tracker.get(pid) else {
            if cap.is_some() {
                // The kernel knew the pid but we no longer do (exec/exit race): no names.
                self.count("python_capture_unattached");
            }
            return (!gil).then(|| StagedSample {
                raw,
                kernel,
                py: None,
                thread_name: None,
                new_frames: self.table.take_new(),
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
            Some(proc.resolve(c, &mut self.table))
        } else if seeded {
            let stack = proc.seed_stack(tid, &mut self.table, !self.keep_seed);
            if stack.is_none() {
                proc.stats.count("offcpu_seed_missing");
            }
            stack
        } else {
            proc.stats.samples += 1;
            if proc.attached_at.elapsed() > super::pyproc::CAPTURE_WARMUP {
                proc.stats.count("no_capture");
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
        Some(StagedSample {
            raw,
            kernel,
            py,
            thread_name,
            new_frames: self.table.take_new(),
            gil: gil_state(cap.as_ref()),
        })
    }

    fn report(self) -> StageReport {
        let mut errors: Vec<(&'static str, u64)> = self
            .tracker
            .attach_errors
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        errors.extend(self.errors.iter().map(|(k, v)| (*k, *v)));
        let (samples, busy) = (self.samples, self.busy);
        let skipped = self.tracker.skipped();
        let (procs, overflow) = self.tracker.finish();
        StageReport {
            procs,
            overflow,
            errors,
            skipped,
            samples,
            busy,
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
fn gil_keep(pid: u32, proc: &mut super::pyproc::PyProc, cap: Option<&PyCaptured>) -> bool {
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
                proc.stats.count("gil_unknown");
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
