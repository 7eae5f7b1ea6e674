/* kernels_kq_test.c - the K-quant matmul, and the other 32-weight types'
 * (Q4_1, Q5_0, Q5_1, IQ4_NL, and IQ4_XS: kernels_kq.c, kernels_kq_x86.c,
 * kernels_avx512.c, dispatch).
 *
 * The formats are tested in quant_kq_test.c and quant_lq_test.c. Tolerances (S = sum over the
 * row of |w_c * x_c| with W dequantized):
 *  - against a double loop over dequantized W and the x the kernel sees
 *    (32-blocks, dx = max|x| / 127, q = round(x / dx), as kernels.h says):
 *    64 * 2^-24 * S (fp32 products d * dx, the fp32 accumulator, and the
 *    rounding inside each dequantized weight);
 *  - against the original fp32 x: that plus half an activation step per
 *    element, sum over 32-blocks of max|x| / 254 * sum |w|;
 *  - every CPU path (portable, vector where present, AVX2 without VNNI
 *    and AVX-512), thread counts
 *    1..4, a NULL pool, a column alone or inside any batch: bit-identical;
 *  - a NaN or Inf in one column's activations makes that column's outputs
 *    NaN and no other's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpud/backend/cpu/kernels.h"
#include "gpud/backend/cpu/threadpool.h"
#include "gpud/quant.h"
#include "tests/unit/test_rand.h"

static const enum gpud_type kq_types[] = {
	GPUD_TYPE_Q2_K, GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K, GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K,
	GPUD_TYPE_Q4_1, GPUD_TYPE_Q5_0, GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL, GPUD_TYPE_IQ4_XS,
};
#define N_KQ (sizeof(kq_types) / sizeof(kq_types[0]))
#define MAXB 17

struct mm_case {
	int64_t rows, cols;
	uint8_t *w;    /* (rows, cols) in type */
	float *wd;     /* (rows, cols) dequantized */
	float *x;      /* (MAXB, cols) */
	float *xd;     /* (MAXB, cols) through Q8_K and back */
	float *y, *y2; /* (MAXB, rows) */
	void *scratch;
};

static void mm_case_init(struct mm_case *c, enum gpud_type t, int64_t rows, int64_t cols)
{
	float *wf = malloc(sizeof(float) * rows * cols);

	c->rows = rows;
	c->cols = cols;
	c->wd = malloc(sizeof(float) * rows * cols);
	c->w = malloc(gpud_type_row_bytes(t, (uint64_t)cols) * rows);
	c->x = malloc(sizeof(float) * MAXB * cols);
	c->xd = malloc(sizeof(float) * MAXB * cols);
	c->y = malloc(sizeof(float) * MAXB * rows);
	c->y2 = malloc(sizeof(float) * MAXB * rows);
	c->scratch = aligned_alloc(64, gpud_matmul_scratch_bytes(t, cols, MAXB));
	assert_non_null(wf);
	assert_non_null(c->wd);
	assert_non_null(c->w);
	assert_non_null(c->x);
	assert_non_null(c->xd);
	assert_non_null(c->y);
	assert_non_null(c->y2);
	assert_non_null(c->scratch);
	for (int64_t i = 0; i < rows * cols; i++)
		wf[i] = 0.02f * rndf();
	for (int64_t i = 0; i < MAXB * cols; i++)
		c->x[i] = rndf();
	gpud_quantize_row(t, wf, c->w, rows * cols);
	gpud_dequantize_row(t, c->w, c->wd, rows * cols);
	for (int64_t i0 = 0; i0 < MAXB * cols; i0 += 32) {
		float amax = 0, d, id;

		for (int64_t i = i0; i < i0 + 32; i++)
			amax = fmaxf(amax, fabsf(c->x[i]));
		d = amax / 127.0f;
		id = d != 0.0f ? 1.0f / d : 0.0f;
		for (int64_t i = i0; i < i0 + 32; i++)
			c->xd[i] = d * nearbyintf(c->x[i] * id);
	}
	free(wf);
}

static void mm_case_free(struct mm_case *c)
{
	free(c->wd);
	free(c->w);
	free(c->x);
	free(c->xd);
	free(c->y);
	free(c->y2);
	free(c->scratch);
}

/* The paths compared: portable, everything this CPU has, and AVX2
 * without VNNI or AVX-512 (vpmaddubsw where vpdpbusd would be). */
static const unsigned features[3] = { 0, ~0u, GPUD_CPU_AVX2 | GPUD_CPU_FMA | GPUD_CPU_F16C };

static const int64_t shapes[][2] = { { 1, 256 }, { 7, 512 }, { 37, 768 }, { 19, 3072 } };
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

static void test_matmul_vs_double(void **state)
{
	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < N_KQ; k++)
			for (size_t s = 0; s < N_SHAPES; s++) {
				enum gpud_type t = kq_types[k];
				struct mm_case c;
				double worst = 0;

				rng_state = 100 + 10 * k + s;
				mm_case_init(&c, t, shapes[s][0], shapes[s][1]);
				gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, MAXB, c.y, c.scratch);
				for (int64_t b = 0; b < MAXB; b++)
					for (int64_t r = 0; r < c.rows; r++) {
						const float *wr = c.wd + r * c.cols;
						const float *xb = c.x + b * c.cols, *xq = c.xd + b * c.cols;
						double exact = 0, want = 0, sabs = 0, qerr = 0;

						for (int64_t i = 0; i < c.cols; i++) {
							exact += (double)wr[i] * xq[i];
							want += (double)wr[i] * xb[i];
							sabs += fabs((double)wr[i] * xq[i]);
						}
						for (int64_t i0 = 0; i0 < c.cols; i0 += 32) {
							double amax = 0, sw = 0;

							for (int64_t i = i0; i < i0 + 32; i++) {
								amax = fmax(amax, fabs(xb[i]));
								sw += fabs(wr[i]);
							}
							qerr += amax / 254.0 * sw;
						}
						double got = c.y[b * c.rows + r];
						double tol = 64.0 * 0x1p-24 * sabs + 1e-30;

						if (fabs(got - exact) > tol)
							fail_msg("%s %lldx%lld r %lld b %lld: %.9g, exact %.9g (S %g)",
								 gpud_type_name(t), (long long)c.rows,
								 (long long)c.cols, (long long)r, (long long)b,
								 got, exact, sabs);
						assert_true(fabs(got - want) <= tol + qerr);
						worst = fmax(worst, fabs(got - exact) / sabs);
					}
				print_message("%s %lldx%lld: worst |y - exact| / S = %.2e\n",
					      gpud_type_name(t), (long long)c.rows, (long long)c.cols, worst);
				mm_case_free(&c);
			}
	}
	gpud_cpu_set_features(~0u);
}

/* Same bits on every path, thread count, batch and position in it. */
static void test_matmul_deterministic(void **state)
{
	struct gpud_tp *tp[5] = { NULL };

	(void)state;
	for (int n = 1; n <= 4; n++)
		assert_int_equal(gpud_tp_create(&tp[n], n), 0);
	for (size_t k = 0; k < N_KQ; k++) {
		enum gpud_type t = kq_types[k];
		struct mm_case c;

		rng_state = 3000 + k;
		mm_case_init(&c, t, 100, 1024);
		gpud_cpu_set_features(0);
		gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, MAXB, c.y, c.scratch);
		for (int pass = 0; pass < 3; pass++) {
			gpud_cpu_set_features(features[pass]);
			for (int64_t batch = 1; batch <= MAXB; batch += 4) {
				for (int n = 1; n <= 4; n++) {
					memset(c.y2, 0xff, sizeof(float) * MAXB * c.rows);
					gpud_matmul(tp[n], t, c.w, c.rows, c.cols, c.x, batch, c.y2,
						    c.scratch);
					assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				}
				for (int64_t b = 0; b < batch; b++) {
					gpud_matmul(tp[2], t, c.w, c.rows, c.cols, c.x + b * c.cols, 1,
						    c.y2, c.scratch);
					assert_memory_equal(c.y + b * c.rows, c.y2, sizeof(float) * c.rows);
				}
			}
		}
		mm_case_free(&c);
	}
	gpud_cpu_set_features(~0u);
	for (int n = 1; n <= 4; n++)
		gpud_tp_destroy(tp[n]);
}

static void test_matmul_nonfinite_x(void **state)
{
	(void)state;
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < N_KQ; k++) {
			enum gpud_type t = kq_types[k];
			struct mm_case c;

			rng_state = 77 + k;
			mm_case_init(&c, t, 9, 512);
			c.x[3 * 512 + 300] = pass ? INFINITY : NAN;
			memset(c.x + 5 * 512, 0, 512 * sizeof(float)); /* an all-zero column */
			gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, 8, c.y, c.scratch);
			for (int64_t b = 0; b < 8; b++)
				for (int64_t r = 0; r < 9; r++) {
					float v = c.y[b * 9 + r];

					if (b == 3)
						assert_true(isnan(v));
					else if (b == 5)
						assert_float_equal(v, 0.0f, 0);
					else
						assert_true(isfinite(v));
				}
			mm_case_free(&c);
		}
	}
	gpud_cpu_set_features(~0u);
}

/* The fp16 factors (d, and dmin where the type has one) of block b of
 * type t set to v, the rest untouched. */
static void set_factors(enum gpud_type t, uint8_t *b, uint16_t v)
{
	size_t d, dmin = 0; /* offsets; no type has dmin at 0 */

	switch (t) {
	case GPUD_TYPE_Q2_K:
		d = offsetof(struct gpud_block_q2_k, d);
		dmin = offsetof(struct gpud_block_q2_k, dmin);
		break;
	case GPUD_TYPE_Q3_K:
		d = offsetof(struct gpud_block_q3_k, d);
		break;
	case GPUD_TYPE_Q4_K: /* Q5_K: the same head */
	case GPUD_TYPE_Q5_K:
		d = offsetof(struct gpud_block_q4_k, d);
		dmin = offsetof(struct gpud_block_q4_k, dmin);
		break;
	case GPUD_TYPE_Q4_1: /* Q5_1: the same head, d then m */
	case GPUD_TYPE_Q5_1:
		d = offsetof(struct gpud_block_q4_1, d);
		dmin = offsetof(struct gpud_block_q4_1, m);
		break;
	case GPUD_TYPE_Q5_0: /* IQ4_NL and IQ4_XS: d first too */
	case GPUD_TYPE_IQ4_NL:
	case GPUD_TYPE_IQ4_XS:
		d = 0;
		break;
	default:
		d = offsetof(struct gpud_block_q6_k, d);
		break;
	}
	memcpy(b + d, &v, 2);
	if (dmin)
		memcpy(b + dmin, &v, 2);
}

/* The vector kernels add several products in i16 before scaling them:
 * blocks with every quant, scale and min at an extreme (each byte one
 * pattern) against activations all at +-127 must still give the portable
 * kernel's exact integers, plain and packed, at batch 1 and 8. */
static void test_matmul_extremes(void **state)
{
	static const uint8_t pat[] = { 0x00, 0xff, 0x7f, 0x80, 0xaa, 0x55, 0xc0, 0x3f };
	enum { ROWS = 16, COLS = 512, B = 8 };
	float *x = malloc(sizeof(float) * B * COLS), *y = malloc(sizeof(float) * B * ROWS);
	float *y2 = malloc(sizeof(float) * B * ROWS);

	(void)state;
	assert_non_null(x);
	assert_non_null(y);
	assert_non_null(y2);
	for (int64_t b = 0; b < B; b++)
		for (int64_t i = 0; i < COLS; i++) /* +, -, alternating, by 16s, ... */
			x[b * COLS + i] = b == 0   ? 1.0f
					  : b == 1 ? -1.0f
					  : b == 2 ? (i % 2 ? -1.0f : 1.0f)
					  : b == 3 ? (i / 16 % 2 ? -1.0f : 1.0f)
					  : b == 4 ? (i % 32 == 0 ? -1.0f : 1e-3f)
						   : ((i * 7 + b) % 5 < 3 ? 1.0f : -1.0f);
	for (size_t k = 0; k < N_KQ; k++) {
		enum gpud_type t = kq_types[k];
		const size_t rb = gpud_type_row_bytes(t, COLS), bs = gpud_type_block_bytes(t);
		uint8_t *w = malloc(rb * ROWS), *wp = malloc(rb * ROWS);
		void *scratch = aligned_alloc(64, gpud_matmul_scratch_bytes(t, COLS, B));

		assert_non_null(w);
		assert_non_null(wp);
		assert_non_null(scratch);
		for (size_t p = 0; p < sizeof(pat); p++) {
			/* row r: pattern p, or its neighbour, so rows differ */
			for (int64_t r = 0; r < ROWS; r++) {
				memset(w + r * rb, pat[(p + (size_t)r % 2) % sizeof(pat)], rb);
				for (size_t o = 0; o < rb; o += bs)
					set_factors(t, w + r * rb + o, 0x2400); /* 1/64 */
			}
			gpud_cpu_set_features(0);
			gpud_matmul(NULL, t, w, ROWS, COLS, x, B, y, scratch);
			gpud_cpu_set_features(~0u);
			for (int64_t batch = 1; batch <= B; batch += B - 1) {
				gpud_matmul(NULL, t, w, ROWS, COLS, x, batch, y2, scratch);
				assert_memory_equal(y, y2, sizeof(float) * batch * ROWS);
				gpud_cpu_set_features(features[2]); /* AVX2 without VNNI */
				gpud_matmul(NULL, t, w, ROWS, COLS, x, batch, y2, scratch);
				assert_memory_equal(y, y2, sizeof(float) * batch * ROWS);
				gpud_cpu_set_features(~0u);
				if (!gpud_matmul_packable(t, ROWS, COLS))
					continue;
				gpud_matmul_pack(NULL, t, w, wp, ROWS, COLS);
				gpud_matmul_packed(NULL, t, wp, ROWS, COLS, x, batch, y2, scratch);
				assert_memory_equal(y, y2, sizeof(float) * batch * ROWS);
			}
		}
		free(scratch);
		free(wp);
		free(w);
	}
	free(y2);
	free(y);
	free(x);
}

static void test_scratch_and_rows(void **state)
{
	float out[512], want[512];
	struct mm_case c;

	(void)state;
	for (size_t k = 0; k < N_KQ; k++) {
		enum gpud_type t = kq_types[k];

		assert_int_equal(gpud_matmul_scratch_bytes(t, 3072, 1),
				 gpud_matmul_scratch_bytes(GPUD_TYPE_Q8_0, 3072, 1));
		assert_int_equal(gpud_matmul_scratch_bytes(t, 3072, 16), 16 * (3072 + 96 * 8));
		assert_int_equal(gpud_matmul_scratch_bytes(t, 3072, 0), 0);
		/* embedding rows: gpud_dequantize_row()'s bits */
		rng_state = 9 + k;
		mm_case_init(&c, t, 5, 512);
		for (int pass = 0; pass < 2; pass++) {
			gpud_cpu_set_features(pass ? ~0u : 0);
			gpud_get_row(t, c.w, 512, 3, out);
			gpud_dequantize_row(t, c.w + 3 * gpud_type_row_bytes(t, 512), want, 512);
			assert_memory_equal(out, want, sizeof(out));
		}
		mm_case_free(&c);
	}
	gpud_cpu_set_features(~0u);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_matmul_vs_double),
		cmocka_unit_test(test_matmul_deterministic),
		cmocka_unit_test(test_matmul_nonfinite_x),
		cmocka_unit_test(test_matmul_extremes),
		cmocka_unit_test(test_scratch_and_rows),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
