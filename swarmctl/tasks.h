/* tasks.h - swarmctl's side of the task stream: submit, results, and the
 * queue numbers status and top show (issue 6).
 *
 * Tasks go to the Redis stream swarm:tasks (field "task", the JSON of
 * agentd/task.h). Results are read from PostgreSQL (config/sql/): the
 * tasks table, then documents, summaries or answers by the task's
 * location.
 *
 * summarize or answer of a FILE, URL or stdin is two tasks: an ingest
 * "<id>:ingest" and, once it completed (its location "documents/N" names
 * the document), the summarize or answer "<id>" on document N. So submit
 * waits for the ingests even without --wait; --wait also waits for the
 * final tasks and prints their results.
 */
#ifndef SWARMCTL_TASKS_H
#define SWARMCTL_TASKS_H

#include <stdint.h>

#include "swarmctl/services.h"

/* `swarmctl submit FILE|URL|- ... [--kind summarize|answer|ingest]
 * [--question Q] [--wait] [--timeout S] [--max-tokens N]`; argv[0] is
 * "submit". Returns the exit status: 0 every task submitted (and with
 * --wait completed), 1 a failure (message on stderr), 2 usage. */
int sc_cmd_submit(struct sc_env *e, int argc, char **argv);

/* `swarmctl results [TASK_ID] [--json] [--limit N]`: one task with its
 * result, or the latest tasks. Exit status as above; an unknown id is 1. */
int sc_cmd_results(struct sc_env *e, int argc, char **argv);

struct sc_queue_stats {
	int64_t length;      /* XLEN swarm:tasks: every entry still in the stream */
	int64_t undelivered; /* entries the group has not delivered yet (lag); -1 unknown */
	int64_t pending;     /* delivered to a worker, not acknowledged */
	int64_t dead;        /* XLEN swarm:dead */
};

/* Reads the queue numbers from Redis at url. A stream or group that does
 * not exist yet counts as 0. Returns 0 or a negative code with a message
 * (SW_ECLOSED: Redis unreachable). */
int sc_queue_stats(const char *url, struct sc_queue_stats *q, char *err, size_t errlen);

#endif
