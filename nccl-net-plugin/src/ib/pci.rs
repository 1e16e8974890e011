//! PCI distances between a rank (its GPU, or its CPU's NUMA node) and the
//! RDMA ports, in NCCL's path types, from sysfs device paths.
//!
//! A device is described by its canonical sysfs path
//! (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/…`): the root
//! complex (`pci0000:00`), then the chain of PCI functions from the root
//! port down to the device, and its `numa_node`. [`distance`] is a pure
//! function over two such descriptions:
//!
//! - the same function: `LOC`;
//! - below one PCI switch (each side at most a downstream port and the
//!   device below the deepest shared bridge): `PIX`;
//! - below shared bridges, but through more than one switch: `PXB`;
//! - sharing only the root complex, or on another root complex of the
//!   same NUMA node: `PHB`;
//! - on different NUMA nodes: `SYS`.
//!
//! The sysfs root is `HETCCL_SYSFS_ROOT` (default `/sys`), so tests can
//! describe a machine with a directory tree.

use std::path::{Path, PathBuf};

/// NCCL's path types, nearest first (`NCCL_NET_GDR_LEVEL` names them).
/// hetccl computes only `LOC`, `PIX`, `PXB`, `PHB` and `SYS`; the others
/// are accepted as levels and order as in NCCL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// The same device.
    Loc,
    /// NVLink.
    Nvl,
    /// NVLink through a GPU.
    Nvb,
    /// Chip-to-chip link.
    C2c,
    /// At most one PCI switch.
    Pix,
    /// Several PCI switches, not through the host bridge.
    Pxb,
    /// Through another GPU over NVLink (PXN).
    Pxn,
    /// Through the CPU over C2C.
    P2c,
    /// Through the PCI host bridge (same NUMA node).
    Phb,
    /// Across NUMA nodes (the SMP interconnect).
    Sys,
}

const NAMES: [(&str, PathType); 10] = [
    ("LOC", PathType::Loc),
    ("NVL", PathType::Nvl),
    ("NVB", PathType::Nvb),
    ("C2C", PathType::C2c),
    ("PIX", PathType::Pix),
    ("PXB", PathType::Pxb),
    ("PXN", PathType::Pxn),
    ("P2C", PathType::P2c),
    ("PHB", PathType::Phb),
    ("SYS", PathType::Sys),
];

impl PathType {
    /// NCCL's name (`PIX`).
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("?", |(n, _)| n)
    }

    /// A level as NCCL parses `NCCL_NET_GDR_LEVEL`/`NCCL_P2P_LEVEL`: a
    /// path type name, or the old numbers 0 `LOC`, 1 `PIX`, 2 `PXB`,
    /// 3 `PHB`, 4 and above `SYS`. `None`: not a level.
    pub fn parse_level(s: &str) -> Option<Self> {
        let s = s.trim();
        if let Some((_, t)) = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
            return Some(*t);
        }
        if !s.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        let n: u64 = digits.parse().unwrap_or(u64::MAX);
        Some(match n {
            0 => PathType::Loc,
            1 => PathType::Pix,
            2 => PathType::Pxb,
            3 => PathType::Phb,
            _ => PathType::Sys,
        })
    }
}

/// Where a PCI device sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// The root complex (`pci0000:00`).
    pub root: String,
    /// PCI functions from the root port down to the device (`0000:00:01.0`, …).
    pub chain: Vec<String>,
    /// Its NUMA node (`None`: unknown, sysfs says -1).
    pub numa: Option<i32>,
}

/// Whether `s` looks like a PCI function address `dddd:bb:dd.f`.
fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

/// Whether `s` names a PCI root complex, `pcidddd:bb`.
fn is_root(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && s.starts_with("pci")
        && b[7] == b':'
        && b[3..]
            .iter()
            .enumerate()
            .all(|(i, c)| i == 4 || c.is_ascii_hexdigit())
}

impl PciDevice {
    /// Parses a canonical sysfs device path; `None` when it is not below a
    /// PCI root complex (virtual devices such as rxe).
    pub fn from_path(path: &Path, numa: Option<i32>) -> Option<Self> {
        let parts: Vec<String> = path
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let at = parts.iter().position(|p| is_root(p))?;
        let chain: Vec<String> = parts[at + 1..]
            .iter()
            .take_while(|p| is_bdf(p))
            .map(|p| p.to_ascii_lowercase())
            .collect();
        if chain.is_empty() {
            return None;
        }
        Some(Self {
            root: parts[at].to_ascii_lowercase(),
            chain,
            numa,
        })
    }

    /// Reads the device at sysfs path `dev` (a link such as
    /// `<root>/class/infiniband/mlx5_0/device` or
    /// `<root>/bus/pci/devices/0000:17:00.0`): its canonical path and
    /// `numa_node`.
    pub fn read(dev: &Path) -> Option<Self> {
        let real = std::fs::canonicalize(dev).ok()?;
        let numa = std::fs::read_to_string(real.join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|&n| n >= 0);
        Self::from_path(&real, numa)
    }
}

/// Whether two NUMA nodes are the same (unknown on both sides counts as
/// one node: a machine that reports none has one).
fn same_numa(a: Option<i32>, b: Option<i32>) -> bool {
    a == b
}

/// The path type between two PCI devices.
pub fn distance(a: &PciDevice, b: &PciDevice) -> PathType {
    if a.root != b.root {
        return if same_numa(a.numa, b.numa) {
            PathType::Phb
        } else {
            PathType::Sys
        };
    }
    let common = a
        .chain
        .iter()
        .zip(&b.chain)
        .take_while(|(x, y)| x == y)
        .count();
    if common == a.chain.len() && common == b.chain.len() {
        return PathType::Loc;
    }
    if common == 0 {
        return PathType::Phb;
    }
    // Below the deepest shared bridge: a switch's downstream port and the
    // device on each side is one switch; more is a deeper hierarchy.
    if a.chain.len() - common <= 2 && b.chain.len() - common <= 2 {
        PathType::Pix
    } else {
        PathType::Pxb
    }
}

/// Where a rank's buffers live, for choosing a NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Device memory of the GPU at this PCI location.
    Gpu(PciDevice),
    /// Host memory near this NUMA node (`None`: unknown).
    Cpu(Option<i32>),
}

/// The path type from `place` to a NIC, `None` when unknown (the NIC has
/// no PCI location, or neither side knows its NUMA node).
pub fn place_distance(place: &Place, nic: Option<&PciDevice>) -> Option<PathType> {
    let nic = nic?;
    match place {
        Place::Gpu(g) => Some(distance(g, nic)),
        Place::Cpu(None) => None,
        Place::Cpu(Some(n)) => nic.numa.map(|m| {
            if m == *n {
                PathType::Phb
            } else {
                PathType::Sys
            }
        }),
    }
}

/// The indices of the NICs nearest to `place`: those at the smallest known
/// distance; every NIC when no distance is known.
pub fn nearest(place: &Place, nics: &[Option<PciDevice>]) -> Vec<usize> {
    let d: Vec<Option<PathType>> = nics
        .iter()
        .map(|n| place_distance(place, n.as_ref()))
        .collect();
    match d.iter().flatten().min() {
        Some(best) => (0..nics.len()).filter(|&i| d[i] == Some(*best)).collect(),
        None => (0..nics.len()).collect(),
    }
}

/// The sysfs root (`HETCCL_SYSFS_ROOT`, default `/sys`).
pub fn sysfs_root() -> PathBuf {
    hetccl_core::config::get()
        .sysfs_root
        .clone()
        .map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

/// The PCI location of the device with bus id `bus_id` (`0000:17:00.0`,
/// as `cuDeviceGetPCIBusId` writes it).
pub fn device_by_bus_id(root: &Path, bus_id: &str) -> Option<PciDevice> {
    PciDevice::read(
        &root
            .join("bus/pci/devices")
            .join(bus_id.trim().to_ascii_lowercase()),
    )
}

/// The NUMA node the calling thread runs on (`None`: unknown).
pub fn current_numa_node() -> Option<i32> {
    let (mut cpu, mut node) = (0u32, 0u32);
    // SAFETY: getcpu writes two unsigned ints; the cache argument may be NULL.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut u32,
            &mut node as *mut u32,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    (r == 0).then_some(node as i32)
}

#[cfg(test)]
mod tests;
