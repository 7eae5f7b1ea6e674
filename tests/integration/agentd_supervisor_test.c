/* agentd_supervisor_test.c - `agentd --config FILE` (agentd/supervisor.h)
 * as a process, against real Redis, PostgreSQL + pgvector and one real
 * `gpud serve` (stories260K) shared by the tests:
 *   - N workers kept alive; kill -9 of one: restarted after the backoff,
 *     the others untouched; SIGTERM: exit 0, no worker left;
 *   - a crash loop (a migration that fails: every worker exits 1 at
 *     start): marked failed after crash_limit, supervisor exits 1;
 *   - a hung worker (SIGSTOP): killed and restarted;
 *   - SIGTERM with a summarize task in flight: it finishes or stays
 *     pending, nothing acknowledged unfinished, exit 0;
 *   - recycling after max_tasks_per_worker (exit 0, not a crash);
 *   - the supervisor killed with -9: its workers drain by themselves;
 *   - the backoff doubles on quick crashes and starts over after a
 *     worker ran crash_window_ms;
 *   - a second SIGTERM kills the workers at once (the entry in hand
 *     stays pending);
 *   - usage and configuration errors.
 * The binary uses the default stream names, so the tests use Redis
 * database REDIS_DB (flushed) and a fresh PostgreSQL database each.
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
#include <libpq-fe.h>

#include "common/log.h"
#include "common/time.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/gpud_harness.h"
#include "tests/integration/harness.h"

#define REDIS_DB 5 /* agentd_e2e uses 3 */

static struct gpud_it gpud;

static void redis_cmd(struct at_agentd *f, const char *cmd)
{
	redisReply *r = redisCommand(f->redis, cmd);

	assert_non_null(r);
	freeReplyObject(r);
}

static int group_setup(void **state)
{
	(void)state;
	return gpud_it_start(&gpud, NULL) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	if (gpud.pid)
		gpud_it_stop(&gpud, SIGTERM, 20000);
	gpud_it_free(&gpud);
	return 0;
}

static int setup(void **state)
{
	struct at_agentd *f;
	char sql[128], host[256];
	int port;

	if (it_parse_redis_url(it_redis_url(), host, sizeof(host), &port) != 0)
		return -1;
	f = at_agentd_new("sup", host, port);
	if (!f)
		return -1;
	snprintf(sql, sizeof(sql), "SELECT %d", REDIS_DB);
	redis_cmd(f, sql);
	redis_cmd(f, "FLUSHDB");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	at_agentd_free(*state, "FLUSHDB");
	return 0;
}

/* The agentd members every test sets itself (a key may appear once). */
#define BASE                                                                           \
	"\"lease_ms\": 2000, \"restart_backoff_min_ms\": 300, \"restart_backoff_max_ms\": 2000, " \
	"\"crash_limit\": 3, \"crash_window_ms\": 10000, "

/* agentd members beyond the common ones ("\"workers\": 2, ..."). */
static void write_config(struct at_agentd *f, const char *agentd)
{
	FILE *fp = fopen(f->config, "w");

	assert_non_null(fp);
	fprintf(fp,
		"{\"state_dir\": \"%s/state\", \"log\": {\"level\": \"info\", \"file\": \"%s\"},"
		" \"redis\": {\"url\": \"%s/%d\"}, \"postgres\": {\"url\": \"%s\"},"
		" \"gpud\": {\"socket\": \"%s\"},"
		" \"agentd\": {\"max_attempts\": 3, \"heartbeat_ms\": 200,"
		" %s}}\n",
		f->dir, f->log, it_redis_url(), REDIS_DB, f->pg_url, gpud.socket, agentd);
	fclose(fp);
}

static bool alive(pid_t pid)
{
	char path[64], buf[256];
	FILE *fp;
	char *p;
	bool z = false;

	if (kill(pid, 0) != 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fp = fopen(path, "r");
	if (!fp)
		return false;
	if (fgets(buf, sizeof(buf), fp) && (p = strrchr(buf, ')')) && p[1] == ' ')
		z = p[2] == 'Z' || p[2] == 'X';
	fclose(fp);
	return !z;
}

static bool file_has(const char *path, const char *needle)
{
	return gpud_it_file_has(path, needle);
}

static void xadd(struct at_agentd *f, const char *task)
{
	redisReply *r = redisCommand(f->redis, "XADD swarm:tasks * task %s", task);

	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	freeReplyObject(r);
}

/* --- tests ---------------------------------------------------------------- */

static void test_keeps_n_alive_and_restarts_killed(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS], v[AT_MAX_WORKERS];
	char sup_state[32];
	bool ok;

	write_config(f, BASE "\"workers\": 3");
	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 3, w, 30000));
	for (int i = 0; i < 3; i++) {
		assert_true(alive(w[i].pid));
		assert_int_equal(w[i].spawns, 1);
		assert_int_equal(w[i].crashes, 0);
		assert_string_equal(w[i].activity, "idle"); /* from its first beat */
	}
	assert_int_equal(kill(w[1].pid, SIGKILL), 0);
	ok = false;
	for (int t = 0; t < 20000 && !ok; t += 50) {
		sw_sleep_ms(50);
		ok = at_agentd_workers(f, v, NULL, 0) == 3 && v[1].pid != w[1].pid &&
		     v[1].pid != 0 && strcmp(v[1].state, "running") == 0;
	}
	assert_true(ok);
	assert_int_equal(v[1].spawns, 2);
	assert_int_equal(v[1].crashes, 1);
	assert_string_equal(v[1].last_exit, "signal 9");
	assert_int_equal(v[0].pid, w[0].pid); /* the others untouched */
	assert_int_equal(v[2].pid, w[2].pid);
	assert_int_equal(v[0].crashes + v[2].crashes, 0);
	assert_true(file_has(f->log, "worker 1 (pid"));
	assert_true(file_has(f->log, "signal 9 after"));
	assert_true(file_has(f->log, "restarting in 300 ms"));
	assert_false(alive(w[1].pid));

	at_agentd_stop(f);
	for (int i = 0; i < 3; i++)
		assert_false(alive(v[i].pid));
	assert_int_equal(at_agentd_workers(f, v, sup_state, sizeof(sup_state)), 3);
	assert_string_equal(sup_state, "stopped");
	for (int i = 0; i < 3; i++) {
		assert_string_equal(v[i].state, "stopped");
		assert_int_equal(v[i].pid, 0);
	}
	assert_true(file_has(f->log, "drained: every worker has exited"));
}

static void test_crash_loop_marked_failed(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS];
	char sql_dir[128], path[192], sup_state[32];
	FILE *fp;
	int status;

	/* A migration that always fails: `agentd worker` exits 1 at start. */
	snprintf(sql_dir, sizeof(sql_dir), "%s/sql", f->dir);
	assert_int_equal(mkdir(sql_dir, 0755), 0);
	snprintf(path, sizeof(path), "%s/001_broken.sql", sql_dir);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fprintf(fp, "THIS IS NOT SQL;\n");
	fclose(fp);
	/* backoff 50, 100, then capped at 100; the 4th crash is over the limit */
	write_config(f, "\"lease_ms\": 2000, \"workers\": 2, \"restart_backoff_min_ms\": 50, "
			 "\"restart_backoff_max_ms\": 100, \"crash_limit\": 3, \"crash_window_ms\": 10000");
	at_agentd_start(f, sql_dir);
	status = at_agentd_wait(f, 60000);
	if (status == -1)
		fail_msg("the supervisor did not give up on crash-looping workers");
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 1);
	assert_int_equal(at_agentd_workers(f, w, sup_state, sizeof(sup_state)), 2);
	assert_string_equal(sup_state, "failed");
	for (int i = 0; i < 2; i++) {
		assert_string_equal(w[i].state, "failed");
		assert_int_equal(w[i].crashes, 4); /* more than crash_limit */
		assert_int_equal(w[i].spawns, 4);
		assert_string_equal(w[i].last_exit, "exit 1");
		assert_int_equal(w[i].pid, 0);
	}
	assert_true(file_has(f->log, "marked failed, not restarted"));
	assert_true(file_has(f->log, "restarting in 50 ms"));
	/* one per worker, then doubled and capped */
	assert_int_equal(at_count_lines(f->log, "restarting in 50 ms", NULL), 2);
	assert_int_equal(at_count_lines(f->log, "restarting in 100 ms", NULL), 4);
	assert_int_equal(at_count_lines(f->log, "restarting in", NULL), 6);
	assert_true(file_has(f->log, "every worker (2) has failed"));
}

static void test_hung_worker_killed_and_restarted(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS], v[AT_MAX_WORKERS];
	bool ok = false;

	write_config(f, BASE "\"workers\": 1");
	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 1, w, 30000));
	assert_int_equal(kill(w[0].pid, SIGSTOP), 0);
	for (int t = 0; t < 20000 && !ok; t += 50) {
		sw_sleep_ms(50);
		ok = at_agentd_workers(f, v, NULL, 0) == 1 && v[0].pid != w[0].pid &&
		     v[0].pid != 0 && strcmp(v[0].state, "running") == 0;
	}
	assert_true(ok);
	assert_int_equal(v[0].hangs, 1);
	assert_int_equal(v[0].crashes, 1);
	assert_string_equal(v[0].last_exit, "signal 9");
	assert_true(file_has(f->log, "hung, killing it"));
	assert_true(file_has(f->log, "(killed: hung)"));
	assert_false(alive(w[0].pid));
	at_agentd_stop(f);
}

static void test_drain_with_task_in_flight(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS];
	char task[16384];
	size_t off;
	long long done, pending, results, before;

	write_config(f, "\"restart_backoff_min_ms\": 300, \"restart_backoff_max_ms\": 2000, "
			 "\"crash_limit\": 3, \"crash_window_ms\": 10000, \"workers\": 2, "
			 "\"lease_ms\": 20000");
	/* A long document: many chunks, many partial summaries. */
	off = (size_t)snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"");
	for (int i = 0; i < 8; i++)
		off += (size_t)snprintf(task + off, sizeof(task) - off, "Part %d. %s ", i,
					at_story);
	snprintf(task + off, sizeof(task) - off, "\"}");
	xadd(f, task);
	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 2, w, 30000));
	/* after the ingest, or another worker would find no document yet */
	if (!at_pg_wait_eq(f->pg,
			   "SELECT count(*) FROM tasks WHERE id = 'in' AND status = 'completed'", 1,
			   60000, 100))
		fail_msg("the ingest did not complete");
	xadd(f, "{\"id\":\"sum\",\"kind\":\"summarize\",\"document_id\":1,\"max_tokens\":96}");
	if (!at_pg_wait_eq(f->pg, "SELECT (count(*) >= 2)::int FROM summaries", 1, 60000, 100))
		fail_msg("no summaries made");
	before = at_pg_int(f->pg,
			   "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'");
	at_agentd_stop(f);
	for (int i = 0; i < 2; i++)
		assert_false(alive(w[i].pid));
	done = at_pg_int(f->pg,
			 "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'");
	pending = at_redis_int(f->redis, "XPENDING swarm:tasks agents");
	results = at_redis_int(f->redis, "XLEN swarm:results");
	fprintf(stderr,
		"drain: summarize %s at SIGTERM, %s after; %lld pending, %lld summaries, "
		"%lld results\n",
		before ? "completed" : "in flight", done ? "completed" : "not completed", pending,
		at_pg_int(f->pg, "SELECT count(*) FROM summaries"), results);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE id = 'in' AND "
					  "status = 'completed'"),
			 1);
	if (done) {
		assert_int_equal(pending, 0);
		assert_int_equal(results, 2);
		assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"),
				 1);
	} else {
		/* handed back: still pending, not acknowledged, no event */
		assert_int_equal(pending, 1);
		assert_int_equal(results, 1);
		assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"),
				 0);
	}
	assert_int_equal(at_redis_int(f->redis, "XLEN swarm:dead"), 0);
	assert_true(file_has(f->log, "SIGTERM: draining 2 workers"));
}

static void test_recycle_after_max_tasks(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS];
	char task[512];
	bool ok = false;

	write_config(f, BASE "\"workers\": 1, \"max_tasks_per_worker\": 2");
	for (int i = 0; i < 5; i++) {
		snprintf(task, sizeof(task),
			 "{\"id\":\"t%d\",\"kind\":\"ingest\",\"text\":\"Sentence number %d about "
			 "a cat.\"}",
			 i, i);
		xadd(f, task);
	}
	at_agentd_start(f, "config/sql");
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'", 5, 60000,
			   100))
		fail_msg("the tasks did not complete");
	for (int t = 0; t < 10000 && !ok; t += 50) {
		sw_sleep_ms(50);
		ok = at_agentd_workers(f, w, NULL, 0) == 1 && w[0].recycles >= 2 && w[0].pid != 0;
	}
	assert_true(ok);
	assert_int_equal(w[0].crashes, 0);
	assert_int_equal(w[0].spawns, w[0].recycles + 1);
	assert_true(file_has(f->log, "tasks done: recycled, restarting"));
	assert_false(file_has(f->log, "restarting in"));
	at_agentd_stop(f);
	assert_int_equal(at_redis_int(f->redis, "XPENDING swarm:tasks agents"), 0);
}

static void test_supervisor_killed_workers_drain(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS];
	bool gone = false;
	int status;

	write_config(f, BASE "\"workers\": 2");
	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 2, w, 30000));
	kill(f->sup, SIGKILL);
	waitpid(f->sup, &status, 0);
	f->sup = 0;
	for (int t = 0; t < 20000 && !gone; t += 50) {
		sw_sleep_ms(50);
		gone = !alive(w[0].pid) && !alive(w[1].pid);
	}
	assert_true(gone);
	assert_true(file_has(f->log, "drained"));
}

/* Waits until slot's pid differs from old and is not 0; returns it or 0. */
static int wait_new_pid(struct at_agentd *f, int slot, int old, bool running, int ms)
{
	struct at_worker v[AT_MAX_WORKERS];

	for (int t = 0; t < ms; t += 20) {
		if (at_agentd_workers(f, v, NULL, 0) > slot && v[slot].pid != old &&
		    v[slot].pid != 0 && (!running || strcmp(v[slot].state, "running") == 0))
			return v[slot].pid;
		sw_sleep_ms(20);
	}
	return 0;
}

static void test_backoff_doubles_then_resets(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS];
	int pid;

	/* crash_window_ms 1000: a worker that ran 1 s before its crash had
	 * been healthy, and its backoff starts again at the minimum */
	write_config(f, "\"lease_ms\": 2000, \"restart_backoff_min_ms\": 300, "
			"\"restart_backoff_max_ms\": 5000, \"crash_limit\": 5, "
			"\"crash_window_ms\": 1000, \"workers\": 1");
	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 1, w, 30000));
	sw_sleep_ms(1100);
	kill(w[0].pid, SIGKILL);                       /* ran > 1 s: 300 ms */
	pid = wait_new_pid(f, 0, w[0].pid, false, 20000);
	assert_true(pid > 0);
	kill(pid, SIGKILL);                            /* at once: doubled, 600 ms */
	pid = wait_new_pid(f, 0, pid, true, 20000);
	assert_true(pid > 0);
	sw_sleep_ms(1100);
	kill(pid, SIGKILL);                            /* ran > 1 s: back to 300 ms */
	assert_true(wait_new_pid(f, 0, pid, true, 20000) > 0);
	assert_int_equal(at_count_lines(f->log, "restarting in 300 ms", NULL), 2);
	assert_int_equal(at_count_lines(f->log, "restarting in 600 ms", NULL), 1);
	assert_int_equal(at_count_lines(f->log, "restarting in", NULL), 3);
	at_agentd_stop(f);
}

static void test_second_sigterm_kills_at_once(void **state)
{
	struct at_agentd *f = *state;
	struct at_worker w[AT_MAX_WORKERS];
	char task[16384];
	size_t off;
	int status;

	write_config(f, BASE "\"workers\": 1");
	off = (size_t)snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"");
	for (int i = 0; i < 8; i++)
		off += (size_t)snprintf(task + off, sizeof(task) - off, "Part %d. %s ", i,
					at_story);
	snprintf(task + off, sizeof(task) - off, "\"}");
	xadd(f, task);
	xadd(f, "{\"id\":\"sum\",\"kind\":\"summarize\",\"document_id\":1,\"max_tokens\":96}");
	at_agentd_start(f, "config/sql");
	assert_true(at_agentd_wait_running(f, 1, w, 30000));
	if (!at_pg_wait_eq(f->pg, "SELECT (count(*) >= 1)::int FROM summaries", 1, 60000, 100))
		fail_msg("no summaries made");
	kill(f->sup, SIGTERM);
	sw_sleep_ms(20);
	kill(f->sup, SIGTERM);
	status = at_agentd_wait(f, 10000);
	assert_int_not_equal(status, -1);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_false(alive(w[0].pid));
	assert_true(file_has(f->log, "SIGTERM again: killing the workers now"));
	fprintf(stderr, "second SIGTERM: summarize %s\n",
		at_pg_int(f->pg,
			  "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'")
			? "completed"
			: "killed mid-task");
	if (at_pg_int(f->pg,
		      "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'") ==
	    0) {
		/* killed mid-task: the entry is still pending for another
		 * consumer, nothing acknowledged or announced */
		assert_int_equal(at_redis_int(f->redis, "XPENDING swarm:tasks agents"), 1);
		assert_int_equal(at_redis_int(f->redis, "XLEN swarm:results"), 1);
	} else {
		assert_int_equal(at_redis_int(f->redis, "XPENDING swarm:tasks agents"), 0);
	}
}

static int run_bin(const char *const *args)
{
	int status;
	pid_t pid = fork();

	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(null, 1);
		dup2(null, 2);
		execv(AGENTD_BIN, (char *const *)args);
		_exit(127);
	}
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_usage_errors(void **state)
{
	const char *none[] = { "agentd", NULL };
	const char *extra[] = { "agentd", "--config", "config/swarm.json", "stray", NULL };
	const char *missing[] = { "agentd", "--config", "/nonexistent.json", NULL };
	const char *check[] = { "agentd", "-n", "--config", "config/swarm.json", NULL };

	(void)state;
	assert_int_equal(run_bin(none), 2);
	assert_int_equal(run_bin(extra), 2);
	assert_int_equal(run_bin(missing), 1);
	assert_int_equal(run_bin(check), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_usage_errors),
		cmocka_unit_test_setup_teardown(test_keeps_n_alive_and_restarts_killed, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_crash_loop_marked_failed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hung_worker_killed_and_restarted, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_recycle_after_max_tasks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain_with_task_in_flight, setup, teardown),
		cmocka_unit_test_setup_teardown(test_supervisor_killed_workers_drain, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_backoff_doubles_then_resets, setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_sigterm_kills_at_once, setup, teardown),
	};
	int rc = it_start(IT_REDIS | IT_PG);

	if (rc)
		return rc;
	signal(SIGPIPE, SIG_IGN);
	sw_log_init("agentd-sup-test", SW_LOG_WARN);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
