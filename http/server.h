/* server.h - gpud-http's server: one libuv loop serving HTTP/1.1 and
 * bridging to gpud through proto/client.h (see server.c's header for the
 * design and why libuv).
 */
#ifndef HTTP_SERVER_H
#define HTTP_SERVER_H

#include <stddef.h>
#include <sys/types.h>

#include "common/config.h"

/* What main resolved: the config with the flags applied. */
struct http_server_opts {
	struct sw_config cfg;   /* http.* and gpud.socket / gpud.metrics used */
	const char *socket;     /* gpud's socket (cfg.gpud.socket or --socket) */
};

/* Loads the API keys (if any), resolves and binds http.listen (refusing a
 * non-loopback listener without keys), drops privileges (cfg.user), then
 * serves until SIGTERM or SIGINT. Returns 0 after a clean shutdown, or a
 * negative code with a message in err for a start-up failure (bad
 * address, key file, bind). */
int http_serve(const struct http_server_opts *o, char *err, size_t errlen);

/* Reads the key file: one key a line (blank lines and lines starting
 * with '#' skipped, surrounding blanks trimmed, at most 256 keys of at
 * most 255 bytes). The file must be regular, mode 0600 or stricter (no
 * group or other bits) and owned by the caller, root or also_uid (as
 * common/secret.h: root reading the file of the configured `user`):
 * -EPERM otherwise, -EINVAL when it holds no key. Returns 0 and *keys (a
 * malloc'd NULL-terminated array of malloc'd strings) and *n. */
int http_keys_load(const char *path, uid_t also_uid, char ***keys, size_t *n, char *err,
		   size_t errlen);

/* Frees what http_keys_load returned (keys zeroed first). */
void http_keys_free(char **keys);

/* Does the Authorization value a[0, alen) carry one of the keys as
 * "Bearer KEY"? Compares in time independent of where a key differs. */
int http_keys_check(char *const *keys, const char *a, size_t alen);

#endif
