//! Acceptance 2: `record --all -d 5` with 3.12, 3.13t and 3.14 (sid root) workloads running at
//! once → one flame graph with all three processes and their correct Python stacks; a Python
//! process started 1 s after the run begins is included with named frames; a Python process that
//! lives ~200 ms and exits during the run keeps named frames.

use std::fmt::Write as _;
use std::time::Duration;

use super::support::{
    Installed, OutDir, Recording, Workload, comm, count_where, finish, is_py_frame, record_command,
    record_spawn, setup, show, show_frames, total, wait_sampling,
};
use crate::common::{Interpreter, run, text};

/// The thread of `rec_spin.py` that spins.
const SPINNER: &str = "spinner";

/// Fewest samples of a spinning process in the 5 s run (five busy processes on two cores, on a
/// machine that may be busy with other tests).
const MIN_SAMPLES: u64 = 10;

/// The three interpreters running at once.
const AT_ONCE: [&str; 3] = ["3.12", "3.13t", "3.14"];

/// A spinning workload and its stack as CPython showed it (outermost first).
struct Spinner {
    w: Workload,
    expected: Vec<String>,
}

impl Spinner {
    fn start(interp: &Interpreter) -> Spinner {
        let w = Workload::start(interp, "rec_spin.py", &[], &[]);
        let expected = spinner_stack(&w);
        Spinner { w, expected }
    }
}

/// The spinner thread's own stack (its ready file), checked to end in `spin_outer` → `spin` at
/// its lines.
fn spinner_stack(w: &Workload) -> Vec<String> {
    let expected = w.own_stack(SPINNER);
    let tail = [w.label("spin_outer", "call_spin"), w.label("spin", "spin")];
    assert!(
        expected.ends_with(&tail),
        "{}: the spinner's own stack does not end in spin_outer → spin (a workload bug):\n{}",
        w.interp,
        show_frames(&expected)
    );
    expected
}

/// Checks that `pid` is in the recording, that its root is `comm (pid)`, and that ≥ 90 % of its
/// samples are exactly `comm (pid)` then the thread's own stack (no `--threads` level).
#[track_caller]
fn check_spinner(rec: &Recording, what: &str, pid: u32, root: &str, expected: &[String]) {
    let mine = rec.of_pid(pid);
    let n = total(&mine);
    assert!(
        n >= MIN_SAMPLES,
        "{what} (pid {pid}): only {n} samples under `--all`, want ≥ {MIN_SAMPLES} ({})\nprocesses \
         seen:\n{}",
        rec.what,
        roots(rec)
    );
    let rooted = count_where(&mine, |s| s.frames[0] == root);
    assert_eq!(
        rooted,
        n,
        "{what}: root of pid {pid} is not `{root}`:\n{}",
        show(&mine, 10)
    );
    let exact = count_where(&mine, |s| s.frames[1..] == *expected);
    let bare = count_where(&mine, |s| s.frames.len() == 1);
    let wrong = n - exact - bare;
    eprintln!(
        "{what} (pid {pid}): {exact}/{n} samples are its exact Python stack, {bare} have no \
         frame under the root, {wrong} other"
    );
    assert!(
        exact * 100 >= n * 90,
        "{what} (pid {pid}): only {exact}/{n} samples under `{root}` are its Python stack; {bare} \
         have no frame at all under the root (no Python frames: the process was not yet known to \
         the kernel walk?), {wrong} have other frames ({})\nexpected, outermost first:\n{}\
         samples:\n{}summary: {}\nstderr:\n{}",
        rec.what,
        show_frames(expected),
        show(&mine, 15),
        rec.py_summary(pid)
            .unwrap_or("(no per-process summary line)"),
        rec.stderr
    );
}

/// The distinct roots of a recording with their counts, for messages.
fn roots(rec: &Recording) -> String {
    let mut by_root = std::collections::BTreeMap::<&str, u64>::new();
    for s in &rec.samples {
        *by_root.entry(s.frames[0].as_str()).or_default() += s.count;
    }
    let mut s = String::new();
    for (r, n) in &by_root {
        let _ = writeln!(s, "  {r} {n}");
    }
    s
}

/// Runs `rec_short.py 0.2` (~200 ms of CPU work) to its end; its pid.
fn run_short(interp: &Interpreter, short: &Installed) -> u32 {
    let mut cmd = interp.command(&[short.script.as_str(), "0.2"]);
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "rec_short.py failed: {}",
        text(&out.stderr)
    );
    pid
}

/// How long the late starter spins before the run is stopped: ~200 samples at 99 Hz if it has
/// a CPU; 10 are required (a busy 2-core machine).
const LATE_SPIN: Duration = Duration::from_secs(2);

#[test]
fn all_three_interpreters_late_starter_and_short_lived_process() {
    let Some(interps) = AT_ONCE.iter().map(|n| setup(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let (Some(late_interp), Some(short_interp)) = (setup("3.13"), setup("3.12")) else {
        return;
    };
    let spinners: Vec<Spinner> = interps.iter().map(Spinner::start).collect();
    let short = Installed::new(&short_interp, "rec_short.py");
    let dir = OutDir::new("all");
    let out = dir.join("all.txt");
    // No `-d`: the run is stopped with SIGINT (which writes what was collected) once the late
    // starter has spun for LATE_SPIN, however long its start took (an emulated kernel in the
    // kernel matrix takes seconds to start an interpreter).
    let args = ["--all", "-f", "collapsed"];
    let mut child = record_spawn(&args, &out);
    wait_sampling(&mut child);

    // A Python process started 1 s after the run begins.
    std::thread::sleep(Duration::from_secs(1));
    let mut late = Workload::spawn(&late_interp, "rec_spin.py", &[], &[]);
    // A Python process that does ~200 ms of CPU work and exits, well inside the run.
    std::thread::sleep(Duration::from_millis(500));
    let short_pid = run_short(&short_interp, &short);

    late.wait_ready();
    std::thread::sleep(LATE_SPIN);
    // SAFETY: signals our own child, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let rec = finish(&o, &args, &out);
    let late_expected = spinner_stack(&late);

    // All three tallies first, so a failure message's neighbours are on stderr too.
    for (sp, interp) in spinners.iter().zip(&interps) {
        let mine = rec.of_pid(sp.w.pid);
        eprintln!(
            "--all: {} (pid {}): {} samples, {} its exact stack, {} without any frame under the root",
            interp.name,
            sp.w.pid,
            total(&mine),
            count_where(&mine, |s| s.frames[1..] == *sp.expected),
            count_where(&mine, |s| s.frames.len() == 1)
        );
    }
    for (sp, interp) in spinners.iter().zip(&interps) {
        let root = format!("{} ({})", comm(sp.w.pid), sp.w.pid);
        check_spinner(
            &rec,
            &format!("--all: {}", interp.name),
            sp.w.pid,
            &root,
            &sp.expected,
        );
    }

    // The late starter: included, with its spinning function named at the right line.
    let late_samples = rec.of_pid(late.pid);
    let late_named = count_where(&late_samples, |s| s.frames[1..] == *late_expected);
    eprintln!(
        "--all: late starter pid {}: {late_named}/{} samples with its named stack",
        late.pid,
        total(&late_samples)
    );
    assert!(
        late_named >= 10,
        "--all: the Python process started 1 s into the run (3.13, pid {}) has only {late_named} \
         samples with its named stack ({} samples in all) ({})\nexpected, outermost first:\n{}\
         its samples:\n{}processes seen:\n{}stderr:\n{}",
        late.pid,
        total(&late_samples),
        rec.what,
        show_frames(&late_expected),
        show(&late_samples, 15),
        roots(&rec),
        rec.stderr
    );

    // The short-lived process: its samples keep named Python frames after it exited.
    let short_samples = rec.of_pid(short_pid);
    let n = total(&short_samples);
    let with_py = count_where(&short_samples, |s| s.frames.iter().any(|f| is_py_frame(f)));
    let burn_stack = [
        short.label("<module>", "call_main"),
        short.label("main", "call_burn"),
        short.label("burn", "burn"),
    ];
    let burning = count_where(&short_samples, |s| s.frames[1..] == burn_stack);
    eprintln!(
        "--all: short-lived pid {short_pid}: {n} samples, {with_py} with Python frames, {burning} in burn"
    );
    // Its frames are named (user space reads them within a fast flush after the sample, long
    // before the process exits; a 100 ms flush left such processes with only `[unknown python
    // frame]`s), and it is seen in `burn`. Not a share of `burn`: under an emulated kernel the
    // interpreter's start-up takes most of the process's life.
    let unknown = count_where(&short_samples, |s| {
        s.frames.iter().any(|f| f == "[unknown python frame]")
    });
    eprintln!("--all: short-lived pid {short_pid}: {unknown} samples with an unresolved frame");
    assert!(
        n >= 3 && burning >= 3 && with_py * 2 >= n && unknown * 10 <= with_py,
        "--all: the ~200 ms Python process (3.12, pid {short_pid}) lost its Python frames: {n} \
         samples, {with_py} with Python frames, {unknown} of them with an unresolved frame, \
         {burning} exactly <module> → main → burn ({})\n\
         its samples:\n{}summary: {}\nstderr:\n{}",
        rec.what,
        show(&short_samples, 15),
        rec.py_summary(short_pid)
            .unwrap_or("(no per-process summary line)"),
        rec.stderr
    );
    let lost = rec.stderr_lines("lost samples:");
    assert!(!lost.is_empty(), "no lost-sample line:\n{}", rec.stderr);
}

/// The same three interpreters, `--all` as an SVG flame graph: well-formed, with the three roots
/// and each one's spinning frame.
#[test]
fn all_three_interpreters_svg_flame_graph() {
    let Some(interps) = AT_ONCE.iter().map(|n| setup(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let spinners: Vec<Spinner> = interps.iter().map(Spinner::start).collect();
    let dir = OutDir::new("all-svg");
    let out = dir.join("all.svg");
    let o = run(&mut record_command(&["--all", "-d", "5"], &out, &[]));
    assert!(
        o.status.success(),
        "record --all -o all.svg failed: {}",
        text(&o.stderr)
    );
    let svg = std::fs::read_to_string(&out).unwrap();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, opts)
        .unwrap_or_else(|e| panic!("SVG is not well-formed XML: {e}"));
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    let has = |label: &str| {
        let with_counts = format!("{label} (");
        titles
            .iter()
            .any(|t| *t == label || t.starts_with(&with_counts))
    };
    for (sp, interp) in spinners.iter().zip(&interps) {
        let root = format!("{} ({})", comm(sp.w.pid), sp.w.pid);
        let spin = sp.w.label("spin", "spin");
        let shown: Vec<&&str> = titles.iter().filter(|t| t.contains(&root)).collect();
        assert!(
            has(&root) && has(&spin),
            "SVG of record --all: {} root `{root}` present: {}, spinning frame `{spin}` present: \
             {}\ntitles naming the root: {shown:?}\n{} titles in all",
            interp.name,
            has(&root),
            has(&spin),
            titles.len()
        );
    }
}

/// Issue 10: Debian 11's 3.9 (bullseye root), Debian 12's static 3.11, 3.12 and 3.13t spinning
/// at once under `record --all`: each process's samples carry its own exact stack (four layout
/// families in one run: `PyFrameObject` matched by `pthread_t`, 3.11's `cframe`, 3.12, and
/// free-threaded 3.13).
#[test]
fn all_four_layout_families_at_once() {
    const FAMILIES: [&str; 4] = ["3.9-bullseye", "3.11-debian", "3.12", "3.13t"];
    let Some(interps) = FAMILIES
        .iter()
        .map(|n| setup(n))
        .collect::<Option<Vec<_>>>()
    else {
        return;
    };
    let spinners: Vec<Spinner> = interps.iter().map(Spinner::start).collect();
    let dir = OutDir::new("all-families");
    let out = dir.join("all.txt");
    let args = ["--all", "-f", "collapsed", "-d", "5"];
    let mut child = record_spawn(&args, &out);
    wait_sampling(&mut child);
    let o = child.wait_with_output().unwrap();
    let rec = finish(&o, &args, &out);
    for (sp, interp) in spinners.iter().zip(&interps) {
        let root = format!("{} ({})", comm(sp.w.pid), sp.w.pid);
        check_spinner(
            &rec,
            &format!("--all: {}", interp.name),
            sp.w.pid,
            &root,
            &sp.expected,
        );
    }
}
