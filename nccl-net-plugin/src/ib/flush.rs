//! The GPUDirect flush: after the NIC has written into GPU memory, an RDMA
//! read of that memory on a QP connected to itself (as NCCL does) makes the
//! written data visible to the GPU, since PCIe orders the read behind the
//! earlier writes. The read lands in a small registered host buffer.
//!
//! One [`Flusher`] per receive comm, made on its first flush. Reads
//! complete in order on its one QP, so a flush is done when as many
//! completions as posted reads up to and including it have arrived.

use parking_lot::Mutex;

use super::ffi;
use super::qp::{Endpoint, IbOptions, RegBuf};
use super::IbPort;
use crate::error::{NetError, Result};

/// Bytes read per flush (NCCL reads one).
const FLUSH_BYTES: u32 = 1;

struct St {
    posted: u64,
    completed: u64,
    failed: Option<NetError>,
}

/// A loopback QP that flushes received data with RDMA reads.
pub struct Flusher {
    ep: Endpoint,
    host: RegBuf,
    st: Mutex<St>,
}

impl std::fmt::Debug for Flusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flusher({} QP {:?})", self.ep.port.label(), self.ep.qpns)
    }
}

impl Flusher {
    /// A QP on `port` connected to itself, and its host landing buffer.
    pub fn new(port: &IbPort, opts: &IbOptions) -> Result<Self> {
        let o = IbOptions {
            qps: 1,
            slots: 1,
            ..opts.clone()
        };
        let ep = Endpoint::new(port, &o)?;
        ep.connect(&ep.info(0), &o)?;
        let host = RegBuf::new(port, 64, false)?;
        Ok(Self {
            ep,
            host,
            st: Mutex::new(St {
                posted: 0,
                completed: 0,
                failed: None,
            }),
        })
    }

    /// Posts the read of the byte at `addr` (registered with `rkey`);
    /// returns the flush's number for [`Flusher::test`].
    pub fn post(&self, addr: u64, rkey: u32) -> Result<u64> {
        let mut st = self.st.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.posted - st.completed >= self.ep.sq_depth as u64 {
            self.drain(&mut st)?;
            if st.posted - st.completed >= self.ep.sq_depth as u64 {
                return Err(NetError::Internal(format!(
                    "NET/IB: {} flushes in flight on {}",
                    st.posted - st.completed,
                    self.ep.port.label()
                )));
            }
        }
        let sge = ffi::ibv_sge {
            addr: self.host.buf.addr() as u64,
            length: FLUSH_BYTES,
            lkey: self.host.mr.lkey,
        };
        // SAFETY: the landing buffer is registered and lives as long as
        // the QP; the remote range is the caller's registered memory.
        unsafe {
            self.ep.post_send(
                0,
                st.posted,
                ffi::IBV_WR_RDMA_READ,
                Some(sge),
                false,
                (addr, rkey),
                0,
            )?
        };
        st.posted += 1;
        Ok(st.posted)
    }

    /// Whether flush `id` (from [`Flusher::post`]) has completed; a failed
    /// read fails this and every later flush, naming device, QP and status.
    pub fn test(&self, id: u64) -> Result<bool> {
        let mut st = self.st.lock();
        if st.completed < id {
            self.drain(&mut st)?;
        }
        Ok(st.completed >= id)
    }

    fn drain(&self, st: &mut St) -> Result<()> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if let Some(e) = self.ep.async_failure() {
            st.failed = Some(e.clone());
            return Err(e);
        }
        let mut wcs = [ffi::ibv_wc::default(); 16];
        loop {
            let n = self.ep.poll(&mut wcs);
            for wc in &wcs[..n] {
                if wc.status != ffi::IBV_WC_SUCCESS {
                    let e = self.ep.wc_error(wc, "self (GPU flush)");
                    tracing::warn!(target: "hetccl::NET", "{e}");
                    st.failed = Some(e.clone());
                    return Err(e);
                }
                st.completed += 1;
            }
            if n < wcs.len() {
                return Ok(());
            }
        }
    }
}
