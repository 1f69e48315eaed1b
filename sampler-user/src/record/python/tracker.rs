//! Which processes of a `record` run are Python, kept in step with the kernel's `PY_PROCS`.
//!
//! Owns: the per-pid verdicts of a run — attached ([`PyProc`]), not Python (cached, so a pid
//! costs one attach attempt), or not Python *yet* (just exec'd: a shared-libpython interpreter
//! maps libpython only after ld.so ran, so it is retried on a schedule for ~2 s) — and the
//! writes to `PY_PROCS` ([`PyProcSink`]): insert on attach, remove on exit and exec.
//! Input: pids from the initial targets (`--all` scan, `-p`), process events (exec, exit,
//! fork), the first sample of an unknown pid, and attach results ([`Tracker::accept`]: the
//! workers deliver them to the stage's input, which wakes it). Output: `&mut PyProc` for
//! resolution, and the stats of every Python process seen, at the end.
//! Constraints: attaches run on the [`AttachQueue`]'s workers (a slow "not Python" verdict must
//! not hold back resolution); results are matched to requests by id, so an exit or exec in
//! between discards a stale one. Attach failures are counted by kind, never fatal; an exited
//! process keeps its caches for [`EXIT_GRACE`] (samples taken before the exit are still
//! arriving), then only its stats remain. Nothing here spins: retries and exit graces are kept
//! in time order, the `--threads` name polls of the processes whose threads come and go have
//! their due times, and [`Tracker::next_due`] tells the stage when to wake for them; the
//! negative cache is bounded.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use sampler_common::PyProcInfo;

use crate::failure::{AttachFailure, PyFailure};
use crate::lru::Lru;
use crate::python::PyError;

use super::attach::{AttachQueue, Attached, Ready, Request};
use super::process::{PyProc, PyProcStats};

/// How long an exited process's caches are kept.
pub const EXIT_GRACE: Duration = Duration::from_secs(2);
/// Attach retries after an exec, as delays from the exec (ld.so maps libpython meanwhile).
const RETRY_AFTER_EXEC: [Duration; 8] = [
    Duration::from_millis(10),
    Duration::from_millis(30),
    Duration::from_millis(70),
    Duration::from_millis(150),
    Duration::from_millis(300),
    Duration::from_millis(600),
    Duration::from_millis(1200),
    Duration::from_secs(2),
];
/// Most pids remembered as "not Python".
const MAX_NEGATIVE: usize = 1 << 16;
/// Most finished (exited) Python processes whose stats are kept one by one: the most sampled
/// (the summary lists the 50 with the most samples, and sums the rest on one line); the others
/// are summed as they go, so a run with process churn keeps this many, not one per process.
const MAX_FINISHED: usize = 256;

/// Where attached processes are announced to the kernel (`PY_PROCS`).
pub trait PyProcSink {
    /// Adds or replaces the entry of `pid`.
    fn insert(&mut self, pid: u32, info: &PyProcInfo) -> Result<(), String>;
    /// Removes the entry of `pid` (absent is fine).
    fn remove(&mut self, pid: u32);
}

impl PyProcSink for crate::collect::PythonProcMap {
    fn insert(&mut self, pid: u32, info: &PyProcInfo) -> Result<(), String> {
        crate::collect::PythonProcMap::insert(self, pid, info).map_err(|e| e.to_string())
    }
    fn remove(&mut self, pid: u32) {
        let _ = crate::collect::PythonProcMap::remove(self, pid);
    }
}

/// An attach in flight.
struct Pending {
    id: u64,
    /// After an exec: the exec time and the index of this attempt in [`RETRY_AFTER_EXEC`].
    retry: Option<(Instant, usize)>,
    promoted: bool,
}

/// A retry after an exec, due at `due`.
#[derive(Clone, Copy)]
struct Retry {
    due: Instant,
    pid: u32,
    exec: Instant,
    index: usize,
}

/// The Python processes of a run.
pub struct Tracker {
    /// `None` until the collector is loaded (the session takes no attach result before).
    sink: Option<Box<dyn PyProcSink + Send>>,
    /// `--idle`: the kernel's `OFFCPU` map, seeded for the threads of each process attached.
    offcpu: Option<crate::collect::OffCpuMap>,
    queue: AttachQueue,
    next_id: u64,
    pending: HashMap<u32, Pending>,
    procs: HashMap<u32, PyProc>,
    /// "Not Python" verdicts.
    negative: Lru<u32, ()>,
    /// Retries after an exec, earliest first.
    retries: Vec<Retry>,
    /// Exited processes, in exit order: dropped [`EXIT_GRACE`] after.
    exits: VecDeque<(Instant, u32)>,
    finished: Vec<(u32, PyProcStats)>,
    /// Stats of finished processes beyond [`MAX_FINISHED`], summed.
    finished_overflow: PyProcStats,
    /// Attach failures other than "not Python", by kind.
    pub attach_errors: BTreeMap<AttachFailure, u64>,
    /// The last such failure of each pid: its name then, and why (bounded).
    failures: HashMap<u32, (String, String)>,
    /// `--threads`: the processes whose thread names are polled (a few at a time: only those
    /// whose samples keep showing new threads).
    name_polls: Vec<u32>,
    /// From an exec to the attach of the Python process it started (`PYEBPF_STATS`).
    pub exec_to_attach: crate::record::latency::Latency,
}

/// A process that looked like Python but could not be profiled, for the summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Host pid.
    pub pid: u32,
    /// Its name when the attach failed.
    pub comm: String,
    /// Why, one line (`unsupported CPython 3.7`).
    pub reason: String,
}

/// The kind of an attach failure, `None` for a plain "not Python".
fn attach_failure(e: &PyError) -> Option<AttachFailure> {
    match e {
        PyError::NotPython { .. } => None,
        PyError::Unsupported { .. } => Some(AttachFailure::Unsupported),
        PyError::NotRecognised { .. } => Some(AttachFailure::LayoutNotRecognised),
        PyError::PermissionDenied { .. } => Some(AttachFailure::Permission),
        PyError::ProcessGone { .. } => Some(AttachFailure::Gone),
        PyError::Memory { .. } => Some(AttachFailure::Memory),
        PyError::Invalid { .. } => Some(AttachFailure::Invalid),
        PyError::Io { .. } => Some(AttachFailure::Io),
    }
}

impl Tracker {
    /// A tracker whose attach workers hand each result to `deliver` (which must bring it back
    /// to [`Self::accept`]). Attaches can be queued at once (they run while the eBPF object
    /// loads); results are taken once [`Self::set_sink`] was called.
    pub fn new(deliver: impl Fn(Attached) -> bool + Send + Sync + 'static) -> Self {
        Tracker {
            sink: None,
            offcpu: None,
            queue: AttachQueue::start(deliver),
            next_id: 0,
            pending: HashMap::new(),
            procs: HashMap::new(),
            negative: Lru::new(MAX_NEGATIVE),
            retries: Vec::new(),
            exits: VecDeque::new(),
            finished: Vec::new(),
            finished_overflow: PyProcStats::default(),
            attach_errors: BTreeMap::new(),
            exec_to_attach: crate::record::latency::Latency::default(),
            failures: HashMap::new(),
            name_polls: Vec::new(),
        }
    }

    /// Where attached processes are announced from now on.
    pub fn set_sink(&mut self, sink: Box<dyn PyProcSink + Send>) {
        self.sink = Some(sink);
    }

    /// `--idle`: seed the threads of every process attached from now on that are off a CPU.
    pub fn set_offcpu(&mut self, map: crate::collect::OffCpuMap) {
        self.offcpu = Some(map);
    }

    /// The `OFFCPU` map (`--idle`).
    pub fn offcpu(&self) -> Option<&crate::collect::OffCpuMap> {
        self.offcpu.as_ref()
    }

    /// Whether an attach of one of `pids` is in flight.
    pub fn attaching(&self, pids: &[u32]) -> bool {
        pids.iter().any(|p| self.pending.contains_key(p))
    }

    /// Why the attach of these pids failed, for those that are not plainly "not Python".
    pub fn failures(&self, pids: &[u32]) -> Vec<(u32, String)> {
        pids.iter()
            .filter_map(|p| Some((*p, self.failures.get(p)?.1.clone())))
            .collect()
    }

    /// Every process whose attach failed for a reason other than "not Python", by pid.
    pub fn skipped(&self) -> Vec<Skipped> {
        let mut out: Vec<Skipped> = self
            .failures
            .iter()
            .map(|(pid, (comm, reason))| Skipped {
                pid: *pid,
                comm: comm.clone(),
                reason: reason.clone(),
            })
            .collect();
        out.sort_by_key(|s| s.pid);
        out
    }

    /// Queues an urgent attach of `pid` (a `-p` target).
    pub fn request_now(&mut self, pid: u32) {
        if !self.procs.contains_key(&pid) && !self.pending.contains_key(&pid) {
            self.request(pid, None, true);
        }
    }

    /// The attached process `pid`. An unknown pid is queued for an attach (one per pid);
    /// a pid still waiting in the start-up scan is moved ahead (it is busy).
    pub fn get(&mut self, pid: u32) -> Option<&mut PyProc> {
        if !self.procs.contains_key(&pid) {
            if let Some(p) = self.pending.get_mut(&pid) {
                if !p.promoted {
                    p.promoted = true;
                    self.queue.promote(pid);
                }
            } else if !self.negative.contains(&pid) {
                self.request(pid, None, true);
            }
        }
        self.procs.get_mut(&pid)
    }

    /// The attached process `pid`, if it is one (no attach is queued).
    pub fn peek(&self, pid: u32) -> Option<&PyProc> {
        self.procs.get(&pid)
    }

    /// The attached process `pid`, mutable, if it is one (no attach is queued).
    pub fn peek_mut(&mut self, pid: u32) -> Option<&mut PyProc> {
        self.procs.get_mut(&pid)
    }

    fn request(&mut self, pid: u32, retry: Option<(Instant, usize)>, urgent: bool) {
        if pid == 0 || pid == std::process::id() {
            self.negative.insert(pid, ());
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.pending.insert(
            pid,
            Pending {
                id,
                retry,
                promoted: urgent,
            },
        );
        self.queue.submit(Request { pid, id }, urgent);
    }

    /// Takes an attach result (stale ones — the pid exited, exec'd or forked since the
    /// request — are dropped): announce the process, or remember the verdict.
    pub fn accept(&mut self, a: Attached) {
        let pid = a.req.pid;
        if self.pending.get(&pid).is_none_or(|p| p.id != a.req.id) {
            return;
        }
        let Some(p) = self.pending.remove(&pid) else {
            return;
        };
        match a.result {
            Ok(ready) => {
                if let Some((exec, _)) = p.retry {
                    self.exec_to_attach.add(exec.elapsed());
                }
                self.attached(pid, *ready);
            }
            Err(e) => {
                let next = p
                    .retry
                    .map(|(exec, i)| (exec, i + 1))
                    .filter(|(_, i)| *i < RETRY_AFTER_EXEC.len());
                // "Not Python yet" after an exec is expected; only the final verdict counts.
                if let Some(kind) = attach_failure(&e)
                    && next.is_none()
                {
                    *self.attach_errors.entry(kind).or_default() += 1;
                    if self.failures.len() < MAX_FINISHED {
                        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                            .map(|c| c.trim_end().to_string())
                            .unwrap_or_default();
                        let reason = match &e {
                            PyError::ProcessGone { .. } => {
                                "exited before it could be attached".to_string()
                            }
                            e => e.to_string(),
                        };
                        self.failures.insert(pid, (comm, reason));
                    }
                }
                if matches!(e, PyError::ProcessGone { .. }) {
                    self.negative.remove(&pid);
                } else if let Some((exec, index)) = next {
                    self.schedule_retry(pid, exec, index);
                } else {
                    self.negative.insert(pid, ());
                }
            }
        }
    }

    fn attached(&mut self, pid: u32, ready: Ready) {
        let Ready {
            process,
            info,
            comm,
        } = ready;
        let mut p = PyProc::new(process, comm);
        let inserted = match self.sink.as_mut() {
            Some(sink) => sink.insert(pid, &info),
            None => Err("no PY_PROCS map".to_string()),
        };
        if let Err(e) = inserted {
            tracing::debug!("pid {pid}: PY_PROCS insert failed: {e}");
            p.stats.count(PyFailure::PyProcsInsert);
        } else if let Some(map) = self.offcpu.as_mut()
            && let Err(e) = crate::record::idle::seed_process(map, pid, &mut p)
        {
            tracing::debug!("pid {pid}: threads off a CPU not seeded: {e}");
            p.stats.count(PyFailure::OffCpuSeed);
        }
        self.negative.remove(&pid);
        self.procs.insert(pid, p);
    }

    fn schedule_retry(&mut self, pid: u32, exec: Instant, index: usize) {
        let due = exec + RETRY_AFTER_EXEC[index];
        let at = self.retries.partition_point(|r| r.due <= due);
        self.retries.insert(
            at,
            Retry {
                due,
                pid,
                exec,
                index,
            },
        );
    }

    /// Forgets everything about `pid` but its stats (an exec, fork or exit happened).
    fn reset(&mut self, pid: u32) {
        self.drop_proc(pid, true);
        self.negative.remove(&pid);
        self.pending.remove(&pid);
        self.retries.retain(|r| r.pid != pid);
    }

    /// `pid` replaced its image: forget what it was, attach again (with retries).
    /// `exec`: when it happened (retries count from there; so does `exec_to_attach`).
    pub fn on_exec(&mut self, pid: u32, exec: Instant) {
        self.reset(pid);
        self.request(pid, Some((exec, 0)), true);
    }

    /// `pid` was forked by a target: a copy of its parent until it execs.
    pub fn on_fork(&mut self, pid: u32) {
        self.reset(pid);
        self.request(pid, None, true);
    }

    /// `pid` exited.
    pub fn on_exit(&mut self, pid: u32) {
        self.negative.remove(&pid);
        self.pending.remove(&pid);
        self.retries.retain(|r| r.pid != pid);
        if let Some(p) = self.procs.get_mut(&pid)
            && p.exited_at.is_none()
        {
            let now = Instant::now();
            p.exited_at = Some(now);
            self.exits.push_back((now, pid));
            if let Some(sink) = self.sink.as_mut() {
                sink.remove(pid);
            }
        }
    }

    /// Removes `pid`'s process (keeping its stats); `from_map` also removes the kernel entry.
    fn drop_proc(&mut self, pid: u32, from_map: bool) {
        let Some(p) = self.procs.remove(&pid) else {
            return;
        };
        if from_map
            && p.exited_at.is_none()
            && let Some(sink) = self.sink.as_mut()
        {
            sink.remove(pid);
        }
        self.finished.push((pid, p.stats));
        if self.finished.len() > MAX_FINISHED {
            self.sum_least_sampled();
        }
    }

    /// Moves the finished process with the fewest samples (the last of the summary's order:
    /// most samples, then lowest pid) into the overflow sum — one whose version and layout
    /// family another kept process shares, so that the summary's list of the families walked
    /// stays whole (with more processes kept than there are families, there is one).
    fn sum_least_sampled(&mut self) {
        fn family(s: &PyProcStats) -> (&str, &'static str) {
            (s.version.as_str(), s.family)
        }
        let mut seen: Vec<((&str, &'static str), usize)> = Vec::new();
        for (_, s) in &self.finished {
            let f = family(s);
            match seen.iter_mut().find(|(g, _)| *g == f) {
                Some((_, n)) => *n += 1,
                None => seen.push((f, 1)),
            }
        }
        let shared = |s: &PyProcStats| {
            let f = family(s);
            seen.iter().any(|(g, n)| *g == f && *n > 1)
        };
        let order = |&(i, (pid, s)): &(usize, &(u32, PyProcStats))| {
            (!shared(s), s.samples, std::cmp::Reverse(*pid), i)
        };
        let Some((victim, _)) = self.finished.iter().enumerate().min_by_key(order) else {
            return;
        };
        let (_, stats) = self.finished.swap_remove(victim);
        self.finished_overflow.merge(&stats);
    }

    /// When [`Self::tick`] has work: the next retry after an exec or the end of an exit's
    /// grace.
    pub fn next_due(&self) -> Option<Instant> {
        let retry = self.retries.first().map(|r| r.due);
        let exit = self.exits.front().map(|(t, _)| *t + EXIT_GRACE);
        let names = self
            .name_polls
            .iter()
            .filter_map(|pid| self.procs.get(pid)?.names_due())
            .min();
        [retry, exit, names].into_iter().flatten().min()
    }

    /// `--threads`: process `pid` polls its thread names (see `names`) until its poll ends.
    pub fn poll_names_of(&mut self, pid: u32) {
        if !self.name_polls.contains(&pid) {
            self.name_polls.push(pid);
        }
    }

    /// `--threads`: the name polls due at `now` (also between the samples of a long batch, so
    /// a busy pipeline does not delay them by the batch).
    pub fn poll_names(&mut self, now: Instant) {
        if self.name_polls.is_empty() {
            return;
        }
        let procs = &mut self.procs;
        self.name_polls.retain(|pid| {
            let Some(p) = procs.get_mut(pid) else {
                return false;
            };
            p.poll_names(now);
            p.names_due().is_some()
        });
    }

    /// The work due at `now`: retries after exec, exited processes after the grace, thread
    /// names polled.
    pub fn tick(&mut self, now: Instant) {
        self.poll_names(now);
        let due = self.retries.partition_point(|r| r.due <= now);
        for r in self.retries.drain(..due).collect::<Vec<_>>() {
            self.request(r.pid, Some((r.exec, r.index)), true);
        }
        while let Some(&(t, pid)) = self.exits.front() {
            if now.duration_since(t) < EXIT_GRACE {
                break;
            }
            self.exits.pop_front();
            // Not when it was replaced since (the pid exec'd or was reused).
            if self.procs.get(&pid).is_some_and(|p| p.exited_at == Some(t)) {
                self.drop_proc(pid, false);
            }
        }
    }

    /// What the tracker holds per process: attached processes, attaches in flight, "not
    /// Python" verdicts, retries, exits in their grace, finished processes' stats and attach
    /// failures (tests).
    #[cfg(test)]
    pub fn sizes(&self) -> [usize; 7] {
        [
            self.procs.len(),
            self.pending.len(),
            self.negative.len(),
            self.retries.len(),
            self.exits.len(),
            self.finished.len(),
            self.failures.len(),
        ]
    }

    /// Whether retries are scheduled.
    #[cfg(test)]
    fn busy(&self) -> bool {
        !self.pending.is_empty() || !self.retries.is_empty()
    }

    /// Queues every process in `/proc` (for `--all`) behind the urgent requests, the busiest
    /// first (CPU time over lifetime): those are the ones whose samples are coming. Returns
    /// the busy ones (at least 5 % of a CPU over their lifetime), whose attach `record` waits
    /// for before the run begins.
    pub fn scan_all(&mut self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let pids = busiest_first(
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    !self.procs.contains_key(pid)
                        && !self.pending.contains_key(pid)
                        && !self.negative.contains(pid)
                }),
        );
        let busy = pids
            .iter()
            .filter(|(_, share)| *share >= 0.05)
            .map(|(pid, _)| *pid)
            .collect();
        for (pid, _) in pids {
            self.request(pid, None, false);
        }
        busy
    }

    /// The stats of every Python process of the run, by pid (finished ones included), and the
    /// sum of those beyond the per-process bound.
    pub fn finish(mut self) -> (Vec<(u32, PyProcStats)>, Option<PyProcStats>) {
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            self.drop_proc(pid, false);
        }
        let overflow = (self.finished_overflow.samples > 0)
            .then_some(std::mem::take(&mut self.finished_overflow));
        (std::mem::take(&mut self.finished), overflow)
    }
}

/// `pids` with their CPU share ([`cpu_share`]; 0 when unreadable), the busiest first.
fn busiest_first(pids: impl Iterator<Item = u32>) -> Vec<(u32, f64)> {
    let mut pids: Vec<(u32, f64)> = pids
        .map(|pid| (pid, cpu_share(pid).unwrap_or(0.0)))
        .collect();
    pids.sort_by(|a, b| b.1.total_cmp(&a.1));
    pids
}

/// CPU time over lifetime of `pid` (both in clock ticks, from `/proc/PID/stat`).
fn cpu_share(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised comm (which may hold spaces): state is field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i - 3)?.parse::<f64>().ok();
    let cpu = num(14)? + num(15)?;
    let started = num(22)?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let age = (uptime * hz - started).max(1.0);
    Some(cpu / age)
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::sync::mpsc::{Receiver, channel};
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Records the map operations.
    #[derive(Default, Clone)]
    struct Log(Arc<Mutex<Vec<String>>>);
    impl PyProcSink for Log {
        fn insert(&mut self, pid: u32, _: &PyProcInfo) -> Result<(), String> {
            self.0.lock().unwrap().push(format!("insert {pid}"));
            Ok(())
        }
        fn remove(&mut self, pid: u32) {
            self.0.lock().unwrap().push(format!("remove {pid}"));
        }
    }

    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A tracker whose results come back on the returned receiver.
    fn tracker(sink: Box<dyn PyProcSink + Send>) -> (Tracker, Receiver<Attached>) {
        let (tx, rx) = channel();
        let mut t = Tracker::new(move |a| tx.send(a).is_ok());
        t.set_sink(sink);
        (t, rx)
    }

    /// A pyenv 3.12 (shared libpython) sleeping for 30 s; `None` (SKIPPED) when it is not
    /// installed, a failure under `CI=true`.
    fn sleeping_python() -> Option<Killed> {
        let python = "/root/.pyenv/versions/3.12.1/bin/python3.12";
        if !std::path::Path::new(python).exists() {
            crate::procs::tests::missing(&format!("{python} not found"));
            return None;
        }
        Some(Killed(
            Command::new(python)
                .args(["-c", "import time; time.sleep(30)"])
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        ))
    }

    /// Takes results until no attach is in flight.
    fn settle(t: &mut Tracker, rx: &Receiver<Attached>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.pending.is_empty() && Instant::now() < deadline {
            if let Ok(a) = rx.recv_timeout(Duration::from_millis(50)) {
                t.accept(a);
            }
        }
        assert!(t.pending.is_empty(), "attach worker stuck");
    }

    #[test]
    fn stale_results_are_dropped() {
        let log = Log::default();
        let (mut t, rx) = tracker(Box::new(log.clone()));
        let Some(py) = sleeping_python() else { return };
        std::thread::sleep(Duration::from_millis(300));
        let pid = py.0.id();
        assert!(
            t.get(pid).is_none(),
            "queued, not attached on the caller's thread"
        );
        let stale = rx.recv_timeout(Duration::from_secs(10)).expect("a result");
        t.on_exit(pid); // the process "exits" before the result is taken
        t.accept(stale);
        assert!(t.procs.is_empty(), "a result for an exited pid is stale");
        assert!(log.0.lock().unwrap().is_empty(), "nothing announced");
        t.request_now(pid);
        settle(&mut t, &rx);
        assert!(t.procs.contains_key(&pid));
        assert_eq!(*log.0.lock().unwrap(), [format!("insert {pid}")]);
    }

    #[test]
    fn non_python_is_tried_once_and_python_is_announced() {
        let log = Log::default();
        let (mut t, rx) = tracker(Box::new(log.clone()));
        let sleep = Killed(Command::new("sleep").arg("30").spawn().unwrap());
        let pid = sleep.0.id();
        assert!(t.get(pid).is_none());
        settle(&mut t, &rx);
        assert!(t.negative.contains(&pid), "negative verdict cached");
        assert!(t.get(pid).is_none());
        assert!(t.pending.is_empty(), "one attempt per pid");
        assert!(t.get(std::process::id()).is_none(), "never ourselves");
        assert!(t.pending.is_empty());
        // Shared libpython: mapped by ld.so after the exec; retried until it is.
        let Some(py) = sleeping_python() else { return };
        let pid = py.0.id();
        t.on_exec(pid, Instant::now());
        let deadline = Instant::now() + Duration::from_secs(3);
        while !t.procs.contains_key(&pid) && Instant::now() < deadline {
            let wait = t.next_due().map_or(Duration::from_millis(50), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if let Ok(a) = rx.recv_timeout(wait) {
                t.accept(a);
            }
            t.tick(Instant::now());
        }
        assert!(
            t.procs.contains_key(&pid),
            "3.12 attached within the retry window"
        );
        assert!(!t.busy());
        t.on_exit(pid);
        assert_eq!(
            *log.0.lock().unwrap(),
            [format!("insert {pid}"), format!("remove {pid}")]
        );
        let due = t.next_due().expect("the end of the exit grace");
        assert!(
            due > Instant::now() + EXIT_GRACE / 2,
            "not before the grace"
        );
        t.tick(due);
        assert!(!t.procs.contains_key(&pid), "dropped after the grace");
        let (stats, overflow) = t.finish();
        assert_eq!(stats.len(), 1);
        assert_eq!(stats[0].0, pid);
        assert_eq!(stats[0].1.version, "3.12");
        assert!(overflow.is_none());
    }

    #[test]
    fn busy_processes_are_scanned_first() {
        let busy = Killed(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        );
        let idle = Killed(Command::new("sleep").arg("30").spawn().unwrap());
        std::thread::sleep(Duration::from_millis(500));
        let (b, i) = (
            cpu_share(busy.0.id()).unwrap(),
            cpu_share(idle.0.id()).unwrap(),
        );
        // The machine may be loaded: the spinner gets some CPU, the sleeper next to none.
        assert!(b > 0.05 && b > 5.0 * i, "busy {b}, idle {i}");
        assert!(cpu_share(u32::MAX - 3).is_none());
        // The order `scan_all` queues them in: the spinner first, whatever the input order.
        let gone = u32::MAX - 3;
        let order: Vec<u32> = busiest_first([idle.0.id(), gone, busy.0.id()].into_iter())
            .into_iter()
            .map(|(pid, _)| pid)
            .collect();
        assert_eq!(order[0], busy.0.id(), "{order:?}");
        assert_eq!(order.len(), 3, "an unreadable pid is queued too (as idle)");
    }

    #[test]
    fn finished_processes_are_bounded_keeping_the_most_sampled_and_every_family() {
        let (mut t, _rx) = tracker(Box::new(Log::default()));
        let stats = |version: &str, samples| PyProcStats {
            version: version.into(),
            family: "f",
            samples,
            ..PyProcStats::default()
        };
        // One 3.8 process with the fewest samples, then 2000 3.12 ones (process churn).
        t.finished.push((1, stats("3.8", 0)));
        let churn: Vec<(u32, u64)> = (2..2002u32).map(|p| (p, u64::from(p % 97))).collect();
        for &(pid, n) in &churn {
            t.finished.push((pid, stats("3.12", n)));
            if t.finished.len() > MAX_FINISHED {
                t.sum_least_sampled();
            }
        }
        assert_eq!(t.finished.len(), MAX_FINISHED, "bounded");
        assert!(
            t.finished
                .iter()
                .any(|(p, s)| *p == 1 && s.version == "3.8"),
            "every version and family walked stays listed"
        );
        // The 3.12 ones kept are the first of the summary's order: most samples, lowest pid.
        let mut expected = churn.clone();
        expected.sort_by_key(|&(p, n)| (std::cmp::Reverse(n), p));
        let mut expected: Vec<u32> = expected[..MAX_FINISHED - 1].iter().map(|x| x.0).collect();
        expected.sort_unstable();
        let mut kept: Vec<u32> = t.finished.iter().map(|x| x.0).filter(|p| *p != 1).collect();
        kept.sort_unstable();
        assert_eq!(kept, expected);
        let total: u64 = churn.iter().map(|x| x.1).sum();
        let kept_samples: u64 = t.finished.iter().map(|x| x.1.samples).sum();
        assert_eq!(
            kept_samples + t.finished_overflow.samples,
            total,
            "the others are summed, not lost"
        );
    }

    #[test]
    fn retries_end_after_the_schedule() {
        let (mut t, rx) = tracker(Box::new(Log::default()));
        let sleep = Killed(Command::new("sleep").arg("30").spawn().unwrap());
        let pid = sleep.0.id();
        t.on_exec(pid, Instant::now());
        assert!(t.busy());
        settle(&mut t, &rx);
        for _ in RETRY_AFTER_EXEC {
            let Some(due) = t.next_due() else { break };
            t.tick(due);
            settle(&mut t, &rx);
        }
        assert!(!t.busy(), "bounded retries");
        assert!(t.procs.is_empty());
        assert!(
            t.attach_errors.is_empty(),
            "'not Python' is no error: {:?}",
            t.attach_errors
        );
    }
}
