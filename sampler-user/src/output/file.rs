//! The one way pyebpf creates and writes files, safe when it runs as root in directories other
//! users can write.
//!
//! Owns: [`OutputFile`]: resolving a destination once, before sampling, into one of
//! - stdout (`-`);
//! - a device, FIFO or `/dev/stdout`-style descriptor link, opened there and then and written in
//!   place, never replaced (a FIFO without a reader is refused instead of waiting for one);
//! - a directory and a name: the file is written to a new temporary file in that directory
//!   (created exclusively with an unpredictable name by the `tempfile` crate, mode 0600, given
//!   to the `sudo` user), synced, then renamed over the name. `rename` replaces whatever is at
//!   the name and never follows it, so a symlink or FIFO planted there later changes nothing.
//!
//! A symlink at the destination is followed only when the directory holding it is writable by
//! nobody but its owner (root or the invoking user), or when the link belongs to root or the
//! invoking user: the rule of `fs.protected_symlinks`, also where the sysctl is off, and also for
//! group-writable directories and directories of other users, which it never covers. A FIFO or
//! device in such a directory is refused on the same terms.
//! Input: a path from the command line. Output: the file written, or an [`OutputError`] (one
//! line).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use crate::privilege::{self, User};

/// Symlinks followed at most, as the kernel's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;

/// Why an output cannot be written. Displays as one line.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {why}", path.display())]
pub struct OutputError {
    /// The path as given.
    pub path: PathBuf,
    /// Why.
    pub why: Why,
}

/// The reason of an [`OutputError`].
#[derive(Debug, thiserror::Error)]
pub enum Why {
    /// An I/O error.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A symlink or special file we will not use.
    #[error(
        "refusing to use the {what} {} (owner uid {owner}) in {}, a directory other users can write",
        at.display(),
        dir.display()
    )]
    Untrusted {
        /// "symlink", "FIFO", "device".
        what: &'static str,
        /// Where it is.
        at: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its directory.
        dir: PathBuf,
    },
    /// A FIFO that nobody reads: writing would wait forever.
    #[error("no process is reading the FIFO")]
    NoReader,
    /// Not something a profile can be written to.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Where an output goes.
#[derive(Debug)]
enum Sink {
    /// Our standard output.
    Stdout,
    /// Opened at resolution time and written in place (device, FIFO, descriptor).
    InPlace(File),
    /// Written to a temporary file in `dir`, renamed to `name`.
    Replace {
        /// The directory, held open: everything happens relative to it.
        dir: File,
        /// The final name in `dir`.
        name: OsString,
    },
}

/// A resolved output destination.
#[derive(Debug)]
pub struct OutputFile {
    path: PathBuf,
    sink: Sink,
    owner: Option<User>,
}

impl OutputFile {
    /// Resolves `path` (`-` is stdout) and checks that it can be written: creates and removes a
    /// temporary file beside it, or opens the device or FIFO. Nothing at `path` changes.
    pub fn open(path: &Path) -> Result<OutputFile, OutputError> {
        let err = |why| OutputError {
            path: path.to_path_buf(),
            why,
        };
        let sink = resolve(path, privilege::invoking_user()).map_err(err)?;
        let out = OutputFile {
            path: path.to_path_buf(),
            sink,
            owner: privilege::file_owner(),
        };
        if let Sink::Replace { .. } = &out.sink {
            // Proves that the directory takes new files; removed when dropped.
            out.temp().map_err(|e| err(Why::Io(e)))?;
        }
        Ok(out)
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is standard output.
    pub fn is_stdout(&self) -> bool {
        matches!(self.sink, Sink::Stdout)
    }

    /// A new temporary file in the destination's directory, mode 0600, owned by the invoking
    /// user under `sudo`; removed when dropped unless persisted.
    fn temp(&self) -> io::Result<tempfile::NamedTempFile> {
        let Sink::Replace { dir, name } = &self.sink else {
            return Err(io::Error::other("not a regular destination"));
        };
        let mut prefix = OsString::from(".");
        prefix.push(name);
        prefix.push(".");
        let tmp = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".pyebpf-tmp")
            .rand_bytes(10)
            .permissions(std::fs::Permissions::from_mode(0o600))
            .tempfile_in(fd_path(dir))?;
        if let Some(u) = self.owner {
            std::os::unix::fs::fchown(tmp.as_file(), Some(u.uid), Some(u.gid))?;
        }
        Ok(tmp)
    }

    /// Writes the whole file through `write`: in place, to stdout, or to a temporary file
    /// renamed over the destination once complete and synced. On an error the destination is
    /// untouched (for a regular file) and the temporary file is removed.
    pub fn write(&self, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
        match &self.sink {
            Sink::Stdout => {
                let stdout = io::stdout();
                let mut out = io::BufWriter::new(stdout.lock());
                write(&mut out)?;
                out.flush()
            }
            Sink::InPlace(file) => {
                let mut out = io::BufWriter::new(file);
                write(&mut out)?;
                out.flush()
            }
            Sink::Replace { dir, name } => {
                let tmp = self.temp()?;
                let mut out = io::BufWriter::new(tmp.as_file());
                write(&mut out)?;
                out.flush()?;
                drop(out);
                tmp.as_file().sync_all()?;
                tmp.persist(fd_path(dir).join(name)).map_err(|e| e.error)?;
                dir.sync_all()
            }
        }
    }

    /// A file to stream into, already at the destination: for a regular destination a new file
    /// (mode 0600, the `sudo` user's) renamed over it now, so a run that is killed leaves what it
    /// streamed so far under the name asked for.
    pub fn stream(&self) -> io::Result<Box<dyn Write + Send>> {
        match &self.sink {
            Sink::Stdout => Ok(Box::new(io::stdout())),
            Sink::InPlace(file) => Ok(Box::new(file.try_clone()?)),
            Sink::Replace { dir, name } => {
                let tmp = self.temp()?;
                let file = tmp.persist(fd_path(dir).join(name)).map_err(|e| e.error)?;
                dir.sync_all()?;
                Ok(Box::new(file))
            }
        }
    }
}

/// The `/proc/self/fd/N` path of an open directory: paths under it resolve from the directory
/// we checked, whatever happens to the path that named it.
fn fd_path(dir: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// `(directory, name)` of a destination path.
fn split(path: &Path) -> Result<(PathBuf, OsString), Why> {
    let bytes = path.as_os_str().as_bytes();
    let name = path
        .file_name()
        .filter(|_| !bytes.ends_with(b"/") && !bytes.ends_with(b"/."))
        .ok_or(Why::Unsupported("is a directory"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name.to_os_string()))
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` when nothing is there.
fn lstat_at(dir: &File, name: &OsStr) -> io::Result<Option<libc::stat>> {
    let c = cstr(name)?;
    // SAFETY: `st` is written by the kernel; `c` is a valid C string; `dir` is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &raw mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 {
        return Ok(Some(st));
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::NotFound {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Whether someone other than `user` (and root) can change the entries of a directory: it is
/// sticky, group- or other-writable, or owned by another user.
fn others_can_write(dir: &std::fs::Metadata, user: User) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let mode = dir.mode();
    mode & 0o1000 != 0 || mode & 0o022 != 0 || (dir.uid() != 0 && dir.uid() != user.uid)
}

/// `fd` of a `/proc/self/fd/N`, `/proc/<our pid>/fd/N` or `/dev/fd/N` link target.
fn descriptor_link(target: &Path) -> Option<i32> {
    let s = target.to_str()?;
    let me = format!("/proc/{}/fd/", std::process::id());
    let rest = s
        .strip_prefix("/proc/self/fd/")
        .or_else(|| s.strip_prefix("/proc/thread-self/fd/"))
        .or_else(|| s.strip_prefix(me.as_str()))
        .or_else(|| s.strip_prefix("/dev/fd/"))?;
    rest.parse().ok()
}

/// Resolves a destination into a [`Sink`] (see the module header for the rules).
fn resolve(path: &Path, user: User) -> Result<Sink, Why> {
    if path.as_os_str() == "-" {
        return Ok(Sink::Stdout);
    }
    if let Some(fd) = descriptor_link(path) {
        return dup_in_place(fd);
    }
    let (mut dir_path, mut name) = split(path)?;
    for _ in 0..MAX_LINKS {
        let dir = File::open(&dir_path)?;
        let dir_meta = dir.metadata()?;
        if !dir_meta.is_dir() {
            return Err(Why::Io(io::Error::from(io::ErrorKind::NotADirectory)));
        }
        let Some(st) = lstat_at(&dir, &name)? else {
            return Ok(Sink::Replace { dir, name });
        };
        let untrusted = |what| {
            if others_can_write(&dir_meta, user) && st.st_uid != 0 && st.st_uid != user.uid {
                Err(Why::Untrusted {
                    what,
                    at: dir_path.join(&name),
                    owner: st.st_uid,
                    dir: dir_path.clone(),
                })
            } else {
                Ok(())
            }
        };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => return Ok(Sink::Replace { dir, name }),
            libc::S_IFDIR => return Err(Why::Unsupported("is a directory")),
            libc::S_IFLNK => {
                untrusted("symlink")?;
                let target = std::fs::read_link(fd_path(&dir).join(&name))?;
                if let Some(fd) = descriptor_link(&target) {
                    return dup_in_place(fd);
                }
                let full = dir_path.join(&target);
                (dir_path, name) = split(&full)?;
            }
            libc::S_IFIFO => {
                untrusted("FIFO")?;
                return open_in_place(&dir, &name);
            }
            libc::S_IFCHR => {
                untrusted("device")?;
                return open_in_place(&dir, &name);
            }
            libc::S_IFBLK => return Err(Why::Unsupported("is a block device")),
            _ => return Err(Why::Unsupported("is a socket")),
        }
    }
    Err(Why::Io(io::Error::from_raw_os_error(libc::ELOOP)))
}

/// Opens a FIFO or character device for writing, without following a symlink and without
/// waiting for a FIFO reader.
fn open_in_place(dir: &File, name: &OsStr) -> Result<Sink, Why> {
    let c = cstr(name)?;
    let flags =
        libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: `c` is a valid C string and `dir` an open directory.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::ENXIO) {
            Why::NoReader
        } else {
            Why::Io(e)
        });
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    in_place(file)
}

/// Writes go to a copy of our descriptor `fd` (`/dev/stdout`, `/proc/self/fd/N`).
fn dup_in_place(fd: i32) -> Result<Sink, Why> {
    // SAFETY: F_DUPFD_CLOEXEC on any int is safe; failure is reported.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(Why::Io(io::Error::last_os_error()));
    }
    // SAFETY: `new` is a fresh descriptor owned by nobody else.
    Ok(Sink::InPlace(unsafe { File::from_raw_fd(new) }))
}

/// Checks what was opened (it may have changed since `fstatat`) and makes writes blocking.
fn in_place(file: File) -> Result<Sink, Why> {
    let meta = file.metadata()?;
    if meta.is_file() || meta.is_dir() {
        return Err(Why::Unsupported("changed while being opened"));
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on our own open descriptor.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(Sink::InPlace(file))
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
