// The launch protocol of the host-run kernels (tests/host_kernels/mod.rs is
// the other side). Input (stdin): the buffer count, each buffer as its
// length and bytes, the parameter block with every pointer as
// (buffer index + 1) << 48 | byte offset, the kernel's name, the grid and the
// block size. Output (stdout): every buffer after the launch, then the three
// skip counters.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <type_traits>
#include <vector>

static void kv_host_read(void* p, size_t n) {
    if (fread(p, 1, n, stdin) != n) {
        fprintf(stderr, "short input\n");
        exit(2);
    }
}

// A kernel of kv_abi.h's list as a function taking P, or null when its
// parameter block is another.
template <class P, class Q>
void (*kv_host_as(void (*k)(const Q)))(const P) {
    if constexpr (std::is_same<P, Q>::value)
        return k;
    else
        return nullptr;
}

// Points a parameter block's skip counters at the harness's.
template <class P>
void kv_host_set_counters(P& p, unsigned* c) {
    p.counters = c;
}
inline void kv_host_set_counters(KvFusedParams& p, unsigned* c) {
    p.compress.counters = c;
    p.insert.counters = c;
}

// A launch as read from stdin, its parameter block of type P.
template <class P>
struct KvHostLaunch {
    std::vector<std::vector<uint8_t>> bufs;
    P params;
    std::string kernel;
    uint32_t grid, block;
    unsigned counters[3] = {0, 0, 0};

    KvHostLaunch() {
        uint32_t nbufs;
        kv_host_read(&nbufs, 4);
        bufs.resize(nbufs);
        for (auto& b : bufs) {
            uint64_t len;
            kv_host_read(&len, 8);
            b.resize(len + 16);  // slack: a bad address shows as a mismatch, not a crash
            kv_host_read(b.data(), len);
            b.resize(len);
        }
        kv_host_read(&params, sizeof params);
        uint32_t name_len;
        kv_host_read(&name_len, 4);
        kernel.assign(name_len, '\0');
        kv_host_read(&kernel[0], name_len);
        kv_host_read(&grid, 4);
        kv_host_read(&block, 4);
        kv_host_set_counters(params, counters);
    }

    // A pointer field given as buffer id and offset, made a host address.
    template <class T>
    void relocate(T*& field) {
        uint64_t v = (uint64_t)(uintptr_t)field;
        if (v == 0) return;
        uint64_t id = (v >> 48) - 1, off = v & 0xffffffffffffull;
        field = (T*)(bufs.at(id).data() + off);
    }

    typedef void (*Kernel)(const P);

    // The kernel of that name among those of kv_abi.h's list (KV_KERNELS)
    // that take P; exits if none.
    Kernel function() const {
#define KV_HOST_ENTRY(name, Params) {#name, kv_host_as<P>(name)},
        const std::pair<const char*, Kernel> all[] = {KV_KERNELS(KV_HOST_ENTRY)};
#undef KV_HOST_ENTRY
        for (auto& e : all)
            if (e.second != nullptr && kernel == e.first) return e.second;
        fprintf(stderr, "no host-run kernel %s taking this parameter block\n", kernel.c_str());
        exit(2);
    }

    // Every work-item of the grid, one after the other: for kernels whose
    // lanes never talk to each other.
    void run_in_order(Kernel k) {
        kv_host_bdim = block;
        kv_host_gdim = grid;
        for (kv_host_bid = 0; kv_host_bid < grid; ++kv_host_bid)
            for (kv_host_tid = 0; kv_host_tid < block; ++kv_host_tid) k(params);
    }

    void write_results() const {
        for (auto& b : bufs) fwrite(b.data(), 1, b.size(), stdout);
        fwrite(counters, 4, 3, stdout);
    }
};
