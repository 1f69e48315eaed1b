//! Ctrl-C, SIGTERM and SIGHUP: the first one asks the sampling loop to stop and write what it
//! has; a second one abandons the output being written (its temporary file is removed; files
//! already written stay complete) and skips the rest; the handler is then reset so a third
//! one ends the process at once. The handler also writes the drain thread's eventfd
//! ([`wake_fd`]), so the pipeline, asleep until its next batch, wakes at once.

use std::io::{self, Write};
use std::os::fd::{AsFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// Set by the first SIGINT/SIGTERM/SIGHUP.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Set by the second: stop writing.
pub static ABORT: AtomicBool = AtomicBool::new(false);

/// Signals received.
static RECEIVED: AtomicU32 = AtomicU32::new(0);

/// The eventfd a signal writes ([`wake_fd`]; `-1` until created).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// It, owned for the life of the process (a signal may write it at any time).
static WAKE: OnceLock<OwnedFd> = OnceLock::new();

/// The signals handled.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The eventfd every stop signal writes (created on first use, open until the process ends):
/// the drain thread polls it, and [`super::drain::Drain::finish`] writes it too.
pub fn wake_fd() -> BorrowedFd<'static> {
    WAKE.get_or_init(|| {
        // SAFETY: eventfd has no preconditions; a non-negative result is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(fd >= 0, "eventfd: {}", io::Error::last_os_error());
        WAKE_FD.store(fd, Ordering::Release);
        // SAFETY: `fd` is a fresh descriptor owned by nothing else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    })
    .as_fd()
}

extern "C" fn on_signal(sig: libc::c_int) {
    let n = RECEIVED.fetch_add(1, Ordering::Relaxed) + 1;
    STOP.store(true, Ordering::Relaxed);
    let fd = WAKE_FD.load(Ordering::Acquire);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) is async-signal-safe; 8 bytes from a live buffer to an eventfd.
        let _ = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    }
    if n >= 2 {
        ABORT.store(true, Ordering::Relaxed);
        // SAFETY: async-signal-safe; restores the default action for the next signal.
        unsafe {
            for s in SIGNALS {
                libc::signal(s, libc::SIG_DFL);
            }
        }
    }
    let _ = sig;
}

/// Installs the handlers (without SA_RESTART, so a blocking poll returns EINTR promptly).
pub fn install() {
    for sig in SIGNALS {
        // SAFETY: a plain handler that only touches atomics and calls signal(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&raw mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &raw const sa, std::ptr::null_mut());
        }
    }
}

/// Whether a second signal asked to stop writing.
pub fn aborted() -> bool {
    ABORT.load(Ordering::Relaxed)
}

/// A writer that fails once [`ABORT`] is set, so a renderer stops within one buffer.
pub struct Abortable<'a>(pub &'a mut dyn Write);

impl Write for Abortable<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if aborted() {
            // Not `Interrupted`: `write_all` would retry that.
            return Err(io::Error::other("interrupted by a second signal"));
        }
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}
