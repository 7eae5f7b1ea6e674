/* cuda_fp16.h - cuemu's half type (tests/cuemu/README.md). */
#ifndef CUEMU_CUDA_FP16_H
#define CUEMU_CUDA_FP16_H
#include <cuda_runtime.h>
#endif
