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

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "common/time.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

static struct at_redis srv;

static redisReply *cmd(struct at_agentd *f, const char *fmt, ...)
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

static long long xlen(struct at_agentd *f, const char *stream)
{
	redisReply *r = cmd(f, "XLEN %s", stream);
	long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;

	freeReplyObject(r);
	return v;
}

static void maxmemory(struct at_agentd *f, const char *bytes)
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

static int setup(void **state)
{
	struct at_agentd *f = at_agentd_new("bound", srv.host, srv.port);

	if (!f)
		return -1;
	maxmemory(f, "0");
	freeReplyObject(cmd(f, "FLUSHALL"));
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	at_agentd_free(*state, "CONFIG SET maxmemory 0");
	return 0;
}

/* The configuration agentd and swarmctl read (external mode). */
static void write_config(struct at_agentd *f, const char *agentd)
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

/* Every worker was spawned once and never crashed. */
static void assert_no_restart(struct at_agentd *f, int n)
{
	struct at_worker w[AT_MAX_WORKERS];

	assert_int_equal(at_agentd_workers(f, w, NULL, 0), n);
	for (int i = 0; i < n; i++) {
		assert_int_equal(w[i].spawns, 1);
		assert_int_equal(w[i].crashes, 0);
	}
}

static void test_sigusr1_reopens_every_log(void **state)
{
	struct at_agentd *f = *state;
	char old[300];

	write_config(f, "\"workers\": 2");
	at_agentd_start(f, "config/sql");
	/* The status file is written once the supervisor handles signals. */
	for (int t = 0; t < 10000 && access(f->status, F_OK) != 0; t += 10)
		sw_sleep_ms(10);
	assert_int_equal(access(f->status, F_OK), 0);
	/* Most likely before the workers' first beats: deferred, not fatal. */
	kill(f->sup, SIGUSR1);
	assert_true(at_agentd_wait_running(f, 2, NULL, 20000));
	assert_true(at_wait_lines(f->log, 1, "SIGUSR1: log reopened", NULL, 20000));

	/* logrotate: rename, then signal. */
	snprintf(old, sizeof(old), "%s.1", f->log);
	assert_int_equal(rename(f->log, old), 0);
	kill(f->sup, SIGUSR1);
	assert_true(at_wait_lines(f->log, 1, "SIGUSR1: log reopened; forwarded to 2 workers", NULL,
				  20000));
	/* Work for the workers (malformed: no gpud needed), each logs. */
	for (int i = 0; i < 6; i++)
		freeReplyObject(cmd(f, "XADD swarm:tasks * task {broken-%d", i));
	assert_true(at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'failed'", 6,
				  20000, 50));
	at_agentd_stop(f);

	/* Every worker's last words (the drain) and the task warnings are in
	 * the new file; the old one got nothing after the rename. */
	assert_int_equal(at_count_lines(f->log, "agentd-worker[", "drained"), 2);
	assert_int_equal(at_count_lines(f->log, "agentd-worker[", "invalid JSON"),
			 6);
	assert_int_equal(at_count_lines(f->log, "agentd[", "supervisor: exit 0"),
			 1);
	assert_int_equal(at_count_lines(old, "invalid JSON", NULL), 0);
	assert_int_equal(at_count_lines(old, "drained", NULL), 0);
	assert_int_equal(at_count_lines(old, "SIGUSR1", NULL), 1); /* the first one */
	assert_no_restart(f, 2);
}

/* One entry pending for a consumer that died with it after max_attempts
 * deliveries: the next claim dead-letters it without running it. */
static void add_exhausted(struct at_agentd *f, int deliveries)
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

static int swarmctl(struct at_agentd *f, const char *args, char *out, size_t cap);

static void test_agentd_at_maxmemory(void **state)
{
	struct at_agentd *f = *state;

	write_config(f, "\"workers\": 2, \"max_attempts\": 3, \"lease_ms\": 1000");
	freeReplyObject(cmd(f, "XGROUP CREATE swarm:tasks agents 0 MKSTREAM"));
	add_exhausted(f, 3);
	for (int i = 0; i < 3; i++)
		freeReplyObject(cmd(f, "XADD swarm:tasks * task {broken-%d", i));
	maxmemory(f, "1"); /* full: every write that needs memory is refused */

	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 2, NULL, 20000));
	/* Each worker's first claim: one takes the exhausted entry (idle
	 * entries come first), the other the first broken one. Both outcomes
	 * are recorded; then each worker waits, holding its task, for Redis
	 * to take what it owes. */
	assert_true(at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'dead'", 1,
				  20000, 50));
	assert_true(at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'failed'", 1,
				  20000, 50));
	assert_true(at_wait_lines(f->log, 2, "OOM command not allowed", "maxmemory", 20000));
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
	assert_int_equal(at_count_lines(f->log, "evicts keys", NULL), 0);

	maxmemory(f, "0");
	for (int t = 0; t < 20000 && (xlen(f, "swarm:results") < 4 || xlen(f, "swarm:dead") < 1 ||
				      xlen(f, "swarm:tasks") > 0);
	     t += 50)
		sw_sleep_ms(50);
	assert_int_equal(xlen(f, "swarm:results"), 4);
	assert_int_equal(xlen(f, "swarm:dead"), 1);
	assert_int_equal(xlen(f, "swarm:tasks"), 0);
	assert_int_equal(at_redis_pending(f->redis, "swarm:tasks"), 0);
	assert_true(at_wait_lines(f->log, 1, "servers reachable again", NULL, 20000));
	at_agentd_stop(f);
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
static int swarmctl(struct at_agentd *f, const char *args, char *out, size_t cap)
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
	struct at_agentd *f = *state;
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
