//! Row keys of `report --sort`: what each key is called, its column header, and its value for
//! a sample (comm, pid, tid, thread, state, gil) or for a frame (module, function, srcline).
//! `state` is where the thread was (`on-cpu`, or with `record --idle` off a CPU: `runnable`,
//! `sleeping`, `blocked`, `gil-wait`); `gil` whether it held the GIL (`held`, `released`,
//! `disabled`, `unknown`), as read with the sample's Python frames.
//!
//! Frame-derived values (perf's columns):
//! - function ("Symbol"): the frame's name, prefixed `[k] ` for kernel frames and `[.] ` for
//!   everything else (user space), as perf does;
//! - module ("Shared Object"): a native frame's module, `[kernel.kallsyms]` for kernel frames,
//!   the source file for Python frames, `[unknown]` for markers and synthetic frames;
//! - srcline ("Source:Line"): `file:line` when the frame has both (Python frames; native frames
//!   with debug line information, as perf shows them), the file alone for a Python frame without
//!   a line, else the module (`[kernel.kallsyms]`, `libc.so.6`), else `??`.
//!
//! Process and Thread frames are synthetic (they carry the sample's comm and thread): they give
//! no frame key. A stack with nothing else has the [`FrameKeys::unknown`] values.
//!
//! [`KeyOptions`]: Python files are short (relative to their `sys.path` entry) unless
//! `--full-filenames`; a native function the symbolizer could not name (`libz.so.1+0x1f3a`,
//! `[kernel]+0x…`) groups under its module, `[libz.so.1]`, unless `--addresses` asks for one
//! row per address.

use std::sync::Arc;

use crate::profile::{FileNames, Frame, FrameKind, GilState, Profile, SampleKey, ThreadState};

/// How frames turn into key values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyOptions {
    /// Which Python file names.
    pub file_names: FileNames,
    /// One row per unnamed native address instead of one per module.
    pub addresses: bool,
}

/// `[module]` when `name` is an address the symbolizer could not name (`module+0xHEX`).
fn unnamed_address(name: &str, module: Option<&str>) -> Option<String> {
    let (head, hex) = name.rsplit_once("+0x")?;
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let module = module.filter(|m| !m.is_empty()).unwrap_or(head);
    (head == module || head == "[kernel]").then(|| format!("[{}]", module.trim_matches(['[', ']'])))
}

/// One `--sort` key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SortKey {
    /// Process name.
    Comm,
    /// Process id.
    Pid,
    /// Thread id.
    Tid,
    /// Thread name.
    Thread,
    /// Thread state (on a CPU, or off it and why).
    State,
    /// GIL state.
    Gil,
    /// Module of the frame (perf "Shared Object").
    Module,
    /// Function of the frame (perf "Symbol").
    Function,
    /// Source location of the frame.
    Srcline,
}

impl SortKey {
    /// Every key, in the order the error message lists them.
    pub const ALL: [SortKey; 9] = [
        SortKey::Comm,
        SortKey::Pid,
        SortKey::Tid,
        SortKey::Thread,
        SortKey::State,
        SortKey::Gil,
        SortKey::Module,
        SortKey::Function,
        SortKey::Srcline,
    ];

    /// Parses a key; perf's names `dso`, `sym` and `symbol` are accepted too.
    pub fn parse(name: &str) -> Option<SortKey> {
        Some(match name {
            "comm" => SortKey::Comm,
            "pid" => SortKey::Pid,
            "tid" => SortKey::Tid,
            "thread" => SortKey::Thread,
            "state" => SortKey::State,
            "gil" => SortKey::Gil,
            "module" | "dso" => SortKey::Module,
            "function" | "sym" | "symbol" => SortKey::Function,
            "srcline" => SortKey::Srcline,
            _ => return None,
        })
    }

    /// `comm, pid, …` for messages.
    pub fn valid_names() -> String {
        SortKey::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The key's name (JSON object key, CSV header).
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Comm => "comm",
            SortKey::Pid => "pid",
            SortKey::Tid => "tid",
            SortKey::Thread => "thread",
            SortKey::State => "state",
            SortKey::Gil => "gil",
            SortKey::Module => "module",
            SortKey::Function => "function",
            SortKey::Srcline => "srcline",
        }
    }

    /// The text column header (perf's).
    pub fn header(self) -> &'static str {
        match self {
            SortKey::Comm => "Command",
            SortKey::Pid => "Pid",
            SortKey::Tid => "Tid",
            SortKey::Thread => "Thread",
            SortKey::State => "State",
            SortKey::Gil => "GIL",
            SortKey::Module => "Shared Object",
            SortKey::Function => "Symbol",
            SortKey::Srcline => "Source:Line",
        }
    }

    /// Whether the value comes from a frame rather than from the sample.
    pub fn is_frame_key(self) -> bool {
        matches!(self, SortKey::Module | SortKey::Function | SortKey::Srcline)
    }

    /// Whether values are numbers (right-aligned, JSON numbers).
    pub fn is_numeric(self) -> bool {
        matches!(self, SortKey::Pid | SortKey::Tid)
    }
}

/// One value of a row key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// pid, tid.
    Num(u32),
    /// Everything else.
    Text(Arc<str>),
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Part::Num(n) => write!(f, "{n}"),
            Part::Text(s) => f.write_str(s),
        }
    }
}

/// The frame-derived key values of one frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameKeys {
    /// `[.] name` / `[k] name`.
    pub function: Arc<str>,
    /// Module.
    pub module: Arc<str>,
    /// Source location.
    pub srcline: Arc<str>,
}

/// Module of a frame without one.
pub const UNKNOWN_MODULE: &str = "[unknown]";
/// Module of kernel frames (perf's).
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

impl FrameKeys {
    /// The values of a frame (`None` for the synthetic Process and Thread frames, and for
    /// the thread state ending an off-CPU stack: the `state` key shows it).
    pub fn of(frame: &Frame, opts: KeyOptions) -> Option<FrameKeys> {
        let prefix = match frame.kind {
            FrameKind::Process | FrameKind::Thread | FrameKind::State => return None,
            FrameKind::Kernel => "[k]",
            FrameKind::Python | FrameKind::Native | FrameKind::Marker => "[.]",
        };
        let module: Arc<str> = match frame.kind {
            FrameKind::Kernel => KERNEL_MODULE.into(),
            FrameKind::Native => frame
                .module
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| UNKNOWN_MODULE.into()),
            FrameKind::Python => frame
                .display_file(opts.file_names)
                .filter(|f| !f.is_empty())
                .unwrap_or(UNKNOWN_MODULE)
                .into(),
            FrameKind::Marker | FrameKind::Process | FrameKind::Thread | FrameKind::State => {
                UNKNOWN_MODULE.into()
            }
        };
        let file = match frame.kind {
            FrameKind::Python => frame.display_file(opts.file_names),
            _ => frame.file.as_deref(),
        };
        let srcline: Arc<str> = match (file, frame.line) {
            (Some(file), Some(line)) if !file.is_empty() => format!("{file}:{line}").into(),
            (Some(file), None) if frame.kind == FrameKind::Python && !file.is_empty() => {
                file.into()
            }
            _ if &*module != UNKNOWN_MODULE => module.clone(),
            _ => "??".into(),
        };
        let unnamed = match frame.kind {
            FrameKind::Native | FrameKind::Kernel if !opts.addresses => {
                unnamed_address(&frame.name, frame.module.as_deref())
            }
            _ => None,
        };
        let name = unnamed.as_deref().unwrap_or(&frame.name);
        Some(FrameKeys {
            function: format!("{prefix} {name}").into(),
            module,
            srcline,
        })
    }

    /// The values of a stack with no frame under its process (and thread).
    pub fn unknown() -> FrameKeys {
        FrameKeys {
            function: "[.] [unknown]".into(),
            module: UNKNOWN_MODULE.into(),
            srcline: "??".into(),
        }
    }

    /// The value of a frame key.
    fn part(&self, key: SortKey) -> Part {
        Part::Text(match key {
            SortKey::Module => self.module.clone(),
            SortKey::Function => self.function.clone(),
            _ => self.srcline.clone(),
        })
    }
}

/// Frame-key values of every frame of a profile, computed once.
pub struct FrameTable {
    keys: Vec<Option<FrameKeys>>,
    unknown: FrameKeys,
}

impl FrameTable {
    /// Computes the values of every frame (nothing when `needed` is false).
    pub fn new(profile: &Profile, needed: bool, opts: KeyOptions) -> FrameTable {
        FrameTable {
            keys: if needed {
                profile
                    .frames()
                    .iter()
                    .map(|f| FrameKeys::of(f, opts))
                    .collect()
            } else {
                Vec::new()
            },
            unknown: FrameKeys::unknown(),
        }
    }

    /// The values of frame `index` (`None`: synthetic, or not computed).
    pub fn get(&self, index: usize) -> Option<&FrameKeys> {
        self.keys.get(index).and_then(Option::as_ref)
    }

    /// The values of a stack without a real frame.
    pub fn unknown(&self) -> &FrameKeys {
        &self.unknown
    }
}

/// The key tuple of `sample` with frame values `frame`, in `keys` order, into `out`.
pub fn tuple(keys: &[SortKey], sample: &SampleParts, frame: &FrameKeys, out: &mut Vec<Part>) {
    out.clear();
    for &k in keys {
        out.push(match k {
            SortKey::Comm => Part::Text(sample.comm.clone()),
            SortKey::Pid => Part::Num(sample.pid),
            SortKey::Tid => Part::Num(sample.tid),
            SortKey::Thread => Part::Text(sample.thread.clone()),
            SortKey::State => Part::Text(sample.state.as_str().into()),
            SortKey::Gil => Part::Text(sample.gil.as_str().into()),
            _ => frame.part(k),
        });
    }
}

/// The sample-level values a row may need.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SampleParts {
    /// Process name.
    pub comm: Arc<str>,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub thread: Arc<str>,
    /// Thread state.
    pub state: ThreadState,
    /// GIL state.
    pub gil: GilState,
}

impl SampleParts {
    /// The parts of `s` (a key of `profile`) that `keys` use; the others are left empty so that
    /// samples that differ only in them group together.
    pub fn of(profile: &Profile, s: &SampleKey, keys: &[SortKey], empty: &Arc<str>) -> SampleParts {
        SampleParts {
            comm: if keys.contains(&SortKey::Comm) {
                profile.comm(s).clone()
            } else {
                empty.clone()
            },
            pid: if keys.contains(&SortKey::Pid) {
                s.pid
            } else {
                0
            },
            tid: if keys.contains(&SortKey::Tid) {
                s.tid
            } else {
                0
            },
            thread: if keys.contains(&SortKey::Thread) {
                profile.thread(s).clone()
            } else {
                empty.clone()
            },
            state: if keys.contains(&SortKey::State) {
                s.state
            } else {
                ThreadState::OnCpu
            },
            gil: if keys.contains(&SortKey::Gil) {
                s.gil
            } else {
                GilState::Unknown
            },
        }
    }
}
