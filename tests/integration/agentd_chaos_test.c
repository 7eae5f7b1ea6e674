/* agentd_chaos_test.c - no task lost or duplicated across restarts, in
 * one run (agentd_restart_test and agentd_e2e_test do it in halves): 200
 * tasks through `agentd --config FILE` (the supervisor, 4 worker
 * processes) against real Redis, a private PostgreSQL + pgvector and a
 * real `gpud serve` (stories260K), while PostgreSQL is restarted
 * (pg_ctl -m fast) and then gpud is stopped and started again: the last
 * N_LATE tasks arrive while gpud is away, so the restarted gpud always
 * has work (on a quick machine the first ones may all be done by then).
 * Afterwards every task has ended completed or dead-lettered with an
 * error: none lost (every id has a row, nothing pending, every id has an
 * event), none duplicated (one answer per answer task, one document per
 * ingested text, one row per id), and the supervisor drains and exits 0.
 *
 * The PostgreSQL is started here with scripts/lib/test-servers.sh so it
 * may be restarted; Redis comes from the harness (database REDIS_DB,
 * flushed, since the binary uses the default stream names).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <libpq-fe.h>

#include "common/log.h"
#include "common/time.h"
#include "sw_config.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/gpud_harness.h"
#include "tests/integration/harness.h"

#define REDIS_DB 6 /* agentd_e2e 3, agentd_supervisor 5 */
#define N_TASKS 200
#define N_WORKERS 4
#define N_LATE 50        /* the tasks added while gpud is stopped */
#define INGEST_EVERY 10 /* every 10th task is an ingest of a new text */

static struct at_pg pg;
static pid_t sup = -1; /* the agentd supervisor, killed by teardown if a check failed */

/* Adds tasks t<from>..t<to - 1> to swarm:tasks: every INGEST_EVERY-th an
 * ingest of a new text, the others answers; counts them. */
static void add_tasks(redisContext *r, int from, int to, long long *n_ingest,
		      long long *n_answer)
{
	char task[512];

	for (int i = from; i < to; i++) {
		redisReply *rep;

		if (i % INGEST_EVERY == 0) {
			snprintf(task, sizeof(task),
				 "{\"id\":\"t%03d\",\"kind\":\"ingest\",\"text\":\"Note %d: the cat "
				 "and the dog met again on day %d.\"}",
				 i, i, i);
			(*n_ingest)++;
		} else {
			snprintf(task, sizeof(task),
				 "{\"id\":\"t%03d\",\"kind\":\"answer\",\"question\":\"Who is Max? "
				 "(%d)\",\"top_k\":2,\"max_tokens\":8}",
				 i, i);
			(*n_answer)++;
		}
		rep = redisCommand(r, "XADD swarm:tasks * task %s", task);
		assert_int_equal(rep->type, REDIS_REPLY_STRING);
		freeReplyObject(rep);
	}
}

/* Distinct task ids among the events of swarm:results, and the events. */
static void results_ids(redisContext *r, long long *distinct, long long *events)
{
	redisReply *rep = redisCommand(r, "XRANGE swarm:results - +");
	json_t *seen = json_object();

	*events = 0;
	assert_non_null(rep);
	assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
	for (size_t i = 0; i < rep->elements; i++) {
		redisReply *fields = rep->element[i]->element[1];

		(*events)++;
		for (size_t k = 0; k + 1 < fields->elements; k += 2)
			if (strcmp(fields->element[k]->str, "task_id") == 0)
				json_object_set_new(seen, fields->element[k + 1]->str, json_true());
	}
	*distinct = (long long)json_object_size(seen);
	json_decref(seen);
	freeReplyObject(rep);
}

static const char story[] =
	"Once upon a time there was a little cat named Tom. Tom liked to play in the garden. "
	"One day he saw a big red ball under the tree. He ran to the ball and pushed it. "
	"The ball rolled down the hill and Tom ran after it. At the bottom of the hill he met a "
	"dog named Max. Max was friendly and wanted to play too.";

static void test_chaos_200_tasks(void **state)
{
	char dir[] = "/tmp/agentd-chaos-XXXXXX", config[128], log[128], out[128], status[128];
	char host[256], task[1024], cmd[256];
	struct gpud_it gpud = { 0 };
	long long completed, dead, distinct, events, n_answer = 0, n_ingest = 0;
	redisContext *r;
	double t0, t_pg, t_gpud, t_end;
	PGconn *c;
	FILE *fp;
	int port, st;

	(void)state;
	assert_non_null(mkdtemp(dir));
	assert_int_equal(gpud_it_start(&gpud, NULL), 0);
	assert_int_equal(it_parse_redis_url(it_redis_url(), host, sizeof(host), &port), 0);
	r = redisConnect(host, port);
	assert_non_null(r);
	assert_int_equal(r->err, 0);
	snprintf(cmd, sizeof(cmd), "SELECT %d", REDIS_DB);
	freeReplyObject(redisCommand(r, cmd));
	freeReplyObject(redisCommand(r, "FLUSHDB"));

	snprintf(config, sizeof(config), "%s/agentd.json", dir);
	snprintf(log, sizeof(log), "%s/agentd.log", dir);
	snprintf(out, sizeof(out), "%s/agentd.out", dir);
	snprintf(status, sizeof(status), "%s/state/agentd.status.json", dir);
	fp = fopen(config, "w");
	assert_non_null(fp);
	fprintf(fp,
		"{\"state_dir\": \"%s/state\", \"log\": {\"level\": \"info\", \"file\": \"%s\"},"
		" \"redis\": {\"url\": \"%s/%d\"}, \"postgres\": {\"url\": \"%s\"},"
		" \"gpud\": {\"socket\": \"%s\"},"
		" \"agentd\": {\"workers\": %d, \"max_attempts\": 3, \"lease_ms\": 5000,"
		" \"heartbeat_ms\": 250, \"max_tasks_per_worker\": 0,"
		" \"restart_backoff_min_ms\": 200, \"restart_backoff_max_ms\": 2000}}\n",
		dir, log, it_redis_url(), REDIS_DB, pg.url, gpud.socket, N_WORKERS);
	fclose(fp);

	/* A document to ask about first (an answer before it would find no
	 * chunks), then the 200 tasks. */
	snprintf(task, sizeof(task), "{\"id\":\"doc\",\"kind\":\"ingest\",\"text\":\"%s\"}", story);
	freeReplyObject(redisCommand(r, "XADD swarm:tasks * task %s", task));
	sup = at_agentd_spawn(config, "config/sql", out);
	c = PQconnectdb(pg.url);
	if (!at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'", 1,
				 120000, 100)) {
		at_print_tail(log, 30);
		at_print_tail(out, 10);
		kill(sup, SIGKILL);
		fail_msg("the first ingest did not complete");
	}
	t0 = gpud_it_now();
	add_tasks(r, 0, N_TASKS - N_LATE, &n_ingest, &n_answer);

	if (!at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'", 40,
				 120000, 100)) {
		at_print_tail(log, 30);
		at_print_tail(out, 10);
		kill(sup, SIGKILL);
		fail_msg("no progress before the PostgreSQL restart");
	}
	t_pg = gpud_it_now() - t0;
	fprintf(stderr, "chaos: restarting PostgreSQL at %.1f s with %lld completed\n", t_pg,
		at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'"));
	at_pg_restart(&pg);
	if (!at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'", 110,
				 120000, 100)) {
		at_print_tail(log, 30);
		kill(sup, SIGKILL);
		fail_msg("no progress after the PostgreSQL restart");
	}
	t_gpud = gpud_it_now() - t0;
	fprintf(stderr, "chaos: restarting gpud at %.1f s with %lld completed\n", t_gpud,
		at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'"));
	assert_int_equal(gpud_it_stop(&gpud, SIGTERM, 20000), 0);
	/* the last tasks arrive while gpud is away: work is left for the
	 * restarted gpud whatever the machine's speed */
	add_tasks(r, N_TASKS - N_LATE, N_TASKS, &n_ingest, &n_answer);
	assert_true(at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status <> 'running'") <
		    N_TASKS + 1);
	sw_sleep_ms(500);
	assert_int_equal(gpud_it_spawn(&gpud, NULL), 0);
	assert_int_equal(gpud_it_wait_ready(&gpud, 30000), 0);
	if (!at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status <> 'running'",
				 N_TASKS + 1, 180000, 100)) {
		at_print_tail(log, 40);
		kill(sup, SIGKILL);
		fail_msg("only %lld of %d tasks finished",
			 at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status <> 'running'"),
			 N_TASKS + 1);
	}
	for (int i = 0; i < 100 && at_redis_int(r, "XPENDING swarm:tasks agents") != 0; i++)
		sw_sleep_ms(50); /* the last acks follow the last commits */
	t_end = gpud_it_now() - t0;

	kill(sup, SIGTERM);
	st = at_wait_pid(sup, 40000);
	if (st == -1) {
		kill(sup, SIGKILL);
		waitpid(sup, &st, 0);
		sup = -1;
		fail_msg("the supervisor did not drain within 40 s");
	}
	sup = -1;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);

	completed = at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'");
	dead = at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status = 'dead'");
	results_ids(r, &distinct, &events);
	fprintf(stderr,
		"chaos: %d tasks + 1 in %.1f s: %lld completed, %lld dead; %lld events for %lld "
		"ids; outage lines in the log:\n",
		N_TASKS, t_end, completed, dead, events, distinct);
	snprintf(cmd, sizeof(cmd), "grep 'reconnecting with backoff' %s | cut -c1-200 >&2", log);
	if (system(cmd) != 0)
		fprintf(stderr, "chaos: no outage was logged\n");
	snprintf(cmd, sizeof(cmd), "cat %s >&2; echo >&2", status);
	if (system(cmd) != 0)
		fprintf(stderr, "chaos: no status file\n");

	/* none lost: every id has a final row, an event, nothing pending */
	assert_int_equal(at_pg_count(&c, "SELECT count(*) FROM tasks"), N_TASKS + 1);
	assert_int_equal(completed + dead, N_TASKS + 1);
	assert_int_equal(at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status = 'dead' AND "
					 "(error IS NULL OR error = '')"),
			 0);
	assert_int_equal(at_redis_int(r, "XPENDING swarm:tasks agents"), 0);
	assert_int_equal(at_redis_int(r, "XLEN swarm:dead"), dead);
	assert_int_equal(distinct, N_TASKS + 1);
	assert_true(events >= N_TASKS + 1); /* at least once */
	/* none duplicated: one answer per completed answer task, one document
	 * per ingested text, one chunk set per document */
	assert_int_equal(at_pg_count(&c, "SELECT count(*) FROM answers"),
			 at_pg_count(&c, "SELECT count(DISTINCT task_id) FROM answers"));
	assert_int_equal(
		at_pg_count(&c, "SELECT count(*) FROM answers"),
		at_pg_count(&c, "SELECT count(*) FROM tasks t JOIN answers a ON a.task_id = t.id "
				"WHERE t.status = 'completed'"));
	assert_true(at_pg_count(&c, "SELECT count(*) FROM answers") <= n_answer);
	assert_int_equal(at_pg_count(&c, "SELECT count(*) FROM documents"),
			 at_pg_count(&c, "SELECT count(DISTINCT content_hash) FROM documents"));
	assert_true(at_pg_count(&c, "SELECT count(*) FROM documents") <= n_ingest + 1);
	assert_int_equal(
		at_pg_count(&c, "SELECT count(*) FROM (SELECT document_id, position FROM chunks "
				"GROUP BY 1, 2 HAVING count(*) > 1) d"),
		0);
	/* no worker crashed or hung, and each drained cleanly (exit 0; under
	 * the sanitizers a leak would make it non-zero) */
	{
		json_t *root = json_load_file(status, 0, NULL), *e;
		size_t i;

		assert_non_null(root);
		assert_string_equal(json_string_value(json_object_get(root, "state")), "stopped");
		json_array_foreach(json_object_get(root, "workers"), i, e) {
			assert_int_equal(json_integer_value(json_object_get(e, "crashes")), 0);
			assert_string_equal(json_string_value(json_object_get(e, "last_exit")),
					    "exit 0");
		}
		assert_int_equal(json_array_size(json_object_get(root, "workers")), N_WORKERS);
		json_decref(root);
	}
	/* the restarts really happened under load */
	assert_true(gpud_it_file_has(log, "reconnecting with backoff"));

	PQfinish(c);
	freeReplyObject(redisCommand(r, "FLUSHDB"));
	redisFree(r);
	gpud_it_stop(&gpud, SIGTERM, 20000);
	gpud_it_free(&gpud);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

/* A failed check leaves the test at once: its supervisor (and so its
 * workers) must not outlive it. */
static int teardown(void **state)
{
	(void)state;
	if (sup > 0) {
		kill(sup, SIGKILL);
		waitpid(sup, NULL, 0);
		sup = -1;
	}
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_chaos_200_tasks, teardown),
	};
	int rc = it_start(IT_REDIS);

	if (rc)
		return rc;
	if (at_pg_start(&pg, "/tmp/agentd-chaos-pg-XXXXXX") != 0) {
		fprintf(stderr, "could not start a private PostgreSQL\n");
		at_pg_stop(&pg);
		return it_ci() ? IT_EXIT_FAIL : IT_EXIT_SKIP;
	}
	signal(SIGPIPE, SIG_IGN);
	sw_log_init("agentd-chaos-test", SW_LOG_WARN);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	at_pg_stop(&pg);
	return rc;
}
