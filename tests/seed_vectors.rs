//! The seed's own Triton kernels (MXFP8 and NVFP4 inserts, run on an NVIDIA
//! H200 by `scripts/seed/seed_vectors.py`) against the reference: every file
//! in `tests/vectors/seed_*.safetensors` must replay with zero differing
//! bytes, NaN, infinity, ±0, e2m1 ties and scale-exponent edge rows included.

use dsv4_kvcache::vectors::VectorFile;
use dsv4_kvcache::CpuBackend;
use std::path::PathBuf;

fn seed_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/vectors exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed_"))
                && p.extension().is_some_and(|e| e == "safetensors")
        })
        .collect();
    v.sort();
    v
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

#[test]
fn device_backends_reproduce_the_seed_kernels() {
    use std::io::Write;
    for f in seed_files() {
        let v = VectorFile::load(&f).expect("vector file loads");
        #[cfg(feature = "cuda")]
        match dsv4_kvcache::CudaBackend::new(0) {
            Ok(mut b) => {
                let r = v.replay(&mut b).expect("replays");
                assert_eq!(r.mismatch_count(), 0, "cuda {}:\n{r}", f.display());
            }
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "*** SKIPPED seed vectors on cuda: {e} ***"
                );
                assert!(std::env::var("DSV4_KVCACHE_REQUIRE_GPU").map_or(true, |x| x != "1"));
                return;
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = (
            v,
            writeln!(
                std::io::stderr(),
                "*** SKIPPED seed vectors on cuda: no `cuda` feature ***"
            ),
        );
    }
}
