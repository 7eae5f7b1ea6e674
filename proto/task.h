/* task.h - the task format on swarm:tasks: the second wire protocol of
 * the swarm, between whoever submits work (swarmctl, any Redis client)
 * and the agentd workers. It lives here, not in agentd, because both
 * ends include it (DESIGN §6, §7).
 *
 * Streams (Redis Streams):
 *   swarm:tasks    entries with one field "task" holding the JSON below;
 *                  the workers read it as the consumer group "agents"
 *                  and delete an entry when they acknowledge it: the
 *                  stream holds work in flight only, never outcomes.
 *   swarm:results  one entry per finished task:
 *                  task_id <id> status completed|failed|dead
 *                  location <where the result is> error <message or "">
 *                  document_id <the document the task stored or read, or
 *                  "" when none: an answer over every document, or a task
 *                  that failed before it had one>.
 *                  Capped (agentd.results_maxlen): an outcome missed or
 *                  trimmed is in PostgreSQL (tasks.status, the record).
 *   swarm:dead     entries that used up their deliveries, moved here
 *                  from swarm:tasks:
 *                  task_id <id> entry <stream id> deliveries <n>
 *                  error <last error> task <the JSON as submitted>.
 *                  Capped (agentd.dead_maxlen).
 *
 * The task JSON:
 *   {"id": "doc-42", "kind": "ingest", "text": "..."}            inline text
 *   {"id": "doc-43", "kind": "ingest", "url": "https://..."}     fetched
 *   {"id": "sum-42", "kind": "summarize", "document_id": 7}      stored before
 *   {"id": "sum-43", "kind": "summarize", "text": "..."}         ingest + summarize
 *   {"id": "sum-44", "kind": "summarize", "url": "https://..."}
 *   {"id": "ask-1", "kind": "answer", "question": "...",
 *    "top_k": 4, "document_id": 7, "max_tokens": 128}
 *   {"id": "ask-2", "kind": "answer", "question": "...", "text": "..."}
 *   {"id": "ask-3", "kind": "answer", "question": "...", "chunk_mask": "self"}
 *
 * One task per document: summarize takes exactly one of document_id,
 * text and url; answer at most one (none: retrieve from every document).
 * With text or url the worker first ingests the document exactly as an
 * ingest task would (content-hashed: a text stored before, by any task,
 * is not stored again) and then summarizes or answers from it, all in
 * the one task; a redelivery reuses the document the first delivery
 * stored. No client has to chain an ingest and a summarize.
 *
 * answer's "chunk_mask" says what each retrieved chunk sees besides itself:
 * "system" (the system prompt) or "self" (nothing: a chunk's KV is then
 * the same wherever it sits, and gpud's chunk-KV cache reuses it across
 * questions that retrieve it in any order); absent, the worker's
 * agentd.answer_chunk_mask.
 *
 * Every kind also takes "callback_url" (http or https); a kind given text
 * or url takes "source" (a label stored with the document; default the
 * URL or "inline"). Unknown keys are errors. The id is 1..128 bytes of
 * [A-Za-z0-9._:-]; it keys every row the task writes.
 *
 * Errors name the field and what was expected, e.g.
 *   task.kind: unknown kind "sumarize" (expected ingest, summarize, answer)
 *   task.question: required for kind answer
 *   task.top_k: expected an integer, got string
 *   task.text: 9000000 bytes exceeds the limit of 8388608
 *   task: kind summarize needs exactly one of document_id, text and url
 *     (document_id and text given)
 *   task.source: only with text or url
 */
#ifndef PROTO_TASK_H
#define PROTO_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_TASK_STREAM "swarm:tasks"
#define PROTO_TASK_GROUP "agents"            /* the workers' consumer group */
#define PROTO_TASK_FIELD "task"              /* the entry field with the JSON */
#define PROTO_TASK_RESULTS_STREAM "swarm:results"
#define PROTO_TASK_DEAD_STREAM "swarm:dead"

#define PROTO_TASK_MAX_BYTES (16u << 20)   /* the whole JSON payload */
#define PROTO_TASK_MAX_TEXT (8u << 20)     /* inline text, and a fetched URL's body */
#define PROTO_TASK_MAX_QUESTION 4096       /* bytes */
#define PROTO_TASK_MAX_URL 2048            /* bytes, url and callback_url */
#define PROTO_TASK_MAX_ID 128
#define PROTO_TASK_MAX_TOP_K 32            /* segments: system + k + question */
#define PROTO_TASK_DEFAULT_TOP_K 4
#define PROTO_TASK_MAX_TOKENS 4096
#define PROTO_TASK_DEFAULT_MAX_TOKENS 128
/* summarize reduces groups of this many partial summaries per level
 * (the workers' default): a document of n chunks makes
 * n + ceil(n/4) + ... + 1 summary rows, from which clients show progress. */
#define PROTO_TASK_SUMMARY_FANIN 4

enum proto_task_kind {
	PROTO_TASK_INGEST = 0,
	PROTO_TASK_SUMMARIZE = 1,
	PROTO_TASK_ANSWER = 2,
};

/* What an answer's chunk segments see besides themselves ("chunk_mask"). */
enum proto_task_chunk_mask {
	PROTO_TASK_CHUNKS_DEFAULT = 0, /* absent: the worker's configured default */
	PROTO_TASK_CHUNKS_SYSTEM = 1,  /* "system": the system prompt */
	PROTO_TASK_CHUNKS_SELF = 2,    /* "self": nothing, so gpud can reuse a
					* chunk's KV at any position */
};

/* A parsed task. The strings point into the parsed JSON, which the
 * struct owns: they live until proto_task_free. */
struct proto_task {
	void *root;                 /* json_t *, owned */
	const char *id;             /* NULL when the JSON had no valid id */
	enum proto_task_kind kind;
	const char *callback_url;   /* NULL when absent */
	/* The document: ingest has exactly one of text and url; summarize
	 * exactly one of text, url and document_id; answer at most one. */
	const char *text;           /* NULL when absent */
	size_t text_len;
	const char *url;            /* NULL when absent */
	const char *source;         /* label stored with the document; NULL
				     * unless text or url is given */
	int64_t document_id;        /* 0 when absent (answer: every document) */
	/* answer */
	const char *question;
	size_t question_len;
	uint32_t top_k;
	enum proto_task_chunk_mask chunk_mask; /* DEFAULT when absent */
	uint32_t max_tokens;        /* summarize and answer */
};

/* "ingest", "summarize", "answer"; "unknown" otherwise. */
const char *proto_task_kind_name(enum proto_task_kind k);

/* True when the task brings its document (text or url): the worker
 * ingests it before it summarizes or answers. Always true for ingest. */
static inline bool proto_task_has_document(const struct proto_task *t)
{
	return t->text || t->url;
}

/* Parses and validates len bytes of task JSON into *t. Returns 0, or
 *   SW_ETOOLONG  the payload or a field exceeds its limit;
 *   SW_EFORMAT   not JSON ("task: invalid JSON at line L, column C: ...")
 *                or not an object;
 *   SW_ETYPE     a field of the wrong type;
 *   -EINVAL      a missing field, an unknown key or kind, a bad value;
 *   -ENOMEM.
 * with the message in err. Call proto_task_free on *t in every case: on
 * error t->id still holds the task's id when that much was valid (so the
 * failure can be stored under it), else NULL. */
int proto_task_parse(const char *json, size_t len, struct proto_task *t, char *err,
		     size_t errlen);

/* Releases what *t holds and zeroes it. Accepts NULL and a zeroed task. */
void proto_task_free(struct proto_task *t);

#endif
