/* log_test.c - filtering before evaluation, line format, files, reopen on
 * rename and SIGUSR1, bad paths, truncation, concurrent writers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"

static char dir[64];
static char path[128];
static char rotated[128];

static int calls;

static int count_call(void)
{
	return ++calls;
}

/* Reads the whole file into a static buffer; returns its length. */
static char filebuf[1 << 20];

static size_t slurp(const char *p)
{
	FILE *f = fopen(p, "r");
	if (!f) {
		filebuf[0] = '\0';
		return 0;
	}
	size_t n = fread(filebuf, 1, sizeof(filebuf) - 1, f);
	fclose(f);
	filebuf[n] = '\0';
	return n;
}

static size_t count_lines(const char *s)
{
	size_t n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/sw_log_test.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/test.log", dir);
	snprintf(rotated, sizeof(rotated), "%s/test.log.1", dir);
	sw_log_init("logtest", SW_LOG_DEBUG);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	sw_log_open(NULL);
	unlink(path);
	unlink(rotated);
	rmdir(dir);
	return 0;
}

/* Each test starts with a fresh file. */
static int fresh(void **state)
{
	(void)state;
	unlink(path);
	unlink(rotated);
	sw_log_init("logtest", SW_LOG_DEBUG);
	return sw_log_open(path);
}

static void test_filtered_args_not_evaluated(void **state)
{
	(void)state;
	calls = 0;
	sw_log_level = SW_LOG_WARN;
	log_debug("%d", count_call());
	log_info("%d", count_call());
	assert_int_equal(calls, 0);
	log_warn("warn %d", count_call());
	log_error("error %d", count_call());
	assert_int_equal(calls, 2);

	sw_log_level = SW_LOG_ERROR;
	log_warn("%d", count_call());
	assert_int_equal(calls, 2);

	slurp(path);
	assert_int_equal(count_lines(filebuf), 2);
	assert_non_null(strstr(filebuf, " W logtest["));
	assert_non_null(strstr(filebuf, "warn 1\n"));
	assert_non_null(strstr(filebuf, " E logtest["));
	assert_non_null(strstr(filebuf, "error 2\n"));
	sw_log_level = SW_LOG_DEBUG;
}

static void test_line_format(void **state)
{
	(void)state;
	log_info("hello %d", 42);
	log_debug("trailing newline is not doubled\n");
	slurp(path);
	assert_int_equal(count_lines(filebuf), 2);

	/* 2026-11-29T08:00:00.123Z I logtest[42] test_line_format: hello 42 */
	const char *l = filebuf;
	assert_true(strlen(l) > 25);
	for (int i = 0; i < 24; i++) {
		if (i == 4 || i == 7)
			assert_int_equal(l[i], '-');
		else if (i == 10)
			assert_int_equal(l[i], 'T');
		else if (i == 13 || i == 16)
			assert_int_equal(l[i], ':');
		else if (i == 19)
			assert_int_equal(l[i], '.');
		else if (i == 23)
			assert_int_equal(l[i], 'Z');
		else
			assert_true(l[i] >= '0' && l[i] <= '9');
	}
	char want[128];
	snprintf(want, sizeof(want), " I logtest[%ld] test_line_format: hello 42\n", (long)getpid());
	assert_memory_equal(l + 24, want, strlen(want));
	assert_non_null(strstr(filebuf, " D logtest["));
	assert_non_null(strstr(filebuf, "trailing newline is not doubled\n"));
	assert_null(strstr(filebuf, "doubled\n\n"));

	/* Created 0640 (less whatever the umask removes). */
	mode_t mask = umask(0);
	umask(mask);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0640 & ~mask);
}

static void test_errno_kept(void **state)
{
	(void)state;
	errno = ENOENT;
	log_error("open failed: %m");
	assert_int_equal(errno, ENOENT);
	slurp(path);
	assert_non_null(strstr(filebuf, "open failed: No such file or directory\n"));
}

static void test_long_line_truncated(void **state)
{
	(void)state;
	static char big[10000];
	memset(big, 'x', sizeof(big) - 1);
	log_info("%s", big);
	log_info("after");
	size_t n = slurp(path);
	assert_int_equal(count_lines(filebuf), 2);
	char *nl = strchr(filebuf, '\n');
	assert_int_equal(nl - filebuf + 1, 4096);
	assert_memory_equal(nl - 3, "...", 3);
	assert_non_null(strstr(nl, "after\n"));
	assert_true(n > 4096);
}

static void test_reopen_after_rename(void **state)
{
	(void)state;
	log_info("line A");
	assert_int_equal(rename(path, rotated), 0);
	log_info("line B"); /* still the old (renamed) file */
	assert_int_equal(sw_log_reopen(), 0);
	log_info("line C");

	slurp(rotated);
	assert_non_null(strstr(filebuf, "line A"));
	assert_non_null(strstr(filebuf, "line B"));
	assert_null(strstr(filebuf, "line C"));
	slurp(path);
	assert_int_equal(count_lines(filebuf), 1);
	assert_non_null(strstr(filebuf, "line C"));
}

static void test_reopen_on_sigusr1(void **state)
{
	(void)state;
	struct stat st;

	assert_int_equal(sw_log_install_sigusr1(), 0);
	log_info("before rotate");
	assert_int_equal(rename(path, rotated), 0);
	assert_int_equal(raise(SIGUSR1), 0);
	/* The handler only sets a flag: nothing is reopened yet. */
	assert_int_equal(stat(path, &st), -1);
	log_info("after rotate");
	assert_int_equal(stat(path, &st), 0);

	slurp(rotated);
	assert_non_null(strstr(filebuf, "before rotate"));
	assert_null(strstr(filebuf, "after rotate"));
	slurp(path);
	assert_non_null(strstr(filebuf, "after rotate"));
	assert_int_equal(count_lines(filebuf), 1);
	signal(SIGUSR1, SIG_DFL);
}

static void test_bad_path_keeps_old_target(void **state)
{
	(void)state;
	assert_int_equal(sw_log_open("/nonexistent-swarm-dir/x.log"), -ENOENT);
	char longpath[5000];
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = '\0';
	assert_int_equal(sw_log_open(longpath), -ENAMETOOLONG);
	log_info("still here");
	slurp(path);
	assert_non_null(strstr(filebuf, "still here"));

	/* Reopen fails when the path became a directory (fails even for
	 * root); lines keep going to the old, renamed file. */
	assert_int_equal(rename(path, rotated), 0);
	assert_int_equal(mkdir(path, 0700), 0);
	assert_int_equal(sw_log_reopen(), -EISDIR);
	log_info("kept going");
	assert_int_equal(rmdir(path), 0);
	slurp(rotated);
	assert_non_null(strstr(filebuf, "kept going"));
}

static void test_level_names(void **state)
{
	(void)state;
	assert_int_equal(sw_log_level_parse("error"), SW_LOG_ERROR);
	assert_int_equal(sw_log_level_parse("WARN"), SW_LOG_WARN);
	assert_int_equal(sw_log_level_parse("warning"), SW_LOG_WARN);
	assert_int_equal(sw_log_level_parse("Info"), SW_LOG_INFO);
	assert_int_equal(sw_log_level_parse("debug"), SW_LOG_DEBUG);
	assert_int_equal(sw_log_level_parse("verbose"), -1);
	assert_int_equal(sw_log_level_parse(""), -1);
	assert_int_equal(sw_log_level_parse(NULL), -1);
	assert_string_equal(sw_log_level_name(SW_LOG_WARN), "warn");
	assert_string_equal(sw_log_level_name(SW_LOG_DEBUG), "debug");
	assert_string_equal(sw_log_level_name(7), "unknown");
	assert_string_equal(sw_log_level_name(-1), "unknown");
}

#define THREADS 4
#define LINES 200

static void *writer(void *arg)
{
	int t = (int)(intptr_t)arg;
	for (int i = 0; i < LINES; i++)
		log_info("thread %d line %d %s", t, i, "padding-padding-padding-padding");
	return NULL;
}

/* Concurrent lines never interleave: every line is whole. */
static void test_threads(void **state)
{
	(void)state;
	pthread_t th[THREADS];
	for (int t = 0; t < THREADS; t++)
		assert_int_equal(pthread_create(&th[t], NULL, writer, (void *)(intptr_t)t), 0);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);

	slurp(path);
	assert_int_equal(count_lines(filebuf), THREADS * LINES);
	int seen[THREADS] = { 0 };
	for (char *line = filebuf; *line;) {
		char *nl = strchr(line, '\n');
		assert_non_null(nl);
		*nl = '\0';
		int t, i;
		char *msg = strstr(line, "writer: thread ");
		assert_non_null(msg);
		assert_int_equal(sscanf(msg, "writer: thread %d line %d", &t, &i), 2);
		assert_true(t >= 0 && t < THREADS);
		assert_int_equal(i, seen[t]); /* per-thread order kept */
		seen[t]++;
		assert_non_null(strstr(msg, " padding-padding-padding-padding"));
		line = nl + 1;
	}
	for (int t = 0; t < THREADS; t++)
		assert_int_equal(seen[t], LINES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_filtered_args_not_evaluated, fresh),
		cmocka_unit_test_setup(test_line_format, fresh),
		cmocka_unit_test_setup(test_errno_kept, fresh),
		cmocka_unit_test_setup(test_long_line_truncated, fresh),
		cmocka_unit_test_setup(test_reopen_after_rename, fresh),
		cmocka_unit_test_setup(test_reopen_on_sigusr1, fresh),
		cmocka_unit_test_setup(test_bad_path_keeps_old_target, fresh),
		cmocka_unit_test(test_level_names),
		cmocka_unit_test_setup(test_threads, fresh),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
