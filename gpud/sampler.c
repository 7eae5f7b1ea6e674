/* sampler.c - greedy / temperature / top-k / top-p / min-p sampling with
 * an own xoshiro256** generator, and the stop-condition helper.
 *
 * Every array is sized for n_vocab at creation; a call to sample touches
 * only those. Selection and sorting are hand-written (quickselect for
 * top-k, bucketing plus heapsort of one bucket for top-p) because libc
 * qsort may allocate.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/sampler.h"

struct cand {
	float logit;
	int32_t id;
	float p; /* exp((logit - max) / T) once computed: in (0, 1] */
};

#define TOPP_BUCKETS 256
#define TOPP_BUCKET_NATS 0.0625 /* bucket width in -log(p) */

/* What one draw works in, n_vocab-sized: nothing in it outlives a call. */
struct gpud_sampler_scratch {
	int32_t n_vocab;
	struct cand *cand;  /* (n_vocab) */
	uint32_t *count;    /* (n_vocab) occurrences in the window being
			     * penalized; all 0 between calls */
	uint16_t *bucket;   /* (n_vocab) top-p bucket of each candidate */
	double bmass[TOPP_BUCKETS];
};

/* A sequence's state: what persists from one token to the next. */
struct gpud_sampler {
	struct gpud_sampler_params p;
	int32_t n_vocab;
	uint64_t rng[4];
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

static double rng_uniform(uint64_t s[4])
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53; /* [0, 1) */
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
		sc->count = calloc((size_t)n_vocab, sizeof(*sc->count));
		sc->bucket = calloc((size_t)n_vocab, sizeof(*sc->bucket));
	}
	if (!sc || !sc->cand || !sc->count || !sc->bucket) {
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
	free(sc->count);
	free(sc->bucket);
	free(sc);
}

size_t gpud_sampler_scratch_bytes(int32_t n_vocab)
{
	return sizeof(struct gpud_sampler_scratch) +
	       (size_t)(n_vocab > 0 ? n_vocab : 0) *
		       (sizeof(struct cand) + sizeof(uint32_t) + sizeof(uint16_t));
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

/* --- selection helpers -------------------------------------------------- */

/* Total order: higher logit first, then lower id. */
static inline bool better(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static inline void swap_cand(struct cand *a, struct cand *b)
{
	struct cand t = *a;
	*a = *b;
	*b = t;
}

/* Rearranges c[0..n) so that c[0..k) are the k best (in any order). */
static void select_top(struct cand *c, size_t n, size_t k)
{
	size_t lo = 0, hi = n; /* the boundary k lies in [lo, hi) */

	if (k == 0 || k >= n)
		return;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2, store = lo, i;

		/* median of three as pivot, moved to hi - 1 */
		if (better(&c[mid], &c[lo]))
			swap_cand(&c[mid], &c[lo]);
		if (better(&c[hi - 1], &c[lo]))
			swap_cand(&c[hi - 1], &c[lo]);
		if (better(&c[mid], &c[hi - 1]))
			swap_cand(&c[mid], &c[hi - 1]);
		for (i = lo; i < hi - 1; i++)
			if (better(&c[i], &c[hi - 1]))
				swap_cand(&c[i], &c[store++]);
		swap_cand(&c[store], &c[hi - 1]);
		/* c[lo..store) beat the pivot, c[store] is the pivot */
		if (store == k || store + 1 == k)
			return;
		if (store > k)
			hi = store;
		else
			lo = store + 1;
	}
}

static void sift_down(struct cand *c, size_t root, size_t n)
{
	for (;;) {
		size_t child = 2 * root + 1;
		if (child >= n)
			return;
		/* min-heap on "better": the worst element is at the root */
		if (child + 1 < n && better(&c[child], &c[child + 1]))
			child++;
		if (!better(&c[root], &c[child]))
			return;
		swap_cand(&c[root], &c[child]);
		root = child;
	}
}

/* Sorts c[0..n) best first. */
static void sort_best_first(struct cand *c, size_t n)
{
	size_t i;

	if (n < 2)
		return;
	for (i = n / 2; i-- > 0;)
		sift_down(c, i, n);
	for (i = n - 1; i > 0; i--) {
		swap_cand(&c[0], &c[i]); /* the worst goes to the end */
		sift_down(c, 0, i);
	}
}

/* --- sampling -------------------------------------------------------- */

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
 * window (counted here, O(window), and zeroed again as it is applied);
 * cand[] is still indexed by id. */
static void apply_penalties(struct gpud_sampler *s, struct gpud_sampler_scratch *sc)
{
	const struct gpud_sampler_params *p = &s->p;
	uint32_t i;

	for (i = 0; i < s->hist_n; i++)
		sc->count[hist_at(s, i)]++;
	for (i = 0; i < s->hist_n; i++) {
		int32_t id = hist_at(s, i);
		float *l = &sc->cand[id].logit;

		if (!sc->count[id]) /* done already */
			continue;
		if (*l > 0)
			*l /= p->repeat_penalty;
		else
			*l *= p->repeat_penalty;
		*l -= p->frequency_penalty * (float)sc->count[id] + p->presence_penalty;
		sc->count[id] = 0;
	}
}

static inline bool usable(float l)
{
	return !isnan(l) && l != -INFINITY;
}

int32_t gpud_argmax(const float *l, int32_t n)
{
	/* Two passes that a core streams through: the greatest value (eight
	 * independent maxima; NaN never compares greater, and -inf never beats
	 * the -inf start), then the first index holding it (-0 == +0). */
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
	if (best == -INFINITY) /* nothing usable (or n <= 0) */
		return -EINVAL;
	for (i = 0; l[i] != best; i++)
		;
	return i;
}

/* The nucleus in O(n) whatever its size: candidates are bucketed by
 * -log(p); whole buckets are taken from the top while the mass stays
 * below the target, and only the bucket where the target is reached is
 * sorted to find the exact cut. Returns the nucleus size (its members
 * first in c[], best first from the boundary bucket on) and its mass. */
static size_t top_p_buckets(struct gpud_sampler_scratch *s, size_t n, float maxl, double inv_t,
			    double target, double *mass)
{
	struct cand *c = s->cand;
	size_t i, k = 0, m;
	unsigned b, edge;
	double acc = 0;

	memset(s->bmass, 0, sizeof(s->bmass));
	for (i = 0; i < n; i++) {
		/* -log(p) = (max - logit) / T */
		double nl = ((double)maxl - c[i].logit) * inv_t / TOPP_BUCKET_NATS;
		b = nl < TOPP_BUCKETS - 1 ? (unsigned)nl : TOPP_BUCKETS - 1;
		s->bucket[i] = (uint16_t)b;
		s->bmass[b] += c[i].p;
	}
	for (edge = 0; edge < TOPP_BUCKETS - 1; edge++) {
		if (acc + s->bmass[edge] >= target)
			break;
		acc += s->bmass[edge];
	}
	/* move buckets < edge to the front, then the edge bucket */
	for (i = 0; i < n; i++)
		if (s->bucket[i] < edge) {
			swap_cand(&c[i], &c[k]);
			uint16_t t = s->bucket[i];
			s->bucket[i] = s->bucket[k];
			s->bucket[k++] = t;
		}
	m = k;
	for (i = k; i < n; i++)
		if (s->bucket[i] == edge) {
			swap_cand(&c[i], &c[m]);
			uint16_t t = s->bucket[i];
			s->bucket[i] = s->bucket[m];
			s->bucket[m++] = t;
		}
	sort_best_first(c + k, m - k);
	for (i = k; i < m; i++) {
		acc += c[i].p;
		if (acc >= target) {
			i++;
			break;
		}
	}
	*mass = acc;
	return i;
}

bool gpud_sampler_greedy(const struct gpud_sampler *s)
{
	return s->p.temperature <= 0.0f && !penalties_on(s);
}

int32_t gpud_sampler_sample(struct gpud_sampler *s, const float *logits)
{
	return gpud_sampler_sample_with(s, NULL, logits);
}

int32_t gpud_sampler_sample_with(struct gpud_sampler *s, struct gpud_sampler_scratch *sc,
				 const float *logits)
{
	const struct gpud_sampler_params *p = &s->p;
	struct cand *c;
	size_t n = 0, i, k, nv = (size_t)s->n_vocab;
	bool pen = penalties_on(s), all_usable = true;
	float maxl = -INFINITY, inv_t;
	double sum, u, acc;

	if (p->temperature <= 0.0f && !pen)
		return gpud_argmax(logits, s->n_vocab);
	if (!sc)
		sc = s->own;
	if (!sc || sc->n_vocab != s->n_vocab)
		return -EINVAL;
	c = sc->cand;

	for (i = 0; i < nv; i++) {
		c[i].logit = logits[i];
		c[i].id = (int32_t)i;
		all_usable &= usable(logits[i]);
	}
	if (pen)
		apply_penalties(s, sc);
	if (all_usable) {
		n = nv;
	} else {
		for (i = 0; i < nv; i++)
			if (usable(c[i].logit))
				c[n++] = c[i];
	}
	if (n == 0)
		return -EINVAL;

	if (p->temperature <= 0.0f) {
		size_t best = 0;
		for (i = 1; i < n; i++)
			if (c[i].logit > c[best].logit)
				best = i;
		return c[best].id;
	}

	if (p->top_k > 0 && (size_t)p->top_k < n) {
		select_top(c, n, (size_t)p->top_k);
		n = (size_t)p->top_k;
	}

	for (i = 0; i < n; i++)
		if (c[i].logit > maxl)
			maxl = c[i].logit;
	if (isinf(maxl)) {
		/* +inf logits share all the mass */
		k = 0;
		for (i = 0; i < n; i++)
			if (c[i].logit == INFINITY)
				c[k++] = c[i];
		n = k;
		for (i = 0; i < n; i++)
			c[i].p = 1.0f;
	} else {
		/* temperature applied here: p = exp((l - max) / T) */
		inv_t = 1.0f / p->temperature;
		for (i = 0; i < n; i++)
			c[i].p = expf((c[i].logit - maxl) * inv_t);
	}
	sum = 0;
	for (i = 0; i < n; i++)
		sum += c[i].p;

	if (p->top_p < 1.0f) {
		n = top_p_buckets(sc, n, maxl, 1.0 / p->temperature, p->top_p * sum, &acc);
		sum = acc;
	}

	if (p->min_p > 0.0f) {
		float pmax = 0.0f, thr;
		for (i = 0; i < n; i++)
			if (c[i].p > pmax)
				pmax = c[i].p;
		thr = p->min_p * pmax;
		k = 0;
		sum = 0;
		for (i = 0; i < n; i++)
			if (c[i].p >= thr) {
				c[k++] = c[i];
				sum += c[i].p;
			}
		n = k;
	}

	u = rng_uniform(s->rng) * sum;
	acc = 0;
	for (i = 0; i < n; i++) {
		acc += c[i].p;
		if (u < acc)
			return c[i].id;
	}
	return c[n - 1].id; /* rounding left u at the very top */
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
