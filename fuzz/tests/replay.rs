//! Replays every seed (and any corpus or crash artifact present) through
//! every target, then a few thousand pseudo-random and mutated inputs per
//! target. Runs on stable Rust: `cargo test --release` in `fuzz/`
//! (`scripts/fuzz.sh --replay`). `HETCCL_FUZZ_REPLAY_N` sets the number of
//! random inputs per target (default 3000).

use std::path::{Path, PathBuf};

use hetccl_fuzz::{run, TARGETS};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.is_file());
    v.sort();
    v
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn seeds_have_files_for_every_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for t in TARGETS {
        let n = files(&root.join("seeds").join(t)).len();
        assert!(
            n >= 3,
            "seeds/{t} has {n} files; commit a few valid and invalid inputs"
        );
    }
}

#[test]
fn replay_all_targets() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let n: usize = std::env::var("HETCCL_FUZZ_REPLAY_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    for t in TARGETS {
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for dir in ["seeds", "corpus", "artifacts"] {
            for f in files(&root.join(dir).join(t)) {
                inputs.push(std::fs::read(&f).unwrap());
            }
        }
        let seeds = inputs.len();
        for i in 0..seeds {
            assert!(run(t, &inputs[i]), "unknown target {t}");
        }
        // Random inputs, and seeds with a few bytes flipped.
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ t.len() as u64);
        for k in 0..n {
            let data: Vec<u8> = if seeds > 0 && k % 2 == 0 {
                let mut d = inputs[(rng.next() as usize) % seeds].clone();
                for _ in 0..1 + rng.next() % 4 {
                    if d.is_empty() {
                        break;
                    }
                    let i = (rng.next() as usize) % d.len();
                    d[i] ^= 1 << (rng.next() % 8);
                }
                d
            } else {
                let len = (rng.next() % 300) as usize;
                (0..len).map(|_| rng.next() as u8).collect()
            };
            run(t, &data);
        }
        eprintln!("replay {t}: {seeds} files, {n} generated inputs: ok");
    }
}
