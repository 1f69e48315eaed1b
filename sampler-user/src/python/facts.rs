//! The facts `_Py_DebugOffsets` does not carry, and the one `match` on the CPython version.
//!
//! Owns: [`version_facts`], keyed by (minor, free-threaded): where the field list of the
//! debug offsets comes from (or the built-in 3.8–3.12 tables), frame kinds (≤ 3.10
//! `PyFrameObject` with `f_lasti`, `_PyInterpreterFrame` with `prev_instr`/`instr_ptr`), which
//! frames end an eval-loop activation, the line-table format, stackref semantics,
//! `holds_gil`/`state` locations, the Unicode `state` bit layout, managed-dict and
//! `PyDictValues` layouts, the `_PyCodeArray` entries offset.
//! Input: a version. Output: [`VersionFacts`], or `Unsupported` for an unknown minor version.
//! Constraints: this is the only place that matches on a version (style rule 5); everything
//! else reads the [`RuntimeLayout`](super::layout::RuntimeLayout) built from these facts.
//! Sources: docs/cpython-layouts.md §2, §3.4, §5.2, §5.4, §5.5, §6, §7; CPython v3.14.0
//! `Include/cpython/unicodeobject.h` (free-threaded `unsigned char interned`, then the bit
//! fields), `Include/cpython/code.h` (`_PyCodeArray { Py_ssize_t size; char *entries[]; }`),
//! `Include/internal/pycore_stackref.h` (`Py_TAG_BITS` 3, `PyStackRef_NULL` bits 1).

use super::PyError;
use super::tables::{
    BUILTIN_38, BUILTIN_39, BUILTIN_310, BUILTIN_311, BUILTIN_312, FIELDS_313, FIELDS_314,
    FIELDS_315,
};

/// The facts `_Py_DebugOffsets` does not carry, per (minor, free-threaded).
#[derive(Debug, Clone, Copy)]
pub(crate) struct VersionFacts {
    pub source: FieldSource,
    pub cframe_current_frame: Option<u64>,
    pub instr: InstrKind,
    pub entry: EntryRule,
    /// The largest valid `_PyInterpreterFrame.owner` (`enum _frameowner`; None: ≤ 3.10, no
    /// owner).
    pub owner_max: Option<u8>,
    /// `f_globals` and `f_locals` of a frame (not in the debug offsets).
    pub frame_namespaces: (u64, u64),
    /// ≤ 3.10: frames are `PyFrameObject`s (with an `ob_type` to check against `PyFrame_Type`).
    pub frame_is_object: bool,
    pub linetable: LineTableKind,
    pub dict_keys: DictKeys,
    pub stackref_tag_mask: u64,
    pub holds_gil: HoldsGilFact,
    pub state: Option<u64>,
    /// (kind shift, compact bit, ascii bit) of `PyASCIIObject.state`.
    pub unicode_bits: (u32, u32, u32),
    pub managed_dict: ManagedDict,
    pub values_array: u64,
    pub inline_values: bool,
    pub tlbc_entries: u64,
    pub long_form: LongForm,
    /// `co_kwonlyargcount` and `co_flags`, relative to `co_argcount`.
    pub code_counts: CodeCounts,
    /// `unicodedata.unidata_version`.
    pub unicode_version: &'static str,
}

/// Offsets of `co_kwonlyargcount` and `co_flags` relative to `co_argcount` (the debug offsets
/// carry only `argcount`). 3.12–3.15 `Include/cpython/code.h`: `int co_flags; int co_argcount;
/// int co_posonlyargcount; int co_kwonlyargcount;`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CodeCounts {
    pub kwonlyargcount: i64,
    pub flags: i64,
}

/// Where an `int` keeps its sign and number of 30-bit digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongForm {
    /// 3.12+: `uintptr_t lv_tag` = digits << 3 | sign (0 positive, 1 zero, 2 negative).
    Tag,
    /// Up to 3.11: `ob_size` (at `lv_tag`'s place) is the digit count, negative for a
    /// negative number, 0 for zero.
    SignedSize,
}

/// Where an instance's attribute dictionary is (for `Thread._name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedDict {
    /// ≤ 3.10: a dict pointer at `obj + type->tp_dictoffset` (a positive offset for the
    /// classes `threading` defines).
    TypeDictOffset,
    /// 3.11: `PyDictValues *` at `obj + values` (split keys from `ht_cached_keys`) if not
    /// NULL, else a dict pointer at `obj + dict` (`_PyObject_ValuesPointer`,
    /// `_PyObject_ManagedDictPointer`).
    ValuesThenDict { values: i64, dict: i64 },
    /// 3.12 `_PyDictOrValues` at `obj + offset`: a dict pointer, or (bit 0 set) `values - 1`.
    Tagged { offset: i64 },
    /// 3.13+: a dict pointer (or NULL: inline values) at `obj + offset` (`MANAGED_DICT_OFFSET`).
    Pointer { offset: i64 },
}

/// The header of `PyDictKeysObject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DictKeys {
    /// ≤ 3.10: `dk_size` @8, `dk_nentries` @32, indices @40 (1/2/4/8 bytes each by
    /// `dk_size`), entries always `{hash, key, value}`.
    Sized,
    /// 3.11+: `dk_log2_index_bytes` @9, `dk_kind` @10, `dk_nentries` @24, indices @32;
    /// unicode-keyed kinds have `{key, value}` entries.
    Log2,
}

/// How a frame records where it is in its bytecode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstrKind {
    /// ≤ 3.10 `int f_lasti` (the low half of the word at `instr_ptr`): the last instruction
    /// started, in bytes (3.8, 3.9: `unit_bytes` 1) or in code units (3.10: 2); -1 before the
    /// first one.
    Lasti { unit_bytes: u8 },
    /// 3.11, 3.12 `prev_instr`: the last executed code unit (may be `code - 2`).
    PrevInstr,
    /// 3.13+ `instr_ptr`: the instruction executing or about to begin.
    InstrPtr,
}

/// Which frames end one activation of the eval loop (for the `--native` merge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryRule {
    /// ≤ 3.10: every `PyFrameObject` is evaluated by a call of its own.
    EveryFrame,
    /// 3.11: the outermost frame of an activation has `is_entry` set.
    EntryFlag,
    /// 3.12+: an activation's frames sit above an entry frame with `owner >= n` (which is no
    /// Python code).
    OwnerAtLeast(u8),
}

/// The format of `co_linetable` / `co_lnotab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTableKind {
    /// 3.8, 3.9 `co_lnotab`: (byte increment, signed line increment) pairs.
    Lnotab,
    /// 3.10 PEP 626 `co_linetable`: (byte delta, signed line delta, -128: no line) pairs.
    Pep626,
    /// 3.11+ location table (`Objects/locations.md`).
    Locations,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum FieldSource {
    /// Field names of `_Py_DebugOffsets` after the header, in struct order.
    DebugOffsets(&'static [&'static str]),
    /// A built-in table (3.8–3.12 have no debug offsets).
    BuiltIn(&'static [(&'static str, u64)]),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum HoldsGilFact {
    None,
    StatusBit(u32),
    Int(u64),
    /// `thread_state.holds_gil` is in the debug offsets (3.15).
    Table,
}

/// Free-threaded builds: `interned` takes a whole byte, so `kind`/`compact`/`ascii` move to
/// bits 8-10 / 11 / 12 in 3.14t ([unverified], §5.2); 3.13t keeps the default bits.
const UNICODE_BITS_DEFAULT: (u32, u32, u32) = (2, 5, 6);
const UNICODE_BITS_FT314: (u32, u32, u32) = (8, 11, 12);
/// `unicodedata.unidata_version` of 3.15 (as the interpreter reports it).
const UNICODE_315: &str = "17.0.0";

/// The one `match` on the CPython version (style rule 5). Sources: docs/cpython-layouts.md §2
/// (`holds_gil`, `state`), §3.4 (owners), §5.2 (unicode bits), §5.4 (stackrefs), §5.5 (TLBC),
/// §7 (`MANAGED_DICT_OFFSET`, `PyDictValues`).
#[allow(
    clippy::too_many_lines,
    reason = "the one version match: a flat list of facts per minor version"
)]
pub(crate) fn version_facts(major: u8, minor: u8, ft: bool) -> Result<VersionFacts, PyError> {
    let unsupported = || PyError::Unsupported {
        version: format!("{major}.{minor}{}", if ft { "t" } else { "" }),
    };
    if major != 3 {
        return Err(unsupported());
    }
    let managed = ManagedDict::Pointer {
        offset: if ft { -8 } else { -24 },
    };
    let base = VersionFacts {
        source: FieldSource::DebugOffsets(FIELDS_313),
        cframe_current_frame: None,
        instr: InstrKind::InstrPtr,
        entry: EntryRule::OwnerAtLeast(3),
        owner_max: Some(3),
        // `f_executable`, `previous`, `f_funcobj`, then `f_globals` @24, `f_builtins`,
        // `f_locals` @40 (3.12–3.15 `_PyInterpreterFrame`).
        frame_namespaces: (24, 40),
        frame_is_object: false,
        linetable: LineTableKind::Locations,
        dict_keys: DictKeys::Log2,
        stackref_tag_mask: 0,
        holds_gil: HoldsGilFact::None,
        state: None,
        unicode_bits: UNICODE_BITS_DEFAULT,
        managed_dict: managed,
        values_array: 8,
        inline_values: true,
        tlbc_entries: 8,
        long_form: LongForm::Tag,
        code_counts: CodeCounts {
            kwonlyargcount: 8,
            flags: -4,
        },
        unicode_version: "15.1.0",
    };
    // ≤ 3.10: `PyFrameObject` chains, `f_lasti`, sized dict keys, `tp_dictoffset` dicts.
    let frame_objects = VersionFacts {
        cframe_current_frame: None,
        instr: InstrKind::Lasti { unit_bytes: 1 },
        entry: EntryRule::EveryFrame,
        owner_max: None,
        // `PyFrameObject`: `PyObject_VAR_HEAD`, `f_back`, `f_code`, `f_builtins`, then
        // `f_globals` @48, `f_locals` @56.
        frame_namespaces: (48, 56),
        frame_is_object: true,
        linetable: LineTableKind::Lnotab,
        dict_keys: DictKeys::Sized,
        long_form: LongForm::SignedSize,
        managed_dict: ManagedDict::TypeDictOffset,
        values_array: 0,
        inline_values: false,
        // `int co_argcount` @16, `co_kwonlyargcount` @24, `co_flags` @36.
        code_counts: CodeCounts {
            kwonlyargcount: 8,
            flags: 20,
        },
        unicode_version: "13.0.0",
        ..base
    };
    Ok(match (minor, ft) {
        (8, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_38),
            unicode_version: "12.1.0",
            ..frame_objects
        },
        (9, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_39),
            ..frame_objects
        },
        (10, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_310),
            instr: InstrKind::Lasti { unit_bytes: 2 },
            linetable: LineTableKind::Pep626,
            ..frame_objects
        },
        (11, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_311),
            cframe_current_frame: Some(8),
            instr: InstrKind::PrevInstr,
            entry: EntryRule::EntryFlag,
            owner_max: Some(2),
            // 3.11 `_PyInterpreterFrame`: `f_func`, `f_globals` @8, `f_builtins`, `f_locals` @24.
            frame_namespaces: (8, 24),
            long_form: LongForm::SignedSize,
            managed_dict: ManagedDict::ValuesThenDict {
                values: -32,
                dict: -24,
            },
            values_array: 0,
            inline_values: false,
            // `int co_flags` @48, `co_argcount` @56, `co_kwonlyargcount` @64.
            code_counts: CodeCounts {
                kwonlyargcount: 8,
                flags: -8,
            },
            unicode_version: "14.0.0",
            ..base
        },
        (12, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_312),
            cframe_current_frame: Some(0),
            instr: InstrKind::PrevInstr,
            managed_dict: ManagedDict::Tagged { offset: -24 },
            values_array: 0,
            inline_values: false,
            unicode_version: "15.0.0",
            ..base
        },
        (13, _) => VersionFacts {
            holds_gil: HoldsGilFact::StatusBit(5),
            state: Some(40),
            ..base
        },
        (14, _) => VersionFacts {
            source: FieldSource::DebugOffsets(FIELDS_314),
            unicode_version: "16.0.0",
            stackref_tag_mask: 3,
            // `FRAME_OWNED_BY_INTERPRETER` 3 and `FRAME_OWNED_BY_CSTACK` 4 (§3.4).
            owner_max: Some(4),
            holds_gil: HoldsGilFact::Int(36),
            state: Some(44),
            unicode_bits: if ft {
                UNICODE_BITS_FT314
            } else {
                UNICODE_BITS_DEFAULT
            },
            ..base
        },
        // 3.15t was not examined; it inherits the 3.14t facts (unverified, like 3.14t).
        (15, _) => VersionFacts {
            source: FieldSource::DebugOffsets(FIELDS_315),
            unicode_version: UNICODE_315,
            stackref_tag_mask: 3,
            holds_gil: HoldsGilFact::Table,
            state: Some(48),
            unicode_bits: if ft {
                UNICODE_BITS_FT314
            } else {
                UNICODE_BITS_DEFAULT
            },
            ..base
        },
        _ => return Err(unsupported()),
    })
}
