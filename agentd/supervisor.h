/* supervisor.h - `agentd --config FILE`: keeps agentd.workers worker
 * processes alive (DESIGN §6), on the shared supervision loop
 * (common/supervise.h); the rules below are that loop's, with agentd's
 * settings.
 *
 * Each worker is the same binary run as
 *     <exe> worker --config FILE --heartbeat-fd 3 [--sql-dir DIR]
 * with uv_spawn; fd 3 is the write side of a socketpair whose read side
 * the supervisor's libuv loop reads ("hb <pid> <state> <done> <entry>").
 * Workers also get SWARM_SUPERVISOR_PID in their environment; `agentd
 * worker` then asks for SIGTERM (a drain) when the supervisor dies.
 *
 * Rules:
 *   crash         a non-zero exit or a signal; restarted after a backoff
 *                 that starts at restart_backoff_min_ms and doubles up to
 *                 restart_backoff_max_ms; it goes back to the minimum once
 *                 a worker has run crash_window_ms without crashing;
 *   failed        more than crash_limit crashes within crash_window_ms:
 *                 logged as an error with the last exit status, not
 *                 restarted; the others keep running. When every worker
 *                 has failed the supervisor exits 1;
 *   recycled      exit 0 (max_tasks_per_worker reached): restarted at once
 *                 (after restart_backoff_min_ms when it ran less than
 *                 AGENT_SUP_QUICK_EXIT_MS, so it cannot spin), not a crash;
 *   hung          no heartbeat for hang_ms (3 x heartbeat_ms) after the
 *                 first one: SIGKILL, then a crash like any other. Before
 *                 its first beat a worker is waiting for its servers
 *                 (agentd/README.md), which a restart would not help, so
 *                 silence then is not a hang;
 *   drain         SIGTERM or SIGINT: SIGTERM to every worker, no more
 *                 restarts; workers still there after drain_ms get
 *                 SIGKILL (drain_ms: lease_ms clamped to 5..30 s; their
 *                 entries stay pending and are reclaimed
 *                 after the lease: nothing is lost). A second SIGTERM or
 *                 SIGINT kills them at once. Exit 0 once all are gone;
 *   log reopening SIGUSR1 (logrotate): the supervisor reopens log.file and
 *                 sends SIGUSR1 to every worker that has beaten; one that
 *                 has not yet gets it with its first heartbeat (before,
 *                 its handler may not be installed).
 *
 * Status: <state_dir>/agentd.status.json is rewritten (write + rename) on
 * every change (spawn, exit, restart, failed, first beat, drain) and, when
 * a beat changed a worker's done count or activity, at most once per
 * check tick (min(hang_ms / 4, 1 s)):
 *   {"pid": N, "state": "running"|"draining"|"stopped"|"failed",
 *    "workers": [{"slot": i, "pid": N (0 = none), "state": "starting"|
 *      "running"|"backoff"|"failed"|"stopped", "spawns": n, "crashes": n,
 *      "recycles": n, "hangs": n, "done": n (its last beat's count),
 *      "activity": "idle"|"busy"|"drain"|"" (its last beat's),
 *      "last_exit": "exit 1" | "signal 9" | ""}]}
 */
#ifndef AGENT_SUPERVISOR_H
#define AGENT_SUPERVISOR_H

#include <stdint.h>

#include "common/config.h"

#define AGENT_SUP_DRAIN_MIN_MS 5000  /* drain deadline: lease_ms clamped to */
#define AGENT_SUP_DRAIN_MAX_MS 30000 /* [MIN, MAX] (swarmctl waits 60 s) */
#define AGENT_SUP_HANG_BEATS 3       /* silent this many heartbeat periods = hung */
#define AGENT_SUP_STATUS_FILE "agentd.status.json"
#define AGENT_SUP_QUICK_EXIT_MS 1000 /* an exit 0 sooner waits restart_backoff_min_ms */

struct agent_sup_opts {
	const struct sw_config *cfg;  /* agentd.*, state_dir; borrowed for the run */
	const char *config_path;      /* passed to the workers as --config */
	const char *exe;              /* NULL = this binary (readlink of /proc/self/exe) */
	const char *sql_dir;          /* passed as --sql-dir; NULL = worker default */
	const char *status_path;      /* NULL = <state_dir>/agentd.status.json;
				       * "" = no status file */
	uint32_t drain_ms;            /* 0 = lease_ms within [DRAIN_MIN, DRAIN_MAX] */
	uint32_t hang_ms;             /* 0 = AGENT_SUP_HANG_BEATS * heartbeat_ms */
};

/* Runs the supervisor until drained (SIGTERM/SIGINT) or until every
 * worker has failed. Installs its own SIGTERM/SIGINT handling (libuv)
 * for the duration. Returns 0 after a drain, -EIO when every worker
 * failed, or a negative code when the loop could not be set up (message
 * in err in both error cases). Worker processes are never left behind
 * by a return: the ones still running at that point are SIGKILLed and
 * reaped. */
int agent_sup_run(const struct agent_sup_opts *o, char *err, size_t errlen);

/* `agentd --config FILE [--sql-dir DIR] [-n]`: loads the configuration
 * (file, then SWARM_* overrides), sets up logging, logs the version and
 * the effective configuration, runs the supervisor. -n only validates the
 * configuration. Returns the exit status: 0 drained, 1 a bad
 * configuration or every worker failed, 2 usage. */
int agent_supervisor_main(int argc, char **argv);

#endif
