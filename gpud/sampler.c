/* sampler.c - greedy / temperature / top-k / top-p / min-p sampling with
 * an own xoshiro256** generator, and the stop-condition helper.
 *
 * Every array is sized for n_vocab at creation; a call to sample touches
 * only those. A draw with a temperature is gpud/draw.h's exact integer
 * definition (the CUDA backend's draw kernel computes the same), found
 * by radix selection over the candidates' keys: O(n) whatever the
 * filters, no sort, nothing that allocates.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/clones.h"
#include "common/err.h"
#include "gpud/draw.h"
#include "gpud/sampler.h"

/* A candidate of a draw: its order key (gpud_draw_key) and mass. */
struct dcand {
	uint64_t key;
	uint64_t mass;
};

/* What one draw works in, n_vocab-sized: nothing in it outlives a call. */
struct gpud_sampler_scratch {
	int32_t n_vocab;
	struct dcand *cand; /* (n_vocab) */
	float *pen;         /* (n_vocab) the penalized logits */
	uint32_t *count;    /* (n_vocab) occurrences in the window being
			     * penalized; all 0 between calls */
	uint64_t hist[2048]; /* rank_select's bins */
};

/* A sequence's state: what persists from one token to the next. */
struct gpud_sampler {
	struct gpud_sampler_params p;
	int32_t n_vocab;
	uint64_t rng[4];
	/* logit biases (gpud_sampler_set_bias): views of the caller's arrays */
	const int32_t *bias_id;
	const float *bias_val;
	uint32_t n_bias;
	int32_t *hist;      /* (GPUD_SAMPLER_MAX_PENALTY_LAST_N) ring of accepted ids */
	uint32_t hist_head; /* next slot to write */
	uint32_t hist_n;    /* valid entries, <= penalty_last_n */
	struct gpud_sampler_scratch *own; /* or NULL: sampled with a caller's */
};

/* --- PRNG: xoshiro256**, seeded through splitmix64 --------------------- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static void rng_seed(uint64_t st[4], uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		st[i] = splitmix64(&x);
}

static uint64_t rng_next(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

uint64_t gpud_sampler_next_u64(struct gpud_sampler *s)
{
	return rng_next(s->rng);
}

/* --- parameters ------------------------------------------------------- */

void gpud_sampler_params_default(struct gpud_sampler_params *p)
{
	memset(p, 0, sizeof(*p));
	p->temperature = 0.0f;
	p->top_k = 0;
	p->top_p = 1.0f;
	p->min_p = 0.0f;
	p->repeat_penalty = 1.0f;
}

int gpud_sampler_params_check(const struct gpud_sampler_params *p, char *err, size_t errlen)
{
	if (!p)
		return sw_seterr(err, errlen, -EINVAL, "sampler: no parameters");
	if (!isfinite(p->temperature))
		return sw_seterr(err, errlen, -EINVAL, "sampler: temperature must be finite");
	if (!(p->top_p > 0.0f) || isnan(p->top_p))
		return sw_seterr(err, errlen, -EINVAL, "sampler: top_p must be > 0 (>= 1 = off)");
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return sw_seterr(err, errlen, -EINVAL, "sampler: min_p must be in [0, 1]");
	if (p->penalty_last_n < 0 || p->penalty_last_n > GPUD_SAMPLER_MAX_PENALTY_LAST_N)
		return sw_seterr(err, errlen, -EINVAL, "sampler: penalty_last_n must be in [0, %d]",
				 GPUD_SAMPLER_MAX_PENALTY_LAST_N);
	if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
		return sw_seterr(err, errlen, -EINVAL, "sampler: repeat_penalty must be > 0");
	if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
		return sw_seterr(err, errlen, -EINVAL, "sampler: penalties must be finite");
	return 0;
}

static void sampler_start(struct gpud_sampler *s, const struct gpud_sampler_params *p)
{
	s->p = *p;
	rng_seed(s->rng, p->seed);
	s->hist_head = 0;
	s->hist_n = 0;
	s->n_bias = 0;
}

int gpud_sampler_scratch_create(struct gpud_sampler_scratch **out, int32_t n_vocab, char *err,
				size_t errlen)
{
	struct gpud_sampler_scratch *sc;

	*out = NULL;
	if (n_vocab <= 0)
		return sw_seterr(err, errlen, -EINVAL, "sampler: n_vocab %d must be > 0", n_vocab);
	sc = calloc(1, sizeof(*sc));
	if (sc) {
		sc->n_vocab = n_vocab;
		sc->cand = calloc((size_t)n_vocab, sizeof(*sc->cand));
		sc->pen = calloc((size_t)n_vocab, sizeof(*sc->pen));
		sc->count = calloc((size_t)n_vocab, sizeof(*sc->count));
	}
	if (!sc || !sc->cand || !sc->pen || !sc->count) {
		gpud_sampler_scratch_free(sc);
		return sw_seterr(err, errlen, -ENOMEM, "sampler: out of memory for %d tokens",
				 n_vocab);
	}
	*out = sc;
	return 0;
}

void gpud_sampler_scratch_free(struct gpud_sampler_scratch *sc)
{
	if (!sc)
		return;
	free(sc->cand);
	free(sc->pen);
	free(sc->count);
	free(sc);
}

size_t gpud_sampler_scratch_bytes(int32_t n_vocab)
{
	return sizeof(struct gpud_sampler_scratch) +
	       (size_t)(n_vocab > 0 ? n_vocab : 0) *
		       (sizeof(struct dcand) + sizeof(float) + sizeof(uint32_t));
}

size_t gpud_sampler_bytes(void)
{
	return sizeof(struct gpud_sampler) + GPUD_SAMPLER_MAX_PENALTY_LAST_N * sizeof(int32_t);
}

static int create(struct gpud_sampler **out, int32_t n_vocab, const struct gpud_sampler_params *p,
		  bool own, char *err, size_t errlen)
{
	struct gpud_sampler *s;
	int rc;

	*out = NULL;
	if (n_vocab <= 0)
		return sw_seterr(err, errlen, -EINVAL, "sampler: n_vocab %d must be > 0", n_vocab);
	rc = gpud_sampler_params_check(p, err, errlen);
	if (rc)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return sw_seterr(err, errlen, -ENOMEM, "sampler: out of memory");
	s->n_vocab = n_vocab;
	s->hist = calloc(GPUD_SAMPLER_MAX_PENALTY_LAST_N, sizeof(*s->hist));
	if (!s->hist) {
		gpud_sampler_free(s);
		return sw_seterr(err, errlen, -ENOMEM, "sampler: out of memory");
	}
	if (own && (rc = gpud_sampler_scratch_create(&s->own, n_vocab, err, errlen))) {
		gpud_sampler_free(s);
		return rc;
	}
	sampler_start(s, p);
	*out = s;
	return 0;
}

int gpud_sampler_create(struct gpud_sampler **out, int32_t n_vocab,
			const struct gpud_sampler_params *p, char *err, size_t errlen)
{
	return create(out, n_vocab, p, true, err, errlen);
}

int gpud_sampler_create_light(struct gpud_sampler **out, int32_t n_vocab,
			      const struct gpud_sampler_params *p, char *err, size_t errlen)
{
	return create(out, n_vocab, p, false, err, errlen);
}

void gpud_sampler_free(struct gpud_sampler *s)
{
	if (!s)
		return;
	gpud_sampler_scratch_free(s->own);
	free(s->hist);
	free(s);
}

int gpud_sampler_reset(struct gpud_sampler *s, const struct gpud_sampler_params *p,
		       char *err, size_t errlen)
{
	int rc = gpud_sampler_params_check(p, err, errlen);
	if (rc)
		return rc;
	sampler_start(s, p);
	return 0;
}

void gpud_sampler_accept(struct gpud_sampler *s, int32_t id)
{
	uint32_t last_n = (uint32_t)s->p.penalty_last_n;

	if (last_n == 0 || id < 0 || id >= s->n_vocab)
		return;
	if (s->hist_n == last_n) {
		/* window full: the oldest entry leaves */
		s->hist_n--;
	}
	s->hist[s->hist_head] = id;
	s->hist_head = (s->hist_head + 1) % GPUD_SAMPLER_MAX_PENALTY_LAST_N;
	s->hist_n++;
}

/* --- logit biases ------------------------------------------------------- */

int gpud_sampler_bias_check(const int32_t *ids, const float *bias, uint32_t n, int32_t n_vocab,
			    char *err, size_t errlen)
{
	if (n > GPUD_SAMPLER_MAX_BIAS)
		return sw_seterr(err, errlen, -EINVAL, "logit_bias: %u entries, at most %d", n,
				 GPUD_SAMPLER_MAX_BIAS);
	for (uint32_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= n_vocab)
			return sw_seterr(err, errlen, -EINVAL, "logit_bias: token id %d is not in "
					 "the vocabulary of %d", ids[i], n_vocab);
		if (!(bias[i] >= -100.0f && bias[i] <= 100.0f))
			return sw_seterr(err, errlen, -EINVAL, "logit_bias: token %d: bias %g (a "
					 "number in [-100, 100])", ids[i], (double)bias[i]);
	}
	return 0;
}

void gpud_sampler_set_bias(struct gpud_sampler *s, const int32_t *ids, const float *bias,
			   uint32_t n)
{
	s->bias_id = ids;
	s->bias_val = bias;
	s->n_bias = n;
}

/* Adds the biases to a private copy of the logits (a token named twice
 * gets both). */
static void apply_bias(const struct gpud_sampler *s, float *row)
{
	for (uint32_t i = 0; i < s->n_bias; i++)
		row[s->bias_id[i]] += s->bias_val[i];
}

/* --- penalties ---------------------------------------------------------- */

static bool penalties_on(const struct gpud_sampler *s)
{
	const struct gpud_sampler_params *p = &s->p;

	return p->penalty_last_n > 0 && s->hist_n > 0 &&
	       (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
		p->presence_penalty != 0.0f);
}

/* The i-th newest id of the history window. */
static inline int32_t hist_at(const struct gpud_sampler *s, uint32_t i)
{
	return s->hist[(s->hist_head + GPUD_SAMPLER_MAX_PENALTY_LAST_N - 1 - i) %
		       GPUD_SAMPLER_MAX_PENALTY_LAST_N];
}

/* Penalizes each distinct token of the history once, by its count in the
 * window (counted here, O(window), and zeroed again as it is applied), in
 * sc->pen, a copy of the row. */
static void apply_penalties(struct gpud_sampler *s, struct gpud_sampler_scratch *sc)
{
	const struct gpud_sampler_params *p = &s->p;
	uint32_t i;

	for (i = 0; i < s->hist_n; i++)
		sc->count[hist_at(s, i)]++;
	for (i = 0; i < s->hist_n; i++) {
		int32_t id = hist_at(s, i);

		if (!sc->count[id]) /* done already */
			continue;
		sc->pen[id] = gpud_draw_penalize(sc->pen[id], sc->count[id], p->repeat_penalty,
						 p->frequency_penalty, p->presence_penalty);
		sc->count[id] = 0;
	}
}

static inline bool usable(float l)
{
	return !isnan(l) && l != -INFINITY;
}

/* The greatest of n logits: eight independent maxima a core streams
 * through (NaN never compares greater, and -inf never beats the -inf
 * start); -inf when none is usable (or n <= 0). */
static float row_max(const float *l, int32_t n)
{
	float m[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
		       -INFINITY, -INFINITY, -INFINITY, -INFINITY };
	float best;
	int32_t i = 0;

	for (; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			m[k] = l[i + k] > m[k] ? l[i + k] : m[k];
	for (; i < n; i++)
		m[0] = l[i] > m[0] ? l[i] : m[0];
	best = m[0];
	for (int k = 1; k < 8; k++)
		best = m[k] > best ? m[k] : best;
	return best;
}

int32_t gpud_argmax(const float *l, int32_t n)
{
	/* Two passes: the greatest value, then the first index holding it
	 * (-0 == +0). */
	float best = row_max(l, n);
	int32_t i;

	if (best == -INFINITY) /* nothing usable (or n <= 0) */
		return -EINVAL;
	for (i = 0; l[i] != best; i++)
		;
	return i;
}

/* --- log probabilities ---------------------------------------------------- */

/* The sum of the row's masses at temperature 1 about its finite maximum
 * mx (gpud_draw_massf: e^(l - mx) * 2^40, NaN and tokens below 2^-40 of
 * the best 0). Dropping those tokens costs under n * 2^-40 of a sum that
 * is at least 2^40: a log probability off by less than 1.3e-7 for Llama
 * 3's 128256 tokens. A chunk's masses at a time in a loop the compiler
 * vectorizes, then eight float sums of 32 masses each and the chunk's in
 * double: under 2^-19 of the sum from the roundings. */
static inline __attribute__((always_inline)) double mass_sum_body(const float *l, size_t nv,
								 float mx)
{
	float mf[256];
	double s = 0;

	for (size_t i0 = 0; i0 < nv; i0 += 256) {
		size_t cn = nv - i0 < 256 ? nv - i0 : 256;
		float acc[8] = { 0 };

		for (size_t j = 0; j < cn; j++)
			mf[j] = gpud_draw_massf(l[i0 + j], mx, 1.0f);
		for (size_t j = cn; j < (cn + 7) / 8 * 8; j++)
			mf[j] = 0;
		for (size_t j = 0; j < cn; j += 8)
			for (int q = 0; q < 8; q++)
				acc[q] += mf[j + q];
		s += ((double)acc[0] + acc[1]) + ((double)acc[2] + acc[3]) +
		     (((double)acc[4] + acc[5]) + ((double)acc[6] + acc[7]));
	}
	return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* With AVX2 (eight lanes of the integer steps too: FMA alone vectorizes
 * four) where the CPU has it and FMA; else the clones' FMA or plain
 * version. target_clones cannot name the pair, and "arch=haswell" asks
 * for that CPU model, not its features. */
__attribute__((target("avx2,fma"),
	       optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")))
static double mass_sum_avx2(const float *l, size_t nv, float mx)
{
	return mass_sum_body(l, nv, mx);
}

SW_CLONES("fma", "default")
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")))
static double mass_sum_other(const float *l, size_t nv, float mx)
{
	return mass_sum_body(l, nv, mx);
}

static double mass_sum(const float *l, size_t nv, float mx)
{
	static atomic_int avx2 = -1; /* threads that race store the same value */
	int a = atomic_load_explicit(&avx2, memory_order_relaxed);

	if (a < 0) {
		a = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
		atomic_store_explicit(&avx2, a, memory_order_relaxed);
	}
	return a ? mass_sum_avx2(l, nv, mx) : mass_sum_other(l, nv, mx);
}
#else
static double mass_sum(const float *l, size_t nv, float mx)
{
	return mass_sum_body(l, nv, mx);
}
#endif

int gpud_logprobs_row(const float *l, int32_t n, int32_t id, uint32_t n_top,
		      struct gpud_logprobs *out)
{
	uint32_t k = 0, n_inf = 0;
	int32_t i;
	float m;

	if (!l || !out || n <= 0 || id < 0 || id >= n || n_top > GPUD_LOGPROBS_TOP_MAX)
		return -EINVAL;
	m = row_max(l, n);
	/* the n_top greatest in order: an insertion list that a logit enters
	 * only when it beats the list's last; once it is full, a block of 32
	 * whose greatest does not (nearly all of them) is skipped whole */
	for (int32_t b = 0; n_top && b < n; b += 32) {
		int32_t e = n - b < 32 ? n : b + 32;
		if (k == n_top && e - b == 32) {
			float bm[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
					-INFINITY, -INFINITY, -INFINITY, -INFINITY };
			for (int32_t c = b; c < e; c += 8) /* NaN never compares greater */
				for (int q = 0; q < 8; q++)
					bm[q] = l[c + q] > bm[q] ? l[c + q] : bm[q];
			bool any = false;
			for (int q = 0; q < 8; q++)
				any |= bm[q] > out->top_lp[k - 1];
			if (!any)
				continue;
		}
		for (i = b; i < e; i++) {
			float v = l[i];
			if (k == n_top ? !(v > out->top_lp[k - 1]) : isnan(v))
				continue;
			uint32_t j = k < n_top ? k++ : k - 1;
			for (; j > 0 && v > out->top_lp[j - 1]; j--) {
				out->top_lp[j] = out->top_lp[j - 1];
				out->top_id[j] = out->top_id[j - 1];
			}
			out->top_lp[j] = v;
			out->top_id[j] = i;
		}
	}
	/* then log sum exp about the maximum. A +inf maximum shares the mass
	 * among the +inf logits; none usable: all -inf. */
	/* log probability = (l - m) - log(sum e^(l - m)): the difference to
	 * the maximum first, exact for logits near it */
	float lsum = 0;
	bool none = m == -INFINITY; /* every logit -inf or NaN: nothing can occur */
	if (m == INFINITY)
		for (i = 0; i < n; i++)
			n_inf += l[i] == INFINITY;
	else if (!none)
		lsum = (float)log(mass_sum(l, (size_t)n, m) / (double)GPUD_DRAW_ONE);
	out->n_top = k;
	for (uint32_t j = 0; j <= k; j++) {
		float v = j < k ? out->top_lp[j] : l[id], lp;
		if (n_inf)
			lp = v == INFINITY ? -logf((float)n_inf) : -INFINITY;
		else
			lp = none || isnan(v) || v == -INFINITY ? -INFINITY : (v - m) - lsum;
		lp = lp > 0 ? 0 : lp; /* rounding above the maximum's own */
		if (j < k)
			out->top_lp[j] = lp;
		else
			out->logprob = lp;
	}
	return 0;
}

/* --- a draw (gpud/draw.h) -------------------------------------------------- */

static inline uint64_t mulhi64(uint64_t a, uint64_t b)
{
	return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

/* The key of the candidate at rank target of c[0..n) in key order
 * (greatest first), ranks counted in mass (weighted) or one per
 * candidate: the one whose span [C, C + w) holds target, C the weight of
 * the candidates before it. target must be below the total. An MSD radix
 * select over the 64-bit keys, a byte a level: each level keeps the
 * candidates of the byte value whose span holds target (moved to the
 * front), so after the first level it works on few. Reorders c. */
static uint64_t rank_key(struct dcand *c, size_t n, uint64_t target, bool weighted)
{
	uint64_t h[256], base = 0;
	uint32_t cnt[256];
	size_t lo = 0, hi = n, i, m;

	for (int sh = 56; sh >= 0 && hi - lo > 1; sh -= 8) {
		unsigned d;

		memset(h, 0, sizeof(h));
		memset(cnt, 0, sizeof(cnt));
		for (i = lo; i < hi; i++) {
			unsigned b = (unsigned)(c[i].key >> sh) & 255;

			h[b] += weighted ? c[i].mass : 1;
			cnt[b]++;
		}
		for (d = 255; d > 0 && base + h[d] <= target; d--)
			base += h[d];
		if (cnt[d] == hi - lo) /* all share this byte: nothing to move */
			continue;
		for (i = m = lo; i < hi; i++)
			if (((c[i].key >> sh) & 255) == d) {
				struct dcand t = c[i];
				c[i] = c[m];
				c[m++] = t;
			}
		hi = m;
	}
	return c[lo].key;
}

/* rank_key for many candidates: one histogram of the keys' high 32 bits
 * (the logits) over 2048 bins spanning just their range, the bin whose
 * span holds target moved to the front, then rank_key on those few. A
 * row's candidates share their high key bytes, so rank_key alone would
 * spend its first levels on one byte value (and one histogram slot, a
 * chain of dependent adds). Reorders c. */
#define RANK_BINS 2048
static uint64_t rank_select(struct dcand *c, size_t n, uint64_t target, bool weighted,
			    uint64_t *h)
{
	uint32_t lo = UINT32_MAX, hi = 0;
	unsigned sh = 0, b;
	uint64_t base = 0;
	size_t i, m = 0;

	if (n < 64)
		return rank_key(c, n, target, weighted);
	for (i = 0; i < n; i++) {
		uint32_t k = (uint32_t)(c[i].key >> 32);
		lo = k < lo ? k : lo;
		hi = k > hi ? k : hi;
	}
	while (((hi - lo) >> sh) >= RANK_BINS)
		sh++;
	memset(h, 0, RANK_BINS * sizeof(*h));
	for (i = 0; i < n; i++)
		h[((uint32_t)(c[i].key >> 32) - lo) >> sh] += weighted ? c[i].mass : 1;
	for (b = (hi - lo) >> sh; b > 0 && base + h[b] <= target; b--)
		base += h[b];
	for (i = 0; i < n; i++)
		if ((((uint32_t)(c[i].key >> 32) - lo) >> sh) == b) {
			struct dcand t = c[i];
			c[i] = c[m];
			c[m++] = t;
		}
	return rank_key(c, m, target - base, weighted);
}

/* Keeps the candidates with key >= cut and a mass (in any order);
 * returns how many and their total mass in *sum. */
static size_t keep_from(struct dcand *c, size_t n, uint64_t cut, uint64_t *sum)
{
	size_t i, k = 0;
	uint64_t s = 0;

	for (i = 0; i < n; i++)
		if (c[i].key >= cut && c[i].mass) {
			s += c[i].mass;
			c[k++] = c[i];
		}
	*sum = s;
	return k;
}

/* The candidates of row l into c: every usable token when all counts
 * (top-k ranks them), else only those that weigh something; returns how
 * many and their total mass. A row of a trained model is mostly within
 * 27.75 T of its max, so this computes E for most of the row: a chunk's
 * masses at a time in a loop the compiler vectorizes, with FMA
 * instructions where the CPU has them (the same roundings as libm's
 * fmaf, which a plain x86-64 build would call for each). */
#if defined(__x86_64__) && defined(__GNUC__)
SW_CLONES("fma", "default")
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic", "no-trapping-math")))
#endif
static size_t candidates(const float *l, size_t nv, float mx, float inv_t, bool all,
			 struct dcand *c, uint64_t *sum)
{
	float mf[256];
	size_t n = 0;
	uint64_t s = 0;

	for (size_t i0 = 0; i0 < nv; i0 += 256) {
		size_t cn = nv - i0 < 256 ? nv - i0 : 256;

		if (mx == INFINITY)
			for (size_t j = 0; j < cn; j++)
				mf[j] = l[i0 + j] == INFINITY ? (float)GPUD_DRAW_ONE : 0.0f;
		else
			for (size_t j = 0; j < cn; j++)
				mf[j] = gpud_draw_massf(l[i0 + j], mx, inv_t);
		for (size_t j = 0; j < cn; j++) {
			/* branch-free: always written, kept by advancing n */
			uint64_t key = gpud_draw_key(l[i0 + j], (uint32_t)(i0 + j)),
				 m = (uint64_t)(int64_t)mf[j]; /* <= 2^40: one conversion */
			bool keep = key && (m || all);

			c[n].key = key;
			c[n].mass = m;
			s += keep ? m : 0;
			n += keep;
		}
	}
	*sum = s;
	return n;
}

int32_t gpud_draw_row(const float *l, int32_t n_vocab, const struct gpud_draw *dr,
		      struct gpud_sampler_scratch *sc)
{
	struct dcand *c;
	size_t n, i, nv = (size_t)n_vocab;
	float mx, inv_t;
	uint64_t sum = 0;

	if (!l || !dr || !sc || n_vocab <= 0 || n_vocab > GPUD_DRAW_MAX_VOCAB ||
	    sc->n_vocab < n_vocab || dr->n_pen > GPUD_DRAW_MAX_PEN || isnan(dr->temperature))
		return -EINVAL;
	if (dr->n_pen) {
		memcpy(sc->pen, l, nv * sizeof(*sc->pen));
		for (i = 0; i < dr->n_pen; i++)
			if (dr->pen_id[i] >= 0 && dr->pen_id[i] < n_vocab)
				sc->pen[dr->pen_id[i]] = gpud_draw_penalize(
					l[dr->pen_id[i]], dr->pen_n[i], dr->repeat_penalty,
					dr->frequency_penalty, dr->presence_penalty);
		l = sc->pen;
	}
	if (!(dr->temperature > 0.0f))
		return gpud_argmax(l, n_vocab);
	i = (size_t)gpud_argmax(l, n_vocab); /* the first max: any will do */
	if ((int32_t)i < 0)
		return -EINVAL;
	mx = l[i];
	inv_t = gpud_draw_inv_t(dr->temperature);
	c = sc->cand;
	n = candidates(l, nv, mx, inv_t, dr->top_k > 0, c, &sum);
	if (dr->top_k > 0 && (size_t)dr->top_k < n)
		n = keep_from(c, n, rank_select(c, n, (uint64_t)dr->top_k - 1, false, sc->hist),
			      &sum);
	if (dr->top_p < 1.0f) {
		double t = ceil((double)dr->top_p * (double)sum);
		uint64_t tu = t < 1.0 ? 1 : t >= (double)sum ? sum : (uint64_t)t;

		n = keep_from(c, n, rank_select(c, n, tu - 1, true, sc->hist), &sum);
	}
	if (dr->min_p > 0.0f) {
		double thr = (double)dr->min_p * (double)GPUD_DRAW_ONE;
		size_t k = 0;

		sum = 0;
		for (i = 0; i < n; i++)
			if ((double)c[i].mass >= thr) {
				sum += c[i].mass;
				c[k++] = c[i];
			}
		n = k;
	}
	return (int32_t)(0xffffffffu -
			 (uint32_t)rank_select(c, n, mulhi64(dr->rand, sum), true, sc->hist));
}

/* --- sampling -------------------------------------------------------------- */

bool gpud_sampler_greedy(const struct gpud_sampler *s)
{
	return s->p.temperature <= 0.0f && !penalties_on(s) && !s->n_bias;
}

bool gpud_sampler_draw_next(const struct gpud_sampler *s, struct gpud_draw *d)
{
	uint64_t st[4];

	if (s->n_bias)
		return false; /* the host's: a draw does not carry biases */
	if (s->p.temperature <= 0.0f && !penalties_on(s))
		return false; /* the arg max */
	d->n_pen = 0;
	if (penalties_on(s)) {
		/* the window's distinct tokens and their counts, if few enough */
		for (uint32_t i = 0; i < s->hist_n; i++) {
			int32_t id = hist_at(s, i);
			uint32_t j;

			for (j = 0; j < d->n_pen && d->pen_id[j] != id; j++)
				;
			if (j == d->n_pen) {
				if (d->n_pen == GPUD_DRAW_MAX_PEN)
					return false;
				d->pen_id[d->n_pen] = id;
				d->pen_n[d->n_pen++] = 0;
			}
			d->pen_n[j]++;
		}
	}
	d->repeat_penalty = s->p.repeat_penalty;
	d->frequency_penalty = s->p.frequency_penalty;
	d->presence_penalty = s->p.presence_penalty;
	d->temperature = s->p.temperature;
	d->top_k = s->p.top_k;
	d->top_p = s->p.top_p;
	d->min_p = s->p.min_p;
	memcpy(st, s->rng, sizeof(st));
	d->rand = rng_next(st);
	return true;
}

void gpud_sampler_draw_done(struct gpud_sampler *s)
{
	if (s->p.temperature > 0.0f) /* a greedy pick uses no random bits */
		rng_next(s->rng);
}

int32_t gpud_sampler_sample(struct gpud_sampler *s, const float *logits)
{
	return gpud_sampler_sample_with(s, NULL, logits);
}

int32_t gpud_sampler_sample_with(struct gpud_sampler *s, struct gpud_sampler_scratch *sc,
				 const float *logits)
{
	const struct gpud_sampler_params *p = &s->p;
	const float *row = logits;
	bool pen = penalties_on(s);
	struct gpud_draw d;

	if (p->temperature <= 0.0f && !pen && !s->n_bias)
		return gpud_argmax(logits, s->n_vocab);
	if (!sc)
		sc = s->own;
	if (!sc || sc->n_vocab != s->n_vocab)
		return -EINVAL;
	if (pen || s->n_bias) {
		/* biases first, then penalties (llama.cpp's order) */
		memcpy(sc->pen, logits, (size_t)s->n_vocab * sizeof(*sc->pen));
		apply_bias(s, sc->pen);
		if (pen)
			apply_penalties(s, sc);
		row = sc->pen;
	}
	if (p->temperature <= 0.0f)
		return gpud_argmax(row, s->n_vocab);
	d.temperature = p->temperature;
	d.top_k = p->top_k;
	d.top_p = p->top_p;
	d.min_p = p->min_p;
	d.rand = rng_next(s->rng);
	d.n_pen = 0;
	return gpud_draw_row(row, s->n_vocab, &d, sc);
}

/* --- stop conditions ---------------------------------------------------- */

void gpud_stop_init(struct gpud_stop *st, uint32_t max_tokens)
{
	memset(st, 0, sizeof(*st));
	st->max_tokens = max_tokens;
	st->matched = -1;
	st->reason = GPUD_STOP_NONE;
}

int gpud_stop_add(struct gpud_stop *st, const char *s, size_t len)
{
	if (!s || len == 0)
		return -EINVAL;
	if (len > GPUD_STOP_MAX_LEN || st->n_strings >= GPUD_STOP_MAX_STRINGS)
		return SW_ETOOLONG;
	memcpy(st->str[st->n_strings], s, len);
	st->len[st->n_strings] = (uint8_t)len;
	st->n_strings++;
	return 0;
}

/* Length of the longest suffix of buf[0..n) that is a proper prefix of
 * some stop string (it may still grow into one). */
static size_t partial_suffix(const struct gpud_stop *st, const char *buf, size_t n)
{
	size_t best = 0;

	for (uint32_t j = 0; j < st->n_strings; j++) {
		size_t l = st->len[j] - 1u;
		if (l > n)
			l = n;
		for (; l > best; l--)
			if (memcmp(buf + n - l, st->str[j], l) == 0) {
				best = l;
				break;
			}
	}
	return best;
}

int gpud_stop_push(struct gpud_stop *st, bool eog, const char *text, size_t len,
		   char *out, size_t cap, size_t *out_len)
{
	size_t n, first = SIZE_MAX, keep;
	int which = -1;

	*out_len = 0;
	if (st->reason != GPUD_STOP_NONE)
		return st->reason;
	if (cap < len + GPUD_STOP_MAX_LEN || (len > 0 && !text))
		return -EINVAL;

	memcpy(out, st->held, st->n_held);
	if (len > 0)
		memcpy(out + st->n_held, text, len);
	n = st->n_held + len;
	st->n_held = 0;
	st->n_tokens++;

	/* earliest stop string occurrence wins */
	for (uint32_t j = 0; j < st->n_strings; j++) {
		size_t l = st->len[j];
		for (size_t at = 0; l <= n && at <= n - l && at < first; at++)
			if (memcmp(out + at, st->str[j], l) == 0) {
				first = at;
				which = (int)j;
				break;
			}
	}
	if (which >= 0) {
		st->matched = which;
		*out_len = first;
		return st->reason = GPUD_STOP_STRING;
	}
	if (eog) {
		*out_len = n;
		return st->reason = GPUD_STOP_EOG;
	}
	if (st->max_tokens && st->n_tokens >= st->max_tokens) {
		*out_len = n;
		return st->reason = GPUD_STOP_MAX_TOKENS;
	}
	keep = partial_suffix(st, out, n);
	memcpy(st->held, out + n - keep, keep);
	st->n_held = (uint32_t)keep;
	*out_len = n - keep;
	return GPUD_STOP_NONE;
}
