//! Test vectors: named input and output tensors of one operation, in a
//! safetensors file, that any backend can replay and compare byte for byte.
//!
//! # Format (`dsv4-kvcache-vectors/1`)
//!
//! A safetensors file whose tensors are the operation's inputs, named
//! `in.<argument>` with the seed's argument names, and its expected outputs,
//! `out.kv_cache`, `out.latent_out` and `out.state_cache` (each the whole
//! tensor after the call, starting from the matching `in.` tensor).
//!
//! | input | op | dtype, shape |
//! | --- | --- | --- |
//! | `in.latent` | insert | BF16 `[T, 512]` |
//! | `in.positions` | all but ring rows | I64 (or I32) `[T]` |
//! | `in.cos_sin` | inserts | F32 (or BF16) `[P, 64]` (cos 0..32, sin 32..64) |
//! | `in.slot_mapping` | all | I64 (or I32) `[N]` |
//! | `in.kv_cache` | inserts | U8 `[B, bs, 584 \| 528 \| 288]`, BF16 or F8_E4M3 (or U8) `[B, bs, 512]` |
//! | `in.fp8_scale` | FP8 rows | F32 `[1]` |
//! | `in.kv_score` | compress | F32 `[T, 512 \| 1024]` |
//! | `in.state_cache` | CR2, ring rows | F32 `[B, capacity, 1024]` |
//! | `in.query_start_loc` | CR2 | I64 `[R + 1]` |
//! | `in.token_to_req_indices` | CR2 | I64 `[T]` |
//! | `in.rms_norm_weight` | compress | BF16 `[512]` |
//! | `in.latent_out` | compress | BF16 `[T, 512]` |
//! | `in.prev_rows`, `in.prev_row_indices` | CR2 (optional) | F32 `[R', 1024]`, I64 `[R]` |
//! | `in.rows` | ring rows | F32 `[N, 1024]` |
//! | `in.cache_slot_mapping` | fused | I64 `[N]` |
//!
//! String metadata: `format` = `dsv4-kvcache-vectors/1`; `op`
//! (`rope_quant_insert`, `fused_save_compress_norm`, `save_ring_rows`,
//! `fused_compress_insert`); `layout` (`v4`, `mxfp8`, `nvfp4`, `bf16`, `fp8`;
//! the insert ops); `compress_ratio` (`1` or `2`); `sanitize` (`true` or
//! `false`); `rms_norm_eps` (the exact decimal value of the f32) and
//! `rms_norm_eps_bits` (its bits, `0x` and 8 hex digits, which win when both
//! are present); optionally `skip_latent_out` (`true`, fused only); `source`
//! and `description` (free text, often JSON).
//!
//! The seed harness (`scripts/seed/seed_vectors.py`) writes exactly these
//! names. [`VectorFile::replay`] runs a file on any [`Backend`];
//! [`VectorFile::capture_reference`] fills in the outputs from the CPU
//! reference; [`cases`] builds the inputs of typical cases.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::layout::RecordLayout;
use crate::ops::{CompressArgs, FusedArgs, InsertArgs, RingArgs, SkipCounts};
use crate::tensor::{DType, Tensor, TensorDesc, TensorMut};
use crate::CpuBackend;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

/// The value of the `format` metadata key.
pub const FORMAT: &str = "dsv4-kvcache-vectors/1";

/// Mismatches a [`ReplayReport`] keeps in detail (all are counted).
pub const MAX_RECORDED_MISMATCHES: usize = 10_000;

/// The output tensors a file may hold, in the order they are compared.
pub const OUTPUT_NAMES: [&str; 3] = ["kv_cache", "latent_out", "state_cache"];

// ---- operations ---------------------------------------------------------------

/// The operation a vector file exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `rope_quant_insert`.
    RopeQuantInsert,
    /// `fused_save_compress_norm`.
    FusedSaveCompressNorm,
    /// `save_ring_rows`.
    SaveRingRows,
    /// `fused_save_compress_norm` then `rope_quant_insert` in one launch.
    FusedCompressInsert,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 4] = [
        Op::RopeQuantInsert,
        Op::FusedSaveCompressNorm,
        Op::SaveRingRows,
        Op::FusedCompressInsert,
    ];

    /// The metadata name (the seed's function name).
    pub fn name(self) -> &'static str {
        match self {
            Op::RopeQuantInsert => "rope_quant_insert",
            Op::FusedSaveCompressNorm => "fused_save_compress_norm",
            Op::SaveRingRows => "save_ring_rows",
            Op::FusedCompressInsert => "fused_compress_insert",
        }
    }

    /// Inverse of [`Op::name`].
    pub fn from_name(s: &str) -> Option<Op> {
        Self::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether the op writes a KV cache (and so has a `layout`).
    pub fn inserts(self) -> bool {
        matches!(self, Op::RopeQuantInsert | Op::FusedCompressInsert)
    }

    /// Inputs the op cannot run without (CR2's extra inputs are checked
    /// separately).
    fn required(self) -> &'static [&'static str] {
        match self {
            Op::RopeQuantInsert => &["latent", "positions", "cos_sin", "slot_mapping", "kv_cache"],
            Op::FusedSaveCompressNorm => &[
                "kv_score",
                "positions",
                "slot_mapping",
                "rms_norm_weight",
                "latent_out",
            ],
            Op::SaveRingRows => &["rows", "slot_mapping", "state_cache"],
            Op::FusedCompressInsert => &[
                "kv_score",
                "positions",
                "slot_mapping",
                "rms_norm_weight",
                "latent_out",
                "cos_sin",
                "kv_cache",
                "cache_slot_mapping",
            ],
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// ---- tensors --------------------------------------------------------------------

/// One tensor of a vector file: element type, shape and little-endian bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape (row-major, contiguous).
    pub shape: Vec<usize>,
    /// `numel * dtype.size()` bytes.
    pub data: Vec<u8>,
}

impl VTensor {
    /// A tensor from raw bytes; checks that the size matches the shape.
    pub fn new(dtype: DType, shape: &[usize], data: Vec<u8>) -> Result<Self> {
        let bytes = shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
        if bytes != Some(data.len()) {
            return Err(Error::Vectors(format!(
                "tensor of dtype {dtype} and shape {shape:?} needs {} bytes, got {}",
                bytes.map_or("more than usize::MAX".to_string(), |b| b.to_string()),
                data.len()
            )));
        }
        Ok(VTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        })
    }

    /// An F32 tensor.
    pub fn f32(shape: &[usize], v: &[f32]) -> Self {
        Self::from_le(
            DType::F32,
            shape,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// A BF16 tensor from its bit patterns.
    pub fn bf16_bits(shape: &[usize], v: &[u16]) -> Self {
        Self::from_le(
            DType::BF16,
            shape,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// An I64 tensor.
    pub fn i64(shape: &[usize], v: &[i64]) -> Self {
        Self::from_le(
            DType::I64,
            shape,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }

    /// A byte tensor of `dtype` (U8 or F8_E4M3).
    pub fn bytes(dtype: DType, shape: &[usize], v: Vec<u8>) -> Self {
        Self::from_le(dtype, shape, v)
    }

    fn from_le(dtype: DType, shape: &[usize], data: Vec<u8>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>() * dtype.size(), data.len());
        VTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The contiguous view of this tensor.
    pub fn desc(&self) -> Result<TensorDesc> {
        if self.shape.len() > crate::tensor::MAX_RANK {
            return Err(Error::Vectors(format!(
                "rank {} above {}",
                self.shape.len(),
                crate::tensor::MAX_RANK
            )));
        }
        Ok(TensorDesc::contiguous(self.dtype, &self.shape))
    }

    /// The elements of an I32 or I64 tensor, widened.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        match self.dtype {
            DType::I64 => Ok(self
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()),
            DType::I32 => Ok(self
                .data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
                .collect()),
            d => Err(Error::Vectors(format!(
                "expected an I32 or I64 tensor, got {d}"
            ))),
        }
    }

    /// The elements of an F32 tensor.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self.dtype {
            DType::F32 => Ok(self
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect()),
            d => Err(Error::Vectors(format!("expected an F32 tensor, got {d}"))),
        }
    }
}

impl safetensors::View for &VTensor {
    fn dtype(&self) -> safetensors::Dtype {
        to_st_dtype(self.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn to_st_dtype(d: DType) -> safetensors::Dtype {
    use safetensors::Dtype as S;
    match d {
        DType::F32 => S::F32,
        DType::BF16 => S::BF16,
        DType::U8 => S::U8,
        DType::F8E4M3 => S::F8_E4M3,
        DType::I32 => S::I32,
        DType::I64 => S::I64,
    }
}

fn from_st_dtype(name: &str, d: safetensors::Dtype) -> Result<DType> {
    use safetensors::Dtype as S;
    Ok(match d {
        S::F32 => DType::F32,
        S::BF16 => DType::BF16,
        S::U8 => DType::U8,
        S::F8_E4M3 => DType::F8E4M3,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        other => {
            return Err(Error::Vectors(format!(
                "tensor {name}: dtype {other:?} is not one of F32, BF16, U8, F8_E4M3, I32, I64"
            )))
        }
    })
}

// ---- exact decimals -------------------------------------------------------------

/// The exact decimal value of an f32 (every finite f32 is a finite decimal),
/// e.g. `1e-6f32` → `0.0000009999999974752427078783512115478515625`.
/// Parsing the string gives back the same f32.
pub fn f32_exact_decimal(x: f32) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    // Rust's fixed-precision formatting is exact; 150 fraction digits hold
    // every f32 (the smallest subnormal, 2^-149, has 149).
    let s = format!("{:.150}", x as f64);
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').unwrap_or(s).to_string()
}

// ---- the file -------------------------------------------------------------------

/// A test-vector file: metadata and named tensors (`in.*`, `out.*`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VectorFile {
    /// String metadata (`format`, `op`, `layout`, `compress_ratio`, ...).
    pub meta: BTreeMap<String, String>,
    /// Tensors by full name (`in.latent`, `out.kv_cache`, ...).
    pub tensors: BTreeMap<String, VTensor>,
}

/// Every written tensor's bytes by output name, and the skip counts.
pub type Executed = (Vec<(&'static str, Vec<u8>)>, SkipCounts);

impl VectorFile {
    /// An empty file for `op`: `format` and `op` set, `sanitize` false.
    pub fn new(op: Op) -> Self {
        let mut f = VectorFile::default();
        f.meta.insert("format".into(), FORMAT.into());
        f.meta.insert("op".into(), op.name().into());
        f.meta.insert("sanitize".into(), "false".into());
        f
    }

    /// Reads and checks a file (see the module docs for what it must hold).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::Vectors(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes).map_err(|e| match e {
            Error::Vectors(m) => Error::Vectors(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses and checks the bytes of a safetensors file.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| Error::Vectors(format!("not a valid safetensors file: {e}")))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| Error::Vectors(format!("not a valid safetensors file: {e}")))?;
        let mut f = VectorFile::default();
        if let Some(m) = header.metadata() {
            f.meta = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        for (name, view) in st.iter() {
            let dtype = from_st_dtype(name, view.dtype())?;
            let t = VTensor::new(dtype, view.shape(), view.data().to_vec())
                .map_err(|e| Error::Vectors(format!("tensor {name}: {e}")))?;
            f.tensors.insert(name.to_string(), t);
        }
        f.check()?;
        Ok(f)
    }

    /// The file's bytes (safetensors).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let meta: HashMap<String, String> = self
            .meta
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        safetensors::serialize(
            self.tensors.iter().map(|(k, v)| (k.as_str(), v)),
            Some(meta),
        )
        .map_err(|e| Error::Vectors(format!("cannot serialize: {e}")))
    }

    /// Writes the file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|e| Error::Vectors(format!("{}: {e}", path.display())))
    }

    /// Checks the metadata and that the op's required inputs are present.
    pub fn check(&self) -> Result<()> {
        match self.meta.get("format") {
            Some(v) if v == FORMAT => {}
            Some(v) => return Err(Error::Vectors(format!("format {v:?}, expected {FORMAT:?}"))),
            None => {
                return Err(Error::Vectors(format!(
                    "no \"format\" metadata (expected {FORMAT:?})"
                )))
            }
        }
        let op = self.op()?;
        let missing: Vec<String> = op
            .required()
            .iter()
            .filter(|n| !self.tensors.contains_key(&format!("in.{n}")))
            .map(|n| format!("in.{n}"))
            .collect();
        if !missing.is_empty() {
            return Err(Error::Vectors(format!("{op} needs {}", missing.join(", "))));
        }
        if op != Op::SaveRingRows {
            self.compress_ratio()?;
        }
        if op.inserts() {
            self.layout()?;
        }
        self.sanitize()?;
        if matches!(op, Op::FusedSaveCompressNorm | Op::FusedCompressInsert) {
            self.rms_norm_eps()?;
        }
        for name in self.tensors.keys() {
            let ok = name
                .strip_prefix("in.")
                .map(|_| true)
                .or_else(|| name.strip_prefix("out.").map(|n| OUTPUT_NAMES.contains(&n)))
                .unwrap_or(false);
            if !ok {
                return Err(Error::Vectors(format!(
                    "tensor {name}: names are in.<argument> or out.kv_cache, out.latent_out, out.state_cache"
                )));
            }
            if let Some(out) = name.strip_prefix("out.") {
                let input = self
                    .tensors
                    .get(&format!("in.{out}"))
                    .ok_or_else(|| Error::Vectors(format!("{name} has no matching in.{out}")))?;
                let expected = &self.tensors[name];
                if input.data.len() != expected.data.len() {
                    return Err(Error::Vectors(format!(
                        "{name} has {} bytes but in.{out} has {}",
                        expected.data.len(),
                        input.data.len()
                    )));
                }
            }
        }
        Ok(())
    }

    fn meta_str(&self, key: &str) -> Result<&str> {
        self.meta
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| Error::Vectors(format!("no \"{key}\" metadata")))
    }

    /// The `op` metadata.
    pub fn op(&self) -> Result<Op> {
        let s = self.meta_str("op")?;
        Op::from_name(s).ok_or_else(|| {
            Error::Vectors(format!(
                "op {s:?}, expected one of rope_quant_insert, fused_save_compress_norm, save_ring_rows, fused_compress_insert"
            ))
        })
    }

    /// The `layout` metadata (insert ops).
    pub fn layout(&self) -> Result<RecordLayout> {
        let s = self.meta_str("layout")?;
        RecordLayout::from_name(s).ok_or_else(|| {
            Error::Vectors(format!(
                "layout {s:?}, expected v4, mxfp8, nvfp4, bf16 or fp8"
            ))
        })
    }

    /// The `compress_ratio` metadata.
    pub fn compress_ratio(&self) -> Result<u32> {
        let s = self.meta_str("compress_ratio")?;
        match s.trim() {
            "1" => Ok(1),
            "2" => Ok(2),
            _ => Err(Error::Vectors(format!(
                "compress_ratio {s:?}, expected 1 or 2"
            ))),
        }
    }

    /// The `sanitize` metadata (absent is false).
    pub fn sanitize(&self) -> Result<bool> {
        match self.meta.get("sanitize").map(|s| s.trim()) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(s) => Err(Error::Vectors(format!(
                "sanitize {s:?}, expected true or false"
            ))),
        }
    }

    /// Whether the fused op skips `latent_out` (`skip_latent_out`, absent is false).
    pub fn skip_latent_out(&self) -> Result<bool> {
        match self.meta.get("skip_latent_out").map(|s| s.trim()) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(s) => Err(Error::Vectors(format!(
                "skip_latent_out {s:?}, expected true or false"
            ))),
        }
    }

    /// The RMSNorm epsilon: `rms_norm_eps_bits` if present, else the decimal
    /// `rms_norm_eps` (rounded to the nearest f32).
    pub fn rms_norm_eps(&self) -> Result<f32> {
        if let Some(b) = self.meta.get("rms_norm_eps_bits") {
            let h = b.trim().trim_start_matches("0x").trim_start_matches("0X");
            let bits = u32::from_str_radix(h, 16).map_err(|_| {
                Error::Vectors(format!(
                    "rms_norm_eps_bits {b:?}, expected 0x and 8 hex digits"
                ))
            })?;
            return Ok(f32::from_bits(bits));
        }
        let s = self.meta_str("rms_norm_eps")?;
        s.trim()
            .parse::<f32>()
            .map_err(|_| Error::Vectors(format!("rms_norm_eps {s:?} is not a number")))
    }

    /// Sets `rms_norm_eps` (exact decimal) and `rms_norm_eps_bits`.
    pub fn set_rms_norm_eps(&mut self, eps: f32) {
        self.meta
            .insert("rms_norm_eps".into(), f32_exact_decimal(eps));
        self.meta.insert(
            "rms_norm_eps_bits".into(),
            format!("0x{:08x}", eps.to_bits()),
        );
    }

    /// Sets a metadata entry.
    pub fn set_meta(&mut self, key: &str, value: impl Into<String>) {
        self.meta.insert(key.into(), value.into());
    }

    /// The input tensor `in.<name>`.
    pub fn input(&self, name: &str) -> Option<&VTensor> {
        self.tensors.get(&format!("in.{name}"))
    }

    /// The expected output `out.<name>`.
    pub fn expected(&self, name: &str) -> Option<&VTensor> {
        self.tensors.get(&format!("out.{name}"))
    }

    /// Sets the input tensor `in.<name>`.
    pub fn set_input(&mut self, name: &str, t: VTensor) {
        self.tensors.insert(format!("in.{name}"), t);
    }

    /// Uploads the inputs to `backend`, ready to launch.
    pub fn prepare<'f, B: Backend>(&'f self, backend: &B) -> Result<Prepared<'f, B>> {
        self.check()?;
        let op = self.op()?;
        let layout = if op.inserts() {
            Some(self.layout()?)
        } else {
            None
        };
        let mut inputs = BTreeMap::new();
        let mut outs: [Option<Buf<B>>; 3] = [None, None, None];
        for (name, t) in &self.tensors {
            let Some(arg) = name.strip_prefix("in.") else {
                continue;
            };
            let mut desc = t.desc()?;
            // FP8 rows stored as raw bytes (numpy has no e4m3): read as F8_E4M3.
            if arg == "kv_cache" && layout == Some(RecordLayout::Fp8Rows) && t.dtype == DType::U8 {
                desc = TensorDesc::contiguous(DType::F8E4M3, &t.shape);
            }
            let buf = Buf {
                desc,
                buf: backend.upload(&t.data)?,
            };
            match OUTPUT_NAMES.iter().position(|o| *o == arg) {
                Some(i) => outs[i] = Some(buf),
                None => {
                    inputs.insert(arg.to_string(), buf);
                }
            }
        }
        let [kv_cache, latent_out, state_cache] = outs;
        Ok(Prepared {
            file: self,
            op,
            compress_ratio: if op == Op::SaveRingRows {
                1
            } else {
                self.compress_ratio()?
            },
            eps: if matches!(op, Op::FusedSaveCompressNorm | Op::FusedCompressInsert) {
                self.rms_norm_eps()?
            } else {
                0.0
            },
            skip_latent_out: self.skip_latent_out()?,
            inputs,
            kv_cache,
            latent_out,
            state_cache,
        })
    }

    /// Runs the op on `backend` (with the file's `sanitize`, restored
    /// afterwards) and returns every written tensor's bytes, by output name,
    /// with the tokens the backend skipped.
    pub fn execute<B: Backend>(&self, backend: &mut B) -> Result<Executed> {
        let sanitize = self.sanitize()?;
        let before = backend.sanitize();
        backend.set_sanitize(sanitize);
        let res = (|| {
            let mut p = self.prepare(backend)?;
            backend.take_skip_counts()?;
            p.launch(backend)?;
            let outs = p.outputs(backend)?;
            let skipped = backend.take_skip_counts()?;
            Ok((outs, skipped))
        })();
        backend.set_sanitize(before);
        res
    }

    /// Replays the file on `backend` and compares every `out.*` tensor with
    /// what the backend wrote, byte for byte.
    pub fn replay<B: Backend>(&self, backend: &mut B) -> Result<ReplayReport> {
        let (outs, skipped) = self.execute(backend)?;
        let mut report = ReplayReport {
            op: self.op()?.name().to_string(),
            backend: backend.name(),
            skipped,
            ..Default::default()
        };
        let locator = Locator::new(self)?;
        for (name, got) in &outs {
            let Some(expected) = self.expected(name) else {
                continue;
            };
            let tensor = format!("out.{name}");
            let mut count = 0u64;
            for (i, (&e, &g)) in expected.data.iter().zip(got.iter()).enumerate() {
                if e != g {
                    count += 1;
                    if report.mismatches.len() < MAX_RECORDED_MISMATCHES {
                        let (slot, token, field) = locator.locate(name, i);
                        report.mismatches.push(Mismatch {
                            tensor: tensor.clone(),
                            byte_offset: i,
                            expected: e,
                            got: g,
                            slot,
                            token,
                            field,
                        });
                    }
                }
            }
            // A backend returning a buffer of another length is a mismatch of
            // every byte it lacks (or adds).
            count += expected.data.len().abs_diff(got.len()) as u64;
            report.bytes_compared += expected.data.len() as u64;
            report.per_tensor.push(TensorCount {
                tensor,
                bytes: expected.data.len() as u64,
                mismatched: count,
            });
        }
        Ok(report)
    }

    /// Runs the op on the CPU reference and stores its results as the
    /// `out.*` tensors (every tensor the op writes), replacing any present.
    pub fn capture_reference(&mut self) -> Result<()> {
        let mut cpu = CpuBackend::new();
        let (outs, _) = self.execute(&mut cpu)?;
        for (name, bytes) in outs {
            let input = self.input(name).expect("outputs come from inputs");
            let t = VTensor {
                dtype: input.dtype,
                shape: input.shape.clone(),
                data: bytes,
            };
            self.tensors.insert(format!("out.{name}"), t);
        }
        if !self.meta.contains_key("source") {
            self.meta.insert(
                "source".into(),
                format!("dsv4-kvcache {} CPU reference", env!("CARGO_PKG_VERSION")),
            );
        }
        Ok(())
    }
}

// ---- running a file -------------------------------------------------------------

/// A backend buffer with the view of its tensor.
pub struct Buf<B: Backend> {
    /// The tensor's view.
    pub desc: TensorDesc,
    /// The backend's copy of its bytes.
    pub buf: B::Buffer,
}

/// A vector file's inputs uploaded to a backend: launch it as often as you
/// like (benchmarks), [`Prepared::reset`] the written tensors, read them.
pub struct Prepared<'f, B: Backend> {
    file: &'f VectorFile,
    op: Op,
    compress_ratio: u32,
    eps: f32,
    skip_latent_out: bool,
    inputs: BTreeMap<String, Buf<B>>,
    kv_cache: Option<Buf<B>>,
    latent_out: Option<Buf<B>>,
    state_cache: Option<Buf<B>>,
}

fn ro<'a, B: Backend>(
    inputs: &'a BTreeMap<String, Buf<B>>,
    name: &str,
) -> Result<Tensor<'a, B::Buffer>> {
    inputs
        .get(name)
        .map(|b| Tensor::new(&b.buf, b.desc))
        .ok_or_else(|| Error::Vectors(format!("no in.{name}")))
}

fn opt<'a, B: Backend>(
    inputs: &'a BTreeMap<String, Buf<B>>,
    name: &str,
) -> Option<Tensor<'a, B::Buffer>> {
    inputs.get(name).map(|b| Tensor::new(&b.buf, b.desc))
}

fn rw<'a, B: Backend>(b: &'a mut Option<Buf<B>>, name: &str) -> Result<TensorMut<'a, B::Buffer>> {
    b.as_mut()
        .map(|b| TensorMut::new(&mut b.buf, b.desc))
        .ok_or_else(|| Error::Vectors(format!("no in.{name}")))
}

impl<B: Backend> Prepared<'_, B> {
    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Launches the op once on the uploaded buffers (the written tensors
    /// keep what earlier launches wrote).
    pub fn launch(&mut self, backend: &B) -> Result<()> {
        let Prepared {
            op,
            compress_ratio,
            eps,
            skip_latent_out,
            inputs,
            kv_cache,
            latent_out,
            state_cache,
            ..
        } = self;
        let compress_ratio = *compress_ratio;
        match op {
            Op::RopeQuantInsert => backend.rope_quant_insert(InsertArgs {
                latent: ro(inputs, "latent")?,
                positions: ro(inputs, "positions")?,
                cos_sin_cache: ro(inputs, "cos_sin")?,
                kv_cache: rw(kv_cache, "kv_cache")?,
                slot_mapping: ro(inputs, "slot_mapping")?,
                compress_ratio,
                fp8_scale: opt(inputs, "fp8_scale"),
            }),
            Op::SaveRingRows => backend.save_ring_rows(RingArgs {
                rows: ro(inputs, "rows")?,
                slot_mapping: ro(inputs, "slot_mapping")?,
                state_cache: rw(state_cache, "state_cache")?,
            }),
            Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
                let compress = CompressArgs {
                    kv_score: ro(inputs, "kv_score")?,
                    positions: ro(inputs, "positions")?,
                    state_cache: state_cache
                        .as_mut()
                        .map(|b| TensorMut::new(&mut b.buf, b.desc)),
                    slot_mapping: ro(inputs, "slot_mapping")?,
                    query_start_loc: opt(inputs, "query_start_loc"),
                    token_to_req_indices: opt(inputs, "token_to_req_indices"),
                    rms_norm_weight: ro(inputs, "rms_norm_weight")?,
                    rms_norm_eps: *eps,
                    compress_ratio,
                    latent_out: rw(latent_out, "latent_out")?,
                    prev_rows: opt(inputs, "prev_rows"),
                    prev_row_indices: opt(inputs, "prev_row_indices"),
                };
                if *op == Op::FusedSaveCompressNorm {
                    backend.fused_save_compress_norm(compress)
                } else {
                    backend.fused_compress_insert(FusedArgs {
                        compress,
                        skip_latent_out: *skip_latent_out,
                        cos_sin_cache: ro(inputs, "cos_sin")?,
                        kv_cache: rw(kv_cache, "kv_cache")?,
                        cache_slot_mapping: ro(inputs, "cache_slot_mapping")?,
                        fp8_scale: opt(inputs, "fp8_scale"),
                    })
                }
            }
        }
    }

    /// Rewrites the written tensors with the file's inputs.
    pub fn reset(&mut self, backend: &B) -> Result<()> {
        let file = self.file;
        for (name, b) in OUTPUT_NAMES.iter().zip([
            &mut self.kv_cache,
            &mut self.latent_out,
            &mut self.state_cache,
        ]) {
            if let (Some(b), Some(t)) = (b.as_mut(), file.input(name)) {
                backend.write(&mut b.buf, &t.data)?;
            }
        }
        Ok(())
    }

    /// The written tensors' bytes, by output name (waits for the backend).
    pub fn outputs(&self, backend: &B) -> Result<Vec<(&'static str, Vec<u8>)>> {
        let mut out = Vec::new();
        for (name, b) in
            OUTPUT_NAMES
                .iter()
                .zip([&self.kv_cache, &self.latent_out, &self.state_cache])
        {
            if let Some(b) = b {
                out.push((*name, backend.read(&b.buf)?));
            }
        }
        Ok(out)
    }
}

// ---- reports --------------------------------------------------------------------

/// One byte that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// `out.kv_cache`, `out.latent_out` or `out.state_cache`.
    pub tensor: String,
    /// Offset of the byte in the tensor.
    pub byte_offset: usize,
    /// The file's byte.
    pub expected: u8,
    /// The backend's byte.
    pub got: u8,
    /// The cache slot (or ring slot) the byte belongs to, when it is in one.
    pub slot: Option<u64>,
    /// The token (row of the inputs) that writes that slot or row, if any.
    pub token: Option<usize>,
    /// The record field or element, e.g. `scale byte 3 (UE8M0 of dims 96..128)`.
    pub field: Option<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} byte {}: expected 0x{:02x}, got 0x{:02x}",
            self.tensor, self.byte_offset, self.expected, self.got
        )?;
        let mut parts = Vec::new();
        if let Some(s) = self.slot {
            parts.push(format!("slot {s}"));
        }
        match self.token {
            Some(t) => parts.push(format!("token {t}")),
            None if self.slot.is_some() => parts.push("no token writes this slot".into()),
            None => {}
        }
        if let Some(field) = &self.field {
            parts.push(field.clone());
        }
        if !parts.is_empty() {
            write!(f, " ({})", parts.join(", "))?;
        }
        Ok(())
    }
}

/// Bytes compared and differing in one output tensor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TensorCount {
    /// Tensor name.
    pub tensor: String,
    /// Bytes in the expected tensor.
    pub bytes: u64,
    /// Bytes that differ.
    pub mismatched: u64,
}

/// The result of [`VectorFile::replay`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplayReport {
    /// The op replayed.
    pub op: String,
    /// The backend's name.
    pub backend: String,
    /// The differing bytes, in tensor then offset order (the first
    /// [`MAX_RECORDED_MISMATCHES`]; [`ReplayReport::mismatch_count`] counts all).
    pub mismatches: Vec<Mismatch>,
    /// Bytes of expected output compared.
    pub bytes_compared: u64,
    /// Per output tensor: bytes and differing bytes.
    pub per_tensor: Vec<TensorCount>,
    /// Tokens the backend skipped for out-of-range indices.
    pub skipped: SkipCounts,
}

impl ReplayReport {
    /// Total differing bytes.
    pub fn mismatch_count(&self) -> u64 {
        self.per_tensor.iter().map(|t| t.mismatched).sum()
    }

    /// Whether every compared byte matched.
    pub fn passed(&self) -> bool {
        self.mismatch_count() == 0
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.mismatch_count();
        if n == 0 {
            writeln!(
                f,
                "{} on {}: all {} bytes match",
                self.op, self.backend, self.bytes_compared
            )?;
        } else {
            writeln!(
                f,
                "{} on {}: {n} of {} bytes differ",
                self.op, self.backend, self.bytes_compared
            )?;
            for m in self.mismatches.iter().take(20) {
                writeln!(f, "  {m}")?;
            }
            if n > 20 {
                writeln!(f, "  ... and {} more", n - 20)?;
            }
        }
        for t in &self.per_tensor {
            writeln!(
                f,
                "  {}: {} of {} bytes differ",
                t.tensor, t.mismatched, t.bytes
            )?;
        }
        if self.skipped.total() > 0 {
            writeln!(
                f,
                "  tokens skipped for out-of-range indices: {} slot, {} position, {} index",
                self.skipped.slot_out_of_range,
                self.skipped.position_out_of_range,
                self.skipped.index_out_of_range
            )?;
        }
        Ok(())
    }
}

/// Maps a byte of an output tensor to its slot, token and record field.
struct Locator {
    layout: Option<RecordLayout>,
    cache_shape: Vec<usize>,
    cache_esz: usize,
    ring_cap: usize,
    /// slot → last token with that cache slot.
    cache_tokens: HashMap<i64, usize>,
    /// ring slot → last token with that ring slot.
    ring_tokens: HashMap<i64, usize>,
}

impl Locator {
    fn new(f: &VectorFile) -> Result<Self> {
        let op = f.op()?;
        // Only group-boundary tokens write cache records.
        let cr = if op.inserts() {
            f.compress_ratio()? as i64
        } else {
            1
        };
        let positions = f
            .input("positions")
            .and_then(|t| t.to_i64().ok())
            .unwrap_or_default();
        let writes = |t: usize| {
            positions
                .get(t)
                .is_some_and(|p| *p >= 0 && (p + 1) % cr == 0)
        };
        // slot -> the last token with that slot (the later write wins).
        let map = |name: &str, only_writers: bool| -> HashMap<i64, usize> {
            f.input(name)
                .and_then(|t| t.to_i64().ok())
                .map(|v| {
                    v.into_iter()
                        .enumerate()
                        .filter(|&(t, s)| s >= 0 && (!only_writers || writes(t)))
                        .map(|(t, s)| (s, t))
                        .collect()
                })
                .unwrap_or_default()
        };
        let idx = |name: &str| map(name, false);
        let writers = |name: &str| map(name, true);
        let (cache_tokens, ring_tokens) = match op {
            Op::RopeQuantInsert => (writers("slot_mapping"), HashMap::new()),
            Op::FusedCompressInsert => (writers("cache_slot_mapping"), idx("slot_mapping")),
            Op::FusedSaveCompressNorm | Op::SaveRingRows => (HashMap::new(), idx("slot_mapping")),
        };
        let cache = f.input("kv_cache");
        Ok(Locator {
            layout: if op.inserts() {
                Some(f.layout()?)
            } else {
                None
            },
            cache_shape: cache.map(|t| t.shape.clone()).unwrap_or_default(),
            cache_esz: cache.map_or(1, |t| t.dtype.size()),
            ring_cap: f
                .input("state_cache")
                .and_then(|t| t.shape.get(1).copied())
                .unwrap_or(1),
            cache_tokens,
            ring_tokens,
        })
    }

    fn locate(&self, tensor: &str, off: usize) -> (Option<u64>, Option<usize>, Option<String>) {
        match tensor {
            "latent_out" => (
                None,
                Some(off / 1024),
                Some(format!(
                    "dim {} (BF16 {} byte)",
                    (off % 1024) / 2,
                    lohi(off)
                )),
            ),
            "state_cache" => {
                let slot = off / 4096;
                let j = (off % 4096) / 4;
                let block = slot / self.ring_cap.max(1);
                let row = slot % self.ring_cap.max(1);
                let what = if j < 512 {
                    format!("kv dim {j}")
                } else {
                    format!("score dim {}", j - 512)
                };
                (
                    Some(slot as u64),
                    self.ring_tokens.get(&(slot as i64)).copied(),
                    Some(format!("ring block {block} row {row}, {what}")),
                )
            }
            "kv_cache" => self.locate_cache(off),
            _ => (None, None, None),
        }
    }

    fn locate_cache(&self, off: usize) -> (Option<u64>, Option<usize>, Option<String>) {
        let Some(layout) = self.layout else {
            return (None, None, None);
        };
        if self.cache_shape.len() < 2 {
            return (None, None, None);
        }
        let bs = self.cache_shape[1];
        let (slot, field) = if layout.is_paged() {
            let (v, s) = (layout.value_bytes(), layout.scale_bytes());
            let page = bs * (v + s);
            if page == 0 {
                return (None, None, None);
            }
            let (block, in_page) = (off / page, off % page);
            if in_page < bs * v {
                let (row, k) = (in_page / v, in_page % v);
                (block * bs + row, value_field(layout, k))
            } else {
                let r = in_page - bs * v;
                let (row, j) = (r / s, r % s);
                (block * bs + row, scale_field(layout, j))
            }
        } else {
            let row_bytes = 512 * self.cache_esz;
            let slot = off / row_bytes;
            let k = off % row_bytes;
            (slot, value_field(layout, k))
        };
        (
            Some(slot as u64),
            self.cache_tokens.get(&(slot as i64)).copied(),
            Some(field),
        )
    }
}

fn lohi(off: usize) -> &'static str {
    if off % 2 == 0 {
        "low"
    } else {
        "high"
    }
}

/// What value byte `k` of a record holds.
pub fn value_field(layout: RecordLayout, k: usize) -> String {
    match layout {
        RecordLayout::V4 if k < 448 => format!(
            "value byte {k}: e4m3 of unrotated dim {k} (block {})",
            k / 64
        ),
        RecordLayout::V4 => {
            let d = 448 + (k - 448) / 2;
            format!("value byte {k}: BF16 {} byte of rotated dim {d}", lohi(k))
        }
        RecordLayout::Mxfp8 => {
            format!("value byte {k}: e4m3 of rotated dim {k} (block {})", k / 32)
        }
        RecordLayout::Nvfp4 => format!(
            "value byte {k}: e2m1 codes of rotated dims {} (low nibble) and {} (high) (tile {})",
            2 * k,
            2 * k + 1,
            k / 8
        ),
        RecordLayout::Bf16Rows => format!("BF16 {} byte of rotated dim {}", lohi(k), k / 2),
        RecordLayout::Fp8Rows => format!("e4m3 of rotated dim {k}"),
    }
}

/// What scale byte `j` of a record holds.
pub fn scale_field(layout: RecordLayout, j: usize) -> String {
    match layout {
        RecordLayout::V4 if j < 7 => format!(
            "scale byte {j}: UE8M0 of unrotated dims {}..{}",
            64 * j,
            64 * j + 64
        ),
        RecordLayout::V4 => "scale byte 7: zero padding".into(),
        RecordLayout::Mxfp8 => format!(
            "scale byte {j}: UE8M0 of rotated dims {}..{}",
            32 * j,
            32 * j + 32
        ),
        RecordLayout::Nvfp4 => format!(
            "scale byte {j}: e4m3 of rotated dims {}..{}",
            16 * j,
            16 * j + 16
        ),
        RecordLayout::Bf16Rows | RecordLayout::Fp8Rows => format!("byte {j}"),
    }
}

// ---- generating cases -----------------------------------------------------------

/// Inputs of typical cases, deterministic in a seed: what the CLI's
/// `capture`, `bench` and `demo` and the tests run.
pub mod cases {
    use super::{Op, VTensor, VectorFile};
    use crate::formats::bf16_from_f32;
    use crate::layout::{RecordLayout, DIM};
    use crate::tensor::DType;

    /// A small deterministic generator (SplitMix64) for test inputs.
    #[derive(Debug, Clone)]
    pub struct Rng(u64);

    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    impl Rng {
        /// A generator from a seed.
        pub fn new(seed: u64) -> Self {
            Rng(seed ^ GAMMA)
        }

        /// The generator `n` draws ahead: SplitMix64's state is a counter,
        /// so this equals calling [`next_u64`](Self::next_u64) `n` times.
        pub fn skipped(&self, n: u64) -> Rng {
            Rng(self.0.wrapping_add(n.wrapping_mul(GAMMA)))
        }

        /// 64 random bits.
        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(GAMMA);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// Uniform in `[0, 1)`.
        pub fn uniform(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
        }

        /// Uniform in `0..n` (`n > 0`).
        pub fn below(&mut self, n: u64) -> u64 {
            ((self.next_u64() as u128 * n as u128) >> 64) as u64
        }

        /// Standard normal (Box–Muller).
        pub fn normal(&mut self) -> f32 {
            let u1 = 1.0 - self.uniform();
            let u2 = self.uniform();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        }

        /// `n` random bytes (one draw each).
        pub fn bytes(&mut self, n: usize) -> Vec<u8> {
            self.par_draws(n, 1, |r| r.next_u64() as u8)
        }

        /// `n` values of `draw`, each taking `draws_each` draws: the same as
        /// calling it `n` times in a row, computed on all cores (the state is
        /// a counter, so each chunk starts from its own offset).
        pub fn par_draws<T: Copy + Default + Send>(
            &mut self,
            n: usize,
            draws_each: u64,
            draw: impl Fn(&mut Rng) -> T + Sync,
        ) -> Vec<T> {
            use rayon::prelude::*;
            const CHUNK: usize = 1 << 15;
            let base = self.clone();
            let mut out = vec![T::default(); n];
            out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
                let mut r = base.skipped(draws_each * (i * CHUNK) as u64);
                for v in c.iter_mut() {
                    *v = draw(&mut r);
                }
            });
            *self = base.skipped(draws_each * n as u64);
            out
        }

        /// A random permutation of `0..n`.
        pub fn permutation(&mut self, n: usize) -> Vec<usize> {
            let mut p: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                let j = self.below(i as u64 + 1) as usize;
                p.swap(i, j);
            }
            p
        }
    }

    /// The GPT-J RoPE table `[rows, 64]`: `cos(p θ_k)` in columns 0..32 and
    /// `sin(p θ_k)` in 32..64, `θ_k = 10000^(-2k/64)`, computed in f64 and
    /// rounded to f32 (as the seed harness does).
    pub fn rope_cos_sin(rows: usize) -> Vec<f32> {
        use rayon::prelude::*;
        let theta: Vec<f64> = (0..32)
            .map(|k| 10000f64.powf(-2.0 * k as f64 / 64.0))
            .collect();
        let mut t = vec![0.0f32; rows * 64];
        t.par_chunks_mut(64).enumerate().for_each(|(p, row)| {
            for k in 0..32 {
                let a = p as f64 * theta[k];
                row[k] = a.cos() as f32;
                row[32 + k] = a.sin() as f32;
            }
        });
        t
    }

    /// Rows per cache block in every generated case.
    pub const BLOCK_SIZE: usize = 64;
    /// The per-tensor scale of generated FP8 row caches (not a power of two,
    /// so its reciprocal rounds).
    pub const FP8_SCALE: f32 = 0.0125;
    /// The RMSNorm epsilon of generated compress cases.
    pub const RMS_NORM_EPS: f32 = 1e-6;

    /// What to generate.
    #[derive(Debug, Clone)]
    pub struct CaseSpec {
        /// The operation.
        pub op: Op,
        /// The cache layout (insert ops).
        pub layout: RecordLayout,
        /// 1 or 2 (not used by `save_ring_rows`).
        pub compress_ratio: u32,
        /// Tokens `T` (positions `0..T`).
        pub tokens: usize,
        /// CR2: the tokens are split into this many requests of consecutive
        /// positions (sizes differ by at most one; some may be empty).
        pub requests: usize,
        /// Ring rows per request (CR2, ring rows).
        pub ring_capacity: usize,
        /// Seed of the inputs.
        pub seed: u64,
        /// Sanitize NaNs.
        pub sanitize: bool,
        /// Put special values (NaN, ±inf, ±0, huge, tiny, format edges) in
        /// some rows and negative slots on a few tokens.
        pub adversarial: bool,
    }

    impl Default for CaseSpec {
        fn default() -> Self {
            CaseSpec {
                op: Op::RopeQuantInsert,
                layout: RecordLayout::Mxfp8,
                compress_ratio: 1,
                tokens: 64,
                requests: 4,
                ring_capacity: 4,
                seed: 1,
                sanitize: false,
                adversarial: false,
            }
        }
    }

    /// Special f32 values for adversarial rows.
    const SPECIALS: [f32; 14] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e30,
        -1e30,
        1e-30,
        448.0,
        464.0,
        6.0,
        f32::MIN_POSITIVE,
        1e-4,
        65504.0,
    ];

    fn fill_adversarial(rng: &mut Rng, row: &mut [f32]) {
        match rng.below(4) {
            // A few special values among normal ones.
            0 => {
                for _ in 0..8 {
                    let i = rng.below(row.len() as u64) as usize;
                    row[i] = SPECIALS[rng.below(SPECIALS.len() as u64) as usize];
                }
            }
            // One special value everywhere.
            1 => {
                let v = SPECIALS[rng.below(SPECIALS.len() as u64) as usize];
                row.iter_mut().for_each(|x| *x = v);
            }
            // Huge dynamic range.
            2 => {
                for x in row.iter_mut() {
                    *x *= 2f32.powi(rng.below(60) as i32 - 30);
                }
            }
            // Tiny values (subnormal territory of the formats).
            _ => {
                for x in row.iter_mut() {
                    *x *= 1e-7;
                }
            }
        }
    }

    /// `n` values of [`Rng::normal`], the same as drawing them one by one
    /// (each takes two draws), computed on all cores: the large benchmark
    /// cases need tens of millions.
    pub fn normals(rng: &mut Rng, n: usize) -> Vec<f32> {
        rng.par_draws(n, 2, Rng::normal)
    }

    /// `rows` latent rows (BF16 bits), adversarial values in some rows.
    fn bf16_rows(rng: &mut Rng, rows: usize, adversarial: bool) -> Vec<u16> {
        if !adversarial {
            // Without adversarial rows the draws are all normals.
            return normals(rng, rows * DIM)
                .into_iter()
                .map(bf16_from_f32)
                .collect();
        }
        (0..rows).flat_map(|_| bf16_row(rng, adversarial)).collect()
    }

    fn bf16_row(rng: &mut Rng, adversarial: bool) -> Vec<u16> {
        let mut v: Vec<f32> = (0..DIM).map(|_| rng.normal()).collect();
        if adversarial && rng.below(4) == 0 {
            fill_adversarial(rng, &mut v);
        }
        v.into_iter().map(bf16_from_f32).collect()
    }

    fn f32_rows(rng: &mut Rng, rows: usize, width: usize, adversarial: bool) -> Vec<f32> {
        if !adversarial {
            // Without adversarial rows the draws are all normals.
            return normals(rng, rows * width);
        }
        let mut out = Vec::with_capacity(rows * width);
        for _ in 0..rows {
            let mut v: Vec<f32> = (0..width).map(|_| rng.normal()).collect();
            if adversarial && rng.below(8) == 0 {
                fill_adversarial(rng, &mut v);
            }
            out.extend(v);
        }
        out
    }

    /// The cache tensor of `layout` for `tokens` slots (canary bytes).
    fn cache_tensor(rng: &mut Rng, layout: RecordLayout, tokens: usize) -> VTensor {
        let blocks = tokens.div_ceil(BLOCK_SIZE).max(1);
        match layout {
            RecordLayout::Bf16Rows => {
                let n = blocks * BLOCK_SIZE * DIM;
                VTensor::bytes(DType::BF16, &[blocks, BLOCK_SIZE, DIM], rng.bytes(2 * n))
            }
            RecordLayout::Fp8Rows => {
                let n = blocks * BLOCK_SIZE * DIM;
                VTensor::bytes(DType::F8E4M3, &[blocks, BLOCK_SIZE, DIM], rng.bytes(n))
            }
            _ => {
                let w = layout.record_bytes();
                VTensor::bytes(
                    DType::U8,
                    &[blocks, BLOCK_SIZE, w],
                    rng.bytes(blocks * BLOCK_SIZE * w),
                )
            }
        }
    }

    /// Cache slots: a random permutation of the cache's slots, one per
    /// token (a few `-1` when adversarial).
    fn cache_slots(rng: &mut Rng, tokens: usize, adversarial: bool) -> Vec<i64> {
        let blocks = tokens.div_ceil(BLOCK_SIZE).max(1);
        let perm = rng.permutation(blocks * BLOCK_SIZE);
        (0..tokens)
            .map(|t| {
                if adversarial && rng.below(20) == 0 {
                    -1
                } else {
                    perm[t] as i64
                }
            })
            .collect()
    }

    /// Request chunk sizes: `tokens` split into `requests` consecutive runs.
    pub fn split(tokens: usize, requests: usize) -> Vec<usize> {
        let r = requests.max(1);
        (0..r)
            .map(|i| tokens / r + usize::from(i < tokens % r))
            .collect()
    }

    fn insert_inputs(f: &mut VectorFile, rng: &mut Rng, s: &CaseSpec, slots: Vec<i64>) {
        let t = s.tokens;
        f.set_input(
            "cos_sin",
            VTensor::f32(&[t.max(1), 64], &rope_cos_sin(t.max(1))),
        );
        f.set_input("kv_cache", cache_tensor(rng, s.layout, t));
        let key = if s.op == Op::FusedCompressInsert {
            "cache_slot_mapping"
        } else {
            "slot_mapping"
        };
        f.set_input(key, VTensor::i64(&[t], &slots));
        if s.layout == RecordLayout::Fp8Rows {
            f.set_input("fp8_scale", VTensor::f32(&[1], &[FP8_SCALE]));
        }
        f.set_meta("layout", s.layout.name());
    }

    fn compress_inputs(f: &mut VectorFile, rng: &mut Rng, s: &CaseSpec) {
        let t = s.tokens;
        let cr = s.compress_ratio as usize;
        f.set_input(
            "kv_score",
            VTensor::f32(&[t, DIM * cr], &f32_rows(rng, t, DIM * cr, s.adversarial)),
        );
        let w: Vec<u16> = (0..DIM)
            .map(|_| bf16_from_f32(1.0 + 0.25 * rng.normal()))
            .collect();
        f.set_input("rms_norm_weight", VTensor::bf16_bits(&[DIM], &w));
        f.set_input(
            "latent_out",
            VTensor::bytes(DType::BF16, &[t, DIM], rng.bytes(2 * t * DIM)),
        );
        f.set_rms_norm_eps(RMS_NORM_EPS);
        if cr == 1 {
            // CR1: slot_mapping only marks tokens valid (< 0 skips).
            let marks: Vec<i64> = (0..t as i64)
                .map(|i| {
                    if s.adversarial && rng.below(20) == 0 {
                        -1
                    } else {
                        i
                    }
                })
                .collect();
            f.set_input("slot_mapping", VTensor::i64(&[t], &marks));
            return;
        }
        let sizes = split(t, s.requests);
        let cap = s.ring_capacity.max(1);
        let reqs = sizes.len();
        let mut qsl = vec![0i64];
        let mut ttr = Vec::with_capacity(t);
        let mut slots = Vec::with_capacity(t);
        for (r, &n) in sizes.iter().enumerate() {
            let start = *qsl.last().expect("non-empty") as usize;
            for p in start..start + n {
                ttr.push(r as i64);
                let skip = s.adversarial && rng.below(20) == 0;
                slots.push(if skip { -1 } else { (r * cap + p % cap) as i64 });
            }
            qsl.push((start + n) as i64);
        }
        f.set_input("query_start_loc", VTensor::i64(&[reqs + 1], &qsl));
        f.set_input("token_to_req_indices", VTensor::i64(&[t], &ttr));
        f.set_input("slot_mapping", VTensor::i64(&[t], &slots));
        f.set_input(
            "state_cache",
            VTensor::f32(&[reqs, cap, 1024], &f32_rows(rng, reqs * cap, 1024, false)),
        );
    }

    /// A vector file with the inputs of `s` (no outputs; see
    /// [`VectorFile::capture_reference`]). Positions are `0..T`; caches have
    /// blocks of [`BLOCK_SIZE`] rows and canary bytes; cache slots are a
    /// random permutation (as in the performance anchors).
    pub fn make_case(s: &CaseSpec) -> VectorFile {
        let mut f = VectorFile::new(s.op);
        let mut rng = Rng::new(s.seed);
        let t = s.tokens;
        f.set_meta("sanitize", if s.sanitize { "true" } else { "false" });
        let positions: Vec<i64> = (0..t as i64).collect();
        match s.op {
            Op::RopeQuantInsert => {
                let latent = bf16_rows(&mut rng, t, s.adversarial);
                f.set_input("latent", VTensor::bf16_bits(&[t, DIM], &latent));
                f.set_input("positions", VTensor::i64(&[t], &positions));
                let slots = cache_slots(&mut rng, t, s.adversarial);
                insert_inputs(&mut f, &mut rng, s, slots);
                f.set_meta("compress_ratio", s.compress_ratio.to_string());
            }
            Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
                f.set_input("positions", VTensor::i64(&[t], &positions));
                compress_inputs(&mut f, &mut rng, s);
                if s.op == Op::FusedCompressInsert {
                    let slots = cache_slots(&mut rng, t, s.adversarial);
                    insert_inputs(&mut f, &mut rng, s, slots);
                }
                f.set_meta("compress_ratio", s.compress_ratio.to_string());
            }
            Op::SaveRingRows => {
                let cap = s.ring_capacity.max(1);
                let blocks = t.div_ceil(cap).max(1);
                let perm = rng.permutation(blocks * cap);
                let slots: Vec<i64> = (0..t)
                    .map(|i| {
                        if s.adversarial && rng.below(20) == 0 {
                            -1
                        } else {
                            perm[i] as i64
                        }
                    })
                    .collect();
                f.set_input(
                    "rows",
                    VTensor::f32(&[t, 1024], &f32_rows(&mut rng, t, 1024, s.adversarial)),
                );
                f.set_input("slot_mapping", VTensor::i64(&[t], &slots));
                f.set_input(
                    "state_cache",
                    VTensor::f32(
                        &[blocks, cap, 1024],
                        &f32_rows(&mut rng, blocks * cap, 1024, false),
                    ),
                );
            }
        }
        f.set_meta(
            "description",
            format!(
                "generated by dsv4-kvcache vectors::cases: op {}, layout {}, CR{}, T {}, requests {}, ring capacity {}, seed {}, adversarial {}",
                s.op,
                s.layout.name(),
                s.compress_ratio,
                s.tokens,
                s.requests,
                s.ring_capacity,
                s.seed,
                s.adversarial
            ),
        );
        f
    }
}

#[cfg(test)]
mod tests {
    use super::cases::{make_case, normals, CaseSpec, Rng};
    use super::*;

    #[test]
    fn parallel_normals_are_the_sequential_draws() {
        // Across chunk boundaries, and the generator ends where the
        // sequential draws leave it.
        for n in [0usize, 1, 32_767, 32_768, 100_003] {
            let mut a = Rng::new(0x5eed + n as u64);
            let mut b = a.clone();
            let par = normals(&mut a, n);
            let seq: Vec<f32> = (0..n).map(|_| b.normal()).collect();
            assert_eq!(par.len(), n);
            assert!(
                par.iter()
                    .zip(&seq)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "n = {n}"
            );
            assert_eq!(a.next_u64(), b.next_u64(), "state after n = {n}");
            let par = a.bytes(n + 65_536);
            let seq: Vec<u8> = (0..n + 65_536).map(|_| b.next_u64() as u8).collect();
            assert_eq!(par, seq, "bytes, n = {n}");
            assert_eq!(a.next_u64(), b.next_u64(), "state after the bytes, n = {n}");
        }
    }

    fn all_specs() -> Vec<CaseSpec> {
        let mut v = Vec::new();
        for layout in RecordLayout::ALL {
            for cr in [1, 2] {
                for op in [Op::RopeQuantInsert, Op::FusedCompressInsert] {
                    v.push(CaseSpec {
                        op,
                        layout,
                        compress_ratio: cr,
                        tokens: 37,
                        requests: 3,
                        seed: 7 + cr as u64,
                        sanitize: cr == 2,
                        adversarial: true,
                        ..Default::default()
                    });
                }
            }
        }
        for cr in [1, 2] {
            v.push(CaseSpec {
                op: Op::FusedSaveCompressNorm,
                compress_ratio: cr,
                tokens: 29,
                requests: 4,
                adversarial: true,
                ..Default::default()
            });
        }
        v.push(CaseSpec {
            op: Op::SaveRingRows,
            tokens: 9,
            ring_capacity: 4,
            adversarial: true,
            ..Default::default()
        });
        v
    }

    #[test]
    fn exact_decimal_roundtrips() {
        assert_eq!(
            f32_exact_decimal(1e-6),
            "0.0000009999999974752427078783512115478515625"
        );
        assert_eq!(f32_exact_decimal(0.5), "0.5");
        assert_eq!(f32_exact_decimal(3.0), "3");
        assert_eq!(f32_exact_decimal(-0.0), "-0");
        for x in [
            1e-6f32,
            1e-5,
            0.1,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::MAX,
            123.456,
        ] {
            assert_eq!(
                f32_exact_decimal(x).parse::<f32>().unwrap().to_bits(),
                x.to_bits()
            );
        }
    }

    #[test]
    fn save_load_roundtrip() {
        let dir = std::env::temp_dir().join(format!("dsv4-vectors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, spec) in all_specs().iter().enumerate() {
            let mut f = make_case(spec);
            f.capture_reference().unwrap();
            let path = dir.join(format!("case{i}.safetensors"));
            f.save(&path).unwrap();
            let g = VectorFile::load(&path).unwrap();
            assert_eq!(f, g, "case {i}");
            if g.op().unwrap() != Op::SaveRingRows {
                assert_eq!(g.compress_ratio().unwrap(), spec.compress_ratio);
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn eps_metadata() {
        let mut f = make_case(&CaseSpec {
            op: Op::FusedSaveCompressNorm,
            ..Default::default()
        });
        f.set_rms_norm_eps(1e-5);
        assert_eq!(f.meta["rms_norm_eps_bits"], "0x3727c5ac");
        assert_eq!(f.rms_norm_eps().unwrap(), 1e-5);
        f.meta.remove("rms_norm_eps_bits");
        assert_eq!(f.rms_norm_eps().unwrap(), 1e-5);
    }

    #[test]
    fn cpu_replay_of_cpu_file_matches() {
        let mut cpu = CpuBackend::new();
        for spec in all_specs() {
            let mut f = make_case(&spec);
            f.capture_reference().unwrap();
            // The op wrote something: the outputs differ from the inputs.
            let changed = OUTPUT_NAMES
                .iter()
                .any(|n| match (f.input(n), f.expected(n)) {
                    (Some(a), Some(b)) => a.data != b.data,
                    _ => false,
                });
            assert!(changed, "{spec:?} wrote nothing");
            let bytes = f.to_bytes().unwrap();
            let g = VectorFile::from_bytes(&bytes).unwrap();
            let r = g.replay(&mut cpu).unwrap();
            assert!(r.passed(), "{spec:?}\n{r}");
            assert!(r.bytes_compared > 0);
            assert!(r.mismatches.is_empty());
        }
        // A single thread gives the same bytes.
        let mut one = CpuBackend::with_threads(1).unwrap();
        let mut f = make_case(&all_specs()[0]);
        f.capture_reference().unwrap();
        assert!(f.replay(&mut one).unwrap().passed());
    }

    #[test]
    fn flipped_byte_is_reported() {
        let mut cpu = CpuBackend::new();
        let mut f = make_case(&CaseSpec {
            op: Op::RopeQuantInsert,
            layout: RecordLayout::Mxfp8,
            tokens: 10,
            ..Default::default()
        });
        f.capture_reference().unwrap();
        let slots = f.input("slot_mapping").unwrap().to_i64().unwrap();
        // Scale byte 5 of token 3's record.
        let slot = slots[3] as usize;
        let (block, row) = (slot / 64, slot % 64);
        let off = block * 64 * 528 + 64 * 512 + row * 16 + 5;
        let out = f.tensors.get_mut("out.kv_cache").unwrap();
        let before = out.data[off];
        out.data[off] ^= 0x10;
        let r = f.replay(&mut cpu).unwrap();
        assert_eq!(r.mismatch_count(), 1);
        let m = &r.mismatches[0];
        assert_eq!(m.tensor, "out.kv_cache");
        assert_eq!(m.byte_offset, off);
        assert_eq!(m.expected, before ^ 0x10);
        assert_eq!(m.got, before);
        assert_eq!(m.slot, Some(slot as u64));
        assert_eq!(m.token, Some(3));
        assert!(m.field.as_deref().unwrap().contains("scale byte 5"), "{m}");
        let text = r.to_string();
        assert!(text.contains(&format!("byte {off}")), "{text}");
        assert!(text.contains("1 of"), "{text}");
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let mut f = make_case(&CaseSpec::default());
        f.meta.insert("format".into(), "other/1".into());
        let e = VectorFile::from_bytes(&f.to_bytes().unwrap()).unwrap_err();
        assert!(e.to_string().contains("format"), "{e}");
        let mut f = make_case(&CaseSpec::default());
        f.tensors.remove("in.latent");
        let e = VectorFile::from_bytes(&f.to_bytes().unwrap()).unwrap_err();
        assert!(e.to_string().contains("in.latent"), "{e}");
        let e = VectorFile::from_bytes(b"not a file").unwrap_err();
        assert!(e.to_string().contains("safetensors"), "{e}");
        let mut f = make_case(&CaseSpec::default());
        f.meta.insert("layout".into(), "fp16".into());
        assert!(f.check().is_err());
    }

    #[test]
    fn fp8_rows_stored_as_u8_replay() {
        let mut f = make_case(&CaseSpec {
            layout: RecordLayout::Fp8Rows,
            tokens: 12,
            ..Default::default()
        });
        f.capture_reference().unwrap();
        for n in ["in.kv_cache", "out.kv_cache"] {
            f.tensors.get_mut(n).unwrap().dtype = DType::U8;
        }
        assert!(f.replay(&mut CpuBackend::new()).unwrap().passed());
    }
}
