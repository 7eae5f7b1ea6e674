/* cuemu.h - what cuemu (tests/cuemu/README.md) counts, for tests that run
 * the CUDA backend on it. C and C++. */
#ifndef CUEMU_H
#define CUEMU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuemu_stats {
	uint64_t device_allocs;   /* cudaMalloc calls that succeeded */
	uint64_t host_allocs;     /* cudaHostAlloc / cudaMallocHost calls */
	uint64_t device_frees;
	uint64_t launches;        /* kernels run (a graph's count each replay) */
	uint64_t graph_launches;  /* cudaGraphLaunch calls */
	uint64_t faults;          /* kernels stopped by an illegal address or a deadlock */
};

/* The counters so far, over every device and thread. */
struct cuemu_stats cuemu_get_stats(void);

#ifdef __cplusplus
}
#endif

#endif
