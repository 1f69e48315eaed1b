//! Tests of [`OutputFile`]: temporary files, modes, symlinks, FIFOs, devices, stdout. The
//! attacker-owned cases need root (to give a link to another user); the e2e tests repeat them
//! with a real unprivileged attacker.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use super::*;
use crate::procs::tests::require_root;

/// A fresh directory for one test, with `mode`.
fn dir(test: &str, mode: u32) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pyebpf-file-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

fn entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
}

#[test]
fn new_file_is_0600_complete_and_nothing_else_is_left() {
    let d = dir("new", 0o755);
    let dest = d.join("x.svg");
    let out = OutputFile::open(&dest).unwrap();
    assert!(entries(&d).is_empty(), "the check leaves nothing");
    let err = out.write(|w| {
        w.write_all(b"half")?;
        Err(io::Error::other("boom"))
    });
    assert!(err.is_err());
    assert!(entries(&d).is_empty(), "a failed write leaves nothing");
    out.write(|w| w.write_all(b"whole")).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"whole");
    assert_eq!(entries(&d), ["x.svg"]);
    let mode = std::fs::metadata(&dest).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn directories_and_missing_parents_are_refused() {
    assert!(OutputFile::open(Path::new("/nonexistent-dir-pyebpf/x.svg")).is_err());
    let e = OutputFile::open(&std::env::temp_dir()).unwrap_err();
    assert!(e.to_string().contains("is a directory"), "{e}");
    let e = OutputFile::open(Path::new("/tmp/")).unwrap_err();
    assert_eq!(e.to_string().lines().count(), 1);
}

#[test]
fn stdout_and_devices_are_written_in_place() {
    assert!(OutputFile::open(Path::new("-")).unwrap().is_stdout());
    let null = OutputFile::open(Path::new("/dev/null")).unwrap();
    null.write(|w| w.write_all(b"gone")).unwrap();
    let meta = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type()),
        "/dev/null is still a device"
    );
    // /dev/full: the error is reported, the node stays.
    let full = OutputFile::open(Path::new("/dev/full")).unwrap();
    assert!(full.write(|w| w.write_all(&vec![0; 1 << 16])).is_err());
    let meta = std::fs::symlink_metadata("/dev/full").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &meta.file_type()
    ));
}

#[test]
fn fifo_without_reader_is_refused_at_once_and_with_reader_written() {
    let d = dir("fifo", 0o755);
    let fifo = d.join("f.txt");
    mkfifo(&fifo);
    let t0 = std::time::Instant::now();
    let e = OutputFile::open(&fifo).unwrap_err();
    assert!(matches!(e.why, Why::NoReader), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    // The reader opens the FIFO (blocking until a writer comes); retry until it is there.
    let out = loop {
        match OutputFile::open(&fifo) {
            Ok(o) => break o,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    out.write(|w| w.write_all(b"through the fifo")).unwrap();
    drop(out);
    assert_eq!(reader.join().unwrap(), b"through the fifo");
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo_like()
    );
    std::fs::remove_dir_all(&d).unwrap();
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

#[test]
fn own_symlink_is_followed_and_kept() {
    let d = dir("ownlink", 0o755);
    let real = d.join("real.txt");
    std::fs::write(&real, b"old").unwrap();
    let link = d.join("link.txt");
    std::os::unix::fs::symlink("real.txt", &link).unwrap();
    OutputFile::open(&link)
        .unwrap()
        .write(|w| w.write_all(b"new"))
        .unwrap();
    assert_eq!(std::fs::read(&real).unwrap(), b"new");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn foreign_symlink_and_fifo_in_shared_directories_are_refused() {
    if !require_root("foreign_symlink_and_fifo_in_shared_directories_are_refused") {
        return;
    }
    for (test, mode) in [
        ("shared0777", 0o777),
        ("shared0775", 0o775),
        ("sticky", 0o1777),
    ] {
        let d = dir(test, mode);
        let victim = d.join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.join("out.svg");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let e = OutputFile::open(&link).unwrap_err();
        assert!(matches!(e.why, Why::Untrusted { owner: 65534, .. }), "{e}");
        assert_eq!(e.to_string().lines().count(), 1);
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        let fifo = d.join("out.txt");
        mkfifo(&fifo);
        std::os::unix::fs::lchown(&fifo, Some(65534), Some(65534)).unwrap();
        let e = OutputFile::open(&fifo).unwrap_err();
        assert!(matches!(e.why, Why::Untrusted { .. }), "{e}");
        // Planted after the check: the rename replaces the link itself, the victim stays.
        let later = d.join("later.svg");
        let out = OutputFile::open(&later).unwrap();
        std::os::unix::fs::symlink(&victim, &later).unwrap();
        std::os::unix::fs::lchown(&later, Some(65534), Some(65534)).unwrap();
        out.write(|w| w.write_all(b"profile")).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
        assert!(std::fs::symlink_metadata(&later).unwrap().is_file());
        assert_eq!(std::fs::read(&later).unwrap(), b"profile");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn sudo_user_owns_the_files() {
    if !require_root("sudo_user_owns_the_files") {
        return;
    }
    let d = dir("sudo", 0o755);
    let dest = d.join("x.txt");
    let mut out = OutputFile::open(&dest).unwrap();
    out.owner = Some(User {
        uid: 65534,
        gid: 65534,
    });
    out.write(|w| w.write_all(b"mine")).unwrap();
    let m = std::fs::metadata(&dest).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (65534, 65534, 0o600));
    let streamed = d.join("s.pyebpf");
    let mut out = OutputFile::open(&streamed).unwrap();
    out.owner = Some(User {
        uid: 65534,
        gid: 65534,
    });
    let mut w = out.stream().unwrap();
    let m = std::fs::metadata(&streamed).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (65534, 0o600), "there at once");
    w.write_all(b"chunk").unwrap();
    drop(w);
    assert_eq!(std::fs::read(&streamed).unwrap(), b"chunk");
    assert_eq!(entries(&d), ["s.pyebpf", "x.txt"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn descriptor_links_are_recognised() {
    assert_eq!(descriptor_link(Path::new("/proc/self/fd/1")), Some(1));
    assert_eq!(descriptor_link(Path::new("/dev/fd/2")), Some(2));
    assert_eq!(descriptor_link(Path::new("/proc/self/fdx/1")), None);
    assert!(matches!(
        resolve(Path::new("/dev/stdout"), privilege::invoking_user()),
        Ok(Sink::InPlace(_))
    ));
}
