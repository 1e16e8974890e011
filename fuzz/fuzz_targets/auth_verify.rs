//! cargo-fuzz target: see [`hetccl_fuzz::auth_verify`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::auth_verify(data));
