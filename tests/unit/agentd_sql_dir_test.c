/* agentd_sql_dir_test.c - where agentd reads its migrations without
 * --sql-dir (agentd/sql_dir.h): $SWARM_SQL_DIR, else the checkout's
 * config/sql for a program inside the build tree (this test is one).
 * The installed case (SW_SQL_DIR) runs in tests/integration/install_test.sh,
 * from a DESTDIR outside the build tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "agentd/sql_dir.h"
#include "sw_config.h"

static void test_build_tree(void **state)
{
	(void)state;
	unsetenv("SWARM_SQL_DIR");
	assert_string_equal(agent_sql_dir_default(), SW_SOURCE_ROOT "/config/sql");
	assert_int_equal(access(SW_SOURCE_ROOT "/config/sql/001_init.sql", R_OK), 0);
	setenv("SWARM_SQL_DIR", "", 1); /* empty: as if unset */
	assert_string_equal(agent_sql_dir_default(), SW_SOURCE_ROOT "/config/sql");
}

static void test_environment(void **state)
{
	(void)state;
	setenv("SWARM_SQL_DIR", "/opt/swarm/sql", 1);
	assert_string_equal(agent_sql_dir_default(), "/opt/swarm/sql");
	unsetenv("SWARM_SQL_DIR");
}

static void test_installed_path(void **state)
{
	(void)state;
	/* what the build compiled in: meson's prefix and datadir */
	assert_true(SW_SQL_DIR[0] == '/');
	assert_non_null(strstr(SW_SQL_DIR, "/swarm/sql"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_build_tree),
		cmocka_unit_test(test_environment),
		cmocka_unit_test(test_installed_path),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
