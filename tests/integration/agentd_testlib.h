/* agentd_testlib.h - setup shared by the agentd integration tests: admin
 * SQL on the test server, a private PostgreSQL that a test may restart, and
 * `agentd --config` run as a process (AGENTD_BIN) with its status file and
 * log read back. */
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

#include <sys/types.h>

/* Prints the last `lines` lines of path to stderr, each cut to 300
 * columns, or "(no PATH)": what a failed test shows of a log. */
void at_print_tail(const char *path, int lines);

/* Lines of path containing a and, when b is not NULL, b too; 0 when path
 * cannot be read. */
int at_count_lines(const char *path, const char *a, const char *b);

/* Polls at_count_lines() every 50 ms until it is at least want; false
 * when ms passed first. */
bool at_wait_lines(const char *path, int want, const char *a, const char *b, int ms);

/* The integer reply of cmd on r (the first element of an array reply: an
 * XPENDING summary's count); -1 for any other reply or none. */
long long at_redis_int(redisContext *r, const char *cmd);

/* Forks `AGENTD_BIN --config config --sql-dir sql_dir` (the supervisor)
 * with its stdout and stderr in out (truncated). Returns its pid; a failed
 * fork fails the test. The caller reaps it. */
pid_t at_agentd_spawn(const char *config, const char *sql_dir, const char *out);

/* Waits up to ms for pid to exit (polling every 50 ms); returns its wait
 * status, or -1 while it still runs. */
int at_wait_pid(pid_t pid, int ms);

/* One test's `agentd --config`: a fresh directory for its files, a fresh
 * database, connections to both servers. The test writes config (its
 * state_dir dir/state, its log file log) before at_agentd_start(). */
struct at_agentd {
	char dir[64];         /* removed by at_agentd_free() */
	char dbname[64];      /* on it_pg_url(), dropped by at_agentd_free() */
	char pg_url[1024];    /* dbname's URL */
	char config[256];     /* dir/swarm.json */
	char status[256];     /* dir/state/agentd.status.json (state_dir = dir/state) */
	char log[256];        /* dir/agentd.log */
	char out[256];        /* dir/agentd.out: the process's stdout and stderr */
	redisContext *redis;  /* connected to the Redis at_agentd_new() was given */
	PGconn *pg;           /* connected to pg_url */
	pid_t sup;            /* the running agentd, 0 when none */
};

/*
 * A new at_agentd: its directory (/tmp/agentd-NAME-XXXXXX) and database
 * (agentd_NAME_PID_N) made, connected to them and to Redis at host:port.
 * NULL when the directory or the Redis connection could not be made
 * (nothing is left); a failed CREATE DATABASE fails the test.
 */
struct at_agentd *at_agentd_new(const char *name, const char *redis_host, int redis_port);

/* Spawns agentd on a->config (at_agentd_spawn) into a->sup. */
void at_agentd_start(struct at_agentd *a, const char *sql_dir);

/* at_wait_pid() on a->sup; a->sup becomes 0 once it exited. */
int at_agentd_wait(struct at_agentd *a, int ms);

/* SIGTERM, then waits up to 40 s: the test fails unless agentd exits 0. */
void at_agentd_stop(struct at_agentd *a);

/* Frees a (NULL is fine): a running agentd, what a failed test leaves, is
 * killed (-9; its workers drain by themselves) and the tails of its log
 * and output are printed; then redis_reset (a Redis command to undo what
 * the test changed; NULL: none) runs, the connections close, the database
 * is dropped and the directory removed. */
void at_agentd_free(struct at_agentd *a, const char *redis_reset);

/* The most worker slots at_agentd_workers() reads. */
#define AT_MAX_WORKERS 8

/* One worker slot as agentd's status file shows it. */
struct at_worker {
	int pid;
	char state[16];
	long long spawns, crashes, recycles, hangs, done;
	char last_exit[32];
	char activity[16];
};

/* Reads a->status into w[] (up to AT_MAX_WORKERS) and, when sup_state is
 * not NULL, its "state" into sup_state. Returns the number of workers, or
 * -1 when the file cannot be read (not written yet). */
int at_agentd_workers(const struct at_agentd *a, struct at_worker *w, char *sup_state,
		      size_t len);

/* Polls until the status file shows n workers, every one "running" (it
 * has beaten); w (NULL: not wanted) holds what was read last. False when
 * ms passed first. */
bool at_agentd_wait_running(const struct at_agentd *a, int n, struct at_worker *w, int ms);

#endif
