/* quant_lq_test.c - the other 32-weight types (Q4_1, Q5_0, Q5_1, IQ4_NL)
 * and IQ4_XS (IQ4_NL's table in 256-weight super-blocks):
 * traits, hand-checked blocks, quantizer round trips, non-finite input.
 *
 * Hand-checked blocks: every quant distinct where the format allows, so
 * that a nibble in the wrong half, a fifth bit from the wrong qh bit or a
 * table entry off by one shows; the values are worked out here from the
 * format (quant.h), not from quant.c. Round trips: relative RMS error on
 * Gaussian data and on data with 1 % outliers of 20 sigma below each
 * type's bound (quant.c measured, 2026-12-06, Gaussian / outliers: Q4_1
 * 0.078 / 0.111, Q5_0 0.042 / 0.088, Q5_1 0.038 / 0.051, IQ4_NL 0.075 /
 * 0.116, IQ4_XS 0.075 / 0.122; the bounds are ~25 % above), no element
 * off by more than its block's (IQ4_XS: super-block's) range times the
 * type's step, and the same bytes twice.
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

#include "gpud/quant.h"
#include "tests/unit/test_rand.h"

static const enum gpud_type lq_types[] = {
	GPUD_TYPE_Q4_1, GPUD_TYPE_Q5_0, GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL,
};
#define N_LQ (sizeof(lq_types) / sizeof(lq_types[0]))

#define H_ONE 0x3c00     /* fp16 1.0 */
#define H_HALF 0x3800    /* fp16 0.5 */
#define H_MTWO 0xc000    /* fp16 -2.0 */

static void test_lq_traits(void **state)
{
	static const uint32_t bytes[] = { 20, 22, 24, 18 };
	static const int ids[] = { 3, 6, 7, 20 }; /* ggml's, stored in files */
	static const char *const names[] = { "q4_1", "q5_0", "q5_1", "iq4_nl" };

	(void)state;
	for (size_t k = 0; k < N_LQ; k++) {
		const struct gpud_type_traits *tt = gpud_type_traits(lq_types[k]);

		assert_int_equal((int)lq_types[k], ids[k]);
		assert_non_null(tt);
		assert_string_equal(tt->name, names[k]);
		assert_int_equal(tt->block_elems, 32);
		assert_int_equal(tt->block_bytes, bytes[k]);
		assert_true(tt->quantized);
		assert_true(tt->matmul);
		assert_true(gpud_type_supported(lq_types[k]));
		assert_int_equal(gpud_type_parse(names[k]), (int)lq_types[k]);
		assert_string_equal(gpud_type_name(lq_types[k]), names[k]);
		assert_int_equal(gpud_type_row_bytes(lq_types[k], 896), 28 * bytes[k]);
		assert_non_null(strstr(GPUD_TYPE_SUPPORTED_NAMES, names[k]));
	}
	assert_int_equal(gpud_type_parse("IQ4_NL"), GPUD_TYPE_IQ4_NL);
	/* still unsupported: named, refused */
	assert_false(gpud_type_supported((enum gpud_type)9)); /* q8_1 */
	assert_string_equal(gpud_type_name((enum gpud_type)16), "iq2_xxs");
	assert_false(gpud_type_supported((enum gpud_type)16));
	/* IQ4_XS: 256-weight super-blocks of 136 bytes */
	{
		const struct gpud_type_traits *tt = gpud_type_traits(GPUD_TYPE_IQ4_XS);

		assert_int_equal((int)GPUD_TYPE_IQ4_XS, 23);
		assert_non_null(tt);
		assert_string_equal(tt->name, "iq4_xs");
		assert_int_equal(tt->block_elems, 256);
		assert_int_equal(tt->block_bytes, 136);
		assert_true(tt->quantized && tt->matmul);
		assert_int_equal(gpud_type_parse("iq4_xs"), GPUD_TYPE_IQ4_XS);
		assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_IQ4_XS, 3072), 12 * 136);
		assert_non_null(strstr(GPUD_TYPE_SUPPORTED_NAMES, "iq4_xs"));
	}
}

/* Weight j's nibble: the low one of qs[j] for j < 16, the high one of
 * qs[j - 16] after. Quants chosen so that every value appears. */
static void put_nibbles(uint8_t *qs, const int *q)
{
	for (int j = 0; j < 16; j++)
		qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
}

static void test_hand_q4_1(void **state)
{
	struct gpud_block_q4_1 b;
	int q[32];
	float y[32];

	(void)state;
	for (int j = 0; j < 32; j++)
		q[j] = (j * 7 + 3) % 16; /* every nibble twice, in a scrambled order */
	b.d = H_HALF;
	b.m = H_MTWO;
	put_nibbles(b.qs, q);
	gpud_dequantize_row(GPUD_TYPE_Q4_1, &b, y, 32);
	for (int j = 0; j < 32; j++)
		assert_float_equal(y[j], 0.5f * (float)q[j] - 2.0f, 0);
	/* by hand: weight 0 is nibble 3 -> -0.5, weight 16 is nibble (16 * 7 +
	 * 3) % 16 = 3 too, weight 1 nibble 10 -> 3.0, weight 31 nibble 12 -> 4.0 */
	assert_float_equal(y[0], -0.5f, 0);
	assert_float_equal(y[16], -0.5f, 0);
	assert_float_equal(y[1], 3.0f, 0);
	assert_float_equal(y[31], 4.0f, 0);
}

static void test_hand_q5(void **state)
{
	struct gpud_block_q5_0 b0;
	struct gpud_block_q5_1 b1;
	int q[32];
	float y[32];

	(void)state;
	for (int j = 0; j < 32; j++)
		q[j] = (j * 13 + 5) % 32; /* each of 0..31 once */
	/* the fifth bits: bit j of qh, read as a little-endian uint32 */
	memset(b0.qh, 0, sizeof(b0.qh));
	for (int j = 0; j < 32; j++)
		if (q[j] & 16)
			b0.qh[j / 8] |= (uint8_t)(1u << (j % 8));
	memcpy(b1.qh, b0.qh, sizeof(b1.qh));
	b0.d = H_ONE;
	put_nibbles(b0.qs, q);
	memcpy(b1.qs, b0.qs, sizeof(b1.qs));
	b1.d = H_HALF;
	b1.m = H_ONE;
	gpud_dequantize_row(GPUD_TYPE_Q5_0, &b0, y, 32);
	for (int j = 0; j < 32; j++)
		assert_float_equal(y[j], (float)(q[j] - 16), 0);
	gpud_dequantize_row(GPUD_TYPE_Q5_1, &b1, y, 32);
	for (int j = 0; j < 32; j++)
		assert_float_equal(y[j], 0.5f * (float)q[j] + 1.0f, 0);
	/* one fifth bit alone: only weight 27 moves, by 16 */
	memset(b0.qh, 0, sizeof(b0.qh));
	memset(b0.qs, 0, sizeof(b0.qs));
	b0.qh[3] = 1u << 3; /* bit 27 */
	gpud_dequantize_row(GPUD_TYPE_Q5_0, &b0, y, 32);
	for (int j = 0; j < 32; j++)
		assert_float_equal(y[j], j == 27 ? 0.0f : -16.0f, 0);
	assert_int_equal(gpud_q5_hbit(b0.qh, 27), 1);
	assert_int_equal(gpud_q5_hbit(b0.qh, 26), 0);
}

static void test_hand_iq4_nl(void **state)
{
	/* the format's table, as llama.cpp's files use it */
	static const int values[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
					1,    13,   25,  38,  53,  69,  89,  113 };
	struct gpud_block_iq4_nl b;
	int q[32];
	float y[32];

	(void)state;
	for (int j = 0; j < 32; j++)
		q[j] = (15 - j % 16) ^ (j >= 16 ? 5 : 0);
	b.d = H_HALF;
	put_nibbles(b.qs, q);
	gpud_dequantize_row(GPUD_TYPE_IQ4_NL, &b, y, 32);
	for (int j = 0; j < 32; j++)
		assert_float_equal(y[j], 0.5f * (float)values[q[j]], 0);
	assert_float_equal(y[0], 56.5f, 0); /* nibble 15: 113 / 2 */
	assert_float_equal(y[15], -63.5f, 0); /* nibble 0: -127 / 2 */
}

/* IQ4_XS: chunk c's 6-bit scale ls is nibble c % 2 of scales_l[c / 2]
 * with bits 2c, 2c + 1 of scales_h above it, the factor d (ls - 32); each
 * chunk's 16 bytes of nibbles as IQ4_NL's. Every chunk a distinct ls (its
 * high bits all four values), so a scale read from the wrong place shows. */
static void test_hand_iq4_xs(void **state)
{
	static const int values[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
					1,    13,   25,  38,  53,  69,  89,  113 };
	static const int ls[8] = { 0, 17, 34, 51, 40, 9, 63, 32 }; /* high bits 0,1,2,3,2,0,3,2 */
	struct gpud_block_iq4_xs b;
	int q[256];
	float y[256];

	(void)state;
	memset(&b, 0, sizeof(b));
	b.d = H_HALF;
	for (int c = 0; c < 8; c++) {
		b.scales_l[c / 2] |= (uint8_t)((ls[c] & 15) << (4 * (c % 2)));
		b.scales_h |= (uint16_t)((ls[c] >> 4) << (2 * c));
		assert_int_equal(gpud_iq4xs_ls(&b, c), ls[c]);
	}
	for (int e = 0; e < 256; e++)
		q[e] = (e * 5 + e / 32) % 16;
	for (int c = 0; c < 8; c++)
		put_nibbles(b.qs + 16 * c, q + 32 * c);
	gpud_dequantize_row(GPUD_TYPE_IQ4_XS, &b, y, 256);
	for (int e = 0; e < 256; e++)
		assert_float_equal(y[e], 0.5f * (float)(ls[e / 32] - 32) * (float)values[q[e]], 0);
	/* by hand: chunk 1 (ls 17: low nibble 1 in scales_l[0]'s high half,
	 * high bits 01 at scales_h bits 2-3), weight 32 (nibble (160 + 1) % 16
	 * = 1, value -104): 0.5 * -15 * -104 = 780 */
	assert_int_equal(b.scales_l[0], 0x10);
	assert_int_equal(b.scales_h & 0x0c, 0x04);
	assert_float_equal(y[32], 780.0f, 0);
	/* chunk 7 (ls 32) is all zeros */
	for (int e = 224; e < 256; e++)
		assert_float_equal(y[e], 0.0f, 0);
}

/* ---- quantizer round trips --------------------------------------------- */

static float gauss(void)
{
	float u = ((float)(rnd() & 0xffffff) + 0.5f) / 16777216.0f;
	float v = (float)(rnd() & 0xffffff) / 16777216.0f;

	return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

#define RT_N (32 * 512)

static double rt_bound(enum gpud_type t, bool outliers)
{
	switch (t) {
	case GPUD_TYPE_Q4_1: return outliers ? 0.14 : 0.098;
	case GPUD_TYPE_Q5_0: return outliers ? 0.11 : 0.053;
	case GPUD_TYPE_Q5_1: return outliers ? 0.064 : 0.048;
	case GPUD_TYPE_IQ4_XS: return outliers ? 0.153 : 0.094;
	default: return outliers ? 0.145 : 0.093; /* IQ4_NL */
	}
}

/* Worst error of one element as a fraction of its block's max |x|: half a
 * step of the grid over the block's range (Q4_1/Q5_1 span max - min <= 2
 * max|x|), plus the fp16 rounding of the factors. Q5_0 puts the largest
 * |x| on -16, so a value of the other sign and nearly the same size is
 * cut at 15: up to a whole step of max|x| / 16 (Q4_0's grid does the
 * same). IQ4_NL's top is 113 of 127, and its widest gap 23. */
static double elem_bound(enum gpud_type t)
{
	switch (t) {
	case GPUD_TYPE_Q4_1: return 1.0 / 15 + 0.01;
	case GPUD_TYPE_Q5_0: return 1.0 / 16 + 0.01;
	case GPUD_TYPE_Q5_1: return 1.0 / 31 + 0.01;
	default: return 12.0 / 127 + 0.05; /* IQ4_NL; IQ4_XS of its super-block's max */
	}
}

static void roundtrip(bool outliers)
{
	float *x = malloc(RT_N * sizeof(float)), *y = malloc(RT_N * sizeof(float));
	uint8_t *q = malloc(RT_N / 32 * 24), *q2 = malloc(RT_N / 32 * 24);

	assert_non_null(x);
	assert_non_null(y);
	assert_non_null(q);
	assert_non_null(q2);
	for (size_t k = 0; k <= N_LQ; k++) {
		enum gpud_type t = k < N_LQ ? lq_types[k] : GPUD_TYPE_IQ4_XS;
		double num = 0, den = 0, rel;

		rng_state = 21 + k;
		for (int i = 0; i < RT_N; i++) {
			x[i] = 0.02f * gauss();
			if (outliers && rnd() % 100 == 0)
				x[i] *= 20.0f;
		}
		const int be = (int)gpud_type_block_elems(t);
		double worst = 0;

		gpud_quantize_row(t, x, q, RT_N);
		gpud_dequantize_row(t, q, y, RT_N);
		for (int b = 0; b < RT_N / be; b++) {
			float amax = 0;

			for (int j = 0; j < be; j++)
				amax = fmaxf(amax, fabsf(x[be * b + j]));
			for (int j = 0; j < be; j++) {
				double e = (double)y[be * b + j] - x[be * b + j];

				if (fabs(e) > elem_bound(t) * amax)
					fail_msg("%s element %d: %g for %g (amax %g)", gpud_type_name(t),
						 be * b + j, (double)y[be * b + j], (double)x[be * b + j],
						 (double)amax);
				worst = fmax(worst, fabs(e) / amax);
				num += e * e;
				den += (double)x[be * b + j] * x[be * b + j];
			}
		}
		rel = sqrt(num / den);
		print_message("%s %s: relative rms error %.4f, worst element %.4f of its block's "
			      "max |x|\n", gpud_type_name(t), outliers ? "outliers" : "gaussian", rel,
			      worst);
		assert_true(rel < rt_bound(t, outliers));
		gpud_quantize_row(t, x, q2, RT_N);
		assert_memory_equal(q, q2, gpud_type_row_bytes(t, RT_N));
	}
	free(x);
	free(y);
	free(q);
	free(q2);
}

static void test_roundtrip_gaussian(void **state)
{
	(void)state;
	roundtrip(false);
}

static void test_roundtrip_outliers(void **state)
{
	(void)state;
	roundtrip(true);
}

/* Blocks that are all zero, constant, tiny, or hold a NaN/Inf: zeros stay
 * zeros (Q5_0, IQ4_NL: d = 0), a constant block comes back within its
 * fp16 rounding (Q4_1/Q5_1: the min), a NaN or Inf makes its whole block
 * NaN and no other, and no quant is ever an undefined cast (UBSan runs
 * this). */
static void test_degenerate_blocks(void **state)
{
	float x[96], y[96];
	uint8_t q[3 * 24];

	(void)state;
	for (size_t k = 0; k < N_LQ; k++) {
		enum gpud_type t = lq_types[k];

		for (int i = 0; i < 32; i++) {
			x[i] = 0.0f;
			x[32 + i] = 0.75f;
			x[64 + i] = i == 5 ? NAN : 1e-3f * (float)i;
		}
		gpud_quantize_row(t, x, q, 96);
		gpud_dequantize_row(t, q, y, 96);
		for (int i = 0; i < 32; i++) {
			assert_float_equal(y[i], 0.0f, 1e-30);
			assert_float_equal(y[32 + i], 0.75f, 0.75f * 0.1f);
			assert_true(isnan(y[64 + i]));
		}
		x[64 + 5] = INFINITY;
		gpud_quantize_row(t, x, q, 96);
		gpud_dequantize_row(t, q, y, 96);
		for (int i = 0; i < 32; i++)
			assert_true(isnan(y[64 + i]));
		assert_float_equal(y[40], 0.75f, 0.75f * 0.1f);
		/* tiny blocks: no overflow, no NaN */
		for (int i = 0; i < 32; i++)
			x[i] = (i % 3 - 1) * 1e-38f;
		gpud_quantize_row(t, x, q, 32);
		gpud_dequantize_row(t, q, y, 32);
		for (int i = 0; i < 32; i++)
			assert_true(isfinite(y[i]) && fabsf(y[i]) < 1e-30f);
	}
	/* IQ4_XS: a zero super-block, one with a zero chunk (ls 32), one with
	 * a NaN: all NaN */
	{
		float xs[3 * 256], ys[3 * 256];
		struct gpud_block_iq4_xs qs[3];

		for (int i = 0; i < 256; i++) {
			xs[i] = 0.0f;
			xs[256 + i] = i < 32 ? 0.0f : 0.01f * (float)(i % 7 - 3);
			xs[512 + i] = i == 100 ? NAN : 1.0f;
		}
		gpud_quantize_row(GPUD_TYPE_IQ4_XS, xs, qs, 3 * 256);
		gpud_dequantize_row(GPUD_TYPE_IQ4_XS, qs, ys, 3 * 256);
		for (int i = 0; i < 256; i++) {
			assert_float_equal(ys[i], 0.0f, 0);
			assert_float_equal(ys[256 + i], xs[256 + i], 0.004);
			assert_true(isnan(ys[512 + i]));
		}
		assert_int_equal(gpud_iq4xs_ls(&qs[1], 0), 32);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lq_traits),
		cmocka_unit_test(test_hand_q4_1),
		cmocka_unit_test(test_hand_q5),
		cmocka_unit_test(test_hand_iq4_nl),
		cmocka_unit_test(test_hand_iq4_xs),
		cmocka_unit_test(test_roundtrip_gaussian),
		cmocka_unit_test(test_roundtrip_outliers),
		cmocka_unit_test(test_degenerate_blocks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
