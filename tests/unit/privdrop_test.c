/* privdrop_test.c - from root to the configured user (common/privdrop.h):
 * nothing to do, an unknown user, and (as root, in a forked child) the
 * switch itself, its checks, and the refusals once switched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/privdrop.h"

static void test_nothing_to_do(void **state)
{
	char err[SW_ERR_MAX] = "";
	bool sw = true;

	(void)state;
	assert_int_equal(sw_privdrop(NULL, &sw, err, sizeof(err)), 0);
	assert_false(sw);
	assert_int_equal(sw_privdrop("", &sw, err, sizeof(err)), 0);
	assert_false(sw);
	/* the user we already are */
	struct passwd *pw = getpwuid(geteuid());
	assert_non_null(pw);
	assert_int_equal(sw_privdrop(pw->pw_name, &sw, err, sizeof(err)), 0);
	assert_false(sw);
	assert_int_equal(getuid(), pw->pw_uid);
}

static void test_unknown_user(void **state)
{
	char err[SW_ERR_MAX] = "";
	bool sw = true;

	(void)state;
	assert_int_equal(sw_privdrop("no-such-user-xyz", &sw, err, sizeof(err)), -ENOENT);
	assert_false(sw);
	assert_non_null(strstr(err, "user no-such-user-xyz: no such user"));
	assert_int_equal(sw_privdrop("4000000000", &sw, err, sizeof(err)), -ENOENT);
}

/* In the child: the checks, as an exit code (0 = all held). */
static int child(const struct passwd *nb)
{
	char err[SW_ERR_MAX];
	uid_t r, e, s;
	gid_t gr, ge, gs, groups[64];
	bool sw = false;
	int n;

	if (sw_privdrop(nb->pw_name, &sw, err, sizeof(err)) != 0 || !sw)
		return 1;
	if (getresuid(&r, &e, &s) || r != nb->pw_uid || e != nb->pw_uid || s != nb->pw_uid)
		return 2;
	if (getresgid(&gr, &ge, &gs) || gr != nb->pw_gid || ge != nb->pw_gid || gs != nb->pw_gid)
		return 3;
	n = getgroups(64, groups);
	for (int i = 0; i < n; i++)
		if (groups[i] == 0)
			return 4;
	if (setuid(0) == 0 || seteuid(0) == 0)
		return 5;
	/* once switched: the same user again is fine, another is refused */
	if (sw_privdrop(nb->pw_name, &sw, err, sizeof(err)) != 0 || sw)
		return 6;
	if (sw_privdrop("root", &sw, err, sizeof(err)) != -EPERM ||
	    !strstr(err, "not root: cannot switch to user root"))
		return 7;
	return 0;
}

static void test_switch_as_root(void **state)
{
	struct passwd *nb;
	int status;
	pid_t pid;

	(void)state;
	nb = getpwnam("nobody");
	if (geteuid() != 0 || !nb)
		skip();
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(child(nb));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(geteuid(), 0); /* the parent kept root */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nothing_to_do),
		cmocka_unit_test(test_unknown_user),
		cmocka_unit_test(test_switch_as_root),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
