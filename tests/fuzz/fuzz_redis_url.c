/* fuzz_redis_url.c - libFuzzer target: bytes -> sw_redis_url_parse, the
 * Redis address a config file, SWARM_REDIS_URL or a command line gives
 * (common/redis_url.h). The input up to its first NUL is the URL.
 *
 * Checked invariants (a violation traps):
 *  - the result is 0 or -EINVAL; an error's message is one of the fixed
 *    texts redis_url.h lists (so it never echoes the URL or a password),
 *    and *out is zeroed but for the default port;
 *  - on success every string is NUL-terminated inside its field; a unix://
 *    URL gives its socket path verbatim and nothing else (a relative
 *    path is accepted: swarmctl builds one from a relative state_dir); otherwise the
 *    host is set and holds none of '/', '@', '[', ']', '%', '?', '#' (a
 *    ':' only from an IPv6 address in brackets), port is 1..65535, db is
 *    0..SW_REDIS_URL_DB_MAX, and tls is set exactly for rediss://;
 *  - the URL written back from the struct ("redis://USER:PASSWORD@HOST:
 *    PORT/DB" with the user and password percent-encoded and an IPv6 host
 *    in brackets, or "unix://PATH") parses to the same struct.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/redis_url.h"
#include "tests/fuzz/fuzz.h"

static const char *const messages[] = {
	"redis: no URL",
	"redis: no socket path in unix:// URL",
	"redis: socket path too long",
	"redis: unsupported URL (expected redis://, rediss:// or unix://)",
	"redis: password too long",
	"redis: no host in URL",
	"redis: host too long in URL",
	"redis: bad port in URL (expected 1..65535)",
	"redis: bad database number in URL",
	"redis: user name too long",
	"redis: bad user name in URL (%00)",
	"redis: bad password in URL (%00)",
	"redis: query or fragment (?, #) in URL: not supported",
	"redis: bad IPv6 address in URL (expected [addr])",
	"redis: bad host in URL",
};

static size_t bounded(const char *s, size_t cap)
{
	size_t n = strnlen(s, cap);

	CHECK(n < cap);
	return n;
}

static void check_error(const struct sw_redis_url *u, const char *err)
{
	struct sw_redis_url zero;
	size_t i;

	CHECK(memchr(err, '\0', SW_ERR_MAX) != NULL);
	for (i = 0; i < sizeof(messages) / sizeof(messages[0]); i++)
		if (strcmp(err, messages[i]) == 0)
			break;
	CHECK(i < sizeof(messages) / sizeof(messages[0]));
	memset(&zero, 0, sizeof(zero));
	zero.port = SW_REDIS_URL_DEFAULT_PORT;
	CHECK(memcmp(u, &zero, sizeof(zero)) == 0);
}

static void check_ok(const char *url, const struct sw_redis_url *u)
{
	size_t n;

	bounded(u->host, sizeof(u->host));
	bounded(u->user, sizeof(u->user));
	bounded(u->password, sizeof(u->password));
	n = bounded(u->unix_path, sizeof(u->unix_path));
	if (strncmp(url, "unix://", 7) == 0) {
		CHECK(n >= 1);
		CHECK(strcmp(u->unix_path, url + 7) == 0);
		CHECK(!u->tls && u->host[0] == '\0' && u->password[0] == '\0');
		CHECK(u->port == SW_REDIS_URL_DEFAULT_PORT && u->db == 0);
		return;
	}
	CHECK(n == 0);
	CHECK(u->tls == (strncmp(url, "rediss://", 9) == 0));
	CHECK(u->host[0] != '\0' && strpbrk(u->host, "/@[]%?#") == NULL);
	CHECK(!strchr(u->host, ':') || strchr(url, '['));
	CHECK(u->port >= 1 && u->port <= 65535);
	CHECK(u->db >= 0 && u->db <= SW_REDIS_URL_DB_MAX);
}

/* s with every byte but RFC 3986's unreserved ones as %XX, into out. */
static const char *encode(char *out, const char *s)
{
	char *o = out;

	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		    c == '-' || c == '.' || c == '_' || c == '~')
			*o++ = (char)c;
		else
			o += sprintf(o, "%%%02X", c);
	}
	*o = '\0';
	return out;
}

static void check_round_trip(const struct sw_redis_url *u)
{
	static char url[3 * SW_REDIS_URL_USER_MAX + 3 * SW_REDIS_URL_PASSWORD_MAX +
			SW_REDIS_URL_HOST_MAX + SW_REDIS_URL_PATH_MAX + 64];
	static char user[3 * SW_REDIS_URL_USER_MAX], pw[3 * SW_REDIS_URL_PASSWORD_MAX];
	char err[SW_ERR_MAX];
	struct sw_redis_url back;
	bool v6 = strchr(u->host, ':') != NULL;

	if (u->unix_path[0])
		snprintf(url, sizeof(url), "unix://%s", u->unix_path);
	else
		snprintf(url, sizeof(url), "%s://%s:%s@%s%s%s:%d/%d", u->tls ? "rediss" : "redis",
			 encode(user, u->user), encode(pw, u->password), v6 ? "[" : "", u->host,
			 v6 ? "]" : "", u->port, u->db);
	CHECK(sw_redis_url_parse(url, &back, err, sizeof(err)) == 0);
	CHECK(memcmp(u, &back, sizeof(back)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sw_redis_url u;
	char err[SW_ERR_MAX];
	char *url = malloc(size + 1);
	int rc;

	if (!url)
		return 0;
	memcpy(url, data, size);
	url[size] = '\0';
	memset(err, 0x5a, sizeof(err));
	memset(&u, 0x5a, sizeof(u));
	rc = sw_redis_url_parse(url, &u, err, sizeof(err));
	if (rc == 0) {
		check_ok(url, &u);
		check_round_trip(&u);
	} else {
		CHECK(rc == -EINVAL);
		check_error(&u, err);
	}
	free(url);
	return 0;
}
