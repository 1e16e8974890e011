//! cargo-fuzz target: see [`hetccl_fuzz::engine_tuning_table`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::engine_tuning_table(data));
