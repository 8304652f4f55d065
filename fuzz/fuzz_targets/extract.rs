//! libFuzzer target: `stevedore::fuzzing::extract` (needs `--features host`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore::fuzzing::extract(data));
