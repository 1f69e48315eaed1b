//! Tests of `script`: its text, read back by (1) a test-side stack collapser that follows
//! FlameGraph's `stackcollapse-perf.pl` rules (`--kernel`), whose output must equal
//! [`Profile::folded_lines`]; (2) inferno's `collapse-perf` (a real consumer, already a
//! dependency); (3) the line rules of Firefox Profiler's perf importer.

use std::collections::BTreeMap;

use super::script::{self, period_ns};
use super::tests::{F, Who, add, meta, who};
use crate::profile::{FrameKind, Profile};

fn script_text(p: &Profile) -> String {
    let mut out = Vec::new();
    script::render(p, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

// ---------------------------------------------------------------------------------------------
// (1) stackcollapse-perf.pl's rules, with the root `comm (pid)` and `py::` frames read back.

/// `^(\S.+?)\s+(\d+)\/*(\d+)*\s+`: (comm, pid, tid) of a sample header line.
fn sc_header(line: &str) -> Option<(&str, &str, Option<&str>)> {
    let first = line.chars().next()?;
    if first.is_whitespace() {
        return None;
    }
    // Lazy `\S.+?`: the shortest comm of at least two characters after which the rest matches.
    for (e, _) in line.char_indices().skip(2) {
        let rest = &line[e..];
        let after_ws = rest.trim_start();
        if after_ws.len() == rest.len() {
            continue;
        }
        let pid_len = after_ws.bytes().take_while(u8::is_ascii_digit).count();
        if pid_len == 0 {
            continue;
        }
        let mut tail = &after_ws[pid_len..];
        tail = tail.trim_start_matches('/');
        let tid_len = tail.bytes().take_while(u8::is_ascii_digit).count();
        let tid = (tid_len > 0).then(|| &tail[..tid_len]);
        tail = &tail[tid_len..];
        if tail.starts_with(char::is_whitespace) {
            return Some((&line[..e], &after_ws[..pid_len], tid));
        }
    }
    None
}

/// `:\s*(\d+)*\s+(\S+):\s*$`: the period of a header line, if any.
fn sc_period(line: &str) -> Option<u64> {
    let t = line.trim_end().strip_suffix(':')?;
    let event_start = t.rfind(char::is_whitespace)? + 1;
    if event_start == t.len() {
        return None;
    }
    let before = t[..event_start].trim_end();
    let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let period = &before[before.len() - digits..];
    let before = before[..before.len() - digits].trim_end();
    before.ends_with(':').then(|| period.parse().ok())?
}

/// `^\s*(\w+)\s*(.+) \((.*)\)`: (pc, rawfunc, module) of a frame line.
fn sc_frame(line: &str) -> Option<(&str, &str, &str)> {
    let s = line.trim_start();
    let pc_len = s
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    if pc_len == 0 {
        return None;
    }
    let rest = s[pc_len..].trim_start();
    let close = rest.rfind(')')?;
    let open = rest[..close].rfind(" (")?;
    if open == 0 {
        return None;
    }
    Some((&s[..pc_len], &rest[..open], &rest[open + 2..close]))
}

/// The label our collapsed output gives a `py::qualname:file:line` symbol.
fn py_label(sym: &str) -> Option<String> {
    let rest = sym.strip_prefix("py::")?;
    let tidy = |s: &str| s.replace(';', ":");
    Some(match rest.split_once(':') {
        None => tidy(rest),
        Some((qual, loc)) => format!("{} ({})", tidy(qual), tidy(loc)),
    })
}

/// stackcollapse-perf's tidy_generic: `;` → `:`, an argument list `(…)` dropped (unless
/// `.(…).` or `(anonymous namespace)`), quotes dropped.
fn sc_tidy(func: &str) -> String {
    let mut f = func.replace(';', ":");
    let go_style = f
        .find(".(")
        .is_some_and(|i| f[i + 2..].find(").").is_some());
    if !go_style {
        let mut from = 0;
        while let Some(i) = f[from..].find('(').map(|i| i + from) {
            if f[i..].starts_with("(anonymous namespace)") {
                from = i + 1;
                continue;
            }
            f.truncate(i);
            break;
        }
    }
    f.retain(|c| c != '"' && c != '\'');
    f
}

/// Folds `perf script` text as stackcollapse-perf.pl `--kernel` does, except that the root is
/// `comm (pid)` (pyebpf's collapsed root, comm trimmed) and `py::` symbols become `qualname (file:line)`.
/// Returns stack → summed period.
fn collapse_perf(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut root: Option<String> = None;
    let mut period = 1;
    let mut stack: Vec<String> = Vec::new();
    for line in text.split('\n') {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if let Some(r) = root.take() {
                stack.insert(0, r);
                *out.entry(stack.join(";")).or_default() += period;
            }
            stack.clear();
            continue;
        }
        if let Some((comm, pid, tid)) = sc_header(line) {
            assert!(tid.is_some(), "no tid in {line:?}");
            // pyebpf's root `comm (pid)`, comm trimmed (readers trim the padding of a
            // one-character comm).
            root = Some(format!("{} ({pid})", comm.trim()));
            period = sc_period(line).filter(|p| *p != 0).unwrap_or(1);
        } else if let Some((_pc, raw, module)) = sc_frame(line) {
            assert!(root.is_some(), "frame outside a sample: {line:?}");
            let mut raw = raw;
            if let Some(i) = raw.rfind("+0x")
                && !raw[i + 3..].is_empty()
                && raw[i + 3..].bytes().all(|b| b.is_ascii_hexdigit())
            {
                raw = &raw[..i];
            }
            if raw.starts_with('(') {
                continue;
            }
            let mut inline = Vec::new();
            for (n, part) in raw.split("->").enumerate() {
                let mut func = if part == "[unknown]" && module != "[unknown]" {
                    format!("[{}]", module.rsplit('/').next().unwrap_or(module))
                } else if let Some(label) = py_label(part) {
                    label
                } else {
                    sc_tidy(part)
                };
                if n > 0 {
                    func.push_str("_[i]");
                } else if (module.starts_with('[') || module.ends_with("vmlinux"))
                    && !module.contains("unknown")
                {
                    func.push_str("_[k]");
                }
                inline.push(func);
            }
            stack.splice(0..0, inline);
        } else {
            panic!("unrecognized line {line:?}");
        }
    }
    out
}

/// [`collapse_perf`] as folded lines `stack count`, counts = summed period / `period`.
fn folded(text: &str, period: u64) -> Vec<String> {
    collapse_perf(text)
        .into_iter()
        .map(|(stack, weight)| {
            assert_eq!(
                weight % period,
                0,
                "{stack}: weight {weight} not whole periods"
            );
            format!("{stack} {}", weight / period)
        })
        .collect()
}

#[test]
fn demo_profile_folds_back_exactly() {
    let p = crate::output::tests::demo_profile();
    let text = script_text(&p);
    assert_eq!(folded(&text, period_ns(99)), p.folded_lines(), "{text}");
}

/// Every frame kind: Process, Thread (with `threads`), Python, Native (names with spaces and
/// `+0x…`), Kernel (named and unresolved), Marker; a root-only sample; a comm with a space.
/// Without `threads` and with `unknown_leaf`, root-only samples get the `[unknown]` frame
/// `script` prints for them: that profile's folded lines are what `script` must fold back to.
fn every_kind(threads: bool, unknown_leaf: bool) -> Profile {
    let mut p = Profile::new(meta());
    p.keep_timeline();
    let t = |name: &'static str, tid: u32| -> Vec<F<'static>> {
        if threads {
            vec![F::Thread(name, tid)]
        } else {
            Vec::new()
        }
    };
    let run = F::Py("Worker.run", "/app/w.py", 12);
    let module = F::Py("<module>", "/app/w.py", 30);
    let odd = F::Py("f<é;>", "/app/odd file.py", 3);
    let main = F::Native("main", "python3.12");
    let eval = F::Native("operator new", "libstdc++.so.6");
    let unresolved = F::Native("libfoo.so+0x1a2b", "libfoo.so");
    let worker = Who {
        thread: "worker",
        ..who("python3", 10, 11)
    };
    let mut s = t("worker", 11);
    s.extend([main, module, run, eval, F::Kernel("vfs_read")]);
    add(&mut p, worker, &s, 3);
    let mut s = t("worker", 11);
    s.extend([F::Marker("[truncated]"), module, odd]);
    add(&mut p, worker, &s, 2);
    let mut s = t("python3", 10);
    s.extend([main, unresolved, F::Kernel("[kernel]+0xffffffff81000000")]);
    add(&mut p, who("python3", 10, 10), &s, 1);
    let mut s = t("python3", 10);
    s.extend([main, F::Marker("[merge mismatch]"), run]);
    add(&mut p, who("python3", 10, 10), &s, 1);
    let mut s = t("Web Content", 41);
    s.push(F::Native("[unknown]+0x7f0012345678", "[unknown]"));
    add(&mut p, who("Web Content", 40, 41), &s, 2);
    // Root only (with --threads: the thread level only).
    let mut s = t("idle", 30);
    if unknown_leaf {
        s.push(F::Marker("[unknown]"));
    }
    add(&mut p, who("idle", 30, 30), &s, 4);
    p
}

#[test]
fn every_frame_kind_folds_back() {
    let expected = every_kind(false, true).folded_lines();
    for threads in [false, true] {
        let p = every_kind(threads, false);
        let text = script_text(&p);
        assert_eq!(
            folded(&text, period_ns(99)),
            expected,
            "threads={threads}\n{text}"
        );
    }
    // The thread level is the header's tid, not a frame.
    let text = script_text(&every_kind(true, false));
    assert!(!text.contains("worker (11)"), "{text}");
}

#[test]
fn layout_of_a_block() {
    let p = every_kind(true, false);
    let text = script_text(&p);
    assert!(text.starts_with("# ========\n# captured on    : 2024-02-29 23:59:59 UTC\n"));
    assert!(
        text.contains("\n# hostname : box\n# os release : 6.18.0\n"),
        "{text}"
    );
    assert!(
        text.contains("\n# cmdline : pyebpf record --all\n"),
        "{text}"
    );
    assert!(
        text.contains("\n# ========\n#\npython3 10/11 [000]"),
        "{text}"
    );
    // The first sample (time 1 s + 0, cpu 0), leaf first.
    let first = "\
python3 10/11 [000] 1.000000: 10101010 cpu-clock:
\t0 vfs_read+0x0 ([kernel.kallsyms])
\t0 operator new+0x0 (libstdc++.so.6)
\t0 py::Worker.run:/app/w.py:12+0x0 (/app/w.py)
\t0 py::<module>:/app/w.py:30+0x0 (/app/w.py)
\t0 main+0x0 (python3.12)

";
    assert!(text.contains(first), "{text}");
    // The second sample: 10101010 ns later, cpu 1.
    assert!(text.contains("\npython3 10/11 [001] 1.010101: 10101010 cpu-clock:\n"));
    // A module with a space: underscore; the symbol keeps its file as is.
    assert!(
        text.contains("\t0 py::f<é;>:/app/odd file.py:3+0x0 (/app/odd_file.py)\n"),
        "{text}"
    );
    // Root only: one [unknown] frame.
    assert!(
        text.contains(
            "idle 30/30 [001] 1.090909: 10101010 cpu-clock:\n\t0 [unknown]+0x0 ([unknown])\n\n"
        ),
        "{text}"
    );
    assert!(text.ends_with("\n\n"));
    assert_eq!(
        text.matches("cpu-clock:\n").count(),
        p.timeline().unwrap().len(),
        "one block per sample"
    );
}

#[test]
fn empty_profile_is_header_only() {
    let mut empty = Profile::new(crate::profile::RunMeta::default());
    empty.keep_timeline();
    let text = script_text(&empty);
    assert!(text.starts_with("# ========\n"));
    assert!(text.ends_with("# ========\n#\n"));
    assert!(
        text.contains("# pyebpf : 0 samples, 0 Hz (period 1 ns)"),
        "{text}"
    );
    assert!(collapse_perf(&text).is_empty());
}

// ---------------------------------------------------------------------------------------------
// (2) inferno's collapse-perf.

fn inferno_fold(text: &str, annotate_kernel: bool) -> BTreeMap<String, u64> {
    use inferno::collapse::Collapse;
    let mut opt = inferno::collapse::perf::Options::default();
    opt.include_pid = true;
    opt.annotate_kernel = annotate_kernel;
    opt.nthreads = 1;
    let mut out = Vec::new();
    inferno::collapse::perf::Folder::from(opt)
        .collapse(text.as_bytes(), &mut out)
        .unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| {
            let (s, n) = l.rsplit_once(' ').unwrap();
            (s.to_string(), n.parse().unwrap())
        })
        .collect()
}

/// What inferno (`--pid --kernel`) must make of a profile: root `comm-pid` (spaces as `_`),
/// `py::` symbols as printed, kernel frames `_[k]`, `;` as `:`, weights in periods.
fn inferno_expected(p: &Profile) -> BTreeMap<String, u64> {
    let period = period_ns(p.meta.rate_hz);
    let mut out = BTreeMap::new();
    for s in p.timeline().unwrap() {
        let mut parts = vec![format!(
            "{}-{}",
            p.comm(&s.key).replace(' ', "_"),
            s.key.pid
        )];
        for id in &p.stack(s.key.stack) {
            let f = p.frame(*id);
            let name = match f.kind {
                FrameKind::Process | FrameKind::Thread => continue,
                FrameKind::Python => format!(
                    "py::{}:{}:{}",
                    f.name,
                    f.file.as_deref().unwrap(),
                    f.line.unwrap()
                ),
                FrameKind::Kernel => format!("{}_[k]", f.name),
                FrameKind::Native | FrameKind::Marker | FrameKind::State => f.name.to_string(),
            };
            parts.push(name.replace(';', ":"));
        }
        if parts.len() == 1 {
            parts.push("[unknown]".into());
        }
        *out.entry(parts.join(";")).or_default() += period;
    }
    out
}

#[test]
fn inferno_collapse_perf_reads_every_sample() {
    for threads in [false, true] {
        let p = every_kind(threads, false);
        let text = script_text(&p);
        assert_eq!(inferno_fold(&text, true), inferno_expected(&p), "{text}");
    }
    // And inferno's format guesser takes it for perf output.
    let p = crate::output::tests::demo_profile();
    let text = script_text(&p);
    let mut out = Vec::new();
    inferno::collapse::Collapse::collapse(
        &mut inferno::collapse::guess::Folder::default(),
        text.as_bytes(),
        &mut out,
    )
    .unwrap();
    let guessed = String::from_utf8(out).unwrap();
    assert_eq!(guessed.lines().count(), 3, "{guessed}");
    assert!(guessed.contains("app;main;hot 30303030\n"), "{guessed}");
}

// ---------------------------------------------------------------------------------------------
// (3) Firefox Profiler's perf importer (src/profile-logic/import/linux-perf.ts).

/// One sample as Firefox reads it.
#[derive(Debug, PartialEq)]
struct FxSample {
    thread: String,
    pid: u32,
    tid: u32,
    time_us: u64,
    /// (function, module), leaf first, `+0x…` stripped.
    frames: Vec<(String, String)>,
}

/// `^(.*)\s+([\d.]+):` (greedy): (before, timestamp).
fn fx_time(line: &str) -> Option<(&str, &str)> {
    let bytes = line.as_bytes();
    (0..line.len()).rev().find_map(|i| {
        if !bytes[i].is_ascii_whitespace() {
            return None;
        }
        let rest = &line[i + 1..];
        let n = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        (n > 0 && rest[n..].starts_with(':')).then(|| (&line[..i], &rest[..n]))
    })
}

/// `^(.*)\s+(?:(\d+)\/)?(\d+)\b` (greedy): (thread name, pid, tid).
fn fx_thread(before: &str) -> Option<(&str, u32, u32)> {
    let bytes = before.as_bytes();
    (0..before.len()).rev().find_map(|i| {
        if !bytes[i].is_ascii_whitespace() {
            return None;
        }
        let rest = &before[i + 1..];
        let word_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/'));
        let word = &rest[..word_end.unwrap_or(rest.len())];
        let (pid, tid) = match word.split_once('/') {
            Some((p, t)) => (p.parse().ok()?, t.parse().ok()?),
            None => (0, word.parse().ok()?),
        };
        Some((before[..i].trim(), pid, tid))
    })
}

/// `^\s*(\w+)\s*(.+) \(([^)]*)\)`: (function, module).
fn fx_frame(line: &str) -> Option<(String, String)> {
    let s = line.trim_start();
    let pc = s
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    if pc == 0 {
        return None;
    }
    let rest = s[pc..].trim_start();
    // Greedy `.+`: the last ` (` followed by `[^)]*\)`.
    let (open, _) = rest
        .rmatch_indices(" (")
        .find(|&(i, _)| i >= 1 && rest[i + 2..].contains(')'))?;
    let module_end = rest[open + 2..].find(')')? + open + 2;
    let mut func = &rest[..open];
    if let Some(i) = func.rfind("+0x")
        && !func[i + 3..].is_empty()
        && func[i + 3..].bytes().all(|b| b.is_ascii_hexdigit())
    {
        func = &func[..i];
    }
    Some((func.to_string(), rest[open + 2..module_end].to_string()))
}

/// Reads `perf script` text as Firefox Profiler does; panics on a line it would not parse.
fn firefox_read(text: &str) -> Vec<FxSample> {
    assert!(
        text.starts_with("# ========\n"),
        "Firefox detects perf text by this header"
    );
    let mut out = Vec::new();
    let mut lines = text.split('\n').peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (before, ts) = fx_time(line).unwrap_or_else(|| panic!("no timestamp: {line:?}"));
        let (thread, pid, tid) = fx_thread(before).unwrap_or_else(|| panic!("no thread: {line:?}"));
        let (secs, usecs) = ts.split_once('.').unwrap();
        let mut frames = Vec::new();
        for frame in lines.by_ref() {
            if frame.trim().is_empty() {
                break;
            }
            let f = fx_frame(frame).unwrap_or_else(|| panic!("bad frame line: {frame:?}"));
            assert!(!f.0.starts_with('('), "Firefox skips {frame:?}");
            frames.push(f);
        }
        out.push(FxSample {
            thread: thread.to_string(),
            pid,
            tid,
            time_us: secs.parse::<u64>().unwrap() * 1_000_000 + usecs.parse::<u64>().unwrap(),
            frames,
        });
    }
    out
}

#[test]
fn firefox_importer_reads_every_line() {
    let p = every_kind(true, false);
    let samples = firefox_read(&script_text(&p));
    assert_eq!(samples.len(), p.timeline().unwrap().len());
    for (fx, s) in samples.iter().zip(p.timeline().unwrap()) {
        assert_eq!((fx.pid, fx.tid), (s.key.pid, s.key.tid));
        assert_eq!(fx.thread, &**p.comm(&s.key));
        assert_eq!(fx.time_us, s.time_ns / 1000);
        let real = p
            .stack(s.key.stack)
            .iter()
            .filter(|id| !matches!(p.frame(**id).kind, FrameKind::Process | FrameKind::Thread))
            .count();
        assert_eq!(fx.frames.len(), real.max(1), "{fx:?}");
    }
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        samples[0].frames,
        vec![
            s("vfs_read", "[kernel.kallsyms]"),
            s("operator new", "libstdc++.so.6"),
            s("py::Worker.run:/app/w.py:12", "/app/w.py"),
            s("py::<module>:/app/w.py:30", "/app/w.py"),
            s("main", "python3.12"),
        ]
    );
    // Web Content (a comm with a space) and the unresolved name ending in +0x….
    let web = samples.iter().find(|x| x.pid == 40).unwrap();
    assert_eq!(web.thread, "Web Content");
    assert_eq!(web.frames, vec![s("[unknown]+0x7f0012345678", "[unknown]")]);
}

// ---------------------------------------------------------------------------------------------
// Hostile names: every line still parses everywhere, no sample is lost.

#[test]
fn hostile_names_keep_every_line_parseable() {
    let mut p = Profile::new(meta());
    p.keep_timeline();
    let frames = [
        F::Native("foo(int, char*) const", "lib with space (deleted)"),
        F::Native("", ""),
        F::Native("line\nbreak\rand\ttab", "m\nod"),
        F::Native("ends in +0x12", "m"),
        F::Py("weird (name)", "/tmp/a (1)/x.py", 1),
        F::Kernel("k;name"),
    ];
    add(&mut p, who("", 1, 1), &frames, 2);
    add(&mut p, who("#comm", 2, 2), &frames, 1);
    add(&mut p, who(" lead", 3, 3), &frames, 1);
    add(&mut p, who("new\nline", 4, 4), &frames, 1);
    add(&mut p, who("x", 5, 5), &frames, 1);
    let text = script_text(&p);
    let period = period_ns(99);
    // stackcollapse rules: every line recognised, every sample counted under its pid.
    let sc = collapse_perf(&text);
    assert_eq!(sc.values().sum::<u64>(), 6 * period, "{text}");
    for pid in 1..=5 {
        assert!(
            sc.keys().any(|k| k.contains(&format!(" ({pid});"))),
            "pid {pid} lost: {sc:?}\n{text}"
        );
    }
    // The argument list goes, as for perf's output; the frame stays.
    assert!(sc.keys().all(|k| k.contains(";foo;")), "{sc:?}");
    // inferno: same total, nothing dropped.
    let inf = inferno_fold(&text, true);
    assert_eq!(inf.values().sum::<u64>(), 6 * period, "{inf:?}");
    assert!(inf.keys().all(|k| k.split(';').count() == 7), "{inf:?}");
    // Firefox: every frame line parses, module intact.
    let fx = firefox_read(&text);
    assert_eq!(fx.len(), 6);
    for x in &fx {
        assert_eq!(x.frames.len(), frames.len(), "{x:?}");
        assert_eq!(x.frames[5].1, "lib_with_space__deleted_", "{x:?}");
        assert_eq!(x.frames[4].0, "[unknown]");
        assert_eq!(x.frames[2].0, "ends in +0x12");
    }
    assert_eq!(fx[0].thread, "[unknown]");
    assert_eq!(fx[2].thread, "_#comm");
}
