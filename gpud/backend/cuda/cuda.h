/* cuda.h - the CUDA backend: the ops table (gpud/backend.h) that runs
 * "cuda:N" devices, and the device queries the memory plan needs.
 *
 * Declared in every build; defined only when the build has the backend
 * (SW_HAVE_CUDA). gpud/backend.c registers gpud_cuda_backend; the memory
 * plan (gpud/daemon_plan.c) sizes each CUDA device from
 * gpud_cuda_device_info and gpud_cuda_plan_for; `gpud serve --check`
 * prints that plan per device.
 *
 * Memory (issue 12): an instance makes ONE cudaMalloc per pool (weights,
 * KV blocks, mask slots, step scratch, cuBLAS workspace) and one
 * cudaHostAlloc for pinned staging, all in init; every allocating CUDA
 * call goes through a counting wrapper, and stats() reports the calls made
 * after init in allocs_after_init (STATS: alloc.device), which must stay 0.
 */
#ifndef GPUD_BACKEND_CUDA_H
#define GPUD_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gpud/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct gpud_backend_ops gpud_cuda_backend;

struct gpud_cuda_devinfo {
	char name[96];          /* "NVIDIA H200" */
	int cc_major, cc_minor; /* compute capability */
	uint64_t total_bytes;   /* device memory, cudaMemGetInfo */
	uint64_t free_bytes;
};

/* Number of CUDA devices this process sees: 0 when there is no driver, no
 * device or CUDA_VISIBLE_DEVICES hides them all (never an error). */
int gpud_cuda_device_count(void);

/* Fills *info for device ordinal. Returns 0, or a negative code with a
 * message naming the device and the CUDA error string ("cuda:3: no such
 * device (2 visible)"). */
int gpud_cuda_device_info(int ordinal, struct gpud_cuda_devinfo *info, char *err,
			  size_t errlen);

/* The pools an instance made from cfg reserves, in bytes: what the memory
 * plan adds up per device before any instance exists. Pure (no CUDA call). */
struct gpud_cuda_plan {
	uint64_t weights;   /* the model's tensors as uploaded */
	uint64_t kv;        /* cfg->n_blocks KV blocks */
	uint64_t masks;     /* the device mask pool */
	uint64_t scratch;   /* step scratch for the largest step */
	uint64_t workspace; /* cuBLAS workspace (cublasSetWorkspace) */
	uint64_t staging;   /* pinned host staging (cudaHostAlloc), host RAM */
};
void gpud_cuda_plan_for(const struct gpud_backend_config *cfg, struct gpud_cuda_plan *p);

/* Whether an instance could be made from cfg: 0, or the reason init would
 * refuse it (a qwen2 model, a weight type without a kernel, a head size,
 * step bounds) with its code. Pure, as gpud_cuda_plan_for, whose figures
 * are all zero exactly when this fails. */
int gpud_cuda_plan_check(const struct gpud_backend_config *cfg, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
