/* clients.h - swarmctl's connections to Redis and PostgreSQL, with the
 * messages an operator needs when they fail ("is the swarm running?").
 *
 * swarmctl is a short-lived command: these open one connection, run a
 * few commands and close; nothing here is on a hot path.
 */
#ifndef SWARMCTL_CLIENTS_H
#define SWARMCTL_CLIENTS_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

/* Connects to url: redis://[[user][:password]@]host[:port][/db] or
 * unix:///path (AUTH and SELECT as the URL says), with timeout_ms for the
 * connect and for every command. Returns 0 and *out (redisFree it), or
 * -EINVAL (bad URL), SW_ECLOSED (unreachable), -EIO (AUTH/SELECT refused),
 * -ENOMEM, with the message in err; *out is NULL on error. */
int ctl_redis_open(const char *url, uint32_t timeout_ms, redisContext **out, char *err,
		  size_t errlen);

/* Runs a command; an error reply or a broken connection is an error
 * (-EIO / SW_ECLOSED, message in err). On success *out is the reply
 * (freeReplyObject it). */
int ctl_redis_cmd(redisContext *c, redisReply **out, char *err, size_t errlen,
		 const char *fmt, ...);

/* Connects to a postgres URL or conninfo (5 s connect timeout). Returns 0
 * and *out (PQfinish it), or SW_ECLOSED with libpq's reason (the URL's
 * password redacted); *out is NULL on error. */
int ctl_pg_open(const char *url, PGconn **out, char *err, size_t errlen);

/* PQexecParams with text parameters; a result that is neither
 * COMMAND_OK nor TUPLES_OK is -EIO with the server's message (the result
 * is then cleared). On success *out is the result (PQclear it). */
int ctl_pg_query(PGconn *c, PGresult **out, char *err, size_t errlen, const char *sql,
		int n_params, const char *const *params);

#endif
