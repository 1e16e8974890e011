//! cargo-fuzz target: see [`hetccl_fuzz::coll_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hetccl_fuzz::coll_config(data));
