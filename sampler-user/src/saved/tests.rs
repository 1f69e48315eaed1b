//! Tests of the saved format: round trips (model and every rendered output), truncation at
//! every length, seeded random corruption, and each error's message.

use std::io::Write as _;

use prost::Message as _;

use super::*;
use crate::output::Format;
use crate::output::tests::demo_profile;
use crate::profile::{Frame, FrameId, FrameKind, GilState, NamedSample, Profile, RunMeta, StackId};

/// Frames of every kind, optional fields set and unset, non-ASCII names.
fn rich_frames() -> Vec<Frame> {
    let frame = |kind, name: &str, module: Option<&str>, file: Option<&str>, line| Frame {
        kind,
        name: name.into(),
        module: module.map(Into::into),
        file: file.map(Into::into),
        // Python frames under a `sys.path` entry keep their short name too.
        short_file: file
            .filter(|_| kind == FrameKind::Python)
            .and_then(|f| f.rsplit_once('/'))
            .map(|(_, base)| base.into()),
        line,
    };
    vec![
        frame(FrameKind::Process, "python3 (42)", None, None, None),
        frame(FrameKind::Thread, "wörker-1 (43)", None, None, None),
        frame(
            FrameKind::Python,
            "Klass.méthode",
            None,
            Some("/srv/app/ü.py"),
            Some(12),
        ),
        frame(
            FrameKind::Python,
            "<module>",
            None,
            Some("/srv/app/ü.py"),
            None,
        ),
        frame(FrameKind::Python, "f;g", None, Some("a.py"), Some(0)),
        frame(
            FrameKind::Native,
            "PyObject_Call",
            Some("libpython3.12.so.1.0"),
            Some("Objects/call.c"),
            Some(u32::MAX),
        ),
        frame(
            FrameKind::Native,
            "python3.14+0x1234",
            Some("python3.14"),
            None,
            None,
        ),
        frame(FrameKind::Kernel, "vfs_read", Some("vmlinux"), None, None),
        frame(FrameKind::Marker, "[truncated]", None, None, None),
        frame(FrameKind::Process, "日本語 (7)", None, None, None),
        frame(FrameKind::Thread, "", None, None, None),
    ]
}

/// A profile with every frame kind and GIL state, thread frames, non-ASCII text, optional
/// fields both set and unset, times that go backwards and wrap, and an errors map.
fn rich_profile() -> Profile {
    let mut errors = crate::failure::Failures::default();
    for (name, n) in [
        ("python_read_failed", 3),
        ("lost_in_user_space", 7),
        ("ünïcode kind", u64::MAX),
    ] {
        errors.add(crate::failure::Failure::from_name(name), n);
    }
    let mut p = Profile::new(RunMeta {
        host: "höst-1".into(),
        kernel: "6.18.0-test".into(),
        start_unix_s: 1_700_000_000,
        duration_s: 3.000_123_456_789,
        rate_hz: 997,
        cpus: 64,
        command_line: vec![
            "pyebpf".into(),
            "record".into(),
            "-o".into(),
            "ré sult.pyebpf".into(),
        ],
        lost_samples: 12,
        errors,
        idle: false,
    });
    p.keep_timeline();
    let ids: Vec<FrameId> = rich_frames()
        .into_iter()
        .map(|f| p.intern_frame(f))
        .collect();
    let stacks = [
        p.intern_stack(&[ids[0], ids[1], ids[3], ids[2], ids[5], ids[7]]),
        p.intern_stack(&[ids[0], ids[1], ids[8], ids[4]]),
        p.intern_stack(&[ids[9], ids[10], ids[6]]),
        p.intern_stack(&[ids[0]]),
        p.intern_stack(&[]),
    ];
    let gils = [
        GilState::Unknown,
        GilState::Held,
        GilState::Released,
        GilState::Disabled,
    ];
    let times = [
        5_000_000_000u64,
        4_999_000_000,
        u64::MAX,
        0,
        1,
        123_456_789_012,
    ];
    for i in 0..40usize {
        let (comm, pid, tid, thread): (&str, u32, u32, &str) = if i % 3 == 2 {
            ("日本語", 7, 7, "")
        } else {
            ("python3", 42, 43 + (i % 2) as u32, "wörker-1")
        };
        p.add_sample(NamedSample {
            stack: stacks[i % stacks.len()],
            time_ns: times[i % times.len()].wrapping_add(i as u64 * 10_101_010),
            pid,
            tid,
            cpu: (i % 5) as u32 * 1000,
            comm: comm.into(),
            thread_name: thread.into(),
            gil: gils[i % gils.len()],
            state: crate::profile::ThreadState::OnCpu,
            weight: 1,
        });
    }
    p
}

fn save(p: &Profile) -> Vec<u8> {
    let mut buf = Vec::new();
    writer::write_profile(p, &mut buf).unwrap();
    buf
}

/// An empty profile that keeps its (empty) timeline.
fn empty() -> Profile {
    let mut p = Profile::default();
    p.keep_timeline();
    p
}

fn load_profile(bytes: &[u8]) -> Profile {
    let l = load_from_with(bytes, true).unwrap();
    assert!(l.complete);
    l.profile
}

fn assert_same(a: &Profile, b: &Profile) {
    assert_eq!(a.frames(), b.frames());
    assert_eq!(a.stacks(), b.stacks());
    assert_eq!(a.timeline(), b.timeline());
    assert_eq!(a.counts(), b.counts());
    assert_eq!(a.meta, b.meta);
}

fn render(f: Format, p: &Profile) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    f.render(p, &mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

#[test]
fn round_trip_keeps_everything() {
    for p in [demo_profile(), rich_profile(), empty()] {
        let bytes = save(&p);
        assert_eq!(bytes[..8], MAGIC);
        assert_eq!(bytes[8..12], 2u32.to_le_bytes());
        let q = load_profile(&bytes);
        assert_same(&p, &q);
        // Interning still works on the loaded profile: same frame → same id.
        let mut q = q;
        for (i, f) in p.frames().iter().enumerate() {
            assert_eq!(q.intern_frame(f.clone()), FrameId(i as u32));
        }
        for (i, s) in p.stacks().iter().enumerate() {
            assert_eq!(q.intern_stack(s), StackId(i as u32));
        }
    }
}

#[test]
fn outputs_render_identically_from_the_loaded_profile() {
    for p in [demo_profile(), rich_profile()] {
        let q = load_profile(&save(&p));
        for (format, name) in Format::ALL {
            let (a, b) = (render(format, &p), render(format, &q));
            // Formats not built yet fail the same way for both.
            assert_eq!(a, b, "{name} differs after a save/load round trip");
            if matches!(
                format,
                Format::Collapsed | Format::Speedscope | Format::Flamegraph | Format::Pyebpf
            ) {
                assert!(a.is_ok_and(|a| !a.is_empty()), "{name} renders nothing");
            }
        }
    }
}

/// The chunks of a version 2 file: (kind, offset of the chunk's end).
fn chunk_ends(file: &[u8]) -> Vec<(u8, usize)> {
    let mut at = 12;
    let mut ends = Vec::new();
    while at < file.len() {
        let len = u32::from_le_bytes(file[at + 1..at + 5].try_into().unwrap()) as usize;
        ends.push((file[at], at + 5 + len));
        at += 5 + len;
    }
    assert_eq!(at, file.len());
    ends
}

/// A file of several batches of `per_batch` samples.
fn save_in_batches(p: &Profile, per_batch: usize) -> Vec<u8> {
    let mut w = SavedWriter::new(Vec::new(), &p.meta).unwrap();
    for batch in p.timeline().unwrap().chunks(per_batch) {
        w.write_batch(p, batch).unwrap();
    }
    w.finish(&p.meta).unwrap()
}

#[test]
fn every_cut_loads_up_to_its_last_complete_chunk() {
    for p in [demo_profile(), rich_profile(), empty()] {
        let bytes = save_in_batches(&p, 7);
        let ends = chunk_ends(&bytes);
        let all = p.timeline().unwrap();
        assert!(all.is_empty() || ends.len() >= 3, "{ends:?}");
        // Samples in the batches complete at each chunk end.
        let mut complete_samples = Vec::new();
        let mut n = 0;
        for (kind, end) in &ends {
            if *kind == ChunkKind::Batch as u8 {
                n = (n + 7).min(all.len());
            }
            complete_samples.push((*end, n));
        }
        for len in 0..=bytes.len() {
            let got = load_from_with(&bytes[..len], true);
            let Some(&(_, want)) = complete_samples.iter().rev().find(|(end, _)| *end <= len)
            else {
                assert!(
                    matches!(got, Err(FormatError::Corrupt(_))),
                    "prefix {len} before the start chunk: {got:?}"
                );
                continue;
            };
            let loaded = got.unwrap_or_else(|e| panic!("prefix {len} of {}: {e}", bytes.len()));
            assert_eq!(loaded.complete, len == bytes.len(), "prefix {len}");
            assert_eq!(
                loaded.profile.timeline().unwrap(),
                &all[..want],
                "prefix {len}"
            );
            if loaded.complete {
                assert_same(&loaded.profile, &p);
            }
        }
    }
}

/// A tiny seeded generator (xorshift64*), so the corruption tests repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Flips 1–4 random bits or bytes of `data`, `rounds` times; `check` must not panic.
fn flip_rounds(data: &[u8], seed: u64, rounds: usize, check: impl Fn(&[u8])) {
    let mut rng = Rng(seed);
    for round in 0..rounds {
        let mut d = data.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(d.len());
            if rng.next().is_multiple_of(2) {
                d[at] ^= 1 << rng.below(8);
            } else {
                d[at] = rng.next() as u8;
            }
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&d)));
        assert!(ok.is_ok(), "panic on round {round} of seed {seed:#x}");
    }
}

/// The one message of a version 1 file holding `p` (start, batch and end merged).
fn v1_message(p: &Profile) -> schema::SavedProfile {
    let file = save_in_batches(p, usize::MAX);
    let mut merged = schema::SavedProfile::default();
    let mut at = 12;
    for (kind, end) in chunk_ends(&file) {
        let mut body = &file[at + 5..end];
        let m = schema::SavedProfile::decode(&reader::decompress(&mut body, 1 << 30).unwrap()[..])
            .unwrap();
        match kind {
            1 => {
                merged.writer = m.writer;
                merged.writer_version = m.writer_version;
            }
            2 => {
                merged.strings.extend(m.strings);
                merged.frames.extend(m.frames);
                merged.stacks.extend(m.stacks);
                merged.samples = m.samples;
            }
            _ => merged.meta = m.meta,
        }
        at = end;
    }
    merged
}

/// A version 1 file of a message.
fn v1_file(m: &schema::SavedProfile) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&m.encode_to_vec()).unwrap();
    gz.finish().unwrap()
}

fn load_v1(m: &schema::SavedProfile) -> Result<Profile, FormatError> {
    load_from_with(&v1_file(m)[..], true).map(|l| l.profile)
}

#[test]
fn version_1_files_are_still_read() {
    for p in [demo_profile(), rich_profile()] {
        let loaded = load_from_with(&v1_file(&v1_message(&p))[..], true).unwrap();
        assert!(loaded.complete);
        assert_same(&loaded.profile, &p);
    }
    let mut trailing = v1_file(&v1_message(&demo_profile()));
    trailing.push(0);
    assert_eq!(
        load_from(&trailing[..]).unwrap_err().to_string(),
        "truncated or corrupt: data after the end of the compressed profile"
    );
}

#[test]
fn random_corruption_never_panics() {
    let file = save_in_batches(&rich_profile(), 9);
    flip_rounds(&file, 0x5eed_0001, 3000, |d| {
        if let Ok(l) = load_from(d) {
            for f in [Format::Collapsed, Format::Speedscope, Format::Flamegraph] {
                f.render(&l.profile, &mut Vec::new()).unwrap();
            }
        }
    });
    // Below gzip's CRC: corrupt protobuf messages must be refused or loaded, never panic.
    let payload = v1_message(&rich_profile()).encode_to_vec();
    flip_rounds(&payload, 0x5eed_0002, 3000, |d| {
        let Ok(m) = schema::SavedProfile::decode(d) else {
            return;
        };
        if let Ok(p) = load_v1(&m) {
            // Whatever loads is consistent: every output renders.
            for f in [Format::Collapsed, Format::Speedscope, Format::Flamegraph] {
                f.render(&p, &mut Vec::new()).unwrap();
            }
        }
    });
}

#[test]
fn error_messages() {
    let file = save(&demo_profile());
    let msg = |bytes: &[u8]| load_from(bytes).unwrap_err().to_string();

    let mut newer = file.clone();
    newer[8..12].copy_from_slice(&7u32.to_le_bytes());
    assert!(matches!(
        load_from(&newer[..]),
        Err(FormatError::Newer { version: 7 })
    ));
    assert_eq!(
        msg(&newer),
        "written by a newer pyebpf (format version 7; this pyebpf reads up to version 3)"
    );

    assert_eq!(
        msg(b"<?xml version=\"1.0\"?><svg/>"),
        "not a pyebpf profile (bad magic)"
    );
    assert_eq!(msg(b"\x1f\x8b"), "not a pyebpf profile (bad magic)");
    assert_eq!(msg(b""), "truncated or corrupt: empty file");
    assert!(msg(&file[..5]).starts_with("truncated or corrupt: "));
    // Cut inside the end chunk: loads, incomplete.
    let cut = load_from(&file[..file.len() - 1]).unwrap();
    assert!(!cut.complete);

    let mut zero = file.clone();
    zero[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(msg(&zero), "truncated or corrupt: format version 0");

    let mut trailing = file.clone();
    trailing.push(0);
    assert_eq!(
        msg(&trailing),
        "truncated or corrupt: data after the end chunk"
    );

    let mut header_only = file[..12].to_vec();
    assert_eq!(msg(&header_only), "truncated or corrupt: no complete chunk");
    header_only.extend_from_slice(b"garbage");
    assert_eq!(
        msg(&header_only),
        "truncated or corrupt: unknown chunk kind 103"
    );
    let mut bad_gzip = file[..12].to_vec();
    bad_gzip.extend_from_slice(&[1, 4, 0, 0, 0, 1, 2, 3, 4]);
    assert!(msg(&bad_gzip).starts_with("truncated or corrupt: compressed data"));

    for bytes in [&newer[..], b"nope", &file[..20], &trailing[..]] {
        assert_eq!(msg(bytes).lines().count(), 1);
    }
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("pyebpf-saved-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.pyebpf");
    std::fs::write(&path, b"not a profile at all").unwrap();
    let e = load(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("{}: not a pyebpf profile (bad magic)", path.display())
    );
    std::fs::write(&path, save(&demo_profile())).unwrap();
    assert_same(&load_with(&path, true).unwrap().profile, &demo_profile());
    assert_eq!(
        load(&path).unwrap().profile.timeline(),
        None,
        "no timeline unless asked"
    );
    let e = load(&dir.join("missing.pyebpf")).unwrap_err();
    assert!(matches!(e.error, FormatError::Read(_)), "{e}");
    assert!(
        e.to_string().contains("missing.pyebpf: cannot read: "),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Checked fields of the message: each inconsistency is refused with its own detail.
#[test]
fn inconsistent_messages_are_refused() {
    let good = v1_message(&rich_profile());
    let refused = |edit: &dyn Fn(&mut schema::SavedProfile), want: &str| {
        let mut m = good.clone();
        edit(&mut m);
        let e = load_v1(&m).unwrap_err().to_string();
        assert!(
            e.starts_with("truncated or corrupt: ") && e.contains(want),
            "want {want:?} in {e:?}"
        );
    };
    let n_strings = good.strings.len() as u32;
    let n_frames = good.frames.len() as u32;
    let n_stacks = good.stacks.len() as u32;
    refused(&|m| m.writer.clear(), "no writer");
    refused(&|m| m.meta = None, "no run metadata");
    refused(&|m| m.samples = None, "no samples");
    refused(&|m| m.frames[1].name = n_strings, "frame 1 names string");
    refused(
        &|m| m.frames[2].file = Some(u32::MAX),
        "frame 2 names string",
    );
    refused(&|m| m.frames[0].kind = 0, "unknown kind 0");
    refused(&|m| m.frames[0].kind = 99, "unknown kind 99");
    refused(
        &|m| m.frames[3] = m.frames[2].clone(),
        "frame 3 is a duplicate",
    );
    refused(
        &|m| m.stacks[1].frames[0] = n_frames,
        "stack 1 refers to frame",
    );
    refused(
        &|m| m.stacks[2] = m.stacks[0].clone(),
        "stack 2 is a duplicate",
    );
    refused(
        &|m| m.samples.as_mut().unwrap().stack[5] = n_stacks,
        "sample 5 refers to stack",
    );
    refused(
        &|m| m.samples.as_mut().unwrap().comm[3] = n_strings,
        "sample 3 names string",
    );
    refused(
        &|m| m.samples.as_mut().unwrap().gil[4] = 4,
        "sample 4 has unknown GIL state 4",
    );
    refused(
        &|m| {
            m.samples.as_mut().unwrap().tid.pop();
        },
        "sample columns of different lengths",
    );
    refused(
        &|m| {
            let e = m.meta.as_mut().unwrap();
            e.errors.push(e.errors[0].clone());
        },
        "listed twice",
    );
    // Unknown fields (a newer writer's additions) are skipped.
    let mut extended = good.encode_to_vec();
    extended.extend_from_slice(&[0xf8, 0x01, 0x05]); // field 31, varint 5
    let m = schema::SavedProfile::decode(&extended[..]).unwrap();
    assert_same(&load_v1(&m).unwrap(), &rich_profile());
}

/// A version 2 file: start chunk, then `chunks` (kind, message) as they are.
fn crafted(chunks: &[(ChunkKind, schema::SavedProfile)]) -> Vec<u8> {
    let mut out = Vec::new();
    let w = SavedWriter::new(&mut out, &RunMeta::default()).unwrap();
    drop(w);
    for (kind, m) in chunks {
        writer::write_chunk(&mut out, *kind, m).unwrap();
    }
    out
}

/// A batch of `n` samples all on stack 0 of `depth` copies of one frame.
fn deep_batch(depth: usize, n: usize, name_len: usize) -> schema::SavedProfile {
    schema::SavedProfile {
        strings: vec!["x".repeat(name_len)],
        frames: vec![schema::Frame {
            kind: schema::FrameKind::Native as i32,
            name: 0,
            module: None,
            file: None,
            line: None,
            short_file: None,
        }],
        stacks: vec![schema::Stack {
            frames: vec![0; depth],
        }],
        samples: Some(schema::Samples {
            time_delta_ns: vec![0; n],
            cpu: vec![0; n],
            pid: vec![0; n],
            tid: vec![0; n],
            comm: vec![0; n],
            thread_name: vec![0; n],
            gil: vec![0; n],
            stack: vec![0; n],
            state: Vec::new(),
            weight: Vec::new(),
        }),
        ..schema::SavedProfile::default()
    }
}

/// Crafted files: each is refused quickly, in one line, before it costs more than its size.
#[test]
fn crafted_files_are_refused_within_bounds() {
    let refused = |file: &[u8], want: &str| {
        let t0 = std::time::Instant::now();
        let e = load_from(file).unwrap_err().to_string();
        assert!(e.contains(want), "want {want:?} in {e:?}");
        assert_eq!(e.lines().count(), 1);
        assert!(
            t0.elapsed().as_secs() < 20,
            "{want}: took {:?}",
            t0.elapsed()
        );
    };
    // A chunk that claims 4 GiB: nothing is allocated for it.
    let mut huge = crafted(&[]);
    huge.extend_from_slice(&[2, 0xff, 0xff, 0xff, 0xff]);
    refused(&huge, "a chunk of 4294967295 bytes");
    // Decompression bomb: 300 MiB of zeros in a few hundred KiB.
    let mut bomb = crafted(&[]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..300 {
        gz.write_all(&zeros).unwrap();
    }
    let body = gz.finish().unwrap();
    bomb.push(ChunkKind::Batch as u8);
    bomb.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bomb.extend_from_slice(&body);
    refused(&bomb, "more than 64 MiB uncompressed");
    // A stack deeper than any recording.
    refused(
        &crafted(&[(ChunkKind::Batch, deep_batch(100_000, 1, 1))]),
        "100000 frames deep",
    );
    // Millions of samples of one stack in a small file (what made `script` print 20 GB).
    refused(
        &crafted(&[(ChunkKind::Batch, deep_batch(1, 5_000_000, 1))]),
        "samples in",
    );
    // A deep stack repeated: few samples, many frames printed.
    refused(
        &crafted(&[(ChunkKind::Batch, deep_batch(1000, 200_000, 1))]),
        "frames over all samples",
    );
    // Long names in deep unique stacks (what made the flame graph take 3 GB).
    let mut wide = deep_batch(1000, 1, 60_000);
    for i in 1..500 {
        wide.stacks.push(schema::Stack {
            frames: vec![0; 1000 - i],
        });
    }
    refused(&crafted(&[(ChunkKind::Batch, wide)]), "bytes of stack text");
    // A string longer than any name.
    refused(
        &crafted(&[(ChunkKind::Batch, deep_batch(1, 1, 1 << 20))]),
        "a string of 1048576 bytes",
    );
}

#[test]
fn compact_enough() {
    // A 10 000-sample run of one hot process: a few bytes per sample after compression.
    let mut p = Profile::new(RunMeta {
        rate_hz: 99,
        ..RunMeta::default()
    });
    p.keep_timeline();
    let mut stacks = Vec::new();
    for s in 0..50 {
        let mut ids = vec![p.intern_frame(Frame::new(FrameKind::Process, "python3 (1234)"))];
        for d in 0..20 {
            let mut f = Frame::new(FrameKind::Python, format!("fn_{d}_{}", s % (d + 1)));
            f.file = Some("/srv/app/main.py".into());
            f.line = Some(d * 10 + 1);
            ids.push(p.intern_frame(f));
        }
        stacks.push(p.intern_stack(&ids));
    }
    let mut rng = Rng(7);
    let mut t = 1_000_000_000_000u64;
    for _ in 0..10_000 {
        t += 10_101_010 / 4 + rng.below(1000) as u64;
        p.add_sample(NamedSample {
            stack: stacks[rng.below(stacks.len())],
            time_ns: t,
            pid: 1234,
            tid: 1234 + rng.below(4) as u32,
            cpu: rng.below(4) as u32,
            comm: "python3".into(),
            thread_name: "MainThread".into(),
            gil: GilState::Held,
            state: crate::profile::ThreadState::OnCpu,
            weight: 1,
        });
    }
    let bytes = save(&p);
    let per_sample = bytes.len() as f64 / 10_000.0;
    eprintln!(
        "{} bytes, {per_sample:.2} bytes/sample (random stacks/tids/cpus)",
        bytes.len()
    );
    assert!(per_sample < 8.0, "{per_sample} bytes per sample");
}
