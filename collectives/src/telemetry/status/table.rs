//! One rank's status line (what the ranks send each other), and the table
//! of a communicator's ranks with the line that names the ranks the
//! others wait on.

use std::fmt::Write;

/// What one rank says about itself in one communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStatus {
    /// The rank.
    pub rank: usize,
    /// Its short host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The sequence number of the last operation that ended.
    pub done: Option<u64>,
    /// The operation in progress: sequence number and kind.
    pub current: Option<(u64, String)>,
    /// Milliseconds the operation has been stalled (0: moving).
    pub stalled_ms: u64,
    /// What it waits on while stalled: (peer, step, "waits for data from").
    pub waits: Option<(usize, usize, String)>,
}

impl RankStatus {
    /// The wire form: `key=value` fields separated by spaces (host names
    /// have no spaces; the wait words use `_`).
    pub fn encode(&self) -> String {
        let mut o = format!("rank={} host={} pid={}", self.rank, self.host, self.pid);
        if let Some(d) = self.done {
            let _ = write!(o, " done={d}");
        }
        if let Some((s, k)) = &self.current {
            let _ = write!(o, " seq={s} kind={k} stalled_ms={}", self.stalled_ms);
        }
        if let Some((p, st, w)) = &self.waits {
            let _ = write!(o, " peer={p} step={st} wait={}", w.replace(' ', "_"));
        }
        o
    }

    /// Parses [`RankStatus::encode`].
    pub fn decode(s: &str) -> Option<Self> {
        let mut r = RankStatus {
            rank: usize::MAX,
            host: String::new(),
            pid: 0,
            done: None,
            current: None,
            stalled_ms: 0,
            waits: None,
        };
        let (mut seq, mut kind, mut peer, mut step, mut wait) = (None, None, None, None, None);
        for f in s.trim().split(' ') {
            let (k, v) = f.split_once('=')?;
            match k {
                "rank" => r.rank = v.parse().ok()?,
                "host" => r.host = v.to_string(),
                "pid" => r.pid = v.parse().ok()?,
                "done" => r.done = Some(v.parse().ok()?),
                "seq" => seq = Some(v.parse().ok()?),
                "kind" => kind = Some(v.to_string()),
                "stalled_ms" => r.stalled_ms = v.parse().ok()?,
                "peer" => peer = Some(v.parse().ok()?),
                "step" => step = Some(v.parse().ok()?),
                "wait" => wait = Some(v.replace('_', " ")),
                _ => {}
            }
        }
        if r.rank == usize::MAX {
            return None;
        }
        r.current = seq.zip(kind);
        r.waits = match (peer, step, wait) {
            (Some(p), Some(s), Some(w)) => Some((p, s, w)),
            _ => None,
        };
        Some(r)
    }
}

/// One row of the table: the rank's answer, or who did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    /// It answered.
    Answer(RankStatus),
    /// It did not answer in time: rank, host and pid as it published them
    /// at init.
    NoAnswer(usize, String, u32),
}

impl Row {
    fn rank(&self) -> usize {
        match self {
            Row::Answer(s) => s.rank,
            Row::NoAnswer(r, ..) => *r,
        }
    }
    fn who(&self) -> String {
        match self {
            Row::Answer(s) => format!("rank {} (host {}, pid {})", s.rank, s.host, s.pid),
            Row::NoAnswer(r, h, p) => format!("rank {r} (host {h}, pid {p})"),
        }
    }
}

/// The ranks the others wait on, each with why: ranks that did not answer;
/// else ranks outside the newest operation that a stalled rank is in; else
/// the peers that stalled ranks wait on and that are not stalled
/// themselves (all such peers when every rank is stalled). Empty when no
/// operation is stalled.
pub fn blocking(rows: &[Row]) -> Vec<(usize, String)> {
    let silent: Vec<(usize, String)> = rows
        .iter()
        .filter(|r| matches!(r, Row::NoAnswer(..)))
        .map(|r| (r.rank(), format!("{}: no answer", r.who())))
        .collect();
    if !silent.is_empty() {
        return silent;
    }
    let ans: Vec<&RankStatus> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Answer(s) => Some(s),
            Row::NoAnswer(..) => None,
        })
        .collect();
    // Only stalled operations wait on anyone: ranks that are moving are
    // merely seen at different moments.
    let Some((seq, kind)) = ans
        .iter()
        .filter(|s| s.stalled_ms > 0)
        .filter_map(|s| s.current.clone())
        .max_by_key(|(s, _)| *s)
    else {
        return Vec::new();
    };
    let behind: Vec<(usize, String)> = ans
        .iter()
        .filter(|s| s.current.as_ref().map(|c| c.0) != Some(seq))
        .map(|s| {
            let now = match &s.current {
                Some((q, k)) => format!("in {k} seq {q}"),
                None => match s.done {
                    Some(d) => format!("idle, last ended seq {d}"),
                    None => "idle, no operation yet".to_string(),
                },
            };
            let who = Row::Answer((*s).clone()).who();
            (s.rank, format!("{who}: not in {kind} seq {seq} ({now})"))
        })
        .collect();
    if !behind.is_empty() {
        return behind;
    }
    let mut targets: Vec<usize> = ans
        .iter()
        .filter_map(|s| s.waits.as_ref().map(|w| w.0))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    let moving: Vec<usize> = targets
        .iter()
        .copied()
        .filter(|t| ans.iter().any(|s| s.rank == *t && s.waits.is_none()))
        .collect();
    let pick = if moving.is_empty() { targets } else { moving };
    pick.into_iter()
        .filter_map(|t| ans.iter().find(|s| s.rank == t))
        .map(|s| {
            let who = Row::Answer((*s).clone()).who();
            (
                s.rank,
                format!("{who}: the others wait on it in {kind} seq {seq}"),
            )
        })
        .collect()
}

/// The table of one communicator: a header, one line per rank, and the
/// `blocking:` line.
pub fn render(label: &str, asked: usize, nranks: usize, rows: &[Row]) -> String {
    let mut o = format!("{label}: {nranks} ranks, asked rank {asked}\n");
    let _ = writeln!(
        o,
        "{:>5}  {:<16} {:>8}  {:>9}  {:<24}  waits on",
        "rank", "host", "pid", "last seq", "in progress"
    );
    for r in rows {
        match r {
            Row::Answer(s) => {
                let done = s.done.map_or_else(|| "-".to_string(), |d| d.to_string());
                let cur = s
                    .current
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |(q, k)| format!("{k} seq {q}"));
                let waits = match (&s.waits, s.stalled_ms) {
                    (Some((p, st, w)), ms) if s.current.is_some() => {
                        format!("{w} rank {p} (step {st}), {:.1} s", ms as f64 / 1e3)
                    }
                    _ => "-".to_string(),
                };
                let _ = writeln!(
                    o,
                    "{:>5}  {:<16} {:>8}  {:>9}  {:<24}  {waits}",
                    s.rank, s.host, s.pid, done, cur
                );
            }
            Row::NoAnswer(rank, host, pid) => {
                let _ = writeln!(o, "{rank:>5}  {host:<16} {pid:>8}  no answer");
            }
        }
    }
    let b = blocking(rows);
    if b.is_empty() {
        o.push_str("blocking: none\n");
    }
    for (_, why) in b {
        let _ = writeln!(o, "blocking: {why}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(rank: usize, current: Option<u64>, waits: Option<usize>) -> RankStatus {
        RankStatus {
            rank,
            host: "h".into(),
            pid: 100 + rank as u32,
            done: Some(4),
            current: current.map(|s| (s, "allreduce".to_string())),
            stalled_ms: 1500,
            waits: waits.map(|p| (p, 1, "waits for data from".to_string())),
        }
    }

    #[test]
    fn lines_round_trip() {
        let s = st(2, Some(5), Some(0));
        assert_eq!(RankStatus::decode(&s.encode()), Some(s));
        let idle = RankStatus {
            stalled_ms: 0,
            ..st(1, None, None)
        };
        assert_eq!(RankStatus::decode(&idle.encode()), Some(idle));
        assert_eq!(RankStatus::decode("garbage"), None);
    }

    #[test]
    fn the_rank_that_has_not_joined_blocks() {
        let rows = vec![
            Row::Answer(st(0, Some(5), Some(2))),
            Row::Answer(st(1, Some(5), Some(0))),
            Row::Answer(st(2, None, None)),
        ];
        let b = blocking(&rows);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].0, 2);
        assert!(
            b[0].1
                .starts_with("rank 2 (host h, pid 102): not in allreduce seq 5"),
            "{b:?}"
        );
        let t = render("comm 00ab", 0, 3, &rows);
        assert!(t.ends_with("blocking: rank 2 (host h, pid 102): not in allreduce seq 5 (idle, last ended seq 4)\n"), "{t}");
        assert!(
            t.contains("waits for data from rank 2 (step 1), 1.5 s"),
            "{t}"
        );
    }

    #[test]
    fn a_silent_rank_blocks_and_waits_name_the_rest() {
        let rows = vec![
            Row::Answer(st(0, Some(5), Some(2))),
            Row::NoAnswer(2, "h2".into(), 7),
        ];
        let t = render("c", 0, 3, &rows);
        assert!(
            t.contains("    2  h2                      7  no answer\n"),
            "{t}"
        );
        assert!(
            t.ends_with("blocking: rank 2 (host h2, pid 7): no answer\n"),
            "{t}"
        );
        // All in the op: the peer waited on that is not waiting itself.
        let rows = vec![
            Row::Answer(st(0, Some(5), Some(1))),
            Row::Answer(st(1, Some(5), None)),
        ];
        assert_eq!(blocking(&rows)[0].0, 1);
        let idle = vec![Row::Answer(st(0, None, None))];
        assert!(render("c", 0, 1, &idle).ends_with("blocking: none\n"));
        // Moving ranks seen at different sequence numbers block nobody.
        let moving = |r, q| {
            Row::Answer(RankStatus {
                stalled_ms: 0,
                ..st(r, Some(q), None)
            })
        };
        assert!(blocking(&[moving(0, 7), moving(1, 9)]).is_empty());
    }
}
