//! `repr` against the real interpreters: each provisioned CPython (3.8–3.13, 3.13t, Debian's
//! 3.14 and 3.15) prints `repr()` of thousands of seeded random floats (from random bit
//! patterns), ints (up to 3,000 bits, both signs), strings (code points from every plane,
//! surrogates, quotes and controls) and byte strings; `python::repr` must print exactly the
//! same. The printable table is checked against each interpreter's own answer for every code
//! point. A missing interpreter fails under `CI=true` and is SKIPPED otherwise.

use std::process::Stdio;

use serde_json::Value;

use super::facts::version_facts;
use super::live_tests::{Interp, interp};
use super::repr::{Bounded, bytes_repr, float_repr, int_repr, is_printable, str_repr};

const SCRIPT: &str = r#"
import json, random, struct, sys, unicodedata
r = random.Random(20261201)
floats = []
for _ in range(4000):
    bits = r.getrandbits(64)
    floats.append([format(bits, "016x"), repr(struct.unpack("<d", struct.pack("<Q", bits))[0])])
for x in [0.0, -0.0, 1.0, 1e16, 1e15, 1e-5, 1e-4, 0.1, 1/3, 2.0**53 + 1, 5e-324, 1.7976931348623157e308,
          123456789.0, 1e22, 1e21, 9.999999999999999e15, float("inf"), float("-inf"), float("nan")]:
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    floats.append([format(bits, "016x"), repr(x)])
ints = []
for _ in range(600):
    v = r.getrandbits(r.choice([1, 7, 30, 31, 60, 64, 90, 200, 1000, 3000]))
    if r.random() < 0.5:
        v = -v
    ints.append([format(abs(v), "x"), v < 0, repr(v)])
pools = [range(0x20, 0x7f), range(0, 0x20), range(0x80, 0x100), range(0x100, 0x800),
         range(0x800, 0x10000), range(0xd800, 0xe000), range(0x10000, 0x110000), [0x27, 0x22, 0x5c]]
strs = []
for _ in range(1500):
    cps = [r.choice(r.choice(pools)) for _ in range(r.randrange(0, 12))]
    strs.append([cps, repr("".join(map(chr, cps)))])
byts = []
for _ in range(500):
    b = bytes(r.choice([r.randrange(256), 0x27, 0x22, 0x5c]) for _ in range(r.randrange(0, 12)))
    byts.append([b.hex(), repr(b)])
json.dump({"unicode": unicodedata.unidata_version, "floats": floats, "ints": ints, "strs": strs,
           "bytes": byts}, sys.stdout)
"#;

fn run(i: &Interp, source: &str) -> Value {
    let out = i
        .command()
        .arg("-c")
        .arg(source)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", i.name));
    assert!(
        out.status.success(),
        "{}: {}",
        i.name,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{}: {e}", i.name))
}

/// Base-2^30 digits of a hex magnitude, least significant first.
fn digits_from_hex(hex: &str) -> Vec<u32> {
    let bits: Vec<bool> = hex
        .chars()
        .rev()
        .flat_map(|c| {
            let v = c.to_digit(16).unwrap();
            (0..4).map(move |i| (v >> i) & 1 == 1)
        })
        .collect();
    let mut digits: Vec<u32> = bits
        .chunks(30)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << i))
        })
        .collect();
    while digits.last() == Some(&0) {
        digits.pop();
    }
    digits
}

fn reprs_match(name: &'static str) {
    let Some(i) = interp(name) else { return };
    let v = run(&i, SCRIPT);
    let unicode = v["unicode"].as_str().unwrap();
    let minor: u8 = name
        .split('.')
        .nth(1)
        .map(|m| m.trim_end_matches(|c: char| !c.is_ascii_digit()))
        .and_then(|m| m.parse().ok())
        .unwrap();
    let facts = version_facts(3, minor, name.ends_with('t')).unwrap();
    assert_eq!(
        facts.unicode_version, unicode,
        "{name}: the version facts name another Unicode version"
    );
    let mut checked = 0;
    for f in v["floats"].as_array().unwrap() {
        let bits = u64::from_str_radix(f[0].as_str().unwrap(), 16).unwrap();
        assert_eq!(
            float_repr(f64::from_bits(bits)),
            f[1].as_str().unwrap(),
            "{name}: float bits {bits:#x}"
        );
        checked += 1;
    }
    for n in v["ints"].as_array().unwrap() {
        let digits = digits_from_hex(n[0].as_str().unwrap());
        assert_eq!(
            int_repr(n[1].as_bool().unwrap(), &digits),
            n[2].as_str().unwrap(),
            "{name}: int {n}"
        );
        checked += 1;
    }
    for s in v["strs"].as_array().unwrap() {
        let cps: Vec<u32> = s[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap() as u32)
            .collect();
        let mut out = Bounded::new(1 << 16);
        str_repr(&cps, false, unicode, &mut out);
        assert_eq!(out.as_str(), s[1].as_str().unwrap(), "{name}: str {cps:x?}");
        checked += 1;
    }
    for b in v["bytes"].as_array().unwrap() {
        let hex = b[0].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|k| u8::from_str_radix(&hex[k..k + 2], 16).unwrap())
            .collect();
        let mut out = Bounded::new(1 << 16);
        bytes_repr(&bytes, false, &mut out);
        assert_eq!(out.as_str(), b[1].as_str().unwrap(), "{name}: bytes {hex}");
        checked += 1;
    }
    assert!(checked > 6000, "{name}: only {checked} values");
    // Every code point: the table against the interpreter's own repr().
    let table = run(&i, include_str!("../../../xtask/scripts/printable.py"));
    assert_eq!(table["unicode"], unicode);
    let mut printable = vec![false; 0x11_0000];
    for r in table["ranges"].as_array().unwrap() {
        let (lo, hi) = (
            r[0].as_u64().unwrap() as usize,
            r[1].as_u64().unwrap() as usize,
        );
        printable[lo..=hi].fill(true);
    }
    let wrong: Vec<u32> = (0..0x11_0000u32)
        .filter(|&c| is_printable(c, unicode) != printable[c as usize])
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "{name}: Unicode {unicode}: the table is wrong for {wrong:x?} (cargo xtask gen-printable)"
    );
}

#[test]
fn reprs_match_3_8() {
    reprs_match("3.8");
}

#[test]
fn reprs_match_3_9() {
    reprs_match("3.9");
}

#[test]
fn reprs_match_3_10() {
    reprs_match("3.10");
}

#[test]
fn reprs_match_3_11() {
    reprs_match("3.11");
}

#[test]
fn reprs_match_3_12() {
    reprs_match("3.12");
}

#[test]
fn reprs_match_3_13() {
    reprs_match("3.13");
}

#[test]
fn reprs_match_3_13t() {
    reprs_match("3.13t");
}

#[test]
fn reprs_match_3_14() {
    reprs_match("3.14");
}

#[test]
fn reprs_match_3_15() {
    reprs_match("3.15");
}
