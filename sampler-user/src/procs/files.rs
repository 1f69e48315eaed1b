//! Opening the file behind a mapping, and file identity.
//!
//! Owns: the open order of docs/cpython-layouts.md §1.2 and [`FileId`], the cache key every stage uses
//! for per-file data (unwind sections, symbols, Python layouts).
//! Input: a pid and one of its [`Mapping`]s.
//! Output: an open `File` whose inode was checked against the mapping, and its [`FileId`].
//! Constraints: `/proc/PID/map_files/<start>-<end>` needs CAP_SYS_ADMIN (we run as root) and
//! always names the mapped inode, even for deleted files and other mount namespaces. The two
//! fallbacks by name are accepted only when their inode equals the mapping's, because the name
//! may resolve to a different file (a chroot's maps show host paths; a container's do not).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::elf::{ElfInfo, read_elf_info};
use super::maps::Mapping;

/// Identity of a mapped file: device and inode as `/proc/PID/maps` prints them, plus the GNU
/// build-id when the file has one. Equal ids mean equal contents for caching purposes; the
/// build-id guards against inode reuse after a package upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// (major, minor) of the device.
    pub dev: (u32, u32),
    /// Inode number (0 for the vDSO).
    pub inode: u64,
    /// `NT_GNU_BUILD_ID`, if present.
    pub build_id: Option<Vec<u8>>,
}

impl FileId {
    /// The id of `m` with a build-id read elsewhere.
    pub fn new(m: &Mapping, build_id: Option<Vec<u8>>) -> Self {
        Self {
            dev: m.dev,
            inode: m.inode,
            build_id,
        }
    }

    /// The build-id as lowercase hex (for reports and debug-file lookups).
    pub fn build_id_hex(&self) -> Option<String> {
        use std::fmt::Write as _;
        self.build_id.as_ref().map(|b| {
            b.iter()
                .fold(String::with_capacity(b.len() * 2), |mut s, byte| {
                    let _ = write!(s, "{byte:02x}");
                    s
                })
        })
    }
}

/// An opened mapped file with its identity and (if it is ELF) its headers.
#[derive(Debug)]
pub struct MappedFile {
    /// The open file.
    pub file: File,
    /// Its identity.
    pub id: FileId,
    /// Its ELF headers; `None` if it is not a readable ELF64 file.
    pub elf: Option<ElfInfo>,
    /// Which path worked (for messages; may stop working when the process exits).
    pub opened_via: PathBuf,
}

/// Open the file behind `m` of `pid` under `/proc`.
pub fn open_mapped_file(pid: u32, m: &Mapping) -> io::Result<File> {
    open_mapped_file_in(Path::new("/proc"), pid, m).map(|(f, _)| f)
}

/// [`open_mapped_file`] with an explicit proc root; also returns the path that worked.
pub fn open_mapped_file_in(proc_root: &Path, pid: u32, m: &Mapping) -> io::Result<(File, PathBuf)> {
    if !m.is_file_backed() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "mapping is not file-backed",
        ));
    }
    let proc_dir = proc_root.join(pid.to_string());
    // 1. map_files: the mapped inode itself.
    let map_files = proc_dir
        .join("map_files")
        .join(format!("{:x}-{:x}", m.start, m.end));
    let first_err = match File::open(&map_files) {
        Ok(f) => return Ok((f, map_files)),
        Err(e) => e,
    };
    if m.is_deleted() {
        // A deleted file has no name to fall back on.
        return Err(first_err);
    }
    let Some(path) = m.clean_path() else {
        return Err(first_err);
    };
    // 2. Through the process's root (containers with their own mount namespace), 3. as printed
    // (plain chroots print host paths).
    let rel = path.strip_prefix("/").unwrap_or(path);
    let mut last_err = first_err;
    for candidate in [proc_dir.join("root").join(rel), path.to_path_buf()] {
        match File::open(&candidate) {
            Ok(f) => match f.metadata() {
                Ok(meta) if m.inode == 0 || meta.ino() == m.inode => return Ok((f, candidate)),
                Ok(meta) => {
                    last_err = io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{} has inode {} but the mapping has {}",
                            candidate.display(),
                            meta.ino(),
                            m.inode
                        ),
                    );
                }
                Err(e) => last_err = e,
            },
            Err(e) => last_err = e,
        }
    }
    Err(last_err)
}

/// Open the file behind `m`, read its ELF headers and build its [`FileId`].
pub fn open_mapping(proc_root: &Path, pid: u32, m: &Mapping) -> io::Result<MappedFile> {
    let (file, opened_via) = open_mapped_file_in(proc_root, pid, m)?;
    let elf = read_elf_info(&file).ok();
    let id = FileId::new(m, elf.as_ref().and_then(|e| e.build_id.clone()));
    Ok(MappedFile {
        file,
        id,
        elf,
        opened_via,
    })
}

/// Open the file behind `m` by its path under `root` (a core's files: `dump --core --root`);
/// a path with a `..` component is refused (it could leave the root).
pub fn open_mapping_under(root: &Path, m: &Mapping) -> io::Result<MappedFile> {
    let refused = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file path under the root",
        )
    };
    let path = m
        .clean_path()
        .filter(|_| !m.is_deleted())
        .ok_or_else(refused)?;
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(refused());
    }
    let host = root.join(path.strip_prefix("/").unwrap_or(path));
    let file = File::open(&host)?;
    let elf = read_elf_info(&file).ok();
    let id = FileId::new(m, elf.as_ref().and_then(|e| e.build_id.clone()));
    Ok(MappedFile {
        file,
        id,
        elf,
        opened_via: host,
    })
}

/// Largest vDSO image accepted (it is 8 KiB on current kernels).
const MAX_VDSO: u64 = 1 << 20;

/// A copy of our own vDSO image, read through `/proc/self/mem` (no raw pointer reads). The
/// kernel maps the same image into every 64-bit process, so it stands in for a target's
/// `[vdso]` mapping of the same length: the mapping starts at file offset 0 of the image.
pub fn read_own_vdso() -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let maps = std::fs::read("/proc/self/maps").ok()?;
    let (maps, _) = super::maps::parse_maps(&maps);
    let m = maps.iter().find(|m| m.is_vdso())?;
    let len = m.end - m.start;
    if len > MAX_VDSO {
        return None;
    }
    let mem = File::open("/proc/self/mem").ok()?;
    let mut image = vec![0u8; usize::try_from(len).ok()?];
    mem.read_exact_at(&mut image, m.start).ok()?;
    Some(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::maps::Perms;

    fn own_text_mapping() -> Mapping {
        let maps = std::fs::read("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let (maps, _) = crate::procs::maps::parse_maps(&maps);
        maps.into_iter()
            .find(|m| m.perms.exec && m.clean_path() == Some(exe.as_path()))
            .expect("own text mapping")
    }

    #[test]
    fn opens_own_text_by_every_route() {
        let m = own_text_mapping();
        let pid = std::process::id();
        let (f, via) = open_mapped_file_in(Path::new("/proc"), pid, &m).unwrap();
        assert_eq!(f.metadata().unwrap().ino(), m.inode);
        // The map_files route needs root (CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE).
        if crate::procs::tests::require_root("opens_own_text_by_every_route (map_files)") {
            assert!(
                via.to_string_lossy().contains("map_files"),
                "{}",
                via.display()
            );
        }
        // Force the fallbacks with a proc root that has no map_files: /proc/PID/root/<path>
        // is then missing too, and the printed path is used.
        let dir = std::env::temp_dir().join(format!("pyebpf-procs-test-{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (f2, via2) = open_mapped_file_in(&dir, pid, &m).unwrap();
        assert_eq!(f2.metadata().unwrap().ino(), m.inode);
        assert_eq!(Some(via2.as_path()), m.clean_path());
        // A wrong inode is refused.
        let wrong = Mapping {
            inode: m.inode + 1,
            ..m.clone()
        };
        let err = open_mapped_file_in(&dir, pid, &wrong).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(&dir).ok();

        let opened = open_mapping(Path::new("/proc"), pid, &m).unwrap();
        assert_eq!(opened.id.inode, m.inode);
        assert!(opened.elf.is_some());
    }

    #[test]
    fn anonymous_mappings_are_refused() {
        let m = Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            perms: Perms::default(),
            dev: (0, 0),
            inode: 0,
            path: Some("[heap]".into()),
        };
        assert_eq!(
            open_mapped_file(1, &m).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn own_vdso_is_an_elf_image() {
        let image = read_own_vdso().expect("vdso");
        let elf = read_elf_info(&image[..]).unwrap();
        assert!(elf.section(b".eh_frame").is_some());
        assert!(elf.build_id.is_some());
    }

    #[test]
    fn build_id_hex() {
        let id = FileId {
            dev: (1, 2),
            inode: 3,
            build_id: Some(vec![0xab, 0x01]),
        };
        assert_eq!(id.build_id_hex().as_deref(), Some("ab01"));
    }
}
