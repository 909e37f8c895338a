//! The reader's reference: what every backend's `gather_dequant` writes,
//! computed on the host from a [`GatherPlan`].

use super::{GatherAddressing, GatherArgs, GatherIndex, GatherPlan};
use crate::formats::{bf16_from_f32, f32_canonical};
use crate::layout::{decode_record, DIM};
use crate::ops::{IndexPlan, SkipCounts};
use crate::tensor::Storage;
use rayon::prelude::*;

/// Where an output row's record is, or why there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Located {
    /// Block and row of the cache.
    Record { block: usize, row: usize },
    /// Nothing to read, nothing counted (a slot `< 0`, a row no request owns).
    Nothing,
    /// Nothing to read, counted.
    Skip(SkipCounts),
}

fn skip(slot: u64, pos: u64, idx: u64) -> Located {
    Located::Skip(SkipCounts {
        slot_out_of_range: slot,
        position_out_of_range: pos,
        index_out_of_range: idx,
    })
}

/// `gather_dequant`'s inputs bound to their bytes.
struct GatherIn<'a> {
    p: &'a GatherPlan,
    cache: &'a [u8],
    fp8_scale: f32,
    slots: &'a [u8],
    table: &'a [u8],
    cu: &'a [u8],
    starts: &'a [u8],
}

impl GatherIn<'_> {
    /// The request search of `docs/layouts.md`: a binary search that, on a
    /// non-decreasing `cu_seq_lens`, finds the last request starting at or
    /// before row `o`. Written once, as the kernels run it, so that any
    /// `cu_seq_lens` gives the same rows everywhere.
    fn request_of(&self, cu: &IndexPlan, reqs: usize, o: i64) -> usize {
        let (mut lo, mut hi) = (0usize, reqs);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if cu.read(self.cu, mid) <= o {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn locate(&self, o: usize) -> Located {
        let c = &self.p.cache;
        let bs = c.block_size as i64;
        match &self.p.addressing {
            GatherAddressing::Slots(s) => {
                let slot = s.read(self.slots, o);
                if slot < 0 {
                    return Located::Nothing;
                }
                if slot as u64 >= c.capacity() {
                    return skip(1, 0, 0);
                }
                Located::Record {
                    block: (slot / bs) as usize,
                    row: (slot % bs) as usize,
                }
            }
            GatherAddressing::BlockTable {
                table,
                cu_seq_lens: cu,
                seq_starts,
            } => {
                let reqs = cu.len - 1;
                if reqs == 0 {
                    return Located::Nothing;
                }
                let o = o as i64;
                let r = self.request_of(cu, reqs, o);
                let (c0, c1) = (cu.read(self.cu, r), cu.read(self.cu, r + 1));
                if !(c0 <= o && o < c1) {
                    return Located::Nothing;
                }
                let start = seq_starts.map_or(0, |s| s.read(self.starts, r));
                // o - c0 < 2^24 and fits; a position past i64 is past the table.
                let Some(pos) = (start >= 0).then(|| start.checked_add(o - c0)).flatten() else {
                    return skip(0, 1, 0);
                };
                let j = pos / bs;
                if j as u64 >= table.cols as u64 {
                    return skip(0, 1, 0);
                }
                let block = table.at(self.table, r, j as usize);
                if block < 0 || block as u64 >= c.blocks as u64 {
                    return skip(1, 0, 0);
                }
                Located::Record {
                    block: block as usize,
                    row: (pos % bs) as usize,
                }
            }
        }
    }

    /// The once-per-call check of the block-table form: a total beyond
    /// `out`'s rows leaves tokens ungathered.
    fn total_check(&self) -> SkipCounts {
        let mut k = SkipCounts::default();
        if let GatherAddressing::BlockTable {
            cu_seq_lens: cu, ..
        } = &self.p.addressing
        {
            if self.p.n > 0 && cu.read(self.cu, cu.len - 1) > self.p.n as i64 {
                k.index_out_of_range = 1;
            }
        }
        k
    }

    /// Output row `o` into `out` (its `512 × element` bytes).
    fn row(&self, o: usize, out: &mut [u8]) -> SkipCounts {
        let (block, row) = match self.locate(o) {
            Located::Record { block, row } => (block, row),
            Located::Nothing => return SkipCounts::default(),
            Located::Skip(k) => return k,
        };
        let c = &self.p.cache;
        let l = c.layout;
        let (values, scales) = c.record_offsets(block, row);
        let v = decode_record(
            l,
            &self.cache[values..values + l.value_bytes()],
            &self.cache[scales..scales + l.scale_bytes()],
            self.fp8_scale,
        );
        if self.p.out_f32 {
            for (d, x) in out.chunks_exact_mut(4).zip(v) {
                d.copy_from_slice(&f32_canonical(x).to_le_bytes());
            }
        } else {
            for (d, x) in out.chunks_exact_mut(2).zip(v) {
                d.copy_from_slice(&bf16_from_f32(x).to_le_bytes());
            }
        }
        SkipCounts::default()
    }
}

fn sum_counts(mut a: SkipCounts, b: SkipCounts) -> SkipCounts {
    a.add(b);
    a
}

/// The reference `gather_dequant` on a validated plan: rows in parallel on
/// the current rayon pool (each output row is written by one index at most,
/// so the order does not matter). Returns the skip counts.
pub(crate) fn gather_reference<S>(p: &GatherPlan, a: GatherArgs<'_, S>) -> SkipCounts
where
    S: Storage + AsRef<[u8]> + AsMut<[u8]> + ?Sized,
{
    let (slots, table, cu, starts): (&[u8], &[u8], &[u8], &[u8]) = match &a.index {
        GatherIndex::Slots { slot_mapping } => (slot_mapping.buf.as_ref(), &[], &[], &[]),
        GatherIndex::BlockTable {
            block_table,
            cu_seq_lens,
            seq_starts,
        } => (
            &[],
            block_table.buf.as_ref(),
            cu_seq_lens.buf.as_ref(),
            seq_starts.as_ref().map_or(&[][..], |t| t.buf.as_ref()),
        ),
    };
    let src = GatherIn {
        p,
        cache: a.kv_cache.buf.as_ref(),
        fp8_scale: match (p.fp8_scale_offset, &a.fp8_scale) {
            (Some(o), Some(t)) => {
                f32::from_le_bytes(t.buf.as_ref()[o..o + 4].try_into().expect("4 bytes"))
            }
            _ => 1.0,
        },
        slots,
        table,
        cu,
        starts,
    };
    let mut counts = src.total_check();
    if p.n == 0 {
        return counts;
    }
    let esz = if p.out_f32 { 4 } else { 2 };
    let (stride, row_bytes) = (p.out.row_stride * esz, DIM * esz);
    let start = p.out.offset;
    let end = start + (p.n - 1) * stride + row_bytes;
    let rows = a.out.buf.as_mut()[start..end]
        .par_chunks_mut(stride)
        .enumerate()
        .map(|(o, chunk)| src.row(o, &mut chunk[..row_bytes]))
        .reduce(SkipCounts::default, sum_counts);
    counts.add(rows);
    counts
}
