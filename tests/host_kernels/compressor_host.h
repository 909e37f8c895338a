// Runs the one-group-per-item compress and fused kernels (the tuned ones and
// the generic `_wide` ones) on the host for tests/compressor_host_kernels.rs:
// a group's 32 lanes on threads of their own (the norm's butterfly, V4's and
// MXFP8's exchanges), group after group. The team kernels, whose groups meet
// at block barriers, are left to the device tests. compress_host.cpp and
// fused_host.cpp include this with KV_HOST_PARAMS set to their parameter
// block; the launch protocol is harness.h's.
#define KV_HOST_LANES 1
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include "harness.h"
#include "lanes.h"
#include "relocate.h"

int main() {
    KvHostLaunch<KV_HOST_PARAMS> in;
    kv_host_relocate(in, in.params);
    kv_host_run_lanes(in, in.function());
    in.write_results();
    return 0;
}
