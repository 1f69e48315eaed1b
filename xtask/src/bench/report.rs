//! The results as Markdown: printed at the end and written to `docs/benchmarks.md`.
use std::fmt::Write as _;

use super::Plan;
use super::tools::Facts;

pub struct Table {
    pub title: String,
    /// How the figures were measured (paragraph lines).
    pub method: Vec<String>,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Self {
        Self {
            title: title.to_owned(),
            method: Vec::new(),
            header: header.iter().map(|s| (*s).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn method(&mut self, line: impl Into<String>) {
        self.method.push(line.into());
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, line: impl Into<String>) {
        let line = line.into();
        if !self.notes.contains(&line) {
            self.notes.push(line);
        }
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "## {}\n", self.title);
        if !self.method.is_empty() {
            let _ = writeln!(out, "{}\n", self.method.join(" "));
        }
        let _ = writeln!(out, "| {} |", self.header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(self.header.len()));
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(|c| c.replace('|', "/")).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        out.push('\n');
    }
}

pub struct Context<'a> {
    pub facts: &'a Facts,
    pub plan: &'a Plan,
    pub python: &'a str,
    pub pyebpf_origin: &'a str,
    pub load_start: &'a str,
    pub load_end: &'a str,
    pub minutes: f64,
}

pub fn render(ctx: &Context<'_>, tables: &[Table]) -> String {
    let f = ctx.facts;
    let p = ctx.plan;
    let mut out = String::new();
    let _ = writeln!(out, "# pyebpf benchmarks\n");
    let _ = writeln!(
        out,
        "Written by `cargo xtask bench{}` (the harness: `xtask/src/bench/`, workloads: \
         `tests/workloads/bench/`). Every figure is the median (min–max) over {} runs; the \
         configurations of a measurement are interleaved (each round runs every configuration \
         once, its order rotated by one each round: A B C, B C A, C A B, …), so a slow spell of \
         the machine hits all of them alike. No test asserts any of these figures.\n",
        if p.quick { " --quick" } else { "" },
        p.runs
    );
    let load_first: f64 = ctx
        .load_start
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0.0);
    let load_last: f64 = ctx
        .load_end
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0.0);
    let busy = load_first.max(load_last) > f.cpus as f64;
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| Date | {} |", f.date);
    let _ = writeln!(
        out,
        "| Run | {}, {:.1} min{} |",
        if p.quick {
            "`--quick` (shortened durations, see each section)"
        } else {
            "full"
        },
        ctx.minutes,
        if busy {
            " — on a busy machine (load above the CPU count: other builds and tests were \
             running), so the figures are noisy"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "| Machine | {}, {} CPUs, {:.1} GiB RAM |",
        f.cpu, f.cpus, f.mem_gib
    );
    let _ = writeln!(out, "| Kernel | {} |", f.kernel);
    let _ = writeln!(
        out,
        "| Load average (1, 5, 15 min) | start {}, end {} |",
        ctx.load_start, ctx.load_end
    );
    let _ = writeln!(
        out,
        "| pyebpf | {} ({}, commit {}) |",
        f.pyebpf, ctx.pyebpf_origin, f.commit
    );
    let _ = writeln!(
        out,
        "| py-spy | {} (PyPI, own virtual environment) |",
        f.pyspy
    );
    let _ = writeln!(out, "| Target interpreter | CPython {} |\n", ctx.python);
    for t in tables {
        t.render(&mut out);
    }
    out
}
