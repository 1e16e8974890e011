//! Compiles every GPU reduction kernel with NVIDIA's NVRTC on the CPU (no
//! GPU needed), to PTX and to a CUBIN per architecture, so that a syntax or
//! type error in `gpu/kernels/reduce.cu` fails CI.
//!
//! NVRTC comes from NVIDIA's `nvidia-cuda-nvrtc-cu12` wheel, fetched by
//! `scripts/fetch-nvrtc.sh` (run by `scripts/setup.sh`) into
//! `${HETCCL_CACHE:-~/.cache/hetccl}/nvrtc`; `HETCCL_NVRTC_LIB` overrides the
//! path. Without the library the tests skip, unless `HETCCL_REQUIRE_NVRTC=1`
//! (set by `scripts/test.sh`), where they fail.

use hetccl_collectives::gpu::kernels::{self, CI_ARCHS, CI_SMS};
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

/// Whether `bin` holds `name` as a NUL-terminated string (its string table).
fn has_symbol(bin: &[u8], name: &str) -> bool {
    let mut pat = vec![0u8];
    pat.extend_from_slice(name.as_bytes());
    pat.push(0);
    bin.windows(pat.len()).any(|w| w == pat)
}

#[test]
fn every_kernel_compiles_to_a_cubin_for_each_ci_architecture() {
    let Some(nvrtc) = open() else { return };
    let names = kernels::all_kernel_names();
    for sm in CI_SMS {
        let bin = kernels::compile_cubin(&nvrtc, sm)
            .unwrap_or_else(|e| panic!("NVRTC {:?} CUBIN for {sm}: {e}", nvrtc.version()));
        assert_eq!(&bin[..4], b"\x7fELF", "{sm}: not an ELF image");
        // e_machine EM_CUDA (190); e_flags' low byte is the architecture.
        assert_eq!(
            u16::from_le_bytes([bin[18], bin[19]]),
            190,
            "{sm}: e_machine"
        );
        let flags = u32::from_le_bytes(bin[48..52].try_into().unwrap());
        assert_eq!(
            flags & 0xff,
            sm["sm_".len()..].parse::<u32>().unwrap(),
            "{sm}: e_flags"
        );
        for n in &names {
            assert!(
                has_symbol(&bin, n),
                "{n} is missing from the CUBIN for {sm}"
            );
        }
    }
    // A virtual architecture gives PTX only: asking for a CUBIN fails.
    let e = kernels::compile_cubin(&nvrtc, "compute_90").unwrap_err();
    assert!(!e.log.is_empty(), "{e}");
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
