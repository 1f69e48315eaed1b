//! The `record` command: drives the data path from the eBPF collector to the output file.
//!
//! Owns: the sampling loop, its stop conditions (duration, Ctrl-C/SIGTERM, the profiled
//! command's exit), starting `-- COMMAND` under the kernel filter before it runs, the progress
//! line, and the end-of-run summary. Input: a validated [`RecordConfig`]. Output: the profile
//! files, one per `-o` (each written atomically), and a [`RecordSummary`].
//!
//! Threads: `drain` empties the ring buffer; `pystage` tracks the Python processes (and the
//! kernel's `PY_PROCS`) and resolves each sample's captured Python frames as soon as it
//! arrives; this thread builds the stacks ([`stack`]: native unwinding, symbolization and the
//! `--native` merge, everything expensive cached per file or per unique frame).
//! Items flow drain → pystage → stack builder in order on bounded channels.

mod drain;
mod pyattach;
mod pyproc;
#[cfg(test)]
mod pyproc_tests;
mod pystage;
mod pytrack;
mod signals;
mod spawn;
mod stack;
mod summary;

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::collect::{CollectConfig, Collector, Event};
use crate::config::{RecordConfig, Target};
use crate::output::write_atomically;
use crate::procs::ProcessRegistry;
use crate::profile::{Profile, RunMeta};
use pystage::Staged;

pub use summary::{PyProcLine, RecordSummary};

/// Errors that end a `record` run. Each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// eBPF load/attach failed.
    #[error(transparent)]
    Collect(#[from] crate::collect::CollectError),
    /// The command to profile could not be started.
    #[error("cannot start {command}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// Writing the output failed (nothing was left behind).
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The output path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The stack-building side of a run: the profile and what builds it.
struct Building {
    builder: stack::StackBuilder,
    profile: Profile,
    registry: ProcessRegistry,
    /// Samples built, and the time spent building them.
    built: (u64, Duration),
}

impl Building {
    /// Routes one staged item to the registry and the stack builder.
    fn handle(&mut self, item: Staged) {
        match item {
            Staged::Sample(s) => {
                let t0 = Instant::now();
                self.builder.add(&mut self.profile, &mut self.registry, *s);
                self.built.0 += 1;
                self.built.1 += t0.elapsed();
            }
            Staged::Proc(Event::Exec(p)) => {
                self.registry.on_exec(p.pid);
                self.builder.forget_process(p.pid);
            }
            Staged::Proc(Event::Exit(p)) => self.registry.on_exit(p.pid),
            Staged::Proc(Event::Fork(p)) => {
                self.registry.get_or_load(p.pid);
            }
            Staged::Proc(Event::Sample(_)) => {}
        }
    }
}

/// A file-name-safe local timestamp, `YYYYmmdd-HHMMSS`, for default output names.
pub fn timestamp_for_file_name() -> String {
    let now = libc_time();
    // SAFETY: `localtime_r` writes into our zeroed struct; `now` is a valid time_t.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&raw const now, &raw mut tm) };
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

fn libc_time() -> libc::time_t {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as libc::time_t)
}

/// Starts the collector (and `-- COMMAND`, held until it is a target).
fn start(cfg: &RecordConfig) -> Result<(Collector, Option<spawn::HeldChild>), RecordError> {
    let (pids, follow_children) = match &cfg.target {
        Target::All => (Vec::new(), false),
        Target::Pids(p) => (p.clone(), cfg.subprocesses),
        Target::Command(_) => (Vec::new(), true),
    };
    let collect_cfg = CollectConfig {
        frequency_hz: cfg.rate_hz,
        pids,
        filter_pids: !matches!(cfg.target, Target::All),
        follow_children,
        stack_bytes: cfg.stack_bytes,
        kernel_stacks: cfg.kernel,
        ring_bytes: sampler_common::DEFAULT_RING_BYTES,
        self_pid: std::process::id(),
    };
    let mut collector = Collector::start(&collect_cfg)?;
    let child = match &cfg.target {
        Target::Command(cmd) => {
            let spawn_err = |source| RecordError::Spawn {
                command: cmd.join(" "),
                source,
            };
            let mut child = spawn::spawn_held(cmd).map_err(spawn_err)?;
            collector.add_target_pid(child.pid())?;
            child.release().map_err(spawn_err)?;
            Some(child)
        }
        _ => None,
    };
    Ok((collector, child))
}

/// Why the sampling loop ended (besides a stop request, the deadline or the command's exit).
struct Threads<'a> {
    drain: &'a drain::Drain,
    stage: &'a pystage::PyStageHandle,
    rx: &'a Receiver<Staged>,
}

/// Builds stacks until a stop condition; returns the time sampled.
fn sample_loop(
    cfg: &RecordConfig,
    b: &mut Building,
    t: &Threads<'_>,
    child: &mut Option<spawn::HeldChild>,
    progress: &mut summary::Progress,
) -> Duration {
    let started = Instant::now();
    let deadline = cfg.duration.map(|d| started + d);
    loop {
        let stop_now = signals::STOP.load(Ordering::Relaxed)
            || deadline.is_some_and(|d| Instant::now() >= d)
            || child.as_mut().is_some_and(spawn::HeldChild::try_wait)
            || t.drain.is_finished()
            || t.stage.is_finished();
        if stop_now {
            break;
        }
        let wait = deadline.map_or(Duration::from_millis(100), |d| {
            d.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100))
        });
        match t.rx.recv_timeout(wait) {
            Ok(item) => {
                b.handle(item);
                // Everything already queued, without waiting.
                while let Ok(item) = t.rx.try_recv() {
                    b.handle(item);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        progress.tick(
            started.elapsed(),
            b.profile.samples().len(),
            b.profile.process_count(),
        );
    }
    started.elapsed()
}

/// Runs `record` to completion and writes the output. `argv` is stored in the run metadata.
pub fn run(cfg: &RecordConfig, argv: &[String]) -> Result<RecordSummary, RecordError> {
    signals::install();
    // Attaches start now, on their own threads, while the eBPF object loads.
    let mut tracker = pytrack::Tracker::new(cfg.native);
    let busy = match &cfg.target {
        Target::All => tracker.scan_all(),
        Target::Pids(pids) => {
            for &pid in pids {
                tracker.request_now(pid);
            }
            Vec::new()
        }
        Target::Command(_) => Vec::new(),
    };
    let (mut collector, mut child) = start(cfg)?;
    // Taken before the collector moves into the drain thread: the Python stage writes it.
    tracker.set_sink(Box::new(collector.take_python_procs()?));
    if let Target::Pids(pids) = &cfg.target {
        // The kernel walks their Python frames from the first drained samples on.
        tracker.wait_for(pids, Duration::from_secs(2));
        for (pid, why) in tracker.failures(pids) {
            eprintln!("pyebpf: no Python frames for pid {pid}: {why}");
        }
    } else {
        tracker.tick(Instant::now());
    }
    let all = matches!(cfg.target, Target::All);
    // With --all, the run begins once the busy Python processes are announced to the kernel:
    // until then their samples would carry no Python frames. The drain runs meanwhile (the
    // ring buffer never fills) and discards those early samples.
    let cpus = collector.online_cpus();
    let (drain, drained) = drain::start(collector, cfg.stack_bytes, all);
    if all {
        tracker.wait_for(&busy, Duration::from_secs(3));
        drain.begin_now();
    }
    let meta = RunMeta {
        host: hostname(),
        kernel: kernel_release(),
        start_unix_s: libc_time() as u64,
        rate_hz: cfg.rate_hz,
        cpus,
        command_line: argv.to_vec(),
        ..RunMeta::default()
    };
    let mut b = Building {
        builder: stack::StackBuilder::new(stack::BuildConfig {
            native: cfg.native,
            kernel: cfg.kernel,
            threads: cfg.threads,
        }),
        profile: Profile::new(meta),
        registry: ProcessRegistry::new(),
        built: (0, Duration::ZERO),
    };
    let mut progress = summary::Progress::new(cfg.progress);
    let stage_cfg = pystage::StageConfig {
        gil: cfg.gil,
        threads: cfg.threads,
    };
    // The stack builder's queue: a quarter of the drain's (memory stays bounded by both).
    let capacity = (drain::queue_capacity(cfg.stack_bytes) / 4).max(1024);
    let (stage, rx) = pystage::start(stage_cfg, tracker, drained, capacity);
    // After the Python stage started: Python processes are announced to the kernel while this
    // slower scan runs (samples wait in the queues meanwhile).
    match &cfg.target {
        Target::All => {
            b.registry.scan_all();
        }
        Target::Pids(p) => {
            for &pid in p {
                b.registry.get_or_load(pid);
            }
        }
        Target::Command(_) => {}
    }
    let threads = Threads {
        drain: &drain,
        stage: &stage,
        rx: &rx,
    };
    let elapsed = sample_loop(cfg, &mut b, &threads, &mut child, &mut progress);
    let finished = drain.finish()?;
    // What the drain thread queued before it stopped: the stage ends when its input closes.
    for item in &rx {
        b.handle(item);
    }
    let report = stage.finish();
    progress.finish();

    b.profile.meta.duration_s = elapsed.as_secs_f64();
    let summary = summarize(cfg, &mut b, &finished, report);
    let mut stderr = std::io::stderr().lock();
    let _ = summary.print(&mut stderr);
    write_outputs(cfg, &b.profile, &mut stderr)?;
    Ok(summary)
}

/// Writes every output of the run. A file that fails does not stop the others: earlier
/// failures are printed here, the last one is returned.
fn write_outputs(
    cfg: &RecordConfig,
    profile: &Profile,
    stderr: &mut std::io::StderrLock<'_>,
) -> Result<(), RecordError> {
    let mut failed = None;
    for (path, format) in &cfg.outputs {
        match write_atomically(path, |w| format.render(profile, w)) {
            Ok(()) => {
                let _ = writeln!(stderr, "Wrote {} to {}", format.describe(), path.display());
            }
            Err(source) => {
                let e = RecordError::Write {
                    path: path.clone(),
                    source,
                };
                if let Some(earlier) = failed.replace(e) {
                    let _ = writeln!(stderr, "pyebpf: {earlier}");
                }
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Fills the profile's error counts and builds the summary.
fn summarize(
    cfg: &RecordConfig,
    b: &mut Building,
    finished: &drain::Finished,
    report: pystage::StageReport,
) -> RecordSummary {
    let (builder, registry) = (&b.builder, &b.registry);
    let meta = &mut b.profile.meta;
    meta.lost_samples = finished.counters.lost_samples() + finished.dropped;
    meta.errors = builder.errors().clone();
    if finished.dropped > 0 {
        meta.errors
            .insert("lost_in_user_space".to_string(), finished.dropped);
    }
    for (name, value) in finished.counters.error_counts() {
        if value > 0 {
            meta.errors.insert(name.to_string(), value);
        }
    }
    for (name, value) in registry.error_counts() {
        if value > 0 {
            meta.errors.insert(format!("procs_{name}"), value);
        }
    }
    for (name, value) in &report.errors {
        *meta.errors.entry((*name).to_string()).or_default() += value;
    }
    // Python failures, summed over processes (the per-process lines break them down).
    for (_, s) in &report.procs {
        for (kind, n) in &s.errors {
            *meta.errors.entry(format!("python_{kind}")).or_default() += n;
        }
    }
    let mut summary =
        RecordSummary::from_profile(&b.profile, cfg, signals::STOP.load(Ordering::Relaxed));
    summary.python = report
        .procs
        .into_iter()
        .map(|(pid, stats)| PyProcLine {
            pid,
            merge_mismatches: builder.mismatches().get(&pid).copied().unwrap_or(0),
            stats,
        })
        .collect();
    summary.python_overflow = report.overflow;
    summary.program = finished.program;
    if std::env::var("PYEBPF_STATS").as_deref() == Ok("1") {
        summary.user_cost = Some([(report.samples, report.busy), b.built]);
    }
    summary
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
