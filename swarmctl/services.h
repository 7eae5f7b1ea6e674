/* services.h - the processes swarmctl starts, stops and inspects.
 *
 * Two modes:
 *  - managed (no configuration file): everything lives in the state
 *    directory ($SWARM_STATE_DIR, default ~/.local/state/swarm, or
 *    /var/lib/swarm for root): a redis-server (AOF on, Unix socket only,
 *    maxmemory with noeviction), a PostgreSQL cluster (initdb on first
 *    start, Unix socket only, database "swarm" with pgvector), gpud on a
 *    built-in random-weight model that `gpud mkmodel` generates on first
 *    start (or $SWARM_MODEL), agentd, and gpud-http (the OpenAI-compatible
 *    HTTP front, a gpud client) on http.listen: 127.0.0.1:8080 unless
 *    SWARM_HTTP_LISTEN says otherwise ("" = off). swarmctl writes the
 *    configuration they read to <state>/swarm.json. They run in the
 *    foreground as children of the supervisor (swarmctl/supervise.h),
 *    which starts them with ctl_service_command, waits for
 *    ctl_service_ready and restarts them. Started by root, Redis, gpud
 *    and agentd run as the config's `user` (SWARM_USER, default "swarm",
 *    created by ctl_managed_prepare when missing), PostgreSQL as postgres.
 *  - external (--config FILE or $SWARM_CONFIG): Redis and PostgreSQL are
 *    the ones the file names (swarmctl only checks they answer); gpud,
 *    agentd and, when the file sets http.listen, gpud-http get the file
 *    itself and are started detached by
 *    ctl_service_start (under systemd, by their units); state_dir comes
 *    from the file (or $SWARM_STATE_DIR).
 *
 * State directory layout:
 *   run/     pid files (supervisor.pid, redis.pid, gpud.pid, agentd.pid,
 *            gpud-http.pid), supervisor.lock, gpud.sock, redis.sock
 *   logs/    redis.log, postgres.log, gpud.log, agentd.log, gpud-http.log,
 *            supervisor.log, model.log; NAME.log.1 .. rotated copies
 *            (supervisor.log_keep)
 *   redis/   Redis data (appendonly)
 *   pg/      PostgreSQL: data/ and its socket (owned by postgres when root;
 *            group and mode 0750 of the service user's group with one)
 *   models/  builtin.gguf
 *   swarm.json, swarmctl.lock, agentd.status.json (written by agentd's
 *   supervisor: its workers), supervisor.status.json (written by the
 *   managed-mode supervisor: its services); status and top read both
 */
#ifndef SWARMCTL_SERVICES_H
#define SWARMCTL_SERVICES_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/config.h"
#include "common/err.h"

/* ctl_service_start's message: the cause (up to SW_ERR_MAX), the path of
 * the service's log, and up to 2 * SW_ERR_MAX bytes of its last lines. */
#define CTL_START_ERR_MAX (4 * SW_ERR_MAX)

enum ctl_service {
	CTL_REDIS = 0,
	CTL_POSTGRES = 1,
	CTL_GPUD = 2,
	CTL_AGENTD = 3,
	CTL_HTTP = 4,          /* gpud-http; only while http.listen is set */
	CTL_N_SERVICES = 5,
};

/* Managed mode's http.listen when SWARM_HTTP_LISTEN is unset. */
#define CTL_HTTP_LISTEN_DEFAULT "127.0.0.1:8080"

struct ctl_env {
	bool managed;
	char state_dir[PATH_MAX];
	char config_path[PATH_MAX];  /* the file gpud and agentd read */
	char user_config[PATH_MAX];  /* "" in managed mode */
	struct sw_config cfg;        /* effective */
	char gpud_bin[PATH_MAX];
	char agentd_bin[PATH_MAX];
	char http_bin[PATH_MAX];     /* gpud-http */
	char pg_bindir[PATH_MAX];
	const char *pg_os_user;      /* "postgres" when we are root, else NULL */
	bool builtin_model;          /* managed mode without $SWARM_MODEL */
	bool http_missing;           /* managed mode: no gpud-http to run by default */
};

/* Resolves the mode, the state directory, the configuration (loaded and
 * validated; in managed mode built from defaults + environment), and the
 * binaries (next to swarmctl's own executable in a build tree or an
 * install, or $SWARM_GPUD_BIN / $SWARM_AGENTD_BIN / $SWARM_GPUD_HTTP_BIN).
 * In managed mode http.listen is CTL_HTTP_LISTEN_DEFAULT unless
 * SWARM_HTTP_LISTEN is set (to "" for none), or gpud-http is nowhere to
 * be found (http_missing; left off). Creates nothing.
 * Returns 0 or a negative code with a message. */
int ctl_env_init(struct ctl_env *e, const char *config_path, char *err, size_t errlen);

const char *ctl_service_name(enum ctl_service s);

/* A path inside the state directory ("run/gpud.pid") into out. */
void ctl_path(const struct ctl_env *e, const char *rel, char *out, size_t cap);

/* True when swarmctl starts and stops s in this mode (Redis and
 * PostgreSQL only when managed). */
bool ctl_service_managed(const struct ctl_env *e, enum ctl_service s);

/* True when s is part of this swarm: every service but gpud-http always,
 * gpud-http while http.listen is set. A service not enabled is neither
 * started nor shown, but still stopped when a pid file names it (one
 * started under an earlier configuration). */
bool ctl_service_enabled(const struct ctl_env *e, enum ctl_service s);

/* The live pid of a managed service, 0 when not running. */
pid_t ctl_service_pid(const struct ctl_env *e, enum ctl_service s);

/* External mode: checks that Redis and PostgreSQL answer, starts gpud,
 * agentd or gpud-http detached and waits until it answers (gpud `stats`;
 * agentd alive after its start-up; gpud-http 200 on GET /health). Already running: 0 and nothing done. On failure
 * the message gives the cause and the last lines of the service's log
 * (err of CTL_START_ERR_MAX bytes holds it whole); whatever was spawned
 * for s is stopped again. In managed mode a service not running is
 * -ENOTSUP: the supervisor starts those. */
int ctl_service_start(struct ctl_env *e, enum ctl_service s, char *err, size_t errlen);

/* Managed mode, before the supervisor starts: the service user (created
 * when missing) and its files, PostgreSQL's directory (and its owner when
 * root) and cluster (initdb on the first start), and the
 * built-in model (gpud mkmodel) when no SWARM_MODEL is set. Nothing is
 * done twice. Returns 0 or a negative code; the message (err of
 * CTL_START_ERR_MAX bytes) ends in the last lines of the failing tool's
 * log. */
int ctl_managed_prepare(struct ctl_env *e, char *err, size_t errlen);

#define CTL_COMMAND_ARGS 32

/* How the supervisor runs a managed service: in the foreground, stdout
 * and stderr appended to log. */
struct ctl_command {
	char *argv[CTL_COMMAND_ARGS];  /* NULL-terminated; argv[0] is the executable */
	char log[PATH_MAX + 32];       /* <state>/logs/NAME.log */
	bool set_ids;                  /* PostgreSQL as root: runs as uid/gid */
	uid_t uid;
	gid_t gid;
	uint32_t start_timeout_ms;     /* killed when not ready by then */
	char buf[4 * PATH_MAX];        /* the strings argv points into */
	size_t used;
};

/* Fills c for managed service s: redis-server --daemonize no with
 * --maxmemory redis.maxmemory --maxmemory-policy noeviction; postgres -D
 * (the postmaster itself, as the postgres user when root); gpud serve;
 * agentd; gpud-http --config (as the service user when root). c is
 * self-contained (no pointers into e). Returns 0 or a
 * negative code with a message. */
int ctl_service_command(const struct ctl_env *e, enum ctl_service s, struct ctl_command *c,
			char *err, size_t errlen);

/* live false: whether managed service s, running as pid, is ready:
 * Redis answers PING; PostgreSQL accepts connections, and the swarm
 * database and the vector extension exist (created when missing); gpud
 * answers `stats`; agentd's supervisor wrote agentd.status.json under
 * pid; gpud-http answers GET /health with 200 (gpud reachable through it).
 * live true: whether it still answers at all (the supervisor's hang
 * check): any Redis reply, PostgreSQL accepting or refusing a connection
 * (starting up, in recovery, full), gpud answering `stats`, gpud-http
 * answering any HTTP status (503 while gpud is away is an answer); agentd
 * always (its own supervisor watches its workers). Returns 0 or a negative code
 * with the reason. Every wait is bounded (2 to 5 s). Safe to call from
 * any thread (it reads e only). */
int ctl_service_ready(const struct ctl_env *e, enum ctl_service s, pid_t pid, bool live,
		      char *err, size_t errlen);

/* Before managed service s starts: a postmaster.pid whose pid a reboot
 * gave to another process is removed (with the socket's lock file), since
 * PostgreSQL would take it for a live postmaster and refuse to start; a
 * dead pid is left to PostgreSQL. Returns 1 when it removed something, 0
 * when there was nothing to do, -EBUSY (a postmaster already runs on the
 * cluster) or another negative code with a message. */
int ctl_service_clear_stale(const struct ctl_env *e, enum ctl_service s, char *err,
			    size_t errlen);

/* <state>/logs/NAME.log into out. */
void ctl_service_log_path(const struct ctl_env *e, const char *name, char *out, size_t cap);

/* Stops s: agentd, gpud and gpud-http with SIGTERM and their deadlines,
 * Redis with SIGTERM, PostgreSQL with a fast shutdown; SIGKILL when the
 * deadline passes (*killed then true). Not running: 0. */
int ctl_service_stop(struct ctl_env *e, enum ctl_service s, bool *killed, char *err,
		    size_t errlen);

/* Whether s answers (Redis PING, PostgreSQL connect, gpud `stats`,
 * gpud-http GET /health 200; agentd: its pid is alive). Returns 0 or a negative code with the cause. */
int ctl_service_ping(const struct ctl_env *e, enum ctl_service s, char *err, size_t errlen);

/* Creates the state directory tree (run, logs, ...). */
int ctl_state_prepare(struct ctl_env *e, char *err, size_t errlen);

/* Takes the state directory's lock (flock on swarmctl.lock), waiting up
 * to 60 s. Returns the fd (close it to unlock) or a negative code. */
int ctl_state_lock(struct ctl_env *e, char *err, size_t errlen);

#endif
