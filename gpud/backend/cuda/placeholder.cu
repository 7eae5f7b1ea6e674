// placeholder.cu - proves the CUDA toolchain builds and links for sm_89 and
// sm_90. The real backend (kernels + cuBLAS behind the backend ops table)
// replaces this; until then gpud_cuda_selftest() is the only entry point.
#include <cuda_runtime.h>

extern "C" int gpud_cuda_selftest(float *out, int n);

__global__ static void axpy_kernel(float a, const float *x, float *y, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] += a * x[i];
}

// Computes out[i] = 2*i + i on the first device. Returns 0, or the negated
// cudaError_t when no device is usable (this machine has none).
extern "C" int gpud_cuda_selftest(float *out, int n)
{
	float *x = nullptr, *y = nullptr;
	cudaError_t e = cudaMalloc(&x, n * sizeof(float));
	if (e != cudaSuccess)
		return -(int)e;
	e = cudaMalloc(&y, n * sizeof(float));
	if (e != cudaSuccess)
		goto out_free_x;
	for (int i = 0; i < n; i++)
		out[i] = (float)i;
	cudaMemcpy(x, out, n * sizeof(float), cudaMemcpyHostToDevice);
	cudaMemcpy(y, out, n * sizeof(float), cudaMemcpyHostToDevice);
	axpy_kernel<<<(n + 255) / 256, 256>>>(2.0f, x, y, n);
	e = cudaMemcpy(out, y, n * sizeof(float), cudaMemcpyDeviceToHost);
	cudaFree(y);
out_free_x:
	cudaFree(x);
	return e == cudaSuccess ? 0 : -(int)e;
}
