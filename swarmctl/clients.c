/* clients.c - Redis and PostgreSQL connections for swarmctl (see
 * clients.h). */
#include "swarmctl/clients.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"

struct redis_addr {
	char unix_path[4096];
	char host[256];
	char password[256];
	int port, db;
};

/* redis://[[user]:password@]host[:port][/db] or unix:///path */
static int parse_redis_url(const char *url, struct redis_addr *a, char *err, size_t errlen)
{
	const char *h, *at, *end;
	size_t n;

	memset(a, 0, sizeof(*a));
	a->port = 6379;
	if (!strncmp(url, "unix://", 7)) {
		if (!url[7] || strlen(url + 7) >= sizeof(a->unix_path))
			return sw_seterr(err, errlen, -EINVAL, "redis: bad socket path in \"%s\"",
					 url);
		snprintf(a->unix_path, sizeof(a->unix_path), "%s", url + 7);
		return 0;
	}
	if (strncmp(url, "redis://", 8) != 0)
		return sw_seterr(err, errlen, -EINVAL, "redis: unsupported URL \"%s\" (expected "
				 "redis:// or unix://)", url);
	h = url + 8;
	end = h + strcspn(h, "/");
	at = memchr(h, '@', (size_t)(end - h));
	if (at) {
		const char *colon = memchr(h, ':', (size_t)(at - h));

		if (colon) {
			n = (size_t)(at - colon - 1);
			if (n >= sizeof(a->password))
				return sw_seterr(err, errlen, -EINVAL, "redis: password too long");
			memcpy(a->password, colon + 1, n);
		}
		h = at + 1;
	}
	n = strcspn(h, ":/");
	if (n == 0 || n >= sizeof(a->host))
		return sw_seterr(err, errlen, -EINVAL, "redis: no host in URL");
	memcpy(a->host, h, n);
	h += n;
	if (*h == ':') {
		char *stop;
		long p = strtol(h + 1, &stop, 10);

		if (stop == h + 1 || p < 1 || p > 65535 || (*stop && *stop != '/'))
			return sw_seterr(err, errlen, -EINVAL, "redis: bad port in URL");
		a->port = (int)p;
		h = stop;
	}
	if (*h == '/' && h[1]) {
		char *stop;
		long d = strtol(h + 1, &stop, 10);

		if (stop == h + 1 || *stop || d < 0 || d > 1000000)
			return sw_seterr(err, errlen, -EINVAL, "redis: bad database number in URL");
		a->db = (int)d;
	}
	return 0;
}

static int vcmd(redisContext *c, redisReply **out, char *err, size_t errlen, const char *fmt,
		va_list ap)
{
	redisReply *r = redisvCommand(c, fmt, ap);

	*out = NULL;
	if (!r)
		return sw_seterr(err, errlen, SW_ECLOSED, "redis: connection lost: %s",
				 c->errstr[0] ? c->errstr : "no reply");
	if (r->type == REDIS_REPLY_ERROR) {
		int rc = sw_seterr(err, errlen, -EIO, "redis: %s", r->str);

		freeReplyObject(r);
		return rc;
	}
	*out = r;
	return 0;
}

int sc_redis_cmd(redisContext *c, redisReply **out, char *err, size_t errlen,
		 const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vcmd(c, out, err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

int sc_redis_open(const char *url, uint32_t timeout_ms, redisContext **out, char *err,
		  size_t errlen)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000,
			      .tv_usec = (timeout_ms % 1000) * 1000 };
	struct redis_addr a;
	redisContext *c;
	redisReply *r;
	int rc;

	*out = NULL;
	rc = parse_redis_url(url, &a, err, errlen);
	if (rc)
		return rc;
	c = a.unix_path[0] ? redisConnectUnixWithTimeout(a.unix_path, tv)
			   : redisConnectWithTimeout(a.host, a.port, tv);
	if (!c)
		return sw_seterr(err, errlen, -ENOMEM, "redis: out of memory");
	if (c->err) {
		if (a.unix_path[0])
			rc = sw_seterr(err, errlen, SW_ECLOSED, "redis: cannot connect to %s: %s",
				       a.unix_path, c->errstr);
		else
			rc = sw_seterr(err, errlen, SW_ECLOSED, "redis: cannot connect to %s:%d: %s",
				       a.host, a.port, c->errstr);
		redisFree(c);
		return rc;
	}
	redisSetTimeout(c, tv);
	if (a.password[0]) {
		rc = sc_redis_cmd(c, &r, err, errlen, "AUTH %s", a.password);
		if (rc)
			goto out_free;
		freeReplyObject(r);
	}
	if (a.db) {
		rc = sc_redis_cmd(c, &r, err, errlen, "SELECT %d", a.db);
		if (rc)
			goto out_free;
		freeReplyObject(r);
	}
	*out = c;
	return 0;
out_free:
	redisFree(c);
	return rc;
}

static void pg_quiet(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

int sc_pg_open(const char *url, PGconn **out, char *err, size_t errlen)
{
	const char *keys[] = { "dbname", "connect_timeout", "application_name", NULL };
	const char *vals[] = { url, "5", "swarmctl", NULL };
	PGconn *c;

	*out = NULL;
	/* expand_dbname: url may be a URL or conninfo; the timeout applies
	 * unless the URL sets its own */
	c = PQconnectdbParams(keys, vals, 1);
	if (!c)
		return sw_seterr(err, errlen, -ENOMEM, "postgres: out of memory");
	if (PQstatus(c) != CONNECTION_OK) {
		char redacted[SW_CONFIG_URL_MAX], msg[512];
		size_t n;

		snprintf(msg, sizeof(msg), "%s", PQerrorMessage(c));
		n = strlen(msg);
		while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
			msg[--n] = '\0';
		sw_config_redact_url(url, redacted, sizeof(redacted));
		PQfinish(c);
		return sw_seterr(err, errlen, SW_ECLOSED, "postgres at %s: %s", redacted, msg);
	}
	/* swarmctl's queries need no NOTICEs on the operator's terminal */
	PQsetNoticeProcessor(c, pg_quiet, NULL);
	*out = c;
	return 0;
}

int sc_pg_query(PGconn *c, PGresult **out, char *err, size_t errlen, const char *sql,
		int n_params, const char *const *params)
{
	PGresult *r = PQexecParams(c, sql, n_params, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);

	*out = NULL;
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		char msg[512];
		size_t n;

		snprintf(msg, sizeof(msg), "%s", PQerrorMessage(c));
		n = strlen(msg);
		while (n && msg[n - 1] == '\n')
			msg[--n] = '\0';
		PQclear(r);
		return sw_seterr(err, errlen, PQstatus(c) == CONNECTION_OK ? -EIO : SW_ECLOSED,
				 "postgres: %s", msg);
	}
	*out = r;
	return 0;
}
