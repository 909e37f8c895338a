//! Compiles the one kernel source set twice and embeds the results:
//!
//! * CUDA: `kernels-cuda/kvcache.cu` (the CUDA prelude + `kernels-hip/kvcache.hip`)
//!   with nvcc into one fatbin holding SASS for every `DSV4_KVCACHE_CUDA_ARCHS` target.
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

const DEFAULT_CUDA_ARCHS: &str = "sm_90,sm_100";
const DEFAULT_HIP_ARCHS: &str = "gfx942,gfx950";

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
    let checks = abi::c_checks(&parsed).unwrap_or_else(|e| fail(&e));
    write_if_changed(&ctx.out.join("kernel_abi_gen.rs"), &rust);
    write_if_changed(&ctx.out.join("kv_abi_layout.h"), &checks);
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
    compiler: String,
    report: String,
}

fn find_nvcc(ctx: &Ctx) -> Result<PathBuf, String> {
    if let Some(p) = explicit("NVCC") {
        return Ok(p);
    }
    let mut looked = vec!["$NVCC (unset)".to_string()];
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        match env_nonempty(var) {
            Some(dir) => {
                let p = Path::new(&dir).join("bin/nvcc");
                if is_executable(&p) {
                    return Ok(p);
                }
                looked.push(format!("${var}/bin/nvcc ({} missing)", p.display()));
            }
            None => looked.push(format!("${var} (unset)")),
        }
    }
    let local = ctx.root.join(".toolchains/py/nvidia/cu13/bin/nvcc");
    if is_executable(&local) {
        return Ok(local);
    }
    looked.push(local.display().to_string());
    if let Some(p) = on_path("nvcc") {
        return Ok(p);
    }
    looked.push("nvcc on PATH".into());
    Err(format!(
        "CUDA kernels not embedded: nvcc not found (looked at: {}). Fix: {FIX_HINT}",
        looked.join(", ")
    ))
}

fn build_cuda(ctx: &Ctx) -> Result<CudaBuild, String> {
    let nvcc = find_nvcc(ctx)?;
    let targets = arch_list("DSV4_KVCACHE_CUDA_ARCHS", DEFAULT_CUDA_ARCHS);
    if targets.is_empty() {
        return Err("CUDA kernels not embedded: DSV4_KVCACHE_CUDA_ARCHS is empty".into());
    }
    let version = run(Command::new(&nvcc).arg("--version"))
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
    let artifact = ctx.out.join("kvcache.fatbin");
    let mut cmd = Command::new(&nvcc);
    cmd.current_dir(&ctx.root).arg("-fatbin");
    for t in &targets {
        let num = t
            .strip_prefix("sm_")
            .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()))
            .unwrap_or_else(|| {
                fail(&format!(
                    "DSV4_KVCACHE_CUDA_ARCHS: `{t}` is not a CUDA target like sm_90 or sm_100a"
                ))
            });
        cmd.arg("-gencode")
            .arg(format!("arch=compute_{num},code=sm_{num}"));
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
    cmd.arg("-o").arg(&artifact).arg(&src);
    let out = run(&mut cmd).unwrap_or_else(|e| fail(&e));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        fail(&format!(
            "nvcc failed ({}):\n{cmd:?}\n{stdout}{stderr}",
            out.status
        ));
    }
    // ptxas -v goes to stderr; everything that is not its report is a diagnostic.
    let mut report = String::new();
    for line in stdout.lines().chain(stderr.lines()) {
        let is_report = line.starts_with("ptxas info")
            || line.trim_start().starts_with(|c: char| c.is_ascii_digit())
                && line.contains("bytes stack frame");
        if is_report {
            report.push_str(line);
            report.push('\n');
        } else if !line.trim().is_empty() {
            println!("cargo:warning=nvcc: {line}");
        }
    }
    fs::write(ctx.out.join("cuda_resources.txt"), &report).unwrap_or_else(|e| fail(&e.to_string()));
    Ok(CudaBuild {
        artifact,
        targets,
        compiler: format!("{} ({version})", nvcc.display()),
        report,
    })
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
