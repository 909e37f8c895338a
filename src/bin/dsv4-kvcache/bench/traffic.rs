//! The bench's traffic model: the bytes a launch must move, so that its time
//! becomes a bandwidth comparable with the SM copy roofline.
//!
//! Each op's count is what any kernel doing the same work has to read or
//! write at least once: every tensor the work touches, each byte once
//! (a cos/sin row once per distinct row, the RMSNorm weight once per
//! launch), nothing for tensors a kernel could derive (CR2's
//! `token_to_req_indices`) and nothing for work that is skipped (a token
//! with a negative slot costs its index reads only). Dividing these bytes by
//! the time gives a lower bound of the bandwidth used, so "% of roofline" is
//! a lower bound of how close a kernel is to the limit. `docs/benchmarks.md`
//! states the same formulas as a table.

use dsv4_kvcache::layout::RecordLayout;
use dsv4_kvcache::vectors::{Op, VTensor, VectorFile};
use dsv4_kvcache::{Error, Result};
use std::collections::BTreeSet;

/// BF16 latent row: 512 values.
const LATENT_BYTES: u64 = 1024;
/// CR1 compressor input per token: the 512 F32 kv values (the score half of
/// the row is not needed when a group is one token).
const CR1_ROW_BYTES: u64 = 2048;
/// CR2 compressor row (and ring row): 512 kv + 512 score values, F32.
const CR2_ROW_BYTES: u64 = 4096;
/// RMSNorm weight: 512 BF16 values, read once per launch.
const WEIGHT_BYTES: u64 = 1024;
/// A save_ring_rows row: 1024 F32 values.
const RING_ROW_BYTES: u64 = 4096;

/// Bytes a launch of the case `f` reads plus writes (see the module doc).
pub(crate) fn traffic(f: &VectorFile, layout: Option<RecordLayout>) -> Result<u64> {
    Ok(match f.op()? {
        Op::RopeQuantInsert => insert_bytes(f, layout, "slot_mapping")?.total(),
        Op::SaveRingRows => ring_rows_bytes(f)?,
        Op::FusedSaveCompressNorm => compress_bytes(f)?,
        Op::FusedCompressInsert => fused_bytes(f, layout)?,
        Op::GatherDequant => gather_bytes(f, layout)?,
    })
}

/// A gather: each gathered row reads its record (value and scale bytes) and
/// writes its output row (512 BF16 or F32 values); the index tensors are
/// read whole, the FP8 scale once. The slot form gathers the slots `>= 0`,
/// the block-table form every output row.
fn gather_bytes(f: &VectorFile, layout: Option<RecordLayout>) -> Result<u64> {
    let record = layout.map_or(0, |l| l.record_bytes()) as u64;
    let out = need(f, "out")?;
    let slots = ints(f, "slot_mapping")?;
    let rows = if f.input("slot_mapping").is_some() {
        slots.iter().filter(|s| **s >= 0).count() as u64
    } else {
        out.shape[0] as u64
    };
    let indices = size(f, "slot_mapping")
        + size(f, "block_table")
        + size(f, "cu_seq_lens")
        + size(f, "seq_starts")
        + size(f, "fp8_scale");
    Ok(rows * (record + 512 * out.dtype.size() as u64) + indices)
}

/// An input's values as i64 (empty if absent).
fn ints(f: &VectorFile, name: &str) -> Result<Vec<i64>> {
    Ok(f.input(name)
        .map(|t| t.to_i64())
        .transpose()?
        .unwrap_or_default())
}

/// An input's size in bytes (0 if absent): index tensors are read whole.
fn size(f: &VectorFile, name: &str) -> u64 {
    f.input(name).map_or(0, |t| t.data.len() as u64)
}

fn need<'a>(f: &'a VectorFile, name: &str) -> Result<&'a VTensor> {
    f.input(name)
        .ok_or_else(|| Error::Vectors(format!("bench case without in.{name}")))
}

/// The insert part of a launch, split so that the fused kernels can leave
/// out the latent they produce themselves.
struct InsertBytes {
    /// Latent rows read: 1024 B per written token.
    latent: u64,
    /// Everything else: records, cos/sin rows, indices, the FP8 scale.
    rest: u64,
}

impl InsertBytes {
    fn total(&self) -> u64 {
        self.latent + self.rest
    }
}

/// `rope_quant_insert`: per token, its position and slot (index tensors,
/// read whole); per written token (slot >= 0, a group boundary:
/// `(pos + 1) % compress_ratio == 0`), its BF16 latent row (1024 B) read
/// and its record written (values and scales, `RecordLayout::record_bytes`:
/// V4 584, MXFP8 528, NVFP4 288, BF16 rows 1024, FP8 rows 512); per distinct
/// cos/sin row used (`pos` at CR1, `pos - 1` at CR2), its 32 cos and 32 sin
/// values (256 B in F32, 128 B in BF16); FP8 rows' 4-byte scale once.
/// `slots` names the cache slot tensor (`cache_slot_mapping` in fused cases).
fn insert_bytes(f: &VectorFile, layout: Option<RecordLayout>, slots: &str) -> Result<InsertBytes> {
    let layout = layout.ok_or_else(|| Error::Vectors("an insert case without a layout".into()))?;
    let cr = i64::from(f.compress_ratio()?);
    let slot = ints(f, slots)?;
    let pos = ints(f, "positions")?;
    let cos = need(f, "cos_sin")?;
    let cos_row = 64 * cos.dtype.size() as u64;
    let mut written = 0u64;
    let mut rows = BTreeSet::new();
    for (s, p) in slot.iter().zip(&pos) {
        if *s >= 0 && *p >= 0 && (*p + 1) % cr == 0 {
            written += 1;
            rows.insert(*p + 1 - cr);
        }
    }
    let scale = if layout == RecordLayout::Fp8Rows {
        4
    } else {
        0
    };
    Ok(InsertBytes {
        latent: written * LATENT_BYTES,
        rest: written * layout.record_bytes() as u64
            + rows.len() as u64 * cos_row
            + size(f, slots)
            + size(f, "positions")
            + scale,
    })
}

/// `save_ring_rows`: per row with a slot >= 0, 4096 B read and 4096 B
/// written; the slot tensor.
fn ring_rows_bytes(f: &VectorFile) -> Result<u64> {
    let slots = ints(f, "slot_mapping")?;
    let rows = slots.iter().filter(|s| **s >= 0).count() as u64;
    Ok(rows * 2 * RING_ROW_BYTES + size(f, "slot_mapping"))
}

/// `fused_save_compress_norm`, with the latent stores counted.
fn compress_bytes(f: &VectorFile) -> Result<u64> {
    let c = compress_parts(f)?;
    Ok(c.rest + c.latents * LATENT_BYTES)
}

/// The compressor's bytes, its latent stores apart.
struct CompressBytes {
    /// Latents produced (one per written group).
    latents: u64,
    /// Everything else.
    rest: u64,
}

/// `fused_save_compress_norm`. Always: positions and slots (read whole),
/// the RMSNorm weight (1024 B) once. CR1: per token with a slot >= 0, its
/// 512 kv values (2048 B) read and one latent (1024 B) written. CR2, per
/// request `[s, e)` of `query_start_loc` (read whole): every token's 4096 B
/// row read; a boundary token (odd position) with a slot writes a latent
/// (1024 B), and if it is the request's first token it also reads the
/// group's older half from the ring (4096 B); each of the request's last
/// `ring_capacity` tokens is stored to the ring (4096 B) when the request
/// and the token have slots.
fn compress_parts(f: &VectorFile) -> Result<CompressBytes> {
    let slots = ints(f, "slot_mapping")?;
    let pos = ints(f, "positions")?;
    let always = size(f, "slot_mapping") + size(f, "positions") + WEIGHT_BYTES;
    if f.compress_ratio()? == 1 {
        let n = slots.iter().filter(|s| **s >= 0).count() as u64;
        return Ok(CompressBytes {
            latents: n,
            rest: always + n * CR1_ROW_BYTES,
        });
    }
    let qsl = ints(f, "query_start_loc")?;
    let cap = f.input("state_cache").map_or(1, |t| t.shape[1]) as i64;
    let mut rest = always + size(f, "query_start_loc");
    let mut latents = 0u64;
    for w in qsl.windows(2) {
        let (s, e) = (w[0], w[1]);
        for t in s..e {
            let (ti, p) = (t as usize, pos[t as usize]);
            rest += CR2_ROW_BYTES;
            if slots[ti] >= 0 && (p + 1) % 2 == 0 {
                latents += 1;
                if t == s {
                    rest += CR2_ROW_BYTES;
                }
            }
            if slots[s as usize] >= 0 && slots[ti] >= 0 && t >= e - cap {
                rest += CR2_ROW_BYTES;
            }
        }
    }
    Ok(CompressBytes { latents, rest })
}

/// `fused_compress_insert`: the compressor's bytes and the insert's, less
/// the latent the insert takes from registers instead of memory, and less
/// the latent stores (written only when the caller asks for `latent_out`,
/// so not required); the positions, read once, are not counted twice.
fn fused_bytes(f: &VectorFile, layout: Option<RecordLayout>) -> Result<u64> {
    let c = compress_parts(f)?;
    let i = insert_bytes(f, layout, "cache_slot_mapping")?;
    Ok(c.rest + i.rest - size(f, "positions"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsv4_kvcache::testkit::{make_case, CaseSpec};

    /// The bench's CR1 insert case (all slots valid, positions `0..T`,
    /// distinct cos/sin rows, I64 indices, F32 table): per token the
    /// latent, the record, one cos/sin row and two indices.
    #[test]
    fn cr1_insert_counts_latent_record_cos_sin_and_indices() {
        for (l, per_token) in [
            (RecordLayout::V4, 1880u64),
            (RecordLayout::Mxfp8, 1824),
            (RecordLayout::Nvfp4, 1584),
            (RecordLayout::Bf16Rows, 2320),
            (RecordLayout::Fp8Rows, 1808),
        ] {
            let f = make_case(&CaseSpec {
                op: Op::RopeQuantInsert,
                layout: l,
                tokens: 64,
                ..Default::default()
            });
            let scale = if l == RecordLayout::Fp8Rows { 4 } else { 0 };
            assert_eq!(
                traffic(&f, Some(l)).unwrap(),
                64 * per_token + scale,
                "{l:?}"
            );
        }
    }

    /// `save_ring_rows` moves each valid row twice (read and write) plus
    /// its slot.
    #[test]
    fn ring_rows_count_both_directions() {
        let f = make_case(&CaseSpec {
            op: Op::SaveRingRows,
            tokens: 32,
            ..Default::default()
        });
        assert_eq!(traffic(&f, None).unwrap(), 32 * (8192 + 8));
    }
}
