//! Errors of the CPython reader and the counters of per-sample failures.
//!
//! Owns: [`PyError`] (fatal for one call: attach, snapshot, resolve) and [`ErrorCounts`]
//! (failures inside a snapshot that cost a frame, a line or a name but not the whole stack;
//! counted by [`ErrorKind`], reported at the end, style rule 9).
//! Constraints: every `Display` is one line; the four user-facing ones are fixed by the `dump`
//! contract ("pid N is not a Python process", "unsupported CPython 3.N", "permission denied
//! reading pid N (run as root)", "process N is gone").

use super::memory::MemError;

/// A failure of an attach, a snapshot or a frame resolution.
#[derive(Debug, thiserror::Error)]
pub enum PyError {
    #[error("pid {pid} is not a Python process")]
    NotPython { pid: u32 },
    #[error("unsupported CPython {version}")]
    Unsupported { version: String },
    /// A built-in table (3.8–3.12) does not fit the running binary (a patch release that moved
    /// something): refused rather than read wrong.
    #[error("CPython {version}: layout not recognised ({detail})")]
    NotRecognised { version: String, detail: String },
    #[error("permission denied reading pid {pid} (run as root)")]
    PermissionDenied { pid: u32 },
    #[error("process {pid} is gone")]
    ProcessGone { pid: u32 },
    #[error("cannot read {len} bytes at {addr:#x} in the target")]
    Memory { addr: u64, len: usize },
    #[error("invalid {what} at {addr:#x}: {detail}")]
    Invalid {
        what: &'static str,
        addr: u64,
        detail: String,
    },
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl PyError {
    /// Attaches the pid to a memory error.
    pub fn from_mem(pid: u32, e: MemError) -> PyError {
        match e {
            MemError::Fault { addr, len } | MemError::TooLarge { addr, len } => {
                PyError::Memory { addr, len }
            }
            MemError::Gone => PyError::ProcessGone { pid },
            MemError::Permission => PyError::PermissionDenied { pid },
        }
    }

    /// An I/O error on a `/proc/PID/...` path, mapped to the user-facing kinds.
    pub fn from_proc_io(pid: u32, path: String, e: std::io::Error) -> PyError {
        match e.kind() {
            std::io::ErrorKind::NotFound
                if !std::path::Path::new(&format!("/proc/{pid}")).exists() =>
            {
                PyError::ProcessGone { pid }
            }
            std::io::ErrorKind::PermissionDenied => PyError::PermissionDenied { pid },
            _ => PyError::Io { path, source: e },
        }
    }
}

/// The kinds of counted failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// A read of target memory failed (unmapped, or the object moved under us).
    MemoryRead,
    /// `f_executable` was NULL, a tagged int or a stackref NULL on a Python frame.
    BadExecutable,
    /// The object was not a code object (`ob_type != &PyCode_Type`).
    NotCode,
    /// A code object field (name, file, line table) could not be decoded.
    BadCodeObject,
    /// A cached code object changed at the same address.
    CodeCacheStale,
    /// The code object a frame was sampled with was freed (or replaced at its address) before
    /// it was read: the frame is named from the sample, without a line.
    CodeFreed,
    /// `instr_ptr` was outside `[0, 2 * ob_size)` of its code object: a torn read; line -1.
    TornInstrPtr,
    /// The line table was malformed; line -1.
    BadLineTable,
    /// The thread-local bytecode copy named by `tlbc_index` was unreadable; fell back.
    TlbcFallback,
    /// A frame chain looped.
    FrameLoop,
    /// A frame's `owner` is no value CPython uses: the chain was read while it changed.
    NotAFrame,
    /// A stack was cut at the depth cap.
    DepthTruncated,
    /// More threads (or interpreters) than the caps; the rest were not read.
    TooManyThreads,
    /// A thread list looped or pointed to an unreadable thread state.
    BadThreadList,
    /// The GIL state could not be read.
    GilUnreadable,
    /// `threading._active` could not be read; names fell back to the OS name.
    ThreadNames,
    /// A frame's local names or slots could not be read (`dump --locals`): no locals shown.
    LocalsUnreadable,
    /// A value (or an item of a container) could not be read: shown as `<unreadable>`.
    ValueUnreadable,
    /// An object read as a `str`, `bytes` or `int` (a name, a line table, a thread id) had
    /// another type: shown as `<invalid>` (or dropped), never decoded as garbage; or a ≤ 3.10
    /// frame object was no `PyFrame_Type` (the stack ends there, marked truncated).
    WrongType,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 19] = [
        ErrorKind::MemoryRead,
        ErrorKind::BadExecutable,
        ErrorKind::NotCode,
        ErrorKind::BadCodeObject,
        ErrorKind::CodeCacheStale,
        ErrorKind::CodeFreed,
        ErrorKind::TornInstrPtr,
        ErrorKind::BadLineTable,
        ErrorKind::TlbcFallback,
        ErrorKind::FrameLoop,
        ErrorKind::NotAFrame,
        ErrorKind::DepthTruncated,
        ErrorKind::TooManyThreads,
        ErrorKind::BadThreadList,
        ErrorKind::GilUnreadable,
        ErrorKind::ThreadNames,
        ErrorKind::LocalsUnreadable,
        ErrorKind::ValueUnreadable,
        ErrorKind::WrongType,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::MemoryRead => "memory_read",
            ErrorKind::BadExecutable => "bad_executable",
            ErrorKind::NotCode => "not_code",
            ErrorKind::BadCodeObject => "bad_code_object",
            ErrorKind::CodeCacheStale => "code_cache_stale",
            ErrorKind::CodeFreed => "code_freed",
            ErrorKind::TornInstrPtr => "torn_instr_ptr",
            ErrorKind::BadLineTable => "bad_line_table",
            ErrorKind::TlbcFallback => "tlbc_fallback",
            ErrorKind::FrameLoop => "frame_loop",
            ErrorKind::NotAFrame => "not_a_frame",
            ErrorKind::DepthTruncated => "depth_truncated",
            ErrorKind::TooManyThreads => "too_many_threads",
            ErrorKind::BadThreadList => "bad_thread_list",
            ErrorKind::GilUnreadable => "gil_unreadable",
            ErrorKind::ThreadNames => "thread_names",
            ErrorKind::LocalsUnreadable => "locals_unreadable",
            ErrorKind::ValueUnreadable => "value_unreadable",
            ErrorKind::WrongType => "wrong_type",
        }
    }
}

/// Counts of failures by kind, since the process was attached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    counts: [u64; ErrorKind::ALL.len()],
}

impl ErrorCounts {
    pub fn add(&mut self, kind: ErrorKind) {
        let i = kind as usize;
        self.counts[i] = self.counts[i].saturating_add(1);
    }

    pub fn get(&self, kind: ErrorKind) -> u64 {
        self.counts[kind as usize]
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Non-zero counts, in a stable order.
    pub fn nonzero(&self) -> impl Iterator<Item = (ErrorKind, u64)> + '_ {
        ErrorKind::ALL
            .into_iter()
            .map(|k| (k, self.get(k)))
            .filter(|(_, n)| *n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_are_the_contract_lines() {
        assert_eq!(
            PyError::NotPython { pid: 123 }.to_string(),
            "pid 123 is not a Python process"
        );
        assert_eq!(
            PyError::Unsupported {
                version: "3.16".into()
            }
            .to_string(),
            "unsupported CPython 3.16"
        );
        assert_eq!(
            PyError::PermissionDenied { pid: 123 }.to_string(),
            "permission denied reading pid 123 (run as root)"
        );
        assert_eq!(
            PyError::ProcessGone { pid: 123 }.to_string(),
            "process 123 is gone"
        );
        assert!(matches!(
            PyError::from_mem(5, MemError::Gone),
            PyError::ProcessGone { pid: 5 }
        ));
    }

    #[test]
    fn counts() {
        let mut c = ErrorCounts::default();
        c.add(ErrorKind::TornInstrPtr);
        c.add(ErrorKind::TornInstrPtr);
        c.add(ErrorKind::ThreadNames);
        assert_eq!(c.get(ErrorKind::TornInstrPtr), 2);
        assert_eq!(c.total(), 3);
        assert_eq!(c.nonzero().count(), 2);
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
    }
}
