//! Reads `kernels-hip/kv_abi.h` (the parameter blocks and the kernel list)
//! and generates the Rust side of the kernel ABI from it, plus a C header of
//! `static_assert`s that checks the kernel compilers' layout of every field
//! against the same offsets the Rust structs are checked against.

use std::fmt::Write as _;

/// One field of a parameter block.
pub struct Field {
    pub c_type: String,
    pub name: String,
    pub doc: String,
}

/// A parameter block (`struct KvXxxParams`).
pub struct Block {
    pub c_name: String,
    pub fields: Vec<Field>,
}

/// What `kv_abi.h` declares.
pub struct Abi {
    pub blocks: Vec<Block>,
    /// `(kernel symbol, parameter block)` in list order.
    pub kernels: Vec<(String, String)>,
    /// The integer `#define KV_…` constants (flags, layout codes, counters,
    /// lanes, threads), `(name, value)` in file order.
    pub defines: Vec<(String, u32)>,
}

/// An integer constant `#define KV_NAME 123` or `123u`, else `None`.
fn define(line: &str) -> Option<(String, u32)> {
    let mut w = line.strip_prefix("#define ")?.split_whitespace();
    let (name, value) = (w.next()?, w.next()?);
    if w.next().is_some() || !name.starts_with("KV_") || name.contains('(') {
        return None;
    }
    let v = value.strip_suffix('u').unwrap_or(value).parse().ok()?;
    Some((name.to_string(), v))
}

/// Size and alignment of a field type, and the Rust type that mirrors it.
fn scalar(c_type: &str) -> Option<(usize, usize, &'static str)> {
    if c_type.ends_with('*') {
        return Some((8, 8, "u64"));
    }
    Some(match c_type {
        "int32_t" | "int" => (4, 4, "i32"),
        "int64_t" => (8, 8, "i64"),
        "uint64_t" => (8, 8, "u64"),
        "uint32_t" | "unsigned" => (4, 4, "u32"),
        "float" => (4, 4, "f32"),
        _ => return None,
    })
}

/// The Rust name of a block: `KvCompressParams` -> `CompressParams`.
pub fn rust_block_name(c_name: &str) -> &str {
    c_name.strip_prefix("Kv").unwrap_or(c_name)
}

/// The Rust variant of a kernel: `kv_fused_cr2_team_v4` -> `FusedCr2TeamV4`.
fn variant(kernel: &str) -> String {
    kernel
        .strip_prefix("kv_")
        .unwrap_or(kernel)
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

pub fn parse(text: &str) -> Result<Abi, String> {
    let mut blocks = Vec::new();
    let mut kernels = Vec::new();
    let defines = text.lines().filter_map(|l| define(l.trim())).collect();
    let mut open: Option<Block> = None;
    let mut in_list = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let at = |msg: &str| format!("kernels-hip/kv_abi.h:{}: {msg}: `{line}`", i + 1);
        if let Some(b) = open.as_mut() {
            if line == "};" {
                blocks.push(open.take().expect("open block"));
                continue;
            }
            if line.is_empty() || line.starts_with("//") {
                continue;
            }
            let (decl, doc) = match line.split_once("//") {
                Some((d, c)) => (d.trim(), c.trim()),
                None => (line, ""),
            };
            let decl = decl
                .strip_suffix(';')
                .ok_or_else(|| at("a field is `type name;`"))?;
            let split = decl
                .rfind(|c: char| c.is_whitespace() || c == '*')
                .ok_or_else(|| at("a field is `type name;`"))?;
            let (ty, name) = decl.split_at(split + 1);
            let ty = ty.trim().trim_start_matches("const ").trim();
            b.fields.push(Field {
                c_type: ty.split_whitespace().collect::<Vec<_>>().join(" "),
                name: name.trim().to_string(),
                doc: doc.to_string(),
            });
            continue;
        }
        if let Some(rest) = line.strip_prefix("struct Kv") {
            if let Some(name) = rest.strip_suffix(" {") {
                if name.ends_with("Params") {
                    open = Some(Block {
                        c_name: format!("Kv{name}"),
                        fields: Vec::new(),
                    });
                }
            }
            continue;
        }
        if line.starts_with("#define KV_KERNELS(X)") {
            in_list = true;
            continue;
        }
        if in_list {
            let entry = line.trim_end_matches('\\').trim();
            if entry.is_empty() {
                in_list = false;
                continue;
            }
            let inner = entry
                .strip_prefix("X(")
                .and_then(|e| e.strip_suffix(')'))
                .ok_or_else(|| at("a KV_KERNELS entry is `X(name, KvXxxParams)`"))?;
            let (k, p) = inner
                .split_once(',')
                .ok_or_else(|| at("a KV_KERNELS entry is `X(name, KvXxxParams)`"))?;
            kernels.push((k.trim().to_string(), p.trim().to_string()));
            if !line.ends_with('\\') {
                in_list = false;
            }
        }
    }
    if open.is_some() {
        return Err("kernels-hip/kv_abi.h: a parameter block is not closed".into());
    }
    if kernels.is_empty() || blocks.is_empty() {
        return Err("kernels-hip/kv_abi.h: no parameter blocks or no KV_KERNELS list found".into());
    }
    for (k, p) in &kernels {
        if !blocks.iter().any(|b| &b.c_name == p) {
            return Err(format!(
                "kernels-hip/kv_abi.h: kernel {k} takes {p}, which is not a parameter block"
            ));
        }
    }
    Ok(Abi {
        blocks,
        kernels,
        defines,
    })
}

/// C layout of a block: each field's offset, and the block's size and alignment.
fn layout(abi: &Abi, b: &Block) -> Result<(Vec<usize>, usize, usize), String> {
    let mut offsets = Vec::new();
    let mut at = 0usize;
    let mut align = 1usize;
    for f in &b.fields {
        let (size, al) = match scalar(&f.c_type) {
            Some((s, a, _)) => (s, a),
            None => {
                let inner = abi
                    .blocks
                    .iter()
                    .find(|x| x.c_name == f.c_type)
                    .ok_or_else(|| format!("{}.{}: unknown type {}", b.c_name, f.name, f.c_type))?;
                let (_, s, a) = layout(abi, inner)?;
                (s, a)
            }
        };
        at = at.div_ceil(al) * al;
        offsets.push(at);
        at += size;
        align = align.max(al);
    }
    Ok((offsets, at.div_ceil(align) * align, align))
}

/// The Rust source: the parameter blocks with their layout asserts, and the
/// `Kernel` enum.
pub fn rust(abi: &Abi) -> Result<String, String> {
    let mut g = String::from(
        "// @generated by build.rs from kernels-hip/kv_abi.h: the kernel ABI's Rust side.\n",
    );
    g.push_str("/// The integer constants of kernels-hip/kv_abi.h, as the kernels see them.\n");
    g.push_str("#[allow(dead_code)]\npub mod defines {\n");
    for (name, v) in &abi.defines {
        let _ = writeln!(g, "    /// `{name}`.\n    pub const {name}: u32 = {v};");
    }
    g.push_str("    /// Every constant above, `(name, value)` in file order.\n");
    let _ = writeln!(
        g,
        "    pub const ALL: [(&str, u32); {}] = [",
        abi.defines.len()
    );
    for (name, _) in &abi.defines {
        let _ = writeln!(g, "        ({name:?}, {name}),");
    }
    g.push_str("    ];\n}\n\n");
    for b in &abi.blocks {
        let rname = rust_block_name(&b.c_name);
        let (offsets, size, _) = layout(abi, b)?;
        let _ = writeln!(g, "/// `{}` (kernels-hip/kv_abi.h).", b.c_name);
        let _ = writeln!(g, "#[repr(C)]");
        let _ = writeln!(g, "#[derive(Debug, Clone, Copy, Default, PartialEq)]");
        let _ = writeln!(g, "pub struct {rname} {{");
        for f in &b.fields {
            let rty = match scalar(&f.c_type) {
                Some((_, _, r)) => r.to_string(),
                None => rust_block_name(&f.c_type).to_string(),
            };
            let doc = if f.doc.is_empty() {
                format!("`{}`", f.c_type)
            } else {
                format!("`{}`: {}", f.c_type, f.doc)
            };
            let _ = writeln!(g, "    /// {}", doc.replace('[', "\\[").replace(']', "\\]"));
            let _ = writeln!(g, "    pub {}: {rty},", f.name);
        }
        let _ = writeln!(g, "}}");
        let _ = writeln!(g, "impl {rname} {{");
        let _ = writeln!(g, "    /// The C struct this block mirrors.");
        let _ = writeln!(g, "    pub const C_NAME: &'static str = {:?};", b.c_name);
        let _ = writeln!(g, "}}");
        for (f, off) in b.fields.iter().zip(&offsets) {
            let _ = writeln!(
                g,
                "const _: () = assert!(core::mem::offset_of!({rname}, {}) == {off});",
                f.name
            );
        }
        let _ = writeln!(
            g,
            "const _: () = assert!(core::mem::size_of::<{rname}>() == {size});"
        );
    }
    let n = abi.kernels.len();
    let _ = writeln!(
        g,
        "/// Every kernel of the code objects (`KV_KERNELS` in kernels-hip/kv_abi.h).\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]\npub enum Kernel {{"
    );
    for (k, p) in &abi.kernels {
        let _ = writeln!(g, "    /// `{k}`, taking `{p}`.");
        let _ = writeln!(g, "    {},", variant(k));
    }
    let _ = writeln!(g, "}}\nimpl Kernel {{");
    let _ = writeln!(
        g,
        "    /// Every kernel, in list order (`Kernel::ALL[k.index()] == k`).\n    pub const ALL: [Kernel; {n}] = ["
    );
    for (k, _) in &abi.kernels {
        let _ = writeln!(g, "        Kernel::{},", variant(k));
    }
    let _ = writeln!(g, "    ];");
    let _ = writeln!(
        g,
        "    /// The kernel's symbol in the code objects.\n    pub const fn name(self) -> &'static str {{\n        match self {{"
    );
    for (k, _) in &abi.kernels {
        let _ = writeln!(g, "            Kernel::{} => {k:?},", variant(k));
    }
    let _ = writeln!(g, "        }}\n    }}");
    let _ = writeln!(
        g,
        "    /// The C name of the parameter block the kernel takes.\n    pub const fn param_block(self) -> &'static str {{\n        match self {{"
    );
    for (k, p) in &abi.kernels {
        let _ = writeln!(g, "            Kernel::{} => {p:?},", variant(k));
    }
    let _ = writeln!(g, "        }}\n    }}");
    let _ = writeln!(
        g,
        "    /// The kernel's position in [`Kernel::ALL`].\n    pub const fn index(self) -> usize {{\n        self as usize\n    }}\n}}"
    );
    Ok(g)
}

/// Each parameter block's C name, size and alignment, as the Rust structs
/// have them.
pub fn block_sizes(abi: &Abi) -> Result<Vec<(String, usize, usize)>, String> {
    abi.blocks
        .iter()
        .map(|b| layout(abi, b).map(|(_, size, align)| (b.c_name.clone(), size, align)))
        .collect()
}

/// The C header of layout checks (included by kv_abi.h when
/// `KV_ABI_LAYOUT_CHECK` is defined): every field's offset when
/// `offsets` (a compiler with `__builtin_offsetof`), every block's size
/// in any case.
pub fn c_checks(abi: &Abi, offsets: bool) -> Result<String, String> {
    let mut g = String::from(
        "// @generated by build.rs: field offsets of kv_abi.h, as the Rust structs have them.\n",
    );
    for b in &abi.blocks {
        let (field_offsets, size, _) = layout(abi, b)?;
        for (f, off) in b.fields.iter().zip(&field_offsets).filter(|_| offsets) {
            let _ = writeln!(
                g,
                "static_assert(__builtin_offsetof({c}, {f}) == {off}, \"{c}.{f} is not at byte {off}, where the Rust struct has it\");",
                c = b.c_name,
                f = f.name
            );
        }
        let _ = writeln!(
            g,
            "static_assert(sizeof({c}) == {size}, \"{c} is not {size} bytes, as the Rust struct is\");",
            c = b.c_name
        );
    }
    Ok(g)
}
