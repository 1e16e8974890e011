//! RDMA devices and ports: discovery (once per process), `NCCL_IB_HCA`
//! selection, GID choice (`NCCL_IB_GID_INDEX`, auto preferring RoCE v2 over
//! IPv4), and what sysfs says (PCI path, speed).

use std::ffi::CStr;
use std::sync::Arc;

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use super::ffi::{self, ibv_context, ibv_gid, ibv_pd, Verbs};
use super::mr::RegCache;
use crate::error::{NetError, Result};

/// One opened device: its context and protection domain, shared by every
/// port and comm on it.
pub struct DevCtx {
    /// The device name (`mlx5_0`, `rxe0`).
    pub name: String,
    pub(crate) ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    /// The registration cache of this protection domain.
    pub(crate) regs: Mutex<RegCache>,
}

// SAFETY: verbs objects are thread-safe (libibverbs locks internally); the
// raw pointers are only passed to libibverbs.
unsafe impl Send for DevCtx {}
// SAFETY: as above.
unsafe impl Sync for DevCtx {}

impl std::fmt::Debug for DevCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevCtx({})", self.name)
    }
}

/// One usable port: a device of the plugin, a rail of the engine.
#[derive(Debug, Clone)]
pub struct IbPort {
    /// The opened device.
    pub dev: Arc<DevCtx>,
    /// Port number (1-based).
    pub port: u8,
    /// `IBV_LINK_LAYER_INFINIBAND` or `_ETHERNET`.
    pub link_layer: u8,
    /// The port's LID (InfiniBand).
    pub lid: u16,
    /// The GID index used and its GID.
    pub gid_index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// The active MTU (`enum ibv_mtu`: 1 = 256 … 5 = 4096).
    pub mtu: u32,
    /// Speed in Mbps from the active speed and width.
    pub speed_mbps: i32,
    /// The node GUID (host order).
    pub guid: u64,
    /// The canonical sysfs device path, `None` for a virtual device (rxe).
    pub pci_path: Option<String>,
    /// Its place in the PCI tree, `None` for a virtual device.
    pub pci: Option<super::pci::PciDevice>,
}

impl IbPort {
    /// `dev:port`, as in logs and `NCCL_IB_HCA`.
    pub fn label(&self) -> String {
        format!("{}:{}", self.dev.name, self.port)
    }

    /// What two ports must share to reach each other: the link layer and,
    /// on InfiniBand, the GID subnet prefix.
    pub fn fabric(&self) -> [u8; 9] {
        let mut f = [0u8; 9];
        f[0] = self.link_layer;
        if self.link_layer == ffi::IBV_LINK_LAYER_INFINIBAND {
            f[1..].copy_from_slice(&self.gid[..8]);
        }
        f
    }
}

/// One `NCCL_IB_HCA` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HcaEntry {
    name: String,
    port: Option<u8>,
}

/// `NCCL_IB_HCA`: `[^][=]name[:port][,name[:port]]...`; names are prefixes
/// unless `=` asks for exact ones, `^` excludes the listed ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parses the variable's value (empty entries are skipped).
    pub fn parse(s: &str) -> Self {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let entries = s
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| match e.split_once(':') {
                Some((n, p)) => HcaEntry {
                    name: n.to_string(),
                    port: p.trim().parse().ok(),
                },
                None => HcaEntry {
                    name: e.to_string(),
                    port: None,
                },
            })
            .collect();
        Self {
            exclude,
            exact,
            entries,
        }
    }

    /// Whether port `port` of device `dev` is selected.
    pub fn selects(&self, dev: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let hit = self.entries.iter().any(|e| {
            let name_ok = if self.exact {
                e.name == dev
            } else {
                dev.starts_with(&e.name)
            };
            name_ok && e.port.is_none_or(|p| p == port)
        });
        hit != self.exclude
    }
}

/// What discovery takes from the configuration.
#[derive(Debug, Clone, Default)]
pub struct DiscoverOpts {
    /// `NCCL_IB_HCA`.
    pub hca: Option<String>,
    /// `NCCL_IB_GID_INDEX` (`None`: auto).
    pub gid_index: Option<i32>,
}

/// Mbps per lane of `active_speed`, times the lanes of `active_width`.
fn speed_mbps(speed: u8, width: u8) -> i32 {
    let lane = match speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => 10_000,
    };
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    lane * lanes
}

fn sysfs(dev: &str, rest: &str) -> Option<String> {
    let root = super::pci::sysfs_root();
    std::fs::read_to_string(root.join("class/infiniband").join(dev).join(rest))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The rank of a GID for auto selection (higher is better; 0: unusable).
fn gid_rank(gid: &[u8; 16], ty: Option<&str>, link_layer: u8) -> u8 {
    if gid.iter().all(|&b| b == 0) {
        return 0;
    }
    if link_layer == ffi::IBV_LINK_LAYER_INFINIBAND {
        return 1;
    }
    let v2 = ty.is_some_and(|t| t.contains("v2"));
    let v4 = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let link_local = gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80;
    match (v2, v4, link_local) {
        (true, true, _) => 5,
        (true, false, false) => 4,
        (true, false, true) => 3,
        (false, _, false) => 2,
        _ => 1,
    }
}

/// Picks the GID index of a port: the configured one, else the best by
/// [`gid_rank`].
fn pick_gid(
    v: &Verbs,
    ctx: *mut ibv_context,
    dev: &str,
    port: u8,
    tbl: i32,
    ll: u8,
    want: Option<i32>,
) -> Option<(u8, [u8; 16])> {
    let query = |i: i32| {
        let mut g = ibv_gid::default();
        // SAFETY: a live context and an out pointer.
        (unsafe { (v.query_gid)(ctx, port, i, &mut g) } == 0).then_some(g.raw)
    };
    if let Some(i) = want {
        return query(i).map(|g| (i as u8, g));
    }
    let mut best: Option<(u8, u8, [u8; 16])> = None;
    for i in 0..tbl.clamp(0, 256) {
        let Some(g) = query(i) else { continue };
        let ty = sysfs(dev, &format!("ports/{port}/gid_attrs/types/{i}"));
        let r = gid_rank(&g, ty.as_deref(), ll);
        if r > 0 && best.is_none_or(|(br, _, _)| r > br) {
            best = Some((r, i as u8, g));
        }
    }
    best.map(|(_, i, g)| (i, g))
}

/// Opens every device and lists its active ports that `opts` selects.
fn discover(v: &'static Verbs, opts: &DiscoverOpts) -> Vec<IbPort> {
    let filter = HcaFilter::parse(opts.hca.as_deref().unwrap_or(""));
    let mut n = 0;
    // SAFETY: an out pointer; the list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n devices.
        let d = unsafe { *list.add(i) };
        // SAFETY: a device of the list; the name is a static C string.
        let name = unsafe { CStr::from_ptr((v.get_device_name)(d)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above.
        let ctx = unsafe { (v.open_device)(d) };
        if ctx.is_null() {
            tracing::info!(target: "hetccl::NET", "NET/IB: cannot open {name}");
            continue;
        }
        // SAFETY: zeroed plain data, filled by the call.
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context and an out pointer.
        if unsafe { (v.query_device)(ctx, &mut attr) } != 0 {
            // SAFETY: opened above.
            unsafe { (v.close_device)(ctx) };
            continue;
        }
        // SAFETY: the device of the list.
        let guid = u64::from_be(unsafe { (v.get_device_guid)(d) });
        let sys_dev = super::pci::sysfs_root()
            .join("class/infiniband")
            .join(&name)
            .join("device");
        let pci_path = std::fs::canonicalize(&sys_dev)
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        let pci = super::pci::PciDevice::read(&sys_dev);
        let mut ports = Vec::new();
        for p in 1..=attr.phys_port_cnt() {
            if !filter.selects(&name, p) {
                continue;
            }
            let mut pa = ffi::ibv_port_attr::default();
            // SAFETY: a live context; a zeroed port attribute (the
            // exported call fills the compatible prefix).
            if unsafe { (v.query_port)(ctx, p, &mut pa) } != 0 || pa.state != ffi::IBV_PORT_ACTIVE {
                continue;
            }
            let ll = if pa.link_layer == 0 {
                ffi::IBV_LINK_LAYER_INFINIBAND
            } else {
                pa.link_layer
            };
            let Some((gid_index, gid)) =
                pick_gid(v, ctx, &name, p, pa.gid_tbl_len, ll, opts.gid_index)
            else {
                tracing::info!(target: "hetccl::NET", "NET/IB: {name}:{p} has no usable GID");
                continue;
            };
            ports.push((p, ll, pa, gid_index, gid));
        }
        if ports.is_empty() {
            // SAFETY: opened above, nothing made on it.
            unsafe { (v.close_device)(ctx) };
            continue;
        }
        // SAFETY: a live context.
        let pd = unsafe { (v.alloc_pd)(ctx) };
        if pd.is_null() {
            // SAFETY: opened above.
            unsafe { (v.close_device)(ctx) };
            continue;
        }
        super::events::watch(v, ctx);
        let dev = Arc::new(DevCtx {
            name: name.clone(),
            ctx,
            pd,
            regs: Mutex::new(RegCache::new(super::mr::CACHE_ENTRIES)),
        });
        for (p, ll, pa, gid_index, gid) in ports {
            out.push(IbPort {
                dev: dev.clone(),
                port: p,
                link_layer: ll,
                lid: pa.lid,
                gid_index,
                gid,
                mtu: pa.active_mtu,
                speed_mbps: speed_mbps(pa.active_speed, pa.active_width),
                guid,
                pci_path: pci_path.clone(),
                pci: pci.clone(),
            });
        }
    }
    // SAFETY: the list from get_device_list; opened contexts stay valid.
    unsafe { (v.free_device_list)(list) };
    out
}

static PORTS: OnceCell<Vec<IbPort>> = OnceCell::new();

/// The ports, if discovery has run (it never starts it).
pub fn discovered() -> &'static [IbPort] {
    PORTS.get().map_or(&[], |p| p.as_slice())
}

/// The ports of this process, discovered once with the options of the first
/// call; `Err` when libibverbs cannot be loaded.
pub fn ports(opts: &DiscoverOpts) -> Result<&'static [IbPort]> {
    let v = ffi::verbs().map_err(|e| NetError::System(format!("libibverbs: {e}")))?;
    Ok(PORTS.get_or_init(|| {
        let ports = discover(v, opts);
        for (i, p) in ports.iter().enumerate() {
            tracing::info!(target: "hetccl::NET",
                "NET/IB: port {i}: {} {} GID index {} MTU {} speed {} Mbps{}",
                p.label(),
                if p.link_layer == ffi::IBV_LINK_LAYER_ETHERNET { "RoCE" } else { "IB" },
                p.gid_index, 128u32 << p.mtu.min(5), p.speed_mbps,
                p.pci_path.as_deref().map(|s| format!(" at {s}")).unwrap_or_default());
        }
        ports
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_filter_follows_nccl_syntax() {
        let all = HcaFilter::parse("");
        assert!(all.selects("mlx5_0", 1));
        let f = HcaFilter::parse("mlx5");
        assert!(f.selects("mlx5_0", 1) && f.selects("mlx5_1", 2) && !f.selects("rxe0", 1));
        let f = HcaFilter::parse("=mlx5_0:1,rxe0");
        assert!(f.selects("mlx5_0", 1) && !f.selects("mlx5_0", 2) && !f.selects("mlx5_01", 1));
        assert!(f.selects("rxe0", 1) && f.selects("rxe0", 2));
        let f = HcaFilter::parse("^mlx5_1");
        assert!(f.selects("mlx5_0", 1) && !f.selects("mlx5_1", 1));
        let f = HcaFilter::parse("^=rxe0:1");
        assert!(!f.selects("rxe0", 1) && f.selects("rxe0", 2) && f.selects("rxe01", 1));
    }

    #[test]
    fn gid_auto_prefers_roce_v2_ipv4() {
        let ll = ffi::IBV_LINK_LAYER_ETHERNET;
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&[192, 0, 2, 1]);
        let mut ll6 = [0u8; 16];
        ll6[0] = 0xfe;
        ll6[1] = 0x80;
        ll6[15] = 1;
        let mut g6 = [0u8; 16];
        g6[0] = 0x20;
        g6[15] = 1;
        let v2 = Some("RoCE v2");
        assert!(gid_rank(&v4, v2, ll) > gid_rank(&g6, v2, ll));
        assert!(gid_rank(&g6, v2, ll) > gid_rank(&ll6, v2, ll));
        assert!(gid_rank(&ll6, v2, ll) > gid_rank(&v4, Some("IB/RoCE v1"), ll) - 1);
        assert_eq!(gid_rank(&[0; 16], v2, ll), 0);
        assert_eq!(speed_mbps(32, 2), 100_000, "EDR 4x");
        assert_eq!(speed_mbps(64, 2), 200_000, "HDR 4x");
    }
}
