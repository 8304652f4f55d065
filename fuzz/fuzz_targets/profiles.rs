//! libFuzzer target: `stevedore::fuzzing::profiles` (needs `--features host`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore::fuzzing::profiles(data));
