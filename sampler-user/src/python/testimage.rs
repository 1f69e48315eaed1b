//! Synthetic memory images of a CPython process, for unit, property and fuzz tests.
//!
//! Owns: [`ImageBuilder`], which lays out a runtime, its `_Py_DebugOffsets`, an interpreter,
//! thread states, frames (with owners, stackref tags and 3.15's base frame), code objects with
//! location tables and thread-local bytecode copies, `str`/`bytes` objects of every kind, and
//! `threading._active` with `Thread` instances — all from a [`RuntimeLayout`], so the same
//! offsets drive the builder and the reader. [`Flavor`]s carry the documented debug-offset values
//! (docs/cpython-layouts.md §2: 3.13.0, 3.13.15t, 3.14.10, 3.14t from v3.14.0 headers, 3.15.2).
//! Input: a flavor and calls describing the process. Output: an [`ImageMemory`] + layout + target.
//! Constraints: each object is its own region with a gap after it, so a reader that reads past
//! an object faults here (stricter than a real heap). Faithfulness to real interpreters is
//! checked by `live_tests::builder_matches_live_*`.

use super::code::Target;
use super::layout::{
    DEBUG_COOKIE, DictKeys, GilAt, InstrKind, LineTableKind, ManagedDict, PyVersion, RuntimeLayout,
};
use super::linetable::{LineTableWriter, encode_lnotab, encode_pep626};
use super::memory::ImageMemory;
use super::objects::{Known, KnownObjects};
use super::tables::{FIELDS_313, FIELDS_314, FIELDS_315};
use super::testvalues::{
    COMMON_313, V313_VALUES, V313T_VALUES, V314_VALUES, V314T_VALUES, V315_VALUES,
};
use super::unicode::StrState;

/// Documented values of one interpreter build.
pub struct FlavorData {
    pub name: &'static str,
    pub hex: u64,
    pub ft: bool,
    pub fields: &'static [&'static str],
    pub values: &'static [(&'static str, u64)],
}

/// Which interpreter build an image imitates.
#[derive(Clone, Copy)]
pub struct Flavor(pub &'static FlavorData);

impl std::fmt::Debug for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

impl Flavor {
    pub const V38: Flavor = Flavor(&FlavorData {
        name: "3.8",
        hex: 0x0308_12f0,
        ft: false,
        fields: &[],
        values: &[],
    });
    pub const V39: Flavor = Flavor(&FlavorData {
        name: "3.9",
        hex: 0x0309_12f0,
        ft: false,
        fields: &[],
        values: &[],
    });
    pub const V310: Flavor = Flavor(&FlavorData {
        name: "3.10",
        hex: 0x030a_0df0,
        ft: false,
        fields: &[],
        values: &[],
    });
    pub const V311: Flavor = Flavor(&FlavorData {
        name: "3.11",
        hex: 0x030b_07f0,
        ft: false,
        fields: &[],
        values: &[],
    });
    pub const V312: Flavor = Flavor(&FlavorData {
        name: "3.12",
        hex: 0x030c_01f0,
        ft: false,
        fields: &[],
        values: &[],
    });
    pub const V313: Flavor = Flavor(&FlavorData {
        name: "3.13",
        hex: 0x030d_00f0,
        ft: false,
        fields: FIELDS_313,
        values: V313_VALUES,
    });
    pub const V313T: Flavor = Flavor(&FlavorData {
        name: "3.13t",
        hex: 0x030d_0ff0,
        ft: true,
        fields: FIELDS_313,
        values: V313T_VALUES,
    });
    pub const V314: Flavor = Flavor(&FlavorData {
        name: "3.14",
        hex: 0x030e_0af0,
        ft: false,
        fields: FIELDS_314,
        values: V314_VALUES,
    });
    pub const V314T: Flavor = Flavor(&FlavorData {
        name: "3.14t",
        hex: 0x030e_00f0,
        ft: true,
        fields: FIELDS_314,
        values: V314T_VALUES,
    });
    pub const V315: Flavor = Flavor(&FlavorData {
        name: "3.15",
        hex: 0x030f_02f0,
        ft: false,
        fields: FIELDS_315,
        values: V315_VALUES,
    });
    pub const ALL: [Flavor; 10] = [
        Flavor::V38,
        Flavor::V39,
        Flavor::V310,
        Flavor::V311,
        Flavor::V312,
        Flavor::V313,
        Flavor::V313T,
        Flavor::V314,
        Flavor::V314T,
        Flavor::V315,
    ];

    pub fn is_ft(self) -> bool {
        self.0.ft
    }

    pub fn version(self) -> PyVersion {
        PyVersion::from_hex(self.0.hex, self.0.ft)
    }

    /// The value the documentation gives for a debug-offsets field (0 when it gives none).
    pub fn value(self, name: &str) -> u64 {
        let common = if self.0.fields.len() == FIELDS_313.len() {
            COMMON_313
        } else {
            &[]
        };
        self.0
            .values
            .iter()
            .chain(common)
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }
}

/// The `_Py_DebugOffsets` bytes of a flavor (cookie, version, free_threaded, field values).
pub fn debug_offsets_bytes(minor: u8, ft: bool) -> Vec<u8> {
    let flavor = Flavor::ALL
        .into_iter()
        .find(|f| f.version().minor == minor && f.is_ft() == ft)
        .expect("a known flavor");
    let mut out = DEBUG_COOKIE.to_vec();
    out.extend(flavor.0.hex.to_le_bytes());
    out.extend(u64::from(ft).to_le_bytes());
    for name in flavor.0.fields {
        out.extend(flavor.value(name).to_le_bytes());
    }
    out
}

/// A code object to lay out: `lines` are (line, code units) runs, in bytecode order.
pub struct CodeSpec<'a> {
    pub qualname: &'a str,
    pub filename: &'a str,
    pub firstlineno: i32,
    pub lines: &'a [(i32, u8)],
}

impl<'a> CodeSpec<'a> {
    pub fn simple(
        qualname: &'a str,
        filename: &'a str,
        firstlineno: i32,
        lines: &'a [(i32, u8)],
    ) -> CodeSpec<'a> {
        CodeSpec {
            qualname,
            filename,
            firstlineno,
            lines,
        }
    }
}

const IMAGE_BASE: u64 = 0x40_0000;
const HEAP_BASE: u64 = 0x7f00_0000_0000;
/// Unmapped bytes after every object.
const GAP: u64 = 0x40;
const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
/// `tid` in the synthetic images' `struct pthread` (glibc 2.3x on x86-64 has it @0x2d0; the
/// reader takes whatever the target's descriptor says).
pub const PTHREAD_TID: u64 = 0x2d0;

/// Builds a synthetic process image; see the module header.
pub struct ImageBuilder {
    pub(super) layout: RuntimeLayout,
    pub(super) mem: ImageMemory,
    image_next: u64,
    heap_next: u64,
    runtime: u64,
    interp: u64,
    pub(super) types: Types,
    pub(super) none: u64,
    pub(super) true_: u64,
    pub(super) false_: u64,
}

/// Addresses of the type objects the reader compares against.
pub(super) struct Types {
    pub code: u64,
    /// `PyFrame_Type` (≤ 3.10 frames are objects of it).
    pub frame: u64,
    pub str_: u64,
    pub bytes: u64,
    pub int: u64,
    pub dict: u64,
    pub module: u64,
    pub bool_: u64,
    pub float: u64,
    pub list: u64,
    pub tuple: u64,
    pub set: u64,
    pub frozenset: u64,
    pub cell: u64,
}

impl ImageBuilder {
    pub fn new(flavor: Flavor) -> ImageBuilder {
        let version = flavor.version();
        let dbg = if flavor.0.fields.is_empty() {
            Vec::new()
        } else {
            debug_offsets_bytes(version.minor, version.free_threaded)
        };
        let layout = RuntimeLayout::build(version, &dbg).expect("documented layouts are valid");
        let mut b = ImageBuilder {
            layout,
            mem: ImageMemory::new(),
            image_next: IMAGE_BASE,
            heap_next: HEAP_BASE,
            runtime: 0,
            interp: 0,
            types: Types {
                code: 0,
                frame: 0,
                str_: 0,
                bytes: 0,
                int: 0,
                dict: 0,
                module: 0,
                bool_: 0,
                float: 0,
                list: 0,
                tuple: 0,
                set: 0,
                frozenset: 0,
                cell: 0,
            },
            none: 0,
            true_: 0,
            false_: 0,
        };
        b.runtime = b.alloc_image(b.layout.runtime.size);
        if !dbg.is_empty() {
            b.write(b.runtime, &dbg);
        }
        let ty = |b: &mut ImageBuilder| b.alloc_image(b.layout.types.ht_cached_keys + 8);
        b.types = Types {
            code: ty(&mut b),
            frame: ty(&mut b),
            str_: ty(&mut b),
            bytes: ty(&mut b),
            int: ty(&mut b),
            dict: ty(&mut b),
            module: ty(&mut b),
            bool_: ty(&mut b),
            float: ty(&mut b),
            list: ty(&mut b),
            tuple: ty(&mut b),
            set: ty(&mut b),
            frozenset: ty(&mut b),
            cell: ty(&mut b),
        };
        b.name_types();
        b.none = b.alloc_image(b.layout.object.header_size);
        // `True`/`False`: static ints of the bool type, with one digit.
        for value in [1u32, 0] {
            let l = b.layout.long.clone();
            let a = b.alloc_image(l.ob_digit + 4);
            b.w64(a + b.layout.object.ob_type, b.types.bool_);
            b.w64(a + l.lv_tag, (1 << 3) | u64::from(value == 0));
            b.w32(a + l.ob_digit, value);
            if value == 1 {
                b.true_ = a;
            } else {
                b.false_ = a;
            }
        }
        b.interp = b.alloc(b.layout.interp.size);
        b.w64(b.runtime + b.layout.runtime.interpreters_head, b.interp);
        // `ceval.gil` points at the embedded `_gil`; a free-threaded GIL starts disabled.
        if let GilAt::Interpreter {
            ceval_gil,
            embedded,
        } = b.layout.gil.at
        {
            b.w64(b.interp + ceval_gil, b.interp + embedded);
        }
        b
    }

    pub fn layout(&self) -> &RuntimeLayout {
        &self.layout
    }

    pub fn memory(&self) -> ImageMemory {
        self.mem.clone()
    }

    pub fn runtime_addr(&self) -> u64 {
        self.runtime
    }

    pub fn interp_addr(&self) -> u64 {
        self.interp
    }

    pub fn target(&self) -> Target {
        let t = &self.types;
        let mut known = KnownObjects::default();
        for (k, addr) in [
            (Known::None, self.none),
            (Known::True, self.true_),
            (Known::False, self.false_),
            (Known::Int, t.int),
            (Known::Bool, t.bool_),
            (Known::Float, t.float),
            (Known::Str, t.str_),
            (Known::Bytes, t.bytes),
            (Known::List, t.list),
            (Known::Tuple, t.tuple),
            (Known::Dict, t.dict),
            (Known::Set, t.set),
            (Known::FrozenSet, t.frozenset),
            (Known::Cell, t.cell),
        ] {
            known.set(k, addr);
        }
        Target {
            pid: 0,
            runtime: self.runtime,
            pthread_tid: Some(PTHREAD_TID),
            pycode_type: Some(self.types.code),
            pyframe_type: self.layout.frame.is_object.then_some(self.types.frame),
            image: vec![(IMAGE_BASE, self.image_next)],
            known,
        }
    }

    /// Gives every built-in type object its C `tp_name`.
    fn name_types(&mut self) {
        let t = &self.types;
        let named = [
            (t.code, "code"),
            (t.frame, "frame"),
            (t.str_, "str"),
            (t.bytes, "bytes"),
            (t.int, "int"),
            (t.dict, "dict"),
            (t.module, "module"),
            (t.bool_, "bool"),
            (t.float, "float"),
            (t.list, "list"),
            (t.tuple, "tuple"),
            (t.set, "set"),
            (t.frozenset, "frozenset"),
            (t.cell, "cell"),
        ];
        for (ty, name) in named {
            self.set_type_name(ty, name);
        }
    }

    /// Writes `name` as a C string and points `tp_name` of `ty` at it.
    pub fn set_type_name(&mut self, ty: u64, name: &str) {
        let s = self.alloc_image(name.len() as u64 + 1);
        self.write(s, name.as_bytes());
        self.w64(ty + self.layout.types.tp_name, s);
    }

    fn alloc_in(next: &mut u64, mem: &mut ImageMemory, size: u64) -> u64 {
        let addr = *next;
        mem.insert(addr, vec![0u8; size as usize]);
        *next = (addr + size + GAP + 15) & !15;
        addr
    }

    /// A zeroed heap object of `size` bytes.
    pub fn alloc(&mut self, size: u64) -> u64 {
        Self::alloc_in(&mut self.heap_next, &mut self.mem, size)
    }

    /// A zeroed object inside the interpreter's ELF image (static objects).
    pub fn alloc_image(&mut self, size: u64) -> u64 {
        Self::alloc_in(&mut self.image_next, &mut self.mem, size)
    }

    pub fn write(&mut self, addr: u64, bytes: &[u8]) {
        self.mem
            .bytes_mut(addr, bytes.len())
            .unwrap_or_else(|| panic!("write outside an object at {addr:#x}"))
            .copy_from_slice(bytes);
    }

    pub fn w64(&mut self, addr: u64, v: u64) {
        self.write(addr, &v.to_le_bytes());
    }

    pub fn w32(&mut self, addr: u64, v: u32) {
        self.write(addr, &v.to_le_bytes());
    }

    pub(super) fn object(&mut self, size: u64, ty: u64) -> u64 {
        let a = self.alloc(size);
        self.w64(a + self.layout.object.ob_type, ty);
        a
    }

    /// A compact `str` (ASCII, or kind 1/2/4 by its widest character).
    pub fn str_object(&mut self, s: &str) -> u64 {
        let (kind, ascii, data) = encode_str(s);
        let u = self.layout.unicode.clone();
        let head = if ascii { u.ascii_size } else { u.compact_size };
        let a = self.object(head + data.len() as u64 + kind, self.types.str_);
        self.w64(a + u.length, s.chars().count() as u64);
        let st = StrState {
            kind: kind as u32,
            compact: true,
            ascii,
        }
        .encode(&self.layout);
        self.w32(a + u.state, st);
        self.write(a + head, &data);
        a
    }

    /// A legacy (non-compact) `str` whose characters live in a separate buffer.
    pub fn legacy_str_object(&mut self, s: &str) -> u64 {
        let (kind, ascii, data) = encode_str(s);
        let u = self.layout.unicode.clone();
        let a = self.object(u.compact_size + 8, self.types.str_);
        self.w64(a + u.length, s.chars().count() as u64);
        let st = StrState {
            kind: kind as u32,
            compact: false,
            ascii,
        }
        .encode(&self.layout);
        self.w32(a + u.state, st);
        let buf = self.alloc(data.len() as u64 + kind);
        self.write(buf, &data);
        self.w64(a + u.compact_size, buf);
        a
    }

    pub fn bytes_object(&mut self, data: &[u8]) -> u64 {
        let b = self.layout.bytes.clone();
        let a = self.object(b.ob_sval + data.len() as u64 + 1, self.types.bytes);
        self.w64(a + b.ob_size, data.len() as u64);
        self.write(a + b.ob_sval, data);
        a
    }

    /// A code object; its bytecode units are filled with a recognisable pattern.
    pub fn code(&mut self, spec: &CodeSpec<'_>) -> u64 {
        let runs: Vec<(i32, u32)> = spec
            .lines
            .iter()
            .map(|&(line, units)| (line, 2 * u32::from(units)))
            .collect();
        let table = match self.layout.code.linetable_kind {
            LineTableKind::Locations => {
                let mut w = LineTableWriter::new(spec.firstlineno);
                for &(line, units) in spec.lines {
                    w.entry(line, units);
                }
                w.bytes
            }
            LineTableKind::Pep626 => encode_pep626(spec.firstlineno, &runs),
            LineTableKind::Lnotab => encode_lnotab(spec.firstlineno, &runs),
        };
        let units: u64 = spec.lines.iter().map(|&(_, u)| u64::from(u)).sum();
        self.code_raw(
            spec.qualname,
            spec.filename,
            spec.firstlineno,
            &table,
            units,
            false,
        )
    }

    /// A code object from raw parts; `in_image` places it in the interpreter's image.
    pub fn code_raw(
        &mut self,
        qualname: &str,
        filename: &str,
        firstlineno: i32,
        table: &[u8],
        units: u64,
        in_image: bool,
    ) -> u64 {
        let c = self.layout.code.clone();
        let (qual, file, table) = (
            self.str_object(qualname),
            self.str_object(filename),
            self.bytes_object(table),
        );
        let size = match c.code_adaptive {
            Some(inline) => inline + 2 * units.max(1),
            None => c.size,
        };
        let a = if in_image {
            self.alloc_image(size)
        } else {
            self.alloc(size)
        };
        self.w64(a + self.layout.object.ob_type, self.types.code);
        match c.co_code {
            // ≤ 3.10: the bytecode is a separate `bytes` object.
            Some(co_code) => {
                let bytecode = self.bytes_object(&vec![0x64; 2 * units.max(1) as usize]);
                self.w64(a + co_code, bytecode);
            }
            None => self.w64(a + c.ob_size, units),
        }
        if let Some(q) = c.qualname {
            self.w64(a + q, qual);
        }
        self.w64(a + c.name, qual);
        self.w64(a + c.filename, file);
        self.w64(a + c.linetable, table);
        self.w32(a + c.firstlineno, firstlineno as u32);
        if let Some(tlbc) = c.tlbc {
            // `_PyCodeArray { size = 1, entries[0] = co_code_adaptive }`.
            let arr = self.alloc(c.tlbc_entries + 8);
            self.w64(arr, 1);
            self.w64(arr + c.tlbc_entries, a + c.code_adaptive.unwrap_or(0));
            self.w64(a + tlbc, arr);
        }
        a
    }

    /// The `__init__` shim's static code object (`_Py_InitCleanup`).
    pub fn init_shim_code(&mut self) -> u64 {
        self.code_raw("__init__", "__init__", 0, &[0xfb], 2, true)
    }

    /// Gives `code` thread-local bytecode copies up to `index`; returns the copy's base.
    pub fn tlbc_copy(&mut self, code: u64, index: u64) -> u64 {
        let c = self.layout.code.clone();
        let tlbc = c.tlbc.expect("a free-threaded 3.14+ layout");
        let units = self.mem_u64(code + c.ob_size);
        let arr = self.alloc(c.tlbc_entries + 8 * (index + 1));
        self.w64(arr, index + 1);
        self.w64(arr + c.tlbc_entries, code + c.code_adaptive.unwrap_or(0));
        let copy = self.alloc(2 * units);
        self.w64(arr + c.tlbc_entries + 8 * index, copy);
        self.w64(code + tlbc, arr);
        copy
    }

    pub(super) fn mem_u64(&mut self, addr: u64) -> u64 {
        let b = self.mem.bytes_mut(addr, 8).expect("inside an object");
        u64::from_le_bytes(b.try_into().unwrap_or_default())
    }

    /// `f_executable` as the build stores it: free-threaded 3.14+ tags every code reference
    /// (deferred refcount bit), default builds store plain pointers.
    fn exec_bits(&self, code: u64) -> u64 {
        let tagged = self.layout.frame.stackref_tag_mask != 0 && self.layout.version.free_threaded;
        code | u64::from(tagged)
    }

    /// A frame executing `code` at code unit `unit` (or any raw `exec` bits via `frame_raw`).
    pub fn frame(&mut self, code: u64, unit: u64, previous: u64) -> u64 {
        let bits = self.exec_bits(code);
        let instr = self.instr_value(code, unit);
        self.frame_raw(bits, instr, 0, previous, 0)
    }

    /// What a frame of `code` at code unit `unit` stores at `instr_ptr`: a pointer into the
    /// bytecode, or ≤ 3.10 the word `f_lasti` (bytes or units) | `f_lineno` (garbage unless
    /// tracing: the reader must ignore it) << 32.
    pub fn instr_value(&self, code: u64, unit: u64) -> u64 {
        match self.layout.frame.instr {
            InstrKind::Lasti { unit_bytes } => {
                let lasti = unit * 2 / u64::from(unit_bytes);
                lasti | 0x7777 << 32
            }
            InstrKind::PrevInstr | InstrKind::InstrPtr => {
                code + self.layout.code.code_adaptive.unwrap_or(0) + 2 * unit
            }
        }
    }

    /// A frame whose `instr_ptr` points into the thread-local copy `index`.
    pub fn tlbc_frame(
        &mut self,
        code: u64,
        copy_base: u64,
        index: i32,
        unit: u64,
        previous: u64,
    ) -> u64 {
        let bits = self.exec_bits(code);
        self.frame_raw(bits, copy_base + 2 * unit, 0, previous, index)
    }

    pub fn frame_raw(
        &mut self,
        exec: u64,
        instr: u64,
        owner: u8,
        previous: u64,
        tlbc_index: i32,
    ) -> u64 {
        let f = self.layout.frame.clone();
        let a = self.alloc(f.size + 16);
        if f.is_object {
            self.w64(a + self.layout.object.ob_type, self.types.frame);
        }
        self.w64(a + f.executable, exec);
        self.w64(a + f.instr_ptr, instr);
        self.w64(a + f.previous, previous);
        if let Some(o) = f.owner {
            self.write(a + o, &[owner]);
        }
        if let Some(t) = f.tlbc_index {
            self.w32(a + t, tlbc_index as u32);
        }
        a
    }

    /// An entry frame (owner 3, `f_executable` = None, tagged where stackrefs exist; on 3.12
    /// `f_code` is a code object, as CPython's interpreter trampoline is: checked against a live
    /// 3.12 by `builder_matches_live_312`); ≤ 3.11 chains have no entry frames: then `previous`
    /// itself.
    pub fn entry_frame(&mut self, previous: u64) -> u64 {
        if !self.layout.frame.is_shim_owner(3) {
            return previous;
        }
        let exec = if (self.layout.version.major, self.layout.version.minor) == (3, 12) {
            self.code_raw("<interpreter trampoline>", "<shim>", 0, &[], 2, true)
        } else {
            self.none | u64::from(self.layout.frame.stackref_tag_mask != 0)
        };
        self.frame_raw(exec, 0, 3, previous, 0)
    }

    /// A thread state (pushed at the head of the interpreter's list) whose current frame is
    /// `top`; on layouts with a `base_frame` the chain is terminated by an embedded base frame.
    pub fn thread(&mut self, native_tid: u64, thread_id: u64, top: u64) -> u64 {
        let t = self.layout.tstate.clone();
        let f = self.layout.frame.clone();
        let ts = self.alloc(t.size + f.size + 16);
        match t.native_thread_id {
            Some(off) => self.w64(ts + off, native_tid),
            // ≤ 3.10: the TID is in the `struct pthread` the `pthread_t` points at.
            None => self.pthread(thread_id, native_tid),
        }
        self.w64(ts + t.thread_id, thread_id);
        self.w64(ts + t.interp, self.interp);
        let head = self.interp + self.layout.interp.threads_head;
        let old = self.mem_u64(head);
        self.w64(ts + t.next, old);
        self.w64(head, ts);
        match t.cframe_current_frame {
            Some(off) => {
                let cframe = self.alloc(16);
                self.w64(cframe + off, top);
                self.w64(ts + t.current_frame, cframe);
            }
            None => self.w64(ts + t.current_frame, top),
        }
        ts
    }

    /// A `struct pthread` at `addr` whose `tid` is `tid`, where no object is in the way.
    fn pthread(&mut self, addr: u64, tid: u64) {
        let end = addr + PTHREAD_TID + 4;
        let clear = self
            .mem
            .regions()
            .all(|(start, bytes)| start >= end || start + bytes.len() as u64 <= addr);
        if clear {
            let mut block = vec![0u8; (PTHREAD_TID + 4) as usize];
            block[PTHREAD_TID as usize..].copy_from_slice(&(tid as u32).to_le_bytes());
            self.mem.insert(addr, block);
        }
    }

    /// Sets `tstate->state` (3.13+) and the thread's own `holds_gil` flag.
    pub fn thread_flags(&mut self, ts: u64, attached: bool, holds_gil: bool) {
        let t = self.layout.tstate.clone();
        if let Some(s) = t.state {
            self.w32(ts + s, u32::from(attached));
        }
        match t.holds_gil {
            super::layout::HoldsGil::StatusBit { offset, bit } => {
                self.w32(ts + offset, u32::from(holds_gil) << bit);
            }
            super::layout::HoldsGil::Int { offset } => self.w32(ts + offset, u32::from(holds_gil)),
            super::layout::HoldsGil::Unknown => {}
        }
    }

    /// GIL: `holder` locks it (None: unlocked); `enabled` sets the free-threaded flag.
    pub fn set_gil(&mut self, holder: Option<u64>, enabled: Option<i32>) {
        let g = self.layout.gil.clone();
        let gil = match g.at {
            GilAt::Runtime { offset } => self.runtime + offset,
            GilAt::Interpreter { embedded, .. } => self.interp + embedded,
        };
        self.w32(gil + g.locked, u32::from(holder.is_some()));
        self.w64(gil + g.last_holder, holder.unwrap_or(0xbad));
        if let (Some(off), Some(en)) = (g.enabled, enabled) {
            self.w32(gil + off, en as u32);
        }
    }

    /// A keys object: kind 0 (general) or 1 (unicode keys) with combined `values` if given.
    fn keys_object(&mut self, kind: u8, keys: &[u64], values: Option<&[u64]>) -> u64 {
        let sized = self.layout.dict.keys == DictKeys::Sized;
        // ≤ 3.10 keys have no kind: every entry is {hash, key, value}.
        let kind = if sized { 0 } else { kind };
        let entry = if kind == 0 { 24 } else { 16 };
        let entries_at = if sized {
            // `dk_size` 8 (1-byte indices), `dk_nentries` @32, indices @40.
            40 + 8
        } else {
            32 + 8
        };
        let a = self.alloc(entries_at + entry * keys.len().max(1) as u64);
        if sized {
            self.w64(a + 8, 8);
            self.w64(a + 32, keys.len() as u64);
        } else {
            self.write(a + 9, &[3, kind]);
            self.w64(a + 24, keys.len() as u64);
        }
        let entries = a + entries_at;
        for (i, k) in keys.iter().enumerate() {
            let e = entries + entry * i as u64;
            let (ko, vo) = if kind == 0 { (8, 16) } else { (0, 8) };
            self.w64(e + ko, *k);
            if let Some(v) = values {
                self.w64(e + vo, v[i]);
            }
        }
        a
    }

    pub(super) fn dict_object(&mut self, kind: u8, items: &[(u64, u64)]) -> u64 {
        let (keys, values): (Vec<u64>, Vec<u64>) = items.iter().copied().unzip();
        let k = self.keys_object(kind, &keys, Some(&values));
        let d = self.layout.dict.clone();
        let a = self.object(d.ma_values + 8, self.types.dict);
        self.w64(a + d.ma_keys, k);
        a
    }

    /// A `PyDictValues` for split keys; returns the address of the struct.
    fn dict_values(&mut self, values: &[u64]) -> u64 {
        let off = self.layout.dict.values_array;
        let a = self.alloc(off + 8 * values.len() as u64);
        for (i, v) in values.iter().enumerate() {
            self.w64(a + off + 8 * i as u64, *v);
        }
        a
    }

    fn int_object(&mut self, v: u64) -> u64 {
        let l = self.layout.long.clone();
        let mut digits = Vec::new();
        let mut x = u128::from(v);
        while x != 0 {
            digits.push((x & 0x3fff_ffff) as u32);
            x >>= 30;
        }
        let a = self.object(l.ob_digit + 4 * digits.len().max(1) as u64, self.types.int);
        let sign = u64::from(v == 0);
        let size = if l.form == super::layout::LongForm::Tag {
            ((digits.len() as u64) << 3) | sign
        } else {
            digits.len() as u64
        };
        self.w64(a + l.lv_tag, size);
        for (i, d) in digits.iter().enumerate() {
            self.w32(a + l.ob_digit + 4 * i as u64, *d);
        }
        a
    }

    /// `sys.modules["threading"]._active = {ident: Thread}` with `Thread._name`s; `inline`
    /// selects inline values (3.13+) / tagged values (3.12) rather than a materialised dict.
    pub fn threading_active(&mut self, threads: &[(u64, &str)], inline: bool) {
        let l = self.layout.clone();
        let (k_target, k_name) = (self.str_object("_target"), self.str_object("_name"));
        let cached = self.keys_object(1, &[k_target, k_name], None);
        let flags = TPFLAGS_MANAGED_DICT
            | if inline && l.dict.inline_values {
                TPFLAGS_INLINE_VALUES
            } else {
                0
            };
        // ≤ 3.10 instances keep their dict right after the header (`tp_dictoffset`).
        let dict_offset = l.object.header_size;
        let basicsize = if l.dict.managed_dict == ManagedDict::TypeDictOffset {
            dict_offset + 8
        } else {
            l.object.header_size
        };
        let thread_type = self.alloc(l.types.ht_cached_keys + 8);
        self.w64(thread_type + l.types.tp_flags, flags);
        self.w64(thread_type + l.types.tp_basicsize, basicsize);
        self.w64(thread_type + l.types.tp_dictoffset, dict_offset);
        self.w64(thread_type + l.types.ht_cached_keys, cached);
        let mut active = Vec::new();
        for &(ident, name) in threads {
            let n = self.str_object(name);
            // Pre-header (managed dict pointer) before the object, inline values after it.
            let pre = 32u64;
            let block = self.alloc(pre + basicsize + 8 + 16 + 16);
            let obj = block + pre;
            self.w64(obj + l.object.ob_type, thread_type);
            let values = [0xdead_beef_u64, n];
            match (inline, l.dict.managed_dict) {
                (_, ManagedDict::TypeDictOffset) => {
                    let d = self.dict_object(1, &[(k_target, values[0]), (k_name, n)]);
                    self.w64(obj + dict_offset, d);
                }
                (true, ManagedDict::ValuesThenDict { values: at, .. }) => {
                    let v = self.dict_values(&values);
                    self.w64(obj.wrapping_add_signed(at), v);
                }
                (false, ManagedDict::ValuesThenDict { dict, .. }) => {
                    let d = self.dict_object(1, &[(k_target, values[0]), (k_name, n)]);
                    self.w64(obj.wrapping_add_signed(dict), d);
                }
                (true, ManagedDict::Tagged { offset }) => {
                    let v = self.dict_values(&values);
                    self.w64(obj.wrapping_add_signed(offset), v - 1);
                }
                (true, ManagedDict::Pointer { .. }) if l.dict.inline_values => {
                    let off = l.dict.values_array;
                    self.w64(obj + basicsize + off, values[0]);
                    self.w64(obj + basicsize + off + 8, values[1]);
                }
                (_, ManagedDict::Tagged { offset } | ManagedDict::Pointer { offset }) => {
                    let d = self.dict_object(1, &[(k_target, values[0]), (k_name, n)]);
                    self.w64(obj.wrapping_add_signed(offset), d);
                }
            }
            let key = self.int_object(ident);
            active.push((key, obj));
        }
        let active = self.dict_object(0, &active);
        let k_active = self.str_object("_active");
        let k_other = self.str_object("_limbo");
        let md = self.dict_object(1, &[(k_other, 0x1234_5678), (k_active, active)]);
        let module = self.object(l.dict.module_dict + 8, self.types.module);
        self.w64(module + l.dict.module_dict, md);
        let (k_sys, k_threading) = (self.str_object("sys"), self.str_object("threading"));
        let modules = self.dict_object(1, &[(k_sys, 0x1111_0000), (k_threading, module)]);
        self.w64(self.interp + l.interp.imports_modules, modules);
    }
}

/// (kind, ascii, little-endian data) of `s` as CPython would store it.
fn encode_str(s: &str) -> (u64, bool, Vec<u8>) {
    let max = s.chars().map(u32::from).max().unwrap_or(0);
    let kind: u64 = if max < 0x100 {
        1
    } else if max < 0x1_0000 {
        2
    } else {
        4
    };
    let mut data = Vec::new();
    for c in s.chars() {
        let v = u32::from(c);
        data.extend_from_slice(&v.to_le_bytes()[..kind as usize]);
    }
    (kind, max < 0x80, data)
}
