//! Live tests against the real interpreters of this machine (3.12, 3.13, 3.13t shared and
//! static, Debian 3.14 and 3.15 in the sid root).
//!
//! The workload runs two named threads at depth ≥ 5 (one in a method), with kind-1/2/4 names and
//! a kind-4 file name, and writes its own ground truth — `sys._current_frames()` with
//! `co_qualname`, `co_filename`, `f_lineno`, plus `threading` names and native ids — while every
//! thread sits at a stable line. The reader must reproduce that truth exactly. GIL tests: one
//! thread spinning in Python and one blocked in C → the spinner holds the GIL; 3.13t → no GIL;
//! `PYTHON_GIL=1` → a holder. The `builder_matches_live_*` tests compare what the synthetic image
//! builder assumes with a live 3.12, 3.13, 3.13t, 3.14 and 3.15.
//! A missing interpreter: under `CI=true` the test fails; otherwise it prints "SKIPPED: …".

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::memory::{ProcessMemory, ReadMemory};
use super::testimage::Flavor;
use super::unicode::StrState;
use super::{GilState, PyError, PyThread, PythonProcess};

/// Live tests spin CPU-bound threads: run them one at a time.
static LIVE: Mutex<()> = Mutex::new(());

const WORKLOAD: &str = r#"# -*- coding: utf-8 -*-
import json, os, sys, threading, time

def truth(path):
    frames = sys._current_frames()
    me = threading.get_ident()
    out = []
    for t in threading.enumerate():
        f = frames.get(t.ident)
        if t.ident == me:
            f = f.f_back
        stack = []
        while f is not None:
            stack.append([f.f_code.co_qualname, f.f_code.co_filename, f.f_lineno])
            f = f.f_back
        out.append({"ident": t.ident, "native_id": t.native_id, "name": t.name, "stack": stack})
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh)
    os.rename(path + ".tmp", path)

class Wörker:
    def данные(self):
        n = 0
        while True: n += 1

class 𠀀Spinner:
    def spin(self):
        n = 0
        while True: n += 1

def café(f): f()
def level2(f): café(f)
def level1(f): level2(f)

def blocked(): time.sleep(1e6)

def park(path): truth(path); time.sleep(1e6)

def main():
    mode, path = sys.argv[1], sys.argv[2]
    a = threading.Thread(target=level1, args=(Wörker().данные,), name="wörker-Привет-🚀-long-name")
    if mode == "gil":
        b = threading.Thread(target=level1, args=(blocked,), name="blocked-in-C")
    else:
        b = threading.Thread(target=level1, args=(𠀀Spinner().spin,), name="spinner-with-a-long-name")
    a.start(); b.start()
    time.sleep(0.5)
    park(path)

main()
"#;

/// An interpreter to run: `python` as it sees itself, under `root` when chrooted.
pub(crate) struct Interp {
    pub name: &'static str,
    pub python: String,
    pub root: Option<PathBuf>,
}

impl Interp {
    /// A command running this interpreter (chrooted when it has a root).
    pub(crate) fn command(&self) -> Command {
        match &self.root {
            Some(r) => {
                let mut c = Command::new("chroot");
                c.arg(r).arg(&self.python);
                c
            }
            None => Command::new(&self.python),
        }
    }
}

const SID: &str = "/var/cache/pyebpf-test/roots/sid";

fn fallback(name: &str) -> Option<(&'static str, Option<&'static str>)> {
    Some(match name {
        "3.12" => ("/root/.pyenv/versions/3.12.1/bin/python3.12", None),
        "3.13" => ("/root/.pyenv/versions/3.13.0/bin/python3.13", None),
        "3.13t" => ("/var/cache/pyebpf-test/pythons/3.13t/bin/python3.13t", None),
        "3.13t-static" => (
            "/var/cache/pyebpf-test/pythons/3.13t-static/bin/python3.13t",
            None,
        ),
        "3.14" => ("/usr/bin/python3.14", Some(SID)),
        "3.15" => ("/usr/bin/python3.15", Some(SID)),
        _ => return None,
    })
}

/// The interpreter `name` from the manifest (`interpreters.json`), else the known paths.
pub(crate) fn interp(name: &'static str) -> Option<Interp> {
    let manifest = std::fs::read_to_string("/var/cache/pyebpf-test/interpreters.json").ok();
    let entry = manifest
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.as_array().cloned())
        .and_then(|list| list.into_iter().find(|e| e["name"] == name));
    let (python, root) = if let Some(e) = entry {
        (
            e["python"].as_str().unwrap_or_default().to_owned(),
            e["root"].as_str().map(PathBuf::from),
        )
    } else {
        let (p, r) = fallback(name)?;
        (p.to_owned(), r.map(PathBuf::from))
    };
    let host = root.as_ref().map_or_else(
        || PathBuf::from(&python),
        |r| r.join(python.trim_start_matches('/')),
    );
    if !host.exists() {
        crate::procs::tests::missing(&format!(
            "interpreter {name} not found at {}",
            host.display()
        ));
        return None;
    }
    Some(Interp { name, python, root })
}

/// A running workload; killed and cleaned up on drop.
struct Running {
    child: Child,
    host_dir: PathBuf,
    /// [{ident, native_id, name, stack: [[qualname, file, line]]}]
    truth: Vec<Value>,
    file: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.host_dir);
    }
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn start(i: &Interp, mode: &str, env: &[(&str, &str)]) -> Running {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let inner_dir = format!("/tmp/pyebpf-live-{}-{n}", std::process::id());
    let host_dir = i.root.as_ref().map_or_else(
        || PathBuf::from(&inner_dir),
        |r| r.join(inner_dir.trim_start_matches('/')),
    );
    std::fs::create_dir_all(&host_dir).unwrap();
    let file = format!("{inner_dir}/w_пример_🚀.py");
    std::fs::write(host_dir.join("w_пример_🚀.py"), WORKLOAD).unwrap();
    let truth_inner = format!("{inner_dir}/truth.json");
    let mut cmd = match &i.root {
        Some(r) => {
            let mut c = Command::new("chroot");
            c.arg(r).arg(&i.python);
            c
        }
        None => Command::new(&i.python),
    };
    cmd.args([file.as_str(), mode, truth_inner.as_str()])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let child = cmd.spawn().unwrap_or_else(|e| panic!("{}: {e}", i.name));
    let mut run = Running {
        child,
        host_dir: host_dir.clone(),
        truth: Vec::new(),
        file,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let truth_host = host_dir.join("truth.json");
    while !truth_host.exists() {
        assert!(
            Instant::now() < deadline,
            "{}: the workload did not get ready",
            i.name
        );
        if let Ok(Some(status)) = run.child.try_wait() {
            panic!("{}: the workload exited: {status}", i.name);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    run.truth = serde_json::from_str::<Value>(&std::fs::read_to_string(truth_host).unwrap())
        .unwrap()
        .as_array()
        .cloned()
        .unwrap();
    run
}

fn frames_of(t: &PyThread) -> Vec<(String, String, i64)> {
    t.frames
        .iter()
        .map(|f| (f.function.clone(), f.file.clone(), i64::from(f.line)))
        .collect()
}

fn truth_frames(v: &Value) -> Vec<(String, String, i64)> {
    v["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f[0].as_str().unwrap().to_owned(),
                f[1].as_str().unwrap().to_owned(),
                f[2].as_i64().unwrap(),
            )
        })
        .collect()
}

/// Differences between a snapshot and the workload's own truth (empty = equal).
fn diff(threads: &[PyThread], truth: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    if threads.len() != truth.len() {
        out.push(format!(
            "{} threads read, {} in the truth",
            threads.len(),
            truth.len()
        ));
    }
    for t in truth {
        let ident = t["ident"].as_u64().unwrap();
        let Some(r) = threads.iter().find(|r| r.python_thread_id == ident) else {
            out.push(format!("thread {ident} missing"));
            continue;
        };
        if frames_of(r) != truth_frames(t) {
            out.push(format!(
                "thread {}: read {:#?}\nexpected {:#?}",
                t["name"],
                frames_of(r),
                truth_frames(t)
            ));
        }
        if r.name.as_deref() != t["name"].as_str() {
            out.push(format!("name {:?} != {}", r.name, t["name"]));
        }
        let native = t["native_id"].as_u64().unwrap();
        if r.native_thread_id != native || r.host_tid != u32::try_from(native).ok() || r.truncated {
            out.push(format!(
                "thread {}: native {} host {:?} truncated {}",
                t["name"], r.native_thread_id, r.host_tid, r.truncated
            ));
        }
    }
    out
}

/// Attaches and compares with the truth, retrying a few torn snapshots.
fn check_stacks(name: &'static str) {
    let _guard = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(i) = interp(name) else { return };
    let run = start(&i, "spin", &[]);
    let mut p = PythonProcess::attach(run.pid()).unwrap_or_else(|e| panic!("{name}: attach: {e}"));
    assert_eq!(p.version().short(), name.trim_end_matches("-static"));
    let mut last = Vec::new();
    for _ in 0..20 {
        let threads = p.threads().unwrap();
        last = diff(&threads, &run.truth);
        if last.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(last.is_empty(), "{name}: {}", last.join("\n"));
    // `resolve_frame` (the path of frames captured in the kernel) agrees with the walk.
    let (layout, mem) = (p.layout().clone(), ProcessMemory::new(run.pid()));
    for t in p.threads().unwrap() {
        let mut frame = mem
            .read_u64(t.tstate_addr + layout.tstate.current_frame)
            .unwrap();
        if let Some(off) = layout.tstate.cframe_current_frame {
            frame = mem.read_u64(frame + off).unwrap();
        }
        let instr = mem.read_u64(frame + layout.frame.instr_ptr).unwrap();
        let tlbc = layout
            .frame
            .tlbc_index
            .map_or(0, |o| mem.read_i32(frame + o).unwrap());
        let top = &t.frames[0];
        let r = p.resolve_frame(top.code_addr, instr, tlbc).unwrap();
        assert_eq!(
            (&r.function, &r.file, r.line, r.first_line),
            (&top.function, &top.file, top.line, top.first_line),
            "{name}"
        );
    }
    // The file name is kind 4 (emoji): it must come back intact.
    let worker = run
        .truth
        .iter()
        .find(|t| t["name"].as_str().unwrap().starts_with("wörker"))
        .unwrap();
    assert_eq!(
        truth_frames(worker)[0],
        (
            "Wörker.данные".to_owned(),
            run.file.clone(),
            truth_frames(worker)[0].2
        )
    );
    eprintln!(
        "{name}: {} threads match; error counts {:?}",
        run.truth.len(),
        p.error_counts()
    );
}

#[test]
fn live_stacks_312() {
    check_stacks("3.12");
}

#[test]
fn live_stacks_313() {
    check_stacks("3.13");
}

#[test]
fn live_stacks_313t() {
    check_stacks("3.13t");
}

#[test]
fn live_stacks_313t_static() {
    check_stacks("3.13t-static");
}

#[test]
fn live_stacks_314() {
    check_stacks("3.14");
}

#[test]
fn live_stacks_315() {
    check_stacks("3.15");
}

/// One thread spins in Python, one sleeps in C, main sleeps in C: `expect(spinner, others)`.
fn check_gil(name: &'static str, env: &[(&str, &str)], spinner: GilState, others: GilState) {
    let _guard = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(i) = interp(name) else { return };
    let run = start(&i, "gil", env);
    let mut p = PythonProcess::attach(run.pid()).unwrap();
    let spin_ident = run
        .truth
        .iter()
        .find(|t| t["name"].as_str().unwrap().starts_with("wörker"))
        .unwrap()["ident"]
        .as_u64()
        .unwrap();
    let mut ok = 0;
    let mut seen = Vec::new();
    for _ in 0..20 {
        let threads = p.threads().unwrap();
        let verdict: Vec<(u64, GilState)> = threads
            .iter()
            .map(|t| (t.python_thread_id, t.gil))
            .collect();
        if verdict
            .iter()
            .all(|&(id, g)| g == if id == spin_ident { spinner } else { others })
        {
            ok += 1;
        }
        seen.push(verdict);
        std::thread::sleep(Duration::from_millis(20));
    }
    // The holder's `last_holder`/`locked` words are read while it runs: allow a rare torn read.
    assert!(
        ok >= 18,
        "{name} {env:?}: only {ok}/20 snapshots as expected; spinner {spin_ident}: {seen:?}"
    );
}

#[test]
fn live_gil_holder_312() {
    check_gil("3.12", &[], GilState::Holds, GilState::DoesNotHold);
}

#[test]
fn live_gil_holder_313() {
    check_gil("3.13", &[], GilState::Holds, GilState::DoesNotHold);
}

#[test]
fn live_gil_holder_314() {
    check_gil("3.14", &[], GilState::Holds, GilState::DoesNotHold);
}

#[test]
fn live_gil_holder_315() {
    check_gil("3.15", &[], GilState::Holds, GilState::DoesNotHold);
}

#[test]
fn live_no_gil_313t() {
    check_gil("3.13t", &[], GilState::NoGil, GilState::NoGil);
}

#[test]
fn live_gil_forced_313t() {
    check_gil(
        "3.13t",
        &[("PYTHON_GIL", "1")],
        GilState::Holds,
        GilState::DoesNotHold,
    );
}

/// Frames: owner at `interpreter_frame.owner` (0 for the top frame); somewhere below, an entry
/// frame with owner 3 whose executable is None (tagged where stackrefs exist; on 3.12 a code
/// object, the interpreter trampoline); ordinary frames' executables carry the tag the builder
/// gives them. `Some(problem)` when not.
fn frame_facts(
    mem: &ProcessMemory,
    layout: &super::RuntimeLayout,
    tstate: u64,
    (none, code_type): (Option<u64>, Option<u64>),
) -> Option<String> {
    let v312 = (layout.version.major, layout.version.minor) == (3, 12);
    let mut frame = mem.read_u64(tstate + layout.tstate.current_frame).unwrap();
    if let Some(off) = layout.tstate.cframe_current_frame {
        // 3.11, 3.12: the thread state points at its `_PyCFrame`, which holds the frame.
        frame = mem.read_u64(frame + off).unwrap();
    }
    let none = none.unwrap_or(0);
    let (mut owners, mut entry_ok, mut tags) = (Vec::new(), false, Vec::new());
    for _ in 0..64 {
        if frame == 0 {
            break;
        }
        let owner = mem
            .read_vec(frame + layout.frame.owner.unwrap(), 1)
            .unwrap()[0];
        let exec = mem.read_u64(frame + layout.frame.executable).unwrap();
        owners.push(owner);
        if owner == 3 && v312 {
            entry_ok |=
                code_type.is_some() && mem.read_u64(exec + layout.object.ob_type).ok() == code_type;
        } else if owner == 3 {
            entry_ok |= exec & !layout.frame.stackref_tag_mask == none
                && (exec & 3) == u64::from(layout.frame.stackref_tag_mask != 0);
        } else {
            tags.push(exec & 3);
        }
        frame = mem.read_u64(frame + layout.frame.previous).unwrap();
    }
    let expected_tag =
        u64::from(layout.frame.stackref_tag_mask != 0 && layout.version.free_threaded);
    (owners.first() != Some(&0) || !entry_ok || tags.iter().any(|&t| t != expected_tag)).then(|| {
        format!("frames: owners {owners:?}, entry frame with None: {entry_ok}, executable tags {tags:?} (builder: {expected_tag})")
    })
}

/// What the image builder assumes, checked against a live process of `name` (`flavor`).
fn builder_matches_live(name: &'static str, flavor: Flavor) {
    let _guard = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(interpreter) = interp(name) else {
        return;
    };
    let run = start(&interpreter, "spin", &[]);
    let proc_ = PythonProcess::attach(run.pid()).unwrap();
    let layout = proc_.layout().clone();
    let mut bad = Vec::new();
    // 1. Every debug-offsets value the builder lays out from equals the live one (3.13+; before,
    // the table is pyebpf's built-in one, which both the builder and the reader use).
    let has_debug_offsets = (layout.version.major, layout.version.minor) >= (3, 13);
    for (field, live) in layout.table.iter().filter(|_| has_debug_offsets) {
        let doc = flavor.value(field);
        if doc != *live {
            bad.push(format!("{field}: builder {doc}, live {live}"));
        }
    }
    let mem = ProcessMemory::new(run.pid());
    let det = proc_.detected();
    // 2. Object header: the code object's type is at `pyobject.ob_type` (24 in FT, 8 default).
    let worker = run
        .truth
        .iter()
        .find(|t| t["name"].as_str().unwrap().starts_with("wörker"))
        .unwrap();
    let ident = worker["ident"].as_u64().unwrap();
    let mut p2 = PythonProcess::attach(run.pid()).unwrap();
    let thread = p2
        .threads()
        .unwrap()
        .into_iter()
        .find(|t| t.python_thread_id == ident)
        .unwrap();
    let top = &thread.frames[0];
    let ob_type = mem.read_u64(top.code_addr + layout.object.ob_type).unwrap();
    if Some(ob_type) != det.pycode_type_addr {
        bad.push(format!(
            "ob_type of a live code object at +{} is {ob_type:#x}",
            layout.object.ob_type
        ));
    }
    if layout.object.header_size == 32
        && Some(mem.read_u64(top.code_addr + 8).unwrap()) == det.pycode_type_addr
    {
        bad.push("FT header: the type is at +8 as in a 16-byte header".into());
    }
    // 3. Unicode state bits of known strings (interned/static bits masked off).
    let uni = &layout.unicode;
    let mask = (7 << uni.kind_shift) | (1 << uni.compact_bit) | (1 << uni.ascii_bit);
    let code_field = |off: u64| mem.read_u64(top.code_addr + off).unwrap();
    for (what, addr, kind, ascii) in [
        (
            "qualname Wörker.данные",
            code_field(layout.code.qualname.unwrap_or(layout.code.name)),
            2,
            false,
        ),
        (
            "file w_пример_🚀.py",
            code_field(layout.code.filename),
            4,
            false,
        ),
    ] {
        let live = mem.read_u32(addr + uni.state).unwrap() & mask;
        let built = StrState {
            kind,
            compact: true,
            ascii,
        }
        .encode(&layout);
        if live != built {
            bad.push(format!("{what}: live state {live:#x}, builder {built:#x}"));
        }
    }
    if let Some(problem) = frame_facts(
        &mem,
        &layout,
        thread.tstate_addr,
        (det.none_addr, det.pycode_type_addr),
    ) {
        bad.push(problem);
    }
    assert!(
        bad.is_empty(),
        "{name}: the image builder is not faithful:\n{}",
        bad.join("\n")
    );
}

/// 3.12 has no debug offsets: its table is the built-in one, which `live_stacks_312` checks
/// against the live reader; here the builder's object header, string states and frames.
#[test]
fn builder_matches_live_312() {
    builder_matches_live("3.12", Flavor::V312);
}

#[test]
fn builder_matches_live_313t() {
    builder_matches_live("3.13t", Flavor::V313T);
}

#[test]
fn builder_matches_live_314() {
    builder_matches_live("3.14", Flavor::V314);
}

#[test]
fn builder_matches_live_313_and_315() {
    builder_matches_live("3.13", Flavor::V313);
    builder_matches_live("3.15", Flavor::V315);
}

/// Dumps, for many real code objects (stdlib modules compiled from source, plus generated code
/// whose lines jump backwards and far), the line table, `co_firstlineno` and the line of every
/// code unit according to the interpreter's own `co_positions()`.
const LINES_SCRIPT: &str = r#"
import ast, importlib, json, sys
out = []
def walk(c):
    out.append([c.co_linetable.hex(), c.co_firstlineno, [-1 if p[0] is None else p[0] for p in c.co_positions()]])
    for k in c.co_consts:
        if hasattr(k, "co_linetable"):
            walk(k)
for m in ["argparse", "typing", "inspect", "subprocess", "logging", "threading", "json.decoder", "dataclasses", "enum", "asyncio.base_events"]:
    mod = importlib.import_module(m)
    with open(mod.__file__, encoding="utf-8") as fh:
        walk(compile(fh.read(), mod.__file__, "exec"))
src = "def f(n):\n" + "".join(f"    v{i} = n + {i}\n" for i in range(40)) + "    return n\n"
tree = ast.parse(src)
for i, stmt in enumerate(tree.body[0].body):
    line = [100000, 3, 70000, 2, 5000][i % 5] - i
    for node in ast.walk(stmt):
        if hasattr(node, "lineno"):
            node.lineno = node.end_lineno = line
walk(compile(tree, "<generated>", "exec"))
json.dump(out, sys.stdout)
"#;

fn check_line_tables(name: &'static str) {
    let Some(i) = interp(name) else { return };
    let mut cmd = match &i.root {
        Some(r) => {
            let mut c = Command::new("chroot");
            c.arg(r).arg(&i.python);
            c
        }
        None => Command::new(&i.python),
    };
    let out = cmd.args(["-c", LINES_SCRIPT]).output().unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let codes: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let (mut units, mut backwards) = (0usize, 0usize);
    for c in &codes {
        let hex = c[0].as_str().unwrap();
        let table: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|k| u8::from_str_radix(&hex[k..k + 2], 16).unwrap())
            .collect();
        let first = i32::try_from(c[1].as_i64().unwrap()).unwrap();
        let lines = c[2].as_array().unwrap();
        let mut prev = i64::MIN;
        for (unit, want) in lines.iter().enumerate() {
            let want = want.as_i64().unwrap();
            let got = super::linetable::line_at(&table, first, 2 * unit as i64).unwrap();
            assert_eq!(
                i64::from(got),
                want,
                "{name}: unit {unit} of a code object with firstlineno {first}"
            );
            backwards += usize::from(want >= 0 && want < prev);
            prev = prev.max(want);
            units += 1;
        }
    }
    assert!(
        units > 50_000 && backwards > 100,
        "{name}: only {units} units / {backwards} backward steps"
    );
    eprintln!(
        "{name}: {} code objects, {units} code units, {backwards} backward steps: all lines equal",
        codes.len()
    );
}

#[test]
fn line_tables_match_co_positions() {
    for name in ["3.12", "3.13", "3.13t", "3.14", "3.15"] {
        check_line_tables(name);
    }
}

#[test]
fn detection_rejects_non_python_and_gone_processes() {
    let mut sleep = Command::new("sleep").arg("30").spawn().unwrap();
    let e = PythonProcess::attach(sleep.id()).err().unwrap();
    assert!(matches!(e, PyError::NotPython { .. }), "{e}");
    sleep.kill().unwrap();
    sleep.wait().unwrap();
    let e = PythonProcess::attach(sleep.id()).err().unwrap();
    assert!(matches!(e, PyError::ProcessGone { .. }), "{e}");
}

/// Removes the copy even when an assertion fails.
struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn detection_by_content_of_a_renamed_static_copy() {
    let _guard = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some(i) = interp("3.13t-static") else {
        return;
    };
    let dir = Cleanup(PathBuf::from(format!(
        "/tmp/pyebpf-renamed-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&dir.0).unwrap();
    let renamed = dir.0.join("xyz-interp");
    std::fs::copy(&i.python, &renamed).unwrap();
    let copy = Interp {
        name: "3.13t-static",
        python: renamed.to_str().unwrap().to_owned(),
        root: None,
    };
    // The copy cannot find its standard library from its new place.
    let home = Path::new(&i.python)
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let run = start(&copy, "spin", &[("PYTHONHOME", home.as_str())]);
    let mut p = PythonProcess::attach(run.pid()).unwrap();
    assert!(Path::new(&p.detected().path).ends_with("xyz-interp"));
    let threads = p.threads().unwrap();
    assert!(diff(&threads, &run.truth).is_empty());
}
