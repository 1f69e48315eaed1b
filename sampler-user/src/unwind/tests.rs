//! End-to-end tests of unwind + symbolize on real processes (no eBPF): a C program built without
//! frame pointers, stopped with ptrace, its stack copied like the eBPF program does.

use std::time::{Duration, Instant};

use super::test_target::{Running, TARGET_C, TempDir, TestStack, compile, snapshot};
use super::*;
use crate::procs::tests::require_root;
use crate::symbolize::Symbolizer;

const COPY: usize = 32 << 10;

fn names(
    sym: &mut Symbolizer,
    reg: &ProcessRegistry,
    pid: u32,
    stack: &NativeStack,
) -> Vec<String> {
    let proc = reg.get(pid).expect("process");
    stack
        .frames
        .iter()
        .map(|f| sym.native(proc, f.lookup_address()).name.clone())
        .collect()
}

/// Positions of `wanted` in `names`, which must be strictly increasing with `wanted[0]` first.
fn assert_in_order(names: &[String], wanted: &[&str]) {
    assert_eq!(
        names.first().map(String::as_str),
        Some(wanted[0]),
        "innermost frame: {names:?}"
    );
    let mut last = 0;
    for w in &wanted[1..] {
        let pos = names
            .iter()
            .position(|n| n == w)
            .unwrap_or_else(|| panic!("{w} missing: {names:?}"));
        assert!(pos > last, "{w} out of order: {names:?}");
        last = pos;
    }
}

#[test]
fn lookup_address_of_return_addresses_is_one_before() {
    assert_eq!(
        NativeFrameAddr::InstructionPointer(0x1000).lookup_address(),
        0x1000
    );
    assert_eq!(
        NativeFrameAddr::ReturnAddress(0x1000).lookup_address(),
        0xfff
    );
    assert_eq!(NativeFrameAddr::ReturnAddress(0).lookup_address(), 0);
}

#[test]
fn per_process_state_is_bounded() {
    let mut reg = ProcessRegistry::new();
    let mut u = NativeUnwinder::new();
    let pid = std::process::id();
    let proc = reg.get_or_load(pid).unwrap();
    u.ensure_state(proc);
    for fake in 0..MAX_PROCS as u32 {
        u.procs.insert(
            1_000_000 + fake,
            ProcState {
                start_time_ticks: 0,
                mappings_generation: 0,
                unwinder: UnwinderX86_64::new(),
                modules: HashMap::new(),
                exec_ranges: Vec::new(),
            },
        );
    }
    // Our own state, the least recently used, was evicted for the last fake one.
    assert_eq!(u.procs.len(), MAX_PROCS);
    assert!(!u.procs.contains(&pid));
    u.ensure_state(reg.get(pid).unwrap());
    assert_eq!(u.procs.len(), MAX_PROCS, "bounded");
    assert!(u.procs.contains(&pid));
    assert!(
        !u.procs.contains(&1_000_000),
        "the oldest fake state made room"
    );
}

#[test]
fn gone_process_and_missing_ip() {
    let mut reg = ProcessRegistry::new();
    let mut u = NativeUnwinder::new();
    let regs = UserRegs {
        ip: 0x1234,
        sp: 0x7000,
        bp: 0,
    };
    let s = u.unwind(&mut reg, (1 << 22) + 3, &regs, &TestStack::default(), 8);
    assert_eq!(s.frames, vec![NativeFrameAddr::InstructionPointer(0x1234)]);
    assert!(s.truncated);
    assert_eq!(
        s.error.as_ref().map(UnwindError::kind),
        Some(crate::unwind::UnwindFailure::ProcessGone)
    );
    let s = u.unwind(
        &mut reg,
        std::process::id(),
        &UserRegs::default(),
        &TestStack::default(),
        8,
    );
    assert!(s.frames.is_empty() && s.truncated);
}

#[test]
fn c_program_without_frame_pointers_unwinds_and_symbolizes() {
    if !require_root("c_program_without_frame_pointers_unwinds_and_symbolizes") {
        return;
    }
    let dir = TempDir::new("unwind-e2e");
    let exe = compile(&dir.0, "target", TARGET_C, &[]);
    let target = Running::start(&exe);
    let pid = target.pid();
    let mut reg = ProcessRegistry::new();
    let mut unwinder = NativeUnwinder::new();
    let mut sym = Symbolizer::new();
    for round in 0..5 {
        let snap = snapshot(pid, COPY);
        let stack = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
        let names = names(&mut sym, &reg, pid, &stack);
        assert_in_order(&names, &["hot", "middle", "outer", "main"]);
        assert!(
            !stack.truncated,
            "round {round}: {:?} {names:?}",
            stack.error
        );
        assert_eq!(
            names.last().map(String::as_str),
            Some("_start"),
            "{names:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // DWARF gives the source line of hot.
    let snap = snapshot(pid, COPY);
    let stack = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    let hot = sym.native(reg.get(pid).unwrap(), stack.frames[0].lookup_address());
    assert_eq!(
        (hot.name.as_str(), hot.module.as_str(), hot.resolved),
        ("hot", "target", true)
    );
    assert!(
        hot.file.as_deref().is_some_and(|f| f.ends_with("target.c")),
        "{hot:?}"
    );
    assert!(hot.line.is_some_and(|l| (5..=8).contains(&l)), "{hot:?}");
    assert_eq!(
        unwinder.stats().module_rebuilds,
        1,
        "module list built once"
    );
    assert_eq!(unwinder.stats().modules.open_failed, 0);
}

#[test]
fn stripped_binary_gives_offsets_not_wrong_names() {
    if !require_root("stripped_binary_gives_offsets_not_wrong_names") {
        return;
    }
    let dir = TempDir::new("unwind-stripped");
    // -rdynamic keeps main and _start in .dynsym after strip, like Debian's python keeps its
    // exported functions: the static functions after _start then have a preceding symbol
    // (addr2line names hot "_start"), and only its size tells that it does not cover them
    // (blazesym checks ELF symbol sizes; `symbol_covers` repeats the check for every source).
    let exe = compile(&dir.0, "target", TARGET_C, &["-rdynamic"]);
    let stripped = dir.0.join("target-stripped");
    std::fs::copy(&exe, &stripped).unwrap();
    let ok = std::process::Command::new("strip")
        .arg("--strip-all")
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(ok.success());
    let target = Running::start(&stripped);
    let pid = target.pid();
    let mut reg = ProcessRegistry::new();
    let mut unwinder = NativeUnwinder::new();
    let mut sym = Symbolizer::new();
    let snap = snapshot(pid, COPY);
    let stack = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    let proc = reg.get(pid).unwrap();
    let frames: Vec<_> = stack
        .frames
        .iter()
        .map(|f| sym.native(proc, f.lookup_address()))
        .collect();
    let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
    // hot, middle, outer: in the stripped file, without a symbol of their own.
    for f in &frames[..3] {
        assert_eq!(f.module, "target-stripped", "{names:?}");
        assert!(
            !f.resolved && f.name.starts_with("target-stripped+0x"),
            "{names:?}"
        );
    }
    // main is exported; unwinding went on (eh_frame survives strip) into libc.
    assert_eq!(names[3], "main", "{names:?}");
    assert!(names.iter().any(|n| n.contains("libc_start")), "{names:?}");
    assert!(!stack.truncated, "{:?}", stack.error);
    // The offset named for frame 0 is inside hot in the unstripped file.
    let off = u64::from_str_radix(names[0].trim_start_matches("target-stripped+0x"), 16).unwrap();
    let blaze = blazesym::symbolize::Symbolizer::new();
    let src = blazesym::symbolize::source::Source::Elf(blazesym::symbolize::source::Elf::new(&exe));
    let r = blaze
        .symbolize_single(&src, blazesym::symbolize::Input::FileOffset(off))
        .unwrap();
    assert_eq!(r.as_sym().map(|s| &*s.name), Some("hot"));
}

#[test]
fn short_copy_and_frame_cap_truncate() {
    if !require_root("short_copy_and_frame_cap_truncate") {
        return;
    }
    let dir = TempDir::new("unwind-short");
    let exe = compile(&dir.0, "target", TARGET_C, &[]);
    let target = Running::start(&exe);
    let pid = target.pid();
    let mut reg = ProcessRegistry::new();
    let mut unwinder = NativeUnwinder::new();
    let mut snap = snapshot(pid, COPY);
    // Keep only the word at rsp: hot is a leaf without a frame, so its return address is
    // readable, and middle's frame is not.
    let keep = usize::try_from(snap.regs.sp - snap.stack.base).unwrap() + 8;
    snap.stack.bytes.truncate(keep);
    let s = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    assert_eq!(s.frames.len(), 2, "{s:?}");
    assert!(s.truncated);
    match s.error {
        Some(UnwindError::StackRead { addr, base, len }) => {
            assert_eq!((base, len), (snap.stack.base, keep as u64));
            assert!(addr >= base + len, "{addr:#x}");
        }
        other => panic!("expected StackRead, got {other:?}"),
    }
    let snap = snapshot(pid, COPY);
    let s = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, 3);
    assert_eq!(s.frames.len(), 3);
    assert_eq!(s.error, Some(UnwindError::TooDeep { max: 3 }));
    assert_eq!(unwinder.stats().truncated, 2);
}

const LIB_C: &str = r"
volatile unsigned long lib_counter = 0;
__attribute__((noinline, noclone)) static unsigned long lib_inner(unsigned long n) {
    for (;;) { lib_counter += n; if (lib_counter == 3) break; }
    return lib_counter;
}
__attribute__((noinline)) unsigned long lib_hot(unsigned long n) {
    unsigned long r = lib_inner(n + 1);
    return r * 2;
}
";

const DLOPEN_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    (void)argc;
    printf("ready\n");
    fflush(stdout);
    char c;
    if (read(0, &c, 1) != 1) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) return 3;
    unsigned long (*f)(unsigned long) = (unsigned long (*)(unsigned long))dlsym(h, "lib_hot");
    unsigned long r = f(5);
    printf("%lu\n", r);
    return 0;
}
"#;

#[test]
fn library_loaded_after_start_is_found_by_a_refresh() {
    if !require_root("library_loaded_after_start_is_found_by_a_refresh") {
        return;
    }
    let dir = TempDir::new("unwind-dlopen");
    let lib = compile(&dir.0, "libhot.so", LIB_C, &["-shared", "-fPIC"]);
    let exe = compile(&dir.0, "loader", DLOPEN_C, &[]);
    let mut child = std::process::Command::new(&exe)
        .arg(&lib)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let target = Running(child);
    let pid = target.pid();
    let mut reg = ProcessRegistry::new();
    let mut unwinder = NativeUnwinder::new();
    // Learn the process (and build its modules) while it waits in read(): no libhot yet.
    let snap = snapshot(pid, COPY);
    unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    assert!(
        reg.get(pid)
            .unwrap()
            .mappings
            .iter()
            .all(|m| !m.module_name().contains("libhot"))
    );
    // Let it dlopen and spin; wait out the refresh interval.
    std::io::Write::write_all(&mut target.0.stdin.as_ref().unwrap(), b"x").unwrap();
    std::thread::sleep(crate::procs::REFRESH_INTERVAL + Duration::from_millis(100));
    let snap = snapshot(pid, COPY);
    let stack = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    let mut sym = Symbolizer::new();
    let names = names(&mut sym, &reg, pid, &stack);
    assert_in_order(&names, &["lib_inner", "lib_hot", "main"]);
    assert!(!stack.truncated, "{:?} {names:?}", stack.error);
    assert_eq!(unwinder.stats().refreshes, 1);
    assert_eq!(unwinder.stats().module_rebuilds, 2);
}

/// Measures the per-sample costs (printed; run with `--nocapture`). The bounds are loose enough
/// for a debug build on a loaded 2-core machine and still catch per-sample file I/O.
#[test]
fn cost_of_unwind_and_symbolize() {
    if !require_root("cost_of_unwind_and_symbolize") {
        return;
    }
    let dir = TempDir::new("unwind-cost");
    let exe = compile(&dir.0, "target", TARGET_C, &[]);
    let target = Running::start(&exe);
    let pid = target.pid();
    let mut reg = ProcessRegistry::new();
    let mut unwinder = NativeUnwinder::new();
    let mut sym = Symbolizer::new();
    let snap = snapshot(pid, COPY);
    let t = Instant::now();
    let first = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
    let first_cost = t.elapsed();
    let n = 2000u32;
    let t = Instant::now();
    for _ in 0..n {
        let s = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
        assert_eq!(s.frames.len(), first.frames.len());
    }
    let per_unwind = t.elapsed() / n;
    let proc = reg.get(pid).unwrap();
    let t = Instant::now();
    for f in &first.frames {
        let t1 = Instant::now();
        let r = sym.native(proc, f.lookup_address());
        eprintln!("  {} in {}: {:?}", r.name, r.module, t1.elapsed());
    }
    let cold = t.elapsed() / first.frames.len() as u32;
    let t = Instant::now();
    for _ in 0..100 {
        for f in &first.frames {
            sym.native(proc, f.lookup_address());
        }
    }
    let warm = t.elapsed() / (100 * first.frames.len() as u32);
    eprintln!(
        "unwind: first {first_cost:?} (module build), then {per_unwind:?}/stack of {} frames; \
         symbolize: {cold:?}/frame uncached, {warm:?}/frame cached",
        first.frames.len()
    );
    assert!(per_unwind < Duration::from_millis(1), "{per_unwind:?}");
    assert!(warm < Duration::from_micros(100), "{warm:?}");
    assert_eq!(sym.stats().native_symbolized, first.frames.len() as u64);
}

const VDSO_C: &str = r#"
#include <stdio.h>
#include <time.h>
__attribute__((noinline)) int main(void) {
    printf("ready\n");
    fflush(stdout);
    struct timespec ts;
    unsigned long sum = 0;
    for (;;) { clock_gettime(CLOCK_MONOTONIC, &ts); sum += (unsigned long)ts.tv_nsec; if (sum == 1) break; }
    printf("%lu\n", sum);
    return 0;
}
"#;

/// Samples inside the vDSO unwind through it (its `.eh_frame` comes from our own copy of the
/// image) and name its function.
#[test]
fn vdso_frames_unwind_and_symbolize() {
    if !require_root("vdso_frames_unwind_and_symbolize") {
        return;
    }
    let dir = TempDir::new("unwind-vdso");
    let exe = compile(&dir.0, "clock", VDSO_C, &[]);
    let target = Running::start(&exe);
    let pid = target.pid();
    let mut reg = ProcessRegistry::new();
    let mut unwinder = NativeUnwinder::new();
    let mut sym = Symbolizer::new();
    let mut in_vdso = 0;
    for _ in 0..100 {
        let snap = snapshot(pid, COPY);
        let stack = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
        let proc = reg.get(pid).unwrap();
        let frames: Vec<_> = stack
            .frames
            .iter()
            .map(|f| sym.native(proc, f.lookup_address()))
            .collect();
        if frames[0].module != "[vdso]" {
            continue;
        }
        in_vdso += 1;
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        assert!(
            frames[0].resolved && frames[0].name.contains("clock_gettime"),
            "{names:?}"
        );
        assert!(names.contains(&"main"), "{names:?}");
        assert!(!stack.truncated, "{:?} {names:?}", stack.error);
        if in_vdso == 3 {
            break;
        }
    }
    assert!(in_vdso > 0, "no sample landed in the vDSO in 100 tries");
}

/// Interpreters found on this machine (Debian's static non-PIE one, pyenv's shared builds).
const PYTHONS: &[&str] = &[
    "/usr/bin/python3.11",
    "/root/.pyenv/versions/3.12.1/bin/python3.12",
    "/root/.pyenv/versions/3.13.0/bin/python3.13",
];

/// CPython without frame pointers, through `.eh_frame`: every sample reaches `_start`.
#[test]
fn python_interpreters_unwind_to_the_root() {
    if !require_root("python_interpreters_unwind_to_the_root") {
        return;
    }
    let found: Vec<_> = PYTHONS
        .iter()
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    if found.is_empty() {
        crate::procs::tests::missing("python_interpreters_unwind_to_the_root: no interpreter");
        return;
    }
    for py in found {
        let child = std::process::Command::new(py)
            .args(["-c", "import sys\nprint('ready', flush=True)\ndef spin():\n    x = 0\n    while True:\n        x += 1\nspin()\n"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut target = Running(child);
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(target.0.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let pid = target.pid();
        let mut reg = ProcessRegistry::new();
        let mut unwinder = NativeUnwinder::new();
        let mut sym = Symbolizer::new();
        for _ in 0..5 {
            let snap = snapshot(pid, COPY);
            let stack = unwinder.unwind(&mut reg, pid, &snap.regs, &snap.stack, DEFAULT_MAX_FRAMES);
            let names = names(&mut sym, &reg, pid, &stack);
            assert!(!stack.truncated, "{py}: {:?} {names:?}", stack.error);
            let from = names.iter().position(|n| n == "PyEval_EvalCode");
            let from = from.unwrap_or_else(|| panic!("{py}: no PyEval_EvalCode in {names:?}"));
            assert_in_order(
                &names[from..],
                &["PyEval_EvalCode", "Py_BytesMain", "_start"],
            );
            assert_eq!(
                names.last().map(String::as_str),
                Some("_start"),
                "{py}: {names:?}"
            );
            // Builds with symbols name their eval loop in every sample (3.12's has a .cold
            // part: DWARF reports it without a size).
            if !py.starts_with("/usr/bin") {
                assert!(
                    names.iter().any(|n| n == "_PyEval_EvalFrameDefault"),
                    "{py}: {names:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }
}
