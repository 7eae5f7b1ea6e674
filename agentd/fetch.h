/* fetch.h - documents by URL for ingest, callback POSTs (libcurl).
 *
 * http, https and file only; redirects are followed up to max_redirects
 * and only to http or https (a web page never gets to redirect into the
 * worker's file system). The body is capped at max_bytes: a larger
 * Content-Length is refused before the transfer, a body that grows past
 * the cap is cut off. Connect and total timeouts bound every fetch.
 *
 * Trust boundary (DESIGN §6a): a URL comes from whoever can write a task,
 * so what it may reach is the policy's, never the URL's:
 *   - file:// reads only files whose path, after resolving symlinks, lies
 *     below one of policy->file_dirs (whole components: /data does not
 *     hold /data2/x); the file actually opened is checked again, so a
 *     symlink swapped in meanwhile gains nothing. No directories: file://
 *     is refused.
 *   - http(s): every address libcurl connects to (after DNS, at each
 *     connect, each redirect hop included) must be public
 *     (common/addr.h) or inside one of policy->allow; a refused address
 *     is never connected to. Proxies from the environment are ignored
 *     (through a proxy the address of the target could not be checked).
 *     A host written as an IPv4 number in another form than a.b.c.d
 *     (0x7f000001, 2130706433, 127.1) is refused.
 *
 * Errors (with the URL and the reason in err):
 *   -EACCES        the policy refuses it: "fetch: URL: 10.0.0.5 is a
 *                  private address; allow it with agentd.fetch.allow_cidrs",
 *                  or a file outside agentd.fetch.file_dirs;
 *   -EINVAL        not a URL, a scheme other than http, https, file, a
 *                  file URL naming a host, a non-standard IPv4 host, a file
 *                  that is not a regular file;
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

#include "common/addr.h"
#include "common/config.h"

/* What fetches may reach, from agentd.fetch in the configuration. Plain
 * data; zeroed = the default (no file://, public addresses only). */
struct agent_fetch_policy {
	char file_dirs[SW_CONFIG_FETCH_DIRS_MAX][SW_CONFIG_PATH_MAX]; /* absolute */
	uint32_t n_file_dirs;
	struct sw_cidr allow[SW_CONFIG_FETCH_CIDRS_MAX];
	uint32_t n_allow;
};

/* Fills *p from cfg->agentd.fetch. Returns 0, or -EINVAL naming the
 * entry (a config that passed sw_config_load never fails here). */
int agent_fetch_policy_init(struct agent_fetch_policy *p, const struct sw_config *cfg,
			    char *err, size_t errlen);

struct agent_fetch_opts {
	size_t max_bytes;            /* 0 = 8 MiB */
	uint32_t connect_timeout_ms; /* 0 = 5000 */
	uint32_t timeout_ms;         /* whole transfer; 0 = 30000 */
	uint32_t max_redirects;      /* default 5 when the struct is zeroed
				      * and no_redirects is false */
	bool no_redirects;           /* refuse any redirect */
	/* Borrowed; NULL = the default policy (no file://, public addresses
	 * only). */
	const struct agent_fetch_policy *policy;
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
 * unreachable hosts, -EAGAIN. Never a policy refusal (-EACCES). */
bool agent_fetch_transient(int code);

#endif
