/* worker.h - one agentd worker process: claim -> run -> commit -> event
 * -> XACK (and XDEL), for as long as it is told (DESIGN §6).
 *
 * The supervisor (supervisor.h) runs `agentd worker --config FILE
 * [--heartbeat-fd N]`; agent_worker_main() is that command.
 *
 * Heartbeats: when a heartbeat fd is given (--heartbeat-fd N, or the
 * environment variable SWARM_HEARTBEAT_FD, normally the write end of a
 * pipe the supervisor inherits to the worker), a thread writes one line
 * every agentd.heartbeat_ms:
 *     "hb <pid> <state> <tasks done> <entry id or ->\n"
 * state is idle, busy or drain. The beat stops while the worker's main
 * loop has made no progress for lease_ms (a hung task), so the
 * supervisor's "no heartbeat past a timeout" check sees the hang. The
 * same thread keeps the lease of the entry in hand (agent_queue_touch)
 * with a Redis connection of its own. Writes never block (O_NONBLOCK; a
 * full pipe drops the beat; SIGPIPE is ignored).
 *
 * Task outcome rules (tasks table, swarm:results, swarm:dead):
 *   completed            rows committed, then an event, then the entry is
 *                        acknowledged and deleted (XDEL + XACK);
 *   failed               a permanent error (bad JSON, unknown kind,
 *                        missing document, oversized input): the error is
 *                        stored, event, XDEL + XACK - never retried;
 *   retried              any other error: stored as the last error, the
 *                        entry stays pending and comes back after the
 *                        lease (XAUTOCLAIM), up to max_attempts deliveries;
 *   dead                 the last allowed delivery failed, or a delivery
 *                        beyond max_attempts arrives (the worker holding
 *                        it died): XADD swarm:dead + XDEL + XACK in one
 *                        transaction, event;
 *   outage               PostgreSQL, Redis or gpud away (SW_ECLOSED), gpud
 *                        full or Redis at its maxmemory limit (SW_EBUSY):
 *                        logged once, reconnect with backoff, the task in
 *                        hand is retried (once committed, only what is
 *                        left to deliver); nothing is acknowledged that
 *                        was not committed. A Redis refusing the event
 *                        for memory gets the acknowledgement first (it
 *                        frees memory) and the event when it has room.
 * Events are at least once: a redelivered finished task is acknowledged
 * and its event sent again (consumers dedupe by task_id).
 *
 * Drain: SIGTERM or SIGINT (or agent_worker_stop()) stops claiming; the
 * task in hand finishes (or, if a server stays away, is left pending for
 * another worker) and the worker exits 0.
 */
#ifndef AGENT_WORKER_H
#define AGENT_WORKER_H

#include <stdint.h>

#include "agentd/llm.h"
#include "common/config.h"
#include "proto/task.h"

#define AGENT_RECONNECT_MIN_MS 100
#define AGENT_RECONNECT_MAX_MS 5000
#define AGENT_DEFAULT_CHUNK_TOKENS 128
#define AGENT_DEFAULT_CHUNK_OVERLAP 16
#define AGENT_DEFAULT_SUMMARY_FANIN PROTO_TASK_SUMMARY_FANIN
#define AGENT_DEFAULT_BLOCK_MS 1000
#define AGENT_PRUNE_MIN_IDLE_MS 3600000 /* consumers silent this long (and
					  * 4 leases) are removed at start */

struct agent_worker_opts {
	const struct sw_config *cfg;   /* redis.url, postgres.url, gpud.socket, agentd.* */
	const char *sql_dir;           /* migrations; NULL = agent_sql_dir_default() */
	int heartbeat_fd;              /* -1 = no heartbeats */
	const char *consumer;          /* NULL = "<host>:<pid>" */
	const char *stream, *dead_stream, *results_stream; /* NULL = the swarm:* names */
	uint32_t block_ms;             /* claim wait; 0 = AGENT_DEFAULT_BLOCK_MS */
	const struct agent_llm *llm;   /* NULL = gpud at cfg->gpud.socket */
	uint32_t chunk_tokens, chunk_overlap, summary_fanin; /* 0 = defaults */
	uint32_t fetch_timeout_ms;     /* 0 = 30 s */
	bool handle_signals;           /* install SIGTERM/SIGINT drain handlers */
};

struct agent_worker_stats {
	uint64_t claimed;
	uint64_t completed;
	uint64_t failed;
	uint64_t dead;
	uint64_t retried;   /* attempts left pending for a later delivery */
	uint64_t outages;   /* outage episodes */
	uint64_t heartbeats;
};

/* Runs the loop until drained (or max_tasks_per_worker tasks are done).
 * Returns 0 after a clean drain, or a negative code when start-up fails
 * for good, with the message in err naming what failed: bad migrations
 * (-EIO), a bad URL (-EINVAL), a heartbeat fd that is not open (-EBADF),
 * a lock, the gpud client or the callback or heartbeat thread that could
 * not be made (its code, e.g. -EAGAIN); nothing is left running or held
 * then. Servers unreachable at start are waited for (with backoff) until
 * stopped. stats may be NULL. */
int agent_worker_run(const struct agent_worker_opts *o, struct agent_worker_stats *stats,
		     char *err, size_t errlen);

/* Asks a running worker to drain. Async-signal-safe. */
void agent_worker_stop(void);

/* Clears a previous stop request (tests run several workers in one
 * process). */
void agent_worker_reset(void);

/* `agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR] [-n]`:
 * loads the configuration (file, then SWARM_* overrides), sets up
 * logging, logs versions and the effective configuration, runs the
 * worker with signal handling. -n (--check) only validates the
 * configuration and prints "configuration OK". Returns the process exit
 * status: 0 drained (or configuration OK), 1 start-up failure or a bad
 * configuration, 2 usage. */
int agent_worker_main(int argc, char **argv);

#endif
