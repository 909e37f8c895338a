// Every kernel's occupancy, in one table: KV_LAUNCH_BOUNDS*(n) is
// KV_BOUNDS(n, blocks per SM on sm_90, on sm_100, on sm_103, on sm_120),
// which the preludes spell per vendor. On CUDA the blocks per SM are a
// register cap for ptxas; on AMD only the work-group size bound n applies,
// and in the host tests nothing. tests/code_objects.rs checks every kernel
// for spills on every target; docs/tuning.md ("Occupancy caps") has the
// measurements, and no Blackwell choice is measured (no Blackwell GPU here).
//
// sm_103 (B300) takes sm_100's numbers but where its compiler spills at them;
// sm_120 (RTX PRO 6000, RTX 50) has 1536 threads per SM, not 2048, so no
// more blocks than fit that (ptxas ignores a bound that cannot be met), and
// fewer where its compiler spills. A GPU without SASS of its own runs the
// compute_90 PTX, and with it sm_90's numbers.
#pragma once

// Three blocks per SM on sm_90, at most 80 registers: the CR2 kernels are
// bound by the latency of their dependent loads, so their speed follows the
// groups in flight; they fit 80 without spilling there. sm_100's compiler
// spills the fused CR2 V4 kernel at 80, so it keeps two blocks. Also
// save_ring_rows, the copy roofline and the hardware-format self-check.
#define KV_LAUNCH_BOUNDS(n) KV_BOUNDS(n, 3, 2, 2, 2)
// Two blocks per SM: the one-group fused CR2 V4 kernel holds a CR2 item's two
// rows (64 floats a lane) with the insert's state live and spills at 80
// registers (it takes 88 when allowed). The other layouts' fused CR2 kernels
// fit 80 since the pooling runs one exp per dim, and take three blocks,
// which runs faster. Also the generic _wide compress and insert kernels,
// for room to hold 16 f32 weights.
#define KV_LAUNCH_BOUNDS_2(n) KV_BOUNDS(n, 2, 2, 2, 2)
// Four blocks per SM, at most 64 registers: the long-chunk CR2 kernel,
// whose lone groups pool by halves to fit (sm_120's compiler spills 4-16
// bytes in them at 64, so three there).
#define KV_LAUNCH_BOUNDS_4(n) KV_BOUNDS(n, 4, 4, 4, 3)
// Five blocks per SM, at most 48 registers: the fused CR1 kernels (the
// insert's work plus the norm; at 40 registers they spill).
#define KV_LAUNCH_BOUNDS_5(n) KV_BOUNDS(n, 5, 5, 5, 5)
// Six blocks per SM, at most 40 registers: the insert kernels (and compress
// CR1) are bound by instruction issue and latency, not registers, and 48
// warps per SM beat 32 for every layout; seven blocks would mean 32
// registers, and spills.
// sm_100's compiler spills the tile-major inserts at 40, so there it is
// five (48 registers).
#define KV_LAUNCH_BOUNDS_6(n) KV_BOUNDS(n, 6, 5, 5, 5)
// Eight blocks per SM, at most 32 registers: the tile-major FP8 rows and
// NVFP4 inserts, which wait on their loads or their issue at 48 warps and,
// encoding pair by pair, fit 32 registers without spilling: 64 warps per SM.
// Also the large-launch V4 and MXFP8 inserts, their work ordered to fit.
// sm_103's compiler spills the V4 one at 32 (4 bytes), and seven blocks
// still mean 32 (registers go by eight), so six there (40 registers), as
// on sm_120, which holds no more blocks of 256.
#define KV_LAUNCH_BOUNDS_8(n) KV_BOUNDS(n, 8, 8, 6, 6)
// Nine team blocks (of 128) per SM, at most 56 registers: the CR2 team
// kernels at 56 where the fused NVFP4 one had grown to 72, i.e. 28 warps per
// SM where the others had 36 (and ran slower).
#define KV_LAUNCH_BOUNDS_9(n) KV_BOUNDS(n, 9, 9, 9, 9)
// Ten team blocks per SM, at most 48 registers: the compress team kernel
// of multi-token decode, which takes 50 by itself (its request items pool a
// two-token chunk's second token too), where the plain one takes 48; at
// nine blocks, 1024 one-token requests (1280 screened blocks) need a
// second wave on the H200's 132 SMs.
// CUDA 12.9's NVVM writes this kernel's PTX so that sm_90's ptxas spills
// 32 bytes at 48 registers (13.0's fits), so a CUDA 12 build gives it nine
// blocks there (56 registers).
#if defined(KV_CUDA_12)
#define KV_LAUNCH_BOUNDS_10(n) KV_BOUNDS(n, 9, 10, 10, 10)
#else
#define KV_LAUNCH_BOUNDS_10(n) KV_BOUNDS(n, 10, 10, 10, 10)
#endif
// Sixteen pair blocks (of 64) per SM, at most 64 registers: the CR2 pair
// kernels. Only the fused NVFP4 one takes more when free (70: fourteen
// blocks); at 64 it does not spill, and runs faster. sm_100's compiler
// spills the fused V4 one at 64, so it keeps fourteen there (72 registers).
#define KV_LAUNCH_BOUNDS_16(n) KV_BOUNDS(n, 16, 14, 14, 14)
