//! Unit tests of `report` on hand-built profiles whose numbers are worked out by hand in the
//! comments.

use serde_json::Value;

use super::{ReportConfig, ReportOptions, render};
use crate::profile::{Frame, FrameKind, GilState, NamedSample, Profile, RunMeta};

/// A frame description for [`add`].
#[derive(Clone, Copy)]
pub(super) enum F<'a> {
    /// Python `name (file:line)`.
    Py(&'a str, &'a str, u32),
    /// Native `name` in `module`.
    Native(&'a str, &'a str),
    /// Kernel `name`.
    Kernel(&'a str),
    /// Marker `name`.
    Marker(&'a str),
    /// Thread level `name (tid)` of `--threads`.
    Thread(&'a str, u32),
}

/// Who a sample is from.
#[derive(Clone, Copy)]
pub(super) struct Who<'a> {
    pub comm: &'a str,
    pub pid: u32,
    pub tid: u32,
    pub thread: &'a str,
}

pub(super) fn who(comm: &str, pid: u32, tid: u32) -> Who<'_> {
    Who {
        comm,
        pid,
        tid,
        thread: comm,
    }
}

pub(super) fn frame(f: F<'_>) -> Frame {
    match f {
        F::Py(name, file, line) => {
            let mut fr = Frame::new(FrameKind::Python, name);
            fr.file = Some(file.into());
            fr.line = Some(line);
            fr
        }
        F::Native(name, module) => {
            let mut fr = Frame::new(FrameKind::Native, name);
            fr.module = Some(module.into());
            fr
        }
        F::Kernel(name) => Frame::new(FrameKind::Kernel, name),
        F::Marker(name) => Frame::new(FrameKind::Marker, name),
        F::Thread(name, tid) => Frame::new(FrameKind::Thread, format!("{name} ({tid})")),
    }
}

/// Adds `n` samples of `w` with the stack `comm (pid)` + `frames` (root first).
pub(super) fn add(p: &mut Profile, w: Who<'_>, frames: &[F<'_>], n: u32) {
    let mut ids = vec![p.intern_frame(Frame::new(
        FrameKind::Process,
        format!("{} ({})", w.comm, w.pid),
    ))];
    ids.extend(frames.iter().map(|f| p.intern_frame(frame(*f))));
    let stack = p.intern_stack(&ids);
    for _ in 0..n {
        let t = p.sample_count();
        p.add_sample(NamedSample {
            stack,
            time_ns: 1_000_000_000 + t * 10_101_010,
            pid: w.pid,
            tid: w.tid,
            cpu: (t % 4) as u32,
            comm: w.comm.into(),
            thread_name: w.thread.into(),
            gil: GilState::Unknown,
            state: crate::profile::ThreadState::OnCpu,
            weight: 1,
        });
    }
}

pub(super) fn meta() -> RunMeta {
    RunMeta {
        host: "box".into(),
        kernel: "6.18.0".into(),
        start_unix_s: 1_709_251_199,
        duration_s: 2.5,
        rate_hz: 99,
        cpus: 4,
        command_line: vec!["pyebpf".into(), "record".into(), "--all".into()],
        lost_samples: 3,
        errors: crate::failure::Failures::default(),
        idle: false,
    }
}

/// Ten samples:
/// - app (10) tid 10: main → hot (libc)                      × 3
/// - app (10) tid 11: main → vfs_read (kernel)               × 1
/// - py (20) tid 20:  <module> (y.py:1) → f (y.py:3)         × 2
/// - py (20) tid 21 "worker": <module> → g (y.py:7) → hot    × 4
pub(super) fn ten() -> Profile {
    let mut p = Profile::new(meta());
    let main = F::Native("main", "app");
    let hot = F::Native("hot", "libc.so.6");
    let module = F::Py("<module>", "/x/y.py", 1);
    add(&mut p, who("app", 10, 10), &[main, hot], 3);
    add(
        &mut p,
        who("app", 10, 11),
        &[main, F::Kernel("vfs_read")],
        1,
    );
    add(
        &mut p,
        who("py", 20, 20),
        &[module, F::Py("f", "/x/y.py", 3)],
        2,
    );
    let worker = Who {
        thread: "worker",
        ..who("py", 20, 21)
    };
    add(&mut p, worker, &[module, F::Py("g", "/x/y.py", 7), hot], 4);
    p
}

fn opts(sort: &str) -> ReportOptions {
    ReportOptions {
        sort: sort.split(',').map(str::to_string).collect(),
        ..ReportOptions::default()
    }
}

fn run(p: &Profile, o: &ReportOptions) -> String {
    let mut out = Vec::new();
    render(p, &ReportConfig::new(o).unwrap(), &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn json(p: &Profile, o: &ReportOptions) -> Value {
    let o = ReportOptions {
        json: true,
        ..o.clone()
    };
    serde_json::from_str(&run(p, &o)).unwrap()
}

/// (keys joined by `|`, self samples, children samples) of every JSON row.
fn rows(p: &Profile, o: &ReportOptions) -> Vec<(String, u64, u64)> {
    let v = json(p, o);
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let keys: Vec<String> = key_values(&v, r);
            let samples = r["samples"].as_u64().unwrap();
            (
                keys.join("|"),
                samples,
                r.get("children").map_or(samples, |c| c.as_u64().unwrap()),
            )
        })
        .collect()
}

/// The key values of a JSON row in `--sort` order (`meta.sort`), as text.
fn key_values(doc: &Value, row: &Value) -> Vec<String> {
    doc["meta"]["sort"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| match &row["keys"][name.as_str().unwrap()] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

fn r(k: &str, s: u64, c: u64) -> (String, u64, u64) {
    (k.to_string(), s, c)
}

/// The body lines of a text report (no `#` lines).
fn body(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn self_overhead_by_process() {
    // py: 2 + 4 = 6 of 10; app: 3 + 1 = 4.
    let p = ten();
    assert_eq!(
        rows(&p, &opts("comm,pid")),
        vec![r("py|20", 6, 6), r("app|10", 4, 4)]
    );
    let v = json(&p, &opts("comm,pid"));
    assert_eq!(v["total"], 10);
    let sum: f64 = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["overhead"].as_f64().unwrap())
        .sum();
    assert!((sum - 100.0).abs() < 1e-9, "{sum}");
    assert_eq!(v["rows"][0]["keys"]["pid"], 20, "pid is a JSON number");
}

#[test]
fn self_overhead_by_leaf_function_module_srcline() {
    // Leaves: hot × (3 + 4), f × 2, vfs_read × 1.
    let p = ten();
    assert_eq!(
        rows(&p, &opts("function")),
        vec![
            r("[.] hot", 7, 7),
            r("[.] f", 2, 2),
            r("[k] vfs_read", 1, 1)
        ]
    );
    assert_eq!(
        rows(&p, &opts("module")),
        vec![
            r("libc.so.6", 7, 7),
            r("/x/y.py", 2, 2),
            r("[kernel.kallsyms]", 1, 1)
        ]
    );
    assert_eq!(
        rows(&p, &opts("srcline")),
        vec![
            r("libc.so.6", 7, 7),
            r("/x/y.py:3", 2, 2),
            r("[kernel.kallsyms]", 1, 1)
        ]
    );
    // comm,function: (py, hot) 4, (app, hot) 3, (py, f) 2, (app, vfs_read) 1.
    assert_eq!(
        rows(&p, &opts("comm,function")),
        vec![
            r("py|[.] hot", 4, 4),
            r("app|[.] hot", 3, 3),
            r("py|[.] f", 2, 2),
            r("app|[k] vfs_read", 1, 1)
        ]
    );
    // tid and thread: 21 "worker" 4, 10 "app" 3, 20 "py" 2, 11 "app" 1.
    assert_eq!(
        rows(&p, &opts("tid,thread")),
        vec![
            r("21|worker", 4, 4),
            r("10|app", 3, 3),
            r("20|py", 2, 2),
            r("11|app", 1, 1)
        ]
    );
}

#[test]
fn children_count_each_sample_once_per_key() {
    let p = ten();
    let mut o = opts("function");
    o.children = true;
    // hot 7 (self 7); <module> 6 (py's 2 + 4); main 4 and g 4 (self 0, tie by key: g < main);
    // f 2 (self 2); vfs_read 1 (self 1).
    assert_eq!(
        rows(&p, &o),
        vec![
            r("[.] hot", 7, 7),
            r("[.] <module>", 0, 6),
            r("[.] g", 0, 4),
            r("[.] main", 0, 4),
            r("[.] f", 2, 2),
            r("[k] vfs_read", 1, 1)
        ]
    );
    // Sample keys with frame keys, per frame: (py, <module>) 6; then 4s: (py, hot) self 4
    // first, then (app, main) and (py, g) by key; (app, hot) 3; (py, f) 2; (app, vfs_read) 1.
    let mut o = opts("comm,function");
    o.children = true;
    assert_eq!(
        rows(&p, &o),
        vec![
            r("py|[.] <module>", 0, 6),
            r("py|[.] hot", 4, 4),
            r("app|[.] main", 0, 4),
            r("py|[.] g", 0, 4),
            r("app|[.] hot", 3, 3),
            r("py|[.] f", 2, 2),
            r("app|[k] vfs_read", 1, 1)
        ]
    );
    // Only sample keys: children equal self.
    let mut o = opts("pid");
    o.children = true;
    assert_eq!(rows(&p, &o), vec![r("20", 6, 6), r("10", 4, 4)]);
}

#[test]
fn recursion_counts_once_in_children() {
    // a → b → a → c: the sample counts once for a under --children.
    let mut p = Profile::new(meta());
    let a = F::Native("a", "m");
    add(
        &mut p,
        who("x", 1, 1),
        &[a, F::Native("b", "m"), a, F::Native("c", "m")],
        5,
    );
    let mut o = opts("function");
    o.children = true;
    assert_eq!(
        rows(&p, &o),
        vec![r("[.] c", 5, 5), r("[.] a", 0, 5), r("[.] b", 0, 5)]
    );
}

#[test]
fn filters_apply_before_everything() {
    let p = ten();
    let mut o = opts("function");
    o.pids = vec![10];
    // app only: hot 3 of 4 (75 %), vfs_read 1 (25 %).
    let v = json(&p, &o);
    assert_eq!(v["total"], 4);
    assert_eq!(v["meta"]["samples"], 10);
    assert_eq!(
        rows(&p, &o),
        vec![r("[.] hot", 3, 3), r("[k] vfs_read", 1, 1)]
    );
    assert!((v["rows"][0]["overhead"].as_f64().unwrap() - 75.0).abs() < 1e-9);
    let text = run(&p, &o);
    assert!(text.contains("# samples: 4 of 10 after filters"), "{text}");
    assert!(text.contains("# filters: --pid 10"), "{text}");
    assert!(text.contains("# processes: 1 of 2"), "{text}");

    let mut o = opts("function");
    o.threads = vec!["worker".into()];
    assert_eq!(rows(&p, &o), vec![r("[.] hot", 4, 4)]);
    let mut o = opts("function");
    o.tids = vec![20, 11];
    assert_eq!(
        rows(&p, &o),
        vec![r("[.] f", 2, 2), r("[k] vfs_read", 1, 1)]
    );
    // Lists AND together: comm app and tid 20 match nothing.
    let mut o = opts("function");
    o.comms = vec!["app".into()];
    o.tids = vec![20];
    assert!(rows(&p, &o).is_empty());
    let text = run(&p, &o);
    assert!(text.contains("# samples: 0 of 10 after filters"), "{text}");
    assert!(text.ends_with("# no samples after filters\n"), "{text}");
}

#[test]
fn percent_limit_hides_rows() {
    let p = ten();
    let mut o = opts("function");
    o.percent_limit = 15.0;
    // hot 70 %, f 20 % shown; vfs_read 10 % hidden.
    assert_eq!(rows(&p, &o), vec![r("[.] hot", 7, 7), r("[.] f", 2, 2)]);
    assert_eq!(json(&p, &o)["hidden_rows"], 1);
    let text = run(&p, &o);
    assert_eq!(body(&text).len(), 2, "{text}");
    assert!(
        text.contains("# 1 rows under 15% not shown (--percent-limit)"),
        "{text}"
    );
    // With --children the limit applies to Children: main (40 %) stays at 40, goes at 41.
    let mut o = opts("function");
    o.children = true;
    o.percent_limit = 40.0;
    assert_eq!(
        rows(&p, &o),
        vec![
            r("[.] hot", 7, 7),
            r("[.] <module>", 0, 6),
            r("[.] g", 0, 4),
            r("[.] main", 0, 4)
        ]
    );
    o.percent_limit = 41.0;
    assert_eq!(rows(&p, &o).len(), 2);
}

#[test]
fn text_layout() {
    let p = ten();
    let mut o = opts("comm,pid,function");
    o.source = "run.pyebpf".into();
    let text = run(&p, &o);
    let expected = "\
# source: run.pyebpf
# samples: 10
# lost samples: 3
# duration: 2.50 s
# rate: 99 Hz per CPU
# CPUs: 4
# processes: 2
# host: box
# kernel: 6.18.0
# start: 2024-02-29 23:59:59 UTC
# command line: pyebpf record --all
#
# Overhead  Samples  Command  Pid  Symbol
# ........  .......  .......  ...  ............
#
    40.00%        4  py        20  [.] hot
    30.00%        3  app       10  [.] hot
    20.00%        2  py        20  [.] f
    10.00%        1  app       10  [k] vfs_read
";
    assert_eq!(text, expected);
    assert!(!text.contains('\x1b'), "no colour unless asked");
}

#[test]
fn colour_only_when_asked() {
    let p = ten();
    let mut o = opts("function");
    o.color = true;
    let text = run(&p, &o);
    assert!(text.contains("\x1b[31m70.00%\x1b[0m"), "{text}");
    assert!(text.contains("\x1b[31m10.00%\x1b[0m"), "{text}");
    // Not in JSON/CSV even when asked.
    o.csv = true;
    assert!(!run(&p, &o).contains('\x1b'));
    // Green from 0.5 % to 5 %: one sample of 100.
    let mut q = Profile::new(meta());
    add(&mut q, who("a", 1, 1), &[F::Native("big", "m")], 99);
    add(&mut q, who("a", 1, 1), &[F::Native("small", "m")], 1);
    let mut o = opts("function");
    o.color = true;
    let text = run(&q, &o);
    assert!(text.contains("\x1b[32m1.00%\x1b[0m"), "{text}");
}

#[test]
fn children_text_columns() {
    let p = ten();
    let mut o = opts("function");
    o.children = true;
    let text = run(&p, &o);
    assert!(
        text.contains("# Children    Self  Samples  Symbol\n"),
        "{text}"
    );
    assert!(
        text.contains("\n    60.00%   0.00%        6  [.] <module>\n"),
        "{text}"
    );
}

#[test]
fn caller_graph_root_to_leaf() {
    // Row hot (7): app (10) → main → hot × 3, py (20) → <module> → g → hot × 4.
    let p = ten();
    let mut o = opts("function");
    o.call_graph = Some("caller".into());
    o.percent_limit = 15.0;
    let text = run(&p, &o);
    let expected_hot = "\
    70.00%        7  [.] hot
             57.14%  py (20)
             57.14%  <module> (/x/y.py:1)
             57.14%  g (/x/y.py:7)
             57.14%  hot
             42.86%  app (10)
             42.86%  main
             42.86%  hot

    20.00%        2  [.] f
            100.00%  py (20)
            100.00%  <module> (/x/y.py:1)
            100.00%  f (/x/y.py:3)

";
    assert!(text.contains(expected_hot), "{text}");
}

#[test]
fn callee_graph_leaf_to_root() {
    // Row hot (7): hot → g → <module> → py × 4 and hot → main → app × 3; hot is one node.
    let p = ten();
    let mut o = opts("function");
    o.call_graph = Some("callee".into());
    let text = run(&p, &o);
    let expected = "\
    70.00%        7  [.] hot
            100.00%  hot
               57.14%  g (/x/y.py:7)
               57.14%  <module> (/x/y.py:1)
               57.14%  py (20)
               42.86%  main
               42.86%  app (10)

";
    assert!(text.contains(expected), "{text}");
}

#[test]
fn children_graph_caller_shows_callees() {
    // Row <module> (6) with --children: <module> → f × 2, <module> → g → hot × 4.
    let p = ten();
    let mut o = opts("function");
    o.children = true;
    o.call_graph = Some("caller".into());
    let text = run(&p, &o);
    let expected = "\
    60.00%   0.00%        6  [.] <module>
            100.00%  <module> (/x/y.py:1)
               66.67%  g (/x/y.py:7)
               66.67%  hot
               33.33%  f (/x/y.py:3)

";
    assert!(text.contains(expected), "{text}");
    // callee: <module> → py (20), all 6.
    o.call_graph = Some("callee".into());
    let text = run(&p, &o);
    let expected = "\
    60.00%   0.00%        6  [.] <module>
            100.00%  <module> (/x/y.py:1)
            100.00%  py (20)

";
    assert!(text.contains(expected), "{text}");
}

#[test]
fn graph_prunes_under_limit() {
    // Row hot: 199 via a, 1 via b (0.5 % of 200: kept at the default 0.5 %, pruned at 1 %).
    let mut p = Profile::new(meta());
    let hot = F::Native("hot", "m");
    add(&mut p, who("x", 1, 1), &[F::Native("a", "m"), hot], 199);
    add(&mut p, who("x", 1, 1), &[F::Native("b", "m"), hot], 1);
    let mut o = opts("function");
    o.call_graph = Some("callee".into());
    let text = run(&p, &o);
    assert!(text.contains("  0.50%  b\n"), "{text}");
    o.percent_limit = 1.0;
    let text = run(&p, &o);
    assert!(!text.contains("  b\n"), "{text}");
    assert!(text.contains(" 99.50%  a\n"), "{text}");
}

#[test]
fn graph_depth_and_lines_are_bounded() {
    // A 2000-frame stack: the tree keeps MAX_GRAPH_DEPTH frames, printed in bounded lines.
    let mut p = Profile::new(meta());
    let names: Vec<String> = (0..2000).map(|i| format!("f{i}")).collect();
    let frames: Vec<F<'_>> = names.iter().map(|n| F::Native(n, "m")).collect();
    add(&mut p, who("x", 1, 1), &frames, 1);
    let mut o = opts("function");
    o.call_graph = Some("caller".into());
    let text = run(&p, &o);
    let tree_lines = text
        .lines()
        .filter(|l| l.starts_with("            ") && l.contains("100.00%  "))
        .count();
    assert_eq!(tree_lines, super::table::MAX_GRAPH_DEPTH);
}

#[test]
fn root_only_stacks_are_unknown() {
    // A process with no frame under its root (and one with only a thread level).
    let mut p = Profile::new(meta());
    add(&mut p, who("idle", 30, 30), &[], 2);
    add(&mut p, who("t", 31, 32), &[F::Thread("t", 32)], 1);
    add(
        &mut p,
        who("t", 31, 32),
        &[F::Thread("t", 32), F::Marker("[truncated]")],
        1,
    );
    assert_eq!(
        rows(&p, &opts("function,module,srcline")),
        vec![
            r("[.] [unknown]|[unknown]|??", 3, 3),
            r("[.] [truncated]|[unknown]|??", 1, 1)
        ]
    );
    let mut o = opts("comm,function");
    o.children = true;
    o.call_graph = Some("caller".into());
    let text = run(&p, &o);
    assert!(text.contains("[.] [unknown]"), "{text}");
    assert!(text.contains("100.00%  idle (30)"), "{text}");
}

#[test]
fn empty_profile() {
    let p = Profile::new(RunMeta::default());
    let text = run(&p, &opts("comm"));
    assert!(text.contains("# samples: 0\n"), "{text}");
    assert!(text.contains("# start: unknown\n"), "{text}");
    assert!(text.ends_with("#\n# no samples\n"), "{text}");
    let v = json(&p, &opts("comm"));
    assert_eq!(v["total"], 0);
    assert_eq!(v["rows"].as_array().unwrap().len(), 0);
    let mut o = opts("comm,pid");
    o.csv = true;
    assert_eq!(run(&p, &o), "overhead,samples,comm,pid\n");
    let mut o = opts("function");
    o.call_graph = Some("callee".into());
    o.children = true;
    assert!(run(&p, &o).ends_with("# no samples\n"));
}

#[test]
fn json_and_csv_agree_with_text() {
    let p = ten();
    for sort in ["comm,pid", "function", "comm,function", "module,srcline"] {
        for children in [false, true] {
            let mut o = opts(sort);
            o.children = children;
            let text = run(&p, &o);
            let text_rows = body(&text);
            let v = json(&p, &o);
            o.csv = true;
            let csv = run(&p, &o);
            let csv_rows: Vec<&str> = csv.lines().skip(1).collect();
            let json_rows = v["rows"].as_array().unwrap();
            assert_eq!(text_rows.len(), json_rows.len(), "{sort}: {text}");
            assert_eq!(csv_rows.len(), json_rows.len(), "{sort}: {csv}");
            for ((t, j), c) in text_rows.iter().zip(json_rows).zip(&csv_rows) {
                let pct = format!("{:.2}%", j["overhead"].as_f64().unwrap());
                let samples = if children {
                    &j["children"]
                } else {
                    &j["samples"]
                };
                let mut want = vec![pct.clone(), samples.to_string()];
                if children {
                    let cpct = format!("{:.2}%", j["children_overhead"].as_f64().unwrap());
                    want = vec![cpct, pct.clone(), samples.to_string()];
                }
                want.extend(key_values(&v, j));
                let got: Vec<&str> = t
                    .split("  ")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                assert_eq!(got, want, "{sort} children={children}");
                assert!(
                    c.starts_with(&format!("{},{}", &pct[..pct.len() - 1], j["samples"])),
                    "{c}"
                );
            }
        }
    }
}

#[test]
fn csv_quotes_fields() {
    let mut p = Profile::new(meta());
    add(
        &mut p,
        who("a,b", 1, 1),
        &[F::Native("operator\"x\"", "m")],
        3,
    );
    add(&mut p, who("c", 2, 2), &[F::Native("line\nbreak", "m")], 1);
    let mut o = opts("comm,function");
    o.csv = true;
    assert_eq!(
        run(&p, &o),
        "overhead,samples,comm,function\n\
         75.00,3,\"a,b\",\"[.] operator\"\"x\"\"\"\n\
         25.00,1,c,\"[.] line\nbreak\"\n"
    );
    let mut o = opts("comm");
    o.children = true;
    o.csv = true;
    assert_eq!(
        run(&p, &o),
        "overhead,samples,children_overhead,children,comm\n\
         75.00,3,75.00,3,\"a,b\"\n25.00,1,25.00,1,c\n"
    );
}

#[test]
fn text_cleans_control_characters() {
    let mut p = Profile::new(meta());
    add(&mut p, who("a\x1b[2J", 1, 1), &[F::Native("x\ny", "m")], 1);
    p.meta.host = "h\x1bost".into();
    let text = run(&p, &opts("comm,function"));
    assert!(!text.contains('\x1b'), "{text:?}");
    assert!(text.contains("a?[2J"), "{text}");
    assert!(text.contains("[.] x?y"), "{text}");
    assert!(text.contains("# host: h?ost"), "{text}");
}

#[test]
fn header_lists_errors() {
    let mut p = ten();
    p.meta.errors.add(crate::failure::Failure::ProcessGone, 2);
    p.meta.errors.add(crate::failure::Failure::MergeMismatch, 5);
    let text = run(&p, &opts("comm"));
    assert!(
        text.contains("# errors: merge_mismatch 5, process_gone 2\n"),
        "{text}"
    );
    assert_eq!(
        json(&p, &opts("comm"))["meta"]["errors"]["merge_mismatch"],
        5
    );
}

#[test]
fn usage_errors_are_one_line() {
    let p = ten();
    let err = |o: &ReportOptions| {
        let msg = ReportConfig::new(o).unwrap_err().to_string();
        assert!(!msg.contains('\n'), "{msg}");
        msg
    };
    assert_eq!(
        err(&opts("comm,bogus")),
        "unknown sort key 'bogus': use comm, pid, tid, thread, state, gil, module, function, \
         srcline"
    );
    let mut o = opts("state");
    o.states = vec!["napping".into()];
    assert_eq!(
        err(&o),
        "unknown state 'napping': use on-cpu, runnable, sleeping, blocked, gil-wait"
    );
    assert!(err(&opts("")).starts_with("--sort needs at least one key"));
    let mut o = opts("comm");
    o.call_graph = Some("fractal".into());
    assert_eq!(
        err(&o),
        "unknown call-graph order 'fractal': use caller or callee"
    );
    let mut o = opts("comm");
    o.percent_limit = -1.0;
    assert!(err(&o).starts_with("--percent-limit must be between 0 and 100"));
    o.percent_limit = f64::NAN;
    assert!(err(&o).starts_with("--percent-limit"));
    let mut o = opts("comm");
    o.json = true;
    o.csv = true;
    err(&o);
    // A long or hostile key is echoed bounded and without control characters.
    let msg = err(&opts(&format!("\x1b{}", "k".repeat(500))));
    assert!(msg.len() < 200 && !msg.contains('\x1b'), "{msg}");
    // perf's names and duplicates are accepted.
    assert_eq!(
        rows(&p, &opts("sym,dso,sym")),
        rows(&p, &opts("function,module"))
    );
    assert_eq!(rows(&p, &opts(" pid , comm")), rows(&p, &opts("pid,comm")));
}

#[test]
fn ties_are_stable() {
    // Equal counts sort by key: pid 1 < 2 < 10 numerically, whatever the sample order.
    let mut p = Profile::new(meta());
    for pid in [10, 2, 1] {
        add(&mut p, who("x", pid, pid), &[F::Native("f", "m")], 2);
    }
    assert_eq!(
        rows(&p, &opts("pid")),
        vec![r("1", 2, 2), r("2", 2, 2), r("10", 2, 2)]
    );
}
