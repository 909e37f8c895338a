//! Random calls of every operation, for the concurrency tests and the soak:
//! a stream of small, self-contained vector files drawn from one seed.

use super::cases::{make_case_with, make_gather_case, make_written_gather_case, CaseSpec, Floats};
use super::Rng;
use crate::layout::{RecordLayout, RecordOrder};
use crate::tensor::DType;
use crate::vectors::{Op, VectorFile};

/// The knobs of [`random_call`].
#[derive(Debug, Clone, Copy)]
pub struct CallMix {
    /// Tokens (or reader rows) per call, at most.
    pub max_tokens: usize,
    /// Put special values and skipped slots in about one call in four.
    pub adversarial: bool,
}

impl Default for CallMix {
    fn default() -> Self {
        CallMix {
            max_tokens: 48,
            adversarial: true,
        }
    }
}

/// One random call: any operation (the four writers and the reader), any
/// layout in either record order, CR1 or CR2, sanitize on or off, 1 to `mix.max_tokens` tokens,
/// the weight and cos/sin table of any input type (half the calls the tuned
/// kernels' BF16 and F32);
/// the file holds its inputs only (run it with
/// [`VectorFile::prepare`](crate::vectors::VectorFile::prepare), or fill its
/// outputs with [`VectorFile::capture_reference`]). The same `rng` state
/// gives the same call everywhere.
pub fn random_call(rng: &mut Rng, mix: CallMix) -> VectorFile {
    let op = Op::ALL[rng.below(Op::ALL.len() as u64) as usize];
    let layout = RecordLayout::ALL[rng.below(RecordLayout::ALL.len() as u64) as usize];
    let tokens = 1 + rng.below(mix.max_tokens.max(1) as u64) as usize;
    let spec = CaseSpec {
        op,
        layout,
        compress_ratio: 1 + rng.below(2) as u32,
        tokens,
        requests: 1 + rng.below(3) as usize,
        ring_capacity: 2 + rng.below(3) as usize,
        seed: rng.next_u64(),
        sanitize: rng.below(2) == 1,
        adversarial: mix.adversarial && rng.below(4) == 0,
        ..Default::default()
    };
    // The record order from the case's seed too (the draws stay as they
    // were before there were two orders).
    let spec = CaseSpec {
        record_order: if layout.has_record_orders() {
            RecordOrder::ALL[((spec.seed >> 60) & 1) as usize]
        } else {
            RecordOrder::PagePlanar
        },
        ..spec
    };
    if op != Op::GatherDequant {
        // The types from the case's seed, so that the stream of draws is
        // the same as without them.
        return make_case_with(&spec, INPUT_FLOATS[(spec.seed >> 61) as usize]);
    }
    // The reader: slot form (0 requests) or a block table, random or
    // written records, BF16 or F32 out.
    let spec = CaseSpec {
        requests: rng.below(3) as usize,
        ..spec
    };
    let out_f32 = rng.below(2) == 1;
    if rng.below(2) == 0 {
        make_gather_case(&spec, out_f32)
    } else {
        make_written_gather_case(&spec, out_f32)
    }
}

/// The weight and table types of random calls: half of them the tuned
/// kernels' (a BF16 weight, an F32 or BF16 table), half the generic ones'.
const INPUT_FLOATS: [Floats; 8] = [
    Floats::TUNED,
    Floats::TUNED,
    floats(DType::BF16, DType::BF16),
    floats(DType::BF16, DType::F32),
    floats(DType::F32, DType::F32),
    floats(DType::F16, DType::F16),
    floats(DType::BF16, DType::F16),
    floats(DType::F32, DType::BF16),
];

const fn floats(weight: DType, cos_sin: DType) -> Floats {
    Floats { weight, cos_sin }
}

/// `n` random calls from `seed` (see [`random_call`]).
pub fn random_calls(seed: u64, n: usize, mix: CallMix) -> Vec<VectorFile> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| random_call(&mut rng, mix)).collect()
}
