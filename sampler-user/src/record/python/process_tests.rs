//! Live tests of [`PyProc::resolve`]: a capture is taken the way the eBPF program takes it —
//! only the `PyProcInfo` offsets, from the thread-state list down the frame chain, raw
//! `f_executable`/`instr_ptr`/`owner` per frame — from a real interpreter parked in
//! `<module> → outer → sorted(key=key) → key → inner`, then resolved: the names, the two
//! entry-frame groups (Python → C → Python), and on 3.15 the dropped base frame.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

use sampler_common::{PY_NO_OFFSET, PyFrameRecord, PyProcInfo, py_flags};

use super::process::PyProc;
use crate::collect::PyCaptured;
use crate::failure::PyFailure;
use crate::merge::{PyItem, python_groups, python_only};
use crate::profile::Profile;
use crate::python::PythonProcess;
use crate::python::kernel::kernel_info;
use crate::python::memory::{ProcessMemory, ReadMemory};

const SCRIPT: &str = "import threading, time\n\
def inner():\n    print(threading.get_native_id(), flush=True)\n    time.sleep(600)\n\
def key(x):\n    inner()\n    return x\n\
def outer():\n    sorted([1], key=key)\n\
outer()\n";

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SID: &str = "/var/cache/pyebpf-test/roots/sid";

/// (name, interpreter, chroot).
const PYTHONS: [(&str, &str, Option<&str>); 6] = [
    ("3.12", "/root/.pyenv/versions/3.12.1/bin/python3.12", None),
    ("3.13", "/root/.pyenv/versions/3.13.0/bin/python3.13", None),
    (
        "3.13t",
        "/var/cache/pyebpf-test/pythons/3.13t/bin/python3.13t",
        None,
    ),
    (
        "3.13t-static",
        "/var/cache/pyebpf-test/pythons/3.13t-static/bin/python3.13t",
        None,
    ),
    ("3.14", "/usr/bin/python3.14", Some(SID)),
    ("3.15", "/usr/bin/python3.15", Some(SID)),
];

/// `K.__init__` parked after the constructor call was specialised: 3.13+ default builds run
/// it under the `__init__` shim frame (`_Py_InitCleanup`, docs/cpython-layouts.md §3.4).
const INIT_SCRIPT: &str = r"import threading, time
class K:
    def __init__(self, last):
        if last:
            print(threading.get_native_id(), flush=True)
            time.sleep(600)
def make():
    for i in range(1000):
        K(i == 999)
make()
";

fn start(name: &str, python: &str, root: Option<&str>) -> Option<(Killed, u64)> {
    start_script(name, python, root, SCRIPT)
}

fn start_script(
    name: &str,
    python: &str,
    root: Option<&str>,
    script: &str,
) -> Option<(Killed, u64)> {
    let host = format!("{}{python}", root.unwrap_or(""));
    if !std::path::Path::new(&host).exists() {
        crate::procs::tests::missing(&format!("interpreter {name} not found at {host}"));
        return None;
    }
    let mut cmd = match root {
        Some(r) => {
            let mut c = Command::new("chroot");
            c.args([r, python]);
            c
        }
        None => Command::new(python),
    };
    let mut child = cmd
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let out = child.stdout.take().unwrap();
    let child = Killed(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    // The print is one line before the sleep: let the thread get there.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let tid = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{name}: {line:?}"));
    Some((child, tid))
}

/// The eBPF program's walk, in user space: thread `tid`'s frames, innermost first.
fn capture(mem: &ProcessMemory, info: &PyProcInfo, tid: u64) -> PyCaptured {
    let at = |addr: u64, off: u32| addr.wrapping_add(u64::from(off));
    let word = |addr: u64, off: u32| mem.read_u64(at(addr, off)).unwrap();
    let top = |ts: u64| {
        let frame = word(ts, info.tstate_current_frame);
        if info.cframe_current_frame == PY_NO_OFFSET || frame == 0 {
            frame
        } else {
            word(frame, info.cframe_current_frame)
        }
    };
    // Every interpreter, newest first; the first thread state of `tid` with a frame.
    let mut interp = word(info.runtime_addr, info.interpreters_head);
    let mut found = None;
    while interp != 0 && found.is_none() {
        let mut ts = word(interp, info.threads_head);
        while ts != 0 {
            if word(ts, info.tstate_native_thread_id) == tid && top(ts) != 0 {
                found = Some(ts);
                break;
            }
            ts = word(ts, info.tstate_next);
        }
        interp = word(interp, info.interp_next);
    }
    let ts = found.unwrap_or_else(|| panic!("thread {tid} not in the thread lists"));
    let mut frame = top(ts);
    let mut frames = Vec::new();
    while frame != 0 && frames.len() < 256 {
        let mut owner = [0u8];
        mem.read(at(frame, info.frame_owner), &mut owner).unwrap();
        let executable = word(frame, info.frame_executable);
        // The code object's identity, as the kernel records it (none for entry frames).
        let code = executable & !u64::from(info.executable_tag_mask);
        let (name, filename, first_line) = if u32::from(owner[0]) >= info.shim_owner {
            (0, 0, 0)
        } else {
            let mut first = [0u8; 4];
            mem.read(at(code, info.code_firstlineno), &mut first)
                .unwrap();
            (
                word(code, info.code_name),
                word(code, info.code_filename),
                u32::from_le_bytes(first) as u16,
            )
        };
        let globals = word(frame, info.frame_globals);
        frames.push(PyFrameRecord {
            executable,
            instr_ptr: word(frame, info.frame_instr_ptr),
            name,
            filename,
            globals: if globals == word(frame, info.frame_locals) {
                globals
            } else {
                0
            },
            tlbc_index: 0,
            owner: owner[0],
            is_entry: 0,
            first_line,
        });
        frame = word(frame, info.frame_previous);
    }
    PyCaptured {
        tstate: ts,
        frames,
        flags: py_flags::CAPTURED,
        gil_holder: 0,
        gil_locked: -1,
        gil_enabled: -1,
    }
}

#[test]
fn captured_frames_resolve_into_two_activations() {
    for (name, python, root) in PYTHONS {
        let Some((child, tid)) = start(name, python, root) else {
            continue;
        };
        let pid = child.0.id();
        // The chroot wrapper execs the interpreter: same pid.
        let process = PythonProcess::attach(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
        let info = kernel_info(&process).unwrap();
        let mem = ProcessMemory::new(pid);
        let cap = capture(&mem, &info, tid);
        let mut p = PyProc::new(process, name.into());
        let mut profile = Profile::default();
        let stack = p.resolve(&cap, &mut profile);
        let frames = profile.frames().to_vec();
        let mut names = Vec::new();
        python_only(&stack.items, &mut names);
        let labels: Vec<String> = names.iter().map(|i| frames[i.0 as usize].label()).collect();
        let fns: Vec<&str> = names.iter().map(|i| &*frames[i.0 as usize].name).collect();
        assert_eq!(
            fns,
            ["<module>", "outer", "key", "inner"],
            "{name}: {labels:?}"
        );
        assert!(
            labels[3].ends_with("(<string>:4)"),
            "{name}: inner's line: {labels:?}"
        );
        assert!(
            labels[1].ends_with("(<string>:9)"),
            "{name}: outer's line: {labels:?}"
        );
        assert_eq!(
            python_groups(&stack.items),
            2,
            "{name}: Python → sorted → Python"
        );
        assert!(
            matches!(stack.items.last(), Some(PyItem::Entry)),
            "{name}: bottom entry"
        );
        assert!(!stack.truncated);
        assert_eq!(
            (p.stats.samples, p.stats.full),
            (1, 1),
            "{name}: {:?}",
            p.stats
        );
        assert!(p.stats.errors.is_empty(), "{name}: {:?}", p.stats.errors);
        // Second time: every frame from the cache, no new frames.
        let again = p.resolve(&cap, &mut profile);
        assert_eq!(again.items, stack.items);
        assert_eq!(profile.frames().len(), frames.len());
        // A code object gone since the sample (unreadable here) is named from the names the
        // kernel recorded with it, without a line, and counted.
        let mut freed = cap.clone();
        freed.frames[0].executable = 0x10;
        let s = p.resolve(&freed, &mut profile);
        assert!(
            matches!(s.items[0], PyItem::Frame(i) if &*profile.frame(i).name == "inner" && profile.frame(i).line.is_none() && i.0 as usize == frames.len()),
            "{name}"
        );
        assert_eq!(
            p.stats
                .errors
                .get(&PyFailure::Reader(crate::python::ErrorKind::CodeFreed)),
            Some(&1),
            "{name}"
        );
        // Unreadable, and names that are no `str`: an unknown frame, counted, never a wrong
        // name; three such frames in one sample count once.
        let mut bad = cap.clone();
        for f in &mut bad.frames[..3] {
            (f.executable, f.name, f.filename) = (0x10, 0x20, 0x30);
        }
        let s = p.resolve(&bad, &mut profile);
        assert!(
            matches!(s.items[0], PyItem::Frame(i) if &*profile.frame(i).name == "[unknown python frame]" && i.0 as usize == frames.len() + 1),
            "{name}"
        );
        assert_eq!(
            p.stats.errors.values().sum::<u64>(),
            2,
            "{name}: {:?}",
            p.stats.errors
        );
        assert_eq!(
            p.stats.full, 3,
            "{name}: a sample with an unknown frame is not full"
        );
        invalid_frames_are_counted(&mut p, &cap, &mut profile, name);
    }
}

/// A capture the kernel stopped at an invalid frame: the frames above it, marked truncated
/// and invalid, counted; as the cause of it, an unreadable code object is counted too.
fn invalid_frames_are_counted(p: &mut PyProc, cap: &PyCaptured, profile: &mut Profile, name: &str) {
    for (flags, unreadable) in [
        (py_flags::INVALID_FRAME, 0),
        (py_flags::INVALID_FRAME | py_flags::CODE_UNREADABLE, 1),
    ] {
        let mut cut = cap.clone();
        cut.flags |= flags;
        cut.frames.truncate(2);
        let before = p.stats.clone();
        let s = p.resolve(&cut, profile);
        assert!(s.invalid && s.truncated, "{name}: {flags:#x}");
        let counted = |k| p.stats.errors.get(&k).copied().unwrap_or(0);
        let was = |k| before.errors.get(&k).copied().unwrap_or(0);
        assert_eq!(
            counted(PyFailure::InvalidFrame) - was(PyFailure::InvalidFrame),
            1,
            "{name}: {flags:#x}"
        );
        assert_eq!(
            counted(PyFailure::CodeUnreadable) - was(PyFailure::CodeUnreadable),
            unreadable,
            "{name}: {flags:#x}"
        );
    }
}

#[test]
fn init_shim_is_dropped() {
    for (name, python, root) in PYTHONS {
        let Some((child, tid)) = start_script(name, python, root, INIT_SCRIPT) else {
            continue;
        };
        let pid = child.0.id();
        let process = PythonProcess::attach(pid).unwrap_or_else(|e| panic!("{name}: {e}"));
        let info = kernel_info(&process).unwrap();
        let cap = capture(&ProcessMemory::new(pid), &info, tid);
        let mut p = PyProc::new(process, name.into());
        let mut profile = Profile::default();
        let stack = p.resolve(&cap, &mut profile);
        let frames = profile.frames();
        let mut ids = Vec::new();
        python_only(&stack.items, &mut ids);
        let fns: Vec<&str> = ids.iter().map(|i| &*frames[i.0 as usize].name).collect();
        assert_eq!(fns, ["<module>", "make", "K.__init__"], "{name}");
        let python_records = cap.frames.iter().filter(|f| f.owner < 3).count();
        // The shim exists where the constructor call is specialised (3.13+, not free-threaded).
        let shim = !name.starts_with("3.12") && !name.starts_with("3.13t");
        assert_eq!(
            python_records,
            3 + usize::from(shim),
            "{name}: raw frames {:?}",
            cap.frames
        );
        assert!(p.stats.errors.is_empty(), "{name}: {:?}", p.stats.errors);
    }
}
