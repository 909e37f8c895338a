// Runs the insert kernels on the host for tests/insert_host_kernels.rs: one
// work-item after the other, except for V4 and MXFP8, whose scale blocks
// span lanes: there a group's 32 lanes run on threads of their own
// (KV_HOST_LANES), group after group, and exchange values as on a device.
// The launch protocol is harness.h's.
#define KV_HOST_LANES 1
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include "harness.h"
#include "lanes.h"
#include "relocate.h"

int main() {
    KvHostLaunch<KvInsertParams> in;
    kv_host_relocate(in, in.params);
    KvHostLaunch<KvInsertParams>::Kernel k = in.function();
    // V4 and MXFP8 (the generic kernels too) exchange values among lanes.
    bool exchanges = in.kernel.rfind("kv_insert_v4", 0) == 0 || in.kernel.rfind("kv_insert_mxfp8", 0) == 0;
    if (!exchanges) {
        in.run_in_order(k);
    } else {
        kv_host_run_lanes(in, k);
    }
    in.write_results();
    return 0;
}
