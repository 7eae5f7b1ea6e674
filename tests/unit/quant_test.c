/* quant_test.c - weight types: traits, conversions, quantize, dequantize.
 *
 * Tolerances (amax = max |x| of the element's 32-block):
 *  - fp16/bf16 conversions: exact, round to nearest even, every pattern;
 *  - quantize -> dequantize, per element: f32 exact; f16 relative 2^-11
 *    (normal range); bf16 relative 2^-8; q8_0 amax * (0.5/127 + 2^-10)
 *    + 128 * 2^-25; q4_0 amax / 8 * (1 + 2^-9) + 16 * 2^-25, and the mean
 *    error below amax / 16 (the absolute terms are the fp16 scale going
 *    subnormal for tiny blocks);
 *  - quantized bytes: a checksum per type recorded from the implementation
 *    the files were written with, so a rewrite cannot change them.
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

static const enum gpud_type all_types[] = {
	GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,
};
#define N_TYPES (sizeof(all_types) / sizeof(all_types[0]))

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

/* ---- traits ------------------------------------------------------------ */

/* Every id: the traits, the shorthands, the names and the parser agree. */
static void test_traits_table(void **state)
{
	int n_supported = 0;

	(void)state;
	for (unsigned id = 0; id < 64; id++) {
		enum gpud_type t = (enum gpud_type)id;
		const struct gpud_type_traits *tt = gpud_type_traits(t);

		if (!tt) {
			assert_false(gpud_type_supported(t));
			assert_int_equal(gpud_type_block_elems(t), 0);
			assert_int_equal(gpud_type_block_bytes(t), 0);
			assert_int_equal(gpud_type_row_bytes(t, 256), 0);
			if (!gpud_type_known(t))
				assert_string_equal(gpud_type_name(t), "?");
			else
				assert_int_equal(gpud_type_parse(gpud_type_name(t)), -1);
			continue;
		}
		n_supported++;
		assert_true(id < GPUD_TYPE_COUNT);
		assert_true(gpud_type_supported(t));
		assert_true(gpud_type_known(t));
		assert_non_null(tt->name);
		assert_string_equal(gpud_type_name(t), tt->name);
		assert_int_equal(gpud_type_parse(tt->name), (int)id);
		assert_non_null(strstr(GPUD_TYPE_SUPPORTED_NAMES, tt->name));
		assert_true(tt->block_elems >= 1 && tt->block_bytes >= 1);
		assert_int_equal(gpud_type_block_elems(t), tt->block_elems);
		assert_int_equal(gpud_type_block_bytes(t), tt->block_bytes);
		assert_int_equal(tt->quantized, tt->block_elems > 1);
		assert_non_null(tt->quantize);
		assert_non_null(tt->dequantize);
		/* Q8_K is the K-quants' activation format, never a weight. */
		assert_true(tt->matmul == (t != GPUD_TYPE_Q8_K));
	}
	/* GPUD_TYPE_SUPPORTED_NAMES lists each supported type once. */
	{
		char list[] = GPUD_TYPE_SUPPORTED_NAMES;
		int n = 0;

		for (char *s = strtok(list, ", "); s; s = strtok(NULL, ", ")) {
			assert_true(gpud_type_parse(s) >= 0);
			n++;
		}
		assert_int_equal(n, n_supported);
	}
	assert_int_equal(n_supported, (int)N_TYPES + 11); /* + quant_kq_test's and quant_lq_test's */
	assert_null(gpud_type_traits((enum gpud_type)-1));
	assert_null(gpud_type_traits(GPUD_TYPE_COUNT));
	assert_string_equal(gpud_type_name((enum gpud_type)16), "iq2_xxs");
	assert_false(gpud_type_supported((enum gpud_type)16));
	assert_true(gpud_type_known((enum gpud_type)16));
	assert_false(gpud_type_known((enum gpud_type)1000));
	assert_string_equal(gpud_type_name((enum gpud_type)1000), "?");
	assert_int_equal(gpud_type_parse("Q8_0"), GPUD_TYPE_Q8_0);
	assert_int_equal(gpud_type_parse("bf16"), GPUD_TYPE_BF16);
	assert_int_equal(gpud_type_parse("iq2_xxs"), -1);
	assert_int_equal(gpud_type_parse("f32 "), -1);
	assert_int_equal(gpud_type_parse(""), -1);
	assert_int_equal(gpud_type_parse(NULL), -1);
}

/* The shorthands on known values (moved from gguf_test with the table). */
static void test_type_helpers(void **state)
{
	(void)state;
	assert_int_equal(gpud_type_block_elems(GPUD_TYPE_Q4_0), 32);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_Q4_0), 18);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_Q8_0), 34);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_BF16), 2);
	assert_int_equal(gpud_type_block_elems((enum gpud_type)16), 0);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_Q8_0, 64), 68);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_F16, 3), 6);
	assert_int_equal(gpud_type_row_bytes((enum gpud_type)16, 64), 0);
	assert_string_equal(gpud_type_name(GPUD_TYPE_BF16), "bf16");
	assert_string_equal(gpud_type_name((enum gpud_type)14), "q6_k");
	assert_string_equal(gpud_type_name((enum gpud_type)1000), "?");
	assert_int_equal(gpud_type_parse("q4_0"), GPUD_TYPE_Q4_0);
	assert_int_equal(gpud_type_parse("F16"), GPUD_TYPE_F16);
	assert_int_equal(gpud_type_parse("iq2_xxs"), -1);
	assert_int_equal(gpud_type_parse(""), -1);
	assert_int_equal(gpud_type_parse(NULL), -1);
	assert_true(gpud_type_supported(GPUD_TYPE_F32));
	assert_false(gpud_type_supported((enum gpud_type)16));
}

/* The block structs are the file layout. */
static void test_block_sizes(void **state)
{
	(void)state;
	assert_int_equal(sizeof(struct gpud_block_q8_0), 34);
	assert_int_equal(sizeof(struct gpud_block_q4_0), 18);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_Q8_0), sizeof(struct gpud_block_q8_0));
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_Q4_0), sizeof(struct gpud_block_q4_0));
	assert_int_equal(gpud_type_block_elems(GPUD_TYPE_Q8_0), GPUD_QK);
	assert_int_equal(gpud_type_block_elems(GPUD_TYPE_Q4_0), GPUD_QK);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_F32), 4);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_F16), 2);
	assert_int_equal(gpud_type_block_bytes(GPUD_TYPE_BF16), 2);
}

/* Row sizes, and quantize writes exactly that many bytes. */
static void test_row_bytes(void **state)
{
	static const uint64_t widths[] = { 32, 64, 768, 3072, 32 * 1000 };
	static float x[32 * 1000];
	static uint8_t y[32 * 1000 * 4 + 64];

	(void)state;
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_F32, 768), 3072);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_F16, 768), 1536);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_BF16, 7), 14);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_Q8_0, 768), 24 * 34);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_Q4_0, 768), 24 * 18);
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_Q8_0, 0), 0);
	/* Large rows do not overflow in 64 bits. */
	assert_int_equal(gpud_type_row_bytes(GPUD_TYPE_Q4_0, (uint64_t)1 << 40),
			 ((uint64_t)1 << 35) * 18);
	rng_state = 77;
	for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
		x[i] = rndf();
	for (size_t k = 0; k < N_TYPES; k++) {
		for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
			size_t rb = gpud_type_row_bytes(all_types[k], widths[w]);

			assert_int_equal(rb, widths[w] * gpud_type_block_bytes(all_types[k]) /
						     gpud_type_block_elems(all_types[k]));
			memset(y, 0xa5, sizeof(y));
			gpud_quantize_row(all_types[k], x, y, (int64_t)widths[w]);
			for (size_t i = rb; i < rb + 64; i++)
				assert_int_equal(y[i], 0xa5);
		}
	}
	/* An unsupported type writes nothing. */
	memset(y, 0xa5, 64);
	gpud_quantize_row((enum gpud_type)16, x, y, 32);
	gpud_dequantize_row((enum gpud_type)16, y, x, 32);
	for (int i = 0; i < 64; i++)
		assert_int_equal(y[i], 0xa5);
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
		{ 0x00000001, 0x0000 }, /* fp32 subnormal: 0 */
		{ 0x80000001, 0x8000 }, /* keeps its sign */
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
	assert_true(gpud_fp16_to_fp32(0x8200) == -ldexpf(1.0f, -15));
	assert_true(gpud_fp16_to_fp32(0x7bff) == 65504.0f);
	assert_true(isinf(gpud_fp16_to_fp32(0xfc00)) && gpud_fp16_to_fp32(0xfc00) < 0);
	assert_true(isinf(gpud_fp16_to_fp32(0x7c00)) && gpud_fp16_to_fp32(0x7c00) > 0);
	/* NaN stays NaN both ways and keeps its sign. */
	assert_true(isnan(gpud_fp16_to_fp32(0x7e00)));
	assert_true(isnan(gpud_fp16_to_fp32(0x7c01)));
	assert_true(signbit(gpud_fp16_to_fp32(0xfe00)));
	assert_int_equal(gpud_fp32_to_fp16(u2f(0x7fc00000)) & 0x7e00, 0x7e00);
	assert_int_equal(gpud_fp32_to_fp16(u2f(0x7f800001)) & 0x7e00, 0x7e00); /* sNaN */
	assert_int_equal(gpud_fp32_to_fp16(u2f(0xffc00000)), 0xfe00);
	/* the top payload bits are kept */
	assert_int_equal(gpud_fp32_to_fp16(u2f(0x7fd56000)), 0x7eab);
}

/* Every fp16 pattern, subnormals, Inf and NaN included, goes to fp32 and
 * back unchanged (NaN quieted). */
static void test_fp16_roundtrip_all(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = gpud_fp16_to_fp32((uint16_t)h);

		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
			assert_true(isnan(f));
			assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
			assert_true(gpud_fp32_to_fp16(f) == (h | 0x200)); /* quieted */
			continue;
		}
		/* exact: fp16 is a subset of fp32 */
		if ((h & 0x7c00) == 0 && (h & 0x3ff))
			assert_true(fabsf(f) == ldexpf((float)(h & 0x3ff), -24));
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
		{ 0x007fffff, 0x0080 }, /* largest subnormal rounds to the smallest normal */
		{ 0x807f0000, 0x807f }, /* negative subnormal, exact */
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
	/* Every pattern but NaNs round-trips; NaNs stay NaN (quieted). */
	for (uint32_t h = 0; h < 0x10000; h++) {
		if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
			assert_int_equal(gpud_fp32_to_bf16(gpud_bf16_to_fp32((uint16_t)h)), h | 0x40);
			continue;
		}
		assert_int_equal(gpud_fp32_to_bf16(gpud_bf16_to_fp32((uint16_t)h)), h);
	}
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
	for (size_t k = 0; k < N_TYPES; k++) {
		rng_state = 0xabcdef + k;
		for (int i = 0; i < N; i++)
			x[i] = rndf() * (i < 64 ? 1e-3f : 3.0f);
		/* an all-zero block, a constant block, a tiny and a huge one */
		for (int i = 64 * 2; i < 64 * 2 + 32; i++)
			x[i] = 0.0f;
		for (int i = 64 * 3; i < 64 * 3 + 32; i++)
			x[i] = -0.75f;
		for (int i = 64 * 4; i < 64 * 4 + 32; i++)
			x[i] *= 1e-6f;
		for (int i = 64 * 5; i < 64 * 5 + 32; i++)
			x[i] *= 1e3f;
		gpud_quantize_row(all_types[k], x, q, N);
		gpud_dequantize_row(all_types[k], q, y, N);
		check_quant_error(all_types[k], x, y, N);
		/* zero block stays exactly zero */
		for (int i = 64 * 2; i < 64 * 2 + 32; i++)
			assert_true(y[i] == 0.0f);
		/* the row functions are the traits' */
		{
			static uint8_t q2[N * 4];
			static float y2[N];

			gpud_type_traits(all_types[k])->quantize(x, q2, N);
			assert_memory_equal(q, q2, gpud_type_row_bytes(all_types[k], N));
			gpud_type_traits(all_types[k])->dequantize(q, y2, N);
			assert_memory_equal(y, y2, sizeof(y));
		}
	}
}

/* Non-finite input (quant.h): a Q8_0/Q4_0 block holding a NaN or an Inf
 * becomes d = NaN with quants 0, whatever the position of the bad value,
 * and dequantizes to NaN; it never spills into the other blocks. F16/BF16
 * keep NaN and Inf element by element, F32 keeps the bits. */
static void check_nonfinite_block(enum gpud_type t, const uint8_t *blk, const float *y)
{
	static const uint8_t zero8[32] = { 0 };
	static const uint8_t zero4[16] = {
		0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
		0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
	};
	uint16_t d;

	memcpy(&d, blk, sizeof(d));
	assert_int_equal(d, 0x7e00);
	if (t == GPUD_TYPE_Q8_0)
		assert_memory_equal(blk + 2, zero8, sizeof(zero8));
	else
		assert_memory_equal(blk + 2, zero4, sizeof(zero4));
	for (int j = 0; j < 32; j++)
		assert_true(isnan(y[j]));
}

static void test_quantize_nonfinite(void **state)
{
	float x[160], y[160], ref[32];
	uint8_t q[160 * 4], qref[64];

	(void)state;
	for (int k = 3; k < 5; k++) {
		enum gpud_type t = all_types[k];
		size_t bb = gpud_type_block_bytes(t);

		/* blocks: NaN, +-Inf, finite, -Inf alone, -NaN */
		for (int i = 0; i < 160; i++)
			x[i] = (float)(i % 7) - 3.0f;
		x[3] = NAN;
		x[40] = INFINITY;
		x[41] = -INFINITY;
		x[127] = -INFINITY;
		x[128] = -NAN;
		gpud_quantize_row(t, x, q, 160);
		gpud_dequantize_row(t, q, y, 160);
		for (int b = 0; b < 5; b++)
			if (b != 2)
				check_nonfinite_block(t, q + b * bb, y + b * 32);
		/* block 2 is finite: same as quantized alone */
		gpud_quantize_row(t, x + 64, qref, 32);
		assert_memory_equal(q + 2 * bb, qref, bb);
		gpud_dequantize_row(t, qref, ref, 32);
		assert_memory_equal(y + 64, ref, sizeof(ref));
		for (int j = 0; j < 32; j++)
			assert_true(isfinite(ref[j]));
		/* wherever the bad value sits, beside the largest finite one or
		 * alone in a block of zeros */
		for (int j = 0; j < 32; j++) {
			for (int kind = 0; kind < 3; kind++) {
				for (int i = 0; i < 32; i++)
					x[i] = kind == 2 ? 0.0f : (float)(i % 5) - 2.0f;
				x[j] = kind == 1 ? -INFINITY : kind == 2 ? INFINITY : NAN;
				gpud_quantize_row(t, x, q, 32);
				gpud_dequantize_row(t, q, y, 32);
				check_nonfinite_block(t, q, y);
			}
		}
	}
	/* Float types element by element. */
	for (int k = 0; k < 3; k++) {
		enum gpud_type t = all_types[k];

		for (int i = 0; i < 32; i++)
			x[i] = (float)i - 16.0f;
		x[1] = NAN;
		x[2] = INFINITY;
		x[3] = -INFINITY;
		x[4] = -NAN;
		gpud_quantize_row(t, x, q, 32);
		gpud_dequantize_row(t, q, y, 32);
		assert_true(isnan(y[1]) && isnan(y[4]) && signbit(y[4]));
		assert_true(isinf(y[2]) && y[2] > 0 && isinf(y[3]) && y[3] < 0);
		for (int i = 5; i < 32; i++)
			assert_true(y[i] == x[i]);
		if (t == GPUD_TYPE_F32)
			assert_memory_equal(q, x, sizeof(float) * 32);
	}
}

/* Finite blocks whose scale overflows fp16 store d = +-Inf (quant.h):
 * their elements dequantize to +-Inf, and to NaN where q = 0. */
static void test_quantize_scale_overflow(void **state)
{
	float x[32], y[32];
	struct gpud_block_q8_0 b8;
	struct gpud_block_q4_0 b4;

	(void)state;
	for (int i = 0; i < 32; i++)
		x[i] = 0.0f;
	x[0] = 1e7f;   /* q8_0 d = 78740 > 65504 */
	x[1] = -1e7f;
	x[2] = 5e6f;
	gpud_quantize_row(GPUD_TYPE_Q8_0, x, &b8, 32);
	assert_int_equal(b8.d, 0x7c00);
	assert_int_equal(b8.qs[0], 127);
	assert_int_equal(b8.qs[1], -127);
	assert_int_equal(b8.qs[2], 64); /* 63.5, tie to even */
	gpud_dequantize_row(GPUD_TYPE_Q8_0, &b8, y, 32);
	assert_true(isinf(y[0]) && y[0] > 0 && isinf(y[1]) && y[1] < 0 && isinf(y[2]));
	assert_true(isnan(y[3]));
	x[1] = -1e6f;  /* q4_0: m = 1e7, d = -1.25e6 */
	gpud_quantize_row(GPUD_TYPE_Q4_0, x, &b4, 32);
	assert_int_equal(b4.d, 0xfc00);
	gpud_dequantize_row(GPUD_TYPE_Q4_0, &b4, y, 32);
	assert_true(isinf(y[0]) && y[0] > 0); /* q = -8: -Inf * -8 */
	assert_true(isnan(y[3]));             /* q = 0 */
}

/* Known Q4_0/Q8_0 bytes: the layout is the file format. */
static void test_block_layout(void **state)
{
	float x[32], y[32];
	struct gpud_block_q4_0 b4;
	struct gpud_block_q8_0 b8;

	(void)state;
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
	/* q8_0 rounds ties to even: amax 127 makes d = 1, x = 2.5 -> 2, 3.5 -> 4 */
	for (int i = 0; i < 32; i++)
		x[i] = 0.0f;
	x[0] = 127.0f;
	x[1] = 2.5f;
	x[2] = 3.5f;
	x[3] = -2.5f;
	gpud_quantize_row(GPUD_TYPE_Q8_0, x, &b8, 32);
	assert_int_equal(b8.d, 0x3c00);
	assert_int_equal(b8.qs[0], 127);
	assert_int_equal(b8.qs[1], 2);
	assert_int_equal(b8.qs[2], 4);
	assert_int_equal(b8.qs[3], -2);
}

/* The bytes of every type on a fixed input spanning block scales from
 * 2^-135 (1/d overflows) through fp16-subnormal scales to 2^20 (q4_0's
 * scale overflows fp16), with exact halves for the ties. The checksums were
 * taken from the implementation every existing file was written with
 * (kernels.c before quant.c existed, vector and portable paths alike). */
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

static void test_quantize_golden(void **state)
{
	enum { N = 32 * 256 };
	static const uint64_t want[N_TYPES] = {
		0xff3d588b3f2cca38ull, /* f32 */
		0x432ef522d3f9373aull, /* f16 */
		0x98f0e034106c653dull, /* bf16 */
		0x89dd5daf968b906full, /* q8_0 */
		0x489f0727324b6cf4ull, /* q4_0 */
	};
	static float x[N];
	static uint8_t q[N * 4];

	(void)state;
	for (size_t k = 0; k < N_TYPES; k++) {
		rng_state = 0x9e3779b97f4a7c15ull;
		for (int i = 0; i < N; i++) {
			int blk = i / 32;
			float scale = ldexpf(1.0f, blk % 64 == 63 ? -135 : blk % 64 == 62 ? -126
											 : (blk % 51) - 30);
			float v = ((float)(rnd() & 0xffffff) / 8388608.0f - 1.0f) * scale;

			if ((rnd() & 15) == 0)
				v = (float)((int)(rnd() % 33) - 16) * scale / 4;
			x[i] = v;
		}
		for (int i = 32 * 7; i < 32 * 8; i++)
			x[i] = 0.0f;
		gpud_quantize_row(all_types[k], x, q, N);
		if (fnv1a(q, gpud_type_row_bytes(all_types[k], N)) != want[k])
			fail_msg("%s: quantized bytes changed (checksum 0x%016llx)",
				 gpud_type_name(all_types[k]),
				 (unsigned long long)fnv1a(q, gpud_type_row_bytes(all_types[k], N)));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_traits_table),
		cmocka_unit_test(test_type_helpers),
		cmocka_unit_test(test_block_sizes),
		cmocka_unit_test(test_row_bytes),
		cmocka_unit_test(test_fp16_edges),
		cmocka_unit_test(test_fp16_roundtrip_all),
		cmocka_unit_test(test_fp16_nearest),
		cmocka_unit_test(test_bf16_edges),
		cmocka_unit_test(test_quantize_roundtrip),
		cmocka_unit_test(test_quantize_nonfinite),
		cmocka_unit_test(test_quantize_scale_overflow),
		cmocka_unit_test(test_block_layout),
		cmocka_unit_test(test_quantize_golden),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
