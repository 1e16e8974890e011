//! The benchmark's send and receive buffers: `ncclMemAlloc` memory of the
//! library under test, page-aligned host memory, or CUDA device memory.
//!
//! Data are always generated and checked on the host: for device memory a
//! host mirror holds them, [`Buf::push`] copies the mirror to the device and
//! [`Buf::pull`] copies a range back (for host memory both do nothing).

use crate::cli::Alloc;
use crate::cuda::Gpu;
use crate::nccl::Nccl;

/// Whether every page of `[p, p + len)` is mapped in this process (host
/// memory), by `mincore`, which fails with ENOMEM on unmapped pages.
fn host_mapped(p: *mut u8, len: usize) -> bool {
    let page = 4096usize;
    let start = p as usize & !(page - 1);
    let pages = (p as usize + len - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the range.
    unsafe { libc::mincore(start as *mut libc::c_void, pages * page, vec.as_mut_ptr()) == 0 }
}

/// Who frees the memory.
enum Owner<'a> {
    Nccl(&'a Nccl),
    Host,
    Cuda(&'a Gpu),
}

/// One benchmark buffer.
pub struct Buf<'a> {
    /// What the library is given.
    pub ptr: *mut u8,
    len: usize,
    owner: Owner<'a>,
    /// The device and the host mirror, for device memory.
    device: Option<(&'a Gpu, Vec<u8>)>,
}

impl<'a> Buf<'a> {
    /// At least `len` bytes (64 at least) from `alloc`. `gpu` is the rank's
    /// device when it has one (`--alloc device`, or a library whose
    /// `ncclMemAlloc` returns device memory).
    pub fn new(
        nccl: &'a Nccl,
        gpu: Option<&'a Gpu>,
        len: usize,
        alloc: Alloc,
    ) -> Result<Buf<'a>, String> {
        let len = len.max(64);
        match alloc {
            Alloc::Device => {
                let gpu = gpu.ok_or("--alloc device: no CUDA device")?;
                let ptr = gpu.alloc(len)?;
                return Ok(Buf {
                    ptr,
                    len,
                    owner: Owner::Cuda(gpu),
                    device: Some((gpu, vec![0; len])),
                });
            }
            Alloc::Nccl => match nccl.mem_alloc(len) {
                // Device memory, as nccl-tests gets it on a GPU machine.
                // Asked first: the driver reserves device addresses in the
                // process too (PROT_NONE), so `mincore` would pass.
                Some(Ok(p)) if !p.is_null() && gpu.is_some_and(|g| g.is_device_memory(p)) => {
                    let g = gpu.expect("checked");
                    return Ok(Buf {
                        ptr: p,
                        len,
                        owner: Owner::Nccl(nccl),
                        device: Some((g, vec![0; len])),
                    });
                }
                Some(Ok(p)) if !p.is_null() && host_mapped(p, len) => {
                    return Ok(Buf {
                        ptr: p,
                        len,
                        owner: Owner::Nccl(nccl),
                        device: None,
                    })
                }
                Some(Ok(p)) if !p.is_null() => {
                    let _ = nccl.mem_free(p);
                    return Err(
                        "ncclMemAlloc returned memory that is neither host memory nor \
                                device memory of this rank's CUDA context (try --alloc host or \
                                --alloc device)"
                            .into(),
                    );
                }
                Some(Ok(_)) => return Err("ncclMemAlloc returned NULL".into()),
                Some(Err(e)) => return Err(e.to_string()),
                None => {}
            },
            Alloc::Host => {}
        }
        let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|e| e.to_string())?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes"));
        }
        Ok(Buf {
            ptr,
            len,
            owner: Owner::Host,
            device: None,
        })
    }

    /// Whether the library sees device memory.
    pub fn is_device(&self) -> bool {
        self.device.is_some()
    }

    /// The host view: the memory itself, or the mirror of device memory.
    #[allow(clippy::mut_from_ref)]
    pub fn host(&mut self) -> &mut [u8] {
        match &mut self.device {
            Some((_, mirror)) => mirror,
            // SAFETY: ptr/len describe a live host allocation owned by self.
            None => unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) },
        }
    }

    /// Copies the mirror to the device (after the host filled it).
    pub fn push(&mut self) -> Result<(), String> {
        match &self.device {
            Some((g, mirror)) => g.upload(self.ptr, mirror),
            None => Ok(()),
        }
    }

    /// Copies `[off, off + n)` of the device memory into the mirror, after
    /// every call issued so far on the rank's stream.
    pub fn pull(&mut self, off: usize, n: usize) -> Result<(), String> {
        match &mut self.device {
            Some((g, mirror)) => {
                let end = (off + n).min(self.len);
                g.download(&mut mirror[off..end], self.ptr.wrapping_add(off))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        match self.owner {
            Owner::Nccl(n) => {
                let _ = n.mem_free(self.ptr);
            }
            Owner::Cuda(g) => g.free(self.ptr),
            Owner::Host => {
                let layout =
                    std::alloc::Layout::from_size_align(self.len, 4096).expect("layout was valid");
                // SAFETY: allocated with this layout in new().
                unsafe { std::alloc::dealloc(self.ptr, layout) };
            }
        }
    }
}
