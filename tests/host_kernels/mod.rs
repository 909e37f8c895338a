//! The Rust side of the host-run kernels' launch protocol
//! (`tests/host_kernels/harness.h`): building a harness from the kernel
//! source with the host's C++ compiler, and running one launch through it.

use dsv4_kvcache::kernel_abi::{Geometry, KernelParams};
use dsv4_kvcache::SkipCounts;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Says loudly that a test could not run, and why.
pub fn skipped(msg: &str) {
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {msg} ***\n");
}

/// Builds `tests/host_kernels/<source>` into a temporary executable; `Err`
/// says why it could not (no host C++ compiler). A compiler that exists but
/// fails on the kernel source is a test failure.
///
/// `defines` are preprocessor symbols (`-D`), for example
/// `KV_HOST_BF16X2_ARITH`: sm_90's hardware vocabulary built on the host.
pub fn build(source: &str, defines: &[&str]) -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let stem = source.trim_end_matches(".cpp");
    let tag: String = defines.iter().map(|d| format!("_{d}")).collect();
    let exe = std::env::temp_dir().join(format!("dsv4_{stem}{tag}_{}", std::process::id()));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-Wno-unknown-pragmas",
            "-pthread",
        ])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-iquote")
        .arg(root.join("kernels-hip"))
        .arg("-iquote")
        .arg(root.join("tests/host_kernels"))
        .arg("-o")
        .arg(&exe)
        .arg(root.join("tests/host_kernels").join(source))
        .output()
        .map_err(|e| format!("no host C++ compiler `{cxx}`: {e}"))?;
    if !out.status.success() {
        panic!(
            "{cxx} failed on the kernel source:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(exe)
}

/// The pointer a parameter block carries for byte 0 of buffer `i`.
pub fn buffer_ptr(i: u64) -> u64 {
    (i + 1) << 48
}

/// A launch's buffers and its pointer block from one list of `field:
/// buffer` pairs: the buffers in the order listed, each field pointing at
/// its own ([`buffer_ptr`]), the skip counters at none. (The fused
/// harness shares buffers between two blocks and lists them itself.)
#[allow(unused_macros)]
macro_rules! bind {
    ($block:ident { $($field:ident: $buf:expr),* $(,)? }) => {{
        let mut bufs: Vec<&[u8]> = Vec::new();
        let block = $block {
            $($field: {
                bufs.push($buf);
                crate::host_kernels::buffer_ptr(bufs.len() as u64 - 1)
            },)*
            counters: 0,
        };
        (bufs, block)
    }};
}
#[allow(unused_imports)]
pub(crate) use bind;

/// Every buffer after a launch, and its skip counts.
pub struct Outcome {
    pub bufs: Vec<Vec<u8>>,
    pub counts: SkipCounts,
}

/// Runs `kernel` over `bufs` with `params` (pointers from [`buffer_ptr`])
/// in `geometry`; `what` names the case in a failure.
pub fn run<P: KernelParams>(
    exe: &PathBuf,
    bufs: &[&[u8]],
    params: &P,
    kernel: &str,
    geometry: &Geometry,
    what: &str,
) -> Outcome {
    let mut input = Vec::new();
    input.extend_from_slice(&(bufs.len() as u32).to_le_bytes());
    for b in bufs {
        input.extend_from_slice(&(b.len() as u64).to_le_bytes());
        input.extend_from_slice(b);
    }
    // SAFETY: the parameter blocks are #[repr(C)] plain data (integers only),
    // generated from kv_abi.h with their offsets checked at build time.
    let raw = unsafe {
        std::slice::from_raw_parts((params as *const P).cast::<u8>(), std::mem::size_of::<P>())
    };
    input.extend_from_slice(raw);
    input.extend_from_slice(&(kernel.len() as u32).to_le_bytes());
    input.extend_from_slice(kernel.as_bytes());
    for v in [geometry.grid, geometry.block_threads] {
        input.extend_from_slice(&v.to_le_bytes());
    }
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the harness runs");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let res = child.wait_with_output().unwrap();
    assert!(res.status.success(), "{what}: harness failed on {kernel}");
    let mut o = &res.stdout[..];
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        let (now, rest) = o.split_at(b.len());
        out.push(now.to_vec());
        o = rest;
    }
    let c = |i: usize| u64::from(u32::from_le_bytes(o[4 * i..4 * i + 4].try_into().unwrap()));
    Outcome {
        bufs: out,
        counts: SkipCounts {
            slot_out_of_range: c(0),
            position_out_of_range: c(1),
            index_out_of_range: c(2),
        },
    }
}
