//! cargo-fuzz target: see [`hetccl_fuzz::ib_setup_frame`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::ib_setup_frame(data));
