// kernels.cu - the CUDA backend's kernels (kernels.cuh): embedding,
// RMSNorm, RoPE + KV store, paged attention over the compiled mask,
// SwiGLU, activation quantization and the Q8_0/Q4_0 matmuls.
//
// Simple first: each kernel is the CPU reference's loop (backend/cpu/
// forward.c, kernels.c) spread over threads, elementwise arithmetic in
// explicitly rounded operations where the CPU does not fuse them.
#include "gpud/backend/cuda/kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include <atomic>

extern "C" {
#include "gpud/draw.h"
#include "gpud/quant.h"
}
#include "gpud/backend/cuda/cuda_impl.h"

#define FULL 0xffffffffu

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
	return v;
}

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o; o >>= 1)
		v += __shfl_xor_sync(FULL, v, o);
	return v;
}

/* silu(g) * u, in the CPU's explicitly rounded operations. */
static __device__ __forceinline__ float swiglu(float g, float u)
{
	return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

static __device__ __forceinline__ float half_bits(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float bf16_bits(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

/* (float)c for |c| < 2^22, the same value, without the conversion unit:
 * an int-to-float conversion gives 16 results a clock per multiprocessor
 * on sm_80 and sm_90, an eighth of the fp32 FMA rate, and the int8 kernels
 * convert one block sum per output per 32-column block (the tensor-core
 * kernels' 32 a thread per block: more clocks than their MMAs). Here c
 * goes into the bits of 1.5 * 2^23, whose float is then 1.5 * 2^23 + c
 * exactly (the integers are the floats of [2^23, 2^24)), and 1.5 * 2^23
 * comes off: an integer add and an fp32 add. The int8 block sums are
 * within 32 * 128 * 128 = 2^19. */
#define I2F_BIAS 0x4B400000 /* the bits of 1.5 * 2^23 */

/* (float)c of c given as I2F_BIAS + c (an MMA can add the bias) */
static __device__ __forceinline__ float i2f_biased(int bc)
{
	return __fsub_rn(__int_as_float(bc), 12582912.0f);
}

static __device__ __forceinline__ float i2f_exact(int c) { return i2f_biased(I2F_BIAS + c); }

/* --- launches: programmatic dependent launch ---------------------------------
 * Every kernel goes through cudaLaunchKernelEx with klc's configuration. On a
 * stream gpud_k_pdl turned on (sm_90), that configuration allows
 * programmatic stream serialization: a kernel's blocks may be resident before
 * the kernel ahead of it ends, so that no launch gap separates them, and a
 * GEMV streams its first weights into L2 meanwhile. Every kernel begins with
 * pdl_enter (the GEMVs after their prefetch, which reads weights only): it
 * waits until the one before has ended and its writes are visible, then
 * lets the next kernel launch. Nothing is read before that wait that a
 * kernel wrote, and every block waits, so that no kernel ends before the
 * one ahead of it (cuemu checks the latter). The first runs on an H200 had
 * the two the other way round, and PDL made batch-1 steps 4% slower: each
 * kernel let the next launch before it had itself started, so a chain of
 * launched grids could wait in SM slots; now at most the next one does. */
#define PDL_STREAMS 64

static std::atomic<cudaStream_t> pdl_streams[PDL_STREAMS];

static bool pdl_on(cudaStream_t s)
{
	for (int i = 0; s && i < PDL_STREAMS; i++)
		if (pdl_streams[i].load(std::memory_order_relaxed) == s)
			return true;
	return false;
}

cudaError_t gpud_k_pdl(cudaStream_t s, bool on)
{
	if (!s)
		return cudaErrorInvalidValue;
	for (int i = 0; i < PDL_STREAMS; i++) {
		cudaStream_t cur = s;
		if (pdl_streams[i].load() == s) {
			if (!on)
				pdl_streams[i].compare_exchange_strong(cur, nullptr);
			return cudaSuccess;
		}
	}
	for (int i = 0; on && i < PDL_STREAMS; i++) {
		cudaStream_t none = nullptr;
		if (pdl_streams[i].compare_exchange_strong(none, s))
			return cudaSuccess;
	}
	return on ? cudaErrorNotSupported : cudaSuccess;
}

/* A launch's configuration: klc(grid, block, shm, stream).cfg(). */
struct klc {
	cudaLaunchAttribute a;
	cudaLaunchConfig_t c;

	klc(dim3 g, dim3 b, size_t shm, cudaStream_t s) : a(), c()
	{
		a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
		a.val.programmaticStreamSerializationAllowed = 1;
		c.gridDim = g;
		c.blockDim = b;
		c.dynamicSmemBytes = shm;
		c.stream = s;
		c.attrs = &a;
		c.numAttrs = pdl_on(s) ? 1 : 0;
	}
	klc(const klc &) = delete;
	klc &operator=(const klc &) = delete;
	const cudaLaunchConfig_t *cfg() const { return &c; }
};

/* The launch's error, or the last one. */
static cudaError_t launched(cudaError_t e)
{
	cudaError_t last = cudaGetLastError();
	return e != cudaSuccess ? e : last;
}

static __device__ __forceinline__ void pdl_enter(void)
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu_griddepcontrol_wait();
	cuemu_griddepcontrol_launch_dependents();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* n bytes from p into L2, a 128-byte line per thread at a time: thread i
 * of nt (the lanes of a warp, or a CTA's threads). */
static __device__ __forceinline__ void prefetch_l2(const void *p, int64_t n, uint32_t i,
						   uint32_t nt = 32)
{
#if !defined(CUEMU_CUDA_RUNTIME_H) && defined(__CUDA_ARCH__)
	for (int64_t o = (int64_t)i * 128; o < n; o += (int64_t)nt * 128)
		asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
#else
	(void)p;
	(void)n;
	(void)i;
	(void)nt;
#endif
}

/* Two kernels, the second launched behind the first: b reads what a wrote
 * only after its wait (gpud_k_pdl_probe). */
__global__ void pdl_probe_a(int *p)
{
	pdl_enter();
	if (threadIdx.x == 0) {
		for (int i = 0; i < 4096; i++) /* take a while: b is resident by now */
			((volatile int *)p)[2] = i;
		p[0] = p[1] + 0x5eed;
	}
}

__global__ void pdl_probe_b(int *p)
{
	pdl_enter();
	if (threadIdx.x == 0)
		p[1] = p[0];
}

cudaError_t gpud_k_pdl_probe(cudaStream_t s, int *p)
{
	cudaError_t e = cudaMemsetAsync(p, 0, 3 * sizeof(int), s);

	if (e == cudaSuccess)
		e = launched(cudaLaunchKernelEx(klc(1, 32, 0, s).cfg(), pdl_probe_a, p));
	if (e == cudaSuccess)
		e = launched(cudaLaunchKernelEx(klc(1, 32, 0, s).cfg(), pdl_probe_b, p));
	return e;
}

/* The launch floor (gpud_cuda_stage_profile): n launches of a kernel that
 * does nothing but the launch protocol, one CTA of 32 threads each. */
__global__ void nop_kernel(void)
{
	pdl_enter();
}

cudaError_t gpud_k_nop(cudaStream_t s, uint32_t n)
{
	cudaError_t e = cudaSuccess;

	for (uint32_t i = 0; e == cudaSuccess && i < n; i++)
		e = launched(cudaLaunchKernelEx(klc(1, 32, 0, s).cfg(), nop_kernel));
	return e;
}

/* --- embedding ----------------------------------------------------------- */

__global__ void embed_kernel(gpud_cuda_mat e, const int32_t *tokens, float *x)
{
	pdl_enter();
	int64_t cols = e.cols, nb = cols / GPUD_QK;
	int32_t tok = tokens[blockIdx.x];
	float *out = x + (int64_t)blockIdx.x * cols;

	for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
		float v = 0.0f;

		if (tok >= 0 && tok < e.rows) {
			int64_t r = tok;
			switch (e.type) {
			case GPUD_TYPE_F32:
				v = ((const float *)e.q)[r * cols + c];
				break;
			case GPUD_TYPE_F16:
				v = half_bits(((const uint16_t *)e.q)[r * cols + c]);
				break;
			case GPUD_TYPE_BF16:
				v = bf16_bits(((const uint16_t *)e.q)[r * cols + c]);
				break;
			case GPUD_TYPE_Q8_0: {
				float d = half_bits(((const uint16_t *)e.d)[r * nb + c / GPUD_QK]);
				v = __fmul_rn(d, (float)((const int8_t *)e.q)[r * cols + c]);
				break;
			}
			case GPUD_TYPE_Q4_0: {
				float d = half_bits(((const uint16_t *)e.d)[r * nb + c / GPUD_QK]);
				int j = (int)(c % GPUD_QK);
				const uint8_t *qb = (const uint8_t *)e.q + r * cols / 2;
				uint8_t by = qb[(c / GPUD_QK) * 16 + (j & 15)];
				int nib = j < 16 ? (by & 15) : (by >> 4);
				v = __fmul_rn(d, (float)(nib - 8));
				break;
			}
			default:
				break;
			}
		}
		out[c] = v;
	}
}

cudaError_t gpud_k_embed(cudaStream_t s, const gpud_cuda_mat *emb, const int32_t *tokens,
			 uint32_t T, float *x)
{
	return launched(cudaLaunchKernelEx(klc(T, 256, 0, s).cfg(), embed_kernel, *emb, tokens, x));
}

/* --- the int8 path's activation blocks ---------------------------------------
 * As the CPU's (kernels.c): each block of 32 activations is quantized with
 * d = max|x| / 127, q = rint(x * (1/d)); a block holding a NaN or an Inf
 * gets d = NaN and zero quants, one with max |x| below 1e-30 is all zero.
 * Each output sums fma(d_w * d_x, (float)isum, acc) over the blocks. */

#define ACT_TINY 1e-30f

/* A warp's 32 values v (lane j: element j of the block) into its quant
 * (returned) and the block's scale (*d, every lane). */
static __device__ __forceinline__ int8_t quant_block(float v, float *d)
{
	bool bad = __any_sync(FULL, !isfinite(v));
	float amax = warp_max(fabsf(v));
	int8_t qv = 0;
	float dv;

	if (bad || amax < ACT_TINY) {
		dv = bad ? NAN : 0.0f;
	} else {
		dv = __fdiv_rn(amax, 127.0f);
		float id = dv != 0.0f ? __fdiv_rn(1.0f, dv) : 0.0f;
		qv = (int8_t)rintf(__fmul_rn(v, id));
	}
	*d = dv;
	return qv;
}

/* --- RMSNorm (+ residual add) -------------------------------------------- */

#define NORM_THREADS 256
#define NORM_REG 16 /* elements a thread holds: rows of up to 4096 in registers */

/* dst[j] = src[t + j NORM_THREADS] within n, else 0: thread t's elements
 * of a row, their loads issued together. */
static __device__ __forceinline__ void norm_load(float (&dst)[NORM_REG], const float *src,
						 uint32_t t, uint32_t n)
{
#pragma unroll
	for (uint32_t j = 0; j < NORM_REG; j++) {
		uint32_t i = t + j * NORM_THREADS;
		dst[j] = i < n ? src[i] : 0.0f;
	}
}

/* Element i's int8 quant into q and, for a block's first, its scale into
 * d (warp-collective: a warp holds one whole block). */
static __device__ __forceinline__ void quant_put(int8_t *q, float *d, size_t i, float e)
{
	float dv;
	int8_t qv = quant_block(e, &dv);

	q[i] = qv;
	if ((i & 31) == 0)
		d[i / GPUD_QK] = dv;
}

/* Element i of row r's output, and its quant when asked. */
static __device__ __forceinline__ void norm_store(float *o, int8_t *aq, float *ad, uint32_t r,
						  uint32_t dim, uint32_t i, float e)
{
	o[i] = e;
	if (aq)
		quant_put(aq, ad, (size_t)r * dim + i, e);
}

/* 1 / rms of a row from each thread's sum of squares ss (in double: the
 * CPU's), added in a fixed order: the lanes of a warp, then the warps in
 * turn. Every thread of the CTA gets it; part is reusable after. */
static __device__ __forceinline__ float norm_scale(double ss, double *part, uint32_t dim,
						   float eps)
{
	uint32_t t = threadIdx.x;

	for (int of = 16; of; of >>= 1)
		ss += __shfl_xor_sync(FULL, ss, of);
	if ((t & 31) == 0)
		part[t >> 5] = ss;
	__syncthreads();
	ss = 0;
	for (int i = 0; i < NORM_THREADS / 32; i++)
		ss += part[i];
	__syncthreads();
	return (float)(1.0 / sqrt(ss / dim + (double)eps));
}

/* Row r: x (row rows[r], or r) += out (with add), then out = x / rms * w,
 * quantized into aq, ad when asked. REG: the row in registers, its loads
 * issued together. The first runs on an H200 had only the loop below, in
 * which every element's store could alias the next one's load: a chain of
 * about 24 memory latencies a row, some 12 us a launch at batch 1, where
 * the two norms of a layer took more than its gate and up matmuls. Both
 * forms add and round in the same order: the same bits. */
template <bool REG>
__global__ void __launch_bounds__(NORM_THREADS)
add_norm_kernel(float *x, float *out, const float *w, int add, const uint32_t *rows,
		uint32_t dim, float eps, int8_t *aq, float *ad)
{
	pdl_enter();
	__shared__ double part[NORM_THREADS / 32];
	uint32_t r = blockIdx.x, src = rows ? rows[r] : r, t = threadIdx.x;
	float *xr = x + (size_t)src * dim, *o = out + (size_t)r * dim;
	double ss = 0;
	float v[NORM_REG]; /* REG only */

	if (REG) {
		float ov[NORM_REG];

		norm_load(v, xr, t, dim);
		norm_load(ov, o, t, add ? dim : 0);
#pragma unroll
		for (uint32_t j = 0; j < NORM_REG; j++) {
			uint32_t i = t + j * NORM_THREADS;
			if (i < dim) {
				if (add) {
					v[j] = __fadd_rn(v[j], ov[j]);
					xr[i] = v[j];
				}
				ss += (double)v[j] * v[j];
			}
		}
	} else {
		for (uint32_t i = t; i < dim; i += NORM_THREADS) {
			float e = xr[i];
			if (add) {
				e = __fadd_rn(e, o[i]);
				xr[i] = e;
			}
			ss += (double)e * e;
		}
	}
	if (!w)
		return;
	float scale = norm_scale(ss, part, dim, eps);
	if (REG) {
		float wv[NORM_REG];

		norm_load(wv, w, t, dim);
#pragma unroll
		for (uint32_t j = 0; j < NORM_REG; j++) {
			uint32_t i = t + j * NORM_THREADS;
			if (i >= dim) /* dim % 32 == 0 with aq: whole warps stop together */
				break;
			norm_store(o, aq, ad, r, dim, i, __fmul_rn(__fmul_rn(v[j], scale), wv[j]));
		}
	} else {
		for (uint32_t i = t; i < dim; i += NORM_THREADS)
			norm_store(o, aq, ad, r, dim, i, __fmul_rn(__fmul_rn(xr[i], scale), w[i]));
	}
}

cudaError_t gpud_k_add_norm(cudaStream_t s, float *x, float *out, const float *w, bool add,
			    const uint32_t *rows, uint32_t n, uint32_t dim, float eps, int8_t *aq,
			    float *ad)
{
	if (aq && (!w || dim % GPUD_QK))
		return cudaErrorInvalidValue;
	if (dim <= NORM_THREADS * NORM_REG)
		return launched(cudaLaunchKernelEx(klc(n, NORM_THREADS, 0, s).cfg(),
						   add_norm_kernel<true>, x, out, w, add ? 1 : 0, rows,
						   dim, eps, aq, ad));
	return launched(cudaLaunchKernelEx(klc(n, NORM_THREADS, 0, s).cfg(), add_norm_kernel<false>,
					   x, out, w, add ? 1 : 0, rows, dim, eps, aq, ad));
}

/* --- RMSNorm fused into the decode GEMV after it --------------------------
 * At batch 1 each RMSNorm was a launch of one CTA (one row) between two
 * matmuls: a chain of memory latencies on one multiprocessor, and a kernel
 * boundary, twice a layer. Fused, the matmul before it adds its output
 * into the residual stream x itself (gemv_set.acc), and every CTA of the
 * GEMV after it norms x's T rows into its shared memory: quantized for an
 * int8 GEMV (norm_act), as fp32 for the others (norm_act_f). The same x
 * is read by each CTA from L2, with the same sums in the same order as
 * add_norm_kernel's (a CTA of NORM_THREADS): the bits of add_norm's out
 * and aq, ad. Shared memory: norm_smem bytes, dynamic. */
#define NORM_SMEM_HEAD 64 /* the warps' partial sums: NORM_THREADS / 32 doubles */
#define NORM_FUSE_SMEM (40u * 1024) /* under the 48 KB a launch gets unasked */

static __host__ __device__ __forceinline__ size_t norm_smem(bool i8, uint32_t T, int64_t cols)
{
	size_t n = (size_t)T * cols;

	return NORM_SMEM_HEAD + (i8 ? n + n / GPUD_QK * sizeof(float) : n * sizeof(float));
}

/* The norm's weights into L2 (warp 0 of each CTA): read only, so before
 * the wait for the kernel ahead, as the GEMV's own rows. */
static __device__ __forceinline__ void norm_prefetch(const gpud_cuda_norm &n, int64_t cols)
{
	if (threadIdx.x < 32)
		prefetch_l2(n.w, cols * (int64_t)sizeof(float), threadIdx.x);
}

/* 1 / rms of row xr (dim elements), as add_norm_kernel: every thread of
 * the CTA calls it (barriers). */
static __device__ __forceinline__ float norm_row_scale(const float *xr, uint32_t dim, float eps,
						       double *part)
{
	uint32_t t = threadIdx.x;
	double ss = 0;

	if (dim <= NORM_THREADS * NORM_REG) { /* the row's loads issued together */
		float v[NORM_REG];

		norm_load(v, xr, t, dim);
#pragma unroll
		for (uint32_t j = 0; j < NORM_REG; j++)
			if (t + j * NORM_THREADS < dim)
				ss += (double)v[j] * v[j];
	} else {
		for (uint32_t i = t; i < dim; i += NORM_THREADS)
			ss += (double)xr[i] * xr[i];
	}
	return norm_scale(ss, part, dim, eps);
}

/* Block b of a normed row (xr * scale * w, 32 elements) quantized by one
 * thread into q, *d: quant_block's arithmetic (the block's greatest
 * magnitude is the same whoever finds it), without its five shuffles an
 * element, which a CTA of each GEMV would otherwise pay for every element
 * of x. */
static __device__ __forceinline__ void quant_block_norm(const float *xr, const float *w,
							 float scale, uint32_t b, int8_t *q,
							 float *d)
{
	float e[GPUD_QK], amax = 0.0f;
	bool bad = false;

#pragma unroll
	for (int i = 0; i < GPUD_QK; i += 4) {
		float4 xv = *(const float4 *)(xr + b * GPUD_QK + i);
		float4 wv = *(const float4 *)(w + b * GPUD_QK + i);
		e[i] = __fmul_rn(__fmul_rn(xv.x, scale), wv.x);
		e[i + 1] = __fmul_rn(__fmul_rn(xv.y, scale), wv.y);
		e[i + 2] = __fmul_rn(__fmul_rn(xv.z, scale), wv.z);
		e[i + 3] = __fmul_rn(__fmul_rn(xv.w, scale), wv.w);
	}
#pragma unroll
	for (int i = 0; i < GPUD_QK; i++) {
		bad = bad || !isfinite(e[i]);
		amax = fmaxf(amax, fabsf(e[i]));
	}
	float dv = bad ? NAN : 0.0f, id = 0.0f;
	if (!bad && amax >= ACT_TINY) {
		dv = __fdiv_rn(amax, 127.0f);
		id = dv != 0.0f ? __fdiv_rn(1.0f, dv) : 0.0f;
	}
	int v[GPUD_QK / 4];
#pragma unroll
	for (int i = 0; i < GPUD_QK; i += 4) {
		int8_t q0 = 0, q1 = 0, q2 = 0, q3 = 0;
		if (id != 0.0f) {
			q0 = (int8_t)rintf(__fmul_rn(e[i], id));
			q1 = (int8_t)rintf(__fmul_rn(e[i + 1], id));
			q2 = (int8_t)rintf(__fmul_rn(e[i + 2], id));
			q3 = (int8_t)rintf(__fmul_rn(e[i + 3], id));
		}
		v[i / 4] = (int)((uint32_t)(uint8_t)q0 | (uint32_t)(uint8_t)q1 << 8 |
				 (uint32_t)(uint8_t)q2 << 16 | (uint32_t)(uint8_t)q3 << 24);
	}
	int4 *qo = (int4 *)(q + b * GPUD_QK);
	qo[0] = make_int4(v[0], v[1], v[2], v[3]);
	qo[1] = make_int4(v[4], v[5], v[6], v[7]);
	d[b] = dv;
}

/* The CTA's int8 activations from n: rmsnorm(n.x row k) * n.w quantized
 * into shared memory sm (norm_smem bytes) for every token k < T, a block
 * of 32 a thread; xq, xd then point there. Every thread of the CTA calls
 * it (barriers). The row is read again (from L1) to be normed: the
 * registers of a row and its weights would leave the GEMV after it
 * fewer. */
static __device__ __forceinline__ void norm_act(const gpud_cuda_norm &n, int64_t cols,
						uint32_t T, unsigned char *sm,
						const int8_t *__restrict__ &xq,
						const float *__restrict__ &xd)
{
	int8_t *sq = (int8_t *)(sm + NORM_SMEM_HEAD);
	float *sd = (float *)(sq + (size_t)T * cols);
	uint32_t dim = (uint32_t)cols;

	for (uint32_t k = 0; k < T; k++) {
		const float *xr = n.x + (size_t)k * dim;
		float scale = norm_row_scale(xr, dim, n.eps, (double *)sm);

		for (uint32_t b = threadIdx.x; b < dim / GPUD_QK; b += NORM_THREADS)
			quant_block_norm(xr, n.w, scale, b, sq + (size_t)k * dim,
					 sd + (size_t)k * (dim / GPUD_QK));
	}
	__syncthreads();
	xq = sq;
	xd = sd;
}

/* The same for an fp32 GEMV: the normed rows (T, cols) into sm; x then
 * points there. */
static __device__ __forceinline__ void norm_act_f(const gpud_cuda_norm &n, int64_t cols,
						  uint32_t T, unsigned char *sm, const float *&x)
{
	float *sx = (float *)(sm + NORM_SMEM_HEAD);
	uint32_t dim = (uint32_t)cols;

	for (uint32_t k = 0; k < T; k++) {
		const float *xr = n.x + (size_t)k * dim;
		float scale = norm_row_scale(xr, dim, n.eps, (double *)sm);

#pragma unroll 4
		for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS)
			sx[(size_t)k * dim + i] = __fmul_rn(__fmul_rn(xr[i], scale), n.w[i]);
	}
	__syncthreads();
	x = sx;
}

/* --- RoPE and the KV store ----------------------------------------------- */

/* RoPE of the CPU reference (backend/cpu/rope.c: pairs 2i, 2i + 1, or
 * with NEOX i, i + head_dim / 2): the cosine and sine of pos * inv in
 * double, and a pair rotated by them in the CPU's rounded operations.
 * Shared by rope_store_kernel and the decode Q/K/V GEMVs' epilogue
 * (qkv_store), which must agree bit for bit. */
static __device__ __forceinline__ float2 rope_cs(uint32_t pos, float inv)
{
	double a = (double)pos * (double)inv;
	return make_float2((float)cos(a), (float)sin(a));
}

static __device__ __forceinline__ float2 rope_rot(float a, float b, float2 cs)
{
	return make_float2(__fsub_rn(__fmul_rn(a, cs.x), __fmul_rn(b, cs.y)),
			   __fadd_rn(__fmul_rn(a, cs.y), __fmul_rn(b, cs.x)));
}

/* Element i0 of pair i of a head, and the pair's other (i0 + rope_step). */
static __device__ __forceinline__ uint32_t rope_i0(uint32_t i, uint32_t neox)
{
	return neox ? i : 2 * i;
}

static __device__ __forceinline__ uint32_t rope_step(uint32_t hd, uint32_t neox)
{
	return neox ? hd / 2 : 1;
}

/* v + b[i] with a bias (the CPU's y += b), v without. */
static __device__ __forceinline__ float bias_add(float v, const float *b, uint64_t i)
{
	return b ? __fadd_rn(v, b[i]) : v;
}

/* Token t's slot in its KV block of layer kv.layer, in elements of the
 * pool: K of head h at + h * head_elems, V at + (n_kv_heads + h) *
 * head_elems. */
static __device__ __forceinline__ uint64_t kv_slot(const gpud_cuda_meta &m,
						   const gpud_cuda_kvshape &kv, uint32_t t)
{
	uint32_t pos = m.pos[t], bt = kv.block_tokens;
	uint32_t blk = m.btab[m.seqinfo[(size_t)m.seq[t] * GPUD_CUDA_SEQ_WORDS +
					GPUD_CUDA_SI_BTAB] + pos / bt];

	return (uint64_t)blk * kv.block_elems + (uint64_t)kv.layer * kv.layer_elems +
	       (uint64_t)(pos % bt) * kv.head_dim;
}

/* Element i of the KV pool = x, rounded to half with kv16 (the CPU
 * backend's gpud_fp32_to_fp16: nearest even). */
static __device__ __forceinline__ void kv_put(const gpud_cuda_kvshape &kv, uint64_t i, float x)
{
	if (kv.kv16)
		((__half *)kv.kv)[i] = __float2half_rn(x);
	else
		((float *)kv.kv)[i] = x;
}

/* Reads of the pool by element type, widened to fp32 (exact). */
template <typename KT> struct kv_ld;
template <> struct kv_ld<float> {
	static __device__ __forceinline__ float one(const float *p, uint64_t i)
	{
		return p[i];
	}
	/* elements i, i + 1 (i even) */
	static __device__ __forceinline__ float2 two(const float *p, uint64_t i)
	{
		return *(const float2 *)(p + i);
	}
};
template <> struct kv_ld<__half> {
	static __device__ __forceinline__ float one(const __half *p, uint64_t i)
	{
		return __half2float(p[i]);
	}
	static __device__ __forceinline__ float2 two(const __half *p, uint64_t i)
	{
		uint32_t u = *(const uint32_t *)(p + i);
		return make_float2(__half2float(__ushort_as_half((unsigned short)(u & 0xffffu))),
				   __half2float(__ushort_as_half((unsigned short)(u >> 16))));
	}
};

/* Element d of a head (bias added) normed as the CPU's rmsnorm writes it,
 * x * scale * w, when the head has a norm. */
static __device__ __forceinline__ float head_norm(float x, const float *w, const float *scale,
						  uint32_t h, uint32_t d)
{
	return w ? __fmul_rn(__fmul_rn(x, scale[h]), w[d]) : x;
}

/* 1 / rms of each Q head (0..nh) and K head (nh..nh + nkv) of token t, the
 * biases added, into scale: a warp a head, the squares summed in double
 * (the CPU's). */
static __device__ void head_scales(const float *qt, const float *kt, const gpud_cuda_rope &rp,
				   uint32_t nh, uint32_t nkv, uint32_t hd, float *scale)
{
	uint32_t lane = threadIdx.x & 31, nw = blockDim.x / 32;

	for (uint32_t g = threadIdx.x / 32; g < nh + nkv; g += nw) {
		const float *x = g < nh ? qt + (size_t)g * hd : kt + (size_t)(g - nh) * hd;
		const float *b = g < nh ? rp.bq : rp.bk;
		uint64_t o = (uint64_t)(g < nh ? g : g - nh) * hd;
		double ss = 0;
		for (uint32_t d = lane; d < hd; d += 32) {
			double e = bias_add(x[d], b, o + d);
			ss += e * e;
		}
		for (int of = 16; of; of >>= 1)
			ss += __shfl_xor_sync(FULL, ss, of);
		if (lane == 0)
			scale[g] = (float)(1.0 / sqrt(ss / hd + (double)rp.eps));
	}
}

#define ROPE_U 4u          /* rope_store_kernel: elements a thread loads before it stores */
#define ROPE_THREADS 256u /* and a token's threads */

/* The RoPE pairs of n heads of x (hd wide; bias b, head norms w with the
 * heads' scales sc, as rope_store_kernel's) to put(h, d0, r): the pair at
 * elements d0, d0 + st of head h, rotated. A thread's pairs ROPE_U at a
 * time, all loaded (with their biases and head norms) before any is put:
 * Q is rewritten in place and the cache may alias K and V as far as the
 * compiler knows, so a load may not pass a store, and a loop of a pair at
 * a time paid an L2 latency each, 24 in a row a thread for the 3B at 128
 * threads (7 us a launch at batch 64 on the H100). */
template <class P>
static __device__ __forceinline__ void rope_heads(const float *x, uint32_t n, const float *b,
						  const float *w, const float *sc, uint32_t hd,
						  uint32_t st, bool neox, const float2 *cs, P put)
{
	uint32_t half = hd / 2;

	for (uint32_t p0 = threadIdx.x; p0 < n * half; p0 += blockDim.x * ROPE_U) {
		float a[ROPE_U], c[ROPE_U];
#pragma unroll
		for (uint32_t u = 0; u < ROPE_U; u++) {
			uint32_t p = p0 + u * blockDim.x, h = p / half, d0 = rope_i0(p % half, neox);
			uint32_t e0 = h * hd + d0;
			if (p < n * half) {
				a[u] = head_norm(bias_add(x[e0], b, e0), w, sc, h, d0);
				c[u] = head_norm(bias_add(x[e0 + st], b, e0 + st), w, sc, h, d0 + st);
			}
		}
#pragma unroll
		for (uint32_t u = 0; u < ROPE_U; u++) {
			uint32_t p = p0 + u * blockDim.x, i = p % half;
			if (p < n * half)
				put(p / half, rope_i0(i, neox), rope_rot(a[u], c[u], cs[i]));
		}
	}
}

__global__ void rope_store_kernel(float *q, const float *k, const float *v, gpud_cuda_meta m,
				  gpud_cuda_rope rp, gpud_cuda_kvshape kv)
{
	pdl_enter();
	__shared__ float2 cs[GPUD_CUDA_MAX_HEAD_DIM / 2];
	extern __shared__ float hscale[]; /* (nh + nkv) with norms */
	uint32_t t = blockIdx.x, pos = m.pos[t], hd = kv.head_dim, half = hd / 2;
	uint32_t nh = kv.n_heads, nkv = kv.n_kv_heads, kvd = nkv * hd, st = rope_step(hd, rp.neox);
	uint64_t base = kv_slot(m, kv, t);
	float *qt = q + (size_t)t * nh * hd;
	const float *kt = k + (size_t)t * kvd, *vt = v + (size_t)t * kvd;

	for (uint32_t i = threadIdx.x; i < half; i += blockDim.x)
		cs[i] = rope_cs(pos, rp.inv_freq[i]);
	if (rp.q_norm)
		head_scales(qt, kt, rp, nh, nkv, hd, hscale);
	__syncthreads();
	rope_heads(qt, nh, rp.bq, rp.q_norm, hscale, hd, st, rp.neox, cs,
		   [&](uint32_t h, uint32_t d0, float2 r) {
			   qt[h * hd + d0] = r.x;
			   qt[h * hd + d0 + st] = r.y;
		   });
	rope_heads(kt, nkv, rp.bk, rp.k_norm, hscale + nh, hd, st, rp.neox, cs,
		   [&](uint32_t h, uint32_t d0, float2 r) {
			   uint64_t d = base + (uint64_t)h * kv.head_elems + d0;
			   kv_put(kv, d, r.x);
			   kv_put(kv, d + st, r.y);
		   });
	/* V: as the pairs, loaded ROPE_U at a time */
	for (uint32_t e0 = threadIdx.x; e0 < kvd; e0 += blockDim.x * ROPE_U) {
		float a[ROPE_U];
#pragma unroll
		for (uint32_t u = 0; u < ROPE_U; u++) {
			uint32_t e = e0 + u * blockDim.x;
			if (e < kvd)
				a[u] = bias_add(vt[e], rp.bv, e);
		}
#pragma unroll
		for (uint32_t u = 0; u < ROPE_U; u++) {
			uint32_t e = e0 + u * blockDim.x, h = e / hd, d = e % hd;
			if (e < kvd)
				kv_put(kv, base + (uint64_t)(nkv + h) * kv.head_elems + d, a[u]);
		}
	}
}

cudaError_t gpud_k_rope_store(cudaStream_t s, float *q, const float *k, const float *v,
			      const gpud_cuda_meta *m, const gpud_cuda_rope *rope,
			      const gpud_cuda_kvshape *kv, uint32_t T)
{
	size_t smem = rope->q_norm ? (size_t)(kv->n_heads + kv->n_kv_heads) * sizeof(float) : 0;
	return launched(cudaLaunchKernelEx(klc(T, ROPE_THREADS, smem, s).cfg(), rope_store_kernel, q,
					   k, v, *m, *rope, *kv));
}

/* --- cp.async (sm_80 and up): global to shared, in flight until waited for --- */

/* N bytes from global src to shared dst, in flight until cp_wait; zeros
 * when !full (src is then not read, but must be a valid address). */
template <int N>
static __device__ __forceinline__ void cp_async(void *dst, const void *src, bool full)
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu::cp_async(dst, src, N, full);
#else
	unsigned d = (unsigned)__cvta_generic_to_shared(dst);
	if (N == 16)
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
			     "r"(full ? 16 : 0));
	else
		asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src),
			     "n"(N), "r"(full ? N : 0));
#endif
}

static __device__ __forceinline__ void cp_commit(void)
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu::cp_commit();
#else
	asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/* Until at most N of this thread's committed groups are in flight. */
template <int N> static __device__ __forceinline__ void cp_wait(void)
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu::cp_wait(N);
#else
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* --- attention ----------------------------------------------------------- */

struct dmask {
	const unsigned long long *vis;  /* (S+1) x 2 words */
	const unsigned long long *bsegs; /* (n_prompt_blocks) x 2 words */
	const uint8_t *seg;
	uint32_t n_prompt, n_seg, npb;
};

/* gpud_mask_block_vis: 0 skip, 1 all visible, 2 test per token. */
static __device__ int block_vis(const dmask &mk, uint32_t qs, uint32_t b)
{
	unsigned long long v0 = mk.vis[2 * qs], v1 = mk.vis[2 * qs + 1], b0 = 0, b1 = 0;

	if (b < mk.npb) {
		b0 = mk.bsegs[2 * b];
		b1 = mk.bsegs[2 * b + 1];
	} else if (mk.n_seg < 64) {
		b0 = 1ull << mk.n_seg;
	} else {
		b1 = 1ull << (mk.n_seg - 64);
	}
	if (!((v0 & b0) | (v1 & b1)))
		return 0;
	return ((b0 & ~v0) | (b1 & ~v1)) == 0 ? 1 : 2;
}

/* gpud_mask_visible */
static __device__ bool tok_visible(const dmask &mk, uint32_t qs, uint32_t kpos)
{
	uint32_t sg = kpos < mk.n_prompt ? mk.seg[kpos] : mk.n_seg;
	unsigned long long w = mk.vis[2 * qs + (sg >> 6)];

	return (w >> (sg & 63)) & 1;
}

/* Attention, flash style. A CTA serves n_t query tokens of one sequence
 * (a decode token, or a prefill tile), hg of the query heads that share
 * one KV head, a warp per (token, head), over split z of gridDim.z of the
 * keys, cut into chunks of 32 positions (one block's part, or 32 /
 * block_tokens whole blocks):
 *   - the chunk's K rows, then its V rows, are staged in shared memory
 *     once for all the CTA's warps (att_stage: cp.async, one latency a
 *     chunk), rows padded so that lanes reading different rows at one
 *     column hit different banks (head_dim is even), as the cache holds
 *     them (f16 KV stays half until read);
 *   - a chunk that no warp sees (the mask hides its blocks, or it is past
 *     the tokens) is skipped whole, the decision one barrier
 *     (__syncthreads_or); tokens are tested one by one only in mixed
 *     blocks;
 *   - online softmax per warp, as the CPU's (max, sum, rescaled outputs).
 * Only as many splits as the keys have chunks work (the grid's splits are
 * fixed when a graph is captured; a short context has fewer chunks): the
 * others return at once. With one, the CTA writes the output. With more
 * (decode: one token per CTA), each writes its partial (unnormalized o,
 * max, sum) to part,
 * and the CTA that arrives last at the (token, head group)'s counter
 * (atomicAdd after a fence; it resets the counter for the next step)
 * combines them. Grid: (tokens or tiles, KV heads x head groups, splits).
 * With aq (head_dim a multiple of 32, so that a head holds whole blocks and
 * block i of a head is o[i] over the lanes), the output is also quantized
 * into aq, ad as gpud_k_quantize_act would: the O matmul's int8 input, one
 * launch fewer. */
#define ATT_CHUNK GPUD_CUDA_ATT_CHUNK
/* Decode CTAs (one query token, split keys) hold at most this many heads,
 * so that their kernel, bounded at 256 threads, has the registers to keep
 * many loads in flight; prefill CTAs (tiles) take up to 1024 threads. */
#define ATT_DEC_HEADS 8u

/* Element lane + 32 i of the (token, head) whose output starts at base: v
 * into out, and with aq into its int8 block (whole warps: with aq,
 * head_dim is a multiple of 32, so d < hd holds for every lane or none). */
static __device__ __forceinline__ void att_out(float *out, int8_t *aq, float *ad, size_t base,
					       int i, uint32_t lane, uint32_t hd, float v)
{
	uint32_t d = lane + 32 * i;

	if (d >= hd)
		return;
	out[base + d] = v;
	if (aq) {
		float dv;
		aq[base + d] = quant_block(v, &dv);
		if (!lane)
			ad[(base + d) / GPUD_QK] = dv;
	}
}

/* A chunk's rows j < jn of K or V (from base, row[j] the offset of
 * position j's row: lane j's, shuffled) into shared memory ks (kst
 * elements of KT a row, as the cache holds them) by the CTA's nw warps:
 * cp.async copies of 4 bytes (a float, two halves), all of the thread's
 * issued before any lands, so that staging a chunk costs one memory
 * latency. (It was a round trip through registers, AK rows a warp at a
 * time: 12 latencies a chunk of K and V at head_dim 128, 3 warps a CTA;
 * on an H100 a batch-1 layer's attention took 11 us at a 32-token
 * context.) att_landed waits for them. */
template <typename KT>
static __device__ __forceinline__ void att_stage(KT *ks, const KT *base, uint64_t row,
						 uint32_t jn, uint32_t w, uint32_t nw,
						 uint32_t lane, uint32_t hd, uint32_t kst)
{
	constexpr uint32_t E = 4 / sizeof(KT); /* elements a copy; head_dim is even */

	for (uint32_t j = w; j < jn; j += nw) { /* warp-uniform */
		uint64_t src = __shfl_sync(FULL, row, j);
		for (uint32_t e = lane * E; e < hd; e += 32 * E)
			cp_async<4>(ks + j * kst + e, base + src + e, true);
	}
	cp_commit();
}

/* The CTA's staged rows landed and visible to all its threads. */
static __device__ __forceinline__ void att_landed(void)
{
	cp_wait<0>();
	__syncthreads();
}

/* Elements i, i + 1 (i even) of a staged row: float rows are kst = hd + 1
 * floats apart (one float of padding: lanes reading different rows at one
 * column hit different banks), so two loads; half rows hd + 2 halves (an
 * odd number of words), so one. */
template <typename KT> static __device__ __forceinline__ float2 att_two(const KT *p, uint32_t i);
template <> __device__ __forceinline__ float2 att_two<float>(const float *p, uint32_t i)
{
	return make_float2(p[i], p[i + 1]);
}
template <> __device__ __forceinline__ float2 att_two<__half>(const __half *p, uint32_t i)
{
	return kv_ld<__half>::two(p, i);
}

/* Decode CTAs: two a multiprocessor, 128 registers a thread (no instance
 * spills); prefill: no minimum (0), as without the second argument. */
template <int MAXD, typename KT, bool DEC>
__global__ void __launch_bounds__(DEC ? 32 * ATT_DEC_HEADS : 1024, DEC ? 2 : 0)
attention_kernel(const float *q, float *out, gpud_cuda_meta m, gpud_cuda_kvshape kv,
		 const uint8_t *masks, uint64_t slot_bytes, uint64_t max_prompt_blocks, uint32_t hg,
		 const uint32_t *tiles, float *part, unsigned *cnt, int8_t *aq, float *ad,
		 const uint8_t *next, uint64_t next_bytes, bool sepv)
{
	/* Loads in flight per lane: split partials folded at a time (ATT_V):
	 * as many as the registers allow without spilling, 64 a thread at 1024
	 * threads, more in decode CTAs (ptxas -v) */
	constexpr int ATT_V = DEC ? 32 / MAXD : (4 / MAXD > 0 ? 4 / MAXD : 1);

	pdl_enter();
	extern __shared__ float smem[];
	__shared__ bool last;
	uint32_t hd = kv.head_dim, bt = kv.block_tokens, nh = kv.n_heads, nkv = kv.n_kv_heads;
	uint32_t G = nh / nkv, groups = (G + hg - 1) / hg;
	uint32_t kh = blockIdx.y / groups, h0 = kh * G + (blockIdx.y % groups) * hg;
	uint32_t split = blockIdx.z, n_split = gridDim.z;
	uint32_t w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	uint32_t wt = w / hg, h = h0 + w % hg;
	uint32_t kst = sizeof(KT) == 4 ? hd + 1 : hd + 2; /* a staged row, in KT (att_two) */
	uint32_t t0 = blockIdx.x, n_t = 1;

	if (tiles) {
		t0 = tiles[blockIdx.x] & 0xffff;
		n_t = (tiles[blockIdx.x] >> 16) + 1;
	}
	/* a warp past the tile takes its last token, for uniform control */
	uint32_t t = t0 + (wt < n_t ? wt : n_t - 1);
	bool live = wt < n_t && h < kh * G + G; /* a (token, head) of this CTA */
	/* ATT_CHUNK rows of K (hd + 1 floats each at most), and with sepv as
	 * many of V after them (else V is staged where K was) */
	KT *ks = (KT *)smem, *vs = sepv ? (KT *)(smem + ATT_CHUNK * (hd + 1)) : ks;
	float *sq = smem + (sepv ? 2 : 1) * ATT_CHUNK * (hd + 1) + w * hd;
	uint32_t pos = m.pos[t], pos_max = m.pos[t0 + n_t - 1]; /* the tile's last */
	const uint32_t *si = m.seqinfo + (size_t)m.seq[t] * GPUD_CUDA_SEQ_WORDS;
	const uint32_t *btab = m.btab + si[GPUD_CUDA_SI_BTAB];
	uint32_t slot = si[GPUD_CUDA_SI_SLOT];
	bool has_mask = slot != GPUD_CUDA_NO_MASK;
	dmask mk = {};
	uint32_t qs = 0, n_chunks = pos_max / ATT_CHUNK + 1;
	/* the splits that get keys: no more than the chunks (a short context
	 * has fewer than the graph's splits; one split writes the output
	 * itself, without a partial and a combine) */
	uint32_t ns = DEC && n_chunks < n_split ? n_chunks : n_split; /* tiles: 1 */
	uint32_t c_lo = (uint32_t)((uint64_t)split * n_chunks / ns);
	uint32_t c_hi = (uint32_t)((uint64_t)(split + 1) * n_chunks / ns);
	const KT *kbase = (const KT *)kv.kv + (size_t)kv.layer * kv.layer_elems +
			  (size_t)kh * kv.head_elems;
	const KT *vbase = kbase + (uint64_t)nkv * kv.head_elems;
	float o[MAXD];
	float mx = -INFINITY, l = 0.0f, scale = kv.scale;

	if (DEC && split >= ns) { /* the whole CTA: no keys for this split */
		/* token 0's such CTAs stream the O matrix into L2 meanwhile, a
		 * share each: at batch 1 a short context keeps a CTA for each KV
		 * head busy (8 for the 3B model) while the memory would idle,
		 * and O's GEMV, the next kernel, then reads L2 */
		if (next && blockIdx.x == 0) {
			uint64_t parts = (uint64_t)(n_split - ns) * gridDim.y;
			uint64_t part = (uint64_t)(split - ns) * gridDim.y + blockIdx.y;
			uint64_t len = ((next_bytes + parts - 1) / parts + 127) / 128 * 128;
			uint64_t lo = part * len, hi = lo + len < next_bytes ? lo + len : next_bytes;

			if (lo < hi)
				prefetch_l2(next + lo, (int64_t)(hi - lo), threadIdx.x, blockDim.x);
		}
		return;
	}
	if (has_mask) {
		const uint8_t *base = masks + (size_t)slot * slot_bytes;
		mk.vis = (const unsigned long long *)base;
		mk.bsegs = (const unsigned long long *)(base + GPUD_CUDA_VIS_SETS * 16);
		mk.seg = base + GPUD_CUDA_VIS_SETS * 16 + max_prompt_blocks * 16;
		mk.n_prompt = si[GPUD_CUDA_SI_NPROMPT];
		mk.n_seg = si[GPUD_CUDA_SI_NSEG];
		mk.npb = si[GPUD_CUDA_SI_NPB];
		qs = pos < mk.n_prompt ? mk.seg[pos] : mk.n_seg;
	}
	if (live) {
		const float *qt = q + ((size_t)t * nh + h) * hd;
		for (uint32_t d = lane; d < hd; d += 32)
			sq[d] = qt[d];
	}
#pragma unroll
	for (int i = 0; i < MAXD; i++)
		o[i] = 0.0f;
	for (uint32_t c = c_lo; c < c_hi; c++) {
		uint32_t p = c * ATT_CHUNK + lane;
		int bv = !live || p > pos ? 0 : has_mask ? block_vis(mk, qs, p / bt) : 1;
		bool vis = bv == 1 || (bv == 2 && tok_visible(mk, qs, p));
		/* the row of position p in the layer's K of head kh */
		uint64_t row = p <= pos_max ? (uint64_t)btab[p / bt] * kv.block_elems +
						      (uint64_t)(p % bt) * hd : 0;

		/* a barrier too: the previous chunk's V is read */
		if (!__syncthreads_or(bv != 0))
			continue; /* no warp sees it */
		uint32_t jn = pos_max - c * ATT_CHUNK + 1;
		if (jn > ATT_CHUNK)
			jn = ATT_CHUNK;
		att_stage<KT>(ks, kbase, row, jn, w, nw, lane, hd, kst);
		if (sepv) { /* V on its way while the scores are made */
			att_stage<KT>(vs, vbase, row, jn, w, nw, lane, hd, kst);
			cp_wait<1>(); /* this thread's K */
			__syncthreads();
		} else {
			att_landed();
		}
		float sc = -INFINITY, pr = 0.0f;
		bool any = false; /* the warp sees a position of the chunk */
		if (live && vis) {
			const KT *kr = ks + lane * kst;
			float a0 = 0.0f, a1 = 0.0f; /* two chains: head_dim is even */
			for (uint32_t d = 0; d < hd; d += 2) {
				float2 k2 = att_two<KT>(kr, d);
				a0 = fmaf(sq[d], k2.x, a0);
				a1 = fmaf(sq[d + 1], k2.y, a1);
			}
			sc = (a0 + a1) * scale;
		}
		if (live) {
			float mb = warp_max(sc);
			if (mb != -INFINITY) {
				float mn = fmaxf(mx, mb);
				float corr = expf(mx - mn); /* 0 on the first visible chunk */
				pr = sc == -INFINITY ? 0.0f : expf(sc - mn);
				l = l * corr + warp_sum(pr);
				mx = mn;
#pragma unroll
				for (int i = 0; i < MAXD; i++)
					o[i] *= corr;
				any = true;
			}
		}
		/* V staged once for the CTA's warps (each used to load every row
		 * itself, 32 / ATT_V latencies a chunk): with sepv beside K, at
		 * the same time; else where K was, after a barrier that every
		 * warp has read K by. Folded in position order, each only where
		 * its weight is not 0 (pr is 0 past jn): the same sums either
		 * way */
		if (sepv) {
			att_landed();
		} else {
			if (!__syncthreads_or(any))
				continue;
			att_stage<KT>(vs, vbase, row, jn, w, nw, lane, hd, kst);
			att_landed();
		}
		if (!any)
			continue;
		for (uint32_t j = 0; j < jn; j++) {
			float pj = __shfl_sync(FULL, pr, j);
			const KT *vr = vs + j * kst;
#pragma unroll
			for (int i = 0; i < MAXD; i++) {
				uint32_t d = lane + 32 * i;
				if (pj != 0.0f && d < hd)
					o[i] = fmaf(pj, kv_ld<KT>::one(vr, d), o[i]);
			}
		}
	}
	if (ns == 1) {
		if (!live)
			return;
		/* l > 0: a token always sees itself. */
		float inv = 1.0f / l;
		size_t base = ((size_t)t * nh + h) * hd;
#pragma unroll
		for (int i = 0; i < MAXD; i++)
			att_out(out, aq, ad, base, i, lane, hd, o[i] * inv);
		return;
	}
	/* this split's partial */
	uint32_t pstride = hd + 2;
	if (live) {
		float *pp = part + (((size_t)t * nh + h) * n_split + split) * pstride;
#pragma unroll
		for (int i = 0; i < MAXD; i++) {
			uint32_t d = lane + 32 * i;
			if (d < hd)
				pp[d] = o[i];
		}
		if (!lane) {
			pp[hd] = mx;
			pp[hd + 1] = l;
		}
	}
	__threadfence();
	__syncthreads();
	if (!threadIdx.x) {
		unsigned *ct = cnt + (size_t)t * gridDim.y + blockIdx.y;
		last = atomicAdd(ct, 1u) == ns - 1;
		if (last)
			*ct = 0; /* every split has arrived: ready for the next step */
	}
	__syncthreads();
	if (!last || !live)
		return;
	__threadfence();
	/* the last CTA: out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M),
	 * read past L1 (volatile): the other CTAs wrote them */
	const volatile float *ph = part + ((size_t)t * nh + h) * n_split * pstride;
	float ms = lane < ns ? ph[lane * pstride + hd] : -INFINITY;
	float M = warp_max(ms);
	float ws = ms == -INFINITY ? 0.0f : expf(ms - M);
	float L = warp_sum(lane < ns ? ph[lane * pstride + hd + 1] * ws : 0.0f);
	float inv = 1.0f / L;
	size_t base = ((size_t)t * nh + h) * hd;
	/* every split wrote its partial (o 0 where it saw nothing): ATT_V
	 * splits' loads at a time, folded in split order where their weight
	 * is not 0 */
	float acc[MAXD];
#pragma unroll
	for (int i = 0; i < MAXD; i++)
		acc[i] = 0.0f;
	for (uint32_t s0 = 0; s0 < ns; s0 += ATT_V) {
		float pv[ATT_V][MAXD];
#pragma unroll
		for (int u = 0; u < ATT_V; u++) {
			uint32_t sp = s0 + u;
#pragma unroll
			for (int i = 0; i < MAXD; i++) {
				uint32_t d = lane + 32 * i;
				pv[u][i] = sp < ns && d < hd ? ph[sp * pstride + d] : 0.0f;
			}
		}
#pragma unroll
		for (int u = 0; u < ATT_V; u++) {
			uint32_t sp = s0 + u;
			float wsp = __shfl_sync(FULL, ws, sp < ns ? sp : 0);
#pragma unroll
			for (int i = 0; i < MAXD; i++)
				if (sp < ns && wsp != 0.0f)
					acc[i] = fmaf(wsp, pv[u][i], acc[i]);
		}
	}
#pragma unroll
	for (int i = 0; i < MAXD; i++)
		att_out(out, aq, ad, base, i, lane, hd, acc[i] * inv);
}

/* The dynamic shared memory of an attention CTA of hg heads and n_t
 * tokens: K and V of a chunk staged side by side where both fit the plan's
 * shared memory (head_dim 128: the 3B's, decode and prefill), so that a
 * chunk costs one memory latency, not two (sepv); else one after the other
 * in the same rows (head_dim 256). */
static size_t att_smem(uint32_t hd, uint32_t hg, uint32_t n_t, bool *sepv)
{
	size_t kvs = (size_t)ATT_CHUNK * (hd + 1) * 4, qs = (size_t)hg * n_t * hd * 4;

	*sepv = 2 * kvs + qs <= GPUD_CUDA_ATT_SMEM;
	return (*sepv ? 2 : 1) * kvs + qs;
}

/* The decode instance of attention_kernel for head_dim hd and the KV's
 * element type (every instance has the one signature). */
typedef decltype(&attention_kernel<1, float, true>) att_fn;
static att_fn att_dec_kernel(uint32_t hd, bool kv16)
{
	if (hd <= 32)
		return kv16 ? attention_kernel<1, __half, true> : attention_kernel<1, float, true>;
	if (hd <= 64)
		return kv16 ? attention_kernel<2, __half, true> : attention_kernel<2, float, true>;
	if (hd <= 128)
		return kv16 ? attention_kernel<4, __half, true> : attention_kernel<4, float, true>;
	return kv16 ? attention_kernel<8, __half, true> : attention_kernel<8, float, true>;
}

cudaError_t gpud_k_attention_occupancy(uint32_t head_dim, bool kv16, uint32_t heads,
				       uint32_t *per_sm)
{
	uint32_t hg = heads < ATT_DEC_HEADS ? (heads ? heads : 1) : ATT_DEC_HEADS;
	bool sepv;
	size_t shm = att_smem(head_dim, hg, 1, &sepv);
	int n = 0;
	cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		&n, att_dec_kernel(head_dim, kv16), (int)(32 * hg), shm);

	if (e == cudaSuccess)
		*per_sm = n > 0 ? (uint32_t)n : 1;
	return e;
}

cudaError_t gpud_k_attention(cudaStream_t s, const float *q, float *out,
			     const gpud_cuda_meta *m, const gpud_cuda_kvshape *kv,
			     const uint8_t *masks, uint64_t slot_bytes, uint64_t max_prompt_blocks,
			     const gpud_cuda_attn *a)
{
	uint32_t hd = kv->head_dim, G = kv->n_heads / kv->n_kv_heads, hg = a->heads;
	uint32_t n_t = a->tiles ? a->tile : 1, splits = a->tiles ? 1 : a->splits;

	if (!a->tiles && hg > ATT_DEC_HEADS)
		hg = ATT_DEC_HEADS; /* the decode kernel's bound */
	dim3 grid(a->tiles ? a->n_tiles : a->T, kv->n_kv_heads * ((G + hg - 1) / hg),
		  splits ? splits : 1);
	dim3 block(32 * hg * n_t);
	bool sepv;
	size_t shm = att_smem(hd, hg, n_t, &sepv);

	cudaError_t e;

	if (a->aq && (hd % GPUD_QK || !a->ad))
		return cudaErrorInvalidValue;

#define ATT_T(md, KT, DEC)                                                                     \
	cudaLaunchKernelEx(klc(grid, block, shm, s).cfg(), attention_kernel<md, KT, DEC>, q, out, \
			   *m, *kv, masks, slot_bytes, max_prompt_blocks, hg, a->tiles, a->part,  \
			   a->cnt, a->aq, a->ad, (const uint8_t *)a->next, a->next_bytes, sepv)
#define ATT_D(md, KT) (a->tiles ? ATT_T(md, KT, false) : ATT_T(md, KT, true))
#define ATT(md) (kv->kv16 ? ATT_D(md, __half) : ATT_D(md, float))
	if (hd <= 32)
		e = ATT(1);
	else if (hd <= 64)
		e = ATT(2);
	else if (hd <= 128)
		e = ATT(4);
	else
		e = ATT(8);
#undef ATT
#undef ATT_D
#undef ATT_T
	return launched(e);
}

/* --- elementwise ----------------------------------------------------------- */

__global__ void swiglu_kernel(float *hb, const float *hb2, uint64_t n)
{
	pdl_enter();
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		hb[i] = swiglu(hb[i], hb2[i]);
	}
}

static unsigned grid_for(uint64_t n, unsigned threads)
{
	uint64_t g = (n + threads - 1) / threads;
	return g > 65535u * 16 ? 65535u * 16 : (g ? (unsigned)g : 1u);
}

cudaError_t gpud_k_swiglu(cudaStream_t s, float *hb, const float *hb2, uint64_t n)
{
	return launched(cudaLaunchKernelEx(klc(grid_for(n, 256), 256, 0, s).cfg(), swiglu_kernel, hb,
					   hb2, n));
}

/* --- the arg max of each logits row ----------------------------------------
 * A CTA per (range of a row, row): the greatest gpud_cuda_argmax_key of its
 * range, reduced over its warps; the host picks among a row's
 * GPUD_CUDA_ARGMAX_PARTS keys. Keys order like gpud_argmax, so the result
 * is its pick whatever order the ranges are reduced in. */

#define ARGMAX_THREADS 256u

static __device__ __forceinline__ uint64_t warp_max_u64(uint64_t v)
{
	for (int o = 16; o; o >>= 1) {
		uint64_t w = __shfl_xor_sync(FULL, v, o);
		v = w > v ? w : v;
	}
	return v;
}

__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_kernel(const float *logits, uint32_t nv,
								uint64_t *keys)
{
	__shared__ uint64_t wbest[ARGMAX_THREADS / 32];
	uint32_t per = (nv + gridDim.x - 1) / gridDim.x;
	uint32_t lo = blockIdx.x * per, hi = lo + per < nv ? lo + per : nv;
	const float *l = logits + (uint64_t)blockIdx.y * nv;
	uint64_t best = 0;

	pdl_enter();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) {
		uint64_t k = gpud_cuda_argmax_key(l[i], i);
		best = k > best ? k : best;
	}
	best = warp_max_u64(best);
	if ((threadIdx.x & 31) == 0)
		wbest[threadIdx.x >> 5] = best;
	__syncthreads();
	if (threadIdx.x < 32) {
		best = threadIdx.x < ARGMAX_THREADS / 32 ? wbest[threadIdx.x] : 0;
		best = warp_max_u64(best);
		if (threadIdx.x == 0)
			keys[(uint64_t)blockIdx.y * gridDim.x + blockIdx.x] = best;
	}
}

cudaError_t gpud_k_argmax(cudaStream_t s, const float *logits, uint32_t rows, uint32_t nv,
			  uint64_t *keys)
{
	dim3 grid(GPUD_CUDA_ARGMAX_PARTS, rows);

	return launched(cudaLaunchKernelEx(klc(grid, ARGMAX_THREADS, 0, s).cfg(), argmax_kernel,
					   logits, nv, keys));
}

/* --- a draw from each logits row that asks for one ---------------------------
 * gpud/draw.h's definition on the device. Every selection is an MSD radix
 * select over 64-bit order keys, a byte a level, with integer histograms
 * (counts for top-k, masses for top-p and the pick) in shared memory. Sums
 * are of integers, so the order the threads add in does not matter: the
 * token is gpud_draw_row's.
 *
 * One CTA walking a 128,256-logit row was 1.6 ms of a batch-1 step on the
 * H200 (a flat row: every radix level scanned the row, computing masses).
 * So DRAW_PARTS CTAs share a row, a range each, and three launches make a
 * draw:
 *
 *   draw_part_kernel  a range's penalties, in place; then, for a draw with
 *       a top-k of at most DRAW_K_MAX, its k + 1 greatest keys (all that
 *       such a draw reads, below); for any other, the range's greatest and
 *       least usable keys;
 *   draw_hist_kernel  (a temperature, no such top-k) the range's usable
 *       tokens into the row's histogram of DRAW_NB buckets: counts, masses,
 *       and the masses of at least the min-p threshold;
 *   draw_kernel  a CTA a row: the draw, from the candidates, or from the
 *       histogram and then only the tokens of the buckets its cuts fall in.
 *
 * Candidates. A top-k draw reads only the row's k + 1 greatest keys: the
 * top-k cut, the max, and whether more than k tokens are usable and live
 * (the live tokens lead the order, so more than k are live iff the
 * (k + 1)-th greatest is). The union of the ranges' k + 1 greatest holds
 * the row's.
 *
 * Buckets. Only the live tokens can weigh anything (gpud_draw_live: the
 * max, and x = (l - max) / T >= GPUD_DRAW_X_MIN), and they are a prefix of
 * the order. A live token's bucket is floor(-x * scale), the scale
 * spreading the row's range of x (to its least usable logit, or X_MIN) over
 * DRAW_DEAD buckets; the other usable tokens go to the last, DRAW_DEAD.
 * Each step is a monotone IEEE operation, so a greater key never has a
 * greater bucket: the buckets cut the order into consecutive runs, and a
 * selection is the bucket whose prefix sums hold its target, then a rank
 * within that bucket. Every kernel derives the bucketing from the same
 * values (the row's max, its least usable logit, T), so all agree. When
 * the live tokens fit shared memory (DRAW_SH_CAP) one scan copies them
 * there and every selection runs there; otherwise each selection (top-k,
 * top-p, the pick) copies its bucket's tokens, and only a bucket too big
 * for shared memory (thousands of tokens of nearly one logit) is ranked
 * from the row, a scan a radix level.
 *
 * The result replaces the row's arg max keys (the drawn id as the one
 * nonzero key, none for a row with nothing usable), so the host's pick and
 * the download stay as they are. A greedy row with penalties (T <= 0) is
 * the penalized arg max: the greatest of its ranges' greatest keys. */

#define DRAW_THREADS 512u
#define DRAW_SH_CAP 2048u
#define DRAW_PARTS 32u
#define DRAW_K_MAX (DRAW_SH_CAP / DRAW_PARTS - 1)
#define DRAW_NB 2048u
#define DRAW_DEAD (DRAW_NB - 1)
#define DRAW_NB_THREAD (DRAW_NB / DRAW_THREADS)
/* A row's scratch (GPUD_CUDA_DRAW_SCRATCH 64-bit words): a top-k draw's
 * candidates, DRAW_K_MAX + 1 keys a range; any other's ranges' greatest and
 * least usable keys, then the histogram: counts (32-bit), masses, and
 * masses of at least the min-p threshold. */
#define DRAW_W_COUNT (2 * DRAW_PARTS)
#define DRAW_W_MASS (DRAW_W_COUNT + DRAW_NB / 2)
#define DRAW_W_MASST (DRAW_W_MASS + DRAW_NB)
#define DRAW_W_END (DRAW_W_MASST + DRAW_NB)

struct draw_smem {
	unsigned long long w[256]; // a level's weights by byte
	unsigned n[256];           // and counts
	unsigned long long red[DRAW_THREADS / 32];
	unsigned long long key, base;
	unsigned d, nd, cnt;
	unsigned long long ck[DRAW_SH_CAP], cm[DRAW_SH_CAP]; // tokens' keys, masses
};

// How a row's logits weigh and fall into buckets: its max, 1 / T, and the
// scale from -x to a bucket.
struct draw_geom {
	float mx, inv_t, scale;
	bool inf; // the max is +inf: +inf logits weigh GPUD_DRAW_ONE, the rest 0

	__device__ bool live(float l) const
	{
		return inf ? l == INFINITY : gpud_draw_live(l, mx, inv_t);
	}
	__device__ uint64_t mass(float l) const
	{
		return inf ? (l == INFINITY ? GPUD_DRAW_ONE : 0) : gpud_draw_mass(l, mx, inv_t);
	}
	// The bucket of usable logit l: DRAW_DEAD exactly when !live(l).
	__device__ uint32_t bucket(float l) const
	{
		float d = GPUD_DRAW_SUB(l, mx), x, y;

		if (inf)
			return l == INFINITY ? 0 : DRAW_DEAD;
		if (d == 0.0f)
			return 0;
		x = GPUD_DRAW_MUL(d, inv_t);
		if (!(x >= GPUD_DRAW_X_MIN))
			return DRAW_DEAD;
		y = GPUD_DRAW_MUL(-x, scale);
		return y < (float)(DRAW_DEAD - 1) ? (uint32_t)y : DRAW_DEAD - 1;
	}
};

// The geometry of a row whose max is mx and least usable logit lo, at T.
static __device__ draw_geom draw_geom_of(float mx, float lo, float temp)
{
	draw_geom g;
	float x;

	g.mx = mx;
	g.inf = mx == INFINITY;
	g.inv_t = gpud_draw_inv_t(temp);
	x = GPUD_DRAW_SUB(lo, mx);
	x = x == 0.0f ? 0.0f : GPUD_DRAW_MUL(x, g.inv_t);
	x = x >= GPUD_DRAW_X_MIN ? x : GPUD_DRAW_X_MIN; // NaN (an +inf max) too
	g.scale = x < 0.0f ? GPUD_DRAW_DIV((float)(DRAW_DEAD - 1), -x) : 1.0f;
	g.scale = g.scale < 1e30f ? g.scale : 1e30f; // finite: -x * scale is never NaN
	return g;
}

// The token whose key is k: its logit.
static __device__ __forceinline__ float draw_logit(const float *l, uint64_t k)
{
	return l[0xffffffffu - (uint32_t)k];
}

// A set of tokens in shared memory (any order).
struct draw_sh_src {
	const unsigned long long *k, *m;
	uint32_t n;

	__device__ uint32_t size() const { return n; }
	__device__ uint64_t key(uint32_t i) const { return k[i]; }
	__device__ uint64_t mass(uint32_t i) const { return m[i]; }
};

// The tokens of one bucket, read from the row.
struct draw_bucket_src {
	const float *l;
	uint32_t nv, b;
	draw_geom g;

	__device__ uint32_t size() const { return nv; }
	__device__ uint64_t key(uint32_t i) const
	{
		float v = l[i];
		return v > -INFINITY && g.bucket(v) == b ? gpud_draw_key(v, i) : 0;
	}
	__device__ uint64_t mass(uint32_t i) const { return g.mass(l[i]); }
};

// Keys of the range lo .. lo + n of a row (unweighted selections only).
struct draw_range_src {
	const float *l;
	uint32_t lo, n;

	__device__ uint32_t size() const { return n; }
	__device__ uint64_t key(uint32_t i) const { return gpud_draw_key(l[lo + i], lo + i); }
	__device__ uint64_t mass(uint32_t) const { return 1; }
};

static __device__ unsigned long long block_sum_u64(unsigned long long v, draw_smem *sh)
{
	for (int o = 16; o; o >>= 1)
		v += __shfl_xor_sync(FULL, v, o);
	__syncthreads(); // red[] may still be read from the last call
	if ((threadIdx.x & 31) == 0)
		sh->red[threadIdx.x >> 5] = v;
	__syncthreads();
	v = 0;
	for (unsigned i = 0; i < DRAW_THREADS / 32; i++)
		v += sh->red[i];
	return v;
}

static __device__ unsigned long long block_max_u64(unsigned long long v, draw_smem *sh)
{
	v = warp_max_u64(v);
	__syncthreads(); // red[] may still be read from the last call
	if ((threadIdx.x & 31) == 0)
		sh->red[threadIdx.x >> 5] = v;
	__syncthreads();
	v = 0;
	for (unsigned i = 0; i < DRAW_THREADS / 32; i++)
		v = sh->red[i] > v ? sh->red[i] : v;
	return v;
}

// The sum of v over the threads before this one.
static __device__ unsigned long long block_excl_sum_u64(unsigned long long v, draw_smem *sh)
{
	unsigned lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	unsigned long long x = v, t;

	for (unsigned o = 1; o < 32; o <<= 1) {
		t = __shfl_up_sync(FULL, x, o);
		x += lane >= o ? t : 0;
	}
	__syncthreads(); // red[] may still be read from the last call
	if (lane == 31)
		sh->red[wid] = x;
	__syncthreads();
	t = 0;
	for (unsigned i = 0; i < wid; i++)
		t += sh->red[i];
	return t + x - v;
}

// Sum of the masses of the tokens with key >= cut and mass >= thr.
template <class S>
static __device__ uint64_t draw_total(const S &src, uint64_t cut, uint64_t thr, draw_smem *sh)
{
	unsigned long long s = 0;

	for (uint32_t i = threadIdx.x; i < src.size(); i += DRAW_THREADS) {
		uint64_t k = src.key(i), m;

		if (k && k >= cut && (m = src.mass(i)) >= thr)
			s += m;
	}
	return block_sum_u64(s, sh);
}

// The key of the token at rank target (in mass when weighted, else one a
// token) among the usable tokens with key >= cut (and, weighted, mass >=
// thr), greatest key first: sampler.c's rank_key over the same set.
template <class S>
static __device__ uint64_t draw_select(const S &src, uint64_t cut, uint64_t thr, bool weighted,
				       uint64_t target, draw_smem *sh)
{
	uint64_t prefix = 0, base = 0;

	for (int s = 56; s >= 0; s -= 8) {
		uint64_t hmask = s == 56 ? 0 : ~0ull << (s + 8);
		unsigned run_d = 256, run_n = 0;
		unsigned long long run_w = 0;

		for (unsigned i = threadIdx.x; i < 256; i += DRAW_THREADS) {
			sh->w[i] = 0;
			sh->n[i] = 0;
		}
		__syncthreads();
		// Threads keep a run of equal bytes and add it when the byte
		// changes: a row's keys share their high bytes, and one atomic a
		// token on one address would serialize the block.
		for (uint32_t i = threadIdx.x; i < src.size(); i += DRAW_THREADS) {
			uint64_t k = src.key(i), w = 1;
			unsigned d;

			if (!k || k < cut || (k & hmask) != prefix)
				continue;
			if (weighted && (w = src.mass(i)) < thr)
				continue;
			d = (unsigned)(k >> s) & 255;
			if (d != run_d) {
				if (run_n) {
					atomicAdd(&sh->w[run_d], run_w);
					atomicAdd(&sh->n[run_d], run_n);
				}
				run_d = d;
				run_w = 0;
				run_n = 0;
			}
			run_w += w;
			run_n++;
		}
		if (run_n) {
			atomicAdd(&sh->w[run_d], run_w);
			atomicAdd(&sh->n[run_d], run_n);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			unsigned d = 255;

			while (d > 0 && base + sh->w[d] <= target) {
				base += sh->w[d];
				d--;
			}
			sh->d = d;
			sh->nd = sh->n[d];
			sh->base = base;
			sh->key = 0;
		}
		__syncthreads();
		prefix |= (uint64_t)sh->d << s;
		base = sh->base;
		if (sh->nd == 1 && s) {
			// One token left: its key, from one more scan.
			hmask = ~0ull << s;
			for (uint32_t i = threadIdx.x; i < src.size(); i += DRAW_THREADS) {
				uint64_t k = src.key(i);

				if (k && k >= cut && (k & hmask) == prefix &&
				    (!weighted || src.mass(i) >= thr))
					atomicMax(&sh->key, (unsigned long long)k);
			}
			__syncthreads();
			prefix = sh->key;
			__syncthreads();
			return prefix;
		}
		__syncthreads();
	}
	return prefix;
}

// The min-p threshold: mass >= min_p * 2^40 as the host compares it, in
// doubles; 1 (every token that weighs) without one.
static __device__ uint64_t draw_thr(float min_p)
{
	double th = (double)min_p * (double)GPUD_DRAW_ONE;

	return !(min_p > 0.0f) || th <= 1.0 ? 1 : (uint64_t)ceil(th);
}

// The drawn token's key from src, nu usable and nl live tokens.
template <class S>
static __device__ uint64_t draw_pick(const S &src, uint64_t nu, uint64_t nl, int32_t top_k,
				     float top_p, float min_p, uint64_t rnd, draw_smem *sh)
{
	uint64_t cut = 0, thr, sum;

	if (top_k > 0 && (uint64_t)top_k < nu && (uint64_t)top_k < nl)
		cut = draw_select(src, 0, 0, false, (uint64_t)top_k - 1, sh);
	sum = draw_total(src, cut, 1, sh);
	if (top_p < 1.0f) {
		double t = ceil((double)top_p * (double)sum);
		uint64_t tu = t < 1.0 ? 1 : t >= (double)sum ? sum : (uint64_t)t;

		cut = draw_select(src, cut, 1, true, tu - 1, sh);
	}
	thr = draw_thr(min_p);
	sum = draw_total(src, cut, thr, sh);
	return draw_select(src, cut, thr, true, __umul64hi(rnd, sum), sh);
}

// Copies the tokens of bucket b (every live one when b is DRAW_NB) into
// shared memory; the caller knows they fit.
static __device__ draw_sh_src draw_gather(const float *l, uint32_t nv, const draw_geom &g,
					  uint32_t b, draw_smem *sh)
{
	if (threadIdx.x == 0)
		sh->cnt = 0;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < nv; i += DRAW_THREADS) {
		float v = l[i];
		uint32_t vb;

		if (!(v > -INFINITY)) // not usable
			continue;
		vb = g.bucket(v);
		if (b == DRAW_NB ? vb != DRAW_DEAD : vb == b) {
			unsigned j = atomicAdd(&sh->cnt, 1u);

			if (j < DRAW_SH_CAP) {
				sh->ck[j] = gpud_draw_key(v, i);
				sh->cm[j] = g.mass(v);
			}
		}
	}
	__syncthreads();
	return draw_sh_src{ sh->ck, sh->cm, sh->cnt < DRAW_SH_CAP ? sh->cnt : DRAW_SH_CAP };
}

// A bucket's weight in a selection: h[b] before the cut's bucket full, the
// part of that one at or above the cut, nothing after.
template <class T>
static __device__ __forceinline__ unsigned long long draw_hw(const T *h, uint32_t b, uint32_t full,
							     uint64_t part)
{
	return b < full ? (unsigned long long)h[b] : b == full ? part : 0;
}

// The total weight of a selection's buckets (draw_hw).
template <class T>
static __device__ uint64_t draw_hsum(const T *h, uint32_t full, uint64_t part, draw_smem *sh)
{
	unsigned long long s = 0;

	for (uint32_t j = 0; j < DRAW_NB_THREAD; j++)
		s += draw_hw(h, threadIdx.x * DRAW_NB_THREAD + j, full, part);
	return block_sum_u64(s, sh);
}

// The bucket that holds rank target of a selection's buckets (draw_hw), and
// in *base the rank its first token has.
template <class T>
static __device__ uint32_t draw_find(const T *h, uint32_t full, uint64_t part, uint64_t target,
				     uint64_t *base, draw_smem *sh)
{
	unsigned long long w[DRAW_NB_THREAD], s = 0, x;
	uint32_t b0 = threadIdx.x * DRAW_NB_THREAD, b;

	for (uint32_t j = 0; j < DRAW_NB_THREAD; j++)
		s += w[j] = draw_hw(h, b0 + j, full, part);
	if (threadIdx.x == 0) { // target past the total: none (never, by the callers)
		sh->d = DRAW_DEAD;
		sh->base = 0;
	}
	x = block_excl_sum_u64(s, sh); // syncs after the writes above
	if (x <= target && target - x < s)
		for (uint32_t j = 0; j < DRAW_NB_THREAD; x += w[j++])
			if (target - x < w[j]) {
				sh->d = b0 + j;
				sh->base = x;
				break;
			}
	__syncthreads();
	b = sh->d;
	*base = sh->base;
	__syncthreads();
	return b;
}

// Rankings within one bucket of a row: from shared memory when the bucket
// fits (copied once, kept while the next selection falls in it too), else
// from the row.
struct draw_bucket_rank {
	const float *l;
	uint32_t nv;
	draw_geom g;
	const uint32_t *cnt; // the histogram's counts
	draw_smem *sh;
	uint32_t have; // the bucket in sh->ck, cm; DRAW_NB: none

	__device__ uint64_t select(uint32_t b, uint64_t cut, uint64_t thr, bool weighted,
				   uint64_t target)
	{
		if (cnt[b] > DRAW_SH_CAP)
			return draw_select(draw_bucket_src{ l, nv, b, g }, cut, thr, weighted, target,
					   sh);
		return draw_select(gather(b), cut, thr, weighted, target, sh);
	}
	__device__ uint64_t total(uint32_t b, uint64_t cut, uint64_t thr)
	{
		if (cnt[b] > DRAW_SH_CAP)
			return draw_total(draw_bucket_src{ l, nv, b, g }, cut, thr, sh);
		return draw_total(gather(b), cut, thr, sh);
	}
	__device__ draw_sh_src gather(uint32_t b)
	{
		if (have != b) {
			have = b;
			return draw_gather(l, nv, g, b, sh);
		}
		return draw_sh_src{ sh->ck, sh->cm, sh->cnt < DRAW_SH_CAP ? sh->cnt : DRAW_SH_CAP };
	}
};

// draw_pick over a row's histogram (w: its scratch) and then only the
// buckets the cuts and the pick fall in.
static __device__ uint64_t draw_pick_hist(draw_bucket_rank &r, const uint64_t *w, uint64_t nu,
					  uint64_t nl, int32_t top_k, float top_p, float min_p,
					  uint64_t rnd)
{
	const uint32_t *n = (const uint32_t *)(w + DRAW_W_COUNT);
	const uint64_t *m = w + DRAW_W_MASS, *h;
	uint64_t cut = 0, thr, base, part = 0, sum, target;
	uint32_t bc = DRAW_NB, b; // the bucket of the cut (DRAW_NB: no cut yet)

	if (top_k > 0 && (uint64_t)top_k < nu && (uint64_t)top_k < nl) {
		target = (uint64_t)top_k - 1;
		bc = draw_find(n, DRAW_NB, 0, target, &base, r.sh);
		cut = r.select(bc, 0, 0, false, target - base);
		part = r.total(bc, cut, 1);
	}
	sum = draw_hsum(m, bc, part, r.sh);
	if (top_p < 1.0f) {
		double t = ceil((double)top_p * (double)sum);
		uint64_t tu = t < 1.0 ? 1 : t >= (double)sum ? sum : (uint64_t)t;

		bc = draw_find(m, bc, part, tu - 1, &base, r.sh);
		cut = r.select(bc, cut, 1, true, tu - 1 - base);
	}
	thr = draw_thr(min_p);
	h = thr > 1 ? w + DRAW_W_MASST : m;
	part = bc < DRAW_NB ? r.total(bc, cut, thr) : 0;
	sum = draw_hsum(h, bc, part, r.sh);
	target = __umul64hi(rnd, sum);
	b = draw_find(h, bc, part, target, &base, r.sh);
	return r.select(b, cut, thr, true, target - base);
}

// Whether the row with draw words dw draws from candidates (the same test
// in every kernel).
static __device__ bool draw_by_cand(const uint32_t *dw)
{
	int32_t k = (int32_t)dw[GPUD_CUDA_DW_TOPK];

	return __uint_as_float(dw[GPUD_CUDA_DW_TEMP]) > 0.0f && k > 0 && k <= (int32_t)DRAW_K_MAX;
}

// The draw's penalties of the row's tokens in lo .. hi, in place.
static __device__ void draw_penalize(float *l, const uint32_t *dw, uint32_t lo, uint32_t hi)
{
	if (threadIdx.x < dw[GPUD_CUDA_DW_NPEN] && threadIdx.x < GPUD_DRAW_MAX_PEN) {
		uint32_t id = dw[GPUD_CUDA_DW_PEN_ID + threadIdx.x];

		if (id >= lo && id < hi)
			l[id] = gpud_draw_penalize(l[id], dw[GPUD_CUDA_DW_PEN_N + threadIdx.x],
						   __uint_as_float(dw[GPUD_CUDA_DW_REPEAT]),
						   __uint_as_float(dw[GPUD_CUDA_DW_FREQ]),
						   __uint_as_float(dw[GPUD_CUDA_DW_PRES]));
	}
}

// The k1 greatest keys of src (all its usable ones when it has fewer) into
// out, zeros after them.
static __device__ void draw_range_cand(const draw_range_src &src, uint32_t k1, uint64_t *out,
				       draw_smem *sh)
{
	unsigned long long nu = 0;
	uint64_t thr = 1;

	for (uint32_t i = threadIdx.x; i < src.size(); i += DRAW_THREADS)
		nu += src.key(i) != 0;
	nu = block_sum_u64(nu, sh);
	if (nu > k1) /* the (k + 1)-th greatest key of the range */
		thr = draw_select(src, 0, 0, false, k1 - 1, sh);
	if (threadIdx.x == 0)
		sh->cnt = 0;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < src.size(); i += DRAW_THREADS) {
		uint64_t k = src.key(i);

		if (k && k >= thr)
			out[atomicAdd(&sh->cnt, 1u)] = k; /* keys are distinct: k1 at most */
	}
	__syncthreads();
	for (uint32_t j = sh->cnt + threadIdx.x; j < k1; j += DRAW_THREADS)
		out[j] = 0;
}

// Where range part of a row of nv tokens begins (DRAW_PARTS ranges).
static __device__ __forceinline__ uint32_t draw_part_lo(uint32_t nv, uint32_t part)
{
	return (uint32_t)((uint64_t)nv * part / DRAW_PARTS);
}

// A CTA per (range, row) of each row that draws: penalties, then the
// range's candidates or its greatest and least usable keys (and its share
// of the histogram zeroed).
__global__ void __launch_bounds__(DRAW_THREADS) draw_part_kernel(float *logits, uint32_t nv,
								  const uint32_t *ndraw,
								  const uint32_t *words,
								  uint64_t *scratch)
{
	__shared__ draw_smem sh;
	uint32_t row = blockIdx.y, part = blockIdx.x;
	const uint32_t *dw = words + (uint64_t)row * GPUD_CUDA_DRAW_WORDS;
	uint64_t *w = scratch + (uint64_t)row * GPUD_CUDA_DRAW_SCRATCH;
	uint32_t lo = draw_part_lo(nv, part), hi = draw_part_lo(nv, part + 1);
	draw_range_src src = { logits + (uint64_t)row * nv, lo, hi - lo };
	unsigned long long most = 0, least = 0; // least as the greatest ~key

	pdl_enter();
	if (!*ndraw || !dw[GPUD_CUDA_DW_ON]) // no row of the step draws: its words are stale
		return;
	draw_penalize(logits + (uint64_t)row * nv, dw, lo, hi);
	__syncthreads();
	if (draw_by_cand(dw)) {
		draw_range_cand(src, dw[GPUD_CUDA_DW_TOPK] + 1, w + part * (DRAW_K_MAX + 1), &sh);
		return;
	}
	for (uint32_t i = threadIdx.x; i < src.size(); i += DRAW_THREADS) {
		uint64_t k = src.key(i);

		if (k) {
			most = k > most ? k : most;
			least = ~k > least ? ~k : least;
		}
	}
	most = block_max_u64(most, &sh);
	least = block_max_u64(least, &sh);
	if (threadIdx.x == 0) {
		w[part] = most;
		w[DRAW_PARTS + part] = most ? ~least : 0;
	}
	if (__uint_as_float(dw[GPUD_CUDA_DW_TEMP]) > 0.0f) {
		const uint32_t per = (DRAW_W_END - DRAW_W_COUNT) / DRAW_PARTS;

		for (uint32_t j = threadIdx.x; j < per; j += DRAW_THREADS)
			w[DRAW_W_COUNT + part * per + j] = 0;
	}
}

// A row's greatest usable key and its least (0, 0: nothing usable), from
// its ranges' (draw_part_kernel); its geometry at T from them.
static __device__ bool draw_row_geom(const float *l, const uint64_t *w, float temp,
				     uint64_t *best, draw_geom *g)
{
	uint64_t most = 0, least = ~0ull;

	for (uint32_t p = 0; p < DRAW_PARTS; p++) {
		uint64_t a = w[p], b = w[DRAW_PARTS + p];

		most = a > most ? a : most;
		least = b && b < least ? b : least;
	}
	*best = most;
	if (!most)
		return false;
	*g = draw_geom_of(draw_logit(l, most), draw_logit(l, least), temp);
	return true;
}

struct draw_hist_smem {
	unsigned n[DRAW_NB];
	unsigned long long m[DRAW_NB], mt[DRAW_NB];
};

// A CTA per (range, row) of each row that draws with a temperature and no
// candidates: the range's usable tokens into the row's histogram.
__global__ void __launch_bounds__(DRAW_THREADS) draw_hist_kernel(const float *logits, uint32_t nv,
								  const uint32_t *ndraw,
								  const uint32_t *words,
								  uint64_t *scratch)
{
	__shared__ draw_hist_smem sh;
	uint32_t row = blockIdx.y, part = blockIdx.x;
	const uint32_t *dw = words + (uint64_t)row * GPUD_CUDA_DRAW_WORDS;
	uint64_t *w = scratch + (uint64_t)row * GPUD_CUDA_DRAW_SCRATCH, best, thr;
	const float *l = logits + (uint64_t)row * nv;
	uint32_t lo = draw_part_lo(nv, part), hi = draw_part_lo(nv, part + 1);
	float temp = __uint_as_float(dw[GPUD_CUDA_DW_TEMP]);
	draw_geom g;

	pdl_enter();
	if (!*ndraw || !dw[GPUD_CUDA_DW_ON] || !(temp > 0.0f) || draw_by_cand(dw) ||
	    !draw_row_geom(l, w, temp, &best, &g))
		return;
	thr = draw_thr(__uint_as_float(dw[GPUD_CUDA_DW_MINP]));
	for (uint32_t b = threadIdx.x; b < DRAW_NB; b += DRAW_THREADS) {
		sh.n[b] = 0;
		sh.m[b] = 0;
		sh.mt[b] = 0;
	}
	__syncthreads();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += DRAW_THREADS) {
		float v = l[i];
		uint32_t b;
		uint64_t m;

		if (!(v > -INFINITY)) // not usable
			continue;
		b = g.bucket(v);
		atomicAdd(&sh.n[b], 1u);
		if (b != DRAW_DEAD && (m = g.mass(v))) {
			atomicAdd(&sh.m[b], (unsigned long long)m);
			if (thr > 1 && m >= thr)
				atomicAdd(&sh.mt[b], (unsigned long long)m);
		}
	}
	__syncthreads();
	for (uint32_t b = threadIdx.x; b < DRAW_NB; b += DRAW_THREADS) {
		if (sh.n[b])
			atomicAdd((unsigned *)(w + DRAW_W_COUNT) + b, sh.n[b]);
		if (sh.m[b])
			atomicAdd((unsigned long long *)(w + DRAW_W_MASS) + b, sh.m[b]);
		if (sh.mt[b])
			atomicAdd((unsigned long long *)(w + DRAW_W_MASST) + b, sh.mt[b]);
	}
}

// The draw of a row from its candidates (draw_part_kernel: k1 slots of
// each of DRAW_PARTS ranges): the max, the usable and live counts and the
// masses among them, then draw_pick in shared memory.
static __device__ uint64_t draw_from_cand(const float *l, const uint64_t *c, uint32_t k1,
					  float temp, int32_t top_k, float top_p, float min_p,
					  uint64_t rnd, draw_smem *sh)
{
	unsigned long long best = 0, nl = 0;
	draw_sh_src src = { sh->ck, sh->cm, 0 };
	draw_geom g;

	if (threadIdx.x == 0)
		sh->cnt = 0;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < DRAW_PARTS * k1; i += DRAW_THREADS) {
		uint64_t k = c[(i / k1) * (DRAW_K_MAX + 1) + i % k1];

		if (k) {
			sh->ck[atomicAdd(&sh->cnt, 1u)] = k;
			best = k > best ? k : best;
		}
	}
	best = block_max_u64(best, sh);
	src.n = sh->cnt;
	if (!best) // nothing usable
		return 0;
	g = draw_geom_of(draw_logit(l, best), draw_logit(l, best), temp); // no buckets
	for (uint32_t j = threadIdx.x; j < src.n; j += DRAW_THREADS) {
		float v = draw_logit(l, sh->ck[j]);
		bool live = g.live(v);

		sh->cm[j] = live ? g.mass(v) : 0;
		nl += live;
	}
	__syncthreads(); /* block_sum_u64 syncs too, after its shuffles */
	nl = block_sum_u64(nl, sh);
	return draw_pick(src, src.n, nl, top_k, top_p, min_p, rnd, sh);
}

// The draw of a row whose ranges' ends (and, with a temperature, its
// histogram) are in w.
static __device__ uint64_t draw_from_hist(const float *l, uint32_t nv, const uint64_t *w,
					  float temp, int32_t top_k, float top_p, float min_p,
					  uint64_t rnd, draw_smem *sh, bool *greedy)
{
	const uint32_t *n = (const uint32_t *)(w + DRAW_W_COUNT);
	unsigned long long nl = 0;
	uint64_t best, nu;
	draw_geom g = {};

	*greedy = !(temp > 0.0f);
	if (!draw_row_geom(l, w, temp, &best, &g) || *greedy)
		return best; // nothing usable, or the penalized arg max
	for (uint32_t j = 0; j < DRAW_NB_THREAD; j++) {
		uint32_t b = threadIdx.x * DRAW_NB_THREAD + j;
		nl += b != DRAW_DEAD ? n[b] : 0;
	}
	nl = block_sum_u64(nl, sh);
	nu = nl + n[DRAW_DEAD];
	if (nl <= DRAW_SH_CAP)
		return draw_pick(draw_gather(l, nv, g, DRAW_NB, sh), nu, nl, top_k, top_p, min_p,
				 rnd, sh);
	draw_bucket_rank r = { l, nv, g, n, sh, DRAW_NB };
	return draw_pick_hist(r, w, nu, nl, top_k, top_p, min_p, rnd);
}

// (one CTA a row: registers matter more than CTAs a multiprocessor)
__global__ void __launch_bounds__(DRAW_THREADS, 1) draw_kernel(const float *logits, uint32_t nv,
								const uint32_t *ndraw,
								const uint32_t *words, uint64_t *keys,
								const uint64_t *scratch)
{
	__shared__ draw_smem sh;
	const uint32_t *dw = words + (uint64_t)blockIdx.x * GPUD_CUDA_DRAW_WORDS;
	const uint64_t *w = scratch + (uint64_t)blockIdx.x * GPUD_CUDA_DRAW_SCRATCH;
	const float *l = logits + (uint64_t)blockIdx.x * nv;
	uint64_t *out = keys + (uint64_t)blockIdx.x * GPUD_CUDA_ARGMAX_PARTS;
	float temp, top_p, min_p;
	int32_t top_k;
	uint64_t rnd, id_key;
	bool greedy = false;

	pdl_enter();
	if (!*ndraw || !dw[GPUD_CUDA_DW_ON]) // no row of the step draws: its words are stale
		return;
	temp = __uint_as_float(dw[GPUD_CUDA_DW_TEMP]);
	top_k = (int32_t)dw[GPUD_CUDA_DW_TOPK];
	top_p = __uint_as_float(dw[GPUD_CUDA_DW_TOPP]);
	min_p = __uint_as_float(dw[GPUD_CUDA_DW_MINP]);
	rnd = (uint64_t)dw[GPUD_CUDA_DW_RAND_HI] << 32 | dw[GPUD_CUDA_DW_RAND_LO];
	if (draw_by_cand(dw))
		id_key = draw_from_cand(l, w, (uint32_t)top_k + 1, temp, top_k, top_p, min_p, rnd,
					&sh);
	else
		id_key = draw_from_hist(l, nv, w, temp, top_k, top_p, min_p, rnd, &sh, &greedy);
	if (threadIdx.x < GPUD_CUDA_ARGMAX_PARTS) // the arg max's key is the key itself
		out[threadIdx.x] = threadIdx.x || !id_key ? 0 :
				   greedy ? id_key : 0xffffffff00000000ull | (uint32_t)id_key;
}

cudaError_t gpud_k_draw(cudaStream_t s, float *logits, uint32_t rows, uint32_t nv,
			const uint32_t *ndraw, const uint32_t *words, uint64_t *keys,
			uint64_t *scratch)
{
	static_assert(DRAW_W_END == GPUD_CUDA_DRAW_SCRATCH &&
		      DRAW_PARTS * (DRAW_K_MAX + 1) <= GPUD_CUDA_DRAW_SCRATCH,
		      "a row's scratch holds its candidates or its ranges' ends and histogram");
	static_assert(DRAW_NB % DRAW_THREADS == 0 && (DRAW_W_END - DRAW_W_COUNT) % DRAW_PARTS == 0,
		      "buckets and histogram words divide evenly");
	cudaError_t e;

	if (!rows)
		return cudaSuccess;
	if (!scratch)
		return cudaErrorInvalidValue;
	e = launched(cudaLaunchKernelEx(klc(dim3(DRAW_PARTS, rows), DRAW_THREADS, 0, s).cfg(),
					draw_part_kernel, logits, nv, ndraw, words, scratch));
	if (e == cudaSuccess)
		e = launched(cudaLaunchKernelEx(klc(dim3(DRAW_PARTS, rows), DRAW_THREADS, 0, s).cfg(),
						draw_hist_kernel, (const float *)logits, nv, ndraw,
						words, scratch));
	if (e == cudaSuccess)
		e = launched(cudaLaunchKernelEx(klc(dim3(rows), DRAW_THREADS, 0, s).cfg(),
						draw_kernel, (const float *)logits, nv, ndraw, words,
						keys, (const uint64_t *)scratch));
	return e;
}

/* --- float-type weights (F32/F16/BF16) -----------------------------------
 * Decode (T <= 8): a GEMV that widens each weight to fp32 and multiplies
 * the fp32 activations, as the CPU does. F32 prefill: a tiled fp32 kernel.
 * F16/BF16 prefill: the tensor cores (gemm_hp_kernel, below the int8
 * kernels) over activations split into two halves of the weight's type,
 * x = hi + lo (hi = x rounded, lo = x - hi rounded), so the products keep
 * ~16 bits of x (BF16; ~22 for F16) and not 8 or 11; for F16 each token's
 * row is first scaled by a power of two that keeps it below 2^14 (F16
 * overflows at 65504), undone on the result. No cuBLAS anywhere: its GEMMs
 * allocated host memory on every call (gemm_hp_kernel says where). */

template <int TYPE>
static __device__ __forceinline__ float wf(const void *W, int64_t i)
{
	if (TYPE == GPUD_TYPE_F32)
		return ((const float *)W)[i];
	if (TYPE == GPUD_TYPE_BF16)
		return bf16_bits(((const uint16_t *)W)[i]);
	return half_bits(((const uint16_t *)W)[i]);
}

/* Loaded values held where they are: an empty asm that takes them, so
 * that the compiler does not sink their loads to their first use (past
 * a branch, behind the arithmetic of the loads before them). No
 * instruction comes of it. */
static __device__ __forceinline__ void pin(uint4 v)
{
	asm volatile("" ::"r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

static __device__ __forceinline__ void pin(int4 v)
{
	asm volatile("" ::"r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

static __device__ __forceinline__ void pin(unsigned v) { asm volatile("" ::"r"(v)); }

/* Weights i .. i + 7 of an fp32, F16 or BF16 matrix as they lie in memory
 * (F32: 32 bytes in a and b; F16/BF16: 16 in a), loaded before any is used
 * (dot_f), and as floats. */
struct fraw {
	uint4 a, b;
};

template <int TYPE>
static __device__ __forceinline__ fraw load_f8(const void *W, int64_t i)
{
	fraw v;

	if (TYPE == GPUD_TYPE_F32) {
		const uint4 *p = (const uint4 *)((const float *)W + i);
		v.a = p[0];
		v.b = p[1];
	} else {
		v.a = *(const uint4 *)((const uint16_t *)W + i);
		v.b = make_uint4(0, 0, 0, 0);
	}
	return v;
}

template <int TYPE>
static __device__ __forceinline__ void unpack_f8(const fraw &v, float w[8])
{
	if (TYPE == GPUD_TYPE_F32) {
		w[0] = __uint_as_float(v.a.x); w[1] = __uint_as_float(v.a.y);
		w[2] = __uint_as_float(v.a.z); w[3] = __uint_as_float(v.a.w);
		w[4] = __uint_as_float(v.b.x); w[5] = __uint_as_float(v.b.y);
		w[6] = __uint_as_float(v.b.z); w[7] = __uint_as_float(v.b.w);
	} else {
		uint32_t u[4] = { v.a.x, v.a.y, v.a.z, v.a.w };
#pragma unroll
		for (int k = 0; k < 4; k++) {
			uint16_t lo = (uint16_t)(u[k] & 0xffff), hi = (uint16_t)(u[k] >> 16);
			w[2 * k] = TYPE == GPUD_TYPE_BF16 ? bf16_bits(lo) : half_bits(lo);
			w[2 * k + 1] = TYPE == GPUD_TYPE_BF16 ? bf16_bits(hi) : half_bits(hi);
		}
	}
}

/* Up to three matrices of one type and width over the same activations,
 * in one launch (the rows of each after the previous one's): q the
 * weights (the quants of Q8_0/Q4_0), d their scales (NULL for float
 * types). */
struct gemv_set {
	const uint8_t *q[3];
	const uint16_t *d[3];
	float *y[3];
	int64_t rows[3]; /* 0 past the set */
	int acc;         /* y += the products (not GLU) */
};

/* Lane 0's store of token t's output v of row r (of rows) into y. */
static __device__ __forceinline__ void gemv_put(const gemv_set &set, float *y, int64_t rows,
						int64_t r, uint32_t t, float v)
{
	float *p = y + (int64_t)t * rows + r;

	*p = set.acc ? __fadd_rn(*p, v) : v;
}

/* The warp's matrix m and row r in set for global warp row r (GLU: one
 * row range, the pair's): selects, not an index, which would copy the
 * parameters to local memory. Returns false past the set. */
template <bool GLU>
static __device__ __forceinline__ bool gemv_row(const gemv_set &set, int64_t &r, int &m)
{
	m = 0;
	if (!GLU && r >= set.rows[0]) {
		r -= set.rows[0];
		m = 1;
		if (r >= set.rows[1]) {
			r -= set.rows[1];
			m = 2;
		}
	}
	return r < (m == 0 ? set.rows[0] : m == 1 ? set.rows[1] : set.rows[2]);
}

/* --- the decode GEMVs' units of rows ---------------------------------------
 * Warp w of a GEMV's grid (nw warps) takes the units w, w + nw, w + 2 nw,
 * ... (a row, a RoPE pair of rows, a pair of gate and up rows). Without a
 * fused norm the grid has a CTA for every 8 units, and the instances take
 * one (no loop: their registers and prefetch are as they were); with one,
 * gemv_grid bounds the grid at gpud_cuda_norm.ctas (2 CTAs a
 * multiprocessor) and a warp takes several, in gemv_course. Each CTA
 * norms x once, and at one CTA a multiprocessor for 8 units it did so
 * about as long as the units took:
 * the 3B model's Q/K/V GEMV, with 8 pairs a CTA in three waves, ran at
 * 35% of the copy bandwidth on an H100, gate/up at 73%. A warp asks for
 * its first unit's weights in L2 before the wait for the kernel ahead (as
 * before), and then for its next unit's before it reads the current one,
 * so that the memory streams while it multiplies: at 2 CTAs of 8 warps a
 * multiprocessor of an H100, the first units are 12.7 MB of the 3B's Q/K/V
 * (16.7) or gate/up rows (50), and no more than that is ahead of the
 * warps (its L2 is 50 MB, a 4090's 72). */

static unsigned gemv_grid(int64_t units, int64_t per_cta, const gpud_cuda_norm *norm)
{
	int64_t g = (units + per_cta - 1) / per_cta;

	if (norm && norm->ctas && g > (int64_t)norm->ctas)
		g = norm->ctas;
	return (unsigned)g;
}

/* A decode GEMV kernel's course over its warp's units u0, u0 + nw, ...
 * (NORM; without, u0 alone): ahead(u) asks for unit u's weights in L2 (a
 * no-op past the set), norm() makes the CTA's normed activations (NORM),
 * unit(u) says whether u is one of the set's (and names its rows for
 * body), body() makes it. The first unit's weights are asked for before
 * the wait for the kernel ahead (they are read only), each next one's
 * before the current one is read. */
template <bool NORM, class Ahead, class Norm, class Unit, class Body>
static __device__ __forceinline__ void gemv_course(int64_t u0, int64_t nw,
						   const gpud_cuda_norm &nrm, int64_t cols,
						   Ahead ahead, Norm norm, Unit unit, Body body)
{
	ahead(u0);
	if (NORM)
		norm_prefetch(nrm, cols);
	pdl_enter();
	if (NORM)
		norm();
	for (int64_t u = u0;; u += nw) {
		if (!unit(u))
			return;
		if (NORM)
			ahead(u + nw);
		body();
		if (!NORM)
			return;
	}
}

/* --- decode Q/K/V with RoPE and the KV store in the epilogue ---------------
 * The GEMVs of Q, K and V in one launch, a warp per RoPE pair of rows of a
 * head (2i, 2i + 1; with NEOX i, i + head_dim / 2); lane t then does token
 * t's part of rope_store_kernel for the pair, with its arithmetic: the
 * biases, then Q rotated into q, K rotated and V as it is into the token's
 * KV block. One launch and no round trip through the q, k and v scratch
 * for K and V. */
struct rope_args {
	gpud_cuda_meta m;
	gpud_cuda_kvshape kv;
	gpud_cuda_rope rp;
	float *q; /* (T, n_heads * head_dim) */
};

/* The rows of the warp's RoPE pair, from r = 2 x its pair index in its
 * matrix: r becomes the first, the second is returned. */
static __device__ __forceinline__ int64_t qkv_pair(const rope_args &ra, int64_t &r)
{
	uint32_t hd = ra.kv.head_dim, half = hd / 2;
	int64_t p = r / 2;

	if (!ra.rp.neox)
		return r + 1;
	r = p / half * hd + p % half;
	return r + half;
}

static __device__ __forceinline__ void qkv_store(const rope_args &ra, int m, int64_t r, int64_t r1,
						 uint32_t t, float a, float b)
{
	const gpud_cuda_kvshape &kv = ra.kv;
	uint32_t hd = kv.head_dim, h = (uint32_t)(r / hd), e = (uint32_t)(r % hd);
	uint32_t st = (uint32_t)(r1 - r);
	const float *bias = m == 0 ? ra.rp.bq : m == 1 ? ra.rp.bk : ra.rp.bv;
	float2 o = make_float2(bias_add(a, bias, r), bias_add(b, bias, r1));
	uint64_t d;

	if (m != 2)
		o = rope_rot(o.x, o.y, rope_cs(ra.m.pos[t], ra.rp.inv_freq[ra.rp.neox ? e : e / 2]));
	if (m == 0) {
		float *qd = ra.q + (size_t)t * kv.n_heads * hd + r;
		qd[0] = o.x;
		qd[st] = o.y;
		return;
	}
	d = kv_slot(ra.m, kv, t) + (uint64_t)(m == 2 ? kv.n_kv_heads + h : h) * kv.head_elems + e;
	kv_put(kv, d, o.x);
	kv_put(kv, d + st, o.y);
}

/* Lane t stores token t's pair (rows r, r1 of matrix m). */
template <int NT>
static __device__ __forceinline__ void qkv_epilogue(const rope_args &ra, int m, int64_t r,
						    int64_t r1, uint32_t T, uint32_t lane,
						    const float v[NT], const float v2[NT])
{
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (lane == (uint32_t)t && (uint32_t)t < T)
			qkv_store(ra, m, r, r1, (uint32_t)t, v[t], v2[t]);
}

/* v + w . x[0..7], in order (x 16-byte aligned). */
static __device__ __forceinline__ float fma8(const float w[8], const float *x, float v)
{
	float4 a = ((const float4 *)x)[0], b = ((const float4 *)x)[1];

	v = fmaf(w[0], a.x, v);
	v = fmaf(w[1], a.y, v);
	v = fmaf(w[2], a.z, v);
	v = fmaf(w[3], a.w, v);
	v = fmaf(w[4], b.x, v);
	v = fmaf(w[5], b.y, v);
	v = fmaf(w[6], b.z, v);
	return fmaf(w[7], b.w, v);
}

/* fp32 dot of weights row r from column c (8 at a time, or 1) with each
 * token's activations, into acc. */
template <int TYPE, int NT, bool VEC>
static __device__ __forceinline__ void dot_f(const void *W, int64_t r, int64_t cols,
					     const float *x, uint32_t T, uint32_t lane,
					     float acc[NT])
{
	if (VEC) {
		/* A lane's next U chunks of 8 loaded before any is multiplied
		 * (past the row's end as the first, never added): one at a
		 * time kept 16 bytes a lane in flight (F16), a round trip of
		 * DRAM for each 256 columns of a row (gemv_q_rows says more).
		 * The same sums in the same order. */
		constexpr int U = NT >= 4 ? 2 : 4;
		for (int64_t c0 = (int64_t)lane * 8; c0 < cols; c0 += 256 * U) {
			fraw raw[U];
#pragma unroll
			for (int u = 0; u < U; u++) {
				int64_t c = c0 + 256 * u < cols ? c0 + 256 * u : c0;
				raw[u] = load_f8<TYPE>(W, r * cols + c);
			}
#pragma unroll
			for (int u = 0; u < U; u++) {
				pin(raw[u].a);
				if (TYPE == GPUD_TYPE_F32)
					pin(raw[u].b);
			}
#pragma unroll
			for (int u = 0; u < U; u++) {
				int64_t c = c0 + 256 * u;
				float w[8];

				if (c >= cols)
					break;
				unpack_f8<TYPE>(raw[u], w);
#pragma unroll
				for (int t = 0; t < NT; t++) {
					if ((uint32_t)t < T)
						acc[t] = fma8(w, x + (int64_t)t * cols + c, acc[t]);
				}
			}
		}
	} else {
		for (int64_t c = lane; c < cols; c += 32) {
			float w = wf<TYPE>(W, r * cols + c);
#pragma unroll
			for (int t = 0; t < NT; t++)
				if ((uint32_t)t < T)
					acc[t] = fmaf(w, x[(int64_t)t * cols + c], acc[t]);
		}
	}
}

/* Unit g of the set's rows (gemv_row: GLU, gate's and up's) into L2, if
 * it is one. */
template <int TYPE, bool GLU>
static __device__ __forceinline__ void gemv_f_ahead(const gemv_set &set, int64_t g, int64_t cols,
						    uint32_t lane)
{
	const int64_t rb = cols * (TYPE == GPUD_TYPE_F32 ? 4 : 2); /* bytes of a row */
	int m;

	if (!gemv_row<GLU>(set, g, m))
		return;
	prefetch_l2((m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2]) + g * rb, rb, lane);
	if (GLU)
		prefetch_l2(set.q[1] + g * rb, rb, lane);
}

/* A warp per row unit of the set (the units above); GLU and NORM as
 * gemv_q_kernel's. */
template <int TYPE, int NT, bool VEC, bool GLU, bool NORM>
__global__ void __launch_bounds__(256, NORM ? GPUD_K_NORM_CTAS_PER_SM : 0)
gemv_f_kernel(gemv_set set, int64_t cols, const float *x, uint32_t T, gpud_cuda_norm nrm)
{
	extern __shared__ int4 gemv_sm[];
	int64_t g0 = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5), nw = (int64_t)gridDim.x * 8;
	uint32_t lane = threadIdx.x & 31;
	int64_t r;
	int m;

	gemv_course<NORM>(
		g0, nw, nrm, cols, [&](int64_t g) { gemv_f_ahead<TYPE, GLU>(set, g, cols, lane); },
		[&] { norm_act_f(nrm, cols, T, (unsigned char *)gemv_sm, x); },
		[&](int64_t g) {
			r = g;
			return gemv_row<GLU>(set, r, m);
		},
		[&] {
			const void *W = m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2];
			float *y = m == 0 ? set.y[0] : m == 1 ? set.y[1] : set.y[2];
			int64_t rows = m == 0 ? set.rows[0] : m == 1 ? set.rows[1] : set.rows[2];
			float acc[NT], acc2[NT];
#pragma unroll
			for (int t = 0; t < NT; t++)
				acc[t] = acc2[t] = 0.0f;
			dot_f<TYPE, NT, VEC>(W, r, cols, x, T, lane, acc);
			if (GLU)
				dot_f<TYPE, NT, VEC>(set.q[1], r, cols, x, T, lane, acc2);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				float v = warp_sum(acc[t]);

				if (GLU)
					v = swiglu(v, warp_sum(acc2[t]));
				if (lane == 0 && (uint32_t)t < T)
					gemv_put(set, y, rows, r, (uint32_t)t, v);
			}
		});
}

/* Pair unit p of the set's Q/K/V rows: its matrix m and rows r, r1
 * (qkv_pair); false past the set. */
static __device__ __forceinline__ bool qkv_unit(const gemv_set &set, const rope_args &ra,
						int64_t p, int &m, int64_t &r, int64_t &r1)
{
	r = 2 * p;
	if (!gemv_row<false>(set, r, m))
		return false;
	r1 = qkv_pair(ra, r);
	return true;
}

/* Pair unit p's rows into L2, if it is one. */
template <int TYPE>
static __device__ __forceinline__ void qkv_f_ahead(const gemv_set &set, const rope_args &ra,
						   int64_t p, int64_t cols, uint32_t lane)
{
	const int64_t rb = cols * (TYPE == GPUD_TYPE_F32 ? 4 : 2); /* bytes of a row */
	int m;
	int64_t r, r1;

	if (!qkv_unit(set, ra, p, m, r, r1))
		return;
	const uint8_t *W = m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2];
	prefetch_l2(W + r * rb, rb, lane);
	prefetch_l2(W + r1 * rb, rb, lane);
}

/* Q, K and V with RoPE and the KV store (rope_args above): a warp per
 * RoPE pair of rows, the units above. */
template <int TYPE, int NT, bool VEC, bool NORM>
__global__ void __launch_bounds__(256, NORM ? GPUD_K_NORM_CTAS_PER_SM : 0)
gemv_f_qkv_kernel(gemv_set set, int64_t cols, const float *x, uint32_t T, rope_args ra,
		  gpud_cuda_norm nrm)
{
	extern __shared__ int4 gemv_sm[];
	int64_t p0 = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5), nw = (int64_t)gridDim.x * 8;
	uint32_t lane = threadIdx.x & 31;
	int m;
	int64_t r, r1;

	gemv_course<NORM>(
		p0, nw, nrm, cols, [&](int64_t p) { qkv_f_ahead<TYPE>(set, ra, p, cols, lane); },
		[&] { norm_act_f(nrm, cols, T, (unsigned char *)gemv_sm, x); },
		[&](int64_t p) { return qkv_unit(set, ra, p, m, r, r1); },
		[&] {
			const uint8_t *W = m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2];
			float acc[NT], acc2[NT];
#pragma unroll
			for (int t = 0; t < NT; t++)
				acc[t] = acc2[t] = 0.0f;
			dot_f<TYPE, NT, VEC>(W, r, cols, x, T, lane, acc);
			dot_f<TYPE, NT, VEC>(W, r1, cols, x, T, lane, acc2);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				acc[t] = warp_sum(acc[t]);
				acc2[t] = warp_sum(acc2[t]);
			}
			qkv_epilogue<NT>(ra, m, r, r1, T, lane, acc, acc2);
		});
}

/* The kernel instance for T tokens: NT = 1, 2, 4 or 8; with a fused norm
 * (T <= GPUD_K_NORM_MAX_T) 1 or 2. */
#define NT_BUCKET(T, K) ((T) == 1 ? K(1) : (T) == 2 ? K(2) : (T) <= 4 ? K(4) : K(8))
#define NORM_BUCKET(T, K) ((T) == 1 ? K(1) : K(2))
static_assert(GPUD_K_NORM_MAX_T == 2, "NORM_BUCKET's instances");

/* norm (GLU, VEC only: gpud_k_norm_fuses asks for cols % 8 == 0): the
 * instance that makes it. */
template <int TYPE, bool VEC, bool GLU>
static cudaError_t launch_mv_f(cudaStream_t s, const gemv_set &set, int64_t cols, const float *x,
			       uint32_t T, const gpud_cuda_norm *norm)
{
	int64_t rows = GLU ? set.rows[0] : set.rows[0] + set.rows[1] + set.rows[2];
	/* a bounded grid for the NORM instances only (those without take a
	 * unit a warp) */
	unsigned g = gemv_grid(rows, 8, GLU && VEC ? norm : nullptr);
	gpud_cuda_norm nrm = norm ? *norm : gpud_cuda_norm{};
	size_t shm = norm ? norm_smem(false, T, cols) : 0;

#define GEMV_F(nt, nm)                                                                     \
	cudaLaunchKernelEx(klc(g, 256, shm, s).cfg(), gemv_f_kernel<TYPE, nt, VEC, GLU, nm>, set, \
			   cols, x, T, nrm)
#define PLAIN(nt) GEMV_F(nt, false)
#define NORMED(nt) GEMV_F(nt, true)
	if constexpr (GLU && VEC) {
		if (norm)
			return launched(NORM_BUCKET(T, NORMED));
	}
	return launched(NT_BUCKET(T, PLAIN));
#undef GEMV_F
#undef PLAIN
#undef NORMED
}

template <int TYPE, bool GLU>
static cudaError_t launch_mv_f_type(cudaStream_t s, const gemv_set &set, int64_t cols,
				    const float *x, uint32_t T, const gpud_cuda_norm *norm)
{
	/* 8-element loads need rows of a multiple of 8 elements */
	if (cols % 8 == 0)
		return launch_mv_f<TYPE, true, GLU>(s, set, cols, x, T, norm);
	return launch_mv_f<TYPE, false, GLU>(s, set, cols, x, T, norm);
}

template <bool GLU>
static cudaError_t launch_mv_f_set(cudaStream_t s, int type, const gemv_set &set, int64_t cols,
				   const float *x, uint32_t T, const gpud_cuda_norm *norm = nullptr)
{
	switch (type) {
	case GPUD_TYPE_F32:
		return launch_mv_f_type<GPUD_TYPE_F32, GLU>(s, set, cols, x, T, norm);
	case GPUD_TYPE_F16:
		return launch_mv_f_type<GPUD_TYPE_F16, GLU>(s, set, cols, x, T, norm);
	case GPUD_TYPE_BF16:
		return launch_mv_f_type<GPUD_TYPE_BF16, GLU>(s, set, cols, x, T, norm);
	default:
		return cudaErrorInvalidValue;
	}
}

cudaError_t gpud_k_mv_f(cudaStream_t s, const gpud_cuda_mat *w, const float *x, uint32_t T,
			float *y)
{
	gemv_set set = { { (const uint8_t *)w->q }, { nullptr }, { y }, { w->rows }, 0 };

	if (T > 8)
		return cudaErrorInvalidValue;
	return launch_mv_f_set<false>(s, w->type, set, w->cols, x, T);
}

#define FT 64 /* rows and tokens per tile */
#define FK 16 /* columns per step */

/* y (T, rows) = W x for F32/F16/BF16 W and fp32 x: 64 rows x 64 tokens per
 * 256-thread block, 4 x 4 outputs per thread, each summed over the columns
 * in order. The prefill of F32 weights, and of F16/BF16 ones that the
 * tensor-core kernel does not take (gpud_k_mm_h_fits). */
template <int TYPE>
__global__ void __launch_bounds__(256)
gemm_f_kernel(const void *W, int64_t rows, int64_t cols, const float *x, uint32_t T, float *y)
{
	pdl_enter();
	__shared__ float sw[FT][FK + 1];
	__shared__ float sx[FT][FK + 1];
	uint32_t tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
	/* token tiles on x: a row tile's CTAs run together (gemm_q_kernel) */
	int64_t r0 = (int64_t)blockIdx.y * FT, t0 = (int64_t)blockIdx.x * FT;
	float acc[4][4];

#pragma unroll
	for (int a = 0; a < 4; a++)
#pragma unroll
		for (int b = 0; b < 4; b++)
			acc[a][b] = 0.0f;
	for (int64_t k0 = 0; k0 < cols; k0 += FK) {
		/* 64 x 16 of each operand: 4 elements per thread each */
#pragma unroll
		for (int e = 0; e < 4; e++) {
			uint32_t idx = tid + 256 * e, row = idx / FK, kk = idx % FK;
			int64_t k = k0 + kk;
			sw[row][kk] = r0 + row < rows && k < cols ? wf<TYPE>(W, (r0 + row) * cols + k) : 0.0f;
			sx[row][kk] = t0 + row < T && k < cols ? x[(t0 + row) * cols + k] : 0.0f;
		}
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < FK; kk++) {
			float wv[4], xv[4];
#pragma unroll
			for (int a = 0; a < 4; a++)
				wv[a] = sw[ty + 16 * a][kk];
#pragma unroll
			for (int b = 0; b < 4; b++)
				xv[b] = sx[tx + 16 * b][kk];
#pragma unroll
			for (int a = 0; a < 4; a++)
#pragma unroll
				for (int b = 0; b < 4; b++)
					acc[a][b] = fmaf(wv[a], xv[b], acc[a][b]);
		}
		__syncthreads();
	}
#pragma unroll
	for (int a = 0; a < 4; a++)
#pragma unroll
		for (int b = 0; b < 4; b++) {
			int64_t row = r0 + ty + 16 * a, tok = t0 + tx + 16 * b;
			if (row < rows && tok < T)
				y[tok * rows + row] = acc[a][b];
		}
}

cudaError_t gpud_k_mm_f(cudaStream_t s, const gpud_cuda_mat *w, const float *x, uint32_t T,
			float *y)
{
	dim3 grid((T + FT - 1) / FT, (unsigned)((w->rows + FT - 1) / FT));
	auto k = w->type == GPUD_TYPE_F32    ? gemm_f_kernel<GPUD_TYPE_F32>
		 : w->type == GPUD_TYPE_F16  ? gemm_f_kernel<GPUD_TYPE_F16>
		 : w->type == GPUD_TYPE_BF16 ? gemm_f_kernel<GPUD_TYPE_BF16>
					     : nullptr;

	if (!k || (w->rows + FT - 1) / FT > 65535)
		return cudaErrorInvalidValue;
	return launched(cudaLaunchKernelEx(klc(grid, 256, 0, s).cfg(), k, w->q, w->rows, w->cols,
					   x, T, y));
}

#define SPLIT_THREADS 256
#define F16_ROW_MAX 16384.0f /* 2^14: hi + lo and their sums stay finite */

/* One block per token: its scale (F16: a power of two), then hi and lo. */
__global__ void __launch_bounds__(SPLIT_THREADS)
split_act_kernel(const float *x, uint32_t cols, int type, void *hi, void *lo, float *scales)
{
	pdl_enter();
	__shared__ float part[SPLIT_THREADS / 32];
	const float *xr = x + (size_t)blockIdx.x * cols;
	size_t base = (size_t)blockIdx.x * cols;
	float amax = 0.0f, sc = 1.0f;

	if (type == GPUD_TYPE_F16) {
		for (uint32_t i = threadIdx.x; i < cols; i += SPLIT_THREADS)
			amax = fmaxf(amax, fabsf(xr[i]));
		amax = warp_max(amax);
		if ((threadIdx.x & 31) == 0)
			part[threadIdx.x >> 5] = amax;
		__syncthreads();
		amax = 0.0f;
		for (int i = 0; i < SPLIT_THREADS / 32; i++)
			amax = fmaxf(amax, part[i]);
		/* NaN/Inf rows stay as they are: the result is NaN/Inf either way */
		while (isfinite(amax) && amax / sc > F16_ROW_MAX)
			sc *= 2.0f;
	}
	for (uint32_t i = threadIdx.x; i < cols; i += SPLIT_THREADS) {
		float v = xr[i] / sc; /* exact: sc is a power of two */
		if (type == GPUD_TYPE_BF16) {
			__nv_bfloat16 h = __float2bfloat16_rn(v);
			((__nv_bfloat16 *)hi)[base + i] = h;
			((__nv_bfloat16 *)lo)[base + i] = __float2bfloat16_rn(v - __bfloat162float(h));
		} else {
			__half h = __float2half_rn(v);
			((__half *)hi)[base + i] = h;
			((__half *)lo)[base + i] = __float2half_rn(v - __half2float(h));
		}
	}
	if (threadIdx.x == 0)
		scales[blockIdx.x] = sc;
}

cudaError_t gpud_k_split_act(cudaStream_t s, const float *x, uint32_t T, uint32_t cols, int type,
			     void *hi, void *lo, float *scales)
{
	return launched(cudaLaunchKernelEx(klc(T, SPLIT_THREADS, 0, s).cfg(), split_act_kernel, x,
					   cols, type, hi, lo, scales));
}

/* --- the int8 path (quant_block above) ------------------------------------- */

/* One warp per (token, block), lane j holding element j. */
__global__ void quantize_act_kernel(const float *x, uint64_t n_blocks, int8_t *q, float *d)
{
	pdl_enter();
	uint64_t blk = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	uint32_t lane = threadIdx.x & 31;
	float dv;

	if (blk >= n_blocks)
		return; /* whole warps leave together: blockDim is a multiple of 32 */
	int8_t qv = quant_block(x[blk * GPUD_QK + lane], &dv);
	q[blk * GPUD_QK + lane] = qv;
	if (lane == 0)
		d[blk] = dv;
}

cudaError_t gpud_k_quantize_act(cudaStream_t s, const float *x, uint32_t T, uint32_t cols,
				int8_t *q, float *d)
{
	uint64_t nb = (uint64_t)T * (cols / GPUD_QK);

	return launched(cudaLaunchKernelEx(klc((unsigned)((nb + 7) / 8), 256, 0, s).cfg(),
					   quantize_act_kernel, x, nb, q, d));
}

/* Block i of row r as it lies in memory (Q8_0: 32 bytes in a and b; Q4_0:
 * 16 in a), loaded before any is used (gemv_q_rows), and its 8 words of
 * int8 weights. */
struct wraw {
	int4 a, b;
};

template <int TYPE>
static __device__ __forceinline__ wraw load_wraw(const uint8_t *wq, int64_t r, int64_t cols,
						 int64_t i)
{
	wraw v;

	if (TYPE == GPUD_TYPE_Q8_0) {
		const int4 *p = (const int4 *)(wq + r * cols + i * GPUD_QK);
		v.a = p[0];
		v.b = p[1];
	} else {
		v.a = *(const int4 *)(wq + r * cols / 2 + i * (GPUD_QK / 2));
		v.b = make_int4(0, 0, 0, 0);
	}
	return v;
}

template <int TYPE>
static __device__ __forceinline__ void unpack_wblock(const wraw &v, int w[8])
{
	if (TYPE == GPUD_TYPE_Q8_0) {
		w[0] = v.a.x; w[1] = v.a.y; w[2] = v.a.z; w[3] = v.a.w;
		w[4] = v.b.x; w[5] = v.b.y; w[6] = v.b.z; w[7] = v.b.w;
	} else {
		/* byte j: weight j in the low nibble, j + 16 in the high one */
		int q[4] = { v.a.x, v.a.y, v.a.z, v.a.w };
#pragma unroll
		for (int k = 0; k < 4; k++) {
			w[k] = (int)__vsub4((unsigned)q[k] & 0x0f0f0f0fu, 0x08080808u);
			w[4 + k] = (int)__vsub4(((unsigned)q[k] >> 4) & 0x0f0f0f0fu, 0x08080808u);
		}
	}
}

#define GEMV_WARPS 8

/* One weight block's integer dot with activation block i of token t. */
static __device__ __forceinline__ int dot_block(const int w[8], const int8_t *__restrict__ xq,
						int64_t cols, uint32_t t, int64_t i)
{
	const int4 *xp = (const int4 *)(xq + (int64_t)t * cols + i * GPUD_QK);
	int4 a = xp[0], b = xp[1];
	int s = 0;

	s = __dp4a(w[0], a.x, s);
	s = __dp4a(w[1], a.y, s);
	s = __dp4a(w[2], a.z, s);
	s = __dp4a(w[3], a.w, s);
	s = __dp4a(w[4], b.x, s);
	s = __dp4a(w[5], b.y, s);
	s = __dp4a(w[6], b.z, s);
	s = __dp4a(w[7], b.w, s);
	return s;
}

/* Row r of weights (wq, wd), and with TWO row r2 of (wq2, wd2), against
 * each token's activations, by one warp: lanes take blocks lane, lane+32,
 * ... and their partial sums are added at the end (the one place the bits
 * may differ from the CPU's in-order sum); every lane returns the sums in
 * v (and v2). */
template <int TYPE, int NT, bool TWO>
static __device__ __forceinline__ void gemv_q_rows(const uint8_t *__restrict__ wq,
						   const uint16_t *__restrict__ wd, int64_t r,
						   const uint8_t *__restrict__ wq2,
						   const uint16_t *__restrict__ wd2, int64_t r2,
						   int64_t cols, const int8_t *__restrict__ xq,
						   const float *__restrict__ xd, uint32_t T,
						   uint32_t lane, float v[NT], float v2[NT])
{
	/* A lane's next U blocks (2 with TWO) are all loaded before any is
	 * multiplied, past the row's end as its last block (never added): a
	 * loop of a block at a time had one in flight a lane (nvdisasm: the
	 * next block's loads waited behind the dot products), 1 KB a warp,
	 * some 23 KB a multiprocessor for a 3072-row matrix, less than the
	 * DRAM's latency times its share of the bandwidth. The same sums in
	 * the same order. */
	constexpr int U = TWO || NT >= 4 ? 2 : 4;
	int64_t nb = cols / GPUD_QK;
	float acc[NT], acc2[NT];

#pragma unroll
	for (int t = 0; t < NT; t++)
		acc[t] = acc2[t] = 0.0f;
	for (int64_t i0 = lane; i0 < nb; i0 += 32 * U) {
		wraw q[U], q2[U];
		uint16_t d[U], d2[U];

#pragma unroll
		for (int u = 0; u < U; u++) {
			int64_t i = i0 + 32 * u < nb ? i0 + 32 * u : nb - 1;
			q[u] = load_wraw<TYPE>(wq, r, cols, i);
			d[u] = wd[r * nb + i];
			if (TWO) {
				q2[u] = load_wraw<TYPE>(wq2, r2, cols, i);
				d2[u] = wd2[r2 * nb + i];
			}
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			pin(q[u].a);
			pin((unsigned)d[u]);
			if (TYPE == GPUD_TYPE_Q8_0)
				pin(q[u].b);
			if (TWO) {
				pin(q2[u].a);
				pin((unsigned)d2[u]);
				if (TYPE == GPUD_TYPE_Q8_0)
					pin(q2[u].b);
			}
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			int64_t i = i0 + 32 * u;
			int w[8], w2[8];
			float dw = half_bits(d[u]), dw2 = TWO ? half_bits(d2[u]) : 0.0f;

			if (i >= nb)
				break;
			unpack_wblock<TYPE>(q[u], w);
			if (TWO)
				unpack_wblock<TYPE>(q2[u], w2);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if ((uint32_t)t < T) {
					float dx = xd[(int64_t)t * nb + i];

					acc[t] = fmaf(__fmul_rn(dw, dx),
						      i2f_exact(dot_block(w, xq, cols, t, i)), acc[t]);
					if (TWO)
						acc2[t] = fmaf(__fmul_rn(dw2, dx),
							       i2f_exact(dot_block(w2, xq, cols, t, i)),
							       acc2[t]);
				}
			}
		}
	}
#pragma unroll
	for (int t = 0; t < NT; t++) {
		v[t] = warp_sum(acc[t]);
		if (TWO)
			v2[t] = warp_sum(acc2[t]);
	}
}

/* Row r of matrix m of the set, by one warp (gemv_q_rows). GLU: the set is
 * (gate, up) of equal rows, and v = silu(gate) * up. */
template <int TYPE, int NT, bool GLU>
static __device__ __forceinline__ void gemv_q_row(const gemv_set &set, int m, int64_t r,
						  int64_t cols, const int8_t *__restrict__ xq,
						  const float *__restrict__ xd, uint32_t T,
						  uint32_t lane, float v[NT])
{
	const uint8_t *wq = m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2];
	const uint16_t *wd = m == 0 ? set.d[0] : m == 1 ? set.d[1] : set.d[2];
	float u[NT];

	gemv_q_rows<TYPE, NT, GLU>(wq, wd, r, set.q[1], set.d[1], r, cols, xq, xd, T, lane, v, u);
	if (GLU) {
#pragma unroll
		for (int t = 0; t < NT; t++)
			v[t] = swiglu(v[t], u[t]);
	}
}

/* Row r of matrix m (and of the second, GLU) into L2: quants and scales. */
template <int TYPE, bool GLU>
static __device__ __forceinline__ void gemv_q_prefetch(const gemv_set &set, int m, int64_t r,
						       int64_t cols, uint32_t lane)
{
	int64_t qb = TYPE == GPUD_TYPE_Q8_0 ? cols : cols / 2, nb = cols / GPUD_QK;

	for (int i = 0; i < (GLU ? 2 : 1); i++) {
		int k = GLU ? i : m;
		prefetch_l2((k == 0 ? set.q[0] : k == 1 ? set.q[1] : set.q[2]) + r * qb, qb, lane);
		prefetch_l2((k == 0 ? set.d[0] : k == 1 ? set.d[1] : set.d[2]) + r * nb, nb * 2,
			    lane);
	}
}

static_assert(GEMV_WARPS * 32 == NORM_THREADS, "a fused norm sums as add_norm_kernel");

/* Row unit g of the set (gemv_row) into L2, if it is one. */
template <int TYPE, bool GLU>
static __device__ __forceinline__ void gemv_q_ahead(const gemv_set &set, int64_t g, int64_t cols,
						    uint32_t lane)
{
	int m;

	if (gemv_row<GLU>(set, g, m))
		gemv_q_prefetch<TYPE, GLU>(set, m, g, cols, lane);
}

/* A warp per row unit of the set (the units of the GEMVs above); with
 * NORM, the activations are nrm's, made by the CTA (norm_act). NORM's
 * instances (T <= GPUD_K_NORM_MAX_T) are bounded at
 * GPUD_K_NORM_CTAS_PER_SM CTAs a multiprocessor (128 registers a thread
 * at 2): ptxas otherwise holds them to 64 or 80 registers and spills;
 * they take about 60 to 100. */
template <int TYPE, int NT, bool GLU, bool NORM>
__global__ void __launch_bounds__(GEMV_WARPS * 32, NORM ? GPUD_K_NORM_CTAS_PER_SM : 0)
gemv_q_kernel(gemv_set set, int64_t cols, const int8_t *__restrict__ xq,
	      const float *__restrict__ xd, uint32_t T, gpud_cuda_norm nrm)
{
	extern __shared__ int4 gemv_sm[];
	int64_t g0 = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
	int64_t nw = (int64_t)gridDim.x * GEMV_WARPS;
	uint32_t lane = threadIdx.x & 31;
	int64_t r;
	int m;

	gemv_course<NORM>(
		g0, nw, nrm, cols, [&](int64_t g) { gemv_q_ahead<TYPE, GLU>(set, g, cols, lane); },
		[&] { norm_act(nrm, cols, T, (unsigned char *)gemv_sm, xq, xd); },
		[&](int64_t g) {
			r = g;
			return gemv_row<GLU>(set, r, m);
		},
		[&] {
			float *yo = m == 0 ? set.y[0] : m == 1 ? set.y[1] : set.y[2];
			int64_t rows = m == 0 ? set.rows[0] : m == 1 ? set.rows[1] : set.rows[2];
			float v[NT];

			gemv_q_row<TYPE, NT, GLU>(set, m, r, cols, xq, xd, T, lane, v);
#pragma unroll
			for (int t = 0; t < NT; t++)
				if (lane == 0 && (uint32_t)t < T)
					gemv_put(set, yo, rows, r, (uint32_t)t, v[t]);
		});
}

/* Pair unit p's rows into L2, if it is one. */
template <int TYPE>
static __device__ __forceinline__ void qkv_q_ahead(const gemv_set &set, const rope_args &ra,
						   int64_t p, int64_t cols, uint32_t lane)
{
	int m;
	int64_t r, r1;

	if (!qkv_unit(set, ra, p, m, r, r1))
		return;
	gemv_q_prefetch<TYPE, false>(set, m, r, cols, lane);
	gemv_q_prefetch<TYPE, false>(set, m, r1, cols, lane);
}

/* Q, K and V with RoPE and the KV store (rope_args above): a warp per
 * RoPE pair of rows, the units above. */
template <int TYPE, int NT, bool NORM>
__global__ void __launch_bounds__(GEMV_WARPS * 32, NORM ? GPUD_K_NORM_CTAS_PER_SM : 0)
gemv_q_qkv_kernel(gemv_set set, int64_t cols, const int8_t *__restrict__ xq,
		  const float *__restrict__ xd, uint32_t T, rope_args ra, gpud_cuda_norm nrm)
{
	extern __shared__ int4 gemv_sm[];
	int64_t p0 = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
	int64_t nw = (int64_t)gridDim.x * GEMV_WARPS;
	uint32_t lane = threadIdx.x & 31;
	int m;
	int64_t r, r1;

	gemv_course<NORM>(
		p0, nw, nrm, cols, [&](int64_t p) { qkv_q_ahead<TYPE>(set, ra, p, cols, lane); },
		[&] { norm_act(nrm, cols, T, (unsigned char *)gemv_sm, xq, xd); },
		[&](int64_t p) { return qkv_unit(set, ra, p, m, r, r1); },
		[&] {
			const uint8_t *wq = m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2];
			const uint16_t *wd = m == 0 ? set.d[0] : m == 1 ? set.d[1] : set.d[2];
			float v[NT], v2[NT];

			gemv_q_rows<TYPE, NT, true>(wq, wd, r, wq, wd, r1, cols, xq, xd, T, lane,
						    v, v2);
			qkv_epilogue<NT>(ra, m, r, r1, T, lane, v, v2);
		});
}

/* Gate and up with SwiGLU whose output is also quantized into yq, yd (as
 * gpud_k_quantize_act would: the down matmul's int8 input, one launch
 * fewer). A CTA takes the 32 rows of one activation block at a time, each
 * warp 4 of them (its units: the 4 rows of block blockIdx.x, then of block
 * blockIdx.x + gridDim.x, ...); then warp t quantizes token t's block.
 * rows is a multiple of 32. */
#define GLUQ_ROWS 32
#define GLUQ_WROWS (GLUQ_ROWS / GEMV_WARPS) /* a warp's rows of a block */

/* Warp w's unit j (gate's and up's row) into L2, if it is one. */
template <int TYPE>
static __device__ __forceinline__ void gluq_ahead(const gemv_set &set, uint32_t w, int64_t j,
						  int64_t cols, uint32_t lane)
{
	int64_t blk = blockIdx.x + j / GLUQ_WROWS * (int64_t)gridDim.x;
	int64_t r = blk * GLUQ_ROWS + w + j % GLUQ_WROWS * GEMV_WARPS;

	if (r < set.rows[0])
		gemv_q_prefetch<TYPE, true>(set, 0, r, cols, lane);
}

template <int TYPE, int NT, bool NORM>
__global__ void __launch_bounds__(GEMV_WARPS * 32, NORM ? GPUD_K_NORM_CTAS_PER_SM : 0)
gemv_q_gluq_kernel(gemv_set set, int64_t cols, const int8_t *__restrict__ xq,
		   const float *__restrict__ xd, uint32_t T, int8_t *yq, float *yd,
		   gpud_cuda_norm nrm)
{
	extern __shared__ int4 gemv_sm[];
	__shared__ float sv[NT][GLUQ_ROWS];
	uint32_t w = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int64_t rows = set.rows[0], j = 0;

	gluq_ahead<TYPE>(set, w, 0, cols, lane); /* read only: before the wait */
	if (NORM)
		norm_prefetch(nrm, cols);
	pdl_enter();
	if (NORM)
		norm_act(nrm, cols, T, (unsigned char *)gemv_sm, xq, xd);

#pragma unroll 1
	for (int64_t blk = blockIdx.x; blk < rows / GLUQ_ROWS; blk += gridDim.x) {
		int64_t r0 = blk * GLUQ_ROWS;

#pragma unroll 1
		for (uint32_t k = w; k < GLUQ_ROWS; k += GEMV_WARPS, j++) {
			float v[NT];

			if (NORM)
				gluq_ahead<TYPE>(set, w, j + 1, cols, lane);
			gemv_q_row<TYPE, NT, true>(set, 0, r0 + k, cols, xq, xd, T, lane, v);
#pragma unroll
			for (int t = 0; t < NT; t++) {
				if (lane == 0 && (uint32_t)t < T) {
					set.y[0][(int64_t)t * rows + r0 + k] = v[t];
					sv[t][k] = v[t];
				}
			}
		}
		__syncthreads();
		if (w < T) { /* T <= NT <= GEMV_WARPS */
			float dv;
			int8_t qv = quant_block(sv[w][lane], &dv);

			yq[(int64_t)w * rows + r0 + lane] = qv;
			if (!lane)
				yd[(int64_t)w * (rows / GPUD_QK) + blk] = dv;
		}
		if (!NORM)
			return; /* a block a CTA */
		__syncthreads(); /* sv read before the next block's rows */
	}
}

/* --- the int8 matmul on tensor cores (prefill and batches past the GEMV) --
 * mma.sync m16n8k16 over int8: the products of a weight block with an
 * activation block are exact integer sums, as the CPU's, so each output is
 * still fma(d_w * d_x, (float)isum, acc) over the blocks in order: the
 * CPU's bits. A CTA of 4 warps holds MMA_M weight rows x MMA_N tokens,
 * each warp 16 rows x 32 tokens (4 mma tiles of 8 tokens); MMA_KB blocks
 * of 32 columns are staged in shared memory per barrier, each 16-column
 * half as [row][4 words] so that a fragment's 32 lanes read 32 banks.
 *
 * Decode batches (one token tile) have few tiles: a 3072-row matrix is 96
 * CTAs, under one per multiprocessor, each waiting on its loads. There the
 * columns are split (grid.z, gpud_k_mm_q's choice: about 2 CTAs per
 * multiprocessor): each split writes its partial sums to part, and the
 * CTA that arrives last at its row tile's counter (atomicAdd after a
 * fence; it resets the counter) adds the splits in order. The sum is then
 * no longer the CPU's order (ops_cmp's bound is the GEMV's), but it is the
 * same from run to run. */
#define MMA_M GPUD_CUDA_MM1_TILE_ROWS
#define MMA_N GPUD_CUDA_MM_TILE_TOKENS
#define MMA_KB GPUD_CUDA_MM1_STEP_BLOCKS

/* d += A B for the warp's fragments (cuda_runtime.h of cuemu documents the
 * layout): the tensor-core instruction, or cuemu's emulation of it. */
static __device__ __forceinline__ void mma_s8(int d[4], unsigned a0, unsigned a1, unsigned b0)
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu_mma_s8_m16n8k16(d, a0, a1, b0, d);
#else
	asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
		     "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
		     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
		     : "r"(a0), "r"(a1), "r"(b0));
#endif
}

template <int TYPE>
__global__ void __launch_bounds__(128)
gemm_q_kernel(const uint8_t *__restrict__ wq, const uint16_t *__restrict__ wd, int64_t rows,
	      int64_t cols, const int8_t *__restrict__ xq, const float *__restrict__ xd,
	      uint32_t T, float *y, float *part, unsigned *cnt)
{
	pdl_enter();
	__shared__ int4 sw[MMA_KB][2][MMA_M];
	__shared__ int4 sx[MMA_KB][2][MMA_N];
	__shared__ float sdw[MMA_KB][MMA_M], sdx[MMA_KB][MMA_N];
	__shared__ bool last;
	uint32_t tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	uint32_t wr = ((tid >> 5) & 1) * 16, wt = (tid >> 6) * 32; /* the warp's rows, tokens */
	/* token tiles on x, the fastest: the CTAs of one row tile run together
	 * and read its weights from DRAM once, not once per token tile */
	int64_t r0 = (int64_t)blockIdx.y * MMA_M, t0 = (int64_t)blockIdx.x * MMA_N;
	int64_t nb = cols / GPUD_QK, steps = (nb + MMA_KB - 1) / MMA_KB;
	uint32_t split = blockIdx.z, n_split = gridDim.z;
	/* this split's blocks: whole steps of MMA_KB */
	int64_t i_lo = steps * split / n_split * MMA_KB, i_hi = steps * (split + 1) / n_split * MMA_KB;
	float acc[4][4];

	if (i_hi > nb)
		i_hi = nb;
#pragma unroll
	for (int j = 0; j < 4; j++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			acc[j][e] = 0.0f;
	for (int64_t i0 = i_lo; i0 < i_hi; i0 += MMA_KB) {
		/* stage: MMA_KB blocks of the tile's weights and activations,
		 * zeros past the matrix, the tokens or the columns */
		for (uint32_t e = tid; e < MMA_KB * MMA_M; e += blockDim.x) {
			uint32_t kb = e / MMA_M, row = e % MMA_M;
			int64_t i = i0 + kb;
			int w[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
			float dw = 0.0f;

			if (i < i_hi && r0 + row < rows) {
				unpack_wblock<TYPE>(load_wraw<TYPE>(wq, r0 + row, cols, i), w);
				dw = half_bits(wd[(r0 + row) * nb + i]);
			}
			sw[kb][0][row] = make_int4(w[0], w[1], w[2], w[3]);
			sw[kb][1][row] = make_int4(w[4], w[5], w[6], w[7]);
			sdw[kb][row] = dw;
		}
		for (uint32_t e = tid; e < MMA_KB * MMA_N; e += blockDim.x) {
			uint32_t kb = e / MMA_N, tok = e % MMA_N;
			int64_t i = i0 + kb;
			int4 a = make_int4(0, 0, 0, 0), b = a;
			float dx = 0.0f;

			if (i < i_hi && t0 + tok < T) {
				const int4 *p = (const int4 *)(xq + (t0 + tok) * cols + i * GPUD_QK);
				a = p[0];
				b = p[1];
				dx = xd[(t0 + tok) * nb + i];
			}
			sx[kb][0][tok] = a;
			sx[kb][1][tok] = b;
			sdx[kb][tok] = dx;
		}
		__syncthreads();
		for (uint32_t kb = 0; kb < MMA_KB && i0 + kb < i_hi; kb++) {
			int c[4][4];

#pragma unroll
			for (int j = 0; j < 4; j++)
				c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0;
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				unsigned a0 = ((const unsigned *)&sw[kb][hf][wr + g])[t4];
				unsigned a1 = ((const unsigned *)&sw[kb][hf][wr + g + 8])[t4];
#pragma unroll
				for (int j = 0; j < 4; j++)
					mma_s8(c[j], a0, a1,
					       ((const unsigned *)&sx[kb][hf][wt + 8 * j + g])[t4]);
			}
			float dw0 = sdw[kb][wr + g], dw1 = sdw[kb][wr + g + 8];
#pragma unroll
			for (int j = 0; j < 4; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					float dx = sdx[kb][wt + 8 * j + 2 * t4 + (e & 1)];
					acc[j][e] = fmaf(__fmul_rn(e < 2 ? dw0 : dw1, dx),
							 i2f_exact(c[j][e]), acc[j][e]);
				}
		}
		__syncthreads();
	}
	if (n_split > 1) {
		/* this split's partials; the last CTA of the row tile adds them */
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int64_t row = r0 + wr + g + (e < 2 ? 0 : 8);
				int64_t tok = wt + 8 * j + 2 * t4 + (e & 1); /* one token tile */
				if (row < rows && tok < T)
					part[((int64_t)split * T + tok) * rows + row] = acc[j][e];
			}
		__threadfence();
		__syncthreads();
		if (tid == 0) {
			last = atomicAdd(&cnt[blockIdx.y], 1u) == n_split - 1;
			if (last)
				cnt[blockIdx.y] = 0; /* every split has arrived: ready for the next */
		}
		__syncthreads();
		if (!last)
			return;
		__threadfence();
		/* past L1 (volatile): the other CTAs wrote them; a split's
		 * loads for all 16 sums together (mmp_finish says why), each
		 * sum in split order */
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[j][e] = 0.0f;
		for (uint32_t sp = 0; sp < n_split; sp++) {
			const volatile float *vp = part + (int64_t)sp * T * rows;
#pragma unroll
			for (int j = 0; j < 4; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int64_t row = r0 + wr + g + (e < 2 ? 0 : 8);
					int64_t tok = wt + 8 * j + 2 * t4 + (e & 1);
					if (row < rows && tok < T)
						acc[j][e] += vp[tok * rows + row];
				}
		}
	}
#pragma unroll
	for (int j = 0; j < 4; j++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			int64_t row = r0 + wr + g + (e < 2 ? 0 : 8);
			int64_t tok = t0 + wt + 8 * j + 2 * t4 + (e & 1);
			if (row < rows && tok < T)
				y[tok * rows + row] = acc[j][e];
		}
}

/* --- the int8 matmul, pipelined (sm_80 and up: cp.async, m16n8k32) ---------
 * The same sums as gemm_q_kernel's, block by block in the CPU's order (the
 * CPU's bits when the columns are not split), but its loads go out ahead.
 * The first runs on an H200 found gemm_q_kernel at a seventh of the
 * device's bandwidth in decode batches of 16 to 64 tokens, and its int8
 * matmuls 76% of a batch-64 step: two CTAs of 4 warps a multiprocessor,
 * each loading a step into registers, storing it, and multiplying, with
 * nothing in flight while it multiplies. Here a CTA of 4 warps holds
 * MMP_M = 64 weight rows x 64 tokens and keeps MMP_S - 1 = 3 stages of
 * MMP_KB = 2 blocks (64 columns) in flight with cp.async while it
 * multiplies the fourth, one barrier a stage; decode batches split the
 * columns to about GPUD_CUDA_MMP_PER_SM CTAs a multiprocessor, so that
 * some 36 KB of weights a multiprocessor are on their way at any time.
 * Each warp: 32 rows x 32 tokens, an m16n8k32 per 16 x 8 tile and block
 * (a whole block in one instruction), then the block's scales. A stage's
 * rows are padded by 16 bytes: an ldmatrix phase's 8 rows read 32 banks.
 * Q4_0 stays packed in shared memory (16 bytes a block): a word's low
 * nibbles are one fragment register, its high nibbles the one 16 columns
 * on. What a warp issues a stage (nvdisasm of sm_90, Q8_0): 16 MMAs, 8
 * ldmatrix and a few scale loads, and 192 fp32 instructions that scale
 * the 64 block sums in the CPU's order (a product of the scales, the
 * sum's float, an FMA each), about 300 in all; the loads of a stage are 6
 * cp.async and their offsets (mmp_src). Before ldmatrix, the bias in the
 * MMA and mmp_src, about 480.
 *
 * Needs cols % 64 (whole stages, so the scale pairs a cp.async moves are
 * aligned) and aligned buffers (mmp_fits); other matrices take
 * gemm_q_kernel. A warp whose tokens or rows are all past the matrix only
 * loads. */
#define MMP_M GPUD_CUDA_MMP_TILE_ROWS
#define MMP_N GPUD_CUDA_MM_TILE_TOKENS
#define MMP_KB GPUD_CUDA_MMP_STEP_BLOCKS
#define MMP_S GPUD_CUDA_MMP_STAGES

template <int TYPE> struct alignas(16) mmp_stage {
	/* words of a row: MMP_KB blocks and 16 bytes of padding */
	static constexpr int WW = (TYPE == GPUD_TYPE_Q8_0 ? 8 : 4) * MMP_KB + 4;
	static constexpr int XW = 8 * MMP_KB + 4;
	unsigned w[MMP_M][WW];
	unsigned x[MMP_N][XW];
	/* scales: a token pair's two blocks (token 2p's, then 2p + 1's), a
	 * row's two halves (block 0 low) */
	float4 xd[MMP_N / 2];
	unsigned wd[MMP_M];
};
static_assert(sizeof(mmp_stage<GPUD_TYPE_Q8_0>) % 16 == 0 &&
		      sizeof(mmp_stage<GPUD_TYPE_Q4_0>) % 16 == 0,
	      "stages of whole 16-byte chunks");
static_assert(MMP_S * sizeof(mmp_stage<GPUD_TYPE_Q8_0>) + 16 <= 48 * 1024,
	      "static shared memory: no opt-in");
static_assert(MMP_M == 64 && MMP_N == 64 && MMP_KB == 2, "the warp layout and mmp_load's");

/* d = A B + I2F_BIAS, m16n8k32 (two m16n8k16 on cuemu: the same integer
 * sums): the block sums ready for i2f_biased, the bias added by the tensor
 * core from a constant accumulator, not by 32 integer adds a block. The
 * sums are exact: |A B| < 2^19, far from int32's bounds. */
static __device__ __forceinline__ void mma_s8_k32_biased(int d[4], const unsigned a[4],
							 const unsigned b[2])
{
#ifdef CUEMU_CUDA_RUNTIME_H
	d[0] = d[1] = d[2] = d[3] = I2F_BIAS;
	cuemu_mma_s8_m16n8k16(d, a[0], a[1], b[0], d);
	cuemu_mma_s8_m16n8k16(d, a[2], a[3], b[1], d);
#else
	asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
	    : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
	      "r"(I2F_BIAS));
#endif
}

/* Four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each) from
 * shared memory, a warp-collective: lane l gives the address of row l % 8
 * of matrix l / 8 (16-byte aligned) and gets word l % 4 of row l / 4 of
 * matrix i in r[i], which is an mma fragment's layout (g = l / 4, t4 = l %
 * 4) for any 4-byte elements: one instruction for what 4 loads of a word
 * each gave. */
static __device__ __forceinline__ void ldsm_x4(unsigned r[4], const void *row)
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu_ldmatrix_x4(r, row);
#else
	unsigned a = (unsigned)__cvta_generic_to_shared(row);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(a));
#endif
}

/* A thread's share of every stage, fixed before the first: its sources at
 * block 0 of its rows and tokens (a stage adds its first block's bytes)
 * and whether each is inside the matrix; rows and tokens past it are
 * zeros, their sources row 0 (cp.async reads nothing there, but wants a
 * valid address). Each of the 128 threads issues 2 (Q8_0) or 1 (Q4_0)
 * weight chunks of 16 bytes a stage, 2 activation chunks, and a scale pair
 * (threads 0-63 the rows', 64-127 the tokens'). Made once, not a stage: the
 * 64-bit offsets and bounds of every stage were a third of the kernel's
 * instructions. */
struct mmp_src {
	const uint8_t *w[2], *x[2], *d;
	bool win[2], xin[2], din;
};

template <int TYPE>
static __device__ __forceinline__ mmp_src mmp_src_of(const uint8_t *wq, const uint16_t *wd,
						     int64_t rows, int64_t cols, const int8_t *xq,
						     const float *xd, uint32_t T, int64_t r0,
						     int64_t t0, uint32_t tid)
{
	int64_t nb = cols / GPUD_QK;
	mmp_src s;

	static_assert(MMP_M == MMP_N && MMP_KB == 2, "a stage's 64-byte rows in 2 x 128 chunks");
#pragma unroll
	for (uint32_t j = 0; j < 2; j++) {
		uint32_t e = tid + 128 * j, row = e >> 2, c = e & 3;
		if (TYPE == GPUD_TYPE_Q8_0) {
			s.win[j] = r0 + row < rows;
			s.w[j] = wq + (s.win[j] ? r0 + row : 0) * cols + 16 * c;
		}
		s.xin[j] = t0 + row < T;
		s.x[j] = (const uint8_t *)xq + (s.xin[j] ? t0 + row : 0) * cols + 16 * c;
	}
	if (TYPE == GPUD_TYPE_Q4_0) { /* a chunk a block: block c of the stage */
		uint32_t row = tid >> 1, c = tid & 1;
		s.win[0] = r0 + row < rows;
		s.w[0] = wq + (s.win[0] ? r0 + row : 0) * (cols / 2) + c * (GPUD_QK / 2);
		s.win[1] = false; /* unused */
		s.w[1] = s.w[0];
	}
	if (tid < MMP_M) {
		s.din = r0 + tid < rows;
		s.d = (const uint8_t *)(wd + (s.din ? r0 + tid : 0) * nb);
	} else {
		s.din = t0 + (tid - MMP_M) < T;
		s.d = (const uint8_t *)(xd + (s.din ? t0 + (tid - MMP_M) : 0) * nb);
	}
	return s;
}

/* Stage blocks i0, i0 + 1 of the CTA's rows and tokens into st. */
template <int TYPE>
static __device__ __forceinline__ void mmp_load(mmp_stage<TYPE> &st, const mmp_src &s, int64_t i0,
						uint32_t tid)
{
	if (TYPE == GPUD_TYPE_Q8_0) {
#pragma unroll
		for (uint32_t j = 0; j < 2; j++) {
			uint32_t e = tid + 128 * j;
			cp_async<16>(&st.w[e >> 2][4 * (e & 3)], s.w[j] + i0 * GPUD_QK, s.win[j]);
		}
	} else {
		cp_async<16>(&st.w[tid >> 1][4 * (tid & 1)], s.w[0] + i0 * (GPUD_QK / 2), s.win[0]);
	}
#pragma unroll
	for (uint32_t j = 0; j < 2; j++) {
		uint32_t e = tid + 128 * j;
		cp_async<16>(&st.x[e >> 2][4 * (e & 3)], s.x[j] + i0 * GPUD_QK, s.xin[j]);
	}
	if (tid < MMP_M)
		cp_async<4>(&st.wd[tid], s.d + i0 * 2, s.din);
	else
		cp_async<8>((float *)&st.xd[(tid - MMP_M) / 2] + 2 * (tid & 1), s.d + i0 * 4, s.din);
}

/* The warp's 32 rows (wr..) x 32 tokens (wt..) over the stage's blocks:
 * acc[mi][nj] is the m16n8 tile of rows wr + 16 mi, tokens wt + 8 nj.
 * Fragments come by ldmatrix (a stage's rows are 16-byte aligned, and
 * their padding keeps each 8-row phase on 32 banks); the scales of both
 * blocks at once, a row's pair in a word, a token pair's in 16 bytes. */
template <int TYPE>
static __device__ __forceinline__ void mmp_step(const mmp_stage<TYPE> &s, uint32_t wr,
						uint32_t wt, uint32_t g, uint32_t t4,
						float acc[2][4][4])
{
	uint32_t l = 4 * g + t4, m8 = l & 7, h8 = (l >> 3) & 1, h16 = l >> 4;
	unsigned dw2[2][2];
	float4 dx4[4];

	static_assert(MMP_KB == 2, "a scale pair a row and a token");
#pragma unroll
	for (uint32_t mi = 0; mi < 2; mi++) {
		dw2[mi][0] = s.wd[wr + 16 * mi + g];
		dw2[mi][1] = s.wd[wr + 16 * mi + g + 8];
	}
#pragma unroll
	for (uint32_t nj = 0; nj < 4; nj++) /* tokens 2 t4, 2 t4 + 1: [0], [1] and [2], [3] */
		dx4[nj] = s.xd[(wt + 8 * nj + 2 * t4) / 2];
#pragma unroll
	for (uint32_t kb = 0; kb < MMP_KB; kb++) {
		unsigned a[2][4], b[4][2];

		if (TYPE == GPUD_TYPE_Q8_0) {
			/* matrices: rows g, g + 8 of the 16 (h8) by the block's
			 * low and high 16 bytes (h16) */
#pragma unroll
			for (uint32_t mi = 0; mi < 2; mi++)
				ldsm_x4(a[mi], &s.w[wr + 16 * mi + 8 * h8 + m8][8 * kb + 4 * h16]);
		} else {
			/* byte j: element j low, j + 16 high (unpack_wblock);
			 * matrices: the warp's rows by 8 */
			unsigned q[4];
			ldsm_x4(q, &s.w[wr + l][4 * kb]);
#pragma unroll
			for (uint32_t mi = 0; mi < 2; mi++) {
				unsigned lo = q[2 * mi], hi = q[2 * mi + 1];
				a[mi][0] = __vsub4(lo & 0x0f0f0f0fu, 0x08080808u);
				a[mi][1] = __vsub4(hi & 0x0f0f0f0fu, 0x08080808u);
				a[mi][2] = __vsub4((lo >> 4) & 0x0f0f0f0fu, 0x08080808u);
				a[mi][3] = __vsub4((hi >> 4) & 0x0f0f0f0fu, 0x08080808u);
			}
		}
		/* matrices: tokens of nj, nj + 1 (h16) by the block's halves (h8) */
#pragma unroll
		for (uint32_t nj = 0; nj < 4; nj += 2) {
			unsigned r[4];
			ldsm_x4(r, &s.x[wt + 8 * (nj + h16) + m8][8 * kb + 4 * h8]);
			b[nj][0] = r[0];
			b[nj][1] = r[1];
			b[nj + 1][0] = r[2];
			b[nj + 1][1] = r[3];
		}
		float dx[4][2];
#pragma unroll
		for (uint32_t nj = 0; nj < 4; nj++) {
			dx[nj][0] = kb ? dx4[nj].y : dx4[nj].x;
			dx[nj][1] = kb ? dx4[nj].w : dx4[nj].z;
		}
		/* a row half at a time: 16 block sums live, not 32 */
#pragma unroll
		for (uint32_t mi = 0; mi < 2; mi++) {
			int c[4][4];
			float dw[2];
#pragma unroll
			for (uint32_t nj = 0; nj < 4; nj++)
				mma_s8_k32_biased(c[nj], a[mi], b[nj]);
#pragma unroll
			for (uint32_t h = 0; h < 2; h++)
				dw[h] = half_bits((uint16_t)(dw2[mi][h] >> (16 * kb)));
#pragma unroll
			for (uint32_t nj = 0; nj < 4; nj++)
#pragma unroll
				for (uint32_t e = 0; e < 4; e++)
					acc[mi][nj][e] = fmaf(__fmul_rn(dw[e >> 1], dx[nj][e & 1]),
							      i2f_biased(c[nj][e]), acc[mi][nj][e]);
		}
	}
}

/* f(a, row, token) for each of the warp's 32 sums a = acc[mi][nj][e], at
 * row wr + 16 mi + g (+ 8 from e = 2) of the CTA's tile and token
 * wt + 8 nj + 2 t4 (+ 1 for odd e) of its token tile (the m16n8 C layout). */
template <class F>
static __device__ __forceinline__ void mmp_frag(float (&acc)[2][4][4], uint32_t wr, uint32_t wt,
						uint32_t g, uint32_t t4, F f)
{
#pragma unroll
	for (uint32_t mi = 0; mi < 2; mi++)
#pragma unroll
		for (uint32_t nj = 0; nj < 4; nj++)
#pragma unroll
			for (uint32_t e = 0; e < 4; e++)
				f(acc[mi][nj][e], (int64_t)(wr + 16 * mi + g + (e < 2 ? 0 : 8)),
				  (int64_t)(wt + 8 * nj + 2 * t4 + (e & 1)));
}

/* The CTA's sums to the output: store(a, row, token) for each sum of row
 * r0 + row and token t0 + token inside the matrix. Unsplit (gridDim.z 1)
 * from acc. Split-K: this split's partials to part, and the last CTA of the
 * row tile to arrive (cnt[blockIdx.y], which it resets) adds them in split
 * order (gemm_q_kernel's protocol). Every thread of the CTA calls it
 * (barriers).
 *
 * The partials of a row tile's splits lie together, split after split, a
 * split's T tokens of MMP_M rows each (T x MMP_M x gridDim.z floats a tile:
 * the set's rows x T x splits in all, as gpud_cuda_mm_splits counts them),
 * so that a thread's offsets within its split are constants of the code,
 * not registers. The last CTA's sums go by thread, not by fragment: thread
 * i takes row i % 64 of every other token from i / 64 (a warp reads 32
 * consecutive floats of a token's partials and writes 32 of its output),
 * and a split's loads for all 32 of a thread's sums go out together: one
 * memory latency a split. (A loop of splits inside each fragment's sum paid
 * one a sum: 32 to 64 L2 latencies on the last CTA at batch 64, while the
 * rest of the grid had finished.) Each sum is in split order from 0: the
 * bits do not depend on the layout. */
template <class S>
static __device__ __forceinline__ void mmp_finish(float (&acc)[2][4][4], uint32_t wr, uint32_t wt,
						  uint32_t g, uint32_t t4, int64_t r0, int64_t t0,
						  int64_t rows, uint32_t T, float *part, unsigned *cnt,
						  bool &last, S store)
{
	constexpr uint32_t LANES = 128 / MMP_M, PER = MMP_N / LANES; /* tokens a thread */
	uint32_t split = blockIdx.z, n_split = gridDim.z;
	/* the tile's partials: one token tile, t0 is 0 (gpud_cuda_mm_splits) */
	float *tile = part + (int64_t)blockIdx.y * n_split * T * MMP_M;

	static_assert(128 % MMP_M == 0 && MMP_N % LANES == 0, "the last CTA's layout");
	if (n_split == 1) {
		mmp_frag(acc, wr, wt, g, t4, [&](float &a, int64_t ro, int64_t to) {
			if (r0 + ro < rows && t0 + to < T)
				store(a, ro, to);
		});
		return;
	}
	float *mine = tile + ((int64_t)split * T + wt + 2 * t4) * MMP_M + wr + g;
	mmp_frag(acc, wr, wt, g, t4, [&](float &a, int64_t ro, int64_t to) {
		if (r0 + ro < rows && to < T)
			mine[(to - wt - 2 * t4) * MMP_M + ro - wr - g] = a;
	});
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) {
		last = atomicAdd(&cnt[blockIdx.y], 1u) == n_split - 1;
		if (last)
			cnt[blockIdx.y] = 0;
	}
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	uint32_t ro = threadIdx.x % MMP_M, to0 = threadIdx.x / MMP_M;
	uint32_t kn = T > to0 ? (T - to0 + LANES - 1) / LANES : 0; /* tokens to0 + LANES k < T */
	float v[PER];

	if (r0 + ro >= rows || !kn)
		return;
#pragma unroll
	for (uint32_t k = 0; k < PER; k++)
		v[k] = 0.0f;
	for (uint32_t sp = 0; sp < n_split; sp++) {
		/* Past L1 (ld.global.cg): the other CTAs wrote them, and the
		 * fences around the count order these loads after their
		 * stores (a fence, then the atomic; the atomic, then a fence).
		 * Not predicated: sums k >= kn load token to0's again (in L1
		 * by then) and are never stored. Loads under predicates had 5
		 * in flight (a thread has 7), not 32; loads past the thread's
		 * tokens read the next split's or the next tile's partials,
		 * which other CTAs may be writing (cuemu's race check). */
		const float *vp = tile + ((int64_t)sp * T + to0) * MMP_M + ro;
#pragma unroll
		for (uint32_t k = 0; k < PER; k++)
			v[k] += __ldcg(vp + (k < kn ? LANES * k * MMP_M : 0));
	}
#pragma unroll
	for (uint32_t k = 0; k < PER; k++)
		if (k < kn)
			store(v[k], (int64_t)ro, (int64_t)(to0 + LANES * k));
}

/* Up to 3 matrices of one type and width over the same activations (Q, K
 * and V; gate and up) in one launch: row tiles tile0[m] .. tile0[m + 1] - 1
 * of the grid are matrix m's (tile0[3] tiles in all). */
struct mmp_set {
	const uint8_t *q[3];
	const uint16_t *d[3];
	float *y[3];
	int64_t rows[3];
	uint32_t tile0[4];
};

/* The CTA's matrix of the set (selects, not an indexed parameter: no local
 * copy of the set). */
struct mmp_mat {
	const uint8_t *q;
	const uint16_t *d;
	float *y;
	int64_t rows;
	uint32_t tile0;
};

static __device__ __forceinline__ mmp_mat mmp_pick(const mmp_set &set)
{
	uint32_t m = blockIdx.y >= set.tile0[1] ? blockIdx.y >= set.tile0[2] ? 2 : 1 : 0;

	return mmp_mat{ m == 0 ? set.q[0] : m == 1 ? set.q[1] : set.q[2],
			m == 0 ? set.d[0] : m == 1 ? set.d[1] : set.d[2],
			m == 0 ? set.y[0] : m == 1 ? set.y[1] : set.y[2],
			m == 0 ? set.rows[0] : m == 1 ? set.rows[1] : set.rows[2],
			m == 0 ? set.tile0[0] : m == 1 ? set.tile0[1] : set.tile0[2] };
}

/* The CTA's place: row tile r0 of its matrix, token tile t0 (token tiles
 * on x, the fastest, as gemm_q_kernel's), its split's stages s_lo .. s_lo
 * + n - 1 of steps; busy: warp (wr, wt) has rows and tokens (warp-uniform;
 * a warp without only loads). */
struct mmp_cta {
	int64_t r0, t0, s_lo, n;
	bool busy;
};

static __device__ __forceinline__ mmp_cta mmp_place(const mmp_mat &M, int64_t steps, uint32_t wr,
						    uint32_t wt, uint32_t T)
{
	uint32_t split = blockIdx.z, n_split = gridDim.z;
	int64_t r0 = (int64_t)(blockIdx.y - M.tile0) * MMP_M, t0 = (int64_t)blockIdx.x * MMP_N;
	int64_t s_lo = steps * split / n_split;

	return mmp_cta{ r0, t0, s_lo, steps * (split + 1) / n_split - s_lo,
			t0 + wt < T && r0 + wr < M.rows };
}

template <int TYPE>
__global__ void __launch_bounds__(128)
gemm_qp_kernel(mmp_set set, int64_t cols, const int8_t *__restrict__ xq,
	       const float *__restrict__ xd, uint32_t T, float *part, unsigned *cnt)
{
	pdl_enter();
	__shared__ mmp_stage<TYPE> st[MMP_S];
	__shared__ bool last;
	uint32_t tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	uint32_t wr = ((tid >> 5) & 1) * 32, wt = (tid >> 6) * 32; /* the warp's rows, tokens */
	const mmp_mat M = mmp_pick(set);
	const uint8_t *wq = M.q;
	const uint16_t *wd = M.d;
	float *y = M.y;
	int64_t rows = M.rows;
	const mmp_cta P = mmp_place(M, cols / GPUD_QK / MMP_KB, wr, wt, T);
	int64_t r0 = P.r0, t0 = P.t0, s_lo = P.s_lo, n = P.n;
	float acc[2][4][4];

	mmp_frag(acc, wr, wt, g, t4, [](float &a, int64_t, int64_t) { a = 0.0f; });
	const mmp_src src = mmp_src_of<TYPE>(wq, wd, rows, cols, xq, xd, T, r0, t0, tid);
	/* a group per stage, empty past the split, so that the count holds */
#pragma unroll
	for (int k = 0; k < (int)MMP_S - 1; k++) {
		if (k < n)
			mmp_load<TYPE>(st[k], src, (s_lo + k) * MMP_KB, tid);
		cp_commit();
	}
	for (int64_t k = 0; k < n; k++) {
		cp_wait<MMP_S - 2>(); /* stage k has landed, for this thread */
		__syncthreads();      /* for all, and stage k - 1 is free again */
		if (k + MMP_S - 1 < n)
			mmp_load<TYPE>(st[(k + MMP_S - 1) % MMP_S], src,
				       (s_lo + k + MMP_S - 1) * MMP_KB, tid);
		cp_commit();
		if (P.busy)
			mmp_step<TYPE>(st[k % MMP_S], wr, wt, g, t4, acc);
	}
	mmp_finish(acc, wr, wt, g, t4, r0, t0, rows, T, part, cnt, last,
		   [&](float a, int64_t ro, int64_t to) { y[(t0 + to) * rows + r0 + ro] = a; });
}

template <int TYPE, bool GLU>
static cudaError_t launch_gemv(cudaStream_t s, const gemv_set &set, int64_t cols,
			       const int8_t *xq, const float *xd, uint32_t T, int8_t *yq = nullptr,
			       float *yd = nullptr, const gpud_cuda_norm *norm = nullptr)
{
	int64_t rows = GLU ? set.rows[0] : set.rows[0] + set.rows[1] + set.rows[2];
	/* a bounded grid for the NORM instances only (launch_mv_f) */
	unsigned g = gemv_grid(rows, GEMV_WARPS, GLU ? norm : nullptr);
	gpud_cuda_norm nrm = norm ? *norm : gpud_cuda_norm{};
	size_t shm = norm ? norm_smem(true, T, cols) : 0;

	if (GLU && yq) {
		g = gemv_grid(rows / GLUQ_ROWS, 1, norm);
#define GEMV(nt, nm)                                                                       \
	cudaLaunchKernelEx(klc(g, GEMV_WARPS * 32, shm, s).cfg(),                              \
			   gemv_q_gluq_kernel<TYPE, nt, nm>, set, cols, xq, xd, T, yq, yd, nrm)
#define PLAIN(nt) GEMV(nt, false)
#define NORMED(nt) GEMV(nt, true)
		return launched(norm ? NORM_BUCKET(T, NORMED) : NT_BUCKET(T, PLAIN));
#undef GEMV
	}
#define GEMV(nt, nm)                                                                   \
	cudaLaunchKernelEx(klc(g, GEMV_WARPS * 32, shm, s).cfg(),                          \
			   gemv_q_kernel<TYPE, nt, GLU, nm>, set, cols, xq, xd, T, nrm)
	/* a fused norm only before gate and up (the Q/K/V GEMV has its own) */
	if constexpr (GLU) {
		if (norm)
			return launched(NORM_BUCKET(T, NORMED));
	}
	return launched(NT_BUCKET(T, PLAIN));
#undef GEMV
#undef PLAIN
#undef NORMED
}

bool gpud_k_norm_fuses(int type, int64_t cols, uint32_t T)
{
	bool i8 = type == GPUD_TYPE_Q8_0 || type == GPUD_TYPE_Q4_0;
	bool f = type == GPUD_TYPE_F32 || type == GPUD_TYPE_F16 || type == GPUD_TYPE_BF16;

	/* int8: whole activation blocks; fp32: the GEMV's 8-element loads */
	return (i8 || f) && cols > 0 && cols % (i8 ? GPUD_QK : 8) == 0 && cols <= UINT32_MAX &&
	       T >= 1 && T <= GPUD_K_NORM_MAX_T && norm_smem(i8, T, cols) <= NORM_FUSE_SMEM;
}

static std::atomic<bool> mm_single{ false };

void gpud_k_mm_single(bool on) { mm_single.store(on, std::memory_order_relaxed); }

bool gpud_k_mm_pipelined(int64_t cols)
{
	return !mm_single.load(std::memory_order_relaxed) && cols > 0 &&
	       cols % (GPUD_QK * MMP_KB) == 0;
}

uint32_t gpud_k_mm_q_splits(int64_t rows, int64_t cols, uint32_t T,
			    const gpud_cuda_ksplit *ks)
{
	static_assert(GPUD_K_GEMV_MAX_T == GPUD_CUDA_GEMV_MAX_T, "one GEMV bound");
	if (!ks || rows <= 0 || cols <= 0)
		return 1;
	if (gpud_k_mm_pipelined(cols)) /* launch_mm_set's: rows of whole tiles */
		return gpud_cuda_mm_splits(GPUD_CUDA_MM_PIPE,
					   (uint64_t)(rows + MMP_M - 1) / MMP_M * MMP_M,
					   (uint64_t)cols, T, ks->part_floats, ks->cnt_words,
					   ks->n_sm, ks->per_sm[GPUD_CUDA_MM_PIPE]);
	return gpud_cuda_mm_splits(GPUD_CUDA_MM_SINGLE, (uint64_t)rows, (uint64_t)cols, T,
				   ks->part_floats, ks->cnt_words, ks->n_sm,
				   ks->per_sm[GPUD_CUDA_MM_SINGLE]);
}

/* The set of matrices ws[0 .. n - 1] (n <= 3) into ys: their row tiles
 * one after another on grid.y (set.tile0[3] of them; the partials of a
 * split count their rows rounded up to whole tiles, mmp_set_rows). */
static mmp_set mmp_set_of(const gpud_cuda_mat *const *ws, float *const *ys, int n)
{
	mmp_set set = {};
	uint32_t tiles = 0;

	for (int i = 0; i < 3; i++) {
		set.tile0[i] = tiles;
		if (i < n) {
			set.q[i] = (const uint8_t *)ws[i]->q;
			set.d[i] = (const uint16_t *)ws[i]->d;
			set.y[i] = ys[i];
			set.rows[i] = ws[i]->rows;
			tiles += (uint32_t)((ws[i]->rows + MMP_M - 1) / MMP_M);
		}
	}
	set.tile0[3] = tiles;
	return set;
}

static uint64_t mmp_set_rows(const mmp_set &set) { return (uint64_t)set.tile0[3] * MMP_M; }

/* Matrices 0 .. n - 1 in one launch of the pipelined kernel, the splits
 * those of all their tiles together. */
template <int TYPE>
static cudaError_t launch_mm_set(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
				 int n, const int8_t *xq, const float *xd, uint32_t T,
				 const gpud_cuda_ksplit *ks)
{
	mmp_set set = mmp_set_of(ws, ys, n);
	uint32_t tiles = set.tile0[3], nsp;

	nsp = ks ? gpud_cuda_mm_splits(GPUD_CUDA_MM_PIPE, mmp_set_rows(set),
				       (uint64_t)ws[0]->cols, T, ks->part_floats, ks->cnt_words,
				       ks->n_sm, ks->per_sm[GPUD_CUDA_MM_PIPE])
		 : 1;
	dim3 grid((T + MMP_N - 1) / MMP_N, tiles, nsp);
	return launched(cudaLaunchKernelEx(klc(grid, 128, 0, s).cfg(), gemm_qp_kernel<TYPE>, set,
					   ws[0]->cols, xq, xd, T, nsp > 1 ? ks->part : nullptr,
					   nsp > 1 ? ks->cnt : nullptr));
}

template <int TYPE>
static cudaError_t launch_mm(cudaStream_t s, const gpud_cuda_mat *w, const int8_t *xq,
			     const float *xd, uint32_t T, float *y, const gpud_cuda_ksplit *ks)
{
	const uint8_t *q = (const uint8_t *)w->q;
	const uint16_t *d = (const uint16_t *)w->d;

	if (T <= GPUD_K_GEMV_MAX_T) {
		gemv_set set = { { q }, { d }, { y }, { w->rows }, 0 };
		return launch_gemv<TYPE, false>(s, set, w->cols, xq, xd, T);
	}
	bool pipe = gpud_k_mm_pipelined(w->cols);
	int64_t tile = pipe ? MMP_M : MMA_M, row_tiles = (w->rows + tile - 1) / tile;

	if (row_tiles > 65535) /* grid.y */
		return cudaErrorInvalidValue;
	if (pipe) {
		/* what the cp.async of whole chunks and scale pairs assume; the
		 * pools align every buffer far more */
		if (((uintptr_t)q | (uintptr_t)xq) & 15 || ((uintptr_t)d & 3) || ((uintptr_t)xd & 7))
			return cudaErrorMisalignedAddress;
		return launch_mm_set<TYPE>(s, &w, &y, 1, xq, xd, T, ks);
	}
	uint32_t n = gpud_k_mm_q_splits(w->rows, w->cols, T, ks);
	dim3 grid((T + MMA_N - 1) / MMA_N, (unsigned)row_tiles, n);
	return launched(cudaLaunchKernelEx(klc(grid, 128, 0, s).cfg(), gemm_q_kernel<TYPE>, q, d,
					   w->rows, w->cols, xq, xd, T, y, n > 1 ? ks->part : nullptr,
					   n > 1 ? ks->cnt : nullptr));
}

cudaError_t gpud_k_mv_group(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
			    int n, bool glu, const float *x, const int8_t *xq, const float *xd,
			    uint32_t T, int8_t *yq, float *yd, const gpud_cuda_norm *norm, bool acc)
{
	gemv_set set = {};
	int type = ws[0]->type;
	bool q8 = type == GPUD_TYPE_Q8_0, q4 = type == GPUD_TYPE_Q4_0;

	if (n < 1 || n > 3 || (glu && n != 2) || !T || T > GPUD_K_GEMV_MAX_T || (glu && acc))
		return cudaErrorInvalidValue;
	if (yq && (!glu || !(q8 || q4) || !yd || ws[0]->rows % GLUQ_ROWS))
		return cudaErrorInvalidValue;
	if (norm && (!glu || !norm->x || !norm->w || !gpud_k_norm_fuses(type, ws[0]->cols, T)))
		return cudaErrorInvalidValue;
	if (norm && (((uintptr_t)norm->x | (uintptr_t)norm->w) & 15)) /* float4 loads */
		return cudaErrorMisalignedAddress;
	set.acc = acc ? 1 : 0;
	for (int i = 0; i < n; i++) {
		if (ws[i]->type != type || ws[i]->cols != ws[0]->cols ||
		    (glu && ws[i]->rows != ws[0]->rows))
			return cudaErrorInvalidValue;
		set.q[i] = (const uint8_t *)ws[i]->q;
		set.d[i] = (const uint16_t *)ws[i]->d;
		set.y[i] = ys[i];
		set.rows[i] = ws[i]->rows;
	}
	if (!q8 && !q4)
		return glu ? launch_mv_f_set<true>(s, type, set, ws[0]->cols, x, T, norm)
			   : launch_mv_f_set<false>(s, type, set, ws[0]->cols, x, T);
	int64_t cols = ws[0]->cols;
	if (q8)
		return glu ? launch_gemv<GPUD_TYPE_Q8_0, true>(s, set, cols, xq, xd, T, yq, yd, norm)
			   : launch_gemv<GPUD_TYPE_Q8_0, false>(s, set, cols, xq, xd, T, nullptr,
								nullptr, norm);
	return glu ? launch_gemv<GPUD_TYPE_Q4_0, true>(s, set, cols, xq, xd, T, yq, yd, norm)
		   : launch_gemv<GPUD_TYPE_Q4_0, false>(s, set, cols, xq, xd, T, nullptr, nullptr,
							norm);
}

cudaError_t gpud_k_mm_q(cudaStream_t s, const gpud_cuda_mat *w, const int8_t *xq,
			const float *xd, uint32_t T, float *y, const gpud_cuda_ksplit *ks)
{
	if (w->type == GPUD_TYPE_Q8_0)
		return launch_mm<GPUD_TYPE_Q8_0>(s, w, xq, xd, T, y, ks);
	if (w->type == GPUD_TYPE_Q4_0)
		return launch_mm<GPUD_TYPE_Q4_0>(s, w, xq, xd, T, y, ks);
	return cudaErrorInvalidValue;
}

cudaError_t gpud_k_mm_q_set(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
			    int n, const int8_t *xq, const float *xd, uint32_t T,
			    const gpud_cuda_ksplit *ks)
{
	int type = n >= 1 ? ws[0]->type : -1;
	uint64_t tiles = 0;
	bool one = n >= 2 && n <= 3 && T > GPUD_K_GEMV_MAX_T && gpud_k_mm_pipelined(ws[0]->cols) &&
		   (type == GPUD_TYPE_Q8_0 || type == GPUD_TYPE_Q4_0) &&
		   !(((uintptr_t)xq & 15) || ((uintptr_t)xd & 7));

	for (int i = 0; one && i < n; i++) {
		one = ws[i]->type == type && ws[i]->cols == ws[0]->cols &&
		      !(((uintptr_t)ws[i]->q & 15) || ((uintptr_t)ws[i]->d & 3));
		tiles += (uint64_t)(ws[i]->rows + MMP_M - 1) / MMP_M;
	}
	if (one && tiles <= 65535)
		return type == GPUD_TYPE_Q8_0
			       ? launch_mm_set<GPUD_TYPE_Q8_0>(s, ws, ys, n, xq, xd, T, ks)
			       : launch_mm_set<GPUD_TYPE_Q4_0>(s, ws, ys, n, xq, xd, T, ks);
	for (int i = 0; i < n; i++) { /* one launch each */
		cudaError_t e = gpud_k_mm_q(s, ws[i], xq, xd, T, ys[i], ks);
		if (e != cudaSuccess)
			return e;
	}
	return cudaSuccess;
}

/* --- the F16/BF16 matmul (sm_80 and up: cp.async, m16n8k16) ----------------
 * Prefill and decode batches past the GEMV of F16/BF16 weights, once
 * through cuBLAS: its cublasGemmEx asked cuBLASLt's heuristics for an
 * algorithm on every call, and they allocated host memory each time (an
 * H100 on 2026-12-06: 80,364 allocations by gpud's device thread over 800
 * requests of the tiny F16 model, the first from
 * cublasLtHSSMatmulAlgoGetHeuristic), where the step path allocates
 * nothing. Here the pipelined
 * int8 kernel's tiling over halves: a CTA of 4 warps holds MMP_M = 64
 * weight rows x 64 tokens, each warp 32 x 32, and keeps HP_S - 1 = 2 stages
 * of HP_K = 32 columns in flight with cp.async while it multiplies the
 * third. The activations come split (split_act_kernel: x = (hi + lo) s per
 * token), and every weight fragment meets both halves, so the weights are
 * read once for the ~22 bits (F16; BF16 ~16) of x that hi + lo keep; the
 * sums are fp32 (the products of halves are exact in it), scaled by s on
 * the way out. A 16 x 16 fragment of halves is the 16 x 32 fragment of
 * bytes word for word (mma_s8_k32's layout), so a stage is laid out as
 * the int8 kernel's: rows of 64 bytes padded by 16. Decode batches split
 * the columns as the int8 kernel does (gpud_cuda_mm_splits,
 * GPUD_CUDA_MM_HALF), into the same scratch.
 *
 * Needs cols % 8 (whole 16-byte chunks; a chunk past the columns is zeros)
 * and 16-byte aligned weights and halves (gpud_k_mm_h_fits); other
 * matrices take gemm_f_kernel. */
#define HP_K GPUD_CUDA_MMH_STEP_COLS
#define HP_S GPUD_CUDA_MMH_STAGES

struct alignas(16) hp_stage {
	static constexpr int W = HP_K / 2 + 4; /* words of a row: HP_K halves, 16 bytes of padding */
	unsigned w[MMP_M][W];
	unsigned xh[MMP_N][W];
	unsigned xl[MMP_N][W];
};
static_assert(HP_K == 32, "hp_load's chunks, hp_step's two k16 slices");
static_assert(HP_S * sizeof(hp_stage) + 16 <= 48 * 1024, "static shared memory: no opt-in");

/* d += A B, m16n8k16 over halves of TYPE with fp32 sums. */
template <int TYPE>
static __device__ __forceinline__ void mma_h(float d[4], const unsigned a[4], const unsigned b[2])
{
#ifdef CUEMU_CUDA_RUNTIME_H
	cuemu_mma_h_m16n8k16(d, a, b, TYPE == GPUD_TYPE_BF16);
#else
	if (TYPE == GPUD_TYPE_BF16)
		asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
		    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
	else
		asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
		    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
		    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* A thread's share of every stage (mmp_src's, for halves): 2 chunks of 16
 * bytes of each of the weights, hi and lo, at column 0 of the thread's
 * rows and tokens (rows and tokens past the matrix: row 0, zeros); a stage
 * adds its first column, and a chunk past cols is zeros. */
struct hp_src {
	const uint16_t *w[2], *xh[2], *xl[2];
	bool win[2], xin[2];
};

static __device__ __forceinline__ hp_src hp_src_of(const uint16_t *w, const uint16_t *xh,
						   const uint16_t *xl, int64_t rows, int64_t cols,
						   uint32_t T, int64_t r0, int64_t t0, uint32_t tid)
{
	hp_src s;

#pragma unroll
	for (uint32_t j = 0; j < 2; j++) {
		uint32_t e = tid + 128 * j, row = e >> 2, c = e & 3;
		/* a chunk never inside (cols < 8 c + 8) keeps column 0 */
		int64_t c8 = 8 * c < cols ? 8 * c : 0;
		s.win[j] = r0 + row < rows;
		s.xin[j] = t0 + row < T;
		s.w[j] = w + (s.win[j] ? r0 + row : 0) * cols + c8;
		s.xh[j] = xh + (s.xin[j] ? t0 + row : 0) * cols + c8;
		s.xl[j] = xl + (s.xin[j] ? t0 + row : 0) * cols + c8;
	}
	return s;
}

/* Stage columns c0 .. c0 + HP_K - 1 into st. */
static __device__ __forceinline__ void hp_load(hp_stage &st, const hp_src &s, int64_t cols,
					       int64_t c0, uint32_t tid)
{
#pragma unroll
	for (uint32_t j = 0; j < 2; j++) {
		uint32_t e = tid + 128 * j, row = e >> 2, c = e & 3;
		bool col = c0 + 8 * c < cols;
		bool w = s.win[j] && col, x = s.xin[j] && col;
		/* past cols: the thread's first chunk as the valid address */
		cp_async<16>(&st.w[row][4 * c], s.w[j] + (w ? c0 : 0), w);
		cp_async<16>(&st.xh[row][4 * c], s.xh[j] + (x ? c0 : 0), x);
		cp_async<16>(&st.xl[row][4 * c], s.xl[j] + (x ? c0 : 0), x);
	}
}

/* The warp's 32 rows (wr..) x 32 tokens (wt..) over the stage's columns,
 * each weight fragment by hi and by lo: acc as mmp_step's, its fragments
 * by ldmatrix as mmp_step's Q8_0 (a 16 x 16 fragment of halves is the
 * 16 x 32 fragment of bytes, rows of the same 80 bytes). */
template <int TYPE>
static __device__ __forceinline__ void hp_step(const hp_stage &s, uint32_t wr, uint32_t wt,
					       uint32_t g, uint32_t t4, float acc[2][4][4])
{
	uint32_t l = 4 * g + t4, m8 = l & 7, h8 = (l >> 3) & 1, h16 = l >> 4;

#pragma unroll
	for (uint32_t kk = 0; kk < HP_K / 16; kk++) {
		unsigned a[2][4], bh[4][2], bl[4][2];

#pragma unroll
		for (uint32_t mi = 0; mi < 2; mi++)
			ldsm_x4(a[mi], &s.w[wr + 16 * mi + 8 * h8 + m8][8 * kk + 4 * h16]);
#pragma unroll
		for (uint32_t nj = 0; nj < 4; nj += 2) {
			unsigned r[4];
			uint32_t N = wt + 8 * (nj + h16) + m8;
			ldsm_x4(r, &s.xh[N][8 * kk + 4 * h8]);
			bh[nj][0] = r[0];
			bh[nj][1] = r[1];
			bh[nj + 1][0] = r[2];
			bh[nj + 1][1] = r[3];
			ldsm_x4(r, &s.xl[N][8 * kk + 4 * h8]);
			bl[nj][0] = r[0];
			bl[nj][1] = r[1];
			bl[nj + 1][0] = r[2];
			bl[nj + 1][1] = r[3];
		}
#pragma unroll
		for (uint32_t mi = 0; mi < 2; mi++)
#pragma unroll
			for (uint32_t nj = 0; nj < 4; nj++) {
				mma_h<TYPE>(acc[mi][nj], a[mi], bh[nj]);
				mma_h<TYPE>(acc[mi][nj], a[mi], bl[nj]);
			}
	}
}

/* ys[m] = Ws[m] x for the set's matrices (mmp_set, its scales unused), x =
 * (xh + xl) xs[t] per token t. */
template <int TYPE>
__global__ void __launch_bounds__(128)
gemm_hp_kernel(mmp_set set, int64_t cols, const uint16_t *__restrict__ xh,
	       const uint16_t *__restrict__ xl, const float *__restrict__ xs, uint32_t T,
	       float *part, unsigned *cnt)
{
	pdl_enter();
	__shared__ hp_stage st[HP_S];
	__shared__ bool last;
	uint32_t tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
	uint32_t wr = ((tid >> 5) & 1) * 32, wt = (tid >> 6) * 32; /* the warp's rows, tokens */
	const mmp_mat M = mmp_pick(set);
	const uint16_t *w = (const uint16_t *)M.q;
	int64_t rows = M.rows;
	const mmp_cta P = mmp_place(M, (cols + HP_K - 1) / HP_K, wr, wt, T);
	int64_t r0 = P.r0, t0 = P.t0, s_lo = P.s_lo, n = P.n;
	float acc[2][4][4];

	const hp_src src = hp_src_of(w, xh, xl, rows, cols, T, r0, t0, tid);

	mmp_frag(acc, wr, wt, g, t4, [](float &a, int64_t, int64_t) { a = 0.0f; });
#pragma unroll
	for (int k = 0; k < (int)HP_S - 1; k++) {
		if (k < n)
			hp_load(st[k], src, cols, (s_lo + k) * HP_K, tid);
		cp_commit();
	}
	for (int64_t k = 0; k < n; k++) {
		cp_wait<HP_S - 2>(); /* stage k has landed, for this thread */
		__syncthreads();     /* for all, and stage k - 1 is free again */
		if (k + HP_S - 1 < n)
			hp_load(st[(k + HP_S - 1) % HP_S], src, cols, (s_lo + k + HP_S - 1) * HP_K,
				tid);
		cp_commit();
		if (P.busy)
			hp_step<TYPE>(st[k % HP_S], wr, wt, g, t4, acc);
	}
	mmp_finish(acc, wr, wt, g, t4, r0, t0, rows, T, part, cnt, last,
		   [&](float a, int64_t ro, int64_t to) {
			   M.y[(t0 + to) * rows + r0 + ro] = a * xs[t0 + to];
		   });
}

bool gpud_k_mm_h_fits(const gpud_cuda_mat *w)
{
	return (w->type == GPUD_TYPE_F16 || w->type == GPUD_TYPE_BF16) && w->cols > 0 &&
	       w->cols % 8 == 0 && !((uintptr_t)w->q & 15) &&
	       (uint64_t)(w->rows + MMP_M - 1) / MMP_M <= 65535;
}

cudaError_t gpud_k_mm_occupancy(uint32_t per_sm[3])
{
	int n[3] = { 0, 0, 0 };
	cudaError_t e;

	/* 128 threads a CTA, static shared memory only (every one of them) */
	if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		     &n[GPUD_CUDA_MM_PIPE], gemm_qp_kernel<GPUD_TYPE_Q8_0>, 128, 0)) != cudaSuccess ||
	    (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		     &n[GPUD_CUDA_MM_SINGLE], gemm_q_kernel<GPUD_TYPE_Q8_0>, 128, 0)) != cudaSuccess ||
	    (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
		     &n[GPUD_CUDA_MM_HALF], gemm_hp_kernel<GPUD_TYPE_F16>, 128, 0)) != cudaSuccess)
		return e;
	for (int k = 0; k < 3; k++)
		per_sm[k] = n[k] > 0 ? (uint32_t)n[k] : 1;
	return cudaSuccess;
}

uint32_t gpud_k_mm_h_splits(int64_t rows, int64_t cols, uint32_t T,
			    const gpud_cuda_ksplit *ks)
{
	if (!ks || rows <= 0 || cols <= 0)
		return 1;
	return gpud_cuda_mm_splits(GPUD_CUDA_MM_HALF, (uint64_t)(rows + MMP_M - 1) / MMP_M * MMP_M,
				   (uint64_t)cols, T, ks->part_floats, ks->cnt_words, ks->n_sm,
				   ks->per_sm[GPUD_CUDA_MM_HALF]);
}

cudaError_t gpud_k_mm_h_set(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
			    int n, const void *hi, const void *lo, const float *scales, uint32_t T,
			    const gpud_cuda_ksplit *ks)
{
	if (n < 1 || n > 3 || !T)
		return cudaErrorInvalidValue;
	if (((uintptr_t)hi | (uintptr_t)lo) & 15)
		return cudaErrorMisalignedAddress;
	for (int i = 0; i < n; i++)
		if (!gpud_k_mm_h_fits(ws[i]) || ws[i]->type != ws[0]->type ||
		    ws[i]->cols != ws[0]->cols)
			return cudaErrorInvalidValue;

	mmp_set set = mmp_set_of(ws, ys, n);
	uint32_t tiles = set.tile0[3], nsp;

	if (tiles > 65535)
		return cudaErrorInvalidValue;
	nsp = gpud_k_mm_h_splits(mmp_set_rows(set), ws[0]->cols, T, ks);
	dim3 grid((T + MMP_N - 1) / MMP_N, tiles, nsp);
	auto k = ws[0]->type == GPUD_TYPE_BF16 ? gemm_hp_kernel<GPUD_TYPE_BF16>
					       : gemm_hp_kernel<GPUD_TYPE_F16>;
	return launched(cudaLaunchKernelEx(klc(grid, 128, 0, s).cfg(), k, set, ws[0]->cols,
					   (const uint16_t *)hi, (const uint16_t *)lo, scales, T,
					   nsp > 1 ? ks->part : nullptr, nsp > 1 ? ks->cnt : nullptr));
}

cudaError_t gpud_k_mv_qkv(cudaStream_t s, const gpud_cuda_mat *const *ws, float *q,
			  const float *x, const int8_t *xq, const float *xd, uint32_t T,
			  const gpud_cuda_meta *m, const gpud_cuda_rope *rope,
			  const gpud_cuda_kvshape *kv, const gpud_cuda_norm *norm)
{
	gemv_set set = {};
	int type = ws[0]->type;
	uint32_t hd = kv->head_dim;
	int64_t cols = ws[0]->cols, pairs;
	rope_args ra = { *m, *kv, *rope, q };
	gpud_cuda_norm nrm = norm ? *norm : gpud_cuda_norm{};
	bool i8 = type == GPUD_TYPE_Q8_0 || type == GPUD_TYPE_Q4_0;
	size_t shm = norm ? norm_smem(i8, T, cols) : 0;

	if (!T || T > GPUD_K_GEMV_MAX_T || !hd || hd % 2 || hd > GPUD_CUDA_MAX_HEAD_DIM ||
	    ws[0]->rows != (int64_t)kv->n_heads * hd || ws[1]->rows != (int64_t)kv->n_kv_heads * hd ||
	    ws[2]->rows != ws[1]->rows)
		return cudaErrorInvalidValue;
	if (norm && (!norm->x || !norm->w || !gpud_k_norm_fuses(type, cols, T)))
		return cudaErrorInvalidValue;
	if (norm && (((uintptr_t)norm->x | (uintptr_t)norm->w) & 15)) /* float4 loads */
		return cudaErrorMisalignedAddress;
	for (int i = 0; i < 3; i++) {
		if (ws[i]->type != type || ws[i]->cols != cols)
			return cudaErrorInvalidValue;
		set.q[i] = (const uint8_t *)ws[i]->q;
		set.d[i] = (const uint16_t *)ws[i]->d;
		set.rows[i] = ws[i]->rows;
	}
	pairs = (set.rows[0] + set.rows[1] + set.rows[2]) / 2;
	unsigned g = gemv_grid(pairs, 8, norm); /* 8 warps a CTA, GEMV_WARPS for int8 */
	static_assert(GEMV_WARPS == 8, "one grid for both kernels");

#define QKV_Q(ty, nt, nm)                                                                 \
	cudaLaunchKernelEx(klc(g, 256, shm, s).cfg(), gemv_q_qkv_kernel<ty, nt, nm>, set, cols, \
			   xq, xd, T, ra, nrm)
#define QKV_F(ty, vec, nt, nm)                                                           \
	cudaLaunchKernelEx(klc(g, 256, shm, s).cfg(), gemv_f_qkv_kernel<ty, nt, vec, nm>, set, \
			   cols, x, T, ra, nrm)
#define Q8(nt) QKV_Q(GPUD_TYPE_Q8_0, nt, false)
#define Q4(nt) QKV_Q(GPUD_TYPE_Q4_0, nt, false)
#define Q8N(nt) QKV_Q(GPUD_TYPE_Q8_0, nt, true)
#define Q4N(nt) QKV_Q(GPUD_TYPE_Q4_0, nt, true)
#define F32V(nt) QKV_F(GPUD_TYPE_F32, true, nt, false)
#define F32S(nt) QKV_F(GPUD_TYPE_F32, false, nt, false)
#define F16V(nt) QKV_F(GPUD_TYPE_F16, true, nt, false)
#define F16S(nt) QKV_F(GPUD_TYPE_F16, false, nt, false)
#define BF16V(nt) QKV_F(GPUD_TYPE_BF16, true, nt, false)
#define BF16S(nt) QKV_F(GPUD_TYPE_BF16, false, nt, false)
#define F32N(nt) QKV_F(GPUD_TYPE_F32, true, nt, true)
#define F16N(nt) QKV_F(GPUD_TYPE_F16, true, nt, true)
#define BF16N(nt) QKV_F(GPUD_TYPE_BF16, true, nt, true)
	bool vec = cols % 8 == 0; /* 8-element loads need rows of a multiple of 8 */
	switch (type) {
	case GPUD_TYPE_Q8_0:
		return launched(norm ? NORM_BUCKET(T, Q8N) : NT_BUCKET(T, Q8));
	case GPUD_TYPE_Q4_0:
		return launched(norm ? NORM_BUCKET(T, Q4N) : NT_BUCKET(T, Q4));
	/* a norm: vec (gpud_k_norm_fuses) */
	case GPUD_TYPE_F32:
		return launched(norm  ? NORM_BUCKET(T, F32N)
				: vec ? NT_BUCKET(T, F32V)
				      : NT_BUCKET(T, F32S));
	case GPUD_TYPE_F16:
		return launched(norm  ? NORM_BUCKET(T, F16N)
				: vec ? NT_BUCKET(T, F16V)
				      : NT_BUCKET(T, F16S));
	case GPUD_TYPE_BF16:
		return launched(norm  ? NORM_BUCKET(T, BF16N)
				: vec ? NT_BUCKET(T, BF16V)
				      : NT_BUCKET(T, BF16S));
	default:
		return cudaErrorInvalidValue;
	}
#undef Q8
#undef Q4
#undef Q8N
#undef Q4N
#undef F32V
#undef F32S
#undef F16V
#undef F16S
#undef BF16V
#undef BF16S
#undef F32N
#undef F16N
#undef BF16N
#undef QKV_Q
#undef QKV_F
}
