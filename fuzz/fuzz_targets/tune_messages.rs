//! cargo-fuzz target: see [`hetccl_fuzz::tune_messages`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::tune_messages(data));
