//! CUDA IPC for device buffers: a rank exports the allocation holding a
//! buffer (`cuMemGetAddressRange` + `cuIpcGetMemHandle`), its peers on the
//! node open it once (`cuIpcOpenMemHandle`) and keep the mapping in an
//! [`Imports`] cache keyed by the exporting process and the handle.
//!
//! Ranks on different GPUs of the node read each other's memory through
//! peer access (NVLink or PCIe), checked with `cuDeviceCanAccessPeer` and
//! enabled by the open (`CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`).
//!
//! An exporter asks the driver for an allocation's handle once and keeps it
//! by buffer id (unique for the process's life).
//!
//! A handle names one allocation for its lifetime: a buffer freed and
//! allocated again gets a new handle, so a cached mapping is never reused
//! for different memory. The cache holds at most [`MAX_IMPORTS`] mappings;
//! beyond that the oldest is evicted, but `cuIpcCloseMemHandle` waits for
//! the device, so evicted mappings are closed only at a safe point
//! ([`super::safe`]; until then a handle seen again takes its mapping
//! back). Ranks of one process (threads) use each other's pointers
//! directly: the driver refuses to open a handle in the process that
//! exported it.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

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

/// An exported allocation: its handle, base and size.
type Exported = ([u8; HANDLE_BYTES], u64, u64);

/// Exported allocations by buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`,
/// unique for the process's life, so an entry never describes other
/// memory): (handle, base, size). Cleared when [`MAX_EXPORTS`] is reached.
static EXPORTS: Lazy<Mutex<HashMap<u64, Exported>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// The most cached exports.
const MAX_EXPORTS: usize = 4096;

/// The buffer id of the allocation holding `p` (0: unknown).
fn buffer_id(p: *const c_void) -> u64 {
    let mut id = 0u64;
    // SAFETY: a writable 8-byte slot; the driver checks the address.
    let r = unsafe {
        cu::cuPointerGetAttribute(
            (&mut id as *mut u64).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            p as cu::CUdeviceptr,
        )
    };
    if r == cu::CUresult::CUDA_SUCCESS {
        id
    } else {
        0
    }
}

impl Export {
    /// Words an export takes on a board: offset, size, pointer, handle.
    pub const WORDS: usize = 3 + HANDLE_BYTES / 8;

    /// Stores the export in `w` ([`Export::WORDS`] words, owner-written).
    pub fn store(&self, w: &[AtomicU64]) {
        w[0].store(self.offset, Ordering::Relaxed);
        w[1].store(self.size, Ordering::Relaxed);
        w[2].store(self.ptr, Ordering::Relaxed);
        for (i, c) in self.handle.chunks(8).enumerate() {
            let v = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
            w[3 + i].store(v, Ordering::Relaxed);
        }
    }

    /// Reads an export stored by [`Export::store`].
    pub fn load(w: &[AtomicU64]) -> Export {
        let mut handle = [0u8; HANDLE_BYTES];
        for (i, c) in handle.chunks_mut(8).enumerate() {
            c.copy_from_slice(&w[3 + i].load(Ordering::Relaxed).to_le_bytes());
        }
        Export {
            handle,
            offset: w[0].load(Ordering::Relaxed),
            size: w[1].load(Ordering::Relaxed),
            ptr: w[2].load(Ordering::Relaxed),
        }
    }
}

/// Stores a device UUID in two board words.
pub fn store_uuid(w: &[AtomicU64], uuid: &[u8; 16]) {
    for (x, c) in w.iter().zip(uuid.chunks(8)) {
        x.store(
            u64::from_le_bytes(c.try_into().expect("8-byte chunk")),
            Ordering::Relaxed,
        );
    }
}

/// Reads a UUID stored by [`store_uuid`].
pub fn load_uuid(w: &[AtomicU64]) -> [u8; 16] {
    let mut u = [0u8; 16];
    for (x, c) in w.iter().zip(u.chunks_mut(8)) {
        c.copy_from_slice(&x.load(Ordering::Relaxed).to_le_bytes());
    }
    u
}

/// Exports the allocation holding device pointer `p`; the handle of an
/// allocation is asked for once (cached by buffer id).
pub fn export(p: *const c_void) -> Result<Export> {
    let id = buffer_id(p);
    if id != 0 {
        if let Some(&(handle, base, size)) = EXPORTS.lock().get(&id) {
            return Ok(Export {
                handle,
                offset: p as u64 - base,
                size,
                ptr: p as u64,
            });
        }
    }
    let e = export_uncached(p)?;
    if id != 0 {
        let mut m = EXPORTS.lock();
        if m.len() >= MAX_EXPORTS {
            m.clear();
        }
        m.insert(id, (e.handle, e.ptr - e.offset, e.size));
    }
    Ok(e)
}

fn export_uncached(p: *const c_void) -> Result<Export> {
    let (base, size) = address_range(p as u64)?;
    let mut h = cu::CUipcMemHandle {
        reserved: [0; HANDLE_BYTES],
    };
    driver::check(
        // SAFETY: the base of a live allocation and a writable handle.
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
        size,
        ptr: p as u64,
    })
}

/// The 16-byte UUID of the device of the calling thread's current context.
pub fn current_uuid() -> Result<[u8; 16]> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: a writable slot; the caller made a context current.
    driver::check(unsafe { cu::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
    let mut u = cu::CUuuid { bytes: [0; 16] };
    driver::check(
        // SAFETY: a writable UUID and a device the driver just named.
        unsafe { cu::cuDeviceGetUuid_v2(&mut u, dev) },
        "cuDeviceGetUuid",
    )?;
    Ok(u.bytes.map(|b| b as u8))
}

/// The ordinal of the device with `uuid` in this process (None: not
/// visible here, e.g. hidden by `CUDA_VISIBLE_DEVICES`).
fn device_of(uuid: &[u8; 16]) -> Option<cu::CUdevice> {
    let mut n = 0;
    // SAFETY: a writable slot; the driver is initialised.
    if unsafe { cu::cuDeviceGetCount(&mut n) } != cu::CUresult::CUDA_SUCCESS {
        return None;
    }
    (0..n).find_map(|i| {
        let mut d: cu::CUdevice = 0;
        let mut u = cu::CUuuid { bytes: [0; 16] };
        // SAFETY: writable slots and an ordinal below the count.
        let ok = unsafe {
            cu::cuDeviceGet(&mut d, i) == cu::CUresult::CUDA_SUCCESS
                && cu::cuDeviceGetUuid_v2(&mut u, d) == cu::CUresult::CUDA_SUCCESS
        };
        (ok && u.bytes.map(|b| b as u8) == *uuid).then_some(d)
    })
}

/// `Ok` when this process's device `mine` can read device `peer`'s memory
/// directly: the same device, or peer access between the two
/// (`cuDeviceCanAccessPeer`; NVLink or PCIe peer-to-peer).
pub fn check_peer_access(mine: &[u8; 16], peer: &[u8; 16]) -> Result<()> {
    if mine == peer {
        return Ok(());
    }
    let (Some(a), Some(b)) = (device_of(mine), device_of(peer)) else {
        return Err(Error::System(
            "a peer's GPU is not visible in this process".into(),
        ));
    };
    let mut can = 0;
    driver::check(
        // SAFETY: a writable slot and two device handles from the driver.
        unsafe { cu::cuDeviceCanAccessPeer(&mut can, a, b) },
        "cuDeviceCanAccessPeer",
    )?;
    if can == 1 {
        Ok(())
    } else {
        Err(Error::System(
            format!("no peer access from device {a} to device {b}").into(),
        ))
    }
}

/// An imported allocation: the exporter's pid and handle.
type Key = (u32, [u8; HANDLE_BYTES]);

/// One mapping: the local base, its size, and the context it was opened in
/// (its close must be made there).
#[derive(Debug, Clone, Copy)]
struct Mapping {
    base: u64,
    size: u64,
    ctx: usize,
}

/// Peer allocations opened in this process, for one communicator.
#[derive(Debug, Default)]
pub struct Imports {
    open: HashMap<Key, Mapping>,
    order: VecDeque<Key>,
    /// Evicted, still mapped until the next safe point.
    evicted: HashMap<Key, Mapping>,
}

/// The allocation that holds device pointer `p` in this process: (base,
/// size), from the driver.
fn address_range(p: u64) -> Result<(u64, u64)> {
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    driver::check(
        // SAFETY: writable slots; the driver checks the address.
        unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, p as cu::CUdeviceptr) },
        "cuMemGetAddressRange",
    )?;
    Ok((base, size as u64))
}

/// Fails unless `len` bytes from `off` fit in `size` bytes.
fn fits(what: &str, off: u64, len: u64, size: u64) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::usage(format!(
            "{what}: {len} B at offset {off} do not fit in the {size} B allocation; refused \
             before any access"
        ))),
    }
}

impl Imports {
    /// The address in this process of the `len`-byte buffer `e` that
    /// process `pid` exported (`pid` is this process: `e.ptr` itself).
    /// The buffer must lie inside the allocation the peer exported, and,
    /// once mapped here, inside the mapping the driver made, or nothing is
    /// opened or returned.
    pub fn resolve(&mut self, pid: u32, e: &Export, len: u64) -> Result<u64> {
        let what = format!("process {pid}'s buffer");
        fits(&what, e.offset, len, e.size)?;
        if pid == std::process::id() {
            let (base, size) = address_range(e.ptr)?;
            fits(
                &what,
                e.ptr.checked_sub(base).unwrap_or(u64::MAX),
                len,
                size,
            )?;
            return Ok(e.ptr);
        }
        let key = (pid, e.handle);
        if let Some(m) = self.evicted.remove(&key) {
            self.insert(key, m);
        }
        if let Some(m) = self.open.get(&key) {
            fits(&what, e.offset, len, m.size)?;
            return Ok(m.base + e.offset);
        }
        let mut h = cu::CUipcMemHandle {
            reserved: [0; HANDLE_BYTES],
        };
        for (d, s) in h.reserved.iter_mut().zip(e.handle) {
            *d = s as std::ffi::c_char;
        }
        let mut base: cu::CUdeviceptr = 0;
        let flags = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        driver::check(
            // SAFETY: a writable slot and a handle a peer exported; the driver validates it.
            unsafe { cu::cuIpcOpenMemHandle_v2(&mut base, h, flags) },
            "cuIpcOpenMemHandle",
        )
        .map_err(|err| Error::System(format!("opening process {pid}'s buffer: {err}").into()))?;
        // What the driver mapped, whatever the peer said.
        let size = match address_range(base) {
            Ok((b, size)) if b == base => size,
            _ => 0,
        };
        let ctx = driver::current_context()? as usize;
        self.insert(key, Mapping { base, size, ctx });
        fits(&what, e.offset, len, size)?;
        Ok(base + e.offset)
    }

    /// Adds a mapping, evicting the oldest beyond [`MAX_IMPORTS`] (kept
    /// mapped: an operation of this batch may still use it).
    fn insert(&mut self, key: Key, m: Mapping) {
        if self.order.len() >= MAX_IMPORTS {
            if let Some(old) = self.order.pop_front() {
                if let Some(om) = self.open.remove(&old) {
                    self.evicted.insert(old, om);
                }
            }
        }
        self.open.insert(key, m);
        self.order.push_back(key);
    }

    /// Mappings open (cached) and evicted (awaiting their close).
    pub fn counts(&self) -> (usize, usize) {
        (self.open.len(), self.evicted.len())
    }

    /// Closes the evicted mappings. Call at a safe point only
    /// ([`super::safe::end`]): `cuIpcCloseMemHandle` waits for the device.
    pub fn close_evicted(&mut self) {
        if self.evicted.is_empty() {
            return;
        }
        tracing::debug!(target: "hetccl::COLL", "closing {} evicted CUDA IPC mappings", self.evicted.len());
        close_all(self.evicted.drain().map(|(_, m)| m).collect());
    }
}

/// Closes mappings, each in its own context, restoring the caller's.
fn close_all(maps: Vec<Mapping>) {
    let prev = driver::current_context().ok();
    for m in maps {
        // SAFETY: the context the mapping was opened in; primary contexts
        // and the callers' contexts outlive hetccl's work on them.
        let _ = unsafe { driver::set_current(m.ctx as cu::CUcontext) };
        // SAFETY: opened by resolve; no operation uses it (a safe point).
        unsafe { cu::cuIpcCloseMemHandle(m.base) };
    }
    if let Some(c) = prev {
        // SAFETY: the context current on entry.
        let _ = unsafe { driver::set_current(c) };
    }
}

impl Drop for Imports {
    fn drop(&mut self) {
        let maps: Vec<Mapping> = self
            .open
            .drain()
            .chain(self.evicted.drain())
            .map(|(_, m)| m)
            .collect();
        if !maps.is_empty() {
            // Another communicator's batch may still be in flight.
            super::safe::defer(Box::new(move || close_all(maps)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_must_fit_its_allocation() {
        assert!(fits("b", 0, 4096, 4096).is_ok());
        assert!(fits("b", 4000, 96, 4096).is_ok());
        assert!(fits("b", 0, 0, 0).is_ok());
        let e = fits("rank 1's buffer", 4000, 97, 4096).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert!(e.to_string().contains("do not fit"), "{e}");
        assert!(fits("b", u64::MAX, 2, u64::MAX).is_err(), "overflow");
    }
}
