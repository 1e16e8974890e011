use std::path::{Path, PathBuf};

use super::*;

/// A synthetic sysfs tree: `devices/<root>/<chain…>` directories with a
/// `numa_node` file, and links from `bus/pci/devices/<bdf>` and
/// `class/infiniband/<name>/device`.
struct FakeSys {
    root: PathBuf,
}

impl FakeSys {
    fn new(tag: &str) -> Self {
        let root = std::env::temp_dir().join(format!("hetccl-pci-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Self { root }
    }

    /// Adds a device at `path` (`pci0000:00/0000:00:01.0/…`) on `numa`.
    fn dev(&self, path: &str, numa: i32) -> PathBuf {
        let d = self.root.join("devices").join(path);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("numa_node"), format!("{numa}\n")).unwrap();
        let bdf = path.rsplit('/').next().unwrap();
        let bus = self.root.join("bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        let _ = std::os::unix::fs::symlink(&d, bus.join(bdf));
        d
    }

    fn nic(&self, name: &str, path: &str, numa: i32) -> Option<PciDevice> {
        let d = self.dev(path, numa);
        let c = self.root.join("class/infiniband").join(name);
        std::fs::create_dir_all(&c).unwrap();
        std::os::unix::fs::symlink(&d, c.join("device")).unwrap();
        PciDevice::read(&c.join("device"))
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

// One machine: two sockets. Socket 0 (root pci0000:00): a PCI switch under
// root port 00:01.0 (upstream 01:00.0, downstream ports 02:08.0 and
// 02:10.0) with GPU0 at 03:00.0 and mlx5_0 at 04:00.0; a second switch
// level under 02:18.0 with mlx5_1 at 07:00.0; mlx5_2 on its own root port
// 00:02.0. Socket 1 (root pci0000:80, NUMA 1): GPU1 and mlx5_3 on one
// switch.
const GPU0: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0";
const NIC0: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0";
const NIC1: &str =
    "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:18.0/0000:05:00.0/0000:06:00.0/0000:07:00.0";
const NIC2: &str = "pci0000:00/0000:00:02.0/0000:08:00.0";
const GPU1: &str = "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0";
const NIC3: &str = "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:04.0/0000:84:00.0";

fn machine(tag: &str) -> (FakeSys, Vec<Option<PciDevice>>) {
    let s = FakeSys::new(tag);
    s.dev(GPU0, 0);
    s.dev(GPU1, 1);
    let nics = vec![
        s.nic("mlx5_0", NIC0, 0),
        s.nic("mlx5_1", NIC1, 0),
        s.nic("mlx5_2", NIC2, 0),
        s.nic("mlx5_3", NIC3, 1),
    ];
    assert!(nics.iter().all(Option::is_some), "{nics:?}");
    (s, nics)
}

fn gpu(s: &FakeSys, bdf: &str) -> PciDevice {
    device_by_bus_id(&s.root, bdf).expect("GPU in the fake sysfs")
}

#[test]
fn distances_follow_the_pci_tree() {
    let (s, nics) = machine("dist");
    let g0 = gpu(&s, "0000:03:00.0");
    assert_eq!(g0.root, "pci0000:00");
    assert_eq!(g0.numa, Some(0));
    let d: Vec<PathType> = nics
        .iter()
        .map(|n| distance(&g0, n.as_ref().unwrap()))
        .collect();
    use PathType::*;
    assert_eq!(d, vec![Pix, Pxb, Phb, Sys]);
    let g1 = gpu(&s, "0000:83:00.0");
    let d: Vec<PathType> = nics
        .iter()
        .map(|n| distance(&g1, n.as_ref().unwrap()))
        .collect();
    assert_eq!(d, vec![Sys, Sys, Sys, Pix]);
    assert_eq!(distance(&g0, &g0), Loc);
    // Bus ids are trimmed and lower-cased.
    assert_eq!(device_by_bus_id(&s.root, "0000:03:00.0 ").unwrap(), g0);
}

#[test]
fn another_root_complex_is_phb_on_the_same_node_and_sys_across() {
    let a =
        PciDevice::from_path(Path::new("/sys/devices/pci0000:00/0000:00:01.0"), Some(0)).unwrap();
    let b =
        PciDevice::from_path(Path::new("/sys/devices/pci0000:40/0000:40:01.0"), Some(0)).unwrap();
    let c = PciDevice {
        numa: Some(1),
        ..b.clone()
    };
    assert_eq!(distance(&a, &b), PathType::Phb);
    assert_eq!(distance(&a, &c), PathType::Sys);
    // No NUMA information on either side: one node.
    let (a2, b2) = (PciDevice { numa: None, ..a }, PciDevice { numa: None, ..b });
    assert_eq!(distance(&a2, &b2), PathType::Phb);
}

#[test]
fn virtual_devices_have_no_pci_location() {
    assert!(
        PciDevice::from_path(Path::new("/sys/devices/virtual/infiniband/rxe0"), None).is_none()
    );
    assert!(PciDevice::from_path(Path::new("/sys/devices/pci0000:00"), None).is_none());
    // Only `pcidddd:bb` names a root complex.
    assert!(PciDevice::from_path(Path::new("/x/pcibe/0000:00:01.0"), None).is_none());
    let p = PciDevice::from_path(
        Path::new("/sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0"),
        None,
    )
    .unwrap();
    assert_eq!(p.chain, vec!["0000:00:03.0".to_string()]);
    let s = FakeSys::new("virt");
    assert!(PciDevice::read(&s.root.join("class/infiniband/rxe0/device")).is_none());
}

#[test]
fn nearest_nic_by_gpu_then_numa_else_all() {
    let (s, nics) = machine("near");
    assert_eq!(
        nearest(&Place::Gpu(gpu(&s, "0000:03:00.0")), &nics),
        vec![0]
    );
    assert_eq!(
        nearest(&Place::Gpu(gpu(&s, "0000:83:00.0")), &nics),
        vec![3]
    );
    // Host buffers: the NICs of the rank's NUMA node, spread among them.
    assert_eq!(nearest(&Place::Cpu(Some(0)), &nics), vec![0, 1, 2]);
    assert_eq!(nearest(&Place::Cpu(Some(1)), &nics), vec![3]);
    // Unknown topology: every NIC (spread as before).
    assert_eq!(nearest(&Place::Cpu(None), &nics), vec![0, 1, 2, 3]);
    let virt = vec![None, None];
    assert_eq!(
        nearest(&Place::Gpu(gpu(&s, "0000:03:00.0")), &virt),
        vec![0, 1]
    );
    // A known NIC wins over one without a location.
    let mixed = vec![None, nics[2].clone()];
    assert_eq!(nearest(&Place::Cpu(Some(0)), &mixed), vec![1]);
}

#[test]
fn gdr_levels_parse_as_nccl_does() {
    use PathType::*;
    for (s, want) in [
        ("LOC", Loc),
        ("PIX", Pix),
        ("pxb", Pxb),
        ("PHB", Phb),
        ("SYS", Sys),
        ("NVL", Nvl),
        ("PXN", Pxn),
        ("0", Loc),
        ("1", Pix),
        ("2", Pxb),
        ("3", Phb),
        ("4", Sys),
        ("5", Sys),
        ("99", Sys),
    ] {
        assert_eq!(PathType::parse_level(s), Some(want), "{s}");
    }
    assert_eq!(PathType::parse_level("near"), None);
    assert_eq!(PathType::parse_level(""), None);
    assert!(Loc < Pix && Pix < Pxb && Pxb < Phb && Phb < Sys);
    assert_eq!(Pxb.name(), "PXB");
}
