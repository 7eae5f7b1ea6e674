/* cpu.h - the CPU backend: portable C + a thread pool; the reference
 * implementation of gpud/backend.h.
 *
 * K/V are stored as F32. Matrix products go through gpud_matmul()
 * (kernels.h) once per weight per step over all tokens of the batch;
 * attention is parallel over (token, KV head group) on the same thread pool.
 */
#ifndef GPUD_BACKEND_CPU_H
#define GPUD_BACKEND_CPU_H

#include "gpud/backend.h"

extern const struct gpud_backend_ops gpud_cpu_backend;

#endif
