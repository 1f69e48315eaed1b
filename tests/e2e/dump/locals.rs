//! `pyebpf dump --locals` on real interpreters (issue 12, acceptance 1): a thread stopped in a
//! closure below its enclosing function (`tests/workloads/py/locals.py`), with arguments
//! (positional, keyword-only, `*args`, `**kwargs`), locals of every value kind (None, bools,
//! small and big ints, floats incl. `inf`/`nan`/`-0.0`, str of every kind incl. a lone surrogate
//! and non-printable characters, bytes, nested and long containers, other objects, a value longer
//! than 256 characters), cells and free variables, an unbound local, and non-ASCII names of
//! string kinds 2 and 4. Every value must equal what the workload computed itself with `repr()`
//! (containers: the documented first-8-items, 2-levels rule over `repr()` of their items).

use serde_json::Value;

use super::support::{Launch, Workload, dump_json_with, setup, thread};
use crate::common::{pyebpf, run, text};

/// (name, is argument, value) of one dumped frame, sorted by name.
fn dumped(frame: &Value) -> Vec<(String, bool, String)> {
    let mut v: Vec<(String, bool, String)> = frame["locals"]
        .as_array()
        .unwrap_or_else(|| panic!("frame without locals: {frame}"))
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                l["arg"].as_bool().unwrap(),
                l["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

/// The workload's own record of a frame, in the same shape.
fn recorded(w: &Workload, frame: &str) -> Vec<(String, bool, String)> {
    let rec = w.ready["locals"][frame]
        .as_object()
        .unwrap_or_else(|| panic!("ready file has no locals of {frame}: {}", w.ready));
    let mut v: Vec<(String, bool, String)> = rec
        .iter()
        .map(|(name, r)| {
            (
                name.clone(),
                r[0].as_bool().unwrap(),
                r[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

#[track_caller]
fn assert_locals(what: &str, got: &[(String, bool, String)], want: &[(String, bool, String)]) {
    let missing: Vec<_> = want.iter().filter(|x| !got.contains(x)).collect();
    let extra: Vec<_> = got.iter().filter(|x| !want.contains(x)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: locals differ from the workload's own repr()\n expected but not dumped: \
         {missing:#?}\n dumped but not expected: {extra:#?}"
    );
}

fn locals(name: &str) {
    let Some(interp) = setup(name) else { return };
    let w = Workload::start(&interp, "locals.py", "locals.py", &[], &[], Launch::Plain);
    let dump = dump_json_with(w.pid, &["--locals"]);
    let t = thread(&dump, "locals-thread");
    let frames = t["frames"].as_array().unwrap();
    // `outer.<locals>.inner` from 3.11 (co_qualname); `inner` before: as CPython names it.
    let (_, _, cpython) = w.thread("locals-thread");
    assert_eq!(frames[0]["function"], cpython[0].function.as_str(), "{t}");
    assert!(cpython[0].function.ends_with("inner"), "{cpython:?}");
    assert_eq!(frames[1]["function"], "outer", "{t}");
    let inner = dumped(&frames[0]);
    let outer = dumped(&frames[1]);
    assert_locals(&format!("{name}: inner"), &inner, &recorded(&w, "inner"));
    assert_locals(&format!("{name}: outer"), &outer, &recorded(&w, "outer"));
    // A few values spelled out, so that a workload bug cannot make both sides agree on nonsense.
    let value = |n: &str| {
        outer
            .iter()
            .find(|l| l.0 == n)
            .unwrap_or_else(|| panic!("{name}: no local {n}: {outer:?}"))
            .2
            .clone()
    };
    assert_eq!(
        value("big"),
        "1606938044258990275541962092341162602522202993782792835313721"
    );
    assert_eq!(value("surrogate"), "'\\ud800x'");
    assert_eq!(value("never"), "<unbound>");
    assert_eq!(value("huge"), "1e+16");
    assert_eq!(value("число"), "42");
    assert_eq!(value("𠀀"), "'astral name'");
    assert!(
        value("g").starts_with("<Gadget object at 0x"),
        "{}",
        value("g")
    );
    assert_eq!(value("long_text").chars().count(), 256);
    assert!(
        outer.iter().any(|l| l.0 == "rest" && l.1),
        "*args is an argument"
    );
    // Every frame of every thread has a locals list (the main thread's too).
    for th in dump["threads"].as_array().unwrap() {
        for f in th["frames"].as_array().unwrap() {
            assert!(f["locals"].is_array(), "{name}: frame without locals: {f}");
        }
    }
    // Text: the values under their frame, arguments first.
    let out = run(&mut pyebpf(&["dump", "-p", &w.pid.to_string(), "--locals"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = String::from_utf8(out.stdout).unwrap();
    let at = out
        .find("    outer (")
        .unwrap_or_else(|| panic!("{name}: no outer frame in\n{out}"));
    let section = &out[at..];
    let args = section.find("        Arguments:").unwrap();
    let locs = section.find("        Locals:").unwrap();
    assert!(args < locs, "{section}");
    assert!(
        section[args..locs].contains("            число = 42\n"),
        "{section}"
    );
    assert!(
        section[locs..].contains("            кириллица = 'Привет, мир'\n"),
        "{section}"
    );
    // A shorter cap applies to every value.
    let short = dump_json_with(w.pid, &["--locals", "--locals-max-len", "12"]);
    let t = thread(&short, "locals-thread");
    for l in t["frames"][1]["locals"].as_array().unwrap() {
        assert!(
            l["value"].as_str().unwrap().chars().count() <= 12,
            "{name}: {l} is longer than --locals-max-len 12"
        );
    }
}

#[test]
fn locals_3_8() {
    locals("3.8");
}

#[test]
fn locals_3_9() {
    locals("3.9");
}

#[test]
fn locals_3_9_bullseye() {
    locals("3.9-bullseye");
}

#[test]
fn locals_3_10() {
    locals("3.10");
}

#[test]
fn locals_3_11() {
    locals("3.11");
}

#[test]
fn locals_3_11_debian() {
    locals("3.11-debian");
}

#[test]
fn locals_3_12() {
    locals("3.12");
}

#[test]
fn locals_3_13() {
    locals("3.13");
}

#[test]
fn locals_3_13t() {
    locals("3.13t");
}

#[test]
fn locals_3_13t_static() {
    locals("3.13t-static");
}

#[test]
fn locals_3_14() {
    locals("3.14");
}

#[test]
fn locals_3_15() {
    locals("3.15");
}
