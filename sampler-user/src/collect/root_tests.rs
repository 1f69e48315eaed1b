//! Privileged tests of the collector against the running kernel (need root).
//!
//! Without root they print a loud SKIPPED line, except under `CI=true`, where they fail: CI
//! must run them. They are serialised (a shared lock) because each loads its own object and
//! competes for the same two CPUs.
use std::{
    process::Command,
    sync::{Mutex, mpsc},
    time::{Duration, Instant},
};

use sampler_common::{Counter, STACK_SIZE_CLASSES, sample_flags};

use super::{CollectConfig, Collector, Event, RawSample};

pub(super) static SERIAL: Mutex<()> = Mutex::new(());

/// True when running as root; otherwise skip (or fail under CI=true).
pub(super) fn have_root(test: &str) -> bool {
    crate::procs::tests::require_root(test)
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Spin in user space for `dur`; returns the spinning thread's id through `tid`.
fn spin(dur: Duration, tid: &mpsc::Sender<u32>) {
    tid.send(gettid()).unwrap();
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < dur {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Spins until this thread has had `cpu` of CPU time (however loaded the machine is), at most
/// `wall`.
fn spin_cpu(cpu: Duration, wall: Duration, tid: &mpsc::Sender<u32>) {
    tid.send(gettid()).unwrap();
    let (start, cpu0) = (Instant::now(), thread_cpu());
    let mut x = 0u64;
    while thread_cpu().saturating_sub(cpu0) < cpu && start.elapsed() < wall {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

fn own_cfg(stack_bytes: u32) -> CollectConfig {
    CollectConfig {
        frequency_hz: 499,
        pids: vec![std::process::id()],
        filter_pids: true,
        follow_children: false,
        stack_bytes,
        kernel_stacks: true,
        ring_bytes: 0,
        self_pid: 0,
        variant: super::VariantChoice::from_env(),
        idle: false,
    }
}

/// Verified-instruction budget of the sampling program per load and variant: the verifier's
/// limit is 1M. Measured (docs/benchmarks.md, kernel matrix): `bpf_loop` ~5k on 6.12 and 6.18,
/// ~92k on 6.1, whose verifier prunes less (~52k before issue 17's in-kernel frame checks:
/// 6.1 still walks the rest of the program for more states after the walk; close to this
/// budget, which is left as it was); `bounded` ~12k on 6.12 and 6.18, ~434k on 6.1 (5.10
/// does not report it). A state explosion would blow far past these.
fn verified_insns_budget(variant: &str) -> u32 {
    if variant == "bpf_loop" {
        100_000
    } else {
        600_000
    }
}

/// Every program variant the kernel supports loads in every record variant: each load verifies
/// the configured stack class (or none) both with and without the Python capture (that choice
/// is made per sample), plus the no-stack pair used for samples without user registers. A
/// variant the kernel lacks a feature for is refused with the error naming it. Prints one
/// `variant-load:` line per load (the kernel matrix reads them).
#[test]
fn loads_every_variant_at_every_stack_size_class() {
    if !have_root("loads_every_variant_at_every_stack_size_class") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let features = super::KernelFeatures::probe(&super::btf::path());
    let mut loaded = 0;
    for variant in super::variant::SAMPLER.variants {
        let choice = super::VariantChoice::Named(variant.name.to_string());
        let supported =
            super::variant::choose(&super::variant::SAMPLER, &features, &choice).is_ok();
        'classes: for stack_bytes in [0].into_iter().chain(STACK_SIZE_CLASSES) {
            for kernel_stacks in [false, true] {
                let cfg = CollectConfig {
                    kernel_stacks,
                    variant: choice.clone(),
                    ..own_cfg(stack_bytes)
                };
                let started = Instant::now();
                let result = Collector::start(&cfg);
                if !supported {
                    let err = result.err().expect("an unsupported variant loaded");
                    assert!(
                        matches!(err, super::CollectError::KernelFeatures { .. }),
                        "{}: {err}",
                        variant.name
                    );
                    eprintln!("variant-load: {} unsupported: {err}", variant.name);
                    break 'classes;
                }
                let collector = result.unwrap_or_else(|e| {
                    panic!(
                        "{} stack {stack_bytes}, kstacks {kernel_stacks}: {e}\n{}",
                        variant.name,
                        e.verifier_log().unwrap_or("")
                    )
                });
                let stats = collector.program_stats().expect("program info");
                assert!(stats.translated_insns > 0);
                assert!(
                    stats.variant.starts_with(variant.name),
                    "{} loaded as {}",
                    variant.name,
                    stats.variant
                );
                eprintln!(
                    "variant-load: {} stack_bytes={stack_bytes} kernel_stacks={kernel_stacks} \
                     verified_insns={} translated={} jited_bytes={} load_ms={}",
                    variant.name,
                    stats
                        .verified_insns
                        .map_or_else(|| "n/a".to_string(), |n| n.to_string()),
                    stats.translated_insns,
                    stats.jited_bytes,
                    started.elapsed().as_millis()
                );
                if let Some(verified) = stats.verified_insns {
                    assert!(
                        verified < verified_insns_budget(variant.name),
                        "{} stack {stack_bytes}: {verified} verified instructions",
                        variant.name
                    );
                }
                loaded += 1;
            }
        }
    }
    // The last variant needs only what every variant needs: some variant always loads.
    assert!(loaded >= 10, "only {loaded} loads");
}

/// The probes agree with the kernel's version on the kernels the matrix runs (Debian's, with
/// BTF, no backports): `bpf_loop` from 5.17, `bpf_task_pt_regs` from 5.15, the rest always;
/// `task_struct.stack` is found in the BTF.
#[test]
fn kernel_features_match_the_kernel_version() {
    use super::Feature;
    if !have_root("kernel_features_match_the_kernel_version") {
        return;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let version: (u32, u32) = (
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().parse().unwrap(),
    );
    let btf = std::path::Path::new(super::btf::VMLINUX_BTF).exists();
    let features = super::KernelFeatures::probe(std::path::Path::new(super::btf::VMLINUX_BTF));
    eprintln!("kernel {}: {features:?}", release.trim());
    for (feature, expected) in [
        (Feature::RingBuf, true),
        (Feature::ProbeRead, true),
        (Feature::NsPidTgid, true),
        (Feature::BpfLoop, version >= (5, 17)),
        (Feature::TaskPtRegs, btf && version >= (5, 15)),
    ] {
        assert_eq!(
            features.present.contains(&feature),
            expected,
            "{feature:?} on {}",
            release.trim()
        );
    }
    assert_eq!(features.task_stack_offset.is_some(), btf);
    // Without BTF the probe reports no offset and the bpf_task_pt_regs variant is out.
    let none = super::KernelFeatures::probe(std::path::Path::new("/nonexistent/vmlinux"));
    assert_eq!(none.task_stack_offset, None);
    assert!(!none.present.contains(&Feature::TaskPtRegs));
}

#[test]
fn collect_samples_own_busy_thread() {
    if !have_root("collect_samples_own_busy_thread") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut collector = Collector::start(&own_cfg(32 << 10)).unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = mpsc::channel();
    // 0.6 s of CPU (not of wall time: a loaded machine gives the thread less of each second).
    let busy = std::thread::spawn(move || {
        spin_cpu(Duration::from_millis(600), Duration::from_secs(30), &tx);
    });
    let busy_tid = rx.recv().unwrap();

    let started = Instant::now();
    let mut samples: Vec<RawSample> = Vec::new();
    while !busy.is_finished() {
        collector
            .poll(Duration::from_millis(50), None, |ev| {
                if let Event::Sample(s) = ev {
                    samples.push(s);
                }
            })
            .unwrap();
    }
    busy.join().unwrap();
    collector
        .poll(Duration::ZERO, None, |ev| {
            if let Event::Sample(s) = ev {
                samples.push(s);
            }
        })
        .unwrap();
    let elapsed = started.elapsed().as_secs_f64();

    let pid = std::process::id();
    assert!(
        samples.iter().all(|s| s.pid == pid),
        "a sample of another process leaked through the filter"
    );
    let busy: Vec<&RawSample> = samples.iter().filter(|s| s.tid == busy_tid).collect();
    let with_stack: Vec<&RawSample> = busy.iter().copied().filter(|s| s.stack.is_some()).collect();
    let totals = collector.counters().unwrap();
    eprintln!(
        "{} samples ({:.0}/s), {} of the busy thread, {} with a stack copy; counters: {:?}",
        samples.len(),
        samples.len() as f64 / elapsed,
        busy.len(),
        with_stack.len(),
        totals.iter().collect::<Vec<_>>()
    );
    if let Some(stats) = collector.program_stats() {
        eprintln!("program stats: {stats:?}");
    }
    // 499 Hz for 0.6 s of the thread's CPU time: ~300 samples, whatever the load.
    assert!(
        busy.len() >= 200,
        "only {} samples of the busy thread",
        busy.len()
    );
    assert!(
        with_stack.len() * 10 >= busy.len() * 9,
        "few stack copies: {} of {}",
        with_stack.len(),
        busy.len()
    );
    for s in &with_stack {
        let copy = s.stack.as_ref().unwrap();
        assert!(!copy.bytes.is_empty());
        assert_eq!(copy.base % 4096, 0);
        let end = copy.base + copy.bytes.len() as u64;
        assert!(
            (copy.base..end).contains(&s.regs.sp),
            "sp {:#x} outside copy [{:#x}, {end:#x})",
            s.regs.sp,
            copy.base
        );
        assert_ne!(
            s.flags & (sample_flags::USER_MODE | sample_flags::REGS_FROM_TASK),
            0
        );
    }
    for s in samples.iter().filter(|s| s.kernel_stack_id >= 0) {
        assert!(
            collector
                .kernel_stack(s.kernel_stack_id)
                .is_some_and(|k| !k.is_empty())
        );
    }
    assert_eq!(totals.lost_samples(), 0);
    assert_eq!(totals.malformed, 0);
    assert!(totals.get(Counter::Sent) >= samples.len() as u64);
    assert!(totals.get(Counter::Runs) >= totals.get(Counter::Sent));
}

#[test]
fn follows_forked_children() {
    if !have_root("follows_forked_children") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cfg = CollectConfig {
        follow_children: true,
        stack_bytes: 8 << 10,
        ..own_cfg(0)
    };
    let mut collector = Collector::start(&cfg).unwrap_or_else(|e| panic!("{e}"));

    // A new thread of ours fires task_newtask too; it must not come out as a FORK.
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || spin(Duration::from_millis(50), &tx));
    let thread_tid = rx.recv().unwrap();
    thread.join().unwrap();

    let mut child = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn sh");
    let child_pid = child.id();
    let mut forks = Vec::new();
    let mut child_samples = 0usize;
    let mut execs = 0usize;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1200) {
        collector
            .poll(Duration::from_millis(50), None, |ev| match ev {
                Event::Fork(c) => forks.push(c),
                Event::Sample(s) if s.pid == child_pid => child_samples += 1,
                Event::Exec(c) if c.pid == child_pid => execs += 1,
                _ => {}
            })
            .unwrap();
    }
    assert!(
        collector.targets.contains(child_pid),
        "the child is not a target"
    );
    assert!(
        !collector.targets.contains(thread_tid),
        "a new thread became a target"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let mut exited = false;
    let deadline = Instant::now() + Duration::from_secs(2);
    while !exited && Instant::now() < deadline {
        collector
            .poll(Duration::from_millis(50), None, |ev| {
                exited |= matches!(ev, Event::Exit(c) if c.pid == child_pid);
            })
            .unwrap();
    }
    let totals = collector.counters().unwrap();
    eprintln!(
        "forks {forks:?}, {child_samples} child samples, {execs} execs, counters {:?}",
        totals.iter().collect::<Vec<_>>()
    );
    assert!(exited, "no EXIT event for the killed child");
    assert!(
        !collector.targets.contains(child_pid),
        "an exited child stayed a target"
    );

    let fork = forks
        .iter()
        .find(|c| c.pid == child_pid)
        .expect("no FORK event for the child");
    assert_eq!(fork.parent_pid, std::process::id());
    assert!(
        forks.iter().all(|c| c.pid != thread_tid),
        "a new thread was reported as a FORK"
    );
    assert_eq!(execs, 1, "the child's exec was not reported");
    assert!(
        child_samples >= 50,
        "only {child_samples} samples of the followed child"
    );
    assert_eq!(totals.get(Counter::FollowFailed), 0);
}

/// Read from /dev/zero in a loop for `dur`: the thread spends most of its time in the kernel.
fn syscall_loop(dur: Duration, tid: &mpsc::Sender<u32>) {
    use std::io::Read as _;
    tid.send(gettid()).unwrap();
    let mut zero = std::fs::File::open("/dev/zero").unwrap();
    let mut buf = vec![1u8; 1 << 20];
    let start = Instant::now();
    while start.elapsed() < dur {
        zero.read_exact(&mut buf).unwrap();
    }
}

#[test]
fn kernel_mode_samples_use_task_regs_and_kernel_stacks() {
    if !have_root("kernel_mode_samples_use_task_regs_and_kernel_stacks") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut collector = Collector::start(&own_cfg(16 << 10)).unwrap_or_else(|e| panic!("{e}"));
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || syscall_loop(Duration::from_secs(1), &tx));
    let tid = rx.recv().unwrap();
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1150) {
        collector
            .poll(Duration::from_millis(50), None, |ev| {
                if let Event::Sample(s) = ev
                    && s.tid == tid
                {
                    samples.push(s);
                }
            })
            .unwrap();
    }
    worker.join().unwrap();
    let from_task: Vec<&RawSample> = samples
        .iter()
        .filter(|s| s.flags & sample_flags::REGS_FROM_TASK != 0)
        .collect();
    let with_kstack = from_task
        .iter()
        .filter(|s| {
            collector
                .kernel_stack(s.kernel_stack_id)
                .is_some_and(|k| !k.is_empty())
        })
        .count();
    let totals = collector.counters().unwrap();
    eprintln!(
        "{} samples of the syscall thread, {} in kernel mode, {with_kstack} with a kernel stack; counters {:?}",
        samples.len(),
        from_task.len(),
        totals.iter().collect::<Vec<_>>()
    );
    assert!(
        from_task.len() >= 50,
        "only {} kernel-mode samples",
        from_task.len()
    );
    assert!(
        with_kstack * 10 >= from_task.len() * 9,
        "few kernel stacks: {with_kstack}"
    );
    // A sample taken while the thread handles a page fault on its own stack page has no copy:
    // the page at `sp` is not mapped yet, and the eBPF program cannot fault it in. Emulated
    // kernels (the kernel matrix) spend long enough in such faults to be sampled there
    // (1–2 of 206–406 kernel-mode samples on 5.10, 6.1 and 6.12 under TCG, both variants);
    // they are counted as `StackCopyEmpty`.
    let mut without_copy = 0;
    for s in &from_task {
        assert_eq!(
            s.flags & (sample_flags::NO_USER_REGS | sample_flags::KERNEL_THREAD),
            0
        );
        assert_ne!(s.regs.ip, 0);
        match &s.stack {
            Some(copy) => {
                assert!((copy.base..copy.base + copy.bytes.len() as u64).contains(&s.regs.sp));
            }
            None => without_copy += 1,
        }
    }
    assert!(
        without_copy * 10 <= from_task.len(),
        "{without_copy} of {} kernel-mode samples without a user stack copy",
        from_task.len()
    );
    assert!(
        totals.get(Counter::StackCopyEmpty) >= without_copy as u64,
        "samples without a stack copy that were not counted"
    );
    for s in samples
        .iter()
        .filter(|s| s.flags & sample_flags::USER_MODE != 0)
    {
        assert_eq!(
            s.kernel_stack_id, -14,
            "user-mode samples have no kernel stack"
        );
    }
    // Collisions in `KSTACKS` (`-EEXIST`) are a counted loss, bounded by the 90 % above: an
    // emulated kernel's syscalls and page faults give hundreds of distinct kernel stacks, and
    // with 16 Ki buckets some share one (3 of ~400 on 5.10 under TCG). Any other failure is
    // a bug.
    assert_eq!(totals.get(Counter::KernelStackErrors), 0);
    assert_eq!(totals.lost_samples(), 0);
}

/// `PF_KTHREAD` from `<linux/sched.h>`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether `pid` is a kernel thread, from the flags field of `/proc/<pid>/stat`.
fn is_kernel_thread(pid: u32) -> Option<bool> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let flags: u64 = after_comm.split_whitespace().nth(6)?.parse().ok()?;
    Some(flags & PF_KTHREAD != 0)
}

#[test]
fn host_wide_skips_self_and_flags_kernel_threads() {
    if !have_root("host_wide_skips_self_and_flags_kernel_threads") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let own = std::process::id();
    let cfg = CollectConfig {
        pids: Vec::new(),
        filter_pids: false,
        self_pid: own,
        ..own_cfg(8 << 10)
    };
    let mut collector = Collector::start(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn sh");
    // Kernel-thread work: dirty a file and sync it (the writeback runs in kworkers), again
    // every 200 ms until kernel threads were sampled a few times (up to 10 s): one round is
    // sampled in about half the runs, so the flag checks below would often check nothing.
    let scratch = std::env::temp_dir().join(format!("pyebpf-collect-{own}"));
    let mut samples = Vec::new();
    let kthread_samples = |samples: &[RawSample]| {
        samples
            .iter()
            .filter(|s| s.flags & sample_flags::KERNEL_THREAD != 0)
            .count()
    };
    let started = Instant::now();
    let mut dirtied: Option<Instant> = None;
    while started.elapsed() < Duration::from_millis(800)
        || (kthread_samples(&samples) < 3 && started.elapsed() < Duration::from_secs(10))
    {
        if dirtied.is_none_or(|t| t.elapsed() >= Duration::from_millis(200)) {
            dirtied = Some(Instant::now());
            std::fs::write(&scratch, vec![7u8; 8 << 20]).unwrap();
            let _ = Command::new("sync").status();
        }
        collector
            .poll(Duration::from_millis(50), None, |ev| {
                if let Event::Sample(s) = ev {
                    samples.push(s);
                }
            })
            .unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_file(&scratch);
    let totals = collector.counters().unwrap();

    let mut kthreads_seen = 0;
    for s in &samples {
        assert_ne!(s.pid, own, "the profiler's own samples must be dropped");
        if s.flags & sample_flags::KERNEL_THREAD != 0 {
            kthreads_seen += 1;
            assert_ne!(s.flags & sample_flags::NO_USER_REGS, 0);
            assert!(s.stack.is_none());
        }
        if is_kernel_thread(s.pid) == Some(true) {
            assert_ne!(
                s.flags & sample_flags::KERNEL_THREAD,
                0,
                "kernel thread {} not flagged",
                s.pid
            );
        }
    }
    let child_samples = samples.iter().filter(|s| s.pid == child.id()).count();
    eprintln!(
        "{} host-wide samples, {child_samples} of the busy child, {kthreads_seen} of kernel threads; counters {:?}",
        samples.len(),
        totals.iter().collect::<Vec<_>>()
    );
    assert!(
        child_samples >= 50,
        "only {child_samples} samples of an unrelated busy process"
    );
    assert!(
        kthreads_seen >= 1,
        "no kernel thread sampled in {:?} of writeback work",
        started.elapsed()
    );
    assert_eq!(totals.get(Counter::Filtered), 0);
    assert_eq!(totals.lost_samples(), 0);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

#[test]
fn poll_returns_early_when_interrupted() {
    if !have_root("poll_returns_early_when_interrupted") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A pid above any pid_max: nothing is sampled and no process event passes the filter.
    let cfg = CollectConfig {
        pids: vec![0x7fff_fff0],
        ..own_cfg(0)
    };
    let mut collector = Collector::start(&cfg).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: installs a handler that does nothing, without SA_RESTART (like a Ctrl-C handler).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&raw mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &raw const action, std::ptr::null_mut()),
            0
        );
    }
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    let interrupter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: `me` is blocked in poll below and outlives this thread (joined after).
        unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
    });
    let started = Instant::now();
    let delivered = collector
        .poll(Duration::from_secs(10), None, |_| {})
        .expect("EINTR is not an error");
    let waited = started.elapsed();
    interrupter.join().unwrap();
    assert_eq!(delivered, 0);
    assert!(
        waited < Duration::from_secs(3),
        "poll ignored the signal for {waited:?}"
    );
}
