/* agentd_bound_test.c - what keeps a long-running swarm bounded (issue
 * 11), with the real `agentd` and `swarmctl` binaries against a private
 * Redis (whose maxmemory the tests set) and the test PostgreSQL; no gpud
 * (the tasks are ones a worker settles without it):
 *   - logs: SIGUSR1 to the supervisor right after start (workers not yet
 *     beating get it at their first heartbeat, and none dies of it), then
 *     again after logrotate's rename: the supervisor and every worker
 *     write to the new file, nothing more to the old one;
 *   - Redis at maxmemory: agentd started on a full Redis finds its group,
 *     records the outcomes in PostgreSQL, acknowledges (which deletes the
 *     entries and frees memory) though the events are refused, keeps a
 *     dead-letter pending until Redis takes it, crashes no worker and
 *     counts no extra delivery; once Redis has room every event and the
 *     dead letter arrive and swarm:tasks is empty; `swarmctl status`
 *     counts the dead task from PostgreSQL once swarm:dead's cap dropped
 *     its entry;
 *   - `swarmctl submit` on a full Redis says so plainly, queues nothing
 *     and exits 1; the same submit works once Redis has room.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <libpq-fe.h>

#include "common/time.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

static struct at_redis srv;

struct fx {
	char dir[64];
	char dbname[64];
	char pg_url[1024];
	char config[256], status[256], log[256], out[256];
	redisContext *redis;
	PGconn *pg;
	pid_t sup;
};

static redisReply *cmd(struct fx *f, const char *fmt, ...)
{
	va_list ap;
	redisReply *r;

	va_start(ap, fmt);
	r = redisvCommand(f->redis, fmt, ap);
	va_end(ap);
	if (!r)
		fail_msg("redis: %s", f->redis->errstr);
	return r;
}

static long long xlen(struct fx *f, const char *stream)
{
	redisReply *r = cmd(f, "XLEN %s", stream);
	long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;

	freeReplyObject(r);
	return v;
}

static void maxmemory(struct fx *f, const char *bytes)
{
	redisReply *r = cmd(f, "CONFIG SET maxmemory %s", bytes);

	assert_int_equal(r->type, REDIS_REPLY_STATUS);
	freeReplyObject(r);
}

static int group_setup(void **state)
{
	(void)state;
	if (at_redis_start(&srv, "/tmp/agentd-bound-redis-XXXXXX") != 0) {
		fprintf(stderr, "cannot start a private Redis\n");
		at_redis_stop(&srv);
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	at_redis_stop(&srv);
	return 0;
}

static int counter;

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	snprintf(f->dir, sizeof(f->dir), "/tmp/agentd-bound-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->dbname, sizeof(f->dbname), "agentd_bound_%d_%d", (int)getpid(), counter++);
	at_db_create(f->dbname, f->pg_url, sizeof(f->pg_url));
	f->pg = PQconnectdb(f->pg_url);
	f->redis = redisConnect(srv.host, srv.port);
	if (!f->redis || f->redis->err)
		return -1;
	maxmemory(f, "0");
	freeReplyObject(cmd(f, "FLUSHALL"));
	snprintf(f->config, sizeof(f->config), "%s/swarm.json", f->dir);
	snprintf(f->status, sizeof(f->status), "%s/state/agentd.status.json", f->dir);
	snprintf(f->log, sizeof(f->log), "%s/agentd.log", f->dir);
	snprintf(f->out, sizeof(f->out), "%s/agentd.out", f->dir);
	*state = f;
	return 0;
}

static void print_tail(const char *path, int lines)
{
	char c[512];

	snprintf(c, sizeof(c), "tail -n %d %s | cut -c1-300 >&2", lines, path);
	if (system(c) != 0)
		fprintf(stderr, "(no %s)\n", path);
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char c[128];
	int status;

	if (f->sup > 0) { /* a failed test: take everything down */
		kill(f->sup, SIGKILL);
		waitpid(f->sup, &status, 0);
		print_tail(f->log, 40);
		print_tail(f->out, 10);
	}
	maxmemory(f, "0");
	redisFree(f->redis);
	PQfinish(f->pg);
	at_db_drop(f->dbname);
	snprintf(c, sizeof(c), "rm -rf %s", f->dir);
	if (system(c) != 0)
		fprintf(stderr, "could not remove %s\n", f->dir);
	free(f);
	return 0;
}

/* The configuration agentd and swarmctl read (external mode). */
static void write_config(struct fx *f, const char *agentd)
{
	FILE *fp = fopen(f->config, "w");

	assert_non_null(fp);
	fprintf(fp,
		"{\"state_dir\": \"%s/state\", \"log\": {\"level\": \"info\", \"file\": \"%s\"},"
		" \"redis\": {\"url\": \"%s\"}, \"postgres\": {\"url\": \"%s\"},"
		" \"gpud\": {\"socket\": \"%s/gpud.sock\", \"model\": \"%s/none.gguf\"},"
		" \"agentd\": {\"heartbeat_ms\": 200, \"restart_backoff_min_ms\": 300,"
		" \"restart_backoff_max_ms\": 2000, %s}}\n",
		f->dir, f->log, srv.url, f->pg_url, f->dir, f->dir, agentd);
	fclose(fp);
}

static void start_sup(struct fx *f)
{
	f->sup = fork();
	assert_true(f->sup >= 0);
	if (f->sup == 0) {
		int out = open(f->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(out, 1);
		dup2(out, 2);
		execl(AGENTD_BIN, "agentd", "--config", f->config, "--sql-dir", "config/sql",
		      (char *)NULL);
		_exit(127);
	}
}

/* SIGTERM, then the exit status, which must be 0. */
static void stop_sup(struct fx *f)
{
	int status = -1;

	kill(f->sup, SIGTERM);
	for (int t = 0; t < 30000; t += 50) {
		if (waitpid(f->sup, &status, WNOHANG) == f->sup)
			break;
		sw_sleep_ms(50);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail_msg("agentd: wait status %d", status);
	f->sup = 0;
}

/* The status file's workers, or NULL when it cannot be read yet. */
static json_t *workers(struct fx *f)
{
	json_t *root = json_load_file(f->status, 0, NULL), *w;

	if (!root)
		return NULL;
	w = json_incref(json_object_get(root, "workers"));
	json_decref(root);
	return w;
}

/* Waits until every one of n workers is running; fails after 20 s. */
static void wait_running(struct fx *f, size_t n)
{
	for (int t = 0; t < 20000; t += 50) {
		json_t *ws = workers(f), *w;
		size_t i, running = 0;

		json_array_foreach(ws, i, w)
			running += !strcmp(json_string_value(json_object_get(w, "state")), "running");
		json_decref(ws);
		if (running == n)
			return;
		sw_sleep_ms(50);
	}
	fail_msg("the workers did not all start");
}

/* Every worker was spawned once and never crashed. */
static void assert_no_restart(struct fx *f, size_t n)
{
	json_t *ws = workers(f), *w;
	size_t i;

	assert_non_null(ws);
	assert_int_equal(json_array_size(ws), n);
	json_array_foreach(ws, i, w) {
		assert_int_equal(json_integer_value(json_object_get(w, "spawns")), 1);
		assert_int_equal(json_integer_value(json_object_get(w, "crashes")), 0);
	}
	json_decref(ws);
}

/* Lines of file path containing every one of the NULL-terminated
 * needles. */
static int count_lines(const char *path, ...)
{
	char line[4096];
	int n = 0;
	FILE *fp = fopen(path, "r");

	if (!fp)
		return 0;
	while (fgets(line, sizeof(line), fp)) {
		const char *needle;
		bool all = true;
		va_list ap;

		va_start(ap, path);
		while ((needle = va_arg(ap, const char *)))
			all &= strstr(line, needle) != NULL;
		va_end(ap);
		n += all;
	}
	fclose(fp);
	return n;
}

static bool wait_lines(const char *path, int want, const char *a, const char *b)
{
	for (int t = 0; t < 20000; t += 50) {
		if (count_lines(path, a, b, (const char *)NULL) >= want)
			return true;
		sw_sleep_ms(50);
	}
	return false;
}

static void test_sigusr1_reopens_every_log(void **state)
{
	struct fx *f = *state;
	char old[300];

	write_config(f, "\"workers\": 2");
	start_sup(f);
	/* The status file is written once the supervisor handles signals. */
	for (int t = 0; t < 10000 && access(f->status, F_OK) != 0; t += 10)
		sw_sleep_ms(10);
	assert_int_equal(access(f->status, F_OK), 0);
	/* Most likely before the workers' first beats: deferred, not fatal. */
	kill(f->sup, SIGUSR1);
	wait_running(f, 2);
	assert_true(wait_lines(f->log, 1, "SIGUSR1: log reopened", NULL));

	/* logrotate: rename, then signal. */
	snprintf(old, sizeof(old), "%s.1", f->log);
	assert_int_equal(rename(f->log, old), 0);
	kill(f->sup, SIGUSR1);
	assert_true(wait_lines(f->log, 1, "SIGUSR1: log reopened; forwarded to 2 workers", NULL));
	/* Work for the workers (malformed: no gpud needed), each logs. */
	for (int i = 0; i < 6; i++)
		freeReplyObject(cmd(f, "XADD swarm:tasks * task {broken-%d", i));
	assert_true(at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'failed'", 6,
				  20000, 50));
	stop_sup(f);

	/* Every worker's last words (the drain) and the task warnings are in
	 * the new file; the old one got nothing after the rename. */
	assert_int_equal(count_lines(f->log, "agentd-worker[", "drained", (const char *)NULL), 2);
	assert_int_equal(count_lines(f->log, "agentd-worker[", "invalid JSON", (const char *)NULL),
			 6);
	assert_int_equal(count_lines(f->log, "agentd[", "supervisor: exit 0", (const char *)NULL),
			 1);
	assert_int_equal(count_lines(old, "invalid JSON", (const char *)NULL), 0);
	assert_int_equal(count_lines(old, "drained", (const char *)NULL), 0);
	assert_int_equal(count_lines(old, "SIGUSR1", (const char *)NULL), 1); /* the first one */
	assert_no_restart(f, 2);
}

/* One entry pending for a consumer that died with it after max_attempts
 * deliveries: the next claim dead-letters it without running it. */
static void add_exhausted(struct fx *f, int deliveries)
{
	redisReply *r = cmd(f, "XADD swarm:tasks * task %s",
			    "{\"id\":\"dead-1\",\"kind\":\"summarize\",\"document_id\":1}");
	char id[64];

	assert_int_equal(r->type, REDIS_REPLY_STRING);
	snprintf(id, sizeof(id), "%s", r->str);
	freeReplyObject(r);
	freeReplyObject(cmd(f, "XREADGROUP GROUP agents ghost COUNT 1 STREAMS swarm:tasks >"));
	r = cmd(f, "XCLAIM swarm:tasks agents ghost 0 %s IDLE 600000 RETRYCOUNT %d", id,
		deliveries);
	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_int_equal(r->elements, 1);
	freeReplyObject(r);
}

static int swarmctl(struct fx *f, const char *args, char *out, size_t cap);

static void test_agentd_at_maxmemory(void **state)
{
	struct fx *f = *state;

	write_config(f, "\"workers\": 2, \"max_attempts\": 3, \"lease_ms\": 1000");
	freeReplyObject(cmd(f, "XGROUP CREATE swarm:tasks agents 0 MKSTREAM"));
	add_exhausted(f, 3);
	for (int i = 0; i < 3; i++)
		freeReplyObject(cmd(f, "XADD swarm:tasks * task {broken-%d", i));
	maxmemory(f, "1"); /* full: every write that needs memory is refused */

	start_sup(f);
	wait_running(f, 2);
	/* Each worker's first claim: one takes the exhausted entry (idle
	 * entries come first), the other the first broken one. Both outcomes
	 * are recorded; then each worker waits, holding its task, for Redis
	 * to take what it owes. */
	assert_true(at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'dead'", 1,
				  20000, 50));
	assert_true(at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'failed'", 1,
				  20000, 50));
	assert_true(wait_lines(f->log, 2, "OOM command not allowed", "maxmemory"));
	sw_sleep_ms(1500); /* a few retries (100, 200, 400, 800 ms) */
	/* The failed task's entry left the stream though its event was
	 * refused (the acknowledgement frees memory); the dead one stays
	 * pending until swarm:dead has room; the two others wait. */
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks"), 2);
	assert_int_equal(xlen(f, "swarm:tasks"), 3);
	assert_int_equal(at_redis_pending(f->redis, "swarm:tasks"), 1);
	assert_int_equal(xlen(f, "swarm:results"), 0);
	assert_int_equal(xlen(f, "swarm:dead"), 0);
	assert_no_restart(f, 2);
	assert_int_equal(count_lines(f->log, "evicts keys", (const char *)NULL), 0);

	maxmemory(f, "0");
	for (int t = 0; t < 20000 && (xlen(f, "swarm:results") < 4 || xlen(f, "swarm:dead") < 1 ||
				      xlen(f, "swarm:tasks") > 0);
	     t += 50)
		sw_sleep_ms(50);
	assert_int_equal(xlen(f, "swarm:results"), 4);
	assert_int_equal(xlen(f, "swarm:dead"), 1);
	assert_int_equal(xlen(f, "swarm:tasks"), 0);
	assert_int_equal(at_redis_pending(f->redis, "swarm:tasks"), 0);
	assert_true(wait_lines(f->log, 1, "servers reachable again", NULL));
	stop_sup(f);
	/* Retrying the delivery does not count deliveries. */
	assert_int_equal(at_pg_int(f->pg, "SELECT max(attempts) FROM tasks WHERE status = 'failed'"),
			 1);
	assert_int_equal(at_pg_int(f->pg, "SELECT attempts FROM tasks WHERE id = 'dead-1'"), 1);
	assert_no_restart(f, 2);

	/* swarm:dead is capped: once its cap dropped the entry, swarmctl
	 * still counts the dead task, from PostgreSQL (exit 1: no gpud) */
	{
		char out[8192];

		freeReplyObject(cmd(f, "XTRIM swarm:dead MAXLEN 0"));
		assert_int_equal(swarmctl(f, "status", out, sizeof(out)), 1);
		if (!strstr(out, "1 dead-lettered (0 kept in swarm:dead)"))
			fail_msg("swarmctl status said: %s", out);
		assert_int_equal(swarmctl(f, "status --json", out, sizeof(out)), 1);
		if (!strstr(out, "\"dead\": 1,") || !strstr(out, "\"dead_kept\": 0,"))
			fail_msg("swarmctl status --json said: %s", out);
	}
}

/* Runs `swarmctl --config F args...` with its output in out; returns its
 * exit status. */
static int swarmctl(struct fx *f, const char *args, char *out, size_t cap)
{
	char c[1024];
	size_t n;
	FILE *p;
	int st;

	snprintf(c, sizeof(c), "%s --config %s %s 2>&1", SWARMCTL_BIN, f->config, args);
	p = popen(c, "r");
	assert_non_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_submit_refused_at_maxmemory(void **state)
{
	struct fx *f = *state;
	char doc[300], args[400], out[4096];
	FILE *fp;

	write_config(f, "\"workers\": 1");
	snprintf(doc, sizeof(doc), "%s/notes.txt", f->dir);
	fp = fopen(doc, "w");
	assert_non_null(fp);
	fputs(at_story, fp);
	fclose(fp);
	snprintf(args, sizeof(args), "submit --kind ingest %s", doc);

	maxmemory(f, "1");
	assert_int_equal(swarmctl(f, args, out, sizeof(out)), 1);
	if (!strstr(out, "Redis refused the task: it is at its maxmemory limit (used_memory ") ||
	    !strstr(out, "maxmemory 1B, policy noeviction); nothing was queued"))
		fail_msg("swarmctl said: %s", out);
	assert_null(strstr(out, "queued ingest"));
	assert_int_equal(xlen(f, "swarm:tasks"), 0);

	maxmemory(f, "0");
	assert_int_equal(swarmctl(f, args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "queued ingest"));
	assert_int_equal(xlen(f, "swarm:tasks"), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sigusr1_reopens_every_log, setup, teardown),
		cmocka_unit_test_setup_teardown(test_agentd_at_maxmemory, setup, teardown),
		cmocka_unit_test_setup_teardown(test_submit_refused_at_maxmemory, setup, teardown),
	};
	int rc = it_start(IT_PG);

	if (rc)
		return rc;
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
