//! Issue 15 acceptance, output files: `record` and `report` run as root beside an unprivileged
//! attacker (`nobody`, through `setpriv`) who plants symlinks and FIFOs at the destination and
//! at the temporary names the old code used, in a 0777 and in a group-writable directory. The
//! victim stays unchanged, pyebpf neither hangs nor lies; `-o /dev/null` keeps the device,
//! `-o -` writes to stdout, a `sudo` run's files belong to the user with mode 0600.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Guard, pyebpf, require_root, text};

const NOBODY: u32 = 65534;

/// A fresh directory for one test, owned by root:nogroup with `mode`.
fn shared_dir(test: &str, mode: u32) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pyebpf-e2e-trust-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(0), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

/// Runs `args` as `nobody` (uid and gid 65534, no supplementary groups).
fn as_nobody(args: &[&str]) {
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .expect("setpriv (util-linux) not found");
    assert!(
        o.status.success(),
        "as nobody {args:?}: {}",
        text(&o.stderr)
    );
}

/// A root-owned 0600 file in a private directory: what the attacker wants to destroy.
fn victim(test: &str) -> PathBuf {
    let v = private_dir(&format!("victim-{test}")).join("victim");
    std::fs::write(&v, b"root's secret\n").unwrap();
    std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o600)).unwrap();
    v
}

fn assert_victim_intact(v: &Path) {
    let m = std::fs::symlink_metadata(v).unwrap();
    assert!(m.is_file(), "victim replaced");
    assert_eq!(
        (m.uid(), m.mode() & 0o7777),
        (0, 0o600),
        "victim's owner or mode changed"
    );
    assert_eq!(
        std::fs::read(v).unwrap(),
        b"root's secret\n",
        "victim changed"
    );
}

/// A process to record: a shell spinning (its comm is `sh`).
fn spinner() -> Guard {
    Guard(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A fresh root-owned 0755 directory.
fn private_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pyebpf-e2e-private-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Runs a command with a deadline: it must neither hang nor take long.
fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{cmd:?} hung for {limit:?}; stderr: {}", text(&o.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn record(pid: u32, secs: &str, outs: &[&Path]) -> Command {
    let pid = pid.to_string();
    let mut c = pyebpf(&["record", "-q", "-p", &pid, "-d", secs]);
    for o in outs {
        c.arg("-o").arg(o);
    }
    c
}

/// One line on stderr, status 1, and nothing written.
fn assert_refused(o: &Output, what: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: not one line:\n{err}");
    assert!(err.starts_with("pyebpf: "), "{what}: {err}");
    assert!(!err.contains("Wrote"), "{what}: {err}");
}

/// The pids the kernel hands out next: where a pid-named temporary file would be guessed.
fn next_pids(n: u32) -> std::ops::Range<u32> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    last + 1..last + 1 + n
}

#[test]
fn issue15_planted_symlinks_and_fifos_change_nothing() {
    if !require_root() {
        return;
    }
    let target = spinner();
    for (test, mode) in [("o+w", 0o777), ("g+w", 0o775)] {
        let d = shared_dir(test, mode);
        let v = victim(test);
        let vs = v.to_str().unwrap();
        // A symlink at the destination, to root's file.
        let link = d.join("out.svg");
        as_nobody(&["ln", "-s", vs, link.to_str().unwrap()]);
        let o = run_within(
            &mut record(target.pid(), "1", &[&link]),
            Duration::from_secs(30),
        );
        assert_refused(&o, &format!("{test}: symlink at the destination"));
        assert!(text(&o.stderr).contains("symlink"), "{}", text(&o.stderr));
        assert_victim_intact(&v);
        // A FIFO at the destination: refused at once, not waited on.
        let fifo = d.join("out.txt");
        as_nobody(&["mkfifo", fifo.to_str().unwrap()]);
        let o = run_within(
            &mut record(target.pid(), "1", &[&fifo]),
            Duration::from_secs(30),
        );
        assert_refused(&o, &format!("{test}: FIFO at the destination"));
        // Links at every temporary name the old code could use (`.NAME.pyebpf-tmp.<pid>`),
        // and one planted at the destination while the run samples.
        let late = d.join("late.svg");
        for pid in next_pids(64) {
            let guess = d.join(format!(".late.svg.pyebpf-tmp.{pid}"));
            as_nobody(&["ln", "-s", vs, guess.to_str().unwrap()]);
        }
        let mut cmd = record(target.pid(), "3", &[&late]);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        as_nobody(&["ln", "-sf", vs, late.to_str().unwrap()]);
        let o = child.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert!(o.status.success(), "{test}: {err}");
        assert!(
            err.contains(&format!("Wrote flame graph to {}", late.display())),
            "{err}"
        );
        assert_victim_intact(&v);
        let m = std::fs::symlink_metadata(&late).unwrap();
        assert!(m.is_file(), "{test}: the planted link was not replaced");
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "{test}");
        assert!(
            std::fs::read_to_string(&late)
                .unwrap()
                .trim_end()
                .ends_with("</svg>")
        );
        // Nothing else was created in the directory.
        let extra: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| {
                !n.starts_with(".late.svg.pyebpf-tmp.")
                    && !["out.svg", "out.txt", "late.svg"].contains(&n.as_str())
            })
            .collect();
        assert!(extra.is_empty(), "{test}: left behind: {extra:?}");
        // `report -o` shares the rules.
        let saved_dir = private_dir(&format!("saved-{test}"));
        let saved = saved_dir.join("run.pyebpf");
        let o = run_within(
            &mut record(target.pid(), "1", &[&saved]),
            Duration::from_secs(30),
        );
        assert!(o.status.success(), "{}", text(&o.stderr));
        let o = run_within(
            pyebpf(&["report", saved.to_str().unwrap(), "-o"]).arg(&link),
            Duration::from_secs(30),
        );
        assert_refused(&o, &format!("{test}: report -o through a planted symlink"));
        assert_victim_intact(&v);
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(v.parent().unwrap());
        let _ = std::fs::remove_dir_all(&saved_dir);
    }
}

#[test]
fn issue15_devices_stdout_and_sudo_ownership() {
    if !require_root() {
        return;
    }
    let target = spinner();
    // /dev/null stays a device, and /dev/full reports its error.
    let o = run_within(
        &mut record(target.pid(), "1", &[Path::new("/dev/null")]),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let m = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &m.file_type()
    ));
    let o = run_within(
        &mut record(target.pid(), "1", &[Path::new("/dev/full")]),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("/dev/full"), "{}", text(&o.stderr));
    let m = std::fs::symlink_metadata("/dev/full").unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &m.file_type()
    ));
    // `-o -` and `-o /dev/stdout` write to our stdout.
    for dash in ["-", "/dev/stdout"] {
        let mut c = record(target.pid(), "1", &[Path::new(dash)]);
        c.args(["-f", "collapsed"]);
        let o = run_within(&mut c, Duration::from_secs(30));
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{err}");
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("sh ({})", target.pid())))
            .unwrap_or_else(|| {
                panic!("-o {dash}: no sample of the target on stdout: {out:?}\n{err}")
            });
        assert!(line.rsplit_once(' ').unwrap().1.parse::<u64>().is_ok());
        assert!(err.contains("Wrote collapsed stacks to"), "{err}");
    }
    assert!(
        std::fs::symlink_metadata("/dev/stdout")
            .unwrap()
            .is_symlink()
    );
    // A sudo run: its files (also the streamed saved profile) belong to the user, mode 0600.
    let d = shared_dir("sudo", 0o755);
    let (svg, saved) = (d.join("run.svg"), d.join("run.pyebpf"));
    let mut c = record(target.pid(), "1", &[&saved, &svg]);
    c.env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .env("SUDO_USER", "nobody");
    let o = run_within(&mut c, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    for f in [&svg, &saved] {
        let m = std::fs::metadata(f).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o777),
            (NOBODY, NOBODY, 0o600),
            "{}",
            f.display()
        );
    }
    // Without sudo: root's, 0600 whatever the umask.
    let plain = d.join("plain.svg");
    let o = run_within(
        &mut record(target.pid(), "1", &[&plain]),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let m = std::fs::metadata(&plain).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600));
    let _ = std::fs::remove_dir_all(&d);
}
