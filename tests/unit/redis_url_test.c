/* redis_url_test.c - the shared Redis URL parser: every accepted form,
 * defaults, and every error with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
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
	assert_string_equal(u.user, "");
	parse_ok("redis://alice:s3cret@r:1/1000000", &u);
	assert_string_equal(u.password, "s3cret");
	assert_string_equal(u.host, "r");
	assert_int_equal(u.port, 1);
	assert_int_equal(u.db, 1000000);
	assert_string_equal(u.user, "alice");
	parse_ok("redis://r:65535/", &u);
	assert_int_equal(u.port, 65535);
	assert_int_equal(u.db, 0);
	assert_string_equal(u.user, "");
	/* a user name without a password: no AUTH is sent */
	parse_ok("redis://bob@r", &u);
	assert_string_equal(u.user, "bob");
	assert_string_equal(u.password, "");
	assert_string_equal(u.host, "r");
	/* an empty password is no password */
	parse_ok("redis://:@r:7000", &u);
	assert_string_equal(u.password, "");
	assert_int_equal(u.port, 7000);
}

/* RFC 3986 percent-encoding in the userinfo: what a URL library writes for
 * a password with '/', '@', '%' or ':' (and an ACL user's name). */
static void test_percent_encoding(void **state)
{
	struct sw_redis_url u;

	(void)state;
	parse_ok("redis://sw%61rm:a%2Fb%40c%25d%3Ae@cache:6380/2", &u);
	assert_string_equal(u.user, "swarm");
	assert_string_equal(u.password, "a/b@c%d:e");
	assert_string_equal(u.host, "cache");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 2);
	/* lower-case hex too */
	parse_ok("redis://:%2f%2F@r", &u);
	assert_string_equal(u.password, "//");
	/* a '%' not followed by two hex digits stays (unencoded passwords) */
	parse_ok("redis://:50%off%@r", &u);
	assert_string_equal(u.password, "50%off%");
	parse_ok("redis://:%4@r", &u);
	assert_string_equal(u.password, "%4");
	parse_ok("redis://:%zz%4g@r", &u);
	assert_string_equal(u.password, "%zz%4g");
	/* an unencoded password may hold '?' and '#' (the userinfo ends at
	 * the last '@'); after it they are a query or fragment, refused */
	parse_ok("redis://:hun?ter#2@r", &u);
	assert_string_equal(u.password, "hun?ter#2");
	assert_string_equal(u.host, "r");
	/* the longest password that fits, encoded: 3 bytes of URL a byte */
	{
		static char big[3 * SW_REDIS_URL_PASSWORD_MAX + 64];
		size_t k = 9;

		memcpy(big, "redis://:", 9);
		for (int i = 0; i < SW_REDIS_URL_PASSWORD_MAX - 1; i++, k += 3)
			memcpy(big + k, "%40", 3);
		memcpy(big + k, "@r", 3);
		parse_ok(big, &u);
		assert_int_equal(strlen(u.password), SW_REDIS_URL_PASSWORD_MAX - 1);
		assert_int_equal(u.password[0], '@');
		memcpy(big + k, "%40@r", 6);
		parse_fails(big, "redis: password too long");
	}
}

/* IPv6 addresses in brackets. */
static void test_ipv6(void **state)
{
	struct sw_redis_url u;

	(void)state;
	parse_ok("redis://[::1]", &u);
	assert_string_equal(u.host, "::1");
	assert_int_equal(u.port, 6379);
	parse_ok("redis://:pw@[fd00::1:2]:6380/4", &u);
	assert_string_equal(u.host, "fd00::1:2");
	assert_int_equal(u.port, 6380);
	assert_int_equal(u.db, 4);
	assert_string_equal(u.password, "pw");
	parse_ok("rediss://[::ffff:10.0.0.1]/", &u);
	assert_string_equal(u.host, "::ffff:10.0.0.1");
	assert_true(u.tls);
	parse_fails("redis://[]:6379", "redis: bad IPv6 address in URL (expected [addr])");
	parse_fails("redis://[::1", "redis: bad IPv6 address in URL (expected [addr])");
	parse_fails("redis://[::1]x", "redis: bad IPv6 address in URL (expected [addr])");
	parse_fails("redis://[host]", "redis: bad IPv6 address in URL (expected [addr])");
	parse_fails("redis://[::1]:", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://::1", "redis: no host in URL");
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
	parse_fails("redis://r/+1", "redis: bad database number in URL");
	parse_fails("redis://r/ 1", "redis: bad database number in URL");
	parse_fails("redis://r:+6379", "redis: bad port in URL (expected 1..65535)");
	parse_fails("redis://r: 6379", "redis: bad port in URL (expected 1..65535)");
	/* a query or fragment is refused, not read as part of the host or db */
	parse_fails("redis://r?db=2", "redis: query or fragment (?, #) in URL: not supported");
	parse_fails("redis://:hunter2@r:6379/0?timeout=5",
		    "redis: query or fragment (?, #) in URL: not supported");
	parse_fails("redis://r/1#x", "redis: query or fragment (?, #) in URL: not supported");
	parse_fails("redis://r%41", "redis: bad host in URL");
	parse_fails("redis://ca[che", "redis: bad host in URL");
	parse_fails("redis://:hunter2%00@r", "redis: bad password in URL (%00)");
	parse_fails("redis://u%00:hunter2@r", "redis: bad user name in URL (%00)");

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

	memcpy(big, "redis://", 8);
	memset(big + 8, 'u', SW_REDIS_URL_USER_MAX);
	memcpy(big + 8 + SW_REDIS_URL_USER_MAX, ":hunter2@r", 11);
	parse_fails(big, "redis: user name too long");
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
		cmocka_unit_test(test_percent_encoding),
		cmocka_unit_test(test_ipv6),
		cmocka_unit_test(test_tls),
		cmocka_unit_test(test_unix),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_no_err_buffer),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
