//! The built-in objects the reader interprets, and bounded readers of their contents.
//!
//! Owns: [`KnownObjects`] — the addresses of the interpreter's static type objects and
//! singletons (`PyLong_Type`, `_Py_NoneStruct`, …), from its exported symbols, so an object's
//! type is recognised by address, never by name — and the readers of `dict` entries (combined
//! and split tables, in table order), `tuple`/`list` items, `set` entries, `int` digits, cells
//! and C-string type names.
//! Input: a [`Ctx`] and an object address. Output: addresses of contained objects or decoded
//! scalars; failures as [`ObjError`] values.
//! Constraints: every count comes from the target and is checked before it sizes a read: at
//! most `want` items are returned and at most `scan` slots of a table are looked at; nothing
//! here follows a pointer more than one level (callers decide how deep to go).
//! Layouts: `PyDictKeysObject`/`PyDictValues` (`Include/internal/pycore_dict.h`),
//! `PyTupleObject`, `PyListObject`, `PySetObject` (`Include/cpython/setobject.h`: entries
//! `{key, hash}`, a deleted slot holds the dummy key with hash -1), `PyLongObject`
//! (`Include/cpython/longintrepr.h`), e.g.
//! <https://github.com/python/cpython/blob/v3.13.0/Include/internal/pycore_dict.h>.

use super::code::Ctx;
use super::layout::{DictKeys, LongForm};
use super::memory::{MemError, field_u64};

/// A static object of the interpreter that the reader recognises by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    None,
    True,
    False,
    Int,
    Bool,
    Float,
    Str,
    Bytes,
    List,
    Tuple,
    Dict,
    Set,
    FrozenSet,
    Cell,
}

/// The exported symbol of each [`Known`] object (`PyAPI_DATA` in CPython's public headers).
pub const KNOWN_SYMBOLS: [(&str, Known); 14] = [
    ("_Py_NoneStruct", Known::None),
    ("_Py_TrueStruct", Known::True),
    ("_Py_FalseStruct", Known::False),
    ("PyLong_Type", Known::Int),
    ("PyBool_Type", Known::Bool),
    ("PyFloat_Type", Known::Float),
    ("PyUnicode_Type", Known::Str),
    ("PyBytes_Type", Known::Bytes),
    ("PyList_Type", Known::List),
    ("PyTuple_Type", Known::Tuple),
    ("PyDict_Type", Known::Dict),
    ("PySet_Type", Known::Set),
    ("PyFrozenSet_Type", Known::FrozenSet),
    ("PyCell_Type", Known::Cell),
];

/// Addresses of the [`Known`] objects in one process (`None`: the symbol was not found).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownObjects {
    addrs: [Option<u64>; KNOWN_SYMBOLS.len()],
}

impl KnownObjects {
    fn index(k: Known) -> usize {
        KNOWN_SYMBOLS.iter().position(|(_, x)| *x == k).unwrap_or(0)
    }

    pub fn set(&mut self, k: Known, addr: u64) {
        self.addrs[Self::index(k)] = Some(addr);
    }

    pub fn get(&self, k: Known) -> Option<u64> {
        self.addrs[Self::index(k)]
    }

    /// The same objects at `bias` further (symbol values → addresses in the process).
    #[must_use]
    pub fn biased(&self, bias: u64) -> KnownObjects {
        KnownObjects {
            addrs: self.addrs.map(|a| a.map(|a| a.wrapping_add(bias))),
        }
    }

    /// Which known object (type or singleton) is at `addr`.
    pub fn at(&self, addr: u64) -> Option<Known> {
        if addr == 0 {
            return None;
        }
        self.addrs
            .iter()
            .position(|a| *a == Some(addr))
            .map(|i| KNOWN_SYMBOLS[i].1)
    }
}

/// Why an object's contents could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ObjError {
    #[error(transparent)]
    Memory(#[from] MemError),
    #[error("{what} at {addr:#x}")]
    Invalid { what: &'static str, addr: u64 },
}

fn invalid(what: &'static str, addr: u64) -> ObjError {
    ObjError::Invalid { what, addr }
}

/// Largest length or count taken from a target object (beyond: a torn or garbage object).
const MAX_PLAUSIBLE_COUNT: u64 = 1 << 40;
/// `PyDictKeysObject` header: `dk_log2_index_bytes` @9, `dk_kind` @10, `dk_nentries` @24;
/// the indices follow @32 (every build, 3.11–3.15).
const DK_HEADER: u64 = 32;
/// ≤ 3.10: `dk_refcnt`, `dk_size`, `dk_lookup`, `dk_usable`, `dk_nentries`; indices @40.
const DK_HEADER_SIZED: u64 = 40;
/// Table slots read at once.
const CHUNK: u64 = 256;

/// The type object of the object at `addr`.
pub fn type_of(ctx: Ctx<'_>, addr: u64) -> Result<u64, ObjError> {
    Ok(ctx
        .mem
        .read_u64(addr.wrapping_add(ctx.layout.object.ob_type))?)
}

/// Entries of a dict's keys table, in table (insertion) order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DictEntries {
    /// `(key, value)` of the live entries found.
    pub items: Vec<(u64, u64)>,
    /// `dk_nentries`: slots used so far (live or deleted).
    pub nentries: u64,
    /// Live entries remain beyond `items` (or beyond the slots scanned).
    pub more: bool,
}

/// Up to `want` live entries of a keys table, with split `values` if given, looking at no more
/// than `scan` slots.
pub fn keys_entries(
    ctx: Ctx<'_>,
    keys: u64,
    values: Option<u64>,
    want: usize,
    scan: u64,
) -> Result<DictEntries, ObjError> {
    let mem = ctx.mem;
    let (nentries, entries, kind) = match ctx.layout.dict.keys {
        DictKeys::Log2 => {
            let head = mem.read_vec(keys, DK_HEADER as usize)?;
            let log2_index_bytes = u32::from(head[9]);
            let kind = head[10];
            let nentries = field_u64(&head, 24).ok_or(invalid("dk_nentries", keys))?;
            if log2_index_bytes > 40 || kind > 2 {
                return Err(invalid("implausible dict keys", keys));
            }
            let entries = keys.wrapping_add(DK_HEADER + (1u64 << log2_index_bytes));
            (nentries, entries, kind)
        }
        DictKeys::Sized => {
            // `dk_size` @8 (a power of two), `dk_nentries` @32, indices @40, each 1, 2, 4 or 8
            // bytes wide as `dk_size` needs (`DK_IXSIZE` in 3.10's `Objects/dictobject.c`);
            // every entry is `{hash, key, value}` (kind 0).
            let head = mem.read_vec(keys, DK_HEADER_SIZED as usize)?;
            let size = field_u64(&head, 8).ok_or(invalid("dk_size", keys))?;
            let nentries = field_u64(&head, 32).ok_or(invalid("dk_nentries", keys))?;
            if !size.is_power_of_two() || size > 1 << 40 {
                return Err(invalid("implausible dict keys", keys));
            }
            let ix = match size {
                0..=0xff => 1,
                0x100..=0xffff => 2,
                0x1_0000..=0xffff_ffff => 4,
                _ => 8,
            };
            (nentries, keys.wrapping_add(DK_HEADER_SIZED + size * ix), 0)
        }
    };
    if nentries > MAX_PLAUSIBLE_COUNT {
        return Err(invalid("implausible dict keys", keys));
    }
    // Kind 0 (general): {hash, key, value}; kinds 1/2 (unicode keys, split): {key, value}.
    let (size, key_off, value_off) = if kind == 0 {
        (24u64, 8u64, 16u64)
    } else {
        (16, 0, 8)
    };
    let mut out = DictEntries {
        nentries,
        ..DictEntries::default()
    };
    // Read the table in chunks: a huge dict costs only the slots needed for `want` items.
    let limit = nentries.min(scan);
    let mut ix = 0;
    while ix < limit {
        let n = CHUNK.min(limit - ix);
        let raw = mem.read_vec(entries.wrapping_add(ix * size), (n * size) as usize)?;
        let split = match values {
            Some(v) => Some(mem.read_vec(
                v.wrapping_add(ctx.layout.dict.values_array + ix * 8),
                (n * 8) as usize,
            )?),
            None => None,
        };
        for i in 0..n {
            let key = field_u64(&raw, i * size + key_off).unwrap_or(0);
            let value = match &split {
                Some(s) => field_u64(s, i * 8).unwrap_or(0),
                None => field_u64(&raw, i * size + value_off).unwrap_or(0),
            };
            if key == 0 || value == 0 {
                continue;
            }
            if out.items.len() >= want {
                out.more = true;
                return Ok(out);
            }
            out.items.push((key, value));
        }
        ix += n;
    }
    out.more |= nentries > limit;
    Ok(out)
}

/// Up to `want` live entries of the dict object at `dict` (see [`keys_entries`]).
pub fn dict_entries(
    ctx: Ctx<'_>,
    dict: u64,
    want: usize,
    scan: u64,
) -> Result<DictEntries, ObjError> {
    let d = &ctx.layout.dict;
    let keys = ctx.mem.read_u64(dict.wrapping_add(d.ma_keys))?;
    let values = ctx.mem.read_u64(dict.wrapping_add(d.ma_values))?;
    if keys == 0 {
        return Err(invalid("NULL ma_keys", dict));
    }
    keys_entries(ctx, keys, (values != 0).then_some(values), want, scan)
}

/// Which sequence layout to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seq {
    /// Items inline after the header.
    Tuple,
    /// Items in a separate array (`ob_item` is a pointer).
    List,
}

/// The first `want` item addresses of a tuple or list, and its length.
pub fn seq_items(
    ctx: Ctx<'_>,
    addr: u64,
    seq: Seq,
    want: usize,
) -> Result<(Vec<u64>, u64), ObjError> {
    let v = &ctx.layout.values;
    let len = ctx.mem.read_u64(addr.wrapping_add(v.var_size))?;
    if len > MAX_PLAUSIBLE_COUNT {
        return Err(invalid("implausible length", addr));
    }
    let n = len.min(want as u64);
    if n == 0 {
        return Ok((Vec::new(), len));
    }
    let items = match seq {
        Seq::Tuple => addr.wrapping_add(v.tuple_item),
        Seq::List => ctx.mem.read_u64(addr.wrapping_add(v.list_item))?,
    };
    if items == 0 {
        return Err(invalid("NULL ob_item", addr));
    }
    let raw = ctx.mem.read_vec(items, (n * 8) as usize)?;
    Ok((
        raw.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect(),
        len,
    ))
}

/// Up to `want` keys of a set or frozenset, in table order, looking at no more than `scan`
/// slots; and whether more remain.
pub fn set_keys(
    ctx: Ctx<'_>,
    addr: u64,
    want: usize,
    scan: u64,
) -> Result<(Vec<u64>, bool), ObjError> {
    let v = &ctx.layout.values;
    let used = ctx.mem.read_u64(addr.wrapping_add(v.set_used))?;
    let mask = ctx.mem.read_u64(addr.wrapping_add(v.set_mask))?;
    let table = ctx.mem.read_u64(addr.wrapping_add(v.set_table))?;
    if used > MAX_PLAUSIBLE_COUNT || mask > MAX_PLAUSIBLE_COUNT || (mask != 0 && table == 0) {
        return Err(invalid("implausible set", addr));
    }
    let mut keys = Vec::new();
    if used == 0 {
        return Ok((keys, false));
    }
    let slots = mask.saturating_add(1).min(scan);
    let mut ix = 0;
    while ix < slots {
        let n = CHUNK.min(slots - ix);
        let raw = ctx
            .mem
            .read_vec(table.wrapping_add(ix * 16), (n * 16) as usize)?;
        for e in raw.chunks_exact(16) {
            let key = u64::from_le_bytes(e[..8].try_into().unwrap_or_default());
            let hash = i64::from_le_bytes(e[8..].try_into().unwrap_or_default());
            // Empty slots hold NULL; deleted ones the dummy key with hash -1 (a real hash is
            // never -1).
            if key == 0 || hash == -1 {
                continue;
            }
            if keys.len() >= want {
                return Ok((keys, true));
            }
            keys.push(key);
        }
        ix += n;
    }
    let more = (keys.len() as u64) < used;
    Ok((keys, more))
}

/// An `int`: its sign and its base-2^30 digits (least significant first), if it has at most
/// `max_digits` of them; `Ok(None)` when it has more.
pub fn int_digits(
    ctx: Ctx<'_>,
    addr: u64,
    max_digits: u64,
) -> Result<Option<(bool, Vec<u32>)>, ObjError> {
    let l = &ctx.layout.long;
    let word = ctx.mem.read_u64(addr.wrapping_add(l.lv_tag))?;
    let (ndigits, negative) = match l.form {
        LongForm::Tag => {
            let sign = word & 3;
            if sign == 3 {
                return Err(invalid("bad int sign", addr));
            }
            (if sign == 1 { 0 } else { word >> 3 }, sign == 2)
        }
        LongForm::SignedSize => {
            let size = word as i64;
            (size.unsigned_abs(), size < 0)
        }
    };
    if ndigits > max_digits {
        return Ok(None);
    }
    let raw = ctx
        .mem
        .read_vec(addr.wrapping_add(l.ob_digit), (ndigits * 4) as usize)?;
    let digits = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x3fff_ffff)
        .collect();
    Ok(Some((negative, digits)))
}

/// A non-negative `int` that fits in 64 bits (e.g. `threading.get_ident()` values).
pub fn read_u64_int(ctx: Ctx<'_>, addr: u64) -> Result<u64, ObjError> {
    let not_u64 = invalid("not a non-negative 64-bit int", addr);
    let Some((negative, digits)) = int_digits(ctx, addr, 3)? else {
        return Err(not_u64);
    };
    if negative {
        return Err(not_u64);
    }
    let mut v: u128 = 0;
    for (i, d) in digits.iter().enumerate() {
        v |= u128::from(*d) << (30 * i);
    }
    u64::try_from(v).map_err(|_| not_u64)
}

/// The NUL-terminated C string at `addr`, at most `max` bytes (lossy UTF-8). Reads never cross
/// a page boundary they do not need to, so a short string at the end of a mapping is readable.
pub fn c_string(ctx: Ctx<'_>, addr: u64, max: usize) -> Result<String, ObjError> {
    if addr == 0 {
        return Err(invalid("NULL string", addr));
    }
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < max {
        let to_page_end = 0x1000 - (at & 0xfff);
        let n = (to_page_end as usize).min(max - out.len()).min(256);
        // A string at the end of an object may sit right before memory that cannot be read
        // (an image's gap, a core's hole): shrink the read before giving up.
        let chunk = match ctx.mem.read_vec(at, n) {
            Ok(c) => c,
            Err(MemError::Fault { .. }) if n > 1 => ctx
                .mem
                .read_vec(at, n.min(16))
                .or_else(|_| ctx.mem.read_vec(at, 1))?,
            Err(e) => return Err(e.into()),
        };
        let n = chunk.len();
        if let Some(nul) = chunk.iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..nul]);
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&chunk);
        at = at.wrapping_add(n as u64);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_objects_by_address() {
        let mut k = KnownObjects::default();
        k.set(Known::Int, 0x1000);
        k.set(Known::None, 0x2000);
        let b = k.biased(0x10);
        assert_eq!(b.get(Known::Int), Some(0x1010));
        assert_eq!(b.at(0x2010), Some(Known::None));
        assert_eq!(b.at(0x1000), None);
        assert_eq!(b.at(0), None);
        assert_eq!(b.get(Known::Cell), None);
    }
}
