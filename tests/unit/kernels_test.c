/* kernels_test.c - the CPU backend's kernels: rows and matmul.
 *
 * The formats themselves are tested in quant_test.c. Tolerances (S = sum
 * over the row of |w_c * x_c|, n = cols):
 *  - gpud_get_row, vector and portable: gpud_dequantize_row()'s bits;
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
#include "gpud/backend/cpu/vec8.h"
#include "gpud/quant.h"
#include "tests/unit/test_rand.h"

#define VEC (GPUD_CPU_AVX2 | GPUD_CPU_FMA | GPUD_CPU_F16C)

static const enum gpud_type all_types[] = {
	GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,
};
#define N_TYPES (sizeof(all_types) / sizeof(all_types[0]))

/* The vector kernels' tests are skipped (cmocka's skip(), reported as
 * such) on a CPU without AVX2, FMA and F16C. */
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

/* ---- rows -------------------------------------------------------------- */

/* Special values through gpud_get_row: vector == gpud_dequantize_row(). */
static void test_get_row_vector_specials(void **state)
{
	static const uint32_t sp[] = {
		0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
		0x7f800001, 0x33000000, 0x33000001, 0x33c00000, 0x387fe000, 0x477ff000,
		0x477fefff, 0x3f801000, 0x3f803000, 0x00000001, 0x80400000, 0x3f808000,
	};
	float x[24];
	uint16_t h[24];
	float fv[24], fp[24];

	(void)state;
	if (!have_vec())
		skip();
	for (int i = 0; i < 24; i++)
		x[i] = u2f(sp[i % (sizeof(sp) / sizeof(sp[0]))]);
	for (int k = 0; k < 2; k++) {
		enum gpud_type t = k ? GPUD_TYPE_BF16 : GPUD_TYPE_F16;

		gpud_quantize_row(t, x, h, 21);
		gpud_cpu_set_features(~0u);
		gpud_get_row(t, h, 21, 0, fv);
		gpud_dequantize_row(t, h, fp, 21);
		assert_memory_equal(fv, fp, 21 * sizeof(float));
	}
	/* Every fp16 and bf16 pattern, NaNs included, expands identically. */
	{
		static uint16_t all[0x10000];
		static float ev[0x10000], ep[0x10000];

		for (uint32_t i = 0; i < 0x10000; i++)
			all[i] = (uint16_t)i;
		for (int k = 0; k < 2; k++) {
			enum gpud_type t = k ? GPUD_TYPE_BF16 : GPUD_TYPE_F16;

			gpud_get_row(t, all, 0x10000, 0, ev);
			gpud_dequantize_row(t, all, ep, 0x10000);
			assert_memory_equal(ev, ep, sizeof(ev));
		}
	}
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

/* gpud_get_row, vector path: the rows of gpud_dequantize_row(), bit for
 * bit, for every type and widths with and without a vector tail. */
static void test_get_row_vector_matches_reference(void **state)
{
	enum { N = 32 * 29 + 0 };
	static float x[N], yv[N], yp[N];
	static uint8_t q[N * 4];
	static const int64_t ns[] = { 32, 64, 96, 32 * 29 };

	(void)state;
	if (!have_vec())
		skip();
	rng_state = 99;
	for (int i = 0; i < N; i++)
		x[i] = rndf() * 5.0f;
	for (size_t k = 0; k < N_TYPES; k++) {
		enum gpud_type t = all_types[k];

		for (size_t j = 0; j < sizeof(ns) / sizeof(ns[0]); j++) {
			int64_t n = ns[j] - ((t == GPUD_TYPE_F16 || t == GPUD_TYPE_BF16) ? 3 : 0);

			gpud_quantize_row(t, x, q, n);
			gpud_cpu_set_features(~0u);
			gpud_get_row(t, q, n, 0, yv);
			gpud_dequantize_row(t, q, yp, n);
			assert_memory_equal(yv, yp, (size_t)n * sizeof(float));
		}
	}
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
	for (int pass = 0; pass < 2; pass++) {
		gpud_cpu_set_features(pass ? ~0u : 0);
		for (size_t k = 0; k < N_TYPES; k++) {
			enum gpud_type t = all_types[k];

			gpud_quantize_row(t, w, q, ROWS * COLS);
			for (int r = 0; r < ROWS; r++) {
				gpud_get_row(t, q, COLS, r, out);
				gpud_dequantize_row(t, q + gpud_type_row_bytes(t, (uint64_t)COLS) * r,
						    ref, COLS);
				assert_memory_equal(out, ref, sizeof(out));
			}
		}
	}
	gpud_cpu_set_features(~0u);
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
									 pass ? "vec" : "ref", gpud_type_name(t),
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
	if (!have_vec())
		skip();
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
								 gpud_type_name(t), (long)r, (long)b, (long)batch,
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
	if (!have_vec())
		skip();
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

/* The packed layouts (kernels.h, pack.c) of q4_0, q8_0, q2_k .. q6_k, q4_1,
 * q5_0, q5_1, iq4_nl, iq4_xs, f16, bf16:
 * the same bits as the plain matrix on every path (packed vector with and
 * without VNNI, AVX-512 and GFNI, packed portable, plain), at every batch size, on whole
 * matrices, on 8-row-aligned slices and through a thread pool;
 * gpud_matmul_packable() only with the vector kernels, for those types and
 * rows a multiple of 8. */
static void test_matmul_packed(void **state)
{
	static const enum gpud_type pts[] = { GPUD_TYPE_Q4_0, GPUD_TYPE_Q8_0, GPUD_TYPE_Q2_K,
					      GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K, GPUD_TYPE_Q5_K,
					      GPUD_TYPE_Q6_K, GPUD_TYPE_F16, GPUD_TYPE_BF16,
					      GPUD_TYPE_F32, GPUD_TYPE_Q4_1, GPUD_TYPE_Q5_0,
					      GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL, GPUD_TYPE_IQ4_XS };
	static const int64_t rows_of[] = { 8, 24, 64, 40 };
	static const int64_t rows_f16[] = { 16, 32, 80, 48 };
	static const int64_t cols_f16[] = { 7, 96, 161, 1184 };
	static const int64_t cols_i8[] = { 32, 96, 160, 1184 };
	static const int64_t cols_kq[] = { 256, 512, 256, 1280 };
	struct gpud_tp *tp = NULL;

	(void)state;
	if (!have_vec())
		skip();
	if (!(gpud_cpu_features() & GPUD_CPU_AVX512))
		print_message("no AVX-512: its packed kernels are not compared\n");
	assert_int_equal(gpud_tp_create(&tp, 3), 0);
	assert_true(gpud_matmul_packable(GPUD_TYPE_Q4_0, 16, 64));
	assert_true(gpud_matmul_packable(GPUD_TYPE_Q6_K, 16, 256));
	assert_false(gpud_matmul_packable(GPUD_TYPE_Q4_0, 12, 64));
	assert_false(gpud_matmul_packable(GPUD_TYPE_Q4_K, 16, 64)); /* not whole blocks */
	assert_true(gpud_matmul_packable(GPUD_TYPE_Q3_K, 16, 256));
	assert_false(gpud_matmul_packable(GPUD_TYPE_Q2_K, 16, 128)); /* not whole blocks */
	assert_true(gpud_matmul_packable(GPUD_TYPE_F16, 16, 7));
	assert_false(gpud_matmul_packable(GPUD_TYPE_F16, 24, 64)); /* f16 groups are 16 rows */
	assert_true(gpud_matmul_packable(GPUD_TYPE_F32, 16, 7));
	assert_false(gpud_matmul_packable(GPUD_TYPE_F32, 24, 64)); /* 16-row groups */
	assert_int_equal(gpud_matmul_pack_rows(GPUD_TYPE_Q4_K), 8);
	assert_int_equal(gpud_matmul_pack_rows(GPUD_TYPE_F32), 16);
	assert_int_equal(gpud_matmul_pack_rows(GPUD_TYPE_BF16), 16);
	assert_true(gpud_matmul_packable(GPUD_TYPE_BF16, 16, 7));
	assert_false(gpud_matmul_packable(GPUD_TYPE_BF16, 24, 64)); /* 16-row groups */
	gpud_cpu_set_features(0);
	assert_false(gpud_matmul_packable(GPUD_TYPE_Q4_0, 16, 64));
	gpud_cpu_set_features(~0u);
	for (size_t k = 0; k < sizeof(pts) / sizeof(pts[0]); k++) {
		const enum gpud_type t = pts[k];
		const bool kq = gpud_type_block_elems(t) == GPUD_QK_K;
		const bool h16 = t == GPUD_TYPE_F16 || t == GPUD_TYPE_BF16 || t == GPUD_TYPE_F32;

		for (size_t s = 0; s < 4; s++) {
			size_t wbytes, rb;
			struct mm_case c;
			uint8_t *pk;
			float *y3;

			rng_state = 6500 + 10 * k + s;
			if (h16)
				mm_case_init(&c, t, rows_f16[s], cols_f16[s]);
			else
				mm_case_init(&c, t, rows_of[s], kq ? cols_kq[s] : cols_i8[s]);
			rb = gpud_type_row_bytes(t, (uint64_t)c.cols);
			wbytes = rb * (size_t)c.rows;
			pk = malloc(wbytes);
			y3 = malloc(sizeof(float) * 17 * c.rows);
			assert_non_null(pk);
			assert_non_null(y3);
			if (s == 1)
				for (int64_t j = 0; j < 32; j++)
					c.x[j] = (j & 1) ? -4.0f : 4.0f; /* +-max quants */
			gpud_matmul_pack(s & 1 ? tp : NULL, t, c.w, pk, c.rows, c.cols);
			/* a real reordering of the same bytes */
			assert_memory_not_equal(pk, c.w, wbytes);
			/* rows gathered from the packed copy (a tied embedding) */
			for (int64_t r = 0; r < c.rows; r++) {
				float *ra = malloc(sizeof(float) * 2 * (size_t)c.cols);

				assert_non_null(ra);
				gpud_get_row(t, c.w, c.cols, r, ra);
				gpud_get_row_packed(t, pk, c.cols, r, ra + c.cols);
				assert_memory_equal(ra, ra + c.cols, sizeof(float) * (size_t)c.cols);
				free(ra);
			}
			for (int64_t batch = 1; batch <= 17; batch += (kq ? 3 : 1)) {
				gpud_cpu_set_features(~0u);
				if (h16) {
					/* f16/bf16/f32 packed sums each element in column order
					 * (one fma chain), the plain kernel in 8 lanes:
					 * the reference here is the packed portable
					 * path, and the plain result is within the
					 * float bound (test_matmul_vs_double) */
					gpud_cpu_set_features(0);
					gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, batch, c.y,
							   c.scratch);
					gpud_cpu_set_features(~0u);
					gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, y3,
						    c.scratch);
					for (int64_t e = 0; e < batch * c.rows; e++)
						assert_true(fabsf(y3[e] - c.y[e]) <=
							    1e-5f * (1.0f + fabsf(c.y[e])) * c.cols);
				} else {
					gpud_matmul(NULL, t, c.w, c.rows, c.cols, c.x, batch, c.y,
						    c.scratch);
				}
				gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, batch, c.y2,
						   c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				gpud_matmul_packed(tp, t, pk, c.rows, c.cols, c.x, batch, c.y2,
						   c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				/* AVX-512 without GFNI (Q3_K's batch-1 kernel has
				 * both) */
				gpud_cpu_set_features(~(unsigned)GPUD_CPU_GFNI);
				gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, batch, c.y2,
						   c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				/* AVX2 with VNNI, without AVX-512 */
				gpud_cpu_set_features(VEC | GPUD_CPU_AVXVNNI);
				gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, batch, c.y2,
						   c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				gpud_cpu_set_features(VEC); /* AVX2 without VNNI */
				gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, batch, c.y2,
						   c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
				gpud_cpu_set_features(0); /* the portable reader of the layout */
				gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, batch, c.y2,
						   c.scratch);
				assert_memory_equal(c.y, c.y2, sizeof(float) * batch * c.rows);
			}
			gpud_cpu_set_features(~0u);
			/* a slice of rows from group 1 on, as the fused decode
			 * sections take them */
			if (c.rows >= 32) {
				int64_t off = h16 ? 16 : 8, n = c.rows - off;

				gpud_matmul_packed(NULL, t, pk + off * rb, n, c.cols, c.x, 3, y3,
						   c.scratch);
				gpud_matmul_packed(NULL, t, pk, c.rows, c.cols, c.x, 3, c.y,
						   c.scratch);
				for (int64_t b = 0; b < 3; b++)
					assert_memory_equal(y3 + b * n, c.y + b * c.rows + off,
							    sizeof(float) * (size_t)n);
			}
			free(pk);
			free(y3);
			mm_case_free(&c);
		}
	}
	gpud_tp_destroy(tp);
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

/* exp8 (the attention's exponential) of 8 floats in place: as built here
 * (the default target) and in an avx2 function, attend()'s clone. */
static void exp8_default(float *io)
{
	v8f v = load8(io);

	exp8(&v);
	memcpy(io, &v, sizeof(v));
}

__attribute__((target("avx2"))) static void exp8_avx2(float *io)
{
	v8f v = load8(io);

	exp8(&v);
	memcpy(io, &v, sizeof(v));
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

/* Within 2 ulp of exp rounded from double (1 here) at every 61st float
 * from -87 to 88 (some 35 million; every 6100th under valgrind), the same
 * bits in the avx2 build and in every lane; 0 below -87 and at -inf, +inf
 * above 88, NaN at NaN, exactly 1 at 0. */
static void test_exp8(void **state)
{
	bool avx2 = __builtin_cpu_supports("avx2");
	uint32_t worst = 0, stride = getenv("SWARM_UNDER_VALGRIND") ? 6100 : 61;
	float worst_x = 0, x[8], y[8], z[8];
	int n = 0;

	(void)state;
	for (int sign = 0; sign < 2; sign++) {
		float lim = sign ? -87.0f : 88.0f;

		for (uint32_t u = 0; u <= f32_bits(fabsf(lim)); u += stride) {
			uint32_t b = u | (sign ? 0x80000000u : 0);

			memcpy(&x[n], &b, 4);
			if (++n < 8)
				continue;
			memcpy(y, x, sizeof(y));
			exp8_default(y);
			if (avx2) {
				memcpy(z, x, sizeof(z));
				exp8_avx2(z);
				assert_memory_equal(y, z, sizeof(y));
			}
			for (int k = 0; k < 8; k++) {
				float ref = (float)exp((double)x[k]);
				uint32_t a = f32_bits(y[k]), r = f32_bits(ref);
				uint32_t d = a > r ? a - r : r - a;

				if (d > worst) {
					worst = d;
					worst_x = x[k];
				}
			}
			n = 0;
		}
	}
	printf("exp8: worst %u ulp (at x = %.9g) from -87 to 88\n", worst, worst_x);
	assert_true(worst <= 2);

	/* lanes: one x in each gives the same bits */
	for (int k = 0; k < 8; k++)
		x[k] = -3.14159f;
	exp8_default(x);
	for (int k = 1; k < 8; k++)
		assert_int_equal(f32_bits(x[k]), f32_bits(x[0]));

	float sp[8] = { 0.0f, -0.0f, -INFINITY, NAN, -87.5f, -1000.0f, 88.0f, 88.5f };
	exp8_default(sp);
	assert_true(sp[0] == 1.0f && sp[1] == 1.0f);
	assert_true(sp[2] == 0.0f && sp[4] == 0.0f && sp[5] == 0.0f);
	assert_true(isnan(sp[3]));
	assert_true(isfinite(sp[6]) && sp[7] == INFINITY); /* above 88: +inf */
	float big[8] = { 1000.0f, INFINITY, 89.0f, 88.0001f, -86.99f, 1.0f, -1.0f, 0.5f };
	exp8_default(big);
	assert_true(big[0] == INFINITY && big[1] == INFINITY && big[2] == INFINITY &&
		    big[3] == INFINITY);
	assert_true(big[4] > 0 && big[5] > 2.718f && big[5] < 2.7183f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_features_mask),
		cmocka_unit_test(test_get_row_vector_specials),
		cmocka_unit_test(test_get_row_vector_matches_reference),
		cmocka_unit_test(test_get_row),
		cmocka_unit_test(test_matmul_vs_double),
		cmocka_unit_test(test_matmul_vector_matches_portable),
		cmocka_unit_test(test_matmul_deterministic),
		cmocka_unit_test(test_matmul_odd_width_float),
		cmocka_unit_test(test_matmul_int8_paths_identical),
		cmocka_unit_test(test_matmul_int8_specials),
		cmocka_unit_test(test_matmul_packed),
		cmocka_unit_test(test_matmul_empty_and_scratch),
		cmocka_unit_test(test_exp8),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
