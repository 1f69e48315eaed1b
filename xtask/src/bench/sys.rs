//! The three system calls the harness needs and std does not offer: `CLOCK_MONOTONIC` as a
//! number (the workloads report times on the same clock, `time.monotonic()`), `wait4` (the
//! profiler's CPU time and peak RSS, from the kernel's rusage of the reaped child) and `kill`
//! with a chosen signal (profilers stop cleanly on SIGINT). Declared here against the C library
//! std already links, for 64-bit Linux (`long` and `time_t` are 64 bits).
use std::io;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

#[repr(C)]
struct Timeval {
    tv_sec: i64,
    tv_usec: i64,
}

/// `struct rusage`: two timevals, then fourteen longs (`ru_maxrss` first).
#[repr(C)]
struct Rusage {
    utime: Timeval,
    stime: Timeval,
    maxrss: i64,
    rest: [i64; 13],
}

unsafe extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
}

const CLOCK_MONOTONIC: i32 = 1;
const WNOHANG: i32 = 1;
pub const SIGINT: i32 = 2;
pub const SIGKILL: i32 = 9;

/// `CLOCK_MONOTONIC` in seconds: Python's `time.monotonic()` on Linux reads the same clock.
pub fn monotonic_s() -> f64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { clock_gettime(CLOCK_MONOTONIC, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// How a reaped child ended, with its resource usage (its own, not its children's).
#[derive(Clone, Copy, Debug)]
pub struct Reaped {
    /// Raw wait status.
    pub status: i32,
    /// User + system CPU seconds.
    pub cpu_s: f64,
    /// Peak resident set size in KiB (`ru_maxrss`).
    pub maxrss_kib: u64,
}

impl Reaped {
    /// Exit code, when it exited rather than died of a signal.
    pub fn code(&self) -> Option<i32> {
        let signal = self.status & 0x7f;
        (signal == 0).then_some((self.status >> 8) & 0xff)
    }

    /// "exit 0", "signal 9".
    pub fn describe(&self) -> String {
        self.code().map_or_else(
            || format!("signal {}", self.status & 0x7f),
            |c| format!("exit {c}"),
        )
    }
}

/// Reaps `pid` if it has ended (`block`: wait until it does). `Ok(None)`: still running.
pub fn reap(pid: u32, block: bool) -> io::Result<Option<Reaped>> {
    let mut status = 0;
    let mut ru = Rusage {
        utime: Timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        stime: Timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        maxrss: 0,
        rest: [0; 13],
    };
    loop {
        // SAFETY: `status` and `ru` are valid and writable for the call; `pid` is our child.
        let rc = unsafe {
            wait4(
                pid as i32,
                &raw mut status,
                if block { 0 } else { WNOHANG },
                &raw mut ru,
            )
        };
        if rc == 0 {
            return Ok(None);
        }
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let secs = |t: &Timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        return Ok(Some(Reaped {
            status,
            cpu_s: secs(&ru.utime) + secs(&ru.stime),
            maxrss_kib: u64::try_from(ru.maxrss).unwrap_or(0),
        }));
    }
}

/// Sends `sig` to `pid` (our own child, by pid; never by name).
pub fn signal(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: plain system call on a pid we started and have not reaped yet.
    if unsafe { kill(pid as i32, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
