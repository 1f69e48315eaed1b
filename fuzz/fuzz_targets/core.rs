//! `cargo fuzz run core`: see `pyebpf::fuzzing::core` for what it reads and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pyebpf::fuzzing::core(data));
