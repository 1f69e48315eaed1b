//! `CollectError`: everything that can stop the collector from starting or running.
//!
//! Every variant displays as ONE line a user can act on (the CLI prints it after `pyebpf: `),
//! with the failing thing (CPU, program, map, pid) in a field. Long kernel output such as the
//! verifier log is kept in a field, not in the message.
use std::io;

/// Errors of the `collect` stage.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// The binary was built with `PYEBPF_SKIP_EBPF=1`: the embedded object is empty.
    #[error(
        "pyebpf was built without eBPF programs (PYEBPF_SKIP_EBPF=1): rebuild it without that \
         variable to record"
    )]
    NotBuilt,
    /// A `CollectConfig` value the kernel side cannot take.
    #[error("invalid {setting}: {reason}")]
    InvalidConfig {
        /// The offending setting.
        setting: &'static str,
        /// Why, including the accepted values.
        reason: String,
    },
    /// Parsing the object or creating its maps failed.
    #[error("cannot load the eBPF object: {reason}{}", permission_hint_text(*errno, "CAP_BPF"))]
    LoadObject {
        /// The flattened aya error.
        reason: String,
        /// errno when the cause was a syscall.
        errno: Option<i32>,
    },
    /// The verifier (or the bpf syscall) refused a program.
    #[error("the kernel refused eBPF program {program}: {reason}{}", permission_hint_text(*errno, "CAP_BPF"))]
    ProgramLoad {
        /// Program name (see `sampler_common::programs`).
        program: &'static str,
        /// The syscall error.
        reason: String,
        /// errno of the load.
        errno: Option<i32>,
        /// The verifier's log (possibly empty); see [`CollectError::verifier_log`].
        verifier_log: String,
    },
    /// The embedded object lacks a program or map the contract names (stale build).
    #[error("the eBPF object has no {kind} named {name}: rebuild pyebpf")]
    MissingInObject {
        /// "program" or "map".
        kind: &'static str,
        /// The name looked up.
        name: &'static str,
    },
    /// tracefs is not mounted and could not be mounted.
    #[error(
        "tracefs is not available ({reason}): mount it with `mount -t tracefs nodev \
         /sys/kernel/tracing`"
    )]
    Tracefs {
        /// What failed.
        reason: String,
    },
    /// Attaching a process-event tracepoint failed.
    #[error("cannot attach tracepoint {category}/{name}: {reason}{}", permission_hint_text(*errno, "CAP_PERFMON"))]
    AttachTracepoint {
        /// Tracepoint category.
        category: &'static str,
        /// Tracepoint name.
        name: &'static str,
        /// The flattened aya error.
        reason: String,
        /// errno when the cause was a syscall.
        errno: Option<i32>,
    },
    /// Opening or attaching the CPU-clock perf event failed on one CPU.
    #[error("cannot attach perf event on CPU {cpu}: {reason}{}", perf_hint(*errno))]
    AttachPerf {
        /// The CPU.
        cpu: u32,
        /// The flattened aya error.
        reason: String,
        /// errno when the cause was a syscall.
        errno: Option<i32>,
    },
    /// `/sys/devices/system/cpu/online` could not be read.
    #[error("cannot list online CPUs ({path}): {source}")]
    OnlineCpus {
        /// The file read.
        path: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A map operation failed.
    #[error("cannot use eBPF map {map}: {reason}")]
    Map {
        /// Map name.
        map: &'static str,
        /// The flattened aya error.
        reason: String,
    },
    /// `TARGET_PIDS` is full.
    #[error("cannot follow pid {pid}: the target table is full ({capacity} processes)")]
    TargetsFull {
        /// The pid that did not fit.
        pid: u32,
        /// The table's capacity.
        capacity: u32,
    },
    /// `PY_PROCS` is full.
    #[error(
        "cannot profile Python frames of pid {pid}: the Python process table is full ({capacity} \
         processes)"
    )]
    PythonProcsFull {
        /// The pid that did not fit.
        pid: u32,
        /// The table's capacity.
        capacity: u32,
    },
    /// A `PyProcInfo` the kernel walk cannot use.
    #[error("cannot walk Python frames of pid {pid} in the kernel: {reason}")]
    PythonOffsets {
        /// The process.
        pid: u32,
        /// What does not fit.
        reason: String,
    },
    /// The kernel lacks what a program (or the forced variant of one) needs.
    #[error("this kernel cannot run {what}: it lacks {missing}")]
    KernelFeatures {
        /// The program or variant, e.g. "the sampling program".
        what: String,
        /// The missing features with the Linux version of each, comma-separated.
        missing: String,
    },
    /// A map handle that is handed out once was asked for again.
    #[error("eBPF map {map} was already taken from the collector")]
    AlreadyTaken {
        /// Map name.
        map: &'static str,
    },
    /// `poll(2)` on the ring buffer failed (EINTR is not an error).
    #[error("cannot wait for eBPF events: {source}")]
    Poll {
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl CollectError {
    /// The verifier's log when a program was refused (for `--verbose` output or bug reports).
    pub fn verifier_log(&self) -> Option<&str> {
        match self {
            CollectError::ProgramLoad { verifier_log, .. } if !verifier_log.is_empty() => {
                Some(verifier_log)
            }
            _ => None,
        }
    }
}

/// `" (need root or <cap>)"` when `errno` is a permission error, else "".
fn permission_hint_text(errno: Option<i32>, cap: &str) -> String {
    match errno {
        Some(libc::EPERM | libc::EACCES) => format!(" (need root or {cap})"),
        _ => String::new(),
    }
}

/// Hint for the errors `perf_event_open` commonly returns.
fn perf_hint(errno: Option<i32>) -> String {
    match errno {
        Some(libc::EPERM | libc::EACCES) => " (need root or CAP_PERFMON)".into(),
        Some(libc::EINVAL) => " (is the rate above kernel.perf_event_max_sample_rate?)".into(),
        Some(libc::EMFILE) => " (too many open files: raise `ulimit -n`)".into(),
        Some(libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP) => {
            " (this kernel has no CPU-clock perf event)".into()
        }
        _ => String::new(),
    }
}

/// Flatten an error and its sources into one line: messages joined with ": ", each cut at its
/// first newline, repeats skipped (many errors already print their source), capped in length.
pub(crate) fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    const MAX: usize = 400;
    let mut out = String::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or("").trim();
        if !first.is_empty() && !out.contains(first) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(first);
        }
        next = e.source();
    }
    if out.len() > MAX {
        let mut cut = MAX;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// The errno at the bottom of an error chain, if it is an OS error.
pub(crate) fn errno_of(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut next = Some(err);
    let mut found = None;
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && let Some(code) = io.raw_os_error()
        {
            found = Some(code);
        }
        next = e.source();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer failed: {inner}")]
    struct Outer {
        #[source]
        inner: io::Error,
    }

    #[test]
    fn one_line_skips_repeated_sources_and_newlines() {
        let e = Outer {
            inner: io::Error::from_raw_os_error(libc::EPERM),
        };
        let line = one_line(&e);
        assert!(!line.contains('\n'));
        assert_eq!(line.matches("Operation not permitted").count(), 1, "{line}");
        assert_eq!(errno_of(&e), Some(libc::EPERM));
    }

    #[test]
    fn multi_line_messages_keep_the_first_line() {
        let e = io::Error::other("first\nverifier line 1\nverifier line 2");
        assert_eq!(one_line(&e), "first");
    }

    #[test]
    fn displays_are_one_line_with_hints() {
        let e = CollectError::AttachPerf {
            cpu: 1,
            reason: "perf_event_open failed: Permission denied (os error 13)".into(),
            errno: Some(libc::EACCES),
        };
        let s = e.to_string();
        assert_eq!(
            s,
            "cannot attach perf event on CPU 1: perf_event_open failed: Permission denied (os \
             error 13) (need root or CAP_PERFMON)"
        );
        let e = CollectError::ProgramLoad {
            program: "pyebpf_sample",
            reason: "Invalid argument (os error 22)".into(),
            errno: Some(libc::EINVAL),
            verifier_log: "0: (bf) r6 = r1\n1: ...".into(),
        };
        assert!(!e.to_string().contains('\n'));
        assert_eq!(e.verifier_log(), Some("0: (bf) r6 = r1\n1: ..."));
        for e in [
            CollectError::NotBuilt,
            CollectError::TargetsFull {
                pid: 5,
                capacity: 4096,
            },
            CollectError::Tracefs { reason: "x".into() },
        ] {
            assert!(!e.to_string().contains('\n'));
        }
    }
}
