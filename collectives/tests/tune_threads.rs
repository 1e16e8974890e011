//! hetccl's own selection from a tuning table and a calibrated model, with
//! ranks as threads of this process: `HETCCL_TUNING_FILE` (a
//! `hetccl-tuning` table for 2 ranks on 1 node over shm) and
//! `HETCCL_TUNE=init` are set for the whole binary before the first
//! communicator reads the configuration.

use std::ffi::CStr;
use std::ptr::null_mut;

use hetccl_collectives::api::coll::ncclAllReduce;
use hetccl_collectives::api::ext::hetcclCommSelectionTable;
use hetccl_collectives::api::group::{ncclGroupEnd, ncclGroupStart};
use hetccl_testkit::threads::{check, comms, destroy, on_all, Comm};

const FLOAT: i32 = 7;
const SUM: i32 = 0;

/// Direct measured fastest for AllReduce of 8 B..4 KiB; nothing else.
const TABLE: &str = r#"{"format":"hetccl-tuning","version":1,"meta":{"by":"tune_threads"},
  "layouts":[{"nranks":2,"nnodes":1,"transports":["shm"],"entries":[
    {"collective":"allreduce","algo":"direct","points":[[8,1.0],[4096,2.0]]},
    {"collective":"allreduce","algo":"ring","points":[[8,100.0],[4096,200.0]]}]}]}"#;

fn setup_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let path = hetccl_testkit::tmp_dir().join("tune_threads_table.json");
        std::fs::write(&path, TABLE).unwrap();
        std::env::set_var("HETCCL_TUNING_FILE", &path);
        std::env::set_var("HETCCL_TUNE", "init");
        std::env::set_var("HETCCL_TUNE_BUDGET_MS", "20");
    });
}

fn selection_table(c: Comm) -> String {
    let mut needed = 0usize;
    // SAFETY: NULL buffer with length 0; `needed` is a writable size_t.
    check(unsafe { hetcclCommSelectionTable(c.0, null_mut(), 0, &mut needed) });
    let mut buf = vec![0 as std::ffi::c_char; needed + 1];
    // SAFETY: `buf` holds `buf.len()` writable bytes.
    check(unsafe { hetcclCommSelectionTable(c.0, buf.as_mut_ptr(), buf.len(), null_mut()) });
    // SAFETY: NUL-terminated by the call.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_table_and_the_calibrated_model_choose_and_results_are_exact() {
    setup_env();
    let cs = comms(2);
    let tables: Vec<String> = cs.iter().map(|&c| selection_table(c)).collect();
    assert_eq!(tables[0], tables[1], "both ranks choose alike");
    let text = &tables[0];
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("allreduce "))
        .collect();
    // 0 B: the model (calibrated); 8 B .. 4 KiB: the table's Direct; above:
    // the calibrated model again.
    assert!(
        rows[0].contains(" 0 B - ") && rows[0].ends_with("calibrated"),
        "{text}"
    );
    let from_table: Vec<&&str> = rows.iter().filter(|l| l.ends_with(" table")).collect();
    assert_eq!(from_table.len(), 1, "{text}");
    assert!(
        from_table[0].contains("8 B - 4 KiB") && from_table[0].contains("Direct"),
        "{text}"
    );
    assert!(rows.last().unwrap().ends_with("calibrated"), "{text}");
    // Other collectives have no entries: calibrated model everywhere.
    assert!(text
        .lines()
        .filter(|l| l.trim_start().starts_with("broadcast "))
        .all(|l| l.ends_with("calibrated")));
    // Grouped calls go through the executor's selection; results exact.
    for count in [1usize, 100, 5000] {
        let outs = on_all(&cs, |r, c| {
            let send: Vec<f32> = (0..count).map(|i| (r * 5 + i % 13) as f32).collect();
            let mut recv = vec![-1.0f32; count];
            // SAFETY: buffers of `count` floats owned by this closure for
            // the whole group.
            unsafe {
                check(ncclGroupStart());
                check(ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    count,
                    FLOAT,
                    SUM,
                    c.0,
                    null_mut(),
                ));
                check(ncclGroupEnd());
            }
            recv
        });
        for out in outs {
            for (i, v) in out.iter().enumerate() {
                assert_eq!(*v, (5 + 2 * (i % 13)) as f32, "count {count} i {i}");
            }
        }
    }
    destroy(cs);
}
