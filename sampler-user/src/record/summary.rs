//! The progress line during a run and the summary after it.
//!
//! The summary: the global lines (samples, processes, lost samples, errors — e2e tests parse
//! them), then one line per Python process (samples, full Python stacks, truncated, merge
//! mismatches, errors by kind), then the cost of the eBPF sampling program, and with `--idle`
//! the off-CPU line (intervals sent, too short, lost; the `sched_switch` program's cost per
//! context switch).

use std::fmt::Write as _;
use std::io::{self, Write};
use std::time::Duration;

use crate::collect::ProgramStats;
use crate::profile::Profile;

use super::python::PyProcStats;

/// Most Python processes listed one per line; the rest are summed in one line.
const MAX_PROC_LINES: usize = 50;
/// Most skipped processes listed one per line; the rest are counted in one line.
const MAX_SKIPPED_LINES: usize = 50;

/// One Python process in the summary.
#[derive(Clone, Debug)]
pub struct PyProcLine {
    /// Host pid.
    pub pid: u32,
    /// Counts of the Python stage.
    pub stats: PyProcStats,
    /// Samples that could not be merged exactly (`--native`).
    pub merge_mismatches: u64,
}

/// What a finished run reports on stderr.
#[derive(Clone, Debug)]
pub struct RecordSummary {
    /// Samples in the profile.
    pub samples: usize,
    /// Processes with samples.
    pub processes: usize,
    /// Seconds sampled.
    pub duration_s: f64,
    /// Samples lost in the kernel.
    pub lost_samples: u64,
    /// Errors by kind.
    pub errors: Vec<(String, u64)>,
    /// Stopped by Ctrl-C/SIGTERM.
    pub interrupted: bool,
    /// Rate per CPU.
    pub rate_hz: u64,
    /// CPUs sampled.
    pub cpus: usize,
    /// Python processes, most samples first.
    pub python: Vec<PyProcLine>,
    /// Python processes beyond the per-process bound of the stage, summed.
    pub python_overflow: Option<PyProcStats>,
    /// Processes that looked like Python but could not be profiled.
    pub skipped: Vec<super::python::Skipped>,
    /// The eBPF sampling program's statistics.
    pub program: Option<ProgramStats>,
    /// `--idle`: the off-CPU counts and program.
    pub offcpu: Option<OffCpuLine>,
    /// User-space cost: samples built, and the time the pipeline spent on their batches.
    pub user_cost: Option<(u64, Duration)>,
    /// `PYEBPF_STATS`: sample taken → built, and exec → Python attach.
    pub latency: Option<(super::latency::Latency, super::latency::Latency)>,
    /// How `-- COMMAND` ended (`exited with status 3`, `was killed by signal 2 (SIGINT)`).
    pub command_status: Option<String>,
}

/// The off-CPU part of a `--idle` run.
#[derive(Clone, Debug, Default)]
pub struct OffCpuLine {
    /// Switch-outs of target Python threads captured.
    pub switches: u64,
    /// Intervals sent (each held at least one sampling instant).
    pub sent: u64,
    /// Intervals too short to hold one (nothing sent).
    pub short: u64,
    /// Intervals lost (ring buffer full).
    pub lost: u64,
    /// Switch-outs not followed (`OFFCPU` full).
    pub map_full: u64,
    /// The `sched_switch` program's statistics (its runs: every context switch of the host).
    pub program: Option<ProgramStats>,
}

impl RecordSummary {
    /// The summary of a finished profile.
    pub fn from_profile(p: &Profile, rate_hz: u64, interrupted: bool) -> Self {
        RecordSummary {
            samples: usize::try_from(p.total_weight()).unwrap_or(usize::MAX),
            processes: p.process_count(),
            duration_s: p.meta.duration_s,
            lost_samples: p.meta.lost_samples,
            errors: p.meta.errors.named(),
            interrupted,
            rate_hz,
            cpus: p.meta.cpus,
            python: Vec::new(),
            python_overflow: None,
            skipped: Vec::new(),
            program: None,
            offcpu: None,
            user_cost: None,
            latency: None,
            command_status: None,
        }
    }

    /// Prints the summary: samples, processes, lost samples (always, even when 0), errors.
    pub fn print(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "pyebpf: {} samples from {} processes in {:.1} s ({} Hz on {} CPUs){}",
            self.samples,
            self.processes,
            self.duration_s,
            self.rate_hz,
            self.cpus,
            if self.interrupted {
                ", stopped early"
            } else {
                ""
            }
        )?;
        writeln!(w, "pyebpf: lost samples: {}", self.lost_samples)?;
        if let Some(status) = &self.command_status {
            writeln!(w, "pyebpf: the command {status}")?;
        }
        if self.errors.is_empty() {
            writeln!(w, "pyebpf: errors: none")?;
        } else {
            let list: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            writeln!(w, "pyebpf: errors: {}", list.join(", "))?;
        }
        let mut lines: Vec<&PyProcLine> = self.python.iter().collect();
        lines.sort_by_key(|l| (std::cmp::Reverse(l.stats.samples), l.pid));
        for l in lines.iter().take(MAX_PROC_LINES) {
            writeln!(
                w,
                "pyebpf: python {}",
                proc_line(Some(l.pid), &l.stats, l.merge_mismatches)
            )?;
        }
        let mut rest = self.python_overflow.clone().unwrap_or_default();
        let mut rest_mismatches = 0;
        let mut rest_count = 0;
        for l in lines.iter().skip(MAX_PROC_LINES) {
            rest.merge(&l.stats);
            rest_mismatches += l.merge_mismatches;
            rest_count += 1;
        }
        if rest_count > 0 || self.python_overflow.is_some() {
            writeln!(
                w,
                "pyebpf: python (other processes) {}",
                proc_line(None, &rest, rest_mismatches)
            )?;
        }
        for s in self.skipped.iter().take(MAX_SKIPPED_LINES) {
            writeln!(
                w,
                "pyebpf: skipped {} ({}): {}",
                crate::printable::printable(&s.comm),
                s.pid,
                crate::printable::printable(&s.reason)
            )?;
        }
        if self.skipped.len() > MAX_SKIPPED_LINES {
            writeln!(
                w,
                "pyebpf: skipped {} more processes",
                self.skipped.len() - MAX_SKIPPED_LINES
            )?;
        }
        if let Some(p) = &self.program {
            writeln!(w, "pyebpf: {}", program_line(p))?;
            if let Some(families) = families_line(&self.python, p) {
                writeln!(w, "pyebpf: {families}")?;
            }
        }
        if let Some(o) = &self.offcpu {
            writeln!(w, "pyebpf: {}", offcpu_line(o))?;
        }
        if let Some((n, t)) = self.user_cost {
            let per = if n == 0 {
                0.0
            } else {
                t.as_secs_f64() * 1e6 / n as f64
            };
            writeln!(
                w,
                "pyebpf: user space: pipeline {per:.1} µs per sample ({n} samples: Python frames, stacks, counts)"
            )?;
        }
        if let Some((lag, attach)) = &self.latency {
            writeln!(w, "pyebpf: latency: sample taken to built {lag}")?;
            writeln!(w, "pyebpf: latency: exec to Python attach {attach}")?;
        }
        Ok(())
    }
}

/// `off-CPU (--idle): …; eBPF sched_switch program: N ns per context switch (…)`: the e2e tests
/// and the bench read the number before "ns per context switch".
fn offcpu_line(o: &OffCpuLine) -> String {
    let mut s = format!(
        "off-CPU (--idle): {} intervals sent of {} switch-outs captured ({} too short to hold a \
         sampling instant), {} lost, {} not followed (map full)",
        o.sent, o.switches, o.short, o.lost, o.map_full
    );
    if let Some(p) = &o.program {
        match p.mean_run_ns() {
            Some(ns) => {
                let _ = write!(
                    s,
                    "; eBPF sched_switch program: {ns:.0} ns per context switch (mean of {} \
                     switches on the host)",
                    p.run_count.unwrap_or(0)
                );
            }
            None => s.push_str("; eBPF sched_switch program: run time not available"),
        }
        let _ = write!(
            s,
            ", {} instructions verified, variant {}",
            p.verified_insns.unwrap_or(p.translated_insns),
            p.variant
        );
    }
    s
}

/// `comm (pid) 3.12: N samples, N with a full Python stack, …`.
fn proc_line(pid: Option<u32>, s: &PyProcStats, mismatches: u64) -> String {
    let mut out = match pid {
        Some(pid) => format!(
            "{} ({pid}) {}: ",
            crate::printable::printable(&s.comm),
            s.version
        ),
        None => String::new(),
    };
    let _ = write!(
        out,
        "{} samples, {} with a full Python stack, {} truncated, {} not running Python, {} merge mismatches",
        s.samples, s.full, s.truncated, s.no_tstate, mismatches
    );
    if s.gil_excluded {
        out.push_str(", excluded by --gil (free-threaded, GIL disabled)");
    } else if s.gil_dropped > 0 {
        let _ = write!(out, ", {} dropped by --gil", s.gil_dropped);
    }
    if s.errors.is_empty() {
        out.push_str(", errors: none");
    } else {
        let mut list: Vec<String> = s
            .errors
            .iter()
            .map(|(k, v)| format!("{} {v}", k.name()))
            .collect();
        list.sort();
        let _ = write!(out, ", errors: {}", list.join(", "));
    }
    out
}

/// The eBPF program's cost: mean run time per sample first (the e2e tests read the number
/// before "ns"), then the instruction count.
/// The layout families the one program walked in this run: it is verified once for all of them
/// (every layout difference is data in `PY_PROCS`), so each has the program's count.
fn families_line(python: &[PyProcLine], p: &ProgramStats) -> Option<String> {
    let mut seen: Vec<(&str, &str)> = python
        .iter()
        .map(|l| (l.stats.version.as_str(), l.stats.family))
        .filter(|(v, f)| !v.is_empty() && !f.is_empty())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    if seen.is_empty() {
        return None;
    }
    let insns = p.verified_insns.unwrap_or(p.translated_insns);
    let list: Vec<String> = seen.iter().map(|(v, f)| format!("{v} ({f})")).collect();
    Some(format!(
        "eBPF Python walk: {insns} instructions verified for every layout family; walked: {}",
        list.join(", ")
    ))
}

fn program_line(p: &ProgramStats) -> String {
    let per_run = match (p.run_time_ns, p.run_count) {
        (Some(t), Some(n)) if n > 0 => format!(
            "{:.0} ns per sample (mean of {n} runs)",
            t as f64 / n as f64
        ),
        _ => "run time unavailable (kernel.bpf_stats_enabled could not be set)".to_string(),
    };
    let insns = p.verified_insns.unwrap_or(p.translated_insns);
    format!(
        "eBPF sampling program: {per_run}, {insns} instructions {}, {} bytes JIT-compiled, \
         variant {}",
        if p.verified_insns.is_some() {
            "verified"
        } else {
            "after rewrites"
        },
        p.jited_bytes,
        p.variant
    )
}

/// One-line progress display on stderr (only when it is a terminal).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A progress line, or nothing when `enabled` is false.
    pub fn new(enabled: bool) -> Self {
        let bar = enabled.then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
            b
        });
        Progress { bar }
    }

    /// Updates the line.
    pub fn tick(&mut self, elapsed: Duration, samples: u64, processes: usize) {
        if let Some(b) = &self.bar {
            b.set_message(format!(
                "recording: {:.0} s elapsed, {samples} samples, {processes} processes (Ctrl-C to stop and write)",
                elapsed.as_secs_f64()
            ));
            b.tick();
        }
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_always_shows_lost_samples() {
        let s = RecordSummary {
            samples: 10,
            processes: 2,
            duration_s: 1.0,
            lost_samples: 0,
            errors: vec![("process_gone".into(), 3)],
            interrupted: true,
            rate_hz: 99,
            cpus: 2,
            python: Vec::new(),
            python_overflow: None,
            skipped: Vec::new(),
            program: None,
            offcpu: None,
            user_cost: None,
            latency: None,
            command_status: None,
        };
        let mut buf = Vec::new();
        s.print(&mut buf).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.contains("lost samples: 0"), "{t}");
        assert!(t.contains("process_gone 3"));
        assert!(t.contains("stopped early"));
    }

    #[test]
    fn per_process_lines_and_program_cost() {
        let mut stats = PyProcStats {
            comm: "python3.12".into(),
            version: "3.12".into(),
            family: "cframe, entry frames",
            samples: 300,
            full: 297,
            truncated: 1,
            ..PyProcStats::default()
        };
        stats.count(crate::failure::PyFailure::Reader(
            crate::python::ErrorKind::TornInstrPtr,
        ));
        let s = RecordSummary {
            samples: 300,
            processes: 1,
            duration_s: 3.0,
            lost_samples: 0,
            errors: Vec::new(),
            interrupted: false,
            rate_hz: 99,
            cpus: 2,
            python: vec![
                PyProcLine {
                    pid: 42,
                    stats,
                    merge_mismatches: 2,
                },
                PyProcLine {
                    pid: 43,
                    stats: PyProcStats {
                        comm: "python3.9".into(),
                        version: "3.9".into(),
                        family: "PyFrameObject chain, pthread_t match",
                        samples: 10,
                        ..PyProcStats::default()
                    },
                    merge_mismatches: 0,
                },
            ],
            python_overflow: None,
            skipped: vec![super::super::python::Skipped {
                pid: 77,
                comm: "py\x1b[2Jold".into(),
                reason: "unsupported CPython 3.7".into(),
            }],
            offcpu: None,
            program: Some(ProgramStats {
                variant: "bounded (this kernel lacks bpf_loop (Linux 5.17))".into(),
                run_time_ns: Some(1_500_000),
                run_count: Some(600),
                translated_insns: 4000,
                jited_bytes: 20000,
                verified_insns: Some(123_456),
            }),
            user_cost: None,
            latency: None,
            command_status: Some("exited with status 3".into()),
        };
        let mut buf = Vec::new();
        s.print(&mut buf).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.contains("lost samples: 0"), "{t}");
        assert!(
            t.contains("pyebpf: the command exited with status 3\n"),
            "{t}"
        );
        assert!(
            t.contains("pyebpf: skipped py?[2Jold (77): unsupported CPython 3.7\n"),
            "skipped processes are named, printable: {t}"
        );
        let line = t.lines().find(|l| l.contains("(42)")).unwrap();
        for want in [
            "python3.12 (42) 3.12",
            "300 samples",
            "297 with a full Python stack",
            "1 truncated",
            "2 merge mismatches",
            "torn_instr_ptr 1",
        ] {
            assert!(line.contains(want), "{want} missing: {line}");
        }
        let families = t.lines().find(|l| l.contains("layout family")).unwrap();
        assert_eq!(
            families,
            "pyebpf: eBPF Python walk: 123456 instructions verified for every layout family; \
             walked: 3.12 (cframe, entry frames), 3.9 (PyFrameObject chain, pthread_t match)"
        );
        let prog = t.lines().find(|l| l.contains("ns per sample")).unwrap();
        assert!(prog.contains("2500 ns per sample"), "{prog}");
        assert!(prog.contains("123456 instructions verified"), "{prog}");
        assert!(
            prog.ends_with("variant bounded (this kernel lacks bpf_loop (Linux 5.17))"),
            "{prog}"
        );
        // "ns" must first appear right after the per-sample time.
        let at = prog.find("ns").unwrap();
        assert!(prog[..at].trim_end().ends_with("2500"), "{prog}");
    }
}
