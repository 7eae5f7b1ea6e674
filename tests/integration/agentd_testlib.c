/* agentd_testlib.c - see agentd_testlib.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "common/time.h"
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

/* Makes dir from the mkdtemp template tmpl and starts a private server in
 * it (`test-servers.sh start -s what dir`); copies the value of the line
 * it printed starting with key into val. Returns 0 when it started and printed the
 * key; dir is "" when it could not be made. */
static int servers_start(const char *what, char *dir, size_t dirlen, const char *tmpl,
			 const char *key, char *val, size_t vallen)
{
	size_t klen = strlen(key);
	char cmd[512], line[512];
	FILE *p;

	val[0] = '\0';
	snprintf(dir, dirlen, "%s", tmpl);
	if (!mkdtemp(dir)) {
		dir[0] = '\0';
		return -1;
	}
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
	return servers_start("pg", pg->dir, sizeof(pg->dir), tmpl, "SWARM_TEST_PG_URL=", pg->url,
			     sizeof(pg->url));
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
	if (servers_start("redis", r->dir, sizeof(r->dir), tmpl, "SWARM_TEST_REDIS_URL=", r->url,
			  sizeof(r->url)) != 0)
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

void at_print_tail(const char *path, int lines)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "tail -n %d %s | cut -c1-300 >&2", lines, path);
	if (system(cmd) != 0)
		fprintf(stderr, "(no %s)\n", path);
}

int at_count_lines(const char *path, const char *a, const char *b)
{
	char line[4096];
	FILE *fp = fopen(path, "r");
	int n = 0;

	if (!fp)
		return 0;
	while (fgets(line, sizeof(line), fp))
		n += strstr(line, a) && (!b || strstr(line, b));
	fclose(fp);
	return n;
}

bool at_wait_lines(const char *path, int want, const char *a, const char *b, int ms)
{
	for (int t = 0; t < ms; t += 50) {
		if (at_count_lines(path, a, b) >= want)
			return true;
		sw_sleep_ms(50);
	}
	return false;
}

long long at_redis_int(redisContext *r, const char *cmd)
{
	redisReply *rep = redisCommand(r, cmd);
	long long v = -1;

	if (rep && rep->type == REDIS_REPLY_INTEGER)
		v = rep->integer;
	else if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
		 rep->element[0]->type == REDIS_REPLY_INTEGER)
		v = rep->element[0]->integer;
	freeReplyObject(rep);
	return v;
}

pid_t at_agentd_spawn(const char *config, const char *sql_dir, const char *out)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(fd, 1);
		dup2(fd, 2);
		execl(AGENTD_BIN, "agentd", "--config", config, "--sql-dir", sql_dir, (char *)NULL);
		_exit(127);
	}
	return pid;
}

int at_wait_pid(pid_t pid, int ms)
{
	int status;

	for (int t = 0; t <= ms; t += 50) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return status;
		sw_sleep_ms(50);
	}
	return -1;
}

static int agentd_counter;

struct at_agentd *at_agentd_new(const char *name, const char *redis_host, int redis_port)
{
	struct at_agentd *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	snprintf(a->dir, sizeof(a->dir), "/tmp/agentd-%s-XXXXXX", name);
	if (!mkdtemp(a->dir)) {
		free(a);
		return NULL;
	}
	snprintf(a->dbname, sizeof(a->dbname), "agentd_%s_%d_%d", name, (int)getpid(),
		 agentd_counter++);
	at_db_create(a->dbname, a->pg_url, sizeof(a->pg_url));
	a->pg = PQconnectdb(a->pg_url);
	snprintf(a->config, sizeof(a->config), "%s/swarm.json", a->dir);
	snprintf(a->status, sizeof(a->status), "%s/state/agentd.status.json", a->dir);
	snprintf(a->log, sizeof(a->log), "%s/agentd.log", a->dir);
	snprintf(a->out, sizeof(a->out), "%s/agentd.out", a->dir);
	a->redis = redisConnect(redis_host, redis_port);
	if (!a->redis || a->redis->err) {
		at_agentd_free(a, NULL);
		return NULL;
	}
	return a;
}

void at_agentd_start(struct at_agentd *a, const char *sql_dir)
{
	a->sup = at_agentd_spawn(a->config, sql_dir, a->out);
}

int at_agentd_wait(struct at_agentd *a, int ms)
{
	int status = at_wait_pid(a->sup, ms);

	if (status != -1)
		a->sup = 0;
	return status;
}

void at_agentd_stop(struct at_agentd *a)
{
	int status;

	kill(a->sup, SIGTERM);
	status = at_agentd_wait(a, 40000);
	if (status == -1)
		fail_msg("agentd did not exit within 40 s of SIGTERM");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail_msg("agentd: wait status %d", status);
}

void at_agentd_free(struct at_agentd *a, const char *redis_reset)
{
	char cmd[128];
	int status;

	if (!a)
		return;
	if (a->sup > 0) {
		kill(a->sup, SIGKILL);
		waitpid(a->sup, &status, 0);
		at_print_tail(a->log, 40);
		at_print_tail(a->out, 10);
	}
	if (redis_reset && a->redis && !a->redis->err)
		freeReplyObject(redisCommand(a->redis, redis_reset));
	redisFree(a->redis);
	PQfinish(a->pg);
	at_db_drop(a->dbname);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", a->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", a->dir);
	free(a);
}

/* The string member key of o copied into out ("" when absent). */
static void copy_str(json_t *o, const char *key, char *out, size_t len)
{
	const char *v = json_string_value(json_object_get(o, key));

	snprintf(out, len, "%s", v ? v : "");
}

int at_agentd_workers(const struct at_agentd *a, struct at_worker *w, char *sup_state,
		      size_t len)
{
	json_t *root = json_load_file(a->status, 0, NULL), *e;
	size_t i;
	int n = 0;

	if (!root)
		return -1;
	if (sup_state)
		copy_str(root, "state", sup_state, len);
	json_array_foreach(json_object_get(root, "workers"), i, e) {
		if (n >= AT_MAX_WORKERS)
			break;
		w[n].pid = (int)json_integer_value(json_object_get(e, "pid"));
		copy_str(e, "state", w[n].state, sizeof(w[n].state));
		w[n].spawns = json_integer_value(json_object_get(e, "spawns"));
		w[n].crashes = json_integer_value(json_object_get(e, "crashes"));
		w[n].recycles = json_integer_value(json_object_get(e, "recycles"));
		w[n].hangs = json_integer_value(json_object_get(e, "hangs"));
		w[n].done = json_integer_value(json_object_get(e, "done"));
		copy_str(e, "last_exit", w[n].last_exit, sizeof(w[n].last_exit));
		copy_str(e, "activity", w[n].activity, sizeof(w[n].activity));
		n++;
	}
	json_decref(root);
	return n;
}

bool at_agentd_wait_running(const struct at_agentd *a, int n, struct at_worker *w, int ms)
{
	struct at_worker own[AT_MAX_WORKERS];

	if (!w)
		w = own;
	for (int t = 0; t < ms; t += 50) {
		int got = at_agentd_workers(a, w, NULL, 0), running = 0;

		for (int i = 0; i < got; i++)
			running += strcmp(w[i].state, "running") == 0;
		if (got == n && running == n)
			return true;
		sw_sleep_ms(50);
	}
	return false;
}
