//! Loading the eBPF object with aya, without the copy of the kernel's BTF that aya 0.14 builds
//! whether or not anything needs it.
//!
//! Owns: the aya loader ([`load`]): the `CONFIG` global, the map sizes, the object's load.
//! Input: the run's [`Config`], the ring size, whether kernel stacks and `--idle` are on, and
//! the kernel BTF parsed by aya when a BTF tracepoint needs it. Output: the loaded [`Ebpf`]
//! (programs not yet loaded into the kernel: `attach` does that).
//!
//! Why the loader is built apart: `EbpfLoader::new()` reads `/sys/kernel/btf/vmlinux` and
//! parses it into aya's `Btf` at once, whatever the loader is told afterwards (aya issue 1172;
//! later aya versions parse it when a load needs it). On a 6.18 kernel that is about 17 MB of
//! heap (the 5.5 MB file, 9 MB of decoded types, a copy of the strings) and 40 ms, the largest
//! part of `record`'s peak memory and start-up. pyebpf's object has no CO-RE relocations: its
//! kernel offsets come from `CONFIG`, read with `btf.rs`' small reader. The loader needs a
//! `Btf` only for the BTF tracepoints of `--idle`, which parse it once and hand the same one to
//! the loader and to `BtfTracePoint::load`. So the loader is created on a short-lived thread
//! whose `open`/`openat`/`openat2` calls fail with `ENOENT` (a seccomp filter of that thread
//! alone): `new()` then finds no BTF, exactly as on a kernel without it, and every other
//! thread is untouched. If the filter cannot be installed, the loader parses as aya does.

use std::io;

use aya::{Btf, Ebpf, EbpfLoader};
use sampler_common::{Config, KERNEL_STACKS_ENTRIES, OFFCPU_ENTRIES, maps};

use super::error::{CollectError, errno_of, one_line};

/// `AUDIT_ARCH_X86_64` (`<linux/audit.h>`: `EM_X86_64 | __AUDIT_ARCH_64BIT |
/// __AUDIT_ARCH_LE`), the only ABI whose system call numbers the filter knows.
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;

/// Loads `object` with `config` (see the module header for `btf`).
pub fn load(
    object: &[u8],
    config: &Config,
    ring_bytes: u32,
    kernel_stacks: bool,
    idle: bool,
    btf: Option<&Btf>,
) -> Result<Ebpf, CollectError> {
    let mut loader = loader_without_kernel_btf();
    loader
        .btf(btf)
        .override_global(maps::CONFIG, config, true)
        .map_max_entries(maps::EVENTS, ring_bytes)
        // The 16 MiB stack-trace map is created only for --kernel (it costs ~25 ms to create
        // and zero); without it the program never looks a stack up.
        .map_max_entries(
            maps::KERNEL_STACKS,
            if kernel_stacks {
                KERNEL_STACKS_ENTRIES
            } else {
                1
            },
        )
        // Preallocated (about 50 MiB with --idle): one entry without it.
        .map_max_entries(maps::OFFCPU, if idle { OFFCPU_ENTRIES } else { 1 })
        .load(object)
        .map_err(|e| CollectError::LoadObject {
            reason: one_line(&e),
            errno: errno_of(&e),
        })
}

/// `EbpfLoader::new()` run where it cannot open the kernel BTF (see the module header).
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    let built = std::thread::Builder::new()
        .name("pyebpf-loader".into())
        .spawn(|| {
            if let Err(e) = deny_opens_in_this_thread() {
                tracing::debug!("aya will parse the kernel BTF: no seccomp filter ({e})");
            }
            EbpfLoader::new()
        })
        .map(std::thread::JoinHandle::join);
    match built {
        Ok(Ok(loader)) => loader,
        _ => EbpfLoader::new(),
    }
}

/// Makes every later `open`, `openat` and `openat2` of the calling thread fail with `ENOENT`
/// (a seccomp filter; the thread's `no_new_privs` is set first, as the kernel requires
/// without `CAP_SYS_ADMIN`). Other threads are not affected; a thread the caller then creates
/// inherits the filter.
fn deny_opens_in_this_thread() -> io::Result<()> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump_if = |k: u32, jt: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf: 0,
        k,
    };
    let (load_word, ret) = (
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_RET | libc::BPF_K,
    );
    // `struct seccomp_data`: the system call number at byte 0, the ABI at byte 4.
    let mut filter = [
        stmt(load_word, 4),
        jump_if(AUDIT_ARCH_X86_64, 1),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(load_word, 0),
        jump_if(libc::SYS_open as u32, 3),
        jump_if(libc::SYS_openat as u32, 2),
        jump_if(libc::SYS_openat2 as u32, 1),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::ENOENT as u32),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: prctl with integer arguments; seccomp reads `prog` (and the filter it points to,
    // both alive for the call) and copies it into the kernel.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &raw const prog,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter stops opens on its own thread only, with ENOENT; everything else works.
    #[test]
    fn opens_fail_on_the_filtered_thread_only() {
        let outcome = std::thread::spawn(|| {
            deny_opens_in_this_thread().expect("seccomp filter");
            let open = std::fs::File::open("/proc/self/stat").map(drop);
            let read = std::fs::read_to_string("/proc/self/stat").map(drop);
            (open.map_err(|e| e.kind()), read.map_err(|e| e.kind()))
        })
        .join()
        .unwrap();
        assert_eq!(
            outcome,
            (Err(io::ErrorKind::NotFound), Err(io::ErrorKind::NotFound))
        );
        assert!(
            std::fs::File::open("/proc/self/stat").is_ok(),
            "other threads still open files"
        );
    }
}
