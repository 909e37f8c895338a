//! The reader's committed test vectors (`tests/vectors/gather_*.safetensors`,
//! written by `dsv4-kvcache capture --op gather_dequant` from the CPU
//! reference: every layout, the slot form with BF16 output and the
//! block-table form with F32 output, random cache bytes with every code,
//! wild indices) replay with zero differing bytes on the CPU and on each GPU
//! backend (SKIPPED, loudly, without a device; a failure where
//! `DSV4_KVCACHE_REQUIRE_GPU` requires one).

use dsv4_kvcache::vectors::{Op, VectorFile};
use dsv4_kvcache::{Backend, CpuBackend};
use std::path::PathBuf;

#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;
#[path = "gpu_pair/mod.rs"]
#[macro_use]
mod gpu_pair;

fn files() -> Vec<PathBuf> {
    gpu_required::vector_files("gather_")
}

fn replay_all<B: Backend>(b: &mut B) {
    let files = files();
    assert_eq!(files.len(), 10, "five layouts, two forms");
    for f in files {
        let v = VectorFile::load(&f).expect("vector file loads");
        assert_eq!(v.op().unwrap(), Op::GatherDequant);
        let r = v.replay(b).expect("replays");
        assert!(r.bytes_compared > 0);
        assert_eq!(r.mismatch_count(), 0, "{} {}:\n{r}", b.name(), f.display());
        println!(
            "{} {}: {} bytes, 0 differ",
            b.name(),
            f.display(),
            r.bytes_compared
        );
    }
}

#[test]
fn cpu_replays_the_reader_vectors() {
    replay_all(&mut CpuBackend::new());
}

gpu_tests!(
    cuda_replays_the_reader_vectors,
    hip_replays_the_reader_vectors,
    label = "gather vectors",
    |b| replay_all(b)
);

/// The files hold what they claim: the outputs differ from the inputs'
/// canaries, some rows keep them, and a flipped expected byte is reported
/// at its output row.
#[test]
fn the_vectors_check_something() {
    for f in files() {
        let mut v = VectorFile::load(&f).unwrap();
        let (i, o) = (v.input("out").unwrap(), v.expected("out").unwrap());
        assert_ne!(i.data, o.data, "{}: the gather wrote nothing", f.display());
        let t = v.tensors.get_mut("out.out").unwrap();
        t.data[5] ^= 0x40;
        let r = v.replay(&mut CpuBackend::new()).unwrap();
        assert_eq!(r.mismatch_count(), 1, "{}", f.display());
        assert_eq!(r.mismatches[0].token, Some(0));
    }
}
