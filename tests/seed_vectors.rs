//! The seed's own Triton kernels (MXFP8 and NVFP4 inserts, run on an NVIDIA
//! H200 by `scripts/seed/seed_vectors.py`) against the reference: every file
//! in `tests/vectors/seed_*.safetensors` must replay with zero differing
//! bytes, NaN, infinity, ±0, e2m1 ties and scale-exponent edge rows included,
//! on the CPU reference and on each GPU backend (skipped, loudly, without a
//! device; a failure where `DSV4_KVCACHE_REQUIRE_GPU` requires one).

use dsv4_kvcache::vectors::VectorFile;
use dsv4_kvcache::{CompressArgs, CpuBackend, FusedArgs, InsertArgs, Result, RingArgs, SkipCounts};
use std::path::PathBuf;

#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;

fn seed_files() -> Vec<PathBuf> {
    let dir = gpu_required::vectors_dir();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("vector folder {}: {e}", dir.display()))
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

#[test]
fn cuda_reproduces_the_seed_kernels() {
    on_gpu!(cuda, "seed vectors", |b| replay_all(b));
}

#[test]
fn hip_reproduces_the_seed_kernels() {
    on_gpu!(hip, "seed vectors", |b| replay_all(b));
}

/// The replay check can fail: the CPU reference whose latent buffers read
/// back with a byte flipped does not reproduce the seed files.
#[test]
fn replay_detects_a_wrong_backend() {
    let f = &seed_files()[0];
    let v = VectorFile::load(f).expect("vector file loads");
    let mut wrong = FlipsAByte(CpuBackend::new());
    let r = v.replay(&mut wrong).expect("replays");
    assert!(
        r.mismatch_count() > 0,
        "a flipped byte went unnoticed:\n{r}"
    );
}

/// A deliberately wrong backend: the CPU reference whose reads come back
/// with their last byte flipped.
struct FlipsAByte(CpuBackend);

impl dsv4_kvcache::Backend for FlipsAByte {
    type Buffer = <CpuBackend as dsv4_kvcache::Backend>::Buffer;
    fn name(&self) -> String {
        "cpu, reads with their last byte flipped".into()
    }
    fn sanitize(&self) -> bool {
        self.0.sanitize()
    }
    fn set_sanitize(&mut self, on: bool) {
        self.0.set_sanitize(on)
    }
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buffer> {
        self.0.upload(bytes)
    }
    fn write(&self, buf: &mut Self::Buffer, bytes: &[u8]) -> Result<()> {
        self.0.write(buf, bytes)
    }
    fn read(&self, buf: &Self::Buffer) -> Result<Vec<u8>> {
        let mut v = self.0.read(buf)?;
        if let Some(b) = v.last_mut() {
            *b ^= 0x80;
        }
        Ok(v)
    }
    fn fused_save_compress_norm(&self, a: CompressArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.fused_save_compress_norm(a)
    }
    fn rope_quant_insert(&self, a: InsertArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.rope_quant_insert(a)
    }
    fn save_ring_rows(&self, a: RingArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.save_ring_rows(a)
    }
    fn fused_compress_insert(&self, a: FusedArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.fused_compress_insert(a)
    }
    fn gather_dequant(&self, a: dsv4_kvcache::GatherArgs<'_, Self::Buffer>) -> Result<()> {
        self.0.gather_dequant(a)
    }
    fn take_skip_counts(&self) -> Result<SkipCounts> {
        self.0.take_skip_counts()
    }
    fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}
