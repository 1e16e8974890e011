//! Calls with buffers that are not host memory, on a machine without the
//! CUDA driver: refused with `ncclInvalidArgument` and a message saying that
//! device buffers need the driver. With the driver present (the GPU
//! acceptance machine) the same pointers are still refused, as unknown to it.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::coll::*;
use hetccl_collectives::api::comm_init::*;
use hetccl_collectives::api::comm_life::*;
use hetccl_collectives::api::mem::*;
use hetccl_collectives::api::version::ncclGetLastError;
use hetccl_collectives::gpu::driver;

const FLOAT: i32 = 7;
const SUM: i32 = 0;
const INVALID_ARGUMENT: i32 = 4;

fn last_error() -> String {
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

fn one_rank() -> ncclComm_t {
    std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("HETCCL_TIMEOUT_S", "60");
    let mut c: ncclComm_t = null_mut();
    let devs = [0i32];
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let r = unsafe { ncclCommInitAll(&mut c, 1, devs.as_ptr()) };
    assert_eq!(r, 0, "{}", last_error());
    c
}

#[test]
fn device_like_pointers_are_refused_with_a_message_and_host_still_works() {
    let comm = one_rank();
    // Below mmap_min_addr: never host memory, so it can only be a device
    // pointer (or garbage).
    let fake = 0x10000usize as *mut c_void;
    let host = vec![1.0f32; 16];
    let mut out = vec![0.0f32; 16];
    // SAFETY: `fake` is an address the library must classify and refuse
    // before any access; the other buffers are this test's.
    let r = unsafe {
        ncclAllReduce(
            fake,
            out.as_mut_ptr().cast(),
            16,
            FLOAT,
            SUM,
            comm,
            null_mut(),
        )
    };
    assert_eq!(r, INVALID_ARGUMENT);
    let msg = last_error();
    assert!(msg.contains("sendbuff"), "{msg}");
    if !driver::available() {
        assert!(msg.contains("device buffers need the CUDA driver"), "{msg}");
        assert!(msg.contains("libcuda.so.1"), "{msg}");
    }
    // SAFETY: `fake` is an address the library must classify and refuse
    // before any access; the other buffers are this test's.
    let r = unsafe { ncclAllReduce(host.as_ptr().cast(), fake, 16, FLOAT, SUM, comm, null_mut()) };
    assert_eq!(r, INVALID_ARGUMENT);
    assert!(last_error().contains("recvbuff"));
    // The host path is untouched.
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let r = unsafe {
        ncclAllReduce(
            host.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            16,
            FLOAT,
            SUM,
            comm,
            null_mut(),
        )
    };
    assert_eq!(r, 0, "{}", last_error());
    assert_eq!(out, host);
    // Without CUDA, ncclMemAlloc hands out host memory and the device query says -1.
    if !driver::available() {
        let mut p: *mut c_void = null_mut();
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        assert_eq!(unsafe { ncclMemAlloc(&mut p, 4096) }, 0);
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let r = unsafe { ncclAllReduce(p, p, 16, FLOAT, SUM, comm, null_mut()) };
        assert_eq!(r, 0, "{}", last_error());
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        assert_eq!(unsafe { ncclMemFree(p) }, 0);
        let mut dev = 7;
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        assert_eq!(unsafe { ncclCommCuDevice(comm, &mut dev) }, 0);
        assert_eq!(dev, -1);
    }
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
}
