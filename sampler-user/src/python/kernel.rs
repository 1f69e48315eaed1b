//! What the in-kernel Python walk needs for one process (issue 4): a [`PyProcInfo`] derived
//! from an attached [`PythonProcess`].
//!
//! Owns: the translation of the reader's [`RuntimeLayout`](super::RuntimeLayout) into the wire
//! type of `sampler_common` (offsets as `u32`, [`PY_NO_OFFSET`] for absent fields) and the pid
//! namespace identity of the target (`stat(/proc/PID/ns/pid)`, 0/0 when it is ours, so that the
//! kernel compares host thread ids directly).
//! Input: an attached process. Output: a [`PyProcInfo`] for the `PY_PROCS` map, or a
//! [`PyError`] when an offset does not fit the wire type or the process is gone.
//! Constraints: no version knowledge here — every value comes from the layout (the chain and
//! the GIL of `docs/cpython-layouts.md`; the GIL fields are relative to the GIL struct, which
//! is `_PyRuntime.ceval.gil` up to 3.11 and the one `interp->ceval.gil` points at from 3.12).
//! Before 3.11 a thread state has no `native_thread_id`: the kernel matches its `pthread_t`
//! against the sampled task's `thread.fsbase`, whose offset comes from the kernel's BTF (read
//! by `collect`, which writes it into every entry it inserts).

use std::os::unix::fs::MetadataExt as _;

use sampler_common::{PY_NO_OFFSET, PyProcInfo};

use super::layout::{EntryRule, GilAt};
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

/// The offsets of `layout` as the kernel walk wants them (namespace fields zero,
/// `task_fsbase` unknown). `code_type` is `&PyCode_Type` in the target (0: unknown, the
/// kernel then checks no frame's code object type).
pub fn offsets_from_layout(
    layout: &RuntimeLayout,
    runtime_addr: u64,
    code_type: u64,
) -> Result<PyProcInfo, PyError> {
    let (t, f, g, c) = (&layout.tstate, &layout.frame, &layout.gil, &layout.code);
    let code_name = c.qualname.unwrap_or(c.name);
    let code_read_bytes = [
        layout.object.ob_type + 8,
        code_name + 8,
        c.filename + 8,
        c.firstlineno + 4,
    ]
    .into_iter()
    .max()
    .unwrap_or(0)
    .next_multiple_of(8);
    let shim_owner = match f.entry {
        EntryRule::OwnerAtLeast(owner) => u32::from(owner),
        EntryRule::EveryFrame | EntryRule::EntryFlag => PY_NO_OFFSET,
    };
    let (runtime_gil, ceval_gil, embedded) = match g.at {
        GilAt::Runtime { offset } => (Some(offset), None, None),
        GilAt::Interpreter {
            ceval_gil,
            embedded,
        } => (None, Some(ceval_gil), Some(embedded)),
    };
    Ok(PyProcInfo {
        runtime_addr,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: off(
            "runtime_state.interpreters_head",
            layout.runtime.interpreters_head,
        )?,
        interp_next: off("interpreter_state.next", layout.interp.next)?,
        threads_head: off("interpreter_state.threads_head", layout.interp.threads_head)?,
        interp_ceval_gil: opt("interpreter_state.ceval_gil", ceval_gil)?,
        interp_gil_struct: opt("interpreter_state.gil_runtime_state", embedded)?,
        runtime_gil: opt("runtime_state.gil", runtime_gil)?,
        tstate_next: off("thread_state.next", t.next)?,
        tstate_interp: off("thread_state.interp", t.interp)?,
        tstate_native_thread_id: opt("thread_state.native_thread_id", t.native_thread_id)?,
        tstate_pthread_id: off("thread_state.thread_id", t.thread_id)?,
        task_fsbase: PY_NO_OFFSET,
        tstate_current_frame: off("thread_state.current_frame", t.current_frame)?,
        cframe_current_frame: opt("cframe.current_frame", t.cframe_current_frame)?,
        frame_previous: off("interpreter_frame.previous", f.previous)?,
        frame_executable: off("interpreter_frame.executable", f.executable)?,
        frame_instr_ptr: off("interpreter_frame.instr_ptr", f.instr_ptr)?,
        frame_owner: opt("interpreter_frame.owner", f.owner)?,
        frame_is_entry: opt("interpreter_frame.is_entry", f.is_entry)?,
        frame_read_bytes: off("interpreter_frame (bytes read)", f.header_bytes())?,
        frame_tlbc_index: opt("interpreter_frame.tlbc_index", f.tlbc_index)?,
        gil_locked: off("gil.locked", g.locked)?,
        gil_holder: off("gil.last_holder", g.last_holder)?,
        gil_enabled: opt("gil.enabled", g.enabled)?,
        gil_size: off("gil (bytes)", g.size())?,
        code_type,
        executable_tag_mask: off("interpreter_frame (tag mask)", f.stackref_tag_mask)?,
        code_ob_type: off("object.ob_type", layout.object.ob_type)?,
        code_name: off("code_object.qualname", code_name)?,
        code_filename: off("code_object.filename", c.filename)?,
        code_firstlineno: off("code_object.firstlineno", c.firstlineno)?,
        code_read_bytes: off("code_object (bytes read)", code_read_bytes)?,
        owner_max: f.owner_max.map_or(PY_NO_OFFSET, u32::from),
        shim_owner,
        frame_globals: off("interpreter_frame.f_globals", f.globals)?,
        frame_locals: off("interpreter_frame.f_locals", f.locals)?,
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

/// The `PY_PROCS` entry for `p`. Its `task_fsbase` is left unknown: it is a fact of the
/// kernel, not of the process, and the owner of `PY_PROCS` fills it in
/// (`collect::PythonProcMap::insert`).
pub fn kernel_info(p: &PythonProcess) -> Result<PyProcInfo, PyError> {
    let mut wire = offsets_from_layout(
        p.layout(),
        p.detected().runtime_addr,
        p.detected().pycode_type_addr.unwrap_or(0),
    )?;
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
        print(threading.get_native_id(), threading.get_ident(), flush=True)\n\
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

    /// Walks runtime → every interpreter → its threads with nothing but `info` and returns
    /// every `native_thread_id` (what the eBPF program does on a thread-state cache miss, with
    /// its budget: thread states plus interpreter hops), checking that each thread state's
    /// `interp` is the interpreter whose list holds it.
    fn native_ids(mem: &ProcessMemory, info: &PyProcInfo) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut interp = field(mem, info.runtime_addr, info.interpreters_head);
        let mut ts = if interp == 0 {
            0
        } else {
            field(mem, interp, info.threads_head)
        };
        for _ in 0..256 {
            if ts == 0 {
                interp = field(mem, interp, info.interp_next);
                if interp == 0 {
                    break;
                }
                ts = field(mem, interp, info.threads_head);
                continue;
            }
            assert_eq!(field(mem, ts, info.tstate_interp), interp, "tstate->interp");
            ids.push(field(mem, ts, key_offset(info)));
            ts = field(mem, ts, info.tstate_next);
        }
        ids
    }

    /// The thread state field the kernel matches: `native_thread_id`, else `thread_id`.
    fn key_offset(info: &PyProcInfo) -> u32 {
        if info.tstate_native_thread_id == PY_NO_OFFSET {
            info.tstate_pthread_id
        } else {
            info.tstate_native_thread_id
        }
    }

    /// The GIL struct `interp` uses, as the kernel finds it.
    fn gil_struct(mem: &ProcessMemory, info: &PyProcInfo, interp: u64) -> u64 {
        if info.runtime_gil != PY_NO_OFFSET {
            return info.runtime_addr + u64::from(info.runtime_gil);
        }
        match field(mem, interp, info.interp_ceval_gil) {
            0 => interp + u64::from(info.interp_gil_struct),
            gil => gil,
        }
    }

    /// Creates an isolated sub-interpreter whose thread prints `sub ID` and sleeps, then prints
    /// `main ID` from the main thread and sleeps.
    /// The two threads print concurrently: each line is one `os.write` (atomic on a pipe), as
    /// `print` may write its pieces separately (unbuffered stdout) and interleave them.
    const SUB_SCRIPT: &str = r#"import os, threading, time
code = """import os, threading, time
def f():
    os.write(1, b"sub %d\\n" % threading.get_native_id())
    time.sleep(600)
threading.Thread(target=f).start()
"""
try:
    import _interpreters as m
    i = m.create()
    m.exec(i, code)
except ImportError:
    import _xxsubinterpreters as m
    i = m.create()
    m.run_string(i, code)
os.write(1, b"main %d\n" % threading.get_native_id())
time.sleep(600)
"#;

    /// Starts `python` running [`SCRIPT`]; returns it and its main thread's native id and
    /// `pthread_t`.
    fn start(name: &str, python: &str) -> Option<(Killed, u64, u64)> {
        let (child, lines) = start_script(name, python, SCRIPT, 1)?;
        let ids: Vec<u64> = lines[0]
            .split_whitespace()
            .map(|w| w.parse().unwrap_or_else(|_| panic!("{name}: {lines:?}")))
            .collect();
        Some((child, ids[0], ids[1]))
    }

    /// Starts `python -c script` and reads `lines` lines of its output.
    fn start_script(
        name: &str,
        python: &str,
        script: &str,
        lines: usize,
    ) -> Option<(Killed, Vec<String>)> {
        if !std::path::Path::new(python).exists() {
            crate::procs::tests::missing(&format!("interpreter {name} not found at {python}"));
            return None;
        }
        let mut child = Command::new(python)
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let child = Killed(child);
        let mut out = Vec::new();
        for _ in 0..lines {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            out.push(line);
        }
        Some((child, out))
    }

    /// What the wire entry must say for each version family, independently of the layout.
    fn check_offsets(name: &str, info: &PyProcInfo) {
        let minor: u32 = name[2..].trim_end_matches('t').parse().unwrap();
        let has = |v: u32| v != PY_NO_OFFSET;
        assert_eq!(
            has(info.gil_enabled),
            name.ends_with('t'),
            "{name}: enabled"
        );
        assert_eq!(has(info.runtime_gil), minor <= 11, "{name}: process GIL");
        assert_eq!(has(info.interp_ceval_gil), minor >= 12, "{name}: ceval.gil");
        assert_eq!(
            has(info.tstate_native_thread_id),
            minor >= 11,
            "{name}: native_thread_id"
        );
        // A kernel fact: `collect` writes it into the entry (`PythonProcMap::insert`).
        assert!(!has(info.task_fsbase), "{name}: fsbase");
        assert_eq!(
            has(info.cframe_current_frame),
            minor == 11 || minor == 12,
            "{name}: cframe"
        );
        assert_eq!(has(info.frame_owner), minor >= 11, "{name}: owner");
        assert_eq!(has(info.frame_is_entry), minor == 11, "{name}: is_entry");
        assert_eq!(
            info.frame_tlbc_index, PY_NO_OFFSET,
            "{name}: no TLBC before 3.14t"
        );
        assert!(info.frame_offsets_fit(), "{name}: {info:?}");
    }

    fn info_has_native(name: &str) -> bool {
        !matches!(name, "3.8" | "3.9" | "3.10")
    }

    #[test]
    fn live_offsets_walk_to_the_main_thread() {
        let pythons = [
            ("3.8", "/root/.pyenv/versions/3.8.18/bin/python3.8"),
            ("3.9", "/root/.pyenv/versions/3.9.18/bin/python3.9"),
            ("3.10", "/root/.pyenv/versions/3.10.13/bin/python3.10"),
            ("3.11", "/root/.pyenv/versions/3.11.7/bin/python3.11"),
            ("3.11", "/usr/bin/python3.11"),
            ("3.12", "/root/.pyenv/versions/3.12.1/bin/python3.12"),
            ("3.13", "/root/.pyenv/versions/3.13.0/bin/python3.13"),
            (
                "3.13t",
                "/var/cache/pyebpf-test/pythons/3.13t/bin/python3.13t",
            ),
        ];
        for (name, python) in pythons {
            let Some((child, main_tid, main_ident)) = start(name, python) else {
                continue;
            };
            let main_key = if info_has_native(name) {
                main_tid
            } else {
                main_ident
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
            check_offsets(name, &info);
            let mem = ProcessMemory::new(pid);
            let ids = native_ids(&mem, &info);
            assert_eq!(ids.len(), 2, "{name}: main + sleeper thread, got {ids:?}");
            assert!(
                ids.contains(&main_key),
                "{name}: main thread {main_key} not in {ids:?}"
            );
            let interp = field(&mem, info.runtime_addr, info.interpreters_head);
            let gil = gil_struct(&mem, &info, interp);
            if name.ends_with('t') {
                // A free-threaded build runs without the GIL by default: `enabled` reads 0.
                let enabled = mem.read_i32(gil + u64::from(info.gil_enabled)).unwrap();
                assert_eq!(enabled, 0, "{name}: GIL enabled?");
            } else {
                // `last_holder` is one of the two thread states (it is not cleared on release).
                let holder = field(&mem, gil, info.gil_holder);
                assert_ne!(holder, 0, "{name}: no GIL last_holder");
                let id = field(&mem, holder, key_offset(&info));
                assert!(
                    ids.contains(&id),
                    "{name}: last_holder's id {id} not in {ids:?}"
                );
            }
        }
    }

    /// The walk reaches a sub-interpreter's thread and the main thread; the isolated
    /// sub-interpreter has a GIL of its own.
    #[test]
    fn live_offsets_walk_every_interpreter() {
        let pythons = [
            ("3.12", "/root/.pyenv/versions/3.12.1/bin/python3.12"),
            ("3.13", "/root/.pyenv/versions/3.13.0/bin/python3.13"),
        ];
        for (name, python) in pythons {
            let Some((child, lines)) = start_script(name, python, SUB_SCRIPT, 2) else {
                continue;
            };
            let tid = |who: &str| -> u64 {
                lines
                    .iter()
                    .find_map(|l| l.strip_prefix(who)?.trim().parse().ok())
                    .unwrap_or_else(|| panic!("{name}: no `{who}ID` line in {lines:?}"))
            };
            let (main_tid, sub_tid) = (tid("main "), tid("sub "));
            let pid = child.0.id();
            let p = PythonProcess::attach(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
            let info = kernel_info(&p).unwrap();
            let mem = ProcessMemory::new(pid);
            let ids = native_ids(&mem, &info);
            assert!(
                ids.contains(&main_tid) && ids.contains(&sub_tid),
                "{name}: main thread {main_tid} and sub-interpreter thread {sub_tid} not both \
                 in {ids:?}"
            );
            let sub = field(&mem, info.runtime_addr, info.interpreters_head);
            let main = field(&mem, sub, info.interp_next);
            assert_ne!(main, 0, "{name}: one interpreter only");
            assert_eq!(
                field(&mem, main, info.interp_next),
                0,
                "{name}: three interpreters"
            );
            let (sub_gil, main_gil) = (gil_struct(&mem, &info, sub), gil_struct(&mem, &info, main));
            assert_eq!(
                sub_gil,
                sub + u64::from(info.interp_gil_struct),
                "{name}: the isolated sub-interpreter uses its own GIL"
            );
            assert_ne!(sub_gil, main_gil, "{name}");
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
            crate::procs::tests::missing("unshare (util-linux) cannot be run");
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
