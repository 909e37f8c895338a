//! bindgen on ROCm 6.4.3's own `hip_runtime_api.h` (extracted from Debian by
//! scripts/install-toolchains.sh into `.toolchains/rocm`), checked against
//! every item `src/backend/hip/ffi.rs` declares:
//!
//! * each entry of its symbol table: the C function's parameter and return
//!   types, compared as ABI classes (32-bit integer or enum, `size_t`,
//!   `float`, a pointer to const or mutable data of a class);
//! * each constant: the enum value it stands for, or the struct offset or
//!   size it assumes (`gcnArchName` in `hipDeviceProp_tR0600` and
//!   `hipDeviceProp_tR0000`, `name` first and 256 bytes long, both structs
//!   smaller than the buffer reserved for them).
//!
//! A mismatch names the item. bindgen loads libclang at run time
//! (`LIBCLANG_PATH`, default `.toolchains/libclang/clang/native`, the PyPI
//! `libclang` wheel); without it or the headers the test prints SKIPPED,
//! unless `DSV4_KVCACHE_REQUIRE_KERNELS=1` (CI), where that is a failure.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

const FFI: &str = include_str!("../src/backend/hip/ffi.rs");

/// Which header item each `ffi.rs` constant stands for.
enum Meaning {
    /// An enumerator's value.
    Enum(&'static str),
    /// A field's byte offset in a struct.
    Offset(&'static str, &'static str),
    /// At least the size of every listed struct.
    AtLeastSizeOf(&'static [&'static str]),
}

const CONSTANTS: &[(&str, Meaning)] = &[
    ("HIP_SUCCESS", Meaning::Enum("hipSuccess")),
    ("HIP_ERROR_NO_DEVICE", Meaning::Enum("hipErrorNoDevice")),
    ("MEMCPY_H2D", Meaning::Enum("hipMemcpyHostToDevice")),
    ("MEMCPY_D2H", Meaning::Enum("hipMemcpyDeviceToHost")),
    ("MEMCPY_D2D", Meaning::Enum("hipMemcpyDeviceToDevice")),
    (
        "CAPTURE_MODE_THREAD_LOCAL",
        Meaning::Enum("hipStreamCaptureModeThreadLocal"),
    ),
    (
        "GCN_ARCH_NAME_OFFSET_R0600",
        Meaning::Offset("hipDeviceProp_tR0600", "gcnArchName"),
    ),
    (
        "GCN_ARCH_NAME_OFFSET_R0000",
        Meaning::Offset("hipDeviceProp_tR0000", "gcnArchName"),
    ),
    (
        "DEVICE_PROP_BYTES",
        Meaning::AtLeastSizeOf(&["hipDeviceProp_tR0600", "hipDeviceProp_tR0000"]),
    ),
];

/// Symbols whose C declaration has another name in the 6.4 headers.
const DECLARED_AS: &[(&str, &str)] = &[
    // ROCm 6's headers make hipGetDeviceProperties a macro for the R0600
    // entry point; the plain symbol the runtime still exports is the
    // legacy one, declared as hipGetDevicePropertiesR0000.
    ("hipGetDeviceProperties", "hipGetDevicePropertiesR0000"),
];

fn rocm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".toolchains/rocm")
}

fn skip(why: &str) {
    assert!(
        std::env::var("DSV4_KVCACHE_REQUIRE_KERNELS").map_or(true, |v| v.trim() != "1"),
        "DSV4_KVCACHE_REQUIRE_KERNELS=1 but bindgen cannot run: {why}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: bindgen on ROCm 6.4.3's headers: {why} ***\n"
    );
}

/// One `name = "symbol": fn(args) -> ret;` entry of ffi.rs's table.
struct Entry {
    symbol: String,
    args: Vec<String>,
    ret: String,
}

/// The table, joined across lines (a long signature wraps).
fn table(ffi: &str) -> Vec<Entry> {
    let start = ffi.find("hip_api! {").expect("the hip_api! invocation");
    let body = &ffi[start..];
    let body = &body[..body.find("\n}\n").expect("end of hip_api!")];
    let flat: String = body
        .lines()
        .map(|l| l.split("//").next().unwrap_or("").trim())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = Vec::new();
    for item in flat.split(';') {
        let Some((_, rest)) = item.split_once(" = \"") else {
            continue;
        };
        let (symbol, sig) = rest.split_once("\":").expect("symbol: fn");
        let sig = sig.trim().strip_prefix("fn(").expect("fn(");
        let (args, ret) = sig.rsplit_once(") ->").expect(") -> ret");
        out.push(Entry {
            symbol: symbol.to_string(),
            args: split_args(args),
            ret: ret.trim().to_string(),
        });
    }
    out
}

fn split_args(s: &str) -> Vec<String> {
    s.split(',')
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect()
}

/// `pub(crate) const NAME: TYPE = VALUE;` items of ffi.rs.
fn constants(ffi: &str) -> Vec<(String, i64)> {
    ffi.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pub(crate) const ")?;
            let (name, rest) = rest.split_once(':')?;
            let value = rest.split_once('=')?.1.trim().trim_end_matches(';');
            Some((
                name.trim().to_string(),
                value.replace('_', "").parse().ok()?,
            ))
        })
        .collect()
}

/// The ABI class of a Rust type written in ffi.rs.
fn class_ours(t: &str) -> String {
    let t = t.trim();
    if let Some(p) = t.strip_prefix("*mut ") {
        return format!("*mut {}", class_ours(p));
    }
    if let Some(p) = t.strip_prefix("*const ") {
        return format!("*const {}", class_ours(p));
    }
    match t {
        "c_int" | "c_uint" | "HipError" => "i32".into(),
        "usize" => "usize".into(),
        "f32" => "f32".into(),
        "c_char" => "char".into(),
        "c_void" => "opaque".into(),
        "Stream" | "Module" | "Function" | "Event" | "Graph" | "GraphExec" | "GraphNode" => {
            "*mut opaque".into()
        }
        other => panic!("ffi.rs uses type `{other}`, which this test does not classify"),
    }
}

/// bindgen's output, parsed: type aliases, functions, constants, layouts.
struct Header {
    aliases: HashMap<String, String>,
    opaque: Vec<String>,
    functions: HashMap<String, (Vec<String>, String)>,
    consts: HashMap<String, i64>,
    sizes: HashMap<String, i64>,
    offsets: HashMap<(String, String), i64>,
}

fn strip_std(t: &str) -> String {
    t.replace("::std::os::raw::", "")
        .replace("::core::ffi::", "")
        .replace("::std::ffi::", "")
        .trim()
        .to_string()
}

impl Header {
    fn parse(text: &str) -> Header {
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut h = Header {
            aliases: HashMap::new(),
            opaque: Vec::new(),
            functions: HashMap::new(),
            consts: HashMap::new(),
            sizes: HashMap::new(),
            offsets: HashMap::new(),
        };
        for stmt in flat.split(';') {
            let s = stmt.trim();
            let s = s.rsplit_once("] ").map_or(s, |(_, r)| r).trim(); // attributes
            if let Some(rest) = s.find("pub type ").map(|i| &s[i + 9..]) {
                if let Some((n, t)) = rest.split_once(" = ") {
                    h.aliases.insert(n.trim().into(), strip_std(t));
                }
            } else if let Some(rest) = s.find("pub const ").map(|i| &s[i + 10..]) {
                if let Some((n, rest)) = rest.split_once(':') {
                    if let Some((_, v)) = rest.split_once(" = ") {
                        if let Ok(v) = v.trim().parse() {
                            h.consts.insert(n.trim().into(), v);
                        }
                    }
                }
            } else if let Some(rest) = s.find("pub fn ").map(|i| &s[i + 7..]) {
                if let Some((name, sig)) = rest.split_once('(') {
                    let (args, ret) = sig.rsplit_once(')').expect("fn args");
                    let args = args
                        .split(", ")
                        .filter(|a| !a.trim().is_empty())
                        .map(|a| strip_std(a.split_once(": ").map_or(a, |(_, t)| t)))
                        .collect();
                    let ret = strip_std(ret.trim().strip_prefix("->").unwrap_or("()"));
                    h.functions.insert(name.trim().into(), (args, ret));
                }
            }
        }
        // Opaque structs.
        for line in text.lines() {
            if let Some(rest) = line.trim().strip_prefix("pub struct ") {
                let name = rest.split([' ', '{', ';', '(']).next().unwrap_or("");
                h.opaque.push(name.to_string());
            }
        }
        // Layout facts, from bindgen's layout assertions (wrapped anywhere):
        // ["Size of X"][::std::mem::size_of::<X>() - 1472usize];
        // ["Offset of field: X::f"][::std::mem::offset_of!(X, f) - 1160usize];
        for (marker, is_size) in [("[\"Size of ", true), ("[\"Offset of field: ", false)] {
            for chunk in flat.split(marker).skip(1) {
                let (what, rest) = chunk.split_once('"').expect("closing quote");
                let n = rest
                    .split_once("usize]")
                    .and_then(|(e, _)| e.rsplit(" - ").next())
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or_else(|| {
                        panic!("unreadable layout assertion for {what}: {rest:.80}")
                    });
                if is_size {
                    h.sizes.insert(what.into(), n);
                } else if let Some((st, f)) = what.split_once("::") {
                    h.offsets.insert((st.into(), f.into()), n);
                }
            }
        }
        h
    }

    fn class(&self, t: &str) -> String {
        let t = strip_std(t);
        if let Some(p) = t.strip_prefix("*mut ") {
            return format!("*mut {}", self.class(p));
        }
        if let Some(p) = t.strip_prefix("*const ") {
            return format!("*const {}", self.class(p));
        }
        match t.as_str() {
            "c_int" | "c_uint" => "i32".into(),
            "usize" => "usize".into(),
            "f32" => "f32".into(),
            "c_char" => "char".into(),
            "c_void" => "opaque".into(),
            other => match self.aliases.get(other) {
                Some(a) => self.class(a),
                // Structs reached only through pointers are handles.
                None if self.opaque.iter().any(|o| o == other) => "opaque".into(),
                None => format!("?{other}"),
            },
        }
    }
}

/// bindgen's view of the 6.4.3 headers, for the items `ffi` declares; None
/// (after a loud SKIPPED) without the headers or libclang.
fn generate(ffi: &str) -> Option<Header> {
    let include = rocm().join("include");
    let header = include.join("hip/hip_runtime_api.h");
    if !header.exists() {
        skip(&format!(
            "{} is missing (scripts/install-toolchains.sh extracts it)",
            header.display()
        ));
        return None;
    }
    let libclang = std::env::var_os("LIBCLANG_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join(".toolchains/libclang/clang/native")
        });
    if !libclang.join("libclang.so").exists() {
        skip(&format!(
            "no libclang.so in {} (set LIBCLANG_PATH)",
            libclang.display()
        ));
        return None;
    }
    std::env::set_var("LIBCLANG_PATH", &libclang);
    let builtin = rocm().join("sysroot/usr/lib/llvm-21/lib/clang/21/include");
    let entries = table(ffi);
    let mut b = bindgen::Builder::default()
        // hip_deprecated.h holds the legacy R0000 layout; hip_runtime_api.h
        // does not include it.
        .header_contents(
            "dsv4_hip_items.h",
            "#include <hip/hip_runtime_api.h>\n#include <hip/hip_deprecated.h>\n",
        )
        .clang_args(["-x", "c", "-D__HIP_PLATFORM_AMD__"])
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-isystem{}", builtin.display()))
        .prepend_enum_name(false)
        // Doc comments hold `;` and would split the declarations read below.
        .generate_comments(false)
        .layout_tests(true);
    for e in &entries {
        let decl = DECLARED_AS
            .iter()
            .find(|(s, _)| *s == e.symbol)
            .map_or(e.symbol.as_str(), |(_, d)| d);
        b = b.allowlist_function(decl);
    }
    for t in [
        "hipDeviceProp_tR0600",
        "hipDeviceProp_tR0000",
        "hipError_t",
        "hipMemcpyKind",
        "hipStreamCaptureMode",
    ] {
        b = b.allowlist_type(t);
    }
    let text = b
        .generate()
        .unwrap_or_else(|e| panic!("bindgen on {}: {e}", header.display()))
        .to_string();
    // DSV4_KVCACHE_BINDGEN_OUT=FILE keeps what bindgen generated, to read.
    if let Some(out) = std::env::var_os("DSV4_KVCACHE_BINDGEN_OUT") {
        std::fs::write(&out, &text).expect("DSV4_KVCACHE_BINDGEN_OUT is writable");
    }
    Some(Header::parse(&text))
}

/// Every disagreement between `ffi` (the text of ffi.rs) and the headers,
/// each naming its item.
fn check(ffi: &str, h: &Header) -> Vec<String> {
    let entries = table(ffi);
    let mut bad = Vec::new();
    // Functions.
    for e in &entries {
        let decl = DECLARED_AS
            .iter()
            .find(|(s, _)| *s == e.symbol)
            .map_or(e.symbol.as_str(), |(_, d)| d);
        let Some((args, ret)) = h.functions.get(decl) else {
            bad.push(format!(
                "{}: not declared in hip_runtime_api.h 6.4",
                e.symbol
            ));
            continue;
        };
        let theirs: Vec<String> = args.iter().map(|a| h.class(a)).collect();
        let ours: Vec<String> = e.args.iter().map(|a| class_ours(a)).collect();
        // Pointers to handles and to data are both pointers to opaque memory
        // for the ABI; the const/mut distinction is kept.
        let flatten = |v: &[String]| -> Vec<String> {
            v.iter()
                .map(|c| {
                    c.replace("*mut opaque", "ptr")
                        .replace("*const opaque", "cptr")
                })
                .collect()
        };
        if flatten(&theirs) != flatten(&ours) || h.class(ret) != class_ours(&e.ret) {
            bad.push(format!(
                "{} ({decl}): ffi.rs has ({}) -> {}, the header ({}) -> {}",
                e.symbol,
                ours.join(", "),
                class_ours(&e.ret),
                theirs.join(", "),
                h.class(ret)
            ));
        }
    }
    // Constants.
    let ours = constants(ffi);
    for (name, value) in &ours {
        let Some((_, meaning)) = CONSTANTS.iter().find(|(n, _)| n == name) else {
            bad.push(format!(
                "{name}: ffi.rs declares it but this test does not know what it stands for"
            ));
            continue;
        };
        match meaning {
            Meaning::Enum(e) => match h.consts.get(*e) {
                Some(v) if v == value => {}
                other => bad.push(format!("{name} = {value}: the header's {e} is {other:?}")),
            },
            Meaning::Offset(s, f) => match h.offsets.get(&(s.to_string(), f.to_string())) {
                Some(v) if v == value => {}
                other => bad.push(format!(
                    "{name} = {value}: the header's offset of {s}::{f} is {other:?}"
                )),
            },
            Meaning::AtLeastSizeOf(structs) => {
                for s in *structs {
                    match h.sizes.get(*s) {
                        Some(v) if v <= value => {}
                        other => bad.push(format!("{name} = {value}: sizeof({s}) is {other:?}")),
                    }
                }
            }
        }
    }
    for (name, _) in CONSTANTS {
        if !ours.iter().any(|(n, _)| n == name) {
            bad.push(format!("{name}: listed here but no longer in ffi.rs"));
        }
    }
    // find_arch_name skips the marketing name: `char name[256]` first.
    for s in ["hipDeviceProp_tR0600", "hipDeviceProp_tR0000"] {
        let name = h.offsets.get(&(s.into(), "name".into()));
        let next = h
            .offsets
            .iter()
            .filter(|((st, _), &o)| st == s && o > 0)
            .map(|(_, &o)| o)
            .min();
        if name != Some(&0) || next != Some(256) {
            bad.push(format!(
                "{s}: name at {name:?}, next field at {next:?}; find_arch_name assumes 0 and 256"
            ));
        }
    }
    println!(
        "bindgen on ROCm 6.4.3 hip_runtime_api.h: {} functions, {} constants checked; sizeof R0600 {:?}, R0000 {:?}",
        entries.len(),
        ours.len(),
        h.sizes.get("hipDeviceProp_tR0600"),
        h.sizes.get("hipDeviceProp_tR0000")
    );
    bad
}

#[test]
fn ffi_matches_rocm_6_4_headers() {
    let Some(h) = generate(FFI) else { return };
    let bad = check(FFI, &h);
    assert!(
        bad.is_empty(),
        "ffi.rs disagrees with ROCm 6.4.3's headers:\n  {}",
        bad.join("\n  ")
    );
}

/// A copy of ffi.rs with a wrong enum value, a wrong parameter type and a
/// wrong struct offset: each is reported by name.
#[test]
fn a_wrong_item_is_named() {
    let wrong = FFI
        .replace("MEMCPY_D2H: c_int = 2;", "MEMCPY_D2H: c_int = 4;")
        .replace(
            "fn(*mut c_void, c_int, usize, Stream) -> HipError",
            "fn(*mut c_void, c_int, c_uint, Stream) -> HipError",
        )
        .replace(
            "GCN_ARCH_NAME_OFFSET_R0600: usize = 1160;",
            "GCN_ARCH_NAME_OFFSET_R0600: usize = 1164;",
        );
    assert_ne!(wrong, FFI);
    let Some(h) = generate(&wrong) else { return };
    let bad = check(&wrong, &h).join("\n");
    for item in ["MEMCPY_D2H", "hipMemsetAsync", "GCN_ARCH_NAME_OFFSET_R0600"] {
        assert!(bad.contains(item), "{item} is not named in:\n{bad}");
    }
    assert_eq!(bad.lines().count(), 3, "{bad}");
}
