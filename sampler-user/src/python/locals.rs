//! The arguments and local variables of one frame (`dump --locals`).
//!
//! Owns: [`frame_locals`] and the per-code-object cache of local names and kinds
//! ([`LocalsCache`], held by the [`CodeCache`]).
//! Input: a [`Ctx`], a frame address and its code object. Output: [`Local`]s in the order of
//! `co_localsplusnames` — arguments first (positional, keyword-only, `*args`, `**kwargs`), then
//! the other locals, cells and free variables — each with its value rendered by
//! [`values::render`](super::values::render).
//! Up to 3.10 the names are `co_varnames`, `co_cellvars`, `co_freevars` and the values
//! `f_localsplus` of the `PyFrameObject` in that order (see [`classic_meta`]); they are read as
//! the kinds below (`LOCAL`, `CELL`, `FREE`).
//! Rules (CPython 3.11+, `Include/internal/pycore_code.h` `CO_FAST_*`, `Objects/frameobject.c`
//! `frame_get_var`): the value of local `i` is `frame->localsplus[i]` (a `PyObject *`, from 3.14
//! a `_PyStackRef`: tag bits masked, `bits == 1` is NULL, low bits `11` a tagged int); NULL is
//! unbound. A `CO_FAST_FREE` slot holds a cell; a `CO_FAST_CELL` slot holds a cell once
//! `MAKE_CELL` has run (before, the plain value — told apart by the cell's type); a cell is shown
//! by its content (an empty cell is unbound). `CO_FAST_HIDDEN` locals (PEP 709 inlined
//! comprehensions) are shown only while bound. The first `co_argcount + co_kwonlyargcount`
//! (+1 with `CO_VARARGS`, +1 with `CO_VARKEYWORDS`) locals are the arguments.
//! Constraints: at most [`MAX_LOCALS`] locals per frame, names of at most [`MAX_NAME_CHARS`]
//! characters; a frame whose names or slots cannot be read costs that frame's locals only and is
//! counted ([`ErrorKind::LocalsUnreadable`]).

use std::sync::Arc;

use super::code::{CodeCache, CodeInfo, Ctx};
use super::errors::{ErrorCounts, ErrorKind};
use super::objects::{Known, ObjError, Seq, seq_items, type_of};
use super::unicode::{read_bytes_prefix, read_str};
use super::values::{ValueLimits, render, render_tagged_int};
use crate::lru::Lru;

/// Most locals shown per frame.
pub const MAX_LOCALS: usize = 1024;
/// Longest local name kept.
pub const MAX_NAME_CHARS: usize = 256;
/// What an unbound local shows.
pub const UNBOUND: &str = "<unbound>";
/// Most code objects whose local names are cached.
const MAX_CACHED: usize = 1 << 14;

const CO_VARARGS: u32 = 0x4;
const CO_VARKEYWORDS: u32 = 0x8;
const CO_FAST_HIDDEN: u8 = 0x10;
const CO_FAST_LOCAL: u8 = 0x20;
const CO_FAST_CELL: u8 = 0x40;
const CO_FAST_FREE: u8 = 0x80;

/// One argument or local variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub name: String,
    /// An argument of the function (incl. `*args`, `**kwargs`, keyword-only).
    pub arg: bool,
    /// `repr()` of the value, [`UNBOUND`], or `<unreadable>`.
    pub value: String,
}

/// Names, kinds, slots and argument count of one code object.
#[derive(Debug)]
struct LocalsMeta {
    names: Vec<String>,
    kinds: Vec<u8>,
    /// The `localsplus` slot of each name.
    slots: Vec<usize>,
    nargs: usize,
}

/// Local names per code object, valid as long as the [`CodeCache`] entry it was built from
/// (kept inside the [`CodeCache`], which flushes it with its own entries).
#[derive(Debug)]
pub struct LocalsCache {
    entries: Lru<u64, (Arc<CodeInfo>, Arc<LocalsMeta>)>,
}

impl Default for LocalsCache {
    fn default() -> Self {
        LocalsCache {
            entries: Lru::new(MAX_CACHED),
        }
    }
}

impl LocalsCache {
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

/// The `str`s of the tuple at `tuple` (at most [`MAX_LOCALS`]), type-checked.
fn names_of(ctx: Ctx<'_>, tuple: u64) -> Result<Vec<String>, ObjError> {
    let (items, _) = seq_items(ctx, tuple, Seq::Tuple, MAX_LOCALS)?;
    let str_type = ctx.target.known.get(Known::Str);
    let mut names = Vec::with_capacity(items.len());
    for it in items {
        if str_type.is_some() && str_type != Some(type_of(ctx, it)?) {
            return Err(ObjError::Invalid {
                what: "a local name that is not a str",
                addr: it,
            });
        }
        names.push(read_str(ctx.mem, ctx.layout, it, MAX_NAME_CHARS)?);
    }
    Ok(names)
}

fn meta(ctx: Ctx<'_>, code: u64) -> Result<LocalsMeta, ObjError> {
    let (mem, c) = (ctx.mem, &ctx.layout.code);
    let word = |off| mem.read_u32(code.wrapping_add(off));
    let argcount = word(c.argcount)? as usize;
    let kwonly = word(c.kwonlyargcount)? as usize;
    let flags = word(c.flags)?;
    let nargs = argcount
        .saturating_add(kwonly)
        .saturating_add(usize::from(flags & CO_VARARGS != 0))
        .saturating_add(usize::from(flags & CO_VARKEYWORDS != 0));
    let ptr = |off: u64| mem.read_u64(code.wrapping_add(off));
    if let (Some(names_off), Some(kinds_off)) = (c.localsplusnames, c.localspluskinds) {
        let names = names_of(ctx, ptr(names_off)?)?;
        let (kinds, _) = read_bytes_prefix(mem, ctx.layout, ptr(kinds_off)?, MAX_LOCALS)?;
        if kinds.len() != names.len() {
            return Err(ObjError::Invalid {
                what: "co_localspluskinds does not match co_localsplusnames",
                addr: code,
            });
        }
        let slots = (0..names.len()).collect();
        return Ok(LocalsMeta {
            names,
            kinds,
            slots,
            nargs,
        });
    }
    let (Some(var), Some(cell), Some(free)) = (c.varnames, c.cellvars, c.freevars) else {
        return Err(ObjError::Invalid {
            what: "the layout names no locals",
            addr: code,
        });
    };
    Ok(classic_meta(
        names_of(ctx, ptr(var)?)?,
        &names_of(ctx, ptr(cell)?)?,
        &names_of(ctx, ptr(free)?)?,
        nargs,
    ))
}

/// Up to 3.10: `f_localsplus` holds `co_varnames`' values, then a cell per `co_cellvars`, then
/// a cell per `co_freevars`. An argument that is also a cell variable is named in both; its
/// cell is made when the frame starts and its own slot cleared (`co_cell2arg`), so it is shown
/// once, in its argument's place, from its cell.
fn classic_meta(var: Vec<String>, cell: &[String], free: &[String], nargs: usize) -> LocalsMeta {
    let mut names = var;
    let mut kinds = vec![CO_FAST_LOCAL; names.len()];
    let mut slots: Vec<usize> = (0..names.len()).collect();
    let base = names.len();
    for (i, n) in cell.iter().enumerate() {
        if let Some(j) = names[..base].iter().position(|v| v == n) {
            kinds[j] = CO_FAST_LOCAL | CO_FAST_CELL;
            slots[j] = base + i;
        } else {
            names.push(n.clone());
            kinds.push(CO_FAST_CELL);
            slots.push(base + i);
        }
    }
    for (i, n) in free.iter().enumerate() {
        names.push(n.clone());
        kinds.push(CO_FAST_FREE);
        slots.push(base + cell.len() + i);
    }
    names.truncate(MAX_LOCALS);
    LocalsMeta {
        names,
        kinds,
        slots,
        nargs,
    }
}

fn cached_meta(
    ctx: Ctx<'_>,
    codes: &mut CodeCache,
    code: u64,
    counts: &mut ErrorCounts,
) -> Result<Arc<LocalsMeta>, ObjError> {
    let info = codes
        .get(ctx, code, counts)
        .map_err(|_| ObjError::Invalid {
            what: "code object",
            addr: code,
        })?;
    let cache = &mut codes.locals;
    if let Some((i, m)) = cache.entries.get(&code)
        && Arc::ptr_eq(i, &info)
    {
        return Ok(Arc::clone(m));
    }
    let m = Arc::new(meta(ctx, code)?);
    cache.entries.insert(code, (info, Arc::clone(&m)));
    Ok(m)
}

/// What a `localsplus` slot holds.
enum Slot {
    Null,
    TaggedInt(i64),
    Object(u64),
}

fn slot(bits: u64, tag_mask: u64) -> Slot {
    if bits == 0 || (tag_mask != 0 && bits == 1) {
        Slot::Null
    } else if tag_mask != 0 && bits & 3 == 3 {
        Slot::TaggedInt((bits as i64) >> 2)
    } else {
        Slot::Object(bits & !tag_mask)
    }
}

/// The arguments and locals of the frame at `frame` running `code`.
pub fn frame_locals(
    ctx: Ctx<'_>,
    codes: &mut CodeCache,
    frame: u64,
    code: u64,
    limits: ValueLimits,
    counts: &mut ErrorCounts,
) -> Vec<Local> {
    let Ok(m) = cached_meta(ctx, codes, code, counts) else {
        counts.add(ErrorKind::LocalsUnreadable);
        return Vec::new();
    };
    let n = m.slots.iter().max().map_or(0, |s| s + 1);
    let Ok(raw) = ctx.mem.read_vec(
        frame.wrapping_add(ctx.layout.frame.localsplus),
        n.saturating_mul(8),
    ) else {
        counts.add(ErrorKind::LocalsUnreadable);
        return Vec::new();
    };
    let mask = ctx.layout.frame.stackref_tag_mask;
    let cell_type = ctx.target.known.get(Known::Cell);
    let mut out = Vec::with_capacity(n);
    for (i, (name, kind)) in m.names.iter().zip(&m.kinds).enumerate() {
        let at = m.slots.get(i).copied().unwrap_or(i) * 8;
        let Some(word) = raw.get(at..at + 8) else {
            continue;
        };
        let bits = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let mut s = slot(bits, mask);
        if let Slot::Object(obj) = s
            && kind & (CO_FAST_CELL | CO_FAST_FREE) != 0
        {
            // A cell (always for free variables; for cell variables once MAKE_CELL ran).
            let is_cell = match type_of(ctx, obj) {
                Ok(t) => cell_type == Some(t) || (cell_type.is_none() && kind & CO_FAST_FREE != 0),
                Err(_) => false,
            };
            if is_cell {
                s = match ctx
                    .mem
                    .read_u64(obj.wrapping_add(ctx.layout.values.cell_ref))
                {
                    Ok(0) => Slot::Null,
                    Ok(content) => Slot::Object(content),
                    Err(_) => {
                        counts.add(ErrorKind::ValueUnreadable);
                        out.push(Local {
                            name: name.clone(),
                            arg: i < m.nargs,
                            value: super::values::UNREADABLE.into(),
                        });
                        continue;
                    }
                };
            }
        }
        let value = match s {
            Slot::Null if kind & CO_FAST_HIDDEN != 0 => continue,
            Slot::Null => UNBOUND.to_owned(),
            Slot::TaggedInt(v) => render_tagged_int(v),
            Slot::Object(obj) => render(ctx, obj, limits, counts),
        };
        out.push(Local {
            name: name.clone(),
            arg: i < m.nargs,
            value,
        });
    }
    out
}
