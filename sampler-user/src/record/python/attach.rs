//! Attaching to processes off the Python stage's path: worker threads with a two-level queue.
//!
//! Why: deciding that a process is *not* Python reads the symbol tables of its mapped files
//! (once per file); a host with a large binary (say `librustc_driver`, tens of MB of symbols)
//! costs seconds the first time. Done on the Python stage, that would hold back the resolution
//! of every other process's samples; done here, it only delays that one verdict.
//!
//! Owns: the request queue (high priority: exec, fork, first sample of an unknown pid, retries;
//! low: the `--all` start-up scan, promoted when a sample shows the pid is busy) and two
//! workers: one takes urgent requests only, the other urgent ones first, then the scan — so a
//! slow scan item never delays an urgent attach, and one slow attach does not stop the rest.
//! Input: [`Request`]s. Output: [`Attached`] results, in completion order, handed to the
//! callback the queue was started with (the stage's input: a result wakes the stage, which
//! never polls for them); the tracker matches them to its requests by id and drops stale ones.
//! Constraints: the workers never touch `PY_PROCS` (the tracker announces a process only
//! once it holds the result); they stop when the tracker is dropped or the callback refuses.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use sampler_common::PyProcInfo;

use crate::python::kernel::kernel_info;
use crate::python::{PyError, PythonProcess};

/// One attach to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The process.
    pub pid: u32,
    /// The tracker's id of this request.
    pub id: u64,
}

/// A successful attach, ready for the stage.
pub struct Ready {
    /// The reader.
    pub process: PythonProcess,
    /// What the kernel walk needs.
    pub info: PyProcInfo,
    /// `/proc/PID/comm` at the attach.
    pub comm: String,
}

/// The outcome of one [`Request`].
pub struct Attached {
    /// The request.
    pub req: Request,
    /// The process, or why not.
    pub result: Result<Box<Ready>, PyError>,
}

#[derive(Default)]
struct Queues {
    high: VecDeque<Request>,
    low: VecDeque<Request>,
    closed: bool,
}

/// Where a worker hands a result; `false` stops it (the receiving end is gone).
type Deliver = Arc<dyn Fn(Attached) -> bool + Send + Sync>;

/// The tracker's end: submit requests (results go to the callback).
pub struct AttachQueue {
    shared: Arc<(Mutex<Queues>, Condvar)>,
}

impl Drop for AttachQueue {
    fn drop(&mut self) {
        if let Ok(mut q) = self.shared.0.lock() {
            q.closed = true;
        }
        self.shared.1.notify_all();
    }
}

impl AttachQueue {
    /// Starts the workers; each result goes to `deliver`.
    pub fn start(deliver: impl Fn(Attached) -> bool + Send + Sync + 'static) -> Self {
        let shared = Arc::new((Mutex::new(Queues::default()), Condvar::new()));
        let deliver: Deliver = Arc::new(deliver);
        for urgent_only in [true, false] {
            let (worker, deliver) = (Arc::clone(&shared), Arc::clone(&deliver));
            // Not joined: an attach in progress at the end of the run must not delay the output.
            let spawned = std::thread::Builder::new()
                .name("pyebpf-attach".into())
                .spawn(move || work(&worker, &*deliver, urgent_only));
            if let Err(e) = spawned {
                tracing::warn!("cannot start an attach thread: {e}");
            }
        }
        AttachQueue { shared }
    }

    /// Queues `req`; `urgent` ones go before every start-up scan request.
    pub fn submit(&self, req: Request, urgent: bool) {
        if let Ok(mut q) = self.shared.0.lock() {
            if urgent {
                q.high.push_back(req);
            } else {
                q.low.push_back(req);
            }
        }
        // Both workers: the urgent-only one may be the idle one.
        self.shared.1.notify_all();
    }

    /// Moves the scan request for `pid`, if still queued, to the urgent queue.
    pub fn promote(&self, pid: u32) {
        if let Ok(mut q) = self.shared.0.lock()
            && let Some(i) = q.low.iter().position(|r| r.pid == pid)
            && let Some(r) = q.low.remove(i)
        {
            q.high.push_back(r);
            self.shared.1.notify_all();
        }
    }
}

fn work(
    shared: &(Mutex<Queues>, Condvar),
    deliver: &(dyn Fn(Attached) -> bool + Send + Sync),
    urgent_only: bool,
) {
    loop {
        let req = {
            let Ok(mut q) = shared.0.lock() else { return };
            loop {
                if q.closed {
                    return;
                }
                let next = match q.high.pop_front() {
                    Some(r) => Some(r),
                    None if urgent_only => None,
                    None => q.low.pop_front(),
                };
                if let Some(r) = next {
                    break r;
                }
                // Nothing queued: what the attaches freed goes back to the kernel.
                drop(q);
                crate::record::release_free_memory();
                let Ok(relocked) = shared.0.lock() else {
                    return;
                };
                q = relocked;
                if q.closed || !q.high.is_empty() || (!urgent_only && !q.low.is_empty()) {
                    continue;
                }
                q = match shared.1.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
        };
        let t0 = std::time::Instant::now();
        let result = attach(req.pid).map(Box::new);
        tracing::debug!(
            "attach of pid {} ({}): {:?}, {}",
            req.pid,
            if urgent_only {
                "urgent worker"
            } else {
                "scan worker"
            },
            t0.elapsed(),
            result
                .as_ref()
                .map_or_else(ToString::to_string, |_| "Python".into())
        );
        if !deliver(Attached { req, result }) {
            return;
        }
    }
}

/// Attaches `pid` and derives everything the run needs from it.
pub fn attach(pid: u32) -> Result<Ready, PyError> {
    if pid == 0 || pid == std::process::id() {
        return Err(PyError::NotPython { pid });
    }
    let process = PythonProcess::attach(pid)?;
    let info = kernel_info(&process)?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default();
    Ok(Ready {
        process,
        info,
        comm,
    })
}
