//! `dump` of a live process: one snapshot of every thread, and with `--native` each thread
//! stopped in turn (`ptrace`) while its registers, stack and Python frames are read.

use std::path::Path;
use std::sync::Arc;

use sampler_common::UserRegs;

use super::native::{CopiedStack, Merged, NativeStages};
use super::ptrace::{MAX_STACK_COPY, StopError, ThreadStop, read_stack};
use super::{DumpError, DumpOptions, NativeDump, Pauses, Snapshot, ThreadDump, live_cmdline};
use crate::merge::EvalRanges;
use crate::merge::evalrange::file_eval_ranges;
use crate::procs::ProcessRegistry;
use crate::python::walker::Limits;
use crate::python::{PyError, PyThread, PythonProcess};

pub(super) fn snapshot(pid: u32, opts: &DumpOptions) -> Result<Snapshot, DumpError> {
    let mut proc = PythonProcess::attach(pid)?;
    proc.set_limits(Limits {
        locals: opts.locals,
        ..proc.limits()
    });
    let threads = proc.threads()?;
    let gil_enabled = proc.gil_enabled().unwrap_or(true);
    let cmdline = live_cmdline(pid);
    let (threads, pauses) = if opts.native {
        let (t, p) = native_threads(&mut proc, threads)?;
        (t, Some(p))
    } else {
        let t = threads
            .into_iter()
            .map(|py| ThreadDump { py, native: None })
            .collect();
        (t, None)
    };
    Ok(Snapshot {
        pid,
        core: None,
        cmdline,
        version: proc.version(),
        gil_enabled,
        with_locals: opts.locals.is_some(),
        threads,
        counts: proc.error_counts().clone(),
        pauses,
    })
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Every thread stopped in turn: registers, stack copy and a fresh walk of its Python frames
/// while it is stopped; then (running again) unwound, symbolized and merged.
fn native_threads(
    proc: &mut PythonProcess,
    threads: Vec<PyThread>,
) -> Result<(Vec<ThreadDump>, Pauses), DumpError> {
    let pid = proc.pid();
    let mut registry = ProcessRegistry::new();
    if registry.get_or_load(pid).is_none() {
        return Err(DumpError::Exited { pid });
    }
    let d = proc.detected();
    let eval = file_eval_ranges(pid, d)
        .ok()
        .map(|f| Arc::new(EvalRanges::new(&f, d.bias)));
    let mut stages = NativeStages::new(registry, eval);
    let mut pauses = Pauses::default();
    let mut out = Vec::with_capacity(threads.len());
    for mut py in threads {
        let native = match py.host_tid {
            None => NativeDump {
                merged: Merged::python_only(py.frames.len()),
                pause_us: None,
                error: Some("its thread id on the host is not known".into()),
            },
            Some(tid) => match stop_and_read(proc, &stages, tid, &mut py) {
                Ok((regs, stack, pause_us)) => {
                    pauses.threads += 1;
                    pauses.max_us = pauses.max_us.max(pause_us);
                    pauses.total_us += pause_us;
                    NativeDump {
                        merged: stages.thread(pid, regs, &stack, &py.items, !py.truncated),
                        pause_us: Some(pause_us),
                        error: None,
                    }
                }
                Err(_) if !process_exists(pid) => return Err(DumpError::Exited { pid }),
                Err(e) => NativeDump {
                    merged: Merged::python_only(py.frames.len()),
                    pause_us: None,
                    error: Some(e),
                },
            },
        };
        out.push(ThreadDump {
            py,
            native: Some(native),
        });
    }
    Ok((out, pauses))
}

/// Stops thread `tid`, reads its registers, copies its stack, walks its Python frames again
/// (they replace the ones in `py`), and lets it go. Returns the registers, the copy and the
/// pause in µs.
fn stop_and_read(
    proc: &mut PythonProcess,
    stages: &NativeStages,
    tid: u32,
    py: &mut PyThread,
) -> Result<(UserRegs, CopiedStack, u64), String> {
    let pid = proc.pid();
    let stop = ThreadStop::stop(tid).map_err(|e| e.to_string())?;
    let regs = stop.regs().map_err(|e| e.to_string())?;
    let end = stages
        .registry
        .get(pid)
        .and_then(|p| p.mapping_for(regs.rsp))
        .map_or(regs.rsp.saturating_add(MAX_STACK_COPY), |m| m.end);
    let bytes = read_stack(pid, regs.rsp, end);
    let walked = proc.thread_frames(py.tstate_addr);
    let pause = stop.elapsed();
    drop(stop);
    match walked {
        Ok(w) => {
            py.frames = w.frames;
            py.items = w.items;
            py.locals = w.locals;
            py.truncated = w.truncated;
        }
        Err(PyError::ProcessGone { .. }) => return Err(StopError::Gone { tid }.to_string()),
        // The frames of the first walk stay; the merge will say whether they fit.
        Err(_) => {}
    }
    Ok((
        UserRegs {
            ip: regs.rip,
            sp: regs.rsp,
            bp: regs.rbp,
        },
        CopiedStack {
            base: regs.rsp,
            bytes,
        },
        u64::try_from(pause.as_micros()).unwrap_or(u64::MAX),
    ))
}
