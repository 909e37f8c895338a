//! Finding the HIP runtime: a `libamdhip64` the process already holds,
//! else the first of the candidate names that loads, resolved once per
//! process into the symbol table of `ffi`.

use super::ffi::Api;
use super::loaded;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

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

#[cfg(test)]
mod tests {
    use super::*;

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
