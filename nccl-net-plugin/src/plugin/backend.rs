//! The transport behind the plugin tables: verbs when RDMA ports are present
//! and not disabled, else TCP (`HETCCL_NET=ib|socket` forces one). The
//! choice is made once per process; these enums dispatch to it.

use std::sync::Arc;

use once_cell::sync::OnceCell;

use crate::error::{NetError, Result};
use crate::ib::mr::Mr;
use crate::ib::{IbListenComm, IbNet, IbPort, IbRecvComm, IbSendComm};
use crate::tcp::{
    RecvBuf, RecvRequest, RecvSizes, SendRequest, TcpListenComm, TcpNet, TcpRecvComm, TcpSendComm,
};
use crate::wire::HANDLE_BYTES;

/// Which transport the plugin serves.
#[derive(Debug, Clone)]
pub enum Backend {
    /// TCP over the interfaces.
    Tcp,
    /// Verbs over these ports.
    Ib(Vec<IbPort>),
}

/// The backend of this process, chosen once.
pub fn backend() -> &'static Backend {
    static B: OnceCell<Backend> = OnceCell::new();
    B.get_or_init(|| {
        let cfg = hetccl_core::config::get();
        let forced = cfg.hetccl_net.as_deref();
        if forced == Some("socket") {
            return Backend::Tcp;
        }
        if cfg.ib_disable && forced != Some("ib") {
            tracing::info!(target: "hetccl::NET", "NET/hetccl: NCCL_IB_DISABLE=1, using TCP");
            return Backend::Tcp;
        }
        let ports = crate::ib::usable_ports(&discover_opts(cfg));
        if ports.is_empty() {
            if forced == Some("ib") {
                tracing::warn!(target: "hetccl::NET", "NET/hetccl: HETCCL_NET=ib but no active RDMA port; no devices");
                return Backend::Ib(Vec::new());
            }
            tracing::info!(target: "hetccl::NET", "NET/hetccl: no active RDMA port, using TCP");
            return Backend::Tcp;
        }
        Backend::Ib(ports)
    })
}

/// The discovery options of a configuration.
pub fn discover_opts(cfg: &hetccl_core::config::Config) -> crate::ib::DiscoverOpts {
    crate::ib::DiscoverOpts {
        hca: cfg.ib_hca.clone(),
        gid_index: cfg.ib_gid_index,
    }
}

/// A plugin context's transport.
#[derive(Debug)]
pub enum Net {
    /// TCP.
    Tcp(TcpNet),
    /// Verbs.
    Ib(IbNet),
}

/// A listen comm.
pub enum AnyListen {
    /// TCP.
    Tcp(TcpListenComm),
    /// Verbs.
    Ib(IbListenComm),
}

/// A send comm (the verbs one is large, and comms are boxed by the
/// plugin anyway).
#[allow(clippy::large_enum_variant)]
pub enum AnySend {
    /// TCP.
    Tcp(TcpSendComm),
    /// Verbs.
    Ib(IbSendComm),
}

/// A receive comm.
#[allow(clippy::large_enum_variant)]
pub enum AnyRecv {
    /// TCP.
    Tcp(TcpRecvComm),
    /// Verbs.
    Ib(IbRecvComm),
}

impl Net {
    /// Listens on `dev`.
    pub fn listen(&self, dev: usize) -> Result<(AnyListen, [u8; HANDLE_BYTES])> {
        Ok(match self {
            Self::Tcp(n) => n.listen(dev).map(|(l, h)| (AnyListen::Tcp(l), h))?,
            Self::Ib(n) => n.listen(dev).map(|(l, h)| (AnyListen::Ib(l), h))?,
        })
    }
    /// Connects (non-blocking).
    pub fn connect(&self, dev: usize, h: &mut [u8; HANDLE_BYTES]) -> Result<Option<AnySend>> {
        Ok(match self {
            Self::Tcp(n) => n.connect(dev, h)?.map(AnySend::Tcp),
            Self::Ib(n) => n.connect(dev, h)?.map(AnySend::Ib),
        })
    }
    /// Accepts (non-blocking).
    pub fn accept(&self, l: &mut AnyListen) -> Result<Option<AnyRecv>> {
        Ok(match (self, l) {
            (Self::Tcp(n), AnyListen::Tcp(l)) => n.accept(l)?.map(AnyRecv::Tcp),
            (Self::Ib(n), AnyListen::Ib(l)) => n.accept(l)?.map(AnyRecv::Ib),
            _ => {
                return Err(NetError::Internal(
                    "listen comm of another transport".into(),
                ))
            }
        })
    }
    /// Stops helper threads and pending connects.
    pub fn shutdown(&self) {
        match self {
            Self::Tcp(n) => n.shutdown(),
            Self::Ib(n) => n.shutdown(),
        }
    }
}

impl AnySend {
    /// Posts a send.
    ///
    /// # Safety
    /// As `TcpSendComm::isend`.
    pub unsafe fn isend(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
        mr: Option<Arc<Mr>>,
    ) -> Result<Option<SendRequest>> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Self::Tcp(c) => c.isend(ptr, size, tag),
                Self::Ib(c) => c.isend(ptr, size, tag, mr),
            }
        }
    }
    /// Tests a send.
    pub fn test(&self, r: SendRequest) -> Result<Option<usize>> {
        match self {
            Self::Tcp(c) => c.test(r),
            Self::Ib(c) => c.test(r),
        }
    }
    /// Closes gracefully.
    pub fn close(self) {
        match self {
            Self::Tcp(c) => c.close(),
            Self::Ib(c) => c.close(),
        }
    }
    /// The port of a verbs comm.
    pub fn ib_port(&self) -> Option<&IbPort> {
        match self {
            Self::Tcp(_) => None,
            Self::Ib(c) => Some(&c.ep.port),
        }
    }
}

impl AnyRecv {
    /// Posts a grouped receive.
    ///
    /// # Safety
    /// As `TcpRecvComm::irecv`.
    pub unsafe fn irecv(
        &self,
        bufs: &[RecvBuf],
        mrs: &[Option<Arc<Mr>>],
        hint: bool,
    ) -> Result<Option<RecvRequest>> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Self::Tcp(c) => c.irecv(bufs, hint),
                Self::Ib(c) => c.irecv(bufs, mrs),
            }
        }
    }
    /// Tests a receive.
    pub fn test(&self, r: RecvRequest) -> Result<Option<RecvSizes>> {
        match self {
            Self::Tcp(c) => c.test(r),
            Self::Ib(c) => c.test(r),
        }
    }
    /// Closes.
    pub fn close(self) {
        match self {
            Self::Tcp(c) => c.close(),
            Self::Ib(c) => c.close(),
        }
    }
    /// The port of a verbs comm.
    pub fn ib_port(&self) -> Option<&IbPort> {
        match self {
            Self::Tcp(_) => None,
            Self::Ib(c) => Some(&c.ep.port),
        }
    }
}
