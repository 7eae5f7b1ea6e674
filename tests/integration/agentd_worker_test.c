/* agentd_worker_test.c - the worker loop end to end against real Redis
 * and PostgreSQL, with a fake gpud (struct agent_llm):
 *   - a mixed batch: ingest (twice the same text, and the same task id
 *     redelivered), summarize, answer, malformed JSON, unknown kind, an
 *     entry without a task, an oversized question, an unreachable URL
 *     that is retried and dead-lettered after max_attempts; every task
 *     ends with the right status, error, event; nothing stays pending;
 *     heartbeats arrive on the pipe; every entry is deleted from the
 *     stream once acknowledged;
 *   - kill -9 of a worker process in the middle of a summarize: another
 *     worker reclaims the entry after the lease and finishes it, reusing
 *     the partial summaries; exactly one final summary;
 *   - drain: a stop while a task is in hand finishes that task, claims
 *     no other, acknowledges nothing unfinished;
 *   - PostgreSQL dropping the worker's connection: logged, reconnected,
 *     the task completes;
 *   - the fetch policy (agentd.fetch) on real tasks, against an HTTP
 *     server of this test on 127.0.0.1 (every packet stays there: a
 *     refused address is never connected to): the default config
 *     refuses it; with allow_cidrs 127.0.0.1/32 it is fetched, while
 *     127.0.0.2, [::1], 0x7f000001 and a redirect to 127.0.0.2 are
 *     refused (localhost reaches 127.0.0.1: libcurl resolves it to ::1,
 *     refused, and 127.0.0.1); file:// inside file_dirs, outside, and
 *     through a symlink out; a callback to a refused address. A refused
 *     task is failed at its first delivery, its error naming the rule,
 *     and stores no document.
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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "agentd/db.h"
#include "agentd/fetch.h"
#include "agentd/tasks/tasks.h"
#include "agentd/worker.h"
#include "common/err.h"
#include "common/log.h"
#include "common/time.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

#define DIM 8

/* --- fake gpud -------------------------------------------------------------- */

static _Atomic int gen_calls;
static _Atomic int gen_sleep_ms;

static int fake_count(void *ctx, const char *s, size_t len, uint32_t *n, char *err, size_t el)
{
	bool in = false;

	*n = 0;
	for (size_t i = 0; i < len; i++) {
		bool sp = s[i] == ' ';

		if (!sp && !in)
			(*n)++;
		in = !sp;
	}
	return 0;
}

static int fake_embed(void *ctx, const char *s, size_t len, float **vec, uint32_t *dim,
		      char *err, size_t el)
{
	float *v = calloc(DIM, sizeof(*v));

	for (size_t i = 0; i < len; i++)
		v[(unsigned char)s[i] % DIM] += 1;
	*vec = v;
	*dim = DIM;
	return 0;
}

static int fake_generate(void *ctx, const struct proto_submit_req *req, char **text, char *err,
			 size_t el)
{
	char buf[64];

	if (gen_sleep_ms)
		sw_sleep_ms((uint64_t)gen_sleep_ms);
	snprintf(buf, sizeof(buf), "generated %d", ++gen_calls);
	*text = strdup(buf);
	return 0;
}

static const struct agent_llm fake_llm = {
	.count_tokens = fake_count,
	.embed = fake_embed,
	.generate = fake_generate,
};

/* --- fixture ------------------------------------------------------------------ */

struct fx {
	char dbname[64], dburl[1024];
	char stream[128], dead[128], results[128];
	redisContext *redis;
	PGconn *pg;
	struct sw_config cfg;
	int hb[2];
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
	char host[256];
	int port, n = counter++;

	snprintf(f->dbname, sizeof(f->dbname), "agentd_worker_%d_%d", (int)getpid(), n);
	at_db_create(f->dbname, f->dburl, sizeof(f->dburl));
	f->pg = PQconnectdb(f->dburl);
	if (PQstatus(f->pg) != CONNECTION_OK)
		return -1;
	snprintf(f->stream, sizeof(f->stream), "swarm:it:agentd:w:%d:%d:tasks", (int)getpid(), n);
	snprintf(f->dead, sizeof(f->dead), "swarm:it:agentd:w:%d:%d:dead", (int)getpid(), n);
	snprintf(f->results, sizeof(f->results), "swarm:it:agentd:w:%d:%d:results", (int)getpid(),
		 n);
	if (it_parse_redis_url(it_redis_url(), host, sizeof(host), &port) != 0)
		return -1;
	f->redis = redisConnect(host, port);
	if (!f->redis || f->redis->err)
		return -1;

	sw_config_defaults(&f->cfg);
	snprintf(f->cfg.redis.url, sizeof(f->cfg.redis.url), "%s", it_redis_url());
	snprintf(f->cfg.postgres.url, sizeof(f->cfg.postgres.url), "%s", f->dburl);
	f->cfg.agentd.max_attempts = 2;
	f->cfg.agentd.lease_ms = 400;
	f->cfg.agentd.heartbeat_ms = 100;
	f->cfg.agentd.max_tasks_per_worker = 0;
	/* This test's own servers are on 127.0.0.1: opened as a deployment
	 * opens its internal ranges (the policy tests set their own). */
	snprintf(f->cfg.agentd.fetch.allow_cidrs[0], sizeof(f->cfg.agentd.fetch.allow_cidrs[0]),
		 "127.0.0.1/32");
	f->cfg.agentd.fetch.n_allow_cidrs = 1;
	if (pipe2(f->hb, O_CLOEXEC) != 0)
		return -1;
	f->o = (struct agent_worker_opts){
		.cfg = &f->cfg,
		.sql_dir = "config/sql",
		.heartbeat_fd = f->hb[1],
		.consumer = "w1",
		.stream = f->stream,
		.dead_stream = f->dead,
		.results_stream = f->results,
		.block_ms = 50,
		.llm = &fake_llm,
		.chunk_tokens = 8,
		.chunk_overlap = 2,
		.fetch_timeout_ms = 2000,
	};
	gen_calls = 0;
	gen_sleep_ms = 0;
	agent_worker_reset();
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
	close(f->hb[0]);
	close(f->hb[1]);
	free(f);
	return 0;
}

static void *worker_thread(void *arg)
{
	struct fx *f = arg;

	f->rc = agent_worker_run(&f->o, &f->st, f->err, sizeof(f->err));
	return NULL;
}

static void start_worker(struct fx *f)
{
	agent_worker_reset();
	assert_int_equal(pthread_create(&f->thread, NULL, worker_thread, f), 0);
}

static void stop_worker(struct fx *f)
{
	agent_worker_stop();
	pthread_join(f->thread, NULL);
	if (f->rc)
		fail_msg("worker: %s", f->err);
}

static void xadd(struct fx *f, const char *task)
{
	redisReply *r = redisCommand(f->redis, "XADD %s * task %s", f->stream, task);

	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	freeReplyObject(r);
}

/* The value of a one-row query, "" when none; static buffer. */
static const char *pg_text(struct fx *f, const char *fmt, const char *arg)
{
	static char out[1024];
	const char *params[1] = { arg };
	PGresult *r = PQexecParams(f->pg, fmt, 1, NULL, params, NULL, NULL, 0);

	out[0] = '\0';
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		snprintf(out, sizeof(out), "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	return out;
}

static long long redis_int(struct fx *f, const char *fmt, const char *a)
{
	redisReply *r = redisCommand(f->redis, fmt, a);
	long long v;

	assert_non_null(r);
	v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	freeReplyObject(r);
	return v;
}

/* Number of events on the results stream for task id with status. */
static int events(struct fx *f, const char *id, const char *status)
{
	redisReply *r = redisCommand(f->redis, "XRANGE %s - +", f->results);
	int n = 0;

	for (size_t i = 0; i < r->elements; i++) {
		redisReply *fl = r->element[i]->element[1];

		if (!strcmp(fl->element[1]->str, id) && !strcmp(fl->element[3]->str, status))
			n++;
	}
	freeReplyObject(r);
	return n;
}

static const char doc_text[] =
	"The river runs north. The apple tree stands by it. Birds sing in the morning. "
	"Fish swim under the bridge. The mill turns all day. Children play near the bank.";

static void test_mixed_batch(void **state)
{
	struct fx *f = *state;
	char task[6000], id[32];
	char buf[4096];
	ssize_t got;
	redisReply *r;

	snprintf(task, sizeof(task), "{\"id\":\"in-1\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	xadd(f, task);
	snprintf(task, sizeof(task), "{\"id\":\"in-2\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	xadd(f, task);
	snprintf(task, sizeof(task), "{\"id\":\"in-1\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	xadd(f, task); /* the same task delivered again */
	xadd(f, "{\"id\":\"sum\",\"kind\":\"summarize\",\"document_id\":1}");
	xadd(f, "{\"id\":\"ask\",\"kind\":\"answer\",\"question\":\"where is the river?\",\"top_k\":2}");
	xadd(f, "{not json");
	xadd(f, "{\"id\":\"bad-kind\",\"kind\":\"sumarize\",\"document_id\":1}");
	xadd(f, "{\"id\":\"unreach\",\"kind\":\"ingest\",\"url\":\"http://127.0.0.1:1/doc\"}");
	snprintf(task, sizeof(task), "{\"id\":\"big\",\"kind\":\"answer\",\"question\":\"%05000d\"}", 7);
	xadd(f, task);
	r = redisCommand(f->redis, "XADD %s * other field", f->stream);
	freeReplyObject(r);

	start_worker(f);
	/* 7 ids + 2 entries without a usable id, all final. */
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status <> 'running'", 9, 20000,
			   50))
		fail_msg("not all tasks finished: %lld",
			 at_pg_int(f->pg, "SELECT count(*) FROM tasks"));
	/* The worker acknowledges after the commit: give it a moment. */
	for (int t = 0; t < 2000 && at_redis_pending(f->redis, f->stream) != 0; t += 50)
		sw_sleep_ms(50);
	stop_worker(f);

	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "in-1"), "completed");
	assert_string_equal(pg_text(f, "SELECT attempts FROM tasks WHERE id = $1", "in-1"), "2");
	assert_string_equal(pg_text(f, "SELECT location FROM tasks WHERE id = $1", "in-2"),
			    "documents/1");
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents"), 1);
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "sum"), "completed");
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "ask"), "completed");
	assert_string_equal(pg_text(f, "SELECT location FROM tasks WHERE id = $1", "ask"),
			    "answers/ask");
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM answers"), 1);

	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "bad-kind"),
			    "failed");
	assert_string_equal(pg_text(f, "SELECT error FROM tasks WHERE id = $1", "bad-kind"),
			    "task.kind: unknown kind \"sumarize\" (expected ingest, summarize, answer)");
	assert_string_equal(pg_text(f, "SELECT error FROM tasks WHERE id = $1", "big"),
			    "task.question: 5000 bytes exceeds the limit of 4096");
	assert_non_null(strstr(pg_text(f, "SELECT error FROM tasks WHERE id LIKE $1 AND error LIKE"
					  " 'task: invalid JSON%'", "stream:%"),
			       "task: invalid JSON at line 1"));
	assert_string_equal(pg_text(f, "SELECT error FROM tasks WHERE id LIKE $1 AND error LIKE"
				       " '%field%'", "stream:%"),
			    "task: the entry has no \"task\" field");

	/* Retried once after the lease, then dead with its last error. */
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "unreach"), "dead");
	assert_non_null(strstr(pg_text(f, "SELECT error FROM tasks WHERE id = $1", "unreach"),
			       "gave up after 2 deliveries; last error: fetch: http://127.0.0.1:1/doc:"
			       " cannot connect"));
	assert_int_equal(redis_int(f, "XLEN %s", f->dead), 1);
	assert_int_equal(events(f, "unreach", "dead"), 1);

	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	/* Acknowledged entries leave the stream: Redis keeps no finished task. */
	assert_int_equal(redis_int(f, "XLEN %s", f->stream), 0);
	assert_int_equal(events(f, "in-1", "completed"), 2); /* at least once: twice here */
	assert_int_equal(events(f, "in-2", "completed"), 1);
	assert_int_equal(events(f, "sum", "completed"), 1);
	assert_int_equal(events(f, "ask", "completed"), 1);
	assert_int_equal(events(f, "bad-kind", "failed"), 1);
	assert_int_equal(events(f, "big", "failed"), 1);
	assert_int_equal(f->st.completed, 4); /* the redelivered in-1 is only acknowledged */
	assert_int_equal(f->st.dead, 1);
	assert_int_equal(f->st.retried, 1);
	assert_int_equal(f->st.failed, 4);

	snprintf(id, sizeof(id), "hb %d ", (int)getpid());
	fcntl(f->hb[0], F_SETFL, O_NONBLOCK);
	got = read(f->hb[0], buf, sizeof(buf) - 1);
	assert_true(got > 0);
	buf[got] = '\0';
	assert_non_null(strstr(buf, id));
	assert_true(f->st.heartbeats >= 1);
}

/* Runs a worker in a child process until killed. */
static pid_t spawn_victim(struct fx *f)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct agent_worker_opts o = f->o;
		char err[SW_ERR_MAX];

		o.consumer = "victim";
		o.heartbeat_fd = -1;
		gen_sleep_ms = 100;
		agent_worker_run(&o, NULL, err, sizeof(err));
		_exit(0);
	}
	return pid;
}

static void test_kill9_during_summarize(void **state)
{
	struct fx *f = *state;
	char task[4096];
	int status;
	pid_t victim;
	long long total;
	bool ok;

	f->cfg.agentd.max_attempts = 3;
	snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	xadd(f, task);
	xadd(f, "{\"id\":\"sum\",\"kind\":\"summarize\",\"document_id\":1}");

	victim = spawn_victim(f);
	assert_true(victim > 0);
	ok = at_pg_wait_eq(f->pg, "SELECT (count(*) >= 3)::int FROM summaries", 1, 20000, 50);
	kill(victim, SIGKILL); /* before any assertion: never leave it running */
	waitpid(victim, &status, 0);
	if (!ok)
		fail_msg("the victim made no summaries");
	assert_true(WIFSIGNALED(status));
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "sum"), "running");
	total = at_pg_int(f->pg, "SELECT count(*) FROM summaries");
	assert_int_equal(at_redis_pending(f->redis, f->stream), 1);

	/* Another worker reclaims it after the lease and resumes. */
	gen_calls = 0;
	f->o.consumer = "rescuer";
	start_worker(f);
	if (!at_pg_wait_eq(f->pg,
			   "SELECT count(*) FROM tasks WHERE id = 'sum' AND status = 'completed'",
			   1, 20000, 50))
		fail_msg("the summarize task was not finished");
	for (int t = 0; t < 2000 && at_redis_pending(f->redis, f->stream) != 0; t += 50)
		sw_sleep_ms(50);
	stop_worker(f);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(events(f, "sum", "completed"), 1);
	/* Only what was missing was generated again. */
	assert_int_equal(gen_calls, at_pg_int(f->pg, "SELECT count(*) FROM summaries") - total);
	assert_true(total >= 3);
	assert_string_equal(pg_text(f, "SELECT attempts FROM tasks WHERE id = $1", "sum"), "2");
}

static void test_drain_finishes_task_in_hand(void **state)
{
	struct fx *f = *state;
	struct agent_ctx ctx;
	struct agent_db *db;
	struct proto_task t;
	char task[4096], loc[AGENT_LOCATION_MAX], err[SW_ERR_MAX];

	/* A document to ask about, stored directly. */
	assert_int_equal(agent_db_open(&db, f->dburl, err, sizeof(err)), 0);
	assert_int_equal(agent_db_migrate(db, "config/sql", NULL, err, sizeof(err)), 0);
	ctx = (struct agent_ctx){ .db = db, .llm = &fake_llm, .chunk_tokens = 8, .chunk_overlap = 2 };
	snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	assert_int_equal(proto_task_parse(task, strlen(task), &t, err, sizeof(err)), 0);
	assert_int_equal(agent_run_task(&ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	agent_db_close(db);

	gen_sleep_ms = 500;
	xadd(f, "{\"id\":\"a1\",\"kind\":\"answer\",\"question\":\"river?\"}");
	xadd(f, "{\"id\":\"a2\",\"kind\":\"answer\",\"question\":\"apple?\"}");
	xadd(f, "{\"id\":\"a3\",\"kind\":\"answer\",\"question\":\"birds?\"}");
	start_worker(f);
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE id = 'a1'", 1, 10000, 50))
		fail_msg("a1 was not claimed");
	stop_worker(f); /* mid-generation */
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "a1"), "completed");
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE id IN ('a2', 'a3')"),
			 0);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(events(f, "a1", "completed"), 1);
	assert_int_equal(f->st.claimed, 1);
	assert_int_equal(f->st.completed, 1);
}

static void test_postgres_drop_is_ridden_out(void **state)
{
	struct fx *f = *state;
	char task[4096];
	PGresult *r;

	start_worker(f);
	snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	xadd(f, task);
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'", 1, 10000,
			   50))
		fail_msg("first task not done");
	/* End every backend of the worker's database but ours. */
	r = PQexec(f->pg, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
			  " WHERE datname = current_database() AND pid <> pg_backend_pid()");
	PQclear(r);
	xadd(f, "{\"id\":\"ask\",\"kind\":\"answer\",\"question\":\"river?\"}");
	if (!at_pg_wait_eq(f->pg,
			   "SELECT count(*) FROM tasks WHERE id = 'ask' AND status = 'completed'",
			   1, 15000, 50))
		fail_msg("the task after the drop was not done");
	for (int t = 0; t < 2000 && at_redis_pending(f->redis, f->stream) != 0; t += 50)
		sw_sleep_ms(50);
	stop_worker(f);
	assert_true(f->st.outages >= 1);
	assert_int_equal(f->st.completed, 2);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM answers"), 1);
}

struct multi {
	struct fx *f;
	struct agent_worker_opts o;
	struct agent_worker_stats st;
	int rc;
	char err[SW_ERR_MAX];
};

static void *multi_thread(void *arg)
{
	struct multi *m = arg;

	m->rc = agent_worker_run(&m->o, &m->st, m->err, sizeof(m->err));
	return NULL;
}

/* Stores doc_text directly (no task row) so tasks can refer to doc 1. */
static void store_doc(struct fx *f)
{
	struct agent_ctx ctx;
	struct agent_db *db;
	struct proto_task t;
	char task[4096], loc[AGENT_LOCATION_MAX], err[SW_ERR_MAX];

	assert_int_equal(agent_db_open(&db, f->dburl, err, sizeof(err)), 0);
	assert_int_equal(agent_db_migrate(db, "config/sql", NULL, err, sizeof(err)), 0);
	ctx = (struct agent_ctx){ .db = db, .llm = &fake_llm, .chunk_tokens = 8, .chunk_overlap = 2 };
	snprintf(task, sizeof(task), "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"%s\"}", doc_text);
	assert_int_equal(proto_task_parse(task, strlen(task), &t, err, sizeof(err)), 0);
	assert_int_equal(agent_run_task(&ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	agent_db_close(db);
}

static void test_four_workers_no_duplicates(void **state)
{
	struct fx *f = *state;
	struct multi m[4];
	pthread_t th[4];
	char task[512], names[4][16];
	uint64_t claimed = 0;

	store_doc(f);
	for (int i = 0; i < 30; i++) {
		snprintf(task, sizeof(task),
			 "{\"id\":\"q%d\",\"kind\":\"answer\",\"question\":\"question %d?\"}", i, i);
		xadd(f, task);
		xadd(f, task); /* every answer delivered twice */
	}
	for (int i = 0; i < 5; i++) {
		snprintf(task, sizeof(task),
			 "{\"id\":\"s%d\",\"kind\":\"summarize\",\"document_id\":1}", i);
		xadd(f, task);
		snprintf(task, sizeof(task),
			 "{\"id\":\"d%d\",\"kind\":\"ingest\",\"text\":\"one more text. same for all.\"}", i);
		xadd(f, task);
	}
	agent_worker_reset();
	for (int i = 0; i < 4; i++) {
		snprintf(names[i], sizeof(names[i]), "c%d", i);
		m[i] = (struct multi){ .f = f, .o = f->o };
		m[i].o.consumer = names[i];
		m[i].o.heartbeat_fd = -1;
		assert_int_equal(pthread_create(&th[i], NULL, multi_thread, &m[i]), 0);
	}
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'", 40,
			   30000, 50))
		fprintf(stderr, "only %lld completed\n",
			at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'"));
	for (int t = 0; t < 3000 && at_redis_pending(f->redis, f->stream) != 0; t += 50)
		sw_sleep_ms(50);
	agent_worker_stop();
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(m[i].rc, 0);
		claimed += m[i].st.claimed;
	}
	assert_int_equal(claimed, 70);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE status = 'completed'"),
			 40);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM answers"), 30);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents"), 2);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	assert_int_equal(at_pg_int(f->pg,
				   "SELECT count(*) FROM (SELECT document_id, level, position"
				   " FROM summaries GROUP BY 1, 2, 3 HAVING count(*) > 1) d"),
			 0);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(redis_int(f, "XLEN %s", f->dead), 0);
}

/* --- the fetch policy ------------------------------------------------------------ */

static int doc_fd = -1, doc_port;
static _Atomic int doc_conns; /* connections the document server accepted */

/* Serves /doc (doc_text), /to2 (a redirect to 127.0.0.2) and anything
 * else as 204 (callbacks), one request per connection. */
static void *doc_server(void *arg)
{
	for (;;) {
		char req[4096] = "", path[128] = "", head[512];
		size_t got = 0;
		int fd = accept(doc_fd, NULL, NULL), n;

		if (fd < 0)
			return NULL;
		doc_conns++;
		while (got < sizeof(req) - 1 && !strstr(req, "\r\n\r\n")) {
			ssize_t r = read(fd, req + got, sizeof(req) - 1 - got);

			if (r <= 0)
				break;
			got += (size_t)r;
			req[got] = '\0';
		}
		sscanf(req, "%*s %127s", path);
		if (!strcmp(path, "/doc"))
			n = snprintf(head, sizeof(head),
				     "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
				     strlen(doc_text));
		else if (!strcmp(path, "/to2"))
			n = snprintf(head, sizeof(head),
				     "HTTP/1.1 302 Found\r\nConnection: close\r\nLocation: "
				     "http://127.0.0.2:%d/doc\r\nContent-Length: 0\r\n\r\n",
				     doc_port);
		else
			n = snprintf(head, sizeof(head),
				     "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
		if (send(fd, head, (size_t)n, MSG_NOSIGNAL) == n && !strcmp(path, "/doc") &&
		    send(fd, doc_text, strlen(doc_text), MSG_NOSIGNAL) < 0)
			perror("send");
		close(fd);
	}
}

static void doc_server_start(pthread_t *t)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);

	doc_conns = 0;
	doc_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(doc_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(doc_fd, 8), 0);
	assert_int_equal(getsockname(doc_fd, (struct sockaddr *)&a, &alen), 0);
	doc_port = ntohs(a.sin_port);
	assert_int_equal(pthread_create(t, NULL, doc_server, NULL), 0);
}

static void doc_server_stop(pthread_t t)
{
	shutdown(doc_fd, SHUT_RDWR);
	pthread_join(t, NULL);
	close(doc_fd);
}

/* Queues an ingest of url with id. */
static void xadd_url(struct fx *f, const char *id, const char *url)
{
	char task[2048];

	snprintf(task, sizeof(task), "{\"id\":\"%s\",\"kind\":\"ingest\",\"url\":\"%s\"}", id, url);
	xadd(f, task);
}

/* Runs the worker until n tasks are final and acknowledged. */
static void run_until_final(struct fx *f, int n)
{
	start_worker(f);
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE status <> 'running'", n, 20000,
			   50))
		fail_msg("not all tasks finished: %lld",
			 at_pg_int(f->pg, "SELECT count(*) FROM tasks WHERE status <> 'running'"));
	for (int t = 0; t < 2000 && at_redis_pending(f->redis, f->stream) != 0; t += 50)
		sw_sleep_ms(50);
	stop_worker(f);
}

/* Task id failed at its first delivery, with want in its error, and an
 * event saying so. */
static void expect_refused_task(struct fx *f, const char *id, const char *want)
{
	const char *e;

	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", id), "failed");
	assert_string_equal(pg_text(f, "SELECT attempts FROM tasks WHERE id = $1", id), "1");
	e = pg_text(f, "SELECT error FROM tasks WHERE id = $1", id);
	if (!strstr(e, want))
		fail_msg("task %s: error \"%s\" lacks \"%s\"", id, e, want);
	assert_int_equal(events(f, id, "failed"), 1);
}

/* The default configuration: nothing on loopback, no file://. */
static void test_fetch_default_refuses(void **state)
{
	struct fx *f = *state;
	char u[128], want[256];
	pthread_t srv;

	f->cfg.agentd.fetch.n_allow_cidrs = 0;
	doc_server_start(&srv);
	snprintf(u, sizeof(u), "http://127.0.0.1:%d/doc", doc_port);
	xadd_url(f, "lo", u);
	xadd_url(f, "file", "file:///etc/hostname");
	run_until_final(f, 2);
	doc_server_stop(srv);

	snprintf(want, sizeof(want),
		 "fetch: %s: 127.0.0.1 is a loopback address; allow it with "
		 "agentd.fetch.allow_cidrs",
		 u);
	assert_string_equal(pg_text(f, "SELECT error FROM tasks WHERE id = $1", "lo"), want);
	expect_refused_task(f, "lo", want);
	expect_refused_task(f, "file", "fetch: file:///etc/hostname: file:// is off (list the "
				       "directories it may read in agentd.fetch.file_dirs)");
	assert_int_equal(doc_conns, 0); /* not one connection */
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents"), 0);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM chunks"), 0);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(redis_int(f, "XLEN %s", f->dead), 0);
}

/* allow_cidrs 127.0.0.1/32 and file_dirs: what each lets through. */
static void test_fetch_allow_list(void **state)
{
	struct fx *f = *state;
	char u[1024], dir[] = "/tmp/agentd_worker_files_XXXXXX", p[512];
	pthread_t srv;
	FILE *fp;

	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/docs", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/docs/a.txt", dir);
	assert_non_null(fp = fopen(p, "w"));
	fputs("A file inside the allowed directory. It has two sentences.", fp);
	fclose(fp);
	snprintf(p, sizeof(p), "%s/secret.txt", dir);
	assert_non_null(fp = fopen(p, "w"));
	fputs("A file outside. Never stored.", fp);
	fclose(fp);
	snprintf(p, sizeof(p), "%s/docs/link.txt", dir);
	assert_int_equal(symlink("../secret.txt", p), 0);
	snprintf(f->cfg.agentd.fetch.file_dirs[0], sizeof(f->cfg.agentd.fetch.file_dirs[0]),
		 "%s/docs", dir);
	f->cfg.agentd.fetch.n_file_dirs = 1;

	doc_server_start(&srv);
	snprintf(u, sizeof(u), "http://127.0.0.1:%d/doc", doc_port);
	xadd_url(f, "ok", u);
	snprintf(u, sizeof(u), "http://localhost:%d/doc", doc_port);
	xadd_url(f, "name", u);
	snprintf(u, sizeof(u), "http://127.0.0.2:%d/doc", doc_port);
	xadd_url(f, "lo2", u);
	snprintf(u, sizeof(u), "http://[::1]:%d/doc", doc_port);
	xadd_url(f, "v6", u);
	snprintf(u, sizeof(u), "http://0x7f000001:%d/doc", doc_port);
	xadd_url(f, "hex", u);
	snprintf(u, sizeof(u), "http://127.0.0.1:%d/to2", doc_port);
	xadd_url(f, "redir", u);
	snprintf(u, sizeof(u), "file://%s/docs/a.txt", dir);
	xadd_url(f, "file-in", u);
	snprintf(u, sizeof(u), "file://%s/secret.txt", dir);
	xadd_url(f, "file-out", u);
	snprintf(u, sizeof(u), "file://%s/docs/link.txt", dir);
	xadd_url(f, "file-link", u);
	snprintf(u, sizeof(u), "file://%s/docs/../secret.txt", dir);
	xadd_url(f, "file-dots", u);
	/* A callback to a refused address: the task completes, the POST is
	 * refused before it connects (logged), nothing else happens. */
	snprintf(u, sizeof(u),
		 "{\"id\":\"cb\",\"kind\":\"ingest\",\"text\":\"called back.\","
		 "\"callback_url\":\"http://127.0.0.2:%d/done\"}", doc_port);
	xadd(f, u);
	run_until_final(f, 11);
	doc_server_stop(srv);

	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "ok"), "completed");
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "name"),
			    "completed");
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "file-in"),
			    "completed");
	assert_string_equal(pg_text(f, "SELECT status FROM tasks WHERE id = $1", "cb"), "completed");
	expect_refused_task(f, "lo2", "127.0.0.2 is a loopback address; allow it with "
				      "agentd.fetch.allow_cidrs");
	expect_refused_task(f, "v6", ": ::1 is a loopback address; allow it with "
				     "agentd.fetch.allow_cidrs");
	expect_refused_task(f, "hex", "host \"0x7f000001\" is an IPv4 address in a non-standard "
				      "form");
	snprintf(u, sizeof(u), "/to2: redirected to http://127.0.0.2:%d/doc: 127.0.0.2 is a "
			       "loopback address; allow it with agentd.fetch.allow_cidrs", doc_port);
	expect_refused_task(f, "redir", u);
	snprintf(u, sizeof(u), ": %s/secret.txt is not under a directory of agentd.fetch.file_dirs",
		 dir);
	expect_refused_task(f, "file-out", u);
	expect_refused_task(f, "file-link", u);
	expect_refused_task(f, "file-dots", u);
	/* ok and name: the same text, one document; file-in; cb's text. */
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents"), 3);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM documents WHERE text LIKE "
					  "'%outside%'"), 0);
	/* ok, name, the first hop of redir: nothing else reached the server. */
	assert_int_equal(doc_conns, 3);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(redis_int(f, "XLEN %s", f->dead), 0);

	snprintf(p, sizeof(p), "rm -rf '%s'", dir);
	assert_int_equal(system(p), 0);
}

/* --- callbacks ------------------------------------------------------------------ */

static int cb_fd = -1;
static char cb_body[1024];
static _Atomic int cb_count;

static void *cb_server(void *arg)
{
	static const char reply[] = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";

	for (;;) {
		char req[4096] = "";
		size_t got = 0;
		char *body;
		int fd = accept(cb_fd, NULL, NULL);

		if (fd < 0)
			return NULL;
		while (got < sizeof(req) - 1) {
			ssize_t r = read(fd, req + got, sizeof(req) - 1 - got);

			if (r <= 0)
				break;
			got += (size_t)r;
			req[got] = '\0';
			body = strstr(req, "\r\n\r\n");
			if (body && strchr(body + 4, '}'))
				break;
		}
		body = strstr(req, "\r\n\r\n");
		if (body)
			snprintf(cb_body, sizeof(cb_body), "%s", body + 4);
		cb_count++;
		if (send(fd, reply, sizeof(reply) - 1, MSG_NOSIGNAL) < 0)
			perror("send");
		close(fd);
	}
}

static void test_callback_posted(void **state)
{
	struct fx *f = *state;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	pthread_t srv;
	char task[512];

	cb_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(cb_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(cb_fd, 4), 0);
	assert_int_equal(getsockname(cb_fd, (struct sockaddr *)&a, &alen), 0);
	assert_int_equal(pthread_create(&srv, NULL, cb_server, NULL), 0);

	snprintf(task, sizeof(task),
		 "{\"id\":\"cb\",\"kind\":\"ingest\",\"text\":\"called back.\","
		 "\"callback_url\":\"http://127.0.0.1:%d/done\"}", ntohs(a.sin_port));
	xadd(f, task);
	start_worker(f);
	for (int t = 0; t < 10000 && cb_count == 0; t += 50)
		sw_sleep_ms(50);
	stop_worker(f);
	shutdown(cb_fd, SHUT_RDWR);
	pthread_join(srv, NULL);
	close(cb_fd);
	assert_int_equal(cb_count, 1);
	assert_non_null(strstr(cb_body, "\"task_id\":\"cb\""));
	assert_non_null(strstr(cb_body, "\"status\":\"completed\""));
	assert_non_null(strstr(cb_body, "\"location\":\"documents/1\""));
}

static void test_recycle_after_max_tasks(void **state)
{
	struct fx *f = *state;

	f->cfg.agentd.max_tasks_per_worker = 2;
	xadd(f, "{bad 1");
	xadd(f, "{bad 2");
	xadd(f, "{bad 3");
	agent_worker_reset();
	/* Returns by itself after two tasks: the supervisor starts a new one. */
	worker_thread(f);
	assert_int_equal(f->rc, 0);
	assert_int_equal(f->st.claimed, 2);
	assert_int_equal(at_pg_int(f->pg, "SELECT count(*) FROM tasks"), 2);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
}

/* Reads what the heartbeat pipe holds now ("" when nothing). */
static const char *read_beats(struct fx *f)
{
	static char buf[8192];
	ssize_t got;

	fcntl(f->hb[0], F_SETFL, O_NONBLOCK);
	got = read(f->hb[0], buf, sizeof(buf) - 1);
	buf[got > 0 ? got : 0] = '\0';
	return buf;
}

static void test_heartbeat_stops_while_hung(void **state)
{
	struct fx *f = *state;

	store_doc(f);
	f->cfg.agentd.lease_ms = 300;
	f->cfg.agentd.heartbeat_ms = 50;
	gen_sleep_ms = 1800; /* one generation far longer than the lease */
	xadd(f, "{\"id\":\"slow\",\"kind\":\"answer\",\"question\":\"river?\"}");
	start_worker(f);
	if (!at_pg_wait_eq(f->pg, "SELECT count(*) FROM tasks WHERE id = 'slow'", 1, 10000, 50))
		fail_msg("the task was not claimed");
	sw_sleep_ms(800);
	assert_non_null(strstr(read_beats(f), " busy ")); /* beats until the lease passed */
	sw_sleep_ms(400);
	assert_string_equal(read_beats(f), "");           /* then silence: hung */
	if (!at_pg_wait_eq(f->pg,
			   "SELECT count(*) FROM tasks WHERE id = 'slow' AND status = 'completed'",
			   1, 10000, 50))
		fail_msg("the slow task did not complete");
	sw_sleep_ms(300);
	assert_non_null(strstr(read_beats(f), " idle ")); /* alive again */
	stop_worker(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_mixed_batch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kill9_during_summarize, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain_finishes_task_in_hand, setup, teardown),
		cmocka_unit_test_setup_teardown(test_postgres_drop_is_ridden_out, setup, teardown),
		cmocka_unit_test_setup_teardown(test_four_workers_no_duplicates, setup, teardown),
		cmocka_unit_test_setup_teardown(test_callback_posted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch_default_refuses, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch_allow_list, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recycle_after_max_tasks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_heartbeat_stops_while_hung, setup, teardown),
	};
	int rc = it_start(IT_REDIS | IT_PG);

	if (rc)
		return rc;
	signal(SIGPIPE, SIG_IGN);
	sw_log_init("agentd-worker-test", SW_LOG_WARN);
	agent_fetch_global_init(NULL, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
