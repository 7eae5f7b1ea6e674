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
 * KV blocks, mask slots, step scratch) and one
 * cudaHostAlloc for pinned staging, all in init; every allocating CUDA
 * call goes through a counting wrapper, and stats() reports the calls made
 * after init in allocs_after_init (STATS: alloc.device), which must stay 0.
 */
#ifndef GPUD_BACKEND_CUDA_H
#define GPUD_BACKEND_CUDA_H

#include <stdbool.h>
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
	uint64_t weights_q8; /* of weights: tensors held as Q8_0 whose file type
			      * has no kernel here (K-quants, Q4_1, Q5_0, ...) */
	uint64_t kv;        /* cfg->n_blocks KV blocks */
	uint64_t masks;     /* the device mask pool */
	uint64_t scratch;   /* step scratch for the largest step */
	uint64_t staging;   /* pinned host staging (cudaHostAlloc), host RAM */
};
void gpud_cuda_plan_for(const struct gpud_backend_config *cfg, struct gpud_cuda_plan *p);

/* Whether an instance could be made from cfg: 0, or the reason init would
 * refuse it (a weight type without a kernel, a head size, step bounds)
 * with its code. Pure, as gpud_cuda_plan_for, whose figures are all zero
 * exactly when this fails. */
int gpud_cuda_plan_check(const struct gpud_backend_config *cfg, char *err, size_t errlen);

/* The kernel profile of an instance (a ctx of gpud_cuda_backend.init)
 * made with GPUD_CUDA_PROFILE=1 in the environment, for benchmarks: each
 * launch of a step is timed by an event recorded before it (and one after
 * the step's last), summed per (stage, op); stage is the part of the layer
 * ("q, k, v", "attention", "down", ...), op the launch ("matmul (int8)",
 * "rmsnorm", ...). Such an instance runs every step eagerly and without
 * programmatic dependent launch, so a row's time is its kernels' alone
 * plus the launch gaps before them; the decode graphs' step time is not
 * this span. Copies *out (when out) and clears the sums when reset.
 * Call it from the thread that drives the instance, between steps.
 * Returns 0, or -ENOENT when the instance has no profile. */
#define GPUD_CUDA_PROF_ROWS 64
struct gpud_cuda_prof_row {
	const char *stage, *op; /* static strings */
	uint64_t launches;
	double ms;
};
struct gpud_cuda_prof {
	uint64_t steps;   /* steps timed */
	uint64_t dropped; /* launches not timed (a failed event, a full table) */
	double span_ms;   /* each step's first launch to its end, summed */
	uint32_t n_rows;
	struct gpud_cuda_prof_row rows[GPUD_CUDA_PROF_ROWS];
};
int gpud_cuda_profile(void *ctx, struct gpud_cuda_prof *out, bool reset);

/* The stage profile of an instance made with GPUD_CUDA_PROFILE=graph (its
 * steps run as without a profile: decode graphs, programmatic dependent
 * launch when on), for benchmarks: where the time of a decode step of T
 * tokens goes in the graphs that serve it, which the eager profile's
 * launch gaps hide at small batches. Each (stage, op) pair of the step is
 * captured alone into a graph (every layer's launches of it, in order)
 * and replayed reps times after one warm replay: rows[r].ms is
 * milliseconds per replay, rows[r].launches the pair's launch calls per
 * step. step_us is the step's own decode graph replayed the same way,
 * graph_us a graph of one empty kernel (what a replay costs beside its
 * kernels), floor_us a graph of `launches` empty kernels (the step's
 * launches at no work). The last forward must have been a decode step of
 * T tokens with T logits rows: its metadata is what the replays read. The
 * replays rewrite activations and KV rows of that step, and the graphs
 * are instantiated here (device memory the pools do not hold) and freed
 * before it returns: never call it on a serving instance. Returns 0, or
 * -ENOENT (no stage profile), -EINVAL (no graph of T tokens, reps 0), or a
 * CUDA error's code with err set. */
struct gpud_cuda_stage_prof {
	uint32_t T;
	uint64_t launches; /* launch calls of the step (a call may be a few kernels) */
	double step_us, graph_us, floor_us;
	uint32_t n_rows;
	struct gpud_cuda_prof_row rows[GPUD_CUDA_PROF_ROWS];
};
int gpud_cuda_stage_profile(void *ctx, uint32_t T, uint32_t reps,
			    struct gpud_cuda_stage_prof *out, char *err, size_t errlen);

/* Marks the start (on) or the end of a range for an external profiler
 * (cudaProfilerStart, cudaProfilerStop: what `ncu --profile-from-start
 * off` profiles), for benchmarks. Returns 0 or a CUDA error's code. */
int gpud_cuda_profiler_range(bool on);

#ifdef __cplusplus
}
#endif

#endif
