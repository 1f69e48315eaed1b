//! Starting `record -- COMMAND` so that not one of its instructions runs unprofiled: the child
//! is forked and held on a pipe before `execve`; `record` adds its pid to the kernel filter and
//! then releases it. Also: running it as the invoking user under `sudo`, reporting a failed
//! exec, and stopping it when `record` stops.
//!
//! `std::process::Command::spawn` waits for the exec to happen, so it cannot hold a child
//! before exec; this uses fork/execve directly. Everything the child needs (paths, argv,
//! environment, groups) is prepared before the fork, so the child only calls async-signal-safe
//! functions. A failed `setgroups`/`setgid`/`setuid`/`execve` is sent back on a close-on-exec
//! pipe: [`HeldChild::release`] returns it as an error (EOF on that pipe means the exec
//! happened).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::privilege::{RunAs, User};

/// How long the command gets after SIGINT, then after SIGTERM, before the next signal.
const GRACE: Duration = Duration::from_secs(2);

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)`.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ExitStatus::Code(c) => write!(f, "exited with status {c}"),
            ExitStatus::Signal(s) => write!(f, "was killed by signal {s} ({})", signal_name(s)),
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGHUP => "SIGHUP",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

/// A forked child.
#[derive(Debug)]
pub struct HeldChild {
    pid: libc::pid_t,
    release_fd: libc::c_int,
    error_fd: libc::c_int,
    status: Option<ExitStatus>,
}

/// What the child reports when it cannot run the command: the step and errno.
const STEP_EXEC: u8 = 0;

impl HeldChild {
    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the child exec its command; an error if it could not (switching user or `execve`
    /// failed: the child is reaped).
    pub fn release(&mut self) -> io::Result<()> {
        let b = b"x";
        // SAFETY: writing one byte from a valid buffer to our pipe end.
        let n = unsafe { libc::write(self.release_fd, b.as_ptr().cast(), 1) };
        // SAFETY: closing our own fd once.
        unsafe { libc::close(self.release_fd) };
        self.release_fd = -1;
        if n != 1 {
            return Err(io::Error::last_os_error());
        }
        // EOF: the exec closed the child's end. Else 5 bytes: step, errno.
        let mut report = [0u8; 5];
        let mut got = 0;
        while got < report.len() {
            // SAFETY: reading into our buffer from our pipe end.
            let r = unsafe {
                libc::read(
                    self.error_fd,
                    report[got..].as_mut_ptr().cast(),
                    report.len() - got,
                )
            };
            if r > 0 {
                got += r as usize;
            } else if r == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
        // SAFETY: closing our own fd once.
        unsafe { libc::close(self.error_fd) };
        self.error_fd = -1;
        if got < report.len() {
            return Ok(());
        }
        self.wait_blocking();
        let errno = i32::from_le_bytes([report[1], report[2], report[3], report[4]]);
        let e = io::Error::from_raw_os_error(errno);
        Err(match report[0] {
            STEP_EXEC => e,
            step => io::Error::new(
                e.kind(),
                format!(
                    "cannot switch to the invoking user ({}): {e}",
                    ["", "setgroups", "setgid", "setuid"]
                        .get(step as usize)
                        .unwrap_or(&"?")
                ),
            ),
        })
    }

    /// Whether the child has exited (reaps it and keeps its status).
    pub fn try_wait(&mut self) -> bool {
        self.wait(libc::WNOHANG);
        self.status.is_some()
    }

    /// How the command ended, once it has.
    #[cfg(test)]
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    fn wait(&mut self, flags: libc::c_int) {
        if self.status.is_some() {
            return;
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(self.pid, &raw mut status, flags) };
        if r == self.pid {
            self.status = Some(if libc::WIFSIGNALED(status) {
                ExitStatus::Signal(libc::WTERMSIG(status))
            } else {
                ExitStatus::Code(libc::WEXITSTATUS(status))
            });
        } else if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            // Reaped elsewhere: its status is lost.
            self.status = Some(ExitStatus::Code(-1));
        }
    }

    fn wait_blocking(&mut self) {
        while self.status.is_none() {
            self.wait(0);
        }
    }

    /// Ends the command if it still runs, as `perf record -- cmd` users expect: SIGINT, then
    /// SIGTERM after [`GRACE`], then SIGKILL after another; returns how it ended.
    pub fn stop(&mut self) -> ExitStatus {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
            if self.try_wait() {
                break;
            }
            // SAFETY: signalling our own child, not reaped yet (its pid cannot be reused).
            unsafe { libc::kill(self.pid, sig) };
            let t0 = Instant::now();
            while !self.try_wait() && (sig == libc::SIGKILL || t0.elapsed() < GRACE) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.wait_blocking();
        self.status.unwrap_or(ExitStatus::Code(-1))
    }
}

impl Drop for HeldChild {
    fn drop(&mut self) {
        for fd in [self.release_fd, self.error_fd] {
            if fd >= 0 {
                // SAFETY: closing our fd; a held child then reads EOF and exits without exec.
                unsafe { libc::close(fd) };
            }
        }
    }
}

fn resolve(program: &str, path_var: Option<&std::ffi::OsStr>) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin".as_ref());
    std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "command not found"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Our environment, with `HOME`, `USER` and `LOGNAME` of `user` when it runs the command.
fn environment(user: Option<User>) -> io::Result<Vec<CString>> {
    let mut vars: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
    if let Some(u) = user
        && let Some((name, home)) = passwd(u.uid)
    {
        vars.retain(|(k, _)| !matches!(k.to_str(), Some("HOME" | "USER" | "LOGNAME")));
        vars.push(("HOME".into(), home.into()));
        vars.push(("USER".into(), name.clone().into()));
        vars.push(("LOGNAME".into(), name.into()));
    }
    vars.into_iter()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).map_err(io::Error::other)
        })
        .collect()
}

/// `(name, home)` of a uid from the password database.
fn passwd(uid: u32) -> Option<(String, String)> {
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: getpwuid_r writes into `pw` and `buf` (of the length given) and sets `out`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out = std::ptr::null_mut();
    let r =
        unsafe { libc::getpwuid_r(uid, &raw mut pw, buf.as_mut_ptr(), buf.len(), &raw mut out) };
    if r != 0 || out.is_null() {
        return None;
    }
    // SAFETY: on success the fields point into `buf` as NUL-terminated strings.
    let s = |p: *const libc::c_char| {
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    };
    Some((s(pw.pw_name), s(pw.pw_dir)))
}

/// Forks `cmd`, holding the child before `execve` until [`HeldChild::release`]; with `run_as`
/// the child takes that user's groups, group and user id first.
pub fn spawn_held(cmd: &[String], run_as: Option<&RunAs>) -> io::Result<HeldChild> {
    let (program, _) = cmd
        .split_first()
        .ok_or_else(|| io::Error::other("empty command"))?;
    let env = environment(run_as.map(|r| r.user))?;
    let path_var = env
        .iter()
        .find_map(|kv| kv.as_bytes().strip_prefix(b"PATH="))
        .map(std::ffi::OsStr::from_bytes);
    let path = resolve(program, path_var)?;
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let cargs: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(io::Error::other)?;
    let mut argv: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let groups = run_as.map(|r| r.groups.clone()).unwrap_or_default();
    let ids = run_as.map(|r| (r.user.uid, r.user.gid));
    let (release_r, release_w) = pipe()?;
    let (error_r, error_w) = pipe()?;
    // Every signal is blocked across the fork, so none reaches the child before it has reset
    // its handlers (see `reset_handlers`); the child restores the mask, then gets what came.
    let old_mask = block_all_signals();
    // SAFETY: the child calls only async-signal-safe functions (sigaction, signal,
    // pthread_sigmask, read, write, setgroups, setgid, setuid, execve, _exit) on data prepared
    // before the fork.
    let pid = unsafe { libc::fork() };
    let fork_error = (pid < 0).then(io::Error::last_os_error);
    if pid != 0 {
        set_mask(&old_mask);
    }
    if let Some(e) = fork_error {
        // SAFETY: closing the pipes we created.
        unsafe {
            for fd in [release_r, release_w, error_r, error_w] {
                libc::close(fd);
            }
        }
        return Err(e);
    }
    if pid == 0 {
        // SAFETY: see above; every pointer refers to memory prepared before the fork.
        unsafe {
            reset_handlers();
            set_mask(&old_mask);
            libc::close(release_w);
            libc::close(error_r);
            let mut b = 0u8;
            loop {
                let n = libc::read(release_r, (&raw mut b).cast(), 1);
                if n == 1 {
                    break;
                }
                if n == 0 || *libc::__errno_location() != libc::EINTR {
                    libc::_exit(126);
                }
            }
            let fail = |step: u8| -> ! {
                let errno = *libc::__errno_location();
                let e = errno.to_le_bytes();
                let report = [step, e[0], e[1], e[2], e[3]];
                libc::write(error_w, report.as_ptr().cast(), report.len());
                libc::_exit(127);
            };
            if let Some((uid, gid)) = ids {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    fail(1);
                }
                if libc::setgid(gid) != 0 {
                    fail(2);
                }
                if libc::setuid(uid) != 0 {
                    fail(3);
                }
            }
            libc::execve(cpath.as_ptr(), argv.as_ptr(), envp.as_ptr());
            fail(STEP_EXEC);
        }
    }
    // SAFETY: closing the child's ends in the parent.
    unsafe {
        libc::close(release_r);
        libc::close(error_w);
    }
    Ok(HeldChild {
        pid,
        release_fd: release_w,
        error_fd: error_r,
        status: None,
    })
}

/// Blocks every signal in the calling thread; returns the mask it had.
fn block_all_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on local signal sets.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&raw mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const all, &raw mut old);
        old
    }
}

/// Sets the calling thread's signal mask (async-signal-safe: the forked child calls it).
fn set_mask(mask: &libc::sigset_t) {
    // SAFETY: `mask` is a valid signal set.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// In the forked child: what `execve` does to handlers, done before the hold. A handled signal
/// gets its default action back, an ignored one stays ignored (as `nohup` expects). Without
/// it, a Ctrl-C while the command is held would run pyebpf's inherited handler in the child
/// and be lost, where after `execve` it would end the command. Async-signal-safe.
fn reset_handlers() {
    for sig in 1..=libc::SIGRTMAX() {
        // SAFETY: sigaction only reads into `old`; signal() sets a default action.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &raw mut old) == 0
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_sigaction != libc::SIG_DFL
            {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

fn pipe() -> io::Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<String> {
        args.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn exec_failures_are_errors_and_statuses_are_kept() {
        let mut c = spawn_held(&cmd(&["/nonexistent-pyebpf"]), None).unwrap();
        let e = c.release().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let mut c = spawn_held(&cmd(&["/etc/passwd"]), None).unwrap();
        let e = c.release().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let mut c = spawn_held(&cmd(&["sh", "-c", "exit 3"]), None).unwrap();
        c.release().unwrap();
        while !c.try_wait() {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(c.status(), Some(ExitStatus::Code(3)));
    }

    /// `record` installs its Ctrl-C handlers before it spawns the command, and a Ctrl-C can
    /// come while the command is still held before `execve`: it must end the command as it
    /// would after (the fork's inherited handler used to swallow it; the command then ran on
    /// until SIGKILL). Also what made `stop_sends_sigint_then_sigterm` fail under load, when the
    /// test process had installed the handlers and the child had not reached `execve` yet.
    #[test]
    fn a_held_command_takes_a_signal_as_after_exec() {
        crate::record::signals::install();
        let mut c = spawn_held(&cmd(&["sleep", "60"]), None).unwrap();
        let t0 = Instant::now();
        assert_eq!(c.stop(), ExitStatus::Signal(libc::SIGINT));
        assert!(t0.elapsed() < GRACE, "{:?}", t0.elapsed());
    }

    #[test]
    fn stop_sends_sigint_then_sigterm() {
        // Ignores SIGINT: SIGTERM ends it.
        let mut c = spawn_held(
            &cmd(&["sh", "-c", "trap '' INT; while :; do sleep 0.05; done"]),
            None,
        )
        .unwrap();
        c.release().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        assert_eq!(c.stop(), ExitStatus::Signal(libc::SIGTERM));
        assert!(t0.elapsed() >= GRACE);
        let mut c = spawn_held(&cmd(&["sleep", "60"]), None).unwrap();
        c.release().unwrap();
        assert_eq!(c.stop(), ExitStatus::Signal(libc::SIGINT));
    }
}
