//! `cargo fuzz run elf`: see `pyebpf::fuzzing::elf` for what it reads and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pyebpf::fuzzing::elf(data));
