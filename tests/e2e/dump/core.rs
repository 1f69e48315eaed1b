//! `pyebpf dump --core` on real interpreters (issue 12, acceptance 2): the locals workload is
//! dumped live, then written to a core file — by gdb's `gcore` (the process keeps running, then
//! is killed) and by the kernel (`SIGQUIT` with an unlimited core size; `core_pattern` is used as
//! it is when it names a file in the crashing process's directory, else set for the test and
//! restored) — and `dump --core` must give the same threads, stacks and locals, also gzip-
//! compressed, and with `--native` the same Python frames merged into native stacks. The sid
//! root's 3.14/3.15 run chrooted: their kernel cores name files as the process saw them, so
//! `--root` points at the root. Then the one-line errors: truncated, another architecture, not
//! Python, a mapped file missing under `--root`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::support::{Launch, Workload, dump_json_with, setup, thread};
use crate::common::{Interpreter, pyebpf, run, text};

/// A scratch directory for core files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("pyebpf-e2e-core-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dump ARGS… --json`: exit 0 and JSON.
fn dump_core_json(args: &[&str]) -> Value {
    let mut all = vec!["dump"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run(&mut pyebpf(&all));
    assert!(
        out.status.success(),
        "dump {args:?} failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("dump {args:?}: not JSON ({e}): {}", text(&out.stdout)))
}

/// What must be the same in a live dump and a dump of its core: per thread (by name) its ids and
/// Python frames with their locals. `tid` too (gcore and a kernel core without a pid namespace
/// number threads as the host does), except for a kernel core of a process in its own pid
/// namespace, whose notes number threads as the process saw them.
fn comparable(dump: &Value, with_tid: bool) -> Vec<Value> {
    let mut threads: Vec<Value> = dump["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let frames: Vec<Value> = t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f.get("kind").is_none_or(|k| k == "python"))
                .map(|f| {
                    serde_json::json!({
                        "function": f["function"], "file": f["file"], "line": f["line"],
                        "first_line": f["first_line"], "locals": f["locals"]})
                })
                .collect();
            let tid = if with_tid {
                t["tid"].clone()
            } else {
                Value::Null
            };
            serde_json::json!({"name": t["name"], "tid": tid,
                "native_thread_id": t["native_thread_id"],
                "python_thread_id": t["python_thread_id"], "frames": frames})
        })
        .collect();
    threads.sort_by_key(|t| t["name"].to_string());
    threads
}

/// How much of the locals thread a core holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stacks {
    /// Everything (kernel cores; gcore where thread stacks are readable).
    Complete,
    /// gdb 13's gcore writes zeros for a thread stack whose guard page is a guard region inside
    /// the stack's mapping (glibc 2.42+ `MADV_GUARD_INSTALL`, the sid root's glibc): reading the
    /// mapping through /proc/PID/mem fails and gdb fills it in. Frames kept on that thread's C
    /// stack (3.14+ entry frames) are then lost: the dump must show the frames before them and
    /// say the stack is truncated.
    ThreadStacksZeroed,
    /// Complete, from a process in its own pid namespace: thread ids are the namespace's.
    CompleteNamespaced,
}

/// The locals thread of both dumps must match exactly; the main thread (it sleeps in a loop and
/// may be between two sleeps) by its ids and name.
#[track_caller]
fn assert_same(what: &str, live: &Value, core: &Value, stacks: Stacks) {
    let with_tid = stacks != Stacks::CompleteNamespaced;
    let (a, b) = (comparable(live, with_tid), comparable(core, with_tid));
    assert_eq!(
        a.len(),
        b.len(),
        "{what}: thread count\nlive {a:#?}\ncore {b:#?}"
    );
    for (x, y) in a.iter().zip(&b) {
        if x["name"] == "locals-thread" && stacks != Stacks::ThreadStacksZeroed {
            assert_eq!(x, y, "{what}: the locals thread differs");
            assert_eq!(thread(core, "locals-thread")["truncated"], false, "{what}");
        } else if x["name"] == "locals-thread" {
            // Up to `Thread.run` (whose caller's entry frame is on the C stack), then cut.
            let (fx, fy) = (
                x["frames"].as_array().unwrap(),
                y["frames"].as_array().unwrap(),
            );
            let run = fx
                .iter()
                .position(|f| f["function"] == "Thread.run")
                .unwrap();
            assert_eq!(fy.len(), run + 1, "{what}: frames kept\n{y:#}");
            assert_eq!(fx[..=run], fy[..], "{what}: the frames kept differ");
            assert_eq!(thread(core, "locals-thread")["truncated"], true, "{what}");
        } else {
            for k in ["name", "tid", "native_thread_id", "python_thread_id"] {
                if k == "tid" && !with_tid {
                    continue;
                }
                assert_eq!(x[k], y[k], "{what}: {k} of {}", x["name"]);
            }
        }
    }
}

fn gzip(path: &Path) -> PathBuf {
    let st = Command::new("gzip")
        .arg("-k")
        .arg("-1")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "gzip {}", path.display());
    PathBuf::from(format!("{}.gz", path.display()))
}

/// `--native` on a core: thread `name`'s stack is merged, its Python frames are those of the
/// plain dump, with native frames around them, and its outermost frame is native.
#[track_caller]
fn check_native(what: &str, plain: &Value, native: &Value, name: &str) {
    let t = thread(native, name);
    assert_eq!(t["native"]["merge"], "merged", "{what}: {:#}", t["native"]);
    assert_eq!(
        t["native"]["pause_us"],
        Value::Null,
        "{what}: nothing is stopped"
    );
    let frames = t["frames"].as_array().unwrap();
    let py: Vec<&Value> = frames.iter().filter(|f| f["kind"] == "python").collect();
    let want = thread(plain, name)["frames"].as_array().unwrap();
    assert_eq!(py.len(), want.len(), "{what}: Python frames\n{frames:#?}");
    for (g, w) in py.iter().zip(want) {
        assert_eq!(g["function"], w["function"], "{what}");
        assert_eq!(g["line"], w["line"], "{what}");
    }
    let natives = frames.iter().filter(|f| f["kind"] == "native").count();
    assert!(
        natives >= 3,
        "{what}: only {natives} native frames\n{frames:#?}"
    );
    assert_eq!(
        frames.last().unwrap()["kind"],
        "native",
        "{what}: the thread's root is native\n{frames:#?}"
    );
    assert_eq!(native["native"]["threads_stopped"], 0, "{what}");
}

fn gcore(name: &str, stacks: Stacks) {
    let Some(interp) = setup(name) else { return };
    let scratch = Scratch::new(&format!("gcore-{name}"));
    let mut w = Workload::start(&interp, "locals.py", "locals.py", &[], &[], Launch::Plain);
    let live = dump_json_with(w.pid, &["--locals"]);
    let prefix = scratch.0.join("core");
    let out = run(Command::new("gcore")
        .arg("-o")
        .arg(&prefix)
        .arg(w.pid.to_string()));
    let core = PathBuf::from(format!("{}.{}", prefix.display(), w.pid));
    assert!(
        core.exists(),
        "gcore wrote no {} ({}): {}",
        core.display(),
        out.status,
        text(&out.stderr)
    );
    w.signal_and_wait(libc::SIGKILL);
    let c = core.to_str().unwrap();
    let dumped = dump_core_json(&["--core", c, "--locals"]);
    assert_eq!(dumped["pid"].as_u64(), Some(u64::from(w.pid)));
    assert_eq!(dumped["core"]["compressed"], false);
    assert_eq!(
        dumped["python"], live["python"],
        "{name}: interpreter facts"
    );
    assert_same(&format!("{name} gcore"), &live, &dumped, stacks);
    let gz = gzip(&core);
    let zipped = dump_core_json(&["--core", gz.to_str().unwrap(), "--locals"]);
    assert_eq!(zipped["core"]["compressed"], true);
    assert_same(&format!("{name} gcore, gzip"), &live, &zipped, stacks);
    let native = dump_core_json(&["--core", c, "--locals", "--native"]);
    let merged_thread = match stacks {
        Stacks::Complete | Stacks::CompleteNamespaced => "locals-thread",
        Stacks::ThreadStacksZeroed => "MainThread",
    };
    check_native(
        &format!("{name} gcore --native"),
        &dumped,
        &native,
        merged_thread,
    );
    // Text: the same header and the locals under their frame.
    let out = run(&mut pyebpf(&["dump", "--core", c, "--locals"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(
        t.starts_with(&format!("Core {c} of process {}: ", w.pid)),
        "{t}"
    );
    assert!(t.contains("            кириллица = 'Привет, мир'\n"), "{t}");
}

#[test]
fn gcore_3_12() {
    gcore("3.12", Stacks::Complete);
}

#[test]
fn gcore_3_13() {
    gcore("3.13", Stacks::Complete);
}

#[test]
fn gcore_3_13t() {
    gcore("3.13t", Stacks::Complete);
}

#[test]
fn gcore_3_13t_static() {
    gcore("3.13t-static", Stacks::Complete);
}

#[test]
fn gcore_3_14() {
    gcore("3.14", Stacks::ThreadStacksZeroed);
}

#[test]
fn gcore_3_15() {
    gcore("3.15", Stacks::ThreadStacksZeroed);
}

const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

/// Sets `core_pattern` for the test when it does not name a file in the process's directory,
/// and restores it on drop (also when the test fails).
struct CorePattern {
    old: Option<String>,
}

impl CorePattern {
    fn ensure_local() -> CorePattern {
        let old = std::fs::read_to_string(CORE_PATTERN).unwrap();
        let current = old.trim_end();
        let local = !current.is_empty() && !current.contains(['/', '|', '%']);
        if local {
            return CorePattern { old: None };
        }
        std::fs::write(CORE_PATTERN, "core").unwrap();
        CorePattern {
            old: Some(current.to_owned()),
        }
    }
}

impl Drop for CorePattern {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = std::fs::write(CORE_PATTERN, old);
        }
    }
}

/// The core file the kernel wrote into `dir` (`core` or `core.PID`, see `core_uses_pid`).
fn kernel_core_in(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == "core" || n.starts_with("core."))
        })
        .unwrap_or_else(|| panic!("no core file in {}", dir.display()))
}

/// The root `dump --core` needs for a kernel core of `interp`: its own root (chrooted), else /.
fn root_of(interp: &Interpreter) -> String {
    interp
        .root
        .as_ref()
        .map_or_else(|| "/".to_owned(), |r| r.display().to_string())
}

fn kernel_core(name: &str) {
    let Some(interp) = setup(name) else { return };
    let pattern = CorePattern::ensure_local();
    let scratch = Scratch::new(&format!("kernel-{name}"));
    let mut w = Workload::start(
        &interp,
        "locals.py",
        "locals.py",
        &[],
        &[("PYEBPF_CHDIR_TO_SCRIPT", "1")],
        Launch::Plain,
    );
    let live = dump_json_with(w.pid, &["--locals"]);
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit(2) on our child with a valid new limit and no old-limit output.
    let r = unsafe {
        libc::prlimit(
            w.pid as i32,
            libc::RLIMIT_CORE,
            &raw const unlimited,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "prlimit RLIMIT_CORE");
    let status = w.signal_and_wait(libc::SIGQUIT);
    drop(pattern);
    assert!(
        std::os::unix::process::ExitStatusExt::core_dumped(&status),
        "{name}: no core dumped ({status})"
    );
    // Move it out of the workload's directory (removed with the workload).
    let core = scratch.0.join("core");
    std::fs::rename(kernel_core_in(w.host_dir()), &core).unwrap();
    let c = core.to_str().unwrap();
    let root = root_of(&interp);
    let dumped = dump_core_json(&["--core", c, "--root", &root, "--locals"]);
    assert_same(
        &format!("{name} kernel core"),
        &live,
        &dumped,
        Stacks::Complete,
    );
    let native = dump_core_json(&["--core", c, "--root", &root, "--locals", "--native"]);
    for t in ["locals-thread", "MainThread"] {
        check_native(&format!("{name} kernel core --native"), &dumped, &native, t);
    }
    let gz = gzip(&core);
    let zipped = dump_core_json(&["--core", gz.to_str().unwrap(), "--root", &root, "--locals"]);
    assert_same(
        &format!("{name} kernel core, gzip"),
        &live,
        &zipped,
        Stacks::Complete,
    );
}

#[test]
fn kernel_core_3_8() {
    kernel_core("3.8");
}

#[test]
fn kernel_core_3_11() {
    kernel_core("3.11");
}

#[test]
fn kernel_core_3_9_bullseye_chrooted() {
    kernel_core("3.9-bullseye");
}

#[test]
fn kernel_core_3_12() {
    kernel_core("3.12");
}

#[test]
fn kernel_core_3_13t() {
    kernel_core("3.13t");
}

#[test]
fn kernel_core_3_13t_static() {
    kernel_core("3.13t-static");
}

#[test]
fn kernel_core_3_14_chrooted() {
    kernel_core("3.14");
}

#[test]
fn kernel_core_3_15_chrooted() {
    kernel_core("3.15");
}

/// A kernel core of a process in its own pid and mount namespace, `pivot_root`ed into the sid
/// root (a container): the core names files as the container sees them and numbers threads in
/// its pid namespace; `--root` is the container's root.
#[test]
fn kernel_core_3_14_container() {
    let Some(interp) = setup("3.14") else { return };
    let pattern = CorePattern::ensure_local();
    let scratch = Scratch::new("kernel-container");
    let mut w = Workload::start(
        &interp,
        "locals.py",
        "locals.py",
        &[],
        &[("PYEBPF_CHDIR_TO_SCRIPT", "1")],
        Launch::PivotRootChild,
    );
    let ns_pid = w.ready["pid"].as_u64().unwrap();
    assert!(
        u64::from(w.pid) != ns_pid,
        "a pid of its own namespace: {ns_pid}"
    );
    let live = dump_json_with(w.pid, &["--locals"]);
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit(2) on the process this test started, with a valid new limit.
    let r = unsafe {
        libc::prlimit(
            w.pid as i32,
            libc::RLIMIT_CORE,
            &raw const unlimited,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "prlimit RLIMIT_CORE");
    w.signal_namespaced_and_wait(libc::SIGQUIT);
    drop(pattern);
    let core = scratch.0.join("core");
    std::fs::rename(kernel_core_in(w.host_dir()), &core).unwrap();
    let c = core.to_str().unwrap();
    let root = root_of(&interp);
    let dumped = dump_core_json(&["--core", c, "--root", &root, "--locals"]);
    assert_eq!(dumped["pid"], ns_pid, "the pid in its namespace");
    assert_same(
        "3.14 container kernel core",
        &live,
        &dumped,
        Stacks::CompleteNamespaced,
    );
    let native = dump_core_json(&["--core", c, "--root", &root, "--locals", "--native"]);
    for t in ["locals-thread", "MainThread"] {
        check_native("3.14 container kernel core --native", &dumped, &native, t);
    }
}

/// Asserts exit 1 with exactly one line on stderr containing `needle`; returns stdout.
#[track_caller]
fn one_line_error(args: &[&str], needle: &str) -> String {
    let mut all = vec!["dump"];
    all.extend_from_slice(args);
    let out = run(&mut pyebpf(&all));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "dump {args:?}: {stderr}");
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "dump {args:?}: one line on stderr, got {stderr:?}"
    );
    assert!(
        lines[0].contains(needle),
        "dump {args:?}: {stderr:?} lacks {needle:?}"
    );
    text(&out.stdout)
}

/// The one-line errors, on real cores of 3.12 (gcore) and 3.14 (the kernel's, chrooted).
#[test]
fn core_errors() {
    let Some(interp) = setup("3.14") else { return };
    let scratch = Scratch::new("errors");
    // A kernel core of a chrooted 3.14.
    let pattern = CorePattern::ensure_local();
    let mut w = Workload::start(
        &interp,
        "locals.py",
        "locals.py",
        &[],
        &[("PYEBPF_CHDIR_TO_SCRIPT", "1")],
        Launch::Plain,
    );
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit(2) on our child with a valid new limit.
    assert_eq!(
        unsafe {
            libc::prlimit(
                w.pid as i32,
                libc::RLIMIT_CORE,
                &raw const unlimited,
                std::ptr::null_mut(),
            )
        },
        0
    );
    w.signal_and_wait(libc::SIGQUIT);
    drop(pattern);
    let core = scratch.0.join("core");
    std::fs::rename(kernel_core_in(w.host_dir()), &core).unwrap();
    let c = core.to_str().unwrap();
    let bytes = std::fs::read(&core).unwrap();
    // Truncated.
    let cut = scratch.0.join("truncated");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    one_line_error(&["--core", cut.to_str().unwrap()], "is truncated");
    // Another architecture: the same core, e_machine = EM_AARCH64.
    let mut arm = bytes.clone();
    arm[18..20].copy_from_slice(&183u16.to_le_bytes());
    let arm_path = scratch.0.join("aarch64");
    std::fs::write(&arm_path, &arm).unwrap();
    one_line_error(
        &["--core", arm_path.to_str().unwrap()],
        "core dump of aarch64; this pyebpf reads x86-64 cores",
    );
    // Not a core at all, and a core of a program that is not Python (gcore of sleep).
    one_line_error(&["--core", "/etc/hostname"], "is not a core file");
    let mut sleep = Command::new("sleep").arg("60").spawn().unwrap();
    let prefix = scratch.0.join("sleep");
    run(Command::new("gcore")
        .arg("-o")
        .arg(&prefix)
        .arg(sleep.id().to_string()));
    let sleep_core = format!("{}.{}", prefix.display(), sleep.id());
    let _ = sleep.kill();
    let _ = sleep.wait();
    one_line_error(
        &["--core", &sleep_core],
        "is not a core of a Python process",
    );
    // Files missing under --root: the interpreter itself (nothing can be dumped), then only
    // the C libraries (the dump is printed, then one line names them).
    let empty = scratch.0.join("empty-root");
    std::fs::create_dir_all(&empty).unwrap();
    let out = one_line_error(
        &["--core", c, "--root", empty.to_str().unwrap()],
        "cannot find the Python runtime in",
    );
    assert!(out.is_empty(), "{out}");
    let partial = scratch.0.join("partial-root");
    let exe = interp
        .root
        .as_ref()
        .unwrap()
        .join(interp.python.trim_start_matches('/'));
    std::fs::create_dir_all(partial.join("usr/bin")).unwrap();
    std::fs::copy(&exe, partial.join(interp.python.trim_start_matches('/'))).unwrap();
    let out = one_line_error(
        &["--core", c, "--root", partial.to_str().unwrap(), "--json"],
        "missing under",
    );
    let v: Value = serde_json::from_str(&out).expect("the dump is printed before the error");
    let t = thread(&v, "locals-thread");
    assert_eq!(t["frames"][0]["function"], "outer.<locals>.inner", "{t}");
}
