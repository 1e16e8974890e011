//! GPUDirect RDMA in the engine, with bytes moving: device buffers of the
//! emulated CUDA driver (`tests/c/fake_cuda*.c` with `FAKE_CUDA_PEERMEM=1`,
//! so that Soft-RoCE can pin them, as nvidia-peermem lets a NIC pin GPU
//! memory) sent and received between two "nodes" (`HETCCL_HOST_ID`) over a
//! real verbs port. `scripts/rdma-vm.sh` runs this on rxe inside a VM with
//! `HETCCL_REQUIRE_RDMA=1`; elsewhere it says so and passes.
//!
//! The ranks (2 on 2 host ids, and 2 × 2) run `tests/c/device_check*.c`
//! (every result checked, the bytes after each output too) with a sysfs
//! view in which `nvidia_peermem` is loaded, `NCCL_NET_GDR_LEVEL=SYS` (rxe
//! has no PCI place) and DMA-BUF off (rxe cannot import one). Asserted per
//! rank: its peers' links send to it by rendezvous only, its GPU's buffers
//! are registered in place on the port, and its cross-node sends and
//! receives of device memory took the in-place path, while collectives,
//! self-sends and sends to a neighbour on the same host (shm, in the same
//! group) stayed staged. Untested here: a real GPU's memory and its driver
//! (docs/rdma.md).

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

/// A job of `n` ranks, `per_node` per host id, on device buffers of the
/// emulated driver, GPUDirect allowed on the verbs port; `sys` is the
/// sysfs view ([`sysfs_with_peermem`]).
fn job(label: &str, n: usize, per_node: usize, modes: &str, sys: &str) -> Job {
    let lib = fake_cuda::fake_cuda_dir(TAG).display().to_string();
    Job::new(label, n, modes)
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAKE_CUDA_PEERMEM", "1")
        .env("HETCCL_SYSFS_ROOT", sys)
        .env("HETCCL_NET", "ib")
        .env("NCCL_NET_GDR_LEVEL", "SYS")
        .env("NCCL_DMABUF_ENABLE", "0")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,COLL,NET")
        .rank_env(move |r, _| vec![("HETCCL_HOST_ID".into(), format!("node{}", r / per_node))])
}

const IN_PLACE: &str = ": in place over GPUDirect RDMA";
const STAGED: &str = ": staged through host memory";

/// Asserts what every rank of `o` logged: rendezvous-only verbs links, its
/// GPU registered in place, and at least `sends` sends and `recvs`
/// receives in place and `staged` sends staged.
fn assert_paths(o: &Outcome, sends: usize, recvs: usize, staged: usize) {
    for r in 0..o.outs.len() {
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
        let (s, v) = (count(o, r, "send", IN_PLACE), count(o, r, "recv", IN_PLACE));
        let (ss, sv) = (count(o, r, "send", STAGED), count(o, r, "recv", STAGED));
        eprintln!("rank {r}: in place {s} sends, {v} receives; staged {ss} sends, {sv} receives");
        assert!(
            s >= sends && v >= recvs,
            "rank {r}: {s} sends, {v} receives in place"
        );
        assert!(
            ss >= staged && sv >= staged,
            "rank {r}: {ss} sends, {sv} receives staged"
        );
        assert_eq!(count(o, r, "allreduce", IN_PLACE), 0, "rank {r}");
    }
}

#[test]
fn device_sends_and_receives_cross_verbs_in_place() {
    // Compiled before the check: the host's run fills the C program cache
    // that the VM's run reads (gcc under emulation is slow).
    let exe = fake_cuda::device_check(TAG);
    if !have_rdma() {
        return;
    }
    let sys = sysfs_with_peermem().display().to_string();
    let jobs = vec![
        job("gdr 2 ranks, 2 hosts", 2, 1, "coll,sendrecv,pinned", &sys),
        job("gdr 4 ranks, 2 hosts", 4, 2, "sendrecv", &sys),
    ];
    let out = coll::run_all(TAG, exe, &hetccl_so(), jobs);
    // 2 ranks: sendrecv's 2 messages each way with the peer (2 with
    // itself, staged) and coll's send/recv ring at 4 counts, in place;
    // collectives staged.
    assert_paths(&out[0], 6, 6, 2);
    for r in 0..2 {
        assert!(count(&out[0], r, "allreduce", STAGED) >= 4, "rank {r}");
    }
    // 2 x 2: 2 messages with each of the 2 peers on the other host in
    // place; with itself and its neighbour (shm) staged, in the same group.
    assert_paths(&out[1], 4, 4, 4);
}
