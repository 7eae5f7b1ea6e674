/* tasks.h - swarmctl's side of the task stream: submit, results, and the
 * queue numbers status and top show.
 *
 * Tasks go to the Redis stream swarm:tasks (field "task", the JSON of
 * proto/task.h). Results are read from PostgreSQL (config/sql/): the
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

#include <stddef.h>
#include <stdint.h>

#include "swarmctl/services.h"

/* `swarmctl submit FILE|URL|- ... [--kind summarize|answer|ingest]
 * [--question Q] [--wait] [--timeout S] [--max-tokens N]`; argv[0] is
 * "submit". Returns the exit status: 0 every task submitted (and with
 * --wait completed), 1 a failure (message on stderr), 2 usage. */
int ctl_cmd_submit(struct ctl_env *e, int argc, char **argv);

/* `swarmctl results [TASK_ID] [--json] [--limit N]`: one task with its
 * result, or the latest tasks. Exit status as above; an unknown id is 1. */
int ctl_cmd_results(struct ctl_env *e, int argc, char **argv);

/* The ingest task JSON (proto/task.h) for input: an http, https or file
 * URL (fetched by agentd), "-" (standard input) or a file, whose text
 * goes inline with its real path as "source". On success *json is a
 * malloc'd string the caller frees; on error *json is NULL and err says
 * why: -errno (cannot open), SW_ETOOLONG (over PROTO_TASK_MAX_TEXT, or a
 * URL over PROTO_TASK_MAX_URL), SW_EFORMAT (not UTF-8), -EINVAL (empty),
 * -ENOMEM. */
int ctl_task_ingest_json(const char *id, const char *input, char **json, char *err,
			size_t errlen);

/* The JSON of a summarize or answer task (kind "summarize" or "answer");
 * doc_id 0, question NULL and max_tokens 0 are left out. malloc'd, NULL
 * when out of memory. */
char *ctl_task_final_json(const char *id, const char *kind, int64_t doc_id,
			 const char *question, unsigned max_tokens);

/* A new task id "<prefix>-<UTC yyyymmdd-hhmmss>-<pid>-<salt>-<i + 1>"
 * into out: [A-Za-z0-9._:-] only when prefix is, unique per host for
 * distinct (time, pid, i). */
void ctl_task_id(char *out, size_t cap, const char *prefix, size_t i);

/* How many summary rows agentd's map-reduce makes for n_chunks chunks
 * with the given fan-in (the chunks' own, then each level's groups, up
 * to the single final one); at least 1. */
long ctl_expected_summaries(long n_chunks, unsigned fanin);

struct ctl_queue_stats {
	int64_t length;      /* XLEN swarm:tasks: every entry still in the stream */
	int64_t undelivered; /* entries the group has not delivered yet (lag, or
			      * length - pending when Redis cannot tell); -1 unknown */
	int64_t pending;     /* delivered to a worker, not acknowledged */
	int64_t dead;        /* XLEN swarm:dead */
};

/* Reads the queue numbers from Redis at url. A stream or group that does
 * not exist yet counts as 0. Returns 0 or a negative code with a message
 * (SW_ECLOSED: Redis unreachable). */
int ctl_queue_stats(const char *url, struct ctl_queue_stats *q, char *err, size_t errlen);

#endif
