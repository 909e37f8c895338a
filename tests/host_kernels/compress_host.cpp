// The compress kernels on the host (compressor_host.h).
#define KV_HOST_PARAMS KvCompressParams
#include "compressor_host.h"
