/* agentd_testlib.c - see agentd_testlib.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "sw_config.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

#define PG_CTL "/usr/lib/postgresql/15/bin/pg_ctl"

const char at_story[] =
	"Once upon a time there was a little cat named Tom. Tom liked to play in the garden. "
	"One day he saw a big red ball under the tree. He ran to the ball and pushed it. "
	"The ball rolled down the hill and Tom ran after it. At the bottom of the hill he met a "
	"dog named Max. Max was friendly and wanted to play too. Together they played with the "
	"ball all afternoon. When the sun went down Tom went home. His mom gave him milk and he "
	"fell asleep happy. The next morning Tom ran back to the hill to find Max again.";

void at_admin(const char *sql)
{
	PGconn *c = PQconnectdb(it_pg_url());
	PGresult *r;

	if (PQstatus(c) != CONNECTION_OK)
		fail_msg("connecting for %s: %s", sql, PQerrorMessage(c));
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		fail_msg("%s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	PQfinish(c);
}

/* Runs `test-servers.sh start -s what dir`; copies the value of the
 * line starting with key into val. Returns 0 when it started and printed
 * the key. */
static int servers_start(const char *what, const char *dir, const char *key, char *val,
			 size_t vallen)
{
	size_t klen = strlen(key);
	char cmd[512], line[512];
	FILE *p;

	val[0] = '\0';
	snprintf(cmd, sizeof(cmd), "%s/scripts/lib/test-servers.sh start -o %d -s %s %s",
		 SW_SOURCE_ROOT, (int)getpid(), what, dir);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while (fgets(line, sizeof(line), p))
		if (strncmp(line, key, klen) == 0)
			snprintf(val, vallen, "%.*s", (int)strcspn(line + klen, "\n"), line + klen);
	return pclose(p) == 0 && val[0] ? 0 : -1;
}

int at_pg_start(struct at_pg *pg, const char *tmpl)
{
	pg->url[0] = '\0';
	snprintf(pg->dir, sizeof(pg->dir), "%s", tmpl);
	if (!mkdtemp(pg->dir)) {
		pg->dir[0] = '\0';
		return -1;
	}
	return servers_start("pg", pg->dir, "SWARM_TEST_PG_URL=", pg->url, sizeof(pg->url));
}

/* Stops what servers_start left in dir and removes it; dir becomes "". */
static void servers_stop(char *dir, const char *what)
{
	char cmd[512];

	if (!dir[0])
		return;
	snprintf(cmd, sizeof(cmd), "%s/scripts/lib/test-servers.sh stop %s >/dev/null 2>&1",
		 SW_SOURCE_ROOT, dir);
	if (system(cmd) != 0)
		fprintf(stderr, "stopping the private %s failed\n", what);
	dir[0] = '\0';
}

void at_pg_stop(struct at_pg *pg)
{
	servers_stop(pg->dir, "PostgreSQL");
}

void at_pg_restart(const struct at_pg *pg)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd),
		 "%s %s -D %s/pg/data -m fast -w -t 60 -s restart >/dev/null 2>&1",
		 getuid() == 0 ? "runuser -u postgres --" : "", PG_CTL, pg->dir);
	assert_int_equal(system(cmd), 0);
}

int at_redis_start(struct at_redis *r, const char *tmpl)
{
	r->url[0] = '\0';
	snprintf(r->dir, sizeof(r->dir), "%s", tmpl);
	if (!mkdtemp(r->dir)) {
		r->dir[0] = '\0';
		return -1;
	}
	if (servers_start("redis", r->dir, "SWARM_TEST_REDIS_URL=", r->url, sizeof(r->url)) != 0)
		return -1;
	return it_parse_redis_url(r->url, r->host, sizeof(r->host), &r->port);
}

void at_redis_stop(struct at_redis *r)
{
	servers_stop(r->dir, "Redis");
}

void at_db_create(const char *name, char *url, size_t urllen)
{
	const char *base = it_pg_url(), *path;
	char sql[256];

	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
	at_admin(sql);
	path = strchr(strstr(base, "://") + 3, '/');
	snprintf(url, urllen, "%.*s/%s", (int)(path - base), base, name);
}

void at_db_drop(const char *name)
{
	char sql[256];

	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", name);
	at_admin(sql);
}

long long at_pg_int(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	long long v = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return v;
}

bool at_pg_wait_eq(PGconn *c, const char *sql, long long want, int ms, int poll_ms)
{
	for (int t = 0; t < ms; t += poll_ms) {
		if (at_pg_int(c, sql) == want)
			return true;
		usleep((useconds_t)poll_ms * 1000);
	}
	return false;
}

long long at_pg_count(PGconn **c, const char *sql)
{
	if (PQstatus(*c) != CONNECTION_OK)
		PQreset(*c);
	return at_pg_int(*c, sql);
}

bool at_pg_wait_at_least(PGconn **c, const char *sql, long long at_least, int ms, int poll_ms)
{
	for (int t = 0; t < ms; t += poll_ms) {
		if (at_pg_count(c, sql) >= at_least)
			return true;
		usleep((useconds_t)poll_ms * 1000);
	}
	return false;
}

long long at_redis_pending(redisContext *r, const char *stream)
{
	redisReply *rep = redisCommand(r, "XPENDING %s agents", stream);
	long long v;

	if (!rep)
		fail_msg("redis: %s", r->errstr);
	assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
	v = rep->element[0]->integer;
	freeReplyObject(rep);
	return v;
}

void at_streams_del(redisContext *r, const char *stream, const char *dead, const char *results)
{
	freeReplyObject(redisCommand(r, "DEL %s %s %s", stream, dead, results));
}
