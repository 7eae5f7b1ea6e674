/* tasks.h - swarmctl's side of the task stream: submit, results, and the
 * queue numbers status and top show.
 *
 * Tasks go to the Redis stream swarm:tasks (field "task", the JSON of
 * proto/task.h). Results are read from PostgreSQL (config/sql/): the
 * tasks table, then documents, summaries or answers by the task's
 * location.
 *
 * One task per input (proto/task.h): a summarize or answer of a FILE, URL
 * or stdin is a single task that carries its input (text inline, or the
 * URL agentd fetches); agentd ingests it and goes on in the same task.
 * Once its XADD returned, nothing depends on swarmctl: it may exit, or
 * die. Without --wait, submit returns as soon as the tasks are queued;
 * the one exception is --question alongside summarize, whose answer
 * over every document must not run before the inputs are stored: submit
 * stays until each summarize has stored its document (the task row's
 * document_id), then queues the answer. --wait waits for every task and
 * prints the results.
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

/* The JSON of one task (proto/task.h) of kind "ingest", "summarize" or
 * "answer" for input: an http, https or file URL (fetched by agentd),
 * "-" (standard input) or a file, whose text goes inline with its real
 * path as "source"; NULL for none (an answer over every document).
 * question goes with answer only; max_tokens 0 is agentd's default
 * (ignored for ingest). On success *json is a malloc'd string the caller
 * frees; on error *json is NULL and err says why: -errno (cannot open),
 * SW_ETOOLONG (over PROTO_TASK_MAX_TEXT, or a URL over
 * PROTO_TASK_MAX_URL), SW_EFORMAT (not UTF-8), -EINVAL (empty; an unknown
 * kind; no input for ingest or summarize; a question without answer or
 * an answer without one), -ENOMEM. */
int ctl_task_json(const char *id, const char *kind, const char *input, const char *question,
		  unsigned max_tokens, char **json, char *err, size_t errlen);

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
	int64_t dead;        /* dead tasks in PostgreSQL (every one); -1 unknown */
	int64_t dead_kept;   /* XLEN swarm:dead: the last agentd.dead_maxlen or so */
};

/* Reads the queue numbers from Redis at url. A stream or group that does
 * not exist yet counts as 0. dead is left -1: swarm:dead is capped, so
 * only PostgreSQL knows how many tasks died (ctl_dead_count). Returns 0
 * or a negative code with a message (SW_ECLOSED: Redis unreachable). */
int ctl_queue_stats(const char *url, struct ctl_queue_stats *q, char *err, size_t errlen);

/* The number of dead tasks (tasks.status = 'dead') in PostgreSQL at url,
 * the record of truth, into *n; 0 before agentd created its tables.
 * Returns 0 or a negative code with a message (SW_ECLOSED: unreachable);
 * *n is then -1. */
int ctl_dead_count(const char *url, int64_t *n, char *err, size_t errlen);

#endif
