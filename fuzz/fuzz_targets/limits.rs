//! libFuzzer target: `stevedore::fuzzing::limits` (needs `--features host`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore::fuzzing::limits(data));
