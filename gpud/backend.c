/* backend.c - the registry of compute backends (gpud/backend.h): which ops
 * table runs which kind of device.
 *
 * The engine asks here and never names a backend, so a second backend
 * plugs in with one row below (and its sources in gpud/meson.build).
 */
#include "gpud/backend.h"

#include <stddef.h>

#include "gpud/backend/cpu/cpu.h"
#include "gpud/model.h"
#include "sw_config.h"
#if SW_HAVE_CUDA
#include "gpud/backend/cuda/cuda.h"
#endif

static const struct {
	enum sw_device_kind kind;
	const struct gpud_backend_ops *ops;
} registry[] = {
	{ SW_DEVICE_CPU, &gpud_cpu_backend },
#if SW_HAVE_CUDA
	{ SW_DEVICE_CUDA, &gpud_cuda_backend },
#endif
};

const struct gpud_backend_ops *gpud_backend_for(enum sw_device_kind kind)
{
	for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++)
		if (registry[i].kind == kind)
			return registry[i].ops;
	return NULL;
}

bool gpud_kv_type_ok(enum gpud_type t)
{
	return t == GPUD_TYPE_F32 || t == GPUD_TYPE_F16;
}

uint64_t gpud_kv_block_bytes(const struct gpud_model_hparams *hp, uint32_t block_tokens,
			     enum gpud_type t)
{
	return (uint64_t)hp->n_layers * 2 * hp->n_kv_heads * block_tokens * hp->head_dim *
	       (t == GPUD_TYPE_F16 ? 2 : 4);
}

enum gpud_type gpud_kv_type_of(enum sw_config_kv_type k)
{
	return k == SW_KV_F16 ? GPUD_TYPE_F16 : GPUD_TYPE_F32;
}
