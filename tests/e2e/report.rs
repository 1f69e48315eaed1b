//! Issue 6, deliverables 2 and 3: `pyebpf report FILE` and `pyebpf script FILE` on a real run.
//!
//! Three spinning `rec_spin.py` processes (3.12, 3.13, 3.13t) are recorded together
//! (`-p A -p B -p C`) to `run.pyebpf` and `run.txt` (collapsed) in the same run. Then:
//!
//! - `report --sort comm,pid`: the percentages sum to 100 ± 0.1 and each process's sample
//!   count equals its count in the collapsed output;
//! - `report --sort function`: the rows equal the collapsed output aggregated by leaf function,
//!   best first;
//! - `--json` and `--csv` give the same rows as the text, in the same order;
//! - `--pid` filters, `--children` counts each sample once per function in its stack (checked
//!   against the collapsed stacks), `-g callee` prints a call tree under the rows;
//! - `pyebpf script run.pyebpf`, folded by a test-side collapser that follows FlameGraph's
//!   stackcollapse-perf.pl rules (root `comm (pid)` from the sample header, frames reversed,
//!   `_[k]` for `[kernel.kallsyms]`, `py::f:file:line` read back as `f (file:line)`), equals
//!   the collapsed lines exactly — except that a sample with no frame under its process is
//!   printed with one `[unknown]` frame (as perf prints an unknown ip), so the collapsed line
//!   `comm (pid) N` reads `comm (pid);[unknown] N`;
//! - `--comm`, `--tid`, `--thread` keep exactly that process, thread id or thread name's
//!   samples; `--sort dso,sym` equals `--sort module,function`; `-g caller` trees start at the
//!   outermost frame;
//! - usage errors (`--sort bogus`, `-g fractal`) are one line, before the file is read.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::common::{pyebpf, run, text};
use crate::pyrecord::support::{OutDir, Workload, parse_folded, setup};

/// The interpreters spinning at once.
const AT_ONCE: [&str; 3] = ["3.12", "3.13", "3.13t"];

/// Fewest samples per process in the 3 s run (three busy processes on two cores, on a machine
/// that may be busy with other tests).
const MIN_SAMPLES: u64 = 10;

/// The period `script` prints at the default 99 Hz (1e9 / 99 ns).
const PERIOD_99HZ: u64 = 10_101_010;

/// Runs `pyebpf ARGS` in `dir`, asserts success, returns stdout.
fn ok(args: &[&str], dir: &Path) -> String {
    let o = run(pyebpf(args).current_dir(dir));
    assert!(
        o.status.success(),
        "`pyebpf {}` failed ({}):\n{}",
        args.join(" "),
        o.status,
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// One text row: percentage, samples, and the key columns as printed (after the numbers).
#[derive(Clone, Debug, PartialEq)]
struct TextRow {
    pct: String,
    samples: u64,
    keys: String,
}

/// The rows of a text report (lines not starting with `#`, up to the first empty line).
fn text_rows(report: &str) -> Vec<TextRow> {
    report
        .lines()
        .filter(|l| !l.starts_with('#'))
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let l = l.trim_start();
            let (pct, rest) = l.split_once(' ').unwrap_or_else(|| panic!("row {l:?}"));
            let rest = rest.trim_start();
            let (samples, keys) = rest.split_once(' ').unwrap_or_else(|| panic!("row {l:?}"));
            TextRow {
                pct: pct.to_string(),
                samples: samples
                    .parse()
                    .unwrap_or_else(|_| panic!("samples in {l:?}")),
                keys: keys.trim().to_string(),
            }
        })
        .collect()
}

/// The pid in a collapsed root `comm (pid)`.
fn root_pid(root: &str) -> u32 {
    root.rsplit_once(" (")
        .and_then(|(_, p)| p.strip_suffix(')'))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("root {root:?} is not `comm (pid)`"))
}

/// The report's function key of a collapsed leaf label: `[k] name` for `name_[k]`, `[.] name`
/// for a Python `name (file:line)` and for anything else; `[.] [unknown]` for a bare root.
fn function_of(frames: &[String]) -> String {
    if frames.len() == 1 {
        return "[.] [unknown]".into();
    }
    let leaf = frames.last().unwrap();
    if let Some(k) = leaf.strip_suffix("_[k]") {
        return format!("[k] {k}");
    }
    if leaf.ends_with(')')
        && let Some((name, _)) = leaf.split_once(" (")
    {
        return format!("[.] {name}");
    }
    format!("[.] {leaf}")
}

// ---------------------------------------------------------------------------------------------
// A perf-script collapser following stackcollapse-perf.pl's rules (`--kernel`), with pyebpf's
// root `comm (pid)` and `py::` frames read back.

/// `^(\S.+?)\s+(\d+)\/*(\d+)*\s+`: (comm, pid) of a sample header line.
fn sc_header(line: &str) -> Option<(&str, &str)> {
    if line.starts_with(char::is_whitespace) || line.is_empty() {
        return None;
    }
    for (e, _) in line.char_indices().skip(2) {
        let rest = &line[e..];
        let after = rest.trim_start();
        if after.len() == rest.len() {
            continue;
        }
        let pid = after.bytes().take_while(u8::is_ascii_digit).count();
        if pid == 0 {
            continue;
        }
        let tail = after[pid..].trim_start_matches('/');
        let tail = tail.trim_start_matches(|c: char| c.is_ascii_digit());
        if tail.starts_with(char::is_whitespace) {
            return Some((&line[..e], &after[..pid]));
        }
    }
    None
}

/// `:\s*(\d+)*\s+(\S+):\s*$`: the period of a header line.
fn sc_period(line: &str) -> Option<u64> {
    let t = line.trim_end().strip_suffix(':')?;
    let before = t[..t.rfind(char::is_whitespace)?].trim_end();
    let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let head = before[..before.len() - digits].trim_end();
    if head.ends_with(':') {
        before[before.len() - digits..].parse().ok()
    } else {
        None
    }
}

/// `^\s*(\w+)\s*(.+) \((.*)\)`: (rawfunc, module) of a frame line.
fn sc_frame(line: &str) -> Option<(&str, &str)> {
    let s = line.trim_start();
    let pc = s
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    if pc == 0 {
        return None;
    }
    let rest = s[pc..].trim_start();
    let close = rest.rfind(')')?;
    let open = rest[..close].rfind(" (")?;
    (open > 0).then(|| (&rest[..open], &rest[open + 2..close]))
}

/// One frame's folded name by stackcollapse-perf's rules (`py::` read back).
fn sc_func(raw: &str, module: &str) -> Option<String> {
    let mut raw = raw;
    if let Some(i) = raw.rfind("+0x")
        && !raw[i + 3..].is_empty()
        && raw[i + 3..].bytes().all(|b| b.is_ascii_hexdigit())
    {
        raw = &raw[..i];
    }
    if raw.starts_with('(') {
        return None;
    }
    assert!(
        !raw.contains("->"),
        "inline frames are not expected: {raw:?}"
    );
    let mut func = if raw == "[unknown]" && module != "[unknown]" {
        format!("[{}]", module.rsplit('/').next().unwrap_or(module))
    } else if let Some(rest) = raw.strip_prefix("py::") {
        match rest.split_once(':') {
            None => rest.replace(';', ":"),
            Some((q, loc)) => format!("{} ({})", q.replace(';', ":"), loc.replace(';', ":")),
        }
    } else {
        let mut f = raw.replace(';', ":");
        let go_method = f.contains(".(") && f.contains(").");
        if !go_method
            && let Some(i) = f
                .find('(')
                .filter(|&i| !f[i..].starts_with("(anonymous namespace)"))
        {
            f.truncate(i);
        }
        f.retain(|c| c != '"' && c != '\'');
        f
    };
    if (module.starts_with('[') || module.ends_with("vmlinux")) && !module.contains("unknown") {
        func.push_str("_[k]");
    }
    Some(func)
}

/// Folds `perf script` text: stack → summed period.
fn collapse_perf(script: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut root: Option<String> = None;
    let mut period = 1;
    let mut stack: Vec<String> = Vec::new();
    for line in script.split('\n') {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if let Some(r) = root.take() {
                stack.insert(0, r);
                *out.entry(stack.join(";")).or_default() += period;
            }
            stack.clear();
        } else if let Some((comm, pid)) = sc_header(line) {
            root = Some(format!("{} ({pid})", comm.trim()));
            period = sc_period(line).filter(|p| *p > 0).unwrap_or(1);
        } else if let Some((raw, module)) = sc_frame(line) {
            assert!(root.is_some(), "frame line outside a sample: {line:?}");
            if let Some(f) = sc_func(raw, module) {
                stack.insert(0, f);
            }
        } else {
            panic!("unrecognized perf-script line {line:?}");
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------

/// The checks on one recorded run (the collapsed output as the reference).
struct Run<'a> {
    dir: &'a OutDir,
    /// `run.txt` lines.
    collapsed: Vec<String>,
    /// `run.txt` parsed.
    folded: Vec<crate::pyrecord::support::Sample>,
    total: u64,
}

impl Run<'_> {
    fn report(&self, args: &[&str]) -> String {
        let mut all = vec!["report", "run.pyebpf"];
        all.extend_from_slice(args);
        ok(&all, &self.dir.0)
    }

    /// Samples per pid in the collapsed output.
    fn per_pid(&self) -> BTreeMap<u32, u64> {
        let mut m = BTreeMap::new();
        for s in &self.folded {
            *m.entry(root_pid(&s.frames[0])).or_default() += s.count;
        }
        m
    }

    /// `--sort comm,pid`: sums to 100, counts equal the collapsed per-process counts.
    fn by_process(&self) {
        let report = self.report(&["--sort", "comm,pid"]);
        let rows = text_rows(&report);
        let sum: f64 = rows
            .iter()
            .map(|r| r.pct.trim_end_matches('%').parse::<f64>().unwrap())
            .sum();
        assert!(
            (sum - 100.0).abs() <= 0.1,
            "percentages sum to {sum}:\n{report}"
        );
        let got: BTreeMap<u32, u64> = rows
            .iter()
            .map(|r| {
                let (_, pid) = r.keys.rsplit_once(' ').unwrap();
                (pid.parse().unwrap(), r.samples)
            })
            .collect();
        assert_eq!(got.len(), rows.len(), "one row per process:\n{report}");
        assert_eq!(
            got,
            self.per_pid(),
            "report --sort comm,pid vs collapsed per process:\n{report}"
        );
        assert!(
            report.contains(&format!("\n# samples: {}\n", self.total)),
            "{report}"
        );
        assert!(report.contains("\n# processes: 3\n"), "{report}");
    }

    /// `--sort function`: the rows are the collapsed output aggregated by leaf, best first.
    fn by_function(&self) {
        let report = self.report(&["--sort", "function"]);
        let rows = text_rows(&report);
        let mut want: BTreeMap<String, u64> = BTreeMap::new();
        for s in &self.folded {
            *want.entry(function_of(&s.frames)).or_default() += s.count;
        }
        let got: BTreeMap<String, u64> = rows.iter().map(|r| (r.keys.clone(), r.samples)).collect();
        assert_eq!(
            got, want,
            "report --sort function vs collapsed by leaf:\n{report}"
        );
        assert!(
            rows.windows(2).all(|w| w[0].samples >= w[1].samples),
            "rows not sorted by overhead:\n{report}"
        );
        assert_eq!(
            rows[0].keys, "[.] spin",
            "the top row is the spinning function:\n{report}"
        );
    }

    /// `--json` and `--csv` give the text's rows.
    fn machine_views_agree(&self) {
        for sort in ["comm,pid", "function", "comm,module,function"] {
            let keys: Vec<&str> = sort.split(',').collect();
            let report = self.report(&["--sort", sort]);
            let rows = text_rows(&report);
            let json: Value = serde_json::from_str(&self.report(&["--sort", sort, "--json"]))
                .expect("report --json is not JSON");
            assert_eq!(json["total"], self.total);
            let jrows = json["rows"].as_array().unwrap();
            let csv = self.report(&["--sort", sort, "--csv"]);
            let mut csv_lines = csv.lines();
            assert_eq!(
                csv_lines.next().unwrap(),
                format!("overhead,samples,{}", keys.join(","))
            );
            let csv_rows: Vec<&str> = csv_lines.collect();
            assert_eq!(jrows.len(), rows.len(), "{sort}: json vs text rows");
            assert_eq!(csv_rows.len(), rows.len(), "{sort}: csv vs text rows");
            for ((t, j), c) in rows.iter().zip(jrows).zip(&csv_rows) {
                let jkeys: Vec<String> = keys
                    .iter()
                    .map(|k| match &j["keys"][k] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                let text_keys: Vec<&str> = t
                    .keys
                    .split("  ")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                assert_eq!(text_keys, jkeys, "{sort}: keys");
                assert_eq!(j["samples"].as_u64(), Some(t.samples), "{sort}: samples");
                let pct = format!("{:.2}%", j["overhead"].as_f64().unwrap());
                assert_eq!(pct, t.pct, "{sort}: overhead");
                // The keys here have no commas or quotes: plain split.
                let fields: Vec<&str> = c.split(',').collect();
                assert_eq!(fields[0], &t.pct[..t.pct.len() - 1], "{sort}: csv overhead");
                assert_eq!(fields[1], t.samples.to_string(), "{sort}: csv samples");
                assert_eq!(
                    fields[2..],
                    jkeys.iter().map(String::as_str).collect::<Vec<_>>()[..]
                );
            }
        }
    }

    /// `--pid` keeps one process; `--children` counts each sample once per function in its
    /// stack; `-g callee` draws a tree under each row.
    fn filters_children_graph(&self) {
        let per_pid = self.per_pid();
        let (&pid, &n) = per_pid.iter().next().unwrap();
        let report = self.report(&["--sort", "pid", "--pid", &pid.to_string()]);
        let rows = text_rows(&report);
        assert_eq!(
            rows,
            vec![TextRow {
                pct: "100.00%".into(),
                samples: n,
                keys: pid.to_string()
            }],
            "{report}"
        );
        assert!(
            report.contains(&format!(
                "\n# samples: {n} of {} after filters\n",
                self.total
            )),
            "{report}"
        );

        let report = self.report(&["--sort", "function", "--children"]);
        for name in ["spin_outer", "spin"] {
            let want: u64 = self
                .folded
                .iter()
                .filter(|s| {
                    s.frames[1..]
                        .iter()
                        .any(|f| f.starts_with(&format!("{name} (")))
                })
                .map(|s| s.count)
                .sum();
            let line = report
                .lines()
                .find(|l| l.ends_with(&format!("  [.] {name}")))
                .unwrap_or_else(|| panic!("no row for {name}:\n{report}"));
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(
                f[2].parse::<u64>().unwrap(),
                want,
                "children of {name}: {line}"
            );
        }

        let report = self.report(&["--sort", "function", "-g", "callee", "--percent-limit", "5"]);
        let mut lines = report.lines().skip_while(|l| !l.ends_with("  [.] spin"));
        lines
            .next()
            .unwrap_or_else(|| panic!("no spin row:\n{report}"));
        let first = lines.next().unwrap_or_default();
        assert!(
            first.starts_with("            ") && first.contains("%  spin ("),
            "call tree under spin starts at spin:\n{report}"
        );
    }

    /// `--comm`, `--tid` and `--thread` keep exactly the samples of that process, thread id or
    /// thread name; `dso`/`sym` are `module`/`function`; `-g caller` draws each row's tree from
    /// the outermost frame.
    fn thread_filters_aliases_caller(&self, workloads: &[Workload]) {
        let per_pid = self.per_pid();
        // --comm: each process's comm keeps exactly the processes with that comm.
        let by_process = text_rows(&self.report(&["--sort", "comm,pid"]));
        for row in &by_process {
            let (comm, pid) = row.keys.rsplit_once(' ').unwrap();
            let comm = comm.trim();
            let want: BTreeMap<u32, u64> = by_process
                .iter()
                .filter(|r| r.keys.rsplit_once(' ').unwrap().0.trim() == comm)
                .map(|r| {
                    (
                        r.keys.rsplit_once(' ').unwrap().1.parse().unwrap(),
                        r.samples,
                    )
                })
                .collect();
            let report = self.report(&["--sort", "pid", "--comm", comm]);
            let got: BTreeMap<u32, u64> = text_rows(&report)
                .iter()
                .map(|r| (r.keys.parse().unwrap(), r.samples))
                .collect();
            assert_eq!(got, want, "--comm {comm} (pid {pid}):\n{report}");
        }
        // --tid and --thread: the spinner of each process is sampled as itself.
        let by_thread = text_rows(&self.report(&["--sort", "thread,tid"]));
        let split = |r: &TextRow| -> (String, u32) {
            let (name, tid) = r.keys.rsplit_once(' ').unwrap();
            (name.trim().to_string(), tid.parse().unwrap())
        };
        for w in workloads {
            let tid = w.tid("spinner");
            let row = by_thread
                .iter()
                .find(|r| split(r).1 == tid)
                .unwrap_or_else(|| panic!("no row of tid {tid}: {by_thread:?}"));
            assert!(
                row.samples * 100 >= per_pid[&w.pid] * 90,
                "the spinner (tid {tid}) has most of its process's samples: {row:?} of {}",
                per_pid[&w.pid]
            );
            let report = self.report(&["--sort", "pid", "--tid", &tid.to_string()]);
            assert_eq!(
                text_rows(&report),
                vec![TextRow {
                    pct: "100.00%".into(),
                    samples: row.samples,
                    keys: w.pid.to_string()
                }],
                "--tid {tid}:\n{report}"
            );
            // The thread's name (the kernel's, as perf shows it): its threads, and only them.
            let (name, _) = split(row);
            let want: BTreeMap<u32, u64> = by_thread
                .iter()
                .filter(|r| split(r).0 == name)
                .map(|r| (split(r).1, r.samples))
                .collect();
            let report = self.report(&["--sort", "tid", "--thread", &name]);
            let got: BTreeMap<u32, u64> = text_rows(&report)
                .iter()
                .map(|r| (r.keys.parse().unwrap(), r.samples))
                .collect();
            assert_eq!(got, want, "--thread {name}:\n{report}");
        }
        // perf's key names.
        assert_eq!(
            text_rows(&self.report(&["--sort", "dso,sym"])),
            text_rows(&self.report(&["--sort", "module,function"])),
            "dso,sym vs module,function"
        );
        // -g caller: the tree under `spin` runs from the root (`comm (pid)`) of its heaviest
        // stack down through that stack's frames.
        let spins: Vec<&crate::pyrecord::support::Sample> = self
            .folded
            .iter()
            .filter(|s| s.frames.last().is_some_and(|f| f.starts_with("spin (")))
            .collect();
        let most = spins
            .iter()
            .map(|s| s.count)
            .max()
            .expect("no stack ending in spin");
        let report = self.report(&["--sort", "function", "-g", "caller", "--percent-limit", "5"]);
        let tree: Vec<&str> = report
            .lines()
            .skip_while(|l| !l.ends_with("  [.] spin"))
            .skip(1)
            .collect();
        // The first branch (equal counts may come in either order).
        assert!(
            spins.iter().filter(|s| s.count == most).any(|s| {
                tree.len() >= s.frames.len()
                    && tree[..s.frames.len()]
                        .iter()
                        .map(|l| l.split_once("%  ").map_or("", |(_, f)| f))
                        .eq(s.frames.iter().map(String::as_str))
            }),
            "-g caller: the tree under spin is its heaviest stack from the root:\n{report}"
        );
    }

    /// `script` folds back to the collapsed output.
    fn script_folds_back(&self) {
        let script = ok(&["script", "run.pyebpf"], &self.dir.0);
        assert!(
            script.starts_with("# ========\n"),
            "perf script --header block"
        );
        let mut got = Vec::new();
        for (stack, weight) in collapse_perf(&script) {
            assert_eq!(weight % PERIOD_99HZ, 0, "{stack}: weight {weight}");
            got.push(format!("{stack} {}", weight / PERIOD_99HZ));
        }
        let mut want: Vec<String> = self
            .collapsed
            .iter()
            .map(|l| {
                let (stack, n) = l.rsplit_once(' ').unwrap();
                if stack.contains(';') {
                    l.clone()
                } else {
                    format!("{stack};[unknown] {n}")
                }
            })
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "script → stackcollapse rules vs collapsed");
        assert_eq!(
            script.matches(" cpu-clock:\n").count() as u64,
            self.total,
            "one block per sample"
        );
    }
}

#[test]
fn report_and_script_of_three_python_processes() {
    let Some(interps) = AT_ONCE.iter().map(|n| setup(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let workloads: Vec<Workload> = interps
        .iter()
        .map(|i| Workload::start(i, "rec_spin.py", &[], &[]))
        .collect();
    let dir = OutDir::new("report");
    let pids: Vec<String> = workloads.iter().map(|w| w.pid.to_string()).collect();
    let mut args = vec!["record", "-d", "3", "-o", "run.pyebpf", "-o", "run.txt"];
    for p in &pids {
        args.extend(["-p", p.as_str()]);
    }
    ok(&args, &dir.0);
    let body = std::fs::read_to_string(dir.join("run.txt")).unwrap();
    let folded = parse_folded(&body);
    let run = Run {
        dir: &dir,
        collapsed: body.lines().map(str::to_string).collect(),
        total: folded.iter().map(|s| s.count).sum(),
        folded,
    };
    for (w, n) in workloads.iter().zip(AT_ONCE) {
        let got = run.per_pid().get(&w.pid).copied().unwrap_or(0);
        assert!(
            got >= MIN_SAMPLES,
            "{n} (pid {}): {got} samples, want ≥ {MIN_SAMPLES}:\n{body}",
            w.pid
        );
    }
    run.by_process();
    run.by_function();
    run.machine_views_agree();
    run.filters_children_graph();
    run.thread_filters_aliases_caller(&workloads);
    run.script_folds_back();
}

/// Usage errors are one line, and come before the file is read (it does not exist here).
#[test]
fn usage_errors_are_one_line() {
    let dir = OutDir::new("report-usage");
    for (args, needle) in [
        (
            &["report", "nope.pyebpf", "--sort", "comm,bogus"][..],
            "unknown sort key 'bogus': use comm, pid, tid, thread, state, gil, module, function, srcline",
        ),
        (
            &["report", "nope.pyebpf", "-g", "fractal"][..],
            "unknown call-graph order 'fractal': use caller or callee",
        ),
        (
            &["report", "nope.pyebpf", "--percent-limit", "200"][..],
            "--percent-limit must be between 0 and 100",
        ),
    ] {
        let o = run(pyebpf(args).current_dir(&dir.0));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("pyebpf: {needle}")),
            "{args:?}: {err}"
        );
        assert!(o.stdout.is_empty());
    }
}
