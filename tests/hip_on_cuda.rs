//! The HIP backend's host code through the test HIP runtime on CUDA
//! (`hip-on-cuda/`, loaded as `libamdhip64.so` through the normal search
//! path; see `scripts/hip-on-cuda.sh`): the device it reports selects the
//! code object and the sanitize default, every injected fault gives an error
//! naming what failed without a panic, the backend keeps working after the
//! recoverable ones, and nothing leaks (the runtime counts allocations,
//! modules, streams, events and graphs).
//!
//! Anywhere else (no such runtime on the library path, or no NVIDIA GPU)
//! this prints SKIPPED with the reason; with `HIPCUDA_REQUIRED=1` (the
//! script sets it) that is a failure instead.

#![cfg(feature = "hip")]

mod common;
mod maps;

use common::{random_case, run_case, Kind, Op};
use dsv4_kvcache::backend::hip::HipBackend;
use dsv4_kvcache::detect::SanitizePolicy;
use dsv4_kvcache::kernel_abi::Kernel;
use dsv4_kvcache::testkit::{make_case, CaseSpec};
use dsv4_kvcache::vectors::Op as VOp;
use dsv4_kvcache::{
    Backend, CpuBackend, DType, Error, IndexValues, RecordLayout, Rows, TouchedRows,
};
use std::ffi::{c_char, c_int, CStr, CString};
use std::io::Write as _;

type Configure = unsafe extern "C" fn(*const c_char) -> c_int;
type Counters = unsafe extern "C" fn(*mut u64, usize) -> usize;
type CounterNames = unsafe extern "C" fn() -> *const c_char;

/// The test runtime's control entry points (same library the backend loads:
/// `dlopen` of the same name returns the same handle).
struct Shim {
    configure: Configure,
    counters: Counters,
    /// The counters' names, in order, as the runtime lists them.
    names: Vec<String>,
    _lib: libloading::Library,
}

impl Shim {
    fn open() -> Result<Shim, String> {
        // SAFETY: loading a HIP runtime runs its initializers only.
        let lib = unsafe { libloading::Library::new("libamdhip64.so") }
            .map_err(|e| format!("no libamdhip64.so on the library path ({e})"))?;
        // SAFETY: the symbols have these signatures in hip-on-cuda.
        unsafe {
            let configure = *lib
                .get::<Configure>(b"hipcudaConfigure\0")
                .map_err(|_| "libamdhip64.so is not the hip-on-cuda test runtime".to_string())?;
            let counters = *lib
                .get::<Counters>(b"hipcudaCounters\0")
                .map_err(|e| format!("hipcudaCounters: {e}"))?;
            let names = *lib
                .get::<CounterNames>(b"hipcudaCounterNames\0")
                .map_err(|e| format!("hipcudaCounterNames: {e}"))?;
            // SAFETY: a NUL-terminated string that lives as long as the library.
            let names = CStr::from_ptr(names()).to_string_lossy();
            Ok(Shim {
                configure,
                counters,
                names: names.split(' ').map(str::to_string).collect(),
                _lib: lib,
            })
        }
    }

    fn set(&self, spec: &str) {
        let c = CString::new(spec).expect("no NUL");
        // SAFETY: c is NUL-terminated.
        assert_eq!(unsafe { (self.configure)(c.as_ptr()) }, 0, "{spec}");
    }

    /// The counters by name.
    fn counters(&self) -> std::collections::BTreeMap<&str, u64> {
        let mut v = vec![0u64; self.names.len()];
        // SAFETY: v holds names.len() values.
        let n = unsafe { (self.counters)(v.as_mut_ptr(), v.len()) };
        assert_eq!(n, self.names.len(), "counter names and values differ");
        self.names.iter().map(String::as_str).zip(v).collect()
    }

    /// Everything created has been released.
    fn assert_balanced(&self, when: &str) {
        let c = self.counters();
        assert_eq!(c["allocs"], c["frees"], "{when}: allocations leaked: {c:?}");
        assert_eq!(c["live_allocs"], 0, "{when}: {c:?}");
        assert_eq!(c["bad_frees"], 0, "{when}: {c:?}");
        for (made, gone) in [
            ("modules_loaded", "modules_unloaded"),
            ("graphs_created", "graphs_destroyed"),
            ("execs_created", "execs_destroyed"),
            ("streams_created", "streams_destroyed"),
            ("events_created", "events_destroyed"),
        ] {
            assert_eq!(c[made], c[gone], "{when}: {made} vs {gone}: {c:?}");
        }
    }
}

fn skip(reason: &str) {
    assert!(
        std::env::var("HIPCUDA_REQUIRED").as_deref() != Ok("1"),
        "HIPCUDA_REQUIRED=1 but: {reason}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED hip_on_cuda: {reason} ***\n"
    );
}

fn open(policy: SanitizePolicy) -> dsv4_kvcache::Result<HipBackend> {
    HipBackend::with_policy(0, policy)
}

/// An MXFP8 insert with special values (NaN among them) whose sanitized
/// and unsanitized reference bytes differ.
fn nan_insert_case(sanitize: bool) -> common::Case {
    let cpu_on = {
        let mut c = CpuBackend::new();
        c.set_sanitize(true);
        c
    };
    let cpu_off = CpuBackend::new();
    for seed in 0..64 {
        let mut k = Kind::new(Op::RopeQuantInsert, 1, RecordLayout::Mxfp8);
        k.special_values = true;
        k.sanitize = true;
        let on = random_case(seed, k);
        let mut off = on.clone();
        off.kind.sanitize = false;
        if run_case(&cpu_on, &on) != run_case(&cpu_off, &off) {
            return if sanitize { on } else { off };
        }
    }
    panic!("no seed gave an insert whose NaN sanitizing matters");
}

/// The case's bytes on `b` equal the reference's with `b`'s sanitize setting.
fn matches_reference(b: &HipBackend, case: &common::Case, what: &str) {
    let mut cpu = CpuBackend::new();
    cpu.set_sanitize(b.sanitize());
    let want = run_case(&cpu, case);
    let got = run_case(b, case);
    assert!(want.result.is_ok(), "{what}: reference failed");
    assert!(
        got == want,
        "{what}: {} differs from the reference",
        b.name()
    );
}

fn expect_unavailable(r: dsv4_kvcache::Result<HipBackend>, needles: &[&str], what: &str) {
    match r {
        Err(Error::Unavailable { backend, reason }) => {
            assert_eq!(backend, "hip");
            for n in needles {
                assert!(reason.contains(n), "{what}: {n:?} missing from: {reason}");
            }
            println!("{what}: {reason}");
        }
        Err(e) => panic!("{what}: expected Unavailable, got {e}"),
        Ok(b) => panic!("{what}: opened {} although a fault was armed", b.name()),
    }
}

fn expect_driver<T>(r: dsv4_kvcache::Result<T>, call: &str, code: &str, what: &str) {
    match r {
        Err(e @ Error::Driver { .. }) => {
            let s = e.to_string();
            assert!(s.contains(call) && s.contains(code), "{what}: {s}");
            println!("{what}: {s}");
        }
        Err(e) => panic!("{what}: expected a driver error naming {call}, got {e}"),
        Ok(_) => panic!("{what}: succeeded although a fault was armed"),
    }
}

/// Two calls launched, then the wait for them fails (`fault=sync`): the
/// error names both calls' rows; a wait after it names none.
fn failed_wait_names_pending_rows(shim: &Shim, b: &HipBackend) {
    let spec = |op, seed| CaseSpec {
        op,
        layout: RecordLayout::Nvfp4,
        compress_ratio: 2,
        tokens: 9,
        requests: 2,
        ring_capacity: 4,
        seed,
        sanitize: b.sanitize(),
        adversarial: false,
        ..Default::default()
    };
    let insert = make_case(&spec(VOp::RopeQuantInsert, 1));
    let ring = make_case(&spec(VOp::SaveRingRows, 2));
    let mut pi = insert.prepare(b).expect("upload the insert");
    let mut pr = ring.prepare(b).expect("upload the ring rows");
    shim.set("fault=sync");
    pi.launch(b).expect("launch the insert");
    pr.launch(b).expect("launch the ring rows");
    let e = b
        .synchronize()
        .expect_err("the injected failure of the wait");
    let s = e.to_string();
    let Error::Driver { call, touched, .. } = &e else {
        panic!("sync fault: expected a driver error, got {e}");
    };
    assert_eq!(*call, "hipStreamSynchronize", "{s}");
    let named: Vec<(&str, &str)> = touched.rows.iter().map(|r| (r.op, r.tensor)).collect();
    assert_eq!(
        named,
        [
            ("rope_quant_insert", "kv_cache"),
            ("save_ring_rows", "state_cache")
        ],
        "{s}"
    );
    assert!(
        touched.rows.iter().all(|r| matches!(
            r.rows,
            Rows::Indexed {
                values: IndexValues::Unread,
                ..
            }
        )),
        "{s}"
    );
    println!("sync fault: {s}");
    b.synchronize().expect("a wait with nothing pending");
    // What the calls wrote is what the reference writes.
    let cpu = |f: &dsv4_kvcache::vectors::VectorFile| {
        let mut c = CpuBackend::new();
        f.execute(&mut c).expect("reference").0
    };
    assert_eq!(
        pi.outputs(b).unwrap(),
        cpu(&insert),
        "insert after the sync fault"
    );
    assert_eq!(
        pr.outputs(b).unwrap(),
        cpu(&ring),
        "ring rows after the sync fault"
    );
}

/// One test, run in order: the faults are process-wide, so nothing else may
/// use the runtime meanwhile.
#[test]
fn devices_faults_and_leaks() {
    let shim = match Shim::open() {
        Ok(s) => s,
        Err(reason) => return skip(&reason),
    };
    shim.set("fault=none;device=mi300x");
    let b = match open(SanitizePolicy::Auto) {
        Ok(b) => b,
        Err(e) => return skip(&format!("the test runtime is loaded but: {e}")),
    };

    // MI300X: gfx942, its code object, sanitize off by default.
    assert_eq!(b.arch().name, "gfx942", "{}", b.name());
    assert_eq!(b.arch().to_string(), "gfx942:sramecc+:xnack-");
    assert_eq!(b.target(), "gfx942");
    assert_eq!(b.device_name(), "AMD Instinct MI300X");
    assert!(!b.sanitize(), "gfx942 does not sanitize by default");
    assert!(b.runtime_path().contains("libamdhip64"));
    let plain = nan_insert_case(false);
    matches_reference(&b, &plain, "mi300x");
    // The generic kernels (an F16 weight, an F16 or F32 table) from the
    // same code object.
    for (cr, layout, cs) in [
        (1, RecordLayout::V4, DType::F16),
        (2, RecordLayout::Nvfp4, DType::F32),
    ] {
        let mut k = Kind::new(Op::FusedCompressInsert, cr, layout);
        k.weight_dtype = DType::F16;
        k.cos_dtype = cs;
        matches_reference(&b, &random_case(7, k), "mi300x, generic kernels");
    }
    drop(b);
    shim.assert_balanced("after the mi300x backend");

    // MI355X: gfx950 sanitizes by itself, and its bytes are the sanitized
    // reference's (which differ from the unsanitized ones for this case).
    shim.set("device=mi355x");
    let b = open(SanitizePolicy::Auto).expect("mi355x backend");
    assert_eq!(b.arch().to_string(), "gfx950:sramecc+:xnack-");
    assert_eq!(b.target(), "gfx950");
    assert!(b.sanitize(), "gfx950 sanitizes by default");
    let sanitized = nan_insert_case(true);
    matches_reference(&b, &sanitized, "mi355x, sanitize auto");
    let got = run_case(&b, &sanitized);
    assert!(
        got != run_case(&CpuBackend::new(), &plain),
        "the gfx950 bytes are the sanitized ones, not the plain ones"
    );
    // An explicit policy still wins.
    let off = open(SanitizePolicy::Off).expect("second backend");
    assert!(!off.sanitize());
    drop(off);

    // MI210 and an MI250X GCD: gfx90a, its own code object, sanitize off
    // by default, the plain reference's bytes.
    for (device, name) in [
        ("mi210", "AMD Instinct MI210"),
        ("mi250x", "AMD Instinct MI250X"),
    ] {
        shim.set(&format!("device={device}"));
        let g = open(SanitizePolicy::Auto).unwrap_or_else(|e| panic!("{device} backend: {e}"));
        assert_eq!(g.arch().to_string(), "gfx90a:sramecc+:xnack-");
        assert_eq!(g.target(), "gfx90a");
        assert_eq!(g.device_name(), name);
        assert!(!g.sanitize(), "gfx90a does not sanitize by default");
        matches_reference(&g, &plain, device);
    }
    shim.set("device=mi355x");

    // Recoverable faults on a working backend: the call fails with an error
    // that names it, and the next one works.
    shim.set("fault=alloc");
    expect_driver(
        b.upload(&[1, 2, 3]),
        "hipMalloc",
        "hipErrorOutOfMemory",
        "alloc fault",
    );
    let buf = b.upload(&[1, 2, 3]).expect("upload after the alloc fault");
    assert_eq!(b.read(&buf).unwrap(), [1, 2, 3]);
    drop(buf);

    shim.set("fault=launch@2");
    let first = run_case(&b, &sanitized);
    assert!(
        first.result.is_ok(),
        "the first launch is not the faulty one"
    );
    let second = run_case(&b, &sanitized);
    match &second.result {
        Err(e @ Error::Driver { touched, .. }) => {
            let s = e.to_string();
            assert!(
                s.contains("hipModuleLaunchKernel") && s.contains("hipErrorLaunchFailure"),
                "{s}"
            );
            // The failed launch names the cache rows it may have written:
            // the insert's slots, their values read back.
            let want = TouchedRows {
                op: "rope_quant_insert",
                tensor: "kv_cache",
                rows: Rows::Indexed {
                    index: "slot_mapping",
                    count: sanitized.n(),
                    values: IndexValues::of(sanitized.slots()),
                },
            };
            assert_eq!(touched.rows, [want], "{s}");
            assert!(
                s.contains("may have written: rope_quant_insert kv_cache"),
                "{s}"
            );
            println!("launch fault: {s}");
        }
        other => panic!("launch fault: expected a driver error, got {other:?}"),
    }
    matches_reference(&b, &sanitized, "launch after the launch fault");

    // A wait that fails after launches names the rows of every call still
    // pending on the stream (values unread: the tensors may be gone), and
    // the next wait, with nothing pending, names none.
    failed_wait_names_pending_rows(&shim, &b);

    shim.set("fault=capture");
    let dev_buf = b.upload(&[0u8; 64]).unwrap();
    // Empty captures: the fault is in ending the capture, whatever it holds
    // (tests/hip_backend.rs replays real launches).
    let r = b.capture(1, || Ok(()));
    expect_driver(
        r.map(|_| ()),
        "hipStreamEndCapture",
        "hipErrorStreamCaptureInvalidated",
        "capture fault",
    );
    // The stream left capture mode: eager work and a new capture work.
    assert_eq!(b.read(&dev_buf).unwrap(), vec![0u8; 64]);
    let g = b
        .capture(1, || Ok(()))
        .expect("capture after the capture fault");
    // SAFETY: the graph holds no work, so no buffer.
    unsafe { g.launch() }.expect("replay");
    b.synchronize().unwrap();
    drop(g);
    drop(dev_buf);
    matches_reference(&b, &sanitized, "after the capture fault");
    drop(b);
    shim.assert_balanced("after the recoverable faults");

    // Faults while opening: a clear error, and nothing left behind.
    shim.set("fault=alloc");
    expect_unavailable(
        open(SanitizePolicy::Auto),
        &["hipMalloc", "skip counters", "hipErrorOutOfMemory"],
        "alloc fault at open",
    );
    shim.set("fault=module-load");
    expect_unavailable(
        open(SanitizePolicy::Auto),
        &[
            "hipModuleLoadData",
            "gfx950",
            "code object",
            "hipErrorInvalidImage",
        ],
        "module load fault",
    );
    shim.set("fault=missing-kernel@3");
    expect_unavailable(
        open(SanitizePolicy::Auto),
        &[
            "hipModuleGetFunction",
            Kernel::ALL[2].name(),
            "hipErrorNotFound",
        ],
        "missing kernel fault",
    );
    shim.set("fault=arch");
    expect_unavailable(
        open(SanitizePolicy::Auto),
        &["gcnArchName"],
        "unknown architecture fault",
    );
    shim.set("fault=none;device=mi100");
    expect_unavailable(
        open(SanitizePolicy::Auto),
        &["gfx908", "gfx90a, gfx942, gfx950", "DSV4_KVCACHE_HIP_ARCHS"],
        "an architecture without a code object",
    );
    shim.assert_balanced("after the faults at open");

    // And the runtime still opens a working backend.
    shim.set("fault=none;device=mi300x");
    let b = open(SanitizePolicy::Auto).expect("backend after every fault");
    matches_reference(&b, &plain, "mi300x after the faults");
    drop(b);
    shim.assert_balanced("at the end");
    let c = shim.counters();
    assert!(c["faults_injected"] >= 8, "{c:?}");
    println!("hip-on-cuda counters: {c:?}");
}

/// `hipGetDevice` / `hipSetDevice` of the copy at `path` (already loaded).
struct Current {
    get: unsafe extern "C" fn(*mut c_int) -> c_int,
    set: unsafe extern "C" fn(c_int) -> c_int,
    _lib: libloading::Library,
}

impl Current {
    fn open(path: &str) -> Current {
        // SAFETY: the HIP runtime's initializers; the symbols have these signatures.
        unsafe {
            let lib = libloading::Library::new(path).expect("the test runtime");
            Current {
                get: *lib.get(b"hipGetDevice\0").expect("hipGetDevice"),
                set: *lib.get(b"hipSetDevice\0").expect("hipSetDevice"),
                _lib: lib,
            }
        }
    }
    fn get(&self) -> c_int {
        let mut d = -1;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { (self.get)(&mut d) }, 0, "hipGetDevice");
        d
    }
    fn set(&self, d: c_int) {
        // SAFETY: plain C call.
        assert_eq!(unsafe { (self.set)(d) }, 0, "hipSetDevice({d})");
    }
}

/// A copy of the runtime loaded from an unusual path before the backend
/// starts (as ROCm torch loads its own from torch/lib), another copy on the
/// loader's search path: the backend uses the first and never maps the
/// second. `HIPCUDA_PRELOAD` names the first (scripts/hip-on-cuda.sh sets
/// it, in a process of its own).
#[test]
fn preloaded_copy_is_used() {
    let Ok(path) = std::env::var("HIPCUDA_PRELOAD") else {
        return skip("HIPCUDA_PRELOAD is unset (scripts/hip-on-cuda.sh runs this test with it)");
    };
    // SAFETY: the test runtime's initializers only.
    let lib = unsafe { libloading::Library::new(&path) }.expect("HIPCUDA_PRELOAD loads");
    let counters: Counters = *unsafe { lib.get(b"hipcudaCounters\0") }.expect("hipcudaCounters");
    let real = std::fs::canonicalize(&path).expect("canonical path");
    let b = match HipBackend::new(0) {
        Ok(b) => b,
        Err(e) => return skip(&format!("the preloaded test runtime is loaded but: {e}")),
    };
    println!("runtime used: {}", b.runtime_path());
    assert!(
        b.runtime_path().starts_with(&real.display().to_string())
            && b.runtime_path().contains("already loaded"),
        "the backend did not use the preloaded {}: {}",
        real.display(),
        b.runtime_path()
    );
    let case = nan_insert_case(b.sanitize());
    matches_reference(&b, &case, "preloaded copy");
    let mut v = vec![0u64; 16];
    // SAFETY: v holds 16 values.
    unsafe { counters(v.as_mut_ptr(), v.len()) };
    assert!(v[0] > 0, "the preloaded copy made no allocation: {v:?}");
    let hip_copies = maps::mapped_files(&["libamdhip64", "libhip_on_cuda"]);
    assert_eq!(
        hip_copies,
        vec![real.display().to_string()],
        "more than one HIP runtime is mapped"
    );
}

/// A runtime reporting two devices (`HIPCUDA_DEVICE_COUNT=2`, both on the
/// one GPU): the backend on device 1 leaves the caller's device 0 current
/// after opening, allocating, copying, launching, synchronizing and timing,
/// and the backend on device 0 leaves device 1 current.
#[test]
fn second_device_leaves_the_callers_current() {
    if std::env::var("HIPCUDA_DEVICE_COUNT").as_deref() != Ok("2") {
        return skip(
            "HIPCUDA_DEVICE_COUNT is not 2 (scripts/hip-on-cuda.sh runs this test with it)",
        );
    }
    if let Err(reason) = Shim::open() {
        return skip(&reason);
    }
    let cur = Current::open("libamdhip64.so");
    cur.set(0);
    let b1 = match HipBackend::new(1) {
        Ok(b) => b,
        Err(e) => return skip(&format!("the test runtime is loaded but: {e}")),
    };
    assert_eq!(b1.device(), 1);
    assert_eq!(
        cur.get(),
        0,
        "HipBackend::new(1) changed the current device"
    );
    let case = nan_insert_case(b1.sanitize());
    matches_reference(&b1, &case, "device 1");
    assert_eq!(
        cur.get(),
        0,
        "a call on device 1 changed the current device"
    );
    b1.time_copy(1 << 20, 2).expect("a timed copy on device 1");
    assert_eq!(
        cur.get(),
        0,
        "timing on device 1 changed the current device"
    );
    cur.set(1);
    let b0 = HipBackend::new(0).expect("device 0");
    matches_reference(&b0, &case, "device 0");
    assert_eq!(
        cur.get(),
        1,
        "a call on device 0 changed the current device"
    );
    drop((b0, b1));
    assert_eq!(cur.get(), 1);
    println!("two devices: calls on each left the caller's current device");
}
