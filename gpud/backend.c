/* backend.c - the registry of compute backends (gpud/backend.h): which ops
 * table runs which kind of device.
 *
 * The engine asks here and never names a backend, so a second backend
 * plugs in with one row below (and its sources in gpud/meson.build).
 */
#include "gpud/backend.h"

#include <stddef.h>

#include "gpud/backend/cpu/cpu.h"
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
