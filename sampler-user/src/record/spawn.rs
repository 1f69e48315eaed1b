//! Starting `record -- COMMAND` so that not one of its instructions runs unprofiled: the child
//! is forked and held on a pipe before `execv`; `record` adds its pid to the kernel filter and
//! then releases it.
//!
//! `std::process::Command::spawn` waits for the exec to happen, so it cannot hold a child
//! before exec; this uses fork/execv directly. Everything the child needs (paths, argv) is
//! prepared before the fork, so the child only calls async-signal-safe functions.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// A forked child.
#[derive(Debug)]
pub struct HeldChild {
    pid: libc::pid_t,
    release_fd: libc::c_int,
    exited: bool,
}

impl HeldChild {
    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the child exec its command.
    pub fn release(&mut self) -> io::Result<()> {
        let b = b"x";
        // SAFETY: writing one byte from a valid buffer to our pipe end.
        let n = unsafe { libc::write(self.release_fd, b.as_ptr().cast(), 1) };
        // SAFETY: closing our own fd once.
        unsafe { libc::close(self.release_fd) };
        self.release_fd = -1;
        if n == 1 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Whether the child has exited (reaps it).
    pub fn try_wait(&mut self) -> bool {
        if self.exited {
            return true;
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with WNOHANG.
        let r = unsafe { libc::waitpid(self.pid, &raw mut status, libc::WNOHANG) };
        if r == self.pid || r < 0 {
            self.exited = true;
        }
        self.exited
    }
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        if self.release_fd >= 0 {
            // SAFETY: closing our fd; the held child then reads EOF and exits without exec.
            unsafe { libc::close(self.release_fd) };
        }
    }
}

fn resolve(program: &str) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "command not found"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Forks `cmd`, holding the child before `execv` until [`HeldChild::release`].
pub fn spawn_held(cmd: &[String]) -> io::Result<HeldChild> {
    let (program, _) = cmd
        .split_first()
        .ok_or_else(|| io::Error::other("empty command"))?;
    let path = resolve(program)?;
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let cargs: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(io::Error::other)?;
    let mut argv: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [rfd, wfd] = fds;
    // SAFETY: the child calls only async-signal-safe functions (read, execv, _exit) on data
    // prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing the pipe we created.
        unsafe {
            libc::close(rfd);
            libc::close(wfd);
        }
        return Err(e);
    }
    if pid == 0 {
        // Child.
        // SAFETY: see above.
        unsafe {
            libc::close(wfd);
            let mut b = 0u8;
            loop {
                let n = libc::read(rfd, (&raw mut b).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 || *libc::__errno_location() != libc::EINTR {
                    libc::_exit(126);
                }
            }
            libc::execv(cpath.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    // SAFETY: closing the child's end in the parent.
    unsafe { libc::close(rfd) };
    Ok(HeldChild {
        pid,
        release_fd: wfd,
        exited: false,
    })
}
