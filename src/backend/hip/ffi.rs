//! Minimal HIP runtime bindings, resolved at run time from `libamdhip64`.
//!
//! Only the C entry points the backend calls are declared, each with the
//! signature documented in `hip_runtime_api.h`. Handles (streams, modules,
//! functions, events, graphs) are opaque pointers; `hipError_t` is a C enum,
//! an `int` on every ABI HIP supports; `hipDevice_t` is an `int`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

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
            pub(crate) unsafe fn resolve(lib: libloading::Library, path: String) -> Result<Api, String> {
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

/// Offset of `gcnArchName` in `hipDeviceProp_tR0600` (ROCm 6 and 7), as
/// laid out by `hip_runtime_api.h`; LLVM's `offload-arch` tool reads the
/// field at this offset too.
pub(crate) const GCN_ARCH_NAME_OFFSET_R0600: usize = 1160;
/// Offset of `gcnArchName` in the legacy `hipDeviceProp_tR0000` (ROCm 5).
pub(crate) const GCN_ARCH_NAME_OFFSET_R0000: usize = 396;
/// Bytes reserved for the properties struct: well above either layout's
/// size (about 1.5 KiB), so a later, longer layout cannot overrun it.
pub(crate) const DEVICE_PROP_BYTES: usize = 8192;
