//! This host's processing units and NUMA nodes, through hwloc (cargo
//! feature `hwloc`) or, without it, the OS's CPU count and sysfs.
//!
//! Used to decide how ranks wait: when a node runs more ranks than it has
//! processing units, spinning only steals time from the rank being waited
//! for, so waits go straight to the doorbell.

use once_cell::sync::Lazy;

/// What hetccl knows about the host's hardware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// Processing units (hardware threads) this process may run on.
    pub pus: usize,
    /// Physical cores.
    pub cores: usize,
    /// NUMA nodes.
    pub numa_nodes: usize,
    /// Where the figures came from ("hwloc" or "fallback").
    pub source: &'static str,
}

fn numa_from_sysfs() -> usize {
    std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with("node")
                        && n[4..].chars().all(|c| c.is_ascii_digit())
                        && n.len() > 4
                })
                .count()
        })
        .unwrap_or(0)
        .max(1)
}

fn probe() -> HostInfo {
    let fallback = || {
        // The machine's online processors, not this process's affinity mask:
        // ranks bound one per core (`mpirun --bind-to core`, `hetccl-perf
        // -np`) each see one CPU, yet the node is not oversubscribed.
        // SAFETY: sysconf has no memory arguments.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let n = usize::try_from(online)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
        HostInfo {
            pus: n,
            cores: n,
            numa_nodes: numa_from_sysfs(),
            source: "fallback",
        }
    };
    probe_hwloc().unwrap_or_else(fallback)
}

#[cfg(not(feature = "hwloc"))]
fn probe_hwloc() -> Option<HostInfo> {
    None
}

#[cfg(feature = "hwloc")]
fn probe_hwloc() -> Option<HostInfo> {
    let t = hwloc2::Topology::new()?;
    let count = |ty: hwloc2::ObjectType| t.objects_with_type(&ty).map(|v| v.len()).unwrap_or(0);
    let (pus, cores) = (
        count(hwloc2::ObjectType::PU),
        count(hwloc2::ObjectType::Core),
    );
    if pus == 0 {
        return None;
    }
    // hwloc 2 keeps NUMA nodes at a virtual depth that this binding cannot
    // address, so their count comes from sysfs.
    Some(HostInfo {
        pus,
        cores: cores.max(1),
        numa_nodes: numa_from_sysfs(),
        source: "hwloc",
    })
}

/// The host's hardware, probed once per process.
pub fn host_info() -> &'static HostInfo {
    static INFO: Lazy<HostInfo> = Lazy::new(probe);
    &INFO
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_agrees_with_the_os() {
        let h = host_info();
        assert!(h.pus >= 1 && h.cores >= 1 && h.numa_nodes >= 1);
        assert!(h.cores <= h.pus);
        let os = std::thread::available_parallelism().unwrap().get();
        assert!(h.pus >= os.min(h.pus), "{h:?} vs {os}");
        let want = if cfg!(feature = "hwloc") {
            "hwloc"
        } else {
            "fallback"
        };
        assert_eq!(h.source, want);
    }
}
