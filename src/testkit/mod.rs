//! Test data: a deterministic generator and the inputs of typical cases of
//! each operation, as [`VectorFile`](crate::vectors::VectorFile)s.
//!
//! [`random_call`] draws calls of every operation for the concurrency
//! tests and the `soak` command.
//!
//! What the CLI's `capture`, `bench` and `demo`, the Criterion benches and
//! the tests run. Every value is a function of a seed, so a case is
//! regenerated bit for bit anywhere (the seed harness's
//! `scripts/peers/seed_bench.py` rebuilds the bench's inputs from the same
//! rules).

mod calls;
mod cases;
mod rng;

pub use calls::{random_call, random_calls, CallMix};

pub use cases::{
    make_case, make_case_with, make_gather_case, make_written_gather_case, rope_cos_sin, split,
    CaseSpec, Floats, BLOCK_SIZE, FP8_SCALE, GATHER_BLOCK_SIZE, RMS_NORM_EPS,
};
pub use rng::{normals, Rng};

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of 16-bit values (BF16 bit patterns).
pub fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of I64 values (indices).
pub fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
