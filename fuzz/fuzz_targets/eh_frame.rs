//! `cargo fuzz run eh_frame`: see `pyebpf::fuzzing::eh_frame` for what it reads and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pyebpf::fuzzing::eh_frame(data));
