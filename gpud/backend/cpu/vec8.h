/* vec8.h - 8-float vectors for the CPU backend's attention (GCC and clang
 * vector extensions), and an exponential over them.
 *
 * Plain IEEE adds and multiplies, none fused (no target that includes
 * the helpers enables FMA), so a vector op gives the bits eight scalar
 * ops would: SSE pairs in the default build, one AVX register in an avx2
 * clone, the same results. */
#ifndef GPUD_BACKEND_CPU_VEC8_H
#define GPUD_BACKEND_CPU_VEC8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Lane i of a sum over a row takes elements i, i+8, ... exactly like the
 * eighth of eight scalar accumulators would. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* A macro, not a function: returning a 32-byte vector from a function
 * compiled without AVX is an ABI hazard (-Wpsabi). */
#define load8(p)                               \
	({                                     \
		v8f v8_;                       \
		memcpy(&v8_, (p), sizeof(v8_)); \
		v8_;                           \
	})

/* e^x in each lane of *xp, in place (through a pointer for the reason of
 * load8). A Cephes-style reduction x = n ln2 + r (ln2 in two parts, the
 * first with few bits, so that n ln2 is exact), a polynomial of degree 7
 * in r, and 2^n made in the exponent bits: within 2 ulp of expf from -87
 * to 88 (tests/unit/kernels_test.c measures it). Lanes below -87 (e^-87
 * is 1.6e-38: a denormal or less), -inf included, give 0; lanes above 88
 * give +inf (e^88 is 1.65e38 and the float range ends at 88.72: the
 * softmax never asks, its exponents are scores minus their maximum, and
 * SwiGLU's e^-g past it only divides g into -0 instead of a denormal);
 * NaN gives NaN; 0 gives exactly 1. Every lane gives the same bits for
 * the same x. */
static inline __attribute__((always_inline)) void exp8(v8f *xp)
{
	v8f x = *xp;
	const v8f lo = { -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f };
	const v8f hi = { 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f, 88.0f };
	const v8f inf = { INFINITY, INFINITY, INFINITY, INFINITY,
			  INFINITY, INFINITY, INFINITY, INFINITY };
	v8i dead = x < lo, big = x > hi;
	v8f xc = (v8f)((v8i)x & ~dead & ~big); /* dead and big lanes: 0 */
	/* n = round(x / ln2): 1.5 * 2^23 pushes the fraction out and back */
	v8f fn = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
	v8f r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
	v8f p = 1.9875691500e-4f * r + 1.3981999507e-3f;

	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = (p * (r * r) + r) + 1.0f;
	p = p * (v8f)((__builtin_convertvector(fn, v8i) + 127) << 23);
	*xp = (v8f)(((v8i)p & ~dead & ~big) | ((v8i)inf & big));
}

#endif
