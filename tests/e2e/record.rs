//! Issue 2 acceptance: `pyebpf record` on the real kernel — native stacks of a C program built
//! without frame pointers, host-wide recording, processes that start during a run, the lost
//! sample count, the three output formats, Ctrl-C, the user errors, and kernel frames.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{
    Cpu, Guard, Recorder, build_c, pyebpf, require_root, run, spawn_until, text, wait_cpu,
};

/// A fresh output directory for one test.
pub(crate) fn out_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pyebpf-e2e-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts the C workload `hot` (main → outer → middle → hot, spinning).
pub(crate) fn start_hot() -> Guard {
    let bin = build_c("native/hot.c", &[]);
    spawn_until(
        Command::new(bin).stdout(Stdio::null()),
        Duration::from_secs(5),
        |pid| {
            // Spinning: its utime advances.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok()
        },
    )
}

/// Parses folded stacks into (stack, count).
pub(crate) fn parse_folded(s: &str) -> Vec<(String, u64)> {
    s.lines()
        .map(|l| {
            let (stack, count) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad folded line: {l:?}"));
            (
                stack.to_string(),
                count
                    .parse()
                    .unwrap_or_else(|_| panic!("bad count in {l:?}")),
            )
        })
        .collect()
}

/// Samples whose root is `… (pid)`.
pub(crate) fn samples_of(folded: &[(String, u64)], pid: u32) -> Vec<(String, u64)> {
    let suffix = format!(" ({pid})");
    folded
        .iter()
        .filter(|(s, _)| {
            s.split(';')
                .next()
                .is_some_and(|root| root.ends_with(&suffix))
        })
        .cloned()
        .collect()
}

/// Fraction of samples whose stack contains `main;outer;middle;hot` in that order.
fn hot_fraction(samples: &[(String, u64)]) -> (u64, u64) {
    let total: u64 = samples.iter().map(|(_, c)| c).sum();
    let good: u64 = samples
        .iter()
        .filter(|(s, _)| s.contains(";main;outer;middle;hot"))
        .map(|(_, c)| c)
        .sum();
    (good, total)
}

pub(crate) fn lost_samples(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("lost samples:"))
        .unwrap_or_else(|| panic!("no lost-sample line in:\n{stderr}"));
    line.rsplit(':').next().unwrap().trim().parse().unwrap()
}

#[test]
fn native_stack_of_c_program_without_frame_pointers() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let dir = out_dir("native");
    let out = dir.join("hot.txt");
    let pid = hot.pid().to_string();
    let mut c = pyebpf(&[
        "record",
        "-p",
        &pid,
        "--native",
        "-f",
        "collapsed",
        "-d",
        "60",
        "-o",
    ]);
    c.arg(&out);
    let rec = Recorder::start(c);
    // 1.5 s of the program's CPU time while sampling: ~148 samples at 99 Hz.
    let used = wait_cpu(&[(&Cpu::process(hot.pid()), 1.5)], Duration::from_secs(40));
    rec.signal(libc::SIGINT);
    let (st, err) = rec.finish();
    assert!(st.success(), "record failed: {st}: {err}");
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let mine = samples_of(&folded, hot.pid());
    let (good, total) = hot_fraction(&mine);
    assert!(
        total >= 100,
        "too few samples of the C program: {total} ({:.2} s of CPU while sampling)\n{folded:?}",
        used[0]
    );
    assert!(
        good * 100 >= total * 90,
        "only {good}/{total} samples have main;outer;middle;hot:\n{folded:#?}"
    );
    assert_eq!(lost_samples(&err), 0, "lost samples at 99 Hz");
}

#[test]
fn all_processes_native_with_python_and_late_starter() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let py = spawn_until(
        Command::new("python3").args(["-c", "while True: pass"]),
        Duration::from_secs(5),
        |_| true,
    );
    let dir = out_dir("all");
    let out = dir.join("all.txt");
    let mut c = pyebpf(&[
        "record",
        "--all",
        "--native",
        "-f",
        "collapsed",
        "-d",
        "60",
        "-o",
    ]);
    c.arg(&out);
    let rec = Recorder::start(c);
    let since = [Cpu::process(hot.pid()), Cpu::process(py.pid())];
    // A process that starts 1 s after sampling began.
    std::thread::sleep(Duration::from_secs(1));
    let late = Guard(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    );
    // Each has 0.75 s of CPU while sampling (~74 samples at 99 Hz), the late one 0.4 s
    // (~40), however loaded the machine is.
    let used = wait_cpu(
        &[
            (&since[0], 0.75),
            (&since[1], 0.75),
            (&Cpu::process(late.pid()), 0.4),
        ],
        Duration::from_secs(40),
    );
    rec.signal(libc::SIGINT);
    let (st, err) = rec.finish();
    assert!(st.success(), "record failed: {st}: {err}");
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let (good, total) = hot_fraction(&samples_of(&folded, hot.pid()));
    assert!(
        total >= 50,
        "C program missing from --all: {total} samples ({:.2} s of CPU while sampling)",
        used[0]
    );
    assert!(
        good * 100 >= total * 90,
        "C stack wrong under --all: {good}/{total}"
    );
    let py_samples: u64 = samples_of(&folded, py.pid()).iter().map(|(_, c)| c).sum();
    assert!(
        py_samples >= 50,
        "busy python3 (pid {}) missing: {py_samples} samples ({:.2} s of CPU while sampling)",
        py.pid(),
        used[1]
    );
    let late_samples: u64 = samples_of(&folded, late.pid()).iter().map(|(_, c)| c).sum();
    assert!(
        late_samples >= 20,
        "process started during the run (pid {}) missing: {late_samples} samples ({:.2} s of CPU)",
        late.pid(),
        used[2]
    );
    assert!(
        folded
            .iter()
            .any(|(s, _)| s.starts_with(&format!("hot ({})", hot.pid()))),
        "root frame is not `hot (pid)`"
    );
    assert_eq!(lost_samples(&err), 0);
}

#[test]
fn output_formats_are_valid() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let dir = out_dir("formats");
    let pid = hot.pid().to_string();
    for (name, check) in [
        ("out.svg", check_svg as fn(&Path)),
        ("out.txt", check_collapsed as fn(&Path)),
        ("out.speedscope.json", check_speedscope as fn(&Path)),
    ] {
        let path = dir.join(name);
        let o = run(pyebpf(&["record", "-p", &pid, "--native", "-d", "2", "-o"]).arg(&path));
        assert!(
            o.status.success(),
            "record -o {name} failed: {}",
            text(&o.stderr)
        );
        check(&path);
    }
}

fn check_svg(path: &Path) {
    let svg = std::fs::read_to_string(path).unwrap();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    roxmltree::Document::parse_with_options(&svg, opts)
        .unwrap_or_else(|e| panic!("SVG is not well-formed XML: {e}"));
    for f in ["main", "outer", "middle", "hot"] {
        assert!(
            svg.contains(&format!(">{f}<")) || svg.contains(&format!("<title>{f} (")),
            "SVG lacks {f}"
        );
    }
}

fn check_collapsed(path: &Path) {
    let folded = parse_folded(&std::fs::read_to_string(path).unwrap());
    assert!(!folded.is_empty());
    assert!(
        folded
            .iter()
            .any(|(s, _)| s.contains("main;outer;middle;hot"))
    );
}

fn check_speedscope(path: &Path) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(
        v["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let frames = v["shared"]["frames"].as_array().expect("shared.frames");
    assert!(frames.iter().all(|f| f["name"].is_string()));
    let profiles = v["profiles"].as_array().expect("profiles");
    assert!(!profiles.is_empty());
    for p in profiles {
        assert_eq!(p["type"], "sampled");
        for key in [
            "name",
            "unit",
            "startValue",
            "endValue",
            "samples",
            "weights",
        ] {
            assert!(!p[key].is_null(), "profile lacks {key}");
        }
        let samples = p["samples"].as_array().unwrap();
        assert_eq!(samples.len(), p["weights"].as_array().unwrap().len());
        for s in samples {
            for i in s.as_array().unwrap() {
                assert!((i.as_u64().unwrap() as usize) < frames.len());
            }
        }
    }
}

#[test]
fn sigint_writes_what_was_collected() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let dir = out_dir("sigint");
    let out = dir.join("int.txt");
    let pid = hot.pid().to_string();
    let mut c = pyebpf(&["record", "-p", &pid, "-f", "collapsed", "-d", "60", "-o"]);
    c.arg(&out);
    let rec = Recorder::start(c);
    // SIGINT once the program has had 0.75 s of CPU since sampling began (~74 samples at
    // 99 Hz, however loaded the machine is).
    let used = wait_cpu(&[(&Cpu::process(hot.pid()), 0.75)], Duration::from_secs(40));
    rec.signal(libc::SIGINT);
    let t0 = std::time::Instant::now();
    let (st, err) = rec.finish();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "record did not stop promptly on SIGINT"
    );
    assert!(st.success(), "record after SIGINT: {st}: {err}");
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let n: u64 = samples_of(&folded, hot.pid()).iter().map(|(_, c)| c).sum();
    assert!(
        n >= 50,
        "only {n} samples written after SIGINT ({:.2} s of CPU while sampling)",
        used[0]
    );
}

#[test]
fn command_is_profiled_until_it_exits() {
    if !require_root() {
        return;
    }
    let dir = out_dir("cmd");
    let out = dir.join("cmd.txt");
    let o = run(pyebpf(&["record", "-f", "collapsed", "-o"])
        .arg(&out)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
        ]));
    assert!(o.status.success(), "record -- cmd: {}", text(&o.stderr));
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let n: u64 = folded
        .iter()
        .filter(|(s, _)| s.starts_with("sh ("))
        .map(|(_, c)| c)
        .sum();
    assert!(n >= 20, "the command's samples are missing: {folded:?}");
}

#[test]
fn kernel_frames_above_user_frames() {
    if !require_root() {
        return;
    }
    let bin = build_c("native/readloop.c", &[]);
    let rl = spawn_until(
        Command::new(bin).stdout(Stdio::null()),
        Duration::from_secs(5),
        |_| true,
    );
    let dir = out_dir("kernel");
    let out = dir.join("k.txt");
    let pid = rl.pid().to_string();
    let mut c = pyebpf(&[
        "record",
        "-p",
        &pid,
        "--native",
        "--kernel",
        "-f",
        "collapsed",
        "-d",
        "60",
        "-o",
    ]);
    c.arg(&out);
    let rec = Recorder::start(c);
    // 0.75 s of the loop's CPU time while sampled (~74 samples at 99 Hz).
    let used = wait_cpu(&[(&Cpu::process(rl.pid()), 0.75)], Duration::from_secs(40))[0];
    rec.signal(libc::SIGINT);
    let (st, err) = rec.finish();
    assert!(st.success(), "{st}: {err}");
    let folded = parse_folded(&std::fs::read_to_string(&out).unwrap());
    let mine = samples_of(&folded, rl.pid());
    let total: u64 = mine.iter().map(|(_, c)| c).sum();
    let with_read: u64 = mine
        .iter()
        .filter(|(s, _)| {
            let frames: Vec<&str> = s.split(';').collect();
            let k = frames
                .iter()
                .position(|f| *f == "vfs_read_[k]" || *f == "ksys_read_[k]");
            let m = frames.iter().position(|f| *f == "main");
            matches!((m, k), (Some(m), Some(k)) if m < k)
        })
        .map(|(_, c)| c)
        .sum();
    // The loop spends its time copying zeros in the kernel: most of its samples are there.
    assert!(
        total >= 50 && with_read * 2 >= total,
        "{with_read} of {total} samples ({used:.2} s of CPU) show main below \
         vfs_read/ksys_read:\n{mine:#?}"
    );
}

/// Runs a failing `record`; asserts one clear line mentioning `needle`, non-zero exit, and no
/// output file (nor temporary file) left behind.
fn expect_user_error(cmd: &mut Command, dir: &Path, needle: &str) {
    let o = run(cmd);
    let err = text(&o.stderr);
    // README: errors that stop `record` before sampling exit with status 1 (usage errors: 2).
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected status 1 ({needle}), got {}: {err}",
        o.status
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(
        lines[0].to_lowercase().contains(needle),
        "expected '{needle}' in: {}",
        lines[0]
    );
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn user_errors_before_sampling() {
    if !require_root() {
        return;
    }
    let dir = out_dir("errors");
    let out = dir.join("x.svg");
    // No such pid.
    expect_user_error(
        pyebpf(&["record", "-p", "999999999", "-d", "1", "-o"]).arg(&out),
        &dir,
        "no such process",
    );
    // Unwritable output path.
    expect_user_error(
        &mut pyebpf(&[
            "record",
            "--all",
            "-d",
            "1",
            "-o",
            "/proc/pyebpf-cannot-write/x.svg",
        ]),
        &dir,
        "cannot write",
    );
    // Not root: the real binary as nobody with no capabilities.
    let bin = crate::common::pyebpf_bin();
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ])
    .arg(&bin)
    .args([
        "record",
        "--all",
        "-d",
        "1",
        "-o",
        "/tmp/pyebpf-nobody-test.svg",
    ]);
    let o = run(&mut c);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "not root: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("root") || err.contains("CAP_BPF"), "{err}");
    assert!(!Path::new("/tmp/pyebpf-nobody-test.svg").exists());
    // An unsupported kernel (a kernel without BTF records: `pyrecord::kernel`).
    expect_user_error(
        pyebpf(&["record", "--all", "-d", "1", "-o"])
            .arg(&out)
            .env("PYEBPF_TEST_FAKE_KERNEL_RELEASE", "4.19.0"),
        &dir,
        "unsupported kernel",
    );
}
