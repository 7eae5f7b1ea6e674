/* agentd_worker_start_test.c - the worker's start-up failures, against
 * real Redis and PostgreSQL: each is reported with its real cause, the
 * start fails, and nothing is left running or open.
 *   - a heartbeat fd that is not open: -EBADF, before any connection;
 *   - the callback thread, then the heartbeat thread, failing to start
 *     (pthread_create is interposed below): -EAGAIN naming the thread,
 *     the thread that did start is joined, the connections are closed,
 *     and the entry waiting in the stream is never claimed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "agentd/worker.h"
#include "common/err.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

/* --- pthread_create that fails on request ------------------------------- */

static _Atomic int create_calls; /* since the last arm_create_failure() */
static _Atomic int create_fail;  /* fail call number n (1-based); 0 = none */

static void arm_create_failure(int n)
{
	create_calls = 0;
	create_fail = n;
}

/* Interposes libc's: the worker (linked statically into this program)
 * calls this one. */
int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

	if (create_fail && ++create_calls == create_fail)
		return EAGAIN;
	if (!real) {
		void *sym = dlsym(RTLD_NEXT, "pthread_create");

		if (!sym)
			abort();
		memcpy(&real, &sym, sizeof(real));
	}
	return real(t, attr, fn, arg);
}

/* --- what a process holds ----------------------------------------------- */

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own fd */
}

static int threads(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int n = -1;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	fclose(f);
	return n;
}

/* --- fixture ------------------------------------------------------------- */

struct fx {
	char dbname[64], dburl[1024];
	char stream[128], dead[128], results[128];
	redisContext *redis;
	struct sw_config cfg;
	struct agent_worker_opts o;
	char err[SW_ERR_MAX];
};

static int counter;

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char host[256];
	int port, n = counter++;

	if (!f)
		return -1;
	snprintf(f->dbname, sizeof(f->dbname), "agentd_wstart_%d_%d", (int)getpid(), n);
	at_db_create(f->dbname, f->dburl, sizeof(f->dburl));
	snprintf(f->stream, sizeof(f->stream), "swarm:it:agentd:ws:%d:%d:tasks", (int)getpid(), n);
	snprintf(f->dead, sizeof(f->dead), "swarm:it:agentd:ws:%d:%d:dead", (int)getpid(), n);
	snprintf(f->results, sizeof(f->results), "swarm:it:agentd:ws:%d:%d:results",
		 (int)getpid(), n);
	if (it_parse_redis_url(it_redis_url(), host, sizeof(host), &port) != 0)
		return -1;
	f->redis = redisConnect(host, port);
	if (!f->redis || f->redis->err)
		return -1;
	sw_config_defaults(&f->cfg);
	snprintf(f->cfg.redis.url, sizeof(f->cfg.redis.url), "%s", it_redis_url());
	snprintf(f->cfg.postgres.url, sizeof(f->cfg.postgres.url), "%s", f->dburl);
	f->cfg.agentd.lease_ms = 400;
	f->cfg.agentd.heartbeat_ms = 100;
	f->o = (struct agent_worker_opts){
		.cfg = &f->cfg,
		.sql_dir = "config/sql",
		.heartbeat_fd = -1,
		.consumer = "ws1",
		.stream = f->stream,
		.dead_stream = f->dead,
		.results_stream = f->results,
		.block_ms = 50,
	};
	agent_worker_reset();
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	arm_create_failure(0);
	at_streams_del(f->redis, f->stream, f->dead, f->results);
	redisFree(f->redis);
	at_db_drop(f->dbname);
	free(f);
	return 0;
}

static void xadd(struct fx *f, const char *task)
{
	redisReply *r = redisCommand(f->redis, "XADD %s * task %s", f->stream, task);

	assert_non_null(r);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	freeReplyObject(r);
}

/* --- tests ---------------------------------------------------------------- */

static void test_bad_heartbeat_fd(void **state)
{
	struct fx *f = *state;
	char want[128];
	int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);

	assert_true(fd >= 0);
	close(fd); /* a number that is not open now */
	f->o.heartbeat_fd = fd;
	assert_int_equal(agent_worker_run(&f->o, NULL, f->err, sizeof(f->err)), -EBADF);
	snprintf(want, sizeof(want), "worker: heartbeat fd %d: %s", fd, sw_strerror(-EBADF));
	assert_string_equal(f->err, want);
}

/* Fails the nth pthread_create of the worker's start and checks that the
 * start fails naming `thread`, with nothing left behind. */
static void expect_thread_failure(struct fx *f, int nth, const char *thread)
{
	static const char task[] = "{\"id\":\"ws-1\",\"kind\":\"ingest\",\"text\":\"hello\"}";
	struct agent_worker_stats st;
	int fds, nthreads, rc;
	char want[256];

	xadd(f, task);
	fds = open_fds();
	nthreads = threads();
	arm_create_failure(nth);
	rc = agent_worker_run(&f->o, &st, f->err, sizeof(f->err));
	arm_create_failure(0);
	assert_int_equal(rc, -EAGAIN);
	snprintf(want, sizeof(want), "worker: cannot start the %s thread: %s", thread,
		 sw_strerror(-EAGAIN));
	assert_string_equal(f->err, want);
	assert_int_equal(st.claimed, 0);
	assert_int_equal(at_redis_pending(f->redis, f->stream), 0);
	assert_int_equal(threads(), nthreads);   /* the one that started was joined */
	assert_int_equal(open_fds(), fds);       /* Redis and PostgreSQL closed */
}

static void test_callback_thread_fails(void **state)
{
	expect_thread_failure(*state, 1, "callback");
}

static void test_heartbeat_thread_fails(void **state)
{
	expect_thread_failure(*state, 2, "heartbeat");
}

static void *nothing(void *arg)
{
	return arg;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_bad_heartbeat_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_callback_thread_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_heartbeat_thread_fails, setup, teardown),
	};
	pthread_t th;
	int rc;

	/* One thread started and joined before any count: ThreadSanitizer
	 * starts a thread of its own at the process's first pthread_create,
	 * which would otherwise count as one the worker left behind. */
	if (pthread_create(&th, NULL, nothing, NULL) != 0 || pthread_join(th, NULL) != 0)
		return 1;
	rc = it_start(IT_REDIS | IT_PG);
	if (rc)
		return rc;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
