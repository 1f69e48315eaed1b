//! `record` flags that no other test exercises, each with an assertion that fails when the flag
//! does nothing: `-r` (samples per second of CPU time), SIGTERM (stops and writes, like
//! Ctrl-C), `-q` (no progress line on a terminal), `-s` (children of `-p` targets),
//! `--stack-size` (how much user stack `--native` copies), `--ring-size` (losses counted), and
//! flame-graph widths against the counts. Runs last until the workloads had
//! enough CPU time while sampled, not a fixed wall-clock time (see `common::wait_cpu`).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{
    Cpu, Guard, Recorder, build_c, pyebpf, require_root, run, spawn_until, text, wait_cpu,
};
use crate::record::{lost_samples, out_dir, parse_folded, samples_of, start_hot};

/// Samples of `pid` in a collapsed file.
fn count_of(out: &std::path::Path, pid: u32) -> u64 {
    let folded = parse_folded(&std::fs::read_to_string(out).unwrap());
    samples_of(&folded, pid).iter().map(|(_, c)| c).sum()
}

/// `record -p PID -r RATE` until the program had `cpu` s of CPU time: its samples per CPU
/// second are the rate (within 25 %: CPU time is read in 10 ms ticks, and the signal lands
/// within a 50 ms poll).
fn rate_run(rate: u64, cpu: f64) {
    let hot = start_hot();
    let dir = out_dir(&format!("rate-{rate}"));
    let out = dir.join("r.txt");
    let pid = hot.pid().to_string();
    let r = rate.to_string();
    let mut c = pyebpf(&[
        "record",
        "-p",
        &pid,
        "-r",
        &r,
        "-f",
        "collapsed",
        "-d",
        "60",
        "-o",
    ]);
    c.arg(&out);
    let rec = Recorder::start(c);
    let used = wait_cpu(&[(&Cpu::process(hot.pid()), cpu)], Duration::from_secs(40))[0];
    rec.signal(libc::SIGINT);
    let (st, err) = rec.finish();
    assert!(st.success(), "record -r {rate}: {st}: {err}");
    let n = count_of(&out, hot.pid());
    let per_cpu_s = n as f64 / used;
    eprintln!("-r {rate}: {n} samples in {used:.2} s of CPU: {per_cpu_s:.0} per CPU second");
    assert!(
        (0.75..=1.25).contains(&(per_cpu_s / rate as f64)),
        "-r {rate}: {n} samples in {used:.2} s of the program's CPU time ({per_cpu_s:.0}/s)"
    );
    assert_eq!(lost_samples(&err), 0, "-r {rate}: {err}");
}

#[test]
fn record_rate_sets_samples_per_cpu_second() {
    if !require_root() {
        return;
    }
    rate_run(499, 0.5);
    rate_run(49, 1.5);
}

/// SIGTERM stops `record` like Ctrl-C: status 0, the samples so far written.
#[test]
fn sigterm_writes_what_was_collected() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let dir = out_dir("sigterm");
    let out = dir.join("term.txt");
    let pid = hot.pid().to_string();
    let mut c = pyebpf(&["record", "-p", &pid, "-f", "collapsed", "-d", "60", "-o"]);
    c.arg(&out);
    let rec = Recorder::start(c);
    let used = wait_cpu(&[(&Cpu::process(hot.pid()), 0.75)], Duration::from_secs(40))[0];
    rec.signal(libc::SIGTERM);
    let t0 = std::time::Instant::now();
    let (st, err) = rec.finish();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "record did not stop promptly on SIGTERM"
    );
    assert!(st.success(), "record after SIGTERM: {st}: {err}");
    let n = count_of(&out, hot.pid());
    assert!(
        n >= 50,
        "only {n} samples written after SIGTERM ({used:.2} s of CPU while sampling)"
    );
}

/// Runs `pyebpf record ARGS` on a pseudo-terminal (`script`), returns what it showed.
fn on_terminal(args: &[&str]) -> String {
    let bin = crate::common::pyebpf_bin();
    let line = std::iter::once(bin.to_string_lossy().into_owned())
        .chain(args.iter().map(|a| (*a).to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let o = run(Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .stdin(Stdio::null()));
    assert!(o.status.success(), "{line}: {}", text(&o.stderr));
    text(&o.stdout)
}

/// The progress line shows on a terminal, and `-q` removes it.
#[test]
fn quiet_removes_the_progress_line_on_a_terminal() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let dir = out_dir("quiet");
    let pid = hot.pid().to_string();
    let (a, b) = (dir.join("a.txt"), dir.join("b.txt"));
    let shown = on_terminal(&["record", "-p", &pid, "-d", "3", "-o", a.to_str().unwrap()]);
    assert!(
        shown.contains("recording: "),
        "no progress line on a terminal:\n{shown}"
    );
    let quiet = on_terminal(&[
        "record",
        "-q",
        "-p",
        &pid,
        "-d",
        "3",
        "-o",
        b.to_str().unwrap(),
    ]);
    assert!(
        !quiet.contains("recording: "),
        "-q still shows the progress line:\n{quiet}"
    );
    assert!(quiet.contains("samples"), "-q keeps the summary:\n{quiet}");
    assert!(a.is_file() && b.is_file());
}

/// A shell that starts a spinning child once `go` exists, and waits for it.
fn parent_of_spinner(go: &std::path::Path) -> Guard {
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; sh -c 'while :; do :; done' & wait",
        go.display()
    );
    spawn_until(
        Command::new("sh").args(["-c", &script]),
        Duration::from_secs(5),
        |_| true,
    )
}

/// The spinning child of `pid` (waiting up to 10 s for it; not the polling loop's `sleep`).
fn spinner_child_of(pid: u32) -> u32 {
    let t0 = std::time::Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let spinner = children.split_whitespace().find(|c| {
            std::fs::read(format!("/proc/{c}/cmdline"))
                .is_ok_and(|l| String::from_utf8_lossy(&l).contains("while :"))
        });
        if let Some(c) = spinner {
            return c.parse().unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{pid} has no spinning child"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills a process that is not our child (the shell's) on drop.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid we saw as the test shell's child.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

/// `-s`: a child forked by a `-p` target while sampling is sampled; without `-s` it is not.
#[test]
fn subprocesses_of_a_pid_are_followed_with_s() {
    if !require_root() {
        return;
    }
    for follow in [true, false] {
        let dir = out_dir(&format!("subprocesses-{follow}"));
        let go = dir.join("go");
        let parent = parent_of_spinner(&go);
        let out = dir.join("s.txt");
        let pid = parent.pid().to_string();
        let mut args = vec!["record", "-p", &pid, "-f", "collapsed", "-d", "60"];
        if follow {
            args.push("-s");
        }
        let mut c = pyebpf(&args);
        c.arg("-o").arg(&out);
        let rec = Recorder::start(c);
        // The child forks after sampling began.
        std::fs::write(&go, "").unwrap();
        let child = spinner_child_of(parent.pid());
        let _kill = KillOnDrop(child);
        let used = wait_cpu(&[(&Cpu::process(child), 0.5)], Duration::from_secs(40))[0];
        rec.signal(libc::SIGINT);
        let (st, err) = rec.finish();
        assert!(st.success(), "record -s={follow}: {st}: {err}");
        let n = count_of(&out, child);
        if follow {
            assert!(
                n >= 30,
                "-s: the child {child} of {pid} has {n} samples ({used:.2} s of CPU)\n{}",
                std::fs::read_to_string(&out).unwrap()
            );
        } else {
            assert_eq!(n, 0, "without -s the child {child} of {pid} was sampled");
        }
    }
}

/// Share of the samples of `pid` in `out` whose stack reaches `main`.
fn reaching_main(out: &std::path::Path, pid: u32) -> (u64, u64) {
    let folded = parse_folded(&std::fs::read_to_string(out).unwrap());
    let mine = samples_of(&folded, pid);
    let total = mine.iter().map(|(_, c)| c).sum();
    let main = mine
        .iter()
        .filter(|(s, _)| s.split(';').any(|f| f == "main"))
        .map(|(_, c)| c)
        .sum();
    (main, total)
}

/// `--stack-size`: `main` sits ~41 KiB above the spinning frame of `deepstack`: a 64 KiB copy
/// unwinds to it, an 8 KiB one cannot.
#[test]
fn stack_size_bounds_the_native_unwind() {
    if !require_root() {
        return;
    }
    let bin = build_c("native/deepstack.c", &[]);
    let deep = spawn_until(
        Command::new(bin).stdout(Stdio::null()),
        Duration::from_secs(5),
        |_| true,
    );
    let pid = deep.pid().to_string();
    let dir = out_dir("stack-size");
    for (size, reaches) in [("65536", true), ("8192", false)] {
        let out = dir.join(format!("{size}.txt"));
        let mut c = pyebpf(&[
            "record",
            "-p",
            &pid,
            "--native",
            "--stack-size",
            size,
            "-f",
            "collapsed",
            "-d",
            "60",
            "-o",
        ]);
        c.arg(&out);
        let rec = Recorder::start(c);
        wait_cpu(&[(&Cpu::process(deep.pid()), 0.5)], Duration::from_secs(40));
        rec.signal(libc::SIGINT);
        let (st, err) = rec.finish();
        assert!(st.success(), "--stack-size {size}: {st}: {err}");
        let (main, total) = reaching_main(&out, deep.pid());
        assert!(total >= 30, "--stack-size {size}: {total} samples");
        if reaches {
            assert!(
                main * 100 >= total * 90,
                "--stack-size {size}: only {main}/{total} samples unwind to main"
            );
        } else {
            assert!(
                main * 100 <= total * 5,
                "--stack-size {size}: {main}/{total} samples unwind to main through 41 KiB of \
                 stack"
            );
        }
    }
}

/// `want` (count per depth and frame name) as an image with a height cap draws it: from the
/// depth of a `[deeper frames not shown]` box in `got` on, a stack's frames are that one box.
fn capped(
    want: BTreeMap<(usize, String), u64>,
    got: &BTreeMap<(usize, String), u64>,
    folded: &[(String, u64)],
) -> BTreeMap<(usize, String), u64> {
    let Some(cap) = got
        .keys()
        .filter(|(_, name)| name == DEEPER)
        .map(|(depth, _)| *depth)
        .min()
    else {
        return want;
    };
    let mut capped: BTreeMap<(usize, String), u64> = want
        .into_iter()
        .filter(|((depth, _), _)| *depth < cap)
        .collect();
    let deeper: u64 = folded
        .iter()
        .filter(|(stack, _)| stack.split(';').count() >= cap)
        .map(|(_, n)| n)
        .sum();
    capped.insert((cap, DEEPER.to_string()), deeper);
    capped
}

/// The box the flame graph draws for the frames it cuts (its height cap).
const DEEPER: &str = "[deeper frames not shown]";

/// The flame graph of a run equals its collapsed stacks (both written by the same run): every
/// frame's `N samples` is its box's `fg:w`, its width is N / total of the image, and per depth
/// and name the counts add up to the collapsed stacks' counts with that frame at that depth.
#[test]
fn flame_graph_widths_match_the_counts() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let py = spawn_until(
        Command::new("python3").args(["-c", "while True: pass"]),
        Duration::from_secs(5),
        |_| true,
    );
    let dir = out_dir("widths");
    let (svg_path, txt) = (dir.join("run.svg"), dir.join("run.txt"));
    let (hot_pid, py_pid) = (hot.pid().to_string(), py.pid().to_string());
    let mut cmd = pyebpf(&[
        "record", "-p", &hot_pid, "-p", &py_pid, "--native", "-d", "60",
    ]);
    cmd.arg("-o").arg(&svg_path).arg("-o").arg(&txt);
    let rec = Recorder::start(cmd);
    wait_cpu(
        &[
            (&Cpu::process(hot.pid()), 0.5),
            (&Cpu::process(py.pid()), 0.5),
        ],
        Duration::from_secs(40),
    );
    rec.signal(libc::SIGINT);
    let (st, err) = rec.finish();
    assert!(st.success(), "{st}: {err}");
    let folded = parse_folded(&std::fs::read_to_string(&txt).unwrap());
    let total: u64 = folded.iter().map(|(_, c)| c).sum();
    let mut want: BTreeMap<(usize, String), u64> = BTreeMap::default();
    for (stack, n) in &folded {
        for (depth, f) in stack.split(';').enumerate() {
            *want.entry((depth + 1, f.to_string())).or_default() += n;
        }
    }
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, opts).unwrap();
    // (title, y, width %, fg:w) of every frame box.
    let mut boxes = Vec::new();
    for g in doc.descendants().filter(|n| n.has_tag_name("g")) {
        let (Some(title), Some(rect)) = (
            g.children().find(|n| n.has_tag_name("title")),
            g.children().find(|n| n.has_tag_name("rect")),
        ) else {
            continue;
        };
        let title = title.text().unwrap_or_default().to_string();
        let top: u64 = rect.attribute("y").unwrap().parse().unwrap();
        let width: f64 = rect
            .attribute("width")
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap();
        let weight: u64 = rect.attributes().find(|a| a.name() == "w").map_or_else(
            || panic!("no fg:w on {title}"),
            |a| a.value().parse().unwrap(),
        );
        boxes.push((title, top, width, weight));
    }
    let all = boxes
        .iter()
        .find(|b| b.0.starts_with("all ("))
        .expect("no `all` box");
    assert_eq!(all.3, total, "`all` is the collapsed total");
    let mut got: BTreeMap<(usize, String), u64> = BTreeMap::default();
    for (title, y, width, w) in &boxes {
        let (name, rest) = title.rsplit_once(" (").unwrap();
        let n: u64 = rest
            .split_once(' ')
            .unwrap()
            .0
            .replace(',', "")
            .parse()
            .unwrap();
        assert_eq!(n, *w, "{title}: title and fg:w");
        let share = 100.0 * *w as f64 / total as f64;
        assert!(
            (width - share).abs() < 0.01,
            "{title}: width {width}% for {w} of {total}"
        );
        if name != "all" {
            let depth = usize::try_from((all.1 - y) / 16).unwrap();
            *got.entry((depth, name.to_string())).or_default() += w;
        }
    }
    let want = capped(want, &got, &folded);
    assert_eq!(
        got, want,
        "flame graph boxes vs collapsed stacks, per depth and name"
    );
}

/// `--ring-size`: the smallest ring `--native --stack-size 65536` accepts (512 KiB: seven
/// samples of ~70 KiB) cannot hold 10 000 samples per second per CPU of a busy target, so
/// samples are lost and counted; sizes that are no power of two or hold fewer than four samples
/// are usage errors (status 2) before sampling.
#[test]
fn ring_size_bounds_the_ring_and_losses_are_counted() {
    if !require_root() {
        return;
    }
    let hot = start_hot();
    let pid = hot.pid().to_string();
    let dir = out_dir("ring-size");
    let out = dir.join("ring.txt");
    for (size, needle) in [
        ("262144", "invalid --ring-size 262144"),
        ("3000000", "invalid --ring-size 3000000"),
    ] {
        let o = run(pyebpf(&[
            "record",
            "-p",
            &pid,
            "--native",
            "--stack-size",
            "65536",
            "--ring-size",
            size,
            "-d",
            "1",
            "-o",
        ])
        .arg(&out));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--ring-size {size}: {err}");
        assert!(
            err.starts_with(&format!("pyebpf: {needle}")),
            "--ring-size {size}: {err}"
        );
        assert!(!out.exists(), "--ring-size {size} wrote a file");
    }
    let mut c = pyebpf(&[
        "record",
        "-p",
        &pid,
        "-r",
        "10000",
        "--native",
        "--stack-size",
        "65536",
        "--ring-size",
        "524288",
        "-f",
        "collapsed",
        "-d",
        "60",
        "-o",
    ]);
    c.arg(&out);
    let rec = Recorder::start(c);
    wait_cpu(&[(&Cpu::process(hot.pid()), 1.0)], Duration::from_secs(40));
    rec.signal(libc::SIGINT);
    let (st, err) = rec.finish();
    assert!(st.success(), "{st}: {err}");
    let lost = lost_samples(&err);
    assert!(lost > 0, "a 512 KiB ring at 10 kHz lost nothing:\n{err}");
    assert!(
        err.contains(&format!("lost_samples {lost}")),
        "the errors line counts the {lost} lost samples:\n{err}"
    );
    assert!(count_of(&out, hot.pid()) > 0, "{err}");
}
