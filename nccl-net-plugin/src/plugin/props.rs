//! Device properties, in one version-independent struct that each adapter
//! copies into its own `ncclNetProperties_vN_t`.

use std::ffi::{c_char, c_int, CString};
use std::sync::Arc;

use hetccl_abi::net::{
    MAX_COLLNET_SIZE, NCCL_NET_DEVICE_HOST, NCCL_NET_DEVICE_INVALID_VERSION, NCCL_PTR_HOST,
};
use once_cell::sync::OnceCell;

use crate::error::{NetError, Result};
use crate::iface::{discover_with, NetDevice};
use crate::tcp::MAX_RECVS;

/// Largest message: 1 GiB, so that every size fits `test()`'s `int`.
pub const MAX_P2P_BYTES: usize = 1 << 30;

/// Properties common to every ABI version.
#[derive(Debug, Clone, Copy)]
pub struct DevProps {
    /// Interface name (a C string that lives as long as the library).
    pub name: *mut c_char,
    /// `/sys` device path, or NULL for a virtual interface.
    pub pci_path: *mut c_char,
    /// Unique per device.
    pub guid: u64,
    /// `NCCL_PTR_HOST`.
    pub ptr_support: c_int,
    /// Mbps.
    pub speed: c_int,
    /// Port number (0).
    pub port: c_int,
    /// µs (0: unknown).
    pub latency: f32,
    /// Most comms.
    pub max_comms: c_int,
    /// Most buffers per grouped receive (v9+; older tables report 1).
    pub max_recvs: c_int,
    /// `NCCL_NET_DEVICE_HOST`.
    pub net_device_type: c_int,
    /// `NCCL_NET_DEVICE_INVALID_VERSION`.
    pub net_device_version: c_int,
    /// This device's index (for `vProps`).
    pub dev: c_int,
    /// Largest point-to-point message.
    pub max_p2p_bytes: usize,
    /// Largest collective message.
    pub max_coll_bytes: usize,
}

struct Table {
    devs: Arc<Vec<NetDevice>>,
    names: Vec<CString>,
    pcis: Vec<Option<CString>>,
    /// Per device: GUID, speed (Mbps), port number (verbs: from the port).
    ids: Vec<(u64, c_int, c_int)>,
    /// Whether the devices are RDMA ports.
    ib: bool,
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

/// The interfaces TCP would use (also where verbs setup sockets listen).
fn tcp_devices() -> Vec<NetDevice> {
    let cfg = hetccl_core::config::get();
    let filter = cfg.socket_iface_filter();
    discover_with(filter.as_ref(), cfg.socket_family)
}

/// The address verbs setup sockets bind: the first TCP interface's.
pub(crate) fn setup_ip() -> std::net::IpAddr {
    static IP: OnceCell<std::net::IpAddr> = OnceCell::new();
    *IP.get_or_init(|| {
        tcp_devices()
            .first()
            .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), |d| {
                d.addr
            })
    })
}

fn ib_table(ports: &[crate::ib::IbPort]) -> Table {
    for (i, p) in ports.iter().enumerate() {
        tracing::info!(target: "hetccl::NET",
            "NET/hetccl: device {i}: NET/IB {} speed {} Mbps{}", p.label(), p.speed_mbps,
            p.pci_path.as_deref().map(|s| format!(" at {s}")).unwrap_or_default());
    }
    Table {
        devs: Arc::new(Vec::new()),
        names: ports.iter().map(|p| cstr(&p.dev.name)).collect(),
        pcis: ports
            .iter()
            .map(|p| p.pci_path.as_deref().map(cstr))
            .collect(),
        ids: ports
            .iter()
            .map(|p| (p.guid, p.speed_mbps, c_int::from(p.port)))
            .collect(),
        ib: true,
    }
}

fn table() -> &'static Table {
    static T: OnceCell<Table> = OnceCell::new();
    T.get_or_init(|| {
        if let super::backend::Backend::Ib(ports) = super::backend::backend() {
            return ib_table(ports);
        }
        let devs = tcp_devices();
        for (i, d) in devs.iter().enumerate() {
            tracing::info!(
                target: "hetccl::NET",
                "NET/hetccl: device {i}: {} {} speed {} Mbps{}",
                d.name,
                d.addr,
                d.speed_mbps,
                d.pci_path.as_deref().map(|p| format!(" at {p}")).unwrap_or_default()
            );
        }
        Table {
            names: devs.iter().map(|d| cstr(&d.name)).collect(),
            pcis: devs
                .iter()
                .map(|d| d.pci_path.as_deref().map(cstr))
                .collect(),
            ids: (0..devs.len())
                .map(|i| (i as u64, devs[i].speed_mbps, 0))
                .collect(),
            ib: false,
            devs: Arc::new(devs),
        }
    })
}

/// The devices (discovered once per process).
pub(crate) fn device_list() -> Result<Arc<Vec<NetDevice>>> {
    let t = table();
    if t.devs.is_empty() {
        return Err(NetError::System(
            "no usable network interface (check NCCL_SOCKET_IFNAME)".into(),
        ));
    }
    Ok(t.devs.clone())
}

/// Number of devices.
pub fn devices() -> Result<c_int> {
    Ok(c_int::try_from(table().names.len()).unwrap_or(c_int::MAX))
}

/// Properties of device `dev`.
pub fn device_props(dev: c_int) -> Result<DevProps> {
    let t = table();
    let i = usize::try_from(dev)
        .ok()
        .filter(|&i| i < t.names.len())
        .ok_or_else(|| {
            NetError::InvalidArgument(format!("device {dev} (have {})", t.names.len()))
        })?;
    let (guid, speed, port) = t.ids[i];
    Ok(DevProps {
        name: t.names[i].as_ptr().cast_mut(),
        pci_path: t.pcis[i]
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.as_ptr().cast_mut()),
        guid,
        ptr_support: match super::backend::backend() {
            super::backend::Backend::Ib(ports) if t.ib => ports
                .get(i)
                .map_or(NCCL_PTR_HOST, crate::ib::gdr::ptr_support),
            _ => NCCL_PTR_HOST,
        },
        speed,
        port,
        latency: 0.0,
        max_comms: 65536,
        max_recvs: MAX_RECVS as c_int,
        net_device_type: NCCL_NET_DEVICE_HOST,
        net_device_version: NCCL_NET_DEVICE_INVALID_VERSION,
        dev,
        max_p2p_bytes: MAX_P2P_BYTES,
        max_coll_bytes: MAX_COLLNET_SIZE,
    })
}
