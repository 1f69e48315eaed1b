//! Exact Python stacks per thread: a depth-20 stack on every interpreter is, in ≥ 95 % of the
//! thread's samples, exactly the stack CPython itself showed (the workload's ready file); on
//! 3.13t with the GIL disabled, four threads spinning in parallel in four functions each show
//! only their own function.

use super::support::{
    OutDir, Recording, Sample, Workload, count_where, first_difference, setup, show, show_frames,
    total,
};

/// The thread of `rec_deep.py` that spins at depth 20.
const DEEP_THREAD: &str = "deep20";

/// CPU seconds the spinning thread gets while sampled (~50 samples at 99 Hz): runs last that
/// long, not a fixed wall-clock time, so the counts do not depend on the machine's load.
const CPU_SECS: f64 = 0.5;

/// Fewest samples of a spinning thread that we accept.
const MIN_SAMPLES: u64 = 30;

/// Fewest samples of each of four busy threads sharing two cores.
const MIN_SAMPLES_OF_FOUR: u64 = 15;

/// The Python part of a sample of a thread (everything under `comm (pid);name (tid)`).
fn python_part(s: &Sample) -> &[String] {
    &s.frames[2..]
}

/// Checks one thread's samples: enough of them, ≥ 95 % carry exactly `expected` (outermost
/// first) under the thread level, and the thread level is `name (tid)`.
#[track_caller]
fn check_thread(
    rec: &Recording,
    what: &str,
    (pid, tid, name): (u32, u32, &str),
    expected: &[String],
    min_samples: u64,
) {
    let mine = rec.of_thread(pid, tid);
    let n = total(&mine);
    assert!(
        n >= min_samples,
        "{what}: only {n} samples of thread {name} (tid {tid}) of pid {pid}, want ≥ {min_samples} \
         ({})\nall samples of the pid:\n{}",
        rec.what,
        show(&rec.of_pid(pid), 30)
    );
    let exact = count_where(&mine, |s| python_part(s) == expected);
    eprintln!("{what}: thread {name} (tid {tid}): {exact}/{n} samples exactly its own stack");
    if exact * 100 < n * 95 {
        let worst = mine
            .iter()
            .filter(|s| python_part(s) != expected)
            .max_by_key(|s| s.count)
            .unwrap();
        panic!(
            "{what}: only {exact}/{n} samples of thread {name} (tid {tid}) carry exactly the \
             stack CPython showed ({})\nexpected under `… ({pid});{name} ({tid})`, outermost \
             first:\n{}most frequent wrong stack ({} samples): {}\nsamples of the thread:\n{}",
            rec.what,
            show_frames(expected),
            worst.count,
            first_difference(python_part(worst), expected),
            show(&mine, 15)
        );
    }
    let label = format!("{name} ({tid})");
    let named = count_where(&mine, |s| s.frames[1] == label);
    assert_eq!(
        named,
        n,
        "{what}: the --threads level of tid {tid} is not `{label}` in every sample:\n{}",
        show(&mine, 10)
    );
}

/// `f1` … `f20` of `rec_deep.py` as labels, outermost first.
fn deep20_own_frames(w: &Workload) -> Vec<String> {
    (1..=20)
        .map(|i| {
            if i == 20 {
                w.label("f20", "spin")
            } else {
                w.label(&format!("f{i}"), &format!("call_f{}", i + 1))
            }
        })
        .collect()
}

/// Acceptance 1: a thread spinning at a known depth-20 stack → ≥ 95 % of its samples carry
/// exactly the stack CPython showed for it (the workload's ready file). `env` is given to `record`.
pub(super) fn deep_stack_with(name: &str, env: &[(&str, &str)]) -> Option<Recording> {
    let interp = setup(name)?;
    let w = Workload::start(&interp, "rec_deep.py", &[], &[]);
    let tid = w.tid(DEEP_THREAD);
    let expected = w.own_stack(DEEP_THREAD);
    let own = deep20_own_frames(&w);
    assert!(
        expected.ends_with(&own),
        "{name}: CPython's own stack of pid {} thread {tid} does not end with f1 … f20 (a \
         workload bug, not a record bug):\n{}expected to end with:\n{}",
        w.pid,
        show_frames(&expected),
        show_frames(&own)
    );
    let dir = OutDir::new(&format!("deep-{name}"));
    let pid = w.pid.to_string();
    let rec = super::support::record_for_cpu(
        &["-p", &pid, "-t", "-f", "collapsed"],
        &dir.join("deep.txt"),
        env,
        &[(w.pid, tid)],
        CPU_SECS,
    );
    check_thread(
        &rec,
        name,
        (w.pid, tid, DEEP_THREAD),
        &expected,
        MIN_SAMPLES,
    );
    check_summary(&rec, name, w.pid);
    Some(rec)
}

fn deep_stack(name: &str) {
    deep_stack_with(name, &[]);
}

/// Deliverable 7: the per-process summary line counts every sample of the process in the output
/// and, for a process that only ever runs Python, reports them all with a full Python stack.
#[track_caller]
fn check_summary(rec: &Recording, what: &str, pid: u32) {
    let line = rec.py_summary(pid).unwrap_or_else(|| {
        panic!(
            "{what}: no per-process summary line for pid {pid}:\n{}",
            rec.stderr
        )
    });
    let in_output = total(&rec.of_pid(pid));
    let samples = rec.py_summary_count(pid, " samples,");
    let full = rec.py_summary_count(pid, " with a full Python stack");
    let truncated = rec.py_summary_count(pid, " truncated");
    let mismatches = rec.py_summary_count(pid, " merge mismatches");
    assert!(
        samples == Some(in_output)
            && full.is_some_and(|f| f * 100 >= in_output * 95)
            && truncated == Some(0)
            && mismatches == Some(0),
        "{what}: per-process summary disagrees with the output ({in_output} samples of pid {pid} \
         in it, all with a full Python stack, none truncated, no merge): {line}"
    );
}

#[test]
fn deep_stack_3_12() {
    deep_stack("3.12");
}

#[test]
fn deep_stack_3_13() {
    deep_stack("3.13");
}

#[test]
fn deep_stack_3_13t() {
    deep_stack("3.13t");
}

#[test]
fn deep_stack_3_13t_static() {
    deep_stack("3.13t-static");
}

#[test]
fn deep_stack_3_14_sid_root() {
    deep_stack("3.14");
}

#[test]
fn deep_stack_3_15_sid_root() {
    deep_stack("3.15");
}

/// Acceptance 3: 3.13t with the GIL disabled, four threads spinning in four functions in
/// parallel → each thread's samples show only its own function (exactly its own stack in
/// ≥ 95 %, never another thread's function).
#[test]
fn free_threaded_four_threads_show_only_their_own_function_3_13t() {
    let Some(interp) = setup("3.13t") else { return };
    let w = Workload::start(&interp, "rec_threads4.py", &[], &[("PYTHON_GIL", "0")]);
    assert!(
        !w.gil_enabled(),
        "3.13t workload runs with the GIL enabled (setup problem): {}",
        w.ready
    );
    let roles = ["alpha", "beta", "gamma", "delta"];
    let threads: Vec<(String, u32, Vec<String>)> = roles
        .iter()
        .map(|r| {
            let name = format!("t-{r}");
            let tid = w.tid(&name);
            let expected = w.own_stack(&name);
            let own = w.label(&format!("spin_{r}"), &format!("spin_{r}"));
            assert_eq!(
                expected.last(),
                Some(&own),
                "CPython's own stack of {name} (tid {tid}) is not in spin_{r}:\n{}",
                show_frames(&expected)
            );
            (name, tid, expected)
        })
        .collect();
    let dir = OutDir::new("threads4");
    let pid = w.pid.to_string();
    // Four busy threads share two cores with the rest of the machine: until each had 0.3 s
    // of CPU (~30 samples).
    let busy: Vec<(u32, u32)> = threads.iter().map(|t| (w.pid, t.1)).collect();
    let rec = super::support::record_for_cpu(
        &["-p", &pid, "-t", "-f", "collapsed"],
        &dir.join("threads4.txt"),
        &[],
        &busy,
        0.3,
    );
    for (i, (name, tid, expected)) in threads.iter().enumerate() {
        let mine = rec.of_thread(w.pid, *tid);
        let foreign: Vec<String> = roles
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, r)| w.files.label_prefix(&format!("spin_{r}")))
            .collect();
        let wrong: Vec<&Sample> = mine
            .iter()
            .copied()
            .filter(|s| {
                s.frames
                    .iter()
                    .any(|f| foreign.iter().any(|p| f.starts_with(p)))
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "3.13t GIL disabled: {} samples of thread {name} (tid {tid}) show another thread's \
             function ({}):\n{}",
            total(&wrong),
            rec.what,
            show(&wrong, 15)
        );
        check_thread(
            &rec,
            "3.13t GIL disabled",
            (w.pid, *tid, name),
            expected,
            MIN_SAMPLES_OF_FOUR,
        );
    }
}

// CPython 3.8–3.11 (issue 10): `PyFrameObject` chains (≤ 3.10, thread states matched by
// `pthread_t` against the task's fsbase) and 3.11's `_PyInterpreterFrame` through `cframe`.
#[test]
fn deep_stack_3_8() {
    deep_stack("3.8");
}

#[test]
fn deep_stack_3_9() {
    deep_stack("3.9");
}

#[test]
fn deep_stack_3_10() {
    deep_stack("3.10");
}

#[test]
fn deep_stack_3_11() {
    deep_stack("3.11");
}

/// Debian 12's own `/usr/bin/python3.11`: static, non-PIE, stripped (its `python3.11-dbg` debug file installed).
#[test]
fn deep_stack_3_11_debian_static() {
    deep_stack("3.11-debian");
}

/// Debian 11's python3.9 in a debootstrapped bullseye root (its own libraries, run chrooted).
#[test]
fn deep_stack_3_9_bullseye_root() {
    deep_stack("3.9-bullseye");
}
