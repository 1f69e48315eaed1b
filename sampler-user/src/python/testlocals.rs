//! Synthetic images with values and locals (`dump --locals`), for unit and fuzz tests.
//!
//! Extends [`ImageBuilder`] with the built-in value objects (ints of any size, floats, tuples,
//! lists, dicts, sets, cells, instances of a named type) and with code objects and frames that
//! carry `co_localsplusnames`/`co_localspluskinds` and `localsplus` slots — stored as the build
//! stores them (3.14+: `_PyStackRef`s, some with the borrowed bit, NULL as 1). The tests check
//! every flavor against the `repr()` CPython gives for the same values.

use super::testimage::{CodeSpec, ImageBuilder};

/// `CO_FAST_*` kinds (`Include/internal/pycore_code.h`).
pub const LOCAL: u8 = 0x20;
pub const CELL: u8 = 0x40;
pub const FREE: u8 = 0x80;
pub const HIDDEN: u8 = 0x10;

impl ImageBuilder {
    /// An `int` from its sign and base-2^30 digits (least significant first).
    pub fn big_int(&mut self, negative: bool, digits: &[u32]) -> u64 {
        let l = self.layout.long.clone();
        let a = self.object(l.ob_digit + 4 * digits.len().max(1) as u64, self.types.int);
        let sign = if digits.is_empty() {
            1
        } else if negative {
            2
        } else {
            0
        };
        let n = digits.len() as u64;
        let word = match l.form {
            super::layout::LongForm::Tag => (n << 3) | sign,
            // ≤ 3.11 `ob_size`: the digit count, negated for a negative number.
            super::layout::LongForm::SignedSize if negative => n.wrapping_neg(),
            super::layout::LongForm::SignedSize => n,
        };
        self.w64(a + l.lv_tag, word);
        for (i, d) in digits.iter().enumerate() {
            self.w32(a + l.ob_digit + 4 * i as u64, *d);
        }
        a
    }

    pub fn small_int(&mut self, v: i64) -> u64 {
        let mut digits = Vec::new();
        let mut x = v.unsigned_abs();
        while x != 0 {
            digits.push((x & 0x3fff_ffff) as u32);
            x >>= 30;
        }
        self.big_int(v < 0, &digits)
    }

    pub fn float_object(&mut self, x: f64) -> u64 {
        let off = self.layout.values.float_value;
        let a = self.object(off + 8, self.types.float);
        self.w64(a + off, x.to_bits());
        a
    }

    pub fn tuple_object(&mut self, items: &[u64]) -> u64 {
        let v = self.layout.values.clone();
        let a = self.object(v.tuple_item + 8 * items.len() as u64, self.types.tuple);
        self.w64(a + v.var_size, items.len() as u64);
        for (i, it) in items.iter().enumerate() {
            self.w64(a + v.tuple_item + 8 * i as u64, *it);
        }
        a
    }

    pub fn list_object(&mut self, items: &[u64]) -> u64 {
        let v = self.layout.values.clone();
        let a = self.object(v.list_item + 16, self.types.list);
        self.w64(a + v.var_size, items.len() as u64);
        if !items.is_empty() {
            let arr = self.alloc(8 * items.len() as u64);
            for (i, it) in items.iter().enumerate() {
                self.w64(arr + 8 * i as u64, *it);
            }
            self.w64(a + v.list_item, arr);
        }
        a
    }

    /// A combined-table dict with general keys.
    pub fn dict_of(&mut self, items: &[(u64, u64)]) -> u64 {
        self.dict_object(0, items)
    }

    /// A set (or frozenset) whose table holds `items` in order, with a deleted slot (the dummy
    /// key, hash -1) and empty slots between them.
    pub fn set_of(&mut self, frozen: bool, items: &[u64]) -> u64 {
        let v = self.layout.values.clone();
        let ty = if frozen {
            self.types.frozenset
        } else {
            self.types.set
        };
        let a = self.object(v.set_table + 8, ty);
        let slots = (2 * items.len() + 2).next_power_of_two() as u64;
        let table = self.alloc(16 * slots);
        let dummy = self.small_int(0);
        self.w64(table, dummy);
        self.w64(table + 8, u64::MAX); // hash -1
        for (i, it) in items.iter().enumerate() {
            let slot = table + 16 * (2 * i as u64 + 1);
            self.w64(slot, *it);
            self.w64(slot + 8, 0x1234 + i as u64);
        }
        self.w64(a + v.set_used, items.len() as u64);
        self.w64(a + v.set_mask, slots - 1);
        self.w64(a + v.set_table, table);
        a
    }

    pub fn cell_object(&mut self, content: u64) -> u64 {
        let off = self.layout.values.cell_ref;
        let a = self.object(off + 8, self.types.cell);
        self.w64(a + off, content);
        a
    }

    /// An instance of a new heap type called `type_name`.
    pub fn instance(&mut self, type_name: &str) -> u64 {
        let ty = self.alloc(self.layout.types.ht_cached_keys + 8);
        self.set_type_name(ty, type_name);
        self.object(self.layout.object.header_size + 16, ty)
    }

    pub fn true_obj(&self) -> u64 {
        self.true_
    }

    pub fn false_obj(&self) -> u64 {
        self.false_
    }

    pub fn none_obj(&self) -> u64 {
        self.none
    }

    /// A code object with local names and kinds, and its argument counts and flags.
    pub fn code_with_locals(
        &mut self,
        spec: &CodeSpec<'_>,
        locals: &[(&str, u8)],
        (argcount, kwonly, flags): (u32, u32, u32),
    ) -> u64 {
        let code = self.code(spec);
        let names: Vec<u64> = locals.iter().map(|(n, _)| self.str_object(n)).collect();
        let kinds: Vec<u8> = locals.iter().map(|(_, k)| *k).collect();
        let (names, kinds) = (self.tuple_object(&names), self.bytes_object(&kinds));
        let c = self.layout.code.clone();
        let (Some(names_at), Some(kinds_at)) = (c.localsplusnames, c.localspluskinds) else {
            panic!("{:?} has no co_localsplusnames", self.layout.version);
        };
        self.w64(code + names_at, names);
        self.w64(code + kinds_at, kinds);
        self.w32(code + c.argcount, argcount);
        self.w32(code + c.kwonlyargcount, kwonly);
        self.w32(code + c.flags, flags);
        code
    }

    /// Up to 3.10: a code object whose locals are named by `co_varnames`, `co_cellvars` and
    /// `co_freevars`.
    pub fn code_with_classic_locals(
        &mut self,
        spec: &CodeSpec<'_>,
        (var, cell, free): (&[&str], &[&str], &[&str]),
        (argcount, kwonly, flags): (u32, u32, u32),
    ) -> u64 {
        let code = self.code(spec);
        let c = self.layout.code.clone();
        let (Some(v_at), Some(c_at), Some(f_at)) = (c.varnames, c.cellvars, c.freevars) else {
            panic!("{:?} has no co_varnames", self.layout.version);
        };
        for (at, names) in [(v_at, var), (c_at, cell), (f_at, free)] {
            let strs: Vec<u64> = names.iter().map(|n| self.str_object(n)).collect();
            let t = self.tuple_object(&strs);
            self.w64(code + at, t);
        }
        self.w32(code + c.argcount, argcount);
        self.w32(code + c.kwonlyargcount, kwonly);
        self.w32(code + c.flags, flags);
        code
    }

    /// How a build stores an object reference in a `localsplus` slot (`borrowed` sets the
    /// stackref bit 0 on 3.14+); `None` is NULL.
    pub fn slot(&self, obj: Option<u64>, borrowed: bool) -> u64 {
        let stackrefs = self.layout.frame.stackref_tag_mask != 0;
        match obj {
            None if stackrefs => 1,
            None => 0,
            Some(o) => o | u64::from(stackrefs && borrowed),
        }
    }

    /// A frame running `code` at code unit `unit` whose `localsplus` holds `slots` (raw bits).
    pub fn frame_with_locals(&mut self, code: u64, unit: u64, previous: u64, slots: &[u64]) -> u64 {
        let top = self.frame(code, unit, previous);
        let f = self.layout.frame.clone();
        // Move the frame into a block big enough for its slots.
        let size = f.localsplus + 8 * slots.len() as u64;
        let a = self.alloc(size + 16);
        let bytes = self
            .mem
            .bytes_mut(top, f.size as usize)
            .expect("the frame just built")
            .to_vec();
        self.write(a, &bytes);
        for (i, s) in slots.iter().enumerate() {
            self.w64(a + f.localsplus + 8 * i as u64, *s);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::code::{CodeCache, Ctx};
    use crate::python::errors::{ErrorCounts, ErrorKind};
    use crate::python::locals::{Local, frame_locals};
    use crate::python::testimage::Flavor;
    use crate::python::values::{ValueLimits, render};

    fn rendered(b: &ImageBuilder, addr: u64, limits: ValueLimits) -> (String, ErrorCounts) {
        let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &layout,
            target: &target,
        };
        let mut counts = ErrorCounts::default();
        (render(ctx, addr, limits, &mut counts), counts)
    }

    /// Every value kind, on every flavor; the expected strings are CPython's `repr()`.
    #[test]
    #[allow(
        clippy::many_single_char_names,
        reason = "short names mirror the Python values"
    )]
    fn values_render_as_python_repr_on_every_flavor() {
        for flavor in Flavor::ALL {
            let mut b = ImageBuilder::new(flavor);
            let mut cases: Vec<(u64, String)> = Vec::new();
            let none = b.none_obj();
            cases.push((none, "None".into()));
            cases.push((b.true_obj(), "True".into()));
            cases.push((b.false_obj(), "False".into()));
            let i = b.small_int(-42);
            cases.push((i, "-42".into()));
            let zero = b.small_int(0);
            cases.push((zero, "0".into()));
            // 2**200
            let mut d = vec![0u32; 6];
            d.push(1 << 20);
            let big = b.big_int(false, &d);
            cases.push((
                big,
                "1606938044258990275541962092341162602522202993782792835301376".into(),
            ));
            let f = b.float_object(1e16);
            cases.push((f, "1e+16".into()));
            let f2 = b.float_object(-0.0);
            cases.push((f2, "-0.0".into()));
            let s = b.str_object("it's «ü» 🐍\n");
            cases.push((s, "\"it's «ü» 🐍\\n\"".into()));
            let by = b.bytes_object(b"\x00ab'");
            cases.push((by, "b\"\\x00ab'\"".into()));
            let one = b.small_int(1);
            let t1 = b.tuple_object(&[one]);
            cases.push((t1, "(1,)".into()));
            let empty_t = b.tuple_object(&[]);
            cases.push((empty_t, "()".into()));
            let l = b.list_object(&[one, s, none]);
            cases.push((l, "[1, \"it's «ü» 🐍\\n\", None]".into()));
            let empty_l = b.list_object(&[]);
            cases.push((empty_l, "[]".into()));
            let k = b.str_object("k");
            let inner = b.list_object(&[one, t1]);
            let deep = b.list_object(&[inner]);
            let d = b.dict_of(&[(k, deep), (one, f)]);
            cases.push((d, "{'k': [[...]], 1: 1e+16}".into()));
            let nested = b.tuple_object(&[inner, one]);
            cases.push((nested, "([1, (...)], 1)".into()));
            let nums: Vec<u64> = (0..10).map(|v| b.small_int(v)).collect();
            let long = b.list_object(&nums);
            cases.push((long, "[0, 1, 2, 3, 4, 5, 6, 7, ...]".into()));
            let set = b.set_of(false, &nums[..3]);
            cases.push((set, "{0, 1, 2}".into()));
            let fs = b.set_of(true, &nums[..2]);
            cases.push((fs, "frozenset({0, 1})".into()));
            let empty_set = b.set_of(false, &[]);
            cases.push((empty_set, "set()".into()));
            let obj = b.instance("Widget");
            cases.push((obj, format!("<Widget object at {obj:#x}>")));
            let hostile = b.instance("Bad\x1b[2J");
            cases.push((hostile, format!("<Bad?[2J object at {hostile:#x}>")));
            for (addr, want) in cases {
                let (got, counts) = rendered(&b, addr, ValueLimits::default());
                assert_eq!(got, want, "{flavor:?}");
                assert_eq!(counts.total(), 0, "{flavor:?} {want}");
            }
        }
    }

    #[test]
    fn values_are_bounded_and_failures_counted() {
        let mut b = ImageBuilder::new(Flavor::V313);
        let long = b.str_object(&"x".repeat(10_000));
        let limits = ValueLimits {
            max_len: 20,
            ..ValueLimits::default()
        };
        let (got, _) = rendered(&b, long, limits);
        assert_eq!(got, format!("'{}...", "x".repeat(16)));
        assert_eq!(got.chars().count(), 20);
        // An item that points nowhere: the item is <unreadable>, the rest is shown.
        let one = b.small_int(1);
        let l = b.list_object(&[one, 0x10, one]);
        let (got, counts) = rendered(&b, l, ValueLimits::default());
        assert_eq!(got, "[1, <unreadable>, 1]");
        assert_eq!(counts.get(ErrorKind::ValueUnreadable), 1);
        let (got, counts) = rendered(&b, 0xdead_0000, ValueLimits::default());
        assert_eq!(got, "<unreadable>");
        assert_eq!(counts.get(ErrorKind::ValueUnreadable), 1);
    }

    fn locals_of(b: &ImageBuilder, frame: u64, code: u64) -> (Vec<Local>, ErrorCounts) {
        let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
        let ctx = Ctx {
            mem: &mem,
            layout: &layout,
            target: &target,
        };
        let (mut codes, mut counts) = (CodeCache::default(), ErrorCounts::default());
        let l = frame_locals(
            ctx,
            &mut codes,
            frame,
            code,
            ValueLimits::default(),
            &mut counts,
        );
        (l, counts)
    }

    /// Arguments (positional, keyword-only, *args, **kwargs), a local, an unbound local, a cell
    /// variable before and after MAKE_CELL, a free variable, an empty cell and a hidden local.
    #[test]
    fn frame_locals_on_every_flavor() {
        // ≤ 3.10 name locals by `co_varnames`/`co_cellvars`/`co_freevars`: not read (refused).
        for flavor in Flavor::ALL.into_iter().filter(|f| {
            ImageBuilder::new(*f)
                .layout()
                .code
                .localsplusnames
                .is_some()
        }) {
            let mut b = ImageBuilder::new(flavor);
            let code = b.code_with_locals(
                &CodeSpec::simple("f", "/a.py", 1, &[(1, 4)]),
                &[
                    ("a", LOCAL),
                    ("kw", LOCAL | CELL),
                    ("args", LOCAL),
                    ("kwargs", LOCAL),
                    ("x", LOCAL),
                    ("unset", LOCAL),
                    ("c", CELL),
                    ("fresh", CELL),
                    ("free", FREE),
                    ("empty", CELL),
                    ("hidden", LOCAL | HIDDEN),
                    ("données", LOCAL),
                ],
                (1, 1, 0x4 | 0x8),
            );
            let one = b.small_int(1);
            let kw_cell = {
                let s = b.str_object("kw");
                b.cell_object(s)
            };
            let args = b.tuple_object(&[one]);
            let kwargs = b.dict_of(&[]);
            let x = b.float_object(2.5);
            let c = {
                let t = b.tuple_object(&[]);
                b.cell_object(t)
            };
            let fresh = b.small_int(7);
            let free = {
                let l = b.list_object(&[one]);
                b.cell_object(l)
            };
            let empty = b.cell_object(0);
            let fr = b.str_object("é");
            let slots = [
                b.slot(Some(one), true),
                b.slot(Some(kw_cell), false),
                b.slot(Some(args), false),
                b.slot(Some(kwargs), false),
                b.slot(Some(x), false),
                b.slot(None, false),
                b.slot(Some(c), false),
                b.slot(Some(fresh), false),
                b.slot(Some(free), true),
                b.slot(Some(empty), false),
                b.slot(None, false),
                b.slot(Some(fr), false),
            ];
            let frame = b.frame_with_locals(code, 1, 0, &slots);
            let (got, counts) = locals_of(&b, frame, code);
            let got: Vec<(&str, bool, &str)> = got
                .iter()
                .map(|l| (l.name.as_str(), l.arg, l.value.as_str()))
                .collect();
            assert_eq!(
                got,
                [
                    ("a", true, "1"),
                    ("kw", true, "'kw'"),
                    ("args", true, "(1,)"),
                    ("kwargs", true, "{}"),
                    ("x", false, "2.5"),
                    ("unset", false, "<unbound>"),
                    ("c", false, "()"),
                    ("fresh", false, "7"),
                    ("free", false, "[1]"),
                    ("empty", false, "<unbound>"),
                    ("données", false, "'é'"),
                ],
                "{flavor:?}"
            );
            assert_eq!(counts.total(), 0, "{flavor:?}");
        }
    }

    /// Up to 3.10: `f_localsplus` holds `co_varnames`, then the cells of `co_cellvars`, then
    /// those of `co_freevars`; an argument that is also a cell variable (`kw`) had its own slot
    /// cleared when its cell was made, and is shown once, as an argument, from its cell.
    #[test]
    fn classic_frame_locals_3_8_to_3_10() {
        for flavor in [Flavor::V38, Flavor::V39, Flavor::V310] {
            let mut b = ImageBuilder::new(flavor);
            let code = b.code_with_classic_locals(
                &CodeSpec::simple("f", "/a.py", 1, &[(1, 4)]),
                (&["a", "kw", "x", "unset"], &["kw", "c"], &["fr"]),
                (2, 0, 0),
            );
            let one = b.small_int(1);
            let x = b.float_object(2.5);
            let kw = {
                let s = b.str_object("kw");
                b.cell_object(s)
            };
            let c = {
                let t = b.tuple_object(&[]);
                b.cell_object(t)
            };
            let fr = {
                let l = b.list_object(&[one]);
                b.cell_object(l)
            };
            let frame = b.frame_with_locals(code, 1, 0, &[one, 0, x, 0, kw, c, fr]);
            let (got, counts) = locals_of(&b, frame, code);
            let got: Vec<(&str, bool, &str)> = got
                .iter()
                .map(|l| (l.name.as_str(), l.arg, l.value.as_str()))
                .collect();
            assert_eq!(
                got,
                [
                    ("a", true, "1"),
                    ("kw", true, "'kw'"),
                    ("x", false, "2.5"),
                    ("unset", false, "<unbound>"),
                    ("c", false, "()"),
                    ("fr", false, "[1]"),
                ],
                "{flavor:?}"
            );
            assert_eq!(counts.total(), 0, "{flavor:?}");
        }
    }

    #[test]
    fn tagged_ints_in_stackref_slots() {
        let mut b = ImageBuilder::new(Flavor::V314);
        let code = b.code_with_locals(
            &CodeSpec::simple("g", "/a.py", 1, &[(1, 2)]),
            &[("i", LOCAL), ("j", LOCAL)],
            (0, 0, 0),
        );
        let frame = b.frame_with_locals(code, 0, 0, &[(5 << 2) | 3, ((-3i64 << 2) | 3) as u64]);
        let (got, _) = locals_of(&b, frame, code);
        assert_eq!(got[0].value, "5");
        assert_eq!(got[1].value, "-3");
    }

    #[test]
    fn unreadable_locals_are_counted() {
        let mut b = ImageBuilder::new(Flavor::V313);
        let code = b.code_with_locals(
            &CodeSpec::simple("g", "/a.py", 1, &[(1, 2)]),
            &[("i", LOCAL)],
            (0, 0, 0),
        );
        // A frame whose slots are outside any object.
        let (got, counts) = locals_of(&b, 0x10, code);
        assert!(got.is_empty());
        assert_eq!(counts.get(ErrorKind::LocalsUnreadable), 1);
    }
}
