//! The pipeline under process churn: what it keeps per process must go with the process.

use std::time::{Duration, Instant};

use super::*;
use crate::collect::ProcChange;
use crate::record::python::{StageConfig, Tracker};
use crate::record::stack::BuildConfig;

/// pid_max is at most 2^22: these pids never exist, so nothing is read from `/proc` for them
/// and their attaches fail (as a process's that exited before it was read).
const FIRST_PID: u32 = (1 << 22) + 1000;

fn change(pid: u32) -> ProcChange {
    ProcChange {
        time_ns: 0,
        pid,
        parent_pid: 0,
        comm: *b"churn\0\0\0\0\0\0\0\0\0\0\0",
    }
}

fn sample(pid: u32, tid: u32, time_ns: u64) -> RawSample {
    RawSample {
        time_ns,
        pid,
        tid,
        cpu: 0,
        comm: *b"churn\0\0\0\0\0\0\0\0\0\0\0",
        flags: 0,
        kernel_stack_id: -14,
        regs: sampler_common::UserRegs::default(),
        stack: None,
        python: None,
        off_cpu: None,
    }
}

fn pipeline() -> Pipeline {
    let tracker = Tracker::new(|_| true);
    Pipeline::new(
        PythonStage::new(StageConfig::default(), tracker),
        StackBuilder::new(BuildConfig::default()),
        Profile::default(),
        false,
        Lifetimes::default(),
    )
}

/// Runs `n` processes of two threads each through exec, samples and exit; returns the
/// profile's sizes.
fn churn(p: &mut Pipeline, from: u32, n: u32) -> [usize; 5] {
    let backlog = Backlog::default();
    for pid in from..from + n {
        let mut batch = vec![Drained::Proc(Event::Exec(change(pid)))];
        for k in 0..3 {
            batch.push(Drained::Sample(sample(pid, pid, k), None));
            batch.push(Drained::Sample(sample(pid, pid + (1 << 21), k), None));
        }
        batch.push(Drained::Proc(Event::Exit(change(pid))));
        p.handle(Input::Batch(batch), &backlog);
    }
    p.profile.sizes()
}

#[test]
fn processes_that_exit_leave_no_per_process_state() {
    let mut p = pipeline();
    let first = churn(&mut p, FIRST_PID, 500);
    assert_eq!(
        p.builder.sizes(),
        (0, 0),
        "roots and thread names dropped on exit"
    );
    // Exits are kept for a grace (samples taken before them still arrive), then dropped.
    p.python
        .tracker()
        .tick(Instant::now() + Duration::from_secs(60));
    let [procs, pending, negative, retries, exits, ..] = p.python.tracker_ref().sizes();
    assert_eq!(
        (procs, pending, negative, retries, exits),
        (0, 0, 0, 0, 0),
        "attaches in flight, verdicts and retries of exited pids dropped"
    );
    p.registry.reap(Duration::ZERO);
    assert_eq!(p.registry.sizes().0, 0, "no process left in the registry");

    // The profile keeps each process's root, stacks and keys (its `comm (pid)` root is in
    // every output), and nothing else per process: a second wave costs what the first did.
    let second = churn(&mut p, FIRST_PID + 500, 500);
    assert_eq!(p.builder.sizes(), (0, 0));
    let grew: Vec<usize> = first.iter().zip(&second).map(|(a, b)| b - a).collect();
    assert_eq!(
        grew,
        [500, 500, 0, 1000, 0],
        "one root frame and one stack per process, one key per thread; names and stack tails \
         shared: {first:?} {second:?}"
    );
}
