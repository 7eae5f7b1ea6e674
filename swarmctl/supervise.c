/* supervise.c - `swarmctl supervise`, the managed-mode supervisor, and
 * what start, stop and status need to know about it (see supervise.h).
 *
 * The loop is common/supervise.c; this file gives it the four services
 * (services.h: command lines, readiness probes, stale PostgreSQL lock
 * files), keeps their pid files, and writes the status document.
 */
#include "swarmctl/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/log.h"
#include "common/supervise.h"
#include "common/time.h"
#include "sw_config.h"
#include "swarmctl/proc.h"

#define TAIL_LINES 12

struct ctl_sup {
	const struct ctl_env *e;
	struct ctl_command cmd[CTL_N_SERVICES];
	struct sw_sup_child ch[CTL_N_SERVICES];
	char pidfile[CTL_N_SERVICES][PATH_MAX + 32]; /* "" for PostgreSQL (postmaster.pid) */
	char last_lines[CTL_N_SERVICES][2 * SW_ERR_MAX];
	unsigned n;  /* services supervised: all, or all but gpud-http (the last) */
	uint64_t started_at;
};

static void sup_path(const struct ctl_env *e, const char *rel, char *out, size_t cap)
{
	ctl_path(e, rel, out, cap);
}

pid_t ctl_supervisor_pid(const struct ctl_env *e)
{
	char p[PATH_MAX + 32];
	pid_t pid;

	sup_path(e, "run/supervisor.pid", p, sizeof(p));
	pid = ctl_pidfile_live(p);
	return pid > 0 ? pid : 0;
}

json_t *ctl_supervisor_status(const struct ctl_env *e)
{
	char p[PATH_MAX + 32];
	json_t *j;

	sup_path(e, CTL_SUP_STATUS_FILE, p, sizeof(p));
	j = json_load_file(p, 0, NULL);
	if (j && !json_is_object(j)) {
		json_decref(j);
		j = NULL;
	}
	return j;
}

json_t *ctl_supervisor_service(const json_t *status, enum ctl_service s)
{
	size_t i;
	json_t *v;

	json_array_foreach(json_object_get(status, "services"), i, v) {
		const char *name = json_string_value(json_object_get(v, "name"));

		if (name && strcmp(name, ctl_service_name(s)) == 0)
			return v;
	}
	return NULL;
}

pid_t ctl_supervisor_spawn(const struct ctl_env *e, char *err, size_t errlen)
{
	char exe[PATH_MAX], log[PATH_MAX + 32];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	pid_t pid;

	if (n <= 0 || n >= (ssize_t)sizeof(exe) - 1)
		return sw_seterr(err, errlen, -ENOENT, "cannot find swarmctl's own executable");
	exe[n] = '\0';
	ctl_service_log_path(e, "supervisor", log, sizeof(log));
	char *argv[] = { exe, "supervise", NULL };

	pid = ctl_spawn(argv, NULL, log, NULL);
	if (pid < 0)
		return sw_seterr(err, errlen, pid, "%s supervise: %s", exe, strerror(-pid));
	return pid;
}

int ctl_supervisor_stop(const struct ctl_env *e, bool *killed)
{
	char p[PATH_MAX + 32];
	pid_t pid = ctl_supervisor_pid(e);
	int rc;

	if (killed)
		*killed = false;
	if (!pid)
		return 0;
	rc = ctl_stop_pid(pid, SIGTERM, CTL_SUP_STOP_MS, killed);
	if (rc && rc != -ESRCH)
		return rc;
	sup_path(e, "run/supervisor.pid", p, sizeof(p));
	unlink(p);
	return 0;
}

/* --- the supervisor's hooks ----------------------------------------------- */

static int before_spawn(void *user, unsigned i, char *err, size_t errlen)
{
	struct ctl_sup *cs = user;
	int rc = ctl_service_clear_stale(cs->e, (enum ctl_service)i, err, errlen);

	if (rc > 0)
		log_warn("%s: removed a stale postmaster.pid (its pid belongs to another process "
			 "now)", ctl_service_name(i));
	return rc < 0 ? rc : 0;
}

static void on_start(struct sw_sup *sup, unsigned i, void *user)
{
	struct ctl_sup *cs = user;
	int rc;

	if (!cs->pidfile[i][0])
		return;
	rc = ctl_pidfile_write(cs->pidfile[i], sw_sup_info(sup, i)->pid);
	if (rc)
		log_warn("%s: %s", cs->pidfile[i], strerror(-rc));
}

static void on_service_exit(struct sw_sup *sup, unsigned i, int pid, void *user)
{
	struct ctl_sup *cs = user;

	(void)sup;
	(void)pid;
	if (cs->pidfile[i][0])
		unlink(cs->pidfile[i]);
	ctl_tail(cs->cmd[i].log, TAIL_LINES, cs->last_lines[i], sizeof(cs->last_lines[i]));
}

static int probe(void *user, unsigned i, int pid, bool live, char *err, size_t errlen)
{
	struct ctl_sup *cs = user;

	return ctl_service_ready(cs->e, (enum ctl_service)i, pid, live, err, errlen);
}

static json_t *status_json(struct sw_sup *sup, void *user)
{
	struct ctl_sup *cs = user;
	json_t *arr, *root = sw_sup_status_doc(sup, "services", &arr);

	if (!root ||
	    json_object_set_new(root, "started_at", json_integer((json_int_t)cs->started_at))) {
		json_decref(root);
		return NULL;
	}
	for (unsigned i = 0; i < cs->n; i++) {
		json_t *s = sw_sup_info_json(sup, i);

		if (!s)
			continue;
		json_object_set_new(s, "log", json_string(cs->cmd[i].log));
		json_object_set_new(s, "last_lines", json_string(cs->last_lines[i]));
		json_array_append_new(arr, s);
	}
	return root;
}

static const struct sw_sup_ops ctl_sup_ops = {
	.before_spawn = before_spawn,
	.on_start = on_start,
	.on_exit = on_service_exit,
	.probe = probe,
	.status = status_json,
};

/* --- the command ---------------------------------------------------------- */

/* Holds run/supervisor.lock for the life of the process (close-on-exec:
 * the services do not inherit it). Returns the fd or a negative code. */
static int take_lock(const struct ctl_env *e)
{
	char p[PATH_MAX + 32];
	int fd;

	sup_path(e, "run/supervisor.lock", p, sizeof(p));
	fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;

		close(fd);
		return rc;
	}
	return fd;
}

int ctl_cmd_supervise(struct ctl_env *e)
{
	struct ctl_sup *cs = NULL;
	struct sw_sup_opts so = { 0 };
	char err[CTL_START_ERR_MAX], pidf[PATH_MAX + 32], own_log[PATH_MAX + 32], *json;
	const char *extra[2] = { own_log, NULL };
	int lock = -1, rc, status = 1;

	if (!e->managed) {
		fprintf(stderr, "swarmctl: supervise: managed mode only (no --config); under a "
			"configuration file systemd supervises gpud and agentd\n");
		return 1;
	}
	sw_log_init("supervisor", (enum sw_log_level)e->cfg.log.level);
	if (ctl_state_prepare(e, err, sizeof(err)) != 0) {
		log_error("%s", err);
		return 1;
	}
	lock = take_lock(e);
	if (lock < 0) {
		log_error("another supervisor runs in %s (pid %d): %s", e->state_dir,
			  (int)ctl_supervisor_pid(e), strerror(-lock));
		return 1;
	}
	sup_path(e, "run/supervisor.pid", pidf, sizeof(pidf));
	rc = ctl_pidfile_write(pidf, getpid());
	if (rc) {
		log_error("%s: %s", pidf, strerror(-rc));
		goto out_unlock;
	}
	cs = calloc(1, sizeof(*cs));
	if (!cs) {
		log_error("out of memory");
		goto out_pidfile;
	}
	cs->e = e;
	cs->started_at = sw_realtime_ms();
	/* gpud-http is last in service order: without http.listen the
	 * supervisor has one service less */
	cs->n = ctl_service_enabled(e, CTL_HTTP) ? CTL_N_SERVICES : CTL_HTTP;
	for (int s = 0; s < (int)cs->n; s++) {
		struct ctl_command *c = &cs->cmd[s];

		rc = ctl_service_command(e, s, c, err, sizeof(err));
		if (rc) {
			log_error("%s", err);
			goto out_free;
		}
		if (s != CTL_POSTGRES) {
			char rel[64];

			snprintf(rel, sizeof(rel), "run/%s.pid", ctl_service_name(s));
			ctl_path(e, rel, cs->pidfile[s], sizeof(cs->pidfile[s]));
		}
		cs->ch[s] = (struct sw_sup_child){
			.name = ctl_service_name(s),
			.file = c->argv[0],
			.argv = c->argv,
			.log_path = c->log,
			.detached = true,
			.set_ids = c->set_ids,
			.uid = c->uid,
			.gid = c->gid,
			.start_timeout_ms = c->start_timeout_ms,
			.adopt = ctl_service_pid(e, s),
		};
	}
	ctl_service_log_path(e, "supervisor", own_log, sizeof(own_log));
	so.children = cs->ch;
	so.n_children = cs->n;
	so.policy = (struct sw_sup_policy){
		.backoff_min_ms = e->cfg.supervisor.restart_backoff_min_ms,
		.backoff_max_ms = e->cfg.supervisor.restart_backoff_max_ms,
		.crash_window_ms = e->cfg.supervisor.crash_window_ms,
		.crash_limit = e->cfg.supervisor.crash_limit,
		.hang_ms = e->cfg.supervisor.hang_ms,
	};
	so.ops = &ctl_sup_ops;
	so.user = cs;
	so.noun = "service";
	so.nouns = "services";
	sup_path(e, CTL_SUP_STATUS_FILE, pidf, sizeof(pidf));
	so.status_path = pidf;
	so.stop = SW_SUP_STOP_RELEASE;
	so.ordered = true;
	so.hup_retries = true;
	/* a few answers per hang limit: one slow answer is no hang */
	so.live_probe_ms = e->cfg.supervisor.hang_ms / 4 < 5000 ? e->cfg.supervisor.hang_ms / 4 : 5000;
	if (so.live_probe_ms < 100)
		so.live_probe_ms = 100;
	so.log_max_bytes = e->cfg.supervisor.log_max_bytes;
	so.log_keep = e->cfg.supervisor.log_keep;
	so.extra_logs = extra;

	log_info("swarm supervisor %s (state directory %s): redis, postgres, gpud, agentd%s%s; "
		 "backoff %u..%u ms, more than %u deaths in %u ms = failed, hung after %u ms "
		 "without an answer (0 = never); logs bounded at %llu bytes + %u rotated",
		 SW_VERSION, e->state_dir, cs->n > CTL_HTTP ? ", gpud-http on " : "",
		 cs->n > CTL_HTTP ? e->cfg.http.listen : "", so.policy.backoff_min_ms,
		 so.policy.backoff_max_ms,
		 so.policy.crash_limit, so.policy.crash_window_ms, so.policy.hang_ms,
		 (unsigned long long)so.log_max_bytes, so.log_keep);
	json = sw_config_to_json(&e->cfg); /* passwords redacted */
	if (json)
		log_info("effective configuration: %s", json);
	free(json);
	rc = sw_sup_run(&so, err, sizeof(err));
	if (rc)
		log_error("%s", err);
	else
		log_info("stopped; the services keep running (swarmctl stop stops them)");
	status = rc ? 1 : 0;
out_free:
	free(cs);
out_pidfile:
	sup_path(e, "run/supervisor.pid", pidf, sizeof(pidf));
	unlink(pidf);
out_unlock:
	close(lock);
	return status;
}
