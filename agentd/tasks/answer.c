/* answer.c - retrieve the top-k chunks, generate with a block mask. A
 * task that brings its document (text or url) ingests it first and
 * retrieves from it alone. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentd/tasks/tasks.h"
#include "common/err.h"
#include "common/log.h"

static const char answer_system[] =
	"Answer the question using only the context passages below.\n";

/* The question segment carries its own framing so G can do without the
 * system prompt. */
#define QUESTION_PREFIX "Question: "
#define QUESTION_SUFFIX "\nAnswer:"

void agent_answer_prompt(const char *system, const char *const *chunks, const size_t *chunk_len,
			 uint32_t n_chunks, const char *question, size_t question_len,
			 bool self_only, struct proto_segment *seg, struct proto_mask_row *rows,
			 uint16_t *idx, struct proto_mask_desc *mask)
{
	uint32_t S = n_chunks + 2, q = n_chunks + 1, k = 0;

	seg[0] = (struct proto_segment){ .text = system, .len = (uint32_t)strlen(system) };
	for (uint32_t i = 0; i < n_chunks; i++)
		seg[1 + i] = (struct proto_segment){ .text = chunks[i], .len = (uint32_t)chunk_len[i] };
	seg[q] = (struct proto_segment){ .text = question, .len = (uint32_t)question_len };

	/* s0: itself. */
	rows[0] = (struct proto_mask_row){ .idx = idx + k, .n = 1 };
	idx[k++] = 0;
	/* Each chunk: the system prompt (unless self_only) and itself, never
	 * another chunk. */
	for (uint32_t i = 1; i <= n_chunks; i++) {
		rows[i] = (struct proto_mask_row){ .idx = idx + k, .n = self_only ? 1 : 2 };
		if (!self_only)
			idx[k++] = 0;
		idx[k++] = (uint16_t)i;
	}
	/* The question: everything before it. */
	rows[q] = (struct proto_mask_row){ .idx = idx + k, .n = q + 1 };
	for (uint32_t i = 0; i <= q; i++)
		idx[k++] = (uint16_t)i;
	/* G: the chunks, the question and itself; not the system prompt. */
	rows[S] = (struct proto_mask_row){ .idx = idx + k, .n = q + 1 };
	for (uint32_t i = 1; i <= q; i++)
		idx[k++] = (uint16_t)i;
	idx[k++] = (uint16_t)S;
	*mask = (struct proto_mask_desc){ .n_segments = S, .rows = rows };
}

int agent_run_answer(struct agent_ctx *c, const struct proto_task *t, char *location,
		     size_t loclen, char *err, size_t errlen)
{
	enum { K = PROTO_TASK_MAX_TOP_K };
	struct proto_segment seg[K + 2];
	struct proto_mask_row rows[K + 3];
	uint16_t idx[5 * K + 16];
	struct proto_mask_desc mask;
	const char *chunk_text[K];
	size_t chunk_len[K];
	int64_t chunk_ids[K];
	struct proto_submit_req req = { 0 };
	PGresult *top = NULL;
	char *qtext = NULL, *answer = NULL;
	float *qvec = NULL;
	uint32_t dim = 0, n;
	int64_t doc = t->document_id;
	size_t qlen;
	int rc;

	if (proto_task_has_document(t)) {
		rc = agent_ingest_document(c, t, &doc, err, errlen);
		if (rc)
			return rc;
		c->document_id = doc;
	}
	rc = c->llm->embed(c->llm->ctx, t->question, t->question_len, &qvec, &dim, err, errlen);
	if (rc)
		return rc;
	rc = agent_db_topk(c->db, qvec, dim, (int)t->top_k, doc, &top, err, errlen);
	if (rc == SW_ENOTFOUND)
		sw_seterr(err, errlen, rc, "answer: no document has been ingested yet");
	if (rc)
		goto out;
	n = (uint32_t)PQntuples(top);
	if (n == 0) {
		rc = sw_seterr(err, errlen, SW_ENOTFOUND, "answer: no chunk to retrieve%s",
			       doc ? " in that document" : "");
		goto out;
	}
	c->document_id = doc;
	for (uint32_t i = 0; i < n; i++) {
		chunk_ids[i] = strtoll(PQgetvalue(top, (int)i, 0), NULL, 10);
		chunk_text[i] = PQgetvalue(top, (int)i, 2);
		chunk_len[i] = (size_t)PQgetlength(top, (int)i, 2);
	}
	qlen = sizeof(QUESTION_PREFIX) - 1 + t->question_len + sizeof(QUESTION_SUFFIX) - 1;
	qtext = malloc(qlen + 1);
	if (!qtext) {
		rc = sw_seterr(err, errlen, -ENOMEM, "answer: out of memory");
		goto out;
	}
	snprintf(qtext, qlen + 1, "%s%s%s", QUESTION_PREFIX, t->question, QUESTION_SUFFIX);

	agent_answer_prompt(answer_system, chunk_text, chunk_len, n, qtext, qlen,
			    t->chunk_mask == PROTO_TASK_CHUNKS_SELF ||
				    (t->chunk_mask == PROTO_TASK_CHUNKS_DEFAULT && c->answer_self_chunks),
			    seg, rows, idx, &mask);
	req.n_segments = mask.n_segments;
	req.segments = seg;
	req.mask = &mask;
	req.max_tokens = t->max_tokens;
	proto_sampling_default(&req.sampling);
	rc = c->llm->generate(c->llm->ctx, &req, &answer, err, errlen);
	if (rc)
		goto out;
	rc = agent_db_answer_put(c->db, t->id, t->question, answer, chunk_ids, (int)n, err, errlen);
	if (rc)
		goto out;
	snprintf(location, loclen, "answers/%s", t->id);
	log_info("task %s: answered from %u chunks", t->id, n);
out:
	free(answer);
	free(qtext);
	free(qvec);
	PQclear(top);
	return rc;
}
