//! cargo-fuzz target: see [`hetccl_fuzz::net_handle`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::net_handle(data));
