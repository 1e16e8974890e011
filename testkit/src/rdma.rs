//! Whether this machine has an active RDMA port, for the tests that
//! `scripts/rdma-vm.sh` runs on Soft-RoCE inside a VM.

/// Whether an active RDMA port exists in `/sys/class/infiniband`. Panics
/// under `HETCCL_REQUIRE_RDMA=1` (set inside the VM) when none does;
/// elsewhere says the test is skipped and returns `false`.
pub fn have_rdma() -> bool {
    let active = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten().any(|e| {
                std::fs::read_to_string(e.path().join("ports/1/state"))
                    .is_ok_and(|s| s.contains("ACTIVE"))
            })
        })
        .unwrap_or(false);
    if !active {
        assert!(
            std::env::var("HETCCL_REQUIRE_RDMA").as_deref() != Ok("1"),
            "HETCCL_REQUIRE_RDMA=1 but no active RDMA port in /sys/class/infiniband"
        );
        eprintln!("skipped: no active RDMA port (scripts/rdma-vm.sh runs these on Soft-RoCE)");
    }
    active
}
