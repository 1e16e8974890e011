//! Memory registrations and the bounded registration cache of a protection
//! domain, keyed by address range.
//!
//! A range is registered once, page-aligned; later registrations of any
//! part of it share the entry. The cache holds at most
//! [`CACHE_ENTRIES`] entries that nobody else holds: when full, the least
//! recently used entry that no comm, handle or operation holds is dropped
//! (its MR is deregistered); held entries are never evicted, so a range
//! in use stays findable while its holder lives. [`RegCache::invalidate`] drops every entry
//! that overlaps a range, for memory being freed; ranges the process
//! unmapped ([`super::unmap`]) are dropped the same way at the next lookup.
//! A dropped entry that a comm or handle still holds stays registered for
//! that holder but is never handed out again.
//!
//! The cache is generic over what a registration is ([`Registration`]),
//! so that its logic is tested without a device.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::ffi::{self, ibv_mr, ibv_pd};
use super::unmap::{self, Since};
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
    /// Whether the range is GPU memory (set by [`Mr::mark_device`]): the
    /// CPU must never read or write it.
    device: AtomicBool,
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
            device: AtomicBool::new(false),
        })
    }

    /// Marks the range as GPU memory: transfers from or into it go by RDMA
    /// only, never through a CPU copy (eager slots, inline data, bounce
    /// chunks).
    pub fn mark_device(&self) {
        self.device.store(true, Ordering::Relaxed);
    }

    /// Whether the range is GPU memory ([`Mr::mark_device`]).
    pub fn is_device(&self) -> bool {
        self.device.load(Ordering::Relaxed)
    }

    /// Whether `addr..addr+len` lies inside.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr && addr.saturating_add(len) <= self.addr + self.len
    }
}

/// A registered range, as the cache sees it.
pub trait Registration {
    /// Start and length of the registered range.
    fn range(&self) -> (usize, usize);
}

impl Registration for Mr {
    fn range(&self) -> (usize, usize) {
        (self.addr, self.len)
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

struct Entry<T> {
    reg: Arc<T>,
    used: u64,
}

fn covers((a, l): (usize, usize), addr: usize, len: usize) -> bool {
    addr >= a && addr.saturating_add(len) <= a + l
}

/// The cache (one per protection domain).
pub struct RegCache<T = Mr> {
    by_start: BTreeMap<usize, Entry<T>>,
    max: usize,
    clock: u64,
    unmapped: unmap::Reader,
    /// Registrations made (for tests and logs).
    pub registered: u64,
    /// Entries dropped because their memory was unmapped.
    pub dropped_unmapped: u64,
}

const PAGE: usize = 4096;

impl RegCache<Mr> {
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
        self.get_with(addr, len, |start, n| {
            // SAFETY: forwarded contract (the page-rounded range is mapped too).
            unsafe { Mr::register(pd, start, n, access(relaxed)) }
        })
    }
}

impl<T: Registration> RegCache<T> {
    /// An empty cache of at most `max` entries.
    pub fn new(max: usize) -> Self {
        Self {
            by_start: BTreeMap::new(),
            max: max.max(1),
            clock: 0,
            unmapped: unmap::Reader::new(),
            registered: 0,
            dropped_unmapped: 0,
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

    /// Drops the entries whose memory was unmapped since the last look
    /// (all of them if the ring overflowed).
    fn sync_unmapped(&mut self) {
        if !self.unmapped.behind() {
            return;
        }
        match self.unmapped.since() {
            Since::Ranges(v) => {
                for (start, end) in v {
                    self.dropped_unmapped += self.drop_overlapping(start, end) as u64;
                }
            }
            Since::Lost => {
                self.dropped_unmapped += self.by_start.len() as u64;
                self.by_start.clear();
            }
        }
    }

    /// The registration covering `addr..addr+len`; when none is cached,
    /// `register(start, len)` registers the page-rounded range.
    pub fn get_with(
        &mut self,
        addr: usize,
        len: usize,
        register: impl FnOnce(usize, usize) -> Result<T>,
    ) -> Result<Arc<T>> {
        self.sync_unmapped();
        self.clock += 1;
        let len = len.max(1);
        if let Some((_, e)) = self.by_start.range_mut(..=addr).next_back() {
            if covers(e.reg.range(), addr, len) {
                e.used = self.clock;
                return Ok(e.reg.clone());
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
        let reg = Arc::new(register(start, end - start)?);
        self.store(start, reg.clone());
        Ok(reg)
    }

    /// Adds a registration made outside the cache (a DMA-BUF one, whose
    /// fd the cache cannot obtain), replacing the entries it overlaps.
    pub fn insert(&mut self, reg: Arc<T>) {
        self.sync_unmapped();
        self.clock += 1;
        let (start, len) = reg.range();
        self.drop_overlapping(start, start.saturating_add(len));
        self.store(start, reg);
    }

    /// Counts a new registration and keeps it at `start`, evicting the
    /// least recently used unheld entries while the cache is full.
    fn store(&mut self, start: usize, reg: Arc<T>) {
        self.registered += 1;
        while self.by_start.len() >= self.max {
            if !self.evict_one() {
                break;
            }
        }
        let used = self.clock;
        self.by_start.insert(start, Entry { reg, used });
    }

    fn drop_overlapping(&mut self, start: usize, end: usize) -> usize {
        let hit: Vec<usize> = self
            .by_start
            .range(..end)
            .filter(|(_, e)| {
                let (a, l) = e.reg.range();
                a < end && a + l > start
            })
            .map(|(&k, _)| k)
            .collect();
        for k in &hit {
            self.by_start.remove(k);
        }
        hit.len()
    }

    /// Drops the least recently used entry nobody holds; false if none.
    /// A held entry stays: dropping it would not deregister its memory,
    /// only hide it from the links that look up the range it covers.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .by_start
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.reg) == 1)
            .min_by_key(|(_, e)| e.used)
            .map(|(&k, _)| k);
        victim.is_some_and(|k| self.by_start.remove(&k).is_some())
    }

    /// The cached registration covering `addr..addr+len`, if any (never
    /// registers).
    pub fn find(&mut self, addr: usize, len: usize) -> Option<Arc<T>> {
        self.sync_unmapped();
        let (_, e) = self.by_start.range(..=addr).next_back()?;
        covers(e.reg.range(), addr, len.max(1)).then(|| e.reg.clone())
    }

    /// Drops every entry overlapping `addr..addr+len` (memory freed or
    /// unmapped); returns how many.
    pub fn invalidate(&mut self, addr: usize, len: usize) -> usize {
        self.sync_unmapped();
        self.drop_overlapping(addr, addr.saturating_add(len.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A registration without a device.
    struct Fake(usize, usize);
    impl Registration for Fake {
        fn range(&self) -> (usize, usize) {
            (self.0, self.1)
        }
    }

    fn reg(count: &Cell<u32>) -> impl FnOnce(usize, usize) -> Result<Fake> + '_ {
        move |a, l| {
            count.set(count.get() + 1);
            Ok(Fake(a, l))
        }
    }

    /// `pages` anonymous pages (munmap'd by the test).
    fn map(pages: usize) -> usize {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    /// munmap and record, as the exported hook does.
    fn unmap_range(addr: usize, len: usize) {
        // SAFETY: a mapping of this test.
        assert_eq!(unsafe { libc::munmap(addr as *mut _, len) }, 0);
        unmap::record(addr, len);
    }

    #[test]
    fn an_unmapped_range_leaves_the_cache() {
        let _g = unmap::TEST_LOCK.lock();
        let n = Cell::new(0);
        let mut c: RegCache<Fake> = RegCache::new(16);
        let a = map(4);
        let b = map(2);
        let ra = c.get_with(a + 100, 3 * PAGE, reg(&n)).unwrap();
        assert_eq!(ra.range(), (a, 4 * PAGE), "page-rounded");
        c.get_with(b, 2 * PAGE, reg(&n)).unwrap();
        drop(ra);
        assert!(c.find(a + PAGE, 10).is_some());
        // Unmapping the middle of a's range drops a's entry, not b's.
        unmap_range(a + PAGE, PAGE);
        assert!(c.find(a, 10).is_none(), "stale entry still found");
        assert!(c.find(b, 10).is_some());
        assert_eq!(c.len(), 1);
        assert_eq!(c.dropped_unmapped, 1);
        // A new registration of the (remapped) range registers again.
        let before = n.get();
        let a2 = map(1);
        c.get_with(a2, PAGE, reg(&n)).unwrap();
        assert_eq!(n.get(), before + 1);
        unmap_range(a2, PAGE);
        unmap_range(a, PAGE);
        unmap_range(a + 2 * PAGE, 2 * PAGE);
        unmap_range(b, 2 * PAGE);
        assert!(c.find(b, 1).is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn a_held_entry_is_not_handed_out_after_unmap() {
        let _g = unmap::TEST_LOCK.lock();
        let n = Cell::new(0);
        let mut c: RegCache<Fake> = RegCache::new(16);
        let a = map(1);
        let held = c.get_with(a, PAGE, reg(&n)).unwrap();
        unmap_range(a, PAGE);
        // The holder keeps its registration; the cache makes a new one.
        let again = c.get_with(a, PAGE, reg(&n)).unwrap();
        assert!(!Arc::ptr_eq(&held, &again));
        assert_eq!(n.get(), 2);
        assert_eq!(held.range(), (a, PAGE));
    }

    #[test]
    fn a_lost_record_drops_everything() {
        let _g = unmap::TEST_LOCK.lock();
        let n = Cell::new(0);
        let mut c: RegCache<Fake> = RegCache::new(16);
        for i in 0..3 {
            c.get_with(0x10_0000 + i * 2 * PAGE, PAGE, reg(&n)).unwrap();
        }
        // Ranges elsewhere, more than the ring holds.
        for i in 0..unmap::SLOTS + 1 {
            unmap::record(0x7f00_0000_0000 + i * PAGE, PAGE);
        }
        assert!(c.find(0x10_0000, 1).is_none());
        assert!(c.is_empty());
        assert_eq!(c.dropped_unmapped, 3);
    }

    #[test]
    fn the_cache_is_bounded_and_shares_ranges() {
        let n = Cell::new(0);
        let mut c: RegCache<Fake> = RegCache::new(2);
        let at = |i: usize| 0x20_0000 + i * 16 * PAGE;
        let a = c.get_with(at(0), 16 * PAGE, reg(&n)).unwrap();
        let a2 = c.get_with(at(0) + PAGE, 1000, reg(&n)).unwrap();
        assert!(Arc::ptr_eq(&a, &a2), "a sub-range shares the entry");
        c.get_with(at(1), 100, reg(&n)).unwrap();
        // a is held: the unheld b goes first.
        c.get_with(at(2), 100, reg(&n)).unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.find(at(0), 1).is_some());
        assert!(c.find(at(1), 1).is_none());
        assert_eq!(n.get(), 3);
        // A larger range supersedes the entries inside it.
        c.get_with(at(0), 48 * PAGE, reg(&n)).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.invalidate(at(2), 1), 1);
        assert!(c.is_empty());
    }

    #[test]
    fn held_entries_are_never_evicted() {
        let n = Cell::new(0);
        let mut c: RegCache<Fake> = RegCache::new(2);
        let at = |i: usize| 0x40_0000 + i * 16 * PAGE;
        let a = c.get_with(at(0), 100, reg(&n)).unwrap();
        let b = c.get_with(at(1), 100, reg(&n)).unwrap();
        // Both held: the third entry goes past the bound, none is dropped.
        let third = c.get_with(at(2), 100, reg(&n)).unwrap();
        assert_eq!(c.len(), 3);
        assert!(Arc::ptr_eq(&c.find(at(0), 1).unwrap(), &a));
        assert!(Arc::ptr_eq(&c.find(at(1), 1).unwrap(), &b));
        // Released, the least recently used goes at the next insertion.
        drop((a, b, third));
        c.get_with(at(3), 100, reg(&n)).unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.find(at(0), 1).is_none());
    }
}
