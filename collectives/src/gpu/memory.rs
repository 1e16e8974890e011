//! Where a buffer lives: pageable host memory, pinned host memory, device
//! memory or managed memory.
//!
//! [`classify`] is on every call's path, so answers are cached: each thread
//! keeps a few known address ranges with their placement, and a hit costs a
//! handful of comparisons (no lock, no syscall). A miss asks the CUDA driver
//! when it is loaded (`cuPointerGetAttributes`: memory type, managed flag,
//! device, and the whole allocation's range, which is what gets cached) and
//! otherwise checks with `mincore` that the range is mapped in this process.
//! A buffer inside a host `ncclMemAlloc` allocation is cached as the whole
//! allocation, so that calls on successive windows of one buffer hit.
//! A pointer that is neither host-mapped nor known to CUDA is refused with
//! `ncclInvalidArgument`; without the driver the message says that device
//! buffers need it.
//!
//! Cached host ranges can go stale if the application unmaps memory and the
//! same addresses later come back as CUDA memory; [`forget_all`] (called when
//! hetccl frees memory it handed out) drops every thread's cache. The CUDA
//! driver reserves its unified address range at initialisation, so in
//! practice host and device ranges do not trade places.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use super::driver::{self, cu};
use crate::error::{Error, Result};

/// A buffer's memory kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Pageable host memory (or no buffer at all).
    Host,
    /// Page-locked host memory registered with CUDA (`cuMemHostAlloc`,
    /// `cudaHostRegister`), visible to the GPU.
    PinnedHost,
    /// Device memory of the given CUDA device ordinal.
    Device(i32),
    /// Managed (unified) memory; the device is the one it was allocated from.
    Managed(i32),
}

impl Placement {
    /// Whether the call takes the stream-ordered GPU path: every buffer CUDA
    /// knows about is ordered on the caller's stream, as in NCCL.
    pub fn is_device(self) -> bool {
        !matches!(self, Placement::Host)
    }

    /// The CUDA device, for device and managed memory.
    pub fn device(self) -> Option<i32> {
        match self {
            Placement::Device(d) | Placement::Managed(d) => Some(d),
            _ => None,
        }
    }
}

/// Entries per thread's cache.
const SLOTS: usize = 8;

/// Bumped by [`forget_all`]; a thread whose cache is older clears it.
static GENERATION: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    end: usize,
    placement: Placement,
}

/// An empty slot: a range no buffer fits in.
const EMPTY: Entry = Entry {
    start: usize::MAX,
    end: 0,
    placement: Placement::Host,
};

struct Cache {
    generation: u64,
    /// The slot the next learned range takes.
    next: usize,
    /// The slot of the last hit of each side (send, receive), tried
    /// first: calls reuse their buffers, and a group alternates sends and
    /// receives.
    last: [usize; 2],
    entries: [Entry; SLOTS],
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache { generation: 0, next: 0, last: [0; 2], entries: [EMPTY; SLOTS] })
    };
}

/// Drops every thread's cached ranges (they are re-learned on next use).
pub fn forget_all() {
    GENERATION.fetch_add(1, Ordering::Release);
}

/// The placement of `len` bytes at `ptr`; `what` names the buffer in errors.
/// NULL or empty buffers are [`Placement::Host`] (nothing is accessed).
pub fn classify(ptr: *const c_void, len: usize, what: &str) -> Result<Placement> {
    let Some(span) = span(ptr, len, what)? else {
        return Ok(Placement::Host);
    };
    let generation = GENERATION.load(Ordering::Acquire);
    match CACHE
        .with(|c| c.borrow_mut().find(generation, Some(span), None))
        .0
    {
        Some(p) => Ok(p),
        None => learn(span, what),
    }
}

/// `len` bytes at `ptr` as a `(start, end)` range; `None` for NULL or
/// empty buffers.
#[inline]
fn span(ptr: *const c_void, len: usize, what: &str) -> Result<Option<(usize, usize)>> {
    if ptr.is_null() || len == 0 {
        return Ok(None);
    }
    let start = ptr as usize;
    match start.checked_add(len) {
        Some(end) => Ok(Some((start, end))),
        None => Err(wraps(ptr, len, what)),
    }
}

#[cold]
#[inline(never)]
fn wraps(ptr: *const c_void, len: usize, what: &str) -> Error {
    Error::arg(format!("{what} {ptr:p} + {len} bytes wraps around"))
}

impl Cache {
    /// The cached placements of up to two ranges (one thread-local access
    /// per call); clears the cache when [`forget_all`] ran since.
    fn find(
        &mut self,
        generation: u64,
        x: Option<(usize, usize)>,
        y: Option<(usize, usize)>,
    ) -> (Option<Placement>, Option<Placement>) {
        if self.generation != generation {
            self.generation = generation;
            self.entries = [EMPTY; SLOTS];
            return (None, None);
        }
        (
            x.and_then(|x| self.hit(x, 0)),
            y.and_then(|y| self.hit(y, 1)),
        )
    }

    /// The placement of a call whose buffers (when not empty) each lie in
    /// the range their side hit last, and [`agree`]; `None` otherwise (the
    /// caller then takes [`Cache::find`]).
    #[inline]
    fn last_hits(
        &self,
        generation: u64,
        x: Option<(usize, usize)>,
        y: Option<(usize, usize)>,
    ) -> Option<Placement> {
        if self.generation != generation {
            return None;
        }
        let side = |span: Option<(usize, usize)>, side: usize| match span {
            None => Some(None),
            Some(span) => self.last_hit(span, side).map(Some),
        };
        agree(side(x, 0)?, side(y, 1)?)
    }

    /// The placement of the range `side` (0 send, 1 receive) hit last, if
    /// it holds `(start, end)`.
    #[inline]
    fn last_hit(&self, (start, end): (usize, usize), side: usize) -> Option<Placement> {
        let e = &self.entries[self.last[side] % SLOTS];
        e.holds(start, end).then_some(e.placement)
    }

    /// The placement of the cached range holding `span`, a buffer of
    /// `side` (0 send, 1 receive).
    #[inline]
    fn hit(&mut self, span: (usize, usize), side: usize) -> Option<Placement> {
        if let Some(p) = self.last_hit(span, side) {
            return Some(p);
        }
        let i = self.entries.iter().position(|e| e.holds(span.0, span.1))?;
        self.last[side] = i;
        Some(self.entries[i].placement)
    }
}

/// A call's placement from its buffers' (`None`: empty): host for none,
/// else theirs; `None` when a host and a CUDA buffer are mixed.
#[inline]
fn agree(s: Option<Placement>, r: Option<Placement>) -> Option<Placement> {
    match (s, r) {
        (Some(s), Some(r)) => (s.is_device() == r.is_device()).then_some(s),
        (Some(p), None) | (None, Some(p)) => Some(p),
        (None, None) => Some(Placement::Host),
    }
}

impl Entry {
    /// Whether this range holds `[start, end)`.
    #[inline]
    fn holds(&self, start: usize, end: usize) -> bool {
        self.start <= start && end <= self.end
    }
}

#[cfg(test)]
thread_local! {
    /// Slow lookups this thread made (tests count cache misses with it).
    static LOOKUPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Looks a range up the slow way and caches it.
fn learn(span: (usize, usize), what: &str) -> Result<Placement> {
    #[cfg(test)]
    LOOKUPS.with(|n| n.set(n.get() + 1));
    let e = lookup(span.0, span.1, what)?;
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let i = c.next;
        c.entries[i] = e;
        c.last = [i; 2];
        c.next = (i + 1) % SLOTS;
    });
    Ok(e.placement)
}

/// The placement of a call from its two buffers: the non-empty ones must
/// agree on host versus CUDA memory. Inlined, so that the common answer
/// (each buffer in the range its side hit last) comes back in a register
/// rather than through a returned `Result` in memory, which the caller
/// would read back before the callee's stores reached it.
#[inline(always)]
pub fn classify_call(
    send: *const c_void,
    send_bytes: usize,
    recv: *const c_void,
    recv_bytes: usize,
) -> Result<Placement> {
    let ss = span(send, send_bytes, "sendbuff")?;
    let rs = span(recv, recv_bytes, "recvbuff")?;
    let generation = GENERATION.load(Ordering::Acquire);
    match CACHE.with(|c| c.borrow().last_hits(generation, ss, rs)) {
        Some(p) => Ok(p),
        None => classify_miss(generation, ss, rs),
    }
}

/// [`classify_call`] past the last hits: the rest of the cache, then the
/// slow lookups.
#[inline(never)]
fn classify_miss(
    generation: u64,
    ss: Option<(usize, usize)>,
    rs: Option<(usize, usize)>,
) -> Result<Placement> {
    let (sh, rh) = CACHE.with(|c| c.borrow_mut().find(generation, ss, rs));
    let s = match (ss, sh) {
        (Some(sp), None) => Some(learn(sp, "sendbuff")?),
        (span, p) => span.and(p),
    };
    let r = match (rs, rh) {
        (Some(sp), None) => Some(learn(sp, "recvbuff")?),
        (span, p) => span.and(p),
    };
    agree(s, r).ok_or_else(|| mixed(s, r))
}

#[cold]
#[inline(never)]
fn mixed(s: Option<Placement>, r: Option<Placement>) -> Error {
    let (s, r) = (s.unwrap_or(Placement::Host), r.unwrap_or(Placement::Host));
    Error::usage(format!(
        "sendbuff is {s:?} memory but recvbuff is {r:?} memory; \
         a call's buffers must be both host memory or both CUDA memory"
    ))
}

/// The slow path: CUDA first (when loaded), then the host mappings.
fn lookup(start: usize, end: usize, what: &str) -> Result<Entry> {
    if driver::available() {
        if let Some(e) = cuda_lookup(start)? {
            if end <= e.end {
                return Ok(e);
            }
            return Err(Error::arg(format!(
                "{what} {start:#x} + {} bytes runs past the end of its CUDA allocation \
                 ({:#x}..{:#x})",
                end - start,
                e.start,
                e.end
            )));
        }
    }
    // A buffer from this library's host `ncclMemAlloc` is cached as its
    // whole allocation, so that calls on successive windows of one large
    // buffer (as nccl-tests and hetccl-perf run them) keep hitting one
    // entry instead of evicting each other with a `mincore` per call.
    if let Some(r) = crate::intranode::region::find(start, end - start) {
        return Ok(Entry {
            start: r.base,
            end: r.base + r.len,
            placement: Placement::Host,
        });
    }
    let page = page_size();
    let lo = start & !(page - 1);
    let hi = end.div_ceil(page) * page;
    if host_mapped(lo, hi) {
        return Ok(Entry {
            start: lo,
            end: hi,
            placement: Placement::Host,
        });
    }
    let bytes = end - start;
    if driver::available() {
        Err(Error::arg(format!(
            "{what} {start:#x} ({bytes} bytes) is neither mapped in this process \
             nor memory the CUDA driver knows"
        )))
    } else {
        Err(Error::arg(format!(
            "{what} {start:#x} ({bytes} bytes) is not mapped in this process's host \
             address space; if it is a device buffer: device buffers need the CUDA \
             driver (libcuda.so.1), which was not found ({})",
            driver::unavailable_reason()
        )))
    }
}

/// What CUDA knows of the allocation holding `ptr` (None: not CUDA memory).
fn cuda_lookup(ptr: usize) -> Result<Option<Entry>> {
    use cu::CUpointer_attribute as A;
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    // Each slot is zeroed and 8 bytes wide; the driver writes 4 or 8 bytes
    // (little-endian), so the low bytes hold the value either way.
    let mut vals = [0u64; 5];
    let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    // SAFETY: five attributes, five writable 8-byte slots. Unlike
    // cuPointerGetAttribute this call succeeds for non-CUDA pointers and
    // leaves the values zero.
    let r = unsafe {
        cu::cuPointerGetAttributes(
            attrs.len() as u32,
            attrs.as_mut_ptr(),
            ptrs.as_mut_ptr(),
            ptr as cu::CUdeviceptr,
        )
    };
    if r == cu::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    driver::check(r, "cuPointerGetAttributes")?;
    let mem_type = vals[0] as u32;
    let managed = vals[1] as u32 != 0;
    let device = vals[2] as u32 as i32;
    let (start, size) = (vals[3] as usize, vals[4] as usize);
    let placement = if managed {
        Placement::Managed(device)
    } else if mem_type == cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        Placement::Device(device)
    } else if mem_type == cu::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        Placement::PinnedHost
    } else {
        return Ok(None);
    };
    let (start, end) = if size > 0 && start <= ptr {
        (start, start + size)
    } else {
        (ptr, ptr + 1)
    };
    Ok(Some(Entry {
        start,
        end,
        placement,
    }))
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Whether every page of `[lo, hi)` (page-aligned) is mapped: `mincore`
/// fails with ENOMEM on any unmapped page.
fn host_mapped(lo: usize, hi: usize) -> bool {
    const CHUNK_PAGES: usize = 16384;
    let page = page_size();
    let mut vec = [0u8; CHUNK_PAGES];
    let mut at = lo;
    while at < hi {
        let n = ((hi - at) / page).min(CHUNK_PAGES);
        // SAFETY: `at` is page-aligned and `vec` holds one byte per page of
        // the n-page range; mincore only reports, it never touches the pages.
        let r = unsafe { libc::mincore(at as *mut c_void, n * page, vec.as_mut_ptr()) };
        if r != 0 {
            return false;
        }
        at += n * page;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_are_host_and_cached() {
        let v = vec![0u8; 100_000];
        let p = v.as_ptr().cast();
        assert_eq!(classify(p, v.len(), "b").unwrap(), Placement::Host);
        assert_eq!(classify(p, 10, "b").unwrap(), Placement::Host);
        let x = 5u64;
        assert_eq!(
            classify((&x as *const u64).cast(), 8, "b").unwrap(),
            Placement::Host
        );
        assert_eq!(classify(std::ptr::null(), 8, "b").unwrap(), Placement::Host);
        forget_all();
        assert_eq!(classify(p, v.len(), "b").unwrap(), Placement::Host);
    }

    #[test]
    fn windows_of_one_allocation_share_one_entry() {
        let len = 1 << 20;
        let p = crate::intranode::region::alloc(len).unwrap();
        let at = |k: usize| (p as usize + k * (16 << 10)) as *const c_void;
        let before = LOOKUPS.with(|n| n.get());
        let gen = GENERATION.load(Ordering::Acquire);
        // 64 windows of 16 KiB, send and receive from the two halves, twice
        // over: more distinct ranges than the cache has slots.
        for _ in 0..2 {
            for k in 0..32 {
                assert_eq!(
                    classify_call(at(k), 16 << 10, at(k + 32), 16 << 10).unwrap(),
                    Placement::Host
                );
            }
        }
        let lookups = LOOKUPS.with(|n| n.get()) - before;
        // One per buffer on the first call. Other tests' frees clear every
        // thread's cache: each costs the two buffers a lookup again.
        let cleared = GENERATION.load(Ordering::Acquire) - gen;
        assert!(
            lookups <= 2 + 2 * cleared,
            "{lookups} slow lookups for windows of one allocation"
        );
        // Past the allocation's end is not vouched for by it.
        let tail = (p as usize + len - 8) as *const c_void;
        let _ = classify(tail, 16, "b");
        assert!(LOOKUPS.with(|n| n.get()) - before > lookups);
        // SAFETY: allocated above, not used afterwards.
        unsafe { crate::intranode::region::free(p).unwrap() };
        forget_all();
    }

    #[test]
    fn last_ranges_answer_until_memory_is_freed() {
        let v = vec![0u8; 8192];
        let at = |k: usize| v[k * 64..].as_ptr().cast::<c_void>();
        let null = std::ptr::null();
        // One side's buffer (0 send, 1 receive), the other side empty.
        let one = |side: usize, p: *const c_void, len: usize| {
            if side == 0 {
                classify_call(p, len, null, 0)
            } else {
                classify_call(null, 0, p, len)
            }
        };
        let lookups = || LOOKUPS.with(|n| n.get());
        let gen = GENERATION.load(Ordering::Acquire);
        let before = lookups();
        // Each side first names the whole buffer (its pages become one
        // range), then windows inside it.
        for side in 0..2 {
            let p = v.as_ptr().cast::<c_void>();
            assert_eq!(one(side, p, v.len()).unwrap(), Placement::Host);
        }
        for k in 0..64 {
            assert_eq!(one(k % 2, at(k), 64).unwrap(), Placement::Host);
        }
        // At most the first call of each side looks the range up (again
        // after another test's free).
        let cleared = GENERATION.load(Ordering::Acquire) - gen;
        assert!(
            lookups() - before <= 2 + 2 * cleared,
            "{}",
            lookups() - before
        );
        // A bad pointer is checked, whatever the other side holds.
        let bad = 0x2000 as *const c_void;
        assert!(one(1, bad, 8).is_err());
        // After a free the last range no longer answers: the call asks the
        // slow way again.
        assert_eq!(one(0, at(1), 64).unwrap(), Placement::Host);
        forget_all();
        let before = lookups();
        assert_eq!(one(0, at(2), 64).unwrap(), Placement::Host);
        assert_eq!(lookups() - before, 1, "a stale last range answered");
    }

    #[test]
    fn unmapped_pointer_is_refused_with_a_message() {
        // Below mmap_min_addr (64 KiB on Linux): never mapped.
        let p = 0x2000 as *const c_void;
        let e = classify(p, 4096, "sendbuff").unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(msg.contains("sendbuff"), "{msg}");
        if !driver::available() {
            assert!(msg.contains("need the CUDA driver"), "{msg}");
        }
    }

    #[test]
    fn a_cached_buffer_does_not_vouch_for_the_other() {
        let v = vec![0u8; 4096];
        let p: *const c_void = v.as_ptr().cast();
        assert_eq!(classify_call(p, 4096, p, 4096).unwrap(), Placement::Host);
        // The send range is cached now; the receive range is still checked.
        let bad = 0x2000 as *const c_void;
        let e = classify_call(p, 4096, bad, 8).unwrap_err();
        assert!(e.to_string().contains("recvbuff"), "{e}");
        // A range running past the cached one is not a hit either.
        let e = classify_call(p, usize::MAX - p as usize + 1, p, 8).unwrap_err();
        assert!(e.to_string().contains("sendbuff"), "{e}");
    }

    #[test]
    fn mixed_placements_need_both_used() {
        let v = [0u8; 64];
        let p: *const c_void = v.as_ptr().cast();
        assert_eq!(
            classify_call(p, 64, std::ptr::null(), 0).unwrap(),
            Placement::Host
        );
        assert!(!Placement::Host.is_device());
        assert!(Placement::Device(0).is_device());
        assert_eq!(Placement::Managed(3).device(), Some(3));
    }
}
