//! Code objects: metadata cache and (code object, instruction pointer) → frame.
//!
//! Owns: [`CodeCache`] (per attached process, keyed by code-object address, validated on every
//! reuse by a fingerprint of the object's header and flushed when the interpreter's
//! `_code_object_generation` changes) and [`resolve`], which turns a code object and an
//! instruction pointer (plus the 3.14t `tlbc_index`) into a [`PyFrame`].
//! Input: target memory, the layout, `&PyCode_Type` (from `.dynsym`, biased).
//! Output: `Arc<CodeInfo>` / [`Resolved`]; failures are [`CodeError`] values, counted by callers.
//! Constraints: names ≤ [`MAX_NAME_CHARS`], files ≤ [`MAX_FILE_CHARS`], line tables ≤
//! [`MAX_LINETABLE`], bytecode ≤ [`MAX_CODE_UNITS`]; at most [`MAX_CACHED_CODES`] entries.
//! Fields: `PyCodeObject` in `Include/cpython/code.h`
//! (<https://github.com/python/cpython/blob/v3.14.0/Include/cpython/code.h>); TLBC:
//! `_PyCodeArray` in the same header (free-threaded only); docs/cpython-layouts.md §3.3, §3.4, §5.5.

use std::sync::Arc;

use super::PyFrame;
use super::errors::{ErrorCounts, ErrorKind};
use super::layout::{InstrKind, RuntimeLayout};
use super::linetable::line_at_kind;
use super::locals::LocalsCache;
use super::memory::{MemError, ReadMemory, field_u32, field_u64};
use super::objects::{Known, KnownObjects, dict_entries};
use super::unicode::{StrError, check_type, read_bytes_typed, read_str_typed};
use crate::lru::Lru;

pub const MAX_NAME_CHARS: usize = 1024;
pub const MAX_FILE_CHARS: usize = 4096;
pub const MAX_LINETABLE: usize = 1 << 20;
pub const MAX_CODE_UNITS: u64 = 1 << 24;
pub const MAX_CACHED_CODES: usize = 1 << 16;
/// Bound of `_PyCodeArray.size` (one entry per thread that ran the code).
const MAX_TLBC_ENTRIES: u64 = 1 << 16;

/// Why a code object could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    #[error(transparent)]
    Memory(#[from] MemError),
    #[error("{addr:#x} is not a code object")]
    NotCode { addr: u64 },
    #[error("bad code object at {addr:#x}: {what}")]
    Bad { addr: u64, what: &'static str },
    /// The code object sampled at this address was freed, and another one lives there now.
    #[error("the code object sampled at {addr:#x} was replaced")]
    Replaced { addr: u64 },
}

impl CodeError {
    pub fn kind(self) -> ErrorKind {
        match self {
            CodeError::Memory(_) => ErrorKind::MemoryRead,
            CodeError::NotCode { .. } => ErrorKind::NotCode,
            CodeError::Bad { .. } => ErrorKind::BadCodeObject,
            CodeError::Replaced { .. } => ErrorKind::CodeFreed,
        }
    }
}

impl From<StrError> for CodeError {
    fn from(e: StrError) -> CodeError {
        match e {
            StrError::Memory(m) => CodeError::Memory(m),
            StrError::Invalid { addr, .. } | StrError::WrongType { addr, .. } => CodeError::Bad {
                addr,
                what: "string field",
            },
        }
    }
}

/// What a code object's name or file reads as when it points at an object of another type.
pub const INVALID_NAME: &str = "<invalid>";

/// `read`'s value; a field of the wrong type is `invalid` (and `wrong` is set): a corrupted
/// object never turns into garbage text.
fn typed_field<T>(read: Result<T, StrError>, invalid: T, wrong: &mut bool) -> Result<T, CodeError> {
    match read {
        Err(StrError::WrongType { .. }) => {
            *wrong = true;
            Ok(invalid)
        }
        other => Ok(other?),
    }
}

/// What the kernel recorded of a frame's code object at the sample (`PyFrameRecord`): its
/// name (`co_qualname`, ≤ 3.10 `co_name`) and file name pointers and the low 16 bits of
/// `co_firstlineno`. User space reads the code object later; this says whether it is still
/// the one that was sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodeIdentity {
    pub name: u64,
    pub filename: u64,
    pub first_line: u16,
    /// The frame's `f_globals` when it runs module-level code (`f_locals == f_globals`), else
    /// 0: not part of the identity; names a freed module body by its module.
    pub globals: u64,
}

/// The header words that identify a code object; compared on every cache hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    ob_type: u64,
    /// `ob_size` (3.11+), or the `co_code` pointer (≤ 3.10; the bytes object is immutable).
    ob_size: u64,
    filename: u64,
    qualname: u64,
    linetable: u64,
    firstlineno: u32,
}

impl Fingerprint {
    /// Whether this is the code object the kernel sampled as `id`.
    fn is(&self, id: CodeIdentity) -> bool {
        self.qualname == id.name
            && self.filename == id.filename
            && self.firstlineno as u16 == id.first_line
    }
}

/// What the reader keeps of a code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    pub qualname: String,
    pub filename: String,
    pub firstlineno: i32,
    pub linetable: Vec<u8>,
    /// `ob_size`: code units of `co_code_adaptive` (and of each TLBC copy).
    pub code_units: u64,
    /// The object lives inside the interpreter's own ELF image (static code, e.g. the
    /// `__init__` shim `_Py_InitCleanup`).
    pub in_image: bool,
    /// A name, file or line table pointed at an object of another type (shown as
    /// [`INVALID_NAME`]); counted as `wrong_type` on every use.
    pub wrong_type: bool,
    fingerprint: Fingerprint,
}

/// Where the walker finds the target's fixed objects.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub pid: u32,
    /// `&_PyRuntime` in the target (the ≤ 3.11 GIL lives in it).
    pub runtime: u64,
    /// Offset of `tid` in glibc's `struct pthread` (from `_thread_db_pthread_tid` of the
    /// target's libc), to find the TID of a ≤ 3.10 thread state from its `pthread_t`.
    pub pthread_tid: Option<u64>,
    /// `&PyCode_Type` in the target (None: not found; then only plausibility checks apply).
    pub pycode_type: Option<u64>,
    /// `&PyFrame_Type` (≤ 3.10 frames are objects of this type; None: not found).
    pub pyframe_type: Option<u64>,
    /// Address ranges of the ELF file that holds `_PyRuntime`.
    pub image: Vec<(u64, u64)>,
    /// The built-in types and singletons, by address.
    pub known: KnownObjects,
}

impl Target {
    pub fn in_image(&self, addr: u64) -> bool {
        self.image.iter().any(|&(lo, hi)| (lo..hi).contains(&addr))
    }
}

/// What every read of a snapshot needs: the memory, the layout and the target's fixed objects.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub mem: &'a dyn ReadMemory,
    pub layout: &'a RuntimeLayout,
    pub target: &'a Target,
}

/// Code-object metadata by address, for one process.
#[derive(Debug)]
pub struct CodeCache {
    entries: Lru<u64, Arc<CodeInfo>>,
    generation: Option<u64>,
    /// Local names of the cached code objects (`dump --locals`).
    pub(crate) locals: LocalsCache,
}

impl Default for CodeCache {
    fn default() -> Self {
        CodeCache {
            entries: Lru::new(MAX_CACHED_CODES),
            generation: None,
            locals: LocalsCache::default(),
        }
    }
}

impl CodeCache {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Flushes the cache when the interpreter's `_code_object_generation` moved.
    pub fn set_generation(&mut self, generation: u64) {
        if self.generation != Some(generation) {
            self.entries.clear();
            self.locals.clear();
            self.generation = Some(generation);
        }
    }

    /// The metadata of the code object at `addr`, from the cache if its header is unchanged.
    pub fn get(
        &mut self,
        ctx: Ctx<'_>,
        addr: u64,
        counts: &mut ErrorCounts,
    ) -> Result<Arc<CodeInfo>, CodeError> {
        let Ctx {
            mem,
            layout,
            target,
        } = ctx;
        let c = &layout.code;
        // The type first: a stale or torn pointer usually fails here, without reading a whole
        // code header's worth of memory that may not exist.
        let ob_type = mem.read_u64(addr.wrapping_add(layout.object.ob_type))?;
        if target.pycode_type.is_some_and(|t| t != ob_type) {
            return Err(CodeError::NotCode { addr });
        }
        let mut head = [0u8; 4096];
        let head = head
            .get_mut(..c.header_bytes() as usize)
            .ok_or(CodeError::Bad {
                addr,
                what: "layout",
            })?;
        mem.read(addr, head)?;
        let word = |off| {
            field_u64(head, off).ok_or(CodeError::Bad {
                addr,
                what: "header",
            })
        };
        let fp = Fingerprint {
            ob_type: word(layout.object.ob_type)?,
            ob_size: word(c.co_code.unwrap_or(c.ob_size))?,
            filename: word(c.filename)?,
            qualname: word(c.qualname.unwrap_or(c.name))?,
            linetable: word(c.linetable)?,
            firstlineno: field_u32(head, c.firstlineno).ok_or(CodeError::Bad {
                addr,
                what: "header",
            })?,
        };
        if target.pycode_type.is_some_and(|t| t != fp.ob_type) {
            return Err(CodeError::NotCode { addr });
        }
        if c.co_code.is_none() && (fp.ob_size == 0 || fp.ob_size > MAX_CODE_UNITS) {
            return Err(CodeError::Bad {
                addr,
                what: "ob_size",
            });
        }
        if let Some(hit) = self.entries.get(&addr) {
            if hit.fingerprint == fp {
                return Ok(Arc::clone(hit));
            }
            counts.add(ErrorKind::CodeCacheStale);
        }
        let mut wrong_type = false;
        let code_units = if c.co_code.is_some() {
            // ≤ 3.10: `co_code` is a `bytes` object of 2-byte code units.
            check_type(ctx, fp.ob_size, Known::Bytes)?;
            let len = mem.read_u64(fp.ob_size.wrapping_add(layout.bytes.ob_size))?;
            if len == 0 || len % 2 != 0 || len / 2 > MAX_CODE_UNITS {
                return Err(CodeError::Bad {
                    addr,
                    what: "co_code",
                });
            }
            len / 2
        } else {
            fp.ob_size
        };
        let info = Arc::new(CodeInfo {
            qualname: typed_field(
                read_str_typed(ctx, fp.qualname, MAX_NAME_CHARS),
                INVALID_NAME.to_string(),
                &mut wrong_type,
            )?,
            filename: typed_field(
                read_str_typed(ctx, fp.filename, MAX_FILE_CHARS),
                INVALID_NAME.to_string(),
                &mut wrong_type,
            )?,
            firstlineno: fp.firstlineno as i32,
            linetable: typed_field(
                read_bytes_typed(ctx, fp.linetable, MAX_LINETABLE),
                Vec::new(),
                &mut wrong_type,
            )?,
            wrong_type,
            code_units,
            in_image: target.in_image(addr),
            fingerprint: fp,
        });
        self.entries.insert(addr, Arc::clone(&info));
        Ok(info)
    }

    /// The metadata of the code object the kernel sampled at `addr` as `id`: from the cache
    /// without reading the target when the cached object is that one (its metadata never
    /// changes, and it may have been freed since), else read as [`Self::get`] does.
    /// [`CodeError::Replaced`] when the object at `addr` now is another one.
    pub fn get_sampled(
        &mut self,
        ctx: Ctx<'_>,
        addr: u64,
        id: CodeIdentity,
        counts: &mut ErrorCounts,
    ) -> Result<Arc<CodeInfo>, CodeError> {
        if let Some(hit) = self.entries.get(&addr)
            && hit.fingerprint.is(id)
        {
            return Ok(Arc::clone(hit));
        }
        let info = self.get(ctx, addr, counts)?;
        if info.fingerprint.is(id) {
            Ok(info)
        } else {
            Err(CodeError::Replaced { addr })
        }
    }
}

/// A resolved frame, and whether it is the `__init__` shim (to be dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub frame: PyFrame,
    pub is_init_shim: bool,
}

/// The start of the bytecode `instr_ptr` points into: `co_code_adaptive`, or on free-threaded
/// 3.14+ the thread-local copy `co_tlbc->entries[tlbc_index]` (§5.5).
fn bytecode_base(
    mem: &dyn ReadMemory,
    layout: &RuntimeLayout,
    code_addr: u64,
    tlbc_index: i32,
    counts: &mut ErrorCounts,
) -> u64 {
    let c = &layout.code;
    let main = code_addr.wrapping_add(c.code_adaptive.unwrap_or(0));
    let Some(tlbc_off) = c.tlbc else { return main };
    if tlbc_index <= 0 {
        return main;
    }
    let copy = (|| -> Result<Option<u64>, MemError> {
        let arr = mem.read_u64(code_addr.wrapping_add(tlbc_off))?;
        if arr == 0 {
            return Ok(None);
        }
        let size = mem.read_u64(arr)?;
        let idx = tlbc_index as u64;
        if idx >= size || size > MAX_TLBC_ENTRIES {
            return Ok(None);
        }
        let entry = mem.read_u64(arr.wrapping_add(c.tlbc_entries + 8 * idx))?;
        Ok((entry != 0).then_some(entry))
    })();
    if let Ok(Some(base)) = copy {
        base
    } else {
        counts.add(ErrorKind::TlbcFallback);
        main
    }
}

/// Code object + instruction pointer (+ TLBC index) → function, file, line.
pub fn resolve(
    ctx: Ctx<'_>,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    code_addr: u64,
    instr_ptr: u64,
    tlbc_index: i32,
) -> Result<Resolved, CodeError> {
    let info = cache.get(ctx, code_addr, counts)?;
    Ok(frame_of(
        ctx, &info, counts, code_addr, instr_ptr, tlbc_index,
    ))
}

/// As [`resolve`], for a frame the kernel captured with its code object's identity `id`. A
/// code object freed since the sample (a module body whose import finished, code run by
/// `exec`), or replaced by another at the same address, is named from the name and file name
/// objects the sample recorded, if they are still `str` objects, with line -1 (its line table
/// went with it); counted as `code_freed`.
pub fn resolve_sampled(
    ctx: Ctx<'_>,
    cache: &mut CodeCache,
    counts: &mut ErrorCounts,
    (code_addr, instr_ptr, tlbc_index): (u64, u64, i32),
    id: CodeIdentity,
) -> Result<Resolved, CodeError> {
    match cache.get_sampled(ctx, code_addr, id, counts) {
        Ok(info) => Ok(frame_of(
            ctx, &info, counts, code_addr, instr_ptr, tlbc_index,
        )),
        Err(e) => {
            // Whatever failed, the object sampled is not there any more: the names it had
            // are the only way to show it, and they must read as `str` objects.
            let names = read_str_typed(ctx, id.name, MAX_NAME_CHARS)
                .and_then(|n| Ok((n, read_str_typed(ctx, id.filename, MAX_FILE_CHARS)?)));
            // Module-level code (a module body, whose code object and names usually go as soon
            // as its import finished): named by the module that ran it.
            let module = || {
                let file = module_file(ctx, id.globals)?;
                Some((MODULE_CODE.to_string(), file))
            };
            let Some((function, file)) = names.ok().or_else(module) else {
                return Err(e);
            };
            counts.add(ErrorKind::CodeFreed);
            Ok(Resolved {
                frame: PyFrame {
                    function,
                    file,
                    line: -1,
                    first_line: i32::from(id.first_line),
                    code_addr,
                },
                is_init_shim: false,
            })
        }
    }
}

/// The name CPython gives module-level code objects.
const MODULE_CODE: &str = "<module>";
/// Entries of a module's namespace scanned for `__file__` (it is among the first few:
/// `__name__`, `__doc__`, `__package__`, `__loader__`, `__spec__`, `__file__`, …).
const MODULE_KEYS_SCANNED: u64 = 16;

/// `__file__` (else `__name__`) of the module whose namespace is the dict at `globals`.
fn module_file(ctx: Ctx<'_>, globals: u64) -> Option<String> {
    if globals == 0 || check_type(ctx, globals, Known::Dict).is_err() {
        return None;
    }
    let entries = dict_entries(ctx, globals, usize::MAX, MODULE_KEYS_SCANNED).ok()?;
    let value = |key: &str| {
        entries.items.iter().find_map(|&(k, v)| {
            read_str_typed(ctx, k, key.len() + 1)
                .is_ok_and(|s| s == key)
                .then(|| read_str_typed(ctx, v, MAX_FILE_CHARS).ok())
                .flatten()
        })
    };
    value("__file__").or_else(|| value("__name__"))
}

/// The frame of a code object's metadata at `instr_ptr`.
fn frame_of(
    ctx: Ctx<'_>,
    info: &CodeInfo,
    counts: &mut ErrorCounts,
    code_addr: u64,
    instr_ptr: u64,
    tlbc_index: i32,
) -> Resolved {
    let layout = ctx.layout;
    if info.wrong_type {
        counts.add(ErrorKind::WrongType);
    }
    // The byte offset of the instruction, and the lowest value a frame can hold: 3.11/3.12
    // `prev_instr` is the last executed unit (`base - 2` before the first one) and ≤ 3.10
    // `f_lasti` is -1 then; both are used as is, like `PyCode_Addr2Line` does (§3.3).
    let (offset, lowest) = match layout.frame.instr {
        InstrKind::Lasti { unit_bytes } => {
            let unit = i64::from(unit_bytes);
            (i64::from(instr_ptr as u32 as i32) * unit, -unit)
        }
        InstrKind::PrevInstr | InstrKind::InstrPtr => {
            let base = bytecode_base(ctx.mem, layout, code_addr, tlbc_index, counts);
            let lowest = if layout.frame.instr == InstrKind::PrevInstr {
                -2
            } else {
                0
            };
            (instr_ptr.wrapping_sub(base) as i64, lowest)
        }
    };
    let line = if offset < lowest || offset >= 2 * info.code_units as i64 {
        counts.add(ErrorKind::TornInstrPtr);
        -1
    } else {
        line_at_kind(
            layout.code.linetable_kind,
            &info.linetable,
            info.firstlineno,
            offset,
        )
        .unwrap_or_else(|_| {
            counts.add(ErrorKind::BadLineTable);
            -1
        })
    };
    // `_Py_InitCleanup` (3.13+ default builds): static, `co_firstlineno` 0, table `\xfb`.
    let is_init_shim = info.firstlineno == 0
        && line == -1
        && (info.in_image || (info.qualname == "__init__" && info.filename == "__init__"));
    Resolved {
        frame: PyFrame {
            function: info.qualname.clone(),
            file: info.filename.clone(),
            line,
            first_line: info.firstlineno,
            code_addr,
        },
        is_init_shim,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::testimage::{CodeSpec, Flavor, ImageBuilder};

    #[test]
    fn cache_hits_are_revalidated() {
        let mut b = ImageBuilder::new(Flavor::V313);
        let code = b.code(&CodeSpec::simple("f", "/a.py", 10, &[(10, 4), (11, 4)]));
        let other = b.str_object("g");
        let (layout, target) = (b.layout().clone(), b.target());
        let mut mem = b.memory();
        let (mut cache, mut counts) = (CodeCache::default(), ErrorCounts::default());
        let base = code + layout.code.code_adaptive.unwrap();
        let ctx = Ctx {
            mem: &mem,
            layout: &layout,
            target: &target,
        };
        let r = resolve(ctx, &mut cache, &mut counts, code, base + 10, 0).unwrap();
        assert_eq!((r.frame.function.as_str(), r.frame.line), ("f", 11));
        // Same address, new qualname pointer: the hit must be noticed and re-read.
        mem.bytes_mut(code + layout.code.qualname.unwrap(), 8)
            .unwrap()
            .copy_from_slice(&other.to_le_bytes());
        let ctx = Ctx {
            mem: &mem,
            layout: &layout,
            target: &target,
        };
        let r = resolve(ctx, &mut cache, &mut counts, code, base, 0).unwrap();
        assert_eq!(r.frame.function, "g");
        assert_eq!(counts.get(ErrorKind::CodeCacheStale), 1);
        // Torn instruction pointer.
        let r = resolve(ctx, &mut cache, &mut counts, code, base + 16, 0).unwrap();
        assert_eq!(r.frame.line, -1);
        assert_eq!(counts.get(ErrorKind::TornInstrPtr), 1);
        // Not a code object.
        assert!(matches!(
            resolve(ctx, &mut cache, &mut counts, other, 0, 0),
            Err(CodeError::NotCode { .. })
        ));
        cache.set_generation(1);
        assert!(cache.is_empty());
    }

    /// The identity the kernel recorded with a frame: a cached code object matching it is used
    /// without reading the target (it may be freed by now); one freed since is named from the
    /// names recorded (no line), else from the module whose namespace the frame ran in; one
    /// replaced at its address is never named after its successor. Issue 17.
    #[test]
    fn sampled_frames_outlive_their_code_objects() {
        for flavor in Flavor::ALL {
            let mut b = ImageBuilder::new(flavor);
            let code = b.code(&CodeSpec::simple("f", "/a.py", 10, &[(10, 4), (11, 4)]));
            let other = b.code(&CodeSpec::simple("g", "/b.py", 20, &[(20, 4)]));
            let k_file = b.str_object("__file__");
            let k_name = b.str_object("__name__");
            let v_file = b.str_object("/site/pkg/mod.py");
            let v_name = b.str_object("pkg.mod");
            let globals = b.dict_object(1, &[(k_name, v_name), (k_file, v_file)]);
            let (layout, target) = (b.layout().clone(), b.target());
            let mut mem = b.memory();
            let c = &layout.code;
            let word = |mem: &crate::python::memory::ImageMemory, addr: u64| {
                let mut v = [0u8; 8];
                mem.read(addr, &mut v).unwrap();
                u64::from_le_bytes(v)
            };
            let id = CodeIdentity {
                name: word(&mem, code + c.qualname.unwrap_or(c.name)),
                filename: word(&mem, code + c.filename),
                first_line: 10,
                globals: 0,
            };
            let ip = match layout.frame.instr {
                InstrKind::Lasti { .. } => 1,
                _ => code + c.code_adaptive.unwrap_or(0) + 2,
            };
            let (mut cache, mut counts) = (CodeCache::default(), ErrorCounts::default());
            let at = |mem: &crate::python::memory::ImageMemory,
                      cache: &mut CodeCache,
                      counts: &mut ErrorCounts,
                      id| {
                let ctx = Ctx {
                    mem,
                    layout: &layout,
                    target: &target,
                };
                resolve_sampled(ctx, cache, counts, (code, ip, 0), id).map(|r| r.frame)
            };
            let r = at(&mem, &mut cache, &mut counts, id).unwrap();
            assert_eq!((r.function.as_str(), r.line), ("f", 10), "{flavor:?}");
            // Freed (its type word overwritten): the cached metadata still serves the frames
            // the kernel sampled while it lived.
            mem.bytes_mut(code + layout.object.ob_type, 8)
                .unwrap()
                .copy_from_slice(&0u64.to_le_bytes());
            let r = at(&mem, &mut cache, &mut counts, id).unwrap();
            assert_eq!((r.function.as_str(), r.line), ("f", 10), "{flavor:?}");
            // Never seen alive: named from the recorded names, without a line.
            let mut fresh = CodeCache::default();
            let r = at(&mem, &mut fresh, &mut counts, id).unwrap();
            assert_eq!(
                (r.function.as_str(), r.file.as_str(), r.line),
                ("f", "/a.py", -1),
                "{flavor:?}"
            );
            assert_eq!(counts.get(ErrorKind::CodeFreed), 1, "{flavor:?}");
            // Replaced by another code object at the same address: not named after it.
            let mut bytes = vec![0u8; c.header_bytes() as usize];
            mem.read(other, &mut bytes).unwrap();
            mem.bytes_mut(code, bytes.len())
                .unwrap()
                .copy_from_slice(&bytes);
            let r = at(&mem, &mut CodeCache::default(), &mut counts, id).unwrap();
            assert_eq!((r.function.as_str(), r.line), ("f", -1), "{flavor:?}");
            // Names gone too: the module of a module-level frame, else an error.
            let gone = CodeIdentity {
                name: 0x10,
                filename: 0x10,
                ..id
            };
            assert!(at(&mem, &mut CodeCache::default(), &mut counts, gone).is_err());
            let module = CodeIdentity { globals, ..gone };
            let r = at(&mem, &mut CodeCache::default(), &mut counts, module).unwrap();
            assert_eq!(
                (r.function.as_str(), r.file.as_str(), r.line),
                ("<module>", "/site/pkg/mod.py", -1),
                "{flavor:?}"
            );
            // A namespace that is no dict names nothing.
            let not_a_dict = CodeIdentity {
                globals: v_name,
                ..gone
            };
            assert!(at(&mem, &mut CodeCache::default(), &mut counts, not_a_dict).is_err());
        }
    }

    /// A name pointing at an object of another type reads `<invalid>` and is counted on
    /// every use, never decoded (issue 15).
    #[test]
    fn names_of_the_wrong_type_are_invalid_and_counted() {
        for flavor in Flavor::ALL {
            let mut b = ImageBuilder::new(flavor);
            let code = b.code(&CodeSpec::simple("f", "/a.py", 10, &[(10, 4), (11, 4)]));
            let not_a_str = b.bytes_object(b"\x1b]0;garbage\x07");
            let (layout, target) = (b.layout().clone(), b.target());
            let mut mem = b.memory();
            let name_field = layout.code.qualname.unwrap_or(layout.code.name);
            for field in [name_field, layout.code.filename] {
                mem.bytes_mut(code + field, 8)
                    .unwrap()
                    .copy_from_slice(&not_a_str.to_le_bytes());
            }
            let ctx = Ctx {
                mem: &mem,
                layout: &layout,
                target: &target,
            };
            let (mut cache, mut counts) = (CodeCache::default(), ErrorCounts::default());
            // The second code unit: `f_lasti` 1 (≤ 3.10), or a pointer into the bytecode.
            let ip = match layout.frame.instr {
                InstrKind::Lasti { .. } => 1,
                _ => code + layout.code.code_adaptive.unwrap_or(0) + 2,
            };
            for _ in 0..3 {
                let r = resolve(ctx, &mut cache, &mut counts, code, ip, 0).unwrap();
                assert_eq!(r.frame.function, INVALID_NAME, "{flavor:?}");
                assert_eq!(r.frame.file, INVALID_NAME, "{flavor:?}");
                assert_eq!(r.frame.line, 10, "the line table is still read");
            }
            assert_eq!(counts.get(ErrorKind::WrongType), 3, "{flavor:?}");
        }
    }
}
