//! collect stage: load the eBPF object, attach it, and turn its ring buffer into [`Event`]s.
//!
//! Owns: the embedded eBPF object, every eBPF map and program of it (nothing else in the crate
//! touches them), the perf events (one software CPU-clock event per online CPU) and the three
//! process-event tracepoints. Which variant of the sampling program is loaded is decided by
//! `variant.rs` (kernel probes, the variant table) before anything loads.
//! Input: a [`CollectConfig`]; Python processes to walk in the kernel through the
//! [`PythonProcMap`] handed out by [`Collector::take_python_procs`]. Output: [`Event`]s
//! delivered by [`Collector::poll`] (samples carry the kernel's Python capture,
//! [`PyCaptured`]), kernel stacks by id ([`Collector::kernel_stack`]), [`CounterTotals`] and
//! [`ProgramStats`].
//!
//! Constraints: synchronous (the record loop calls `poll` with a timeout); never panics on
//! ring-buffer contents (malformed records are counted and skipped); needs root or
//! CAP_BPF + CAP_PERFMON (checked earlier by `preflight`). CPU hot-plug is not followed: CPUs
//! that come online after `start` are not sampled.
mod attach;
pub mod btf;
mod counters;
mod decode;
mod error;
mod loader;
mod offcpu;
mod python_procs;
mod targets;
mod tracefs;
mod variant;

#[cfg(test)]
mod offcpu_tests;
#[cfg(test)]
mod python_tests;
#[cfg(test)]
mod root_tests;

use std::{
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::Duration,
};

use aya::{
    Btf, Ebpf,
    maps::{HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
};
pub use counters::CounterTotals;
pub use decode::{Event, Malformed, ProcChange, PyCaptured, RawSample, StackCopy, decode_record};
pub use error::CollectError;
use error::{errno_of, one_line};
pub use offcpu::{OffCpuMap, Seed};
pub use python_procs::PythonProcMap;
use sampler_common::{
    Config, Counter, PyCapture, STACK_SIZE_CLASSES, SampleEvent, TARGET_PIDS_ENTRIES, maps,
    programs,
};
pub use variant::{Choice, Feature, KernelFeatures, VariantChoice};

/// Seconds of samples the ring buffer holds at the configured rate when nothing drains it
/// (the drain thread only decodes and hands batches on, so this covers it waiting for a CPU
/// on a loaded host).
pub const RING_SECONDS: f64 = 1.0;
/// With `--idle`, the ring is sized for this many more threads than CPUs sending a record at
/// every sampling instant (a thread that switches at least `rate` times a second).
pub const IDLE_RING_THREADS: usize = 8;
/// Largest ring buffer accepted (`--ring-size`).
pub const MAX_RING_BYTES: u32 = 256 << 20;
/// Largest ring buffer sized automatically: a quarter of a second at 10 000 samples/s (Python
/// samples reserve ~12 KiB each); the ring's pages are mapped twice into our memory, so more
/// would cost RSS for little.
pub const MAX_AUTO_RING_BYTES: u32 = 32 << 20;
/// Smallest ring buffer accepted.
pub const MIN_RING_BYTES: u32 = 64 << 10;

/// Bytes one sample can take in `EVENTS`: the ring's record header, the event, the stack copy
/// and a Python capture (reserved whole, whatever the depth).
pub fn record_bytes(stack_bytes: u32) -> u64 {
    8 + (size_of::<SampleEvent>() + size_of::<PyCapture>()) as u64 + u64::from(stack_bytes)
}

/// The ring-buffer size for `rate_hz` samples per second on each of `cpus` CPUs with
/// `stack_bytes` of stack copied per sample: [`RING_SECONDS`] of samples, rounded up to a power
/// of two, between the smallest size that holds four records and [`MAX_AUTO_RING_BYTES`].
pub fn ring_bytes_for(rate_hz: u64, cpus: usize, stack_bytes: u32) -> u32 {
    let record = record_bytes(stack_bytes);
    let want = (rate_hz as f64 * cpus.max(1) as f64 * record as f64 * RING_SECONDS) as u64;
    let min = min_ring_bytes(stack_bytes);
    u32::try_from(want.max(u64::from(min)).next_power_of_two())
        .unwrap_or(MAX_RING_BYTES)
        .clamp(min, MAX_AUTO_RING_BYTES.max(min))
}

/// The smallest ring that holds four maximal records (and at least [`MIN_RING_BYTES`]).
pub fn min_ring_bytes(stack_bytes: u32) -> u32 {
    u32::try_from((4 * record_bytes(stack_bytes)).next_power_of_two())
        .unwrap_or(u32::MAX)
        .max(MIN_RING_BYTES)
}

/// The eBPF object built by `build.rs` (empty when built with `PYEBPF_SKIP_EBPF=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pyebpf-sampler"));

/// What to sample and how.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent switches of the kernel side, each a `Config` flag"
)]
pub struct CollectConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Processes to sample (with `filter_pids`); more can be added with
    /// [`Collector::add_target_pid`].
    pub pids: Vec<u32>,
    /// Sample only `pids` (and followed children). Implied when `pids` is not empty; set it with
    /// an empty `pids` to start with nothing and add a spawned command later.
    pub filter_pids: bool,
    /// Add children forked by target processes to the targets (in the kernel, at fork).
    pub follow_children: bool,
    /// User-stack bytes copied per sample: 0 for none, else one of `STACK_SIZE_CLASSES`.
    pub stack_bytes: u32,
    /// Record kernel stacks.
    pub kernel_stacks: bool,
    /// Ring-buffer size: a power of two, at least 64 KiB and 4 maximal records; 0: sized for
    /// the rate ([`ring_bytes_for`]).
    pub ring_bytes: u32,
    /// The profiler's own pid, never sampled (0: none).
    pub self_pid: u32,
    /// Which variant of the sampling program to load (`variant.rs`).
    pub variant: VariantChoice,
    /// `--idle`: follow target Python threads off a CPU too (`sched_switch`, `sched_wakeup`).
    pub idle: bool,
}

impl Default for CollectConfig {
    fn default() -> Self {
        CollectConfig {
            frequency_hz: 99,
            pids: Vec::new(),
            filter_pids: false,
            follow_children: false,
            stack_bytes: sampler_common::DEFAULT_STACK_BYTES,
            kernel_stacks: false,
            ring_bytes: 0,
            self_pid: std::process::id(),
            variant: VariantChoice::Auto,
            idle: false,
        }
    }
}

/// Run statistics of the sampling program (from `bpf_prog_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    /// The variant loaded and why (`bounded (this kernel lacks bpf_loop (Linux 5.17))`).
    pub variant: String,
    /// Total time spent in the program; `None` when run-time stats could not be enabled.
    pub run_time_ns: Option<u64>,
    /// Number of runs; `None` when run-time stats could not be enabled.
    pub run_count: Option<u64>,
    /// Instructions after the verifier's rewrites (`xlated_prog_len / 8`).
    pub translated_insns: u32,
    /// Size of the JIT-compiled code in bytes (0 without JIT).
    pub jited_bytes: u32,
    /// Instructions the verifier processed at load (reported by kernels ≥ 5.16).
    pub verified_insns: Option<u32>,
}

impl ProgramStats {
    /// Mean run time per program run (per sample, incl. filtered ones) in nanoseconds, when
    /// run-time stats are on and the program ran.
    pub fn mean_run_ns(&self) -> Option<f64> {
        let (time, runs) = (self.run_time_ns?, self.run_count?);
        (runs > 0).then(|| time as f64 / runs as f64)
    }
}

/// A loaded and attached set of programs; dropping it detaches everything.
pub struct Collector {
    /// Owns the programs and their links (maps were taken out below).
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    kstacks: StackTraceMap<MapData>,
    counters: PerCpuArray<MapData, u64>,
    targets: targets::TargetPids,
    /// `PY_PROCS`, until [`Collector::take_python_procs`] hands it out.
    python_procs: Option<PythonProcMap>,
    /// `OFFCPU` (with `--idle`), until [`Collector::take_offcpu`] hands it out.
    offcpu: Option<OffCpuMap>,
    /// The off-CPU program's variant (with `--idle`).
    switch: Option<Choice>,
    cpus: usize,
    ring_bytes: u32,
    malformed: u64,
    /// Keeps `kernel.bpf_stats_enabled` on while we run (closing it turns stats off).
    stats: Option<OwnedFd>,
    /// The sampling program's variant.
    sampler: Choice,
    /// What this kernel costs the run, one line each (printed before sampling).
    notes: Vec<String>,
    /// The program's sizes, read at attach: once capabilities are dropped the kernel reports
    /// them as 0 (`bpf_prog_get_info_by_fd` hides them without `CAP_BPF`).
    sizes: Option<ProgramStats>,
    /// The same for the off-CPU program.
    switch_sizes: Option<ProgramStats>,
}

impl Collector {
    /// Load the embedded object with `cfg`, fill the targets, attach the process-event
    /// programs and a CPU-clock perf event on every online CPU.
    pub fn start(cfg: &CollectConfig) -> Result<Collector, CollectError> {
        let ring_bytes = validate(cfg)?;
        if OBJECT.is_empty() {
            return Err(CollectError::NotBuilt);
        }
        raise_memlock_limit();
        let features = KernelFeatures::probe(&btf::path());
        tracing::debug!("start-up: kernel BTF read, features probed");
        let plan = Plan::choose(cfg, &features)?;
        // The perf-event fallback of the fork program reads its record layout from tracefs.
        let fork = if plan.fork == Some(programs::FORK_TRACEPOINT) {
            tracefs::fork_offsets(&tracefs::ensure_mounted()?)
        } else {
            tracefs::ForkOffsets::DEFAULT
        };
        let config = kernel_config(cfg, ring_bytes, &features, &plan, fork);
        // aya's own copy of the kernel BTF: only the BTF tracepoints of --idle need one.
        let aya_btf = match &plan.switch {
            Some(choice) => Some(
                Btf::parse_file(btf::path(), aya::Endianness::default()).map_err(|e| {
                    CollectError::ProgramLoad {
                        program: choice.variant.program,
                        reason: format!("kernel BTF: {}", one_line(&e)),
                        errno: None,
                        verifier_log: String::new(),
                    }
                })?,
            ),
            None => None,
        };
        let mut ebpf = loader::load(
            OBJECT,
            &config,
            ring_bytes,
            cfg.kernel_stacks,
            cfg.idle,
            aya_btf.as_ref(),
        )?;
        tracing::debug!("start-up: eBPF object parsed, maps created");
        let stats = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
            Ok(fd) => Some(fd),
            Err(err) => {
                tracing::debug!("BPF run-time stats unavailable: {}", one_line(&err));
                None
            }
        };
        let maps = Maps::take(&mut ebpf, cfg, &features)?;
        attach::process_events(&mut ebpf, plan.fork)?;
        tracing::debug!("start-up: process-event programs verified and attached");
        let cpus = attach::perf_events(&mut ebpf, plan.sampler.variant.program, cfg.frequency_hz)?;
        tracing::debug!("start-up: sampling program verified and attached");
        if let (Some(choice), Some(btf)) = (&plan.switch, &aya_btf) {
            attach::offcpu(&mut ebpf, choice.variant.program, btf)?;
        }
        drop(aya_btf);
        let mut c = Collector {
            ebpf,
            events: maps.events,
            kstacks: maps.kstacks,
            counters: maps.counters,
            targets: maps.targets,
            python_procs: Some(maps.python_procs),
            offcpu: maps.offcpu,
            switch: plan.switch,
            cpus,
            ring_bytes,
            malformed: 0,
            stats,
            sampler: plan.sampler,
            notes: plan.notes,
            sizes: None,
            switch_sizes: None,
        };
        c.sizes = c.program_stats();
        c.switch_sizes = c.offcpu_program_stats();
        Ok(c)
    }

    /// Sample `pid` too (e.g. a command spawned after `start`).
    pub fn add_target_pid(&mut self, pid: u32) -> Result<(), CollectError> {
        self.targets.add(pid)
    }

    /// The handle on `PY_PROCS` (which processes get their Python frames captured in the
    /// kernel), for the thread that attaches to Python processes. Handed out once; later calls
    /// fail with [`CollectError::AlreadyTaken`].
    pub fn take_python_procs(&mut self) -> Result<PythonProcMap, CollectError> {
        self.python_procs.take().ok_or(CollectError::AlreadyTaken {
            map: maps::PY_PROCS,
        })
    }

    /// The handle on `OFFCPU` (with `--idle`), for the thread that attaches to Python processes
    /// (it seeds threads already asleep, and reads the open intervals at the end). Handed out
    /// once; `None` without `--idle` or when taken.
    pub fn take_offcpu(&mut self) -> Option<OffCpuMap> {
        self.offcpu.take()
    }

    /// The off-CPU program's variant and why, with `--idle`.
    pub fn switch_variant(&self) -> Option<&Choice> {
        self.switch.as_ref()
    }

    /// Wait up to `timeout` for events (or until `wake` is readable), then hand every
    /// available one to `f` (bounded by one ring's worth of bytes per call). Returns how many
    /// events were delivered. An interrupted wait (EINTR, e.g. Ctrl-C) returns early without
    /// error. The kernel wakes the wait per batch (see `Config::wakeup_bytes`), so `timeout` is
    /// the longest a sample waits in a quiet ring.
    pub fn poll(
        &mut self,
        timeout: Duration,
        wake: Option<std::os::fd::BorrowedFd<'_>>,
        mut f: impl FnMut(Event),
    ) -> Result<usize, CollectError> {
        let mut fds = [
            libc::pollfd {
                fd: self.events.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.map_or(-1, |w| w.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let millis = i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX);
        // SAFETY: two valid pollfds (a negative fd is ignored) for the duration of the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, millis) } < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(CollectError::Poll { source: err });
            }
        }
        Ok(self.drain(&mut f))
    }

    /// Decode and deliver available records until the ring is empty or one ring's worth of
    /// bytes was consumed (so a flood cannot keep us here forever).
    fn drain(&mut self, f: &mut impl FnMut(Event)) -> usize {
        /// Kernel ring-buffer record header (`BPF_RINGBUF_HDR_SZ`).
        const RECORD_HEADER: usize = 8;
        let budget = self.ring_bytes as usize;
        let mut consumed = 0;
        let mut delivered = 0;
        while consumed < budget {
            let decoded = {
                let Some(item) = self.events.next() else {
                    break;
                };
                consumed += item.len() + RECORD_HEADER;
                decode_record(&item)
            };
            match decoded {
                Ok(event) => {
                    f(event);
                    delivered += 1;
                }
                Err(why) => {
                    self.malformed += 1;
                    tracing::debug!("skipped malformed ring-buffer record: {why:?}");
                }
            }
        }
        delivered
    }

    /// The kernel stack recorded under `stack_id`, innermost frame first; `None` for negative
    /// ids or ids no longer present. Ids stay valid for the collector's lifetime.
    pub fn kernel_stack(&self, stack_id: i32) -> Option<Vec<u64>> {
        let id = u32::try_from(stack_id).ok()?;
        let trace = self.kstacks.get(&id, 0).ok()?;
        let frames: Vec<u64> = trace.frames().iter().map(|frame| frame.ip).collect();
        (!frames.is_empty()).then_some(frames)
    }

    /// Kernel counters summed over CPUs, plus the collector's own counts.
    pub fn counters(&self) -> Result<CounterTotals, CollectError> {
        let mut totals = CounterTotals::from_per_cpu(|counter: Counter| {
            self.counters
                .get(&(counter as u32), 0)
                .map(|values| values.iter().copied().collect())
                .map_err(|e| CollectError::Map {
                    map: maps::COUNTERS,
                    reason: one_line(&e),
                })
        })?;
        totals.malformed = self.malformed;
        Ok(totals)
    }

    /// Statistics of the sampling program; `None` if its program info cannot be read.
    pub fn program_stats(&self) -> Option<ProgramStats> {
        let mut stats = self.stats_of(&self.sampler)?;
        if let Some(at_attach) = &self.sizes
            && stats.jited_bytes == 0
        {
            stats.translated_insns = at_attach.translated_insns;
            stats.jited_bytes = at_attach.jited_bytes;
            stats.verified_insns = stats.verified_insns.or(at_attach.verified_insns);
        }
        Some(stats)
    }

    /// Statistics of the off-CPU `sched_switch` program (`--idle`): its runs are every context
    /// switch on the host; sizes as read at attach (see [`Collector::program_stats`]).
    pub fn offcpu_program_stats(&self) -> Option<ProgramStats> {
        let mut stats = self.stats_of(self.switch.as_ref()?)?;
        if let Some(at_attach) = &self.switch_sizes
            && stats.jited_bytes == 0
        {
            stats.translated_insns = at_attach.translated_insns;
            stats.jited_bytes = at_attach.jited_bytes;
            stats.verified_insns = stats.verified_insns.or(at_attach.verified_insns);
        }
        Some(stats)
    }

    /// The statistics of the program `choice` names.
    fn stats_of(&self, choice: &Choice) -> Option<ProgramStats> {
        let info = self.ebpf.program(choice.variant.program)?.info().ok()?;
        let enabled = self.stats.is_some();
        Some(ProgramStats {
            variant: choice.to_string(),
            run_time_ns: enabled
                .then(|| u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX)),
            run_count: enabled.then(|| info.run_count()),
            translated_insns: info.size_translated().unwrap_or(0) / 8,
            jited_bytes: info.size_jitted(),
            verified_insns: info.verified_instruction_count(),
        })
    }

    /// Whether this kernel refuses map operations to a thread without `CAP_BPF`: before 6.5,
    /// with unprivileged BPF disabled, `bpf()` checks every command, not only loads (seen on
    /// Debian 11's 5.10). Tried, not guessed from the version: a short-lived thread drops its
    /// own capabilities and reads `COUNTERS`.
    pub fn maps_need_cap_bpf(&self) -> bool {
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::privilege::drop_all_in_this_thread()
                    && matches!(
                        self.counters.get(&(Counter::Runs as u32), 0),
                        Err(e) if errno_of(&e) == Some(libc::EPERM)
                    )
            })
            .join()
            .unwrap_or(true)
        })
    }

    /// The sampling program's variant and why it was chosen.
    pub fn variant(&self) -> &Choice {
        &self.sampler
    }

    /// What this kernel costs the run (e.g. no user registers in kernel mode without BTF), one
    /// line each; empty when nothing.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Number of CPUs being sampled.
    pub fn online_cpus(&self) -> usize {
        self.cpus
    }

    /// Size of the ring buffer in bytes.
    pub fn ring_bytes(&self) -> u32 {
        self.ring_bytes
    }
}

/// Which variant of each program this run loads, and what the kernel costs it.
struct Plan {
    sampler: Choice,
    /// The off-CPU program (`--idle`).
    switch: Option<Choice>,
    /// The child-following program, when children are followed.
    fork: Option<&'static str>,
    notes: Vec<String>,
}

impl Plan {
    fn choose(cfg: &CollectConfig, features: &KernelFeatures) -> Result<Plan, CollectError> {
        let sampler = variant::choose(&variant::SAMPLER, features, &cfg.variant)?;
        let switch = cfg
            .idle
            .then(|| variant::choose(&variant::SWITCH, features, &cfg.variant))
            .transpose()?;
        // PYEBPF_SAMPLE_VARIANT names the sampler's variants, not these.
        let fork = cfg
            .follow_children
            .then(|| variant::choose(&variant::FOLLOW, features, &VariantChoice::Auto))
            .transpose()?
            .map(|c| c.variant.program);
        let notes = variant::degraded_note(&sampler, features, cfg.stack_bytes)
            .into_iter()
            .collect();
        Ok(Plan {
            sampler,
            switch,
            fork,
            notes,
        })
    }
}

/// The maps user space keeps handles on, taken out of the loaded object.
struct Maps {
    events: RingBuf<MapData>,
    kstacks: StackTraceMap<MapData>,
    counters: PerCpuArray<MapData, u64>,
    targets: targets::TargetPids,
    python_procs: PythonProcMap,
    offcpu: Option<OffCpuMap>,
}

impl Maps {
    fn take(
        ebpf: &mut Ebpf,
        cfg: &CollectConfig,
        features: &KernelFeatures,
    ) -> Result<Maps, CollectError> {
        let mut targets =
            targets::TargetPids::new(take_map(ebpf, maps::TARGET_PIDS, HashMap::try_from)?);
        for &pid in &cfg.pids {
            targets.add(pid)?;
        }
        let events = take_map(ebpf, maps::EVENTS, RingBuf::try_from)?;
        let mut offcpu_kstacks = None;
        let kstacks = take_map(ebpf, maps::KERNEL_STACKS, |map| {
            if cfg.idle && cfg.kernel_stacks {
                offcpu_kstacks = second_handle(&map);
            }
            StackTraceMap::try_from(map)
        })?;
        let counters = take_map(ebpf, maps::COUNTERS, PerCpuArray::try_from)?;
        let python_procs = PythonProcMap::new(
            take_map(ebpf, maps::PY_PROCS, HashMap::try_from)?,
            features.task_fsbase_offset,
        );
        let offcpu = if cfg.idle {
            Some(OffCpuMap::new(
                take_map(ebpf, maps::OFFCPU, HashMap::try_from)?,
                offcpu_period_ns(cfg.frequency_hz),
                offcpu_kstacks,
            ))
        } else {
            None
        };
        Ok(Maps {
            events,
            kstacks,
            counters,
            targets,
            python_procs,
            offcpu,
        })
    }
}

/// The `CONFIG` the programs are loaded with.
fn kernel_config(
    cfg: &CollectConfig,
    ring_bytes: u32,
    features: &KernelFeatures,
    plan: &Plan,
    fork: tracefs::ForkOffsets,
) -> Config {
    let (sampler, switch) = (&plan.sampler, plan.switch.as_ref());
    Config {
        filter_pids: u32::from(cfg.filter_pids || !cfg.pids.is_empty()),
        follow_children: u32::from(cfg.follow_children),
        stack_bytes: cfg.stack_bytes,
        kernel_stacks: u32::from(cfg.kernel_stacks),
        self_pid: cfg.self_pid,
        fork_pid_offset: fork.pid,
        fork_flags_offset: fork.clone_flags,
        // User space wakes when an eighth of the ring is used (and every FLUSH_EVERY).
        wakeup_bytes: ring_bytes / 8,
        task_stack_offset: if sampler.variant.task_stack
            || switch.as_ref().is_some_and(|c| c.variant.task_stack)
        {
            features.task_stack_offset.unwrap_or(0)
        } else {
            0
        },
        offcpu: u32::from(cfg.idle),
        task_pid_offset: features.task_pid_offset.unwrap_or(0),
        task_state_offset: features.task_state_offset.unwrap_or(0),
        switch_prev_state: u32::from(features.switch_prev_state),
        pad: 0,
        offcpu_period_ns: offcpu_period_ns(cfg.frequency_hz),
    }
}

/// The off-CPU sampling period for a rate (`Config::offcpu_period_ns`).
pub fn offcpu_period_ns(frequency_hz: u64) -> u64 {
    1_000_000_000 / frequency_hz.max(1)
}

/// Check `cfg` against what the kernel side accepts; returns the ring size to use.
fn validate(cfg: &CollectConfig) -> Result<u32, CollectError> {
    let invalid = |setting, reason: String| Err(CollectError::InvalidConfig { setting, reason });
    if cfg.frequency_hz == 0 {
        return invalid("sampling rate", "0 Hz: use at least 1 Hz".into());
    }
    if let Some(max) = max_sample_rate()
        && cfg.frequency_hz > max
    {
        return invalid(
            "sampling rate",
            format!(
                "{} Hz is above kernel.perf_event_max_sample_rate ({max} Hz)",
                cfg.frequency_hz
            ),
        );
    }
    if cfg.stack_bytes != 0 && !STACK_SIZE_CLASSES.contains(&cfg.stack_bytes) {
        return invalid(
            "stack copy size",
            format!(
                "{} bytes: use 0 or one of {STACK_SIZE_CLASSES:?}",
                cfg.stack_bytes
            ),
        );
    }
    let ring = if cfg.ring_bytes == 0 {
        let cpus = aya::util::online_cpus().map_or(1, |c| c.len());
        // --idle: room for the off-CPU intervals of as many threads again as there are CPUs,
        // plus IDLE_RING_THREADS (each sends at most `rate` records a second).
        let streams = if cfg.idle {
            2 * cpus + IDLE_RING_THREADS
        } else {
            cpus
        };
        ring_bytes_for(cfg.frequency_hz, streams, cfg.stack_bytes)
    } else {
        cfg.ring_bytes
    };
    let min = min_ring_bytes(cfg.stack_bytes);
    if !ring.is_power_of_two() || ring < min {
        return invalid(
            "ring buffer size",
            format!("{ring} bytes: use a power of two of at least {min} bytes for this stack size"),
        );
    }
    if cfg.pids.len() > TARGET_PIDS_ENTRIES as usize {
        return invalid(
            "pid list",
            format!(
                "{} pids: at most {TARGET_PIDS_ENTRIES} can be sampled",
                cfg.pids.len()
            ),
        );
    }
    Ok(ring)
}

/// `kernel.perf_event_max_sample_rate`, if readable.
fn max_sample_rate() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Raise RLIMIT_MEMLOCK for kernels that still charge BPF memory to it (< 5.11); failure is
/// fine (newer kernels charge the memory cgroup instead).
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscalls on valid structs.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const unlimited) == 0 {
            return;
        }
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut current) == 0 {
            current.rlim_cur = current.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const current);
        }
    }
    tracing::debug!("RLIMIT_MEMLOCK could not be made unlimited (fine on kernels >= 5.11)");
}

/// A second handle on the stack-trace map `map`: with `--idle --kernel` the kernel stacks of
/// the intervals still open at the end are read after the collector is gone.
fn second_handle(map: &aya::maps::Map) -> Option<StackTraceMap<MapData>> {
    let aya::maps::Map::StackTraceMap(data) = map else {
        return None;
    };
    let fd = data.fd().as_fd().try_clone_to_owned().ok()?;
    let data = MapData::from_fd(fd).ok()?;
    StackTraceMap::try_from(aya::maps::Map::StackTraceMap(data)).ok()
}

/// Take a map out of `ebpf` and wrap it in its typed handle.
fn take_map<T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    wrap: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, CollectError> {
    let map = ebpf
        .take_map(name)
        .ok_or(CollectError::MissingInObject { kind: "map", name })?;
    wrap(map).map_err(|e| CollectError::Map {
        map: name,
        reason: one_line(&e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CollectConfig {
        CollectConfig {
            frequency_hz: 99,
            ..CollectConfig::default()
        }
    }

    #[test]
    fn default_config_is_valid() {
        let ring = validate(&cfg()).unwrap();
        assert!(ring.is_power_of_two() && ring >= MIN_RING_BYTES, "{ring}");
    }

    #[test]
    fn rejects_bad_settings_with_one_line_reasons() {
        let cases = [
            CollectConfig {
                frequency_hz: 0,
                ..cfg()
            },
            CollectConfig {
                stack_bytes: 5000,
                ..cfg()
            },
            CollectConfig {
                ring_bytes: 3 << 20,
                ..cfg()
            },
            CollectConfig {
                ring_bytes: 64 << 10,
                stack_bytes: 64 << 10,
                ..cfg()
            },
            CollectConfig {
                pids: vec![1; TARGET_PIDS_ENTRIES as usize + 1],
                ..cfg()
            },
        ];
        for c in cases {
            let err = validate(&c).unwrap_err();
            assert!(matches!(err, CollectError::InvalidConfig { .. }), "{err}");
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn every_stack_class_and_zero_ring_are_accepted() {
        for class in STACK_SIZE_CLASSES.into_iter().chain([0]) {
            assert!(
                validate(&CollectConfig {
                    stack_bytes: class,
                    ring_bytes: 0,
                    ..cfg()
                })
                .is_ok()
            );
        }
    }

    #[test]
    fn ring_follows_rate_cpus_and_stack_size() {
        // 99 Hz on 2 CPUs without a stack copy: ~2.4 MiB of samples per second.
        let low = ring_bytes_for(99, 2, 0);
        assert_eq!(low, 4 << 20, "{low}");
        // 10 000 samples/s in total: a second would be 128 MiB; the automatic size stops at 32.
        assert_eq!(ring_bytes_for(5000, 2, 0), MAX_AUTO_RING_BYTES);
        // --native at 99 Hz: the stack copy dominates.
        assert!(ring_bytes_for(99, 2, 32 << 10) > low);
        // Bounds: four records at least, MAX_AUTO_RING_BYTES at most.
        assert_eq!(ring_bytes_for(1, 1, 64 << 10), min_ring_bytes(64 << 10));
        assert!(u64::from(min_ring_bytes(64 << 10)) >= 4 * record_bytes(64 << 10));
        assert_eq!(ring_bytes_for(10_000, 512, 64 << 10), MAX_AUTO_RING_BYTES);
        for (rate, cpus, stack) in [(99, 2, 0), (5000, 2, 0), (99, 64, 65536)] {
            let r = ring_bytes_for(rate, cpus, stack);
            assert!(r.is_power_of_two());
            assert!(
                validate(&CollectConfig {
                    frequency_hz: rate,
                    stack_bytes: stack,
                    ring_bytes: r,
                    ..cfg()
                })
                .is_ok()
            );
        }
    }

    #[test]
    fn rate_above_kernel_limit_is_rejected() {
        let Some(max) = max_sample_rate() else { return };
        let err = validate(&CollectConfig {
            frequency_hz: max + 1,
            ..cfg()
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("perf_event_max_sample_rate"),
            "{err}"
        );
    }
}
