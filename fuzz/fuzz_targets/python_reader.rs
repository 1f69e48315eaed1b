//! `cargo fuzz run python_reader`: see `pyebpf::fuzzing::python_reader` for what it reads and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pyebpf::fuzzing::python_reader(data));
