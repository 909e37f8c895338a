// dsv4-kvcache device kernels: fused_save_compress_norm, rope_quant_insert,
// save_ring_rows, the fused compress+insert, the reader (gather_dequant),
// the indexer key store (indexer_k_norm_rope_store) and the copy roofline.
// One source for HIP (gfx90a, gfx942, gfx950) and CUDA (sm_90 .. sm_120);
// vendor spellings live in the preludes.
//
// Work split: a token (or a CR2 request) is handled by a group of 32 lanes;
// lane l owns dims [16 l, 16 l + 16) of a 512-vector (tile l). The
// tile-major inserts (kv_insert.hip) map a block's threads to tiles differently
// (kv_tile_of_thread), and there the tile index plays the lane's part; CR2
// teams (kv_part_offset) and save_ring_rows, whose lanes move values that
// no norm or record of theirs reads in place, give each group contiguous
// bytes instead.
// Lanes talk only through kv_shfl_xor (distances below 32) and kv_shfl_idx_u32 (a lane of the same
// group), which stay inside an aligned 32-lane group on 32-lane warps and on
// 64-lane wavefronts, so nothing here depends on the hardware's width. The
// host picks how many groups make a block (src/device/launch.rs, LaunchPolicy::geometry) and
// passes it in the flags word. Groups never wait for each other, so a group
// whose token is skipped simply returns; the one exception is the CR2 team
// kernels, where a block of four groups shares one item and meets at one
// barrier that the item's control flow brings every lane to.
//
// Every result is bit-identical to the CPU reference (src/numerics/reference.rs,
// src/backend/cpu.rs): the math is in kv_formats.h / kv_math.h, twins of
// src/numerics/formats.rs / src/numerics/math.rs.
//
// The one translation unit that build.rs compiles for every target (and
// kernels-cuda/kvcache.cu includes for nvcc): the kernel files in order.
// Every entry point is listed once, in KV_KERNELS (kv_abi.h). Files:
//   kv_abi.h       parameter blocks, flag bits, the kernel list (KV_KERNELS)
//   kv_formats.h   number formats: encoders and decoders (formats.rs twin)
//   kv_math.h      norm, RoPE, pooling and scale math (math.rs twin)
//   kv_occupancy.h blocks per SM per kernel family (KV_LAUNCH_BOUNDS*)
//   kv_common.h    shared device helpers: lanes, indices, pages, vector I/O
//   kv_record.h    one token's record: RoPE, quantizers, kv_write_record
//   kv_compress.h  the compressor's items: pooling, the norm, CR2 teams
//   kv_gather.h    the reader's device functions
//   kv_compress.hip, kv_insert.hip, kv_fused.hip, kv_copy.hip,
//   kv_gather.hip, kv_indexer_k.hip  the entry points, in this order
#include "kv_compress.hip"
#include "kv_insert.hip"
#include "kv_fused.hip"
#include "kv_copy.hip"
#include "kv_gather.hip"
#include "kv_indexer_k.hip"

// Every kernel of the list (kv_abi.h) declared again with its parameter
// block: a definition above that takes another block does not compile.
#define KV_DECLARE_KERNEL(name, params) KV_KERNEL void name(const params p);
KV_KERNELS(KV_DECLARE_KERNEL)
#undef KV_DECLARE_KERNEL
