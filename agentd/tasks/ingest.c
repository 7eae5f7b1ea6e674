/* ingest.c - text or URL -> token-aware chunks -> embeddings -> rows:
 * the ingest kind, and the first step of a summarize or answer that
 * brings its document (agent_ingest_document). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentd/chunk.h"
#include "agentd/tasks/tasks.h"
#include "common/err.h"
#include "common/log.h"
#include "common/utf8.h"

#define DEFAULT_CHUNK_TOKENS 128

/* Position of the first byte that breaks UTF-8 or is a NUL, or len when
 * neither (a document is text: PostgreSQL refuses NUL in text). */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
	size_t bad = sw_utf8_invalid_at(s, len);
	const unsigned char *nul = memchr(s, 0, bad);

	return nul ? (size_t)(nul - s) : bad;
}

struct counter {
	const struct agent_llm *llm;
	char *err;
	size_t errlen;
};

static int count_cb(void *arg, const char *text, size_t len, uint32_t *n)
{
	struct counter *c = arg;

	return c->llm->count_tokens(c->llm->ctx, text, len, n, c->err, c->errlen);
}

static void progress(struct agent_ctx *c)
{
	if (c->progress)
		c->progress(c->progress_arg);
}

/* Embeds every chunk; all must have one width. */
static int embed_all(struct agent_ctx *c, const char *text, const struct agent_chunk *ch,
		     size_t n, float **vecs, uint32_t *dim, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t d = 0;
		int rc = c->llm->embed(c->llm->ctx, text + ch[i].off, ch[i].len, &vecs[i], &d, err,
				       errlen);

		if (rc)
			return rc;
		if (i == 0)
			*dim = d;
		else if (d != *dim)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "ingest: gpud returned embeddings of widths %u and %u", *dim,
					 d);
		progress(c);
	}
	return 0;
}

/* Stores text (len bytes) as the document of task t, in one transaction
 * with its chunks and the task row's document_id, unless the same text
 * is stored already (then only the row is updated). */
static int store(struct agent_ctx *c, const struct proto_task *t, const char *text, size_t len,
		 int64_t *doc_id, char *err, size_t errlen)
{
	struct counter cnt = { c->llm, err, errlen };
	struct agent_chunk *ch = NULL;
	float **vecs = NULL;
	size_t n = 0, bad;
	uint32_t dim = 0, max = c->chunk_tokens ? c->chunk_tokens : DEFAULT_CHUNK_TOKENS;
	bool created;
	int rc;

	bad = utf8_invalid_at((const unsigned char *)text, len);
	if (bad < len)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "ingest: the document is not UTF-8 text (byte %zu of %zu)", bad, len);

	/* The same text stored before (by any task): nothing to store. */
	rc = agent_db_doc_find(c->db, text, len, doc_id, err, errlen);
	if (rc == 0) {
		log_info("task %s: document already stored as %" PRId64, t->id, *doc_id);
		return agent_db_task_set_document(c->db, t->id, *doc_id, err, errlen);
	}
	if (rc != SW_ENOTFOUND)
		return rc;

	rc = agent_chunk_text(text, len, max, c->chunk_overlap, count_cb, &cnt, &ch, &n, err, errlen);
	if (rc)
		goto out;
	if (n == 0) {
		rc = sw_seterr(err, errlen, -EINVAL, "ingest: the document has no text");
		goto out;
	}
	vecs = calloc(n, sizeof(*vecs));
	if (!vecs) {
		rc = sw_seterr(err, errlen, -ENOMEM, "ingest: out of memory");
		goto out;
	}
	rc = embed_all(c, text, ch, n, vecs, &dim, err, errlen);
	if (rc)
		goto out;
	rc = agent_db_embedding_prepare(c->db, dim, err, errlen);
	if (rc)
		goto out;

	rc = agent_db_begin(c->db, err, errlen);
	if (rc)
		goto out;
	rc = agent_db_doc_insert(c->db, t->id, t->source, text, len, (int)n, doc_id, &created, err,
				 errlen);
	if (rc)
		goto out_rollback;
	if (!created) { /* another worker stored the same text meanwhile */
		agent_db_rollback(c->db);
		rc = agent_db_task_set_document(c->db, t->id, *doc_id, err, errlen);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		char *piece = strndup(text + ch[i].off, ch[i].len);

		if (!piece) {
			rc = sw_seterr(err, errlen, -ENOMEM, "ingest: out of memory");
			goto out_rollback;
		}
		rc = agent_db_chunk_insert(c->db, *doc_id, (int)i, piece, (int)ch[i].n_tokens, vecs[i],
					   dim, err, errlen);
		free(piece);
		if (rc)
			goto out_rollback;
	}
	rc = agent_db_task_set_document(c->db, t->id, *doc_id, err, errlen);
	if (rc)
		goto out_rollback;
	rc = agent_db_commit(c->db, err, errlen);
	if (rc)
		goto out;
	log_info("task %s: document %" PRId64 " stored, %zu chunks, embedding width %u", t->id,
		 *doc_id, n, dim);
	goto out;
out_rollback:
	agent_db_rollback(c->db);
out:
	if (vecs)
		for (size_t i = 0; i < n; i++)
			free(vecs[i]);
	free(vecs);
	free(ch);
	return rc;
}

int agent_ingest_document(struct agent_ctx *c, const struct proto_task *t, int64_t *doc_id,
			  char *err, size_t errlen)
{
	char *fetched = NULL;
	size_t len = t->text_len;
	int rc;

	/* A redelivery: the document an earlier delivery stored, even when
	 * the URL would now return something else. */
	rc = agent_db_task_document(c->db, t->id, doc_id, err, errlen);
	if (rc == 0) {
		log_info("task %s: document %" PRId64 " stored by an earlier delivery", t->id,
			 *doc_id);
		return 0;
	}
	if (rc != SW_ENOTFOUND)
		return rc;
	if (t->url) {
		struct agent_fetch_opts fo = c->fetch;

		if (!fo.max_bytes)
			fo.max_bytes = PROTO_TASK_MAX_TEXT;
		rc = agent_fetch(t->url, &fo, &fetched, &len, err, errlen);
		if (rc)
			return rc;
	}
	rc = store(c, t, fetched ? fetched : t->text, len, doc_id, err, errlen);
	free(fetched);
	return rc;
}

int agent_run_ingest(struct agent_ctx *c, const struct proto_task *t, char *location,
		     size_t loclen, char *err, size_t errlen)
{
	int64_t doc_id;
	int rc = agent_ingest_document(c, t, &doc_id, err, errlen);

	if (rc)
		return rc;
	c->document_id = doc_id;
	snprintf(location, loclen, "documents/%" PRId64, doc_id);
	return 0;
}
