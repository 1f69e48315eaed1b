//! The matrix's results: one line per kernel for the terminal and `summary.txt`, and the
//! "Kernel matrix" section of `docs/benchmarks.md` (written by a `vm-test` of every kernel;
//! `cargo xtask bench` keeps it when it rewrites the rest of the file).
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::guest;
use crate::sh::{self, say};

/// The heading of the section in `docs/benchmarks.md`.
pub const DOC_SECTION: &str = "## Kernel matrix";

/// What ran where.
pub struct Ran {
    /// `uname -r`.
    pub kernel: String,
    /// Package and version, or "host".
    pub source: String,
    /// `kvm`, `tcg`, or `none` on the host.
    pub accel: String,
}

/// One kernel's result.
pub struct Row {
    pub name: String,
    pub passed: bool,
    ran: Option<Ran>,
    outcome: guest::Outcome,
    took: Duration,
    error: Option<String>,
    out: String,
    /// Said at the end of the line (a retried boot).
    note: Option<String>,
}

impl Row {
    /// The row of a finished run whose files are in `out`.
    pub fn of_run(name: &str, ran: &Ran, out: &Path, took: Duration) -> Row {
        let outcome = guest::Outcome::read(out);
        let rc = std::fs::read_to_string(out.join("guest.rc")).unwrap_or_default();
        let passed = rc.trim() == "0" && outcome.passed_all(guest::STEPS);
        Row {
            name: name.to_owned(),
            passed,
            ran: Some(Ran {
                kernel: ran.kernel.clone(),
                source: ran.source.clone(),
                accel: ran.accel.clone(),
            }),
            outcome,
            took,
            error: None,
            out: out.display().to_string(),
            note: None,
        }
    }

    /// A kernel that could not be run at all.
    pub fn failed(name: &str, error: &str, took: Duration) -> Row {
        Row {
            name: name.to_owned(),
            passed: false,
            ran: None,
            outcome: guest::Outcome::default(),
            took,
            error: Some(error.to_owned()),
            out: String::new(),
            note: None,
        }
    }

    /// The row with `note` at the end of its line.
    #[must_use]
    pub fn with_note(mut self, note: String) -> Row {
        self.note = Some(note);
        self
    }

    /// `5.10  PASS 5.10.0-46-amd64: 31 tests passed, 0 failed; variant bounded, …`.
    pub fn line(&self) -> String {
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        let Some(ran) = &self.ran else {
            return format!(
                "{:<5} {verdict} {}",
                self.name,
                self.error.as_deref().unwrap_or("")
            );
        };
        let (variant, verified, ns) = self.outcome.program();
        let mut line = format!(
            "{:<5} {verdict} {}: {} tests passed, {} failed; variant {variant}, {verified} \
             instructions verified, {ns} ns per sample; loads: {}; {:.0} s ({}, {})",
            self.name,
            ran.kernel,
            self.outcome.passed,
            self.outcome.failed,
            self.loads(),
            self.took.as_secs_f64(),
            ran.source,
            ran.accel,
        );
        let failed_steps: Vec<&str> = self
            .outcome
            .steps
            .iter()
            .filter(|(_, rc, _)| *rc != 0)
            .map(|(n, _, _)| n.as_str())
            .collect();
        if !failed_steps.is_empty() {
            let _ = write!(line, "; failed steps: {}", failed_steps.join(", "));
        }
        if !self.passed {
            let _ = write!(line, "; logs: {}", self.out);
        }
        if let Some(note) = &self.note {
            let _ = write!(line, "; {note}");
        }
        line
    }

    /// The last lines of each failed step's log, so a CI transcript says why a kernel failed
    /// (the logs themselves stay in the run's directory, which CI does not keep).
    pub fn failure_tails(&self) -> String {
        const TAIL: usize = 60;
        let mut text = String::new();
        for (step, rc, _) in self.outcome.steps.iter().filter(|(_, rc, _)| *rc != 0) {
            let log = Path::new(&self.out).join(format!("{step}.log"));
            let body = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = body.lines().collect();
            let from = lines.len().saturating_sub(TAIL);
            let _ = writeln!(
                text,
                "---- {}: {step} exited {rc}; last {} lines of {}:",
                self.name,
                lines.len() - from,
                log.display()
            );
            for l in &lines[from..] {
                let _ = writeln!(text, "    {l}");
            }
        }
        // A guest whose kernel died: the start of its oops (no step says anything).
        let console = Path::new(&self.out).join("console.log");
        let console_text = std::fs::read_to_string(&console).unwrap_or_default();
        let lines: Vec<&str> = console_text.lines().collect();
        if let Some(at) = lines
            .iter()
            .position(|l| l.contains("Oops:") || l.contains("BUG:") || l.contains("Kernel panic"))
        {
            let to = (at + 30).min(lines.len());
            let _ = writeln!(
                text,
                "---- {}: the guest's kernel died; lines {}-{to} of {}:",
                self.name,
                at + 1,
                console.display()
            );
            for l in &lines[at..to] {
                let _ = writeln!(text, "    {l}");
            }
        }
        text
    }

    /// `bpf_loop 5235, bounded 13928` (the most verified instructions over record variants).
    fn loads(&self) -> String {
        let v = self.outcome.verified_by_variant();
        if v.is_empty() {
            return "none".into();
        }
        v.iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn markdown(&self) -> String {
        let Some(ran) = &self.ran else {
            return format!(
                "| {} | not run: {} | | | | | |",
                self.name,
                self.error.as_deref().unwrap_or("")
            );
        };
        let (variant, verified, ns) = self.outcome.program();
        format!(
            "| {} `{}` ({}) | {} | {} | {} | {} | {} | {} tests {} in {:.0} s |",
            self.name,
            ran.kernel,
            ran.source,
            ran.accel,
            variant,
            verified,
            self.loads(),
            ns,
            self.outcome.passed,
            if self.passed {
                "passed"
            } else {
                "ran, some FAILED"
            },
            self.took.as_secs_f64()
        )
    }
}

/// The section for `rows`.
fn section(rows: &[Row]) -> String {
    let mut s = format!(
        "{DOC_SECTION}\n\nWritten by `cargo xtask vm-test --kernel all` on {} (the plan: \
         `xtask/src/vm/guest.rs`; what each kernel feature is for: [kernels.md](kernels.md)). \
         Per kernel: the sampling program's variant and its verified instructions in a \
         `PYEBPF_STATS=1` recording of a spinning 3.12 (kernels before 5.16 do not report the \
         verifier's count: `n/a`), the most verified instructions of each variant over the \
         ten record variants of the load test (`unsupported`: the kernel lacks what it needs), \
         and the program's mean run time per sample in that recording. Under TCG the guest's \
         CPU is emulated, so its run times are those of the emulation, 10–50× the hardware's, \
         and depend on what ran beside them (guests run two at a time): they show that the \
         program runs, not what it costs; instruction counts do not depend on it.\n\n\
         | Kernel | Accel | Variant | Verified instructions | Verified instructions per variant (load test) | Run time per sample (ns) | Tests |\n\
         |---|---|---|---|---|---|---|\n",
        sh::probe(std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
            .unwrap_or_default()
            .trim()
    );
    for r in rows {
        let _ = writeln!(s, "{}", r.markdown());
    }
    s
}

/// `doc` with its kernel-matrix section replaced by (or, without one, followed by) `section`.
pub fn splice(doc: &str, section: &str) -> String {
    match section_of(doc) {
        Some(old) => doc.replacen(old, section, 1),
        None => format!("{}\n\n{section}", doc.trim_end()),
    }
}

/// The kernel-matrix section of `doc`: from its heading to the next `## ` heading or the end.
pub fn section_of(doc: &str) -> Option<&str> {
    let start = doc.find(&format!("\n{DOC_SECTION}\n")).map(|at| at + 1)?;
    let rest = &doc[start + DOC_SECTION.len()..];
    let end = rest
        .find("\n## ")
        .map_or(doc.len(), |at| start + DOC_SECTION.len() + at + 1);
    Some(&doc[start..end])
}

/// Writes the section into `docs/benchmarks.md`.
pub fn update_doc(rows: &[Row]) -> Result<()> {
    let path = sh::workspace_root().join("docs/benchmarks.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, splice(&doc, &section(rows)))
        .with_context(|| format!("writing {}", path.display()))?;
    say(
        "vm-test",
        format!("wrote the kernel matrix into {}", path.display()),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_or_appended() {
        let new = format!("{DOC_SECTION}\n\nnew table\n");
        let doc = "# B\n\n## 1. A\n\ntext\n";
        let once = splice(doc, &new);
        assert_eq!(once, format!("# B\n\n## 1. A\n\ntext\n\n{new}"));
        let newer = format!("{DOC_SECTION}\n\nnewer\n");
        assert_eq!(
            splice(&once, &newer),
            format!("# B\n\n## 1. A\n\ntext\n\n{newer}")
        );
        let middle = format!("# B\n\n{DOC_SECTION}\n\nold\n\n## 9. Z\n\nz\n");
        assert_eq!(
            splice(&middle, &newer),
            format!("# B\n\n{newer}## 9. Z\n\nz\n")
        );
        assert_eq!(section_of("# B\n"), None);
    }
}
