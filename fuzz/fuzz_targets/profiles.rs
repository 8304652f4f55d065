//! libFuzzer target: `stevedore_parse::fuzzing::profiles`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| stevedore_parse::fuzzing::profiles(data));
