//! End-to-end tests of `pyebpf dump -p PID [--json]` on real interpreters (issue 3, "Acceptance"):
//! exact stacks of named threads on every provisioned CPython, non-ASCII names of every string
//! kind, line tables with backward deltas and CALL-aligned entries, deep recursion, a target in its
//! own pid and mount namespace, the one-line errors, and the GIL state.
//!
//! Workloads are `tests/workloads/py/*.py`; each writes a ready file once its threads sit on their
//! spinning lines (see `dump/support.rs`). Expected lines come from `# LINE:<tag>` markers in the
//! scripts and, for whole stacks, from CPython's own `sys._current_frames()` in the target.

mod core;
mod errors;
mod gil;
mod locals;
mod native;
mod robustness;
mod support;

use std::os::unix::fs::MetadataExt as _;

use support::{
    Frame, Launch, Workload, check_text, check_worker, dump_json, dump_text, frames, setup, thread,
};

/// How many times each stack test dumps its target; every dump must match.
pub(crate) const DUMPS: usize = 3;

/// The two-thread workload's innermost frames: (thread name, frames), innermost first.
fn two_threads_expected(w: &Workload) -> [(&'static str, Vec<Frame>); 2] {
    [
        (
            "spin-func",
            vec![
                w.frame("func_leaf", "func_spin", "def_func_leaf"),
                w.frame(
                    "func_level3.<locals>.inner",
                    "func_call_leaf",
                    "def_func_inner",
                ),
                w.frame("func_level3", "func_call_inner", "def_func_level3"),
                w.frame("func_level2", "func_call_level3", "def_func_level2"),
                w.frame("func_level1", "func_call_level2", "def_func_level1"),
                w.frame("func_main", "func_call_level1", "def_func_main"),
            ],
        ),
        (
            "spin-method",
            vec![
                w.frame("Worker.spin", "method_spin", "def_method_spin"),
                w.frame("Worker.step3", "method_call_spin", "def_method_step3"),
                w.frame("Worker.step2", "method_call_step3", "def_method_step2"),
                w.frame("Worker.step1", "method_call_step2", "def_method_step1"),
                w.frame("SpinThread.run", "method_call_step1", "def_method_run"),
            ],
        ),
    ]
}

/// Checks the interpreter facts of a dump against what the target says about itself.
#[track_caller]
fn check_python(dump: &serde_json::Value, w: &Workload, free_threaded: bool) {
    let py = &dump["python"];
    assert_eq!(py["version"], w.ready["version"], "python.version: {py}");
    assert_eq!(
        py["free_threaded"], free_threaded,
        "python.free_threaded: {py}"
    );
    assert_eq!(
        py["gil_enabled"], w.ready["gil_enabled"],
        "python.gil_enabled: {py}"
    );
}

/// Acceptance 1: two named threads at depth >= 5, one in methods → exact qualified names, files,
/// lines and thread names, in every one of `DUMPS` dumps, in JSON and text.
fn two_threads(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "two_threads.py",
        "two_threads.py",
        &[],
        &[],
        Launch::Plain,
    );
    let expected = two_threads_expected(&w);
    for _ in 0..DUMPS {
        let dump = dump_json(w.pid);
        check_python(&dump, &w, interp.free_threaded);
        assert_eq!(
            support::thread_names(&dump),
            ["MainThread", "spin-func", "spin-method"],
            "thread names of {name} pid {}",
            w.pid
        );
        for (thread_name, innermost) in &expected {
            check_worker(&dump, &w, thread_name, innermost, true);
        }
        let main = thread(&dump, "MainThread");
        assert_eq!(
            main["tid"].as_u64(),
            Some(u64::from(w.pid)),
            "main thread tid: {main}"
        );
        let main_frames = frames(main);
        let outer = main_frames
            .last()
            .unwrap_or_else(|| panic!("main thread has no frames: {main}"));
        assert_eq!(
            (outer.function.as_str(), outer.file.as_str()),
            ("<module>", w.script.as_str()),
            "{main}"
        );
    }
    let out = dump_text(w.pid);
    for (thread_name, innermost) in &expected {
        check_text(&out, thread_name, innermost);
    }
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
fn two_threads_3_13t_static() {
    two_threads("3.13t-static");
}

#[test]
fn two_threads_3_14() {
    two_threads("3.14");
}

#[test]
fn two_threads_3_15() {
    two_threads("3.15");
}

/// The file name the non-ASCII workload is installed under: 🐍 makes `co_filename` a kind-4 string.
const NON_ASCII_FILE: &str = "тест_🐍.py";

/// Acceptance 2: names of string kinds 1 (`café`), 2 (Cyrillic) and 4 (🐍 in the file name and a
/// thread name) come out as the right UTF-8, in JSON and in text.
fn non_ascii(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "non_ascii.py",
        NON_ASCII_FILE,
        &[],
        &[],
        Launch::Plain,
    );
    assert!(w.script.ends_with(NON_ASCII_FILE));
    let cafe = vec![
        w.frame("café.<locals>.crème", "creme_spin", "def_creme"),
        w.frame("café", "cafe_call_creme", "def_cafe"),
        w.frame("noël", "noel_call_cafe", "def_noel"),
    ];
    let worker = vec![
        w.frame("Рабочий.крутить", "krutit_spin", "def_krutit"),
        w.frame("Рабочий.начать", "nachat_call_krutit", "def_nachat"),
        w.frame("функция", "funktsiya_call_nachat", "def_funktsiya"),
    ];
    let mut snake = worker.clone();
    snake.push(w.frame("змея", "zmeya_call_funktsiya", "def_zmeya"));
    let expected = [
        ("café-thread", cafe),
        ("поток-кириллица", worker),
        ("🐍-змея", snake),
    ];
    for _ in 0..DUMPS {
        let dump = dump_json(w.pid);
        check_python(&dump, &w, interp.free_threaded);
        for (thread_name, innermost) in &expected {
            check_worker(&dump, &w, thread_name, innermost, true);
        }
    }
    let out = dump_text(w.pid);
    for (thread_name, innermost) in &expected {
        check_text(&out, thread_name, innermost);
    }
}

#[test]
fn non_ascii_3_12() {
    non_ascii("3.12");
}

#[test]
fn non_ascii_3_13() {
    non_ascii("3.13");
}

#[test]
fn non_ascii_3_13t() {
    non_ascii("3.13t");
}

#[test]
fn non_ascii_3_13t_static() {
    non_ascii("3.13t-static");
}

#[test]
fn non_ascii_3_14() {
    non_ascii("3.14");
}

#[test]
fn non_ascii_3_15() {
    non_ascii("3.15");
}

/// `split_call`'s frame: at its CALL line from 3.11 (the strict end of a location entry); before
/// 3.11 there is no location table and the line of a multi-line call is what CPython's own
/// `f_lineno` says (the whole stack is compared with CPython's view anyway).
fn split_call_frame(w: &Workload) -> Frame {
    let mut f = w.frame("split_call", "split_call", "def_split_call");
    if support::shown_name(&w.ready, "a.b") == "b" {
        let (_, _, cpython) = w.thread("gen-lines");
        f.line = cpython[2].line;
    }
    f
}

/// Acceptance 3: generated code whose line table goes backwards (compiled with `compile()` from a
/// rewritten AST) and a caller whose CALL starts a new location entry right after an entry of a
/// later line → exact lines for every frame.
fn line_table(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "line_table.py",
        "line_table.py",
        &[],
        &[],
        Launch::Plain,
    );
    let g = &w.ready["generated"];
    let gen_file = g["file"].as_str().unwrap().to_string();
    let num = |k: &str| {
        g[k].as_i64()
            .unwrap_or_else(|| panic!("generated.{k} missing: {g}"))
    };
    assert!(
        num("leaf_spin") < num("leaf_first") && num("mid_call") < num("mid_first"),
        "{g}"
    );
    let expected = vec![
        Frame {
            function: "gen_leaf".into(),
            file: gen_file.clone(),
            line: num("leaf_spin"),
            first_line: num("leaf_def"),
        },
        Frame {
            function: "gen_mid".into(),
            file: gen_file,
            line: num("mid_call"),
            first_line: num("mid_def"),
        },
        split_call_frame(&w),
        w.frame("outer", "outer_call", "def_outer"),
    ];
    assert_eq!(w.line("split_arg"), w.line("split_call") + 1);
    for _ in 0..DUMPS {
        let dump = dump_json(w.pid);
        check_python(&dump, &w, interp.free_threaded);
        check_worker(&dump, &w, "gen-lines", &expected, true);
    }
}

#[test]
fn line_table_3_12() {
    line_table("3.12");
}

#[test]
fn line_table_3_13() {
    line_table("3.13");
}

#[test]
fn line_table_3_13t() {
    line_table("3.13t");
}

#[test]
fn line_table_3_14() {
    line_table("3.14");
}

#[test]
fn line_table_3_15() {
    line_table("3.15");
}

/// Recursion depth of the deep workload (the acceptance list's).
const DEPTH: usize = 3000;
/// A depth beyond any sensible frame cap, so that the truncation path is exercised too.
const DEEPER: usize = 10_000;

/// Acceptance 4: a thread `depth` calls deep → exit 0 and either the whole stack, or a prefix of
/// it marked `"truncated": true` whose text output ends with an explicit truncation marker.
fn deep_recursion(name: &str, depth: usize) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "deep_recursion.py",
        "deep_recursion.py",
        &[&depth.to_string()],
        &[],
        Launch::Plain,
    );
    let (_, _, cpython) = w.thread("deep");
    let mut expected = vec![
        w.frame("bottom", "bottom_spin", "def_bottom"),
        w.frame("rec", "rec_base", "def_rec"),
    ];
    expected.extend(std::iter::repeat_n(
        w.frame("rec", "rec_call", "def_rec"),
        depth,
    ));
    assert_eq!(
        cpython[..expected.len()],
        expected[..],
        "the workload is not as deep as it should be"
    );

    let dump = dump_json(w.pid);
    let t = thread(&dump, "deep");
    let got = frames(t);
    let truncated = t["truncated"].as_bool().unwrap();
    if truncated {
        assert!(
            got.len() < cpython.len(),
            "truncated, yet all {} frames are there",
            got.len()
        );
        assert!(got.len() >= 64, "truncated to only {} frames", got.len());
        support::assert_frames(
            "deep: truncated stack is a prefix",
            &got,
            &cpython[..got.len()],
        );
    } else {
        support::assert_frames("deep: whole stack", &got, &cpython);
    }
    eprintln!(
        "{name}: deep thread: {} frames, truncated {truncated}",
        got.len()
    );

    let out = dump_text(w.pid);
    let lines: Vec<&str> = out.lines().collect();
    let rec_line = w.frame("rec", "rec_call", "def_rec").text();
    let last = lines
        .iter()
        .rposition(|l| l.trim_end().ends_with(&rec_line))
        .unwrap_or_else(|| panic!("text output has no `{rec_line}` line:\n{out}"));
    let rec_lines = lines
        .iter()
        .filter(|l| l.trim_end().ends_with(&rec_line))
        .count();
    if truncated {
        // The line right after the last frame must be a marker: present, not blank, not a frame,
        // and not the header of the only other thread.
        let marker = lines.get(last + 1).copied().unwrap_or_default();
        assert!(
            !marker.trim().is_empty()
                && !support::is_frame_line(marker)
                && !marker.contains("MainThread"),
            "text output: a truncated stack must end with an explicit marker line; after the last \
             frame (line {last}) comes {marker:?}"
        );
        eprintln!("{name}: truncation marker: {marker:?}");
        assert_eq!(
            rec_lines,
            got.len() - 2,
            "text and JSON disagree on the number of frames"
        );
    } else {
        assert_eq!(
            rec_lines, depth,
            "text output: number of `{rec_line}` lines"
        );
    }
}

#[test]
fn deep_recursion_3_12() {
    deep_recursion("3.12", DEPTH);
}

#[test]
fn deeper_recursion_3_12() {
    deep_recursion("3.12", DEEPER);
}

#[test]
fn deep_recursion_3_14() {
    deep_recursion("3.14", DEPTH);
}

#[test]
fn deeper_recursion_3_14() {
    deep_recursion("3.14", DEEPER);
}

/// Acceptance 5: a target in its own pid and mount namespace, `pivot_root`ed into the sid root →
/// files as the target sees them, host tids that exist under /proc/<host pid>/task and map to the
/// namespaced native ids.
fn pivot_root(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "two_threads.py",
        "two_threads.py",
        &[],
        &[],
        Launch::PivotRoot,
    );
    // The setup is what it claims: another root, another pid namespace.
    let root = std::fs::metadata(format!("/proc/{}/root/", w.pid)).unwrap();
    let host_root = std::fs::metadata("/").unwrap();
    assert_ne!(
        (root.dev(), root.ino()),
        (host_root.dev(), host_root.ino()),
        "target's root is the host's /"
    );
    assert_eq!(
        w.ready["pid"], 1,
        "target is not pid 1 of its own pid namespace"
    );

    let expected = two_threads_expected(&w);
    for _ in 0..DUMPS {
        let dump = dump_json(w.pid);
        check_python(&dump, &w, interp.free_threaded);
        for (thread_name, innermost) in &expected {
            check_worker(&dump, &w, thread_name, innermost, false);
            let t = thread(&dump, thread_name);
            let tid = t["tid"]
                .as_u64()
                .unwrap_or_else(|| panic!("{thread_name}: no host tid: {t}"));
            let status = std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", w.pid))
                .unwrap_or_else(|e| {
                    panic!("{thread_name}: host tid {tid} not a task of {}: {e}", w.pid)
                });
            let nspid: Vec<u64> = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .unwrap()
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            assert_eq!(nspid.first(), Some(&tid));
            assert_eq!(
                nspid.last(),
                t["native_thread_id"].as_u64().as_ref(),
                "{thread_name}: NSpid {nspid:?}"
            );
            assert_ne!(
                Some(tid),
                t["native_thread_id"].as_u64(),
                "{thread_name}: tid not translated"
            );
        }
    }
}

#[test]
fn pivot_root_3_14() {
    pivot_root("3.14");
}

#[test]
fn pivot_root_3_15() {
    pivot_root("3.15");
}

// CPython 3.8–3.11 (issue 10): the same checks on every old interpreter the tests provision.
#[test]
fn two_threads_3_8() {
    two_threads("3.8");
}

#[test]
fn two_threads_3_9() {
    two_threads("3.9");
}

#[test]
fn two_threads_3_10() {
    two_threads("3.10");
}

#[test]
fn two_threads_3_11() {
    two_threads("3.11");
}

/// Debian 12's own `/usr/bin/python3.11`: static, non-PIE, stripped (its `python3.11-dbg` debug file installed).
#[test]
fn two_threads_3_11_debian_static() {
    two_threads("3.11-debian");
}

/// Debian 11's python3.9 in a debootstrapped bullseye root (its own libraries, run chrooted).
#[test]
fn two_threads_3_9_bullseye_root() {
    two_threads("3.9-bullseye");
}

#[test]
fn non_ascii_3_8() {
    non_ascii("3.8");
}

#[test]
fn non_ascii_3_9() {
    non_ascii("3.9");
}

#[test]
fn non_ascii_3_10() {
    non_ascii("3.10");
}

#[test]
fn non_ascii_3_11() {
    non_ascii("3.11");
}

/// Debian 12's own `/usr/bin/python3.11`: static, non-PIE, stripped (its `python3.11-dbg` debug file installed).
#[test]
fn non_ascii_3_11_debian_static() {
    non_ascii("3.11-debian");
}

/// Debian 11's python3.9 in a debootstrapped bullseye root (its own libraries, run chrooted).
#[test]
fn non_ascii_3_9_bullseye_root() {
    non_ascii("3.9-bullseye");
}

#[test]
fn line_table_3_8() {
    line_table("3.8");
}

#[test]
fn line_table_3_9() {
    line_table("3.9");
}

#[test]
fn line_table_3_10() {
    line_table("3.10");
}

#[test]
fn line_table_3_11() {
    line_table("3.11");
}

/// Debian 12's own `/usr/bin/python3.11`: static, non-PIE, stripped (its `python3.11-dbg` debug file installed).
#[test]
fn line_table_3_11_debian_static() {
    line_table("3.11-debian");
}

/// Debian 11's python3.9 in a debootstrapped bullseye root (its own libraries, run chrooted).
#[test]
fn line_table_3_9_bullseye_root() {
    line_table("3.9-bullseye");
}
