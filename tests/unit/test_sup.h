/* test_sup.h - for the tests that run a supervisor (common/supervise.h in
 * supervise_test, agentd/supervisor.h in agentd_sup_test) in a forked
 * child, with the test binary itself as the fake children: the binary's
 * path, the fakes' SIGTERM flag, the supervisor's exit code, its status
 * file read back, its directory removed. Header-only: each test gets its
 * own static copies. */
#ifndef TEST_SUP_H
#define TEST_SUP_H

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "common/time.h"

/* Set by tsup_on_term: a fake child's SIGTERM. */
static volatile sig_atomic_t tsup_term;

static inline void tsup_on_term(int sig)
{
	(void)sig;
	tsup_term = 1;
}

/* This program's path (what the supervisor runs as its children) into
 * self. Returns 0, or -1 when /proc/self/exe cannot be read. */
static inline int tsup_self(char *self, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", self, len - 1);

	if (n <= 0)
		return -1;
	self[n] = '\0';
	return 0;
}

/* Ends a forked supervisor whose run returned rc, with the exit code 0
 * stopped, 5 every child failed (-EIO), 6 another error (err is printed).
 * _exit skips the destructors, so libuv's threadpool (the probes run on
 * it) is joined first: a thread still running at exit leaves its stack
 * and TLS behind, which valgrind counts as lost. */
static inline _Noreturn void tsup_exit(int rc, const char *err)
{
	if (rc && rc != -EIO)
		fprintf(stderr, "supervisor: %s\n", err);
	uv_library_shutdown();
	_exit(rc == 0 ? 0 : rc == -EIO ? 5 : 6);
}

/* Waits up to ms for the supervisor pid to exit; returns its exit code
 * (128 + the signal that killed it), or -1 after killing it (SIGKILL)
 * when it did not exit in time. */
static inline int tsup_finish(pid_t pid, int ms)
{
	int status;

	for (int t = 0; t < ms; t += 10) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		sw_sleep_ms(10);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}

/* rm -rf dir (a test's temporary directory); says so if that fails. */
static inline void tsup_rmdir(const char *dir)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

/* Entry i of array arr ("children", "workers") of the status file at
 * path, or the document itself when i < 0; NULL when unreadable. *root
 * is the document, for json_decref() either way. */
static inline json_t *tsup_entry(const char *path, const char *arr, int i, json_t **root)
{
	*root = json_load_file(path, 0, NULL);
	if (!*root)
		return NULL;
	if (i < 0)
		return *root;
	return json_array_get(json_object_get(*root, arr), (size_t)i);
}

/* Integer member key of tsup_entry(path, arr, i); -1 when unreadable,
 * absent or not an integer. */
static inline long long tsup_int(const char *path, const char *arr, int i, const char *key)
{
	json_t *root, *e = tsup_entry(path, arr, i, &root);
	long long v = -1;

	if (e && json_is_integer(json_object_get(e, key)))
		v = json_integer_value(json_object_get(e, key));
	json_decref(root);
	return v;
}

/* String member key of tsup_entry(path, arr, i) into out; "" when
 * unreadable, absent or not a string. */
static inline void tsup_str(const char *path, const char *arr, int i, const char *key, char *out,
			    size_t len)
{
	json_t *root, *e = tsup_entry(path, arr, i, &root);
	const char *v = e ? json_string_value(json_object_get(e, key)) : NULL;

	snprintf(out, len, "%s", v ? v : "");
	json_decref(root);
}

/* Polls tsup_int() every 10 ms until it is at least at_least; false when
 * ms passed first. */
static inline bool tsup_wait_int(const char *path, const char *arr, int i, const char *key,
				 long long at_least, int ms)
{
	for (int t = 0; t < ms; t += 10) {
		if (tsup_int(path, arr, i, key) >= at_least)
			return true;
		sw_sleep_ms(10);
	}
	return false;
}

#endif
