//! The AMD instruction budget, checked without a GPU: every HIP kernel source
//! that build.rs compiles is compiled again to AMDGPU assembly (`-S`) for
//! gfx90a, gfx942 and gfx950 with build.rs's flags, and each kernel's instructions are
//! counted by class (VALU, of which transcendental, SALU, SMEM, VMEM, LDS,
//! branch, other), keyed by kernel name:
//!
//! * `static`: every instruction in the kernel's code;
//! * `path`: the longest path through the control-flow graph with each loop
//!   taken once (back edges removed): the most one wavefront issues in one
//!   pass, both sides of a divergent branch included;
//! * `iter`: one iteration of the kernel's largest loop (longest path
//!   around it), and `loops` the number of loops.
//!
//! The counts are compared with `tests/amd_budget/counts.tsv`; any class
//! that moved by more than [`TOLERANCE_PCT`] % (and more than
//! [`TOLERANCE_ABS`] instructions) either way fails, as does a kernel added
//! or removed. After an intended kernel change, regenerate the table with
//! `DSV4_KVCACHE_AMD_BUDGET_WRITE=1 cargo test --release --test amd_budget`.
//! `-- --nocapture` prints the per-record budget against the HBM bandwidth
//! of one device as ROCm sees it (an MI250X GCD, MI210, MI300X, MI355X)
//! that docs/backends.md ("AMD instruction budget") shows.
//!
//! The counts belong to one compiler: the table records the version of
//! `.toolchains/bin/hip-clang` (scripts/install-toolchains.sh pins it). A
//! missing compiler prints `SKIPPED: <why>` unless
//! `DSV4_KVCACHE_REQUIRE_KERNELS=1`, where it fails; another compiler (an
//! explicit `HIP_CLANG`) with another version is SKIPPED, since its counts
//! are not the table's.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A class may move this much (percent of the table's count) ...
const TOLERANCE_PCT: f64 = 3.0;
/// ... or this many instructions, whichever is larger, before the test fails.
const TOLERANCE_ABS: u64 = 8;

const ARCHS: [&str; 3] = ["gfx90a", "gfx942", "gfx950"];

/// The devices the budget is set against, per target: name, compute units,
/// peak engine clock (GHz) and HBM bandwidth (TB/s) of one device as ROCm
/// enumerates it, as AMD publishes them (an MI250X is two GCDs, each a
/// device: 110 CUs and half the package's 3.2 TB/s).
const MACHINES: &[(&str, &str, f64, f64, f64)] = &[
    ("gfx90a", "MI250X GCD", 110.0, 1.7, 1.6),
    ("gfx90a", "MI210", 104.0, 1.7, 1.6),
    ("gfx942", "MI300X", 304.0, 2.1, 5.3),
    ("gfx950", "MI355X", 256.0, 2.4, 8.0),
];

/// build.rs's HIP flags and the freestanding clang arguments: the same file.
#[path = "../build/hip_flags.rs"]
mod hip_flags;

use hip_flags::{HIP_FLAGS as FLAGS, HIP_FREESTANDING as FREESTANDING};

const CLASSES: [&str; 8] = [
    "valu", "trans", "salu", "smem", "vmem", "lds", "branch", "other",
];
const VALU: usize = 0;
const TRANS: usize = 1;
const SALU: usize = 2;
const SMEM: usize = 3;
const VMEM: usize = 4;
const LDS: usize = 5;
const BRANCH: usize = 6;
const OTHER: usize = 7;

type Counts = [u64; 8];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn table_path() -> PathBuf {
    root().join("tests/amd_budget/counts.tsv")
}

fn require_kernels() -> bool {
    std::env::var("DSV4_KVCACHE_REQUIRE_KERNELS").is_ok_and(|v| v.trim() == "1")
}

fn write_mode() -> bool {
    std::env::var("DSV4_KVCACHE_AMD_BUDGET_WRITE").is_ok_and(|v| v.trim() == "1")
}

/// The instruction class of an AMDGPU mnemonic (CDNA2/CDNA3/CDNA4 issue units).
fn class_of(m: &str) -> Vec<usize> {
    const TRANS_OPS: [&str; 8] = [
        "v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_", "v_frexp_",
    ];
    if m.starts_with("v_") {
        // v_frexp_* is full rate; only the true transcendental unit ops count.
        if TRANS_OPS[..7].iter().any(|p| m.starts_with(p)) {
            return vec![VALU, TRANS];
        }
        return vec![VALU];
    }
    if m.starts_with("ds_") {
        return vec![LDS];
    }
    if ["global_", "buffer_", "flat_", "scratch_", "image_"]
        .iter()
        .any(|p| m.starts_with(p))
    {
        return vec![VMEM];
    }
    if m == "s_branch" || m.starts_with("s_cbranch") || m == "s_setpc_b64" || m == "s_swappc_b64" {
        return vec![BRANCH];
    }
    if [
        "s_load_",
        "s_buffer_load_",
        "s_store_",
        "s_buffer_store_",
        "s_scratch_",
        "s_dcache_",
        "s_memtime",
        "s_memrealtime",
        "s_atc_probe",
    ]
    .iter()
    .any(|p| m.starts_with(p))
    {
        return vec![SMEM];
    }
    if m.starts_with("s_waitcnt")
        || [
            "s_nop",
            "s_endpgm",
            "s_barrier",
            "s_sleep",
            "s_setprio",
            "s_sendmsg",
            "s_trap",
            "s_icache_inv",
            "s_sethalt",
        ]
        .contains(&m)
    {
        return vec![OTHER];
    }
    if m.starts_with("s_") {
        return vec![SALU];
    }
    vec![OTHER]
}

#[derive(Default, Clone)]
struct Block {
    label: Option<String>,
    counts: Counts,
    targets: Vec<String>,
    falls_through: bool,
    header: bool,
    /// The header (its label without the leading `.L`) of the innermost loop this block is in.
    in_loop: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
struct KernelCounts {
    stat: Counts,
    path: Counts,
    iter: Counts,
    loops: u64,
}

fn add(a: &mut Counts, b: &Counts) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

fn issued(c: &Counts) -> u64 {
    c[VALU] + c[SALU] + c[SMEM] + c[VMEM] + c[LDS] + c[BRANCH]
}

/// Splits an assembly file into kernels (functions) and their basic blocks.
fn parse(asm: &str) -> BTreeMap<String, Vec<Block>> {
    let mut out = BTreeMap::new();
    let mut cur: Option<(String, Vec<Block>)> = None;
    for line in asm.lines() {
        if line.starts_with(".Lfunc_end") {
            if let Some((name, blocks)) = cur.take() {
                out.insert(name, blocks);
            }
            continue;
        }
        if cur.is_none() {
            // A function label: `name:  ; @name`.
            if let Some((name, rest)) = line.split_once(':') {
                if rest.trim_start().starts_with("; @")
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    let entry = Block {
                        falls_through: true,
                        ..Block::default()
                    };
                    cur = Some((name.to_string(), vec![entry]));
                }
            }
            continue;
        }
        let (_, blocks) = cur.as_mut().unwrap();
        let comment = line.split_once(';').map(|(_, c)| c).unwrap_or("");
        let label = if line.starts_with(".LBB") {
            line.split_once(':').map(|(l, _)| l.to_string())
        } else {
            None
        };
        if label.is_some() || line.starts_with("; %bb.") {
            blocks.push(Block {
                label,
                header: comment.contains("Loop Header:"),
                in_loop: comment
                    .split_once("Header=")
                    .map(|(_, h)| h.split_whitespace().next().unwrap_or("").to_string()),
                falls_through: true,
                ..Block::default()
            });
            continue;
        }
        if !line.starts_with('\t') {
            continue;
        }
        let text = line.trim_start();
        if text.starts_with('.') || text.starts_with(';') || text.is_empty() {
            continue;
        }
        let mut words = text.split_whitespace();
        let m = words.next().unwrap_or("");
        let b = blocks.last_mut().unwrap();
        for c in class_of(m) {
            b.counts[c] += 1;
        }
        if m == "s_branch" || m.starts_with("s_cbranch") {
            if let Some(t) = words.next() {
                b.targets.push(t.trim_end_matches(',').to_string());
            }
        }
        b.falls_through = !(m == "s_branch" || m == "s_endpgm" || m == "s_setpc_b64");
    }
    out
}

/// Static counts, the one-pass longest path and the largest loop iteration.
fn count(blocks: &[Block]) -> KernelCounts {
    let index: HashMap<&str, usize> = blocks
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.label.as_deref().map(|l| (l, i)))
        .collect();
    let succ: Vec<Vec<usize>> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut s: Vec<usize> = b
                .targets
                .iter()
                .filter_map(|t| index.get(t.as_str()).copied())
                .collect();
            if b.falls_through && i + 1 < blocks.len() {
                s.push(i + 1);
            }
            s
        })
        .collect();
    // The loop a block belongs to: its header's index (a header is in its own loop).
    let header_of: Vec<Option<usize>> = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if b.header {
                Some(i)
            } else {
                b.in_loop
                    .as_deref()
                    .and_then(|h| index.get(format!(".L{h}").as_str()).copied())
            }
        })
        .collect();
    // Blocks by loop, for back-edge detection: an edge into a header from a
    // block of that loop (or one nested in it, which lies in its layout span).
    let mut span: HashMap<usize, (usize, usize)> = HashMap::new();
    for (i, h) in header_of.iter().enumerate() {
        if let Some(h) = *h {
            let e = span.entry(h).or_insert((i, i));
            e.0 = e.0.min(i);
            e.1 = e.1.max(i);
        }
    }
    let back = |from: usize, to: usize| -> bool {
        span.get(&to)
            .is_some_and(|&(lo, hi)| (lo..=hi).contains(&from))
    };
    let mut stat = Counts::default();
    for b in blocks {
        add(&mut stat, &b.counts);
    }
    let longest = |start: usize, within: Option<(usize, usize)>| -> Counts {
        // Memoized longest path (by issued instructions) over the DAG left
        // when back edges are removed; iterative post-order.
        let mut memo: Vec<Option<Counts>> = vec![None; blocks.len()];
        let mut stack = vec![(start, false)];
        while let Some((b, done)) = stack.pop() {
            if memo[b].is_some() {
                continue;
            }
            let next: Vec<usize> = succ[b]
                .iter()
                .copied()
                .filter(|&s| !back(b, s))
                .filter(|&s| within.is_none_or(|(lo, hi)| (lo..=hi).contains(&s)))
                .collect();
            if done {
                let mut best = Counts::default();
                for s in &next {
                    let c = memo[*s].unwrap_or_default();
                    if issued(&c) > issued(&best) {
                        best = c;
                    }
                }
                add(&mut best, &blocks[b].counts);
                memo[b] = Some(best);
            } else {
                stack.push((b, true));
                for s in next {
                    if memo[s].is_none() {
                        stack.push((s, false));
                    }
                }
            }
        }
        memo[start].unwrap_or_default()
    };
    let path = longest(0, None);
    let mut iter = Counts::default();
    for (&h, &(lo, hi)) in &span {
        let c = longest(h, Some((lo.min(h), hi.max(h))));
        if issued(&c) > issued(&iter) {
            iter = c;
        }
    }
    KernelCounts {
        stat,
        path,
        iter,
        loops: span.len() as u64,
    }
}

/// The HIP sources build.rs compiles: every `kernels-hip/<name>.hip` it names.
fn sources() -> Vec<PathBuf> {
    let build = std::fs::read_to_string(root().join("build.rs")).expect("read build.rs");
    let mut out: Vec<PathBuf> = Vec::new();
    for part in build.split('"').skip(1).step_by(2) {
        if part.starts_with("kernels-hip/") && part.ends_with(".hip") {
            let p = root().join(part);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if out.is_empty() {
        // build.rs builds the list some other way: every top-level .hip file,
        // that is every one no other .hip file includes.
        let mut all: Vec<PathBuf> = std::fs::read_dir(root().join("kernels-hip"))
            .expect("kernels-hip/")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "hip"))
            .collect();
        all.sort();
        let texts: Vec<String> = all
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect();
        out = all
            .iter()
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                let inc = format!("#include \"{name}\"");
                !texts.iter().any(|t| t.contains(&inc))
            })
            .cloned()
            .collect();
    }
    out
}

/// The compiler: `.toolchains/bin/hip-clang`, else `HIP_CLANG`.
fn compiler() -> Result<(PathBuf, bool), String> {
    let local = root().join(".toolchains/bin/hip-clang");
    if local.is_file() {
        return Ok((local, true));
    }
    match std::env::var_os("HIP_CLANG") {
        Some(p) => Ok((PathBuf::from(p), false)),
        None => Err(
            "no .toolchains/bin/hip-clang (scripts/install-toolchains.sh) and no HIP_CLANG".into(),
        ),
    }
}

fn version(cc: &Path) -> Result<String, String> {
    let out = Command::new(cc)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", cc.display()))?;
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.lines()
        .find(|l| l.contains("version"))
        .map(|l| l.trim().to_string())
        .ok_or_else(|| format!("{} --version printed no version", cc.display()))
}

fn assemble(cc: &Path, src: &Path, arch: &str, dir: &Path) -> String {
    let stem = src.file_stem().unwrap().to_string_lossy();
    let out = dir.join(format!("{stem}-{arch}.s"));
    let o = Command::new(cc)
        .current_dir(root())
        .args(FLAGS)
        .arg(format!("--offload-arch={arch}"))
        .args(FREESTANDING)
        .arg("-iquote")
        .arg(root().join("kernels-hip"))
        .arg("-iquote")
        .arg(env!("OUT_DIR"))
        .arg("-DKV_ABI_LAYOUT_CHECK=1")
        .arg("-S")
        .arg("-o")
        .arg(&out)
        .arg(src)
        .output()
        .expect("run the HIP compiler");
    assert!(
        o.status.success(),
        "{} -S for {arch} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read_to_string(&out).expect("read the assembly")
}

type Table = BTreeMap<(String, String), KernelCounts>;

fn measure(cc: &Path) -> Table {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("amd_budget");
    std::fs::create_dir_all(&dir).unwrap();
    let srcs = sources();
    let jobs: Vec<(String, PathBuf)> = ARCHS
        .iter()
        .flat_map(|a| srcs.iter().map(move |s| (a.to_string(), s.clone())))
        .collect();
    let results: Vec<(String, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = jobs
            .iter()
            .map(|(a, src)| s.spawn(|| (a.clone(), assemble(cc, src, a, &dir))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut table = Table::new();
    for (arch, asm) in results {
        for (name, blocks) in parse(&asm) {
            let prev = table.insert((arch.clone(), name.clone()), count(&blocks));
            assert!(prev.is_none(), "{arch}: kernel {name} defined twice");
        }
    }
    table
}

const HEADER: &str = "arch\tkernel\tloops";

fn render(table: &Table, ver: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# AMDGPU instruction counts per kernel, by tests/amd_budget.rs; regenerate with\n\
         # DSV4_KVCACHE_AMD_BUDGET_WRITE=1 cargo test --release --test amd_budget\n\
         # compiler: {ver}"
    );
    let mut h = HEADER.to_string();
    for part in ["static", "path", "iter"] {
        for c in CLASSES {
            let _ = write!(h, "\t{part}.{c}");
        }
    }
    let _ = writeln!(s, "{h}");
    for ((arch, k), c) in table {
        let _ = write!(s, "{arch}\t{k}\t{}", c.loops);
        for v in c.stat.iter().chain(&c.path).chain(&c.iter) {
            let _ = write!(s, "\t{v}");
        }
        let _ = writeln!(s);
    }
    s
}

fn read_table(text: &str) -> (Option<String>, Table) {
    let mut ver = None;
    let mut t = Table::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("# compiler: ") {
            ver = Some(v.trim().to_string());
            continue;
        }
        if line.starts_with('#') || line.starts_with(HEADER) || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 3 + 24, "malformed line in counts.tsv: {line}");
        let n: Vec<u64> = f[3..].iter().map(|x| x.parse().unwrap()).collect();
        let arr = |i: usize| -> Counts { n[8 * i..8 * i + 8].try_into().unwrap() };
        t.insert(
            (f[0].to_string(), f[1].to_string()),
            KernelCounts {
                loops: f[2].parse().unwrap(),
                stat: arr(0),
                path: arr(1),
                iter: arr(2),
            },
        );
    }
    (ver, t)
}

fn within(old: u64, new: u64) -> bool {
    let allow = TOLERANCE_ABS.max((old as f64 * TOLERANCE_PCT / 100.0).ceil() as u64);
    old.abs_diff(new) <= allow
}

/// What a kernel's record (or row) is, for the budget: wavefronts of 64 lanes,
/// records per wavefront and bytes per record as the bench counts them
/// (src/bin/dsv4-kvcache/bench/traffic.rs), from the launch geometry
/// (a token, row or CR2 item per group of 32 lanes; docs/backends.md).
fn unit(kernel: &str) -> Option<(&'static str, f64, f64)> {
    let record = |k: &str| -> Option<f64> {
        Some(match () {
            _ if k.contains("_v4") => 584.0,
            _ if k.contains("_mxfp8") => 528.0,
            _ if k.contains("_nvfp4") => 288.0,
            _ if k.contains("_bf16") => 1024.0,
            _ if k.contains("_fp8") => 512.0,
            _ => return None,
        })
    };
    // cos/sin: a 64-value F32 row per token; slot and position: 8 bytes each.
    const COS: f64 = 256.0;
    const IDX: f64 = 16.0;
    // A CR2 item closing a group: its row and the ring's row read, the ring
    // row written, the indices (slot, position, query_start_loc).
    const CR2_ITEM: f64 = 3.0 * 4096.0 + 24.0;
    let per_wave_cr2 = |k: &str| -> f64 {
        if k.contains("_team") {
            0.5
        } else if k.contains("_pair") {
            1.0
        } else {
            2.0
        }
    };
    if kernel == "kv_copy" {
        return Some((
            "4 x 16 B a lane, read + written (loop iteration)",
            1.0,
            8192.0,
        ));
    }
    if kernel == "kv_save_ring_rows" {
        return Some(("ring row", 2.0, 8192.0 + 8.0));
    }
    if kernel == "kv_compress_cr1" {
        return Some(("token", 2.0, 2048.0 + 1024.0 + IDX));
    }
    if let Some(rest) = kernel.strip_prefix("kv_insert_") {
        return Some((
            "token",
            2.0,
            1024.0 + record(&format!("_{rest}"))? + COS + IDX,
        ));
    }
    if let Some(rest) = kernel.strip_prefix("kv_fused_cr1_") {
        return Some((
            "token",
            2.0,
            2048.0 + record(&format!("_{rest}"))? + COS + IDX,
        ));
    }
    if kernel.starts_with("kv_compress_cr2") {
        return Some(("CR2 item", per_wave_cr2(kernel), CR2_ITEM + 1024.0));
    }
    if let Some(rest) = kernel.strip_prefix("kv_fused_cr2") {
        let r = record(rest.rsplit('_').next().map(|l| format!("_{l}"))?.as_str())?;
        return Some(("CR2 item", per_wave_cr2(kernel), CR2_ITEM + r + COS));
    }
    if let Some(format) = kernel.strip_prefix("kv_indexer_k_") {
        // Eight tokens a wavefront (eight lanes a token); the BF16 key row,
        // the cos/sin row, the indices, the record.
        let r = if format == "fp8" { 132.0 } else { 68.0 };
        return Some(("token", 8.0, 256.0 + COS + IDX + r));
    }
    if let Some(rest) = kernel.strip_prefix("kv_gather_") {
        let mut it = rest.split('_');
        let layout = it.next()?;
        let out = it.next()?;
        let r = record(&format!("_{layout}"))?;
        let o = if out == "f32" { 2048.0 } else { 1024.0 };
        let rows = if kernel.ends_with("_split") { 1.0 } else { 2.0 };
        return Some(("row", rows, r + o + 8.0));
    }
    None
}

/// Per-record issue cycles on one CU against HBM cycles, for a machine of
/// `cus` CUs at `ghz` with `tbs` TB/s: a CU issues at most one wave64
/// instruction per cycle per unit (VALU, SALU, SMEM, VMEM, LDS, branch),
/// a transcendental VALU op takes four.
fn ratio(c: &Counts, per_wave: f64, bytes: f64, cus: f64, ghz: f64, tbs: f64) -> f64 {
    let valu = (c[VALU] - c[TRANS]) as f64 + 4.0 * c[TRANS] as f64;
    let issue = [
        valu,
        c[SALU] as f64,
        c[SMEM] as f64,
        c[VMEM] as f64,
        c[LDS] as f64,
        c[BRANCH] as f64,
    ]
    .into_iter()
    .fold(0.0, f64::max)
        / per_wave;
    let hbm = bytes / (tbs * 1e12 / (cus * ghz * 1e9));
    issue / hbm
}

fn budget(table: &Table) -> String {
    let mut head = String::from("| kernel | record | bytes |");
    let mut rule = String::from("| --- | --- | ---: |");
    for arch in ARCHS {
        let _ = write!(head, " {arch} VALU / SALU / VMEM / LDS per record |");
        rule.push_str(" ---: |");
        for (_, name, ..) in MACHINES.iter().filter(|m| m.0 == arch) {
            let _ = write!(head, " {name} issue ÷ HBM |");
            rule.push_str(" ---: |");
        }
    }
    let mut s = format!("{head}\n{rule}\n");
    let names: Vec<&String> = table
        .keys()
        .filter(|(a, _)| a == "gfx942")
        .map(|(_, k)| k)
        .collect();
    for k in names {
        let Some((what, per_wave, bytes)) = unit(k) else {
            continue;
        };
        let mut row = format!("| `{k}` | {what} | {bytes:.0} |");
        for arch in ARCHS {
            let Some(c) = table.get(&(arch.to_string(), k.clone())) else {
                continue;
            };
            let c = if k == "kv_copy" { &c.iter } else { &c.path };
            let pr = |i: usize| c[i] as f64 / per_wave;
            let _ = write!(
                row,
                " {:.0} / {:.0} / {:.0} / {:.0} |",
                pr(VALU),
                pr(SALU),
                pr(VMEM),
                pr(LDS)
            );
            for (_, _, cus, ghz, tbs) in MACHINES.iter().filter(|m| m.0 == arch) {
                let r = ratio(c, per_wave, bytes, *cus, *ghz, *tbs);
                let bold = if r > 1.0 { "**" } else { "" };
                let _ = write!(row, " {bold}{r:.2}{bold} |");
            }
        }
        let _ = writeln!(s, "{row}");
    }
    s
}

#[test]
fn flags_match_build_rs() {
    // The flags are one file; what can drift is build.rs no longer compiling with it.
    let build = std::fs::read_to_string(root().join("build.rs")).unwrap();
    for used in [
        "#[path = \"build/hip_flags.rs\"]",
        "cmd.args(HIP_FLAGS)",
        "HipKind::Clang => cmd.args(HIP_FREESTANDING)",
        "cargo:rerun-if-changed=build/hip_flags.rs",
    ] {
        assert!(
            build.contains(used),
            "build.rs no longer has `{used}`: the HIP flags tests/amd_budget.rs compiles with \
             must be build/hip_flags.rs, the ones build.rs passes"
        );
    }
}

#[test]
fn instruction_counts_match_the_table() {
    let (cc, pinned) = match compiler() {
        Ok(c) => c,
        Err(why) => {
            assert!(!require_kernels(), "amd_budget: {why}");
            println!("SKIPPED: {why}");
            return;
        }
    };
    let ver = version(&cc).unwrap_or_else(|e| panic!("{e}"));
    let table = measure(&cc);
    assert!(!table.is_empty(), "no kernels found in the assembly");
    if write_mode() {
        std::fs::create_dir_all(table_path().parent().unwrap()).unwrap();
        std::fs::write(table_path(), render(&table, &ver)).unwrap();
        println!("wrote {}", table_path().display());
    }
    println!("{}", budget(&table));
    let text = std::fs::read_to_string(table_path()).expect("tests/amd_budget/counts.tsv");
    let (want_ver, want) = read_table(&text);
    if want_ver.as_deref() != Some(ver.as_str()) {
        let why = format!(
            "the table's counts are from `{}`, this compiler is `{ver}`",
            want_ver.unwrap_or_default()
        );
        // The pinned compiler changed: the table must be regenerated.
        assert!(!pinned, "amd_budget: {why}; regenerate the table");
        println!("SKIPPED: {why}");
        return;
    }
    let mut bad = Vec::new();
    for (key, c) in &table {
        let Some(w) = want.get(key) else {
            bad.push(format!("{} {}: not in the table", key.0, key.1));
            continue;
        };
        if c.loops != w.loops {
            bad.push(format!(
                "{} {}: {} loops, table {}",
                key.0, key.1, c.loops, w.loops
            ));
        }
        for (part, now, was) in [
            ("static", &c.stat, &w.stat),
            ("path", &c.path, &w.path),
            ("iter", &c.iter, &w.iter),
        ] {
            for (i, name) in CLASSES.iter().enumerate() {
                if !within(was[i], now[i]) {
                    bad.push(format!(
                        "{} {}: {part}.{name} {} (table {})",
                        key.0, key.1, now[i], was[i]
                    ));
                }
            }
        }
    }
    for key in want.keys() {
        if !table.contains_key(key) {
            bad.push(format!("{} {}: in the table, not compiled", key.0, key.1));
        }
    }
    assert!(
        bad.is_empty(),
        "AMD instruction counts moved beyond {TOLERANCE_PCT} % / {TOLERANCE_ABS} instructions:\n  {}\n\
         after an intended kernel change: DSV4_KVCACHE_AMD_BUDGET_WRITE=1 cargo test --release --test amd_budget",
        bad.join("\n  ")
    );
}
