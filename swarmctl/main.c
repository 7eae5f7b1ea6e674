/* main.c - swarmctl, the operator's tool.
 *
 *   swarmctl [--config FILE] start | stop | status [--json] | check
 *                            | mem [--dump] | logs [SERVICE] [-f]
 *                            | submit ... | results [ID] | top
 *   swarmctl supervise       (what `start` leaves running; supervise.h)
 *
 * Without --config (or $SWARM_CONFIG) swarmctl runs managed local services
 * in the state directory (services.h) under its supervisor (supervise.h).
 * Exit status: 0 success, 1 failure, 2 usage error. submit and results:
 * tasks.h; status and top: view.h.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "proto/client.h"
#include "swarmctl/proc.h"
#include "common/time.h"
#include "swarmctl/services.h"
#include "swarmctl/supervise.h"
#include "swarmctl/tasks.h"
#include "swarmctl/view.h"

#define EXIT_USAGE 2

static const char *config_path;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: swarmctl [--config FILE] COMMAND\n"
		"  start              start Redis and PostgreSQL (managed), gpud, agentd, and\n"
		"                     gpud-http when http.listen is set (managed: 127.0.0.1:8080)\n"
		"  stop               stop the supervisor, gpud-http, drain and stop agentd,\n"
		"                     gpud, then managed services\n"
		"  status [--json]    processes, queue, gpud memory, caches, throughput\n"
		"  check              validate the configuration\n"
		"  mem [--dump]       gpud's memory report (--dump: every block's owner to a file)\n"
		"  logs [SERVICE] [-f]  print (or follow) a service's log: gpud, agentd, redis,\n"
		"                     postgres, gpud-http, supervisor\n"
		"  submit FILE|URL|- ... [--kind summarize|answer|ingest] [--question Q] [--wait]\n"
		"                     [--timeout S] [--max-tokens N]   queue one task per input\n"
		"                     (--wait: and print the results)\n"
		"  results [TASK_ID] [--json] [--limit N]   a task's result, or the latest tasks\n"
		"  top [--interval S] [--iterations N]      live view (q quits)\n"
		"Without --config (or $SWARM_CONFIG), services run managed in the state directory\n"
		"($SWARM_STATE_DIR, default ~/.local/state/swarm; /var/lib/swarm for root), under\n"
		"a supervisor (`swarmctl supervise`, which start runs) that restarts any that dies.\n");
}

static int env_init(struct ctl_env *e)
{
	char err[SW_ERR_MAX];

	if (ctl_env_init(e, config_path, err, sizeof(err)) != 0) {
		fprintf(stderr, "swarmctl: %s\n", err);
		return 1;
	}
	return 0;
}

static int cmd_check(void)
{
	struct ctl_env e;

	if (env_init(&e))
		return 1;
	printf("configuration OK (%s; state directory %s)\n",
	       e.managed ? "managed local services" : e.user_config, e.state_dir);
	return 0;
}

static int cmd_stop_env(struct ctl_env *e)
{
	/* gpud's clients first: the HTTP front ends its streams, agentd
	 * drains, then gpud */
	static const enum ctl_service order[] = { CTL_HTTP, CTL_AGENTD, CTL_GPUD, CTL_REDIS,
						  CTL_POSTGRES };
	char err[SW_ERR_MAX];
	pid_t sup = e->managed ? ctl_supervisor_pid(e) : 0;
	int status = 0;

	/* first the supervisor, so that nothing is restarted while stopping */
	if (sup) {
		bool killed = false;
		int rc;

		printf("stopping supervisor (pid %d)\n", (int)sup);
		fflush(stdout);
		rc = ctl_supervisor_stop(e, &killed);
		if (rc) {
			fprintf(stderr, "swarmctl: supervisor (pid %d) did not stop: %s\n", (int)sup,
				strerror(-rc));
			return 1; /* it would restart what we stop */
		}
		if (killed)
			fprintf(stderr, "swarmctl: the supervisor did not stop within %d s: killed\n",
				CTL_SUP_STOP_MS / 1000);
	}
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum ctl_service s = order[i];
		pid_t pid = ctl_service_pid(e, s);
		bool killed = false;

		if (!ctl_service_managed(e, s) || !pid)
			continue;
		printf("stopping %s (pid %d)\n", ctl_service_name(s), (int)pid);
		fflush(stdout);
		if (ctl_service_stop(e, s, &killed, err, sizeof(err)) != 0) {
			fprintf(stderr, "swarmctl: %s\n", err);
			status = 1;
		} else if (killed) {
			fprintf(stderr, "swarmctl: %s did not stop within its deadline: killed\n",
				ctl_service_name(s));
		}
	}
	return status;
}

static int cmd_stop(void)
{
	struct ctl_env e;
	char err[SW_ERR_MAX];
	int lock, rc;

	if (env_init(&e))
		return 1;
	if (access(e.state_dir, F_OK) != 0) {
		printf("nothing is running (no state directory %s)\n", e.state_dir);
		return 0;
	}
	lock = ctl_state_lock(&e, err, sizeof(err));
	if (lock < 0) {
		fprintf(stderr, "swarmctl: %s\n", err);
		return 1;
	}
	bool any = e.managed && ctl_supervisor_pid(&e) != 0;

	for (int s = 0; s < CTL_N_SERVICES; s++)
		any |= ctl_service_pid(&e, s) != 0;
	rc = any ? cmd_stop_env(&e) : 0;
	if (!any)
		printf("nothing is running\n");
	close(lock);
	return rc;
}

/* Appends "\nlast lines of LOG:\n<its end>" to the message in err. */
static void append_log_tail(char *err, size_t errlen, const char *log)
{
	char tail[2 * SW_ERR_MAX];
	size_t n = strlen(err);

	ctl_tail(log, 12, tail, sizeof(tail));
	if (tail[0] && n + 1 < errlen)
		snprintf(err + n, errlen - n, "\nlast lines of %.1024s:\n%.2000s", log, tail);
}

/* What the supervisor says about service s: 0 and *pid once it runs,
 * -EAGAIN while it is on its way, or a negative code with the reason
 * (and the end of its log) when it died during start-up (a crash count
 * above base). */
static int service_progress(const struct ctl_env *e, pid_t sup, enum ctl_service s,
			    json_int_t base, pid_t *pid, bool *adopted, char *err, size_t errlen)
{
	json_t *st = ctl_supervisor_status(e), *v;
	const char *state, *last, *why;
	char log[PATH_MAX + 32];
	int rc = -EAGAIN;

	if (json_integer_value(json_object_get(st, "pid")) != sup)
		goto out; /* not written by this supervisor yet */
	v = ctl_supervisor_service(st, s);
	state = json_string_value(json_object_get(v, "state"));
	if (!state)
		goto out;
	if (!strcmp(state, "running")) {
		*pid = (pid_t)json_integer_value(json_object_get(v, "pid"));
		*adopted = json_is_true(json_object_get(v, "adopted"));
		rc = 0;
		goto out;
	}
	/* a death since base (failed implies one): not a state, which may
	 * still say "failed" from before a retry */
	if (json_integer_value(json_object_get(v, "crashes")) <= base)
		goto out;
	last = json_string_value(json_object_get(v, "last_exit"));
	why = json_string_value(json_object_get(v, "error"));
	last = last ? last : "";
	why = why ? why : "";
	if (!strncmp(last, "spawn:", 6))
		rc = sw_seterr(err, errlen, -EIO, "cannot start %s: %s", ctl_service_name(s), why);
	else if (!strncmp(why, "not ready", 9))
		rc = sw_seterr(err, errlen, -ETIMEDOUT, "%s did not answer in time (%s)",
			       ctl_service_name(s), why);
	else
		rc = sw_seterr(err, errlen, -ECHILD, "%s exited during start-up (%s)",
			       ctl_service_name(s), last);
	ctl_service_log_path(e, ctl_service_name(s), log, sizeof(log));
	append_log_tail(err, errlen, log);
out:
	json_decref(st);
	return rc;
}

/* Waits (printing as each comes up) until the supervisor sup reports
 * every service running. base: each service's crash count before. */
static int wait_services(const struct ctl_env *e, pid_t sup, const json_int_t *base, char *err,
			 size_t errlen)
{
	static const enum ctl_service order[] = { CTL_REDIS, CTL_POSTGRES, CTL_GPUD, CTL_AGENTD,
						  CTL_HTTP };

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum ctl_service s = order[i];
		struct ctl_command cmd;

		if (!ctl_service_enabled(e, s))
			continue;
		struct sw_deadline d;
		bool adopted = false;
		pid_t pid = 0;
		int rc;

		printf("starting %s ... ", ctl_service_name(s));
		fflush(stdout);
		rc = ctl_service_command(e, s, &cmd, err, errlen);
		/* the supervisor enforces the start-up deadline; this one only
		 * covers a supervisor that stopped writing its status */
		d = sw_deadline_in_ms((uint64_t)cmd.start_timeout_ms + 15000);
		while (!rc) {
			char log[PATH_MAX + 32];

			rc = service_progress(e, sup, s, base[s], &pid, &adopted, err, errlen);
			if (rc != -EAGAIN)
				break;
			rc = 0;
			if (ctl_proc_start_ticks(sup) && !sw_deadline_expired(d)) {
				sw_sleep_ms(100);
				continue;
			}
			rc = sw_seterr(err, errlen, -ETIMEDOUT, ctl_proc_start_ticks(sup) ?
				       "the supervisor (pid %d) did not report it in time" :
				       "the supervisor (pid %d) exited", (int)sup);
			ctl_service_log_path(e, "supervisor", log, sizeof(log));
			append_log_tail(err, errlen, log);
		}
		if (rc) {
			printf("failed\n");
			fprintf(stderr, "swarmctl: %s: %s\n", ctl_service_name(s), err);
			return rc;
		}
		printf("ok (pid %d%s)\n", (int)pid, adopted ? ", already running" : "");
	}
	return 0;
}

/* Managed start: one-time preparations, then the supervisor, which
 * starts (or adopts) the services; or, with a supervisor running, a
 * retry of the services it marked failed. */
static int cmd_start_managed(struct ctl_env *e)
{
	char err[CTL_START_ERR_MAX], pidf[PATH_MAX + 32];
	json_int_t base[CTL_N_SERVICES] = { 0 };
	pid_t sup = ctl_supervisor_pid(e), running[CTL_N_SERVICES];
	bool any_running = false, retry = false;
	int rc;

	for (int s = 0; s < CTL_N_SERVICES; s++) {
		running[s] = ctl_service_pid(e, s);
		any_running |= running[s] != 0;
	}
	if (sup) {
		json_t *st = ctl_supervisor_status(e);

		if (json_integer_value(json_object_get(st, "pid")) == sup) {
			for (int s = 0; s < CTL_N_SERVICES; s++) {
				json_t *v = ctl_supervisor_service(st, s);

				base[s] = json_integer_value(json_object_get(v, "crashes"));
				if (!strcmp(json_string_value(json_object_get(v, "state")) ?: "",
					    "failed")) {
					printf("%s failed: starting it again\n", ctl_service_name(s));
					retry = true;
				}
			}
		}
		json_decref(st);
		if (!retry) {
			fprintf(stderr, "swarmctl: swarm is already running in %s (supervisor pid %d, "
				"gpud pid %d, agentd pid %d); `swarmctl stop` first\n", e->state_dir,
				(int)sup, (int)running[CTL_GPUD], (int)running[CTL_AGENTD]);
			return 1;
		}
		kill(sup, SIGHUP);
	} else {
		if (any_running)
			printf("the supervisor is not running: starting one; it adopts the running "
			       "services\n");
		rc = ctl_managed_prepare(e, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "swarmctl: %s\n", err);
			return 1;
		}
		sup = ctl_supervisor_spawn(e, err, sizeof(err));
		if (sup < 0) {
			fprintf(stderr, "swarmctl: %s\n", err);
			return 1;
		}
		/* the supervisor writes it too; this one is there at once for
		 * a stop that follows a failure */
		ctl_path(e, "run/supervisor.pid", pidf, sizeof(pidf));
		ctl_pidfile_write(pidf, sup);
	}
	rc = wait_services(e, sup, base, err, sizeof(err));
	if (rc) {
		if (!any_running && !retry)
			cmd_stop_env(e); /* a fresh start leaves nothing behind */
		return 1;
	}
	printf("swarm is running (state directory %s; supervisor pid %d restarts any service "
	       "that dies)\n", e->state_dir, (int)sup);
	if (ctl_service_enabled(e, CTL_HTTP))
		printf("OpenAI-compatible API: http://%s/v1\n", e->cfg.http.listen);
	return 0;
}

static int cmd_start(void)
{
	static const enum ctl_service order[] = { CTL_REDIS, CTL_POSTGRES, CTL_GPUD, CTL_AGENTD,
						  CTL_HTTP };
	struct ctl_env e;
	char err[CTL_START_ERR_MAX];
	int lock, rc;

	if (env_init(&e))
		return 1;
	if (ctl_state_prepare(&e, err, sizeof(err)) != 0) {
		fprintf(stderr, "swarmctl: %s\n", err);
		return 1;
	}
	lock = ctl_state_lock(&e, err, sizeof(err));
	if (lock < 0) {
		fprintf(stderr, "swarmctl: %s\n", err);
		return 1;
	}
	pid_t g = ctl_service_pid(&e, CTL_GPUD), a = ctl_service_pid(&e, CTL_AGENTD);

	if (!e.managed && (g || a)) {
		fprintf(stderr, "swarmctl: swarm is already running in %s (gpud pid %d, agentd pid "
			"%d); `swarmctl stop` first\n", e.state_dir, (int)g, (int)a);
		close(lock);
		return 1;
	}
	if (e.managed && e.builtin_model)
		printf("note: no SWARM_MODEL set: gpud runs a built-in model with random weights, "
		       "so its text is noise\n");
	if (e.http_missing)
		printf("note: gpud-http not found (%s): no HTTP API (build it, or set "
		       "SWARM_GPUD_HTTP_BIN)\n", e.http_bin);
	/* a wrong model path is the commonest mistake: say so before
	 * starting anything */
	if (!e.builtin_model && access(e.cfg.gpud.model, R_OK) != 0) {
		fprintf(stderr, "swarmctl: gpud.model %s: %s (%s)\n", e.cfg.gpud.model,
			strerror(errno), e.managed ? "SWARM_MODEL" : e.user_config);
		close(lock);
		return 1;
	}
	if (e.managed) {
		rc = cmd_start_managed(&e);
		close(lock);
		return rc;
	}
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum ctl_service s = order[i];

		if (!ctl_service_enabled(&e, s))
			continue;
		printf("%s %s ... ", ctl_service_managed(&e, s) ? "starting" : "checking",
		       ctl_service_name(s));
		fflush(stdout);
		rc = ctl_service_start(&e, s, err, sizeof(err));
		if (rc) {
			printf("failed\n");
			fprintf(stderr, "swarmctl: %s: %s\n", ctl_service_name(s), err);
			cmd_stop_env(&e);
			close(lock);
			return 1;
		}
		pid_t pid = ctl_service_pid(&e, s);

		if (pid)
			printf("ok (pid %d)\n", (int)pid);
		else
			printf("ok\n");
	}
	printf("swarm is running (state directory %s)\n", e.state_dir);
	if (ctl_service_enabled(&e, CTL_HTTP))
		printf("OpenAI-compatible API: http://%s/v1\n", e.cfg.http.listen);
	close(lock);
	return 0;
}

static int cmd_status(bool as_json)
{
	struct ctl_env e;
	char err[SW_ERR_MAX];
	char qerr[SW_ERR_MAX];
	json_t *out, *procs, *stats, *agentd_st;
	struct ctl_queue_stats q;
	bool all_up = true, any_up = false, have_queue;

	if (env_init(&e))
		return 1;
	out = json_object();
	procs = ctl_processes_json(&e, &all_up, &any_up);
	json_object_set_new(out, "state_dir", json_string(e.state_dir));
	json_object_set_new(out, "managed", json_boolean(e.managed));
	json_object_set_new(out, "processes", procs);
	stats = ctl_gpud_json(&e, false, 0, err, sizeof(err));
	if (stats) {
		json_object_set_new(out, "gpud", stats);
		json_object_set_new(out, "device_memory", ctl_device_memory(stats));
	} else {
		json_object_set_new(out, "gpud_error", json_string(err));
	}
	agentd_st = ctl_service_pid(&e, CTL_AGENTD) ? ctl_agentd_status(&e) : NULL;
	if (agentd_st)
		json_object_set_new(out, "agentd", json_incref(agentd_st));
	have_queue = ctl_queue_stats(e.cfg.redis.url, &q, qerr, sizeof(qerr)) == 0;
	if (have_queue) {
		char derr[SW_ERR_MAX];

		/* swarm:dead is capped: the count is PostgreSQL's (-1 unknown) */
		ctl_dead_count(e.cfg.postgres.url, &q.dead, derr, sizeof(derr));
		json_object_set_new(out, "queue", json_pack("{s:I, s:I, s:I, s:I, s:I}", "length",
			(json_int_t)q.length, "waiting", (json_int_t)q.undelivered, "pending",
			(json_int_t)q.pending, "dead", (json_int_t)q.dead, "dead_kept",
			(json_int_t)q.dead_kept));
	} else
		json_object_set_new(out, "queue_error", json_string(qerr));

	if (as_json) {
		char *s = json_dumps(out, JSON_INDENT(2) | JSON_SORT_KEYS);

		puts(s ? s : "{}");
		free(s);
		json_decref(agentd_st);
		json_decref(out);
		return all_up ? 0 : 1;
	}
	printf("state directory %s (%s)\n", e.state_dir,
	       e.managed ? "managed services" : "external Redis/PostgreSQL");
	ctl_print_processes(stdout, &e, procs);
	printf("\n");
	if (agentd_st)
		ctl_print_agentd(stdout, agentd_st);
	json_decref(agentd_st);
	if (have_queue)
		ctl_print_queue(stdout, &q);
	else if (any_up)
		printf("queue: %s\n", qerr);
	if (stats)
		ctl_print_gpud(stdout, stats);
	else if (any_up)
		printf("gpud: %s\n", err);
	if (!any_up)
		printf("nothing is running (`swarmctl start` starts the swarm)\n");
	json_decref(out);
	return all_up ? 0 : 1;
}

static int cmd_mem(bool dump)
{
	struct ctl_env e;
	char err[SW_ERR_MAX];
	json_t *j;
	char *s;

	if (env_init(&e))
		return 1;
	j = ctl_gpud_json(&e, true, dump ? PROTO_MEM_DUMP_OWNERS : 0, err, sizeof(err));
	if (!j) {
		fprintf(stderr, "swarmctl: gpud: %s\n", err);
		return 1;
	}
	s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
	puts(s ? s : "{}");
	free(s);
	json_decref(j);
	return 0;
}

static int cmd_logs(const char *service, bool follow)
{
	struct ctl_env e;
	char path[PATH_MAX + 64], rel[64];

	if (env_init(&e))
		return 1;
	if (!service)
		service = "gpud";
	if (strcmp(service, "gpud") && strcmp(service, "agentd") && strcmp(service, "redis") &&
	    strcmp(service, "postgres") && strcmp(service, "model") &&
	    strcmp(service, "gpud-http") && strcmp(service, "supervisor")) {
		fprintf(stderr, "swarmctl: logs: unknown service \"%s\" (gpud, agentd, redis, "
			"postgres, gpud-http, supervisor)\n", service);
		return EXIT_USAGE;
	}
	snprintf(rel, sizeof(rel), "logs/%s.log", service);
	ctl_path(&e, rel, path, sizeof(path));
	if (access(path, R_OK) != 0) {
		fprintf(stderr, "swarmctl: %s: %s\n", path, strerror(errno));
		return 1;
	}
	char *argv[] = { "tail", "-n", "200", follow ? "-F" : path, follow ? path : NULL, NULL };

	fflush(stdout);
	execvp("tail", argv);
	fprintf(stderr, "swarmctl: tail: %s\n", strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "dump", no_argument, NULL, 'd' },
		{ "follow", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool as_json = false, dump = false, follow = false;
	const char *cmd;
	int c;

	signal(SIGPIPE, SIG_IGN);
	while ((c = getopt_long(argc, argv, "+c:jdfh", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config_path = optarg; break;
		case 'j': as_json = true; break;
		case 'd': dump = true; break;
		case 'f': follow = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[optind++];
	if (!strcmp(cmd, "submit") || !strcmp(cmd, "results") || !strcmp(cmd, "top")) {
		/* their own options; argv[0] becomes the command's name */
		struct ctl_env e;
		int sub_argc = argc - optind + 1;
		char **sub_argv = argv + optind - 1;

		if (env_init(&e))
			return 1;
		if (!strcmp(cmd, "submit"))
			return ctl_cmd_submit(&e, sub_argc, sub_argv);
		if (!strcmp(cmd, "results"))
			return ctl_cmd_results(&e, sub_argc, sub_argv);
		return ctl_cmd_top(&e, sub_argc, sub_argv);
	}
	/* options may also follow the command */
	while ((c = getopt_long(argc, argv, "+c:jdfh", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config_path = optarg; break;
		case 'j': as_json = true; break;
		case 'd': dump = true; break;
		case 'f': follow = true; break;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (!strcmp(cmd, "start"))
		return cmd_start();
	if (!strcmp(cmd, "stop"))
		return cmd_stop();
	if (!strcmp(cmd, "status"))
		return cmd_status(as_json);
	if (!strcmp(cmd, "check"))
		return cmd_check();
	if (!strcmp(cmd, "mem"))
		return cmd_mem(dump);
	if (!strcmp(cmd, "supervise")) {
		struct ctl_env e;

		if (env_init(&e))
			return 1;
		return ctl_cmd_supervise(&e);
	}
	if (!strcmp(cmd, "logs"))
		return cmd_logs(optind < argc ? argv[optind] : NULL, follow);
	fprintf(stderr, "swarmctl: unknown command \"%s\"\n", cmd);
	usage(stderr);
	return EXIT_USAGE;
}
