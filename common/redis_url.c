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

/* A hex digit's value, or -1. */
static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)(c | 0x20);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Copies src[0..n) into dst (cap bytes) with RFC 3986 percent-decoding:
 * %XX becomes its byte; a '%' not followed by two hex digits stays as it
 * is (a password written without encoding keeps working). Returns 0,
 * -E2BIG when it does not fit, -EINVAL for %00 (Redis's AUTH cannot
 * carry a NUL). */
static int decode(char *dst, size_t cap, const char *src, size_t n)
{
	size_t i, k = 0;

	for (i = 0; i < n; i++) {
		char c = src[i];

		if (c == '%' && i + 2 < n && hexval(src[i + 1]) >= 0 && hexval(src[i + 2]) >= 0) {
			c = (char)(hexval(src[i + 1]) << 4 | hexval(src[i + 2]));
			if (!c)
				return -EINVAL;
			i += 2;
		}
		if (k + 1 >= cap)
			return -E2BIG;
		dst[k++] = c;
	}
	dst[k] = '\0';
	return 0;
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
		const char *uend = colon ? colon : at;
		int rc = decode(out->user, sizeof(out->user), h, (size_t)(uend - h));

		if (rc)
			return fail(out, err, errlen, rc == -E2BIG ? "user name too long" :
				    "bad user name in URL (%00)");
		if (colon) {
			rc = decode(out->password, sizeof(out->password), colon + 1,
				    (size_t)(at - colon - 1));
			if (rc)
				return fail(out, err, errlen, rc == -E2BIG ? "password too long" :
					    "bad password in URL (%00)");
		}
		h = at + 1;
	}
	if (h[strcspn(h, "?#")])
		return fail(out, err, errlen, "query or fragment (?, #) in URL: not supported");
	if (*h == '[') { /* an IPv6 address: [::1] */
		const char *close = memchr(h, ']', (size_t)(end - h));

		n = close ? (size_t)(close - h - 1) : 0;
		if (!close || n == 0 || strspn(h + 1, "0123456789abcdefABCDEF:.") < n)
			return fail(out, err, errlen, "bad IPv6 address in URL (expected [addr])");
		if (n >= sizeof(out->host))
			return fail(out, err, errlen, "host too long in URL");
		memcpy(out->host, h + 1, n);
		out->host[n] = '\0';
		h = close + 1;
		if (*h && *h != ':' && *h != '/')
			return fail(out, err, errlen, "bad IPv6 address in URL (expected [addr])");
	} else {
		n = strcspn(h, ":/");
		if (n == 0)
			return fail(out, err, errlen, "no host in URL");
		if (n >= sizeof(out->host))
			return fail(out, err, errlen, "host too long in URL");
		if (memchr(h, '[', n) || memchr(h, ']', n) || memchr(h, '%', n))
			return fail(out, err, errlen, "bad host in URL");
		memcpy(out->host, h, n);
		out->host[n] = '\0';
		h += n;
	}
	if (*h == ':') {
		char *stop;
		long p;

		p = strtol(h + 1, &stop, 10);
		if (stop == h + 1 || p < 1 || p > 65535 || (*stop && *stop != '/') ||
		    !(h[1] >= '0' && h[1] <= '9'))
			return fail(out, err, errlen, "bad port in URL (expected 1..65535)");
		out->port = (int)p;
		h = stop;
	}
	if (*h == '/' && h[1]) {
		char *stop;
		long d;

		d = strtol(h + 1, &stop, 10);
		if (stop == h + 1 || *stop || d < 0 || d > SW_REDIS_URL_DB_MAX ||
		    !(h[1] >= '0' && h[1] <= '9'))
			return fail(out, err, errlen, "bad database number in URL");
		out->db = (int)d;
	}
	return 0;
}
