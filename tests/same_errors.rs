//! The same bad call gives the same error on every backend: the CPU
//! reference, the GPU backend over a stand-in driver with no GPU (host
//! memory, launches recorded instead of run; runs everywhere, CI included)
//! and, where a device is present, CUDA and HIP. Error cases must also
//! write nothing. The raw entry points check in one order on every GPU
//! backend: the plan, then each address in argument order, then the
//! counters. The stand-in also shows the launch policy choosing kernels.
//! The reader (`gather_dequant`) is held to the same: its bad calls (safe
//! and raw) give the CPU's errors everywhere and write nothing.

mod common;
mod gather_cases;
#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;
#[path = "gpu_pair/mod.rs"]
#[macro_use]
mod gpu_pair;

use common::{all_kinds, random_case, run_case, run_case_mut, Buf, Case, Outputs};
use dsv4_kvcache::backend::gpu::driver::Params;
use dsv4_kvcache::backend::gpu::{DeviceFacts, Driver, GpuBackend};
use dsv4_kvcache::backend::{RawDevice, RawStream};
use dsv4_kvcache::detect::SanitizePolicy;
use dsv4_kvcache::kernel_abi::{Geometry, Kernel};
use dsv4_kvcache::launch::{Cr2Items, LaunchPolicy};
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{
    Backend, CpuBackend, DType, Error, InsertArgs, RecordLayout, Result, Tensor, TensorDesc,
    TensorMut,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A driver with no GPU: memory is host memory (16-byte aligned), copies
/// are `memcpy`, and a launch records its kernel's name instead of running.
struct Stand {
    facts: DeviceFacts,
    launched: Mutex<Vec<&'static str>>,
    /// The stream of each launch.
    launch_streams: Mutex<Vec<RawStream>>,
    /// Streams made and not yet dropped.
    live_streams: Arc<AtomicUsize>,
    /// The next launch fails.
    fail_launch: AtomicBool,
    /// The next wait fails.
    fail_sync: AtomicBool,
}

/// A stand-in stream: a number, counted while it lives.
struct StandStream(Arc<AtomicUsize>);

impl Drop for StandStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Stand {
    fn new() -> Self {
        Stand {
            facts: DeviceFacts {
                ordinal: 0,
                name: "stand-in".into(),
                arch: "none".into(),
                warp_size: 32,
                total_memory: None,
                multiprocessors: None,
                kernels: "none".into(),
            },
            launched: Mutex::new(Vec::new()),
            launch_streams: Mutex::new(Vec::new()),
            live_streams: Arc::new(AtomicUsize::new(0)),
            fail_launch: AtomicBool::new(false),
            fail_sync: AtomicBool::new(false),
        }
    }
}

// SAFETY: nothing runs on a device; memory is host memory owned by the
// returned boxes, and every copy stays inside the ranges the backend checked.
unsafe impl Driver for Stand {
    const BACKEND: &'static str = "stand-in";
    type Function = usize;
    type Memory = Box<[u128]>;
    type Event = ();
    type Graph = ();
    type Stream = StandStream;

    fn facts(&self) -> &DeviceFacts {
        &self.facts
    }
    fn sanitize_for(&self, policy: SanitizePolicy) -> bool {
        policy == SanitizePolicy::On
    }
    fn stream(&self) -> RawStream {
        RawStream(1)
    }
    fn function(&self, kernel: Kernel) -> Result<usize> {
        Ok(kernel.index())
    }
    fn create_stream(&self) -> Result<(StandStream, RawStream)> {
        let n = self.live_streams.fetch_add(1, Ordering::SeqCst);
        Ok((StandStream(self.live_streams.clone()), RawStream(100 + n)))
    }
    fn alloc(&self, len: usize, _: Option<&StandStream>) -> Result<(Box<[u128]>, u64)> {
        let m = vec![0u128; len.div_ceil(16).max(1)].into_boxed_slice();
        let p = m.as_ptr() as u64;
        Ok((m, p))
    }
    unsafe fn memset(&self, dst: u64, value: u8, len: usize, _: RawStream) -> Result<()> {
        std::ptr::write_bytes(dst as *mut u8, value, len);
        Ok(())
    }
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], _: RawStream) -> Result<()> {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len());
        Ok(())
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, _: RawStream) -> Result<()> {
        std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len());
        Ok(())
    }
    unsafe fn copy_on_device(&self, dst: u64, src: u64, n: usize, _: RawStream) -> Result<()> {
        std::ptr::copy(src as *const u8, dst as *mut u8, n);
        Ok(())
    }
    fn synchronize(&self, _: RawStream) -> Result<()> {
        if self.fail_sync.swap(false, Ordering::SeqCst) {
            return Err(Error::driver(
                "stand-in",
                "wait",
                "an injected kernel failure",
            ));
        }
        Ok(())
    }
    unsafe fn launch(
        &self,
        f: usize,
        g: &Geometry,
        stream: RawStream,
        params: Params,
    ) -> Result<()> {
        assert!(g.grid >= 1 && g.block_threads >= 32 && !params.is_null());
        if self.fail_launch.swap(false, Ordering::SeqCst) {
            return Err(Error::driver("stand-in", "launch", "an injected failure"));
        }
        self.launch_streams.lock().unwrap().push(stream);
        self.launched.lock().unwrap().push(Kernel::ALL[f].name());
        Ok(())
    }
    fn begin_capture(&self) -> Result<()> {
        Ok(())
    }
    fn end_capture(&self) -> Result<Option<()>> {
        Ok(Some(()))
    }
    unsafe fn launch_graph(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn create_event(&self) -> Result<()> {
        Ok(())
    }
    fn record_event(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn elapsed_ms(&self, _: &(), _: &()) -> Result<f32> {
        Ok(0.0)
    }
}

fn stand_in() -> GpuBackend<Stand> {
    GpuBackend::with_policies(Stand::new(), SanitizePolicy::Off, LaunchPolicy::MEASURED)
        .expect("the stand-in opens")
}

/// A bad variant of `c`: `which` picks the breakage, each the kind of thing
/// validation rejects (a wrong dtype, a short index tensor, a view past the
/// end of its buffer, a bad compress ratio, float slots).
fn broken(c: &Case, which: u64) -> Case {
    let mut c = c.clone();
    fn first(c: &mut Case) -> &mut Buf {
        [
            &mut c.kv_score,
            &mut c.latent,
            &mut c.rows,
            &mut c.cos_sin_cache,
            &mut c.kv_cache,
        ]
        .into_iter()
        .flatten()
        .next()
        .unwrap_or(&mut c.slot_mapping)
    }
    match which % 5 {
        0 => {
            let b = first(&mut c);
            let dt = if b.desc.dtype == DType::U8 {
                DType::I32
            } else {
                DType::U8
            };
            b.desc = TensorDesc::strided(dt, b.desc.shape(), b.desc.strides())
                .expect("a view")
                .with_offset(b.desc.offset);
        }
        1 => {
            let n = c.n();
            let s = &mut c.slot_mapping;
            s.desc = TensorDesc::contiguous(s.desc.dtype, &[n + 1]).with_offset(s.desc.offset);
        }
        2 => {
            let b = first(&mut c);
            let off = b.bytes.len() - b.desc.dtype.size();
            b.desc = b.desc.with_offset(off - off % 64);
        }
        3 => c.compress_ratio = 3,
        _ => {
            let s = &mut c.slot_mapping;
            s.desc = TensorDesc::strided(DType::F32, s.desc.shape(), s.desc.strides())
                .expect("a view")
                .with_offset(s.desc.offset);
        }
    }
    c.name = format!("{} broken #{}", c.name, which % 5);
    c
}

/// Valid and broken cases of every kind.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (k, kind) in all_kinds().into_iter().enumerate().step_by(3) {
        let c = random_case(k as u64, kind);
        for which in 0..5 {
            out.push(broken(&c, which + k as u64));
        }
        out.push(c);
    }
    out
}

/// The results (and, for errors, every output byte: nothing was written)
/// of `b` agree with the CPU reference's on every case; returns how many
/// cases were errors.
fn agree_with_cpu<B: Backend>(b: &mut B, all: &[Case]) -> usize {
    let mut cpu = CpuBackend::new();
    let mut errors = 0;
    for c in all {
        let want: Outputs = run_case_mut(&mut cpu, c);
        let got = run_case_mut(b, c);
        assert_eq!(got.result, want.result, "{} on {}", c.name, b.name());
        if want.result.is_err() {
            errors += 1;
            assert!(got == want, "{}: {} wrote after an error", c.name, b.name());
        }
    }
    errors
}

#[test]
fn stand_in_gives_the_cpu_errors_and_writes_nothing() {
    let all = cases();
    let errors = agree_with_cpu(&mut stand_in(), &all);
    assert!(errors * 2 > all.len(), "most cases are broken ({errors})");
    assert!(errors < all.len(), "some cases are valid");
}

/// A device backend refuses what the CPU refuses, with the same errors and
/// no writes, and its raw entry points fail like the stand-in's.
fn same_as_cpu<D: Driver>(b: &mut GpuBackend<D>) {
    agree_with_cpu(b, &cases());
    assert_eq!(
        signatures(&raw_errors(b)),
        signatures(&raw_errors(&stand_in()))
    );
    gathers_agree_with_cpu(b);
    assert_eq!(
        signatures(&raw_gather_errors(b)),
        signatures(&raw_gather_errors(&stand_in()))
    );
}

gpu_tests!(
    cuda_gives_the_cpu_errors,
    hip_gives_the_cpu_errors,
    prefix = "",
    |b| same_as_cpu(b)
);

const N: usize = 4;
const MAX_POS: usize = 16;
const BLOCKS: usize = 2;
const BLOCK: usize = 4;

/// A CR 1 MXFP8 insert of N tokens over these buffers, `n_pos` positions.
fn insert_args<'a, S: ?Sized>(
    latent: &'a S,
    pos: &'a S,
    n_pos: usize,
    cos: &'a S,
    cache: &'a mut S,
    slots: &'a S,
) -> InsertArgs<'a, S> {
    let d = TensorDesc::contiguous;
    InsertArgs {
        latent: Tensor::new(latent, d(DType::BF16, &[N, 512])),
        positions: Tensor::new(pos, d(DType::I32, &[n_pos])),
        cos_sin_cache: Tensor::new(cos, d(DType::F32, &[MAX_POS, 64])),
        kv_cache: TensorMut::new(cache, d(DType::U8, &[BLOCKS, BLOCK, 528])),
        slot_mapping: Tensor::new(slots, d(DType::I32, &[N])),
        compress_ratio: 1,
        fp8_scale: None,
        record_order: RecordOrder::PagePlanar,
    }
}

/// The errors of a fixed list of bad raw MXFP8 inserts on `b`, over its own
/// (zeroed) memory: a shape error the plan finds, null and misaligned
/// addresses (two at once: the first argument in declaration order is
/// reported), bad counters, and a shape error together with a null address
/// (the plan's error comes first).
fn raw_errors<D: Driver>(b: &GpuBackend<D>) -> Vec<Error> {
    let latent = b.alloc_zeroed(N * 512 * 2).unwrap();
    let idx = b.alloc_zeroed(N * 4).unwrap();
    let cos = b.alloc_zeroed(MAX_POS * 64 * 4).unwrap();
    let cache = b.alloc_zeroed(BLOCKS * BLOCK * 528).unwrap();
    let run = |latent: RawDevice, pos: RawDevice, n_pos: usize, mut cache: RawDevice, counters| {
        let slots = idx.as_raw();
        let cos = cos.as_raw();
        let args = insert_args(&latent, &pos, n_pos, &cos, &mut cache, &slots);
        // SAFETY: every call below is refused before anything is launched.
        unsafe { b.rope_quant_insert_raw(&args, b.stream(), counters, false) }
            .expect_err("a bad raw call")
    };
    let (lat, pos, cch) = (latent.as_raw(), idx.as_raw(), cache.as_raw());
    let null = |r: RawDevice| RawDevice::new(0, r.len);
    let shifted = |r: RawDevice, by| RawDevice::new(r.ptr + by, r.len);
    vec![
        run(lat, pos, N - 1, cch, None),
        run(null(lat), pos, N, null(cch), None),
        run(lat, pos, N, shifted(cch, 8), None),
        run(shifted(lat, 4), shifted(pos, 2), N, cch, None),
        run(lat, pos, N, cch, Some(0)),
        run(lat, pos, N, cch, Some(cch.ptr + 2)),
        run(null(lat), pos, N - 1, cch, None),
    ]
}

/// Each error's variant and argument (messages may name device addresses,
/// which differ between backends).
fn signatures(errs: &[Error]) -> Vec<(&'static str, &'static str)> {
    errs.iter()
        .map(|e| match e {
            Error::Shape { arg, .. } => ("shape", *arg),
            Error::Value { arg, .. } => ("value", *arg),
            Error::OutOfBounds { arg, .. } => ("bounds", *arg),
            Error::Missing { arg, .. } => ("missing", *arg),
            other => panic!("unexpected error {other}"),
        })
        .collect()
}

#[test]
fn raw_entry_points_check_in_one_order() {
    let errs = raw_errors(&stand_in());
    assert_eq!(
        signatures(&errs),
        [
            ("shape", "positions"),
            ("value", "latent"),
            ("shape", "kv_cache"),
            ("shape", "latent"),
            ("value", "raw_counters"),
            ("shape", "raw_counters"),
            ("shape", "positions"),
        ]
    );
    // The plan's error is the CPU's for the same views.
    let cpu = CpuBackend::new();
    let lat = cpu.upload(&vec![0; N * 1024]).unwrap();
    let idx = cpu.upload(&[0; N * 4]).unwrap();
    let cos = cpu.upload(&vec![0; MAX_POS * 256]).unwrap();
    let mut cache = cpu.upload(&vec![0; BLOCKS * BLOCK * 528]).unwrap();
    let e = cpu
        .rope_quant_insert(insert_args(&lat, &idx, N - 1, &cos, &mut cache, &idx))
        .unwrap_err();
    assert_eq!(e, errs[0]);
}

#[test]
fn buffers_of_another_backend_are_refused_by_name() {
    let (a, b) = (stand_in(), stand_in());
    let mut mine = a.alloc_zeroed(64).unwrap();
    let theirs = b.alloc_zeroed(64).unwrap();
    assert!(matches!(
        a.read(&theirs),
        Err(Error::Value { arg: "read", .. })
    ));
    assert!(matches!(
        a.copy(&theirs, &mut mine, 8),
        Err(Error::Value { arg: "src", .. })
    ));
    // In a launch, the first foreign tensor in argument order is named.
    let lat = a.alloc_zeroed(N * 1024).unwrap();
    let idx = a.alloc_zeroed(N * 4).unwrap();
    let cos = b.alloc_zeroed(MAX_POS * 256).unwrap();
    let mut cache = b.alloc_zeroed(BLOCKS * BLOCK * 528).unwrap();
    let e = a
        .rope_quant_insert(insert_args(&lat, &idx, N, &cos, &mut cache, &idx))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Value {
                arg: "cos_sin_cache",
                ..
            }
        ),
        "{e}"
    );
    assert!(a.driver().launched.lock().unwrap().is_empty());
}

/// A view on a stream the backend made launches there, with its own
/// sanitize setting; the backend's own calls stay on its stream; a stream
/// of another backend is refused by name; dropping a stream destroys it.
#[test]
fn views_launch_on_their_stream() {
    use common::{Kind, Op};
    let c = random_case(3, Kind::new(Op::RopeQuantInsert, 1, RecordLayout::Mxfp8));
    let mut b = stand_in();
    assert_eq!(run_case_mut(&mut b, &c).result, Ok(()));
    let other = stand_in();
    let s = b.create_stream().expect("a stream");
    let t = b.create_stream().expect("another stream");
    assert_ne!(s.raw(), t.raw());
    assert_eq!(b.driver().live_streams.load(Ordering::SeqCst), 2);
    let mut view = b.on_stream(&s).expect("a view on the backend's stream");
    assert_eq!(view.raw(), s.raw());
    assert!(!view.sanitize());
    view.set_sanitize(true);
    assert!(
        view.sanitize() && !b.sanitize(),
        "sanitize is the view's own"
    );
    view.set_sanitize(c.kind.sanitize);
    assert_eq!(run_case(&view, &c).result, Ok(()));
    assert_eq!(
        *b.driver().launch_streams.lock().unwrap(),
        [b.stream(), s.raw()]
    );
    b.synchronize_stream(&s).expect("a wait on the stream");
    assert!(other.synchronize_stream(&s).is_err());
    match other.on_stream(&s) {
        Err(Error::Value { arg: "stream", .. }) => {}
        r => panic!("a stream of another backend: {r:?}"),
    }
    drop((s, t));
    assert_eq!(b.driver().live_streams.load(Ordering::SeqCst), 0);
}

/// A launch that fails after validation names the cache rows the call may
/// have written, its slot values read back; a wait that fails names the
/// rows of every call launched since the last wait (values unread), the
/// first 64 calls listed and the others counted; the next wait names none.
#[test]
fn failed_launches_and_waits_name_the_rows_they_may_have_written() {
    use common::{Kind, Op};
    use dsv4_kvcache::{IndexValues, Rows, TouchedRows};
    let c = random_case(5, Kind::new(Op::RopeQuantInsert, 1, RecordLayout::V4));
    let rows = |values| TouchedRows {
        op: "rope_quant_insert",
        tensor: "kv_cache",
        rows: Rows::Indexed {
            index: "slot_mapping",
            count: c.n(),
            values,
        },
    };
    let mut b = stand_in();
    b.driver().fail_launch.store(true, Ordering::SeqCst);
    match run_case_mut(&mut b, &c).result {
        Err(e @ Error::Driver { call: "launch", .. }) => {
            let Error::Driver { touched, .. } = &e else {
                unreachable!()
            };
            assert_eq!(touched.rows, [rows(IndexValues::of(c.slots()))], "{e}");
            assert_eq!(touched.more_calls, 0);
            assert!(
                e.to_string().contains(
                    "may have written: rope_quant_insert kv_cache rows named by slot_mapping[0.."
                ),
                "{e}"
            );
        }
        r => panic!("an injected launch failure: {r:?}"),
    }
    b.synchronize().expect("nothing pending");

    let f = dsv4_kvcache::testkit::make_case(&dsv4_kvcache::testkit::CaseSpec {
        op: dsv4_kvcache::vectors::Op::SaveRingRows,
        layout: RecordLayout::V4,
        compress_ratio: 2,
        tokens: 5,
        requests: 1,
        ring_capacity: 4,
        seed: 9,
        sanitize: false,
        adversarial: false,
        ..Default::default()
    });
    let n = f.input("slot_mapping").expect("slots").shape[0];
    let mut p = f.prepare(&b).expect("upload");
    let wait_fails =
        |b: &GpuBackend<Stand>, p: &mut dsv4_kvcache::vectors::Prepared<'_, _>, times| {
            for _ in 0..times {
                p.launch(b).expect("launch");
            }
            b.driver().fail_sync.store(true, Ordering::SeqCst);
            match b.synchronize() {
                Err(Error::Driver { touched, .. }) => touched,
                r => panic!("an injected wait failure: {r:?}"),
            }
        };
    let one = wait_fails(&b, &mut p, 1);
    let ring = TouchedRows {
        op: "save_ring_rows",
        tensor: "state_cache",
        rows: Rows::Indexed {
            index: "slot_mapping",
            count: n,
            values: IndexValues::Unread,
        },
    };
    assert_eq!(one.rows, [ring]);
    assert_eq!(one.more_calls, 0);
    let many = wait_fails(&b, &mut p, 70);
    assert_eq!(many.rows, vec![ring; 64]);
    assert_eq!(many.more_calls, 6);
    b.synchronize().expect("nothing pending");
}

#[test]
fn the_launch_policy_picks_the_kernel() {
    use common::{Kind, Op};
    let c = random_case(
        7,
        Kind::new(Op::FusedCompressInsert, 2, RecordLayout::Nvfp4),
    );
    let mut b = stand_in();
    let run = |b: &mut GpuBackend<Stand>, p: LaunchPolicy| {
        b.set_launch_policy(p);
        assert_eq!(b.launch_policy(), p);
        b.driver().launched.lock().unwrap().clear();
        assert_eq!(run_case_mut(b, &c).result, Ok(()));
        b.driver().launched.lock().unwrap().clone()
    };
    let measured = run(&mut b, LaunchPolicy::MEASURED);
    assert_eq!(measured.len(), 1, "{measured:?}");
    for (items, kernel) in [
        (Cr2Items::Lone, "kv_fused_cr2_nvfp4"),
        (Cr2Items::Teams, "kv_fused_cr2_team_nvfp4"),
        (Cr2Items::Pairs, "kv_fused_cr2_pair_nvfp4"),
        (Cr2Items::LoneHalves, "kv_fused_cr2_long_nvfp4"),
    ] {
        let p = LaunchPolicy {
            cr2_items: Some(items),
            cr2_screen: Some(false),
            ..LaunchPolicy::MEASURED
        };
        assert_eq!(run(&mut b, p), [kernel]);
    }
}

/// A raw call with no token returns after the plan, before the address
/// checks: a framework's empty tensors may have null addresses (torch's do),
/// and the call touches no memory. A shape error is still reported.
#[test]
fn raw_calls_without_tokens_launch_nothing_and_accept_null_addresses() {
    let b = stand_in();
    let d = |dt, shape: &[usize]| TensorDesc::contiguous(dt, shape);
    let null = RawDevice::new(0, 0);
    let mut null_cache = RawDevice::new(0, 0);
    let call = |width: usize, cache: &mut RawDevice| {
        let args = InsertArgs {
            latent: Tensor::new(&null, d(DType::BF16, &[0, width])),
            positions: Tensor::new(&null, d(DType::I32, &[0])),
            cos_sin_cache: Tensor::new(&null, d(DType::F32, &[0, 64])),
            kv_cache: TensorMut::new(cache, d(DType::U8, &[0, BLOCK, 528])),
            slot_mapping: Tensor::new(&null, d(DType::I32, &[0])),
            compress_ratio: 1,
            fp8_scale: None,
            record_order: RecordOrder::PagePlanar,
        };
        // SAFETY: no token: nothing is read, written or launched.
        unsafe { b.rope_quant_insert_raw(&args, b.stream(), None, false) }
    };
    call(512, &mut null_cache).expect("an empty call is not an error");
    assert!(b.driver().launched.lock().unwrap().is_empty());
    let e = call(256, &mut null_cache).expect_err("a latent of 256 dims");
    assert!(matches!(e, Error::Shape { arg: "latent", .. }), "{e}");
}

// ---- the reader -------------------------------------------------------------

/// The breakages of a gather, each naming one argument: the output's dtype,
/// the cache's record width, an index tensor's view past its buffer, a
/// wrong `fp8_scale` presence, too few output rows, a misaligned output.
const GATHER_BREAKAGES: usize = 6;

/// Runs `case` on `b`, broken as `which` says (`None`: as it is): the
/// result and the whole output buffer afterwards.
fn run_gather<B: Backend>(
    b: &B,
    case: &gather_cases::Case,
    which: Option<usize>,
) -> (Result<()>, Vec<u8>) {
    use dsv4_kvcache::GatherIndex;
    let mut u = case.upload(b).expect("upload");
    let spare = b.upload(&[0; 64]).expect("upload");
    let mut a = case.args(&u.cache, &u.index, u.fp8.as_ref(), &mut u.out);
    match which {
        None => {}
        Some(0) => {
            let d = a.out.desc;
            a.out.desc = TensorDesc::strided(DType::I32, d.shape(), d.strides())
                .unwrap()
                .with_offset(d.offset);
        }
        Some(1) => {
            let d = a.kv_cache.desc;
            a.kv_cache.desc = TensorDesc::contiguous(DType::U8, &[d.shape()[0], d.shape()[1], 530]);
        }
        Some(2) => {
            let t = match &mut a.index {
                GatherIndex::Slots { slot_mapping } => slot_mapping,
                GatherIndex::BlockTable { block_table, .. } => block_table,
            };
            t.desc = t.desc.with_offset(1 << 20);
        }
        Some(3) => {
            a.fp8_scale = match a.fp8_scale {
                Some(_) => None,
                None => Some(Tensor::new(
                    &spare,
                    TensorDesc::contiguous(DType::F32, &[1]),
                )),
            };
        }
        Some(4) => match &mut a.index {
            GatherIndex::Slots { .. } => {
                let d = a.out.desc;
                a.out.desc = TensorDesc::strided(d.dtype, &[0, 512], d.strides())
                    .unwrap()
                    .with_offset(d.offset);
            }
            GatherIndex::BlockTable { block_table, .. } => {
                let d = block_table.desc;
                block_table.desc = TensorDesc::strided(d.dtype, &[0, d.shape()[1]], d.strides())
                    .unwrap()
                    .with_offset(d.offset);
            }
        },
        Some(_) => a.out.desc = a.out.desc.with_offset(a.out.desc.offset + 2),
    }
    let r = b.gather_dequant(a);
    let out = b.read(&u.out).expect("read");
    (r, out)
}

/// Gather cases of every layout and both forms.
fn gather_cases_all() -> Vec<gather_cases::Case> {
    let mut out = Vec::new();
    for (i, layout) in RecordLayout::ALL.into_iter().enumerate() {
        for table in [false, true] {
            out.push(gather_cases::random_case(
                0x5e00 + 2 * i as u64 + u64::from(table),
                layout,
                table,
                9,
                true,
            ));
        }
    }
    out
}

/// Every gather case, valid and broken every way, gives the CPU's result on
/// `b`; after an error the output is untouched. Returns the errors seen.
fn gathers_agree_with_cpu<B: Backend>(b: &B) -> usize {
    let cpu = CpuBackend::new();
    let mut errors = 0;
    for case in gather_cases_all() {
        for which in std::iter::once(None).chain((0..GATHER_BREAKAGES).map(Some)) {
            let (want, _) = run_gather(&cpu, &case, which);
            let (got, out) = run_gather(b, &case, which);
            assert_eq!(got, want, "{} broken {which:?} on {}", case.label, b.name());
            if want.is_err() {
                errors += 1;
                assert!(
                    out == case.canary_out(),
                    "{} broken {which:?}: {} wrote after an error",
                    case.label,
                    b.name()
                );
            }
        }
    }
    errors
}

#[test]
fn stand_in_gives_the_cpu_gather_errors() {
    let cases = gather_cases_all().len();
    let errors = gathers_agree_with_cpu(&stand_in());
    assert_eq!(
        errors,
        cases * GATHER_BREAKAGES,
        "every breakage is an error"
    );
}

/// The errors of a fixed list of bad raw gathers (FP8 rows, slot form) on
/// `b`, over its own zeroed memory: a plan error, null and misaligned
/// addresses (two at once: the first in argument order is reported), a
/// misaligned FP8 scale, bad counters, and a plan error with a null address.
fn raw_gather_errors<D: Driver>(b: &GpuBackend<D>) -> Vec<Error> {
    use dsv4_kvcache::{GatherArgs, GatherIndex};
    let cache = b.alloc_zeroed(BLOCKS * BLOCK * 512).unwrap();
    let idx = b.alloc_zeroed(N * 8).unwrap();
    let scale = b.alloc_zeroed(16).unwrap();
    let out = b.alloc_zeroed(N * 512 * 2).unwrap();
    let d = |dt, shape: &[usize]| TensorDesc::contiguous(dt, shape);
    let run =
        |cache: RawDevice, slots: RawDevice, fp8: RawDevice, mut out: RawDevice, rows, counters| {
            let args = GatherArgs {
                kv_cache: Tensor::new(&cache, d(DType::F8E4M3, &[BLOCKS, BLOCK, 512])),
                index: GatherIndex::Slots {
                    slot_mapping: Tensor::new(&slots, d(DType::I64, &[N])),
                },
                fp8_scale: Some(Tensor::new(&fp8, d(DType::F32, &[1]))),
                out: TensorMut::new(&mut out, d(DType::BF16, &[rows, 512])),
                record_order: RecordOrder::PagePlanar,
            };
            // SAFETY: every call below is refused before anything is launched.
            unsafe { b.gather_dequant_raw(&args, b.stream(), counters) }
                .expect_err("a bad raw call")
        };
    let (c, i, f, o) = (cache.as_raw(), idx.as_raw(), scale.as_raw(), out.as_raw());
    let null = |r: RawDevice| RawDevice::new(0, r.len);
    let shifted = |r: RawDevice, by| RawDevice::new(r.ptr + by, r.len);
    vec![
        run(c, i, f, o, N - 1, None),
        run(null(c), i, f, null(o), N, None),
        run(c, i, f, shifted(o, 8), N, None),
        run(c, shifted(i, 4), f, shifted(o, 8), N, None),
        run(c, i, shifted(f, 2), o, N, None),
        run(c, i, f, o, N, Some(0)),
        run(c, i, f, o, N, Some(o.ptr + 2)),
        run(null(c), i, f, o, N - 1, None),
    ]
}

#[test]
fn raw_gathers_check_in_one_order() {
    let errs = raw_gather_errors(&stand_in());
    assert_eq!(
        signatures(&errs),
        [
            ("shape", "out"),
            ("value", "kv_cache"),
            ("shape", "out"),
            ("shape", "slot_mapping"),
            ("shape", "fp8_scale"),
            ("value", "raw_counters"),
            ("shape", "raw_counters"),
            ("shape", "out"),
        ]
    );
}

#[test]
fn gathers_refuse_buffers_of_another_backend_and_launch_one_kernel() {
    let (a, b) = (stand_in(), stand_in());
    let case = gather_cases::random_case(3, RecordLayout::Nvfp4, true, 9, false);
    let mut u = case.upload(&a).unwrap();
    let mut foreign = b.upload(&case.canary_out()).unwrap();
    let e = a
        .gather_dequant(case.args(&u.cache, &u.index, u.fp8.as_ref(), &mut foreign))
        .unwrap_err();
    assert!(matches!(e, Error::Value { arg: "out", .. }), "{e}");
    assert!(a.driver().launched.lock().unwrap().is_empty());
    a.gather_dequant(case.args(&u.cache, &u.index, u.fp8.as_ref(), &mut u.out))
        .unwrap();
    assert_eq!(
        *a.driver().launched.lock().unwrap(),
        ["kv_gather_nvfp4_bf16"]
            .into_iter()
            .filter(|_| !case.out_f32)
            .chain(["kv_gather_nvfp4_f32"].into_iter().filter(|_| case.out_f32))
            .collect::<Vec<_>>()
    );
}
