/* sql_dir.h - where agentd reads its SQL migrations.
 *
 * `--sql-dir DIR` wins; without it a worker asks agent_sql_dir_default():
 *   1. $SWARM_SQL_DIR when set and not empty;
 *   2. the checkout's config/sql (SW_SOURCE_ROOT) when the running
 *      executable lies inside the build tree it was built in
 *      (SW_BUILD_ROOT): a build runs without installing, scripts/demo and
 *      the tests included, and an edited migration applies at once;
 *   3. otherwise the installed <datadir>/swarm/sql (SW_SQL_DIR, from
 *      meson's prefix and datadir), where `meson install` puts config/sql.
 * An installed agentd never reads a source tree: it does not run from
 * inside the build directory.
 */
#ifndef AGENT_SQL_DIR_H
#define AGENT_SQL_DIR_H

/* The directory migrations are read from when no --sql-dir is given.
 * Never NULL: a static string or the environment's. Any thread. */
const char *agent_sql_dir_default(void);

#endif
