/* agentd_sup_test.c - agentd/supervisor.h without servers: the workers
 * are this test binary run as `<self> worker --config MODE --heartbeat-fd
 * 3` (opts.exe), which plays a worker according to MODE:
 *   crash        exits 3 at once;
 *   recycle      beats 3 times (50 ms apart), exits 0;
 *   hang         beats once, then stops (no more beats);
 *   beat         beats every 50 ms, exits 0 on SIGTERM;
 *   deaf         beats every 50 ms, ignores SIGTERM.
 * The supervisor runs in a forked child (it owns SIGTERM there); the test
 * reads its status file and signals it.
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
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "agentd/supervisor.h"
#include "common/err.h"
#include "common/log.h"
#include "common/time.h"
#include "tests/unit/test_sup.h"

static char self[4096];

/* --- the fake worker ------------------------------------------------------ */

static void beat(int n)
{
	char line[64];
	int len = snprintf(line, sizeof(line), "hb %d idle %d -\n", (int)getpid(), n);

	if (write(3, line, (size_t)len) != len)
		_exit(4);
}

static int fake_worker(const char *mode)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a killed supervisor */
	if (strcmp(mode, "crash") == 0)
		return 3;
	if (strcmp(mode, "recycle") == 0) {
		for (int i = 0; i < 3; i++) {
			beat(i);
			sw_sleep_ms(50);
		}
		return 0;
	}
	if (strcmp(mode, "hang") == 0) {
		beat(0);
		for (;;)
			pause();
	}
	if (strcmp(mode, "deaf") == 0)
		signal(SIGTERM, SIG_IGN);
	else
		signal(SIGTERM, tsup_on_term);
	for (int i = 0; !tsup_term; i++) {
		beat(i);
		sw_sleep_ms(50);
	}
	return 0;
}

/* --- the supervisor under test -------------------------------------------- */

struct run {
	char dir[64], status[128];
	pid_t pid;
	struct sw_config cfg;
	struct agent_sup_opts o;
};

/* Forks a supervisor with `workers` fake workers in `mode`. Its exit
 * status: 0 drained, 5 every worker failed (-EIO), 6 another error. */
static void start_drain(struct run *r, const char *mode, uint32_t workers, const char *exe,
			uint32_t drain_ms)
{
	snprintf(r->dir, sizeof(r->dir), "/tmp/agentd-sup-unit-XXXXXX");
	assert_non_null(mkdtemp(r->dir));
	snprintf(r->status, sizeof(r->status), "%s/status.json", r->dir);
	sw_config_defaults(&r->cfg);
	r->cfg.agentd.workers = workers;
	r->cfg.agentd.heartbeat_ms = 100;
	r->cfg.agentd.restart_backoff_min_ms = 10;
	r->cfg.agentd.restart_backoff_max_ms = 40;
	r->cfg.agentd.crash_window_ms = 10000;
	r->cfg.agentd.crash_limit = 2;
	r->o = (struct agent_sup_opts){
		.cfg = &r->cfg,
		.config_path = mode,
		.exe = exe ? exe : self,
		.status_path = r->status,
		.drain_ms = drain_ms,
		.hang_ms = 300,
	};
	r->pid = fork();
	assert_true(r->pid >= 0);
	if (r->pid == 0) {
		char err[SW_ERR_MAX];
		int rc = agent_sup_run(&r->o, err, sizeof(err));

		tsup_exit(rc, err);
	}
}

static void start(struct run *r, const char *mode, uint32_t workers, const char *exe)
{
	start_drain(r, mode, workers, exe, 300);
}

static int finish(struct run *r, int ms)
{
	return tsup_finish(r->pid, ms);
}

static void cleanup(struct run *r)
{
	tsup_rmdir(r->dir);
}

/* Integer field of worker `slot` in the status file; -1 when unreadable. */
static long long wint(struct run *r, int slot, const char *key)
{
	return tsup_int(r->status, "workers", slot, key);
}

/* String field ("" when absent) of worker slot, or of the root when slot < 0. */
static void wstr(struct run *r, int slot, const char *key, char *out, size_t len)
{
	tsup_str(r->status, "workers", slot, key, out, len);
}

static bool wait_int(struct run *r, int slot, const char *key, long long at_least, int ms)
{
	return tsup_wait_int(r->status, "workers", slot, key, at_least, ms);
}

/* --- tests ---------------------------------------------------------------- */

static void test_crash_loop_fails_every_worker(void **state)
{
	struct run r;
	char s[32];

	(void)state;
	start(&r, "crash", 2, NULL);
	assert_int_equal(finish(&r, 20000), 5);
	wstr(&r, -1, "state", s, sizeof(s));
	assert_string_equal(s, "failed");
	for (int i = 0; i < 2; i++) {
		assert_int_equal(wint(&r, i, "crashes"), 3);
		assert_int_equal(wint(&r, i, "spawns"), 3);
		assert_int_equal(wint(&r, i, "pid"), 0);
		wstr(&r, i, "state", s, sizeof(s));
		assert_string_equal(s, "failed");
		wstr(&r, i, "last_exit", s, sizeof(s));
		assert_string_equal(s, "exit 3");
	}
	cleanup(&r);
}

static void test_spawn_failure_counts_as_crash(void **state)
{
	struct run r;
	char s[64];

	(void)state;
	start(&r, "beat", 1, "/nonexistent/agentd");
	assert_int_equal(finish(&r, 20000), 5);
	assert_int_equal(wint(&r, 0, "crashes"), 3);
	assert_int_equal(wint(&r, 0, "spawns"), 0);
	wstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "spawn: ENOENT");
	cleanup(&r);
}

static void test_recycle_is_not_a_crash(void **state)
{
	struct run r;
	char s[32];

	(void)state;
	start(&r, "recycle", 1, NULL);
	assert_true(wait_int(&r, 0, "recycles", 3, 20000));
	assert_int_equal(wint(&r, 0, "crashes"), 0);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	wstr(&r, -1, "state", s, sizeof(s));
	assert_string_equal(s, "stopped");
	cleanup(&r);
}

static void test_hung_worker_is_killed(void **state)
{
	struct run r;
	char s[32];

	(void)state;
	start(&r, "hang", 1, NULL);
	assert_true(wait_int(&r, 0, "hangs", 2, 20000));
	assert_true(wint(&r, 0, "crashes") >= 2);
	assert_true(wint(&r, 0, "spawns") >= 2);
	wstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "signal 9");
	kill(r.pid, SIGTERM); /* the default action ends a hanging fake */
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

static void test_drain_then_deadline_kill(void **state)
{
	struct run r, d;
	char s[32];

	(void)state;
	/* a worker that drains on SIGTERM exits 0 */
	start(&r, "beat", 3, NULL);
	for (int i = 0; i < 3; i++)
		assert_true(wait_int(&r, i, "done", 2, 20000));
	wstr(&r, 0, "activity", s, sizeof(s));
	assert_string_equal(s, "idle");
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	for (int i = 0; i < 3; i++) {
		wstr(&r, i, "last_exit", s, sizeof(s));
		assert_string_equal(s, "exit 0");
		wstr(&r, i, "state", s, sizeof(s));
		assert_string_equal(s, "stopped");
		assert_int_equal(wint(&r, i, "crashes"), 0);
	}
	cleanup(&r);

	/* one that ignores it is killed at the drain deadline (300 ms) */
	start(&d, "deaf", 1, NULL);
	assert_true(wait_int(&d, 0, "done", 1, 20000));
	kill(d.pid, SIGTERM);
	assert_int_equal(finish(&d, 20000), 0);
	wstr(&d, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "signal 9");
	cleanup(&d);
}

static void test_second_sigterm_kills(void **state)
{
	struct run r;
	char s[32];

	(void)state;
	start_drain(&r, "deaf", 2, NULL, 60000); /* a deadline the test would notice */
	assert_true(wait_int(&r, 1, "done", 1, 20000));
	kill(r.pid, SIGTERM);
	sw_sleep_ms(20);
	kill(r.pid, SIGINT);
	assert_int_equal(finish(&r, 10000), 0);
	for (int i = 0; i < 2; i++) {
		wstr(&r, i, "last_exit", s, sizeof(s));
		assert_string_equal(s, "signal 9");
	}
	cleanup(&r);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crash_loop_fails_every_worker),
		cmocka_unit_test(test_spawn_failure_counts_as_crash),
		cmocka_unit_test(test_recycle_is_not_a_crash),
		cmocka_unit_test(test_hung_worker_is_killed),
		cmocka_unit_test(test_drain_then_deadline_kill),
		cmocka_unit_test(test_second_sigterm_kills),
	};

	/* <self> worker --config MODE --heartbeat-fd 3 */
	if (argc == 6 && strcmp(argv[1], "worker") == 0)
		return fake_worker(argv[3]);
	if (tsup_self(self, sizeof(self)) != 0)
		return 1;
	sw_log_init("agentd-sup-test", SW_LOG_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
