//! Privileged tests of the off-CPU programs (`--idle`, issue 13) against the running kernel:
//! each `sched_switch` variant the kernel supports loads and attaches with `sched_wakeup`, at
//! every Python layout (one program for all, as the sampler) and with and without kernel
//! stacks, within a verifier budget; the BTF facts the programs need are found. The kernel
//! matrix runs them on every kernel (`variant-load: switch-bpf_loop …` lines). What the programs
//! capture is checked end to end (`tests/e2e/pyrecord/idle.rs`).

use super::root_tests::{SERIAL, have_root};
use super::{CollectConfig, Collector, variant};

/// Verified-instruction budget of the off-CPU program (the sampler's walk plus a few hundred
/// instructions): `bpf_loop` ~8k, `bounded` ~18k on 6.18; 6.1's verifier prunes less.
fn budget(name: &str) -> u32 {
    if name == "bpf_loop" { 150_000 } else { 800_000 }
}

#[test]
fn offcpu_program_loads_in_every_supported_variant() {
    if !have_root("offcpu_program_loads_in_every_supported_variant") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let features = super::KernelFeatures::probe(&super::btf::path());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let version: (u32, u32) = (
        parts.next().and_then(|p| p.parse().ok()).unwrap_or(0),
        parts.next().and_then(|p| p.parse().ok()).unwrap_or(0),
    );
    if features.has(super::Feature::KernelBtf) {
        assert_eq!(
            features.switch_prev_state,
            version >= (5, 18),
            "sched_switch passes prev_state from Linux 5.18 ({release})"
        );
        assert!(features.task_pid_offset.is_some_and(|o| o > 0));
        assert!(features.task_state_offset.is_some());
    }
    let mut loaded = 0;
    for v in variant::SWITCH.variants {
        let choice = super::VariantChoice::Named(v.name.to_string());
        let supported = variant::choose(&variant::SWITCH, &features, &choice).is_ok();
        for kernel_stacks in [false, true] {
            let cfg = CollectConfig {
                frequency_hz: 99,
                pids: vec![std::process::id()],
                filter_pids: true,
                kernel_stacks,
                stack_bytes: 0,
                self_pid: 0,
                variant: choice.clone(),
                idle: true,
                ..CollectConfig::default()
            };
            let result = Collector::start(&cfg);
            if !supported {
                let err = result.err().expect("an unsupported variant loaded");
                assert!(
                    matches!(err, super::CollectError::KernelFeatures { .. }),
                    "{}: {err}",
                    v.name
                );
                eprintln!("variant-load: switch-{} unsupported: {err}", v.name);
                break;
            }
            let mut c = result.unwrap_or_else(|e| {
                panic!(
                    "switch {} kstacks {kernel_stacks}: {e}\n{}",
                    v.name,
                    e.verifier_log().unwrap_or("")
                )
            });
            assert_eq!(c.switch_variant().map(|s| s.variant.name), Some(v.name));
            assert!(c.take_offcpu().is_some(), "OFFCPU handed out with --idle");
            assert!(c.take_offcpu().is_none(), "OFFCPU handed out twice");
            let stats = c.offcpu_program_stats().expect("off-CPU program info");
            eprintln!(
                "variant-load: switch-{} kernel_stacks={kernel_stacks} verified_insns={} \
                 translated={} jited_bytes={}",
                v.name,
                stats
                    .verified_insns
                    .map_or_else(|| "n/a".to_string(), |n| n.to_string()),
                stats.translated_insns,
                stats.jited_bytes
            );
            assert!(stats.translated_insns > 0);
            if let Some(n) = stats.verified_insns {
                assert!(n < budget(v.name), "switch {}: {n} verified", v.name);
            }
            // The program runs: every context switch on the host passes through it.
            std::thread::sleep(std::time::Duration::from_millis(50));
            let runs = c.offcpu_program_stats().and_then(|s| s.run_count);
            assert!(
                runs.is_none_or(|r| r > 0),
                "sched_switch never ran: {runs:?}"
            );
            loaded += 1;
        }
    }
    assert!(loaded >= 2, "only {loaded} loads");
}

/// Without `--idle` nothing of the off-CPU side is created: no program, no 50 MiB map.
#[test]
fn no_offcpu_side_without_idle() {
    if !have_root("no_offcpu_side_without_idle") {
        return;
    }
    let _guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut c = Collector::start(&CollectConfig {
        pids: vec![std::process::id()],
        filter_pids: true,
        stack_bytes: 0,
        self_pid: 0,
        ..CollectConfig::default()
    })
    .unwrap();
    assert!(c.take_offcpu().is_none());
    assert!(c.switch_variant().is_none());
    assert!(c.offcpu_program_stats().is_none());
}
