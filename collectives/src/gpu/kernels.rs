//! GPU reduction kernels: their CUDA source (`kernels/reduce.cu`, compiled
//! at run time by NVRTC), their names per datatype and op, and the loaded
//! kernels of one context with their launches ([`DeviceKernels`]; loading
//! is in [`super::module`]).
//!
//! Every NCCL datatype × op has an entry point `hetccl_reduce_<dt>_<op>`
//! (plus `hetccl_premul_<dt>` and, for integers, `hetccl_postdiv_<dt>`).
//! `collectives/tests/gpu_nvrtc.rs` compiles the source on a CPU-only
//! machine and checks that every name listed here is in the PTX and in the
//! CUBIN.

use std::collections::HashMap;
use std::ffi::{c_void, CString};

use hetccl_abi::{DataType, RedOp};

use super::driver::{self, cu};
use super::nvrtc::{CompileError, Nvrtc};
use crate::error::{Error, Result};

/// The kernels' CUDA C++ source.
pub const SOURCE: &str = include_str!("kernels/reduce.cu");

/// The op names used in kernel names, in NCCL's order (PreMulSum last).
pub const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "premulsum"];

/// The architectures CI compiles for (Ampere and Hopper), as PTX.
pub const CI_ARCHS: [&str; 2] = ["compute_80", "compute_90"];

/// The real architectures CI compiles CUBINs for.
pub const CI_SMS: [&str; 2] = ["sm_80", "sm_90"];

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

/// NVRTC options for `arch` (`compute_90` for PTX, `sm_90` for a CUBIN):
/// no FMA contraction, so a pre-multiply and a sum round separately, as on
/// the host.
pub fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_string(),
        "--std=c++14".to_string(),
    ]
}

/// Compiles [`SOURCE`] for `arch` (`compute_XX`) to PTX.
pub fn compile_ptx(nvrtc: &Nvrtc, arch: &str) -> std::result::Result<String, CompileError> {
    nvrtc.compile(SOURCE, "hetccl_reduce.cu", &options(arch))
}

/// Compiles [`SOURCE`] for the real architecture `sm` (`sm_XX`) to a CUBIN.
pub fn compile_cubin(nvrtc: &Nvrtc, sm: &str) -> std::result::Result<Vec<u8>, CompileError> {
    nvrtc.compile_cubin(SOURCE, "hetccl_reduce.cu", &options(sm))
}

/// The kernels loaded in one context: the module and every entry point,
/// looked up when it was loaded (a lookup may load code, which waits for
/// the device, so none is made later).
pub struct DeviceKernels {
    /// The CUDA device ordinal.
    pub device: i32,
    /// What was loaded: `CUBIN sm_90` or `PTX compute_90`.
    pub image: String,
    /// Loaded for the life of the process (never unloaded: that waits for the device).
    _module: cu::CUmodule,
    funcs: HashMap<String, usize>,
}

// SAFETY: a CUmodule and its CUfunctions may be used from any thread whose
// current context is the one they were loaded in.
unsafe impl Send for DeviceKernels {}
// SAFETY: as above; the function map is read-only after the load.
unsafe impl Sync for DeviceKernels {}

/// The compute capability of `device`: (major, minor).
pub(super) fn capability(device: i32) -> Result<(i32, i32)> {
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
    Ok((major, minor))
}

impl DeviceKernels {
    /// Loads `image` in the current context and looks up every entry
    /// point. Call at a safe point only ([`super::safe`]): both steps may
    /// wait for the device.
    pub(super) fn load(device: i32, what: String, image: &[u8]) -> Result<DeviceKernels> {
        let mut module: cu::CUmodule = std::ptr::null_mut();
        driver::check(
            // SAFETY: a CUBIN or NUL-terminated PTX (the caller's); a
            // context is current.
            unsafe { cu::cuModuleLoadData(&mut module, image.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        let mut funcs = HashMap::new();
        for name in all_kernel_names() {
            let cname = CString::new(name.as_str()).expect("kernel names hold no NUL");
            let mut f: cu::CUfunction = std::ptr::null_mut();
            // SAFETY: a loaded module and a NUL-terminated name.
            let r = unsafe { cu::cuModuleGetFunction(&mut f, module, cname.as_ptr()) };
            if r == cu::CUresult::CUDA_SUCCESS {
                funcs.insert(name, f as usize);
            } else {
                tracing::debug!(target: "hetccl::INIT", "kernel {name}: {}", driver::name(r));
            }
        }
        Ok(DeviceKernels {
            device,
            image: what,
            _module: module,
            funcs,
        })
    }

    fn function(&self, name: &str) -> Result<cu::CUfunction> {
        match self.funcs.get(name) {
            Some(&f) => Ok(f as cu::CUfunction),
            None => Err(Error::Internal(
                format!(
                    "kernel {name} is not in the module loaded on device {} ({})",
                    self.device, self.image
                )
                .into(),
            )),
        }
    }

    /// Whether the kernel `name` can be launched here.
    pub fn has(&self, name: &str) -> bool {
        self.funcs.contains_key(name)
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
            .ok_or_else(|| Error::Internal(format!("no postdiv kernel for {dt:?}").into()))?;
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
