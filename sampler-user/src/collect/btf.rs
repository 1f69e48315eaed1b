//! Struct member offsets from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Owns: [`task_fsbase_offset`], the offset of `thread.fsbase` in `struct task_struct`, which
//! the in-kernel Python walk reads to match a ≤ 3.10 thread state's `pthread_t` (the thread
//! pointer on x86-64) against the sampled task; and the small bounded BTF reader behind it
//! ([`member_offset`]).
//! Input: the BTF blob. Output: a byte offset, or `None` (no BTF, no such member, a bitfield,
//! malformed data).
//! Constraints: the blob is read once and parsed without panicking on any input; only what a
//! member lookup needs is decoded. Format: the kernel's `Documentation/bpf/btf.rst`
//! (`struct btf_header`, `struct btf_type`, one record per kind). aya reads the same file but
//! keeps its type table private, hence these few lines.

use std::sync::LazyLock;

/// Where the running kernel publishes its BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// Overrides [`VMLINUX_BTF`] (end-to-end tests of a kernel without BTF).
pub const FAKE_BTF_PATH_ENV: &str = "PYEBPF_TEST_FAKE_BTF_PATH";

/// The kernel BTF file: [`VMLINUX_BTF`], or the test override.
pub fn path() -> std::path::PathBuf {
    std::env::var_os(FAKE_BTF_PATH_ENV).map_or_else(|| VMLINUX_BTF.into(), Into::into)
}

/// `thread.fsbase` in `task_struct`, read once per run.
pub fn task_fsbase_offset() -> Option<u32> {
    static OFFSET: LazyLock<Option<u32>> = LazyLock::new(|| {
        let blob = std::fs::read(VMLINUX_BTF).ok()?;
        member_offset(&blob, "task_struct", &["thread", "fsbase"])
    });
    *OFFSET
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

/// One decoded type record: its kind, name, its size or referenced type, its `vlen` (members,
/// parameters…), and (structs and unions) members as (name offset, type id, bit offset; `None`
/// for a bitfield).
struct Type {
    kind: u32,
    name_off: u32,
    size_or_ref: u32,
    vlen: u32,
    members: Vec<(u32, u32, Option<u32>)>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// Parses the type section into records indexed by type id (id 0 is `void`).
fn parse(blob: &[u8]) -> Option<(Vec<Type>, &[u8])> {
    if u16::from_le_bytes(blob.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
        return None;
    }
    let hdr_len = u32_at(blob, 4)? as usize;
    let (type_off, type_len) = (u32_at(blob, 8)? as usize, u32_at(blob, 12)? as usize);
    let (str_off, str_len) = (u32_at(blob, 16)? as usize, u32_at(blob, 20)? as usize);
    let types = blob.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strings = blob.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let mut out = vec![Type {
        kind: 0,
        name_off: 0,
        size_or_ref: 0,
        vlen: 0,
        members: Vec::new(),
    }];
    let mut at = 0usize;
    while at < types.len() {
        let (name_off, info) = (u32_at(types, at)?, u32_at(types, at + 4)?);
        let size_or_ref = u32_at(types, at + 8)?;
        let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31);
        at += 12;
        let mut members = Vec::new();
        let extra = match kind {
            KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
            KIND_ARRAY => 12,
            KIND_STRUCT | KIND_UNION => {
                for m in 0..vlen {
                    let r = at + 12 * m;
                    let offset = u32_at(types, r + 8)?;
                    // With `kind_flag`, the offset holds a bitfield size in its top byte.
                    let bit = if kind_flag == 1 {
                        (offset >> 24 == 0).then_some(offset & 0xff_ffff)
                    } else {
                        Some(offset)
                    };
                    members.push((u32_at(types, r)?, u32_at(types, r + 4)?, bit));
                }
                12 * vlen
            }
            KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
            KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
            _ => 0,
        };
        at += extra;
        out.push(Type {
            kind,
            name_off,
            size_or_ref,
            vlen: vlen as u32,
            members,
        });
    }
    Some((out, strings))
}

fn name(strings: &[u8], off: u32) -> &[u8] {
    let rest = strings.get(off as usize..).unwrap_or_default();
    &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
}

/// The type section of one BTF blob, parsed once for several lookups.
pub struct Types<'a> {
    types: Vec<Type>,
    strings: &'a [u8],
}

impl<'a> Types<'a> {
    /// Parses `blob`; `None` when it is not BTF or is malformed.
    pub fn parse(blob: &'a [u8]) -> Option<Types<'a>> {
        let (types, strings) = parse(blob)?;
        Some(Types { types, strings })
    }

    /// Byte offset of the member at `path` (nested struct members) in the struct named `outer`.
    pub fn member_offset(&self, outer: &str, path: &[&str]) -> Option<u32> {
        let (types, strings) = (&self.types, self.strings);
        let mut ty = types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && name(strings, t.name_off) == outer.as_bytes())?;
        let mut bits = 0u32;
        for part in path {
            let t = types.get(ty)?;
            if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
                return None;
            }
            let &(_, member_ty, bit) = t
                .members
                .iter()
                .find(|(n, _, _)| name(strings, *n) == part.as_bytes())?;
            bits = bits.checked_add(bit?)?;
            ty = member_ty as usize;
        }
        bits.is_multiple_of(8).then_some(bits / 8)
    }

    /// The number of parameters of the function a typedef of a function pointer names (e.g.
    /// `btf_trace_sched_switch`, whose first parameter is the tracepoint's `void *__data`).
    pub fn typedef_fn_params(&self, typedef: &str) -> Option<u32> {
        let t = self.types.iter().find(|t| {
            t.kind == KIND_TYPEDEF && name(self.strings, t.name_off) == typedef.as_bytes()
        })?;
        let ptr = self
            .types
            .get(t.size_or_ref as usize)
            .filter(|p| p.kind == KIND_PTR)?;
        let proto = self
            .types
            .get(ptr.size_or_ref as usize)
            .filter(|p| p.kind == KIND_FUNC_PROTO)?;
        Some(proto.vlen)
    }
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

    /// The running kernel's answer (x86-64: `thread_struct.fsbase`, a few KiB into the task).
    #[test]
    fn running_kernel_has_task_fsbase() {
        if !std::path::Path::new(VMLINUX_BTF).exists() {
            crate::procs::tests::missing("kernel BTF at /sys/kernel/btf/vmlinux");
            return;
        }
        let off = task_fsbase_offset().expect("task_struct.thread.fsbase in the kernel BTF");
        assert!((1024..32 * 1024).contains(&off), "{off}");
        assert_eq!(off % 8, 0);
    }
}
