//! Flag parsing: nccl-tests' letters, long names, defaults and size
//! suffixes; the argv[0] alias and `-np`; the size sweeps.

use hetccl_perf::cli::{parse, parse_size, split_argv, Alloc};
use hetccl_perf::coll::Coll;
use hetccl_perf::dtype::{DType, Op};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn defaults_are_nccl_tests_defaults() {
    let o = parse(Coll::AllReduce, &[]).unwrap();
    assert_eq!(
        (o.min_bytes, o.max_bytes, o.step_bytes, o.step_factor),
        (32 << 20, 32 << 20, 1 << 20, 1)
    );
    assert_eq!(
        (o.iters, o.warmup_iters, o.agg_iters, o.run_cycles, o.check),
        (20, 1, 1, 1, 1)
    );
    assert_eq!(
        (o.op, o.dtype, o.root, o.blocking, o.average),
        (Some(Op::Sum), Some(DType::Float), 0, 0, 1)
    );
    assert_eq!(
        (o.np, o.threads, o.alloc, o.init_config, o.unalign),
        (0, 0, Alloc::Nccl, true, 0)
    );
    assert_eq!(o.timeout_s, 600);
    assert!(o.json.is_none() && o.lib.is_none() && o.id_file.is_none());
}

#[test]
fn sizes_take_k_m_g_suffixes_in_powers_of_1024() {
    assert_eq!(parse_size("8").unwrap(), 8);
    assert_eq!(parse_size("1K").unwrap(), 1024);
    assert_eq!(parse_size("1k").unwrap(), 1024);
    assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
    assert_eq!(parse_size("2G").unwrap(), 2 << 30);
    assert_eq!(parse_size("16 M").unwrap(), 16 << 20);
    assert_eq!(parse_size("0").unwrap(), 0);
    for bad in ["x", "1T", "", "-4", "M"] {
        assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
    }
}

#[test]
fn every_flag_short_long_and_attached() {
    let o = parse(
        Coll::Reduce,
        &args("-b 8 -e 1M -f 4 -i 2K -n 5 -w 3 -m 2 -N 0 -c 2 -o all -d all -r -1 -z 3 -a 2 -T 10 -J out.json -C 1 -u 1 -t 1 -g 1 -p 1 -y 1 -G 0 -R 0 -S 0 -M 0 -I 0"),
    )
    .unwrap();
    assert_eq!(
        (o.min_bytes, o.max_bytes, o.step_factor, o.step_bytes),
        (8, 1 << 20, 4, 2048)
    );
    assert_eq!(
        (o.iters, o.warmup_iters, o.agg_iters, o.run_cycles, o.check),
        (5, 3, 2, 0, 2)
    );
    assert_eq!(
        (o.op, o.dtype, o.root, o.blocking, o.average, o.timeout_s),
        (None, None, -1, 3, 2, 10)
    );
    assert_eq!(o.json.as_deref(), Some(std::path::Path::new("out.json")));
    assert!(o.report_cputime);
    assert_eq!(o.unalign, 1);

    let o = parse(
        Coll::AllReduce,
        &args("-b8 -e64K --stepfactor=2 --iters 7 --op=max --datatype bfloat16 --np 3"),
    )
    .unwrap();
    assert_eq!(
        (o.min_bytes, o.max_bytes, o.step_factor, o.iters),
        (8, 64 << 10, 2, 7)
    );
    assert_eq!((o.op, o.dtype, o.np), (Some(Op::Max), Some(DType::Bf16), 3));

    let o = parse(
        Coll::AllReduce,
        &args("--threads 4 --lib /x/lib.so --id-file /s/id --alloc host --init rank"),
    )
    .unwrap();
    assert_eq!((o.threads, o.alloc, o.init_config), (4, Alloc::Host, false));
    assert_eq!(o.lib.unwrap().to_str(), Some("/x/lib.so"));
    assert_eq!(o.id_file.unwrap().to_str(), Some("/s/id"));
}

#[test]
fn unsupported_values_are_refused_with_a_reason() {
    for bad in [
        "-t 2",
        "-g 2",
        "-G 1",
        "-R 1",
        "-z 4",
        "-a 4",
        "-b 2M -e 1M",
        "-r -2",
        "-m 0",
        "--alloc gpu",
        "--np 2 --threads 2",
        "--bogus 1",
    ] {
        let e = parse(Coll::AllReduce, &args(bad)).expect_err(bad);
        assert!(!e.is_empty(), "{bad}");
    }
    let e = parse(Coll::AllReduce, &args("-t 4")).unwrap_err();
    assert!(e.contains("--threads"), "{e}");
}

#[test]
fn invalid_op_and_type_default_like_nccl_tests() {
    let o = parse(Coll::AllReduce, &args("-o bogus -d nope")).unwrap();
    assert_eq!((o.op, o.dtype), (Some(Op::Sum), Some(DType::Float)));
    assert_eq!(
        o.notes,
        vec![
            "invalid op bogus, defaulting to sum .. ".to_string(),
            "invalid type nope, defaulting to float .. ".to_string()
        ]
    );
    for (name, t) in [
        ("int8", DType::Int8),
        ("half", DType::Half),
        ("f8e5m2", DType::F8E5M2),
        ("double", DType::Double),
    ] {
        assert_eq!(
            parse(Coll::AllReduce, &args(&format!("-d {name}")))
                .unwrap()
                .dtype,
            Some(t)
        );
    }
    for o in Op::ALL {
        assert_eq!(
            parse(Coll::AllReduce, &args(&format!("-o {}", o.name())))
                .unwrap()
                .op,
            Some(o)
        );
    }
}

#[test]
fn collective_comes_from_argv0_or_the_first_argument() {
    let (c, f) = split_argv(&args("/usr/bin/all_reduce_perf -b 8")).unwrap();
    assert_eq!((c, f), (Coll::AllReduce, args("-b 8")));
    let (c, f) = split_argv(&args("./alltoall_perf_mpi")).unwrap();
    assert_eq!((c, f.len()), (Coll::AlltoAll, 0));
    let (c, f) = split_argv(&args("hetccl-perf reduce_scatter -np 4 -b 1K")).unwrap();
    assert_eq!((c, f), (Coll::ReduceScatter, args("--np 4 -b 1K")));
    for c in Coll::ALL {
        assert_eq!(
            split_argv(&args(&format!("hetccl-perf {}", c.name())))
                .unwrap()
                .0,
            c
        );
        assert_eq!(
            split_argv(&args(&format!("{}_perf", c.name()))).unwrap().0,
            c
        );
    }
    assert!(split_argv(&args("hetccl-perf allreduce")).is_err());
    assert!(split_argv(&args("hetccl-perf")).is_err());
}

#[test]
fn sweeps_step_like_nccl_tests() {
    let o = parse(Coll::AllReduce, &args("-b 8 -e 1M -f 4")).unwrap();
    assert_eq!(
        o.sizes(),
        vec![8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288]
    );
    assert_eq!(o.warmup_sizes().len(), 18); // 8 .. 1M doubling
    let o = parse(Coll::AllReduce, &args("-b 1K -e 4K -i 1K")).unwrap();
    assert_eq!(o.sizes(), vec![1024, 2048, 3072, 4096]);
    let o = parse(Coll::AllReduce, &args("-b 0 -e 8 -f 2")).unwrap();
    assert_eq!(
        o.sizes(),
        vec![0],
        "a zero size stops the sweep instead of looping"
    );
    assert_eq!(o.warmup_sizes(), vec![0]);
    let o = parse(Coll::AllReduce, &[]).unwrap();
    assert_eq!(o.sizes(), vec![32 << 20]);
}

#[test]
fn all_types_and_ops_follow_the_library_version() {
    let o = parse(Coll::AllReduce, &args("-d all -o all")).unwrap();
    assert_eq!(o.dtypes(22800).len(), 12);
    assert_eq!(o.dtypes(22300).len(), 10, "fp8 needs 2.24");
    assert_eq!(o.dtypes(20900).len(), 9, "bf16 needs 2.10");
    assert_eq!(o.ops(22800).len(), 6);
    assert_eq!(o.ops(21000).len(), 5, "premul-sum needs 2.11");
    assert_eq!(o.ops(20900).len(), 4, "avg needs 2.10");
}
