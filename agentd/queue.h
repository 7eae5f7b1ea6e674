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
 * entry to "swarm:dead" with agent_queue_dead() (XADD + XDEL + XACK in
 * one MULTI/EXEC). Completion events go to "swarm:results".
 *
 * Bounded (DESIGN §6: Redis holds only work in flight): an acknowledged
 * entry is deleted from swarm:tasks in the same round trip (XDEL, then
 * XACK), so inline text of up to 8 MiB leaves Redis with its task; the
 * dead-letter transaction deletes the original too; swarm:results and
 * swarm:dead are capped (XADD ... MAXLEN ~ n). agent_queue_sweep()
 * removes acknowledged entries an older agentd left behind.
 *
 * While a long task runs, agent_queue_touch() resets the entry's idle
 * time (XCLAIM ... JUSTID, which does not count a delivery) so other
 * workers do not reclaim it: the lease is held by heartbeats.
 *
 * Errors: SW_ECLOSED when Redis cannot be reached or the connection broke
 * (the caller backs off and calls agent_queue_reconnect()); SW_EBUSY when
 * Redis refused a write for lack of memory (maxmemory with the noeviction
 * policy: "OOM command not allowed ..."; nothing was written, retry later
 * on the same connection); -EIO for any other error reply (the message
 * has Redis's text); -EINVAL, -ENOMEM.
 * Not thread-safe: one queue per thread.
 */
#ifndef AGENT_QUEUE_H
#define AGENT_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#define AGENT_QUEUE_NAME_MAX 256

struct agent_queue;

struct agent_queue_opts {
	const char *url;            /* redis://[[user][:password]@]host[:port][/db] or unix:///path */
	const char *stream;         /* NULL = PROTO_TASK_STREAM */
	const char *group;          /* NULL = PROTO_TASK_GROUP */
	const char *dead_stream;    /* NULL = PROTO_TASK_DEAD_STREAM */
	const char *results_stream; /* NULL = PROTO_TASK_RESULTS_STREAM */
	const char *consumer;       /* NULL = "<host>:<pid>" */
	uint32_t lease_ms;          /* XAUTOCLAIM min idle; 0 = 300000 */
	uint32_t block_ms;          /* XREADGROUP BLOCK; 0 = 1000 */
	uint32_t timeout_ms;        /* connect and command timeout (added to
				     * block_ms for the blocking read); 0 = 5000 */
	uint32_t results_maxlen;    /* MAXLEN ~ of results_stream; 0 = not capped
				     * (agentd passes agentd.results_maxlen) */
	uint32_t dead_maxlen;       /* MAXLEN ~ of dead_stream; 0 = not capped
				     * (agentd passes agentd.dead_maxlen) */
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
 * in the stream; an existing group is fine, even when Redis is at its
 * maxmemory limit and refuses the create). Returns 0 and *out, or
 * SW_ECLOSED (unreachable), SW_EBUSY (the group is missing and Redis has
 * no memory to make it), -EINVAL (bad URL), -EIO, -ENOMEM. *out is NULL
 * on error. */
int agent_queue_open(struct agent_queue **out, const struct agent_queue_opts *o, char *err,
		     size_t errlen);

/* Closes and frees. Accepts NULL. */
void agent_queue_close(struct agent_queue *q);

/* The consumer name in use. */
const char *agent_queue_consumer(const struct agent_queue *q);

/* Reconnects after SW_ECLOSED (and re-creates the group, which a
 * restarted Redis without persistence has lost). 0, SW_ECLOSED, or
 * SW_EBUSY as agent_queue_open. */
int agent_queue_reconnect(struct agent_queue *q, char *err, size_t errlen);

/* Claims one entry into *m (see the order above). Returns 0 with *m
 * filled (free it with agent_msg_free), SW_ENOTFOUND when nothing came
 * within block_ms, or an error (m zeroed). Entries whose data was deleted
 * from the stream are acknowledged and skipped. */
int agent_queue_claim(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen);

/* Acknowledges entry id and deletes it from the stream: XDEL then XACK,
 * pipelined (one round trip). Neither command needs memory, so this works
 * while Redis refuses writes at its maxmemory limit, and frees the
 * entry's memory. Not a MULTI/EXEC: Redis refuses every command queued in
 * a transaction once it is out of memory. If the connection breaks
 * between the two the entry is deleted but still pending: repeating the
 * call finishes it, and otherwise the next XAUTOCLAIM drops the id from
 * the pending list (Redis 7 reports it as deleted) or the owner's own
 * pending read finds it without data and acknowledges it; no task runs
 * twice. Idempotent. 0 or an error (SW_ECLOSED, -EIO). */
int agent_queue_ack(struct agent_queue *q, const char *id, char *err, size_t errlen);

/* Moves entry m to the dead-letter stream, deleting the original: MULTI,
 * XADD dead MAXLEN ~ dead_maxlen * task_id <task_id> entry <id>
 * deliveries <n> error <error> task <payload>, XDEL, XACK, EXEC, in one
 * round trip: all or nothing. task_id and error may be NULL ("" is
 * stored). SW_EBUSY when Redis is out of memory: nothing changed (the
 * entry stays pending), retry later. */
int agent_queue_dead(struct agent_queue *q, const struct agent_msg *m, const char *task_id,
		     const char *error, char *err, size_t errlen);

/* XADD results MAXLEN ~ results_maxlen * task_id <id> status <status>
 * location <location> error <error> document_id <document_id>. location
 * and error may be NULL (""); document_id 0 is "" (the task used no
 * document). SW_EBUSY when Redis is out of memory (nothing added). */
int agent_queue_result(struct agent_queue *q, const char *task_id, const char *status,
		       const char *location, int64_t document_id, const char *error, char *err,
		       size_t errlen);

/* 0 when entry id is pending for this consumer, SW_ENOTFOUND when it is
 * not (acknowledged, or another worker reclaimed it), or an error. */
int agent_queue_holds(struct agent_queue *q, const char *id, char *err, size_t errlen);

/* Removes the entries every group of the stream has read and
 * acknowledged but nobody deleted (an agentd before XDEL-on-ack, or a
 * tool that only XACKs): XTRIM MINID below the oldest entry that is
 * pending in any group or not yet delivered to one, in slices so Redis
 * is never blocked long. Entries still wanted by some group are never
 * touched. *removed (may be NULL) counts them. 0 or an error. */
int agent_queue_sweep(struct agent_queue *q, uint64_t *removed, char *err, size_t errlen);

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

/* Redis's memory limit and eviction policy (INFO memory): *maxmemory
 * (bytes, 0 = none) and the policy's name ("noeviction", "allkeys-lru",
 * ...) into policy. At maxmemory an evicting policy drops stream entries,
 * that is tasks: agentd warns unless it is noeviction. 0 or an error. */
int agent_queue_memory_policy(struct agent_queue *q, uint64_t *maxmemory, char *policy,
			      size_t cap, char *err, size_t errlen);

/* Frees what m holds and zeroes it. Accepts NULL. */
void agent_msg_free(struct agent_msg *m);

#endif
