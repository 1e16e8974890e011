//! The few libibverbs types and functions the verbs transport uses, written
//! by hand from rdma-core's `<infiniband/verbs.h>` (ABI `IBVERBS_1.1`), and
//! the library loaded at run time (`libibverbs.so.1`), so that hetccl has no
//! link-time dependency on rdma-core. See docs/rdma.md for why these are not
//! `rdma-sys`'s bindings.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are inline functions
//! in the header that call through the context's `ops` table; [`Verbs`]
//! does the same. The layouts are checked against the header by the tests
//! below (offsets printed by a C program compiled against rdma-core 44).
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void, CStr};

use once_cell::sync::OnceCell;

/// `union ibv_gid` (8-aligned: the union has a `__be64` member).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    /// The rest of the `wr`, `qp_type` and `bind_mw`/`tso` unions.
    pub _rest: [u64; 9],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        // SAFETY: plain data; all-zero is the C initialiser `{0}`.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_device_attr`, read as bytes (only a few fields are used).
#[repr(C, align(8))]
pub struct ibv_device_attr {
    pub raw: [u8; 232],
}

impl ibv_device_attr {
    /// `phys_port_cnt`.
    pub fn phys_port_cnt(&self) -> u8 {
        self.raw[227]
    }
    fn int_at(&self, off: usize) -> i32 {
        i32::from_ne_bytes(self.raw[off..off + 4].try_into().expect("4 bytes"))
    }
    /// `max_qp_wr`.
    pub fn max_qp_wr(&self) -> i32 {
        self.int_at(112)
    }
    /// `max_cqe`.
    pub fn max_cqe(&self) -> i32 {
        self.int_at(132)
    }
}

/// The ops table at the start of `struct ibv_context` (32 pointers).
#[repr(C)]
pub struct ibv_context_ops {
    _a: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    _b: [*mut c_void; 12],
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    _c: [*mut c_void; 5],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
}

/// Opaque.
#[repr(C)]
pub struct ibv_device {
    _p: [u8; 0],
}
/// Opaque.
#[repr(C)]
pub struct ibv_pd {
    _p: [u8; 0],
}
/// Only the leading context pointer is read.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// The `element` union (a CQ, QP, SRQ or WQ pointer, or a port number).
    pub element: *mut c_void,
    pub event_type: u32,
}

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QPS_ERR: u32 = 6;
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const IBV_ACCESS_RELAXED_ORDERING: c_int = 1 << 20;

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
pub const IBV_SEND_INLINE: u32 = 1 << 3;

pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_RECV: u32 = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = (1 << 7) + 1;
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

macro_rules! verbs_fns {
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The entry points of libibverbs, resolved once.
        #[allow(missing_docs)]
        pub struct Verbs {
            _lib: libloading::Library,
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
            /// `ibv_reg_dmabuf_mr` (rdma-core 34+); `None` on older libraries.
            pub reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
        }

        impl Verbs {
            fn load(path: &str) -> Result<Self, String> {
                // SAFETY: libibverbs' initialisers only read its config files.
                let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
                // SAFETY: each symbol has the C signature declared above
                // (rdma-core's verbs.h, default symbol versions).
                unsafe {
                    $(
                        let $name = *lib
                            .get::<unsafe extern "C" fn($($arg),*) -> $ret>(concat!("ibv_", stringify!($name), "\0").as_bytes())
                            .map_err(|e| format!("ibv_{}: {e}", stringify!($name)))?;
                    )*
                    let reg_dmabuf_mr = lib
                        .get::<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>(b"ibv_reg_dmabuf_mr\0")
                        .ok()
                        .map(|s| *s);
                    Ok(Self { _lib: lib, $($name,)* reg_dmabuf_mr })
                }
            }
        }
    };
}

verbs_fns! {
    get_device_list: fn(*mut c_int) -> *mut *mut ibv_device;
    free_device_list: fn(*mut *mut ibv_device) -> ();
    get_device_name: fn(*mut ibv_device) -> *const c_char;
    get_device_guid: fn(*mut ibv_device) -> u64;
    open_device: fn(*mut ibv_device) -> *mut ibv_context;
    close_device: fn(*mut ibv_context) -> c_int;
    query_device: fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    query_port: fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    query_gid: fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    alloc_pd: fn(*mut ibv_context) -> *mut ibv_pd;
    dealloc_pd: fn(*mut ibv_pd) -> c_int;
    reg_mr: fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    dereg_mr: fn(*mut ibv_mr) -> c_int;
    create_cq: fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq;
    destroy_cq: fn(*mut ibv_cq) -> c_int;
    create_qp: fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    modify_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    destroy_qp: fn(*mut ibv_qp) -> c_int;
    get_async_event: fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
    ack_async_event: fn(*mut ibv_async_event) -> ();
    wc_status_str: fn(u32) -> *const c_char;
    event_type_str: fn(u32) -> *const c_char;
}

/// The sonames tried, in order (`HETCCL_IBVERBS_LIB` replaces them).
const SONAMES: &[&str] = &["libibverbs.so.1", "libibverbs.so"];

/// libibverbs, loaded on first use; `Err` says why it is not there.
pub fn verbs() -> Result<&'static Verbs, &'static str> {
    static V: OnceCell<Result<Verbs, String>> = OnceCell::new();
    V.get_or_init(|| {
        // Read once, at the first use of verbs in the process.
        let names: Vec<String> = match hetccl_core::config::get().ibverbs_lib.clone() {
            Some(p) if !p.is_empty() => vec![p],
            _ => SONAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut why = Vec::new();
        for n in &names {
            match Verbs::load(n) {
                Ok(v) => return Ok(v),
                Err(e) => why.push(e),
            }
        }
        Err(why.join("; "))
    })
    .as_ref()
    .map_err(|e| e.as_str())
}

impl Verbs {
    /// `ibv_poll_cq` (inline in the header: the context's ops table).
    ///
    /// # Safety
    /// `cq` is a live CQ; `wc` has room for `n` entries.
    pub unsafe fn poll_cq(&self, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
        // SAFETY: a live CQ points at its live context, whose ops the
        // provider filled in.
        unsafe {
            let f = (*(*cq).context).ops.poll_cq.expect("provider has poll_cq");
            f(cq, n, wc)
        }
    }

    /// `ibv_post_send`.
    ///
    /// # Safety
    /// `qp` is a live QP; `wr` a valid list whose buffers are registered.
    pub unsafe fn post_send(&self, qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: as for poll_cq.
        unsafe {
            let f = (*(*qp).context)
                .ops
                .post_send
                .expect("provider has post_send");
            f(qp, wr, &mut bad)
        }
    }

    /// `ibv_post_recv`.
    ///
    /// # Safety
    /// As for [`Verbs::post_send`].
    pub unsafe fn post_recv(&self, qp: *mut ibv_qp, wr: *mut ibv_recv_wr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: as for poll_cq.
        unsafe {
            let f = (*(*qp).context)
                .ops
                .post_recv
                .expect("provider has post_recv");
            f(qp, wr, &mut bad)
        }
    }

    /// `ibv_wc_status_str` as a Rust string.
    pub fn status_str(&self, status: u32) -> String {
        // SAFETY: returns a static string for any value.
        let p = unsafe { (self.wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `ibv_event_type_str` as a Rust string.
    pub fn event_str(&self, ev: u32) -> String {
        // SAFETY: returns a static string for any value.
        let p = unsafe { (self.event_type_str)(ev) };
        if p.is_null() {
            return format!("event {ev}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The numbers come from a C program printing `sizeof`/`offsetof`
    /// against rdma-core 44's verbs.h on x86-64.
    #[test]
    fn layouts_match_rdma_core() {
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, imm_data), 36);
        assert_eq!(offset_of!(ibv_send_wr, remote_addr), 40);
        assert_eq!(offset_of!(ibv_send_wr, rkey), 48);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(offset_of!(ibv_wc, byte_len), 20);
        assert_eq!(offset_of!(ibv_wc, imm_data), 24);
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_wc, wc_flags), 36);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(offset_of!(ibv_qp_init_attr, cap), 32);
        assert_eq!(offset_of!(ibv_qp_init_attr, qp_type), 52);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(offset_of!(ibv_qp_attr, ah_attr), 56);
        assert_eq!(offset_of!(ibv_qp_attr, pkey_index), 120);
        assert_eq!(offset_of!(ibv_qp_attr, max_rd_atomic), 126);
        assert_eq!(offset_of!(ibv_qp_attr, port_num), 129);
        assert_eq!(offset_of!(ibv_qp_attr, timeout), 130);
        assert_eq!(offset_of!(ibv_qp_attr, rate_limit), 136);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(offset_of!(ibv_ah_attr, dlid), 24);
        assert_eq!(offset_of!(ibv_ah_attr, port_num), 30);
        assert_eq!(size_of::<ibv_global_route>(), 24);
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(offset_of!(ibv_port_attr, lid), 34);
        assert_eq!(offset_of!(ibv_port_attr, active_width), 43);
        assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
            96
        );
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq),
            104
        );
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
            208
        );
        assert_eq!(
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv),
            216
        );
        assert_eq!(offset_of!(ibv_context, async_fd), 268);
        assert_eq!(offset_of!(ibv_qp, qp_num), 52);
        assert_eq!(offset_of!(ibv_mr, lkey), 36);
        assert_eq!(offset_of!(ibv_mr, rkey), 40);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(size_of::<ibv_async_event>(), 16);
        assert_eq!(offset_of!(ibv_async_event, event_type), 8);
    }
}
