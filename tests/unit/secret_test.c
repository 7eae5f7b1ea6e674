/* secret_test.c - passwords from a private file or the environment
 * (common/secret.h), and a config file's URL password allowed only in a
 * private file (sw_config_load_file). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/err.h"
#include "common/secret.h"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/secret_test.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	unsetenv(SW_SECRET_REDIS_ENV);
	unsetenv(SW_SECRET_PG_ENV);
	sw_secrets_clear();
	return system(cmd) == 0 ? 0 : -1;
}

/* Writes len bytes of text to dir/name with mode; returns the path. */
static const char *put(const char *name, const char *text, size_t len, mode_t mode)
{
	static char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, len, f), len);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

static void test_read_ok(void **state)
{
	char out[SW_SECRET_MAX], err[SW_ERR_MAX] = "";

	(void)state;
	assert_int_equal(sw_secret_read_file(put("a", "s3cret\n", 7, 0600), out, sizeof(out),
					     err, sizeof(err)), 0);
	assert_string_equal(out, "s3cret");
	assert_int_equal(sw_secret_read_file(put("b", "x y\r\n", 5, 0400), out, sizeof(out),
					     err, sizeof(err)), 0);
	assert_string_equal(out, "x y");
	assert_int_equal(sw_secret_read_file(put("c", "nonl", 4, 0600), out, sizeof(out), err,
					     sizeof(err)), 0);
	assert_string_equal(out, "nonl");
	assert_string_equal(err, "");
}

static void refused(const char *path, int code, const char *msg)
{
	char out[SW_SECRET_MAX] = "junk", err[SW_ERR_MAX] = "";

	assert_int_equal(sw_secret_read_file(path, out, sizeof(out), err, sizeof(err)), code);
	assert_string_equal(out, "");
	if (!strstr(err, msg))
		fail_msg("\"%s\" lacks \"%s\"", err, msg);
	assert_null(strstr(err, "pw-body"));
}

static void test_read_refused(void **state)
{
	char big[SW_SECRET_MAX + 8];

	(void)state;
	refused(put("g", "pw-body", 7, 0640), -EPERM, "mode 0640 lets group or others read");
	refused(put("o", "pw-body", 7, 0604), -EPERM, "mode 0604");
	refused(put("w", "pw-body", 7, 0620), -EPERM, "chmod 600");
	refused(put("e", "", 0, 0600), -EINVAL, ": empty");
	refused(put("n", "\n", 1, 0600), -EINVAL, ": empty");
	refused(put("l", "pw-body\nsecond\n", 15, 0600), -EINVAL, "line break");
	refused(put("z", "pw-body\0x", 9, 0600), -EINVAL, "NUL");
	memset(big, 'a', sizeof(big));
	refused(put("big", big, SW_SECRET_MAX, 0600), SW_ETOOLONG, "longer than 255 bytes");
	refused("/nonexistent/pw", -ENOENT, "/nonexistent/pw: No such file or directory");
	refused(dir, -EINVAL, "not a regular file");
}

static void test_load(void **state)
{
	struct sw_config c;
	char err[SW_ERR_MAX] = "";

	(void)state;
	sw_config_defaults(&c);
	assert_int_equal(sw_secrets_load(&c, err, sizeof(err)), 0);
	assert_string_equal(sw_secret_redis(), "");
	assert_string_equal(sw_secret_pg(), "");

	snprintf(c.redis.password_file, sizeof(c.redis.password_file), "%s",
		 put("r", "from-file\n", 10, 0600));
	snprintf(c.postgres.password_file, sizeof(c.postgres.password_file), "%s",
		 put("p", "pg-file", 7, 0600));
	assert_int_equal(sw_secrets_load(&c, err, sizeof(err)), 0);
	assert_string_equal(sw_secret_redis(), "from-file");
	assert_string_equal(sw_secret_pg(), "pg-file");

	/* the environment wins */
	setenv(SW_SECRET_REDIS_ENV, "from-env", 1);
	assert_int_equal(sw_secrets_load(&c, err, sizeof(err)), 0);
	assert_string_equal(sw_secret_redis(), "from-env");
	assert_string_equal(sw_secret_pg(), "pg-file");
	unsetenv(SW_SECRET_REDIS_ENV);

	/* a bad file: the key in the message, the store unchanged */
	put("p", "pg-file", 7, 0644);
	assert_int_equal(sw_secrets_load(&c, err, sizeof(err)), -EPERM);
	if (strncmp(err, "postgres.password_file: ", 24) != 0)
		fail_msg("%s", err);
	assert_string_equal(sw_secret_redis(), "from-env");
	sw_secrets_clear();
	assert_string_equal(sw_secret_pg(), "");
}

/* As root: a file of another user is refused, unless it is the
 * configured `user`'s (swarmctl as root on a unit's password file). */
static void test_owner(void **state)
{
	struct passwd *nb = getpwnam("nobody");
	struct sw_config c;
	char err[SW_ERR_MAX] = "";
	const char *p;

	(void)state;
	if (geteuid() != 0 || !nb)
		skip();
	sw_config_defaults(&c);
	p = put("nb", "nb-secret", 9, 0600);
	assert_int_equal(chown(p, nb->pw_uid, nb->pw_gid), 0);
	snprintf(c.redis.password_file, sizeof(c.redis.password_file), "%s", p);
	assert_int_equal(sw_secrets_load(&c, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "owned by uid"));
	snprintf(c.user, sizeof(c.user), "nobody");
	assert_int_equal(sw_secrets_load(&c, err, sizeof(err)), 0);
	assert_string_equal(sw_secret_redis(), "nb-secret");
}

static void test_config_url_password(void **state)
{
	static const char with_pw[] =
		"{\"redis\": {\"url\": \"redis://:hunter2@127.0.0.1:6379/0\"}}";
	static const char pg_pw[] =
		"{\"postgres\": {\"url\": \"host=db user=s password=hunter2\"}}";
	static const char none[] = "{\"redis\": {\"url\": \"redis://127.0.0.1:6379/0\"}}";
	struct sw_config c;
	char err[SW_ERR_MAX] = "";
	const char *p;

	(void)state;
	sw_config_defaults(&c);
	p = put("open.json", with_pw, sizeof(with_pw) - 1, 0644);
	assert_int_equal(sw_config_load_file(p, &c, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "redis.url holds a password, but the file's mode 0644"));
	assert_non_null(strstr(err, "redis.password_file"));
	assert_null(strstr(err, "hunter2"));
	assert_string_equal(c.redis.url, "redis://127.0.0.1:6379/0"); /* unchanged */
	p = put("pg.json", pg_pw, sizeof(pg_pw) - 1, 0640);
	assert_int_equal(sw_config_load_file(p, &c, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "postgres.url holds a password"));
	assert_null(strstr(err, "hunter2"));
	p = put("private.json", with_pw, sizeof(with_pw) - 1, 0600);
	assert_int_equal(sw_config_load_file(p, &c, err, sizeof(err)), 0);
	assert_string_equal(c.redis.url, "redis://:hunter2@127.0.0.1:6379/0");
	p = put("plain.json", none, sizeof(none) - 1, 0644);
	assert_int_equal(sw_config_load_file(p, &c, err, sizeof(err)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_read_ok, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load, setup, teardown),
		cmocka_unit_test_setup_teardown(test_owner, setup, teardown),
		cmocka_unit_test_setup_teardown(test_config_url_password, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
