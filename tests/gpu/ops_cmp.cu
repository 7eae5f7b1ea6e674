// ops_cmp.cu - the CUDA backend's kernels one by one against the CPU
// backend's, on random inputs (issue 12's "each op against the CPU
// backend, every weight type"). Host code only: it calls the launchers of
// kernels.cuh on device buffers. Built by nvcc with the backend (tests/gpu/
// run runs it on the GPU) and through cu2cc.py on cuemu (tests/cuemu/run).
//
//   ops_cmp [--seed S]
//
// Each check prints its worst error and bound; the exit status is 1 when
// any is past its bound. The matmuls compare with gpud_matmul:
//   - Q8_0/Q4_0 (int8 path): the GPU quantizes the activations as the CPU
//     does, so the integer sums are equal and only the fp32 order of the
//     per-block terms may differ. The GEMV (T <= 8) adds per-lane partial
//     sums: bound 1e-5 of the row's largest output. The tensor-core kernel
//     (T > 8) keeps the CPU's order: bound 0, the CPU's bits.
//   - F32/F16/BF16, T <= 8: the fp32 GEMV, 1e-5.
//   - F32, T > 8: the tiled fp32 kernel, 1e-5.
//   - F16/BF16, T > 8: the tensor-core kernel over activations split into
//     hi + lo halves (about 22 and 16 bits of each activation), as
//     backend.cu calls it: 1e-5 and 1e-4; split over the columns for 9 ..
//     64 tokens (gpud_k_mm_h_splits), the same bits twice; a width that
//     is not whole 16-byte chunks (cols % 8) takes the tiled fp32 kernel.
//   - Q8_0/Q4_0, 9 .. 64 tokens: the tensor-core kernel with its columns
//     split (gpud_k_mm_q_splits), whose partials add in a fixed order: the
//     GEMV's bound, and the same bits twice.
//   Both tensor-core kernels: the pipelined one (cols % 64 == 0), and the
//   single-buffered one on a width it alone takes and, forced with
//   gpud_k_mm_single, on the widths the other takes.
// RMSNorm (+ residual), SwiGLU and the embedding rows of every type are
// checked against the same computations written here (the CPU's formulas).
// The fused kernels (GEMVs of several matrices in one launch, gate/up with
// SwiGLU, RMSNorm with the int8 quantization) must give the bits of the
// kernels they fuse: bound 0 differing elements.
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gpud/backend/cpu/kernels.h"
#include "gpud/backend/cpu/rope.h"
#include "gpud/quant.h"
#include "gpud/sampler.h"
}
#include "gpud/backend/cuda/cuda_impl.h"
#include "gpud/backend/cuda/kernels.cuh"

namespace {

int failures;
gpud_cuda_ksplit ksplit; // the int8 matmul's split-K scratch (main)
uint64_t rng = 0x243f6a8885a308d3ull;

uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

void *dev(size_t n)
{
	void *p = nullptr;

	if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
		fprintf(stderr, "ops_cmp: cudaMalloc of %zu bytes failed\n", n);
		exit(2);
	}
	return p;
}

void up(void *d, const void *h, size_t n)
{
	if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) {
		fprintf(stderr, "ops_cmp: upload failed\n");
		exit(2);
	}
}

bool down(void *h, const void *d, size_t n, const char *what)
{
	cudaError_t e = cudaDeviceSynchronize();

	if (e == cudaSuccess)
		e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
	if (e != cudaSuccess) {
		printf("ops_cmp: %-44s FAIL: %s\n", what, cudaGetErrorString(e));
		failures++;
		return false;
	}
	return true;
}

void report(const char *what, double worst, double bound)
{
	bool ok = worst <= bound; // NaN fails

	printf("ops_cmp: %-44s worst %.3g (bound %.0e)%s\n", what, worst, bound,
	       ok ? "" : "  FAIL");
	if (!ok)
		failures++;
}

// Elements of n bytes each that differ between a and b (below).
size_t bits_differ(const void *a, const void *b, size_t n, size_t size);

// Worst over the T rows of (T, n) outputs of max |a - b| / max |b|.
double rel_rows(const float *a, const float *b, uint32_t T, int64_t n)
{
	double worst = 0;

	for (uint32_t t = 0; t < T; t++) {
		double dmax = 0, bmax = 0;
		for (int64_t i = 0; i < n; i++) {
			double d = fabs((double)a[t * n + i] - b[t * n + i]);
			if (!(d == d))
				d = INFINITY;
			dmax = d > dmax ? d : dmax;
			bmax = fabs(b[t * n + i]) > bmax ? fabs(b[t * n + i]) : bmax;
		}
		double r = bmax > 0 ? dmax / bmax : dmax;
		worst = r > worst ? r : worst;
	}
	return worst;
}

// A random rows x cols matrix of type t in the file's layout, and the
// device's (cuda_impl.h: Q8_0/Q4_0 as a quants region then fp16 scales).
struct mat {
	enum gpud_type t;
	int64_t rows, cols;
	void *host;      // file layout
	void *dq, *dd;   // device quants (or elements), scales
};

mat make_mat(enum gpud_type t, int64_t rows, int64_t cols)
{
	mat m = { t, rows, cols, nullptr, nullptr, nullptr };
	size_t rb = gpud_type_row_bytes(t, (uint64_t)cols);
	float *row = (float *)malloc(sizeof(float) * cols);

	m.host = malloc(rb * rows);
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t c = 0; c < cols; c++)
			row[c] = frand() * (1.0f + (float)(r % 7)); // rows of different scales
		gpud_quantize_row(t, row, (uint8_t *)m.host + r * rb, cols);
	}
	free(row);
	if (t != GPUD_TYPE_Q8_0 && t != GPUD_TYPE_Q4_0) {
		m.dq = dev(rb * rows);
		up(m.dq, m.host, rb * rows);
		return m;
	}
	int64_t nb = cols / GPUD_QK, qrow = t == GPUD_TYPE_Q8_0 ? 32 : 16;
	size_t bsz = gpud_type_block_bytes(t);
	uint8_t *q = (uint8_t *)malloc(rows * nb * qrow), *d = (uint8_t *)malloc(rows * nb * 2);
	for (int64_t i = 0; i < rows * nb; i++) {
		const uint8_t *blk = (const uint8_t *)m.host + i * bsz;
		memcpy(d + i * 2, blk, 2);
		memcpy(q + i * qrow, blk + 2, qrow);
	}
	m.dq = dev(rows * nb * qrow);
	m.dd = dev(rows * nb * 2);
	up(m.dq, q, rows * nb * qrow);
	up(m.dd, d, rows * nb * 2);
	free(q);
	free(d);
	return m;
}

void free_mat(mat &m)
{
	free(m.host);
	cudaFree(m.dq);
	cudaFree(m.dd);
}

gpud_cuda_mat dmat(const mat &m)
{
	return gpud_cuda_mat{ (int)m.t, m.rows, m.cols, m.dq, m.dd };
}

// y = W x on the CPU backend (gpud_matmul, one thread).
void cpu_mm(const mat &m, const float *x, uint32_t T, float *y)
{
	size_t sb = gpud_matmul_scratch_bytes(m.t, m.cols, T);
	void *scratch = sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : nullptr;

	gpud_matmul(nullptr, m.t, m.host, m.rows, m.cols, x, T, y, scratch);
	free(scratch);
}

// y = W x on the device, as backend.cu's mm() and prep() do it.
void gpu_mm(const mat &m, const float *dx, uint32_t T, float *dy)
{
	gpud_cuda_mat w = dmat(m);

	switch (m.t) {
	case GPUD_TYPE_Q8_0:
	case GPUD_TYPE_Q4_0: {
		int8_t *q = (int8_t *)dev((size_t)T * m.cols);
		float *d = (float *)dev((size_t)T * (m.cols / GPUD_QK) * 4);
		gpud_k_quantize_act(0, dx, T, (uint32_t)m.cols, q, d);
		gpud_k_mm_q(0, &w, q, d, T, dy, &ksplit);
		cudaDeviceSynchronize();
		cudaFree(q);
		cudaFree(d);
		break;
	}
	default:
		if (T <= 8) {
			gpud_k_mv_f(0, &w, dx, T, dy);
		} else if (gpud_k_mm_h_fits(&w)) {
			// F16/BF16: the activations split, then the tensor cores
			size_t half = (size_t)T * m.cols * 2;
			void *hi = dev(half), *lo = dev(half);
			float *sc = (float *)dev(4 * T);
			const gpud_cuda_mat *wp = &w;

			gpud_k_split_act(0, dx, T, (uint32_t)m.cols, m.t, hi, lo, sc);
			gpud_k_mm_h_set(0, &wp, &dy, 1, hi, lo, sc, T, &ksplit);
			cudaDeviceSynchronize();
			cudaFree(hi);
			cudaFree(lo);
			cudaFree(sc);
		} else {
			gpud_k_mm_f(0, &w, dx, T, dy);
		}
		break;
	}
}

void check_matmul(enum gpud_type t, int64_t rows, int64_t cols, uint32_t T)
{
	mat m = make_mat(t, rows, cols);
	float *x = (float *)malloc(sizeof(float) * T * cols);
	float *yc = (float *)malloc(sizeof(float) * T * rows);
	float *yg = (float *)malloc(sizeof(float) * T * rows);
	float *dx = (float *)dev(sizeof(float) * T * cols);
	float *dy = (float *)dev(sizeof(float) * T * rows);
	char what[128];

	for (int64_t i = 0; i < T * cols; i++)
		x[i] = frand() * 3.0f;
	up(dx, x, sizeof(float) * T * cols);
	cpu_mm(m, x, T, yc);
	snprintf(what, sizeof(what), "matmul %s %lldx%lld, %u tokens", gpud_type_name(t),
		 (long long)rows, (long long)cols, T);
	bool i8 = t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0;
	gpud_cuda_mat wm = dmat(m);
	bool tc = gpud_k_mm_h_fits(&wm) && T > 8; // the F16/BF16 tensor-core kernel
	uint32_t splits = i8   ? gpud_k_mm_q_splits(rows, cols, T, &ksplit)
			  : tc ? gpud_k_mm_h_splits(rows, cols, T, &ksplit)
			       : 1;
	const char *kind = i8 ? gpud_k_mm_pipelined(cols) ? "pipelined" : "single-buffered"
		      : tc    ? "tensor cores"
			      : "fp32";
	if (T > 8)
		snprintf(what + strlen(what), sizeof(what) - strlen(what), ", %s", kind);
	if (splits > 1)
		snprintf(what + strlen(what), sizeof(what) - strlen(what), ", %u splits", splits);
	gpu_mm(m, dx, T, dy);
	if (down(yg, dy, sizeof(float) * T * rows, what))
		report(what, rel_rows(yg, yc, T, rows),
		       i8 && T > 8 && splits == 1 ? 0 /* the tensor-core kernel: the CPU's bits */
		       : t == GPUD_TYPE_BF16 && T > 8 ? 1e-4
						      : 1e-5);
	if (splits > 1) {
		/* the splits add in one order: the same bits again; counters at 0 */
		float *y2 = (float *)malloc(sizeof(float) * T * rows);
		unsigned c[256];
		uint32_t nc = (uint32_t)((rows + 31) / 32);
		size_t nz = 0;

		snprintf(what, sizeof(what), "matmul %s %lldx%lld, %u tok, %s: repeatable, counters 0",
			 gpud_type_name(t), (long long)rows, (long long)cols, T, kind);
		gpu_mm(m, dx, T, dy);
		if (nc <= 256 && down(y2, dy, sizeof(float) * T * rows, what) &&
		    down(c, ksplit.cnt, 4 * nc, what)) {
			for (uint32_t i = 0; i < nc; i++)
				nz += c[i] != 0;
			report(what, (double)(bits_differ(yg, y2, (size_t)T * rows, 4) + nz), 0);
		}
		/* and with a scratch of just these partials (a device region
		 * ends there: cuemu's guard page, the GPU's memcheck): the
		 * last CTA's loads stay inside it */
		gpud_cuda_ksplit saved = ksplit;
		bool whole = !(i8 && !gpud_k_mm_pipelined(cols)); /* rows of whole tiles */
		uint64_t rr = whole ? (uint64_t)(rows + 63) / 64 * 64 : (uint64_t)rows;

		ksplit.part_floats = (uint64_t)splits * T * rr;
		ksplit.part = (float *)dev(4 * ksplit.part_floats);
		snprintf(what, sizeof(what), "matmul %s %lldx%lld, %u tok, %s: a scratch of its size",
			 gpud_type_name(t), (long long)rows, (long long)cols, T, kind);
		uint32_t again = i8 ? gpud_k_mm_q_splits(rows, cols, T, &ksplit)
				    : gpud_k_mm_h_splits(rows, cols, T, &ksplit);
		gpu_mm(m, dx, T, dy);
		if (down(y2, dy, sizeof(float) * T * rows, what))
			report(what,
			       (double)(bits_differ(yg, y2, (size_t)T * rows, 4) + (again != splits)),
			       0);
		cudaFree(ksplit.part);
		ksplit = saved;
		free(y2);
	}
	free(x);
	free(yc);
	free(yg);
	cudaFree(dx);
	cudaFree(dy);
	free_mat(m);
}

void check_rmsnorm(uint32_t n, uint32_t dim, bool add)
{
	float *x = (float *)malloc(4 * n * dim), *o = (float *)malloc(4 * n * dim);
	float *w = (float *)malloc(4 * dim), *want = (float *)malloc(4 * n * dim);
	float *got = (float *)malloc(4 * n * dim), *gx = (float *)malloc(4 * n * dim);
	float *dx = (float *)dev(4 * n * dim), *dout = (float *)dev(4 * n * dim);
	float *dw = (float *)dev(4 * dim);
	const float eps = 1e-5f;
	char what[96];

	for (uint32_t i = 0; i < n * dim; i++) {
		x[i] = frand() * 4;
		o[i] = frand();
	}
	for (uint32_t i = 0; i < dim; i++)
		w[i] = 1.0f + frand() * 0.5f;
	up(dx, x, 4 * n * dim);
	up(dout, o, 4 * n * dim);
	up(dw, w, 4 * dim);
	for (uint32_t r = 0; r < n; r++) { // forward.c: x += out; out = rmsnorm(x) * w
		float *xr = x + (size_t)r * dim, *orow = o + (size_t)r * dim;
		double ss = 0;
		for (uint32_t i = 0; i < dim; i++) {
			if (add)
				xr[i] += orow[i];
			ss += (double)xr[i] * xr[i];
		}
		float sc = (float)(1.0 / sqrt(ss / dim + (double)eps));
		for (uint32_t i = 0; i < dim; i++)
			want[(size_t)r * dim + i] = xr[i] * sc * w[i];
	}
	gpud_k_add_norm(0, dx, dout, dw, add, nullptr, n, dim, eps, nullptr, nullptr);
	snprintf(what, sizeof(what), "rmsnorm%s %u x %u", add ? " + residual" : "", n, dim);
	if (down(got, dout, 4 * n * dim, what) && down(gx, dx, 4 * n * dim, what)) {
		double e = rel_rows(got, want, n, dim), ex = rel_rows(gx, x, n, dim);
		report(what, e > ex ? e : ex, 1e-6);
	}
	free(x);
	free(o);
	free(w);
	free(want);
	free(got);
	free(gx);
	cudaFree(dx);
	cudaFree(dout);
	cudaFree(dw);
}

void check_swiglu(uint64_t n)
{
	float *a = (float *)malloc(4 * n), *b = (float *)malloc(4 * n), *g = (float *)malloc(4 * n);
	float *da = (float *)dev(4 * n), *db = (float *)dev(4 * n);

	for (uint64_t i = 0; i < n; i++) {
		a[i] = frand() * 8;
		b[i] = frand() * 2;
	}
	up(da, a, 4 * n);
	up(db, b, 4 * n);
	gpud_k_swiglu(0, da, db, n);
	if (down(g, da, 4 * n, "swiglu")) {
		double worst = 0;
		for (uint64_t i = 0; i < n; i++) {
			double want = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
			double e = fabs(g[i] - want) / (fabs(want) > 1e-3 ? fabs(want) : 1e-3);
			worst = e > worst || !(e == e) ? e : worst;
		}
		report("swiglu (relative, per element)", worst, 1e-5);
	}
	free(a);
	free(b);
	free(g);
	cudaFree(da);
	cudaFree(db);
}

// Count of elements where a and b differ in their bits (NaNs equal).
size_t bits_differ(const void *a, const void *b, size_t n, size_t size)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += memcmp((const char *)a + i * size, (const char *)b + i * size, size) != 0;
	return k;
}

// RMSNorm with the int8 quantization fused: the bits of rmsnorm then
// gpud_k_quantize_act.
void check_norm_quant(uint32_t n, uint32_t dim, bool add)
{
	size_t nd = (size_t)n * dim, nb = nd / GPUD_QK;
	float *x = (float *)malloc(4 * nd), *o = (float *)malloc(4 * nd), *w = (float *)malloc(4 * dim);
	float *dx = (float *)dev(4 * nd), *dout = (float *)dev(4 * nd), *dw = (float *)dev(4 * dim);
	int8_t *q1 = (int8_t *)dev(nd), *q2 = (int8_t *)dev(nd);
	float *d1 = (float *)dev(4 * nb), *d2 = (float *)dev(4 * nb);
	int8_t *h1 = (int8_t *)malloc(nd), *h2 = (int8_t *)malloc(nd);
	float *e1 = (float *)malloc(4 * nb), *e2 = (float *)malloc(4 * nb);
	char what[96];

	for (size_t i = 0; i < nd; i++) {
		x[i] = frand() * 4;
		o[i] = frand();
	}
	for (size_t i = 0; i < 32; i++)
		x[i] = 0.0f; /* a row's first block all zero after the norm: d = 0 */
	for (uint32_t i = 0; i < dim; i++)
		w[i] = i < 32 ? 0.0f : 1.0f + frand() * 0.5f;
	up(dw, w, 4 * dim);
	/* unfused: rmsnorm, then quantize */
	up(dx, x, 4 * nd);
	up(dout, o, 4 * nd);
	gpud_k_add_norm(0, dx, dout, dw, add, nullptr, n, dim, 1e-5f, nullptr, nullptr);
	gpud_k_quantize_act(0, dout, n, dim, q1, d1);
	/* fused */
	up(dx, x, 4 * nd);
	up(dout, o, 4 * nd);
	gpud_k_add_norm(0, dx, dout, dw, add, nullptr, n, dim, 1e-5f, q2, d2);
	snprintf(what, sizeof(what), "rmsnorm%s + quantize fused, %u x %u", add ? " + residual" : "",
		 n, dim);
	if (down(h1, q1, nd, what) && down(h2, q2, nd, what) && down(e1, d1, 4 * nb, what) &&
	    down(e2, d2, 4 * nb, what))
		report(what, (double)(bits_differ(h1, h2, nd, 1) + bits_differ(e1, e2, nb, 4)), 0);
	free(x);
	free(o);
	free(w);
	free(h1);
	free(h2);
	free(e1);
	free(e2);
	cudaFree(dx);
	cudaFree(dout);
	cudaFree(dw);
	cudaFree(q1);
	cudaFree(q2);
	cudaFree(d1);
	cudaFree(d2);
}

// Three matrices of type t, 72, 64 and 64 rows of 320 columns (a tile and
// a part, then whole tiles), and T tokens of random activations on the
// host and the device, quantized: what the checks of several matrices in
// one launch share.
struct three_mats {
	static constexpr int64_t cols = 320;
	const int64_t rows[3] = { 72, 64, 64 };
	mat m[3];
	gpud_cuda_mat w[3];
	const gpud_cuda_mat *ws[3];
	size_t ny; // floats of the largest output
	float *x, *dx, *d;
	int8_t *q;

	three_mats(enum gpud_type t, uint32_t T)
	    : m{ make_mat(t, rows[0], cols), make_mat(t, rows[1], cols),
		 make_mat(t, rows[2], cols) },
	      w{ dmat(m[0]), dmat(m[1]), dmat(m[2]) }, ws{ &w[0], &w[1], &w[2] },
	      ny((size_t)T * rows[0]), x((float *)malloc(4 * T * cols)),
	      dx((float *)dev(4 * T * cols)), d((float *)dev(4 * (size_t)T * (cols / GPUD_QK))),
	      q((int8_t *)dev((size_t)T * cols))
	{
		for (int64_t i = 0; i < T * cols; i++)
			x[i] = frand() * 3.0f;
		up(dx, x, 4 * T * cols);
		gpud_k_quantize_act(0, dx, T, (uint32_t)cols, q, d);
	}
	~three_mats()
	{
		free(x);
		cudaFree(dx);
		cudaFree(q);
		cudaFree(d);
		for (int i = 0; i < 3; i++)
			free_mat(m[i]);
	}
	three_mats(const three_mats &) = delete;
	three_mats &operator=(const three_mats &) = delete;
};

// The tensor-core matmuls of several matrices over the same activations
// in one launch (gpud_k_mm_q_set, gpud_k_mm_h_set; Q, K and V, gate and
// up) against one launch each: unsplit (T > 64) the same bits; split, the
// splits are the set's, so within the GEMV's bound of the separate ones
// and the same bits twice. Rows of 72, 64 and 64 (a tile and a part, then
// whole tiles).
void check_mm_set(enum gpud_type t, uint32_t T)
{
	three_mats f(t, T);
	float *sep[3], *grp[3], *grp2[3], *hs = (float *)malloc(4 * f.ny);
	float *hg = (float *)malloc(4 * f.ny), *hg2 = (float *)malloc(4 * f.ny);
	double worst = 0;
	size_t diff = 0, again = 0;
	char what[96];
	bool ok;

	bool i8 = t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0;
	void *hi = dev((size_t)T * f.cols * 2), *lo = dev((size_t)T * f.cols * 2);
	float *sc = (float *)dev(4 * T);
	auto set = [&](const gpud_cuda_mat *const *ws, float *const *ys, int n) {
		return i8 ? gpud_k_mm_q_set(0, ws, ys, n, f.q, f.d, T, &ksplit)
			  : gpud_k_mm_h_set(0, ws, ys, n, hi, lo, sc, T, &ksplit);
	};

	if (!i8)
		gpud_k_split_act(0, f.dx, T, (uint32_t)f.cols, t, hi, lo, sc);
	for (int i = 0; i < 3; i++) {
		sep[i] = (float *)dev(4 * f.ny);
		grp[i] = (float *)dev(4 * f.ny);
		grp2[i] = (float *)dev(4 * f.ny);
		if (i8)
			gpud_k_mm_q(0, &f.w[i], f.q, f.d, T, sep[i], &ksplit);
		else
			set(&f.ws[i], &sep[i], 1);
	}
	snprintf(what, sizeof(what), "matmul %s x3 in one launch, %u tokens", gpud_type_name(t), T);
	ok = set(f.ws, grp, 3) == cudaSuccess && set(f.ws, grp2, 3) == cudaSuccess;
	for (int i = 0; ok && i < 3; i++) {
		size_t k = (size_t)T * f.rows[i];
		ok = down(hs, sep[i], 4 * k, what) && down(hg, grp[i], 4 * k, what) &&
		     down(hg2, grp2[i], 4 * k, what);
		if (!ok)
			break;
		diff += bits_differ(hs, hg, k, 4);
		again += bits_differ(hg, hg2, k, 4);
		double e = rel_rows(hg, hs, T, f.rows[i]);
		worst = e > worst || e != e ? e : worst;
	}
	report(what, ok ? T > 64 ? (double)diff : worst : INFINITY, T > 64 ? 0 : 1e-5);
	snprintf(what, sizeof(what), "matmul %s x3 in one launch, %u tokens: repeatable",
		 gpud_type_name(t), T);
	report(what, ok ? (double)again : INFINITY, 0);
	free(hs);
	free(hg);
	free(hg2);
	cudaFree(hi);
	cudaFree(lo);
	cudaFree(sc);
	for (int i = 0; i < 3; i++) {
		cudaFree(sep[i]);
		cudaFree(grp[i]);
		cudaFree(grp2[i]);
	}
}

// Decode GEMVs of several matrices in one launch, and gate/up with SwiGLU
// fused: the bits of the separate GEMVs (and gpud_k_swiglu).
void check_gemv_group(enum gpud_type t, uint32_t T)
{
	three_mats f(t, T);
	const int64_t *rows = f.rows;
	const gpud_cuda_mat *const *ws = f.ws;
	const gpud_cuda_mat *w = f.w;
	const float *dx = f.dx, *d = f.d;
	const int8_t *q = f.q;
	size_t ny = f.ny;
	float *sep[3], *grp[3], *hs = (float *)malloc(4 * ny), *hg = (float *)malloc(4 * ny);
	size_t diff = 0;
	char what[96];
	bool ok = true;

	bool i8 = t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0;

	for (int i = 0; i < 3; i++) {
		sep[i] = (float *)dev(4 * ny);
		grp[i] = (float *)dev(4 * ny);
		if (i8)
			gpud_k_mm_q(0, &w[i], q, d, T, sep[i], &ksplit);
		else
			gpud_k_mv_f(0, &w[i], dx, T, sep[i]);
	}
	snprintf(what, sizeof(what), "gemv %s x3 in one launch, %u tokens", gpud_type_name(t), T);
	ok = gpud_k_mv_group(0, ws, grp, 3, false, dx, q, d, T, nullptr, nullptr) == cudaSuccess;
	for (int i = 0; ok && i < 3; i++) {
		size_t k = (size_t)T * rows[i];
		ok = down(hs, sep[i], 4 * k, what) && down(hg, grp[i], 4 * k, what);
		diff += ok ? bits_differ(hs, hg, k, 4) : 0;
	}
	report(what, ok ? (double)diff : INFINITY, 0);
	{
		/* acc: y += W x in the GEMV's store, the residual add: the bits of
		 * the GEMV's output added to y in fp32 */
		size_t k = (size_t)T * rows[0];
		float *r = (float *)malloc(4 * k), *want = (float *)malloc(4 * k);

		snprintf(what, sizeof(what), "gemv %s + residual, %u tokens", gpud_type_name(t), T);
		for (size_t i = 0; i < k; i++)
			r[i] = frand() * 8;
		up(grp[0], r, 4 * k);
		ok = gpud_k_mv_group(0, ws, grp, 1, false, dx, q, d, T, nullptr, nullptr, nullptr,
				     true) == cudaSuccess &&
		     down(hs, sep[0], 4 * k, what) && down(hg, grp[0], 4 * k, what);
		for (size_t i = 0; ok && i < k; i++)
			want[i] = r[i] + hs[i];
		report(what, ok ? (double)bits_differ(want, hg, k, 4) : INFINITY, 0);
		free(r);
		free(want);
	}
	/* gate, up = the last two (equal rows): silu(gate) * up */
	snprintf(what, sizeof(what), "gemv %s gate+up, swiglu fused, %u tokens", gpud_type_name(t),
		 T);
	gpud_k_swiglu(0, sep[1], sep[2], (uint64_t)T * rows[1]);
	ok = gpud_k_mv_group(0, ws + 1, grp, 2, true, dx, q, d, T, nullptr, nullptr) ==
		     cudaSuccess &&
	     down(hs, sep[1], 4 * T * rows[1], what) && down(hg, grp[0], 4 * T * rows[1], what);
	report(what, ok ? (double)bits_differ(hs, hg, (size_t)T * rows[1], 4) : INFINITY, 0);
	if (i8) {
		/* and quantized in the same launch: the bits of gpud_k_quantize_act
		 * of the separate kernels' output */
		size_t nq = (size_t)T * rows[1], nb = nq / GPUD_QK;
		int8_t *q1 = (int8_t *)dev(nq), *q2 = (int8_t *)dev(nq);
		float *d1 = (float *)dev(4 * nb), *d2 = (float *)dev(4 * nb);
		int8_t *hq1 = (int8_t *)malloc(nq), *hq2 = (int8_t *)malloc(nq);
		float *hd1 = (float *)malloc(4 * nb), *hd2 = (float *)malloc(4 * nb);

		snprintf(what, sizeof(what), "gemv %s gate+up, swiglu + quantize, %u tok",
			 gpud_type_name(t), T);
		gpud_k_quantize_act(0, sep[1], T, (uint32_t)rows[1], q1, d1);
		cudaMemset(grp[0], 0, 4 * nq);
		ok = gpud_k_mv_group(0, ws + 1, grp, 2, true, dx, q, d, T, q2, d2) == cudaSuccess &&
		     down(hs, sep[1], 4 * nq, what) && down(hg, grp[0], 4 * nq, what) &&
		     down(hq1, q1, nq, what) && down(hq2, q2, nq, what) &&
		     down(hd1, d1, 4 * nb, what) && down(hd2, d2, 4 * nb, what);
		report(what,
		       ok ? (double)(bits_differ(hs, hg, nq, 4) + bits_differ(hq1, hq2, nq, 1) +
				     bits_differ(hd1, hd2, nb, 4))
			  : INFINITY,
		       0);
		if (T == 1) { /* refused: not gated, rows not whole blocks */
			snprintf(what, sizeof(what), "gemv group quantizes only gate/up of 32k rows");
			const gpud_cuda_mat *odd[2] = { &w[0], &w[0] }; /* 72 rows */
			report(what,
			       gpud_k_mv_group(0, ws, grp, 3, false, dx, q, d, T, q2, d2) ==
						       cudaErrorInvalidValue &&
					       gpud_k_mv_group(0, odd, grp, 2, true, dx, q, d, T, q2,
							       d2) == cudaErrorInvalidValue
				       ? 0
				       : 1,
			       0);
		}
		cudaFree(q1);
		cudaFree(q2);
		cudaFree(d1);
		cudaFree(d2);
		free(hq1);
		free(hq2);
		free(hd1);
		free(hd2);
	}
	if (T == 1) { /* refused: too many tokens for a GEMV, a gated pair of unequal rows,
		       * a gated pair that would add into its output */
		snprintf(what, sizeof(what), "gemv group refuses %u tok, unequal gate/up, glu+acc",
			 GPUD_K_GEMV_MAX_T + 1);
		bool no = gpud_k_mv_group(0, ws, grp, 3, false, dx, q, d, GPUD_K_GEMV_MAX_T + 1,
					  nullptr, nullptr) == cudaErrorInvalidValue;
		no = no && gpud_k_mv_group(0, ws, grp, 2, true, dx, q, d, 1, nullptr, nullptr) ==
				   cudaErrorInvalidValue;
		no = no && gpud_k_mv_group(0, ws + 1, grp, 2, true, dx, q, d, 1, nullptr, nullptr,
					   nullptr, true) == cudaErrorInvalidValue;
		report(what, no ? 0 : 1, 0);
	}
	free(hs);
	free(hg);
	for (int i = 0; i < 3; i++) {
		cudaFree(sep[i]);
		cudaFree(grp[i]);
	}
}

// A decode GEMV that makes the RMSNorm of its input itself (gpud_cuda_norm)
// must give the bits of gpud_k_add_norm (quantizing for it, int8) and the
// GEMV after: gate/up with SwiGLU, for int8 also quantized for down (the
// kernel of 32-row CTAs), on x of T rows of cols columns (in registers up
// to 4096, then not). A zero block of x and of the weights gives zero
// scales; with 2 tokens an Inf in the second makes its row's scale 0 and
// its block NaN. The Q/K/V GEMV's fused norm: check_qkv_rope.
void check_norm_fused(enum gpud_type t, uint32_t T, int64_t cols)
{
	const int64_t rows = 64;
	const float eps = 1e-5f;
	size_t nx = (size_t)T * cols, ny = (size_t)T * rows, nyb = ny / GPUD_QK;
	mat mg = make_mat(t, rows, cols), mu = make_mat(t, rows, cols);
	gpud_cuda_mat w[2] = { dmat(mg), dmat(mu) };
	const gpud_cuda_mat *gu[2] = { &w[0], &w[1] };
	float *x = (float *)malloc(4 * nx), *nw = (float *)malloc(4 * cols);
	float *dx = (float *)dev(4 * nx), *dx2 = (float *)dev(4 * nx);
	float *dnw = (float *)dev(4 * cols);
	float *dout = (float *)dev(4 * nx), *ad = (float *)dev(4 * nx / GPUD_QK);
	int8_t *aq = (int8_t *)dev(nx);
	float *y1 = (float *)dev(4 * ny), *y2 = (float *)dev(4 * ny), *yd1 = (float *)dev(4 * nyb),
	      *yd2 = (float *)dev(4 * nyb);
	int8_t *yq1 = (int8_t *)dev(ny), *yq2 = (int8_t *)dev(ny);
	float *h1 = (float *)malloc(4 * ny), *h2 = (float *)malloc(4 * ny);
	float *e1 = (float *)malloc(4 * nyb), *e2 = (float *)malloc(4 * nyb);
	int8_t *g1 = (int8_t *)malloc(ny), *g2 = (int8_t *)malloc(ny);
	float *ys1[2] = { y1, nullptr }, *ys2[2] = { y2, nullptr };
	char what[112];
	bool ok;

	for (size_t i = 0; i < nx; i++)
		x[i] = i < 32 ? 0.0f : frand() * 4;
	if (T > 1) /* the last row's scale 0, a block of it NaN: d NaN, quants 0 */
		x[nx - 40] = INFINITY;
	for (int64_t i = 0; i < cols; i++)
		nw[i] = i >= 32 && i < 64 ? 0.0f : 1.0f + frand() * 0.5f;
	up(dx, x, 4 * nx);
	up(dx2, x, 4 * nx);
	up(dnw, nw, 4 * cols);
	gpud_cuda_norm nrm = { dx, dnw, eps, 0 };
	bool i8 = t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0;
	/* unfused: add_norm (x itself untouched), quantizing for an int8 GEMV */
	gpud_k_add_norm(0, dx2, dout, dnw, false, nullptr, T, (uint32_t)cols, eps,
			i8 ? aq : nullptr, i8 ? ad : nullptr);
	/* ctas 1: one CTA takes every row (the grid-apart units of a bounded
	 * grid), with the same bits */
	for (int k = 0; k < 4; k++) {
		int quant = k & 1;
		if (quant && !i8)
			continue;
		nrm.ctas = k & 2 ? 1 : 0;
		snprintf(what, sizeof(what), "rmsnorm in gemv %s gate+up%s, %u tok, %lld cols%s",
			 gpud_type_name(t), quant ? " + quantize" : "", T, (long long)cols,
			 nrm.ctas ? ", 1 cta" : "");
		cudaMemset(y2, 0, 4 * ny);
		ok = gpud_k_mv_group(0, gu, ys1, 2, true, dout, aq, ad, T, quant ? yq1 : nullptr,
				     quant ? yd1 : nullptr) == cudaSuccess &&
		     gpud_k_mv_group(0, gu, ys2, 2, true, nullptr, nullptr, nullptr, T,
				     quant ? yq2 : nullptr, quant ? yd2 : nullptr, &nrm) == cudaSuccess &&
		     down(h1, y1, 4 * ny, what) && down(h2, y2, 4 * ny, what);
		size_t bad = ok ? bits_differ(h1, h2, ny, 4) : 0;
		if (ok && quant) {
			ok = down(g1, yq1, ny, what) && down(g2, yq2, ny, what) &&
			     down(e1, yd1, 4 * nyb, what) && down(e2, yd2, 4 * nyb, what);
			bad += ok ? bits_differ(g1, g2, ny, 1) + bits_differ(e1, e2, nyb, 4) : 0;
		}
		report(what, ok ? (double)bad : INFINITY, 0);
	}
	if (T == 1 && cols == 320 && t == GPUD_TYPE_Q8_0) {
		/* refused: a norm for a GEMV not gated, of 3 tokens, of F16 rows
		 * not of 8 elements, without its weights, or of x not 16-byte
		 * aligned; and where gpud_k_norm_fuses says */
		gpud_cuda_norm nw0 = { dx, nullptr, eps, 0 }, nodd = { dx + 1, dnw, eps, 0 };
		mat mf = make_mat(GPUD_TYPE_F16, rows, 100);
		gpud_cuda_mat wf = dmat(mf);
		const gpud_cuda_mat *fu[2] = { &wf, &wf };

		snprintf(what, sizeof(what), "gemv with rmsnorm refuses what does not fuse");
		bool no = gpud_k_mv_group(0, gu, ys2, 1, false, nullptr, nullptr, nullptr, 1,
					  nullptr, nullptr, &nrm) == cudaErrorInvalidValue;
		no = no && gpud_k_mv_group(0, gu, ys2, 2, true, nullptr, nullptr, nullptr, 3,
					   nullptr, nullptr, &nrm) == cudaErrorInvalidValue;
		no = no && gpud_k_mv_group(0, fu, ys2, 2, true, dx, nullptr, nullptr, 1, nullptr,
					   nullptr, &nrm) == cudaErrorInvalidValue;
		no = no && gpud_k_mv_group(0, gu, ys2, 2, true, nullptr, nullptr, nullptr, 1,
					   nullptr, nullptr, &nw0) == cudaErrorInvalidValue;
		no = no && gpud_k_mv_group(0, gu, ys2, 2, true, nullptr, nullptr, nullptr, 1,
					   nullptr, nullptr, &nodd) == cudaErrorMisalignedAddress;
		no = no && gpud_k_norm_fuses(t, 3072, 1) && gpud_k_norm_fuses(t, 4096, 2) &&
		     !gpud_k_norm_fuses(t, 3072, 3) && !gpud_k_norm_fuses(t, 100, 1) &&
		     !gpud_k_norm_fuses(t, 40000, 2) && gpud_k_norm_fuses(GPUD_TYPE_F16, 3072, 2) &&
		     !gpud_k_norm_fuses(GPUD_TYPE_F16, 100, 1) &&
		     !gpud_k_norm_fuses(GPUD_TYPE_F32, 6144, 2);
		report(what, no ? 0 : 1, 0);
		free_mat(mf);
	}
	free(x);
	free(nw);
	free(h1);
	free(h2);
	free(e1);
	free(e2);
	free(g1);
	free(g2);
	for (void *p : { (void *)dx, (void *)dx2, (void *)dnw, (void *)dout, (void *)ad,
			 (void *)aq, (void *)y1, (void *)y2, (void *)yd1, (void *)yd2, (void *)yq1,
			 (void *)yq2 })
		cudaFree(p);
	free_mat(mg);
	free_mat(mu);
}

// The decode Q/K/V GEMVs with RoPE and the KV store in their epilogue
// (gpud_k_mv_qkv) must give the bits of gpud_k_mv_group and
// gpud_k_rope_store: q, and the whole KV pool (layer 1 of 2, two sequences
// in scattered blocks), where exactly each token's K and V rows change.
// With kv16 the pool holds halves, and each element stored must also be
// gpud_fp32_to_fp16 (the CPU backend's rounding) of what an f32 pool gets.
void check_qkv_rope(enum gpud_type t, uint32_t T, int64_t cols, bool kv16, bool qwen = false)
{
	const uint32_t nh = 4, nkv = 2, hd = 64, bt = 16, nblk = 12, layers = 2;
	mat mq = make_mat(t, nh * hd, cols), mk = make_mat(t, nkv * hd, cols),
	    mv = make_mat(t, nkv * hd, cols);
	gpud_cuda_mat w[3] = { dmat(mq), dmat(mk), dmat(mv) };
	const gpud_cuda_mat *ws[3] = { &w[0], &w[1], &w[2] };
	uint64_t head_elems = (uint64_t)bt * hd, layer_elems = 2ull * nkv * head_elems;
	size_t nkvf = (size_t)nblk * layers * layer_elems, nq = (size_t)T * nh * hd;
	size_t nkd = (size_t)T * nkv * hd, esz = kv16 ? 2 : 4, nkvb = esz * nkvf;
	uint32_t meta_h[8 + 8 + 2 * GPUD_CUDA_SEQ_WORDS + 12] = {};
	float inv[hd / 2], *x = (float *)malloc(4 * T * cols);
	uint8_t *pool = (uint8_t *)malloc(nkvb), *p1 = (uint8_t *)malloc(nkvb),
		*p2 = (uint8_t *)malloc(nkvb);
	float *p3 = (float *)malloc(4 * nkvf);
	float *h1 = (float *)malloc(4 * nq), *h2 = (float *)malloc(4 * nq);
	float *dx = (float *)dev(4 * T * cols), *dinv = (float *)dev(sizeof(inv));
	float *dbias = (float *)dev(4 * (size_t)(nh + 2 * nkv) * hd);
	void *kv1 = dev(nkvb), *kv2 = dev(nkvb), *kv3 = dev(4 * nkvf);
	float *q1 = (float *)dev(4 * nq), *q2 = (float *)dev(4 * nq);
	float *k1 = (float *)dev(4 * nkd), *v1 = (float *)dev(4 * nkd);
	int8_t *aq = (int8_t *)dev((size_t)T * cols);
	float *ad = (float *)dev(4 * (size_t)T * (cols / GPUD_QK + 1));
	uint32_t *dm = (uint32_t *)dev(sizeof(meta_h));
	bool i8 = t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0, ok;
	char what[112];

	for (int64_t i = 0; i < T * cols; i++)
		x[i] = frand() * 2.0f;
	for (size_t i = 0; i < nkvf; i++) {
		float f = frand();
		uint16_t h = gpud_fp32_to_fp16(f);
		memcpy(pool + i * esz, kv16 ? (const void *)&h : (const void *)&f, esz);
	}
	for (uint32_t i = 0; i < hd / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / hd);
	/* tokens: sequence t % 2 at position 5 + 9 t (distinct slots), 6 blocks
	 * each */
	uint32_t *mpos = meta_h, *mseq = meta_h + 8, *msi = meta_h + 16,
		 *mbt = msi + 2 * GPUD_CUDA_SEQ_WORDS;
	for (uint32_t i = 0; i < T; i++) {
		mpos[i] = 5 + 9 * i;
		mseq[i] = i % 2;
	}
	for (uint32_t sq = 0; sq < 2; sq++)
		msi[sq * GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_BTAB] = sq * 6;
	for (uint32_t b = 0; b < 12; b++)
		mbt[b] = (b * 5 + 1) % nblk; /* every block once */
	up(dm, meta_h, sizeof(meta_h));
	up(dx, x, 4 * T * cols);
	up(dinv, inv, sizeof(inv));
	{
		float b[(nh + 2 * nkv) * hd];
		for (float &f : b)
			f = frand() - 0.5f;
		up(dbias, b, sizeof(b));
	}
	/* Qwen2's: biases on Q, K and V, and NEOX pairs (i, i + 32) */
	gpud_cuda_rope rope = { dinv, qwen ? dbias : nullptr, qwen ? dbias + nh * hd : nullptr,
				qwen ? dbias + (nh + nkv) * hd : nullptr, qwen, nullptr, nullptr,
				0.0f };
	up(kv1, pool, nkvb);
	up(kv2, pool, nkvb);
	gpud_cuda_meta m = { nullptr, dm, dm + 8, nullptr, dm + 16, dm + (mbt - meta_h) };
	gpud_cuda_kvshape kv = { kv1, nh, nkv, hd, bt, 1, head_elems, layer_elems,
				 layers * layer_elems, kv16, 1.0f / sqrtf((float)hd) };
	float *sep[3] = { q1, k1, v1 };

	snprintf(what, sizeof(what), "q/k/v gemv %s + %srope + kv store%s, %u tok, %lld cols",
		 gpud_type_name(t), qwen ? "biases + neox " : "", kv16 ? " (f16 KV)" : "", T,
		 (long long)cols);
	if (i8)
		gpud_k_quantize_act(0, dx, T, (uint32_t)cols, aq, ad);
	ok = gpud_k_mv_group(0, ws, sep, 3, false, dx, aq, ad, T, nullptr, nullptr) ==
		     cudaSuccess &&
	     down(h1, q1, 4 * nq, what) &&
	     gpud_k_rope_store(0, q1, k1, v1, &m, &rope, &kv, T) == cudaSuccess &&
	     down(h2, q1, 4 * nq, what);
	if (ok) {
		/* Q through rope_store against the CPU's: its biases (y += b)
		 * and gpud_rope_apply with gpud_rope_table's angles, bit for bit */
		float b[nh * hd], cs[hd];
		char what2[112];
		size_t bad = 0;

		if (qwen)
			down(b, dbias, sizeof(b), what);
		for (uint32_t i = 0; i < T; i++) {
			float *qt = h1 + (size_t)i * nh * hd;
			for (uint32_t e = 0; qwen && e < nh * hd; e++)
				qt[e] += b[e];
			gpud_rope_table(cs, inv, hd / 2, mpos[i]);
			gpud_rope_apply(qt, cs, nh, hd, qwen ? GPUD_ROPE_NEOX : GPUD_ROPE_NORM);
		}
		bad = bits_differ(h1, h2, nq, 4);
		snprintf(what2, sizeof(what2), "rope_store q %s%s against the cpu's, %u tok",
			 gpud_type_name(t), qwen ? " (biases, neox)" : "", T);
		report(what2, (double)bad, 0);
	}
	kv.kv = kv2;
	ok = ok && gpud_k_mv_qkv(0, ws, q2, dx, aq, ad, T, &m, &rope, &kv) == cudaSuccess &&
	     down(h1, q1, 4 * nq, what) && down(h2, q2, 4 * nq, what) &&
	     down(p1, kv1, nkvb, what) && down(p2, kv2, nkvb, what);
	size_t changed = 0, unrounded = 0;
	if (ok && kv16) {
		/* the same store into an f32 pool of zeros */
		gpud_cuda_kvshape k32 = kv;
		k32.kv = kv3;
		k32.kv16 = 0;
		memset(p3, 0, 4 * nkvf);
		up(kv3, p3, 4 * nkvf);
		ok = gpud_k_rope_store(0, q1, k1, v1, &m, &rope, &k32, T) == cudaSuccess &&
		     down(p3, kv3, 4 * nkvf, what);
	}
	for (size_t i = 0; ok && i < nkvf; i++) {
		if (!memcmp(p2 + i * esz, pool + i * esz, esz))
			continue;
		changed++;
		if (kv16) {
			uint16_t h;
			memcpy(&h, p2 + i * esz, 2);
			unrounded += h != gpud_fp32_to_fp16(p3[i]);
		}
	}
	report(what,
	       ok ? (double)(bits_differ(h1, h2, nq, 4) + bits_differ(p1, p2, nkvb / 4, 4) +
			     (changed != 2 * nkd) + unrounded)
		  : INFINITY,
	       0);
	if (T == 1 && t == GPUD_TYPE_Q8_0 && !kv16) {
		const gpud_cuda_mat *swapped[3] = { &w[1], &w[0], &w[2] };
		snprintf(what, sizeof(what), "q/k/v gemv + rope refuses K, Q, V and 9 tokens");
		report(what,
		       gpud_k_mv_qkv(0, swapped, q2, dx, aq, ad, T, &m, &rope, &kv) ==
					       cudaErrorInvalidValue &&
				       gpud_k_mv_qkv(0, ws, q2, dx, aq, ad, 9, &m, &rope, &kv) ==
					       cudaErrorInvalidValue
			       ? 0
			       : 1,
		       0);
	}
	if (gpud_k_norm_fuses(t, cols, T)) {
		/* the norm made by the GEMV itself (gpud_cuda_norm) against
		 * gpud_k_add_norm's output (quants, int8) into the same GEMV: q
		 * and the pool */
		float *nw = (float *)malloc(4 * cols), *dnw = (float *)dev(4 * cols);
		float *dx2 = (float *)dev(4 * T * cols), *dout = (float *)dev(4 * T * cols);
		/* 3 CTAs for its 256 pairs: 10 or 11 a warp, a grid apart */
		gpud_cuda_norm nrm = { dx, dnw, 1e-5f, 3 };

		snprintf(what, sizeof(what), "q/k/v gemv %s with rmsnorm (3 ctas)%s, %u tok",
			 gpud_type_name(t), qwen ? " (biases, neox)" : kv16 ? " (f16 KV)" : "", T);
		for (int64_t i = 0; i < cols; i++)
			nw[i] = 1.0f + frand() * 0.5f;
		up(dnw, nw, 4 * cols);
		up(dx2, x, 4 * T * cols);
		up(kv1, pool, nkvb);
		up(kv2, pool, nkvb);
		gpud_k_add_norm(0, dx2, dout, dnw, false, nullptr, T, (uint32_t)cols, 1e-5f,
				i8 ? aq : nullptr, i8 ? ad : nullptr);
		kv.kv = kv1;
		ok = gpud_k_mv_qkv(0, ws, q1, dout, aq, ad, T, &m, &rope, &kv) == cudaSuccess;
		kv.kv = kv2;
		ok = ok &&
		     gpud_k_mv_qkv(0, ws, q2, nullptr, nullptr, nullptr, T, &m, &rope, &kv, &nrm) ==
			     cudaSuccess &&
		     down(h1, q1, 4 * nq, what) && down(h2, q2, 4 * nq, what) &&
		     down(p1, kv1, nkvb, what) && down(p2, kv2, nkvb, what);
		report(what,
		       ok ? (double)(bits_differ(h1, h2, nq, 4) + bits_differ(p1, p2, nkvb / 4, 4))
			  : INFINITY,
		       0);
		free(nw);
		cudaFree(dnw);
		cudaFree(dx2);
		cudaFree(dout);
	}
	free(x);
	free(pool);
	free(p1);
	free(p2);
	free(p3);
	free(h1);
	free(h2);
	cudaFree(dx);
	cudaFree(dinv);
	cudaFree(kv1);
	cudaFree(kv2);
	cudaFree(kv3);
	cudaFree(q1);
	cudaFree(q2);
	cudaFree(k1);
	cudaFree(v1);
	cudaFree(aq);
	cudaFree(ad);
	cudaFree(dm);
	free_mat(mq);
	free_mat(mk);
	free_mat(mv);
}

// Attention that quantizes its output (for an int8 O matmul) must give the
// bits of attention and gpud_k_quantize_act: the output, the quants and the
// scales, for split-K decode (the last CTA's combine), one split, and
// prefill tiles. Causal, two sequences in blocks of 16 positions over one
// layer's random K and V (kv16: as halves, gpud.kv_type f16); head_dim not
// a multiple of 32 is refused.
void check_att_quant(uint32_t hd, const char *mode, bool kv16)
{
	const uint32_t nh = 4, nkv = 2, bt = 16, nblk = 16;
	bool tiles = !strcmp(mode, "tiles"), split = !strcmp(mode, "split-K");
	uint32_t T = tiles ? 20 : 3, hg = 2, splits = split ? 4 : 1, tile = 8;
	uint64_t head_floats = (uint64_t)bt * hd, layer_floats = 2ull * nkv * head_floats;
	size_t nkvf = (size_t)nblk * layer_floats, nq = (size_t)T * nh * hd, nb = nq / GPUD_QK;
	/* metadata words: pos, seq, seqinfo (2 sequences), block tables (8 each), tiles */
	uint32_t pos[20], seq[20], meta_h[40 + 2 * GPUD_CUDA_SEQ_WORDS + 16 + 3] = {};
	float *h = (float *)malloc(4 * (nkvf > nq ? nkvf : nq)), *o1 = (float *)malloc(4 * nq),
	      *o2 = (float *)malloc(4 * nq), *e1 = (float *)malloc(4 * nb),
	      *e2 = (float *)malloc(4 * nb);
	int8_t *h1 = (int8_t *)malloc(nq), *h2 = (int8_t *)malloc(nq);
	float *dkv = (float *)dev(4 * nkvf), *dq = (float *)dev(4 * nq);
	float *out1 = (float *)dev(4 * nq), *out2 = (float *)dev(4 * nq);
	float *part = (float *)dev(4 * (size_t)T * nh * splits * (hd + 2));
	unsigned *cnt = (unsigned *)dev(4 * (size_t)T * nkv);
	int8_t *q1 = (int8_t *)dev(nq), *q2 = (int8_t *)dev(nq);
	float *d1 = (float *)dev(4 * nb), *d2 = (float *)dev(4 * nb);
	uint32_t *dm = (uint32_t *)dev(sizeof(meta_h));
	char what[96];
	bool ok;

	for (size_t i = 0; i < nkvf; i++)
		h[i] = frand();
	if (kv16) { /* the pool's halves, packed into h's first half */
		uint16_t *h16 = (uint16_t *)h;
		for (size_t i = 0; i < nkvf; i++)
			h16[i] = gpud_fp32_to_fp16(h[i]);
	}
	up(dkv, h, (kv16 ? 2 : 4) * nkvf);
	for (size_t i = 0; i < nq; i++)
		h[i] = frand() * 2.0f;
	up(dq, h, 4 * nq);
	cudaMemset(cnt, 0, 4 * (size_t)T * nkv);
	/* decode: seq 0 at position 100 (4 chunks of keys), seq 1 at 20 (one
	 * chunk: with 4 splits, one works) and 38 (two); prefill: seq 0's
	 * positions 0 .. 19 */
	for (uint32_t t = 0; t < T; t++) {
		pos[t] = tiles ? t : t == 0 ? 100 : t == 1 ? 20 : 38;
		seq[t] = tiles ? 0 : t == 0 ? 0 : 1;
	}
	uint32_t *mp = meta_h, *mpos = mp, *mseq = mp + T, *msi = mp + 2 * T,
		 *mbt = msi + 2 * GPUD_CUDA_SEQ_WORDS, *mtl = mbt + 16;
	memcpy(mpos, pos, 4 * T);
	memcpy(mseq, seq, 4 * T);
	for (uint32_t sq = 0; sq < 2; sq++) {
		msi[sq * GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_BTAB] = sq * 8;
		msi[sq * GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_SLOT] = GPUD_CUDA_NO_MASK;
		for (uint32_t b = 0; b < 8; b++)
			mbt[sq * 8 + b] = (b * 5 + sq * 3) % nblk; /* scattered blocks */
	}
	for (uint32_t i = 0; i < 3; i++) /* tiles of 8, 8, 4 tokens */
		mtl[i] = (i * tile) | ((i < 2 ? tile - 1 : 3u) << 16);
	up(dm, meta_h, sizeof(meta_h));
	gpud_cuda_meta m = { nullptr, dm + (mpos - mp), dm + (mseq - mp), nullptr,
			     dm + (msi - mp), dm + (mbt - mp) };
	gpud_cuda_kvshape kv = { dkv, nh, nkv, hd, bt, 0, head_floats, layer_floats, layer_floats,
				 kv16, 1.0f / sqrtf((float)hd) };
	gpud_cuda_attn a = { hg, T, splits, tiles ? dm + (mtl - mp) : nullptr, 3, tile, part, cnt,
			     nullptr, nullptr, nullptr, 0 };

	const char *kvs = kv16 ? ", f16 KV" : "";
	snprintf(what, sizeof(what), "attention + quantize fused, hd %u, %s%s", hd, mode, kvs);
	ok = gpud_k_attention(0, dq, out1, &m, &kv, nullptr, 0, 0, &a) == cudaSuccess &&
	     gpud_k_quantize_act(0, out1, T, nh * hd, q1, d1) == cudaSuccess;
	a.aq = q2;
	a.ad = d2;
	/* and the splits without keys streaming a buffer into L2 (the O
	 * matrix, in gpud): the same bits */
	a.next = dkv;
	a.next_bytes = 4 * nkvf;
	ok = ok && gpud_k_attention(0, dq, out2, &m, &kv, nullptr, 0, 0, &a) == cudaSuccess &&
	     down(o1, out1, 4 * nq, what) && down(o2, out2, 4 * nq, what) &&
	     down(h1, q1, nq, what) && down(h2, q2, nq, what) && down(e1, d1, 4 * nb, what) &&
	     down(e2, d2, 4 * nb, what);
	size_t bad = 0; /* equal NaNs would hide a broken setup */
	for (size_t i = 0; ok && i < nq; i++)
		bad += !isfinite(o1[i]) || o1[i] == 0.0f;
	report(what,
	       ok ? (double)(bits_differ(o1, o2, nq, 4) + bits_differ(h1, h2, nq, 1) +
			     bits_differ(e1, e2, nb, 4) + bad)
		  : INFINITY,
	       0);
	if (split) {
		/* against one split: the token of one chunk, whose only working
		 * split writes its output itself, to the bit; the others (fewer
		 * chunks than splits: 2 of 4 work for the token at 38) within
		 * rounding */
		gpud_cuda_attn a1 = a;
		a1.splits = 1;
		a1.aq = nullptr;
		a1.ad = nullptr;
		snprintf(what, sizeof(what), "attention split-K vs one split, hd %u%s", hd, kvs);
		if (gpud_k_attention(0, dq, out2, &m, &kv, nullptr, 0, 0, &a1) == cudaSuccess &&
		    down(o2, out2, 4 * nq, what)) {
			double worst = 0, top = 0; /* relative to the largest output */
			for (size_t i = 0; i < nq; i++) {
				double d = fabs((double)o1[i] - o2[i]);
				worst = d > worst ? d : worst;
				top = fabs((double)o2[i]) > top ? fabs((double)o2[i]) : top;
			}
			report(what, worst / top, 1e-5);
			snprintf(what, sizeof(what),
				 "attention split-K, one chunk: bits vs one split, hd %u%s", hd, kvs);
			report(what, (double)bits_differ(o1 + nh * hd, o2 + nh * hd, nh * hd, 4), 0);
		}
		/* every counter back at zero for the next step */
		unsigned c[8];
		snprintf(what, sizeof(what), "attention split-K counters reset, hd %u%s", hd, kvs);
		if (down(c, cnt, 4 * (size_t)T * nkv, what)) {
			size_t nz = 0;
			for (uint32_t i = 0; i < T * nkv; i++)
				nz += c[i] != 0;
			report(what, (double)nz, 0);
		}
	}
	if (hd == 64 && split && !kv16) {
		gpud_cuda_kvshape odd = kv;
		odd.head_dim = 48;
		snprintf(what, sizeof(what), "attention refuses to quantize head_dim 48");
		report(what,
		       gpud_k_attention(0, dq, out2, &m, &odd, nullptr, 0, 0, &a) ==
				       cudaErrorInvalidValue
			       ? 0
			       : 1,
		       0);
	}
	free(h);
	free(o1);
	free(o2);
	free(e1);
	free(e2);
	free(h1);
	free(h2);
	cudaFree(dkv);
	cudaFree(dq);
	cudaFree(out1);
	cudaFree(out2);
	cudaFree(part);
	cudaFree(cnt);
	cudaFree(q1);
	cudaFree(q2);
	cudaFree(d1);
	cudaFree(d2);
	cudaFree(dm);
}

// Embedding rows of every type: the bits of gpud_dequantize_row; an out of
// range token gives zeros.
void check_embed(enum gpud_type t)
{
	const int64_t rows = 40, cols = 96;
	const int32_t toks[5] = { 0, 39, 17, -1, 40 };
	mat m = make_mat(t, rows, cols);
	gpud_cuda_mat w = dmat(m);
	int32_t *dt = (int32_t *)dev(sizeof(toks));
	float *dx = (float *)dev(4 * 5 * cols), got[5 * 96], want[5 * 96];
	char what[64];

	up(dt, toks, sizeof(toks));
	memset(want, 0, sizeof(want));
	for (int i = 0; i < 3; i++)
		gpud_dequantize_row(t, (const uint8_t *)m.host +
				       toks[i] * gpud_type_row_bytes(t, cols), want + i * cols, cols);
	gpud_k_embed(0, &w, dt, 5, dx);
	snprintf(what, sizeof(what), "embedding rows %s", gpud_type_name(t));
	if (down(got, dx, sizeof(got), what))
		report(what, memcmp(got, want, sizeof(got)) ? 1 : 0, 0);
	cudaFree(dt);
	cudaFree(dx);
	free_mat(m);
}

// The arg max of logits rows on the device (gpud_k_argmax, then
// gpud_cuda_argmax_pick): gpud_argmax's pick on every row, the awkward ones
// included (ties across ranges, signed zeros, NaN, infinities, a vocabulary
// smaller than the ranges). Bound: 0 rows that differ.
void check_argmax(uint32_t nv)
{
	const uint32_t rows = 8;
	float *h = (float *)malloc(sizeof(float) * rows * nv), *dl = (float *)dev(4ull * rows * nv);
	uint64_t *keys = (uint64_t *)malloc(8ull * rows * GPUD_CUDA_ARGMAX_PARTS);
	uint64_t *dk = (uint64_t *)dev(8ull * rows * GPUD_CUDA_ARGMAX_PARTS);
	int32_t ids[rows];
	char what[64];
	size_t bad = 0;

	for (uint32_t r = 0; r < rows; r++) {
		float *l = h + (size_t)r * nv;
		for (uint32_t i = 0; i < nv; i++)
			l[i] = frand() * 8.0f;
		switch (r) {
		case 1: /* the greatest twice, far apart: the lower index */
			l[nv - 1] = l[nv / 3] = 9.0f;
			break;
		case 2: /* no number above -inf */
			for (uint32_t i = 0; i < nv; i++)
				l[i] = i % 2 ? NAN : -INFINITY;
			break;
		case 3: /* zeros the greatest: -0 equals +0, the lower index */
			for (uint32_t i = 0; i < nv; i++)
				l[i] = -1.0f - (float)i;
			l[nv - 1] = 0.0f;
			l[nv / 2] = -0.0f;
			break;
		case 4: /* +inf among NaNs */
			for (uint32_t i = 0; i < nv; i++)
				l[i] = NAN;
			l[nv * 2 / 3] = INFINITY;
			break;
		case 5: /* -inf everywhere but one lowest float */
			for (uint32_t i = 0; i < nv; i++)
				l[i] = -INFINITY;
			l[nv - 1] = -3.402823466e38f;
			break;
		case 6: /* equal everywhere: index 0 */
			for (uint32_t i = 0; i < nv; i++)
				l[i] = 0.5f;
			break;
		}
	}
	up(dl, h, 4ull * rows * nv);
	snprintf(what, sizeof(what), "arg max of %u-logit rows", nv);
	if (gpud_k_argmax(0, dl, rows, nv, dk) == cudaSuccess &&
	    down(keys, dk, 8ull * rows * GPUD_CUDA_ARGMAX_PARTS, what)) {
		gpud_cuda_argmax_pick(keys, rows, ids);
		for (uint32_t r = 0; r < rows; r++) {
			int32_t want = gpud_argmax(h + (size_t)r * nv, (int32_t)nv);
			if (ids[r] != (want < 0 ? -1 : want)) {
				printf("ops_cmp: arg max row %u: %d, want %d\n", r, ids[r], want);
				bad++;
			}
		}
		report(what, (double)bad, 0);
	} else {
		report(what, INFINITY, 0);
	}
	free(h);
	free(keys);
	cudaFree(dl);
	cudaFree(dk);
}

// Draws on the device (gpud_k_draw, then gpud_cuda_argmax_pick): the token
// gpud_draw_row picks on the host from the same row, bit for bit, over
// rows of several shapes (a trained model's spread, a few levels with
// ties and signed zeros, NaN / -inf / +inf, nothing usable) and random
// temperatures (0: the penalized arg max), top-k, top-p, min-p, penalties
// and PRNG words; rows whose draw is off keep their keys. Bound: 0 rows
// that differ. Counts the rows each way of the kernels takes: a top-k of
// up to 63 from candidates; others, with a temperature, from the live
// tokens in shared memory (up to 2,048 of them) or through the histogram
// (more), where a few levels of a wide row put thousands of tokens in one
// bucket and a selection ranks it from the row.
// The live tokens of row l under draw dr (its penalties applied): how many
// a draw with a temperature can weigh (gpud/draw.h).
static size_t live_tokens(const float *l, uint32_t nv, const struct gpud_draw *dr)
{
	float *p = (float *)malloc(sizeof(float) * nv), inv_t = gpud_draw_inv_t(dr->temperature), mx;
	int32_t best;
	size_t n = 0;

	memcpy(p, l, sizeof(float) * nv);
	for (uint32_t j = 0; j < dr->n_pen; j++)
		p[dr->pen_id[j]] = gpud_draw_penalize(l[dr->pen_id[j]], dr->pen_n[j],
						      dr->repeat_penalty, dr->frequency_penalty,
						      dr->presence_penalty);
	best = gpud_argmax(p, (int32_t)nv);
	mx = best < 0 ? 0.0f : p[best];
	for (uint32_t i = 0; best >= 0 && i < nv; i++)
		n += p[i] > -INFINITY &&
		     (mx == INFINITY ? p[i] == INFINITY : gpud_draw_live(p[i], mx, inv_t));
	free(p);
	return n;
}

void check_draw(uint32_t nv, uint32_t rounds)
{
	const uint32_t rows = 8;
	static const float temps[] = { 0.05f, 0.3f, 0.8f, 1.0f, 1.7f, 6.0f, 0.0f };
	static const float reps[] = { 1.0f, 1.1f, 1.3f, 0.8f };
	static const float tps[] = { 1.0f, 0.95f, 0.5f, 1e-6f, 0.9999f };
	static const float mps[] = { 0.0f, 0.05f, 0.5f, 1.0f };
	float *h = (float *)malloc(sizeof(float) * rows * nv), *dl = (float *)dev(4ull * rows * nv);
	uint64_t *keys = (uint64_t *)malloc(8ull * rows * GPUD_CUDA_ARGMAX_PARTS);
	uint64_t *dk = (uint64_t *)dev(8ull * rows * GPUD_CUDA_ARGMAX_PARTS);
	static uint32_t words[rows * GPUD_CUDA_DRAW_WORDS];
	uint32_t *dw = (uint32_t *)dev(sizeof(words)), *dn = (uint32_t *)dev(4), ndraw;
	uint64_t *dc = (uint64_t *)dev(8ull * rows * GPUD_CUDA_DRAW_SCRATCH);
	struct gpud_draw dr[rows];
	struct gpud_sampler_scratch *sc = nullptr;
	char what[64], err[256];
	int32_t ids[rows];
	size_t bad = 0, drawn = 0, pens = 0, cands = 0, hist = 0, wide = 0;

	if (gpud_sampler_scratch_create(&sc, (int32_t)nv, err, sizeof(err))) {
		report("draw scratch", INFINITY, 0);
		return;
	}
	snprintf(what, sizeof(what), "draws from %u-logit rows", nv);
	for (uint32_t round = 0; round < rounds; round++) {
		memset(words, 0, sizeof(words));
		for (uint32_t r = 0; r < rows; r++) {
			float *l = h + (size_t)r * nv;
			uint32_t shape = (round + r) % 6, *w = words + r * GPUD_CUDA_DRAW_WORDS, off;

			for (uint32_t i = 0; i < nv; i++) {
				float v = frand();
				switch (shape) {
				case 0: v = v * 3.0f - (i % 97 ? 12.0f : 0.0f); break; /* peaked */
				case 1: v *= 12.0f; break;
				case 2: v = (float)((int)(next() % 5) - 2) * 0.5f;
					if (v == 0.0f && (next() & 1))
						v = -0.0f;
					break;
				case 3: v = next() % 8 == 0 ? NAN : next() % 8 == 0 ? -INFINITY : v * 8.0f;
					break;
				case 4: v = next() % 64 == 0 ? INFINITY : v * 8.0f; break;
				default: v = r == 7 ? -INFINITY : v * 8.0f; /* r 7: nothing usable */
				}
				l[i] = v;
			}
			dr[r].temperature = temps[next() % 7];
			dr[r].n_pen = next() % 3 ? 0 : (uint32_t)(next() % (GPUD_DRAW_MAX_PEN + 1));
			dr[r].n_pen = dr[r].n_pen < nv ? dr[r].n_pen : nv;
			dr[r].repeat_penalty = reps[next() % 4];
			dr[r].frequency_penalty = next() % 2 ? 0.0f : frand();
			dr[r].presence_penalty = next() % 2 ? 0.0f : frand() * 2.0f;
			off = (uint32_t)next();
			for (uint32_t j = 0; j < dr[r].n_pen; j++) {
				/* distinct: 7919 is prime and divides no nv here */
				dr[r].pen_id[j] = (int32_t)((j * 7919u + off) % nv);
				dr[r].pen_n[j] = 1 + (uint32_t)(next() % 5);
			}
			dr[r].top_k = next() % 4 == 0 ? 0 : next() % 3 == 0 ? (int32_t)nv + 2 :
				      next() % 2 ? (int32_t)(next() % 50) : 64 + (int32_t)(next() % 3000);
			dr[r].top_p = tps[next() % 5];
			dr[r].min_p = mps[next() % 4];
			dr[r].rand = next() ^ next() << 32;
			if (r == 3) /* off: keeps the keys below */
				continue;
			w[GPUD_CUDA_DW_ON] = 1;
			memcpy(&w[GPUD_CUDA_DW_TEMP], &dr[r].temperature, 4);
			memcpy(&w[GPUD_CUDA_DW_TOPK], &dr[r].top_k, 4);
			memcpy(&w[GPUD_CUDA_DW_TOPP], &dr[r].top_p, 4);
			memcpy(&w[GPUD_CUDA_DW_MINP], &dr[r].min_p, 4);
			w[GPUD_CUDA_DW_RAND_LO] = (uint32_t)dr[r].rand;
			w[GPUD_CUDA_DW_RAND_HI] = (uint32_t)(dr[r].rand >> 32);
			w[GPUD_CUDA_DW_NPEN] = dr[r].n_pen;
			memcpy(&w[GPUD_CUDA_DW_REPEAT], &dr[r].repeat_penalty, 4);
			memcpy(&w[GPUD_CUDA_DW_FREQ], &dr[r].frequency_penalty, 4);
			memcpy(&w[GPUD_CUDA_DW_PRES], &dr[r].presence_penalty, 4);
			memcpy(&w[GPUD_CUDA_DW_PEN_ID], dr[r].pen_id, dr[r].n_pen * 4);
			memcpy(&w[GPUD_CUDA_DW_PEN_N], dr[r].pen_n, dr[r].n_pen * 4);
			pens += dr[r].n_pen > 0;
		}
		for (uint32_t i = 0; i < rows * GPUD_CUDA_ARGMAX_PARTS; i++)
			keys[i] = 0x5a5a5a5a00000000ull | i;
		up(dl, h, 4ull * rows * nv);
		up(dw, words, sizeof(words));
		up(dk, keys, 8ull * rows * GPUD_CUDA_ARGMAX_PARTS);
		ndraw = round % 5 != 4; /* 0: the step has no draw, every row is kept */
		up(dn, &ndraw, 4);
		if (gpud_k_draw(0, dl, rows, nv, dn, dw, dk, dc) != cudaSuccess ||
		    !down(keys, dk, 8ull * rows * GPUD_CUDA_ARGMAX_PARTS, what)) {
			report(what, INFINITY, 0);
			break;
		}
		gpud_cuda_argmax_pick(keys, rows, ids);
		for (uint32_t r = 0; r < rows; r++) {
			int32_t want;

			if (r == 3 || !ndraw) {
				for (uint32_t p = 0; p < GPUD_CUDA_ARGMAX_PARTS; p++)
					bad += keys[r * GPUD_CUDA_ARGMAX_PARTS + p] !=
					       (0x5a5a5a5a00000000ull | (r * GPUD_CUDA_ARGMAX_PARTS + p));
				continue;
			}
			want = gpud_draw_row(h + (size_t)r * nv, (int32_t)nv, &dr[r], sc);
			drawn++;
			if (dr[r].temperature > 0.0f && dr[r].top_k > 0 && dr[r].top_k <= 63) {
				cands++;
			} else if (dr[r].temperature > 0.0f) {
				size_t live = live_tokens(h + (size_t)r * nv, nv, &dr[r]);
				hist += live > 2048;
				wide += live > 2048 && (round + r) % 6 == 2 && nv > 5 * 2048;
			}
			if (ids[r] != (want < 0 ? -1 : want)) {
				printf("ops_cmp: draw row %u round %u (T %g, top-k %d, top-p %g, "
				       "min-p %g, %u penalized): %d, want %d\n", r, round,
				       (double)dr[r].temperature, dr[r].top_k, (double)dr[r].top_p,
				       (double)dr[r].min_p, dr[r].n_pen, ids[r], want);
				bad++;
			}
		}
	}
	printf("ops_cmp: %zu draws from %u-logit rows compared (%zu with penalties, %zu from "
	       "candidates, %zu through the histogram, %zu of them with buckets of thousands)\n",
	       drawn, nv, pens, cands, hist, wide);
	report(what, (double)bad, 0);
	gpud_sampler_scratch_free(sc);
	free(h);
	free(keys);
	cudaFree(dl);
	cudaFree(dk);
	cudaFree(dw);
	cudaFree(dn);
	if (dc)
		cudaFree(dc);
}

// The programmatic-dependent-launch probe (gpud's pdl_setup) and the
// empty launches of the stage profile: p[0] and p[1] are 0x5eed after the
// probe, with the launch mode on and off (where the device has it), and
// the empty kernels end without a fault.
void check_probe(void)
{
	int *p = (int *)dev(3 * sizeof(int)), h[3];
	int bad = 0;
	cudaDeviceProp prop;
	cudaStream_t s;

	if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
		report("launch probe: a stream", INFINITY, 0);
		return;
	}
	for (bool pdl : { false, true }) {
		if (pdl && (prop.major < 9 || gpud_k_pdl(s, true) != cudaSuccess))
			continue; /* sm_90 and later, as pdl_setup has it */
		if (gpud_k_pdl_probe(s, p) != cudaSuccess || gpud_k_nop(s, 3) != cudaSuccess ||
		    cudaStreamSynchronize(s) != cudaSuccess ||
		    !down(h, p, sizeof(h), "the launch probe") || h[0] != 0x5eed || h[1] != 0x5eed)
			bad++;
		if (pdl)
			gpud_k_pdl(s, false);
	}
	report("launch probe (programmatic dependent launch off, on) and empty kernels",
	       (double)bad, 0);
	cudaStreamDestroy(s);
	cudaFree(p);
}

// Every kernel but the draws' against the CPU's.
void check_kernels(void)
{
	const enum gpud_type types[] = { GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16,
					 GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0 };

	for (enum gpud_type t : types) {
		check_embed(t);
		for (uint32_t T : { 1u, 3u, 8u })
			check_matmul(t, 200, 320, T);
		for (uint32_t T : { 9u, 70u })
			check_matmul(t, 130, 320, T);
		if (t == GPUD_TYPE_F32) {
			check_matmul(t, 130, 330, 70); /* the tiled kernel, any width */
			for (uint32_t T : { 1u, 3u, 8u }) /* GEMVs of rows not whole vectors */
				check_matmul(t, 200, 330, T);
			continue;
		}
		if (t == GPUD_TYPE_F16 || t == GPUD_TYPE_BF16) {
			check_matmul(t, 1000, 1024, 40); /* 8 splits of 16 tiles */
			for (uint32_t T : { 20u, 70u }) /* a last stage of one chunk */
				check_matmul(t, 130, 328, T);
			check_matmul(t, 130, 330, 70); /* not whole chunks: fp32 tiles */
			continue;
		}
		check_matmul(t, 1000, 1024, 40); /* pipelined: 8 splits of 16 tiles */
		for (uint32_t T : { 9u, 70u }) /* 11 blocks a row: the single-buffered kernel */
			check_matmul(t, 130, 352, T);
		gpud_k_mm_single(true); /* and that kernel where the pipelined one fits */
		for (uint32_t T : { 9u, 70u })
			check_matmul(t, 130, 320, T);
		check_matmul(t, 1000, 1024, 40); /* 8 splits of 32 tiles */
		gpud_k_mm_single(false);
	}
	for (enum gpud_type t : types)
		for (uint32_t T : { 1u, 2u, 3u, 8u })
			check_gemv_group(t, T);
	for (enum gpud_type t : { GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0, GPUD_TYPE_F16, GPUD_TYPE_BF16 })
		for (uint32_t T : { 16u, 40u, 70u })
			check_mm_set(t, T);
	for (enum gpud_type t : types)
		for (uint32_t T : { 1u, 2u })
			for (int64_t cols : { 320, 4160 })
				check_norm_fused(t, T, cols);
	for (uint32_t dim : { 320u, 4096u, 4160u }) { /* rows in registers, then not */
		check_rmsnorm(dim > 320 ? 2 : 7, dim, false);
		check_rmsnorm(dim > 320 ? 2 : 7, dim, true);
		check_norm_quant(dim > 320 ? 2 : 7, dim, false);
		check_norm_quant(dim > 320 ? 2 : 7, dim, true);
	}
	check_swiglu(5000);
	for (enum gpud_type t : types)
		for (uint32_t T : { 1u, 2u, 3u, 8u })
			check_qkv_rope(t, T, 320, false);
	check_qkv_rope(GPUD_TYPE_F32, 2, 100, false); /* rows not of 8 elements: scalar loads */
	for (uint32_t T : { 1u, 3u, 8u })
		check_qkv_rope(GPUD_TYPE_Q8_0, T, 320, true);
	for (enum gpud_type t : { GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_Q8_0 })
		for (uint32_t T : { 1u, 2u, 3u })
			check_qkv_rope(t, T, 320, t == GPUD_TYPE_Q8_0, true); /* Qwen2's */
	for (uint32_t hd : { 32u, 64u, 128u })
		for (const char *mode : { "split-K", "one split", "tiles" })
			for (bool kv16 : { false, true })
				check_att_quant(hd, mode, kv16);
	for (uint32_t nv : { 7u, 512u, 128256u })
		check_argmax(nv);
	check_probe();
}

} // namespace

int main(int argc, char **argv)
{
	int n = 0;
	bool draws_only = false, no_draws = false;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			rng = strtoull(argv[++i], nullptr, 0) | 1;
		} else if (!strcmp(argv[i], "--draws")) {
			draws_only = true; /* only the draws' checks */
		} else if (!strcmp(argv[i], "--no-draws")) {
			no_draws = true; /* all but them (tests/cuemu/run's race step) */
		} else {
			fprintf(stderr, "usage: %s [--seed S] [--draws | --no-draws]\n", argv[0]);
			return 2;
		}
	}
	if (draws_only && no_draws) {
		fprintf(stderr, "ops_cmp: --draws and --no-draws: one of them\n");
		return 2;
	}
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		fprintf(stderr, "ops_cmp: no CUDA device\n");
		return 2;
	}
	cudaSetDevice(0);
	ksplit.part_floats = 8ull * 64 * 4096;
	ksplit.part = (float *)dev(4 * ksplit.part_floats);
	ksplit.cnt_words = 4096 / 32 + 1;
	ksplit.cnt = (unsigned *)dev(4 * ksplit.cnt_words);
	ksplit.n_sm = 132;
	/* the device's occupancy of the tensor-core kernels, which bounds
	 * their splits as in the backend (cuemu: its H100's, 16 CTAs of 128
	 * threads, which leaves the splits of 3 a multiprocessor alone) */
	if (gpud_k_mm_occupancy(ksplit.per_sm) != cudaSuccess || !ksplit.per_sm[0] ||
	    !ksplit.per_sm[1] || !ksplit.per_sm[2]) {
		fprintf(stderr, "ops_cmp: gpud_k_mm_occupancy failed\n");
		return 1;
	}
	printf("ops_cmp: tensor-core CTAs a multiprocessor: int8 %u, single-buffered %u, F16 %u\n",
	       ksplit.per_sm[0], ksplit.per_sm[1], ksplit.per_sm[2]);
	cudaMemset(ksplit.cnt, 0, 4 * ksplit.cnt_words);
	if (!draws_only)
		check_kernels();
	if (!no_draws) {
		check_draw(1, 8);
		check_draw(7, 40);
		check_draw(3000, 60);
		check_draw(128256, 10);
	}
	printf("ops_cmp: %s\n", failures ? "FAILED" : "every op within its bound");
	return failures ? 1 : 0;
}
