/* db.h - agentd's PostgreSQL side: one connection, migrations, and the
 * handful of statements the task kinds need (DESIGN §6).
 *
 * Every statement is parameterized (PQexecParams); no value is ever
 * pasted into SQL text. Every write is an upsert or an insert that
 * ignores a conflict, keyed by task id or by a natural key (content hash,
 * (document, level, position)), so a redelivered task never duplicates a
 * row.
 *
 * Errors: 0 or a negative code with a message in err:
 *   SW_ECLOSED  the server went away or cannot be reached (the message
 *               starts "postgres: "); the caller backs off, calls
 *               agent_db_reconnect() and retries the task in hand. An
 *               open transaction is lost with the connection.
 *   -EIO        the server refused a statement ("postgres: SQLSTATE
 *               23505: ..."); in a transaction, roll it back.
 *   SW_ENOTFOUND, -EINVAL, -ENOMEM as documented per function.
 *
 * Embedding column: chunks.embedding does not exist until the first
 * ingest calls agent_db_embedding_prepare() with the width gpud reports:
 * vector(dim) up to 2000 (the HNSW limit of vector), halfvec(dim) up to
 * 4000, refused above. The choice is stored in embedding_space; a later
 * call with another width is an error (SW_EUNSUPPORTED) - a new model
 * needs a re-ingest, not a silent mix of spaces.
 *
 * Not thread-safe: one struct agent_db per thread.
 */
#ifndef AGENT_DB_H
#define AGENT_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

struct agent_db;

/* Largest embedding the schema accepts (halfvec's HNSW limit). */
#define AGENT_DB_MAX_DIM 4000
/* Widths above this use halfvec instead of vector. */
#define AGENT_DB_VECTOR_MAX_DIM 2000

/* Connects to url (a postgres:// URL or key=value conninfo) with a 5 s
 * connect timeout. Returns 0 and *out, or SW_ECLOSED (server unreachable;
 * the message has the reason, password redacted) or -ENOMEM. *out is
 * NULL on error. */
int agent_db_open(struct agent_db **out, const char *url, char *err, size_t errlen);

/* Closes the connection and frees db. Accepts NULL. */
void agent_db_close(struct agent_db *db);

/* True when the connection is up as far as libpq knows. */
bool agent_db_ok(const struct agent_db *db);

/* Re-establishes a broken connection (a no-op when it is up). Returns 0
 * or SW_ECLOSED. Cached facts (the embedding width) are kept. */
int agent_db_reconnect(struct agent_db *db, char *err, size_t errlen);

/* Applies the migrations in dir: files named "<number>_<name>.sql", in
 * numeric order, each in its own transaction under a transaction-level
 * advisory lock and recorded in schema_migrations(version, name,
 * applied_at), so two processes starting at once apply each file exactly
 * once. A file must not contain BEGIN/COMMIT. *applied (may be NULL) is
 * the number this call applied. Returns 0, -ENOENT (no such dir), -EINVAL
 * (two files with one number, or no migration at all), -EIO (a file
 * failed: "001_init.sql: postgres: ..."; that file's transaction is
 * rolled back, earlier files stay applied), SW_ECLOSED. */
int agent_db_migrate(struct agent_db *db, const char *dir, int *applied, char *err,
		     size_t errlen);

/* Runs one parameterized statement (text parameters, NULL = SQL NULL).
 * On success returns 0 and, when res is not NULL, the result in *res
 * (the caller PQclear()s it). On error *res is NULL. */
int agent_db_exec(struct agent_db *db, const char *sql, int n_params, const char *const *params,
		  PGresult **res, char *err, size_t errlen);

/* BEGIN / COMMIT / ROLLBACK. Rollback never fails visibly (a broken
 * connection has no transaction left to roll back). */
int agent_db_begin(struct agent_db *db, char *err, size_t errlen);
int agent_db_commit(struct agent_db *db, char *err, size_t errlen);
void agent_db_rollback(struct agent_db *db);

/* --- tasks ------------------------------------------------------------------ */

enum agent_task_status {
	AGENT_TASK_RUNNING = 0,
	AGENT_TASK_COMPLETED = 1,
	AGENT_TASK_FAILED = 2, /* permanent error; acknowledged */
	AGENT_TASK_DEAD = 3,   /* max_attempts reached; in swarm:dead */
};

/* "running", "completed", "failed", "dead". */
const char *agent_task_status_name(enum agent_task_status s);

/* Records a delivery of task id (kind may be NULL; entry_id is the stream
 * entry): inserts the row as running with attempts 1, or increments
 * attempts. A task already completed, failed or dead keeps its status
 * (a redelivery of finished work); *prev gets the status it had (RUNNING
 * for a new row), *attempts the count after this delivery. Either may be
 * NULL. */
int agent_db_task_start(struct agent_db *db, const char *id, const char *kind,
			const char *entry_id, enum agent_task_status *prev, int *attempts,
			char *err, size_t errlen);

/* Sets the final status (or RUNNING with an error: a failed attempt that
 * will be retried), the error (NULL keeps the stored one) and the
 * location (NULL keeps it). finished_at is set unless status is RUNNING.
 * SW_ENOTFOUND when no row has that id. */
int agent_db_task_finish(struct agent_db *db, const char *id, enum agent_task_status status,
			 const char *error, const char *location, char *err, size_t errlen);

/* Marks the task completed with its location and the document it used
 * (doc_id 0 keeps what the row has: the one its ingest recorded, or
 * NULL). SW_ENOTFOUND when no row has that id. */
int agent_db_task_complete(struct agent_db *db, const char *id, const char *location,
			   int64_t doc_id, char *err, size_t errlen);

/* The document recorded for task id (agent_db_task_set_document) in
 * *doc_id; SW_ENOTFOUND (*doc_id 0) when the task has no row or no
 * document yet. A redelivered task that brings its document finds here
 * the one its first delivery stored. */
int agent_db_task_document(struct agent_db *db, const char *id, int64_t *doc_id, char *err,
			   size_t errlen);

/* Records doc_id as the document of task id. Call it inside the
 * transaction that stores the document, so both commit or neither. A
 * task without a row (a task run outside a worker) records nothing and
 * that is not an error. */
int agent_db_task_set_document(struct agent_db *db, const char *id, int64_t doc_id, char *err,
			       size_t errlen);

/* Reads a task's status; error and location are copied (truncated,
 * NUL-terminated; "" when NULL in the table) when their buffers are not
 * NULL. SW_ENOTFOUND when absent. */
int agent_db_task_get(struct agent_db *db, const char *id, enum agent_task_status *status,
		      int *attempts, char *error, size_t error_len, char *location,
		      size_t location_len, char *err, size_t errlen);

/* --- documents and chunks --------------------------------------------------- */

/* The id of the document whose text has the sha256 of text (len bytes),
 * in *doc_id; SW_ENOTFOUND when none. */
int agent_db_doc_find(struct agent_db *db, const char *text, size_t len, int64_t *doc_id,
		      char *err, size_t errlen);

/* Inserts a document (call inside a transaction together with its
 * chunks). When a document with the same content hash exists (another
 * worker got there first) nothing is inserted, *doc_id is that one's id
 * and *created false. */
int agent_db_doc_insert(struct agent_db *db, const char *task_id, const char *source,
			const char *text, size_t len, int n_chunks, int64_t *doc_id,
			bool *created, char *err, size_t errlen);

/* Makes sure chunks.embedding exists with width dim (see the header
 * comment). Idempotent and safe between processes (advisory lock).
 * Returns 0, -EINVAL (dim 0), SW_EUNSUPPORTED (dim above
 * AGENT_DB_MAX_DIM, or the table already has another width: the message
 * names both), or a database error. */
int agent_db_embedding_prepare(struct agent_db *db, uint32_t dim, char *err, size_t errlen);

/* The width prepared (0 before agent_db_embedding_prepare or a lookup
 * found none). Reads embedding_space once and caches the answer. */
int agent_db_embedding_dim(struct agent_db *db, uint32_t *dim, char *err, size_t errlen);

/* Inserts chunk `position` of a document; emb (dim floats) may be NULL
 * (no embedding). An existing (document, position) row is left alone.
 * -EINVAL when dim differs from the prepared width. */
int agent_db_chunk_insert(struct agent_db *db, int64_t doc_id, int position, const char *text,
			  int n_tokens, const float *emb, uint32_t dim, char *err, size_t errlen);

/* The chunks of a document in position order: *res has columns
 * (id bigint, position int, text). SW_ENOTFOUND when the document does
 * not exist. */
int agent_db_chunks(struct agent_db *db, int64_t doc_id, PGresult **res, char *err,
		    size_t errlen);

/* The k chunks nearest to q (cosine distance), optionally only of
 * doc_id (> 0): *res has columns (id bigint, document_id bigint, text,
 * distance float8), nearest first. -EINVAL when dim differs from the
 * prepared width (SW_ENOTFOUND when nothing was ever embedded). */
int agent_db_topk(struct agent_db *db, const float *q, uint32_t dim, int k, int64_t doc_id,
		  PGresult **res, char *err, size_t errlen);

/* --- summaries and answers --------------------------------------------------- */

/* The text of summary (doc, level, position) into a malloc'd *text the
 * caller frees; SW_ENOTFOUND when not made yet. */
int agent_db_summary_get(struct agent_db *db, int64_t doc_id, int level, int position,
			 char **text, char *err, size_t errlen);

/* Stores a summary unless one exists at that key (the first one made
 * wins; a concurrent duplicate is dropped). Commits on its own when no
 * transaction is open: that is the per-partial checkpoint. */
int agent_db_summary_put(struct agent_db *db, int64_t doc_id, int level, int position,
			 const char *text, bool is_final, const char *task_id, char *err,
			 size_t errlen);

/* Stores the answer of task_id, replacing nothing: a second put for the
 * same task keeps the first. */
int agent_db_answer_put(struct agent_db *db, const char *task_id, const char *question,
			const char *text, const int64_t *chunk_ids, int n_chunks, char *err,
			size_t errlen);

/* pgvector's text form of v (dim floats), "[x,y,...]", malloc'd; NULL
 * when out of memory. */
char *agent_db_vector_text(const float *v, uint32_t dim);

#endif
