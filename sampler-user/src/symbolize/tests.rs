//! Symbolizer tests on the test process itself and on the running kernel. The end-to-end test
//! with an unwound C program lives in `unwind::tests`.

use super::*;
use crate::procs::ProcessRegistry;
use crate::procs::tests::require_root;

#[inline(never)]
fn marker_function_for_symbolize_test(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(31))
}

#[test]
fn size_check() {
    assert!(symbol_covers(0, Some(10), false));
    assert!(symbol_covers(9, Some(10), false));
    assert!(!symbol_covers(10, Some(10), false), "one past the end");
    assert!(!symbol_covers(5000, Some(10), true));
    assert!(symbol_covers(0, None, false));
    assert!(
        !symbol_covers(1, None, false),
        "sizeless ELF: first byte only"
    );
    assert!(!symbol_covers(1, Some(0), false));
    assert!(
        symbol_covers(0x1_0000, None, true),
        "DWARF matched by ranges"
    );
}

#[test]
fn own_function_and_cache() {
    if !require_root("own_function_and_cache") {
        return;
    }
    let pid = std::process::id();
    let mut reg = ProcessRegistry::new();
    let proc = reg.get_or_load(pid).unwrap();
    let mut s = Symbolizer::new();
    let addr = marker_function_for_symbolize_test as *const () as u64 + 1;
    let f = s.native(proc, addr);
    assert!(f.resolved, "{f:?}");
    assert!(
        f.name.contains("marker_function_for_symbolize_test"),
        "{f:?}"
    );
    assert!(!f.name.contains("17h"), "demangled without hash: {f:?}");
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    assert_eq!(f.module, exe.file_name().unwrap().to_string_lossy());
    let again = s.native(proc, addr);
    assert!(Arc::ptr_eq(&f, &again), "second lookup is a cache hit");
    assert_eq!(s.stats().native_symbolized, 1);
    assert_eq!(s.stats().native_cache_hits, 1);
    // A pid reuse does not mix files: the cache is per file identity, not per pid.
    s.forget_process(pid);
    assert!(Arc::ptr_eq(&f, &s.native(proc, addr)));
    assert_eq!(s.stats().native_symbolized, 1);
}

#[test]
fn unmapped_and_anonymous_addresses() {
    let pid = std::process::id();
    let mut reg = ProcessRegistry::new();
    let proc = reg.get_or_load(pid).unwrap();
    let mut s = Symbolizer::new();
    let f = s.native(proc, 0x10);
    assert_eq!(
        (f.name.as_str(), f.module.as_str(), f.resolved),
        ("[unknown]+0x10", "[unknown]", false)
    );
    if let Some(stack) = proc
        .mappings
        .iter()
        .find(|m| m.path.as_deref() == Some(std::path::Path::new("[stack]")))
    {
        let f = s.native(proc, stack.start + 0x20);
        assert_eq!(f.name, "[stack]+0x20");
        assert!(!f.resolved);
    }
}

/// The address of `name` (a text symbol) in `/proc/kallsyms`.
fn kallsyms_addr(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let (addr, ty, sym) = (it.next()?, it.next()?, it.next()?);
        (sym == name && matches!(ty, "T" | "t"))
            .then(|| u64::from_str_radix(addr, 16).ok())
            .flatten()
    })
}

#[test]
fn kernel_function_from_kallsyms() {
    if !require_root("kernel_function_from_kallsyms") {
        return;
    }
    let addr = kallsyms_addr("vfs_read").expect("vfs_read in kallsyms");
    assert_ne!(addr, 0, "kallsyms addresses are hidden (kptr_restrict)");
    let mut s = Symbolizer::new();
    let f = s.kernel(addr + 4);
    assert_eq!(f.name, "vfs_read", "{f:?}");
    assert!(f.resolved);
    assert!(Arc::ptr_eq(&f, &s.kernel(addr + 4)));
    // kallsyms is parsed once: further distinct addresses are cheap.
    let t = std::time::Instant::now();
    for i in 0..200 {
        s.kernel(addr + 8 + i);
    }
    let per = t.elapsed() / 200;
    eprintln!("kernel: {per:?} per uncached address after the first");
    assert!(per < std::time::Duration::from_millis(2), "{per:?}");
    let low = s.kernel(0x1000);
    assert_eq!(low.name, "[kernel]+0x1000");
    assert!(!low.resolved);
}
