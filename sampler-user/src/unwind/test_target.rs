//! Test support: a small C target and a ptrace snapshot of its registers and stack.
//!
//! Owns: compiling the target with gcc (`-O2 -fomit-frame-pointer`, so unwinding needs
//! `.eh_frame`), running it, and capturing what the eBPF program would send: user registers
//! and a copy of the stack from the page holding rsp, upward, stopping at the first unreadable
//! page.
//! Constraints: test-only; needs root (or ptrace rights over the child) and gcc.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sampler_common::UserRegs;

use super::StackBytes;

/// The target: `main → outer → middle → hot`, with `hot` spinning. Each function uses its
/// callee's result so no call becomes a tail call, and `noinline, noclone` keeps the names.
pub(crate) const TARGET_C: &str = r#"
#include <stdio.h>
volatile int stop_flag = 0;
volatile unsigned long counter = 0;
__attribute__((noinline, noclone)) static unsigned long hot(unsigned long n) {
    while (!stop_flag) counter += n;
    return counter;
}
__attribute__((noinline, noclone)) static unsigned long middle(unsigned long n) {
    unsigned long r = hot(n * 3);
    return r ^ n;
}
__attribute__((noinline, noclone)) static unsigned long outer(unsigned long n) {
    unsigned long r = middle(n + 7);
    return r + n;
}
__attribute__((noinline)) int main(int argc, char **argv) {
    (void)argv;
    printf("ready\n");
    fflush(stdout);
    unsigned long r = outer((unsigned long)argc);
    printf("%lu\n", r);
    return 0;
}
"#;

/// A temp directory removed on drop.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("pyebpf-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        Self(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compile `src` to `dir/name` with the target flags (plus `extra`).
pub(crate) fn compile(dir: &Path, name: &str, src: &str, extra: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let out = dir.join(name);
    let status = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-g"])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .status()
        .expect("gcc must be installed for this test");
    assert!(status.success(), "gcc failed");
    out
}

/// A running target, killed on drop.
pub(crate) struct Running(pub Child);

impl Running {
    /// Start `exe` and wait until it printed `ready` (it is then about to enter `outer`).
    pub(crate) fn start(exe: &Path) -> Self {
        let mut child = Command::new(exe)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn target");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        // Give it time to get into the spin loop.
        std::thread::sleep(std::time::Duration::from_millis(50));
        Self(child)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A stack copy as the eBPF program makes it.
#[derive(Clone, Debug, Default)]
pub(crate) struct TestStack {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl StackBytes for TestStack {
    fn base(&self) -> u64 {
        self.base
    }
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// One ptrace snapshot.
pub(crate) struct Snapshot {
    pub regs: UserRegs,
    pub stack: TestStack,
}

/// Stop `pid` with `PTRACE_SEIZE` + `PTRACE_INTERRUPT`, read its registers and up to
/// `max_bytes` of stack from the page holding rsp, then detach.
pub(crate) fn snapshot(pid: u32, max_bytes: usize) -> Snapshot {
    let pid = pid as libc::pid_t;
    // SAFETY: plain ptrace/waitpid calls on our own child; `regs` is a valid out-pointer.
    unsafe {
        assert_eq!(
            libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0),
            0,
            "PTRACE_SEIZE: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0),
            0,
            "PTRACE_INTERRUPT"
        );
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &raw mut status, libc::__WALL), pid);
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        assert_eq!(
            libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &raw mut regs),
            0,
            "PTRACE_GETREGS"
        );
        let base = regs.rsp & !0xfff;
        let mut bytes = vec![0u8; max_bytes];
        let mut copied = 0usize;
        while copied < max_bytes {
            let page = 4096.min(max_bytes - copied);
            let local = libc::iovec {
                iov_base: bytes[copied..].as_mut_ptr().cast(),
                iov_len: page,
            };
            let remote = libc::iovec {
                iov_base: (base as usize + copied) as *mut libc::c_void,
                iov_len: page,
            };
            let n = libc::process_vm_readv(pid, &raw const local, 1, &raw const remote, 1, 0);
            if n != page as isize {
                break;
            }
            copied += page;
        }
        bytes.truncate(copied);
        assert_eq!(
            libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0),
            0,
            "PTRACE_DETACH"
        );
        Snapshot {
            regs: UserRegs {
                ip: regs.rip,
                sp: regs.rsp,
                bp: regs.rbp,
            },
            stack: TestStack { base, bytes },
        }
    }
}
