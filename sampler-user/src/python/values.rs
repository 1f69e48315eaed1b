//! Objects of the target rendered as Python's own `repr` shows them (`dump --locals`).
//!
//! Owns: [`ValueLimits`] and [`render`]: `None`, `True`/`False`, `int` (any size up to
//! [`MAX_INT_DIGITS`] digits), `float`, `str`, `bytes` exactly as `repr()`; `tuple`, `list`,
//! `dict`, `set` and `frozenset` as `repr()` of their first [`ValueLimits::max_items`] items
//! followed by `...`; a container nested deeper than [`ValueLimits::max_depth`] as `[...]`,
//! `(...)` or `{...}`; any other object (subclasses of the built-in types included, whose
//! `repr` may be overridden) as `<TypeName object at 0x…>`.
//! Input: a [`Ctx`] (its [`KnownObjects`](super::objects::KnownObjects) recognise types by
//! address) and an object address. Output: a `String` of at most `max_len` characters.
//! Constraints: never fails and never panics: a value (or an item of a container) that cannot
//! be read is shown as [`UNREADABLE`] and counted ([`ErrorKind::ValueUnreadable`]). Reads are
//! bounded: a string or bytes value reads at most `max_len` characters, a container at most
//! `max_items` items (and [`MAX_SCAN`] table slots), an int at most [`MAX_INT_DIGITS`] digits.
//! The target keeps running while we read (and free-threaded targets mutate containers
//! without a global lock): a value is what memory held at the moment each piece was read.

use super::code::Ctx;
use super::errors::{ErrorCounts, ErrorKind};
use super::objects::{
    Known, ObjError, Seq, c_string, dict_entries, int_digits, seq_items, set_keys, type_of,
};
use super::repr::{Bounded, bytes_repr, float_repr, int_repr, str_repr};
use super::unicode::{StrError, read_bytes_prefix, read_code_points};

/// What a value that cannot be read shows.
pub const UNREADABLE: &str = "<unreadable>";
/// Most table slots looked at for the first items of one dict or set.
pub const MAX_SCAN: u64 = 4096;
/// Most base-2^30 digits of an `int` converted (30,000 bits, about 9,000 decimal digits; CPython
/// itself refuses `repr()` beyond 4,300 digits). Larger ints show as `<int object at 0x…>`.
pub const MAX_INT_DIGITS: u64 = 1000;
/// Longest type name read.
const MAX_TYPE_NAME: usize = 256;

/// Caps of one rendered value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueLimits {
    /// Characters of the whole rendered value (`--locals-max-len`).
    pub max_len: usize,
    /// Items shown of each container.
    pub max_items: usize,
    /// Container levels shown (deeper containers show as `[...]`).
    pub max_depth: usize,
}

impl Default for ValueLimits {
    fn default() -> ValueLimits {
        ValueLimits {
            max_len: 256,
            max_items: 8,
            max_depth: 2,
        }
    }
}

impl From<StrError> for ObjError {
    fn from(e: StrError) -> ObjError {
        match e {
            StrError::Memory(m) => ObjError::Memory(m),
            StrError::Invalid { addr, why } => ObjError::Invalid { what: why, addr },
            StrError::WrongType { addr, .. } => ObjError::Invalid {
                what: "not of the expected type",
                addr,
            },
        }
    }
}

struct Renderer<'a, 'c> {
    ctx: Ctx<'a>,
    limits: ValueLimits,
    counts: &'c mut ErrorCounts,
    out: Bounded,
}

/// The object at `addr` as Python's `repr` shows it (see the module header).
pub fn render(ctx: Ctx<'_>, addr: u64, limits: ValueLimits, counts: &mut ErrorCounts) -> String {
    let mut r = Renderer {
        ctx,
        limits,
        counts,
        out: Bounded::new(limits.max_len),
    };
    r.item(addr, 0);
    r.out.into_string()
}

/// `repr()` of a tagged int stored in a `_PyStackRef` (3.14+).
pub fn render_tagged_int(value: i64) -> String {
    value.to_string()
}

impl Renderer<'_, '_> {
    /// One value; a failure shows [`UNREADABLE`] in its place.
    fn item(&mut self, addr: u64, depth: usize) {
        if let Err(_e) = self.value(addr, depth) {
            self.counts.add(ErrorKind::ValueUnreadable);
            self.out.push_str(UNREADABLE);
        }
    }

    fn value(&mut self, addr: u64, depth: usize) -> Result<(), ObjError> {
        let known = &self.ctx.target.known;
        let singleton = match known.at(addr) {
            Some(Known::None) => Some("None"),
            Some(Known::True) => Some("True"),
            Some(Known::False) => Some("False"),
            _ => None,
        };
        if let Some(s) = singleton {
            self.out.push_str(s);
            return Ok(());
        }
        if addr == 0 {
            return Err(ObjError::Invalid {
                what: "NULL object",
                addr,
            });
        }
        let ty = type_of(self.ctx, addr)?;
        let (ctx, limits) = (self.ctx, self.limits);
        match known.at(ty) {
            Some(Known::Int) => match int_digits(ctx, addr, MAX_INT_DIGITS)? {
                Some((negative, digits)) => self.out.push_str(&int_repr(negative, &digits)),
                None => self.other(addr, ty)?,
            },
            Some(Known::Bool) => {
                let Some((_, digits)) = int_digits(ctx, addr, 4)? else {
                    return Err(ObjError::Invalid {
                        what: "bool with many digits",
                        addr,
                    });
                };
                let truth = digits.iter().any(|d| *d != 0);
                self.out.push_str(if truth { "True" } else { "False" });
            }
            Some(Known::Float) => {
                let bits = ctx
                    .mem
                    .read_u64(addr.wrapping_add(ctx.layout.values.float_value))?;
                self.out.push_str(&float_repr(f64::from_bits(bits)));
            }
            Some(Known::Str) => {
                let (cps, length) = read_code_points(ctx.mem, ctx.layout, addr, limits.max_len)?;
                let cut = (cps.len() as u64) < length;
                str_repr(&cps, cut, ctx.layout.unicode_version, &mut self.out);
            }
            Some(Known::Bytes) => {
                let (bytes, length) = read_bytes_prefix(ctx.mem, ctx.layout, addr, limits.max_len)?;
                bytes_repr(&bytes, (bytes.len() as u64) < length, &mut self.out);
            }
            Some(Known::Tuple) => self.sequence(addr, Seq::Tuple, depth)?,
            Some(Known::List) => self.sequence(addr, Seq::List, depth)?,
            Some(Known::Dict) => self.dict(addr, depth)?,
            Some(k @ (Known::Set | Known::FrozenSet)) => {
                self.set(addr, k == Known::FrozenSet, depth)?;
            }
            _ => self.other(addr, ty)?,
        }
        Ok(())
    }

    /// `<TypeName object at 0x…>`, with control characters of the name replaced.
    fn other(&mut self, addr: u64, ty: u64) -> Result<(), ObjError> {
        let name_ptr = self
            .ctx
            .mem
            .read_u64(ty.wrapping_add(self.ctx.layout.types.tp_name))?;
        let name = c_string(self.ctx, name_ptr, MAX_TYPE_NAME)?;
        let name: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        self.out.push_str(&format!("<{name} object at {addr:#x}>"));
        Ok(())
    }

    fn sequence(&mut self, addr: u64, seq: Seq, depth: usize) -> Result<(), ObjError> {
        let (open, close) = if seq == Seq::Tuple {
            ('(', ')')
        } else {
            ('[', ']')
        };
        if depth >= self.limits.max_depth {
            // Still read the length: an unreadable object must not look like a container.
            seq_items(self.ctx, addr, seq, 0)?;
            self.out.push(open);
            self.out.push_str("...");
            self.out.push(close);
            return Ok(());
        }
        let (items, len) = seq_items(self.ctx, addr, seq, self.limits.max_items)?;
        self.out.push(open);
        for (i, it) in items.iter().enumerate() {
            if self.out.is_full() {
                return Ok(());
            }
            if i > 0 {
                self.out.push_str(", ");
            }
            self.item(*it, depth + 1);
        }
        if (items.len() as u64) < len {
            self.out.push_str(", ...");
        } else if seq == Seq::Tuple && len == 1 {
            self.out.push(',');
        }
        self.out.push(close);
        Ok(())
    }

    fn dict(&mut self, addr: u64, depth: usize) -> Result<(), ObjError> {
        if depth >= self.limits.max_depth {
            dict_entries(self.ctx, addr, 0, 0)?;
            self.out.push_str("{...}");
            return Ok(());
        }
        let e = dict_entries(self.ctx, addr, self.limits.max_items, MAX_SCAN)?;
        self.out.push('{');
        for (i, (k, v)) in e.items.iter().enumerate() {
            if self.out.is_full() {
                return Ok(());
            }
            if i > 0 {
                self.out.push_str(", ");
            }
            self.item(*k, depth + 1);
            self.out.push_str(": ");
            self.item(*v, depth + 1);
        }
        if e.more {
            self.out
                .push_str(if e.items.is_empty() { "..." } else { ", ..." });
        }
        self.out.push('}');
        Ok(())
    }

    fn set(&mut self, addr: u64, frozen: bool, depth: usize) -> Result<(), ObjError> {
        let name = if frozen { "frozenset" } else { "set" };
        if depth >= self.limits.max_depth {
            set_keys(self.ctx, addr, 0, 0)?;
            if frozen {
                self.out.push_str("frozenset({...})");
            } else {
                self.out.push_str("{...}");
            }
            return Ok(());
        }
        let (keys, more) = set_keys(self.ctx, addr, self.limits.max_items, MAX_SCAN)?;
        if keys.is_empty() && !more {
            self.out.push_str(name);
            self.out.push_str("()");
            return Ok(());
        }
        if frozen {
            self.out.push_str("frozenset(");
        }
        self.out.push('{');
        for (i, k) in keys.iter().enumerate() {
            if self.out.is_full() {
                return Ok(());
            }
            if i > 0 {
                self.out.push_str(", ");
            }
            self.item(*k, depth + 1);
        }
        if more {
            self.out
                .push_str(if keys.is_empty() { "..." } else { ", ..." });
        }
        self.out.push('}');
        if frozen {
            self.out.push(')');
        }
        Ok(())
    }
}
