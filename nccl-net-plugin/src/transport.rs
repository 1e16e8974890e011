//! The traits a network transport implements, so that the engine can use any
//! of them (TCP now, verbs later) through one host-buffer API.
//!
//! The contract, shared by every transport:
//! - `listen` never blocks and returns a handle of at most 128 bytes for the
//!   peer; `connect`/`accept` never block and return `None` until ready
//!   (`connect` keeps its state in the handle the caller passes back);
//! - `isend`/`irecv` return `None` when the caller should retry; requests
//!   complete through `test`, which never blocks;
//! - a message larger than the matching receive buffer is an error;
//! - a broken connection makes pending and later requests fail, within the
//!   transport's timeout.

use crate::error::Result;
use crate::iface::NetDevice;
use crate::tcp::{
    RecvBuf, RecvRequest, RecvSizes, SendRequest, TcpListenComm, TcpNet, TcpRecvComm, TcpSendComm,
};
use crate::wire::HANDLE_BYTES;

/// The sending end of a connection.
pub trait SendComm: Send + Sync {
    /// Posts a send; `Ok(None)` means retry.
    ///
    /// # Safety
    /// `ptr..ptr+size` stays readable until the request completes or the comm closes.
    unsafe fn isend(&self, ptr: *const u8, size: usize, tag: i32) -> Result<Option<SendRequest>>;
    /// `Ok(Some(size))` once the send is done.
    fn test(&self, req: SendRequest) -> Result<Option<usize>>;
}

/// The receiving end of a connection.
pub trait RecvComm: Send + Sync {
    /// Posts a grouped receive; `Ok(None)` means retry.
    ///
    /// # Safety
    /// Each buffer stays writable until the request completes or the comm closes.
    unsafe fn irecv(&self, bufs: &[RecvBuf], optional: bool) -> Result<Option<RecvRequest>>;
    /// `Ok(Some(sizes))` once every buffer of the receive is filled.
    fn test(&self, req: RecvRequest) -> Result<Option<RecvSizes>>;
}

/// A network transport: devices, and non-blocking connection setup.
pub trait Transport: Send + Sync {
    /// Listening endpoint.
    type Listen: Send;
    /// Sending end.
    type Send: SendComm;
    /// Receiving end.
    type Recv: RecvComm;
    /// The devices this transport can use.
    fn devices(&self) -> &[NetDevice];
    /// Listens on a device; returns the handle to give the peer.
    fn listen(&self, dev: usize) -> Result<(Self::Listen, [u8; HANDLE_BYTES])>;
    /// Connects with the peer's handle; `Ok(None)` means retry with the same handle.
    fn connect(&self, dev: usize, handle: &mut [u8; HANDLE_BYTES]) -> Result<Option<Self::Send>>;
    /// Accepts one connection; `Ok(None)` means retry.
    fn accept(&self, listen: &mut Self::Listen) -> Result<Option<Self::Recv>>;
}

impl SendComm for TcpSendComm {
    unsafe fn isend(&self, ptr: *const u8, size: usize, tag: i32) -> Result<Option<SendRequest>> {
        // SAFETY: forwarded contract.
        unsafe { TcpSendComm::isend(self, ptr, size, tag) }
    }
    fn test(&self, req: SendRequest) -> Result<Option<usize>> {
        TcpSendComm::test(self, req)
    }
}

impl RecvComm for TcpRecvComm {
    unsafe fn irecv(&self, bufs: &[RecvBuf], optional: bool) -> Result<Option<RecvRequest>> {
        // SAFETY: forwarded contract.
        unsafe { TcpRecvComm::irecv(self, bufs, optional) }
    }
    fn test(&self, req: RecvRequest) -> Result<Option<RecvSizes>> {
        TcpRecvComm::test(self, req)
    }
}

impl Transport for TcpNet {
    type Listen = TcpListenComm;
    type Send = TcpSendComm;
    type Recv = TcpRecvComm;
    fn devices(&self) -> &[NetDevice] {
        TcpNet::devices(self)
    }
    fn listen(&self, dev: usize) -> Result<(TcpListenComm, [u8; HANDLE_BYTES])> {
        TcpNet::listen(self, dev)
    }
    fn connect(&self, dev: usize, handle: &mut [u8; HANDLE_BYTES]) -> Result<Option<TcpSendComm>> {
        TcpNet::connect(self, dev, handle)
    }
    fn accept(&self, listen: &mut TcpListenComm) -> Result<Option<TcpRecvComm>> {
        TcpNet::accept(self, listen)
    }
}
