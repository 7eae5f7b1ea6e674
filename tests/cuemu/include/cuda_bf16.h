/* cuda_bf16.h - cuemu's bfloat16 type (tests/cuemu/README.md). */
#ifndef CUEMU_CUDA_BF16_H
#define CUEMU_CUDA_BF16_H
#include <cuda_runtime.h>
#endif
