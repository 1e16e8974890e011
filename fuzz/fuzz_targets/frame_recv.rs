//! cargo-fuzz target: see [`hetccl_fuzz::frame_recv`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::frame_recv(data));
