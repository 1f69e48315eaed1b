//! `/proc/PID/maps` parsing.
//!
//! Owns: [`Mapping`], [`Perms`] and the parser from raw maps bytes.
//! Input: the bytes of a maps file (untrusted: another process controls its file names).
//! Output: mappings sorted by start address.
//! Constraints: never panics; file names are kept as raw bytes (`OsStr`), because a target may
//! map files whose names are not UTF-8 — procfs' `MemoryMaps` parses lines as `String` and
//! fails the whole file on one such name, which is why this parser exists. Line count is bounded
//! by [`MAX_MAPPINGS`].

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// Upper bound on mappings kept per process (the kernel default `vm.max_map_count` is 65530).
pub const MAX_MAPPINGS: usize = 65_536;

/// Suffix the kernel appends to the path of a mapped file that was unlinked.
const DELETED_SUFFIX: &[u8] = b" (deleted)";

/// Access permissions of a mapping.
#[allow(
    clippy::struct_excessive_bools,
    reason = "one flag per column of the perms field"
)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Perms {
    /// `r`
    pub read: bool,
    /// `w`
    pub write: bool,
    /// `x`
    pub exec: bool,
    /// `s` (shared) rather than `p` (private).
    pub shared: bool,
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Offset in the mapped file of `start`.
    pub file_offset: u64,
    /// Permissions.
    pub perms: Perms,
    /// Device (major, minor) of the mapped file; (0, 0) for anonymous mappings.
    pub dev: (u32, u32),
    /// Inode of the mapped file; 0 for anonymous mappings.
    pub inode: u64,
    /// The path column as printed (relative to the *reader's* root, see docs/cpython-layouts.md §1.2),
    /// including pseudo-paths such as `[vdso]` and a trailing ` (deleted)`. `None` when empty.
    pub path: Option<PathBuf>,
}

impl Mapping {
    /// Whether `addr` lies in `[start, end)`.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Whether this maps a regular file (absolute path and a non-zero inode).
    pub fn is_file_backed(&self) -> bool {
        self.inode != 0
            && self
                .path
                .as_deref()
                .is_some_and(|p| p.as_os_str().as_bytes().starts_with(b"/"))
    }

    /// Whether this is the kernel's vDSO.
    pub fn is_vdso(&self) -> bool {
        self.path
            .as_deref()
            .is_some_and(|p| p.as_os_str() == "[vdso]")
    }

    /// Whether the path column ends in ` (deleted)`: the file was unlinked after mapping.
    pub fn is_deleted(&self) -> bool {
        self.path
            .as_deref()
            .is_some_and(|p| p.as_os_str().as_bytes().ends_with(DELETED_SUFFIX))
    }

    /// The path without the ` (deleted)` suffix, for display and for opening by name.
    pub fn clean_path(&self) -> Option<&Path> {
        let p = self.path.as_deref()?;
        let bytes = p.as_os_str().as_bytes();
        Some(Path::new(OsStr::from_bytes(
            bytes.strip_suffix(DELETED_SUFFIX).unwrap_or(bytes),
        )))
    }

    /// Display name of the module: file basename (`libc.so.6`), or the pseudo-path (`[vdso]`),
    /// or `[anon]`.
    pub fn module_name(&self) -> String {
        match self.clean_path() {
            Some(p) if self.is_file_backed() => p.file_name().map_or_else(
                || p.to_string_lossy().into_owned(),
                |n| n.to_string_lossy().into_owned(),
            ),
            Some(p) => p.to_string_lossy().into_owned(),
            None => "[anon]".to_owned(),
        }
    }

    /// File offset of `addr`, which must lie in this mapping (saturating otherwise).
    pub fn file_offset_of(&self, addr: u64) -> u64 {
        addr.saturating_sub(self.start)
            .saturating_add(self.file_offset)
    }
}

/// Why one maps line was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed maps line {line_no}: {what}")]
pub struct MapsLineError {
    /// 1-based line number.
    pub line_no: usize,
    /// Which field was bad.
    pub what: &'static str,
}

/// Parse a whole maps file. Malformed lines are skipped and returned as errors next to the
/// mappings (the caller counts them); the result is sorted by start and capped at
/// [`MAX_MAPPINGS`].
pub fn parse_maps(bytes: &[u8]) -> (Vec<Mapping>, Vec<MapsLineError>) {
    let mut mappings = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        if mappings.len() >= MAX_MAPPINGS {
            errors.push(MapsLineError {
                line_no: i + 1,
                what: "too many mappings",
            });
            break;
        }
        match parse_line(line) {
            Ok(m) => mappings.push(m),
            Err(what) => errors.push(MapsLineError {
                line_no: i + 1,
                what,
            }),
        }
    }
    // The kernel prints in address order already; sort anyway so lookups can rely on it.
    mappings.sort_by_key(|m| m.start);
    (mappings, errors)
}

/// Split off the next space-delimited field.
fn next_field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let trimmed = trim_start(rest);
    if trimmed.is_empty() {
        return None;
    }
    let end = trimmed
        .iter()
        .position(|&b| b == b' ')
        .unwrap_or(trimmed.len());
    let (field, tail) = trimmed.split_at(end);
    *rest = tail;
    Some(field)
}

fn trim_start(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ').unwrap_or(s.len());
    &s[start..]
}

fn hex_u64(s: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok()
}

fn parse_line(line: &[u8]) -> Result<Mapping, &'static str> {
    let mut rest = line;
    let range = next_field(&mut rest).ok_or("address range")?;
    let perms = next_field(&mut rest).ok_or("perms")?;
    let offset = next_field(&mut rest).ok_or("offset")?;
    let dev = next_field(&mut rest).ok_or("dev")?;
    let inode = next_field(&mut rest).ok_or("inode")?;

    let dash = range
        .iter()
        .position(|&b| b == b'-')
        .ok_or("address range")?;
    let start = hex_u64(&range[..dash]).ok_or("start address")?;
    let end = hex_u64(&range[dash + 1..]).ok_or("end address")?;
    if end < start {
        return Err("end before start");
    }
    if perms.len() < 4 {
        return Err("perms");
    }
    let perms = Perms {
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        shared: perms[3] == b's',
    };
    let file_offset = hex_u64(offset).ok_or("offset")?;
    let colon = dev.iter().position(|&b| b == b':').ok_or("dev")?;
    let major =
        u32::try_from(hex_u64(&dev[..colon]).ok_or("dev major")?).map_err(|_| "dev major")?;
    let minor =
        u32::try_from(hex_u64(&dev[colon + 1..]).ok_or("dev minor")?).map_err(|_| "dev minor")?;
    let inode = std::str::from_utf8(inode)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or("inode")?;
    // The path is everything after the padding; it may contain spaces. Only the leading
    // padding is removed: a trailing space can belong to a file name.
    let path = trim_start(rest);
    let path = (!path.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(path)));
    Ok(Mapping {
        start,
        end,
        file_offset,
        perms,
        dev: (major, minor),
        inode,
        path,
    })
}

/// Find the mapping containing `addr` in mappings sorted by start.
pub fn find_mapping(mappings: &[Mapping], addr: u64) -> Option<&Mapping> {
    let idx = mappings.partition_point(|m| m.start <= addr);
    let m = mappings.get(idx.checked_sub(1)?)?;
    m.contains(addr).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &[u8] = b"\
00400000-00401000 r--p 00000000 08:01 1234                               /usr/bin/python3.14
00401000-00800000 r-xp 00001000 08:01 1234                               /usr/bin/python3.14
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f1000000000-7f1000028000 r--p 00000000 fe:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f1000028000-7f10001bd000 r-xp 00028000 fe:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
7f2000000000-7f2000001000 r-xp 00000000 00:05 77                         /memfd:jit (deleted)
7f3000000000-7f3000001000 r-xp 00000000 08:01 55                         /tmp/with space/lib x.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_a_maps_line_set() {
        let (maps, errors) = parse_maps(SAMPLE);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(maps.len(), 10);
        let text = &maps[1];
        assert_eq!(
            (text.start, text.end, text.file_offset),
            (0x40_1000, 0x80_0000, 0x1000)
        );
        assert!(text.perms.read && text.perms.exec && !text.perms.write && !text.perms.shared);
        assert_eq!(text.dev, (8, 1));
        assert_eq!(text.inode, 1234);
        assert_eq!(text.module_name(), "python3.14");
        assert!(text.is_file_backed());

        let anon = &maps[2];
        assert_eq!(anon.path, None, "trailing space alone is no path");
        assert_eq!(anon.module_name(), "[anon]");
        assert!(!anon.is_file_backed());

        let libc = &maps[4];
        assert_eq!(libc.dev, (0xfe, 1));
        assert_eq!(libc.module_name(), "libc.so.6");

        let memfd = &maps[5];
        assert!(memfd.is_deleted());
        assert_eq!(memfd.clean_path(), Some(Path::new("/memfd:jit")));
        assert_eq!(memfd.module_name(), "memfd:jit");

        assert_eq!(
            maps[6].path.as_deref(),
            Some(Path::new("/tmp/with space/lib x.so"))
        );
        assert_eq!(maps[6].module_name(), "lib x.so");
        assert!(maps[8].is_vdso());
        assert_eq!(maps[8].module_name(), "[vdso]");
        assert!(maps[9].perms.exec && !maps[9].perms.read);
    }

    #[test]
    fn non_utf8_names_and_bad_lines_do_not_spoil_the_rest() {
        let mut input = b"1000-2000 r-xp 00000000 08:01 5 /lib/\xff\xfe.so\n".to_vec();
        input.extend_from_slice(b"garbage\n3000-2000 r-xp 0 0:0 0\n4000-5000 r-xp 0 zz:1 0\n");
        input.extend_from_slice(b"6000-7000 r-xp 00000000 08:01 6 /lib/ok.so\n");
        let (maps, errors) = parse_maps(&input);
        assert_eq!(maps.len(), 2);
        assert_eq!(
            maps[0].path.as_deref().unwrap().as_os_str().as_bytes(),
            b"/lib/\xff\xfe.so"
        );
        assert_eq!(errors.len(), 3);
        assert_eq!(errors[0].line_no, 2);
    }

    #[test]
    fn finds_mappings_by_address() {
        let (maps, _) = parse_maps(SAMPLE);
        assert_eq!(
            find_mapping(&maps, 0x40_1000).map(|m| m.start),
            Some(0x40_1000)
        );
        assert_eq!(
            find_mapping(&maps, 0x7f_ffff).map(|m| m.start),
            Some(0x40_1000)
        );
        assert_eq!(find_mapping(&maps, 0x80_0000), None, "end is exclusive");
        assert_eq!(find_mapping(&maps, 0x10), None);
        assert_eq!(find_mapping(&maps, u64::MAX), None);
        assert_eq!(find_mapping(&[], 5), None);
        let m = find_mapping(&maps, 0x7f10_0002_8010).unwrap();
        assert_eq!(m.file_offset_of(0x7f10_0002_8010), 0x28010);
    }
}
