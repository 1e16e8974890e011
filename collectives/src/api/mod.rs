//! The exported C API: every `nccl*` function and its `pnccl*` twin.
//!
//! Each function is declared through [`export!`](crate::export), which emits
//! the `#[no_mangle] extern "C"` symbol, its `pnccl` twin (as NCCL has, for
//! profiling tools), and nothing else: the body always runs inside
//! [`guard::guard`]. Files are grouped by family; `docs/api-status.md` lists
//! what each entry point does today.
//!
//! # Safety
//! Every exported function is `unsafe extern "C"`: the caller (C code) must
//! pass pointers that are NULL or valid for the documented NCCL semantics.
//! NULL pointers, bad enums and overflowing counts are rejected with
//! `ncclInvalidArgument`; dangling pointers cannot be detected.
#![allow(clippy::missing_safety_doc)]

pub mod check;
pub mod coll;
pub mod coll_args;
pub mod comm_init;
pub mod comm_life;
pub mod config_read;
pub mod device;
pub mod engine_gate;
pub mod ext;
pub mod fallback;
pub mod group;
pub mod guard;
pub mod mem;
pub mod redop;
pub mod register;
pub mod version;

/// Declares an exported C function `$name` and its profiling twin `$pname`.
///
/// The body is an expression evaluated inside the caller's choice of guard;
/// the macro adds only `#[no_mangle]`, `extern "C"` and the twin.
#[macro_export]
macro_rules! export {
    (
        $(#[$meta:meta])*
        fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty $body:block
    ) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        #[doc = concat!("The `pnccl` twin of [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $ret {
            // SAFETY: same contract as the function it forwards to.
            unsafe { $name($($arg),*) }
        }
    };
}
