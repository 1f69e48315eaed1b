//! The numbers behind `top`: per refresh window and accumulated since the start (or the last
//! reset), per function and per process.
//!
//! Owns: [`Aggregator`] (the running counts, indexed by the profile's interned frame ids) and
//! the [`Snapshot`] it hands the view after each window. Input: the counts taken from the
//! [`Profile`] since the last refresh ([`Profile::take_counts`]; frames, stacks and names stay
//! interned, so ids are stable). Output: rows with self ("own") and total counts per function,
//! and per process the sample count and its hottest Python function.
//!
//! A function row is one interned frame, that is a function at a line (as py-spy top shows
//! it). A sample counts once as "own" for its leaf frame and once as "total" for every
//! distinct frame of its stack (recursion counts once). A sample with no frame below its
//! process (a thread not running Python, without `--native`) counts for a
//! `comm (pid) [no Python frames]` row, so the percentages of the function view are shares of
//! every sample taken. Memory stays bounded by the interned frames and by forgetting
//! processes that have not been sampled for [`PROC_LINGER`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::profile::{
    Counts, FileNames, Frame, FrameId, FrameKind, Profile, SampleKey, ThreadState,
};

/// A process that has not been sampled for this long leaves the process view.
pub const PROC_LINGER: Duration = Duration::from_secs(30);

/// What a function row shows: the name, and where it is (`file:line`, a module, `kernel`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Label {
    /// Function name (or `comm (pid) [no Python frames]`, or a marker).
    pub name: Arc<str>,
    /// `file:line` for Python, the module for native frames, `kernel`; empty when none.
    pub location: Arc<str>,
}

impl Label {
    /// The label of an interned frame, with control characters replaced (frame names come
    /// from the profiled processes: they must not reach the terminal as escape sequences).
    pub fn of(frame: &Frame) -> Label {
        let location = match frame.kind {
            // Short file names, as py-spy's top shows them.
            FrameKind::Python => match (frame.display_file(FileNames::Short), frame.line) {
                (Some(f), Some(l)) => format!("{f}:{l}"),
                (Some(f), None) => f.to_string(),
                _ => String::new(),
            },
            FrameKind::Native => frame.module.as_deref().unwrap_or_default().to_string(),
            FrameKind::Kernel => "kernel".to_string(),
            FrameKind::Process | FrameKind::Thread | FrameKind::Marker | FrameKind::State => {
                String::new()
            }
        };
        let name = match frame.kind {
            FrameKind::Process | FrameKind::Thread => {
                format!("{} [no Python frames]", frame.name)
            }
            _ => frame.name.to_string(),
        };
        Label {
            name: clean(&name).into(),
            location: clean(&location).into(),
        }
    }

    /// `name (location)`, or the name alone.
    pub fn text(&self) -> String {
        if self.location.is_empty() {
            self.name.to_string()
        } else {
            format!("{} ({})", self.name, self.location)
        }
    }
}

/// `s` made printable ([`crate::printable`]).
pub fn clean(s: &str) -> String {
    crate::printable::printable(s).into_owned()
}

/// One row of the function view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncRow {
    /// What the row is.
    pub label: Label,
    /// Samples of the window with this frame as leaf.
    pub own: u64,
    /// Samples of the window with this frame anywhere in the stack.
    pub total: u64,
    /// `own`, accumulated since the start or the last reset.
    pub own_acc: u64,
    /// `total`, accumulated since the start or the last reset.
    pub total_acc: u64,
    /// `own_acc` by thread state (`ThreadState::ALL` order): with `--idle`, where the
    /// function's own time was spent.
    pub states_acc: [u64; 5],
}

impl FuncRow {
    /// The state most of the row's own time was spent in, and its share in percent
    /// (`None` without own samples).
    pub fn main_state(&self) -> Option<(ThreadState, f64)> {
        let own: u64 = self.states_acc.iter().sum();
        let (i, n) = self
            .states_acc
            .iter()
            .enumerate()
            .max_by_key(|(i, n)| (**n, std::cmp::Reverse(*i)))?;
        (own > 0).then(|| (ThreadState::ALL[i], *n as f64 * 100.0 / own as f64))
    }
}

/// One row of the process view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRow {
    /// Host pid.
    pub pid: u32,
    /// Process name (control characters replaced).
    pub comm: String,
    /// Samples of the window.
    pub samples: u64,
    /// Samples since the start or the last reset.
    pub samples_acc: u64,
    /// The Python function most often innermost in its Python stacks (this window, else the
    /// last window where it ran Python).
    pub hottest: Option<Label>,
}

/// Everything the view shows after one refresh window.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Time since sampling began, at the end of the window.
    pub elapsed: Duration,
    /// Length of the window.
    pub window: Duration,
    /// Samples in the window.
    pub samples: u64,
    /// Samples lost so far.
    pub lost_samples: u64,
    /// Processes with Python frames in the window.
    pub python_procs: usize,
    /// Sampling rate per CPU.
    pub rate_hz: u64,
    /// CPUs sampled.
    pub cpus: usize,
    /// Every function with samples since the start (or reset), unsorted.
    pub funcs: Vec<FuncRow>,
    /// Every process sampled in the last [`PROC_LINGER`], unsorted.
    pub procs: Vec<ProcRow>,
    /// Whether a window has been aggregated yet.
    pub ready: bool,
    /// A wall-clock session (`--idle`): samples off a CPU too, and the State column.
    pub idle: bool,
}

impl Snapshot {
    /// Samples per second in the window.
    pub fn samples_per_s(&self) -> f64 {
        per_second(self.samples, self.window)
    }

    /// CPU use of a process in the window, in percent of one CPU: its samples over the
    /// samples one always-running thread would give (`rate_hz` × window seconds).
    pub fn cpu_percent(&self, samples: u64) -> f64 {
        let expected = self.rate_hz as f64 * self.window.as_secs_f64();
        if expected > 0.0 {
            samples as f64 * 100.0 / expected
        } else {
            0.0
        }
    }

    /// CPU seconds that `samples` samples stand for.
    pub fn seconds(&self, samples: u64) -> f64 {
        if self.rate_hz == 0 {
            0.0
        } else {
            samples as f64 / self.rate_hz as f64
        }
    }

    /// `part` in percent of the window's samples.
    pub fn percent(&self, part: u64) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            part as f64 * 100.0 / self.samples as f64
        }
    }
}

fn per_second(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// Running counts of a process.
#[derive(Debug)]
struct ProcAcc {
    comm: Arc<str>,
    samples_acc: u64,
    last_seen: Duration,
    hottest: Option<FrameId>,
}

/// Counts of one window besides the per-frame ones.
#[derive(Debug, Default)]
struct WindowCounts {
    /// When the window ends (time since the start).
    end: Duration,
    per_proc: HashMap<u32, u64>,
    /// (pid, innermost Python frame) → samples.
    innermost_py: HashMap<(u32, FrameId), u64>,
    python_pids: HashSet<u32>,
}

/// The running counts of a `top` session.
#[derive(Debug, Default)]
pub struct Aggregator {
    /// Per frame id: accumulated own / total samples.
    own_acc: Vec<u64>,
    total_acc: Vec<u64>,
    /// Per frame id, cached.
    labels: Vec<Option<Label>>,
    procs: HashMap<u32, ProcAcc>,
    /// Per frame id, scratch of one window.
    own: Vec<u64>,
    total: Vec<u64>,
    /// Per frame id: the last sample (1-based, in the window) that counted it as total.
    seen: Vec<u32>,
    /// Per frame id: accumulated own samples by thread state.
    states_acc: Vec<[u64; 5]>,
}

impl Aggregator {
    /// Forgets the accumulated counts (the window counts restart with the next window).
    pub fn reset(&mut self) {
        self.own_acc.iter_mut().for_each(|c| *c = 0);
        self.total_acc.iter_mut().for_each(|c| *c = 0);
        self.states_acc.iter_mut().for_each(|c| *c = [0; 5]);
        self.procs.clear();
    }

    fn grow(&mut self, frames: usize) {
        if self.own.len() < frames {
            self.own.resize(frames, 0);
            self.total.resize(frames, 0);
            self.seen.resize(frames, 0);
            self.own_acc.resize(frames, 0);
            self.total_acc.resize(frames, 0);
            self.states_acc.resize(frames, [0; 5]);
            self.labels.resize(frames, None);
        }
    }

    fn label(&mut self, profile: &Profile, id: FrameId) -> Label {
        let slot = &mut self.labels[id.0 as usize];
        slot.get_or_insert_with(|| Label::of(profile.frame(id)))
            .clone()
    }

    /// Counts the samples of one key (the `mark`-th of its window) into the window and the
    /// totals, by their weight. The state frame that ends an off-CPU stack is no row: its
    /// function is.
    fn count(
        &mut self,
        profile: &Profile,
        (s, c): &(SampleKey, Counts),
        mark: u32,
        w: &mut WindowCounts,
    ) {
        let weight = c.weight;
        let full = profile.stack(s.stack);
        let stack = match full.split_last() {
            Some((last, rest)) if profile.frame(*last).kind == FrameKind::State => rest,
            _ => &full[..],
        };
        let is_root = |id: &FrameId| {
            matches!(
                profile.frame(*id).kind,
                FrameKind::Process | FrameKind::Thread
            )
        };
        let below_root = stack.iter().filter(|id| !is_root(id)).count();
        for id in stack {
            if below_root == 0 || !is_root(id) {
                let k = id.0 as usize;
                if self.seen[k] != mark {
                    self.seen[k] = mark;
                    self.total[k] += weight;
                }
            }
        }
        if let Some(leaf) = stack.last() {
            self.own[leaf.0 as usize] += weight;
            let state = ThreadState::ALL
                .iter()
                .position(|st| *st == s.state)
                .unwrap_or(0);
            self.states_acc[leaf.0 as usize][state] += weight;
        }
        if let Some(py) = stack
            .iter()
            .rev()
            .find(|id| profile.frame(**id).kind == FrameKind::Python)
        {
            w.python_pids.insert(s.pid);
            *w.innermost_py.entry((s.pid, *py)).or_default() += weight;
        }
        *w.per_proc.entry(s.pid).or_default() += weight;
        let comm = profile.comm(s);
        let p = self.procs.entry(s.pid).or_insert_with(|| ProcAcc {
            comm: comm.clone(),
            samples_acc: 0,
            last_seen: w.end,
            hottest: None,
        });
        p.samples_acc += weight;
        p.last_seen = w.end;
        if p.comm != *comm {
            p.comm = comm.clone();
        }
    }

    /// Ends a window: the hottest Python function per process, processes not seen for
    /// [`PROC_LINGER`] forgotten, the window counts added to the totals; returns the rows.
    fn close(&mut self, profile: &Profile, w: WindowCounts) -> (Vec<FuncRow>, Vec<ProcRow>) {
        // The hottest Python function of each process in this window: most samples, then the
        // lowest frame id (stable between refreshes).
        let mut hottest: HashMap<u32, (u64, FrameId)> = HashMap::new();
        for ((pid, frame), n) in w.innermost_py {
            let e = hottest.entry(pid).or_insert((n, frame));
            if n > e.0 || (n == e.0 && frame < e.1) {
                *e = (n, frame);
            }
        }
        for (pid, (_, frame)) in &hottest {
            if let Some(p) = self.procs.get_mut(pid) {
                p.hottest = Some(*frame);
            }
        }
        let end = w.end;
        self.procs
            .retain(|_, p| end.saturating_sub(p.last_seen) <= PROC_LINGER);

        let mut funcs = Vec::new();
        for k in 0..self.own.len() {
            self.own_acc[k] += self.own[k];
            self.total_acc[k] += self.total[k];
            if self.total_acc[k] > 0 || self.own_acc[k] > 0 {
                funcs.push(FuncRow {
                    label: self.label(profile, FrameId(k as u32)),
                    own: self.own[k],
                    total: self.total[k],
                    own_acc: self.own_acc[k],
                    total_acc: self.total_acc[k],
                    states_acc: self.states_acc[k],
                });
            }
        }
        let proc_list: Vec<(u32, Arc<str>, u64, Option<FrameId>)> = self
            .procs
            .iter()
            .map(|(pid, p)| (*pid, p.comm.clone(), p.samples_acc, p.hottest))
            .collect();
        let procs = proc_list
            .into_iter()
            .map(|(pid, comm, samples_acc, hot)| ProcRow {
                pid,
                comm: clean(&comm),
                samples: w.per_proc.get(&pid).copied().unwrap_or(0),
                samples_acc,
                hottest: hot.map(|f| self.label(profile, f)),
            })
            .collect();
        (funcs, procs)
    }

    /// Adds one window of counts (taken from `profile`, whose frames and names they refer to and
    /// whose metadata gives the rate) that lasted `window` and ended `elapsed` after the start;
    /// returns what to show.
    pub fn window(
        &mut self,
        profile: &Profile,
        samples: &[(SampleKey, Counts)],
        window: Duration,
        elapsed: Duration,
        lost_samples: u64,
    ) -> Snapshot {
        self.grow(profile.frames().len());
        self.own.iter_mut().for_each(|c| *c = 0);
        self.total.iter_mut().for_each(|c| *c = 0);
        self.seen.iter_mut().for_each(|c| *c = 0);
        let mut w = WindowCounts {
            end: elapsed,
            ..WindowCounts::default()
        };
        for (i, s) in samples.iter().enumerate() {
            self.count(profile, s, u32::try_from(i + 1).unwrap_or(u32::MAX), &mut w);
        }
        let python_procs = w.python_pids.len();
        let (funcs, procs) = self.close(profile, w);
        Snapshot {
            elapsed,
            window,
            samples: samples.iter().map(|(_, c)| c.weight).sum(),
            lost_samples,
            python_procs,
            rate_hz: profile.meta.rate_hz,
            cpus: profile.meta.cpus,
            funcs,
            procs,
            ready: true,
            idle: profile.meta.idle,
        }
    }
}
