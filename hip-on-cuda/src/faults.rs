//! The device this library pretends to be and the faults it injects.
//!
//! `HIPCUDA_DEVICE` (or `hipcudaConfigure("device=...")`) picks a
//! [`props::PROFILES`] entry by key. `HIPCUDA_FAULT` (or
//! `hipcudaConfigure("fault=...")`) arms faults, comma-separated, each
//! `KIND` or `KIND@N`: the Nth matching call from now (default the first)
//! fails once, then the fault is disarmed. Kinds:
//!
//! | kind             | call that fails            | code returned                      |
//! |------------------|----------------------------|------------------------------------|
//! | `alloc`          | `hipMalloc`                | `hipErrorOutOfMemory`              |
//! | `module-load`    | `hipModuleLoadData`        | `hipErrorInvalidImage`             |
//! | `missing-kernel` | `hipModuleGetFunction`     | `hipErrorNotFound`                 |
//! | `launch`         | `hipModuleLaunchKernel`    | `hipErrorLaunchFailure`            |
//! | `capture`        | `hipStreamEndCapture`      | `hipErrorStreamCaptureInvalidated` |
//! | `sync`           | `hipStreamSynchronize`     | `hipErrorLaunchFailure` (after the wait) |
//! | `arch`           | `hipGetDeviceProperties*`  | success, `gcnArchName` = `unknown` |
//!
//! `fault=none` disarms everything.

use crate::props::{Profile, PROFILES};
use std::sync::Mutex;

/// A fault kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `hipMalloc` fails.
    Alloc,
    /// `hipModuleLoadData` fails.
    ModuleLoad,
    /// `hipModuleGetFunction` fails.
    MissingKernel,
    /// `hipModuleLaunchKernel` fails.
    Launch,
    /// `hipStreamEndCapture` fails.
    Capture,
    /// `hipStreamSynchronize` waits, then reports a failed kernel.
    Sync,
    /// The device reports an architecture name that is no AMDGPU processor.
    Arch,
}

impl Fault {
    fn parse(s: &str) -> Result<Fault, String> {
        Ok(match s {
            "alloc" => Fault::Alloc,
            "module-load" => Fault::ModuleLoad,
            "missing-kernel" => Fault::MissingKernel,
            "launch" => Fault::Launch,
            "capture" => Fault::Capture,
            "sync" => Fault::Sync,
            "arch" => Fault::Arch,
            _ => {
                return Err(format!(
                "unknown fault {s:?} (alloc, module-load, missing-kernel, launch, capture, sync, arch)"
            ))
            }
        })
    }
}

struct Config {
    profile: usize,
    /// Armed faults and how many matching calls remain until each fires.
    armed: Vec<(Fault, u64)>,
}

static CONFIG: Mutex<Config> = Mutex::new(Config {
    profile: 0,
    armed: Vec::new(),
});

fn config() -> std::sync::MutexGuard<'static, Config> {
    CONFIG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Applies `HIPCUDA_DEVICE` and `HIPCUDA_FAULT`, once, before the first
/// configuration or device query, so that `hipcudaConfigure` overrides them.
/// A bad value is reported and ends the process: a test that asked for a
/// device or a fault must not run on another silently.
pub fn init_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(apply_env);
}

fn apply_env() {
    for (var, key) in [("HIPCUDA_DEVICE", "device"), ("HIPCUDA_FAULT", "fault")] {
        if let Ok(v) = std::env::var(var) {
            if let Err(e) = apply(&format!("{key}={v}")) {
                eprintln!("hip-on-cuda: {var}={v}: {e}");
                std::process::exit(2);
            }
        }
    }
}

/// See `hipcudaConfigure`.
pub fn configure(spec: &str) -> Result<(), String> {
    init_from_env();
    apply(spec)
}

fn apply(spec: &str) -> Result<(), String> {
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not key=value"))?;
        match key.trim() {
            "device" => {
                let v = value.trim().to_ascii_lowercase();
                let i = PROFILES.iter().position(|p| p.key == v).ok_or_else(|| {
                    let keys: Vec<_> = PROFILES.iter().map(|p| p.key).collect();
                    format!("unknown device {v:?}; known: {}", keys.join(", "))
                })?;
                config().profile = i;
            }
            "fault" => {
                let mut armed = Vec::new();
                for f in value.split(',').map(str::trim).filter(|f| !f.is_empty()) {
                    if f == "none" {
                        continue;
                    }
                    let (kind, n) = match f.split_once('@') {
                        Some((k, n)) => (
                            k,
                            n.parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(|| {
                                format!("{f:?}: the count after @ must be 1 or more")
                            })?,
                        ),
                        None => (f, 1),
                    };
                    armed.push((Fault::parse(kind)?, n));
                }
                config().armed = armed;
            }
            other => return Err(format!("unknown key {other:?} (device, fault)")),
        }
    }
    Ok(())
}

/// The profile in use.
pub fn profile() -> Profile {
    PROFILES[config().profile]
}

/// Whether this call of kind `f` is the one to fail (disarming it if so).
pub fn hit(f: Fault) -> bool {
    let mut c = config();
    let Some(i) = c.armed.iter().position(|(k, _)| *k == f) else {
        return false;
    };
    if c.armed[i].1 > 1 {
        c.armed[i].1 -= 1;
        false
    } else {
        c.armed.remove(i);
        true
    }
}

/// The `gcnArchName` to report: the profile's, or `unknown` when the `arch`
/// fault fires.
pub fn arch_name() -> String {
    if hit(Fault::Arch) {
        crate::injected_note(Fault::Arch);
        "unknown".to_string()
    } else {
        profile().arch.to_string()
    }
}
