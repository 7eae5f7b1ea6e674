/* kernels.c - portable matmul and row expansion, plus run-time dispatch.
 *
 * Everything here is the reference: plain C, one float accumulator per
 * output element. Float-type weights: summing w * x column by column (w
 * the weight's exact fp32 value). q8_0/q4_0: int8 block dot products (see
 * "int8 path" below). kernels_x86.c holds the vector versions; the
 * formats and their scalar conversions are gpud/quant.c's.
 */
#include "gpud/backend/cpu/kernels.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "gpud/backend/cpu/kernels_impl.h"
#include "gpud/backend/cpu/threadpool.h"

#ifdef GPUD_HAVE_X86
#include <cpuid.h>
#endif

#define FEAT_VEC (GPUD_CPU_AVX2 | GPUD_CPU_FMA | GPUD_CPU_F16C)

/* ---- run-time features ------------------------------------------------- */

static _Atomic unsigned g_detected = ~0u; /* ~0u: not probed yet */
static _Atomic unsigned g_mask = ~0u;

static unsigned probe_features(void)
{
	unsigned f = 0;

#ifdef GPUD_HAVE_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2"))
		f |= GPUD_CPU_AVX2;
	if (__builtin_cpu_supports("fma"))
		f |= GPUD_CPU_FMA;
	/* F16C: CPUID leaf 1, ECX bit 29 (clang 14 has no "f16c" name for
	 * __builtin_cpu_supports). It uses the AVX register state, whose OS
	 * support the AVX2 check already covers. */
	{
		unsigned a, b, c, d;

		if ((f & GPUD_CPU_AVX2) && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)))
			f |= GPUD_CPU_F16C;
	}
	/* AVX-VNNI (VEX vpdpbusd): CPUID leaf 7 subleaf 1, EAX bit 4 (gcc 12
	 * has no __builtin_cpu_supports name for it). Same YMM state. */
	{
		unsigned a, b, c, d;

		if ((f & GPUD_CPU_AVX2) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)))
			f |= GPUD_CPU_AVXVNNI;
	}
	/* AVX-512: libgcc reports these only when XCR0 shows the OS saves
	 * the opmask and ZMM state. */
	if ((f & GPUD_CPU_AVX2) && __builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512dq")) {
		f |= GPUD_CPU_AVX512;
		if (__builtin_cpu_supports("avx512vnni"))
			f |= GPUD_CPU_AVX512VNNI;
		/* GFNI: CPUID leaf 7, ECX bit 8 (its 512-bit form needs
		 * AVX512F, checked above) */
		unsigned a, b, c, d;

		if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 8)))
			f |= GPUD_CPU_GFNI;
	}
#endif
	return f;
}

static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;

static void probe_once(void)
{
	atomic_store_explicit(&g_detected, probe_features(), memory_order_relaxed);
}

unsigned gpud_cpu_features(void)
{
	unsigned d = atomic_load_explicit(&g_detected, memory_order_relaxed);

	/* Probe once: __builtin_cpu_init() writes libgcc globals, so two
	 * engines' threads must not run it at the same time. */
	if (d == ~0u) {
		pthread_once(&g_probe_once, probe_once);
		d = atomic_load_explicit(&g_detected, memory_order_relaxed);
	}
	return d & atomic_load_explicit(&g_mask, memory_order_relaxed);
}

void gpud_cpu_set_features(unsigned mask)
{
	atomic_store_explicit(&g_mask, mask, memory_order_relaxed);
}

#ifdef GPUD_HAVE_X86
static bool use_vec(void)
{
	return (gpud_cpu_features() & FEAT_VEC) == FEAT_VEC;
}
#endif

/* ---- rows -------------------------------------------------------------- */

void gpud_get_row(enum gpud_type t, const void *W, int64_t cols, int64_t r, float *out)
{
	const uint8_t *row = (const uint8_t *)W + (size_t)r * gpud_type_row_bytes(t, (uint64_t)cols);

#ifdef GPUD_HAVE_X86
	if (use_vec() && gpud__x86_dequantize_row(t, row, out, cols))
		return;
#endif
	gpud_dequantize_row(t, row, out, cols);
}

/* Element i of a packed f16, bf16 or f32 panel as fp32 (exact). */
static inline float panel_fp32(enum gpud_type t, const void *g, size_t i)
{
	if (t == GPUD_TYPE_F32)
		return ((const float *)g)[i];
	if (t == GPUD_TYPE_BF16)
		return gpud_bf16_to_fp32(((const uint16_t *)g)[i]);
	return gpud_fp16_to_fp32(((const uint16_t *)g)[i]);
}

void gpud_get_row_packed(enum gpud_type t, const void *W, int64_t cols, int64_t r, float *out)
{
	const size_t wrow = gpud_type_row_bytes(t, (uint64_t)cols);

	if (gpud__pk_panel(t)) {
		const uint8_t *g = (const uint8_t *)W + (size_t)(r - r % GPUD__PK_ROWS_F16) * wrow;

		for (int64_t k = 0; k < cols; k++)
			out[k] = panel_fp32(t, g, (size_t)(GPUD__PK_ROWS_F16 * k + r % GPUD__PK_ROWS_F16));
		return;
	}
	const int64_t be = gpud_type_block_elems(t), nb = cols / be;
	const uint8_t *group = (const uint8_t *)W + (size_t)(r - r % GPUD__PK_ROWS) * wrow;
	uint8_t blk[sizeof(struct gpud_block_q6_k)];

	assert(gpud__pk_type(t) && gpud_type_block_bytes(t) <= sizeof(blk));
	for (int64_t i = 0; i < nb; i++, out += be) {
		gpud__pk_unpack_block(t, group, r % GPUD__PK_ROWS, i, blk);
#ifdef GPUD_HAVE_X86
		if (use_vec() && gpud__x86_dequantize_row(t, blk, out, be))
			continue;
#endif
		gpud_dequantize_row(t, blk, out, be);
	}
}

/* ---- matmul ------------------------------------------------------------ */

static bool is_quant(enum gpud_type t)
{
	return t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0;
}

/* Scratch layout for q8_0/q4_0: xd (batch, nb) floats, xc (batch, nb)
 * int32, xq (batch, cols) int8; the total rounded up to 64 bytes so that
 * per-thread scratch slices sized by this stay aligned. */
size_t gpud_matmul_scratch_bytes(enum gpud_type wtype, int64_t cols, int64_t batch)
{
	size_t nb, n;

	if (cols <= 0 || batch <= 0)
		return 0;
	if (!is_quant(wtype) && !gpud__kq_type(wtype) && !gpud__lq_type(wtype))
		return 0;
	nb = (size_t)(cols / GPUD_QK);
	n = (size_t)batch * nb * (sizeof(float) + sizeof(int32_t)) + (size_t)batch * (size_t)cols;
	return (n + 63) & ~(size_t)63;
}

/* Float-type weights: one sequential sum per element. */
static float dot_ref(const struct gpud__mm *m, const uint8_t *w, int64_t b)
{
	const float *x = m->x + b * m->cols;
	float acc = 0.0f;

	switch (m->wtype) {
	case GPUD_TYPE_F32: {
		const float *wf = (const float *)w;

		for (int64_t c = 0; c < m->cols; c++)
			acc += wf[c] * x[c];
		break;
	}
	case GPUD_TYPE_F16: {
		const uint16_t *wh = (const uint16_t *)w;

		for (int64_t c = 0; c < m->cols; c++)
			acc += gpud_fp16_to_fp32(wh[c]) * x[c];
		break;
	}
	case GPUD_TYPE_BF16: {
		const uint16_t *wh = (const uint16_t *)w;

		for (int64_t c = 0; c < m->cols; c++)
			acc += gpud_bf16_to_fp32(wh[c]) * x[c];
		break;
	}
	default:
		break;
	}
	return acc;
}

static void mm_rows_ref(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	if (m->packed) { /* f16/bf16/f32 in 16-row column-major groups (pack.c) */
		for (int64_t r = r0; r < r1; r++) {
			const uint8_t *g = m->W + (size_t)(r - r % GPUD__PK_ROWS_F16) * m->wrow;

			for (int64_t b = 0; b < m->batch; b++) {
				const float *x = m->x + b * m->cols;
				float acc = 0.0f;

				for (int64_t k = 0; k < m->cols; k++)
					acc = fmaf(panel_fp32(m->wtype, g,
							      (size_t)(GPUD__PK_ROWS_F16 * k +
								       r % GPUD__PK_ROWS_F16)),
						   x[k], acc);
				m->y[b * m->rows + r] = acc;
			}
		}
		return;
	}
	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *w = m->W + (size_t)r * m->wrow;

		/* The row stays in L1 while the batch walks over it. */
		for (int64_t b = 0; b < m->batch; b++)
			m->y[b * m->rows + r] = dot_ref(m, w, b);
	}
}

/* ---- int8 path: q8_0/q4_0 weights x quantized activations -------------
 * Each activation block of 32 is quantized like a q8_0 weight block but
 * keeps its scale in fp32: d = max|x| / 127, q = round(x / d). For every
 * (row, column) pair and weight block i the exact integer dot product
 * isum = sum_j w_q[j] * x_q[j] is formed and folded into one fp32
 * accumulator in block order:
 *     acc = fma(d_w[i] * d_x[i], (float)isum, acc),   acc starting at 0.
 * |isum| <= 32 * 128 * 127 < 2^24, so (float)isum is exact; d_w * d_x is
 * one rounded fp32 product. The vector kernels compute the same isum (any
 * exact integer method) and the same fp32 operations, so all paths give
 * the same bits. */

/* Activation quantization (the x86 version must give the same bytes). */
static void quantize_act_ref(const float *x, int64_t n, int32_t off, int8_t *q, float *d,
			     int32_t *c)
{
	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK, q += GPUD_QK) {
		float amax = 0.0f, id;
		bool bad = false;
		int32_t sum = 0, half = 0;

		for (int j = 0; j < GPUD_QK; j++) {
			bad |= !isfinite(x[j]);
			amax = fmaxf(amax, fabsf(x[j]));
		}
		if (bad || amax < GPUD__ACT_TINY) {
			memset(q, 0, GPUD_QK);
			d[i] = bad ? NAN : 0.0f;
			c[i] = 0;
			continue;
		}
		d[i] = gpud__q8_scale(amax, &id);
		for (int j = 0; j < GPUD_QK; j++) {
			/* |x * id| <= 127 (plus rounding): in range */
			q[j] = (int8_t)nearbyintf(x[j] * id);
			sum += q[j];
			if (j == GPUD_QK / 2 - 1)
				half = sum;
		}
		if (off == GPUD__ACT_HALVES)
			c[i] = (int32_t)((uint32_t)(uint16_t)half | (uint32_t)(sum - half) << 16);
		else
			c[i] = -off * sum;
	}
}

static int32_t isum_ref(enum gpud_type t, const uint8_t *blk, const int8_t *xq)
{
	int32_t s = 0;

	if (t == GPUD_TYPE_Q8_0) {
		const int8_t *w = (const int8_t *)(blk + 2);

		for (int j = 0; j < GPUD_QK; j++)
			s += (int32_t)w[j] * xq[j];
	} else {
		const uint8_t *w = blk + 2;

		for (int j = 0; j < GPUD_QK / 2; j++) {
			s += ((int32_t)(w[j] & 0xf) - 8) * xq[j];
			s += ((int32_t)(w[j] >> 4) - 8) * xq[j + GPUD_QK / 2];
		}
	}
	return s;
}

static void mm_rows_ref_i8(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK;
	const size_t bsz = m->wtype == GPUD_TYPE_Q8_0 ? sizeof(struct gpud_block_q8_0)
						      : sizeof(struct gpud_block_q4_0);

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *row = m->W + (size_t)r * m->wrow;
		const uint8_t *group = m->W + (size_t)(r & ~(int64_t)(GPUD__PK_ROWS - 1)) * m->wrow;

		for (int64_t b = 0; b < m->batch; b++) {
			const int8_t *xq = m->xq + b * m->cols;
			const float *xd = m->xd + b * nb;
			float acc = 0.0f;

			for (int64_t i = 0; i < nb; i++) {
				const uint8_t *blk = row + (size_t)i * bsz;
				uint8_t unpacked[sizeof(struct gpud_block_q8_0)];
				uint16_t h;

				if (m->packed) {
					gpud__pk_unpack_block(m->wtype, group, r % GPUD__PK_ROWS, i,
							      unpacked);
					blk = unpacked;
				}
				float dw;

				memcpy(&h, blk, sizeof(h));
				dw = gpud_fp16_to_fp32(h);
				acc = fmaf(dw * xd[i], (float)isum_ref(m->wtype, blk, xq + i * GPUD_QK),
					   acc);
			}
			m->y[b * m->rows + r] = acc;
		}
	}
}

/* 16 rows = one cache line of y per batch column: threads never share a
 * line of output, and tiles never straddle a thread boundary. */
#define MM_ROW_ALIGN 16

struct mm_job {
	struct gpud_tp *tp;
	const struct gpud_mm_call *mc;
};

static void mm_worker(void *arg, int ith, int nth)
{
	const struct mm_job *job = arg;
	long lo, hi;

	if (nth == 1) {
		gpud_matmul_rows(job->mc, 0, job->mc->m.rows);
		return;
	}
	while (gpud_tp_claim(job->tp, ith, &lo, &hi))
		gpud_matmul_rows(job->mc, lo, hi);
}

void gpud_matmul_prepare(struct gpud_mm_call *mc, enum gpud_type wtype, bool packed,
			 const void *W, int64_t rows, int64_t cols, const float *x,
			 int64_t batch, float *y, void *scratch)
{
	*mc = (struct gpud_mm_call){
		.m = {
			.packed = packed,
			.wtype = wtype,
			.W = W,
			.wrow = gpud_type_row_bytes(wtype, (uint64_t)cols),
			.rows = rows,
			.cols = cols,
			.batch = batch,
			.x = x,
			.y = y,
		},
		.rows = mm_rows_ref,
	};
	struct gpud__mm *m = &mc->m;

	if (rows <= 0 || batch <= 0)
		return;
#ifdef GPUD_HAVE_X86
	if (use_vec()) {
		mc->rows = gpud__x86_mm_rows;
		m->avx512 = (gpud_cpu_features() & GPUD_CPU_AVX512) != 0;
		m->avx512vnni = m->avx512 && (gpud_cpu_features() & GPUD_CPU_AVX512VNNI) != 0;
		m->gfni = m->avx512vnni && (gpud_cpu_features() & GPUD_CPU_GFNI) != 0;
	}
#endif
	if (is_quant(wtype) || gpud__kq_type(wtype) || gpud__lq_type(wtype)) {
		const int64_t nb = cols / GPUD_QK;
		/* Offset the VNNI kernel folds in: q8_0 weights enter as
		 * w + 128 (u8), q4_0 as their nibble w + 8. The K-quants take
		 * the blocks' plain quant sums (off -1), Q2_K/Q3_K/Q6_K their
		 * half sums. */
		const int32_t off = wtype == GPUD_TYPE_Q8_0 ? 128
				    : wtype == GPUD_TYPE_Q4_0 ? 8
				    : gpud__lq_type(wtype) ? gpud__lq_act_off(wtype)
				    : wtype == GPUD_TYPE_Q2_K || wtype == GPUD_TYPE_Q3_K ||
						      wtype == GPUD_TYPE_Q6_K
					      ? GPUD__ACT_HALVES
				    : -1;
		float *xd = scratch;
		int32_t *xc = (int32_t *)(xd + batch * nb);
		int8_t *xq = (int8_t *)(xc + batch * nb);

		m->xd = xd;
		m->xc = xc;
		m->xq = xq;
#ifdef GPUD_HAVE_X86
		m->vnni = (gpud_cpu_features() & GPUD_CPU_AVXVNNI) != 0;
#endif
		for (int64_t b = 0; b < batch; b++) {
#ifdef GPUD_HAVE_X86
			if (use_vec()) {
				gpud__x86_quantize_act(x + b * cols, cols, off, xq + b * cols,
						       xd + b * nb, xc + b * nb);
				continue;
			}
#endif
			quantize_act_ref(x + b * cols, cols, off, xq + b * cols, xd + b * nb,
					 xc + b * nb);
		}
		if (gpud__kq_type(wtype)) {
			mc->rows = gpud__kq_mm_rows;
#ifdef GPUD_HAVE_X86
			if (use_vec())
				mc->rows = gpud__x86_kq_mm_rows;
#endif
		} else if (gpud__lq_type(wtype)) {
			mc->rows = gpud__lq_mm_rows;
#ifdef GPUD_HAVE_X86
			if (use_vec())
				mc->rows = gpud__x86_lq_mm_rows;
#endif
		}
		else if (mc->rows == mm_rows_ref)
			mc->rows = mm_rows_ref_i8;
	}
}

static void matmul(struct gpud_tp *tp, enum gpud_type wtype, bool packed, const void *W,
		   int64_t rows, int64_t cols, const float *x, int64_t batch, float *y,
		   void *scratch)
{
	struct gpud_mm_call mc;
	struct mm_job job = { .tp = tp, .mc = &mc };

	if (rows <= 0 || batch <= 0)
		return;
	gpud_matmul_prepare(&mc, wtype, packed, W, rows, cols, x, batch, y, scratch);
	if (gpud_tp_size(tp) > 1)
		gpud_tp_split(tp, (long)rows, MM_ROW_ALIGN);
	gpud_tp_run(tp, mm_worker, &job);
}

void gpud_matmul(struct gpud_tp *tp, enum gpud_type wtype, const void *W,
		 int64_t rows, int64_t cols, const float *x, int64_t batch,
		 float *y, void *scratch)
{
	matmul(tp, wtype, false, W, rows, cols, x, batch, y, scratch);
}

void gpud_matmul_packed(struct gpud_tp *tp, enum gpud_type wtype, const void *W,
			int64_t rows, int64_t cols, const float *x, int64_t batch,
			float *y, void *scratch)
{
	assert(gpud__pk_type(wtype) && rows % gpud__pk_rows(wtype) == 0);
	matmul(tp, wtype, true, W, rows, cols, x, batch, y, scratch);
}

int gpud_matmul_pack_rows(enum gpud_type t)
{
	return gpud__pk_rows(t);
}

bool gpud_matmul_packable(enum gpud_type t, int64_t rows, int64_t cols)
{
#ifdef GPUD_HAVE_X86
	int64_t be = gpud_type_block_elems(t);

	return gpud__pk_type(t) && rows > 0 && rows % gpud__pk_rows(t) == 0 && cols > 0 &&
	       be > 0 && cols % be == 0 && use_vec();
#else
	(void)t;
	(void)rows;
	(void)cols;
	return false;
#endif
}

struct pack_job {
	enum gpud_type t;
	const void *W;
	void *dst;
	int64_t groups, cols;
};

static void pack_worker(void *arg, int ith, int nth)
{
	const struct pack_job *j = arg;
	long lo, hi;

	gpud_tp_range((long)j->groups, ith, nth, 1, &lo, &hi);
	if (lo < hi)
		gpud__pk_pack_rows(j->t, j->W, j->dst, lo, hi, j->cols);
}

void gpud_matmul_pack(struct gpud_tp *tp, enum gpud_type t, const void *W, void *dst,
		      int64_t rows, int64_t cols)
{
	struct pack_job j = { .t = t, .W = W, .dst = dst, .groups = rows / gpud__pk_rows(t),
			      .cols = cols };

	assert(gpud__pk_type(t) && rows % gpud__pk_rows(t) == 0);
	gpud_tp_run(tp, pack_worker, &j);
}
