/* fetch.h - documents by URL for ingest (libcurl).
 *
 * http, https and file only; redirects are followed up to max_redirects
 * and only to http or https (a web page never gets to redirect into the
 * worker's file system). The body is capped at max_bytes: a larger
 * Content-Length is refused before the transfer, a body that grows past
 * the cap is cut off. Connect and total timeouts bound every fetch.
 *
 * Errors (with the URL and the reason in err):
 *   -EINVAL        not a URL, or a scheme other than http, https, file;
 *   SW_ETOOLONG    the body exceeds max_bytes;
 *   SW_ENOTFOUND   HTTP 404 or 410, or no such file;
 *   -ELOOP         more than max_redirects redirects;
 *   -ETIMEDOUT     a timeout;
 *   -ECONNREFUSED  nothing listens (or the host cannot be resolved:
 *                  -EHOSTUNREACH);
 *   -EAGAIN        HTTP 429 or 5xx: the server may do better later;
 *   -EIO           another HTTP status >= 400 or a transfer error;
 *   -ENOMEM.
 * agent_fetch_transient() tells which are worth a retry.
 */
#ifndef AGENT_FETCH_H
#define AGENT_FETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct agent_fetch_opts {
	size_t max_bytes;            /* 0 = 8 MiB */
	uint32_t connect_timeout_ms; /* 0 = 5000 */
	uint32_t timeout_ms;         /* whole transfer; 0 = 30000 */
	uint32_t max_redirects;      /* default 5 when the struct is zeroed
				      * and no_redirects is false */
	bool no_redirects;           /* refuse any redirect */
};

/* Initializes libcurl once for the process (call from main before any
 * thread starts). Returns 0, or -EIO with libcurl's reason in err. */
int agent_fetch_global_init(char *err, size_t errlen);

/* Fetches url into a malloc'd, NUL-terminated *body of *len bytes (the
 * caller frees it). opts NULL = defaults. On error *body is NULL. */
int agent_fetch(const char *url, const struct agent_fetch_opts *opts, char **body, size_t *len,
		char *err, size_t errlen);

/* POSTs len bytes of JSON to url (callbacks). Returns 0 for a 2xx reply,
 * otherwise an error as agent_fetch. */
int agent_fetch_post_json(const char *url, const char *json, size_t len,
			  const struct agent_fetch_opts *opts, char *err, size_t errlen);

/* True for errors a later retry may cure: timeouts, refused or
 * unreachable hosts, -EAGAIN. */
bool agent_fetch_transient(int code);

#endif
