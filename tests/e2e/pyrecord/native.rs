//! Acceptance 4: `--native` on 3.12 and on Debian's 3.14 (static, stripped, `.cold` split):
//! Python → C → Python (`sorted(DATA, key=pykey)` called from `middle`) → merged stacks show the
//! outer Python frames, then native frames, then `pykey`, in that order; merge mismatches under
//! 1 % of samples.

use super::support::{
    Launch, OutDir, Recording, Sample, Workload, is_py_frame, record, setup, show, show_frames,
    total,
};

/// The marker the merge puts between the two halves of an unmergeable sample.
const MISMATCH_MARKER: &str = "[merge mismatch]";

/// Fewest samples of the sorting thread in 3 s that we accept.
const MIN_SAMPLES: u64 = 30;

/// How a sample of the sorting thread looks after the merge.
#[derive(Debug, PartialEq, Eq)]
enum Shape {
    /// Not in `pykey` (sorting itself, or between calls).
    NotInKey,
    /// Outer Python frames, ≥ 1 native frame, `pykey`; `sort_named`: a native frame between
    /// names the sort (`builtin_sorted`, `list_sort_impl`, …).
    Good { sort_named: bool },
    /// In `pykey`, but not in that shape: why.
    Bad(String),
}

/// Classifies one sample (frames after `comm (pid);name (tid)`).
fn shape(frames: &[String], outer_py: &[String], pykey: &str) -> Shape {
    let Some(k) = frames.iter().position(|f| f.starts_with(pykey)) else {
        return Shape::NotInKey;
    };
    if frames.iter().any(|f| f == MISMATCH_MARKER) {
        return Shape::Bad(format!(
            "merge mismatch: the native frames, then `{MISMATCH_MARKER}`, then the Python frames"
        ));
    }
    let py: Vec<&String> = frames[..k].iter().filter(|f| is_py_frame(f)).collect();
    if py.len() != outer_py.len() || py.iter().zip(outer_py).any(|(g, e)| *g != e) {
        return Shape::Bad(format!(
            "the Python frames above pykey are {py:?}, expected {outer_py:?}"
        ));
    }
    let m = frames[..k]
        .iter()
        .rposition(|f| is_py_frame(f))
        .expect("outer Python frames are not empty");
    let between = &frames[m + 1..k];
    if between.is_empty() {
        return Shape::Bad(format!("no native frame between {} and pykey", frames[m]));
    }
    Shape::Good {
        sort_named: between.iter().any(|f| f.to_lowercase().contains("sort")),
    }
}

/// `--native` merge of Python → C → Python on interpreter `name`. `symbols`: its binary has a
/// symbol table, so the C frames between must name the sort.
fn native_merge(name: &str, symbols: bool, launch: Launch) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start_as(&interp, "rec_native.py", &[], &[], launch);
    let name = &format!("{name} ({launch:?} launch)");
    if launch == Launch::HideDebugFiles {
        let debug = format!("/proc/{}/root/usr/lib/debug", w.pid);
        let seen: Vec<_> = std::fs::read_dir(&debug)
            .unwrap_or_else(|e| panic!("{debug}: {e}"))
            .collect();
        assert!(seen.is_empty(), "{debug} is not hidden: {seen:?}");
    }
    let tid = w.tid("sorter");
    let pykey = w.files.label_prefix("pykey");
    // The dump catches the sorter in pykey most of the time, else in the sort itself (middle
    // innermost): the outer frames are those down to middle either way.
    let dumped = w.dump_stack(tid);
    let middle = w.label("middle", "call_sorted");
    let m = dumped.iter().position(|f| *f == middle);
    assert!(
        m.is_some_and(|m| m >= 1
            && dumped[m - 1] == w.label("outer", "call_middle")
            && dumped[m + 1..].iter().all(|f| f.starts_with(&pykey))
            && dumped.len() <= m + 2),
        "{name}: dump of the sorter is not outer → middle [→ pykey] (a dump bug, or the workload \
         moved):\n{}",
        show_frames(&dumped)
    );
    let outer_py = &dumped[..=m.unwrap()];
    let dir = OutDir::new(&format!("native-{}-{launch:?}", interp.name));
    let pid = w.pid.to_string();
    let rec = record(
        &["-p", &pid, "-t", "--native", "-f", "collapsed", "-d", "3"],
        &dir.join("native.txt"),
        &[],
    );
    let mine = rec.of_thread(w.pid, tid);
    let n = total(&mine);
    assert!(
        n >= MIN_SAMPLES,
        "{name} --native: only {n} samples of the sorter (tid {tid}) ({})\nsamples of the pid:\n{}",
        rec.what,
        show(&rec.of_pid(w.pid), 20)
    );
    let shapes: Vec<(&Sample, Shape)> = mine
        .iter()
        .map(|s| (*s, shape(&s.frames[2..], outer_py, &pykey)))
        .collect();
    let in_key: u64 = shapes
        .iter()
        .filter(|(_, sh)| *sh != Shape::NotInKey)
        .map(|(s, _)| s.count)
        .sum();
    let good: u64 = shapes
        .iter()
        .filter(|(_, sh)| matches!(sh, Shape::Good { .. }))
        .map(|(s, _)| s.count)
        .sum();
    let named: u64 = shapes
        .iter()
        .filter(|(_, sh)| matches!(sh, Shape::Good { sort_named: true }))
        .map(|(s, _)| s.count)
        .sum();
    eprintln!(
        "{name} --native: sorter {n} samples, {in_key} in pykey, {good} merged in order, {named} naming the sort"
    );
    let bad: Vec<String> = shapes
        .iter()
        .filter_map(|(s, sh)| match sh {
            Shape::Bad(why) => Some(format!("  {} {}\n    → {why}", s.frames.join(";"), s.count)),
            _ => None,
        })
        .take(8)
        .collect();
    // The workload spends nearly all its time in pykey: a sample without pykey is mostly one
    // whose Python frames went missing.
    assert!(
        in_key * 100 >= n * 80,
        "{name} --native: only {in_key}/{n} samples of the sorter show pykey ({})\n\
         expected Python frames, outermost first:\n{}  then native frames, then {pykey}…)\n\
         samples:\n{}",
        rec.what,
        show_frames(outer_py),
        show(&mine, 15)
    );
    assert!(
        good * 100 >= in_key * 95,
        "{name} --native: only {good}/{in_key} samples in pykey show the outer Python frames, \
         native frames, then pykey, in order ({})\nexpected Python frames, outermost first:\n{}\
         wrong samples:\n{}\n{}\n{}",
        rec.what,
        show_frames(outer_py),
        bad.join("\n"),
        rec.stderr_lines("errors:").join("\n"),
        rec.py_summary(w.pid)
            .unwrap_or("(no per-process summary line)")
    );
    if symbols {
        assert!(
            named * 100 >= good * 90,
            "{name} --native: only {named}/{good} merged samples name the sort (builtin_sorted, \
             list_sort_impl…) between middle and pykey:\n{}",
            show(&mine, 10)
        );
    }
    check_mismatches(name, &rec, w.pid);
}

/// Merge mismatches are under 1 % of the pid's samples, both as counted in the output (samples
/// with the marker) and as reported in the per-process summary.
#[track_caller]
fn check_mismatches(name: &str, rec: &Recording, pid: u32) {
    let all = rec.of_pid(pid);
    let n = total(&all);
    let marked: Vec<&Sample> = all
        .iter()
        .copied()
        .filter(|s| s.frames.iter().any(|f| f == MISMATCH_MARKER))
        .collect();
    let mismatched = total(&marked);
    assert!(
        mismatched * 100 < n,
        "{name} --native: {mismatched}/{n} samples carry `{MISMATCH_MARKER}` (want < 1 %) ({})\n\
         {}\nmismatched samples:\n{}",
        rec.what,
        rec.stderr,
        show(&marked, 10)
    );
    let line = rec.py_summary(pid).unwrap_or_else(|| {
        panic!(
            "{name} --native: no per-process summary line for pid {pid}:\n{}",
            rec.stderr
        )
    });
    let reported = rec.py_summary_count(pid, " merge mismatches");
    let samples = rec.py_summary_count(pid, " samples,");
    assert!(
        matches!((reported, samples), (Some(m), Some(s)) if s > 0 && m * 100 < s),
        "{name} --native: the summary reports {reported:?} merge mismatches of {samples:?} \
         samples (want < 1 %): {line}"
    );
}

#[test]
fn native_merge_python_c_python_3_12() {
    native_merge("3.12", true, Launch::Plain);
}

/// Debian's 3.14 in the sid root, whose `python3.14-dbg` debug file is installed there: the C
/// frames are named from that file (found by build-id in the target's root, not the host's).
#[test]
fn native_merge_python_c_python_3_14_static_stripped() {
    native_merge("3.14", true, Launch::Plain);
}

/// Debian's 3.15 (frame pointers, also stripped with a `.cold` split), debug file installed.
#[test]
fn native_merge_python_c_python_3_15_static_stripped() {
    native_merge("3.15", true, Launch::Plain);
}

/// Debian's 3.14 as most hosts have it: stripped, and no `-dbg` package — no symbol names the
/// `.cold` part where its bytecode handlers run (docs/cpython-layouts.md §9). The merge must still
/// recognise the eval loop there (issue 4: "in stripped binaries too").
#[test]
fn native_merge_python_c_python_3_14_stripped_without_debug_file() {
    native_merge("3.14", false, Launch::HideDebugFiles);
}

// CPython 3.8–3.11 (issue 10): every Python frame is its own eval-loop call up to 3.10; 3.11
// marks the first frame of each call `is_entry`.
#[test]
fn native_merge_python_c_python_3_8() {
    native_merge("3.8", true, Launch::Plain);
}

#[test]
fn native_merge_python_c_python_3_9() {
    native_merge("3.9", true, Launch::Plain);
}

#[test]
fn native_merge_python_c_python_3_10() {
    native_merge("3.10", true, Launch::Plain);
}

#[test]
fn native_merge_python_c_python_3_11() {
    native_merge("3.11", true, Launch::Plain);
}

/// Debian 12's own `/usr/bin/python3.11`: static, non-PIE, stripped (its `python3.11-dbg` debug file installed).
#[test]
fn native_merge_python_c_python_3_11_debian_static() {
    native_merge("3.11-debian", true, Launch::Plain);
}

/// Debian 11's python3.9 in a debootstrapped bullseye root (its own libraries, run chrooted).
#[test]
fn native_merge_python_c_python_3_9_bullseye_root() {
    native_merge("3.9-bullseye", true, Launch::Plain);
}
