//! Minimal HIP runtime bindings, resolved at run time from `libamdhip64`.
//!
//! Only the C entry points the backend calls are declared, each with the
//! signature documented in `hip_runtime_api.h`. Handles (streams, modules,
//! functions, events, graphs) are opaque pointers; `hipError_t` is a C enum,
//! an `int` on every ABI HIP supports; `hipDevice_t` is an `int`.

use super::loaded;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// `hipError_t`.
pub(crate) type HipError = c_int;
/// `hipSuccess`.
pub(crate) const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice`: what `hipInit`/`hipGetDeviceCount` return on a host
/// without an AMD GPU.
pub(crate) const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipMemcpyHostToDevice`.
pub(crate) const MEMCPY_H2D: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub(crate) const MEMCPY_D2H: c_int = 2;
/// `hipMemcpyDeviceToDevice`.
pub(crate) const MEMCPY_D2D: c_int = 3;
/// `hipStreamCaptureModeThreadLocal`: only this thread's unsafe calls end
/// the capture.
pub(crate) const CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

pub(crate) type Stream = *mut c_void;
pub(crate) type Module = *mut c_void;
pub(crate) type Function = *mut c_void;
pub(crate) type Event = *mut c_void;
pub(crate) type Graph = *mut c_void;
pub(crate) type GraphExec = *mut c_void;
pub(crate) type GraphNode = *mut c_void;

/// Declares the symbol table: `required` entries must resolve, `optional`
/// ones become `None` when the runtime lacks them.
macro_rules! hip_api {
    (
        required { $($rf:ident = $rs:literal: fn($($ra:ty),*) -> $rr:ty;)* }
        optional { $($of:ident = $os:literal: fn($($oa:ty),*) -> $or:ty;)* }
    ) => {
        /// The resolved entry points. The function pointers stay valid while
        /// `_lib` is loaded, i.e. as long as this value lives. Some are
        /// resolved for completeness of the table only.
        #[allow(dead_code)]
        pub(crate) struct Api {
            /// Where the library was loaded from.
            pub path: String,
            $(pub $rf: unsafe extern "C" fn($($ra),*) -> $rr,)*
            $(pub $of: Option<unsafe extern "C" fn($($oa),*) -> $or>,)*
            _lib: libloading::Library,
        }

        impl Api {
            /// # Safety
            /// `lib` must be a HIP runtime whose symbols have the declared
            /// signatures.
            unsafe fn resolve(lib: libloading::Library, path: String) -> Result<Api, String> {
                $(
                    let $rf = *lib
                        .get::<unsafe extern "C" fn($($ra),*) -> $rr>(concat!($rs, "\0").as_bytes())
                        .map_err(|e| format!("{path} has no symbol {}: {e}", $rs))?;
                )*
                $(
                    let $of = lib
                        .get::<unsafe extern "C" fn($($oa),*) -> $or>(concat!($os, "\0").as_bytes())
                        .ok()
                        .map(|s| *s);
                )*
                Ok(Api { path, $($rf,)* $($of,)* _lib: lib })
            }
        }
    };
}

hip_api! {
    required {
        init = "hipInit": fn(c_uint) -> HipError;
        get_device_count = "hipGetDeviceCount": fn(*mut c_int) -> HipError;
        get_device = "hipGetDevice": fn(*mut c_int) -> HipError;
        set_device = "hipSetDevice": fn(c_int) -> HipError;
        device_get = "hipDeviceGet": fn(*mut c_int, c_int) -> HipError;
        device_get_name = "hipDeviceGetName": fn(*mut c_char, c_int, c_int) -> HipError;
        stream_create = "hipStreamCreate": fn(*mut Stream) -> HipError;
        stream_destroy = "hipStreamDestroy": fn(Stream) -> HipError;
        stream_synchronize = "hipStreamSynchronize": fn(Stream) -> HipError;
        malloc = "hipMalloc": fn(*mut *mut c_void, usize) -> HipError;
        free = "hipFree": fn(*mut c_void) -> HipError;
        memcpy_async = "hipMemcpyAsync": fn(*mut c_void, *const c_void, usize, c_int, Stream) -> HipError;
        memset_async = "hipMemsetAsync": fn(*mut c_void, c_int, usize, Stream) -> HipError;
        module_load_data = "hipModuleLoadData": fn(*mut Module, *const c_void) -> HipError;
        module_unload = "hipModuleUnload": fn(Module) -> HipError;
        module_get_function = "hipModuleGetFunction": fn(*mut Function, Module, *const c_char) -> HipError;
        module_launch_kernel = "hipModuleLaunchKernel": fn(
            Function, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Stream,
            *mut *mut c_void, *mut *mut c_void
        ) -> HipError;
        get_error_string = "hipGetErrorString": fn(HipError) -> *const c_char;
        event_create = "hipEventCreate": fn(*mut Event) -> HipError;
        event_destroy = "hipEventDestroy": fn(Event) -> HipError;
        event_record = "hipEventRecord": fn(Event, Stream) -> HipError;
        event_synchronize = "hipEventSynchronize": fn(Event) -> HipError;
        event_elapsed_time = "hipEventElapsedTime": fn(*mut f32, Event, Event) -> HipError;
    }
    optional {
        // ROCm 6+: the R0600 layout (the one `hipGetDeviceProperties` means
        // in ROCm 6+ headers, through a macro).
        get_device_properties_r0600 = "hipGetDevicePropertiesR0600": fn(*mut c_void, c_int) -> HipError;
        // The plain symbol: the legacy R0000 layout in ROCm 5 and 6.
        get_device_properties = "hipGetDeviceProperties": fn(*mut c_void, c_int) -> HipError;
        runtime_get_version = "hipRuntimeGetVersion": fn(*mut c_int) -> HipError;
        driver_get_version = "hipDriverGetVersion": fn(*mut c_int) -> HipError;
        device_total_mem = "hipDeviceTotalMem": fn(*mut usize, c_int) -> HipError;
        mem_get_info = "hipMemGetInfo": fn(*mut usize, *mut usize) -> HipError;
        get_error_name = "hipGetErrorName": fn(HipError) -> *const c_char;
        stream_begin_capture = "hipStreamBeginCapture": fn(Stream, c_int) -> HipError;
        stream_end_capture = "hipStreamEndCapture": fn(Stream, *mut Graph) -> HipError;
        graph_instantiate = "hipGraphInstantiate": fn(*mut GraphExec, Graph, *mut GraphNode, *mut c_char, usize) -> HipError;
        graph_launch = "hipGraphLaunch": fn(GraphExec, Stream) -> HipError;
        graph_exec_destroy = "hipGraphExecDestroy": fn(GraphExec) -> HipError;
        graph_destroy = "hipGraphDestroy": fn(Graph) -> HipError;
    }
}

// SAFETY: the table holds only function pointers into a loaded library and
// the library handle; the HIP runtime's entry points are thread-safe.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

impl Api {
    /// `hipGetErrorName: hipGetErrorString (code)`.
    pub fn error_message(&self, code: HipError) -> String {
        // SAFETY: both return pointers to static NUL-terminated strings (or null).
        let cstr = |p: *const c_char| {
            if p.is_null() {
                None
            } else {
                Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            }
        };
        let text = cstr(unsafe { (self.get_error_string)(code) })
            .unwrap_or_else(|| "unknown error".into());
        match self.get_error_name.and_then(|f| cstr(unsafe { f(code) })) {
            Some(name) => format!("{name}: {text} ({code})"),
            None => format!("{text} ({code})"),
        }
    }
}

/// The file names tried, in order, when the process has no HIP runtime
/// loaded yet: the soname-less name and the versioned sonames through the
/// dynamic loader's search path, then `$ROCM_PATH/lib/libamdhip64.so`, then
/// `/opt/rocm/lib/libamdhip64.so`.
pub(crate) fn library_candidates() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(root) = std::env::var_os("ROCM_PATH").filter(|r| !r.is_empty()) {
        v.push(PathBuf::from(root).join("lib").join("libamdhip64.so"));
    }
    v.push(PathBuf::from("/opt/rocm/lib/libamdhip64.so"));
    v
}

/// Whether `path` names a HIP runtime library (`libamdhip64.so`,
/// `libamdhip64.so.6`, `libamdhip64.so.6.4.43484`, ...) by its file name.
pub(crate) fn is_hip_runtime_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_prefix("libamdhip64.so").is_some_and(|rest| {
        rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|v| !v.is_empty() && v.split('.').all(|p| p.parse::<u32>().is_ok()))
    })
}

static LOADED: Mutex<Option<Arc<Api>>> = Mutex::new(None);

/// Loads the HIP runtime (once per process; a failure is retried on the next
/// call, so setting `ROCM_PATH` later can help). A `libamdhip64` that the
/// process already holds (a ROCm torch wheel loads its own from `torch/lib`)
/// is used rather than a second copy from the search path: two runtimes in
/// one process do not share streams, devices or memory. The error names
/// every path tried and why each failed; [`Api::path`] is the file used.
pub(crate) fn load() -> Result<Arc<Api>, String> {
    let mut g = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(api) = g.as_ref() {
        return Ok(api.clone());
    }
    let mut tried = Vec::new();
    let objects = loaded::objects();
    if let Some(path) = loaded::first(&objects, is_hip_runtime_file) {
        match loaded::reopen(path) {
            Ok(lib) => {
                let shown = format!("{} (already loaded)", loaded::real_file(path));
                // SAFETY: the declared signatures are those of hip_runtime_api.h.
                let api = Arc::new(unsafe { Api::resolve(lib, shown) }?);
                *g = Some(api.clone());
                return Ok(api);
            }
            Err(e) => tried.push(format!("{path}, already loaded ({e})")),
        }
    }
    for path in library_candidates() {
        // SAFETY: loading runs the library's initializers; libamdhip64's are
        // those of the HIP runtime, which is what we want.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => {
                let mut shown = path.display().to_string();
                // The file the loader picked for a bare name.
                if let Ok(sym) = unsafe { lib.get::<*const c_void>(b"hipInit\0") } {
                    if let Some(file) = loaded::file_of(*sym).map(|f| loaded::real_file(&f)) {
                        if file != shown {
                            shown = format!("{file} (as {shown})");
                        }
                    }
                }
                // SAFETY: the declared signatures are those of hip_runtime_api.h.
                let api = Arc::new(unsafe { Api::resolve(lib, shown) }?);
                *g = Some(api.clone());
                return Ok(api);
            }
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "the HIP runtime library libamdhip64.so was not found; tried {}. Install ROCm (6.x or 7.x) or set \
         ROCM_PATH to its root, or add its lib directory to LD_LIBRARY_PATH",
        tried.join("; ")
    ))
}

/// Offset of `gcnArchName` in `hipDeviceProp_tR0600` (ROCm 6 and 7), as
/// laid out by `hip_runtime_api.h`; LLVM's `offload-arch` tool reads the
/// field at this offset too.
pub(crate) const GCN_ARCH_NAME_OFFSET_R0600: usize = 1160;
/// Offset of `gcnArchName` in the legacy `hipDeviceProp_tR0000` (ROCm 5).
pub(crate) const GCN_ARCH_NAME_OFFSET_R0000: usize = 396;
/// Bytes reserved for the properties struct: well above either layout's
/// size (about 1.5 KiB), so a later, longer layout cannot overrun it.
pub(crate) const DEVICE_PROP_BYTES: usize = 8192;

/// The NUL-terminated string at `off` in `buf`.
pub(crate) fn c_string_at(buf: &[u8], off: usize) -> Option<&str> {
    let tail = buf.get(off..)?;
    let end = tail.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&tail[..end]).ok()
}

/// Finds `gcnArchName` in a `hipDeviceProp_t` returned by the runtime:
/// first at the documented offset of the layout that was asked for, then,
/// if that does not hold an AMDGPU architecture name, by scanning the struct
/// for a NUL-terminated string that parses as one (skipping `name`, the
/// first 256 bytes, which holds the marketing name). The scan makes a
/// layout change between ROCm releases degrade to a search instead of to a
/// wrong answer; the parse check keeps it from accepting anything but a
/// well-formed `gfx...` string.
pub(crate) fn find_arch_name(props: &[u8], documented_offset: usize) -> Option<String> {
    let parses = |s: &str| crate::detect::AmdArch::parse(s).is_ok();
    if let Some(s) = c_string_at(props, documented_offset).filter(|s| parses(s)) {
        return Some(s.to_string());
    }
    let mut i = 256;
    while i + 3 <= props.len() {
        if &props[i..i + 3] == b"gfx" && (props[i - 1] == 0) {
            if let Some(s) = c_string_at(props, i).filter(|s| parses(s)) {
                return Some(s.to_string());
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_name_at_documented_offset_or_by_scan() {
        let mut p = vec![0u8; DEVICE_PROP_BYTES];
        p[..19].copy_from_slice(b"AMD Instinct MI300X");
        let arch = b"gfx942:sramecc+:xnack-";
        p[GCN_ARCH_NAME_OFFSET_R0600..GCN_ARCH_NAME_OFFSET_R0600 + arch.len()]
            .copy_from_slice(arch);
        assert_eq!(
            find_arch_name(&p, GCN_ARCH_NAME_OFFSET_R0600).as_deref(),
            Some("gfx942:sramecc+:xnack-")
        );
        // Wrong offset (a layout change): found by the scan.
        assert_eq!(
            find_arch_name(&p, GCN_ARCH_NAME_OFFSET_R0000).as_deref(),
            Some("gfx942:sramecc+:xnack-")
        );
        // Not there at all; a gfx-looking marketing name is not taken.
        let mut q = vec![0u8; DEVICE_PROP_BYTES];
        q[..6].copy_from_slice(b"gfx950");
        q[600..609].copy_from_slice(b"gfxjunk!!");
        assert_eq!(find_arch_name(&q, GCN_ARCH_NAME_OFFSET_R0600), None);
    }

    #[test]
    fn hip_runtime_file_names() {
        for yes in [
            "libamdhip64.so",
            "libamdhip64.so.6",
            "/opt/rocm-6.4.3/lib/libamdhip64.so.6.4.43484",
            "/venv/lib/python3.12/site-packages/torch/lib/libamdhip64.so",
        ] {
            assert!(is_hip_runtime_file(yes), "{yes}");
        }
        for no in [
            "libamdhip64.so.bak",
            "libamdhip64.so.",
            "/x/libamdhip64-6.so",
            "/x/libamdhip64.so.6/libc.so.6",
            "libhiprtc.so.6",
            "/opt/rocm/lib/libamdhip64_static.a",
        ] {
            assert!(!is_hip_runtime_file(no), "{no}");
        }
        let objects = vec![
            "/lib/x86_64-linux-gnu/libc.so.6".to_string(),
            "/venv/torch/lib/libamdhip64.so".to_string(),
            "/opt/rocm/lib/libamdhip64.so.6".to_string(),
        ];
        assert_eq!(
            loaded::first(&objects, is_hip_runtime_file),
            Some("/venv/torch/lib/libamdhip64.so")
        );
        assert_eq!(loaded::first(&objects[..1], is_hip_runtime_file), None);
    }

    #[test]
    fn candidates_start_with_the_soname() {
        let c = library_candidates();
        assert_eq!(c[0], PathBuf::from("libamdhip64.so"));
        assert_eq!(
            c.last().unwrap(),
            &PathBuf::from("/opt/rocm/lib/libamdhip64.so")
        );
    }
}
