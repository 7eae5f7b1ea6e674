/* test_rand.h - the tests' reproducible random numbers (xorshift64): seed
 * rng_state, then draw. Header-only: each test has its own state. */
#ifndef TEST_RAND_H
#define TEST_RAND_H

#include <stdint.h>

static uint64_t rng_state = 1;

static inline uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-1, 1) with an occasional outlier, as real activations. */
static inline float rndf(void)
{
	float v = (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;

	if ((rnd() & 63) == 0)
		v *= 8.0f;
	return v;
}

#endif
