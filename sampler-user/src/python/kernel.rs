//! What the in-kernel Python walk needs for one process (issue 4): a [`PyProcInfo`] derived
//! from an attached [`PythonProcess`].
//!
//! Owns: the translation of the reader's [`RuntimeLayout`](super::RuntimeLayout) into the wire
//! type of `sampler_common` (offsets as `u32`, [`PY_NO_OFFSET`] for absent fields) and the pid
//! namespace identity of the target (`stat(/proc/PID/ns/pid)`, 0/0 when it is ours, so that the
//! kernel compares host thread ids directly).
//! Input: an attached process. Output: a [`PyProcInfo`] for the `PY_PROCS` map, or a
//! [`PyError`] when an offset does not fit the wire type or the process is gone.
//! Constraints: no version knowledge here — every value comes from the layout (cpython-layouts
//! §3.1 for the chain, §6 for the GIL: `gil_locked`/`gil_holder` are interpreter-relative as in
//! the debug offsets, `enabled` is made interpreter-relative by adding `_gil`'s offset).

use std::os::unix::fs::MetadataExt as _;

use sampler_common::{PY_NO_OFFSET, PyProcInfo};

use super::{PyError, PythonProcess, RuntimeLayout};

/// Converts one offset to the wire width; `what` names it in the error.
fn off(what: &'static str, v: u64) -> Result<u32, PyError> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v != PY_NO_OFFSET)
        .ok_or_else(|| PyError::Invalid {
            what,
            addr: 0,
            detail: format!("offset {v} does not fit the kernel walk's u32"),
        })
}

fn opt(what: &'static str, v: Option<u64>) -> Result<u32, PyError> {
    v.map_or(Ok(PY_NO_OFFSET), |v| off(what, v))
}

/// The offsets of `layout` as the kernel walk wants them (namespace fields zero).
pub fn offsets_from_layout(
    layout: &RuntimeLayout,
    runtime_addr: u64,
) -> Result<PyProcInfo, PyError> {
    let (i, t, f) = (&layout.interp, &layout.tstate, &layout.frame);
    let gil_enabled = match i.gil_enabled {
        Some(e) => Some(
            i.gil_runtime_state
                .checked_add(e)
                .ok_or_else(|| PyError::Invalid {
                    what: "gil_runtime_state_enabled",
                    addr: 0,
                    detail: "overflows".into(),
                })?,
        ),
        None => None,
    };
    Ok(PyProcInfo {
        runtime_addr,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: off(
            "runtime_state.interpreters_head",
            layout.runtime.interpreters_head,
        )?,
        threads_head: off("interpreter_state.threads_head", i.threads_head)?,
        tstate_next: off("thread_state.next", t.next)?,
        tstate_native_thread_id: off("thread_state.native_thread_id", t.native_thread_id)?,
        tstate_current_frame: off("thread_state.current_frame", t.current_frame)?,
        cframe_current_frame: opt("cframe.current_frame", t.cframe_current_frame)?,
        frame_previous: off("interpreter_frame.previous", f.previous)?,
        frame_executable: off("interpreter_frame.executable", f.executable)?,
        frame_instr_ptr: off("interpreter_frame.instr_ptr", f.instr_ptr)?,
        frame_owner: off("interpreter_frame.owner", f.owner)?,
        frame_tlbc_index: opt("interpreter_frame.tlbc_index", f.tlbc_index)?,
        gil_locked: off("interpreter_state.gil_runtime_state_locked", i.gil_locked)?,
        gil_holder: off("interpreter_state.gil_runtime_state_holder", i.gil_holder)?,
        gil_enabled: opt("interpreter_state.gil_runtime_state_enabled", gil_enabled)?,
        _pad: 0,
    })
}

/// `(dev, ino)` of `/proc/PID/ns/pid`, or `(0, 0)` when it is the profiler's own namespace.
pub fn pid_namespace(pid: u32) -> Result<(u64, u64), PyError> {
    let path = format!("/proc/{pid}/ns/pid");
    let theirs = std::fs::metadata(&path).map_err(|e| PyError::from_proc_io(pid, path, e))?;
    let ours = std::fs::metadata("/proc/self/ns/pid").map_err(|e| PyError::Io {
        path: "/proc/self/ns/pid".into(),
        source: e,
    })?;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        Ok((0, 0))
    } else {
        // `bpf_get_ns_current_pid_tgid` takes the `st_dev`/`st_ino` of this very file.
        Ok((theirs.dev(), theirs.ino()))
    }
}

/// The `PY_PROCS` entry for `p`.
pub fn kernel_info(p: &PythonProcess) -> Result<PyProcInfo, PyError> {
    let mut wire = offsets_from_layout(p.layout(), p.detected().runtime_addr)?;
    (wire.pidns_dev, wire.pidns_ino) = pid_namespace(p.pid())?;
    Ok(wire)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Child, Command, Stdio};

    use super::*;
    use crate::python::memory::{ProcessMemory, ReadMemory};

    /// Prints the main thread's native id once the interpreter runs user code, then sleeps.
    const SCRIPT: &str = "import sys, threading, time\n\
        t = threading.Thread(target=time.sleep, args=(600,), daemon=True); t.start()\n\
        print(threading.get_native_id(), flush=True)\n\
        time.sleep(600)\n";

    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn field(mem: &ProcessMemory, addr: u64, off: u32) -> u64 {
        mem.read_u64(addr.wrapping_add(u64::from(off)))
            .expect("read through a PyProcInfo offset")
    }

    /// Walks runtime → interpreters → threads with nothing but `info` and returns every
    /// `native_thread_id` (what the eBPF program does on a thread-state cache miss).
    fn native_ids(mem: &ProcessMemory, info: &PyProcInfo) -> Vec<u64> {
        let mut ids = Vec::new();
        // The first interpreter of the list (the main one in a single-interpreter process);
        // `PyInterpreterState.next` is not part of the wire type.
        let interp = field(mem, info.runtime_addr, info.interpreters_head);
        let mut ts = if interp == 0 {
            0
        } else {
            field(mem, interp, info.threads_head)
        };
        for _ in 0..256 {
            if ts == 0 {
                break;
            }
            ids.push(field(mem, ts, info.tstate_native_thread_id));
            ts = field(mem, ts, info.tstate_next);
        }
        ids
    }

    /// Starts `python` running [`SCRIPT`]; returns it and its main thread's native id.
    fn start(name: &str, python: &str) -> Option<(Killed, u64)> {
        if !std::path::Path::new(python).exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{name} missing under CI=true"
            );
            eprintln!("SKIPPED: interpreter {name} not found at {python}");
            return None;
        }
        let mut child = Command::new(python)
            .args(["-c", SCRIPT])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let child = Killed(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let tid = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {line:?}"));
        Some((child, tid))
    }

    /// Every wire offset equals the layout's (absent ones are `PY_NO_OFFSET`).
    fn check_offsets(name: &str, info: &PyProcInfo, l: &RuntimeLayout) {
        let no = |v: Option<u64>| v.map_or(PY_NO_OFFSET, |v| v as u32);
        let pairs = [
            (
                "interpreters_head",
                info.interpreters_head,
                l.runtime.interpreters_head as u32,
            ),
            (
                "threads_head",
                info.threads_head,
                l.interp.threads_head as u32,
            ),
            ("tstate_next", info.tstate_next, l.tstate.next as u32),
            (
                "native_thread_id",
                info.tstate_native_thread_id,
                l.tstate.native_thread_id as u32,
            ),
            (
                "current_frame",
                info.tstate_current_frame,
                l.tstate.current_frame as u32,
            ),
            (
                "cframe",
                info.cframe_current_frame,
                no(l.tstate.cframe_current_frame),
            ),
            ("previous", info.frame_previous, l.frame.previous as u32),
            (
                "executable",
                info.frame_executable,
                l.frame.executable as u32,
            ),
            ("instr_ptr", info.frame_instr_ptr, l.frame.instr_ptr as u32),
            ("owner", info.frame_owner, l.frame.owner as u32),
            ("tlbc_index", info.frame_tlbc_index, no(l.frame.tlbc_index)),
            ("gil_locked", info.gil_locked, l.interp.gil_locked as u32),
            ("gil_holder", info.gil_holder, l.interp.gil_holder as u32),
        ];
        for (field, wire, layout) in pairs {
            assert_eq!(wire, layout, "{name}: {field}");
        }
        let ft = name.ends_with('t');
        assert_eq!(
            info.gil_enabled != PY_NO_OFFSET,
            ft,
            "{name}: `enabled` only when FT"
        );
        assert_eq!(
            info.cframe_current_frame != PY_NO_OFFSET,
            name == "3.12",
            "{name}: cframe"
        );
        assert_eq!(
            info.frame_tlbc_index, PY_NO_OFFSET,
            "{name}: no TLBC before 3.14t"
        );
    }

    #[test]
    fn live_offsets_walk_to_the_main_thread() {
        let pythons = [
            ("3.12", "/root/.pyenv/versions/3.12.1/bin/python3.12"),
            ("3.13", "/root/.pyenv/versions/3.13.0/bin/python3.13"),
            (
                "3.13t",
                "/var/cache/pyebpf-test/pythons/3.13t/bin/python3.13t",
            ),
        ];
        for (name, python) in pythons {
            let Some((child, main_tid)) = start(name, python) else {
                continue;
            };
            let pid = child.0.id();
            let p = PythonProcess::attach(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
            let info = kernel_info(&p).unwrap();
            assert_eq!(info.runtime_addr, p.detected().runtime_addr, "{name}");
            assert_eq!(
                (info.pidns_dev, info.pidns_ino),
                (0, 0),
                "{name}: our namespace"
            );
            check_offsets(name, &info, p.layout());
            let mem = ProcessMemory::new(pid);
            let ids = native_ids(&mem, &info);
            assert_eq!(ids.len(), 2, "{name}: main + sleeper thread, got {ids:?}");
            assert!(
                ids.contains(&main_tid),
                "{name}: main thread {main_tid} not in {ids:?}"
            );
            if name.ends_with('t') {
                // A free-threaded build runs without the GIL by default: `enabled` reads 0.
                let interp = field(&mem, info.runtime_addr, info.interpreters_head);
                let enabled = mem.read_i32(interp + u64::from(info.gil_enabled)).unwrap();
                assert_eq!(enabled, 0, "{name}: GIL enabled?");
            }
        }
    }

    #[test]
    fn foreign_pid_namespace_is_reported() {
        assert_eq!(
            pid_namespace(std::process::id()).unwrap(),
            (0, 0),
            "our own namespace"
        );
        assert!(matches!(
            pid_namespace(u32::MAX - 7),
            Err(PyError::ProcessGone { .. })
        ));
        // A process in a new pid namespace (`unshare` itself stays in ours; its child moves).
        let Ok(unshare) = Command::new("unshare")
            .args(["--pid", "--fork", "sleep", "30"])
            .stdin(Stdio::null())
            .spawn()
        else {
            eprintln!("SKIPPED: no unshare");
            return;
        };
        let unshare = Killed(unshare);
        let children = format!("/proc/{0}/task/{0}/children", unshare.0.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let child = loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(c) = text
                .split_whitespace()
                .next()
                .and_then(|c| c.parse::<u32>().ok())
            {
                break c;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "unshare started no child"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let (dev, ino) = pid_namespace(child).unwrap();
        assert_ne!(
            (dev, ino),
            (0, 0),
            "the child of `unshare --pid` has its own namespace"
        );
        let meta = std::fs::metadata(format!("/proc/{child}/ns/pid")).unwrap();
        assert_eq!((dev, ino), (meta.dev(), meta.ino()));
        // SAFETY: killing the child we found (it is ours through unshare).
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
    }
}
