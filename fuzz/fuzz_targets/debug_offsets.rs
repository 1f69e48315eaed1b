//! `cargo fuzz run debug_offsets`: see `pyebpf::fuzzing::debug_offsets` for what it reads and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pyebpf::fuzzing::debug_offsets(data));
