/* bench_agentd.c - tasks per second through the whole stack: `agentd
 * --config FILE` (supervisor + W worker processes) against Redis,
 * PostgreSQL + pgvector and a running `gpud serve`, for each W in the
 * list; and where the time goes, as CPU time per task of each process
 * group (agentd: supervisor and workers; redis-server; every PostgreSQL
 * process of the server; gpud) measured from /proc over the timed
 * window.
 *
 *   bench_agentd --agentd BIN --gpud-socket PATH [--tasks N] [--workers 1,4,16]
 *                [--max-tokens T] [--kind answer|ingest] [--text-bytes B]
 *                [--results-maxlen N]
 *
 * Servers: SWARM_TEST_REDIS_URL (redis://HOST:PORT; database 7 is used
 * and flushed) and SWARM_TEST_PG_URL (a superuser URL: one database is
 * created per run and dropped after; the server's data directory gives
 * the postmaster pid). Each run: one ingest of a short story (untimed),
 * then N tasks queued at once; the clock runs from the XADDs to the last
 * task's row. Prints a table; asserts nothing on a time.
 *
 * Redis memory (issue 11, "nothing grows without bound"): after each run
 * a second line gives Redis's used_memory before the N tasks were queued,
 * with all N queued (the peak a backlog costs), and once they are done,
 * per task; and what each stream still holds (XLEN, MEMORY USAGE).
 * --text-bytes B makes each ingest carry B bytes of inline text (distinct
 * per task; default one sentence); --results-maxlen sets
 * agentd.results_maxlen (default: agentd's).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "bench/bench_util.h"
#include "common/err.h"
#include "proto/client.h"
#include "proto/task.h"

#define REDIS_DB 7
#define MAX_RUNS 8

enum group { G_AGENTD, G_REDIS, G_PG, G_GPUD, N_GROUPS };

static const char *const group_names[N_GROUPS] = { "agentd", "redis", "postgres", "gpud" };

struct opts {
	const char *agentd, *gpud_socket, *kind;
	int tasks, max_tokens, text_bytes, results_maxlen;
	int workers[MAX_RUNS], n_runs;
};

static long clk_tck;

/* utime + stime (+ cutime + cstime when children) of pid in ticks, and
 * its parent. Returns false when the process is gone. */
static bool proc_cpu(int pid, bool children, long long *ticks, int *ppid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut, st;
	long long cut, cst;
	int pp;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	if (!p || sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", &pp,
			 &ut, &st, &cut, &cst) != 5)
		return false;
	*ticks = (long long)(ut + st) + (children ? cut + cst : 0);
	if (ppid)
		*ppid = pp;
	return true;
}

/* CPU ticks of root (with its reaped children) plus its live children. */
static long long tree_cpu(int root)
{
	long long total = 0, t;
	struct dirent *e;
	DIR *d;
	int ppid;

	if (root <= 0)
		return 0;
	if (proc_cpu(root, true, &t, NULL))
		total += t;
	d = opendir("/proc");
	if (!d)
		return total;
	while ((e = readdir(d))) {
		int pid;

		if (!isdigit((unsigned char)e->d_name[0]))
			continue;
		pid = atoi(e->d_name);
		if (proc_cpu(pid, false, &t, &ppid) && ppid == root)
			total += t;
	}
	closedir(d);
	return total;
}

static long long pg_int(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	long long v = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return v;
}

static int pg_exec(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK;

	if (!ok)
		fprintf(stderr, "bench_agentd: %s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	return ok ? 0 : -1;
}

static int postmaster_pid(PGconn *c)
{
	PGresult *r = PQexec(c, "SELECT setting FROM pg_settings WHERE name = 'data_directory'");
	char path[1024];
	int pid = 0;
	FILE *f;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		snprintf(path, sizeof(path), "%s/postmaster.pid", PQgetvalue(r, 0, 0));
		f = fopen(path, "r");
		if (f) {
			if (fscanf(f, "%d", &pid) != 1)
				pid = 0;
			fclose(f);
		}
	}
	PQclear(r);
	return pid;
}

static int redis_pid(redisContext *r)
{
	redisReply *rep = redisCommand(r, "INFO server");
	const char *p;
	int pid = 0;

	if (rep && rep->type == REDIS_REPLY_STRING && (p = strstr(rep->str, "process_id:")))
		pid = atoi(p + 11);
	freeReplyObject(rep);
	return pid;
}

static int gpud_pid(const char *socket)
{
	struct proto_client_opts o;
	struct proto_client *c;
	char err[SW_ERR_MAX];
	int pid;

	proto_client_opts_default(&o);
	if (proto_client_connect(&c, socket, &o, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_agentd: gpud: %s\n", err);
		return -1;
	}
	pid = proto_client_server_pid(c);
	proto_client_close(c);
	return pid;
}

/* A field of INFO memory as a number, -1 when absent. */
static long long redis_info_int(redisContext *r, const char *field)
{
	redisReply *rep = redisCommand(r, "INFO memory");
	long long v = -1;
	char key[64];
	const char *p;

	snprintf(key, sizeof(key), "\n%s:", field);
	if (rep && rep->type == REDIS_REPLY_STRING && (p = strstr(rep->str, key)))
		v = atoll(p + strlen(key));
	freeReplyObject(rep);
	return v;
}

/* The integer reply of a command (XLEN, MEMORY USAGE), 0 for nil or an
 * error (a stream that does not exist). */
static long long redis_int(redisContext *r, const char *cmd, const char *key)
{
	redisReply *rep = redisCommand(r, cmd, key);
	long long v = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;

	freeReplyObject(rep);
	return v;
}

/* Writes the task JSON of ingest i with about bytes of text (plain ASCII
 * sentences, distinct per task) into a malloc'd string. */
static char *ingest_json(int i, int bytes)
{
	static const char filler[] = " The cat met the dog on the hill and they played with the "
				     "red ball until the sun went down.";
	size_t cap = (size_t)bytes + 256, n;
	char *s = malloc(cap);

	if (!s)
		return NULL;
	n = (size_t)snprintf(s, cap, "{\"id\":\"t%d\",\"kind\":\"ingest\",\"text\":\"Note %d:", i,
			     i);
	for (size_t start = n; n - start + sizeof(filler) - 1 < (size_t)bytes;
	     n += sizeof(filler) - 1)
		memcpy(s + n, filler, sizeof(filler) - 1);
	snprintf(s + n, cap - n, "\"}");
	return s;
}

static bool wait_done(PGconn *c, long long want, int ms)
{
	for (int t = 0; t < ms; t += 5) {
		if (pg_int(c, "SELECT count(*) FROM tasks WHERE status <> 'running'") >= want)
			return true;
		usleep(5000);
	}
	return false;
}

static const char story[] =
	"Once upon a time there was a little cat named Tom. Tom liked to play in the garden. "
	"One day he saw a big red ball under the tree. He ran to the ball and pushed it. "
	"The ball rolled down the hill and Tom ran after it. At the bottom of the hill he met a "
	"dog named Max. Max was friendly and wanted to play too.";

/* One run with `workers` workers; prints its table row. */
static int run_one(const struct opts *o, int workers, redisContext *r, const char *pg_admin,
		   const int *pids)
{
	char dir[] = "/tmp/bench-agentd-XXXXXX", config[128], db[64], url[1200], sql[128];
	char task[1024], host_part[1024], maxlen[64] = "";
	long long cpu0[N_GROUPS], cpu1[N_GROUPS], mem0, mem_queued, mem1;
	const char *slash;
	double t0, t1;
	int rc = -1, st, sup_pid;
	PGconn *admin, *c = NULL;
	pid_t sup;
	FILE *f;

	if (!mkdtemp(dir))
		return -1;
	snprintf(db, sizeof(db), "bench_agentd_%d_%d", (int)getpid(), workers);
	admin = PQconnectdb(pg_admin);
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db);
	if (PQstatus(admin) != CONNECTION_OK || pg_exec(admin, sql) != 0)
		goto out_admin;
	slash = strchr(strstr(pg_admin, "://") + 3, '/');
	snprintf(host_part, sizeof(host_part), "%.*s", (int)(slash - pg_admin), pg_admin);
	snprintf(url, sizeof(url), "%s/%s", host_part, db);
	freeReplyObject(redisCommand(r, "FLUSHDB"));

	snprintf(config, sizeof(config), "%s/agentd.json", dir);
	f = fopen(config, "w");
	if (!f)
		goto out_db;
	if (o->results_maxlen > 0)
		snprintf(maxlen, sizeof(maxlen), ", \"results_maxlen\": %d", o->results_maxlen);
	fprintf(f,
		"{\"state_dir\": \"%s\", \"log\": {\"level\": \"warn\", \"file\": \"%s/agentd.log\"},"
		" \"redis\": {\"url\": \"%s/%d\"}, \"postgres\": {\"url\": \"%s\"},"
		" \"gpud\": {\"socket\": \"%s\"},"
		" \"agentd\": {\"workers\": %d, \"max_tasks_per_worker\": 0, \"lease_ms\": 30000,"
		" \"heartbeat_ms\": 1000%s}}\n",
		dir, dir, getenv("SWARM_TEST_REDIS_URL"), REDIS_DB, url, o->gpud_socket, workers,
		maxlen);
	fclose(f);

	snprintf(task, sizeof(task), "{\"id\":\"doc\",\"kind\":\"ingest\",\"text\":\"%s\"}", story);
	freeReplyObject(redisCommand(r, "XADD %s * %s %s", PROTO_TASK_STREAM, PROTO_TASK_FIELD,
				     task));
	sup = fork();
	if (sup < 0)
		goto out_db;
	if (sup == 0) {
		execl(o->agentd, "agentd", "--config", config, (char *)NULL);
		_exit(127);
	}
	sup_pid = (int)sup;
	c = PQconnectdb(url);
	if (!wait_done(c, 1, 60000)) {
		fprintf(stderr, "bench_agentd: the first ingest did not finish (log in %s)\n", dir);
		goto out_sup;
	}
	usleep(300000); /* every worker past its start-up */

	mem0 = redis_info_int(r, "used_memory");
	cpu0[G_AGENTD] = tree_cpu(sup_pid);
	cpu0[G_REDIS] = tree_cpu(pids[G_REDIS]);
	cpu0[G_PG] = tree_cpu(pids[G_PG]);
	cpu0[G_GPUD] = tree_cpu(pids[G_GPUD]);
	t0 = bench_now();
	mem_queued = 0;
	for (int i = 0; i < o->tasks; i++) {
		if (strcmp(o->kind, "ingest") == 0 && o->text_bytes > 0) {
			char *t = ingest_json(i, o->text_bytes);

			if (!t)
				goto out_sup;
			freeReplyObject(redisCommand(r, "XADD %s * %s %s", PROTO_TASK_STREAM,
						     PROTO_TASK_FIELD, t));
			free(t);
			continue;
		}
		if (strcmp(o->kind, "ingest") == 0)
			snprintf(task, sizeof(task),
				 "{\"id\":\"t%d\",\"kind\":\"ingest\",\"text\":\"Note %d: the cat met "
				 "the dog on day %d.\"}",
				 i, i, i);
		else
			snprintf(task, sizeof(task),
				 "{\"id\":\"t%d\",\"kind\":\"answer\",\"question\":\"Who is Max? (%d)\","
				 "\"top_k\":3,\"max_tokens\":%d}",
				 i, i, o->max_tokens);
		freeReplyObject(redisCommand(r, "XADD %s * %s %s", PROTO_TASK_STREAM,
					     PROTO_TASK_FIELD, task));
	}
	/* The workers start at once, so this is a little under the cost of
	 * the whole backlog. */
	mem_queued = redis_info_int(r, "used_memory");
	if (!wait_done(c, o->tasks + 1, 600000)) {
		fprintf(stderr, "bench_agentd: tasks did not finish (log in %s)\n", dir);
		goto out_sup;
	}
	t1 = bench_now();
	cpu1[G_AGENTD] = tree_cpu(sup_pid);
	cpu1[G_REDIS] = tree_cpu(pids[G_REDIS]);
	cpu1[G_PG] = tree_cpu(pids[G_PG]);
	cpu1[G_GPUD] = tree_cpu(pids[G_GPUD]);

	printf("| %7d | %5d | %7.2f | %7.1f |", workers, o->tasks, t1 - t0, o->tasks / (t1 - t0));
	{
		double total = 0;

		for (int g = 0; g < N_GROUPS; g++) {
			double ms = (double)(cpu1[g] - cpu0[g]) * 1000.0 / clk_tck / o->tasks;

			total += ms;
			printf(" %6.2f |", ms);
		}
		printf(" %6.2f | %5.0f%% |\n", total,
		       100.0 * total * o->tasks / 1000.0 / (t1 - t0));
	}
	printf("|         |       |         |         | completed %lld, failed %lld, dead %lld |\n",
	       pg_int(c, "SELECT count(*) FROM tasks WHERE status = 'completed'") - 1,
	       pg_int(c, "SELECT count(*) FROM tasks WHERE status = 'failed'"),
	       pg_int(c, "SELECT count(*) FROM tasks WHERE status = 'dead'"));
	usleep(200000); /* the last acknowledgement follows the last row */
	mem1 = redis_info_int(r, "used_memory");
	printf("|         |       |         |         | redis used_memory: before %lld, all queued "
	       "%+lld (%+.0f B/task), done %+lld (%+.0f B/task); swarm:tasks %lld entries %lld B, "
	       "swarm:results %lld entries %lld B |\n",
	       mem0, mem_queued - mem0, (double)(mem_queued - mem0) / o->tasks, mem1 - mem0,
	       (double)(mem1 - mem0) / o->tasks, redis_int(r, "XLEN %s", PROTO_TASK_STREAM),
	       redis_int(r, "MEMORY USAGE %s SAMPLES 0", PROTO_TASK_STREAM),
	       redis_int(r, "XLEN %s", PROTO_TASK_RESULTS_STREAM),
	       redis_int(r, "MEMORY USAGE %s SAMPLES 0", PROTO_TASK_RESULTS_STREAM));
	fflush(stdout);
	rc = 0;
out_sup:
	kill(sup, SIGTERM);
	waitpid(sup, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fprintf(stderr, "bench_agentd: agentd exit status %d\n", st);
	PQfinish(c);
out_db:
	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", db);
	pg_exec(admin, sql);
out_admin:
	PQfinish(admin);
	if (rc == 0) {
		snprintf(sql, sizeof(sql), "rm -rf %s", dir);
		if (system(sql) != 0)
			fprintf(stderr, "bench_agentd: could not remove %s\n", dir);
	}
	return rc;
}

static void usage(void)
{
	fprintf(stderr, "usage: bench_agentd --agentd BIN --gpud-socket PATH [--tasks N] "
			"[--workers 1,4,16] [--max-tokens T] [--kind answer|ingest]\n"
			"       [--text-bytes B] [--results-maxlen N]\n"
			"(SWARM_TEST_REDIS_URL and SWARM_TEST_PG_URL name the servers)\n");
}

int main(int argc, char **argv)
{
	struct opts o = { .tasks = 200, .max_tokens = 16, .kind = "answer" };
	const char *redis_url = getenv("SWARM_TEST_REDIS_URL"), *pg_url = getenv("SWARM_TEST_PG_URL");
	const char *list = "1,4,16";
	char machine[512], date[64], host[256];
	int pids[N_GROUPS] = { 0 }, port = 6379;
	redisContext *r;
	PGconn *c;

	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc) {
			usage();
			return 2;
		}
		if (strcmp(argv[i], "--agentd") == 0)
			o.agentd = argv[++i];
		else if (strcmp(argv[i], "--gpud-socket") == 0)
			o.gpud_socket = argv[++i];
		else if (strcmp(argv[i], "--tasks") == 0)
			o.tasks = atoi(argv[++i]);
		else if (strcmp(argv[i], "--workers") == 0)
			list = argv[++i];
		else if (strcmp(argv[i], "--max-tokens") == 0)
			o.max_tokens = atoi(argv[++i]);
		else if (strcmp(argv[i], "--kind") == 0)
			o.kind = argv[++i];
		else if (strcmp(argv[i], "--text-bytes") == 0)
			o.text_bytes = atoi(argv[++i]);
		else if (strcmp(argv[i], "--results-maxlen") == 0)
			o.results_maxlen = atoi(argv[++i]);
		else {
			usage();
			return 2;
		}
	}
	if (!o.agentd || !o.gpud_socket || !redis_url || !pg_url || o.tasks <= 0) {
		usage();
		return 2;
	}
	for (const char *p = list; *p && o.n_runs < MAX_RUNS;) {
		size_t len = strcspn(p, ",");

		o.workers[o.n_runs++] = atoi(p);
		p += len + (p[len] ? 1 : 0);
	}
	clk_tck = sysconf(_SC_CLK_TCK);
	if (sscanf(redis_url, "redis://%255[^:/]:%d", host, &port) < 1) {
		fprintf(stderr, "bench_agentd: SWARM_TEST_REDIS_URL: expected redis://HOST:PORT\n");
		return 2;
	}
	r = redisConnect(host, port);
	if (!r || r->err) {
		fprintf(stderr, "bench_agentd: redis %s unreachable\n", redis_url);
		return 1;
	}
	freeReplyObject(redisCommand(r, "SELECT %d", REDIS_DB));
	c = PQconnectdb(pg_url);
	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "bench_agentd: postgres: %s", PQerrorMessage(c));
		return 1;
	}
	pids[G_REDIS] = redis_pid(r);
	pids[G_PG] = postmaster_pid(c);
	pids[G_GPUD] = gpud_pid(o.gpud_socket);
	PQfinish(c);
	if (pids[G_GPUD] <= 0)
		return 1;

	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	printf("# bench_agentd: %d %s tasks (max_tokens %d, text bytes %d) through agentd + redis + "
	       "postgres + gpud\n",
	       o.tasks, o.kind, o.max_tokens, o.text_bytes);
	printf("# %s\n# %s\n", machine, date);
	{
		double load[3];

		if (getloadavg(load, 3) == 3)
			printf("# load average at start: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
	}
	printf("# pids: redis %d, postmaster %d, gpud %d\n\n", pids[G_REDIS], pids[G_PG],
	       pids[G_GPUD]);
	printf("| workers | tasks | seconds | tasks/s | CPU ms per task: %s | %s | %s | %s | total | "
	       "of one CPU |\n",
	       group_names[0], group_names[1], group_names[2], group_names[3]);
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < o.n_runs; i++)
		if (o.workers[i] > 0 && run_one(&o, o.workers[i], r, pg_url, pids) != 0)
			fprintf(stderr, "bench_agentd: the run with %d workers failed\n", o.workers[i]);
	freeReplyObject(redisCommand(r, "FLUSHDB"));
	redisFree(r);
	return 0;
}
