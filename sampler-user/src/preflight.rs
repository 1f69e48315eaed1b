//! Pre-flight checks run before any sampling: privileges and kernel support.
//!
//! Owns: deciding whether this host and process can run the sampler, with one actionable line
//! when not. Input: the effective uid, `/proc/self/status` (`CapEff`) and the kernel release
//! (gathered by [`check`], or passed in a [`HostFacts`] to [`check_host`]). Output: `Ok(())` or
//! a [`PreflightError`].
//!
//! The kernel's eBPF features are probed when the programs load (`collect::variant`): that
//! picks the program variant and names anything missing. Kernel BTF is not required: only the
//! user registers of samples taken in kernel mode need it (`collect::variant::degraded_note`).
//!
//! Constraints: privileges are read from the real process (end-to-end tests drop them with
//! `setpriv`); only the kernel release can be faked, for end-to-end tests, through
//! `PYEBPF_TEST_FAKE_KERNEL_RELEASE` (the kernel BTF through `PYEBPF_TEST_FAKE_BTF_PATH`, read
//! where the BTF is read, `collect::btf`).

/// Overrides the kernel release seen by [`check`] (end-to-end tests of the error).
pub const FAKE_KERNEL_RELEASE_ENV: &str = "PYEBPF_TEST_FAKE_KERNEL_RELEASE";
/// Oldest supported kernel: the oldest the kernel matrix (`cargo xtask vm-test`) runs the
/// tests on, Debian 11's 5.10. (The programs' features all exist from 5.8, the ring buffer;
/// 5.8 and 5.9 are untested.)
pub const MIN_KERNEL: (u32, u32) = (5, 10);

/// Capability numbers from `<linux/capability.h>`.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Why pyebpf cannot sample on this host. Each displays as one actionable line.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Neither root nor the needed capabilities.
    #[error("pyebpf needs root (or CAP_BPF and CAP_PERFMON): run it with sudo")]
    NotPrivileged {
        /// Effective uid.
        euid: u32,
        /// Effective capability mask, if `/proc/self/status` had one.
        cap_eff: Option<u64>,
    },
    /// The kernel is older than [`MIN_KERNEL`] (or its release string has no version).
    #[error(
        "unsupported kernel {release}: need {}.{} or newer (the oldest tested)",
        MIN_KERNEL.0,
        MIN_KERNEL.1
    )]
    UnsupportedKernel {
        /// `uname -r`.
        release: String,
    },
}

/// The facts the checks look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFacts {
    /// Effective uid.
    pub euid: u32,
    /// Text of `/proc/self/status` (only `CapEff` is used; empty if unreadable).
    pub status: String,
    /// Kernel release (`uname -r`).
    pub release: String,
}

impl HostFacts {
    /// Gather the facts from this process and kernel, honouring the test overrides.
    pub fn gather() -> HostFacts {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let release = std::env::var(FAKE_KERNEL_RELEASE_ENV).unwrap_or_else(|_| kernel_release());
        HostFacts {
            euid,
            status,
            release,
        }
    }
}

/// Run every check on this host.
pub fn check() -> Result<(), PreflightError> {
    check_host(&HostFacts::gather())
}

/// Run every check on `facts`: privileges first (the most common problem), then the kernel
/// version.
pub fn check_host(facts: &HostFacts) -> Result<(), PreflightError> {
    let cap_eff = parse_cap_eff(&facts.status);
    if !privileged(facts.euid, cap_eff) {
        return Err(PreflightError::NotPrivileged {
            euid: facts.euid,
            cap_eff,
        });
    }
    match parse_release(&facts.release) {
        Some(version) if version >= MIN_KERNEL => Ok(()),
        _ => Err(PreflightError::UnsupportedKernel {
            release: facts.release.clone(),
        }),
    }
}

/// Root, or CAP_SYS_ADMIN, or both CAP_BPF and CAP_PERFMON.
fn privileged(euid: u32, cap_eff: Option<u64>) -> bool {
    let has = |cap: u32| cap_eff.is_some_and(|mask| mask & (1u64 << cap) != 0);
    euid == 0 || has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// The `CapEff:` hex mask of a `/proc/<pid>/status` text.
fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// `(major, minor)` of a release such as `6.18.44-fc-v657` or `5.15.0-91-generic`.
fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// `uname -r`; empty if uname fails (which then fails the version check with that release).
fn kernel_release() -> String {
    // SAFETY: uname fills the zeroed struct; `release` is NUL-terminated by the kernel.
    unsafe {
        let mut uts: libc::utsname = std::mem::zeroed();
        if libc::uname(&raw mut uts) != 0 {
            return String::new();
        }
        std::ffi::CStr::from_ptr(uts.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CapEff of an unprivileged process.
    const NO_CAPS: &str = "Name:\tpyebpf\nUid:\t1000\t1000\t1000\t1000\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n";

    fn facts() -> HostFacts {
        HostFacts {
            euid: 0,
            status: "CapEff:\t000001ffffffffff\n".into(),
            release: "6.18.44-fc-v657".into(),
        }
    }

    fn caps(bits: &[u32]) -> String {
        let mask = bits.iter().fold(0u64, |m, &b| m | 1 << b);
        format!("CapEff:\t{mask:016x}\n")
    }

    #[test]
    fn root_on_a_good_kernel_passes() {
        check_host(&facts()).unwrap();
    }

    #[test]
    fn unprivileged_user_is_refused_with_the_sudo_line() {
        let err = check_host(&HostFacts {
            euid: 65534,
            status: NO_CAPS.into(),
            ..facts()
        })
        .unwrap_err();
        assert!(matches!(
            err,
            PreflightError::NotPrivileged {
                euid: 65534,
                cap_eff: Some(0)
            }
        ));
        assert_eq!(
            err.to_string(),
            "pyebpf needs root (or CAP_BPF and CAP_PERFMON): run it with sudo"
        );
        // No status text at all: still refused, not a crash.
        let err = check_host(&HostFacts {
            euid: 1000,
            status: String::new(),
            ..facts()
        })
        .unwrap_err();
        assert!(matches!(
            err,
            PreflightError::NotPrivileged { cap_eff: None, .. }
        ));
    }

    #[test]
    fn capabilities_are_enough_without_root() {
        let user = |bits: &[u32]| HostFacts {
            euid: 1000,
            status: caps(bits),
            ..facts()
        };
        check_host(&user(&[CAP_BPF, CAP_PERFMON])).unwrap();
        check_host(&user(&[CAP_SYS_ADMIN])).unwrap();
        assert!(check_host(&user(&[CAP_BPF])).is_err());
        assert!(check_host(&user(&[CAP_PERFMON])).is_err());
    }

    #[test]
    fn old_or_unparseable_kernels_are_refused() {
        for release in [
            "5.9.16-1",
            "5.4.0-150-generic",
            "4.19.0-25-amd64",
            "3.10.0-1160.el7.x86_64",
            "",
            "linux",
        ] {
            let err = check_host(&HostFacts {
                release: release.into(),
                ..facts()
            })
            .unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("unsupported kernel {release}: need 5.10 or newer (the oldest tested)")
            );
        }
        for release in [
            "5.10.0-46-amd64",
            "5.14.0-503.el9.x86_64",
            "5.15.0-91-generic",
            "6.1.0-18-amd64",
            "10.0",
        ] {
            check_host(&HostFacts {
                release: release.into(),
                ..facts()
            })
            .unwrap();
        }
    }

    #[test]
    fn privileges_are_checked_before_the_kernel() {
        let err = check_host(&HostFacts {
            euid: 1000,
            status: NO_CAPS.into(),
            release: "4.4".into(),
        })
        .unwrap_err();
        assert!(matches!(err, PreflightError::NotPrivileged { .. }));
    }

    #[test]
    fn parses_status_and_release() {
        assert_eq!(
            parse_cap_eff("CapEff:\t000001ffffffffff\n"),
            Some(0x1ff_ffff_ffff)
        );
        assert_eq!(parse_cap_eff("CapEff:\tzz\n"), None);
        assert_eq!(parse_release("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_release("5.15"), Some((5, 15)));
        assert_eq!(parse_release("6"), None);
    }

    #[test]
    fn gather_reads_this_host() {
        let facts = HostFacts::gather();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(facts.euid, unsafe { libc::geteuid() });
        assert!(
            parse_cap_eff(&facts.status).is_some(),
            "no CapEff in /proc/self/status"
        );
        if std::env::var_os(FAKE_KERNEL_RELEASE_ENV).is_none() {
            assert!(
                parse_release(&facts.release).is_some(),
                "uname -r: {:?}",
                facts.release
            );
        }
    }
}
