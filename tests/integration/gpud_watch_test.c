/* gpud_watch_test.c - the trough watchdog of a real `gpud serve`, both
 * ways (issue 11, DESIGN §2: it watches what live requests hold, not what
 * a bounded cache keeps). One cpu device, windows of 200 ms, k = 3
 * (gpud.watchdog), a prefix cache of 8 KV blocks and a mask cache of 48
 * masks, and a stream of requests whose prompts (three KV blocks and a
 * bit) and two-segment masks all differ:
 *
 *  1. caches filling to their bounds: the stream runs until both caches
 *     are full and evicting and then for many more windows; no pool ever
 *     rises, no warning in STATS or in the log; at rest the kv and mask
 *     pools hold exactly what their caches keep (live 0, cached = used,
 *     within the bound and > 0).
 *  2. a planted mask leak (GPUD_TEST_LEAK=mask:2: one finished request in
 *     two keeps its mask pinned) under the same stream: the others fill
 *     the mask cache to its bound, and once it is full and evicting (its
 *     pool's use flat at the bound, what the watchdog once watched)
 *     cpu0.mask is reported rising, with the warning in STATS and the
 *     log, before the leaked pins take every slot; cpu0.kv does not rise.
 *  3. a planted KV leak (GPUD_TEST_LEAK=kv: every freed sequence keeps its
 *     last block) behind a full, evicting prefix cache: cpu0.kv rises.
 *  4. a GPUD_TEST_LEAK gpud does not know refuses to start.
 *
 * "Within the configured windows": a leak is reported at the close of
 * the k-th window whose trough rose; the stream leaks a few units per
 * window, so the tests bound the number of leaks (not the time) it may
 * take, and print how many windows it took.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/client.h"
#include "tests/integration/gpud_harness.h"

#define WINDOW_MS 200
#define K 3
#define MASK_ENTRIES 48      /* 87 KiB of 1856-byte slots (context 256) */
#define PREFIX_BLOCKS 8      /* 160 KiB of 20 KiB blocks */
#define PACE_US 40000        /* between requests: several per window */

/* The chunk-KV cache is off: the kv pool's cache bound is the prefix
 * cache's alone (these prompts have no self-only segment but the first,
 * which it never stores anyway). */
#define CONFIG                                                                        \
	"\"context\": 256, \"max_seqs\": 4, \"kv_blocks\": 256, "                         \
	"\"prefix_cache_bytes\": \"160KiB\", \"mask_cache_bytes\": \"87KiB\", "          \
	"\"chunk_cache_bytes\": 0, "                                                     \
	"\"max_connections\": 4, \"queue\": {\"global\": 16, \"per_connection\": 16}, " \
	"\"watchdog\": {\"window_ms\": 200, \"k\": 3}"

static const char *const words[] = {
	"the", "little", "girl", "boy", "dog", "cat", "ball", "park", "sun", "happy",
	"big", "red", "tree", "play", "friend", "mom", "said", "was", "and", "to",
	"bird", "fish", "blue", "jump", "run", "house", "box", "good", "sad", "look",
	"help", "water", "car", "boat", "flower", "garden", "cake", "king", "magic", "sky",
};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

/* Request idx of the stream: two segments of 24 + idx % 13 and 6 + idx /
 * 13 % 11 words (so the masks of the first 143 differ), words drawn from
 * idx (so the prompts, and their KV blocks, differ), a causal mask over
 * the two segments, 4 tokens. */
struct req {
	char text[2][1024];
	struct proto_segment seg[2];
	struct proto_mask_row rows[3];
	struct proto_mask_desc desc;
	struct proto_submit_req r;
};

static const uint16_t row_idx[] = { 0, 1, 2 };

static void req_make(struct req *q, uint32_t idx)
{
	uint32_t n[2] = { 24 + idx % 13, 6 + idx / 13 % 11 };
	uint64_t x = 0x9e3779b97f4a7c15ull * (idx + 1);

	memset(q, 0, sizeof(*q));
	for (int s = 0; s < 2; s++) {
		size_t len = 0;

		for (uint32_t k = 0; k < n[s]; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			len += (size_t)snprintf(q->text[s] + len, sizeof(q->text[s]) - len, "%s%s",
						len ? " " : "", words[x % N_WORDS]);
		}
		q->seg[s] = (struct proto_segment){ .text = q->text[s], .len = (uint32_t)len,
						    .role = PROTO_ROLE_NONE };
	}
	/* spelled out row by row (rows NULL would be no mask at all) */
	for (int i = 0; i < 3; i++)
		q->rows[i] = (struct proto_mask_row){ .idx = row_idx, .n = (uint16_t)(i + 1) };
	q->desc = (struct proto_mask_desc){ .n_segments = 2, .rows = q->rows };
	q->r.segments = q->seg;
	q->r.n_segments = 2;
	q->r.mask = &q->desc;
	proto_sampling_default(&q->r.sampling);
	q->r.max_tokens = 4;
}

static void send_one(struct proto_client *cl, uint32_t idx)
{
	struct proto_client_result res;
	char err[SW_ERR_MAX] = "";
	struct req *q = malloc(sizeof(*q));
	int rc;

	assert_non_null(q);
	req_make(q, idx);
	memset(&res, 0, sizeof(res));
	rc = proto_client_generate(cl, &q->r, &res, err, sizeof(err));
	if (rc)
		fail_msg("request %u: %s (%s)", idx, err, sw_errname(rc));
	proto_client_result_free(&res);
	free(q);
}

static json_t *stats(struct proto_client *cl)
{
	json_t *st = gpud_it_stats(cl, false);

	if (!st)
		fail_msg("STATS failed");
	return st;
}

static int64_t num(json_t *o, const char *path)
{
	int64_t v = 0;

	if (gpud_it_jint(o, path, &v))
		fail_msg("stats: %s missing or not an integer", path);
	return v;
}

static json_t *pool(json_t *st, const char *name)
{
	json_t *p = gpud_it_named(json_object_get(st, "pools"), name);

	if (!p)
		fail_msg("stats: pool %s missing", name);
	return p;
}

static json_t *cache(json_t *st, const char *name)
{
	json_t *c = gpud_it_named(json_object_get(st, "caches"), name);

	if (!c)
		fail_msg("stats: cache %s missing", name);
	return c;
}

static bool rising(json_t *p)
{
	return json_is_true(json_object_get(p, "rising"));
}

static void print_pool(const char *when, json_t *p)
{
	printf("    %s: %-10s used %3" PRId64 " = live %3" PRId64 " + cached %3" PRId64
	       " (cache %s, bound %" PRId64 "), trough %" PRId64 " (k windows ago %" PRId64
	       ")%s\n", when, json_string_value(json_object_get(p, "name")), num(p, "used"),
	       num(p, "live"), num(p, "cached"),
	       json_string_value(json_object_get(p, "cache")), num(p, "cache_bound"),
	       num(p, "trough"), num(p, "trough_k_ago"), rising(p) ? " RISING" : "");
}

static struct gpud_it_opts opts(void)
{
	return (struct gpud_it_opts){ .devices = "[\"cpu\"]", .threads = 1, .gpud_extra = CONFIG };
}

/* Starts slot 0 with GPUD_TEST_LEAK=leak (NULL: unset) in its
 * environment only. */
static void start(struct gpud_it_fix *f, const char *leak)
{
	struct gpud_it_opts o = opts();
	int rc;

	if (leak)
		setenv("GPUD_TEST_LEAK", leak, 1);
	rc = gpud_it_start(&f->d[0], &o);
	unsetenv("GPUD_TEST_LEAK");
	assert_int_equal(rc, 0);
}

/* Polls STATS until both pools hold nothing for a live request (the
 * device thread samples after each step and every 100 ms when idle). */
static json_t *at_rest(struct proto_client *cl)
{
	double deadline = gpud_it_now() + 30;

	for (;;) {
		json_t *st = stats(cl);

		if (num(st, "requests.in_flight") == 0 && num(pool(st, "cpu0.kv"), "live") == 0 &&
		    num(pool(st, "cpu0.mask"), "live") == 0)
			return st;
		if (gpud_it_now() > deadline) {
			print_pool("not at rest", pool(st, "cpu0.kv"));
			print_pool("not at rest", pool(st, "cpu0.mask"));
			fail_msg("the pools did not come back to live 0 within 30 s");
		}
		json_decref(st);
		usleep(20000);
	}
}

/* --- 1: caches filling to their bounds raise nothing ------------------------- */

static void test_caches_fill_no_warning(void **state)
{
	struct gpud_it_fix *f = *state;
	struct proto_client *cl;
	json_t *st, *kv, *mask;
	uint32_t idx = 0, full_at = 0;
	double t_full = 0;
	int polls = 0;

	start(f, NULL);
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	st = stats(cl);
	assert_int_equal(num(st, "watchdog.window_ms"), WINDOW_MS);
	assert_int_equal(num(st, "watchdog.k"), K);
	assert_int_equal(num(pool(st, "cpu0.kv"), "cache_bound"), PREFIX_BLOCKS);
	assert_int_equal(num(pool(st, "cpu0.mask"), "cache_bound"), MASK_ENTRIES);
	json_decref(st);

	/* until both caches have evicted, then 2 * (k + 2) windows more */
	for (;;) {
		bool full;

		send_one(cl, idx++);
		usleep(PACE_US);
		st = stats(cl);
		polls++;
		kv = pool(st, "cpu0.kv");
		mask = pool(st, "cpu0.mask");
		if (rising(kv) || rising(mask) || json_is_true(gpud_it_jget(st, "watchdog.rising"))) {
			print_pool("rose", kv);
			print_pool("rose", mask);
			fail_msg("a pool rose while the caches filled (request %u): %s", idx,
				 json_dumps(gpud_it_jget(st, "watchdog.warnings"), 0));
		}
		assert_int_equal(json_array_size(gpud_it_jget(st, "watchdog.warnings")), 0);
		full = num(cache(st, "cpu0.prefix"), "evictions") > 0 &&
		       num(cache(st, "cpu0.mask"), "evictions") > 0;
		if (full && !full_at) {
			full_at = idx;
			t_full = gpud_it_now();
			print_pool("caches full", kv);
			print_pool("caches full", mask);
		}
		json_decref(st);
		if (full_at && gpud_it_now() - t_full > 2.0 * (K + 2) * WINDOW_MS / 1000.0)
			break;
		if (idx >= 143) /* the distinct masks run out */
			fail_msg("the caches were not full and evicting after %u requests "
				 "(full at %u)", idx, full_at);
	}

	st = at_rest(cl);
	kv = pool(st, "cpu0.kv");
	mask = pool(st, "cpu0.mask");
	print_pool("at rest", kv);
	print_pool("at rest", mask);
	printf("    %u requests, %d STATS polls, caches full and evicting from request %u "
	       "on; prefix evictions %" PRId64 ", mask evictions %" PRId64 "\n", idx, polls,
	       full_at, num(cache(st, "cpu0.prefix"), "evictions"),
	       num(cache(st, "cpu0.mask"), "evictions"));
	/* at rest the pools hold what the caches keep, and the caches are full */
	assert_int_equal(num(kv, "cached"), num(kv, "used"));
	assert_int_equal(num(kv, "cached"), PREFIX_BLOCKS);
	assert_string_equal(json_string_value(json_object_get(kv, "cache")), "cpu0.prefix");
	assert_int_equal(num(mask, "cached"), num(mask, "used"));
	assert_int_equal(num(mask, "cached"), MASK_ENTRIES);
	assert_int_equal(num(mask, "cached"), num(cache(st, "cpu0.mask"), "entries"));
	assert_int_equal(num(kv, "trough"), 0);
	assert_int_equal(num(mask, "trough"), 0);
	assert_false(rising(kv) || rising(mask));
	json_decref(st);
	assert_false(gpud_it_file_has(f->d[0].log, "trough"));

	proto_client_close(cl);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

/* --- 2, 3: planted leaks are reported --------------------------------------- */

/* Runs the stream on a daemon started with GPUD_TEST_LEAK=leak until
 * pool `leaking` is rising while its cache (`cache`) is full and evicting;
 * at most max_requests requests. The other pool must not rise. */
static void leak_reported(struct gpud_it_fix *f, const char *leak, const char *leaking,
			  const char *cache_name, const char *other, uint32_t max_requests)
{
	struct proto_client *cl;
	json_t *st = NULL, *p;
	uint32_t idx = 0, first_rise = 0, full_at = 0;
	char needle[128];
	double t0;

	start(f, leak);
	assert_true(gpud_it_file_has(f->d[0].log, "GPUD_TEST_LEAK: leaking on purpose"));
	assert_non_null(cl = gpud_it_connect(&f->d[0]));
	t0 = gpud_it_now();
	for (;;) {
		send_one(cl, idx++);
		usleep(PACE_US);
		st = stats(cl);
		p = pool(st, leaking);
		if (rising(pool(st, other))) {
			print_pool("rose", pool(st, other));
			fail_msg("%s: pool %s rose, not %s", leak, other, leaking);
		}
		if (rising(p) && !first_rise) {
			first_rise = idx;
			print_pool("first rise", p);
		}
		if (num(cache(st, cache_name), "evictions") > 0 && !full_at) {
			full_at = idx;
			print_pool("cache full", p);
		}
		if (rising(p) && full_at)
			break;
		if (idx >= max_requests) {
			print_pool("after the leaks", p);
			fail_msg("%s: after %u requests pool %s was not reported rising behind a "
				 "full cache (first rise at request %u, cache full at %u)", leak, idx,
				 leaking, first_rise, full_at);
		}
		json_decref(st);
	}
	print_pool("rising", p);
	printf("    GPUD_TEST_LEAK=%s: first reported after %u requests; reported behind the "
	       "full cache (full from request %u) after %u, %.1f windows of %d ms\n", leak,
	       first_rise, full_at, idx, (gpud_it_now() - t0) * 1000.0 / WINDOW_MS, WINDOW_MS);
	/* the pool is full up to its cache's bound: its use alone says nothing */
	assert_true(num(p, "used") >= num(p, "cache_bound"));
	assert_true(num(p, "cached") > 0);
	snprintf(needle, sizeof(needle), "pool %s: trough held by live requests rose from ",
		 leaking);
	assert_non_null(strstr(json_string_value(json_object_get(p, "warning")), needle));
	assert_true(json_is_true(gpud_it_jget(st, "watchdog.rising")));
	assert_non_null(strstr(json_string_value(gpud_it_jget(st, "watchdog.warnings[0]")),
			       needle));
	assert_true(num(p, "trough") > num(p, "trough_k_ago"));
	json_decref(st);
	snprintf(needle, sizeof(needle), "memwatch: pool %s: trough held by live requests rose",
		 leaking);
	/* the log line is written before STATS can see the flag */
	assert_true(gpud_it_file_has(f->d[0].log, needle));
	proto_client_close(cl);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

static void test_mask_leak_reported(void **state)
{
	/* the cache is full after MASK_ENTRIES requests, half of them leaked;
	 * the leaked pins take every slot MASK_ENTRIES more requests later
	 * (a new mask is then refused) */
	leak_reported(*state, "mask:2", "cpu0.mask", "cpu0.mask", "cpu0.kv",
		      2 * MASK_ENTRIES - 8);
}

static void test_kv_leak_reported(void **state)
{
	/* the prefix cache is full after a few requests: the leak is behind
	 * it; 100 leaked blocks of 256 at most */
	leak_reported(*state, "kv", "cpu0.kv", "cpu0.prefix", "cpu0.mask", 100);
}

/* --- 4: a leak gpud does not know ------------------------------------------- */

static void test_bad_leak_refused(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = opts();
	int rc;

	o.no_wait = true;
	static const char *const bad[][2] = {
		{ "mask,sockets", "\"sockets\"" },
		{ "kv:0", "\"kv:0\"" },
		{ "mask:2x", "\"mask:2x\"" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char needle[96];

		o.no_wait = true;
		setenv("GPUD_TEST_LEAK", bad[i][0], 1);
		rc = gpud_it_start(&f->d[i % 2], &o);
		unsetenv("GPUD_TEST_LEAK");
		assert_int_equal(rc, 0);
		assert_int_equal(gpud_it_wait_exit(&f->d[i % 2], 60000), 1);
		snprintf(needle, sizeof(needle), "GPUD_TEST_LEAK: unknown leak %s", bad[i][1]);
		if (!gpud_it_file_has(f->d[i % 2].log, needle))
			fail_msg("GPUD_TEST_LEAK=%s: no \"%s\" in the log", bad[i][0], needle);
		gpud_it_free(&f->d[i % 2]);
		memset(&f->d[i % 2], 0, sizeof(f->d[i % 2]));
	}
	f->done = true;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		GPUD_IT_FIX_TEST(test_caches_fill_no_warning),
		GPUD_IT_FIX_TEST(test_mask_leak_reported),
		GPUD_IT_FIX_TEST(test_kv_leak_reported),
		GPUD_IT_FIX_TEST(test_bad_leak_refused),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
