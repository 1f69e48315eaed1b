//! Loading and attaching the programs of the loaded object: the process-event programs (raw
//! tracepoints; the perf-event `task_newtask` tracepoint on kernels without BTF), the
//! CPU-clock sampler on every online CPU and, with `--idle`, the BTF tracepoints.
//!
//! Owns: the attach calls and the translation of their failures into [`CollectError`]s (the
//! verifier log kept in a field). Input: the loaded [`Ebpf`] and the chosen variants. Output:
//! attached programs (their links live in the `Ebpf`, so dropping it detaches everything).
//! Constraints: every attachment detaches quickly when the run ends except a perf-event
//! tracepoint's, which waits for RCU grace periods (`perf_trace_event_unreg`): only the
//! child-following fallback uses one, and only when children are followed.

use aya::programs::{
    PerfEvent, ProgramError, RawTracePoint, TracePoint,
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
};
use aya::{Btf, Ebpf};
use sampler_common::programs;

use super::error::{CollectError, errno_of, one_line};

/// Translate a program load failure, keeping the verifier log out of the message.
pub(super) fn load_error(program: &'static str, err: ProgramError) -> CollectError {
    match err {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => CollectError::ProgramLoad {
            program,
            reason: io_error.to_string(),
            errno: io_error.raw_os_error(),
            verifier_log: verifier_log.to_string(),
        },
        other => CollectError::ProgramLoad {
            program,
            reason: one_line(&other),
            errno: errno_of(&other),
            verifier_log: String::new(),
        },
    }
}

/// The program `name` of `ebpf` as a `T`, or why not.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CollectError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let missing = CollectError::MissingInObject {
        kind: "program",
        name,
    };
    ebpf.program_mut(name)
        .ok_or(missing)?
        .try_into()
        .map_err(|e| load_error(name, e))
}

/// Load `program` and attach it to the raw tracepoint `name`.
pub(super) fn raw_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    name: &'static str,
) -> Result<(), CollectError> {
    let tp: &mut RawTracePoint = self::program(ebpf, program)?;
    tp.load().map_err(|e| load_error(program, e))?;
    tp.attach(name)
        .map_err(|e| CollectError::AttachTracepoint {
            category: "raw_tp",
            name,
            reason: one_line(&e),
            errno: errno_of(&e),
        })?;
    Ok(())
}

/// Load `program` and attach it to the perf-event tracepoint `category/name`.
pub(super) fn tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &'static str,
    name: &'static str,
) -> Result<(), CollectError> {
    let tp: &mut TracePoint = self::program(ebpf, program)?;
    tp.load().map_err(|e| load_error(program, e))?;
    tp.attach(category, name)
        .map_err(|e| CollectError::AttachTracepoint {
            category,
            name,
            reason: one_line(&e),
            errno: errno_of(&e),
        })?;
    Ok(())
}

/// The process-event programs: exec and exit always (raw tracepoints), and the chosen
/// child-following program `fork` when children are followed.
pub(super) fn process_events(
    ebpf: &mut Ebpf,
    fork: Option<&'static str>,
) -> Result<(), CollectError> {
    raw_tracepoint(ebpf, programs::EXEC, "sched_process_exec")?;
    raw_tracepoint(ebpf, programs::EXIT, "sched_process_exit")?;
    match fork {
        Some(programs::FORK_TRACEPOINT) => {
            tracepoint(ebpf, programs::FORK_TRACEPOINT, "task", "task_newtask")
        }
        Some(program) => raw_tracepoint(ebpf, program, "task_newtask"),
        None => Ok(()),
    }
}

/// Load and attach the off-CPU programs: `program` (the chosen `sched_switch` variant) and
/// `pyebpf_wakeup`, BTF tracepoints typed against the kernel's own BTF `btf` (the one the
/// loader was given).
pub(super) fn offcpu(
    ebpf: &mut Ebpf,
    program: &'static str,
    btf: &Btf,
) -> Result<(), CollectError> {
    for (name, tracepoint) in [
        (program, "sched_switch"),
        (programs::WAKEUP, "sched_wakeup"),
    ] {
        let tp: &mut aya::programs::BtfTracePoint = self::program(ebpf, name)?;
        tp.load(tracepoint, btf).map_err(|e| load_error(name, e))?;
        tp.attach().map_err(|e| CollectError::AttachTracepoint {
            category: "tp_btf",
            name: tracepoint,
            reason: one_line(&e),
            errno: errno_of(&e),
        })?;
    }
    Ok(())
}

/// Load the sampling program `program` (the chosen variant) and attach it to a CPU-clock event
/// on every online CPU. Returns the number of CPUs.
pub(super) fn perf_events(
    ebpf: &mut Ebpf,
    program: &'static str,
    frequency_hz: u64,
) -> Result<usize, CollectError> {
    const ONLINE: &str = "/sys/devices/system/cpu/online";
    let perf: &mut PerfEvent = self::program(ebpf, program)?;
    perf.load().map_err(|e| load_error(program, e))?;
    let cpus = aya::util::online_cpus().map_err(|(_, source)| CollectError::OnlineCpus {
        path: ONLINE,
        source,
    })?;
    for &cpu in &cpus {
        perf.attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Frequency(frequency_hz),
            false,
        )
        .map_err(|e| CollectError::AttachPerf {
            cpu,
            reason: one_line(&e),
            errno: errno_of(&e),
        })?;
    }
    Ok(cpus.len())
}
