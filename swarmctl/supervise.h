/* supervise.h - the managed-mode supervisor (DESIGN §6: nothing runs
 * unsupervised).
 *
 * `swarmctl start` without a configuration file leaves one small process,
 * `swarmctl supervise`, running detached (own session, output in
 * <state>/logs/supervisor.log, pid in run/supervisor.pid). It owns Redis,
 * PostgreSQL, gpud, agentd and gpud-http (while http.listen is set) as its
 * children on the shared supervision loop (common/supervise.h): started
 * in that order, each once the one
 * before answers (services.h ctl_service_ready); restarted when it exits
 * or is killed, after supervisor.restart_backoff_min_ms doubling up to
 * _max_ms; marked failed after more than supervisor.crash_limit deaths
 * within supervisor.crash_window_ms, its last log lines kept in the
 * status, the others running on. Their logs are bounded
 * (supervisor.log_max_bytes, log_keep rotated copies).
 *
 * Signals: SIGTERM or SIGINT stops the supervisor and leaves the services
 * running (`swarmctl stop` then stops them in its order: gpud-http, agentd
 * drains, gpud, Redis, PostgreSQL); SIGHUP starts the failed services again
 * (`swarmctl start` sends it). SIGUSR1 is not passed on (no
 * usr1_reopens): every service writes to its O_APPEND stdout, which
 * copy-and-truncate bounds without a reopen, none opens a log file by
 * name in managed mode, and Redis dies of SIGUSR1 (PostgreSQL's
 * postmaster uses it between its own processes).
 *
 * A supervisor that starts while services run (the last one died) adopts
 * them: it watches each through a pidfd and restarts it as its own child
 * once it exits.
 *
 * Status: <state>/supervisor.status.json, rewritten on every change:
 *   {"pid": N, "state": "running"|"stopped", "started_at": ms since the
 *    epoch, "services": [{"name", "pid", "state": "waiting"|"starting"|
 *    "running"|"backoff"|"failed"|"stopped", "adopted", "spawns",
 *    "restarts", "crashes", "recycles", "hangs", "started_at",
 *    "exited_at", "last_exit", "error", "log", "last_lines"}]}
 * in service order (redis, postgres, gpud, agentd, gpud-http); last_lines is the end
 * of the service's log at its last death ("" before one).
 */
#ifndef SWARMCTL_SUPERVISE_H
#define SWARMCTL_SUPERVISE_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "swarmctl/services.h"

#define CTL_SUP_STATUS_FILE "supervisor.status.json"
#define CTL_SUP_STOP_MS 10000 /* SIGTERM to SIGKILL; it only closes handles */

/* `swarmctl supervise`: runs the supervisor in the foreground until
 * SIGTERM/SIGINT. Managed mode only. Refuses to run beside another live
 * supervisor of the same state directory. Returns the exit status: 0
 * stopped, 1 failure (message on stderr / its log). */
int ctl_cmd_supervise(struct ctl_env *e);

/* The live supervisor's pid, 0 when none runs (a stale pid file is
 * removed). */
pid_t ctl_supervisor_pid(const struct ctl_env *e);

/* Starts `<this executable> supervise` detached, its output appended to
 * logs/supervisor.log. Returns its pid, or a negative code with a
 * message. */
pid_t ctl_supervisor_spawn(const struct ctl_env *e, char *err, size_t errlen);

/* Stops the supervisor (SIGTERM, SIGKILL after CTL_SUP_STOP_MS) and
 * waits for it; the services keep running. Not running: 0. *killed says
 * whether SIGKILL was needed. Returns 0 or a negative code. */
int ctl_supervisor_stop(const struct ctl_env *e, bool *killed);

/* The supervisor's status file, parsed, or NULL when it is missing or
 * unreadable. It may be a dead supervisor's: compare its "pid" with
 * ctl_supervisor_pid. The caller json_decref()s it. */
json_t *ctl_supervisor_status(const struct ctl_env *e);

/* The entry of service s in a status object (borrowed), or NULL. */
json_t *ctl_supervisor_service(const json_t *status, enum ctl_service s);

#endif
