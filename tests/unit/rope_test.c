/* rope_test.c - gpud/backend/cpu/rope.h: both pairing styles against a
 * double-precision rotation, and shifts by a position delta (re-rotating
 * cached K): shift(d) is the table of d applied, composes with the
 * rotation at p to the rotation at p + d, and shift(-d) undoes shift(d). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "gpud/backend/cpu/rope.h"
#include "tests/unit/test_rand.h"

#define HD 16
#define NH 3

/* The pair (i0, i1) of pair index i for style. */
static void pair(enum gpud_rope_style st, uint32_t i, uint32_t *i0, uint32_t *i1)
{
	*i0 = st == GPUD_ROPE_NEOX ? i : 2 * i;
	*i1 = st == GPUD_ROPE_NEOX ? i + HD / 2 : 2 * i + 1;
}

/* want = x rotated at pos, in double. */
static void rotate_ref(const float *x, double *want, const float *inv, enum gpud_rope_style st,
		       int64_t pos)
{
	for (uint32_t h = 0; h < NH; h++)
		for (uint32_t i = 0; i < HD / 2; i++) {
			uint32_t i0, i1;
			pair(st, i, &i0, &i1);
			double th = (double)pos * inv[i], a = x[h * HD + i0], b = x[h * HD + i1];
			want[h * HD + i0] = a * cos(th) - b * sin(th);
			want[h * HD + i1] = a * sin(th) + b * cos(th);
		}
}

static void fill(float *x, uint64_t *rs)
{
	rng_state = ++*rs;
	for (uint32_t i = 0; i < NH * HD; i++)
		x[i] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
}

static void test_styles_against_double(void **state)
{
	(void)state;
	static const enum gpud_rope_style styles[] = { GPUD_ROPE_NORM, GPUD_ROPE_NEOX };
	float inv[HD / 2], cs[HD], x[NH * HD], y[NH * HD];
	double want[NH * HD];
	uint64_t rs = 11;

	gpud_rope_inv_freq(inv, HD, 10000.0f, NULL);
	for (size_t s = 0; s < 2; s++)
		for (int64_t pos = 0; pos < 300; pos += 37) {
			fill(x, &rs);
			memcpy(y, x, sizeof(x));
			gpud_rope_table(cs, inv, HD / 2, pos);
			gpud_rope_apply(y, cs, NH, HD, styles[s]);
			rotate_ref(x, want, inv, styles[s], pos);
			for (uint32_t i = 0; i < NH * HD; i++)
				assert_float_equal(y[i], want[i], 1e-5);
		}
}

/* The two styles pair different elements: on the same row they differ. */
static void test_styles_differ(void **state)
{
	(void)state;
	float inv[HD / 2], cs[HD], a[NH * HD], b[NH * HD];
	double d = 0;
	uint64_t rs = 12;

	gpud_rope_inv_freq(inv, HD, 10000.0f, NULL);
	fill(a, &rs);
	memcpy(b, a, sizeof(a));
	gpud_rope_table(cs, inv, HD / 2, 5);
	gpud_rope_apply(a, cs, NH, HD, GPUD_ROPE_NORM);
	gpud_rope_apply(b, cs, NH, HD, GPUD_ROPE_NEOX);
	for (uint32_t i = 0; i < NH * HD; i++)
		d = fmax(d, fabs(a[i] - b[i]));
	assert_true(d > 0.1);
}

static void test_shift(void **state)
{
	(void)state;
	static const enum gpud_rope_style styles[] = { GPUD_ROPE_NORM, GPUD_ROPE_NEOX };
	static const int64_t deltas[] = { 1, -1, 17, -40, 1000, -999 };
	float inv[HD / 2], cs[HD], x[NH * HD], y[NH * HD], z[NH * HD];
	double want[NH * HD];
	uint64_t rs = 13;

	gpud_rope_inv_freq(inv, HD, 1e6f, NULL);
	for (size_t s = 0; s < 2; s++)
		for (size_t k = 0; k < sizeof(deltas) / sizeof(deltas[0]); k++) {
			int64_t p = 1200, d = deltas[k];
			fill(x, &rs);
			/* shift(d) == table(d) applied, bit for bit */
			memcpy(y, x, sizeof(x));
			memcpy(z, x, sizeof(x));
			gpud_rope_shift(y, NH, HD, styles[s], inv, d);
			gpud_rope_table(cs, inv, HD / 2, d);
			gpud_rope_apply(z, cs, NH, HD, styles[s]);
			assert_memory_equal(y, z, sizeof(y));
			/* rotated at p, then shifted by d: rotated at p + d */
			memcpy(y, x, sizeof(x));
			gpud_rope_table(cs, inv, HD / 2, p);
			gpud_rope_apply(y, cs, NH, HD, styles[s]);
			gpud_rope_shift(y, NH, HD, styles[s], inv, d);
			rotate_ref(x, want, inv, styles[s], p + d);
			for (uint32_t i = 0; i < NH * HD; i++)
				assert_float_equal(y[i], want[i], 1e-5);
			/* and shifted back by -d: rotated at p */
			gpud_rope_shift(y, NH, HD, styles[s], inv, -d);
			rotate_ref(x, want, inv, styles[s], p);
			for (uint32_t i = 0; i < NH * HD; i++)
				assert_float_equal(y[i], want[i], 1e-5);
		}
	/* shift by 0 changes nothing */
	fill(x, &rs);
	memcpy(y, x, sizeof(x));
	gpud_rope_shift(y, NH, HD, GPUD_ROPE_NEOX, inv, 0);
	assert_memory_equal(x, y, sizeof(x));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_styles_against_double),
		cmocka_unit_test(test_styles_differ),
		cmocka_unit_test(test_shift),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
