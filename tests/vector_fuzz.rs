//! Hostile vector files: thousands of mutations of the committed files
//! (`tests/vectors/*.safetensors`) from fixed seeds — truncation, bit
//! flips, a lying header length, dtype, shape and offset edits (huge,
//! reversed, overlapping, past the end), metadata edits, duplicate and
//! renamed tensors, and well-formed files whose tensors were reshaped or
//! retyped. Each is parsed and, when it parses, replayed on the CPU, as
//! `verify` does: it must end in an error (exit 2) or a comparison (exit 0
//! or 1) with a one-line reason, never a panic, and allocate at most twice
//! the file plus 64 MiB (a counting global allocator in this binary). A
//! sample also runs through the `verify` binary, which must exit 1 or 2.
//!
//! `DSV4_KVCACHE_FUZZ_CASES` sets the cases per file (default 200);
//! `fuzz/` holds a `cargo fuzz` target for longer runs.

use dsv4_kvcache::testkit::Rng;
use dsv4_kvcache::vectors::{VTensor, VectorFile};
use dsv4_kvcache::{CpuBackend, DType};
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

// ---- a counting allocator ---------------------------------------------------------

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// A single request above this fails (returns null) instead of reaching
/// the system: the cap check below then reports it, rather than the
/// machine swapping.
const REFUSE_ABOVE: usize = 4 << 30;

fn grow(n: usize) {
    let live = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(live, Relaxed);
}

/// An allocation of `size` bytes by `f` (through `System`), counted; null
/// above [`REFUSE_ABOVE`], with the size kept as the peak.
fn counted(size: usize, f: impl FnOnce() -> *mut u8) -> *mut u8 {
    if size > REFUSE_ABOVE {
        PEAK.fetch_max(size, Relaxed);
        return std::ptr::null_mut();
    }
    let p = f();
    if !p.is_null() {
        grow(size);
    }
    p
}

// SAFETY: forwards to `System`, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        counted(l.size(), || unsafe { System.alloc(l) })
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        counted(l.size(), || unsafe { System.alloc_zeroed(l) })
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        counted(new, || {
            let q = unsafe { System.realloc(p, l, new) };
            if !q.is_null() {
                LIVE.fetch_sub(l.size(), Relaxed);
            }
            q
        })
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---- the files and their parts -------------------------------------------------------

fn committed() -> Vec<(String, Vec<u8>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("tests/vectors")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("read a vector file"))
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "the committed vector files are missing");
    v
}

/// A safetensors file split into its header entries (in order; names may
/// repeat) and its data.
struct Parts {
    entries: Vec<(String, Value)>,
    data: Vec<u8>,
}

/// `None` when `bytes` has no readable header (an earlier mutation broke it).
fn split(bytes: &[u8]) -> Option<Parts> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let entries: Vec<(String, Value)> = header.into_iter().collect();
    entries
        .iter()
        .any(|e| e.0 != "__metadata__" && e.1.is_object())
        .then(|| Parts {
            entries,
            data: bytes[8 + n..].to_vec(),
        })
}

fn join(p: &Parts) -> Vec<u8> {
    let body: Vec<String> = p
        .entries
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v))
        .collect();
    let mut header = format!("{{{}}}", body.join(","));
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&p.data);
    out
}

fn pick<'a, T>(rng: &mut Rng, v: &'a [T]) -> &'a T {
    &v[rng.below(v.len() as u64) as usize]
}

/// Index of a random tensor entry (not `__metadata__`).
fn tensor_entry(rng: &mut Rng, p: &Parts) -> usize {
    let idx: Vec<usize> = (0..p.entries.len())
        .filter(|&i| p.entries[i].0 != "__metadata__" && p.entries[i].1.is_object())
        .collect();
    *pick(rng, &idx)
}

const HUGE: [u64; 9] = [
    u64::MAX,
    u64::MAX / 2,
    1 << 63,
    1 << 62,
    1 << 40,
    1 << 32,
    (1 << 32) + 1,
    u32::MAX as u64,
    0,
];

// ---- mutations ------------------------------------------------------------------------

/// One mutation of `bytes`, described.
fn mutate(rng: &mut Rng, bytes: &[u8]) -> (String, Vec<u8>) {
    if bytes.len() < 16 {
        let mut b = bytes.to_vec();
        let n = 1 + rng.below(32) as usize;
        b.extend(rng.bytes(n));
        return ("random bytes appended to a stub".into(), b);
    }
    let hlen = (8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()).min(1 << 40) as usize)
        .min(bytes.len());
    let kind = rng.below(12);
    if (4..=9).contains(&kind) && split(bytes).is_none() {
        let cut = rng.below(bytes.len() as u64) as usize;
        return (format!("truncated to {cut} bytes"), bytes[..cut].to_vec());
    }
    match kind {
        0 => {
            let cut = if rng.below(2) == 0 {
                rng.below(hlen as u64 + 1) as usize
            } else {
                rng.below(bytes.len() as u64) as usize
            };
            (format!("truncated to {cut} bytes"), bytes[..cut].to_vec())
        }
        1 | 2 => {
            let mut b = bytes.to_vec();
            let in_header = rng.below(3) > 0;
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                let i = if in_header {
                    rng.below(hlen as u64)
                } else {
                    rng.below(b.len() as u64)
                } as usize;
                b[i] ^= 1 << rng.below(8);
            }
            let at = if in_header { "header" } else { "file" };
            (format!("{flips} bit flip(s) in the {at}"), b)
        }
        3 => {
            let mut b = bytes.to_vec();
            let v = match rng.below(4) {
                0 => *pick(rng, &HUGE),
                1 => hlen as u64 - 8 + 1 + rng.below(16),
                2 => (hlen as u64 - 8).saturating_sub(1 + rng.below(16)),
                _ => bytes.len() as u64,
            };
            b[..8].copy_from_slice(&v.to_le_bytes());
            (format!("header length {v}"), b)
        }
        4 => {
            let mut p = split(bytes).expect("checked above");
            let i = tensor_entry(rng, &p);
            let d = *pick(
                rng,
                &[
                    "F64", "F16", "I8", "I16", "U16", "U32", "U64", "BOOL", "F8_E5M2", "I32",
                    "I64", "U8", "F32", "BF16", "F8_E4M3", "Q4", "", "f32",
                ],
            );
            let d = if p.entries[i].1["dtype"] == json!(d) {
                "F64"
            } else {
                d
            };
            p.entries[i].1["dtype"] = json!(d);
            (format!("{} dtype {d}", p.entries[i].0), join(&p))
        }
        5 => {
            let mut p = split(bytes).expect("checked above");
            let i = tensor_entry(rng, &p);
            let old = p.entries[i].1["shape"].clone();
            let mut shape: Vec<Value> = old.as_array().cloned().unwrap_or_default();
            match rng.below(6) {
                0 if !shape.is_empty() => {
                    let k = rng.below(shape.len() as u64) as usize;
                    shape[k] = json!(*pick(rng, &HUGE));
                }
                1 => shape = vec![json!(1u64 << 32), json!(1u64 << 32), json!(1u64 << 32)],
                2 => shape.push(json!(1 + rng.below(3))),
                3 => shape.clear(),
                4 => shape = (0..12).map(|_| json!(2)).collect(),
                _ => {
                    shape.reverse();
                }
            }
            if Value::Array(shape.clone()) == old {
                shape.push(json!(1));
            }
            p.entries[i].1["shape"] = Value::Array(shape);
            let name = p.entries[i].0.clone();
            (
                format!("{name} shape {} (was {old})", p.entries[i].1["shape"]),
                join(&p),
            )
        }
        6 => {
            let mut p = split(bytes).expect("checked above");
            let i = tensor_entry(rng, &p);
            let j = tensor_entry(rng, &p);
            let len = p.data.len() as u64;
            let other = p.entries[j].1["data_offsets"].clone();
            let pick_kind = rng.below(5);
            let pick_kind = if i == j && pick_kind == 1 {
                3
            } else {
                pick_kind
            };
            let offs = match pick_kind {
                0 => json!([*pick(rng, &HUGE), *pick(rng, &HUGE)]),
                1 => other,
                2 => {
                    let a = other[0].as_u64().unwrap_or(0);
                    json!([a + 1 + rng.below(64), other[1]])
                }
                3 => json!([len, len + 1 + rng.below(1 << 20)]),
                _ => {
                    let o = &p.entries[i].1["data_offsets"];
                    json!([o[1], o[0]])
                }
            };
            p.entries[i].1["data_offsets"] = offs;
            let name = p.entries[i].0.clone();
            (
                format!("{name} data_offsets {}", p.entries[i].1["data_offsets"]),
                join(&p),
            )
        }
        7 => {
            let mut p = split(bytes).expect("checked above");
            let Some(m) = p.entries.iter().position(|e| e.0 == "__metadata__") else {
                return ("no metadata to edit".into(), bytes.to_vec());
            };
            let meta = p.entries[m].1.as_object_mut().unwrap();
            let keys: Vec<String> = [
                "format",
                "op",
                "layout",
                "compress_ratio",
                "sanitize",
                "rms_norm_eps",
                "rms_norm_eps_bits",
                "skip_latent_out",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(meta.keys().cloned())
            .collect();
            let k = pick(rng, &keys).clone();
            let v: Value = match rng.below(4) {
                0 => {
                    meta.remove(&k);
                    return (format!("metadata {k} removed"), join(&p));
                }
                1 => json!(*pick(rng, &[1.5f64, -1.0, 1e308])),
                2 => Value::Null,
                _ => json!(*pick(
                    rng,
                    &[
                        "",
                        "3",
                        "0",
                        "-1",
                        "2 ",
                        "true ",
                        "maybe",
                        "NaN",
                        "inf",
                        "-0",
                        "1e-400",
                        "0x",
                        "0xffffffffff",
                        "0x7fc00000",
                        "0xzz",
                        "v4",
                        "bf16",
                        "gather_dequant",
                        "save_ring_rows",
                        "rope_quant_insert",
                        "fused_compress_insert",
                        "dsv4-kvcache-vectors/2",
                        "\u{0}",
                        "\u{202e}x",
                    ],
                )),
            };
            meta.insert(k.clone(), v.clone());
            (format!("metadata {k} = {v}"), join(&p))
        }
        8 => {
            let mut p = split(bytes).expect("checked above");
            let i = tensor_entry(rng, &p);
            let j = tensor_entry(rng, &p);
            let dup = (p.entries[i].0.clone(), p.entries[j].1.clone());
            let at = rng.below(p.entries.len() as u64 + 1) as usize;
            p.entries.insert(at, dup);
            (
                format!(
                    "duplicate {} (with {}'s entry)",
                    p.entries[at].0, p.entries[j].0
                ),
                join(&p),
            )
        }
        9 => {
            let mut p = split(bytes).expect("checked above");
            let i = tensor_entry(rng, &p);
            let old = p.entries[i].0.clone();
            let new = match rng.below(4) {
                0 if old.starts_with("in.") => old.replace("in.", "out."),
                1 if old.starts_with("out.") => old.replace("out.", "in."),
                0..=2 => format!("{old}.x"),
                _ => {
                    let (k, _) = p.entries.remove(i);
                    return (format!("{k} removed"), join(&p));
                }
            };
            p.entries[i].0 = new.clone();
            (format!("{old} renamed {new}"), join(&p))
        }
        10 => {
            // Well-formed safetensors, a tensor retyped or reshaped (same bytes).
            let Ok(mut f) = VectorFile::from_bytes(bytes) else {
                return ("unparsable".into(), bytes.to_vec());
            };
            let names: Vec<String> = f.tensors.keys().cloned().collect();
            let name = pick(rng, &names).clone();
            let t = f.tensors[&name].clone();
            let n = t.data.len();
            let (dtype, shape) = match rng.below(5) {
                0 => (t.dtype, vec![n / t.dtype.size()]),
                1 => {
                    let mut s = t.shape.clone();
                    s.reverse();
                    (t.dtype, s)
                }
                2 => (t.dtype, [t.shape.clone(), vec![1]].concat()),
                3 => (DType::U8, vec![n]),
                _ => {
                    let d = *pick(
                        rng,
                        &[
                            DType::F32,
                            DType::I32,
                            DType::I64,
                            DType::BF16,
                            DType::F8E4M3,
                        ],
                    );
                    if n % d.size() != 0 {
                        (DType::U8, vec![n])
                    } else {
                        (d, vec![n / d.size()])
                    }
                }
            };
            let (dtype, shape) = if (dtype, &shape) == (t.dtype, &t.shape) {
                (t.dtype, [t.shape.clone(), vec![1]].concat())
            } else {
                (dtype, shape)
            };
            let Ok(v) = VTensor::new(dtype, &shape, t.data.clone()) else {
                return ("no such view".into(), bytes.to_vec());
            };
            f.tensors.insert(name.clone(), v);
            let b = f.to_bytes().expect("serialize");
            (format!("{name} as {dtype} {shape:?}"), b)
        }
        _ => {
            let (a, b) = mutate(rng, bytes);
            let (c, d) = mutate(rng, &b);
            (format!("{a}, then {c}"), d)
        }
    }
}

// ---- running a case -------------------------------------------------------------------

/// How `verify` would end.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Exit {
    Pass,
    Fail,
    Error,
}

/// Parses and replays `bytes` as `verify` does; the exit and its reason.
fn verify_in_process(cpu: &mut CpuBackend, bytes: &[u8]) -> (Exit, String) {
    let f = match VectorFile::from_bytes(bytes) {
        Ok(f) => f,
        Err(e) => return (Exit::Error, e.to_string()),
    };
    match f.replay(cpu) {
        Ok(r) if r.passed() => (Exit::Pass, "pass".into()),
        Ok(r) => (
            Exit::Fail,
            r.to_string().lines().next().unwrap_or("").into(),
        ),
        Err(e) => (Exit::Error, e.to_string()),
    }
}

fn cases_per_file() -> usize {
    std::env::var("DSV4_KVCACHE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

#[test]
fn mutated_vector_files_are_rejected_cleanly() {
    let mut cpu = CpuBackend::with_threads(1).unwrap();
    let files = committed();
    let mut counts = [0usize; 3];
    let mut problems = Vec::new();
    let mut sample = Vec::new();
    for (fi, (name, bytes)) in files.iter().enumerate() {
        let mut rng = Rng::new(0xf022 + fi as u64);
        for case in 0..cases_per_file() {
            let (what, m) = mutate(&mut rng, bytes);
            let cap = 2 * m.len().max(bytes.len()) + (64 << 20);
            let base = LIVE.load(Relaxed);
            PEAK.store(base, Relaxed);
            let run =
                std::panic::catch_unwind(AssertUnwindSafe(|| verify_in_process(&mut cpu, &m)));
            let used = PEAK.load(Relaxed).saturating_sub(base);
            let id = format!("{name} case {case} ({what})");
            match run {
                Err(_) => problems.push(format!("{id}: panicked")),
                Ok((exit, reason)) => {
                    counts[exit as usize] += 1;
                    if reason.is_empty() || reason.contains('\n') {
                        problems.push(format!("{id}: reason not one line: {reason:?}"));
                    }
                    if exit == Exit::Pass && std::env::var_os("FUZZ_SHOW_PASS").is_some() {
                        println!("pass: {id}");
                    }
                    if exit == Exit::Pass && m != *bytes {
                        // A change the replay cannot see (free text, an
                        // unread byte) may pass; say which, to keep it honest.
                        sample.push((id.clone(), m.clone(), exit));
                    } else if case % 97 == 0 {
                        sample.push((id.clone(), m.clone(), exit));
                    }
                }
            }
            if used > cap {
                problems.push(format!("{id}: allocated {used} bytes, cap {cap}"));
            }
        }
    }
    let total: usize = counts.iter().sum();
    println!(
        "{total} mutated files: {} errors (exit 2), {} mismatches (exit 1), {} pass (exit 0)",
        counts[Exit::Error as usize],
        counts[Exit::Fail as usize],
        counts[Exit::Pass as usize]
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        counts[Exit::Error as usize] > total / 4,
        "errors are exercised"
    );
    assert!(counts[Exit::Fail as usize] > 0, "mismatches are exercised");
    // Passing mutants must be rare: a change the replay cannot see (free
    // text in the header, a metadata key whose absence means the same, a
    // byte the op overwrites, an accepted `[1, 1]` scale).
    assert!(
        counts[Exit::Pass as usize] * 10 < total,
        "{} of {total} mutants pass",
        counts[Exit::Pass as usize]
    );
    // The same files through the `verify` binary: exit 1 or 2 (0 only
    // where the in-process run passed too), a one-line reason, no signal.
    let dir = std::env::temp_dir().join(format!("dsv4-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (id, m, exit)) in sample.iter().take(60).enumerate() {
        let path = dir.join(format!("m{i}.safetensors"));
        std::fs::write(&path, m).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dsv4-kvcache"))
            .args(["verify", "--backend", "cpu"])
            .arg(&path)
            .env("DSV4_KVCACHE_SANITIZE", "off")
            .output()
            .expect("run verify");
        let code = out.status.code();
        let want = match exit {
            Exit::Pass => 0,
            Exit::Fail => 1,
            Exit::Error => 2,
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            code,
            Some(want),
            "{id}: verify exit {code:?}, stderr {stderr}"
        );
        if want != 0 {
            let reason: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
            assert!(
                reason
                    .first()
                    .is_some_and(|l| l.starts_with("error: ") || l.starts_with("FAIL: ")),
                "{id}: stderr {stderr:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: an infinite FP8 block amax (the committed `*_san` files hold
/// one) made the scale exponent's table shift overflow, a panic in debug
/// builds (found by this suite).
#[test]
fn infinite_block_scale_does_not_panic() {
    assert_eq!(
        dsv4_kvcache::math::block_scale_exponent(f32::INFINITY),
        None
    );
    assert_eq!(dsv4_kvcache::math::block_scale_exponent(f32::NAN), None);
    assert_eq!(dsv4_kvcache::math::block_scale_exponent(1.0), Some(0));
}
