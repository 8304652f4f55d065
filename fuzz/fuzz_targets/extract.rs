//! libFuzzer target: `stevedore_parse::fuzzing::extract`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore_parse::fuzzing::extract(data));
