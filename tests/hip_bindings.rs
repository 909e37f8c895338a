//! The HIP bindings (`src/backend/hip/ffi.rs`) against ROCm's own headers,
//! without ROCm and without a GPU:
//!
//! * every function the backend resolves, argument by argument and its
//!   return type, against the bindgen output of ROCm 6.2 to 7.x headers that
//!   the `cubecl-hip-sys` crate ships (`src/bindings/bindings_<patch>.rs`,
//!   one file per HIP release; found through `cargo metadata`);
//! * every constant `ffi.rs` defines (error codes, memcpy kinds, capture
//!   mode, the `gcnArchName` offsets, the properties buffer size) against
//!   the same files, the offsets through the C layout of
//!   `hipDeviceProp_tR0600` computed from its field list;
//! * the test HIP runtime (`hip-on-cuda/`): it exports every one of those
//!   functions with the same signature, returns HIP's error codes under
//!   HIP's names, and fills the properties fields at their offsets;
//! * where ROCm's headers are installed (`$ROCM_PATH/include`, the ROCm CI
//!   container), a host program compiled against them prints the layouts and
//!   constants, the legacy `hipDeviceProp_tR0000` included (bindgen output
//!   of it is not shipped).
//!
//! `ffi.rs` is read as text from the crate root, as are the bindings: the
//! comparison is of declarations, and a text comparison names the symbol,
//! argument and ROCm release that differ, where a type-level one would
//! only fail to compile (and would need one build per ROCm release, since
//! `cubecl-hip-sys` selects one release per build). The parser accepts the
//! `name = "symbol": fn(args) -> ret;` table wherever it sits in the file;
//! the layout calculator is checked against the compiler on a struct of
//! this file (`calculator_matches_the_compiler`).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_uint};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

const FFI: &str = "src/backend/hip/ffi.rs";
const SHIM: &str = "hip-on-cuda/src/lib.rs";
const SHIM_PROPS: &str = "hip-on-cuda/src/props.rs";

/// The Rust array literal after `marker` in `src` (file `file`), up to its `];`.
fn table_after<'a>(src: &'a str, marker: &str, file: &str) -> &'a str {
    let table = src
        .split(marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no `{marker}` table in {file}"));
    &table[..table
        .find("];")
        .unwrap_or_else(|| panic!("end of `{marker}` in {file}"))]
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---- declarations as text ----------------------------------------------------

/// A C function declaration: argument types and return type, as written.
#[derive(Debug, Clone)]
struct Decl {
    args: Vec<String>,
    ret: String,
}

/// `text[open]` is `(`: the index of its matching `)`.
fn close_paren(text: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses at {open}");
}

/// Splits an argument list at top-level commas, dropping empty pieces.
fn split_args(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in s.chars() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    out.push(cur.trim().to_string());
    out.retain(|a| !a.is_empty());
    out
}

/// Drops the `name:` of a `name: Type` argument.
fn arg_type(a: &str) -> String {
    match a.split_once(':') {
        Some((name, ty)) if !name.contains('*') && !name.trim().contains(' ') => ty.trim().into(),
        _ => a.trim().into(),
    }
}

/// The return type after `)`: `-> T` up to `;`, `{` or end of line.
fn ret_after(text: &str, close: usize) -> String {
    let rest = text[close + 1..].trim_start();
    match rest.strip_prefix("->") {
        Some(r) => r
            .split([';', '{', '\n'])
            .next()
            .unwrap_or_default()
            .trim()
            .to_string(),
        None => "()".into(),
    }
}

/// The `ident = "symbol": fn(args) -> ret;` entries of `ffi.rs`'s symbol
/// table, with whether each is required (it comes before `optional {`).
fn ffi_functions(src: &str) -> BTreeMap<String, (Decl, bool)> {
    let optional_from = src.find("optional {").unwrap_or(src.len());
    let mut out = BTreeMap::new();
    let mut from = 0;
    while let Some(i) = src[from..].find("\": fn(") {
        let at = from + i;
        let sym_start = src[..at].rfind('"').expect("opening quote") + 1;
        let sym = &src[sym_start..at];
        let open = at + "\": fn".len();
        let close = close_paren(src, open);
        let args = split_args(&src[open + 1..close])
            .iter()
            .map(|a| arg_type(a))
            .collect();
        let decl = Decl {
            args,
            ret: ret_after(src, close),
        };
        out.insert(sym.to_string(), (decl, at < optional_from));
        from = close;
    }
    out
}

/// `pub fn NAME(args) -> ret;` declarations (bindgen's extern blocks) and
/// `extern "C" fn NAME(args) -> ret {` / `entry!(NAME(args) {` definitions
/// (the test runtime), for names starting with `hip`.
fn c_functions(src: &str, implicit_ret: &str) -> BTreeMap<String, Decl> {
    let mut out = BTreeMap::new();
    for (marker, ret_implicit) in [
        ("pub fn hip", false),
        ("extern \"C\" fn hip", false),
        ("entry!(hip", true),
    ] {
        let mut from = 0;
        while let Some(i) = src[from..].find(marker) {
            let name_start = from + i + marker.len() - 3;
            let open = name_start + src[name_start..].find('(').expect("(");
            let name = src[name_start..open].trim().to_string();
            let close = close_paren(src, open);
            let args = split_args(&src[open + 1..close])
                .iter()
                .map(|a| arg_type(a))
                .collect();
            let ret = if ret_implicit {
                implicit_ret.to_string()
            } else {
                ret_after(src, close)
            };
            if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.insert(name, Decl { args, ret });
            }
            from = close;
        }
    }
    out
}

/// `type A = B;` aliases (any visibility).
fn aliases(src: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for line in src.lines() {
        let l = line.trim();
        let Some(rest) = l.split_once("type ").filter(|(pre, _)| {
            pre.is_empty() || pre.ends_with("pub ") || pre.ends_with("pub(crate) ")
        }) else {
            continue;
        };
        if let Some((name, ty)) = rest.1.split_once(" = ") {
            out.insert(
                name.trim().to_string(),
                ty.trim_end_matches(';').trim().to_string(),
            );
        }
    }
    out
}

/// `const NAME: T = value;` integer constants (any visibility).
fn consts(src: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in src.lines() {
        let l = line.trim();
        let Some((_, rest)) = l.split_once("const ") else {
            continue;
        };
        if !(l.starts_with("const ")
            || l.starts_with("pub const ")
            || l.starts_with("pub(crate) const "))
        {
            continue;
        }
        let Some((name, rest)) = rest.split_once(':') else {
            continue;
        };
        let Some((_, value)) = rest.split_once('=') else {
            continue;
        };
        let v = value.trim().trim_end_matches(';').replace('_', "");
        let v = v
            .trim_end_matches("usize")
            .trim_end_matches("u32")
            .trim_end_matches("i32");
        if let Ok(n) = v.parse::<i64>() {
            out.insert(name.trim().to_string(), n);
        }
    }
    out
}

// ---- types -------------------------------------------------------------------

/// A type's ABI description: `i32`, `u32`, `usize`, `f32`, `void`,
/// `opaque NAME` (a struct), `*mut T`, `*const T`.
fn abi(t: &str, al: &HashMap<String, String>) -> String {
    let mut t = t.trim();
    for p in [
        "::std::os::raw::",
        "std::os::raw::",
        "::core::ffi::",
        "core::ffi::",
        "std::ffi::",
        "::std::ffi::",
    ] {
        if let Some(r) = t.strip_prefix(p) {
            t = r;
        }
    }
    if let Some(r) = t.strip_prefix("*mut ") {
        return format!("*mut {}", abi(r, al));
    }
    if let Some(r) = t.strip_prefix("*const ") {
        return format!("*const {}", abi(r, al));
    }
    match t {
        "c_int" | "i32" => "i32".into(),
        "c_uint" | "u32" => "u32".into(),
        "c_char" | "i8" => "i8".into(),
        "c_uchar" | "u8" => "u8".into(),
        "usize" | "size_t" => "usize".into(),
        "c_ulonglong" | "u64" => "u64".into(),
        "c_longlong" | "i64" => "i64".into(),
        "f32" | "c_float" => "f32".into(),
        "c_void" => "void".into(),
        "()" => "()".into(),
        _ => match al.get(t) {
            Some(target) => abi(target, al),
            None => format!("opaque {t}"),
        },
    }
}

/// Whether the ABI types `ours` and `theirs` agree; a note when they agree
/// only loosely (a `void` pointee for a typed one, or the sign of a 32-bit
/// integer, which a C enum leaves to the compiler).
fn agree(ours: &str, theirs: &str) -> Result<Option<String>, String> {
    if ours == theirs {
        return Ok(None);
    }
    for p in ["*mut ", "*const "] {
        if let (Some(a), Some(b)) = (ours.strip_prefix(p), theirs.strip_prefix(p)) {
            if a == "void"
                || (a.starts_with("opaque ") && (b == "void" || b.starts_with("opaque ")))
            {
                return Ok(Some(format!("{ours} for {theirs}")));
            }
            return agree(a, b);
        }
    }
    let int32 = ["i32", "u32"];
    if int32.contains(&ours) && int32.contains(&theirs) {
        return Ok(Some(format!("{ours} for {theirs}")));
    }
    Err(format!("{ours} where the header has {theirs}"))
}

/// Compares a declaration with the header's; returns notes, or errors.
fn compare(
    ours: &Decl,
    oal: &HashMap<String, String>,
    theirs: &Decl,
    tal: &HashMap<String, String>,
) -> Result<Vec<String>, Vec<String>> {
    let mut notes = Vec::new();
    let mut errs = Vec::new();
    if ours.args.len() != theirs.args.len() {
        errs.push(format!(
            "{} arguments where the header has {} ({:?} vs {:?})",
            ours.args.len(),
            theirs.args.len(),
            ours.args,
            theirs.args
        ));
        return Err(errs);
    }
    let pairs = ours
        .args
        .iter()
        .zip(&theirs.args)
        .enumerate()
        .map(|(i, (a, b))| (format!("argument {}", i + 1), a, b));
    for (what, a, b) in pairs.chain(std::iter::once((
        "return type".to_string(),
        &ours.ret,
        &theirs.ret,
    ))) {
        match agree(&abi(a, oal), &abi(b, tal)) {
            Ok(Some(n)) => notes.push(format!("{what}: {n}")),
            Ok(None) => {}
            Err(e) => errs.push(format!("{what}: {e}")),
        }
    }
    if errs.is_empty() {
        Ok(notes)
    } else {
        Err(errs)
    }
}

// ---- C layout ----------------------------------------------------------------

/// Struct definitions by name: their attributes (joined) and `(field, type)`s.
type Structs = HashMap<String, (String, Vec<(String, String)>)>;

/// `#[repr(C)]` structs of a Rust source: name -> (attributes, fields).
fn structs(src: &str) -> Structs {
    let mut out = HashMap::new();
    let lines: Vec<&str> = src.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        if let Some(rest) = l
            .strip_prefix("pub struct ")
            .or_else(|| l.strip_prefix("struct "))
        {
            if let Some(name) = rest
                .strip_suffix('{')
                .map(|n| n.trim().split('<').next().unwrap_or("").to_string())
            {
                let mut attrs = String::new();
                let mut j = i;
                while j > 0 && lines[j - 1].trim().starts_with("#[") {
                    j -= 1;
                    attrs.push_str(lines[j].trim());
                }
                let mut fields = Vec::new();
                i += 1;
                while i < lines.len() && lines[i].trim() != "}" {
                    let f = lines[i].trim();
                    if let Some(f) = f.strip_prefix("pub ").filter(|_| !f.starts_with("#[")) {
                        if let Some((n, t)) = f.split_once(": ") {
                            fields.push((
                                n.trim().to_string(),
                                t.trim().trim_end_matches(',').to_string(),
                            ));
                        }
                    }
                    i += 1;
                }
                out.insert(name, (attrs, fields));
            }
        }
        i += 1;
    }
    out
}

struct Layout<'a> {
    structs: &'a Structs,
    aliases: &'a HashMap<String, String>,
}

impl Layout<'_> {
    /// Size and alignment of a field type, as C (and `#[repr(C)]`) lays it out.
    fn size_align(&self, t: &str) -> (usize, usize) {
        let t = t.trim();
        if t.starts_with('*') {
            return (8, 8);
        }
        if let Some(inner) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let (elem, n) = inner.rsplit_once(';').expect("[T; N]");
            let n: usize = n
                .trim()
                .trim_end_matches("usize")
                .parse()
                .expect("array length");
            let (s, a) = self.size_align(elem);
            return (s * n, a);
        }
        if let Some(r) = t.strip_prefix("__BindgenBitfieldUnit<") {
            // A byte array: `__BindgenBitfieldUnit<[u8; N]>`.
            return self.size_align(r.trim_end_matches('>'));
        }
        match abi(t, self.aliases).as_str() {
            "i8" | "u8" => (1, 1),
            "i32" | "u32" | "f32" => (4, 4),
            "usize" | "u64" | "i64" => (8, 8),
            a if a.starts_with('*') => (8, 8),
            _ => {
                let name = t.rsplit("::").next().unwrap_or(t);
                let name = self.aliases.get(name).map(String::as_str).unwrap_or(name);
                let (size, align, _) = self.layout(name);
                (size, align)
            }
        }
    }

    /// Size, alignment and field offsets of struct `name`.
    fn layout(&self, name: &str) -> (usize, usize, BTreeMap<String, usize>) {
        let (attrs, fields) = self
            .structs
            .get(name)
            .unwrap_or_else(|| panic!("no struct {name}"));
        assert!(attrs.contains("repr(C"), "{name} is not repr(C): {attrs}");
        let (mut off, mut align, mut offs) = (0usize, 1usize, BTreeMap::new());
        for (f, t) in fields {
            let (s, a) = self.size_align(t);
            off = off.next_multiple_of(a);
            offs.insert(f.clone(), off);
            off += s;
            align = align.max(a);
        }
        if let Some(n) = attrs
            .split("align(")
            .nth(1)
            .and_then(|r| r.split(')').next())
        {
            align = align.max(n.parse().expect("align(N)"));
        }
        (off.next_multiple_of(align), align, offs)
    }
}

// The calculator's own check: a struct with every kind of field the
// properties struct has, laid out by the compiler.
#[allow(dead_code, non_camel_case_types)]
#[repr(C)]
pub struct __BindgenBitfieldUnit<S> {
    pub storage: S,
}
#[allow(dead_code)]
#[repr(C)]
pub struct CalcInner {
    pub bytes: [::std::os::raw::c_char; 5usize],
}
#[allow(dead_code)]
#[repr(C)]
#[repr(align(4))]
pub struct CalcBits {
    pub _bitfield_align_1: [u8; 0],
    pub _bitfield_1: __BindgenBitfieldUnit<[u8; 3usize]>,
    pub __bindgen_padding_0: u8,
}
#[allow(dead_code)]
#[repr(C)]
pub struct CalcProbe {
    pub a: [::std::os::raw::c_char; 3usize],
    pub b: usize,
    pub c: CalcInner,
    pub d: ::std::os::raw::c_uint,
    pub e: [::std::os::raw::c_int; 3usize],
    pub f: CalcBits,
    pub g: *mut ::std::os::raw::c_uint,
    pub h: ::std::os::raw::c_int,
    pub i: CalcBits,
}

#[test]
fn calculator_matches_the_compiler() {
    let src = read("tests/hip_bindings.rs");
    let st = structs(&src);
    let al = HashMap::new();
    let l = Layout {
        structs: &st,
        aliases: &al,
    };
    let (size, align, offs) = l.layout("CalcProbe");
    assert_eq!(size, std::mem::size_of::<CalcProbe>());
    assert_eq!(align, std::mem::align_of::<CalcProbe>());
    let want = [
        ("a", std::mem::offset_of!(CalcProbe, a)),
        ("b", std::mem::offset_of!(CalcProbe, b)),
        ("c", std::mem::offset_of!(CalcProbe, c)),
        ("d", std::mem::offset_of!(CalcProbe, d)),
        ("e", std::mem::offset_of!(CalcProbe, e)),
        ("f", std::mem::offset_of!(CalcProbe, f)),
        ("g", std::mem::offset_of!(CalcProbe, g)),
        ("h", std::mem::offset_of!(CalcProbe, h)),
        ("i", std::mem::offset_of!(CalcProbe, i)),
    ];
    for (f, o) in want {
        assert_eq!(offs[f], o, "offset of {f}");
    }
}

// ---- the header files --------------------------------------------------------

/// The `cubecl-hip-sys` source folder, from `cargo metadata` (offline first).
fn bindings_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let mut last = String::new();
    for offline in [true, false] {
        let mut cmd = std::process::Command::new(&cargo);
        cmd.args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(root().join("Cargo.toml"));
        if offline {
            cmd.arg("--offline");
        }
        let out = cmd.output().expect("cargo metadata runs");
        if !out.status.success() {
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        let pkg = v["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|p| p["name"] == "cubecl-hip-sys")
            .expect("cubecl-hip-sys is a dev-dependency");
        let manifest = PathBuf::from(pkg["manifest_path"].as_str().expect("manifest_path"));
        return manifest.parent().expect("folder").join("src/bindings");
    }
    panic!("cargo metadata failed: {last}");
}

/// One HIP release's bindgen output.
struct Header {
    version: i64,
    functions: BTreeMap<String, Decl>,
    aliases: HashMap<String, String>,
    consts: BTreeMap<String, i64>,
    structs: Structs,
}

impl Header {
    fn release(&self) -> String {
        let v = self.version;
        format!(
            "HIP {}.{}.{}",
            v / 10_000_000,
            v / 100_000 % 100,
            v % 100_000
        )
    }

    fn layout(&self) -> Layout<'_> {
        Layout {
            structs: &self.structs,
            aliases: &self.aliases,
        }
    }
}

fn headers() -> Vec<Header> {
    let dir = bindings_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bindings_") && n.ends_with(".rs"))
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let src = std::fs::read_to_string(p).expect("bindings file");
            let consts = consts(&src);
            Header {
                version: *consts.get("HIP_VERSION").expect("HIP_VERSION"),
                functions: c_functions(&src, "hipError_t"),
                aliases: aliases(&src),
                consts,
                structs: structs(&src),
            }
        })
        .collect()
}

/// What each constant of `ffi.rs` is in the headers.
enum Counterpart {
    /// A header constant (an enumerator, as bindgen names it).
    Const(&'static str),
    /// The offset of a field of a struct.
    Offset(&'static str, &'static str),
    /// At least the size of each struct.
    AtLeastSizeOf(&'static [&'static str]),
    /// Not in the bindgen output; checked against the installed headers by
    /// `installed_rocm_headers_agree`.
    HeaderProbeOnly,
}

const FFI_CONSTS: &[(&str, Counterpart)] = &[
    ("HIP_SUCCESS", Counterpart::Const("hipError_t_hipSuccess")),
    (
        "HIP_ERROR_NO_DEVICE",
        Counterpart::Const("hipError_t_hipErrorNoDevice"),
    ),
    (
        "MEMCPY_H2D",
        Counterpart::Const("hipMemcpyKind_hipMemcpyHostToDevice"),
    ),
    (
        "MEMCPY_D2H",
        Counterpart::Const("hipMemcpyKind_hipMemcpyDeviceToHost"),
    ),
    (
        "MEMCPY_D2D",
        Counterpart::Const("hipMemcpyKind_hipMemcpyDeviceToDevice"),
    ),
    (
        "CAPTURE_MODE_THREAD_LOCAL",
        Counterpart::Const("hipStreamCaptureMode_hipStreamCaptureModeThreadLocal"),
    ),
    (
        "GCN_ARCH_NAME_OFFSET_R0600",
        Counterpart::Offset("hipDeviceProp_tR0600", "gcnArchName"),
    ),
    ("GCN_ARCH_NAME_OFFSET_R0000", Counterpart::HeaderProbeOnly),
    (
        "DEVICE_PROP_BYTES",
        Counterpart::AtLeastSizeOf(&["hipDeviceProp_tR0600"]),
    ),
];

/// Checks `ffi` (the text of `ffi.rs`) against every header: the errors, and
/// the loose agreements that are not the usual two (a handle declared as
/// `*mut c_void`, a C enum declared as `c_int`), each with the releases.
fn check_ffi(ffi: &str, hs: &[Header]) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let fal = aliases(ffi);
    let ours = ffi_functions(ffi);
    assert!(
        ours.len() >= 20 && ours.contains_key("hipModuleLaunchKernel"),
        "found only {} declarations in {FFI}: did the symbol table's syntax change? {:?}",
        ours.len(),
        ours.keys()
    );
    let ffi_consts = consts(ffi);
    let mut errors = Vec::new();
    let mut notes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for h in hs {
        for (sym, (decl, required)) in &ours {
            match h.functions.get(sym) {
                None if *required => errors.push(format!(
                    "{sym}: required by {FFI} but not declared by {}",
                    h.release()
                )),
                None => notes
                    .entry(format!("{sym} (optional) is not declared"))
                    .or_default()
                    .push(h.release()),
                Some(theirs) => match compare(decl, &fal, theirs, &h.aliases) {
                    Ok(n) => {
                        for n in n {
                            let usual = n.ends_with("i32 for u32")
                                || (n.contains("*mut void for *mut opaque ")
                                    && !n.contains("*mut *mut opaque"));
                            if !usual {
                                notes
                                    .entry(format!("{sym} {n}"))
                                    .or_default()
                                    .push(h.release());
                            }
                        }
                    }
                    Err(es) => {
                        for e in es {
                            errors.push(format!("{sym}: {e} ({})", h.release()));
                        }
                    }
                },
            }
        }
        for (name, value) in &ffi_consts {
            let Some((_, what)) = FFI_CONSTS.iter().find(|(n, _)| n == name) else {
                errors.push(format!(
                    "{name}: {FFI} defines it but tests/hip_bindings.rs does not know its header counterpart (add it to FFI_CONSTS)"
                ));
                continue;
            };
            match what {
                Counterpart::Const(c) => match h.consts.get(*c) {
                    Some(v) if v == value => {}
                    Some(v) => errors.push(format!(
                        "{name} = {value}, but {c} = {v} in {}",
                        h.release()
                    )),
                    None => errors.push(format!("{name}: {c} not found in {}", h.release())),
                },
                Counterpart::Offset(s, f) => {
                    let (_, _, offs) = h.layout().layout(s);
                    let o = offs.get(*f).copied();
                    if o != Some(*value as usize) {
                        errors.push(format!(
                            "{name} = {value}, but {s}::{f} is at {o:?} in {}",
                            h.release()
                        ));
                    }
                }
                Counterpart::AtLeastSizeOf(ss) => {
                    for s in *ss {
                        let (size, _, _) = h.layout().layout(s);
                        if (*value as usize) < size {
                            errors.push(format!(
                                "{name} = {value} < sizeof({s}) = {size} in {}",
                                h.release()
                            ));
                        }
                    }
                }
                Counterpart::HeaderProbeOnly => {}
            }
        }
    }
    (errors, notes)
}

#[test]
fn ffi_matches_rocm_headers() {
    let hs = headers();
    assert!(
        hs.iter().any(|h| h.version / 10_000_000 == 6),
        "no ROCm 6.x bindings"
    );
    assert!(
        hs.iter().any(|h| h.version / 10_000_000 == 7),
        "no ROCm 7.x bindings"
    );
    let (errors, notes) = check_ffi(&read(FFI), &hs);
    for h in &hs {
        let (size, _, offs) = h.layout().layout("hipDeviceProp_tR0600");
        println!(
            "{}: sizeof(hipDeviceProp_tR0600) = {size}, gcnArchName at {}",
            h.release(),
            offs["gcnArchName"]
        );
    }
    for (what, releases) in &notes {
        let which = if releases.len() == hs.len() {
            "every release".to_string()
        } else {
            releases.join(", ")
        };
        println!("note: {what} [{which}]");
    }
    assert!(
        errors.is_empty(),
        "{FFI} disagrees with ROCm's headers:\n  {}",
        errors.join("\n  ")
    );
}

/// The check can fail, by name: a dropped argument, a wrong argument type
/// and a wrong constant in a copy of `ffi.rs`.
#[test]
fn a_wrong_declaration_fails_by_name() {
    let hs = headers();
    let ffi = read(FFI);
    let bad = ffi
        .replace(
            "fn(*mut Function, Module, *const c_char)",
            "fn(*mut Function, Module)",
        )
        .replace("fn(*mut f32, Event, Event)", "fn(*mut f64, Event, Event)")
        .replace("MEMCPY_D2H: c_int = 2", "MEMCPY_D2H: c_int = 3");
    assert_ne!(bad, ffi, "the replacements apply to {FFI}");
    let (errors, _) = check_ffi(&bad, &hs);
    let all = errors.join("\n");
    assert!(
        all.contains("hipModuleGetFunction: 2 arguments where the header has 3"),
        "{all}"
    );
    assert!(all.contains("hipEventElapsedTime: argument 1"), "{all}");
    assert!(
        all.contains("MEMCPY_D2H = 3, but hipMemcpyKind_hipMemcpyDeviceToHost = 2"),
        "{all}"
    );
}

#[test]
fn test_runtime_exports_every_entry_point() {
    let ffi = read(FFI);
    let shim_src = read(SHIM);
    let sal = aliases(&shim_src);
    let shim = c_functions(&shim_src, "HipError");
    let hs = headers();
    let newest = hs.iter().max_by_key(|h| h.version).expect("headers");
    let mut errors = Vec::new();
    for sym in ffi_functions(&ffi).keys() {
        let Some(ours) = shim.get(sym) else {
            errors.push(format!(
                "{sym}: resolved by the backend ({FFI}) but not exported by {SHIM}"
            ));
            continue;
        };
        let Some(theirs) = newest.functions.get(sym) else {
            continue;
        };
        if let Err(es) = compare(ours, &sal, theirs, &newest.aliases) {
            for e in es {
                errors.push(format!("{SHIM} {sym}: {e} ({})", newest.release()));
            }
        }
    }
    // The error codes it returns, under HIP's names.
    let shim_consts = consts(&shim_src);
    let mut named = 0;
    let table = table_after(&shim_src, "const ERRORS", SHIM);
    let mut from = 0;
    while let Some(i) = table[from..].find("c\"hip") {
        let at = from + i;
        let entry = table[..at].rfind('(').expect("(code, name, text)");
        let code = table[entry + 1..at].trim().trim_end_matches(',').trim();
        let name = table[at + 2..].split('"').next().expect("name");
        let code = code
            .parse::<i64>()
            .ok()
            .or_else(|| shim_consts.get(code).copied());
        let want = newest.consts.get(&format!("hipError_t_{name}"));
        if code.is_none() || code != want.copied() {
            errors.push(format!(
                "{SHIM}: {name} is {code:?}, the header says {want:?}"
            ));
        }
        named += 1;
        // Past this entry's message string.
        from = at + 2 + table[at + 2..].find(')').unwrap_or(0);
    }
    assert!(named >= 10, "found {named} error names in {SHIM}");
    // The properties it fills, at the header's offsets.
    let props = read(SHIM_PROPS);
    let (size, _, offs) = newest.layout().layout("hipDeviceProp_tR0600");
    let pconsts = consts(&props);
    assert_eq!(
        pconsts.get("R0600_SIZE").copied(),
        Some(size as i64),
        "R0600_SIZE in {SHIM_PROPS}"
    );
    let table = table_after(&props, "R0600_FIELDS: ", SHIM_PROPS);
    let mut fields = 0;
    for entry in table.split("(\"").skip(1) {
        let (field, rest) = entry.split_once('"').expect("field name");
        let off: usize = rest
            .trim_start_matches(',')
            .split(')')
            .next()
            .expect("offset")
            .trim()
            .parse()
            .expect("offset number");
        if offs.get(field) != Some(&off) {
            errors.push(format!(
                "{SHIM_PROPS}: {field} at {off}, the header puts it at {:?}",
                offs.get(field)
            ));
        }
        fields += 1;
    }
    assert!(fields >= 10, "R0600_FIELDS has {fields} entries");
    assert!(
        errors.is_empty(),
        "the test runtime disagrees:\n  {}",
        errors.join("\n  ")
    );
}

// ---- the installed headers ---------------------------------------------------

/// A host program printing layouts and constants from the installed headers.
const PROBE: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <hip/hip_runtime_api.h>
#if defined(PROBE_R0000) && __has_include(<hip/hip_deprecated.h>)
// ROCm 6 moved the legacy layout here; hip_runtime_api.h does not include it.
#include <hip/hip_deprecated.h>
#endif
int main(void) {
    printf("HIP_VERSION %d\n", (int)HIP_VERSION);
    printf("sizeof_R0600 %zu\n", sizeof(hipDeviceProp_tR0600));
    printf("gcnArchName_R0600 %zu\n", offsetof(hipDeviceProp_tR0600, gcnArchName));
    printf("hipSuccess %d\n", (int)hipSuccess);
    printf("hipErrorNoDevice %d\n", (int)hipErrorNoDevice);
    printf("hipMemcpyHostToDevice %d\n", (int)hipMemcpyHostToDevice);
    printf("hipMemcpyDeviceToHost %d\n", (int)hipMemcpyDeviceToHost);
    printf("hipMemcpyDeviceToDevice %d\n", (int)hipMemcpyDeviceToDevice);
    printf("hipStreamCaptureModeThreadLocal %d\n", (int)hipStreamCaptureModeThreadLocal);
    printf("sizeof_hipError_t %zu\n", sizeof(hipError_t));
#ifdef PROBE_R0000
    printf("sizeof_R0000 %zu\n", sizeof(hipDeviceProp_tR0000));
    printf("gcnArchName_R0000 %zu\n", offsetof(hipDeviceProp_tR0000, gcnArchName));
#endif
    return 0;
}
"#;

/// Compiles and runs [`PROBE`]; `None` if it does not compile.
fn run_probe(cc: &str, include: &Path, r0000: bool) -> Option<BTreeMap<String, i64>> {
    let dir = std::env::temp_dir().join(format!("dsv4-hip-probe-{}-{r0000}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let c = dir.join("probe.cpp");
    std::fs::write(&c, PROBE).expect("write probe");
    let exe = dir.join("probe");
    let mut cmd = std::process::Command::new(cc);
    cmd.arg("-D__HIP_PLATFORM_AMD__")
        .arg("-I")
        .arg(include)
        .arg(&c)
        .arg("-o")
        .arg(&exe);
    if r0000 {
        cmd.arg("-DPROBE_R0000");
    }
    let out = cmd.output().ok()?;
    if !out.status.success() {
        println!(
            "probe{} did not compile: {}",
            if r0000 { " (R0000)" } else { "" },
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let run = std::process::Command::new(&exe)
        .output()
        .expect("probe runs");
    let _ = std::fs::remove_dir_all(&dir);
    Some(
        String::from_utf8_lossy(&run.stdout)
            .lines()
            .filter_map(|l| {
                l.split_once(' ')
                    .and_then(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            })
            .collect(),
    )
}

#[test]
fn installed_rocm_headers_agree() {
    // $ROCM_PATH, /opt/rocm, or the ROCm 6.4.3 that scripts/install-toolchains.sh
    // extracts from Debian (which CI, with DSV4_KVCACHE_REQUIRE_KERNELS=1, must have).
    let local = root().join(".toolchains/rocm");
    let rocm = match std::env::var("ROCM_PATH") {
        Ok(p) => PathBuf::from(p),
        Err(_) if Path::new("/opt/rocm/include").is_dir() => PathBuf::from("/opt/rocm"),
        Err(_) => local.clone(),
    };
    let include = rocm.join("include");
    let required = std::env::var("DSV4_KVCACHE_REQUIRE_ROCM_HEADERS").as_deref() == Ok("1")
        || (rocm == local && std::env::var("DSV4_KVCACHE_REQUIRE_KERNELS").as_deref() == Ok("1"));
    if !include.join("hip/hip_runtime_api.h").is_file() {
        assert!(
            !required,
            "DSV4_KVCACHE_REQUIRE_ROCM_HEADERS=1 but {} has no hip/hip_runtime_api.h",
            include.display()
        );
        eprintln!(
            "\n*** SKIPPED installed_rocm_headers_agree: no ROCm headers in {} ***\n",
            include.display()
        );
        return;
    }
    // Compiled as host C++, as programs using the HIP runtime API are.
    let cc = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let p = run_probe(&cc, &include, false).unwrap_or_else(|| {
        panic!(
            "the header probe does not compile with {cc} against {}",
            include.display()
        )
    });
    println!("installed headers: {p:?}");
    let ffi = consts(&read(FFI));
    let mut errors = Vec::new();
    for (ours, theirs) in [
        ("HIP_SUCCESS", "hipSuccess"),
        ("HIP_ERROR_NO_DEVICE", "hipErrorNoDevice"),
        ("MEMCPY_H2D", "hipMemcpyHostToDevice"),
        ("MEMCPY_D2H", "hipMemcpyDeviceToHost"),
        ("MEMCPY_D2D", "hipMemcpyDeviceToDevice"),
        (
            "CAPTURE_MODE_THREAD_LOCAL",
            "hipStreamCaptureModeThreadLocal",
        ),
        ("GCN_ARCH_NAME_OFFSET_R0600", "gcnArchName_R0600"),
    ] {
        if ffi.get(ours) != p.get(theirs) {
            errors.push(format!(
                "{ours} = {:?}, the installed header says {theirs} = {:?}",
                ffi.get(ours),
                p.get(theirs)
            ));
        }
    }
    if p.get("sizeof_hipError_t") != Some(&(std::mem::size_of::<c_int>() as i64)) {
        errors.push(format!(
            "hipError_t is {:?} bytes, not an int",
            p.get("sizeof_hipError_t")
        ));
    }
    if ffi["DEVICE_PROP_BYTES"] < p["sizeof_R0600"] {
        errors.push("DEVICE_PROP_BYTES is smaller than hipDeviceProp_tR0600".into());
    }
    match run_probe(&cc, &include, true) {
        Some(q) => {
            if ffi.get("GCN_ARCH_NAME_OFFSET_R0000") != q.get("gcnArchName_R0000") {
                errors.push(format!(
                    "GCN_ARCH_NAME_OFFSET_R0000 = {:?}, the installed header says {:?}",
                    ffi.get("GCN_ARCH_NAME_OFFSET_R0000"),
                    q.get("gcnArchName_R0000")
                ));
            }
            if ffi["DEVICE_PROP_BYTES"] < q["sizeof_R0000"] {
                errors.push("DEVICE_PROP_BYTES is smaller than hipDeviceProp_tR0000".into());
            }
        }
        None => println!("note: these headers do not declare hipDeviceProp_tR0000 (the backend reads it only where hipGetDevicePropertiesR0600 is missing)"),
    }
    assert!(
        errors.is_empty(),
        "{FFI} disagrees with {}:\n  {}",
        include.display(),
        errors.join("\n  ")
    );
}

// Keeps the C integer types named above in use on every target.
const _: (c_char, c_uint) = (0, 0);
