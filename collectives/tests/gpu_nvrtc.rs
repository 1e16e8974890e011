//! Compiles every GPU reduction kernel with NVIDIA's NVRTC on the CPU (no
//! GPU needed), so that a syntax or type error in `gpu/kernels/reduce.cu`
//! fails CI.
//!
//! NVRTC comes from NVIDIA's `nvidia-cuda-nvrtc-cu12` wheel, fetched by
//! `scripts/fetch-nvrtc.sh` (run by `scripts/setup.sh`) into
//! `${HETCCL_CACHE:-~/.cache/hetccl}/nvrtc`; `HETCCL_NVRTC_LIB` overrides the
//! path. Without the library the tests skip, unless `HETCCL_REQUIRE_NVRTC=1`
//! (set by `scripts/test.sh`), where they fail.

use hetccl_collectives::gpu::kernels::{self, CI_ARCHS};
use hetccl_collectives::gpu::nvrtc::Nvrtc;

use hetccl_testkit::nvrtc::{self, nvrtc_path};

fn open() -> Option<Nvrtc> {
    let required = nvrtc::required();
    let Some(path) = nvrtc_path() else {
        assert!(
            !required,
            "HETCCL_REQUIRE_NVRTC=1 but NVRTC is missing: run scripts/fetch-nvrtc.sh"
        );
        eprintln!("skipping: NVRTC not found (run scripts/fetch-nvrtc.sh)");
        return None;
    };
    match Nvrtc::open(Some(&path)) {
        Ok(n) => Some(n),
        Err(e) => panic!("{} exists but does not load: {e}", path.display()),
    }
}

#[test]
fn every_kernel_compiles_for_each_ci_architecture() {
    let Some(nvrtc) = open() else { return };
    let names = kernels::all_kernel_names();
    for arch in CI_ARCHS {
        let ptx = kernels::compile_ptx(&nvrtc, arch)
            .unwrap_or_else(|e| panic!("NVRTC {:?} for {arch}: {e}", nvrtc.version()));
        let target = format!(".target sm_{}", &arch["compute_".len()..]);
        assert!(ptx.contains(&target), "PTX for {arch} lacks {target}");
        for n in &names {
            assert!(
                ptx.contains(&format!(".entry {n}(")),
                "{n} is missing from the PTX for {arch}"
            );
        }
        let entries = ptx.matches(".entry ").count();
        assert_eq!(
            entries,
            names.len(),
            "unexpected extra entry points for {arch}"
        );
    }
}

#[test]
fn a_broken_kernel_fails_with_the_compiler_log() {
    let Some(nvrtc) = open() else { return };
    let bad = format!(
        "{}\nextern \"C\" __global__ void broken(float* p) {{ p[0] = undefined_name; }}\n",
        kernels::SOURCE
    );
    let e = nvrtc
        .compile(&bad, "broken.cu", &kernels::options("compute_90"))
        .unwrap_err();
    assert_ne!(e.status, 0);
    assert!(e.log.contains("undefined_name"), "{}", e.log);
}
