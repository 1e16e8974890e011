//! cargo-fuzz target: see [`hetccl_fuzz::card_table`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::card_table(data));
