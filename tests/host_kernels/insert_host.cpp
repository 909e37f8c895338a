// Runs the insert kernels whose lanes never talk to each other (NVFP4, BF16
// and FP8 rows, by token and tile-major) on the host for
// tests/insert_host_kernels.rs. Input (stdin): the buffers, the parameter
// block with every pointer as (buffer index + 1) << 48 | byte offset, the
// kernel's name, the grid and the block size. Output (stdout): every buffer
// after the launch, then the three counters.
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include <stdio.h>
#include <string>
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
    KvInsertParams p;
    read_all(&p, sizeof p);
    uint32_t name_len, grid, block;
    read_all(&name_len, 4);
    std::string name(name_len, '\0');
    read_all(&name[0], name_len);
    read_all(&grid, 4);
    read_all(&block, 4);
    unsigned counters[3] = {0, 0, 0};
    relocate(p.latent, bufs);
    relocate(p.positions, bufs);
    relocate(p.slots, bufs);
    relocate(p.cos_sin, bufs);
    relocate(p.cache, bufs);
    relocate(p.fp8_scale, bufs);
    p.counters = counters;
    typedef void (*K)(const KvInsertParams);
    struct {
        const char* name;
        K k;
    } const kernels[] = {
        {"kv_insert_nvfp4", kv_insert_nvfp4},
        {"kv_insert_bf16", kv_insert_bf16},
        {"kv_insert_fp8", kv_insert_fp8},
        {"kv_insert_nvfp4_tiles", kv_insert_nvfp4_tiles},
        {"kv_insert_bf16_tiles", kv_insert_bf16_tiles},
        {"kv_insert_fp8_tiles", kv_insert_fp8_tiles},
    };
    K k = nullptr;
    for (auto& e : kernels)
        if (name == e.name) k = e.k;
    if (!k) {
        fprintf(stderr, "no host-run insert kernel %s\n", name.c_str());
        exit(2);
    }
    kv_host_bdim = block;
    kv_host_gdim = grid;
    for (kv_host_bid = 0; kv_host_bid < grid; ++kv_host_bid)
        for (kv_host_tid = 0; kv_host_tid < block; ++kv_host_tid) k(p);
    for (auto& b : bufs) fwrite(b.data(), 1, b.size(), stdout);
    fwrite(counters, 4, 3, stdout);
    return 0;
}
