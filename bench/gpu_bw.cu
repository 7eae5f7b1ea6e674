/* gpu_bw.cu - the device's measured copy bandwidth (tests/gpu/run: batch-1
 * decode is reported as a share of it).
 *
 *   gpu_bw [--device N] [--mib M]
 *
 * A device-to-device copy kernel (16-byte loads and stores, a grid-stride
 * loop over a buffer of M MiB, default 2048: several times any L2) timed
 * with CUDA events over 20 launches after 3 warm-ups, the median taken;
 * cudaMemcpyDeviceToDevice likewise for comparison. Bandwidth counts the
 * bytes read plus the bytes written. Prints one line per method and
 * "copy_gbs <best>" last, for scripts. Exit status 0, or 1 with the CUDA
 * error named.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                    \
	do {                                                                           \
		cudaError_t e_ = (call);                                               \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "gpu_bw: %s: %s\n", #call, cudaGetErrorString(e_)); \
			return 1;                                                      \
		}                                                                      \
	} while (0)

__global__ void copy_kernel(const int4 *__restrict__ src, int4 *__restrict__ dst, size_t n)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		dst[i] = src[i];
}

__global__ void fill_kernel(int4 *p, size_t n, unsigned seed)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		unsigned x = (unsigned)i * 2654435761u ^ seed;
		p[i] = make_int4((int)x, (int)(x * 3u), (int)(x * 5u), (int)(x * 7u));
	}
}

int main(int argc, char **argv)
{
	int dev = 0, sms = 0;
	size_t mib = 2048;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--device") && i + 1 < argc)
			dev = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = (size_t)atol(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [--device N] [--mib M]\n", argv[0]);
			return 2;
		}
	}
	CHECK(cudaSetDevice(dev));
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));

	size_t bytes = mib << 20, n = bytes / sizeof(int4);
	int4 *a = nullptr, *b = nullptr;
	cudaEvent_t e0, e1;
	double best = 0;

	CHECK(cudaMalloc(&a, bytes));
	CHECK(cudaMalloc(&b, bytes));
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	fill_kernel<<<sms * 8, 256>>>(a, n, 12345u);
	CHECK(cudaGetLastError());
	CHECK(cudaMemset(b, 0xab, bytes));
	CHECK(cudaDeviceSynchronize());

	for (int method = 0; method < 2; method++) {
		std::vector<float> ms;

		for (int r = 0; r < 23; r++) {
			float t = 0;

			CHECK(cudaEventRecord(e0));
			if (method == 0)
				copy_kernel<<<sms * 8, 512>>>(a, b, n);
			else
				CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
			CHECK(cudaGetLastError());
			CHECK(cudaEventRecord(e1));
			CHECK(cudaEventSynchronize(e1));
			CHECK(cudaEventElapsedTime(&t, e0, e1));
			if (r >= 3)
				ms.push_back(t);
		}
		std::sort(ms.begin(), ms.end());
		double med = ms[ms.size() / 2], gbs = 2.0 * (double)bytes / (med * 1e-3) / 1e9;
		printf("%s: %zu MiB, median %.3f ms: %.1f GB/s (read + write)\n",
		       method == 0 ? "copy kernel" : "cudaMemcpy D2D", mib, med, gbs);
		best = std::max(best, gbs);
	}

	/* The copy must be right: spot-check the last element. */
	int4 x, y;
	CHECK(cudaMemcpy(&x, a + n - 1, sizeof(x), cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(&y, b + n - 1, sizeof(y), cudaMemcpyDeviceToHost));
	if (memcmp(&x, &y, sizeof(x))) {
		fprintf(stderr, "gpu_bw: the copy is wrong\n");
		return 1;
	}
	printf("copy_gbs %.1f\n", best);
	cudaFree(a);
	cudaFree(b);
	return 0;
}
