/* main.c - swarmctl, the operator's tool.
 *
 *   swarmctl [--config FILE] start | stop | status [--json] | check
 *                            | mem [--dump] | logs [SERVICE] [-f]
 *                            | submit ... | results [ID] | top
 *
 * Without --config (or $SWARM_CONFIG) swarmctl runs managed local services
 * in the state directory (services.h). Exit status: 0 success, 1 failure,
 * 2 usage error. submit and results: tasks.h; status and top: view.h.
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
#include "swarmctl/services.h"
#include "swarmctl/tasks.h"
#include "swarmctl/view.h"

#define EXIT_USAGE 2

static const char *config_path;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: swarmctl [--config FILE] COMMAND\n"
		"  start              start Redis and PostgreSQL (managed), gpud, agentd\n"
		"  stop               drain and stop agentd, gpud, then managed services\n"
		"  status [--json]    processes, queue, gpud memory, caches, throughput\n"
		"  check              validate the configuration\n"
		"  mem [--dump]       gpud's memory report (--dump: every block's owner to a file)\n"
		"  logs [SERVICE] [-f]  print (or follow) a service's log: gpud, agentd, redis,\n"
		"                     postgres\n"
		"  submit FILE|URL|- ... [--kind summarize|answer|ingest] [--question Q] [--wait]\n"
		"                     [--timeout S] [--max-tokens N]   queue one task per input\n"
		"                     (--wait: and print the results)\n"
		"  results [TASK_ID] [--json] [--limit N]   a task's result, or the latest tasks\n"
		"  top [--interval S] [--iterations N]      live view (q quits)\n"
		"Without --config (or $SWARM_CONFIG), services run managed in the state directory\n"
		"($SWARM_STATE_DIR, default ~/.local/state/swarm; /var/lib/swarm for root).\n");
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
	static const enum ctl_service order[] = { CTL_AGENTD, CTL_GPUD, CTL_REDIS, CTL_POSTGRES };
	char err[SW_ERR_MAX];
	int status = 0;

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
	bool any = false;

	for (int s = 0; s < CTL_N_SERVICES; s++)
		any |= ctl_service_pid(&e, s) != 0;
	rc = any ? cmd_stop_env(&e) : 0;
	if (!any)
		printf("nothing is running\n");
	close(lock);
	return rc;
}

static int cmd_start(void)
{
	static const enum ctl_service order[] = { CTL_REDIS, CTL_POSTGRES, CTL_GPUD, CTL_AGENTD };
	struct ctl_env e;
	char err[CTL_START_ERR_MAX];
	int lock;

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

	if (g || a) {
		fprintf(stderr, "swarmctl: swarm is already running in %s (gpud pid %d, agentd pid "
			"%d); `swarmctl stop` first\n", e.state_dir, (int)g, (int)a);
		close(lock);
		return 1;
	}
	if (e.managed && e.builtin_model)
		printf("note: no SWARM_MODEL set: gpud runs a built-in model with random weights, "
		       "so its text is noise\n");
	/* a wrong model path is the commonest mistake: say so before
	 * starting anything */
	if (!e.builtin_model && access(e.cfg.gpud.model, R_OK) != 0) {
		fprintf(stderr, "swarmctl: gpud.model %s: %s (%s)\n", e.cfg.gpud.model,
			strerror(errno), e.managed ? "SWARM_MODEL" : e.user_config);
		close(lock);
		return 1;
	}
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum ctl_service s = order[i];
		int rc;

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
	close(lock);
	return 0;
}

static void print_uptime(double s)
{
	char b[32];

	if (s < 0)
		snprintf(b, sizeof(b), "-");
	else if (s < 120)
		snprintf(b, sizeof(b), "%.0fs", s);
	else if (s < 7200)
		snprintf(b, sizeof(b), "%.1fm", s / 60);
	else
		snprintf(b, sizeof(b), "%.1fh", s / 3600);
	printf("%s", b);
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
	procs = json_object();
	for (int s = 0; s < CTL_N_SERVICES; s++) {
		json_t *p = json_object();
		pid_t pid = ctl_service_pid(&e, s);
		bool up = pid != 0;

		if (!ctl_service_managed(&e, s)) {
			up = ctl_service_ping(&e, s, err, sizeof(err)) == 0;
			json_object_set_new(p, "external", json_true());
			if (!up)
				json_object_set_new(p, "error", json_string(err));
		}
		json_object_set_new(p, "up", json_boolean(up));
		if (pid) {
			json_object_set_new(p, "pid", json_integer(pid));
			json_object_set_new(p, "uptime_s", json_real(ctl_proc_uptime_s(pid)));
		}
		all_up &= up;
		any_up |= up;
		json_object_set_new(procs, ctl_service_name(s), p);
	}
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
	if (have_queue)
		json_object_set_new(out, "queue", json_pack("{s:I, s:I, s:I, s:I}", "length",
			(json_int_t)q.length, "waiting", (json_int_t)q.undelivered, "pending",
			(json_int_t)q.pending, "dead", (json_int_t)q.dead));
	else
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
	printf("%-10s %-6s %-8s %s\n", "SERVICE", "STATE", "PID", "UPTIME");
	for (int s = 0; s < CTL_N_SERVICES; s++) {
		json_t *p = json_object_get(procs, ctl_service_name(s));
		bool up = json_is_true(json_object_get(p, "up"));
		json_t *pid = json_object_get(p, "pid");

		printf("%-10s %-6s ", ctl_service_name(s), up ? "up" : "down");
		if (pid)
			printf("%-8lld ", (long long)json_integer_value(pid));
		else
			printf("%-8s ", json_object_get(p, "external") ? "external" : "-");
		print_uptime(pid ? json_real_value(json_object_get(p, "uptime_s")) : -1);
		if (json_object_get(p, "error"))
			printf("  %s", json_string_value(json_object_get(p, "error")));
		printf("\n");
	}
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
	    strcmp(service, "postgres") && strcmp(service, "model")) {
		fprintf(stderr, "swarmctl: logs: unknown service \"%s\" (gpud, agentd, redis, "
			"postgres)\n", service);
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
	if (!strcmp(cmd, "logs"))
		return cmd_logs(optind < argc ? argv[optind] : NULL, follow);
	fprintf(stderr, "swarmctl: unknown command \"%s\"\n", cmd);
	usage(stderr);
	return EXIT_USAGE;
}
