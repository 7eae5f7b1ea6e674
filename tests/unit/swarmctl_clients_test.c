/* swarmctl_clients_test.c - the operator-facing failures of swarmctl's
 * connections and environment, without any server: bad Redis URLs,
 * unreachable Redis and PostgreSQL, a wrong config path, a state
 * directory too long for its sockets, the managed configuration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "swarmctl/clients.h"
#include "swarmctl/services.h"

static void test_redis_bad_urls(void **state)
{
	static const char *const bad[] = {
		"http://localhost:6379", "redis://", "redis://host:0", "redis://host:70000",
		"redis://host:12x", "redis://host/abc", "unix://", "localhost:6379",
	};
	char err[SW_ERR_MAX];
	redisContext *c = (redisContext *)1;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(ctl_redis_open(bad[i], 500, &c, err, sizeof(err)), -EINVAL);
		assert_null(c);
		assert_true(strncmp(err, "redis: ", 7) == 0);
	}
}

static void test_redis_unreachable(void **state)
{
	char err[SW_ERR_MAX];
	redisContext *c = (redisContext *)1;

	(void)state;
	assert_int_equal(ctl_redis_open("unix:///nonexistent/redis.sock", 500, &c, err,
				       sizeof(err)), SW_ECLOSED);
	assert_null(c);
	assert_non_null(strstr(err, "/nonexistent/redis.sock"));
	/* port 1 on loopback: refused at once, with the password parsed off */
	assert_int_equal(ctl_redis_open("redis://:secret@127.0.0.1:1/2", 500, &c, err,
				       sizeof(err)), SW_ECLOSED);
	assert_non_null(strstr(err, "127.0.0.1:1"));
	assert_null(strstr(err, "secret"));
}

static void test_pg_unreachable(void **state)
{
	char err[SW_ERR_MAX];
	PGconn *c = (PGconn *)1;

	(void)state;
	assert_int_equal(ctl_pg_open("host=/nonexistent dbname=swarm user=swarm", &c, err,
				    sizeof(err)), SW_ECLOSED);
	assert_null(c);
	assert_non_null(strstr(err, "postgres at "));
	assert_non_null(strstr(err, "/nonexistent"));
	assert_int_equal(ctl_pg_open("postgresql://swarm:hunter2@127.0.0.1:1/swarm", &c, err,
				    sizeof(err)), SW_ECLOSED);
	assert_null(strstr(err, "hunter2")); /* redacted */
}

static void clear_env(void)
{
	unsetenv("SWARM_CONFIG");
	unsetenv("SWARM_MODEL");
	unsetenv("SWARM_WORKERS");
	unsetenv("SWARM_REDIS_URL");
	unsetenv("SWARM_PG_URL");
	unsetenv("SWARM_GPUD_SOCKET");
}

static void test_env_managed(void **state)
{
	struct ctl_env e;
	char err[SW_ERR_MAX];

	(void)state;
	clear_env();
	setenv("SWARM_STATE_DIR", "/tmp/sc-unit", 1);
	assert_int_equal(ctl_env_init(&e, NULL, err, sizeof(err)), 0);
	assert_true(e.managed);
	assert_true(e.builtin_model);
	assert_string_equal(e.state_dir, "/tmp/sc-unit");
	assert_string_equal(e.cfg.redis.url, "unix:///tmp/sc-unit/run/redis.sock");
	assert_string_equal(e.cfg.gpud.socket, "/tmp/sc-unit/run/gpud.sock");
	assert_string_equal(e.cfg.gpud.model, "/tmp/sc-unit/models/builtin.gguf");
	assert_non_null(strstr(e.cfg.postgres.url, "host=/tmp/sc-unit/pg"));
	assert_string_equal(e.config_path, "/tmp/sc-unit/swarm.json");
	assert_int_equal(e.cfg.agentd.workers, 2);
	assert_true(ctl_service_managed(&e, CTL_REDIS));
	assert_true(ctl_service_managed(&e, CTL_POSTGRES));
	/* nothing runs there */
	for (int s = 0; s < CTL_N_SERVICES; s++)
		assert_int_equal(ctl_service_pid(&e, s), 0);

	setenv("SWARM_MODEL", "/models/real.gguf", 1);
	assert_int_equal(ctl_env_init(&e, NULL, err, sizeof(err)), 0);
	assert_false(e.builtin_model);
	assert_string_equal(e.cfg.gpud.model, "/models/real.gguf");
	clear_env();
}

static void test_env_state_dir_too_long(void **state)
{
	char longdir[200], err[SW_ERR_MAX];
	struct ctl_env e;

	(void)state;
	clear_env();
	memset(longdir, 'd', sizeof(longdir) - 1);
	longdir[0] = '/';
	longdir[sizeof(longdir) - 1] = '\0';
	setenv("SWARM_STATE_DIR", longdir, 1);
	assert_int_equal(ctl_env_init(&e, NULL, err, sizeof(err)), -ENAMETOOLONG);
	assert_non_null(strstr(err, "too long"));
	assert_non_null(strstr(err, "SWARM_STATE_DIR"));
	unsetenv("SWARM_STATE_DIR");
}

static void test_env_config_file(void **state)
{
	char path[] = "/tmp/swarmctl_clients_test.XXXXXX", err[SW_ERR_MAX];
	struct ctl_env e;
	FILE *f;
	int fd;

	(void)state;
	clear_env();
	assert_int_equal(ctl_env_init(&e, "/nonexistent/swarm.json", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "wrong config path"));

	fd = mkstemp(path);
	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	assert_non_null(f);
	fputs("{\"state_dir\": \"/tmp/sc-ext\", \"redis\": {\"url\": \"redis://r:6380/1\"},"
	      " \"postgres\": {\"url\": \"host=/tmp dbname=swarm\"},"
	      " \"gpud\": {\"model\": \"/m.gguf\", \"socket\": \"/tmp/sc-ext/g.sock\"}}", f);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(ctl_env_init(&e, path, err, sizeof(err)), 0);
	assert_false(e.managed);
	assert_false(e.builtin_model);
	assert_string_equal(e.state_dir, "/tmp/sc-ext");
	assert_string_equal(e.cfg.redis.url, "redis://r:6380/1");
	assert_false(ctl_service_managed(&e, CTL_REDIS));
	assert_false(ctl_service_managed(&e, CTL_POSTGRES));
	assert_true(ctl_service_managed(&e, CTL_GPUD));
	assert_int_equal(ctl_service_pid(&e, CTL_REDIS), 0);

	/* an unknown key is refused with its name */
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("{\"gpud\": {\"model\": \"/m.gguf\", \"modle\": 1}}", f);
	assert_int_equal(fclose(f), 0);
	assert_int_not_equal(ctl_env_init(&e, path, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "modle"));
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_redis_bad_urls),
		cmocka_unit_test(test_redis_unreachable),
		cmocka_unit_test(test_pg_unreachable),
		cmocka_unit_test(test_env_managed),
		cmocka_unit_test(test_env_state_dir_too_long),
		cmocka_unit_test(test_env_config_file),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
