//! What the runtime says about its devices: their count, names,
//! architectures (read from `hipDeviceProp_t`, whose layout changed between
//! ROCm releases) and memory, and the `info` lines.

use super::ffi::{self, Api, HipError, HIP_ERROR_NO_DEVICE, HIP_SUCCESS};
use super::{runtime, setup, unavailable};
use crate::detect::{sanitize_for, AmdArch, SanitizePolicy};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

/// Loads the runtime and runs `hipInit`, with the no-device case spelled out.
pub(super) fn init_runtime() -> Result<Arc<Api>> {
    let api = runtime::load().map_err(unavailable)?;
    // SAFETY: plain C call.
    let code = unsafe { (api.init)(0) };
    if code == HIP_ERROR_NO_DEVICE {
        return Err(unavailable(format!(
            "the HIP runtime {} found no AMD GPU (hipInit: {}); check that the amdgpu driver is loaded, /dev/kfd \
             is accessible and HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES do not hide the devices",
            api.path,
            api.error_message(code)
        )));
    }
    setup(&api, "hipInit", code, "")?;
    Ok(api)
}

pub(super) fn device_count(api: &Api) -> Result<usize> {
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    let code = unsafe { (api.get_device_count)(&mut n) };
    if code == HIP_ERROR_NO_DEVICE {
        return Ok(0);
    }
    setup(api, "hipGetDeviceCount", code, "")?;
    Ok(n.max(0) as usize)
}

pub(super) fn device_name(api: &Api, device: c_int) -> Result<String> {
    let mut dev: c_int = 0;
    // SAFETY: valid out-pointer.
    setup(
        api,
        "hipDeviceGet",
        unsafe { (api.device_get)(&mut dev, device) },
        "",
    )?;
    let mut buf = [0 as c_char; 256];
    // SAFETY: buf holds 256 chars; the runtime writes a NUL-terminated name.
    setup(
        api,
        "hipDeviceGetName",
        unsafe { (api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, dev) },
        "",
    )?;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// The device's `gcnArchName` (see the module docs for how it is read).
pub(super) fn device_arch(api: &Api, device: c_int) -> Result<AmdArch> {
    let (f, call, offset) = match (api.get_device_properties_r0600, api.get_device_properties) {
        (Some(f), _) => (
            f,
            "hipGetDevicePropertiesR0600",
            ffi::GCN_ARCH_NAME_OFFSET_R0600,
        ),
        (None, Some(f)) => (f, "hipGetDeviceProperties", ffi::GCN_ARCH_NAME_OFFSET_R0000),
        (None, None) => {
            return Err(unavailable(format!(
            "the HIP runtime {} has neither hipGetDevicePropertiesR0600 nor hipGetDeviceProperties",
            api.path
        )))
        }
    };
    // u64 elements: 8-byte alignment, as the C struct has.
    let mut props = vec![0u64; ffi::DEVICE_PROP_BYTES / 8];
    // SAFETY: the buffer is larger than any hipDeviceProp_t layout.
    setup(
        api,
        call,
        unsafe { f(props.as_mut_ptr() as *mut c_void, device) },
        &format!("for device {device}"),
    )?;
    let bytes: Vec<u8> = props.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let name = find_arch_name(&bytes, offset).ok_or_else(|| {
        unavailable(format!(
            "{call} for device {device} returned no gcnArchName (looked at offset {offset}, then for any gfx... \
             string; HIP runtime {})",
            api.path
        ))
    })?;
    AmdArch::parse(&name).map_err(|e| unavailable(format!("device {device}: {e}")))
}

pub(super) fn total_mem(api: &Api, device: c_int) -> Option<usize> {
    let f = api.device_total_mem?;
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer.
    (unsafe { f(&mut bytes, device) } == HIP_SUCCESS).then_some(bytes)
}

fn version(f: Option<unsafe extern "C" fn(*mut c_int) -> HipError>) -> Option<String> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer.
    (unsafe { f?(&mut v) } == HIP_SUCCESS).then(|| {
        // HIP_VERSION = major * 10^7 + minor * 10^5 + patch.
        format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
    })
}

/// What HIP runtime and devices this process can use, one line each, or why
/// none (an [`Error::Unavailable`]), for `dsv4-kvcache info`.
pub fn probe() -> std::result::Result<String, Error> {
    let api = init_runtime()?;
    let count = device_count(&api)?;
    let runtime = version(api.runtime_get_version).unwrap_or_else(|| "?".into());
    let driver = version(api.driver_get_version).unwrap_or_else(|| "?".into());
    if count == 0 {
        return Err(unavailable(format!(
            "the HIP runtime {runtime} ({}) sees no AMD GPU",
            api.path
        )));
    }
    let policy = SanitizePolicy::from_env();
    let mut out = format!(
        "HIP runtime {runtime} (driver {driver}) from {}, {count} device(s); embedded code objects: {}",
        api.path,
        if crate::kernels::hip_targets().is_empty() {
            "none".to_string()
        } else {
            crate::kernels::hip_targets().join(", ")
        }
    );
    for d in 0..count {
        let ordinal = d as c_int;
        let name =
            device_name(&api, ordinal).unwrap_or_else(|e| format!("(name unavailable: {e})"));
        let mem = total_mem(&api, ordinal).map_or(String::new(), |b| format!(", {} GiB", b >> 30));
        let line = match device_arch(&api, ordinal) {
            Err(e) => format!("hip:{d} {name}{mem}: {e}"),
            Ok(arch) => {
                let target = match arch.code_object_target() {
                    Ok(t) => format!("code object {t}"),
                    Err(Error::Unavailable { reason, .. }) => format!("NOT USABLE: {reason}"),
                    Err(e) => format!("NOT USABLE: {e}"),
                };
                let sanitize = match &policy {
                    Ok(p) => format!(
                        "sanitize {} (policy {p})",
                        if sanitize_for(&arch, *p) { "on" } else { "off" }
                    ),
                    Err(e) => format!("sanitize policy invalid: {e}"),
                };
                format!("hip:{d} {name}, {arch}{mem}, {target}, {sanitize}")
            }
        };
        out.push_str("\n  ");
        out.push_str(&line);
    }
    Ok(out)
}

/// The NUL-terminated string at `off` in `buf`.
fn c_string_at(buf: &[u8], off: usize) -> Option<&str> {
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
fn find_arch_name(props: &[u8], documented_offset: usize) -> Option<String> {
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
    fn versions_decode() {
        unsafe extern "C" fn v(out: *mut c_int) -> HipError {
            *out = 60_443_483;
            HIP_SUCCESS
        }
        assert_eq!(version(Some(v)).as_deref(), Some("6.4.43483"));
        assert_eq!(version(None), None);
    }

    #[test]
    fn arch_name_at_documented_offset_or_by_scan() {
        use ffi::{DEVICE_PROP_BYTES, GCN_ARCH_NAME_OFFSET_R0000, GCN_ARCH_NAME_OFFSET_R0600};
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
}
