//! `#[repr(C)]` mirrors of NCCL 2.32's public types and of its plugin ABIs.
//!
//! This crate has no dependencies and no behaviour beyond conversions: enums
//! that arrive from C are raw integers and become Rust enums through
//! `TryFrom`, so an out-of-range value is an error, never undefined behaviour.
//! `tests/abi_layout.rs` at the workspace root compares every size, offset and
//! enum value here with NVIDIA's real `nccl.h`.

pub mod config;
pub mod datatype;
pub mod handles;
pub mod net;
pub mod profiler;
pub mod redop;
pub mod result;
pub mod tuner;
pub mod unique_id;

pub use config::{ncclCollConfig_t, ncclConfig_t, ncclSimInfo_t};
pub use datatype::{ncclDataType_t, DataType};
pub use handles::*;
pub use redop::{ncclRedOp_t, RedOp, ScalarResidence};
pub use result::{ncclResult_t, NcclResult};
pub use unique_id::{ncclUniqueId, NCCL_UNIQUE_ID_BYTES};

/// `NCCL_CONFIG_UNDEF_INT`: the value of a config field the user left unset.
pub const NCCL_CONFIG_UNDEF_INT: i32 = i32::MIN;
/// `NCCL_SPLIT_NOCOLOR`: the color of a rank that joins no child in `ncclCommSplit`.
pub const NCCL_SPLIT_NOCOLOR: i32 = -1;
/// `NCCL_UNDEF_FLOAT`.
pub const NCCL_UNDEF_FLOAT: f32 = -1.0;
/// `NCCL_API_MAGIC`: the magic of `ncclConfig_t`, `ncclCollConfig_t`.
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// The magic of `ncclSimInfo_t` (`NCCL_SIM_INFO_INITIALIZER`).
pub const NCCL_SIM_INFO_MAGIC: u32 = 0x7468_5283;
/// `NCCL_SHRINK_DEFAULT`.
pub const NCCL_SHRINK_DEFAULT: i32 = 0;
/// `NCCL_SHRINK_ABORT`: abort the parent's pending work before shrinking.
pub const NCCL_SHRINK_ABORT: i32 = 1;
/// `NCCL_WIN_REQUIRED_ALIGNMENT`.
pub const NCCL_WIN_REQUIRED_ALIGNMENT: usize = 4096;

/// Encodes a version the way `NCCL_VERSION(X,Y,Z)` does.
pub const fn nccl_version_code(major: i32, minor: i32, patch: i32) -> i32 {
    if major <= 2 && minor <= 8 {
        major * 1000 + minor * 100 + patch
    } else {
        major * 10000 + minor * 100 + patch
    }
}
