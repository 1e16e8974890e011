//! `hetcclCommGetStats` on ranks as threads: the argument checks and
//! snprintf-style conventions of `hetcclCommSelectionTable`, and JSON whose
//! counters follow the calls made.

use std::ffi::c_char;
use std::ptr::null_mut;

use hetccl_collectives::api::coll::ncclAllReduce;
use hetccl_collectives::api::ext::hetcclCommGetStats;
use hetccl_testkit::threads::{check, comms, destroy, last_error, on_all};

const FLOAT: i32 = 7;
const SUM: i32 = 0;

fn json(c: hetccl_abi::ncclComm_t) -> serde_json::Value {
    let mut needed = 0usize;
    // SAFETY: a live communicator; NULL buffer with length 0.
    check(unsafe { hetcclCommGetStats(c, null_mut(), 0, &mut needed) });
    let mut buf = vec![1 as c_char; needed + 1];
    // SAFETY: `buf` holds `buf.len()` writable bytes.
    check(unsafe { hetcclCommGetStats(c, buf.as_mut_ptr(), buf.len(), null_mut()) });
    assert_eq!(buf[needed], 0);
    let b: Vec<u8> = buf[..needed].iter().map(|&x| x as u8).collect();
    serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&b)))
}

#[test]
fn stats_are_json_and_follow_the_calls() {
    let cs = comms(2);
    let before = json(cs[0].0);
    assert_eq!(before["nranks"], 2);
    assert_eq!(before["rank"], 0);
    assert_eq!(before["links"][0]["peer"], 1);
    let ar = |j: &serde_json::Value| {
        j["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "allreduce")
            .cloned()
            .unwrap()
    };
    assert_eq!(ar(&before)["calls"], 0);
    for count in [3usize, 5000] {
        on_all(&cs, |_, c| {
            let send = vec![1.0f32; count];
            let mut recv = vec![0.0f32; count];
            // SAFETY: host buffers of `count` floats owned by this thread.
            check(unsafe {
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    count,
                    FLOAT,
                    SUM,
                    c.0,
                    null_mut(),
                )
            });
        });
    }
    let after = json(cs[1].0);
    let a = ar(&after);
    assert_eq!(a["calls"], 2, "{after}");
    assert_eq!(a["bytes"], 4 * (3 + 5000), "{after}");
    // One call in 8 is timed: the first.
    assert_eq!(a["latency_ns"]["count"], 1);
    let by_algo: u64 = a["algorithms"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(by_algo, 2, "{after}");
    let buckets: u64 = a["latency_ns"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[1].as_u64().unwrap())
        .sum();
    assert_eq!(buckets, 1);

    // Truncation keeps the NUL and reports the full length.
    let mut needed = 0usize;
    let mut small = [1 as c_char; 8];
    // SAFETY: `small` holds 8 writable bytes.
    check(unsafe { hetcclCommGetStats(cs[0].0, small.as_mut_ptr(), 8, &mut needed) });
    assert_eq!(small[7], 0);
    assert!(needed > 8);
    // SAFETY: NULL arguments are what is being checked.
    let null_comm = unsafe { hetcclCommGetStats(null_mut(), null_mut(), 0, null_mut()) };
    assert_eq!(null_comm, 4);
    // SAFETY: as above: a NULL buffer with a non-zero length.
    let null_buf = unsafe { hetcclCommGetStats(cs[0].0, null_mut(), 16, null_mut()) };
    assert_eq!(null_buf, 4);
    assert!(last_error().contains("buf"), "{}", last_error());
    destroy(cs);
}
