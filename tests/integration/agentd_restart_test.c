/* agentd_restart_test.c - no task lost across restarts, PostgreSQL
 * half: two workers run 200 tasks while PostgreSQL is restarted twice
 * under them. Every task ends completed (none lost), no answer is stored
 * twice, nothing stays pending. gpud is a fake here (agentd_e2e_test
 * restarts the real one).
 *
 * The test starts a PostgreSQL of its own with scripts/lib/test-servers.sh
 * (so it may restart it with pg_ctl) and uses the harness's Redis.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include "sw_config.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

#define N_TASKS 200
#define N_WORKERS 2

static struct at_pg pg;

static int fake_count(void *ctx, const char *s, size_t len, uint32_t *n, char *err, size_t el)
{
	*n = (uint32_t)(len / 4 + 1);
	return 0;
}

static int fake_embed(void *ctx, const char *s, size_t len, float **vec, uint32_t *dim,
		      char *err, size_t el)
{
	float *v = calloc(4, sizeof(*v));

	v[len % 4] = 1;
	*vec = v;
	*dim = 4;
	return 0;
}

static int fake_generate(void *ctx, const struct proto_submit_req *req, char **text, char *err,
			 size_t el)
{
	sw_sleep_ms(3);
	*text = strdup("an answer");
	return 0;
}

static const struct agent_llm fake_llm = {
	.count_tokens = fake_count,
	.embed = fake_embed,
	.generate = fake_generate,
};

struct th {
	struct agent_worker_opts o;
	struct agent_worker_stats st;
	char name[16];
	char err[SW_ERR_MAX];
	int rc;
};

static void *run(void *arg)
{
	struct th *t = arg;

	t->rc = agent_worker_run(&t->o, &t->st, t->err, sizeof(t->err));
	return NULL;
}

static void test_two_restarts_under_200_tasks(void **state)
{
	char stream[96], dead[96], results[96], host[256], task[256], err[SW_ERR_MAX], loc[256];
	struct th th[N_WORKERS];
	pthread_t tid[N_WORKERS];
	struct sw_config cfg;
	struct agent_db *db;
	struct agent_ctx ctx;
	struct proto_task t;
	redisContext *r;
	redisReply *rep;
	uint64_t outages = 0;
	PGconn *c;
	int port;

	/* A document to ask about. */
	static const char doc[] = "{\"id\":\"in\",\"kind\":\"ingest\",\"text\":\"a b c. d e f.\"}";

	assert_int_equal(agent_db_open(&db, pg.url, err, sizeof(err)), 0);
	assert_int_equal(agent_db_migrate(db, "config/sql", NULL, err, sizeof(err)), 0);
	ctx = (struct agent_ctx){ .db = db, .llm = &fake_llm, .chunk_tokens = 16 };
	assert_int_equal(proto_task_parse(doc, strlen(doc), &t, err, sizeof(err)), 0);
	assert_int_equal(agent_run_task(&ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	agent_db_close(db);

	snprintf(stream, sizeof(stream), "swarm:it:agentd:r:%d:tasks", (int)getpid());
	snprintf(dead, sizeof(dead), "swarm:it:agentd:r:%d:dead", (int)getpid());
	snprintf(results, sizeof(results), "swarm:it:agentd:r:%d:results", (int)getpid());
	assert_int_equal(it_parse_redis_url(it_redis_url(), host, sizeof(host), &port), 0);
	r = redisConnect(host, port);
	assert_non_null(r);
	for (int i = 0; i < N_TASKS; i++) {
		snprintf(task, sizeof(task),
			 "{\"id\":\"q%d\",\"kind\":\"answer\",\"question\":\"question %d\"}", i, i);
		rep = redisCommand(r, "XADD %s * task %s", stream, task);
		freeReplyObject(rep);
	}

	sw_config_defaults(&cfg);
	snprintf(cfg.redis.url, sizeof(cfg.redis.url), "%s", it_redis_url());
	snprintf(cfg.postgres.url, sizeof(cfg.postgres.url), "%s", pg.url);
	cfg.agentd.max_attempts = 5;
	cfg.agentd.lease_ms = 2000;
	cfg.agentd.heartbeat_ms = 200;
	cfg.agentd.max_tasks_per_worker = 0;
	agent_worker_reset();
	for (int i = 0; i < N_WORKERS; i++) {
		th[i] = (struct th){ 0 };
		snprintf(th[i].name, sizeof(th[i].name), "r%d", i);
		th[i].o = (struct agent_worker_opts){
			.cfg = &cfg, .sql_dir = "config/sql", .heartbeat_fd = -1,
			.consumer = th[i].name, .stream = stream, .dead_stream = dead,
			.results_stream = results, .block_ms = 50, .llm = &fake_llm,
		};
		assert_int_equal(pthread_create(&tid[i], NULL, run, &th[i]), 0);
	}

	c = PQconnectdb(pg.url);
	assert_true(at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'",
					40, 30000, 20));
	at_pg_restart(&pg);
	assert_true(at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'",
					120, 30000, 20));
	at_pg_restart(&pg);
	if (!at_pg_wait_at_least(&c, "SELECT count(*) FROM tasks WHERE status <> 'running'",
				 N_TASKS, 60000, 20))
		fprintf(stderr, "only %lld of %d tasks finished\n",
			at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status <> 'running'"),
			N_TASKS);
	for (int i = 0; i < 100; i++) { /* the last acks follow the last commits */
		rep = redisCommand(r, "XPENDING %s agents", stream);
		if (rep->element[0]->integer == 0) {
			freeReplyObject(rep);
			break;
		}
		freeReplyObject(rep);
		sw_sleep_ms(50);
	}
	agent_worker_stop();
	for (int i = 0; i < N_WORKERS; i++) {
		pthread_join(tid[i], NULL);
		assert_int_equal(th[i].rc, 0);
		outages += th[i].st.outages;
	}
	fprintf(stderr, "restart: %llu outage episodes over %d workers\n",
		(unsigned long long)outages, N_WORKERS);
	assert_true(outages >= 2);
	assert_int_equal(at_pg_count(&c, "SELECT count(*) FROM tasks WHERE status = 'completed'"),
			 N_TASKS);
	assert_int_equal(at_pg_count(&c, "SELECT count(*) FROM answers"), N_TASKS);
	rep = redisCommand(r, "XPENDING %s agents", stream);
	assert_int_equal(rep->element[0]->integer, 0);
	freeReplyObject(rep);
	rep = redisCommand(r, "XLEN %s", dead);
	assert_int_equal(rep->integer, 0);
	freeReplyObject(rep);
	rep = redisCommand(r, "XLEN %s", results);
	assert_true(rep->integer >= N_TASKS); /* at least once */
	freeReplyObject(rep);
	rep = redisCommand(r, "DEL %s %s %s", stream, dead, results);
	freeReplyObject(rep);
	redisFree(r);
	PQfinish(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_restarts_under_200_tasks),
	};
	int rc = it_start(IT_REDIS);

	if (rc)
		return rc;
	if (at_pg_start(&pg, "/tmp/agentd-pg-XXXXXX") != 0) {
		fprintf(stderr, "could not start a private PostgreSQL\n");
		at_pg_stop(&pg);
		return it_ci() ? IT_EXIT_FAIL : IT_EXIT_SKIP;
	}
	signal(SIGPIPE, SIG_IGN);
	sw_log_init("agentd-restart-test", SW_LOG_ERROR);
	agent_fetch_global_init(NULL, 0);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	at_pg_stop(&pg);
	return rc;
}
