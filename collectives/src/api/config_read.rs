//! Reading the versioned, size-headed config structs that arrive from C.
//!
//! A caller built against an older `nccl.h` passes a shorter `ncclConfig_t`
//! (e.g. PyTorch built against 2.21); a newer one may pass a longer struct.
//! The `size` field says how many bytes are really there, and only fields that
//! lie entirely inside it are read. Garbage (a NULL-free pointer to random
//! bytes) is rejected by the magic, version and size checks.

use std::ffi::{c_char, CStr};
use std::mem::{offset_of, size_of};

use std::sync::atomic::{AtomicBool, Ordering};

use hetccl_abi::{ncclCollConfig_t, ncclConfig_t, NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT};

use crate::algo::AlgoFilter;
pub use crate::comm::config::{CollConfig, CommConfig};
use crate::error::{Error, Result};

/// Header fields (`size`, `magic`, `version`) occupy the first 16 bytes.
const HEADER: usize = 16;
/// The largest `size` accepted: anything larger is not a config struct.
const MAX_SIZE: usize = 64 * 1024;
/// The oldest header version accepted: 2.14, which introduced ncclConfig_t.
const MIN_VERSION: u32 = 21400;
/// The longest string field read (netName, commName).
const MAX_STR: usize = 4096;

/// Checks the header of a size-headed struct whose full current size is `full`.
///
/// # Safety
/// `p` must point to at least [`HEADER`] readable bytes.
unsafe fn check_header(p: *const u8, magic: u32, what: &str) -> Result<usize> {
    // SAFETY: the caller guarantees the header is readable; unaligned reads.
    let (size, m, version) = unsafe {
        (
            std::ptr::read_unaligned(p as *const usize),
            std::ptr::read_unaligned(p.add(8) as *const u32),
            std::ptr::read_unaligned(p.add(12) as *const u32),
        )
    };
    if m != magic {
        return Err(Error::arg(format!("{what}: bad magic {m:#x} (expected {magic:#x}); was it initialised with its INITIALIZER?")));
    }
    if !(HEADER..=MAX_SIZE).contains(&size) || size % 8 != 0 {
        return Err(Error::arg(format!("{what}: implausible size {size}")));
    }
    if !(MIN_VERSION..100_000).contains(&version) {
        return Err(Error::arg(format!("{what}: implausible version {version}")));
    }
    Ok(size)
}

/// Reads an `i32` field at `off` if it lies inside `size`, else `None`.
///
/// # Safety
/// `p` must point to `size` readable bytes.
unsafe fn int_field(p: *const u8, size: usize, off: usize) -> Option<i32> {
    // SAFETY: bounds checked against the caller-declared size.
    (off + 4 <= size).then(|| unsafe { std::ptr::read_unaligned(p.add(off) as *const i32) })
}

/// Reads a `const char*` field and the string it points to, if set.
///
/// # Safety
/// `p` must point to `size` readable bytes; a non-NULL string pointer must
/// point to a NUL-terminated string.
unsafe fn str_field(p: *const u8, size: usize, off: usize, what: &str) -> Result<Option<String>> {
    if off + size_of::<usize>() > size {
        return Ok(None);
    }
    // SAFETY: bounds checked against the caller-declared size.
    let s = unsafe { std::ptr::read_unaligned(p.add(off) as *const *const c_char) };
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller promises a NUL-terminated string; strnlen bounds the scan.
    let len = unsafe { libc::strnlen(s, MAX_STR) };
    if len == MAX_STR {
        return Err(Error::arg(format!("{what} is longer than {MAX_STR} bytes")));
    }
    // SAFETY: NUL found within MAX_STR bytes.
    let c = unsafe { CStr::from_ptr(s) };
    Ok(Some(c.to_string_lossy().into_owned()))
}

/// Reads an `ncclConfig_t` of any supported layout; NULL means defaults.
///
/// # Safety
/// A non-NULL `p` must point to a struct whose `size` field is truthful.
pub unsafe fn read_comm_config(p: *const ncclConfig_t) -> Result<CommConfig> {
    let mut c = CommConfig::default();
    if p.is_null() {
        return Ok(c);
    }
    let b = p as *const u8;
    // SAFETY: per this function's contract.
    let size = unsafe { check_header(b, NCCL_API_MAGIC, "config")? };
    // SAFETY: read above.
    c.header_version = unsafe { std::ptr::read_unaligned(b.add(12) as *const u32) };
    // SAFETY: the field is read only where it lies inside the caller-declared `size`; per this
    // function's contract.
    match unsafe { int_field(b, size, offset_of!(ncclConfig_t, blocking)) } {
        None | Some(NCCL_CONFIG_UNDEF_INT) | Some(1) => {}
        Some(0) => c.blocking = false,
        Some(v) => {
            return Err(Error::arg(format!(
                "config.blocking must be 0 or 1, not {v}"
            )))
        }
    }
    c.net_name =
        // SAFETY: the field is read only where it lies inside the caller-declared `size`; per
        // this function's contract.
        unsafe { str_field(b, size, offset_of!(ncclConfig_t, netName), "config.netName")? };
    // SAFETY: the field is read only where it lies inside the caller-declared
    // `size`; per this function's contract.
    c.comm_name = unsafe {
        str_field(
            b,
            size,
            offset_of!(ncclConfig_t, commName),
            "config.commName",
        )?
    };
    // SAFETY: the field is read only where it lies inside the caller-declared `size`; per this
    // function's contract.
    match unsafe { int_field(b, size, offset_of!(ncclConfig_t, splitShare)) } {
        None | Some(NCCL_CONFIG_UNDEF_INT) | Some(0) => {}
        Some(1) => c.split_share = true,
        Some(v) => {
            return Err(Error::arg(format!(
                "config.splitShare must be 0 or 1, not {v}"
            )))
        }
    }
    // SAFETY: the field is read only where it lies inside the caller-declared `size`; per this
    // function's contract.
    c.traffic_class = unsafe { int_field(b, size, offset_of!(ncclConfig_t, trafficClass)) }
        .filter(|&v| v != NCCL_CONFIG_UNDEF_INT);
    warn_ignored_comm_fields(&c);
    Ok(c)
}

/// Logs `msg` at WARN the first time `flag` is seen unset.
fn warn_once(flag: &AtomicBool, msg: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!(target: "hetccl::ENV", "{}", msg());
    }
}

/// One WARN per process for each `ncclConfig_t` field hetccl ignores that
/// a caller set (`commName` and `blocking` are honoured).
fn warn_ignored_comm_fields(c: &CommConfig) {
    static NET: AtomicBool = AtomicBool::new(false);
    static SHARE: AtomicBool = AtomicBool::new(false);
    static TC: AtomicBool = AtomicBool::new(false);
    if let Some(n) = &c.net_name {
        warn_once(&NET, || {
            format!(
                "config.netName={n:?} is ignored by hetccl: its engine has one transport between                  nodes (TCP)"
            )
        });
    }
    if c.split_share {
        warn_once(&SHARE, || {
            "config.splitShare=1 is ignored by hetccl: a split communicator always gets links              of its own"
                .into()
        });
    }
    if let Some(t) = c.traffic_class {
        warn_once(&TC, || {
            format!(
                "config.trafficClass={t} is ignored by hetccl: it sets an InfiniBand traffic                  class, and hetccl has no verbs transport yet"
            )
        });
    }
}

/// Reads an `ncclCollConfig_t`; NULL means defaults.
///
/// # Safety
/// A non-NULL `p` must point to a struct whose `size` field is truthful.
pub unsafe fn read_coll_config(p: *const ncclCollConfig_t) -> Result<CollConfig> {
    let mut c = CollConfig::default();
    if p.is_null() {
        return Ok(c);
    }
    let b = p as *const u8;
    // SAFETY: per this function's contract.
    let size = unsafe { check_header(b, NCCL_API_MAGIC, "collective config")? };
    // SAFETY: the field is read only where it lies inside `size`.
    c.alg_selection = unsafe {
        str_field(
            b,
            size,
            offset_of!(ncclCollConfig_t, algSelection),
            "config.algSelection",
        )?
    }
    .filter(|s| !s.is_empty());
    let off = offset_of!(ncclCollConfig_t, userProfilerTag);
    if off + 8 <= size {
        // SAFETY: bounded by size.
        c.profiler_tag = unsafe { std::ptr::read_unaligned(b.add(off) as *const u64) };
    }
    static TAG: AtomicBool = AtomicBool::new(false);
    if c.profiler_tag != 0 {
        warn_once(&TAG, || {
            "ncclCollConfig_t.userProfilerTag is ignored by hetccl: it has no profiler plugin yet"
                .into()
        });
    }
    Ok(c)
}

/// The call's own algorithm restriction from `algSelection` (NCCL_ALGO
/// syntax), honoured where it names algorithms hetccl has; one WARN per
/// process, and no restriction, when it names none.
pub fn coll_filter(c: &CollConfig) -> Option<AlgoFilter> {
    static BAD: AtomicBool = AtomicBool::new(false);
    let text = c.alg_selection.as_deref()?;
    match AlgoFilter::parse(text) {
        Ok(f) => Some(f),
        Err(e) => {
            warn_once(&BAD, || {
                format!(
                    "ncclCollConfig_t.algSelection={text:?} is ignored by hetccl: {e} \
                     (hetccl's algorithms: Ring, Tree, Direct, HalvingDoubling, Hierarchical, \
                     Pairwise, and NCCL's names for them)"
                )
            });
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_current_layout() {
        assert_eq!(
            // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
            unsafe { read_comm_config(std::ptr::null()) }.unwrap(),
            CommConfig::default()
        );
        let cfg = ncclConfig_t {
            blocking: 0,
            commName: c"trainer".as_ptr(),
            ..Default::default()
        };
        // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
        let c = unsafe { read_comm_config(&cfg) }.unwrap();
        assert!(!c.blocking);
        assert_eq!(c.comm_name.as_deref(), Some("trainer"));
        assert_eq!(c.header_version, 23203);
    }

    #[test]
    fn older_shorter_layout_reads_only_its_fields() {
        // A 2.21-era struct stops after commName (size 56). Fields past it
        // hold garbage here and must not be read.
        let mut cfg = ncclConfig_t {
            size: 56,
            version: 22105,
            blocking: 0,
            collnetEnable: 77,
            ..Default::default()
        };
        // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
        let c = unsafe { read_comm_config(&cfg) }.unwrap();
        assert!(!c.blocking);
        // A 2.14-era struct: size 40, ends after netName.
        cfg.size = 40;
        cfg.version = 21403;
        cfg.splitShare = 12345; // outside the declared size: ignored
                                // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
        assert!(!unsafe { read_comm_config(&cfg) }.unwrap().split_share);
    }

    #[test]
    fn garbage_is_rejected() {
        let d = ncclConfig_t::default;
        for bad in [
            ncclConfig_t {
                magic: 0x1234,
                ..d()
            },
            ncclConfig_t {
                size: 1 << 30,
                ..d()
            },
            ncclConfig_t { size: 57, ..d() },
            ncclConfig_t { version: 7, ..d() },
            ncclConfig_t { blocking: 5, ..d() },
        ] {
            // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
            assert!(unsafe { read_comm_config(&bad) }.is_err());
        }
        let words = [0xdead_beef_u64; 16];
        // SAFETY: 128 readable bytes of garbage, which the reader must refuse by its header.
        assert!(unsafe { read_comm_config(words.as_ptr() as *const ncclConfig_t) }.is_err());
    }

    #[test]
    fn alg_selection_is_a_filter_or_ignored() {
        let c = |s: Option<&str>| CollConfig {
            alg_selection: s.map(String::from),
            profiler_tag: 0,
        };
        let f = coll_filter(&c(Some("ring"))).expect("a filter");
        assert!(!f.allows(
            crate::algo::Collective::AllReduce,
            crate::algo::Algorithm::Tree
        ));
        assert!(
            coll_filter(&c(Some("bogus"))).is_none(),
            "unknown names are ignored"
        );
        assert!(coll_filter(&c(None)).is_none());
    }

    #[test]
    fn coll_config() {
        let c = ncclCollConfig_t {
            size: size_of::<ncclCollConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: 23203,
            ext: std::ptr::null_mut(),
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            algSelection: c"ring".as_ptr(),
            forceAlgSelection: 1,
            CTAPolicy: NCCL_CONFIG_UNDEF_INT,
            userProfilerTag: 42,
            launchCompletionEvent: std::ptr::null_mut(),
        };
        // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
        let r = unsafe { read_coll_config(&c) }.unwrap();
        assert_eq!(r.alg_selection.as_deref(), Some("ring"));
        assert_eq!(r.profiler_tag, 42);
        let mut bad = c;
        bad.magic = 0;
        // SAFETY: NULL, or a config struct alive on this stack frame with a truthful size.
        assert!(unsafe { read_coll_config(&bad) }.is_err());
    }
}
