#![cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
//! The `munmap`/`mremap` hooks of `libhetccl.so` (`src/unmap_hook.rs`):
//! in this binary, which links the library, a `munmap` reaches the hook and
//! the verbs unmap ring sees it; and `tests/c/unmap_hook.c`, run with
//! `LD_PRELOAD=libhetccl.so`, binds both functions to the library and gets
//! the same results and `errno`s as without it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hetccl_testkit::{cc, hetccl_so};
use nccl_net_plugin::ib::unmap::{self, Since};

const PAGE: usize = 4096;

#[test]
fn munmap_in_this_process_is_recorded() {
    // Keep the hook linked and called through its symbol.
    let hook: unsafe extern "C" fn(*mut libc::c_void, usize) -> libc::c_int =
        hetccl::unmap_hook::munmap;
    let mut r = unmap::Reader::new();
    // SAFETY: a fresh private anonymous mapping, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            3 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let a = p as usize;
    // SAFETY: pages of our mapping.
    assert_eq!(unsafe { hook((a + PAGE) as *mut _, PAGE) }, 0);
    // SAFETY: as above; libc's name, which binds to the hook here.
    assert_eq!(unsafe { libc::munmap(a as *mut _, PAGE) }, 0);
    // A failing call is not recorded.
    // SAFETY: an unaligned address: the kernel refuses it.
    assert_eq!(unsafe { hook((a + 2 * PAGE + 1) as *mut _, PAGE) }, -1);
    let Since::Ranges(v) = r.since() else {
        panic!("lost records")
    };
    let mine: Vec<_> = v
        .into_iter()
        .filter(|&(s, _)| (a..a + 3 * PAGE).contains(&s))
        .collect();
    assert!(
        mine.contains(&(a + PAGE, a + 2 * PAGE)),
        "the hook's unmap was not recorded: {mine:?}"
    );
    assert!(
        mine.iter().all(|&(s, _)| s % PAGE == 0),
        "a failed unmap was recorded: {mine:?}"
    );
    // SAFETY: the last page of our mapping.
    assert_eq!(unsafe { hook((a + 2 * PAGE) as *mut _, PAGE) }, 0);
}

fn program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/unmap_hook.c",
            "unmap_hook",
            &cc::CcOpts {
                link_nvidia_nccl: false,
                extra: vec!["-ldl".into()],
            },
        )
    })
}

fn run(preload: Option<&Path>) -> BTreeMap<String, String> {
    let mut cmd = Command::new(program());
    cmd.env_remove("LD_PRELOAD").env_remove("NCCL_DEBUG");
    if let Some(so) = preload {
        cmd.env("LD_PRELOAD", so);
    }
    let out = cc::run_ok(&mut cmd);
    cc::parse_kv(&String::from_utf8(out.stdout).expect("UTF-8 output"))
}

#[test]
fn preloaded_hooks_bind_and_behave_as_libc() {
    let so = hetccl_so();
    let plain = run(None);
    let pre = run(Some(&so));
    for f in ["munmap", "mremap"] {
        let k = format!("origin.{f}");
        let origin = Path::new(&pre[&k]).canonicalize().ok();
        assert_eq!(
            origin.as_deref(),
            Some(so.as_path()),
            "{f} bound to {}",
            pre[&k]
        );
        assert_ne!(plain[&k], pre[&k]);
    }
    for k in [
        "munmap.middle",
        "intact",
        "munmap.unaligned",
        "mremap.ok",
        "mremap.bad",
        "munmap.rest",
        "malloc",
    ] {
        assert_eq!(pre.get(k), plain.get(k), "{k} differs under the preload");
    }
    assert_eq!(pre["munmap.middle"], "0");
    assert_eq!(pre["intact"], "1");
    assert_eq!(pre["munmap.unaligned"], "-1 1");
    assert_eq!(pre["mremap.ok"], "1");
    assert_eq!(pre["mremap.bad"], "1 1");
    assert_eq!(pre["munmap.rest"], "0 0");
    assert_eq!(pre["malloc"], "ok");
}
