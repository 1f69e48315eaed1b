//! `record --idle`: off-CPU intervals become weighted samples that end in their thread state.
//!
//! Owns: the rules of a wall-clock profile in user space — how an interval's weight is split
//! between the state of its switch-out and the runnable wait after its wake-up ([`split`]),
//! which state a switch-out means ([`switch_out_state`]), the state frame's label
//! ([`state_label`]), and the seeding of threads already asleep when their process is
//! attached ([`seed_process`]).
//! Input: `OffCpuInfo`s (from the kernel, or read from `OFFCPU` at the end), attached
//! processes. Output: (state, weight) parts, labels, `OFFCPU` seeds.
//!
//! Weight: the kernel sends an interval only when a multiple of the period `P = 1e9 / rate`
//! falls in `(t_out, t_in]`; the interval weighs the number of such multiples, which over many
//! intervals is the off-CPU time times the rate (the same grid for every thread, so a thread
//! asleep for the whole run gets `rate` samples per second, like one on a CPU). The part up to
//! the wake-up (`t_wake`) is in the switch-out's state, the rest runnable.

use sampler_common::{OffCpuInfo, offcpu_flags};

use crate::collect::{OffCpuMap, Seed};
use crate::profile::ThreadState;

use super::python::{PyProc, SeedStack};

/// `TASK_UNINTERRUPTIBLE` in the task state word (`include/linux/sched.h`).
const TASK_UNINTERRUPTIBLE: u32 = 0x0002;

/// The number of multiples of `period` in `(a, b]`.
pub fn ticks(a: u64, b: u64, period: u64) -> u64 {
    if period == 0 || b <= a {
        return 0;
    }
    b / period - a / period
}

/// The state of the part of an interval before its wake-up.
pub fn switch_out_state(off: &OffCpuInfo) -> ThreadState {
    if off.flags & offcpu_flags::PREEMPT != 0 || off.task_state == 0 {
        ThreadState::Runnable
    } else if off.flags & offcpu_flags::GIL_WAIT != 0 {
        ThreadState::GilWait
    } else if off.task_state & TASK_UNINTERRUPTIBLE != 0 {
        ThreadState::Blocked
    } else {
        ThreadState::Sleeping
    }
}

/// The (state, weight) parts of an interval: its switch-out state up to the wake-up (all of it
/// without one), runnable after it. Parts of weight 0 are left out.
pub fn split(off: &OffCpuInfo, period: u64) -> Vec<(ThreadState, u32)> {
    let first = switch_out_state(off);
    let wake = if off.t_wake == 0 {
        off.t_in
    } else {
        off.t_wake.clamp(off.t_out, off.t_in)
    };
    let weight = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let mut parts = Vec::with_capacity(2);
    let before = ticks(off.t_out, wake, period);
    let after = ticks(wake, off.t_in, period);
    if first == ThreadState::Runnable {
        if before + after > 0 {
            parts.push((first, weight(before + after)));
        }
        return parts;
    }
    if before > 0 {
        parts.push((first, weight(before)));
    }
    if after > 0 {
        parts.push((ThreadState::Runnable, weight(after)));
    }
    parts
}

/// Limits the interval to what lies after `start_ns` (samples before the run began are not
/// part of it); `false` when nothing is left.
pub fn clip(off: &mut OffCpuInfo, start_ns: u64) -> bool {
    if off.t_in <= start_ns {
        return false;
    }
    off.t_out = off.t_out.max(start_ns);
    if off.t_wake != 0 {
        off.t_wake = off.t_wake.max(start_ns);
    }
    true
}

/// The frame that ends an off-CPU stack: `[off-CPU: sleeping in clock_nanosleep]`,
/// `[off-CPU: runnable]`, `[off-CPU: GIL wait]`, `[off-CPU: blocked in read]`. The system
/// call is named for the switch-out's own state (not for the runnable wait after the wake-up).
pub fn state_label(state: ThreadState, off: &OffCpuInfo) -> String {
    let what = match state {
        ThreadState::OnCpu => "on CPU",
        ThreadState::Runnable => return "[off-CPU: runnable]".to_string(),
        ThreadState::GilWait => return "[off-CPU: GIL wait]".to_string(),
        ThreadState::Sleeping => "sleeping",
        ThreadState::Blocked => "blocked",
    };
    if off.flags & offcpu_flags::IN_SYSCALL != 0 {
        let name = u32::try_from(off.syscall)
            .ok()
            .and_then(|nr| syscalls::Sysno::new(nr as usize))
            .map_or_else(
                || format!("syscall {}", off.syscall),
                |s| s.name().to_string(),
            );
        format!("[off-CPU: {what} in {name}]")
    } else {
        format!("[off-CPU: {what}]")
    }
}

/// `CLOCK_MONOTONIC` now, in ns: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The state word equivalent of a `/proc/PID/task/TID/stat` state letter, for a thread off a
/// CPU (`S` 1, `D` 2); `None` for one that is running or runnable (`R`) or not a thread that
/// will run again.
fn proc_state(pid: u32, tid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let state = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .next()?;
    match state {
        "S" => Some(1),
        "D" => Some(TASK_UNINTERRUPTIBLE),
        _ => None,
    }
}

/// The thread's comm, NUL-padded.
fn comm(pid: u32, tid: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Ok(c) = std::fs::read(format!("/proc/{pid}/task/{tid}/comm")) {
        let c = c.strip_suffix(b"\n").unwrap_or(&c);
        let n = c.len().min(15);
        out[..n].copy_from_slice(&c[..n]);
    }
    out
}

/// Opens an interval for every Python thread of `p` that is off a CPU now (a thread asleep
/// since before the run would otherwise show only once it wakes), keeping its Python stack as
/// read now (it cannot change while the thread sleeps). Returns the number seeded.
pub fn seed_process(map: &mut OffCpuMap, pid: u32, p: &mut PyProc) -> Result<usize, String> {
    let threads = p.process.threads().map_err(|e| e.to_string())?;
    let now = monotonic_ns();
    let mut seeded = 0;
    for t in threads {
        let Some(tid) = t.host_tid else { continue };
        let Some(task_state) = proc_state(pid, tid) else {
            continue;
        };
        let seed = Seed {
            pid,
            tid,
            task_state,
            comm: comm(pid, tid),
        };
        match map.seed(&seed, now) {
            Ok(true) => {
                p.seeds.insert(
                    tid,
                    SeedStack {
                        frames: t.frames,
                        items: t.items,
                        truncated: t.truncated,
                    },
                );
                seeded += 1;
            }
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(seeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 10_000_000;

    fn off(t_out: u64, t_wake: u64, t_in: u64, task_state: u32, flags: u32) -> OffCpuInfo {
        OffCpuInfo {
            t_out,
            t_wake,
            t_in,
            syscall: 0,
            task_state,
            flags,
        }
    }

    #[test]
    fn ticks_count_multiples_of_the_period() {
        assert_eq!(ticks(0, P, P), 1);
        assert_eq!(ticks(1, P - 1, P), 0);
        assert_eq!(ticks(P - 1, P, P), 1);
        assert_eq!(ticks(P, 2 * P - 1, P), 0, "(P, 2P-1] holds no multiple");
        assert_eq!(ticks(5, 10 * P + 5, P), 10);
        assert_eq!(ticks(10, 5, P), 0);
        assert_eq!(ticks(0, 100, 0), 0);
        // Over intervals at every phase, the mean weight is the length times the rate.
        let len = 3 * P / 2;
        let total: u64 = (0..P).step_by(1000).map(|a| ticks(a, a + len, P)).sum();
        let n = P / 1000;
        assert_eq!(total, n * 3 / 2);
    }

    #[test]
    fn a_sleep_splits_at_its_wake_up() {
        // Asleep 5 periods, woken, runnable 3 more.
        let o = off(P / 2, 5 * P + P / 2, 8 * P + P / 2, 1, 0);
        assert_eq!(
            split(&o, P),
            vec![(ThreadState::Sleeping, 5), (ThreadState::Runnable, 3)]
        );
        // Not woken (still asleep at the end, or a missed wake-up): all sleeping.
        let o = off(P / 2, 0, 8 * P + P / 2, 1, 0);
        assert_eq!(split(&o, P), vec![(ThreadState::Sleeping, 8)]);
        // Uninterruptible: blocked.
        let o = off(0, 0, 2 * P, 2, 0);
        assert_eq!(split(&o, P), vec![(ThreadState::Blocked, 2)]);
        // A GIL wait, then the wait for a CPU.
        let o = off(
            0,
            P,
            3 * P,
            1,
            offcpu_flags::GIL_WAIT | offcpu_flags::IN_SYSCALL,
        );
        assert_eq!(
            split(&o, P),
            vec![(ThreadState::GilWait, 1), (ThreadState::Runnable, 2)]
        );
    }

    #[test]
    fn a_preemption_is_runnable_throughout() {
        let o = off(0, 0, 4 * P, 0, offcpu_flags::PREEMPT);
        assert_eq!(split(&o, P), vec![(ThreadState::Runnable, 4)]);
        // A yield (voluntary, state running) too.
        let o = off(0, 0, 2 * P, 0, 0);
        assert_eq!(split(&o, P), vec![(ThreadState::Runnable, 2)]);
        // A preempted task that is woken (it never slept) stays one part.
        let o = off(0, P, 4 * P, 1, offcpu_flags::PREEMPT);
        assert_eq!(split(&o, P), vec![(ThreadState::Runnable, 4)]);
    }

    #[test]
    fn short_parts_are_left_out() {
        let o = off(P + 1, P + 2, 2 * P, 1, 0);
        assert_eq!(split(&o, P), vec![(ThreadState::Runnable, 1)]);
        let o = off(P + 1, 2 * P + 1, 2 * P + 2, 1, 0);
        assert_eq!(split(&o, P), vec![(ThreadState::Sleeping, 1)]);
        assert!(split(&off(P + 1, 0, P + 2, 1, 0), P).is_empty());
    }

    #[test]
    fn clipping_keeps_only_the_run() {
        let mut o = off(P, 3 * P, 5 * P, 1, 0);
        assert!(clip(&mut o, 2 * P));
        assert_eq!((o.t_out, o.t_wake), (2 * P, 3 * P));
        assert_eq!(
            split(&o, P),
            vec![(ThreadState::Sleeping, 1), (ThreadState::Runnable, 2)]
        );
        let mut o = off(P, 3 * P, 5 * P, 1, 0);
        assert!(clip(&mut o, 4 * P));
        assert_eq!(split(&o, P), vec![(ThreadState::Runnable, 1)]);
        assert!(!clip(&mut off(P, 0, 2 * P, 1, 0), 2 * P));
    }

    #[test]
    fn labels_name_the_state_and_the_call() {
        let mut o = off(0, 0, P, 1, offcpu_flags::IN_SYSCALL);
        o.syscall = 230; // clock_nanosleep on x86-64
        assert_eq!(
            state_label(ThreadState::Sleeping, &o),
            "[off-CPU: sleeping in clock_nanosleep]"
        );
        o.syscall = 0;
        assert_eq!(
            state_label(ThreadState::Blocked, &o),
            "[off-CPU: blocked in read]"
        );
        o.syscall = 99_999;
        assert_eq!(
            state_label(ThreadState::Sleeping, &o),
            "[off-CPU: sleeping in syscall 99999]"
        );
        o.flags = 0;
        assert_eq!(
            state_label(ThreadState::Sleeping, &o),
            "[off-CPU: sleeping]"
        );
        assert_eq!(
            state_label(ThreadState::Runnable, &o),
            "[off-CPU: runnable]"
        );
        assert_eq!(state_label(ThreadState::GilWait, &o), "[off-CPU: GIL wait]");
    }
}
