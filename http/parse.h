/* parse.h - the strict HTTP/1.1 request-head parser of gpud-http.
 *
 * Pure and allocation-free: the caller accumulates bytes (at most its own
 * header limit) and calls http_parse_head until it returns the head's
 * length. Only what the front needs is understood; the rest is checked
 * for syntax and skipped. Strict means: a request line of exactly
 * METHOD SP TARGET SP HTTP/1.x, CRLF line ends only, header names of
 * token characters, no obsolete line folding, no whitespace before the
 * colon, no NUL or other controls in values, one Content-Length (or
 * identical copies), and never both Content-Length and Transfer-Encoding
 * (request smuggling). Bodies must come with Content-Length: a chunked
 * body is refused (411), as every client of this API sends a length.
 */
#ifndef HTTP_PARSE_H
#define HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_METHOD_MAX 16

/* The parsed head. Pointers point into the caller's buffer. */
struct http_head {
	char method[HTTP_METHOD_MAX];   /* NUL-terminated, e.g. "POST" */
	const char *path;               /* the target up to '?' (not NUL-terminated) */
	size_t path_len;
	int minor;                      /* HTTP/1.minor: 0 or 1 */
	bool has_length;
	uint64_t content_length;        /* 0 when !has_length */
	bool keep_alive;                /* by version default and Connection */
	bool expect_continue;           /* Expect: 100-continue */
	const char *auth;               /* Authorization value, or NULL */
	size_t auth_len;
};

/* Parses the head at the start of buf[0, len). Returns the head's length
 * (through the blank line) when complete; 0 when more bytes are needed
 * (no blank line yet, and what is there is not already invalid); or -1
 * with *status set to the HTTP status to answer before closing (400 bad
 * syntax, 411 chunked or unknown transfer coding, 501 for a method that
 * is not a token, 505 a version other than 1.0/1.1) and *why to a short
 * static reason. */
long http_parse_head(const char *buf, size_t len, struct http_head *h, int *status,
		     const char **why);

/* True when the path is exactly s. */
bool http_path_is(const struct http_head *h, const char *s);

#endif
