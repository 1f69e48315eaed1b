//! The one user-space owner of the `TARGET_PIDS` map.
//!
//! Input: pids to sample (from the CLI, or a command spawned by `record`). Output: map updates.
//! Children of targets are added, and exited targets removed, by the kernel side itself
//! (`pyebpf_fork`, `pyebpf_exit`).
//!
//! Constraints: pids are host-namespace thread-group ids; the map holds at most
//! `TARGET_PIDS_ENTRIES`, and a full map is reported as such.
use aya::maps::{HashMap, MapData};
use sampler_common::{TARGET_PIDS_ENTRIES, maps};

use super::{
    CollectError,
    error::{errno_of, one_line},
};

/// Typed handle on `TARGET_PIDS` (`u32` tgid → unused `u8`).
pub(crate) struct TargetPids {
    map: HashMap<MapData, u32, u8>,
}

impl TargetPids {
    pub(crate) fn new(map: HashMap<MapData, u32, u8>) -> TargetPids {
        TargetPids { map }
    }

    /// Start sampling `pid` (idempotent).
    pub(crate) fn add(&mut self, pid: u32) -> Result<(), CollectError> {
        self.map.insert(pid, 1, 0).map_err(|err| {
            if errno_of(&err) == Some(libc::E2BIG) {
                CollectError::TargetsFull {
                    pid,
                    capacity: TARGET_PIDS_ENTRIES,
                }
            } else {
                CollectError::Map {
                    map: maps::TARGET_PIDS,
                    reason: one_line(&err),
                }
            }
        })
    }

    /// Whether `pid` is a target (tests; the kernel side keeps the table current).
    #[cfg(test)]
    pub(crate) fn contains(&self, pid: u32) -> bool {
        self.map.get(&pid, 0).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_table_error_names_the_pid_and_capacity() {
        let e = CollectError::TargetsFull {
            pid: 77,
            capacity: TARGET_PIDS_ENTRIES,
        };
        assert_eq!(
            e.to_string(),
            "cannot follow pid 77: the target table is full (4096 processes)"
        );
    }
}
