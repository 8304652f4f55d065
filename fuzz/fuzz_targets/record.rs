//! libFuzzer target: `stevedore_init::fuzzing::record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore_init::fuzzing::record(data));
