//! tracefs access for the process-event tracepoints.
//!
//! Owns: finding (and, as root, mounting) tracefs before aya attaches tracepoints, and reading
//! the `pid` and `clone_flags` offsets of `task/task_newtask` from its `format` file.
//! Input: the filesystem. Output: the tracefs root and the offsets for `Config`.
//!
//! Constraints: aya looks tracefs up once per process and caches a miss, so
//! [`ensure_mounted`] must run before the first tracepoint attach. Mounting is what libtracefs
//! does too when tracefs is missing (common in containers); it needs CAP_SYS_ADMIN.
use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use sampler_common::{FORK_FLAGS_OFFSET_DEFAULT, FORK_PID_OFFSET_DEFAULT, TRACEPOINT_OFFSET_MAX};

use super::CollectError;

/// Where aya looks for tracefs, in its order.
const TRACEFS_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// A tracefs mount that aya will find (a non-empty directory at one of [`TRACEFS_DIRS`]).
fn find_mounted() -> Option<PathBuf> {
    TRACEFS_DIRS
        .iter()
        .map(PathBuf::from)
        .find(|dir| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()))
}

/// The tracefs root, mounting tracefs on `/sys/kernel/tracing` if it is not mounted.
pub(crate) fn ensure_mounted() -> Result<PathBuf, CollectError> {
    if let Some(dir) = find_mounted() {
        return Ok(dir);
    }
    let target = TRACEFS_DIRS[0];
    if !Path::new(target).is_dir() {
        return Err(CollectError::Tracefs {
            reason: format!("{target} does not exist"),
        });
    }
    let (Ok(source), Ok(path), Ok(fstype)) = (
        CString::new("nodev"),
        CString::new(target),
        CString::new("tracefs"),
    ) else {
        unreachable!("constant strings have no NUL");
    };
    // SAFETY: all pointers are valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            path.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(CollectError::Tracefs {
            reason: format!("not mounted, and mounting failed: {err}"),
        });
    }
    tracing::info!("mounted tracefs on {target}");
    find_mounted().ok_or_else(|| CollectError::Tracefs {
        reason: format!("{target} is still empty after mounting tracefs"),
    })
}

/// Offsets of the `task_newtask` tracepoint fields the fork program reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ForkOffsets {
    /// `pid_t pid` (the new task).
    pub pid: u32,
    /// `u64 clone_flags` (`unsigned long` on older kernels, 8 bytes on 64-bit).
    pub clone_flags: u32,
}

impl ForkOffsets {
    /// The layout every kernel since 3.14 has used.
    pub const DEFAULT: ForkOffsets = ForkOffsets {
        pid: FORK_PID_OFFSET_DEFAULT,
        clone_flags: FORK_FLAGS_OFFSET_DEFAULT,
    };

    /// Parse them from a `task_newtask` `format` text.
    fn parse(format: &str) -> Option<ForkOffsets> {
        Some(ForkOffsets {
            pid: parse_field_offset(format, "pid", 4)?,
            clone_flags: parse_field_offset(format, "clone_flags", 8)?,
        })
    }
}

/// The `task_newtask` offsets from its `format` file under `tracefs`; the long-stable default
/// when the file cannot be read or parsed (logged).
pub(crate) fn fork_offsets(tracefs: &Path) -> ForkOffsets {
    let path = tracefs.join("events/task/task_newtask/format");
    let parsed = match std::fs::read_to_string(&path) {
        Ok(text) => ForkOffsets::parse(&text),
        Err(err) => {
            tracing::warn!("cannot read {}: {err}", path.display());
            None
        }
    };
    parsed.unwrap_or_else(|| {
        tracing::warn!(
            "using the default task_newtask layout {:?}",
            ForkOffsets::DEFAULT
        );
        ForkOffsets::DEFAULT
    })
}

/// Parse `field:<type> <name>;\toffset:<n>;\tsize:<size>;…` lines of a tracepoint `format`
/// file and return the offset of `name` if its size is `size` and the offset is plausible.
fn parse_field_offset(format: &str, name: &str, size: u32) -> Option<u32> {
    format.lines().find_map(|line| {
        let mut decl = None;
        let mut offset = None;
        let mut field_size = None;
        for part in line.split(';').map(str::trim) {
            if let Some(d) = part.strip_prefix("field:") {
                decl = Some(d);
            } else if let Some(o) = part.strip_prefix("offset:") {
                offset = o.trim().parse::<u32>().ok();
            } else if let Some(s) = part.strip_prefix("size:") {
                field_size = s.trim().parse::<u32>().ok();
            }
        }
        let field_name = decl?.split_whitespace().last()?;
        (field_name == name && field_size == Some(size))
            .then_some(offset?)
            .filter(|&o| o <= TRACEPOINT_OFFSET_MAX && o % 4 == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEWTASK_FORMAT_6_18: &str = "name: task_newtask
ID: 205
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;
\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:40;\tsize:2;\tsigned:1;

print fmt: \"pid=%d comm=%s clone_flags=%llx oom_score_adj=%hd\", REC->pid, REC->comm, REC->clone_flags, REC->oom_score_adj
";

    #[test]
    fn parses_task_newtask_layout() {
        assert_eq!(
            ForkOffsets::parse(NEWTASK_FORMAT_6_18),
            Some(ForkOffsets {
                pid: 8,
                clone_flags: 32
            })
        );
        assert_eq!(
            ForkOffsets::parse(NEWTASK_FORMAT_6_18),
            Some(ForkOffsets::DEFAULT)
        );
        // `common_pid` must not be mistaken for `pid`.
        assert_eq!(
            parse_field_offset(NEWTASK_FORMAT_6_18, "common_pid", 4),
            Some(4)
        );
    }

    #[test]
    fn shifted_layout_is_followed() {
        let shifted = NEWTASK_FORMAT_6_18
            .replace("offset:8;", "offset:12;")
            .replace("offset:32;", "offset:40;");
        assert_eq!(
            ForkOffsets::parse(&shifted),
            Some(ForkOffsets {
                pid: 12,
                clone_flags: 40
            })
        );
    }

    #[test]
    fn rejects_missing_wrong_size_and_absurd_offsets() {
        assert_eq!(parse_field_offset(NEWTASK_FORMAT_6_18, "nope", 4), None);
        assert_eq!(
            parse_field_offset(NEWTASK_FORMAT_6_18, "clone_flags", 4),
            None
        );
        let far = "\tfield:pid_t pid;\toffset:4096;\tsize:4;";
        assert_eq!(parse_field_offset(far, "pid", 4), None);
        let odd = "\tfield:pid_t pid;\toffset:9;\tsize:4;";
        assert_eq!(parse_field_offset(odd, "pid", 4), None);
        assert_eq!(
            parse_field_offset("\tfield:pid_t pid;\toffset:x;\tsize:4;", "pid", 4),
            None
        );
        assert_eq!(ForkOffsets::parse(""), None);
    }

    #[test]
    fn missing_file_falls_back_to_default() {
        assert_eq!(
            fork_offsets(Path::new("/nonexistent-tracefs")),
            ForkOffsets::DEFAULT
        );
    }

    #[test]
    fn live_format_parses_when_readable() {
        // Whatever the kernel's layout, its format file must parse (no tracefs: nothing to check).
        let Some(root) = find_mounted() else { return };
        let Ok(text) = std::fs::read_to_string(root.join("events/task/task_newtask/format")) else {
            return;
        };
        assert!(ForkOffsets::parse(&text).is_some(), "{text}");
    }
}
