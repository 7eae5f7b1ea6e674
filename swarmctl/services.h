/* services.h - the processes swarmctl starts, stops and inspects.
 *
 * Two modes:
 *  - managed (no configuration file): everything lives in the state
 *    directory ($SWARM_STATE_DIR, default ~/.local/state/swarm, or
 *    /var/lib/swarm for root): a redis-server (AOF on, Unix socket only),
 *    a PostgreSQL cluster (initdb on first start, Unix socket only,
 *    database "swarm" with pgvector), gpud on a built-in random-weight
 *    model that `gpud mkmodel` generates on first start (or $SWARM_MODEL),
 *    and agentd. swarmctl writes the configuration they read to
 *    <state>/swarm.json.
 *  - external (--config FILE or $SWARM_CONFIG): Redis and PostgreSQL are
 *    the ones the file names (swarmctl only checks they answer); gpud and
 *    agentd get the file itself; state_dir comes from the file (or
 *    $SWARM_STATE_DIR).
 *
 * State directory layout:
 *   run/     pid files (redis.pid, gpud.pid, agentd.pid), gpud.sock, redis.sock
 *   logs/    redis.log, postgres.log, gpud.log, agentd.log, model.log
 *   redis/   Redis data (appendonly)
 *   pg/      PostgreSQL: data/ and its socket (owned by postgres when root)
 *   models/  builtin.gguf
 *   swarm.json, swarmctl.lock, agentd.status.json (written by agentd's
 *   supervisor: its workers, read by status and top)
 */
#ifndef SWARMCTL_SERVICES_H
#define SWARMCTL_SERVICES_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
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
	CTL_N_SERVICES = 4,
};

struct ctl_env {
	bool managed;
	char state_dir[PATH_MAX];
	char config_path[PATH_MAX];  /* the file gpud and agentd read */
	char user_config[PATH_MAX];  /* "" in managed mode */
	struct sw_config cfg;        /* effective */
	char gpud_bin[PATH_MAX];
	char agentd_bin[PATH_MAX];
	char pg_bindir[PATH_MAX];
	const char *pg_os_user;      /* "postgres" when we are root, else NULL */
	bool builtin_model;          /* managed mode without $SWARM_MODEL */
};

/* Resolves the mode, the state directory, the configuration (loaded and
 * validated; in managed mode built from defaults + environment), and the
 * binaries (next to swarmctl's own executable in a build tree or an
 * install, or $SWARM_GPUD_BIN / $SWARM_AGENTD_BIN). Creates nothing.
 * Returns 0 or a negative code with a message. */
int ctl_env_init(struct ctl_env *e, const char *config_path, char *err, size_t errlen);

const char *ctl_service_name(enum ctl_service s);

/* A path inside the state directory ("run/gpud.pid") into out. */
void ctl_path(const struct ctl_env *e, const char *rel, char *out, size_t cap);

/* True when swarmctl starts and stops s in this mode (Redis and
 * PostgreSQL only when managed). */
bool ctl_service_managed(const struct ctl_env *e, enum ctl_service s);

/* The live pid of a managed service, 0 when not running. */
pid_t ctl_service_pid(const struct ctl_env *e, enum ctl_service s);

/* Starts s (managed services and gpud/agentd) and waits until it answers:
 * Redis PING, PostgreSQL accepting connections with the swarm database and
 * the vector extension, gpud answering `stats`, agentd alive after its
 * start-up. Already running: 0 and nothing done. On failure the message
 * gives the cause and the last lines of the service's log (err of
 * CTL_START_ERR_MAX bytes holds it whole); whatever was spawned for s is
 * stopped again. */
int ctl_service_start(struct ctl_env *e, enum ctl_service s, char *err, size_t errlen);

/* Stops s: agentd and gpud with SIGTERM and their drain deadlines,
 * Redis with SIGTERM, PostgreSQL with a fast shutdown; SIGKILL when the
 * deadline passes (*killed then true). Not running: 0. */
int ctl_service_stop(struct ctl_env *e, enum ctl_service s, bool *killed, char *err,
		    size_t errlen);

/* For external services: whether it answers (Redis PING, PostgreSQL
 * connect). Returns 0 or a negative code with the cause. */
int ctl_service_ping(const struct ctl_env *e, enum ctl_service s, char *err, size_t errlen);

/* Creates the state directory tree (run, logs, ...). */
int ctl_state_prepare(struct ctl_env *e, char *err, size_t errlen);

/* Takes the state directory's lock (flock on swarmctl.lock), waiting up
 * to 60 s. Returns the fd (close it to unlock) or a negative code. */
int ctl_state_lock(struct ctl_env *e, char *err, size_t errlen);

#endif
