//! Every failure pyebpf counts, as one typed enum from the kernel's counters through the stages
//! to the summary, every output's metadata and the saved file.
//!
//! Owns: [`Failure`] (what went wrong, by stage: a kernel counter, `/proc`, an attach, one
//! Python sample, a stack), its stable name (the word the summary, `report`'s header and the
//! saved file show: `python_memory_read`, `procs_gone`, `merge_mismatch`…) and [`Failures`],
//! the counts of a run. Input: each stage counts its own kinds ([`Failures::add`]). Output:
//! counts by kind, listed in name order.
//! Constraints: names are a contract (e2e tests and saved files use them): a kind keeps its
//! name. A saved file written by a newer pyebpf may name a kind this build does not know: it is
//! kept under that name ([`Failure::Unknown`]), shown as is, never dropped.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use sampler_common::Counter;

use crate::procs::ProcsErrorKind;
use crate::python::ErrorKind as ReaderError;
use crate::unwind::UnwindFailure;

/// Why an attach to a process that may be Python failed (a plain "not Python" is no failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttachFailure {
    /// A CPython version pyebpf does not support.
    Unsupported,
    /// The runtime's layout did not check out against the binary.
    LayoutNotRecognised,
    /// Its memory or files could not be read for lack of permission.
    Permission,
    /// It exited during the attach.
    Gone,
    /// Its memory could not be read.
    Memory,
    /// Something read from it was invalid.
    Invalid,
    /// A file of it could not be read.
    Io,
}

impl AttachFailure {
    const ALL: [AttachFailure; 7] = [
        AttachFailure::Unsupported,
        AttachFailure::LayoutNotRecognised,
        AttachFailure::Permission,
        AttachFailure::Gone,
        AttachFailure::Memory,
        AttachFailure::Invalid,
        AttachFailure::Io,
    ];

    fn name(self) -> &'static str {
        match self {
            AttachFailure::Unsupported => "python_unsupported",
            AttachFailure::LayoutNotRecognised => "python_layout_not_recognised",
            AttachFailure::Permission => "python_attach_permission",
            AttachFailure::Gone => "python_attach_gone",
            AttachFailure::Memory => "python_attach_memory",
            AttachFailure::Invalid => "python_attach_invalid",
            AttachFailure::Io => "python_attach_io",
        }
    }
}

/// What went wrong with one sample of an attached Python process (counted per process too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PyFailure {
    /// The reader failed on a captured frame (memory, code object, line table…).
    Reader(ReaderError),
    /// A sample came without a capture after the attach had settled.
    NoCapture,
    /// The kernel walk did not capture the thread's frames.
    NotCaptured,
    /// The kernel walk stopped at a failed read (the frames before it are kept).
    KernelReadError,
    /// The kernel walk stopped at an invalid frame (the frames above it are kept).
    InvalidFrame,
    /// Of [`PyFailure::InvalidFrame`]: the invalid frame's code object could not be read
    /// (`py_flags::CODE_UNREADABLE`: a garbage pointer, or a page not present at the sample).
    CodeUnreadable,
    /// `--gil`: the GIL words could not be read with the sample.
    GilUnknown,
    /// `--native`: no eval-loop ranges for the interpreter (the merge cannot place Python).
    EvalRangesMissing,
    /// `--native`: eval-loop ranges that may miss local pieces (a stripped file without its
    /// debug file).
    EvalRangesIncomplete,
    /// The kernel's `PY_PROCS` refused the process.
    PyProcsInsert,
    /// `--idle`: `OFFCPU` could not be seeded for the threads asleep at the attach.
    OffCpuSeed,
    /// `--idle`: a seeded interval came without the stack seeded for it.
    OffCpuSeedMissing,
}

impl PyFailure {
    /// The kinds of this type (reader kinds first).
    fn all() -> impl Iterator<Item = PyFailure> {
        ReaderError::ALL.into_iter().map(PyFailure::Reader).chain([
            PyFailure::NoCapture,
            PyFailure::NotCaptured,
            PyFailure::KernelReadError,
            PyFailure::InvalidFrame,
            PyFailure::CodeUnreadable,
            PyFailure::GilUnknown,
            PyFailure::EvalRangesMissing,
            PyFailure::EvalRangesIncomplete,
            PyFailure::PyProcsInsert,
            PyFailure::OffCpuSeed,
            PyFailure::OffCpuSeedMissing,
        ])
    }

    /// The name in a process's summary line (`memory_read`, `no_capture`…); the run's total
    /// carries a `python_` prefix ([`Failure::name`]).
    pub fn name(self) -> &'static str {
        match self {
            PyFailure::Reader(k) => k.name(),
            PyFailure::NoCapture => "no_capture",
            PyFailure::NotCaptured => "not_captured",
            PyFailure::KernelReadError => "kernel_read_error",
            PyFailure::InvalidFrame => "invalid_frame",
            PyFailure::CodeUnreadable => "code_unreadable",
            PyFailure::GilUnknown => "gil_unknown",
            PyFailure::EvalRangesMissing => "eval_ranges_missing",
            PyFailure::EvalRangesIncomplete => "eval_ranges_incomplete",
            PyFailure::PyProcsInsert => "py_procs_insert",
            PyFailure::OffCpuSeed => "offcpu_seed",
            PyFailure::OffCpuSeedMissing => "offcpu_seed_missing",
        }
    }
}

/// Every failure kind of a run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failure {
    /// A kernel counter that means loss or error (the sampling and process-event programs).
    Kernel(Counter),
    /// Ring-buffer records that could not be decoded (skipped).
    MalformedRecords,
    /// Samples dropped in user space: the pipeline was behind by more than its queue bound.
    LostInUserSpace,
    /// A `/proc` read failed.
    Procs(ProcsErrorKind),
    /// An attach to a process failed.
    Attach(AttachFailure),
    /// A sample's Python frames (summed over processes; each process's line has its own).
    Python(PyFailure),
    /// The kernel captured Python frames of a pid user space no longer knows (exec/exit race).
    PythonCaptureUnattached,
    /// The sampled process was gone before its stack was built (its name comes from the
    /// thread).
    ProcessGone,
    /// `--native`: a sample without a copy of its user stack.
    NoUserStack,
    /// `--native`: unwinding stopped early.
    Unwind(UnwindFailure),
    /// `--native`: no native frame at all.
    NoNativeFrames,
    /// `--kernel`: the kernel stack of a kernel-mode sample was gone from the stack map.
    KernelStackMissing,
    /// `--native`: the Python frames could not be merged exactly with the native ones.
    MergeMismatch,
    /// A kind this build does not know, read from a saved file by its name.
    Unknown(Arc<str>),
}

/// The kernel counters that mean data was lost or degraded (`PyNoTstate` is not one: a Python
/// process's non-Python threads have no thread state by nature).
pub const KERNEL_FAILURES: [Counter; 17] = [
    Counter::LostSamples,
    Counter::LostProcEvents,
    Counter::NoUserRegs,
    Counter::KernelStackErrors,
    Counter::KernelStackCollisions,
    Counter::StackCopyEmpty,
    Counter::FollowFailed,
    Counter::ProcEventErrors,
    Counter::PyReadErrors,
    Counter::PyTruncated,
    Counter::PyThreadBudget,
    Counter::PyBadProcInfo,
    Counter::PyPidNsErrors,
    Counter::PyInvalidFrames,
    Counter::PyCodeUnreadable,
    Counter::OffCpuLost,
    Counter::OffCpuMapFull,
];

impl Failure {
    /// The stable name (see the module header).
    pub fn name(&self) -> std::borrow::Cow<'static, str> {
        use std::borrow::Cow::{Borrowed, Owned};
        match self {
            Failure::Kernel(c) => Borrowed(c.name()),
            Failure::MalformedRecords => Borrowed("malformed_records"),
            Failure::LostInUserSpace => Borrowed("lost_in_user_space"),
            Failure::Procs(k) => Owned(format!("procs_{}", k.name())),
            Failure::Attach(k) => Borrowed(k.name()),
            Failure::Python(k) => Owned(format!("python_{}", k.name())),
            Failure::PythonCaptureUnattached => Borrowed("python_capture_unattached"),
            Failure::ProcessGone => Borrowed("process_gone"),
            Failure::NoUserStack => Borrowed("no_user_stack"),
            Failure::Unwind(k) => Borrowed(k.name()),
            Failure::NoNativeFrames => Borrowed("no_native_frames"),
            Failure::KernelStackMissing => Borrowed("kernel_stack_missing"),
            Failure::MergeMismatch => Borrowed("merge_mismatch"),
            Failure::Unknown(name) => Owned(name.to_string()),
        }
    }

    /// Every kind this build knows.
    pub fn known() -> impl Iterator<Item = Failure> {
        KERNEL_FAILURES
            .into_iter()
            .map(Failure::Kernel)
            .chain([Failure::MalformedRecords, Failure::LostInUserSpace])
            .chain(ProcsErrorKind::ALL.into_iter().map(Failure::Procs))
            .chain(AttachFailure::ALL.into_iter().map(Failure::Attach))
            .chain(PyFailure::all().map(Failure::Python))
            .chain([
                Failure::PythonCaptureUnattached,
                Failure::ProcessGone,
                Failure::NoUserStack,
            ])
            .chain(UnwindFailure::ALL.into_iter().map(Failure::Unwind))
            .chain([
                Failure::NoNativeFrames,
                Failure::KernelStackMissing,
                Failure::MergeMismatch,
            ])
    }

    /// The kind named `name` (a saved file's): a known one, else [`Failure::Unknown`].
    pub fn from_name(name: &str) -> Failure {
        use std::sync::LazyLock;
        static BY_NAME: LazyLock<BTreeMap<String, Failure>> = LazyLock::new(|| {
            Failure::known()
                .map(|f| (f.name().into_owned(), f))
                .collect()
        });
        BY_NAME
            .get(name)
            .cloned()
            .unwrap_or_else(|| Failure::Unknown(name.into()))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The failure counts of a run (or of a saved file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failures {
    counts: BTreeMap<Failure, u64>,
}

impl Failures {
    /// Counts `n` failures of `kind` (nothing for 0).
    pub fn add(&mut self, kind: Failure, n: u64) {
        if n > 0 {
            *self.counts.entry(kind).or_default() += n;
        }
    }

    /// Counts one failure of `kind`.
    pub fn one(&mut self, kind: Failure) {
        self.add(kind, 1);
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Failures) {
        for (k, n) in &other.counts {
            self.add(k.clone(), *n);
        }
    }

    /// The count of `kind`.
    pub fn get(&self, kind: &Failure) -> u64 {
        self.counts.get(kind).copied().unwrap_or(0)
    }

    /// No failure counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Number of kinds counted.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// `(name, count)` of every kind counted, in name order.
    pub fn named(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .counts
            .iter()
            .map(|(k, n)| (k.name().into_owned(), *n))
            .collect();
        v.sort();
        v
    }
}

impl serde::Serialize for Failures {
    /// A map of names to counts, in name order.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let named = self.named();
        let mut m = s.serialize_map(Some(named.len()))?;
        for (k, v) in &named {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let known: Vec<Failure> = Failure::known().collect();
        let mut names: Vec<String> = known.iter().map(|f| f.name().into_owned()).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name used twice");
        for f in &known {
            assert_eq!(&Failure::from_name(&f.name()), f);
        }
        // The names the summary has always used.
        for (f, name) in [
            (Failure::Procs(ProcsErrorKind::Gone), "procs_gone"),
            (
                Failure::Python(PyFailure::Reader(ReaderError::MemoryRead)),
                "python_memory_read",
            ),
            (Failure::Kernel(Counter::PyReadErrors), "py_read_errors"),
            (
                Failure::Attach(AttachFailure::Unsupported),
                "python_unsupported",
            ),
            (Failure::MergeMismatch, "merge_mismatch"),
        ] {
            assert_eq!(f.name(), name);
        }
        assert_eq!(
            Failure::from_name("from_a_newer_pyebpf"),
            Failure::Unknown("from_a_newer_pyebpf".into())
        );
    }

    #[test]
    fn counts_merge_and_list_in_name_order() {
        let mut a = Failures::default();
        a.one(Failure::ProcessGone);
        a.add(Failure::MergeMismatch, 0);
        a.add(Failure::Kernel(Counter::NoUserRegs), 2);
        let mut b = Failures::default();
        b.add(Failure::ProcessGone, 3);
        a.merge(&b);
        assert_eq!(
            a.named(),
            [
                ("no_user_regs".to_string(), 2),
                ("process_gone".to_string(), 4)
            ]
        );
        assert_eq!(a.get(&Failure::MergeMismatch), 0, "zeros are not counted");
    }
}
