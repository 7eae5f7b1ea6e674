/* summarize.c - hierarchical map-reduce over a document's chunks.
 *
 * Level 0 has one summary per chunk; level L + 1 one per group of fanin
 * summaries of level L; the level with a single summary is the final
 * one. The shape depends only on the chunk count, so every run of the
 * task (first, resumed after a crash, or concurrent) addresses the same
 * (document, level, position) keys: a summary already stored is read
 * back instead of generated, and each one made is committed at once.
 * A task that brings its document (text or url) ingests it first
 * (agent_ingest_document), in the same task.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentd/tasks/tasks.h"
#include "common/err.h"
#include "common/log.h"

#define MAX_SUMMARY_INPUT (64u << 10) /* bytes of text one step may read */

static const char summarize_system[] = "Summarize the following text in a few sentences.\n";

/* One generation: [instruction][text], plain causal. */
static int summarize_text(struct agent_ctx *c, const char *text, size_t len, uint32_t max_tokens,
			  char **out, char *err, size_t errlen)
{
	struct proto_segment seg[2] = {
		{ .text = summarize_system, .len = sizeof(summarize_system) - 1 },
		{ .text = text, .len = (uint32_t)len },
	};
	struct proto_submit_req req = {
		.n_segments = 2,
		.segments = seg,
		.max_tokens = max_tokens,
	};

	if (len > MAX_SUMMARY_INPUT)
		len = seg[1].len = MAX_SUMMARY_INPUT; /* a bounded prompt; the chunker keeps them small */
	proto_sampling_default(&req.sampling);
	return c->llm->generate(c->llm->ctx, &req, out, err, errlen);
}

/* Gets summary (level, pos) from the table, or makes it from input and
 * stores it. *out malloc'd. */
static int get_or_make(struct agent_ctx *c, const struct proto_task *t, int64_t doc, int level,
		       int pos, bool is_final, const char *input, size_t len, char **out, char *err,
		       size_t errlen)
{
	int rc = agent_db_summary_get(c->db, doc, level, pos, out, err, errlen);

	if (rc != SW_ENOTFOUND)
		return rc; /* 0: made by an earlier run */
	rc = summarize_text(c, input, len, t->max_tokens, out, err, errlen);
	if (rc)
		return rc;
	rc = agent_db_summary_put(c->db, doc, level, pos, *out, is_final, t->id, err, errlen);
	if (rc) {
		free(*out);
		*out = NULL;
		return rc;
	}
	if (c->progress)
		c->progress(c->progress_arg);
	return 0;
}

static void free_all(char **v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

int agent_run_summarize(struct agent_ctx *c, const struct proto_task *t, char *location,
			size_t loclen, char *err, size_t errlen)
{
	size_t fanin = c->summary_fanin ? c->summary_fanin : PROTO_TASK_SUMMARY_FANIN;
	PGresult *chunks = NULL;
	char **cur = NULL, **next = NULL;
	size_t n, nn = 0;
	int64_t doc = t->document_id;
	int level = 0, rc;

	if (fanin < 2)
		return sw_seterr(err, errlen, -EINVAL, "summarize: fan-in must be at least 2");
	if (proto_task_has_document(t)) {
		rc = agent_ingest_document(c, t, &doc, err, errlen);
		if (rc)
			return rc;
	}
	rc = agent_db_chunks(c->db, doc, &chunks, err, errlen);
	if (rc)
		return rc;
	c->document_id = doc;
	n = (size_t)PQntuples(chunks);
	if (n == 0) {
		PQclear(chunks);
		return sw_seterr(err, errlen, SW_ENOTFOUND,
				 "summarize: document %" PRId64 " has no chunks", doc);
	}
	cur = calloc(n, sizeof(*cur));
	if (!cur) {
		rc = sw_seterr(err, errlen, -ENOMEM, "summarize: out of memory");
		goto out;
	}
	/* Map: one summary per chunk. */
	for (size_t i = 0; i < n; i++) {
		const char *text = PQgetvalue(chunks, (int)i, 2);

		rc = get_or_make(c, t, doc, 0, (int)i, n == 1, text, strlen(text), &cur[i], err,
				 errlen);
		if (rc)
			goto out;
	}
	/* Reduce: groups of fanin until one remains. */
	while (n > 1) {
		nn = (n + fanin - 1) / fanin;
		next = calloc(nn, sizeof(*next));
		if (!next) {
			rc = sw_seterr(err, errlen, -ENOMEM, "summarize: out of memory");
			goto out;
		}
		level++;
		for (size_t j = 0; j < nn; j++) {
			size_t from = j * fanin, to = from + fanin < n ? from + fanin : n, len = 0;
			char *joined;

			for (size_t i = from; i < to; i++)
				len += strlen(cur[i]) + 1;
			joined = malloc(len + 1);
			if (!joined) {
				rc = sw_seterr(err, errlen, -ENOMEM, "summarize: out of memory");
				goto out;
			}
			len = 0;
			for (size_t i = from; i < to; i++) {
				size_t l = strlen(cur[i]);

				memcpy(joined + len, cur[i], l);
				joined[len + l] = '\n';
				len += l + 1;
			}
			joined[len] = '\0';
			rc = get_or_make(c, t, doc, level, (int)j, nn == 1, joined, len, &next[j],
					 err, errlen);
			free(joined);
			if (rc)
				goto out;
		}
		free_all(cur, n);
		cur = next;
		next = NULL;
		n = nn;
	}
	snprintf(location, loclen, "summaries/%" PRId64 "/%d/0", doc, level);
	log_info("task %s: document %" PRId64 " summarized (%d levels)", t->id, doc, level + 1);
out:
	free_all(next, nn);
	free_all(cur, n);
	PQclear(chunks);
	return rc;
}
