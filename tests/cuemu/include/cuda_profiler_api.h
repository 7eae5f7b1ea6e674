/* cuemu's cuda_profiler_api.h: the range marks an external profiler reads
 * (cudaProfilerStart, cudaProfilerStop). No profiler attaches to the
 * emulator: they mark nothing and succeed, as CUDA's do with none
 * attached. */
#ifndef CUEMU_CUDA_PROFILER_API_H
#define CUEMU_CUDA_PROFILER_API_H

#include "cuda_runtime.h"

static inline cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
static inline cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

#endif
