//! One rank's benchmark: communicator set-up, the size sweep per type, op and
//! root (nccl-tests' `TimeTest`/`BenchTime`), the data checks, and — on rank
//! 0 — the table.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

use crate::buffers::Buf;
use crate::cli::{Alloc, Options};
use crate::coll::{Coll, Counts, Step};
use crate::cuda::{self, Gpu};
use crate::dtype::{premul_scalar, DType, Op};
use crate::nccl::{Comm, Nccl, NcclError, UniqueId};
use crate::report;
use crate::store::Channel;

/// Bytes per element of an `ncclDataType_t` value.
pub fn dtype_size(dtype: c_int) -> usize {
    DType::ALL
        .get(dtype as usize)
        .map(|t| t.size())
        .unwrap_or(1)
}

/// Milliseconds since process start of the last sign of progress (for the
/// `-T` watchdog).
pub struct Progress {
    start: Instant,
    last_ms: AtomicU64,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Progress {
    /// Records progress now.
    pub fn tick(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Seconds since the last progress.
    pub fn idle_s(&self) -> f64 {
        (self.start.elapsed().as_millis() as u64)
            .saturating_sub(self.last_ms.load(Ordering::Relaxed)) as f64
            / 1e3
    }
}

/// What a rank reports at the end.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Failed checks summed over ranks (rank 0 only; 0 elsewhere).
    pub errors: u64,
    /// Whether the average bus bandwidth failed `NCCL_TESTS_MIN_BW`.
    pub bw_failed: bool,
}

/// An error of a rank: a message, and whether it came from the library
/// (exit code 2) or from the benchmark itself (exit code 3).
#[derive(Debug)]
pub struct RankError(pub String, pub Option<i32>);

impl From<String> for RankError {
    fn from(s: String) -> Self {
        RankError(s, None)
    }
}

impl From<NcclError> for RankError {
    fn from(e: NcclError) -> Self {
        RankError(e.to_string(), Some(e.code))
    }
}

/// Self-test hook: the rank named here flips one byte of every checked
/// result before comparing, to prove that wrong results are detected.
pub const ENV_TEST_CORRUPT: &str = "HETCCL_PERF_TEST_CORRUPT";

/// `ncclInvalidArgument`.
const NCCL_INVALID_ARGUMENT: i32 = 4;

/// Rank 0's output state.
struct Printer {
    json: Option<(std::fs::File, Value)>,
    results: Vec<Value>,
    row: Option<Value>,
    line: String,
    inplace_note: bool,
}

impl Printer {
    fn print(&self, s: &str) {
        println!("{s}");
    }
}

struct Ctx<'a> {
    nccl: &'a Nccl,
    opts: &'a Options,
    ch: Channel,
    comm: Comm,
    rank: usize,
    nranks: usize,
    send: Buf<'a>,
    recv: Buf<'a>,
    gpu: Option<&'a Gpu>,
    printer: Option<Printer>,
    progress: &'a Progress,
    errors: u64,
    bw_sum: f64,
    bw_count: u64,
    rep: u64,
    corrupt: bool,
}

/// Host name (for the rank lines).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: valid buffer and length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Everything a rank needs besides its channel.
pub struct RankArgs<'a> {
    /// The library.
    pub nccl: &'a Nccl,
    /// Options.
    pub opts: &'a Options,
    /// The `nThread` value of the parameter line.
    pub nthreads: usize,
    /// Watchdog stamp.
    pub progress: &'a Progress,
    /// argv, for JSON.
    pub argv: &'a [String],
}

const ID_OK: &[u8] = b"OK";
const ID_ERR: &[u8] = b"ER";

/// The rank's CUDA device: required for `--alloc device`; for the default
/// `--alloc nccl`, opened when a CUDA driver is present (the library's
/// `ncclMemAlloc` may return device memory, as on a GPU machine).
fn open_gpu(alloc: Alloc, rank: usize) -> Result<Option<Gpu>, RankError> {
    match alloc {
        Alloc::Device => Ok(Some(Gpu::open(crate::launcher::local_rank(rank))?)),
        Alloc::Nccl if cuda::driver_present() => {
            Ok(Gpu::open(crate::launcher::local_rank(rank)).ok())
        }
        _ => Ok(None),
    }
}

/// Runs the whole benchmark as one rank.
pub fn run_rank(args: &RankArgs<'_>, mut ch: Channel) -> Result<Outcome, RankError> {
    let (nccl, opts) = (args.nccl, args.opts);
    let rank = ch.rank();
    let nranks = ch.nranks();
    let program = opts.coll.program();
    args.progress.tick();

    let mut printer = None;
    if rank == 0 {
        let mut p = Printer {
            json: None,
            results: Vec::new(),
            row: None,
            line: String::new(),
            inplace_note: false,
        };
        if let Some(path) = &opts.json {
            match report::open_json(path) {
                Ok((f, real)) => {
                    p.print(&format!("# Writing JSON output to {}", real.display()));
                    let env: Vec<String> = std::env::vars()
                        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("HETCCL_"))
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let doc = json!({
                        "version": 3,
                        "start_time": report::now_string(),
                        "args": args.argv,
                        "env": env,
                        "nccl_version": nccl.version(),
                    });
                    p.json = Some((f, doc));
                }
                Err(Some(msg)) => p.print(&msg),
                Err(None) => {}
            }
        }
        for n in &opts.notes {
            p.print(n);
        }
        for l in report::header(
            opts,
            &program,
            nccl.version(),
            &nccl.path().display().to_string(),
            args.nthreads,
        ) {
            p.print(&l);
        }
        printer = Some(p);
    }

    // The rank's CUDA device, when its buffers may be device memory.
    let gpu = open_gpu(opts.alloc, rank)?;
    let gpu = gpu.as_ref();

    // Device report: every rank's line, printed by rank 0 in rank order.
    let dev = gpu.map(|g| (g.device, g.name.as_str()));
    let line = report::rank_line(rank, std::process::id(), &hostname(), dev);
    if let Some(lines) = ch.gather(line.as_bytes())? {
        let p = printer.as_mut().expect("rank 0 prints");
        let mut devices = Vec::new();
        for (r, l) in lines.iter().enumerate() {
            let l = String::from_utf8_lossy(l).into_owned();
            p.print(&l);
            // As nccl-tests' parseRankInfo: "#  Rank R Group G Pid P on HOST device D [HEX] INFO".
            let t: Vec<&str> = l.split_whitespace().collect();
            let pid = t.get(6).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
            let host = t.get(8).copied().unwrap_or("");
            let device = t.get(10).and_then(|v| v.parse::<i32>().ok()).unwrap_or(-1);
            let hex = t
                .get(11)
                .map(|v| v.trim_matches(['[', ']']))
                .unwrap_or("cpu");
            let info = t.get(12..).map(|v| v.join(" ")).unwrap_or_default();
            devices.push(json!({"rank": r, "group": 0, "pid": pid, "hostname": host, "device": device, "device_hex": hex, "device_info": info}));
        }
        if let Some((_, doc)) = p.json.as_mut() {
            doc["config"] = json!({
                "nthreads": args.nthreads, "ngpus": 1,
                "minimum_bytes": opts.min_bytes, "maximum_bytes": opts.max_bytes,
                "step_factor": if opts.step_factor > 1 { json!(opts.step_factor) } else { Value::Null },
                "step_bytes": if opts.step_factor > 1 { Value::Null } else { json!(opts.step_bytes) },
                "warmup_iters": opts.warmup_iters, "iterations": opts.iters,
                "aggregated_iterations": opts.agg_iters, "validation": opts.check, "graph": 0,
                "blocking_collectives": if opts.blocking != 0 { "true" } else { "false" },
                "per_iter_timing": "false", "per_iter_skip": 0, "parallel_init": "false",
                "devices": devices,
            });
        }
    }

    // Unique id: rank 0 asks the library, the others read it from the store.
    let id = if rank == 0 {
        match nccl.get_unique_id() {
            Ok(id) => {
                ch.set("id", &[ID_OK, &id.internal[..]].concat())?;
                id
            }
            Err(e) => {
                let msg = e.to_string();
                let _ = ch.set("id", &[ID_ERR, msg.as_bytes()].concat());
                return Err(e.into());
            }
        }
    } else {
        let v = ch.get("id")?;
        if v.starts_with(ID_ERR) || v.len() != 2 + 128 {
            return Err(RankError::from(format!(
                "rank 0 could not create the unique id: {}",
                String::from_utf8_lossy(&v[2..])
            )));
        }
        let mut id = UniqueId::default();
        id.internal.copy_from_slice(&v[2..]);
        id
    };
    args.progress.tick();
    let comm = nccl.comm_init_rank(nranks, id, rank, opts.init_config)?;
    let (cn, cr) = nccl.comm_count_rank(comm)?;
    if (cn, cr) != (nranks, rank) {
        return Err(RankError::from(format!(
            "communicator reports rank {cr} of {cn}, expected {rank} of {nranks}"
        )));
    }
    args.progress.tick();

    let pad = 8 * opts.unalign;
    let send = Buf::new(nccl, gpu, opts.max_bytes + pad, opts.alloc)?;
    let recv = Buf::new(nccl, gpu, opts.max_bytes + pad, opts.alloc)?;
    if let Some(p) = &printer {
        for l in report::table_header(opts.report_cputime) {
            p.print(&l);
        }
    }
    let mut ctx = Ctx {
        nccl,
        opts,
        ch,
        comm,
        rank,
        nranks,
        send,
        recv,
        gpu,
        printer,
        progress: args.progress,
        errors: 0,
        bw_sum: 0.0,
        bw_count: 0,
        rep: 0,
        corrupt: std::env::var(ENV_TEST_CORRUPT)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank),
    };
    let res = ctx.run_tests();
    if let Err(e) = res {
        nccl.comm_abort(comm);
        return Err(e);
    }

    // The library's per-link counters, gathered before the footer so that
    // the summary follows it.
    let links = if opts.link_stats {
        let r: crate::link_stats::Report = match nccl.comm_stats(comm) {
            None => Ok(None),
            Some(Ok(j)) => Ok(Some(j)),
            Some(Err(e)) => Err(e.to_string()),
        };
        ctx.ch.gather(&crate::link_stats::encode(&r))?
    } else {
        None
    };
    // Footer: failed checks summed over ranks; bandwidth average is rank 0's.
    let errs = ctx.ch.gather(&ctx.errors.to_le_bytes())?;
    let mut outcome = Outcome::default();
    if let Some(all) = errs {
        let total: u64 = all
            .iter()
            .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])))
            .sum();
        let avg = ctx.bw_sum / ctx.bw_count as f64;
        let min_bw = std::env::var("NCCL_TESTS_MIN_BW")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok());
        outcome.errors = total;
        outcome.bw_failed = min_bw.map(|m| avg < 0.9 * m).unwrap_or(false);
        let last = nccl.last_error(std::ptr::null_mut());
        let p = ctx.printer.as_mut().expect("rank 0 prints");
        for l in report::footer(total, avg, min_bw, &program, &last) {
            p.print(&l);
        }
        if let Some(all) = &links {
            let reports: Vec<_> = all.iter().map(|b| crate::link_stats::decode(b)).collect();
            for l in crate::link_stats::lines(&reports) {
                p.print(&l);
            }
        }
        if let Some((mut f, mut doc)) = p.json.take() {
            doc["results"] = Value::Array(std::mem::take(&mut p.results));
            doc["out_of_bounds"] =
                json!({"count": total, "okay": if total == 0 { "true" } else { "false" }});
            doc["average_bus_bandwidth"] = json!({
                "bandwidth": avg,
                "okay": match min_bw { None => json!("unchecked"), Some(m) => json!(if avg >= m * 0.9 { "true" } else { "false" }) },
            });
            doc["errors"] = if last.is_empty() {
                json!([])
            } else {
                json!([last])
            };
            doc["end_time"] = json!(report::now_string());
            use std::io::Write;
            let _ = writeln!(f, "{doc}");
        }
    }
    drop(ctx.send);
    drop(ctx.recv);
    nccl.comm_destroy(comm)?;
    ctx.ch.barrier()?;
    Ok(outcome)
}

impl Ctx<'_> {
    fn run_tests(&mut self) -> Result<(), RankError> {
        let opts = self.opts;
        let version = self.nccl.version();
        let coll = opts.coll;
        let ops: Vec<Option<Op>> = if coll.is_reduction() {
            opts.ops(version).into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        let roots: Vec<i64> = if !coll.is_rooted() {
            vec![-1]
        } else if opts.root == -1 {
            (0..self.nranks as i64).collect()
        } else if (opts.root as usize) < self.nranks {
            vec![opts.root]
        } else {
            return Err(RankError::from(format!(
                "root {} is not a rank of {}",
                opts.root, self.nranks
            )));
        };
        for dt in opts.dtypes(version) {
            for &op in &ops {
                for &root in &roots {
                    self.time_test(dt, op, root)?;
                }
            }
        }
        Ok(())
    }

    fn time_test(&mut self, dt: DType, op: Option<Op>, root: i64) -> Result<(), RankError> {
        let opts = self.opts;
        let coll = opts.coll;
        let es = dt.size();
        self.ch.barrier()?;
        // Warm-up: every size doubling from -b, out of place.
        for size in opts.warmup_sizes() {
            let counts = coll.counts(size / es, es, self.nranks);
            for iter in 0..opts.warmup_iters {
                self.start_coll(dt, op, root, counts, false, iter)?;
            }
        }
        self.progress.tick();
        let mut cycle = 0;
        loop {
            for size in opts.sizes() {
                let counts = coll.counts(size / es, es, self.nranks);
                let bytes = counts.send.max(counts.recv) * es;
                let redop = op.map(|o| o.name()).unwrap_or("none");
                if let Some(p) = self.printer.as_mut() {
                    p.line = report::row_preamble(bytes, counts.param, dt.name(), redop, root);
                    p.row = Some(
                        json!({"size": bytes, "count": counts.param, "type": dt.name(), "redop": redop, "root": format!("{root:6}")}),
                    );
                }
                self.bench_time(dt, op, root, counts, false)?;
                self.bench_time(dt, op, root, counts, true)?;
                if let Some(p) = self.printer.as_mut() {
                    p.print(&p.line);
                    if let Some(mut row) = p.row.take() {
                        row["actual_iterations"] = json!(opts.iters);
                        row["experiment_name"] = json!("");
                        p.results.push(row);
                    }
                }
                self.progress.tick();
            }
            cycle += 1;
            if opts.run_cycles != 0 && cycle >= opts.run_cycles {
                break;
            }
        }
        Ok(())
    }

    /// One operation (nccl-tests' `startColl`): buffers move by one step size
    /// per iteration, premul-sum ops are created and destroyed around it.
    fn start_coll(
        &self,
        dt: DType,
        op: Option<Op>,
        root: i64,
        c: Counts,
        in_place: bool,
        iter: usize,
    ) -> Result<(), RankError> {
        let es = dt.size();
        let total = c.send.max(c.recv) * es;
        let steps = self.opts.max_bytes.checked_div(total).unwrap_or(1).max(1);
        let shift = total * (iter % steps) + self.opts.unalign * es;
        let send_base = self.send.ptr.wrapping_add(shift);
        let recv_base = self.recv.ptr.wrapping_add(shift);
        let (sendp, recvp) = if in_place {
            (
                recv_base.wrapping_add(self.rank * c.send_inplace_offset * es) as *const u8,
                recv_base.wrapping_add(self.rank * c.recv_inplace_offset * es),
            )
        } else {
            (send_base as *const u8, recv_base)
        };
        let root = root.max(0) as usize;
        let (op_id, created) = match op {
            None => (0, false),
            Some(o) => match o.nccl() {
                Some(id) => (id, false),
                None => {
                    let mut scalar = premul_scalar(dt, self.rank);
                    (
                        self.nccl.premul_create(&mut scalar, dt.nccl(), self.comm)?,
                        true,
                    )
                }
            },
        };
        // SAFETY: both buffers hold max_bytes + pad bytes and every pointer
        // plus the bytes the collective touches stays inside them (shift +
        // step size <= max_bytes; in-place offsets are inside a step).
        let res = unsafe {
            self.nccl.run_coll(
                self.opts.coll,
                sendp,
                recvp,
                c.param,
                dt.nccl(),
                op_id,
                root,
                self.comm,
                self.stream(),
            )
        };
        if created {
            self.nccl.op_destroy(op_id, self.comm)?;
        }
        res?;
        Ok(())
    }

    fn step(&self, dt: DType, op: Option<Op>, root: i64, counts: Counts, in_place: bool) -> Step {
        Step {
            coll: self.opts.coll,
            dt,
            op: op.unwrap_or(Op::Sum),
            root: root.max(0) as usize,
            nranks: self.nranks,
            rank: self.rank,
            counts,
            in_place,
        }
    }

    /// Fills the buffers for a check; returns the expected checked region
    /// (empty unless `want_expected`).
    fn init_data(
        &mut self,
        step: &Step,
        rep: u64,
        want_expected: bool,
    ) -> Result<Vec<u8>, RankError> {
        let off = self.opts.unalign * step.dt.size();
        let send = &mut self.send.host()[off..];
        let recv = &mut self.recv.host()[off..];
        let expected = if want_expected {
            step.init(send, recv, rep)
        } else {
            step.init_inputs(send, recv, rep);
            Vec::new()
        };
        self.send.push()?;
        self.recv.push()?;
        Ok(expected)
    }

    /// The stream calls are issued on (NULL for host buffers).
    fn stream(&self) -> *mut std::ffi::c_void {
        match self.gpu {
            Some(g) if self.send.is_device() => g.stream(),
            _ => std::ptr::null_mut(),
        }
    }

    /// Waits for the rank's stream (device buffers only).
    fn sync(&self) -> Result<(), RankError> {
        match self.gpu {
            Some(g) if self.send.is_device() => Ok(g.sync()?),
            _ => Ok(()),
        }
    }

    fn bench_time(
        &mut self,
        dt: DType,
        op: Option<Op>,
        root: i64,
        counts: Counts,
        in_place: bool,
    ) -> Result<(), RankError> {
        let opts = self.opts;
        let step = self.step(dt, op, root, counts, in_place);
        if opts.check > 0 {
            self.init_data(&step, 99, false)?;
        }
        // One synchronising operation, then a barrier, then the timed loop.
        let first = self.start_coll(dt, op, root, counts, in_place, 0);
        if let Err(RankError(msg, Some(NCCL_INVALID_ARGUMENT))) = &first {
            if in_place && !opts.coll.checks_in_place() {
                // NCCL documents in-place alltoall as unsupported and
                // nccl-tests does not check it; a library that rejects it
                // (every rank alike) gets N/A columns instead of a failed run.
                if let Some(p) = self.printer.as_mut() {
                    if !p.inplace_note {
                        p.inplace_note = true;
                        eprintln!("# note: the library rejects in-place {} ({msg}); nccl-tests would stop here, hetccl-perf prints N/A", opts.coll.name());
                    }
                    p.line.push_str(&report::row_unsupported());
                    if let Some(row) = p.row.as_mut() {
                        row["in_place"] = Value::Null;
                    }
                }
                return Ok(());
            }
        }
        first?;
        self.sync()?;
        self.ch.barrier()?;
        let mut barrier_time = 0.0;
        let t0 = Instant::now();
        for iter in 0..opts.iters {
            if opts.agg_iters > 1 {
                self.nccl.group_start()?;
            }
            for a in 0..opts.agg_iters {
                self.start_coll(dt, op, root, counts, in_place, iter * opts.agg_iters + a)?;
                if opts.blocking == 1 {
                    self.sync()?;
                    self.ch.barrier()?;
                }
            }
            if opts.agg_iters > 1 {
                self.nccl.group_end()?;
            }
            if opts.blocking == 3 {
                self.sync()?;
                let b0 = Instant::now();
                self.ch.barrier()?;
                barrier_time += b0.elapsed().as_secs_f64();
            }
        }
        self.sync()?;
        self.nccl.comm_async_error(self.comm)?;
        let n_ops = (opts.iters * opts.agg_iters).max(1) as f64;
        let delta = (t0.elapsed().as_secs_f64() - barrier_time) / n_ops;
        self.progress.tick();

        // Checks: fresh data, one operation, compare; wrong counts summed over
        // ranks so that every rank stops after the same check.
        let report_errors = opts.check > 0 && (!in_place || opts.coll.checks_in_place());
        self.rep += 1;
        let mut wrong_total = 0u64;
        for _ in 0..opts.check {
            let expected = self.init_data(&step, self.rep, true)?;
            self.start_coll(dt, op, root, counts, in_place, 0)?;
            let off = self.opts.unalign * dt.size() + step.check_offset();
            self.recv.pull(off, expected.len())?;
            let got = &mut self.recv.host()[off..off + expected.len()];
            if self.corrupt && !got.is_empty() {
                // Self-test hook: damage one result element on this rank.
                got[0] ^= 0x5a;
            }
            let wrong = step.count_wrong(got, &expected);
            if report_errors && wrong > 0 {
                self.errors += 1;
            }
            wrong_total = self.all_sum(wrong)?;
            if wrong_total > 0 {
                break;
            }
        }

        // Times to rank 0, combined per -a.
        let times = self.ch.gather(&delta.to_le_bytes())?;
        if let Some(all) = times {
            let ts: Vec<f64> = all
                .iter()
                .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])))
                .collect();
            let t = match opts.average {
                0 => ts[0],
                2 => ts.iter().cloned().fold(f64::INFINITY, f64::min),
                3 => ts.iter().cloned().fold(0.0, f64::max),
                _ => ts.iter().sum::<f64>() / ts.len() as f64,
            };
            let (alg, bus) = opts.coll.bandwidth(counts.param, dt.size(), t, self.nranks);
            let wrong = if report_errors {
                Some(wrong_total)
            } else {
                None
            };
            self.bw_sum += bus;
            self.bw_count += 1;
            let p = self.printer.as_mut().expect("rank 0 prints");
            p.line.push_str(&report::row_body(t * 1e6, alg, bus, wrong));
            if let Some(row) = p.row.as_mut() {
                let key = if in_place { "in_place" } else { "out_of_place" };
                let tkey = if opts.report_cputime {
                    "cpu_time"
                } else {
                    "time"
                };
                row[key] = json!({tkey: t * 1e6, "alg_bw": alg, "bus_bw": bus, "nwrong": wrong});
            }
        }
        Ok(())
    }

    /// Sum of `v` over all ranks, known to every rank.
    fn all_sum(&mut self, v: u64) -> Result<u64, RankError> {
        Ok(self.ch.all_sum(v)?)
    }
}

impl std::fmt::Display for Coll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
