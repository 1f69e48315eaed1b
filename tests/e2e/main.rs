//! End-to-end tests of the real `pyebpf` binary on the real kernel and real CPython interpreters.
//!
//! Run by `cargo xtask test` as root, which sets `PYEBPF_BIN` (the binary under test) and
//! `PYEBPF_TEST_CACHE` (where `cargo xtask setup` put the test interpreters and their manifest).
//! Under `CI=true` a missing prerequisite (root, eBPF, an interpreter) is a failure; elsewhere the
//! test prints a loud `SKIPPED:` line and passes.

mod common;
mod dump;
mod flags;
mod pprof;
mod pyrecord;
mod record;
mod report;
mod saved;
mod top;
mod trust;
