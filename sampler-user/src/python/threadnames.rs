//! Thread names from `threading._active`.
//!
//! Owns: a bounded reader of instance attributes (≤ 3.10 `tp_dictoffset` dicts, 3.11+
//! managed dicts: combined, split and inline values; dicts and ints are read through
//! `objects`) — just enough to follow `interp->imports.modules["threading"].__dict__["_active"]`
//! → `{ident: Thread}` → `Thread._name`.
//! Input: a [`Ctx`] and an interpreter address. Output: `pthread_t` → name.
//! Constraints: every count is capped ([`MAX_DICT_ENTRIES`], names ≤ [`MAX_NAME_CHARS`] chars);
//! keys are compared after decoding, so non-ASCII names work; any failure is an error value (the
//! caller counts it and falls back to the OS thread name).
//! Layouts: `PyDictKeysObject` / `PyDictValues` in `Include/internal/pycore_dict.h`
//! (<https://github.com/python/cpython/blob/v3.13.0/Include/internal/pycore_dict.h>),
//! `_PyObject_ManagedDictPointer` / `_PyObject_InlineValues` in `pycore_object.h`,
//! `PyLongObject` in `Include/cpython/longintrepr.h`; docs/cpython-layouts.md §7.2.

use std::collections::HashMap;

use super::code::Ctx;
use super::layout::ManagedDict;
use super::memory::MemError;
use super::objects::{Known, ObjError, dict_entries, keys_entries, read_u64_int};
use super::unicode::{StrError, check_type, read_str_typed};

/// Entries read from one dict (sys.modules of a large program has a few thousand).
pub const MAX_DICT_ENTRIES: u64 = 1 << 16;
pub const MAX_NAME_CHARS: usize = 256;
/// `Py_TPFLAGS_INLINE_VALUES` (3.13+).
const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error(transparent)]
    Memory(#[from] MemError),
    #[error("{what} at {addr:#x}")]
    Invalid { what: &'static str, addr: u64 },
    #[error("{0} not found")]
    Missing(&'static str),
}

impl From<ObjError> for NameError {
    fn from(e: ObjError) -> NameError {
        match e {
            ObjError::Memory(m) => NameError::Memory(m),
            ObjError::Invalid { what, addr } => NameError::Invalid { what, addr },
        }
    }
}

impl From<StrError> for NameError {
    fn from(e: StrError) -> NameError {
        match e {
            StrError::Memory(m) => NameError::Memory(m),
            StrError::Invalid { addr, why } => NameError::Invalid { what: why, addr },
            StrError::WrongType { addr, .. } => NameError::Invalid {
                what: "not a str",
                addr,
            },
        }
    }
}

/// `(key, value)` pairs of a dict keys table with optional split values; more than `max`
/// entries is implausible here (an error).
fn keys_items(
    ctx: Ctx<'_>,
    keys: u64,
    values: Option<u64>,
    max: u64,
) -> Result<Vec<(u64, u64)>, NameError> {
    let max = max.min(MAX_DICT_ENTRIES);
    let e = keys_entries(ctx, keys, values, usize::MAX, max)?;
    if e.nentries > max {
        return Err(NameError::Invalid {
            what: "implausible dict keys",
            addr: keys,
        });
    }
    Ok(e.items)
}

/// Items of the dict object at `dict`.
pub(crate) fn dict_items(ctx: Ctx<'_>, dict: u64, max: u64) -> Result<Vec<(u64, u64)>, NameError> {
    let max = max.min(MAX_DICT_ENTRIES);
    let e = dict_entries(ctx, dict, usize::MAX, max)?;
    if e.nentries > max {
        return Err(NameError::Invalid {
            what: "implausible dict keys",
            addr: dict,
        });
    }
    Ok(e.items)
}

pub(crate) fn find_str_key(
    ctx: Ctx<'_>,
    items: &[(u64, u64)],
    name: &'static str,
) -> Result<u64, NameError> {
    for &(k, v) in items {
        // A non-str key (or an unreadable one) simply does not match.
        if read_str_typed(ctx, k, name.len() + 1).is_ok_and(|s| s == name) {
            return Ok(v);
        }
    }
    Err(NameError::Missing(name))
}

/// The attribute `name` of a heap-type instance (its managed dict, or ≤ 3.10 its
/// `tp_dictoffset` dict).
fn instance_attr(ctx: Ctx<'_>, obj: u64, name: &'static str) -> Result<u64, NameError> {
    let (mem, l) = (ctx.mem, ctx.layout);
    let ty = mem.read_u64(obj.wrapping_add(l.object.ob_type))?;
    let cached_keys = || -> Result<u64, NameError> {
        Some(mem.read_u64(ty.wrapping_add(l.types.ht_cached_keys))?)
            .filter(|k| *k != 0)
            .ok_or(NameError::Invalid {
                what: "no ht_cached_keys",
                addr: ty,
            })
    };
    let items = match l.dict.managed_dict {
        ManagedDict::TypeDictOffset => {
            let off = mem.read_u64(ty.wrapping_add(l.types.tp_dictoffset))? as i64;
            if off <= 0 || off > 1 << 16 {
                return Err(NameError::Invalid {
                    what: "tp_dictoffset",
                    addr: ty,
                });
            }
            match mem.read_u64(obj.wrapping_add_signed(off))? {
                0 => return Err(NameError::Missing("instance dict")),
                d => dict_items(ctx, d, MAX_DICT_ENTRIES)?,
            }
        }
        ManagedDict::ValuesThenDict { values, dict } => {
            let v = mem.read_u64(obj.wrapping_add_signed(values))?;
            if v != 0 {
                keys_items(ctx, cached_keys()?, Some(v), MAX_DICT_ENTRIES)?
            } else {
                match mem.read_u64(obj.wrapping_add_signed(dict))? {
                    0 => return Err(NameError::Missing("instance dict")),
                    d => dict_items(ctx, d, MAX_DICT_ENTRIES)?,
                }
            }
        }
        ManagedDict::Tagged { offset } => {
            let w = mem.read_u64(obj.wrapping_add_signed(offset))?;
            if w & 1 == 1 {
                // 3.12 `_PyDictOrValues`: `values - 1` is stored.
                keys_items(
                    ctx,
                    cached_keys()?,
                    Some(w.wrapping_add(1)),
                    MAX_DICT_ENTRIES,
                )?
            } else if w != 0 {
                dict_items(ctx, w, MAX_DICT_ENTRIES)?
            } else {
                return Err(NameError::Missing("instance dict"));
            }
        }
        ManagedDict::Pointer { offset } => {
            let w = mem.read_u64(obj.wrapping_add_signed(offset))?;
            let flags = mem.read_u64(ty.wrapping_add(l.types.tp_flags))?;
            if w != 0 {
                dict_items(ctx, w, MAX_DICT_ENTRIES)?
            } else if l.dict.inline_values && flags & TPFLAGS_INLINE_VALUES != 0 {
                let basicsize = mem.read_u64(ty.wrapping_add(l.types.tp_basicsize))?;
                if basicsize == 0 || basicsize > 1 << 16 {
                    return Err(NameError::Invalid {
                        what: "tp_basicsize",
                        addr: ty,
                    });
                }
                keys_items(
                    ctx,
                    cached_keys()?,
                    Some(obj.wrapping_add(basicsize)),
                    MAX_DICT_ENTRIES,
                )?
            } else {
                return Err(NameError::Missing("instance dict"));
            }
        }
    };
    find_str_key(ctx, &items, name)
}

/// `thread_id` (`pthread_t`) → `Thread._name` for the interpreter at `interp`.
pub fn thread_names(
    ctx: Ctx<'_>,
    interp: u64,
    max_threads: u64,
) -> Result<HashMap<u64, String>, NameError> {
    match active_dict(ctx, interp)? {
        Some(active) => active_names(ctx, active, max_threads),
        None => Ok(HashMap::new()),
    }
}

/// The address of `threading._active` (`{ident: Thread}`) of the interpreter at `interp`:
/// `None` when the interpreter never imported `threading` (not a failure: no names to give).
/// The dict is created once with the module and only ever cleared and refilled (after a fork
/// too), so a caller may keep the address for the interpreter's lifetime and read it with
/// [`active_names`], which checks its type each time.
pub fn active_dict(ctx: Ctx<'_>, interp: u64) -> Result<Option<u64>, NameError> {
    let (mem, l) = (ctx.mem, ctx.layout);
    let modules = mem.read_u64(interp.wrapping_add(l.interp.imports_modules))?;
    if modules == 0 {
        return Err(NameError::Missing("sys.modules"));
    }
    let threading = match find_str_key(
        ctx,
        &dict_items(ctx, modules, MAX_DICT_ENTRIES)?,
        "threading",
    ) {
        Ok(m) => m,
        Err(NameError::Missing(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let md_dict = mem.read_u64(threading.wrapping_add(l.dict.module_dict))?;
    let active = find_str_key(ctx, &dict_items(ctx, md_dict, MAX_DICT_ENTRIES)?, "_active")?;
    check_type(ctx, active, Known::Dict)?;
    Ok(Some(active))
}

/// `thread_id` (`pthread_t`) → `Thread._name` of the entries of the `_active` dict at
/// `active` (at most `max_threads`).
pub fn active_names(
    ctx: Ctx<'_>,
    active: u64,
    max_threads: u64,
) -> Result<HashMap<u64, String>, NameError> {
    check_type(ctx, active, Known::Dict)?;
    let mut names = HashMap::new();
    let mut first_err = None;
    // Threads start and exit while we read: one bad entry costs that name, not all of them.
    for (k, thread) in dict_items(ctx, active, max_threads)? {
        let entry = (|| {
            check_type(ctx, k, Known::Int)?;
            let ident = read_u64_int(ctx, k)?;
            let name = instance_attr(ctx, thread, "_name")?;
            Ok::<_, NameError>((ident, read_str_typed(ctx, name, MAX_NAME_CHARS)?))
        })();
        match entry {
            Ok((ident, name)) => {
                names.insert(ident, name);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) if names.is_empty() => Err(e),
        _ => Ok(names),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::testimage::{Flavor, ImageBuilder};

    #[test]
    fn names_on_every_flavor_and_layout_of_instance_dicts() {
        for flavor in Flavor::ALL {
            for inline in [true, false] {
                let mut b = ImageBuilder::new(flavor);
                b.threading_active(
                    &[
                        (0x7f00_0000_1000, "MainThread"),
                        (u64::MAX - 5, "wörker-🚀"),
                    ],
                    inline,
                );
                let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
                let ctx = Ctx {
                    mem: &mem,
                    layout: &layout,
                    target: &target,
                };
                let names = thread_names(ctx, b.interp_addr(), 100).unwrap();
                assert_eq!(
                    names.get(&0x7f00_0000_1000).map(String::as_str),
                    Some("MainThread"),
                    "{flavor:?} inline={inline}"
                );
                assert_eq!(
                    names.get(&(u64::MAX - 5)).map(String::as_str),
                    Some("wörker-🚀")
                );
                // The `_active` dict found once reads the same names again.
                let active = active_dict(ctx, b.interp_addr()).unwrap().unwrap();
                assert_eq!(active_names(ctx, active, 100).unwrap(), names);
            }
        }
    }

    #[test]
    fn missing_sys_modules_is_an_error() {
        let b = ImageBuilder::new(Flavor::V313);
        let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &layout,
            target: &target,
        };
        assert!(thread_names(ctx, b.interp_addr(), 10).is_err());
    }
}
