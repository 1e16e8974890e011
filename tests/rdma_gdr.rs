//! GPUDirect RDMA in the engine, with bytes moving: device buffers of the
//! emulated CUDA driver (`tests/c/fake_cuda*.c` with `FAKE_CUDA_PEERMEM=1`,
//! so that Soft-RoCE can pin them, as nvidia-peermem lets a NIC pin GPU
//! memory) sent and received between two "nodes" (`HETCCL_HOST_ID`) over a
//! real verbs port. `scripts/rdma-vm.sh` runs this on rxe inside a VM with
//! `HETCCL_REQUIRE_RDMA=1`; elsewhere it says so and passes.
//!
//! The ranks run `tests/c/device_check*.c` (every result checked, the
//! bytes after each output too) with a sysfs view in which
//! `nvidia_peermem` is loaded, `NCCL_NET_GDR_LEVEL=SYS` (rxe has no PCI
//! place) and DMA-BUF off (rxe cannot import one). Asserted per rank: the
//! peer's link sends to it by rendezvous only, its GPU's buffers are
//! registered in place on the port, and every cross-node send and receive
//! of device memory took the in-place path, while collectives and
//! self-sends stayed staged. Untested here: a real GPU's memory and its
//! driver (docs/rdma.md).

use std::path::PathBuf;

use hetccl_testkit::coll::{self, Job, Outcome};
use hetccl_testkit::rdma::have_rdma;
use hetccl_testkit::{fake_cuda, hetccl_so, tmp_dir};

const TAG: &str = "rdma_gdr";

/// A sysfs view: the real `/sys` with `nvidia_peermem` among its modules.
fn sysfs_with_peermem() -> PathBuf {
    let root = tmp_dir().join("rdma_gdr_sys");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
    for d in ["class", "devices", "bus", "kernel"] {
        std::os::unix::fs::symlink(format!("/sys/{d}"), root.join(d)).unwrap();
    }
    root
}

/// How many of a rank's `kind` calls (hetccl's lower-case name) ended
/// their path line with `path`.
fn count(o: &Outcome, rank: usize, kind: &str, path: &str) -> usize {
    let r = &o.outs[rank];
    r.stdout
        .lines()
        .chain(r.stderr.lines())
        .filter(|l| l.contains(&format!("hetccl: {kind} count ")) && l.ends_with(path))
        .count()
}

/// Whether a rank logged a line containing every word of `words`.
fn logged(o: &Outcome, rank: usize, words: &[&str]) -> bool {
    let r = &o.outs[rank];
    r.stdout
        .lines()
        .chain(r.stderr.lines())
        .any(|l| words.iter().all(|w| l.contains(w)))
}

#[test]
fn device_sends_and_receives_cross_verbs_in_place() {
    if !have_rdma() {
        return;
    }
    let exe = fake_cuda::device_check(TAG);
    let lib = fake_cuda::fake_cuda_dir(TAG).display().to_string();
    let sys = sysfs_with_peermem().display().to_string();
    let job = Job::new("gdr 2 hosts", 2, "coll,sendrecv,pinned")
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAKE_CUDA_PEERMEM", "1")
        .env("HETCCL_SYSFS_ROOT", &sys)
        .env("HETCCL_NET", "ib")
        .env("NCCL_NET_GDR_LEVEL", "SYS")
        .env("NCCL_DMABUF_ENABLE", "0")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,COLL,NET")
        .rank_env(|r, _| vec![("HETCCL_HOST_ID".into(), format!("node{r}"))]);
    let out = coll::run_all(TAG, exe, &hetccl_so(), vec![job]);
    let o = &out[0];
    const IN_PLACE: &str = ": in place over GPUDirect RDMA";
    const STAGED: &str = ": staged through host memory";
    for r in 0..2 {
        assert!(
            logged(o, r, &["via NET/IB", "rendezvous only"]),
            "rank {r}: no verbs link that sends by rendezvous only"
        );
        assert!(
            logged(
                o,
                r,
                &["NET/IB", "device buffers of GPU 0 in place (PeerMem)"]
            ),
            "rank {r}: its GPU's buffers were not registered in place"
        );
        // sendrecv: 2 messages each way with the peer (and 2 with itself,
        // staged); coll: a ring of one send and one receive per count.
        let (s, v) = (count(o, r, "send", IN_PLACE), count(o, r, "recv", IN_PLACE));
        eprintln!(
            "rank {r}: in place {s} sends, {v} receives; staged {} sends, {} receives",
            count(o, r, "send", STAGED),
            count(o, r, "recv", STAGED)
        );
        assert!(
            s >= 6 && v >= 6,
            "rank {r}: {s} sends, {v} receives in place"
        );
        assert!(
            count(o, r, "send", STAGED) >= 2 && count(o, r, "allreduce", STAGED) >= 4,
            "rank {r}: self-sends and collectives must stay staged"
        );
        assert_eq!(count(o, r, "allreduce", IN_PLACE), 0, "rank {r}");
    }
}
