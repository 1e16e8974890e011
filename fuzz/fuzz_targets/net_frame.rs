//! cargo-fuzz target: see [`hetccl_fuzz::net_frame`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::net_frame(data));
