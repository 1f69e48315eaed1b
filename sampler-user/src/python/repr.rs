//! Python's own `repr()` of `str`, `bytes`, `int` and `float` values read out of a target.
//!
//! Owns: the text of those four reprs, exactly as CPython writes them, and [`Bounded`], the
//! output buffer that caps a rendered value at a number of characters.
//! Input: decoded values (code points, bytes, 30-bit digits, an `f64`) and the Unicode version
//! of the target's database (which characters `repr()` leaves unescaped depends on it).
//! Output: text appended to a [`Bounded`].
//! Constraints: pure, no I/O; every output is bounded by the caller's [`Bounded`]; work on an
//! `int` is bounded by its digit count, which the caller caps.
//! Rules, from CPython (`Objects/unicodeobject.c` `unicode_repr`, `Objects/bytesobject.c`
//! `PyBytes_Repr`, `Objects/longobject.c` `long_to_decimal_string_internal`,
//! `Python/pystrtod.c` `format_float_short` for `float_repr`'s mode `'r'`), e.g.
//! <https://github.com/python/cpython/blob/v3.13.0/Objects/unicodeobject.c>:
//! - quotes: `'`, unless the text holds `'` and no `"`; then `"`.
//! - `str`: the quote and `\` are backslash-escaped; `\t` `\n` `\r`; other characters below
//!   U+0020 and U+007F as `\xhh`; other non-printable characters as `\xhh`, `\uhhhh` or
//!   `\Uhhhhhhhh` (lowercase hex); printable per `Py_UNICODE_ISPRINTABLE` of the target's
//!   Unicode version ([`is_printable`], table generated from the interpreters themselves).
//! - `bytes`: `b` + quote; the quote and `\` escaped; `\t` `\n` `\r`; bytes below 0x20 and from
//!   0x7f on as `\xhh`.
//! - `float`: the shortest digits that round-trip; exponent form when the decimal exponent is
//!   below -4 or above 15 (`1e-05`, `1e+16`, at least two exponent digits), else positional with
//!   `.0` added to integral values; `inf`, `-inf`, `nan` (the sign of a NaN is not shown).
//! - `int`: base 10 from base 2^30 through base 10^9 groups, as CPython converts.

use std::fmt::Write as _;

use super::printable_table::{DIFFERENCES, LATEST, PRINTABLE};

/// A text buffer that keeps at most `max` characters; what does not fit is replaced by `...`.
#[derive(Debug, Clone)]
pub struct Bounded {
    text: String,
    chars: usize,
    max: usize,
    full: bool,
}

impl Bounded {
    /// A buffer for at most `max` characters (at least 4, so that `...` fits).
    pub fn new(max: usize) -> Bounded {
        Bounded {
            text: String::new(),
            chars: 0,
            max: max.max(4),
            full: false,
        }
    }

    /// Whether more output would be cut (callers stop reading the target then).
    pub fn is_full(&self) -> bool {
        self.full
    }

    pub fn push(&mut self, c: char) {
        if self.full {
            return;
        }
        if self.chars + 1 > self.max {
            self.cut();
            return;
        }
        self.text.push(c);
        self.chars += 1;
    }

    pub fn push_str(&mut self, s: &str) {
        for c in s.chars() {
            if self.full {
                return;
            }
            self.push(c);
        }
    }

    /// Marks the value as cut: its last characters become `...`.
    pub fn cut(&mut self) {
        if self.full {
            return;
        }
        while self.chars > self.max - 3 {
            self.text.pop();
            self.chars -= 1;
        }
        self.text.push_str("...");
        self.chars += 3;
        self.full = true;
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn into_string(self) -> String {
        self.text
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex(out: &mut Bounded, prefix: char, value: u32, digits: u32) {
    out.push('\\');
    out.push(prefix);
    for i in (0..digits).rev() {
        out.push(char::from(HEX[((value >> (4 * i)) & 0xf) as usize]));
    }
}

fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    let i = ranges.partition_point(|&(lo, _)| lo <= cp);
    i > 0 && cp <= ranges[i - 1].1
}

/// `Py_UNICODE_ISPRINTABLE(cp)` in an interpreter whose Unicode database is `unicode`
/// (`unicodedata.unidata_version`); an unknown version is taken as the newest known.
pub fn is_printable(cp: u32, unicode: &str) -> bool {
    let base = in_ranges(PRINTABLE, cp);
    if unicode == LATEST {
        return base;
    }
    let differs = DIFFERENCES
        .iter()
        .find(|(v, _)| *v == unicode)
        .is_some_and(|(_, r)| in_ranges(r, cp));
    base != differs
}

/// The quote `repr()` chooses: `"` only when the text holds `'` and no `"`.
fn quote_for(has_single: bool, has_double: bool) -> char {
    if has_single && !has_double { '"' } else { '\'' }
}

/// `repr()` of a `str` of these code points (surrogates included). `cut` says the string
/// continues beyond `cps` (it was read only in part): the output then ends in `...`.
pub fn str_repr(cps: &[u32], cut: bool, unicode: &str, out: &mut Bounded) {
    let quote = quote_for(
        cps.contains(&u32::from('\'')),
        cps.contains(&u32::from('"')),
    );
    out.push(quote);
    for &cp in cps {
        if out.is_full() {
            return;
        }
        match cp {
            _ if cp == u32::from(quote) || cp == u32::from('\\') => {
                out.push('\\');
                out.push(char::from_u32(cp).unwrap_or('?'));
            }
            0x09 => out.push_str("\\t"),
            0x0a => out.push_str("\\n"),
            0x0d => out.push_str("\\r"),
            0..0x20 | 0x7f => hex(out, 'x', cp, 2),
            0x20..0x7f => out.push(char::from_u32(cp).unwrap_or('?')),
            _ => match char::from_u32(cp).filter(|_| is_printable(cp, unicode)) {
                Some(c) => out.push(c),
                None if cp <= 0xff => hex(out, 'x', cp, 2),
                None if cp <= 0xffff => hex(out, 'u', cp, 4),
                None => hex(out, 'U', cp, 8),
            },
        }
    }
    if cut {
        out.cut();
    } else {
        out.push(quote);
    }
}

/// `repr()` of a `bytes` value; `cut` as for [`str_repr`].
pub fn bytes_repr(bytes: &[u8], cut: bool, out: &mut Bounded) {
    let quote = quote_for(bytes.contains(&b'\''), bytes.contains(&b'"'));
    out.push('b');
    out.push(quote);
    for &b in bytes {
        if out.is_full() {
            return;
        }
        match b {
            _ if b == quote as u8 || b == b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            0x20..0x7f => out.push(char::from(b)),
            _ => hex(out, 'x', u32::from(b), 2),
        }
    }
    if cut {
        out.cut();
    } else {
        out.push(quote);
    }
}

/// `repr()` of a `float`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.into();
    }
    // Rust's `{:e}` prints the shortest digits that round-trip (`d.ddde±x`), like David Gay's
    // mode 0 that CPython uses; only the layout differs.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    // CPython's `decpt`: the value is 0.DIGITS × 10^decpt.
    let decpt = exp + 1;
    let mut out = String::new();
    if x.is_sign_negative() {
        out.push('-');
    }
    let n = digits.len() as i32;
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        out.push('e');
        out.push(if e < 0 { '-' } else { '+' });
        let _ = write!(out, "{:02}", e.unsigned_abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-decpt) as usize));
        out.push_str(&digits);
    } else if decpt < n {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    } else {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
        out.push_str(".0");
    }
    out
}

/// Bits per digit of CPython's `int` on 64-bit builds (`PyLong_SHIFT`).
pub const DIGIT_BITS: u32 = 30;
const DECIMAL_BASE: u64 = 1_000_000_000;

/// `repr()` of an `int` given its sign and its base-2^30 digits, least significant first.
pub fn int_repr(negative: bool, digits: &[u32]) -> String {
    // Base 2^30 → base 10^9, most significant digit first (CPython's own loop).
    let mut groups: Vec<u32> = Vec::with_capacity(digits.len() * 10 / 9 + 2);
    for &d in digits.iter().rev() {
        let mut hi = u64::from(d & ((1 << DIGIT_BITS) - 1));
        for g in &mut groups {
            let z = (u64::from(*g) << DIGIT_BITS) | hi;
            hi = z / DECIMAL_BASE;
            *g = (z - hi * DECIMAL_BASE) as u32;
        }
        while hi != 0 {
            groups.push((hi % DECIMAL_BASE) as u32);
            hi /= DECIMAL_BASE;
        }
    }
    let mut out = String::with_capacity(groups.len() * 9 + 1);
    let Some((top, rest)) = groups.split_last() else {
        return "0".into();
    };
    if negative {
        out.push('-');
    }
    out.push_str(&top.to_string());
    for g in rest.iter().rev() {
        let _ = write!(out, "{g:09}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> String {
        let cps: Vec<u32> = text.chars().map(u32::from).collect();
        let mut out = Bounded::new(1000);
        str_repr(&cps, false, "15.0.0", &mut out);
        out.into_string()
    }

    /// Expected values are what CPython 3.12 prints for `repr(...)` of the same value.
    #[test]
    fn str_quotes_and_escapes() {
        assert_eq!(s("abc"), "'abc'");
        assert_eq!(s("it's"), "\"it's\"");
        assert_eq!(s("say \"hi\""), "'say \"hi\"'");
        assert_eq!(s("both ' and \""), "'both \\' and \"'");
        assert_eq!(
            s("a\\b\t\n\r\x00\x1f\x7f"),
            "'a\\\\b\\t\\n\\r\\x00\\x1f\\x7f'"
        );
        assert_eq!(s("café Привет 🐍"), "'café Привет 🐍'");
        // U+0085 (NEL, Cc), U+00A0 (NBSP, Zs), U+00AD (soft hyphen, Cf), U+200B, U+2028,
        // U+E000 (private use), U+10FFFF (unassigned), U+E0001 (Cf).
        assert_eq!(
            s("\u{85}\u{a0}\u{ad}\u{200b}\u{2028}\u{e000}\u{10ffff}\u{e0001}"),
            "'\\x85\\xa0\\xad\\u200b\\u2028\\ue000\\U0010ffff\\U000e0001'"
        );
        let mut out = Bounded::new(100);
        str_repr(&[0xd800, u32::from('x')], false, "15.0.0", &mut out);
        assert_eq!(out.as_str(), "'\\ud800x'", "lone surrogate");
    }

    #[test]
    fn printable_depends_on_the_unicode_version() {
        // U+1FAE8 (SHAKING FACE) was assigned in Unicode 15.0: printable in 3.12, escaped by
        // 3.11 (Unicode 14.0).
        assert!(is_printable(0x1fae8, "15.0.0"));
        assert!(!is_printable(0x1fae8, "14.0.0"));
        assert!(is_printable(u32::from('é'), "12.1.0"));
        assert!(!is_printable(0x378, LATEST), "unassigned");
    }

    #[test]
    fn bytes_reprs() {
        let b = |v: &[u8]| {
            let mut out = Bounded::new(1000);
            bytes_repr(v, false, &mut out);
            out.into_string()
        };
        assert_eq!(b(b""), "b''");
        assert_eq!(b(b"it's"), "b\"it's\"");
        assert_eq!(b(b"'\""), "b'\\'\"'");
        assert_eq!(
            b(b"\x00\xff\t\n\r\\ok\x7f"),
            "b'\\x00\\xff\\t\\n\\r\\\\ok\\x7f'"
        );
    }

    #[test]
    fn float_reprs() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1.5, "1.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123_456_789_012_345_680.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e300, "1e+300"),
            (-2.5e-300, "-2.5e-300"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (-f64::NAN, "nan"),
            (2.0 / 3.0, "0.6666666666666666"),
            (100.0, "100.0"),
            (9_007_199_254_740_993.0, "9007199254740992.0"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(*x), *want, "{x:?}");
        }
    }

    fn digits_of(mut v: u128) -> Vec<u32> {
        let mut d = Vec::new();
        while v != 0 {
            d.push((v & 0x3fff_ffff) as u32);
            v >>= 30;
        }
        d
    }

    #[test]
    fn int_reprs() {
        assert_eq!(int_repr(false, &[]), "0");
        assert_eq!(int_repr(false, &digits_of(7)), "7");
        assert_eq!(int_repr(true, &digits_of(1_000_000_000)), "-1000000000");
        assert_eq!(
            int_repr(false, &digits_of(u128::MAX)),
            u128::MAX.to_string()
        );
        // 2**200 (the big int of the e2e workload), checked against CPython.
        let mut d = vec![0u32; 6];
        d.push(1 << 20);
        assert_eq!(
            int_repr(false, &d),
            "1606938044258990275541962092341162602522202993782792835301376"
        );
        // 10**100 - 1: every group full of nines.
        let r = int_repr(false, &big_pow10_minus_1(100));
        assert_eq!(r, "9".repeat(100));
    }

    /// 10**n - 1 in base 2^30 (schoolbook multiplication), to test long carries.
    fn big_pow10_minus_1(n: usize) -> Vec<u32> {
        let mut d: Vec<u32> = vec![1];
        for _ in 0..n {
            let mut carry = 0u64;
            for x in &mut d {
                let v = u64::from(*x) * 10 + carry;
                *x = (v & 0x3fff_ffff) as u32;
                carry = v >> 30;
            }
            if carry != 0 {
                d.push(carry as u32);
            }
        }
        // minus one
        for x in &mut d {
            if *x == 0 {
                *x = 0x3fff_ffff;
            } else {
                *x -= 1;
                break;
            }
        }
        while d.last() == Some(&0) {
            d.pop();
        }
        d
    }

    #[test]
    fn bounded_cuts_with_a_marker() {
        let mut b = Bounded::new(8);
        b.push_str("abcdefgh");
        assert_eq!(b.as_str(), "abcdefgh");
        assert!(!b.is_full());
        b.push('i');
        assert_eq!(b.as_str(), "abcde...");
        assert!(b.is_full());
        let mut out = Bounded::new(10);
        let cps: Vec<u32> = "hello world, long".chars().map(u32::from).collect();
        str_repr(&cps, false, LATEST, &mut out);
        assert_eq!(out.as_str(), "'hello ...");
        let mut out = Bounded::new(100);
        str_repr(&cps[..5], true, LATEST, &mut out);
        assert_eq!(out.as_str(), "'hello...", "a string read in part");
    }
}
