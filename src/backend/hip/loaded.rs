//! The shared objects loaded in this process: listed with `dl_iterate_phdr`,
//! reopened without loading anything (`RTLD_NOLOAD`), and the file a symbol
//! lives in (`dladdr`). The HIP backend uses them to find a HIP runtime the
//! process already holds and to name the file it uses.

use std::ffi::{c_char, c_int, c_void, CStr};

/// The first of `paths` (the process's loaded objects, in load order) that
/// `wanted` accepts.
pub(crate) fn first(paths: &[String], wanted: impl Fn(&str) -> bool) -> Option<&str> {
    paths.iter().map(String::as_str).find(|p| wanted(p))
}

/// `struct dl_phdr_info`, the fields read (the rest follow them).
#[repr(C)]
struct DlPhdrInfo {
    addr: usize,
    name: *const c_char,
}

/// `Dl_info` of `dladdr`.
#[repr(C)]
struct DlInfo {
    fname: *const c_char,
    fbase: *mut c_void,
    sname: *const c_char,
    saddr: *mut c_void,
}

extern "C" {
    fn dl_iterate_phdr(
        callback: unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int,
        data: *mut c_void,
    ) -> c_int;
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// `RTLD_NOLOAD`: `dlopen` returns a handle only to an object already loaded.
const RTLD_NOLOAD: c_int = 4;

/// The paths of the shared objects loaded in this process, in load order
/// (the main program, whose name is empty, left out).
pub(crate) fn objects() -> Vec<String> {
    unsafe extern "C" fn collect(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid info; data is the Vec below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<String>)) };
        if !info.name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string.
            let name = unsafe { CStr::from_ptr(info.name) }.to_string_lossy();
            if !name.is_empty() {
                out.push(name.into_owned());
            }
        }
        0
    }
    let mut out: Vec<String> = Vec::new();
    // SAFETY: the callback only reads the info and appends to `out`.
    unsafe { dl_iterate_phdr(collect, &mut out as *mut Vec<String> as *mut c_void) };
    out
}

/// Opens `path` only if it is already loaded (a new reference to the same
/// copy, its initializers not run again).
pub(crate) fn reopen(path: &str) -> Result<libloading::Library, String> {
    let flags = libloading::os::unix::RTLD_NOW | RTLD_NOLOAD;
    // SAFETY: RTLD_NOLOAD loads nothing new, so no initializer runs.
    unsafe { libloading::os::unix::Library::open(Some(path), flags) }
        .map(libloading::Library::from)
        .map_err(|e| e.to_string())
}

/// The file a loaded symbol lives in, as the loader names it.
pub(crate) fn file_of(symbol: *const c_void) -> Option<String> {
    let mut info = DlInfo {
        fname: std::ptr::null(),
        fbase: std::ptr::null_mut(),
        sname: std::ptr::null(),
        saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables; fname is NUL-terminated.
    (unsafe { dladdr(symbol, &mut info) } != 0 && !info.fname.is_null())
        .then(|| {
            unsafe { CStr::from_ptr(info.fname) }
                .to_string_lossy()
                .into_owned()
        })
        .filter(|f| !f.is_empty())
}

/// `path` with its symbolic links resolved (the versioned file a
/// `libamdhip64.so` link points to says which release it is).
pub(crate) fn real_file(path: &str) -> String {
    std::fs::canonicalize(path).map_or_else(|_| path.to_string(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_objects_are_found_and_reopened_not_loaded() {
        // Every Rust test process has libc loaded: the lookup finds it by
        // file name and reopens that copy with RTLD_NOLOAD.
        let loaded = objects();
        let libc = first(&loaded, |p| {
            p.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("libc.so"))
        })
        .unwrap_or_else(|| panic!("no libc among the loaded objects {loaded:?}"));
        let lib = reopen(libc).expect("reopening the loaded libc");
        // SAFETY: only the address is taken.
        let sym = unsafe { lib.get::<*const c_void>(b"malloc\0") }.expect("malloc");
        let file = file_of(*sym).expect("dladdr names malloc's file");
        assert!(file.contains("libc.so"), "{file}");
        // RTLD_NOLOAD never loads: a library not in the process is an error.
        assert!(
            first(&loaded, |p| p.contains("libz3.so")).is_none(),
            "the test process should not have libz3 loaded"
        );
        assert!(reopen("libz3.so.4").is_err());
    }
}
