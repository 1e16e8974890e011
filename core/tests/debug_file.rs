//! End to end through the global subscriber: NCCL_DEBUG_FILE with %h/%p,
//! filtering, the version and configuration lines, config warnings, and
//! whole lines under concurrent writers. (Own test binary: fresh globals.)

use hetccl_core::{config, obs};

fn prefix_ok(line: &str) -> bool {
    // <host>:<pid>:<tid> [<rank>|-] NCCL <LEVEL> hetccl: <message>
    let Some((head, _msg)) = line.split_once(" hetccl: ") else {
        return false;
    };
    let parts: Vec<&str> = head.split(' ').collect();
    if parts.len() != 4 || parts[2] != "NCCL" || !["INFO", "WARN", "TRACE"].contains(&parts[3]) {
        return false;
    }
    let ids: Vec<&str> = parts[0].split(':').collect();
    let rank = parts[1].trim_start_matches('[').trim_end_matches(']');
    ids.len() == 3
        && ids[0] == obs::short_hostname()
        && ids[1] == std::process::id().to_string()
        && ids[2].parse::<i64>().is_ok()
        && (rank == "-" || rank.parse::<i32>().is_ok())
}

#[test]
fn logs_to_the_debug_file() {
    let dir = std::env::temp_dir().join(format!("hetccl-debug-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let template = dir.join("nccl.%h.%p.log").to_string_lossy().into_owned();
    std::env::set_var("NCCL_DEBUG", "INFO");
    std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT,ENV");
    std::env::set_var("NCCL_DEBUG_FILE", &template);
    std::env::set_var("HETCCL_TIMEOUT", "5");
    std::env::set_var("NCCL_BUFFSIZE", "2M");

    obs::ensure_init();
    assert!(obs::owns_global_subscriber());
    assert_eq!(config::get().buffsize, 2 << 20);
    obs::print_version_once();
    obs::print_version_once();
    config::log_once();
    config::log_once();

    obs::set_thread_rank(Some(1));
    tracing::info!(target: "hetccl::INIT", "hello");
    tracing::info!(target: "hetccl::NET", "hidden");
    tracing::warn!(target: "hetccl::NET", "shown");
    tracing::debug!(target: "hetccl::INIT", "too verbose");
    tracing::info!(target: "some_other_crate", "not ours");

    let long = "x".repeat(3000);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let long = long.clone();
            std::thread::spawn(move || {
                obs::set_thread_rank(Some(t));
                for i in 0..100 {
                    tracing::info!(target: "hetccl::INIT", "t{t}-{i}-{long}-end");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }

    let path = obs::expand_debug_file(&template, obs::short_hostname(), std::process::id());
    let text = std::fs::read_to_string(&path).expect("the %h/%p-expanded file exists");
    let lines: Vec<&str> = text.lines().collect();
    let _ = std::fs::remove_dir_all(&dir);

    for l in &lines {
        assert!(prefix_ok(l), "bad line: {l:.200}");
    }
    let version = format!("NCCL INFO hetccl: {}", obs::version_line());
    assert_eq!(lines.iter().filter(|l| l.ends_with(&version)).count(), 1);
    assert!(lines.iter().any(|l| l.ends_with(
        "NCCL WARN hetccl: unknown variable HETCCL_TIMEOUT; did you mean HETCCL_TIMEOUT_S?"
    )));
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.ends_with("NCCL INFO hetccl: NCCL_DEBUG=INFO"))
            .count(),
        1
    );
    assert!(lines
        .iter()
        .any(|l| l.ends_with("NCCL INFO hetccl: NCCL_BUFFSIZE=2097152")));
    assert!(lines
        .iter()
        .any(|l| l.contains(" [1] NCCL INFO hetccl: hello")));
    assert!(lines
        .iter()
        .any(|l| l.contains(" [1] NCCL WARN hetccl: shown")));
    for absent in ["hidden", "too verbose", "not ours"] {
        assert!(!text.contains(absent), "{absent} was printed");
    }
    // Every concurrent line is whole and on its own line.
    for t in 0..8 {
        for i in 0..100 {
            let want = format!(" [{t}] NCCL INFO hetccl: t{t}-{i}-{long}-end");
            assert_eq!(
                lines.iter().filter(|l| l.ends_with(&want)).count(),
                1,
                "t{t}-{i}"
            );
        }
    }
}
