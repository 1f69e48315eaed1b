//! Seeds of the fuzz corpora, and the replay of every saved crash (`fuzz/regressions/`).
//!
//! Seeds come from the synthetic images of every CPython flavor (as snapshots that read back
//! exactly like the image), the `_Py_DebugOffsets` of every flavor, a small ELF with a
//! `.PyRuntime` section compiled here, its `.eh_frame`, saved profiles, and a core of a real
//! interpreter trimmed to the pages the reader needs (`python::live_tests` adds snapshots of
//! every live interpreter). Every seed also runs through its entry here, so the seeds are unit
//! tests too. With `PYEBPF_FUZZ_SEEDS=DIR` each seed is written to `DIR/TARGET/NAME`: that is
//! how `cargo xtask fuzz` fills the corpora before fuzzing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{TARGETS, target};
use crate::procs::elf::{SymbolTableKind, read_elf_info, read_section, read_symbols};
use crate::python::code::{CodeCache, Ctx};
use crate::python::errors::ErrorCounts;
use crate::python::snapshot::Snapshot;
use crate::python::testimage::{Flavor, ImageBuilder, PTHREAD_TID, debug_offsets_bytes};
use crate::python::walker::{Limits, walk};
use crate::python::{ReadMemory, assemble};

/// Runs `bytes` through the entry of `target` and, with `PYEBPF_FUZZ_SEEDS` set, writes it as
/// a seed of that target's corpus.
pub(crate) fn emit(target_name: &str, name: &str, bytes: &[u8]) {
    let entry = target(target_name).unwrap_or_else(|| panic!("no fuzz target {target_name}"));
    entry(bytes);
    if let Some(dir) = std::env::var_os("PYEBPF_FUZZ_SEEDS") {
        let dir = Path::new(&dir).join(target_name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// A snapshot of a synthetic image that `Snapshot::attach` reads like a live process: the
/// version where the interpreter keeps it (debug offsets, `Py_Version`, or the `.bss` string),
/// glibc's `pthread` tid descriptor, and what the built-in tables' checks read
/// (`PyCode_Type.tp_basicsize`, `_PyRuntime.main_thread` = `main_thread_id`).
pub(crate) fn image_snapshot(
    b: &mut ImageBuilder,
    flavor: Flavor,
    main_thread_id: u64,
) -> Snapshot {
    let layout = b.layout().clone();
    let v = flavor.version();
    let mut s = Snapshot {
        pid: 4242,
        runtime_addr: b.runtime_addr(),
        runtime_size: layout.runtime.size,
        ..Snapshot::default()
    };
    if flavor.0.fields.is_empty() && v.minor >= 11 {
        let a = b.alloc_image(8);
        b.w64(a, flavor.0.hex);
        s.py_version_addr = Some(a);
    } else if flavor.0.fields.is_empty() {
        let text = format!("{v} (main, Jan  1 2026, 00:00:00) \n[GCC 12.2.0]\0");
        let a = b.alloc_image(256);
        b.write(a, text.as_bytes());
        s.bss = Some((a, 256));
    }
    let desc = b.alloc_image(12);
    b.w32(desc, 32);
    b.w32(desc + 4, 1);
    b.w32(desc + 8, PTHREAD_TID as u32);
    s.pthread_tid_desc = Some(desc);
    let target = b.target();
    if let (Some(code), Some(size)) = (target.pycode_type, layout.checks.code_basicsize) {
        b.w64(code + layout.types.tp_basicsize, size);
        s.pycode_type_addr = Some(code);
    }
    if let (Some(frame), Some(size)) = (target.pyframe_type, layout.checks.frame_basicsize) {
        b.w64(frame + layout.types.tp_basicsize, size);
        s.pyframe_type_addr = Some(frame);
    }
    if let Some(off) = layout.runtime.main_thread {
        b.w64(b.runtime_addr() + off, main_thread_id);
    }
    s.known = target.known.clone();
    s.none_addr = s.known.get(crate::python::objects::Known::None);
    s.image = target.image.clone();
    s.regions = b.memory().regions().map(|(a, r)| (a, r.clone())).collect();
    s
}

/// What the walker reads straight from the image (the truth a snapshot must reproduce).
fn walked(b: &ImageBuilder, limits: Limits) -> Vec<crate::python::PyThread> {
    let (mem, target) = (b.memory(), b.target());
    let ctx = Ctx {
        mem: &mem as &dyn ReadMemory,
        layout: b.layout(),
        target: &target,
    };
    let mut counts = ErrorCounts::default();
    let interps = walk(
        ctx,
        b.runtime_addr(),
        &mut CodeCache::default(),
        &mut counts,
        limits,
    )
    .expect("the synthetic image walks");
    assemble(
        ctx,
        &interps,
        &HashMap::<u32, u32>::new(),
        &|_| None,
        &mut counts,
        limits,
    )
}

#[test]
fn synthetic_snapshots_read_back_as_their_images() {
    for flavor in Flavor::ALL {
        let mut b = crate::python::fuzz_tests::rich_image(flavor);
        let whole = image_snapshot(&mut b, flavor, 0x1000);
        assert_eq!(Snapshot::decode(&whole.encode()).as_ref(), Ok(&whole));
        let limits = Limits {
            locals: Some(crate::python::values::ValueLimits::default()),
            ..Limits::default()
        };
        // Only what the reader touches: a seed of a few KiB instead of the whole image.
        let (snapshot, _) = whole
            .trimmed(limits)
            .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
        let bytes = snapshot.encode();
        let mut p = snapshot
            .attach()
            .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
        assert_eq!(p.version(), flavor.version(), "{flavor:?}");
        p.set_limits(limits);
        let read: Vec<_> = p
            .threads()
            .unwrap()
            .into_iter()
            .map(|t| (t.frames, t.locals))
            .collect();
        let truth: Vec<_> = walked(&b, limits)
            .into_iter()
            .map(|t| (t.frames, t.locals))
            .collect();
        assert_eq!(read.len(), 2, "{flavor:?}");
        assert!(
            read[0].0.len() > 40,
            "{flavor:?}: {} frames",
            read[0].0.len()
        );
        assert_eq!(read, truth, "{flavor:?}");
        // Options byte 2: with locals.
        let mut seed = vec![2u8];
        seed.extend(&bytes);
        emit(
            "python_reader",
            &format!("synthetic-{}", flavor.0.name),
            &seed,
        );
    }
}

#[test]
fn debug_offsets_of_every_flavor() {
    for flavor in Flavor::ALL {
        let v = flavor.version();
        let mut seed = vec![v.minor - 8, u8::from(v.free_threaded)];
        if !flavor.0.fields.is_empty() {
            seed.extend(debug_offsets_bytes(v.minor, v.free_threaded));
        }
        let layout = crate::python::layout::RuntimeLayout::build(v, &seed[2..]);
        assert!(layout.is_ok(), "{flavor:?}: {layout:?}");
        emit("debug_offsets", &format!("flavor-{}", flavor.0.name), &seed);
    }
}

/// A small shared object with what `detect` and the eval-loop search look for: a
/// `.PyRuntime` section, `_PyRuntime`, `Py_Version`, `PyCode_Type`, `_PyEval_EvalFrameDefault`
/// and `.eh_frame` (compiled here with the C compiler every test machine has).
fn tiny_python_elf(dir: &Path) -> Vec<u8> {
    let c = dir.join("tiny.c");
    std::fs::write(
        &c,
        r#"
__attribute__((section(".PyRuntime"))) char _PyRuntime[4096] = "xdebugpy";
const unsigned long Py_Version = 0x030c01f0;
char PyCode_Type[512];
char _Py_NoneStruct[16];
char PyUnicode_Type[512];
char Py_GetVersion_buf[64];
const char *Py_GetVersion(void) { return Py_GetVersion_buf; }
__attribute__((noinline)) static int helper(int x) { return x * 3 + 1; }
int _PyEval_EvalFrameDefault(void *ts, void *f, int t) {
    int r = 0;
    for (int i = 0; i < t; i++) r += helper(i);
    return r + (f != 0) + (ts != 0);
}
"#,
    )
    .unwrap();
    let so = dir.join("libtinypython.so");
    let out = Command::new("cc")
        .args(["-O1", "-shared", "-fPIC", "-g0", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .expect("cc (the C compiler) runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(so).unwrap()
}

#[test]
fn elf_and_eh_frame_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let elf = tiny_python_elf(dir.path());
    let python = crate::python::detect::python_elf(&elf[..]).expect("detected as Python");
    assert_ne!(python.runtime, 0);
    assert!(python.py_version.is_some() && python.pycode_type.is_some());
    emit("elf", "tiny-python", &elf);

    let info = read_elf_info(&elf[..]).unwrap();
    let eh = info.section(b".eh_frame").expect(".eh_frame").clone();
    let section = read_section(&elf[..], &eh, 1 << 16).unwrap();
    let symbols = read_symbols(&elf[..], &info, SymbolTableKind::Dynamic, 1 << 20)
        .unwrap()
        .unwrap();
    let eval = symbols
        .iter()
        .find(|s| s.name == b"_PyEval_EvalFrameDefault")
        .expect("the eval loop symbol")
        .value;
    assert!(
        !crate::merge::ehframe::fdes(&section, eh.addr).is_empty(),
        "FDEs in the compiled .eh_frame"
    );
    // Section, then registers at the eval loop's entry, then a stack whose first word is a
    // return address into the same function.
    let mut seed = eh.addr.to_le_bytes().to_vec();
    seed.extend((section.len() as u16).to_le_bytes());
    seed.extend(&section);
    let sp = 0x7ffd_0000_u64;
    for v in [eval, sp, 0] {
        seed.extend(v.to_le_bytes());
    }
    seed.extend((eval + 4).to_le_bytes());
    seed.extend([0u8; 56]);
    emit("eh_frame", "tiny-python", &seed);
}

#[test]
fn saved_seeds() {
    let profile = crate::output::tests::demo_profile();
    let mut bytes = Vec::new();
    crate::output::Format::Pyebpf
        .render(&profile, &mut bytes)
        .unwrap();
    let loaded = crate::saved::load_from(&bytes[..]).expect("the demo profile loads");
    assert_eq!(loaded.profile.sample_count(), profile.sample_count());
    // Lengths cover every renderer of the `saved` entry (it chooses by length modulo 7): the
    // file cut by 0-6 bytes (a cut end chunk loads as incomplete, with the samples before it).
    for cut in 0..7 {
        emit(
            "saved",
            &format!("demo-cut-{cut}"),
            &bytes[..bytes.len() - cut],
        );
    }
}

/// Every file under `fuzz/regressions/TARGET/` (crashes the fuzzer found, fixed since) runs
/// through its entry without panicking.
#[test]
fn fuzz_regressions() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut ran = 0;
    for (name, entry) in TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        for f in dir.flatten() {
            let bytes = std::fs::read(f.path()).unwrap();
            eprintln!("replaying {}", f.path().display());
            entry(&bytes);
            ran += 1;
        }
    }
    assert!(root.is_dir(), "{} missing", root.display());
    eprintln!("{ran} regression inputs replayed");
}
