//! The soak's per-rank driver: runs the shared sequence of operations on one
//! rank and checks each result (see `tests/soak/main.rs`).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::{coll::*, comm_life::ncclCommAbort, group::*};

use super::soak_ops::*;
pub fn run_rank(
    comm: ncclComm_t,
    rank: usize,
    nops: usize,
    seed: u64,
    sh: &Shared,
    sweep: bool,
) -> RankReport {
    let mut rep = RankReport::default();
    let mut sbuf = Buf::new();
    let mut rbuf = Buf::new();
    let mut scratch = vec![0u8; 64 << 10];
    // Touch every page once so RSS reflects the buffers from the start.
    sbuf.bytes().fill(0);
    rbuf.bytes().fill(FILL);
    let warm_ops = if sweep { sweep_ops(seed) } else { Vec::new() };
    let mut rng = Rng::new(seed);
    let warm = warm_ops_of(nops);
    let verbose = std::env::var_os("HETCCL_SOAK_VERBOSE").is_some();
    let mut last_rss = 0;
    let total = warm_ops.len() + nops;
    for idx in 0..total {
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        let op = if idx < warm_ops.len() {
            Op {
                idx,
                ..warm_ops[idx]
            }
        } else {
            Op::draw(&mut rng, idx)
        };
        let checked = idx >= warm_ops.len();
        match run_op(comm, rank, &op, &mut sbuf, &mut rbuf, &mut scratch, checked) {
            Ok(bad) => {
                if !bad.is_empty() {
                    rep.wrong += 1;
                    if rep.mismatches.len() < 5 {
                        rep.mismatches.push(format!(
                            "rank {rank} {}: {}",
                            op.describe(),
                            bad.join("; ")
                        ));
                    }
                }
            }
            Err((code, msg)) => {
                // A stall is ncclRemoteError "no progress from rank(s) …" since
                // the stall limit became a peer failure; 8 is kept for
                // bootstrap deadlines.
                rep.timed_out = code == 8
                    || msg.contains("no progress")
                    || msg.contains("timed out")
                    || msg.contains("timeout");
                rep.error = Some(format!("rank {rank} {}: code {code}: {msg}", op.describe()));
                sh.stop.store(true, Ordering::Release);
                // Release the other ranks at once instead of at the timeout.
                // SAFETY: every pointer passed is NULL where the API allows it, or memory this
                // test owns for the whole call.
                unsafe { ncclCommAbort(comm) };
                return rep;
            }
        }
        rep.done += usize::from(checked);
        sh.progress.fetch_add(1, Ordering::Relaxed);
        if verbose && rank == 0 {
            // Each operation that grows RSS by more than 1 MiB, and a
            // sample every 500.
            let now = rss_bytes();
            if now > last_rss + (1 << 20) || idx % 500 == 0 {
                eprintln!(
                    "SOAK rank 0 after {}: rss {:.1} MiB",
                    op.describe(),
                    now as f64 / 1048576.0
                );
            }
            last_rss = now;
        }
        if idx + 1 == warm_ops.len() + warm
            && sh.warm_ranks.fetch_add(1, Ordering::AcqRel) + 1 == NRANKS
        {
            sh.warm_rss.store(rss_bytes(), Ordering::Release);
        }
    }
    rep
}

/// Runs one operation and checks it; Ok(list of mismatches) or Err(code, msg).
pub fn run_op(
    comm: ncclComm_t,
    rank: usize,
    op: &Op,
    sbuf: &mut Buf,
    rbuf: &mut Buf,
    scratch: &mut [u8],
    checked: bool,
) -> Result<Vec<String>, (i32, String)> {
    let n = NRANKS;
    let es = DT_SIZE[op.dtype as usize];
    let cb = op.count * es; // bytes of `count` elements
    let is_root = rank == op.root;
    let tab = if op.reduces() {
        table(op.dtype)
    } else {
        Vec::new()
    };
    let (sb, rb) = (sbuf.bytes(), rbuf.bytes());
    // Rank `r`'s input elements [first, first+elems) into `buf`.
    let fill_input = |buf: &mut [u8], r: usize, first: usize, elems: usize| {
        if checked {
            generate(op, &tab, Want::Input { rank: r, first }, elems, buf);
        } else {
            buf[..elems * es].fill(0); // warm-up: zeros, not checked
        }
    };
    let input = |r: usize, first: usize| Want::Input { rank: r, first };

    // (offset in rbuf, what, elements) to check after the call.
    let mut expect: Vec<(usize, Want, usize)> = Vec::new();
    let recv_extent; // bytes of rbuf the op may write (guards follow)
    let mut send_check: Option<usize> = None; // out of place: elements of sbuf to recheck
    rb[..(2 * n * cb).min(MAX_BYTES) + GUARD].fill(FILL);
    let sp = sb.as_mut_ptr();
    let rp = rb.as_mut_ptr();
    let s = null_mut();
    let code;
    // SAFETY (all calls): buffers hold MAX_BYTES + GUARD bytes and every
    // extent below is at most MAX_BYTES.
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    unsafe {
        match op.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce => {
                let has_input = op.kind != Kind::Broadcast || is_root;
                let (send, recv): (*const c_void, *mut c_void) = if op.in_place {
                    if has_input {
                        fill_input(rb, rank, 0, op.count);
                    }
                    (rp as *const c_void, rp as *mut c_void)
                } else {
                    if has_input {
                        fill_input(sb, rank, 0, op.count);
                        send_check = Some(op.count);
                    }
                    (sp as *const c_void, rp as *mut c_void)
                };
                code = match op.kind {
                    Kind::AllReduce => {
                        ncclAllReduce(send, recv, op.count, op.dtype, op.op, comm, s)
                    }
                    Kind::Broadcast if op.in_place && op.idx % 2 == 0 => {
                        ncclBcast(recv, op.count, op.dtype, op.root as i32, comm, s)
                    }
                    Kind::Broadcast => {
                        ncclBroadcast(send, recv, op.count, op.dtype, op.root as i32, comm, s)
                    }
                    _ => ncclReduce(
                        send,
                        recv,
                        op.count,
                        op.dtype,
                        op.op,
                        op.root as i32,
                        comm,
                        s,
                    ),
                };
                recv_extent = cb;
                let want = match op.kind {
                    Kind::AllReduce => Want::Reduced { first: 0 },
                    Kind::Broadcast => input(op.root, 0),
                    _ if is_root => Want::Reduced { first: 0 },
                    // Non-root: recv untouched (in place: still its input).
                    _ if op.in_place => input(rank, 0),
                    _ => Want::Fill,
                };
                expect.push((0, want, op.count));
            }
            Kind::AllGather => {
                let send = if op.in_place {
                    fill_input(&mut rb[rank * cb..], rank, 0, op.count);
                    rp.add(rank * cb)
                } else {
                    fill_input(sb, rank, 0, op.count);
                    send_check = Some(op.count);
                    sp
                };
                code = ncclAllGather(
                    send as *const c_void,
                    rp as *mut c_void,
                    op.count,
                    op.dtype,
                    comm,
                    s,
                );
                recv_extent = n * cb;
                for r in 0..n {
                    expect.push((r * cb, input(r, 0), op.count));
                }
            }
            Kind::ReduceScatter => {
                // Input: n*count elements; rank r's output is elements
                // [r*count, (r+1)*count) of the reduction.
                let (send, recv, out_off) = if op.in_place {
                    fill_input(rb, rank, 0, n * op.count);
                    (rp, rp.add(rank * cb), rank * cb)
                } else {
                    fill_input(sb, rank, 0, n * op.count);
                    send_check = Some(n * op.count);
                    (sp, rp, 0)
                };
                code = ncclReduceScatter(
                    send as *const c_void,
                    recv as *mut c_void,
                    op.count,
                    op.dtype,
                    op.op,
                    comm,
                    s,
                );
                recv_extent = if op.in_place { n * cb } else { cb };
                expect.push((
                    out_off,
                    Want::Reduced {
                        first: rank * op.count,
                    },
                    op.count,
                ));
            }
            Kind::AlltoAll => {
                // In place (supported since fd0c558): send == recv.
                let send = if op.in_place {
                    fill_input(rb, rank, 0, n * op.count);
                    rp
                } else {
                    fill_input(sb, rank, 0, n * op.count);
                    send_check = Some(n * op.count);
                    sp
                };
                code = ncclAlltoAll(
                    send as *const c_void,
                    rp as *mut c_void,
                    op.count,
                    op.dtype,
                    comm,
                    s,
                );
                recv_extent = n * cb;
                for j in 0..n {
                    expect.push((j * cb, input(j, rank * op.count), op.count));
                }
            }
            Kind::Gather => {
                let send = if op.in_place && is_root {
                    fill_input(&mut rb[rank * cb..], rank, 0, op.count);
                    rp.add(rank * cb)
                } else {
                    fill_input(sb, rank, 0, op.count);
                    send_check = Some(op.count);
                    sp
                };
                code = ncclGather(
                    send as *const c_void,
                    rp as *mut c_void,
                    op.count,
                    op.dtype,
                    op.root as i32,
                    comm,
                    s,
                );
                if is_root {
                    recv_extent = n * cb;
                    for j in 0..n {
                        expect.push((j * cb, input(j, 0), op.count));
                    }
                } else {
                    recv_extent = 0;
                    expect.push((0, Want::Fill, n * op.count));
                }
            }
            Kind::Scatter => {
                let recv = if is_root && op.in_place {
                    fill_input(rb, rank, 0, n * op.count);
                    rp.add(rank * cb)
                } else if is_root {
                    fill_input(sb, rank, 0, n * op.count);
                    send_check = Some(n * op.count);
                    rp
                } else {
                    rp
                };
                let send = if op.in_place { rp } else { sp };
                code = ncclScatter(
                    send as *const c_void,
                    recv as *mut c_void,
                    op.count,
                    op.dtype,
                    op.root as i32,
                    comm,
                    s,
                );
                let off = if op.in_place && is_root { rank * cb } else { 0 };
                recv_extent = if op.in_place && is_root { n * cb } else { cb };
                expect.push((off, input(op.root, rank * op.count), op.count));
            }
            Kind::SendRecv => {
                // Pair k sends elements [k*count, (k+1)*count) of its input
                // to rank+shift and receives them from rank-shift.
                let pairs: Vec<usize> = op
                    .shifts
                    .iter()
                    .copied()
                    .enumerate()
                    .filter(|&(k, sh)| k == 0 || sh != 0)
                    .map(|(_, sh)| sh)
                    .collect();
                fill_input(sb, rank, 0, pairs.len() * op.count);
                send_check = Some(pairs.len() * op.count);
                let mut c = ncclGroupStart();
                // Per-rank order of the calls inside the group.
                let recv_first = mix(op.seed, rank, 7) & 1 == 1;
                for (k, &sh) in pairs.iter().enumerate() {
                    let to = (rank + sh) % n;
                    let from = (rank + n - sh) % n;
                    let snd = |c: &mut i32| {
                        if *c == 0 {
                            *c = ncclSend(
                                sp.add(k * cb) as *const c_void,
                                op.count,
                                op.dtype,
                                to as i32,
                                comm,
                                s,
                            );
                        }
                    };
                    let rcv = |c: &mut i32| {
                        if *c == 0 {
                            *c = ncclRecv(
                                rp.add(k * cb) as *mut c_void,
                                op.count,
                                op.dtype,
                                from as i32,
                                comm,
                                s,
                            );
                        }
                    };
                    if recv_first {
                        rcv(&mut c);
                        snd(&mut c);
                    } else {
                        snd(&mut c);
                        rcv(&mut c);
                    }
                    expect.push((k * cb, input(from, k * op.count), op.count));
                }
                let e = ncclGroupEnd();
                code = if c != 0 { c } else { e };
                recv_extent = pairs.len() * cb;
            }
        }
    }
    if code != 0 {
        return Err((code, last_error()));
    }
    if !checked {
        return Ok(Vec::new());
    }

    // Check.
    let mut bad = Vec::new();
    for &(off, want, elems) in &expect {
        if let Some(m) = compare(op, &tab, want, &rb[off..off + elems * es], scratch) {
            bad.push(format!("recv at byte {off}: {m}"));
        }
    }
    if rb[recv_extent..recv_extent + GUARD]
        .iter()
        .any(|&b| b != FILL)
    {
        bad.push(format!("guard bytes after recv[{recv_extent}] overwritten"));
    }
    if let Some(elems) = send_check {
        if let Some(m) = compare(op, &tab, input(rank, 0), &sb[..elems * es], scratch) {
            bad.push(format!("the input of an out-of-place call changed: {m}"));
        }
    }
    Ok(bad)
}

// ---------------------------------------------------------------- drivers
