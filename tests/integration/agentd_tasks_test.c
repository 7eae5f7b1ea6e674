/* agentd_tasks_test.c - the task kinds against a real PostgreSQL with a
 * fake gpud (struct agent_llm): ingest stores a document once however
 * often it runs, summarize builds the map-reduce tree and resumes after a
 * failure without redoing what was committed, answer retrieves by
 * embedding and sends the block mask, and errors come out precise. One
 * task per document: a summarize or answer with its text (or a URL)
 * ingests and summarizes in one run, the same text is one document
 * however many tasks bring it, and a rerun after a failure on either side
 * of the ingest's commit resumes with the document the first run stored
 * (even when the URL now returns something else).
 *
 * The fake tokenizer counts words; the fake embedding is a bag of words
 * hashed into 16 buckets and normalized, so retrieval by shared words
 * works; the fake generator records the request and can fail on cue.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "agentd/db.h"
#include "agentd/tasks/tasks.h"
#include "common/err.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

#define DIM 16

struct fake {
	int generate_calls;
	int embed_calls;
	int fail_after;       /* generate fails with fail_code after this many; -1 never */
	int fail_code;
	int embed_fail;       /* embed returns this when non-zero */
	/* the last request */
	uint32_t n_segments;
	bool had_mask;
	bool chunk_sees_chunk; /* some chunk row listed another chunk */
	bool chunk_sees_system; /* some chunk row listed the system prompt */
	bool g_sees_system;
	bool q_sees_all;
	char last_segment[256];
};

static struct fake fk;

static int fake_count(void *ctx, const char *s, size_t len, uint32_t *n, char *err, size_t el)
{
	bool in = false;

	*n = 0;
	for (size_t i = 0; i < len; i++) {
		bool sp = s[i] == ' ' || s[i] == '\n';

		if (!sp && !in)
			(*n)++;
		in = !sp;
	}
	return 0;
}

static uint32_t word_hash(const char *w, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++)
		if (w[i] != '.' && w[i] != '?')
			h = (h ^ (unsigned char)w[i]) * 16777619u;
	return h;
}

static int fake_embed(void *ctx, const char *s, size_t len, float **vec, uint32_t *dim,
		      char *err, size_t el)
{
	float *v;
	double norm = 0;
	size_t i = 0;

	if (fk.embed_fail)
		return sw_seterr(err, el, fk.embed_fail, "fake gpud: embed failed");
	fk.embed_calls++;
	v = calloc(DIM, sizeof(*v));
	while (i < len) {
		size_t j = i;

		while (j < len && s[j] != ' ' && s[j] != '\n')
			j++;
		if (j > i)
			v[word_hash(s + i, j - i) % DIM] += 1;
		i = j + 1;
	}
	for (int k = 0; k < DIM; k++)
		norm += (double)v[k] * v[k];
	for (int k = 0; k < DIM && norm > 0; k++)
		v[k] /= (float)sqrt(norm);
	if (norm == 0)
		v[0] = 1;
	*vec = v;
	*dim = DIM;
	return 0;
}

static bool row_has(const struct proto_mask_row *r, unsigned seg)
{
	for (uint32_t i = 0; i < r->n; i++)
		if (r->idx[i] == seg)
			return true;
	return false;
}

static int fake_generate(void *ctx, const struct proto_submit_req *req, char **text, char *err,
			 size_t el)
{
	const struct proto_segment *last = &req->segments[req->n_segments - 1];
	char buf[64];

	if (fk.fail_after >= 0 && fk.generate_calls >= fk.fail_after)
		return sw_seterr(err, el, fk.fail_code, "fake gpud: generate failed");
	fk.generate_calls++;
	fk.n_segments = req->n_segments;
	fk.had_mask = req->mask && req->mask->rows;
	snprintf(fk.last_segment, sizeof(fk.last_segment), "%.*s", (int)last->len, last->text);
	if (fk.had_mask) {
		uint32_t S = req->mask->n_segments;

		fk.chunk_sees_chunk = false;
		fk.chunk_sees_system = false;
		for (uint32_t i = 1; i + 1 < S; i++)
			fk.chunk_sees_system |= row_has(&req->mask->rows[i], 0);
		for (uint32_t i = 1; i + 1 < S; i++)
			for (uint32_t j = 1; j + 1 < S; j++)
				if (j != i && row_has(&req->mask->rows[i], j))
					fk.chunk_sees_chunk = true;
		fk.g_sees_system = row_has(&req->mask->rows[S], 0);
		fk.q_sees_all = req->mask->rows[S - 1].n == S;
	}
	snprintf(buf, sizeof(buf), "summary %d of %u bytes", fk.generate_calls, last->len);
	*text = strdup(buf);
	return 0;
}

static const struct agent_llm fake_llm = {
	.count_tokens = fake_count,
	.embed = fake_embed,
	.generate = fake_generate,
};

struct fx {
	char name[64];
	struct agent_db *db;
	struct agent_ctx ctx;
};

static int counter;
static char err[SW_ERR_MAX];
/* Not this test's subject (agentd_fetch_test and agentd_worker_test
 * cover it): files anywhere, the test's 127.0.0.1. */
static struct agent_fetch_policy open_policy;

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char url[1024];

	snprintf(f->name, sizeof(f->name), "agentd_tasks_%d_%d", (int)getpid(), counter++);
	at_db_create(f->name, url, sizeof(url));
	if (agent_db_open(&f->db, url, err, sizeof(err)) != 0 ||
	    agent_db_migrate(f->db, "config/sql", NULL, err, sizeof(err)) != 0) {
		fprintf(stderr, "setup: %s\n", err);
		return -1;
	}
	f->ctx = (struct agent_ctx){
		.db = f->db,
		.llm = &fake_llm,
		.chunk_tokens = 8,
		.chunk_overlap = 2,
		.summary_fanin = 4,
		.fetch = { .policy = &open_policy },
	};
	snprintf(open_policy.file_dirs[0], sizeof(open_policy.file_dirs[0]), "/");
	open_policy.n_file_dirs = 1;
	if (sw_cidr_parse("127.0.0.1/32", &open_policy.allow[0], err, sizeof(err)) != 0)
		return -1;
	open_policy.n_allow = 1;
	memset(&fk, 0, sizeof(fk));
	fk.fail_after = -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	agent_db_close(f->db);
	at_db_drop(f->name);
	free(f);
	return 0;
}

static long long scalar(struct fx *f, const char *sql)
{
	PGresult *r;
	long long v;

	if (agent_db_exec(f->db, sql, 0, NULL, &r, err, sizeof(err)) != 0)
		fail_msg("%s: %s", sql, err);
	v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return v;
}

/* Parses json into t (the test owns both). */
static void parse(const char *json, struct proto_task *t)
{
	if (proto_task_parse(json, strlen(json), t, err, sizeof(err)) != 0)
		fail_msg("%s: %s", json, err);
}

/* 40 sentences of 3 words: "sN alpha beta." with a topic word. */
static char *make_doc(const char *topic_a, const char *topic_b, int n)
{
	size_t cap = (size_t)n * 64, off = 0;
	char *s = malloc(cap);

	if (!s)
		abort();
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(s + off, cap - off, "s%d %s %s. ", i,
					i < n / 2 ? topic_a : topic_b, i % 2 ? "x" : "y");
	return s;
}

static char *ingest_json(const char *id, const char *text)
{
	size_t cap = strlen(text) + 128;
	char *s = malloc(cap);

	if (!s || !text)
		abort();
	snprintf(s, cap, "{\"id\":\"%s\",\"kind\":\"ingest\",\"text\":\"%s\"}", id, text);
	return s;
}

static void test_ingest_once(void **state)
{
	struct fx *f = *state;
	char *doc = make_doc("apple", "river", 20), *j1 = ingest_json("in-1", doc);
	char *j2 = ingest_json("in-2", doc), loc[AGENT_LOCATION_MAX], loc2[AGENT_LOCATION_MAX];
	struct proto_task t;
	long long chunks;

	parse(j1, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_int_equal(strncmp(loc, "documents/", 10), 0);
	chunks = scalar(f, "SELECT count(*) FROM chunks WHERE embedding IS NOT NULL");
	/* 20 sentences of 3 tokens, 8 per chunk with 2... overlap in whole
	 * sentences: each chunk holds 2 sentences and repeats none (3 > 2). */
	assert_int_equal(chunks, 10);
	assert_int_equal(scalar(f, "SELECT n_chunks FROM documents"), 10);
	assert_int_equal(scalar(f, "SELECT dim FROM embedding_space"), DIM);
	/* The same task again, and another task with the same text. */
	assert_int_equal(agent_run_task(&f->ctx, &t, loc2, sizeof(loc2), err, sizeof(err)), 0);
	assert_string_equal(loc2, loc);
	proto_task_free(&t);
	parse(j2, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc2, sizeof(loc2), err, sizeof(err)), 0);
	assert_string_equal(loc2, loc);
	proto_task_free(&t);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 1);
	assert_int_equal(scalar(f, "SELECT count(*) FROM chunks"), chunks);
	free(doc);
	free(j1);
	free(j2);
}

static void test_ingest_errors(void **state)
{
	struct fx *f = *state;
	char loc[AGENT_LOCATION_MAX], path[] = "/tmp/agentd_bin_XXXXXX", json[256];
	struct proto_task t;
	int fd;

	parse("{\"id\":\"blank\",\"kind\":\"ingest\",\"text\":\"  \\n \"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "ingest: the document has no text");
	assert_true(agent_error_permanent(-EINVAL));
	proto_task_free(&t);

	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "ok \xff\xfe binary", 12), 12);
	close(fd);
	snprintf(json, sizeof(json), "{\"id\":\"bin\",\"kind\":\"ingest\",\"url\":\"file://%s\"}", path);
	parse(json, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), SW_EFORMAT);
	assert_string_equal(err, "ingest: the document is not UTF-8 text (byte 3 of 12)");
	proto_task_free(&t);
	unlink(path);

	parse(json, &t); /* now the file is gone */
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_non_null(strstr(err, "cannot read file"));
	proto_task_free(&t);

	parse("{\"id\":\"down\",\"kind\":\"ingest\",\"url\":\"http://127.0.0.1:1/doc\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 -ECONNREFUSED);
	assert_false(agent_error_permanent(-ECONNREFUSED));
	proto_task_free(&t);

	fk.embed_fail = SW_ECLOSED;
	parse("{\"id\":\"gone\",\"kind\":\"ingest\",\"text\":\"a b c.\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), SW_ECLOSED);
	assert_true(agent_error_outage(SW_ECLOSED));
	proto_task_free(&t);
	/* a failed GPU: an attempt that failed (retried after the lease, up
	 * to max_attempts), neither an outage nor the task's own fault */
	fk.embed_fail = SW_EDEVICE;
	parse("{\"id\":\"gpu\",\"kind\":\"ingest\",\"text\":\"a b c.\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), SW_EDEVICE);
	assert_false(agent_error_outage(SW_EDEVICE));
	assert_false(agent_error_permanent(SW_EDEVICE));
	proto_task_free(&t);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 0);
}

static void ingest_doc(struct fx *f, const char *id, const char *text, int64_t *doc)
{
	char *j = ingest_json(id, text), loc[AGENT_LOCATION_MAX];
	struct proto_task t;

	parse(j, &t);
	if (agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)) != 0)
		fail_msg("ingest: %s", err);
	proto_task_free(&t);
	free(j);
	*doc = strtoll(loc + 10, NULL, 10);
}

static void test_summarize_tree_and_resume(void **state)
{
	struct fx *f = *state;
	char *doc = make_doc("apple", "river", 20), json[128], loc[AGENT_LOCATION_MAX];
	struct proto_task t;
	int64_t id;

	ingest_doc(f, "in", doc, &id);
	snprintf(json, sizeof(json), "{\"id\":\"sum-1\",\"kind\":\"summarize\",\"document_id\":%lld}",
		 (long long)id);
	parse(json, &t);

	/* 10 chunks, fan-in 4: 10 + 3 + 1 = 14 generations. Fail after 6. */
	fk.fail_after = 6;
	fk.fail_code = SW_ECLOSED;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), SW_ECLOSED);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries"), 6); /* each one committed */

	/* The rerun makes only the 8 missing ones. */
	fk.fail_after = -1;
	fk.generate_calls = 0;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_int_equal(fk.generate_calls, 8);
	snprintf(json, sizeof(json), "summaries/%lld/2/0", (long long)id);
	assert_string_equal(loc, json);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE level = 0"), 10);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE level = 1"), 3);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	assert_int_equal(scalar(f, "SELECT level FROM summaries WHERE is_final"), 2);
	assert_false(fk.had_mask);

	/* Once more: nothing to generate, same location, still one final. */
	fk.generate_calls = 0;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_int_equal(fk.generate_calls, 0);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries"), 14);
	proto_task_free(&t);

	parse("{\"id\":\"sum-2\",\"kind\":\"summarize\",\"document_id\":999999}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_string_equal(err, "document 999999: no such document");
	proto_task_free(&t);
	free(doc);
}

static void test_summarize_single_chunk(void **state)
{
	struct fx *f = *state;
	char json[128], loc[AGENT_LOCATION_MAX];
	struct proto_task t;
	int64_t id;

	ingest_doc(f, "one", "just one short chunk.", &id);
	snprintf(json, sizeof(json), "{\"id\":\"s1\",\"kind\":\"summarize\",\"document_id\":%lld}",
		 (long long)id);
	parse(json, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_int_equal(fk.generate_calls, 1);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE is_final AND level = 0"), 1);
	proto_task_free(&t);
}

static void test_answer(void **state)
{
	struct fx *f = *state;
	char *doc = make_doc("apple", "river", 20), loc[AGENT_LOCATION_MAX];
	struct proto_task t;
	PGresult *r;
	int64_t id;

	parse("{\"id\":\"early\",\"kind\":\"answer\",\"question\":\"anything?\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_string_equal(err, "answer: no document has been ingested yet");
	proto_task_free(&t);

	ingest_doc(f, "in", doc, &id);
	parse("{\"id\":\"ask-1\",\"kind\":\"answer\",\"question\":\"where is the river?\",\"top_k\":3}",
	      &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_string_equal(loc, "answers/ask-1");
	/* system + 3 chunks + question, with the block mask. */
	assert_int_equal(fk.n_segments, 5);
	assert_true(fk.had_mask);
	assert_false(fk.chunk_sees_chunk);
	assert_true(fk.chunk_sees_system); /* chunk_mask "system": the default */
	assert_false(fk.g_sees_system);
	assert_true(fk.q_sees_all);
	assert_string_equal(fk.last_segment, "Question: where is the river?\nAnswer:");
	assert_int_equal(agent_db_exec(f->db,
				       "SELECT array_length(chunk_ids, 1), text FROM answers"
				       " WHERE task_id = 'ask-1'",
				       0, NULL, &r, err, sizeof(err)),
			 0);
	assert_int_equal(PQntuples(r), 1);
	assert_string_equal(PQgetvalue(r, 0, 0), "3");
	PQclear(r);
	/* The retrieved chunks are the "river" half of the document. */
	assert_int_equal(scalar(f,
				"SELECT count(*) FROM answers a, unnest(a.chunk_ids) c(id), chunks ch"
				" WHERE ch.id = c.id AND ch.text LIKE '%river%'"),
			 3);
	/* Redelivered: still one answer. */
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_int_equal(scalar(f, "SELECT count(*) FROM answers"), 1);
	proto_task_free(&t);

	/* chunk_mask "self": the chunks see only themselves, the rest alike;
	 * the worker's default (agentd.answer_chunk_mask) for a task that does
	 * not say, and the task's word over the default */
	parse("{\"id\":\"ask-s\",\"kind\":\"answer\",\"question\":\"river?\","
	      "\"chunk_mask\":\"self\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_false(fk.chunk_sees_system);
	assert_false(fk.chunk_sees_chunk);
	assert_false(fk.g_sees_system);
	assert_true(fk.q_sees_all);
	proto_task_free(&t);
	f->ctx.answer_self_chunks = true;
	parse("{\"id\":\"ask-d\",\"kind\":\"answer\",\"question\":\"river?\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_false(fk.chunk_sees_system);
	proto_task_free(&t);
	parse("{\"id\":\"ask-y\",\"kind\":\"answer\",\"question\":\"river?\","
	      "\"chunk_mask\":\"system\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_true(fk.chunk_sees_system);
	proto_task_free(&t);
	f->ctx.answer_self_chunks = false;
	assert_int_equal(scalar(f, "SELECT count(*) FROM answers"), 4);

	parse("{\"id\":\"ask-2\",\"kind\":\"answer\",\"question\":\"q\",\"document_id\":424242}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_string_equal(err, "answer: no chunk to retrieve in that document");
	proto_task_free(&t);

	fk.fail_after = 0;
	fk.fail_code = SW_ETOOLONG;
	parse("{\"id\":\"ask-3\",\"kind\":\"answer\",\"question\":\"river?\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ETOOLONG);
	assert_true(agent_error_permanent(SW_ETOOLONG));
	proto_task_free(&t);
	assert_int_equal(scalar(f, "SELECT count(*) FROM answers"), 4);
	free(doc);
}

/* Parses the task fmt makes of id and text (its two %s, in that order)
 * into t. text goes into a JSON string as it is: the fixtures are plain
 * words, so only the quotes of the format matter. */
static void parse_fmt(const char *fmt, const char *id, const char *text, struct proto_task *t)
{
	size_t cap = strlen(text) + strlen(fmt) + strlen(id) + 1;
	char *s = malloc(cap);

	if (!s)
		abort();
	snprintf(s, cap, fmt, id, text);
	parse(s, t);
	free(s);
}

/* The row a worker makes when it claims a task (agent_db_task_start), so
 * that what the kinds record in it can be seen. */
static void task_row(struct fx *f, const char *id, const char *kind)
{
	if (agent_db_task_start(f->db, id, kind, "0-1", NULL, NULL, err, sizeof(err)) != 0)
		fail_msg("task_start %s: %s", id, err);
}

static long long task_doc(struct fx *f, const char *id)
{
	char sql[256];

	snprintf(sql, sizeof(sql), "SELECT coalesce(document_id, 0) FROM tasks WHERE id = '%s'",
		 id);
	return scalar(f, sql);
}

/* summarize with inline text: one run stores the document and
 * summarizes it; the same text again (summarize, ingest, answer) is the
 * same document, and nothing is generated twice. */
static void test_summarize_text_one_task(void **state)
{
	struct fx *f = *state;
	char *doc = make_doc("apple", "river", 20), loc[AGENT_LOCATION_MAX], want[64];
	struct proto_task t;
	int64_t id;

	task_row(f, "sum-t", "summarize");
	parse_fmt("{\"id\":\"%s\",\"kind\":\"summarize\",\"text\":\"%s\"}", "sum-t", doc, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 1);
	id = scalar(f, "SELECT id FROM documents");
	assert_int_equal(f->ctx.document_id, id);
	snprintf(want, sizeof(want), "summaries/%lld/2/0", (long long)id);
	assert_string_equal(loc, want);
	/* the task stored it, and its row says so */
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents WHERE task_id = 'sum-t'"
				   " AND source = 'inline'"), 1);
	assert_int_equal(task_doc(f, "sum-t"), id);
	assert_int_equal(scalar(f, "SELECT count(*) FROM chunks"), 10);
	assert_int_equal(fk.embed_calls, 10);
	assert_int_equal(fk.generate_calls, 14); /* 10 + 3 + 1 */
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE is_final"), 1);

	/* Another summarize task with the same text: same document, nothing
	 * embedded or generated again. */
	fk.embed_calls = fk.generate_calls = 0;
	task_row(f, "sum-t2", "summarize");
	parse_fmt("{\"id\":\"%s\",\"kind\":\"summarize\",\"text\":\"%s\",\"max_tokens\":8}",
		  "sum-t2", doc, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	assert_string_equal(loc, want);
	assert_int_equal(task_doc(f, "sum-t2"), id);
	assert_int_equal(fk.embed_calls, 0);
	assert_int_equal(fk.generate_calls, 0);

	/* An ingest and an answer of the same text: the same document. */
	ingest_doc(f, "in-same", doc, &id);
	assert_int_equal(id, scalar(f, "SELECT id FROM documents"));
	parse_fmt("{\"id\":\"%s\",\"kind\":\"answer\",\"question\":\"where is the river?\","
		  "\"top_k\":2,\"text\":\"%s\"}", "ask-t", doc, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	assert_string_equal(loc, "answers/ask-t");
	assert_int_equal(f->ctx.document_id, id);
	assert_int_equal(fk.n_segments, 4); /* system + 2 chunks + question */
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 1);
	assert_int_equal(scalar(f, "SELECT count(*) FROM chunks"), 10);
	free(doc);
}

/* An answer with its text retrieves from that document alone, even
 * when another document matches the question better. */
static void test_answer_text_own_document(void **state)
{
	struct fx *f = *state;
	char *other = make_doc("river", "river", 20), *mine = make_doc("apple", "pear", 8);
	char loc[AGENT_LOCATION_MAX];
	struct proto_task t;
	int64_t other_id;

	ingest_doc(f, "other", other, &other_id);
	parse_fmt("{\"id\":\"%s\",\"kind\":\"answer\",\"question\":\"river river?\","
		  "\"text\":\"%s\",\"source\":\"mine.txt\"}", "ask-own", mine, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	assert_int_not_equal(f->ctx.document_id, other_id);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents WHERE source = 'mine.txt'"), 1);
	/* every chunk shown to the model is of the new document */
	assert_int_equal(scalar(f, "SELECT count(*) FROM answers a, unnest(a.chunk_ids) c(id),"
				   " chunks ch, documents d WHERE ch.id = c.id"
				   " AND d.id = ch.document_id AND d.source <> 'mine.txt'"), 0);
	assert_true(scalar(f, "SELECT array_length(chunk_ids, 1) FROM answers") >= 1);
	free(other);
	free(mine);
}

/* A summarize with text that fails on either side of the ingest's commit
 * (gpud gone while embedding; gpud gone after some summaries) resumes on
 * the rerun without a second document or a second embedding. */
static void test_summarize_text_resume(void **state)
{
	struct fx *f = *state;
	char *doc = make_doc("apple", "river", 20), loc[AGENT_LOCATION_MAX];
	struct proto_task t;
	int64_t id;

	task_row(f, "sum-r", "summarize");
	parse_fmt("{\"id\":\"%s\",\"kind\":\"summarize\",\"text\":\"%s\"}", "sum-r", doc, &t);

	/* Before the commit: nothing stored, nothing recorded. */
	fk.embed_fail = SW_ECLOSED;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ECLOSED);
	assert_int_equal(f->ctx.document_id, 0);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 0);
	assert_int_equal(task_doc(f, "sum-r"), 0);

	/* After the commit: the document and its row stay, with the 4
	 * summaries made before the failure. */
	fk.embed_fail = 0;
	fk.fail_after = 4;
	fk.fail_code = SW_ECLOSED;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ECLOSED);
	id = scalar(f, "SELECT id FROM documents");
	assert_int_equal(f->ctx.document_id, id); /* known, though the task failed */
	assert_int_equal(task_doc(f, "sum-r"), id);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries"), 4);
	assert_int_equal(fk.embed_calls, 10);

	/* The rerun: no second ingest, only the 10 missing summaries. */
	fk.fail_after = -1;
	fk.embed_calls = fk.generate_calls = 0;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	assert_int_equal(fk.embed_calls, 0);
	assert_int_equal(fk.generate_calls, 10);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 1);
	assert_int_equal(scalar(f, "SELECT count(*) FROM chunks"), 10);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries"), 14);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE is_final"), 1);
	proto_task_free(&t);
	free(doc);
}

/* A redelivered summarize of a URL uses the document its first delivery
 * stored, although the URL now returns another text (nothing is fetched
 * again); a new task of the same URL stores what it returns now. */
static void test_summarize_url_redelivery(void **state)
{
	struct fx *f = *state;
	char path[] = "/tmp/agentd_url_XXXXXX", json[256], loc[AGENT_LOCATION_MAX];
	char *first = make_doc("apple", "river", 20), *second = make_doc("stone", "cloud", 6);
	struct proto_task t;
	int64_t id;
	int fd;

	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, first, strlen(first)), (ssize_t)strlen(first));
	close(fd);
	snprintf(json, sizeof(json),
		 "{\"id\":\"sum-u\",\"kind\":\"summarize\",\"url\":\"file://%s\"}", path);
	task_row(f, "sum-u", "summarize");
	parse(json, &t);
	fk.fail_after = 2;
	fk.fail_code = SW_ECLOSED;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ECLOSED);
	id = scalar(f, "SELECT id FROM documents");
	snprintf(json, sizeof(json), "SELECT count(*) FROM documents WHERE source = 'file://%s'",
		 path);
	assert_int_equal(scalar(f, json), 1);

	/* The file changes; the task comes again. */
	fd = open(path, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, second, strlen(second)), (ssize_t)strlen(second));
	close(fd);
	fk.fail_after = -1;
	fk.embed_calls = 0;
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	assert_int_equal(f->ctx.document_id, id);
	assert_int_equal(fk.embed_calls, 0);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 1);
	assert_int_equal(scalar(f, "SELECT count(*) FROM summaries WHERE is_final"), 1);

	/* A new task of the URL: what it returns now is a new document. */
	snprintf(json, sizeof(json),
		 "{\"id\":\"sum-u2\",\"kind\":\"summarize\",\"url\":\"file://%s\"}", path);
	task_row(f, "sum-u2", "summarize");
	parse(json, &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), 0);
	proto_task_free(&t);
	assert_int_not_equal(f->ctx.document_id, id);
	assert_int_equal(task_doc(f, "sum-u2"), f->ctx.document_id);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 2);
	unlink(path);
	free(first);
	free(second);
}

/* The ingest's errors, as the summarize or answer that brought the
 * document: precise, and nothing stored. */
static void test_document_errors(void **state)
{
	struct fx *f = *state;
	char loc[AGENT_LOCATION_MAX];
	struct proto_task t;

	parse("{\"id\":\"sum-blank\",\"kind\":\"summarize\",\"text\":\"  \\n \"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "ingest: the document has no text");
	assert_int_equal(f->ctx.document_id, 0);
	proto_task_free(&t);

	parse("{\"id\":\"ask-gone\",\"kind\":\"answer\",\"question\":\"q\","
	      "\"url\":\"file:///nonexistent/agentd-doc.txt\"}", &t);
	assert_int_equal(agent_run_task(&f->ctx, &t, loc, sizeof(loc), err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_non_null(strstr(err, "cannot read file"));
	assert_int_equal(fk.embed_calls, 0); /* not even the question */
	proto_task_free(&t);
	assert_int_equal(scalar(f, "SELECT count(*) FROM documents"), 0);
}

static void test_answer_prompt_shape(void **state)
{
	const char *chunks[2] = { "c1", "c2" };
	const size_t lens[2] = { 2, 2 };
	struct proto_segment seg[4];
	struct proto_mask_row rows[5];
	uint16_t idx[32];
	struct proto_mask_desc m;

	agent_answer_prompt("sys", chunks, lens, 2, "q?", 2, false, seg, rows, idx, &m);
	assert_int_equal(m.n_segments, 4);
	assert_int_equal(rows[0].n, 1);
	assert_int_equal(rows[1].n, 2);
	assert_int_equal(rows[1].idx[0], 0);
	assert_int_equal(rows[1].idx[1], 1);
	assert_int_equal(rows[2].idx[1], 2);
	assert_int_equal(rows[3].n, 4); /* question: 0..3 */
	assert_int_equal(rows[4].n, 4); /* G: 1, 2, 3, itself */
	assert_int_equal(rows[4].idx[0], 1);
	assert_int_equal(rows[4].idx[3], 4);
	assert_int_equal(seg[3].len, 2);
	assert_memory_equal(seg[0].text, "sys", 3);
	assert_int_equal(proto_mask_validate(&m, 64, NULL, 0), 0);

	/* self-only chunks: each sees itself alone; the rest is the same */
	agent_answer_prompt("sys", chunks, lens, 2, "q?", 2, true, seg, rows, idx, &m);
	assert_int_equal(m.n_segments, 4);
	assert_int_equal(rows[1].n, 1);
	assert_int_equal(rows[1].idx[0], 1);
	assert_int_equal(rows[2].n, 1);
	assert_int_equal(rows[2].idx[0], 2);
	assert_int_equal(rows[3].n, 4);
	assert_int_equal(rows[4].n, 4);
	assert_int_equal(rows[4].idx[0], 1);
	assert_int_equal(proto_mask_validate(&m, 64, NULL, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ingest_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ingest_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_summarize_tree_and_resume, setup, teardown),
		cmocka_unit_test_setup_teardown(test_summarize_single_chunk, setup, teardown),
		cmocka_unit_test_setup_teardown(test_answer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_summarize_text_one_task, setup, teardown),
		cmocka_unit_test_setup_teardown(test_answer_text_own_document, setup, teardown),
		cmocka_unit_test_setup_teardown(test_summarize_text_resume, setup, teardown),
		cmocka_unit_test_setup_teardown(test_summarize_url_redelivery, setup, teardown),
		cmocka_unit_test_setup_teardown(test_document_errors, setup, teardown),
		cmocka_unit_test(test_answer_prompt_shape),
	};
	int rc = it_start(IT_PG);

	if (rc)
		return rc;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
