/* batch_test.c - K sequences decoded together in one ragged batch produce
 * exactly (bit for bit) what K separate runs produce, for every weight
 * type.
 *
 * Why bitwise is expected: gpud_matmul is batch-invariant (each output
 * element is one sequential fp32 sum over the exact unpacked weights,
 * computed by one thread, whatever the batch size; quantized types do not
 * quantize activations), attention runs per (token, head) over the token's
 * own sequence only, and elementwise ops do not mix rows. A difference
 * means sequences leak into each other or the batch changes arithmetic.
 * (An earlier kernel quantized activations only in steps of < 4 rows;
 * the bound parameter of check_model stays for such a kernel: 0 means
 * bitwise, > 0 a relative bound per logits row.) Inputs are teacher
 * forced: the batched run feeds the tokens the separate run chose.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"
#define K 6
#define DECODE 8
#define MAXP 40

struct run {
	int32_t prompt[K][MAXP];
	uint32_t n_prompt[K];
	int32_t gen[K][DECODE];  /* greedy tokens */
	float *logits[K];        /* (DECODE + 1, n_vocab): last prompt token, then each decode */
};

static uint64_t rs = 5;
static uint32_t rnd(uint32_t n)
{
	rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(rs >> 33) % n;
}

static int32_t argmax(const float *l, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return (int32_t)b;
}

static struct gpud_engine *mk_engine(const struct gpud_model *m, int threads)
{
	struct gpud_engine_params ep;
	struct gpud_engine *e = NULL;
	char err[SW_ERR_MAX];
	gpud_engine_params_default(&ep);
	ep.n_threads = threads;
	ep.max_batch_tokens = 256;
	ep.max_seqs = K;
	ep.max_logits = K;
	ep.block_tokens = 16;
	ep.n_ctx = 128;
	if (gpud_engine_create(&e, m, &ep, err, sizeof(err)))
		fail_msg("engine: %s", err);
	return e;
}

static void step(struct gpud_engine *e, const struct gpud_batch_entry *ents, uint32_t n)
{
	char err[SW_ERR_MAX];
	if (gpud_engine_step(e, ents, n, err, sizeof(err)))
		fail_msg("step: %s", err);
}

/* Each sequence alone: prefill in one step, then greedy decode. */
static void run_separate(struct gpud_engine *e, struct run *r, uint32_t nv)
{
	for (uint32_t k = 0; k < K; k++) {
		uint32_t seq;
		assert_int_equal(gpud_engine_seq_add(e, NULL, &seq), 0);
		struct gpud_batch_entry b = { seq, r->prompt[k], r->n_prompt[k], GPUD_LOGITS_LAST };
		step(e, &b, 1);
		for (uint32_t t = 0; t <= DECODE; t++) {
			const float *l = gpud_engine_logits(e, 0);
			memcpy(r->logits[k] + (size_t)t * nv, l, nv * sizeof(float));
			if (t == DECODE)
				break;
			r->gen[k][t] = argmax(l, nv);
			b = (struct gpud_batch_entry){ seq, &r->gen[k][t], 1, GPUD_LOGITS_LAST };
			step(e, &b, 1);
		}
		assert_int_equal(gpud_engine_seq_free(e, seq), 0);
	}
}

/* All sequences in every step: one ragged prefill step, then K decode
 * tokens per step. stagger: sequence k starts k steps late, so prefill
 * chunks and decode tokens share steps. */
static void run_together(struct gpud_engine *e, struct run *r, uint32_t nv, bool stagger)
{
	uint32_t seq[K], t_of[K] = { 0 };
	struct gpud_batch_entry ents[K];
	uint32_t who[K];

	for (uint32_t k = 0; k < K; k++)
		assert_int_equal(gpud_engine_seq_add(e, NULL, &seq[k]), 0);
	for (uint32_t s = 0;; s++) {
		uint32_t n = 0;
		for (uint32_t k = 0; k < K; k++) {
			uint32_t start = stagger ? k : 0;
			if (s < start || t_of[k] > DECODE)
				continue;
			if (s == start)
				ents[n] = (struct gpud_batch_entry){ seq[k], r->prompt[k], r->n_prompt[k],
								     GPUD_LOGITS_LAST };
			else
				ents[n] = (struct gpud_batch_entry){ seq[k], &r->gen[k][t_of[k] - 1], 1,
								     GPUD_LOGITS_LAST };
			who[n++] = k;
		}
		if (n == 0)
			break;
		step(e, ents, n);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t k = who[i];
			const float *l = gpud_engine_logits(e, i);
			memcpy(r->logits[k] + (size_t)t_of[k] * nv, l, nv * sizeof(float));
			t_of[k]++; /* inputs are the separate run's tokens (teacher forcing) */
		}
	}
	for (uint32_t k = 0; k < K; k++)
		assert_int_equal(gpud_engine_seq_free(e, seq[k]), 0);
}

/* Worst per-row max-abs difference over max-abs of a. */
static double rel_diff(const float *a, const float *b, uint32_t rows, uint32_t nv)
{
	double worst = 0;
	for (uint32_t t = 0; t < rows; t++) {
		double md = 0, mr = 0;
		for (uint32_t v = 0; v < nv; v++) {
			md = fmax(md, fabs(a[(size_t)t * nv + v] - b[(size_t)t * nv + v]));
			mr = fmax(mr, fabs(a[(size_t)t * nv + v]));
		}
		worst = fmax(worst, md / mr);
	}
	return worst;
}

/* bound 0: bitwise equality required. */
static void check_model(const char *path, int threads, double bound)
{
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX];
	struct run *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));

	if (gpud_model_load(&m, path, err, sizeof(err)))
		fail_msg("%s: %s", path, err);
	struct gpud_engine *e = mk_engine(m, threads);
	uint32_t nv = gpud_engine_n_vocab(e);
	for (uint32_t k = 0; k < K; k++) {
		a->n_prompt[k] = 1 + rnd(MAXP);
		a->prompt[k][0] = 1;
		for (uint32_t i = 1; i < a->n_prompt[k]; i++)
			a->prompt[k][i] = (int32_t)rnd(nv);
		a->logits[k] = malloc((size_t)(DECODE + 1) * nv * sizeof(float));
	}
	run_separate(e, a, nv);
	for (int stagger = 0; stagger < 2; stagger++) {
		memcpy(b->prompt, a->prompt, sizeof(a->prompt));
		memcpy(b->n_prompt, a->n_prompt, sizeof(a->n_prompt));
		memcpy(b->gen, a->gen, sizeof(a->gen));
		for (uint32_t k = 0; k < K; k++)
			b->logits[k] = malloc((size_t)(DECODE + 1) * nv * sizeof(float));
		run_together(e, b, nv, stagger);
		double worst = 0;
		uint32_t same_argmax = 0;
		for (uint32_t k = 0; k < K; k++) {
			bool equal = !memcmp(a->logits[k], b->logits[k],
					     (size_t)(DECODE + 1) * nv * sizeof(float));
			double r = rel_diff(a->logits[k], b->logits[k], DECODE + 1, nv);
			if (bound == 0 && !equal)
				fail_msg("%s: sequence %u differs batched vs alone (relative %.3g)", path,
					 k, r);
			worst = fmax(worst, r);
			for (uint32_t t = 0; t <= DECODE; t++)
				same_argmax += argmax(a->logits[k] + (size_t)t * nv, nv) ==
					       argmax(b->logits[k] + (size_t)t * nv, nv);
			free(b->logits[k]);
		}
		if (bound > 0) {
			print_message("%s (stagger %d): batched vs alone worst relative %.3g, same "
				      "argmax %u/%u rows\n", path, stagger, worst, same_argmax,
				      K * (DECODE + 1));
			assert_true(worst < bound);
		} else {
			assert_int_equal(same_argmax, K * (DECODE + 1));
		}
	}
	struct gpud_engine_stats st;
	gpud_engine_stats(e, &st);
	assert_int_equal(st.allocs_after_warmup, 0);
	assert_int_equal(st.kv.used, 0);
	for (uint32_t k = 0; k < K; k++)
		free(a->logits[k]);
	free(a);
	free(b);
	gpud_engine_destroy(e);
	gpud_model_free(m);
}

static void test_batch_stories(void **state)
{
	(void)state;
	check_model(STORIES, 2, 0);
}

static void test_batch_stories_1thread(void **state)
{
	(void)state;
	check_model(STORIES, 1, 0);
}

/* One temp dir for the generated models; the group teardown removes it
 * even after a failed test. */
static char g_dir[] = "/tmp/swarm-batch-XXXXXX";
static char g_path[96];

static int teardown_dir(void **state)
{
	(void)state;
	if (g_path[0]) {
		unlink(g_path);
		rmdir(g_dir);
	}
	return 0;
}

static void check_generated_arch(enum gpud_arch arch, enum gpud_type type, double bound)
{
	char *path = g_path, err[SW_ERR_MAX];
	struct gpud_mkmodel_params mp;

	if (!g_path[0]) {
		assert_non_null(mkdtemp(g_dir));
		snprintf(g_path, sizeof(g_path), "%s/m.gguf", g_dir);
	}
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	mp.dim = 64;
	mp.n_layers = 2;
	mp.n_heads = 4;
	mp.n_kv_heads = 2;
	mp.ffn_dim = 128;
	mp.n_ctx = 256;
	mp.type = type;
	mp.arch = arch;
	mp.seed = 3;
	if (gpud_mkmodel(&mp, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	check_model(path, 2, bound);
	unlink(path);
}

static void check_generated(enum gpud_type type, double bound)
{
	check_generated_arch(GPUD_ARCH_LLAMA, type, bound);
}

/* Qwen2: the biases and NEOX RoPE are per token, so batching stays exact. */
static void test_batch_qwen2_q8_0(void **state)
{
	(void)state;
	check_generated_arch(GPUD_ARCH_QWEN2, GPUD_TYPE_Q8_0, 0);
}

static void test_batch_qwen2_f32(void **state)
{
	(void)state;
	check_generated_arch(GPUD_ARCH_QWEN2, GPUD_TYPE_F32, 0);
}

static void test_batch_q8_0(void **state)
{
	(void)state;
	check_generated(GPUD_TYPE_Q8_0, 0);
}

static void test_batch_f16(void **state)
{
	(void)state;
	check_generated(GPUD_TYPE_F16, 0);
}

static void test_batch_q4_0(void **state)
{
	(void)state;
	check_generated(GPUD_TYPE_Q4_0, 0);
}

static void test_batch_bf16(void **state)
{
	(void)state;
	check_generated(GPUD_TYPE_BF16, 0);
}

static void test_batch_f32(void **state)
{
	(void)state;
	check_generated(GPUD_TYPE_F32, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_stories),
		cmocka_unit_test(test_batch_stories_1thread),
		cmocka_unit_test(test_batch_q8_0),
		cmocka_unit_test(test_batch_f16),
		cmocka_unit_test(test_batch_f32),
		cmocka_unit_test(test_batch_bf16),
		cmocka_unit_test(test_batch_q4_0),
		cmocka_unit_test(test_batch_qwen2_q8_0),
		cmocka_unit_test(test_batch_qwen2_f32),
	};
	return cmocka_run_group_tests(tests, NULL, teardown_dir);
}
