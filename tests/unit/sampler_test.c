/* sampler_test.c - sampling transforms, seeding, penalties and stop
 * conditions (gpud/sampler.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/model.h"
#include "gpud/sampler.h"
#include "sw_config.h"
#include "test_rand.h"

static struct gpud_sampler *mk(int32_t n_vocab, const struct gpud_sampler_params *p)
{
	struct gpud_sampler *s = NULL;
	char err[SW_ERR_MAX];
	assert_int_equal(gpud_sampler_create(&s, n_vocab, p, err, sizeof(err)), 0);
	assert_non_null(s);
	return s;
}

static void params(struct gpud_sampler_params *p, float temp, uint64_t seed)
{
	gpud_sampler_params_default(p);
	p->temperature = temp;
	p->seed = seed;
}

static void rand_logits(float *l, int n, unsigned seed)
{
	srand(seed);
	for (int i = 0; i < n; i++)
		l[i] = (float)((double)rand() / RAND_MAX) * 10.0f - 5.0f;
}

static int argmax(const float *l, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

static void test_greedy(void **state)
{
	(void)state;
	struct gpud_sampler_params p;
	float l[1000];
	params(&p, 0.0f, 1);
	struct gpud_sampler *s = mk(1000, &p);

	assert_true(gpud_sampler_greedy(s));
	for (unsigned t = 0; t < 50; t++) {
		rand_logits(l, 1000, t);
		assert_int_equal(gpud_sampler_sample(s, l), argmax(l, 1000));
		assert_int_equal(gpud_argmax(l, 1000), argmax(l, 1000));
	}
	/* -0 equals +0: the lowest id */
	for (int i = 0; i < 1000; i++)
		l[i] = -1.0f;
	l[30] = -0.0f;
	l[20] = 0.0f;
	l[10] = -0.0f;
	assert_int_equal(gpud_argmax(l, 1000), 10);
	assert_int_equal(gpud_sampler_sample(s, l), 10);
	/* ties: the lowest id */
	for (int i = 0; i < 1000; i++)
		l[i] = 1.0f;
	l[17] = 3.0f;
	l[400] = 3.0f;
	assert_int_equal(gpud_sampler_sample(s, l), 17);
	/* NaN and -inf are skipped; all invalid is an error */
	for (int i = 0; i < 1000; i++)
		l[i] = NAN;
	l[999] = -INFINITY;
	assert_int_equal(gpud_sampler_sample(s, l), -EINVAL);
	assert_int_equal(gpud_argmax(l, 1000), -EINVAL);
	l[5] = -1e30f;
	assert_int_equal(gpud_sampler_sample(s, l), 5);
	l[700] = INFINITY;
	assert_int_equal(gpud_argmax(l, 1000), 700);
	/* logits are not modified */
	rand_logits(l, 1000, 99);
	float copy[1000];
	memcpy(copy, l, sizeof(l));
	p.temperature = 1.0f;
	p.top_k = 10;
	p.top_p = 0.5f;
	p.min_p = 0.1f;
	assert_int_equal(gpud_sampler_reset(s, &p, NULL, 0), 0);
	assert_false(gpud_sampler_greedy(s));
	(void)gpud_sampler_sample(s, l);
	assert_memory_equal(copy, l, sizeof(l));
	gpud_sampler_free(s);
}

/* Logit biases: added before everything else, so greedy picks the biased
 * arg max, -100 bans a token from every draw, +100 forces one; a biased
 * sampler is never greedy() nor draw_next(); reset clears the biases;
 * the check names bad entries. */
static void test_logit_bias(void **state)
{
	(void)state;
	struct gpud_sampler_params p;
	struct gpud_draw d;
	float l[1000], b[1000];
	char err[SW_ERR_MAX];
	params(&p, 0.0f, 1);
	struct gpud_sampler *s = mk(1000, &p);

	for (unsigned t = 0; t < 30; t++) {
		rand_logits(l, 1000, t);
		int top = argmax(l, 1000);
		int32_t ids[3] = { top, (int32_t)(t * 31 % 1000), top };
		float bias[3] = { -1.5f, 2.0f, -1.0f }; /* a token named twice gets both */
		memcpy(b, l, sizeof(l));
		b[ids[0]] += bias[0];
		b[ids[1]] += bias[1];
		b[ids[2]] += bias[2];
		assert_int_equal(gpud_sampler_bias_check(ids, bias, 3, 1000, err, sizeof(err)), 0);
		gpud_sampler_set_bias(s, ids, bias, 3);
		assert_false(gpud_sampler_greedy(s));
		assert_false(gpud_sampler_draw_next(s, &d));
		float keep[1000];
		memcpy(keep, l, sizeof(l));
		assert_int_equal(gpud_sampler_sample(s, l), argmax(b, 1000));
		assert_memory_equal(keep, l, sizeof(l)); /* the caller's row is untouched */
	}
	assert_int_equal(gpud_sampler_reset(s, &p, err, sizeof(err)), 0);
	assert_true(gpud_sampler_greedy(s));

	/* drawn at temperature 1: a banned token never comes, a forced one
	 * always does */
	params(&p, 1.0f, 7);
	assert_int_equal(gpud_sampler_reset(s, &p, err, sizeof(err)), 0);
	for (int i = 0; i < 1000; i++)
		l[i] = 0.0f;
	l[5] = 3.0f;
	int32_t ban = 5;
	float minus = -100.0f;
	gpud_sampler_set_bias(s, &ban, &minus, 1);
	for (int t = 0; t < 2000; t++) {
		int32_t id = gpud_sampler_sample(s, l);
		assert_true(id >= 0 && id < 1000 && id != 5);
	}
	int32_t force = 999;
	float plus = 100.0f;
	gpud_sampler_set_bias(s, &force, &plus, 1);
	for (int t = 0; t < 200; t++)
		assert_int_equal(gpud_sampler_sample(s, l), 999);

	/* the check: ids in the vocabulary, finite biases in [-100, 100] */
	int32_t bad_id[2] = { 3, 1000 };
	float ok[2] = { 1.0f, 1.0f }, bad_b[1] = { 100.5f }, nan_b[1] = { NAN };
	assert_int_equal(gpud_sampler_bias_check(bad_id, ok, 2, 1000, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "logit_bias: token id 1000 is not in the vocabulary of 1000");
	bad_id[1] = -1;
	assert_int_equal(gpud_sampler_bias_check(bad_id, ok, 2, 1000, err, sizeof(err)), -EINVAL);
	assert_int_equal(gpud_sampler_bias_check(bad_id, bad_b, 1, 1000, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "token 3: bias 100.5"));
	assert_int_equal(gpud_sampler_bias_check(bad_id, nan_b, 1, 1000, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(gpud_sampler_bias_check(bad_id, ok, GPUD_SAMPLER_MAX_BIAS + 1, 1000, err,
						 sizeof(err)), -EINVAL);
	gpud_sampler_free(s);
}

static void test_top_k1_is_greedy(void **state)
{
	(void)state;
	struct gpud_sampler_params p;
	float l[512];
	params(&p, 1.3f, 42);
	p.top_k = 1;
	struct gpud_sampler *s = mk(512, &p);
	for (unsigned t = 0; t < 200; t++) {
		rand_logits(l, 512, 1000 + t);
		assert_int_equal(gpud_sampler_sample(s, l), argmax(l, 512));
	}
	gpud_sampler_free(s);
}

/* Frequencies of temperature sampling follow softmax(l / T). */
static void test_temperature_frequencies(void **state)
{
	(void)state;
	const int n = 8, draws = 60000;
	const float T = 0.7f;
	float l[8] = { 1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -3.0f, 0.2f };
	double p[8], sum = 0;
	int cnt[8] = { 0 };
	struct gpud_sampler_params prm;
	params(&prm, T, 123);
	struct gpud_sampler *s = mk(n, &prm);

	for (int i = 0; i < n; i++)
		sum += p[i] = exp(l[i] / T);
	for (int i = 0; i < draws; i++) {
		int32_t id = gpud_sampler_sample(s, l);
		assert_true(id >= 0 && id < n);
		cnt[id]++;
	}
	for (int i = 0; i < n; i++) {
		double want = p[i] / sum, got = (double)cnt[i] / draws;
		double sigma = sqrt(want * (1 - want) / draws);
		/* 5 sigma: a correct sampler fails this about once in 10^6 runs */
		assert_true(fabs(got - want) < 5 * sigma + 1e-4);
	}
	/* a higher temperature flattens: the top token is drawn less often */
	int top_hot = 0;
	prm.temperature = 3.0f;
	assert_int_equal(gpud_sampler_reset(s, &prm, NULL, 0), 0);
	for (int i = 0; i < 20000; i++)
		top_hot += gpud_sampler_sample(s, l) == 2;
	assert_true((double)top_hot / 20000 < (double)cnt[2] / draws - 0.1);
	gpud_sampler_free(s);
}

static void test_top_k(void **state)
{
	(void)state;
	float l[100];
	int seen[100] = { 0 };
	struct gpud_sampler_params p;
	params(&p, 5.0f, 9); /* hot: everything would show up without top-k */
	p.top_k = 3;
	struct gpud_sampler *s = mk(100, &p);
	for (int i = 0; i < 100; i++)
		l[i] = (float)((i * 37) % 100) / 10.0f; /* a permutation of 0..9.9 */
	/* the three best: values 9.9, 9.8, 9.7 */
	for (int t = 0; t < 3000; t++)
		seen[gpud_sampler_sample(s, l)]++;
	int n_seen = 0;
	for (int i = 0; i < 100; i++) {
		if (seen[i]) {
			n_seen++;
			assert_true(l[i] >= 9.65f);
		}
	}
	assert_int_equal(n_seen, 3);
	gpud_sampler_free(s);
}

static const float *g_sort_logits;
static int by_logit_desc(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	float lx = g_sort_logits[x], ly = g_sort_logits[y];
	if (lx != ly)
		return lx > ly ? -1 : 1;
	return x < y ? -1 : 1;
}

/* Draws from a top_p sampler over n random logits in [-amp, amp] and
 * checks every draw against the brute-force nucleus, whose size must lie
 * in (min_nuc, max_nuc]. */
static void check_nucleus(int n, float amp, float top_p, int min_nuc, int max_nuc)
{
	float *l = malloc(sizeof(float) * n);
	int32_t *order = malloc(sizeof(int32_t) * n);
	bool *in = calloc(n, sizeof(bool));
	double sum = 0, acc = 0;
	int n_nuc = 0;
	struct gpud_sampler_params p;

	srand((unsigned)n);
	for (int i = 0; i < n; i++) {
		l[i] = ((float)((double)rand() / RAND_MAX) * 2.0f - 1.0f) * amp;
		sum += exp(l[i]);
		order[i] = i;
	}
	g_sort_logits = l;
	qsort(order, n, sizeof(*order), by_logit_desc);
	for (int i = 0; i < n; i++) {
		in[order[i]] = true;
		n_nuc++;
		acc += exp(l[order[i]]);
		if (acc >= (double)top_p * sum)
			break;
	}
	print_message("nucleus of %d: %d tokens\n", n, n_nuc);
	assert_true(n_nuc > min_nuc && n_nuc <= max_nuc);
	params(&p, 1.0f, 3);
	p.top_p = top_p;
	struct gpud_sampler *s = mk(n, &p);
	for (int t = 0; t < 100; t++)
		assert_true(in[gpud_sampler_sample(s, l)]);
	gpud_sampler_free(s);
	free(l);
	free(order);
	free(in);
}

static void test_top_p(void **state)
{
	(void)state;
	/* probabilities 0.5, 0.3, 0.15, 0.05 (at T = 1) */
	float l[4] = { logf(0.15f), logf(0.5f), logf(0.05f), logf(0.3f) };
	int seen[4] = { 0 };
	struct gpud_sampler_params p;
	params(&p, 1.0f, 5);
	p.top_p = 0.75f; /* 0.5 + 0.3 >= 0.75: keeps ids 1 and 3 */
	struct gpud_sampler *s = mk(4, &p);
	for (int t = 0; t < 5000; t++)
		seen[gpud_sampler_sample(s, l)]++;
	assert_int_equal(seen[0], 0);
	assert_int_equal(seen[2], 0);
	assert_true(seen[1] > 0 && seen[3] > 0);
	/* renormalized: 0.5/0.8 = 0.625 */
	assert_true(fabs(seen[1] / 5000.0 - 0.625) < 0.05);
	/* top_p smaller than the best token's mass: greedy */
	p.top_p = 0.1f;
	assert_int_equal(gpud_sampler_reset(s, &p, NULL, 0), 0);
	for (int t = 0; t < 100; t++)
		assert_int_equal(gpud_sampler_sample(s, l), 1);
	gpud_sampler_free(s);

	/* large vocabularies: a peaked distribution (nucleus within the
	 * sorted head of 64) and broad ones (the bucketed cut: hundreds to
	 * tens of thousands of tokens); every token drawn lies in the nucleus
	 * computed by brute force */
	check_nucleus(5000, 60.0f, 0.5f, 1, 64);
	check_nucleus(5000, 7.0f, 0.9f, 64, 1024);
	check_nucleus(30000, 1.0f, 0.9f, 1024, 30000);
	check_nucleus(30000, 1.0f, 0.3f, 1024, 30000);
}

static void test_min_p(void **state)
{
	(void)state;
	/* relative to the best (p = 0.4): min_p 0.3 drops p < 0.12 */
	float l[5] = { logf(0.4f), logf(0.1f), logf(0.2f), logf(0.13f), logf(0.17f) };
	int seen[5] = { 0 };
	struct gpud_sampler_params p;
	params(&p, 1.0f, 77);
	p.min_p = 0.3f;
	struct gpud_sampler *s = mk(5, &p);
	for (int t = 0; t < 5000; t++)
		seen[gpud_sampler_sample(s, l)]++;
	assert_int_equal(seen[1], 0);
	for (int i = 0; i < 5; i++)
		if (i != 1)
			assert_true(seen[i] > 0);
	gpud_sampler_free(s);
}

static void test_seed(void **state)
{
	(void)state;
	float l[300];
	int32_t a[100], b[100], c[100];
	struct gpud_sampler_params p;
	params(&p, 1.0f, 2024);
	p.top_k = 50;
	p.top_p = 0.95f;
	struct gpud_sampler *s1 = mk(300, &p), *s2 = mk(300, &p);
	for (int t = 0; t < 100; t++) {
		rand_logits(l, 300, 5000 + t);
		a[t] = gpud_sampler_sample(s1, l);
		b[t] = gpud_sampler_sample(s2, l);
	}
	assert_memory_equal(a, b, sizeof(a));
	/* reset with the same seed replays; another seed differs */
	assert_int_equal(gpud_sampler_reset(s1, &p, NULL, 0), 0);
	for (int t = 0; t < 100; t++) {
		rand_logits(l, 300, 5000 + t);
		c[t] = gpud_sampler_sample(s1, l);
	}
	assert_memory_equal(a, c, sizeof(a));
	p.seed = 2025;
	assert_int_equal(gpud_sampler_reset(s1, &p, NULL, 0), 0);
	int diff = 0;
	for (int t = 0; t < 100; t++) {
		rand_logits(l, 300, 5000 + t);
		diff += gpud_sampler_sample(s1, l) != a[t];
	}
	assert_true(diff > 10);
	/* raw PRNG: reproducible from the seed */
	assert_int_equal(gpud_sampler_reset(s1, &p, NULL, 0), 0);
	assert_int_equal(gpud_sampler_reset(s2, &p, NULL, 0), 0);
	uint64_t x = gpud_sampler_next_u64(s1);
	assert_true(x == gpud_sampler_next_u64(s2));
	assert_true(x != gpud_sampler_next_u64(s1));
	gpud_sampler_free(s1);
	gpud_sampler_free(s2);
}

static void test_penalties(void **state)
{
	(void)state;
	float l[4] = { 2.0f, 1.9f, -1.0f, 0.0f };
	struct gpud_sampler_params p;
	params(&p, 0.0f, 0);
	p.penalty_last_n = 2;
	p.repeat_penalty = 1.1f; /* 2.0 / 1.1 < 1.9 */
	struct gpud_sampler *s = mk(4, &p);
	/* greedy while no penalty is in effect: the plain arg max */
	assert_true(gpud_sampler_greedy(s));
	assert_int_equal(gpud_sampler_sample(s, l), 0);
	gpud_sampler_accept(s, 0);
	assert_false(gpud_sampler_greedy(s));
	assert_int_equal(gpud_sampler_sample(s, l), 1);
	/* token 0 leaves the 2-token window */
	gpud_sampler_accept(s, 3);
	gpud_sampler_accept(s, 3);
	assert_int_equal(gpud_sampler_sample(s, l), 0);
	/* frequency penalty counts occurrences */
	p.repeat_penalty = 1.0f;
	p.frequency_penalty = 0.06f;
	p.penalty_last_n = 8;
	assert_int_equal(gpud_sampler_reset(s, &p, NULL, 0), 0);
	gpud_sampler_accept(s, 0);
	assert_int_equal(gpud_sampler_sample(s, l), 0); /* 2.0 - 0.06 > 1.9 */
	gpud_sampler_accept(s, 0);
	assert_int_equal(gpud_sampler_sample(s, l), 1); /* 2.0 - 0.12 < 1.9 */
	/* presence penalty applies once */
	p.frequency_penalty = 0.0f;
	p.presence_penalty = 0.05f;
	assert_int_equal(gpud_sampler_reset(s, &p, NULL, 0), 0);
	for (int i = 0; i < 5; i++)
		gpud_sampler_accept(s, 0);
	assert_int_equal(gpud_sampler_sample(s, l), 0);
	/* negative logits are multiplied by the repeat penalty */
	float neg[2] = { -1.0f, -1.05f };
	p.presence_penalty = 0.0f;
	p.repeat_penalty = 1.1f;
	gpud_sampler_free(s);
	s = mk(2, &p);
	gpud_sampler_accept(s, 0);
	gpud_sampler_accept(s, 99); /* out of range: ignored */
	gpud_sampler_accept(s, -1);
	assert_int_equal(gpud_sampler_sample(s, neg), 1);
	gpud_sampler_free(s);
}

/* Light samplers drawing in a shared scratch (as the scheduler's threads
 * do) give the tokens samplers with scratch of their own give: two
 * sequences interleaved through one scratch, with a temperature, filters
 * and penalties whose window counts are recomputed every draw. */
static void test_shared_scratch(void **state)
{
	(void)state;
	enum { V = 3000 };
	static float l[V];
	struct gpud_sampler_params p[2];
	struct gpud_sampler *own[2], *light[2];
	struct gpud_sampler_scratch *sc, *other;
	char err[SW_ERR_MAX];
	int differ = 0;

	params(&p[0], 0.9f, 11);
	p[0].top_p = 0.8f;
	p[0].penalty_last_n = 32;
	p[0].repeat_penalty = 1.3f;
	p[0].frequency_penalty = 0.2f;
	params(&p[1], 1.2f, 12);
	p[1].top_k = 50;
	p[1].min_p = 0.02f;
	p[1].penalty_last_n = 8;
	p[1].presence_penalty = 0.5f;
	assert_int_equal(gpud_sampler_scratch_create(&sc, V, err, sizeof(err)), 0);
	for (int k = 0; k < 2; k++) {
		own[k] = mk(V, &p[k]);
		assert_int_equal(gpud_sampler_create_light(&light[k], V, &p[k], err, sizeof(err)), 0);
	}
	for (unsigned t = 0; t < 300; t++) {
		for (int k = 0; k < 2; k++) {
			int32_t a, b;

			rand_logits(l, V, t * 2 + (unsigned)k);
			for (int i = 0; i < V; i += 7) /* few distinct values: repeats */
				l[i] = 4.0f;
			a = gpud_sampler_sample(own[k], l);
			b = gpud_sampler_sample_with(light[k], sc, l);
			assert_int_equal(a, b);
			assert_true(a >= 0);
			differ += a != argmax(l, V);
			gpud_sampler_accept(own[k], a);
			gpud_sampler_accept(light[k], b);
		}
	}
	assert_true(differ > 0); /* they sampled */
	/* a light sampler needs a scratch unless greedy, of its vocabulary */
	assert_int_equal(gpud_sampler_sample(light[0], l), -EINVAL);
	assert_int_equal(gpud_sampler_scratch_create(&other, V + 1, err, sizeof(err)), 0);
	assert_int_equal(gpud_sampler_sample_with(light[0], other, l), -EINVAL);
	params(&p[0], 0.0f, 0);
	assert_int_equal(gpud_sampler_reset(light[0], &p[0], err, sizeof(err)), 0);
	assert_int_equal(gpud_sampler_sample(light[0], l), argmax(l, V));
	assert_true(gpud_sampler_bytes() < 32 * 1024);
	assert_true(gpud_sampler_scratch_bytes(V) >= (size_t)V * 24);
	gpud_sampler_scratch_free(other);
	gpud_sampler_scratch_free(sc);
	for (int k = 0; k < 2; k++) {
		gpud_sampler_free(own[k]);
		gpud_sampler_free(light[k]);
	}
}

static void test_params_errors(void **state)
{
	(void)state;
	struct gpud_sampler_params p;
	struct gpud_sampler *s = (void *)1;
	char err[SW_ERR_MAX];

	params(&p, 1.0f, 0);
	assert_int_equal(gpud_sampler_create(&s, 0, &p, err, sizeof(err)), -EINVAL);
	assert_null(s);
	p.temperature = NAN;
	assert_int_equal(gpud_sampler_create(&s, 10, &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "temperature"));
	params(&p, 1.0f, 0);
	p.top_p = 0.0f;
	assert_int_equal(gpud_sampler_params_check(&p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "top_p"));
	params(&p, 1.0f, 0);
	p.min_p = 1.5f;
	assert_int_equal(gpud_sampler_params_check(&p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "min_p"));
	params(&p, 1.0f, 0);
	p.penalty_last_n = GPUD_SAMPLER_MAX_PENALTY_LAST_N + 1;
	assert_int_equal(gpud_sampler_params_check(&p, err, sizeof(err)), -EINVAL);
	params(&p, 1.0f, 0);
	p.repeat_penalty = 0.0f;
	assert_int_equal(gpud_sampler_params_check(&p, err, sizeof(err)), -EINVAL);
	params(&p, 1.0f, 0);
	p.top_p = 2.0f; /* >= 1 is "off" */
	assert_int_equal(gpud_sampler_params_check(&p, err, sizeof(err)), 0);
	/* a failed reset changes nothing */
	params(&p, 0.0f, 0);
	s = mk(3, &p);
	float l[3] = { 0, 5, 1 };
	p.min_p = -1;
	assert_int_equal(gpud_sampler_reset(s, &p, err, sizeof(err)), -EINVAL);
	assert_int_equal(gpud_sampler_sample(s, l), 1);
	gpud_sampler_free(s);
	gpud_sampler_free(NULL);
}

/* Pushes tokens and collects the released text. */
static int push_all(struct gpud_stop *st, const char *const *toks, int n, char *text,
		    size_t *text_len, int *at)
{
	char out[256];
	size_t ol;
	*text_len = 0;
	for (int i = 0; i < n; i++) {
		int r = gpud_stop_push(st, false, toks[i], strlen(toks[i]), out, sizeof(out), &ol);
		assert_true(r >= 0);
		memcpy(text + *text_len, out, ol);
		*text_len += ol;
		if (r != GPUD_STOP_NONE) {
			*at = i;
			return r;
		}
	}
	*at = n;
	return GPUD_STOP_NONE;
}

static void test_stop_strings(void **state)
{
	(void)state;
	struct gpud_stop st;
	char text[256];
	size_t tl;
	int at;

	/* "\n\nUser:" split over four tokens; the text before it is kept,
	 * the partial prefix is never released early */
	const char *t1[] = { "Hello", " wor", "ld\n", "\nUs", "er:", " more" };
	gpud_stop_init(&st, 0);
	assert_int_equal(gpud_stop_add(&st, "\n\nUser:", 7), 0);
	assert_int_equal(push_all(&st, t1, 6, text, &tl, &at), GPUD_STOP_STRING);
	assert_int_equal(at, 4);
	assert_int_equal(tl, 11);
	assert_memory_equal(text, "Hello world", 11);
	assert_int_equal(st.matched, 0);
	/* after the stop, pushes keep returning it */
	char out[128];
	size_t ol = 99;
	assert_int_equal(gpud_stop_push(&st, false, "x", 1, out, sizeof(out), &ol),
			 GPUD_STOP_STRING);
	assert_int_equal(ol, 0);

	/* held text that turns out not to be a stop string is released */
	const char *t2[] = { "a\n", "\nUse", "d it", "!" };
	gpud_stop_init(&st, 0);
	assert_int_equal(gpud_stop_add(&st, "\n\nUser:", 7), 0);
	char out2[128];
	assert_int_equal(gpud_stop_push(&st, false, t2[0], 2, out2, sizeof(out2), &ol), 0);
	assert_int_equal(ol, 1); /* "\n" held */
	assert_int_equal(gpud_stop_push(&st, false, t2[1], 4, out2, sizeof(out2), &ol), 0);
	assert_int_equal(ol, 0); /* "\n\nUse" held */
	assert_int_equal(gpud_stop_push(&st, false, t2[2], 4, out2, sizeof(out2), &ol), 0);
	assert_int_equal(ol, 9);
	assert_memory_equal(out2, "\n\nUsed it", 9);

	/* the earliest of several stop strings wins, inside one token */
	const char *t3[] = { "xx", "yENDzSTOP" };
	gpud_stop_init(&st, 0);
	assert_int_equal(gpud_stop_add(&st, "STOP", 4), 0);
	assert_int_equal(gpud_stop_add(&st, "END", 3), 0);
	assert_int_equal(push_all(&st, t3, 2, text, &tl, &at), GPUD_STOP_STRING);
	assert_int_equal(tl, 3);
	assert_memory_equal(text, "xxy", 3);
	assert_int_equal(st.matched, 1);

	/* EOG releases held text; the EOG token adds none */
	gpud_stop_init(&st, 0);
	assert_int_equal(gpud_stop_add(&st, "###", 3), 0);
	assert_int_equal(gpud_stop_push(&st, false, "ok#", 3, out, sizeof(out), &ol), 0);
	assert_int_equal(ol, 2);
	assert_int_equal(gpud_stop_push(&st, true, NULL, 0, out, sizeof(out), &ol), GPUD_STOP_EOG);
	assert_int_equal(ol, 1);
	assert_int_equal(out[0], '#');

	/* max tokens */
	gpud_stop_init(&st, 3);
	const char *t4[] = { "a", "b", "c", "d" };
	assert_int_equal(push_all(&st, t4, 4, text, &tl, &at), GPUD_STOP_MAX_TOKENS);
	assert_int_equal(at, 2);
	assert_int_equal(tl, 3);
	assert_int_equal(st.n_tokens, 3);

	/* argument errors */
	gpud_stop_init(&st, 0);
	assert_int_equal(gpud_stop_add(&st, "", 0), -EINVAL);
	char longs[GPUD_STOP_MAX_LEN + 1];
	memset(longs, 'a', sizeof(longs));
	assert_int_equal(gpud_stop_add(&st, longs, sizeof(longs)), SW_ETOOLONG);
	assert_int_equal(gpud_stop_add(&st, longs, GPUD_STOP_MAX_LEN), 0);
	for (int i = 1; i < GPUD_STOP_MAX_STRINGS; i++)
		assert_int_equal(gpud_stop_add(&st, "z", 1), 0);
	assert_int_equal(gpud_stop_add(&st, "z", 1), SW_ETOOLONG);
	assert_int_equal(st.n_strings, GPUD_STOP_MAX_STRINGS);
	assert_int_equal(gpud_stop_push(&st, false, "abc", 3, out, 3 + GPUD_STOP_MAX_LEN - 1, &ol),
			 -EINVAL);
	assert_int_equal(st.n_tokens, 0);
	/* the 64-byte stop string, spread over 64 one-byte tokens */
	int r = 0;
	for (int i = 0; i < GPUD_STOP_MAX_LEN && r == 0; i++)
		r = gpud_stop_push(&st, false, "a", 1, out, sizeof(out), &ol);
	assert_int_equal(r, GPUD_STOP_STRING);
	assert_int_equal(st.n_tokens, GPUD_STOP_MAX_LEN);
}

/* --- through the engine's generation loop (stories260K) ---------------- */

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"
#define GREEDY ", there was a little girl named Lily. She loved to play outside in the park."

struct text {
	char buf[2048];
	size_t n;
};

static int collect(void *arg, const char *s, size_t len)
{
	struct text *t = arg;
	assert_true(t->n + len < sizeof(t->buf));
	memcpy(t->buf + t->n, s, len);
	t->n += len;
	t->buf[t->n] = 0;
	return 0;
}

static void generate(struct gpud_engine *e, const struct gpud_gen_params *gp, struct text *t,
		     struct gpud_gen_result *res)
{
	char err[SW_ERR_MAX];
	const char *prompt = "Once upon a time";
	t->n = 0;
	t->buf[0] = 0;
	if (gpud_engine_generate(e, prompt, strlen(prompt), gp, collect, t, res, err, sizeof(err)))
		fail_msg("generate: %s", err);
}

static void test_generate_seed_and_stop(void **state)
{
	(void)state;
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	struct gpud_engine_params ep;
	struct gpud_gen_params gp;
	struct gpud_gen_result res;
	struct text *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
	char err[SW_ERR_MAX];

	if (gpud_model_load(&m, STORIES, err, sizeof(err)))
		fail_msg("%s", err);
	gpud_engine_params_default(&ep);
	ep.n_threads = 2;
	ep.max_seqs = 2;
	ep.n_ctx = 256;
	assert_int_equal(gpud_engine_create(&e, m, &ep, err, sizeof(err)), 0);

	/* top-k 1 at a high temperature is the greedy text */
	gpud_gen_params_default(&gp);
	gp.max_tokens = 40;
	gp.sampling.temperature = 1.5f;
	gp.sampling.top_k = 1;
	gp.sampling.seed = 99;
	generate(e, &gp, a, &res);
	assert_memory_equal(a->buf, GREEDY, strlen(GREEDY));

	/* same seed, same text; another seed, another text */
	gp.sampling.top_k = 0;
	gp.sampling.temperature = 1.0f;
	gp.sampling.top_p = 0.95f;
	gp.sampling.seed = 7;
	generate(e, &gp, a, &res);
	assert_int_equal(res.n_gen, 40);
	assert_int_equal(res.reason, GPUD_STOP_MAX_TOKENS);
	generate(e, &gp, b, &res);
	assert_string_equal(a->buf, b->buf);
	gp.sampling.seed = 8;
	generate(e, &gp, b, &res);
	assert_true(strcmp(a->buf, b->buf) != 0);

	/* a stop string spanning tokens: the text stops right before it */
	const char *stop[] = { "named Lily" };
	gpud_gen_params_default(&gp);
	gp.max_tokens = 60;
	gp.stop = stop;
	gp.n_stop = 1;
	generate(e, &gp, a, &res);
	assert_int_equal(res.reason, GPUD_STOP_STRING);
	assert_string_equal(a->buf, ", there was a little girl ");
	struct gpud_engine_stats st;
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 0);

	gpud_engine_destroy(e);
	gpud_model_free(m);
	free(a);
	free(b);
}

/* --- the draw (gpud/draw.h) against a plain implementation of its text ---- */

struct rcand {
	uint64_t key, mass;
};

static int rcand_desc(const void *a, const void *b)
{
	const struct rcand *x = a, *y = b;

	return x->key < y->key ? 1 : x->key > y->key ? -1 : 0;
}

/* draw.h's definition, step by step: penalize, sort, cut, filter, walk. */
static int32_t ref_draw(const float *l0, int n, const struct gpud_draw *d)
{
	struct rcand *c = calloc((size_t)n, sizeof(*c));
	float *l = malloc((size_t)n * sizeof(*l));
	float mx = -INFINITY, inv_t = 1.0f / d->temperature;
	int m = 0, i;
	uint64_t sum = 0, acc = 0, r;
	int32_t id = -EINVAL;

	assert_non_null(c);
	assert_non_null(l);
	memcpy(l, l0, (size_t)n * sizeof(*l));
	for (uint32_t j = 0; j < d->n_pen; j++)
		l[d->pen_id[j]] = gpud_draw_penalize(l[d->pen_id[j]], d->pen_n[j], d->repeat_penalty,
						     d->frequency_penalty, d->presence_penalty);
	if (!(d->temperature > 0.0f)) {
		id = gpud_argmax(l, n);
		goto out;
	}
	for (i = 0; i < n; i++)
		if (gpud_draw_key(l[i], (uint32_t)i) && l[i] > mx)
			mx = l[i];
	for (i = 0; i < n; i++) {
		uint64_t k = gpud_draw_key(l[i], (uint32_t)i);
		if (!k)
			continue;
		c[m].key = k;
		c[m].mass = mx == INFINITY ? (l[i] == INFINITY ? GPUD_DRAW_ONE : 0) :
					     gpud_draw_mass(l[i], mx, inv_t);
		m++;
	}
	if (!m)
		goto out;
	qsort(c, (size_t)m, sizeof(*c), rcand_desc);
	if (d->top_k > 0 && d->top_k < m)
		m = d->top_k;
	for (i = 0; i < m; i++)
		sum += c[i].mass;
	if (d->top_p < 1.0f) {
		double t = ceil((double)d->top_p * (double)sum);
		uint64_t tu = t < 1.0 ? 1 : t >= (double)sum ? sum : (uint64_t)t;

		for (i = 0, acc = 0; i < m; i++) {
			acc += c[i].mass;
			if (acc >= tu) {
				m = i + 1;
				break;
			}
		}
	}
	if (d->min_p > 0.0f)
		for (i = 0; i < m; i++)
			if ((double)c[i].mass < (double)d->min_p * (double)GPUD_DRAW_ONE)
				c[i].mass = 0;
	for (i = 0, sum = 0; i < m; i++)
		sum += c[i].mass;
	r = (uint64_t)(((unsigned __int128)d->rand * sum) >> 64);
	for (i = 0, acc = 0; i < m; i++) {
		acc += c[i].mass;
		if (r < acc) {
			id = (int32_t)(0xffffffffu - (uint32_t)c[i].key);
			break;
		}
	}
out:
	free(c);
	free(l);
	return id;
}

/* A row of one of several shapes: spread logits, a few levels (many
 * ties, -0 and +0), a peaked row, and specials (NaN, -inf, +inf). */
static void draw_row(float *l, int n, int shape)
{
	for (int i = 0; i < n; i++) {
		float v = rndf();
		switch (shape) {
		case 0: v *= 12.0f; break;
		case 1: v = (float)((int)(rnd() % 5) - 2) * 0.5f; if (v == 0 && (rnd() & 1)) v = -0.0f; break;
		case 2: v = v * 3.0f - (i % 97 ? 20.0f : 0.0f); break;
		default:
			v *= 8.0f;
			switch (rnd() % 16) {
			case 0: v = NAN; break;
			case 1: v = -INFINITY; break;
			case 2: if (shape == 4) v = INFINITY; break;
			}
		}
		l[i] = v;
	}
}

static void test_draw_vs_definition(void **state)
{
	(void)state;
	static const float temps[] = { 0.05f, 0.3f, 0.8f, 1.0f, 1.7f, 6.0f };
	static const float tps[] = { 1.0f, 0.95f, 0.5f, 1e-6f, 0.9999f };
	static const float mps[] = { 0.0f, 0.05f, 0.5f, 1.0f };
	static const int ns[] = { 1, 2, 7, 256, 5000, 32000 };
	struct gpud_sampler_scratch *sc = NULL;
	float *l = malloc(32000 * sizeof(float));
	char err[SW_ERR_MAX];
	int checked = 0, invalid = 0;

	assert_non_null(l);
	assert_int_equal(gpud_sampler_scratch_create(&sc, 32000, err, sizeof(err)), 0);
	rng_state = 0x5eed;
	for (int t = 0; t < 1500; t++) {
		int n = ns[rnd() % 6], shape = (int)(rnd() % 5);
		struct gpud_draw d = { 0 };
		int32_t want, got;

		if (n == 32000 && t % 4)
			n = 256; /* the big rows are slow in the reference */
		draw_row(l, n, shape);
		d.temperature = temps[rnd() % 6];
		d.top_k = rnd() % 4 == 0 ? 0 : rnd() % 3 == 0 ? n + 2 : (int32_t)(rnd() % 50);
		d.top_p = tps[rnd() % 5];
		d.min_p = mps[rnd() % 4];
		d.rand = (uint64_t)rnd() << 40 ^ (uint64_t)rnd() << 20 ^ rnd();
		if (t % 50 == 0)
			d.rand = t % 100 ? UINT64_MAX : 0; /* the ends of the span */
		if (rnd() % 3 == 0) { /* penalties; now and then greedy */
			d.n_pen = rnd() % (GPUD_DRAW_MAX_PEN + 1);
			d.n_pen = d.n_pen < (uint32_t)n ? d.n_pen : (uint32_t)n;
			for (uint32_t j = 0, off = rnd(); j < d.n_pen; j++) {
				d.pen_id[j] = (int32_t)((j * 7919u + off) % (uint32_t)n); /* distinct */
				d.pen_n[j] = 1 + rnd() % 4;
			}
			d.repeat_penalty = 1.0f + (float)(rnd() % 5) * 0.1f;
			d.frequency_penalty = (float)(rnd() % 3) * 0.2f;
			d.presence_penalty = (float)(rnd() % 3) * 0.3f;
			if (rnd() % 4 == 0)
				d.temperature = 0.0f;
		}
		want = ref_draw(l, n, &d);
		got = gpud_draw_row(l, n, &d, sc);
		if (want != got)
			print_error("t %d n %d shape %d T %g k %d p %g min_p %g: want %d got %d\n", t,
				    n, shape, (double)d.temperature, d.top_k, (double)d.top_p,
				    (double)d.min_p, want, got);
		assert_int_equal(got, want);
		invalid += got < 0;
		checked++;
	}
	assert_int_equal(checked, 1500);
	assert_true(invalid < 50); /* only the rare row with nothing usable */

	/* temperature 0: the arg max; bad arguments */
	struct gpud_draw d = { .temperature = 0.0f, .top_p = 1.0f };
	assert_int_equal(gpud_draw_row(l, 10, &d, sc), gpud_argmax(l, 10));
	d.temperature = NAN;
	assert_int_equal(gpud_draw_row(l, 10, &d, sc), -EINVAL);
	d.temperature = 1.0f;
	d.n_pen = GPUD_DRAW_MAX_PEN + 1;
	assert_int_equal(gpud_draw_row(l, 10, &d, sc), -EINVAL);
	d.n_pen = 0;
	assert_int_equal(gpud_draw_row(l, 40000, &d, sc), -EINVAL); /* scratch too small */
	assert_int_equal(gpud_draw_row(NULL, 10, &d, sc), -EINVAL);
	for (int i = 0; i < 10; i++)
		l[i] = i % 2 ? NAN : -INFINITY;
	assert_int_equal(gpud_draw_row(l, 10, &d, sc), -EINVAL);
	gpud_sampler_scratch_free(sc);
	free(l);
}

/* E is e^x within a few ulp, E(0) = 1, and nothing below X_MIN weighs. */
static void test_draw_mass(void **state)
{
	(void)state;
	double worst = 0;
	uint64_t prev = GPUD_DRAW_ONE;
	int nonmono = 0;

	assert_int_equal(gpud_draw_mass(3.5f, 3.5f, 1.0f), GPUD_DRAW_ONE);
	assert_int_equal(gpud_draw_mass(-0.0f, 0.0f, 1.0f), GPUD_DRAW_ONE);
	assert_int_equal(gpud_draw_mass(-28.0f, 0.0f, 1.0f), 0);
	assert_int_equal(gpud_draw_mass(-1.0f, 0.0f, 28.01f), 0); /* T 0.0357: x = -28.01 */
	assert_int_equal(gpud_draw_mass(-3e38f, 3e38f, 1.0f), 0);  /* -inf difference */
	for (float x = -1e-7f; x >= GPUD_DRAW_X_MIN; x = nextafterf(x, -INFINITY) - 1e-5f) {
		uint64_t m = gpud_draw_mass(x, 0.0f, 1.0f);
		double want = exp((double)x) * (double)GPUD_DRAW_ONE;

		if (want >= 1048576.0) { /* the floor's 1 is 2^-20 of it, or less */
			double e = (fabs((double)m - want) - 1.0) / want;
			worst = e > worst ? e : worst;
		}
		nonmono += m > prev;
		prev = m;
	}
	print_message("mass vs exp: worst relative error %.3g, %d increases\n", worst, nonmono);
	assert_true(worst < 3e-7); /* a few float ulp */
	assert_int_equal(nonmono, 0);
}

/* A device-style draw (draw_next, the row drawn elsewhere, draw_done)
 * gives sample()'s tokens and leaves the same PRNG state. */
/* Log probabilities against a double-precision log softmax, and the
 * alternatives against a plain selection in gpud_argmax's order. */
static void test_logprobs(void **state)
{
	(void)state;
	enum { V = 5000 };
	static float row[V];
	struct gpud_logprobs lp;

	double worst = 0;

	rng_state = 77;
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < V; i++)
			row[i] = 12.0f * rndf();
		row[17] = row[4000]; /* a tie: 17 comes first */
		if (round == 1) {
			row[3] = -INFINITY, row[9] = NAN;
			/* a NaN opening a later block, the row's greatest in its lane */
			row[3200] = NAN, row[3208] = 100.0f;
		}
		if (round == 2)
			for (int i = 0; i < V; i++)
				row[i] += 1000.0f; /* large logits: the max is subtracted */
		double m = -INFINITY, sum = 0;
		for (int i = 0; i < V; i++)
			if (!isnan(row[i]) && row[i] > m)
				m = row[i];
		for (int i = 0; i < V; i++)
			if (!isnan(row[i]))
				sum += exp((double)row[i] - m);
		double lse = m + log(sum);
		uint32_t n_top = round == 3 ? 0 : 20;
		for (int32_t id = 0; id < V; id += 97) {
			assert_int_equal(gpud_logprobs_row(row, V, id, n_top, &lp), 0);
			double want = isnan(row[id]) ? -INFINITY : row[id] - lse;
			if (isinf(want))
				assert_true(isinf(lp.logprob) && lp.logprob < 0);
			else if (fabs(lp.logprob - want) > worst)
				worst = fabs(lp.logprob - want);
		}
		assert_int_equal(lp.n_top, n_top);
		/* the n_top greatest, greater first, lower index on ties */
		bool used[V] = { false };
		for (uint32_t j = 0; j < n_top; j++) {
			int32_t best = -1;
			for (int32_t i = 0; i < V; i++)
				if (!used[i] && !isnan(row[i]) && (best < 0 || row[i] > row[best]))
					best = i;
			used[best] = true;
			assert_int_equal(lp.top_id[j], best);
			if (fabs(lp.top_lp[j] - (row[best] - lse)) > worst)
				worst = fabs(lp.top_lp[j] - (row[best] - lse));
			assert_true(lp.top_lp[j] <= 0);
			if (j)
				assert_true(lp.top_lp[j] <= lp.top_lp[j - 1]);
		}
	}
	/* float logits, a float result: within a few ulp of the numbers
	 * involved (logits up to ~1040 in round 2) */
	printf("logprobs vs a double log softmax: worst absolute error %.3g\n", worst);
	assert_true(worst < 2e-5);
	/* the tie's order where it matters: two equal greatest */
	float two[4] = { 1, 5, 5, 2 };
	assert_int_equal(gpud_logprobs_row(two, 4, 2, 3, &lp), 0);
	assert_int_equal(lp.top_id[0], 1);
	assert_int_equal(lp.top_id[1], 2);
	assert_int_equal(lp.top_id[2], 3);
	assert_true(fabsf(lp.logprob - lp.top_lp[0]) == 0);
	/* fewer numbers than alternatives asked for */
	float few[3] = { NAN, 0, NAN };
	assert_int_equal(gpud_logprobs_row(few, 3, 1, 5, &lp), 0);
	assert_int_equal(lp.n_top, 1);
	assert_true(lp.logprob == 0 && lp.top_lp[0] == 0);
	assert_int_equal(gpud_logprobs_row(few, 3, 0, 5, &lp), 0);
	assert_true(isinf(lp.logprob));
	/* +inf logits share the mass */
	float inf[3] = { INFINITY, 1, INFINITY };
	assert_int_equal(gpud_logprobs_row(inf, 3, 2, 2, &lp), 0);
	assert_true(fabsf(lp.logprob - logf(0.5f)) < 1e-6f);
	assert_int_equal(lp.top_id[0], 0);
	assert_int_equal(lp.top_id[1], 2);
	assert_int_equal(gpud_logprobs_row(inf, 3, 1, 0, &lp), 0);
	assert_true(isinf(lp.logprob));
	/* bad arguments */
	assert_int_equal(gpud_logprobs_row(row, V, V, 0, &lp), -EINVAL);
	assert_int_equal(gpud_logprobs_row(row, V, -1, 0, &lp), -EINVAL);
	assert_int_equal(gpud_logprobs_row(row, V, 0, 21, &lp), -EINVAL);
	assert_int_equal(gpud_logprobs_row(NULL, V, 0, 1, &lp), -EINVAL);
}

static void test_draw_next(void **state)
{
	(void)state;
	struct gpud_sampler_params p;
	struct gpud_sampler *a, *b;
	struct gpud_sampler_scratch *sc = NULL;
	char err[SW_ERR_MAX];
	float l[3000];
	struct gpud_draw d;

	params(&p, 0.9f, 77);
	p.top_k = 50;
	p.top_p = 0.9f;
	a = mk(3000, &p);
	b = mk(3000, &p);
	assert_int_equal(gpud_sampler_scratch_create(&sc, 3000, err, sizeof(err)), 0);
	for (int t = 0; t < 200; t++) {
		rand_logits(l, 3000, (unsigned)t);
		assert_true(gpud_sampler_draw_next(b, &d));
		assert_true(gpud_sampler_draw_next(b, &d)); /* changes nothing */
		int32_t want = gpud_sampler_sample(a, l), got = gpud_draw_row(l, 3000, &d, sc);
		assert_int_equal(got, want);
		gpud_sampler_draw_done(b);
	}
	assert_true(gpud_sampler_next_u64(a) == gpud_sampler_next_u64(b));
	/* a plain arg max is not a draw */
	params(&p, 0.0f, 1);
	assert_int_equal(gpud_sampler_reset(b, &p, err, sizeof(err)), 0);
	assert_false(gpud_sampler_draw_next(b, &d));

	/* penalties, with a temperature and greedy: the window's distinct
	 * tokens go with the draw, and the tokens are sample()'s */
	for (int greedy = 0; greedy < 2; greedy++) {
		params(&p, greedy ? 0.0f : 0.7f, 5);
		p.penalty_last_n = 48;
		p.repeat_penalty = 1.3f;
		p.frequency_penalty = 0.4f;
		p.presence_penalty = 0.25f;
		assert_int_equal(gpud_sampler_reset(a, &p, err, sizeof(err)), 0);
		assert_int_equal(gpud_sampler_reset(b, &p, err, sizeof(err)), 0);
		assert_int_equal(gpud_sampler_draw_next(b, &d), !greedy); /* no history yet */
		for (int t = 0; t < 120; t++) {
			rand_logits(l, 3000, (unsigned)(1000 + t));
			for (int k = 0; k < 3000; k += 50) /* a few tokens the history favours */
				l[k] += 3.0f;
			bool drawn = gpud_sampler_draw_next(b, &d);
			int32_t want = gpud_sampler_sample(a, l), got;

			if (drawn) {
				assert_true(d.n_pen >= (t ? 1u : 0u) && d.n_pen <= (uint32_t)t);
				got = gpud_draw_row(l, 3000, &d, sc);
				gpud_sampler_draw_done(b);
			} else { /* greedy with no history yet: the plain arg max */
				assert_true(greedy && t == 0);
				got = gpud_argmax(l, 3000);
			}
			assert_int_equal(got, want);
			gpud_sampler_accept(a, want);
			gpud_sampler_accept(b, want);
		}
		assert_true(gpud_sampler_next_u64(a) == gpud_sampler_next_u64(b));
	}
	/* a window of more distinct tokens than a draw carries: the host */
	params(&p, 0.7f, 1);
	p.penalty_last_n = GPUD_DRAW_MAX_PEN + 1;
	p.repeat_penalty = 1.1f;
	assert_int_equal(gpud_sampler_reset(b, &p, err, sizeof(err)), 0);
	for (int t = 0; t <= GPUD_DRAW_MAX_PEN; t++) {
		assert_true(gpud_sampler_draw_next(b, &d));
		gpud_sampler_accept(b, t);
	}
	assert_false(gpud_sampler_draw_next(b, &d));
	gpud_sampler_free(a);
	gpud_sampler_free(b);
	gpud_sampler_scratch_free(sc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_logit_bias),
		cmocka_unit_test(test_top_k1_is_greedy),
		cmocka_unit_test(test_temperature_frequencies),
		cmocka_unit_test(test_top_k),
		cmocka_unit_test(test_top_p),
		cmocka_unit_test(test_min_p),
		cmocka_unit_test(test_seed),
		cmocka_unit_test(test_penalties),
		cmocka_unit_test(test_shared_scratch),
		cmocka_unit_test(test_params_errors),
		cmocka_unit_test(test_draw_vs_definition),
		cmocka_unit_test(test_draw_mass),
		cmocka_unit_test(test_draw_next),
		cmocka_unit_test(test_logprobs),
		cmocka_unit_test(test_stop_strings),
		cmocka_unit_test(test_generate_seed_and_stop),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
