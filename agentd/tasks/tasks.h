/* tasks.h - the three task kinds (DESIGN §6).
 *
 * Each runs one parsed task against PostgreSQL (struct agent_db) and gpud
 * (struct agent_llm) and, on success, writes where the result is into
 * location ("documents/12", "summaries/12/2/0", "answers/<task id>") and
 * the document it used into c->document_id.
 *
 * One task per document: a summarize or answer that brings its document
 * (text or url, proto_task_has_document) first ingests it exactly as an
 * ingest task does (agent_ingest_document), then goes on from it.
 *
 * Idempotence: running a task twice (a redelivery) writes nothing twice.
 * Ingest keys the document by content hash and stores it with all its
 * chunks and the task row's document_id in one transaction; a rerun
 * finds the document in the task's row (so a URL is not fetched again)
 * or by its hash. summarize keys every partial summary by (document,
 * level, position) and commits each as it is made, so a rerun resumes
 * where the last one stopped; answer stores one row per task id. A crash
 * at any point of a summarize with text therefore resumes: before the
 * ingest committed nothing is stored and the rerun ingests; after it,
 * the rerun reads the document back and summarizes what is missing.
 *
 * Errors: 0 or a negative code with a message. SW_ECLOSED (PostgreSQL or
 * gpud gone) and SW_EBUSY (gpud full) mean "retry the task in hand after
 * a reconnect"; agent_error_permanent() tells the errors a retry cannot
 * cure (the task is then failed and acknowledged); everything else is
 * worth another delivery, up to max_attempts.
 */
#ifndef AGENT_TASKS_H
#define AGENT_TASKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agentd/db.h"
#include "agentd/fetch.h"
#include "agentd/llm.h"
#include "proto/task.h"

#define AGENT_LOCATION_MAX 256

struct agent_ctx {
	struct agent_db *db;
	const struct agent_llm *llm;
	struct agent_fetch_opts fetch;  /* ingest by URL */
	uint32_t chunk_tokens;          /* 0 = 128 */
	uint32_t chunk_overlap;         /* tokens; must be < chunk_tokens */
	uint32_t summary_fanin;         /* summaries per reduce step; 0 = PROTO_TASK_SUMMARY_FANIN */
	bool answer_self_chunks;        /* answer tasks without chunk_mask: "self" */
	/* Called between steps (each chunk, each partial summary) so the
	 * worker can refresh its lease and heartbeat. May be NULL. */
	void (*progress)(void *arg);
	void *progress_arg;
	/* Out: set by agent_run_task to the document the task stored or read
	 * (also on failure, once known), 0 when none (an answer over every
	 * document, or a failure before the document was known). */
	int64_t document_id;
};

int agent_run_ingest(struct agent_ctx *c, const struct proto_task *t, char *location,
		     size_t loclen, char *err, size_t errlen);
int agent_run_summarize(struct agent_ctx *c, const struct proto_task *t, char *location,
			size_t loclen, char *err, size_t errlen);
int agent_run_answer(struct agent_ctx *c, const struct proto_task *t, char *location,
		     size_t loclen, char *err, size_t errlen);

/* The document t brings (text, or url fetched with c->fetch), stored
 * unless it is already: the one recorded in the task's row by an earlier
 * delivery, else the one with the same content hash, else a new one
 * (document, chunks with their embeddings, and the task row's
 * document_id in one transaction). *doc_id is its id. Errors as the
 * ingest kind's: SW_EFORMAT (not UTF-8), -EINVAL (no text), fetch errors,
 * gpud and PostgreSQL errors. */
int agent_ingest_document(struct agent_ctx *c, const struct proto_task *t, int64_t *doc_id,
			  char *err, size_t errlen);

/* Dispatches on t->kind; c->document_id starts at 0. */
int agent_run_task(struct agent_ctx *c, const struct proto_task *t, char *location,
		   size_t loclen, char *err, size_t errlen);

/* True for errors no retry can cure: malformed or invalid input, a
 * document that does not exist, a request that can never fit, a URL
 * the fetch policy refuses (-EACCES). */
bool agent_error_permanent(int code);

/* True for errors that mean "a server is away or full": retry the task
 * in hand after a reconnect, without counting an attempt. */
bool agent_error_outage(int code);

/* The generation prompt of an answer (exposed for tests): segments
 * [system, chunk 1..k, question] and a mask in which every chunk sees
 * the system prompt and itself (self_only: itself only, so that gpud can
 * reuse its KV at any position), the question sees everything, and G
 * sees the chunks and the question but not the system prompt. The
 * arrays are the caller's (n_chunks + 2 segments, n_chunks + 3 rows, and
 * 3 * n_chunks + 8 + n_chunks indices at least). */
void agent_answer_prompt(const char *system, const char *const *chunks, const size_t *chunk_len,
			 uint32_t n_chunks, const char *question, size_t question_len,
			 bool self_only, struct proto_segment *seg, struct proto_mask_row *rows,
			 uint16_t *idx, struct proto_mask_desc *mask);

#endif
