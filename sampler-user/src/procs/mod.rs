//! procs stage: the process registry.
//!
//! Owns: every piece of per-process state the later stages look up — comm, exe, cmdline, start
//! time, PID namespace, cgroup/container and the memory mappings — keyed by host pid, plus the
//! identity of mapped files ([`FileId`]), the rules for opening them ([`open_mapped_file`]) and
//! the one ELF layer every stage reads them with ([`elf`], on the `object` crate).
//! Input: pids from samples and process events (exec, exit), and `/proc` (root injectable).
//! Output: `&Process` for cheap per-sample lookups (`mapping_for` is a binary search).
//! Constraints: `/proc` contents are untrusted and racy — a process can exit between two reads.
//! Nothing here panics on them; reads are bounded; failures are counted by kind
//! ([`ProcsErrorKind`]) and the run goes on. Exited processes are kept until
//! [`ProcessRegistry::reap`] (or [`AUTO_REAP_AFTER`]) so that samples still in flight resolve.
//! Mapping refreshes are rate-limited per pid. A reused pid is re-read on its exec event.

mod container;
pub mod elf;
mod files;
mod maps;

use std::collections::HashMap;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lru::Lru;

pub use container::{container_id_from_path, from_cgroup_file};
pub use files::{
    FileId, MappedFile, open_mapped_file, open_mapped_file_in, open_mapping, open_mapping_under,
    read_own_vdso,
};
pub use maps::{MAX_MAPPINGS, Mapping, MapsLineError, Perms, find_mapping, parse_maps};

/// Minimum time between two mapping refreshes of one pid.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(100);
/// How long a pid that could not be loaded is not retried (samples of a just-exited process
/// keep arriving for a few milliseconds; re-reading `/proc` for each would be wasted work).
const MISSING_RETRY: Duration = Duration::from_secs(1);
/// Exited processes are dropped this long after their exit even if [`ProcessRegistry::reap`]
/// is never called (checked every [`AUTO_REAP_EVERY`] exits).
pub const AUTO_REAP_AFTER: Duration = Duration::from_secs(10);
/// Exit count between two automatic reaps.
const AUTO_REAP_EVERY: u32 = 256;
/// Largest maps file read (65,536 lines of up to ~256 bytes).
const MAX_MAPS_BYTES: u64 = 16 << 20;
/// Largest cmdline read.
const MAX_CMDLINE_BYTES: u64 = 64 << 10;
/// `PF_KTHREAD` in the `flags` field of `/proc/PID/stat` (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;

/// Most cmdline arguments kept.
const MAX_CMDLINE_ARGS: usize = 1024;
/// Largest cgroup or status file read.
const MAX_SMALL_FILE: u64 = 64 << 10;
/// Most cached thread-id translations per process.
const MAX_NS_TIDS: usize = 4096;
/// Most pids remembered as gone (not loaded again for [`MISSING_RETRY`]).
const MAX_MISSING: usize = 1 << 16;

/// Kinds of counted failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProcsErrorKind {
    /// The process was gone before it could be loaded.
    Gone,
    /// `/proc/PID/stat` could not be read or parsed.
    Stat,
    /// `/proc/PID/maps` could not be read.
    Maps,
    /// A maps line was malformed and skipped.
    MapsLine,
    /// `/proc/PID/exe` could not be read (kernel threads, exited leaders, permissions).
    Exe,
    /// `/proc/PID/cmdline` could not be read.
    Cmdline,
    /// `/proc/PID/status` could not be read.
    Status,
    /// `/proc/PID/cgroup` could not be read.
    Cgroup,
    /// A refresh was asked for within [`REFRESH_INTERVAL`] of the last one and skipped.
    RefreshRateLimited,
}

impl ProcsErrorKind {
    /// Every kind.
    pub const ALL: [ProcsErrorKind; 9] = [
        Self::Gone,
        Self::Stat,
        Self::Maps,
        Self::MapsLine,
        Self::Exe,
        Self::Cmdline,
        Self::Status,
        Self::Cgroup,
        Self::RefreshRateLimited,
    ];

    /// Short stable name for summaries.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Gone => "gone",
            Self::Stat => "stat",
            Self::Maps => "maps",
            Self::MapsLine => "maps_line",
            Self::Exe => "exe",
            Self::Cmdline => "cmdline",
            Self::Status => "status",
            Self::Cgroup => "cgroup",
            Self::RefreshRateLimited => "refresh_rate_limited",
        }
    }
}

/// Error of one read, with context.
#[derive(Debug, thiserror::Error)]
pub enum ProcsError {
    /// Reading a `/proc` file failed.
    #[error("reading {file} of pid {pid}: {source}")]
    Read {
        /// Host pid.
        pid: u32,
        /// File name under `/proc/PID`.
        file: &'static str,
        /// The error.
        source: io::Error,
    },
    /// procfs failed to parse a file.
    #[error("parsing {file} of pid {pid}: {source}")]
    Parse {
        /// Host pid.
        pid: u32,
        /// File name under `/proc/PID`.
        file: &'static str,
        /// The error.
        source: procfs::ProcError,
    },
}

/// Failure counts by kind, with the last message of each kind.
#[derive(Debug, Default)]
pub struct ProcsErrors {
    counts: HashMap<ProcsErrorKind, (u64, String)>,
}

impl ProcsErrors {
    fn count(&mut self, kind: ProcsErrorKind, msg: impl FnOnce() -> String) {
        let e = self.counts.entry(kind).or_default();
        e.0 += 1;
        if e.0 == 1 {
            e.1 = msg();
        }
    }

    /// Count of one kind.
    pub fn get(&self, kind: ProcsErrorKind) -> u64 {
        self.counts.get(&kind).map_or(0, |e| e.0)
    }

    /// `(kind, count, first message)` sorted by kind.
    pub fn to_vec(&self) -> Vec<(ProcsErrorKind, u64, &str)> {
        let mut v: Vec<_> = self
            .counts
            .iter()
            .map(|(k, (n, m))| (*k, *n, m.as_str()))
            .collect();
        v.sort_by_key(|e| e.0);
        v
    }
}

/// One process as last read from `/proc`.
#[derive(Debug)]
pub struct Process {
    /// Host pid.
    pub pid: u32,
    /// `comm` from `/proc/PID/stat`.
    pub comm: String,
    /// Target of `/proc/PID/exe` as the kernel prints it (relative to our root).
    pub exe: Option<PathBuf>,
    /// Arguments (lossy UTF-8, bounded).
    pub cmdline: Vec<String>,
    /// Start time in clock ticks since boot; with `pid`, identifies the process across pid reuse.
    pub start_time_ticks: u64,
    /// Innermost `NSpid` (the pid the process sees itself as).
    pub ns_pid: Option<u32>,
    /// cgroup path (v2 if present).
    pub cgroup: Option<String>,
    /// 64-hex container id from docker/containerd/CRI-O/podman cgroup paths.
    pub container_id: Option<String>,
    /// `/proc/PID/root`: the process's root directory as seen from here.
    pub root: PathBuf,
    /// Memory mappings sorted by start.
    pub mappings: Vec<Mapping>,
    /// Incremented each time `mappings` changes; consumers that derive state from the mappings
    /// (the unwinder's module list) rebuild when it moves.
    pub mappings_generation: u64,
    /// The process exited (the info is kept for samples still in flight).
    pub exited: bool,
    proc_dir: PathBuf,
    nested_pid_ns: bool,
    ns_tids: Mutex<Lru<u32, u32>>,
    /// A process known from a core file: its files are opened under this directory (`dump
    /// --core --root`), never through `/proc`.
    files_root: Option<PathBuf>,
}

impl Process {
    /// The mapping containing `addr`.
    pub fn mapping_for(&self, addr: u64) -> Option<&Mapping> {
        find_mapping(&self.mappings, addr)
    }

    /// The thread id the process sees for host thread `host_tid` (innermost `NSpid` of
    /// `/proc/PID/task/TID/status`). Without a PID namespace this is `host_tid`, with no I/O;
    /// otherwise the answer is read once and cached.
    pub fn thread_ns_tid(&self, host_tid: u32) -> Option<u32> {
        if !self.nested_pid_ns {
            return Some(host_tid);
        }
        if let Some(t) = self
            .ns_tids
            .lock()
            .ok()
            .and_then(|mut m| m.get(&host_tid).copied())
        {
            return Some(t);
        }
        let path = self
            .proc_dir
            .join("task")
            .join(host_tid.to_string())
            .join("status");
        let text = read_bounded(&path, MAX_SMALL_FILE).ok()?;
        let (ns, _) = innermost_nspid(&String::from_utf8_lossy(&text))?;
        if let Ok(mut m) = self.ns_tids.lock() {
            m.insert(host_tid, ns);
        }
        Some(ns)
    }

    /// `/proc/PID` of this process under the registry's proc root.
    pub fn proc_dir(&self) -> &Path {
        &self.proc_dir
    }

    /// Open the file behind one of this process's mappings (see [`open_mapping`]).
    pub fn open_mapping(&self, m: &Mapping) -> io::Result<MappedFile> {
        if let Some(dir) = &self.files_root {
            return open_mapping_under(dir, m);
        }
        let root = self.proc_dir.parent().unwrap_or(Path::new("/proc"));
        open_mapping(root, self.pid, m)
    }

    /// A process known only from a core file: its mappings (from the core's notes), and the
    /// directory its files are found under. It counts as exited, so it is never re-read from
    /// `/proc` (the pid may belong to another process on this host, or to none).
    pub fn from_core(
        pid: u32,
        comm: String,
        cmdline: Vec<String>,
        mut mappings: Vec<Mapping>,
        files_root: PathBuf,
    ) -> Process {
        mappings.sort_by_key(|m| m.start);
        Process {
            pid,
            comm,
            exe: None,
            cmdline,
            start_time_ticks: 0,
            ns_pid: None,
            cgroup: None,
            container_id: None,
            root: files_root.clone(),
            mappings,
            mappings_generation: 0,
            exited: true,
            proc_dir: PathBuf::from("/nonexistent-core-process"),
            nested_pid_ns: false,
            ns_tids: Mutex::new(Lru::new(MAX_NS_TIDS)),
            files_root: Some(files_root),
        }
    }
}

/// Innermost (last) pid of the `NSpid:` line of a status file, and whether there is more than
/// one (the process is in a nested PID namespace).
fn innermost_nspid(status: &str) -> Option<(u32, bool)> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let mut ids = line.split_whitespace();
    let first = ids.next()?;
    let last = ids.next_back();
    Some((last.unwrap_or(first).parse().ok()?, last.is_some()))
}

fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

struct Entry {
    process: Process,
    last_refresh: Instant,
    exited_at: Option<Instant>,
}

/// All processes seen so far, keyed by host pid.
pub struct ProcessRegistry {
    proc_root: PathBuf,
    entries: HashMap<u32, Entry>,
    missing: Lru<u32, Instant>,
    errors: ProcsErrors,
    exits_since_reap: u32,
}

impl Default for ProcessRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessRegistry {
    /// A registry over the real `/proc`.
    pub fn new() -> Self {
        Self::with_proc_root("/proc")
    }

    /// A registry over another proc root (tests, or a host `/proc` mounted elsewhere).
    pub fn with_proc_root(root: impl Into<PathBuf>) -> Self {
        Self {
            proc_root: root.into(),
            entries: HashMap::new(),
            missing: Lru::new(MAX_MISSING),
            errors: ProcsErrors::default(),
            exits_since_reap: 0,
        }
    }

    /// The proc root in use.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// Load every live process not known yet. Returns how many are known and alive afterwards.
    pub fn scan_all(&mut self) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.proc_root) else {
            return self.live_count();
        };
        for ent in dir.flatten() {
            let Some(pid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if !self.entries.contains_key(&pid) {
                match self.load(pid) {
                    Ok(p) => {
                        self.entries.insert(
                            pid,
                            Entry {
                                process: p,
                                last_refresh: Instant::now(),
                                exited_at: None,
                            },
                        );
                    }
                    // Processes vanish during a scan all the time; count, don't remember.
                    Err(e) => self.count_load_error(pid, &e),
                }
            }
        }
        self.live_count()
    }

    fn live_count(&self) -> usize {
        self.entries.values().filter(|e| !e.process.exited).count()
    }

    /// The process, loading it on first sight. `None` (and counted) if it is gone.
    pub fn get_or_load(&mut self, pid: u32) -> Option<&Process> {
        if !self.entries.contains_key(&pid) {
            let now = Instant::now();
            if self
                .missing
                .peek(&pid)
                .is_some_and(|t| now.duration_since(*t) < MISSING_RETRY)
            {
                self.errors
                    .count(ProcsErrorKind::Gone, || format!("pid {pid} is gone"));
                return None;
            }
            match self.load(pid) {
                Ok(p) => {
                    self.missing.remove(&pid);
                    self.entries.insert(
                        pid,
                        Entry {
                            process: p,
                            last_refresh: now,
                            exited_at: None,
                        },
                    );
                }
                Err(e) => {
                    self.count_load_error(pid, &e);
                    // Only a recent failure holds back a retry: older ones go (oldest first),
                    // so on a host with process churn this follows the exits of the last
                    // second, not every pid ever seen.
                    self.missing
                        .pop_lru_while(|_, t| now.duration_since(*t) >= MISSING_RETRY);
                    self.missing.insert(pid, now);
                    return None;
                }
            }
        }
        self.entries.get(&pid).map(|e| &e.process)
    }

    /// Adds a process that is not read from `/proc` (one built from a core file), replacing
    /// any process of that pid.
    pub fn insert(&mut self, process: Process) {
        self.entries.insert(
            process.pid,
            Entry {
                process,
                last_refresh: Instant::now(),
                exited_at: None,
            },
        );
    }

    /// The process if known (no I/O).
    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.entries.get(&pid).map(|e| &e.process)
    }

    /// After `exec` everything but the pid changes: re-read the whole process.
    pub fn on_exec(&mut self, pid: u32) {
        self.missing.remove(&pid);
        let generation = self
            .entries
            .get(&pid)
            .map_or(0, |e| e.process.mappings_generation);
        match self.load(pid) {
            Ok(mut p) => {
                p.mappings_generation = generation + 1;
                self.entries.insert(
                    pid,
                    Entry {
                        process: p,
                        last_refresh: Instant::now(),
                        exited_at: None,
                    },
                );
            }
            Err(e) => {
                self.count_load_error(pid, &e);
                self.on_exit(pid);
            }
        }
    }

    /// Mark `pid` exited; its info stays until [`Self::reap`].
    ///
    /// Every [`AUTO_REAP_EVERY`] exits, processes gone longer than [`AUTO_REAP_AFTER`] are
    /// dropped, so a long host-wide run stays bounded without explicit [`Self::reap`] calls.
    pub fn on_exit(&mut self, pid: u32) {
        if let Some(e) = self.entries.get_mut(&pid) {
            e.process.exited = true;
            e.exited_at.get_or_insert_with(Instant::now);
        }
        self.exits_since_reap += 1;
        if self.exits_since_reap >= AUTO_REAP_EVERY {
            self.exits_since_reap = 0;
            self.reap(AUTO_REAP_AFTER);
        }
    }

    /// Drop processes that exited more than `grace` ago; returns their pids so that the other
    /// stages can forget their per-process state too.
    pub fn reap(&mut self, grace: Duration) -> Vec<u32> {
        let now = Instant::now();
        let gone: Vec<u32> = self
            .entries
            .iter()
            .filter(|(_, e)| e.exited_at.is_some_and(|t| now.duration_since(t) >= grace))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in &gone {
            self.entries.remove(pid);
        }
        gone
    }

    /// Re-read the mappings of `pid` after an address was found in none of them (a `dlopen`
    /// since the last read). At most once per [`REFRESH_INTERVAL`] per pid. Returns whether the
    /// mappings changed (then `mappings_generation` moved).
    pub fn refresh_mappings(&mut self, pid: u32) -> bool {
        let Some(entry) = self.entries.get_mut(&pid) else {
            return false;
        };
        let now = Instant::now();
        if entry.process.exited || now.duration_since(entry.last_refresh) < REFRESH_INTERVAL {
            self.errors
                .count(ProcsErrorKind::RefreshRateLimited, || format!("pid {pid}"));
            return false;
        }
        entry.last_refresh = now;
        let dir = entry.process.proc_dir.clone();
        match read_maps(&dir, pid, &mut self.errors) {
            Ok(maps) if maps != entry.process.mappings => {
                entry.process.mappings = maps;
                entry.process.mappings_generation += 1;
                true
            }
            Ok(_) => false,
            Err(e) => {
                self.errors.count(ProcsErrorKind::Maps, || e.to_string());
                false
            }
        }
    }

    /// How many processes are known (alive or exited, not reaped yet) and how many pids are
    /// remembered as gone: what the registry holds per process (tests, memory checks).
    pub fn sizes(&self) -> (usize, usize) {
        (self.entries.len(), self.missing.len())
    }

    /// Counted failures.
    pub fn errors(&self) -> &ProcsErrors {
        &self.errors
    }

    /// `(kind, count)` of counted failures, sorted by kind.
    pub fn error_counts(&self) -> Vec<(ProcsErrorKind, u64)> {
        self.errors
            .to_vec()
            .into_iter()
            .map(|(k, n, _)| (k, n))
            .collect()
    }

    fn count_load_error(&mut self, pid: u32, e: &ProcsError) {
        let gone = match e {
            ProcsError::Read { source, .. } => source.kind() == io::ErrorKind::NotFound,
            ProcsError::Parse { source, .. } => matches!(source, procfs::ProcError::NotFound(_)),
        };
        let kind = if gone {
            ProcsErrorKind::Gone
        } else {
            ProcsErrorKind::Stat
        };
        self.errors.count(kind, || format!("pid {pid}: {e}"));
    }

    /// Read one process. Only `stat` is required; every other file is optional and counted.
    fn load(&mut self, pid: u32) -> Result<Process, ProcsError> {
        let dir = self.proc_root.join(pid.to_string());
        let pf = procfs::process::Process::new_with_root(dir.clone()).map_err(|source| {
            ProcsError::Parse {
                pid,
                file: "stat",
                source,
            }
        })?;
        let stat = pf.stat().map_err(|source| ProcsError::Parse {
            pid,
            file: "stat",
            source,
        })?;
        let errors = &mut self.errors;

        // Kernel threads have no executable (`exe` is ENOENT): not an error.
        let kernel_thread = stat.flags & PF_KTHREAD != 0;
        let exe = match pf.exe() {
            Ok(p) => Some(p),
            Err(_) if kernel_thread => None,
            Err(e) => {
                errors.count(ProcsErrorKind::Exe, || format!("pid {pid}: {e}"));
                None
            }
        };
        let cmdline = match read_bounded(&dir.join("cmdline"), MAX_CMDLINE_BYTES) {
            Ok(b) => b
                .split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .take(MAX_CMDLINE_ARGS)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
            Err(e) => {
                errors.count(ProcsErrorKind::Cmdline, || format!("pid {pid}: {e}"));
                Vec::new()
            }
        };
        let nspid = match read_bounded(&dir.join("status"), MAX_SMALL_FILE) {
            Ok(b) => innermost_nspid(&String::from_utf8_lossy(&b)),
            Err(e) => {
                errors.count(ProcsErrorKind::Status, || format!("pid {pid}: {e}"));
                None
            }
        };
        let (cgroup, container_id) = match read_bounded(&dir.join("cgroup"), MAX_SMALL_FILE) {
            Ok(b) => from_cgroup_file(&String::from_utf8_lossy(&b)),
            Err(e) => {
                errors.count(ProcsErrorKind::Cgroup, || format!("pid {pid}: {e}"));
                (None, None)
            }
        };
        let mappings = read_maps(&dir, pid, errors).unwrap_or_else(|e| {
            errors.count(ProcsErrorKind::Maps, || e.to_string());
            Vec::new()
        });
        Ok(Process {
            pid,
            comm: stat.comm,
            exe,
            cmdline,
            start_time_ticks: stat.starttime,
            ns_pid: nspid.map(|n| n.0),
            nested_pid_ns: nspid.is_some_and(|n| n.1),
            cgroup,
            container_id,
            root: dir.join("root"),
            mappings,
            mappings_generation: 0,
            exited: false,
            proc_dir: dir,
            ns_tids: Mutex::new(Lru::new(MAX_NS_TIDS)),
            files_root: None,
        })
    }
}

/// The mappings of `pid` now, read from `/proc/PID/maps` (bounded; malformed lines skipped):
/// for a one-off look at a process that is not worth a registry entry (the Python attach).
pub fn read_mappings(pid: u32) -> io::Result<Vec<Mapping>> {
    let bytes = read_bounded(
        &Path::new("/proc").join(pid.to_string()).join("maps"),
        MAX_MAPS_BYTES,
    )?;
    Ok(parse_maps(&bytes).0)
}

fn read_maps(dir: &Path, pid: u32, errors: &mut ProcsErrors) -> Result<Vec<Mapping>, ProcsError> {
    let bytes =
        read_bounded(&dir.join("maps"), MAX_MAPS_BYTES).map_err(|source| ProcsError::Read {
            pid,
            file: "maps",
            source,
        })?;
    let (maps, bad) = parse_maps(&bytes);
    for b in bad {
        errors.count(ProcsErrorKind::MapsLine, || format!("pid {pid}: {b}"));
    }
    Ok(maps)
}

#[cfg(test)]
pub(crate) mod tests;
