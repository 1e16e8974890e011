//! Memory registrations and the bounded registration cache of a protection
//! domain, keyed by address range.
//!
//! A range is registered once, page-aligned; later registrations of any
//! part of it share the entry. The cache holds at most
//! [`CACHE_ENTRIES`] entries: when full, the least recently used entry
//! that no comm or handle holds is dropped (its MR is deregistered once
//! the last holder lets go). [`RegCache::invalidate`] drops every entry
//! that overlaps a range, for memory being freed or unmapped.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::Arc;

use super::ffi::{self, ibv_mr, ibv_pd};
use crate::error::{NetError, Result};

/// Most entries per protection domain.
pub const CACHE_ENTRIES: usize = 256;

/// One registered range; deregistered on drop.
#[derive(Debug)]
pub struct Mr {
    mr: *mut ibv_mr,
    /// Start of the registered range.
    pub addr: usize,
    /// Its length.
    pub len: usize,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

// SAFETY: an MR handle is usable from any thread; it is only passed to
// libibverbs.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `addr..addr+len` with `access`.
    ///
    /// # Safety
    /// The range is mapped memory of this process (or the caller accepts a
    /// registration failure).
    pub unsafe fn register(
        pd: *mut ibv_pd,
        addr: usize,
        len: usize,
        access: c_int,
    ) -> Result<Self> {
        let v = ffi::verbs().map_err(|e| NetError::System(e.into()))?;
        // SAFETY: a live PD; the kernel checks the range.
        let mr = unsafe { (v.reg_mr)(pd, addr as *mut _, len, access) };
        Self::wrap(mr, addr, len, "ibv_reg_mr")
    }

    /// Registers `len` bytes at `offset` of the DMA-BUF `fd` at virtual
    /// address `iova` (`ibv_reg_dmabuf_mr`).
    ///
    /// # Safety
    /// `pd` is a live protection domain.
    pub unsafe fn register_dmabuf(
        pd: *mut ibv_pd,
        offset: u64,
        len: usize,
        iova: u64,
        fd: c_int,
        access: c_int,
    ) -> Result<Self> {
        let v = ffi::verbs().map_err(|e| NetError::System(e.into()))?;
        let f = v.reg_dmabuf_mr.ok_or_else(|| {
            NetError::System("libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)".into())
        })?;
        // SAFETY: a live PD; the kernel checks the fd and range.
        let mr = unsafe { f(pd, offset, len, iova, fd, access) };
        Self::wrap(mr, iova as usize, len, "ibv_reg_dmabuf_mr")
    }

    fn wrap(mr: *mut ibv_mr, addr: usize, len: usize, what: &str) -> Result<Self> {
        if mr.is_null() {
            return Err(NetError::System(format!(
                "{what} of {len} bytes at {addr:#x}: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: a live MR just returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Self {
            mr,
            addr,
            len,
            lkey,
            rkey,
        })
    }

    /// Whether `addr..addr+len` lies inside.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr && addr.saturating_add(len) <= self.addr + self.len
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Ok(v) = ffi::verbs() {
            // SAFETY: registered by us, dropped once.
            unsafe { (v.dereg_mr)(self.mr) };
        }
    }
}

/// The access every registration gets.
pub fn access(relaxed: bool) -> c_int {
    let a =
        ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ;
    if relaxed {
        a | ffi::IBV_ACCESS_RELAXED_ORDERING
    } else {
        a
    }
}

struct Entry {
    mr: Arc<Mr>,
    used: u64,
}

/// The cache (one per protection domain).
pub struct RegCache {
    by_start: BTreeMap<usize, Entry>,
    max: usize,
    clock: u64,
    /// Registrations made (for tests and logs).
    pub registered: u64,
}

const PAGE: usize = 4096;

impl RegCache {
    /// An empty cache of at most `max` entries.
    pub fn new(max: usize) -> Self {
        Self {
            by_start: BTreeMap::new(),
            max: max.max(1),
            clock: 0,
            registered: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// The registration covering `addr..addr+len`, made if needed.
    ///
    /// # Safety
    /// The range is mapped memory of this process.
    pub unsafe fn get(
        &mut self,
        pd: *mut ibv_pd,
        addr: usize,
        len: usize,
        relaxed: bool,
    ) -> Result<Arc<Mr>> {
        self.clock += 1;
        let len = len.max(1);
        if let Some((_, e)) = self.by_start.range_mut(..=addr).next_back() {
            if e.mr.covers(addr, len) {
                e.used = self.clock;
                return Ok(e.mr.clone());
            }
        }
        let start = addr & !(PAGE - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_add(PAGE - 1))
            .ok_or_else(|| NetError::InvalidArgument(format!("range {addr:#x}+{len}")))?
            & !(PAGE - 1);
        // Entries inside the new range are superseded by it.
        self.drop_overlapping(start, end);
        // SAFETY: forwarded contract (the page-rounded range is mapped too).
        let mr = Arc::new(unsafe { Mr::register(pd, start, end - start, access(relaxed))? });
        self.registered += 1;
        while self.by_start.len() >= self.max {
            if !self.evict_one() {
                break;
            }
        }
        self.by_start.insert(
            start,
            Entry {
                mr: mr.clone(),
                used: self.clock,
            },
        );
        Ok(mr)
    }

    /// Adds a registration made outside the cache (a DMA-BUF one, whose
    /// fd the cache cannot obtain), replacing the entries it overlaps.
    pub fn insert(&mut self, mr: Arc<Mr>) {
        self.clock += 1;
        self.drop_overlapping(mr.addr, mr.addr.saturating_add(mr.len));
        self.registered += 1;
        while self.by_start.len() >= self.max {
            if !self.evict_one() {
                break;
            }
        }
        self.by_start.insert(
            mr.addr,
            Entry {
                mr,
                used: self.clock,
            },
        );
    }

    fn drop_overlapping(&mut self, start: usize, end: usize) -> usize {
        let hit: Vec<usize> = self
            .by_start
            .iter()
            .filter(|(_, e)| e.mr.addr < end && e.mr.addr + e.mr.len > start)
            .map(|(&k, _)| k)
            .collect();
        for k in &hit {
            self.by_start.remove(k);
        }
        hit.len()
    }

    /// Drops the least recently used entry nobody holds; false if none.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .by_start
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.mr) == 1)
            .min_by_key(|(_, e)| e.used)
            .map(|(&k, _)| k)
            .or_else(|| {
                self.by_start
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(&k, _)| k)
            });
        victim.is_some_and(|k| self.by_start.remove(&k).is_some())
    }

    /// The cached registration covering `addr..addr+len`, if any (never
    /// registers).
    pub fn find(&self, addr: usize, len: usize) -> Option<Arc<Mr>> {
        let (_, e) = self.by_start.range(..=addr).next_back()?;
        e.mr.covers(addr, len.max(1)).then(|| e.mr.clone())
    }

    /// Drops every entry overlapping `addr..addr+len` (memory freed or
    /// unmapped); returns how many.
    pub fn invalidate(&mut self, addr: usize, len: usize) -> usize {
        self.drop_overlapping(addr, addr.saturating_add(len.max(1)))
    }
}
