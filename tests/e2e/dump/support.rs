//! Helpers of the `pyebpf dump` end-to-end tests: starting a Python workload (plainly, chrooted, or
//! in its own pid and mount namespace) and waiting for its ready file, running `dump`, checking the
//! JSON contract, and the expected frames computed from the `# LINE:<tag>` markers of a script.
//!
//! Ready protocol (see `tests/workloads/py/harness.py`): the workload writes a JSON file once every
//! thread sits on its spinning line, with its pid, version, `sys._is_gil_enabled()`, and per thread
//! (by name) its native id, Python id and CPython's own view of its stack.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Guard, Interpreter, pyebpf, run, text, workload};

/// How long a workload may take to become ready (a 2-core machine busy with other tests).
const READY_TIMEOUT: Duration = Duration::from_mins(6);

/// The interpreter `name`, if root and the interpreter are available (shared with the other
/// e2e modules).
pub use crate::common::require_interpreter as setup;

/// How to start the workload.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// `Interpreter::command` (chrooted for interpreters with a root).
    Plain,
    /// In its own pid and mount namespace, `pivot_root` into the interpreter's root (which must
    /// have one): `/proc/PID/root` of the target is not the host's `/`.
    PivotRoot,
    /// Like [`Launch::PivotRoot`], with a shell as the namespace's pid 1 and Python its child:
    /// a pid 1 ignores the signals it has no handler for (no core on `SIGQUIT`).
    PivotRootChild,
}

/// A running workload, killed (and its directory removed) on drop.
pub struct Workload {
    /// Host pid of the Python process.
    pub pid: u32,
    /// Path of the script as the target sees it.
    pub script: String,
    /// `# LINE:<tag>` → line number in the script.
    pub lines: BTreeMap<String, i64>,
    /// The ready file's content.
    pub ready: Value,
    guard: Option<Guard>,
    host_dir: PathBuf,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub use crate::common::markers;

impl Workload {
    /// Installs `tests/workloads/py/<script>` as `installed_name` (plus `harness.py`) in a fresh
    /// directory the interpreter sees as `/tmp/pyebpf-e2e/<unique>/`, starts it with `args` after
    /// the ready-file path and `env`, and waits until it is ready.
    pub fn start(
        interp: &Interpreter,
        script: &str,
        installed_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        launch: Launch,
    ) -> Workload {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let stem = Path::new(script).file_stem().unwrap().to_str().unwrap();
        let inner_dir = format!(
            "/tmp/pyebpf-e2e/dump-{stem}-{}-{}-{n}",
            interp.name,
            std::process::id()
        );
        let host_dir = interp.host_path(&inner_dir);
        let _ = std::fs::remove_dir_all(&host_dir);
        std::fs::create_dir_all(&host_dir)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", host_dir.display()));
        let source = std::fs::read_to_string(workload(&format!("py/{script}"))).unwrap();
        std::fs::write(host_dir.join(installed_name), &source).unwrap();
        std::fs::copy(workload("py/harness.py"), host_dir.join("harness.py")).unwrap();
        let script_inner = format!("{inner_dir}/{installed_name}");
        let ready_inner = format!("{inner_dir}/ready.json");
        let mut py_args = vec![script_inner.as_str(), ready_inner.as_str()];
        py_args.extend_from_slice(args);

        let mut cmd = match launch {
            Launch::Plain => interp.command(&py_args),
            Launch::PivotRoot => pivot_root_command(interp, &py_args, true),
            Launch::PivotRootChild => pivot_root_command(interp, &py_args, false),
        };
        let stderr_path = host_dir.join("stderr.txt");
        cmd.envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr_path).unwrap());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let mut w = Workload {
            pid: child.id(),
            script: script_inner,
            lines: markers(&source),
            ready: Value::Null,
            guard: Some(Guard(child)),
            host_dir: host_dir.clone(),
        };
        let ready_host = host_dir.join("ready.json");
        let t0 = Instant::now();
        while !ready_host.exists() {
            let status = w.guard.as_mut().unwrap().0.try_wait().unwrap();
            if let Some(status) = status {
                let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!("workload {cmd:?} exited ({status}) before it was ready; stderr:\n{err}");
            }
            assert!(
                t0.elapsed() < READY_TIMEOUT,
                "workload {cmd:?} not ready after {READY_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        w.ready = serde_json::from_str(&std::fs::read_to_string(&ready_host).unwrap())
            .expect("ready file is not JSON");
        if launch == Launch::PivotRootChild {
            let shell = child_of(w.pid).unwrap_or_else(|| panic!("no child of unshare {}", w.pid));
            w.pid = child_of(shell).unwrap_or_else(|| panic!("no child of the shell {shell}"));
        } else if launch == Launch::PivotRoot {
            w.pid = child_of(w.pid).unwrap_or_else(|| panic!("no child of unshare {}", w.pid));
        }
        w
    }

    /// The ready file's record of thread `name`: (native id, Python id, CPython's stack).
    pub fn thread(&self, name: &str) -> (u64, u64, Vec<Frame>) {
        let t = &self.ready["threads"][name];
        assert!(
            t.is_object(),
            "ready file has no thread {name}: {}",
            self.ready
        );
        let frames = t["stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(Frame::from_json)
            .collect();
        (
            t["native_id"].as_u64().unwrap(),
            t["ident"].as_u64().unwrap(),
            frames,
        )
    }

    /// A frame of the workload script: `function` at the line tagged `line`, defined at `def`.
    /// `function` is the qualified name; before 3.11 (no `co_qualname`) pyebpf shows the plain
    /// name, its last component.
    pub fn frame(&self, function: &str, line: &str, def: &str) -> Frame {
        Frame {
            function: shown_name(&self.ready, function).to_string(),
            file: self.script.clone(),
            line: self.line(line),
            first_line: self.line(def),
        }
    }

    /// The line tagged `tag` in the script.
    pub fn line(&self, tag: &str) -> i64 {
        *self
            .lines
            .get(tag)
            .unwrap_or_else(|| panic!("no marker # LINE:{tag} in {}", self.script))
    }
}

impl Workload {
    /// The directory the workload was installed in, as the host sees it (removed on drop).
    pub fn host_dir(&self) -> &Path {
        &self.host_dir
    }

    /// Sends `signal` to the Python process of a namespaced launch (not our child) and waits
    /// until the launcher (our child, which waits for it) has exited.
    pub fn signal_namespaced_and_wait(&mut self, signal: i32) {
        let guard = self.guard.as_mut().expect("a running workload");
        assert_ne!(guard.pid(), self.pid, "a namespaced launch");
        // SAFETY: kill(2) on the process this test started (its launcher has not been waited
        // for, so the pid is still this process or its zombie).
        unsafe { libc::kill(self.pid as i32, signal) };
        guard.0.wait().expect("wait for the launcher");
        self.guard = None;
    }

    /// Sends `signal` to the Python process (our child: a plain launch) and waits until it is
    /// gone; returns how it ended.
    pub fn signal_and_wait(&mut self, signal: i32) -> std::process::ExitStatus {
        assert_eq!(
            self.guard.as_ref().map(Guard::pid),
            Some(self.pid),
            "signal_and_wait needs a plain launch"
        );
        // SAFETY: kill(2) on the process this test started (still our unreaped child).
        unsafe { libc::kill(self.pid as i32, signal) };
        let guard = self.guard.as_mut().expect("a running workload");
        let status = guard.0.wait().expect("wait for the workload");
        self.guard = None;
        status
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // Without a guard the process was already waited for (its pid may be reused now).
        let spawned = self.guard.as_ref().map(Guard::pid);
        if spawned.is_some_and(|p| p != self.pid) {
            // The Python process is not our child (namespaced launch): kill it by pid; unshare's
            // --kill-child would do it too once the guard kills unshare.
            // SAFETY: kill(2) on a pid this test started.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        drop(self.guard.take());
        let _ = std::fs::remove_dir_all(&self.host_dir);
    }
}

/// `unshare --pid --mount --fork` a shell that bind-mounts the interpreter's root onto itself,
/// mounts a fresh /proc in it, `pivot_root`s into it, lazily unmounts the old root and execs the
/// interpreter: the target's `/proc/PID/root` is its own root, its tids are namespaced.
fn pivot_root_command(interp: &Interpreter, py_args: &[&str], exec: bool) -> Command {
    const PIVOT: &str = r#"set -e
root=$1; shift
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
cd "$root"
pivot_root . mnt
cd /
umount -l /mnt
if [ "$EXEC" = 1 ]; then exec "$@"; fi
"$@""#;
    let root = interp
        .root
        .as_ref()
        .expect("a pivot_root launch needs an interpreter with a root");
    let mut c = Command::new("unshare");
    c.env("EXEC", if exec { "1" } else { "0" });
    c.args([
        "--pid",
        "--mount",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        PIVOT,
        "sh",
    ])
    .arg(root)
    .arg(&interp.python)
    .args(py_args)
    .stdin(Stdio::null());
    c
}

/// The only child of `parent` (scanning /proc for its `PPid:`).
fn child_of(parent: u32) -> Option<u32> {
    let mut found = None;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let parent_pid = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .map(|v| v.trim().parse::<u32>().unwrap());
        if parent_pid == Some(parent) {
            assert!(found.is_none(), "unshare {parent} has several children");
            found = Some(pid);
        }
    }
    found
}

/// One frame, in the shape of `dump --json` (and of the ready file's stacks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i64,
    pub first_line: i64,
}

impl Frame {
    pub fn from_json(v: &Value) -> Frame {
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("frame field {k} not a string: {v}"))
                .to_string()
        };
        let i = |k: &str| {
            v[k].as_i64()
                .unwrap_or_else(|| panic!("frame field {k} not an integer: {v}"))
        };
        Frame {
            function: s("function"),
            file: s("file"),
            line: i("line"),
            first_line: i("first_line"),
        }
    }

    /// The text output's frame line.
    pub fn text(&self) -> String {
        format!("{} ({}:{})", self.function, self.file, self.line)
    }
}

/// Lists frames one per line, for assertion messages.
pub fn show(frames: &[Frame]) -> String {
    let mut s = String::new();
    for (i, f) in frames.iter().enumerate() {
        let _ = writeln!(
            s,
            "  #{i} {} ({}:{}) first_line {}",
            f.function, f.file, f.line, f.first_line
        );
    }
    s
}

/// Asserts two frame lists are equal, printing both on failure.
#[track_caller]
pub fn assert_frames(what: &str, got: &[Frame], expected: &[Frame]) {
    assert!(
        got == expected,
        "{what}: frames differ\n got:\n{}\n expected:\n{}",
        show(got),
        show(expected)
    );
}

/// `pyebpf dump -p PID --json`: asserts exit 0, checks the contract's shape, returns the JSON.
pub fn dump_json(pid: u32) -> Value {
    dump_json_with(pid, &[])
}

/// `pyebpf dump -p PID --json ARGS…` (e.g. `--locals`), checked like [`dump_json`].
pub fn dump_json_with(pid: u32, args: &[&str]) -> Value {
    let p = pid.to_string();
    let mut all = vec!["dump", "-p", &p, "--json"];
    all.extend_from_slice(args);
    let out = run(&mut pyebpf(&all));
    let stdout = String::from_utf8(out.stdout.clone())
        .unwrap_or_else(|e| panic!("dump --json -p {pid}: stdout is not UTF-8: {e}"));
    assert!(
        out.status.success(),
        "dump --json -p {pid} failed ({}): stderr: {}\nstdout: {stdout}",
        out.status,
        text(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("dump --json -p {pid}: not JSON ({e}):\n{stdout}"));
    check_schema(&v, pid);
    v
}

/// `pyebpf dump -p PID` (text): asserts exit 0 and UTF-8, returns stdout.
pub fn dump_text(pid: u32) -> String {
    let out = run(&mut pyebpf(&["dump", "-p", &pid.to_string()]));
    assert!(
        out.status.success(),
        "dump -p {pid} failed ({}): stderr: {}",
        out.status,
        text(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("dump -p {pid}: stdout is not UTF-8: {e}"))
}

#[track_caller]
fn keys(v: &Value, expected: &[&str], what: &str) {
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {v}"));
    let got: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = expected.iter().copied().collect();
    assert_eq!(got, want, "{what}: keys differ from the contract: {v}");
}

/// Checks `dump --json` output against the contract: exact keys and value types.
#[allow(
    clippy::too_many_lines,
    reason = "one flat walk over the contract, field by field"
)]
pub fn check_schema(v: &Value, pid: u32) {
    let mut top = vec!["pid", "python", "threads", "threads_ended"];
    if v.get("native").is_some() {
        // `--native`: the pauses.
        top.push("native");
        keys(
            &v["native"],
            &["threads_stopped", "pause_us_max", "pause_us_total"],
            "native",
        );
    }
    if v.get("pause").is_some() {
        // `--pause`: the pauses.
        top.push("pause");
        keys(
            &v["pause"],
            &["threads_stopped", "pause_us_max", "pause_us_total"],
            "pause",
        );
    }
    assert!(v["threads_ended"].is_u64(), "threads_ended: {v}");
    keys(v, &top, "top level");
    assert_eq!(
        v["pid"].as_u64(),
        Some(u64::from(pid)),
        "pid field: {}",
        v["pid"]
    );
    keys(
        &v["python"],
        &["version", "free_threaded", "gil_enabled"],
        "python",
    );
    assert!(
        v["python"]["version"].is_string(),
        "python.version: {}",
        v["python"]
    );
    assert!(
        v["python"]["free_threaded"].is_boolean(),
        "python.free_threaded: {}",
        v["python"]
    );
    assert!(
        v["python"]["gil_enabled"].is_boolean(),
        "python.gil_enabled: {}",
        v["python"]
    );
    let threads = v["threads"]
        .as_array()
        .unwrap_or_else(|| panic!("threads is not an array: {v}"));
    assert!(!threads.is_empty(), "no threads: {v}");
    for t in threads {
        let what = format!("thread {}", t["name"]);
        let mut fields = vec![
            "tid",
            "native_thread_id",
            "python_thread_id",
            "name",
            "gil",
            "truncated",
            "torn",
            "rereads",
            "frames",
        ];
        if t.get("native").is_some() {
            fields.push("native");
            keys(
                &t["native"],
                &["pause_us", "merge", "truncated", "error"],
                &format!("{what}: native"),
            );
            assert!(
                ["merged", "mismatch", "native_only"]
                    .contains(&t["native"]["merge"].as_str().unwrap_or_default()),
                "{what}: merge {}",
                t["native"]
            );
        }
        keys(t, &fields, &what);
        assert!(
            t["tid"].is_u64() || t["tid"].is_null(),
            "{what}: tid {}",
            t["tid"]
        );
        assert!(
            t["native_thread_id"].is_u64(),
            "{what}: native_thread_id {}",
            t["native_thread_id"]
        );
        assert!(
            t["python_thread_id"].is_u64(),
            "{what}: python_thread_id {}",
            t["python_thread_id"]
        );
        assert!(
            t["name"].is_string() || t["name"].is_null(),
            "{what}: name {}",
            t["name"]
        );
        let gil = t["gil"].as_str().unwrap_or_default();
        assert!(
            ["holds", "does_not_hold", "no_gil", "unknown"].contains(&gil),
            "{what}: gil {}",
            t["gil"]
        );
        assert!(
            t["truncated"].is_boolean(),
            "{what}: truncated {}",
            t["truncated"]
        );
        for f in t["frames"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: frames not an array"))
        {
            let mut fields = match f.get("kind").and_then(Value::as_str) {
                None => vec!["function", "file", "line", "first_line"],
                Some("python") => vec!["kind", "function", "file", "line", "first_line"],
                Some("native") => {
                    keys(
                        f,
                        &["kind", "function", "module", "file", "line", "address"],
                        &format!("{what}: native frame"),
                    );
                    continue;
                }
                Some("marker") => {
                    keys(f, &["kind", "function"], &format!("{what}: marker"));
                    continue;
                }
                Some(other) => panic!("{what}: frame kind {other}"),
            };
            if f.get("locals").is_some() {
                fields.push("locals");
            }
            keys(f, &fields, &format!("{what}: frame"));
            Frame::from_json(f);
            for l in f["locals"].as_array().map_or(&[][..], Vec::as_slice) {
                keys(l, &["name", "arg", "value"], &format!("{what}: local"));
                assert!(
                    l["name"].is_string() && l["arg"].is_boolean() && l["value"].is_string(),
                    "{what}: local {l}"
                );
            }
        }
    }
}

/// The thread called `name` in a dump (exactly one).
#[track_caller]
pub fn thread<'a>(dump: &'a Value, name: &str) -> &'a Value {
    let all = dump["threads"].as_array().unwrap();
    let found: Vec<&Value> = all.iter().filter(|t| t["name"] == name).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one thread named {name:?} in the dump:\n{dump:#}"
    );
    found[0]
}

/// How pyebpf names a function whose qualified name is `qualname` in the interpreter that wrote
/// `ready`: the qualified name from 3.11 on, the plain `co_name` before.
pub fn shown_name<'a>(ready: &Value, qualname: &'a str) -> &'a str {
    let minor: u32 = ready["version"]
        .as_str()
        .and_then(|v| v.split('.').nth(1)?.parse().ok())
        .unwrap_or(99);
    if minor >= 11 {
        qualname
    } else {
        qualname.rsplit('.').next().unwrap_or(qualname)
    }
}

/// The frames of a dumped thread.
pub fn frames(thread: &Value) -> Vec<Frame> {
    thread["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(Frame::from_json)
        .collect()
}

/// The names of a dump's threads, sorted.
pub fn thread_names(dump: &Value) -> Vec<String> {
    let mut names: Vec<String> = dump["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("<null>").to_string())
        .collect();
    names.sort();
    names
}

/// Checks a dumped worker thread against the ready file: ids (the host tid equals the native id
/// when the target shares our pid namespace), not truncated, the innermost frames exactly
/// `innermost`, and the whole stack exactly CPython's own view.
#[track_caller]
pub fn check_worker(
    dump: &Value,
    w: &Workload,
    name: &str,
    innermost: &[Frame],
    same_pid_ns: bool,
) {
    let t = thread(dump, name);
    let (native_id, ident, cpython) = w.thread(name);
    assert_eq!(
        t["native_thread_id"].as_u64(),
        Some(native_id),
        "{name}: native_thread_id; thread {t}"
    );
    assert_eq!(
        t["python_thread_id"].as_u64(),
        Some(ident),
        "{name}: python_thread_id; thread {t}"
    );
    if same_pid_ns {
        assert_eq!(
            t["tid"].as_u64(),
            Some(native_id),
            "{name}: host tid; thread {t}"
        );
    }
    assert_eq!(t["truncated"], false, "{name}: truncated");
    let got = frames(t);
    let n = innermost.len().min(got.len());
    assert_frames(
        &format!("{name}: innermost {} frames", innermost.len()),
        &got[..n],
        innermost,
    );
    assert_frames(
        &format!("{name}: whole stack vs CPython's sys._current_frames()"),
        &got,
        &cpython,
    );
}

/// Checks the text output has, for thread `name`, a header line naming it and each frame's
/// `function (file:line)` line, in order, after that header.
#[track_caller]
pub fn check_text(out: &str, name: &str, innermost: &[Frame]) {
    let lines: Vec<&str> = out.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.contains(name) && !is_frame_line(l))
        .unwrap_or_else(|| panic!("text output: no header line naming thread {name:?}:\n{out}"));
    let mut at = header + 1;
    for f in innermost {
        let want = f.text();
        let rel = lines[at..]
            .iter()
            .position(|l| l.trim_end().ends_with(&want))
            .unwrap_or_else(|| {
                panic!("text output: thread {name:?}: no line `{want}` after line {at}:\n{out}")
            });
        at += rel + 1;
    }
}

/// Whether a text-output line looks like a frame line, `function (file:line)`.
pub fn is_frame_line(l: &str) -> bool {
    let l = l.trim_end();
    l.ends_with(')')
        && l.rsplit_once(':')
            .is_some_and(|(_, n)| n[..n.len() - 1].parse::<i64>().is_ok())
}
