//! cargo-fuzz target: see [`hetccl_fuzz::boot_hello`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::boot_hello(data));
