//! The `record` command: drives the data path from the eBPF collector to the output file.
//!
//! Owns: the sampling loop, its stop conditions (duration, Ctrl-C/SIGTERM, the profiled
//! command's exit), starting `-- COMMAND` under the kernel filter before it runs, the progress
//! line, and the end-of-run summary. Input: a validated [`RecordConfig`]. Output: the profile
//! file (written atomically) and a [`RecordSummary`].
//!
//! The per-sample work (stack building) lives in [`stack`]; everything expensive there is
//! cached per file or per unique frame.

mod drain;
mod signals;
mod spawn;
mod stack;
mod summary;

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::collect::{CollectConfig, Collector, Event};
use drain::Drained;
use crate::config::{RecordConfig, Target};
use crate::output::write_atomically;
use crate::procs::ProcessRegistry;
use crate::profile::{Profile, RunMeta};

pub use summary::RecordSummary;

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

/// Routes one drained item to the registry and the stack builder.
fn handle(builder: &mut stack::StackBuilder, profile: &mut Profile, registry: &mut ProcessRegistry, item: Drained) {
    match item {
        Drained::Sample(s, kernel) => builder.add(profile, registry, kernel.as_deref(), s),
        Drained::Proc(Event::Exec(p)) => {
            registry.on_exec(p.pid);
            builder.forget_process(p.pid);
        }
        Drained::Proc(Event::Exit(p)) => registry.on_exit(p.pid),
        Drained::Proc(Event::Fork(p)) => {
            registry.get_or_load(p.pid);
        }
        Drained::Proc(Event::Sample(_)) => {}
    }
}

/// A file-name-safe local timestamp, `YYYYmmdd-HHMMSS`, for default output names.
pub fn timestamp_for_file_name() -> String {
    let now = libc_time();
    // SAFETY: `localtime_r` writes into our zeroed struct; `now` is a valid time_t.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &raw mut tm) };
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

/// Runs `record` to completion and writes the output. `argv` is stored in the run metadata.
pub fn run(cfg: &RecordConfig, argv: &[String]) -> Result<RecordSummary, RecordError> {
    signals::install();
    let self_pid = std::process::id();
    let (pids, follow_children) = match &cfg.target {
        Target::All => (Vec::new(), false),
        Target::Pids(p) => (p.clone(), cfg.subprocesses),
        Target::Command(_) => (Vec::new(), true),
    };
    let filter = !matches!(cfg.target, Target::All);
    let ccfg = CollectConfig {
        frequency_hz: cfg.rate_hz,
        pids: pids.clone(),
        filter_pids: filter,
        follow_children,
        stack_bytes: cfg.stack_bytes,
        kernel_stacks: cfg.kernel,
        ring_bytes: sampler_common::DEFAULT_RING_BYTES,
        self_pid,
    };
    let mut collector = Collector::start(&ccfg)?;
    let mut registry = ProcessRegistry::new();
    match &cfg.target {
        Target::All => {
            registry.scan_all();
        }
        Target::Pids(p) => {
            for &pid in p {
                registry.get_or_load(pid);
            }
        }
        Target::Command(_) => {}
    }
    let mut child = match &cfg.target {
        Target::Command(cmd) => {
            let mut child =
                spawn::spawn_held(cmd).map_err(|source| RecordError::Spawn { command: cmd.join(" "), source })?;
            collector.add_target_pid(child.pid())?;
            child.release().map_err(|source| RecordError::Spawn { command: cmd.join(" "), source })?;
            Some(child)
        }
        _ => None,
    };

    let meta = RunMeta {
        host: hostname(),
        kernel: kernel_release(),
        start_unix_s: libc_time() as u64,
        rate_hz: cfg.rate_hz,
        cpus: collector.online_cpus(),
        command_line: argv.to_vec(),
        ..RunMeta::default()
    };
    let mut profile = Profile::new(meta);
    let mut builder = stack::StackBuilder::new(cfg);
    let mut progress = summary::Progress::new(cfg.progress);
    let started = Instant::now();
    let deadline = cfg.duration.map(|d| started + d);
    let (drain, rx) = drain::start(collector, cfg.stack_bytes);

    loop {
        let stop_now = signals::STOP.load(Ordering::Relaxed)
            || deadline.is_some_and(|d| Instant::now() >= d)
            || child.as_mut().is_some_and(spawn::HeldChild::try_wait)
            || drain.is_finished();
        if stop_now {
            break;
        }
        let wait = deadline.map_or(Duration::from_millis(100), |d| {
            d.saturating_duration_since(Instant::now()).min(Duration::from_millis(100))
        });
        match rx.recv_timeout(wait) {
            Ok(item) => {
                handle(&mut builder, &mut profile, &mut registry, item);
                // Everything already queued, without waiting.
                while let Ok(item) = rx.try_recv() {
                    handle(&mut builder, &mut profile, &mut registry, item);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        progress.tick(started.elapsed(), profile.samples().len(), profile.process_count());
    }
    let elapsed = started.elapsed();
    let (counters, dropped) = drain.finish()?;
    // What the drain thread queued before it stopped.
    while let Ok(item) = rx.try_recv() {
        handle(&mut builder, &mut profile, &mut registry, item);
    }
    progress.finish();

    profile.meta.duration_s = elapsed.as_secs_f64();
    profile.meta.lost_samples = counters.lost_samples() + dropped;
    profile.meta.errors = builder.errors().clone();
    if dropped > 0 {
        profile.meta.errors.insert("lost_in_user_space".to_string(), dropped);
    }
    for (name, value) in counters.error_counts() {
        if value > 0 {
            profile.meta.errors.insert(name.to_string(), value);
        }
    }
    for (name, value) in registry.error_counts() {
        if value > 0 {
            profile.meta.errors.insert(format!("procs_{name}"), value);
        }
    }

    let summary = RecordSummary::from_profile(&profile, cfg, signals::STOP.load(Ordering::Relaxed));
    let mut stderr = std::io::stderr().lock();
    let _ = summary.print(&mut stderr);
    write_atomically(&cfg.output, |w| cfg.format.render(&profile, w))
        .map_err(|source| RecordError::Write { path: cfg.output.clone(), source })?;
    let _ = writeln!(stderr, "Wrote {} to {}", cfg.format.describe(), cfg.output.display());
    Ok(summary)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}
