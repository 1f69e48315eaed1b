//! `str` and `bytes` objects of the target.
//!
//! Owns: decoding `PyUnicodeObject` (kinds 1/2/4; compact ASCII, compact non-ASCII and legacy
//! non-compact strings; the free-threaded state layout) into a `String` or into code points
//! (surrogates kept, for `repr`), and reading `PyBytesObject` payloads (whole or a prefix).
//! Input: an object address and the [`RuntimeLayout`] (with a [`Ctx`], the object's type is
//! checked first: [`read_str_typed`], [`read_bytes_typed`]). Output: a Rust `String` /
//! `Vec<u8>`.
//! Constraints: lengths come from the target: a string longer than `max_chars` is cut (with a
//! "…" marker), a negative or absurd length or an unknown kind is an error; reads are bounded
//! by `max_chars * kind`. Layout: CPython `Include/cpython/unicodeobject.h`
//! (<https://github.com/python/cpython/blob/v3.13.0/Include/cpython/unicodeobject.h>), §5.2.

use super::code::Ctx;
use super::layout::RuntimeLayout;
use super::memory::{MemError, ReadMemory, field_u32, field_u64};
use super::objects::Known;

/// Why a string could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StrError {
    #[error(transparent)]
    Memory(#[from] MemError),
    #[error("bad str object at {addr:#x}: {why}")]
    Invalid { addr: u64, why: &'static str },
    /// The object is not of the expected type (`ob_type` is another type object).
    #[error("object at {addr:#x} is not a {want}")]
    WrongType { addr: u64, want: &'static str },
}

/// Checks that the object at `addr` is exactly of the type `want` (by the address of its type
/// object, when the target exports it; otherwise only the reads' own checks apply).
pub fn check_type(ctx: Ctx<'_>, addr: u64, want: Known) -> Result<(), StrError> {
    let Some(ty) = ctx.target.known.get(want) else {
        return Ok(());
    };
    if addr == 0 {
        return Err(StrError::Invalid { addr, why: "NULL" });
    }
    if ctx
        .mem
        .read_u64(addr.wrapping_add(ctx.layout.object.ob_type))?
        == ty
    {
        Ok(())
    } else {
        let want = match want {
            Known::Str => "str",
            Known::Bytes => "bytes",
            Known::Int => "int",
            _ => "known object",
        };
        Err(StrError::WrongType { addr, want })
    }
}

/// [`read_str`] of an object whose type is checked first (a `str`, not whatever a torn or
/// corrupted pointer leads to).
pub fn read_str_typed(ctx: Ctx<'_>, addr: u64, max_chars: usize) -> Result<String, StrError> {
    check_type(ctx, addr, Known::Str)?;
    read_str(ctx.mem, ctx.layout, addr, max_chars)
}

/// [`read_bytes`] of an object whose type is checked first.
pub fn read_bytes_typed(ctx: Ctx<'_>, addr: u64, max_len: usize) -> Result<Vec<u8>, StrError> {
    check_type(ctx, addr, Known::Bytes)?;
    read_bytes(ctx.mem, ctx.layout, addr, max_len)
}

/// Absurd lengths (a torn or garbage object) are rejected rather than truncated.
const MAX_PLAUSIBLE_LEN: u64 = 1 << 30;

/// The decoded `state` bits of a `PyASCIIObject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrState {
    pub kind: u32,
    pub compact: bool,
    pub ascii: bool,
}

impl StrState {
    pub fn decode(state: u32, layout: &RuntimeLayout) -> StrState {
        let u = &layout.unicode;
        StrState {
            kind: (state >> u.kind_shift) & 7,
            compact: (state >> u.compact_bit) & 1 == 1,
            ascii: (state >> u.ascii_bit) & 1 == 1,
        }
    }

    /// The state word for these bits (`interned` = 0, not statically allocated).
    pub fn encode(self, layout: &RuntimeLayout) -> u32 {
        let u = &layout.unicode;
        (self.kind << u.kind_shift)
            | (u32::from(self.compact) << u.compact_bit)
            | (u32::from(self.ascii) << u.ascii_bit)
    }
}

/// Reads the `str` at `addr`, cut to `max_chars` code points.
pub fn read_str(
    mem: &dyn ReadMemory,
    layout: &RuntimeLayout,
    addr: u64,
    max_chars: usize,
) -> Result<String, StrError> {
    let (cps, length) = read_code_points(mem, layout, addr, max_chars)?;
    let mut s: String = cps
        .iter()
        .map(|&c| char::from_u32(c).unwrap_or('\u{fffd}'))
        .collect();
    if (cps.len() as u64) < length {
        s.push('…');
    }
    Ok(s)
}

/// The first `max_chars` code points of the `str` at `addr` (lone surrogates included, as
/// they are stored), and the string's whole length.
pub fn read_code_points(
    mem: &dyn ReadMemory,
    layout: &RuntimeLayout,
    addr: u64,
    max_chars: usize,
) -> Result<(Vec<u32>, u64), StrError> {
    let u = &layout.unicode;
    let bad = |why| StrError::Invalid { addr, why };
    if addr == 0 {
        return Err(bad("NULL"));
    }
    // Every str object is at least `sizeof(PyASCIIObject)` long: one read covers length and
    // state without touching memory past a short object.
    let mut head = [0u8; 128];
    let head = head
        .get_mut(..u.ascii_size as usize)
        .ok_or(bad("header too large"))?;
    mem.read(addr, head)?;
    let length = field_u64(head, u.length).ok_or(bad("length"))?;
    if length > MAX_PLAUSIBLE_LEN {
        return Err(bad("implausible length"));
    }
    let st = StrState::decode(field_u32(head, u.state).ok_or(bad("state"))?, layout);
    if !matches!(st.kind, 1 | 2 | 4) || (st.ascii && st.kind != 1) {
        return Err(bad("unknown kind"));
    }
    let data = match (st.compact, st.ascii) {
        (true, true) => addr.wrapping_add(u.ascii_size),
        (true, false) => addr.wrapping_add(u.compact_size),
        // Legacy string: `PyUnicodeObject.data.any` follows the compact header.
        (false, _) => Some(mem.read_u64(addr.wrapping_add(u.compact_size))?)
            .filter(|p| *p != 0)
            .ok_or(bad("NULL data"))?,
    };
    let n = (length as usize).min(max_chars);
    let bytes = mem.read_vec(data, n * st.kind as usize)?;
    let cps = match st.kind {
        1 => bytes.iter().map(|&b| u32::from(b)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    Ok((cps, length))
}

/// Reads the payload of the `bytes` object at `addr`; longer than `max_len` is an error.
pub fn read_bytes(
    mem: &dyn ReadMemory,
    layout: &RuntimeLayout,
    addr: u64,
    max_len: usize,
) -> Result<Vec<u8>, StrError> {
    let b = &layout.bytes;
    if addr == 0 {
        return Err(StrError::Invalid { addr, why: "NULL" });
    }
    let len = mem.read_u64(addr.wrapping_add(b.ob_size))?;
    if len > max_len as u64 {
        return Err(StrError::Invalid {
            addr,
            why: "bytes longer than the cap",
        });
    }
    Ok(mem.read_vec(addr.wrapping_add(b.ob_sval), len as usize)?)
}

/// The first `max_len` bytes of the `bytes` object at `addr`, and its whole length.
pub fn read_bytes_prefix(
    mem: &dyn ReadMemory,
    layout: &RuntimeLayout,
    addr: u64,
    max_len: usize,
) -> Result<(Vec<u8>, u64), StrError> {
    let b = &layout.bytes;
    if addr == 0 {
        return Err(StrError::Invalid { addr, why: "NULL" });
    }
    let len = mem.read_u64(addr.wrapping_add(b.ob_size))?;
    if len > MAX_PLAUSIBLE_LEN {
        return Err(StrError::Invalid {
            addr,
            why: "implausible bytes length",
        });
    }
    let n = (len as usize).min(max_len);
    Ok((mem.read_vec(addr.wrapping_add(b.ob_sval), n)?, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::testimage::{Flavor, ImageBuilder};

    #[test]
    fn kinds_and_forms_on_every_flavor() {
        for flavor in Flavor::ALL {
            let mut b = ImageBuilder::new(flavor);
            let samples = ["plain_ascii", "café", "Привет", "数据🚀", "🚀🐍"];
            let addrs: Vec<u64> = samples.iter().map(|s| b.str_object(s)).collect();
            let legacy = b.legacy_str_object("legacy é");
            let (mem, layout) = (b.memory(), b.layout().clone());
            for (s, a) in samples.iter().zip(&addrs) {
                assert_eq!(read_str(&mem, &layout, *a, 100).unwrap(), *s, "{flavor:?}");
            }
            assert_eq!(read_str(&mem, &layout, legacy, 100).unwrap(), "legacy é");
            assert_eq!(read_str(&mem, &layout, addrs[2], 3).unwrap(), "При…");
            assert!(read_str(&mem, &layout, 0, 10).is_err());
        }
    }

    /// Raw state words written by hand (not by `StrState::encode`): CPython v3.14.0
    /// `Include/cpython/unicodeobject.h` — default builds pack `interned:2, kind:3, compact:1,
    /// ascii:1`; free-threaded 3.14 makes `interned` an `unsigned char`, so the bit fields start
    /// at bit 8. 3.13t keeps the default packing (live-checked by `builder_matches_live_313t`).
    #[test]
    fn hand_written_state_words() {
        let cases = [
            (Flavor::V313, 0x64u32, 0xa8u32), // ascii kind 1 | kind 2 compact, interned = 0
            (Flavor::V313T, 0x64, 0xa8),
            (Flavor::V314, 0x65, 0xaa), // interned = 1 / 2 must not matter
            (Flavor::V314T, 0x1901, 0x0a02),
        ];
        for (flavor, ascii_state, ucs2_state) in cases {
            let mut b = ImageBuilder::new(flavor);
            let (a, w) = (b.str_object("abc"), b.str_object("Жж"));
            let layout = b.layout().clone();
            b.w32(a + layout.unicode.state, ascii_state);
            b.w32(w + layout.unicode.state, ucs2_state);
            let mem = b.memory();
            assert_eq!(read_str(&mem, &layout, a, 10).unwrap(), "abc", "{flavor:?}");
            assert_eq!(read_str(&mem, &layout, w, 10).unwrap(), "Жж", "{flavor:?}");
        }
    }

    #[test]
    fn kind_is_checked() {
        let mut b = ImageBuilder::new(Flavor::V314T);
        let a = b.str_object("abc");
        let layout = b.layout().clone();
        let state_at = a + layout.unicode.state;
        let mut mem = b.memory();
        let bad = StrState {
            kind: 3,
            compact: true,
            ascii: false,
        }
        .encode(&layout);
        mem.bytes_mut(state_at, 4)
            .unwrap()
            .copy_from_slice(&bad.to_le_bytes());
        assert!(matches!(
            read_str(&mem, &layout, a, 10),
            Err(StrError::Invalid { .. })
        ));
    }
}
