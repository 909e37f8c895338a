//! Compiles the one kernel source set twice and embeds the results:
//!
//! * CUDA: `kernels-cuda/kvcache.cu` (the CUDA prelude + `kernels-hip/kvcache.hip`)
//!   into one fatbin holding SASS for every `DSV4_KVCACHE_CUDA_ARCHS` target and the
//!   PTX of every `DSV4_KVCACHE_CUDA_PTX` target, either with nvcc or with CUDA 12.9's
//!   NVRTC and ptxas from the registry (`.toolchains/cuda12`, packed by fatbinary).
//! * HIP: `kernels-hip/kvcache.hip` (which includes every other kernel file) with
//!   hipcc or a HIP-capable clang into one AMDGPU code object (ELF, not an offload
//!   bundle) per `DSV4_KVCACHE_HIP_ARCHS` target.
//!
//! A compiler that is not found is not an error (the backend reports at run time
//! that its kernels are missing and why) unless `DSV4_KVCACHE_REQUIRE_KERNELS=1`.
//! A compiler that is found but fails is always an error. See docs/backends.md.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "build/abi.rs"]
mod abi;
#[path = "build/hip_flags.rs"]
mod hip_flags;

use hip_flags::{HIP_FLAGS, HIP_FREESTANDING};

const DEFAULT_CUDA_ARCHS: &str = "sm_90,sm_100,sm_103,sm_120";
/// The lowest SASS target's PTX: every newer GPU JIT-compiles it.
const DEFAULT_CUDA_PTX: &str = "compute_90";
const DEFAULT_HIP_ARCHS: &str = "gfx90a,gfx942,gfx950";
/// Which of the two CUDA compilers of `.toolchains` a build takes (when no
/// `NVCC`, `CUDA_PATH` or `CUDA_HOME` names one): `12.9` (NVRTC and ptxas
/// 12.9, the default: kernels for every driver of the CUDA 12 era) or `13.0`
/// (nvcc 13.0: drivers >= 580 only).
const CUDA_TOOLKIT_ENV: &str = "DSV4_KVCACHE_CUDA_TOOLKIT";
const DEFAULT_CUDA_TOOLKIT: &str = "12.9";

/// NVRTC's options: nvcc's numerics flags (NVRTC always optimizes; cicc
/// gets the same -ftz/-prec/-fmad settings either way).
const NVRTC_FLAGS: &[&str] = &[
    "-std=c++17",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];
/// ptxas's options as nvcc passes them for the flags above (`nvcc -dryrun`).
const PTXAS_FLAGS: &[&str] = &["-m64", "-v", "--fmad", "false"];

/// Numerics flags shared by every nvcc invocation (bit-exactness depends on them).
const NVCC_FLAGS: &[&str] = &[
    "-O3",
    "-std=c++17",
    "-fmad=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-ftz=false",
    "-Xptxas",
    "-v",
];

const WATCHED_ENV: &[&str] = &[
    "NVCC",
    "CUDA_PATH",
    "CUDA_HOME",
    "HIPCC",
    "ROCM_PATH",
    "HIP_CLANG",
    "PATH",
    "DSV4_KVCACHE_CUDA_ARCHS",
    "DSV4_KVCACHE_CUDA_PTX",
    "DSV4_KVCACHE_CUDA_TOOLKIT",
    "DSV4_KVCACHE_HIP_ARCHS",
    "DSV4_KVCACHE_REQUIRE_KERNELS",
];

const FIX_HINT: &str = "run scripts/install-toolchains.sh (installs nvcc and a HIP-capable clang into \
     .toolchains/), or set NVCC=/path/to/nvcc, HIPCC=/path/to/hipcc or HIP_CLANG=/path/to/clang; then rebuild";

struct Ctx {
    root: PathBuf,
    out: PathBuf,
    require: bool,
}

/// What one backend's build produced.
#[derive(Default)]
struct Embedded {
    cuda_fatbin: Option<PathBuf>,
    cuda_targets: Vec<String>,
    cuda_ptx: Vec<String>,
    cuda_toolkit: Option<String>,
    cuda_compiler: Option<String>,
    cuda_report: String,
    hip_objects: Vec<(String, PathBuf)>,
    hip_compiler: Option<String>,
    missing: Vec<String>,
}

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    for v in WATCHED_ENV {
        println!("cargo:rerun-if-env-changed={v}");
    }
    for dir in ["kernels-hip", "kernels-cuda"] {
        let d = root.join(dir);
        println!("cargo:rerun-if-changed={}", d.display());
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                println!("cargo:rerun-if-changed={}", e.path().display());
            }
        }
    }
    // Re-pinned toolchains re-run this script; a first install touches build.rs.
    let stamps = root.join(".toolchains/stamps");
    if stamps.is_dir() {
        println!("cargo:rerun-if-changed={}", stamps.display());
    }

    println!("cargo:rerun-if-changed=build/abi.rs");
    println!("cargo:rerun-if-changed=build/hip_flags.rs");

    let ctx = Ctx {
        require: env::var("DSV4_KVCACHE_REQUIRE_KERNELS").is_ok_and(|v| v.trim() == "1"),
        root,
        out,
    };
    generate_abi(&ctx);

    // Only the enabled backends' kernels are built (cargo sets CARGO_FEATURE_<NAME>).
    let want_cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let want_hip = env::var_os("CARGO_FEATURE_HIP").is_some();
    let mut emb = Embedded::default();
    // The two backends compile concurrently (the slow part of a build of this crate).
    std::thread::scope(|s| {
        let cuda = want_cuda.then(|| s.spawn(|| build_cuda(&ctx)));
        let hip = want_hip.then(|| s.spawn(|| build_hip(&ctx)));
        match cuda.map(join) {
            Some(Ok(c)) => {
                emb.cuda_fatbin = Some(c.artifact);
                emb.cuda_targets = c.targets;
                emb.cuda_ptx = c.ptx;
                emb.cuda_toolkit = Some(c.toolkit);
                emb.cuda_compiler = Some(c.compiler);
                emb.cuda_report = c.report;
            }
            Some(Err(why)) => emb.missing.push(why),
            None => {}
        }
        match hip.map(join) {
            Some(Ok(h)) => {
                emb.hip_objects = h.objects;
                emb.hip_compiler = Some(h.compiler);
            }
            Some(Err(why)) => emb.missing.push(why),
            None => {}
        }
    });

    if ctx.require && !emb.missing.is_empty() {
        fail(&format!(
            "DSV4_KVCACHE_REQUIRE_KERNELS=1 but kernels could not be built:\n  - {}",
            emb.missing.join("\n  - ")
        ));
    }
    for m in &emb.missing {
        println!("cargo:warning={m}");
    }
    // Not an error and not a warning: the build asked for no such backend.
    if !want_cuda {
        emb.missing
            .push("CUDA kernels not built: the crate's `cuda` feature is off".into());
    }
    if !want_hip {
        emb.missing
            .push("HIP kernels not built: the crate's `hip` feature is off".into());
    }
    write_generated(&ctx, &emb);
}

/// Waits for a compile thread, passing on its panic.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Generates the Rust side of the kernel ABI from `kernels-hip/kv_abi.h`
/// (`kernel_abi_gen.rs`) and the C header of layout checks that the kernel
/// compiles include (`kv_abi_layout.h`), both in OUT_DIR.
fn generate_abi(ctx: &Ctx) {
    let header = ctx.root.join("kernels-hip/kv_abi.h");
    let text =
        fs::read_to_string(&header).unwrap_or_else(|e| fail(&format!("{}: {e}", header.display())));
    let parsed = abi::parse(&text).unwrap_or_else(|e| fail(&e));
    let rust = abi::rust(&parsed).unwrap_or_else(|e| fail(&e));
    let checks = abi::c_checks(&parsed, true).unwrap_or_else(|e| fail(&e));
    write_if_changed(&ctx.out.join("kernel_abi_gen.rs"), &rust);
    write_if_changed(&ctx.out.join("kv_abi_layout.h"), &checks);
    // NVRTC has no __builtin_offsetof: sizes there (the PTX's parameter
    // blocks are checked against them too), offsets in every other build.
    let sizes = abi::c_checks(&parsed, false).unwrap_or_else(|e| fail(&e));
    let nvrtc_dir = ctx.out.join("nvrtc");
    fs::create_dir_all(&nvrtc_dir)
        .unwrap_or_else(|e| fail(&format!("{}: {e}", nvrtc_dir.display())));
    write_if_changed(&nvrtc_dir.join("kv_abi_layout.h"), &sizes);
    let mut params = String::new();
    let blocks = abi::block_sizes(&parsed).unwrap_or_else(|e| fail(&e));
    for (kernel, block) in &parsed.kernels {
        if let Some((_, size, align)) = blocks.iter().find(|(c, _, _)| c == block) {
            let _ = writeln!(params, "{kernel} {size} {align}");
        }
    }
    write_if_changed(&ctx.out.join("kernel_params.txt"), &params);
}

/// Writes `text` unless the file already holds it, so an unchanged build
/// does not recompile the crate.
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
    }
}

/// A build failure with a readable message (cargo shows build-script stderr on failure).
fn fail(msg: &str) -> ! {
    eprintln!("\nerror: dsv4-kvcache kernels: {msg}\n");
    // Exit rather than panic: the message is the whole story, a backtrace is noise.
    std::process::exit(1);
}

fn env_nonempty(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Finds `name` in the directories of PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// An explicitly named compiler (env var) must exist: a wrong path is a user error.
fn explicit(var: &str) -> Option<PathBuf> {
    let v = env_nonempty(var)?;
    let p = PathBuf::from(&v);
    // A bare name is looked up on PATH.
    let resolved = if p.components().count() == 1 {
        on_path(&v)
    } else {
        Some(p.clone())
    };
    match resolved {
        Some(r) if is_executable(&r) => Some(r),
        _ => fail(&format!("{var}={v} does not name an executable compiler")),
    }
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    cmd.output()
        .map_err(|e| format!("could not run {cmd:?}: {e}"))
}

fn arch_list(var: &str, default: &str) -> Vec<String> {
    env::var(var)
        .unwrap_or_else(|_| default.to_string())
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

// ------------------------------------------------------------------ CUDA ----

struct CudaBuild {
    artifact: PathBuf,
    targets: Vec<String>,
    ptx: Vec<String>,
    /// `major.minor` of the toolkit whose compiler produced the images.
    toolkit: String,
    compiler: String,
    report: String,
}

/// The CUDA compiler a build uses.
enum CudaCompiler {
    /// nvcc, of a CUDA toolkit or of `.toolchains/py` (13.0).
    Nvcc(PathBuf),
    /// CUDA 12.9 from the registry, which carries its compiler library and
    /// ptxas but no nvcc: NVRTC compiles each virtual target to PTX, ptxas
    /// each real one to SASS, and fatbinary packs them.
    Nvrtc {
        nvrtc: PathBuf,
        ptxas: PathBuf,
        fatbinary: PathBuf,
    },
}

fn find_cuda(ctx: &Ctx) -> Result<CudaCompiler, String> {
    if let Some(p) = explicit("NVCC") {
        return Ok(CudaCompiler::Nvcc(p));
    }
    let mut looked = vec!["$NVCC (unset)".to_string()];
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        match env_nonempty(var) {
            Some(dir) => {
                let p = Path::new(&dir).join("bin/nvcc");
                if is_executable(&p) {
                    return Ok(CudaCompiler::Nvcc(p));
                }
                looked.push(format!("${var}/bin/nvcc ({} missing)", p.display()));
            }
            None => looked.push(format!("${var} (unset)")),
        }
    }
    let toolkit =
        env_nonempty(CUDA_TOOLKIT_ENV).unwrap_or_else(|| DEFAULT_CUDA_TOOLKIT.to_string());
    let cu13 = ctx.root.join(".toolchains/py/nvidia/cu13/bin");
    match toolkit.trim() {
        "12.9" => {
            let cu12 = ctx.root.join(".toolchains/cuda12/nvidia");
            let nvrtc = cu12.join("cuda_nvrtc/lib/libnvrtc.so.12");
            let ptxas = cu12.join("cuda_nvcc/bin/ptxas");
            // CUDA 12.9's registry wheels have no fatbinary; 13.0's packs
            // the 12.9 images (a container format every driver reads).
            let fatbinary = cu13.join("fatbinary");
            if nvrtc.is_file() && is_executable(&ptxas) && is_executable(&fatbinary) {
                return Ok(CudaCompiler::Nvrtc {
                    nvrtc,
                    ptxas,
                    fatbinary,
                });
            }
            looked.push(format!(
                "{}, {} and {} (CUDA 12.9)",
                nvrtc.display(),
                ptxas.display(),
                fatbinary.display()
            ));
        }
        "13.0" => {
            let local = cu13.join("nvcc");
            if is_executable(&local) {
                return Ok(CudaCompiler::Nvcc(local));
            }
            looked.push(local.display().to_string());
        }
        other => fail(&format!(
            "{CUDA_TOOLKIT_ENV}={other}: expected 12.9 (the default) or 13.0"
        )),
    }
    if let Some(p) = on_path("nvcc") {
        return Ok(CudaCompiler::Nvcc(p));
    }
    looked.push("nvcc on PATH".into());
    Err(format!(
        "CUDA kernels not embedded: no CUDA compiler found (looked at: {}). Fix: {FIX_HINT}",
        looked.join(", ")
    ))
}

/// The number of an `sm_NN` or `compute_NN` target (`NN` may end in a
/// letter, as `sm_90a`).
fn cuda_target_number<'a>(t: &'a str, prefix: &str, var: &str) -> &'a str {
    t.strip_prefix(prefix)
        .filter(|n| {
            n.starts_with(|c: char| c.is_ascii_digit())
                && n.chars().all(|c| c.is_ascii_alphanumeric())
        })
        .unwrap_or_else(|| {
            fail(&format!(
                "{var}: `{t}` is not a CUDA target like {prefix}90 or {prefix}100a"
            ))
        })
}

/// `major.minor` of an nvcc `--version` line (`Cuda compilation tools,
/// release 12.9, V12.9.86`).
fn release_of(line: &str) -> String {
    line.split("release ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or("unknown")
        .trim()
        .to_string()
}

fn build_cuda(ctx: &Ctx) -> Result<CudaBuild, String> {
    let compiler = find_cuda(ctx)?;
    let targets = arch_list("DSV4_KVCACHE_CUDA_ARCHS", DEFAULT_CUDA_ARCHS);
    if targets.is_empty() {
        return Err("CUDA kernels not embedded: DSV4_KVCACHE_CUDA_ARCHS is empty".into());
    }
    let ptx = arch_list("DSV4_KVCACHE_CUDA_PTX", DEFAULT_CUDA_PTX);
    for t in &targets {
        cuda_target_number(t, "sm_", "DSV4_KVCACHE_CUDA_ARCHS");
    }
    for t in &ptx {
        cuda_target_number(t, "compute_", "DSV4_KVCACHE_CUDA_PTX");
    }
    let artifact = ctx.out.join("kvcache.fatbin");
    let (toolkit, name, log) = match &compiler {
        CudaCompiler::Nvcc(nvcc) => {
            let (toolkit, version, log) = build_cuda_nvcc(ctx, nvcc, &targets, &ptx, &artifact);
            (toolkit, format!("{} ({version})", nvcc.display()), log)
        }
        CudaCompiler::Nvrtc {
            nvrtc,
            ptxas,
            fatbinary,
        } => {
            let (toolkit, version, log) =
                build_cuda_nvrtc(ctx, nvrtc, ptxas, fatbinary, &targets, &ptx, &artifact);
            (
                toolkit,
                format!("{} + {} ({version})", nvrtc.display(), ptxas.display()),
                log,
            )
        }
    };
    // ptxas -v goes to stderr; everything that is not its report is a diagnostic.
    let mut report = String::new();
    for line in log.lines() {
        let is_report = line.starts_with("ptxas info")
            || line.trim_start().starts_with(|c: char| c.is_ascii_digit())
                && line.contains("bytes stack frame");
        if is_report {
            report.push_str(line);
            report.push('\n');
        } else if !line.trim().is_empty() {
            println!("cargo:warning=cuda: {line}");
        }
    }
    fs::write(ctx.out.join("cuda_resources.txt"), &report).unwrap_or_else(|e| fail(&e.to_string()));
    Ok(CudaBuild {
        artifact,
        targets,
        ptx,
        toolkit,
        compiler: name,
        report,
    })
}

/// nvcc: one `-gencode` per SASS and per PTX target. Returns the toolkit,
/// nvcc's version line and its output.
fn build_cuda_nvcc(
    ctx: &Ctx,
    nvcc: &Path,
    targets: &[String],
    ptx: &[String],
    artifact: &Path,
) -> (String, String, String) {
    let version = run(Command::new(nvcc).arg("--version"))
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.lines()
                .find(|l| l.contains("release"))
                .unwrap_or("unknown version")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| fail(&e));
    let src = ctx.root.join("kernels-cuda/kvcache.cu");
    let mut cmd = Command::new(nvcc);
    cmd.current_dir(&ctx.root).arg("-fatbin");
    for t in targets {
        let num = cuda_target_number(t, "sm_", "DSV4_KVCACHE_CUDA_ARCHS");
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{num},code=sm_{num}"));
    }
    for t in ptx {
        let num = cuda_target_number(t, "compute_", "DSV4_KVCACHE_CUDA_PTX");
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{num},code=compute_{num}"));
    }
    cmd.args(NVCC_FLAGS);
    // The kernel directories are searched for `#include "..."` only (-iquote, not -I), so
    // a kernel header named like a system header (math.h) cannot shadow the one that
    // cuda_runtime.h includes. nvcc has no -iquote; its preprocessor (the host compiler's,
    // for the device passes too) gets it through -Xcompiler.
    for dir in [
        ctx.root.join("kernels-hip"),
        ctx.root.join("kernels-cuda"),
        ctx.out.clone(),
    ] {
        cmd.arg("-Xcompiler")
            .arg("-iquote")
            .arg("-Xcompiler")
            .arg(dir);
    }
    cmd.arg("-DKV_ABI_LAYOUT_CHECK=1");
    cmd.arg("-o").arg(artifact).arg(&src);
    let out = run(&mut cmd).unwrap_or_else(|e| fail(&e));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        fail(&format!(
            "nvcc failed ({}):\n{cmd:?}\n{stdout}{stderr}",
            out.status
        ));
    }
    (release_of(&version), version, stdout + &stderr)
}

/// NVRTC's C API, the few entry points a build needs.
mod nvrtc {
    use std::ffi::{c_char, c_int, CStr, CString};
    use std::path::Path;

    type Program = *mut std::ffi::c_void;
    type Create = unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;
    type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
    type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
    type Get = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
    type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
    type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

    /// A loaded libnvrtc.
    pub struct Nvrtc {
        lib: libloading::Library,
    }

    impl Nvrtc {
        pub fn open(path: &Path) -> Result<Nvrtc, String> {
            // SAFETY: loading NVRTC runs its initializers only.
            unsafe { libloading::Library::new(path) }
                .map(|lib| Nvrtc { lib })
                .map_err(|e| format!("loading {}: {e}", path.display()))
        }

        fn sym<T: Copy>(&self, name: &[u8]) -> Result<T, String> {
            // SAFETY: each name is looked up with its nvrtc.h signature.
            unsafe { self.lib.get::<T>(name) }
                .map(|s| *s)
                .map_err(|e| format!("NVRTC lacks {}: {e}", String::from_utf8_lossy(name)))
        }

        /// `major.minor`.
        pub fn version(&self) -> Result<String, String> {
            let f: Version = self.sym(b"nvrtcVersion\0")?;
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two out-parameters.
            unsafe { f(&mut major, &mut minor) };
            Ok(format!("{major}.{minor}"))
        }

        /// Compiles `source` (named `name`, for includes and messages) with
        /// `options`; returns the PTX, or the log of a failed compile.
        pub fn ptx(&self, name: &str, source: &str, options: &[String]) -> Result<String, String> {
            let create: Create = self.sym(b"nvrtcCreateProgram\0")?;
            let compile: Compile = self.sym(b"nvrtcCompileProgram\0")?;
            let log_size: Size = self.sym(b"nvrtcGetProgramLogSize\0")?;
            let get_log: Get = self.sym(b"nvrtcGetProgramLog\0")?;
            let ptx_size: Size = self.sym(b"nvrtcGetPTXSize\0")?;
            let get_ptx: Get = self.sym(b"nvrtcGetPTX\0")?;
            let destroy: Destroy = self.sym(b"nvrtcDestroyProgram\0")?;
            let error: ErrorString = self.sym(b"nvrtcGetErrorString\0")?;
            let cstr = |s: &str| CString::new(s).map_err(|_| format!("NUL in {s:?}"));
            let (src, nm) = (cstr(source)?, cstr(name)?);
            let opts = options
                .iter()
                .map(|o| cstr(o))
                .collect::<Result<Vec<_>, _>>()?;
            let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
            let why = |rc: c_int| {
                // SAFETY: NVRTC returns a static string for every code.
                unsafe { CStr::from_ptr(error(rc)) }
                    .to_string_lossy()
                    .into_owned()
            };
            let mut prog: Program = std::ptr::null_mut();
            // SAFETY: NUL-terminated strings that outlive the call; no headers passed.
            let rc = unsafe {
                create(
                    &mut prog,
                    src.as_ptr(),
                    nm.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                return Err(format!("nvrtcCreateProgram: {}", why(rc)));
            }
            // SAFETY: prog was created above; the option pointers are valid.
            let rc = unsafe { compile(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
            let read = |size: Size, get: Get| -> String {
                let mut n = 0usize;
                // SAFETY: a buffer of the size NVRTC reports.
                unsafe { size(prog, &mut n) };
                let mut buf = vec![0u8; n.max(1)];
                // SAFETY: as above.
                unsafe { get(prog, buf.as_mut_ptr().cast()) };
                let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                String::from_utf8_lossy(&buf[..end]).into_owned()
            };
            let log = read(log_size, get_log);
            let result = if rc == 0 {
                Ok(read(ptx_size, get_ptx))
            } else {
                Err(format!("{}:\n{log}", why(rc)))
            };
            // SAFETY: destroyed once, after its last use.
            unsafe { destroy(&mut prog) };
            result
        }
    }
}

/// Every kernel's parameter block in `ptx` (`.param .align A .b8
/// NAME_param_0[SIZE]`) has the size and alignment of the Rust struct
/// (`kernel_params.txt`): the layout check a compiler without
/// `__builtin_offsetof` leaves to this.
fn check_ptx_params(ctx: &Ctx, ptx: &str, num: &str) {
    let table = fs::read_to_string(ctx.out.join("kernel_params.txt"))
        .unwrap_or_else(|e| fail(&e.to_string()));
    for line in table.lines() {
        let mut w = line.split_whitespace();
        let (Some(kernel), Some(size), Some(align)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let want = format!(".param .align {align} .b8 {kernel}_param_0[{size}]");
        if !ptx.contains(&want) {
            let found = ptx
                .lines()
                .find(|l| l.contains(&format!("{kernel}_param_0[")))
                .unwrap_or("no parameter block")
                .trim()
                .to_string();
            fail(&format!(
                "compute_{num} PTX: kernel {kernel}'s parameter block is `{found}`, the Rust struct's is `{want}`"
            ));
        }
    }
}

/// NVRTC + ptxas + fatbinary: a PTX per virtual target (each SASS target's
/// own, as nvcc's `arch=compute_NN,code=sm_NN`), a cubin per SASS target,
/// one fatbin. Returns the toolkit, the version line and ptxas's reports.
fn build_cuda_nvrtc(
    ctx: &Ctx,
    nvrtc: &Path,
    ptxas: &Path,
    fatbinary: &Path,
    targets: &[String],
    ptx: &[String],
    artifact: &Path,
) -> (String, String, String) {
    let lib = nvrtc::Nvrtc::open(nvrtc).unwrap_or_else(|e| fail(&e));
    let toolkit = lib.version().unwrap_or_else(|e| fail(&e));
    let src_path = ctx.root.join("kernels-cuda/kvcache.cu");
    let source = fs::read_to_string(&src_path)
        .unwrap_or_else(|e| fail(&format!("{}: {e}", src_path.display())));
    // NVRTC has no system headers for a kernel header to shadow, so plain
    // -I paths are what nvcc's -iquote ones are.
    let mut options: Vec<String> = NVRTC_FLAGS.iter().map(|s| s.to_string()).collect();
    for dir in [
        ctx.root.join("kernels-hip"),
        ctx.root.join("kernels-cuda"),
        ctx.out.join("nvrtc"),
    ] {
        options.push(format!("-I{}", dir.display()));
    }
    options.push("-DKV_ABI_LAYOUT_CHECK=1".into());
    // Every virtual target once: each SASS target's, then the PTX-only ones.
    let mut virtuals: Vec<String> = targets
        .iter()
        .map(|t| cuda_target_number(t, "sm_", "DSV4_KVCACHE_CUDA_ARCHS").to_string())
        .collect();
    for t in ptx {
        let n = cuda_target_number(t, "compute_", "DSV4_KVCACHE_CUDA_PTX").to_string();
        if !virtuals.contains(&n) {
            virtuals.push(n);
        }
    }
    // Each target compiles on its own thread (NVRTC programs are independent),
    // its cubin right after its PTX.
    let results: Vec<(String, PathBuf, Option<PathBuf>, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = virtuals
            .iter()
            .map(|num| {
                let (lib, options, source) = (&lib, &options, &source);
                let (src_path, toolkit) = (&src_path, &toolkit);
                s.spawn(move || {
                    let mut opts = vec![format!("--gpu-architecture=compute_{num}")];
                    opts.extend(options.iter().cloned());
                    let name = src_path.display().to_string();
                    let text = lib.ptx(&name, source, &opts).unwrap_or_else(|e| {
                        fail(&format!("NVRTC {toolkit} for compute_{num} failed: {e}"))
                    });
                    check_ptx_params(ctx, &text, num);
                    let ptx_file = ctx.out.join(format!("kvcache.compute_{num}.ptx"));
                    fs::write(&ptx_file, &text).unwrap_or_else(|e| fail(&e.to_string()));
                    if !targets.iter().any(|t| t.strip_prefix("sm_") == Some(num)) {
                        return (num.clone(), ptx_file, None, String::new());
                    }
                    let cubin = ctx.out.join(format!("kvcache.sm_{num}.cubin"));
                    let mut cmd = Command::new(ptxas);
                    cmd.arg(format!("-arch=sm_{num}"))
                        .args(PTXAS_FLAGS)
                        .arg(&ptx_file)
                        .arg("-o")
                        .arg(&cubin);
                    let out = run(&mut cmd).unwrap_or_else(|e| fail(&e));
                    let log = String::from_utf8_lossy(&out.stdout).into_owned()
                        + &String::from_utf8_lossy(&out.stderr);
                    if !out.status.success() {
                        fail(&format!("ptxas failed ({}):\n{cmd:?}\n{log}", out.status));
                    }
                    (num.clone(), ptx_file, Some(cubin), log)
                })
            })
            .collect();
        handles.into_iter().map(join).collect()
    });
    let mut cmd = Command::new(fatbinary);
    cmd.arg(format!("--create={}", artifact.display()))
        .arg("-64")
        // The options the driver's JIT compiles the PTX with, as nvcc records them.
        .arg("--cmdline=--fmad false")
        .arg("--cicc-cmdline=-ftz=0 -prec_div=1 -prec_sqrt=1 -fmad=0")
        // Uncompressed: this fatbinary is newer than the 12.x drivers that
        // must read the PTX; a stored image needs no decompressor of theirs.
        .arg("--compress=false");
    let mut log = String::new();
    for (num, ptx_file, cubin, report) in &results {
        if let Some(c) = cubin {
            cmd.arg(format!("--image3=kind=elf,sm={num},file={}", c.display()));
            log.push_str(report);
        }
        if ptx
            .iter()
            .any(|t| t.strip_prefix("compute_") == Some(num.as_str()))
        {
            cmd.arg(format!(
                "--image3=kind=ptx,sm={num},file={}",
                ptx_file.display()
            ));
        }
    }
    let out = run(&mut cmd).unwrap_or_else(|e| fail(&e));
    if !out.status.success() {
        fail(&format!(
            "fatbinary failed ({}):\n{cmd:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let ptxas_version = run(Command::new(ptxas).arg("--version"))
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("release"))
                .unwrap_or("unknown version")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| fail(&e));
    (
        toolkit.clone(),
        format!("NVRTC {toolkit}, ptxas {ptxas_version}"),
        log,
    )
}

// ------------------------------------------------------------------- HIP ----

#[derive(Clone, Copy, PartialEq)]
enum HipKind {
    /// ROCm's hipcc: real headers and device libraries.
    Hipcc,
    /// A plain HIP-capable clang: freestanding prelude, no device libraries.
    Clang,
}

struct HipBuild {
    objects: Vec<(String, PathBuf)>,
    compiler: String,
}

fn find_hip(ctx: &Ctx) -> Result<(PathBuf, HipKind), String> {
    if let Some(p) = explicit("HIPCC") {
        return Ok((p, HipKind::Hipcc));
    }
    let mut looked = vec!["$HIPCC (unset)".to_string()];
    let rocm = env_nonempty("ROCM_PATH").unwrap_or_else(|| "/opt/rocm".into());
    let p = Path::new(&rocm).join("bin/hipcc");
    if is_executable(&p) {
        return Ok((p, HipKind::Hipcc));
    }
    looked.push(p.display().to_string());
    if let Some(p) = explicit("HIP_CLANG") {
        return Ok((p, HipKind::Clang));
    }
    looked.push("$HIP_CLANG (unset)".into());
    let local = ctx.root.join(".toolchains/bin/hip-clang");
    if is_executable(&local) {
        return Ok((local, HipKind::Clang));
    }
    looked.push(local.display().to_string());
    if let Some(p) = on_path("hipcc") {
        return Ok((p, HipKind::Hipcc));
    }
    looked.push("hipcc on PATH".into());
    Err(format!(
        "HIP kernels not embedded: no HIP compiler found (looked at: {}). Fix: {FIX_HINT}",
        looked.join(", ")
    ))
}

/// PATH for a HIP clang child: `.toolchains/bin` first, so clang finds an `lld`.
fn hip_child_path(ctx: &Ctx) -> Option<std::ffi::OsString> {
    let bin = ctx.root.join(".toolchains/bin");
    if !bin.is_dir() {
        return None;
    }
    let mut dirs = vec![bin];
    if let Some(p) = env::var_os("PATH") {
        dirs.extend(env::split_paths(&p));
    }
    env::join_paths(dirs).ok()
}

fn build_hip(ctx: &Ctx) -> Result<HipBuild, String> {
    let (cc, kind) = find_hip(ctx)?;
    let targets = arch_list("DSV4_KVCACHE_HIP_ARCHS", DEFAULT_HIP_ARCHS);
    if targets.is_empty() {
        return Err("HIP kernels not embedded: DSV4_KVCACHE_HIP_ARCHS is empty".into());
    }
    let child_path = if kind == HipKind::Clang {
        hip_child_path(ctx)
    } else {
        None
    };
    let command = |prog: &Path| {
        let mut c = Command::new(prog);
        c.current_dir(&ctx.root);
        if let Some(p) = &child_path {
            c.env("PATH", p);
        }
        c
    };
    let version = run(command(&cc).arg("--version"))
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.lines()
                .find(|l| l.contains("version"))
                .unwrap_or("unknown version")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| fail(&e));

    let src = ctx.root.join("kernels-hip/kvcache.hip");
    let mut objects = Vec::new();
    for t in &targets {
        let base = t.split(':').next().unwrap_or_default();
        if !base.starts_with("gfx")
            || base.len() < 4
            || !base.chars().all(|c| c.is_ascii_alphanumeric())
        {
            fail(&format!(
                "DSV4_KVCACHE_HIP_ARCHS: `{t}` is not an AMDGPU target like gfx942 or gfx950:xnack-"
            ));
        }
        if objects.iter().any(|(b, _)| b == base) {
            fail(&format!("DSV4_KVCACHE_HIP_ARCHS names {base} twice"));
        }
        let obj = ctx.out.join(format!("kvcache-{base}.hsaco"));
        let mut cmd = command(&cc);
        cmd.args(HIP_FLAGS).arg(format!("--offload-arch={t}"));
        match kind {
            HipKind::Clang => cmd.args(HIP_FREESTANDING),
            HipKind::Hipcc => cmd.arg("-DKV_HAVE_HIP_RUNTIME=1"),
        };
        // -iquote rather than -I: see build_cuda.
        cmd.arg("-iquote")
            .arg(ctx.root.join("kernels-hip"))
            .arg("-iquote")
            .arg(&ctx.out)
            .arg("-DKV_ABI_LAYOUT_CHECK=1")
            .arg("-o")
            .arg(&obj)
            .arg(&src);
        let out = run(&mut cmd).unwrap_or_else(|e| fail(&e));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            fail(&format!(
                "HIP compile for {t} failed ({}):\n{cmd:?}\n{}{stderr}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            println!("cargo:warning=hip {t}: {line}");
        }
        let bytes = fs::read(&obj).unwrap_or_else(|e| fail(&format!("{}: {e}", obj.display())));
        if bytes.get(..4) != Some(b"\x7fELF") {
            fail(&format!(
                "{} is not an ELF code object (an offload bundle?); the compiler ignored --no-gpu-bundle-output",
                obj.display()
            ));
        }
        objects.push((base.to_string(), obj));
    }
    Ok(HipBuild {
        objects,
        compiler: format!("{} ({version})", cc.display()),
    })
}

// -------------------------------------------------------------- embedding ----

fn write_generated(ctx: &Ctx, emb: &Embedded) {
    // Paths relative to OUT_DIR, so the generated file does not hard-code the target dir.
    let lit = |p: &Path| {
        let name = p.file_name().expect("artifact file name").to_string_lossy();
        format!("concat!(env!(\"OUT_DIR\"), \"/{name}\")")
    };
    let strs = |v: &[String]| {
        let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
        format!("&[{}]", items.join(", "))
    };
    let opt_str = |s: &Option<String>| match s {
        Some(s) => format!("Some({s:?})"),
        None => "None".into(),
    };
    let mut g = String::from("// @generated by build.rs: the kernels embedded in this build.\n");
    let fatbin = match &emb.cuda_fatbin {
        Some(p) => format!("Some(include_bytes!({}))", lit(p)),
        None => "None".into(),
    };
    let _ = writeln!(g, "static CUDA_FATBIN: Option<&[u8]> = {fatbin};");
    let _ = writeln!(
        g,
        "static CUDA_TARGETS: &[&str] = {};",
        strs(&emb.cuda_targets)
    );
    let _ = writeln!(g, "static CUDA_PTX: &[&str] = {};", strs(&emb.cuda_ptx));
    let _ = writeln!(
        g,
        "static CUDA_TOOLKIT: Option<&str> = {};",
        opt_str(&emb.cuda_toolkit)
    );
    let _ = writeln!(
        g,
        "static CUDA_COMPILER: Option<&str> = {};",
        opt_str(&emb.cuda_compiler)
    );
    let _ = writeln!(g, "static CUDA_RESOURCES: &str = {:?};", emb.cuda_report);
    let objs: Vec<String> = emb
        .hip_objects
        .iter()
        .map(|(arch, p)| format!("({arch:?}, include_bytes!({}) as &[u8])", lit(p)))
        .collect();
    let _ = writeln!(
        g,
        "static HIP_CODE_OBJECTS: &[(&str, &[u8])] = &[{}];",
        objs.join(", ")
    );
    let hip_targets: Vec<String> = emb.hip_objects.iter().map(|(a, _)| a.clone()).collect();
    let _ = writeln!(g, "static HIP_TARGETS: &[&str] = {};", strs(&hip_targets));
    let _ = writeln!(
        g,
        "static HIP_COMPILER: Option<&str> = {};",
        opt_str(&emb.hip_compiler)
    );
    let _ = writeln!(
        g,
        "static MISSING_REASONS: &[&str] = {};",
        strs(&emb.missing)
    );
    write_if_changed(&ctx.out.join("kernels_embedded.rs"), &g);
}
