//! The emulated libibverbs (`tests/c/fake_ibverbs.c`) for tests of the
//! verbs transport's device discovery and GPUDirect registration paths on
//! machines without RDMA hardware: one RoCE device and port; registrations
//! are logged to the file `FAKE_IBV_LOG`, never touching memory; sends
//! complete at once and move nothing. Point `HETCCL_IBVERBS_LIB` at
//! [`fake_verbs_lib`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{cc, tmp_dir};

/// Compiles the fake (first call only) into
/// [`tmp_dir`]`/fake_ibverbs_<tag>/libibverbs.so.1` and returns its path;
/// `tag` must differ between test binaries.
pub fn fake_verbs_lib(tag: &str) -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let name = format!("fake_ibverbs_{tag}");
        let dir = tmp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        cc::compile_c(
            "tests/c/fake_ibverbs.c",
            &format!("{name}/libibverbs.so.1"),
            &cc::CcOpts {
                link_nvidia_nccl: false,
                extra: vec!["-shared".into(), "-fPIC".into(), "-pthread".into()],
            },
        )
    })
}
