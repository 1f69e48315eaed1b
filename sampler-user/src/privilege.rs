//! Who pyebpf works for, and what it may do once sampling has started.
//!
//! Owns: the invoking user ([`invoking_user`]: `SUDO_UID`/`SUDO_GID` when root runs us through
//! `sudo`, else our own real ids), which owns the files we write and runs `record -- COMMAND`;
//! and dropping the capabilities a run no longer needs once it is attached
//! ([`drop_capabilities`], the kept ones in [`cap`]).
//! Input: the environment and our credentials. Output: a [`User`]; capability sets changed.

/// A user and its primary group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct User {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// Who runs `record -- COMMAND`: a user with its groups (under `sudo`, the invoking user).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The user and its primary group.
    pub user: User,
    /// Supplementary groups.
    pub groups: Vec<libc::gid_t>,
}

impl RunAs {
    /// The `sudo` user with its groups; `None` when not run through `sudo`.
    pub fn sudo_user() -> Option<RunAs> {
        let user = sudo_user()?;
        Some(RunAs {
            user,
            groups: groups_of(user),
        })
    }
}

/// The user who asked for this run: under `sudo` (effective uid 0 and `SUDO_UID` set to
/// another user), the user who ran `sudo`; otherwise our real user.
pub fn invoking_user() -> User {
    sudo_user().unwrap_or_else(|| {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        User { uid, gid }
    })
}

/// The user behind `sudo`, when we run as root through it.
pub fn sudo_user() -> Option<User> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |name| std::env::var(name).ok()?.trim().parse::<u32>().ok();
    let uid = id("SUDO_UID")?;
    let gid = id("SUDO_GID")?;
    (uid != 0).then_some(User { uid, gid })
}

/// The owner to give the files we create: the `sudo` user (files in their home belong to
/// them, as if they had written them), or `None` to keep ours.
pub fn file_owner() -> Option<User> {
    sudo_user()
}

/// The `sudo` user's supplementary groups (`getgrouplist` of `SUDO_USER`), its primary group
/// alone when the name is unknown.
pub fn groups_of(user: User) -> Vec<libc::gid_t> {
    let Some(name) = std::env::var("SUDO_USER")
        .ok()
        .and_then(|n| std::ffi::CString::new(n).ok())
    else {
        return vec![user.gid];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let want = n;
        // SAFETY: `groups` has room for `n` entries; getgrouplist writes at most that many and
        // sets `n` to the number it found.
        let r =
            unsafe { libc::getgrouplist(name.as_ptr(), user.gid, groups.as_mut_ptr(), &raw mut n) };
        if r >= 0 {
            groups.truncate(n as usize);
            return groups;
        }
        if n <= want || n > 65_536 {
            return vec![user.gid];
        }
    }
}

/// Capabilities (`include/uapi/linux/capability.h`).
pub mod cap {
    /// Give files to the `sudo` user.
    pub const CHOWN: u32 = 0;
    /// Create and rename output files in any directory root may write.
    pub const DAC_OVERRIDE: u32 = 1;
    /// Read the targets' executables, libraries and debug files wherever they are.
    pub const DAC_READ_SEARCH: u32 = 2;
    /// Stop `-- COMMAND` running as another user (SIGINT, SIGTERM, SIGKILL).
    pub const KILL: u32 = 5;
    /// Read the memory, maps and root of processes of every user (`process_vm_readv`,
    /// `/proc/PID/{mem,maps,root}`).
    pub const SYS_PTRACE: u32 = 19;
    /// Read kernel symbol addresses from `/proc/kallsyms` (`--kernel`).
    pub const SYSLOG: u32 = 34;
    /// Use the eBPF maps after attach, on kernels whose `bpf()` checks every command (before
    /// 6.5 with unprivileged BPF disabled, e.g. Debian 11's 5.10): kept only there
    /// (`collect::Collector::maps_need_cap_bpf`).
    pub const BPF: u32 = 39;
    /// Open `/proc/PID/map_files/*`: the mapped file itself, also when it was deleted or
    /// replaced, or lives in another mount namespace.
    pub const CHECKPOINT_RESTORE: u32 = 40;
    /// Names for messages.
    pub const NAMES: [(u32, &str); 8] = [
        (CHOWN, "CAP_CHOWN"),
        (DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
        (DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
        (KILL, "CAP_KILL"),
        (SYS_PTRACE, "CAP_SYS_PTRACE"),
        (SYSLOG, "CAP_SYSLOG"),
        (BPF, "CAP_BPF"),
        (CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE"),
    ];
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;
/// `SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
/// SECBIT_NO_SETUID_FIXUP_LOCKED`: uid 0 gains no capability from an `execve`.
const SECURE_NOROOT: libc::c_ulong = 0x0f;

/// The kept set, low and high word, for the signal handler of the other threads.
static KEEP: [std::sync::atomic::AtomicU32; 2] = [
    std::sync::atomic::AtomicU32::new(0),
    std::sync::atomic::AtomicU32::new(0),
];

/// Lowers the calling thread's capability sets to [`KEEP`] (async-signal-safe: two syscalls).
fn apply_to_this_thread() -> bool {
    use std::sync::atomic::Ordering;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let word = |i: usize| {
        let k = KEEP[i].load(Ordering::Relaxed);
        Data {
            effective: k,
            permitted: k,
            inheritable: 0,
        }
    };
    let header = Header {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let data = [word(0), word(1)];
    // SAFETY: prctl and capset with valid pointers to our own structs.
    unsafe {
        libc::prctl(libc::PR_SET_SECUREBITS, SECURE_NOROOT, 0, 0, 0);
        libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) == 0
    }
}

/// Drops every capability of the calling thread only (capabilities belong to threads), for a
/// short-lived probe thread; whether that worked.
pub fn drop_all_in_this_thread() -> bool {
    let header = [CAP_VERSION_3, 0];
    let data = [0u32; 6];
    // SAFETY: capset with valid pointers to a v3 header and two zeroed data words.
    unsafe { libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) == 0 }
}

extern "C" fn on_drop_signal(_: libc::c_int) {
    apply_to_this_thread();
}

/// The effective capability mask of a thread of ours, from `/proc/self/task/TID/status`.
fn effective_of(tid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Drops every capability but `keep`, in every thread of the process (capabilities belong to
/// threads: the others are signalled to drop theirs and checked through `/proc`), and makes an
/// `execve` grant root no capability back. Called once the eBPF programs are attached and the
/// targets opened: what is kept is what reading targets, stopping the command and writing the
/// outputs still need (see [`cap`]).
pub fn drop_capabilities(keep: &[u32]) -> std::io::Result<()> {
    use std::sync::atomic::Ordering;
    // Only what we have: asking to keep a capability we lack is EPERM.
    let permitted = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("CapPrm:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    let mask: u64 = keep.iter().fold(0, |m, &c| m | (1u64 << c)) & permitted;
    KEEP[0].store(mask as u32, Ordering::Relaxed);
    KEEP[1].store((mask >> 32) as u32, Ordering::Relaxed);
    let sig = libc::SIGRTMAX() - 3;
    // SAFETY: a handler that makes two syscalls; SA_RESTART so blocking calls of the other
    // threads resume.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_drop_signal as *const () as usize;
        libc::sigemptyset(&raw mut sa.sa_mask);
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(sig, &raw const sa, std::ptr::null_mut());
    }
    if !apply_to_this_thread() {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for _ in 0..50 {
        let pending: Vec<libc::pid_t> = std::fs::read_dir("/proc/self/task")?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|tid| effective_of(tid).is_some_and(|eff| eff & !mask != 0))
            .filter_map(|tid| tid.parse().ok())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        for tid in pending {
            // SAFETY: signalling a thread of our own process.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(std::io::Error::other(
        "a thread kept its capabilities after 50 requests",
    ))
}
