//! pyebpf's eBPF object: one CPU-clock sampler (with the in-kernel Python walk) in two variants
//! (`variant.rs`: user space loads the one the kernel supports), three process life-cycle
//! tracepoints, and for `--idle` the off-CPU programs (`offcpu.rs`: `sched_switch` in the same
//! two variants, `sched_wakeup`).
//!
//! Owns: the programs named in `sampler_common::programs` and the maps named in
//! `sampler_common::maps`. Input: perf-event and tracepoint contexts plus the `CONFIG` global
//! that user space writes before load. Output: `SampleEvent` (+ stack bytes) and `ProcEvent`
//! records in the `EVENTS` ring buffer, kernel stacks in `KSTACKS`, per-CPU `COUNTERS`.
//!
//! Constraints: `no_std`, no allocation, every loop has a constant bound, every failure is counted
//! (style rule 8), and the user stack is copied into the ring-buffer record itself (no per-CPU
//! scratch: array values are capped at 32 KiB). x86-64 only: user registers are `pt_regs`.
//!
//! Built for `bpfel-unknown-none` by `sampler-user/build.rs`; on the host this is an empty binary
//! so that `cargo check --workspace` keeps working.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![allow(
    clippy::inline_always,
    reason = "eBPF: the verifier needs constant sizes and offsets, which only inlining exposes"
)]
#![allow(
    clippy::needless_pass_by_value,
    reason = "the aya program macros pass the context by value"
)]
#![allow(
    clippy::similar_names,
    reason = "tgid and tid are the kernel's own names for the process and the thread"
)]

#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod offcpu;
#[cfg(target_arch = "bpf")]
mod proc_events;
#[cfg(target_arch = "bpf")]
mod python;
#[cfg(target_arch = "bpf")]
mod sample;
#[cfg(target_arch = "bpf")]
mod variant;

#[cfg(all(target_arch = "bpf", not(bpf_target_arch = "x86_64")))]
compile_error!(
    "pyebpf's sampler reads x86-64 pt_regs (cs/ip/sp/bp); port `sample::user_regs` first"
);

/// The kernel refuses GPL-only helpers (`bpf_probe_read_user`, `bpf_get_stackid`, …) to
/// programs without a GPL-compatible licence.
#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable call into a panic path, so this is never linked into a
    // loadable program; the loop only satisfies the type.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
