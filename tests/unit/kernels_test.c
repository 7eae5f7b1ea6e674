/* kernels_test.c - weight formats and matmul.
 *
 * Tolerances (S = sum over the row of |w_c * x_c|, n = cols):
 *  - conversions and quantize/dequantize rows: vector == portable, bit-exact;
 *  - quantize -> dequantize, per element: f32 exact; f16 relative 2^-11
 *    (normal range); bf16 relative 2^-8; q8_0 amax * (0.5/127 + 2^-10)
 *    + 128 * 2^-25; q4_0 amax / 8 * (1 + 2^-9) + 16 * 2^-25, and the mean
 *    error below amax / 16 (amax = max |x| of the element's 32-block; the
 *    absolute terms are the fp16 scale going subnormal for tiny blocks);
 *  - matmul vector vs portable: the same fp32 products, only the summation
 *    order differs: |dy| <= 2 * n * 2^-24 * S;
 *  - matmul vs a double loop over dequantized W and the original x:
 *    within 2 * n * 2^-24 * S for every type (activations stay fp32);
 *  - thread counts 1..4, a NULL pool, a column alone or inside any batch:
 *    bit-identical.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpud/backend/cpu/kernels.h"
#include "gpud/backend/cpu/threadpool.h"

#define VEC (GPUD_CPU_AVX2 | GPUD_CPU_FMA | GPUD_CPU_F16C)

static const enum gpud_type all_types[] = {
	GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,
};
#define N_TYPES (sizeof(all_types) / sizeof(all_types[0]))

static uint64_t rng_state;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-1, 1) with an occasional outlier, as real activations. */
static float rndf(void)
{
	float v = (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;

	if ((rnd() & 63) == 0)
		v *= 8.0f;
	return v;
}

static const char *tname(enum gpud_type t)
{
	switch (t) {
	case GPUD_TYPE_F32:
		return "f32";
	case GPUD_TYPE_F16:
		return "f16";
	case GPUD_TYPE_BF16:
		return "bf16";
	case GPUD_TYPE_Q8_0:
		return "q8_0";
	default:
		return "q4_0";
	}
}

static bool have_vec(void)
{
	gpud_cpu_set_features(~0u);
	return (gpud_cpu_features() & VEC) == VEC;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* ---- conversions ------------------------------------------------------- */

static void test_fp16_edges(void **state)
{
	static const struct {
		uint32_t f;
		uint16_t h;
	} cases[] = {
		{ 0x00000000, 0x0000 }, /* +0 */
		{ 0x80000000, 0x8000 }, /* -0 */
		{ 0x3f800000, 0x3c00 }, /* 1 */
		{ 0xc0000000, 0xc000 }, /* -2 */
		{ 0x477fe000, 0x7bff }, /* 65504, largest finite */
		{ 0x477fefff, 0x7bff }, /* just below the halfway point to 65536 */
		{ 0x477ff000, 0x7c00 }, /* 65520: tie, rounds to even = Inf */
		{ 0x7f7fffff, 0x7c00 }, /* FLT_MAX overflows */
		{ 0x7f800000, 0x7c00 }, /* Inf */
		{ 0xff800000, 0xfc00 }, /* -Inf */
		{ 0x38800000, 0x0400 }, /* 2^-14, smallest normal */
		{ 0x33800000, 0x0001 }, /* 2^-24, smallest subnormal */
		{ 0x33000000, 0x0000 }, /* 2^-25: tie between 0 and 1 -> 0 */
		{ 0x33000001, 0x0001 }, /* just above the tie */
		{ 0x33c00000, 0x0002 }, /* 3 * 2^-25: tie between 1 and 2 -> 2 */
		{ 0x387fc000, 0x03ff }, /* largest subnormal */
		{ 0x387fe000, 0x0400 }, /* halfway to 2^-14: tie -> even 0x400 */
		{ 0x3f801000, 0x3c00 }, /* 1 + 2^-11: tie -> even */
		{ 0x3f803000, 0x3c02 }, /* 1 + 3 * 2^-11: tie -> even */
		{ 0x3f801001, 0x3c01 }, /* just above the tie */
		{ 0x2f800000, 0x0000 }, /* far below: 0 */
		{ 0xb3800000, 0x8001 }, /* -2^-24 */
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(gpud_fp32_to_fp16(u2f(cases[i].f)), cases[i].h);
		if ((cases[i].h & 0x7fff) != 0x7c00 || cases[i].f == 0x7f800000)
			assert_true(cases[i].h == 0x7c00 || cases[i].h == 0xfc00 ||
				    gpud_fp16_to_fp32(cases[i].h) ==
					    gpud_fp16_to_fp32(gpud_fp32_to_fp16(u2f(cases[i].f))));
	}
	assert_true(gpud_fp16_to_fp32(0x0001) == ldexpf(1.0f, -24));
	assert_true(gpud_fp16_to_fp32(0x03ff) == ldexpf(1023.0f, -24));
	assert_true(gpud_fp16_to_fp32(0x7bff) == 65504.0f);
	assert_true(isinf(gpud_fp16_to_fp32(0xfc00)) && gpud_fp16_to_fp32(0xfc00) < 0);
	/* NaN stays NaN both ways and keeps its sign. */
	assert_true(isnan(gpud_fp16_to_fp32(0x7e00)));
	assert_true(isnan(gpud_fp16_to_fp32(0x7c01)));
	assert_true(signbit(gpud_fp16_to_fp32(0xfe00)));
	assert_int_equal(gpud_fp32_to_fp16(u2f(0x7fc00000)) & 0x7e00, 0x7e00);
	assert_int_equal(gpud_fp32_to_fp16(u2f(0x7f800001)) & 0x7e00, 0x7e00); /* sNaN */
	assert_int_equal(gpud_fp32_to_fp16(u2f(0xffc00000)), 0xfe00);
}

static void test_fp16_roundtrip_all(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = gpud_fp16_to_fp32((uint16_t)h);

		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
			assert_true(isnan(f));
			assert_true(gpud_fp32_to_fp16(f) == (h | 0x200)); /* quieted */
			continue;
		}
		assert_int_equal(gpud_fp32_to_fp16(f), h);
	}
}

/* Random floats: the result is a nearest fp16, ties to even. */
static void test_fp16_nearest(void **state)
{
	(void)state;
	rng_state = 0x1234567;
	for (int i = 0; i < 200000; i++) {
		/* exponents spread over the whole fp16 range and beyond */
		uint32_t u = (rnd() & 0x807fffff) | ((uint32_t)(96 + rnd() % 48) << 23);
		float f = u2f(u);
		uint16_t h = gpud_fp32_to_fp16(f);
		double got = gpud_fp16_to_fp32(h), err = fabs((double)f - got);

		if (isinf(got)) {
			assert_true(fabs((double)f) >= 65520.0);
			continue;
		}
		/* Neighbours (same sign) are no closer. */
		if ((h & 0x7fff) != 0x7bff) {
			double up = gpud_fp16_to_fp32((uint16_t)(h + 1));

			assert_true(err <= fabs((double)f - up));
			if (err == fabs((double)f - up))
				assert_int_equal(h & 1, 0);
		}
		if ((h & 0x7fff) != 0) {
			double dn = gpud_fp16_to_fp32((uint16_t)(h - 1));

			assert_true(err <= fabs((double)f - dn));
			if (err == fabs((double)f - dn))
				assert_int_equal(h & 1, 0);
		}
	}
}

static void test_bf16_edges(void **state)
{
	static const struct {
		uint32_t f;
		uint16_t h;
	} cases[] = {
		{ 0x3f800000, 0x3f80 }, { 0x80000000, 0x8000 },
		{ 0x3f808000, 0x3f80 }, /* tie -> even */
		{ 0x3f818000, 0x3f82 }, /* tie -> even (up) */
		{ 0x3f808001, 0x3f81 }, { 0x3f807fff, 0x3f80 },
		{ 0x7f7fffff, 0x7f80 }, /* rounds up to Inf */
		{ 0x7f800000, 0x7f80 }, { 0xff800000, 0xff80 },
		{ 0x00008000, 0x0000 }, /* subnormal tie -> even 0 */
		{ 0x00018000, 0x0002 }, { 0x00010000, 0x0001 },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(gpud_fp32_to_bf16(u2f(cases[i].f)), cases[i].h);
		assert_int_equal(f2u(gpud_bf16_to_fp32(cases[i].h)), (uint32_t)cases[i].h << 16);
	}
	/* NaN with a payload only in the low bits must not become Inf. */
	assert_true(isnan(gpud_bf16_to_fp32(gpud_fp32_to_bf16(u2f(0x7f800001)))));
	assert_true(isnan(gpud_bf16_to_fp32(gpud_fp32_to_bf16(u2f(0xffc00000)))));
	assert_true(signbit(gpud_bf16_to_fp32(gpud_fp32_to_bf16(u2f(0xffc00000)))));
	for (uint32_t h = 0; h < 0x10000; h++) {
		if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
			continue;
		assert_int_equal(gpud_fp32_to_bf16(gpud_bf16_to_fp32((uint16_t)h)), h);
	}
}

/* Special values through the row functions: vector == portable. */
static void test_rows_vector_matches_portable_specials(void **state)
{
	static const uint32_t sp[] = {
		0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
		0x7f800001, 0x33000000, 0x33000001, 0x33c00000, 0x387fe000, 0x477ff000,
		0x477fefff, 0x3f801000, 0x3f803000, 0x00000001, 0x80400000, 0x3f808000,
	};
	float x[24];
	uint16_t hv[24], hp[24];
	float fv[24], fp[24];

	(void)state;
	if (!have_vec()) {
		print_message("no AVX2/FMA/F16C: vector path not tested\n");
		return;
	}
	for (int i = 0; i < 24; i++)
		x[i] = u2f(sp[i % (sizeof(sp) / sizeof(sp[0]))]);
	for (int k = 0; k < 2; k++) {
		enum gpud_type t = k ? GPUD_TYPE_BF16 : GPUD_TYPE_F16;

		gpud_cpu_set_features(~0u);
		gpud_quantize_row(t, x, hv, 21);
		gpud_cpu_set_features(0);
		gpud_quantize_row(t, x, hp, 21);
		assert_memory_equal(hv, hp, 21 * sizeof(uint16_t));
		gpud_cpu_set_features(~0u);
		gpud_dequantize_row(t, hp, fv, 21);
		gpud_cpu_set_features(0);
		gpud_dequantize_row(t, hp, fp, 21);
		assert_memory_equal(fv, fp, 21 * sizeof(float));
	}
	/* Every fp16 pattern, NaNs included, expands identically. */
	{
		static uint16_t all[0x10000];
		static float ev[0x10000], ep[0x10000];

		for (uint32_t h = 0; h < 0x10000; h++)
			all[h] = (uint16_t)h;
		gpud_cpu_set_features(~0u);
		gpud_dequantize_row(GPUD_TYPE_F16, all, ev, 0x10000);
		gpud_cpu_set_features(0);
		gpud_dequantize_row(GPUD_TYPE_F16, all, ep, 0x10000);
		assert_memory_equal(ev, ep, sizeof(ev));
	}
	gpud_cpu_set_features(~0u);
}

static void test_features_mask(void **state)
{
	unsigned all;

	(void)state;
	gpud_cpu_set_features(~0u);
	all = gpud_cpu_features();
	gpud_cpu_set_features(0);
	assert_int_equal(gpud_cpu_features(), 0);
	gpud_cpu_set_features(GPUD_CPU_FMA);
	assert_int_equal(gpud_cpu_features(), all & GPUD_CPU_FMA);
	gpud_cpu_set_features(~0u);
	assert_int_equal(gpud_cpu_features(), all);
}

/* ---- quantize / dequantize -------------------------------------------- */

static void check_quant_error(enum gpud_type t, const float *x, const float *y, int64_t n)
{
	double sum_err = 0.0;

	for (int64_t b = 0; b < n / 32; b++) {
		float amax = 0.0f;

		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[b * 32 + j]));
		for (int j = 0; j < 32; j++) {
			float xi = x[b * 32 + j], yi = y[b * 32 + j];
			double e = fabs((double)xi - yi);

			sum_err += e;
			switch (t) {
			case GPUD_TYPE_F32:
				assert_true(e == 0.0);
				break;
			case GPUD_TYPE_F16:
				if (fabsf(xi) >= ldexpf(1.0f, -14))
					assert_true(e <= fabs(xi) * ldexp(1.0, -11));
				else
					assert_true(e <= ldexp(1.0, -25));
				break;
			case GPUD_TYPE_BF16:
				assert_true(e <= fabs(xi) * ldexp(1.0, -8));
				break;
			case GPUD_TYPE_Q8_0:
				assert_true(e <= amax * (0.5 / 127 + ldexp(1.0, -10)) + 128 * ldexp(1.0, -25));
				break;
			default:
				assert_true(e <= amax / 8.0 * (1 + ldexp(1.0, -9)) + 16 * ldexp(1.0, -25));
				break;
			}
		}
		if (t == GPUD_TYPE_Q4_0)
			assert_true(sum_err / 32 <= amax / 16.0 + 1e-30 || b > 0);
		sum_err = 0.0;
	}
}

static void test_quantize_roundtrip(void **state)
{
	enum { N = 32 * 37 };
	static float x[N], y[N];
	static uint8_t q[N * 4];

	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < N_TYPES; k++) {
			rng_state = 0xabcdef + k;
			for (int i = 0; i < N; i++)
				x[i] = rndf() * (i < 64 ? 1e-3f : 3.0f);
			/* an all-zero block and a constant block */
			for (int i = 64 * 2; i < 64 * 2 + 32; i++)
				x[i] = 0.0f;
			for (int i = 64 * 3; i < 64 * 3 + 32; i++)
				x[i] = -0.75f;
			gpud_quantize_row(all_types[k], x, q, N);
			gpud_dequantize_row(all_types[k], q, y, N);
			check_quant_error(all_types[k], x, y, N);
			/* zero block stays exactly zero */
			for (int i = 64 * 2; i < 64 * 2 + 32; i++)
				assert_true(y[i] == 0.0f);
		}
	}
	gpud_cpu_set_features(~0u);
}

/* Non-finite input is garbage in, but must not be undefined behaviour
 * (float to int casts) nor spill into the neighbouring blocks. */
static void test_quantize_nonfinite(void **state)
{
	float x[96], y[96], ref[32];
	uint8_t q[96 * 2], qref[64];

	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (int k = 3; k < 5; k++) {
			enum gpud_type t = all_types[k];

			for (int i = 0; i < 96; i++)
				x[i] = (float)(i % 7) - 3.0f;
			x[3] = NAN;
			x[40] = INFINITY;
			x[41] = -INFINITY;
			gpud_quantize_row(t, x, q, 96);
			gpud_dequantize_row(t, q, y, 96);
			/* block 2 is finite: same as quantized alone */
			gpud_quantize_row(t, x + 64, qref, 32);
			gpud_dequantize_row(t, qref, ref, 32);
			assert_memory_equal(y + 64, ref, sizeof(ref));
		}
	}
	gpud_cpu_set_features(~0u);
}

/* Known Q4_0/Q8_0 bytes: the layout is the file format. */
static void test_block_layout(void **state)
{
	float x[32], y[32];
	struct gpud_block_q4_0 b4;
	struct gpud_block_q8_0 b8;

	(void)state;
	assert_int_equal(sizeof(struct gpud_block_q8_0), 34);
	assert_int_equal(sizeof(struct gpud_block_q4_0), 18);
	for (int i = 0; i < 32; i++)
		x[i] = (float)(i - 16); /* -16 .. 15 */
	gpud_quantize_row(GPUD_TYPE_Q4_0, x, &b4, 32);
	assert_int_equal(b4.d, gpud_fp32_to_fp16(2.0f)); /* m = -16, d = 2 */
	/* x[0] = -16 -> q = 0 (low nibble of qs[0]); x[16] = 0 -> q = 8 (high) */
	assert_int_equal(b4.qs[0], 0x80);
	/* x[15] = -1 -> trunc(-0.5 + 8.5) = 8; x[31] = 15 -> min(15, 16) */
	assert_int_equal(b4.qs[15], 0xf8);
	gpud_dequantize_row(GPUD_TYPE_Q4_0, &b4, y, 32);
	/* +8.5 then truncation rounds halves up: x = 1 -> q = 9 -> 2 */
	assert_true(y[0] == -16.0f && y[16] == 0.0f && y[17] == 2.0f && y[18] == 2.0f);
	assert_true(y[31] == 14.0f);
	gpud_quantize_row(GPUD_TYPE_Q8_0, x, &b8, 32);
	assert_int_equal(b8.d, gpud_fp32_to_fp16(16.0f / 127.0f));
	assert_int_equal(b8.qs[0], -127);
	assert_int_equal(b8.qs[16], 0);
	assert_int_equal(b8.qs[31], 119); /* 15 / (16 / 127) = 119.06 */
}

static void test_rows_vector_matches_portable(void **state)
{
	enum { N = 32 * 29 + 0 };
	static float x[N], yv[N], yp[N];
	static uint8_t qv[N * 4], qp[N * 4];
	static const int64_t ns[] = { 32, 64, 96, 32 * 29 };

	(void)state;
	if (!have_vec()) {
		print_message("no AVX2/FMA/F16C: vector path not tested\n");
		return;
	}
	rng_state = 99;
	for (int i = 0; i < N; i++)
		x[i] = rndf() * 5.0f;
	for (size_t k = 0; k < N_TYPES; k++) {
		enum gpud_type t = all_types[k];

		for (size_t j = 0; j < sizeof(ns) / sizeof(ns[0]); j++) {
			int64_t n = ns[j] - ((t == GPUD_TYPE_F16 || t == GPUD_TYPE_BF16) ? 3 : 0);

			gpud_cpu_set_features(~0u);
			gpud_quantize_row(t, x, qv, n);
			gpud_cpu_set_features(0);
			gpud_quantize_row(t, x, qp, n);
			assert_memory_equal(qv, qp, gpud_type_row_bytes(t, (uint64_t)n));
			gpud_cpu_set_features(~0u);
			gpud_dequantize_row(t, qp, yv, n);
			gpud_cpu_set_features(0);
			gpud_dequantize_row(t, qp, yp, n);
			assert_memory_equal(yv, yp, (size_t)n * sizeof(float));
		}
	}
	gpud_cpu_set_features(~0u);
}

static void test_get_row(void **state)
{
	enum { ROWS = 5, COLS = 96 };
	static float w[ROWS * COLS], out[COLS], ref[COLS];
	static uint8_t q[ROWS * COLS * 4];

	(void)state;
	rng_state = 5;
	for (int i = 0; i < ROWS * COLS; i++)
		w[i] = rndf();
	for (size_t k = 0; k < N_TYPES; k++) {
		enum gpud_type t = all_types[k];

		gpud_quantize_row(t, w, q, ROWS * COLS);
		for (int r = 0; r < ROWS; r++) {
			gpud_get_row(t, q, COLS, r, out);
			gpud_dequantize_row(t, q + gpud_type_row_bytes(t, (uint64_t)COLS) * r, ref, COLS);
			assert_memory_equal(out, ref, sizeof(out));
		}
	}
}

/* ---- matmul ------------------------------------------------------------ */

struct mm_case {
	int64_t rows, cols;
	float *wf;     /* (rows, cols) original */
	uint8_t *w;    /* (rows, cols) in type */
	float *wd;     /* (rows, cols) dequantized */
	float *x;      /* (17, cols) */
	float *y;      /* (17, rows) */
	float *y2;     /* (17, rows) */
	void *scratch;
};

static void mm_case_init(struct mm_case *c, enum gpud_type t, int64_t rows, int64_t cols)
{
	c->rows = rows;
	c->cols = cols;
	c->wf = malloc(sizeof(float) * rows * cols);
	c->wd = malloc(sizeof(float) * rows * cols);
	c->w = malloc(gpud_type_row_bytes(t, (uint64_t)cols) * rows);
	c->x = malloc(sizeof(float) * 17 * cols);
	c->y = malloc(sizeof(float) * 17 * rows);
	c->y2 = malloc(sizeof(float) * 17 * rows);
	c->scratch = malloc(gpud_matmul_scratch_bytes(t, cols, 17) + 1);
	assert_non_null(c->wf);
	assert_non_null(c->wd);
	assert_non_null(c->w);
	assert_non_null(c->x);
	assert_non_null(c->y);
	assert_non_null(c->y2);
	assert_non_null(c->scratch);
	for (int64_t i = 0; i < rows * cols; i++)
		c->wf[i] = rndf();
	for (int64_t i = 0; i < 17 * cols; i++)
		c->x[i] = rndf();
	gpud_quantize_row(t, c->wf, c->w, rows * cols);
	gpud_dequantize_row(t, c->w, c->wd, rows * cols);
}

static void mm_case_free(struct mm_case *c)
{
	free(c->wf);
	free(c->wd);
	free(c->w);
	free(c->x);
	free(c->y);
	free(c->y2);
	free(c->scratch);
}

/* (rows, cols): 1184 columns span three 512-column chunks of the buffered
 * path. */
static const int64_t shapes[][2] = { { 1, 32 }, { 7, 96 }, { 37, 160 }, { 71, 416 }, { 19, 1184 } };
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

static double sum_abs(const struct mm_case *c, int64_t r, int64_t b)
{
	double s = 0.0;

	for (int64_t k = 0; k < c->cols; k++)
		s += fabs((double)c->wd[r * c->cols + k] * c->x[b * c->cols + k]);
	return s;
}

static bool is_q(enum gpud_type t)
{
	return t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q4_0;
}

/* Bound of the error q8_0/q4_0 matmuls add by quantizing x: each x is
 * off by at most half its block's step d = max|x| / 127. */
static double act_quant_err(const struct mm_case *c, int64_t r, int64_t b)
{
	double e = 0.0;

	for (int64_t k0 = 0; k0 < c->cols; k0 += 32) {
		double amax = 0.0, sw = 0.0;

		for (int64_t k = k0; k < k0 + 32; k++) {
			amax = fmax(amax, fabs(c->x[b * c->cols + k]));
			sw += fabs(c->wd[r * c->cols + k]);
		}
		e += amax / 127.0 / 2.0 * sw;
	}
	return e;
}

/* q8_0/q4_0 use quantized activations: the error bound is the
 * quantization step, not fp32 rounding; the measured error is also
 * checked against sum|w*x| (worst seen ~1e-2 on these random cases). */
static void test_matmul_vs_double(void **state)
{
	static const int64_t batches[] = { 1, 2, 4, 5, 17 };

	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < N_TYPES; k++) {
			enum gpud_type t = all_types[k];
			for (size_t s = 0; s < N_SHAPES; s++) {
				struct mm_case c;

				rng_state = 1000 + k * 10 + s;
				mm_case_init(&c, t, shapes[s][0], shapes[s][1]);
				for (size_t bi = 0; bi < 5; bi++) {
					int64_t batch = batches[bi];

					gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y, c.scratch);
					for (int64_t b = 0; b < batch; b++) {
						for (int64_t r = 0; r < c.rows; r++) {
							double want = 0.0, tol;

							for (int64_t i = 0; i < c.cols; i++)
								want += (double)c.wd[r * c.cols + i] *
									c.x[b * c.cols + i];
							tol = 2.0 * c.cols * ldexp(1.0, -24) * sum_abs(&c, r, b);
							if (is_q(t))
								tol = 1.001 * act_quant_err(&c, r, b) +
								      4.0 * c.cols * ldexp(1.0, -24) *
									      sum_abs(&c, r, b);
							if (fabs(c.y[b * c.rows + r] - want) > tol)
								fail_msg("%s %s r=%ld b=%ld cols=%ld: got %.9g want %.9g tol %.3g",
									 pass ? "vec" : "ref", tname(t),
									 (long)r, (long)b, (long)c.cols,
									 c.y[b * c.rows + r], want, tol);
						}
					}
				}
				mm_case_free(&c);
			}
		}
	}
	gpud_cpu_set_features(~0u);
}

static void test_matmul_vector_matches_portable(void **state)
{
	(void)state;
	if (!have_vec()) {
		print_message("no AVX2/FMA/F16C: vector path not tested\n");
		return;
	}
	for (size_t k = 0; k < N_TYPES; k++) {
		enum gpud_type t = all_types[k];

		if (is_q(t))
			continue; /* bit-exact: test_matmul_int8_paths_identical */
		for (size_t s = 0; s < N_SHAPES; s++) {
			struct mm_case c;

			rng_state = 2000 + k * 10 + s;
			mm_case_init(&c, t, shapes[s][0], shapes[s][1]);
			for (int64_t batch = 1; batch <= 17; batch++) {
				gpud_cpu_set_features(~0u);
				gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y, c.scratch);
				gpud_cpu_set_features(0);
				gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y2, c.scratch);
				for (int64_t b = 0; b < batch; b++) {
					for (int64_t r = 0; r < c.rows; r++) {
						double tol = 2.0 * c.cols * ldexp(1.0, -24) * sum_abs(&c, r, b);
						double d = fabs((double)c.y[b * c.rows + r] - c.y2[b * c.rows + r]);

						if (d > tol)
							fail_msg("%s r=%ld b=%ld/%ld cols=%ld: vec %.9g ref %.9g tol %.3g",
								 tname(t), (long)r, (long)b, (long)batch,
								 (long)c.cols, c.y[b * c.rows + r],
								 c.y2[b * c.rows + r], tol);
					}
				}
			}
			mm_case_free(&c);
		}
	}
	gpud_cpu_set_features(~0u);
}

/* The same inputs give the same bits whatever the thread count, with a
 * NULL pool, and whatever the batch a column is computed in. */
static void test_matmul_deterministic(void **state)
{
	struct gpud_tp *tp[5] = { NULL };
	static const int64_t rows_list[] = { 100, 33 };

	(void)state;
	for (int n = 1; n <= 4; n++)
		assert_int_equal(gpud_tp_create(&tp[n], n), 0);
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < N_TYPES; k++) {
			enum gpud_type t = all_types[k];

			for (size_t ri = 0; ri < 2; ri++) {
				struct mm_case c;

				rng_state = 3000 + k;
				mm_case_init(&c, t, rows_list[ri], ri ? 1184 : 160);
				for (int64_t batch = 1; batch <= 17; batch += 4) {
					gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y, c.scratch);
					for (int n = 1; n <= 4; n++) {
						memset(c.y2, 0xff, sizeof(float) * 17 * c.rows);
						gpud_matmul(tp[n], t, c.w, c.rows, c.cols, c.x, batch,
							    c.y2, c.scratch);
						assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
					}
					/* column b alone == column b of the batch */
					for (int64_t b = 0; b < batch; b++) {
						gpud_matmul(tp[2], t, c.w, c.rows, c.cols, c.x + b * c.cols, 1,
							    c.y2, c.scratch);
						assert_memory_equal(c.y + b * c.rows, c.y2, sizeof(float) * c.rows);
					}
				}
				mm_case_free(&c);
			}
		}
	}
	gpud_cpu_set_features(~0u);
	for (int n = 1; n <= 4; n++)
		gpud_tp_destroy(tp[n]);
}

/* Float types take any width; the tail past a multiple of 8 is summed too,
 * the same way whatever the batch. */
static void test_matmul_odd_width_float(void **state)
{
	static const enum gpud_type ft[] = { GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16 };
	static const int64_t widths[] = { 5, 45, 1037 };

	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < 3; k++) {
			for (size_t wi = 0; wi < 3; wi++) {
				int64_t n = widths[wi];
				struct mm_case c;

				rng_state = 4000 + k * 10 + wi;
				mm_case_init(&c, ft[k], 9, n);
				gpud_matmul(NULL, ft[k], c.w, 9, n, c.x, 9, c.y, NULL);
				for (int64_t b = 0; b < 9; b++) {
					for (int64_t r = 0; r < 9; r++) {
						double want = 0.0;

						for (int64_t i = 0; i < n; i++)
							want += (double)c.wd[r * n + i] * c.x[b * n + i];
						assert_true(fabs(c.y[b * 9 + r] - want) <=
							    2.0 * n * ldexp(1.0, -24) * sum_abs(&c, r, b));
					}
					gpud_matmul(NULL, ft[k], c.w, 9, n, c.x + b * n, 1, c.y2, NULL);
					assert_memory_equal(c.y + b * 9, c.y2, sizeof(float) * 9);
					/* and inside a batch of 4 */
					if (b + 4 <= 9) {
						gpud_matmul(NULL, ft[k], c.w, 9, n, c.x + b * n, 4, c.y2, NULL);
						assert_memory_equal(c.y + b * 9, c.y2, sizeof(float) * 9 * 4);
					}
				}
				mm_case_free(&c);
			}
		}
	}
	gpud_cpu_set_features(~0u);
}

/* q8_0/q4_0: portable, AVX2 (maddubs) and AVX-VNNI kernels compute the
 * same exact integer block sums and the same fp32 operations: identical
 * bits, for every batch, including extreme quants (q8_0 weights of -128
 * and +127 against activations that quantize to +-127) and rows that are
 * not a multiple of the 8-row tile. */
static void test_matmul_int8_paths_identical(void **state)
{
	const unsigned base = GPUD_CPU_AVX2 | GPUD_CPU_FMA | GPUD_CPU_F16C;
	static const int64_t rshapes[][2] = { { 1, 32 }, { 13, 96 }, { 37, 160 }, { 19, 1184 } };

	(void)state;
	if (!have_vec()) {
		print_message("no AVX2/FMA/F16C: vector int8 paths not tested\n");
		return;
	}
	if (!(gpud_cpu_features() & GPUD_CPU_AVXVNNI))
		print_message("no AVX-VNNI: only the AVX2 int8 path is compared\n");
	for (int q = 0; q < 2; q++) {
		enum gpud_type t = q ? GPUD_TYPE_Q4_0 : GPUD_TYPE_Q8_0;

		for (size_t s = 0; s < 4; s++) {
			struct mm_case c;
			float *y3;

			rng_state = 6000 + q * 10 + s;
			mm_case_init(&c, t, rshapes[s][0], rshapes[s][1]);
			y3 = malloc(sizeof(float) * 17 * c.rows);
			assert_non_null(y3);
			if (s == 1 && t == GPUD_TYPE_Q8_0) {
				/* extreme weight quants in the first blocks */
				for (int64_t r = 0; r < c.rows; r++) {
					struct gpud_block_q8_0 *blk =
						(struct gpud_block_q8_0 *)(c.w + gpud_type_row_bytes(t, (uint64_t)c.cols) * r);

					for (int j = 0; j < 32; j++)
						blk->qs[j] = (int8_t)((r + j) % 3 == 0 ? -128 : 127);
				}
			}
			if (s == 1) {
				/* activations at +-max in a block */
				for (int64_t k = 0; k < 32; k++)
					c.x[k] = (k & 1) ? -4.0f : 4.0f;
			}
			for (int64_t batch = 1; batch <= 17; batch++) {
				gpud_cpu_set_features(0);
				gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y, c.scratch);
				gpud_cpu_set_features(base);
				gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y2, c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				gpud_cpu_set_features(~0u);
				gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, y3, c.scratch);
				assert_memory_equal(c.y, y3, sizeof(float) * batch * c.rows);
			}
			free(y3);
			mm_case_free(&c);
		}
	}
	gpud_cpu_set_features(~0u);
}

/* q8_0/q4_0: an activation block with NaN or Inf makes that column's
 * outputs NaN (as fp32 would, instead of a finite garbage value), other
 * columns are unaffected; an all-zero or tiny block contributes 0. */
static void test_matmul_int8_specials(void **state)
{
	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (int q = 0; q < 2; q++) {
			enum gpud_type t = q ? GPUD_TYPE_Q4_0 : GPUD_TYPE_Q8_0;
			struct mm_case c;

			rng_state = 7000 + q;
			mm_case_init(&c, t, 9, 64);
			gpud_matmul(NULL, t, c.w, 9, 64, c.x, 4, c.y, c.scratch);
			c.x[0 * 64 + 40] = NAN;
			c.x[1 * 64 + 3] = INFINITY;
			for (int k = 0; k < 32; k++) {
				c.x[2 * 64 + k] = 0.0f;     /* zero block */
				c.x[3 * 64 + k] = 1e-35f;   /* tiny block: dropped */
			}
			gpud_matmul(NULL, t, c.w, 9, 64, c.x, 4, c.y2, c.scratch);
			for (int64_t r = 0; r < 9; r++) {
				assert_true(isnan(c.y2[0 * 9 + r]));
				assert_true(isnan(c.y2[1 * 9 + r]));
				assert_true(isfinite(c.y2[2 * 9 + r]));
			}
			/* the tiny block adds exactly nothing: same as zeros */
			for (int k = 0; k < 32; k++)
				c.x[3 * 64 + k] = 0.0f;
			gpud_matmul(NULL, t, c.w, 9, 64, c.x + 2 * 64, 2, c.y, c.scratch);
			assert_memory_equal(c.y + 9, c.y2 + 3 * 9, sizeof(float) * 9);
			assert_memory_equal(c.y, c.y2 + 2 * 9, sizeof(float) * 9);
			mm_case_free(&c);
		}
	}
	gpud_cpu_set_features(~0u);
}

static void test_matmul_empty_and_scratch(void **state)
{
	float y = 42.0f;

	(void)state;
	for (size_t k = 0; k < N_TYPES; k++) {
		size_t n = gpud_matmul_scratch_bytes(all_types[k], 768, 16);

		if (is_q(all_types[k])) {
			/* x quants (16 x 768) + scale and offset per block */
			assert_true(n >= 16 * 768 + 16 * 24 * 8 && n % 64 == 0);
			assert_true(n < 16 * 768 + 16 * 24 * 8 + 64);
			assert_true(gpud_matmul_scratch_bytes(all_types[k], 768, 1) <
				    gpud_matmul_scratch_bytes(all_types[k], 768, 2));
			assert_int_equal(gpud_matmul_scratch_bytes(all_types[k], 768, 0), 0);
		} else {
			assert_int_equal(n, 0);
		}
	}
	/* zero rows or zero batch: nothing is read or written */
	gpud_matmul(NULL, GPUD_TYPE_Q8_0, NULL, 0, 32, NULL, 1, &y, NULL);
	gpud_matmul(NULL, GPUD_TYPE_F32, NULL, 4, 32, NULL, 0, &y, NULL);
	assert_true(y == 42.0f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp16_edges),
		cmocka_unit_test(test_fp16_roundtrip_all),
		cmocka_unit_test(test_fp16_nearest),
		cmocka_unit_test(test_bf16_edges),
		cmocka_unit_test(test_features_mask),
		cmocka_unit_test(test_rows_vector_matches_portable_specials),
		cmocka_unit_test(test_quantize_roundtrip),
		cmocka_unit_test(test_quantize_nonfinite),
		cmocka_unit_test(test_block_layout),
		cmocka_unit_test(test_rows_vector_matches_portable),
		cmocka_unit_test(test_get_row),
		cmocka_unit_test(test_matmul_vs_double),
		cmocka_unit_test(test_matmul_vector_matches_portable),
		cmocka_unit_test(test_matmul_deterministic),
		cmocka_unit_test(test_matmul_odd_width_float),
		cmocka_unit_test(test_matmul_int8_paths_identical),
		cmocka_unit_test(test_matmul_int8_specials),
		cmocka_unit_test(test_matmul_empty_and_scratch),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
