/* view.c - gpud stats, queue and throughput views for status and top (see
 * view.h). */
#include "swarmctl/view.h"

#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/time.h"
#include "proto/client.h"
#include "swarmctl/clients.h"
#include "swarmctl/proc.h"
#include "swarmctl/supervise.h"

#define EXIT_USAGE 2

/* --- the process table ---------------------------------------------------- */

static const char *str_or(const json_t *o, const char *key, const char *dflt)
{
	const char *v = json_string_value(json_object_get(o, key));

	return v ? v : dflt;
}

/* Adds what the supervisor knows about service s (from its status st) to
 * p. */
static void add_supervised(json_t *p, const json_t *st, enum ctl_service s)
{
	const json_t *v = ctl_supervisor_service(st, s);
	json_int_t exited = json_integer_value(json_object_get(v, "exited_at"));
	const char *state = str_or(v, "state", "");

	if (!v)
		return;
	json_object_set_new(p, "state", json_string(state));
	json_object_set(p, "restarts", json_object_get(v, "restarts"));
	json_object_set(p, "crashes", json_object_get(v, "crashes"));
	json_object_set(p, "adopted", json_object_get(v, "adopted"));
	json_object_set_new(p, "last_exit", json_string(str_or(v, "last_exit", "")));
	if (exited > 0) {
		double ago = ((double)sw_realtime_ms() - (double)exited) / 1000.0;

		json_object_set_new(p, "last_exit_ago_s", json_real(ago < 0 ? 0 : ago));
	}
	if (!strcmp(state, "failed") || str_or(v, "error", "")[0]) {
		json_object_set_new(p, "start_error", json_string(str_or(v, "error", "")));
		json_object_set_new(p, "last_lines", json_string(str_or(v, "last_lines", "")));
		json_object_set_new(p, "log", json_string(str_or(v, "log", "")));
	}
}

json_t *ctl_processes_json(const struct ctl_env *e, bool *all_up, bool *any_up)
{
	json_t *procs = json_object(), *st = NULL;
	pid_t sup = e->managed ? ctl_supervisor_pid(e) : 0;
	char err[SW_ERR_MAX];

	*all_up = true;
	*any_up = false;
	if (!procs)
		return NULL;
	if (e->managed) {
		json_t *p = json_object();

		json_object_set_new(p, "up", json_boolean(sup != 0));
		if (sup) {
			json_object_set_new(p, "pid", json_integer(sup));
			json_object_set_new(p, "uptime_s", json_real(ctl_proc_uptime_s(sup)));
			st = ctl_supervisor_status(e);
			if (json_integer_value(json_object_get(st, "pid")) != sup) {
				json_decref(st); /* a dead supervisor's */
				st = NULL;
			}
		}
		*all_up &= sup != 0;
		json_object_set_new(procs, "supervisor", p);
	}
	for (int s = 0; s < CTL_N_SERVICES; s++) {
		json_t *p;
		pid_t pid = ctl_service_pid(e, s);
		bool up = pid != 0;

		if (!ctl_service_enabled(e, s) && !pid)
			continue; /* gpud-http without http.listen */
		p = json_object();
		if (s == CTL_HTTP)
			json_object_set_new(p, "listen", json_string(e->cfg.http.listen));

		if (!ctl_service_managed(e, s)) {
			up = ctl_service_ping(e, s, err, sizeof(err)) == 0;
			json_object_set_new(p, "external", json_true());
			if (!up)
				json_object_set_new(p, "error", json_string(err));
		}
		json_object_set_new(p, "up", json_boolean(up));
		if (pid) {
			json_object_set_new(p, "pid", json_integer(pid));
			json_object_set_new(p, "uptime_s", json_real(ctl_proc_uptime_s(pid)));
		}
		if (st)
			add_supervised(p, st, s);
		*all_up &= up;
		*any_up |= up;
		json_object_set_new(procs, ctl_service_name(s), p);
	}
	json_decref(st);
	return procs;
}

static void fmt_duration(double s, char *b, size_t cap)
{
	if (s < 0)
		snprintf(b, cap, "-");
	else if (s < 120)
		snprintf(b, cap, "%.0fs", s);
	else if (s < 7200)
		snprintf(b, cap, "%.1fm", s / 60);
	else if (s < 172800)
		snprintf(b, cap, "%.1fh", s / 3600);
	else
		snprintf(b, cap, "%.1fd", s / 86400);
}

static void print_process(FILE *f, const char *name, const json_t *p)
{
	bool up = json_is_true(json_object_get(p, "up"));
	const char *state = str_or(p, "state", ""), *shown;
	const json_t *pid = json_object_get(p, "pid"), *restarts = json_object_get(p, "restarts");
	char upt[32], ago[32], pidbuf[32];

	if (up)
		shown = !strcmp(state, "starting") ? "starting" : "up";
	else if (!strcmp(state, "backoff") || !strcmp(state, "failed") ||
		 !strcmp(state, "waiting") || !strcmp(state, "starting"))
		shown = state;
	else
		shown = "down";
	if (pid)
		snprintf(pidbuf, sizeof(pidbuf), "%lld", (long long)json_integer_value(pid));
	else
		snprintf(pidbuf, sizeof(pidbuf), "%s", json_object_get(p, "external") ? "external" : "-");
	fmt_duration(pid ? json_real_value(json_object_get(p, "uptime_s")) : -1, upt, sizeof(upt));
	fprintf(f, "%-10s %-8s %-8s %-7s ", name, shown, pidbuf, upt);
	if (restarts)
		fprintf(f, "%-8lld ", (long long)json_integer_value(restarts));
	else
		fprintf(f, "%-8s ", "-");
	if (str_or(p, "last_exit", "")[0]) {
		fmt_duration(json_real_value(json_object_get(p, "last_exit_ago_s")), ago, sizeof(ago));
		fprintf(f, "%s, %s ago", str_or(p, "last_exit", ""), ago);
	} else {
		fprintf(f, "-");
	}
	if (json_object_get(p, "error"))
		fprintf(f, "  %s", str_or(p, "error", ""));
	fprintf(f, "\n");
}

void ctl_print_processes(FILE *f, const struct ctl_env *e, const json_t *procs)
{
	const json_t *sup = json_object_get(procs, "supervisor");
	bool any_up = false;
	const char *name;
	json_t *p;

	fprintf(f, "%-10s %-8s %-8s %-7s %-8s %s\n", "SERVICE", "STATE", "PID", "UPTIME",
		"RESTARTS", "LAST EXIT");
	json_object_foreach((json_t *)procs, name, p) {
		print_process(f, name, p);
		if (strcmp(name, "supervisor") != 0)
			any_up |= json_is_true(json_object_get(p, "up"));
	}
	json_object_foreach((json_t *)procs, name, p) {
		const char *why = str_or(p, "start_error", ""), *lines = str_or(p, "last_lines", "");

		if (strcmp(str_or(p, "state", ""), "failed") != 0)
			continue;
		fprintf(f, "%s failed: %s%smore than %u deaths within %u ms, not restarted (fix the "
			"cause, then `swarmctl start`)\n", name, why, why[0] ? "; " : "",
			e->cfg.supervisor.crash_limit, e->cfg.supervisor.crash_window_ms);
		if (lines[0])
			fprintf(f, "last lines of %s:\n%s\n", str_or(p, "log", "its log"), lines);
	}
	if (sup && !json_is_true(json_object_get(sup, "up")) && any_up)
		fprintf(f, "the supervisor is not running: a service that dies stays down "
			"(`swarmctl start` brings it back)\n");
}

json_t *ctl_gpud_json(const struct ctl_env *e, bool mem, uint32_t flags, char *err,
		     size_t errlen)
{
	struct proto_client_opts o;
	struct proto_client *c;
	char *text = NULL;
	json_error_t je;
	json_t *j = NULL;

	proto_client_opts_default(&o);
	o.timeout_ms = 5000;
	if (proto_client_connect(&c, e->cfg.gpud.socket, &o, err, errlen) != 0)
		return NULL;
	if ((mem ? proto_client_mem(c, flags, &text, err, errlen)
		 : proto_client_stats(c, &text, err, errlen)) == 0) {
		j = json_loads(text, 0, &je);
		if (!j)
			snprintf(err, errlen, "gpud sent invalid JSON: %s", je.text);
	}
	free(text);
	proto_client_close(c);
	return j;
}

static uint64_t u64(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v)
							       : 0;
}

/* True when name is one of STATS' devices; without a device list every
 * pool prefix counts as one. */
static bool is_device(const json_t *stats, const char *name)
{
	const json_t *devs = json_object_get(stats, "devices");
	size_t i;
	json_t *d;

	if (!json_is_array(devs))
		return true;
	json_array_foreach(devs, i, d) {
		const char *n = json_string_value(json_object_get(d, "name"));

		if (n && !strcmp(n, name))
			return true;
	}
	return false;
}

json_t *ctl_device_memory(const json_t *stats)
{
	json_t *out = json_array(), *pool;
	size_t i;

	json_array_foreach(json_object_get(stats, "pools"), i, pool) {
		const char *name = json_string_value(json_object_get(pool, "name"));
		uint64_t unit = u64(pool, "unit_bytes");
		char dev[64];
		const char *dot;
		json_t *d = NULL, *v;
		size_t k;

		if (!name)
			continue;
		if (!unit)
			unit = 1;
		dot = strchr(name, '.');
		snprintf(dev, sizeof(dev), "%.*s", dot ? (int)(dot - name) : 4, dot ? name : "host");
		if (!is_device(stats, dev))
			snprintf(dev, sizeof(dev), "host");
		json_array_foreach(out, k, v)
			if (!strcmp(json_string_value(json_object_get(v, "device")), dev))
				d = v;
		if (!d) {
			d = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "device", dev,
				      "used_bytes", (json_int_t)0, "high_bytes", (json_int_t)0,
				      "capacity_bytes", (json_int_t)0, "trough_bytes", (json_int_t)0,
				      "live_bytes", (json_int_t)0, "cached_bytes", (json_int_t)0);
			json_array_append_new(out, d);
		}
		static const char *const keys[][2] = {
			{ "used", "used_bytes" }, { "high", "high_bytes" },
			{ "capacity", "capacity_bytes" }, { "trough", "trough_bytes" },
			{ "live", "live_bytes" }, { "cached", "cached_bytes" },
		};
		for (size_t q = 0; q < 6; q++) {
			/* a gpud from before "live": all of used is live */
			const char *key = q == 4 && !json_object_get(pool, "live") ? "used" : keys[q][0];
			uint64_t sum = u64(d, keys[q][1]) + u64(pool, key) * unit;

			json_object_set_new(d, keys[q][1], json_integer((json_int_t)sum));
		}
	}
	return out;
}

static const char *str(const json_t *o, const char *key)
{
	const char *v = json_string_value(json_object_get(o, key));

	return v ? v : "?";
}

static double mib(uint64_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

/* Prompt tokens the prefix cache of device name served ("<name>.prefix"
 * in caches), 0 without one. */
static uint64_t prefix_hit_tokens(const json_t *stats, const char *name)
{
	const json_t *v;
	size_t i, n = strlen(name);

	json_array_foreach(json_object_get(stats, "caches"), i, v) {
		const char *c = json_string_value(json_object_get(v, "name"));

		if (c && !strncmp(c, name, n) && !strcmp(c + n, ".prefix"))
			return u64(v, "hit_tokens");
	}
	return 0;
}

/* Per device: queue, placements by prefix and by load, prefix cache hits
 * (blocks) and tokens, chunk-KV cache hits (segments) and tokens. */
static void print_placement(FILE *f, const json_t *stats)
{
	const json_t *v;
	size_t i;

	fprintf(f, "%-10s %8s %8s %14s %14s %12s %14s %11s %13s %10s\n", "DEVICE", "QUEUE",
		"RUNNING", "PLACED PREFIX", "PLACED LOAD", "PREFIX HITS", "PREFIX TOKENS",
		"CHUNK HITS", "CHUNK TOKENS", "DEV ALLOCS");
	json_array_foreach(json_object_get(stats, "devices"), i, v)
		fprintf(f, "%-10s %8llu %8llu %14llu %14llu %12llu %14llu %11llu %13llu %10llu\n",
			str(v, "name"), (unsigned long long)u64(v, "queue"),
			(unsigned long long)u64(v, "running"),
			(unsigned long long)u64(v, "placed_prefix"),
			(unsigned long long)u64(v, "placed_load"),
			(unsigned long long)u64(v, "prefix_hits"),
			(unsigned long long)prefix_hit_tokens(stats, str(v, "name")),
			(unsigned long long)u64(v, "chunk_hits"),
			(unsigned long long)u64(v, "chunk_hit_tokens"),
			(unsigned long long)u64(json_object_get(v, "alloc"), "device"));
}

void ctl_print_gpud(FILE *f, const json_t *stats)
{
	const json_t *req = json_object_get(stats, "requests");
	const json_t *tok = json_object_get(stats, "tokens");
	const json_t *alloc = json_object_get(json_object_get(stats, "alloc"), "since_warmup");
	json_t *mem = ctl_device_memory(stats), *v;
	size_t i;

	fprintf(f, "gpud: %llu requests in flight, %llu completed, %llu errors; %.1f tokens/s; "
		"allocations since warm-up: ",
		(unsigned long long)u64(req, "in_flight"), (unsigned long long)u64(req, "completed"),
		(unsigned long long)u64(req, "errors"),
		json_number_value(json_object_get(tok, "per_s")));
	if (json_is_object(alloc))
		fprintf(f, "%llu host, %llu device\n", (unsigned long long)u64(alloc, "host"),
			(unsigned long long)u64(alloc, "device"));
	else
		fprintf(f, "not counted\n");
	print_placement(f, stats);
	/* devices gpud started without (gpud.min_devices): degraded, not down */
	json_array_foreach(json_object_get(stats, "left_out"), i, v)
		fprintf(f, "LEFT OUT: %s (%s) did not start: %s\n", str(v, "name"),
			str(v, "device"), str(v, "error"));
	/* LIVE: held by live requests (what can leak; the watchdog's TROUGH is
	 * its rolling minimum); CACHED: kept by a bounded cache beside it. */
	fprintf(f, "%-10s %12s %12s %12s %12s %12s %12s\n", "DEVICE", "USED MiB", "LIVE MiB",
		"CACHED MiB", "HIGH MiB", "TROUGH MiB", "CAPACITY MiB");
	json_array_foreach(mem, i, v)
		fprintf(f, "%-10s %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f\n", str(v, "device"),
			mib(u64(v, "used_bytes")), mib(u64(v, "live_bytes")),
			mib(u64(v, "cached_bytes")), mib(u64(v, "high_bytes")),
			mib(u64(v, "trough_bytes")), mib(u64(v, "capacity_bytes")));
	json_decref(mem);
	fprintf(f, "%-20s %10s %10s %10s %10s %10s %10s %10s %s\n", "POOL", "USED", "LIVE",
		"CACHED", "CACHE MAX", "HIGH", "CAPACITY", "TROUGH", "UNIT");
	json_array_foreach(json_object_get(stats, "pools"), i, v) {
		bool has_live = json_object_get(v, "live") != NULL;
		char bound[24] = "-";

		if (u64(v, "cache_bound"))
			snprintf(bound, sizeof(bound), "%llu", (unsigned long long)u64(v, "cache_bound"));
		fprintf(f, "%-20s %10llu %10llu %10llu %10s %10llu %10llu %10llu %s%s\n",
			str(v, "name"), (unsigned long long)u64(v, "used"),
			(unsigned long long)u64(v, has_live ? "live" : "used"),
			(unsigned long long)u64(v, "cached"), bound,
			(unsigned long long)u64(v, "high"), (unsigned long long)u64(v, "capacity"),
			(unsigned long long)u64(v, "trough"),
			json_string_value(json_object_get(v, "unit")) ? str(v, "unit") : "",
			json_is_true(json_object_get(v, "rising")) ? "  RISING" : "");
	}
	fprintf(f, "%-20s %10s %10s %10s %10s %10s %10s %10s\n", "CACHE", "HITS", "MISSES",
		"HIT RATE", "ENTRIES", "MAX", "MiB", "MAX MiB");
	json_array_foreach(json_object_get(stats, "caches"), i, v) {
		double h = (double)u64(v, "hits"), m = (double)u64(v, "misses");

		fprintf(f, "%-20s %10.0f %10.0f %9.1f%% %10llu %10llu %10.1f %10.1f\n",
			str(v, "name"), h, m, h + m > 0 ? 100 * h / (h + m) : 0.0,
			(unsigned long long)u64(v, "entries"),
			(unsigned long long)u64(v, "max_entries"), mib(u64(v, "bytes")),
			mib(u64(v, "max_bytes")));
	}
	json_array_foreach(json_object_get(json_object_get(stats, "watchdog"), "warnings"), i, v)
		if (json_is_string(v))
			fprintf(f, "WARNING: %s\n", json_string_value(v));
}

void ctl_print_queue(FILE *f, const struct ctl_queue_stats *q)
{
	fprintf(f, "queue: ");
	if (q->undelivered >= 0)
		fprintf(f, "%lld waiting, ", (long long)q->undelivered);
	fprintf(f, "%lld pending (claimed, not acknowledged), %lld entries in swarm:tasks, ",
		(long long)q->pending, (long long)q->length);
	/* swarm:dead is capped: the count of dead tasks is PostgreSQL's */
	if (q->dead >= 0)
		fprintf(f, "%lld dead-lettered (%lld kept in swarm:dead)\n", (long long)q->dead,
			(long long)q->dead_kept);
	else
		fprintf(f, "%lld kept in swarm:dead (dead-lettered in all: PostgreSQL "
			"unreachable)\n", (long long)q->dead_kept);
}

json_t *ctl_agentd_status(const struct ctl_env *e)
{
	char p[PATH_MAX + 32];
	json_error_t je;
	json_t *j;

	ctl_path(e, "agentd.status.json", p, sizeof(p));
	j = json_load_file(p, 0, &je);
	if (j && !json_is_object(j)) {
		json_decref(j);
		j = NULL;
	}
	return j;
}

void ctl_print_agentd(FILE *f, const json_t *st)
{
	static const char *const states[] = { "running", "starting", "backoff", "failed",
					      "stopped" };
	unsigned count[5] = { 0 };
	uint64_t done = 0, crashes = 0, hangs = 0;
	const char *last = NULL;
	bool first = true;
	size_t i;
	json_t *w;

	json_array_foreach(json_object_get(st, "workers"), i, w) {
		const char *ws = json_string_value(json_object_get(w, "state"));
		const char *le = json_string_value(json_object_get(w, "last_exit"));

		for (size_t k = 0; ws && k < 5; k++)
			count[k] += !strcmp(ws, states[k]);
		done += u64(w, "done");
		crashes += u64(w, "crashes");
		hangs += u64(w, "hangs");
		if (le && le[0])
			last = le;
	}
	fprintf(f, "agentd %s: %zu workers", str(st, "state"),
		json_array_size(json_object_get(st, "workers")));
	for (size_t k = 0; k < 5; k++) {
		if (!count[k])
			continue;
		fprintf(f, "%s%u %s", first ? " (" : ", ", count[k], states[k]);
		first = false;
	}
	fprintf(f, "%s; %llu tasks done, %llu crashes, %llu hangs", first ? "" : ")",
		(unsigned long long)done, (unsigned long long)crashes, (unsigned long long)hangs);
	if (last)
		fprintf(f, "; last exit: %s", last);
	fprintf(f, "\n");
}

/* --- top ------------------------------------------------------------------ */

static volatile sig_atomic_t top_stop;
static struct termios saved_tio;
static bool tio_saved;

static void on_sigint(int sig)
{
	(void)sig;
	top_stop = 1;
}

static void restore_tty(void)
{
	if (tio_saved)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved_tio);
	tio_saved = false;
}

/* Task counts and completions over the last 10 s from PostgreSQL; *dead
 * is the count of dead tasks (-1 when PostgreSQL did not answer). */
static void print_tasks(FILE *f, PGconn **pg, const struct ctl_env *e, int64_t *dead)
{
	char err[SW_ERR_MAX];
	PGresult *r;

	*dead = -1;
	if (!*pg && ctl_pg_open(e->cfg.postgres.url, pg, err, sizeof(err)) != 0) {
		fprintf(f, "tasks: %s\n", err);
		return;
	}
	if (ctl_pg_query(*pg, &r, err, sizeof(err),
			"SELECT count(*) FILTER (WHERE status = 'completed' AND "
			"finished_at > now() - interval '10 seconds'), "
			"count(*) FILTER (WHERE status = 'running'), "
			"count(*) FILTER (WHERE status = 'completed'), "
			"count(*) FILTER (WHERE status = 'failed'), "
			"count(*) FILTER (WHERE status = 'dead') FROM tasks", 0, NULL) != 0) {
		if (strstr(err, "does not exist"))
			*dead = 0;
		fprintf(f, "tasks: %s\n", strstr(err, "does not exist") ?
			"none yet (agentd creates the tables when it starts)" : err);
		if (PQstatus(*pg) != CONNECTION_OK) {
			PQfinish(*pg);
			*pg = NULL;
		}
		return;
	}
	fprintf(f, "tasks: %.1f/s completed (last 10 s); %s running, %s completed, %s failed, "
		"%s dead\n", strtod(PQgetvalue(r, 0, 0), NULL) / 10, PQgetvalue(r, 0, 1),
		PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3), PQgetvalue(r, 0, 4));
	*dead = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
	PQclear(r);
}

int ctl_cmd_top(struct ctl_env *e, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "interval", required_argument, NULL, 'i' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	double interval = 1.0;
	long iterations = 0;
	bool tty = isatty(STDOUT_FILENO), keys = tty && isatty(STDIN_FILENO);
	PGconn *pg = NULL;
	char *end;
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "i:n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'i':
			interval = strtod(optarg, &end);
			if (end == optarg || *end || interval < 0.1 || interval > 3600) {
				fprintf(stderr, "swarmctl: top: --interval wants 0.1..3600 seconds\n");
				return EXIT_USAGE;
			}
			break;
		case 'n':
			iterations = strtol(optarg, &end, 10);
			if (end == optarg || *end || iterations < 1) {
				fprintf(stderr, "swarmctl: top: --iterations wants a count >= 1\n");
				return EXIT_USAGE;
			}
			break;
		case 'h':
			printf("usage: swarmctl top [--interval S] [--iterations N]  (q quits)\n");
			return 0;
		default:
			fprintf(stderr, "usage: swarmctl top [--interval S] [--iterations N]\n");
			return EXIT_USAGE;
		}
	}
	signal(SIGINT, on_sigint);
	signal(SIGTERM, on_sigint);
	if (keys && tcgetattr(STDIN_FILENO, &saved_tio) == 0) {
		struct termios t = saved_tio;

		t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		t.c_cc[VMIN] = 0;
		t.c_cc[VTIME] = 0;
		tio_saved = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
		atexit(restore_tty);
	}
	for (long it = 0; !top_stop && (!iterations || it < iterations); it++) {
		struct ctl_queue_stats q;
		char err[SW_ERR_MAX], when[32];
		int64_t dead;
		time_t now = time(NULL);
		json_t *stats;

		strftime(when, sizeof(when), "%H:%M:%S", localtime(&now));
		if (tty)
			printf("\033[H\033[J");
		else if (it)
			printf("\n");
		printf("swarm top - %s - %s - every %.1f s%s\n", when, e->state_dir, interval,
		       keys ? " - q quits" : "");
		{
			bool all_up, any_up;
			json_t *procs = ctl_processes_json(e, &all_up, &any_up);

			if (procs)
				ctl_print_processes(stdout, e, procs);
			json_decref(procs);
		}
		print_tasks(stdout, &pg, e, &dead);
		if (ctl_service_pid(e, CTL_AGENTD)) {
			json_t *as = ctl_agentd_status(e);

			if (as)
				ctl_print_agentd(stdout, as);
			json_decref(as);
		}
		if (ctl_queue_stats(e->cfg.redis.url, &q, err, sizeof(err)) == 0) {
			q.dead = dead; /* PostgreSQL's: swarm:dead is capped */
			ctl_print_queue(stdout, &q);
		} else
			printf("queue: %s\n", err);
		stats = ctl_gpud_json(e, false, 0, err, sizeof(err));
		if (stats) {
			ctl_print_gpud(stdout, stats);
			json_decref(stats);
		} else {
			printf("gpud: %s\n", err);
		}
		fflush(stdout);
		if (iterations && it + 1 >= iterations)
			break;
		/* wait for the interval or a key */
		struct sw_deadline d = sw_deadline_in_ms((uint64_t)(interval * 1000));

		while (!top_stop && !sw_deadline_expired(d)) {
			struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
			int ms = (int)sw_deadline_remaining_ms(d);

			if (!keys) {
				sw_sleep_ms((uint64_t)ms);
				break;
			}
			if (poll(&p, 1, ms) > 0) {
				char ch;

				if (read(STDIN_FILENO, &ch, 1) == 1 && (ch == 'q' || ch == 'Q'))
					top_stop = 1;
			}
		}
	}
	restore_tty();
	if (pg)
		PQfinish(pg);
	return 0;
}
