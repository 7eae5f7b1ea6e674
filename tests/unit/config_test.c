/* config_test.c - defaults, file and string loading, every kind of
 * validation error with its exact message, unknown keys, bad JSON, env
 * overrides, round trip through sw_config_to_json, URL redaction. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"

static char err[SW_ERR_MAX];

/* Loads json, expects failure with code and exactly msg, and checks that
 * the config passed in was not touched. */
static void expect_error(const char *json, int code, const char *msg)
{
	struct sw_config cfg, before;
	memset(&cfg, 0xA5, sizeof(cfg));
	before = cfg;
	err[0] = '\0';
	int rc = sw_config_load_string(json, &cfg, err, sizeof(err));
	if (rc != code || strcmp(err, msg) != 0)
		fail_msg("json %s\n  got  %d \"%s\"\n  want %d \"%s\"", json, rc, err, code, msg);
	assert_memory_equal(&cfg, &before, sizeof(cfg));
}

static void load_ok(const char *json, struct sw_config *cfg)
{
	err[0] = '\0';
	int rc = sw_config_load_string(json, cfg, err, sizeof(err));
	if (rc)
		fail_msg("json %s: %d %s", json, rc, err);
}

static void test_defaults(void **state)
{
	(void)state;
	struct sw_config c;
	sw_config_defaults(&c);
	assert_string_equal(c.state_dir, "/var/lib/swarm");
	assert_int_equal(c.log.level, SW_LOG_INFO);
	assert_string_equal(c.log.file, "");
	assert_string_equal(c.redis.url, "redis://127.0.0.1:6379/0");
	assert_string_equal(c.postgres.url, "postgresql://swarm@127.0.0.1:5432/swarm");
	assert_string_equal(c.gpud.socket, "/run/swarm/gpud.sock");
	assert_string_equal(c.gpud.model, "");
	assert_string_equal(c.gpud.chat_format, "auto");
	assert_int_equal(c.gpud.n_devices, 1);
	assert_int_equal(c.gpud.devices[0].kind, SW_DEVICE_CPU);
	assert_true(c.gpud.memory_fraction == 0.9);
	assert_int_equal(c.gpud.kv_block_tokens, 16);
	assert_int_equal(c.gpud.kv_blocks, 0);
	assert_int_equal(c.gpud.max_segments, 64);
	assert_int_equal(c.gpud.mask_cache_bytes, 64u << 20);
	assert_int_equal(c.gpud.queue.per_connection, 64);
	assert_int_equal(c.gpud.queue.global, 1024);
	assert_int_equal(c.agentd.workers, 4);
	assert_true(c.agentd.heartbeat_ms < c.agentd.lease_ms);
	assert_int_equal(c.agentd.results_maxlen, 100000);
	assert_int_equal(c.agentd.dead_maxlen, 1000);
	assert_string_equal(c.agentd.answer_chunk_mask, "system");
	assert_int_equal(c.gpud.chunk_cache_bytes, 1u << 30);

	/* Defaults pass every check except the one thing without a default. */
	assert_int_equal(sw_config_validate(&c, 0, err, sizeof(err)), 0);
	assert_int_equal(sw_config_validate(&c, SW_CONFIG_NEED_MODEL, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "gpud.model: required (set it in the config file or SWARM_MODEL)");

	/* An empty object is exactly the defaults. */
	struct sw_config l;
	memset(&l, 0x5A, sizeof(l));
	load_ok("{}", &l);
	assert_memory_equal(&l, &c, sizeof(c));
}

static void test_overrides(void **state)
{
	(void)state;
	struct sw_config c;
	load_ok("{\"state_dir\": \"/srv/swarm\","
		" \"log\": {\"level\": \"debug\", \"file\": \"/var/log/swarm.log\"},"
		" \"redis\": {\"url\": \"rediss://r:6380/2\"},"
		" \"postgres\": {\"url\": \"host=db dbname=swarm\"},"
		" \"gpud\": {\"socket\": \"/tmp/g.sock\", \"model\": \"/m.gguf\","
		"   \"devices\": [\"cuda:0\", \"cuda:1\", \"cpu\", \"cpu\"], \"threads\": 8,"
		"   \"memory_fraction\": 1, \"kv_block_tokens\": 32, \"kv_blocks\": 5000,"
		"   \"max_batch_tokens\": 4096, \"max_seqs\": 128, \"max_segments\": 127,"
		"   \"context\": 8192, \"mask_cache_bytes\": \"16MiB\","
		"   \"prefix_cache_bytes\": 0, \"queue\": {\"per_connection\": 8, \"global\": 8},"
		"   \"shutdown_deadline_ms\": 0},"
		" \"agentd\": {\"workers\": 32, \"max_attempts\": 3, \"lease_ms\": 1000,"
		"   \"max_tasks_per_worker\": 0, \"heartbeat_ms\": 999,"
		"   \"restart_backoff_min_ms\": 50, \"restart_backoff_max_ms\": 50,"
		"   \"crash_window_ms\": 5000, \"crash_limit\": 2, \"results_maxlen\": 1,"
		"   \"dead_maxlen\": 1073741824}}",
		&c);
	assert_string_equal(c.state_dir, "/srv/swarm");
	assert_int_equal(c.log.level, SW_LOG_DEBUG);
	assert_string_equal(c.log.file, "/var/log/swarm.log");
	assert_string_equal(c.redis.url, "rediss://r:6380/2");
	assert_string_equal(c.postgres.url, "host=db dbname=swarm");
	assert_string_equal(c.gpud.socket, "/tmp/g.sock");
	assert_string_equal(c.gpud.model, "/m.gguf");
	assert_int_equal(c.gpud.n_devices, 4);
	assert_int_equal(c.gpud.devices[0].kind, SW_DEVICE_CUDA);
	assert_int_equal(c.gpud.devices[0].index, 0);
	assert_int_equal(c.gpud.devices[1].kind, SW_DEVICE_CUDA);
	assert_int_equal(c.gpud.devices[1].index, 1);
	assert_int_equal(c.gpud.devices[2].kind, SW_DEVICE_CPU);
	assert_int_equal(c.gpud.devices[3].kind, SW_DEVICE_CPU); /* several cpu: allowed */
	assert_int_equal(c.gpud.threads, 8);
	assert_true(c.gpud.memory_fraction == 1.0);
	assert_int_equal(c.gpud.kv_block_tokens, 32);
	assert_int_equal(c.gpud.kv_blocks, 5000);
	assert_int_equal(c.gpud.max_batch_tokens, 4096);
	assert_int_equal(c.gpud.max_seqs, 128);
	assert_int_equal(c.gpud.max_segments, 127);
	assert_int_equal(c.gpud.context, 8192);
	assert_int_equal(c.gpud.mask_cache_bytes, 16u << 20);
	assert_int_equal(c.gpud.prefix_cache_bytes, 0);
	assert_int_equal(c.gpud.queue.per_connection, 8);
	assert_int_equal(c.gpud.queue.global, 8);
	assert_int_equal(c.gpud.shutdown_deadline_ms, 0);
	assert_int_equal(c.agentd.workers, 32);
	assert_int_equal(c.agentd.max_attempts, 3);
	assert_int_equal(c.agentd.lease_ms, 1000);
	assert_int_equal(c.agentd.max_tasks_per_worker, 0);
	assert_int_equal(c.agentd.heartbeat_ms, 999);
	assert_int_equal(c.agentd.restart_backoff_min_ms, 50);
	assert_int_equal(c.agentd.restart_backoff_max_ms, 50);
	assert_int_equal(c.agentd.crash_window_ms, 5000);
	assert_int_equal(c.agentd.crash_limit, 2);
	assert_int_equal(c.agentd.results_maxlen, 1);
	assert_int_equal(c.agentd.dead_maxlen, 1u << 30);

	/* Keys not given keep their defaults; "//" keys are comments. */
	load_ok("{\"//\": \"hi\", \"gpud\": {\"// threads\": [1, 2], \"threads\": 3}}", &c);
	assert_int_equal(c.gpud.threads, 3);
	assert_int_equal(c.gpud.max_seqs, 64);
	assert_int_equal(c.agentd.workers, 4);
}

static void test_sizes(void **state)
{
	(void)state;
	struct sw_config c;
	load_ok("{\"gpud\": {\"mask_cache_bytes\": 4096, \"prefix_cache_bytes\": \"2 GiB\"}}", &c);
	assert_int_equal(c.gpud.mask_cache_bytes, 4096);
	assert_int_equal(c.gpud.prefix_cache_bytes, 2ull << 30);
	load_ok("{\"gpud\": {\"mask_cache_bytes\": \"512KiB\", \"prefix_cache_bytes\": \"16TiB\"}}", &c);
	assert_int_equal(c.gpud.mask_cache_bytes, 512u << 10);
	assert_true(c.gpud.prefix_cache_bytes == 16ull << 40);
	load_ok("{\"gpud\": {\"mask_cache_bytes\": \"8192B\", \"prefix_cache_bytes\": \"0\"}}", &c);
	assert_int_equal(c.gpud.mask_cache_bytes, 8192);
	assert_int_equal(c.gpud.prefix_cache_bytes, 0);

#define SIZE_MSG(got) "gpud.mask_cache_bytes: expected a byte size in [4096, 1099511627776]" \
	" (an integer or \"64MiB\"), got " got
	expect_error("{\"gpud\": {\"mask_cache_bytes\": \"12XB\"}}", -EINVAL, SIZE_MSG("\"12XB\""));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": \"MiB\"}}", -EINVAL, SIZE_MSG("\"MiB\""));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": \"64mib\"}}", -EINVAL, SIZE_MSG("\"64mib\""));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": -1}}", -EINVAL, SIZE_MSG("-1"));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": 100}}", -EINVAL, SIZE_MSG("100"));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": \"2TiB\"}}", -EINVAL, SIZE_MSG("\"2TiB\""));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": \"99999999999999999999KiB\"}}", -EINVAL,
		     SIZE_MSG("\"99999999999999999999KiB\""));
	expect_error("{\"gpud\": {\"mask_cache_bytes\": \"17179869184TiB\"}}", -EINVAL,
		     SIZE_MSG("\"17179869184TiB\"")); /* overflows u64 */
	expect_error("{\"gpud\": {\"mask_cache_bytes\": 1.5}}", SW_ETYPE, SIZE_MSG("1.5"));
#undef SIZE_MSG
}

static void test_device_errors(void **state)
{
	(void)state;
	struct sw_config c;
	expect_error("{\"gpud\": {\"devices\": [\"cpu\", \"cuda:1\", \"gpu0\"]}}", -EINVAL,
		     "gpud.devices[2]: expected \"cpu\" or \"cuda:N\", got \"gpu0\"");
	expect_error("{\"gpud\": {\"devices\": [1]}}", SW_ETYPE,
		     "gpud.devices[0]: expected \"cpu\" or \"cuda:N\", got 1");
	expect_error("{\"gpud\": {\"devices\": []}}", -EINVAL,
		     "gpud.devices: expected at least one device");
	expect_error("{\"gpud\": {\"devices\": \"cpu\"}}", SW_ETYPE,
		     "gpud.devices: expected an array of \"cpu\" or \"cuda:N\", got \"cpu\"");
	expect_error("{\"gpud\": {\"devices\": [\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\","
		     "\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\",\"cpu\","
		     "\"cpu\"]}}", -EINVAL, "gpud.devices: expected at most 16 devices");
	static const char *bad[] = { "cuda:", "cuda:01", "cuda:256", "cuda:-1", "cuda:1x",
				     "CPU", "cuda", "cuda:0 ", "" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char json[128], msg[128];
		snprintf(json, sizeof(json), "{\"gpud\": {\"devices\": [\"%s\"]}}", bad[i]);
		snprintf(msg, sizeof(msg), "gpud.devices[0]: expected \"cpu\" or \"cuda:N\", got \"%s\"",
			 bad[i]);
		expect_error(json, -EINVAL, msg);
	}
	load_ok("{\"gpud\": {\"devices\": [\"cuda:255\", \"cuda:10\", \"cuda:0\"]}}", &c);
	assert_int_equal(c.gpud.devices[0].index, 255);
	assert_int_equal(c.gpud.devices[1].index, 10);
	char name[16];
	sw_config_device_name(&c.gpud.devices[1], name, sizeof(name));
	assert_string_equal(name, "cuda:10");
	struct sw_config_device cpu = { SW_DEVICE_CPU, 0, 0 };
	sw_config_device_name(&cpu, name, sizeof(name));
	assert_string_equal(name, "cpu");

	expect_error("{\"gpud\": {\"devices\": [\"cuda:0\", \"cpu\", \"cuda:0\"]}}", -EINVAL,
		     "gpud.devices[2]: \"cuda:0\" duplicates gpud.devices[0]");
}

static void test_value_errors(void **state)
{
	(void)state;
	expect_error("{\"gpud\": {\"threads\": \"4\"}}", SW_ETYPE,
		     "gpud.threads: expected an integer in [0, 1024], got \"4\"");
	expect_error("{\"gpud\": {\"threads\": 2000}}", -EINVAL,
		     "gpud.threads: expected an integer in [0, 1024], got 2000");
	expect_error("{\"gpud\": {\"threads\": -1}}", -EINVAL,
		     "gpud.threads: expected an integer in [0, 1024], got -1");
	expect_error("{\"gpud\": {\"threads\": 4.5}}", SW_ETYPE,
		     "gpud.threads: expected an integer in [0, 1024], got 4.5");
	expect_error("{\"gpud\": {\"threads\": true}}", SW_ETYPE,
		     "gpud.threads: expected an integer in [0, 1024], got true");
	expect_error("{\"gpud\": {\"threads\": null}}", SW_ETYPE,
		     "gpud.threads: expected an integer in [0, 1024], got null");
	expect_error("{\"agentd\": {\"max_tasks_per_worker\": 4294967296}}", -EINVAL,
		     "agentd.max_tasks_per_worker: expected an integer in [0, 4294967295], got 4294967296");
	expect_error("{\"agentd\": {\"results_maxlen\": 0}}", -EINVAL,
		     "agentd.results_maxlen: expected an integer in [1, 1073741824], got 0");
	expect_error("{\"agentd\": {\"dead_maxlen\": 1073741825}}", -EINVAL,
		     "agentd.dead_maxlen: expected an integer in [1, 1073741824], got 1073741825");
	expect_error("{\"agentd\": {\"dead_maxlen\": \"1000\"}}", SW_ETYPE,
		     "agentd.dead_maxlen: expected an integer in [1, 1073741824], got \"1000\"");
	struct sw_config c;

	load_ok("{\"gpud\": {\"placement_margin\": 0}}", &c);
	assert_int_equal(c.gpud.placement_margin, 0);
	load_ok("{\"gpud\": {\"placement_margin\": 65536}}", &c);
	assert_int_equal(c.gpud.placement_margin, 65536);
	expect_error("{\"gpud\": {\"placement_margin\": 65537}}", -EINVAL,
		     "gpud.placement_margin: expected an integer in [0, 65536], got 65537");
	expect_error("{\"gpud\": {\"placement_margin\": -1}}", -EINVAL,
		     "gpud.placement_margin: expected an integer in [0, 65536], got -1");
	expect_error("{\"gpud\": {\"placement_margin\": \"4\"}}", SW_ETYPE,
		     "gpud.placement_margin: expected an integer in [0, 65536], got \"4\"");
	/* gpud.min_devices: 0 (every device) by default, at most the list */
	load_ok("{}", &c);
	assert_int_equal(c.gpud.min_devices, 0);
	load_ok("{\"gpud\": {\"devices\": [\"cpu\", \"cuda:0\", \"cuda:1\"], "
		"\"min_devices\": 2}}", &c);
	assert_int_equal(c.gpud.min_devices, 2);
	assert_int_equal(c.gpud.devices[2].pos, 2);
	assert_int_equal(c.gpud.devices[2].index, 1);
	expect_error("{\"gpud\": {\"devices\": [\"cpu\", \"cuda:0\"], \"min_devices\": 3}}",
		     -EINVAL, "gpud.min_devices: expected at most the 2 devices of gpud.devices, "
		     "got 3");
	expect_error("{\"gpud\": {\"min_devices\": 2}}", -EINVAL,
		     "gpud.min_devices: expected at most the 1 device of gpud.devices, got 2");
	expect_error("{\"gpud\": {\"min_devices\": 17}}", -EINVAL,
		     "gpud.min_devices: expected an integer in [0, 16], got 17");
	load_ok("{\"gpud\": {\"sample_threads\": 4}}", &c);
	assert_int_equal(c.gpud.sample_threads, 4);
	load_ok("{}", &c);
	assert_int_equal(c.gpud.sample_threads, 0);
	expect_error("{\"gpud\": {\"sample_threads\": 65}}", -EINVAL,
		     "gpud.sample_threads: expected an integer in [0, 64], got 65");
	/* gpud.kv_type: a name, f32 by default, round-tripped as its name */
	load_ok("{}", &c);
	assert_int_equal(c.gpud.kv_type, SW_KV_F32);
	load_ok("{\"gpud\": {\"kv_type\": \"f16\"}}", &c);
	assert_int_equal(c.gpud.kv_type, SW_KV_F16);
	{
		struct sw_config back;
		char *js = sw_config_to_json(&c);
		assert_non_null(js);
		assert_non_null(strstr(js, "\"kv_type\":\"f16\""));
		load_ok(js, &back);
		free(js);
		assert_int_equal(back.gpud.kv_type, SW_KV_F16);
	}
	expect_error("{\"gpud\": {\"kv_type\": \"q8_0\"}}", -EINVAL,
		     "gpud.kv_type: expected \"f32\" or \"f16\", got \"q8_0\"");
	expect_error("{\"gpud\": {\"kv_type\": 16}}", SW_ETYPE,
		     "gpud.kv_type: expected \"f32\" or \"f16\", got 16");
	expect_error("{\"gpud\": {\"max_segments\": 63}}", -EINVAL,
		     "gpud.max_segments: expected an integer in [64, 127], got 63");
	expect_error("{\"gpud\": {\"max_segments\": 128}}", -EINVAL,
		     "gpud.max_segments: expected an integer in [64, 127], got 128");
	expect_error("{\"gpud\": {\"kv_block_tokens\": 24}}", -EINVAL,
		     "gpud.kv_block_tokens: expected a power of two in [1, 1024], got 24");
	expect_error("{\"gpud\": {\"kv_block_tokens\": 2048}}", -EINVAL,
		     "gpud.kv_block_tokens: expected a power of two in [1, 1024], got 2048");
	expect_error("{\"gpud\": {\"kv_block_tokens\": 0}}", -EINVAL,
		     "gpud.kv_block_tokens: expected a power of two in [1, 1024], got 0");
	expect_error("{\"gpud\": {\"memory_fraction\": 0}}", -EINVAL,
		     "gpud.memory_fraction: expected a number in (0, 1], got 0");
	expect_error("{\"gpud\": {\"memory_fraction\": 1.5}}", -EINVAL,
		     "gpud.memory_fraction: expected a number in (0, 1], got 1.5");
	expect_error("{\"gpud\": {\"memory_fraction\": -0.1}}", -EINVAL,
		     "gpud.memory_fraction: expected a number in (0, 1], got -0.1");
	expect_error("{\"gpud\": {\"memory_fraction\": \"0.5\"}}", SW_ETYPE,
		     "gpud.memory_fraction: expected a number in (0, 1], got \"0.5\"");
	expect_error("{\"log\": {\"level\": \"verbose\"}}", -EINVAL,
		     "log.level: expected \"error\", \"warn\", \"info\" or \"debug\", got \"verbose\"");
	expect_error("{\"log\": {\"level\": 3}}", SW_ETYPE,
		     "log.level: expected \"error\", \"warn\", \"info\" or \"debug\", got 3");
	expect_error("{\"state_dir\": \"\"}", -EINVAL, "state_dir: expected a non-empty string");
	expect_error("{\"state_dir\": 5}", SW_ETYPE, "state_dir: expected a non-empty string, got 5");
	expect_error("{\"log\": {\"file\": {}}}", SW_ETYPE, "log.file: expected a string, got an object");
	expect_error("{\"gpud\": {\"socket\": \"/tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock\"}}", -EINVAL,
		     "gpud.socket: expected a string of at most 107 bytes");
	expect_error("{\"gpud\": {\"model\": \"a\\u0000b\"}}", SW_EFORMAT,
		     "line 1, column 29: \\u0000 is not allowed without JSON_ALLOW_NUL near '\"a\\u0000b\"'");
	expect_error("{\"gpud\": []}", SW_ETYPE, "gpud: expected an object, got an array");
	expect_error("{\"gpud\": {\"queue\": 5}}", SW_ETYPE, "gpud.queue: expected an object, got 5");
	expect_error("[]", SW_ETYPE, "(root): expected an object, got an array");
	expect_error("\"x\"", SW_EFORMAT,
		     "line 1, column 3: '[' or '{' expected near '\"x\"'");

	/* Long strings are shortened in "got". */
	expect_error("{\"log\": {\"level\": \"0123456789012345678901234567890123456789xyz\"}}", -EINVAL,
		     "log.level: expected \"error\", \"warn\", \"info\" or \"debug\", got "
		     "\"0123456789012345678901234567890123456...\"");
}

/* URLs may carry passwords: messages never echo them. */
static void test_url_errors(void **state)
{
	(void)state;
	expect_error("{\"redis\": {\"url\": \"http://:hunter2@r:6379\"}}", -EINVAL,
		     "redis.url: expected a redis://, rediss:// or unix:// URL");
	expect_error("{\"redis\": {\"url\": 6379}}", SW_ETYPE,
		     "redis.url: expected a redis://, rediss:// or unix:// URL, got 6379");
	expect_error("{\"postgres\": {\"url\": \"mysql://u:hunter2@db/x\"}}", -EINVAL,
		     "postgres.url: expected a postgres:// URL or a key=value conninfo string");
	expect_error("{\"postgres\": {\"url\": \"\"}}", -EINVAL,
		     "postgres.url: expected a postgres:// URL or a key=value conninfo string");
	struct sw_config c;
	load_ok("{\"redis\": {\"url\": \"unix:///run/redis.sock\"},"
		" \"postgres\": {\"url\": \"postgres://u@db/x\"}}", &c);
	assert_string_equal(c.redis.url, "unix:///run/redis.sock");
}

static void test_cross_field(void **state)
{
	(void)state;
	expect_error("{\"gpud\": {\"queue\": {\"per_connection\": 2000}}}", -EINVAL,
		     "gpud.queue.per_connection: expected at most gpud.queue.global (1024), got 2000");
	expect_error("{\"agentd\": {\"restart_backoff_min_ms\": 5000, \"restart_backoff_max_ms\": 100}}",
		     -EINVAL,
		     "agentd.restart_backoff_min_ms: expected at most agentd.restart_backoff_max_ms (100), got 5000");
	expect_error("{\"agentd\": {\"heartbeat_ms\": 5000, \"lease_ms\": 5000}}", -EINVAL,
		     "agentd.heartbeat_ms: expected less than agentd.lease_ms (5000), got 5000");
	expect_error("{\"agentd\": {\"answer_chunk_mask\": \"none\"}}", -EINVAL,
		     "agentd.answer_chunk_mask: expected \"system\" or \"self\", got \"none\"");
	{
		struct sw_config c;
		char err2[SW_ERR_MAX];
		assert_int_equal(sw_config_load_string("{\"agentd\": {\"answer_chunk_mask\": \"self\"},"
						       " \"gpud\": {\"chunk_cache_bytes\": \"8MiB\"}}",
						       &c, err2, sizeof(err2)),
				 0);
		assert_string_equal(c.agentd.answer_chunk_mask, "self");
		assert_int_equal(c.gpud.chunk_cache_bytes, 8u << 20);
	}
}

static void test_unknown_keys(void **state)
{
	(void)state;
	expect_error("{\"gpud\": {\"thread\": 4}}", -EINVAL,
		     "gpud.thread: unknown key (did you mean \"threads\"?)");
	expect_error("{\"gpud\": {\"queue\": {\"globl\": 5}}}", -EINVAL,
		     "gpud.queue.globl: unknown key (did you mean \"global\"?)");
	expect_error("{\"agentd\": {\"worker\": 4}}", -EINVAL,
		     "agentd.worker: unknown key (did you mean \"workers\"?)");
	expect_error("{\"bogus\": 1}", -EINVAL, "bogus: unknown key");
	expect_error("{\"log\": {\"level\": \"info\", \"colour\": true}}", -EINVAL,
		     "log.colour: unknown key");
	/* A typo inside a comment-looking key is still a typo. */
	expect_error("{\"/ threads\": 1}", -EINVAL, "/ threads: unknown key");
}

static void test_bad_json(void **state)
{
	(void)state;
	expect_error("{\n  \"gpud\": {\n    \"threads\": 4,\n  }\n}", SW_EFORMAT,
		     "line 4, column 3: string or '}' expected near '}'");
	expect_error("{\"gpud\": {\"threads\": 1, \"threads\": 2}}", SW_EFORMAT,
		     "line 1, column 33: duplicate object key near '\"threads\"'");
	expect_error("", SW_EFORMAT, "line 1, column 0: '[' or '{' expected near end of file");
	expect_error("{\"a\": tru}", SW_EFORMAT, "line 1, column 9: invalid token near 'tru'");
}

static const char *env_names[] = {
	"SWARM_STATE_DIR", "SWARM_LOG_LEVEL", "SWARM_LOG_FILE", "SWARM_REDIS_URL",
	"SWARM_PG_URL", "SWARM_MODEL", "SWARM_GPUD_SOCKET", "SWARM_DEVICES",
	"SWARM_THREADS", "SWARM_WORKERS", "SWARM_REDIS_MAXMEMORY", "SWARM_LOG_MAX_BYTES",
	"SWARM_SUPERVISOR_HANG_MS", "SWARM_LEASE_MS", "SWARM_FETCH_FILE_DIRS",
	"SWARM_FETCH_ALLOW_CIDRS", "SWARM_CHAT_FORMAT", "SWARM_HTTP_LISTEN",
	"SWARM_HTTP_API_KEY_FILE",
};

static int clear_env(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++)
		unsetenv(env_names[i]);
	return 0;
}

static void test_env_overrides(void **state)
{
	(void)state;
	struct sw_config c;
	sw_config_defaults(&c);
	/* Nothing set: nothing changes. */
	struct sw_config d = c;
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_memory_equal(&c, &d, sizeof(c));

	setenv("SWARM_STATE_DIR", "/data/swarm", 1);
	setenv("SWARM_LOG_LEVEL", "DEBUG", 1);
	setenv("SWARM_LOG_FILE", "", 1); /* set but empty: back to stderr */
	setenv("SWARM_REDIS_URL", "redis://:pw@r2:6379/1", 1);
	setenv("SWARM_PG_URL", "postgresql://a:b@pg2/db", 1);
	setenv("SWARM_MODEL", "/models/m.gguf", 1);
	setenv("SWARM_GPUD_SOCKET", "/tmp/gpud-test.sock", 1);
	setenv("SWARM_DEVICES", "cuda:0, cuda:1 ,cpu", 1);
	setenv("SWARM_THREADS", "6", 1);
	setenv("SWARM_WORKERS", "12", 1);
	setenv("SWARM_CHAT_FORMAT", "chatml", 1);
	snprintf(c.log.file, sizeof(c.log.file), "/var/log/x.log");
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_string_equal(c.state_dir, "/data/swarm");
	assert_int_equal(c.log.level, SW_LOG_DEBUG);
	assert_string_equal(c.log.file, "");
	assert_string_equal(c.redis.url, "redis://:pw@r2:6379/1");
	assert_string_equal(c.postgres.url, "postgresql://a:b@pg2/db");
	assert_string_equal(c.gpud.model, "/models/m.gguf");
	assert_string_equal(c.gpud.socket, "/tmp/gpud-test.sock");
	assert_int_equal(c.gpud.n_devices, 3);
	assert_int_equal(c.gpud.devices[1].kind, SW_DEVICE_CUDA);
	assert_int_equal(c.gpud.devices[1].index, 1);
	assert_int_equal(c.gpud.devices[2].kind, SW_DEVICE_CPU);
	assert_int_equal(c.gpud.threads, 6);
	assert_int_equal(c.agentd.workers, 12);
	assert_string_equal(c.gpud.chat_format, "chatml");
	assert_int_equal(sw_config_validate(&c, SW_CONFIG_NEED_MODEL, err, sizeof(err)), 0);

	/* Env beats the file: load, then apply. */
	struct sw_config f;
	load_ok("{\"agentd\": {\"workers\": 2}, \"gpud\": {\"max_seqs\": 7, "
		"\"chat_format\": \"phi3\"}}", &f);
	assert_string_equal(f.gpud.chat_format, "phi3");
	assert_int_equal(sw_config_apply_env(&f, err, sizeof(err)), 0);
	assert_int_equal(f.agentd.workers, 12);
	assert_int_equal(f.gpud.max_seqs, 7);
}

static void expect_env_error(const char *name, const char *value, int code, const char *msg)
{
	struct sw_config c, before;
	sw_config_defaults(&c);
	before = c;
	setenv(name, value, 1);
	err[0] = '\0';
	int rc = sw_config_apply_env(&c, err, sizeof(err));
	unsetenv(name);
	if (rc != code || strcmp(err, msg) != 0)
		fail_msg("%s=%s\n  got  %d \"%s\"\n  want %d \"%s\"", name, value, rc, err, code, msg);
	assert_memory_equal(&c, &before, sizeof(c));
}

static void test_env_errors(void **state)
{
	(void)state;
	expect_env_error("SWARM_WORKERS", "lots", SW_ETYPE,
			 "SWARM_WORKERS: expected an integer in [1, 4096], got \"lots\"");
	expect_env_error("SWARM_WORKERS", "0", -EINVAL,
			 "SWARM_WORKERS: expected an integer in [1, 4096], got 0");
	expect_env_error("SWARM_WORKERS", "", SW_ETYPE,
			 "SWARM_WORKERS: expected an integer in [1, 4096], got \"\"");
	expect_env_error("SWARM_WORKERS", "-3", SW_ETYPE,
			 "SWARM_WORKERS: expected an integer in [1, 4096], got \"-3\"");
	expect_env_error("SWARM_THREADS", "99999999999999999999999", SW_ETYPE,
			 "SWARM_THREADS: expected an integer in [0, 1024], got \"99999999999999999999999\"");
	expect_env_error("SWARM_DEVICES", "cpu,gpu", -EINVAL,
			 "SWARM_DEVICES[1]: expected \"cpu\" or \"cuda:N\", got \"gpu\"");
	expect_env_error("SWARM_DEVICES", "cpu,", -EINVAL,
			 "SWARM_DEVICES[1]: expected \"cpu\" or \"cuda:N\", got \"\"");
	expect_env_error("SWARM_DEVICES", "", -EINVAL,
			 "SWARM_DEVICES: expected at least one device");
	expect_env_error("SWARM_DEVICES", "cuda:3,cuda:3", -EINVAL,
			 "gpud.devices[1]: \"cuda:3\" duplicates gpud.devices[0]");
	expect_env_error("SWARM_LOG_LEVEL", "loud", -EINVAL,
			 "SWARM_LOG_LEVEL: expected \"error\", \"warn\", \"info\" or \"debug\", got \"loud\"");
	expect_env_error("SWARM_REDIS_URL", "localhost:6379", -EINVAL,
			 "SWARM_REDIS_URL: expected a redis://, rediss:// or unix:// URL");
	expect_env_error("SWARM_STATE_DIR", "", -EINVAL,
			 "SWARM_STATE_DIR: expected a non-empty string");

	/* One bad variable among good ones: none of them is applied. */
	struct sw_config c, before;
	sw_config_defaults(&c);
	before = c;
	setenv("SWARM_MODEL", "/m.gguf", 1);
	setenv("SWARM_WORKERS", "many", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), SW_ETYPE);
	assert_memory_equal(&c, &before, sizeof(c));
}

/* SWARM_LEASE_MS: the workers' lease where no file can set it (managed
 * mode), with the range and the heartbeat rule of agentd.lease_ms. */
static void test_env_lease(void **state)
{
	(void)state;
	struct sw_config c;

	sw_config_defaults(&c);
	assert_int_equal(c.agentd.lease_ms, 300000);
	setenv("SWARM_LEASE_MS", "20000", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_int_equal(c.agentd.lease_ms, 20000);
	assert_int_equal(sw_config_validate(&c, 0, err, sizeof(err)), 0);
	/* it beats the file */
	load_ok("{\"agentd\": {\"lease_ms\": 60000, \"heartbeat_ms\": 1000}}", &c);
	setenv("SWARM_LEASE_MS", "5000", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_int_equal(c.agentd.lease_ms, 5000);
	assert_int_equal(c.agentd.heartbeat_ms, 1000);
	unsetenv("SWARM_LEASE_MS");

	expect_env_error("SWARM_LEASE_MS", "999", -EINVAL,
			 "SWARM_LEASE_MS: expected an integer in [1000, 86400000], got 999");
	expect_env_error("SWARM_LEASE_MS", "20s", SW_ETYPE,
			 "SWARM_LEASE_MS: expected an integer in [1000, 86400000], got \"20s\"");
	/* not above the default heartbeat (10 s): refused, nothing applied */
	expect_env_error("SWARM_LEASE_MS", "10000", -EINVAL,
			 "agentd.heartbeat_ms: expected less than agentd.lease_ms (10000), got 10000");
}

static void test_files(void **state)
{
	(void)state;
	struct sw_config c;

	/* The shipped default config loads (tests run from the source root). */
	err[0] = '\0';
	int rc = sw_config_load_file("config/swarm.json", &c, err, sizeof(err));
	if (rc)
		fail_msg("config/swarm.json: %s", err);
	assert_int_equal(sw_config_validate(&c, SW_CONFIG_NEED_MODEL, err, sizeof(err)), 0);
	assert_int_equal(c.gpud.n_devices, 1);
	assert_int_equal(c.gpud.devices[0].kind, SW_DEVICE_CUDA);
	assert_int_equal(c.gpud.mask_cache_bytes, 64u << 20);
	assert_true(c.gpud.prefix_cache_bytes == 4ull << 30);
	assert_int_equal(c.gpud.placement_margin, 8);
	assert_int_equal(c.agentd.workers, 8);
	assert_int_equal(c.agentd.results_maxlen, 100000);
	assert_int_equal(c.agentd.dead_maxlen, 1000);
	assert_true(strncmp(c.redis.url, "redis://", 8) == 0);
	assert_string_equal(c.http.listen, ""); /* the HTTP front is off unless asked for */
	assert_int_equal(c.http.max_connections, 256);

	struct sw_config before;
	memset(&c, 0x3C, sizeof(c));
	before = c;
	assert_int_equal(sw_config_load_file("/nonexistent/swarm.json", &c, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "/nonexistent/swarm.json: No such file or directory");
	assert_int_equal(sw_config_load_file("config", &c, err, sizeof(err)), -EISDIR);
	assert_string_equal(err, "config: Is a directory");

	char path[] = "/tmp/sw_config_test.XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	const char *body = "{\n  \"gpud\": {\n    \"devices\": [\"cpu\", \"tpu\"]\n  }\n}\n";
	assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
	close(fd);
	assert_int_equal(sw_config_load_file(path, &c, err, sizeof(err)), -EINVAL);
	char want[256];
	snprintf(want, sizeof(want), "%s: gpud.devices[1]: expected \"cpu\" or \"cuda:N\", got \"tpu\"",
		 path);
	assert_string_equal(err, want);

	fd = open(path, O_WRONLY | O_TRUNC);
	body = "{\n  \"gpud\": {\n    \"threads\": 4,\n  }\n}\n";
	assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
	close(fd);
	assert_int_equal(sw_config_load_file(path, &c, err, sizeof(err)), SW_EFORMAT);
	snprintf(want, sizeof(want), "%s: line 4, column 3: string or '}' expected near '}'", path);
	assert_string_equal(err, want);

	fd = open(path, O_WRONLY | O_TRUNC);
	assert_int_equal(write(fd, "{}\0{}", 5), 5);
	close(fd);
	assert_int_equal(sw_config_load_file(path, &c, err, sizeof(err)), SW_EFORMAT);
	snprintf(want, sizeof(want), "%s: contains a NUL byte", path);
	assert_string_equal(err, want);
	assert_memory_equal(&c, &before, sizeof(c));
	unlink(path);

	/* NULL err is fine. */
	assert_int_equal(sw_config_load_file("/nonexistent", &c, NULL, 0), -ENOENT);
	assert_int_equal(sw_config_load_string("{\"x\":1}", &c, NULL, 0), -EINVAL);
}

/* The managed-mode keys: redis.maxmemory and supervisor.*: defaults,
 * overrides (file and environment), every error. */
static void test_supervisor_keys(void **state)
{
	(void)state;
	struct sw_config c;

	sw_config_defaults(&c);
	assert_true(c.redis.maxmemory == 256u << 20);
	assert_int_equal(c.supervisor.restart_backoff_min_ms, 250);
	assert_int_equal(c.supervisor.restart_backoff_max_ms, 30000);
	assert_int_equal(c.supervisor.crash_window_ms, 60000);
	assert_int_equal(c.supervisor.crash_limit, 5);
	assert_int_equal(c.supervisor.hang_ms, 60000);
	assert_true(c.supervisor.log_max_bytes == 8u << 20);
	assert_int_equal(c.supervisor.log_keep, 2);

	load_ok("{\"redis\": {\"maxmemory\": \"1GiB\"}, \"supervisor\": {"
		"\"restart_backoff_min_ms\": 50, \"restart_backoff_max_ms\": 800,"
		" \"crash_window_ms\": 5000, \"crash_limit\": 2, \"hang_ms\": 0,"
		" \"log_max_bytes\": \"64KiB\","
		" \"log_keep\": 0}}", &c);
	assert_true(c.redis.maxmemory == 1u << 30);
	assert_int_equal(c.supervisor.restart_backoff_min_ms, 50);
	assert_int_equal(c.supervisor.restart_backoff_max_ms, 800);
	assert_int_equal(c.supervisor.crash_window_ms, 5000);
	assert_int_equal(c.supervisor.crash_limit, 2);
	assert_int_equal(c.supervisor.hang_ms, 0); /* off */
	assert_true(c.supervisor.log_max_bytes == 64u << 10);
	assert_int_equal(c.supervisor.log_keep, 0);
	load_ok("{\"redis\": {\"maxmemory\": 0}}", &c); /* no limit */
	assert_true(c.redis.maxmemory == 0);

	expect_error("{\"supervisor\": {\"log_max_bytes\": 1000}}", -EINVAL,
		     "supervisor.log_max_bytes: expected a byte size in [65536, 1099511627776]"
		     " (an integer or \"64MiB\"), got 1000");
	expect_error("{\"supervisor\": {\"log_keep\": 101}}", -EINVAL,
		     "supervisor.log_keep: expected an integer in [0, 100], got 101");
	expect_error("{\"supervisor\": {\"crash_limit\": 0}}", -EINVAL,
		     "supervisor.crash_limit: expected an integer in [1, 1000], got 0");
	expect_error("{\"supervisor\": {\"restart_backoff_min_ms\": 5000,"
		     " \"restart_backoff_max_ms\": 1000}}", -EINVAL,
		     "supervisor.restart_backoff_min_ms: expected at most"
		     " supervisor.restart_backoff_max_ms (1000), got 5000");
	expect_error("{\"supervisor\": {\"log_kep\": 1}}", -EINVAL,
		     "supervisor.log_kep: unknown key (did you mean \"log_keep\"?)");
	expect_error("{\"redis\": {\"maxmemory\": \"lots\"}}", -EINVAL,
		     "redis.maxmemory: expected a byte size in [0, 1099511627776]"
		     " (an integer or \"64MiB\"), got \"lots\"");

	/* managed mode has no file: the knobs an operator turns come from
	 * the environment */
	sw_config_defaults(&c);
	setenv("SWARM_REDIS_MAXMEMORY", "512MiB", 1);
	setenv("SWARM_LOG_MAX_BYTES", "1048576", 1);
	setenv("SWARM_SUPERVISOR_HANG_MS", "0", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_true(c.redis.maxmemory == 512u << 20);
	assert_true(c.supervisor.log_max_bytes == 1u << 20);
	assert_int_equal(c.supervisor.hang_ms, 0);
	unsetenv("SWARM_REDIS_MAXMEMORY");
	unsetenv("SWARM_LOG_MAX_BYTES");
	unsetenv("SWARM_SUPERVISOR_HANG_MS");
	expect_env_error("SWARM_LOG_MAX_BYTES", "1KiB", -EINVAL,
			 "SWARM_LOG_MAX_BYTES: expected a byte size in [65536, 1099511627776]"
			 " (an integer or \"64MiB\"), got \"1KiB\"");
}

/* agentd.fetch: the lists of directories and CIDRs, from the file and
 * from the environment, and every error. */
static void test_fetch_keys(void **state)
{
	(void)state;
	struct sw_config c, d;
	char *s;

	sw_config_defaults(&c);
	assert_int_equal(c.agentd.fetch.n_file_dirs, 0); /* file:// off */
	assert_int_equal(c.agentd.fetch.n_allow_cidrs, 0); /* nothing internal */

	load_ok("{\"agentd\": {\"fetch\": {\"file_dirs\": [\"/srv/docs\", \"/data\"],"
		" \"allow_cidrs\": [\"127.0.0.1/32\", \"10.1.0.0/16\", \"fd00::/8\", \"::1\"]}}}", &c);
	assert_int_equal(c.agentd.fetch.n_file_dirs, 2);
	assert_string_equal(c.agentd.fetch.file_dirs[0], "/srv/docs");
	assert_string_equal(c.agentd.fetch.file_dirs[1], "/data");
	assert_int_equal(c.agentd.fetch.n_allow_cidrs, 4);
	assert_string_equal(c.agentd.fetch.allow_cidrs[0], "127.0.0.1/32");
	assert_string_equal(c.agentd.fetch.allow_cidrs[3], "::1");
	s = sw_config_to_json(&c);
	assert_non_null(s);
	assert_non_null(strstr(s, "\"fetch\":{\"allow_cidrs\":[\"127.0.0.1/32\",\"10.1.0.0/16\","
				  "\"fd00::/8\",\"::1\"],\"file_dirs\":[\"/srv/docs\",\"/data\"]}"));
	load_ok(s, &d);
	assert_memory_equal(&c, &d, sizeof(c));
	free(s);
	load_ok("{\"agentd\": {\"fetch\": {\"file_dirs\": [], \"allow_cidrs\": []}}}", &c);
	assert_int_equal(c.agentd.fetch.n_file_dirs, 0);
	assert_int_equal(c.agentd.fetch.n_allow_cidrs, 0);

	expect_error("{\"agentd\": {\"fetch\": {\"allow_cidrs\": \"127.0.0.1/32\"}}}", SW_ETYPE,
		     "agentd.fetch.allow_cidrs: expected an array of CIDRs (\"10.0.0.0/8\","
		     " \"::1/128\"), got \"127.0.0.1/32\"");
	expect_error("{\"agentd\": {\"fetch\": {\"allow_cidrs\": [\"127.0.0.1/32\", 8]}}}",
		     SW_ETYPE, "agentd.fetch.allow_cidrs[1]: expected a string, got 8");
	expect_error("{\"agentd\": {\"fetch\": {\"allow_cidrs\": [\"10.0.0.1/8\"]}}}", -EINVAL,
		     "agentd.fetch.allow_cidrs[0]: \"10.0.0.1/8\": host bits are set"
		     " (did you mean 10.0.0.0/8?)");
	expect_error("{\"agentd\": {\"fetch\": {\"allow_cidrs\": [\"::1\", \"localhost\"]}}}",
		     -EINVAL,
		     "agentd.fetch.allow_cidrs[1]: \"localhost\": \"localhost\" is not an IPv4 address"
		     " (a.b.c.d) or an IPv6 address");
	expect_error("{\"agentd\": {\"fetch\": {\"allow_cidrs\": [\"10.0.0.0/33\"]}}}", -EINVAL,
		     "agentd.fetch.allow_cidrs[0]: \"10.0.0.0/33\": prefix length 33 is above 32");
	expect_error("{\"agentd\": {\"fetch\": {\"allow_cidrs\": [\"\"]}}}", -EINVAL,
		     "agentd.fetch.allow_cidrs[0]: \"\": expected an address or ADDRESS/PREFIX"
		     " (10.0.0.0/8, fd00::/8)");
	expect_error("{\"agentd\": {\"fetch\": {\"file_dirs\": [\"docs\"]}}}", -EINVAL,
		     "agentd.fetch.file_dirs[0]: expected an absolute path, got \"docs\"");
	expect_error("{\"agentd\": {\"fetch\": {\"file_dirs\": [\"\"]}}}", -EINVAL,
		     "agentd.fetch.file_dirs[0]: expected an absolute path, got \"\"");
	expect_error("{\"agentd\": {\"fetch\": {\"file_dirs\": {\"a\": 1}}}}", SW_ETYPE,
		     "agentd.fetch.file_dirs: expected an array of absolute paths, got an object");
	expect_error("{\"agentd\": {\"fetch\": {\"file_dir\": []}}}", -EINVAL,
		     "agentd.fetch.file_dir: unknown key (did you mean \"file_dirs\"?)");
	{
		char json[8192];
		size_t n = (size_t)snprintf(json, sizeof(json),
					    "{\"agentd\": {\"fetch\": {\"file_dirs\": [");

		for (int i = 0; i < 17; i++)
			n += (size_t)snprintf(json + n, sizeof(json) - n, "%s\"/d%d\"", i ? "," : "", i);
		snprintf(json + n, sizeof(json) - n, "]}}}");
		expect_error(json, -EINVAL, "agentd.fetch.file_dirs: expected at most 16 entries");
		memset(json, 0, sizeof(json));
		n = (size_t)snprintf(json, sizeof(json), "{\"agentd\": {\"fetch\": {\"file_dirs\": [\"/");
		memset(json + n, 'x', 1100);
		snprintf(json + n + 1100, sizeof(json) - n - 1100, "\"]}}}");
		expect_error(json, -EINVAL,
			     "agentd.fetch.file_dirs[0]: expected a string of at most 1023 bytes");
	}

	/* From the environment: comma-separated, blanks trimmed, "" = none. */
	sw_config_defaults(&c);
	setenv("SWARM_FETCH_ALLOW_CIDRS", "127.0.0.1/32, ::1/128", 1);
	setenv("SWARM_FETCH_FILE_DIRS", "/srv/a,/srv/b", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_int_equal(c.agentd.fetch.n_allow_cidrs, 2);
	assert_string_equal(c.agentd.fetch.allow_cidrs[1], "::1/128");
	assert_int_equal(c.agentd.fetch.n_file_dirs, 2);
	assert_string_equal(c.agentd.fetch.file_dirs[1], "/srv/b");
	setenv("SWARM_FETCH_ALLOW_CIDRS", "", 1);
	unsetenv("SWARM_FETCH_FILE_DIRS");
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_int_equal(c.agentd.fetch.n_allow_cidrs, 0);
	assert_string_equal(c.agentd.fetch.allow_cidrs[0], ""); /* nothing left behind */
	assert_int_equal(c.agentd.fetch.n_file_dirs, 2);
	unsetenv("SWARM_FETCH_ALLOW_CIDRS");
	expect_env_error("SWARM_FETCH_ALLOW_CIDRS", "127.0.0.1/32,10.0.0.1/8", -EINVAL,
			 "SWARM_FETCH_ALLOW_CIDRS[1]: \"10.0.0.1/8\": host bits are set"
			 " (did you mean 10.0.0.0/8?)");
	expect_env_error("SWARM_FETCH_FILE_DIRS", "relative/dir", -EINVAL,
			 "SWARM_FETCH_FILE_DIRS[0]: expected an absolute path, got \"relative/dir\"");
}

/* The daemon's keys (gpud.*): defaults, overrides, every error. */
static void test_daemon_keys(void **state)
{
	(void)state;
	struct sw_config c;

	sw_config_defaults(&c);
	assert_int_equal(c.gpud.max_connections, 512);
	assert_true(c.gpud.ring_bytes == 1u << 20);
	assert_true(c.gpud.request_bytes == 2u << 20);
	assert_true(c.gpud.stage_bytes == 64u << 10);
	assert_int_equal(c.gpud.stall_ms, 10000);
	assert_string_equal(c.gpud.metrics, "");
	assert_int_equal(c.gpud.watchdog.window_ms, 60000);
	assert_int_equal(c.gpud.watchdog.k, 10);

	load_ok("{\"gpud\": {\"max_connections\": 256, \"ring_bytes\": \"4MiB\","
		" \"request_bytes\": 100000, \"stage_bytes\": \"8KiB\", \"stall_ms\": 500,"
		" \"metrics\": \"127.0.0.1:9464\","
		" \"watchdog\": {\"window_ms\": 1000, \"k\": 2}}}", &c);
	assert_int_equal(c.gpud.max_connections, 256);
	assert_true(c.gpud.ring_bytes == 4u << 20);
	assert_true(c.gpud.request_bytes == 100000);
	assert_true(c.gpud.stage_bytes == 8u << 10);
	assert_int_equal(c.gpud.stall_ms, 500);
	assert_string_equal(c.gpud.metrics, "127.0.0.1:9464");
	assert_int_equal(c.gpud.watchdog.window_ms, 1000);
	assert_int_equal(c.gpud.watchdog.k, 2);
	load_ok("{\"gpud\": {\"metrics\": \"unix:/run/swarm/m.sock\"}}", &c);
	assert_string_equal(c.gpud.metrics, "unix:/run/swarm/m.sock");
	load_ok("{\"gpud\": {\"metrics\": \"\"}}", &c);
	assert_string_equal(c.gpud.metrics, "");

	expect_error("{\"gpud\": {\"ring_bytes\": 100000}}", -EINVAL,
		     "gpud.ring_bytes: expected a power-of-two byte size in [65536, 1073741824]"
		     " (an integer or \"64MiB\"), got 100000");
	expect_error("{\"gpud\": {\"ring_bytes\": \"32KiB\"}}", -EINVAL,
		     "gpud.ring_bytes: expected a power-of-two byte size in [65536, 1073741824]"
		     " (an integer or \"64MiB\"), got \"32KiB\"");
	expect_error("{\"gpud\": {\"max_connections\": 0}}", -EINVAL,
		     "gpud.max_connections: expected an integer in [1, 65536], got 0");
	expect_error("{\"gpud\": {\"stall_ms\": 10}}", -EINVAL,
		     "gpud.stall_ms: expected an integer in [100, 3600000], got 10");
	expect_error("{\"gpud\": {\"stage_bytes\": \"1GiB\"}}", -EINVAL,
		     "gpud.stage_bytes: expected a byte size in [4096, 67108864]"
		     " (an integer or \"64MiB\"), got \"1GiB\"");
	expect_error("{\"gpud\": {\"watchdog\": {\"k\": 1}}}", -EINVAL,
		     "gpud.watchdog.k: expected an integer in [2, 256], got 1");
	expect_error("{\"gpud\": {\"watchdog\": {\"windows_ms\": 1}}}", -EINVAL,
		     "gpud.watchdog.windows_ms: unknown key (did you mean \"window_ms\"?)");
	static const char *bad_metrics[] = { "0.0.0.0:9464", "127.0.0.1:", "127.0.0.1:0",
					     "127.0.0.1:65536", "127.0.0.1:09", "unix:", "unix:rel",
					     "localhost:9464" };
	for (size_t i = 0; i < sizeof(bad_metrics) / sizeof(bad_metrics[0]); i++) {
		char json[256], msg[256];
		snprintf(json, sizeof(json), "{\"gpud\": {\"metrics\": \"%s\"}}", bad_metrics[i]);
		snprintf(msg, sizeof(msg),
			 "gpud.metrics: expected \"\" (off), \"127.0.0.1:PORT\" or \"unix:/path\""
			 " (at most 107 bytes of path), got \"%s\"", bad_metrics[i]);
		expect_error(json, -EINVAL, msg);
	}
	expect_error("{\"gpud\": {\"metrics\": 9464}}", SW_ETYPE,
		     "gpud.metrics: expected \"\" (off), \"127.0.0.1:PORT\" or \"unix:/path\""
		     " (at most 107 bytes of path), got 9464");
	char json[512];
	snprintf(json, sizeof(json), "{\"gpud\": {\"metrics\": \"unix:/%0120d\"}}", 0);
	err[0] = '\0';
	assert_int_equal(sw_config_load_string(json, &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "gpud.metrics: expected"));

	/* The new keys survive the round trip through sw_config_to_json. */
	struct sw_config back;
	load_ok("{\"gpud\": {\"ring_bytes\": \"2MiB\", \"metrics\": \"unix:/tmp/m.sock\","
		" \"watchdog\": {\"k\": 7}}}", &c);
	char *js = sw_config_to_json(&c);
	assert_non_null(js);
	assert_non_null(strstr(js, "\"metrics\":\"unix:/tmp/m.sock\""));
	load_ok(js, &back);
	free(js);
	assert_true(back.gpud.ring_bytes == 2u << 20);
	assert_int_equal(back.gpud.watchdog.k, 7);
	assert_string_equal(back.gpud.metrics, "unix:/tmp/m.sock");
}

/* The socket's mode and group and the admitted peers: octal strings,
 * names resolved at load (root and nobody exist everywhere the tests
 * run), numbers taken as they are, every error naming the key. */
static void test_socket_keys(void **state)
{
	(void)state;
	struct sw_config c, back;

	sw_config_defaults(&c);
	assert_int_equal(c.gpud.socket_mode, 0660);
	assert_string_equal(c.gpud.socket_group, "");
	assert_int_equal(c.gpud.allowed_uids.n, 0);
	assert_int_equal(c.gpud.allowed_gids.n, 0);

	load_ok("{\"gpud\": {\"socket_mode\": \"0600\", \"socket_group\": \"root\","
		" \"allowed_uids\": [\"nobody\", 1001], \"allowed_gids\": [0, \"root\"]}}", &c);
	assert_int_equal(c.gpud.socket_mode, 0600);
	assert_string_equal(c.gpud.socket_group, "root");
	assert_int_equal(c.gpud.allowed_uids.n, 2);
	assert_int_equal(c.gpud.allowed_uids.id[0], 65534);
	assert_int_equal(c.gpud.allowed_uids.id[1], 1001);
	assert_int_equal(c.gpud.allowed_gids.n, 2);
	assert_int_equal(c.gpud.allowed_gids.id[0], 0);
	assert_int_equal(c.gpud.allowed_gids.id[1], 0);
	load_ok("{\"gpud\": {\"socket_mode\": \"777\", \"socket_group\": \"4242\","
		" \"allowed_uids\": []}}", &c);
	assert_int_equal(c.gpud.socket_mode, 0777);
	assert_string_equal(c.gpud.socket_group, "4242"); /* a gid needs no group entry */
	assert_int_equal(c.gpud.allowed_uids.n, 0);

	/* The round trip: ids as numbers, the mode as an octal string. */
	load_ok("{\"gpud\": {\"socket_mode\": \"0640\", \"socket_group\": \"root\","
		" \"allowed_uids\": [\"nobody\"], \"allowed_gids\": [7, 8]}}", &c);
	char *js = sw_config_to_json(&c);
	assert_non_null(js);
	assert_non_null(strstr(js, "\"socket_mode\":\"0640\""));
	assert_non_null(strstr(js, "\"allowed_uids\":[65534]"));
	assert_non_null(strstr(js, "\"allowed_gids\":[7,8]"));
	assert_non_null(strstr(js, "\"socket_group\":\"root\""));
	load_ok(js, &back);
	free(js);
	assert_memory_equal(&c, &back, sizeof(c));

	static const char mode_want[] = "gpud.socket_mode: expected an octal mode string from "
					"\"0600\" to \"0777\" that gives the owner rw, such as \"0660\"";
	static const char *bad_modes[] = { "0400", "0066", "1660", "0668", "66", "06600", "", "rw" };
	for (size_t i = 0; i < sizeof(bad_modes) / sizeof(bad_modes[0]); i++) {
		char json[128], msg[256];
		snprintf(json, sizeof(json), "{\"gpud\": {\"socket_mode\": \"%s\"}}", bad_modes[i]);
		snprintf(msg, sizeof(msg), "%s, got \"%s\"", mode_want, bad_modes[i]);
		expect_error(json, -EINVAL, msg);
	}
	char msg[256];
	snprintf(msg, sizeof(msg), "%s, got 432", mode_want);
	expect_error("{\"gpud\": {\"socket_mode\": 432}}", SW_ETYPE, msg);

	expect_error("{\"gpud\": {\"socket_group\": \"no-such-group-i13\"}}", -EINVAL,
		     "gpud.socket_group: no group named \"no-such-group-i13\"");
	expect_error("{\"gpud\": {\"socket_group\": 0}}", SW_ETYPE,
		     "gpud.socket_group: expected a group name or gid as a string (\"\" = gpud's "
		     "own group), got 0");
	expect_error("{\"gpud\": {\"socket_group\": \"4294967295\"}}", -EINVAL,
		     "gpud.socket_group: group id 4294967295 out of range");
	expect_error("{\"gpud\": {\"allowed_uids\": [0, \"no-such-user-i13\"]}}", -EINVAL,
		     "gpud.allowed_uids[1]: no user named \"no-such-user-i13\"");
	expect_error("{\"gpud\": {\"allowed_gids\": [\"no-such-group-i13\"]}}", -EINVAL,
		     "gpud.allowed_gids[0]: no group named \"no-such-group-i13\"");
	expect_error("{\"gpud\": {\"allowed_uids\": [-1]}}", -EINVAL,
		     "gpud.allowed_uids[0]: expected a uid in [0, 4294967294], got -1");
	expect_error("{\"gpud\": {\"allowed_gids\": [4294967295]}}", -EINVAL,
		     "gpud.allowed_gids[0]: expected a gid in [0, 4294967294], got 4294967295");
	expect_error("{\"gpud\": {\"allowed_uids\": [true]}}", SW_ETYPE,
		     "gpud.allowed_uids[0]: expected a user name or uid, got true");
	expect_error("{\"gpud\": {\"allowed_uids\": [\"\"]}}", -EINVAL,
		     "gpud.allowed_uids[0]: an empty user name");
	expect_error("{\"gpud\": {\"allowed_gids\": 5}}", SW_ETYPE,
		     "gpud.allowed_gids: expected an array of at most 64 group names or gids, got 5");
	char big[1024];
	size_t n = (size_t)snprintf(big, sizeof(big), "{\"gpud\": {\"allowed_uids\": [");
	for (int i = 0; i < 65; i++)
		n += (size_t)snprintf(big + n, sizeof(big) - n, "%s%d", i ? "," : "", i);
	snprintf(big + n, sizeof(big) - n, "]}}");
	expect_error(big, -EINVAL,
		     "gpud.allowed_uids: expected an array of at most 64 user names or uids");

	uint32_t gid = 1;
	assert_int_equal(sw_config_group_id("root", &gid, err, sizeof(err)), 0);
	assert_int_equal(gid, 0);
	assert_int_equal(sw_config_group_id("77", &gid, err, sizeof(err)), 0);
	assert_int_equal(gid, 77);
	assert_int_equal(sw_config_group_id("no-such-group-i13", &gid, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "no group named \"no-such-group-i13\"");
	assert_int_equal(sw_config_group_id("", &gid, err, sizeof(err)), -EINVAL);
}

static void test_to_json_round_trip(void **state)
{
	(void)state;
	struct sw_config a, b;

	sw_config_defaults(&a);
	char *s = sw_config_to_json(&a);
	assert_non_null(s);
	assert_non_null(strstr(s, "\"devices\":[\"cpu\"]"));
	assert_non_null(strstr(s, "\"level\":\"info\""));
	assert_non_null(strstr(s, "\"memory_fraction\":0.9,"));
	assert_non_null(strstr(s, "\"queue\":{\"global\":1024,\"per_connection\":64}"));
	load_ok(s, &b);
	assert_memory_equal(&a, &b, sizeof(a));
	free(s);

	load_ok("{\"gpud\": {\"devices\": [\"cuda:1\", \"cpu\"], \"memory_fraction\": 0.85,"
		" \"model\": \"/m\"}, \"log\": {\"level\": \"warn\"}}", &a);
	s = sw_config_to_json(&a);
	assert_non_null(s);
	load_ok(s, &b);
	assert_memory_equal(&a, &b, sizeof(a));
	free(s);

	/* Passwords never reach the log line. */
	snprintf(a.postgres.url, sizeof(a.postgres.url), "postgresql://swarm:hunter2@db:5432/swarm");
	snprintf(a.redis.url, sizeof(a.redis.url), "redis://:s3cret@r:6379/0");
	s = sw_config_to_json(&a);
	assert_non_null(s);
	assert_null(strstr(s, "hunter2"));
	assert_null(strstr(s, "s3cret"));
	assert_non_null(strstr(s, "\"postgresql://swarm:***@db:5432/swarm\""));
	assert_non_null(strstr(s, "\"redis://:***@r:6379/0\""));
	free(s);
}

static void redacts(const char *in, const char *want)
{
	char out[256];
	sw_config_redact_url(in, out, sizeof(out));
	if (strcmp(out, want) != 0)
		fail_msg("redact %s: got %s want %s", in, out, want);
}

static void test_redact(void **state)
{
	(void)state;
	redacts("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0");
	redacts("postgresql://swarm@db/swarm", "postgresql://swarm@db/swarm");
	redacts("postgresql://swarm:pw@db/swarm", "postgresql://swarm:***@db/swarm");
	redacts("redis://:pw@r:6379", "redis://:***@r:6379");
	redacts("redis://u:p/a@ss@r:6379/0", "redis://u:***@r:6379/0"); /* unencoded '/' and '@' */
	redacts("postgresql://db/x?sslmode=require&password=pw&user=u",
		"postgresql://db/x?sslmode=require&password=***&user=u");
	redacts("postgresql://db/x?password=pw", "postgresql://db/x?password=***");
	redacts("host=db password=secret user=x", "host=db password=*** user=x");
	redacts("password=secret", "password=***");
	redacts("host=db password='a b\\' c' user=x", "host=db password=*** user=x");
	redacts("host=db mypassword=x", "host=db mypassword=x");
	redacts("", "");

	/* Truncation never leaks a secret and always terminates. */
	char small[14];
	sw_config_redact_url("redis://:secretsecret@r", small, sizeof(small));
	assert_string_equal(small, "redis://:***@");
	char tiny[3];
	sw_config_redact_url("host=x password=y", tiny, sizeof(tiny));
	assert_string_equal(tiny, "ho");
	char cut[20];
	sw_config_redact_url("host=db password=secret", cut, sizeof(cut));
	assert_null(strstr(cut, "sec"));
	sw_config_redact_url("x", small, 0); /* no write at all */
}


/* The http section (gpud-http): defaults, every key, listen's forms and
 * its errors, the env overrides, the round trip, the split helper. */
static void test_http_keys(void **state)
{
	(void)state;
	struct sw_config c;
	char host[SW_CONFIG_HOSTPORT_MAX];
	uint16_t port;

	sw_config_defaults(&c);
	assert_string_equal(c.http.listen, "");
	assert_string_equal(c.http.api_key_file, "");
	assert_int_equal(c.http.max_connections, 256);
	assert_true(c.http.max_body_bytes == 1u << 20);
	assert_int_equal(c.http.header_timeout_ms, 10000);
	assert_int_equal(c.http.idle_timeout_ms, 60000);

	load_ok("{\"http\": {\"listen\": \"0.0.0.0:8080\", \"api_key_file\": \"/etc/swarm/keys\","
		" \"max_connections\": 10, \"max_body_bytes\": \"4MiB\","
		" \"header_timeout_ms\": 500, \"idle_timeout_ms\": 1000}}", &c);
	assert_string_equal(c.http.listen, "0.0.0.0:8080");
	assert_string_equal(c.http.api_key_file, "/etc/swarm/keys");
	assert_int_equal(c.http.max_connections, 10);
	assert_true(c.http.max_body_bytes == 4u << 20);
	assert_int_equal(c.http.header_timeout_ms, 500);
	assert_int_equal(c.http.idle_timeout_ms, 1000);

	static const char *good[] = { "127.0.0.1:8080", "[::1]:80", "localhost:65535",
				      "api.example-1.internal:443", "" };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		char json[256];
		snprintf(json, sizeof(json), "{\"http\": {\"listen\": \"%s\"}}", good[i]);
		load_ok(json, &c);
		assert_string_equal(c.http.listen, good[i]);
	}
	static const char *bad[] = { "8080", ":8080", "127.0.0.1:", "127.0.0.1:0",
				     "127.0.0.1:65536", "127.0.0.1:080", "[::1:80", "[]:80",
				     "::1:80", "host name:80", "unix:/tmp/x", "h:80x" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char json[256], msg[384];
		snprintf(json, sizeof(json), "{\"http\": {\"listen\": \"%s\"}}", bad[i]);
		snprintf(msg, sizeof(msg),
			 "http.listen: expected \"\" (off) or \"HOST:PORT\" (an IPv4 address,"
			 " [IPv6] or a host name; port 1..65535), got \"%s\"", bad[i]);
		expect_error(json, -EINVAL, msg);
	}
	expect_error("{\"http\": {\"listen\": 8080}}", SW_ETYPE,
		     "http.listen: expected \"\" (off) or \"HOST:PORT\" (an IPv4 address,"
		     " [IPv6] or a host name; port 1..65535), got 8080");
	expect_error("{\"http\": {\"max_connections\": 0}}", -EINVAL,
		     "http.max_connections: expected an integer in [1, 65536], got 0");
	expect_error("{\"http\": {\"max_body_bytes\": 10}}", -EINVAL,
		     "http.max_body_bytes: expected a byte size in [1024, 1073741824]"
		     " (an integer or \"64MiB\"), got 10");
	expect_error("{\"http\": {\"header_timeout_ms\": 5}}", -EINVAL,
		     "http.header_timeout_ms: expected an integer in [100, 3600000], got 5");
	expect_error("{\"http\": {\"idle_timout_ms\": 5}}", -EINVAL,
		     "http.idle_timout_ms: unknown key (did you mean \"idle_timeout_ms\"?)");

	/* Environment overrides. */
	sw_config_defaults(&c);
	setenv("SWARM_HTTP_LISTEN", "[::]:9000", 1);
	setenv("SWARM_HTTP_API_KEY_FILE", "/run/keys", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), 0);
	assert_string_equal(c.http.listen, "[::]:9000");
	assert_string_equal(c.http.api_key_file, "/run/keys");
	setenv("SWARM_HTTP_LISTEN", "nope", 1);
	assert_int_equal(sw_config_apply_env(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "SWARM_HTTP_LISTEN: expected \"\" (off) or \"HOST:PORT\""));
	assert_string_equal(c.http.listen, "[::]:9000"); /* unchanged */
	unsetenv("SWARM_HTTP_LISTEN");
	unsetenv("SWARM_HTTP_API_KEY_FILE");

	/* Round trip. */
	struct sw_config back;
	load_ok("{\"http\": {\"listen\": \"[::1]:8081\", \"max_body_bytes\": 2048}}", &c);
	char *js = sw_config_to_json(&c);
	assert_non_null(js);
	load_ok(js, &back);
	free(js);
	assert_string_equal(back.http.listen, "[::1]:8081");
	assert_true(back.http.max_body_bytes == 2048);

	/* The split helper gpud-http uses for --listen. */
	assert_int_equal(sw_config_split_hostport("[::1]:8081", host, sizeof(host), &port,
						  err, sizeof(err)), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 8081);
	assert_int_equal(sw_config_split_hostport("localhost:1", host, sizeof(host), &port,
						  err, sizeof(err)), 0);
	assert_string_equal(host, "localhost");
	assert_int_equal(port, 1);
	assert_int_equal(sw_config_split_hostport("", host, sizeof(host), &port, err,
						  sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "expected \"HOST:PORT\""));
	assert_int_equal(sw_config_split_hostport("localhost:8080", host, 4, &port, err,
						  sizeof(err)), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_overrides),
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_device_errors),
		cmocka_unit_test(test_value_errors),
		cmocka_unit_test(test_url_errors),
		cmocka_unit_test(test_cross_field),
		cmocka_unit_test(test_unknown_keys),
		cmocka_unit_test(test_bad_json),
		cmocka_unit_test_teardown(test_env_overrides, clear_env),
		cmocka_unit_test_teardown(test_env_errors, clear_env),
		cmocka_unit_test_teardown(test_env_lease, clear_env),
		cmocka_unit_test(test_files),
		cmocka_unit_test(test_daemon_keys),
		cmocka_unit_test_teardown(test_fetch_keys, clear_env),
		cmocka_unit_test_teardown(test_supervisor_keys, clear_env),
		cmocka_unit_test(test_socket_keys),
		cmocka_unit_test(test_to_json_round_trip),
		cmocka_unit_test(test_redact),
		cmocka_unit_test_teardown(test_http_keys, clear_env),
	};
	clear_env(NULL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
