//! The data path of a sampling session on its one thread: drained batches in, the [`Profile`]
//! (and, when a `.pyebpf` is streamed, the timeline of the samples since the last chunk) out.
//!
//! Owns: the stages after the drain — the Python stage ([`PythonStage`]), the process registry,
//! the stack builder (unwind, symbolize, merge) — and the one place where process start and
//! exit are handled ([`Pipeline::process_event`]: the Python tracker, the registry, the
//! builder's caches, the `-p` targets still alive and the `-- COMMAND`'s exit all follow the
//! kernel's exec, exit and fork events there, in ring order with the samples).
//! Input: [`Input`] messages — a drained batch, an attach result, a wake-up — in the order
//! they arrive. Output: the profile's counts and the timeline.
//! Constraints: one thread, so nothing here is shared or locked; everything a stage caches is
//! bounded. The trade-off of one thread: a first symbolization of a very large library
//! (`--native`) delays the samples queued behind it, and a Python process that exits within
//! that time has those samples' frames resolved from its cache (counted when it misses); the
//! drain thread keeps emptying the ring meanwhile, so no sample is lost to it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::collect::{Event, RawSample};
use crate::failure::{Failures, PyFailure};
use crate::merge::EvalRangeIssue;
use crate::procs::ProcessRegistry;
use crate::profile::{Profile, Sample};

use super::drain::{Backlog, Batch, Drained, samples_in};
use super::latency::Latency;
use super::python::attach::Attached;
use super::python::{PythonStage, StageReport};
use super::stack::{StackBuilder, Staged};

/// How long after a Python process's attach its samples are flushed fast (see
/// [`super::drain::FAST_FLUSH`]): the first second or two of a process is where new code
/// objects appear and where short-lived processes end.
const YOUNG: Duration = Duration::from_secs(2);

/// A message to the pipeline.
pub enum Input {
    /// The samples and process events of one drain, in ring order.
    Batch(Batch),
    /// An attach finished.
    Attached(Attached),
    /// A stop signal arrived (the pipeline looks at the stop flag).
    Wake,
    /// The drain thread has ended (after its last batch).
    DrainEnded,
}

/// Which processes end the run when they are all gone.
#[derive(Debug, Default)]
pub struct Lifetimes {
    /// With `-p`: the targets (and with `-s` their descendants) not known to have exited.
    pub alive: Option<HashSet<u32>>,
    /// Follow forks of `alive` processes (`-s`).
    pub follow_forks: bool,
    /// The `-- COMMAND`'s pid, and whether its exit was seen.
    pub command: Option<(u32, bool)>,
}

impl Lifetimes {
    /// Whether every `-p` target has exited.
    pub fn targets_gone(&self) -> bool {
        self.alive.as_ref().is_some_and(HashSet::is_empty)
    }

    /// Whether the command's exit was seen.
    pub fn command_exited(&self) -> bool {
        self.command.is_some_and(|(_, exited)| exited)
    }
}

/// The session's data path.
pub struct Pipeline {
    python: PythonStage,
    builder: StackBuilder,
    registry: ProcessRegistry,
    /// Everything counted so far.
    pub profile: Profile,
    /// The samples since [`Self::take_timeline`], when kept.
    timeline: Option<Vec<Sample>>,
    /// The processes whose exit ends the run.
    pub lifetimes: Lifetimes,
    /// Samples built, and the time spent on them (`PYEBPF_STATS`).
    built: (u64, Duration),
    /// How long after it was taken each sample was built (`PYEBPF_STATS`).
    lag: Latency,
}

impl Pipeline {
    /// A pipeline adding to `profile`; `timeline`: keep each sample until it is taken.
    pub fn new(
        python: PythonStage,
        builder: StackBuilder,
        profile: Profile,
        timeline: bool,
        lifetimes: Lifetimes,
    ) -> Self {
        Pipeline {
            python,
            builder,
            registry: ProcessRegistry::new(),
            profile,
            timeline: timeline.then(Vec::new),
            lifetimes,
            built: (0, Duration::ZERO),
            lag: Latency::default(),
        }
    }

    /// The Python stage (start-up attaches, its waits).
    pub fn python(&mut self) -> &mut PythonStage {
        &mut self.python
    }

    /// The process registry (the start-up scan).
    pub fn registry(&mut self) -> &mut ProcessRegistry {
        &mut self.registry
    }

    /// The samples since the last call, in order (empty unless kept).
    pub fn take_timeline(&mut self) -> Vec<Sample> {
        self.timeline
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// When the pipeline has timed work (an attach retry, the end of an exit grace).
    pub fn next_due(&self) -> Option<Instant> {
        [self.python.tracker_ref().next_due(), self.python.open_due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Handles one message; a batch's samples are then off the drain's backlog.
    pub fn handle(&mut self, input: Input, backlog: &Backlog) {
        match input {
            Input::Batch(batch) => {
                let drained = samples_in(&batch);
                let t0 = Instant::now();
                // One clock read per batch: building a batch takes microseconds.
                let now_ns = super::idle::monotonic_ns();
                for item in batch {
                    match item {
                        Drained::Sample(raw, kernel) => {
                            self.sample(raw, kernel.as_deref(), now_ns);
                        }
                        Drained::Proc(ev) => self.process_event(&ev),
                    }
                }
                self.built.1 += t0.elapsed();
                backlog.done(drained);
            }
            Input::Attached(a) => {
                if a.result.is_ok() {
                    backlog.flush_fast_for(YOUNG);
                }
                self.python.tracker().accept(a);
            }
            Input::Wake | Input::DrainEnded => {}
        }
        self.tick();
    }

    /// Timed work: attach retries, exit graces, and with `--idle` the open off-CPU intervals
    /// about every second (a thread asleep for the whole run shows in `top` and in a streamed
    /// file, not only when it wakes).
    pub fn tick(&mut self) {
        let now = Instant::now();
        self.python.tracker().tick(now);
        if self.python.open_due().is_some_and(|due| now >= due) {
            self.account_open(false);
        }
        super::release_free_memory();
    }

    /// `--idle`: the open off-CPU intervals as samples, up to now (`last`: closed now).
    fn account_open(&mut self, last: bool) {
        for (raw, kernel) in self.python.account_open(last) {
            self.build(raw, kernel.as_deref());
        }
        self.python.open_accounted();
    }

    /// The one place where a process's start and end are handled, for every stage.
    pub fn process_event(&mut self, ev: &Event) {
        match ev {
            Event::Exec(p) => {
                // The exec's own time (the event may have waited in the ring).
                let ago = super::idle::monotonic_ns().saturating_sub(p.time_ns);
                let now = Instant::now();
                let exec = now.checked_sub(Duration::from_nanos(ago)).unwrap_or(now);
                self.python.tracker().on_exec(p.pid, exec);
                self.registry.on_exec(p.pid);
                self.builder.forget_process(p.pid);
            }
            Event::Exit(p) => {
                self.python.tracker().on_exit(p.pid);
                self.registry.on_exit(p.pid);
                self.builder.forget_process(p.pid);
                if let Some(alive) = self.lifetimes.alive.as_mut() {
                    alive.remove(&p.pid);
                }
                if let Some((pid, exited)) = self.lifetimes.command.as_mut()
                    && *pid == p.pid
                {
                    *exited = true;
                }
            }
            Event::Fork(p) => {
                self.python.tracker().on_fork(p.pid);
                self.registry.get_or_load(p.pid);
                if self.lifetimes.follow_forks
                    && let Some(alive) = self.lifetimes.alive.as_mut()
                    && alive.contains(&p.parent_pid)
                {
                    alive.insert(p.pid);
                }
            }
            Event::Sample(_) => {}
        }
    }

    /// One drained sample through the stages.
    /// `now_ns`: when its batch was taken up (`CLOCK_MONOTONIC`, the samples' clock).
    fn sample(&mut self, mut raw: RawSample, kernel: Option<&[u64]>, now_ns: u64) {
        if raw.off_cpu.is_none() {
            self.lag.add_ns(now_ns.saturating_sub(raw.time_ns));
        }
        if self.python.after_accounted(&mut raw) {
            self.build(raw, kernel);
        }
    }

    /// One sample through the stages.
    fn build(&mut self, mut raw: RawSample, kernel: Option<&[u64]>) {
        let Some(resolved) = self.python.resolve(&mut raw, &mut self.profile) else {
            return; // dropped by --gil
        };
        let staged = Staged {
            raw: &raw,
            kernel,
            py: resolved.py.as_ref(),
            interp: self.python.detected(raw.pid),
            thread_name: resolved.thread_name,
            gil: resolved.gil,
        };
        let timeline = &mut self.timeline;
        let issue = self.builder.add(
            &mut self.profile,
            &mut self.registry,
            &staged,
            &mut |s: &Sample| {
                if let Some(t) = timeline.as_mut() {
                    t.push(*s);
                }
            },
        );
        if let Some(issue) = issue {
            self.python.count(
                raw.pid,
                match issue {
                    EvalRangeIssue::Missing => PyFailure::EvalRangesMissing,
                    EvalRangeIssue::Incomplete => PyFailure::EvalRangesIncomplete,
                },
            );
        }
        self.built.0 += 1;
    }

    /// `--idle` at the end: the off-CPU intervals still open, closed now, as samples.
    pub fn flush_open_intervals(&mut self) {
        self.account_open(true);
    }

    /// The end of the run: the stages' reports.
    pub fn finish(self) -> Finished {
        let mut failures = self.builder.failures();
        failures.merge(&procs_failures(&self.registry));
        Finished {
            mismatches: self
                .builder
                .mismatches()
                .iter()
                .map(|(p, n)| (*p, *n))
                .collect(),
            python: self.python.report(),
            failures,
            built: self.built,
            lag: self.lag,
            profile: self.profile,
            timeline: self.timeline.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;

/// The registry's failures.
fn procs_failures(registry: &ProcessRegistry) -> Failures {
    let mut f = Failures::default();
    for (kind, n) in registry.error_counts() {
        f.add(crate::failure::Failure::Procs(kind), n);
    }
    f
}

/// What a finished pipeline hands back.
pub struct Finished {
    /// The profile.
    pub profile: Profile,
    /// The samples not taken yet (when kept).
    pub timeline: Vec<Sample>,
    /// The Python stage's report.
    pub python: StageReport,
    /// Merge mismatches by pid.
    pub mismatches: Vec<(u32, u64)>,
    /// The stack builder's and the registry's failures.
    pub failures: Failures,
    /// Samples built, and the time spent on the batches.
    pub built: (u64, Duration),
    /// How long after it was taken each sample was built.
    pub lag: Latency,
}
