//! Opaque handle types and small structs of `nccl.h`.

use core::ffi::c_void;

/// `ncclComm_t`: an opaque communicator pointer.
#[allow(non_camel_case_types)]
pub type ncclComm_t = *mut c_void;
/// `ncclWindow_t`: an opaque registered-window pointer.
#[allow(non_camel_case_types)]
pub type ncclWindow_t = *mut c_void;
/// `cudaStream_t`: an opaque stream pointer (NULL for host-memory calls).
#[allow(non_camel_case_types)]
pub type cudaStream_t = *mut c_void;

/// `ncclCommMemStat_t`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommMemStat {
    /// `ncclStatGpuMemSuspend`.
    GpuMemSuspend = 0,
    /// `ncclStatGpuMemSuspended`.
    GpuMemSuspended = 1,
    /// `ncclStatGpuMemPersist`.
    GpuMemPersist = 2,
    /// `ncclStatGpuMemTotal`.
    GpuMemTotal = 3,
}

impl TryFrom<i32> for CommMemStat {
    type Error = i32;
    fn try_from(v: i32) -> Result<Self, i32> {
        match v {
            0 => Ok(Self::GpuMemSuspend),
            1 => Ok(Self::GpuMemSuspended),
            2 => Ok(Self::GpuMemPersist),
            3 => Ok(Self::GpuMemTotal),
            _ => Err(v),
        }
    }
}

/// `ncclWaitSignalDesc_t`.
#[allow(non_camel_case_types, non_snake_case)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclWaitSignalDesc_t {
    /// Number of signal operations to wait for.
    pub opCnt: i32,
    /// Peer to wait for.
    pub peer: i32,
    /// Signal index.
    pub sigIdx: i32,
    /// Context.
    pub ctx: i32,
}
