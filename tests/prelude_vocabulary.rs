//! The vendor vocabulary is the same on both sides: `kernels-cuda/prelude.cuh`
//! and both modes of `kernels-hip/prelude.h` (hipcc with the HIP runtime
//! header, and freestanding clang) define the same `KV_*` macros and `kv_*`
//! functions, and the kernel source uses no such name that neither it nor
//! the preludes define. CI compiles the CUDA prelude and the freestanding HIP
//! mode; this keeps the hipcc mode, which only a ROCm machine compiles
//! (scripts/rocm-ci.sh), from falling behind when the vocabulary grows.

use std::collections::BTreeSet;
use std::path::Path;

/// Optional hardware paths a prelude may leave out (the kernels test for
/// them with `#if defined(...)`).
const OPTIONAL: &[&str] = &[
    "KV_HW_E4M3X2",
    "kv_hw_e4m3x2",
    "KV_HW_BF16X2",
    "kv_hw_bf16x2",
    "KV_HW_BF16X2_MUL",
    "kv_hw_bf16x2_mul",
    "KV_HW_BYTE_PERM",
    "kv_hw_byte_perm",
    "KV_HW_BF16X2_ARITH",
    "kv_hw_bf16x2_fma",
    "kv_hw_bf16x2_min",
    "kv_hw_bf16x2_max",
    "kv_hw_u16x2_min",
    "kv_hw_byte_perm_sx",
    // Compiler facts rather than hardware paths, CUDA's alone.
    "KV_CUDA_12",
];

/// Compiler builtins a prelude defines for a compiler that lacks them (the
/// CUDA prelude's `__builtin_clz` under NVRTC): the kernels' spelling is
/// the compilers', not the vocabulary's.
const COMPILER_SHIMS: &[&str] = &["__builtin_clz"];

/// Macros build.rs defines on the compilers' command lines.
const BUILD_DEFINED: &[&str] = &["KV_ABI_LAYOUT_CHECK"];

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The kernel source files (`.h` and `.hip` in kernels-hip/, the prelude
/// excepted), as paths relative to the crate root, sorted.
fn kernel_sources() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels-hip");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| (n.ends_with(".h") || n.ends_with(".hip")) && n != "prelude.h")
        .map(|n| format!("kernels-hip/{n}"))
        .collect();
    files.sort();
    files
}

/// Names a piece of source defines: `#define NAME`, the function of every
/// `KV_DEVICE ... name(` line and the kernel of every `KV_KERNEL ... void
/// name(` line.
fn defined_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix("#define ") {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            names.insert(name);
        } else if line.starts_with("KV_DEVICE ") {
            let head = &line[..line
                .find('(')
                .expect("a KV_DEVICE line declares a function")];
            let name = head
                .rsplit(|c: char| !is_ident(c))
                .next()
                .unwrap_or_default();
            names.insert(name.to_string());
        } else if let (true, Some(v)) = (line.starts_with("KV_KERNEL "), line.find(" void ")) {
            let name: String = line[v + 6..].chars().take_while(|&c| is_ident(c)).collect();
            names.insert(name);
        }
    }
    names
}

/// What a source uses of the vocabulary: every `KV_*` identifier and every
/// `kv_*` one that is called (followed by `(` or a template's `<`), except
/// member accesses and `#include` lines.
fn used_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| !l.trim_start().starts_with("#include"))
    {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if !(is_ident(chars[i]) && (i == 0 || !is_ident(chars[i - 1]))) {
                i += 1;
                continue;
            }
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let member = start > 0 && (chars[start - 1] == '.' || chars[start - 1] == '>');
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            let called = matches!(next, Some('(') | Some('<'));
            if !member && (word.starts_with("KV_") || (word.starts_with("kv_") && called)) {
                names.insert(word);
            }
        }
    }
    names
}

/// The HIP prelude's three parts: the hipcc mode, the freestanding mode and
/// what follows both.
fn hip_parts(text: &str) -> (String, String, String) {
    let lines: Vec<&str> = text.lines().collect();
    let open = lines
        .iter()
        .position(|l| l.trim() == "#if defined(KV_HAVE_HIP_RUNTIME)")
        .expect("the hipcc-mode #if");
    let (mut depth, mut else_at, mut end_at) = (0i32, None, None);
    for (k, l) in lines.iter().enumerate().skip(open) {
        let l = l.trim_start();
        if l.starts_with("#if") {
            depth += 1;
        } else if l.starts_with("#endif") {
            depth -= 1;
            if depth == 0 {
                end_at = Some(k);
                break;
            }
        } else if l.starts_with("#else") && depth == 1 {
            else_at = Some(k);
        }
    }
    let (e, end) = (else_at.expect("#else"), end_at.expect("#endif"));
    (
        lines[open + 1..e].join("\n"),
        lines[e + 1..end].join("\n"),
        lines[end + 1..].join("\n"),
    )
}

#[test]
fn both_hip_modes_define_the_same_names() {
    let (hipcc, freestanding, _) = hip_parts(&read("kernels-hip/prelude.h"));
    let a = defined_names(&hipcc);
    let b = defined_names(&freestanding);
    assert!(a.contains("KV_BOUNDS"), "parsed nothing: {a:?}");
    assert_eq!(
        a.symmetric_difference(&b).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "defined by one HIP mode only"
    );
}

#[test]
fn cuda_and_hip_define_the_same_vocabulary() {
    let (hipcc, _, common) = hip_parts(&read("kernels-hip/prelude.h"));
    let hip: BTreeSet<String> = defined_names(&hipcc)
        .into_iter()
        .chain(defined_names(&common))
        // AMD-internal helpers end in '_' (kv_lane_id_).
        .filter(|n| !n.ends_with('_'))
        .collect();
    let cuda: BTreeSet<String> = defined_names(&read("kernels-cuda/prelude.cuh"))
        .into_iter()
        .filter(|n| !OPTIONAL.contains(&n.as_str()) && !COMPILER_SHIMS.contains(&n.as_str()))
        .collect();
    assert!(cuda.contains("kv_shfl_xor"), "parsed nothing: {cuda:?}");
    let only_cuda: Vec<_> = cuda.difference(&hip).collect();
    let only_hip: Vec<_> = hip.difference(&cuda).collect();
    assert!(
        only_cuda.is_empty() && only_hip.is_empty(),
        "CUDA prelude only: {only_cuda:?}; HIP prelude only: {only_hip:?}"
    );
}

#[test]
fn kernels_use_only_names_they_or_both_preludes_define() {
    let (hipcc, freestanding, common) = hip_parts(&read("kernels-hip/prelude.h"));
    let cuda = defined_names(&read("kernels-cuda/prelude.cuh"));
    // Every kernel file: all of kernels-hip/ but the prelude.
    let kernel_files = kernel_sources();
    assert!(
        kernel_files.iter().any(|f| f == "kernels-hip/kvcache.hip"),
        "kernels-hip/ holds no kvcache.hip: {kernel_files:?}"
    );
    let texts: Vec<String> = kernel_files.iter().map(|f| read(f)).collect();
    let mut known: BTreeSet<String> = texts.iter().flat_map(|t| defined_names(t)).collect();
    // The CUDA entry file defines KV_PRELUDE_INCLUDED, which makes the
    // shared source skip the HIP prelude.
    known.extend(defined_names(&read("kernels-cuda/kvcache.cu")));
    known.extend(BUILD_DEFINED.iter().map(|s| s.to_string()));
    for n in &cuda {
        let in_hip = [&hipcc, &freestanding, &common]
            .iter()
            .any(|part| defined_names(part).contains(n));
        if in_hip || OPTIONAL.contains(&n.as_str()) {
            known.insert(n.clone());
        }
    }
    for (file, text) in kernel_files.iter().zip(&texts) {
        let unknown: Vec<String> = used_names(text)
            .into_iter()
            .filter(|n| !known.contains(n))
            .collect();
        assert!(
            unknown.is_empty(),
            "{file} uses names no prelude defines for both vendors: {unknown:?}"
        );
    }
}

/// Every AMD target runs the software conversion paths: the HIP prelude (both
/// modes) defines none of the optional hardware paths (`KV_HW_*` and their
/// `kv_hw_*` functions), so gfx90a, which lacks gfx942's and gfx950's FP8
/// and BF16 conversion instructions, compiles the same exact code as they
/// do (docs/backends.md, "AMD conversion instructions").
#[test]
fn amd_targets_take_the_software_paths() {
    let text = read("kernels-hip/prelude.h");
    let defined = defined_names(&text);
    let hw: Vec<&String> = defined
        .iter()
        .filter(|n| {
            OPTIONAL.contains(&n.as_str()) || n.starts_with("KV_HW_") || n.starts_with("kv_hw_")
        })
        .collect();
    assert!(
        hw.is_empty(),
        "the HIP prelude defines hardware paths: {hw:?}"
    );
    // No target-specific branch either: one code path for every gfx target.
    for marker in [
        "__gfx90a__",
        "__gfx942__",
        "__gfx950__",
        "__AMDGCN_WAVEFRONT_SIZE",
    ] {
        assert!(
            !text.contains(marker),
            "the HIP prelude branches on {marker}"
        );
    }
}
