use super::*;

fn table(entries: &str) -> String {
    format!(
        r#"{{"format":"{FORMAT}","version":1,"meta":{{"tool":"x","n":[1,2]}},
           "layouts":[{{"nranks":4,"nnodes":2,"transports":["tcp","shm"],"entries":[{entries}]}}]}}"#
    )
}

const RING: &str =
    r#"{"collective":"allreduce","algo":"ring","points":[[8,35.2],[65536,120.0],[1048576,900.5]]}"#;

#[test]
fn parses_the_documented_example() {
    let t = Table::parse(table(RING).as_bytes()).unwrap();
    let shm_tcp = [TransportKind::Shm, TransportKind::Tcp];
    let l = t.layout(4, 2, &shm_tcp).unwrap();
    assert_eq!(l.transports, shm_tcp.to_vec());
    assert!(t
        .layout(4, 2, &[TransportKind::Tcp, TransportKind::Shm])
        .is_some());
    assert!(t.layout(4, 2, &[TransportKind::Tcp]).is_none());
    assert!(t.layout(4, 1, &shm_tcp).is_none());
    assert!(t.layout(8, 2, &shm_tcp).is_none());
    let e = l.entry(Collective::AllReduce, Algorithm::Ring).unwrap();
    assert_eq!(e.points.len(), 3);
    assert!(l.entry(Collective::AllReduce, Algorithm::Tree).is_none());
    assert!(l.entry(Collective::Broadcast, Algorithm::Ring).is_none());
}

#[test]
fn names_are_case_insensitive_without_separators() {
    let t = Table::parse(
        table(
            r#"{"collective":"AllReduce","algo":"Halving_Doubling","points":[[1,1]]},
               {"collective":"all_gather","algo":"RING","points":[[1,1]]},
               {"collective":"alltoall","algo":"pair-wise","points":[[1,1]]}"#,
        )
        .as_bytes(),
    )
    .unwrap();
    let l = &t.layouts[0];
    assert!(l
        .entry(Collective::AllReduce, Algorithm::HalvingDoubling)
        .is_some());
    assert!(l.entry(Collective::AllGather, Algorithm::Ring).is_some());
    assert!(l.entry(Collective::AlltoAll, Algorithm::Pairwise).is_some());
}

#[test]
fn interpolates_in_log_log_inside_the_points_only() {
    let t = Table::parse(table(RING).as_bytes()).unwrap();
    let e = &t.layouts[0].entries[0];
    assert_eq!(e.time_at(7), None);
    assert_eq!(e.time_at(1048577), None);
    assert_eq!(e.time_at(8), Some(35.2));
    assert_eq!(e.time_at(65536), Some(120.0));
    assert_eq!(e.time_at(1048576), Some(900.5));
    // Halfway in log(bytes) between 65536 and 1 MiB is 256 KiB: the
    // geometric mean of the two times.
    let mid = e.time_at(262144).unwrap();
    assert!((mid - (120.0f64 * 900.5).sqrt()).abs() < 1e-9, "{mid}");
    // A power law is reproduced exactly.
    let pow = Entry {
        collective: Collective::AllReduce,
        algo: Algorithm::Ring,
        points: vec![(10, 100.0), (1000, 1.0)],
    };
    assert!((pow.time_at(100).unwrap() - 10.0).abs() < 1e-9);
    // Monotone between neighbours.
    let mut last = 0.0;
    for b in (8..=1048576u64).step_by(4099) {
        let t = e.time_at(b).unwrap();
        assert!(t >= last, "{b}: {t} < {last}");
        last = t;
    }
    let one = Entry {
        collective: Collective::AllReduce,
        algo: Algorithm::Ring,
        points: vec![(64, 3.0)],
    };
    assert_eq!(
        (one.time_at(63), one.time_at(64), one.time_at(65)),
        (None, Some(3.0), None)
    );
}

#[test]
fn the_plugin_format_is_told_apart() {
    let plugin = r#"{"format":"hetccl-nccl-tuning","version":1,"layouts":[]}"#;
    assert_eq!(
        Table::parse(plugin.as_bytes()),
        Err(TableError::OtherFormat(PLUGIN_FORMAT.into()))
    );
}

#[test]
fn layouts_round_trip_through_json() {
    let t = Table::parse(
        table(&format!(
            r#"{RING},{{"collective":"broadcast","algo":"tree","points":[[1,0.1],[3,1e-3]]}}"#
        ))
        .as_bytes(),
    )
    .unwrap();
    let l = &t.layouts[0];
    let back = Table::parse(l.to_json().as_bytes()).unwrap();
    assert_eq!(back.layouts, vec![l.clone()]);
}

#[test]
fn rejects_bad_tables_with_a_reason() {
    let lay = |s: &str| format!(r#"{{"format":"{FORMAT}","version":1,"layouts":[{s}]}}"#);
    let cases: Vec<(String, &str)> = vec![
        ("".into(), "not JSON"),
        ("[]".into(), "object"),
        (
            r#"{"format":"x","version":1,"layouts":[]}"#.into(),
            "format",
        ),
        (
            format!(r#"{{"format":"{FORMAT}","version":2,"layouts":[]}}"#),
            "version 2",
        ),
        (
            format!(r#"{{"format":"{FORMAT}","version":1,"layouts":[],"x":1}}"#),
            "unknown key",
        ),
        (format!(r#"{{"format":"{FORMAT}","version":1}}"#), "layouts"),
        (
            lay(r#"{"nranks":2,"nnodes":3,"transports":[],"entries":[]}"#),
            "nnodes",
        ),
        (
            lay(r#"{"nranks":0,"nnodes":0,"transports":[],"entries":[]}"#),
            "nranks 0",
        ),
        (lay(r#"{"nranks":2,"nnodes":1,"entries":[]}"#), "transports"),
        (
            lay(r#"{"nranks":2,"nnodes":1,"transports":["nvlink"],"entries":[]}"#),
            "nvlink",
        ),
        (
            lay(r#"{"nranks":2,"nnodes":1,"transports":["tcp","tcp"],"entries":[]}"#),
            "twice",
        ),
        (
            lay(r#"{"nranks":2,"nnodes":1,"transports":[1],"entries":[]}"#),
            "strings",
        ),
        (
            lay(r#"{"nranks":2,"nnodes":1,"transports":[],"entries":[],"extra":0}"#),
            "unknown key",
        ),
        (
            lay(
                r#"{"nranks":2,"nnodes":1,"transports":["shm","tcp"],"entries":[]},
                   {"nranks":2,"nnodes":1,"transports":["tcp","shm"],"entries":[]}"#,
            ),
            "second layout",
        ),
        (
            table(r#"{"collective":"send","algo":"direct","points":[[1,1]]}"#),
            "collective",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"mesh","points":[[1,1]]}"#),
            "algo",
        ),
        (
            table(r#"{"collective":"allgather","algo":"tree","points":[[1,1]]}"#),
            "does not implement",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring"}"#),
            "points",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[]}"#),
            "empty",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[1]]}"#),
            "[bytes, microseconds]",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[1,2,3]]}"#),
            "[bytes, microseconds]",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[0,1]]}"#),
            "bytes must be",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[1.5,1]]}"#),
            "bytes must be",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[-8,1]]}"#),
            "bytes must be",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[8,0]]}"#),
            "microseconds",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[8,-1]]}"#),
            "microseconds",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[8,"1"]]}"#),
            "microseconds",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[8,1e300]]}"#),
            "microseconds",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[8,1],[8,2]]}"#),
            "not above",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[9,1],[8,2]]}"#),
            "not above",
        ),
        (
            table(r#"{"collective":"allreduce","algo":"ring","points":[[1,1]],"proto":"ll"}"#),
            "unknown key",
        ),
        (table(&format!("{RING},{RING}")), "second entry"),
    ];
    for (text, why) in &cases {
        let e = Table::parse(text.as_bytes()).unwrap_err().to_string();
        assert!(e.contains(why), "{text}: {e} (want {why:?})");
    }
}

#[test]
fn bounds_sizes_and_counts() {
    let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
    assert!(Table::parse(&big)
        .unwrap_err()
        .to_string()
        .contains("at most"));
    let pts: Vec<String> = (1..=MAX_POINTS + 1).map(|b| format!("[{b},1]")).collect();
    let many = format!(
        r#"{{"collective":"allreduce","algo":"ring","points":[{}]}}"#,
        pts.join(",")
    );
    let e = Table::parse(table(&many).as_bytes()).unwrap_err();
    assert!(e.to_string().contains("at most 256"), "{e}");
    let deep = "[".repeat(100_000);
    assert!(Table::parse(deep.as_bytes()).is_err());
    assert!(Table::load("/nonexistent/t.json")
        .unwrap_err()
        .to_string()
        .contains("cannot open"));
    assert!(Table::load("/dev/zero")
        .unwrap_err()
        .to_string()
        .contains("regular"));
}

/// A small xorshift generator, so that the mutated cases are reproducible.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn garbage_and_mutations_never_panic_and_what_parses_is_valid() {
    let good = table(&format!(
        r#"{RING},{{"collective":"broadcast","algo":"tree","points":[[1,2.5],[4096,9]]}}"#
    ));
    assert!(Table::parse(good.as_bytes()).is_ok());
    let alphabet = br#"{}[]":,0123456789-.eE truefalsnl\"#;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..20_000 {
        let mut bytes = good.clone().into_bytes();
        let edits = 1 + rng(&mut seed) % 8;
        for _ in 0..edits {
            let at = (rng(&mut seed) as usize) % bytes.len();
            match rng(&mut seed) % 4 {
                0 => bytes[at] = rng(&mut seed) as u8,
                1 => bytes[at] = alphabet[(rng(&mut seed) as usize) % alphabet.len()],
                2 => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, alphabet[(rng(&mut seed) as usize) % alphabet.len()]),
            }
            if bytes.is_empty() {
                break;
            }
        }
        if let Ok(t) = Table::parse(&bytes) {
            for l in &t.layouts {
                assert!(l.nnodes >= 1 && l.nnodes <= l.nranks, "round {round}");
                for e in &l.entries {
                    assert!(!e.points.is_empty(), "round {round}");
                    assert!(e.points.windows(2).all(|w| w[0].0 < w[1].0));
                    assert!(e.points.iter().all(|p| p.0 >= 1 && p.1 > 0.0));
                    let (lo, hi) = (e.points[0].0, e.points[e.points.len() - 1].0);
                    let t = e.time_at(lo + (hi - lo) / 2).unwrap();
                    assert!(t.is_finite() && t > 0.0, "round {round}: {t}");
                }
            }
        }
    }
    for len in 0..2000 {
        let junk: Vec<u8> = (0..len).map(|_| rng(&mut seed) as u8).collect();
        assert!(Table::parse(&junk).is_err(), "random bytes of length {len}");
    }
}
