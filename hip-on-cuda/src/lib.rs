//! A HIP runtime on the CUDA driver API, for testing only: built as
//! `libamdhip64.so`, it lets the HIP backend's host code (loading, property
//! reading, module loading, launches, copies, events, graph capture, the
//! sanitize switch and its error paths) run on an NVIDIA GPU.
//!
//! * It reports the properties of an AMD Instinct model chosen with
//!   `HIPCUDA_DEVICE` (`mi300x`, the default, `mi355x`, `mi210`, `mi250x`
//!   or `mi100`; see
//!   `props.rs`): its `gcnArchName`, a 64-lane wavefront, its LDS size and CU
//!   count. Memory is the real GPU's.
//! * Handed one of the library's AMDGPU code objects (an ELF with
//!   `e_machine` = `EM_AMDGPU`), `hipModuleLoadData` loads the CUDA fatbin
//!   built from the same kernel source instead
//!   (`dsv4_kvcache::kernels::cuda_fatbin`): same kernel names, same
//!   parameter blocks, so the backend's launches run the real kernels.
//! * Faults on request (`HIPCUDA_FAULT`, or `hipcudaConfigure("fault=...")`
//!   at run time): see [`faults`].
//! * Every `hipMalloc`/`hipFree`, module and graph is counted;
//!   `hipcudaCounters` returns the counts and `HIPCUDA_REPORT=path` (or `-`
//!   for stderr) writes them at exit, so tests can prove nothing leaked.
//!
//! Every HIP entry point the backend resolves is exported here with the
//! signature of `hip_runtime_api.h`; `tests/hip_bindings.rs` checks that
//! each symbol declared in `src/backend/hip/ffi.rs` is exported by this file.
//! To add one: write it with `entry!` below, on the CUDA driver call that
//! does the same.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

pub mod faults;
pub mod props;

use cudarc::driver::sys as cu;
use faults::Fault;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// `hipError_t`.
type HipError = c_int;

// HIP's error codes (hip_runtime_api.h); most equal the CUDA driver's.
const SUCCESS: HipError = 0;
const INVALID_VALUE: HipError = 1;
const OUT_OF_MEMORY: HipError = 2;
const INVALID_MEMCPY_DIRECTION: HipError = 21;
const NO_DEVICE: HipError = 100;
const INVALID_DEVICE: HipError = 101;
const INVALID_IMAGE: HipError = 200;
const NOT_FOUND: HipError = 500;
const LAUNCH_FAILURE: HipError = 719;
const STREAM_CAPTURE_INVALIDATED: HipError = 901;
const UNKNOWN: HipError = 999;

/// Names and messages of the codes this library returns or passes through.
const ERRORS: &[(HipError, &CStr, &CStr)] = &[
    (SUCCESS, c"hipSuccess", c"no error"),
    (INVALID_VALUE, c"hipErrorInvalidValue", c"invalid argument"),
    (OUT_OF_MEMORY, c"hipErrorOutOfMemory", c"out of memory"),
    (3, c"hipErrorNotInitialized", c"initialization error"),
    (4, c"hipErrorDeinitialized", c"driver shutting down"),
    (
        INVALID_MEMCPY_DIRECTION,
        c"hipErrorInvalidMemcpyDirection",
        c"invalid copy direction",
    ),
    (
        NO_DEVICE,
        c"hipErrorNoDevice",
        c"no ROCm-capable device is detected",
    ),
    (
        INVALID_DEVICE,
        c"hipErrorInvalidDevice",
        c"invalid device ordinal",
    ),
    (
        INVALID_IMAGE,
        c"hipErrorInvalidImage",
        c"device kernel image is invalid",
    ),
    (201, c"hipErrorInvalidContext", c"invalid device context"),
    (
        209,
        c"hipErrorNoBinaryForGpu",
        c"no kernel image is available for execution on the device",
    ),
    (218, c"hipErrorInvalidKernelFile", c"invalid kernel file"),
    (400, c"hipErrorInvalidHandle", c"invalid resource handle"),
    (NOT_FOUND, c"hipErrorNotFound", c"named symbol not found"),
    (600, c"hipErrorNotReady", c"device not ready"),
    (
        700,
        c"hipErrorIllegalAddress",
        c"an illegal memory access was encountered",
    ),
    (
        701,
        c"hipErrorLaunchOutOfResources",
        c"too many resources requested for launch",
    ),
    (
        LAUNCH_FAILURE,
        c"hipErrorLaunchFailure",
        c"unspecified launch failure",
    ),
    (801, c"hipErrorNotSupported", c"operation not supported"),
    (
        900,
        c"hipErrorStreamCaptureUnsupported",
        c"operation not permitted when stream is capturing",
    ),
    (
        STREAM_CAPTURE_INVALIDATED,
        c"hipErrorStreamCaptureInvalidated",
        c"operation failed due to a previous error during capture",
    ),
    (UNKNOWN, c"hipErrorUnknown", c"unknown error"),
];

/// A CUDA driver result as a HIP code: the numbers HIP shares with CUDA
/// pass through; others become `hipErrorUnknown` (and are printed, so the
/// original is not lost).
fn code(r: cu::CUresult) -> HipError {
    let n = r as i32;
    if ERRORS.iter().any(|(c, _, _)| *c == n) {
        n
    } else {
        eprintln!("hip-on-cuda: CUDA driver error {r:?} ({n}) reported as hipErrorUnknown");
        UNKNOWN
    }
}

fn ok(r: cu::CUresult) -> HipError {
    if r == cu::CUresult::CUDA_SUCCESS {
        SUCCESS
    } else {
        code(r)
    }
}

/// `r`, a success counted in `counter` (what was created or destroyed).
fn count(r: HipError, counter: &AtomicU64) -> HipError {
    if r == SUCCESS {
        counter.fetch_add(1, Relaxed);
    }
    r
}

/// Process-wide state: the primary context of each HIP device, and the
/// CUDA device each stands for (`HIPCUDA_DEVICE_COUNT=N` reports N devices,
/// device i on CUDA device i mod the real count, so one GPU can test code
/// that switches devices).
struct Global {
    contexts: Vec<cu::CUcontext>,
    cuda: Vec<c_int>,
}

// SAFETY: CUDA contexts are process-wide handles usable from any thread.
unsafe impl Send for Global {}
unsafe impl Sync for Global {}

static GLOBAL: OnceLock<Result<Global, HipError>> = OnceLock::new();

thread_local! {
    /// The calling thread's HIP device (`hipSetDevice`).
    static CURRENT: Cell<c_int> = const { Cell::new(0) };
}

fn global() -> Result<&'static Global, HipError> {
    GLOBAL
        .get_or_init(|| unsafe {
            if !cu::is_culib_present() {
                return Err(NO_DEVICE);
            }
            let r = cu::cuInit(0);
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(code(r));
            }
            let mut n = 0;
            let r = cu::cuDeviceGetCount(&mut n);
            if r != cu::CUresult::CUDA_SUCCESS || n == 0 {
                return Err(NO_DEVICE);
            }
            let mut contexts = Vec::new();
            let mut cuda = Vec::new();
            for d in 0..n {
                let mut dev = 0;
                let mut ctx = null_mut();
                let r = cu::cuDeviceGet(&mut dev, d);
                if r != cu::CUresult::CUDA_SUCCESS {
                    return Err(code(r));
                }
                let r = cu::cuDevicePrimaryCtxRetain(&mut ctx, dev);
                if r != cu::CUresult::CUDA_SUCCESS {
                    return Err(code(r));
                }
                contexts.push(ctx);
                cuda.push(dev);
            }
            let wanted = std::env::var("HIPCUDA_DEVICE_COUNT")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            for i in contexts.len()..wanted {
                contexts.push(contexts[i % n as usize]);
                cuda.push(cuda[i % n as usize]);
            }
            faults::init_from_env();
            if std::env::var_os("HIPCUDA_REPORT").is_some() {
                extern "C" {
                    fn atexit(f: extern "C" fn()) -> c_int;
                }
                atexit(report_at_exit);
            }
            Ok(Global { contexts, cuda })
        })
        .as_ref()
        .map_err(|e| *e)
}

/// Makes the calling thread's device current (CUDA contexts are per thread,
/// HIP's current device is too).
fn enter() -> Result<(), HipError> {
    let g = global()?;
    let d = CURRENT.with(|c| c.get());
    let ctx = *g.contexts.get(d as usize).ok_or(INVALID_DEVICE)?;
    match unsafe { cu::cuCtxSetCurrent(ctx) } {
        cu::CUresult::CUDA_SUCCESS => Ok(()),
        r => Err(code(r)),
    }
}

/// Defines an exported HIP entry point whose body runs with the thread's
/// context current and returns a `hipError_t`; a panic becomes
/// `hipErrorUnknown` rather than unwinding into C.
macro_rules! entry {
    ($name:ident($($a:ident: $t:ty),*) $body:block) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> HipError {
            let run = || -> HipError {
                if let Err(e) = enter() {
                    return e;
                }
                $body
            };
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
                eprintln!("hip-on-cuda: panic in {}", stringify!($name));
                UNKNOWN
            })
        }
    };
}

// ---- counters -------------------------------------------------------------

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static BAD_FREES: AtomicU64 = AtomicU64::new(0);
static MODULES_LOADED: AtomicU64 = AtomicU64::new(0);
static MODULES_UNLOADED: AtomicU64 = AtomicU64::new(0);
static GRAPHS_CREATED: AtomicU64 = AtomicU64::new(0);
static GRAPHS_DESTROYED: AtomicU64 = AtomicU64::new(0);
static EXECS_CREATED: AtomicU64 = AtomicU64::new(0);
static EXECS_DESTROYED: AtomicU64 = AtomicU64::new(0);
static STREAMS_CREATED: AtomicU64 = AtomicU64::new(0);
static STREAMS_DESTROYED: AtomicU64 = AtomicU64::new(0);
static EVENTS_CREATED: AtomicU64 = AtomicU64::new(0);
static EVENTS_DESTROYED: AtomicU64 = AtomicU64::new(0);
static FAULTS_INJECTED: AtomicU64 = AtomicU64::new(0);

/// Live allocations: device address -> bytes.
static LIVE: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<HashMap<u64, usize>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The names of [`hipcudaCounters`]' values, in order.
pub const COUNTER_NAMES: &[&str] = &[
    "allocs",
    "frees",
    "bad_frees",
    "live_allocs",
    "live_bytes",
    "modules_loaded",
    "modules_unloaded",
    "graphs_created",
    "graphs_destroyed",
    "execs_created",
    "execs_destroyed",
    "streams_created",
    "streams_destroyed",
    "events_created",
    "events_destroyed",
    "faults_injected",
];

fn counters() -> Vec<u64> {
    let (n, bytes) = live().as_ref().map_or((0, 0), |m| {
        (m.len() as u64, m.values().sum::<usize>() as u64)
    });
    vec![
        ALLOCS.load(Relaxed),
        FREES.load(Relaxed),
        BAD_FREES.load(Relaxed),
        n,
        bytes,
        MODULES_LOADED.load(Relaxed),
        MODULES_UNLOADED.load(Relaxed),
        GRAPHS_CREATED.load(Relaxed),
        GRAPHS_DESTROYED.load(Relaxed),
        EXECS_CREATED.load(Relaxed),
        EXECS_DESTROYED.load(Relaxed),
        STREAMS_CREATED.load(Relaxed),
        STREAMS_DESTROYED.load(Relaxed),
        EVENTS_CREATED.load(Relaxed),
        EVENTS_DESTROYED.load(Relaxed),
        FAULTS_INJECTED.load(Relaxed),
    ]
}

/// The counters as one line of `name=value` pairs.
fn counters_line() -> String {
    COUNTER_NAMES
        .iter()
        .zip(counters())
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

extern "C" fn report_at_exit() {
    let line = format!("hip-on-cuda counters: {}\n", counters_line());
    match std::env::var("HIPCUDA_REPORT").as_deref() {
        Ok("-") | Ok("") => eprint!("{line}"),
        Ok(path) => {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(line.as_bytes());
            }
        }
        Err(_) => {}
    }
}

/// Test control: writes up to `n` counters (in the order of
/// [`COUNTER_NAMES`]) to `out` and returns how many there are.
#[no_mangle]
pub unsafe extern "C" fn hipcudaCounters(out: *mut u64, n: usize) -> usize {
    let c = counters();
    if !out.is_null() {
        for (i, v) in c.iter().take(n).enumerate() {
            *out.add(i) = *v;
        }
    }
    c.len()
}

/// Test control: the names of [`hipcudaCounters`]' values, in order,
/// separated by spaces (a NUL-terminated string that lives as long as the
/// library), so that tests read the list rather than repeat it.
#[no_mangle]
pub extern "C" fn hipcudaCounterNames() -> *const c_char {
    static NAMES: OnceLock<Vec<u8>> = OnceLock::new();
    NAMES
        .get_or_init(|| format!("{}\0", COUNTER_NAMES.join(" ")).into_bytes())
        .as_ptr() as *const c_char
}

/// Test control: `spec` is `device=mi300x|mi355x|mi210|mi250x|mi100`, `fault=...` (see
/// [`faults`]) or `fault=none`; several separated by `;`. Returns 0, or -1
/// (and prints why) for a spec it does not understand.
#[no_mangle]
pub unsafe extern "C" fn hipcudaConfigure(spec: *const c_char) -> c_int {
    if spec.is_null() {
        return -1;
    }
    let s = CStr::from_ptr(spec).to_string_lossy();
    match faults::configure(&s) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("hip-on-cuda: hipcudaConfigure({s:?}): {e}");
            -1
        }
    }
}

/// Counts an injected fault and returns its code.
fn injected(f: Fault, code: HipError) -> HipError {
    injected_note(f);
    code
}

/// Counts and reports an injected fault.
fn injected_note(f: Fault) {
    FAULTS_INJECTED.fetch_add(1, Relaxed);
    eprintln!("hip-on-cuda: injected fault {f:?}");
}

// ---- device ---------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn hipInit(flags: c_uint) -> HipError {
    if flags != 0 {
        return INVALID_VALUE;
    }
    match global() {
        Ok(_) => SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceCount(count: *mut c_int) -> HipError {
    if count.is_null() {
        return INVALID_VALUE;
    }
    match global() {
        Ok(g) => {
            *count = g.contexts.len() as c_int;
            SUCCESS
        }
        Err(e) => {
            *count = 0;
            e
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn hipSetDevice(device: c_int) -> HipError {
    let g = match global() {
        Ok(g) => g,
        Err(e) => return e,
    };
    if device < 0 || device as usize >= g.contexts.len() {
        return INVALID_DEVICE;
    }
    CURRENT.with(|c| c.set(device));
    match enter() {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDevice(device: *mut c_int) -> HipError {
    if device.is_null() {
        return INVALID_VALUE;
    }
    if let Err(e) = global() {
        return e;
    }
    *device = CURRENT.with(|c| c.get());
    SUCCESS
}

entry!(hipDeviceGet(device: *mut c_int, ordinal: c_int) {
    let n = global().map_or(0, |g| g.contexts.len());
    if device.is_null() || ordinal < 0 || ordinal as usize >= n {
        return INVALID_DEVICE;
    }
    *device = ordinal;
    SUCCESS
});

fn valid_device(device: c_int) -> bool {
    device >= 0 && global().is_ok_and(|g| (device as usize) < g.contexts.len())
}

entry!(hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) {
    if name.is_null() || len <= 0 {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let s = faults::profile().name.as_bytes();
    let n = s.len().min(len as usize - 1);
    std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, name, n);
    *name.add(n) = 0;
    SUCCESS
});

fn real_total_mem(device: c_int) -> Result<usize, HipError> {
    let mut bytes = 0usize;
    let cuda = global()?.cuda[device as usize];
    match unsafe { cu::cuDeviceTotalMem_v2(&mut bytes, cuda) } {
        cu::CUresult::CUDA_SUCCESS => Ok(bytes),
        r => Err(code(r)),
    }
}

entry!(hipDeviceTotalMem(bytes: *mut usize, device: c_int) {
    if bytes.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    match real_total_mem(device) {
        Ok(b) => {
            *bytes = b;
            SUCCESS
        }
        Err(e) => e,
    }
});

entry!(hipMemGetInfo(free: *mut usize, total: *mut usize) {
    if free.is_null() || total.is_null() {
        return INVALID_VALUE;
    }
    ok(cu::cuMemGetInfo_v2(free, total))
});

entry!(hipGetDevicePropertiesR0600(props: *mut c_void, device: c_int) {
    if props.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let mem = match real_total_mem(device) {
        Ok(b) => b,
        Err(e) => return e,
    };
    let mut buf = [0u8; props::R0600_SIZE];
    props::fill_r0600(&mut buf, &faults::profile(), &faults::arch_name(), mem);
    std::ptr::copy_nonoverlapping(buf.as_ptr(), props as *mut u8, buf.len());
    SUCCESS
});

entry!(hipGetDeviceProperties(props: *mut c_void, device: c_int) {
    // The legacy R0000 layout: only `name` and `gcnArchName` are filled.
    if props.is_null() {
        return INVALID_VALUE;
    }
    if !valid_device(device) {
        return INVALID_DEVICE;
    }
    let p = props as *mut u8;
    std::ptr::write_bytes(p, 0, props::R0000_GCN_ARCH_NAME + 256);
    let name = faults::profile().name;
    std::ptr::copy_nonoverlapping(name.as_ptr(), p, name.len());
    let arch = faults::arch_name();
    std::ptr::copy_nonoverlapping(arch.as_ptr(), p.add(props::R0000_GCN_ARCH_NAME), arch.len().min(255));
    SUCCESS
});

/// The HIP version reported: ROCm 6.4's (`HIP_VERSION` encoding).
const RUNTIME_VERSION: c_int = 60_443_484;

#[no_mangle]
pub unsafe extern "C" fn hipRuntimeGetVersion(version: *mut c_int) -> HipError {
    if version.is_null() {
        return INVALID_VALUE;
    }
    *version = RUNTIME_VERSION;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn hipDriverGetVersion(version: *mut c_int) -> HipError {
    if version.is_null() {
        return INVALID_VALUE;
    }
    *version = RUNTIME_VERSION;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn hipGetErrorName(e: HipError) -> *const c_char {
    ERRORS
        .iter()
        .find(|(c, _, _)| *c == e)
        .map_or(c"hipErrorUnknown".as_ptr(), |(_, n, _)| n.as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn hipGetErrorString(e: HipError) -> *const c_char {
    ERRORS
        .iter()
        .find(|(c, _, _)| *c == e)
        .map_or(c"unknown error".as_ptr(), |(_, _, s)| s.as_ptr())
}

// ---- streams and events ---------------------------------------------------

entry!(hipStreamCreate(stream: *mut *mut c_void) {
    if stream.is_null() {
        return INVALID_VALUE;
    }
    count(ok(cu::cuStreamCreate(stream as *mut cu::CUstream, 0)), &STREAMS_CREATED)
});

entry!(hipStreamDestroy(stream: *mut c_void) {
    count(ok(cu::cuStreamDestroy_v2(stream as cu::CUstream)), &STREAMS_DESTROYED)
});

entry!(hipStreamSynchronize(stream: *mut c_void) {
    let r = ok(cu::cuStreamSynchronize(stream as cu::CUstream));
    if r == SUCCESS && faults::hit(Fault::Sync) {
        // The work really finished; only the report is a kernel failure.
        return injected(Fault::Sync, LAUNCH_FAILURE);
    }
    r
});

entry!(hipEventCreate(event: *mut *mut c_void) {
    if event.is_null() {
        return INVALID_VALUE;
    }
    count(ok(cu::cuEventCreate(event as *mut cu::CUevent, 0)), &EVENTS_CREATED)
});

entry!(hipEventDestroy(event: *mut c_void) {
    count(ok(cu::cuEventDestroy_v2(event as cu::CUevent)), &EVENTS_DESTROYED)
});

entry!(hipEventRecord(event: *mut c_void, stream: *mut c_void) {
    ok(cu::cuEventRecord(event as cu::CUevent, stream as cu::CUstream))
});

entry!(hipEventSynchronize(event: *mut c_void) {
    ok(cu::cuEventSynchronize(event as cu::CUevent))
});

entry!(hipEventElapsedTime(ms: *mut f32, start: *mut c_void, stop: *mut c_void) {
    if ms.is_null() {
        return INVALID_VALUE;
    }
    ok(cu::cuEventElapsedTime_v2(ms, start as cu::CUevent, stop as cu::CUevent))
});

// ---- memory ---------------------------------------------------------------

entry!(hipMalloc(ptr: *mut *mut c_void, size: usize) {
    if ptr.is_null() {
        return INVALID_VALUE;
    }
    *ptr = null_mut();
    if faults::hit(Fault::Alloc) {
        return injected(Fault::Alloc, OUT_OF_MEMORY);
    }
    if size == 0 {
        return SUCCESS;
    }
    let mut d: cu::CUdeviceptr = 0;
    let r = ok(cu::cuMemAlloc_v2(&mut d, size));
    if r == SUCCESS {
        ALLOCS.fetch_add(1, Relaxed);
        live().get_or_insert_with(HashMap::new).insert(d, size);
        *ptr = d as *mut c_void;
    }
    r
});

entry!(hipFree(ptr: *mut c_void) {
    if ptr.is_null() {
        return SUCCESS;
    }
    let known = live().get_or_insert_with(HashMap::new).remove(&(ptr as u64)).is_some();
    if !known {
        BAD_FREES.fetch_add(1, Relaxed);
        eprintln!("hip-on-cuda: hipFree({ptr:p}) of an address hipMalloc did not return");
        return INVALID_VALUE;
    }
    FREES.fetch_add(1, Relaxed);
    ok(cu::cuMemFree_v2(ptr as cu::CUdeviceptr))
});

entry!(hipMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: *mut c_void) {
    let s = stream as cu::CUstream;
    let r = match kind {
        // hipMemcpyHostToDevice, DeviceToHost, DeviceToDevice.
        1 => cu::cuMemcpyHtoDAsync_v2(dst as u64, src, size, s),
        2 => cu::cuMemcpyDtoHAsync_v2(dst, src as u64, size, s),
        3 => cu::cuMemcpyDtoDAsync_v2(dst as u64, src as u64, size, s),
        // HostToHost and Default: unified addressing tells the directions.
        0 | 4 => cu::cuMemcpyAsync(dst as u64, src as u64, size, s),
        _ => return INVALID_MEMCPY_DIRECTION,
    };
    ok(r)
});

entry!(hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, stream: *mut c_void) {
    ok(cu::cuMemsetD8Async(dst as u64, value as u8, size, stream as cu::CUstream))
});

// ---- modules and launches -------------------------------------------------

/// `EM_AMDGPU`, the ELF machine of AMDGPU code objects.
const EM_AMDGPU: u16 = 224;

/// Whether `image` starts like an AMDGPU code object (ELF, `e_machine` =
/// `EM_AMDGPU`). Only the header is read, which every ELF has.
unsafe fn is_amdgpu_elf(image: *const u8) -> bool {
    let h = std::slice::from_raw_parts(image, 20);
    h[..4] == *b"\x7fELF" && u16::from_le_bytes([h[18], h[19]]) == EM_AMDGPU
}

entry!(hipModuleLoadData(module: *mut *mut c_void, image: *const c_void) {
    if module.is_null() || image.is_null() {
        return INVALID_VALUE;
    }
    if faults::hit(Fault::ModuleLoad) {
        return injected(Fault::ModuleLoad, INVALID_IMAGE);
    }
    let data = if is_amdgpu_elf(image as *const u8) {
        match dsv4_kvcache::kernels::cuda_fatbin() {
            Some(f) => f.as_ptr() as *const c_void,
            None => {
                eprintln!("hip-on-cuda: this build of the library has no CUDA fatbin to stand in for AMDGPU code objects");
                return INVALID_IMAGE;
            }
        }
    } else {
        image
    };
    count(ok(cu::cuModuleLoadData(module as *mut cu::CUmodule, data)), &MODULES_LOADED)
});

entry!(hipModuleUnload(module: *mut c_void) {
    count(ok(cu::cuModuleUnload(module as cu::CUmodule)), &MODULES_UNLOADED)
});

entry!(hipModuleGetFunction(function: *mut *mut c_void, module: *mut c_void, name: *const c_char) {
    if function.is_null() || name.is_null() {
        return INVALID_VALUE;
    }
    if faults::hit(Fault::MissingKernel) {
        return injected(Fault::MissingKernel, NOT_FOUND);
    }
    ok(cu::cuModuleGetFunction(function as *mut cu::CUfunction, module as cu::CUmodule, name))
});

entry!(hipModuleLaunchKernel(
    f: *mut c_void,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void
) {
    if faults::hit(Fault::Launch) {
        return injected(Fault::Launch, LAUNCH_FAILURE);
    }
    ok(cu::cuLaunchKernel(
        f as cu::CUfunction,
        grid_x,
        grid_y,
        grid_z,
        block_x,
        block_y,
        block_z,
        shared,
        stream as cu::CUstream,
        params,
        extra,
    ))
});

// ---- graphs ---------------------------------------------------------------

entry!(hipStreamBeginCapture(stream: *mut c_void, mode: c_int) {
    use cu::CUstreamCaptureMode as M;
    // hipStreamCaptureModeGlobal, ThreadLocal, Relaxed: CUDA's numbering.
    let m = match mode {
        0 => M::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        2 => M::CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => return INVALID_VALUE,
    };
    ok(cu::cuStreamBeginCapture_v2(stream as cu::CUstream, m))
});

entry!(hipStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) {
    if graph.is_null() {
        return INVALID_VALUE;
    }
    let mut g: cu::CUgraph = null_mut();
    let r = ok(cu::cuStreamEndCapture(stream as cu::CUstream, &mut g));
    if r == SUCCESS && !g.is_null() {
        GRAPHS_CREATED.fetch_add(1, Relaxed);
        if faults::hit(Fault::Capture) {
            // The capture really ended (the stream is usable again) and its
            // graph is released: only the result is a failure.
            if cu::cuGraphDestroy(g) == cu::CUresult::CUDA_SUCCESS {
                GRAPHS_DESTROYED.fetch_add(1, Relaxed);
            }
            *graph = null_mut();
            return injected(Fault::Capture, STREAM_CAPTURE_INVALIDATED);
        }
    }
    *graph = g as *mut c_void;
    r
});

entry!(hipGraphInstantiate(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    error_node: *mut c_void,
    log: *mut c_char,
    log_size: usize
) {
    if exec.is_null() {
        return INVALID_VALUE;
    }
    if !error_node.is_null() {
        *(error_node as *mut *mut c_void) = null_mut();
    }
    if !log.is_null() && log_size > 0 {
        *log = 0;
    }
    count(ok(cu::cuGraphInstantiateWithFlags(exec as *mut cu::CUgraphExec, graph as cu::CUgraph, 0)), &EXECS_CREATED)
});

entry!(hipGraphLaunch(exec: *mut c_void, stream: *mut c_void) {
    ok(cu::cuGraphLaunch(exec as cu::CUgraphExec, stream as cu::CUstream))
});

entry!(hipGraphExecDestroy(exec: *mut c_void) {
    count(ok(cu::cuGraphExecDestroy(exec as cu::CUgraphExec)), &EXECS_DESTROYED)
});

entry!(hipGraphDestroy(graph: *mut c_void) {
    count(ok(cu::cuGraphDestroy(graph as cu::CUgraph)), &GRAPHS_DESTROYED)
});
