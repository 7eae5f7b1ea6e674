/* gpud_test.c - the daemon's integration tests (1-6 below):
 * a real `gpud serve` with stories260K on two cpu devices, driven through
 * the client library (proto/client.h) and, for malformed input, through
 * raw frames (proto/frame.h, proto/shm.h).
 *
 *  1. 64 concurrent greedy streams == the same requests one at a time.
 *  2. 20,000 random requests (prompts 1-1000 tokens, random descriptors):
 *     zero errors, no allocation after warm-up on the loop and device
 *     threads, every pool back to empty when idle, high-water < capacity.
 *     GPUD_IT_REQUESTS overrides the count for a quick local run.
 *  3. Mask cache: same descriptor 4 times -> one entry per device that
 *     got it, a hit for each other request (2 at least); many
 *     distinct descriptors under a small bound -> evictions, bytes never
 *     above the bound (polled while the requests run).
 *  4. Prefix cache: shared system prompt + same mask -> cached prompt
 *     tokens; another mask -> none; outputs equal a daemon without it.
 *     4b: distinct prompts spread by load; sent again, each lands on the
 *     device caching it (STATS placements and hit tokens agree).
 *  5. A client process killed mid-stream -> its KV blocks come back, the
 *     others are unaffected.
 *  6. Malformed frames, bad offsets, wrong version, oversized requests, a
 *     client that never reads -> an error for that client only.
 *  7. Log probabilities (TOKENS_LP) change no token and agree with the
 *     text and with each other.
 *
 * Test 5 re-executes this binary as the client to be killed
 * ("--stream-child SOCKET FD").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/client.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/shm.h"
#include "tests/integration/gpud_harness.h"

/* The reference continuation of the model card (../shared/models/README.md). */
#define ONCE "Once upon a time"
#define ONCE_GREEDY ", there was a little girl named Lily. She loved to play outside in the park."

/* --- fixture --------------------------------------------------------------- */

/* Stops daemon i with SIGTERM and checks it exits 0. */
static void stop_ok(struct gpud_it_fix *f, int i)
{
	int rc = gpud_it_stop(&f->d[i], SIGTERM, 60000);

	if (rc != 0)
		fail_msg("gpud exited with %d after SIGTERM (expected 0)", rc);
}

/* --- words and requests ---------------------------------------------------- */

static const char *const words[] = {
	"the", "little", "girl", "boy", "dog", "cat", "ball", "park", "sun", "happy",
	"big", "red", "tree", "play", "friend", "mom", "said", "was", "and", "to",
	"a", "she", "he", "they", "saw", "went", "day", "time", "toy", "bird",
	"fish", "blue", "jump", "run", "house", "box", "good", "sad", "look", "find",
	"help", "water", "car", "boat", "flower", "garden", "cake", "king", "magic", "sky",
	"Lily", "Tom", "Ben", "Sue", "wanted", "loved", "very", "with", "her", "his",
	"one", "upon", "once", "there", "named", "outside", "inside", "small", "bright", "dark",
	"night", "moon", "star", "rain", "snow", "cold", "warm", "soft", "hard", "fast",
};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

/* A request under construction: the storage proto_submit_req points into. */
struct rbuf {
	struct proto_segment seg[16];
	struct proto_mask_row rows[17];
	uint16_t idx[17 * 17];
	struct proto_mask_desc desc;
	char text[24576];
	size_t used;
	struct proto_submit_req req;
};

static void rbuf_init(struct rbuf *b, uint32_t max_tokens)
{
	memset(&b->req, 0, sizeof(b->req));
	b->used = 0;
	b->req.segments = b->seg;
	proto_sampling_default(&b->req.sampling); /* greedy */
	b->req.max_tokens = max_tokens;
}

/* Appends a segment with a copy of text. */
static void rbuf_seg(struct rbuf *b, const char *text)
{
	size_t n = strlen(text);
	uint32_t i = b->req.n_segments;

	assert_true(i < 16);
	assert_true(b->used + n <= sizeof(b->text));
	memcpy(b->text + b->used, text, n);
	b->seg[i].text = b->text + b->used;
	b->seg[i].len = (uint32_t)n;
	b->seg[i].role = PROTO_ROLE_NONE;
	b->seg[i].flags = 0;
	b->used += n;
	b->req.n_segments = i + 1;
}

/* vis rows from bit masks (bit j of vis[i]: row i sees segment j; bit i
 * is forced). S + 1 rows; the request's segment count must be S. */
static void rbuf_mask(struct rbuf *b, const uint32_t *vis)
{
	uint32_t S = b->req.n_segments, k = 0;

	for (uint32_t i = 0; i <= S; i++) {
		b->rows[i].idx = b->idx + k;
		b->rows[i].n = 0;
		for (uint32_t j = 0; j <= i; j++) {
			if (j == i || (vis[i] >> j & 1)) {
				b->idx[k++] = (uint16_t)j;
				b->rows[i].n++;
			}
		}
	}
	b->desc.n_segments = S;
	b->desc.rows = b->rows;
	b->req.mask = &b->desc;
}

/* Collects one streamed request. */
struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int pending;
};

struct collect {
	struct waiter *w;
	char text[8192];
	size_t len;
	int32_t ids[2048];
	uint32_t n_ids;
	bool overflow;
	int status;
	int calls_done;
	struct proto_done usage;
	char msg[PROTO_MAX_ERROR_MSG];
};

static void waiter_init(struct waiter *w)
{
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->pending = 0;
}

static void waiter_destroy(struct waiter *w)
{
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
}

static void waiter_add(struct waiter *w, int n)
{
	pthread_mutex_lock(&w->mu);
	w->pending += n;
	pthread_mutex_unlock(&w->mu);
}

/* Waits until nothing is pending or timeout_s pass; returns what is left. */
static int waiter_wait(struct waiter *w, double timeout_s)
{
	struct timespec ts;
	int left;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)timeout_s;
	pthread_mutex_lock(&w->mu);
	while (w->pending > 0)
		if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
			break;
	left = w->pending;
	pthread_mutex_unlock(&w->mu);
	return left;
}

static int on_tokens(void *arg, uint64_t id, const struct proto_tokens *t)
{
	struct collect *c = arg;

	for (uint32_t i = 0; i < t->n_ids; i++) {
		if (c->n_ids < sizeof(c->ids) / sizeof(c->ids[0]))
			c->ids[c->n_ids++] = proto_tokens_id(t, i);
		else
			c->overflow = true;
	}
	if (c->len + t->text_len < sizeof(c->text)) {
		memcpy(c->text + c->len, t->text, t->text_len);
		c->len += t->text_len;
		c->text[c->len] = '\0';
	} else {
		c->overflow = true;
	}
	return 0;
}

static void on_done(void *arg, uint64_t id, int status, const struct proto_done *u,
		    const char *msg)
{
	struct collect *c = arg;

	c->status = status;
	c->calls_done++;
	if (u)
		c->usage = *u;
	snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "");
	pthread_mutex_lock(&c->w->mu);
	c->w->pending--;
	pthread_cond_broadcast(&c->w->cv);
	pthread_mutex_unlock(&c->w->mu);
}

static const struct proto_client_events collect_events = {
	.on_tokens = on_tokens,
	.on_done = on_done,
};

/* Submits req streaming into c (registered with c->w). */
static int submit_collect(struct proto_client *cl, const struct proto_submit_req *req,
			  struct collect *c, uint64_t *id)
{
	struct proto_client_events ev = collect_events;
	char err[SW_ERR_MAX] = "";
	int rc;

	ev.arg = c;
	waiter_add(c->w, 1);
	rc = proto_client_submit(cl, req, &ev, id, err, sizeof(err));
	if (rc) {
		waiter_add(c->w, -1);
		fprintf(stderr, "submit: %s (%s)\n", err, sw_errname(rc));
	}
	return rc;
}

/* Blocking generate of one plain prompt; returns rc, fills res. */
static int gen_text(struct proto_client *cl, const char *prompt, uint32_t max_tokens,
		    struct proto_client_result *res, char *err, size_t errlen)
{
	struct rbuf *b = malloc(sizeof(*b));
	int rc;

	assert_non_null(b);
	rbuf_init(b, max_tokens);
	rbuf_seg(b, prompt);
	memset(res, 0, sizeof(*res));
	rc = proto_client_generate(cl, &b->req, res, err, errlen);
	free(b);
	return rc;
}

/* --- stats helpers ---------------------------------------------------------- */

static int64_t jint(json_t *root, const char *path)
{
	int64_t v = 0;
	int rc = gpud_it_jint(root, path, &v);

	if (rc)
		fail_msg("stats: %s: %s", path, rc == -ENOENT ? "absent" : "not an integer");
	return v;
}

static int64_t jint_in(json_t *obj, const char *key)
{
	json_t *j = json_object_get(obj, key);
	const char *name = json_string_value(json_object_get(obj, "name"));

	if (!j || !json_is_number(j))
		fail_msg("stats: %s.%s: absent or not a number", name ? name : "?", key);
	return (int64_t)json_number_value(j);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && !strcmp(s + n - m, suffix);
}

/* Sum of "used" over the KV pools ("<dev>.kv"). */
static int64_t kv_used(json_t *st)
{
	json_t *pools = json_object_get(st, "pools"), *p;
	int64_t sum = 0;
	size_t i;
	int n = 0;

	assert_true(json_is_array(pools));
	json_array_foreach(pools, i, p) {
		const char *name = json_string_value(json_object_get(p, "name"));

		if (name && ends_with(name, ".kv")) {
			sum += jint_in(p, "used");
			n++;
		}
	}
	if (n == 0)
		fail_msg("stats: no \"<device>.kv\" pool in pools[]");
	return sum;
}

/* Mask caches: "mask" or "<dev>.mask". Sums of the named field. */
static int64_t mask_sum(json_t *st, const char *field, int *n_out)
{
	json_t *caches = json_object_get(st, "caches"), *c;
	int64_t sum = 0;
	size_t i;
	int n = 0;

	assert_true(json_is_array(caches));
	json_array_foreach(caches, i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));

		if (name && (!strcmp(name, "mask") || ends_with(name, ".mask"))) {
			sum += jint_in(c, field);
			n++;
		}
	}
	if (n_out)
		*n_out = n;
	if (n == 0)
		fail_msg("stats: no mask cache (\"mask\" or \"<device>.mask\") in caches[]");
	return sum;
}

static json_t *stats(struct proto_client *c)
{
	json_t *st = gpud_it_stats(c, false);

	if (!st)
		fail_msg("STATS failed");
	return st;
}

/* Polls STATS until requests.in_flight is 0 (bounded); returns the
 * final snapshot. */
static json_t *stats_idle(struct proto_client *c)
{
	double deadline = gpud_it_now() + 30;

	for (;;) {
		json_t *st = stats(c);

		if (jint(st, "requests.in_flight") == 0)
			return st;
		if (gpud_it_now() > deadline)
			fail_msg("requests.in_flight did not return to 0 within 30 s");
		json_decref(st);
		usleep(20000);
	}
}

/* The idle-state checks of test 2 (and others): in flight 0, device
 * queues empty, KV used == blocks the prefix cache holds (each device),
 * no pinned mask entry, every pool's high-water under its capacity. */
static void check_idle_pools(json_t *st, bool prefix_on)
{
	json_t *pools = json_object_get(st, "pools"), *caches = json_object_get(st, "caches");
	json_t *devs = json_object_get(st, "devices"), *p;
	size_t i;
	int n_kv = 0;

	assert_int_equal(jint(st, "requests.in_flight"), 0);
	assert_true(json_is_array(devs) && json_array_size(devs) == 2);
	json_array_foreach(devs, i, p) {
		assert_int_equal(jint_in(p, "queue"), 0);
		assert_int_equal(jint_in(p, "running"), 0);
	}
	assert_true(json_is_array(pools) && json_array_size(pools) > 0);
	json_array_foreach(pools, i, p) {
		const char *name = json_string_value(json_object_get(p, "name"));
		int64_t cap = jint_in(p, "capacity"), used = jint_in(p, "used");
		int64_t high = jint_in(p, "high"), free_ = jint_in(p, "free");

		assert_non_null(name);
		printf("    pool %-16s used %8" PRId64 " free %8" PRId64 " high %8" PRId64
		       " capacity %8" PRId64 "\n", name, used, free_, high, cap);
		if (used + free_ != cap)
			fail_msg("pool %s: used %" PRId64 " + free %" PRId64 " != capacity %" PRId64,
				 name, used, free_, cap);
		/* A mask cache's pool has one slot more than the cache's entry
		 * bound: a miss compiles into the spare before the LRU entry
		 * goes, so once the cache has filled, its pool reaches capacity
		 * by design (the cache bound is checked below). Every other
		 * pool must stay under its capacity. */
		if (ends_with(name, ".mask") ? high > cap : !(high < cap))
			fail_msg("pool %s: high-water %" PRId64 " not under capacity %" PRId64,
				 name, high, cap);
		if (used > high)
			fail_msg("pool %s: used %" PRId64 " above its high-water %" PRId64, name,
				 used, high);
		if (!strcmp(name, "server.requests") && used != 0)
			fail_msg("pool server.requests: %" PRId64 " request slots used when idle",
				 used);
		/* idle: nothing is held for a live request (what the watchdog
		 * watches); the kv and mask pools hold what their caches keep */
		if ((ends_with(name, ".kv") || ends_with(name, ".mask")) &&
		    (jint_in(p, "live") != 0 || jint_in(p, "cached") != used))
			fail_msg("pool %s: live %" PRId64 " + cached %" PRId64 " when idle, used %"
				 PRId64 " (expected 0 + used)", name, jint_in(p, "live"),
				 jint_in(p, "cached"), used);
		if (ends_with(name, ".mask")) {
			/* idle: every slot in use holds a cached mask, none leaked */
			json_t *mc = gpud_it_named(caches, name);

			if (mc && jint_in(mc, "entries") != used)
				fail_msg("pool %s: %" PRId64 " slots used when idle, the cache holds %"
					 PRId64 " masks", name, used, jint_in(mc, "entries"));
		}
		if (ends_with(name, ".kv")) {
			char cname[64];
			json_t *pc;
			int64_t held = 0;

			n_kv++;
			snprintf(cname, sizeof(cname), "%.*s.prefix", (int)(strlen(name) - 3), name);
			pc = gpud_it_named(caches, cname);
			if (prefix_on) {
				if (!pc)
					fail_msg("stats: prefix cache %s missing (prefix cache is on)",
						 cname);
				held = jint_in(pc, "entries");
				assert_int_equal(jint_in(pc, "pinned"), 0);
			} else if (pc) {
				assert_int_equal(jint_in(pc, "entries"), 0);
			}
			/* and the chunk-KV cache's blocks (bytes in whole blocks) */
			snprintf(cname, sizeof(cname), "%.*s.chunk", (int)(strlen(name) - 3), name);
			pc = gpud_it_named(caches, cname);
			if (pc) {
				int64_t ub = jint_in(p, "unit_bytes");
				assert_true(ub > 0 && jint_in(pc, "bytes") % ub == 0);
				assert_true(jint_in(pc, "bytes") <= jint_in(pc, "max_bytes"));
				held += jint_in(pc, "bytes") / ub;
			}
			if (used != held)
				fail_msg("pool %s: %" PRId64 " blocks used when idle; the prefix and "
					 "chunk caches hold %" PRId64 " (a leak)", name, used, held);
		}
	}
	assert_int_equal(n_kv, 2);
	assert_int_equal(mask_sum(st, "pinned", NULL), 0);
	json_array_foreach(caches, i, p) {
		const char *name = json_string_value(json_object_get(p, "name"));

		if (!name)
			continue;
		printf("    cache %-15s entries %6" PRId64 " (max %6" PRId64 ") bytes %9" PRId64
		       " (max %9" PRId64 ") hits %8" PRId64 " misses %8" PRId64 " evictions %8" PRId64
		       "\n", name, jint_in(p, "entries"), jint_in(p, "max_entries"),
		       jint_in(p, "bytes"), jint_in(p, "max_bytes"), jint_in(p, "hits"),
		       jint_in(p, "misses"), jint_in(p, "evictions"));
		if (jint_in(p, "bytes") > jint_in(p, "max_bytes"))
			fail_msg("cache %s: bytes over its bound", name);
		if (jint_in(p, "entries") > jint_in(p, "max_entries"))
			fail_msg("cache %s: entries over their bound", name);
	}
}

/* --- test 1: 64 concurrent greedy streams == one at a time ------------------ */

/* Sums of devices[].steps and devices[].tokens. */
static void dev_sums(json_t *st, int64_t *steps, int64_t *tokens)
{
	json_t *devs = json_object_get(st, "devices"), *d;
	size_t i;

	*steps = *tokens = 0;
	assert_true(json_is_array(devs));
	json_array_foreach(devs, i, d) {
		*steps += jint_in(d, "steps");
		*tokens += jint_in(d, "tokens");
	}
}

#define T1_N 64
#define T1_CONNS 4
#define T1_MAX 48

static void t1_prompt(int i, char *out, size_t outlen)
{
	if (i == 0) {
		snprintf(out, outlen, ONCE);
		return;
	}
	snprintf(out, outlen, "%s %s %s %s %s", words[(i * 7) % N_WORDS],
		 words[(i * 13 + 3) % N_WORDS], words[(i * 29 + 5) % N_WORDS],
		 i % 3 ? "Once upon a time" : "One day", words[i % N_WORDS]);
}

static void test_concurrent_equals_sequential(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 1024, \"max_seqs\": 64, \"prefix_cache_bytes\": 0",
	};
	struct proto_client *cl[T1_CONNS];
	struct collect *col = calloc(T1_N, sizeof(*col));
	struct rbuf *b = malloc(sizeof(*b) * T1_N);
	struct waiter w;
	double t0, t_conc, t_seq;
	char prompt[256];
	int64_t steps0, tokens0, steps1, tokens1;
	json_t *st;

	assert_non_null(col);
	assert_non_null(b);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	for (int k = 0; k < T1_CONNS; k++)
		assert_non_null(cl[k] = gpud_it_connect(&f->d[0]));

	waiter_init(&w);
	for (int i = 0; i < T1_N; i++) {
		t1_prompt(i, prompt, sizeof(prompt));
		rbuf_init(&b[i], T1_MAX);
		rbuf_seg(&b[i], prompt);
		col[i].w = &w;
	}
	st = stats_idle(cl[0]);
	dev_sums(st, &steps0, &tokens0);
	json_decref(st);
	t0 = gpud_it_now();
	for (int i = 0; i < T1_N; i++)
		assert_int_equal(submit_collect(cl[i % T1_CONNS], &b[i].req, &col[i], NULL), 0);
	if (waiter_wait(&w, 300) != 0)
		fail_msg("concurrent requests did not all end within 300 s");
	t_conc = gpud_it_now() - t0;
	st = stats_idle(cl[0]);
	dev_sums(st, &steps1, &tokens1);
	json_decref(st);
	/* they really ran batched: more tokens than forward steps */
	printf("    test 1: concurrent phase: %" PRId64 " tokens in %" PRId64 " device steps\n",
	       tokens1 - tokens0, steps1 - steps0);
	assert_true(steps1 > steps0);
	assert_true(tokens1 - tokens0 > 2 * (steps1 - steps0));

	t0 = gpud_it_now();
	for (int i = 0; i < T1_N; i++) {
		struct proto_client_result res;
		char err[SW_ERR_MAX] = "";
		int rc;

		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl[0], &b[i].req, &res, err, sizeof(err));
		if (rc)
			fail_msg("sequential request %d: %s (%s)", i, err, sw_errname(rc));
		if (col[i].status != 0)
			fail_msg("concurrent request %d: status %s: %s", i,
				 sw_errname(col[i].status), col[i].msg);
		assert_int_equal(col[i].calls_done, 1);
		assert_false(col[i].overflow);
		if (res.text_len != col[i].len || memcmp(res.text, col[i].text, res.text_len))
			fail_msg("request %d: concurrent text differs from sequential:\n"
				 "  concurrent: \"%s\"\n  sequential: \"%s\"", i, col[i].text,
				 res.text);
		assert_int_equal(res.n_ids, col[i].n_ids);
		assert_memory_equal(res.ids, col[i].ids, res.n_ids * sizeof(int32_t));
		assert_int_equal(res.usage.generated_tokens, col[i].usage.generated_tokens);
		assert_int_equal(res.usage.prompt_tokens, col[i].usage.prompt_tokens);
		assert_true(res.n_ids >= 1 && res.n_ids <= T1_MAX);
		assert_int_equal(res.usage.generated_tokens, res.n_ids);
		if (i == 0 && strncmp(res.text, ONCE_GREEDY, strlen(ONCE_GREEDY)))
			fail_msg("greedy \"" ONCE "\" gave \"%s\", the model card says \"%s...\"",
				 res.text, ONCE_GREEDY);
		if (i == 0)
			assert_int_equal(res.usage.prompt_tokens, 5); /* [1, 403, 407, 261, 378] */
		proto_client_result_free(&res);
	}
	t_seq = gpud_it_now() - t0;
	printf("    test 1: %d requests x %d tokens: concurrent %.2f s, one at a time %.2f s\n",
	       T1_N, T1_MAX, t_conc, t_seq);

	for (int k = 0; k < T1_CONNS; k++)
		proto_client_close(cl[k]);
	waiter_destroy(&w);
	free(b);
	free(col);
	stop_ok(f, 0);
	f->done = true;
}

/* --- test 2: 20,000 random requests ----------------------------------------- */

#define T2_CONNS 4
#define T2_THREADS 32

struct t2 {
	struct proto_client *cl[T2_CONNS];
	uint32_t n;
	uint32_t word_tokens[N_WORDS];
	atomic_uint next;
	atomic_uint errors, ok, masked;
	atomic_uint min_prompt, max_prompt;
	atomic_ullong prompt_sum, gen_sum;
	pthread_mutex_t mu;
	char first_error[SW_ERR_MAX];
	double t0;
};

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(rng_next(s) % n);
}

static void t2_error(struct t2 *t, const char *fmt, ...)
{
	va_list ap;

	atomic_fetch_add(&t->errors, 1);
	pthread_mutex_lock(&t->mu);
	if (!t->first_error[0]) {
		va_start(ap, fmt);
		vsnprintf(t->first_error, sizeof(t->first_error), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&t->mu);
}

/* Token count of one segment as gpud tokenizes it (BOS on the first). */
static int count_tokens(struct proto_client *cl, const char *text, uint32_t len, bool bos,
			uint32_t *n, char *err, size_t errlen)
{
	int32_t *ids = NULL;
	int rc = proto_client_tokenize(cl, text, len, bos ? PROTO_TOK_ADD_BOS : 0, &ids, n, err,
				       errlen);

	free(ids);
	return rc;
}

/* Builds request idx: target length 1..1000 tokens (estimated from the
 * words' token counts, BOS included), 1..16 segments, a random valid
 * descriptor (or none, one time in five), max_tokens 1..8, greedy or
 * sampled. */
static void t2_build(struct t2 *t, uint32_t idx, struct rbuf *b)
{
	uint64_t s = 0x5eed0000ull + idx;
	uint32_t target = 1 + rng_below(&s, 1000);
	uint32_t S = 1 + rng_below(&s, target < 16 ? target : 16);
	uint32_t budget = target > 1 ? target - 1 : 1; /* BOS takes one */
	uint32_t vis[17];

	rbuf_init(b, 1 + rng_below(&s, 8));
	if (rng_below(&s, 2)) {
		b->req.sampling.temperature = 0.8f;
		b->req.sampling.top_k = 40;
		b->req.sampling.seed = idx;
	}
	for (uint32_t i = 0; i < S; i++) {
		/* this segment's share of what is left, at least one word */
		uint32_t share = budget / (S - i);
		uint32_t got = 0;
		char seg[8192];
		size_t n = 0;

		if (i + 1 < S && share > 1)
			share = 1 + rng_below(&s, 2 * share - 1 < budget ? 2 * share - 1 : budget);
		do {
			uint32_t w = rng_below(&s, N_WORDS);
			size_t wl = strlen(words[w]);

			if (n + wl + 2 >= sizeof(seg))
				break;
			if (n)
				seg[n++] = ' ';
			memcpy(seg + n, words[w], wl);
			n += wl;
			got += t->word_tokens[w];
		} while (got < share);
		seg[n] = '\0';
		rbuf_seg(b, seg);
		budget = budget > got ? budget - got : 0;
		if (budget == 0 && i + 1 < S) {
			/* out of budget: stop with fewer segments */
			break;
		}
	}
	S = b->req.n_segments;
	if (rng_below(&s, 5) != 0) {
		for (uint32_t i = 0; i <= S; i++)
			vis[i] = (uint32_t)rng_next(&s);
		rbuf_mask(b, vis);
	}
}

static void *t2_worker(void *arg)
{
	struct t2 *t = arg;
	struct rbuf *b = malloc(sizeof(*b));
	unsigned me = 0;

	if (!b) {
		t2_error(t, "out of memory");
		return NULL;
	}
	for (;;) {
		uint32_t idx = atomic_fetch_add(&t->next, 1);
		struct proto_client *cl;
		struct proto_client_result res;
		uint32_t expect = 0;
		char err[SW_ERR_MAX] = "";
		int rc;

		if (idx >= t->n)
			break;
		cl = t->cl[(idx + me) % T2_CONNS];
		t2_build(t, idx, b);
		for (uint32_t i = 0; i < b->req.n_segments; i++) {
			uint32_t n = 0;

			rc = count_tokens(cl, b->seg[i].text, b->seg[i].len, i == 0, &n, err,
					  sizeof(err));
			if (rc) {
				t2_error(t, "request %u: tokenize: %s (%s)", idx, err, sw_errname(rc));
				goto next;
			}
			expect += n;
		}
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl, &b->req, &res, err, sizeof(err));
		if (rc) {
			t2_error(t, "request %u (%u segments, %u prompt tokens, mask %s): %s (%s)",
				 idx, b->req.n_segments, expect, b->req.mask ? "yes" : "no", err,
				 sw_errname(rc));
		} else if (res.usage.prompt_tokens != expect) {
			t2_error(t, "request %u: usage.prompt_tokens %u, tokenize says %u", idx,
				 res.usage.prompt_tokens, expect);
		} else if (res.usage.generated_tokens > b->req.max_tokens ||
			   res.n_ids != res.usage.generated_tokens) {
			t2_error(t, "request %u: %u tokens generated, %u ids, max_tokens %u", idx,
				 res.usage.generated_tokens, res.n_ids, b->req.max_tokens);
		} else {
			unsigned cur, done = atomic_fetch_add(&t->ok, 1) + 1;

			if (done % 2000 == 0)
				printf("    test 2: %u requests done after %.0f s\n", done,
				       gpud_it_now() - t->t0);
			if (b->req.mask)
				atomic_fetch_add(&t->masked, 1);
			atomic_fetch_add(&t->prompt_sum, expect);
			atomic_fetch_add(&t->gen_sum, res.usage.generated_tokens);
			cur = atomic_load(&t->min_prompt);
			while (expect < cur && !atomic_compare_exchange_weak(&t->min_prompt, &cur,
									    expect))
				;
			cur = atomic_load(&t->max_prompt);
			while (expect > cur && !atomic_compare_exchange_weak(&t->max_prompt, &cur,
									    expect))
				;
		}
		proto_client_result_free(&res);
next:
		me++;
	}
	free(b);
	return NULL;
}

static void test_20k_random_requests(void **state)
{
	struct gpud_it_fix *f = *state;
	/* 32 in flight, up to ~1010 tokens each: 64 blocks of 16 tokens per
	 * request; 2304 blocks per device hold all of them on one device. */
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 2304, \"max_seqs\": 40, \"max_batch_tokens\": 1024, "
			      "\"prefix_cache_bytes\": \"1MiB\", \"mask_cache_bytes\": \"1MiB\"",
	};
	struct t2 *t = calloc(1, sizeof(*t));
	pthread_t th[T2_THREADS];
	const char *env = getenv("GPUD_IT_REQUESTS");
	json_t *st;
	double t0, el;
	int64_t v, loop0, dev0;

	assert_non_null(t);
	t->n = env ? (uint32_t)strtoul(env, NULL, 10) : 20000;
	atomic_init(&t->next, 0);
	atomic_init(&t->min_prompt, UINT32_MAX);
	atomic_init(&t->max_prompt, 0);
	pthread_mutex_init(&t->mu, NULL);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	for (int k = 0; k < T2_CONNS; k++)
		assert_non_null(t->cl[k] = gpud_it_connect(&f->d[0]));
	for (size_t w = 0; w < N_WORDS; w++) {
		char err[SW_ERR_MAX] = "";
		int rc = count_tokens(t->cl[0], words[w], (uint32_t)strlen(words[w]), false,
				      &t->word_tokens[w], err, sizeof(err));

		if (rc)
			fail_msg("tokenize \"%s\": %s (%s)", words[w], err, sw_errname(rc));
		assert_true(t->word_tokens[w] >= 1);
	}

	/* Allocation counters before the load: connecting is allowed to
	 * allocate (a region and ring handle per connection); the requests
	 * and steps are not. */
	st = stats_idle(t->cl[0]);
	loop0 = jint(st, "alloc.since_warmup.host_loop");
	dev0 = jint(st, "alloc.since_warmup.host_device");
	json_decref(st);

	t0 = t->t0 = gpud_it_now();
	for (int i = 0; i < T2_THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, t2_worker, t), 0);
	for (int i = 0; i < T2_THREADS; i++)
		pthread_join(th[i], NULL);
	el = gpud_it_now() - t0;
	printf("    test 2: %u requests (%u with a descriptor) in %.1f s (%.0f req/s), "
	       "prompt tokens %u..%u, %llu prompt + %llu generated tokens, %u errors\n",
	       t->n, atomic_load(&t->masked), el, t->n / el, atomic_load(&t->min_prompt),
	       atomic_load(&t->max_prompt), (unsigned long long)atomic_load(&t->prompt_sum),
	       (unsigned long long)atomic_load(&t->gen_sum), atomic_load(&t->errors));
	if (atomic_load(&t->errors))
		fail_msg("%u of %u requests failed; first: %s", atomic_load(&t->errors), t->n,
			 t->first_error);
	assert_int_equal(atomic_load(&t->ok), t->n);
	if (t->n >= 1000) {
		/* the random lengths really span 1..1000 tokens */
		assert_true(atomic_load(&t->min_prompt) <= 6);
		assert_true(atomic_load(&t->max_prompt) >= 950);
	}

	st = stats_idle(t->cl[0]);
	if (!json_is_true(gpud_it_jget(st, "alloc.counted")))
		fail_msg("stats: alloc.counted is not true: allocations after warm-up are not "
			 "being counted, so \"0\" would prove nothing");
	assert_true(json_is_true(gpud_it_jget(st, "alloc.warm")));
	printf("    alloc.since_warmup: host %" PRId64 " (loop %" PRId64 ", device %" PRId64
	       ", other %" PRId64 "), device %" PRId64 "; before the requests: loop %" PRId64
	       ", device %" PRId64 "\n",
	       jint(st, "alloc.since_warmup.host"), jint(st, "alloc.since_warmup.host_loop"),
	       jint(st, "alloc.since_warmup.host_device"),
	       jint(st, "alloc.since_warmup.host_other"), jint(st, "alloc.since_warmup.device"),
	       loop0, dev0);
	/* nothing on the request path (loop) or the step path (device) */
	if (jint(st, "alloc.since_warmup.host_loop") != loop0)
		fail_msg("the loop thread allocated %" PRId64 " times during the requests",
			 jint(st, "alloc.since_warmup.host_loop") - loop0);
	assert_int_equal(jint(st, "alloc.since_warmup.host_device"), 0);
	assert_int_equal(jint(st, "alloc.since_warmup.device"), 0);
	v = jint(st, "requests.completed");
	assert_true(v >= (int64_t)t->n);
	assert_int_equal(jint(st, "requests.errors"), 0);
	{
		/* every generated token came from one logits row: greedy ones
		 * from an arg max, sampled ones read on the host (a CPU device
		 * draws nothing itself) */
		json_t *devs = json_object_get(st, "devices"), *d;
		int64_t am = 0, dr = 0, ho = 0;
		size_t i;

		json_array_foreach(devs, i, d) {
			am += jint_in(json_object_get(d, "rows"), "argmax");
			dr += jint_in(json_object_get(d, "rows"), "drawn");
			ho += jint_in(json_object_get(d, "rows"), "host");
		}
		printf("    logits rows: %" PRId64 " arg max, %" PRId64 " drawn, %" PRId64
		       " on the host, for %llu generated tokens\n", am, dr, ho,
		       (unsigned long long)atomic_load(&t->gen_sum));
		assert_true(am > 0 && ho > 0);
		assert_int_equal(dr, 0);
		assert_true(am + ho >= (int64_t)atomic_load(&t->gen_sum));
	}
	check_idle_pools(st, true);
	/* Last, since the cause lies outside the request path: DESIGN §2
	 * says allocations after warm-up stay 0, and gpud/server.h promises
	 * that accepting a connection mallocs nothing either. */
	if (jint(st, "alloc.since_warmup.host_loop") != 0)
		fail_msg("alloc.since_warmup.host_loop is %" PRId64 ", not 0: all of them before "
			 "the first request (%" PRId64 "), i.e. while accepting connections "
			 "(server.h: \"no malloc\" at accept)",
			 jint(st, "alloc.since_warmup.host_loop"), loop0);
	json_decref(st);

	for (int k = 0; k < T2_CONNS; k++)
		proto_client_close(t->cl[k]);
	pthread_mutex_destroy(&t->mu);
	free(t);
	stop_ok(f, 0);
	f->done = true;
}

/* --- test 3: mask cache ----------------------------------------------------- */

struct poller {
	struct proto_client *cl;
	atomic_bool stop;
	int64_t max_bytes_seen, bound;
	int violations, polls, failures;
	char what[256];
};

static void *poll_mask_bytes(void *arg)
{
	struct poller *p = arg;

	while (!atomic_load(&p->stop)) {
		json_t *st = gpud_it_stats(p->cl, false);
		json_t *caches, *c;
		size_t i;

		if (!st) {
			p->failures++;
			break;
		}
		p->polls++;
		caches = json_object_get(st, "caches");
		json_array_foreach(caches, i, c) {
			const char *name = json_string_value(json_object_get(c, "name"));
			json_t *b = json_object_get(c, "bytes"), *m = json_object_get(c, "max_bytes");

			if (!name || !(!strcmp(name, "mask") || ends_with(name, ".mask")))
				continue;
			if (!json_is_integer(b) || !json_is_integer(m)) {
				p->failures++;
				continue;
			}
			if (json_integer_value(b) > p->max_bytes_seen)
				p->max_bytes_seen = json_integer_value(b);
			if (json_integer_value(b) > json_integer_value(m) ||
			    json_integer_value(m) > p->bound) {
				if (!p->violations++)
					snprintf(p->what, sizeof(p->what),
						 "%s: bytes %" PRId64 " max_bytes %" PRId64
						 " (configured %" PRId64 ")",
						 name, (int64_t)json_integer_value(b),
						 (int64_t)json_integer_value(m), p->bound);
			}
		}
		json_decref(st);
		usleep(2000);
	}
	return NULL;
}

/* A request of S segments with the given lengths in words and vis rows. */
static void t3_req(struct rbuf *b, uint32_t S, const uint32_t *seg_words, const uint32_t *vis,
		   uint32_t salt)
{
	rbuf_init(b, 2);
	for (uint32_t i = 0; i < S; i++) {
		char seg[2048];
		size_t n = 0;

		for (uint32_t k = 0; k < seg_words[i]; k++)
			n += (size_t)snprintf(seg + n, sizeof(seg) - n, "%s%s", n ? " " : "",
					      words[(salt + i * 5 + k) % N_WORDS]);
		rbuf_seg(b, seg);
	}
	rbuf_mask(b, vis);
}

static void test_mask_cache(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 512, \"mask_cache_bytes\": \"32KiB\", "
			      "\"prefix_cache_bytes\": 0",
	};
	struct proto_client *cl, *cl2;
	struct rbuf *b = malloc(sizeof(*b));
	struct poller p = { .bound = 32768 };
	pthread_t th;
	json_t *st;
	int64_t hits0, miss0, ent0, ev0, hits1, miss1, ent1;
	uint32_t seg_words[4] = { 12, 20, 9, 30 };
	/* not causal: segment 2 does not see segment 1, G does not see 0 */
	uint32_t vis[5] = { 0, 1, 1, 7, 14 };
	char err[SW_ERR_MAX];
	int n_caches = 0;

	assert_non_null(b);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	assert_non_null(cl2 = gpud_it_connect(&f->d[0]));

	/* the same descriptor 4 times, one at a time: idle devices take turns
	 * (placement breaks ties by tokens placed), so each device that got
	 * it compiled it once and hit it after */
	st = stats_idle(cl);
	hits0 = mask_sum(st, "hits", &n_caches);
	miss0 = mask_sum(st, "misses", NULL);
	ent0 = mask_sum(st, "entries", NULL);
	json_decref(st);
	for (int k = 0; k < 4; k++) {
		struct proto_client_result res;
		int rc;

		t3_req(b, 4, seg_words, vis, 1);
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl, &b->req, &res, err, sizeof(err));
		if (rc)
			fail_msg("masked request %d: %s (%s)", k, err, sw_errname(rc));
		proto_client_result_free(&res);
	}
	st = stats_idle(cl);
	hits1 = mask_sum(st, "hits", NULL);
	miss1 = mask_sum(st, "misses", NULL);
	ent1 = mask_sum(st, "entries", NULL);
	printf("    test 3: %d mask cache(s); same descriptor 4 times: hits +%" PRId64
	       ", misses +%" PRId64 ", entries +%" PRId64 "\n",
	       n_caches, hits1 - hits0, miss1 - miss0, ent1 - ent0);
	assert_true(miss1 - miss0 >= 1 && miss1 - miss0 <= n_caches);
	assert_int_equal(hits1 - hits0, 4 - (miss1 - miss0));
	assert_int_equal(ent1 - ent0, miss1 - miss0);
	assert_int_equal(mask_sum(st, "pinned", NULL), 0);
	ev0 = mask_sum(st, "evictions", NULL);
	json_decref(st);

	/* many distinct descriptors under a 32 KiB bound (a handful of
	 * entries), polled meanwhile */
	p.cl = cl2;
	atomic_init(&p.stop, false);
	assert_int_equal(pthread_create(&th, NULL, poll_mask_bytes, &p), 0);
	{
		struct waiter w;
		struct collect *col = calloc(4, sizeof(*col));
		struct rbuf *bs = malloc(4 * sizeof(*bs));
		int failed = 0;

		assert_non_null(col);
		assert_non_null(bs);
		waiter_init(&w);
		for (uint32_t r = 0; r < 200; r += 4) {
			for (uint32_t k = 0; k < 4; k++) {
				uint32_t q = r + k;
				uint32_t sw[4] = { 3 + q % 17, 5 + q % 11, 2 + q % 7, 4 + q % 13 };
				uint32_t v[5] = { 0, q & 1, (q >> 1) & 3, (q >> 3) & 7,
						  (q >> 2) & 15 };

				memset(&col[k], 0, sizeof(col[k]));
				col[k].w = &w;
				t3_req(&bs[k], 4, sw, v, q);
				assert_int_equal(submit_collect(cl, &bs[k].req, &col[k], NULL), 0);
			}
			if (waiter_wait(&w, 120) != 0)
				fail_msg("masked requests did not end within 120 s");
			for (uint32_t k = 0; k < 4; k++)
				if (col[k].status && !failed++)
					fprintf(stderr, "request %u: %s: %s\n", r + k,
						sw_errname(col[k].status), col[k].msg);
		}
		waiter_destroy(&w);
		free(bs);
		free(col);
		atomic_store(&p.stop, true);
		pthread_join(th, NULL);
		if (failed)
			fail_msg("%d of 200 masked requests failed", failed);
	}
	st = stats_idle(cl);
	printf("    test 3: 200 distinct descriptors: evictions +%" PRId64 ", %d polls, "
	       "largest bytes seen %" PRId64 " (bound 32768)\n",
	       mask_sum(st, "evictions", NULL) - ev0, p.polls, p.max_bytes_seen);
	assert_int_equal(p.failures, 0);
	assert_true(p.polls > 0);
	if (p.violations)
		fail_msg("mask cache above its bound %d time(s); first: %s", p.violations, p.what);
	assert_true(mask_sum(st, "evictions", NULL) > ev0);
	assert_true(mask_sum(st, "bytes", NULL) <= 32768 * n_caches);
	assert_int_equal(mask_sum(st, "pinned", NULL), 0);
	json_decref(st);

	proto_client_close(cl2);
	proto_client_close(cl);
	free(b);
	stop_ok(f, 0);
	f->done = true;
}

/* --- test 4: prefix cache --------------------------------------------------- */

#define T4_SYSTEM                                                                   \
	"You are a storyteller. Tell short and happy stories for small children about " \
	"animals, friends and the park. Use simple words. Every story has a little girl " \
	"named Lily or a boy named Tom, a big red ball, a dog, a cat and a sunny day in " \
	"the park with many flowers and trees."

/* [preface, system, question]. The preface is shorter than a KV block, so
 * block 0 holds preface and system tokens. Mask A: everything sees
 * everything before it. Mask B: the system prompt does not see the
 * preface, so already block 0 has another attention pattern and no block
 * of a mask-A prompt may be reused. */
static void t4_req(struct rbuf *b, const char *question, bool mask_b)
{
	uint32_t vis_a[4] = { 0, 1, 3, 7 };
	uint32_t vis_b[4] = { 0, 0, 2, 6 };

	rbuf_init(b, 24);
	rbuf_seg(b, "Story:");
	rbuf_seg(b, T4_SYSTEM);
	rbuf_seg(b, question);
	rbuf_mask(b, mask_b ? vis_b : vis_a);
}

static const char *const t4_questions[] = {
	" Once upon a time, Lily went to the park.",
	" One day, Tom saw a big dog.",
	" The cat was very happy.",
};

static void test_prefix_cache(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts on = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": \"4MiB\"",
	};
	struct gpud_it_opts off = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": 0",
	};
	struct proto_client *c_on, *c_off;
	struct rbuf *b = malloc(sizeof(*b) * 4);
	struct proto_client_result r_on[4], r_off[4];
	struct collect *col = calloc(4, sizeof(*col));
	struct waiter w;
	char err[SW_ERR_MAX];
	int rc;

	assert_non_null(b);
	assert_non_null(col);
	assert_int_equal(gpud_it_start(&f->d[0], &on), 0);
	assert_int_equal(gpud_it_start(&f->d[1], &off), 0);
	assert_non_null(c_on = gpud_it_connect(&f->d[0]));
	assert_non_null(c_off = gpud_it_connect(&f->d[1]));

	/* Fill the prefix cache of both devices: four copies of request 0 in
	 * flight at once spread over the devices (placement by free blocks
	 * and queue depth). */
	waiter_init(&w);
	for (int k = 0; k < 4; k++) {
		t4_req(&b[k], t4_questions[0], false);
		col[k].w = &w;
		assert_int_equal(submit_collect(c_on, &b[k].req, &col[k], NULL), 0);
	}
	if (waiter_wait(&w, 120))
		fail_msg("warm-up requests did not end");
	for (int k = 0; k < 4; k++)
		if (col[k].status)
			fail_msg("warm-up request %d: %s: %s", k, sw_errname(col[k].status),
				 col[k].msg);
	waiter_destroy(&w);

	/* r[0], r[1]: same system prompt, same mask, other questions; r[2]:
	 * question 1 under mask B; r[3]: the same again under mask B. */
	for (int k = 0; k < 4; k++) {
		t4_req(&b[k], t4_questions[k == 0 ? 1 : k == 1 ? 2 : 1], k >= 2);
		memset(&r_on[k], 0, sizeof(r_on[k]));
		memset(&r_off[k], 0, sizeof(r_off[k]));
		rc = proto_client_generate(c_on, &b[k].req, &r_on[k], err, sizeof(err));
		if (rc)
			fail_msg("cached daemon, request %d: %s (%s)", k, err, sw_errname(rc));
		rc = proto_client_generate(c_off, &b[k].req, &r_off[k], err, sizeof(err));
		if (rc)
			fail_msg("uncached daemon, request %d: %s (%s)", k, err, sw_errname(rc));
		printf("    test 4: request %d (mask %c): prompt %u, cached %u (uncached daemon: "
		       "%u)\n",
		       k, k >= 2 ? 'B' : 'A', r_on[k].usage.prompt_tokens,
		       r_on[k].usage.cached_prompt_tokens, r_off[k].usage.cached_prompt_tokens);
	}
	/* the system prompt is several full blocks */
	assert_true(r_on[0].usage.prompt_tokens >= 48);
	assert_true(r_on[0].usage.cached_prompt_tokens > 0);
	assert_true(r_on[1].usage.cached_prompt_tokens > 0);
	assert_true(r_on[0].usage.cached_prompt_tokens < r_on[0].usage.prompt_tokens);
	/* the same text under mask B reuses nothing */
	assert_int_equal(r_on[2].usage.cached_prompt_tokens, 0);
	for (int k = 0; k < 4; k++) {
		assert_int_equal(r_off[k].usage.cached_prompt_tokens, 0);
		if (r_on[k].text_len != r_off[k].text_len ||
		    memcmp(r_on[k].text, r_off[k].text, r_on[k].text_len))
			fail_msg("request %d: cached output \"%s\" != uncached \"%s\"", k,
				 r_on[k].text, r_off[k].text);
		assert_int_equal(r_on[k].n_ids, r_off[k].n_ids);
		assert_memory_equal(r_on[k].ids, r_off[k].ids, r_on[k].n_ids * sizeof(int32_t));
		proto_client_result_free(&r_on[k]);
		proto_client_result_free(&r_off[k]);
	}

	proto_client_close(c_on);
	proto_client_close(c_off);
	free(col);
	free(b);
	stop_ok(f, 0);
	stop_ok(f, 1);
	f->done = true;
}

/* --- test 4b: placement follows the prefix ---------------------------------- */

#define T4B_N 8

static const char *const t4b_names[T4B_N] = {
	"Lily", "Tom", "Sam", "Ben", "Mia", "Sue", "Max", "Amy",
};

/* Prompt k: a name first (so no two prompts share a KV block), then the
 * story text; odd k as two segments under mask A (the daemon probes the
 * devices with the compiled mask), even k as one causal segment. */
static void t4b_req(struct rbuf *b, int k)
{
	uint32_t vis_a[3] = { 0, 1, 3 };
	char head[64];

	rbuf_init(b, 4);
	snprintf(head, sizeof(head), "%s and a friend.", t4b_names[k]);
	rbuf_seg(b, head);
	if (k & 1) {
		rbuf_seg(b, " " T4_SYSTEM);
		rbuf_mask(b, vis_a);
	} else {
		rbuf_seg(b, " " T4_SYSTEM " The end.");
	}
}

/* Sends the T4B_N prompts at once, in order or reversed (so that placement
 * by load alone would not repeat the first pass's devices); col[k] is
 * prompt k's result. */
static void t4b_pass(struct proto_client *cl, struct rbuf *b, struct collect *col, bool reverse)
{
	struct waiter w;

	waiter_init(&w);
	for (int i = 0; i < T4B_N; i++) {
		int k = reverse ? T4B_N - 1 - i : i;

		t4b_req(&b[k], k);
		memset(&col[k], 0, sizeof(col[k]));
		col[k].w = &w;
		assert_int_equal(submit_collect(cl, &b[k].req, &col[k], NULL), 0);
	}
	if (waiter_wait(&w, 120))
		fail_msg("placement requests did not end");
	for (int k = 0; k < T4B_N; k++)
		if (col[k].status)
			fail_msg("placement request %d: %s: %s", k, sw_errname(col[k].status),
				 col[k].msg);
	waiter_destroy(&w);
}

/* Sums devices[].key over the devices; per device into per[] (2). */
static int64_t dev_sum(json_t *st, const char *key, int64_t *per)
{
	json_t *devs = json_object_get(st, "devices");
	int64_t sum = 0;

	assert_int_equal(json_array_size(devs), 2);
	for (size_t i = 0; i < 2; i++) {
		per[i] = jint_in(json_array_get(devs, i), key);
		sum += per[i];
	}
	return sum;
}

/* Sums caches[].hit_tokens of the prefix caches. */
static int64_t prefix_hit_tokens(json_t *st)
{
	json_t *caches = json_object_get(st, "caches"), *c;
	int64_t sum = 0;
	size_t i;

	json_array_foreach(caches, i, c) {
		const char *name = json_string_value(json_object_get(c, "name"));

		if (name && ends_with(name, ".prefix"))
			sum += jint_in(c, "hit_tokens");
	}
	return sum;
}

/* Distinct prompts are spread by load; the same prompts sent again land
 * on the device caching them and are served from its cache (default
 * placement_margin: 8 requests in flight never exceed it). */
static void test_prefix_placement(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts on = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": \"4MiB\"",
	};
	struct proto_client *cl;
	struct rbuf *b = malloc(sizeof(*b) * T4B_N);
	struct collect *col = calloc(T4B_N, sizeof(*col));
	int64_t per_load[2], per_prefix[2], hits = 0;
	json_t *st;

	assert_non_null(b);
	assert_non_null(col);
	assert_int_equal(gpud_it_start(&f->d[0], &on), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));

	t4b_pass(cl, b, col, false);
	for (int k = 0; k < T4B_N; k++)
		assert_int_equal(col[k].usage.cached_prompt_tokens, 0);
	st = stats_idle(cl);
	assert_int_equal(dev_sum(st, "placed_load", per_load), T4B_N);
	assert_int_equal(dev_sum(st, "placed_prefix", per_prefix), 0);
	assert_true(per_load[0] > 0 && per_load[1] > 0); /* spread over both */
	assert_int_equal(prefix_hit_tokens(st), 0);
	json_decref(st);

	t4b_pass(cl, b, col, true);
	for (int k = 0; k < T4B_N; k++) {
		uint32_t n = col[k].usage.prompt_tokens;

		/* every full block but the one holding the last prompt token */
		assert_true(n >= 48);
		assert_int_equal(col[k].usage.cached_prompt_tokens, (n - 1) / 16 * 16);
		hits += col[k].usage.cached_prompt_tokens;
	}
	st = stats_idle(cl);
	assert_int_equal(dev_sum(st, "placed_load", per_load), T4B_N);
	assert_int_equal(dev_sum(st, "placed_prefix", per_prefix), T4B_N);
	printf("    test 4b: pass 1 by load %" PRId64 "+%" PRId64 ", pass 2 by prefix %" PRId64
	       "+%" PRId64 ", %" PRId64 " prompt tokens from the cache\n",
	       per_load[0], per_load[1], per_prefix[0], per_prefix[1], hits);
	/* each device got back what it had */
	assert_int_equal(per_prefix[0], per_load[0]);
	assert_int_equal(per_prefix[1], per_load[1]);
	assert_int_equal(prefix_hit_tokens(st), hits);
	check_idle_pools(st, true);
	json_decref(st);

	proto_client_close(cl);
	free(col);
	free(b);
	stop_ok(f, 0);
	f->done = true;
}

/* --- test 4c: chunk KV reused at any position -------------------------------- */

static const char *const t4c_chunks[3] = {
	" Lily had a big red ball. She liked to throw it high in the sky and catch it "
	"with both hands.",
	" Tom had a small brown dog. The dog liked to run after the ball and bring it back "
	"to him.",
	" The sun was warm and the flowers were yellow. A little bird sang in the tree "
	"all day long.",
};

/* [system, chunk a, chunk b, question]: the chunks see only themselves,
 * the question sees everything, G the chunks, the question and itself. */
static void t4c_req(struct rbuf *b, int a, int c, const char *question)
{
	uint32_t vis[5] = { 0, 0, 0, 0xf, 0x1e };

	rbuf_init(b, 6);
	rbuf_seg(b, T4_SYSTEM);
	rbuf_seg(b, t4c_chunks[a]);
	rbuf_seg(b, t4c_chunks[c]);
	rbuf_seg(b, question);
	rbuf_mask(b, vis);
}

/* The chunks of a first answer-style request come back in the other order
 * and company (so at other offsets) in later ones: copied from the chunk
 * cache of the device the prefix placed them on, K re-rotated, with the
 * greedy output of a daemon that computes everything. */
static void test_chunk_cache(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts on = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": \"4MiB\", "
			      "\"chunk_cache_bytes\": \"4MiB\"",
	};
	struct gpud_it_opts off = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": 0, "
			      "\"chunk_cache_bytes\": 0",
	};
	static const int order[3][2] = { { 0, 1 }, { 1, 0 }, { 2, 0 } };
	struct proto_client *c_on, *c_off;
	struct rbuf *b = malloc(sizeof(*b));
	struct proto_client_result r_on[3], r_off[3];
	int64_t hits[2], misses[2], tokens[2], sum_tokens, pfx;
	char err[SW_ERR_MAX];
	json_t *st;
	int rc;

	assert_non_null(b);
	assert_int_equal(gpud_it_start(&f->d[0], &on), 0);
	assert_int_equal(gpud_it_start(&f->d[1], &off), 0);
	assert_non_null(c_on = gpud_it_connect(&f->d[0]));
	assert_non_null(c_off = gpud_it_connect(&f->d[1]));
	for (int k = 0; k < 3; k++) {
		t4c_req(b, order[k][0], order[k][1], t4_questions[k]);
		memset(&r_on[k], 0, sizeof(r_on[k]));
		memset(&r_off[k], 0, sizeof(r_off[k]));
		rc = proto_client_generate(c_on, &b->req, &r_on[k], err, sizeof(err));
		if (rc)
			fail_msg("chunk cache on, request %d: %s (%s)", k, err, sw_errname(rc));
		rc = proto_client_generate(c_off, &b->req, &r_off[k], err, sizeof(err));
		if (rc)
			fail_msg("chunk cache off, request %d: %s (%s)", k, err, sw_errname(rc));
		printf("    test 4c: request %d (chunks %d, %d): prompt %u, cached %u\n", k,
		       order[k][0], order[k][1], r_on[k].usage.prompt_tokens,
		       r_on[k].usage.cached_prompt_tokens);
		assert_int_equal(r_off[k].usage.cached_prompt_tokens, 0);
		if (r_on[k].text_len != r_off[k].text_len ||
		    memcmp(r_on[k].text, r_off[k].text, r_on[k].text_len))
			fail_msg("request %d: output with chunk reuse \"%s\" != computed \"%s\"", k,
				 r_on[k].text, r_off[k].text);
		assert_int_equal(r_on[k].n_ids, r_off[k].n_ids);
		assert_memory_equal(r_on[k].ids, r_off[k].ids, r_on[k].n_ids * sizeof(int32_t));
	}
	st = stats_idle(c_on);
	/* request 1 copies both chunks of request 0, request 2 the first */
	assert_int_equal(dev_sum(st, "chunk_hits", hits), 3);
	assert_int_equal(dev_sum(st, "chunk_misses", misses), 3);
	sum_tokens = dev_sum(st, "chunk_hit_tokens", tokens);
	pfx = prefix_hit_tokens(st);
	assert_true(sum_tokens > 0);
	assert_int_equal(r_on[0].usage.cached_prompt_tokens, 0);
	assert_int_equal(r_on[1].usage.cached_prompt_tokens + r_on[2].usage.cached_prompt_tokens,
			 sum_tokens + pfx);
	/* all on the device holding the system prompt: placement by prefix */
	assert_true((hits[0] == 3 && hits[1] == 0) || (hits[0] == 0 && hits[1] == 3));
	printf("    test 4c: %" PRId64 " prompt tokens copied from the chunk cache, %" PRId64
	       " from the prefix cache\n", sum_tokens, pfx);
	check_idle_pools(st, true);
	json_decref(st);
	for (int k = 0; k < 3; k++) {
		proto_client_result_free(&r_on[k]);
		proto_client_result_free(&r_off[k]);
	}
	proto_client_close(c_on);
	proto_client_close(c_off);
	free(b);
	stop_ok(f, 0);
	stop_ok(f, 1);
	f->done = true;
}

/* --- test 5: a client killed mid-stream ------------------------------------- */

#define T5_REQS 48
#define T5_MAX 1000

/* The child: connects, submits T5_REQS long generations, writes one byte
 * to fd at the first token, then keeps reading until killed. */
static int on_tokens_signal(void *arg, uint64_t id, const struct proto_tokens *t)
{
	int *fd = arg;

	if (*fd >= 0) {
		char x = 'x';

		if (write(*fd, &x, 1) != 1)
			_exit(3);
		close(*fd);
		*fd = -1;
	}
	return 0;
}

/* A request that ends before any token came tells the parent ('e'). */
static void on_done_child(void *arg, uint64_t id, int status, const struct proto_done *u,
			  const char *msg)
{
	int *fd = arg;

	if (*fd >= 0 && status != 0) {
		char x = 'e';

		fprintf(stderr, "child: request %llu: %s: %s\n", (unsigned long long)id,
			sw_errname(status), msg);
		if (write(*fd, &x, 1) != 1)
			_exit(3);
		close(*fd);
		*fd = -1;
	}
}

static int stream_child(const char *sock, int fd)
{
	struct proto_client_opts o;
	struct proto_client *c = NULL;
	struct proto_client_events ev = {
		.on_tokens = on_tokens_signal, .on_done = on_done_child, .arg = &fd,
	};
	static char prompt[16384];
	struct proto_segment seg = { .text = prompt };
	struct proto_submit_req req = {
		.n_segments = 1, .segments = &seg, .max_tokens = T5_MAX,
	};
	char err[SW_ERR_MAX];
	size_t n = 0;

	/* 400 words, ~600 prompt tokens: the prefills alone keep gpud busy for a
	 * while, so most requests are in flight when the kill comes */
	for (int i = 0; i < 400; i++)
		n += (size_t)snprintf(prompt + n, sizeof(prompt) - n, "%s%s", i ? " " : "",
				      words[(i * 7 + i / 80) % N_WORDS]);
	seg.len = (uint32_t)n;

	proto_sampling_default(&req.sampling);
	req.sampling.temperature = 1.0f; /* long, varied streams */
	proto_client_opts_default(&o);
	if (proto_client_connect(&c, sock, &o, err, sizeof(err))) {
		fprintf(stderr, "child: connect: %s\n", err);
		return 2;
	}
	for (int i = 0; i < T5_REQS; i++) {
		req.sampling.seed = (uint64_t)i + 1;
		if (proto_client_submit(c, &req, &ev, NULL, err, sizeof(err))) {
			fprintf(stderr, "child: submit: %s\n", err);
			return 2;
		}
	}
	for (;;)
		pause();
}

static char self_exe[4096];

static void test_killed_client(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 4096, \"max_seqs\": 64, \"prefix_cache_bytes\": 0",
	};
	struct proto_client *cl;
	struct proto_client_result ref, res;
	struct collect *col = calloc(1, sizeof(*col));
	struct rbuf *b = malloc(sizeof(*b));
	struct waiter w;
	json_t *st;
	int64_t idle_used, busy_used, cancelled0, cancelled1;
	int pfd[2], wst;
	char fdarg[16], err[SW_ERR_MAX], x;
	pid_t child;
	double deadline;

	assert_non_null(col);
	assert_non_null(b);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	if (gen_text(cl, ONCE, 64, &ref, err, sizeof(err)))
		fail_msg("reference run: %s", err);
	st = stats_idle(cl);
	idle_used = kv_used(st);
	cancelled0 = jint(st, "requests.cancelled");
	json_decref(st);
	assert_int_equal(idle_used, 0);

	assert_int_equal(pipe(pfd), 0);
	snprintf(fdarg, sizeof(fdarg), "%d", pfd[1]);
	fflush(stdout);
	fflush(stderr);
	child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		close(pfd[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl(self_exe, self_exe, "--stream-child", f->d[0].socket, fdarg, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	/* the first token reached the child: its requests are streaming */
	{
		struct pollfd pp = { .fd = pfd[0], .events = POLLIN };

		if (poll(&pp, 1, 120000) != 1 || read(pfd[0], &x, 1) != 1 || x != 'x') {
			kill(child, SIGKILL);
			waitpid(child, &wst, 0);
			fail_msg("the streaming child got no token within 120 s, or a request "
				 "failed (see its message above)");
		}
	}
	close(pfd[0]);

	/* another client's request in flight while the child dies */
	waiter_init(&w);
	col->w = &w;
	rbuf_init(b, 64);
	rbuf_seg(b, ONCE);
	assert_int_equal(submit_collect(cl, &b->req, col, NULL), 0);

	st = stats(cl);
	busy_used = kv_used(st);
	json_decref(st);
	kill(child, SIGKILL);
	assert_int_equal(waitpid(child, &wst, 0), child);
	assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
	printf("    test 5: KV blocks used: idle %" PRId64 ", with the child streaming %" PRId64
	       "\n", idle_used, busy_used);
	assert_true(busy_used > idle_used);

	if (waiter_wait(&w, 120))
		fail_msg("the other client's request did not end");
	if (col->status)
		fail_msg("the other client's request failed: %s: %s", sw_errname(col->status),
			 col->msg);
	if (col->len != ref.text_len || memcmp(col->text, ref.text, ref.text_len))
		fail_msg("the other client's text changed: \"%s\" vs \"%s\"", col->text, ref.text);
	waiter_destroy(&w);

	/* the child's blocks come back (poll, bounded) */
	deadline = gpud_it_now() + 30;
	for (;;) {
		st = stats(cl);
		if (kv_used(st) == idle_used && jint(st, "requests.in_flight") == 0)
			break;
		if (gpud_it_now() > deadline)
			fail_msg("KV used %" PRId64 " (idle %" PRId64 "), in flight %" PRId64
				 " 30 s after the client was killed",
				 kv_used(st), idle_used, jint(st, "requests.in_flight"));
		json_decref(st);
		usleep(20000);
	}
	cancelled1 = jint(st, "requests.cancelled");
	printf("    test 5: after the kill: KV used %" PRId64 ", requests cancelled +%" PRId64
	       " (of %d the child had)\n", kv_used(st), cancelled1 - cancelled0, T5_REQS);
	/* they ended by cancellation, not by finishing */
	assert_true(cancelled1 - cancelled0 >= 1);
	check_idle_pools(st, false);
	json_decref(st);

	/* and the daemon keeps serving */
	if (gen_text(cl, ONCE, 64, &res, err, sizeof(err)))
		fail_msg("after the kill: %s", err);
	assert_int_equal(res.text_len, ref.text_len);
	assert_memory_equal(res.text, ref.text, ref.text_len);
	proto_client_result_free(&res);
	proto_client_result_free(&ref);
	proto_client_close(cl);
	free(b);
	free(col);
	stop_ok(f, 0);
	f->done = true;
}

/* --- test 6: malformed input ------------------------------------------------ */

/* A connection made by hand, below the client library. */
struct raw {
	int sock;
	struct proto_shm *shm;
	struct proto_ring *ring;
	const struct proto_shm_layout *lay;
};

static int raw_socket(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(s >= 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	return s;
}

/* Waits for a frame (timeout_ms); 0 and the decoded frame, SW_ECLOSED
 * at EOF, -ETIMEDOUT. *fd gets a passed descriptor (or -1). */
static int raw_recv(int sock, struct proto_frame *fr, int *fd, int timeout_ms)
{
	struct pollfd p = { .fd = sock, .events = POLLIN };
	uint8_t buf[PROTO_FRAME_SIZE];
	char err[SW_ERR_MAX];
	int rc;

	rc = poll(&p, 1, timeout_ms);
	if (rc == 0)
		return -ETIMEDOUT;
	rc = proto_recv_frame(sock, buf, fd);
	if (rc)
		return rc;
	rc = proto_frame_decode(buf, sizeof(buf), fr, err, sizeof(err));
	if (rc)
		fail_msg("gpud sent a bad frame: %s", err);
	return 0;
}

static void raw_open(struct raw *r, const char *path)
{
	struct proto_frame fr;
	char err[SW_ERR_MAX];
	int fd = -1;

	memset(r, 0, sizeof(*r));
	r->sock = raw_socket(path);
	proto_frame_init(&fr, PROTO_T_HELLO, 0);
	assert_int_equal(proto_send_frame(r->sock, &fr, -1), 0);
	assert_int_equal(raw_recv(r->sock, &fr, &fd, 10000), 0);
	assert_int_equal(fr.type, PROTO_T_HELLO_REPLY);
	assert_true(fd >= 0);
	if (proto_shm_attach(&r->shm, fd, 1u << 30, err, sizeof(err)))
		fail_msg("attach: %s", err);
	if (proto_shm_ring(r->shm, PROTO_RING_CONSUMER, &r->ring, err, sizeof(err)))
		fail_msg("ring: %s", err);
	r->lay = proto_shm_layout(r->shm);
}

static void raw_close(struct raw *r)
{
	proto_ring_close(r->ring);
	proto_shm_destroy(r->shm);
	if (r->sock >= 0)
		close(r->sock);
	r->sock = -1;
}

static void raw_send(struct raw *r, const struct proto_frame *fr)
{
	assert_int_equal(proto_send_frame(r->sock, fr, -1), 0);
}

static void raw_send_bytes(struct raw *r, const uint8_t *buf)
{
	assert_int_equal(send(r->sock, buf, PROTO_FRAME_SIZE, MSG_NOSIGNAL), PROTO_FRAME_SIZE);
}

/* Reads frames and ring records until the request `id` ends; returns its
 * status (0 for DONE, the error code otherwise), SW_ECLOSED when the
 * server closed the connection first. */
static int raw_wait_end(struct raw *r, uint64_t id, char *msg, size_t msglen)
{
	double deadline = gpud_it_now() + 60;

	if (msglen)
		msg[0] = '\0';
	for (;;) {
		struct proto_record rec;
		struct proto_frame fr;
		int rc;

		/* everything already in the ring */
		while (proto_ring_peek(r->ring, &rec) == 0) {
			if (rec.request_id == id && rec.type == PROTO_T_ERROR) {
				struct proto_error e;
				char err[SW_ERR_MAX];

				if (proto_error_decode(rec.payload, rec.len, &e, err, sizeof(err)))
					fail_msg("bad ERROR record: %s", err);
				snprintf(msg, msglen, "%s", e.msg);
				proto_ring_consume(r->ring);
				return e.code;
			}
			if (rec.request_id == id && rec.type == PROTO_T_DONE) {
				proto_ring_consume(r->ring);
				return 0;
			}
			proto_ring_consume(r->ring); /* another request's record */
		}
		if (gpud_it_now() > deadline)
			fail_msg("no end for request %" PRIu64 " within 60 s", id);
		rc = raw_recv(r->sock, &fr, NULL, 1000);
		if (rc == -ETIMEDOUT)
			continue;
		if (rc == -ECONNRESET || rc == -EPIPE)
			return SW_ECLOSED;
		if (rc)
			return rc;
		if (!(fr.flags & PROTO_F_RING) && fr.type == PROTO_T_ERROR && fr.request_id == id) {
			snprintf(msg, msglen, "(no payload)");
			return -(int)fr.aux;
		}
	}
}

/* Writes a SUBMIT payload for text at the start of the request area and
 * returns its length. */
static size_t raw_put_submit(struct raw *r, const char *text, uint32_t max_tokens)
{
	struct proto_segment seg = { .text = text, .len = (uint32_t)strlen(text) };
	struct proto_submit_req req = { .n_segments = 1, .segments = &seg,
					.max_tokens = max_tokens };
	uint8_t *area = proto_shm_req_area(r->shm);
	char err[SW_ERR_MAX];
	size_t len = 0;

	proto_sampling_default(&req.sampling);
	if (proto_submit_encode(&req, area, r->lay->req_size, &len, err, sizeof(err)))
		fail_msg("encode: %s", err);
	return len;
}

static void submit_frame(struct raw *r, struct proto_frame *fr, uint64_t id, uint64_t off,
			 uint64_t len)
{
	proto_frame_init(fr, PROTO_T_SUBMIT, id);
	fr->payload_offset = off;
	fr->payload_length = len;
}

/* A normal client is served (text == reference). */
static void still_served(struct proto_client *cl, const struct proto_client_result *ref,
			 const char *after)
{
	struct proto_client_result res;
	char err[SW_ERR_MAX] = "";
	int rc = gen_text(cl, ONCE, 32, &res, err, sizeof(err));

	if (rc)
		fail_msg("after %s: the other client failed: %s (%s)", after, err, sw_errname(rc));
	if (res.text_len != ref->text_len || memcmp(res.text, ref->text, ref->text_len))
		fail_msg("after %s: the other client's text changed", after);
	proto_client_result_free(&res);
}

static void expect_code(int got, int want, const char *what, const char *msg)
{
	if (got != want)
		fail_msg("%s: got %s (%s), expected %s", what, sw_errname(got), msg,
			 sw_errname(want));
	printf("    test 6: %-34s -> %s: %s\n", what, sw_errname(got), msg);
}

static void test_malformed_input(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 1024, \"prefix_cache_bytes\": 0, "
			      "\"ring_bytes\": \"64KiB\", \"stage_bytes\": \"4KiB\", "
			      "\"stall_ms\": 500",
	};
	struct proto_client *cl;
	struct proto_client_result ref;
	struct raw r;
	struct proto_frame fr;
	uint8_t bytes[PROTO_FRAME_SIZE];
	char msg[PROTO_MAX_ERROR_MSG], err[SW_ERR_MAX];
	size_t len;
	int rc;
	json_t *st;

	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	if (gen_text(cl, ONCE, 32, &ref, err, sizeof(err)))
		fail_msg("reference: %s", err);

	raw_open(&r, f->d[0].socket);
	/* a sane request on the raw connection works */
	len = raw_put_submit(&r, ONCE, 4);
	submit_frame(&r, &fr, 1, r.lay->req_off, len);
	raw_send(&r, &fr);
	expect_code(raw_wait_end(&r, 1, msg, sizeof(msg)), 0, "raw SUBMIT (valid)", msg);

	/* bad magic */
	proto_frame_init(&fr, PROTO_T_STATS, 101);
	fr.magic = 0xdeadbeef;
	proto_frame_encode(&fr, bytes);
	raw_send_bytes(&r, bytes);
	expect_code(raw_wait_end(&r, 101, msg, sizeof(msg)), SW_EFORMAT, "bad magic", msg);
	/* unknown type */
	proto_frame_init(&fr, PROTO_T_LAST + 40, 102);
	proto_frame_encode(&fr, bytes);
	raw_send_bytes(&r, bytes);
	expect_code(raw_wait_end(&r, 102, msg, sizeof(msg)), SW_EUNSUPPORTED, "unknown type",
		    msg);
	/* reserved flag bits */
	proto_frame_init(&fr, PROTO_T_STATS, 103);
	fr.flags = 0x80;
	proto_frame_encode(&fr, bytes);
	raw_send_bytes(&r, bytes);
	expect_code(raw_wait_end(&r, 103, msg, sizeof(msg)), SW_EFORMAT, "reserved flags", msg);
	/* payload in the region header, not the request area */
	submit_frame(&r, &fr, 104, 0, 64);
	raw_send(&r, &fr);
	expect_code(raw_wait_end(&r, 104, msg, sizeof(msg)), SW_EFORMAT,
		    "SUBMIT offset in the header", msg);
	/* payload running past the end of the region */
	submit_frame(&r, &fr, 105, r.lay->req_off + r.lay->req_size - 16, 4096);
	raw_send(&r, &fr);
	expect_code(raw_wait_end(&r, 105, msg, sizeof(msg)), SW_EFORMAT,
		    "SUBMIT past the region end", msg);
	/* offset + length overflowing u64 */
	submit_frame(&r, &fr, 106, UINT64_MAX - 8, 64);
	proto_frame_encode(&fr, bytes);
	raw_send_bytes(&r, bytes);
	expect_code(raw_wait_end(&r, 106, msg, sizeof(msg)), SW_EFORMAT,
		    "SUBMIT offset overflow", msg);
	/* longer than the whole request area */
	submit_frame(&r, &fr, 107, r.lay->req_off, r.lay->req_size + 4096);
	raw_send(&r, &fr);
	expect_code(raw_wait_end(&r, 107, msg, sizeof(msg)), SW_EFORMAT,
		    "SUBMIT longer than the area", msg);
	/* garbage payload: a segment count over every limit */
	memset(proto_shm_req_area(r.shm), 0xff, 256);
	submit_frame(&r, &fr, 108, r.lay->req_off, 256);
	raw_send(&r, &fr);
	rc = raw_wait_end(&r, 108, msg, sizeof(msg));
	if (rc != SW_EFORMAT && rc != SW_ETOOLONG)
		fail_msg("garbage SUBMIT payload: got %s (%s)", sw_errname(rc), msg);
	printf("    test 6: %-34s -> %s: %s\n", "garbage SUBMIT payload", sw_errname(rc), msg);
	/* a valid payload with trailing bytes */
	len = raw_put_submit(&r, ONCE, 4);
	submit_frame(&r, &fr, 109, r.lay->req_off, len + 16);
	raw_send(&r, &fr);
	expect_code(raw_wait_end(&r, 109, msg, sizeof(msg)), SW_EFORMAT,
		    "SUBMIT with trailing bytes", msg);
	/* after all that, the raw connection itself still works */
	len = raw_put_submit(&r, ONCE, 4);
	submit_frame(&r, &fr, 110, r.lay->req_off, len);
	raw_send(&r, &fr);
	expect_code(raw_wait_end(&r, 110, msg, sizeof(msg)), 0, "raw SUBMIT after errors", msg);
	still_served(cl, &ref, "malformed frames");

	/* a connection that keeps sending bad frames is closed */
	for (int i = 0; i < 40; i++) {
		proto_frame_init(&fr, PROTO_T_STATS, 200 + (uint64_t)i);
		fr.magic = 1;
		proto_frame_encode(&fr, bytes);
		if (send(r.sock, bytes, sizeof(bytes), MSG_NOSIGNAL) != (ssize_t)sizeof(bytes))
			break;
	}
	rc = raw_wait_end(&r, 999, msg, sizeof(msg));
	expect_code(rc, SW_ECLOSED, "40 bad frames in a row", "connection closed");
	raw_close(&r);
	still_served(cl, &ref, "a connection closed for bad frames");

	/* wrong version at HELLO: ERROR with aux SW_EVERSION, then closed */
	{
		int s = raw_socket(f->d[0].socket);
		int fd = -1;

		proto_frame_init(&fr, PROTO_T_HELLO, 0);
		fr.version = PROTO_VERSION + 1;
		proto_frame_encode(&fr, bytes);
		assert_int_equal(send(s, bytes, sizeof(bytes), MSG_NOSIGNAL), sizeof(bytes));
		rc = raw_recv(s, &fr, &fd, 10000);
		if (rc)
			fail_msg("wrong version: no reply (%s)", sw_errname(rc));
		assert_int_equal(fr.type, PROTO_T_ERROR);
		assert_int_equal(-(int)fr.aux, SW_EVERSION);
		assert_int_equal(fd, -1);
		assert_int_equal(raw_recv(s, &fr, NULL, 10000), SW_ECLOSED);
		printf("    test 6: %-34s -> %s, closed\n", "HELLO version 2", sw_errname(SW_EVERSION));
		close(s);
	}
	/* a frame before HELLO closes the connection */
	{
		int s = raw_socket(f->d[0].socket);

		proto_frame_init(&fr, PROTO_T_STATS, 5);
		proto_frame_encode(&fr, bytes);
		assert_int_equal(send(s, bytes, sizeof(bytes), MSG_NOSIGNAL), sizeof(bytes));
		for (;;) {
			rc = raw_recv(s, &fr, NULL, 10000);
			if (rc)
				break;
		}
		expect_code(rc, SW_ECLOSED, "STATS before HELLO", "connection closed");
		close(s);
	}
	still_served(cl, &ref, "bad HELLOs");

	/* oversized and impossible requests through the library */
	{
		struct rbuf *b = malloc(sizeof(*b));
		struct proto_client_result res;
		size_t big = 2u << 20; /* 2 MiB of text: over max_text_bytes (1 MiB) */
		char *text = malloc(big);
		struct proto_segment seg;

		assert_non_null(b);
		assert_non_null(text);
		for (size_t i = 0; i < big; i++)
			text[i] = "abcd "[i % 5];
		rbuf_init(b, 4);
		seg.text = text;
		seg.len = (uint32_t)big;
		seg.role = 0;
		seg.flags = 0;
		b->req.segments = &seg;
		b->req.n_segments = 1;
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl, &b->req, &res, msg, sizeof(msg));
		proto_client_result_free(&res);
		expect_code(rc, SW_ETOOLONG, "2 MiB of segment text", msg);

		/* about 3000 tokens: more than the 2048-token context */
		seg.len = 0;
		for (int i = 0; i < 3000; i++)
			seg.len += (uint32_t)sprintf(text + seg.len, "%s ", words[i % N_WORDS]);
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl, &b->req, &res, msg, sizeof(msg));
		proto_client_result_free(&res);
		expect_code(rc, SW_ETOOLONG, "prompt beyond the context", msg);

		/* prompt fits, prompt + max_tokens does not */
		rbuf_init(b, 4000);
		rbuf_seg(b, ONCE);
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl, &b->req, &res, msg, sizeof(msg));
		proto_client_result_free(&res);
		expect_code(rc, SW_ETOOLONG, "max_tokens beyond the context", msg);

		/* bad sampling parameters */
		rbuf_init(b, 4);
		rbuf_seg(b, ONCE);
		b->req.sampling.min_p = 2.0f;
		b->req.sampling.temperature = 1.0f;
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(cl, &b->req, &res, msg, sizeof(msg));
		proto_client_result_free(&res);
		expect_code(rc, -EINVAL, "min_p 2", msg);
		free(text);
		free(b);
	}
	still_served(cl, &ref, "oversized requests");

	/* a client that never reads its ring: long generations, no reads */
	{
		struct raw nr;
		int64_t stalled0, stalled1;
		double deadline;
		bool closed = false;

		st = stats(cl);
		stalled0 = jint(st, "connections.stalled");
		json_decref(st);
		raw_open(&nr, f->d[0].socket);
		len = raw_put_submit(&nr, ONCE, 1500);
		for (int i = 0; i < 8; i++) {
			/* the same payload bytes for every request: gpud copies
			 * or tokenizes at admission */
			submit_frame(&nr, &fr, 300 + (uint64_t)i, nr.lay->req_off, len);
			raw_send(&nr, &fr);
		}
		/* others are served meanwhile */
		still_served(cl, &ref, "a client stopped reading");
		deadline = gpud_it_now() + 60;
		for (;;) {
			st = stats(cl);
			stalled1 = jint(st, "connections.stalled");
			json_decref(st);
			if (stalled1 > stalled0)
				break;
			if (gpud_it_now() > deadline)
				fail_msg("a client that never reads was not detected within 60 s "
					 "(connections.stalled %" PRId64 ")", stalled1);
			still_served(cl, &ref, "a client stopped reading");
			usleep(100000);
		}
		/* the stalled connection is closed: socket EOF once the queued
		 * doorbells are read */
		deadline = gpud_it_now() + 30;
		while (gpud_it_now() < deadline) {
			rc = raw_recv(nr.sock, &fr, NULL, 1000);
			if (rc == SW_ECLOSED || (rc && rc != -ETIMEDOUT)) {
				closed = true;
				break;
			}
		}
		printf("    test 6: %-34s -> connections.stalled +%" PRId64 ", %s\n",
		       "client that never reads", stalled1 - stalled0,
		       closed ? "connection closed" : "connection still open");
		assert_true(closed);
		raw_close(&nr);
		st = stats_idle(cl);
		assert_int_equal(kv_used(st), 0);
		json_decref(st);
	}
	still_served(cl, &ref, "a stalled client was dropped");

	st = stats(cl);
	printf("    test 6: connections.bad_frames %" PRId64 "\n", jint(st, "connections.bad_frames"));
	assert_true(jint(st, "connections.bad_frames") >= 4);
	json_decref(st);
	proto_client_result_free(&ref);
	proto_client_close(cl);
	stop_ok(f, 0);
	f->done = true;
}

/* --- gpud.kv_type "f16" end to end ---------------------------------------------- */

/* unit_bytes of the first pool named "*.kv" (one KV block). */
static int64_t kv_unit_bytes(json_t *st)
{
	json_t *pools = json_object_get(st, "pools"), *p;
	size_t i;

	json_array_foreach(pools, i, p) {
		const char *name = json_string_value(json_object_get(p, "name"));

		if (name && ends_with(name, ".kv"))
			return jint_in(p, "unit_bytes");
	}
	fail_msg("stats: no kv pool");
	return 0;
}

#define TKV_N 16

/* Two servers on the same model, one storing K and V as f16: its KV
 * blocks are half the bytes; greedy "Once upon a time" gives the model
 * card's text on it too; the other prompts' greedy texts are compared
 * with the f32 server's and the count reported (a near tie may flip a
 * token: f16 rounds K and V); both end idle with nothing held. */
static void test_kv_f16(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o16 = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": 0, \"kv_type\": \"f16\"",
	};
	struct gpud_it_opts o32 = {
		.gpud_extra = "\"kv_blocks\": 512, \"prefix_cache_bytes\": 0",
	};
	struct proto_client *c16, *c32;
	struct rbuf *b = malloc(sizeof(*b));
	char prompt[256], err[SW_ERR_MAX];
	int same = 0, rc;
	int64_t u16, u32;
	json_t *st16, *st32;

	assert_non_null(b);
	assert_int_equal(gpud_it_start(&f->d[0], &o16), 0);
	assert_int_equal(gpud_it_start(&f->d[1], &o32), 0);
	assert_non_null(c16 = gpud_it_connect(&f->d[0]));
	assert_non_null(c32 = gpud_it_connect(&f->d[1]));
	for (int i = 0; i < TKV_N; i++) {
		struct proto_client_result r16, r32;

		t1_prompt(i, prompt, sizeof(prompt));
		rbuf_init(b, T1_MAX);
		rbuf_seg(b, prompt);
		memset(&r16, 0, sizeof(r16));
		memset(&r32, 0, sizeof(r32));
		rc = proto_client_generate(c16, &b->req, &r16, err, sizeof(err));
		if (rc)
			fail_msg("f16 KV request %d: %s (%s)", i, err, sw_errname(rc));
		rc = proto_client_generate(c32, &b->req, &r32, err, sizeof(err));
		if (rc)
			fail_msg("f32 KV request %d: %s (%s)", i, err, sw_errname(rc));
		if (i == 0 && strncmp(r16.text, ONCE_GREEDY, strlen(ONCE_GREEDY)))
			fail_msg("f16 KV: greedy \"" ONCE "\" gave \"%s\", the model card says "
				 "\"%s...\"", r16.text, ONCE_GREEDY);
		assert_true(r16.n_ids >= 1 && r16.n_ids <= T1_MAX);
		same += r16.text_len == r32.text_len && !memcmp(r16.text, r32.text, r16.text_len);
		proto_client_result_free(&r16);
		proto_client_result_free(&r32);
	}
	st16 = stats_idle(c16);
	st32 = stats_idle(c32);
	u16 = kv_unit_bytes(st16);
	u32 = kv_unit_bytes(st32);
	printf("    kv_type f16: KV block %" PRId64 " bytes (f32: %" PRId64 "); greedy text equal to "
	       "the f32 server's on %d of %d prompts\n", u16, u32, same, TKV_N);
	assert_true(u16 > 0 && 2 * u16 == u32);
	check_idle_pools(st16, false);
	check_idle_pools(st32, false);
	json_decref(st16);
	json_decref(st32);
	proto_client_close(c16);
	proto_client_close(c32);
	free(b);
	stop_ok(f, 0);
	stop_ok(f, 1);
	f->done = true;
}

/* --- 7. log probabilities -------------------------------------------------- */

/* One request's TOKENS_LP entries, as the walk gives them. */
struct lp_collect {
	struct collect c;
	bool plain_batch;              /* a TOKENS record came instead */
	int eog_at;                    /* the token flagged EOG, or -1 */
	uint32_t n;                    /* tokens */
	uint32_t n_top;
	int32_t id[64];
	float lp[64];
	int32_t top_id[64][PROTO_MAX_TOP_LOGPROBS];
	float top_lp[64][PROTO_MAX_TOP_LOGPROBS];
	char pieces[4096];             /* the tokens' own pieces, back to back */
	size_t pieces_len;
	/* the prompt's (PROTO_LP_PROMPT records, one token each) */
	uint32_t np;
	int32_t pid[1024];
	float plp[1024];
	bool prompt_after_gen;         /* a prompt record after a generated one */
};

static int on_tokens_lp(void *arg, uint64_t id, const struct proto_tokens *t)
{
	struct lp_collect *l = arg;
	struct proto_lp_iter it;
	struct proto_lp_entry e;

	if (!t->logprobs)
		l->plain_batch = true;
	if (t->prompt) {
		/* in order from the prompt's first token, which has no number
		 * and no alternatives (id -1) */
		l->prompt_after_gen |= l->n > 0;
		proto_lp_iter_init(&it, t);
		while (proto_lp_next(&it, &e)) {
			if (l->np == 0 && e.rank > 0)
				assert_true(e.id == -1 && isnan(e.logprob));
			if (e.rank == 0 && l->np < 1024) {
				l->pid[l->np] = e.id;
				l->plp[l->np] = e.logprob;
			}
		}
		l->np += t->n_ids;
		return 0;
	}
	if (t->eog) {
		assert_true(l->eog_at < 0);
		l->eog_at = (int)(l->n + t->n_ids - 1);
	}
	l->n_top = t->n_top;
	proto_lp_iter_init(&it, t);
	while (proto_lp_next(&it, &e)) {
		uint32_t k = l->n + e.token;
		if (k >= 64)
			continue;
		if (e.rank == 0) {
			assert_int_equal(e.id, proto_tokens_id(t, e.token));
			l->id[k] = e.id;
			l->lp[k] = e.logprob;
			if (l->pieces_len + e.piece_len < sizeof(l->pieces)) {
				memcpy(l->pieces + l->pieces_len, e.piece, e.piece_len);
				l->pieces_len += e.piece_len;
			}
		} else {
			l->top_id[k][e.rank - 1] = e.id;
			l->top_lp[k][e.rank - 1] = e.logprob;
		}
	}
	l->n += t->n_ids;
	return on_tokens(&l->c, id, t);
}

static void lp_run(struct proto_client *cl, struct rbuf *b, struct lp_collect *l,
		   struct waiter *w)
{
	struct proto_client_events ev = { .on_tokens = on_tokens_lp, .on_done = on_done, .arg = l };
	char err[SW_ERR_MAX] = "";

	memset(l, 0, sizeof(*l));
	l->eog_at = -1;
	l->c.w = w;
	waiter_add(w, 1);
	if (proto_client_submit(cl, &b->req, &ev, NULL, err, sizeof(err)))
		fail_msg("submit: %s", err);
	if (waiter_wait(w, 120) != 0)
		fail_msg("a logprobs request did not end within 120 s");
	assert_int_equal(l->c.status, 0);
}

/* Asking for log probabilities changes no token (greedy or drawn: the
 * row comes to the host, the same token is picked); each token's entry
 * is its own id with a log probability <= 0, its pieces spell the text,
 * the alternatives come likeliest first, and a greedy token is the
 * likeliest of all (its number equal to the first alternative's). */
static void test_logprobs(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 256" };
	struct rbuf *b = malloc(sizeof(*b));
	struct lp_collect *l = malloc(sizeof(*l));
	struct proto_client_result ref;
	struct proto_client *cl;
	struct waiter w;
	char err[SW_ERR_MAX];
	char ref_text[2][1024];

	assert_non_null(b);
	assert_non_null(l);
	waiter_init(&w);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	for (int sampled = 0; sampled < 2; sampled++) {
		rbuf_init(b, 24);
		rbuf_seg(b, ONCE);
		if (sampled) {
			b->req.sampling.temperature = 0.9f;
			b->req.sampling.top_k = 40;
			b->req.sampling.seed = 7;
		}
		memset(&ref, 0, sizeof(ref));
		assert_int_equal(proto_client_generate(cl, &b->req, &ref, err, sizeof(err)), 0);
		snprintf(ref_text[sampled], sizeof(ref_text[sampled]), "%s", ref.text);
		proto_client_result_free(&ref);
		if (!sampled)
			assert_true(!strncmp(ref_text[0], ONCE_GREEDY, strlen(ref_text[0])));

		for (uint32_t top = 0; top <= 20; top += 5) {
			b->req.flags = PROTO_SUBMIT_LOGPROBS | top << PROTO_SUBMIT_TOP_SHIFT;
			lp_run(cl, b, l, &w);
			assert_false(l->plain_batch);
			assert_int_equal(l->eog_at, -1);
			assert_int_equal(l->n_top, top);
			assert_int_equal(l->n, 24);
			assert_string_equal(l->c.text, ref_text[sampled]);
			assert_int_equal(l->pieces_len, l->c.len);
			assert_memory_equal(l->pieces, l->c.text, l->c.len);
			for (uint32_t k = 0; k < l->n; k++) {
				assert_true(l->lp[k] <= 0 && l->lp[k] > -1e4f);
				for (uint32_t j = 0; j < top; j++) {
					assert_true(l->top_lp[k][j] <= 0);
					if (j)
						assert_true(l->top_lp[k][j] <= l->top_lp[k][j - 1]);
					if (l->top_id[k][j] == l->id[k])
						assert_true(l->top_lp[k][j] == l->lp[k]);
				}
				if (top && !sampled) {
					assert_int_equal(l->top_id[k][0], l->id[k]);
					assert_true(l->top_lp[k][0] == l->lp[k]);
				}
			}
			if (top)
				printf("    logprobs: %s, top %u: first token %d at %.4f, its best "
				       "alternative %d at %.4f\n", sampled ? "drawn" : "greedy", top,
				       l->id[0], (double)l->lp[0], l->top_id[0][0],
				       (double)l->top_lp[0][0]);
		}
	}
	/* until the end of generation: the last token, and only it, is
	 * flagged EOG when that is why it ended */
	rbuf_init(b, 0);
	rbuf_seg(b, ONCE);
	b->req.sampling.temperature = 1.0f;
	b->req.sampling.seed = 1;
	b->req.flags = PROTO_SUBMIT_LOGPROBS | 2u << PROTO_SUBMIT_TOP_SHIFT;
	lp_run(cl, b, l, &w);
	printf("    logprobs until the end: %u tokens, stop reason %u, EOG flag on token %d\n",
	       l->n, l->c.usage.stop_reason, l->eog_at);
	if (l->c.usage.stop_reason == PROTO_STOP_EOG)
		assert_int_equal(l->eog_at, (int)l->n - 1);
	else
		assert_int_equal(l->eog_at, -1);
	/* a plain request after them still gets TOKENS */
	rbuf_init(b, 4);
	rbuf_seg(b, ONCE);
	lp_run(cl, b, l, &w);
	assert_true(l->plain_batch);
	assert_int_equal(l->n, 4);
	assert_int_equal(l->pieces_len, 0); /* no entries walked */
	waiter_destroy(&w);
	proto_client_close(cl);
	free(b);
	free(l);
	stop_ok(f, 0);
	f->done = true;
}

/* The prompt's log probabilities: one entry a prompt token, the first
 * without a number; a continuation scored as a prompt gets the numbers its
 * tokens had when they were generated; prompt_only generates nothing; and
 * the same long prompt scored a row at a time (logprob_rows 0) and 33 at
 * a time (32) agrees. */
/* Logit biases through the socket: -100 on the greedy answer's first
 * token bans it from the whole answer, greedy or drawn; +100 forces a
 * token at every step; biases in the request slot do not outlive it (the
 * next plain request is the plain answer again); an id outside the
 * vocabulary and a bias out of range are refused, naming them. */
static void test_logit_bias(void **state)
{
	struct gpud_it_fix *f = *state;
	struct rbuf *b = malloc(sizeof(*b));
	struct proto_client_result ref, r;
	struct proto_client *cl;
	char err[SW_ERR_MAX];
	struct proto_bias bias[2];

	assert_non_null(b);
	assert_int_equal(gpud_it_start(&f->d[0], NULL), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	assert_int_equal(gen_text(cl, ONCE, 16, &ref, err, sizeof(err)), 0);
	assert_int_equal(ref.n_ids, 16);
	int32_t first = ref.ids[0];
	for (int sampled = 0; sampled < 2; sampled++) {
		rbuf_init(b, 16);
		rbuf_seg(b, ONCE);
		if (sampled) {
			b->req.sampling.temperature = 1.0f;
			b->req.sampling.seed = 11;
		}
		bias[0] = (struct proto_bias){ first, -100.0f };
		b->req.n_bias = 1;
		b->req.bias = bias;
		memset(&r, 0, sizeof(r));
		assert_int_equal(proto_client_generate(cl, &b->req, &r, err, sizeof(err)), 0);
		assert_true(r.n_ids > 0);
		for (uint32_t i = 0; i < r.n_ids; i++)
			assert_int_not_equal(r.ids[i], first);
		proto_client_result_free(&r);
		/* forced: every token the biased one */
		bias[0].bias = 100.0f;
		b->req.max_tokens = 6;
		memset(&r, 0, sizeof(r));
		assert_int_equal(proto_client_generate(cl, &b->req, &r, err, sizeof(err)), 0);
		assert_int_equal(r.n_ids, 6);
		for (uint32_t i = 0; i < r.n_ids; i++)
			assert_int_equal(r.ids[i], first);
		proto_client_result_free(&r);
	}
	/* the slot forgets them: plain again */
	assert_int_equal(gen_text(cl, ONCE, 16, &r, err, sizeof(err)), 0);
	assert_memory_equal(r.ids, ref.ids, 16 * sizeof(int32_t));
	proto_client_result_free(&r);
	printf("    logit_bias: id %d banned and forced, greedy and drawn\n", first);

	rbuf_init(b, 4);
	rbuf_seg(b, ONCE);
	bias[0] = (struct proto_bias){ 3, 1.0f };
	bias[1] = (struct proto_bias){ 1 << 20, 1.0f };
	b->req.n_bias = 2;
	b->req.bias = bias;
	memset(&r, 0, sizeof(r));
	assert_int_equal(proto_client_generate(cl, &b->req, &r, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "logit_bias: token id 1048576 is not in the vocabulary"));
	proto_client_result_free(&r);
	bias[1] = (struct proto_bias){ 4, -101.0f };
	memset(&r, 0, sizeof(r));
	assert_int_equal(proto_client_generate(cl, &b->req, &r, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "token 4: bias -101"));
	proto_client_result_free(&r);
	proto_client_result_free(&ref);
	proto_client_close(cl);
	free(b);
	f->done = true;
}

/* DETOKENIZE against the real tokenizer: tokenize then detokenize gives
 * the text back (ASCII, multi-byte, leading and doubled spaces); with
 * PROTO_DETOK_SPECIAL the BOS is written by its text; a cut multi-byte
 * character ends as U+FFFD; an id outside the vocabulary is refused,
 * naming its position; no ids, no text. */
static void test_detokenize(void **state)
{
	struct gpud_it_fix *f = *state;
	struct proto_client *cl;
	char err[SW_ERR_MAX], *text = NULL;
	size_t len = 0;
	int32_t *ids = NULL;
	uint32_t n = 0;
	const char *texts[] = { ONCE, "  two  spaces", "h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5",
				"Tom said: \"no!\"\n" };

	assert_int_equal(gpud_it_start(&f->d[0], NULL), 0);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	for (size_t k = 0; k < sizeof(texts) / sizeof(texts[0]); k++) {
		assert_int_equal(proto_client_tokenize(cl, texts[k], strlen(texts[k]),
						       PROTO_TOK_ADD_BOS, &ids, &n, err, sizeof(err)),
				 0);
		assert_int_equal(proto_client_detokenize(cl, ids, n, 0, &text, &len, err,
							 sizeof(err)), 0);
		assert_string_equal(text, texts[k]);
		assert_int_equal(len, strlen(texts[k]));
		free(text);
		if (k == 0) {
			char want[256];
			snprintf(want, sizeof(want), "<s> %s", ONCE);
			assert_int_equal(proto_client_detokenize(cl, ids, n, PROTO_DETOK_SPECIAL, &text,
								 &len, err, sizeof(err)), 0);
			assert_string_equal(text, want);
			free(text);
		}
		free(ids);
	}
	/* the last byte of a three-byte character cut off */
	assert_int_equal(proto_client_tokenize(cl, "\xe6\x97\xa5", 3, 0, &ids, &n, err,
					       sizeof(err)), 0);
	/* the space prefix, then byte tokens: stories260K has no piece for it */
	assert_int_equal(n, 4);
	assert_int_equal(proto_client_detokenize(cl, ids, 3, 0, &text, &len, err, sizeof(err)),
			 0);
	assert_string_equal(text, "\xef\xbf\xbd");
	free(text);
	free(ids);
	const int32_t bad[] = { 1, 400, 1 << 24 };
	assert_int_equal(proto_client_detokenize(cl, bad, 3, 0, &text, &len, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "detokenize: token 2: id 16777216 is not in the vocabulary"));
	assert_null(text);
	assert_int_equal(proto_client_detokenize(cl, NULL, 0, 0, &text, &len, err, sizeof(err)), 0);
	assert_string_equal(text, "");
	free(text);
	proto_client_close(cl);
	f->done = true;
}

static void test_prompt_logprobs(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o[2] = {
		{ .gpud_extra = "\"kv_blocks\": 256, \"logprob_rows\": 32" },
		{ .gpud_extra = "\"kv_blocks\": 256, \"logprob_rows\": 0" },
	};
	struct rbuf *b = malloc(sizeof(*b));
	struct lp_collect *l = malloc(sizeof(*l)), *gen = malloc(sizeof(*gen));
	struct proto_client *cl[2];
	struct waiter w;
	static char text[10240];
	static float long_lp[2][1024];
	uint32_t n_once, n_long[2];
	double worst = 0;

	assert_non_null(b);
	assert_non_null(l);
	assert_non_null(gen);
	waiter_init(&w);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(gpud_it_start(&f->d[k], &o[k]), 0);
		assert_non_null(cl[k] = gpud_it_connect(&f->d[k]));
	}
	/* 16 greedy tokens after ONCE, with their log probabilities */
	rbuf_init(b, 16);
	rbuf_seg(b, ONCE);
	b->req.flags = PROTO_SUBMIT_LOGPROBS;
	lp_run(cl[0], b, gen, &w);
	assert_int_equal(gen->n, 16);
	assert_int_equal(gen->np, 0);
	/* ONCE alone, scored */
	b->req.flags = PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS |
		       PROTO_SUBMIT_PROMPT_ONLY | 2u << PROTO_SUBMIT_TOP_SHIFT;
	lp_run(cl[0], b, l, &w);
	n_once = l->np;
	assert_int_equal(l->n, 0); /* nothing generated */
	assert_int_equal(l->c.usage.generated_tokens, 0);
	assert_int_equal(l->c.usage.prompt_tokens, n_once);
	assert_int_equal(l->c.usage.stop_reason, PROTO_STOP_MAX_TOKENS);
	assert_true(isnan(l->plp[0]));
	for (uint32_t k = 1; k < n_once; k++)
		assert_true(l->plp[k] <= 0 && l->plp[k] > -100);
	/* ONCE and the continuation, scored: its tokens' numbers as generated */
	snprintf(text, sizeof(text), "%s%s", ONCE, gen->c.text);
	rbuf_init(b, 16);
	rbuf_seg(b, text);
	b->req.flags = PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS |
		       PROTO_SUBMIT_PROMPT_ONLY;
	lp_run(cl[0], b, l, &w);
	assert_int_equal(l->np, n_once + 16);
	for (uint32_t j = 0; j < 16; j++) {
		assert_int_equal(l->pid[n_once + j], gen->id[j]); /* the same tokens */
		double dlt = fabs((double)l->plp[n_once + j] - gen->lp[j]);
		worst = dlt > worst ? dlt : worst;
	}
	printf("    prompt logprobs: %u prompt tokens; the continuation's 16 scored as a prompt "
	       "against as generated: worst difference %.3g\n", n_once, worst);
	assert_true(worst < 1e-3);
	/* with generation: the prompt's entries first, then the tokens */
	rbuf_init(b, 4);
	rbuf_seg(b, ONCE);
	b->req.flags = PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS;
	lp_run(cl[0], b, l, &w);
	assert_int_equal(l->np, n_once);
	assert_int_equal(l->n, 4);
	assert_false(l->prompt_after_gen);
	assert_true(!strncmp(l->c.text, gen->c.text, l->c.len)); /* the same words */
	/* a long prompt (several chunks; ~400 tokens) scored 33 rows and 1 row
	 * a step alike */
	text[0] = '\0';
	for (int i = 0; strlen(text) < 1500; i++) {
		strcat(text, words[(i * 7 + 3) % N_WORDS]);
		strcat(text, " ");
	}
	for (int k = 0; k < 2; k++) {
		rbuf_init(b, 1);
		rbuf_seg(b, text);
		b->req.flags = PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS |
			       PROTO_SUBMIT_PROMPT_ONLY | 1u << PROTO_SUBMIT_TOP_SHIFT;
		lp_run(cl[k], b, l, &w);
		n_long[k] = l->np;
		assert_true(l->np > 100 && l->np <= 1024);
		memcpy(long_lp[k], l->plp, sizeof(float) * l->np);
	}
	assert_int_equal(n_long[0], n_long[1]);
	worst = 0;
	for (uint32_t k = 1; k < n_long[0]; k++) {
		double dlt = fabs((double)long_lp[0][k] - long_lp[1][k]);
		worst = dlt > worst ? dlt : worst;
	}
	printf("    prompt logprobs: %u tokens scored 33 and 1 rows a step: worst difference "
	       "%.3g\n", n_long[0], worst);
	assert_true(worst < 1e-3);
	waiter_destroy(&w);
	for (int k = 0; k < 2; k++) {
		proto_client_close(cl[k]);
		stop_ok(f, k);
	}
	free(b);
	free(l);
	free(gen);
	f->done = true;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		GPUD_IT_FIX_TEST(test_concurrent_equals_sequential),
		GPUD_IT_FIX_TEST(test_20k_random_requests),
		GPUD_IT_FIX_TEST(test_mask_cache),
		GPUD_IT_FIX_TEST(test_prefix_cache),
		GPUD_IT_FIX_TEST(test_prefix_placement),
		GPUD_IT_FIX_TEST(test_chunk_cache),
		GPUD_IT_FIX_TEST(test_kv_f16),
		GPUD_IT_FIX_TEST(test_killed_client),
		GPUD_IT_FIX_TEST(test_malformed_input),
		GPUD_IT_FIX_TEST(test_logprobs),
		GPUD_IT_FIX_TEST(test_prompt_logprobs),
		GPUD_IT_FIX_TEST(test_logit_bias),
		GPUD_IT_FIX_TEST(test_detokenize),
	};
	ssize_t n;

	if (argc == 4 && !strcmp(argv[1], "--stream-child"))
		return stream_child(argv[2], atoi(argv[3]));
	n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0)
		return 1;
	self_exe[n] = '\0';
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (getenv("GPUD_IT_ONLY")) /* e.g. GPUD_IT_ONLY=test_mask_cache */
		cmocka_set_test_filter(getenv("GPUD_IT_ONLY"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
