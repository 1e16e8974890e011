//! cargo-fuzz target: see [`hetccl_fuzz::unique_id`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::unique_id(data));
