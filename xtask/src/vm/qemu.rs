//! Booting a kernel of the matrix in qemu: KVM where a guest really runs, TCG otherwise.
//!
//! KVM is probed by booting: `/dev/kvm` opening and a VM being created prove nothing here (this
//! machine is itself a VM; nested guests die with "KVM internal error … emulation failure" or
//! hang in the firmware). The probe boots the given kernel with its initramfs and waits for the
//! init's first line on the serial console; without it in [`KVM_PROBE_TIMEOUT`], TCG is used
//! (`-accel tcg -cpu max`, multi-threaded).
//!
//! The guest gets the host's root read-only over virtio-9p (tag `hostroot`) and the run's
//! output directory read-write (tag `out`); its console goes to `console.log` there.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::sh::{self, say};

/// How long a KVM guest may take to print its init's first line.
pub const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The accelerator a guest runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    fn args(self) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
            Accel::Tcg => ["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }
}

/// One guest to boot.
pub struct Guest<'a> {
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    /// Shared read-write as `out`; the guest runs `out/guest.sh`.
    pub out: &'a Path,
    /// Extra tmpfs mount points under the read-only root.
    pub tmpfs: &'a [PathBuf],
    pub cpus: u32,
    pub memory_mib: u32,
}

impl Guest<'_> {
    fn command(&self, accel: Accel, console: &Path) -> Command {
        let tmpfs: Vec<String> = self.tmpfs.iter().map(|p| p.display().to_string()).collect();
        let mut append = format!(
            "console=ttyS0 panic=-1 quiet loglevel=4 pyebpf.out={}",
            self.out.display()
        );
        if !tmpfs.is_empty() {
            let _ = write!(append, " pyebpf.tmpfs={}", tmpfs.join(","));
        }
        let mut cmd = sh::clean("qemu-system-x86_64");
        cmd.args(accel.args())
            .args(["-smp", &self.cpus.to_string()])
            .args(["-m", &self.memory_mib.to_string()])
            .args([
                "-nodefaults",
                "-no-reboot",
                "-display",
                "none",
                "-nic",
                "none",
            ])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(self.vmlinuz)
            .arg("-initrd")
            .arg(self.initramfs)
            .args(["-append", &append])
            .args([
                "-fsdev",
                "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
                "-device",
                "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
                "-fsdev",
            ])
            .arg(format!(
                "local,id=out,path={},security_model=none,multidevs=remap",
                self.out.display()
            ))
            .args(["-device", "virtio-9p-pci,fsdev=out,mount_tag=out"])
            .stdin(Stdio::null());
        cmd
    }

    /// Boots on `accel` and waits for the guest to power off, at most `timeout` (then it is
    /// killed). Returns whether it powered off by itself.
    pub fn run(&self, accel: Accel, timeout: Duration) -> Result<bool> {
        let console = self.out.join("console.log");
        let mut cmd = self.command(accel, &console);
        cmd.stdout(Stdio::null())
            .stderr(std::fs::File::create(self.out.join("qemu.stderr"))?);
        println!("+ {}", sh::show(&cmd));
        let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    let err =
                        std::fs::read_to_string(self.out.join("qemu.stderr")).unwrap_or_default();
                    bail!("qemu exited with {status}: {}", err.trim());
                }
                return Ok(true);
            }
            if started.elapsed() > timeout {
                say(
                    "vm-test",
                    format!("guest still running after {timeout:?}: killing qemu"),
                );
                let _ = child.kill();
                let _ = child.wait();
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// Whether a KVM guest of this kernel really runs: boots it with an empty output directory
/// (the init prints its first line, finds no `guest.sh` to run and powers off).
pub fn kvm_works(vmlinuz: &Path, initramfs: &Path, scratch: &Path) -> bool {
    if std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        say("vm-test", "KVM: /dev/kvm cannot be opened - TCG");
        return false;
    }
    let _ = std::fs::remove_dir_all(scratch);
    if std::fs::create_dir_all(scratch).is_err() {
        return false;
    }
    let guest = Guest {
        vmlinuz,
        initramfs,
        out: scratch,
        tmpfs: &[],
        cpus: 1,
        memory_mib: 512,
    };
    let powered_off = guest.run(Accel::Kvm, KVM_PROBE_TIMEOUT).unwrap_or(false);
    let console = std::fs::read_to_string(scratch.join("console.log")).unwrap_or_default();
    let booted = powered_off && console.contains("vm-init: kernel");
    let why = if booted {
        "a guest booted to its init".to_string()
    } else {
        let err = std::fs::read_to_string(scratch.join("qemu.stderr")).unwrap_or_default();
        let first = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output from the guest's init")
            .to_string();
        format!("no guest init within {KVM_PROBE_TIMEOUT:?} ({first}) - TCG")
    };
    say("vm-test", format!("KVM probe: {why}"));
    booted
}
