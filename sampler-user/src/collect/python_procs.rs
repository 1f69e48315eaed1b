//! The one user-space owner of the `PY_PROCS` map: which processes the kernel walks Python
//! frames for, and with which offsets.
//!
//! Input: `PyProcInfo`s built by the `python` stage (`python::kernel::kernel_info`), completed
//! here with the kernel's own offsets (`task_struct.thread.fsbase`). Output: map updates. Handed out once by [`super::Collector::take_python_procs`] so that the thread that
//! attaches to Python processes can update the map while the collector drains the ring buffer
//! on another thread.
//!
//! Constraints: pids are host-namespace thread-group ids; the map holds at most
//! `PY_PROCS_ENTRIES`, and a full map is reported as such. `PY_TSTATES` needs no upkeep: the
//! kernel validates each cached thread state on use.
use aya::maps::{HashMap, MapData};
use sampler_common::{PY_NO_OFFSET, PY_PROCS_ENTRIES, PyProcInfo, maps};

use super::{
    CollectError,
    error::{errno_of, one_line},
};

/// Typed handle on `PY_PROCS` (`u32` host pid → [`PyProcInfo`]). Owned (it keeps the map
/// alive after the collector is dropped, harmlessly) and `Send`.
pub struct PythonProcMap {
    map: HashMap<MapData, u32, PyProcInfo>,
    /// `task_struct.thread.fsbase` from the kernel's BTF ([`PY_NO_OFFSET`] when unknown),
    /// written into every entry: the kernel walk matches a ≤ 3.10 thread state's `pthread_t`
    /// against it.
    task_fsbase: u32,
}

impl PythonProcMap {
    pub(crate) fn new(map: HashMap<MapData, u32, PyProcInfo>, task_fsbase: Option<u32>) -> Self {
        PythonProcMap {
            map,
            task_fsbase: task_fsbase.unwrap_or(PY_NO_OFFSET),
        }
    }

    /// Walk Python frames in the kernel for every later sample of `pid`, with `info`
    /// (replaces an earlier entry). An entry whose frame offsets do not fit the kernel's
    /// frame-header read is refused here rather than counted on every sample.
    pub fn insert(&mut self, pid: u32, info: &PyProcInfo) -> Result<(), CollectError> {
        if !info.frame_offsets_fit() {
            return Err(CollectError::PythonOffsets {
                pid,
                reason: format!(
                    "frame offsets (previous {}, executable {}, instr_ptr {}, owner {}, \
                     tlbc_index {}) do not fit the kernel's {}-byte frame header read",
                    info.frame_previous,
                    info.frame_executable,
                    info.frame_instr_ptr,
                    info.frame_owner,
                    info.frame_tlbc_index,
                    sampler_common::PY_FRAME_HEADER_BYTES
                ),
            });
        }
        let info = PyProcInfo {
            task_fsbase: self.task_fsbase,
            ..*info
        };
        self.map.insert(pid, info, 0).map_err(|err| {
            if errno_of(&err) == Some(libc::E2BIG) {
                CollectError::PythonProcsFull {
                    pid,
                    capacity: PY_PROCS_ENTRIES,
                }
            } else {
                CollectError::Map {
                    map: maps::PY_PROCS,
                    reason: one_line(&err),
                }
            }
        })
    }

    /// Stop walking Python frames for `pid` (e.g. it exited). Idempotent: removing a pid that
    /// is not in the map is not an error.
    pub fn remove(&mut self, pid: u32) -> Result<(), CollectError> {
        match self.map.remove(&pid) {
            Ok(()) => Ok(()),
            Err(err) if errno_of(&err) == Some(libc::ENOENT) => Ok(()),
            Err(err) => Err(CollectError::Map {
                map: maps::PY_PROCS,
                reason: one_line(&err),
            }),
        }
    }

    /// Insert without the user-side check, so tests can see the kernel refuse bad entries.
    #[cfg(test)]
    pub(crate) fn insert_unchecked(&mut self, pid: u32, info: &PyProcInfo) {
        self.map.insert(pid, *info, 0).unwrap();
    }

    /// The entry for `pid`, if any.
    pub fn get(&self, pid: u32) -> Option<PyProcInfo> {
        self.map.get(&pid, 0).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_pid() {
        let e = CollectError::PythonProcsFull {
            pid: 77,
            capacity: PY_PROCS_ENTRIES,
        };
        assert_eq!(
            e.to_string(),
            "cannot profile Python frames of pid 77: the Python process table is full (4096 \
             processes)"
        );
        let e = CollectError::PythonOffsets {
            pid: 5,
            reason: "x".into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot walk Python frames of pid 5 in the kernel: x"
        );
    }
}
