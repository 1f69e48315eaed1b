//! Ctrl-C, SIGTERM and SIGHUP: the first one asks the sampling loop to stop and write what it
//! has; a second one abandons the output being written (its temporary file is removed; files
//! already written stay complete) and skips the rest; the handler is then reset so a third
//! one ends the process at once.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Set by the first SIGINT/SIGTERM/SIGHUP.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Set by the second: stop writing.
pub static ABORT: AtomicBool = AtomicBool::new(false);

/// Signals received.
static RECEIVED: AtomicU32 = AtomicU32::new(0);

/// The signals handled.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    let n = RECEIVED.fetch_add(1, Ordering::Relaxed) + 1;
    STOP.store(true, Ordering::Relaxed);
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
