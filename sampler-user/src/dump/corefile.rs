//! `dump --core FILE [--root DIR]`: the same snapshot read from a core file; with `--native`
//! the registers come from its `NT_PRSTATUS` notes and the stacks from its memory (nothing is
//! stopped).

use std::path::Path;
use std::sync::Arc;

use sampler_common::UserRegs;

use super::native::{CopiedStack, Merged, NativeStages};
use super::ptrace::MAX_STACK_COPY;
use super::{DumpError, DumpOptions, NativeDump, Pauses, Snapshot, ThreadDump};
use crate::coredump::{CoreFile, CoreMemory, MappedFiles};
use crate::merge::EvalRanges;
use crate::merge::evalrange::file_eval_ranges_of;
use crate::procs::elf::read_elf_info;
use crate::procs::{Mapping, Process, ProcessRegistry};
use crate::python::memory::{PAGE, ReadMemory};
use crate::python::walker::Limits;
use crate::python::{ImageSource, PyError, PyThread, PythonProcess};

/// The snapshot of the core at `path`, and the error to report after it (mapped files missing
/// under `root`).
pub(super) fn snapshot(
    path: &Path,
    root: &Path,
    opts: &DumpOptions,
) -> Result<(Snapshot, Option<DumpError>), DumpError> {
    let core = Arc::new(CoreFile::open(path)?);
    let files = Arc::new(MappedFiles::new(root));
    // Every mapped file is looked up once, so that each one missing under the root is named.
    for f in &core.files {
        files.open(&f.path);
    }
    // gdb leaves the read-only file mappings out entirely: their permissions come from the
    // mapped file's own program headers.
    let mappings = core.mappings(&|f| {
        let file = files.open(&f.path)?;
        let elf = read_elf_info(&*file).ok()?;
        elf.loads
            .iter()
            .find(|l| (l.offset & !0xfff) <= f.offset && f.offset < l.offset + l.filesz.max(1))
            .map(|l| l.flags)
    });
    let name = path.display().to_string();
    let missing = |files: &MappedFiles| {
        let m = files.missing();
        m.first().map(|first| DumpError::MissingFiles {
            first: first.clone(),
            more: m.len() - 1,
            root: root.display().to_string(),
        })
    };
    let open = |m: &Mapping| {
        let p = m.clean_path()?.to_str()?.to_owned();
        files.open(&p).and_then(|f| f.try_clone().ok())
    };
    let image = ImageSource {
        pid: core.pid(),
        mappings: &mappings,
        open: &open,
        memory: Box::new(CoreMemory::new(Arc::clone(&core), Arc::clone(&files))),
        threads: core
            .threads
            .iter()
            .map(|t| (t.tid, t.regs.fs_base))
            .collect(),
    };
    let mut proc = match PythonProcess::attach_image(image) {
        Ok(p) => p,
        // Without its interpreter's file the runtime cannot be found: say which file.
        Err(PyError::NotPython { .. }) => {
            let m = files.missing();
            return Err(match m.first() {
                Some(first) => DumpError::RuntimeFileMissing {
                    path: name,
                    first: first.clone(),
                    more: m.len() - 1,
                    root: root.display().to_string(),
                },
                None => DumpError::CoreNotPython { path: name },
            });
        }
        Err(e) => return Err(e.into()),
    };
    proc.set_limits(Limits {
        locals: opts.locals,
        ..proc.limits()
    });
    let threads = proc.threads()?;
    let gil_enabled = proc.gil_enabled().unwrap_or(true);
    let threads = if opts.native {
        native_threads(&core, &files, root, mappings, &proc, threads)
    } else {
        threads
            .into_iter()
            .map(|py| ThreadDump {
                py,
                native: None,
                rereads: 0,
                torn: false,
            })
            .collect()
    };
    let cmdline = if core.process.args.is_empty() {
        core.process.comm.clone()
    } else {
        core.process.args.clone()
    };
    let snapshot = Snapshot {
        pid: core.pid(),
        core: Some((name, core.compressed)),
        cmdline,
        version: proc.version(),
        gil_enabled,
        with_locals: opts.locals.is_some(),
        threads,
        counts: proc.error_counts().clone(),
        pauses: opts.native.then(Pauses::default),
        paused: None,
        ended: 0,
    };
    Ok((snapshot, missing(&files)))
}

/// The stack of a core's thread from `sp` up: as many pages as the core (or a mapped file)
/// holds, at most [`MAX_STACK_COPY`] bytes.
fn core_stack(mem: &CoreMemory, sp: u64) -> CopiedStack {
    let mut bytes = Vec::new();
    let mut at = sp;
    while (bytes.len() as u64) < MAX_STACK_COPY {
        let n = PAGE - (at as usize & (PAGE - 1));
        let Ok(chunk) = mem.read_vec(at, n) else {
            break;
        };
        bytes.extend_from_slice(&chunk);
        at = at.wrapping_add(n as u64);
    }
    CopiedStack { base: sp, bytes }
}

fn native_threads(
    core: &Arc<CoreFile>,
    files: &Arc<MappedFiles>,
    root: &Path,
    mappings: Vec<Mapping>,
    proc: &PythonProcess,
    threads: Vec<PyThread>,
) -> Vec<ThreadDump> {
    let pid = core.pid();
    let mut registry = ProcessRegistry::new();
    let args = core
        .process
        .args
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    registry.insert(Process::from_core(
        pid,
        core.process.comm.clone(),
        args,
        mappings,
        root.to_owned(),
    ));
    let d = proc.detected();
    let eval = registry
        .get(pid)
        .and_then(|p| file_eval_ranges_of(p, d).ok())
        .map(|f| Arc::new(EvalRanges::new(&f, d.bias)));
    let mut stages = NativeStages::new(registry, eval);
    let mem = CoreMemory::new(Arc::clone(core), Arc::clone(files));
    threads
        .into_iter()
        .map(|py| {
            let status = core.threads.iter().find(|t| Some(t.tid) == py.host_tid);
            let native = match status {
                Some(t) => {
                    let stack = core_stack(&mem, t.regs.rsp);
                    let regs = UserRegs {
                        ip: t.regs.rip,
                        sp: t.regs.rsp,
                        bp: t.regs.rbp,
                    };
                    NativeDump {
                        merged: stages.thread(pid, regs, &stack, &py.items, !py.truncated),
                        pause_us: None,
                        error: None,
                    }
                }
                None => NativeDump {
                    merged: Merged::python_only(py.frames.len()),
                    pause_us: None,
                    error: Some("the core has no registers of this thread".into()),
                },
            };
            ThreadDump {
                py,
                native: Some(native),
                rereads: 0,
                torn: false,
            }
        })
        .collect()
}
