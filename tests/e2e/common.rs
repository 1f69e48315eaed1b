//! Shared helpers of the end-to-end tests: the binary under test, the interpreter manifest,
//! the prerequisite policy (fail under CI, loud skip elsewhere), and process handling.
#![allow(dead_code, reason = "helpers are shared by several test modules")]

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The one prerequisite policy (crate `prereq`): under `CI=true` a missing prerequisite fails
/// the test; elsewhere it is skipped with a `SKIPPED` line on the real stderr, counted by
/// `cargo xtask test`.
pub use prereq::missing;

/// Requires root; see [`missing`].
pub fn require_root() -> bool {
    prereq::require_root("eBPF, /proc of other processes")
}

/// The `pyebpf` binary under test.
pub fn pyebpf_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PYEBPF_BIN") {
        return PathBuf::from(p);
    }
    // Fallback for `cargo test -p integration-tests` run by hand after a debug build.
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/pyebpf");
    assert!(
        p.exists(),
        "PYEBPF_BIN not set and {} missing: run `cargo xtask test`",
        p.display()
    );
    p
}

/// `pyebpf ARGS…` as a command (stdin closed).
pub fn pyebpf(args: &[&str]) -> Command {
    let mut c = Command::new(pyebpf_bin());
    c.args(args).stdin(Stdio::null());
    c
}

/// Where the test interpreters live.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("PYEBPF_TEST_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/pyebpf-test"), PathBuf::from)
}

/// One entry of `interpreters.json`, written by `cargo xtask setup`.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// "3.12", "3.13", "3.13t", "3.13t-static", "3.14", "3.15".
    pub name: String,
    /// Path of the interpreter (inside `root` when `root` is set).
    pub python: String,
    /// Root directory to chroot into, for the Debian sid interpreters.
    pub root: Option<PathBuf>,
    /// Full version, e.g. "3.13.0".
    pub version: String,
    pub free_threaded: bool,
}

impl Interpreter {
    /// Host path of a file that the interpreter sees at `inner` (identity without a root).
    pub fn host_path(&self, inner: &str) -> PathBuf {
        match &self.root {
            Some(r) => r.join(inner.trim_start_matches('/')),
            None => PathBuf::from(inner),
        }
    }

    /// Copies a workload script to a place this interpreter can read; returns its path as the
    /// interpreter sees it.
    pub fn install_script(&self, src: &Path) -> String {
        let name = src.file_name().unwrap().to_str().unwrap();
        let inner = format!("/tmp/pyebpf-e2e/{name}");
        let host = self.host_path(&inner);
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        std::fs::copy(src, &host)
            .unwrap_or_else(|e| panic!("copy {} → {}: {e}", src.display(), host.display()));
        inner
    }

    /// A command running this interpreter with `args` (chrooted when it has a root).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = match &self.root {
            Some(r) => {
                let mut c = Command::new("chroot");
                c.arg(r).arg(&self.python);
                c
            }
            None => Command::new(&self.python),
        };
        c.args(args).stdin(Stdio::null());
        // The tests signal their workloads (SIGQUIT for a kernel core, SIGINT) and expect the
        // default actions, even when the suite itself was started with them ignored (a
        // background job of a script).
        // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
        unsafe {
            c.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
        }
        c
    }
}

/// Reads the manifest; `None` (after [`missing`]) when it is absent.
pub fn interpreters() -> Option<Vec<Interpreter>> {
    let path = cache_dir().join("interpreters.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        missing(&format!("no interpreter manifest at {}", path.display()));
        return None;
    };
    let v: serde_json::Value = serde_json::from_str(&text).expect("interpreters.json is not JSON");
    let list = v.as_array().expect("interpreters.json: not an array");
    Some(
        list.iter()
            .map(|e| Interpreter {
                name: e["name"].as_str().unwrap().to_string(),
                python: e["python"].as_str().unwrap().to_string(),
                root: e["root"].as_str().map(PathBuf::from),
                version: e["version"].as_str().unwrap_or("").to_string(),
                free_threaded: e["free_threaded"].as_bool().unwrap_or(false),
            })
            .collect(),
    )
}

/// The interpreter called `name`, or `None` after [`missing`].
pub fn interpreter(name: &str) -> Option<Interpreter> {
    let all = interpreters()?;
    let found = all.into_iter().find(|i| i.name == name);
    if found.is_none() {
        missing(&format!("interpreter {name} not in the manifest"));
    }
    found
}

/// The interpreter `name` from the manifest, if root and the interpreter are available; `None`
/// after a loud skip (or a panic under CI).
pub fn require_interpreter(name: &str) -> Option<Interpreter> {
    if !require_root() {
        return None;
    }
    let interp = interpreter(name)?;
    let exe = interp.host_path(&interp.python);
    if !exe.exists() {
        missing(&format!(
            "interpreter {name}: {} does not exist",
            exe.display()
        ));
        return None;
    }
    Some(interp)
}

/// `# LINE:<tag>` markers of a workload script: tag → 1-based line.
pub fn markers(source: &str) -> std::collections::BTreeMap<String, i64> {
    let mut found = std::collections::BTreeMap::new();
    for (i, line) in source.lines().enumerate() {
        if let Some((_, rest)) = line.split_once("# LINE:") {
            let tag = rest.split_whitespace().next().expect("empty # LINE: tag");
            let dup = found.insert(tag.to_string(), i as i64 + 1);
            assert!(dup.is_none(), "duplicate marker {tag}");
        }
    }
    found
}

/// Path of a file under `tests/workloads/`.
pub fn workload(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(rel)
}

/// A child process killed (and reaped) on drop.
pub struct Guard(pub Child);

impl Guard {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd` and waits until `ready` holds (polling), up to `timeout`.
pub fn spawn_until(cmd: &mut Command, timeout: Duration, ready: impl Fn(u32) -> bool) -> Guard {
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let g = Guard(child);
    let t0 = Instant::now();
    while !ready(g.pid()) {
        assert!(
            t0.elapsed() < timeout,
            "workload {cmd:?} not ready after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    g
}

/// Compiles a C workload with `gcc -O2 -fomit-frame-pointer` into a temp dir; returns the binary.
pub fn build_c(rel: &str, extra: &[&str]) -> PathBuf {
    let src = workload(rel);
    let dir = std::env::temp_dir().join(format!("pyebpf-e2e-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(src.file_stem().unwrap());
    let st = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("gcc not found");
    assert!(st.success(), "gcc failed on {}", src.display());
    out
}

/// Runs a command to completion, returning its output (stdout/stderr captured).
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

/// The utf-8 text of a byte buffer (lossy), for assertion messages.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Seconds of CPU time (user + system) in a `/proc/…/stat` file.
fn stat_cpu_secs(path: &Path) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // After the `(comm)` field, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("stat without comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / hz
}

/// The CPU time a process or one of its threads uses from now on.
pub struct Cpu {
    stat: PathBuf,
    since: f64,
}

impl Cpu {
    /// Process `pid` (all its threads).
    pub fn process(pid: u32) -> Cpu {
        Cpu::at(PathBuf::from(format!("/proc/{pid}/stat")))
    }

    /// Thread `tid` of process `pid`.
    pub fn thread(pid: u32, tid: u32) -> Cpu {
        Cpu::at(PathBuf::from(format!("/proc/{pid}/task/{tid}/stat")))
    }

    fn at(stat: PathBuf) -> Cpu {
        let since = stat_cpu_secs(&stat);
        Cpu { stat, since }
    }

    /// Seconds of CPU time used since this was made.
    pub fn used(&self) -> f64 {
        stat_cpu_secs(&self.stat) - self.since
    }
}

/// Waits until each `(cpu, secs)` has used `secs` of CPU time, or `timeout` passes; returns
/// the CPU seconds each used. Tests give a workload enough CPU time this way rather than a
/// fixed wall-clock time, so a sample count measures the sampler, not how loaded the machine
/// is.
pub fn wait_cpu(targets: &[(&Cpu, f64)], timeout: Duration) -> Vec<f64> {
    let t0 = Instant::now();
    loop {
        let used: Vec<f64> = targets.iter().map(|(c, _)| c.used()).collect();
        if used.iter().zip(targets).all(|(u, t)| *u >= t.1) || t0.elapsed() >= timeout {
            return used;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `pyebpf record` running with its debug line "sampling begins" watched: times in tests
/// count from when sampling began, not from the spawn (attaching, loading the eBPF programs
/// and scanning the host take seconds on a loaded machine).
pub struct Recorder {
    pub child: Child,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Recorder {
    /// Spawns `cmd` (a `pyebpf record …`; its stderr is taken) and waits up to a minute for
    /// sampling to begin.
    pub fn start(mut cmd: Command) -> Recorder {
        use std::io::BufRead as _;
        cmd.env("PYEBPF_LOG", "pyebpf::record::session=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut kept = String::new();
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if line.contains("sampling begins") {
                    let _ = tx.send(());
                } else {
                    kept.push_str(&line);
                    kept.push('\n');
                }
            }
            kept
        });
        let mut r = Recorder {
            child,
            stderr: Some(stderr),
        };
        if rx.recv_timeout(Duration::from_mins(1)).is_err() {
            let _ = r.child.kill();
            let status = r.child.wait();
            let err = r.stderr.take().map(|h| h.join().unwrap_or_default());
            panic!(
                "record never began sampling ({status:?}):\n{}",
                err.unwrap_or_default()
            );
        }
        r
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to `record`.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: signalling our own child, not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
    }

    /// Waits for `record` to exit: its status and its stderr (without the debug line).
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let st = self.child.wait().unwrap();
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (st, err)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.stderr.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
