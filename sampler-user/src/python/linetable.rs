//! Line numbers from `co_linetable` (3.11–3.15 location table, unchanged since 3.11), the
//! 3.10 PEP 626 table and the 3.8/3.9 `co_lnotab`.
//!
//! Owns: the lookups [`line_at`] (location table, strict), [`line_at_pep626`] and
//! [`line_at_lnotab`] (each = that version's `PyCode_Addr2Line`), [`line_at_kind`] which picks
//! one by the layout's [`LineTableKind`], and, for tests and synthetic images, encoders
//! ([`LineTableWriter`], [`encode_pep626`], [`encode_lnotab`]).
//! Input: the table bytes, `co_firstlineno`, a byte offset into the bytecode.
//! Output: the line, or -1 (no location, or no entry covers the offset).
//! Constraints: the table comes from the target: malformed input yields an error, never a panic;
//! the walk is linear in the table length. Format: CPython `Objects/locations.md`
//! (<https://github.com/python/cpython/blob/v3.13.0/Objects/locations.md>); lookup:
//! `_PyCode_CheckLineNumber` / `PyCode_Addr2Line` in `Objects/codeobject.c`.
//! The match is strict, `start <= addr < end`: 3.13+ `instr_ptr` points at a CALL that may
//! start a new entry, and a non-strict end returns the previous entry's line (docs/cpython-layouts.md §4).

use super::layout::LineTableKind;

/// The line at byte offset `addr` with the table format of `kind`.
pub fn line_at_kind(
    kind: LineTableKind,
    table: &[u8],
    firstlineno: i32,
    addr: i64,
) -> Result<i32, LineTableError> {
    match kind {
        LineTableKind::Locations => line_at(table, firstlineno, addr),
        LineTableKind::Pep626 => line_at_pep626(table, firstlineno, addr),
        LineTableKind::Lnotab => line_at_lnotab(table, firstlineno, addr),
    }
}

/// 3.8/3.9 `co_lnotab` (`Objects/lnotab_notes.txt`): pairs of (unsigned byte increment,
/// signed line increment); the line of `addr` is the running line after every pair whose
/// address is `<= addr` (`PyCode_Addr2Line` in `Objects/codeobject.c` @ v3.9.18). Every byte
/// string is a valid table; an odd last byte is ignored, like CPython does.
pub fn line_at_lnotab(table: &[u8], firstlineno: i32, addr: i64) -> Result<i32, LineTableError> {
    let mut line = i64::from(firstlineno);
    let mut at: i64 = 0;
    for pair in table.chunks_exact(2) {
        at += i64::from(pair[0]);
        if at > addr {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    Ok(i32::try_from(line).unwrap_or(-1))
}

/// 3.10 PEP 626 `co_linetable` (`Objects/lnotab_notes.txt` @ v3.10.13): pairs of (unsigned
/// byte delta, signed line delta; -128: no line); the entry `[start, end)` holding `addr`
/// gives its line (`_PyCode_CheckLineNumber`: empty ranges are skipped, their deltas still
/// count); `addr < 0` is `co_firstlineno`, no entry -1.
pub fn line_at_pep626(table: &[u8], firstlineno: i32, addr: i64) -> Result<i32, LineTableError> {
    if addr < 0 {
        return Ok(firstlineno);
    }
    let mut computed = i64::from(firstlineno);
    let mut end: i64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let line = if pair[1] as i8 == -128 {
            -1
        } else {
            computed += i64::from(pair[1] as i8);
            computed
        };
        if start <= addr && addr < end {
            return Ok(i32::try_from(line).unwrap_or(-1));
        }
    }
    Ok(-1)
}

/// Encodes a 3.10 table from (line, bytes) runs as CPython's `assemble_line_range` does:
/// large line deltas first as empty ranges, then the bytes in steps of at most 254.
#[cfg(test)]
pub(crate) fn encode_pep626(firstlineno: i32, runs: &[(i32, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut line = i64::from(firstlineno);
    for &(l, mut bytes) in runs {
        let mut delta = i64::from(l) - line;
        line = i64::from(l);
        while !(-127..=127).contains(&delta) {
            let d = delta.clamp(-127, 127);
            out.extend([0, d as i8 as u8]);
            delta -= d;
        }
        while bytes > 254 {
            out.extend([254, delta as i8 as u8]);
            delta = 0;
            bytes -= 254;
        }
        out.extend([bytes as u8, delta as i8 as u8]);
    }
    out
}

/// Encodes a 3.8/3.9 `co_lnotab` from (line, bytes) runs (increments split to fit).
#[cfg(test)]
pub(crate) fn encode_lnotab(firstlineno: i32, runs: &[(i32, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut line, mut addr_incr) = (i64::from(firstlineno), 0u32);
    for &(l, bytes) in runs {
        let mut delta = i64::from(l) - line;
        line = i64::from(l);
        while addr_incr > 255 {
            out.extend([255, 0]);
            addr_incr -= 255;
        }
        loop {
            let d = delta.clamp(-128, 127);
            out.extend([addr_incr as u8, d as i8 as u8]);
            addr_incr = 0;
            delta -= d;
            if delta == 0 {
                break;
            }
        }
        addr_incr = bytes;
    }
    out
}

/// The table ended in the middle of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed line table at byte {at}")]
pub struct LineTableError {
    pub at: usize,
}

struct Cursor<'a> {
    t: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8, LineTableError> {
        let b = *self.t.get(self.i).ok_or(LineTableError { at: self.i })?;
        self.i += 1;
        Ok(b)
    }

    /// Unsigned varint: 6-bit groups, least significant first, 0x40 = more follows.
    fn varint(&mut self) -> Result<u64, LineTableError> {
        let mut b = self.byte()?;
        let mut v = u64::from(b & 63);
        let mut shift = 0u32;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 60 {
                return Err(LineTableError { at: self.i });
            }
            v |= u64::from(b & 63) << shift;
        }
        Ok(v)
    }

    fn svarint(&mut self) -> Result<i64, LineTableError> {
        let u = self.varint()?;
        let mag = (u >> 1) as i64;
        Ok(if u & 1 != 0 { -mag } else { mag })
    }
}

/// The line of the instruction at byte offset `addr` (strict `start <= addr < end`).
/// `addr < 0` (3.12's `prev_instr` of a frame that has not started) gives `firstlineno`.
pub fn line_at(table: &[u8], firstlineno: i32, addr: i64) -> Result<i32, LineTableError> {
    if addr < 0 {
        return Ok(firstlineno);
    }
    let mut c = Cursor { t: table, i: 0 };
    let mut line = i64::from(firstlineno);
    let mut start: i64 = 0;
    while c.i < table.len() {
        let first = c.byte()?;
        if first & 0x80 == 0 {
            // Not an entry start: the table (or our position in it) is corrupt.
            return Err(LineTableError { at: c.i - 1 });
        }
        let code = (first >> 3) & 15;
        let end = start + 2 * (i64::from(first & 7) + 1);
        let this = match code {
            15 => -1,
            13 => {
                line += c.svarint()?;
                line
            }
            14 => {
                line += c.svarint()?;
                for _ in 0..3 {
                    c.varint()?;
                }
                line
            }
            10..=12 => {
                line += i64::from(code) - 10;
                c.byte()?;
                c.byte()?;
                line
            }
            _ => {
                c.byte()?;
                line
            }
        };
        if start <= addr && addr < end {
            return Ok(i32::try_from(this).unwrap_or(-1));
        }
        start = end;
    }
    Ok(-1)
}

/// Encodes location tables (used by the synthetic images and the tests). Each call covers
/// `units` code units (1..=8) starting where the previous entry ended.
#[cfg(test)]
pub(crate) struct LineTableWriter {
    pub bytes: Vec<u8>,
    line: i64,
}

#[cfg(test)]
impl LineTableWriter {
    pub fn new(firstlineno: i32) -> LineTableWriter {
        LineTableWriter {
            bytes: Vec::new(),
            line: i64::from(firstlineno),
        }
    }

    fn head(&mut self, code: u8, units: u8) {
        assert!((1..=8).contains(&units));
        self.bytes.push(0x80 | (code << 3) | (units - 1));
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 64 {
            self.bytes.push(0x40 | (v & 63) as u8);
            v >>= 6;
        }
        self.bytes.push(v as u8);
    }

    fn svarint(&mut self, v: i64) {
        let u = if v < 0 {
            (v.unsigned_abs() << 1) | 1
        } else {
            (v as u64) << 1
        };
        self.varint(u);
    }

    /// Picks the shortest form CPython would use for a move to `line`.
    pub fn entry(&mut self, line: i32, units: u8) -> &mut Self {
        let delta = i64::from(line) - self.line;
        match delta {
            0 => self.short(units, 3, 2),
            1..=2 => self.one_line(units, delta as u8, 4, 9),
            _ => self.no_columns(line, units),
        }
    }

    /// Short form (codes 0-9): same line, column group `code`.
    pub fn short(&mut self, units: u8, code: u8, col: u8) -> &mut Self {
        self.head(code.min(9), units);
        self.bytes.push(((col & 7) << 4) | 5);
        self
    }

    /// One-line form (codes 10-12): line + `delta` (0..=2), raw start/end columns.
    pub fn one_line(&mut self, units: u8, delta: u8, col: u8, end_col: u8) -> &mut Self {
        self.head(10 + delta.min(2), units);
        self.bytes.extend([col, end_col]);
        self.line += i64::from(delta.min(2));
        self
    }

    /// Code 13: any line delta, no columns.
    pub fn no_columns(&mut self, line: i32, units: u8) -> &mut Self {
        self.head(13, units);
        self.svarint(i64::from(line) - self.line);
        self.line = i64::from(line);
        self
    }

    /// Code 14: long form with end line and columns.
    pub fn long(
        &mut self,
        line: i32,
        end_line_delta: u64,
        col: u64,
        end_col: u64,
        units: u8,
    ) -> &mut Self {
        self.head(14, units);
        self.svarint(i64::from(line) - self.line);
        self.varint(end_line_delta);
        self.varint(col + 1);
        self.varint(end_col + 1);
        self.line = i64::from(line);
        self
    }

    /// Code 15: no location.
    pub fn none(&mut self, units: u8) -> &mut Self {
        self.head(15, units);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_including_backwards_long_and_no_location() {
        let mut w = LineTableWriter::new(10);
        w.short(1, 0, 0) // units 0: line 10 (RESUME)
            .one_line(2, 1, 4, 8) // units 1-2: line 11
            .no_columns(5, 3) // units 3-5: line 5 (backwards)
            .none(1) // unit 6: no location
            .long(300, 2, 4, 70, 8) // units 7-14: line 300
            .no_columns(-3, 1) // unit 15: negative delta, line -3
            .one_line(1, 2, 0, 1); // unit 16: line -1
        let t = &w.bytes;
        let at = |unit: i64| line_at(t, 10, unit * 2).unwrap();
        assert_eq!(at(0), 10);
        assert_eq!((at(1), at(2)), (11, 11));
        assert_eq!((at(3), at(5)), (5, 5));
        assert_eq!(at(6), -1, "code 15 is -1");
        assert_eq!(
            (at(7), at(14)),
            (300, 300),
            "the running line survives code 15"
        );
        assert_eq!(at(15), -3);
        assert_eq!(at(16), -1);
        assert_eq!(at(17), -1, "past the end");
        assert_eq!(
            line_at(t, 10, -2).unwrap(),
            10,
            "prev_instr before the first unit"
        );
    }

    #[test]
    fn end_is_strict() {
        // Entry 1 covers units 0-2 (line 1), entry 2 starts exactly at unit 3 (a CALL, line 2).
        let mut w = LineTableWriter::new(1);
        w.short(3, 0, 0).one_line(4, 1, 0, 4);
        assert_eq!(line_at(&w.bytes, 1, 4).unwrap(), 1);
        assert_eq!(
            line_at(&w.bytes, 1, 6).unwrap(),
            2,
            "a non-strict end would give 1"
        );
        // Odd byte offsets inside a unit belong to that unit.
        assert_eq!(line_at(&w.bytes, 1, 5).unwrap(), 1);
    }

    #[test]
    fn long_varints_and_malformed_tables() {
        let mut w = LineTableWriter::new(1);
        w.no_columns(1_000_000, 8)
            .long(2_000_000_000, 100_000, 5000, 70_000, 1);
        assert_eq!(line_at(&w.bytes, 1, 0).unwrap(), 1_000_000);
        assert_eq!(line_at(&w.bytes, 1, 16).unwrap(), 2_000_000_000);
        // Truncated inside the varint of the second entry.
        let cut = &w.bytes[..w.bytes.len() - 2];
        assert!(line_at(cut, 1, 16).is_err());
        // The answer for an earlier entry does not depend on later garbage.
        assert_eq!(line_at(cut, 1, 0).unwrap(), 1_000_000);
        assert!(
            line_at(&[0x05], 1, 0).is_err(),
            "continuation byte where an entry starts"
        );
        assert!(
            line_at(
                &[
                    0xe8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
                ],
                1,
                0
            )
            .is_err()
        );
        assert_eq!(line_at(&[], 7, 0).unwrap(), -1);
        // The `__init__` shim's table: one code-15 entry.
        assert_eq!(line_at(&[0xfb], 0, 0).unwrap(), -1);
    }

    /// Hand-written tables in the formats of `Objects/lnotab_notes.txt` (3.9.18, 3.10.13).
    #[test]
    fn lnotab_and_pep626_by_hand() {
        // 3.9: line 10 @0, +6 bytes → line 11, +4 → line 9 (backwards), +300 bytes (split as
        // 255 + 45 with a 0 line step) → line 12.
        let lnotab = [0, 0, 6, 1, 4, 0xfe, 255, 0, 45, 3];
        let at = |a| line_at_lnotab(&lnotab, 10, a).unwrap();
        assert_eq!((at(-1), at(0), at(5)), (10, 10, 10));
        assert_eq!((at(6), at(9)), (11, 11));
        assert_eq!((at(10), at(309)), (9, 9), "backwards");
        assert_eq!((at(310), at(5000)), (12, 12));
        // 3.10: [0,6) line 11, [6,10) no line, [10,10) empty (line +2 counts), [10,14) line 12.
        let pep = [6, 1, 4, 0x80, 0, 2, 4, 0xff];
        let at = |a| line_at_pep626(&pep, 10, a).unwrap();
        assert_eq!((at(-2), at(0), at(5)), (10, 11, 11));
        assert_eq!((at(6), at(9)), (-1, -1), "-128 is no line");
        assert_eq!((at(10), at(13)), (12, 12));
        assert_eq!(at(14), -1, "past the end");
        assert_eq!(
            line_at_kind(LineTableKind::Pep626, &pep, 10, 0).unwrap(),
            11
        );
        assert_eq!(
            line_at_kind(LineTableKind::Lnotab, &lnotab, 10, 6).unwrap(),
            11
        );
    }

    #[test]
    fn old_encoders_round_trip_with_long_jumps() {
        let runs = [(5, 2u32), (400, 600), (3, 4), (3, 2), (-20, 8), (1000, 2)];
        for (table, kind) in [
            (encode_lnotab(5, &runs), LineTableKind::Lnotab),
            (encode_pep626(5, &runs), LineTableKind::Pep626),
        ] {
            let mut start = 0i64;
            for &(line, bytes) in &runs {
                for a in [start, start + i64::from(bytes) - 1] {
                    assert_eq!(
                        line_at_kind(kind, &table, 5, a).unwrap(),
                        line,
                        "{kind:?} @{a}"
                    );
                }
                start += i64::from(bytes);
            }
        }
    }

    #[test]
    fn random_tables_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 24) as usize;
            let t: Vec<u8> = (0..len)
                .map(|i| (x >> (i % 8 * 8)) as u8 ^ i as u8)
                .collect();
            for kind in [
                LineTableKind::Locations,
                LineTableKind::Pep626,
                LineTableKind::Lnotab,
            ] {
                let _ = line_at_kind(kind, &t, (x >> 40) as i32, (x % 64) as i64 - 2);
            }
        }
    }
}
