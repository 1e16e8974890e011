//! Two exports for tools (the `hetccl` command of the Python package): what
//! this process's hetccl sees, as JSON, and the algorithm table for a rank
//! count and node count without a communicator.
//!
//! A submodule of `ext`, so that cbindgen, which reads `ext/mod.rs` and the
//! modules it declares, puts both functions in `include/hetccl.h`. Both write snprintf-style: the text goes into `buf`
//! of `len` bytes, NUL-terminated and truncated if needed, and `*needed` (if
//! not NULL) receives its full length without the NUL.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int};
use std::fmt::Write;

use hetccl_abi::ncclResult_t;

use crate::algo::{selection_table, AlgoFilter, Collective, CostModel, Topology};
use crate::api::check;
use crate::api::guard::guard;
use crate::error::{Error, Result};

/// The largest message size the table covers (1 GiB), as for a live comm.
const TABLE_MAX_BYTES: usize = 1 << 30;

/// The most ranks [`hetcclSelectionTableFor`] accepts.
const MAX_RANKS: c_int = 1 << 16;

/// Writes, as one JSON object, what hetccl sees in this process: `version`
/// (the string of `hetcclGetVersionString`), `nccl_api` (the level
/// `ncclGetVersion` reports), `socket_ifname` (the interface filter in
/// force, or null), `interfaces` (the TCP interfaces the bootstrap and the
/// TCP transport would use, chosen by the same code: each with `name`,
/// `addr`, `loopback`, `speed_mbps`), `shm_disable` (`NCCL_SHM_DISABLE`) and
/// `config` (the effective configuration, one `NAME=value` string per
/// variable, as `NCCL_DEBUG=INFO` prints it). The text goes into `buf` of
/// `len` bytes, NUL-terminated and truncated if needed; `*needed` (if not
/// NULL) receives its full length without the NUL, as snprintf does.
#[no_mangle]
pub unsafe extern "C" fn hetcclInfoJson(
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> ncclResult_t {
    guard("hetcclInfoJson", || {
        if len > 0 {
            check::non_null(buf, "buf")?;
        }
        // SAFETY: `buf` holds `len` writable bytes (checked non-NULL when
        // len > 0); `needed` is NULL or a writable size_t (caller contract).
        unsafe { write_out(&info_json(), buf, len, needed) };
        Ok(())
    })
}

/// Writes the algorithm table (as `hetcclCommSelectionTable` prints it for a
/// live communicator, without its direct-path lines) for `nranks` ranks on
/// `nnodes` nodes, ranks spread in contiguous blocks as launchers place them
/// (block sizes differ by at most one, larger blocks first), one process per
/// rank. `NCCL_ALGO` restrictions are applied. `1 <= nnodes <= nranks <=
/// 65536`. `buf`, `len` and `needed` as for `hetcclInfoJson`.
#[no_mangle]
pub unsafe extern "C" fn hetcclSelectionTableFor(
    nranks: c_int,
    nnodes: c_int,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> ncclResult_t {
    guard("hetcclSelectionTableFor", || {
        if !(1..=MAX_RANKS).contains(&nranks) {
            return Err(Error::arg(format!(
                "nranks {nranks} is out of range [1, {MAX_RANKS}]"
            )));
        }
        if !(1..=nranks).contains(&nnodes) {
            return Err(Error::arg(format!(
                "nnodes {nnodes} is out of range [1, nranks = {nranks}]"
            )));
        }
        if len > 0 {
            check::non_null(buf, "buf")?;
        }
        let text = table_for(nranks as u32, nnodes as u32)?;
        // SAFETY: as in hetcclInfoJson.
        unsafe { write_out(&text, buf, len, needed) };
        Ok(())
    })
}

/// Copies `text` into `buf` snprintf-style and stores its length in `*needed`.
///
/// # Safety
/// `buf` must hold `len` writable bytes when `len > 0`; `needed` must be NULL
/// or a writable `size_t`.
pub(super) unsafe fn write_out(text: &str, buf: *mut c_char, len: usize, needed: *mut usize) {
    if !needed.is_null() {
        // SAFETY: non-NULL, writable by the caller's contract.
        unsafe { *needed = text.len() };
    }
    if len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` holds `len` > n writable bytes by the caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
}

/// The node of each rank: contiguous blocks, sizes differing by at most one.
fn block_layout(nranks: u32, nnodes: u32) -> Vec<u32> {
    let (base, extra) = (nranks / nnodes, nranks % nnodes);
    (0..nnodes)
        .flat_map(|node| {
            let size = base + u32::from(node < extra);
            std::iter::repeat_n(node, size as usize)
        })
        .collect()
}

/// The selection table for the block layout of `nranks` on `nnodes`.
fn table_for(nranks: u32, nnodes: u32) -> Result<String> {
    let filter = match hetccl_core::config::get().algo.as_deref() {
        Some(s) => AlgoFilter::parse(s).map_err(|e| Error::arg(format!("NCCL_ALGO: {e}")))?,
        None => AlgoFilter::all(),
    };
    let colls: Vec<Collective> = Collective::ALL
        .into_iter()
        .filter(|c| !matches!(c, Collective::Send | Collective::Recv))
        .collect();
    let topo = Topology::from_nodes(block_layout(nranks, nnodes));
    Ok(selection_table(
        &colls,
        &topo,
        &CostModel::default(),
        &filter,
        TABLE_MAX_BYTES,
    ))
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The JSON text of [`hetcclInfoJson`].
fn info_json() -> String {
    let cfg = hetccl_core::config::get();
    let devs = nccl_net_plugin::iface::discover(cfg.socket_ifname.as_deref(), cfg.socket_family);
    let ifaces: Vec<String> = devs
        .iter()
        .map(|d| {
            format!(
                "{{\"name\":{},\"addr\":{},\"loopback\":{},\"speed_mbps\":{}}}",
                json_str(&d.name),
                json_str(&d.addr.to_string()),
                d.loopback,
                d.speed_mbps
            )
        })
        .collect();
    let config: Vec<String> = cfg.to_string().lines().map(json_str).collect();
    let version = super::VERSION.to_str().unwrap_or("hetccl");
    format!(
        "{{\"version\":{},\"nccl_api\":{},\"socket_ifname\":{},\"interfaces\":[{}],\
         \"shm_disable\":{},\"config\":[{}]}}",
        json_str(version),
        crate::api::version::API_VERSION,
        cfg.socket_ifname
            .as_deref()
            .map_or_else(|| "null".to_string(), json_str),
        ifaces.join(","),
        cfg.shm_disable,
        config.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f(buf, len, needed)` twice, as C callers do: once for the
    /// length, once with a buffer of that size.
    fn fetch(f: impl Fn(*mut c_char, usize, *mut usize) -> ncclResult_t) -> String {
        let mut need = 0usize;
        assert_eq!(f(std::ptr::null_mut(), 0, &mut need), 0);
        let mut buf = vec![0x55u8; need + 1];
        let mut again = 0usize;
        assert_eq!(f(buf.as_mut_ptr().cast(), buf.len(), &mut again), 0);
        assert_eq!(again, need);
        assert_eq!(buf[need], 0, "NUL-terminated");
        String::from_utf8(buf[..need].to_vec()).unwrap()
    }

    #[test]
    fn layouts_are_contiguous_balanced_blocks() {
        assert_eq!(block_layout(8, 2), [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(block_layout(5, 2), [0, 0, 0, 1, 1]);
        assert_eq!(block_layout(7, 3), [0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(block_layout(3, 3), [0, 1, 2]);
        assert_eq!(block_layout(4, 1), [0, 0, 0, 0]);
    }

    #[test]
    fn table_for_a_layout() {
        // SAFETY: `fetch` passes NULL or a buffer of `l` bytes, and a writable size slot.
        let t = fetch(|b, l, n| unsafe { hetcclSelectionTableFor(8, 2, b, l, n) });
        let first = t.lines().next().unwrap();
        assert!(
            first.starts_with("# hetccl algorithm selection: 8 ranks on 2 node(s) [4+4]"),
            "{t}"
        );
        for c in ["allreduce", "broadcast", "alltoall", "scatter"] {
            assert!(t.lines().any(|l| l.trim_start().starts_with(c)), "{c}: {t}");
        }
        assert!(!t.contains("  send "), "{t}");
        // SAFETY: `fetch` passes NULL or a buffer of `l` bytes, and a writable size slot.
        let t = fetch(|b, l, n| unsafe { hetcclSelectionTableFor(5, 2, b, l, n) });
        assert!(t.contains("5 ranks on 2 node(s) [3+2]"), "{t}");
        // The node layout reaches the cost model: 8 ranks on one node are
        // not priced like 8 ranks on two.
        // SAFETY: `fetch` passes NULL or a buffer of `l` bytes, and a writable size slot.
        let flat = fetch(|b, l, n| unsafe { hetcclSelectionTableFor(8, 1, b, l, n) });
        assert!(flat.contains("8 ranks on 1 node(s) [8]"), "{flat}");
        // SAFETY: `fetch` passes NULL or a buffer of `l` bytes, and a writable size slot.
        let two = fetch(|b, l, n| unsafe { hetcclSelectionTableFor(8, 2, b, l, n) });
        let rows = |s: &str| s.lines().skip(2).map(str::to_string).collect::<Vec<_>>();
        assert_ne!(rows(&flat), rows(&two));
    }

    #[test]
    fn truncates_like_snprintf() {
        // SAFETY: `fetch` passes NULL or a buffer of `l` bytes, and a writable size slot.
        let full = fetch(|b, l, n| unsafe { hetcclSelectionTableFor(2, 1, b, l, n) });
        let mut buf = [0x55u8; 8];
        let mut need = 0usize;
        let rc =
            // SAFETY: a live buffer of `buf.len()` bytes and a writable size slot.
            unsafe { hetcclSelectionTableFor(2, 1, buf.as_mut_ptr().cast(), buf.len(), &mut need) };
        assert_eq!(rc, 0);
        assert_eq!(need, full.len());
        assert_eq!(&buf[..7], &full.as_bytes()[..7]);
        assert_eq!(buf[7], 0);
        // `needed` may be NULL.
        // SAFETY: a live buffer of its stated length; `needed` may be NULL.
        let rc = unsafe {
            hetcclSelectionTableFor(2, 1, buf.as_mut_ptr().cast(), 1, std::ptr::null_mut())
        };
        assert_eq!((rc, buf[0]), (0, 0));
    }

    #[test]
    fn bad_arguments() {
        let mut buf = [0u8; 64];
        let p = buf.as_mut_ptr().cast::<c_char>();
        let no_len = std::ptr::null_mut::<usize>();
        for (nranks, nnodes) in [(0, 1), (-1, 1), (4, 0), (4, 5), (MAX_RANKS + 1, 1)] {
            // SAFETY: `p` points to 64 writable bytes; `needed` may be NULL.
            let rc = unsafe { hetcclSelectionTableFor(nranks, nnodes, p, 64, no_len) };
            assert_eq!(rc, 4, "nranks {nranks} nnodes {nnodes}");
        }
        let no_buf = std::ptr::null_mut::<c_char>();
        assert_eq!(
            // SAFETY: NULL with a non-zero length, which the function refuses.
            unsafe { hetcclSelectionTableFor(2, 1, no_buf, 8, no_len) },
            4
        );
        // SAFETY: NULL with a non-zero length, which the function refuses.
        assert_eq!(unsafe { hetcclInfoJson(no_buf, 8, no_len) }, 4);
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
    }

    #[test]
    fn info_lists_interfaces_and_config() {
        // SAFETY: `fetch` passes NULL or a buffer of `l` bytes, and a writable size slot.
        let j = fetch(|b, l, n| unsafe { hetcclInfoJson(b, l, n) });
        assert!(j.starts_with("{\"version\":\"hetccl "), "{j}");
        assert!(j.contains("\"nccl_api\":22800,"), "{j}");
        assert!(j.contains("\"interfaces\":[{\"name\":"), "{j}");
        assert!(j.contains("\"NCCL_BUFFSIZE=4194304 (default)\""), "{j}");
        assert!(j.ends_with("]}"), "{j}");
    }
}
