//! `--threads`: the names of one Python process's threads during `record`.
//!
//! Owns: [`ThreadNames`] — host tid → name (the thread's `threading` name, else its OS name,
//! provisional while the thread runs Python and may still get a `threading` name) — and the
//! poll of a process whose threads come and go.
//! Input: a sample's host tid and whether it showed the thread running Python; the process's
//! reader. Output: the name.
//! Constraints: a sample is resolved up to ~100 ms after it was taken (the drain's flush
//! period), and a thread started for one request has often ended by then, its entry gone from
//! `threading._active`. So a process whose samples keep showing threads not sampled before is
//! polled: the names of its live threads are read every [`POLL_EVERY`], for [`POLL_FOR`]
//! after the last first sample of a thread, so a new thread is named while it runs, before its
//! samples arrive. A poll reads the thread list and `threading._active` (its address cached by
//! the reader): a few reads per live thread, no frames, nothing read for a process whose
//! threads are all known. Lookup failures (threads start and end while they are read) are not
//! sample errors and are not counted. The host tid is the thread's identity: Linux hands a tid
//! out again only after the pid space wraps, and every read rewrites the names of the threads
//! it finds alive. Bounded: [`MAX_THREAD_NAMES`] names per process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lru::Lru;
use crate::python::PythonProcess;

/// Most cached thread names per process.
const MAX_THREAD_NAMES: usize = 4096;
/// Least time between two thread-list reads of one process for a sample (not polling).
const THREADS_EVERY: Duration = Duration::from_millis(100);
/// Lookups of a Python thread's `threading` name before its OS name is final.
const NAME_TRIES: u8 = 4;
/// Least time between two reads when a Python thread without a known name shows up.
const UNKNOWN_THREAD_EVERY: Duration = Duration::from_millis(5);
/// The poll period: a thread that lives longer than this while polled is named before it
/// ends.
pub const POLL_EVERY: Duration = Duration::from_millis(10);
/// How long a process is polled after a thread's first sample.
pub const POLL_FOR: Duration = Duration::from_secs(2);

/// A known name.
struct Entry {
    name: Arc<str>,
    /// A sample of the thread was resolved (a poll names threads before their samples come).
    sampled: bool,
}

/// The thread names of one process.
pub struct ThreadNames {
    names: Lru<u32, Entry>,
    /// Threads named by their OS name while they ran Python: looked up again (tries so far).
    provisional: Lru<u32, u8>,
    read_at: Option<Instant>,
    /// Polled until then.
    poll_until: Option<Instant>,
    /// Whether the target shares our pid namespace (known after the first name lookup).
    own_pidns: Option<bool>,
}

impl Default for ThreadNames {
    fn default() -> Self {
        ThreadNames {
            names: Lru::new(MAX_THREAD_NAMES),
            provisional: Lru::new(MAX_THREAD_NAMES),
            read_at: None,
            poll_until: None,
            own_pidns: None,
        }
    }
}

impl ThreadNames {
    /// The `threading` name of host thread `tid`, else its OS name. `python_thread` says
    /// whether the sample showed it running Python: then a name not known yet is looked up at
    /// once (every [`UNKNOWN_THREAD_EVERY`] at most) and again a few times while it only has
    /// its OS name, and the first sample of a thread starts (or extends) the poll.
    pub fn name(
        &mut self,
        process: &mut PythonProcess,
        tid: u32,
        python_thread: bool,
    ) -> Option<Arc<str>> {
        let now = Instant::now();
        let first = self
            .names
            .get_mut(&tid)
            .is_none_or(|e| !std::mem::replace(&mut e.sampled, true));
        if first && python_thread {
            self.poll_until = Some(now + POLL_FOR);
        }
        let since = self.read_at.map(|t| now.duration_since(t));
        let known = self.names.get(&tid).map(|e| e.name.clone());
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
            self.read(process, now);
            if !self.provisional.contains(&tid)
                && let Some(e) = self.names.get_mut(&tid)
            {
                e.sampled = true;
                return Some(e.name.clone());
            }
        }
        let os: Arc<str> = crate::python::os_thread_name(process.pid(), tid)?.into();
        self.names.insert(
            tid,
            Entry {
                name: os.clone(),
                sampled: true,
            },
        );
        let tries = self.provisional.peek(&tid).copied().unwrap_or(0) + 1;
        if !python_thread || tries >= NAME_TRIES {
            self.provisional.remove(&tid);
        } else {
            self.provisional.insert(tid, tries);
        }
        Some(os)
    }

    /// When the next poll is due (`None`: not polling).
    pub fn due(&self) -> Option<Instant> {
        let until = self.poll_until?;
        let due = self.read_at.map_or(now_or(until), |t| t + POLL_EVERY);
        (due <= until).then_some(due)
    }

    /// Polls when due (see [`Self::due`]); the poll ends [`POLL_FOR`] after the last first
    /// sample of a thread.
    pub fn poll(&mut self, process: &mut PythonProcess, now: Instant) {
        if self.due().is_some_and(|d| d <= now) {
            self.read(process, now);
        }
        if self.poll_until.is_some_and(|u| now >= u) {
            self.poll_until = None;
        }
    }

    /// Reads the names of the live threads.
    fn read(&mut self, process: &mut PythonProcess, now: Instant) {
        self.read_at = Some(now);
        let Ok(names) = process.thread_names() else {
            return;
        };
        let map = self.host_tid_map(process.pid(), !names.is_empty());
        for (native, name) in names {
            let host = u32::try_from(native).ok().and_then(|n| match &map {
                None => Some(n),
                Some(m) => m.get(&n).copied(),
            });
            let Some(h) = host else { continue };
            self.provisional.remove(&h);
            match self.names.get_mut(&h) {
                Some(e) if *e.name == *name => {}
                Some(e) => e.name = name.into(),
                None => {
                    self.names.insert(
                        h,
                        Entry {
                            name: name.into(),
                            sampled: false,
                        },
                    );
                }
            }
        }
    }

    /// Native thread id (the target's pid namespace) → host tid: `None` when they are the
    /// same (the target shares our pid namespace), else the map from `/proc/PID/task/*/status`
    /// (read only then, and only when `needed`).
    fn host_tid_map(
        &mut self,
        pid: u32,
        needed: bool,
    ) -> Option<std::collections::HashMap<u32, u32>> {
        let own = *self.own_pidns.get_or_insert_with(|| {
            crate::python::kernel::pid_namespace(pid).is_ok_and(|ns| ns == (0, 0))
        });
        (!own && needed).then(|| crate::python::host_tid_map(pid))
    }
}

/// The start of a poll that ends at `until` (its first read is due at once).
fn now_or(until: Instant) -> Instant {
    until.checked_sub(POLL_FOR).unwrap_or(until)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::process::{Command, Stdio};

    use super::*;

    /// Prints the main thread's native id, then per stdin line starts a thread of that name
    /// that sleeps 0.3 s, prints its native id, and "ended" once it was joined.
    const SCRIPT: &str = "import sys, threading, time\n\
print(threading.get_native_id(), flush=True)\n\
for line in sys.stdin:\n    \
t = threading.Thread(target=time.sleep, args=(0.3,), name=line.strip())\n    \
t.start()\n    print(t.native_id, flush=True)\n    t.join()\n    print('ended', flush=True)\n";

    const PYTHONS: [(&str, &str); 3] = [
        ("3.10", "/root/.pyenv/versions/3.10.13/bin/python3.10"),
        ("3.12", "/root/.pyenv/versions/3.12.1/bin/python3.12"),
        (
            "3.13t",
            "/var/cache/pyebpf-test/pythons/3.13t/bin/python3.13t",
        ),
    ];

    /// A thread that starts after the poll began and ends before its sample is resolved is
    /// named (by the poll); without the poll it is not. The poll ends [`POLL_FOR`] after the
    /// last first sample of a thread.
    #[test]
    fn a_polled_thread_keeps_its_name_after_it_ended() {
        for (name, python) in PYTHONS {
            if !std::path::Path::new(python).exists() {
                crate::procs::tests::missing(&format!("interpreter {name} at {python}"));
                continue;
            }
            let mut child = Command::new(python)
                .args(["-c", SCRIPT])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut stdin = child.stdin.take().unwrap();
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut line = || {
                let mut l = String::new();
                out.read_line(&mut l).unwrap();
                l.trim().to_owned()
            };
            let main: u32 = line().parse().unwrap();
            let pid = child.id();
            let mut process = PythonProcess::attach(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mut polled = ThreadNames::default();
            assert_eq!(
                polled.name(&mut process, main, true).as_deref(),
                Some("MainThread")
            );
            assert!(
                polled.due().is_some(),
                "{name}: a first sample starts the poll"
            );

            writeln!(stdin, "req-1").unwrap();
            let tid: u32 = line().parse().unwrap();
            std::thread::sleep(POLL_EVERY * 2);
            polled.poll(&mut process, Instant::now());
            assert_eq!(line(), "ended");
            let mut unpolled = ThreadNames::default();
            let late = unpolled.name(&mut process, tid, true);
            assert_ne!(
                late.as_deref(),
                Some("req-1"),
                "{name}: the thread had ended"
            );
            assert_eq!(
                polled.name(&mut process, tid, true).as_deref(),
                Some("req-1"),
                "{name}"
            );

            let end = Instant::now() + POLL_FOR + POLL_EVERY;
            polled.poll(&mut process, end);
            assert_eq!(polled.due(), None, "{name}: no new thread for {POLL_FOR:?}");
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
