//! `HETCCL_NCCL_FALLBACK` with NVIDIA's real `libnccl.so.2` (from the wheel
//! `scripts/fetch-nvidia-headers.sh` caches): a device-side call is forwarded,
//! which first builds the mirror communicator (rank 0 asks the fallback for a
//! unique id, our broadcast carries it, every rank calls the fallback's
//! `ncclCommInitRank`). Without a GPU NVIDIA's init fails, and that failure
//! must come back as an error naming the fallback, not a crash or a hang.
//! With a GPU the call may succeed; either way the forwarding path ran.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::ptr::null_mut;

use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::comm_init::*;
use hetccl_collectives::api::comm_life::*;
use hetccl_collectives::api::device::*;
use hetccl_collectives::api::version::ncclGetLastError;
use hetccl_collectives::gpu::driver;

fn nvidia_nccl() -> Option<PathBuf> {
    let dir = std::env::var_os("HETCCL_NCCL_LIB")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("HETCCL_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hetccl"))
                })?;
            Some(cache.join("ext/nvidia/nccl/lib"))
        })?;
    let p = dir.join("libnccl.so.2");
    p.exists().then_some(p)
}

fn last_error() -> String {
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn device_calls_are_forwarded_through_a_mirror_communicator() {
    let Some(lib) = nvidia_nccl() else {
        eprintln!(
            "skipping: NVIDIA's libnccl.so.2 not cached (run scripts/fetch-nvidia-headers.sh)"
        );
        return;
    };
    // Before anything reads the configuration.
    std::env::set_var("HETCCL_NCCL_FALLBACK", &lib);
    std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("HETCCL_TIMEOUT_S", "60");
    let mut comm: ncclComm_t = null_mut();
    let devs = [0i32];
    assert_eq!(
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        unsafe { ncclCommInitAll(&mut comm, 1, devs.as_ptr()) },
        0,
        "{}",
        last_error()
    );
    let mut reqs = [0u8; 256];
    let mut out = [0u8; 256];
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let r = unsafe {
        ncclDevCommCreate(
            comm,
            reqs.as_mut_ptr() as *const c_void,
            out.as_mut_ptr() as *mut c_void,
        )
    };
    if !driver::available() {
        assert_ne!(r, 0, "NVIDIA's NCCL cannot init without a GPU");
        let msg = last_error();
        eprintln!("forwarded call failed as expected without a GPU: {msg}");
        assert!(msg.contains("NVIDIA's NCCL"), "{msg}");
        assert!(msg.contains("mirror communicator"), "{msg}");
        assert!(
            !msg.contains("HETCCL_NCCL_FALLBACK;"),
            "the fallback was not used: {msg}"
        );
    }
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
}
