/* http_client.h - the small HTTP/1.1 client of gpud-load --http: one
 * blocking keep-alive connection per stream, a request with a body, the
 * response's status and body (Content-Length, chunked, or up to the
 * close), and the body split into lines for server-sent events.
 *
 * No TLS, no redirects, no proxies: it loads a gpud-http next to it.
 * Every read and write is bounded by the connection's timeout
 * (SO_RCVTIMEO/SO_SNDTIMEO). Nothing allocates after bench_http_open.
 */
#ifndef BENCH_HTTP_CLIENT_H
#define BENCH_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_HTTP_HOST_MAX 256
#define BENCH_HTTP_PATH_MAX 256
#define BENCH_HTTP_BUF 65536

/* "http://HOST[:PORT][/PREFIX]" split up; HOST may be "[v6]". */
struct bench_http_url {
	char host[BENCH_HTTP_HOST_MAX];  /* without brackets */
	char hosthdr[BENCH_HTTP_HOST_MAX + 8]; /* the Host header: as written */
	char port[8];
	char prefix[BENCH_HTTP_PATH_MAX];  /* "" or "/something", no trailing '/' */
};

struct bench_http {
	int fd;                     /* -1 while closed */
	uint32_t timeout_ms;
	char buf[BENCH_HTTP_BUF];   /* received bytes not consumed yet */
	size_t at, end;
	/* the response in progress */
	int status;
	bool chunked, until_close, keep_alive, body_done;
	uint64_t left;              /* of the body (length) or of the current chunk */
	char line[BENCH_HTTP_BUF];  /* body bytes bench_http_line has not returned */
	size_t l_at, l_end;
};

/* Parses url into u. Returns 0 or -EINVAL with a message. */
int bench_http_url_parse(const char *url, struct bench_http_url *u, char *err, size_t errlen);

/* A closed connection with timeout_ms for every wait. */
void bench_http_init(struct bench_http *c, uint32_t timeout_ms);

/* Closes the connection (safe when closed). */
void bench_http_close(struct bench_http *c);

/* Sends "METHOD PREFIX+PATH" with extra header lines (each ending in
 * "\r\n"; NULL for none) and body (NULL for none), connecting first when
 * closed (once more when a kept-alive connection turns out closed), then
 * reads the status line and headers. Returns 0 with c->status set, or a
 * negative code with a message. */
int bench_http_request(struct bench_http *c, const struct bench_http_url *u,
		       const char *method, const char *path, const char *headers,
		       const char *body, size_t body_len, char *err, size_t errlen);

/* Up to cap bytes of the body into out. Returns the count, 0 at the end
 * of the body (then the connection is reusable, or closed), or a
 * negative code. */
long bench_http_read(struct bench_http *c, char *out, size_t cap);

/* The next line of the body (without "\r\n" / "\n", NUL-terminated) in
 * *line. Returns its length (>= 0), -ENODATA at the end of the body, or
 * another negative code. A line longer than the buffer is an error
 * (-EMSGSIZE). */
long bench_http_line(struct bench_http *c, const char **line);

/* Reads the rest of the body and drops it; a body left unread closes the
 * connection. Returns 0 or a negative code. */
int bench_http_drain(struct bench_http *c);

#endif
