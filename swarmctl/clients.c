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
#include "common/redis_url.h"
#include "common/secret.h"

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

int ctl_redis_cmd(redisContext *c, redisReply **out, char *err, size_t errlen,
		 const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vcmd(c, out, err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

int ctl_redis_open(const char *url, uint32_t timeout_ms, redisContext **out, char *err,
		  size_t errlen)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000,
			      .tv_usec = (timeout_ms % 1000) * 1000 };
	struct sw_redis_url a;
	redisContext *c;
	redisReply *r;
	int rc;

	*out = NULL;
	rc = sw_redis_url_parse(url, &a, err, errlen);
	if (rc)
		return rc;
	if (sw_secret_redis()[0]) /* common/secret.h: wins over the URL's */
		snprintf(a.password, sizeof(a.password), "%s", sw_secret_redis());
	if (a.tls)
		return sw_seterr(err, errlen, -EINVAL, "redis: rediss:// (TLS) is not supported");
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
		/* Redis 6 ACLs: the URL's user, else the default one */
		rc = a.user[0] ? ctl_redis_cmd(c, &r, err, errlen, "AUTH %s %s", a.user, a.password) :
				 ctl_redis_cmd(c, &r, err, errlen, "AUTH %s", a.password);
		if (rc)
			goto out_free;
		freeReplyObject(r);
	}
	if (a.db) {
		rc = ctl_redis_cmd(c, &r, err, errlen, "SELECT %d", a.db);
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

int ctl_pg_open(const char *url, PGconn **out, char *err, size_t errlen)
{
	/* a stored password (common/secret.h) wins over the URL's */
	const char *keys[] = { "dbname", "connect_timeout", "application_name", "password", NULL };
	const char *vals[] = { url, "5", "swarmctl", sw_secret_pg()[0] ? sw_secret_pg() : NULL,
			       NULL };
	PGconn *c;

	*out = NULL;
	/* expand_dbname: url may be a URL or conninfo; the timeout applies
	 * unless the URL sets its own */
	c = PQconnectdbParams(keys, vals, 1);
	if (!c)
		return sw_seterr(err, errlen, -ENOMEM, "postgres: out of memory");
	if (PQstatus(c) != CONNECTION_OK) {
		char redacted[SW_CONFIG_URL_MAX], msg[SW_ERR_MAX];
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

int ctl_pg_query(PGconn *c, PGresult **out, char *err, size_t errlen, const char *sql,
		int n_params, const char *const *params)
{
	PGresult *r = PQexecParams(c, sql, n_params, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(r);

	*out = NULL;
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		char msg[SW_ERR_MAX];
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
