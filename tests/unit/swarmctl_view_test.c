/* swarmctl_view_test.c - what status and top make of gpud's STATS JSON
 * (gpud/stats.h schema): per-device memory in bytes from pools of mixed
 * units, the pool, cache and warning lines, the queue line, agentd's
 * supervisor status file; and input missing fields or of the wrong
 * type. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "swarmctl/view.h"

static const char stats_json[] =
	"{\"version\": \"0.4.0\", \"uptime_s\": 12.5, \"draining\": false,"
	" \"requests\": {\"admitted\": 10, \"completed\": 9, \"errors\": 1, \"cancelled\": 0,"
	"   \"busy\": 0, \"refused\": 0, \"in_flight\": 2},"
	" \"tokens\": {\"prompt\": 100, \"cached_prompt\": 20, \"generated\": 50, \"per_s\": 237.5},"
	" \"alloc\": {\"counted\": true, \"warm\": true,"
	"   \"since_warmup\": {\"host\": 0, \"device\": 0}, \"total\": {\"host\": 9}},"
	" \"devices\": [{\"name\": \"cpu0\", \"queue\": 1, \"placed_prefix\": 7,"
	"   \"placed_load\": 5, \"prefix_hits\": 3, \"chunk_hits\": 2, \"chunk_hit_tokens\": 512,"
	"   \"alloc\": {\"device\": 0}},"
	"  {\"name\": \"cuda:1\", \"alloc\": {\"device\": 3}}],"
	" \"pools\": ["
	"  {\"name\": \"cpu0.kv\", \"unit\": \"blocks\", \"unit_bytes\": 32768, \"capacity\": 100,"
	"   \"used\": 10, \"free\": 90, \"high\": 12, \"live\": 4, \"cached\": 6,"
	"   \"cache\": \"cpu0.prefix\", \"cache_bound\": 64, \"trough\": 4, \"rising\": false},"
	"  {\"name\": \"cpu0.scratch\", \"unit\": \"bytes\", \"unit_bytes\": 1, \"capacity\": 4096,"
	"   \"used\": 1024, \"high\": 2048, \"trough\": 1024, \"rising\": false},"
	"  {\"name\": \"cuda:1.kv\", \"unit\": \"blocks\", \"unit_bytes\": 1048576, \"capacity\": 8,"
	"   \"used\": 3, \"high\": 5, \"trough\": 2, \"rising\": true},"
	"  {\"name\": \"mask\", \"unit\": \"slots\", \"unit_bytes\": 100, \"capacity\": 10,"
	"   \"used\": 1, \"high\": 1, \"trough\": 0},"
	"  {\"name\": \"server.requests\", \"unit\": \"slots\", \"unit_bytes\": 1000,"
	"   \"capacity\": 4, \"used\": 2, \"high\": 3, \"trough\": 1}"
	" ],"
	" \"caches\": [{\"name\": \"cpu0.prefix\", \"hits\": 3, \"misses\": 1, \"entries\": 4,"
	"   \"max_entries\": 100, \"bytes\": 1048576, \"max_bytes\": 2097152,"
	"   \"hit_tokens\": 48}],"
	" \"watchdog\": {\"rising\": true, \"warnings\": [\"cuda:1.kv trough rising\"]}}";

static json_t *find_dev(json_t *arr, const char *name)
{
	size_t i;
	json_t *v;

	json_array_foreach(arr, i, v)
		if (!strcmp(json_string_value(json_object_get(v, "device")), name))
			return v;
	return NULL;
}

static long long field(json_t *o, const char *k)
{
	return (long long)json_integer_value(json_object_get(o, k));
}

static void test_device_memory(void **state)
{
	json_error_t je;
	json_t *stats = json_loads(stats_json, 0, &je), *mem, *d;

	(void)state;
	assert_non_null(stats);
	mem = ctl_device_memory(stats);
	assert_int_equal(json_array_size(mem), 3);
	d = find_dev(mem, "cpu0");
	assert_non_null(d);
	assert_int_equal(field(d, "used_bytes"), 10 * 32768 + 1024);
	assert_int_equal(field(d, "high_bytes"), 12 * 32768 + 2048);
	assert_int_equal(field(d, "trough_bytes"), 4 * 32768 + 1024);
	assert_int_equal(field(d, "capacity_bytes"), 100 * 32768 + 4096);
	/* live and cached parts; a pool without "live" (scratch here, any
	 * pool of an older gpud) is live as a whole */
	assert_int_equal(field(d, "live_bytes"), 4 * 32768 + 1024);
	assert_int_equal(field(d, "cached_bytes"), 6 * 32768);
	d = find_dev(mem, "cuda:1");
	assert_non_null(d);
	assert_int_equal(field(d, "used_bytes"), 3 * 1048576);
	assert_int_equal(field(d, "capacity_bytes"), 8 * 1048576);
	/* "mask" and "server.requests" belong to no device */
	d = find_dev(mem, "host");
	assert_non_null(d);
	assert_int_equal(field(d, "used_bytes"), 100 + 2000);
	assert_int_equal(field(d, "capacity_bytes"), 1000 + 4000);
	assert_null(find_dev(mem, "server"));
	json_decref(mem);
	json_decref(stats);
}

static void test_device_memory_odd_input(void **state)
{
	json_t *mem, *stats;

	(void)state;
	/* no pools, pools not an array, pools without names or numbers */
	stats = json_object();
	mem = ctl_device_memory(stats);
	assert_int_equal(json_array_size(mem), 0);
	json_decref(mem);
	json_object_set_new(stats, "pools", json_string("nope"));
	mem = ctl_device_memory(stats);
	assert_int_equal(json_array_size(mem), 0);
	json_decref(mem);
	json_object_set_new(stats, "pools", json_pack("[{s:i}, {s:s, s:s, s:i}]", "used", 5,
						      "name", "cpu0.kv", "used", "many",
						      "capacity", -3));
	mem = ctl_device_memory(stats);
	assert_int_equal(json_array_size(mem), 1);
	assert_int_equal(field(json_array_get(mem, 0), "used_bytes"), 0);
	assert_int_equal(field(json_array_get(mem, 0), "capacity_bytes"), 0);
	json_decref(mem);
	json_decref(stats);
}

static char *render(const json_t *stats, const struct ctl_queue_stats *q)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	if (stats)
		ctl_print_gpud(f, stats);
	if (q)
		ctl_print_queue(f, q);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void test_print_gpud(void **state)
{
	json_error_t je;
	json_t *stats = json_loads(stats_json, 0, &je);
	char *out;

	(void)state;
	out = render(stats, NULL);
	assert_non_null(strstr(out, "2 requests in flight, 9 completed, 1 errors; 237.5 tokens/s"));
	assert_non_null(strstr(out, "allocations since warm-up: 0 host, 0 device"));
	assert_non_null(strstr(out, "cuda:1"));
	assert_non_null(strstr(out, "RISING"));
	assert_non_null(strstr(out, "75.0%")); /* 3 hits, 1 miss */
	/* pool: used 10 = live 4 + cached 6 of the cache's 64; cache: 4 of
	 * 100 entries, 1 of 2 MiB */
	assert_non_null(strstr(out, "LIVE"));
	assert_non_null(strstr(out, "cpu0.kv                      10          4          6         64"));
	assert_non_null(strstr(out, "server.requests               2          2          0          -"));
	assert_non_null(strstr(out, "         4        100        1.0        2.0\n"));
	assert_non_null(strstr(out, "WARNING: cuda:1.kv trough rising"));
	/* placements per device, the hits and tokens of its prefix and chunk
	 * caches */
	assert_non_null(strstr(out, "PLACED PREFIX"));
	assert_non_null(strstr(out, "CHUNK HITS  CHUNK TOKENS DEV ALLOCS\n"));
	assert_non_null(strstr(out, "cpu0              1        0              7              5"
				    "            3             48           2           512"
				    "          0\n"));
	assert_non_null(strstr(out, "cuda:1            0        0              0              0"
				    "            0              0           0             0"
				    "          3\n"));
	/* no device left out: no line; one left out (gpud.min_devices): its line */
	assert_null(strstr(out, "LEFT OUT"));
	free(out);
	json_object_set_new(stats, "left_out",
			    json_pack("[{s:s, s:s, s:s}]", "name", "cuda3", "device", "cuda:3",
				      "error", "gpud.devices[3]: cuda:3: no CUDA device"));
	out = render(stats, NULL);
	assert_non_null(strstr(out, "\nLEFT OUT: cuda3 (cuda:3) did not start: gpud.devices[3]: "
				    "cuda:3: no CUDA device\n"));
	free(out);
	json_object_del(stats, "left_out");

	/* allocations not counted: null is not zero */
	json_object_set_new(json_object_get(stats, "alloc"), "since_warmup", json_null());
	out = render(stats, NULL);
	assert_non_null(strstr(out, "allocations since warm-up: not counted"));
	free(out);
	json_decref(stats);

	/* an empty object prints zeros, not garbage */
	stats = json_object();
	out = render(stats, NULL);
	assert_non_null(strstr(out, "0 requests in flight"));
	free(out);
	json_decref(stats);
}

static void test_print_queue(void **state)
{
	struct ctl_queue_stats q = { .length = 12, .undelivered = 3, .pending = 2, .dead = 1500,
				     .dead_kept = 1003 };
	char *out;

	(void)state;
	/* the count is PostgreSQL's; the capped stream keeps fewer */
	out = render(NULL, &q);
	assert_string_equal(out, "queue: 3 waiting, 2 pending (claimed, not acknowledged), "
			    "12 entries in swarm:tasks, 1500 dead-lettered (1003 kept in "
			    "swarm:dead)\n");
	free(out);
	q.dead = -1; /* PostgreSQL unreachable: no count passed off as the total */
	out = render(NULL, &q);
	assert_string_equal(out, "queue: 3 waiting, 2 pending (claimed, not acknowledged), "
			    "12 entries in swarm:tasks, 1003 kept in swarm:dead (dead-lettered in "
			    "all: PostgreSQL unreachable)\n");
	free(out);
	q.dead = 1500;
	q.undelivered = -1; /* Redis without lag */
	out = render(NULL, &q);
	assert_null(strstr(out, "waiting"));
	free(out);
}

static void test_agentd_status(void **state)
{
	struct ctl_env e;
	char p[PATH_MAX + 32], *out = NULL;
	size_t len = 0;
	json_t *st;
	FILE *f;

	(void)state;
	memset(&e, 0, sizeof(e));
	snprintf(e.state_dir, sizeof(e.state_dir), "/tmp/swarmctl_view_test.XXXXXX");
	assert_non_null(mkdtemp(e.state_dir));
	assert_null(ctl_agentd_status(&e)); /* no file */

	snprintf(p, sizeof(p), "%s/agentd.status.json", e.state_dir);
	f = fopen(p, "w");
	assert_non_null(f);
	fputs("{\"pid\": 7, \"state\": \"running\", \"workers\": ["
	      "{\"slot\": 0, \"pid\": 8, \"state\": \"running\", \"done\": 10, \"crashes\": 0,"
	      " \"hangs\": 0, \"last_exit\": \"\"},"
	      "{\"slot\": 1, \"pid\": 0, \"state\": \"backoff\", \"done\": 4, \"crashes\": 2,"
	      " \"hangs\": 1, \"last_exit\": \"signal 9\"},"
	      "{\"slot\": 2, \"pid\": 9, \"state\": \"running\", \"done\": 0}]}", f);
	assert_int_equal(fclose(f), 0);
	st = ctl_agentd_status(&e);
	assert_non_null(st);
	f = open_memstream(&out, &len);
	assert_non_null(f);
	ctl_print_agentd(f, st);
	assert_int_equal(fclose(f), 0);
	assert_string_equal(out, "agentd running: 3 workers (2 running, 1 backoff); 14 tasks "
			    "done, 2 crashes, 1 hangs; last exit: signal 9\n");
	free(out);
	json_decref(st);

	/* not an object, or not JSON: ignored */
	f = fopen(p, "w");
	assert_non_null(f);
	fputs("[1, 2]", f);
	assert_int_equal(fclose(f), 0);
	assert_null(ctl_agentd_status(&e));
	f = fopen(p, "w");
	assert_non_null(f);
	fputs("{\"pid\": ", f);
	assert_int_equal(fclose(f), 0);
	assert_null(ctl_agentd_status(&e));
	assert_int_equal(unlink(p), 0);
	assert_int_equal(rmdir(e.state_dir), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_device_memory),
		cmocka_unit_test(test_device_memory_odd_input),
		cmocka_unit_test(test_print_gpud),
		cmocka_unit_test(test_print_queue),
		cmocka_unit_test(test_agentd_status),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
