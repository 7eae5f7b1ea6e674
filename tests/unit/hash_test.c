/* hash_test.c - sw_hash64: determinism, lengths, seeds, avalanche, alignment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/hash.h"

static uint64_t rng_state = 0x1234567887654321ULL;

static uint64_t rng(void)
{
	/* splitmix64: a fixed, portable sequence for reproducible samples. */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)rng();
}

static void test_deterministic(void **state)
{
	(void)state;
	const char *s = "the quick brown fox jumps over the lazy dog, twice over";
	uint64_t a = sw_hash64(s, strlen(s), 0);
	assert_true(a == sw_hash64(s, strlen(s), 0));
	/* A copy in other memory hashes the same: only bytes matter. */
	char *copy = strdup(s);
	assert_true(a == sw_hash64(copy, strlen(copy), 0));
	free(copy);
	/* NULL is fine for an empty input. */
	assert_true(sw_hash64(NULL, 0, 7) == sw_hash64("", 0, 7));
}

/* Golden values: the hash keys nothing persistent, but an accidental change
 * of the function should be a conscious decision, not a surprise. */
static void test_golden(void **state)
{
	(void)state;
	assert_true(sw_hash64("", 0, 0) == 0x4afe460cf634b198ULL);
	assert_true(sw_hash64("abc", 3, 0) == 0x50448558f28ba9c9ULL);
	assert_true(sw_hash64("0123456789abcdef0123456789abcdef0123456789", 42, 1) ==
		    0xb135ac0031f4c8e5ULL);
}

static void test_every_length(void **state)
{
	(void)state;
	uint64_t h[101];

	for (size_t len = 0; len <= 100; len++) {
		/* Data flush against the end of its allocation: ASan and valgrind
		 * catch any read past len. */
		uint8_t *buf = malloc(len ? len : 1);
		assert_non_null(buf);
		rng_state = 42;
		fill(buf, len);
		h[len] = sw_hash64(buf, len, 0);
		if (len > 0) {
			/* The last byte counts (tail handling reaches it). */
			buf[len - 1] ^= 1;
			assert_true(sw_hash64(buf, len, 0) != h[len]);
			buf[len - 1] ^= 1;
			/* So does the first. */
			buf[0] ^= 0x80;
			assert_true(sw_hash64(buf, len, 0) != h[len]);
		}
		free(buf);
	}
	/* Prefixes of one stream: every length gives a different value, so
	 * the length (zero bytes included) is part of the hash. */
	for (size_t i = 0; i <= 100; i++)
		for (size_t j = i + 1; j <= 100; j++)
			assert_true(h[i] != h[j]);

	uint8_t zeros[64] = { 0 };
	for (size_t i = 0; i < 64; i++)
		assert_true(sw_hash64(zeros, i, 0) != sw_hash64(zeros, i + 1, 0));
}

static void test_seed(void **state)
{
	(void)state;
	uint8_t buf[77];
	fill(buf, sizeof(buf));
	for (size_t len = 0; len <= sizeof(buf); len += 11) {
		uint64_t a = sw_hash64(buf, len, 0);
		assert_true(a != sw_hash64(buf, len, 1));
		assert_true(a != sw_hash64(buf, len, 1ULL << 63));
		assert_true(sw_hash64(buf, len, 1) != sw_hash64(buf, len, 2));
	}
}

/* Flipping any single input bit should flip each output bit with
 * probability ~1/2. Loose bounds: a broken mix (a missed lane, a weak tail)
 * lands far outside them, a good one well inside. */
static void test_avalanche(void **state)
{
	(void)state;
	static const size_t lens[] = { 1, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 80 };
	unsigned flips_per_bit[64] = { 0 };
	uint64_t trials = 0, total = 0;
	uint8_t buf[80];

	rng_state = 7;
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		size_t len = lens[li];
		for (int sample = 0; sample < 24; sample++) {
			fill(buf, len);
			uint64_t seed = rng();
			uint64_t base = sw_hash64(buf, len, seed);
			for (size_t bit = 0; bit < len * 8; bit++) {
				buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
				uint64_t d = base ^ sw_hash64(buf, len, seed);
				buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
				int n = __builtin_popcountll(d);
				/* No single flip may leave the output nearly unchanged. */
				assert_true(n >= 8 && n <= 56);
				total += (uint64_t)n;
				for (int o = 0; o < 64; o++)
					flips_per_bit[o] += (d >> o) & 1;
				trials++;
			}
		}
	}
	double mean = (double)total / (double)trials;
	assert_true(mean > 31.0 && mean < 33.0);
	for (int o = 0; o < 64; o++) {
		double p = (double)flips_per_bit[o] / (double)trials;
		assert_true(p > 0.45 && p < 0.55);
	}
}

static void test_unaligned(void **state)
{
	(void)state;
	uint8_t raw[128 + 8];
	uint8_t ref[128];

	fill(ref, sizeof(ref));
	for (size_t len = 0; len <= 128; len += 5) {
		uint64_t want = sw_hash64(ref, len, 3);
		for (size_t off = 1; off < 8; off++) {
			memcpy(raw + off, ref, len);
			assert_true(sw_hash64(raw + off, len, 3) == want);
		}
	}
}

static void test_combine(void **state)
{
	(void)state;
	uint64_t a = sw_hash64("parent", 6, 0), b = sw_hash64("child", 5, 0);
	assert_true(sw_hash_combine(a, b) != sw_hash_combine(b, a));
	assert_true(sw_hash_combine(a, b) == sw_hash_combine(a, b));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deterministic),
		cmocka_unit_test(test_golden),
		cmocka_unit_test(test_every_length),
		cmocka_unit_test(test_seed),
		cmocka_unit_test(test_avalanche),
		cmocka_unit_test(test_unaligned),
		cmocka_unit_test(test_combine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
