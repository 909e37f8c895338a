//! Device detection and the NaN-sanitizing policy. Pure Rust: nothing here
//! needs a GPU, so it is tested with recorded device property strings.
//!
//! # AMD architectures
//!
//! A HIP device reports its ISA as `hipDeviceProp_t::gcnArchName`: the
//! processor, then the target features it runs with, e.g.
//! `gfx942:sramecc+:xnack-`. [`AmdArch::parse`] splits that string, and
//! [`AmdArch::code_object_target`] picks the embedded code object for it.
//! The kernels are never run on a different ISA than the one they were built
//! for: an architecture without a code object in this build is an error that
//! says how to rebuild (`DSV4_KVCACHE_HIP_ARCHS=gfxNNN cargo build`).
//!
//! | Product (marketing name)             | `gcnArchName` processor |
//! | ------------------------------------ | ----------------------- |
//! | Instinct MI300X, MI300A, MI308X      | `gfx942`                |
//! | Instinct MI325X                      | `gfx942`                |
//! | Instinct MI350X, MI355X              | `gfx950`                |
//! | Instinct MI250X, MI250, MI210        | `gfx90a`                |
//! | Instinct MI100                       | `gfx908` (no code object by default) |
//! | Radeon RX 7900 XTX, Radeon PRO W7900 | `gfx1100` (no code object by default) |
//!
//! The defaults of `build.rs` are `gfx90a,gfx942,gfx950`.
//!
//! # Sanitizing
//!
//! NaN sanitizing (`semantics.md`: NaN in the rotated vector becomes 0 before
//! quantization, and the UE8M0 scale byte is capped at 254) is chosen by a
//! [`SanitizePolicy`]: from the API, else from the environment variable
//! `DSV4_KVCACHE_SANITIZE=auto|on|off`, else `auto`. Under `auto` it is on
//! exactly for gfx950 (MI350 series) and off for every other AMD processor
//! and for CUDA devices; `on` and `off` force it everywhere.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Name of the environment variable that sets the [`SanitizePolicy`].
pub const SANITIZE_ENV: &str = "DSV4_KVCACHE_SANITIZE";

/// Name of the environment variable that selects the AMDGPU targets
/// `build.rs` compiles code objects for.
pub const HIP_ARCHS_ENV: &str = "DSV4_KVCACHE_HIP_ARCHS";

/// The processor whose code gets NaN sanitizing under [`SanitizePolicy::Auto`].
pub const AUTO_SANITIZE_ARCH: &str = "gfx950";

/// Whether device backends sanitize NaNs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SanitizePolicy {
    /// On for gfx950, off elsewhere (the default).
    #[default]
    Auto,
    /// Always on.
    On,
    /// Always off.
    Off,
}

impl SanitizePolicy {
    /// Parses `auto`, `on` or `off` (ASCII case and surrounding whitespace
    /// ignored). Anything else is an [`Error::Value`] for
    /// `DSV4_KVCACHE_SANITIZE`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(SanitizePolicy::Auto),
            "on" => Ok(SanitizePolicy::On),
            "off" => Ok(SanitizePolicy::Off),
            _ => Err(Error::Value {
                arg: SANITIZE_ENV,
                problem: format!("unknown value {s:?}, expected auto, on or off"),
            }),
        }
    }

    /// The policy a value of `DSV4_KVCACHE_SANITIZE` selects: unset or empty
    /// is [`SanitizePolicy::Auto`].
    pub fn from_env_value(value: Option<&str>) -> Result<Self> {
        match value {
            None => Ok(SanitizePolicy::Auto),
            Some(v) if v.trim().is_empty() => Ok(SanitizePolicy::Auto),
            Some(v) => Self::parse(v),
        }
    }

    /// The policy of the environment (`DSV4_KVCACHE_SANITIZE`; unset is
    /// `auto`). A value that is not valid Unicode is an error too.
    pub fn from_env() -> Result<Self> {
        match std::env::var(SANITIZE_ENV) {
            Ok(v) => Self::from_env_value(Some(&v)),
            Err(std::env::VarError::NotPresent) => Ok(SanitizePolicy::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::Value {
                arg: SANITIZE_ENV,
                problem: format!("value {v:?} is not valid Unicode, expected auto, on or off"),
            }),
        }
    }

    /// The effective policy: `api` when the caller chose one (the
    /// environment is then not read), else [`SanitizePolicy::from_env`].
    pub fn resolve(api: Option<SanitizePolicy>) -> Result<Self> {
        match api {
            Some(p) => Ok(p),
            None => Self::from_env(),
        }
    }

    /// `auto`, `on` or `off`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SanitizePolicy::Auto => "auto",
            SanitizePolicy::On => "on",
            SanitizePolicy::Off => "off",
        }
    }
}

impl fmt::Display for SanitizePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SanitizePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// Whether an AMD device of `arch` sanitizes under `policy`: `Auto` is on
/// exactly for gfx950.
pub fn sanitize_for(arch: &AmdArch, policy: SanitizePolicy) -> bool {
    match policy {
        SanitizePolicy::Auto => arch.name == AUTO_SANITIZE_ARCH,
        SanitizePolicy::On => true,
        SanitizePolicy::Off => false,
    }
}

/// Whether a CUDA device sanitizes under `policy`: `Auto` is off.
pub fn sanitize_for_cuda(policy: SanitizePolicy) -> bool {
    matches!(policy, SanitizePolicy::On)
}

/// An AMD GPU's ISA, as `gcnArchName` reports it: `gfx950:sramecc+:xnack-`
/// is processor `gfx950` with features `sramecc+` and `xnack-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AmdArch {
    /// The processor, e.g. `gfx942`.
    pub name: String,
    /// The target features in the order reported, e.g. `["sramecc+", "xnack-"]`.
    pub features: Vec<String>,
}

fn is_processor(name: &str) -> bool {
    // `gfx` then lowercase hex digits / letters and, for generic targets such
    // as `gfx9-4-generic`, dashes; at least one character after `gfx`, and
    // the first of them a digit.
    name.strip_prefix("gfx").is_some_and(|rest| {
        rest.chars().next().is_some_and(|c| c.is_ascii_digit())
            && rest
                .chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase() || c == '-')
    })
}

fn is_feature(f: &str) -> bool {
    let Some(body) = f.strip_suffix(['+', '-']) else {
        return false;
    };
    !body.is_empty()
        && body
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl AmdArch {
    /// Parses a `gcnArchName` string (surrounding whitespace and trailing NUL
    /// bytes, as read from a C buffer, are ignored). An empty string or one
    /// that is not `gfx<id>[:<feature>(+|-)]*` is an [`Error::Value`].
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::Value {
            arg: "gcnArchName",
            problem: format!("{s:?} is not an AMDGPU architecture name ({why}; expected e.g. gfx942:sramecc+:xnack-)"),
        }
        };
        let t = s.trim_end_matches('\0').trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        let mut parts = t.split(':');
        let name = parts.next().unwrap_or_default();
        if !is_processor(name) {
            return Err(bad("the processor must be gfx followed by its number"));
        }
        let mut features = Vec::new();
        for f in parts {
            if !is_feature(f) {
                return Err(bad("a feature must be a name followed by + or -"));
            }
            features.push(f.to_string());
        }
        Ok(AmdArch {
            name: name.to_string(),
            features,
        })
    }

    /// `Some(true)` for `feature+`, `Some(false)` for `feature-`, `None` if
    /// the device did not report the feature (e.g. `feature("xnack")`).
    pub fn feature(&self, feature: &str) -> Option<bool> {
        self.features.iter().find_map(|f| {
            let (body, sign) = f.split_at(f.len() - 1);
            (body == feature).then_some(sign == "+")
        })
    }

    /// The code object target embedded in this build for this processor
    /// (see [`crate::kernels::hip_targets`]): gfx90a, gfx942 and gfx950 map
    /// to themselves. Any other processor, or a build without HIP kernels, is
    /// an [`Error::Unavailable`] that names the processor, the embedded
    /// targets and how to rebuild; there is no fallback to another ISA.
    pub fn code_object_target(&self) -> Result<&'static str> {
        self.code_object_target_in(crate::kernels::hip_targets())
    }

    /// As [`AmdArch::code_object_target`], against a given list of embedded
    /// targets.
    pub fn code_object_target_in(&self, embedded: &[&'static str]) -> Result<&'static str> {
        if let Some(t) = embedded.iter().find(|t| **t == self.name) {
            return Ok(t);
        }
        let reason = if embedded.is_empty() {
            let why = crate::kernels::missing_reasons()
                .iter()
                .copied()
                .find(|r| r.to_ascii_lowercase().contains("hip"))
                .unwrap_or("no HIP compiler was found at build time");
            format!(
                "the device is {self} but this build of dsv4-kvcache embeds no AMDGPU code objects ({why}); \
                 install a HIP compiler and rebuild with {HIP_ARCHS_ENV}={} cargo build",
                self.name
            )
        } else {
            let list = embedded.join(",");
            format!(
                "the device is {self}, and this build embeds code objects only for {}; the kernels are never \
                 run on a different ISA. Rebuild for it with {HIP_ARCHS_ENV}={} cargo build (or \
                 {HIP_ARCHS_ENV}={list},{} to keep the others)",
                embedded.join(", "),
                self.name,
                self.name
            )
        };
        Err(Error::Unavailable {
            backend: "hip",
            reason,
        })
    }
}

impl fmt::Display for AmdArch {
    /// The full `gcnArchName` form: `gfx950:sramecc+:xnack-`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        for feat in &self.features {
            write!(f, ":{feat}")?;
        }
        Ok(())
    }
}

impl FromStr for AmdArch {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMBEDDED: &[&str] = &["gfx90a", "gfx942", "gfx950"];

    /// `gcnArchName` as recorded from real devices.
    const MI300X: &str = "gfx942:sramecc+:xnack-";
    const MI325X: &str = "gfx942:sramecc+:xnack-";
    const MI350X: &str = "gfx950:sramecc+:xnack-";
    const MI355X: &str = "gfx950:sramecc+:xnack-";
    const MI250X: &str = "gfx90a:sramecc+:xnack-";
    const MI210: &str = "gfx90a:sramecc+:xnack-";
    const MI100: &str = "gfx908:sramecc+:xnack-";
    const RX7900XTX: &str = "gfx1100";

    #[test]
    fn parses_recorded_names() {
        for (s, name) in [
            (MI300X, "gfx942"),
            (MI325X, "gfx942"),
            (MI350X, "gfx950"),
            (MI355X, "gfx950"),
            (MI250X, "gfx90a"),
        ] {
            let a = AmdArch::parse(s).unwrap();
            assert_eq!(a.name, name);
            assert_eq!(
                a.features,
                vec!["sramecc+".to_string(), "xnack-".to_string()]
            );
            assert_eq!(a.feature("sramecc"), Some(true));
            assert_eq!(a.feature("xnack"), Some(false));
            assert_eq!(a.feature("cumode"), None);
            assert_eq!(a.to_string(), s);
        }
        let a = AmdArch::parse(RX7900XTX).unwrap();
        assert_eq!(a.name, "gfx1100");
        assert!(a.features.is_empty());
        assert_eq!(a.to_string(), "gfx1100");
        // As read from a NUL-padded C buffer.
        assert_eq!(
            AmdArch::parse("gfx942:sramecc+:xnack-\0\0\0").unwrap(),
            AmdArch::parse(MI300X).unwrap()
        );
        assert_eq!(
            "gfx950:xnack+".parse::<AmdArch>().unwrap().feature("xnack"),
            Some(true)
        );
        assert_eq!(
            AmdArch::parse("gfx9-4-generic").unwrap().name,
            "gfx9-4-generic"
        );
    }

    #[test]
    fn rejects_empty_and_garbage() {
        for s in [
            "",
            "   ",
            "\0\0",
            "garbage",
            "sm_90",
            "gfx",
            "gfxabc",
            "GFX942",
            "gfx942:",
            "gfx942:sramecc",
            "gfx942::xnack-",
            ":xnack-",
            "gfx942:+",
            "AMD Instinct MI300X",
        ] {
            match AmdArch::parse(s) {
                Err(Error::Value { arg, problem }) => {
                    assert_eq!(arg, "gcnArchName");
                    assert!(problem.contains("expected e.g. gfx942"), "{problem}");
                }
                other => panic!("{s:?}: expected a Value error, got {other:?}"),
            }
        }
    }

    #[test]
    fn target_selection() {
        for (s, t) in [
            (MI250X, "gfx90a"),
            (MI210, "gfx90a"),
            (MI300X, "gfx942"),
            (MI325X, "gfx942"),
            (MI350X, "gfx950"),
            (MI355X, "gfx950"),
        ] {
            assert_eq!(
                AmdArch::parse(s)
                    .unwrap()
                    .code_object_target_in(EMBEDDED)
                    .unwrap(),
                t
            );
        }
        for s in [MI100, RX7900XTX] {
            let a = AmdArch::parse(s).unwrap();
            match a.code_object_target_in(EMBEDDED) {
                Err(Error::Unavailable { backend, reason }) => {
                    assert_eq!(backend, "hip");
                    assert!(reason.contains(&a.name), "{reason}");
                    assert!(reason.contains(s), "{reason}");
                    assert!(reason.contains("gfx90a, gfx942, gfx950"), "{reason}");
                    assert!(
                        reason.contains(&format!("DSV4_KVCACHE_HIP_ARCHS={} cargo build", a.name)),
                        "{reason}"
                    );
                }
                other => panic!("{s}: expected Unavailable, got {other:?}"),
            }
        }
        // No code objects at all: still names the arch and the fix.
        match AmdArch::parse(MI300X).unwrap().code_object_target_in(&[]) {
            Err(Error::Unavailable { reason, .. }) => {
                assert!(reason.contains("gfx942:sramecc+:xnack-"), "{reason}");
                assert!(reason.contains("DSV4_KVCACHE_HIP_ARCHS=gfx942"), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        // A build without gfx90a (DSV4_KVCACHE_HIP_ARCHS=gfx942,gfx950):
        // MI250X then gets the error, and the fix keeps the others.
        match AmdArch::parse(MI250X)
            .unwrap()
            .code_object_target_in(&["gfx942", "gfx950"])
        {
            Err(Error::Unavailable { reason, .. }) => {
                assert!(reason.contains("gfx90a:sramecc+:xnack-"), "{reason}");
                assert!(
                    reason.contains("DSV4_KVCACHE_HIP_ARCHS=gfx942,gfx950,gfx90a"),
                    "{reason}"
                );
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn target_selection_agrees_with_this_build() {
        for s in [MI300X, MI350X, MI250X, MI100, RX7900XTX] {
            let a = AmdArch::parse(s).unwrap();
            let embedded = crate::kernels::hip_targets().contains(&a.name.as_str());
            match a.code_object_target() {
                Ok(t) => {
                    assert!(embedded);
                    assert_eq!(t, a.name);
                    assert!(crate::kernels::hip_code_object(s).is_some());
                }
                Err(Error::Unavailable { .. }) => assert!(!embedded),
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn sanitize_under_each_policy() {
        let cases = [
            (MI300X, false),
            (MI325X, false),
            (MI350X, true),
            (MI355X, true),
            (MI250X, false),
            (MI210, false),
            (MI100, false),
            (RX7900XTX, false),
        ];
        for (s, auto) in cases {
            let a = AmdArch::parse(s).unwrap();
            assert_eq!(sanitize_for(&a, SanitizePolicy::Auto), auto, "{s}");
            assert!(sanitize_for(&a, SanitizePolicy::On), "{s}");
            assert!(!sanitize_for(&a, SanitizePolicy::Off), "{s}");
        }
        assert!(!sanitize_for_cuda(SanitizePolicy::Auto));
        assert!(sanitize_for_cuda(SanitizePolicy::On));
        assert!(!sanitize_for_cuda(SanitizePolicy::Off));
        assert_eq!(SanitizePolicy::default(), SanitizePolicy::Auto);
    }

    #[test]
    fn env_parsing() {
        let ok = |v: Option<&str>| SanitizePolicy::from_env_value(v).unwrap();
        assert_eq!(ok(None), SanitizePolicy::Auto);
        assert_eq!(ok(Some("")), SanitizePolicy::Auto);
        assert_eq!(ok(Some("  ")), SanitizePolicy::Auto);
        assert_eq!(ok(Some("auto")), SanitizePolicy::Auto);
        assert_eq!(ok(Some("on")), SanitizePolicy::On);
        assert_eq!(ok(Some(" ON\n")), SanitizePolicy::On);
        assert_eq!(ok(Some("off")), SanitizePolicy::Off);
        assert_eq!(ok(Some("Off")), SanitizePolicy::Off);
        for bad in ["1", "yes", "true", "onn", "gfx950"] {
            match SanitizePolicy::from_env_value(Some(bad)) {
                Err(Error::Value { arg, problem }) => {
                    assert_eq!(arg, "DSV4_KVCACHE_SANITIZE");
                    assert!(
                        problem.contains(bad) && problem.contains("auto, on or off"),
                        "{problem}"
                    );
                }
                other => panic!("{bad}: expected a Value error, got {other:?}"),
            }
        }
        for p in [
            SanitizePolicy::Auto,
            SanitizePolicy::On,
            SanitizePolicy::Off,
        ] {
            assert_eq!(p.to_string().parse::<SanitizePolicy>().unwrap(), p);
            // The API override wins without reading the environment.
            assert_eq!(SanitizePolicy::resolve(Some(p)).unwrap(), p);
        }
    }
}
