//! Ctrl-C and SIGTERM: the first one asks the sampling loop to stop and write what it has;
//! the handler is then reset so a second one ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT/SIGTERM.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
    // SAFETY: async-signal-safe; restores the default action for the next signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Installs the handlers (without SA_RESTART, so a blocking poll returns EINTR promptly).
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a plain handler that only touches an atomic and calls signal(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&raw mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &raw const sa, std::ptr::null_mut());
        }
    }
}
