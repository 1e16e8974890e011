//! Device buffers for `--alloc device` (and for `ncclMemAlloc` memory that
//! turns out to be device memory): the CUDA driver API through `cudarc` with
//! dynamic loading, so hetccl-perf still runs on machines without CUDA.
//!
//! Each rank makes the primary context of its device current (device =
//! local rank modulo the device count, several ranks per device allowed),
//! creates one non-blocking stream and passes it to every call, as
//! nccl-tests does. Buffers are filled and checked through host copies
//! ([`Gpu::upload`], [`Gpu::download`]); timed loops end with
//! [`Gpu::sync`], so the time covers the work on the stream.

use std::ffi::c_void;

use cudarc::driver::sys as cu;

/// One rank's device, context and stream.
pub struct Gpu {
    /// The device ordinal.
    pub device: i32,
    /// The device's name.
    pub name: String,
    ctx: cu::CUcontext,
    stream: cu::CUstream,
}

// SAFETY: a CUDA context and stream may be used from any thread once the
// context is made current there ([`Gpu::bind`]).
unsafe impl Send for Gpu {}
// SAFETY: as above; the driver serialises concurrent use of a stream.
unsafe impl Sync for Gpu {}

fn check(r: cu::CUresult, what: &str) -> Result<(), String> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: probing loads libcuda, whose initialisers only set up its state.
    unsafe { cu::is_culib_present() }
}

impl Gpu {
    /// Initialises CUDA and binds this thread to the device of `local_rank`.
    pub fn open(local_rank: usize) -> Result<Gpu, String> {
        if !driver_present() {
            return Err(
                "device buffers need the CUDA driver (libcuda.so.1), which was not found".into(),
            );
        }
        // SAFETY: the library is present; every out-pointer is writable.
        unsafe {
            check(cu::cuInit(0), "cuInit")?;
            let mut count = 0;
            check(cu::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
            if count < 1 {
                return Err("CUDA reports no device".into());
            }
            let device = (local_rank % count as usize) as i32;
            let mut dev: cu::CUdevice = 0;
            check(cu::cuDeviceGet(&mut dev, device), "cuDeviceGet")?;
            let mut name = [0 as std::ffi::c_char; 128];
            check(
                cu::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
                "cuDeviceGetName",
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            let mut ctx: cu::CUcontext = std::ptr::null_mut();
            check(
                cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            check(cu::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
            let mut stream: cu::CUstream = std::ptr::null_mut();
            let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
            check(cu::cuStreamCreate(&mut stream, flags), "cuStreamCreate")?;
            Ok(Gpu {
                device,
                name,
                ctx,
                stream,
            })
        }
    }

    /// Makes this rank's context current on the calling thread.
    pub fn bind(&self) -> Result<(), String> {
        // SAFETY: a retained primary context.
        check(unsafe { cu::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    /// The stream every call of this rank is issued on.
    pub fn stream(&self) -> *mut c_void {
        self.stream.cast()
    }

    /// `bytes` of device memory.
    pub fn alloc(&self, bytes: usize) -> Result<*mut u8, String> {
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: a writable slot; the context is current.
        check(unsafe { cu::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc")?;
        Ok(p as *mut u8)
    }

    /// Frees memory from [`Gpu::alloc`].
    pub fn free(&self, p: *mut u8) {
        // SAFETY: allocated by alloc; nothing uses it any more.
        unsafe { cu::cuMemFree_v2(p as cu::CUdeviceptr) };
    }

    /// Copies `src` to device address `dst`, ordered on the stream, and
    /// waits for it.
    pub fn upload(&self, dst: *mut u8, src: &[u8]) -> Result<(), String> {
        if src.is_empty() {
            return Ok(());
        }
        check(
            // SAFETY: dst holds src.len() bytes (callers copy within their buffer).
            unsafe {
                cu::cuMemcpyHtoDAsync_v2(
                    dst as cu::CUdeviceptr,
                    src.as_ptr().cast(),
                    src.len(),
                    self.stream,
                )
            },
            "cuMemcpyHtoDAsync",
        )?;
        self.sync()
    }

    /// Copies device address `src` into `dst`, ordered on the stream after
    /// every call issued so far, and waits for it.
    pub fn download(&self, dst: &mut [u8], src: *const u8) -> Result<(), String> {
        if dst.is_empty() {
            return Ok(());
        }
        check(
            // SAFETY: src holds dst.len() bytes.
            unsafe {
                cu::cuMemcpyDtoHAsync_v2(
                    dst.as_mut_ptr().cast(),
                    src as cu::CUdeviceptr,
                    dst.len(),
                    self.stream,
                )
            },
            "cuMemcpyDtoHAsync",
        )?;
        self.sync()
    }

    /// Waits until everything issued on the stream has run.
    pub fn sync(&self) -> Result<(), String> {
        // SAFETY: a live stream.
        check(
            unsafe { cu::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        )
    }

    /// Whether `p` is device (or managed) memory.
    pub fn is_device_memory(&self, p: *const u8) -> bool {
        let mut t: u32 = 0;
        // SAFETY: a writable 4-byte slot; unknown pointers give an error.
        let r = unsafe {
            cu::cuPointerGetAttribute(
                (&mut t as *mut u32).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                p as cu::CUdeviceptr,
            )
        };
        r == cu::CUresult::CUDA_SUCCESS && t == cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the stream was created in open and is idle or draining.
        unsafe { cu::cuStreamDestroy_v2(self.stream) };
    }
}
