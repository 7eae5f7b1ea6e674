/* chunkkv_test.c - chunk KV reused at any position (issue 14): a prompt
 * assembled from cached, re-rotated self-only chunks gives the logits of a
 * from-scratch prefill of the same prompt and descriptor (within 1e-5
 * relative, F32 models from mkmodel: llama and qwen2, i.e. both RoPE pairing
 * styles), at offsets 0, 17, 1000 and across
 * block edges, on ragged batches; the cache evicts under its byte bound
 * and under pool pressure, and gives every block back. */
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
#include <unistd.h>

#include "common/err.h"
#include "gpud/backend.h"
#include "gpud/engine.h"
#include "gpud/mask.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"

#define BT 16
#define NCTX 1536
#define MAXSEG 8
#define TOL 1e-5
#define TOL_F16 1e-4 /* f16 KV: 5e-6 seen on both models */

static char g_dir[] = "/tmp/chunkkv_test.XXXXXX";
static char g_path[256];
static struct gpud_model *g_m;

static uint64_t rs = 11;
static uint32_t rnd(uint32_t n)
{
	rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(rs >> 33) % n;
}

static void fill(int32_t *t, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = 3 + (int32_t)rnd(250);
}

static enum gpud_arch g_arch; /* the group's model: llama, then qwen2 */

static int group_setup(void **state)
{
	struct gpud_mkmodel_params mp;
	char err[SW_ERR_MAX];

	(void)state;
	snprintf(g_dir, sizeof(g_dir), "/tmp/chunkkv_test.XXXXXX"); /* a group each */
	if (!mkdtemp(g_dir))
		return -1;
	snprintf(g_path, sizeof(g_path), "%s/m.gguf", g_dir);
	gpud_mkmodel_params_default(&mp);
	mp.out = g_path;
	mp.n_ctx = NCTX;
	mp.type = GPUD_TYPE_F32;
	mp.seed = 7;
	mp.arch = g_arch;
	if (gpud_mkmodel(&mp, err, sizeof(err)) || gpud_model_load(&g_m, g_path, err, sizeof(err))) {
		print_error("%s\n", err);
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	gpud_model_free(g_m);
	g_m = NULL;
	unlink(g_path);
	rmdir(g_dir);
	return 0;
}

static enum gpud_type g_kv_type = GPUD_TYPE_F32; /* of every engine() */

static struct gpud_engine *engine(size_t chunk_bytes, uint32_t n_blocks)
{
	struct gpud_engine_params ep;
	struct gpud_engine *e;
	char err[SW_ERR_MAX];

	gpud_engine_params_default(&ep);
	ep.n_threads = 2;
	ep.max_batch_tokens = NCTX;
	ep.max_seqs = 4;
	ep.max_logits = 256;
	ep.block_tokens = BT;
	ep.n_ctx = NCTX;
	ep.n_blocks = n_blocks;
	ep.chunk_bytes = chunk_bytes;
	ep.kv_type = g_kv_type;
	if (gpud_engine_create(&e, g_m, &ep, err, sizeof(err)))
		fail_msg("engine: %s", err);
	return e;
}

/* A prompt: segments with their tokens, and the compiled descriptor. Chunk
 * segments (self[i]) see only themselves; every other row (and G) sees
 * every segment. */
struct prompt {
	uint32_t n_seg, lens[MAXSEG], n;
	bool self[MAXSEG];
	int32_t toks[NCTX];
	struct proto_mask_desc d;
	struct proto_mask_row rows[MAXSEG + 1];
	uint16_t idx[MAXSEG + 1][MAXSEG + 1];
	_Alignas(16) uint8_t mem[16384];
	struct gpud_mask mask;
};

/* segs: (length, self-only, tokens or NULL for fresh random ones). */
struct seg {
	uint32_t len;
	bool self;
	const int32_t *toks;
};

static void prompt_make(struct prompt *p, const struct seg *segs, uint32_t n_seg)
{
	memset(p, 0, sizeof(*p));
	p->n_seg = n_seg;
	for (uint32_t i = 0; i < n_seg; i++) {
		p->lens[i] = segs[i].len;
		p->self[i] = segs[i].self;
		if (segs[i].toks)
			memcpy(p->toks + p->n, segs[i].toks, segs[i].len * sizeof(int32_t));
		else
			fill(p->toks + p->n, segs[i].len);
		p->n += segs[i].len;
	}
	p->d.n_segments = n_seg;
	p->d.rows = p->rows;
	for (uint32_t i = 0; i <= n_seg; i++) {
		p->rows[i].idx = p->idx[i];
		if (i < n_seg && p->self[i]) {
			p->idx[i][p->rows[i].n++] = (uint16_t)i;
			continue;
		}
		for (uint32_t j = 0; j <= i; j++)
			p->idx[i][p->rows[i].n++] = (uint16_t)j;
	}
	assert_true(gpud_mask_bytes(n_seg, p->n, BT) <= sizeof(p->mem));
	assert_int_equal(gpud_mask_compile(&p->d, p->lens, BT, p->mem, sizeof(p->mem), &p->mask), 0);
}

/* Per-sequence state of a (possibly ragged) run. */
struct run {
	const struct prompt *p;
	uint32_t seq, seg;  /* next segment to do */
	uint32_t reused;    /* tokens copied from the cache */
	float *logits;      /* (last segment's tokens, n_vocab) */
};

/* Runs the prompts together: per round, each sequence first takes what the
 * cache has (when reuse), then computes its next segment; all those in one
 * ragged step; after it each stores its finished chunks (when store). The
 * last segment's logits (every row) land in r[i].logits. */
static void run_all(struct gpud_engine *e, struct run *r, uint32_t k, bool reuse, bool store)
{
	uint32_t nv = gpud_engine_n_vocab(e);
	char err[SW_ERR_MAX];

	for (uint32_t i = 0; i < k; i++) {
		assert_int_equal(gpud_engine_seq_add(e, &r[i].p->mask, &r[i].seq), 0);
		r[i].seg = 0;
		r[i].reused = 0;
		r[i].logits = calloc((size_t)r[i].p->lens[r[i].p->n_seg - 1] * nv, sizeof(float));
	}
	for (;;) {
		struct gpud_batch_entry b[8];
		uint32_t n = 0, who[8];

		for (uint32_t i = 0; i < k; i++) {
			const struct prompt *p = r[i].p;
			uint32_t pos, got = 0, start = 0;

			if (r[i].seg == p->n_seg)
				continue;
			if (reuse) {
				assert_int_equal(gpud_engine_chunk_reuse(e, r[i].seq, p->toks, p->n,
									 UINT32_MAX, &got),
						 0);
				r[i].reused += got;
			}
			pos = gpud_engine_seq_len(e, r[i].seq);
			/* the segment pos is in */
			r[i].seg = 0;
			for (uint32_t s = 0; s < p->n_seg; s++, r[i].seg++) {
				if (pos < start + p->lens[s])
					break;
				start += p->lens[s];
			}
			assert_true(r[i].seg < p->n_seg);
			if (reuse)
				assert_true(gpud_engine_chunk_until(e, r[i].seq, p->toks, p->n) >=
					    start + p->lens[r[i].seg] - pos);
			b[n] = (struct gpud_batch_entry){
				.seq = r[i].seq, .tokens = p->toks + pos,
				.n_tokens = start + p->lens[r[i].seg] - pos,
				.logits = r[i].seg + 1 == p->n_seg ? GPUD_LOGITS_ALL : GPUD_LOGITS_NONE,
			};
			who[n++] = i;
		}
		if (!n)
			break;
		if (gpud_engine_step(e, b, n, err, sizeof(err)))
			fail_msg("step: %s", err);
		for (uint32_t j = 0; j < n; j++) {
			struct run *ri = &r[who[j]];
			if (b[j].logits == GPUD_LOGITS_ALL)
				memcpy(ri->logits, gpud_engine_logits(e, j),
				       (size_t)b[j].n_tokens * nv * sizeof(float));
			if (store)
				assert_true(gpud_engine_chunk_store(e, ri->seq, ri->p->toks,
								    ri->p->n) >= 0);
			ri->seg++;
		}
	}
}

static void run_free(struct gpud_engine *e, struct run *r, uint32_t k)
{
	for (uint32_t i = 0; i < k; i++) {
		gpud_engine_seq_free(e, r[i].seq);
		free(r[i].logits);
	}
}

/* max over rows of max|a - b| / max|b|. */
static double rel_err(const float *a, const float *b, uint32_t rows, uint32_t nv)
{
	double worst = 0;

	for (uint32_t r = 0; r < rows; r++) {
		double d = 0, m = 0;
		for (uint32_t i = 0; i < nv; i++) {
			size_t o = (size_t)r * nv + i;
			d = fmax(d, fabs((double)a[o] - b[o]));
			m = fmax(m, fabs((double)b[o]));
		}
		worst = fmax(worst, d / m);
	}
	return worst;
}

/* The reference: the same prompts from scratch (no cache), one at a time. */
static double check_against_scratch(struct run *r, uint32_t k)
{
	struct gpud_engine *ref = engine(0, 0);
	uint32_t nv = gpud_engine_n_vocab(ref);
	double worst = 0;

	for (uint32_t i = 0; i < k; i++) {
		struct run s = { .p = r[i].p };
		uint32_t last = r[i].p->lens[r[i].p->n_seg - 1];
		double er;

		run_all(ref, &s, 1, false, false);
		er = rel_err(r[i].logits, s.logits, last, nv);
		worst = fmax(worst, er);
		run_free(ref, &s, 1);
	}
	gpud_engine_destroy(ref);
	return worst;
}

static void assert_idle_empty(struct gpud_engine *e)
{
	struct gpud_engine_stats st;
	char err[SW_ERR_MAX];

	gpud_engine_chunk_flush(e);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 0);
	assert_int_equal(st.chunk.blocks, 0);
	assert_int_equal(st.chunk.entries, 0);
	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("check: %s", err);
}

/* One chunk at many offsets: stored once at offset 3, reused at 0, 5, 16,
 * 17, 31, 32, 1000 (aligned, unaligned, across block edges), each equal to
 * a from-scratch prefill. */
static void offsets(double tol)
{
	static const uint32_t offs[] = { 0, 5, 16, 17, 31, 32, 1000 };
	/* Under valgrind not 1000: its two 1,000-token prefills were 80% of
	 * the test's time there, and the block edges are all below 33. */
	const size_t n_offs = sizeof(offs) / sizeof(offs[0]) - (getenv("SWARM_UNDER_VALGRIND") ? 1 : 0);
	struct gpud_engine *e = engine(1 << 20, 0);
	static struct prompt first, p;
	int32_t chunk[37];
	struct run r;
	struct gpud_engine_stats st;

	fill(chunk, 37);
	prompt_make(&first, (struct seg[]){ { 3, false, NULL }, { 37, true, chunk },
					    { 9, false, NULL } }, 3);
	r = (struct run){ .p = &first };
	run_all(e, &r, 1, true, true);
	assert_int_equal(r.reused, 0);
	run_free(e, &r, 1);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.chunk.entries, 1);
	assert_int_equal(st.chunk.blocks, 3); /* 37 tokens from offset 0 */
	for (size_t i = 0; i < n_offs; i++) {
		double er;

		if (offs[i])
			prompt_make(&p, (struct seg[]){ { offs[i], false, NULL },
							{ 37, true, chunk },
							{ 11, false, NULL } }, 3);
		else
			prompt_make(&p, (struct seg[]){ { 37, true, chunk }, { 11, false, NULL } },
				    2);
		r = (struct run){ .p = &p };
		run_all(e, &r, 1, true, true);
		assert_int_equal(r.reused, 37);
		er = check_against_scratch(&r, 1);
		print_message("offset %4u: max relative logits error %.2e\n", offs[i], er);
		assert_true(er <= tol);
		run_free(e, &r, 1);
	}
	gpud_engine_stats(e, &st);
	assert_int_equal(st.chunk.hits, n_offs);
	assert_int_equal(st.chunk.hit_tokens, n_offs * 37);
	/* the chunk only: a first segment (which sees only itself by
	 * definition) is the prefix cache's */
	assert_int_equal(st.chunk.inserts, 1);
	assert_idle_empty(e);
	gpud_engine_destroy(e);
}

static void test_offsets(void **state)
{
	(void)state;
	offsets(TOL);
}

/* The same with f16 KV: the moved keys are widened, rotated in fp32 and
 * rounded to half again, where a from-scratch prefill rounds the rotated
 * key once: a half ulp more on some keys, no more (bound). */
static void test_offsets_kv_f16(void **state)
{
	(void)state;
	g_kv_type = GPUD_TYPE_F16;
	offsets(TOL_F16);
	g_kv_type = GPUD_TYPE_F32;
}

/* Answer-style prompts on a ragged batch: system, three chunks from a pool
 * in different orders and company, a question. The second round finds
 * every chunk in the cache; all logits match from-scratch prefills. */
static void test_ragged(void **state)
{
	struct gpud_engine *e = engine(4 << 20, 0);
	static int32_t pool[5][45];
	static const uint32_t plen[5] = { 20, 33, 45, 16, 29 };
	static const uint8_t pick[2][3][3] = { { { 0, 1, 2 }, { 2, 3, 4 }, { 4, 0, 3 } },
					       { { 2, 0, 4 }, { 3, 1, 0 }, { 1, 4, 2 } } };
	static struct prompt p[2][3];
	struct run r[3];
	int32_t sys[7];
	uint64_t want = 0;

	(void)state;
	fill(sys, 7);
	for (int i = 0; i < 5; i++)
		fill(pool[i], plen[i]);
	for (int round = 0; round < 2; round++) {
		double er;
		for (int i = 0; i < 3; i++) {
			const uint8_t *c = pick[round][i];
			prompt_make(&p[round][i],
				    (struct seg[]){ { 7, false, sys },
						    { plen[c[0]], true, pool[c[0]] },
						    { plen[c[1]], true, pool[c[1]] },
						    { plen[c[2]], true, pool[c[2]] },
						    { 5 + (uint32_t)i * 4, false, NULL } }, 5);
			r[i] = (struct run){ .p = &p[round][i] };
		}
		run_all(e, r, 3, true, true);
		for (int i = 0; i < 3; i++) {
			uint32_t all = 0;
			for (int j = 0; j < 3; j++)
				all += plen[pick[1][i][j]];
			if (round == 1)
				assert_int_equal(r[i].reused, all);
			want += r[i].reused; /* round 0 reuses what its neighbours stored */
		}
		er = check_against_scratch(r, 3);
		print_message("round %d: max relative logits error %.2e\n", round, er);
		assert_true(er <= TOL);
		run_free(e, r, 3);
	}
	{
		struct gpud_engine_stats st;
		gpud_engine_stats(e, &st);
		assert_int_equal(st.chunk.hit_tokens, want);
		/* every chunk of both rounds was copied or computed */
		assert_int_equal(st.chunk.hits + st.chunk.misses, 2 * 3 * 3);
		/* 5 distinct chunks, each stored once (a chunk two sequences
		 * computed in the same round is stored by the first) */
		assert_int_equal(st.chunk.inserts, 5);
		assert_true(st.chunk.misses >= 5);
	}
	assert_idle_empty(e);
	gpud_engine_destroy(e);
}

/* The byte bound: a cache of 4 blocks keeps the most recent chunks only;
 * a chunk larger than the bound is never stored. */
static void test_evict_bound(void **state)
{
	struct gpud_engine *probe = engine(0, 0);
	size_t bb = gpud_engine_block_bytes(probe);
	struct gpud_engine *e = engine(4 * bb, 0);
	static struct prompt p[4];
	int32_t c[4][40];
	struct gpud_engine_stats st;
	struct run r;

	(void)state;
	gpud_engine_destroy(probe);
	for (int i = 0; i < 4; i++)
		fill(c[i], 40);
	/* chunks of 2, 2, 1 blocks: the third evicts the first */
	for (int i = 0; i < 3; i++) {
		prompt_make(&p[i], (struct seg[]){ { 4, false, NULL },
						   { i == 2 ? 16u : 32u, true, c[i] },
						   { 4, false, NULL } }, 3);
		r = (struct run){ .p = &p[i] };
		run_all(e, &r, 1, true, true);
		run_free(e, &r, 1);
	}
	gpud_engine_stats(e, &st);
	assert_int_equal(st.chunk.inserts, 3);
	assert_int_equal(st.chunk.evictions, 1);
	assert_int_equal(st.chunk.blocks, 3);
	assert_true(st.chunk.bytes <= 4 * bb);
	/* the second is there, the first is gone (and back in, in place of
	 * the third, now the least recent) */
	r = (struct run){ .p = &p[1] };
	run_all(e, &r, 1, true, true);
	assert_int_equal(r.reused, 32);
	run_free(e, &r, 1);
	r = (struct run){ .p = &p[0] };
	run_all(e, &r, 1, true, true);
	assert_int_equal(r.reused, 0);
	run_free(e, &r, 1);
	r = (struct run){ .p = &p[2] };
	run_all(e, &r, 1, true, false);
	assert_int_equal(r.reused, 0);
	run_free(e, &r, 1);
	/* 5 blocks: more than the bound, never stored */
	prompt_make(&p[3], (struct seg[]){ { 4, false, NULL }, { 80, true, NULL },
					   { 4, false, NULL } }, 3);
	gpud_engine_stats(e, &st);
	{
		uint64_t ins = st.chunk.inserts;
		r = (struct run){ .p = &p[3] };
		run_all(e, &r, 1, true, true);
		run_free(e, &r, 1);
		gpud_engine_stats(e, &st);
		assert_int_equal(st.chunk.inserts, ins);
	}
	assert_idle_empty(e);
	gpud_engine_destroy(e);
}

/* Pool pressure: a pool of 16 blocks with the cache holding 6 still runs a
 * sequence of 16 blocks (the step evicts the cache), and free_blocks
 * counts cached blocks as free. */
static void test_evict_pool(void **state)
{
	struct gpud_engine *e = engine(1 << 20, 16);
	static struct prompt p;
	struct gpud_engine_stats st;
	struct gpud_batch_entry b;
	int32_t big[16 * BT];
	uint32_t seq;
	char err[SW_ERR_MAX];
	struct run r;

	(void)state;
	prompt_make(&p, (struct seg[]){ { 2, false, NULL }, { 48, true, NULL },
					{ 48, true, NULL }, { 4, false, NULL } }, 4);
	r = (struct run){ .p = &p };
	run_all(e, &r, 1, true, true);
	run_free(e, &r, 1);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.chunk.blocks, 6);
	assert_int_equal(gpud_engine_free_blocks(e), 16);
	fill(big, 16 * BT);
	assert_int_equal(gpud_engine_seq_add(e, NULL, &seq), 0);
	b = (struct gpud_batch_entry){ .seq = seq, .tokens = big, .n_tokens = 16 * BT,
				       .logits = GPUD_LOGITS_LAST };
	if (gpud_engine_step(e, &b, 1, err, sizeof(err)))
		fail_msg("step: %s", err);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.chunk.blocks, 0);
	assert_int_equal(st.chunk.evictions, 2);
	gpud_engine_seq_free(e, seq);
	assert_idle_empty(e);
	gpud_engine_destroy(e);
}

/* What is not reused: a chunk that ends the prompt (its last token must be
 * computed), a segment that sees others, the same tokens at another
 * length; a backend without kv_copy_shift keeps no cache. */
static void test_not_reused(void **state)
{
	struct gpud_engine *e = engine(1 << 20, 0);
	static struct prompt a, b, c;
	int32_t chunk[40];
	struct run r;

	(void)state;
	fill(chunk, 40);
	prompt_make(&a, (struct seg[]){ { 4, false, NULL }, { 40, true, chunk },
					{ 4, false, NULL } }, 3);
	r = (struct run){ .p = &a };
	run_all(e, &r, 1, true, true);
	run_free(e, &r, 1);
	/* last segment */
	prompt_make(&b, (struct seg[]){ { 4, false, NULL }, { 40, true, chunk } }, 2);
	r = (struct run){ .p = &b };
	run_all(e, &r, 1, true, false);
	assert_int_equal(r.reused, 0);
	run_free(e, &r, 1);
	/* same tokens, not self-only */
	prompt_make(&c, (struct seg[]){ { 4, false, NULL }, { 40, false, chunk },
					{ 4, false, NULL } }, 3);
	r = (struct run){ .p = &c };
	run_all(e, &r, 1, true, false);
	assert_int_equal(r.reused, 0);
	run_free(e, &r, 1);
	/* a prefix of the chunk's tokens */
	prompt_make(&c, (struct seg[]){ { 4, false, NULL }, { 39, true, chunk },
					{ 4, false, NULL } }, 3);
	r = (struct run){ .p = &c };
	run_all(e, &r, 1, true, false);
	assert_int_equal(r.reused, 0);
	run_free(e, &r, 1);
	assert_true(gpud_engine_chunk_enabled(e));
	assert_idle_empty(e);
	gpud_engine_destroy(e);
	assert_non_null(gpud_backend_for(SW_DEVICE_CPU)->kv_copy_shift);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_offsets),
		cmocka_unit_test(test_offsets_kv_f16),
		cmocka_unit_test(test_ragged),
		cmocka_unit_test(test_evict_bound),
		cmocka_unit_test(test_evict_pool),
		cmocka_unit_test(test_not_reused),
	};
	int failed;

	/* llama (adjacent RoPE pairs), then qwen2 (NEOX pairs, Q/K/V biases):
	 * the re-rotation follows the model's own RoPE style */
	g_arch = GPUD_ARCH_LLAMA;
	failed = cmocka_run_group_tests_name("llama", tests, group_setup, group_teardown);
	g_arch = GPUD_ARCH_QWEN2;
	failed += cmocka_run_group_tests_name("qwen2", tests, group_setup, group_teardown);
	return failed;
}
