/* harness.h - the servers an integration test runs against.
 *
 * A test calls it_start() first thing in main() and returns its result
 * when it is not 0. Servers come from the environment when scripts/test
 * (or a developer) exported them:
 *   SWARM_TEST_REDIS_URL  redis://HOST:PORT
 *   SWARM_TEST_PG_URL     postgresql://USER@HOST:PORT/DB (any libpq URL)
 * When a variable is unset, the harness starts a private server itself
 * with scripts/lib/test-servers.sh (temporary directory, free port) and
 * exports the variable, so child processes (daemons under test) see it.
 * Servers it started are stopped at exit (atexit), and by a watcher in
 * the script if the test dies without running atexit handlers.
 *
 * A server that is absent is a skip (exit status 77) on a developer
 * machine and a failure (exit status 1) under CI=true.
 */
#ifndef SW_IT_HARNESS_H
#define SW_IT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

#define IT_EXIT_SKIP 77 /* meson's "skipped" exit status */
#define IT_EXIT_FAIL 1

enum it_need {
	IT_REDIS = 1u << 0,
	IT_PG = 1u << 1,
};

/* Makes every server in `need` (IT_REDIS | IT_PG) reachable. Returns 0
 * when all answer; otherwise prints the reason on stderr and returns the
 * status main() should exit with: IT_EXIT_SKIP, or IT_EXIT_FAIL under
 * CI=true. Servers it started stay up until exit or it_stop(). Call once. */
int it_start(unsigned need);

/* The URLs in use after a successful it_start(), else NULL. The strings
 * belong to the environment; do not free them. */
const char *it_redis_url(void);
const char *it_pg_url(void);

/* Stops the servers it_start() started (not ones found in the
 * environment) and unsets their variables. Idempotent; also runs at exit. */
void it_stop(void);

/* True when CI=true is set: missing servers are failures, not skips. */
bool it_ci(void);

/* Splits "redis://HOST:PORT[/DB]" (port defaults to 6379). HOST is
 * written NUL-terminated into host (hostlen bytes). Returns 0, or -EINVAL
 * for another scheme, a missing host, a bad port or a host too long (host
 * and port are then unspecified). */
int it_parse_redis_url(const char *url, char *host, size_t hostlen, int *port);

/* True when a Redis server at host:port answers PING within 2 s. */
bool it_redis_ping(const char *host, int port);

#endif
