//! python stage: the CPython reader (issue 3).
//!
//! Owns: attaching to a CPython process by content ([`PythonProcess::attach`]), its version
//! (debug offsets, `Py_Version`, or the `Py_GetVersion()` string in `.bss` before 3.11), its
//! [`RuntimeLayout`] (from the target's own `_Py_DebugOffsets`; built-in tables for 3.8–3.12,
//! checked against the binary before use), and
//! snapshots of every thread's Python stack with thread ids, names and GIL state
//! ([`PythonProcess::threads`]); resolution of frames captured elsewhere (the in-kernel walker
//! of issue 4) through the same code-object cache ([`PythonProcess::resolve_frame`]).
//! Input: a pid. Output: [`PyThread`]s / [`PyFrame`]s; failures as [`PyError`] (fatal for the
//! call) or counted in [`ErrorCounts`] (cost a frame, a line or a name).
//! Constraints: target memory is untrusted and changes while we read it; everything is bounded
//! (see [`Limits`]) and nothing panics. Memory is read only through [`ReadMemory`]; the walker
//! knows no versions (the one version `match` is in `facts`). Facts and sources:
//! `docs/cpython-layouts.md`.
//!
//! Files: `memory` (trait, live and image memory) · `detect` (which mapped file is the runtime, asked of `procs`; its bias) · `layout`,
//! `tables` and `facts` (the descriptor, the debug-offsets field lists, the per-version facts) ·
//! `walker` (interpreters → threads → frames) · `code` (code cache, line resolution) ·
//! `linetable` · `unicode` · `gil` · `threadnames` · `errors` · `objects`, `values`, `repr`,
//! `locals` (`dump --locals`). The `dump` command itself is the top-level `dump` module.
//! Tests only: `testimage` + `testvalues` (synthetic images), `walker_tests`, `fuzz_tests`,
//! `live_tests` (real interpreters; `SKIPPED:` when one is missing, a failure under `CI=true`).

pub mod code;
pub mod detect;
pub mod errors;
mod facts;
pub mod gil;
pub mod kernel;
pub mod layout;
pub mod linetable;
pub mod locals;
pub mod memory;
pub mod objects;
mod printable_table;
pub mod repr;
pub mod snapshot;
pub mod syspath;
mod tables;
pub mod threadnames;
pub mod unicode;
pub mod values;
mod version;
pub mod walker;

#[cfg(test)]
pub(crate) mod fuzz_tests;
#[cfg(test)]
pub(crate) mod live_tests;
#[cfg(test)]
mod repr_live_tests;
#[cfg(test)]
pub(crate) mod testimage;
#[cfg(test)]
pub(crate) mod testlocals;
#[cfg(test)]
mod testvalues;
#[cfg(test)]
mod walker_tests;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::lru::Lru;
use crate::procs::FileId;

pub use code::{CodeCache, Ctx, Target};
pub use detect::Detected;
pub use errors::{ErrorCounts, ErrorKind, PyError};
pub use layout::{PyVersion, RuntimeLayout};
pub use memory::{ImageMemory, MemError, ProcessMemory, ReadMemory};
pub use walker::Limits;

use facts::version_facts;
use gil::{InterpGil, read_interp_gil, thread_gil};
use layout::{DEBUG_COOKIE, debug_offsets_len};
use version::{check_binary, read_version};

/// GIL state of one thread at the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GilState {
    Holds,
    DoesNotHold,
    /// Free-threaded build with the GIL disabled at run time.
    NoGil,
    Unknown,
}

/// One Python frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// `co_qualname`.
    pub function: String,
    pub file: String,
    /// -1 when unknown (no location, or a torn read).
    pub line: i32,
    pub first_line: i32,
    pub code_addr: u64,
}

/// One thread of one interpreter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyThread {
    /// Linux TID as the target sees it (its pid namespace).
    pub native_thread_id: u64,
    /// The TID on the host, via `NSpid` of `/proc/PID/task/*/status`.
    pub host_tid: Option<u32>,
    /// `pthread_t` (`threading.get_ident()`).
    pub python_thread_id: u64,
    /// `threading` name, else the OS name (`/proc/PID/task/TID/comm`).
    pub name: Option<String>,
    pub gil: GilState,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    /// The frame chain with its entry frames (for the native merge).
    pub items: Vec<walker::ChainItem>,
    /// Per frame its arguments and locals (when the limits ask for them; else empty).
    pub locals: Vec<Vec<locals::Local>>,
    pub truncated: bool,
    pub tstate_addr: u64,
    /// `PyThreadState.state == _Py_THREAD_ATTACHED` (3.13+): running Python right now.
    pub attached: Option<bool>,
}

/// What is cached per interpreter file: its version and layout.
type LayoutCache = Mutex<Lru<FileId, (PyVersion, Arc<RuntimeLayout>)>>;
static LAYOUTS: LazyLock<LayoutCache> = LazyLock::new(|| Mutex::new(Lru::new(1024)));

/// One attached target: its layout, runtime address and caches.
pub struct PythonProcess {
    pid: u32,
    version: PyVersion,
    layout: Arc<RuntimeLayout>,
    detected: Detected,
    target: Target,
    mem: Box<dyn ReadMemory + Send>,
    source: Source,
    codes: CodeCache,
    counts: ErrorCounts,
    limits: Limits,
    /// Interpreter → its `threading._active` dict (see [`threadnames::active_dict`]), so a
    /// name lookup does not search `sys.modules` each time.
    active_dicts: HashMap<u64, u64>,
}

/// Where a target's threads are named and numbered from.
enum Source {
    /// A live process: `/proc/PID/task`.
    Live,
    /// A memory image (a core file): its threads as (thread id, thread pointer).
    Image { threads: Vec<(u32, u64)> },
}

/// A process known from a memory image (a core file) rather than as a live pid.
pub struct ImageSource<'a> {
    /// The pid it had.
    pub pid: u32,
    /// Its mappings.
    pub mappings: &'a [crate::procs::Mapping],
    /// Opens the file behind a mapping.
    pub open: &'a dyn Fn(&crate::procs::Mapping) -> Option<std::fs::File>,
    /// Its memory.
    pub memory: Box<dyn ReadMemory + Send>,
    /// Its threads: (thread id, thread pointer, which is `pthread_self()` on glibc and so
    /// CPython's `thread_id`).
    pub threads: Vec<(u32, u64)>,
}

/// The layout of the runtime at `d`: from the per-file cache when `cached`, else (and on a
/// miss) built from the target's memory and checked.
fn layout_for(
    mem: &dyn ReadMemory,
    pid: u32,
    d: &Detected,
    version: PyVersion,
    cached: bool,
) -> Result<Arc<RuntimeLayout>, PyError> {
    let key = &d.file;
    if cached
        && let Some((v, l)) = LAYOUTS.lock().ok().and_then(|mut c| c.get(key).cloned())
        && v == version
    {
        return Ok(l);
    }
    let facts = version_facts(version.major, version.minor, version.free_threaded)?;
    let bytes = mem
        .read_vec(d.runtime_addr, debug_offsets_len(&facts))
        .map_err(|e| PyError::from_mem(pid, e))?;
    let layout = RuntimeLayout::build(version, &bytes)?;
    if d.runtime_size != 0
        && facts_has_debug_offsets(&bytes)
        && layout.runtime.size > d.runtime_size
    {
        return Err(PyError::Invalid {
            what: "runtime_state.size",
            addr: d.runtime_addr,
            detail: format!(
                "{} exceeds the .PyRuntime size {}",
                layout.runtime.size, d.runtime_size
            ),
        });
    }
    if debug_offsets_len(&facts) == 0 {
        check_binary(mem, pid, d, version, &layout)?;
    }
    let layout = Arc::new(layout);
    if cached && let Ok(mut c) = LAYOUTS.lock() {
        c.insert(key.clone(), (version, Arc::clone(&layout)));
    }
    Ok(layout)
}

fn facts_has_debug_offsets(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && &bytes[..8] == DEBUG_COOKIE
}

impl PythonProcess {
    /// Finds the interpreter in `pid` by content and builds its layout.
    pub fn attach(pid: u32) -> Result<PythonProcess, PyError> {
        let candidates = detect::detect(pid)?;
        Self::choose(
            pid,
            candidates,
            Box::new(ProcessMemory::new(pid)),
            Source::Live,
            true,
        )
    }

    /// Finds the interpreter in a memory image (a core file) by content.
    pub fn attach_image(src: ImageSource<'_>) -> Result<PythonProcess, PyError> {
        let open = src.open;
        let candidates = detect::detect_in(src.mappings, &|mine| {
            let file = open(mine.first()?)?;
            detect::python_elf(&file).map(Arc::new)
        });
        Self::choose(
            src.pid,
            candidates,
            src.memory,
            Source::Image {
                threads: src.threads,
            },
            true,
        )
    }

    /// The runtime among `candidates` to read (an initialised one first). `cached`: layouts
    /// may come from the per-file cache (snapshots read everything from their own memory).
    fn choose(
        pid: u32,
        candidates: Vec<Detected>,
        mem: Box<dyn ReadMemory + Send>,
        source: Source,
        cached: bool,
    ) -> Result<PythonProcess, PyError> {
        let mut first_err = None;
        let mut chosen = None;
        for d in candidates {
            let attempt = read_version(&*mem, pid, &d, cached)
                .and_then(|v| Ok((v, layout_for(&*mem, pid, &d, v, cached)?)));
            match attempt {
                Ok((version, layout)) => {
                    // An embedding process can map two runtimes: prefer the initialised one.
                    let live = mem
                        .read_u64(
                            d.runtime_addr
                                .wrapping_add(layout.runtime.interpreters_head),
                        )
                        .is_ok_and(|h| h != 0);
                    if live || chosen.is_none() {
                        chosen = Some((d, version, layout));
                    }
                    if live {
                        break;
                    }
                }
                Err(e @ (PyError::ProcessGone { .. } | PyError::PermissionDenied { .. })) => {
                    return Err(e);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let Some((detected, version, layout)) = chosen else {
            return Err(first_err.unwrap_or(PyError::NotPython { pid }));
        };
        // glibc's `_thread_db_pthread_tid` is `{bit size, count, offset}` (`nptl_db`'s
        // `DB_STRUCT_FIELD`): the offset of `tid` in `struct pthread`.
        let pthread_tid = detected
            .pthread_tid_desc
            .and_then(|a| mem.read_vec(a, 12).ok())
            .and_then(|b| {
                let w = |i: usize| {
                    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
                };
                (w(0) == 32 && w(2) < 4096).then(|| u64::from(w(2)))
            });
        let target = Target {
            pid,
            runtime: detected.runtime_addr,
            pthread_tid,
            pycode_type: detected.pycode_type_addr,
            pyframe_type: detected.pyframe_type_addr,
            image: detected.image.clone(),
            known: detected.known.clone(),
        };
        Ok(PythonProcess {
            pid,
            version,
            layout,
            detected,
            target,
            mem,
            source,
            codes: CodeCache::default(),
            counts: ErrorCounts::default(),
            limits: Limits::default(),
            active_dicts: HashMap::new(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn version(&self) -> PyVersion {
        self.version
    }

    pub fn layout(&self) -> &RuntimeLayout {
        &self.layout
    }

    /// The ELF that holds the runtime, its bias and `_PyRuntime` address.
    pub fn detected(&self) -> &Detected {
        &self.detected
    }

    pub fn error_counts(&self) -> &ErrorCounts {
        &self.counts
    }

    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The absolute entries of the main interpreter's `sys.path` (see [`syspath::sys_path`]).
    pub fn sys_path(&mut self) -> Result<Vec<String>, PyError> {
        self.mem.refresh();
        let interp = self.main_interp()?;
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        syspath::sys_path(ctx, interp).map_err(|e| PyError::Invalid {
            what: "sys.path",
            addr: interp,
            detail: e.to_string(),
        })
    }

    /// The main interpreter: the last of the list (bounded walk).
    fn main_interp(&self) -> Result<u64, PyError> {
        let to_py = |e| PyError::from_mem(self.pid, e);
        let l = &self.layout;
        let mut interp = self
            .mem
            .read_u64(
                self.detected
                    .runtime_addr
                    .wrapping_add(l.runtime.interpreters_head),
            )
            .map_err(to_py)?;
        for _ in 0..self.limits.max_interpreters {
            match self
                .mem
                .read_u64(interp.wrapping_add(l.interp.next))
                .map_err(to_py)?
            {
                0 => break,
                next => interp = next,
            }
        }
        Ok(interp)
    }

    /// Whether the main interpreter runs with a GIL (free-threaded builds can run without).
    pub fn gil_enabled(&mut self) -> Result<bool, PyError> {
        self.mem.refresh();
        let interp = self.main_interp()?;
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        Ok(!matches!(
            read_interp_gil(ctx, interp),
            Ok(InterpGil::Disabled)
        ))
    }

    /// Every thread of every interpreter, with its stack, now.
    pub fn threads(&mut self) -> Result<Vec<PyThread>, PyError> {
        self.mem.refresh();
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        let interps = walker::walk(
            ctx,
            self.detected.runtime_addr,
            &mut self.codes,
            &mut self.counts,
            self.limits,
        )?;
        let pid = self.pid;
        let threads = match &self.source {
            Source::Live => {
                let host_tids = host_tid_map(pid);
                let os_name = |tid: u32| os_thread_name(pid, tid);
                assemble(
                    ctx,
                    &interps,
                    &host_tids,
                    &os_name,
                    &mut self.counts,
                    self.limits,
                )
            }
            Source::Image { threads } => {
                let ids = image_thread_ids(&interps, threads);
                assemble(
                    ctx,
                    &interps,
                    &ids,
                    &|_| None,
                    &mut self.counts,
                    self.limits,
                )
            }
        };
        Ok(threads)
    }

    /// `threading` names of the threads that have one, by native thread id (in the target's
    /// pid namespace): thread lists and `threading._active` only, no frames (see
    /// [`walker::thread_ids`]). Best effort: an interpreter whose names cannot be read (they
    /// change while threads start and end) gives none; nothing is counted.
    pub fn thread_names(&mut self) -> Result<HashMap<u64, String>, PyError> {
        self.mem.refresh();
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        let limits = self.limits;
        let mut out = HashMap::new();
        let interps = walker::thread_ids(ctx, self.detected.runtime_addr, limits)?;
        self.active_dicts
            .retain(|i, _| interps.iter().any(|(interp, _)| interp == i));
        for (interp, ids) in interps {
            let Some(names) = interp_names(ctx, interp, &mut self.active_dicts, limits) else {
                continue;
            };
            for (native, thread_id) in ids {
                if let Some(n) = names.get(&thread_id) {
                    out.entry(native).or_insert_with(|| n.clone());
                }
            }
        }
        Ok(out)
    }

    /// One thread's frames (and locals, if the limits ask), read afresh from its thread state
    /// (e.g. while `dump --native` holds the thread stopped).
    pub fn thread_frames(&mut self, tstate: u64) -> Result<walker::WalkedFrames, PyError> {
        self.mem.refresh();
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        walker::walk_thread(ctx, tstate, &mut self.codes, &mut self.counts, self.limits)
    }

    /// Resolves a frame captured elsewhere (e.g. in the kernel): code object + instruction
    /// pointer (+ the 3.14t `tlbc_index`, 0 otherwise) → function, file, line.
    pub fn resolve_frame(
        &mut self,
        code_addr: u64,
        instr_ptr: u64,
        tlbc_index: i32,
    ) -> Result<PyFrame, PyError> {
        self.mem.refresh();
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        match code::resolve(
            ctx,
            &mut self.codes,
            &mut self.counts,
            code_addr,
            instr_ptr,
            tlbc_index,
        ) {
            Ok(r) => Ok(r.frame),
            Err(e) => {
                self.counts.add(e.kind());
                Err(match e {
                    code::CodeError::Memory(m) => PyError::from_mem(self.pid, m),
                    other => PyError::Invalid {
                        what: "code object",
                        addr: code_addr,
                        detail: other.to_string(),
                    },
                })
            }
        }
    }

    /// Resolves a frame the kernel captured with its code object's identity `id` (see
    /// [`code::resolve_sampled`]: a code object freed since the sample is named from it).
    pub fn resolve_sampled_frame(
        &mut self,
        code_addr: u64,
        instr_ptr: u64,
        tlbc_index: i32,
        id: code::CodeIdentity,
    ) -> Result<PyFrame, PyError> {
        self.mem.refresh();
        let ctx = Ctx {
            mem: &*self.mem,
            layout: &self.layout,
            target: &self.target,
        };
        match code::resolve_sampled(
            ctx,
            &mut self.codes,
            &mut self.counts,
            (code_addr, instr_ptr, tlbc_index),
            id,
        ) {
            Ok(r) => Ok(r.frame),
            Err(e) => {
                self.counts.add(e.kind());
                Err(match e {
                    code::CodeError::Memory(m) => PyError::from_mem(self.pid, m),
                    other => PyError::Invalid {
                        what: "code object",
                        addr: code_addr,
                        detail: other.to_string(),
                    },
                })
            }
        }
    }
}

/// Adds names, host TIDs and GIL states to the walked threads. Main interpreter (the last of
/// the list) first, and within it the oldest thread (the main thread) first.
pub fn assemble<S: std::hash::BuildHasher>(
    ctx: Ctx<'_>,
    interps: &[walker::RawInterp],
    host_tids: &HashMap<u32, u32, S>,
    os_name: &dyn Fn(u32) -> Option<String>,
    counts: &mut ErrorCounts,
    limits: Limits,
) -> Vec<PyThread> {
    let mut out = Vec::new();
    for interp in interps.iter().rev() {
        let gil = read_interp_gil(ctx, interp.addr).ok();
        if gil.is_none() {
            counts.add(ErrorKind::GilUnreadable);
        }
        // `threading._active` changes while threads start and exit: retry a torn read afresh.
        let mut names = threadnames::thread_names(ctx, interp.addr, limits.max_threads as u64);
        for _ in 0..2 {
            if names.is_ok() {
                break;
            }
            ctx.mem.refresh();
            names = threadnames::thread_names(ctx, interp.addr, limits.max_threads as u64);
        }
        let names = names.unwrap_or_else(|_| {
            counts.add(ErrorKind::ThreadNames);
            HashMap::new()
        });
        for t in interp.threads.iter().rev() {
            let host_tid = u32::try_from(t.native_thread_id)
                .ok()
                .and_then(|tid| host_tids.get(&tid).copied());
            let name = names
                .get(&t.thread_id)
                .cloned()
                .or_else(|| host_tid.and_then(os_name));
            out.push(PyThread {
                native_thread_id: t.native_thread_id,
                host_tid,
                python_thread_id: t.thread_id,
                name,
                // A thread state no thread has bound yet (`thread_id` 0: a thread being
                // started) has never held the GIL: `last_holder` naming it is a freed thread
                // state whose memory the new one reuses (thread-per-request servers).
                gil: match thread_gil(gil, t.tstate, t.holds_gil) {
                    GilState::Holds if t.thread_id == 0 => GilState::DoesNotHold,
                    g => g,
                },
                frames: t.frames.clone(),
                items: t.items.clone(),
                locals: t.locals.clone(),
                truncated: t.truncated,
                tstate_addr: t.tstate,
                attached: t.attached,
            });
        }
    }
    out
}

/// A memory image's threads by the walked threads' native ids: matched by thread pointer
/// (`pthread_self()` = `thread_id`, whatever pid namespace the image's thread ids are in), else
/// by equal thread ids.
fn image_thread_ids(interps: &[walker::RawInterp], threads: &[(u32, u64)]) -> HashMap<u32, u32> {
    let mut out = HashMap::new();
    for t in interps.iter().flat_map(|i| &i.threads) {
        let Ok(native) = u32::try_from(t.native_thread_id) else {
            continue;
        };
        let by_pointer = threads
            .iter()
            .find(|(_, fs)| *fs != 0 && *fs == t.thread_id);
        let by_id = threads.iter().find(|(tid, _)| *tid == native);
        if let Some((tid, _)) = by_pointer.or(by_id) {
            out.insert(native, *tid);
        }
    }
    out
}

/// TID in the target's innermost pid namespace → TID on the host, from `NSpid:` lines.
pub fn host_tid_map(pid: u32) -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return map;
    };
    for entry in dir.flatten().take(1 << 16) {
        let Some(host) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last()?.parse::<u32>().ok())
            .unwrap_or(host);
        map.insert(inner, host);
    }
    map
}

/// The `threading` names of interpreter `interp` (`pthread_t` → name), its `_active` dict
/// taken from `cache` or found (and cached); read again, at most twice, when a read fails
/// (threads start and end meanwhile), the cached address dropped then. `None`: no names.
fn interp_names(
    ctx: Ctx<'_>,
    interp: u64,
    cache: &mut HashMap<u64, u64>,
    limits: Limits,
) -> Option<HashMap<u64, String>> {
    for attempt in 0..3 {
        if attempt > 0 {
            ctx.mem.refresh();
        }
        let active = match cache.get(&interp) {
            Some(&a) => a,
            None => match threadnames::active_dict(ctx, interp) {
                Ok(Some(a)) => *cache.entry(interp).or_insert(a),
                Ok(None) => return Some(HashMap::new()),
                Err(_) => continue,
            },
        };
        match threadnames::active_names(ctx, active, limits.max_threads as u64) {
            Ok(names) => return Some(names),
            Err(_) => {
                cache.remove(&interp);
            }
        }
    }
    None
}

/// `/proc/PID/task/TID/comm` (15 bytes at most; 3.14+ threads carry their Python name).
pub fn os_thread_name(pid: u32, host_tid: u32) -> Option<String> {
    let comm = std::fs::read(format!("/proc/{pid}/task/{host_tid}/comm")).ok()?;
    let s = String::from_utf8_lossy(&comm)
        .trim_end_matches('\n')
        .to_owned();
    (!s.is_empty()).then_some(s)
}
