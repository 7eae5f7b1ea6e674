/* supervisor.c - agentd's supervisor: N worker slots on the shared
 * supervision loop (common/supervise.h), which spawns, restarts with
 * backoff, marks crash loops failed, kills hung workers, drains and
 * passes SIGUSR1 (log reopening) on to the workers. What is agentd's own
 * stays here: the worker's command line, the heartbeat line
 * ("hb <pid> <state> <done> <entry>"), the recycle rule and the
 * agentd.status.json format.
 */
#include "agentd/supervisor.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "common/err.h"
#include "common/log.h"
#include "common/privdrop.h"
#include "common/secret.h"
#include "common/supervise.h"
#include "sw_config.h"

/* What a worker's heartbeats told us. */
struct slot {
	char name[24];            /* "worker 3" */
	uint64_t done;            /* tasks done, from its last beat */
	char activity[16];        /* idle, busy or drain from its last beat; "" */
};

struct agent_sup {
	struct slot *slots;
	unsigned n;
};

/* --- heartbeats and the status file --------------------------------------- */

static void on_beat_line(struct sw_sup *sup, unsigned i, const char *line, void *user)
{
	struct agent_sup *as = user;
	struct slot *s = &as->slots[i];
	int pid;
	char state[16], entry[80];
	unsigned long long done;

	if (sscanf(line, "hb %d %15s %llu %79s", &pid, state, &done, entry) != 4) {
		log_warn("%s (pid %d): bad heartbeat line \"%.60s\"", s->name,
			 sw_sup_info(sup, i)->pid, line);
		return;
	}
	if (s->done != done || strcmp(s->activity, state) != 0) {
		s->done = done;
		snprintf(s->activity, sizeof(s->activity), "%s", state);
		sw_sup_status_dirty(sup);
	}
	sw_sup_beat(sup, i);
}

static void on_worker_exit(struct sw_sup *sup, unsigned i, int pid, void *user)
{
	struct agent_sup *as = user;

	(void)sup;
	(void)pid;
	as->slots[i].activity[0] = '\0';
}

static void exit_note(void *user, unsigned i, char *out, size_t cap)
{
	struct agent_sup *as = user;

	snprintf(out, cap, ", %" PRIu64 " tasks done", as->slots[i].done);
}

/* agentd.status.json (supervisor.h). */
static json_t *status_json(struct sw_sup *sup, void *user)
{
	struct agent_sup *as = user;
	json_t *arr, *root = sw_sup_status_doc(sup, "workers", &arr);

	if (!root)
		return NULL;
	for (unsigned i = 0; i < as->n; i++) {
		const struct sw_sup_info *f = sw_sup_info(sup, i);

		json_array_append_new(arr, json_pack("{s:i, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:s, s:s}",
						     "slot", (int)i, "pid", f->pid, "state",
						     sw_sup_state_name(f->state), "spawns",
						     (json_int_t)f->spawns, "crashes",
						     (json_int_t)f->crashes, "recycles",
						     (json_int_t)f->recycles, "hangs",
						     (json_int_t)f->hangs, "done",
						     (json_int_t)as->slots[i].done, "last_exit",
						     f->last_exit, "activity",
						     as->slots[i].activity));
	}
	return root;
}

/* --- the run -------------------------------------------------------------- */

static const struct sw_sup_ops agent_ops = {
	.on_line = on_beat_line,
	.on_exit = on_worker_exit,
	.exit_note = exit_note,
	.status = status_json,
};

int agent_sup_run(const struct agent_sup_opts *o, char *err, size_t errlen)
{
	const struct sw_config *cfg = o->cfg;
	struct agent_sup as = { 0 };
	struct sw_sup_child *children = NULL;
	struct sw_sup_opts so = { 0 };
	char exe[PATH_MAX], status_path[PATH_MAX], sql_dir[PATH_MAX], pid[32];
	char *args[9];
	uint32_t drain_ms, hang_ms;
	int n = 0, rc;

	drain_ms = o->drain_ms;
	if (!drain_ms) {
		drain_ms = cfg->agentd.lease_ms;
		if (drain_ms < AGENT_SUP_DRAIN_MIN_MS)
			drain_ms = AGENT_SUP_DRAIN_MIN_MS;
		if (drain_ms > AGENT_SUP_DRAIN_MAX_MS)
			drain_ms = AGENT_SUP_DRAIN_MAX_MS;
	}
	hang_ms = o->hang_ms ? o->hang_ms : AGENT_SUP_HANG_BEATS * cfg->agentd.heartbeat_ms;
	if (o->exe) {
		if (snprintf(exe, sizeof(exe), "%s", o->exe) >= (int)sizeof(exe))
			return sw_seterr(err, errlen, -ENAMETOOLONG, "executable path too long");
	} else {
		/* The path this binary was started from (valgrind maps the
		 * link to its client; /proc/self/exe itself would be the tool). */
		ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

		if (len <= 0 || len >= (ssize_t)sizeof(exe) - 1)
			snprintf(exe, sizeof(exe), "/proc/self/exe");
		else
			exe[len] = '\0';
	}
	sql_dir[0] = '\0';
	if (o->sql_dir && snprintf(sql_dir, sizeof(sql_dir), "%s", o->sql_dir) >=
				  (int)sizeof(sql_dir))
		return sw_seterr(err, errlen, -ENAMETOOLONG, "--sql-dir too long");
	status_path[0] = '\0';
	if (o->status_path) {
		snprintf(status_path, sizeof(status_path), "%s", o->status_path);
	} else if (cfg->state_dir[0]) {
		if (mkdir(cfg->state_dir, 0750) != 0 && errno != EEXIST)
			return sw_seterr(err, errlen, -errno, "%s: %s", cfg->state_dir,
					 strerror(errno));
		if (snprintf(status_path, sizeof(status_path), "%s/%s", cfg->state_dir,
			     AGENT_SUP_STATUS_FILE) >= (int)sizeof(status_path))
			return sw_seterr(err, errlen, -ENAMETOOLONG, "state_dir too long");
	}

	args[n++] = "agentd";
	args[n++] = "worker";
	args[n++] = "--config";
	args[n++] = (char *)o->config_path;
	args[n++] = "--heartbeat-fd";
	args[n++] = "3";
	if (sql_dir[0]) {
		args[n++] = "--sql-dir";
		args[n++] = sql_dir;
	}
	args[n] = NULL;

	as.n = cfg->agentd.workers;
	as.slots = calloc(as.n, sizeof(*as.slots));
	children = calloc(as.n, sizeof(*children));
	if (!as.slots || !children) {
		rc = sw_seterr(err, errlen, -ENOMEM, "out of memory");
		goto out_free;
	}
	for (unsigned i = 0; i < as.n; i++) {
		snprintf(as.slots[i].name, sizeof(as.slots[i].name), "worker %u", i);
		children[i] = (struct sw_sup_child){
			.name = as.slots[i].name,
			.file = exe,
			.argv = args,
			.beat_pipe = true,
		};
	}
	so.children = children;
	so.n_children = as.n;
	so.policy = (struct sw_sup_policy){
		.backoff_min_ms = cfg->agentd.restart_backoff_min_ms,
		.backoff_max_ms = cfg->agentd.restart_backoff_max_ms,
		.crash_window_ms = cfg->agentd.crash_window_ms,
		.crash_limit = cfg->agentd.crash_limit,
		.hang_ms = hang_ms,
		.drain_ms = drain_ms,
		.quick_exit_ms = AGENT_SUP_QUICK_EXIT_MS,
		.exit0_recycles = true,
	};
	so.ops = &agent_ops;
	so.user = &as;
	so.noun = "worker";
	so.nouns = "workers";
	so.status_path = status_path;
	so.stop = SW_SUP_STOP_DRAIN;
	so.exit_when_all_failed = true;
	/* logrotate: reopen ours, then each worker's once it has beaten (its
	 * handler is installed before its first heartbeat) */
	so.usr1_reopens = true;

	/* `agentd worker` asks for a drain when this process dies. */
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	setenv("SWARM_SUPERVISOR_PID", pid, 1);
	log_info("supervising %u workers (%s worker --config %s; backoff %u..%u ms, %u crashes "
		 "per %u ms, hang after %u ms silent, drain %u ms, status %s)",
		 as.n, exe, o->config_path, cfg->agentd.restart_backoff_min_ms,
		 cfg->agentd.restart_backoff_max_ms, cfg->agentd.crash_limit,
		 cfg->agentd.crash_window_ms, hang_ms, drain_ms,
		 status_path[0] ? status_path : "(none)");
	rc = sw_sup_run(&so, err, errlen);
	unsetenv("SWARM_SUPERVISOR_PID");
out_free:
	free(children);
	free(as.slots);
	return rc;
}

/* --- the command ---------------------------------------------------------- */

/* As root with `user` set: that user from here on (common/privdrop.h).
 * The password files (0600, often root's) were read before; workers,
 * which re-read the configuration as that user, get the passwords in
 * their environment instead (common/secret.h: the environment wins),
 * readable by that user and root only, like the files. */
static int drop_root(const struct sw_config *cfg, char *err, size_t errlen)
{
	bool switched;
	int rc = sw_privdrop(cfg->user, &switched, err, errlen);

	if (rc || !switched)
		return rc;
	if (sw_secret_redis()[0])
		setenv(SW_SECRET_REDIS_ENV, sw_secret_redis(), 1);
	if (sw_secret_pg()[0])
		setenv(SW_SECRET_PG_ENV, sw_secret_pg(), 1);
	log_info("running as user %s (uid %u, gid %u)", cfg->user, (unsigned)getuid(),
		 (unsigned)getgid());
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: agentd --config FILE [--sql-dir DIR] [-n]\n"
		   "       agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR] [-n]\n");
}

int agent_supervisor_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "sql-dir", required_argument, NULL, 's' },
		{ "check", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct agent_sup_opts o = { 0 };
	struct sw_config cfg;
	const char *config = NULL;
	char err[SW_ERR_MAX], *json;
	bool check = false;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:s:nh", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 's': o.sql_dir = optarg; break;
		case 'n': check = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!config || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (sw_config_load_file(config, &cfg, err, sizeof(err)) != 0 ||
	    sw_config_apply_env(&cfg, err, sizeof(err)) != 0 ||
	    sw_config_validate(&cfg, 0, err, sizeof(err)) != 0 ||
	    sw_secrets_load(&cfg, err, sizeof(err)) != 0) {
		fprintf(stderr, "agentd: %s\n", err);
		return 1;
	}
	if (check) {
		printf("configuration OK\n");
		return 0;
	}
	sw_log_init("agentd", (enum sw_log_level)cfg.log.level);
	if (cfg.log.file[0] && sw_log_open(cfg.log.file) != 0)
		fprintf(stderr, "agentd: cannot open log file %s; logging to stderr\n",
			cfg.log.file);
	sw_log_install_sigusr1();
	log_info("agentd %s supervisor (libuv %s)", SW_VERSION, uv_version_string());
	json = sw_config_to_json(&cfg); /* passwords redacted */
	if (json)
		log_info("effective configuration: %s", json);
	free(json);
	rc = drop_root(&cfg, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "agentd: user: %s\n", err);
		log_error("user: %s", err);
		return 1;
	}
	o.cfg = &cfg;
	o.config_path = config;
	rc = agent_sup_run(&o, err, sizeof(err));
	if (rc) {
		log_error("%s", err);
		return 1;
	}
	log_info("agentd supervisor: exit 0");
	return 0;
}
