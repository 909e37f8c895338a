//! Throughput of the CPU reference: tokens per second per operation at
//! T = 1024, on one thread and on all of them.
//!
//! Inputs as the GPU bench builds them (docs/benchmarks.md: random normal
//! latents, positions `0..T`, slots a random permutation of a
//! 64-row-per-block cache; CR2 as 4 requests of T/4 consecutive positions),
//! built by
//! `dsv4_kvcache::testkit`.
//!
//! ```text
//! cargo bench --bench cpu_reference
//! ```

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsv4_kvcache::testkit::{make_case, CaseSpec};
use dsv4_kvcache::vectors::Op;
use dsv4_kvcache::{CpuBackend, RecordLayout};
use std::time::Duration;

const T: usize = 1024;

fn cases() -> Vec<(String, CaseSpec)> {
    let base = CaseSpec {
        tokens: T,
        requests: 4,
        ring_capacity: 2,
        seed: 0xc0ffee,
        ..Default::default()
    };
    let mut v = vec![
        (
            "compress CR1".to_string(),
            CaseSpec {
                op: Op::FusedSaveCompressNorm,
                compress_ratio: 1,
                ..base.clone()
            },
        ),
        (
            "compress CR2".to_string(),
            CaseSpec {
                op: Op::FusedSaveCompressNorm,
                compress_ratio: 2,
                ..base.clone()
            },
        ),
    ];
    for layout in RecordLayout::ALL {
        v.push((
            format!("insert {}", layout.name()),
            CaseSpec {
                op: Op::RopeQuantInsert,
                layout,
                ..base.clone()
            },
        ));
    }
    v.push((
        "save_ring_rows".to_string(),
        CaseSpec {
            op: Op::SaveRingRows,
            ..base
        },
    ));
    v
}

fn bench(c: &mut Criterion) {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut threads = vec![1];
    if all > 1 {
        threads.push(all);
    }
    for n in threads {
        let backend = CpuBackend::with_threads(n).expect("thread pool");
        let mut group = c.benchmark_group(format!("cpu_reference/{n}_threads"));
        group.throughput(Throughput::Elements(T as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(2));
        for (name, spec) in cases() {
            let file = make_case(&spec);
            let mut prepared = file.prepare(&backend).expect("inputs upload");
            group.bench_function(BenchmarkId::new(name, T), |b| {
                b.iter(|| prepared.launch(&backend).expect("launch"))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
