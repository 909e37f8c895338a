//! The performance anchors: the seed's Triton kernels on an NVIDIA H200, GPU
//! time of one launch in µs from CUDA-graph replay (20 launches, median of 7
//! replays), measured 2026-11-30 with the seed module's own kernels (the
//! project's specification records them; it is not part of this repository).
//!
//! This table is the only copy of those figures in the code; a row's name is
//! the label of the bench row it is compared with.

/// The token counts `T` of the anchor table's columns (also the bench's
/// default sizes on a GPU).
pub(crate) const ANCHOR_T: [usize; 6] = [1, 16, 128, 1024, 8192, 65536];

/// µs per launch by bench row label, one value per [`ANCHOR_T`] column.
const ANCHORS: [(&str, [f64; 6]); 8] = [
    ("insert mxfp8", [1.79, 1.91, 2.03, 2.80, 9.76, 72.6]),
    ("insert nvfp4", [1.92, 1.98, 2.04, 2.93, 10.81, 76.2]),
    ("insert v4", [1.92, 2.04, 2.09, 2.64, 8.20, 67.3]),
    ("insert bf16", [1.55, 1.68, 1.77, 2.23, 6.61, 62.1]),
    ("insert fp8", [1.87, 1.83, 1.96, 2.39, 6.80, 58.2]),
    ("compress CR1", [1.72, 1.72, 1.88, 2.39, 6.70, 59.4]),
    (
        "compress CR2, T one-token requests",
        [2.29, 2.38, 2.51, 3.84, 26.9, 202.6],
    ),
    (
        "compress CR2, 4 requests of T/4",
        [2.20, 3.62, 5.96, 6.08, 9.35, 75.0],
    ),
];

/// The seed's µs per launch for the bench row `op` at `t` tokens, if measured.
pub(crate) fn anchor(op: &str, t: usize) -> Option<f64> {
    let i = ANCHOR_T.iter().position(|&x| x == t)?;
    ANCHORS
        .iter()
        .find(|(name, _)| *name == op)
        .map(|(_, v)| v[i])
}
