/* scheduler_test.c - the continuous-batching scheduler on stories260K: many
 * concurrent greedy requests on two engines (each driven by its own
 * thread) give the text of solo gpud_engine_generate runs; placement;
 * chunked prefill; refusals and SW_EBUSY; slots reused, also under
 * concurrent submitters; cancel returns blocks;
 * preemption under a tiny KV pool keeps outputs identical; aging stops
 * bypassing; no allocation after warm-up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/alloc.h"
#include "gpud/engine.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/scheduler.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"

static struct gpud_model *model;

/* --- helpers --------------------------------------------------------------- */

static bool under_valgrind(void)
{
	return getenv("SWARM_UNDER_VALGRIND") != NULL;
}

static const char *const prompts[] = {
	"Once upon a time",
	"The little dog",
	"Lily and Ben went to the park",
	"One day, a big bird",
	"Tom had a red ball. He",
	"The sun was shining and",
	"Mom said",
	"There was a cat named Tim who liked to play with his friends in the",
	"A girl",
	"The boy saw a tree",
	"Sue wanted to",
	"It was a cold day",
};
#define N_PROMPTS (sizeof(prompts) / sizeof(prompts[0]))

/* Per-request results, written by the callback. */
struct res {
	char text[4096];
	size_t len;
	int32_t ids[512];
	uint32_t n_ids;
	bool done;
	int status, reason;
	struct gpud_sched_usage usage;
	long first_step; /* value of *step_clock at the first token */
	const long *step_clock;
	int stop_after;  /* tokens; 0 = never */
	unsigned slow_us; /* sleep per token (a slow client on the device thread) */
	/* PROMPT_TOKEN events: their places and numbers, in arrival order */
	uint32_t np;
	uint32_t ppos[256];
	float plp[256];
	bool prompt_after_token;
};

static atomic_int n_done;

static int on_event(void *arg, const struct gpud_sched_event *ev)
{
	struct res *r = arg;

	if (ev->kind == GPUD_SCHED_PROMPT_TOKEN) {
		assert_false(r->done);
		r->prompt_after_token |= r->n_ids > 0;
		if (r->np < 256) {
			r->ppos[r->np] = ev->prompt_pos;
			r->plp[r->np] = ev->logprobs->logprob;
		}
		r->np++;
		return 0;
	}
	if (ev->kind == GPUD_SCHED_TOKEN) {
		assert_false(r->done);
		if (r->n_ids == 0 && r->step_clock)
			r->first_step = *r->step_clock;
		if (r->n_ids < 512) {
			r->ids[r->n_ids] = ev->token;
			__atomic_store_n(&r->n_ids, r->n_ids + 1, __ATOMIC_RELEASE);
		}
		if (r->slow_us)
			usleep(r->slow_us);
		if (r->len + ev->len < sizeof(r->text)) {
			memcpy(r->text + r->len, ev->text, ev->len);
			r->len += ev->len;
			r->text[r->len] = 0;
		}
		return r->stop_after && (int)r->n_ids >= r->stop_after;
	}
	assert_false(r->done);
	r->done = true;
	r->status = ev->status;
	r->reason = ev->reason;
	r->usage = ev->usage;
	atomic_fetch_add(&n_done, 1);
	return 0;
}

/* An engine with spare_rows logits rows beyond one a sequence. */
static struct gpud_engine *mk_engine_rows(uint32_t max_batch, uint32_t max_seqs,
					  uint32_t n_blocks, uint32_t spare_rows)
{
	struct gpud_engine_params p;
	struct gpud_engine *e = NULL;
	char err[SW_ERR_MAX] = "";

	gpud_engine_params_default(&p);
	p.n_threads = 1;
	p.max_batch_tokens = max_batch;
	p.max_seqs = max_seqs;
	p.max_logits = max_seqs + spare_rows;
	p.n_blocks = n_blocks;
	if (gpud_engine_create(&e, model, &p, err, sizeof(err)))
		fail_msg("engine: %s", err);
	return e;
}

static struct gpud_engine *mk_engine(uint32_t max_batch, uint32_t max_seqs, uint32_t n_blocks)
{
	return mk_engine_rows(max_batch, max_seqs, n_blocks, 0);
}

static struct gpud_sched *mk_sched(struct gpud_engine **e, uint32_t n, uint32_t max_req,
				   uint32_t max_batch, uint32_t aging)
{
	struct gpud_sched_params p;
	struct gpud_sched *s = NULL;
	char err[SW_ERR_MAX] = "";

	gpud_sched_params_default(&p);
	p.max_requests = max_req;
	p.max_batch_tokens = max_batch;
	p.aging_steps = aging;
	if (gpud_sched_create(&s, e, n, &p, err, sizeof(err)))
		fail_msg("sched: %s", err);
	return s;
}

/* A scheduler over two engines, and the engines. */
static void free_sched2(struct gpud_sched *s, struct gpud_engine **e)
{
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* Prompt ids as gpud_engine_generate makes them (BOS as the vocab asks). */
static uint32_t tokenize(const char *text, int32_t *ids, size_t cap)
{
	const struct gpud_tokenizer *t = gpud_model_tokenizer(model);
	struct sw_arena a;
	size_t n = 0;

	assert_int_equal(sw_arena_init(&a, gpud_tokenizer_scratch_bytes(t, strlen(text))), 0);
	assert_int_equal(gpud_tokenizer_encode(t, text, strlen(text),
					       gpud_tokenizer_add_bos(t) ? GPUD_TOK_ADD_BOS : 0, ids,
					       cap, &n, &a),
			 0);
	sw_arena_destroy(&a);
	return (uint32_t)n;
}

struct sink {
	char buf[4096];
	size_t len;
};

static int sink_emit(void *arg, const char *text, size_t len)
{
	struct sink *s = arg;

	if (s->len + len < sizeof(s->buf)) {
		memcpy(s->buf + s->len, text, len);
		s->len += len;
		s->buf[s->len] = 0;
	}
	return 0;
}

/* Solo greedy reference through gpud_engine_generate. */
static void reference(struct gpud_engine *e, const char *prompt, uint32_t max_tokens,
		      struct sink *out, struct gpud_gen_result *res)
{
	struct gpud_gen_params gp;
	char err[SW_ERR_MAX] = "";

	gpud_gen_params_default(&gp);
	gp.max_tokens = max_tokens;
	memset(out, 0, sizeof(*out));
	if (gpud_engine_generate(e, prompt, strlen(prompt), &gp, sink_emit, out, res, err,
				 sizeof(err)))
		fail_msg("generate: %s", err);
}

static void req_init(struct gpud_sched_req *r, const int32_t *ids, uint32_t n, uint32_t max_tokens,
		     struct res *out)
{
	memset(r, 0, sizeof(*r));
	r->tokens = ids;
	r->n_tokens = n;
	gpud_sampler_params_default(&r->sampling);
	r->max_tokens = max_tokens;
	r->cb = on_event;
	r->arg = out;
}

static uint64_t submit_ok(struct gpud_sched *s, const struct gpud_sched_req *r)
{
	char err[SW_ERR_MAX] = "";
	uint64_t id = 0;

	if (gpud_sched_submit(s, r, &id, err, sizeof(err)))
		fail_msg("submit: %s", err);
	assert_true(id != 0);
	return id;
}

static int step_ok(struct gpud_sched *s, uint32_t dev)
{
	char err[SW_ERR_MAX] = "";
	int n = gpud_sched_step(s, dev, err, sizeof(err));

	if (n < 0)
		fail_msg("step: %s", err);
	return n;
}

static void assert_pool_empty(struct gpud_engine *e)
{
	struct gpud_engine_stats st;
	char err[SW_ERR_MAX] = "";

	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);
	gpud_engine_stats(e, &st);
	assert_int_equal(st.kv.used, 0);
	assert_int_equal(st.kv.seqs, 0);
}

/* Steps every device in turn until nothing is left; returns steps run. */
static long drain(struct gpud_sched *s, uint32_t n_dev, long *clock)
{
	long steps = 0;
	int any;

	do {
		any = 0;
		for (uint32_t d = 0; d < n_dev; d++) {
			int n = step_ok(s, d);
			any |= n;
			if (n) {
				steps++;
				if (clock)
					(*clock)++;
			}
		}
		assert_true(steps < 100000);
	} while (any);
	return steps;
}

/* --- tests ----------------------------------------------------------------- */

struct worker {
	struct gpud_sched *s;
	uint32_t dev;
	int total;
	int rc;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char err[SW_ERR_MAX];

	while (atomic_load(&n_done) < w->total) {
		int n = gpud_sched_step(w->s, w->dev, err, sizeof(err));
		if (n < 0) {
			w->rc = n;
			break;
		}
		if (!n)
			usleep(200); /* idle device */
	}
	return NULL;
}

/* Steps devices 0 and 1 of s, each from a thread of its own, until n_req
 * requests are done. */
static void run_workers(struct gpud_sched *s, uint32_t n_req)
{
	struct worker w[2];
	pthread_t th[2];

	for (int d = 0; d < 2; d++) {
		w[d] = (struct worker){ .s = s, .dev = (uint32_t)d, .total = (int)n_req };
		assert_int_equal(pthread_create(&th[d], NULL, worker_main, &w[d]), 0);
	}
	for (int d = 0; d < 2; d++) {
		pthread_join(th[d], NULL);
		assert_int_equal(w[d].rc, 0);
	}
}

/* Many requests on two engines, each stepped by its own thread, submitted
 * all at once: every output equals the solo generate text. */
static void test_concurrent_matches_solo(void **state)
{
	(void)state;
	uint32_t n_req = under_valgrind() ? 6 : N_PROMPTS, max_tok = under_valgrind() ? 12 : 40;
	struct gpud_engine *e[2] = { mk_engine(64, 8, 0), mk_engine(64, 8, 0) };
	struct gpud_engine *ref = mk_engine(512, 1, 0);
	struct gpud_sched *s = mk_sched(e, 2, 16, 0, 32);
	static struct res out[N_PROMPTS];
	static int32_t ids[N_PROMPTS][128];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;

	memset(out, 0, sizeof(out));
	atomic_store(&n_done, 0);
	for (uint32_t i = 0; i < n_req; i++) {
		uint32_t n = tokenize(prompts[i], ids[i], 128);
		req_init(&r, ids[i], n, max_tok, &out[i]);
		submit_ok(s, &r);
	}
	run_workers(s, n_req);
	for (uint32_t i = 0; i < n_req; i++) {
		struct sink want;
		struct gpud_gen_result gr;

		reference(ref, prompts[i], max_tok, &want, &gr);
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_int_equal(out[i].reason, gr.reason);
		assert_int_equal(out[i].usage.n_gen, gr.n_gen);
		assert_int_equal(out[i].usage.n_prompt, gr.n_prompt);
		assert_string_equal(out[i].text, want.buf);
	}
	gpud_sched_stats(s, &st);
	assert_int_equal(st.admitted, n_req);
	assert_int_equal(st.completed, n_req);
	assert_int_equal(st.in_flight, 0);
	assert_true(st.steps > 0);
	assert_true(st.generated >= n_req);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 0);
	assert_int_equal(gpud_sched_queue_depth(s, 1), 0);
	assert_pool_empty(e[0]);
	assert_pool_empty(e[1]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(ref);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* Sampling after the forward pass, outside the lock, by the device's
 * thread and sampling threads shared by two devices stepping at once: every
 * request (greedy, temperature, penalties) gets the tokens it gets with the
 * device's thread alone. Each device's batches depend only on its own
 * requests, so both runs see the same logits. */
static void sampling_run(uint32_t threads, struct res *out, uint32_t n_req, uint32_t max_tok)
{
	struct gpud_engine *e[2] = { mk_engine(64, 8, 0), mk_engine(64, 8, 0) };
	struct gpud_sched_params p;
	struct gpud_sched *s = NULL;
	static int32_t ids[N_PROMPTS][128];
	char err[SW_ERR_MAX] = "";
	struct gpud_sched_req r;

	gpud_sched_params_default(&p);
	p.max_requests = 16;
	p.sample_threads = threads;
	if (gpud_sched_create(&s, e, 2, &p, err, sizeof(err)))
		fail_msg("sched: %s", err);
	memset(out, 0, n_req * sizeof(*out));
	atomic_store(&n_done, 0);
	for (uint32_t i = 0; i < n_req; i++) {
		uint32_t n = tokenize(prompts[i], ids[i], 128);
		req_init(&r, ids[i], n, max_tok, &out[i]);
		r.pin_device = true;
		r.device = i % 2;
		if (i % 3) { /* two in three sample with a temperature */
			r.sampling.temperature = 1.5f;
			r.sampling.seed = 1000 + i;
			r.sampling.top_p = i % 3 == 2 ? 0.9f : 1.0f;
		}
		if (i % 4 == 3) { /* and some with penalties */
			r.sampling.penalty_last_n = 16;
			r.sampling.repeat_penalty = 1.3f;
		}
		submit_ok(s, &r);
	}
	run_workers(s, n_req);
	for (uint32_t i = 0; i < n_req; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
	}
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

static void test_sampling_threads(void **state)
{
	(void)state;
	uint32_t n_req = under_valgrind() ? 6 : N_PROMPTS, max_tok = under_valgrind() ? 12 : 40;
	static struct res one[N_PROMPTS], four[N_PROMPTS], autom[N_PROMPTS];
	struct gpud_engine *ref = mk_engine(512, 1, 0);
	uint32_t differ = 0;

	sampling_run(1, one, n_req, max_tok);
	sampling_run(4, four, n_req, max_tok);
	sampling_run(0, autom, n_req, max_tok); /* one per online CPU */
	for (uint32_t i = 0; i < n_req; i++) {
		assert_int_equal(one[i].n_ids, four[i].n_ids);
		assert_memory_equal(one[i].ids, four[i].ids, one[i].n_ids * sizeof(int32_t));
		assert_string_equal(one[i].text, four[i].text);
		assert_string_equal(one[i].text, autom[i].text);
	}
	/* the requests with a temperature did sample: not all greedy text */
	for (uint32_t i = 0; i < n_req; i++) {
		struct sink want;
		struct gpud_gen_result gr;

		if (i % 3 == 0)
			continue;
		reference(ref, prompts[i], max_tok, &want, &gr);
		differ += strcmp(want.buf, one[i].text) != 0;
	}
	assert_true(differ > 0);
	gpud_engine_destroy(ref);
}

/* New requests go where most blocks are free (counting what queued
 * prefills will take), then to the shorter queue. */
static void test_placement(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 8, 64), mk_engine(64, 8, 64) };
	struct gpud_engine *f[2] = { mk_engine(64, 8, 16), mk_engine(64, 8, 64) };
	struct gpud_sched *s = mk_sched(e, 2, 16, 0, 32), *t = mk_sched(f, 2, 16, 0, 32);
	static struct res out[12];
	int32_t ids[40];
	struct gpud_sched_req r;
	uint32_t n = tokenize(prompts[7], ids, 40);

	memset(out, 0, sizeof(out));
	/* equal devices: alternate */
	for (int i = 0; i < 6; i++) {
		req_init(&r, ids, n, 8, &out[i]);
		submit_ok(s, &r);
		assert_int_equal(gpud_sched_queue_depth(s, 0), (uint32_t)(i / 2 + 1));
		assert_int_equal(gpud_sched_queue_depth(s, 1), (uint32_t)((i + 1) / 2));
	}
	assert_int_equal(gpud_sched_queue_depth(s, 2), 0);
	/* device 1 owns four times the blocks: it takes them all */
	for (int i = 6; i < 12; i++) {
		req_init(&r, ids, n, 8, &out[i]);
		submit_ok(t, &r);
	}
	assert_int_equal(gpud_sched_queue_depth(t, 0), 0);
	assert_int_equal(gpud_sched_queue_depth(t, 1), 6);
	drain(s, 2, NULL);
	drain(t, 2, NULL);
	for (int i = 0; i < 12; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_string_equal(out[i].text, out[0].text);
	}
	for (int i = 0; i < 2; i++) {
		assert_pool_empty(e[i]);
		assert_pool_empty(f[i]);
	}
	gpud_sched_destroy(s);
	gpud_sched_destroy(t);
	for (int i = 0; i < 2; i++) {
		gpud_engine_destroy(e[i]);
		gpud_engine_destroy(f[i]);
	}
}

/* A prompt longer than max_batch_tokens is prefilled over several steps
 * and still gives the solo text. */
static void test_chunked_prefill(void **state)
{
	(void)state;
	const char *long_prompt =
		"Once upon a time, there was a little girl named Lily. She loved to play outside "
		"in the park. One day, she saw a big, red ball. She wanted to play with it, but it "
		"was too high. Lily asked her mom for help.";
	struct gpud_engine *e = mk_engine(64, 4, 0), *ref = mk_engine(512, 1, 0);
	struct gpud_sched *s = mk_sched(&e, 1, 4, 8, 32);
	static struct res out;
	int32_t ids[256];
	uint32_t n = tokenize(long_prompt, ids, 256);
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	struct sink want;
	struct gpud_gen_result gr;
	long steps;

	assert_true(n > 24);
	memset(&out, 0, sizeof(out));
	req_init(&r, ids, n, 10, &out);
	submit_ok(s, &r);
	steps = drain(s, 1, NULL);
	/* ceil(n / 8) prefill steps, then one per further token */
	assert_int_equal(steps, (n + 7) / 8 + 9);
	reference(ref, long_prompt, 10, &want, &gr);
	assert_true(out.done);
	assert_string_equal(out.text, want.buf);
	assert_int_equal(out.usage.n_gen, 10);
	assert_int_equal(out.reason, GPUD_STOP_MAX_TOKENS);
	gpud_sched_stats(s, &st);
	assert_int_equal(st.tokens, n + 9);
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_engine_destroy(ref);
	gpud_engine_destroy(e);
}

/* Requests that can never fit are refused with SW_ETOOLONG, bad ones
 * with -EINVAL, and the slot limit gives SW_EBUSY; nothing is queued. */
static void test_refusals(void **state)
{
	(void)state;
	struct gpud_engine *e = mk_engine(64, 4, 4); /* 4 blocks of 16 */
	struct gpud_sched *s = mk_sched(&e, 1, 2, 0, 32);
	uint32_t n_ctx = gpud_engine_params(e)->n_ctx;
	static struct res out[3];
	static int32_t ids[8192];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	char err[SW_ERR_MAX] = "";
	uint64_t id = 7;
	const char *const stops[] = { "" };

	assert_true(n_ctx > 64 && n_ctx <= 8192);
	memset(out, 0, sizeof(out));
	for (int i = 0; i < 8192; i++)
		ids[i] = 1 + i % 200;
	/* prompt + max_tokens beyond n_ctx */
	req_init(&r, ids, n_ctx - 4, 5, &out[0]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_ETOOLONG);
	assert_non_null(strstr(err, "context"));
	assert_int_equal(id, 0);
	/* 70 positions need 5 blocks; the device owns 4 */
	req_init(&r, ids, 60, 11, &out[0]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_ETOOLONG);
	assert_non_null(strstr(err, "KV blocks"));
	/* max_tokens 0 means until the context is full: more than 4 blocks */
	req_init(&r, ids, 3, 0, &out[0]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_ETOOLONG);
	/* invalid requests */
	req_init(&r, ids, 0, 4, &out[0]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	req_init(&r, ids, 3, 4, &out[0]);
	r.cb = NULL;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	ids[1] = 1 << 20;
	req_init(&r, ids, 3, 4, &out[0]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	ids[1] = 2;
	req_init(&r, ids, 3, 4, &out[0]);
	r.sampling.temperature = NAN;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	req_init(&r, ids, 3, 4, &out[0]);
	r.stop = stops;
	r.n_stop = 1;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 0);
	/* 63 positions fit exactly in 4 blocks (the last id is never written) */
	req_init(&r, ids, 60, 4, &out[0]);
	submit_ok(s, &r);
	req_init(&r, ids, 3, 4, &out[1]);
	submit_ok(s, &r);
	req_init(&r, ids, 3, 4, &out[2]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EBUSY);
	assert_non_null(strstr(err, "slots"));
	assert_int_equal(gpud_sched_queue_depth(s, 0), 2);
	gpud_sched_stats(s, &st);
	assert_int_equal(st.refused, 9);
	assert_int_equal(st.admitted, 2);
	drain(s, 1, NULL);
	assert_true(out[0].done && out[1].done && !out[2].done);
	assert_int_equal(out[0].status, 0);
	assert_int_equal(out[0].usage.n_gen, 4);
	assert_pool_empty(e);
	/* a slot is free again */
	req_init(&r, ids, 3, 4, &out[2]);
	submit_ok(s, &r);
	drain(s, 1, NULL);
	assert_true(out[2].done);
	assert_int_equal(gpud_sched_cancel(s, 12345), SW_ENOTFOUND);
	assert_int_equal(gpud_sched_step(s, 1, err, sizeof(err)), -EINVAL);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e);
}

/* The slot limit: with every slot taken a malformed or oversized request
 * still gets its own error, any other SW_EBUSY (even one with a bad stop
 * string: slots are checked first); a submit that fails after taking a
 * slot gives it back; cancelled and completed requests free their slots
 * for reuse, round after round, with fresh ids. */
static void test_slot_exhaustion_reuse(void **state)
{
	(void)state;
	enum { MAX_REQ = 3, ROUNDS = 20 };
	struct gpud_engine *e = mk_engine(64, 4, 0);
	struct gpud_sched *s = mk_sched(&e, 1, MAX_REQ, 0, 32);
	uint32_t n_ctx = gpud_engine_params(e)->n_ctx;
	static struct res out[MAX_REQ * (ROUNDS + 3)];
	static int32_t ids[8192];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	char err[SW_ERR_MAX] = "";
	uint64_t id = 7, got[MAX_REQ], last = 0;
	const char *const bad_stop[] = { "" };
	uint32_t k = 0;

	memset(out, 0, sizeof(out));
	for (int i = 0; i < 8192; i++)
		ids[i] = 1 + i % 200;
	for (int i = 0; i < MAX_REQ; i++) {
		req_init(&r, ids, 3, 4, &out[k++]);
		got[i] = submit_ok(s, &r);
		assert_true(got[i] > last);
		last = got[i];
	}
	req_init(&r, ids, 3, 4, &out[k]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EBUSY);
	assert_non_null(strstr(err, "slots"));
	assert_int_equal(id, 0);
	req_init(&r, ids, 0, 4, &out[k]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	req_init(&r, ids, n_ctx - 4, 5, &out[k]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_ETOOLONG);
	req_init(&r, ids, 3, 4, &out[k]);
	r.stop = bad_stop;
	r.n_stop = 1;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EBUSY);

	/* one slot free: a bad stop string takes it and gives it back */
	assert_int_equal(gpud_sched_cancel(s, got[1]), 0);
	assert_true(out[1].done);
	assert_int_equal(out[1].status, SW_ECANCELED);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "stop string"));
	assert_int_equal(id, 0);
	req_init(&r, ids, 3, 4, &out[k++]);
	got[1] = submit_ok(s, &r);
	assert_true(got[1] > last);
	last = got[1];
	req_init(&r, ids, 3, 4, &out[k]);
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EBUSY);
	assert_int_equal(gpud_sched_queue_depth(s, 0), MAX_REQ);

	/* rounds of cancel-all / refill: every slot comes back every time */
	for (int round = 0; round < ROUNDS; round++) {
		for (int i = 0; i < MAX_REQ; i++)
			assert_int_equal(gpud_sched_cancel(s, got[i]), 0);
		assert_int_equal(gpud_sched_cancel(s, got[0]), SW_ENOTFOUND);
		assert_int_equal(gpud_sched_queue_depth(s, 0), 0);
		for (int i = 0; i < MAX_REQ; i++) {
			req_init(&r, ids + round, 3, 4, &out[k++]);
			got[i] = submit_ok(s, &r);
			assert_true(got[i] > last);
			last = got[i];
		}
		req_init(&r, ids, 3, 4, &out[k]);
		assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EBUSY);
	}
	/* the last round runs to completion, and then its slots are free too */
	drain(s, 1, NULL);
	for (uint32_t i = 0; i < k; i++)
		assert_true(out[i].done);
	for (uint32_t i = k - MAX_REQ; i < k; i++) {
		assert_int_equal(out[i].status, 0);
		assert_int_equal(out[i].usage.n_gen, 4);
	}
	assert_pool_empty(e);
	for (int i = 0; i < MAX_REQ; i++) {
		req_init(&r, ids, 3, 1, &out[k++]);
		submit_ok(s, &r);
	}
	drain(s, 1, NULL);
	gpud_sched_stats(s, &st);
	assert_int_equal(st.admitted, k);
	assert_int_equal(st.completed, k);
	assert_int_equal(st.cancelled, 1 + MAX_REQ * ROUNDS);
	assert_int_equal(st.refused, 6 + ROUNDS);
	assert_int_equal(st.in_flight, 0);
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e);
}

struct submitter {
	struct gpud_sched *s;
	const int32_t *ids;
	uint32_t n_ids;
	struct res *out;  /* (n) */
	uint64_t *got;    /* (n) ids from submit */
	int n;
	int busy;         /* SW_EBUSY answers (retried) */
	int rc;
};

/* Submits n requests, retrying on SW_EBUSY, and cancels every third. */
static void *submitter_main(void *arg)
{
	struct submitter *t = arg;
	char err[SW_ERR_MAX];

	for (int i = 0; i < t->n; i++) {
		struct gpud_sched_req r;
		int rc;

		req_init(&r, t->ids, t->n_ids, 3, &t->out[i]);
		while ((rc = gpud_sched_submit(t->s, &r, &t->got[i], err, sizeof(err))) ==
		       SW_EBUSY) {
			t->busy++;
			usleep(100);
		}
		if (rc) {
			t->rc = rc;
			return NULL;
		}
		if (i % 3 == 2) {
			rc = gpud_sched_cancel(t->s, t->got[i]);
			if (rc && rc != SW_ENOTFOUND) { /* ENOTFOUND: it ended first */
				t->rc = rc;
				return NULL;
			}
		}
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Several threads submit and cancel at once against fewer slots than
 * requests while two device threads step: every request is admitted once
 * with a unique id and ends once; the slots all come back. */
static void test_concurrent_submit(void **state)
{
	(void)state;
	enum { N_SUB = 4, MAX_REQ = 5 };
	int per = under_valgrind() ? 6 : 40;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 0), mk_engine(64, 4, 0) };
	struct gpud_sched *s = mk_sched(e, 2, MAX_REQ, 0, 32);
	static struct res out[N_SUB][40];
	static uint64_t got[N_SUB * 40];
	static int32_t ids[N_SUB][64];
	struct submitter sub[N_SUB];
	pthread_t th[N_SUB], dth[2];
	struct worker w[2];
	struct gpud_sched_stats st;
	int busy = 0;

	memset(out, 0, sizeof(out));
	atomic_store(&n_done, 0);
	for (int d = 0; d < 2; d++) {
		w[d] = (struct worker){ .s = s, .dev = (uint32_t)d, .total = N_SUB * per };
		assert_int_equal(pthread_create(&dth[d], NULL, worker_main, &w[d]), 0);
	}
	for (int i = 0; i < N_SUB; i++) {
		sub[i] = (struct submitter){
			.s = s, .ids = ids[i], .n_ids = tokenize(prompts[i], ids[i], 64),
			.out = out[i], .got = got + i * per, .n = per,
		};
		assert_int_equal(pthread_create(&th[i], NULL, submitter_main, &sub[i]), 0);
	}
	for (int i = 0; i < N_SUB; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(sub[i].rc, 0);
		busy += sub[i].busy;
	}
	for (int d = 0; d < 2; d++) {
		pthread_join(dth[d], NULL);
		assert_int_equal(w[d].rc, 0);
	}
	for (int i = 0; i < N_SUB; i++)
		for (int j = 0; j < per; j++) {
			assert_true(out[i][j].done);
			if (j % 3 != 2)
				assert_int_equal(out[i][j].status, 0);
		}
	qsort(got, (size_t)(N_SUB * per), sizeof(got[0]), cmp_u64);
	for (int i = 0; i < N_SUB * per; i++)
		assert_true(got[i] != 0 && (i == 0 || got[i] != got[i - 1]));
	gpud_sched_stats(s, &st);
	assert_int_equal(st.admitted, N_SUB * per);
	assert_int_equal(st.completed, N_SUB * per);
	assert_int_equal(st.refused, busy);
	assert_int_equal(st.in_flight, 0);
	print_message("%d submits answered SW_EBUSY and retried\n", busy);
	/* every slot is free again */
	for (int i = 0; i < MAX_REQ; i++) {
		struct gpud_sched_req r;

		memset(&out[0][i], 0, sizeof(out[0][i]));
		req_init(&r, ids[0], sub[0].n_ids, 1, &out[0][i]);
		submit_ok(s, &r);
	}
	drain(s, 2, NULL);
	assert_pool_empty(e[0]);
	assert_pool_empty(e[1]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* Cancel mid-generation frees the KV blocks at once and completes the
 * request with SW_ECANCELED; cancelling a waiting request works too. */
static void test_cancel(void **state)
{
	(void)state;
	struct gpud_engine *e = mk_engine(64, 1, 0);
	struct gpud_sched *s = mk_sched(&e, 1, 4, 0, 32);
	static struct res out[2];
	int32_t ids[64];
	uint32_t n = tokenize(prompts[7], ids, 64);
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	struct gpud_engine_stats es;
	uint64_t a, b;

	memset(out, 0, sizeof(out));
	req_init(&r, ids, n, 100, &out[0]);
	a = submit_ok(s, &r);
	req_init(&r, ids, n, 100, &out[1]);
	b = submit_ok(s, &r); /* waits: the engine has one sequence slot */
	for (int i = 0; i < 5; i++)
		assert_int_equal(step_ok(s, 0), 1);
	assert_int_equal(out[0].n_ids, 5);
	gpud_engine_stats(e, &es);
	assert_true(es.kv.used > 0);
	assert_int_equal(gpud_sched_cancel(s, a), 0);
	assert_true(out[0].done);
	assert_int_equal(out[0].status, SW_ECANCELED);
	assert_int_equal(out[0].usage.n_gen, 5);
	assert_pool_empty(e);
	assert_int_equal(gpud_sched_cancel(s, a), SW_ENOTFOUND);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 1);
	assert_int_equal(gpud_sched_cancel(s, b), 0);
	assert_true(out[1].done);
	assert_int_equal(out[1].status, SW_ECANCELED);
	assert_int_equal(out[1].n_ids, 0);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 0);
	assert_int_equal(step_ok(s, 0), 0);
	gpud_sched_stats(s, &st);
	assert_int_equal(st.cancelled, 2);
	assert_int_equal(st.in_flight, 0);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e);
}

/* A callback that returns non-zero ends its request. */
static void test_caller_stop(void **state)
{
	(void)state;
	struct gpud_engine *e = mk_engine(64, 4, 0);
	struct gpud_sched *s = mk_sched(&e, 1, 4, 0, 32);
	static struct res out;
	int32_t ids[64];
	uint32_t n = tokenize(prompts[0], ids, 64);
	struct gpud_sched_req r;

	memset(&out, 0, sizeof(out));
	out.stop_after = 3;
	req_init(&r, ids, n, 50, &out);
	submit_ok(s, &r);
	drain(s, 1, NULL);
	assert_true(out.done);
	assert_int_equal(out.status, 0);
	assert_int_equal(out.reason, GPUD_GEN_STOP_CALLER);
	assert_int_equal(out.n_ids, 3);
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e);
}

/* A tiny KV pool forces preemption by recompute; the greedy outputs are
 * still exactly those of solo runs. */
static void test_preemption(void **state)
{
	(void)state;
	uint32_t n_req = under_valgrind() ? 3 : 6, max_tok = 40;
	/* 8 blocks of 16 = 128 positions; each request grows to ~50 */
	struct gpud_engine *e = mk_engine(64, 8, 8), *ref = mk_engine(512, 1, 0);
	struct gpud_sched *s = mk_sched(&e, 1, 8, 0, 32);
	static struct res out[N_PROMPTS];
	static int32_t ids[N_PROMPTS][64];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	uint32_t preempted = 0;

	memset(out, 0, sizeof(out));
	for (uint32_t i = 0; i < n_req; i++) {
		uint32_t n = tokenize(prompts[i], ids[i], 64);
		req_init(&r, ids[i], n, max_tok, &out[i]);
		submit_ok(s, &r);
	}
	drain(s, 1, NULL);
	gpud_sched_stats(s, &st);
	assert_true(st.preemptions > 0);
	for (uint32_t i = 0; i < n_req; i++) {
		struct sink want;
		struct gpud_gen_result gr;

		reference(ref, prompts[i], max_tok, &want, &gr);
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_int_equal(out[i].usage.n_gen, gr.n_gen);
		assert_string_equal(out[i].text, want.buf);
		preempted += out[i].usage.n_preempt;
	}
	assert_int_equal(preempted, st.preemptions);
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_engine_destroy(ref);
	gpud_engine_destroy(e);
}

/* The prompt's log probabilities under preemption (a tiny pool, chunks of
 * 1 + 4 spare rows): each prompt token's comes once, in order, before the
 * first generated token, with the number a roomy solo run gives it; the
 * generated text is the solo run's. */
static void test_prompt_logprobs_preempt(void **state)
{
	(void)state;
	uint32_t n_req = under_valgrind() ? 3 : 6, max_tok = 40;
	/* 8 blocks of 16, 4 spare rows; the reference roomy, 64 spare rows */
	struct gpud_engine *e = mk_engine_rows(64, 8, 8, 4), *ref = mk_engine_rows(512, 1, 0, 64);
	static struct res out[N_PROMPTS], solo;
	static int32_t ids[N_PROMPTS][64];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	struct gpud_sched *s, *sr;

	s = mk_sched(&e, 1, 8, 0, 32);
	sr = mk_sched(&ref, 1, 1, 0, 0);
	memset(out, 0, sizeof(out));
	for (uint32_t i = 0; i < n_req; i++) {
		uint32_t n = tokenize(prompts[(i * 5 + 7) % N_PROMPTS], ids[i], 64);
		req_init(&r, ids[i], n, max_tok, &out[i]);
		r.logprobs = true;
		r.prompt_logprobs = true;
		submit_ok(s, &r);
	}
	drain(s, 1, NULL);
	gpud_sched_stats(s, &st);
	assert_true(st.preemptions > 0);
	for (uint32_t i = 0; i < n_req; i++) {
		uint32_t n = tokenize(prompts[(i * 5 + 7) % N_PROMPTS], ids[i], 64);

		memset(&solo, 0, sizeof(solo));
		req_init(&r, ids[i], n, max_tok, &solo);
		r.logprobs = true;
		r.prompt_logprobs = true;
		submit_ok(sr, &r);
		drain(sr, 1, NULL);
		assert_true(out[i].done && solo.done);
		assert_int_equal(out[i].status, 0);
		assert_int_equal(out[i].np, n);
		assert_false(out[i].prompt_after_token);
		for (uint32_t k = 0; k < n; k++) {
			assert_int_equal(out[i].ppos[k], k);
			if (k == 0)
				assert_true(isnan(out[i].plp[0]));
			else
				assert_true(fabsf(out[i].plp[k] - solo.plp[k]) < 1e-5f);
		}
		assert_string_equal(out[i].text, solo.text);
	}
	printf("prompt logprobs under %llu preemptions: every prompt token once, in order, as "
	       "solo\n", (unsigned long long)st.preemptions);
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_sched_destroy(sr);
	gpud_engine_destroy(ref);
	gpud_engine_destroy(e);
}

/* One run of the aging scenario: A holds most of the pool, B (big) cannot
 * fit until A is done, small requests C keep arriving after B. Returns
 * how many C submitted 3 or more steps after B got their first token in
 * an earlier step than B. */
static int aging_run(uint32_t aging)
{
	struct gpud_engine *e = mk_engine(128, 8, 10); /* 10 blocks of 16 */
	struct gpud_sched *s = mk_sched(&e, 1, 16, 0, aging);
	static struct res a, b, c[8];
	static int32_t ids[128];
	bool judged[8];
	struct gpud_sched_req r;
	long clock = 0, b_at;
	int bypass = 0;

	for (int i = 0; i < 128; i++)
		ids[i] = 1 + (i * 37) % 300;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	memset(c, 0, sizeof(c));
	a.step_clock = b.step_clock = &clock;
	req_init(&r, ids, 80, 40, &a); /* 5 blocks now, up to 8 */
	submit_ok(s, &r);
	clock += step_ok(s, 0) > 0;
	req_init(&r, ids, 90, 2, &b); /* 6 blocks: does not fit next to A */
	submit_ok(s, &r);
	b_at = clock;
	for (int i = 0; i < 8; i++) {
		judged[i] = clock >= b_at + 3;
		c[i].step_clock = &clock;
		req_init(&r, ids + 100, 5, 3, &c[i]); /* one block */
		submit_ok(s, &r);
		clock += step_ok(s, 0) > 0;
		clock += step_ok(s, 0) > 0;
	}
	drain(s, 1, &clock);
	assert_true(a.done && b.done);
	assert_int_equal(a.status, 0);
	assert_int_equal(b.status, 0);
	for (int i = 0; i < 8; i++) {
		assert_true(c[i].done);
		assert_int_equal(c[i].status, 0);
		if (judged[i] && c[i].first_step < b.first_step)
			bypass++;
	}
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e);
	return bypass;
}

static void test_aging(void **state)
{
	(void)state;
	/* Without effective aging later small requests overtake B ... */
	assert_true(aging_run(100000) > 0);
	/* ... with it, none that arrives after B has aged does. */
	assert_int_equal(aging_run(3), 0);
}

/* A request with a compiled mask (segment 1 does not see segment 0):
 * solo on a roomy pool and four copies preempted on a tiny pool give the
 * same text; a mask for another block size is refused. */
static void test_mask_preempt(void **state)
{
	(void)state;
	const char *text = "Lily and Ben went to the park. The sun was shining and";
	static int32_t ids[64];
	uint32_t n = tokenize(text, ids, 64), lens[2] = { 6, n - 6 };
	struct proto_mask_row rows[3];
	uint16_t r0[] = { 0 }, r1[] = { 1 }, r2[] = { 0, 1, 2 };
	struct proto_mask_desc desc = { .n_segments = 2, .rows = rows };
	static _Alignas(16) uint8_t mem[2][4096];
	struct gpud_mask mask, mask8;
	struct gpud_engine *big = mk_engine(64, 4, 0), *tiny = mk_engine(64, 4, 8);
	struct gpud_sched *s1 = mk_sched(&big, 1, 4, 0, 32), *s2 = mk_sched(&tiny, 1, 8, 0, 32);
	static struct res solo, plain, out[4];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	char err[SW_ERR_MAX] = "";
	uint64_t id;

	rows[0] = (struct proto_mask_row){ r0, 1 };
	rows[1] = (struct proto_mask_row){ r1, 1 };
	rows[2] = (struct proto_mask_row){ r2, 3 };
	assert_true(n > 10 && gpud_mask_bytes(2, n, 16) <= sizeof(mem[0]));
	assert_int_equal(gpud_mask_compile(&desc, lens, 16, mem[0], sizeof(mem[0]), &mask), 0);
	assert_int_equal(gpud_mask_compile(&desc, lens, 8, mem[1], sizeof(mem[1]), &mask8), 0);
	assert_false(mask.causal);
	memset(&solo, 0, sizeof(solo));
	memset(&plain, 0, sizeof(plain));
	memset(out, 0, sizeof(out));
	req_init(&r, ids, n, 40, &solo);
	r.mask = &mask;
	submit_ok(s1, &r);
	req_init(&r, ids, n, 40, &plain);
	submit_ok(s1, &r);
	drain(s1, 1, NULL);
	assert_true(solo.done && plain.done);
	assert_string_not_equal(solo.text, plain.text); /* the mask matters */
	for (int i = 0; i < 4; i++) {
		req_init(&r, ids, n, 40, &out[i]);
		r.mask = &mask;
		submit_ok(s2, &r);
	}
	drain(s2, 1, NULL);
	gpud_sched_stats(s2, &st);
	assert_true(st.preemptions > 0);
	for (int i = 0; i < 4; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_string_equal(out[i].text, solo.text);
	}
	req_init(&r, ids, n, 40, &out[0]);
	r.mask = &mask8;
	assert_int_equal(gpud_sched_submit(s2, &r, &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "block"));
	req_init(&r, ids, n - 1, 40, &out[0]);
	r.mask = &mask;
	assert_int_equal(gpud_sched_submit(s2, &r, &id, err, sizeof(err)), -EINVAL);
	assert_pool_empty(big);
	assert_pool_empty(tiny);
	gpud_sched_destroy(s1);
	gpud_sched_destroy(s2);
	gpud_engine_destroy(big);
	gpud_engine_destroy(tiny);
}

/* Submits and a cancel from this thread while two device threads step:
 * the cancelled request ends with SW_ECANCELED, the others complete, the
 * pools end empty. */
static void test_threaded_cancel(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 0), mk_engine(64, 4, 0) };
	struct gpud_sched *s = mk_sched(e, 2, 8, 0, 32);
	static struct res out[6];
	static int32_t ids[6][64];
	struct gpud_sched_req r;
	struct worker w[2];
	pthread_t th[2];
	uint64_t victim = 0;
	int rc;

	memset(out, 0, sizeof(out));
	atomic_store(&n_done, 0);
	for (int i = 0; i < 6; i++) {
		uint32_t n = tokenize(prompts[i], ids[i], 64);
		req_init(&r, ids[i], n, i == 0 ? (under_valgrind() ? 100 : 400) : 12, &out[i]);
		out[i].slow_us = i == 0 ? 20000 : 0;
		if (i == 0)
			victim = submit_ok(s, &r);
		else
			submit_ok(s, &r);
		if (i == 2)
			for (int d = 0; d < 2; d++) {
				w[d] = (struct worker){ .s = s, .dev = (uint32_t)d, .total = 6 };
				assert_int_equal(pthread_create(&th[d], NULL, worker_main, &w[d]),
						 0);
			}
	}
	/* The victim sleeps 20 ms per token on its device thread, so it is
	 * normally still running when it has streamed 3 tokens. */
	while (__atomic_load_n(&out[0].n_ids, __ATOMIC_ACQUIRE) < 3)
		usleep(500);
	rc = gpud_sched_cancel(s, victim);
	for (int d = 0; d < 2; d++) {
		pthread_join(th[d], NULL);
		assert_int_equal(w[d].rc, 0);
	}
	assert_true(out[0].done);
	if (rc == SW_ENOTFOUND) {
		/* it ended (EOG) before this thread got to cancel it */
		print_message("victim finished before the cancel (%u tokens)\n",
			      out[0].usage.n_gen);
		assert_int_equal(out[0].status, 0);
	} else {
		assert_int_equal(rc, 0);
		assert_int_equal(out[0].status, SW_ECANCELED);
	}
	assert_true(out[0].usage.n_gen >= 3);
	for (int i = 1; i < 6; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_int_equal(out[i].usage.n_gen, 12);
	}
	assert_pool_empty(e[0]);
	assert_pool_empty(e[1]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* After creation, submit / step / cancel / completion allocate nothing. */
static void test_no_alloc(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 8), mk_engine(64, 4, 8) };
	struct gpud_sched *s = mk_sched(e, 2, 8, 16, 4);
	static struct res out[8];
	static int32_t ids[4][64];
	uint32_t n[4];
	struct gpud_sched_req r;
	struct gpud_sched_stats st;
	const char *const stops[] = { "zzz" };
	uint64_t id;

	for (int i = 0; i < 4; i++)
		n[i] = tokenize(prompts[i + 4], ids[i], 64);
	memset(out, 0, sizeof(out));
	assert_true(gpud_alloc_hook_linked());
	uint64_t allocs = gpud_alloc_host_allocs();
	for (int i = 0; i < 8; i++) {
		req_init(&r, ids[i % 4], n[i % 4], 30, &out[i]);
		r.stop = stops;
		r.n_stop = 1;
		id = submit_ok(s, &r);
		if (i == 5)
			assert_int_equal(gpud_sched_cancel(s, id), 0);
		step_ok(s, (uint32_t)i % 2);
	}
	drain(s, 2, NULL);
	assert_int_equal(gpud_alloc_host_allocs() - allocs, 0);
	gpud_sched_stats(s, &st);
	assert_int_equal(st.completed, 8);
	assert_int_equal(st.cancelled, 1);
	assert_true(st.preemptions > 0); /* 8 blocks for 4 x ~3 blocks */
	for (int i = 0; i < 2; i++) {
		struct gpud_engine_stats es;
		gpud_engine_stats(e[i], &es);
		assert_int_equal(es.allocs_after_warmup, 0);
		assert_pool_empty(e[i]);
	}
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* Pinned requests go to their device; a bad pin is -EINVAL; pick_device
 * follows the placement rule (most free blocks after queued prefills). */
static void test_pinned(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 8, 64), mk_engine(64, 8, 64) };
	struct gpud_sched *s = mk_sched(e, 2, 16, 0, 32);
	static struct res out[5];
	int32_t ids[40];
	uint32_t n = tokenize(prompts[7], ids, 40);
	struct gpud_sched_req r;
	char err[SW_ERR_MAX] = "";
	uint64_t id = 9;

	memset(out, 0, sizeof(out));
	assert_int_equal(gpud_sched_pick_device(s, NULL, n, 8, NULL, NULL), 0); /* equal: the first */
	for (int i = 0; i < 3; i++) {
		req_init(&r, ids, n, 8, &out[i]);
		r.pin_device = true;
		r.device = 1;
		submit_ok(s, &r);
	}
	assert_int_equal(gpud_sched_queue_depth(s, 0), 0);
	assert_int_equal(gpud_sched_queue_depth(s, 1), 3);
	/* device 1's queued prefills take blocks: device 0 is chosen */
	assert_int_equal(gpud_sched_pick_device(s, NULL, n, 8, NULL, NULL), 0);
	req_init(&r, ids, n, 8, &out[3]);
	r.pin_device = true;
	r.device = 2;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), -EINVAL);
	assert_int_equal(id, 0);
	assert_non_null(strstr(err, "device"));
	/* pinned to a device it cannot fit: the pinned device's refusal */
	req_init(&r, ids, n, 64 * 16, &out[3]);
	r.pin_device = true;
	r.device = 0;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_ETOOLONG);
	/* unpinned goes to device 0 now */
	req_init(&r, ids, n, 8, &out[3]);
	submit_ok(s, &r);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 1);
	/* pinned to the fuller device still goes there */
	req_init(&r, ids, n, 8, &out[4]);
	r.pin_device = true;
	r.device = 1;
	submit_ok(s, &r);
	assert_int_equal(gpud_sched_queue_depth(s, 1), 4);
	assert_int_equal(gpud_sched_pick_device(s, NULL, n, 8, NULL, NULL), 0);
	drain(s, 2, NULL);
	for (int i = 0; i < 5; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_string_equal(out[i].text, out[0].text);
	}
	assert_pool_empty(e[0]);
	assert_pool_empty(e[1]);
	free_sched2(s, e);
}

struct waiter {
	struct gpud_sched *s;
	uint32_t dev;
	atomic_int entered;
	atomic_int returned;
	uint32_t depth_after; /* queue depth seen when wait returned */
};

static void *waiter_main(void *arg)
{
	struct waiter *w = arg;

	atomic_store(&w->entered, 1);
	/* A lost wake-up would hang here past the test timeout. */
	gpud_sched_wait(w->s, w->dev, 3600 * 1000);
	w->depth_after = gpud_sched_queue_depth(w->s, w->dev);
	atomic_store(&w->returned, 1);
	return NULL;
}

/* A device thread waiting on an idle device returns when a request is
 * placed on it, or on gpud_sched_wake; it returns at once when the device
 * already has work. */
static void test_wait_wake(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 0), mk_engine(64, 4, 0) };
	struct gpud_sched *s = mk_sched(e, 2, 8, 0, 32);
	static struct res out;
	int32_t ids[40];
	uint32_t n = tokenize(prompts[1], ids, 40);
	struct gpud_sched_req r;
	struct waiter w = { .s = s, .dev = 1 }, w2 = { .s = s, .dev = 0 };
	pthread_t th;

	memset(&out, 0, sizeof(out));
	gpud_sched_wait(s, 0, 0);  /* idle, no timeout: returns */
	gpud_sched_wait(s, 7, 10); /* bad device: returns */
	assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
	while (!atomic_load(&w.entered))
		usleep(100);
	usleep(20000);
	assert_false(atomic_load(&w.returned)); /* idle device: still waiting */
	req_init(&r, ids, n, 4, &out);
	r.pin_device = true;
	r.device = 1;
	submit_ok(s, &r);
	pthread_join(th, NULL);
	assert_int_equal(w.depth_after, 1); /* woken by the submit, not before it */
	/* work queued: returns at once */
	gpud_sched_wait(s, 1, 3600 * 1000);
	drain(s, 2, NULL);
	assert_true(out.done);
	/* wake (shutdown) releases an idle waiter */
	assert_int_equal(pthread_create(&th, NULL, waiter_main, &w2), 0);
	while (!atomic_load(&w2.entered))
		usleep(100);
	usleep(20000);
	assert_false(atomic_load(&w2.returned)); /* idle device: still waiting */
	gpud_sched_wake(s);
	pthread_join(th, NULL);
	assert_int_equal(w2.depth_after, 0);
	/* a wake while nobody waits is remembered: the next wait returns at
	 * once (a stop flag set before the wake is never missed) */
	gpud_sched_wake(s);
	gpud_sched_wait(s, 0, 3600 * 1000);
	gpud_sched_wait(s, 1, 3600 * 1000);
	assert_pool_empty(e[0]);
	assert_pool_empty(e[1]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

struct exec_ctx {
	struct gpud_sched *s;
	uint64_t victim;
	struct res *victim_out;
	const int32_t *ids;
	uint32_t n;
	float emb[512];
	int cancel_rc, step_rc, nested_rc;
	bool victim_done_inside;
	uint32_t free_inside;
};

static int nested_fn(struct gpud_engine *e, void *arg)
{
	(void)e;
	(void)arg;
	return 1234;
}

static int exec_fn(struct gpud_engine *e, void *arg)
{
	struct exec_ctx *c = arg;
	char err[SW_ERR_MAX] = "";
	int rc;

	/* The cancel arrives while the device is in exclusive use: deferred. */
	c->cancel_rc = gpud_sched_cancel(c->s, c->victim);
	c->victim_done_inside = c->victim_out->done;
	c->step_rc = gpud_sched_step(c->s, 0, err, sizeof(err));
	c->nested_rc = gpud_sched_device_exec(c->s, 0, nested_fn, NULL);
	c->free_inside = gpud_engine_free_blocks(e);
	rc = gpud_engine_embed_tokens(e, c->ids, c->n, c->emb, err, sizeof(err));
	if (rc)
		print_message("embed: %s\n", err);
	return rc ? rc : 77;
}

static int embed_fn(struct gpud_engine *e, void *arg)
{
	struct exec_ctx *c = arg;
	char err[SW_ERR_MAX] = "";
	int rc = gpud_engine_embed_tokens(e, c->ids, c->n, c->emb, err, sizeof(err));

	if (rc)
		print_message("embed: %s\n", err);
	return rc;
}

/* gpud_sched_device_exec runs an embedding on the device's engine while
 * requests are in flight; a cancel arriving meanwhile completes after it
 * (KV back), a step meanwhile is SW_EBUSY, the others finish as solo. */
static void test_device_exec(void **state)
{
	(void)state;
	struct gpud_engine *e = mk_engine(64, 4, 0), *ref = mk_engine(64, 4, 0);
	struct gpud_sched *s = mk_sched(&e, 1, 4, 0, 32);
	static struct res out[2];
	static struct exec_ctx c;
	int32_t ids[2][64];
	uint32_t n[2];
	struct gpud_sched_req r;
	struct gpud_engine_stats es;
	float want[512];
	char err[SW_ERR_MAX] = "";
	uint32_t dim = gpud_engine_dim(e);
	struct sink solo;
	struct gpud_gen_result gr;

	assert_true(dim <= 512);
	memset(out, 0, sizeof(out));
	memset(&c, 0, sizeof(c));
	for (int i = 0; i < 2; i++) {
		n[i] = tokenize(prompts[i + 2], ids[i], 64);
		req_init(&r, ids[i], n[i], 20, &out[i]);
		if (i == 0)
			c.victim = submit_ok(s, &r);
		else
			submit_ok(s, &r);
	}
	for (int i = 0; i < 3; i++)
		assert_true(step_ok(s, 0) > 0);
	c.s = s;
	c.victim_out = &out[0];
	c.ids = ids[1];
	c.n = n[1];
	assert_int_equal(gpud_sched_device_exec(s, 0, exec_fn, &c), 77);
	assert_int_equal(c.cancel_rc, 0);
	assert_false(c.victim_done_inside);
	assert_int_equal(c.step_rc, SW_EBUSY);
	assert_int_equal(c.nested_rc, SW_EBUSY);
	/* the victim completed right after, its blocks are back */
	assert_true(out[0].done);
	assert_int_equal(out[0].status, SW_ECANCELED);
	assert_int_equal(out[0].usage.n_gen, 3);
	gpud_engine_stats(e, &es);
	assert_int_equal(es.kv.seqs, 1);
	assert_true(gpud_engine_free_blocks(e) > c.free_inside);
	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);
	/* the embedding is the one a fresh engine gives */
	assert_int_equal(gpud_engine_embed_tokens(ref, ids[1], n[1], want, err, sizeof(err)), 0);
	for (uint32_t i = 0; i < dim; i++)
		assert_true(fabsf(want[i] - c.emb[i]) <= 1e-6f);
	assert_int_equal(gpud_sched_device_exec(s, 1, nested_fn, NULL), -EINVAL);
	assert_int_equal(gpud_sched_device_exec(s, 0, nested_fn, NULL), 1234);
	drain(s, 1, NULL);
	assert_true(out[1].done);
	assert_int_equal(out[1].status, 0);
	reference(ref, prompts[3], 20, &solo, &gr);
	assert_string_equal(out[1].text, solo.buf);
	assert_pool_empty(e);
	gpud_sched_destroy(s);
	gpud_engine_destroy(ref);
	gpud_engine_destroy(e);
}

struct owners {
	uint32_t n_calls, n_free, n_req, next;
	uint64_t ids[4];
	uint32_t per_id[4];
	bool bad;
};

static void owner_fn(void *arg, uint32_t block, const char *kind, uint64_t id)
{
	struct owners *o = arg;

	if (block != o->next++)
		o->bad = true;
	o->n_calls++;
	if (!strcmp(kind, "free")) {
		o->n_free++;
		return;
	}
	if (strcmp(kind, "request")) {
		o->bad = true;
		return;
	}
	o->n_req++;
	for (int i = 0; i < 4; i++)
		if (o->ids[i] == id)
			o->per_id[i]++;
}

/* Device stats and the block owner dump agree with the engine's KV stats. */
static void test_stats_owners(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 32), mk_engine(64, 4, 32) };
	struct gpud_sched *s = mk_sched(e, 2, 8, 0, 32);
	static struct res out[3];
	int32_t ids[3][64];
	uint32_t n[3];
	struct gpud_sched_req r;
	struct gpud_sched_device_stats ds, ds1;
	struct gpud_sched_stats st;
	struct gpud_engine_stats es;
	struct owners o;
	int steps = 0;

	memset(out, 0, sizeof(out));
	memset(&o, 0, sizeof(o));
	for (int i = 0; i < 3; i++) {
		n[i] = tokenize(prompts[7 + i], ids[i], 64);
		req_init(&r, ids[i], n[i], 10, &out[i]);
		r.pin_device = true;
		r.device = 0;
		o.ids[i] = submit_ok(s, &r);
	}
	assert_int_equal(gpud_sched_device_stats(s, 2, &ds), -EINVAL);
	assert_int_equal(gpud_sched_block_owners(s, 2, owner_fn, &o), -EINVAL);
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(ds.queue, 3);
	assert_int_equal(ds.running, 0);
	assert_int_equal(ds.steps, 0);
	for (int i = 0; i < 4; i++)
		steps += step_ok(s, 0) > 0;
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(ds.queue, 3);
	assert_int_equal(ds.running, 3);
	assert_int_equal(ds.steps, (uint64_t)steps);
	assert_int_equal(ds.generated, 3 * 4);
	assert_int_equal(ds.tokens, n[0] + n[1] + n[2] + 3 * 3);
	assert_int_equal(ds.prefix_hits, 0);
	assert_int_equal(ds.prefix_blocks, 0);
	assert_int_equal(gpud_sched_block_owners(s, 0, owner_fn, &o), 0);
	gpud_engine_stats(e[0], &es);
	assert_false(o.bad);
	assert_int_equal(o.n_calls, 32);
	assert_int_equal(o.n_free, es.kv.free);
	assert_int_equal(o.n_req, es.kv.used);
	for (int i = 0; i < 3; i++)
		assert_int_equal(o.per_id[i], (n[i] + 4 + 15) / 16);
	drain(s, 2, NULL);
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(gpud_sched_device_stats(s, 1, &ds1), 0);
	gpud_sched_stats(s, &st);
	assert_int_equal(ds.queue, 0);
	assert_int_equal(ds.steps + ds1.steps, st.steps);
	assert_int_equal(ds.generated, st.generated);
	assert_int_equal(ds.tokens, st.tokens);
	assert_int_equal(ds1.steps, 0);
	memset(&o, 0, sizeof(o));
	assert_int_equal(gpud_sched_block_owners(s, 0, owner_fn, &o), 0);
	assert_int_equal(o.n_free, 32);
	assert_pool_empty(e[0]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* --- prefix KV cache ------------------------------------------------------- */

static struct gpud_sched *mk_sched_pfx(struct gpud_engine **e, uint32_t n, uint32_t max_req,
				       size_t pfx_bytes)
{
	struct gpud_sched_params p;
	struct gpud_sched *s = NULL;
	char err[SW_ERR_MAX] = "";

	gpud_sched_params_default(&p);
	p.max_requests = max_req;
	p.prefix_cache_bytes = pfx_bytes;
	if (gpud_sched_create(&s, e, n, &p, err, sizeof(err)))
		fail_msg("sched: %s", err);
	return s;
}

static const char *const sys_prompt =
	"Once upon a time, there was a little girl named Lily. She loved to play outside in "
	"the park with her friends. One day, ";

struct owner_count {
	uint32_t free, request, prefix, shared, chunk;
};

static void count_owner(void *arg, uint32_t block, const char *kind, uint64_t id)
{
	struct owner_count *c = arg;

	(void)block;
	(void)id;
	if (!strcmp(kind, "free"))
		c->free++;
	else if (!strcmp(kind, "request"))
		c->request++;
	else if (!strcmp(kind, "prefix"))
		c->prefix++;
	else if (!strcmp(kind, "shared"))
		c->shared++;
	else if (!strcmp(kind, "chunk"))
		c->chunk++;
	else
		fail_msg("kind %s", kind);
}

/* Idle device with the prefix cache on: every used block is held by the
 * cache alone, the accounting checks, the owner dump agrees. */
static void assert_pool_cache_only(struct gpud_sched *s, uint32_t dev, struct gpud_engine *e)
{
	struct gpud_engine_stats es;
	struct gpud_sched_device_stats ds;
	struct owner_count c = { 0 };
	char err[SW_ERR_MAX] = "";

	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);
	gpud_engine_stats(e, &es);
	assert_int_equal(gpud_sched_device_stats(s, dev, &ds), 0);
	assert_int_equal(es.kv.seqs, 0);
	assert_int_equal(es.kv.used, ds.prefix_blocks);
	assert_int_equal(ds.prefix_unreferenced, ds.prefix_blocks);
	assert_int_equal(es.kv.used + es.kv.free, es.kv.n_blocks);
	assert_true(ds.prefix_bytes <= ds.prefix_max_bytes);
	assert_int_equal(gpud_sched_block_owners(s, dev, count_owner, &c), 0);
	assert_int_equal(c.prefix, ds.prefix_blocks);
	assert_int_equal(c.free, es.kv.free);
	assert_int_equal(c.request + c.shared, 0);
}

/* One request through sched s (drained alone); the ids and text land in out. */
static void run_one(struct gpud_sched *s, const int32_t *ids, uint32_t n,
		    const struct gpud_mask *mask, uint32_t max_tok, struct res *out)
{
	struct gpud_sched_req r;

	memset(out, 0, sizeof(*out));
	req_init(&r, ids, n, max_tok, out);
	r.mask = mask;
	submit_ok(s, &r);
	drain(s, 1, NULL);
	assert_true(out->done);
	assert_int_equal(out->status, 0);
}

static void assert_same_output(const struct res *a, const struct res *b)
{
	assert_int_equal(a->n_ids, b->n_ids);
	assert_memory_equal(a->ids, b->ids, a->n_ids * sizeof(a->ids[0]));
	assert_string_equal(a->text, b->text);
}

static uint32_t common_prefix(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
	uint32_t i = 0;

	while (i < na && i < nb && a[i] == b[i])
		i++;
	return i;
}

/* A shared system prompt: the second request reuses the first one's full
 * blocks (n_cached > 0) and its greedy output is bitwise that of an
 * uncached run; the same text under a mask that changes the first
 * block's pattern gets nothing from the cache; a second request under
 * that mask reuses the first masked one's blocks. */
static void test_prefix_shared_prompt(void **state)
{
	(void)state;
	static char text[3][512];
	static int32_t ids[3][256];
	static struct res out[6], plain[3];
	struct gpud_engine *e = mk_engine(64, 4, 0), *u = mk_engine(64, 4, 0);
	struct gpud_sched *s = mk_sched_pfx(&e, 1, 4, (size_t)64 << 20);
	struct gpud_sched *nc = mk_sched(&u, 1, 4, 0, 32); /* no cache */
	struct gpud_sched_device_stats ds;
	uint32_t n[3], common, want, max_tok = under_valgrind() ? 8 : 24;
	uint16_t r0[] = { 0 }, r1[] = { 1 }, r2[] = { 0, 1, 2 };
	struct proto_mask_row rows[3] = { { r0, 1 }, { r1, 1 }, { r2, 3 } };
	struct proto_mask_desc desc = { .n_segments = 2, .rows = rows };
	static _Alignas(16) uint8_t mem[2][8192];
	struct gpud_mask mask[2];
	uint32_t lens[2];

	snprintf(text[0], sizeof(text[0]), "%s%s", sys_prompt, "she saw a big red ball.");
	snprintf(text[1], sizeof(text[1]), "%s%s", sys_prompt, "a dog ran to her and");
	snprintf(text[2], sizeof(text[2]), "%s%s", sys_prompt, "her mom made a cake.");
	for (int i = 0; i < 3; i++)
		n[i] = tokenize(text[i], ids[i], 256);
	common = common_prefix(ids[0], n[0], ids[1], n[1]);
	assert_true(common >= 32);
	want = common / 16 * 16;

	run_one(s, ids[0], n[0], NULL, max_tok, &out[0]);
	assert_int_equal(out[0].usage.n_cached, 0);
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(ds.prefix_blocks, n[0] / 16); /* every full prompt block */
	assert_int_equal(ds.prefix_hits, 0);
	assert_int_equal(ds.prefix_misses, (n[0] - 1) / 16);
	assert_pool_cache_only(s, 0, e);

	run_one(s, ids[1], n[1], NULL, max_tok, &out[1]);
	run_one(nc, ids[1], n[1], NULL, max_tok, &plain[1]);
	assert_int_equal(out[1].usage.n_cached, want);
	assert_int_equal(plain[1].usage.n_cached, 0);
	assert_same_output(&out[1], &plain[1]);
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(ds.prefix_hits, want / 16);
	assert_int_equal(ds.prefix_hit_tokens, want);
	assert_pool_cache_only(s, 0, e);

	/* the same request again: everything but the last block comes back */
	run_one(s, ids[1], n[1], NULL, max_tok, &out[2]);
	assert_int_equal(out[2].usage.n_cached, (n[1] - 1) / 16 * 16);
	assert_same_output(&out[2], &plain[1]);

	/* segment 1 starts at token 8 and does not see segment 0: block 0
	 * has another pattern, so nothing is shared with the causal runs */
	lens[0] = 8;
	lens[1] = n[2] - 8;
	assert_true(gpud_mask_bytes(2, n[2], 16) <= sizeof(mem[0]));
	assert_int_equal(gpud_mask_compile(&desc, lens, 16, mem[0], sizeof(mem[0]), &mask[0]), 0);
	run_one(s, ids[2], n[2], &mask[0], max_tok, &out[3]);
	run_one(nc, ids[2], n[2], &mask[0], max_tok, &plain[2]);
	assert_int_equal(out[3].usage.n_cached, 0);
	assert_same_output(&out[3], &plain[2]);
	/* and without the mask the same text does share with the first ones */
	run_one(s, ids[2], n[2], NULL, max_tok, &out[4]);
	assert_true(out[4].usage.n_cached >= 32);
	run_one(nc, ids[2], n[2], NULL, max_tok, &plain[0]);
	assert_same_output(&out[4], &plain[0]);
	/* another prompt under an equal mask shares the masked blocks */
	lens[1] = n[1] - 8;
	assert_int_equal(gpud_mask_compile(&desc, lens, 16, mem[1], sizeof(mem[1]), &mask[1]), 0);
	run_one(s, ids[1], n[1], &mask[1], max_tok, &out[5]);
	assert_int_equal(out[5].usage.n_cached, want);
	run_one(nc, ids[1], n[1], &mask[1], max_tok, &plain[1]);
	assert_same_output(&out[5], &plain[1]);
	assert_pool_cache_only(s, 0, e);
	assert_pool_empty(u);
	gpud_sched_destroy(s);
	gpud_sched_destroy(nc);
	assert_pool_empty(e); /* destroy gave the cache's blocks back */
	gpud_engine_destroy(e);
	gpud_engine_destroy(u);
}

/* Cached blocks give way: under the byte bound at once, and to admissions
 * when the pool runs short (evicted before anything is preempted). */
static void test_prefix_eviction(void **state)
{
	(void)state;
	static int32_t ids[4][256];
	static struct res out[4], plain[4];
	static char text[512];
	struct gpud_engine *e = mk_engine(64, 4, 12), *b = mk_engine(64, 4, 0);
	struct gpud_engine *u = mk_engine(64, 4, 12);
	size_t bb = gpud_engine_block_bytes(e);
	struct gpud_sched *s = mk_sched_pfx(&e, 1, 4, 64 * bb);
	struct gpud_sched *sb = mk_sched_pfx(&b, 1, 4, 2 * bb); /* bound: 2 blocks */
	struct gpud_sched *nc = mk_sched(&u, 1, 4, 0, 32);
	struct gpud_sched_device_stats ds;
	struct gpud_sched_stats st;
	uint32_t n[4];

	snprintf(text, sizeof(text), "%s%s", sys_prompt, "she saw a big red ball.");
	n[0] = tokenize(text, ids[0], 256);
	assert_true(n[0] >= 48 && n[0] < 80); /* 3-4 full blocks */
	/* byte bound: the finished request leaves 2 blocks cached */
	run_one(sb, ids[0], n[0], NULL, 8, &out[0]);
	assert_int_equal(gpud_sched_device_stats(sb, 0, &ds), 0);
	assert_int_equal(ds.prefix_blocks, 2);
	assert_int_equal(ds.prefix_bytes, 2 * bb);
	assert_int_equal(ds.prefix_evictions, n[0] / 16 - 2);
	assert_pool_cache_only(sb, 0, b);
	/* the two left are the chain's first blocks: a rerun hits them */
	run_one(sb, ids[0], n[0], NULL, 8, &out[1]);
	assert_int_equal(out[1].usage.n_cached, 32);
	assert_same_output(&out[1], &out[0]);

	/* a 12-block pool: the first request leaves its prompt blocks cached,
	 * then unrelated requests need the pool: the cache gives way */
	run_one(s, ids[0], n[0], NULL, 8, &out[0]);
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(ds.prefix_blocks, n[0] / 16);
	for (int i = 1; i < 3; i++)
		n[i] = tokenize(prompts[i + 6], ids[i], 256);
	memset(out, 0, sizeof(out));
	for (int i = 1; i < 3; i++) {
		struct gpud_sched_req r;
		req_init(&r, ids[i], n[i], 60, &out[i]);
		submit_ok(s, &r);
	}
	drain(s, 1, NULL);
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_true(ds.prefix_evictions > 0);
	gpud_sched_stats(s, &st);
	for (int i = 1; i < 3; i++) {
		run_one(nc, ids[i], n[i], NULL, 60, &plain[i]);
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_same_output(&out[i], &plain[i]);
	}
	assert_pool_cache_only(s, 0, e);
	/* an embedding through device_exec_blocks gets the cache's blocks;
	 * plain device_exec leaves the cache alone (the embedding fails) */
	{
		static struct exec_ctx c;

		memset(&c, 0, sizeof(c));
		assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
		assert_true(ds.prefix_blocks > 0);
		c.ids = ids[0];
		c.n = 12 * 16; /* the whole pool */
		for (uint32_t i = n[0]; i < c.n; i++)
			ids[0][i] = 1 + (int32_t)(i * 7 % 300);
		assert_int_equal(gpud_sched_device_exec(s, 0, embed_fn, &c), SW_EEXHAUSTED);
		assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
		assert_true(ds.prefix_blocks > 0);
		assert_int_equal(gpud_sched_device_exec_blocks(s, 0, 12, embed_fn, &c), 0);
		assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
		assert_int_equal(ds.prefix_blocks, 0);
		assert_int_equal(gpud_sched_device_exec_blocks(s, 9, 1, embed_fn, &c), -EINVAL);
		assert_pool_empty(e);
	}
	gpud_sched_destroy(s);
	gpud_sched_destroy(sb);
	gpud_sched_destroy(nc);
	assert_pool_empty(e);
	assert_pool_empty(b);
	gpud_engine_destroy(e);
	gpud_engine_destroy(b);
	gpud_engine_destroy(u);
}

/* Requests sharing a prefix on a tiny pool: preemption and recompute with
 * cached blocks attached and released keeps every output bitwise that of
 * an uncached solo run, and allocates nothing. */
static void test_prefix_preempt_no_alloc(void **state)
{
	(void)state;
	uint32_t n_req = under_valgrind() ? 3 : 5, max_tok = 40;
	static int32_t ids[6][256];
	static char text[6][512];
	static struct res out[6], plain[6];
	static const char *const tails[6] = { "she saw a cat.", "a dog ran.", "she sang.",
					      "the sun was hot.", "Tom came.", "it rained." };
	struct gpud_engine *e = mk_engine(64, 8, 8), *u = mk_engine(64, 8, 0);
	struct gpud_sched *s = mk_sched_pfx(&e, 1, 8, 8 * gpud_engine_block_bytes(e));
	struct gpud_sched *nc = mk_sched(&u, 1, 8, 0, 32);
	struct gpud_sched_stats st;
	struct gpud_sched_device_stats ds;
	struct gpud_sched_req r;
	uint32_t n[6], cached = 0;

	for (uint32_t i = 0; i < n_req; i++) {
		snprintf(text[i], sizeof(text[i]), "%s%s", sys_prompt, tails[i]);
		n[i] = tokenize(text[i], ids[i], 256);
		run_one(nc, ids[i], n[i], NULL, max_tok, &plain[i]);
	}
	memset(out, 0, sizeof(out));
	/* the first one alone fills the cache; the rest at once */
	run_one(s, ids[0], n[0], NULL, max_tok, &out[0]);
	assert_true(gpud_alloc_hook_linked());
	uint64_t allocs = gpud_alloc_host_allocs();
	for (uint32_t i = 1; i < n_req; i++) {
		req_init(&r, ids[i], n[i], max_tok, &out[i]);
		submit_ok(s, &r);
	}
	drain(s, 1, NULL);
	assert_int_equal(gpud_alloc_host_allocs() - allocs, 0);
	gpud_sched_stats(s, &st);
	assert_true(st.preemptions > 0);
	for (uint32_t i = 0; i < n_req; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_same_output(&out[i], &plain[i]);
		cached += out[i].usage.n_cached;
	}
	assert_true(cached >= 32 * (n_req - 1));
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_true(ds.prefix_hits > 0);
	assert_pool_cache_only(s, 0, e);
	gpud_sched_destroy(s);
	gpud_sched_destroy(nc);
	assert_pool_empty(e);
	gpud_engine_destroy(e);
	gpud_engine_destroy(u);
}

/* Requests sharing a system prompt on two engines stepped by their own
 * threads, with the prefix cache on: every output is the solo text, the
 * later ones reuse cached blocks, both pools end cache-only. */
static void test_prefix_concurrent(void **state)
{
	(void)state;
	uint32_t n_req = under_valgrind() ? 4 : 10, max_tok = under_valgrind() ? 8 : 24;
	struct gpud_engine *e[2] = { mk_engine(64, 8, 0), mk_engine(64, 8, 0) };
	struct gpud_engine *ref = mk_engine(512, 1, 0);
	struct gpud_sched *s = mk_sched_pfx(e, 2, 16, (size_t)64 << 20);
	static char text[N_PROMPTS][512];
	static int32_t ids[N_PROMPTS][256];
	static struct res out[N_PROMPTS];
	struct gpud_sched_req r;
	struct worker w[2];
	pthread_t th[2];
	uint32_t cached = 0;

	memset(out, 0, sizeof(out));
	atomic_store(&n_done, 0);
	for (uint32_t i = 0; i < n_req; i++) {
		snprintf(text[i], sizeof(text[i]), "%s%s", sys_prompt, prompts[i]);
		req_init(&r, ids[i], tokenize(text[i], ids[i], 256), max_tok, &out[i]);
		submit_ok(s, &r);
		if (i == 1)
			for (int d = 0; d < 2; d++) {
				w[d] = (struct worker){ .s = s, .dev = (uint32_t)d,
							.total = (int)n_req };
				assert_int_equal(pthread_create(&th[d], NULL, worker_main, &w[d]),
						 0);
			}
		if (i == 1)
			while (atomic_load(&n_done) < 2)
				usleep(200);
	}
	for (int d = 0; d < 2; d++) {
		pthread_join(th[d], NULL);
		assert_int_equal(w[d].rc, 0);
	}
	for (uint32_t i = 0; i < n_req; i++) {
		struct sink want;
		struct gpud_gen_result gr;

		reference(ref, text[i], max_tok, &want, &gr);
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
		assert_string_equal(out[i].text, want.buf);
		cached += out[i].usage.n_cached;
	}
	assert_true(cached > 0);
	assert_pool_cache_only(s, 0, e[0]);
	assert_pool_cache_only(s, 1, e[1]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(ref);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

static int setup(void **state)
{
	char err[SW_ERR_MAX] = "";

	(void)state;
	if (gpud_model_load(&model, STORIES, err, sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	gpud_model_free(model);
	return 0;
}

/* Placement follows the prefix: a repeated prompt goes to the device
 * caching it unless that device's queue is more than placement_margin
 * longer than the shortest; prompts no device caches go by load. */
static void test_prefix_placement(void **state)
{
	(void)state;
	static char text[3][512];
	static int32_t ids[3][256];
	static struct res out[5];
	struct gpud_engine *e[2] = { mk_engine(64, 4, 0), mk_engine(64, 4, 0) };
	struct gpud_sched_params p;
	struct gpud_sched *s = NULL;
	struct gpud_sched_device_stats ds[2];
	struct gpud_sched_req r;
	enum gpud_sched_placed why = GPUD_SCHED_PLACED_NONE;
	char err[SW_ERR_MAX] = "";
	uint32_t n[3], full, max_tok = 4;

	gpud_sched_params_default(&p);
	assert_int_equal(p.placement_margin, 8);
	p.max_requests = 8;
	p.prefix_cache_bytes = (size_t)64 << 20;
	p.placement_margin = 1;
	if (gpud_sched_create(&s, e, 2, &p, err, sizeof(err)))
		fail_msg("sched: %s", err);
	snprintf(text[0], sizeof(text[0]), "%s%s", sys_prompt, "she saw a big red ball.");
	snprintf(text[1], sizeof(text[1]), "The cat sat on the mat and looked at the moon "
		 "for a long time, then it went to sleep in the warm sun by the door.");
	snprintf(text[2], sizeof(text[2]), "Tom had a toy car. He liked to race it down the "
		 "hill with his friend Sam every day after school.");
	for (int i = 0; i < 3; i++)
		n[i] = tokenize(text[i], ids[i], 256);
	full = (n[0] - 1) / 16 * 16;
	assert_true(full >= 32);
	memset(out, 0, sizeof(out));

	/* nothing cached: by load (equal: the first) */
	assert_int_equal(gpud_sched_pick_device(s, ids[0], n[0], max_tok, NULL, &why), 0);
	assert_int_equal(why, GPUD_SCHED_PLACED_LOAD);
	/* prompt 0 computed on device 1 */
	req_init(&r, ids[0], n[0], max_tok, &out[0]);
	r.pin_device = true;
	r.device = 1;
	submit_ok(s, &r);
	drain(s, 2, NULL);
	assert_int_equal(gpud_sched_pick_device(s, ids[0], n[0], max_tok, NULL, &why), 1);
	assert_int_equal(why, GPUD_SCHED_PLACED_PREFIX);
	/* a prompt no device caches still goes by load */
	assert_int_equal(gpud_sched_pick_device(s, ids[2], n[2], max_tok, NULL, &why), 0);
	assert_int_equal(why, GPUD_SCHED_PLACED_LOAD);

	/* device 1 one request ahead (within the margin): prompt 0 follows
	 * its prefix there */
	req_init(&r, ids[1], n[1], max_tok, &out[1]);
	r.pin_device = true;
	r.device = 1;
	submit_ok(s, &r);
	req_init(&r, ids[0], n[0], max_tok, &out[2]);
	submit_ok(s, &r);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 0);
	assert_int_equal(gpud_sched_queue_depth(s, 1), 2);
	/* two ahead (beyond the margin): by load, to device 0 */
	req_init(&r, ids[0], n[0], max_tok, &out[3]);
	submit_ok(s, &r);
	assert_int_equal(gpud_sched_queue_depth(s, 0), 1);
	drain(s, 2, NULL);
	for (int i = 0; i < 4; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
	}
	assert_int_equal(out[0].usage.n_cached, 0);
	assert_int_equal(out[2].usage.n_cached, full);
	assert_int_equal(out[3].usage.n_cached, 0);
	assert_string_equal(out[2].text, out[0].text);
	assert_string_equal(out[3].text, out[0].text);

	/* both devices cache prompt 0 now: the longer match, then load */
	assert_int_equal(gpud_sched_pick_device(s, ids[0], n[0], max_tok, NULL, &why), 0);
	assert_int_equal(why, GPUD_SCHED_PLACED_PREFIX);
	/* a pinned submit counts what the caller says */
	req_init(&r, ids[0], n[0], max_tok, &out[4]);
	r.pin_device = true;
	r.device = 1;
	r.placed = GPUD_SCHED_PLACED_PREFIX;
	submit_ok(s, &r);
	drain(s, 2, NULL);
	assert_int_equal(out[4].usage.n_cached, full);

	assert_int_equal(gpud_sched_device_stats(s, 0, &ds[0]), 0);
	assert_int_equal(gpud_sched_device_stats(s, 1, &ds[1]), 0);
	assert_int_equal(ds[0].placed_prefix, 0);
	assert_int_equal(ds[0].placed_load, 1);
	assert_int_equal(ds[1].placed_prefix, 2);
	assert_int_equal(ds[1].placed_load, 0); /* the pinned ones count nowhere */
	assert_int_equal(ds[1].prefix_hit_tokens, 2 * full);
	assert_pool_cache_only(s, 0, e[0]);
	assert_pool_cache_only(s, 1, e[1]);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* One request at a time on idle devices: every placement ties on free
 * blocks and queue length, and the prompt tokens placed so far break the
 * tie (the devices alternate instead of device 0 taking everything). */
static void test_idle_placement_alternates(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 64), mk_engine(64, 4, 64) };
	struct gpud_sched *s = mk_sched(e, 2, 4, 0, 32);
	struct gpud_sched_device_stats ds[2];
	static struct res out[6];
	struct gpud_sched_req r;
	int32_t ids[40];
	uint32_t n = tokenize(prompts[7], ids, 40);

	memset(out, 0, sizeof(out));
	for (int i = 0; i < 6; i++) {
		req_init(&r, ids, n, 4, &out[i]);
		submit_ok(s, &r);
		assert_int_equal(gpud_sched_queue_depth(s, (uint32_t)i % 2), 1);
		drain(s, 2, NULL);
		assert_true(out[i].done);
	}
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds[0]), 0);
	assert_int_equal(gpud_sched_device_stats(s, 1, &ds[1]), 0);
	assert_int_equal(ds[0].placed_load, 3);
	assert_int_equal(ds[1].placed_load, 3);
	assert_int_equal(ds[0].placed_prefix + ds[1].placed_prefix, 0);
	gpud_sched_destroy(s);
	gpud_engine_destroy(e[0]);
	gpud_engine_destroy(e[1]);
}

/* --- chunk-KV cache -------------------------------------------------------- */

/* Answer-style prompts (system, two self-only chunks, a question the
 * chunks do not see past) through the scheduler with the chunk cache on:
 * the second request has the chunks in the other order at other offsets
 * and copies them in (stats, n_cached), and both requests' greedy output
 * equals a run with no cache at all. Idle, the pool holds only the
 * cache's blocks (dumped as "chunk"), and a flush empties it. */
static void chunk_reuse(bool prefix)
{
	static const char *const part[] = {
		"Once upon a time, there was a little girl named Lily.",
		" She loved to play outside in the park with her friends and her big red ball.",
		" One day, a small dog came to the park. It was brown and very happy to see them.",
		" What did the dog do?",
		" Who came to the park?",
	};
	static int32_t ids[5][128], prompt[2][512];
	static struct res out[2], plain[2];
	uint32_t n[5], np[2] = { 0, 0 };
	struct gpud_engine_params ep;
	struct gpud_engine *e = NULL, *u = mk_engine(64, 4, 0);
	struct gpud_sched *s, *us;
	struct gpud_sched_device_stats ds;
	struct owner_count oc = { 0 };
	struct gpud_engine_stats es;
	char err[SW_ERR_MAX] = "";
	/* order of the chunks in each request */
	static const int order[2][2] = { { 1, 2 }, { 2, 1 } };

	gpud_engine_params_default(&ep);
	ep.n_threads = 1;
	ep.max_batch_tokens = 64;
	ep.max_seqs = 4;
	ep.chunk_bytes = (size_t)8 << 20;
	if (gpud_engine_create(&e, model, &ep, err, sizeof(err)))
		fail_msg("engine: %s", err);
	assert_true(gpud_engine_chunk_enabled(e));
	s = prefix ? mk_sched_pfx(&e, 1, 4, (size_t)64 << 20) : mk_sched(&e, 1, 4, 64, 0);
	us = mk_sched(&u, 1, 4, 64, 0);
	for (int i = 0; i < 5; i++) {
		/* the system prompt keeps BOS; the rest are continuations */
		n[i] = tokenize(part[i], ids[i], 128);
		if (i) {
			memmove(ids[i], ids[i] + 1, (n[i] - 1) * sizeof(int32_t));
			n[i]--;
		}
	}
	assert_true(n[1] >= 16 && n[2] >= 16); /* a block at least: cached */
	for (int r = 0; r < 2; r++) {
		static _Alignas(16) uint8_t mem[2][4096];
		static struct gpud_mask mask[2];
		uint16_t r0[] = { 0 }, r1[] = { 1 }, r2[] = { 2 }, r3[] = { 0, 1, 2, 3 },
			 rg[] = { 0, 1, 2, 3, 4 };
		struct proto_mask_row rows[5] = { { r0, 1 }, { r1, 1 }, { r2, 1 }, { r3, 4 },
						  { rg, 5 } };
		struct proto_mask_desc desc = { .n_segments = 4, .rows = rows };
		uint32_t lens[4] = { n[0], n[order[r][0]], n[order[r][1]], n[3 + r] };
		const int seg_src[4] = { 0, order[r][0], order[r][1], 3 + r };

		for (int k = 0; k < 4; k++) {
			memcpy(prompt[r] + np[r], ids[seg_src[k]], n[seg_src[k]] * sizeof(int32_t));
			np[r] += n[seg_src[k]];
		}
		assert_int_equal(gpud_mask_compile(&desc, lens, 16, mem[r], sizeof(mem[r]), &mask[r]),
				 0);
		run_one(s, prompt[r], np[r], &mask[r], 12, &out[r]);
		run_one(us, prompt[r], np[r], &mask[r], 12, &plain[r]);
		assert_same_output(&out[r], &plain[r]);
		assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
		if (!r) {
			assert_int_equal(ds.chunk_hits, 0);
			assert_int_equal(out[r].usage.n_cached, 0);
		} else {
			/* not the system prompt: a first segment is never stored
			 * (with the prefix cache on, its full blocks come from
			 * there) */
			assert_int_equal(ds.chunk_hits, 2);
			assert_int_equal(ds.chunk_hit_tokens, n[1] + n[2]);
			assert_int_equal(out[r].usage.n_cached,
					 n[1] + n[2] + (prefix ? n[0] / 16 * 16 : 0));
			assert_int_equal(ds.prefix_hit_tokens, prefix ? n[0] / 16 * 16 : 0);
		}
		/* every chunk was copied or computed */
		assert_int_equal(ds.chunk_hits + ds.chunk_misses, 2 * (r + 1));
	}
	/* both chunks */
	assert_int_equal(ds.chunk_entries, 2);
	assert_true(ds.chunk_bytes <= ds.chunk_max_bytes);
	if (gpud_engine_check(e, err, sizeof(err)))
		fail_msg("%s", err);
	gpud_engine_stats(e, &es);
	assert_int_equal(es.kv.seqs, 0);
	assert_int_equal(es.kv.used, ds.chunk_blocks + ds.prefix_blocks);
	assert_int_equal(ds.prefix_unreferenced, ds.prefix_blocks);
	assert_int_equal(gpud_engine_free_blocks(e), es.kv.n_blocks - ds.prefix_blocks);
	assert_int_equal(gpud_sched_block_owners(s, 0, count_owner, &oc), 0);
	assert_int_equal(oc.chunk, ds.chunk_blocks);
	assert_int_equal(oc.prefix, ds.prefix_blocks);
	assert_int_equal(oc.free, es.kv.free);
	assert_int_equal(oc.request + oc.shared, 0);
	gpud_engine_chunk_flush(e);
	if (!prefix)
		assert_pool_empty(e);
	gpud_engine_stats(e, &es);
	assert_int_equal(es.kv.used, ds.prefix_blocks);
	gpud_sched_destroy(s);
	gpud_sched_destroy(us);
	gpud_engine_destroy(e);
	gpud_engine_destroy(u);
}

static void test_chunk_reuse(void **state)
{
	(void)state;
	chunk_reuse(false);
}

/* The same with the prefix cache on: the system prompt's full blocks come
 * from it, the chunks from the chunk cache, and both count. */
static void test_chunk_reuse_prefix(void **state)
{
	(void)state;
	chunk_reuse(true);
}

/* --- a failed device ------------------------------------------------------- */

struct fail_ctx {
	struct gpud_sched *s;
	struct res *out;       /* (4) the requests on device 1 */
	int ended;             /* fail_device's return, inside */
	bool all_done_inside;
	uint32_t seqs_inside;  /* engine sequences still there, inside */
	int owners_rc;         /* a block-owner dump waiting on the busy device */
};

static void *owners_main(void *arg)
{
	struct fail_ctx *c = arg;
	struct owners o;

	memset(&o, 0, sizeof(o));
	c->owners_rc = gpud_sched_block_owners(c->s, 1, owner_fn, &o);
	return NULL;
}

/* Runs while device 1 is busy (device_exec): a watchdog's view of a hang. */
static int fail_fn(struct gpud_engine *e, void *arg)
{
	struct fail_ctx *c = arg;
	struct gpud_engine_stats es;
	pthread_t th;

	/* a dump waits for the pass to end; the failure releases it */
	assert_int_equal(pthread_create(&th, NULL, owners_main, c), 0);
	usleep(20000);
	c->ended = gpud_sched_fail_device(c->s, 1, SW_EDEVICE, "test: device gone");
	pthread_join(th, NULL);
	c->all_done_inside = true;
	for (int i = 0; i < 4; i++)
		c->all_done_inside &= c->out[i].done && c->out[i].status == SW_EDEVICE;
	gpud_engine_stats(e, &es);
	c->seqs_inside = es.kv.seqs;
	return 0;
}

/* gpud_sched_fail_device: a device failed while busy answers its requests
 * at once and frees them once free again; nothing is placed on it again,
 * a request pinned to it is refused with the failure; the other device
 * goes on; with no device left, submits are refused. */
static void test_fail_device(void **state)
{
	(void)state;
	struct gpud_engine *e[2] = { mk_engine(64, 4, 0), mk_engine(64, 4, 0) };
	struct gpud_sched *s = mk_sched(e, 2, 16, 0, 32);
	static struct res out[8];
	static struct fail_ctx c;
	int32_t ids[8][64];
	uint32_t n[8];
	uint64_t id1 = 0;
	struct gpud_sched_req r;
	struct gpud_sched_device_stats ds;
	struct gpud_engine_stats es;
	char err[SW_ERR_MAX] = "";
	uint64_t id;

	memset(out, 0, sizeof(out));
	memset(&c, 0, sizeof(c));
	for (int i = 0; i < 8; i++)
		n[i] = tokenize(prompts[i], ids[i], 64);
	/* device 1: 3 running (one step), then a 4th waiting; device 0: 2 */
	for (int i = 0; i < 3; i++) {
		req_init(&r, ids[i], n[i], 40, &out[i]);
		r.pin_device = true;
		r.device = 1;
		id = submit_ok(s, &r);
		if (i == 0)
			id1 = id;
	}
	assert_true(step_ok(s, 1) > 0);
	req_init(&r, ids[3], n[3], 40, &out[3]);
	r.pin_device = true;
	r.device = 1;
	submit_ok(s, &r);
	for (int i = 4; i < 6; i++) {
		req_init(&r, ids[i], n[i], 12, &out[i]);
		r.pin_device = true;
		r.device = 0;
		submit_ok(s, &r);
	}
	c.s = s;
	c.out = out;
	assert_int_equal(gpud_sched_device_exec(s, 1, fail_fn, &c), 0);
	assert_int_equal(c.ended, 4);
	assert_true(c.all_done_inside);
	assert_int_equal(c.seqs_inside, 3); /* busy: left for after */
	assert_int_equal(c.owners_rc, SW_EDEVICE);
	assert_int_equal(out[0].n_ids, 1); /* the token of its one step reached it first */
	gpud_engine_stats(e[1], &es);
	assert_int_equal(es.kv.seqs, 0); /* freed once the device was free */
	assert_pool_empty(e[1]);
	assert_int_equal(gpud_sched_cancel(s, id1), SW_ENOTFOUND);
	assert_int_equal(gpud_sched_fail_device(s, 1, SW_EDEVICE, "again"), 0);
	assert_int_equal(gpud_sched_device_stats(s, 1, &ds), 0);
	assert_int_equal(ds.failed, SW_EDEVICE);
	assert_int_equal(ds.queue, 0);
	assert_int_equal(step_ok(s, 1), 0); /* never stepped again */
	{
		struct owners o;

		memset(&o, 0, sizeof(o));
		assert_int_equal(gpud_sched_block_owners(s, 1, owner_fn, &o), SW_EDEVICE);
		assert_int_equal(o.n_calls, 0);
	}
	/* pinned to it: refused with the first reason */
	req_init(&r, ids[6], n[6], 8, &out[6]);
	r.pin_device = true;
	r.device = 1;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EDEVICE);
	assert_non_null(strstr(err, "device 1 failed: test: device gone"));
	/* unpinned: device 0 */
	r.pin_device = false;
	submit_ok(s, &r);
	drain(s, 2, NULL);
	for (int i = 4; i < 7; i++) {
		assert_true(out[i].done);
		assert_int_equal(out[i].status, 0);
	}
	assert_int_equal(gpud_sched_device_stats(s, 0, &ds), 0);
	assert_int_equal(ds.failed, 0);
	/* device 0 fails while not busy: its request ends and is freed at once */
	req_init(&r, ids[7], n[7], 40, &out[7]);
	submit_ok(s, &r);
	assert_true(step_ok(s, 0) > 0);
	assert_int_equal(gpud_sched_fail_device(s, 0, SW_EDEVICE, "test: second"), 1);
	assert_true(out[7].done);
	assert_int_equal(out[7].status, SW_EDEVICE);
	assert_pool_empty(e[0]);
	r.pin_device = false;
	assert_int_equal(gpud_sched_submit(s, &r, &id, err, sizeof(err)), SW_EDEVICE);
	assert_non_null(strstr(err, "failed: test:"));
	assert_int_equal(gpud_sched_fail_device(s, 2, SW_EDEVICE, "x"), -EINVAL);
	assert_int_equal(gpud_sched_fail_device(s, 0, 0, "x"), -EINVAL);
	free_sched2(s, e);
}

struct stepper {
	struct gpud_sched *s;
	int total;
	int fatal, other;
};

static void *stepper_main(void *arg)
{
	struct stepper *w = arg;
	char err[SW_ERR_MAX];

	while (atomic_load(&n_done) < w->total) {
		int n = gpud_sched_step(w->s, 0, err, sizeof(err));
		if (n == SW_EDEVICE)
			w->fatal++;
		else if (n < 0)
			w->other++;
		if (n <= 0)
			usleep(200);
	}
	return NULL;
}

/* A failure from another thread at any moment of a device's work (in a
 * forward pass, while planning, between steps): every request ends once,
 * completed or SW_EDEVICE, and every KV block comes back. */
static void test_fail_device_racing(void **state)
{
	(void)state;
	const int rounds = under_valgrind() ? 2 : 6;
	int failed = 0;

	/* Rounds past `rounds` (at most 20, with no wait) only until a request
	 * has failed: a thread scheduler that runs the stepper to the end
	 * first (valgrind's, one thread at a time) must not leave the failure
	 * path unexercised. */
	for (int round = 0; round < rounds || (failed == 0 && round < rounds + 20); round++) {
		struct gpud_engine *e = mk_engine(64, 4, 0);
		struct gpud_sched *s = mk_sched(&e, 1, 8, 0, 32);
		static struct res out[6];
		int32_t ids[6][64];
		struct gpud_sched_req r;
		struct stepper w = { .s = s, .total = 6 };
		pthread_t th;
		memset(out, 0, sizeof(out));
		atomic_store(&n_done, 0);
		for (int i = 0; i < 6; i++) {
			uint32_t n = tokenize(prompts[i], ids[i], 64);
			req_init(&r, ids[i], n, 30, &out[i]);
			submit_ok(s, &r);
		}
		assert_int_equal(pthread_create(&th, NULL, stepper_main, &w), 0);
		if (round < rounds)
			usleep(200 + 700 * (unsigned)round);
		assert_true(gpud_sched_fail_device(s, 0, SW_EDEVICE, "test: race") >= 0);
		pthread_join(th, NULL);
		assert_true(step_ok(s, 0) == 0); /* nothing left, nothing stepped */
		for (int i = 0; i < 6; i++) {
			assert_true(out[i].done);
			assert_true(out[i].status == 0 || out[i].status == SW_EDEVICE);
			failed += out[i].status == SW_EDEVICE;
		}
		assert_true(w.fatal <= 1);
		assert_int_equal(w.other, 0);
		assert_pool_empty(e);
		gpud_sched_destroy(s);
		gpud_engine_destroy(e);
	}
	assert_true(failed > 0); /* 0.2 ms in, six requests of 30 tokens are not done */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_concurrent_matches_solo),
		cmocka_unit_test(test_sampling_threads),
		cmocka_unit_test(test_placement),
		cmocka_unit_test(test_chunked_prefill),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_slot_exhaustion_reuse),
		cmocka_unit_test(test_concurrent_submit),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_caller_stop),
		cmocka_unit_test(test_preemption),
		cmocka_unit_test(test_prompt_logprobs_preempt),
		cmocka_unit_test(test_aging),
		cmocka_unit_test(test_mask_preempt),
		cmocka_unit_test(test_threaded_cancel),
		cmocka_unit_test(test_no_alloc),
		cmocka_unit_test(test_pinned),
		cmocka_unit_test(test_wait_wake),
		cmocka_unit_test(test_device_exec),
		cmocka_unit_test(test_stats_owners),
		cmocka_unit_test(test_prefix_shared_prompt),
		cmocka_unit_test(test_prefix_eviction),
		cmocka_unit_test(test_prefix_preempt_no_alloc),
		cmocka_unit_test(test_prefix_concurrent),
		cmocka_unit_test(test_prefix_placement),
		cmocka_unit_test(test_idle_placement_alternates),
		cmocka_unit_test(test_chunk_reuse),
		cmocka_unit_test(test_chunk_reuse_prefix),
		cmocka_unit_test(test_fail_device),
		cmocka_unit_test(test_fail_device_racing),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
