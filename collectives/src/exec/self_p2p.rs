//! Sends to and receives from one's own rank.
//!
//! NCCL allows `ncclSend(..., peer = myrank)` matched by a
//! `ncclRecv(..., peer = myrank)` in the same group (PyTorch's all-to-all
//! loops over every peer, self included). No link is involved: the k-th
//! self-send of a batch is paired with its k-th self-receive and the pair
//! becomes one local copy.

use std::sync::Arc;

use hetccl_abi::DataType;

use super::{Job, OpBuffers};
use crate::algo::{Algorithm, BufId, BufRange, Collective, Plan, Step, StepKind};
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;

fn plan(
    coll: Collective,
    rank: usize,
    nranks: usize,
    dtype: DataType,
    send: usize,
    recv: usize,
    steps: Vec<Step>,
) -> Plan {
    Plan {
        collective: coll,
        algorithm: Algorithm::Direct,
        rank: rank as u32,
        nranks: nranks as u32,
        dtype,
        op: ReduceOp::Sum,
        send_bytes: send,
        recv_bytes: recv,
        scratch_bytes: 0,
        steps,
        wire: hetccl_core::config::Compression::Off,
    }
}

/// The placeholder plan of one self-send or self-receive of `bytes`.
pub fn half(coll: Collective, rank: usize, nranks: usize, dtype: DataType, bytes: usize) -> Plan {
    let (s, r) = if coll == Collective::Send {
        (bytes, 0)
    } else {
        (0, bytes)
    };
    plan(coll, rank, nranks, dtype, s, r, Vec::new())
}

/// Replaces each matched self-send/self-receive pair of `jobs` with one copy
/// job (at the receive's position). Unmatched halves, or halves of
/// different sizes, are an error.
pub fn pair(jobs: Vec<Job>) -> Result<Vec<Job>> {
    if !jobs.iter().any(|j| j.self_p2p) {
        return Ok(jobs);
    }
    let mut sends: std::collections::VecDeque<Job> = Default::default();
    let mut recvs: Vec<(usize, Job)> = Vec::new();
    let mut out: Vec<Option<Job>> = Vec::with_capacity(jobs.len());
    for j in jobs {
        if !j.self_p2p {
            out.push(Some(j));
        } else if j.plan.collective == Collective::Send {
            sends.push_back(j);
        } else {
            recvs.push((out.len(), j));
            out.push(None);
        }
    }
    if sends.len() != recvs.len() {
        return Err(Error::usage(format!(
            "{} send(s) to self but {} receive(s) from self in the same group",
            sends.len(),
            recvs.len()
        )));
    }
    for (pos, r) in recvs {
        let s = sends.pop_front().expect("counted");
        let n = s.plan.send_bytes;
        if n != r.plan.recv_bytes {
            return Err(Error::usage(format!(
                "a send to self of {n} bytes is matched with a receive from self of {} bytes",
                r.plan.recv_bytes
            )));
        }
        let copy = Step {
            kind: StepKind::Copy {
                src: BufRange::new(BufId::Send, 0, n),
                dst: BufRange::new(BufId::Recv, 0, n),
            },
            deps: Vec::new(),
        };
        let p = &r.plan;
        out[pos] = Some(Job {
            plan: Arc::new(plan(
                Collective::Recv,
                p.rank as usize,
                p.nranks as usize,
                p.dtype,
                n,
                n,
                vec![copy],
            )),
            bufs: OpBuffers {
                send: s.bufs.send,
                recv: r.bufs.recv,
                scratch: Vec::new(),
                staged_send: Vec::new(),
            },
            p2p: true,
            trace: r.trace,
            self_p2p: false,
            fingerprint: None,
        });
    }
    Ok(out.into_iter().flatten().collect())
}
