//! Tests of the layout descriptor: field lists, every supported layout, the documented
//! free-threaded facts, and refusals.
use super::*;
use crate::python::tables::{FIELDS_313, FIELDS_314, FIELDS_315};
use crate::python::testimage::debug_offsets_bytes;

fn v(minor: u8, ft: bool) -> PyVersion {
    PyVersion {
        major: 3,
        minor,
        micro: 0,
        level: 0xF,
        serial: 0,
        free_threaded: ft,
    }
}

#[test]
fn field_lists_have_the_documented_sizes() {
    assert_eq!(DEBUG_OFFSETS_HEADER + FIELDS_313.len() * 8, 584);
    assert_eq!(DEBUG_OFFSETS_HEADER + FIELDS_314.len() * 8, 760);
    assert_eq!(DEBUG_OFFSETS_HEADER + FIELDS_315.len() * 8, 888);
    // 3.15 inserted fields: `thread_id` moved from @208 (3.14) to @240 (§2).
    let at = |f: &[&str], n: &str| f.iter().position(|x| *x == n).map(|i| 24 + i * 8);
    assert_eq!(at(FIELDS_314, "thread_state.thread_id"), Some(216));
    assert_eq!(at(FIELDS_315, "thread_state.thread_id"), Some(240));
    assert_eq!(
        at(FIELDS_315, "unicode_object.compactunicodeobject_size"),
        Some(744)
    );
    assert_eq!(at(FIELDS_313, "gc.collecting"), Some(576));
}

#[test]
fn version_display_and_unsupported() {
    assert_eq!(
        PyVersion::from_hex(0x030f_00a3, false).to_string(),
        "3.15.0a3"
    );
    assert_eq!(PyVersion::from_hex(0x030d_0ff0, true).short(), "3.13t");
    let e = RuntimeLayout::build(v(16, false), &[]).unwrap_err();
    assert_eq!(e.to_string(), "unsupported CPython 3.16");
    let e = RuntimeLayout::build(v(7, false), &[]).unwrap_err();
    assert_eq!(e.to_string(), "unsupported CPython 3.7");
    assert!(RuntimeLayout::build(v(11, true), &[]).is_err(), "no 3.11t");
    for minor in 8..=12 {
        assert!(
            RuntimeLayout::build(v(minor, false), &[]).is_ok(),
            "3.{minor}"
        );
    }
}

#[test]
fn builds_every_supported_layout() {
    for (minor, ft) in [
        (13, false),
        (13, true),
        (14, false),
        (14, true),
        (15, false),
    ] {
        let bytes = debug_offsets_bytes(minor, ft);
        let l = RuntimeLayout::build(v(minor, ft), &bytes).unwrap();
        assert_eq!(l.object.header_size, if ft { 32 } else { 16 });
        assert_eq!(l.frame.tlbc_index.is_some(), ft && minor >= 14);
    }
    let l = RuntimeLayout::build(v(12, false), &[]).unwrap();
    assert_eq!(l.tstate.cframe_current_frame, Some(0));
    assert_eq!(l.runtime.interpreters_head, 40);
}

/// The 3.14t facts the layout combines (debug-offset values from the v3.14.0 headers plus
/// the built-in facts), asserted independently of the image builder.
#[test]
fn documented_314t_facts() {
    let l = RuntimeLayout::build(v(14, true), &debug_offsets_bytes(14, true)).unwrap();
    assert_eq!((l.object.header_size, l.object.ob_type), (32, 24));
    assert_eq!(
        (l.frame.owner, l.frame.tlbc_index, l.frame.stackref_tag_mask),
        (Some(78), Some(72), 3)
    );
    assert_eq!(
        (l.code.tlbc, l.code.tlbc_entries, l.code.code_adaptive),
        (Some(224), 8, Some(232))
    );
    assert_eq!(
        (
            l.unicode.state,
            l.unicode.kind_shift,
            l.unicode.compact_bit,
            l.unicode.ascii_bit
        ),
        (48, 8, 11, 12)
    );
    assert_eq!((l.unicode.ascii_size, l.unicode.compact_size), (56, 72));
    assert_eq!(l.dict.managed_dict, ManagedDict::Pointer { offset: -8 });
    assert_eq!((l.types.ht_cached_keys, l.types.tp_basicsize), (896, 48));
    assert_eq!(
        (l.tstate.holds_gil, l.tstate.state),
        (HoldsGil::Int { offset: 36 }, Some(44))
    );
    assert_eq!(l.gil.enabled, Some(0));
    let d = RuntimeLayout::build(v(14, false), &debug_offsets_bytes(14, false)).unwrap();
    assert_eq!(
        (
            d.frame.owner,
            d.frame.tlbc_index,
            d.code.tlbc,
            d.gil.enabled
        ),
        (Some(74), None, None, None)
    );
}

#[test]
fn rejects_bad_cookie_mismatch_and_out_of_bounds() {
    let mut bytes = debug_offsets_bytes(14, false);
    assert!(
        RuntimeLayout::build(v(14, true), &bytes).is_err(),
        "free_threaded mismatch"
    );
    assert!(
        RuntimeLayout::build(v(13, false), &bytes).is_err(),
        "minor mismatch"
    );
    bytes[0] = b'X';
    assert!(
        RuntimeLayout::build(v(14, false), &bytes).is_err(),
        "cookie"
    );
    let mut bytes = debug_offsets_bytes(14, false);
    let owner = 24
        + FIELDS_314
            .iter()
            .position(|f| *f == "interpreter_frame.owner")
            .unwrap()
            * 8;
    bytes[owner..owner + 8].copy_from_slice(&88u64.to_le_bytes());
    let e = RuntimeLayout::build(v(14, false), &bytes)
        .unwrap_err()
        .to_string();
    assert!(e.contains("interpreter_frame.owner"), "{e}");
    assert!(
        RuntimeLayout::build(v(14, false), &bytes[..700]).is_err(),
        "short"
    );
}
