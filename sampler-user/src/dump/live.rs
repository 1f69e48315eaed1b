//! `dump` of a live process: one snapshot of every thread, and with `--native` each thread
//! stopped in turn (`ptrace`) while its registers, stack and Python frames are read; with
//! `--pause` each thread stopped in turn while its Python frames are read; without either, a
//! thread whose chain changed under the walk read again (at most [`MAX_REREADS`] times).

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

/// Reads of a thread after the first one when its chain changed under the walk.
pub const MAX_REREADS: u32 = 8;

pub(super) fn snapshot(pid: u32, opts: &DumpOptions) -> Result<Snapshot, DumpError> {
    let mut proc = PythonProcess::attach(pid)?;
    proc.set_limits(Limits {
        locals: opts.locals,
        ..proc.limits()
    });
    let threads = proc.threads()?;
    let gil_enabled = proc.gil_enabled().unwrap_or(true);
    let cmdline = live_cmdline(pid);
    let mut pause_stats = None;
    let (threads, pauses) = if opts.native {
        let (t, p) = native_threads(&mut proc, threads)?;
        (t, Some(p))
    } else if opts.pause {
        let (t, p) = paused_threads(&mut proc, threads)?;
        pause_stats = Some(p);
        (t, None)
    } else {
        let mut out = Vec::with_capacity(threads.len());
        for py in threads {
            out.push(reread_torn(&mut proc, py)?);
        }
        (out, None)
    };
    let (threads, ended) = if opts.native {
        (threads, 0)
    } else {
        settle_empty(&mut proc, threads)?
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
        paused: pause_stats,
        ended,
    })
}

/// Pause between reads of a thread without Python frames in [`settle_empty`].
const SETTLE_PAUSE: std::time::Duration = std::time::Duration::from_micros(500);
/// Reads of a thread without Python frames in [`settle_empty`] (50 ms of pauses at most: a
/// thread ending on a loaded machine may wait that long for a CPU).
const SETTLE_READS: u32 = 100;

/// Threads read without a Python frame: a thread that is starting (its first frame not pushed
/// yet) or ending (its last frame popped, its thread state not yet deleted — a thread per
/// request ends hundreds of times a second, still holding the GIL while it tears down). Each
/// is read again, [`SETTLE_PAUSE`] apart, at most [`SETTLE_READS`] times, until it has frames
/// or is gone: a gone thread is left out of the dump (the number is reported), one that stays
/// without frames is shown so.
fn settle_empty(
    proc: &mut PythonProcess,
    threads: Vec<ThreadDump>,
) -> Result<(Vec<ThreadDump>, u32), DumpError> {
    let pid = proc.pid();
    let gone = |tid: u32| !Path::new(&format!("/proc/{pid}/task/{tid}")).exists();
    let mut out = Vec::with_capacity(threads.len());
    let mut ended = 0;
    for mut t in threads {
        let (Some(tid), true) = (t.py.host_tid, t.py.frames.is_empty() && !t.py.truncated) else {
            out.push(t);
            continue;
        };
        let mut left = false;
        for _ in 0..SETTLE_READS {
            if gone(tid) {
                left = true;
                break;
            }
            std::thread::sleep(SETTLE_PAUSE);
            t.rereads += 1;
            match proc.thread_frames(t.py.tstate_addr) {
                Ok(w) if !w.frames.is_empty() => {
                    t.py.frames = w.frames;
                    t.py.items = w.items;
                    t.py.locals = w.locals;
                    t.py.truncated = w.truncated;
                    break;
                }
                Ok(_) => {}
                Err(PyError::ProcessGone { pid }) => return Err(DumpError::Exited { pid }),
                // The thread state is gone: the thread ended.
                Err(_) => {
                    left = true;
                    break;
                }
            }
        }
        if left || gone(tid) && t.py.frames.is_empty() {
            ended += 1;
        } else {
            out.push(t);
        }
    }
    Ok((out, ended))
}

/// Whether `py`'s walk was cut short by its chain (a changing one: an unreadable frame, a
/// frame that is none), not by the depth cap.
fn cut_short(proc: &PythonProcess, py: &PyThread) -> bool {
    py.truncated && py.frames.len() < proc.limits().max_depth
}

/// `py`, read again while its walk is cut short by a chain that changed under it (a running
/// thread), at most [`MAX_REREADS`] times.
fn reread_torn(proc: &mut PythonProcess, mut py: PyThread) -> Result<ThreadDump, DumpError> {
    let mut rereads = 0;
    while cut_short(proc, &py) && rereads < MAX_REREADS {
        rereads += 1;
        match proc.thread_frames(py.tstate_addr) {
            Ok(w) => {
                py.frames = w.frames;
                py.items = w.items;
                py.locals = w.locals;
                py.truncated = w.truncated;
            }
            Err(PyError::ProcessGone { pid }) => return Err(DumpError::Exited { pid }),
            // The thread state itself is gone (the thread ended): what was read stays.
            Err(_) => break,
        }
    }
    let torn = cut_short(proc, &py);
    Ok(ThreadDump {
        py,
        native: None,
        rereads,
        torn,
    })
}

/// `--pause`: every thread stopped in turn while its Python frames are walked again.
fn paused_threads(
    proc: &mut PythonProcess,
    threads: Vec<PyThread>,
) -> Result<(Vec<ThreadDump>, Pauses), DumpError> {
    let pid = proc.pid();
    let mut pauses = Pauses::default();
    let mut out = Vec::with_capacity(threads.len());
    for mut py in threads {
        let Some(tid) = py.host_tid else {
            out.push(reread_torn(proc, py)?);
            continue;
        };
        let stopped = match ThreadStop::stop(tid) {
            Ok(stop) => {
                let walked = proc.thread_frames(py.tstate_addr);
                let pause = u64::try_from(stop.elapsed().as_micros()).unwrap_or(u64::MAX);
                drop(stop);
                pauses.threads += 1;
                pauses.max_us = pauses.max_us.max(pause);
                pauses.total_us += pause;
                walked
            }
            Err(_) if !process_exists(pid) => return Err(DumpError::Exited { pid }),
            // A thread that ended since the first walk: that walk stays.
            Err(_) => {
                out.push(reread_torn(proc, py)?);
                continue;
            }
        };
        match stopped {
            Ok(w) => {
                py.frames = w.frames;
                py.items = w.items;
                py.locals = w.locals;
                py.truncated = w.truncated;
            }
            Err(PyError::ProcessGone { pid }) => return Err(DumpError::Exited { pid }),
            Err(_) => {}
        }
        // Stopped, its chain cannot change: cut short means unreadable, not torn.
        out.push(ThreadDump {
            py,
            native: None,
            rereads: 0,
            torn: false,
        });
    }
    Ok((out, pauses))
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
            rereads: 0,
            torn: false,
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
