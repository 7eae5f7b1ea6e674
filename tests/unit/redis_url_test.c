/* redis_url_test.c - the shared Redis URL parser: every accepted form,
 * defaults, and every error with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/redis_url.h"

static void parse_ok(const char *url, struct sw_redis_url *u)
{
	char err[SW_ERR_MAX] = "";

	assert_int_equal(sw_redis_url_parse(url, u, err, sizeof(err)), 0);
	assert_string_equal(err, "");
}

static void parse_fails(const char *url, const char *msg)
{
	struct sw_redis_url u;
	char err[SW_ERR_MAX] = "";

	memset(&u, 0x5a, sizeof(u));
	assert_int_equal(sw_redis_url_parse(url, &u, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, msg);
	/* nothing half-parsed survives */
	assert_false(u.tls);
	assert_string_equal(u.host, "");
	assert_string_equal(u.password, "");
	assert_string_equal(u.unix_path, "");
	assert_int_equal(u.port, 6379);
	assert_int_equal(u.db, 0);
	if (url)
		assert_null(strstr(err, "hunter2"));
}

static void test_defaults(void **state)
{
	struct sw_redis_url u;

	(void)state;
	parse_ok("redis://localhost", &u);
	assert_false(u.tls);
	assert_string_equal(u.host, "localhost");
	assert_int_equal(u.port, 6379);
	assert_int_equal(u.db, 0);
	assert_string_equal(u.password, "");
	assert_string_equal(u.unix_path, "");
	parse_ok("redis://h/", &u);
	assert_string_equal(u.host, "h");
	assert_int_equal(u.db, 0);
}

static void test_at_in_password(void **state)
{
	struct sw_redis_url u;

	/* The last '@' ends the userinfo: "i@" was taken as the host, and
	 * the config's redacted form of the URL then had no host left
	 * (found by tests/fuzz/fuzz_config.c). */
	(void)state;
	parse_ok("redis://u:p@ss:w@rd@cache:6380/1", &u);
	assert_string_equal(u.password, "p@ss:w@rd");
	assert_string_equal(u.host, "cache");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 1);
	parse_fails("rediss://:secret@i@", "redis: no host in URL");
}

static void test_full(void **state)
{
	struct sw_redis_url u;

	(void)state;
	parse_ok("redis://:pw@10.0.0.1:6380/3", &u);
	assert_string_equal(u.host, "10.0.0.1");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 3);
	assert_string_equal(u.password, "pw");
	parse_ok("redis://alice:s3cret@r:1/1000000", &u);
	assert_string_equal(u.password, "s3cret");
	assert_string_equal(u.host, "r");
	assert_int_equal(u.port, 1);
	assert_int_equal(u.db, 1000000);
	parse_ok("redis://r:65535/", &u);
	assert_int_equal(u.port, 65535);
	assert_int_equal(u.db, 0);
	/* a user name without a password is accepted and ignored */
	parse_ok("redis://bob@r", &u);
	assert_string_equal(u.password, "");
	assert_string_equal(u.host, "r");
	/* an empty password is no password */
	parse_ok("redis://:@r:7000", &u);
	assert_string_equal(u.password, "");
	assert_int_equal(u.port, 7000);
}

static void test_tls(void **state)
{
	struct sw_redis_url u;

	(void)state;
	parse_ok("rediss://:pw@r:6380/2", &u);
	assert_true(u.tls);
	assert_string_equal(u.host, "r");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 2);
	assert_string_equal(u.password, "pw");
}

static void test_unix(void **state)
{
	struct sw_redis_url u;

	(void)state;
	parse_ok("unix:///run/redis.sock", &u);
	assert_string_equal(u.unix_path, "/run/redis.sock");
	assert_string_equal(u.host, "");
	assert_false(u.tls);
	assert_int_equal(u.db, 0);
}

static void test_errors(void **state)
{
	char big[2048];

	(void)state;
	parse_fails(NULL, "redis: no URL");
	parse_fails("", "redis: unsupported URL (expected redis://, rediss:// or unix://)");
	parse_fails("http://:hunter2@r:6379",
		    "redis: unsupported URL (expected redis://, rediss:// or unix://)");
	parse_fails("REDIS://r", "redis: unsupported URL (expected redis://, rediss:// or unix://)");
	parse_fails("unix://", "redis: no socket path in unix:// URL");
	parse_fails("redis://", "redis: no host in URL");
	parse_fails("redis://:hunter2@", "redis: no host in URL");
	parse_fails("redis://:hunter2@:6379/0", "redis: no host in URL");
	parse_fails("rediss:///1", "redis: no host in URL");
	parse_fails("redis://r:", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://r:0", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://r:65536", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://r:-1", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://r:12x", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://r:99999999999999999999999", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://:hunter2@r:6379/x", "redis: bad database number in URL");
	parse_fails("redis://r/1x", "redis: bad database number in URL");
	parse_fails("redis://r/-1", "redis: bad database number in URL");
	parse_fails("redis://r/1000001", "redis: bad database number in URL");
	parse_fails("redis://r:6379/0/1", "redis: bad database number in URL");

	memcpy(big, "unix://", 7);
	memset(big + 7, 'p', SW_REDIS_URL_PATH_MAX);
	big[7 + SW_REDIS_URL_PATH_MAX] = '\0';
	parse_fails(big, "redis: socket path too long");

	memcpy(big, "redis://", 8);
	memset(big + 8, 'h', SW_REDIS_URL_HOST_MAX);
	big[8 + SW_REDIS_URL_HOST_MAX] = '\0';
	parse_fails(big, "redis: host too long in URL");

	memcpy(big, "redis://:", 9);
	memset(big + 9, 'w', SW_REDIS_URL_PASSWORD_MAX);
	memcpy(big + 9 + SW_REDIS_URL_PASSWORD_MAX, "@r", 3);
	parse_fails(big, "redis: password too long");
}

/* The longest fields that fit are accepted in full. */
static void test_limits(void **state)
{
	static struct sw_redis_url u;
	char big[2048];

	(void)state;
	memcpy(big, "unix://", 7);
	memset(big + 7, 'p', SW_REDIS_URL_PATH_MAX - 1);
	big[7 + SW_REDIS_URL_PATH_MAX - 1] = '\0';
	parse_ok(big, &u);
	assert_int_equal(strlen(u.unix_path), SW_REDIS_URL_PATH_MAX - 1);

	memcpy(big, "redis://:", 9);
	memset(big + 9, 'w', SW_REDIS_URL_PASSWORD_MAX - 1);
	memset(big + 9 + SW_REDIS_URL_PASSWORD_MAX - 1, '@', 1);
	memset(big + 9 + SW_REDIS_URL_PASSWORD_MAX, 'h', SW_REDIS_URL_HOST_MAX - 1);
	big[9 + SW_REDIS_URL_PASSWORD_MAX + SW_REDIS_URL_HOST_MAX - 1] = '\0';
	parse_ok(big, &u);
	assert_int_equal(strlen(u.password), SW_REDIS_URL_PASSWORD_MAX - 1);
	assert_int_equal(strlen(u.host), SW_REDIS_URL_HOST_MAX - 1);
}

/* A NULL or short err buffer is fine. */
static void test_no_err_buffer(void **state)
{
	struct sw_redis_url u;
	char small[8];

	(void)state;
	assert_int_equal(sw_redis_url_parse("redis://r:0", &u, NULL, 0), -EINVAL);
	assert_int_equal(sw_redis_url_parse("redis://r:0", &u, small, sizeof(small)), -EINVAL);
	assert_int_equal(strlen(small), sizeof(small) - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_full),
		cmocka_unit_test(test_at_in_password),
		cmocka_unit_test(test_tls),
		cmocka_unit_test(test_unix),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_no_err_buffer),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
