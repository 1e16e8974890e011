//! The collectives nccl-tests benchmarks: element counts and in-place offsets
//! (`*GetCollByteCount`), bandwidth formulas (`*GetBw`), and the host-side
//! input/expected data (`*InitData`).

use crate::dtype::{DType, Op};
use crate::verifiable;

/// A benchmarked collective (one nccl-tests binary).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coll {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `alltoall_perf`.
    AlltoAll,
    /// `gather_perf`.
    Gather,
    /// `scatter_perf`.
    Scatter,
    /// `sendrecv_perf`.
    SendRecv,
}

/// Element counts of one size step (nccl-tests' `setupArgs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Elements in each rank's send buffer.
    pub send: usize,
    /// Elements in each rank's receive buffer (what is checked).
    pub recv: usize,
    /// The count passed to NCCL (the `count` column).
    pub param: usize,
    /// In-place: the send buffer is `recvbuff + rank * send_inplace_offset`.
    pub send_inplace_offset: usize,
    /// In-place: the result is at `recvbuff + rank * recv_inplace_offset`.
    pub recv_inplace_offset: usize,
}

impl Coll {
    /// Every collective, in nccl-tests' Makefile order.
    pub const ALL: [Coll; 9] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::ReduceScatter,
        Coll::Reduce,
        Coll::AlltoAll,
        Coll::Scatter,
        Coll::Gather,
        Coll::SendRecv,
    ];

    /// The subcommand name (`all_reduce`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AlltoAll => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' program name (`all_reduce_perf`, ...).
    pub fn program(self) -> String {
        format!("{}_perf", self.name())
    }

    /// Parses a subcommand or program name (`all_reduce`, `all_reduce_perf`,
    /// `all_reduce_perf_mpi`, ...).
    pub fn from_name(s: &str) -> Option<Coll> {
        let base = s.split("_perf").next().unwrap_or(s);
        Coll::ALL.into_iter().find(|c| c.name() == base)
    }

    /// Reductions take `-o`; the others print `none` in the `redop` column.
    pub fn is_reduction(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Rooted collectives take `-r` (`-1` = every root in turn); the others
    /// print `-1` in the `root` column.
    pub fn is_rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// Counts for a step of `count = size / elt` elements (nccl-tests'
    /// `*GetCollByteCount`): per-rank counts are rounded down to multiples of
    /// 16 bytes.
    pub fn counts(self, count: usize, elt: usize, nranks: usize) -> Counts {
        let n = nranks.max(1);
        let base = (count / n) & !(16 / elt - 1);
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => Counts {
                send: count,
                recv: count,
                param: count,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
            Coll::AllGather | Coll::Gather => Counts {
                send: base,
                recv: base * n,
                param: base,
                send_inplace_offset: base,
                recv_inplace_offset: 0,
            },
            Coll::ReduceScatter | Coll::Scatter => Counts {
                send: base * n,
                recv: base,
                param: base,
                send_inplace_offset: 0,
                recv_inplace_offset: base,
            },
            Coll::AlltoAll => Counts {
                send: base * n,
                recv: base * n,
                param: base,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
        }
    }

    /// The bus-bandwidth factor over algbw for `nranks` ranks.
    pub fn busbw_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather
            | Coll::ReduceScatter
            | Coll::AlltoAll
            | Coll::Gather
            | Coll::Scatter => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }

    /// `(algbw, busbw)` in GB/s (1e9) for `count` (the `count` column) elements
    /// of `elt` bytes taking `sec` seconds (nccl-tests' `*GetBw`).
    pub fn bandwidth(self, count: usize, elt: usize, sec: f64, nranks: usize) -> (f64, f64) {
        let bytes = (count * elt) as f64;
        let numerator = match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => bytes,
            _ => bytes * nranks as f64,
        };
        let alg = numerator / 1.0e9 / sec;
        (alg, alg * self.busbw_factor(nranks))
    }

    /// Whether the in-place variant is checked (nccl-tests reports `N/A` for
    /// in-place alltoall and sendrecv).
    pub fn checks_in_place(self) -> bool {
        !matches!(self, Coll::AlltoAll | Coll::SendRecv)
    }
}

/// One rank's view of a test step, for data generation.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// The collective.
    pub coll: Coll,
    /// Element type.
    pub dt: DType,
    /// Reduction (ignored by non-reductions).
    pub op: Op,
    /// Root (rooted collectives).
    pub root: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Counts of the step.
    pub counts: Counts,
    /// In-place variant.
    pub in_place: bool,
}

impl Step {
    /// Fills this rank's buffers for a check with seed `rep`, as nccl-tests'
    /// `*InitData`: `recv` (at least `counts.recv` elements) is zeroed first,
    /// then the input is written into `send` (out of place) or at its in-place
    /// position inside `recv`; returns the expected content of the checked
    /// region (`counts.recv` elements starting at the in-place result offset
    /// for in-place runs, at `recv` otherwise).
    pub fn init(&self, send: &mut [u8], recv: &mut [u8], rep: u64) -> Vec<u8> {
        self.init_inner(send, recv, rep, true)
    }

    /// [`Step::init`] without computing the expected data (for the fill
    /// before the timed loop, whose results are not checked).
    pub fn init_inputs(&self, send: &mut [u8], recv: &mut [u8], rep: u64) {
        self.init_inner(send, recv, rep, false);
    }

    fn init_inner(&self, send: &mut [u8], recv: &mut [u8], rep: u64, want: bool) -> Vec<u8> {
        let dt = self.dt;
        let es = dt.size();
        let c = self.counts;
        let (n, rank, op) = (self.nranks, self.rank, self.op);
        recv[..c.recv * es].fill(0);
        // Where this rank's input goes.
        let in_off = if self.in_place {
            rank * c.send_inplace_offset * es
        } else {
            0
        };
        {
            let buf: &mut [u8] = if self.in_place {
                &mut recv[in_off..]
            } else {
                &mut send[..]
            };
            let mut fill = |f: &dyn Fn(usize) -> u64| {
                for i in 0..c.send {
                    dt.store(buf, i, f(i));
                }
            };
            match self.coll {
                Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce => {
                    fill(&|i| verifiable::input(dt, op, n, rank, rep, i as u64))
                }
                Coll::AllGather | Coll::AlltoAll => {
                    fill(&|i| verifiable::copy_value(dt, 33 * rep + rank as u64, i as u64))
                }
                Coll::Broadcast | Coll::Scatter => {
                    if rank == self.root {
                        fill(&|i| verifiable::copy_value(dt, rep, i as u64))
                    }
                }
                Coll::Gather | Coll::SendRecv => {
                    fill(&|i| verifiable::copy_value(dt, rep, (rank * c.send + i) as u64))
                }
            }
        }
        if !want {
            return Vec::new();
        }
        // Non-root receive buffers of reduce and gather must be left alone:
        // their expected content is what init left there.
        if matches!(self.coll, Coll::Reduce | Coll::Gather) && rank != self.root {
            return recv[..c.recv * es].to_vec();
        }
        let part = c.param.max(1);
        let send_n = c.send.max(1);
        let peer = (rank + n - 1) % n;
        let value = |i: usize| -> u64 {
            match self.coll {
                Coll::AllReduce | Coll::Reduce => verifiable::expected(dt, op, n, rep, i as u64),
                Coll::ReduceScatter => {
                    verifiable::expected(dt, op, n, rep, (rank * c.recv + i) as u64)
                }
                Coll::AllGather => {
                    verifiable::copy_value(dt, 33 * rep + (i / send_n) as u64, (i % send_n) as u64)
                }
                Coll::Broadcast | Coll::Gather => verifiable::copy_value(dt, rep, i as u64),
                Coll::AlltoAll => verifiable::copy_value(
                    dt,
                    33 * rep + (i / part) as u64,
                    (rank * part + i % part) as u64,
                ),
                Coll::Scatter => verifiable::copy_value(dt, rep, (rank * c.recv + i) as u64),
                Coll::SendRecv => verifiable::copy_value(dt, rep, (peer * c.recv + i) as u64),
            }
        };
        let mut expected = vec![0u8; c.recv * es];
        for i in 0..c.recv {
            dt.store(&mut expected, i, value(i));
        }
        expected
    }

    /// Byte offset inside `recv` of the region that is checked.
    pub fn check_offset(&self) -> usize {
        if self.in_place {
            self.rank * self.counts.recv_inplace_offset * self.dt.size()
        } else {
            0
        }
    }

    /// Counts elements of `got` (the checked region) that differ from
    /// `expected` by more than the op's tolerance.
    pub fn count_wrong(&self, got: &[u8], expected: &[u8]) -> u64 {
        let dt = self.dt;
        let tol = if self.coll.is_reduction() {
            verifiable::tolerance(dt, self.op)
        } else {
            0
        };
        let n = expected.len() / dt.size();
        (0..n)
            .filter(|&i| !verifiable::matches(dt.load(got, i), dt.load(expected, i), tol))
            .count() as u64
    }
}
