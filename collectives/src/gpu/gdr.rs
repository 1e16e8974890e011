//! Sends and receives of device buffers between nodes in place, over
//! GPUDirect RDMA: the NIC reads the user's device buffer and writes the
//! peer's data straight into device memory, with no staging copy.
//!
//! A call goes in place when it is a send or a receive of device memory
//! whose peer is joined by a verbs link and the communicator's
//! [`crate::transport::gdr::Paths`] allow GPUDirect for the buffer's GPU on
//! that link's port (and, for a receive, this rank's peers send to it by
//! rendezvous only). The host engine then runs it on the device pointer:
//! point-to-point plans only post the range to the link, which finds the
//! registration held here and RDMA-writes from it or into it. After the
//! batch, each receive written in place is flushed before the stream is
//! released. Everything else (collectives, which the host engine reads or
//! reduces on the CPU; device memory beyond `NCCL_NET_GDR_LEVEL`; TCP
//! links) is staged through pinned host memory ([`super::stage`]).

use std::sync::Arc;

use nccl_net_plugin::ib::mr::Mr;

use super::memory::Placement;
use crate::algo::Collective;
use crate::error::Result;
use crate::launch::Call;

/// Which buffer of one call crosses its verbs link in place.
#[derive(Debug, Default)]
pub struct InPlace {
    /// The send buffer is read by the NIC where it lies.
    pub send: bool,
    /// The receive buffer is written by the NIC where it lies.
    pub recv: bool,
    /// The registration, held for the call: the device's cache never
    /// evicts a held entry, so the link finds it.
    mr: Option<Arc<Mr>>,
}

/// What goes in place for `a` (nothing unless it is a send or receive of
/// device memory over a verbs link that allows GPUDirect).
pub fn choose(a: &Call) -> InPlace {
    let (Placement::Device(d), Some(e)) = (a.placement, a.comm.engine.get()) else {
        return InPlace::default();
    };
    let (send, recv, mr) = match a.kind {
        Collective::Send if a.send_bytes > 0 && !a.send.is_null() => (
            true,
            false,
            e.gdr.send_mr(a.root, d, a.send.addr(), a.send_bytes),
        ),
        Collective::Recv if a.recv_bytes > 0 && !a.recv.is_null() => (
            false,
            true,
            e.gdr.recv_mr(a.root, d, a.recv.addr(), a.recv_bytes),
        ),
        _ => return InPlace::default(),
    };
    match mr {
        Some(mr) => InPlace {
            send,
            recv,
            mr: Some(mr),
        },
        None => InPlace::default(),
    }
}

/// After the host engine ran `calls`: flushes each receive written in
/// place, so that the GPU sees its data before the stream moves on.
pub fn flush(calls: &[&Call], chosen: &[InPlace]) -> Result<()> {
    for (a, ip) in calls.iter().zip(chosen) {
        let (true, Some(mr), Some(e)) = (ip.recv, &ip.mr, a.comm.engine.get()) else {
            continue;
        };
        let last = a.recv.addr() + a.recv_bytes - 1;
        e.gdr.flush(a.root, mr, last, e.settings.deadline())?;
    }
    Ok(())
}
