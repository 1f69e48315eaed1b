//! Kernel generations (issue 11): the sampling program's `bounded` variant, which kernels
//! without `bpf_loop` (5.10–5.16) load, records the same exact stacks as the `bpf_loop` one —
//! forced here with `PYEBPF_SAMPLE_VARIANT`, so that the host's kernel checks it too (the kernel
//! matrix runs it where it is the only choice) — and a kernel without BTF still records, with
//! one line saying what `--native` loses.

use super::stacks::deep_stack_with;
use super::support::{OutDir, Workload, record, setup, total};

/// Fewest samples of a spinning thread in 3 s that we accept (as in `stacks`).
const MIN_SAMPLES: u64 = 30;

#[test]
fn bounded_variant_gives_the_exact_stack_3_12() {
    let Some(rec) = deep_stack_with("3.12", &[("PYEBPF_SAMPLE_VARIANT", "bounded")]) else {
        return;
    };
    let line = rec.stderr_lines("eBPF sampling program:");
    assert!(
        line.len() == 1 && line[0].contains("variant bounded (forced by PYEBPF_SAMPLE_VARIANT)"),
        "the summary does not report the forced variant ({}):\n{}",
        rec.what,
        rec.stderr
    );
}

#[test]
fn without_kernel_btf_record_runs_and_says_what_native_loses_3_12() {
    let Some(interp) = setup("3.12") else { return };
    let w = Workload::start(&interp, "rec_spin.py", &[], &[]);
    let dir = OutDir::new("no-btf");
    let pid = w.pid.to_string();
    let rec = record(
        &["-p", &pid, "--native", "-f", "collapsed", "-d", "3"],
        &dir.join("no-btf.txt"),
        &[("PYEBPF_TEST_FAKE_BTF_PATH", "/nonexistent/vmlinux")],
    );
    let note = rec.stderr_lines("kernel BTF is missing");
    assert_eq!(
        note.len(),
        1,
        "without BTF: want one line saying what is missing ({}):\n{}",
        rec.what,
        rec.stderr
    );
    let program = rec.stderr_lines("eBPF sampling program:");
    assert!(
        program.len() == 1
            && program[0].contains("variant bounded (this kernel lacks")
            && program[0].contains("bpf_task_pt_regs with kernel BTF"),
        "without BTF the bounded variant runs, and the summary says why ({}):\n{}",
        rec.what,
        rec.stderr
    );
    let samples = total(&rec.of_pid(w.pid));
    let full = rec.py_summary_count(w.pid, " with a full Python stack");
    assert!(
        samples >= MIN_SAMPLES && full.is_some_and(|f| f * 100 >= samples * 95),
        "without BTF: {samples} samples of pid {}, {full:?} with a full Python stack ({}):\n{}",
        w.pid,
        rec.what,
        rec.stderr
    );
    // Without --native nothing is lost, and nothing is said.
    let rec = record(
        &["-p", &pid, "-f", "collapsed", "-d", "1"],
        &dir.join("no-btf-plain.txt"),
        &[("PYEBPF_TEST_FAKE_BTF_PATH", "/nonexistent/vmlinux")],
    );
    assert!(
        rec.stderr_lines("kernel BTF is missing").is_empty(),
        "without --native there is nothing to say about BTF ({}):\n{}",
        rec.what,
        rec.stderr
    );
}
