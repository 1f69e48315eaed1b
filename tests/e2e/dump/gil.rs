//! Acceptance 7: GIL state per thread. On GIL builds a thread spinning in Python holds the GIL
//! (in most dumps: the reads race with GIL switches) and a thread blocked in C with the GIL released
//! never does; on 3.13t with the GIL disabled every thread is "no_gil"; with `PYTHON_GIL=1` the
//! spinning thread holds it. The text header of each thread (`Thread TID (NAME) [STATE]`) says
//! the same: `[holds GIL]`/`[waiting]` on GIL builds, `[active]` (attached, running Python) or
//! `[no GIL]` (detached) without one.

use serde_json::Value;

use super::support::{Launch, Workload, dump_json, dump_text, setup, thread};

/// Dumps per GIL test; the spinning thread must hold the GIL in a strict majority of them.
const GIL_DUMPS: usize = 7;

fn gil_of(dump: &Value, name: &str) -> String {
    thread(dump, name)["gil"].as_str().unwrap().to_string()
}

/// The bracketed state of thread `name`'s header in a text dump of `pid`.
fn text_state(pid: u32, name: &str) -> String {
    let out = dump_text(pid);
    let header = out
        .lines()
        .find(|l| l.starts_with("Thread ") && l.contains(&format!(" ({name}) [")))
        .unwrap_or_else(|| panic!("no header of thread {name}:\n{out}"));
    let (_, state) = header
        .rsplit_once(" [")
        .unwrap_or_else(|| panic!("{header:?}"));
    state
        .strip_suffix(']')
        .unwrap_or_else(|| panic!("{header:?}"))
        .to_string()
}

/// A GIL build (or 3.13t with `PYTHON_GIL=1`): spinner mostly "holds", blocked always
/// "does_not_hold", nothing "no_gil"/"unknown".
fn gil_holder(name: &str, env: &[(&str, &str)]) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(&interp, "gil.py", "gil.py", &[], env, Launch::Plain);
    assert_eq!(
        w.ready["gil_enabled"], true,
        "{name} {env:?}: the workload runs without a GIL"
    );
    let mut holds = 0;
    let mut seen = Vec::new();
    for _ in 0..GIL_DUMPS {
        let dump = dump_json(w.pid);
        assert_eq!(
            dump["python"]["gil_enabled"], true,
            "python: {}",
            dump["python"]
        );
        assert_eq!(
            dump["python"]["free_threaded"], interp.free_threaded,
            "python: {}",
            dump["python"]
        );
        let spinner = gil_of(&dump, "spinner");
        let blocked = gil_of(&dump, "blocked");
        assert_eq!(
            blocked,
            "does_not_hold",
            "{name}: thread blocked in Event.wait: {}",
            thread(&dump, "blocked")
        );
        assert!(
            spinner == "holds" || spinner == "does_not_hold",
            "{name}: spinning thread: gil {spinner:?} on a build with the GIL enabled"
        );
        let holders: Vec<&str> = dump["threads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["gil"] == "holds")
            .map(|t| t["name"].as_str().unwrap_or("<null>"))
            .collect();
        assert!(
            holders.len() <= 1,
            "{name}: several GIL holders {holders:?}"
        );
        holds += usize::from(spinner == "holds");
        seen.push(spinner);
    }
    assert!(
        holds * 2 > GIL_DUMPS,
        "{name}: the spinning thread held the GIL in {holds}/{GIL_DUMPS} dumps: {seen:?}"
    );
    let mut texts = Vec::new();
    for _ in 0..GIL_DUMPS {
        assert_eq!(
            text_state(w.pid, "blocked"),
            "waiting",
            "{name}: text header"
        );
        texts.push(text_state(w.pid, "spinner"));
    }
    assert!(
        texts.iter().all(|s| s == "holds GIL" || s == "waiting"),
        "{name}: spinner headers {texts:?}"
    );
    assert!(
        texts.iter().filter(|s| *s == "holds GIL").count() * 2 > GIL_DUMPS,
        "{name}: the spinner's header said [holds GIL] in too few text dumps: {texts:?}"
    );
}

#[test]
fn gil_holder_3_12() {
    gil_holder("3.12", &[]);
}

#[test]
fn gil_holder_3_13() {
    gil_holder("3.13", &[]);
}

#[test]
fn gil_holder_3_14() {
    gil_holder("3.14", &[]);
}

#[test]
fn gil_holder_3_15() {
    gil_holder("3.15", &[]);
}

#[test]
fn gil_holder_3_13t_gil_enabled() {
    gil_holder("3.13t", &[("PYTHON_GIL", "1")]);
}

/// 3.13t with the GIL disabled: "no_gil" for every thread, `gil_enabled: false`.
fn gil_disabled(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(
        &interp,
        "gil.py",
        "gil.py",
        &[],
        &[("PYTHON_GIL", "0")],
        Launch::Plain,
    );
    assert_eq!(
        w.ready["gil_enabled"], false,
        "{name} with PYTHON_GIL=0 runs with a GIL"
    );
    for _ in 0..3 {
        let dump = dump_json(w.pid);
        assert_eq!(
            dump["python"]["gil_enabled"], false,
            "python: {}",
            dump["python"]
        );
        assert_eq!(
            dump["python"]["free_threaded"], true,
            "python: {}",
            dump["python"]
        );
        for t in dump["threads"].as_array().unwrap() {
            assert_eq!(
                t["gil"], "no_gil",
                "thread {} of {name} without GIL",
                t["name"]
            );
        }
    }
    // Blocked in `Event.wait`: detached. Spinning: attached in (nearly) every read.
    let mut spinner = Vec::new();
    for _ in 0..GIL_DUMPS {
        assert_eq!(
            text_state(w.pid, "blocked"),
            "no GIL",
            "{name}: text header"
        );
        spinner.push(text_state(w.pid, "spinner"));
    }
    assert!(
        spinner.iter().all(|s| s == "active" || s == "no GIL"),
        "{name}: spinner headers {spinner:?}"
    );
    assert!(
        spinner.iter().filter(|s| *s == "active").count() * 2 > GIL_DUMPS,
        "{name}: the spinner's header said [active] in too few text dumps: {spinner:?}"
    );
}

#[test]
fn gil_disabled_3_13t() {
    gil_disabled("3.13t");
}

#[test]
fn gil_disabled_3_13t_static() {
    gil_disabled("3.13t-static");
}

// CPython 3.8–3.11 (issue 10): the GIL is `_PyRuntime.ceval.gil`, one per process.
#[test]
fn gil_holder_3_8() {
    gil_holder("3.8", &[]);
}

#[test]
fn gil_holder_3_9() {
    gil_holder("3.9", &[]);
}

#[test]
fn gil_holder_3_10() {
    gil_holder("3.10", &[]);
}

#[test]
fn gil_holder_3_11() {
    gil_holder("3.11", &[]);
}

/// Debian 12's own `/usr/bin/python3.11`: static, non-PIE, stripped (its `python3.11-dbg` debug file installed).
#[test]
fn gil_holder_3_11_debian_static() {
    gil_holder("3.11-debian", &[]);
}

/// Debian 11's python3.9 in a debootstrapped bullseye root (its own libraries, run chrooted).
#[test]
fn gil_holder_3_9_bullseye_root() {
    gil_holder("3.9-bullseye", &[]);
}
