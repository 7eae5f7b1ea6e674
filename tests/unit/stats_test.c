/* stats_test.c - STATS/MEM JSON and Prometheus rendering: every key and
 * value read back with jansson, odd names (quotes, control characters,
 * UTF-8, invalid bytes, names without NUL), the buffer-too-small path at
 * every length, Prometheus lines checked against the text format's
 * grammar, and no allocation while rendering (gpud/alloc_hook.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/err.h"
#include "gpud/jsonw.h"
#include "gpud/stats.h"

#define BIG (1 << 20)

static char *big; /* BIG bytes, shared by the tests */

static void fill(struct gpud_stats_snapshot *s, uint32_t nd, uint32_t np, uint32_t nc)
{
	memset(s, 0, sizeof(*s));
	s->version = "0.4.0";
	s->chat_format = "deepseek-r1";
	s->watchdog_window_ms = 60000;
	s->watchdog_k = 10;
	s->uptime_s = 12.5;
	s->draining = true;
	s->requests.admitted = 101;
	s->requests.completed = 102;
	s->requests.errors = 103;
	s->requests.cancelled = 104;
	s->requests.busy = 105;
	s->requests.refused = 106;
	s->requests.in_flight = 107;
	s->tokens.prompt = 201;
	s->tokens.cached_prompt = 202;
	s->tokens.generated = 9007199254740993ull; /* 2^53 + 1: not a double */
	s->tokens.per_s = 1234.25;
	s->connections.open = 301;
	s->connections.high = 302;
	s->connections.accepted = 303;
	s->connections.bad_frames = 304;
	s->connections.stalled = 305;
	s->connections.refused_peer = 306;
	s->alloc_counted = true;
	s->alloc_warm = true;
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++) {
		s->alloc_total.host_allocs[r] = 1000 + (uint64_t)r;
		s->alloc_total.host_frees[r] = 900 + (uint64_t)r;
		s->alloc_total.host_bytes[r] = 100000 + (uint64_t)r;
		s->alloc_since_warmup.host_allocs[r] = 10 + (uint64_t)r;
		s->alloc_since_warmup.host_frees[r] = 20 + (uint64_t)r;
		s->alloc_since_warmup.host_bytes[r] = 30 + (uint64_t)r;
	}
	s->alloc_total.device_allocs = 5;
	s->alloc_total.device_bytes = 5000;
	s->alloc_since_warmup.device_allocs = 0;
	s->alloc_since_warmup.device_bytes = 0;
	s->n_devices = nd;
	for (uint32_t i = 0; i < nd; i++) {
		struct gpud_stats_device *d = &s->devices[i];

		snprintf(d->name, sizeof(d->name), "cpu%u", i);
		d->queue = 10 * i + 1;
		d->running = 10 * i + 2;
		d->steps = 10 * i + 3;
		d->tokens = 10 * i + 4;
		d->generated = 10 * i + 5;
		d->preemptions = 10 * i + 6;
		d->placed_prefix = 10 * i + 7;
		d->placed_load = 10 * i + 8;
		d->alloc_device = 100 * i + 14;
		d->prefix_hits = 10 * i + 9;
		d->prefix_hit_tokens = 100 * i + 10;
		d->chunk_hits = 100 * i + 11;
		d->chunk_misses = 100 * i + 12;
		d->chunk_hit_tokens = 100 * i + 13;
		d->rows_argmax = 100 * i + 15;
		d->rows_drawn = 100 * i + 16;
		d->rows_host = 100 * i + 17;
		d->failed = i; /* the second one failed */
	}
	s->n_pools = np;
	for (uint32_t i = 0; i < np; i++) {
		struct gpud_stats_pool *p = &s->pools[i];

		snprintf(p->name, sizeof(p->name), "cpu%u.kv", i);
		p->unit = "blocks";
		p->unit_bytes = 4096;
		p->capacity = 100 * i + 1;
		p->used = 100 * i + 2;
		p->free = 100 * i + 3;
		p->high = 100 * i + 4;
		p->largest_free_run = 100 * i + 5;
		p->live = 100 * i + 1;
		p->cached = 1;
		if (i % 2)
			snprintf(p->cache, sizeof(p->cache), "cpu%u.prefix", i);
		p->cache_bound = i % 2 ? 50 : 0;
		p->trough = 100 * i + 6;
		p->trough_k_ago = 100 * i + 7;
		p->rising = i == 1;
		if (p->rising)
			snprintf(p->warning, sizeof(p->warning), "pool %s trough rose", p->name);
	}
	s->n_caches = nc;
	for (uint32_t i = 0; i < nc; i++) {
		struct gpud_stats_cache *c = &s->caches[i];

		snprintf(c->name, sizeof(c->name), "cache%u", i);
		c->hits = 1000 * i + 1;
		c->misses = 1000 * i + 2;
		c->evictions = 1000 * i + 3;
		c->bytes = 1000 * i + 4;
		c->max_bytes = 1000 * i + 5;
		c->entries = 1000 * i + 6;
		c->max_entries = 1000 * i + 7;
		c->pinned = 1000 * i + 8;
		c->hit_tokens = 1000 * i + 9;
	}
}

static json_t *parse(const char *buf, size_t len)
{
	json_error_t e;
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &e);

	if (!j)
		fail_msg("JSON does not parse: %s at %d: %.*s", e.text, e.position, (int)len, buf);
	return j;
}

static uint64_t u(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v))
		fail_msg("%s is not an integer", key);
	return (uint64_t)json_integer_value(v);
}

static void check_counts(json_t *o, const struct gpud_alloc_counts *c)
{
	assert_true(json_is_object(o));
	assert_int_equal(json_object_size(o), 9);
	/* gpud's threads; the foreign ones on their own */
	assert_int_equal(u(o, "host"), c->host_allocs[GPUD_ALLOC_OTHER] +
					c->host_allocs[GPUD_ALLOC_LOOP] +
					c->host_allocs[GPUD_ALLOC_DEVICE]);
	assert_int_equal(u(o, "host_foreign"), c->host_allocs[GPUD_ALLOC_FOREIGN]);
	assert_int_equal(u(o, "host_loop"), c->host_allocs[GPUD_ALLOC_LOOP]);
	assert_int_equal(u(o, "host_device"), c->host_allocs[GPUD_ALLOC_DEVICE]);
	assert_int_equal(u(o, "host_other"), c->host_allocs[GPUD_ALLOC_OTHER]);
	assert_int_equal(u(o, "device"), c->device_allocs);
	assert_int_equal(u(o, "host_frees"), c->host_frees[GPUD_ALLOC_OTHER] +
					      c->host_frees[GPUD_ALLOC_LOOP] +
					      c->host_frees[GPUD_ALLOC_DEVICE]);
	assert_int_equal(u(o, "host_bytes"), c->host_bytes[GPUD_ALLOC_OTHER] +
					      c->host_bytes[GPUD_ALLOC_LOOP] +
					      c->host_bytes[GPUD_ALLOC_DEVICE]);
	assert_int_equal(u(o, "device_bytes"), c->device_bytes);
}

static void check_common(json_t *j, const struct gpud_stats_snapshot *s)
{
	json_t *a, *arr, *w;

	assert_string_equal(json_string_value(json_object_get(j, "version")), s->version);
	assert_true(json_real_value(json_object_get(j, "uptime_s")) == s->uptime_s);
	assert_true(json_is_boolean(json_object_get(j, "draining")));
	assert_int_equal(json_is_true(json_object_get(j, "draining")), s->draining);

	a = json_object_get(j, "alloc");
	assert_int_equal(json_object_size(a), 4);
	assert_true(json_is_true(json_object_get(a, "counted")));
	assert_true(json_is_true(json_object_get(a, "warm")));
	check_counts(json_object_get(a, "since_warmup"), &s->alloc_since_warmup);
	check_counts(json_object_get(a, "total"), &s->alloc_total);

	arr = json_object_get(j, "pools");
	assert_true(json_is_array(arr));
	assert_int_equal(json_array_size(arr), s->n_pools);
	for (uint32_t i = 0; i < s->n_pools; i++) {
		json_t *p = json_array_get(arr, i);
		const struct gpud_stats_pool *e = &s->pools[i];

		assert_int_equal(json_object_size(p), 16);
		assert_string_equal(json_string_value(json_object_get(p, "name")), e->name);
		assert_string_equal(json_string_value(json_object_get(p, "unit")), e->unit);
		assert_int_equal(u(p, "unit_bytes"), e->unit_bytes);
		assert_int_equal(u(p, "capacity"), e->capacity);
		assert_int_equal(u(p, "used"), e->used);
		assert_int_equal(u(p, "free"), e->free);
		assert_int_equal(u(p, "high"), e->high);
		assert_int_equal(u(p, "largest_free_run"), e->largest_free_run);
		assert_int_equal(u(p, "live"), e->live);
		assert_int_equal(u(p, "cached"), e->cached);
		assert_string_equal(json_string_value(json_object_get(p, "cache")), e->cache);
		assert_int_equal(u(p, "cache_bound"), e->cache_bound);
		assert_int_equal(u(p, "trough"), e->trough);
		assert_int_equal(u(p, "trough_k_ago"), e->trough_k_ago);
		assert_int_equal(json_is_true(json_object_get(p, "rising")), e->rising);
		assert_string_equal(json_string_value(json_object_get(p, "warning")), e->warning);
	}
	arr = json_object_get(j, "caches");
	assert_int_equal(json_array_size(arr), s->n_caches);
	for (uint32_t i = 0; i < s->n_caches; i++) {
		json_t *c = json_array_get(arr, i);
		const struct gpud_stats_cache *e = &s->caches[i];

		assert_int_equal(json_object_size(c), 10);
		assert_string_equal(json_string_value(json_object_get(c, "name")), e->name);
		assert_int_equal(u(c, "hits"), e->hits);
		assert_int_equal(u(c, "misses"), e->misses);
		assert_int_equal(u(c, "evictions"), e->evictions);
		assert_int_equal(u(c, "bytes"), e->bytes);
		assert_int_equal(u(c, "max_bytes"), e->max_bytes);
		assert_int_equal(u(c, "entries"), e->entries);
		assert_int_equal(u(c, "max_entries"), e->max_entries);
		assert_int_equal(u(c, "pinned"), e->pinned);
		assert_int_equal(u(c, "hit_tokens"), e->hit_tokens);
	}
	w = json_object_get(j, "watchdog");
	assert_int_equal(json_object_size(w), 4);
	assert_int_equal(u(w, "window_ms"), s->watchdog_window_ms);
	assert_int_equal(u(w, "k"), s->watchdog_k);
	arr = json_object_get(w, "warnings");
	if (s->n_pools > 1) {
		assert_true(json_is_true(json_object_get(w, "rising")));
		assert_int_equal(json_array_size(arr), 1);
		assert_string_equal(json_string_value(json_array_get(arr, 0)), s->pools[1].warning);
	} else {
		assert_true(json_is_false(json_object_get(w, "rising")));
		assert_int_equal(json_array_size(arr), 0);
	}
}

static void test_stats_json(void **state)
{
	static struct gpud_stats_snapshot s;
	json_t *j, *o, *arr;
	size_t len = 0;

	(void)state;
	fill(&s, 2, 3, 2);
	s.n_left_out = 1;
	s.left_out[0] = (struct gpud_stats_left_out){ "cuda3", "cuda:3",
						      "gpud.devices[3]: cuda:3: \"gone\"" };
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, &len), 0);
	j = parse(big, len);
	assert_int_equal(json_object_size(j), 13);
	check_common(j, &s);
	assert_string_equal(json_string_value(json_object_get(j, "chat_format")), "deepseek-r1");

	o = json_object_get(j, "requests");
	assert_int_equal(json_object_size(o), 7);
	assert_int_equal(u(o, "admitted"), 101);
	assert_int_equal(u(o, "completed"), 102);
	assert_int_equal(u(o, "errors"), 103);
	assert_int_equal(u(o, "cancelled"), 104);
	assert_int_equal(u(o, "busy"), 105);
	assert_int_equal(u(o, "refused"), 106);
	assert_int_equal(u(o, "in_flight"), 107);
	o = json_object_get(j, "tokens");
	assert_int_equal(json_object_size(o), 4);
	assert_int_equal(u(o, "prompt"), 201);
	assert_int_equal(u(o, "cached_prompt"), 202);
	assert_int_equal(u(o, "generated"), 9007199254740993ull);
	assert_true(json_number_value(json_object_get(o, "per_s")) == 1234.25);
	o = json_object_get(j, "connections");
	assert_int_equal(json_object_size(o), 6);
	assert_int_equal(u(o, "open"), 301);
	assert_int_equal(u(o, "high"), 302);
	assert_int_equal(u(o, "accepted"), 303);
	assert_int_equal(u(o, "bad_frames"), 304);
	assert_int_equal(u(o, "stalled"), 305);
	assert_int_equal(u(o, "refused_peer"), 306);
	arr = json_object_get(j, "devices");
	assert_int_equal(json_array_size(arr), 2);
	for (uint32_t i = 0; i < 2; i++) {
		json_t *d = json_array_get(arr, i);

		assert_int_equal(json_object_size(d), 17);
		assert_string_equal(json_string_value(json_object_get(d, "name")), s.devices[i].name);
		assert_int_equal(u(d, "queue"), 10 * i + 1);
		assert_int_equal(u(d, "running"), 10 * i + 2);
		assert_int_equal(u(d, "steps"), 10 * i + 3);
		assert_int_equal(u(d, "tokens"), 10 * i + 4);
		assert_int_equal(u(d, "generated"), 10 * i + 5);
		assert_int_equal(u(d, "preemptions"), 10 * i + 6);
		assert_int_equal(u(d, "placed_prefix"), 10 * i + 7);
		assert_int_equal(u(d, "placed_load"), 10 * i + 8);
		assert_int_equal(u(json_object_get(d, "alloc"), "device"), 100 * i + 14);
		assert_int_equal(u(d, "prefix_hits"), 10 * i + 9);
		assert_int_equal(u(d, "prefix_hit_tokens"), 100 * i + 10);
		assert_int_equal(u(d, "chunk_hits"), 100 * i + 11);
		assert_int_equal(u(d, "chunk_misses"), 100 * i + 12);
		assert_int_equal(u(d, "chunk_hit_tokens"), 100 * i + 13);
		assert_int_equal(u(json_object_get(d, "rows"), "argmax"), 100 * i + 15);
		assert_int_equal(u(json_object_get(d, "rows"), "drawn"), 100 * i + 16);
		assert_int_equal(u(json_object_get(d, "rows"), "host"), 100 * i + 17);
		assert_true(json_is_boolean(json_object_get(d, "failed")));
		assert_true(json_is_true(json_object_get(d, "failed")) == (i == 1));
	}
	/* the devices gpud started without (gpud.min_devices) */
	arr = json_object_get(j, "left_out");
	assert_int_equal(json_array_size(arr), 1);
	o = json_array_get(arr, 0);
	assert_int_equal(json_object_size(o), 3);
	assert_string_equal(json_string_value(json_object_get(o, "name")), "cuda3");
	assert_string_equal(json_string_value(json_object_get(o, "device")), "cuda:3");
	assert_string_equal(json_string_value(json_object_get(o, "error")),
			    "gpud.devices[3]: cuda:3: \"gone\"");
	assert_null(json_object_get(j, "dump"));
	json_decref(j);

	/* none left out: an empty list */
	s.n_left_out = 0;
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, &len), 0);
	j = parse(big, len);
	assert_int_equal(json_array_size(json_object_get(j, "left_out")), 0);
	json_decref(j);
}

static void test_mem_json(void **state)
{
	static struct gpud_stats_snapshot s;
	json_t *j;
	size_t len = 0;

	(void)state;
	fill(&s, 2, 3, 2);
	s.dump_path = "/tmp/gpud-\"owners\".json";
	assert_int_equal(gpud_stats_json(&s, true, big, BIG, &len), 0);
	j = parse(big, len);
	assert_int_equal(json_object_size(j), 8);
	check_common(j, &s);
	assert_null(json_object_get(j, "chat_format"));
	assert_null(json_object_get(j, "requests"));
	assert_null(json_object_get(j, "tokens"));
	assert_null(json_object_get(j, "connections"));
	assert_null(json_object_get(j, "devices"));
	assert_null(json_object_get(j, "left_out"));
	assert_string_equal(json_string_value(json_object_get(j, "dump")), s.dump_path);
	json_decref(j);

	/* no dump: no key */
	s.dump_path = NULL;
	assert_int_equal(gpud_stats_json(&s, true, big, BIG, &len), 0);
	j = parse(big, len);
	assert_int_equal(json_object_size(j), 7);
	assert_null(json_object_get(j, "dump"));
	json_decref(j);
}

static void test_not_counted_and_odd_numbers(void **state)
{
	static struct gpud_stats_snapshot s;
	json_t *j, *a;
	size_t len = 0;

	(void)state;
	fill(&s, 0, 0, 0);
	s.alloc_counted = false;
	s.alloc_warm = false;
	s.version = NULL;
	s.uptime_s = NAN;
	s.tokens.per_s = INFINITY;
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, &len), 0);
	j = parse(big, len);
	assert_true(json_is_null(json_object_get(j, "version")));
	s.chat_format = NULL;
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, &len), 0);
	json_decref(j);
	j = parse(big, len);
	assert_string_equal(json_string_value(json_object_get(j, "chat_format")), "none");
	assert_true(json_is_null(json_object_get(j, "uptime_s")));
	assert_true(json_is_null(json_object_get(json_object_get(j, "tokens"), "per_s")));
	a = json_object_get(j, "alloc");
	assert_true(json_is_false(json_object_get(a, "counted")));
	assert_true(json_is_false(json_object_get(a, "warm")));
	assert_true(json_is_null(json_object_get(a, "since_warmup")));
	assert_true(json_is_null(json_object_get(a, "total")));
	assert_int_equal(json_array_size(json_object_get(j, "devices")), 0);
	assert_int_equal(json_array_size(json_object_get(j, "pools")), 0);
	json_decref(j);

	/* Prometheus: no count series when not counted; NaN/+Inf are legal */
	assert_int_equal(gpud_stats_prometheus(&s, big, BIG, &len), 0);
	big[len] = 0;
	assert_non_null(strstr(big, "\ngpud_alloc_counted 0\n"));
	assert_null(strstr(big, "gpud_alloc_total"));
	assert_null(strstr(big, "gpud_alloc_since_warmup"));
	assert_non_null(strstr(big, "\ngpud_uptime_seconds NaN\n"));
	assert_non_null(strstr(big, "\ngpud_tokens_per_second +Inf\n"));
	assert_non_null(strstr(big, "\ngpud_info{version=\"\"} 1\n"));

	/* counts beyond the arrays are clamped */
	fill(&s, 2, 2, 2);
	s.n_devices = 1000;
	s.n_pools = 1000;
	s.n_caches = 1000;
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, &len), 0);
	j = parse(big, len);
	assert_int_equal(json_array_size(json_object_get(j, "devices")), GPUD_STATS_MAX_DEVICES);
	assert_int_equal(json_array_size(json_object_get(j, "pools")), GPUD_STATS_MAX_POOLS);
	assert_int_equal(json_array_size(json_object_get(j, "caches")), GPUD_STATS_MAX_CACHES);
	json_decref(j);
}

static void test_escaping(void **state)
{
	static struct gpud_stats_snapshot s;
	json_t *j, *p;
	size_t len = 0;
	const char *got;

	(void)state;
	fill(&s, 1, 4, 1);
	strcpy(s.pools[0].name, "a\"b\\c\nd\te\x01" "f");
	strcpy(s.pools[1].name, "gr\xc3\xbc\xc3\x9f \xe6\x97\xa5 \xf0\x9f\x98\x80"); /* grüß 日 😀 */
	strcpy(s.pools[2].name, "bad\xff\xc3(\xed\xa0\x80!"); /* invalid, truncated, surrogate */
	memset(s.pools[3].name, 'x', sizeof(s.pools[3].name)); /* no NUL at all */
	strcpy(s.pools[1].warning, "trough \"rose\"\r\n by 3\x1f");
	strcpy(s.caches[0].name, "\x7f\\");
	assert_int_equal(gpud_stats_json(&s, true, big, BIG, &len), 0);
	j = parse(big, len);
	p = json_object_get(j, "pools");
	assert_string_equal(json_string_value(json_object_get(json_array_get(p, 0), "name")),
			    s.pools[0].name);
	assert_string_equal(json_string_value(json_object_get(json_array_get(p, 1), "name")),
			    s.pools[1].name);
	got = json_string_value(json_object_get(json_array_get(p, 2), "name"));
	assert_string_equal(got, "bad\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!");
	got = json_string_value(json_object_get(json_array_get(p, 3), "name"));
	assert_int_equal(strlen(got), sizeof(s.pools[3].name));
	assert_string_equal(json_string_value(json_object_get(json_array_get(p, 1), "warning")),
			    s.pools[1].warning);
	assert_string_equal(json_string_value(json_array_get(
				    json_object_get(json_object_get(j, "watchdog"), "warnings"), 0)),
			    s.pools[1].warning);
	assert_string_equal(json_string_value(json_object_get(
				    json_array_get(json_object_get(j, "caches"), 0), "name")),
			    "\x7f\\");
	json_decref(j);
	/* the raw text: the short escapes and \u00XX for the rest */
	big[len] = 0;
	assert_non_null(strstr(big, "\"a\\\"b\\\\c\\nd\\te\\u0001f\""));
	assert_non_null(strstr(big, "\\r\\n by 3\\u001f\""));

	/* Prometheus label values */
	assert_int_equal(gpud_stats_prometheus(&s, big, BIG, &len), 0);
	big[len] = 0;
	assert_non_null(strstr(big, "\ngpud_pool_used{pool=\"a\\\"b\\\\c\\nd\xef\xbf\xbd"
				    "e\xef\xbf\xbd" "f\"} 2\n"));
	assert_non_null(strstr(big, "\ngpud_pool_used{pool=\"gr\xc3\xbc\xc3\x9f \xe6\x97\xa5 "
				    "\xf0\x9f\x98\x80\"} 102\n"));
	assert_non_null(strstr(big, "\ngpud_pool_used{pool=\"bad\xef\xbf\xbd\xef\xbf\xbd("
				    "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!\"} 202\n"));
	assert_non_null(strstr(big, "\ngpud_pool_used{pool=\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"} 302\n"));
	assert_non_null(strstr(big, "\ngpud_cache_hits_total{cache=\"\xef\xbf\xbd\\\\\"} 1\n"));
}

/* Every line is a HELP, a TYPE or a sample (Prometheus text 0.0.4), each
 * sample follows its family's HELP and TYPE, no family appears twice. */
static void check_prometheus(const char *text, size_t len, int *n_samples)
{
	const char *name = "[a-zA-Z_:][a-zA-Z0-9_:]*";
	const char *lab = "[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\\n]|\\\\[\\\\\"n])*\"";
	const char *num = "(-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?|NaN|[-+]Inf)";
	char help_re[128], type_re[128], sample_re[512];
	regex_t help, type, sample;
	char family[128] = "";
	char seen[8192] = " ";
	const char *line = text, *end = text + len;
	int samples = 0;

	snprintf(help_re, sizeof(help_re), "^# HELP (%s) [^\n]*$", name);
	snprintf(type_re, sizeof(type_re), "^# TYPE (%s) (counter|gauge)$", name);
	snprintf(sample_re, sizeof(sample_re), "^(%s)(\\{%s(,%s)*\\})? %s$", name, lab, lab, num);
	assert_int_equal(regcomp(&help, help_re, REG_EXTENDED), 0);
	assert_int_equal(regcomp(&type, type_re, REG_EXTENDED), 0);
	assert_int_equal(regcomp(&sample, sample_re, REG_EXTENDED), 0);
	assert_true(len > 0 && text[len - 1] == '\n');
	while (line < end) {
		const char *nl = memchr(line, '\n', (size_t)(end - line));
		char l[1024];
		regmatch_t m[2];
		size_t n;

		assert_non_null(nl);
		n = (size_t)(nl - line);
		assert_true(n < sizeof(l));
		memcpy(l, line, n);
		l[n] = 0;
		if (regexec(&help, l, 2, m, 0) == 0) {
			char key[140];

			snprintf(family, sizeof(family), "%.*s", (int)(m[1].rm_eo - m[1].rm_so),
				 l + m[1].rm_so);
			snprintf(key, sizeof(key), " %s ", family);
			if (strstr(seen, key))
				fail_msg("family %s twice", family);
			assert_true(strlen(seen) + strlen(key) < sizeof(seen));
			strcat(seen, key + 1);
		} else if (regexec(&type, l, 2, m, 0) == 0) {
			size_t fl = strlen(family);

			assert_int_equal((size_t)(m[1].rm_eo - m[1].rm_so), fl);
			assert_memory_equal(l + m[1].rm_so, family, fl);
			if (strstr(l, " counter") && (fl < 6 || strcmp(family + fl - 6, "_total")))
				fail_msg("counter %s does not end in _total", family);
		} else if (regexec(&sample, l, 2, m, 0) == 0) {
			assert_int_equal((size_t)(m[1].rm_eo - m[1].rm_so), strlen(family));
			assert_memory_equal(l + m[1].rm_so, family, strlen(family));
			samples++;
		} else {
			fail_msg("bad line: %s", l);
		}
		line = nl + 1;
	}
	regfree(&help);
	regfree(&type);
	regfree(&sample);
	*n_samples = samples;
}

static void test_prometheus(void **state)
{
	static struct gpud_stats_snapshot s;
	size_t len = 0;
	int n = 0;

	(void)state;
	fill(&s, 2, 3, 2);
	strcpy(s.pools[2].name, "q\"\\\n");
	s.tokens.generated = UINT64_MAX; /* all 20 digits */
	/* 16 one-sample families, 6 request outcomes, 3 token kinds, 3 alloc
	 * families of 5 (4 host roles, device), 2 device states, 17 per
	 * device, 12 per pool, 9 per cache */
	s.n_left_out = 1;
	assert_int_equal(gpud_stats_prometheus(&s, big, BIG, &len), 0);
	check_prometheus(big, len, &n);
	assert_int_equal(n, 16 + 6 + 3 + 3 * 5 + 2 + 17 * 2 + 12 * 3 + 9 * 2);
	big[len] = 0;
	/* of fill()'s two devices the second has failed: one serves */
	assert_non_null(strstr(big, "\ngpud_devices{state=\"serving\"} 1\n"));
	assert_non_null(strstr(big, "\ngpud_devices{state=\"left_out\"} 1\n"));
	assert_non_null(strstr(big, "# HELP gpud_requests_total "));
	assert_non_null(strstr(big, "\n# TYPE gpud_requests_total counter\n"));
	assert_non_null(strstr(big, "\n# TYPE gpud_alloc_since_warmup gauge\n"));
	assert_non_null(strstr(big, "\n# TYPE gpud_alloc_total counter\n"));
	assert_non_null(strstr(big, "\n# TYPE gpud_alloc_bytes_total counter\n"));
	assert_non_null(strstr(big, "\n# TYPE gpud_pool_used gauge\n"));
	assert_non_null(strstr(big, "\n# TYPE gpud_cache_hits_total counter\n"));
	assert_non_null(strstr(big, "\ngpud_requests_total{status=\"completed\"} 102\n"));
	assert_non_null(strstr(big, "\ngpud_requests_in_flight 107\n"));
	assert_non_null(strstr(big, "\ngpud_tokens_total{kind=\"generated\"} 18446744073709551615\n"));
	assert_non_null(strstr(big, "\ngpud_tokens_per_second 1234.25\n"));
	assert_non_null(strstr(big, "\ngpud_uptime_seconds 12.5\n"));
	assert_non_null(strstr(big, "\ngpud_info{version=\"0.4.0\"} 1\n"));
	assert_non_null(strstr(big, "\ngpud_draining 1\n"));
	assert_non_null(strstr(big,
			       "\ngpud_alloc_since_warmup{kind=\"host\",role=\"device\"} 13\n"));
	assert_non_null(strstr(big,
			       "\ngpud_alloc_since_warmup{kind=\"host\",role=\"foreign\"} 10\n"));
	assert_non_null(strstr(big, "\ngpud_alloc_since_warmup{kind=\"device\"} 0\n"));
	assert_non_null(strstr(big, "\ngpud_alloc_total{kind=\"host\",role=\"loop\"} 1002\n"));
	assert_non_null(strstr(big, "\ngpud_alloc_bytes_total{kind=\"device\"} 5000\n"));
	assert_non_null(strstr(big, "\ngpud_device_steps_total{device=\"cpu1\"} 13\n"));
	assert_non_null(strstr(big, "\ngpud_device_placed_prefix_total{device=\"cpu1\"} 17\n"));
	assert_non_null(strstr(big, "\ngpud_device_placed_load_total{device=\"cpu1\"} 18\n"));
	assert_non_null(strstr(big, "\ngpud_device_alloc_device_total{device=\"cpu1\"} 114\n"));
	assert_non_null(strstr(big, "\ngpud_device_prefix_hit_tokens_total{device=\"cpu1\"} 110\n"));
	assert_non_null(strstr(big, "\ngpud_device_chunk_hits_total{device=\"cpu1\"} 111\n"));
	assert_non_null(strstr(big, "\ngpud_device_rows_argmax_total{device=\"cpu1\"} 115\n"));
	assert_non_null(strstr(big, "\ngpud_device_rows_drawn_total{device=\"cpu1\"} 116\n"));
	assert_non_null(strstr(big, "\ngpud_device_rows_host_total{device=\"cpu1\"} 117\n"));
	assert_non_null(strstr(big, "\ngpud_device_chunk_misses_total{device=\"cpu1\"} 112\n"));
	assert_non_null(strstr(big,
			       "\ngpud_device_chunk_hit_tokens_total{device=\"cpu1\"} 113\n"));
	assert_non_null(strstr(big, "\ngpud_pool_unit_bytes{pool=\"cpu0.kv\",unit=\"blocks\"} 4096\n"));
	assert_non_null(strstr(big, "\ngpud_pool_used{pool=\"cpu0.kv\"} 2\n"));
	assert_non_null(strstr(big, "\ngpud_pool_capacity{pool=\"cpu1.kv\"} 101\n"));
	assert_non_null(strstr(big, "\ngpud_pool_high{pool=\"q\\\"\\\\\\n\"} 204\n"));
	assert_non_null(strstr(big, "\ngpud_pool_trough{pool=\"cpu1.kv\"} 106\n"));
	assert_non_null(strstr(big, "\ngpud_pool_rising{pool=\"cpu1.kv\"} 1\n"));
	assert_non_null(strstr(big, "\ngpud_cache_hits_total{cache=\"cache1\"} 1001\n"));
	assert_non_null(strstr(big, "\ngpud_cache_hit_tokens_total{cache=\"cache0\"} 9\n"));
	assert_non_null(strstr(big, "\ngpud_watchdog_rising 1\n"));
	assert_non_null(strstr(big, "\ngpud_watchdog_window_ms 60000\n"));
	assert_non_null(strstr(big, "\ngpud_watchdog_k 10\n"));
	assert_non_null(strstr(big, "\ngpud_pool_live{pool=\"cpu1.kv\"} 101\n"));
	assert_non_null(strstr(big, "\ngpud_pool_cached{pool=\"cpu1.kv\"} 1\n"));
	assert_non_null(strstr(big, "\ngpud_pool_cache_bound{pool=\"cpu1.kv\"} 50\n"));
	assert_non_null(strstr(big, "\ngpud_pool_cache_bound{pool=\"cpu0.kv\"} 0\n"));
}

/* At every cap below the full size: SW_ETOOLONG, never a write past cap
 * (the buffer is exactly cap bytes on the heap: ASan and valgrind see an
 * overflow). At the full size: the same bytes as with a big buffer. */
static void every_cap(int (*render)(const struct gpud_stats_snapshot *, int, char *, size_t,
				    size_t *),
		      const struct gpud_stats_snapshot *s, int mode)
{
	size_t full = 0, len;

	assert_int_equal(render(s, mode, big, BIG, &full), 0);
	assert_true(full > 100);
	for (size_t cap = 0; cap <= full; cap++) {
		char *b = malloc(cap ? cap : 1);

		assert_non_null(b);
		len = 12345;
		if (cap < full) {
			assert_int_equal(render(s, mode, b, cap, &len), SW_ETOOLONG);
			assert_int_equal(len, 0);
		} else {
			assert_int_equal(render(s, mode, b, cap, &len), 0);
			assert_int_equal(len, full);
			assert_memory_equal(b, big, full);
		}
		free(b);
	}
}

static int r_json(const struct gpud_stats_snapshot *s, int mem, char *b, size_t cap, size_t *len)
{
	return gpud_stats_json(s, mem, b, cap, len);
}

static int r_prom(const struct gpud_stats_snapshot *s, int mode, char *b, size_t cap,
		  size_t *len)
{
	return gpud_stats_prometheus(s, b, cap, len);
}

static void test_too_small(void **state)
{
	static struct gpud_stats_snapshot s;
	size_t len;

	(void)state;
	fill(&s, 1, 2, 1);
	strcpy(s.pools[0].name, "esc\"\x01\xff");
	s.dump_path = "/tmp/d";
	every_cap(r_json, &s, 0);
	every_cap(r_json, &s, 1);
	every_cap(r_prom, &s, 0);

	/* NULL arguments */
	assert_int_equal(gpud_stats_json(NULL, false, big, BIG, &len), -EINVAL);
	assert_int_equal(gpud_stats_json(&s, false, NULL, 10, &len), -EINVAL);
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, NULL), -EINVAL);
	assert_int_equal(gpud_stats_json(&s, false, NULL, 0, &len), SW_ETOOLONG);
	assert_int_equal(gpud_stats_prometheus(NULL, big, BIG, &len), -EINVAL);
	assert_int_equal(gpud_stats_prometheus(&s, NULL, 10, &len), -EINVAL);
	assert_int_equal(gpud_stats_prometheus(&s, big, BIG, NULL), -EINVAL);
}

/* The largest output any snapshot can give (every array full, names and
 * warnings all six-byte escapes): what a reply or endpoint buffer needs. */
static void test_worst_case_size(void **state)
{
	static struct gpud_stats_snapshot s;
	size_t json = 0, mem = 0, prom = 0;
	json_t *j;

	(void)state;
	fill(&s, GPUD_STATS_MAX_DEVICES, GPUD_STATS_MAX_POOLS, GPUD_STATS_MAX_CACHES);
	for (int i = 0; i < GPUD_STATS_MAX_DEVICES; i++)
		memset(s.devices[i].name, 1, sizeof(s.devices[i].name));
	for (int i = 0; i < GPUD_STATS_MAX_POOLS; i++) {
		memset(s.pools[i].name, 1, sizeof(s.pools[i].name));
		memset(s.pools[i].cache, 1, sizeof(s.pools[i].cache));
		memset(s.pools[i].warning, 2, sizeof(s.pools[i].warning) - 1);
		s.pools[i].warning[sizeof(s.pools[i].warning) - 1] = 0;
		s.pools[i].rising = true;
	}
	for (int i = 0; i < GPUD_STATS_MAX_CACHES; i++)
		memset(s.caches[i].name, 1, sizeof(s.caches[i].name));
	s.uptime_s = -1.23456789e-300;
	assert_int_equal(gpud_stats_json(&s, false, big, BIG, &json), 0);
	j = parse(big, json);
	json_decref(j);
	assert_int_equal(gpud_stats_json(&s, true, big, BIG, &mem), 0);
	assert_int_equal(gpud_stats_prometheus(&s, big, BIG, &prom), 0);
	print_message("worst case: STATS %zu bytes, MEM %zu bytes, Prometheus %zu bytes\n", json,
		      mem, prom);
	assert_true(json < 256 * 1024);
	assert_true(prom < 256 * 1024);
}

static void test_no_allocation(void **state)
{
	static struct gpud_stats_snapshot s;
	struct gpud_alloc_counts a, b;
	size_t len;

	(void)state;
	if (!gpud_alloc_hooked())
		skip(); /* valgrind replaces the wrappers: nothing to count with */
	fill(&s, 4, 8, 4);
	s.uptime_s = 3.14159e-7;
	s.tokens.per_s = 1e300;
	gpud_alloc_counts(&a);
	for (int i = 0; i < 10; i++) {
		assert_int_equal(gpud_stats_json(&s, false, big, BIG, &len), 0);
		assert_int_equal(gpud_stats_json(&s, true, big, BIG, &len), 0);
		assert_int_equal(gpud_stats_prometheus(&s, big, BIG, &len), 0);
		assert_int_equal(gpud_stats_json(&s, false, big, 100, &len), SW_ETOOLONG);
	}
	gpud_alloc_counts(&b);
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++)
		assert_int_equal(b.host_allocs[r] - a.host_allocs[r], 0);
}

static void test_fill_alloc(void **state)
{
	static struct gpud_stats_snapshot s;
	struct gpud_alloc_counts c;

	(void)state;
	memset(&s, 0xff, sizeof(s));
	gpud_alloc_device_note(0, 321);
	gpud_stats_fill_alloc(&s);
	assert_int_equal(s.alloc_counted, gpud_alloc_hooked());
	assert_int_equal(s.alloc_warm, gpud_alloc_warm());
	gpud_alloc_counts(&c);
	assert_true(s.alloc_total.device_allocs >= 1);
	assert_int_equal(s.alloc_total.device_allocs, c.device_allocs);
	assert_int_equal(s.alloc_total.device_bytes, c.device_bytes);
	if (!gpud_alloc_warm())
		assert_int_equal(s.alloc_since_warmup.device_allocs, 0);
	if (gpud_alloc_hooked()) /* the process has allocated by now (setup's buffer) */
		assert_true(s.alloc_total.host_allocs[GPUD_ALLOC_OTHER] > 0);
}

static void test_jsonw_misuse(void **state)
{
	struct gpud_jsonw w;
	char buf[256];
	size_t len;

	(void)state;
	gpud_jsonw_init(&w, buf, sizeof(buf));
	gpud_jsonw_obj_end(&w); /* close without open */
	assert_int_equal(gpud_jsonw_finish(&w, &len), -EINVAL);

	gpud_jsonw_init(&w, buf, sizeof(buf));
	gpud_jsonw_arr_begin(&w, NULL); /* left open */
	assert_int_equal(gpud_jsonw_finish(&w, &len), -EINVAL);

	gpud_jsonw_init(&w, buf, sizeof(buf));
	for (int i = 0; i < GPUD_JSONW_DEPTH + 2; i++)
		gpud_jsonw_arr_begin(&w, NULL);
	for (int i = 0; i < GPUD_JSONW_DEPTH + 2; i++)
		gpud_jsonw_arr_end(&w);
	assert_int_equal(gpud_jsonw_finish(&w, &len), -EINVAL);

	/* a nested array of mixed values parses */
	gpud_jsonw_init(&w, buf, sizeof(buf));
	gpud_jsonw_arr_begin(&w, NULL);
	gpud_jsonw_u64(&w, NULL, 0);
	gpud_jsonw_bool(&w, NULL, false);
	gpud_jsonw_null(&w, NULL);
	gpud_jsonw_str(&w, NULL, NULL);
	gpud_jsonw_strn(&w, NULL, "a\0b", 3);
	gpud_jsonw_f64(&w, NULL, -0.5);
	gpud_jsonw_obj_begin(&w, NULL);
	gpud_jsonw_arr_begin(&w, "k");
	gpud_jsonw_arr_end(&w);
	gpud_jsonw_obj_end(&w);
	gpud_jsonw_arr_end(&w);
	assert_int_equal(gpud_jsonw_finish(&w, &len), 0);
	assert_int_equal(len, strlen("[0,false,null,null,\"a\\u0000b\",-0.5,{\"k\":[]}]"));
	assert_memory_equal(buf, "[0,false,null,null,\"a\\u0000b\",-0.5,{\"k\":[]}]", len);
}

static int setup(void **state)
{
	(void)state;
	big = malloc(BIG);
	return big ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	free(big);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stats_json),
		cmocka_unit_test(test_mem_json),
		cmocka_unit_test(test_not_counted_and_odd_numbers),
		cmocka_unit_test(test_escaping),
		cmocka_unit_test(test_prometheus),
		cmocka_unit_test(test_too_small),
		cmocka_unit_test(test_worst_case_size),
		cmocka_unit_test(test_no_allocation),
		cmocka_unit_test(test_fill_alloc),
		cmocka_unit_test(test_jsonw_misuse),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
