/* agentd_e2e_test.c - agentd through the whole stack: a worker against
 * real Redis, PostgreSQL + pgvector and a real `gpud serve` with
 * stories260K (tests/integration/gpud_harness.h).
 *   1. one task per document: a summarize and an answer that bring the
 *      same multi-chunk text, and an ingest of it: one document
 *      (embeddings of gpud's width), one final summary, the answer with
 *      its chunk ids, and every row and event naming the document;
 *   2. gpud stopped and started again in the middle of 200 tasks: every
 *      task completes, none is lost or stored twice;
 *   3. the `agentd worker` binary killed with -9 right after the ingest of
 *      a summarize-with-text committed: another worker resumes it from
 *      the stored document (no second document) and drains on SIGTERM.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "agentd/fetch.h"
#include "agentd/worker.h"
#include "common/err.h"
#include "common/log.h"
#include "common/time.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/gpud_harness.h"
#include "tests/integration/harness.h"

struct fx {
	char dbname[64];
	char stream[128], dead[128], results[128];
	redisContext *redis;
	PGconn *pg;
	struct gpud_it gpud;
	struct sw_config cfg;
	struct agent_worker_opts o;
	struct agent_worker_stats st;
	pthread_t thread;
	int rc;
	char err[SW_ERR_MAX];
};

static int counter;

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char host[256], url[1024];
	int port, n = counter++;

	if (gpud_it_start(&f->gpud, NULL) != 0) {
		gpud_it_free(&f->gpud);
		free(f);
		return -1;
	}
	snprintf(f->dbname, sizeof(f->dbname), "agentd_e2e_%d_%d", (int)getpid(), n);
	at_db_create(f->dbname, url, sizeof(url));
	f->pg = PQconnectdb(url);
	snprintf(f->stream, sizeof(f->stream), "swarm:it:agentd:e2e:%d:%d:tasks", (int)getpid(), n);
	snprintf(f->dead, sizeof(f->dead), "swarm:it:agentd:e2e:%d:%d:dead", (int)getpid(), n);
	snprintf(f->results, sizeof(f->results), "swarm:it:agentd:e2e:%d:%d:results",
		 (int)getpid(), n);
	if (it_parse_redis_url(it_redis_url(), host, sizeof(host), &port) != 0)
		return -1;
	f->redis = redisConnect(host, port);

	sw_config_defaults(&f->cfg);
	snprintf(f->cfg.redis.url, sizeof(f->cfg.redis.url), "%s", it_redis_url());
	snprintf(f->cfg.postgres.url, sizeof(f->cfg.postgres.url), "%s", url);
	if (strlen(f->gpud.socket) >= sizeof(f->cfg.gpud.socket))
		return -1;
	memcpy(f->cfg.gpud.socket, f->gpud.socket, strlen(f->gpud.socket) + 1);
	f->cfg.agentd.max_attempts = 3;
	f->cfg.agentd.lease_ms = 5000;
	f->cfg.agentd.heartbeat_ms = 500;
	f->cfg.agentd.max_tasks_per_worker = 0;
	f->o = (struct agent_worker_opts){
		.cfg = &f->cfg,
		.sql_dir = "config/sql",
		.heartbeat_fd = -1,
		.stream = f->stream,
		.dead_stream = f->dead,
		.results_stream = f->results,
		.block_ms = 100,
		.chunk_tokens = 32,
		.chunk_overlap = 8,
	};
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	at_streams_del(f->redis, f->stream, f->dead, f->results);
	redisFree(f->redis);
	PQfinish(f->pg);
	at_db_drop(f->dbname);
	if (f->gpud.pid)
		gpud_it_stop(&f->gpud, SIGTERM, 20000);
	gpud_it_free(&f->gpud);
	free(f);
	return 0;
}

static void *worker_thread(void *arg)
{
	struct fx *f = arg;

	f->rc = agent_worker_run(&f->o, &f->st, f->err, sizeof(f->err));
	return NULL;
}

static void xadd(struct fx *f, const char *task)
{
	redisReply *r = redisCommand(f->redis, "XADD %s * task %s", f->stream, task);

	assert_int_equal(r->type, REDIS_REPLY_STRING);
	freeReplyObject(r);
}

static long long xlen(struct fx *f, const char *key)
{
	redisReply *r = redisCommand(f->redis, "XLEN %s", key);
	long long v = r->integer;

	freeReplyObject(r);
	return v;
}

static void stop_worker(struct fx *f)
{
	agent_worker_stop();
	pthread_join(f->thread, NULL);
	if (f->rc)
		fail_msg("worker: %s", f->err);
}

/* The value of field key in the swarm:results event of task id ("" when
 * it has no event; the test fails when the event lacks the field). */
static void event_field(redisContext *r, const char *stream, const char *id, const char *key,
			char *out, size_t len)
{
	redisReply *rep = redisCommand(r, "XRANGE %s - +", stream);
	bool found = false, has_key = false;

	out[0] = '\0';
	assert_non_null(rep);
	for (size_t i = 0; i < rep->elements && !found; i++) {
		redisReply *fl = rep->element[i]->element[1];

		for (size_t k = 0; k + 1 < fl->elements; k += 2)
			if (!strcmp(fl->element[k]->str, "task_id") &&
			    !strcmp(fl->element[k + 1]->str, id))
				found = true;
		for (size_t k = 0; found && k + 1 < fl->elements; k += 2)
			if (!strcmp(fl->element[k]->str, key)) {
				snprintf(out, len, "%s", fl->element[k + 1]->str);
				has_key = true;
			}
	}
	freeReplyObject(rep);
	if (found && !has_key)
		fail_msg("the event of %s has no field %s", id, key);
}

/* One task per document: a summarize and an answer that bring the same
 * text, and an ingest of it, are three tasks and one document; every row
 * and every event names it. */
static void test_one_task_per_document(void **state)
{
	struct fx *f = *state;
	char task[2048], want[32], got[32];
	long long doc;

	snprintf(task, sizeof(task),
		 "{\"id\":\"sum\",\"kind\":\"summarize\",\"text\":\"%s\",\"max_tokens\":24}",
		 at_story);
	xadd(f, task);
	snprintf(task, sizeof(task),
		 "{\"id\":\"ask\",\"kind\":\"answer\",\"question\":\"What did Tom find?\","
		 "\"top_k\":3,\"max_tokens\":24,\"text\":\"%s\"}", at_story);
	xadd(f, task);
	snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"%s\"}",
		 at_story);
	xadd(f, task);
	agent_worker_reset();
	assert_int_equal(pthread_create(&f->thread, NULL, worker_thread, f), 0);
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status <> 'running'", 3, 120000,
			   100)) {
		stop_worker(f);
		gpud_it_print_tail(&f->gpud, "gpud", 30);
		fail_msg("tasks not finished");
	}
	sw_sleep_ms(300);
	stop_worker(f);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'"),
			 3);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents"), 1);
	doc = at_pg_int(f->pg, "SELECT id FROM documents WHERE task_id = 'sum'");
	assert_true(doc > 0);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE document_id = "
					  "(SELECT id FROM documents)"), 3);
	assert_true(at_pg_int(f->pg, "SELECT count(*) FROM chunks WHERE embedding IS NOT NULL") >=
		    3);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM chunks WHERE embedding IS NULL"),
			 0);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM chunks"),
			 at_pg_int(f->pg, "SELECT n_chunks FROM documents"));
	fprintf(stderr, "e2e: %lld chunks, embedding width %lld, %lld summaries\n",
		at_pg_int(f->pg, "SELECT count(*) FROM chunks"),
		at_pg_int(f->pg, "SELECT dim FROM embedding_space"),
		at_pg_int(f->pg, "SELECT count(*) FROM summaries"));
	assert_true(at_pg_int(f->pg, "SELECT dim FROM embedding_space") > 0);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	assert_int_equal(at_pg_int(f->pg, "SELECT array_length(chunk_ids, 1) FROM answers"), 3);
	assert_int_equal(xlen(f, f->results), 3);
	assert_int_equal(xlen(f, f->dead), 0);
	assert_int_equal(f->st.completed, 3);
	snprintf(want, sizeof(want), "%lld", doc);
	event_field(f->redis, f->results, "sum", "document_id", got, sizeof(got));
	assert_string_equal(got, want);
	event_field(f->redis, f->results, "ask", "document_id", got, sizeof(got));
	assert_string_equal(got, want);
	event_field(f->redis, f->results, "in", "document_id", got, sizeof(got));
	assert_string_equal(got, want);
}

#define N_RESTART_TASKS 200

static void test_gpud_restart_mid_run(void **state)
{
	struct fx *f = *state;
	char task[2048];
	int rc;

	snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"%s\"}",
		 at_story);
	xadd(f, task);
	/* enough tasks that the stop lands mid-run (20 could all finish
	 * while gpud drained on a quiet machine) */
	for (int i = 0; i < N_RESTART_TASKS; i++) {
		snprintf(task, sizeof(task),
			 "{\"id\":\"q%d\",\"kind\":\"answer\",\"question\":\"Who is Max? (%d)\","
			 "\"max_tokens\":16}",
			 i, i);
		xadd(f, task);
	}
	agent_worker_reset();
	assert_int_equal(pthread_create(&f->thread, NULL, worker_thread, f), 0);
	if (!at_pg_wait_eq(f->pg,
			   "SELECT (count(*) >= 5)::int FROM tasks WHERE status = 'completed'", 1,
			   60000, 100)) {
		stop_worker(f);
		fail_msg("no progress before the restart");
	}
	rc = gpud_it_stop(&f->gpud, SIGTERM, 20000);
	fprintf(stderr, "e2e: gpud stopped (%d) with %lld tasks completed\n", rc,
		at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'"));
	sw_sleep_ms(1000);
	assert_int_equal(gpud_it_spawn(&f->gpud, NULL), 0);
	assert_int_equal(gpud_it_wait_ready(&f->gpud, 30000), 0);
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'",
			   N_RESTART_TASKS + 1, 120000, 100)) {
		stop_worker(f);
		fail_msg("not every task completed after the restart");
	}
	sw_sleep_ms(300);
	stop_worker(f);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM answers"), N_RESTART_TASKS);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(DISTINCT task_id) FROM answers"),
			 N_RESTART_TASKS);
	assert_int_equal(xlen(f, f->dead), 0);
	assert_int_equal(xlen(f, f->results), N_RESTART_TASKS + 1);
	assert_true(f->st.outages >= 1);
}

/* --- the `agentd worker` process ------------------------------------------------ */

#define REDIS_DB 3 /* the binary uses the default stream names: keep them apart */

struct proc {
	pid_t pid;
	int hb;       /* read end of its heartbeat pipe */
};

static void write_config(struct fx *f, const char *dir, char *path, size_t len)
{
	char url[1024];
	const char *base = it_pg_url(), *p = strchr(strstr(base, "://") + 3, '/');
	FILE *fp;

	snprintf(path, len, "%s/agentd.json", dir);
	snprintf(url, sizeof(url), "%.*s/%s", (int)(p - base), base, f->dbname);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fprintf(fp,
		"{\"state_dir\": \"%s\", \"log\": {\"level\": \"info\", \"file\": \"%s/worker.log\"},"
		" \"redis\": {\"url\": \"%s/%d\"}, \"postgres\": {\"url\": \"%s\"},"
		" \"gpud\": {\"socket\": \"%s\"},"
		" \"agentd\": {\"max_attempts\": 3, \"lease_ms\": 1000, \"heartbeat_ms\": 200}}\n",
		dir, dir, it_redis_url(), REDIS_DB, url, f->gpud.socket);
	fclose(fp);
}

static struct proc spawn_worker(const char *config)
{
	struct proc p = { 0 };
	int fds[2];

	assert_int_equal(pipe(fds), 0);
	p.pid = fork();
	assert_true(p.pid >= 0);
	if (p.pid == 0) {
		dup2(fds[1], 3);
		if (fds[0] != 3)
			close(fds[0]);
		execl(AGENTD_BIN, "agentd", "worker", "--config", config, "--heartbeat-fd", "3",
		      "--sql-dir", "config/sql", (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	p.hb = fds[0];
	return p;
}

static void test_worker_process_kill9_then_sigterm(void **state)
{
	struct fx *f = *state;
	char dir[] = "/tmp/agentd-e2e-XXXXXX", config[256], task[16384], buf[4096], want[32];
	redisContext *r = f->redis;
	redisReply *rep;
	struct proc a, b;
	long long doc;
	size_t off = 0;
	int status;
	bool ok;
	ssize_t got;

	assert_non_null(mkdtemp(dir));
	write_config(f, dir, config, sizeof(config));
	rep = redisCommand(r, "SELECT %d", REDIS_DB);
	freeReplyObject(rep);
	rep = redisCommand(r, "FLUSHDB");
	freeReplyObject(rep);

	/* One task: a summarize that brings a long text (many chunks, many
	 * partial summaries). */
	off = (size_t)snprintf(task, sizeof(task),
			       "{\"id\":\"sum\",\"kind\":\"summarize\",\"max_tokens\":96,\"text\":\"");
	for (int i = 0; i < 8; i++)
		off += (size_t)snprintf(task + off, sizeof(task) - off, "Part %d. %s ", i,
					at_story);
	snprintf(task + off, sizeof(task) - off, "\"}");
	rep = redisCommand(r, "XADD swarm:tasks * task %s", task);
	freeReplyObject(rep);

	/* Killed the moment its ingest committed (the document is there),
	 * before the summary is done. */
	a = spawn_worker(config);
	ok = at_pg_wait_eq(f->pg, "SELECT count(*) FROM documents", 1, 60000, 10);
	kill(a.pid, SIGKILL);
	waitpid(a.pid, &status, 0);
	if (!ok)
		fail_msg("the first worker stored no document (log in %s)", dir);
	fprintf(stderr, "e2e: worker killed after the ingest with %lld summaries made, sum %s\n",
		at_pg_int(f->pg, "SELECT count(*) FROM summaries"),
		at_pg_int(f->pg,
			  "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'")
			? "already completed"
			: "in progress");
	doc = at_pg_int(f->pg, "SELECT id FROM documents");
	assert_int_equal(at_pg_int(f->pg, "SELECT document_id FROM tasks WHERE id = 'sum'"), doc);
	got = read(a.hb, buf, sizeof(buf) - 1);
	assert_true(got > 0);
	buf[got] = '\0';
	assert_int_equal(strncmp(buf, "hb ", 3), 0);
	close(a.hb);

	/* Another process reclaims the entry after the 1 s lease and resumes
	 * from the stored document. */
	b = spawn_worker(config);
	ok = at_pg_wait_eq(f->pg,
			   "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'",
			   1, 60000, 100);
	sw_sleep_ms(300);
	kill(b.pid, SIGTERM);
	for (int t = 0; t < 10000 && waitpid(b.pid, &status, WNOHANG) == 0; t += 50)
		sw_sleep_ms(50);
	if (!ok)
		fail_msg("the summarize task was not completed (log in %s)", dir);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0); /* drained on SIGTERM */
	assert_int_equal(at_pg_int(f->pg, "SELECT attempts FROM tasks WHERE id = 'sum'"), 2);
	/* no second document, no second set of chunks */
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents"), 1);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM chunks"),
			 at_pg_int(f->pg, "SELECT n_chunks FROM documents"));
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE document_id <> "
					  "(SELECT id FROM documents)"), 0);
	snprintf(buf, sizeof(buf), "grep -q 'task sum: document %lld stored by an earlier "
		 "delivery' %s/worker.log", doc, dir);
	if (system(buf) != 0)
		fail_msg("the second worker did not take the stored document (log in %s)", dir);
	rep = redisCommand(r, "XPENDING swarm:tasks agents");
	assert_int_equal(rep->element[0]->integer, 0);
	freeReplyObject(rep);
	rep = redisCommand(r, "XLEN swarm:results");
	assert_int_equal(rep->integer, 1);
	freeReplyObject(rep);
	snprintf(want, sizeof(want), "%lld", doc);
	event_field(r, "swarm:results", "sum", "document_id", buf, sizeof(buf));
	assert_string_equal(buf, want);
	got = read(b.hb, buf, sizeof(buf) - 1);
	assert_true(got > 0);
	close(b.hb);

	rep = redisCommand(r, "FLUSHDB");
	freeReplyObject(rep);
	rep = redisCommand(r, "SELECT 0");
	freeReplyObject(rep);
	snprintf(buf, sizeof(buf), "rm -rf %s", dir);
	assert_int_equal(system(buf), 0);
}

static void test_worker_usage_errors(void **state)
{
	char out[512];
	int status;
	pid_t pid;

	(void)out;
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(null, 2);
		execl(AGENTD_BIN, "agentd", "worker", (char *)NULL);
		_exit(127);
	}
	waitpid(pid, &status, 0);
	assert_int_equal(WEXITSTATUS(status), 2);
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		dup2(null, 2);
		execl(AGENTD_BIN, "agentd", "worker", "--config", "/nonexistent.json", (char *)NULL);
		_exit(127);
	}
	waitpid(pid, &status, 0);
	assert_int_equal(WEXITSTATUS(status), 1);
	/* -n validates a configuration without touching any server. */
	assert_int_equal(system(AGENTD_BIN " worker -n --config config/swarm.json >/dev/null"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_one_task_per_document, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gpud_restart_mid_run, setup, teardown),
		cmocka_unit_test_setup_teardown(test_worker_process_kill9_then_sigterm, setup, teardown),
		cmocka_unit_test(test_worker_usage_errors),
	};
	int rc = it_start(IT_REDIS | IT_PG);

	if (rc)
		return rc;
	signal(SIGPIPE, SIG_IGN);
	sw_log_init("agentd-e2e", SW_LOG_WARN);
	agent_fetch_global_init(NULL, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
