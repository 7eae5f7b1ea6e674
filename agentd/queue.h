/* queue.h - the task stream as one worker sees it (Redis Streams,
 * hiredis; DESIGN §6).
 *
 * Tasks are entries of the stream "swarm:tasks" with a field "task"
 * holding the JSON; the names and the format are proto/task.h's. Workers
 * form the consumer group "agents"; each is the consumer "<host>:<pid>".
 * agent_queue_claim() hands out one entry at a time, in this order of
 * preference:
 *   1. the consumer's own pending entries (delivered to an earlier
 *      process of the same name and never acknowledged), once, at start;
 *   2. entries of any consumer idle longer than lease_ms (XAUTOCLAIM):
 *      a dead worker's tasks, and this worker's own failed attempts;
 *   3. new entries (XREADGROUP ... BLOCK block_ms ... >).
 * Each claimed entry carries its delivery count (XPENDING). The caller
 * runs the task, commits in PostgreSQL, and only then calls
 * agent_queue_ack(). After max_attempts deliveries, the caller sends the
 * entry to "swarm:dead" with agent_queue_dead() (XADD + XACK in one
 * MULTI/EXEC). Completion events go to "swarm:results".
 *
 * While a long task runs, agent_queue_touch() resets the entry's idle
 * time (XCLAIM ... JUSTID, which does not count a delivery) so other
 * workers do not reclaim it: the lease is held by heartbeats.
 *
 * Errors: SW_ECLOSED when Redis cannot be reached or the connection broke
 * (the caller backs off and calls agent_queue_reconnect()); -EIO for an
 * error reply (the message has Redis's text); -EINVAL, -ENOMEM.
 * Not thread-safe: one queue per thread.
 */
#ifndef AGENT_QUEUE_H
#define AGENT_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#define AGENT_QUEUE_NAME_MAX 256

struct agent_queue;

struct agent_queue_opts {
	const char *url;            /* redis://[:password@]host[:port][/db] or unix:///path */
	const char *stream;         /* NULL = PROTO_TASK_STREAM */
	const char *group;          /* NULL = PROTO_TASK_GROUP */
	const char *dead_stream;    /* NULL = PROTO_TASK_DEAD_STREAM */
	const char *results_stream; /* NULL = PROTO_TASK_RESULTS_STREAM */
	const char *consumer;       /* NULL = "<host>:<pid>" */
	uint32_t lease_ms;          /* XAUTOCLAIM min idle; 0 = 300000 */
	uint32_t block_ms;          /* XREADGROUP BLOCK; 0 = 1000 */
	uint32_t timeout_ms;        /* connect and command timeout (added to
				     * block_ms for the blocking read); 0 = 5000 */
};

enum agent_msg_source {
	AGENT_MSG_OWN_PENDING = 0,
	AGENT_MSG_RECLAIMED = 1,
	AGENT_MSG_NEW = 2,
};

/* One claimed entry. */
struct agent_msg {
	char id[64];                  /* stream entry id */
	char *payload;                /* malloc'd, NUL-terminated "task" field;
				       * NULL when the entry has none */
	size_t len;
	uint32_t deliveries;          /* this one included */
	enum agent_msg_source source;
};

/* Connects, checks the server answers, and creates the group
 * (XGROUP CREATE ... 0 MKSTREAM: a new group delivers the entries already
 * in the stream; an existing group is fine). Returns 0 and
 * *out, or SW_ECLOSED (unreachable), -EINVAL (bad URL), -EIO, -ENOMEM.
 * *out is NULL on error. */
int agent_queue_open(struct agent_queue **out, const struct agent_queue_opts *o, char *err,
		     size_t errlen);

/* Closes and frees. Accepts NULL. */
void agent_queue_close(struct agent_queue *q);

/* The consumer name in use. */
const char *agent_queue_consumer(const struct agent_queue *q);

/* Reconnects after SW_ECLOSED (and re-creates the group, which a
 * restarted Redis without persistence has lost). 0 or SW_ECLOSED. */
int agent_queue_reconnect(struct agent_queue *q, char *err, size_t errlen);

/* Claims one entry into *m (see the order above). Returns 0 with *m
 * filled (free it with agent_msg_free), SW_ENOTFOUND when nothing came
 * within block_ms, or an error (m zeroed). Entries whose data was deleted
 * from the stream are acknowledged and skipped. */
int agent_queue_claim(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen);

/* XACK of entry id. 0 or an error. */
int agent_queue_ack(struct agent_queue *q, const char *id, char *err, size_t errlen);

/* Moves entry m to the dead-letter stream: XADD dead * task_id <task_id>
 * entry <id> deliveries <n> error <error> task <payload>, then XACK, in
 * one transaction. task_id and error may be NULL ("" is stored). */
int agent_queue_dead(struct agent_queue *q, const struct agent_msg *m, const char *task_id,
		     const char *error, char *err, size_t errlen);

/* XADD results * task_id <id> status <status> location <location>
 * error <error> document_id <document_id>. location and error may be
 * NULL (""); document_id 0 is "" (the task used no document). */
int agent_queue_result(struct agent_queue *q, const char *task_id, const char *status,
		       const char *location, int64_t document_id, const char *error, char *err,
		       size_t errlen);

/* Resets the idle time of entry id held by this consumer (lease refresh).
 * Returns 0, or SW_ENOTFOUND when the entry is no longer ours (another
 * worker reclaimed it). */
int agent_queue_touch(struct agent_queue *q, const char *id, char *err, size_t errlen);

/* Deletes consumers of the group (other than this one) that hold no
 * pending entry and have not been seen for min_idle_ms: every restarted
 * worker is a new "<host>:<pid>", and without this the group would
 * collect them forever. A consumer that comes back is re-created by its
 * next read. Redis forgets the pending entries of a deleted consumer, so
 * min_idle_ms must be far above the claim period of a live worker (the
 * worker uses max(4 * lease_ms, 1 h)). *removed (may be NULL) counts
 * them. Returns 0 or an error. */
int agent_queue_prune(struct agent_queue *q, uint32_t min_idle_ms, unsigned *removed, char *err,
		      size_t errlen);

/* Frees what m holds and zeroes it. Accepts NULL. */
void agent_msg_free(struct agent_msg *m);

#endif
