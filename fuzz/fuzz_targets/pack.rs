//! cargo-fuzz target: see [`hetccl_fuzz::pack`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::pack(data));
