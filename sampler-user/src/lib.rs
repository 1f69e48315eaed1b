//! pyebpf: a host-wide sampling profiler for Python.
//!
//! The data path, one module per stage (each passes one named type to the next):
//!
//! `collect` (eBPF load, perf events, ring buffer → [`collect::Event`])
//! → `procs` (process registry: comm, exe, mappings, containers)
//! → `python` (CPython reader from `_Py_DebugOffsets` → Python stacks)
//! → `unwind` (framehop over copied user stacks → native return addresses)
//! → `merge` (`--native`: eval-loop frames replaced by the Python frames captured in the kernel
//!   at the same instant; eval-loop address ranges per build)
//! → `symbolize` (blazesym, cached per file → names)
//! → `profile` (interned stacks with per-sample metadata)
//! → `output` (flame graph, collapsed, speedscope, pprof, the saved `.pyebpf` file).
//!
//! Around the data path: `saved` reads and writes `.pyebpf` files, `report` renders perf-style
//! reports and `perf script` text from a saved profile, `top` shows a live view.
//!
//! `record` drives the stages for the `record` command; `config` turns CLI flags into a
//! validated [`config::RecordConfig`]. The library never imports clap.

pub mod collect;
pub mod config;
pub mod coredump;
pub mod dump;
pub mod failure;
pub mod fuzzing;
pub mod lru;
pub mod merge;
pub mod output;
pub mod preflight;
pub mod printable;
pub mod privilege;
pub mod procs;
pub mod profile;
pub mod python;
pub mod record;
pub mod report;
pub mod saved;
pub mod symbolize;
pub mod top;
pub mod unwind;
