/* swarmctl_proc_test.c - swarmctl's process helpers (swarmctl/proc.h):
 * pid files that survive pid reuse, spawning with exec errors reported,
 * exit statuses, stopping with a deadline and SIGKILL, log tails,
 * mkdir -p. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "swarmctl/proc.h"

static char dir[] = "/tmp/swarmctl_proc_test.XXXXXX";

static void path_in(char *out, size_t cap, const char *name)
{
	assert_true((size_t)snprintf(out, cap, "%s/%s", dir, name) < cap);
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
}

static void test_start_ticks(void **state)
{
	(void)state;
	assert_true(ctl_proc_start_ticks(getpid()) > 0);
	assert_int_equal(ctl_proc_start_ticks(0), 0);
	assert_int_equal(ctl_proc_start_ticks(-5), 0);
	assert_true(ctl_proc_uptime_s(getpid()) >= 0);
	assert_true(ctl_proc_uptime_s(0) < 0);
}

static void test_pidfile(void **state)
{
	char p[PATH_MAX], text[64];
	pid_t child;
	int st;

	(void)state;
	path_in(p, sizeof(p), "self.pid");
	assert_int_equal(ctl_pidfile_write(p, getpid()), 0);
	assert_int_equal(ctl_pidfile_live(p), getpid());

	/* same pid, another start time: a reused pid reads as dead, and the
	 * stale file goes */
	snprintf(text, sizeof(text), "%d %llu\n", (int)getpid(),
		 (unsigned long long)ctl_proc_start_ticks(getpid()) + 1);
	write_text(p, text);
	assert_int_equal(ctl_pidfile_live(p), 0);
	assert_int_equal(access(p, F_OK), -1);

	/* a process that exited */
	child = fork();
	assert_true(child >= 0);
	if (child == 0)
		_exit(0);
	assert_int_equal(waitpid(child, &st, 0), child);
	snprintf(text, sizeof(text), "%d 12345\n", (int)child);
	write_text(p, text);
	assert_int_equal(ctl_pidfile_live(p), 0);

	/* garbage and absence */
	write_text(p, "not a pid\n");
	assert_int_equal(ctl_pidfile_live(p), 0);
	assert_int_equal(ctl_pidfile_live(p), 0); /* removed: missing is 0 too */
	path_in(p, sizeof(p), "no-such-dir/x.pid");
	assert_int_equal(ctl_pidfile_write(p, getpid()), -ENOENT);
}

static void test_run(void **state)
{
	char log[PATH_MAX], tail[256];
	char *ok[] = { "sh", "-c", "echo hello; echo oops >&2; exit 3", NULL };
	char *sig[] = { "sh", "-c", "kill -9 $$", NULL };
	char *missing[] = { "/nonexistent/swarm-binary", NULL };

	(void)state;
	path_in(log, sizeof(log), "run.log");
	assert_int_equal(ctl_run(ok, log, NULL), 3);
	ctl_tail(log, 10, tail, sizeof(tail));
	assert_string_equal(tail, "  hello\n  oops");
	assert_int_equal(ctl_run(sig, log, NULL), 128 + SIGKILL);
	/* exec failure is an error here, not a dead child later */
	assert_int_equal(ctl_run(missing, log, NULL), -ENOENT);
	assert_int_equal(ctl_spawn(missing, NULL, log, NULL), -ENOENT);
}

static void test_spawn_env_and_stop(void **state)
{
	char log[PATH_MAX], tail[256];
	char *env[] = { "SWARM_PROC_TEST=42", NULL };
	char *argv[] = { "sh", "-c", "echo v=$SWARM_PROC_TEST; exec sleep 60", NULL };
	bool killed = true;
	pid_t pid;

	(void)state;
	path_in(log, sizeof(log), "spawn.log");
	pid = ctl_spawn(argv, env, log, NULL);
	assert_true(pid > 0);
	for (int i = 0; i < 200; i++) {
		ctl_tail(log, 1, tail, sizeof(tail));
		if (tail[0])
			break;
		usleep(10000);
	}
	assert_string_equal(tail, "  v=42");
	/* its own session: not our process group */
	assert_int_equal(getpgid(pid), pid);
	assert_int_equal(ctl_stop_pid(pid, SIGTERM, 5000, &killed), 0);
	assert_false(killed);
	assert_int_equal(ctl_proc_start_ticks(pid), 0);
	assert_int_equal(ctl_stop_pid(pid, SIGTERM, 100, &killed), -ESRCH);
}

static void test_stop_needs_kill(void **state)
{
	char log[PATH_MAX];
	char *argv[] = { "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done", NULL };
	char tail[64];
	bool killed = false;
	pid_t pid;

	(void)state;
	path_in(log, sizeof(log), "stubborn.log");
	pid = ctl_spawn(argv, NULL, log, NULL);
	assert_true(pid > 0);
	for (int i = 0; i < 200; i++) {
		ctl_tail(log, 1, tail, sizeof(tail));
		if (tail[0])
			break;
		usleep(10000);
	}
	assert_string_equal(tail, "  ready");
	assert_int_equal(ctl_stop_pid(pid, SIGTERM, 200, &killed), 0);
	assert_true(killed);
	assert_int_equal(ctl_proc_start_ticks(pid), 0);
}

static void test_tail(void **state)
{
	char p[PATH_MAX], out[64], big[20000];

	(void)state;
	path_in(p, sizeof(p), "tail.log");
	ctl_tail(p, 3, out, sizeof(out)); /* missing */
	assert_string_equal(out, "");
	write_text(p, "");
	ctl_tail(p, 3, out, sizeof(out));
	assert_string_equal(out, "");
	write_text(p, "a\nb\nc\nd\n\n\n");
	ctl_tail(p, 2, out, sizeof(out));
	assert_string_equal(out, "  c\n  d");
	ctl_tail(p, 10, out, sizeof(out));
	assert_string_equal(out, "  a\n  b\n  c\n  d");
	write_text(p, "no newline");
	ctl_tail(p, 1, out, sizeof(out));
	assert_string_equal(out, "  no newline");
	/* the output is bounded by cap */
	ctl_tail(p, 1, out, 6);
	assert_true(strlen(out) < 6);
	/* a file larger than the tail buffer: its end */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	for (size_t i = 100; i < sizeof(big) - 1; i += 100)
		big[i] = '\n';
	memcpy(big + sizeof(big) - 5, "LAST", 4);
	write_text(p, big);
	{
		char line[256];

		ctl_tail(p, 1, line, sizeof(line));
		assert_int_equal(strlen(line), 2 + 98); /* "  " + the last line */
		assert_non_null(strstr(line, "LAST"));
		assert_int_equal(strncmp(line, "  x", 3), 0);
	}
}

static void test_mkdirs(void **state)
{
	char p[PATH_MAX];
	struct stat st;

	(void)state;
	path_in(p, sizeof(p), "a/b/c");
	assert_int_equal(ctl_mkdirs(p, 0750), 0);
	assert_int_equal(stat(p, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(ctl_mkdirs(p, 0750), 0); /* exists: fine */
	assert_int_equal(ctl_mkdirs("", 0750), -EINVAL);
	/* a component that is a file */
	path_in(p, sizeof(p), "file");
	write_text(p, "");
	path_in(p, sizeof(p), "file/sub");
	assert_int_equal(ctl_mkdirs(p, 0750), -ENOTDIR);
}

static int setup(void **state)
{
	(void)state;
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 16];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_start_ticks),
		cmocka_unit_test(test_pidfile),
		cmocka_unit_test(test_run),
		cmocka_unit_test(test_spawn_env_and_stop),
		cmocka_unit_test(test_stop_needs_kill),
		cmocka_unit_test(test_tail),
		cmocka_unit_test(test_mkdirs),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}
