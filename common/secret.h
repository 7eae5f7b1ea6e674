/* secret.h - the Redis and PostgreSQL passwords: where they may come from
 * (the environment or a file only the service may read), and the one
 * place in a process that holds them.
 *
 * Rules (issue 13, DESIGN §6a):
 *   - SWARM_REDIS_PASSWORD / SWARM_PG_PASSWORD in the environment win;
 *   - else redis.password_file / postgres.password_file name a regular
 *     file of mode 0600 or stricter (no group or other bits), owned by
 *     the reading user or root (or, read by root, by the configured
 *     `user`: swarmctl as root on a unit's files); its contents, less one
 *     trailing newline,
 *     are the password;
 *   - else none: a password in the URL itself applies (the config loader
 *     accepts one only in a config file of mode 0600 or stricter).
 * A password never enters a URL, a log line, an error message or a
 * child's command line. The store is process-wide: set once at start-up,
 * before any thread, and read-only after.
 */
#ifndef SW_SECRET_H
#define SW_SECRET_H

#include <stddef.h>

#include "common/config.h"

#define SW_SECRET_MAX 256 /* bytes of a password, NUL included */

#define SW_SECRET_REDIS_ENV "SWARM_REDIS_PASSWORD"
#define SW_SECRET_PG_ENV "SWARM_PG_PASSWORD"

/* Reads the password in path into out (outlen >= 1), less one trailing
 * "\n" or "\r\n". Refused (-EPERM) when the file is group- or
 * world-accessible or owned by another user than the caller's effective
 * uid or root, -EINVAL when it is not a regular file, empty, holds a NUL
 * or a line break inside, SW_ETOOLONG when it does not fit; an
 * unreadable file gives the negated errno. Messages name the path and
 * the fix, never the contents. On error out is "". */
int sw_secret_read_file(const char *path, char *out, size_t outlen, char *err, size_t errlen);

/* Resolves both passwords by the rules above into the process's store
 * (the environment, then cfg's password files). Returns 0 or the error of
 * sw_secret_read_file, its message prefixed by the config key
 * ("redis.password_file: ..."); on error the store is unchanged. */
int sw_secrets_load(const struct sw_config *cfg, char *err, size_t errlen);

/* The stored passwords; "" when none (the URL's own, if any, applies). */
const char *sw_secret_redis(void);
const char *sw_secret_pg(void);

/* Forgets both (zeroed). */
void sw_secrets_clear(void);

#endif
