/* quant_kq_test.c - the K-quants (Q2_K..Q6_K, Q8_K): layouts, hand-checked
 * blocks, bit positions, quantizer round trips.
 *
 * Hand-checked blocks: scale and min bytes worked out by hand (Q3_K's
 * cross-checked against ggml's 32-bit mask unpacking), every sub-block
 * index with a distinct value so a misplaced bit shows. Bit positions: a
 * second decoder written in ggml's pointer-walking loop order, compared
 * with gpud_dequantize_row on random blocks. Round trips: relative RMS
 * error sqrt(sum (y - x)^2 / sum x^2) on Gaussian data and on data with 1 %
 * outliers of 20 sigma, below each type's bound (quant.c's quantizer
 * measured Gaussian / outliers: Q2_K 0.271 / 0.233, Q3_K 0.146 / 0.155,
 * Q4_K 0.073 / 0.103, Q5_K 0.036 / 0.052, Q6_K 0.018 / 0.032, Q8_K 0.007 /
 * 0.028; the bounds are ~25 % above), and no element off by more than its
 * super-block's max |x| times the type's worst step.
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


static const enum gpud_type kq_types[] = {
	GPUD_TYPE_Q2_K, GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K, GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K,
	GPUD_TYPE_Q8_K,
};
#define N_KQ (sizeof(kq_types) / sizeof(kq_types[0]))

#define H_ONE 0x3c00     /* fp16 1.0 */
#define H_HALF 0x3800    /* fp16 0.5 */
#define H_QUARTER 0x3400 /* fp16 0.25 */

static void test_kq_traits(void **state)
{
	static const uint32_t bytes[] = { 84, 110, 144, 176, 210, 292 };
	static const char *const names[] = { "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k" };

	(void)state;
	for (size_t k = 0; k < N_KQ; k++) {
		const struct gpud_type_traits *tt = gpud_type_traits(kq_types[k]);

		assert_non_null(tt);
		assert_string_equal(tt->name, names[k]);
		assert_int_equal(tt->block_elems, 256);
		assert_int_equal(tt->block_bytes, bytes[k]);
		assert_true(tt->quantized);
		assert_int_equal(gpud_type_parse(names[k]), (int)kq_types[k]);
		assert_int_equal(gpud_type_row_bytes(kq_types[k], 3072), 12 * bytes[k]);
	}
	assert_false(gpud_type_traits(GPUD_TYPE_Q8_K)->matmul);
	assert_true(gpud_type_traits(GPUD_TYPE_Q4_K)->matmul);
	assert_int_equal(gpud_type_parse("Q6_K"), GPUD_TYPE_Q6_K);
}

/* Q4_K and Q5_K: scales 1 2 3 4 33 47 62 63, mins 5 6 7 8 17 31 48 63. */
static const uint8_t q4k_scales[12] = {
	0x81, 0x82, 0xc3, 0xc4, 0x45, 0x46, 0xc7, 0xc8, 0x11, 0xff, 0x0e, 0xff,
};
static const int q4k_sc[8] = { 1, 2, 3, 4, 33, 47, 62, 63 };
static const int q4k_m[8] = { 5, 6, 7, 8, 17, 31, 48, 63 };

static void test_q4k_hand(void **state)
{
	struct gpud_block_q4_k b;
	float y[256];

	(void)state;
	for (int s = 0; s < 8; s++) {
		uint8_t sc, m;

		gpud_kq_scale_min(q4k_scales, s, &sc, &m);
		assert_int_equal(sc, q4k_sc[s]);
		assert_int_equal(m, q4k_m[s]);
	}
	b.d = H_ONE;
	b.dmin = H_HALF;
	memcpy(b.scales, q4k_scales, 12);
	memset(b.qs, 0x93, sizeof(b.qs)); /* low nibbles 3, high 9 */
	gpud_dequantize_row(GPUD_TYPE_Q4_K, &b, y, 256);
	for (int e = 0; e < 256; e++) {
		int s = e / 32, q = s % 2 ? 9 : 3;

		assert_float_equal(y[e], (float)(q4k_sc[s] * q) - 0.5f * (float)q4k_m[s], 0);
	}
}

static void test_q5k_hand(void **state)
{
	struct gpud_block_q5_k b;
	float y[256];

	(void)state;
	b.d = H_ONE;
	b.dmin = H_HALF;
	memcpy(b.scales, q4k_scales, 12);
	memset(b.qs, 0x93, sizeof(b.qs));
	memset(b.qh, 0xa5, sizeof(b.qh)); /* fifth bit on in sub-blocks 0 2 5 7 */
	gpud_dequantize_row(GPUD_TYPE_Q5_K, &b, y, 256);
	for (int e = 0; e < 256; e++) {
		int s = e / 32, q = (s % 2 ? 9 : 3) + ((0xa5 >> s) & 1) * 16;

		assert_float_equal(y[e], (float)(q4k_sc[s] * q) - 0.5f * (float)q4k_m[s], 0);
	}
}

/* Q3_K: 16 signed scales, checked against ggml's kmask unpacking. */
static const uint8_t q3k_scales[12] = {
	0xf0, 0x01, 0x7f, 0x80, 0x71, 0xef, 0xe0, 0x2f, 0x48, 0xd8, 0x6d, 0xae,
};
static const int q3k_sc[16] = { -32, -31, -1, 0, 1, 15, 16, 31, -17, -16, 7, 8, -9, 30, -2, 2 };

static void test_q3k_hand(void **state)
{
	struct gpud_block_q3_k b;
	float y[256];

	(void)state;
	for (int s = 0; s < 16; s++)
		assert_int_equal(gpud_q3k_scale(q3k_scales, s), q3k_sc[s]);
	b.d = H_ONE;
	memcpy(b.scales, q3k_scales, 12);
	memset(b.qs, 0x1b, sizeof(b.qs));    /* 2-bit fields by shift: 3 2 1 0 */
	memset(b.hmask, 0x0f, sizeof(b.hmask)); /* bit 2 set in half 0 only */
	gpud_dequantize_row(GPUD_TYPE_Q3_K, &b, y, 256);
	for (int e = 0; e < 256; e++) {
		int h = e / 128, j = (e % 128) / 32, s = e / 16;
		int q = (3 - j) + (h == 0 ? 4 : 0) - 4;

		assert_float_equal(y[e], (float)(q3k_sc[s] * q), 0);
	}
}

static void test_q2k_hand(void **state)
{
	struct gpud_block_q2_k b;
	float y[256];

	(void)state;
	for (int s = 0; s < 16; s++)
		b.scales[s] = (uint8_t)(s | (15 - s) << 4);
	b.d = H_ONE;
	b.dmin = H_QUARTER;
	memset(b.qs, 0xe4, sizeof(b.qs)); /* 2-bit fields by shift: 0 1 2 3 */
	gpud_dequantize_row(GPUD_TYPE_Q2_K, &b, y, 256);
	for (int e = 0; e < 256; e++) {
		int j = (e % 128) / 32, s = e / 16;

		assert_float_equal(y[e], (float)(s * j) - 0.25f * (float)(15 - s), 0);
	}
}

static void test_q6k_hand(void **state)
{
	static const int8_t sc[16] = { -128, -1, 0, 1, 127, 2, -3, 64, -64, 5, 33, -33, 100, -100, 7, 9 };
	struct gpud_block_q6_k b;
	float y[256];

	(void)state;
	b.d = H_QUARTER;
	memcpy(b.scales, sc, 16);
	/* low nibble 1, high nibble 5; 2-bit highs by shift: 2 1 0 3 */
	memset(b.ql, 0x51, sizeof(b.ql));
	memset(b.qh, 0xc6, sizeof(b.qh));
	gpud_dequantize_row(GPUD_TYPE_Q6_K, &b, y, 256);
	for (int e = 0; e < 256; e++) {
		static const int hi[4] = { 2, 1, 0, 3 };
		int k = (e % 128) / 32, s = e / 16;
		int q = ((k < 2 ? 1 : 5) | hi[k] << 4) - 32;

		assert_float_equal(y[e], 0.25f * (float)(sc[s] * q), 0);
	}
}

/* ---- a second decoder, in ggml's loop order ---------------------------- */

static void ref_dequant(enum gpud_type t, const void *blk, float *y)
{
	switch (t) {
	case GPUD_TYPE_Q2_K: {
		const struct gpud_block_q2_k *b = blk;
		const float d = gpud_fp16_to_fp32(b->d), mn = gpud_fp16_to_fp32(b->dmin);
		const uint8_t *q = b->qs;
		int is = 0;

		for (int n = 0; n < 256; n += 128, q += 32)
			for (int shift = 0; shift < 8; shift += 2)
				for (int half = 0; half < 2; half++) {
					uint8_t sc = b->scales[is++];
					float dl = d * (float)(sc & 15), ml = mn * (float)(sc >> 4);

					for (int l = 0; l < 16; l++)
						*y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
				}
		break;
	}
	case GPUD_TYPE_Q3_K: {
		const struct gpud_block_q3_k *b = blk;
		const float d = gpud_fp16_to_fp32(b->d);
		const uint8_t *q = b->qs;
		uint32_t aux[4], tmp;
		int8_t sc[16];
		uint8_t m = 1;
		int is = 0;

		memcpy(aux, b->scales, 12);
		tmp = aux[2];
		aux[2] = ((aux[0] >> 4) & 0x0f0f0f0f) | (((tmp >> 4) & 0x03030303) << 4);
		aux[3] = ((aux[1] >> 4) & 0x0f0f0f0f) | (((tmp >> 6) & 0x03030303) << 4);
		aux[0] = (aux[0] & 0x0f0f0f0f) | (((tmp >> 0) & 0x03030303) << 4);
		aux[1] = (aux[1] & 0x0f0f0f0f) | (((tmp >> 2) & 0x03030303) << 4);
		memcpy(sc, aux, 16);
		for (int n = 0; n < 256; n += 128, q += 32)
			for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1))
				for (int half = 0; half < 2; half++) {
					float dl = d * (float)(sc[is++] - 32);

					for (int l = 16 * half; l < 16 * half + 16; l++)
						*y++ = dl * (float)(((q[l] >> shift) & 3) -
								   ((b->hmask[l] & m) ? 0 : 4));
				}
		break;
	}
	case GPUD_TYPE_Q4_K:
	case GPUD_TYPE_Q5_K: {
		const bool five = t == GPUD_TYPE_Q5_K;
		const struct gpud_block_q4_k *b4 = blk;
		const struct gpud_block_q5_k *b5 = blk;
		const uint8_t *sc = five ? b5->scales : b4->scales;
		const uint8_t *ql = five ? b5->qs : b4->qs;
		const float d = gpud_fp16_to_fp32(b4->d), mn = gpud_fp16_to_fp32(b4->dmin);
		uint8_t u1 = 1, u2 = 2;

		for (int j = 0, is = 0; j < 256; j += 64, ql += 32, is += 2) {
			uint8_t s1, m1, s2, m2;

			if (is < 4) {
				s1 = sc[is] & 63; m1 = sc[is + 4] & 63;
			} else {
				s1 = (uint8_t)((sc[is + 4] & 0xf) | (sc[is - 4] >> 6) << 4);
				m1 = (uint8_t)((sc[is + 4] >> 4) | (sc[is] >> 6) << 4);
			}
			if (is + 1 < 4) {
				s2 = sc[is + 1] & 63; m2 = sc[is + 5] & 63;
			} else {
				s2 = (uint8_t)((sc[is + 5] & 0xf) | (sc[is - 3] >> 6) << 4);
				m2 = (uint8_t)((sc[is + 5] >> 4) | (sc[is + 1] >> 6) << 4);
			}
			for (int l = 0; l < 32; l++)
				*y++ = (d * (float)s1) * (float)((ql[l] & 0xf) +
					(five && (b5->qh[l] & u1) ? 16 : 0)) - mn * (float)m1;
			for (int l = 0; l < 32; l++)
				*y++ = (d * (float)s2) * (float)((ql[l] >> 4) +
					(five && (b5->qh[l] & u2) ? 16 : 0)) - mn * (float)m2;
			u1 = (uint8_t)(u1 << 2);
			u2 = (uint8_t)(u2 << 2);
		}
		break;
	}
	case GPUD_TYPE_Q6_K: {
		const struct gpud_block_q6_k *b = blk;
		const float d = gpud_fp16_to_fp32(b->d);
		const uint8_t *ql = b->ql, *qh = b->qh;
		const int8_t *sc = b->scales;

		for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
			for (int l = 0; l < 32; l++) {
				int is = l / 16;
				int q1 = ((ql[l] & 0xf) | ((qh[l] >> 0) & 3) << 4) - 32;
				int q2 = ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
				int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
				int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;

				y[l] = (d * (float)sc[is]) * (float)q1;
				y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
				y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
				y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
			}
		break;
	}
	default:
		fail();
	}
}

/* Random blocks (fp16 factors kept finite and modest) decode alike. */
static void test_bit_positions(void **state)
{
	_Alignas(4) uint8_t blk[292];
	float y[256], want[256];

	(void)state;
	rng_state = 7;
	for (size_t k = 0; k < N_KQ - 1; k++) {
		enum gpud_type t = kq_types[k];
		uint32_t bs = gpud_type_block_bytes(t);

		for (int it = 0; it < 200; it++) {
			for (uint32_t i = 0; i < bs; i++)
				blk[i] = (uint8_t)rnd();
			/* d (and dmin) in [2^-8, 2): fp16 exponent 7..15 */
			for (int f = 0; f < 2; f++) {
				size_t off = t == GPUD_TYPE_Q2_K ? 80 + 2 * (size_t)f
					   : t == GPUD_TYPE_Q3_K ? 108
					   : t == GPUD_TYPE_Q6_K ? 208 : 2 * (size_t)f;
				uint16_t h = (uint16_t)((rnd() & 0x83ff) | (7 + rnd() % 9) << 10);

				memcpy(blk + off, &h, 2);
			}
			gpud_dequantize_row(t, blk, y, 256);
			ref_dequant(t, blk, want);
			for (int e = 0; e < 256; e++)
				if (memcmp(&y[e], &want[e], sizeof(float)) != 0)
					fail_msg("%s block %d element %d: %g, ggml order %g",
						 gpud_type_name(t), it, e, (double)y[e], (double)want[e]);
		}
	}
}

/* ---- quantizer round trips --------------------------------------------- */

static float gauss(void)
{
	float u = ((float)(rnd() & 0xffffff) + 0.5f) / 16777216.0f;
	float v = (float)(rnd() & 0xffffff) / 16777216.0f;

	return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

#define RT_N (256 * 64)

static double rt_bound(enum gpud_type t, bool outliers)
{
	switch (t) {
	case GPUD_TYPE_Q2_K: return outliers ? 0.30 : 0.34;
	case GPUD_TYPE_Q3_K: return outliers ? 0.20 : 0.19;
	case GPUD_TYPE_Q4_K: return outliers ? 0.13 : 0.09;
	case GPUD_TYPE_Q5_K: return outliers ? 0.065 : 0.045;
	case GPUD_TYPE_Q6_K: return outliers ? 0.04 : 0.0225;
	default: return outliers ? 0.035 : 0.009;
	}
}

/* Worst error of one element as a fraction of its super-block's max |x|:
 * half a step of the quant grid over the whole range, doubled for the
 * rounding of the sub-block scales and mins. */
static double elem_bound(enum gpud_type t)
{
	switch (t) {
	case GPUD_TYPE_Q2_K: return 2.0 / 3;
	case GPUD_TYPE_Q3_K: return 2.0 / 4;
	case GPUD_TYPE_Q4_K: return 2.0 / 15;
	case GPUD_TYPE_Q5_K: return 2.0 / 31;
	case GPUD_TYPE_Q6_K: return 2.0 / 32;
	default: return 1.0 / 127;
	}
}

static void roundtrip(bool outliers)
{
	float *x = malloc(RT_N * sizeof(float)), *y = malloc(RT_N * sizeof(float));
	uint8_t *q = malloc(RT_N / 256 * 292);

	assert_non_null(x);
	assert_non_null(y);
	assert_non_null(q);
	for (size_t k = 0; k < N_KQ; k++) {
		enum gpud_type t = kq_types[k];
		double num = 0, den = 0, rel;

		rng_state = 11 + k;
		for (int i = 0; i < RT_N; i++) {
			x[i] = 0.02f * gauss();
			if (outliers && rnd() % 100 == 0)
				x[i] *= 20.0f;
		}
		gpud_quantize_row(t, x, q, RT_N);
		gpud_dequantize_row(t, q, y, RT_N);
		for (int b = 0; b < RT_N / 256; b++) {
			float amax = 0;

			for (int j = 0; j < 256; j++)
				amax = fmaxf(amax, fabsf(x[256 * b + j]));
			for (int j = 0; j < 256; j++) {
				double e = (double)y[256 * b + j] - x[256 * b + j];

				if (fabs(e) > elem_bound(t) * amax)
					fail_msg("%s element %d: %g for %g (amax %g)", gpud_type_name(t),
						 256 * b + j, (double)y[256 * b + j],
						 (double)x[256 * b + j], (double)amax);
				num += e * e;
				den += (double)x[256 * b + j] * x[256 * b + j];
			}
		}
		rel = sqrt(num / den);
		print_message("%s %s: relative rms error %.4f\n", gpud_type_name(t),
			      outliers ? "outliers" : "gaussian", rel);
		assert_true(rel < rt_bound(t, outliers));
		/* the quantizer is deterministic */
		{
			uint8_t *q2 = malloc(RT_N / 256 * 292);

			assert_non_null(q2);
			gpud_quantize_row(t, x, q2, RT_N);
			assert_memory_equal(q, q2, gpud_type_row_bytes(t, RT_N));
			free(q2);
		}
	}
	free(x);
	free(y);
	free(q);
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

/* Zero, constant and one-signed blocks come back close (mins matter). */
static void test_roundtrip_shapes(void **state)
{
	float x[512], y[512];
	_Alignas(4) uint8_t q[2 * 292];

	(void)state;
	for (size_t k = 0; k < N_KQ; k++) {
		enum gpud_type t = kq_types[k];

		memset(x, 0, sizeof(x));
		gpud_quantize_row(t, x, q, 512);
		gpud_dequantize_row(t, q, y, 512);
		for (int i = 0; i < 512; i++)
			assert_float_equal(y[i], 0.0f, 0);
		for (int i = 0; i < 512; i++)
			x[i] = i < 256 ? 0.5f + (float)i / 1024 : -1.0f - (float)(i % 7) / 8;
		gpud_quantize_row(t, x, q, 512);
		gpud_dequantize_row(t, q, y, 512);
		for (int i = 0; i < 512; i++)
			assert_true(fabsf(y[i] - x[i]) <= elem_bound(t) * 1.75);
	}
}

static void test_q8k_bsums(void **state)
{
	float x[512];
	struct gpud_block_q8_k b[2];

	(void)state;
	rng_state = 3;
	for (int i = 0; i < 512; i++)
		x[i] = rndf();
	for (int i = 256; i < 512; i++)
		x[i] *= 1e-31f; /* below the zero threshold */
	gpud_quantize_row(GPUD_TYPE_Q8_K, x, b, 512);
	for (int s = 0; s < 16; s++) {
		int sum = 0;

		for (int j = 0; j < 16; j++)
			sum += b[0].qs[16 * s + j];
		assert_int_equal(b[0].bsums[s], sum);
		assert_int_equal(b[1].bsums[s], 0);
	}
	assert_float_equal(b[1].d, 0.0f, 0);
}

/* A NaN or Inf poisons its own super-block and no other. */
static void test_nonfinite(void **state)
{
	float x[768], y[768], bad[2] = { NAN, -INFINITY };
	_Alignas(4) uint8_t q[3 * 292];

	(void)state;
	for (size_t k = 0; k < N_KQ; k++)
		for (int v = 0; v < 2; v++) {
			enum gpud_type t = kq_types[k];

			rng_state = 5;
			for (int i = 0; i < 768; i++)
				x[i] = rndf();
			x[256 + 77] = bad[v];
			gpud_quantize_row(t, x, q, 768);
			gpud_dequantize_row(t, q, y, 768);
			for (int i = 0; i < 768; i++) {
				if (i >= 256 && i < 512)
					assert_true(isnan(y[i]));
				else
					assert_true(isfinite(y[i]));
			}
		}
}

static uint64_t fnv1a(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ull;
	}
	return h;
}

/* The quantizer's bytes, recorded when the first K-quant files were
 * written (2026-12-01): a rewrite must keep them (or say why). Input:
 * super-blocks at scales 2^-30 .. 2^20, some subnormal, some all zero,
 * some of one sign. */
static void test_quantize_golden(void **state)
{
	enum { N = 256 * 64 };
	static const uint64_t want[N_KQ] = {
		0xfee0334c4928380full, /* q2_k */
		0x7737a56e170cbdacull, /* q3_k */
		0x62c3cf7f3c96f945ull, /* q4_k */
		0x6c30e3c2d1f9df4bull, /* q5_k */
		0x316c443df58c771full, /* q6_k */
		0x6081da1685a23ffeull, /* q8_k */
	};
	static float x[N];
	static _Alignas(4) uint8_t q[N / 256 * 292];
	int bad = 0;

	(void)state;
	for (size_t k = 0; k < N_KQ; k++) {
		rng_state = 0x9e3779b97f4a7c15ull;
		for (int i = 0; i < N; i++) {
			int blk = i / 256;
			float scale = ldexpf(1.0f, blk == 63 ? -140 : blk == 62 ? -130 : blk - 30);
			float v = ((float)(rnd() & 0xffffff) / 8388608.0f - 1.0f) * scale;

			if (blk % 5 == 4)
				v = fabsf(v);
			x[i] = v;
		}
		for (int i = 256 * 7; i < 256 * 8; i++)
			x[i] = 0.0f;
		gpud_quantize_row(kq_types[k], x, q, N);
		if (fnv1a(q, gpud_type_row_bytes(kq_types[k], N)) != want[k]) {
			print_message("%s: checksum 0x%016llxull\n", gpud_type_name(kq_types[k]),
				      (unsigned long long)fnv1a(q, gpud_type_row_bytes(kq_types[k], N)));
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kq_traits),
		cmocka_unit_test(test_q4k_hand),
		cmocka_unit_test(test_q5k_hand),
		cmocka_unit_test(test_q3k_hand),
		cmocka_unit_test(test_q2k_hand),
		cmocka_unit_test(test_q6k_hand),
		cmocka_unit_test(test_bit_positions),
		cmocka_unit_test(test_roundtrip_gaussian),
		cmocka_unit_test(test_roundtrip_outliers),
		cmocka_unit_test(test_roundtrip_shapes),
		cmocka_unit_test(test_q8k_bsums),
		cmocka_unit_test(test_nonfinite),
		cmocka_unit_test(test_quantize_golden),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
