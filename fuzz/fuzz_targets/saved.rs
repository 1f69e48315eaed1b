//! `cargo fuzz run saved`: see `pyebpf::fuzzing::saved` for what it reads and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pyebpf::fuzzing::saved(data));
