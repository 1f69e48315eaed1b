//! Host packages from the machine's own apt sources (Debian 12: bookworm, bookworm-updates,
//! bookworm-security). Installs only what `dpkg-query` says is missing, runs `apt-get update`
//! only when the lists are empty, a missing package has no candidate, or an install fails.
use std::collections::BTreeMap;
use std::ffi::OsStr;

use anyhow::{Result, bail};

use crate::sh::{self, say};

/// LLVM for bpf-linker: its major must equal the eBPF toolchain's (22, see `rust.rs`).
pub const LLVM_DEV: &str = "llvm-22-dev";

/// Always needed: LLVM 22 and a C toolchain (bpf-linker's llvm-sys compiles a C shim).
pub const BASE: &[&str] = &[LLVM_DEV, "build-essential", "binutils"];

/// Needed by the tests and the test interpreters (`--interpreters`, `cargo xtask test`):
/// gcc/make for the C workloads, tmux, unshare/setpriv (util-linux), capsh (libcap2-bin),
/// debootstrap + keyring for the sid root, a host python3 with venv (which also installs the
/// real-world packages, `realworld.rs`), `ab` (apache2-utils) for the web-server load, readelf/objdump
/// (binutils), and CPython's build dependencies (bookworm has no libmpdec-dev: CPython's
/// bundled copy is used; tk-dev is optional and left out).
pub const TESTS: &[&str] = &[
    "apache2-utils",
    "gcc",
    "make",
    "binutils",
    "tmux",
    "util-linux",
    "libcap2-bin",
    "debootstrap",
    "debian-archive-keyring",
    "python3",
    "python3-venv",
    "build-essential",
    "pkg-config",
    "xz-utils",
    "libssl-dev",
    "libffi-dev",
    "zlib1g-dev",
    "libbz2-dev",
    "liblzma-dev",
    "libsqlite3-dev",
    "libreadline-dev",
    "libncurses-dev",
    "uuid-dev",
    "libgdbm-dev",
    "libgdbm-compat-dev",
    "libzstd-dev",
    "libexpat1-dev",
    // `go tool pprof`, the real consumer of `-f pprof` in the e2e tests.
    "golang-go",
    // The kernel matrix (`vm-test`): qemu, the guest's static busybox, `dpkg-deb` for the
    // kernel packages (dpkg) and `xz` for their compressed modules (xz-utils, above).
    "qemu-system-x86",
    "busybox-static",
    "dpkg",
    // Debian 12's own CPython 3.11 (static, stripped) and its detached debug file (the
    // "stripped with a debug file" case of the 3.11 tests).
    "python3.11",
    "python3.11-dbg",
    // `gcore` writes the core files `dump --core` is tested on; `gzip` compresses them.
    "gdb",
    "gzip",
];

/// Packages among `want` that are not in state "ii".
fn missing(want: &[&str]) -> Vec<String> {
    let out = sh::clean("dpkg-query")
        .args(["-W", "-f", "${Package}\t${db:Status-Abbrev}\n"])
        .args(want)
        .stderr(std::process::Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let installed: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, st)| st.starts_with("ii"))
        .map(|(p, _)| p)
        .collect();
    want.iter()
        .filter(|p| !installed.contains(p))
        .map(|p| (*p).to_owned())
        .collect()
}

/// Packages among `pkgs` that apt cannot install: unknown, or `Candidate: (none)`.
fn without_candidate(pkgs: &[String]) -> Vec<String> {
    let out = sh::probe(sh::clean("apt-cache").arg("policy").args(pkgs)).unwrap_or_default();
    let mut cand: BTreeMap<&str, bool> = BTreeMap::new();
    let mut cur = None;
    for line in out.lines() {
        if !line.starts_with(' ')
            && let Some(name) = line.strip_suffix(':')
        {
            cur = Some(name.split(':').next().unwrap_or(name));
        } else if let (Some(p), Some(c)) = (cur, line.trim().strip_prefix("Candidate:")) {
            cand.insert(p, c.trim() != "(none)");
        }
    }
    pkgs.iter()
        .filter(|p| !cand.get(p.as_str()).copied().unwrap_or(false))
        .cloned()
        .collect()
}

fn lists_empty() -> bool {
    std::fs::read_dir("/var/lib/apt/lists").map_or(true, |d| {
        !d.flatten()
            .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
    })
}

fn apt_get(args: &[&str]) -> Result<std::process::ExitStatus> {
    let noninteractive: (&str, &OsStr) = ("DEBIAN_FRONTEND", OsStr::new("noninteractive"));
    let mut cmd = sh::privileged("apt-get", &[noninteractive])?;
    sh::status(cmd.args(args))
}

fn update() -> Result<()> {
    if !apt_get(&["update"])?.success() {
        bail!("apt-get update failed (see above)");
    }
    Ok(())
}

fn no_llvm_message() -> String {
    format!(
        "{LLVM_DEV} is not installable from this machine's apt sources. On Debian 12 it comes \
         from bookworm-security (1:22.1.x-1~deb12u1): make sure a `deb http://deb.debian.org/debian-security \
         bookworm-security main` source (or the deb822 equivalent in /etc/apt/sources.list.d/debian.sources) \
         is configured. On Ubuntu add apt.llvm.org (`llvm-toolchain-<codename>-22`). Or install LLVM 22 yourself and \
         re-run with --no-apt."
    )
}

/// Installs whatever of `want` is missing. With `allowed == false` (`--no-apt`) only reports.
pub fn ensure(want: &[&str], allowed: bool) -> Result<()> {
    let missing = missing(want);
    if missing.is_empty() {
        say(
            "apt",
            format!(
                "all {} packages installed - skip ({})",
                want.len(),
                want.join(" ")
            ),
        );
        return Ok(());
    }
    if !allowed {
        say(
            "apt",
            format!(
                "--no-apt: NOT installing missing packages: {}",
                missing.join(" ")
            ),
        );
        return Ok(());
    }
    say("apt", format!("missing: {}", missing.join(" ")));
    let mut updated = false;
    let no_cand = without_candidate(&missing);
    if lists_empty() || !no_cand.is_empty() {
        let why = if lists_empty() {
            "package lists are empty".to_owned()
        } else {
            format!("no install candidate for {}", no_cand.join(" "))
        };
        say("apt", format!("apt-get update ({why})"));
        update()?;
        updated = true;
        let still = without_candidate(&missing);
        if still.iter().any(|p| p == LLVM_DEV) {
            bail!(no_llvm_message());
        }
        if !still.is_empty() {
            bail!(
                "apt has no install candidate for: {} (check /etc/apt/sources*)",
                still.join(" ")
            );
        }
    }
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(missing.iter().map(String::as_str));
    if !apt_get(&args)?.success() {
        if updated {
            bail!("apt-get install failed (see above)");
        }
        say(
            "apt",
            "install failed - apt-get update (lists may be stale) and retry once",
        );
        update()?;
        if !apt_get(&args)?.success() {
            bail!("apt-get install failed twice (see above)");
        }
    }
    let left = self::missing(want);
    if !left.is_empty() {
        bail!(
            "apt-get reported success but these are still not installed: {}",
            left.join(" ")
        );
    }
    say("apt", format!("installed {}", missing.join(" ")));
    Ok(())
}
