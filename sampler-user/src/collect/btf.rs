//! The one kernel BTF fact the `pyebpf_sample_bounded` variant needs: the byte offset of a
//! member of a struct (`task_struct.stack`), read from `/sys/kernel/btf/vmlinux`.
//!
//! aya-obj parses BTF but keeps struct members crate-private, so this walks the type section
//! itself: the format is a header, a type section of `btf_type` records each followed by
//! kind-specific data, and a string section (docs/kernels.md, "BTF"). Every offset and length
//! is checked; a malformed file gives `None`, never a panic.

/// `BTF_MAGIC` (little-endian on disk: `9f eb`).
const MAGIC: u16 = 0xeb9f;
/// `btf_type` record size (name_off, info, size/type).
const TYPE_RECORD: usize = 12;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;
/// The highest kind this parser knows the layout of (`BTF_KIND_ENUM64`).
const KIND_MAX: u32 = 19;

/// Byte offset of member `member` of `struct name` in the BTF blob `data`; `None` if the blob
/// is malformed, uses an unknown kind before the struct, or lacks the struct, the member, or
/// has it at a non-byte offset (a bitfield).
pub fn struct_member_offset(data: &[u8], name: &str, member: &str) -> Option<u32> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?));
    let u32_at =
        |d: &[u8], at: usize| Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?));
    if u16_at(0)? != MAGIC {
        return None;
    }
    let hdr_len = u32_at(data, 4)? as usize;
    let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
    let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
    let types = data
        .get(hdr_len.checked_add(type_off)?..)?
        .get(..type_len)?;
    let strings = data.get(hdr_len.checked_add(str_off)?..)?.get(..str_len)?;
    let string = |off: u32| -> Option<&[u8]> {
        let s = strings.get(off as usize..)?;
        Some(&s[..s.iter().position(|&b| b == 0)?])
    };
    let mut at = 0;
    while at < types.len() {
        let name_off = u32_at(types, at)?;
        let info = u32_at(types, at + 4)?;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let kind_flag = info >> 31 == 1;
        let body = at + TYPE_RECORD;
        let extra = match kind {
            KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
            KIND_ARRAY => 12,
            KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => vlen * 12,
            KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
            k if k <= KIND_MAX => 0,
            _ => return None,
        };
        if kind == KIND_STRUCT && string(name_off)? == name.as_bytes() {
            for i in 0..vlen {
                let m = body + i * 12;
                if string(u32_at(types, m)?)? == member.as_bytes() {
                    let raw = u32_at(types, m + 8)?;
                    // With kind_flag the offset carries a bitfield size in its top byte.
                    let bits = if kind_flag { raw & 0x00ff_ffff } else { raw };
                    return (bits % 8 == 0).then_some(bits / 8);
                }
            }
            // Several structs may share the name (never in vmlinux, but keep looking).
        }
        at = body.checked_add(extra)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with an int, a pointer, `struct task_struct { int state; void *stack; }` at
    /// offsets 0 and 16 (bytes), and an unrelated struct of the same member name first.
    fn blob(kind_flag: bool) -> Vec<u8> {
        let strings = b"\0int\0task_struct\0state\0stack\0other\0";
        let pos = |s: &str| {
            let needle = format!("\0{s}\0");
            (strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap()
                + 1) as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // [1] int: name, info (kind 1), size 4, int data.
        push(&[pos("int"), KIND_INT << 24, 4, 32]);
        // [2] ptr to void.
        push(&[0, 2 << 24, 0]);
        // [3] struct other { void *stack @ 64 bits }.
        push(&[pos("other"), KIND_STRUCT << 24 | 1, 16, pos("stack"), 2, 64]);
        // [4] struct task_struct { int state @ 0; void *stack @ 128 bits }.
        let flag = if kind_flag { 1 << 31 } else { 0 };
        push(&[pos("task_struct"), flag | KIND_STRUCT << 24 | 2, 64]);
        push(&[pos("state"), 1, 0, pos("stack"), 2, 128]);
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]); // version, flags
        let hdr_len = 24u32;
        for w in [
            hdr_len,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn finds_a_member_offset_in_bytes() {
        for kind_flag in [false, true] {
            let data = blob(kind_flag);
            assert_eq!(
                struct_member_offset(&data, "task_struct", "stack"),
                Some(16)
            );
            assert_eq!(struct_member_offset(&data, "task_struct", "state"), Some(0));
            assert_eq!(struct_member_offset(&data, "other", "stack"), Some(8));
            assert_eq!(struct_member_offset(&data, "task_struct", "pid"), None);
            assert_eq!(struct_member_offset(&data, "mm_struct", "stack"), None);
        }
    }

    #[test]
    fn malformed_blobs_give_none() {
        let good = blob(false);
        for len in 0..good.len() {
            // Truncated anywhere: never a panic; the member is found only if its record and
            // name survived.
            let _ = struct_member_offset(&good[..len], "task_struct", "stack");
        }
        assert_eq!(
            struct_member_offset(&good[..60], "task_struct", "stack"),
            None
        );
        let mut bad_magic = good.clone();
        bad_magic[0] = 0;
        assert_eq!(
            struct_member_offset(&bad_magic, "task_struct", "stack"),
            None
        );
        let mut huge_len = good.clone();
        huge_len[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            struct_member_offset(&huge_len, "task_struct", "stack"),
            None
        );
        let mut unknown_kind = good;
        unknown_kind[24 + 4..24 + 8].copy_from_slice(&(31u32 << 24).to_le_bytes());
        assert_eq!(
            struct_member_offset(&unknown_kind, "task_struct", "stack"),
            None
        );
    }

    #[test]
    fn this_kernel_has_task_struct_stack() {
        let Ok(data) = std::fs::read(crate::preflight::BTF_PATH) else {
            crate::procs::tests::missing(&format!(
                "no kernel BTF at {}",
                crate::preflight::BTF_PATH
            ));
            return;
        };
        let off = struct_member_offset(&data, "task_struct", "stack")
            .expect("task_struct.stack in this kernel's BTF");
        assert!((8..16 << 10).contains(&off), "implausible offset {off}");
    }
}
