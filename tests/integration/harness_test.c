/* harness_test.c - the integration harness itself: URL parsing, the PING
 * probe, and the skip-or-fail rule for an unreachable server. Needs no
 * server: it points the harness at a port nothing listens on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/integration/harness.h"

static void test_parse_redis_url(void **state)
{
	char host[32];
	int port = 0;

	(void)state;
	assert_int_equal(it_parse_redis_url("redis://127.0.0.1:6380", host,
					    sizeof(host), &port), 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 6380);
	assert_int_equal(it_parse_redis_url("redis://cache.local/3", host,
					    sizeof(host), &port), 0);
	assert_string_equal(host, "cache.local");
	assert_int_equal(port, 6379);
	assert_int_equal(it_parse_redis_url("redis://[::1]:7000/0", host,
					    sizeof(host), &port), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 7000);
}

static void test_parse_redis_url_errors(void **state)
{
	static const char *const bad[] = {
		"http://127.0.0.1:6379", "redis://", "redis://:6379",
		"redis://h:0", "redis://h:65536", "redis://h:12x",
		"redis://h:", "redis://user:pw@h:1", "redis://[::1",
		"redis://a-host-name-longer-than-the-buffer.example:1",
	};
	char host[32];
	int port;

	(void)state;
	assert_int_equal(it_parse_redis_url(NULL, host, sizeof(host), &port), -EINVAL);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (it_parse_redis_url(bad[i], host, sizeof(host), &port) != -EINVAL)
			fail_msg("accepted %s", bad[i]);
}

/* A loopback port nobody listens on: bind one, note it, close it. */
static int dead_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* A listener that accepts but never answers: PING must time out. */
static void test_ping(void **state)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	(void)state;
	assert_false(it_redis_ping("127.0.0.1", dead_port()));
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	assert_false(it_redis_ping("127.0.0.1", ntohs(a.sin_port)));
	close(fd);
}

/* An unreachable server named in the environment: skip on a developer
 * machine, fail under CI=true, and never start anything. */
static void test_unreachable_skip_or_fail(void **state)
{
	char url[64], *saved_ci = getenv("CI"), *saved_url = getenv("SWARM_TEST_REDIS_URL");

	(void)state;
	saved_ci = saved_ci ? strdup(saved_ci) : NULL;
	saved_url = saved_url ? strdup(saved_url) : NULL;
	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", dead_port());
	setenv("SWARM_TEST_REDIS_URL", url, 1);

	unsetenv("CI");
	assert_false(it_ci());
	assert_int_equal(it_start(IT_REDIS), IT_EXIT_SKIP);
	setenv("CI", "true", 1);
	assert_true(it_ci());
	assert_int_equal(it_start(IT_REDIS), IT_EXIT_FAIL);
	setenv("SWARM_TEST_REDIS_URL", "redis:/broken", 1);
	assert_int_equal(it_start(IT_REDIS), IT_EXIT_FAIL);
	/* The environment's URL is used as given, never replaced. */
	assert_string_equal(it_redis_url(), "redis:/broken");

	if (saved_ci)
		setenv("CI", saved_ci, 1);
	else
		unsetenv("CI");
	if (saved_url)
		setenv("SWARM_TEST_REDIS_URL", saved_url, 1);
	else
		unsetenv("SWARM_TEST_REDIS_URL");
	free(saved_ci);
	free(saved_url);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_redis_url),
		cmocka_unit_test(test_parse_redis_url_errors),
		cmocka_unit_test(test_ping),
		cmocka_unit_test(test_unreachable_skip_or_fail),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
