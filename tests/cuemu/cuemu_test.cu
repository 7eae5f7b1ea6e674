// cuemu_test.cu - cuemu against what CUDA does (tests/cuemu/README.md): a
// CUDA program, rewritten by cu2cc.py like the backend, whose checks hold
// on a GPU too. Each fault is provoked on a device of its own (a fault is
// sticky per device), or in a child process where it ends the process.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/cuemu/cuemu.h"

static int failures;

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,   \
				__LINE__, #cond);                                \
			failures++;                                              \
		}                                                                \
	} while (0)

#define OK(call) CHECK((call) == cudaSuccess)

/* --- kernels ------------------------------------------------------------------ */

// Per warp: the sum of lane ids by xor shuffles, lane 5's value by a
// broadcast, the ballot of odd lanes and whether any lane is 17.
__global__ void warp_kernel(int *out)
{
	unsigned lane = threadIdx.x & 31, w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	int v = (int)lane;

	for (int o = 16; o; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	int b = __shfl_sync(0xffffffffu, (int)lane * 10, 5);
	unsigned odd = __ballot_sync(0xffffffffu, lane & 1);
	int any = __any_sync(0xffffffffu, lane == 17);
	if (lane == 0) {
		out[4 * w] = v;
		out[4 * w + 1] = b;
		out[4 * w + 2] = (int)odd;
		out[4 * w + 3] = any;
	}
}

// A tree reduction in shared memory: right only if every __syncthreads is
// a real barrier.
__global__ void __launch_bounds__(256) block_sum_kernel(const float *x, float *out)
{
	__shared__ float s[256];
	unsigned t = threadIdx.x;

	s[t] = x[blockIdx.x * 256 + t];
	__syncthreads();
	for (unsigned h = 128; h; h >>= 1) {
		if (t < h)
			s[t] += s[t + h];
		__syncthreads();
	}
	if (t == 0)
		out[blockIdx.x] = s[0];
}

// Barrier reductions, twice in a row (the second must not see the
// first's count), and the last-block pattern: each block adds to a
// counter after a fence; the one that sees n - 1 resets it.
__global__ void __launch_bounds__(128) count_kernel(int *out, unsigned *ctr)
{
	__shared__ bool last;
	int c = __syncthreads_count(threadIdx.x % 3 == 0);
	int o = __syncthreads_or(threadIdx.x == blockIdx.x);
	int a = __syncthreads_and(threadIdx.x < 127);
	int z = __syncthreads_or(0);

	if (threadIdx.x == 5)
		out[4 * blockIdx.x + 0] = c, out[4 * blockIdx.x + 1] = o,
		out[4 * blockIdx.x + 2] = a, out[4 * blockIdx.x + 3] = z;
	__threadfence();
	__syncthreads();
	if (!threadIdx.x) {
		last = atomicAdd(ctr, 1u) == gridDim.x - 1;
		if (last)
			*ctr = 0;
	}
	__syncthreads();
	if (last && threadIdx.x == 0)
		out[4 * gridDim.x] = (int)blockIdx.x + 1;
}

// One m16n8k16 int8 tensor-core product: each lane builds its fragments
// from A (16 x 16, row-major) and B (16 x 8, stored column by column) as
// the PTX ISA lays them out, and writes its four outputs of D = A B + C.
__global__ void mma_kernel(const int8_t *A, const int8_t *B, const int *C, int *D)
{
	unsigned l = threadIdx.x, g = l >> 2, t = l & 3, a0, a1, b0;
	int d[4];

	memcpy(&a0, A + g * 16 + 4 * t, 4);       /* A[g][4t..4t+3] */
	memcpy(&a1, A + (g + 8) * 16 + 4 * t, 4); /* A[g+8][4t..4t+3] */
	memcpy(&b0, B + g * 16 + 4 * t, 4);       /* B[4t..4t+3][g] */
	for (int e = 0; e < 4; e++)
		d[e] = C[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)];
	cuemu_mma_s8_m16n8k16(d, a0, a1, b0, d);
	for (int e = 0; e < 4; e++)
		D[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)] = d[e];
}

// ldmatrix .x4 as the PTX ISA lays it out: four 8 x 8 matrices of 16-bit
// elements, lane l giving row l % 8 of matrix l / 8; a lane gets, from
// each matrix i, the two elements 2 (l % 4), 2 (l % 4) + 1 of its row l / 4
// in r[i]. Here the matrices' rows are scattered through shared memory
// (row r of matrix i at word 12 (8 i + (r * 5) % 8) + 4 of a padded buffer,
// as a kernel's padded tile would have them) and hold their coordinates.
__global__ void ldsm_kernel(unsigned *out)
{
	alignas(16) __shared__ unsigned sm[12 * 32 + 8];
	unsigned l = threadIdx.x;

	for (unsigned i = 0; i < 4; i++) /* this lane fills row l % 8 of matrix i, l < 8 */
		if (l < 8)
			for (unsigned w = 0; w < 4; w++) /* elements 2w, 2w + 1 */
				sm[12 * (8 * i + (l * 5) % 8) + 4 + w] =
					(i << 12 | l << 8 | 2 * w) | (i << 12 | l << 8 | (2 * w + 1)) << 16;
	__syncthreads();
	unsigned r[4];
	cuemu_ldmatrix_x4(r, &sm[12 * (8 * (l / 8) + ((l % 8) * 5) % 8) + 4]);
	for (unsigned i = 0; i < 4; i++)
		out[4 * l + i] = r[i];
}

// cp.async as cuemu models it: a copy lands when a wait_group lets its
// group complete, not when issued (on a GPU, a read before the wait may
// see either; here it sees the old value, so a kernel that reads too
// early computes with stale data and fails its checks). Each of 4 threads:
// group 0 copies src[t] into a[t], group 1 src[4 + t] into b[t] and zeros
// into c[t]; out gets what each read before and after each wait.
__global__ void cp_kernel(const int *src, int *out)
{
	__shared__ int a[4], b[4], c[4];
	unsigned t = threadIdx.x;

	a[t] = b[t] = c[t] = -1;
	cuemu::cp_async(&a[t], src + t, 4, true);
	out[t] = a[t]; /* issued, not committed: -1 */
	cuemu::cp_commit();
	cuemu::cp_async(&b[t], src + 4 + t, 4, true);
	cuemu::cp_async(&c[t], src, 4, false);
	cuemu::cp_commit();
	cuemu::cp_wait(1); /* group 0 */
	out[4 + t] = a[t];
	out[8 + t] = b[t]; /* -1 */
	cuemu::cp_wait(0);
	out[12 + t] = b[t];
	out[16 + t] = c[t]; /* 0 */
}

// The order threads and blocks run in: each thread takes the next place
// in out for its index in the grid, then again after a barrier.
__global__ void order_kernel(unsigned *ctr, unsigned *out)
{
	unsigned me = blockIdx.x * blockDim.x + threadIdx.x;

	out[atomicAdd(ctr, 1u)] = me;
	__syncthreads();
	out[atomicAdd(ctr, 1u)] = me;
}

// Races that a -Db_sanitize=thread build reports (check_races), each
// with the barrier that makes it right (fixed), which it must not report.
// Two blocks of two warps of 32 (RACE_GRID_FAR: four); out: each block's
// 64 words, then src (64 words, in the third block's) and, for the grid's
// modes, part (2 x 64) and a counter.
enum {
	RACE_BLOCK,
	RACE_WARP,
	RACE_SHUFFLE,
	RACE_CP_ASYNC,
	RACE_LDMATRIX,
	RACE_GLOBAL,
	RACE_GRID_OVERLAP,
	RACE_GRID_LAST,
	RACE_GRID_FAR,
	RACE_GRID_FENCE,
	RACE_MODES
};
__global__ void race_kernel(unsigned *out, const unsigned *src, int mode, int fixed)
{
	alignas(16) __shared__ unsigned s[256];
	__shared__ bool last;
	unsigned t = threadIdx.x, r[4], *part = out + 256, *ctr = out + 400;

	out += 64 * blockIdx.x; /* this block's words */
	switch (mode) {
	case RACE_BLOCK: /* a thread reads what another warp's thread wrote */
		s[t] = t;
		if (fixed)
			__syncthreads();
		out[t] = s[(t + 32) % 64];
		break;
	case RACE_WARP: /* a lane reads what its neighbour wrote */
		s[t] = t;
		if (fixed)
			__syncwarp();
		out[t] = s[t ^ 1];
		break;
	case RACE_SHUFFLE: /* a shuffle orders no memory: only __syncwarp does */
		s[t] = t;
		r[0] = fixed ? (__syncwarp(), 0u) : __shfl_sync(0xffffffffu, t, 0);
		out[t] = s[t ^ 1] + r[0];
		break;
	case RACE_CP_ASYNC: /* a copy lands for its own thread at its wait */
		cuemu::cp_async(&s[t], src + t, 4, true);
		cuemu::cp_commit();
		cuemu::cp_wait(0);
		if (fixed)
			__syncthreads();
		out[t] = s[63 - t];
		break;
	case RACE_LDMATRIX: /* warp 0 reads the rows warp 1 wrote */
		if (t >= 32)
			for (unsigned i = 0; i < 4; i++)
				s[4 * (t - 32) + i] = 4 * (t - 32) + i;
		if (fixed)
			__syncthreads();
		if (t < 32) {
			cuemu_ldmatrix_x4(r, &s[4 * t]);
			out[t] = r[0] + r[1] + r[2] + r[3];
		}
		break;
	case RACE_GLOBAL: /* every thread of the block stores one word */
		if (!fixed || t == 0)
			out[0] = t;
		break;
	case RACE_GRID_OVERLAP: /* both blocks store the same words */
		(fixed ? out : out - 64 * blockIdx.x)[t] = t;
		break;
	case RACE_GRID_FAR: /* blocks 0 and 2 store the same words: the same
			     * colour in a checkerboard, apart in the
			     * colouring of the kernel's third launch */
		(fixed || blockIdx.x != 2 ? out : out - 128)[t] = t;
		break;
	case RACE_GRID_LAST:  /* the block that arrives last sums the other's
			       * part: its counter must follow all of that
			       * block's stores (a barrier, then thread 0's
			       * atomic), not thread 0's alone */
	case RACE_GRID_FENCE: /* the barrier there, the fence before it not:
			       * the counter's atomic is relaxed, the stores
			       * before it may land after it */
		part[64 * blockIdx.x + t] = t + 1;
		if (fixed || mode == RACE_GRID_LAST)
			__threadfence();
		if (fixed || mode == RACE_GRID_FENCE)
			__syncthreads();
		if (t == 0)
			last = atomicAdd(ctr, 1u) == gridDim.x - 1;
		__syncthreads();
		if (last) {
			__threadfence();
			out[t] = part[t] + part[64 + t];
		}
		break;
	}
}

// What a block finds in its shared memory before it writes any: 0xff
// bytes, static and dynamic alike, never what the block before it left
// (on a GPU: whatever was there).
__global__ void fresh_kernel(unsigned *out)
{
	__shared__ unsigned s[4];
	extern __shared__ unsigned d[];

	if (threadIdx.x == 0) {
		out[2 * blockIdx.x] = s[1];
		out[2 * blockIdx.x + 1] = d[1];
		s[1] = d[1] = 7 + blockIdx.x;
	}
}

// 40 KiB of static shared memory: with more than 8 KiB of dynamic, more
// than a block may have without opting in (a GPU refuses the launch)
__global__ void big_shared_kernel(int *out)
{
	__shared__ int s[10240];
	extern __shared__ int d[];

	s[threadIdx.x] = d[threadIdx.x] = 1;
	out[threadIdx.x] = s[threadIdx.x] + d[threadIdx.x];
}

// Thread 0 leaves before the barrier the others wait at.
__global__ void divergent_kernel(int *x)
{
	if (threadIdx.x == 0)
		return;
	__syncthreads();
	x[threadIdx.x] = 1;
}

__global__ void read_kernel(const int *p, long off, int *out)
{
	out[0] = p[off];
}

__global__ void __launch_bounds__(64) bounded_kernel(int *x)
{
	x[threadIdx.x] = 1;
}

// Programmatic dependent launch: block b writes b + 1 after waiting (or
// without waiting, which a launch that allows the overlap must not do).
__global__ void __launch_bounds__(64) pdl_kernel(int *x, int wait)
{
	if (wait)
		cuemu_griddepcontrol_wait();
	if (threadIdx.x == 0)
		x[blockIdx.x] = (int)blockIdx.x + 1;
}

__global__ void add_kernel(int *counter, int v)
{
	if (threadIdx.x == 0)
		atomicAdd(counter, v); /* blocks of a grid run side by side */
}

__global__ void vec_kernel(const uint8_t *p, int *out)
{
	int4 a = *(const int4 *)(p + 4); // misaligned: faults on a GPU
	out[0] = a.x;
}

// cp.async of 16 bytes from a source 4 bytes into an allocation (src_off
// 4), or to a shared destination 4 bytes into an aligned array (dst_off
// 1): both fault on a GPU, a zero fill (!full) too
__global__ void cp_misaligned_kernel(const uint8_t *p, int src_off, int dst_off, bool full)
{
	alignas(16) __shared__ int s[8];

	cuemu::cp_async(&s[dst_off], p + src_off, 16, full);
	cuemu::cp_commit();
	cuemu::cp_wait(0);
}

__global__ void dyn_kernel(int *out)
{
	extern __shared__ int dyn[];
	dyn[threadIdx.x] = (int)threadIdx.x * 3;
	__syncthreads();
	out[threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

/* --- checks ------------------------------------------------------------------------ */

static void check_warps(void)
{
	int *d, h[4 * 4];

	OK(cudaSetDevice(0));
	OK(cudaMalloc((void **)&d, sizeof(h)));
	warp_kernel<<<2, 64>>>(d);
	OK(cudaGetLastError());
	OK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	for (int w = 0; w < 4; w++) {
		CHECK(h[4 * w] == 31 * 32 / 2);
		CHECK(h[4 * w + 1] == 50);
		CHECK((unsigned)h[4 * w + 2] == 0xaaaaaaaau);
		CHECK(h[4 * w + 3] == 1);
	}
	OK(cudaFree(d));
}

static void check_block_sum(void)
{
	float *dx, *dy, hx[4 * 256], hy[4];

	for (int i = 0; i < 4 * 256; i++)
		hx[i] = (float)(i % 256);
	OK(cudaMalloc((void **)&dx, sizeof(hx)));
	OK(cudaMalloc((void **)&dy, sizeof(hy)));
	OK(cudaMemcpy(dx, hx, sizeof(hx), cudaMemcpyHostToDevice));
	block_sum_kernel<<<4, 256>>>(dx, dy);
	OK(cudaMemcpy(hy, dy, sizeof(hy), cudaMemcpyDeviceToHost));
	for (int b = 0; b < 4; b++)
		CHECK(hy[b] == 255.0f * 256 / 2);
	OK(cudaFree(dx));
	OK(cudaFree(dy));
}

static void check_barrier_counts(void)
{
	int *d, h[4 * 200 + 1];
	unsigned *ctr, hc = 7;

	OK(cudaMalloc((void **)&d, sizeof(h)));
	OK(cudaMalloc((void **)&ctr, sizeof(*ctr)));
	OK(cudaMemset(ctr, 0, sizeof(*ctr)));
	count_kernel<<<200, 128>>>(d, ctr);
	OK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	OK(cudaMemcpy(&hc, ctr, sizeof(hc), cudaMemcpyDeviceToHost));
	for (int b = 0; b < 200; b++) {
		CHECK(h[4 * b] == 43); /* 0, 3, .., 126 */
		CHECK(h[4 * b + 1] == (b < 128));
		CHECK(h[4 * b + 2] == 0);
		CHECK(h[4 * b + 3] == 0);
	}
	CHECK(h[4 * 200] >= 1 && h[4 * 200] <= 200); /* one block saw the last ticket */
	CHECK(hc == 0);
	OK(cudaFree(d));
	OK(cudaFree(ctr));
}

static void check_cp_async(void)
{
	int hs[8] = { 10, 11, 12, 13, 20, 21, 22, 23 }, ho[20], *src, *out;
	const int want[20] = { -1, -1, -1, -1, 10, 11, 12, 13, -1, -1, -1, -1,
			       20, 21, 22, 23, 0, 0, 0, 0 };

	OK(cudaMalloc((void **)&src, sizeof(hs)));
	OK(cudaMalloc((void **)&out, sizeof(ho)));
	OK(cudaMemcpy(src, hs, sizeof(hs), cudaMemcpyHostToDevice));
	cp_kernel<<<1, 4>>>(src, out);
	OK(cudaMemcpy(ho, out, sizeof(ho), cudaMemcpyDeviceToHost));
	for (int i = 0; i < 20; i++)
		CHECK(ho[i] == want[i]);
	OK(cudaFree(src));
	OK(cudaFree(out));
}

// Blocks one after the other, threads in order up to a barrier: thread
// 0 and block 0 first, or under CUEMU_ORDER=reverse (meson's test
// cuemu_reverse runs this program so) the last first. (After the barrier
// the thread that completed it goes on first, then the others in order.)
static void check_order(void)
{
	const unsigned nb = 3, nt = 64;
	const char *e = getenv("CUEMU_ORDER");
	bool rev = e && !strcmp(e, "reverse");
	unsigned h[2 * 3 * 64], *ctr, *out, bad = 0;

	OK(cudaMalloc((void **)&ctr, sizeof(unsigned)));
	OK(cudaMalloc((void **)&out, sizeof(h)));
	OK(cudaMemset(ctr, 0, sizeof(unsigned)));
	order_kernel<<<nb, nt>>>(ctr, out);
	OK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
	for (unsigned b = 0; b < nb; b++) {
		unsigned blk = rev ? nb - 1 - b : b, seen = 0;

		for (unsigned k = 0; k < nt; k++) {
			unsigned t = rev ? nt - 1 - k : k;

			bad += h[2 * nt * b + k] != blk * nt + t;
			/* the second half: each of the block's threads once */
			if (h[2 * nt * b + nt + k] / nt == blk)
				seen++;
		}
		bad += seen != nt;
	}
	CHECK(bad == 0);
	OK(cudaFree(ctr));
	OK(cudaFree(out));
}

static void check_fresh_shared(void)
{
	unsigned h[6], *out;

	OK(cudaMalloc((void **)&out, sizeof(h)));
	fresh_kernel<<<3, 32, 4 * sizeof(unsigned)>>>(out);
	OK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
	for (int i = 0; i < 6; i++)
		CHECK(h[i] == 0xffffffffu);
	OK(cudaFree(out));
}

static void check_ldmatrix(void)
{
	unsigned h[128], *out;

	OK(cudaMalloc((void **)&out, sizeof(h)));
	ldsm_kernel<<<1, 32>>>(out);
	OK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
	for (unsigned l = 0; l < 32; l++)
		for (unsigned i = 0; i < 4; i++) {
			unsigned row = l / 4, e = 2 * (l % 4);
			CHECK((h[4 * l + i] & 0xffff) == (i << 12 | row << 8 | e));
			CHECK(h[4 * l + i] >> 16 == (i << 12 | row << 8 | (e + 1)));
		}
	OK(cudaFree(out));
}

static void check_mma(void)
{
	int8_t hA[16 * 16], hB[8 * 16];
	int hC[16 * 8], hD[16 * 8], *C, *D;
	int8_t *A, *B;

	for (int i = 0; i < 256; i++)
		hA[i] = (int8_t)((i * 37 + 11) % 255 - 127);
	for (int i = 0; i < 128; i++)
		hB[i] = (int8_t)((i * 53 + 5) % 255 - 127);
	for (int i = 0; i < 128; i++)
		hC[i] = i * 1000 - 50000;
	OK(cudaMalloc((void **)&A, sizeof(hA)));
	OK(cudaMalloc((void **)&B, sizeof(hB)));
	OK(cudaMalloc((void **)&C, sizeof(hC)));
	OK(cudaMalloc((void **)&D, sizeof(hD)));
	OK(cudaMemcpy(A, hA, sizeof(hA), cudaMemcpyHostToDevice));
	OK(cudaMemcpy(B, hB, sizeof(hB), cudaMemcpyHostToDevice));
	OK(cudaMemcpy(C, hC, sizeof(hC), cudaMemcpyHostToDevice));
	mma_kernel<<<1, 32>>>(A, B, C, D);
	OK(cudaMemcpy(hD, D, sizeof(hD), cudaMemcpyDeviceToHost));
	for (int m = 0; m < 16; m++)
		for (int n = 0; n < 8; n++) {
			int want = hC[m * 8 + n];
			for (int k = 0; k < 16; k++) /* B column n holds B[k][n] at n * 16 + k */
				want += hA[m * 16 + k] * hB[n * 16 + k];
			CHECK(hD[m * 8 + n] == want);
		}
	OK(cudaFree(A));
	OK(cudaFree(B));
	OK(cudaFree(C));
	OK(cudaFree(D));
}

static void check_dynamic_shared(void)
{
	int *d, h[64];

	OK(cudaMalloc((void **)&d, sizeof(h)));
	dyn_kernel<<<1, 64, 64 * sizeof(int)>>>(d);
	OK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	for (int i = 0; i < 64; i++)
		CHECK(h[i] == (63 - i) * 3);
	OK(cudaFree(d));
}

// Stream work runs at synchronization: pinned memory read by a queued
// copy is read then, and a queued copy's result is not there before.
static void check_deferred(void)
{
	cudaStream_t s;
	int *pin, *d;

	OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(cudaHostAlloc((void **)&pin, 2 * sizeof(int), cudaHostAllocDefault));
	OK(cudaMalloc((void **)&d, sizeof(int)));
	pin[0] = 1;
	pin[1] = -1;
	OK(cudaMemcpyAsync(d, pin, sizeof(int), cudaMemcpyHostToDevice, s));
	pin[0] = 2; // before the copy ran: the device gets 2
	OK(cudaMemcpyAsync(pin + 1, d, sizeof(int), cudaMemcpyDeviceToHost, s));
	CHECK(pin[1] == -1);
	OK(cudaStreamSynchronize(s));
	CHECK(pin[1] == 2);
	OK(cudaFree(d));
	OK(cudaFreeHost(pin));
	OK(cudaStreamDestroy(s));
}

// Capture records; a replay runs the recorded work with the recorded
// arguments; a forbidden call invalidates the capture.
static void check_graphs(void)
{
	cudaStream_t s;
	cudaGraph_t g;
	cudaGraphExec_t ex;
	int *d, *pin, v = 5;
	struct cuemu_stats a, b;

	OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(cudaMalloc((void **)&d, sizeof(int)));
	OK(cudaHostAlloc((void **)&pin, sizeof(int), cudaHostAllocDefault));
	OK(cudaMemsetAsync(d, 0, sizeof(int), s));
	OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	add_kernel<<<1, 32, 0, s>>>(d, v);
	v = 100; // captured by value: the graph adds 5
	OK(cudaStreamEndCapture(s, &g));
	OK(cudaGraphInstantiate(&ex, g, 0));
	OK(cudaGraphDestroy(g));
	OK(cudaStreamSynchronize(s)); // the memset; nothing captured ran
	a = cuemu_get_stats();
	for (int i = 0; i < 3; i++)
		OK(cudaGraphLaunch(ex, s));
	OK(cudaMemcpyAsync(pin, d, sizeof(int), cudaMemcpyDeviceToHost, s));
	OK(cudaStreamSynchronize(s));
	b = cuemu_get_stats();
	CHECK(*pin == 15);
	CHECK(b.graph_launches - a.graph_launches == 3 && b.launches - a.launches == 3);
	OK(cudaGraphExecDestroy(ex));

	OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	add_kernel<<<1, 32, 0, s>>>(d, v);
	CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
	void *p;
	CHECK(cudaMalloc(&p, 16) == cudaErrorStreamCaptureUnsupported);
	CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g);
	cudaGetLastError();
	OK(cudaFree(d));
	OK(cudaFreeHost(pin));
	OK(cudaStreamDestroy(s));
}

// Events stamp when the stream runs them, not when recorded: elapsed time
// is not ready before the synchronization, and is ordered after it.
static void check_events(void)
{
	cudaStream_t s;
	cudaEvent_t a, b;
	int *d;
	float ms = -1;

	OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	OK(cudaMalloc((void **)&d, sizeof(int)));
	OK(cudaEventCreate(&a));
	OK(cudaEventCreate(&b));
	CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle);
	cudaGetLastError();
	OK(cudaEventRecord(a, s));
	add_kernel<<<64, 32, 0, s>>>(d, 1);
	OK(cudaEventRecord(b, s));
	CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady);
	cudaGetLastError();
	OK(cudaStreamSynchronize(s));
	OK(cudaEventElapsedTime(&ms, a, b));
	CHECK(ms >= 0);
	OK(cudaEventSynchronize(b));

	OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	CHECK(cudaEventRecord(a, s) == cudaErrorStreamCaptureUnsupported);
	cudaGraph_t g;
	CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
	cudaGetLastError();
	OK(cudaEventDestroy(a));
	OK(cudaEventDestroy(b));
	OK(cudaFree(d));
	OK(cudaStreamDestroy(s));
}

static void check_config(void)
{
	int *d;

	OK(cudaMalloc((void **)&d, 1024 * sizeof(int)));
	bounded_kernel<<<1, 128>>>(d);
	CHECK(cudaGetLastError() == cudaErrorLaunchOutOfResources);
	bounded_kernel<<<dim3(1, 70000), 32>>>(d);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	bounded_kernel<<<1, 0>>>(d);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	CHECK(cudaGetLastError() == cudaSuccess); // read and cleared
	OK(cudaFree(d));
}

// cudaLaunchKernelEx as cu2cc.py rewrites it: the configuration's grid,
// block, stream and __launch_bounds__ as a launch's; the programmatic
// serialization attribute accepted (and each block's wait checked, see
// check_faults), an attribute cuemu does not know refused.
static void check_launch_ex(void)
{
	cudaLaunchAttribute a[2] = {};
	cudaLaunchConfig_t c = {};
	cudaStream_t s;
	int *d, h[4] = {};

	OK(cudaStreamCreate(&s));
	OK(cudaMalloc((void **)&d, 4 * sizeof(int)));
	a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	a[0].val.programmaticStreamSerializationAllowed = 1;
	c.gridDim = dim3(4);
	c.blockDim = dim3(64);
	c.stream = s;
	c.attrs = a;
	c.numAttrs = 1;
	OK(cudaLaunchKernelEx(&c, pdl_kernel, d, 1));
	OK(cudaStreamSynchronize(s));
	OK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
	CHECK(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4);
	c.numAttrs = 0; /* not allowed to overlap: no wait needed */
	OK(cudaLaunchKernelEx(&c, pdl_kernel, d, 0));
	OK(cudaStreamSynchronize(s));
	c.blockDim = dim3(128); /* above the kernel's __launch_bounds__(64) */
	CHECK(cudaLaunchKernelEx(&c, pdl_kernel, d, 1) == cudaErrorLaunchOutOfResources);
	cudaGetLastError();
	c.blockDim = dim3(64);
	a[1].id = (cudaLaunchAttributeID)4; /* cluster dimensions: not emulated */
	c.numAttrs = 2;
	CHECK(cudaLaunchKernelEx(&c, pdl_kernel, d, 1) == cudaErrorNotSupported);
	OK(cudaFree(d));
	OK(cudaStreamDestroy(s));
}

static void check_memory(void)
{
	size_t f0, f1, t;
	void *p, *q;

	OK(cudaMemGetInfo(&f0, &t));
	OK(cudaMalloc(&p, 3 << 20));
	OK(cudaMemGetInfo(&f1, &t));
	CHECK(f0 - f1 == 3 << 20);
	CHECK(((uintptr_t)p & 255) == 0);
	CHECK(cudaMalloc(&q, t) == cudaErrorMemoryAllocation && !q);
	CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
	OK(cudaFree(p));
	CHECK(cudaFree((char *)p + 1) == cudaErrorInvalidValue);
	cudaGetLastError();
	CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice);
	cudaGetLastError();
	int n;
	OK(cudaGetDeviceCount(&n));
	CHECK(n == 5);
	// a copy outside its allocation is refused when made
	OK(cudaMalloc(&p, 64));
	char h[128];
	CHECK(cudaMemcpy(p, h, 128, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
	CHECK(cudaMemcpy(h, h + 64, 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
	cudaGetLastError();
	OK(cudaFree(p));
}

// A deadlock, an illegal address and a programmatic launch that does not
// wait each fail their device's work from then on, and only that device's.
static void check_faults(void)
{
	int *d;

	OK(cudaSetDevice(1));
	OK(cudaMalloc((void **)&d, 64 * sizeof(int)));
	divergent_kernel<<<1, 64>>>(d);
	OK(cudaGetLastError()); // the launch itself is fine
	CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
	CHECK(cudaMemset(d, 0, 4) == cudaErrorLaunchFailure); // sticky

	OK(cudaSetDevice(2));
	OK(cudaMalloc((void **)&d, 64 * sizeof(int)));
	read_kernel<<<1, 1>>>(d, 64 + 4096, d); // 16 KiB past the end
	CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);

	OK(cudaSetDevice(3));
	OK(cudaMalloc((void **)&d, 64 * sizeof(int)));
	read_kernel<<<1, 1>>>(d, 63, d);
	OK(cudaDeviceSynchronize());
	OK(cudaFree(d));

	/* allowed to overlap its predecessor, a block ends without waiting */
	OK(cudaSetDevice(4));
	OK(cudaMalloc((void **)&d, 4 * sizeof(int)));
	{
		cudaLaunchAttribute a = {};
		cudaLaunchConfig_t c = {};

		a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
		a.val.programmaticStreamSerializationAllowed = 1;
		c.gridDim = dim3(2);
		c.blockDim = dim3(32);
		c.attrs = &a;
		c.numAttrs = 1;
		OK(cudaLaunchKernelEx(&c, pdl_kernel, d, 0));
		CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
	}
	OK(cudaSetDevice(0));
	CHECK(cuemu_get_stats().faults == 3);
}

// Runs fn in a child; true when it died of a signal or exited non-zero.
static bool dies(void (*fn)(void))
{
	pid_t pid = fork();
	int st;

	if (pid == 0) {
		int fd = open("/dev/null", 1);
		dup2(fd, 2);
		fn();
		_exit(0);
	}
	waitpid(pid, &st, 0);
	return WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
}

static void host_touches_device(void)
{
	int *d;

	cudaSetDevice(3);
	cudaMalloc((void **)&d, 64);
	d[0] = 1; // a device pointer on the host
}

static void misaligned_vector(void)
{
	uint8_t *p;
	int *o;

	cudaSetDevice(3);
	cudaMalloc((void **)&p, 64);
	cudaMalloc((void **)&o, 64);
	vec_kernel<<<1, 1>>>(p, o);
	cudaDeviceSynchronize();
}

static void cp_misaligned(int src_off, int dst_off, bool full)
{
	uint8_t *p;

	cudaSetDevice(3);
	cudaMalloc((void **)&p, 64);
	cp_misaligned_kernel<<<1, 1>>>(p, src_off, dst_off, full);
	cudaDeviceSynchronize();
}

static void cp_src_misaligned(void)
{
	cp_misaligned(4, 0, true);
}

static void cp_zero_fill_misaligned(void)
{
	cp_misaligned(8, 0, false);
}

static void cp_dst_misaligned(void)
{
	cp_misaligned(0, 1, true);
}

static void cp_aligned(void)
{
	cp_misaligned(16, 4, true);
}

static void big_shared(size_t dyn)
{
	int *o;

	cudaSetDevice(3);
	cudaMalloc((void **)&o, 64 * sizeof(int));
	big_shared_kernel<<<2, 32, dyn>>>(o);
	cudaDeviceSynchronize();
}

static void shared_48k(void)
{
	big_shared(8 << 10); /* 48 KiB in all: allowed */
}

static void shared_over_48k(void)
{
	big_shared((8 << 10) + 4);
}

// This program run again as a child, with env set (NAME=VALUE, or
// nullptr) and arguments a1, a2, a3 (nullptr ends them): its standard
// error into buf (n bytes, NUL-terminated); returns the wait status.
static int child(const char *env, const char *a1, const char *a2, const char *a3, char *buf,
		 size_t n)
{
	char path[] = "/tmp/cuemu-child.XXXXXX";
	const char *self = "/proc/self/exe";
	int fd = mkstemp(path), st = -1;
	ssize_t k = 0;
	pid_t pid;

	buf[0] = 0;
	if (fd < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		dup2(fd, 2);
		if (env)
			putenv((char *)env);
		execl(self, self, a1, a2, a3, (char *)nullptr);
		_exit(127);
	}
	if (pid > 0)
		waitpid(pid, &st, 0);
	k = pread(fd, buf, n - 1, 0);
	close(fd);
	unlink(path);
	buf[k > 0 ? k : 0] = 0;
	return st;
}

// CUEMU_ORDER other than forward or reverse: the first CUDA call stops
// the process and says what it takes (cuemu_test --order-probe).
static void check_order_env(void)
{
	char buf[4096];
	int st = child("CUEMU_ORDER=sideways", "--order-probe", nullptr, nullptr, buf,
		       sizeof(buf));

	CHECK(st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0));
	CHECK(strstr(buf, "CUEMU_ORDER=sideways: forward or reverse") != nullptr);
	st = child("CUEMU_ORDER=reverse", "--order-probe", nullptr, nullptr, buf, sizeof(buf));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

#ifdef __SANITIZE_THREAD__
// cuemu_test --race MODE FIXED: race_kernel's mode in a process of its
// own, whose standard error holds its report alone.
static int race_main(int mode, int fixed)
{
	unsigned *out;

	if (cudaMalloc((void **)&out, 512 * sizeof(unsigned)) ||
	    cudaMemset(out, 0, 512 * sizeof(unsigned)))
		return 2;
	/* RACE_GRID_FAR's blocks 0 and 2 are apart in the third launch
	 * (tests/cuemu/cuemu.cc, colouring_of) */
	for (int i = 0; i < (mode == RACE_GRID_FAR ? 3 : 1); i++)
		race_kernel<<<mode == RACE_GRID_FAR ? 4 : 2, 64>>>(out, out + 128, mode, fixed);
	return cudaDeviceSynchronize() == cudaSuccess ? 0 : 2;
}

// Whether ThreadSanitizer reports a data race in race_kernel's mode (its
// report read from the child's standard error).
static bool races(int mode, int fixed)
{
	static char buf[1 << 16];
	char m[8], f[8];

	snprintf(m, sizeof(m), "%d", mode);
	snprintf(f, sizeof(f), "%d", fixed);
	child(nullptr, "--race", m, f, buf, sizeof(buf));
	if (getenv("CUEMU_TEST_RACE_LOG"))
		fputs(buf, stderr);
	return strstr(buf, "WARNING: ThreadSanitizer: data race") && strstr(buf, "race_kernel");
}

// The races of race_kernel reported, and none once the barrier is there
// (a -Db_sanitize=thread build: each thread of a block a ThreadSanitizer
// fiber ordered only by barriers, tests/cuemu/README.md).
static void check_races(void)
{
	for (int m = 0; m < RACE_MODES; m++) {
		bool bad = races(m, 0), good = !races(m, 1);

		if (!bad || !good)
			fprintf(stderr, "cuemu_test: race_kernel mode %d: %s\n", m,
				!bad ? "the race not reported" : "reported with its barrier");
		CHECK(bad && good);
	}
}
#else
static void check_races(void) {}
#endif

static void check_fatal(void)
{
	CHECK(dies(host_touches_device));
	CHECK(dies(misaligned_vector));
	CHECK(!dies(cp_aligned));
	CHECK(dies(cp_src_misaligned));
	CHECK(dies(cp_zero_fill_misaligned));
	CHECK(dies(cp_dst_misaligned));
	CHECK(!dies(shared_48k));
	CHECK(dies(shared_over_48k));
}

static void check_half(void)
{
	int bad = 0;

	for (unsigned u = 0; u < 65536; u++) {
		__half h = __ushort_as_half((unsigned short)u);
		float f = __half2float(h);
		if (f == f && __half_as_ushort(__float2half_rn(f)) != u)
			bad++;
	}
	CHECK(bad == 0);
	// ties to even, overflow, subnormals
	CHECK(__half_as_ushort(__float2half_rn(1.0f + 0x1p-11f)) == 0x3c00);
	CHECK(__half_as_ushort(__float2half_rn(1.0f + 3 * 0x1p-11f)) == 0x3c02);
	CHECK(__half_as_ushort(__float2half_rn(65519.0f)) == 0x7bff);
	CHECK(__half_as_ushort(__float2half_rn(65520.0f)) == 0x7c00);
	CHECK(__half_as_ushort(__float2half_rn(0x1p-25f)) == 0x0000);
	CHECK(__half_as_ushort(__float2half_rn(0x1.8p-25f)) == 0x0001);
	CHECK(__half_as_ushort(__float2half_rn(-0x1p-24f)) == 0x8001);
	CHECK(__bfloat162float(__float2bfloat16_rn(1.0f + 0x1p-8f)) == 1.0f);
	CHECK(__bfloat162float(__float2bfloat16_rn(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
	CHECK(__dp4a((int)0x80ff0102u, (int)0x01ff0304u, 7) == 7 + 2 * 4 + 1 * 3 + 1 - 128);
	CHECK(__vsub4(0x0f000810u, 0x08080808u) == 0x07f80008u);
}

// One m16n8k16 product of halves (fp16, or bf16 with bf): each lane builds
// its fragments from A (16 x 16, row-major) and B (16 x 8, stored column by
// column) as the PTX ISA lays them out (a[0] = A[g][2t..2t+1], a[1] =
// A[g+8][2t..], a[2] = A[g][8+2t..], a[3] = A[g+8][8+2t..]; b[0] =
// B[2t..2t+1][g], b[1] = B[8+2t..][g]), and writes its outputs of D = A B + C.
__global__ void mma_h_kernel(const uint16_t *A, const uint16_t *B, const float *C, float *D,
			     int bf)
{
	unsigned l = threadIdx.x, g = l >> 2, t = l & 3, a[4], b[2];
	float d[4];

	memcpy(&a[0], A + g * 16 + 2 * t, 4);
	memcpy(&a[1], A + (g + 8) * 16 + 2 * t, 4);
	memcpy(&a[2], A + g * 16 + 8 + 2 * t, 4);
	memcpy(&a[3], A + (g + 8) * 16 + 8 + 2 * t, 4);
	memcpy(&b[0], B + g * 16 + 2 * t, 4);
	memcpy(&b[1], B + g * 16 + 8 + 2 * t, 4);
	for (int e = 0; e < 4; e++)
		d[e] = C[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)];
	cuemu_mma_h_m16n8k16(d, a, b, bf != 0);
	for (int e = 0; e < 4; e++)
		D[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)] = d[e];
}

// mma_h_kernel against a double-precision product, fp16 and bf16: values
// of few bits, so that every sum is exact and the bits must match.
static void check_mma_h(void)
{
	uint16_t hA[16 * 16], hB[8 * 16], *A, *B;
	float hC[16 * 8], hD[16 * 8], *C, *D;

	OK(cudaMalloc((void **)&A, sizeof(hA)));
	OK(cudaMalloc((void **)&B, sizeof(hB)));
	OK(cudaMalloc((void **)&C, sizeof(hC)));
	OK(cudaMalloc((void **)&D, sizeof(hD)));
	for (int bf = 0; bf < 2; bf++) {
		float fa[16 * 16], fb[8 * 16];

		for (int i = 0; i < 256; i++) {
			fa[i] = (float)((i * 37 + 11) % 31 - 15) / 8;
			hA[i] = bf ? __float2bfloat16_rn(fa[i]).x : __half_as_ushort(__float2half_rn(fa[i]));
		}
		for (int i = 0; i < 128; i++) {
			fb[i] = (float)((i * 53 + 5) % 29 - 14) / 4;
			hB[i] = bf ? __float2bfloat16_rn(fb[i]).x : __half_as_ushort(__float2half_rn(fb[i]));
			hC[i] = (float)(i - 64) / 2;
		}
		OK(cudaMemcpy(A, hA, sizeof(hA), cudaMemcpyHostToDevice));
		OK(cudaMemcpy(B, hB, sizeof(hB), cudaMemcpyHostToDevice));
		OK(cudaMemcpy(C, hC, sizeof(hC), cudaMemcpyHostToDevice));
		mma_h_kernel<<<1, 32>>>(A, B, C, D, bf);
		OK(cudaMemcpy(hD, D, sizeof(hD), cudaMemcpyDeviceToHost));
		for (int m = 0; m < 16; m++)
			for (int n = 0; n < 8; n++) {
				double want = hC[m * 8 + n];
				for (int k = 0; k < 16; k++) /* B[k][n] at n * 16 + k */
					want += (double)fa[m * 16 + k] * fb[n * 16 + k];
				CHECK(hD[m * 8 + n] == (float)want);
			}
	}
	OK(cudaFree(A));
	OK(cudaFree(B));
	OK(cudaFree(C));
	OK(cudaFree(D));
}

int main(int argc, char **argv)
{
#ifdef __SANITIZE_THREAD__
	if (argc == 4 && !strcmp(argv[1], "--race"))
		return race_main(atoi(argv[2]), atoi(argv[3]));
#endif
	if (argc == 2 && !strcmp(argv[1], "--order-probe")) {
		int n = 0;
		return cudaGetDeviceCount(&n) == cudaSuccess ? 0 : 2;
	}
	setenv("CUEMU_DEVICES", "5", 1);
	setenv("CUEMU_MEM_MIB", "64", 1);
	check_half();
	check_warps();
	check_block_sum();
	check_dynamic_shared();
	check_barrier_counts();
	check_mma();
	check_ldmatrix();
	check_deferred();
	check_graphs();
	check_events();
	check_config();
	check_launch_ex();
	check_memory();
	check_mma_h();
	check_cp_async();
	check_order();
	check_fresh_shared();
	check_races();
	check_order_env();
	check_fatal();
	check_faults();
	if (failures) {
		fprintf(stderr, "cuemu_test: %d checks failed\n", failures);
		return 1;
	}
	printf("cuemu_test: every check passed\n");
	return 0;
}
