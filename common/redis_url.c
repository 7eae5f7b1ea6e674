/* redis_url.c - Redis URL parser shared by agentd, swarmctl and config. */
#include "common/redis_url.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* Fails with *out back to its defaults so no half-parsed field survives. */
static int fail(struct sw_redis_url *out, char *err, size_t errlen, const char *msg)
{
	memset(out, 0, sizeof(*out));
	out->port = SW_REDIS_URL_DEFAULT_PORT;
	return sw_seterr(err, errlen, -EINVAL, "redis: %s", msg);
}

int sw_redis_url_parse(const char *url, struct sw_redis_url *out, char *err, size_t errlen)
{
	const char *h, *at, *end;
	size_t n;

	memset(out, 0, sizeof(*out));
	out->port = SW_REDIS_URL_DEFAULT_PORT;
	if (!url)
		return fail(out, err, errlen, "no URL");
	if (strncmp(url, "unix://", 7) == 0) {
		n = strlen(url + 7);
		if (n == 0)
			return fail(out, err, errlen, "no socket path in unix:// URL");
		if (n >= sizeof(out->unix_path))
			return fail(out, err, errlen, "socket path too long");
		memcpy(out->unix_path, url + 7, n + 1);
		return 0;
	}
	if (strncmp(url, "redis://", 8) == 0) {
		h = url + 8;
	} else if (strncmp(url, "rediss://", 9) == 0) {
		out->tls = true;
		h = url + 9;
	} else {
		return fail(out, err, errlen,
			    "unsupported URL (expected redis://, rediss:// or unix://)");
	}
	end = h + strcspn(h, "/");
	/* The userinfo ends at the last '@' before the path: a host never
	 * holds one, an unencoded password may (and sw_config_redact_url
	 * hides everything up to that '@'). */
	at = memrchr(h, '@', (size_t)(end - h));
	if (at) {
		const char *colon = memchr(h, ':', (size_t)(at - h));

		if (colon) {
			n = (size_t)(at - colon - 1);
			if (n >= sizeof(out->password))
				return fail(out, err, errlen, "password too long");
			memcpy(out->password, colon + 1, n);
			out->password[n] = '\0';
		}
		h = at + 1;
	}
	n = strcspn(h, ":/");
	if (n == 0)
		return fail(out, err, errlen, "no host in URL");
	if (n >= sizeof(out->host))
		return fail(out, err, errlen, "host too long in URL");
	memcpy(out->host, h, n);
	out->host[n] = '\0';
	h += n;
	if (*h == ':') {
		char *stop;
		long p;

		p = strtol(h + 1, &stop, 10);
		if (stop == h + 1 || p < 1 || p > 65535 || (*stop && *stop != '/'))
			return fail(out, err, errlen, "bad port in URL (expected 1..65535)");
		out->port = (int)p;
		h = stop;
	}
	if (*h == '/' && h[1]) {
		char *stop;
		long d;

		d = strtol(h + 1, &stop, 10);
		if (stop == h + 1 || *stop || d < 0 || d > SW_REDIS_URL_DB_MAX)
			return fail(out, err, errlen, "bad database number in URL");
		out->db = (int)d;
	}
	return 0;
}
