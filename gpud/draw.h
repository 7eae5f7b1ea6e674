/* draw.h - one draw from a logits row, defined so that a GPU and a CPU
 * draw the same token from the same row, bit for bit.
 *
 * A draw (temperature > 0; greedy is gpud_argmax) is integer arithmetic
 * over quantities every machine computes the same way:
 *
 *   penalties  first, each of the window's distinct tokens' logit is
 *           replaced by gpud_draw_penalize's (repeat, frequency, presence
 *           penalties; one fma, one division or product, one difference);
 *           with temperature <= 0 the draw is then the arg max;
 *   order   the row's usable logits (numbers above -inf) by the 64-bit
 *           key gpud_draw_key: greater logit first, then lower index,
 *           -0 equal to +0 (the arg max's order; NaN and -inf are out);
 *   mass    m_i = floor(E((l_i - max) / T) * 2^40), E an exp written
 *           from IEEE operations only (gpud_draw_mass below: rint, fma,
 *           exact scaling), so the device and the host agree to the bit;
 *           E(0) = 1: the best token weighs 2^40, and tokens below
 *           2^-40 of it (x < GPUD_DRAW_X_MIN) weigh 0 and are never
 *           drawn. A +inf max gives every +inf logit 2^40, the rest 0;
 *   top-k   the first top_k tokens of the order (when 0 < top_k < usable);
 *   top-p   the shortest prefix of those whose mass reaches
 *           ceil(top_p * S), S their total (as double arithmetic, which
 *           IEEE fixes);
 *   min-p   of those, the tokens with m_i >= min_p * 2^40;
 *   draw    r = the high 64 bits of rand * W (W their total): the token
 *           whose span [C, C + m) of the prefix sums in order holds r.
 *
 * Sums are of integers (exact in any order), so the device may reduce
 * in parallel and still pick the host's token. The only floating-point
 * steps are the per-token mass (the same IEEE operations everywhere:
 * the CUDA path spells them with _rn intrinsics so nothing contracts)
 * and the two thresholds. gpud_draw_row (sampler.c) is the host's; the
 * CUDA backend's draw kernel is the device's.
 */
#ifndef GPUD_DRAW_H
#define GPUD_DRAW_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define GPUD_DRAW_HD static __host__ __device__ __forceinline__
#elif defined(__GNUC__) /* inlined into sampler.c's FMA clone too */
#define GPUD_DRAW_HD static inline __attribute__((always_inline))
#else
#define GPUD_DRAW_HD static inline
#endif

/* Distinct tokens a draw can penalize (a window with more is sampled on
 * the host): the HTTP API's window of 256 tokens fits. */
#define GPUD_DRAW_MAX_PEN 256

struct gpud_draw {
	float temperature; /* <= 0: the arg max of the penalized row */
	int32_t top_k;     /* <= 0: off */
	float top_p;       /* >= 1: off */
	float min_p;       /* <= 0: off */
	uint64_t rand;     /* the sampler's next PRNG output */
	/* penalties: n_pen distinct token ids and their counts in the window */
	float repeat_penalty, frequency_penalty, presence_penalty;
	uint32_t n_pen; /* 0: none */
	int32_t pen_id[GPUD_DRAW_MAX_PEN];
	uint32_t pen_n[GPUD_DRAW_MAX_PEN];
};

/* The best token's mass: E(0) * 2^40. */
#define GPUD_DRAW_ONE (1ull << 40)
/* Below this x = (l - max) / T a token weighs 0 (e^x < 2^-40). */
#define GPUD_DRAW_X_MIN (-27.75f)
/* Rows longer than this could overflow the 64-bit sums. */
#define GPUD_DRAW_MAX_VOCAB (1 << 23)

/* The order's key of logit v at index i: greater is earlier; 0 for NaN
 * and -inf (not usable). Unique per index. */
GPUD_DRAW_HD uint64_t gpud_draw_key(float v, uint32_t i)
{
	union {
		float f;
		uint32_t u;
	} b;

	/* without branches: half a row's signs are a coin toss */
	b.f = v + 0.0f; /* -0 becomes +0, every other value stays */
	b.u ^= (uint32_t)((int32_t)b.u >> 31) | 0x80000000u; /* negative: ~u */
	return v > -INFINITY ? (uint64_t)b.u << 32 | (0xffffffffu - i) : 0; /* NaN: 0 */
}

#if defined(__CUDA_ARCH__) /* device code; cuemu builds with -ffp-contract=off */
#define GPUD_DRAW_MUL(a, b) __fmul_rn((a), (b))
#define GPUD_DRAW_SUB(a, b) __fsub_rn((a), (b))
#define GPUD_DRAW_DIV(a, b) __fdiv_rn((a), (b))
#else
#define GPUD_DRAW_MUL(a, b) ((a) * (b))
#define GPUD_DRAW_SUB(a, b) ((a) - (b))
#define GPUD_DRAW_DIV(a, b) ((a) / (b))
#endif

/* Logit l of a token seen n times in the window, penalized: divided by
 * the repeat penalty when positive (multiplied when not, llama.cpp's
 * rule), less frequency * n + presence (one fma). */
GPUD_DRAW_HD float gpud_draw_penalize(float l, uint32_t n, float repeat, float frequency,
				      float presence)
{
	float v = l > 0.0f ? GPUD_DRAW_DIV(l, repeat) : GPUD_DRAW_MUL(l, repeat);

	return GPUD_DRAW_SUB(v, fmaf(frequency, (float)n, presence));
}

/* 1 / T as every side computes it. */
GPUD_DRAW_HD float gpud_draw_inv_t(float temperature)
{
	return GPUD_DRAW_DIV(1.0f, temperature);
}

/* Whether logit l of a row whose max is mx (both usable, mx finite) may
 * weigh anything at inv_t: it is the max, or x = (l - mx) * inv_t >=
 * GPUD_DRAW_X_MIN. Monotone in l, so the live tokens are a prefix of the
 * order; every other token's mass is 0. */
GPUD_DRAW_HD bool gpud_draw_live(float l, float mx, float inv_t)
{
	float d = GPUD_DRAW_SUB(l, mx);

	return d == 0.0f || GPUD_DRAW_MUL(d, inv_t) >= GPUD_DRAW_X_MIN;
}

/* The mass of logit l in a row whose max is mx (both usable, mx finite),
 * at inv_t = gpud_draw_inv_t(T), as a float: floor() of it is the mass
 * (gpud_draw_mass). It is E((l - mx) * inv_t) * 2^40, where E is e^x for
 * x <= 0 within about 2 ulp: x = n ln2 + r with n = rint(x / ln2) and r
 * by two fmas (Cody-Waite), e^r by its Taylor polynomial of degree 7
 * (|r| <= ln2 / 2: error below 2^-27) in Horner form of fmas, times 2^n
 * made from bits. Every operation is one IEEE rounding, so the result is
 * the same wherever it runs; written without branches so that a host
 * compiler vectorizes a loop of it. 2^40 when l == mx, 0 below X_MIN. */
GPUD_DRAW_HD float gpud_draw_massf(float l, float mx, float inv_t)
{
	union {
		float f;
		uint32_t u;
	} sc;
	float d = GPUD_DRAW_SUB(l, mx), x = GPUD_DRAW_MUL(d, inv_t), n, r, p;
	bool live = x >= GPUD_DRAW_X_MIN; /* false for NaN too */

	x = live ? x : GPUD_DRAW_X_MIN; /* keeps the arithmetic in range */
	n = rintf(GPUD_DRAW_MUL(x, 1.44269502f));
	r = fmaf(n, -0.693145752f, x);    /* ln2 high part: 16 significant bits */
	r = fmaf(n, -1.42860677e-06f, r); /* ln2 - high part */
	p = fmaf(1.98412698e-04f, r, 1.38888889e-03f);
	p = fmaf(p, r, 8.33333333e-03f);
	p = fmaf(p, r, 4.16666667e-02f);
	p = fmaf(p, r, 1.66666667e-01f);
	p = fmaf(p, r, 0.5f);
	p = fmaf(p, r, 1.0f);
	p = fmaf(p, r, 1.0f);
	sc.u = (uint32_t)(127 + (int32_t)n) << 23; /* n in [-41, 0]: normal */
	p = GPUD_DRAW_MUL(GPUD_DRAW_MUL(p, sc.f), 1099511627776.0f); /* * 2^40, exact */
	p = p < 1099511627776.0f ? p : 1099511627776.0f;
	p = live ? p : 0.0f;
	return d == 0.0f ? 1099511627776.0f : p;
}

/* The mass itself: an integer in [0, 2^40]. */
GPUD_DRAW_HD uint64_t gpud_draw_mass(float l, float mx, float inv_t)
{
	return (uint64_t)gpud_draw_massf(l, mx, inv_t);
}

#endif
