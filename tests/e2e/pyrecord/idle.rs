//! Issue 13 acceptance: `record --idle` is a wall-clock profile, off-CPU stacks captured in the
//! kernel at `sched_switch`.
//!
//! - `idle_wall_clock_*` (3.12, 3.13t with its GIL disabled, 3.14 in the sid root): two threads
//!   spin 40 % / sleep 60 % and log their own cycles, a third is blocked on a lock from before
//!   the run. With `--idle` each cycler's sleep share is within 3 pp of its own split over the
//!   time its samples cover (the first to the last sample time, `CLOCK_MONOTONIC` on both
//!   sides), and the blocked thread has as many samples as a cycler
//!   (±10 %); every off-CPU stack ends in a state frame; without `--idle` the sleeping and
//!   blocked functions get ≤ 1 % of the samples. The saved run's `report --sort state` sums to
//!   100 % and its on-CPU rows (`--state on-cpu`) equal the plain run's function shares within
//!   noise.
//! - `gil_wait_*` (3.12, 3.9): two threads contending for the GIL: each one's GIL-wait share
//!   (`report --sort state,function --state gil-wait` rows over its samples) is within 5 pp of
//!   what the kernel's own accounting says (`schedstat`: wall − CPU − run-queue wait).
//!
//! The workloads measure their own truth, so the checks hold on a loaded machine: shares, not
//! counts.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::support::{OutDir, Recording, Workload, count_where, record, setup, show, total};
use crate::common::{pyebpf, run, text};

/// Seconds recorded.
const SECONDS: &str = "6";
/// Largest gap between a cycler's sleep share and its own measurement (issue 13).
const SLEEP_SHARE_PP: f64 = 3.0;
/// Largest relative gap between the blocked thread's samples and a cycler's (issue 13).
const BLOCKED_VS_CYCLER: f64 = 0.10;
/// Largest share of the sleeping and blocked functions without `--idle` (issue 13).
const OFF_CPU_WITHOUT_IDLE_PCT: f64 = 1.0;
/// Largest gap between a thread's GIL-wait share and the kernel's accounting (issue 13).
const GIL_WAIT_PP: f64 = 5.0;
/// "Within noise" for an on-CPU function share of the `--idle` run against the plain run: two
/// runs of a hundred or two on-CPU samples each, one after the other on a loaded machine. The
/// gap may be this many standard errors of the difference of two sampled proportions
/// (`sqrt(p (1 - p) (1/n1 + 1/n2))`, about 3 pp at p = 0.9 and 150 samples each), plus one pp.
const ON_CPU_SHARE_SIGMAS: f64 = 3.5;

fn read_stats(path: &Path) -> Value {
    for _ in 0..50 {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(v) = serde_json::from_str(&s)
        {
            return v;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("no stats in {}", path.display());
}

fn f(v: &Value, thread: &str, key: &str) -> f64 {
    v[thread][key]
        .as_f64()
        .unwrap_or_else(|| panic!("stats: no {thread}.{key} in {v}"))
}

/// Percent.
fn pct(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        n as f64 * 100.0 / of as f64
    }
}

/// Starts a workload that writes a stats file; returns it with the stats file's host path.
fn start_with_stats(
    interp: &crate::common::Interpreter,
    script: &str,
    env: &[(&str, &str)],
) -> (Workload, std::path::PathBuf) {
    // The stats file lives in the workload's own directory, known only once it is installed:
    // install, then start with that path.
    let mut w = Workload::spawn_with(interp, script, env, |dir_inner| {
        vec![format!("{dir_inner}/stats.json")]
    });
    w.wait_ready();
    let host = w.files.host_dir.join("stats.json");
    (w, host)
}

/// `record ARGS -t -p PID -d SECONDS -o DIR/STEM.pyebpf -o DIR/STEM.txt`: the folded stacks
/// and the saved file's path.
fn record_both(
    args: &[&str],
    w: &Workload,
    dir: &OutDir,
    stem: &str,
) -> (Recording, std::path::PathBuf) {
    let pid = w.pid.to_string();
    let saved = dir.join(&format!("{stem}.pyebpf"));
    let mut all: Vec<&str> = args.to_vec();
    all.extend([
        "-t",
        "-p",
        &pid,
        "-d",
        SECONDS,
        "-o",
        saved.to_str().unwrap(),
    ]);
    let rec = record(&all, &dir.join(&format!("{stem}.txt")), &[]);
    (rec, saved)
}

fn idle_wall_clock(name: &str, env: &[(&str, &str)]) {
    let Some(interp) = setup(name) else {
        return;
    };
    let (w, stats) = start_with_stats(&interp, "rec_idle.py", env);
    let dir = OutDir::new(&format!("idle-{name}"));
    let (rec, saved) = record_both(&["--idle"], &w, &dir, "idle");
    // Rewritten every 50 ms: wait for one that covers the end of the recording.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let after = read_stats(&stats);
    check_idle_run(name, &w, &rec, (&saved, &after));
    let (plain, plain_saved) = record_both(&[], &w, &dir, "plain");
    check_plain_run(name, &w, &plain);
    saved_state_report(&saved, &plain_saved, &w, &rec, &plain);
}

/// The first and last sample times (s, `CLOCK_MONOTONIC`) of thread `tid` in a saved run, as
/// `pyebpf script` prints them.
fn sample_window(saved: &Path, tid: u32) -> (f64, f64) {
    let o = run(&mut pyebpf(&["script", saved.to_str().unwrap()]));
    assert!(o.status.success(), "script: {}", text(&o.stderr));
    let needle = format!("/{tid} [");
    let times: Vec<f64> = text(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with('\t') && l.contains(&needle))
        .filter_map(|l| {
            let after = l.split_once("] ")?.1;
            after.split_once(':')?.0.trim().parse().ok()
        })
        .collect();
    assert!(
        !times.is_empty(),
        "no samples of {tid} in {}",
        saved.display()
    );
    let lo = times.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = times.iter().copied().fold(0.0, f64::max);
    (lo, hi)
}

/// (spin, sleep) seconds of `cycler`'s cycles (`[start, end of spin, end of sleep]`) within
/// `[from, to]`.
fn split_within(stats: &Value, cycler: &str, from: f64, to: f64) -> (f64, f64) {
    let logged = stats[cycler]["cycles"]
        .as_array()
        .unwrap_or_else(|| panic!("stats: no cycles of {cycler}"));
    let overlap = |a: f64, b: f64| (b.min(to) - a.max(from)).max(0.0);
    let (mut spin, mut sleep) = (0.0, 0.0);
    for c in logged {
        let t: Vec<f64> = c
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        spin += overlap(t[0], t[1]);
        sleep += overlap(t[1], t[2]);
    }
    let first = logged[0][0].as_f64().unwrap();
    assert!(
        first <= from,
        "{cycler}: the kept cycles start at {first}, after the recording's {from}"
    );
    (spin, sleep)
}

/// The `--idle` run: state frames, each cycler's sleep share against its own measurement over
/// the recording (`window`: the saved run, the stats read after it), the blocked thread
/// against the cyclers.
fn check_idle_run(name: &str, w: &Workload, rec: &Recording, window: (&Path, &Value)) {
    let sleep_fn = w.files.label_prefix("sleep_part");
    let blocked_fn = w.files.label_prefix("blocked_wait");
    let ctx = |what: &str, samples: &[&super::support::Sample]| {
        format!(
            "{what} ({name}, {}):\n{}\nstderr:\n{}",
            rec.what,
            show(samples, 12),
            rec.stderr
        )
    };
    // Every off-CPU stack ends in its state; the off-CPU line reports intervals.
    let all = rec.of_pid(w.pid);
    let states = count_where(&all, |s| s.frames.last().unwrap().starts_with("[off-CPU: "));
    assert!(states > 0, "{}", ctx("no off-CPU stacks", &all));
    assert!(
        rec.stderr_lines("pyebpf: off-CPU (--idle): ").len() == 1,
        "{}",
        ctx("no off-CPU summary line", &all)
    );
    assert_eq!(
        count_where(&all, |s| s
            .frames
            .iter()
            .any(|f| f.starts_with("[off-CPU: "))
            && !s.frames.last().unwrap().starts_with("[off-CPU: ")),
        0,
        "{}",
        ctx("a state frame that is not the leaf", &all)
    );
    if !w.gil_enabled() {
        assert_eq!(
            count_where(&all, |s| s.frames.last().unwrap() == "[off-CPU: GIL wait]"),
            0,
            "{}",
            ctx("GIL waits in a free-threaded process without a GIL", &all)
        );
    }
    let (saved, after) = window;
    let mut cycler_totals = Vec::new();
    for cycler in ["cycler-1", "cycler-2"] {
        let tid = w.tid(cycler);
        let samples = rec.of_thread(w.pid, tid);
        let n = total(&samples);
        let asleep = count_where(&samples, |s| {
            s.frames.iter().any(|f| f.starts_with(&sleep_fn))
        });
        // The thread's own split over the time its samples cover (both on CLOCK_MONOTONIC).
        let (from, to) = sample_window(saved, tid);
        let (spin_s, sleep_s) = split_within(after, cycler, from, to);
        let truth = sleep_s * 100.0 / (spin_s + sleep_s);
        let got = pct(asleep, n);
        eprintln!(
            "{name} {cycler}: sleep share {got:.1} % of {n} samples over {:.2} s, the thread's \
             own {truth:.1} %",
            to - from
        );
        assert!(
            (got - truth).abs() <= SLEEP_SHARE_PP,
            "{}",
            ctx(
                &format!(
                    "{cycler}: sleep share {got:.1} % ({asleep} of {n}) vs the thread's own \
                     {truth:.1} % ({sleep_s:.2} s asleep, {spin_s:.2} s spinning): more than \
                     {SLEEP_SHARE_PP} pp apart"
                ),
                &samples
            )
        );
        cycler_totals.push(n);
    }
    let blocked = rec.of_thread(w.pid, w.tid("blocked"));
    let nb = total(&blocked);
    assert_eq!(
        count_where(&blocked, |s| s
            .frames
            .iter()
            .any(|f| f.starts_with(&blocked_fn))),
        nb,
        "{}",
        ctx("blocked thread samples outside blocked_wait", &blocked)
    );
    for &nc in &cycler_totals {
        let gap = (nb as f64 - nc as f64).abs() / nc as f64;
        assert!(
            gap <= BLOCKED_VS_CYCLER,
            "{}",
            ctx(
                &format!(
                    "the blocked thread has {nb} samples, a cycler {nc}: {:.1} % apart (at most \
                     {:.0} %)",
                    gap * 100.0,
                    BLOCKED_VS_CYCLER * 100.0
                ),
                &blocked
            )
        );
    }
}

/// Without `--idle`: the sleeping and blocked functions are (almost) never on a CPU.
fn check_plain_run(name: &str, w: &Workload, plain: &Recording) {
    let sleep_fn = w.files.label_prefix("sleep_part");
    let blocked_fn = w.files.label_prefix("blocked_wait");
    let all = plain.of_pid(w.pid);
    let n = total(&all);
    let off = count_where(&all, |s| {
        s.frames
            .iter()
            .any(|f| f.starts_with(&sleep_fn) || f.starts_with(&blocked_fn))
    });
    assert!(n > 0, "plain run without samples: {}", plain.stderr);
    assert!(
        pct(off, n) <= OFF_CPU_WITHOUT_IDLE_PCT,
        "without --idle the sleeping/blocked functions have {off} of {n} samples ({:.2} %, at \
         most {OFF_CPU_WITHOUT_IDLE_PCT} %) ({name}):\n{}",
        pct(off, n),
        show(&all, 12)
    );
    assert!(
        all.iter()
            .all(|s| !s.frames.iter().any(|f| f.starts_with("[off-CPU"))),
        "state frames in a run without --idle:\n{}",
        show(&all, 12)
    );
}

/// `report --sort state` of a rows' `{overhead, samples}` as (key → overhead %, samples).
fn report_rows(file: &Path, args: &[&str]) -> (BTreeMap<String, (f64, u64)>, u64) {
    let mut a = vec!["report", file.to_str().unwrap(), "--json"];
    a.extend_from_slice(args);
    let o = run(&mut pyebpf(&a));
    assert!(o.status.success(), "report {a:?}: {}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let sort: Vec<String> = v["meta"]["sort"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let key: Vec<String> = sort
                .iter()
                .map(|k| match &r["keys"][k] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            (
                key.join("|"),
                (
                    r["overhead"].as_f64().unwrap(),
                    r["samples"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    (rows, v["total"].as_u64().unwrap())
}

/// Acceptance 3: the saved `--idle` run's `report --sort state` sums to 100 % (and to its
/// samples), and its on-CPU function shares equal the plain run's within noise.
fn saved_state_report(
    saved: &Path,
    plain: &Path,
    w: &Workload,
    rec: &Recording,
    plain_rec: &Recording,
) {
    let (rows, total) = report_rows(saved, &["--sort", "state"]);
    let sum: f64 = rows.values().map(|r| r.0).sum();
    let samples: u64 = rows.values().map(|r| r.1).sum();
    assert!(
        (sum - 100.0).abs() < 0.01 && samples == total,
        "report --sort state of the --idle run: {sum} % over {samples} samples of {total}: \
         {rows:?}"
    );
    assert_eq!(
        total,
        total_of(rec, w.pid),
        "the saved run and its folded stacks count the same samples"
    );
    for state in rows.keys() {
        assert!(
            ["on-cpu", "runnable", "sleeping", "blocked", "gil-wait"].contains(&state.as_str()),
            "unknown state row {state}"
        );
    }
    assert!(rows.contains_key("sleeping"), "no sleeping row: {rows:?}");
    // Function shares among the on-CPU samples with a frame: a sample whose capture found
    // no frame (`[unknown]`, seen on 3.14 in both kinds of run) is not a function.
    let on_cpu = |file: &Path, filter: bool| {
        let mut args = vec!["--sort", "function"];
        if filter {
            args.extend(["--state", "on-cpu"]);
        }
        let mut rows = report_rows(file, &args).0;
        rows.remove("[.] [unknown]");
        let with_frames: u64 = rows.values().map(|r| r.1).sum();
        rows.into_iter()
            .map(|(k, (_, c))| (k, (pct(c, with_frames), c)))
            .collect::<BTreeMap<_, _>>()
    };
    let (idle_on, plain_on) = (on_cpu(saved, true), on_cpu(plain, false));
    let spin = "[.] spin_part";
    eprintln!(
        "on-CPU share of spin_part: --idle --state on-cpu {:.1} %, plain {:.1} %",
        idle_on.get(spin).map_or(0.0, |r| r.0),
        plain_on.get(spin).map_or(0.0, |r| r.0)
    );
    let (n_idle, n_plain) = (
        idle_on.values().map(|r| r.1).sum::<u64>() as f64,
        plain_on.values().map(|r| r.1).sum::<u64>() as f64,
    );
    assert!(
        n_idle >= 30.0 && n_plain >= 30.0,
        "too few on-CPU samples to compare: {n_idle} and {n_plain}"
    );
    for (func, (share, _)) in idle_on.iter().chain(plain_on.iter()) {
        if *share < 5.0 {
            continue;
        }
        let in_idle = idle_on.get(func).map_or(0.0, |r| r.0);
        let in_plain = plain_on.get(func).map_or(0.0, |r| r.0);
        let p = (in_idle + in_plain) / 200.0;
        let noise =
            ON_CPU_SHARE_SIGMAS * 100.0 * (p * (1.0 - p) * (1.0 / n_idle + 1.0 / n_plain)).sqrt()
                + 1.0;
        assert!(
            (in_idle - in_plain).abs() <= noise,
            "on-CPU share of {func}: {in_idle:.1} % of {n_idle} in the --idle run, {in_plain:.1} \
             % of {n_plain} in the plain run (at most {noise:.1} pp apart):\nidle: \
             {idle_on:?}\nplain: {plain_on:?}\n{}",
            plain_rec.stderr
        );
    }
}

fn total_of(rec: &Recording, pid: u32) -> u64 {
    total(&rec.of_pid(pid))
}

#[test]
fn idle_wall_clock_3_12() {
    idle_wall_clock("3.12", &[]);
}

#[test]
fn idle_wall_clock_3_13t() {
    idle_wall_clock("3.13t", &[("PYTHON_GIL", "0")]);
}

#[test]
fn idle_wall_clock_3_14() {
    idle_wall_clock("3.14", &[]);
}

fn gil_wait(name: &str) {
    let Some(interp) = setup(name) else {
        return;
    };
    let (w, stats) = start_with_stats(&interp, "rec_gilwait.py", &[]);
    let dir = OutDir::new(&format!("gilwait-{name}"));
    let before = read_stats(&stats);
    let (rec, saved) = record_both(&["--idle"], &w, &dir, "gil");
    let after = read_stats(&stats);
    let wall = after["monotonic"].as_f64().unwrap() - before["monotonic"].as_f64().unwrap();
    for (thread, function) in [("contend-a", "contend_a"), ("contend-b", "contend_b")] {
        let tid = w.tid(thread);
        let cpu = f(&after, thread, "cpu_s") - f(&before, thread, "cpu_s");
        let runq = f(&after, thread, "runqueue_s") - f(&before, thread, "runqueue_s");
        let truth = (wall - cpu - runq).max(0.0) * 100.0 / wall;
        // The GIL-contention view: gil-wait rows by function, of this thread's samples.
        let tid_s = tid.to_string();
        let (rows, _) = report_rows(&saved, &["--sort", "state,function", "--tid", &tid_s]);
        let thread_total: u64 = rows.values().map(|r| r.1).sum();
        let waited = rows
            .get(&format!("gil-wait|[.] {function}"))
            .map_or(0, |r| r.1);
        let got = pct(waited, thread_total);
        eprintln!(
            "{name} {thread}: GIL wait {got:.1} % of {thread_total} samples; schedstat: wall \
             {wall:.2} s, CPU {cpu:.2} s, run queue {runq:.2} s → {truth:.1} %"
        );
        let samples = rec.of_thread(w.pid, tid);
        assert!(
            (got - truth).abs() <= GIL_WAIT_PP,
            "{name} {thread}: GIL-wait share of {function} {got:.1} % ({waited} of \
             {thread_total}) vs \
             {truth:.1} % from schedstat (wall {wall:.2} s, CPU {cpu:.2} s, run queue \
             {runq:.2} s): more than {GIL_WAIT_PP} pp apart; rows {rows:?}\n{}\n{}",
            show(&samples, 12),
            rec.stderr
        );
        assert!(
            got > 10.0,
            "{name} {thread}: two threads contending for one GIL wait for it only {got:.1} % of \
             the time ({rows:?})"
        );
    }
}

#[test]
fn gil_wait_3_12() {
    gil_wait("3.12");
}

#[test]
fn gil_wait_3_9() {
    gil_wait("3.9");
}

/// The off-CPU programs work on this kernel, in each variant it runs (timing-free: the kernel
/// matrix runs it under emulation): a cycler's `sleep_part` shows with the state frame the
/// kernel captured at its switch-out (`clock_nanosleep`: the system call read from its saved
/// registers), the thread blocked since before the run shows only with a state frame, and
/// the summary counts intervals sent and none lost.
#[test]
fn idle_off_cpu_stacks_each_variant_3_12() {
    let Some(interp) = setup("3.12") else {
        return;
    };
    let (w, _) = start_with_stats(&interp, "rec_idle.py", &[]);
    let dir = OutDir::new("idle-variants");
    let pid = w.pid.to_string();
    let sleep_fn = w.files.label_prefix("sleep_part");
    let mut variants = vec![None];
    for run_no in 0..2 {
        let Some(variant) = variants.get(run_no).cloned() else {
            break;
        };
        let env: Vec<(&str, &str)> = variant
            .as_deref()
            .map(|v| vec![("PYEBPF_SAMPLE_VARIANT", v)])
            .unwrap_or_default();
        let rec = record(
            &["--idle", "-t", "-p", &pid, "-d", "3", "-f", "collapsed"],
            &dir.join(&format!("run{run_no}.txt")),
            &env,
        );
        let line = rec
            .stderr_lines("pyebpf: off-CPU (--idle): ")
            .first()
            .map_or_else(
                || panic!("no off-CPU line:\n{}", rec.stderr),
                |l| (*l).to_string(),
            );
        let sent: u64 = line
            .split(" intervals sent")
            .next()
            .and_then(|s| s.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(sent > 0, "no interval sent ({variant:?}): {line}");
        assert!(line.contains(", 0 lost,"), "{line}");
        let cycler = rec.of_thread(w.pid, w.tid("cycler-1"));
        let captured = count_where(&cycler, |s| {
            s.frames.iter().any(|f| f.starts_with(&sleep_fn))
                && s.frames.last().unwrap() == "[off-CPU: sleeping in clock_nanosleep]"
        });
        assert!(
            captured > 0,
            "{variant:?}: no sleep_part stack ending in its captured state:\n{}\n{}",
            show(&cycler, 12),
            rec.stderr
        );
        let blocked = rec.of_thread(w.pid, w.tid("blocked"));
        assert!(total(&blocked) > 0, "blocked thread without samples");
        assert_eq!(
            count_where(&blocked, |s| s
                .frames
                .last()
                .unwrap()
                .starts_with("[off-CPU: ")),
            total(&blocked),
            "{}",
            show(&blocked, 8)
        );
        if run_no == 0 && line.contains("variant bpf_loop") {
            variants.push(Some("bounded".to_string()));
        }
    }
}

/// `record --all --idle`: the threads of Python processes are followed off a CPU (the
/// workload's blocked thread, asleep since before the run, included), no other process is:
/// every process with an off-CPU stack is one the run attached to as Python.
#[test]
fn all_idle_follows_python_processes_only_3_12() {
    let Some(interp) = setup("3.12") else {
        return;
    };
    let (w, _) = start_with_stats(&interp, "rec_idle.py", &[]);
    let dir = OutDir::new("idle-all");
    let rec = record(
        &["--all", "--idle", "-t", "-d", "4", "-f", "collapsed"],
        &dir.join("all.txt"),
        &[],
    );
    let blocked = rec.of_thread(w.pid, w.tid("blocked"));
    assert!(
        total(&blocked) > 0
            && count_where(&blocked, |s| s
                .frames
                .last()
                .unwrap()
                .starts_with("[off-CPU: "))
                == total(&blocked),
        "the blocked thread under --all --idle:\n{}\n{}",
        show(&blocked, 8),
        rec.stderr
    );
    let root_pid = |s: &super::support::Sample| -> Option<u32> {
        let r = &s.frames[0];
        r.rsplit_once(" (")?.1.strip_suffix(')')?.parse().ok()
    };
    // The Python processes the run attached to: one summary line each (`pyebpf: python comm
    // (pid) 3.12: …`).
    let python: std::collections::BTreeSet<u32> = rec
        .stderr_lines("pyebpf: python ")
        .iter()
        .filter_map(|l| l.split_once(") ")?.0.rsplit_once(" (")?.1.parse().ok())
        .collect();
    let off_cpu: std::collections::BTreeSet<u32> = rec
        .samples
        .iter()
        .filter(|s| s.frames.last().unwrap().starts_with("[off-CPU: "))
        .filter_map(root_pid)
        .collect();
    let strays: Vec<&u32> = off_cpu.difference(&python).collect();
    assert!(
        strays.is_empty(),
        "off-CPU samples of processes not attached as Python: {strays:?}\n{}",
        rec.stderr
    );
    assert!(off_cpu.contains(&w.pid));
    let line = rec.stderr_lines("pyebpf: off-CPU (--idle): ");
    assert!(
        line.len() == 1 && line[0].contains(" 0 not followed (map full)"),
        "{}",
        rec.stderr
    );
}
