//! One end of a verbs connection: a completion queue and the RC queue pairs
//! on one port, their state transitions, and registered page-aligned
//! buffers.

use std::sync::Arc;
use std::time::Duration;

use super::dev::IbPort;
use super::ffi::{self, ibv_cq, ibv_qp, Verbs};
use super::mr::Mr;
use super::proto::{ConnInfo, MAX_QPS};
use crate::error::{NetError, Result};
use crate::sock::random_u64;

/// Inline bytes asked for per send work request: an eager header and
/// 224 bytes of payload.
const INLINE_WANT: u32 = 256;

/// Tuning and NCCL's IB variables, read once per transport.
#[derive(Debug, Clone, PartialEq)]
pub struct IbOptions {
    /// `NCCL_IB_QPS_PER_CONNECTION` (1..=8, default 1).
    pub qps: usize,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS` (default 0: each piece on one QP).
    pub split: bool,
    /// `NCCL_IB_TIMEOUT` (default 20: 4.096 µs × 2^20).
    pub ib_timeout: u8,
    /// `NCCL_IB_RETRY_CNT` (default 7).
    pub retry_cnt: u8,
    /// `NCCL_IB_SL` (default 0).
    pub sl: u8,
    /// `NCCL_IB_TC` (default 0).
    pub tc: u8,
    /// `NCCL_IB_PCI_RELAXED_ORDERING` (default on where supported).
    pub relaxed: bool,
    /// Receive slots per QP (and credits of the sender).
    pub slots: usize,
    /// Largest message sent eagerly.
    pub eager_max: usize,
    /// Bytes of one bounce chunk (memory the caller did not register).
    pub chunk: usize,
    /// Bounce chunks per comm.
    pub nchunks: usize,
    /// No progress for this long fails pending transfers (`HETCCL_TIMEOUT_S`).
    pub timeout: Duration,
}

impl Default for IbOptions {
    fn default() -> Self {
        Self {
            qps: 1,
            split: false,
            ib_timeout: 20,
            retry_cnt: 7,
            sl: 0,
            tc: 0,
            relaxed: true,
            slots: 64,
            eager_max: 8192,
            chunk: 1 << 20,
            nchunks: 4,
            timeout: Duration::from_secs(300),
        }
    }
}

impl IbOptions {
    /// The options a configuration asks for.
    pub fn from_config(c: &hetccl_core::config::Config) -> Self {
        let d = Self::default();
        Self {
            qps: c.ib_qps_per_connection.clamp(1, MAX_QPS as u32) as usize,
            split: c.ib_split_data_on_qps,
            ib_timeout: c.ib_timeout.clamp(1, 31) as u8,
            retry_cnt: c.ib_retry_cnt.min(7) as u8,
            sl: c.ib_sl.min(15) as u8,
            tc: c.ib_tc.min(255) as u8,
            relaxed: c.ib_pci_relaxed_ordering != 0,
            timeout: Duration::from_secs_f64(c.timeout_s.clamp(0.001, 1e9)),
            ..d
        }
    }

    /// Bytes of one receive slot: a header and an eager payload.
    pub fn slot_bytes(&self) -> usize {
        (super::proto::HDR_BYTES + self.eager_max).next_multiple_of(64)
    }
}

/// A zeroed, page-aligned heap buffer.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for Buf {}
// SAFETY: shared access goes through raw pointers whose users synchronise.
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` zeroed bytes.
    pub fn new(len: usize) -> Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| NetError::Internal(e.to_string()))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(NetError::System(format!("cannot allocate {len} bytes")));
        }
        Ok(Self { ptr, len })
    }
    /// Start address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Start address as an integer.
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), 4096).expect("valid");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// A registered buffer (the MR is dropped before the memory).
pub struct RegBuf {
    /// The registration.
    pub mr: Arc<Mr>,
    /// The memory.
    pub buf: Buf,
}

impl RegBuf {
    /// `len` zeroed bytes registered on `port`'s device.
    pub fn new(port: &IbPort, len: usize, relaxed: bool) -> Result<Self> {
        let buf = Buf::new(len)?;
        // SAFETY: memory we own, alive as long as the MR (field order).
        let mr = unsafe {
            Mr::register(
                port.dev.pd,
                buf.addr(),
                buf.len(),
                super::mr::access(relaxed),
            )?
        };
        Ok(Self {
            mr: Arc::new(mr),
            buf,
        })
    }
}

/// The CQ and QPs of one comm.
pub struct Endpoint {
    /// The port.
    pub port: IbPort,
    pub(crate) v: &'static Verbs,
    pub(crate) cq: *mut ibv_cq,
    pub(crate) qps: Vec<*mut ibv_qp>,
    /// QP numbers, for logs and async events.
    pub qpns: Vec<u32>,
    /// Starting PSN.
    pub psn: u32,
    /// Send queue depth per QP.
    pub sq_depth: usize,
    /// Most bytes a send may carry inline (`IBV_SEND_INLINE`), as the
    /// provider granted.
    pub max_inline: usize,
}

// SAFETY: verbs objects are thread-safe; the comm locks its state.
unsafe impl Send for Endpoint {}
// SAFETY: as above.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// A CQ and `opts.qps` RC QPs in INIT on `port`.
    pub fn new(port: &IbPort, opts: &IbOptions) -> Result<Self> {
        let v = ffi::verbs().map_err(|e| NetError::System(e.into()))?;
        let nqps = opts.qps.clamp(1, MAX_QPS);
        let sq_depth = opts.slots + super::proto::NCTS + 16;
        let rq_depth = opts.slots;
        let cqe = (nqps * (sq_depth + rq_depth) + 64) as i32;
        let ctx = port.dev.ctx;
        // SAFETY: a live context; no channel, vector 0.
        let cq = unsafe { (v.create_cq)(ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(NetError::System(format!(
                "ibv_create_cq on {}: {}",
                port.label(),
                std::io::Error::last_os_error()
            )));
        }
        let mut ep = Self {
            port: port.clone(),
            v,
            cq,
            qps: Vec::new(),
            qpns: Vec::new(),
            psn: (random_u64()? & 0xff_ffff) as u32,
            sq_depth,
            max_inline: usize::MAX,
        };
        for _ in 0..nqps {
            let init = |max_inline_data: u32| ffi::ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: cq,
                recv_cq: cq,
                srq: std::ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: sq_depth as u32,
                    max_recv_wr: rq_depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data,
                },
                qp_type: ffi::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // Room inline for a small eager message; a provider that grants
            // less gets asked for a CTS entry's worth (which all have).
            let mut qp = std::ptr::null_mut();
            for want in [INLINE_WANT, super::proto::CTS_BYTES as u32] {
                let mut a = init(want);
                // SAFETY: a live PD and a filled attribute.
                qp = unsafe { (v.create_qp)(port.dev.pd, &mut a) };
                if !qp.is_null() {
                    // The provider writes back what it granted.
                    ep.max_inline = ep.max_inline.min(a.cap.max_inline_data.max(want) as usize);
                    break;
                }
            }
            if qp.is_null() {
                return Err(NetError::System(format!(
                    "ibv_create_qp on {}: {}",
                    port.label(),
                    std::io::Error::last_os_error()
                )));
            }
            ep.qps.push(qp);
            // SAFETY: a live QP.
            ep.qpns.push(unsafe { (*qp).qp_num });
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_INIT,
                pkey_index: 0,
                port_num: port.port,
                qp_access_flags: (ffi::IBV_ACCESS_REMOTE_WRITE
                    | ffi::IBV_ACCESS_REMOTE_READ
                    | ffi::IBV_ACCESS_LOCAL_WRITE) as u32,
                ..Default::default()
            };
            let mask = ffi::IBV_QP_STATE
                | ffi::IBV_QP_PKEY_INDEX
                | ffi::IBV_QP_PORT
                | ffi::IBV_QP_ACCESS_FLAGS;
            ep.modify(qp, &mut a, mask, "INIT")?;
        }
        Ok(ep)
    }

    fn modify(&self, qp: *mut ibv_qp, a: &mut ffi::ibv_qp_attr, mask: i32, to: &str) -> Result<()> {
        // SAFETY: a live QP and attribute.
        let rc = unsafe { (self.v.modify_qp)(qp, a, mask) };
        if rc != 0 {
            return Err(NetError::System(format!(
                "ibv_modify_qp to {to} on {}: {}",
                self.port.label(),
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// This side's connection data.
    pub fn info(&self, nonce: u64) -> ConnInfo {
        let mut qpn = [0u32; MAX_QPS];
        qpn[..self.qpns.len()].copy_from_slice(&self.qpns);
        ConnInfo {
            nonce,
            qpn,
            nqps: self.qpns.len() as u8,
            mtu: self.port.mtu.clamp(1, 5) as u8,
            link_layer: self.port.link_layer,
            lid: self.port.lid,
            psn: self.psn,
            gid: self.port.gid,
            ..Default::default()
        }
    }

    /// Moves every QP to RTR then RTS, facing `remote`.
    pub fn connect(&self, remote: &ConnInfo, opts: &IbOptions) -> Result<()> {
        if remote.nqps as usize != self.qps.len() {
            return Err(NetError::proto(format!(
                "peer has {} QPs per connection, we have {} (NCCL_IB_QPS_PER_CONNECTION must match)",
                remote.nqps,
                self.qps.len()
            )));
        }
        if remote.link_layer != self.port.link_layer {
            return Err(NetError::System(format!(
                "peer port is on another link layer ({} vs {})",
                remote.link_layer, self.port.link_layer
            )));
        }
        let mtu = u32::from(remote.mtu).min(self.port.mtu.clamp(1, 5));
        let roce = self.port.link_layer == ffi::IBV_LINK_LAYER_ETHERNET;
        for (i, &qp) in self.qps.iter().enumerate() {
            let mut ah = ffi::ibv_ah_attr {
                dlid: remote.lid,
                sl: opts.sl,
                port_num: self.port.port,
                ..Default::default()
            };
            if roce || remote.gid[..8] != self.port.gid[..8] {
                ah.is_global = 1;
                ah.grh.dgid.raw = remote.gid;
                ah.grh.sgid_index = self.port.gid_index;
                ah.grh.hop_limit = 255;
                ah.grh.traffic_class = opts.tc;
            }
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_RTR,
                path_mtu: mtu,
                dest_qp_num: remote.qpn[i],
                rq_psn: remote.psn,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ah_attr: ah,
                ..Default::default()
            };
            let mask = ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER;
            self.modify(qp, &mut a, mask, "RTR")?;
            let mut a = ffi::ibv_qp_attr {
                qp_state: ffi::IBV_QPS_RTS,
                timeout: opts.ib_timeout,
                retry_cnt: opts.retry_cnt,
                rnr_retry: 7,
                sq_psn: self.psn,
                max_rd_atomic: 1,
                ..Default::default()
            };
            let mask = ffi::IBV_QP_STATE
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC;
            self.modify(qp, &mut a, mask, "RTS")?;
        }
        Ok(())
    }

    /// Polls up to `wcs.len()` completions.
    pub fn poll(&self, wcs: &mut [ffi::ibv_wc]) -> usize {
        // SAFETY: a live CQ; room for wcs.len() entries.
        let n = unsafe { self.v.poll_cq(self.cq, wcs.len() as i32, wcs.as_mut_ptr()) };
        n.max(0) as usize
    }

    /// Posts one receive of `len` bytes at `addr` on QP `q`.
    pub fn post_recv(&self, q: usize, wr_id: u64, addr: usize, len: u32, lkey: u32) -> Result<()> {
        let mut sge = ffi::ibv_sge {
            addr: addr as u64,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: a live QP; the buffer is registered and owned by the comm.
        let rc = unsafe { self.v.post_recv(self.qps[q], &mut wr) };
        if rc != 0 {
            return Err(NetError::System(format!(
                "ibv_post_recv on {} QP {}: {}",
                self.port.label(),
                self.qpns[q],
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Posts one signaled send work request on QP `q`.
    ///
    /// # Safety
    /// The SGE's memory is registered and stays valid until the completion
    /// (or, with `IBV_SEND_INLINE`, until this returns).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post_send(
        &self,
        q: usize,
        wr_id: u64,
        opcode: u32,
        sge: Option<ffi::ibv_sge>,
        inline: bool,
        remote: (u64, u32),
        imm: u32,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.post_send_opt(q, wr_id, opcode, sge, inline, remote, imm, true) }
    }

    /// Posts one send work request on QP `q`, signaled or not (an
    /// unsignaled one completes silently when a later signaled one does,
    /// or with an error completion if it fails).
    ///
    /// # Safety
    /// As [`Endpoint::post_send`]; an unsignaled request's memory stays
    /// valid until a later signaled request on the QP completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post_send_opt(
        &self,
        q: usize,
        wr_id: u64,
        opcode: u32,
        sge: Option<ffi::ibv_sge>,
        inline: bool,
        remote: (u64, u32),
        imm: u32,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = sge.unwrap_or_default();
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: i32::from(sge.length > 0),
            opcode,
            send_flags: if signaled { ffi::IBV_SEND_SIGNALED } else { 0 }
                | if inline { ffi::IBV_SEND_INLINE } else { 0 },
            imm_data: imm.to_be(),
            remote_addr: remote.0,
            rkey: remote.1,
            ..Default::default()
        };
        // SAFETY: a live QP; the caller's contract covers the memory.
        let rc = unsafe { self.v.post_send(self.qps[q], &mut wr) };
        if rc != 0 {
            return Err(NetError::System(format!(
                "ibv_post_send on {} QP {}: {}",
                self.port.label(),
                self.qpns[q],
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// The error a failed completion means, naming the peer, device, QP and
    /// status.
    pub fn wc_error(&self, wc: &ffi::ibv_wc, peer: &str) -> NetError {
        NetError::System(format!(
            "NET/IB: completion error from peer {peer} on {} QP {}: {} (status {}, vendor error {:#x}, opcode {})",
            self.port.label(),
            wc.qp_num,
            self.v.status_str(wc.status),
            wc.status,
            wc.vendor_err,
            wc.opcode
        ))
    }

    /// Why an async event failed this endpoint, if one did.
    pub fn async_failure(&self) -> Option<NetError> {
        super::events::poll();
        super::events::failure(&self.port.dev.name, self.port.port, &self.qpns)
            .map(NetError::System)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for &qp in &self.qps {
            // SAFETY: created by us, destroyed once.
            unsafe { (self.v.destroy_qp)(qp) };
        }
        // SAFETY: as above, after its QPs.
        unsafe { (self.v.destroy_cq)(self.cq) };
    }
}
