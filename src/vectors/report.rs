//! The diff report: which bytes differ, and the slot, token and record field
//! each one belongs to.

use super::format::{Op, VectorFile};
use crate::error::Result;
use crate::layout::{RecordLayout, RecordOrder};
use crate::ops::SkipCounts;
use std::collections::HashMap;
use std::fmt;

/// Mismatches a [`ReplayReport`] keeps in detail (all are counted).
pub const MAX_RECORDED_MISMATCHES: usize = 10_000;

/// One byte that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// `out.kv_cache`, `out.latent_out`, `out.state_cache` or `out.out`.
    pub tensor: String,
    /// Offset of the byte in the tensor.
    pub byte_offset: usize,
    /// The file's byte.
    pub expected: u8,
    /// The backend's byte.
    pub got: u8,
    /// The cache slot (or ring slot) the byte belongs to, when it is in one.
    pub slot: Option<u64>,
    /// The token (row of the inputs) that writes that slot or row, if any
    /// (a gather: the output row).
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
    /// Compares the bytes a backend wrote (`outs`, by output name) with the
    /// file's `out.*` tensors.
    pub(super) fn compare(
        file: &VectorFile,
        backend: String,
        outs: &[(&'static str, Vec<u8>)],
        skipped: SkipCounts,
    ) -> Result<Self> {
        let mut report = ReplayReport {
            op: file.op()?.name().to_string(),
            backend,
            skipped,
            ..Default::default()
        };
        let locator = Locator::new(file)?;
        for (name, got) in outs {
            let Some(expected) = file.expected(name) else {
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
    order: RecordOrder,
    cache_shape: Vec<usize>,
    cache_esz: usize,
    /// Bytes per element of a gather's `out`.
    out_esz: usize,
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
            Op::GatherDequant => (HashMap::new(), HashMap::new()),
        };
        let cache = f.input("kv_cache");
        Ok(Locator {
            layout: if op.has_layout() {
                Some(f.layout()?)
            } else {
                None
            },
            order: f.record_order()?,
            cache_shape: cache.map(|t| t.shape.clone()).unwrap_or_default(),
            cache_esz: cache.map_or(1, |t| t.dtype.size()),
            out_esz: f.input("out").map_or(2, |t| t.dtype.size()),
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
            "out" => (
                None,
                Some(off / (512 * self.out_esz)),
                Some(format!(
                    "output row {}, dim {}",
                    off / (512 * self.out_esz),
                    (off / self.out_esz) % 512
                )),
            ),
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
            match self.order {
                RecordOrder::PagePlanar if in_page < bs * v => {
                    let (row, k) = (in_page / v, in_page % v);
                    (block * bs + row, value_field(layout, k))
                }
                RecordOrder::PagePlanar => {
                    let r = in_page - bs * v;
                    let (row, j) = (r / s, r % s);
                    (block * bs + row, scale_field(layout, j))
                }
                RecordOrder::PerToken => {
                    let (row, k) = (in_page / (v + s), in_page % (v + s));
                    let field = if k < v {
                        value_field(layout, k)
                    } else {
                        scale_field(layout, k - v)
                    };
                    (block * bs + row, field)
                }
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
