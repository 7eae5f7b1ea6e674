/* gpud_lifecycle_test.c - starting and stopping a real `gpud serve`:
 * --check on a good and on bad configurations, the socket's mode, SIGTERM
 * with requests in flight (drained, or cut at a tiny deadline with error
 * frames), a second daemon on a live socket, a missing or corrupt model,
 * pools that cannot fit, and block-owner dumps that never pile up in
 * state_dir; the pools resident from start-up on (RSS at least what STATS
 * says they hold, and flat as the caches fill), and a pool the machine
 * cannot give refused at start naming it (--check reserves nothing);
 * gpud.min_devices: a configured device that is not there, or whose
 * engine fails, left out, the others serving under their own names, STATS
 * listing it; too few left and the start is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>

#include "common/err.h"
#include "common/mem.h"
#include "gpud/gguf.h"
#include "gpud/mkmodel.h"
#include "proto/client.h"
#include "sw_config.h"
#include "tests/integration/gpud_harness.h"

#define ONCE "Once upon a time"

/* Runs `gpud serve --check --config d->config`; returns the exit code,
 * output in out. */
static int check_config(const struct gpud_it *d, char *out, size_t outlen)
{
	const char *args[] = { "serve", "--check", "--config", d->config, NULL };

	return gpud_it_run_cmd(args, out, outlen, 60000);
}

/* True when the daemon's output or its log file mentions needle. */
static bool said(const struct gpud_it *d, const char *out, const char *needle)
{
	return (out && strstr(out, needle)) || gpud_it_file_has(d->out, needle) ||
	       gpud_it_file_has(d->log, needle);
}

static void test_check_ok(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 256" };
	char out[16384];
	int rc;

	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	rc = check_config(&f->d[0], out, sizeof(out));
	printf("%s", out);
	if (rc != 0)
		fail_msg("gpud serve --check exited %d on a good configuration:\n%s", rc, out);
	assert_non_null(strstr(out, "configuration OK"));
	/* --check does not start a server */
	assert_int_equal(access(f->d[0].socket, F_OK), -1);
	f->done = true;
}

/* A bad configuration: --check exits 1 naming the key path. */
static void bad_config(struct gpud_it_fix *f, const char *extra, const char *devices,
		       const char *key)
{
	struct gpud_it_opts o = { .gpud_extra = extra, .devices = devices };
	char out[16384];
	int rc;

	gpud_it_free(&f->d[0]);
	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	rc = check_config(&f->d[0], out, sizeof(out));
	printf("    %s -> exit %d: %s", key, rc, out);
	if (rc != 1)
		fail_msg("--check exited %d on a bad %s (expected 1):\n%s", rc, key, out);
	if (!strstr(out, key))
		fail_msg("--check output does not name %s:\n%s", key, out);
	if (strstr(out, "configuration OK"))
		fail_msg("--check said OK on a bad %s", key);
}

static void test_check_bad(void **state)
{
	struct gpud_it_fix *f = *state;

	bad_config(f, "\"thread\": 2", NULL, "gpud.thread");
	bad_config(f, "\"kv_block_tokens\": 3", NULL, "gpud.kv_block_tokens");
	bad_config(f, "\"max_segments\": 500", NULL, "gpud.max_segments");
	bad_config(f, "\"queue\": { \"per_connection\": \"many\" }", NULL,
		   "gpud.queue.per_connection");
	bad_config(f, NULL, "[\"cpu\", \"gpu0\"]", "gpud.devices[1]");
	/* not JSON at all */
	{
		struct gpud_it_opts o = { .raw_config = "{ \"gpud\": { \"model\": " };
		char out[4096];
		int rc;

		gpud_it_free(&f->d[0]);
		assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
		rc = check_config(&f->d[0], out, sizeof(out));
		printf("    truncated JSON -> exit %d: %s", rc, out);
		assert_int_equal(rc, 1);
		assert_non_null(strstr(out, "line"));
	}
	/* no model */
	{
		struct gpud_it_opts o = {
			.raw_config = "{ \"gpud\": { \"socket\": \"/tmp/gpud-it-none.sock\" } }",
		};
		char out[4096];
		int rc;

		gpud_it_free(&f->d[0]);
		assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
		rc = check_config(&f->d[0], out, sizeof(out));
		printf("    no model -> exit %d: %s", rc, out);
		assert_int_equal(rc, 1);
		assert_non_null(strstr(out, "gpud.model"));
	}
	f->done = true;
}

static void test_socket_mode(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 256" };
	struct stat st;

	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	printf("    ready %.2f s after spawn\n", f->d[0].ready_s);
	assert_int_equal(stat(f->d[0].socket, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	if ((st.st_mode & 07777) != 0660)
		fail_msg("socket mode %04o, expected 0660", st.st_mode & 07777);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

/* Files in dir whose name starts with prefix. */
static int count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

/* `swarmctl mem --dump` run every few seconds (a monitoring script) must
 * not fill state_dir: the dumps take GPUD_DUMPS_KEPT (8) names in turn. */
static void test_dumps_bounded(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 256" };
	char err[SW_ERR_MAX], *json = NULL;
	struct proto_client *c;
	json_t *root;
	const char *path;

	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(c = gpud_it_connect(&f->d[0]));
	for (int i = 0; i < 20; i++) {
		free(json);
		json = NULL;
		if (proto_client_mem(c, PROTO_MEM_DUMP_OWNERS, &json, err, sizeof(err)) != 0)
			fail_msg("mem --dump %d: %s", i, err);
	}
	assert_int_equal(count_files(f->d[0].state, "gpud-blocks-"), 8);
	root = json_loads(json, 0, NULL);
	assert_non_null(root);
	path = json_string_value(json_object_get(root, "dump"));
	assert_non_null(path);
	assert_non_null(strstr(path, "/gpud-blocks-3.json")); /* the 20th: slot 19 % 8 */
	assert_true(gpud_it_file_has(path, "\"devices\""));
	json_decref(root);
	free(json);
	proto_client_close(c);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

/* --- SIGTERM ---------------------------------------------------------------- */

struct ends {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int pending, ok, failed, first_token;
	int codes[64];
	char msg[64][PROTO_MAX_ERROR_MSG];
};

static int on_tokens(void *arg, uint64_t id, const struct proto_tokens *t)
{
	struct ends *e = arg;

	pthread_mutex_lock(&e->mu);
	e->first_token = 1;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
	return 0;
}

static void on_done(void *arg, uint64_t id, int status, const struct proto_done *u,
		    const char *msg)
{
	struct ends *e = arg;

	pthread_mutex_lock(&e->mu);
	if (status == 0) {
		e->ok++;
	} else {
		if (e->failed < 64) {
			e->codes[e->failed] = status;
			snprintf(e->msg[e->failed], sizeof(e->msg[0]), "%s", msg ? msg : "");
		}
		e->failed++;
	}
	e->pending--;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

/* Submits n long generations (about 600 prompt tokens + max_tokens) and
 * waits for the first token. */
static void submit_long(struct proto_client *c, struct ends *e, int n, uint32_t max_tokens)
{
	static char prompt[8192];
	struct proto_segment seg = { .text = prompt };
	struct proto_submit_req req = { .n_segments = 1, .segments = &seg,
					.max_tokens = max_tokens };
	struct proto_client_events ev = { .on_tokens = on_tokens, .on_done = on_done, .arg = e };
	static const char *const w[] = { "the", "dog", "saw", "a", "big", "red", "ball", "and",
					 "Lily", "was", "happy", "in", "park" };
	size_t len = 0;
	char err[SW_ERR_MAX];

	for (int i = 0; i < 600; i++)
		len += (size_t)snprintf(prompt + len, sizeof(prompt) - len, "%s%s", i ? " " : "",
					w[(i * 5 + i / 13) % 13]);
	seg.len = (uint32_t)len;
	proto_sampling_default(&req.sampling);
	req.sampling.temperature = 1.0f;
	for (int i = 0; i < n; i++) {
		req.sampling.seed = (uint64_t)i + 7;
		pthread_mutex_lock(&e->mu);
		e->pending++;
		pthread_mutex_unlock(&e->mu);
		if (proto_client_submit(c, &req, &ev, NULL, err, sizeof(err)))
			fail_msg("submit %d: %s", i, err);
	}
	pthread_mutex_lock(&e->mu);
	while (!e->first_token && e->pending > 0)
		pthread_cond_wait(&e->cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
}

static int wait_ends(struct ends *e, int timeout_s)
{
	struct timespec ts;
	int left;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_s;
	pthread_mutex_lock(&e->mu);
	while (e->pending > 0)
		if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT)
			break;
	left = e->pending;
	pthread_mutex_unlock(&e->mu);
	return left;
}

/* Polls STATS until "draining" is true. */
static void wait_draining(struct proto_client *c)
{
	double deadline = gpud_it_now() + 30;

	for (;;) {
		json_t *st = gpud_it_stats(c, false);
		bool d;

		if (!st)
			fail_msg("STATS failed while draining");
		d = json_is_true(json_object_get(st, "draining"));
		json_decref(st);
		if (d)
			return;
		if (gpud_it_now() > deadline)
			fail_msg("stats never said draining after SIGTERM");
		usleep(5000);
	}
}

static void test_sigterm_drains(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 2048, \"shutdown_deadline_ms\": 120000",
	};
	struct proto_client *c;
	struct proto_client_result res;
	struct ends e = { .pending = 0 };
	char err[SW_ERR_MAX] = "";
	int rc;

	pthread_mutex_init(&e.mu, NULL);
	pthread_cond_init(&e.cv, NULL);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(c = gpud_it_connect(&f->d[0]));
	submit_long(c, &e, 8, 400);
	kill(f->d[0].pid, SIGTERM);
	wait_draining(c);
	/* new work is refused while draining */
	{
		struct proto_segment seg = { .text = ONCE, .len = sizeof(ONCE) - 1 };
		struct proto_submit_req req = { .n_segments = 1, .segments = &seg,
						.max_tokens = 4 };

		proto_sampling_default(&req.sampling);
		memset(&res, 0, sizeof(res));
		rc = proto_client_generate(c, &req, &res, err, sizeof(err));
		proto_client_result_free(&res);
		printf("    submit while draining -> %s: %s\n", sw_errname(rc), err);
		assert_int_equal(rc, SW_ECLOSED);
	}
	if (wait_ends(&e, 300))
		fail_msg("requests in flight at SIGTERM did not end");
	printf("    SIGTERM with 8 requests in flight: %d completed, %d failed\n", e.ok,
	       e.failed);
	for (int i = 0; i < e.failed && i < 64; i++)
		printf("      failed: %s: %s\n", sw_errname(e.codes[i]), e.msg[i]);
	assert_int_equal(e.ok, 8);
	rc = gpud_it_wait_exit(&f->d[0], 60000);
	if (rc != 0)
		fail_msg("gpud exit status %d after draining (expected 0)", rc);
	proto_client_close(c);
	pthread_cond_destroy(&e.cv);
	pthread_mutex_destroy(&e.mu);
	f->done = true;
}

static void test_sigterm_deadline(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = {
		.gpud_extra = "\"kv_blocks\": 4096, \"shutdown_deadline_ms\": 20",
	};
	struct proto_client *c;
	struct ends e = { .pending = 0 };
	int rc, closed = 0;

	pthread_mutex_init(&e.mu, NULL);
	pthread_cond_init(&e.cv, NULL);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(c = gpud_it_connect(&f->d[0]));
	/* far more work than 20 ms: 32 x (600 prompt + 1000 generated) */
	submit_long(c, &e, 32, 1000);
	kill(f->d[0].pid, SIGTERM);
	rc = gpud_it_wait_exit(&f->d[0], 60000);
	if (wait_ends(&e, 60))
		fail_msg("requests did not all end after the daemon exited");
	printf("    SIGTERM, 20 ms deadline, 32 requests: %d completed, %d failed; exit %d\n",
	       e.ok, e.failed, rc);
	for (int i = 0; i < e.failed && i < 64; i++) {
		if (i < 4)
			printf("      failed: %s: %s\n", sw_errname(e.codes[i]), e.msg[i]);
		/* the client library's own message when the socket broke
		 * before gpud's error frame arrived */
		closed += e.codes[i] == SW_ECLOSED && strstr(e.msg[i], "connection to gpud") != NULL;
	}
	if (rc != 0)
		fail_msg("gpud exit status %d after the deadline (expected 0)", rc);
	assert_int_equal(e.ok + e.failed, 32);
	assert_true(e.failed > 0);
	if (closed)
		fail_msg("%d request(s) got no error frame from gpud before it exited (the "
			 "connection broke under them)", closed);
	proto_client_close(c);
	pthread_cond_destroy(&e.cv);
	pthread_mutex_destroy(&e.mu);
	f->done = true;
}

/* --- refusals --------------------------------------------------------------- */

/* Replaces the first occurrence of from with to in a small file. */
static int replace_in_file(const char *path, const char *from, const char *to)
{
	char buf[16384], out[16384 + 512];
	FILE *f = fopen(path, "r");
	size_t n;
	char *hit;

	if (!f)
		return -errno;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	hit = strstr(buf, from);
	if (!hit || strlen(to) > 500)
		return -EINVAL;
	snprintf(out, sizeof(out), "%.*s%s%s", (int)(hit - buf), buf, to, hit + strlen(from));
	f = fopen(path, "w");
	if (!f)
		return -errno;
	fputs(out, f);
	return fclose(f) ? -EIO : 0;
}

static void test_second_daemon_refused(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 256" };
	struct proto_client *c;
	json_t *st;
	int rc;

	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	/* the second one: its own directory and log, the first one's socket */
	assert_int_equal(gpud_it_prepare(&f->d[1], &o), 0);
	assert_int_equal(replace_in_file(f->d[1].config, f->d[1].socket, f->d[0].socket), 0);
	assert_int_equal(gpud_it_spawn(&f->d[1], NULL), 0);
	rc = gpud_it_wait_exit(&f->d[1], 60000);
	gpud_it_print_tail(&f->d[1], "second daemon", 5);
	if (rc != 1)
		fail_msg("the second gpud on a live socket exited %d (expected 1)", rc);
	if (!said(&f->d[1], NULL, f->d[0].socket))
		fail_msg("the second gpud's message does not name the socket %s",
			 f->d[0].socket);
	/* the first one is untouched */
	assert_non_null(c = gpud_it_connect(&f->d[0]));
	assert_non_null(st = gpud_it_stats(c, false));
	json_decref(st);
	proto_client_close(c);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

static void test_bad_model(void **state)
{
	struct gpud_it_fix *f = *state;
	char path[GPUD_IT_PATH_MAX + 32];
	FILE *m;
	int rc;

	/* missing */
	{
		struct gpud_it_opts o = { .model = "/nonexistent/gpud-it/model.gguf",
					  .no_wait = true };

		assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
		rc = gpud_it_wait_exit(&f->d[0], 60000);
		gpud_it_print_tail(&f->d[0], "missing model", 5);
		if (rc != 1)
			fail_msg("gpud with a missing model exited %d (expected 1)", rc);
		assert_true(said(&f->d[0], NULL, "/nonexistent/gpud-it/model.gguf"));
		assert_int_equal(access(f->d[0].socket, F_OK), -1);
	}
	/* corrupt: not a GGUF file */
	{
		struct gpud_it_opts o = { .no_wait = true };

		snprintf(path, sizeof(path), "/tmp/gpud-it-corrupt-%d.gguf", (int)getpid());
		m = fopen(path, "w");
		assert_non_null(m);
		for (int i = 0; i < 4096; i++)
			fputc("GGUF but not really\n"[i % 20], m);
		fclose(m);
		o.model = path;
		rc = gpud_it_start(&f->d[1], &o);
		if (rc == 0)
			rc = gpud_it_wait_exit(&f->d[1], 60000);
		gpud_it_print_tail(&f->d[1], "corrupt model", 5);
		unlink(path);
		if (rc != 1)
			fail_msg("gpud with a corrupt model exited %d (expected 1)", rc);
		assert_true(said(&f->d[1], NULL, path));
		assert_int_equal(access(f->d[1].socket, F_OK), -1);
	}
	f->done = true;
}

static void test_pools_do_not_fit(void **state)
{
	struct gpud_it_fix *f = *state;
	/* 16 Mi blocks of 16 tokens of stories260K KV (20 KiB each) per
	 * device: 320 GiB */
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 16777216", .no_wait = true };
	char out[16384];
	int rc;

	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	rc = check_config(&f->d[0], out, sizeof(out));
	printf("    --check: exit %d: %s", rc, out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(out, "kv_blocks"));
	assert_null(strstr(out, "configuration OK"));

	assert_int_equal(gpud_it_spawn(&f->d[0], NULL), 0);
	rc = gpud_it_wait_exit(&f->d[0], 60000);
	gpud_it_print_tail(&f->d[0], "pools that do not fit", 5);
	if (rc != 1)
		fail_msg("gpud with pools that cannot fit exited %d (expected 1)", rc);
	assert_true(said(&f->d[0], NULL, "kv_blocks"));
	assert_true(said(&f->d[0], NULL, "16777216"));
	assert_true(said(&f->d[0], NULL, "GiB"));
	assert_int_equal(access(f->d[0].socket, F_OK), -1);
	f->done = true;
}

/* --- memory reserved at start --------------------------------------------- */

/* Bytes of the pools STATS lists that start-up backs: every one but the
 * per-connection regions, which are made at accept. */
static uint64_t pool_bytes(struct proto_client *c)
{
	json_t *st = gpud_it_stats(c, false), *pools, *p;
	uint64_t sum = 0;
	size_t i;

	assert_non_null(st);
	pools = json_object_get(st, "pools");
	assert_true(json_array_size(pools) > 0);
	json_array_foreach(pools, i, p) {
		const char *name = json_string_value(json_object_get(p, "name"));
		int64_t cap, unit;

		assert_non_null(name);
		assert_int_equal(gpud_it_jint(p, "capacity", &cap), 0);
		assert_int_equal(gpud_it_jint(p, "unit_bytes", &unit), 0);
		if (!strcmp(name, "server.connections"))
			continue;
		printf("    pool %-20s %10.1f MiB\n", name, (double)(cap * unit) / (1 << 20));
		sum += (uint64_t)(cap * unit);
	}
	json_decref(st);
	return sum;
}

/* n requests of about 300 tokens, every prompt its own (seeded words), so
 * that their blocks fill the prefix cache; waits for them all. */
static void fill_caches(struct proto_client *c, int n)
{
	static const char *const w[] = { "the", "dog", "saw", "a", "big", "red", "ball", "and",
					 "Lily", "was", "happy", "in", "park", "Tim", "sun" };
	struct ends e = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct proto_client_events ev = { .on_done = on_done, .arg = &e };
	static char prompt[4096];
	struct proto_segment seg = { .text = prompt };
	struct proto_submit_req req = { .n_segments = 1, .segments = &seg, .max_tokens = 2 };
	char err[SW_ERR_MAX];
	uint64_t x = 88172645463325252ull;

	proto_sampling_default(&req.sampling);
	for (int i = 0; i < n; i++) {
		size_t len = 0;

		for (int k = 0; k < 300; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
			len += (size_t)snprintf(prompt + len, sizeof(prompt) - len, "%s%s",
						k ? " " : "", w[x % 15]);
		}
		seg.len = (uint32_t)len;
		pthread_mutex_lock(&e.mu);
		e.pending++;
		pthread_mutex_unlock(&e.mu);
		if (proto_client_submit(c, &req, &ev, NULL, err, sizeof(err)))
			fail_msg("submit %d: %s", i, err);
		if (i % 16 == 15 && wait_ends(&e, 120) != 0)
			fail_msg("requests did not finish");
	}
	if (wait_ends(&e, 120) != 0)
		fail_msg("requests did not finish");
	if (e.failed)
		fail_msg("%d of %d requests failed: %s", e.failed, n, e.msg[0]);
}

/* The pools are the daemon's from the start (DESIGN §2, common/mem.h):
 * right after start-up its private RSS holds every pool STATS reports
 * (bar the per-connection regions), and requests that fill the prefix
 * and mask caches to far past their first blocks do not make it grow. */
static void test_rss_is_the_plan(void **state)
{
	struct gpud_it_fix *f = *state;
	/* 4096 blocks of stories260K KV (20 KiB each): 80 MiB per device */
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 4096" };
	struct sw_mem_rss r0, r1;
	struct proto_client *c;
	uint64_t pools, slack;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	printf("    a sanitizer's shadow memory is private RSS too: skipped\n");
	f->done = true;
	return;
#endif
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_non_null(c = gpud_it_connect(&f->d[0]));
	pools = pool_bytes(c);
	assert_int_equal(sw_mem_rss(f->d[0].pid, &r0), 0);
	printf("    pools %.1f MiB; after start-up RSS %.1f MiB, private %.1f MiB\n",
	       (double)pools / (1 << 20), (double)r0.rss / (1 << 20), (double)r0.anon / (1 << 20));
	if (r0.anon < pools)
		fail_msg("private RSS %" PRIu64 " bytes right after start-up, less than the %" PRIu64
			 " bytes of pools reserved: pools not backed", r0.anon, pools);

	fill_caches(c, 256); /* 256 x ~300 tokens: ~4800 blocks over the two devices */
	assert_int_equal(sw_mem_rss(f->d[0].pid, &r1), 0);
	printf("    after 256 requests: RSS %.1f MiB, private %.1f MiB\n",
	       (double)r1.rss / (1 << 20), (double)r1.anon / (1 << 20));
	/* what is not pooled (libuv's buffers, a thread's malloc arena) may
	 * take a few pages: 4 MiB. Unbacked pools would add tens of MiB. */
	slack = 4u << 20;
	if (r1.anon > r0.anon + slack)
		fail_msg("private RSS grew by %.1f MiB while the caches filled (at most %.1f)",
			 (double)(r1.anon - r0.anon) / (1 << 20), (double)slack / (1 << 20));
	proto_client_close(c);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

/* A pool the machine cannot give: with 1 GiB of address space (RLIMIT_AS,
 * as a container or `ulimit -v` sets it) and 2 GiB of KV, `gpud serve`
 * exits 1 at start-up naming the pool and its size, while --check, which
 * reserves nothing, says the configuration is OK. RLIMIT_AS refuses the
 * reservation itself; the kernel refusing to back a reservation (a memory
 * cgroup, a machine out of memory) takes the same path out
 * (common/mem.h), which only those conditions can show. */
static void test_pool_refused_at_start(void **state)
{
	struct gpud_it_fix *f = *state;
	/* 104858 blocks of 20 KiB: 2.0 GiB of KV on one device */
	struct gpud_it_opts o = { .devices = "[\"cpu\"]", .gpud_extra = "\"kv_blocks\": 104858" };
	const char *check[] = { "serve", "--check", "--config", f->d[0].config, NULL };
	const char *serve[] = { "serve", "--config", f->d[0].config, NULL };
	struct rlimit old, lim;
	char out[16384], out2[16384];
	int rc_check, rc_serve;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	printf("    a sanitizer maps terabytes of shadow: skipped\n");
	f->done = true;
	return;
#endif
	if (getenv("SWARM_UNDER_VALGRIND")) {
		printf("    under valgrind: skipped\n");
		f->done = true;
		return;
	}
	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	/* The limit is inherited by the children; this process only forks and
	 * reads their output meanwhile (no new mapping). */
	assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
	lim = old;
	lim.rlim_cur = 1ull << 30;
	if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < lim.rlim_cur)
		lim.rlim_cur = old.rlim_cur;
	assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
	rc_check = gpud_it_run_cmd(check, out, sizeof(out), 60000);
	rc_serve = gpud_it_run_cmd(serve, out2, sizeof(out2), 60000);
	assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);

	printf("    --check under RLIMIT_AS 1 GiB: exit %d\n", rc_check);
	if (rc_check != 0 || !strstr(out, "configuration OK"))
		fail_msg("--check under RLIMIT_AS exited %d:\n%s", rc_check, out);
	assert_non_null(strstr(out, "2.0 GiB"));
	printf("    gpud serve under RLIMIT_AS 1 GiB: exit %d\n", rc_serve);
	if (rc_serve != 1)
		fail_msg("gpud serve under RLIMIT_AS exited %d (expected 1):\n%s", rc_serve, out2);
	assert_true(said(&f->d[0], out2, "cpu0: engine: cpu backend: cannot reserve"));
	assert_true(said(&f->d[0], out2, "(2048.0 MiB) of KV storage"));
	assert_false(said(&f->d[0], out2, "listening on"));
	assert_int_equal(access(f->d[0].socket, F_OK), -1);
	f->done = true;
}

/* For the gpud.min_devices tests: d serves on cpu0 and cpu2 with the
 * device named gone (cuda1 or cpu1) left out. n requests complete, STATS
 * lists the two devices, each having run (its warm-up at least), their
 * pools and not gone's, and gone in left_out with an error holding why.
 * SIGTERM then ends d with 0. */
static void serves_without(struct gpud_it *d, int n, const char *gone, const char *why)
{
	struct ends e = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	static const char *const serving[] = { "cpu0", "cpu2" };
	char key[64];
	struct proto_client *c;
	const char *err;
	json_t *st;
	int64_t steps;

	assert_true(said(d, NULL, "(2 of the 3 configured devices; 1 left out: STATS left_out)"));
	assert_non_null(c = gpud_it_connect(d));
	submit_long(c, &e, n, 8);
	assert_int_equal(wait_ends(&e, 120), 0);
	assert_int_equal(e.ok, n);
	assert_non_null(st = gpud_it_stats(c, false));
	assert_int_equal(json_array_size(gpud_it_jget(st, "devices")), 2);
	for (int i = 0; i < 2; i++) {
		snprintf(key, sizeof(key), "devices[%d].name", i);
		assert_string_equal(json_string_value(gpud_it_jget(st, key)), serving[i]);
		snprintf(key, sizeof(key), "devices[%d].steps", i);
		assert_int_equal(gpud_it_jint(st, key, &steps), 0);
		assert_true(steps > 0);
		snprintf(key, sizeof(key), "%s.kv", serving[i]);
		assert_non_null(gpud_it_named(gpud_it_jget(st, "pools"), key));
	}
	snprintf(key, sizeof(key), "%s.kv", gone);
	assert_null(gpud_it_named(gpud_it_jget(st, "pools"), key));
	assert_int_equal(json_array_size(gpud_it_jget(st, "left_out")), 1);
	assert_string_equal(json_string_value(gpud_it_jget(st, "left_out[0].name")), gone);
	err = json_string_value(gpud_it_jget(st, "left_out[0].error"));
	assert_non_null(err);
	assert_non_null(strstr(err, why));
	printf("    left out: %s: %s\n", gone, err);
	json_decref(st);
	proto_client_close(c);
	assert_int_equal(gpud_it_stop(d, SIGTERM, 60000), 0);
}

/* For the gpud.min_devices tests: d with o (GPUD_TEST_FAIL_ENGINE=fail
 * unless NULL) refuses to start: exit 1, its log saying said1 and said2. */
static void refused(struct gpud_it *d, const struct gpud_it_opts *o, const char *fail,
		    const char *said1, const char *said2)
{
	int rc;

	if (fail)
		setenv("GPUD_TEST_FAIL_ENGINE", fail, 1);
	rc = gpud_it_prepare(d, o);
	if (!rc)
		rc = gpud_it_spawn(d, NULL);
	unsetenv("GPUD_TEST_FAIL_ENGINE");
	assert_int_equal(rc, 0);
	rc = gpud_it_wait_exit(d, 60000);
	gpud_it_print_tail(d, "refused", 3);
	if (rc != 1)
		fail_msg("gpud exited %d (expected 1, refusing to start)", rc);
	assert_true(said(d, NULL, said1));
	assert_true(!said2 || said(d, NULL, said2));
	assert_false(said(d, NULL, "listening on"));
	gpud_it_free(d);
}

/* gpud.min_devices: "cuda:255" is on no machine. With min_devices 2 of
 * ["cpu", "cuda:255", "cpu"] gpud starts on cpu0 and cpu2 (the names keep
 * their configured places), STATS lists cuda1 in left_out with the
 * reason, and requests complete; with min_devices 3 the start is refused
 * with exit 1, the reason and the count. A build without the CUDA
 * backend refuses the device in both cases (a build no device can fix). */
static void test_min_devices(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .devices = "[\"cpu\", \"cuda:255\", \"cpu\"]",
				  .gpud_extra = "\"kv_blocks\": 256, \"min_devices\": 2" };
	struct gpud_it_opts strict = { .devices = o.devices,
				       .gpud_extra = "\"kv_blocks\": 256, \"min_devices\": 3" };

#if !SW_HAVE_CUDA
	refused(&f->d[0], &o, NULL, "this gpud was built without the CUDA backend", NULL);
	printf("    no CUDA backend in this build: cuda:255 refused, not left out\n");
	f->done = true;
	return;
#endif
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	assert_true(said(&f->d[0], NULL, "cuda1 (cuda:255) left out, gpud starts without it "
					 "(gpud.min_devices 2, 2 devices left): gpud.devices[1]: "
					 "cuda:255: no CUDA device ("));
	serves_without(&f->d[0], 4, "cuda1", "gpud.devices[1]: cuda:255: no CUDA device (");
	refused(&f->d[1], &strict, NULL, "gpud.devices[1]: cuda:255: no CUDA device (",
		"gpud.min_devices 3: 1 of the 3 configured devices cannot start");
	f->done = true;
}

/* gpud.min_devices when an engine fails (GPUD_TEST_FAIL_ENGINE, as a
 * GPU's does when its memory is gone): of three cpu devices the second's
 * engine fails; with min_devices 2 the other two are built beside it,
 * the device list closes up behind it (cpu2 keeps its name), both serve
 * and SIGTERM ends gpud with 0; with min_devices 3 the start fails. A
 * malformed value refuses to start. Suite "threads": ThreadSanitizer
 * runs this too (the engines are built on threads of their own). */
static void test_min_devices_engine(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .devices = "[\"cpu\", \"cpu\", \"cpu\"]", .threads = 3,
				  .gpud_extra = "\"kv_blocks\": 256, \"min_devices\": 2" };
	struct gpud_it_opts strict = { .devices = o.devices, .threads = 3,
				       .gpud_extra = "\"kv_blocks\": 256, \"min_devices\": 3" };
	int rc;

	setenv("GPUD_TEST_FAIL_ENGINE", "1", 1);
	rc = gpud_it_start(&f->d[0], &o);
	unsetenv("GPUD_TEST_FAIL_ENGINE");
	assert_int_equal(rc, 0);
	assert_true(said(&f->d[0], NULL, "cpu1 (cpu) left out, gpud starts without it "
					 "(gpud.min_devices 2, 2 devices left): GPUD_TEST_FAIL_ENGINE: "
					 "cpu1's engine fails on purpose"));
	serves_without(&f->d[0], 6, "cpu1", "cpu1's engine fails on purpose");
	refused(&f->d[1], &strict, "1", "cpu1: engine: GPUD_TEST_FAIL_ENGINE",
		"gpud.min_devices 3: 1 of the 3 configured devices cannot start");
	refused(&f->d[1], &o, "3", "GPUD_TEST_FAIL_ENGINE: \"3\" is not a position in "
		"gpud.devices (0 to 2)", NULL);
	f->done = true;
}

/* A model whose rows no K-quant block fits, as Qwen2.5-0.5B's Q4_K_M file
 * (rows of 896): dim 160, where llama.cpp's recipe writes Q5_0 and Q8_0,
 * and ffn_down's rows of 512 in Q4_K/Q6_K. gpud serves it on a cpu device
 * (packed: the kernels' own layout) with no allocation after warm-up and
 * exits 0 on SIGTERM; the same file with one Q5_0 block's d made NaN is
 * refused at start, the tensor, block and row named. */
static void test_fallback_model(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_mkmodel_params p;
	struct gpud_gguf *g;
	struct proto_client *c;
	char path[64], err[SW_ERR_MAX] = "";
	long at;
	int rc;

	snprintf(path, sizeof(path), "/tmp/gpud-it-q4km-%d.gguf", (int)getpid());
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.dim = 160;
	p.ffn_dim = 512;
	p.n_ctx = 512;
	p.seed = 11;
	assert_int_equal(gpud_mkmodel_parse_type("q4_k_m", &p.type, &p.mix), 0);
	if (gpud_mkmodel(&p, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	assert_int_equal(gpud_gguf_open(&g, path, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_find_tensor(g, "blk.1.ffn_up.weight")->type, GPUD_TYPE_Q5_0);
	/* layer 1 of 2 gets the recipe's more bits: Q6_K, or Q8_0 where 160 */
	assert_int_equal(gpud_gguf_find_tensor(g, "blk.0.attn_v.weight")->type, GPUD_TYPE_Q5_0);
	assert_int_equal(gpud_gguf_find_tensor(g, "blk.1.attn_v.weight")->type, GPUD_TYPE_Q8_0);
	assert_int_equal(gpud_gguf_find_tensor(g, "blk.0.ffn_down.weight")->type, GPUD_TYPE_Q4_K);
	assert_int_equal(gpud_gguf_find_tensor(g, "blk.1.ffn_down.weight")->type, GPUD_TYPE_Q6_K);
	assert_int_equal(gpud_gguf_find_tensor(g, "output.weight")->type, GPUD_TYPE_Q8_0);
	/* block 5 of blk.1.ffn_up: row 1's first (5 blocks a row) */
	at = (long)gpud_gguf_data_offset(g) +
	     (long)gpud_gguf_find_tensor(g, "blk.1.ffn_up.weight")->offset +
	     5 * (long)sizeof(struct gpud_block_q5_0);
	gpud_gguf_close(g);
	{
		struct gpud_it_opts o = { .model = path, .devices = "[\"cpu\"]",
					  .gpud_extra = "\"kv_blocks\": 256" };
		int64_t host = -1;
		json_t *st;

		assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
		assert_non_null(c = gpud_it_connect(&f->d[0]));
		for (int i = 0; i < 4; i++) {
			struct proto_segment seg = { .text = ONCE, .len = sizeof(ONCE) - 1 };
			struct proto_submit_req req = { .n_segments = 1, .segments = &seg,
							.max_tokens = 8 };
			struct proto_client_result res = { 0 };

			proto_sampling_default(&req.sampling);
			rc = proto_client_generate(c, &req, &res, err, sizeof(err));
			if (rc)
				fail_msg("request %d: %s: %s", i, sw_errname(rc), err);
			assert_true(res.n_ids > 0);
			proto_client_result_free(&res);
		}
		assert_non_null(st = gpud_it_stats(c, false));
		assert_int_equal(gpud_it_jint(st, "alloc.since_warmup.host", &host), 0);
		assert_int_equal(host, 0);
		json_decref(st);
		proto_client_close(c);
		rc = gpud_it_stop(&f->d[0], SIGTERM, 60000);
		if (rc != 0)
			fail_msg("gpud exit status %d (expected 0)", rc);
		printf("    dim-160 Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K): 4 requests, 0 host "
		       "allocations since warm-up\n");
	}
	{
		struct gpud_it_opts o = { .model = path, .devices = "[\"cpu\"]",
					  .gpud_extra = "\"kv_blocks\": 256", .no_wait = true };
		const uint16_t nan = 0x7e00;
		FILE *m = fopen(path, "r+b");

		assert_non_null(m);
		assert_int_equal(fseek(m, at, SEEK_SET), 0);
		assert_int_equal(fwrite(&nan, 2, 1, m), 1);
		fclose(m);
		assert_int_equal(gpud_it_start(&f->d[1], &o), 0);
		rc = gpud_it_wait_exit(&f->d[1], 60000);
		gpud_it_print_tail(&f->d[1], "a NaN d in a q5_0 block", 3);
		if (rc != 1)
			fail_msg("gpud with a NaN q5_0 scale exited %d (expected 1)", rc);
		assert_true(said(&f->d[1], NULL,
				 "tensor 'blk.1.ffn_up.weight': q5_0 block 5 (row 1) has a non-finite d 0x7e00"));
	}
	unlink(path);
	f->done = true;
}

/* Greedy ids of ONCE (8 tokens) from gpud serving model on cpu, in d. */
static void greedy_ids(struct gpud_it *d, const char *model, int32_t *ids, uint32_t *n)
{
	struct gpud_it_opts o = { .model = model, .devices = "[\"cpu\"]",
				  .gpud_extra = "\"kv_blocks\": 256" };
	struct proto_segment seg = { .text = ONCE, .len = sizeof(ONCE) - 1 };
	struct proto_submit_req req = { .n_segments = 1, .segments = &seg, .max_tokens = 8 };
	struct proto_client_result res = { 0 };
	struct proto_client *c;
	char err[SW_ERR_MAX] = "";
	int rc;

	assert_int_equal(gpud_it_start(d, &o), 0);
	assert_non_null(c = gpud_it_connect(d));
	proto_sampling_default(&req.sampling);
	req.sampling.temperature = 0;
	rc = proto_client_generate(c, &req, &res, err, sizeof(err));
	if (rc)
		fail_msg("%s: %s: %s", model, sw_errname(rc), err);
	assert_true(res.n_ids > 0 && res.n_ids <= 8);
	memcpy(ids, res.ids, res.n_ids * sizeof(*ids));
	*n = res.n_ids;
	proto_client_result_free(&res);
	proto_client_close(c);
	assert_int_equal(gpud_it_stop(d, SIGTERM, 60000), 0);
}

/* `gpud quantize` as an operator runs it: an F32 model into Q4_K_M (rows
 * of 160: the K-quants' fallbacks too) exits 0 and says what it did, and
 * gpud serves the result with the greedy ids of mkmodel's own Q4_K_M file
 * of the same weights (the same floats quantized: the same tensors); usage errors exit 2, a
 * requantization not allowed, a missing model and the model as its own
 * output exit 1 with the reason, leaving no file. */
static void test_quantize_cli(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_mkmodel_params p;
	char src[64], want[64], q[64], q8[64], err[SW_ERR_MAX] = "", out[4096];
	int32_t a[8], b[8];
	uint32_t na, nb;
	int rc;

	snprintf(src, sizeof(src), "/tmp/gpud-it-qf32-%d.gguf", (int)getpid());
	snprintf(want, sizeof(want), "/tmp/gpud-it-qwant-%d.gguf", (int)getpid());
	snprintf(q, sizeof(q), "/tmp/gpud-it-q-%d.gguf", (int)getpid());
	snprintf(q8, sizeof(q8), "/tmp/gpud-it-q8-%d.gguf", (int)getpid());
	gpud_mkmodel_params_default(&p);
	p.dim = 160;
	p.ffn_dim = 512;
	p.n_ctx = 512;
	p.seed = 5;
	p.out = src;
	p.type = GPUD_TYPE_F32;
	if (gpud_mkmodel(&p, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	p.out = want;
	assert_int_equal(gpud_mkmodel_parse_type("q4_k_m", &p.type, &p.mix), 0);
	if (gpud_mkmodel(&p, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	{
		const char *args[] = { "quantize", "--model", src, "--out", q, "--type", "q4_k_m",
				       NULL };

		rc = gpud_it_run_cmd(args, out, sizeof(out), 60000);
		if (rc)
			fail_msg("gpud quantize exited %d: %s", rc, out);
		assert_non_null(strstr(out, "converted"));
	}
	greedy_ids(&f->d[0], q, a, &na);
	greedy_ids(&f->d[1], want, b, &nb);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, na * sizeof(*a));
	{
		const char *no_type[] = { "quantize", "--model", src, "--out", q8, NULL };
		const char *bad_type[] = { "quantize", "--model", src, "--out", q8, "--type", "q9",
					   NULL };
		const char *requant[] = { "quantize", "--model", q, "--out", q8, "--type", "q8_0",
					  NULL };
		const char *missing[] = { "quantize", "--model", "/nonexistent.gguf", "--out", q8,
					  "--type", "q8_0", NULL };
		const char *self[] = { "quantize", "--model", src, "--out", src, "--type", "q8_0",
				       NULL };

		assert_int_equal(gpud_it_run_cmd(no_type, out, sizeof(out), 60000), 2);
		assert_int_equal(gpud_it_run_cmd(bad_type, out, sizeof(out), 60000), 2);
		assert_non_null(strstr(out, "unknown type"));
		assert_int_equal(gpud_it_run_cmd(requant, out, sizeof(out), 60000), 1);
		assert_non_null(strstr(out, "--allow-requantize"));
		assert_int_equal(gpud_it_run_cmd(missing, out, sizeof(out), 60000), 1);
		assert_non_null(strstr(out, "/nonexistent.gguf"));
		assert_int_equal(gpud_it_run_cmd(self, out, sizeof(out), 60000), 1);
		assert_non_null(strstr(out, "another file"));
		assert_int_equal(access(q8, F_OK), -1);
	}
	printf("    gpud quantize f32 -> q4_k_m: served, the greedy ids of mkmodel's q4_k_m "
	       "(%u tokens); usage errors 2, refusals 1\n", na);
	unlink(src);
	unlink(want);
	unlink(q);
	f->done = true;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		GPUD_IT_FIX_TEST(test_check_ok),
		GPUD_IT_FIX_TEST(test_check_bad),
		GPUD_IT_FIX_TEST(test_socket_mode),
		GPUD_IT_FIX_TEST(test_sigterm_drains),
		GPUD_IT_FIX_TEST(test_sigterm_deadline),
		GPUD_IT_FIX_TEST(test_second_daemon_refused),
		GPUD_IT_FIX_TEST(test_bad_model),
		GPUD_IT_FIX_TEST(test_pools_do_not_fit),
		GPUD_IT_FIX_TEST(test_dumps_bounded),
		GPUD_IT_FIX_TEST(test_rss_is_the_plan),
		GPUD_IT_FIX_TEST(test_pool_refused_at_start),
		GPUD_IT_FIX_TEST(test_min_devices),
		GPUD_IT_FIX_TEST(test_min_devices_engine),
		GPUD_IT_FIX_TEST(test_fallback_model),
		GPUD_IT_FIX_TEST(test_quantize_cli),
	};

	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
