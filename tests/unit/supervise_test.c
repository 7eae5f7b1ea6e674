/* supervise_test.c - common/supervise.h with fake children: this test
 * binary run as `<self> child MODE DIR`, which plays a child according to
 * MODE:
 *   crash     exits 3 at once;
 *   run       sleeps until SIGTERM, then exits 0;
 *   stay      as run, and outlives its supervisor (the others die with it);
 *   chatty    writes a 100-byte line to stdout every millisecond until
 *             SIGTERM;
 *   fixable   exits 3 unless DIR/fixed exists, else as run;
 *   usr1      as run, and counts the SIGUSR1s it gets in DIR/usr1-PID.
 * Each supervisor runs in a forked child (it owns SIGTERM there); the test
 * reads its status file (the default document) and signals it. The probe
 * of a supervisor says child 0 is ready once DIR/go exists, and any other
 * child at once; and that a running child is alive unless DIR/sick
 * exists.
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/err.h"
#include "common/log.h"
#include "common/supervise.h"
#include "common/time.h"
#include "tests/unit/test_sup.h"

#define MAXC 4

static char self[4096];

/* --- the fake child ------------------------------------------------------- */

static volatile sig_atomic_t usr1s;

static void on_usr1(int sig)
{
	(void)sig;
	usr1s++;
}

/* DIR/usr1-PID holds n (written whole, then renamed). */
static void write_count(const char *dir, int n)
{
	char p[512], tmp[520];
	FILE *f;

	snprintf(p, sizeof(p), "%s/usr1-%d", dir, (int)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", p);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%d\n", n);
	fclose(f);
	rename(tmp, p);
}

static bool exists(const char *dir, const char *name)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

static int fake_child(const char *mode, const char *dir)
{
	char line[101];

	if (strcmp(mode, "stay") != 0)
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* no orphans from a failed test */
	signal(SIGTERM, tsup_on_term);
	if (strcmp(mode, "usr1") == 0)
		signal(SIGUSR1, on_usr1);
	if (strcmp(mode, "crash") == 0 || (strcmp(mode, "fixable") == 0 && !exists(dir, "fixed")))
		return 3;
	memset(line, 'x', sizeof(line) - 1);
	line[sizeof(line) - 2] = '\n';
	line[sizeof(line) - 1] = '\0';
	while (!tsup_term) {
		if (strcmp(mode, "chatty") == 0) {
			if (fputs(line, stdout) < 0 || fflush(stdout) != 0)
				return 4;
			sw_sleep_ms(1);
		} else {
			int seen = usr1s;

			if (seen)
				write_count(dir, seen);
			sw_sleep_ms(20);
		}
	}
	return 0;
}

/* --- the supervisor under test -------------------------------------------- */

struct run {
	char dir[64], status[128], log[128];
	char sup_log[128];  /* "": the supervisor logs to stderr */
	pid_t pid;
	char *argv[MAXC][5];
	char names[MAXC][16];
	struct sw_sup_child ch[MAXC];
	struct sw_sup_opts o;
	bool fail_before_spawn;
};

static int probe(void *user, unsigned i, int pid, bool live, char *err, size_t errlen)
{
	struct run *r = user;

	(void)pid;
	if (live && exists(r->dir, "sick"))
		return sw_seterr(err, errlen, -ETIMEDOUT, "no answer (sick)");
	/* a probe that does not come back until the test lets it (5 s at most) */
	for (int k = 0; !live && k < 500 && exists(r->dir, "stuck"); k++)
		sw_sleep_ms(10);
	if (!live && i == 0 && !exists(r->dir, "go"))
		return sw_seterr(err, errlen, -EAGAIN, "no %s/go yet", r->dir);
	return 0;
}

static int before_spawn(void *user, unsigned i, char *err, size_t errlen)
{
	struct run *r = user;

	(void)i;
	if (r->fail_before_spawn)
		return sw_seterr(err, errlen, -EACCES, "refused by the hook");
	return 0;
}

static const struct sw_sup_ops probe_ops = { .probe = probe, .before_spawn = before_spawn };
static const struct sw_sup_ops plain_ops = { .before_spawn = before_spawn };

/* Sets up n children in mode, their output in r->log; the caller adjusts
 * r->o and r->ch, then calls launch(). */
static void prepare(struct run *r, unsigned n, const char *mode)
{
	memset(r, 0, sizeof(*r));
	snprintf(r->dir, sizeof(r->dir), "/tmp/sw-sup-unit-XXXXXX");
	assert_non_null(mkdtemp(r->dir));
	snprintf(r->status, sizeof(r->status), "%s/status.json", r->dir);
	snprintf(r->log, sizeof(r->log), "%s/child.log", r->dir);
	for (unsigned i = 0; i < n; i++) {
		snprintf(r->names[i], sizeof(r->names[i]), "c%u", i);
		r->argv[i][0] = "fake";
		r->argv[i][1] = "child";
		r->argv[i][2] = (char *)mode;
		r->argv[i][3] = r->dir;
		r->argv[i][4] = NULL;
		r->ch[i] = (struct sw_sup_child){ .name = r->names[i], .file = self,
						  .argv = r->argv[i], .log_path = r->log };
	}
	r->o = (struct sw_sup_opts){
		.children = r->ch,
		.n_children = n,
		.policy = { .backoff_min_ms = 10, .backoff_max_ms = 40, .crash_window_ms = 10000,
			    .crash_limit = 2, .drain_ms = 2000, .quick_exit_ms = 1000 },
		.ops = &plain_ops,
		.user = r,
		.status_path = r->status,
		.probe_ms = 20,
	};
}

/* Forks the supervisor. Its exit status: 0 stopped, 5 every child failed
 * (-EIO), 6 another error. */
static void launch(struct run *r)
{
	r->pid = fork();
	assert_true(r->pid >= 0);
	if (r->pid == 0) {
		char err[SW_ERR_MAX];
		int rc;

		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
		if (r->sup_log[0] && sw_log_open(r->sup_log) != 0)
			_exit(7);
		rc = sw_sup_run(&r->o, err, sizeof(err));
		tsup_exit(rc, err);
	}
}

static int finish(struct run *r, int ms)
{
	return tsup_finish(r->pid, ms);
}

static void cleanup(struct run *r)
{
	tsup_rmdir(r->dir);
}

static void touch(struct run *r, const char *name)
{
	char p[256];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", r->dir, name);
	f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
}

/* Integer field of child i (of the root when i < 0); -1 when unreadable. */
static long long cint(struct run *r, int i, const char *key)
{
	return tsup_int(r->status, "children", i, key);
}

static bool cbool(struct run *r, int i, const char *key)
{
	json_t *root, *c = tsup_entry(r->status, "children", i, &root);
	bool v = c && json_is_true(json_object_get(c, key));

	json_decref(root);
	return v;
}

/* String field of child i (of the root when i < 0); "" when absent. */
static void cstr(struct run *r, int i, const char *key, char *out, size_t len)
{
	tsup_str(r->status, "children", i, key, out, len);
}

static bool wait_state(struct run *r, int i, const char *state, int ms)
{
	char s[32];

	for (int t = 0; t < ms; t += 10) {
		cstr(r, i, "state", s, sizeof(s));
		if (strcmp(s, state) == 0)
			return true;
		sw_sleep_ms(10);
	}
	return false;
}

static bool wait_int(struct run *r, int i, const char *key, long long at_least, int ms)
{
	return tsup_wait_int(r->status, "children", i, key, at_least, ms);
}

static bool alive(pid_t pid)
{
	return pid > 0 && kill(pid, 0) == 0;
}

/* --- tests ---------------------------------------------------------------- */

static void test_bad_options(void **state)
{
	struct sw_sup_opts o = { 0 };
	struct sw_sup_child c = { .name = "x", .file = "/bin/true" };
	char err[SW_ERR_MAX];

	(void)state;
	assert_int_equal(sw_sup_run(&o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "nothing to supervise"));
	o.children = &c;
	o.n_children = 1;
	o.policy.crash_limit = 1;
	assert_int_equal(sw_sup_run(&o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "backoff"));
	o.policy.backoff_min_ms = 10;
	o.policy.backoff_max_ms = 5;
	assert_int_equal(sw_sup_run(&o, err, sizeof(err)), -EINVAL);
	o.policy.backoff_max_ms = 10;
	assert_int_equal(sw_sup_run(&o, err, sizeof(err)), -EINVAL); /* no argv */
	assert_non_null(strstr(err, "argv"));
}

static void test_crash_loop_marked_failed(void **state)
{
	struct run r;
	char s[64];

	(void)state;
	prepare(&r, 2, "run");
	r.argv[0][2] = "crash";
	launch(&r);
	/* c0 fails after crash_limit + 1 crashes; c1 keeps running */
	assert_true(wait_state(&r, 0, "failed", 20000));
	assert_int_equal(cint(&r, 0, "crashes"), 3);
	assert_int_equal(cint(&r, 0, "spawns"), 3);
	assert_int_equal(cint(&r, 0, "restarts"), 2);
	assert_int_equal(cint(&r, 0, "pid"), 0);
	assert_true(cint(&r, 0, "exited_at") > 0);
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "exit 3");
	cstr(&r, 0, "error", s, sizeof(s));
	assert_string_equal(s, ""); /* no probe: running from the spawn on */
	assert_true(wait_state(&r, 1, "running", 20000));
	assert_true(alive((pid_t)cint(&r, 1, "pid")));
	assert_int_equal(cint(&r, 1, "crashes"), 0);
	cstr(&r, -1, "state", s, sizeof(s));
	assert_string_equal(s, "running");
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cstr(&r, 1, "last_exit", s, sizeof(s));
	assert_string_equal(s, "exit 0");
	cstr(&r, 1, "state", s, sizeof(s));
	assert_string_equal(s, "stopped");
	cleanup(&r);
}

static void test_every_child_failed(void **state)
{
	struct run r;
	char s[64];

	(void)state;
	prepare(&r, 2, "crash");
	r.o.exit_when_all_failed = true;
	launch(&r);
	assert_int_equal(finish(&r, 20000), 5);
	cstr(&r, -1, "state", s, sizeof(s));
	assert_string_equal(s, "failed");
	cleanup(&r);
}

static void test_spawn_failures_count(void **state)
{
	struct run r;
	char s[64];

	(void)state;
	prepare(&r, 2, "run");
	r.ch[0].file = "/nonexistent/child";
	r.fail_before_spawn = false;
	launch(&r);
	assert_true(wait_state(&r, 0, "failed", 20000));
	assert_int_equal(cint(&r, 0, "spawns"), 0);
	assert_int_equal(cint(&r, 0, "crashes"), 3);
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "spawn: ENOENT");
	assert_true(wait_state(&r, 1, "running", 20000));
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);

	/* a before_spawn hook that refuses is a spawn failure with its reason */
	prepare(&r, 1, "run");
	r.fail_before_spawn = true;
	r.o.exit_when_all_failed = true;
	launch(&r);
	assert_int_equal(finish(&r, 20000), 5);
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "spawn: EACCES");
	cstr(&r, 0, "error", s, sizeof(s));
	assert_string_equal(s, "refused by the hook");
	cleanup(&r);
}

static void test_ordered_start_waits_for_probe(void **state)
{
	struct run r;

	(void)state;
	prepare(&r, 3, "run");
	r.o.ordered = true;
	r.o.ops = &probe_ops;
	launch(&r);
	assert_true(wait_state(&r, 0, "starting", 20000));
	sw_sleep_ms(200); /* ten probe periods: c0 stays starting, the others wait */
	assert_true(wait_state(&r, 0, "starting", 10));
	assert_true(wait_state(&r, 1, "waiting", 10));
	assert_true(wait_state(&r, 2, "waiting", 10));
	assert_int_equal(cint(&r, 1, "pid"), 0);
	assert_int_equal(cint(&r, 1, "spawns"), 0);
	touch(&r, "go");
	for (int i = 0; i < 3; i++)
		assert_true(wait_state(&r, i, "running", 20000));
	/* started in order: each spawn no earlier than the one before */
	assert_true(cint(&r, 0, "started_at") <= cint(&r, 1, "started_at"));
	assert_true(cint(&r, 1, "started_at") <= cint(&r, 2, "started_at"));

	/* a restart of c0 holds back nothing that runs, only what starts */
	kill((pid_t)cint(&r, 0, "pid"), SIGKILL);
	assert_true(wait_int(&r, 0, "restarts", 1, 20000));
	assert_true(wait_state(&r, 0, "running", 20000));
	assert_int_equal(cint(&r, 0, "restarts"), 1);
	assert_int_equal(cint(&r, 1, "restarts"), 0);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

static void test_start_timeout_kills(void **state)
{
	struct run r;
	char s[SW_ERR_MAX];

	(void)state;
	prepare(&r, 1, "run");
	r.o.ops = &probe_ops; /* never ready: no go file */
	/* A second: the probe (every 20 ms) must have answered "no" at least
	 * once before the clock runs out. With 100 ms a ThreadSanitizer build
	 * on a loaded CI machine did not always get the first answer back. */
	r.ch[0].start_timeout_ms = 1000;
	launch(&r);
	assert_true(wait_state(&r, 0, "failed", 30000));
	assert_int_equal(cint(&r, 0, "crashes"), 3);
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "signal 9");
	cstr(&r, 0, "error", s, sizeof(s));
	assert_non_null(strstr(s, "not ready within 1000 ms: no "));
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

/* The clock runs out while the first probe is still out: the error says so,
 * rather than giving no reason at all. */
static void test_start_timeout_probe_out(void **state)
{
	struct run r;
	char s[SW_ERR_MAX];

	(void)state;
	prepare(&r, 1, "run");
	r.o.ops = &probe_ops;
	r.ch[0].start_timeout_ms = 200;
	touch(&r, "stuck");
	launch(&r);
	assert_true(wait_int(&r, 0, "crashes", 1, 20000));
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "signal 9");
	cstr(&r, 0, "error", s, sizeof(s));
	assert_string_equal(s, "not ready within 200 ms: its readiness probe has not answered");
	snprintf(s, sizeof(s), "%s/stuck", r.dir);
	assert_int_equal(unlink(s), 0);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

static void test_hang_by_probe(void **state)
{
	struct run r;
	char s[SW_ERR_MAX];

	(void)state;
	prepare(&r, 2, "run");
	r.o.ops = &probe_ops;
	r.o.live_probe_ms = 20;
	r.o.policy.hang_ms = 10000; /* c1: never within the test */
	/* A second: a loaded machine (CI runs tests side by side) can hold the
	 * supervisor's loop or its probe thread off the CPU for a few hundred
	 * ms, which is not what this test is about. */
	r.ch[0].hang_ms = 1000;
	touch(&r, "go");
	launch(&r);
	assert_true(wait_state(&r, 0, "running", 20000));
	assert_true(wait_state(&r, 1, "running", 20000));
	sw_sleep_ms(2000); /* twice the limit: answering, so not hung */
	assert_int_equal(cint(&r, 0, "hangs"), 0);
	assert_int_equal(cint(&r, 0, "spawns"), 1);

	/* c0 stops answering: killed after a second, a crash, restarted */
	touch(&r, "sick");
	assert_true(wait_int(&r, 0, "hangs", 1, 20000));
	snprintf(s, sizeof(s), "%s/sick", r.dir);
	assert_int_equal(unlink(s), 0);
	assert_true(wait_int(&r, 0, "spawns", 2, 20000));
	assert_true(wait_state(&r, 0, "running", 20000));
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "signal 9");
	assert_true(cint(&r, 0, "crashes") >= 1);
	assert_int_equal(cint(&r, 0, "hangs"), cint(&r, 0, "crashes")); /* every death a hang */
	assert_int_equal(cint(&r, 1, "hangs"), 0);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

static void test_sighup_retries_failed(void **state)
{
	struct run r;

	(void)state;
	prepare(&r, 1, "fixable");
	r.o.hup_retries = true;
	launch(&r);
	assert_true(wait_state(&r, 0, "failed", 20000));
	touch(&r, "fixed");
	kill(r.pid, SIGHUP);
	assert_true(wait_state(&r, 0, "running", 20000));
	assert_int_equal(cint(&r, 0, "spawns"), 4);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

static void test_adopt_and_release(void **state)
{
	struct run r;
	pid_t outsider, second;
	char s[32];
	int st;

	(void)state;
	prepare(&r, 1, "stay");
	/* a process the supervisor did not spawn (its parent is the test) */
	outsider = fork();
	assert_true(outsider >= 0);
	if (outsider == 0) {
		execl(self, "fake", "child", "stay", r.dir, (char *)NULL);
		_exit(127);
	}
	r.ch[0].adopt = outsider;
	r.o.stop = SW_SUP_STOP_RELEASE;
	launch(&r);
	assert_true(wait_state(&r, 0, "running", 20000));
	assert_true(cbool(&r, 0, "adopted"));
	assert_int_equal(cint(&r, 0, "pid"), outsider);
	assert_int_equal(cint(&r, 0, "spawns"), 0);

	/* it dies: seen through the pidfd although it is not the
	 * supervisor's child, then spawned as a child */
	kill(outsider, SIGKILL);
	waitpid(outsider, &st, 0);
	assert_true(wait_int(&r, 0, "spawns", 1, 20000));
	assert_true(wait_state(&r, 0, "running", 20000));
	cstr(&r, 0, "last_exit", s, sizeof(s));
	assert_string_equal(s, "gone");
	assert_false(cbool(&r, 0, "adopted"));
	assert_int_equal(cint(&r, 0, "crashes"), 1);
	assert_int_equal(cint(&r, 0, "restarts"), 1);
	second = (pid_t)cint(&r, 0, "pid");
	assert_true(second > 0 && second != outsider);

	/* release: the supervisor goes, the child stays */
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cstr(&r, -1, "state", s, sizeof(s));
	assert_string_equal(s, "stopped");
	assert_true(alive(second));
	kill(second, SIGKILL);
	cleanup(&r);
}

static void test_adopt_gone_pid_spawns(void **state)
{
	struct run r;
	pid_t gone = fork();
	int st;

	(void)state;
	assert_true(gone >= 0);
	if (gone == 0)
		_exit(0);
	waitpid(gone, &st, 0);
	prepare(&r, 1, "run");
	r.ch[0].adopt = gone; /* a stale pid file's pid */
	launch(&r);
	assert_true(wait_state(&r, 0, "running", 20000));
	assert_false(cbool(&r, 0, "adopted"));
	assert_int_equal(cint(&r, 0, "spawns"), 1);
	assert_int_equal(cint(&r, 0, "restarts"), 0);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

/* The SIGUSR1s child process pid counted (usr1 mode); 0 before the first. */
static int usr1_count(struct run *r, long long pid)
{
	char p[160];
	int n = 0;
	FILE *f;

	snprintf(p, sizeof(p), "%s/usr1-%lld", r->dir, pid);
	f = fopen(p, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%d", &n) != 1)
		n = 0;
	fclose(f);
	return n;
}

static bool wait_usr1(struct run *r, long long pid, int n, int ms)
{
	for (int t = 0; t < ms; t += 10) {
		if (usr1_count(r, pid) >= n)
			return true;
		sw_sleep_ms(10);
	}
	return false;
}

static void test_usr1_reaches_started_children(void **state)
{
	struct run r;
	char old[160];
	long long c0, c1;
	struct stat st;

	(void)state;
	prepare(&r, 3, "usr1");
	r.argv[2][2] = "crash"; /* no process to signal once failed */
	r.o.ops = &probe_ops;   /* c0 starting until DIR/go exists */
	r.o.usr1_reopens = true;
	snprintf(r.sup_log, sizeof(r.sup_log), "%s/sup.log", r.dir);
	launch(&r);
	assert_true(wait_state(&r, 1, "running", 20000));
	assert_true(wait_state(&r, 2, "failed", 20000));
	assert_true(wait_state(&r, 0, "starting", 10));
	c0 = cint(&r, 0, "pid");
	c1 = cint(&r, 1, "pid");
	assert_true(c0 > 0 && c1 > 0);

	/* logrotate moved the supervisor's log: SIGUSR1 reopens it, reaches
	 * the running c1 now, and c0 not before it is ready */
	snprintf(old, sizeof(old), "%s.old", r.sup_log);
	assert_int_equal(rename(r.sup_log, old), 0);
	kill(r.pid, SIGUSR1);
	assert_true(wait_usr1(&r, c1, 1, 20000));
	for (int t = 0; t < 20000 && stat(r.sup_log, &st) != 0; t += 10)
		sw_sleep_ms(10);
	assert_int_equal(stat(r.sup_log, &st), 0);
	sw_sleep_ms(200); /* ten of c0's loops: time enough to have counted one */
	assert_int_equal(usr1_count(&r, c0), 0);
	assert_true(alive((pid_t)c0));

	/* c0 becomes ready: it gets the SIGUSR1 it is owed, once */
	touch(&r, "go");
	assert_true(wait_state(&r, 0, "running", 20000));
	assert_true(wait_usr1(&r, c0, 1, 20000));
	assert_int_equal(cint(&r, 0, "pid"), c0);

	/* a second one: both at once; nobody got one twice */
	kill(r.pid, SIGUSR1);
	assert_true(wait_usr1(&r, c0, 2, 20000));
	assert_true(wait_usr1(&r, c1, 2, 20000));
	sw_sleep_ms(100);
	assert_int_equal(usr1_count(&r, c0), 2);
	assert_int_equal(usr1_count(&r, c1), 2);
	assert_int_equal(cint(&r, 0, "spawns"), 1);
	assert_int_equal(cint(&r, 1, "spawns"), 1);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

/* A child that dies while it is owed a signal owes nothing to its next
 * process (which might not handle it yet either). */
static void test_usr1_owed_dies_with_the_process(void **state)
{
	struct run r;
	long long first, second;

	(void)state;
	prepare(&r, 1, "usr1");
	r.o.ops = &probe_ops;
	r.o.usr1_reopens = true;
	launch(&r);
	assert_true(wait_state(&r, 0, "starting", 20000));
	first = cint(&r, 0, "pid");
	assert_true(first > 0);
	kill(r.pid, SIGUSR1);
	sw_sleep_ms(100); /* the supervisor handles it (no observable effect yet) */
	kill((pid_t)first, SIGKILL);
	assert_true(wait_int(&r, 0, "spawns", 2, 20000));
	second = cint(&r, 0, "pid");
	assert_true(second > 0 && second != first);
	touch(&r, "go");
	assert_true(wait_state(&r, 0, "running", 20000));
	sw_sleep_ms(200);
	assert_int_equal(usr1_count(&r, second), 0);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	cleanup(&r);
}

static long long file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static void test_child_log_bounded(void **state)
{
	struct run r;
	char p1[160], p2[160], p3[160];

	(void)state;
	prepare(&r, 1, "chatty");
	r.ch[0].log_path = r.log;
	r.o.log_max_bytes = 20000;
	r.o.log_keep = 2;
	launch(&r);
	snprintf(p1, sizeof(p1), "%s.1", r.log);
	snprintf(p2, sizeof(p2), "%s.2", r.log);
	snprintf(p3, sizeof(p3), "%s.3", r.log);
	/* ~100 KB/s: the first rotation within a second or two, the second
	 * one a second later */
	for (int t = 0; t < 20000 && file_size(p2) < 0; t += 50)
		sw_sleep_ms(50);
	kill(r.pid, SIGTERM);
	assert_int_equal(finish(&r, 20000), 0);
	assert_true(file_size(p1) > 20000);
	assert_true(file_size(p2) > 20000);
	assert_int_equal(file_size(p3), -1);
	/* the child wrote with O_APPEND after each truncation: the live
	 * file is whole lines from its start (no hole of zeros) */
	{
		FILE *f = fopen(r.log, "r");
		int ch, first;

		assert_non_null(f);
		first = fgetc(f);
		assert_true(first == 'x' || first == EOF);
		while ((ch = fgetc(f)) != EOF)
			assert_true(ch == 'x' || ch == '\n');
		fclose(f);
	}
	cleanup(&r);
}

static void write_bytes(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void read_text(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t n;

	out[0] = '\0';
	if (!f)
		return;
	n = fread(out, 1, cap - 1, f);
	out[n] = '\0';
	fclose(f);
}

static void test_rotate(void **state)
{
	char dir[] = "/tmp/sw-rot-XXXXXX", p[128], p1[140], p2[140], p3[140], t[64];
	char cmd[128];

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/x.log", dir);
	snprintf(p1, sizeof(p1), "%s.1", p);
	snprintf(p2, sizeof(p2), "%s.2", p);
	snprintf(p3, sizeof(p3), "%s.3", p);
	assert_int_equal(sw_sup_rotate(p, 4, 2), 0); /* missing: nothing to do */
	write_bytes(p, "abcd");
	assert_int_equal(sw_sup_rotate(p, 4, 2), 0); /* at the bound: kept */
	write_bytes(p, "first\n");
	assert_int_equal(sw_sup_rotate(p, 4, 2), 1);
	read_text(p1, t, sizeof(t));
	assert_string_equal(t, "first\n");
	assert_int_equal(file_size(p), 0);
	write_bytes(p, "second\n");
	assert_int_equal(sw_sup_rotate(p, 4, 2), 1);
	write_bytes(p, "third\n");
	assert_int_equal(sw_sup_rotate(p, 4, 2), 1);
	read_text(p1, t, sizeof(t));
	assert_string_equal(t, "third\n");
	read_text(p2, t, sizeof(t));
	assert_string_equal(t, "second\n");
	assert_int_equal(file_size(p3), -1); /* "first" dropped: keep = 2 */
	write_bytes(p, "fourth\n");
	assert_int_equal(sw_sup_rotate(p, 4, 0), 1); /* keep 0: truncated only */
	assert_int_equal(file_size(p), 0);
	read_text(p1, t, sizeof(t));
	assert_string_equal(t, "third\n");
	/* an unreadable directory entry: an error, nothing truncated */
	write_bytes(p, "fifth\n");
	chmod(p, 0);
	if (geteuid() != 0) {
		assert_int_equal(sw_sup_rotate(p, 4, 2), -EACCES);
		chmod(p, 0644);
		assert_int_equal(file_size(p), 6);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_options),
		cmocka_unit_test(test_crash_loop_marked_failed),
		cmocka_unit_test(test_every_child_failed),
		cmocka_unit_test(test_spawn_failures_count),
		cmocka_unit_test(test_ordered_start_waits_for_probe),
		cmocka_unit_test(test_start_timeout_kills),
		cmocka_unit_test(test_start_timeout_probe_out),
		cmocka_unit_test(test_hang_by_probe),
		cmocka_unit_test(test_sighup_retries_failed),
		cmocka_unit_test(test_adopt_and_release),
		cmocka_unit_test(test_adopt_gone_pid_spawns),
		cmocka_unit_test(test_usr1_reaches_started_children),
		cmocka_unit_test(test_usr1_owed_dies_with_the_process),
		cmocka_unit_test(test_child_log_bounded),
		cmocka_unit_test(test_rotate),
	};

	/* <self> child MODE DIR */
	if (argc == 4 && strcmp(argv[1], "child") == 0)
		return fake_child(argv[2], argv[3]);
	if (tsup_self(self, sizeof(self)) != 0)
		return 1;
	sw_log_init("supervise-test", SW_LOG_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
