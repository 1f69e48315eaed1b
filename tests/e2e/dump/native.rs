//! `pyebpf dump --native` on live processes (issue 12): each thread stopped alone, its native
//! frames merged exactly with its Python frames, the pause reported.
//!
//! - Python → C → Python (`sorted(key=pykey)`, `tests/workloads/py/rec_native.py`): the outer
//!   Python frames, native frames naming the sort, then `pykey`, in that order, merged (two
//!   eval-loop activations) in every dump; on 3.8, 3.10 and 3.11 (one activation per frame or
//!   per `is_entry` frame), 3.12 (shared, symbols), 3.13t, and Debian's static 3.11, 3.14 and
//!   3.15 (stripped, the eval loop split into `.cold`, debug files in the root).
//! - Two named threads at depth ≥ 5 (`two_threads.py`): the Python frames of the merged stacks
//!   are exactly those of a plain dump and of CPython's own view; every thread's root is native.
//! - `--json` reports each thread's pause and their maximum and sum; the text says it too.
//! - A process that exits while it is being dumped: one line, exit 1, never a panic.

use std::time::Duration;

use serde_json::Value;

use super::support::{Frame, Launch, Workload, dump_json_with, frames, setup, thread};
use crate::common::{pyebpf, run, text};

/// The Python frames of a merged thread, and the index in the merged list of each.
fn python_frames(t: &Value) -> Vec<(usize, Frame)> {
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, f)| f["kind"] == "python")
        .map(|(i, f)| (i, Frame::from_json(f)))
        .collect()
}

/// Checks the pause figures of a `--native` dump.
#[track_caller]
fn check_pauses(what: &str, dump: &Value) {
    let n = &dump["native"];
    let threads = dump["threads"].as_array().unwrap();
    let pauses: Vec<u64> = threads
        .iter()
        .map(|t| {
            t["native"]["pause_us"]
                .as_u64()
                .unwrap_or_else(|| panic!("{what}: no pause for {}", t["name"]))
        })
        .collect();
    assert_eq!(
        n["threads_stopped"].as_u64(),
        Some(threads.len() as u64),
        "{what}: {n}"
    );
    assert_eq!(
        n["pause_us_max"].as_u64(),
        pauses.iter().max().copied(),
        "{what}: {n}"
    );
    assert_eq!(
        n["pause_us_total"].as_u64(),
        Some(pauses.iter().sum()),
        "{what}: {n}"
    );
    assert!(pauses.iter().all(|p| *p > 0), "{what}: {pauses:?}");
    eprintln!("{what}: pauses {pauses:?} µs");
}

#[allow(
    clippy::many_single_char_names,
    reason = "w(orkload), t(hread), m(iddle), k(ey): one sample at a time"
)]
fn sorted_key(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "rec_native.py",
        "rec_native.py",
        &[],
        &[],
        Launch::Plain,
    );
    let outer = w.frame("outer", "call_middle", "def_outer");
    let middle = w.frame("middle", "call_sorted", "def_middle");
    let mut in_key = 0;
    for i in 0..5 {
        let dump = dump_json_with(w.pid, &["--native"]);
        check_pauses(&format!("{name} dump {i}"), &dump);
        let t = thread(&dump, "sorter");
        let what = format!("{name} dump {i}: sorter {:#}", t["frames"]);
        assert_eq!(t["native"]["merge"], "merged", "{what}");
        let py = python_frames(t);
        let all = t["frames"].as_array().unwrap();
        // Innermost first: [pykey], middle, outer, then Thread.run and the bootstrap frames.
        let m = py
            .iter()
            .position(|(_, f)| *f == middle)
            .unwrap_or_else(|| panic!("{what}"));
        assert_eq!(py[m + 1].1, outer, "{what}");
        if m == 1 {
            in_key += 1;
            let (k, key) = &py[0];
            assert_eq!(key.function, "pykey", "{what}");
            // Between `pykey` and `middle`: native frames only, one of them the sort.
            let between = &all[k + 1..py[1].0];
            assert!(
                !between.is_empty() && between.iter().all(|f| f["kind"] == "native"),
                "{what}"
            );
            assert!(
                between.iter().any(|f| {
                    let n = f["function"].as_str().unwrap();
                    n.contains("sort") || n.contains("sorted")
                }),
                "{what}: no native frame names the sort"
            );
        } else {
            assert_eq!(m, 0, "{what}");
        }
        assert_eq!(all.last().unwrap()["kind"], "native", "{what}");
    }
    assert!(
        in_key >= 3,
        "{name}: only {in_key}/5 dumps caught the sorter in pykey"
    );
}

#[test]
fn sorted_key_3_8() {
    sorted_key("3.8");
}

#[test]
fn sorted_key_3_10() {
    sorted_key("3.10");
}

#[test]
fn sorted_key_3_11() {
    sorted_key("3.11");
}

#[test]
fn sorted_key_3_11_debian_static() {
    sorted_key("3.11-debian");
}

#[test]
fn sorted_key_3_12() {
    sorted_key("3.12");
}

#[test]
fn sorted_key_3_13t() {
    sorted_key("3.13t");
}

#[test]
fn sorted_key_3_14_static_stripped() {
    sorted_key("3.14");
}

#[test]
fn sorted_key_3_15_static_stripped() {
    sorted_key("3.15");
}

fn two_threads(name: &str) {
    two_threads_as(name, Launch::Plain);
}

fn two_threads_as(name: &str, launch: Launch) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "two_threads.py",
        "two_threads.py",
        &[],
        &[],
        launch,
    );
    let plain = dump_json_with(w.pid, &[]);
    let native = dump_json_with(w.pid, &["--native"]);
    check_pauses(name, &native);
    for tname in ["spin-func", "spin-method"] {
        let t = thread(&native, tname);
        assert_eq!(t["native"]["merge"], "merged", "{name} {tname}: {t:#}");
        let py: Vec<Frame> = python_frames(t).into_iter().map(|(_, f)| f).collect();
        assert_eq!(py, frames(thread(&plain, tname)), "{name} {tname}");
        let (_, _, cpython) = w.thread(tname);
        assert_eq!(py, cpython, "{name} {tname}: CPython's own view");
        let all = t["frames"].as_array().unwrap();
        assert_eq!(all.last().unwrap()["kind"], "native", "{name} {tname}");
        for f in all.iter().filter(|f| f["kind"] == "native") {
            assert!(f["address"].as_u64().is_some_and(|a| a > 0), "{f}");
            assert!(f["module"].is_string(), "{f}");
        }
    }
    let out = run(&mut pyebpf(&["dump", "-p", &w.pid.to_string(), "--native"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    let header = t.lines().nth(1).unwrap_or_default();
    assert!(
        header.starts_with("Native stacks: 3 threads stopped one at a time, ")
            && header.ends_with(" µs in all"),
        "{t}"
    );
    let spin = w.frame("func_leaf", "func_spin", "def_func_leaf").text();
    assert!(t.contains(&format!("    {spin}\n")), "{t}");
}

#[test]
fn two_threads_3_9() {
    two_threads("3.9");
}

#[test]
fn two_threads_3_11() {
    two_threads("3.11");
}

#[test]
fn two_threads_3_12() {
    two_threads("3.12");
}

#[test]
fn two_threads_3_13() {
    two_threads("3.13");
}

#[test]
fn two_threads_3_13t() {
    two_threads("3.13t");
}

#[test]
fn two_threads_3_14() {
    two_threads("3.14");
}

#[test]
fn two_threads_3_15() {
    two_threads("3.15");
}

/// In its own pid and mount namespace (`pivot_root` into the sid root): threads are stopped by
/// their host ids, files are opened through the process's root.
#[test]
fn two_threads_3_14_container() {
    two_threads_as("3.14", Launch::PivotRoot);
}

/// Processes that exit while `dump --native` runs: whatever the moment, one line on stderr
/// and exit 1 (or a complete dump, exit 0), never a panic or a stopped process left behind.
#[test]
fn process_exiting_during_the_dump() {
    let Some(interp) = setup("3.12") else { return };
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for i in 0..20 {
        let script = "import threading, time\n\
                      def spin():\n    while True: pass\n\
                      for _ in range(4): threading.Thread(target=spin, daemon=True).start()\n\
                      time.sleep(0.3)\n";
        let mut child = interp.command(&["-c", script]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(150 + 8 * i));
        let pid = child.id();
        let out = run(&mut pyebpf(&[
            "dump",
            "-p",
            &pid.to_string(),
            "--native",
            "--json",
        ]));
        let stderr = text(&out.stderr);
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).expect("a complete dump");
            assert_eq!(v["pid"], pid);
            *outcomes.entry("complete".into()).or_default() += 1;
        } else {
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
            assert!(out.stdout.is_empty(), "half a dump: {}", text(&out.stdout));
            let kind = if stderr.contains("exited during the dump") {
                "exited during the dump"
            } else if stderr.contains("is gone") {
                "gone"
            } else {
                stderr.trim_end()
            };
            *outcomes.entry(kind.to_owned()).or_default() += 1;
        }
        let status = child.wait().unwrap();
        // The process ran to its end: never left stopped or killed by the dump.
        assert!(status.success(), "{status}");
    }
    eprintln!("outcomes: {outcomes:?}");
    for kind in outcomes.keys() {
        assert!(
            ["complete", "exited during the dump", "gone"].contains(&kind.as_str()),
            "unexpected error line: {kind}"
        );
    }
}
