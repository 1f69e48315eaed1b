//! The runtime layout descriptor: every CPython version difference, as data (style rule 5).
//!
//! Owns: [`RuntimeLayout`] (one descriptor per attached interpreter): built from the target's
//! `_Py_DebugOffsets` read with the field list of its minor version (`tables`), or from the
//! built-in 3.8–3.12 tables, combined with the facts the debug offsets do not carry (`facts`, which
//! holds the only `match` on the CPython version), then validated.
//! Input: the bytes of the target's `_Py_DebugOffsets` (3.13+; `Include/internal/
//! pycore_debug_offsets.h`, `pycore_runtime.h` in 3.13) or the `Py_Version` value (3.12).
//! Output: a validated [`RuntimeLayout`], or a `PyError` (`Unsupported` for a minor version whose
//! debug-offsets struct is unknown, `Invalid` when a value is out of bounds).
//! Constraints: every value is read from the target where it provides it; a value that is not
//! in bounds (an offset not smaller than the size of its struct, an absurd size) is rejected, so
//! the walker never reads garbage because of a stale table. Facts and their CPython sources:
//! `docs/cpython-layouts.md` (§2, §3.4, §5, §6, §7).

use super::PyError;
use super::facts::{FieldSource, HoldsGilFact, VersionFacts, version_facts};
// The descriptor exposes the per-version dict placement as one of its fields; the type is
// defined with the facts that choose it (facts never imports the descriptor: no import loop).
pub use super::facts::{DictKeys, EntryRule, InstrKind, LineTableKind, LongForm, ManagedDict};

/// Size of the `_Py_DebugOffsets` header: `char cookie[8]; uint64_t version; uint64_t
/// free_threaded;` — the field list follows, one `uint64_t` each.
pub const DEBUG_OFFSETS_HEADER: usize = 24;
/// `_Py_Debug_Cookie` in `Include/internal/pycore_debug_offsets.h`.
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// A CPython version, from `PY_VERSION_HEX` (`Py_Version` or `_Py_DebugOffsets.version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyVersion {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
    /// `0xA` alpha, `0xB` beta, `0xC` release candidate, `0xF` final.
    pub level: u8,
    pub serial: u8,
    pub free_threaded: bool,
}

impl PyVersion {
    pub fn from_hex(hex: u64, free_threaded: bool) -> PyVersion {
        PyVersion {
            major: (hex >> 24) as u8,
            minor: (hex >> 16) as u8,
            micro: (hex >> 8) as u8,
            level: ((hex >> 4) & 0xf) as u8,
            serial: (hex & 0xf) as u8,
            free_threaded,
        }
    }

    /// "3.13" or "3.14t": how errors name a version.
    pub fn short(&self) -> String {
        format!(
            "{}.{}{}",
            self.major,
            self.minor,
            if self.free_threaded { "t" } else { "" }
        )
    }
}

impl std::fmt::Display for PyVersion {
    /// "3.13.0", "3.15.0a3", "3.14.0rc1" (free-threading is reported separately).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        match self.level {
            0xA => write!(f, "a{}", self.serial),
            0xB => write!(f, "b{}", self.serial),
            0xC => write!(f, "rc{}", self.serial),
            _ => Ok(()),
        }
    }
}

/// Where `PyThreadState` says whether the thread holds the GIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldsGil {
    /// 3.12: not recorded per thread.
    Unknown,
    /// 3.13: `_status.holds_gil`, bit `bit` of the 32-bit word at `offset`.
    StatusBit { offset: u64, bit: u32 },
    /// 3.14+: `int holds_gil` at `offset`.
    Int { offset: u64 },
}

/// Where the GIL is and its fields (relative to the `_gil_runtime_state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GilLayout {
    pub at: GilAt,
    pub locked: u64,
    pub last_holder: u64,
    /// `enabled` (free-threaded builds only).
    pub enabled: Option<u64>,
}

/// Bytes of `_gil_runtime_state` from `locked` to its end on x86-64 (glibc and musl): `locked`
/// and its padding (8), `switch_number` (8), `cond` and `switch_cond` (`pthread_cond_t`, 48
/// each), `mutex` and `switch_mutex` (`pthread_mutex_t`, 40 each); the same from 3.8 to 3.15
/// (docs/cpython-layouts.md §6).
pub const GIL_BYTES_FROM_LOCKED: u64 = 8 + 8 + 48 + 40 + 48 + 40;

impl GilLayout {
    /// Size of the whole `_gil_runtime_state`: a thread blocked in `futex` on an address inside
    /// it is waiting for the GIL (its condition variables and mutexes are all there).
    pub fn size(&self) -> u64 {
        self.locked + GIL_BYTES_FROM_LOCKED
    }
}

/// Where the `_gil_runtime_state` an interpreter uses is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GilAt {
    /// ≤ 3.11: one GIL per process, `_PyRuntime.ceval.gil` at this offset.
    Runtime { offset: u64 },
    /// 3.12+: `interp->ceval.gil` (a pointer; NULL: the embedded `_gil` at `embedded`).
    Interpreter { ceval_gil: u64, embedded: u64 },
}

/// `_PyRuntimeState` (`runtime_state.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOffsets {
    pub size: u64,
    /// `interpreters.head`.
    pub interpreters_head: u64,
    /// `main_thread` (`pthread_t` of the main thread; built-in tables only, for the checks).
    pub main_thread: Option<u64>,
}

/// `PyInterpreterState` (`interpreter_state.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpOffsets {
    pub size: u64,
    pub id: u64,
    pub next: u64,
    /// `threads.head` (≤ 3.10: `tstate_head`; newest thread first).
    pub threads_head: u64,
    /// `imports.modules` (≤ 3.11: `modules`; the `sys.modules` dict).
    pub imports_modules: u64,
    /// `_code_object_generation` / `tlbc_generation` (3.14+; the latter free-threaded only).
    pub code_object_generation: Option<u64>,
    pub tlbc_generation: Option<u64>,
}

/// `PyThreadState` (`thread_state.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadOffsets {
    pub size: u64,
    pub next: u64,
    pub interp: u64,
    /// 3.13+: `current_frame`; 3.11, 3.12: `cframe` (see `cframe_current_frame`); ≤ 3.10:
    /// `frame`.
    pub current_frame: u64,
    /// 3.11, 3.12: the word at `tstate + current_frame` is a `_PyCFrame *`; the frame is at
    /// this offset inside it (`_PyCFrame.current_frame`).
    pub cframe_current_frame: Option<u64>,
    /// `pthread_t` (`threading.get_ident()`).
    pub thread_id: u64,
    /// Linux TID in the target's pid namespace (3.11+; before, the TID is found through the
    /// `pthread_t`, see `Target::pthread_tid`).
    pub native_thread_id: Option<u64>,
    pub status: Option<u64>,
    pub holds_gil: HoldsGil,
    /// `int state` (`_Py_THREAD_ATTACHED` == 1); 3.13+.
    pub state: Option<u64>,
    /// 3.15+: `base_frame`, the pointer to the frame embedded after the thread state that ends
    /// every chain (owner 3; no eval-loop activation of its own).
    pub base_frame: Option<u64>,
}

/// `_PyInterpreterFrame` (`interpreter_frame.*`; ≤ 3.10 `PyFrameObject`) and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameOffsets {
    /// Bytes read per frame.
    pub size: u64,
    /// `previous` (≤ 3.10: `f_back`).
    pub previous: u64,
    /// `f_executable` (≤ 3.12: `f_code`).
    pub executable: u64,
    /// `instr_ptr` (3.11, 3.12: `prev_instr`; ≤ 3.10: the word starting with `f_lasti`).
    pub instr_ptr: u64,
    pub instr: InstrKind,
    /// `char owner` (3.11+).
    pub owner: Option<u64>,
    /// `bool is_entry` (3.11).
    pub is_entry: Option<u64>,
    /// `localsplus[]`: arguments, locals, cells and free variables, in the order of
    /// `co_localsplusnames` (`PyObject *` up to 3.13, `_PyStackRef` from 3.14).
    pub localsplus: u64,
    /// `int32 tlbc_index` (free-threaded 3.14+).
    pub tlbc_index: Option<u64>,
    /// `_PyStackRef` tag bits of `f_executable` (3.14+: `Py_TAG_BITS` == 3; 0 before).
    pub stackref_tag_mask: u64,
    pub entry: EntryRule,
    /// The largest valid `owner` (None: frames have no owner).
    pub owner_max: Option<u8>,
    /// `f_globals`, `f_locals` (`PyObject *`).
    pub globals: u64,
    pub locals: u64,
    /// ≤ 3.10: a frame is a `PyFrameObject`, whose `ob_type` must be `PyFrame_Type`.
    pub is_object: bool,
}

impl FrameOffsets {
    /// Whether a frame with this `owner` is an entry/base frame (no Python code).
    pub fn is_shim_owner(&self, owner: u8) -> bool {
        matches!(self.entry, EntryRule::OwnerAtLeast(n) if owner >= n)
    }

    /// Bytes from the frame start that hold every field read (the kernel reads only these).
    pub fn header_bytes(&self) -> u64 {
        let ends = [
            self.previous + 8,
            self.executable + 8,
            self.instr_ptr + 8,
            self.owner.map_or(0, |o| o + 1),
            self.is_entry.map_or(0, |o| o + 1),
            self.tlbc_index.map_or(0, |o| o + 4),
            self.globals + 8,
            self.locals + 8,
        ];
        ends.into_iter().max().unwrap_or(0).next_multiple_of(8)
    }
}

/// `PyCodeObject` (`code_object.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeOffsets {
    pub size: u64,
    pub filename: u64,
    pub name: u64,
    /// `co_qualname` (3.11+; before, the plain `co_name` is shown).
    pub qualname: Option<u64>,
    /// `co_linetable` (3.8, 3.9: `co_lnotab`).
    pub linetable: u64,
    pub linetable_kind: LineTableKind,
    pub firstlineno: u64,
    /// `co_code_adaptive` (3.11+: the bytecode inside the code object) …
    pub code_adaptive: Option<u64>,
    /// … or ≤ 3.10 `co_code`, a `bytes` object holding it.
    pub co_code: Option<u64>,
    /// `co_tlbc` (`_PyCodeArray *`, free-threaded 3.14+).
    pub tlbc: Option<u64>,
    /// `_PyCodeArray.entries` (after `Py_ssize_t size`).
    pub tlbc_entries: u64,
    /// `PyVarObject.ob_size`: number of code units in `co_code_adaptive` (3.11+).
    pub ob_size: u64,
    /// `co_localsplusnames` (tuple of str) and `co_localspluskinds` (bytes, `CO_FAST_*`);
    /// 3.11+ (before, locals are named by `co_varnames`, `co_cellvars` and `co_freevars`,
    /// which `dump --locals` does not read).
    pub localsplusnames: Option<u64>,
    pub localspluskinds: Option<u64>,
    /// Up to 3.10: `co_varnames`, `co_cellvars`, `co_freevars` (tuples of str).
    pub varnames: Option<u64>,
    pub cellvars: Option<u64>,
    pub freevars: Option<u64>,
    /// `int co_argcount`, `int co_kwonlyargcount`, `int co_flags` (`CO_VARARGS`,
    /// `CO_VARKEYWORDS`): which of the first locals are arguments.
    pub argcount: u64,
    pub kwonlyargcount: u64,
    pub flags: u64,
}

impl CodeOffsets {
    /// Bytes of the code object's header the reader copies.
    pub fn header_bytes(&self) -> u64 {
        self.code_adaptive.unwrap_or(self.size)
    }
}

/// `PyObject` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectOffsets {
    /// `sizeof(PyObject)`: 16, or 32 in free-threaded builds.
    pub header_size: u64,
    pub ob_type: u64,
}

/// `PyASCIIObject` / `PyCompactUnicodeObject` and the bits of `state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnicodeLayout {
    pub length: u64,
    pub state: u64,
    pub ascii_size: u64,
    pub compact_size: u64,
    pub kind_shift: u32,
    pub compact_bit: u32,
    pub ascii_bit: u32,
}

/// `PyBytesObject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BytesOffsets {
    pub ob_size: u64,
    pub ob_sval: u64,
}

/// `PyDictObject`, `PyDictValues`, managed dicts and `PyModuleObject.md_dict`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DictLayout {
    pub ma_keys: u64,
    pub ma_values: u64,
    pub keys: DictKeys,
    /// Offset of `values[]` inside `PyDictValues` (0 up to 3.12, 8 in 3.13+; ≤ 3.10
    /// `ma_values` points at the array itself).
    pub values_array: u64,
    pub managed_dict: ManagedDict,
    /// `Py_TPFLAGS_INLINE_VALUES` exists (3.13+).
    pub inline_values: bool,
    pub module_dict: u64,
}

/// `PyTypeObject` / `PyHeapTypeObject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeOffsets {
    pub tp_name: u64,
    pub tp_flags: u64,
    pub tp_basicsize: u64,
    pub tp_dictoffset: u64,
    pub ht_cached_keys: u64,
}

/// `PyLongObject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongOffsets {
    /// 3.12+ `lv_tag` (`ndigits << 3 | sign`); ≤ 3.11 `ob_size` (signed digit count).
    pub lv_tag: u64,
    pub ob_digit: u64,
    /// How sign and digit count are stored.
    pub form: LongForm,
}

/// The built-in containers and scalars `dump --locals` shows as Python's `repr` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueOffsets {
    /// `PyTupleObject.ob_item[]` (inline) and `PyVarObject.ob_size`.
    pub tuple_item: u64,
    pub var_size: u64,
    /// `PyListObject.ob_item` (pointer to the array); the length is `ob_size`.
    pub list_item: u64,
    /// `PyFloatObject.ob_fval`.
    pub float_value: u64,
    /// `PySetObject.used`, `.mask`, `.table` (entries `{key, hash}` of 16 bytes).
    pub set_used: u64,
    pub set_mask: u64,
    pub set_table: u64,
    /// `PyCellObject.ob_ref`.
    pub cell_ref: u64,
}

/// What the running binary must say about itself for a built-in table to apply
/// (`tp_basicsize` of `PyCode_Type` and `PyFrame_Type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryChecks {
    pub code_basicsize: Option<u64>,
    pub frame_basicsize: Option<u64>,
}

/// Everything the walker and the in-kernel walker need to know about one interpreter build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeLayout {
    pub version: PyVersion,
    pub runtime: RuntimeOffsets,
    pub interp: InterpOffsets,
    pub gil: GilLayout,
    pub tstate: ThreadOffsets,
    pub frame: FrameOffsets,
    pub code: CodeOffsets,
    pub object: ObjectOffsets,
    pub unicode: UnicodeLayout,
    pub bytes: BytesOffsets,
    pub dict: DictLayout,
    pub types: TypeOffsets,
    pub long: LongOffsets,
    pub checks: BinaryChecks,
    pub values: ValueOffsets,
    /// `unicodedata.unidata_version` of this minor version (which characters `repr()` escapes).
    pub unicode_version: &'static str,
    /// The named values the layout was built from (debug offsets or the built-in table).
    pub table: Vec<(&'static str, u64)>,
}

/// Named values, looked up by the `_Py_DebugOffsets` field name ("group.field").
struct Table<'a> {
    values: &'a [(&'static str, u64)],
}

impl Table<'_> {
    fn get(&self, name: &str) -> Option<u64> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    fn need(&self, name: &'static str) -> Result<u64, PyError> {
        self.get(name)
            .ok_or_else(|| invalid(name, "missing from the layout table".into()))
    }
}

fn invalid(what: &'static str, detail: String) -> PyError {
    PyError::Invalid {
        what,
        addr: 0,
        detail,
    }
}

/// Groups whose offsets must each be smaller than the group's `size`, with size bounds.
const CHECKED_GROUPS: &[(&str, u64, u64)] = &[
    ("runtime_state", 256, 1 << 24),
    ("interpreter_state", 256, 1 << 24),
    ("thread_state", 64, 1 << 16),
    ("interpreter_frame", 32, 1024),
    ("code_object", 64, 4096),
    ("pyobject", 16, 64),
    ("type_object", 64, 4096),
    ("heap_type_object", 64, 8192),
    ("tuple_object", 16, 256),
    ("dict_object", 16, 256),
    ("long_object", 16, 256),
    ("bytes_object", 16, 256),
    ("unicode_object", 16, 256),
];

/// Offsets that are relative to something other than their group, or 0 when absent.
const NOT_IN_GROUP: &[&str] = &[
    "interpreter_state.gil_runtime_state_enabled",
    // `tp_basicsize` of `PyCode_Type`, compared with the binary (equal to `size` up to 3.10).
    "code_object.basicsize",
];

fn validate(values: &[(&'static str, u64)]) -> Result<(), PyError> {
    let t = Table { values };
    for &(group, lo, hi) in CHECKED_GROUPS {
        let Some(size) = t.get(&format!("{group}.size")) else {
            continue;
        };
        if !(lo..=hi).contains(&size) {
            return Err(invalid(
                "_Py_DebugOffsets",
                format!("{group}.size = {size} is outside {lo}..={hi}"),
            ));
        }
        for &(name, v) in values {
            let in_group = name
                .strip_prefix(group)
                .is_some_and(|rest| rest.starts_with('.'));
            let is_size = name.rsplit('.').next() == Some("size");
            if in_group && !is_size && !NOT_IN_GROUP.contains(&name) && v >= size {
                return Err(invalid(
                    "_Py_DebugOffsets",
                    format!("{name} = {v} is not below {group}.size = {size}"),
                ));
            }
        }
    }
    let enabled = t
        .get("interpreter_state.gil_runtime_state_enabled")
        .unwrap_or(0);
    if enabled >= 256 {
        return Err(invalid(
            "_Py_DebugOffsets",
            format!("gil_runtime_state_enabled = {enabled} is not a small offset"),
        ));
    }
    Ok(())
}

/// Parses the field list of `_Py_DebugOffsets` (after the 24-byte header) from `bytes`.
pub(crate) fn read_debug_offsets(
    bytes: &[u8],
    fields: &'static [&'static str],
) -> Result<Vec<(&'static str, u64)>, PyError> {
    let need = DEBUG_OFFSETS_HEADER + fields.len() * 8;
    if bytes.len() < need {
        return Err(invalid(
            "_Py_DebugOffsets",
            format!("{} bytes, need {need}", bytes.len()),
        ));
    }
    Ok(fields
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let at = DEBUG_OFFSETS_HEADER + i * 8;
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            (*name, u64::from_le_bytes(w))
        })
        .collect())
}

/// Number of bytes of `_Py_DebugOffsets` for a version (0 for 3.12: no debug offsets).
pub(crate) fn debug_offsets_len(facts: &VersionFacts) -> usize {
    match facts.source {
        FieldSource::DebugOffsets(f) => DEBUG_OFFSETS_HEADER + f.len() * 8,
        FieldSource::BuiltIn(_) => 0,
    }
}

/// The GIL: `_PyRuntime.ceval.gil` (built-in tables up to 3.11: `runtime_state.gil` and the
/// struct-relative `gil.*`), or per interpreter (3.12+: `interp->ceval.gil`, the embedded
/// `_gil`, and the interpreter-relative `gil_runtime_state_locked`/`_holder` of the debug
/// offsets, made relative to the struct here).
fn gil_layout(t: &Table<'_>, ft: bool) -> Result<GilLayout, PyError> {
    if let Some(offset) = t.get("runtime_state.gil") {
        return Ok(GilLayout {
            at: GilAt::Runtime { offset },
            locked: t.need("gil.locked")?,
            last_holder: t.need("gil.last_holder")?,
            enabled: None,
        });
    }
    let embedded = t.need("interpreter_state.gil_runtime_state")?;
    let in_gil = |name: &'static str| {
        let v = t.need(name)?;
        v.checked_sub(embedded).filter(|d| *d < 256).ok_or_else(|| {
            invalid(
                name,
                format!("{v} is not inside the GIL struct at {embedded}"),
            )
        })
    };
    Ok(GilLayout {
        at: GilAt::Interpreter {
            ceval_gil: t.need("interpreter_state.ceval_gil")?,
            embedded,
        },
        locked: in_gil("interpreter_state.gil_runtime_state_locked")?,
        last_holder: in_gil("interpreter_state.gil_runtime_state_holder")?,
        enabled: if ft {
            t.get("interpreter_state.gil_runtime_state_enabled")
        } else {
            None
        },
    })
}

impl RuntimeLayout {
    /// The layout family, as the kernel walk sees it (for the `PYEBPF_STATS` report): how a
    /// thread state leads to its frames and what a frame is.
    pub fn family(&self) -> &'static str {
        match (self.frame.instr, self.tstate.cframe_current_frame) {
            (InstrKind::Lasti { .. }, _) => "PyFrameObject chain, pthread_t match",
            (_, Some(_)) if self.frame.is_entry.is_some() => "cframe, is_entry",
            (_, Some(_)) => "cframe, entry frames",
            _ => "current_frame, entry frames",
        }
    }

    /// Builds the layout of `version` from the bytes of its `_Py_DebugOffsets` (ignored for
    /// 3.12). Checks the cookie, that the header agrees with `version`, and every bound.
    pub fn build(version: PyVersion, debug_offsets: &[u8]) -> Result<RuntimeLayout, PyError> {
        let facts = version_facts(version.major, version.minor, version.free_threaded)?;
        let table: Vec<(&'static str, u64)> = match facts.source {
            FieldSource::BuiltIn(t) => t.to_vec(),
            FieldSource::DebugOffsets(fields) => {
                let hdr = debug_offsets
                    .get(..DEBUG_OFFSETS_HEADER)
                    .unwrap_or_default();
                if hdr.len() < DEBUG_OFFSETS_HEADER || &hdr[..8] != DEBUG_COOKIE {
                    return Err(invalid(
                        "_Py_DebugOffsets",
                        "the cookie is not \"xdebugpy\"".into(),
                    ));
                }
                let hex = u64::from_le_bytes(hdr[8..16].try_into().unwrap_or_default());
                let ft = u64::from_le_bytes(hdr[16..24].try_into().unwrap_or_default());
                let v = PyVersion::from_hex(hex, ft == 1);
                if (v.major, v.minor, v.free_threaded)
                    != (version.major, version.minor, version.free_threaded)
                    || ft > 1
                {
                    return Err(invalid(
                        "_Py_DebugOffsets",
                        format!(
                            "header says {} (free_threaded={ft}), expected {}",
                            v.short(),
                            version.short()
                        ),
                    ));
                }
                read_debug_offsets(debug_offsets, fields)?
            }
        };
        validate(&table)?;
        Self::from_table(version, &facts, table)
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one flat, field-by-field mapping of the table"
    )]
    fn from_table(
        version: PyVersion,
        facts: &VersionFacts,
        table: Vec<(&'static str, u64)>,
    ) -> Result<RuntimeLayout, PyError> {
        let t = Table { values: &table };
        let n = |name| t.need(name);
        let nonzero = |name| t.get(name).filter(|v| *v != 0);
        let header_size = n("pyobject.size")?;
        let status = t.get("thread_state.status");
        let holds_gil = match facts.holds_gil {
            HoldsGilFact::None => HoldsGil::Unknown,
            HoldsGilFact::StatusBit(bit) => HoldsGil::StatusBit {
                offset: n("thread_state.status")?,
                bit,
            },
            HoldsGilFact::Int(offset) => HoldsGil::Int { offset },
            HoldsGilFact::Table => HoldsGil::Int {
                offset: n("thread_state.holds_gil")?,
            },
        };
        let ft = version.free_threaded;
        let ascii_size = n("unicode_object.asciiobject_size")?;
        let argcount = n("code_object.argcount")?;
        let layout = RuntimeLayout {
            version,
            runtime: RuntimeOffsets {
                size: n("runtime_state.size")?,
                interpreters_head: n("runtime_state.interpreters_head")?,
                main_thread: t.get("runtime_state.main_thread"),
            },
            interp: InterpOffsets {
                size: n("interpreter_state.size")?,
                id: n("interpreter_state.id")?,
                next: n("interpreter_state.next")?,
                threads_head: n("interpreter_state.threads_head")?,
                imports_modules: n("interpreter_state.imports_modules")?,
                code_object_generation: nonzero("interpreter_state.code_object_generation"),
                tlbc_generation: if ft {
                    nonzero("interpreter_state.tlbc_generation")
                } else {
                    None
                },
            },
            gil: gil_layout(&t, ft)?,
            tstate: ThreadOffsets {
                size: n("thread_state.size")?,
                next: n("thread_state.next")?,
                interp: n("thread_state.interp")?,
                current_frame: n("thread_state.current_frame")?,
                cframe_current_frame: facts.cframe_current_frame,
                thread_id: n("thread_state.thread_id")?,
                native_thread_id: t.get("thread_state.native_thread_id"),
                status,
                holds_gil,
                state: facts.state,
                base_frame: nonzero("thread_state.base_frame"),
            },
            frame: FrameOffsets {
                size: n("interpreter_frame.size")?,
                previous: n("interpreter_frame.previous")?,
                executable: n("interpreter_frame.executable")?,
                instr_ptr: n("interpreter_frame.instr_ptr")?,
                instr: facts.instr,
                owner: t.get("interpreter_frame.owner"),
                is_entry: t.get("interpreter_frame.is_entry"),
                localsplus: n("interpreter_frame.localsplus")?,
                tlbc_index: if ft {
                    nonzero("interpreter_frame.tlbc_index")
                } else {
                    None
                },
                stackref_tag_mask: facts.stackref_tag_mask,
                entry: facts.entry,
                owner_max: facts.owner_max,
                globals: facts.frame_namespaces.0,
                locals: facts.frame_namespaces.1,
                is_object: facts.frame_is_object,
            },
            code: CodeOffsets {
                size: n("code_object.size")?,
                filename: n("code_object.filename")?,
                name: n("code_object.name")?,
                qualname: t.get("code_object.qualname"),
                linetable: n("code_object.linetable")?,
                linetable_kind: facts.linetable,
                firstlineno: n("code_object.firstlineno")?,
                code_adaptive: t.get("code_object.co_code_adaptive"),
                co_code: t.get("code_object.co_code"),
                tlbc: if ft {
                    nonzero("code_object.co_tlbc")
                } else {
                    None
                },
                tlbc_entries: facts.tlbc_entries,
                // `PyVarObject.ob_size` is generic: the tuple's is the code object's.
                ob_size: n("tuple_object.ob_size")?,
                localsplusnames: t.get("code_object.localsplusnames"),
                localspluskinds: t.get("code_object.localspluskinds"),
                varnames: t.get("code_object.varnames"),
                cellvars: t.get("code_object.cellvars"),
                freevars: t.get("code_object.freevars"),
                argcount,
                kwonlyargcount: argcount.wrapping_add_signed(facts.code_counts.kwonlyargcount),
                flags: argcount.wrapping_add_signed(facts.code_counts.flags),
            },
            object: ObjectOffsets {
                header_size,
                ob_type: n("pyobject.ob_type")?,
            },
            unicode: UnicodeLayout {
                length: n("unicode_object.length")?,
                state: n("unicode_object.state")?,
                ascii_size,
                // `sizeof(PyCompactUnicodeObject)` = ASCII object + utf8_length + utf8.
                compact_size: t
                    .get("unicode_object.compactunicodeobject_size")
                    .unwrap_or(ascii_size + 16),
                kind_shift: facts.unicode_bits.0,
                compact_bit: facts.unicode_bits.1,
                ascii_bit: facts.unicode_bits.2,
            },
            bytes: BytesOffsets {
                ob_size: n("bytes_object.ob_size")?,
                ob_sval: n("bytes_object.ob_sval")?,
            },
            dict: DictLayout {
                ma_keys: n("dict_object.ma_keys")?,
                ma_values: n("dict_object.ma_values")?,
                keys: facts.dict_keys,
                values_array: facts.values_array,
                managed_dict: facts.managed_dict,
                inline_values: facts.inline_values,
                // `PyModuleObject.md_dict` directly follows the object header.
                module_dict: header_size,
            },
            types: TypeOffsets {
                tp_name: n("type_object.tp_name")?,
                tp_flags: n("type_object.tp_flags")?,
                // Not in the debug offsets before 3.15 (§7): `tp_basicsize` directly follows
                // `tp_name`; `tp_dictoffset` is @288 (@304 free-threaded);
                // `PyHeapTypeObject.ht_cached_keys` is @880 (@896 free-threaded).
                tp_basicsize: t
                    .get("type_object.tp_basicsize")
                    .unwrap_or(n("type_object.tp_name")? + 8),
                tp_dictoffset: t.get("type_object.tp_dictoffset").unwrap_or(if ft {
                    304
                } else {
                    288
                }),
                ht_cached_keys: t.get("heap_type_object.ht_cached_keys").unwrap_or(if ft {
                    896
                } else {
                    880
                }),
            },
            long: LongOffsets {
                lv_tag: match facts.long_form {
                    LongForm::Tag => n("long_object.lv_tag")?,
                    LongForm::SignedSize => n("long_object.ob_size")?,
                },
                ob_digit: n("long_object.ob_digit")?,
                form: facts.long_form,
            },
            checks: BinaryChecks {
                code_basicsize: t.get("code_object.basicsize"),
                frame_basicsize: t.get("frame_object.basicsize"),
            },
            values: ValueOffsets {
                tuple_item: n("tuple_object.ob_item")?,
                var_size: n("tuple_object.ob_size")?,
                list_item: n("list_object.ob_item")?,
                float_value: n("float_object.ob_fval")?,
                // `PySetObject { PyObject_HEAD; fill; used; mask; table; ... }` (3.14+ in
                // the debug offsets; the same layout before).
                set_used: nonzero("set_object.used").unwrap_or(header_size + 8),
                set_mask: nonzero("set_object.mask").unwrap_or(header_size + 16),
                set_table: nonzero("set_object.table").unwrap_or(header_size + 24),
                // `PyCellObject { PyObject_HEAD; PyObject *ob_ref; }`.
                cell_ref: header_size,
            },
            unicode_version: facts.unicode_version,
            table,
        };
        if layout.code.code_adaptive.is_none() == layout.code.co_code.is_none() {
            return Err(invalid(
                "code_object",
                "needs exactly one of co_code_adaptive and co_code".into(),
            ));
        }
        layout.check_widths()?;
        Ok(layout)
    }

    /// Multi-byte fields the walker reads out of one buffer must fit inside it.
    fn check_widths(&self) -> Result<(), PyError> {
        let fits = |what: &'static str, off: u64, width: u64, size: u64| {
            if off.checked_add(width).is_some_and(|e| e <= size) {
                Ok(())
            } else {
                Err(invalid(
                    what,
                    format!("offset {off} + {width} exceeds {size}"),
                ))
            }
        };
        let f = &self.frame;
        for (what, off) in [
            ("frame.previous", f.previous),
            ("frame.executable", f.executable),
            ("frame.instr_ptr", f.instr_ptr),
        ] {
            fits(what, off, 8, f.size)?;
        }
        for (what, off) in [("frame.owner", f.owner), ("frame.is_entry", f.is_entry)] {
            if let Some(off) = off {
                fits(what, off, 1, f.size)?;
            }
        }
        let s = &self.tstate;
        for (what, off) in [
            ("tstate.next", s.next),
            ("tstate.current_frame", s.current_frame),
            ("tstate.thread_id", s.thread_id),
        ] {
            fits(what, off, 8, s.size)?;
        }
        if let Some(off) = s.native_thread_id {
            fits("tstate.native_thread_id", off, 8, s.size)?;
        }
        if let Some(off) = s.status {
            fits("tstate.status", off, 4, s.size)?;
        }
        if let Some(state) = s.state {
            fits("tstate.state", state, 4, s.size)?;
        }
        if let HoldsGil::Int { offset } | HoldsGil::StatusBit { offset, .. } = s.holds_gil {
            fits("tstate.holds_gil", offset, 4, s.size)?;
        }
        let c = &self.code;
        for (what, off) in [
            ("code.filename", c.filename),
            ("code.name", c.name),
            ("code.qualname", c.qualname.unwrap_or(c.name)),
            ("code.linetable", c.linetable),
            ("code.ob_size", c.ob_size),
            ("code.co_code", c.co_code.unwrap_or(c.filename)),
        ] {
            fits(what, off, 8, c.header_bytes())?;
        }
        fits("code.firstlineno", c.firstlineno, 4, c.header_bytes())?;
        if let Some(off) = c.code_adaptive {
            fits("code.co_code_adaptive", off, 2, c.size)?;
        }
        let u = &self.unicode;
        fits("unicode.length", u.length, 8, u.ascii_size)?;
        fits("unicode.state", u.state, 4, u.ascii_size)?;
        fits("unicode.asciiobject_size", u.ascii_size, 0, 128)?;
        fits(
            "object.ob_type",
            self.object.ob_type,
            8,
            self.object.header_size,
        )
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
