//! The seed's own Triton kernels (MXFP8 and NVFP4 inserts, run on an NVIDIA
//! H200 by `scripts/peers/seed_vectors.py`) against the reference: every file
//! in `tests/vectors/seed_*.safetensors` must replay with zero differing
//! bytes, NaN, infinity, ±0, e2m1 ties and scale-exponent edge rows included,
//! on the CPU reference and on each GPU backend (skipped, loudly, without a
//! device; a failure where `DSV4_KVCACHE_REQUIRE_GPU` requires one).

use dsv4_kvcache::vectors::VectorFile;
use dsv4_kvcache::CpuBackend;
use std::path::PathBuf;

#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;
#[path = "gpu_pair/mod.rs"]
#[macro_use]
mod gpu_pair;

#[path = "flips_a_byte/mod.rs"]
mod flips_a_byte;
use flips_a_byte::{Flip, FlipsAByte};

fn seed_files() -> Vec<PathBuf> {
    gpu_required::vector_files("seed_")
}

#[test]
fn reference_reproduces_the_seed_kernels_byte_for_byte() {
    let files = seed_files();
    assert_eq!(
        files.len(),
        8,
        "expected the 8 seed vector files (mxfp8/nvfp4 x cr1/cr2 x sanitize)"
    );
    for f in files {
        let v = VectorFile::load(&f).expect("vector file loads");
        let mut cpu = CpuBackend::new();
        let report = v.replay(&mut cpu).expect("replays");
        assert_eq!(report.mismatch_count(), 0, "{}:\n{report}", f.display());
        println!(
            "{}: {} bytes compared, 0 differ",
            f.display(),
            report.bytes_compared
        );
    }
}

/// Replays every seed file on `b`; panics on the first mismatch.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
fn replay_all<B: dsv4_kvcache::Backend>(b: &mut B) {
    for f in seed_files() {
        let v = VectorFile::load(&f).expect("vector file loads");
        let r = v.replay(b).expect("replays");
        assert_eq!(r.mismatch_count(), 0, "{} {}:\n{r}", b.name(), f.display());
        println!(
            "{} {}: {} bytes compared, 0 differ",
            b.name(),
            f.display(),
            r.bytes_compared
        );
    }
}

gpu_tests!(
    cuda_reproduces_the_seed_kernels,
    hip_reproduces_the_seed_kernels,
    label = "seed vectors",
    |b| replay_all(b)
);

/// The replay check can fail: the CPU reference whose latent buffers read
/// back with a byte flipped does not reproduce the seed files.
#[test]
fn replay_detects_a_wrong_backend() {
    let f = &seed_files()[0];
    let v = VectorFile::load(f).expect("vector file loads");
    let mut wrong = FlipsAByte::new(Flip::Last(0x80));
    let r = v.replay(&mut wrong).expect("replays");
    assert!(
        r.mismatch_count() > 0,
        "a flipped byte went unnoticed:\n{r}"
    );
}
