// Runs the gather kernels of kernels-hip/kv_gather.h on the host for
// tests/gather_host_kernels.rs. Input (stdin): the buffers, the parameter
// block with every pointer as (buffer index + 1) << 48 | byte offset, the
// kernel's index among the gather kernels, the grid and the block size.
// Output (stdout): every buffer after the launch, then the three counters.
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include <stdio.h>
#include <vector>

unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;
// The CR2 team kernels' dynamic shared memory (never run here).
float kv_team_shared[1];

static void read_all(void* p, size_t n) {
    if (fread(p, 1, n, stdin) != n) {
        fprintf(stderr, "short input\n");
        exit(2);
    }
}

template <class T>
static void relocate(T*& field, std::vector<std::vector<uint8_t>>& bufs) {
    uint64_t v = (uint64_t)(uintptr_t)field;
    if (v == 0) return;
    uint64_t id = (v >> 48) - 1, off = v & 0xffffffffffffull;
    field = (T*)(bufs.at(id).data() + off);
}

int main() {
    uint32_t nbufs;
    read_all(&nbufs, 4);
    std::vector<std::vector<uint8_t>> bufs(nbufs);
    for (auto& b : bufs) {
        uint64_t len;
        read_all(&len, 8);
        b.resize(len + 16);  // slack: a bad address shows as a mismatch, not a crash
        read_all(b.data(), len);
        b.resize(len);
    }
    KvGatherParams p;
    read_all(&p, sizeof p);
    uint32_t kernel, grid, block;
    read_all(&kernel, 4);
    read_all(&grid, 4);
    read_all(&block, 4);
    unsigned counters[3] = {0, 0, 0};
    relocate(p.cache, bufs);
    relocate(p.slots, bufs);
    relocate(p.block_table, bufs);
    relocate(p.cu_seq_lens, bufs);
    relocate(p.seq_starts, bufs);
    relocate(p.fp8_scale, bufs);
    relocate(p.out, bufs);
    p.counters = counters;
    typedef void (*K)(const KvGatherParams);
    // In the order of kv_abi.h's list.
    const K kernels[20] = {kv_gather_v4_bf16,          kv_gather_v4_f32,          kv_gather_mxfp8_bf16,
                           kv_gather_mxfp8_f32,        kv_gather_nvfp4_bf16,      kv_gather_nvfp4_f32,
                           kv_gather_bf16_bf16,        kv_gather_bf16_f32,        kv_gather_fp8_bf16,
                           kv_gather_fp8_f32,          kv_gather_v4_bf16_slots,   kv_gather_v4_f32_slots,
                           kv_gather_mxfp8_bf16_slots, kv_gather_mxfp8_f32_slots, kv_gather_nvfp4_bf16_slots,
                           kv_gather_nvfp4_f32_slots,  kv_gather_bf16_bf16_slots, kv_gather_bf16_f32_slots,
                           kv_gather_fp8_bf16_slots,   kv_gather_fp8_f32_slots};
    if (kernel >= 20) {
        fprintf(stderr, "no gather kernel %u\n", kernel);
        exit(2);
    }
    kv_host_bdim = block;
    kv_host_gdim = grid;
    for (kv_host_bid = 0; kv_host_bid < grid; ++kv_host_bid)
        for (kv_host_tid = 0; kv_host_tid < block; ++kv_host_tid) kernels[kernel](p);
    for (auto& b : bufs) fwrite(b.data(), 1, b.size(), stdout);
    fwrite(counters, 4, 3, stdout);
    return 0;
}
