/* agentd_testlib.h - setup shared by the agentd integration tests: admin
 * SQL on the test server, and a private PostgreSQL that a test may restart. */
#ifndef AGENTD_TESTLIB_H
#define AGENTD_TESTLIB_H

/* Runs one SQL command (no result rows) on it_pg_url() in its own
 * connection; a failed connection or command fails the current cmocka
 * test with the server's message. */
void at_admin(const char *sql);

/* A private PostgreSQL started by scripts/lib/test-servers.sh. */
struct at_pg {
	char dir[64];   /* its state directory, "" when none */
	char url[512];  /* SWARM_TEST_PG_URL it printed */
};

/*
 * Starts a private PostgreSQL in a fresh directory made from tmpl (a
 * mkdtemp template, at most 63 bytes, e.g. "/tmp/agentd-pg-XXXXXX"), owned
 * by this process. Returns 0, or -1 when it could not start; pg->dir is
 * then whatever was made, so call at_pg_stop() either way.
 */
int at_pg_start(struct at_pg *pg, const char *tmpl);

/* Stops the server and removes its directory. Idempotent. */
void at_pg_stop(struct at_pg *pg);

/* pg_ctl restart -m fast: every session is terminated, the server is down
 * for a moment, then back with the same options. Fails the test if the
 * restart fails. */
void at_pg_restart(const struct at_pg *pg);

/* A private Redis started by scripts/lib/test-servers.sh, for a test
 * that changes the server's configuration (CONFIG SET maxmemory). */
struct at_redis {
	char dir[64];   /* its state directory, "" when none */
	char url[512];  /* redis://127.0.0.1:PORT */
	char host[64];
	int port;
};

/* Starts a private Redis in a fresh directory made from tmpl (as
 * at_pg_start). Returns 0, or -1 when it could not start; call
 * at_redis_stop() either way. */
int at_redis_start(struct at_redis *r, const char *tmpl);

/* Stops the server and removes its directory. Idempotent. */
void at_redis_stop(struct at_redis *r);

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

/* Creates database name on it_pg_url() (the test fails if it cannot) and
 * writes a URL for it into url (it_pg_url() with its database replaced). */
void at_db_create(const char *name, char *url, size_t urllen);

/* Drops database name if it exists, ending its sessions. */
void at_db_drop(const char *name);

/* The integer value of a one-row, one-column query on c, -1 when the
 * query fails or returns another shape. */
long long at_pg_int(PGconn *c, const char *sql);

/* Polls at_pg_int(c, sql) every poll_ms until it equals want; false when
 * ms passed first. */
bool at_pg_wait_eq(PGconn *c, const char *sql, long long want, int ms, int poll_ms);

/* at_pg_int() that first reconnects *c if its connection broke (a
 * restarted server). */
long long at_pg_count(PGconn **c, const char *sql);

/* Polls at_pg_count(c, sql) every poll_ms until it is at least at_least;
 * false when ms passed first. */
bool at_pg_wait_at_least(PGconn **c, const char *sql, long long at_least, int ms,
			 int poll_ms);


#include <hiredis/hiredis.h>

/* A short English story (~600 bytes, no quotes or backslashes) for ingest
 * and summarize tasks. */
extern const char at_story[];

/* Entries pending in consumer group `agents` of stream (XPENDING), all
 * consumers; a lost connection or a non-array reply fails the test. */
long long at_redis_pending(redisContext *r, const char *stream);

/* Deletes the three streams of a test (DEL stream dead results); errors
 * are ignored. */
void at_streams_del(redisContext *r, const char *stream, const char *dead,
		    const char *results);

#endif
