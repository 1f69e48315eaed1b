//! Running programs from xtask: every command that changes something is printed before it
//! runs, probes (`--version`, `dpkg-query`, ...) run quietly. Also: root detection, `sudo`
//! escalation, the workspace root, and phase timings.
use std::ffi::{OsStr, OsString};
use std::fmt::{Display, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

/// One line of progress: `[xtask] <step>: <message>`.
pub fn say(step: &str, msg: impl Display) {
    println!("[xtask] {step}: {msg}");
}

/// The checkout this xtask was built from (CI: the fresh clone).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Effective uid 0, read from `/proc/self/status` (no libc dependency for one syscall).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .is_some_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1))
                .is_some_and(|euid| euid == "0")
        })
}

/// First executable file named `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
}

/// `$CARGO_HOME` (cargo sets it for `cargo run`), else `~/.cargo`.
pub fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"),
        PathBuf::from,
    )
}

/// PATH with `$CARGO_HOME/bin` in front when it is missing: `cargo install` puts bpf-linker
/// there and `sampler-user/build.rs` must find it.
pub fn path_with_cargo_bin() -> OsString {
    let bin = cargo_home().join("bin");
    let old = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&old).any(|p| p == bin) {
        return old;
    }
    let mut paths = vec![bin];
    paths.extend(std::env::split_paths(&old));
    std::env::join_paths(paths).unwrap_or(old)
}

/// The cargo that runs us (`$CARGO`), so child builds use the same toolchain; it runs in the
/// workspace root whatever directory xtask was started from.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.env("PATH", path_with_cargo_bin())
        .current_dir(workspace_root());
    cmd
}

/// The workspace's target directory as cargo resolves it (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> Result<PathBuf> {
    let out = capture(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
    let meta: serde_json::Value = serde_json::from_str(&out).context("parsing `cargo metadata`")?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("no target_directory in `cargo metadata`")
}

/// A command with cargo's `cargo run` environment removed: interpreters and build scripts we
/// start must not see the Rust toolchain's `LD_LIBRARY_PATH`.
pub fn clean(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

/// A command that needs root: run directly as root, else through `sudo` (with `env` so that
/// `sudo`'s `secure_path` cannot drop the variables).
pub fn privileged(program: &str, envs: &[(&str, &OsStr)]) -> Result<Command> {
    if is_root() {
        let mut cmd = clean(program);
        cmd.envs(envs.iter().map(|(k, v)| (*k, *v)));
        return Ok(cmd);
    }
    let Some(sudo) = which("sudo") else {
        bail!("`{program}` needs root: run as root (there is no sudo on this machine)");
    };
    let mut cmd = clean(sudo);
    cmd.arg("env");
    for (k, v) in envs {
        let mut kv = OsString::from(k);
        kv.push("=");
        kv.push(v);
        cmd.arg(kv);
    }
    cmd.arg(program);
    Ok(cmd)
}

/// How a command is shown: program and arguments, plus the variables we set on it.
pub fn show(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v
            && k != "PATH"
        {
            let _ = write!(s, "{}={} ", k.to_string_lossy(), v.to_string_lossy());
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(char::is_whitespace) {
            let _ = write!(s, " '{a}'");
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Prints and runs `cmd` with inherited stdio; returns its status (spawn errors are errors).
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    println!("+ {}", show(cmd));
    cmd.status()
        .with_context(|| format!("could not start `{}`", cmd.get_program().to_string_lossy()))
}

/// Prints and runs `cmd`, its stdout passed through line by line; returns its status and the
/// lines that start with `prefix` (libtest's `test result:` lines).
pub fn status_tee(cmd: &mut Command, prefix: &str) -> Result<(ExitStatus, Vec<String>)> {
    use std::io::BufRead as _;
    println!("+ {}", show(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{}`", cmd.get_program().to_string_lossy()))?;
    let mut kept = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            if line.trim_start().starts_with(prefix) {
                kept.push(line);
            }
        }
    }
    Ok((child.wait()?, kept))
}

/// Prints and runs `cmd`; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let st = status(cmd)?;
    if !st.success() {
        bail!("`{}` failed ({st})", show(cmd));
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout, or `None` if it cannot start or exits non-zero.
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` quietly; its stdout, or an error carrying its stderr.
pub fn capture(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{}`", cmd.get_program().to_string_lossy()))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Re-runs this xtask under `sudo` (for `test` and `setup --interpreters`, which need root)
/// and exits with its status. Keeps the caller's toolchains and settings: PATH, cargo/rustup
/// homes, target dir, CI, and every `PYEBPF_*`/`PYENV_ROOT` variable.
pub fn reexec_as_root(why: &str) -> Result<std::convert::Infallible> {
    let Some(sudo) = which("sudo") else {
        bail!("{why} must run as root, and there is no sudo here: run it as root");
    };
    let exe = std::env::current_exe().context("path of the xtask binary")?;
    let mut cmd = Command::new(sudo);
    cmd.arg("env");
    let keep = |k: &str| {
        matches!(
            k,
            "PATH"
                | "CARGO"
                | "RUSTUP_HOME"
                | "RUSTUP_TOOLCHAIN"
                | "CARGO_TARGET_DIR"
                | "CI"
                | "PYENV_ROOT"
                | "MIRROR"
        ) || k.starts_with("PYEBPF_")
    };
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(keep) {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cmd.arg(kv);
        }
    }
    // Explicit even when unset: root's HOME would otherwise pick root's `~/.cargo`.
    let mut kv = OsString::from("CARGO_HOME=");
    kv.push(cargo_home());
    cmd.arg(kv).arg(exe).args(std::env::args_os().skip(1));
    say("root", format!("{why} needs root: re-running under sudo"));
    let st = status(&mut cmd)?;
    std::process::exit(st.code().unwrap_or(1));
}

/// Wall-clock time of each phase, printed as a table at the end of `setup` and `test`.
#[derive(Default)]
pub struct Timings(Vec<(String, Duration, String)>);

impl Timings {
    /// Runs `f` as phase `name` and records its duration and outcome.
    pub fn phase<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t0 = Instant::now();
        let r = f();
        // The reason goes into the timings table too: it is the last thing a CI log shows,
        // and the phase's own output may be far above it.
        let outcome = match &r {
            Ok(_) => "ok".to_owned(),
            Err(e) => {
                let why = format!("{e:#}").replace('\n', " ");
                let why: String = why.chars().take(300).collect();
                format!("FAILED: {why}")
            }
        };
        self.0.push((name.to_owned(), t0.elapsed(), outcome));
        r
    }

    pub fn print(&self, title: &str) {
        println!("[xtask] {title} timings:");
        for (name, d, outcome) in &self.0 {
            println!("[xtask]   {name:<28} {:>8.1}s  {outcome}", d.as_secs_f64());
        }
    }
}
