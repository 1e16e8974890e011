//! CUDA IPC for device buffers: a rank exports the allocation holding a
//! buffer (`cuMemGetAddressRange` + `cuIpcGetMemHandle`), its peers on the
//! node open it once (`cuIpcOpenMemHandle`) and keep the mapping in an
//! [`Imports`] cache keyed by the exporting process and the handle.
//!
//! A handle names one allocation for its lifetime: a buffer freed and
//! allocated again gets a new handle, so a cached mapping is never reused
//! for different memory. The cache holds at most [`MAX_IMPORTS`] mappings
//! and closes the oldest beyond that. Ranks of one process (threads) use
//! each other's pointers directly: the driver refuses to open a handle in
//! the process that exported it.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;

use super::driver::{self, cu};
use crate::error::{Error, Result};

/// The most peer allocations kept open per communicator.
pub const MAX_IMPORTS: usize = 256;

/// Bytes of an IPC handle (`CU_IPC_HANDLE_SIZE`).
pub const HANDLE_BYTES: usize = 64;

/// What a peer needs to reach one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Export {
    /// The allocation's IPC handle.
    pub handle: [u8; HANDLE_BYTES],
    /// The buffer's offset in the allocation.
    pub offset: u64,
    /// The allocation's size.
    pub size: u64,
    /// The buffer's address in the exporting process.
    pub ptr: u64,
}

/// Exports the allocation holding device pointer `p`.
pub fn export(p: *const c_void) -> Result<Export> {
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    // SAFETY: writable slots; the driver checks the address.
    driver::check(
        unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, p as cu::CUdeviceptr) },
        "cuMemGetAddressRange",
    )?;
    let mut h = cu::CUipcMemHandle {
        reserved: [0; HANDLE_BYTES],
    };
    // SAFETY: the base of a live allocation and a writable handle.
    driver::check(
        unsafe { cu::cuIpcGetMemHandle(&mut h, base) },
        "cuIpcGetMemHandle",
    )?;
    let mut handle = [0u8; HANDLE_BYTES];
    for (d, s) in handle.iter_mut().zip(h.reserved) {
        *d = s as u8;
    }
    Ok(Export {
        handle,
        offset: p as u64 - base,
        size: size as u64,
        ptr: p as u64,
    })
}

/// The 16-byte UUID of the device of the calling thread's current context.
pub fn current_uuid() -> Result<[u8; 16]> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: a writable slot; the caller made a context current.
    driver::check(unsafe { cu::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
    let mut u = cu::CUuuid { bytes: [0; 16] };
    // SAFETY: a writable UUID and a device the driver just named.
    driver::check(
        unsafe { cu::cuDeviceGetUuid_v2(&mut u, dev) },
        "cuDeviceGetUuid",
    )?;
    Ok(u.bytes.map(|b| b as u8))
}

/// Peer allocations opened in this process, for one communicator.
#[derive(Debug, Default)]
pub struct Imports {
    open: HashMap<(u32, [u8; HANDLE_BYTES]), u64>,
    order: VecDeque<(u32, [u8; HANDLE_BYTES])>,
}

impl Imports {
    /// The address in this process of the buffer `e` that process `pid`
    /// exported (`pid` is this process: `e.ptr` itself).
    pub fn resolve(&mut self, pid: u32, e: &Export) -> Result<u64> {
        if pid == std::process::id() {
            return Ok(e.ptr);
        }
        let key = (pid, e.handle);
        if let Some(&base) = self.open.get(&key) {
            return Ok(base + e.offset);
        }
        let mut h = cu::CUipcMemHandle {
            reserved: [0; HANDLE_BYTES],
        };
        for (d, s) in h.reserved.iter_mut().zip(e.handle) {
            *d = s as std::ffi::c_char;
        }
        let mut base: cu::CUdeviceptr = 0;
        let flags = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a writable slot and a handle a peer exported; the driver
        // validates it.
        driver::check(
            unsafe { cu::cuIpcOpenMemHandle_v2(&mut base, h, flags) },
            "cuIpcOpenMemHandle",
        )
        .map_err(|err| Error::System(format!("opening process {pid}'s buffer: {err}")))?;
        if self.order.len() >= MAX_IMPORTS {
            if let Some(old) = self.order.pop_front() {
                if let Some(b) = self.open.remove(&old) {
                    // SAFETY: opened here; no operation uses it any more
                    // (operations end with their stream synchronised).
                    unsafe { cu::cuIpcCloseMemHandle(b) };
                }
            }
        }
        self.open.insert(key, base);
        self.order.push_back(key);
        Ok(base + e.offset)
    }
}

impl Drop for Imports {
    fn drop(&mut self) {
        for (_, b) in self.open.drain() {
            // SAFETY: opened by resolve; the proxy owning this cache has no
            // work in flight when it ends.
            unsafe { cu::cuIpcCloseMemHandle(b) };
        }
    }
}
