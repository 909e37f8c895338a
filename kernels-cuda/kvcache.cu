// CUDA build of the one kernel source: the CUDA prelude, then the shared HIP-first source.
#include "prelude.cuh"
#define KV_PRELUDE_INCLUDED 1
#include "../kernels-hip/kvcache.hip"
