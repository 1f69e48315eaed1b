//! Struct member offsets and prototypes from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Owns: where the kernel BTF is ([`path`], with its test override) and the small bounded BTF
//! reader ([`Types`]) behind every kernel fact the programs need: `task_struct` member offsets
//! (`stack`, `pid`, the state word, `thread.fsbase`) and the `sched_switch` prototype
//! (`variant::KernelFeatures::probe` reads the file once per run and asks for all of them).
//! Input: the BTF blob. Output: a byte offset or a parameter count, or `None` (no BTF, no such
//! member, a bitfield, malformed data).
//! Constraints: parsed without panicking on any input; indexing costs four bytes per type and
//! records are decoded only when a lookup reaches them (a decoded copy of vmlinux's types costs
//! about 10 MB: aya's `Btf` is that, which is why the loader is kept from building one, see
//! `loader`). Format: the kernel's `Documentation/bpf/btf.rst` (`struct btf_header`,
//! `struct btf_type`, one record per kind).

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// Overrides [`VMLINUX_BTF`] (end-to-end tests of a kernel without BTF).
pub const FAKE_BTF_PATH_ENV: &str = "PYEBPF_TEST_FAKE_BTF_PATH";

/// The kernel BTF file: [`VMLINUX_BTF`], or the test override.
pub fn path() -> std::path::PathBuf {
    std::env::var_os(FAKE_BTF_PATH_ENV).map_or_else(|| VMLINUX_BTF.into(), Into::into)
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;
/// Most type records indexed (vmlinux has about 150 000).
const MAX_TYPES: usize = 1 << 22;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The type section of one BTF blob, indexed once for several lookups: the byte offset of
/// each type record by type id (id 0 is `void`). Records are decoded when a lookup reaches
/// them, so indexing costs four bytes per type, not a decoded copy of the kernel's types.
pub struct Types<'a> {
    records: &'a [u8],
    strings: &'a [u8],
    /// Byte offset of type `i`'s record in `types` (`u32::MAX` for `void`).
    at: Vec<u32>,
}

/// One type record's fixed part.
struct Record {
    kind: u32,
    name_off: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_ref: u32,
    /// Byte offset of what follows the fixed part (members, parameters…).
    rest: usize,
}

impl<'a> Types<'a> {
    /// Indexes `blob`; `None` when it is not BTF or is malformed.
    pub fn parse(blob: &'a [u8]) -> Option<Types<'a>> {
        if u16::from_le_bytes(blob.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
            return None;
        }
        let hdr_len = u32_at(blob, 4)? as usize;
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off)?;
            blob.get(start..start.checked_add(len)?)
        };
        let types = section(u32_at(blob, 8)? as usize, u32_at(blob, 12)? as usize)?;
        let strings = section(u32_at(blob, 16)? as usize, u32_at(blob, 20)? as usize)?;
        let mut at = vec![u32::MAX];
        let mut pos = 0usize;
        while pos < types.len() {
            if at.len() >= MAX_TYPES {
                return None;
            }
            at.push(u32::try_from(pos).ok()?);
            let r = record(types, pos)?;
            let extra = match r.kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * r.vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * r.vlen,
                _ => 0,
            };
            pos = r.rest.checked_add(extra)?;
        }
        Some(Types {
            records: types,
            strings,
            at,
        })
    }

    fn get(&self, id: u32) -> Option<Record> {
        let pos = *self.at.get(id as usize).filter(|&&p| p != u32::MAX)?;
        record(self.records, pos as usize)
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
    }

    /// The first type of `kind` named `name`.
    fn find(&self, kind: u32, name: &str) -> Option<Record> {
        (1..self.at.len())
            .filter_map(|id| self.get(id as u32))
            .find(|r| r.kind == kind && self.name(r.name_off) == name.as_bytes())
    }

    /// Byte offset of the member at `path` (nested struct members) in the struct named `outer`.
    pub fn member_offset(&self, outer: &str, path: &[&str]) -> Option<u32> {
        let mut t = self.find(KIND_STRUCT, outer)?;
        let mut bits = 0u32;
        for (i, part) in path.iter().enumerate() {
            if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
                return None;
            }
            let (member_ty, bit) = (0..t.vlen).find_map(|m| {
                let r = t.rest + 12 * m;
                (self.name(u32_at(self.records, r)?) == part.as_bytes())
                    .then(|| Some((u32_at(self.records, r + 4)?, u32_at(self.records, r + 8)?)))?
            })?;
            // With `kind_flag`, the offset holds a bitfield size in its top byte.
            let bit = if t.kind_flag {
                (bit >> 24 == 0).then_some(bit & 0xff_ffff)?
            } else {
                bit
            };
            bits = bits.checked_add(bit)?;
            if i + 1 < path.len() {
                t = self.get(member_ty)?;
            }
        }
        bits.is_multiple_of(8).then_some(bits / 8)
    }

    /// The number of parameters of the function a typedef of a function pointer names (e.g.
    /// `btf_trace_sched_switch`, whose first parameter is the tracepoint's `void *__data`).
    pub fn typedef_fn_params(&self, typedef: &str) -> Option<u32> {
        let t = self.find(KIND_TYPEDEF, typedef)?;
        let ptr = self.get(t.size_or_ref).filter(|p| p.kind == KIND_PTR)?;
        let proto = self
            .get(ptr.size_or_ref)
            .filter(|p| p.kind == KIND_FUNC_PROTO)?;
        Some(proto.vlen as u32)
    }
}

/// The fixed part of the record at `pos`.
fn record(types: &[u8], pos: usize) -> Option<Record> {
    let info = u32_at(types, pos.checked_add(4)?)?;
    Some(Record {
        kind: (info >> 24) & 0x1f,
        name_off: u32_at(types, pos)?,
        vlen: (info & 0xffff) as usize,
        kind_flag: info >> 31 == 1,
        size_or_ref: u32_at(types, pos + 8)?,
        rest: pos + 12,
    })
}

/// Byte offset of the member at `path` (nested struct members) in the struct named `outer`.
pub fn member_offset(blob: &[u8], outer: &str, path: &[&str]) -> Option<u32> {
    Types::parse(blob)?.member_offset(outer, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob with `struct inner { long a; long fsbase; }` and `struct task_struct { int x;
    /// struct inner thread @ byte 64; }`, built by hand in the documented format.
    fn blob() -> Vec<u8> {
        let strings = b"\0inner\0a\0fsbase\0task_struct\0x\0thread\0long\0".to_vec();
        let off = |s: &str| {
            strings
                .windows(s.len() + 2)
                .position(|w| w[0] == 0 && &w[1..=s.len()] == s.as_bytes() && w[s.len() + 1] == 0)
                .unwrap() as u32
                + 1
        };
        let mut t = Vec::new();
        let mut rec = |words: &[u32]| t.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        // 1: long (INT, 8 bytes, 64 bits)
        rec(&[off("long"), KIND_INT << 24, 8, 64]);
        // 2: struct inner { a @0, fsbase @64 bits }
        rec(&[off("inner"), KIND_STRUCT << 24 | 2, 16]);
        rec(&[off("a"), 1, 0]);
        rec(&[off("fsbase"), 1, 64]);
        // 3: struct task_struct { x @0 (bitfield, kind_flag), thread @512 bits }
        rec(&[off("task_struct"), 1 << 31 | KIND_STRUCT << 24 | 2, 80]);
        rec(&[off("x"), 1, 3 << 24]);
        rec(&[off("thread"), 2, 512]);
        let mut b = Vec::new();
        b.extend(BTF_MAGIC.to_le_bytes());
        b.extend([1u8, 0]);
        for w in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend(w.to_le_bytes());
        }
        b.extend(&t);
        b.extend(&strings);
        b
    }

    #[test]
    fn nested_member_offsets() {
        let b = blob();
        assert_eq!(
            member_offset(&b, "task_struct", &["thread", "fsbase"]),
            Some(72)
        );
        assert_eq!(member_offset(&b, "task_struct", &["thread"]), Some(64));
        assert_eq!(member_offset(&b, "task_struct", &["x"]), None, "a bitfield");
        assert_eq!(member_offset(&b, "task_struct", &["nope"]), None);
        assert_eq!(member_offset(&b, "nope", &["thread"]), None);
        // Truncated or garbage blobs give None, never a panic.
        for cut in 0..b.len() {
            let _ = member_offset(&b[..cut], "task_struct", &["thread", "fsbase"]);
        }
        assert_eq!(member_offset(b"garbage", "task_struct", &[]), None);
    }

    /// `typedef void (*btf_trace_f)(void *, int)`: a typedef of a pointer to a 2-parameter
    /// function prototype.
    #[test]
    fn typedef_function_parameters() {
        let strings = b"\0btf_trace_f\0int\0".to_vec();
        let mut t = Vec::new();
        let mut rec = |words: &[u32]| t.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        rec(&[5, KIND_INT << 24, 4, 32]); // 1: int
        rec(&[0, KIND_FUNC_PROTO << 24 | 2, 0]); // 2: void (void *, int)
        rec(&[0, 0]);
        rec(&[0, 1]);
        rec(&[0, KIND_PTR << 24, 2]); // 3: pointer to 2
        rec(&[1, KIND_TYPEDEF << 24, 3]); // 4: btf_trace_f
        let mut b = Vec::new();
        b.extend(BTF_MAGIC.to_le_bytes());
        b.extend([1u8, 0]);
        for w in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend(w.to_le_bytes());
        }
        b.extend(&t);
        b.extend(&strings);
        let types = Types::parse(&b).unwrap();
        assert_eq!(types.typedef_fn_params("btf_trace_f"), Some(2));
        assert_eq!(types.typedef_fn_params("int"), None);
        assert_eq!(types.typedef_fn_params("nope"), None);
        for cut in 0..b.len() {
            if let Some(t) = Types::parse(&b[..cut]) {
                let _ = t.typedef_fn_params("btf_trace_f");
            }
        }
    }

    /// The running kernel's answers (x86-64: `thread_struct.fsbase`, a few KiB into the task;
    /// `pid` and `stack` before it).
    #[test]
    fn running_kernel_has_task_offsets() {
        let Ok(blob) = std::fs::read(VMLINUX_BTF) else {
            crate::procs::tests::missing("kernel BTF at /sys/kernel/btf/vmlinux");
            return;
        };
        let types = Types::parse(&blob).expect("the kernel BTF parses");
        let fsbase = types
            .member_offset("task_struct", &["thread", "fsbase"])
            .expect("task_struct.thread.fsbase in the kernel BTF");
        assert!((1024..32 * 1024).contains(&fsbase), "{fsbase}");
        assert_eq!(fsbase % 8, 0);
        let pid = types.member_offset("task_struct", &["pid"]).unwrap();
        let stack = types.member_offset("task_struct", &["stack"]).unwrap();
        assert!(stack < pid && pid < fsbase, "{stack} {pid} {fsbase}");
        assert!(types.typedef_fn_params("btf_trace_sched_switch").is_some());
    }
}
