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

#endif
