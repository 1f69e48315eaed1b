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

/// Whether `s` holds a character no terminal or line format may get raw: C0 controls other
/// than the line feeds that end lines, DEL, C1 controls.
fn has_raw_control(s: &str) -> Option<char> {
    s.chars().find(|&c| c != '\n' && (c.is_control()))
}

#[test]
fn issue15_hostile_names_are_data() {
    let Some(interp) = crate::common::require_interpreter("3.12") else {
        return;
    };
    let w = crate::pyrecord::support::Workload::start(&interp, "hostile.py", &[], &[]);
    let pid = w.pid.to_string();
    // dump: no raw control character, the names still there, made printable.
    let o = run_within(&mut pyebpf(&["dump", "-p", &pid]), Duration::from_mins(1));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        has_raw_control(&out),
        None,
        "raw control character in dump:\n{out:?}"
    );
    assert!(out.contains("spin?[31m???FAKE (x.py:1);<x>&amp;"), "{out}");
    assert!(out.contains("evil?[2J???<file>&.py:3"), "{out}");
    assert!(out.contains("thr?]0;owned???FAKE Thread 1 <b>"), "{out}");
    // record: the flame graph is well-formed XML and shows the process; the folded stacks keep
    // one sample per line; the summary has no raw control character either.
    let d = private_dir("hostile");
    let (svg, txt) = (d.join("h.svg"), d.join("h.txt"));
    let o = run_within(
        pyebpf(&["record", "-q", "-p", &pid, "--threads", "-d", "2"])
            .arg("-o")
            .arg(&svg)
            .arg("-o")
            .arg(&txt),
        Duration::from_mins(1),
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        has_raw_control(&err),
        None,
        "raw control character on stderr:\n{err:?}"
    );
    let folded = std::fs::read_to_string(&txt).unwrap();
    assert_eq!(has_raw_control(&folded), None, "{folded:?}");
    let root = format!("ev?[2J???<x>& ({pid})");
    let mine: Vec<&str> = folded.lines().filter(|l| l.starts_with(&root)).collect();
    assert!(!mine.is_empty(), "no sample of {root:?}:\n{folded}");
    for l in &mine {
        let (stack, count) = l.rsplit_once(' ').unwrap();
        assert!(count.parse::<u64>().is_ok(), "{l:?}");
        assert!(stack.split(';').count() >= 2, "{l:?}");
    }
    assert!(
        mine.iter()
            .any(|l| l.contains(";spin?[31m???FAKE (x.py:1):<x>&amp: (evil?[2J???<file>&.py:3)")),
        "{mine:?}"
    );
    let doc = std::fs::read_to_string(&svg).unwrap();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let xml = roxmltree::Document::parse_with_options(&doc, opts)
        .unwrap_or_else(|e| panic!("the flame graph is not well-formed XML: {e}"));
    let titles: Vec<String> = xml
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text().map(str::to_string))
        .collect();
    assert!(
        titles.iter().any(|t| t.starts_with(&root)),
        "no <title> of the process {root:?} in the flame graph"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Every bad input: one line, the documented status, no file, never a panic.
#[test]
fn issue15_bad_inputs_one_line_documented_status_no_file() {
    if !require_root() {
        return;
    }
    let target = spinner();
    let t = target.pid().to_string();
    // A zombie: a child that exits and is never reaped by its parent.
    let mut parent = Command::new("perl")
        .args([
            "-e",
            "$| = 1; my $p = fork; if ($p == 0) { exit 0 } print \"$p\\n\"; sleep 60",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(parent.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let zombie = line.trim().to_string();
    let t0 = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{zombie}/stat")).is_ok_and(|s| s.contains(") Z"))
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "no zombie");
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = private_dir("bad-input");
    let out = d.join("out.svg");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["-p", &t, "-d", "1e20"], 2, "invalid duration"),
        (&["-p", &t, "-d", "-1"], 2, "invalid duration -1"),
        (&["-p", &t, "-d", "inf"], 2, "invalid duration"),
        (&["-p", &t, "-r", "0"], 2, "invalid rate 0"),
        (&["-p", &t, "-r", "1e20"], 2, "'--rate <HZ>'"),
        (&["-p", &t, "-r", "20000"], 2, "invalid rate 20000"),
        (
            &["-p", &t, "--stack-size", "1e20"],
            2,
            "'--stack-size <BYTES>'",
        ),
        (
            &["-p", &t, "--stack-size", "100000"],
            2,
            "invalid --stack-size 100000",
        ),
        (
            &["-p", &t, "--native", "--stack-size", "0"],
            2,
            "invalid --stack-size 0",
        ),
        (&["-p", "0", "-d", "1"], 1, "no such process: 0"),
        (&["-p", "2", "-d", "1"], 1, "kernel thread"),
        (&["-p", &zombie, "-d", "1"], 1, "zombie"),
        (
            &["-d", "1", "--", "/nonexistent-pyebpf"],
            1,
            "cannot start /nonexistent-pyebpf",
        ),
        (
            &["-d", "1", "--", "/etc/passwd"],
            1,
            "cannot start /etc/passwd: Permission denied",
        ),
    ];
    for (args, status, needle) in cases {
        let mut c = pyebpf(&["record"]);
        c.arg("-o").arg(&out).args(*args);
        let o = run_within(&mut c, Duration::from_secs(30));
        let err = text(&o.stderr);
        let what = format!("record {args:?}");
        assert_eq!(o.status.code(), Some(*status), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: not one line:\n{err}");
        assert!(
            err.starts_with("pyebpf: ") && err.contains(needle),
            "{what}: {err}"
        );
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert!(left.is_empty(), "{what}: left {left:?}");
    }
    let _ = parent.kill();
    let _ = parent.wait();
    let _ = std::fs::remove_dir_all(&d);
}

/// `report` of a saved profile: status, the incomplete warning (if any), the sample count.
fn saved_samples(path: &Path) -> (bool, u64) {
    let o = run_within(
        &mut pyebpf(&["report", path.to_str().unwrap()]),
        Duration::from_mins(1),
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "report {}: {err}", path.display());
    let n = out
        .lines()
        .find_map(|l| l.strip_prefix("# samples: "))
        .unwrap_or_else(|| panic!("no sample count in\n{out}"))
        .trim()
        .parse()
        .unwrap();
    (err.contains("incomplete"), n)
}

/// Whatever files a run left are complete: the SVG parses, the folded lines parse, nothing
/// else (no temporary file) is in the directory.
fn assert_complete_files(d: &Path, allowed: &[&str]) {
    for e in std::fs::read_dir(d).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(allowed.contains(&name.as_str()), "left behind: {name}");
    }
    let svg = d.join("run.svg");
    if svg.exists() {
        let doc = std::fs::read_to_string(&svg).unwrap();
        let opts = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..roxmltree::ParsingOptions::default()
        };
        roxmltree::Document::parse_with_options(&doc, opts)
            .unwrap_or_else(|e| panic!("run.svg is incomplete: {e}"));
    }
    let txt = d.join("run.txt");
    if txt.exists() {
        for l in std::fs::read_to_string(&txt).unwrap().lines() {
            let (_, count) = l.rsplit_once(' ').unwrap();
            assert!(count.parse::<u64>().is_ok(), "run.txt: {l:?}");
        }
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, sig) };
}

#[test]
fn issue15_sighup_double_ctrl_c_and_sigkill_keep_complete_files() {
    if !require_root() {
        return;
    }
    let _target = spinner();
    let outs = ["run.pyebpf", "run.svg", "run.txt", "run.speedscope.json"];
    let start = |d: &Path, rate: &str| {
        let mut c = pyebpf(&["record", "-q", "--all", "-r", rate]);
        for o in outs {
            c.arg("-o").arg(d.join(o));
        }
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    // SIGHUP: like Ctrl-C, everything written.
    let d = private_dir("sighup");
    let child = start(&d, "99");
    std::thread::sleep(Duration::from_secs(3));
    signal(child.id(), libc::SIGHUP);
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("stopped early"), "{err}");
    for f in outs {
        assert!(d.join(f).exists(), "SIGHUP: {f} missing:\n{err}");
    }
    assert_complete_files(&d, &outs);
    let (incomplete, n) = saved_samples(&d.join("run.pyebpf"));
    assert!(
        !incomplete && n > 0,
        "SIGHUP: {n} samples, incomplete {incomplete}"
    );
    // Two Ctrl-C: the second one while the files are written.
    let d = private_dir("twice");
    let mut child = start(&d, "2000");
    std::thread::sleep(Duration::from_secs(4));
    signal(child.id(), libc::SIGINT);
    // The summary is printed just before the files are written.
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !text(&seen).contains("lost samples:") {
        let n = std::io::Read::read(&mut stderr, &mut buf).unwrap();
        assert!(n > 0, "record ended before its summary: {}", text(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    signal(child.id(), libc::SIGINT);
    let t0 = Instant::now();
    let status = child.wait().unwrap();
    std::io::Read::read_to_end(&mut stderr, &mut seen).unwrap();
    let err = text(&seen);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "record kept writing: {err}"
    );
    assert!(
        status.code().is_some(),
        "killed by the second Ctrl-C: {err}"
    );
    if !status.success() {
        assert!(
            err.contains("interrupted by a second signal: not written"),
            "{err}"
        );
    }
    assert_complete_files(&d, &outs);
    let (incomplete, n) = saved_samples(&d.join("run.pyebpf"));
    assert!(!incomplete && n > 0, "{n} samples");
    // SIGKILL during sampling: the saved profile loads with the samples of its chunks.
    let d = private_dir("sigkill");
    let mut child = start(&d, "99");
    std::thread::sleep(Duration::from_secs(4));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_complete_files(&d, &["run.pyebpf"]);
    let (incomplete, n) = saved_samples(&d.join("run.pyebpf"));
    assert!(incomplete, "a killed run's file says it is incomplete");
    // About 3 s of the spinner at 99 Hz were streamed before the kill.
    assert!(n >= 100, "only {n} samples kept after SIGKILL");
    for d in ["sighup", "twice", "sigkill"] {
        let _ = std::fs::remove_dir_all(private_dir(d));
    }
}

/// CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, SYS_PTRACE, CHECKPOINT_RESTORE.
const KEPT_CAPS: u64 = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 19) | (1 << 40);

#[test]
fn issue15_capabilities_are_dropped_after_attach() {
    let Some(interp) = crate::common::require_interpreter("3.12") else {
        return;
    };
    let w = crate::pyrecord::support::Workload::start(&interp, "rec_spin.py", &[], &[]);
    let d = private_dir("caps");
    let out = d.join("caps.txt");
    let mut c = pyebpf(&["record", "-q", "-p", &w.pid.to_string(), "-d", "4", "-o"]);
    c.arg(&out).stdout(Stdio::null()).stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let mut caps = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap() {
        let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
            .unwrap();
        caps.push(eff);
    }
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(caps.len() >= 2, "threads: {caps:x?}");
    for eff in &caps {
        assert_eq!(*eff, KEPT_CAPS, "a thread kept {eff:#x}: {caps:x?}");
    }
    // Python frames were still read (ptrace kept), and the program's sizes still reported.
    let folded = std::fs::read_to_string(&out).unwrap();
    assert!(
        folded.contains(";spin ("),
        "no Python frame after the drop:\n{folded}"
    );
    assert!(!err.contains(" 0 bytes JIT-compiled"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn issue15_command_runs_as_the_sudo_user_and_is_stopped() {
    if !require_root() {
        return;
    }
    let d = shared_dir("cmd", 0o777);
    let report = d.join("who");
    let script = format!(
        "id -u > {0}; id -g >> {0}; echo \"$HOME\" >> {0}",
        report.display()
    );
    let sudo = |c: &mut Command| {
        c.env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534")
            .env("SUDO_USER", "nobody");
    };
    let out = d.join("cmd.txt");
    let mut c = pyebpf(&[
        "record",
        "-q",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    sudo(&mut c);
    let o = run_within(&mut c, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let who = std::fs::read_to_string(&report).unwrap();
    let home = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("nobody:"))
        .map(|rest| rest.split(':').nth(4).unwrap().to_string())
        .unwrap();
    assert_eq!(
        who,
        format!("65534\n65534\n{home}\n"),
        "the command's identity"
    );
    assert!(text(&o.stderr).contains("the command exited with status 0"));
    // --as-root keeps root.
    let mut c = pyebpf(&[
        "record",
        "-q",
        "--as-root",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    sudo(&mut c);
    let o = run_within(&mut c, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        std::fs::read_to_string(&report)
            .unwrap()
            .starts_with("0\n0\n")
    );
    // Stopped by -d: the command gets SIGINT (its trap runs) and is gone afterwards.
    let marker = d.join("got-int");
    let trap = format!(
        "trap 'echo INT > {}; exit 7' INT; while :; do sleep 0.05; done",
        marker.display()
    );
    let o = run_within(
        &mut pyebpf(&[
            "record",
            "-q",
            "-d",
            "1",
            "-o",
            out.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &trap,
        ]),
        Duration::from_secs(30),
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "INT\n");
    assert!(err.contains("the command exited with status 7"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn issue15_names_of_the_wrong_type_read_invalid_and_are_counted() {
    let Some(interp) = crate::common::require_interpreter("3.12") else {
        return;
    };
    let w = crate::pyrecord::support::Workload::start(&interp, "wrong_type.py", &[], &[]);
    let pid = w.pid.to_string();
    let o = run_within(&mut pyebpf(&["dump", "-p", &pid]), Duration::from_mins(1));
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(out.contains("    <invalid> ("), "{out}");
    assert!(out.contains("wrong_type="), "not counted:\n{out}");
    assert!(!out.contains("1234567891011"), "{out}");
    let d = private_dir("wrong-type");
    let txt = d.join("w.txt");
    let o = run_within(
        pyebpf(&["record", "-q", "-p", &pid, "-d", "2", "-o"]).arg(&txt),
        Duration::from_mins(1),
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let folded = std::fs::read_to_string(&txt).unwrap();
    assert!(folded.contains(";<invalid> ("), "{folded}");
    assert!(err.contains("python_wrong_type"), "not counted:\n{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn issue15_p_ends_when_its_targets_exit() {
    if !require_root() {
        return;
    }
    let d = private_dir("p-ends");
    let out = d.join("p.txt");
    // Without -d: the run ends with its target.
    let mut short = Command::new("sleep").arg("2").spawn().unwrap();
    let t0 = Instant::now();
    let o = run_within(
        &mut pyebpf(&[
            "record",
            "-q",
            "-p",
            &short.id().to_string(),
            "-o",
            out.to_str().unwrap(),
        ]),
        Duration::from_secs(20),
    );
    let _ = short.wait();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "record -p outlived its target"
    );
    assert!(text(&o.stderr).contains("Wrote collapsed stacks"));
    let _ = std::fs::remove_dir_all(&d);
}

/// Crafted saved files (huge counts, deep stacks, decompression bombs, long names in deep unique
/// stacks; format 2 and 1): `report`, `script` and `report -o` refuse each in one line, within
/// 1 GiB of address space and a few seconds, printing nothing and writing no file.
#[test]
fn issue15_crafted_saved_files_are_refused_within_bounds() {
    if !require_root() {
        return;
    }
    let d = private_dir("crafted");
    let o = Command::new("python3")
        .arg(crate::common::workload("crafted_saved.py"))
        .arg(&d)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let files: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 6, "{files:?}");
    let out = d.join("out.svg");
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            std::fs::metadata(f).unwrap().len() < 400_000,
            "{name} is not small"
        );
        for args in [
            vec!["report", f.to_str().unwrap()],
            vec!["script", f.to_str().unwrap()],
            vec!["report", f.to_str().unwrap(), "-o", out.to_str().unwrap()],
        ] {
            let mut c = Command::new("prlimit");
            c.arg(format!("--as={}", 1u64 << 30))
                .arg("--")
                .arg(crate::common::pyebpf_bin())
                .args(&args)
                .stdin(Stdio::null());
            let t0 = Instant::now();
            let o = run_within(&mut c, Duration::from_mins(1));
            let err = text(&o.stderr);
            let what = format!("{args:?}");
            assert_eq!(o.status.code(), Some(1), "{what}: {err}");
            assert_eq!(err.lines().count(), 1, "{what}: {err}");
            assert!(
                err.contains(&format!("{name}: truncated or corrupt: ")),
                "{what}: {err}"
            );
            assert!(
                o.stdout.is_empty(),
                "{what}: printed {} bytes",
                o.stdout.len()
            );
            assert!(!out.exists(), "{what}: wrote {}", out.display());
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: {:?}",
                t0.elapsed()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}
