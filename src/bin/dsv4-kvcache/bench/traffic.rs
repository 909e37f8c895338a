//! The bench's traffic model: the bytes a launch must move, so that its time
//! becomes a bandwidth comparable with the copy rate and the anchors.

use dsv4_kvcache::layout::RecordLayout;
use dsv4_kvcache::vectors::{Op, VectorFile};
use dsv4_kvcache::Result;

/// Bytes a launch reads plus writes, counted as `anchors.md` does: an insert
/// reads the BF16 latent (1024 B) and writes the record per written token;
/// CR1 reads 2048 B and writes 1024 B per token; CR2 reads each token's
/// 4096 B row, a ring row for each chunk-first boundary token, and writes
/// 1024 B per latent and 4096 B per ring store; ring rows copy 4096 B.
pub(crate) fn traffic(f: &VectorFile, layout: Option<RecordLayout>) -> Result<u64> {
    let op = f.op()?;
    let slots = f
        .input("slot_mapping")
        .map(|t| t.to_i64())
        .transpose()?
        .unwrap_or_default();
    let pos = f
        .input("positions")
        .map(|t| t.to_i64())
        .transpose()?
        .unwrap_or_default();
    Ok(match op {
        Op::RopeQuantInsert => {
            let cr = f.compress_ratio()? as i64;
            let w = layout.map_or(0, |l| l.record_bytes()) as u64;
            let written = slots
                .iter()
                .zip(&pos)
                .filter(|(s, p)| **s >= 0 && (**p + 1) % cr == 0)
                .count() as u64;
            written * (1024 + w)
        }
        Op::SaveRingRows => slots.iter().filter(|s| **s >= 0).count() as u64 * 8192,
        // The reader: a record read and a 512-value row written per output
        // row (the slot form's rows; the block table's output rows).
        Op::GatherDequant => {
            let w = layout.map_or(0, |l| l.record_bytes()) as u64;
            let out = f.input("out");
            let rows = if slots.is_empty() {
                out.map_or(0, |t| t.shape[0]) as u64
            } else {
                slots.iter().filter(|s| **s >= 0).count() as u64
            };
            rows * (w + 512 * out.map_or(2, |t| t.dtype.size()) as u64)
        }
        Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
            if f.compress_ratio()? == 1 {
                slots.iter().filter(|s| **s >= 0).count() as u64 * 3072
            } else {
                let qsl = f
                    .input("query_start_loc")
                    .map(|t| t.to_i64())
                    .transpose()?
                    .unwrap_or_default();
                let cap = f.input("state_cache").map_or(1, |t| t.shape[1]) as i64;
                let mut bytes = 0u64;
                for w in qsl.windows(2) {
                    let (s, e) = (w[0], w[1]);
                    if s >= e {
                        continue;
                    }
                    for t in s..e {
                        let (t, p) = (t as usize, pos[t as usize]);
                        bytes += 4096;
                        if slots[t] >= 0 && (p + 1) % 2 == 0 {
                            bytes += 1024;
                            if t as i64 == s {
                                bytes += 4096;
                            }
                        }
                        if slots[s as usize] >= 0 && slots[t] >= 0 && t as i64 >= e - cap {
                            bytes += 4096;
                        }
                    }
                }
                bytes
            }
        }
    })
}
