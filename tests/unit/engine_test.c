/* engine_test.c - the engine on the real stories260K model: the greedy
 * text of ../shared/models/README.md (through the API and through the gpud
 * binary), step errors that change nothing, KV exhaustion and the return
 * of blocks, zero allocations after warm-up, batching and chunking
 * consistency, embeddings, tied output embeddings. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/alloc.h"
#include "gpud/backend/cpu/kernels.h"
#include "gpud/engine.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/mask.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"
#define GREEDY                                                                          \
	", there was a little girl named Lily. She loved to play outside in the park. " \
	"One day, she saw a big, red ball. She wanted to play with it, but it was too high."

static const int32_t once[] = { 1, 403, 407, 261, 378 }; /* "Once upon a time" */

static struct gpud_model *model;
static char tmpdir[64];

/* --- helpers --------------------------------------------------------------- */

static struct gpud_engine *mk_engine(uint32_t n_ctx, uint32_t max_batch, uint32_t max_seqs,
				     uint32_t n_blocks, uint32_t max_logits)
{
	struct gpud_engine_params p;
	struct gpud_engine *e = NULL;
	char err[SW_ERR_MAX] = "";

	gpud_engine_params_default(&p);
	p.n_threads = 2;
	p.n_ctx = n_ctx;
	p.max_batch_tokens = max_batch;
	p.max_seqs = max_seqs;
	p.n_blocks = n_blocks;
	p.max_logits = max_logits;
	if (gpud_engine_create(&e, model, &p, err, sizeof(err)))
		fail_msg("engine: %s", err);
	return e;
}

static void step_ok(struct gpud_engine *e, const struct gpud_batch_entry *b, uint32_t n)
{
	char err[SW_ERR_MAX] = "";

	if (gpud_engine_step(e, b, n, err, sizeof(err)))
		fail_msg("step: %s", err);
}

static int32_t argmax(const float *x, uint32_t n)
{
	int32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = (int32_t)i;
	return best;
}

static float max_rel_diff(const float *a, const float *b, uint32_t n)
{
	float d = 0, m = 0;

	for (uint32_t i = 0; i < n; i++) {
		d = fmaxf(d, fabsf(a[i] - b[i]));
		m = fmaxf(m, fabsf(a[i]));
	}
	return d / (m > 0 ? m : 1);
}

struct sink {
	char buf[4096];
	size_t len;
	int stop_after; /* calls; 0 = never */
	int calls;
};

static int sink_emit(void *arg, const char *text, size_t len)
{
	struct sink *s = arg;

	if (s->len + len < sizeof(s->buf)) {
		memcpy(s->buf + s->len, text, len);
		s->len += len;
		s->buf[s->len] = 0;
	}
	return s->stop_after && ++s->calls >= s->stop_after;
}

static void assert_pool_empty(struct gpud_engine *e)
{
	struct gpud_engine_stats st;
	char err[SW_ERR_MAX] = "";

	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);

	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 0);
	assert_int_equal(st.kv.free, st.kv.n_blocks);
	assert_int_equal(st.kv.seqs, 0);
}

/* A sequence started on another one's full blocks (held, as the prefix
 * cache holds them) continues exactly as one that computed them: logits
 * bitwise equal to a sequence prefilled in the same chunks, close to one
 * prefilled at once; errors change nothing; the holds keep blocks alive
 * until released. */
static void test_seq_add_prefix(void **state)
{
	(void)state;
	struct gpud_engine *e = mk_engine(128, 64, 2, 12, 0);
	const uint32_t V = 512;
	static float one_chunk[512], two_chunks[512];
	static _Alignas(16) uint8_t mem[1024];
	struct gpud_mask m8;
	uint32_t lens[1] = { 40 }, a, b, c, nb, blocks[2], bad[1] = { 11 };
	struct gpud_engine_stats st;
	const uint32_t *t;
	int32_t ids[40];
	char err[SW_ERR_MAX] = "";

	for (int i = 0; i < 40; i++)
		ids[i] = 1 + (i * 37) % 400;
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	step_ok(e, &(struct gpud_batch_entry){ a, ids, 40, GPUD_LOGITS_LAST }, 1);
	memcpy(one_chunk, gpud_engine_logits(e, 0), sizeof(one_chunk));
	t = gpud_engine_block_table(e, a, &nb);
	assert_int_equal(nb, 3);
	blocks[0] = t[0];
	blocks[1] = t[1];
	assert_int_equal(gpud_engine_block_hold(e, blocks[0]), 0);
	assert_int_equal(gpud_engine_block_hold(e, blocks[1]), 0);
	assert_int_equal(gpud_kv_block_refs(gpud_engine_kv(e), blocks[0]), 2);
	assert_int_equal(gpud_engine_seq_free(e, a), 0);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 2); /* the held ones */
	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);

	/* errors: nothing claimed */
	assert_int_equal(gpud_mask_compile(&(struct proto_mask_desc){ 0, NULL }, lens, 8, mem,
					   sizeof(mem), &m8), 0);
	assert_int_equal(gpud_engine_seq_add_prefix(e, &m8, blocks, 2, &b), -EINVAL);
	assert_int_equal(gpud_engine_seq_add_prefix(e, NULL, bad, 1, &b), -EINVAL); /* free */
	assert_int_equal(gpud_engine_seq_add_prefix(e, NULL, blocks, 9, &b), SW_ETOOLONG);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.seqs, 0);
	assert_int_equal(st.kv.used, 2);

	/* b starts on the two blocks, c computes them in the same chunks */
	assert_int_equal(gpud_engine_seq_add_prefix(e, NULL, blocks, 2, &b), 0);
	assert_int_equal(gpud_engine_seq_len(e, b), 32);
	assert_int_equal(gpud_engine_blocks_needed(e, b, 8), 1);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &c), 0);
	step_ok(e, &(struct gpud_batch_entry){ c, ids, 32, GPUD_LOGITS_NONE }, 1);
	step_ok(e, &(struct gpud_batch_entry){ c, ids + 32, 8, GPUD_LOGITS_LAST }, 1);
	memcpy(two_chunks, gpud_engine_logits(e, 0), sizeof(two_chunks));
	step_ok(e, &(struct gpud_batch_entry){ b, ids + 32, 8, GPUD_LOGITS_LAST }, 1);
	assert_memory_equal(gpud_engine_logits(e, 0), two_chunks, sizeof(two_chunks));
	assert_true(max_rel_diff(one_chunk, two_chunks, V) < 1e-4);
	assert_int_equal(argmax(one_chunk, V), argmax(two_chunks, V));
	/* a truncate into a shared block is refused; past it is fine */
	assert_int_equal(gpud_engine_seq_truncate(e, b, 20), -EINVAL);
	assert_int_equal(gpud_engine_seq_len(e, b), 40);
	assert_int_equal(gpud_engine_seq_truncate(e, b, 36), 0);
	assert_int_equal(gpud_engine_seq_truncate(e, b, 32), 0);
	assert_int_equal(gpud_engine_seq_truncate(e, b, 16), 0); /* whole blocks dropped */
	/* no slot left */
	assert_int_equal(gpud_engine_seq_add_prefix(e, NULL, blocks, 1, &a), SW_EEXHAUSTED);
	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);
	assert_int_equal(gpud_engine_seq_free(e, b), 0);
	assert_int_equal(gpud_engine_seq_free(e, c), 0);
	assert_int_equal(gpud_engine_block_release(e, blocks[0]), 0);
	assert_int_equal(gpud_engine_block_release(e, blocks[1]), 0);
	assert_int_equal(gpud_engine_block_release(e, blocks[1]), -EINVAL);
	assert_pool_empty(e);
	assert_true(gpud_engine_block_bytes(e) > 0);
	gpud_engine_destroy(e);
}

static int setup(void **state)
{
	char err[SW_ERR_MAX] = "";

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/engine_test.XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	if (gpud_model_load(&model, STORIES, err, sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	gpud_model_free(model);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* --- tests ------------------------------------------------------------------ */

static void test_greedy_text(void **state)
{
	struct gpud_engine *e = mk_engine(0, 512, 2, 0, 0);
	struct gpud_gen_params gp;
	struct gpud_gen_result res;
	struct sink s = { 0 };
	char err[SW_ERR_MAX] = "";

	gpud_gen_params_default(&gp);
	gp.max_tokens = 60;
	if (gpud_engine_generate(e, "Once upon a time", 16, &gp, sink_emit, &s, &res, err,
				 sizeof(err)))
		fail_msg("generate: %s", err);
	if (strncmp(s.buf, GREEDY, strlen(GREEDY)))
		fail_msg("greedy text differs:\n got: %s\nwant: %s", s.buf, GREEDY);
	assert_int_equal(res.n_prompt, 5);
	assert_int_equal(res.n_gen, 60);
	assert_int_equal(res.reason, GPUD_STOP_MAX_TOKENS);
	assert_pool_empty(e);

	/* Prefill in chunks of 2 gives the same text. */
	memset(&s, 0, sizeof(s));
	gp.prefill_chunk = 2;
	gp.max_tokens = 30;
	assert_int_equal(gpud_engine_generate(e, "Once upon a time", 16, &gp, sink_emit, &s, &res,
					      err, sizeof(err)), 0);
	assert_int_equal(strncmp(s.buf, GREEDY, s.len), 0);
	assert_true(s.len > 40);

	/* A stop string ends generation and is not emitted. */
	memset(&s, 0, sizeof(s));
	const char *stop[] = { "Lily" };
	gp.stop = stop;
	gp.n_stop = 1;
	gp.max_tokens = 60;
	assert_int_equal(gpud_engine_generate(e, "Once upon a time", 16, &gp, sink_emit, &s, &res,
					      err, sizeof(err)), 0);
	assert_int_equal(res.reason, GPUD_STOP_STRING);
	assert_string_equal(s.buf, ", there was a little girl named ");

	/* The emit callback can stop it. */
	memset(&s, 0, sizeof(s));
	s.stop_after = 3;
	gp.n_stop = 0;
	assert_int_equal(gpud_engine_generate(e, "Once upon a time", 16, &gp, sink_emit, &s, &res,
					      err, sizeof(err)), 0);
	assert_int_equal(res.reason, GPUD_GEN_STOP_CALLER);
	assert_int_equal(s.calls, 3);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
}

static void test_prompt_too_long(void **state)
{
	struct gpud_engine *e = mk_engine(8, 512, 2, 0, 0);
	struct gpud_gen_params gp;
	struct gpud_gen_result res;
	struct sink s = { 0 };
	char err[SW_ERR_MAX] = "";
	const char *p = "Once upon a time there was a little girl named Lily who liked cats";

	gpud_gen_params_default(&gp);
	assert_int_equal(gpud_engine_generate(e, p, strlen(p), &gp, sink_emit, &s, &res, err,
					      sizeof(err)), SW_ETOOLONG);
	assert_non_null(strstr(err, "context"));
	assert_int_equal(s.len, 0);
	assert_pool_empty(e);

	/* A prompt that fits but leaves no room stops at the context. */
	memset(&s, 0, sizeof(s));
	gp.max_tokens = 100;
	assert_int_equal(gpud_engine_generate(e, "Once upon a time", 16, &gp, sink_emit, &s, &res,
					      err, sizeof(err)), 0);
	assert_int_equal(res.reason, GPUD_GEN_STOP_CONTEXT);
	assert_int_equal(res.n_gen, 8 - 5 + 1);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
}

static void test_step_errors_change_nothing(void **state)
{
	struct gpud_engine *e = mk_engine(64, 8, 2, 0, 4);
	int32_t toks[16] = { 1, 403, 407, 261, 378, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 };
	int32_t bad[1] = { 512 };
	uint32_t a, b, c;
	char err[SW_ERR_MAX];

	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &b), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &c), SW_EEXHAUSTED);
	step_ok(e, &(struct gpud_batch_entry){ a, toks, 5, GPUD_LOGITS_LAST }, 1);
	assert_int_equal(gpud_engine_seq_len(e, a), 5);

	struct {
		struct gpud_batch_entry b[3];
		uint32_t n;
		int rc;
	} cases[] = {
		{ { { a, toks, 9, GPUD_LOGITS_LAST } }, 1, SW_ETOOLONG },   /* > max_batch_tokens */
		{ { { a, toks, 4, 0 }, { b, toks, 5, 0 } }, 2, SW_ETOOLONG }, /* 9 in total */
		{ { { a, toks, 1, 0 }, { b, toks, 1, 0 }, { a, toks, 1, 0 } }, 3, SW_ETOOLONG },
		{ { { a, toks, 1, 0 }, { a, toks, 1, 0 } }, 2, -EINVAL },    /* repeated */
		{ { { a, bad, 1, GPUD_LOGITS_LAST } }, 1, -EINVAL },         /* token id */
		{ { { a, toks, 0, GPUD_LOGITS_LAST } }, 1, -EINVAL },        /* empty */
		{ { { 7, toks, 1, GPUD_LOGITS_LAST } }, 1, -EINVAL },        /* no such seq */
		{ { { a, toks, 5, GPUD_LOGITS_ALL } }, 1, SW_ETOOLONG },    /* 5 rows > 4 */
		{ { { 0 } }, 0, -EINVAL },                                   /* empty batch */
		{ { { a, toks, 1, GPUD_LOGITS_DRAW } }, 1, -EINVAL }, /* the CPU does not draw */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err[0] = 0;
		assert_int_equal(gpud_engine_step(e, cases[i].b, cases[i].n, err, sizeof(err)),
				 cases[i].rc);
		assert_true(err[0] != 0);
		assert_int_equal(gpud_engine_seq_len(e, a), 5);
		assert_int_equal(gpud_engine_seq_len(e, b), 0);
	}
	/* A draw needs a backend that draws, even with its draw given. */
	{
		struct gpud_draw dr = { .temperature = 1.0f, .top_p = 1.0f };
		struct gpud_batch_entry be = { a, toks, 1, GPUD_LOGITS_DRAW };

		assert_false(gpud_engine_device_draw(e));
		err[0] = 0;
		assert_int_equal(gpud_engine_step_draws(e, &be, &dr, 1, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "does not draw"));
		assert_int_equal(gpud_engine_seq_len(e, a), 5);
	}
	/* Past the context: 64 positions. */
	for (int i = 0; i < 7; i++)
		step_ok(e, &(struct gpud_batch_entry){ a, toks + 8, 8, GPUD_LOGITS_NONE }, 1);
	assert_int_equal(gpud_engine_seq_len(e, a), 61);
	assert_int_equal(gpud_engine_step(e, &(struct gpud_batch_entry){ a, toks, 4, 0 }, 1, err,
					  sizeof(err)), SW_ETOOLONG);
	assert_int_equal(gpud_engine_seq_len(e, a), 61);
	step_ok(e, &(struct gpud_batch_entry){ a, toks, 3, GPUD_LOGITS_LAST }, 1);
	assert_int_equal(gpud_engine_seq_len(e, a), 64);
	assert_non_null(gpud_engine_logits(e, 0));
	assert_null(gpud_engine_logits(e, 1));
	assert_int_equal(gpud_engine_seq_free(e, a), 0);
	assert_int_equal(gpud_engine_seq_free(e, a), -EINVAL);
	assert_int_equal(gpud_engine_seq_free(e, b), 0);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
}

static void test_kv_exhaustion(void **state)
{
	/* 4 blocks of 16 positions. */
	struct gpud_engine *e = mk_engine(256, 64, 3, 4, 0);
	int32_t toks[64];
	struct gpud_engine_stats st;
	uint32_t a, b;
	char err[SW_ERR_MAX] = "";

	for (int i = 0; i < 64; i++)
		toks[i] = 3 + i * 7 % 500;
	assert_int_equal(gpud_engine_params(e)->n_blocks, 4);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &b), 0);
	step_ok(e, &(struct gpud_batch_entry){ a, toks, 48, GPUD_LOGITS_LAST }, 1);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 3);
	assert_int_equal(gpud_engine_free_blocks(e), 1);
	assert_int_equal(gpud_engine_blocks_needed(e, a, 0), 0);
	assert_int_equal(gpud_engine_blocks_needed(e, a, 1), 1);
	assert_int_equal(gpud_engine_blocks_needed(e, a, 17), 2);
	assert_int_equal(gpud_engine_blocks_needed(e, b, 32), 2);
	assert_int_equal(gpud_engine_blocks_needed(e, b, 33), 3);
	/* b needs 2 blocks, 1 is free: refused, nothing reserved. */
	assert_int_equal(gpud_engine_step(e, &(struct gpud_batch_entry){ b, toks, 32, 0 }, 1, err,
					  sizeof(err)), SW_EEXHAUSTED);
	assert_non_null(strstr(err, "exhausted"));
	/* A batch where the first entry fits and the second does not rolls
	 * back the first's new block too. */
	struct gpud_batch_entry two[2] = { { a, toks, 1, GPUD_LOGITS_LAST },
					   { b, toks, 17, GPUD_LOGITS_LAST } };
	assert_int_equal(gpud_engine_step(e, two, 2, err, sizeof(err)), SW_EEXHAUSTED);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 3);
	assert_int_equal(st.kv.free, 1);
	assert_int_equal(gpud_engine_seq_len(e, a), 48);
	assert_int_equal(gpud_engine_seq_len(e, b), 0);
	assert_true(st.kv.exhausted >= 2);
	/* Freeing a returns all of its blocks; b now fits. */
	assert_int_equal(gpud_engine_seq_free(e, a), 0);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 0);
	step_ok(e, &(struct gpud_batch_entry){ b, toks, 64, GPUD_LOGITS_LAST }, 1);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 4);
	assert_int_equal(st.kv.high, 4);
	assert_int_equal(gpud_engine_seq_free(e, b), 0);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
}

/* Many steps over a changing ragged batch: no allocation after warm-up. */
static void test_no_alloc_after_warmup(void **state)
{
	struct gpud_engine *e = mk_engine(256, 64, 4, 0, 4);
	struct gpud_engine_stats st;
	uint32_t s[3];
	int32_t next[3], prompt[3][20];
	struct gpud_batch_entry b[3];

	for (int i = 0; i < 3; i++) {
		assert_int_equal(gpud_engine_seq_add(e, NULL, &s[i]), 0);
		for (int j = 0; j < 20; j++)
			prompt[i][j] = 1 + (i * 31 + j * 17) % 500;
	}
	assert_true(gpud_alloc_hook_linked());
	uint64_t allocs = gpud_alloc_host_allocs();
	/* Counting starts before the first step: nothing is set up lazily.
	 * One prefill step of three chunks, then decode. */
	for (int i = 0; i < 3; i++)
		b[i] = (struct gpud_batch_entry){ s[i], prompt[i], 8 + 4 * i, GPUD_LOGITS_LAST };
	step_ok(e, b, 3);
	for (int i = 0; i < 3; i++)
		next[i] = argmax(gpud_engine_logits(e, i), 512);
	for (int it = 0; it < 150; it++) {
		uint32_t n = 0;
		for (int i = 0; i < 3; i++) {
			if ((it + i) % 5 == 0) /* vary the batch shape */
				continue;
			b[n++] = (struct gpud_batch_entry){ s[i], &next[i], 1, GPUD_LOGITS_LAST };
		}
		step_ok(e, b, n);
		for (uint32_t k = 0; k < n; k++)
			next[b[k].seq == s[0] ? 0 : b[k].seq == s[1] ? 1 : 2] =
				argmax(gpud_engine_logits(e, k), 512);
	}
	/* Embeddings of tokens, sequence churn and a refused step too. */
	{
		float v[64];
		char err[SW_ERR_MAX];
		uint32_t extra;
		int32_t bad = -1;
		assert_int_equal(gpud_engine_embed_tokens(e, once, 5, v, err, sizeof(err)), 0);
		assert_int_equal(gpud_engine_seq_add(e, NULL, &extra), 0);
		assert_int_equal(gpud_engine_step(e, &(struct gpud_batch_entry){ extra, &bad, 1, 0 },
						  1, err, sizeof(err)), -EINVAL);
		assert_int_equal(gpud_engine_seq_free(e, extra), 0);
	}
	gpud_engine_stats(e, &st);
	assert_int_equal(st.allocs_after_warmup, 0);
	assert_int_equal(gpud_alloc_host_allocs() - allocs, 0);
	assert_true(st.steps == 152); /* 151 + the embedding's one chunk */
	assert_true(st.scratch_bytes > 0 && st.scratch_high <= st.scratch_bytes);
	assert_true(st.kv_bytes > 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(gpud_engine_seq_free(e, s[i]), 0);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
}

/* GPUD_LOGITS_ARGMAX: the arg max of the row GPUD_LOGITS_LAST gives, and
 * no row; gpud_engine_sample takes it for a greedy sampler and samples the
 * row otherwise. */
static void test_argmax_entries(void **state)
{
	struct gpud_engine *e = mk_engine(128, 64, 3, 0, 16);
	const uint32_t V = 512;
	static float last[2][512];
	struct gpud_sampler_params gp, tp;
	struct gpud_sampler *greedy, *temp;
	int32_t tok[2][6] = { { 1, 5, 9, 12, 40, 77 }, { 3, 8, 21, 2 } };
	uint32_t a, b, a2, b2;
	char err[SW_ERR_MAX];

	(void)state;
	gpud_sampler_params_default(&gp);
	tp = gp;
	tp.temperature = 0.8f;
	tp.seed = 7;
	assert_int_equal(gpud_sampler_create(&greedy, (int32_t)V, &gp, err, sizeof(err)), 0);
	assert_int_equal(gpud_sampler_create(&temp, (int32_t)V, &tp, err, sizeof(err)), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &b), 0);
	struct gpud_batch_entry lst[2] = { { a, tok[0], 6, GPUD_LOGITS_LAST },
					   { b, tok[1], 4, GPUD_LOGITS_LAST } };
	step_ok(e, lst, 2);
	memcpy(last[0], gpud_engine_logits(e, 0), sizeof(last[0]));
	memcpy(last[1], gpud_engine_logits(e, 1), sizeof(last[1]));
	assert_int_equal(gpud_engine_argmax(e, 0), argmax(last[0], V));
	assert_int_equal(gpud_engine_argmax(e, 1), argmax(last[1], V));

	/* the same prompts again, the second wanting its arg max only */
	assert_int_equal(gpud_engine_seq_free(e, a), 0);
	assert_int_equal(gpud_engine_seq_free(e, b), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a2), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &b2), 0);
	struct gpud_batch_entry mix[2] = { { a2, tok[0], 6, GPUD_LOGITS_LAST },
					   { b2, tok[1], 4, GPUD_LOGITS_ARGMAX } };
	step_ok(e, mix, 2);
	assert_non_null(gpud_engine_logits(e, 0));
	assert_null(gpud_engine_logits(e, 1));
	assert_int_equal(gpud_engine_argmax(e, 1), argmax(last[1], V));
	assert_int_equal(gpud_engine_sample(e, 1, greedy, NULL), argmax(last[1], V));
	assert_int_equal(gpud_engine_sample(e, 0, greedy, NULL), argmax(last[0], V));
	/* a temperature sampler on a LAST entry draws from the row */
	{
		struct gpud_sampler *ref;
		assert_int_equal(gpud_sampler_create(&ref, (int32_t)V, &tp, err, sizeof(err)), 0);
		assert_int_equal(gpud_engine_sample(e, 0, temp, NULL), gpud_sampler_sample(ref, last[0]));
		gpud_sampler_free(ref);
	}
	/* entries without logits, or out of range */
	step_ok(e, &(struct gpud_batch_entry){ a2, tok[0], 1, GPUD_LOGITS_NONE }, 1);
	assert_int_equal(gpud_engine_argmax(e, 0), -ENOENT);
	assert_int_equal(gpud_engine_sample(e, 0, greedy, NULL), -ENOENT);
	assert_int_equal(gpud_engine_argmax(e, 1), -ENOENT);
	gpud_sampler_free(greedy);
	gpud_sampler_free(temp);
	gpud_engine_destroy(e);
}

/* The same sequence gives the same logits alone, in a ragged batch, in
 * chunks, and with all-token logits. */
static void test_batch_chunk_consistency(void **state)
{
	struct gpud_engine *e = mk_engine(128, 64, 3, 0, 16);
	const uint32_t V = 512;
	static float alone[512], all_last[512], chunked[512];
	int32_t other[11];
	uint32_t a, b, c;

	for (int i = 0; i < 11; i++)
		other[i] = 10 + i * 13;
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	step_ok(e, &(struct gpud_batch_entry){ a, once, 5, GPUD_LOGITS_LAST }, 1);
	memcpy(alone, gpud_engine_logits(e, 0), sizeof(alone));
	assert_int_equal(gpud_engine_seq_free(e, a), 0);

	/* In a batch behind another sequence, all-token logits. */
	assert_int_equal(gpud_engine_seq_add(e, NULL, &b), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	struct gpud_batch_entry two[2] = { { b, other, 11, GPUD_LOGITS_LAST },
					   { a, once, 5, GPUD_LOGITS_ALL } };
	step_ok(e, two, 2);
	memcpy(all_last, gpud_engine_logits(e, 1) + 4 * V, sizeof(all_last));
	assert_true(max_rel_diff(alone, all_last, V) < 1e-4);
	assert_int_equal(argmax(alone, V), argmax(all_last, V));

	/* Chunked prefill: 2 + 3 tokens. */
	assert_int_equal(gpud_engine_seq_add(e, NULL, &c), 0);
	step_ok(e, &(struct gpud_batch_entry){ c, once, 2, GPUD_LOGITS_NONE }, 1);
	assert_null(gpud_engine_logits(e, 0));
	step_ok(e, &(struct gpud_batch_entry){ c, once + 2, 3, GPUD_LOGITS_LAST }, 1);
	memcpy(chunked, gpud_engine_logits(e, 0), sizeof(chunked));
	assert_true(max_rel_diff(alone, chunked, V) < 1e-4);

	/* Truncate and redo the last token: same logits. */
	assert_int_equal(gpud_engine_seq_truncate(e, c, 4), 0);
	assert_int_equal(gpud_engine_seq_len(e, c), 4);
	step_ok(e, &(struct gpud_batch_entry){ c, once + 4, 1, GPUD_LOGITS_LAST }, 1);
	assert_true(max_rel_diff(alone, gpud_engine_logits(e, 0), V) < 1e-4);
	gpud_engine_destroy(e);
}

/* A mask that hides nothing equals causal; a mask for another block size
 * is refused. */
static void test_mask_plumbing(void **state)
{
	struct gpud_engine *e = mk_engine(128, 64, 2, 0, 0);
	uint16_t r0[] = { 0 }, r1[] = { 0, 1 }, rg[] = { 0, 1, 2 };
	struct proto_mask_row rows[3] = { { r0, 1 }, { r1, 2 }, { rg, 3 } };
	struct proto_mask_desc d = { .n_segments = 2, .rows = rows };
	uint32_t seg_tokens[2] = { 2, 3 }, a, b;
	struct gpud_mask m8, m16;
	static uint8_t mem8[4096] __attribute__((aligned(16)));
	static uint8_t mem16[4096] __attribute__((aligned(16)));
	static float causal[512];

	assert_int_equal(gpud_mask_compile(&d, seg_tokens, 8, mem8, sizeof(mem8), &m8), 0);
	assert_int_equal(gpud_mask_compile(&d, seg_tokens, 16, mem16, sizeof(mem16), &m16), 0);
	assert_int_equal(gpud_engine_seq_add(e, &m8, &a), -EINVAL);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	assert_int_equal(gpud_engine_seq_add(e, &m16, &b), 0);
	step_ok(e, &(struct gpud_batch_entry){ a, once, 5, GPUD_LOGITS_LAST }, 1);
	memcpy(causal, gpud_engine_logits(e, 0), sizeof(causal));
	step_ok(e, &(struct gpud_batch_entry){ b, once, 5, GPUD_LOGITS_LAST }, 1);
	assert_memory_equal(causal, gpud_engine_logits(e, 0), sizeof(causal));
	gpud_engine_destroy(e);
}

static void test_embed(void **state)
{
	struct gpud_engine *e = mk_engine(64, 4, 2, 0, 0);
	float v1[64], v2[64], v3[64];
	double n = 0, dot12 = 0;
	char err[SW_ERR_MAX] = "";
	int32_t many[65];

	assert_int_equal(gpud_engine_dim(e), 64);
	if (gpud_engine_embed(e, "Once upon a time", 16, v1, err, sizeof(err)))
		fail_msg("embed: %s", err);
	assert_int_equal(gpud_engine_embed_tokens(e, once, 5, v2, err, sizeof(err)), 0);
	assert_int_equal(gpud_engine_embed(e, "The cat sat on the mat", 22, v3, err, sizeof(err)), 0);
	for (int i = 0; i < 64; i++) {
		n += (double)v1[i] * v1[i];
		dot12 += (double)v1[i] * v3[i];
		assert_true(isfinite(v1[i]));
	}
	assert_float_equal(n, 1.0, 1e-5);
	assert_true(max_rel_diff(v1, v2, 64) < 1e-5); /* chunks of 4 vs the same */
	assert_true(dot12 < 0.9999);
	for (int i = 0; i < 65; i++)
		many[i] = 5;
	assert_int_equal(gpud_engine_embed_tokens(e, many, 65, v1, err, sizeof(err)), SW_ETOOLONG);
	assert_int_equal(gpud_engine_embed_tokens(e, many, 0, v1, err, sizeof(err)), -EINVAL);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
}

static bool skip_none(const char *key, void *arg)
{
	return false;
}

/* stories260K without output.weight: logits come from token_embd. For a
 * one-token sequence the embedding is h/|h| of the final-normed hidden
 * state, so logits[v] / (embedding . token_embd[v]) is the same for all v. */
static void test_tied_embeddings(void **state)
{
	struct gpud_gguf *src = NULL;
	struct gpud_gguf_writer *w = NULL;
	struct gpud_model *tied = NULL;
	struct gpud_engine *e = NULL;
	struct gpud_engine_params p;
	char path[128], err[SW_ERR_MAX] = "";
	float emb[64], row[64], ratio = 0;
	const float *lg;
	uint32_t s;

	snprintf(path, sizeof(path), "%s/tied.gguf", tmpdir);
	assert_int_equal(gpud_gguf_open(&src, STORIES, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_copy_kv(w, src, skip_none, NULL), 0);
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(src); i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(src, i);
		if (strcmp(t->name, "output.weight"))
			assert_int_equal(gpud_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne,
							    t->data, t->nbytes), 0);
	}
	assert_int_equal(gpud_gguf_w_write(w, path, err, sizeof(err)), 0);
	gpud_gguf_writer_free(w);
	gpud_gguf_close(src);

	if (gpud_model_load(&tied, path, err, sizeof(err)))
		fail_msg("%s", err);
	assert_true(gpud_model_hparams(tied)->tied_output);
	gpud_engine_params_default(&p);
	p.n_threads = 2;
	p.max_seqs = 2;
	p.n_ctx = 64;
	assert_int_equal(gpud_engine_create(&e, tied, &p, err, sizeof(err)), 0);
	assert_int_equal(gpud_engine_embed_tokens(e, once + 1, 1, emb, err, sizeof(err)), 0);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &s), 0);
	step_ok(e, &(struct gpud_batch_entry){ s, once + 1, 1, GPUD_LOGITS_LAST }, 1);
	lg = gpud_engine_logits(e, 0);
	const struct gpud_weight *te = &gpud_model_weights(tied)->tok_embd;
	for (int v = 0; v < 512; v += 37) {
		double d = 0;
		gpud_get_row(te->type, te->data, 64, v, row);
		for (int i = 0; i < 64; i++)
			d += (double)emb[i] * row[i];
		assert_true(isfinite(lg[v]));
		if (fabs(d) < 1e-3)
			continue;
		if (ratio == 0)
			ratio = (float)(lg[v] / d);
		else
			assert_float_equal(lg[v] / d, ratio, 1e-3 * fabs(ratio));
	}
	assert_true(ratio > 0);
	gpud_engine_destroy(e);
	gpud_model_free(tied);
}

/* A model big enough for the fused decode sections to run on both
 * threads: four sequences decoded together give the logits they give
 * decoded one at a time. */
static void test_fused_decode_batch(void **state)
{
	struct gpud_mkmodel_params mp;
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	struct gpud_engine_params p;
	char path[128], err[SW_ERR_MAX] = "";
	enum { NS = 4, NP = 7, ND = 5 };
	int32_t prompt[NS][NP], next[NS];
	static float alone[NS][ND][512];
	uint32_t s[NS], V;

	snprintf(path, sizeof(path), "%s/fused.gguf", tmpdir);
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	mp.dim = 256;
	mp.n_heads = 8;
	mp.n_kv_heads = 2;
	mp.ffn_dim = 512;
	mp.type = GPUD_TYPE_Q8_0;
	if (gpud_mkmodel(&mp, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	if (gpud_model_load(&m, path, err, sizeof(err)))
		fail_msg("%s", err);
	gpud_engine_params_default(&p);
	p.n_threads = 2;
	p.max_seqs = NS;
	assert_int_equal(gpud_engine_create(&e, m, &p, err, sizeof(err)), 0);
	V = gpud_engine_n_vocab(e);
	assert_true(V <= 512);
	for (int k = 0; k < NS; k++)
		for (int i = 0; i < NP; i++)
			prompt[k][i] = 3 + (k * 101 + i * 29) % (int)(V - 3);
	/* One at a time; decode feeds the greedy token. */
	for (int k = 0; k < NS; k++) {
		assert_int_equal(gpud_engine_seq_add(e, NULL, &s[k]), 0);
		step_ok(e, &(struct gpud_batch_entry){ s[k], prompt[k], NP, GPUD_LOGITS_LAST }, 1);
		for (int d = 0; d < ND; d++) {
			memcpy(alone[k][d], gpud_engine_logits(e, 0), V * sizeof(float));
			next[k] = argmax(alone[k][d], V);
			step_ok(e, &(struct gpud_batch_entry){ s[k], &next[k], 1, GPUD_LOGITS_LAST },
				1);
		}
		assert_int_equal(gpud_engine_seq_free(e, s[k]), 0);
	}
	/* Together: prefill all, then decode all four per step. */
	struct gpud_batch_entry b[NS];
	for (int k = 0; k < NS; k++) {
		assert_int_equal(gpud_engine_seq_add(e, NULL, &s[k]), 0);
		b[k] = (struct gpud_batch_entry){ s[k], prompt[k], NP, GPUD_LOGITS_LAST };
	}
	step_ok(e, b, NS);
	for (int d = 0; d < ND; d++) {
		for (int k = 0; k < NS; k++) {
			const float *lg = gpud_engine_logits(e, k);
			if (max_rel_diff(alone[k][d], lg, V) > 1e-5)
				fail_msg("seq %d step %d: batched logits differ (%g)", k, d,
					 max_rel_diff(alone[k][d], lg, V));
			next[k] = argmax(lg, V);
			b[k] = (struct gpud_batch_entry){ s[k], &next[k], 1, GPUD_LOGITS_LAST };
		}
		step_ok(e, b, NS);
	}
	gpud_engine_destroy(e);
	gpud_model_free(m);
}

static void test_create_params(void **state)
{
	struct gpud_engine_params p;
	struct gpud_engine *e = (void *)1;
	const struct gpud_model_hparams *hp = gpud_model_hparams(model);
	size_t block = (size_t)hp->n_layers * 2 * hp->n_kv_heads * 16 * hp->head_dim * 4;
	char err[SW_ERR_MAX] = "";

	gpud_engine_params_default(&p);
	p.max_batch_tokens = 0;
	assert_int_equal(gpud_engine_create(&e, model, &p, err, sizeof(err)), -EINVAL);
	assert_null(e);
	assert_non_null(strstr(err, "max_batch_tokens"));
	gpud_engine_params_default(&p);
	p.kv_bytes = block - 1;
	assert_int_equal(gpud_engine_create(&e, model, &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "KV budget"));

	/* A byte budget gives floor(budget / block) blocks; n_ctx is capped
	 * by the model's; max_logits defaults to max_seqs. */
	p.kv_bytes = 10 * block + 5;
	p.n_ctx = hp->n_ctx + 1000;
	p.max_seqs = 3;
	p.n_threads = 1;
	assert_int_equal(gpud_engine_create(&e, model, &p, err, sizeof(err)), 0);
	assert_int_equal(gpud_engine_params(e)->n_blocks, 10);
	assert_int_equal(gpud_engine_params(e)->n_ctx, hp->n_ctx);
	assert_int_equal(gpud_engine_params(e)->max_logits, 3);
	assert_ptr_equal(gpud_engine_model(e), model);
	gpud_engine_destroy(e);
	gpud_engine_destroy(NULL);

	/* Without n_blocks or a budget: enough for max_seqs full contexts. */
	gpud_engine_params_default(&p);
	p.max_seqs = 2;
	p.n_ctx = 100;
	assert_int_equal(gpud_engine_create(&e, model, &p, err, sizeof(err)), 0);
	assert_int_equal(gpud_engine_params(e)->n_blocks, 2 * 7);
	gpud_engine_destroy(e);
}

/* Multi-query attention (1 KV head, 8 query heads) at a context long
 * enough for attention to run on both threads: a decode step (items are
 * single heads) gives the logits that the same token had inside a
 * prefill (items are whole KV-head groups), and the reverse. */
static void test_mqa_long_context(void **state)
{
	struct gpud_mkmodel_params mp;
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	struct gpud_engine_params p;
	char path[128], err[SW_ERR_MAX] = "";
	int32_t toks[300];
	static float ref[512];
	uint32_t a, b, V;

	snprintf(path, sizeof(path), "%s/mqa.gguf", tmpdir);
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	mp.dim = 256;
	mp.n_heads = 8;
	mp.n_kv_heads = 1;
	mp.ffn_dim = 256;
	mp.n_ctx = 512;
	if (gpud_mkmodel(&mp, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	if (gpud_model_load(&m, path, err, sizeof(err)))
		fail_msg("%s", err);
	gpud_engine_params_default(&p);
	p.n_threads = 2;
	p.max_seqs = 2;
	p.max_logits = 300;
	assert_int_equal(gpud_engine_create(&e, m, &p, err, sizeof(err)), 0);
	V = gpud_engine_n_vocab(e);
	assert_true(V <= 512);
	for (int i = 0; i < 300; i++)
		toks[i] = 3 + (i * 37) % (int)(V - 3);
	/* a: 299 tokens of prefill, then token 300 as a decode step. */
	assert_int_equal(gpud_engine_seq_add(e, NULL, &a), 0);
	step_ok(e, &(struct gpud_batch_entry){ a, toks, 299, GPUD_LOGITS_NONE }, 1);
	step_ok(e, &(struct gpud_batch_entry){ a, toks + 299, 1, GPUD_LOGITS_LAST }, 1);
	memcpy(ref, gpud_engine_logits(e, 0), V * sizeof(float));
	/* b: all 300 in one prefill with every logit. */
	assert_int_equal(gpud_engine_seq_add(e, NULL, &b), 0);
	step_ok(e, &(struct gpud_batch_entry){ b, toks, 300, GPUD_LOGITS_ALL }, 1);
	assert_true(max_rel_diff(ref, gpud_engine_logits(e, 0) + 299 * (size_t)V, V) < 1e-4);
	gpud_engine_destroy(e);
	gpud_model_free(m);
}

/* --- the gpud binary ------------------------------------------------------- */

/* Runs cmd with the shell, captures stdout into out; returns the exit code. */
static int run(const char *cmd, char *out, size_t cap)
{
	FILE *f = popen(cmd, "r");
	size_t n = 0;
	int st;

	assert_non_null(f);
	while (n + 1 < cap) {
		size_t r = fread(out + n, 1, cap - 1 - n, f);
		if (!r)
			break;
		n += r;
	}
	out[n] = 0;
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state)
{
	char out[4096], cmd[1024];

	snprintf(cmd, sizeof(cmd),
		 "%s generate --model %s --prompt 'Once upon a time' --max-tokens 60 "
		 "--temperature 0 --threads 2 2>/dev/null", GPUD_BIN, STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	if (strncmp(out, GREEDY, strlen(GREEDY)))
		fail_msg("gpud generate printed:\n%s", out);

	snprintf(cmd, sizeof(cmd),
		 "%s generate --model %s --prompt 'Once upon a time' --stop Lily --stop zebra "
		 "2>/dev/null", GPUD_BIN, STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_string_equal(out, ", there was a little girl named ");

	snprintf(cmd, sizeof(cmd), "%s tokenize --model %s 'Once upon a time'", GPUD_BIN, STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_string_equal(out, "1 403 407 261 378\n");
	snprintf(cmd, sizeof(cmd), "%s tokenize --no-bos --model %s 'Once upon a time'", GPUD_BIN,
		 STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_string_equal(out, "403 407 261 378\n");
	/* Vocab-only file: no tensors. */
	snprintf(cmd, sizeof(cmd),
		 "%s tokenize --model " SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-spm.gguf "
		 "'Hello world'", GPUD_BIN);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_true(strlen(out) > 2 && strspn(out, "0123456789 \n") == strlen(out));

	/* mkmodel through the binary, then run what it wrote: every weight
	 * type, GQA, tied output, Llama 3 rope scaling. */
	static const char *types[] = { "f32", "f16", "bf16", "q8_0", "q4_0" };
	for (int i = 0; i < 5; i++) {
		snprintf(cmd, sizeof(cmd),
			 "%s mkmodel --out %s/mk.gguf --dim 64 --layers 2 --heads 4 --kv-heads 2 "
			 "--ffn 96 --vocab byte --type %s --seed %d --context 64 %s 2>&1 && "
			 "%s generate --model %s/mk.gguf --prompt 'hello there' --max-tokens 8 "
			 "--threads 2 --temperature 0.8 --top-k 40 --top-p 0.9 --min-p 0.05 --seed 3 "
			 "2>&1 >/dev/null", GPUD_BIN, tmpdir, types[i], i + 1,
			 i % 2 ? "--tied --rope-scale 32" : "", GPUD_BIN, tmpdir);
		if (run(cmd, out, sizeof(out)))
			fail_msg("%s: %s", types[i], out);
		assert_non_null(strstr(out, "prompt tokens:"));
	}
	/* --arch qwen2 with the Qwen2.5 vocabulary: biases, NEOX RoPE, the
	 * qwen2 pre-tokenizer end to end; an unknown architecture is a usage
	 * error. */
	snprintf(cmd, sizeof(cmd),
		 "%s mkmodel --out %s/qw.gguf --arch qwen2 --dim 64 --layers 1 --heads 4 "
		 "--kv-heads 2 --ffn 64 --vocab-from " SW_SHARED_DIR "/tokenizer/ggml-vocab-qwen2.gguf "
		 "--type q8_0 --tied --rope-base 1000000 --context 64 2>&1 && "
		 "%s generate --model %s/qw.gguf --prompt 'Hello 123' --max-tokens 4 2>&1 >/dev/null",
		 GPUD_BIN, tmpdir, GPUD_BIN, tmpdir);
	if (run(cmd, out, sizeof(out)))
		fail_msg("qwen2: %s", out);
	assert_non_null(strstr(out, "prompt tokens: 5,")); /* Hello, space, 1, 2, 3 */
	snprintf(cmd, sizeof(cmd), "%s mkmodel --out %s/x.gguf --arch gpt2 2>&1", GPUD_BIN, tmpdir);
	assert_int_equal(run(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "--arch"));
	/* --chat: a Llama 3 vocabulary gets its header template (11 prompt
	 * tokens for "Hi": BOS, 2 x (start, role, end, \n\n), "Hi", eot);
	 * stories260K has no template, which is an error. */
	snprintf(cmd, sizeof(cmd),
		 "%s mkmodel --out %s/l3.gguf --dim 64 --layers 1 --heads 4 --kv-heads 1 --ffn 64 "
		 "--vocab-from " SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-bpe.gguf --type q8_0 --tied "
		 "--rope-scale 32 --rope-base 500000 --context 64 2>&1 && "
		 "%s generate --model %s/l3.gguf --prompt Hi --chat --max-tokens 3 2>&1 >/dev/null",
		 GPUD_BIN, tmpdir, GPUD_BIN, tmpdir);
	if (run(cmd, out, sizeof(out)))
		fail_msg("chat: %s", out);
	assert_non_null(strstr(out, "prompt tokens: 11,"));
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --prompt Hi --chat 2>&1", GPUD_BIN,
		 STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "has no tokenizer.chat_template"));
	assert_non_null(strstr(out, "--chat-format"));
	/* --chat-format chooses one (and implies --chat): ChatML's markers
	 * are plain text in this vocabulary, but the prompt is formatted. */
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --prompt Hi --chat-format chatml "
		 "--max-tokens 2 2>&1 >/dev/null", GPUD_BIN, STORIES);
	if (run(cmd, out, sizeof(out)))
		fail_msg("chatml: %s", out);
	assert_non_null(strstr(out, "prompt tokens: "));
	assert_null(strstr(out, "prompt tokens: 2,")); /* more than BOS + "Hi" */
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --prompt Hi --chat-format vicuna 2>&1",
		 GPUD_BIN, STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "unknown format \"vicuna\""));

	snprintf(cmd, sizeof(cmd), "%s mkmodel --dim 64 2>&1", GPUD_BIN);
	assert_int_equal(run(cmd, out, sizeof(out)), 2); /* no --out */
	snprintf(cmd, sizeof(cmd), "%s mkmodel --out %s/bad.gguf --dim 63 --heads 4 2>&1",
		 GPUD_BIN, tmpdir);
	assert_int_equal(run(cmd, out, sizeof(out)), 1);

	snprintf(cmd, sizeof(cmd), "%s --version", GPUD_BIN);
	assert_int_equal(run(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "gpud "));

	/* Errors: non-zero exit, stderr names the file and the cause. */
	snprintf(cmd, sizeof(cmd), "%s generate --model %s/none.gguf --prompt x 2>&1", GPUD_BIN,
		 tmpdir);
	assert_int_equal(run(cmd, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "none.gguf"));
	snprintf(cmd, sizeof(cmd), "%s generate --model %s --context 4 --prompt "
		 "'Once upon a time there was a cat' 2>&1 >/dev/null", GPUD_BIN, STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "context"));
	assert_non_null(strstr(out, "stories260K.gguf"));
	snprintf(cmd, sizeof(cmd), "%s generate --model %s 2>&1", GPUD_BIN, STORIES);
	assert_int_equal(run(cmd, out, sizeof(out)), 2);
	snprintf(cmd, sizeof(cmd), "%s frobnicate 2>&1", GPUD_BIN);
	assert_int_equal(run(cmd, out, sizeof(out)), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_text),
		cmocka_unit_test(test_prompt_too_long),
		cmocka_unit_test(test_step_errors_change_nothing),
		cmocka_unit_test(test_kv_exhaustion),
		cmocka_unit_test(test_no_alloc_after_warmup),
		cmocka_unit_test(test_batch_chunk_consistency),
		cmocka_unit_test(test_argmax_entries),
		cmocka_unit_test(test_mask_plumbing),
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_tied_embeddings),
		cmocka_unit_test(test_mqa_long_context),
		cmocka_unit_test(test_create_params),
		cmocka_unit_test(test_fused_decode_batch),
		cmocka_unit_test(test_seq_add_prefix),
		cmocka_unit_test(test_cli),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
