/* parse.c - the strict HTTP/1.1 request-head parser (http/parse.h). */
#include "http/parse.h"

#include <string.h>
#include <strings.h>

/* RFC 9110 tchar. */
static bool tchar(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return true;
	return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Field-value octets: visible ASCII, SP, HTAB and obs-text. */
static bool vchar(unsigned char c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static long fail(int *status, const char **why, int st, const char *w)
{
	*status = st;
	*why = w;
	return -1;
}

/* Does the comma-separated list v[0, n) contain token t (case-insensitive)? */
static bool list_has(const char *v, size_t n, const char *t)
{
	size_t tl = strlen(t), i = 0;

	while (i < n) {
		while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
			i++;
		size_t s = i;
		while (i < n && v[i] != ',')
			i++;
		size_t e = i;
		while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
			e--;
		if (e - s == tl && strncasecmp(v + s, t, tl) == 0)
			return true;
	}
	return false;
}

long http_parse_head(const char *buf, size_t len, struct http_head *h, int *status,
		     const char **why)
{
	const char *orig = buf, *p = buf, *end, *eol;
	bool seen_cl = false;

	memset(h, 0, sizeof(*h));
	/* A blank line before the request line is tolerated (RFC 9112 §2.2)
	 * only as CRLF; one is enough for the clients that send it. */
	if (len >= 2 && p[0] == '\r' && p[1] == '\n') {
		p += 2;
		len -= 2;
		buf = p;
	}
	end = NULL;
	for (size_t i = 0; i + 3 < len; i++) {
		if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
			end = buf + i + 4;
			break;
		}
	}
	/* Reject bytes that can never be valid before waiting for more. */
	for (size_t i = 0; i < len && (!end || buf + i < end); i++) {
		unsigned char c = (unsigned char)buf[i];
		if (c == 0 || (c == '\n' && (i == 0 || buf[i - 1] != '\r')))
			return fail(status, why, 400, "bare LF or NUL in the head");
	}
	if (!end)
		return 0;

	/* Request line. */
	eol = memchr(p, '\r', (size_t)(end - p));
	const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
	if (!sp1 || sp1 == p)
		return fail(status, why, 400, "malformed request line");
	if ((size_t)(sp1 - p) >= HTTP_METHOD_MAX)
		return fail(status, why, 501, "method too long");
	for (const char *c = p; c < sp1; c++)
		if (!tchar((unsigned char)*c))
			return fail(status, why, 400, "malformed method");
	memcpy(h->method, p, (size_t)(sp1 - p));
	h->method[sp1 - p] = '\0';
	const char *tgt = sp1 + 1;
	const char *sp2 = memchr(tgt, ' ', (size_t)(eol - tgt));
	if (!sp2 || sp2 == tgt || tgt[0] != '/')
		return fail(status, why, 400, "malformed request target");
	for (const char *c = tgt; c < sp2; c++)
		if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
			return fail(status, why, 400, "malformed request target");
	const char *q = memchr(tgt, '?', (size_t)(sp2 - tgt));
	h->path = tgt;
	h->path_len = (size_t)((q ? q : sp2) - tgt);
	if (eol - (sp2 + 1) != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0)
		return fail(status, why, (eol - (sp2 + 1) == 8 && memcmp(sp2 + 1, "HTTP/", 5) == 0)
				 ? 505 : 400, "malformed or unsupported HTTP version");
	if (sp2[8] != '0' && sp2[8] != '1')
		return fail(status, why, 505, "unsupported HTTP version");
	h->minor = sp2[8] - '0';
	h->keep_alive = h->minor == 1;

	/* Header fields. */
	p = eol + 2;
	while (p < end - 2) {
		eol = memchr(p, '\r', (size_t)(end - p));
		const char *colon = memchr(p, ':', (size_t)(eol - p));
		if (p[0] == ' ' || p[0] == '\t')
			return fail(status, why, 400, "obsolete line folding");
		if (!colon || colon == p)
			return fail(status, why, 400, "malformed header field");
		for (const char *c = p; c < colon; c++)
			if (!tchar((unsigned char)*c))
				return fail(status, why, 400, "malformed header name");
		const char *v = colon + 1, *ve = eol;
		while (v < ve && (*v == ' ' || *v == '\t'))
			v++;
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			ve--;
		for (const char *c = v; c < ve; c++)
			if (!vchar((unsigned char)*c))
				return fail(status, why, 400, "control character in a header value");
		size_t nl = (size_t)(colon - p), vl = (size_t)(ve - v);

		if (nl == 14 && strncasecmp(p, "content-length", nl) == 0) {
			uint64_t n = 0;
			if (vl == 0 || vl > 15)
				return fail(status, why, 400, "bad Content-Length");
			for (size_t i = 0; i < vl; i++) {
				if (v[i] < '0' || v[i] > '9')
					return fail(status, why, 400, "bad Content-Length");
				n = n * 10 + (uint64_t)(v[i] - '0');
			}
			if (seen_cl && n != h->content_length)
				return fail(status, why, 400, "conflicting Content-Length");
			seen_cl = true;
			h->has_length = true;
			h->content_length = n;
		} else if (nl == 17 && strncasecmp(p, "transfer-encoding", nl) == 0) {
			return fail(status, why, 411, "Transfer-Encoding is not supported: send Content-Length");
		} else if (nl == 10 && strncasecmp(p, "connection", nl) == 0) {
			if (list_has(v, vl, "close"))
				h->keep_alive = false;
			else if (list_has(v, vl, "keep-alive"))
				h->keep_alive = true;
		} else if (nl == 6 && strncasecmp(p, "expect", nl) == 0) {
			if (vl == 12 && strncasecmp(v, "100-continue", 12) == 0)
				h->expect_continue = h->minor == 1;
			else
				return fail(status, why, 417, "unsupported Expect");
		} else if (nl == 13 && strncasecmp(p, "authorization", nl) == 0) {
			if (h->auth)
				return fail(status, why, 400, "more than one Authorization");
			h->auth = v;
			h->auth_len = vl;
		}
		p = eol + 2;
	}
	return (long)(end - orig);
}

bool http_path_is(const struct http_head *h, const char *s)
{
	size_t n = strlen(s);
	return h->path_len == n && memcmp(h->path, s, n) == 0;
}
