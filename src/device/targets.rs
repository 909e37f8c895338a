//! Which embedded CUDA image runs on a device, and the NVIDIA driver each
//! image needs. Pure Rust, tested without a GPU.
//!
//! # Which image
//!
//! The fatbin holds SASS for each of [`crate::kernels::cuda_targets`] and
//! the PTX of each of [`crate::kernels::cuda_ptx`]. A device of compute
//! capability `X.Y` runs (the CUDA binary compatibility rules, which the
//! driver applies when it loads the fatbin):
//!
//! * SASS built for `sm_XZ` with `Z <= Y` (same major version; plain
//!   targets only: an `sm_90a` or `sm_100f` image runs on its own
//!   architecture alone), the highest such `Z`;
//! * else the PTX of a `compute_VW` no newer than `X.Y`, which the driver
//!   JIT-compiles on first load (cached in `~/.nv/ComputeCache`);
//! * else nothing: [`cuda_image_for`] says so before the fatbin is loaded,
//!   naming the device's architecture and the images embedded.
//!
//! # Driver floors
//!
//! From NVIDIA's CUDA Toolkit release notes (the toolkit / minimum driver
//! table, Linux x86_64) and the CUDA Compatibility guide ("Minor Version
//! Compatibility": an application built with a CUDA 12.x toolkit runs on
//! any driver >= 525, one built with 13.x on any driver >= 580; PTX is the
//! exception, the driver's JIT must be at least as new as the compiler
//! that wrote it):
//!
//! * SASS built by a 12.x toolkit: 525.60.13 (the CUDA 12.0 driver); by
//!   13.x: 580.65.06 (13.0);
//! * and no older than the first driver that supports the GPU: sm_90
//!   520.61.05 (CUDA 11.8), sm_100 and sm_120 570.26 (12.8), sm_103
//!   575.51.03 (12.9);
//! * PTX: the driver of the toolkit that wrote it (CUDA 12.9: 575.51.03).

use std::fmt;

/// The kernels a CUDA device runs: SASS for its family, or PTX the driver
/// compiles for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaImage {
    /// SASS of this target (`sm_100` on an sm_103 device, say).
    Sass(&'static str),
    /// This PTX target, JIT-compiled by the driver.
    Ptx(&'static str),
}

impl fmt::Display for CudaImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaImage::Sass(t) => write!(f, "{t} SASS"),
            CudaImage::Ptx(t) => write!(f, "{t} PTX, JIT-compiled by the driver"),
        }
    }
}

/// `(major, minor)` of `sm_90`, `sm_100a` or `compute_120`; `None` for
/// anything else. The suffix letter, if any, is returned apart.
fn parse_target<'a>(t: &'a str, prefix: &str) -> Option<(u32, u32, &'a str)> {
    let rest = t.strip_prefix(prefix)?;
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (digits, suffix) = rest.split_at(digits_end);
    // The last digit is the minor version: sm_90 = 9.0, sm_103 = 10.3.
    if digits.len() < 2 {
        return None;
    }
    let n: u32 = digits.parse().ok()?;
    Some((n / 10, n % 10, suffix))
}

/// The image a device of compute capability `cc` runs, from `sass` (e.g.
/// `["sm_90", "sm_100"]`) and `ptx` (e.g. `["compute_90"]`), by the rules
/// of the module docs; the error says why none fits, naming the device's
/// architecture and every embedded image.
pub fn cuda_image_for(
    cc: (u32, u32),
    sass: &[&'static str],
    ptx: &[&'static str],
) -> Result<CudaImage, String> {
    let (major, minor) = cc;
    let best_sass = sass
        .iter()
        .filter_map(|t| parse_target(t, "sm_").map(|p| (t, p)))
        .filter(|(_, (ma, mi, suffix))| {
            // An arch-specific image (a, f) runs on its exact architecture only.
            *ma == major && (*mi == minor || (suffix.is_empty() && *mi < minor))
        })
        .max_by_key(|(_, (_, mi, _))| *mi);
    if let Some((t, _)) = best_sass {
        return Ok(CudaImage::Sass(t));
    }
    let best_ptx = ptx
        .iter()
        .filter_map(|t| parse_target(t, "compute_").map(|p| (t, p)))
        .filter(|(_, (ma, mi, suffix))| suffix.is_empty() && (*ma, *mi) <= (major, minor))
        .max_by_key(|(_, (ma, mi, _))| (*ma, *mi));
    if let Some((t, _)) = best_ptx {
        return Ok(CudaImage::Ptx(t));
    }
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    Err(format!(
        "the device is sm_{major}{minor} (compute capability {major}.{minor}), and this build's CUDA kernels \
         are SASS for {} and PTX for {}: none of them runs on sm_{major}{minor} (SASS runs on its own major \
         version, PTX on its own architecture and newer). Rebuild for it with \
         DSV4_KVCACHE_CUDA_ARCHS=sm_{major}{minor} cargo build",
        list(sass),
        list(ptx),
    ))
}

/// The Linux driver of each CUDA toolkit release's GA (NVIDIA's CUDA
/// Toolkit release notes, the toolkit / minimum driver table).
const TOOLKIT_DRIVERS: &[(&str, &str)] = &[
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
];

/// The first toolkit that knows each architecture.
const FIRST_TOOLKIT: &[(u32, &str)] = &[(90, "11.8"), (100, "12.8"), (103, "12.9"), (120, "12.8")];

fn toolkit_driver(toolkit: &str) -> Option<&'static str> {
    TOOLKIT_DRIVERS
        .iter()
        .find(|(t, _)| *t == toolkit)
        .map(|(_, d)| *d)
}

/// A driver version as numbers, for comparing (`570.26` < `575.51.03`).
fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The oldest Linux driver that runs `target` (`sm_90` SASS or
/// `compute_90` PTX) built by CUDA `toolkit` (`12.9`), by the rules of the
/// module docs; `None` for a toolkit or target this table does not know.
pub fn cuda_min_driver(toolkit: &str, target: &str) -> Option<&'static str> {
    let major = toolkit.split('.').next()?;
    if let Some((ma, mi, _)) = parse_target(target, "compute_") {
        // The JIT must know the PTX's version, and the GPU must be supported.
        let jit = toolkit_driver(toolkit)?;
        let arch = FIRST_TOOLKIT
            .iter()
            .find(|(n, _)| *n == ma * 10 + mi)
            .and_then(|(_, t)| toolkit_driver(t));
        return Some(match arch {
            Some(a) if version_key(a) > version_key(jit) => a,
            _ => jit,
        });
    }
    let (ma, mi, _) = parse_target(target, "sm_")?;
    let family = match major {
        "12" => "525.60.13",
        "13" => "580.65.06",
        "11" => "450.80.02",
        _ => return None,
    };
    let arch = FIRST_TOOLKIT
        .iter()
        .find(|(n, _)| *n == ma * 10 + mi)
        .and_then(|(_, t)| toolkit_driver(t))?;
    Some(if version_key(arch) > version_key(family) {
        arch
    } else {
        family
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SASS: &[&str] = &["sm_90", "sm_100", "sm_103", "sm_120"];
    const PTX: &[&str] = &["compute_90"];

    #[test]
    fn each_device_gets_its_image() {
        let pick = |cc| cuda_image_for(cc, SASS, PTX);
        // H100/H200, B200, B300, RTX PRO 6000 / RTX 50: their own SASS.
        assert_eq!(pick((9, 0)), Ok(CudaImage::Sass("sm_90")));
        assert_eq!(pick((10, 0)), Ok(CudaImage::Sass("sm_100")));
        assert_eq!(pick((10, 3)), Ok(CudaImage::Sass("sm_103")));
        assert_eq!(pick((12, 0)), Ok(CudaImage::Sass("sm_120")));
        // DGX Spark (sm_121) runs sm_120's SASS; an sm_101 runs sm_100's.
        assert_eq!(pick((12, 1)), Ok(CudaImage::Sass("sm_120")));
        assert_eq!(pick((10, 1)), Ok(CudaImage::Sass("sm_100")));
        // Thor (sm_110) and any later major version: the PTX.
        assert_eq!(pick((11, 0)), Ok(CudaImage::Ptx("compute_90")));
        assert_eq!(pick((13, 0)), Ok(CudaImage::Ptx("compute_90")));
        // A build with only sm_90 SASS: Blackwell JITs the PTX.
        assert_eq!(
            cuda_image_for((10, 0), &["sm_90"], PTX),
            Ok(CudaImage::Ptx("compute_90"))
        );
        // Arch-specific SASS runs on its own architecture only.
        assert_eq!(
            cuda_image_for((9, 0), &["sm_90a"], &[]),
            Ok(CudaImage::Sass("sm_90a"))
        );
        assert!(cuda_image_for((10, 3), &["sm_100a"], &[]).is_err());
    }

    #[test]
    fn older_devices_get_one_clear_error() {
        for (cc, arch) in [((8, 0), "sm_80"), ((8, 9), "sm_89"), ((7, 5), "sm_75")] {
            let why = cuda_image_for(cc, SASS, PTX).unwrap_err();
            assert!(why.contains(&format!("the device is {arch}")), "{why}");
            assert!(
                why.contains("SASS for sm_90, sm_100, sm_103, sm_120 and PTX for compute_90"),
                "{why}"
            );
            assert!(
                why.contains(&format!("DSV4_KVCACHE_CUDA_ARCHS={arch}")),
                "{why}"
            );
        }
        // Without PTX, a newer major version has nothing either.
        let why = cuda_image_for((11, 0), SASS, &[]).unwrap_err();
        assert!(why.contains("PTX for none"), "{why}");
    }

    #[test]
    fn driver_floors() {
        // CUDA 12.9: SASS on every driver of the CUDA 12 era the GPU runs on.
        assert_eq!(cuda_min_driver("12.9", "sm_90"), Some("525.60.13"));
        assert_eq!(cuda_min_driver("12.9", "sm_100"), Some("570.26"));
        assert_eq!(cuda_min_driver("12.9", "sm_103"), Some("575.51.03"));
        assert_eq!(cuda_min_driver("12.9", "sm_120"), Some("570.26"));
        // Its PTX needs its own driver's JIT.
        assert_eq!(cuda_min_driver("12.9", "compute_90"), Some("575.51.03"));
        // CUDA 13.0: 580 for everything.
        for t in ["sm_90", "sm_100", "sm_103", "sm_120", "compute_90"] {
            assert_eq!(cuda_min_driver("13.0", t), Some("580.65.06"), "{t}");
        }
        // An older toolkit's PTX of a newer architecture: the GPU's floor.
        assert_eq!(cuda_min_driver("12.6", "compute_100"), Some("570.26"));
        assert_eq!(cuda_min_driver("12.7", "compute_90"), None);
        assert_eq!(cuda_min_driver("12.9", "sm_75"), None);
        assert!(version_key("570.26") < version_key("575.51.03"));
        assert!(version_key("525.60.13") > version_key("520.61.05"));
    }
}
