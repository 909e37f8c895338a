//! One backend value shared by many threads gives the same bytes as the
//! same calls made one after another: 8 threads, each making a few hundred
//! random calls of every operation (the four writers and the reader, every
//! layout, CR1 and CR2, sanitize on and off, special values), on the CPU
//! reference (`&CpuBackend`, in CI) and on CUDA and HIP (`Arc` of the
//! backend: all threads on its stream, all on one stream it made, and each
//! thread on a stream of its own; SKIPPED without a device, a failure under
//! `DSV4_KVCACHE_REQUIRE_GPU`). The skip counts of all threads add up to
//! those of the sequential run. Every tenth call is invalid and must be
//! rejected without writing (on every backend).
//!
//! `DSV4_KVCACHE_CONCURRENCY_CALLS` sets the calls per thread (default 200).

#![cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]

#[path = "gpu_required/mod.rs"]
mod gpu_required;

use dsv4_kvcache::backend::gpu::{Driver, GpuBackend, OnStream, Stream};
use dsv4_kvcache::testkit::{random_calls, CallMix};
use dsv4_kvcache::vectors::VectorFile;
use dsv4_kvcache::{Backend, CpuBackend, DType, Result, SkipCounts};
use std::sync::Arc;

/// Threads sharing the backend.
const THREADS: usize = 8;

fn calls_per_thread() -> usize {
    std::env::var("DSV4_KVCACHE_CONCURRENCY_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Each thread's calls (fixed seeds; small calls so that threads overlap).
fn workload() -> Vec<Vec<VectorFile>> {
    let mix = CallMix {
        max_tokens: 24,
        adversarial: true,
    };
    let n = calls_per_thread();
    (0..THREADS)
        .map(|t| random_calls(0x7468_7265_6164 + t as u64, n, mix))
        .collect()
}

/// The bytes one call wrote, by output name.
type Written = Vec<(&'static str, Vec<u8>)>;

/// One call on the backend of its sanitize setting (`pair[0]` off,
/// `pair[1]` on): upload, launch, read back. Every tenth call is made
/// invalid (its index tensor retyped F32) and must be rejected, writing
/// nothing.
fn run_one<B: Backend>(pair: &[&B; 2], f: &VectorFile, i: usize) -> Result<Written> {
    let b = pair[usize::from(f.sanitize()?)];
    if i % 10 != 9 {
        let mut p = f.prepare(b)?;
        p.launch(b)?;
        return p.outputs(b);
    }
    let mut bad = f.clone();
    let name = ["in.slot_mapping", "in.cu_seq_lens"]
        .into_iter()
        .find(|n| bad.tensors.contains_key(*n))
        .expect("every op has an index tensor");
    let t = bad.tensors.get_mut(name).expect("present");
    t.shape = vec![t.data.len() / 4];
    t.dtype = DType::F32;
    let mut p = bad.prepare(b)?;
    let what = bad.meta.get("description").cloned().unwrap_or_default();
    assert!(p.launch(b).is_err(), "{what}: an F32 {name} was accepted");
    let outs = p.outputs(b)?;
    for (out, bytes) in &outs {
        let input = &bad.input(out).expect("outputs start as inputs").data;
        assert!(input == bytes, "{what}: the rejected call wrote {out}");
    }
    Ok(outs)
}

fn skipped<B: Backend>(pair: &[&B; 2]) -> Result<SkipCounts> {
    let (a, b) = (pair[0].take_skip_counts()?, pair[1].take_skip_counts()?);
    Ok(SkipCounts {
        slot_out_of_range: a.slot_out_of_range + b.slot_out_of_range,
        position_out_of_range: a.position_out_of_range + b.position_out_of_range,
        index_out_of_range: a.index_out_of_range + b.index_out_of_range,
    })
}

/// Every thread's outputs, call by call.
type Outputs = Vec<Vec<Written>>;

/// One thread's calls on `pair`, in order.
fn run_calls<B: Backend>(pair: &[&B; 2], calls: &[VectorFile], what: &str) -> Vec<Written> {
    calls
        .iter()
        .enumerate()
        .map(|(i, f)| run_one(pair, f, i).unwrap_or_else(|e| panic!("{what}: call {i}: {e}")))
        .collect()
}

/// The workload one call after another on `pair`, with the tokens skipped.
fn sequential<B: Backend>(pair: [&B; 2], work: &[Vec<VectorFile>]) -> (Outputs, SkipCounts) {
    skipped(&pair).expect("reset the skip counts");
    let out = work
        .iter()
        .map(|calls| run_calls(&pair, calls, "sequential"))
        .collect();
    (out, skipped(&pair).expect("sequential skip counts"))
}

/// The workload from `THREADS` threads at once, thread `t` running its calls
/// through `lane(t, calls)`.
fn concurrent<L>(work: &[Vec<VectorFile>], lane: L) -> Outputs
where
    L: Fn(usize, &[VectorFile]) -> Vec<Written> + Sync,
{
    std::thread::scope(|s| {
        let lane = &lane;
        let handles: Vec<_> = work
            .iter()
            .enumerate()
            .map(|(t, calls)| s.spawn(move || lane(t, calls)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a thread panicked"))
            .collect()
    })
}

/// Every written byte and the skip counts of the concurrent run equal the
/// sequential run's.
fn compare(
    what: &str,
    work: &[Vec<VectorFile>],
    (sequential, seq_skips): &(Outputs, SkipCounts),
    concurrent: &Outputs,
    conc_skips: SkipCounts,
) {
    let mut calls = 0usize;
    let mut bytes = 0usize;
    for (t, (seq, conc)) in sequential.iter().zip(concurrent).enumerate() {
        for (i, (a, b)) in seq.iter().zip(conc).enumerate() {
            calls += 1;
            assert_eq!(a.len(), b.len(), "{what}: thread {t} call {i}: outputs");
            for ((na, ba), (nb, bb)) in a.iter().zip(b) {
                assert_eq!(na, nb);
                bytes += ba.len();
                if ba != bb {
                    let at = ba.iter().zip(bb).position(|(x, y)| x != y).unwrap_or(0);
                    panic!(
                        "{what}: thread {t} call {i} ({}): {na} differs from the sequential run at byte {at} of {}",
                        work[t][i].meta.get("description").map_or("", String::as_str),
                        ba.len()
                    );
                }
            }
        }
    }
    assert_eq!(
        *seq_skips, conc_skips,
        "{what}: skip counts of the threads vs the sequential run"
    );
    println!(
        "{what}: {THREADS} threads x {} calls: {calls} calls, {bytes} bytes identical to the sequential run; skips {seq_skips:?}",
        calls_per_thread()
    );
}

/// Runs the workload one call after another, then from `THREADS` threads
/// at once on the same backends, and compares every written byte and the
/// skip counts.
fn check_shared<B: Backend + Sync>(pair: [&B; 2], what: &str) {
    let work = workload();
    let seq = sequential(pair, &work);
    let conc = concurrent(&work, |_, calls| run_calls(&pair, calls, what));
    compare(
        what,
        &work,
        &seq,
        &conc,
        skipped(&pair).expect("skip counts"),
    );
}

#[test]
fn cpu_shared_across_threads_matches_sequential() {
    let off = CpuBackend::new();
    let mut on = CpuBackend::new();
    on.set_sanitize(true);
    check_shared([&off, &on], "cpu");
    // A CPU backend on a private pool of two threads, shared the same way.
    let off = CpuBackend::with_threads(2).unwrap();
    let mut on = CpuBackend::with_threads(2).unwrap();
    on.set_sanitize(true);
    check_shared([&off, &on], "cpu (private pool)");
}

/// The reference bytes of every call equal the CPU's: the device runs are
/// compared with their own sequential run above, and this closes the loop.
fn check_against_cpu<B: Backend>(pair: [&B; 2], what: &str) {
    let cpu_off = CpuBackend::new();
    let mut cpu_on = CpuBackend::new();
    cpu_on.set_sanitize(true);
    let cpu = [&cpu_off, &cpu_on];
    for (i, f) in workload()[0].iter().enumerate() {
        let want = run_one(&cpu, f, i).expect("cpu call");
        let got = run_one(&pair, f, i).expect("device call");
        assert_eq!(want, got, "{what}: call {i} differs from the CPU reference");
    }
}

/// The safe API of `b` on `stream`: sanitize off, and on.
fn views<'a, D: Driver>(b: &'a GpuBackend<D>, stream: &'a Stream<D>) -> [OnStream<'a, D>; 2] {
    let off = b.on_stream(stream).expect("a view of the backend's stream");
    let mut on = b.on_stream(stream).expect("a view of the backend's stream");
    on.set_sanitize(true);
    [off, on]
}

/// A GPU backend pair (sanitize off, on) shared by `THREADS` threads in
/// three ways, each compared with the same calls made one after another:
/// all threads on the backend's own stream, all on one stream the backend
/// made, and each thread on a stream of its own (the views of `pair[0]`).
fn check_streams<D: Driver>(pair: [&GpuBackend<D>; 2], what: &str) {
    let work = workload();
    let seq = sequential(pair, &work);
    let skips = || skipped(&pair).expect("skip counts");

    let conc = concurrent(&work, |_, calls| run_calls(&pair, calls, what));
    compare(
        &format!("{what}, the backend's stream"),
        &work,
        &seq,
        &conc,
        skips(),
    );

    let one = pair[0].create_stream().expect("a stream");
    let conc = concurrent(&work, |_, calls| {
        let [off, on] = views(pair[0], &one);
        run_calls(&[&off, &on], calls, what)
    });
    compare(
        &format!("{what}, one stream for all threads"),
        &work,
        &seq,
        &conc,
        skips(),
    );

    let own: Vec<Stream<D>> = (0..THREADS)
        .map(|_| pair[0].create_stream().expect("a stream per thread"))
        .collect();
    let mut handles: Vec<_> = own.iter().map(Stream::raw).collect();
    handles.push(one.raw());
    handles.push(pair[0].stream());
    handles.sort_unstable_by_key(|s| s.0);
    handles.dedup();
    assert_eq!(
        handles.len(),
        THREADS + 2,
        "{what}: stream handles are distinct"
    );
    let conc = concurrent(&work, |t, calls| {
        let [off, on] = views(pair[0], &own[t]);
        run_calls(&[&off, &on], calls, what)
    });
    compare(
        &format!("{what}, a stream per thread"),
        &work,
        &seq,
        &conc,
        skips(),
    );
}

/// Opens the device twice through `new` (sanitizing off, then on) and runs
/// both checks on the pair; a device that does not open skips or fails as
/// `gpu_required` says.
fn shared_across_threads<D: Driver>(
    test: &str,
    what: &str,
    new: fn(usize) -> Result<GpuBackend<D>>,
    library_present: fn() -> bool,
) {
    let open = |on: bool| -> Result<Arc<GpuBackend<D>>> {
        let mut b = new(0)?;
        b.set_sanitize(on);
        Ok(Arc::new(b))
    };
    match open(false).and_then(|off| Ok((off, open(true)?))) {
        Ok((off, on)) => {
            let pair = [&*off, &*on];
            check_against_cpu(pair, what);
            check_streams(pair, what);
        }
        Err(e) => gpu_required::skip_or_fail(test, what, library_present(), &e),
    }
}

/// A test of [`shared_across_threads`] on one GPU backend, built with its feature.
macro_rules! shared_across_threads_test {
    ($test:ident, $feature:literal, $backend:ty, $driver:ty) => {
        #[cfg(feature = $feature)]
        #[test]
        fn $test() {
            let (new, present) = (<$backend>::new, <$driver>::library_present);
            shared_across_threads(stringify!($test), $feature, new, present);
        }
    };
}

shared_across_threads_test!(
    cuda_shared_across_threads_matches_sequential,
    "cuda",
    dsv4_kvcache::CudaBackend,
    dsv4_kvcache::backend::cuda::CudaDriver
);
shared_across_threads_test!(
    hip_shared_across_threads_matches_sequential,
    "hip",
    dsv4_kvcache::HipBackend,
    dsv4_kvcache::backend::hip::HipDriver
);
