//! Registry tests on the test process, a fake proc root and missing pids; also the root
//! check shared by the privileged tests of `procs`, `unwind` and `symbolize`.

use super::*;

/// The one prerequisite policy (crate `prereq`): `missing(what)` fails under `CI=true` and
/// is a counted, loud skip elsewhere (returns `true`: `if !exists && missing(..) { return; }`).
pub(crate) use prereq::missing;

/// Whether privileged tests can run (root); otherwise [`missing`] (a failure under `CI=true`).
pub(crate) fn require_root(test: &str) -> bool {
    prereq::require_root(test)
}

#[test]
fn registry_on_the_test_process() {
    let pid = std::process::id();
    let mut reg = ProcessRegistry::new();
    let p = reg.get_or_load(pid).expect("self");
    assert_eq!(p.pid, pid);
    assert!(!p.comm.is_empty());
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    assert_eq!(p.exe.as_deref(), Some(exe.as_path()));
    assert!(p.start_time_ticks > 0);
    assert_eq!(p.ns_pid, Some(pid), "tests run in the host pid namespace");
    assert!(!p.cmdline.is_empty());
    assert!(p.mappings.windows(2).all(|w| w[0].start <= w[1].start));
    // Our own text is mapped executable from our exe.
    let here = registry_on_the_test_process as *const () as u64;
    let m = p.mapping_for(here).expect("mapping for own code");
    assert!(m.perms.exec);
    assert_eq!(m.clean_path(), Some(exe.as_path()));
    assert_eq!(p.thread_ns_tid(pid), Some(pid));
    if require_root("registry_on_the_test_process/open_mapping") {
        let f = p.open_mapping(m).unwrap();
        assert_eq!(f.id.inode, m.inode);
        assert!(f.elf.is_some_and(|e| e.section(b".text").is_some()));
    }
    assert!(reg.get(pid).is_some());
    assert_eq!(reg.errors().get(ProcsErrorKind::Stat), 0);
}

#[test]
fn refresh_is_rate_limited_and_sees_new_mappings() {
    let pid = std::process::id();
    let mut reg = ProcessRegistry::new();
    reg.get_or_load(pid).unwrap();
    // Too soon after the load.
    assert!(!reg.refresh_mappings(pid));
    assert_eq!(reg.errors().get(ProcsErrorKind::RefreshRateLimited), 1);
    // Map something new, wait out the interval: the refresh sees it.
    let len = 3 * 4096;
    // SAFETY: anonymous private mapping, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    std::thread::sleep(REFRESH_INTERVAL + Duration::from_millis(10));
    let generation = reg.get(pid).unwrap().mappings_generation;
    assert!(reg.refresh_mappings(pid));
    let p = reg.get(pid).unwrap();
    assert_eq!(p.mappings_generation, generation + 1);
    assert!(
        p.mapping_for(addr as u64 + 4096)
            .is_some_and(|m| m.perms.exec)
    );
    // SAFETY: mapped above.
    unsafe { libc::munmap(addr, len) };
}

#[test]
fn exit_keeps_then_reaps_and_missing_pids_are_counted() {
    let mut reg = ProcessRegistry::new();
    let pid = std::process::id();
    reg.get_or_load(pid).unwrap();
    reg.on_exit(pid);
    assert!(reg.get(pid).unwrap().exited);
    assert!(reg.scan_all() > 0);
    assert!(reg.reap(Duration::from_secs(3600)).is_empty());
    assert_eq!(reg.reap(Duration::ZERO), vec![pid]);
    assert!(reg.get(pid).is_none());

    // pid_max is at most 2^22: this pid never exists. A fresh registry: the scan above may
    // have counted processes that vanished under it (other tests start and kill some).
    let mut reg = ProcessRegistry::new();
    let nope = (1 << 22) + 17;
    assert!(reg.get_or_load(nope).is_none());
    assert!(reg.get_or_load(nope).is_none());
    assert_eq!(reg.errors().get(ProcsErrorKind::Gone), 2);
    assert!(
        reg.error_counts().contains(&(ProcsErrorKind::Gone, 2)),
        "{:?}",
        reg.error_counts()
    );
}

#[test]
fn gone_pids_are_remembered_for_the_retry_delay_only() {
    // Samples of thousands of short-lived processes that exited before they were read: the
    // registry's memory of them follows the last second, not every pid of the run.
    let dir = tempfile::tempdir().unwrap();
    let mut reg = ProcessRegistry::with_proc_root(dir.path());
    for pid in 1000..3000 {
        assert!(reg.get_or_load(pid).is_none());
    }
    assert_eq!(reg.sizes(), (0, 2000));
    std::thread::sleep(MISSING_RETRY + Duration::from_millis(50));
    assert!(reg.get_or_load(5000).is_none());
    assert_eq!(reg.sizes(), (0, 1), "the expired ones are dropped");
    assert_eq!(reg.errors().get(ProcsErrorKind::Gone), 2001, "each counted");
}

#[test]
fn injectable_proc_root_with_fake_process() {
    let dir = std::env::temp_dir().join(format!("pyebpf-fakeproc-{}", std::process::id()));
    let p = dir.join("4242");
    std::fs::create_dir_all(p.join("task/4243")).unwrap();
    std::fs::write(
        p.join("stat"),
        "4242 (my (odd) comm) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 2 0 777 1000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
    )
    .unwrap();
    std::fs::write(p.join("status"), "Name:\tx\nNSpid:\t4242\t7\n").unwrap();
    std::fs::write(p.join("task/4243/status"), "Name:\tx\nNSpid:\t4243\t8\n").unwrap();
    std::fs::write(p.join("cmdline"), b"python3\0-c\0\xffx\0").unwrap();
    let id = "ab".repeat(32);
    std::fs::write(
        p.join("cgroup"),
        format!("0::/system.slice/docker-{id}.scope\n"),
    )
    .unwrap();
    std::fs::write(
        p.join("maps"),
        "1000-2000 r-xp 00000000 08:01 5 /bin/x\nbad line\n",
    )
    .unwrap();
    let mut reg = ProcessRegistry::with_proc_root(&dir);
    let proc = reg.get_or_load(4242).expect("fake process");
    assert_eq!(proc.comm, "my (odd) comm");
    assert_eq!(proc.start_time_ticks, 777);
    assert_eq!(proc.ns_pid, Some(7));
    assert_eq!(proc.cmdline, vec!["python3", "-c", "\u{fffd}x"]);
    assert_eq!(proc.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(proc.mappings.len(), 1);
    assert_eq!(proc.exe, None);
    assert_eq!(proc.thread_ns_tid(4243), Some(8));
    assert_eq!(proc.thread_ns_tid(4243), Some(8), "cached");
    assert_eq!(proc.thread_ns_tid(9999), None);
    assert_eq!(reg.errors().get(ProcsErrorKind::MapsLine), 1);
    assert_eq!(reg.errors().get(ProcsErrorKind::Exe), 1);
    assert_eq!(reg.scan_all(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn nspid_lines() {
    assert_eq!(innermost_nspid("Name:\tx\nNSpid:\t42\n"), Some((42, false)));
    assert_eq!(innermost_nspid("NSpid:\t42\t7\t1\n"), Some((1, true)));
    assert_eq!(innermost_nspid("NSpid:\n"), None);
    assert_eq!(innermost_nspid("NSpid:\tx\n"), None);
    assert_eq!(innermost_nspid("Name:\tx\n"), None);
}

/// Kernel threads have no executable: loading one is not an `exe` error (with `--all` every
/// kernel thread that shows up in a sample would otherwise be counted).
#[test]
fn kernel_threads_are_not_exe_errors() {
    if !require_root("kernel_threads_are_not_exe_errors") {
        return;
    }
    let kthreads: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            procfs::process::Process::new(*pid as i32)
                .and_then(|p| p.stat())
                .is_ok_and(|s| s.flags & PF_KTHREAD != 0)
        })
        .take(20)
        .collect();
    assert!(!kthreads.is_empty(), "no kernel thread found in /proc");
    let mut reg = ProcessRegistry::new();
    for &pid in &kthreads {
        assert!(
            reg.get_or_load(pid).is_some(),
            "kernel thread {pid} not loaded"
        );
    }
    let exe_errors: u64 = reg
        .error_counts()
        .into_iter()
        .filter(|(k, _)| *k == ProcsErrorKind::Exe)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        exe_errors, 0,
        "kernel threads {kthreads:?} counted as exe errors"
    );
}
