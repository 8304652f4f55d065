//! libFuzzer target: `stevedore_parse::fuzzing::limits`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore_parse::fuzzing::limits(data));
