/* http_client.c - gpud-load's HTTP/1.1 client (see http_client.h). */
#include "bench/http_client.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/err.h"

int bench_http_url_parse(const char *url, struct bench_http_url *u, char *err, size_t errlen)
{
	const char *h, *end, *slash, *colon;
	size_t hl;

	memset(u, 0, sizeof(*u));
	if (strncmp(url, "http://", 7) != 0)
		return sw_seterr(err, errlen, -EINVAL, "%s: expected http://HOST[:PORT][/PREFIX] "
				 "(no https: the load goes to a front next to it)", url);
	h = url + 7;
	slash = strchr(h, '/');
	end = slash ? slash : h + strlen(h);
	if (*h == '[') {
		const char *rb = memchr(h, ']', (size_t)(end - h));

		if (!rb)
			return sw_seterr(err, errlen, -EINVAL, "%s: unterminated [IPv6]", url);
		hl = (size_t)(rb - h - 1);
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
		if (hl == 0 || hl >= sizeof(u->host))
			return sw_seterr(err, errlen, -EINVAL, "%s: bad host", url);
		memcpy(u->host, h + 1, hl);
	} else {
		colon = memchr(h, ':', (size_t)(end - h));
		hl = (size_t)((colon ? colon : end) - h);
		if (hl == 0 || hl >= sizeof(u->host))
			return sw_seterr(err, errlen, -EINVAL, "%s: bad host", url);
		memcpy(u->host, h, hl);
	}
	if (colon) {
		size_t pl = (size_t)(end - colon - 1);
		char *e;
		long p;

		if (pl == 0 || pl >= sizeof(u->port))
			return sw_seterr(err, errlen, -EINVAL, "%s: bad port", url);
		memcpy(u->port, colon + 1, pl);
		p = strtol(u->port, &e, 10);
		if (*e || p < 1 || p > 65535)
			return sw_seterr(err, errlen, -EINVAL, "%s: bad port", url);
	} else {
		snprintf(u->port, sizeof(u->port), "80");
	}
	if ((size_t)(end - h) >= sizeof(u->hosthdr))
		return sw_seterr(err, errlen, -EINVAL, "%s: host too long", url);
	memcpy(u->hosthdr, h, (size_t)(end - h));
	if (slash) {
		size_t n = strlen(slash);

		while (n > 0 && slash[n - 1] == '/')
			n--;
		if (n >= sizeof(u->prefix))
			return sw_seterr(err, errlen, -EINVAL, "%s: path too long", url);
		memcpy(u->prefix, slash, n);
	}
	return 0;
}

void bench_http_init(struct bench_http *c, uint32_t timeout_ms)
{
	c->fd = -1;
	c->timeout_ms = timeout_ms;
	c->at = c->end = 0;
	c->l_at = c->l_end = 0;
	c->body_done = true;
}

void bench_http_close(struct bench_http *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->at = c->end = 0;
}

static int http_connect(struct bench_http *c, const struct bench_http_url *u, char *err,
			size_t errlen)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL, *ai;
	struct timeval tv = { .tv_sec = c->timeout_ms / 1000,
			      .tv_usec = (c->timeout_ms % 1000) * 1000 };
	int one = 1, rc = getaddrinfo(u->host, u->port, &hints, &res);

	if (rc)
		return sw_seterr(err, errlen, -EHOSTUNREACH, "%s: %s", u->host, gai_strerror(rc));
	rc = -ECONNREFUSED;
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);

		if (fd < 0) {
			rc = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
			c->fd = fd;
			rc = 0;
			break;
		}
		rc = -errno;
		close(fd);
	}
	freeaddrinfo(res);
	if (rc)
		return sw_seterr(err, errlen, rc, "connect %s:%s: %s", u->host, u->port,
				 strerror(-rc));
	c->at = c->end = 0;
	return 0;
}

static int send_all(int fd, const char *p, size_t len)
{
	while (len > 0) {
		ssize_t k = send(fd, p, len, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? (errno == EAGAIN ? -ETIMEDOUT : -errno) : -EPIPE;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/* More bytes into buf (moving what is left to its start). Returns the
 * count, 0 at EOF, or a negative code. */
static long fill(struct bench_http *c)
{
	ssize_t k;

	if (c->at > 0) {
		memmove(c->buf, c->buf + c->at, c->end - c->at);
		c->end -= c->at;
		c->at = 0;
	}
	if (c->end == sizeof(c->buf))
		return -EMSGSIZE;
	do
		k = recv(c->fd, c->buf + c->end, sizeof(c->buf) - c->end, 0);
	while (k < 0 && errno == EINTR);
	if (k < 0)
		return errno == EAGAIN ? -ETIMEDOUT : -errno;
	c->end += (size_t)k;
	return k;
}

/* A "\r\n"-terminated line of the raw stream (chunk sizes, trailers):
 * returns a pointer into buf (NUL at the "\r"), consumed; NULL on error
 * with *rc set. */
static char *raw_line(struct bench_http *c, int *rc)
{
	for (;;) {
		char *nl = memchr(c->buf + c->at, '\n', c->end - c->at);
		long k;

		if (nl) {
			char *line = c->buf + c->at;

			*nl = '\0';
			if (nl > line && nl[-1] == '\r')
				nl[-1] = '\0';
			c->at = (size_t)(nl - c->buf) + 1;
			return line;
		}
		k = fill(c);
		if (k <= 0) {
			*rc = k < 0 ? (int)k : -ECONNRESET;
			return NULL;
		}
	}
}

/* Reads and parses the status line and the headers. Returns 0, or a
 * negative code (-ECONNRESET: closed before any byte). */
static int read_head(struct bench_http *c, char *err, size_t errlen)
{
	char *head, *p, *eol;
	size_t hl;
	bool http10;
	unsigned code;

	for (;;) {
		char *e = memmem(c->buf + c->at, c->end - c->at, "\r\n\r\n", 4);
		long k;

		if (e) {
			head = c->buf + c->at;
			hl = (size_t)(e - head) + 4;
			break;
		}
		k = fill(c);
		if (k == 0)
			return c->end == c->at ? -ECONNRESET
					       : sw_seterr(err, errlen, -EPROTO, "closed in the head");
		if (k < 0)
			return sw_seterr(err, errlen, (int)k, "reading the response head: %s",
					 strerror((int)-k));
	}
	head[hl - 2] = '\0';
	if (sscanf(head, "HTTP/1.%*1[01] %3u", &code) != 1)
		return sw_seterr(err, errlen, -EPROTO, "not an HTTP/1.x response: %.40s", head);
	http10 = !strncmp(head, "HTTP/1.0", 8);
	c->status = (int)code;
	c->chunked = false;
	c->until_close = false;
	c->keep_alive = !http10;
	c->left = UINT64_MAX;
	for (p = strstr(head, "\r\n"); p && p[2]; p = eol) {
		char *name = p + 2, *colon, *v;

		eol = strstr(name, "\r\n");
		if (eol)
			*eol = '\0';
		colon = strchr(name, ':');
		if (colon) {
			*colon = '\0';
			for (v = colon + 1; *v == ' ' || *v == '\t'; v++)
				;
			if (!strcasecmp(name, "content-length"))
				c->left = strtoull(v, NULL, 10);
			else if (!strcasecmp(name, "transfer-encoding") && strcasestr(v, "chunked"))
				c->chunked = true;
			else if (!strcasecmp(name, "connection"))
				c->keep_alive = strcasestr(v, "close") ? false
					      : strcasestr(v, "keep-alive") ? true : c->keep_alive;
		}
		if (eol)
			*eol = '\r'; /* strstr continues from here */
		if (!eol)
			break;
	}
	c->at += hl;
	if (c->chunked)
		c->left = 0;
	else if (c->left == UINT64_MAX)
		c->until_close = !(code == 204 || code == 304 || code / 100 == 1);
	if (!c->chunked && !c->until_close && c->left == UINT64_MAX)
		c->left = 0;
	c->body_done = !c->chunked && !c->until_close && c->left == 0;
	c->l_at = c->l_end = 0;
	if (c->body_done && !c->keep_alive)
		bench_http_close(c);
	return 0;
}

int bench_http_request(struct bench_http *c, const struct bench_http_url *u,
		       const char *method, const char *path, const char *headers,
		       const char *body, size_t body_len, char *err, size_t errlen)
{
	char head[1024 + BENCH_HTTP_PATH_MAX * 2];
	int n, rc = 0;

	if (!c->body_done)
		bench_http_close(c); /* the last body was left unread */
	n = snprintf(head, sizeof(head), "%s %s%s HTTP/1.1\r\nHost: %s\r\n%s%s"
		     "Content-Length: %zu\r\n\r\n", method, u->prefix, path, u->hosthdr,
		     body ? "Content-Type: application/json\r\n" : "", headers ? headers : "",
		     body ? body_len : 0);
	if (n < 0 || (size_t)n >= sizeof(head))
		return sw_seterr(err, errlen, -ENAMETOOLONG, "request head too long");
	for (int attempt = 0; attempt < 2; attempt++) {
		bool reused = c->fd >= 0;

		if (!reused) {
			rc = http_connect(c, u, err, errlen);
			if (rc)
				return rc;
		}
		rc = send_all(c->fd, head, (size_t)n);
		if (!rc && body)
			rc = send_all(c->fd, body, body_len);
		if (!rc)
			rc = read_head(c, err, errlen);
		if (!rc)
			return 0;
		bench_http_close(c);
		/* a kept-alive connection the server closed meanwhile: once more */
		if (!reused || (rc != -ECONNRESET && rc != -EPIPE))
			break;
	}
	if (rc == -ECONNRESET || rc == -EPIPE)
		sw_seterr(err, errlen, rc, "the server closed the connection without a response");
	return rc;
}

long bench_http_read(struct bench_http *c, char *out, size_t cap)
{
	size_t k;
	int rc;

	if (c->body_done || cap == 0)
		return 0;
	if (c->chunked && c->left == 0) {
		char *line = raw_line(c, &rc), *e;

		if (!line)
			goto fail_rc;
		c->left = strtoull(line, &e, 16);
		if (e == line)
			return -EPROTO;
		if (c->left == 0) {
			do /* trailers up to the empty line */
				line = raw_line(c, &rc);
			while (line && *line);
			if (!line)
				goto fail_rc;
			goto done;
		}
	}
	if (!c->until_close && !c->chunked && c->left == 0)
		goto done;
	if (c->at == c->end) {
		long got = fill(c);

		if (got < 0)
			return got;
		if (got == 0) {
			if (c->until_close)
				goto done;
			bench_http_close(c);
			c->body_done = true;
			return -ECONNRESET;
		}
	}
	k = c->end - c->at;
	if (k > cap)
		k = cap;
	if (!c->until_close && k > c->left)
		k = (size_t)c->left;
	memcpy(out, c->buf + c->at, k);
	c->at += k;
	if (!c->until_close)
		c->left -= k;
	if (c->chunked && c->left == 0) {
		char *line = raw_line(c, &rc); /* the chunk's "\r\n" */

		if (!line)
			goto fail_rc;
	}
	return (long)k;
done:
	c->body_done = true;
	if (!c->keep_alive || c->until_close)
		bench_http_close(c);
	return 0;
fail_rc:
	bench_http_close(c);
	c->body_done = true;
	return rc;
}

long bench_http_line(struct bench_http *c, const char **line)
{
	for (;;) {
		char *s = c->line + c->l_at;
		char *nl = memchr(s, '\n', c->l_end - c->l_at);
		long k;

		if (nl) {
			size_t len = (size_t)(nl - s);

			if (len > 0 && s[len - 1] == '\r')
				len--;
			s[len] = '\0';
			c->l_at = (size_t)(nl - c->line) + 1;
			*line = s;
			return (long)len;
		}
		if (c->l_at > 0) {
			memmove(c->line, c->line + c->l_at, c->l_end - c->l_at);
			c->l_end -= c->l_at;
			c->l_at = 0;
		}
		if (c->l_end >= sizeof(c->line) - 1)
			return -EMSGSIZE;
		k = bench_http_read(c, c->line + c->l_end, sizeof(c->line) - 1 - c->l_end);
		if (k < 0)
			return k;
		if (k == 0) {
			if (c->l_end == 0)
				return -ENODATA;
			c->line[c->l_end] = '\0'; /* a last line without its newline */
			*line = c->line;
			k = (long)c->l_end;
			c->l_at = c->l_end = 0;
			return k;
		}
		c->l_end += (size_t)k;
	}
}

int bench_http_drain(struct bench_http *c)
{
	char tmp[4096];
	long k;

	while ((k = bench_http_read(c, tmp, sizeof(tmp))) > 0)
		;
	return k < 0 ? (int)k : 0;
}
