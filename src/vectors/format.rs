//! The file: metadata, named tensors and their safetensors encoding.

use crate::error::{Error, Result};
use crate::layout::{RecordLayout, RecordOrder};
use crate::tensor::{DType, TensorDesc};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

/// The value of the `format` metadata key.
pub const FORMAT: &str = "dsv4-kvcache-vectors/1";

/// The output tensors a file may hold, in the order they are compared.
pub const OUTPUT_NAMES: [&str; 4] = ["kv_cache", "latent_out", "state_cache", "out"];

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
    /// `gather_dequant`, the reader.
    GatherDequant,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 5] = [
        Op::RopeQuantInsert,
        Op::FusedSaveCompressNorm,
        Op::SaveRingRows,
        Op::FusedCompressInsert,
        Op::GatherDequant,
    ];

    /// The metadata name (the seed's function name).
    pub fn name(self) -> &'static str {
        match self {
            Op::RopeQuantInsert => "rope_quant_insert",
            Op::FusedSaveCompressNorm => "fused_save_compress_norm",
            Op::SaveRingRows => "save_ring_rows",
            Op::FusedCompressInsert => "fused_compress_insert",
            Op::GatherDequant => "gather_dequant",
        }
    }

    /// Inverse of [`Op::name`].
    pub fn from_name(s: &str) -> Option<Op> {
        Self::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether the op writes a KV cache.
    pub fn inserts(self) -> bool {
        matches!(self, Op::RopeQuantInsert | Op::FusedCompressInsert)
    }

    /// Whether the op has a KV cache (and so a `layout`): the inserts and
    /// the reader.
    pub fn has_layout(self) -> bool {
        self.inserts() || self == Op::GatherDequant
    }

    /// Whether the op takes a `compress_ratio`.
    pub fn has_compress_ratio(self) -> bool {
        !matches!(self, Op::SaveRingRows | Op::GatherDequant)
    }

    /// Whether the op writes the output tensor `name` (one of
    /// [`OUTPUT_NAMES`]).
    pub fn writes(self, name: &str) -> bool {
        match self {
            Op::RopeQuantInsert => name == "kv_cache",
            Op::FusedSaveCompressNorm => matches!(name, "latent_out" | "state_cache"),
            Op::SaveRingRows => name == "state_cache",
            Op::FusedCompressInsert => matches!(name, "kv_cache" | "latent_out" | "state_cache"),
            Op::GatherDequant => name == "out",
        }
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
            // And `slot_mapping`, or `block_table` with `cu_seq_lens`
            // (checked in `VectorFile::check`).
            Op::GatherDequant => &["kv_cache", "out"],
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
            DType::I64 => Ok(le_elems(&self.data, i64::from_le_bytes)),
            DType::I32 => Ok(le_elems(&self.data, |b| i32::from_le_bytes(b) as i64)),
            d => Err(Error::Vectors(format!(
                "expected an I32 or I64 tensor, got {d}"
            ))),
        }
    }

    /// The elements of an F32 tensor.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self.dtype {
            DType::F32 => Ok(le_elems(&self.data, f32::from_le_bytes)),
            d => Err(Error::Vectors(format!("expected an F32 tensor, got {d}"))),
        }
    }
}

/// The elements of `data`, `N` little-endian bytes each, decoded by `f`.
fn le_elems<const N: usize, T>(data: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    data.chunks_exact(N)
        .map(|c| f(c.try_into().expect("N bytes")))
        .collect()
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
        DType::F16 => S::F16,
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
        S::F16 => DType::F16,
        S::U8 => DType::U8,
        S::F8_E4M3 => DType::F8E4M3,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        other => {
            return Err(Error::Vectors(format!(
                "tensor {name}: dtype {other:?} is not one of F32, BF16, F16, U8, F8_E4M3, I32, I64"
            )))
        }
    })
}

/// The first key that appears twice in one object of a JSON text (decoded,
/// so `"a"` and `"\u0061"` are the same key), or `None`. Assumes the text
/// parsed as JSON already.
pub(super) fn duplicate_key(json: &[u8]) -> Option<String> {
    // One set of keys per open object (hashed: a hostile header may hold
    // millions); arrays push nothing.
    let mut objects: Vec<std::collections::HashSet<String>> = Vec::new();
    let mut open: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'{' => {
                open.push(b'{');
                objects.push(Default::default());
            }
            b'[' => open.push(b'['),
            b'}' => {
                open.pop();
                objects.pop();
            }
            b']' => {
                open.pop();
            }
            b'"' => {
                let start = i;
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                let raw = json.get(start..=i)?;
                let mut j = i + 1;
                while j < json.len() && json[j].is_ascii_whitespace() {
                    j += 1;
                }
                // A string followed by ':' inside an object is a key.
                if open.last() == Some(&b'{') && json.get(j) == Some(&b':') {
                    let key: String = serde_json::from_slice(raw).ok()?;
                    let keys = objects.last_mut()?;
                    if keys.contains(&key) {
                        return Some(key);
                    }
                    keys.insert(key);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
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
        let (n, header) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| Error::Vectors(format!("not a valid safetensors file: {e}")))?;
        // The JSON parser keeps the last of two equal names; a file that
        // names a tensor or a metadata key twice is ambiguous, so rejected.
        if let Some(key) = bytes.get(8..8 + n).and_then(duplicate_key) {
            return Err(Error::Vectors(format!("the header names {key:?} twice")));
        }
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
        if op.has_compress_ratio() {
            self.compress_ratio()?;
        }
        if op.has_layout() {
            self.layout()?;
        }
        if op == Op::GatherDequant {
            let has = |n: &str| self.tensors.contains_key(&format!("in.{n}"));
            let table = has("block_table") || has("cu_seq_lens");
            if has("slot_mapping") == table
                || (table && !(has("block_table") && has("cu_seq_lens")))
            {
                return Err(Error::Vectors(
                    "gather_dequant needs in.slot_mapping, or in.block_table and in.cu_seq_lens (not both forms)".into(),
                ));
            }
        }
        self.sanitize()?;
        self.record_order()?;
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
                    "tensor {name}: names are in.<argument> or out.kv_cache, out.latent_out, out.state_cache, out.out"
                )));
            }
            if let Some(out) = name.strip_prefix("out.") {
                let input = self
                    .tensors
                    .get(&format!("in.{out}"))
                    .ok_or_else(|| Error::Vectors(format!("{name} has no matching in.{out}")))?;
                let expected = &self.tensors[name];
                if input.dtype != expected.dtype || input.shape != expected.shape {
                    return Err(Error::Vectors(format!(
                        "{name} is {} {:?} but in.{out} is {} {:?}",
                        expected.dtype, expected.shape, input.dtype, input.shape
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
                "op {s:?}, expected one of rope_quant_insert, fused_save_compress_norm, save_ring_rows, fused_compress_insert, gather_dequant"
            ))
        })
    }

    /// The `layout` metadata (inserts and the reader).
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

    /// The `record_order` metadata (`planar` or `per_token`; absent is the
    /// seed's `planar`).
    pub fn record_order(&self) -> Result<RecordOrder> {
        match self.meta.get("record_order").map(|s| s.trim()) {
            None => Ok(RecordOrder::PagePlanar),
            Some(s) => RecordOrder::from_name(s).ok_or_else(|| {
                Error::Vectors(format!("record_order {s:?}, expected planar or per_token"))
            }),
        }
    }

    /// The `sanitize` metadata (absent is false).
    pub fn sanitize(&self) -> Result<bool> {
        self.meta_flag("sanitize")
    }

    /// Whether the fused op skips `latent_out` (`skip_latent_out`, absent is false).
    pub fn skip_latent_out(&self) -> Result<bool> {
        self.meta_flag("skip_latent_out")
    }

    /// A `true`/`false` metadata entry (absent is false).
    fn meta_flag(&self, key: &str) -> Result<bool> {
        match self.meta.get(key).map(|s| s.trim()) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(s) => Err(Error::Vectors(format!(
                "{key} {s:?}, expected true or false"
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
}
