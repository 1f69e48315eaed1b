//! A sampling session: the data path from the eBPF collector to the [`Profile`], shared by
//! `record` (which writes the profile at the end) and `top` (which shows it live).
//!
//! Owns: starting the collector (and `-- COMMAND`, held until it is a target), the Python
//! tracker, the drain and Python-stage threads, the stack builder, the stop conditions
//! (duration, Ctrl-C/SIGTERM/SIGHUP, the profiled command's exit, every `-p` target's exit, a
//! stage thread ending), stopping the command (SIGINT, SIGTERM, SIGKILL) and the end-of-run
//! accounting. Input: a [`SessionConfig`]. Output: the profile, grown while
//! [`Session::run`] calls its tick callback about every [`TICK`], and at the end a
//! [`RecordSummary`].

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::collect::{CollectConfig, Collector, Event, VariantChoice};
pub use crate::config::SessionConfig;
use crate::config::Target;
use crate::privilege::cap;
use crate::procs::ProcessRegistry;
use crate::profile::{Profile, RunMeta};
use sampler_common::Counter;

use super::pystage::{self, Staged, StagedBatch};
use super::summary::{PyProcLine, RecordSummary};
use super::{RecordError, drain, libc_time, pytrack, signals, spawn, stack};

/// How often [`Session::run`] calls its tick callback.
pub const TICK: Duration = Duration::from_millis(100);

/// What the tick callback is told besides the profile.
#[derive(Clone, Copy, Debug)]
pub struct Tick {
    /// Time since sampling began.
    pub elapsed: Duration,
    /// Samples lost so far: in the kernel (ring buffer full) and in user space (queue full).
    pub lost_samples: u64,
}

/// What the tick callback asks of the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep sampling.
    Continue,
    /// End [`Session::run`].
    Stop,
}

/// The stack-building side of a run: the profile and what builds it.
struct Building {
    builder: stack::StackBuilder,
    profile: Profile,
    registry: ProcessRegistry,
    /// Samples built, and the time spent building them.
    built: (u64, Duration),
    /// With `-p`: the targets (and, with `--subprocesses`, their descendants) not known to have
    /// exited; the run ends when none is left.
    alive: Option<std::collections::HashSet<u32>>,
    /// Follow forks of `alive` processes.
    follow_forks: bool,
}

impl Building {
    /// Handles one staged batch, then tells the drain its samples are off the queue.
    fn handle_batch(&mut self, batch: StagedBatch, backlog: &drain::Backlog) {
        let t0 = Instant::now();
        for item in batch.items {
            self.handle(item);
        }
        self.built.1 += t0.elapsed();
        backlog.done(batch.drained);
    }

    /// Routes one staged item to the registry and the stack builder.
    fn handle(&mut self, item: Staged) {
        match item {
            Staged::Sample(s) => {
                self.builder.add(&mut self.profile, &mut self.registry, s);
                self.built.0 += 1;
            }
            Staged::Proc(Event::Exec(p)) => {
                self.registry.on_exec(p.pid);
                self.builder.forget_process(p.pid);
            }
            Staged::Proc(Event::Exit(p)) => self.registry.on_exit(p.pid),
            Staged::Proc(Event::Fork(p)) => {
                self.registry.get_or_load(p.pid);
                if let Some(alive) = self.alive.as_mut().filter(|_| self.follow_forks)
                    && alive.contains(&p.parent_pid)
                {
                    alive.insert(p.pid);
                }
            }
            Staged::Proc(Event::Sample(_)) => {}
        }
    }
}

/// A running session: the collector is attached and the threads are running.
pub struct Session {
    cfg: SessionConfig,
    b: Building,
    drain: drain::Drain,
    stage: pystage::PyStageHandle,
    rx: Receiver<StagedBatch>,
    backlog: drain::Backlog,
    child: Option<spawn::HeldChild>,
    elapsed: Duration,
}

/// A finished session.
pub struct Ended {
    /// Everything sampled (what [`Session::run`]'s callback left in it).
    pub profile: Profile,
    /// The end-of-run summary (its error counts are also in the profile's metadata).
    pub summary: RecordSummary,
}

/// How long `-p` waits for its targets to be attached before sampling starts (it goes on as
/// soon as they are): milliseconds natively, seconds on an emulated kernel (the kernel matrix's
/// 5.10 guest needed more than 2 s for a 3.13t target, whose first samples then had no Python
/// frames).
const PIDS_ATTACH_WAIT: Duration = Duration::from_secs(10);

/// The capabilities the rest of a run needs (`privilege::cap` says why each one); `cap_bpf`:
/// the kernel refuses map operations without `CAP_BPF`.
fn kept_capabilities(cfg: &SessionConfig, cap_bpf: bool) -> Vec<u32> {
    let mut keep = vec![
        cap::CHOWN,
        cap::DAC_OVERRIDE,
        cap::DAC_READ_SEARCH,
        cap::SYS_PTRACE,
        cap::CHECKPOINT_RESTORE,
    ];
    if cfg.run_as.is_some() {
        keep.push(cap::KILL);
    }
    if cfg.kernel {
        keep.push(cap::SYSLOG);
    }
    if cap_bpf {
        keep.push(cap::BPF);
    }
    keep
}

/// Starts the collector (and `-- COMMAND`, held until it is a target).
fn start_collector(
    cfg: &SessionConfig,
) -> Result<(Collector, Option<spawn::HeldChild>), RecordError> {
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
        ring_bytes: cfg.ring_bytes,
        self_pid: std::process::id(),
        variant: VariantChoice::from_env(),
        idle: cfg.idle,
    };
    let mut collector = Collector::start(&collect_cfg)?;
    for note in collector.notes() {
        eprintln!("pyebpf: {note}");
    }
    let child = match &cfg.target {
        Target::Command(cmd) => {
            let spawn_err = |source| RecordError::Spawn {
                command: crate::printable::printable(&cmd.join(" ")).into_owned(),
                source,
            };
            let mut child = spawn::spawn_held(cmd, cfg.run_as.as_ref()).map_err(spawn_err)?;
            collector.add_target_pid(child.pid())?;
            child.release().map_err(spawn_err)?;
            Some(child)
        }
        _ => None,
    };
    Ok((collector, child))
}

impl Session {
    /// Installs the Ctrl-C/SIGTERM handlers, loads and attaches the eBPF program, starts the
    /// threads. `argv` is stored in the run metadata. Messages about targets without Python
    /// frames go to stderr here, before sampling.
    pub fn start(cfg: SessionConfig, argv: &[String]) -> Result<Session, RecordError> {
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
        let (mut collector, child) = start_collector(&cfg)?;
        let keep_cap_bpf = collector.maps_need_cap_bpf();
        // Taken before the collector moves into the drain thread: the Python stage writes it
        // (and with --idle seeds OFFCPU for threads asleep when their process is attached).
        if let Some(offcpu) = collector.take_offcpu() {
            tracker.set_offcpu(offcpu);
        }
        tracker.set_sink(Box::new(collector.take_python_procs()?));
        if let Target::Pids(pids) = &cfg.target {
            // The kernel walks their Python frames from the first drained samples on.
            tracker.wait_for(pids, PIDS_ATTACH_WAIT);
            for (pid, why) in tracker.failures(pids) {
                eprintln!(
                    "pyebpf: no Python frames for pid {pid}: {}",
                    crate::printable::printable(&why)
                );
            }
        } else {
            tracker.tick(Instant::now());
        }
        let all = matches!(cfg.target, Target::All);
        // With --all, the run begins once the busy Python processes are announced to the
        // kernel: until then their samples would carry no Python frames. The drain runs
        // meanwhile (the ring buffer never fills) and discards those early samples.
        let cpus = collector.online_cpus();
        let (drain, drained, backlog) = drain::start(collector, cfg.stack_bytes, all);
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
            idle: cfg.idle,
            ..RunMeta::default()
        };
        let mut b = Building {
            builder: stack::StackBuilder::new(stack::BuildConfig {
                native: cfg.native,
                kernel: cfg.kernel,
                threads: cfg.threads,
                offcpu_period_ns: if cfg.idle {
                    crate::collect::offcpu_period_ns(cfg.rate_hz)
                } else {
                    0
                },
            }),
            profile: Profile::new(meta),
            registry: ProcessRegistry::new(),
            built: (0, Duration::ZERO),
            alive: match &cfg.target {
                Target::Pids(p) => Some(p.iter().copied().collect()),
                _ => None,
            },
            follow_forks: cfg.subprocesses,
        };
        let stage_cfg = pystage::StageConfig {
            gil: cfg.gil,
            threads: cfg.threads,
        };
        // Batches between the stages (the samples in them are bounded by the drain's backlog).
        let (stage, rx) = pystage::start(stage_cfg, tracker, drained, 64);
        // After the Python stage started: Python processes are announced to the kernel while
        // this slower scan runs (samples wait in the queues meanwhile).
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
        // Attached, targets opened: keep only what reading targets, stopping the command and
        // writing the outputs need.
        if let Err(e) = crate::privilege::drop_capabilities(&kept_capabilities(&cfg, keep_cap_bpf))
        {
            eprintln!("pyebpf: warning: could not drop capabilities: {e}");
        }
        Ok(Session {
            cfg,
            b,
            drain,
            stage,
            rx,
            backlog,
            child,
            elapsed: Duration::ZERO,
        })
    }

    /// Whether a stop condition other than the deadline holds.
    fn must_stop(&mut self) -> bool {
        signals::STOP.load(Ordering::Relaxed)
            || self.child.as_mut().is_some_and(spawn::HeldChild::try_wait)
            || self.drain.is_finished()
            || self.stage.is_finished()
    }

    /// With `-p`: whether every target (and followed descendant) has exited.
    fn targets_gone(&mut self) -> bool {
        let Some(alive) = self.b.alive.as_mut() else {
            return false;
        };
        alive.retain(|&pid| running(pid));
        alive.is_empty()
    }

    /// Builds stacks into the profile until a stop condition holds or `on_tick` returns
    /// [`Flow::Stop`]; `on_tick` is called at the start, then about every [`TICK`]. Returns the
    /// time sampled.
    pub fn run(&mut self, mut on_tick: impl FnMut(&mut Profile, &Tick) -> Flow) -> Duration {
        let started = Instant::now();
        let deadline = self.cfg.duration.map(|d| started + d);
        let mut next_tick = started;
        loop {
            let now = Instant::now();
            if self.must_stop() || deadline.is_some_and(|d| now >= d) {
                break;
            }
            if now >= next_tick {
                if self.targets_gone() {
                    break;
                }
                let tick = Tick {
                    elapsed: now - started,
                    lost_samples: self.drain.lost_so_far(),
                };
                if on_tick(&mut self.b.profile, &tick) == Flow::Stop {
                    break;
                }
                next_tick = now + TICK;
            }
            let mut wait = next_tick.saturating_duration_since(Instant::now());
            if let Some(d) = deadline {
                wait = wait.min(d.saturating_duration_since(Instant::now()));
            }
            match self.rx.recv_timeout(wait) {
                Ok(batch) => {
                    self.b.handle_batch(batch, &self.backlog);
                    // Everything already queued, without waiting.
                    while let Ok(batch) = self.rx.try_recv() {
                        self.b.handle_batch(batch, &self.backlog);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.elapsed += started.elapsed();
        self.elapsed
    }

    /// Stops sampling, builds what is still queued and returns the profile and the summary.
    pub fn finish(mut self) -> Result<Ended, RecordError> {
        let finished = self.drain.finish()?;
        // What the drain thread queued before it stopped: the stage ends when its input closes.
        for batch in &self.rx {
            self.b.handle_batch(batch, &self.backlog);
        }
        let report = self.stage.finish();
        self.b.profile.meta.duration_s = self.elapsed.as_secs_f64();
        let mut summary = summarize(&self.cfg, &mut self.b, &finished, report);
        // `-- COMMAND` still running: SIGINT, then SIGTERM (then SIGKILL), as perf does.
        summary.command_status = self
            .child
            .as_mut()
            .map(|c| crate::printable::printable(&c.stop().to_string()).into_owned());
        Ok(Ended {
            profile: self.b.profile,
            summary,
        })
    }
}

/// Fills the profile's error counts and builds the summary.
fn summarize(
    cfg: &SessionConfig,
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
    let mut summary = RecordSummary::from_profile(
        &b.profile,
        cfg.rate_hz,
        signals::STOP.load(Ordering::Relaxed),
    );
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
    summary.skipped = report.skipped;
    summary.program.clone_from(&finished.program);
    if cfg.idle {
        let c = &finished.counters;
        summary.offcpu = Some(super::summary::OffCpuLine {
            switches: c.get(Counter::OffCpuSwitches),
            sent: c.get(Counter::OffCpuSent),
            short: c.get(Counter::OffCpuShort),
            lost: c.get(Counter::OffCpuLost),
            map_full: c.get(Counter::OffCpuMapFull),
            program: finished.offcpu_program.clone(),
        });
    }
    if std::env::var("PYEBPF_STATS").as_deref() == Ok("1") {
        summary.user_cost = Some([(report.samples, report.busy), b.built]);
    }
    summary
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        !matches!(state, Some("Z" | "X") | None)
    })
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
