//! GPU reduction kernels: their CUDA source (`kernels/reduce.cu`, compiled
//! at run time by NVRTC), their names per datatype and op, and a per-device
//! cache of the loaded module.
//!
//! Every NCCL datatype × op has an entry point `hetccl_reduce_<dt>_<op>`
//! (plus `hetccl_premul_<dt>` and, for integers, `hetccl_postdiv_<dt>`).
//! `collectives/tests/gpu_nvrtc.rs` compiles the source on a CPU-only
//! machine and checks that every name listed here is in the PTX.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

use hetccl_abi::{DataType, RedOp};
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, cu};
use super::nvrtc::{CompileError, Nvrtc};
use crate::error::{Error, Result};

/// The kernels' CUDA C++ source.
pub const SOURCE: &str = include_str!("kernels/reduce.cu");

/// The op names used in kernel names, in NCCL's order (PreMulSum last).
pub const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "premulsum"];

/// The architectures CI compiles for (Ampere and Hopper).
pub const CI_ARCHS: [&str; 2] = ["compute_80", "compute_90"];

/// The suffix of `dt` in kernel names.
pub fn dtype_suffix(dt: DataType) -> &'static str {
    match dt {
        DataType::Int8 => "i8",
        DataType::Uint8 => "u8",
        DataType::Int32 => "i32",
        DataType::Uint32 => "u32",
        DataType::Int64 => "i64",
        DataType::Uint64 => "u64",
        DataType::Float16 => "f16",
        DataType::Float32 => "f32",
        DataType::Float64 => "f64",
        DataType::Bfloat16 => "bf16",
        DataType::Float8e4m3 => "f8e4m3",
        DataType::Float8e5m2 => "f8e5m2",
    }
}

/// The name of `op` in kernel names (every dynamic op is a PreMulSum).
pub fn op_name(op: RedOp) -> &'static str {
    match op {
        RedOp::Sum => OPS[0],
        RedOp::Prod => OPS[1],
        RedOp::Max => OPS[2],
        RedOp::Min => OPS[3],
        RedOp::Avg => OPS[4],
        RedOp::Dynamic(_) => OPS[5],
    }
}

/// The binary step `dst = op(a, b)` (for avg/premulsum `dst = a*s + b`).
pub fn reduce_kernel(dt: DataType, op: RedOp) -> String {
    format!("hetccl_reduce_{}_{}", dtype_suffix(dt), op_name(op))
}

/// The pre-op `dst = a*s`.
pub fn premul_kernel(dt: DataType) -> String {
    format!("hetccl_premul_{}", dtype_suffix(dt))
}

/// The integer post-op `dst /= d` (None for float types, which pre-scale).
pub fn postdiv_kernel(dt: DataType) -> Option<String> {
    (!dt.is_float()).then(|| format!("hetccl_postdiv_{}", dtype_suffix(dt)))
}

/// Every entry point the source must define.
pub fn all_kernel_names() -> Vec<String> {
    let mut v = Vec::new();
    for dt in DataType::ALL {
        for op in OPS {
            v.push(format!("hetccl_reduce_{}_{op}", dtype_suffix(dt)));
        }
        v.push(premul_kernel(dt));
        v.extend(postdiv_kernel(dt));
    }
    v
}

/// NVRTC options for `arch` (e.g. `compute_90`): no FMA contraction, so a
/// pre-multiply and a sum round separately, as on the host.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_string(),
        "--std=c++14".to_string(),
    ]
}

/// Compiles [`SOURCE`] for `arch` to PTX.
pub fn compile_ptx(nvrtc: &Nvrtc, arch: &str) -> std::result::Result<String, CompileError> {
    nvrtc.compile(SOURCE, "hetccl_reduce.cu", &options(arch))
}

/// The kernels loaded on one device.
pub struct DeviceKernels {
    /// The CUDA device ordinal.
    pub device: i32,
    module: cu::CUmodule,
    funcs: Mutex<HashMap<String, usize>>,
}

// SAFETY: a CUmodule and its CUfunctions may be used from any thread whose
// current context is the one they were loaded in.
unsafe impl Send for DeviceKernels {}
// SAFETY: as above; the function map is behind a mutex.
unsafe impl Sync for DeviceKernels {}

/// A device's kernels, or why they could not be loaded.
type Loaded = std::result::Result<Arc<DeviceKernels>, String>;

/// Kernels per device, compiled and loaded at first use, or why they could
/// not be (not retried: the library or the compiler is missing).
static CACHE: Lazy<Mutex<HashMap<i32, Loaded>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// The compute capability of `device` as an NVRTC architecture.
fn arch_of(device: i32) -> Result<String> {
    use cu::CUdevice_attribute as A;
    let (mut major, mut minor) = (0, 0);
    driver::check(
        // SAFETY: writable slots; the driver checks the ordinal.
        unsafe {
            cu::cuDeviceGetAttribute(
                &mut major,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                device,
            )
        },
        "cuDeviceGetAttribute(major)",
    )?;
    driver::check(
        // SAFETY: as above.
        unsafe {
            cu::cuDeviceGetAttribute(
                &mut minor,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                device,
            )
        },
        "cuDeviceGetAttribute(minor)",
    )?;
    Ok(format!("compute_{major}{minor}"))
}

/// The kernels of `device`, compiling and loading them (in the calling
/// thread's current context) on first use, with the NVRTC at `nvrtc`
/// (`HETCCL_NVRTC_LIB`) or the usual sonames.
pub fn for_device(device: i32, nvrtc: Option<&std::path::Path>) -> Result<Arc<DeviceKernels>> {
    driver::require("GPU reductions")?;
    let mut cache = CACHE.lock();
    if let Some(k) = cache.get(&device) {
        return k.clone().map_err(Error::Internal);
    }
    let k = load(device, nvrtc);
    if let Err(e) = &k {
        tracing::info!(target: "hetccl::INIT", "GPU reduction kernels unavailable on device {device}, device reductions stage through host memory: {e}");
    }
    let k = k.map_err(|e| e.to_string());
    cache.insert(device, k.clone());
    k.map_err(Error::Internal)
}

fn load(device: i32, nvrtc: Option<&std::path::Path>) -> Result<Arc<DeviceKernels>> {
    driver::ensure_context()?;
    let arch = arch_of(device)?;
    let nvrtc = Nvrtc::open(nvrtc)?;
    let ptx = compile_ptx(&nvrtc, &arch)
        .map_err(|e| Error::Internal(format!("compiling the reduction kernels: {e}")))?;
    let cptx = CString::new(ptx).map_err(|_| Error::Internal("PTX holds a NUL".into()))?;
    let mut module: cu::CUmodule = std::ptr::null_mut();
    driver::check(
        // SAFETY: NUL-terminated PTX; a context is current.
        unsafe { cu::cuModuleLoadData(&mut module, cptx.as_ptr().cast()) },
        "cuModuleLoadData",
    )?;
    tracing::info!(target: "hetccl::INIT", "GPU reduction kernels compiled for device {device} ({arch}) with NVRTC {:?}", nvrtc.version());
    Ok(Arc::new(DeviceKernels {
        device,
        module,
        funcs: Mutex::new(HashMap::new()),
    }))
}

impl DeviceKernels {
    fn function(&self, name: &str) -> Result<cu::CUfunction> {
        let mut funcs = self.funcs.lock();
        if let Some(&f) = funcs.get(name) {
            return Ok(f as cu::CUfunction);
        }
        let cname = CString::new(name).map_err(|_| Error::Internal("kernel name".into()))?;
        let mut f: cu::CUfunction = std::ptr::null_mut();
        driver::check(
            // SAFETY: a loaded module and a NUL-terminated name.
            unsafe { cu::cuModuleGetFunction(&mut f, self.module, cname.as_ptr()) },
            "cuModuleGetFunction",
        )?;
        funcs.insert(name.to_string(), f as usize);
        Ok(f)
    }

    /// Whether the kernel `name` can be launched here.
    pub fn has(&self, name: &str) -> bool {
        self.function(name).is_ok()
    }

    /// Launches `name` over `n` elements with `params` (pointers to the
    /// kernel's arguments, in order) on `stream`: 256 threads per block,
    /// grid-stride loops, at most 4096 blocks.
    ///
    /// # Safety
    /// `params` match the kernel's signature; the buffers they name stay
    /// valid until the kernel has run.
    unsafe fn launch(
        &self,
        name: &str,
        params: &mut [*mut c_void],
        n: u64,
        stream: cu::CUstream,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let f = self.function(name)?;
        let threads = 256u32;
        let blocks = n.div_ceil(u64::from(threads)).min(4096) as u32;
        // SAFETY: per the contract.
        driver::check(
            unsafe {
                cu::cuLaunchKernel(
                    f,
                    blocks,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }

    /// Enqueues `dst[i] = op(a[i], b[i])` for `n` elements of `dt` on
    /// `stream` (for avg and premulsum `dst[i] = a[i]*s + b[i]`, with
    /// `scalar` holding `s`'s bytes).
    ///
    /// # Safety
    /// `dst`, `a`, `b` are device-accessible buffers of `n` elements that
    /// stay valid until the kernel has run.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        dt: DataType,
        op: RedOp,
        dst: *mut c_void,
        a: *const c_void,
        b: *const c_void,
        n: u64,
        scalar: [u8; 8],
        stream: cu::CUstream,
    ) -> Result<()> {
        let (mut d, mut pa, mut pb, mut n_, mut s) = (dst, a, b, n, scalar);
        let mut params: [*mut c_void; 5] = [
            (&mut d as *mut *mut c_void).cast(),
            (&mut pa as *mut *const c_void).cast(),
            (&mut pb as *mut *const c_void).cast(),
            (&mut n_ as *mut u64).cast(),
            s.as_mut_ptr().cast(),
        ];
        // SAFETY: the parameters match the kernel; buffers per the contract.
        unsafe { self.launch(&reduce_kernel(dt, op), &mut params, n, stream) }
    }

    /// Enqueues `dst[i] = a[i]*s` (the pre-op of avg and premulsum).
    ///
    /// # Safety
    /// As for [`DeviceKernels::reduce`].
    pub unsafe fn premul(
        &self,
        dt: DataType,
        dst: *mut c_void,
        a: *const c_void,
        n: u64,
        scalar: [u8; 8],
        stream: cu::CUstream,
    ) -> Result<()> {
        let (mut d, mut pa, mut n_, mut s) = (dst, a, n, scalar);
        let mut params: [*mut c_void; 4] = [
            (&mut d as *mut *mut c_void).cast(),
            (&mut pa as *mut *const c_void).cast(),
            (&mut n_ as *mut u64).cast(),
            s.as_mut_ptr().cast(),
        ];
        // SAFETY: the parameters match the kernel; buffers per the contract.
        unsafe { self.launch(&premul_kernel(dt), &mut params, n, stream) }
    }

    /// Enqueues `dst[i] /= d` (the post-op of integer avg).
    ///
    /// # Safety
    /// As for [`DeviceKernels::reduce`]; `dt` is an integer type.
    pub unsafe fn postdiv(
        &self,
        dt: DataType,
        dst: *mut c_void,
        n: u64,
        d: u64,
        stream: cu::CUstream,
    ) -> Result<()> {
        let name = postdiv_kernel(dt)
            .ok_or_else(|| Error::Internal(format!("no postdiv kernel for {dt:?}")))?;
        let (mut p, mut n_, mut d_) = (dst, n, d);
        let mut params: [*mut c_void; 3] = [
            (&mut p as *mut *mut c_void).cast(),
            (&mut n_ as *mut u64).cast(),
            (&mut d_ as *mut u64).cast(),
        ];
        // SAFETY: the parameters match the kernel; buffers per the contract.
        unsafe { self.launch(&name, &mut params, n, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_and_op_has_a_named_entry_in_the_source() {
        let names = all_kernel_names();
        assert_eq!(names.len(), 12 * 6 + 12 + 6);
        // The source builds the names with macros; each dtype suffix must be
        // instantiated with KERNELS(...), integers also with POSTDIV(...).
        for dt in DataType::ALL {
            let s = dtype_suffix(dt);
            assert!(SOURCE.contains(&format!("KERNELS({s}, ")), "{s}");
            assert_eq!(
                SOURCE.contains(&format!("POSTDIV({s}, ")),
                !dt.is_float(),
                "{s}"
            );
        }
        for op in OPS {
            assert!(SOURCE.contains(&format!("BINARY(NAME, T, {op},")), "{op}");
        }
        assert_eq!(
            reduce_kernel(DataType::Bfloat16, RedOp::Dynamic(7)),
            "hetccl_reduce_bf16_premulsum"
        );
    }
}
