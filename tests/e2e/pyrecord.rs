//! Issue 4 acceptance: `pyebpf record` shows Python stacks captured in the kernel at the sample
//! instant, on every provisioned CPython.
//!
//! - `stacks`: a depth-20 stack on 3.12, 3.13, 3.13t, 3.13t-static, 3.14 (sid root) and 3.15 is
//!   exactly what `dump` shows in ≥ 95 % of the thread's samples, and the per-process summary
//!   agrees; 3.13t with the GIL disabled, four threads in four functions in parallel → each
//!   thread's samples show only its own function.
//! - `all`: `record --all` with 3.12, 3.13t and 3.14 at once (collapsed and SVG), a late starter
//!   and a process that lives ~200 ms.
//! - `native`: `--native` Python → C → Python (`sorted` with a Python key) on 3.12 and Debian's
//!   stripped static 3.14 (with its debug file, and with it hidden) and 3.15; merge mismatches
//!   under 1 %.
//! - `gil`: `--gil` on a free-threaded runtime (message, exclusion) and, on 3.12, 3.13t with
//!   `PYTHON_GIL=1` and 3.14, with a thread spinning in C with the GIL released; `PYEBPF_STATS=1`
//!   reports the eBPF program's cost.
//! - `deliverables`: truncation past the frame cap; a non-Python process under `--all`.
//! - `command`: `record -- python …` (also through `chroot`) has named frames (deliverable 4).
//! - `kernel`: the sampling program's fallback variant (bounded loops, for kernels without
//!   `bpf_loop`) gives the same exact stacks; without kernel BTF `record` runs and says once
//!   what `--native` loses.
//! - `subinterp`: the main interpreter's thread and a sub-interpreter's thread spinning at once
//!   on 3.12, 3.13 and 3.14 → each thread's samples end in its own function (also with `--gil`).
//!
//! - `views` (issue 17): no junk samples in ten recordings of sympy on 3.12 and 3.13, short
//!   file names, skipped processes named.
//! - `threads` (issue 17): `--threads` names the threads of a thread-per-request program (3.12,
//!   3.10, 3.13t).
//! - `idle`: `--idle` (issue 13): wall-clock shares against the workloads' own measurements,
//!   a thread blocked since before the run, GIL waits against `schedstat`, `report --sort
//!   state` of the saved run.
//!
//! Workloads are `tests/workloads/py/rec_*.py`, run with `harness.py` next to them; each writes a
//! ready file once its threads sit on their spinning lines (see `pyrecord/support.rs`).

mod all;
mod command;
mod deliverables;
mod gil;
mod idle;
mod kernel;
mod native;
mod stacks;
mod subinterp;
pub(crate) mod support;
mod threads;
mod views;
