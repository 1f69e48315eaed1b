//! The progress line during a run and the summary after it.

use std::io::{self, Write};
use std::time::Duration;

use crate::config::RecordConfig;
use crate::profile::Profile;

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
}

impl RecordSummary {
    /// The summary of a finished profile.
    pub fn from_profile(p: &Profile, cfg: &RecordConfig, interrupted: bool) -> Self {
        RecordSummary {
            samples: p.samples().len(),
            processes: p.process_count(),
            duration_s: p.meta.duration_s,
            lost_samples: p.meta.lost_samples,
            errors: p.meta.errors.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            interrupted,
            rate_hz: cfg.rate_hz,
            cpus: p.meta.cpus,
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
            if self.interrupted { ", stopped early" } else { "" }
        )?;
        writeln!(w, "pyebpf: lost samples: {}", self.lost_samples)?;
        if self.errors.is_empty() {
            writeln!(w, "pyebpf: errors: none")?;
        } else {
            let list: Vec<String> = self.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
            writeln!(w, "pyebpf: errors: {}", list.join(", "))?;
        }
        Ok(())
    }
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
    pub fn tick(&mut self, elapsed: Duration, samples: usize, processes: usize) {
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
        };
        let mut buf = Vec::new();
        s.print(&mut buf).unwrap();
        let t = String::from_utf8(buf).unwrap();
        assert!(t.contains("lost samples: 0"), "{t}");
        assert!(t.contains("process_gone 3"));
        assert!(t.contains("stopped early"));
    }
}
