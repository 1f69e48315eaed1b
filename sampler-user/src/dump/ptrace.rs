//! Stopping one thread of a live process just long enough to copy its registers and stack
//! (`dump --native`).
//!
//! Owns: [`ThreadStop`] — `PTRACE_SEIZE` + `PTRACE_INTERRUPT` on one thread, wait for its stop,
//! `PTRACE_GETREGS`, and `PTRACE_DETACH` on drop (re-injecting a signal that arrived meanwhile)
//! — and [`read_stack`], the copy of a stack region through `process_vm_readv(2)`.
//! Why raw ptrace and not a crate: seize + interrupt stops a single thread without sending it a
//! signal (no `SIGSTOP` that job control or the program could observe, unlike
//! `PTRACE_ATTACH`), and detaching resumes it at once; so each thread is stopped alone, for the
//! time of one register read, one stack copy and one walk of its Python frames, while the other
//! threads run. `remoteprocess` (the design's crate for this) stops threads through
//! `PTRACE_ATTACH` and keeps a process-wide lock; it was removed as unused by the `procs` layer.
//! Input: a thread id on the host. Output: its registers; failures as [`StopError`].
//! Constraints: one tracer thread does every call (ptrace is per tracer thread); the thread is
//! never left stopped: [`ThreadStop`] detaches on drop, also on every error path.

use std::time::{Duration, Instant};

/// Registers of a stopped thread that the unwinder and the merge need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoppedRegs {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    /// The thread pointer (`pthread_self()` on glibc).
    pub fs_base: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    #[error("thread {tid} is gone")]
    Gone { tid: u32 },
    #[error("cannot stop thread {tid}: {errno}")]
    Ptrace { tid: u32, errno: i32 },
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A thread stopped by us; resumed when dropped.
pub struct ThreadStop {
    tid: u32,
    /// A signal that stopped the thread instead of our interrupt, delivered on detach.
    pending_signal: i32,
    /// When the wait saw it stopped (its pause starts no earlier).
    stopped_at: Instant,
    /// From our interrupt to its stop (the thread runs meanwhile).
    stop_latency: Duration,
}

impl ThreadStop {
    /// Seizes and interrupts thread `tid`, and waits until it is stopped.
    pub fn stop(tid: u32) -> Result<ThreadStop, StopError> {
        let pid = tid as libc::pid_t;
        let fail = |e: i32| {
            if e == libc::ESRCH {
                StopError::Gone { tid }
            } else {
                StopError::Ptrace { tid, errno: e }
            }
        };
        // SAFETY: PTRACE_SEIZE takes a pid and ignores addr; data 0 = no options.
        if unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) } != 0 {
            return Err(fail(errno()));
        }
        let started = Instant::now();
        // SAFETY: as above; the thread is our tracee now.
        if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) } != 0 {
            let e = errno();
            // Not stopped: a seized tracee that is running cannot be detached; it is detached
            // by the kernel when it exits, or now if it is in fact stopped.
            // SAFETY: detach of our tracee.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
            return Err(fail(e));
        }
        let mut stop = ThreadStop {
            tid,
            pending_signal: 0,
            stopped_at: started,
            stop_latency: Duration::ZERO,
        };
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our tracee; `__WALL` because it is a thread, not a child.
            let r = unsafe { libc::waitpid(pid, &raw mut status, libc::__WALL) };
            if r < 0 {
                let e = errno();
                if e == libc::EINTR {
                    continue;
                }
                std::mem::forget(stop); // nothing to detach
                return Err(fail(e));
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                std::mem::forget(stop);
                return Err(StopError::Gone { tid });
            }
            if libc::WIFSTOPPED(status) {
                stop.stopped_at = Instant::now();
                stop.stop_latency = stop.stopped_at - started;
                // Our interrupt shows as PTRACE_EVENT_STOP; any other stop (a signal being
                // delivered) is as good for reading registers: its signal goes back on detach.
                let sig = libc::WSTOPSIG(status);
                let event = (status >> 16) & 0xff;
                if event != libc::PTRACE_EVENT_STOP && sig != libc::SIGTRAP {
                    stop.pending_signal = sig;
                }
                return Ok(stop);
            }
        }
    }

    /// The thread's registers.
    pub fn regs(&self) -> Result<StoppedRegs, StopError> {
        // SAFETY: an all-zero user_regs_struct is a valid value of the plain C struct.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct to `data` of a stopped tracee.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                self.tid as libc::pid_t,
                0,
                &raw mut regs,
            )
        };
        if r != 0 {
            let e = errno();
            return Err(if e == libc::ESRCH {
                StopError::Gone { tid: self.tid }
            } else {
                StopError::Ptrace {
                    tid: self.tid,
                    errno: e,
                }
            });
        }
        Ok(StoppedRegs {
            rip: regs.rip,
            rsp: regs.rsp,
            rbp: regs.rbp,
            fs_base: regs.fs_base,
        })
    }

    /// How long the thread has been stopped so far (from when the wait saw it stop).
    pub fn elapsed(&self) -> Duration {
        self.stopped_at.elapsed()
    }

    /// How long it took to stop after our interrupt (it kept running meanwhile).
    pub fn stop_latency(&self) -> Duration {
        self.stop_latency
    }
}

impl Drop for ThreadStop {
    fn drop(&mut self) {
        // SAFETY: detach (and resume) our stopped tracee, delivering a signal it received.
        unsafe {
            libc::ptrace(
                libc::PTRACE_DETACH,
                self.tid as libc::pid_t,
                0,
                libc::c_long::from(self.pending_signal),
            )
        };
    }
}

/// Largest stack copy per thread (deep C recursion beyond it ends the native stack there).
pub const MAX_STACK_COPY: u64 = 512 << 10;

/// Copies `[from, to)` of `pid`'s memory (at most [`MAX_STACK_COPY`] bytes): as much as can be
/// read from `from` on, in pages (a guard page or a hole ends the copy).
pub fn read_stack(pid: u32, from: u64, to: u64) -> Vec<u8> {
    let len = to.saturating_sub(from).min(MAX_STACK_COPY) as usize;
    let mut out = vec![0u8; len];
    // One call for the whole range; on a short read, what was read is kept.
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: from as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes exactly `out`, which we own; the remote iovec is interpreted in
    // the target's address space by the kernel.
    let n = unsafe {
        libc::process_vm_readv(
            pid as libc::pid_t,
            &raw const local,
            1,
            &raw const remote,
            1,
            0,
        )
    };
    out.truncate(usize::try_from(n).unwrap_or(0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_a_thread_of_a_child_and_resumes_it() {
        if !crate::procs::tests::require_root("stops_a_thread_of_a_child_and_resumes_it") {
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let stop = ThreadStop::stop(pid).unwrap();
        let regs = stop.regs().unwrap();
        assert!(regs.rip != 0 && regs.rsp != 0, "{regs:?}");
        let stack = read_stack(pid, regs.rsp, regs.rsp + 4096);
        assert!(!stack.is_empty());
        let state = |pid: u32| {
            let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            s.rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned()
        };
        assert_eq!(state(pid), "t", "traced and stopped");
        drop(stop);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(state(pid), "S", "resumed: sleeping again");
        // A thread that does not exist.
        assert!(matches!(
            ThreadStop::stop(0x7fff_fff0),
            Err(StopError::Gone { .. })
        ));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
