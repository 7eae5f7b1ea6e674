/* sql_dir.c - where agentd reads its SQL migrations (agentd/sql_dir.h). */
#include "agentd/sql_dir.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sw_config.h"

/* True when /proc/self/exe lies under SW_BUILD_ROOT (both resolved). */
static bool in_build_tree(void)
{
	char exe[PATH_MAX], root[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	size_t len;

	if (n <= 0 || !realpath(SW_BUILD_ROOT, root))
		return false;
	exe[n] = '\0';
	len = strlen(root);
	return strncmp(exe, root, len) == 0 && exe[len] == '/';
}

const char *agent_sql_dir_default(void)
{
	const char *env = getenv("SWARM_SQL_DIR");

	if (env && env[0])
		return env;
	return in_build_tree() ? SW_SOURCE_ROOT "/config/sql" : SW_SQL_DIR;
}
