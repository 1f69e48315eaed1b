//! Helpers of the issue-4 `record` tests: Python workloads (installed with `harness.py` in a
//! directory of their own, started plainly or chrooted, waited for through their ready file),
//! `dump --json` as the reference stack, running `record`, and the folded-stack queries.
//!
//! Ready protocol (see `tests/workloads/py/harness.py`): the workload writes a JSON file once its
//! threads sit on their spinning lines, with its pid, version, `sys._is_gil_enabled()` and per
//! thread (by name) its native id. Expected lines come from `# LINE:<tag>` markers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Cpu, Guard, Interpreter, Recorder, pyebpf, run, text, wait_cpu, workload};

/// How long a workload may take to become ready (a 2-core machine busy with other tests).
pub const READY_TIMEOUT: Duration = Duration::from_mins(6);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this test process and call: `tag-PID-N`.
pub fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{tag}-{}-{n}", std::process::id())
}

/// The interpreter `name`, if root and the interpreter are available (shared with the other
/// e2e modules).
pub use crate::common::require_interpreter as setup;

/// A fresh host directory for one test's outputs, removed on drop.
pub struct OutDir(pub PathBuf);

impl OutDir {
    pub fn new(test: &str) -> OutDir {
        let d = std::env::temp_dir().join(format!("pyebpf-e2e-{}", unique(&format!("rec-{test}"))));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        OutDir(d)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A workload script (and `harness.py`) installed in a fresh directory the interpreter sees as
/// `/tmp/pyebpf-e2e/<unique>/`; the directory is removed on drop.
pub struct Installed {
    /// The script's path as the interpreter sees it.
    pub script: String,
    /// The directory as the interpreter sees it.
    pub inner_dir: String,
    /// The directory on the host.
    pub host_dir: PathBuf,
    /// `# LINE:<tag>` → line number in the script.
    pub lines: BTreeMap<String, i64>,
}

impl Installed {
    /// `script` is a file of `tests/workloads/py/`, or a path under `tests/workloads/`
    /// (`realworld/sympy_loop.py`).
    pub fn new(interp: &Interpreter, script: &str) -> Installed {
        let (rel, script) = match script.rsplit_once('/') {
            Some((_, name)) => (script.to_string(), name),
            None => (format!("py/{script}"), script),
        };
        let stem = Path::new(script).file_stem().unwrap().to_str().unwrap();
        let inner_dir = format!(
            "/tmp/pyebpf-e2e/{}",
            unique(&format!("{stem}-{}", interp.name))
        );
        let host_dir = interp.host_path(&inner_dir);
        let _ = std::fs::remove_dir_all(&host_dir);
        std::fs::create_dir_all(&host_dir)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", host_dir.display()));
        let source = std::fs::read_to_string(workload(&rel)).unwrap();
        std::fs::write(host_dir.join(script), &source).unwrap();
        std::fs::copy(workload("py/harness.py"), host_dir.join("harness.py")).unwrap();
        if rel.starts_with("realworld/") {
            // The real-world workloads' shared loop protocol.
            std::fs::copy(
                workload("realworld/measured_loop.py"),
                host_dir.join("measured_loop.py"),
            )
            .unwrap();
        }
        Installed {
            script: format!("{inner_dir}/{script}"),
            inner_dir,
            host_dir,
            lines: markers(&source),
        }
    }

    /// The line tagged `tag` in the script.
    pub fn line(&self, tag: &str) -> i64 {
        *self
            .lines
            .get(tag)
            .unwrap_or_else(|| panic!("no marker # LINE:{tag} in {}", self.script))
    }

    /// The folded label of a frame of the script: `function (script:line)`, line tagged `tag`.
    pub fn label(&self, function: &str, tag: &str) -> String {
        format!("{function} ({}:{})", self.script, self.line(tag))
    }

    /// [`Installed::label`] with the short file name outputs show by default (relative to
    /// the script's directory, its `sys.path` entry).
    pub fn short_label(&self, function: &str, tag: &str) -> String {
        let base = self.script.rsplit('/').next().unwrap_or(&self.script);
        format!("{function} ({base}:{})", self.line(tag))
    }

    /// The start of every label of `function` in the script, whatever its line.
    pub fn label_prefix(&self, function: &str) -> String {
        format!("{function} ({}:", self.script)
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.host_dir);
    }
}

pub use crate::common::markers;

/// A running workload that writes a ready file; killed (and its directory removed) on drop.
pub struct Workload {
    /// Host pid of the Python process (a chroot execs the interpreter in the same process).
    pub pid: u32,
    /// The interpreter's name in the manifest.
    pub interp: String,
    /// The ready file's content (`Null` until [`Workload::wait_ready`]).
    pub ready: Value,
    /// The installed script.
    pub files: Installed,
    guard: Guard,
    stderr_path: PathBuf,
}

impl Workload {
    /// Installs and starts `tests/workloads/py/<script> READY_FILE args…` with `env`, without
    /// waiting for it.
    pub fn spawn(
        interp: &Interpreter,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Workload {
        Workload::spawn_as(interp, script, args, env, Launch::Plain)
    }

    /// [`Workload::spawn`] with arguments naming files in the workload's own directory:
    /// `args(dir)` with the directory as the interpreter sees it.
    pub fn spawn_with(
        interp: &Interpreter,
        script: &str,
        env: &[(&str, &str)],
        args: impl FnOnce(&str) -> Vec<String>,
    ) -> Workload {
        let files = Installed::new(interp, script);
        let args = args(&files.inner_dir);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Workload::spawn_installed(interp, files, &args, env, Launch::Plain)
    }

    /// [`Workload::spawn`] with a choice of launch.
    pub fn spawn_as(
        interp: &Interpreter,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
        launch: Launch,
    ) -> Workload {
        let files = Installed::new(interp, script);
        Workload::spawn_installed(interp, files, args, env, launch)
    }

    fn spawn_installed(
        interp: &Interpreter,
        files: Installed,
        args: &[&str],
        env: &[(&str, &str)],
        launch: Launch,
    ) -> Workload {
        let ready_inner = format!("{}/ready.json", files.inner_dir);
        let mut py_args = vec![files.script.as_str(), ready_inner.as_str()];
        py_args.extend_from_slice(args);
        let mut cmd = interp.command(&py_args);
        if launch == Launch::HideDebugFiles {
            cmd = hide_debug_files(interp, &py_args);
        }
        let stderr_path = files.host_dir.join("stderr.txt");
        cmd.envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr_path).unwrap());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Workload {
            pid: child.id(),
            interp: interp.name.clone(),
            ready: Value::Null,
            files,
            guard: Guard(child),
            stderr_path,
        }
    }

    /// [`Workload::spawn`], then [`Workload::wait_ready`].
    pub fn start(
        interp: &Interpreter,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Workload {
        let mut w = Workload::spawn(interp, script, args, env);
        w.wait_ready();
        w
    }

    /// [`Workload::spawn_as`], then [`Workload::wait_ready`].
    pub fn start_as(
        interp: &Interpreter,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
        launch: Launch,
    ) -> Workload {
        let mut w = Workload::spawn_as(interp, script, args, env, launch);
        w.wait_ready();
        w
    }

    /// Waits until the ready file exists (panics if the workload exits first) and reads it.
    pub fn wait_ready(&mut self) {
        let ready_host = self.files.host_dir.join("ready.json");
        let t0 = Instant::now();
        while !ready_host.exists() {
            if let Some(status) = self.guard.0.try_wait().unwrap() {
                let err = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
                panic!(
                    "workload {} on {} exited ({status}) before it was ready; stderr:\n{err}",
                    self.files.script, self.interp
                );
            }
            assert!(
                t0.elapsed() < READY_TIMEOUT,
                "workload {} on {} not ready after {READY_TIMEOUT:?}",
                self.files.script,
                self.interp
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.ready = serde_json::from_str(&std::fs::read_to_string(&ready_host).unwrap())
            .expect("ready file is not JSON");
    }

    /// The host tid of thread `name` (its native id: the workloads share our pid namespace).
    pub fn tid(&self, name: &str) -> u32 {
        let t = &self.ready["threads"][name];
        let id = t["native_id"].as_u64().unwrap_or_else(|| {
            panic!(
                "ready file of {} has no thread {name}: {}",
                self.interp, self.ready
            )
        });
        u32::try_from(id).unwrap()
    }

    /// `sys._is_gil_enabled()` in the target (true before 3.13).
    pub fn gil_enabled(&self) -> bool {
        self.ready["gil_enabled"].as_bool().unwrap()
    }

    /// See [`Installed::label`].
    pub fn label(&self, function: &str, tag: &str) -> String {
        self.files.label(function, tag)
    }

    /// [`Installed::short_label`].
    pub fn short_label(&self, function: &str, tag: &str) -> String {
        self.files.short_label(function, tag)
    }

    /// Thread `name`'s Python stack as CPython itself saw it when the workload wrote its ready
    /// file (`sys._current_frames()`, read by the workload), outermost first, as labels
    /// `function (file:line)`: the truth `record`'s stacks are compared with (not `dump`, which
    /// shares pyebpf's reading code). Functions are `co_qualname` from 3.11, `co_name` before,
    /// as pyebpf shows them.
    pub fn own_stack(&self, name: &str) -> Vec<String> {
        let frames = self.ready["threads"][name]["stack"]
            .as_array()
            .unwrap_or_else(|| {
                panic!(
                    "ready file of {} has no stack of thread {name}: {}",
                    self.interp, self.ready
                )
            });
        assert!(
            !frames.is_empty(),
            "{}: thread {name}: empty stack",
            self.interp
        );
        frame_labels(frames)
    }

    /// The thread's Python stack as `dump --json` shows it now, outermost first, as labels.
    pub fn dump_stack(&self, tid: u32) -> Vec<String> {
        dump_stack(self.pid, tid)
    }
}

/// How to start a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// [`Interpreter::command`] (chrooted for interpreters with a root).
    Plain,
    /// In a private mount namespace whose `<root>/usr/lib/debug` is an empty tmpfs, then
    /// chrooted (the interpreter must have a root): the target's separate debug files are not
    /// there for a profiler looking through `/proc/PID/root`, as on a host without `-dbg`
    /// packages. The process keeps its pid (`unshare`, `sh` and `chroot` all exec).
    HideDebugFiles,
}

/// The [`Launch::HideDebugFiles`] command.
fn hide_debug_files(interp: &Interpreter, py_args: &[&str]) -> Command {
    const SCRIPT: &str = r#"set -e
root=$1; shift
mount -t tmpfs pyebpf-no-debug "$root/usr/lib/debug"
exec chroot "$root" "$@""#;
    let root = interp
        .root
        .as_ref()
        .expect("HideDebugFiles needs an interpreter with a root");
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        SCRIPT,
        "sh",
    ])
    .arg(root)
    .arg(&interp.python)
    .args(py_args)
    .stdin(Stdio::null());
    c
}

/// `pyebpf dump -p PID --json` (asserts success).
pub fn dump_json(pid: u32) -> Value {
    let o = run(&mut pyebpf(&["dump", "-p", &pid.to_string(), "--json"]));
    assert!(
        o.status.success(),
        "dump --json -p {pid} failed ({}): {}",
        o.status,
        text(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("dump --json -p {pid}: not JSON ({e}): {}", text(&o.stdout)))
}

/// The stack of thread `tid` of process `pid` as `dump --json` shows it now: labels
/// `function (file:line)`, outermost first.
pub fn dump_stack(pid: u32, tid: u32) -> Vec<String> {
    let dump = dump_json(pid);
    let threads = dump["threads"].as_array().expect("dump: threads");
    let t = threads
        .iter()
        .find(|t| t["tid"].as_u64() == Some(u64::from(tid)))
        .unwrap_or_else(|| panic!("dump -p {pid} has no thread with tid {tid}:\n{dump:#}"));
    let frames = t["frames"].as_array().expect("dump: frames");
    assert!(
        !frames.is_empty(),
        "dump -p {pid}: thread {tid} has no frames: {t}"
    );
    frame_labels(frames)
}

/// `function (file:line)` of each frame of a JSON stack (innermost first), outermost first.
fn frame_labels(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .rev()
        .map(|f| {
            format!(
                "{} ({}:{})",
                f["function"].as_str().unwrap(),
                f["file"].as_str().unwrap(),
                f["line"].as_i64().unwrap()
            )
        })
        .collect()
}

/// One folded-stack line: frames root first, and its count.
#[derive(Clone, Debug)]
pub struct Sample {
    pub frames: Vec<String>,
    pub count: u64,
}

/// Parses folded stacks.
pub fn parse_folded(s: &str) -> Vec<Sample> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (stack, count) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad folded line: {l:?}"));
            Sample {
                frames: stack.split(';').map(str::to_string).collect(),
                count: count
                    .parse()
                    .unwrap_or_else(|_| panic!("bad count in {l:?}")),
            }
        })
        .collect()
}

/// A finished `record` run.
pub struct Recording {
    /// The folded stacks (empty unless the format was collapsed).
    pub samples: Vec<Sample>,
    /// stderr (the summary).
    pub stderr: String,
    /// The command line, for messages.
    pub what: String,
}

impl Recording {
    /// Samples of process `pid` (root `… (pid)`).
    pub fn of_pid(&self, pid: u32) -> Vec<&Sample> {
        let suffix = format!(" ({pid})");
        self.samples
            .iter()
            .filter(|s| s.frames[0].ends_with(&suffix))
            .collect()
    }

    /// Samples of thread `tid` of process `pid` (with `--threads`: second level `… (tid)`).
    pub fn of_thread(&self, pid: u32, tid: u32) -> Vec<&Sample> {
        let suffix = format!(" ({tid})");
        self.of_pid(pid)
            .into_iter()
            .filter(|s| s.frames.get(1).is_some_and(|t| t.ends_with(&suffix)))
            .collect()
    }

    /// The per-Python-process summary line of `pid` on stderr,
    /// `pyebpf: python comm (pid) VERSION: N samples, …, M merge mismatches, …`.
    pub fn py_summary(&self, pid: u32) -> Option<&str> {
        let needle = format!(" ({pid}) ");
        self.stderr
            .lines()
            .find(|l| l.starts_with("pyebpf: python ") && l.contains(&needle))
    }

    /// The number just before `what` (e.g. " merge mismatches") in `pid`'s summary line.
    pub fn py_summary_count(&self, pid: u32, what: &str) -> Option<u64> {
        let line = self.py_summary(pid)?;
        let at = line.find(what)?;
        line[..at].split_whitespace().next_back()?.parse().ok()
    }

    /// The stderr lines containing `needle`.
    pub fn stderr_lines(&self, needle: &str) -> Vec<&str> {
        self.stderr.lines().filter(|l| l.contains(needle)).collect()
    }
}

/// `pyebpf record ARGS -o DIR/FILE` with `env`: asserts success, parses collapsed output.
pub fn record(args: &[&str], out: &Path, env: &[(&str, &str)]) -> Recording {
    let mut cmd = record_command(args, out, env);
    let o = run(&mut cmd);
    finish(&o, args, out)
}

/// `record ARGS` (without `-d`; `env` for it) stopped by SIGINT once each of the threads `busy` ((pid, tid))
/// has used `secs` of CPU time since sampling began (at most 60 s): a sample count then
/// measures the sampler, not how loaded the machine is (at 99 Hz a thread is sampled about
/// 99 times per second of its CPU time).
pub fn record_for_cpu(
    args: &[&str],
    out: &Path,
    env: &[(&str, &str)],
    busy: &[(u32, u32)],
    secs: f64,
) -> Recording {
    let mut all = args.to_vec();
    all.extend(["-d", "120"]);
    let rec = Recorder::start(record_command(&all, out, env));
    let cpus: Vec<Cpu> = busy.iter().map(|&(p, t)| Cpu::thread(p, t)).collect();
    let want: Vec<(&Cpu, f64)> = cpus.iter().map(|c| (c, secs)).collect();
    let used = wait_cpu(&want, Duration::from_mins(1));
    rec.signal(libc::SIGINT);
    let (status, stderr) = rec.finish();
    let what = format!(
        "pyebpf record -o {} {}, stopped after {used:.2?} s of CPU of {busy:?}",
        out.display(),
        args.join(" ")
    );
    assert!(status.success(), "`{what}` failed ({status}):\n{stderr}");
    let body = std::fs::read_to_string(out)
        .unwrap_or_else(|e| panic!("`{what}`: cannot read {}: {e}\n{stderr}", out.display()));
    Recording {
        samples: parse_folded(&body),
        stderr,
        what,
    }
}

/// The `record` command (not started), with whole file names: these tests compare stacks with
/// `dump`'s, which shows them whole (`pyrecord::views` checks the short default).
pub fn record_command(args: &[&str], out: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = pyebpf(&["record", "--full-filenames"]);
    // `-o` first: `args` may end with `-- COMMAND …`.
    cmd.arg("-o").arg(out).args(args).envs(env.iter().copied());
    cmd
}

/// Starts `record` with stdout and stderr piped.
pub fn record_spawn(args: &[&str], out: &Path) -> Child {
    let mut cmd = record_command(args, out, &[]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

/// Waits until the `record` process `child` samples: it holds its CPU-clock perf events, one
/// per online CPU, (with `--idle`) its `sched_switch` program is attached, and that has been
/// steady for half a second. Kernels ≥ 5.15 attach the perf events through BPF links (one
/// `bpf_link` fd of `link_type: perf` per CPU, the perf event fd itself closed); older ones attach
/// the program to each perf event with an ioctl, so there the `perf_event` fds show. The
/// process-event programs are raw tracepoints (`bpf_link` fds of `link_type: raw_tracepoint`)
/// attached before the sampling program is even loaded, so they say nothing: counting them let
/// a run on 5.10 in qemu, whose verifier takes a minute there, look like it was sampling.
/// `record` loads and verifies its programs first, which takes seconds for a debug build on a
/// busy machine; "N s after the run begins" counts from here.
pub fn wait_sampling(child: &mut Child) {
    // SAFETY: sysconf has no preconditions.
    let cpus = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(1);
    let idle = std::fs::read(format!("/proc/{}/cmdline", child.id()))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .any(|a| a == b"--idle");
    // (CPU-clock attachments, `sched_switch` links).
    let attachments = |pid: u32| {
        let (mut perf, mut switch) = (0, 0);
        for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            match std::fs::read_link(e.path())
                .map(|l| l.to_string_lossy().into_owned())
                .as_deref()
            {
                Ok("anon_inode:bpf_link") => {
                    let info = std::fs::read_to_string(format!(
                        "/proc/{pid}/fdinfo/{}",
                        e.file_name().to_string_lossy()
                    ))
                    .unwrap_or_default();
                    let kind = info
                        .lines()
                        .find_map(|l| l.strip_prefix("link_type:"))
                        .map(str::trim);
                    match kind {
                        Some("perf") => perf += 1,
                        Some("tracing") => switch += 1,
                        _ => {}
                    }
                }
                Ok("anon_inode:[perf_event]") => perf += 1,
                _ => {}
            }
        }
        (perf, switch)
    };
    let t0 = Instant::now();
    let (mut last, mut since) = ((0, 0), Instant::now());
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("record exited ({status}) before it started sampling");
        }
        let n = attachments(child.id());
        let attached = n.0 >= cpus && (!idle || n.1 >= 1);
        if n != last {
            (last, since) = (n, Instant::now());
        } else if attached && since.elapsed() >= Duration::from_millis(500) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_mins(4),
            "record (pid {}) holds {} CPU-clock attachments and {} sched_switch links after 4 \
             min, want ≥ {cpus}{}: not sampling?",
            child.id(),
            n.0,
            n.1,
            if idle { " and 1" } else { "" }
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks a finished `record` and reads its output.
pub fn finish(o: &Output, args: &[&str], out: &Path) -> Recording {
    let what = format!("pyebpf record -o {} {}", out.display(), args.join(" "));
    let stderr = text(&o.stderr);
    assert!(
        o.status.success(),
        "`{what}` failed ({}):\n{stderr}",
        o.status
    );
    let body = std::fs::read_to_string(out)
        .unwrap_or_else(|e| panic!("`{what}`: cannot read {}: {e}\n{stderr}", out.display()));
    let collapsed = out.extension().is_some_and(|e| e == "txt") || args.contains(&"collapsed");
    Recording {
        samples: if collapsed {
            parse_folded(&body)
        } else {
            Vec::new()
        },
        stderr,
        what,
    }
}

/// Sum of counts.
pub fn total(samples: &[&Sample]) -> u64 {
    samples.iter().map(|s| s.count).sum()
}

/// Sum of counts of the samples for which `f` holds.
pub fn count_where(samples: &[&Sample], f: impl Fn(&Sample) -> bool) -> u64 {
    samples.iter().filter(|s| f(s)).map(|s| s.count).sum()
}

/// Whether a folded frame is a Python frame, `qualname (file:line)`.
pub fn is_py_frame(frame: &str) -> bool {
    let Some(inner) = frame.strip_suffix(')') else {
        return false;
    };
    let Some((_, loc)) = inner.rsplit_once(" (") else {
        return false;
    };
    let Some((file, line)) = loc.rsplit_once(':') else {
        return false;
    };
    !file.is_empty() && line.parse::<u32>().is_ok()
}

/// The most frequent samples, one per line, for assertion messages.
pub fn show(samples: &[&Sample], max: usize) -> String {
    let mut sorted: Vec<&Sample> = samples.to_vec();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
    let mut s = String::new();
    for x in sorted.iter().take(max) {
        let _ = writeln!(s, "  {} {}", x.frames.join(";"), x.count);
    }
    if sorted.len() > max {
        let _ = writeln!(s, "  … {} more distinct stacks", sorted.len() - max);
    }
    if sorted.is_empty() {
        s.push_str("  (none)\n");
    }
    s
}

/// Frames one per line, for assertion messages.
pub fn show_frames(frames: &[String]) -> String {
    let mut s = String::new();
    for (i, f) in frames.iter().enumerate() {
        let _ = writeln!(s, "  #{i} {f}");
    }
    s
}

/// Where `got` first differs from `expected`, for assertion messages.
pub fn first_difference(got: &[String], expected: &[String]) -> String {
    let i = got
        .iter()
        .zip(expected)
        .position(|(g, e)| g != e)
        .unwrap_or_else(|| got.len().min(expected.len()));
    format!(
        "first difference at Python frame #{i} (of {} got, {} expected): got {:?}, expected {:?}",
        got.len(),
        expected.len(),
        got.get(i),
        expected.get(i)
    )
}

/// The comm of a live process (the root label's name).
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/comm: {e}"))
        .trim_end()
        .to_string()
}
