//! cargo-fuzz target: see [`hetccl_fuzz::tuning_table`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::tuning_table(data));
