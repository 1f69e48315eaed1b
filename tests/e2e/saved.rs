//! Issue 6, deliverable 1: the saved profile. One `record` run writes `run.pyebpf` and the
//! other formats at once (`-o` repeated); rendering the saved file afterwards with
//! `report FILE -f X -o Y` gives byte-identical files. A truncated file and a file with a
//! future format version each give one clear error line.

use std::path::Path;

use crate::common::{pyebpf, require_root, run, text};
use crate::pyrecord::support::{OutDir, Workload, parse_folded, setup};

/// The formats `record` writes directly and `report` renders from the saved file: (name for
/// `-f`, file name).
const RENDERED: [(&str, &str); 4] = [
    ("collapsed", "run.txt"),
    ("flamegraph", "run.svg"),
    ("speedscope", "run.speedscope.json"),
    ("pprof", "run.pb.gz"),
];

/// Runs `pyebpf ARGS` and asserts it succeeded; returns stderr.
fn ok(args: &[&str], dir: &Path) -> String {
    let o = run(pyebpf(args).current_dir(dir));
    let err = text(&o.stderr);
    assert!(
        o.status.success(),
        "`pyebpf {}` failed ({}):\n{err}",
        args.join(" "),
        o.status
    );
    err
}

/// Runs `pyebpf ARGS`, expecting exit status 1 and exactly one stderr line `pyebpf: …`
/// containing every one of `needles`; nothing on stdout.
fn fails(args: &[&str], dir: &Path, needles: &[&str]) {
    fails_with(1, args, dir, needles);
}

/// [`fails`] with exit status `status` (2: a usage error).
fn fails_with(status: i32, args: &[&str], dir: &Path, needles: &[&str]) {
    let o = run(pyebpf(args).current_dir(dir));
    let err = text(&o.stderr);
    let what = format!("`pyebpf {}`", args.join(" "));
    assert_eq!(
        o.status.code(),
        Some(status),
        "{what}: exit status; stderr:\n{err}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: want one stderr line, got:\n{err}");
    assert!(lines[0].starts_with("pyebpf: "), "{what}: {}", lines[0]);
    for n in needles {
        assert!(lines[0].contains(n), "{what}: want {n:?} in {:?}", lines[0]);
    }
    assert!(o.stdout.is_empty(), "{what}: stdout: {}", text(&o.stdout));
}

/// One `record` of a spinning Python thread (3.13) writes the saved profile, collapsed, SVG
/// and speedscope; `report run.pyebpf -f X -o Y` then reproduces each file byte for byte
/// (also by extension alone, and the saved file itself).
#[test]
fn rendering_the_saved_file_equals_writing_directly_3_13() {
    let Some(interp) = setup("3.13") else { return };
    let w = Workload::start(&interp, "rec_spin.py", &[], &[]);
    let dir = OutDir::new("saved");
    let pid = w.pid.to_string();
    let mut args = vec![
        "record",
        "--full-filenames",
        "-p",
        &pid,
        "-t",
        "-d",
        "3",
        "-o",
        "run.pyebpf",
    ];
    for (_, file) in RENDERED {
        args.extend(["-o", file]);
    }
    let err = ok(&args, &dir.0);
    for (what, file) in [
        ("saved profile", "run.pyebpf"),
        ("collapsed stacks", "run.txt"),
        ("flame graph", "run.svg"),
        ("speedscope profile", "run.speedscope.json"),
        ("pprof profile", "run.pb.gz"),
    ] {
        let line = format!("Wrote {what} to {file}");
        assert_eq!(
            err.lines().filter(|l| *l == line).count(),
            1,
            "want the line {line:?} once in:\n{err}"
        );
    }

    // A real run: the spinning thread's Python frames are in it.
    let folded = parse_folded(&std::fs::read_to_string(dir.join("run.txt")).unwrap());
    let spin = w.label("spin", "spin");
    let spinning: u64 = folded
        .iter()
        .filter(|s| s.frames.contains(&spin))
        .map(|s| s.count)
        .sum();
    assert!(
        spinning >= 30,
        "only {spinning} samples at {spin} in 3 s; collapsed output:\n{}",
        std::fs::read_to_string(dir.join("run.txt")).unwrap()
    );

    let saved = std::fs::read(dir.join("run.pyebpf")).unwrap();
    let samples: u64 = folded.iter().map(|s| s.count).sum();
    eprintln!(
        "run.pyebpf: {} bytes for {samples} samples ({:.1} bytes/sample)",
        saved.len(),
        saved.len() as f64 / samples as f64
    );
    for (format, file) in RENDERED {
        let direct = std::fs::read(dir.join(file)).unwrap();
        let by_flag = format!("re-{format}-{file}");
        // `record --full-filenames` above: the saved file keeps both forms, `report` is told.
        ok(
            &[
                "report",
                "run.pyebpf",
                "--full-filenames",
                "-f",
                format,
                "-o",
                &by_flag,
            ],
            &dir.0,
        );
        let by_ext = format!("re-{file}");
        ok(
            &["report", "run.pyebpf", "--full-filenames", "-o", &by_ext],
            &dir.0,
        );
        for name in [by_flag, by_ext] {
            let rendered = std::fs::read(dir.join(&name)).unwrap();
            assert!(
                rendered == direct,
                "{name} (report of run.pyebpf, {} bytes) differs from {file} (written by \
                 record, {} bytes)",
                rendered.len(),
                direct.len()
            );
        }
    }
    // Saving the loaded profile again keeps every sample (in fewer chunks than the stream
    // `record` wrote), and saving that again gives the same file.
    ok(&["report", "run.pyebpf", "-o", "again.pyebpf"], &dir.0);
    let script = |f: &str| run(pyebpf(&["script", f]).current_dir(&dir.0)).stdout;
    assert!(script("again.pyebpf") == script("run.pyebpf"));
    ok(&["report", "again.pyebpf", "-o", "again2.pyebpf"], &dir.0);
    assert!(
        std::fs::read(dir.join("again2.pyebpf")).unwrap()
            == std::fs::read(dir.join("again.pyebpf")).unwrap()
    );
}

/// A truncated copy of a real `run.pyebpf`, one with a future format version and a file that
/// is not a saved profile each make `report` (and `script`) exit 1 with one line naming the
/// file and the problem; `-f` with several `-o` is refused in one line.
#[test]
fn damaged_saved_files_give_one_clear_line() {
    if !require_root() {
        return;
    }
    let dir = OutDir::new("saved-errors");
    ok(
        &[
            "record",
            "--all",
            "-d",
            "1",
            "-o",
            "run.pyebpf",
            "-o",
            "run.svg",
        ],
        &dir.0,
    );
    let saved = std::fs::read(dir.join("run.pyebpf")).unwrap();
    assert!(saved.len() > 12, "{} bytes", saved.len());

    std::fs::write(dir.join("trunc.pyebpf"), &saved[..20]).unwrap();
    let mut newer = saved.clone();
    newer[8..12].copy_from_slice(&9u32.to_le_bytes());
    std::fs::write(dir.join("newer.pyebpf"), &newer).unwrap();

    let cases: [(&str, &[&str]); 3] = [
        (
            "trunc.pyebpf",
            &["trunc.pyebpf: truncated or corrupt: no complete chunk"],
        ),
        (
            "newer.pyebpf",
            &[
                "newer.pyebpf: written by a newer pyebpf (format version 9; this pyebpf reads up to version 3)",
            ],
        ),
        ("run.svg", &["run.svg: not a pyebpf profile (bad magic)"]),
    ];
    for (file, needles) in cases {
        fails(&["report", file], &dir.0, needles);
        fails(
            &["report", file, "-f", "collapsed", "-o", "out.txt"],
            &dir.0,
            needles,
        );
        fails(&["script", file], &dir.0, needles);
        assert!(!dir.join("out.txt").exists(), "report left out.txt behind");
    }
    fails(
        &["report", "missing.pyebpf"],
        &dir.0,
        &["missing.pyebpf: cannot read: "],
    );
    fails_with(
        2,
        &[
            "record",
            "--all",
            "-d",
            "1",
            "-f",
            "collapsed",
            "-o",
            "a.txt",
            "-o",
            "b.txt",
        ],
        &dir.0,
        &["-f/--format needs a single -o"],
    );
    fails(
        &[
            "record",
            "--all",
            "-d",
            "1",
            "-o",
            "a.txt",
            "-o",
            "/proc/pyebpf-no/b.svg",
        ],
        &dir.0,
        &["cannot write /proc/pyebpf-no/b.svg: "],
    );
    assert!(
        !dir.join("a.txt").exists(),
        "record wrote a.txt before failing"
    );
}
