//! The facts `_Py_DebugOffsets` does not carry, and the one `match` on the CPython version.
//!
//! Owns: [`version_facts`], keyed by (minor, free-threaded): where the field list of the
//! debug offsets comes from (or the built-in 3.12 table), frame and stackref semantics,
//! `holds_gil`/`state` locations, the Unicode `state` bit layout, managed-dict and
//! `PyDictValues` layouts, the `_PyCodeArray` entries offset.
//! Input: a version. Output: [`VersionFacts`], or `Unsupported` for an unknown minor version.
//! Constraints: this is the only place that matches on a version (style rule 5); everything
//! else reads the [`RuntimeLayout`](super::layout::RuntimeLayout) built from these facts.
//! Sources: cpython-layouts.md §2.4, §3.4, §5.2, §5.4, §5.5, §6, §7; CPython v3.14.0
//! `Include/cpython/unicodeobject.h` (free-threaded `unsigned char interned`, then the bit
//! fields), `Include/cpython/code.h` (`_PyCodeArray { Py_ssize_t size; char *entries[]; }`),
//! `Include/internal/pycore_stackref.h` (`Py_TAG_BITS` 3, `PyStackRef_NULL` bits 1).

use super::PyError;
use super::layout::{DictKeys, EntryRule, InstrKind, LineTableKind, ManagedDict};
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
    pub linetable: LineTableKind,
    pub dict_keys: DictKeys,
    /// `PyLongObject` has `lv_tag` (3.12+) rather than a signed `ob_size`.
    pub long_tagged: bool,
    pub stackref_tag_mask: u64,
    pub holds_gil: HoldsGilFact,
    pub state: Option<u64>,
    /// (kind shift, compact bit, ascii bit) of `PyASCIIObject.state`.
    pub unicode_bits: (u32, u32, u32),
    pub managed_dict: ManagedDict,
    pub values_array: u64,
    pub inline_values: bool,
    pub tlbc_entries: u64,
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

/// The one `match` on the CPython version (style rule 5). Sources: cpython-layouts.md §2.4
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
        linetable: LineTableKind::Locations,
        dict_keys: DictKeys::Log2,
        long_tagged: true,
        stackref_tag_mask: 0,
        holds_gil: HoldsGilFact::None,
        state: None,
        unicode_bits: UNICODE_BITS_DEFAULT,
        managed_dict: managed,
        values_array: 8,
        inline_values: true,
        tlbc_entries: 8,
    };
    // ≤ 3.10: `PyFrameObject` chains, `f_lasti`, sized dict keys, `tp_dictoffset` dicts.
    let frame_objects = VersionFacts {
        cframe_current_frame: None,
        instr: InstrKind::Lasti { unit_bytes: 1 },
        entry: EntryRule::EveryFrame,
        linetable: LineTableKind::Lnotab,
        dict_keys: DictKeys::Sized,
        long_tagged: false,
        managed_dict: ManagedDict::TypeDictOffset,
        values_array: 0,
        inline_values: false,
        ..base
    };
    Ok(match (minor, ft) {
        (8, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_38),
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
            long_tagged: false,
            managed_dict: ManagedDict::ValuesThenDict {
                values: -32,
                dict: -24,
            },
            values_array: 0,
            inline_values: false,
            ..base
        },
        (12, false) => VersionFacts {
            source: FieldSource::BuiltIn(BUILTIN_312),
            cframe_current_frame: Some(0),
            instr: InstrKind::PrevInstr,
            managed_dict: ManagedDict::Tagged { offset: -24 },
            values_array: 0,
            inline_values: false,
            ..base
        },
        (13, _) => VersionFacts {
            holds_gil: HoldsGilFact::StatusBit(5),
            state: Some(40),
            ..base
        },
        (14, _) => VersionFacts {
            source: FieldSource::DebugOffsets(FIELDS_314),
            stackref_tag_mask: 3,
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
