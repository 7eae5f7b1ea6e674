/* tasks.c - submit and results (see tasks.h). */
#include "swarmctl/tasks.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/time.h"
#include "proto/task.h"
#include "swarmctl/clients.h"
#include "swarmctl/proc.h"

#define EXIT_USAGE 2
#define POLL_MS 250
#define REDIS_TIMEOUT_MS 5000
#define ID_MAX 96

enum sub_kind { K_SUMMARIZE, K_ANSWER, K_INGEST };

static const char *const kind_names[] = { "summarize", "answer", "ingest" };
static const char *const id_prefix[] = { "sum", "ask", "ing" };

/* One task: an input and what to do with it, in one task on the stream
 * (proto/task.h: the worker ingests the input itself). input NULL is the
 * answer over every document (--question with no input, or with
 * summarize). */
struct job {
	const char *input;
	enum sub_kind kind;
	char *json;                 /* built before anything is queued; freed once sent */
	char id[ID_MAX];
	char status[16];            /* "" = queued, not started by a worker yet */
	char error[SW_ERR_MAX];
	int64_t doc_id;             /* 0 until its document is stored */
	bool sent;
	bool deferred;              /* the answer over every document after summarizes:
				     * queued once their documents are stored */
	long n_chunks, summaries;   /* progress of a summarize */
	bool failed;                /* the job ended without its result */
};

struct submit {
	struct ctl_env *e;
	/* the command line */
	enum sub_kind kind;
	const char *question;
	unsigned max_tokens;
	bool wait;
	struct sw_deadline deadline;  /* --timeout; never by default */
	char **inputs;                /* FILE, URL or - each */
	size_t n_inputs;
	/* the run */
	bool tty;                     /* --wait on a terminal: a progress bar */
	struct job *jobs;
	size_t n;
	redisContext *rc;
	PGconn *pg;
	uint64_t t0_ms;
};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
	(void)sig;
	interrupted = 1;
}

static bool is_final_status(const char *s)
{
	return !strcmp(s, "completed") || !strcmp(s, "failed") || !strcmp(s, "dead");
}

/* Prints text with control characters (other than newline and tab) shown
 * as '.': model output may be any bytes, the terminal must survive it. */
static void print_text(const char *s)
{
	for (; *s; s++)
		putchar((unsigned char)*s < 0x20 && *s != '\n' && *s != '\t' ? '.' : *s);
}

static int read_all(FILE *f, const char *what, char **out, size_t *len, char *err,
		    size_t errlen)
{
	size_t cap = 64 << 10, n = 0;
	char *buf = malloc(cap);

	if (!buf)
		return sw_seterr(err, errlen, -ENOMEM, "out of memory");
	for (;;) {
		size_t r;

		if (n + 1 == cap) {
			char *nb;

			if (cap > PROTO_TASK_MAX_TEXT) {
				free(buf);
				return sw_seterr(err, errlen, SW_ETOOLONG,
						 "%s: larger than the %u bytes a task may carry", what,
						 PROTO_TASK_MAX_TEXT);
			}
			nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return sw_seterr(err, errlen, -ENOMEM, "out of memory");
			}
			buf = nb;
			cap *= 2;
		}
		r = fread(buf + n, 1, cap - 1 - n, f);
		n += r;
		if (r == 0)
			break;
	}
	if (ferror(f)) {
		free(buf);
		return sw_seterr(err, errlen, -EIO, "%s: read error", what);
	}
	if (n > PROTO_TASK_MAX_TEXT) {
		free(buf);
		return sw_seterr(err, errlen, SW_ETOOLONG, "%s: %zu bytes exceeds the %u bytes a "
				 "task may carry", what, n, PROTO_TASK_MAX_TEXT);
	}
	buf[n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

static bool is_url(const char *s)
{
	return !strncmp(s, "http://", 7) || !strncmp(s, "https://", 8) ||
	       !strncmp(s, "file://", 7);
}

int ctl_task_json(const char *id, const char *kind, const char *input, const char *question,
		  unsigned max_tokens, char **json, char *err, size_t errlen)
{
	json_t *o = json_object(), *text = NULL;
	char *data = NULL, src[PATH_MAX + 8];
	bool is_ingest = !strcmp(kind, "ingest"), is_answer = !strcmp(kind, "answer");
	size_t len = 0;
	int rc = 0;

	*json = NULL;
	if (!o)
		return sw_seterr(err, errlen, -ENOMEM, "out of memory");
	if (!is_ingest && !is_answer && strcmp(kind, "summarize")) {
		rc = sw_seterr(err, errlen, -EINVAL, "unknown kind \"%s\"", kind);
		goto out;
	}
	if (!input && !is_answer) {
		rc = sw_seterr(err, errlen, -EINVAL, "kind %s needs an input", kind);
		goto out;
	}
	if (is_answer != (question != NULL)) {
		rc = sw_seterr(err, errlen, -EINVAL, "a question goes with kind answer only");
		goto out;
	}
	json_object_set_new(o, "id", json_string(id));
	json_object_set_new(o, "kind", json_string(kind));
	if (question)
		json_object_set_new(o, "question", json_string(question));
	if (max_tokens && !is_ingest)
		json_object_set_new(o, "max_tokens", json_integer(max_tokens));
	if (!input) {
		/* the answer over every document */
	} else if (is_url(input)) {
		if (strlen(input) > PROTO_TASK_MAX_URL) {
			rc = sw_seterr(err, errlen, SW_ETOOLONG, "%.64s...: URL longer than %d bytes",
				       input, PROTO_TASK_MAX_URL);
			goto out;
		}
		json_object_set_new(o, "url", json_string(input));
	} else {
		bool is_stdin = !strcmp(input, "-");
		FILE *f = is_stdin ? stdin : fopen(input, "re");

		if (!f) {
			rc = sw_seterr(err, errlen, -errno, "%s: %s", input, strerror(errno));
			goto out;
		}
		rc = read_all(f, is_stdin ? "standard input" : input, &data, &len, err, errlen);
		if (f != stdin)
			fclose(f);
		if (rc)
			goto out;
		if (len == 0) {
			rc = sw_seterr(err, errlen, -EINVAL, "%s: empty", input);
			goto out;
		}
		text = json_stringn(data, len);
		if (!text) {
			rc = sw_seterr(err, errlen, SW_EFORMAT, "%s: not UTF-8 text", input);
			goto out;
		}
		json_object_set_new(o, "text", text);
		if (is_stdin || !realpath(input, src))
			snprintf(src, sizeof(src), "%s", is_stdin ? "stdin" : input);
		json_object_set_new(o, "source", json_string(src));
	}
	*json = json_dumps(o, JSON_COMPACT);
	if (!*json)
		rc = sw_seterr(err, errlen, -ENOMEM, "out of memory");
out:
	free(data);
	json_decref(o);
	return rc;
}

/* Copies the value of "field:" in INFO text into out ("?" when absent). */
static void info_field(const char *info, const char *field, char *out, size_t cap)
{
	size_t n = strlen(field);
	const char *p = info;

	snprintf(out, cap, "?");
	while (p && *p) {
		if (!strncmp(p, field, n) && p[n] == ':') {
			snprintf(out, cap, "%.*s", (int)strcspn(p + n + 1, "\r\n"), p + n + 1);
			return;
		}
		p = strchr(p, '\n');
		p = p ? p + 1 : NULL;
	}
}

/* Says plainly that Redis refused a task for memory (maxmemory with
 * noeviction: "OOM command not allowed ..."), with its figures, and what
 * this command had queued before. Returns SW_EBUSY. */
static int refused_for_memory(redisContext *c, unsigned long queued, char *err, size_t errlen)
{
	char used[32] = "?", max[32] = "?", policy[32] = "?";
	redisReply *r;

	if (ctl_redis_cmd(c, &r, NULL, 0, "INFO memory") == 0) {
		if (r->type == REDIS_REPLY_STRING) {
			info_field(r->str, "used_memory_human", used, sizeof(used));
			info_field(r->str, "maxmemory_human", max, sizeof(max));
			info_field(r->str, "maxmemory_policy", policy, sizeof(policy));
		}
		freeReplyObject(r);
	}
	return sw_seterr(err, errlen, SW_EBUSY,
			 "Redis refused the task: it is at its maxmemory limit (used_memory %s, "
			 "maxmemory %s, policy %s); %s. The workers free memory as they finish "
			 "tasks: submit again later, or raise Redis's maxmemory",
			 used, max, policy, queued ? "the tasks queued above stay queued, this one "
			 "and the rest were not" : "nothing was queued");
}

static int xadd(struct submit *s, const char *json, char *err, size_t errlen)
{
	static unsigned long queued; /* by this command so far */
	redisReply *r;
	int rc = ctl_redis_cmd(s->rc, &r, err, errlen, "XADD %s * %s %s", PROTO_TASK_STREAM,
			      PROTO_TASK_FIELD, json);

	if (rc == -EIO && !strncmp(err, "redis: OOM ", 11))
		return refused_for_memory(s->rc, queued, err, errlen);
	if (rc)
		return rc;
	freeReplyObject(r);
	queued++;
	return 0;
}

/* Queues job j (its JSON is freed once sent). */
static int send_job(struct submit *s, struct job *j, char *err, size_t errlen)
{
	int rc = xadd(s, j->json, err, errlen);

	if (rc)
		return rc;
	free(j->json);
	j->json = NULL;
	j->sent = true;
	if (!s->tty)
		printf("queued %s %s%s%s\n", kind_names[j->kind], j->id,
		       j->input ? " for " : " over every document", j->input ? j->input : "");
	return 0;
}

/* "{"a","b"}" for = ANY($1::text[]); ids are [A-Za-z0-9._:-] only. */
static char *id_array(const struct submit *s)
{
	size_t cap = 3 + s->n * (ID_MAX + 4), o = 0;
	char *a = malloc(cap);

	if (!a)
		return NULL;
	a[o++] = '{';
	for (size_t i = 0; i < s->n; i++)
		if (s->jobs[i].sent)
			o += (size_t)snprintf(a + o, cap - o, "%s\"%s\"", o > 1 ? "," : "",
					      s->jobs[i].id);
	snprintf(a + o, cap - o, "}");
	return a;
}

long ctl_expected_summaries(long n_chunks, unsigned fanin)
{
	long rows = n_chunks, n = n_chunks;

	if (fanin < 2)
		return n_chunks > 0 ? n_chunks : 1;
	while (n > 1) {
		n = (n + (long)fanin - 1) / (long)fanin;
		rows += n;
	}
	return rows > 0 ? rows : 1;
}

/* Takes one row of poll_state's query into job j, saying what changed
 * (without a progress bar). */
static void take_row(struct submit *s, struct job *j, PGresult *r, int row)
{
	const char *st = PQgetvalue(r, row, 1), *e = PQgetvalue(r, row, 2);
	int64_t doc = strtoll(PQgetvalue(r, row, 3), NULL, 10);

	if (doc && !j->doc_id && j->input && !s->tty)
		printf("%s %s: document %" PRId64 " stored\n", kind_names[j->kind], j->id, doc);
	if (strcmp(j->status, st) && !s->tty)
		printf("%s %s: %s%s%s\n", kind_names[j->kind], j->id, st, e[0] ? " - " : "", e);
	snprintf(j->status, sizeof(j->status), "%s", st);
	if (e[0])
		snprintf(j->error, sizeof(j->error), "%s", e);
	j->doc_id = doc;
	j->n_chunks = strtol(PQgetvalue(r, row, 4), NULL, 10);
	j->summaries = strtol(PQgetvalue(r, row, 5), NULL, 10);
}

/* Reads the state of every queued task of the submission from
 * PostgreSQL: status, error, the document its ingest stored (the task
 * row's document_id, written with the document), and for the progress
 * of a summarize the document's chunks and the partial summaries made
 * so far. Tables that do not exist yet (agentd has not migrated) read
 * as nothing recorded. */
static int poll_state(struct submit *s, char *err, size_t errlen)
{
	char *ids = id_array(s);
	const char *params[1] = { ids };
	PGresult *r;
	int rc;

	if (!ids)
		return sw_seterr(err, errlen, -ENOMEM, "out of memory");
	rc = ctl_pg_query(s->pg, &r, err, errlen,
			 "SELECT t.id, t.status, coalesce(t.error, ''), coalesce(t.document_id, 0), "
			 "coalesce(d.n_chunks, 0), (SELECT count(*) FROM summaries m "
			 "WHERE m.document_id = t.document_id) "
			 "FROM tasks t LEFT JOIN documents d ON d.id = t.document_id "
			 "WHERE t.id = ANY($1::text[])", 1, params);
	free(ids);
	if (rc)
		return strstr(err, "does not exist") ? 0 : rc;
	for (int row = 0; row < PQntuples(r); row++)
		for (size_t i = 0; i < s->n; i++)
			if (!strcmp(PQgetvalue(r, row, 0), s->jobs[i].id))
				take_row(s, &s->jobs[i], r, row);
	PQclear(r);
	return 0;
}

/* Queues the deferred answer once every summarize has its document
 * stored or has ended; marks jobs that ended without their result.
 * *done is true when there is nothing left to wait for. */
static int advance(struct submit *s, bool *done, char *err, size_t errlen)
{
	bool docs_over = true, any_doc = false;
	int rc;

	*done = true;
	for (size_t i = 0; i < s->n; i++) {
		const struct job *j = &s->jobs[i];

		if (!j->input)
			continue;
		if (!j->doc_id && !is_final_status(j->status))
			docs_over = false;
		any_doc |= j->doc_id != 0;
	}
	for (size_t i = 0; i < s->n; i++) {
		struct job *j = &s->jobs[i];

		if (j->deferred && !j->sent && !j->failed) {
			/* the answer over every document must see this
			 * submission's documents */
			if (!docs_over) {
				*done = false;
				continue;
			}
			if (!any_doc) {
				j->failed = true;
				snprintf(j->error, sizeof(j->error), "no document was stored");
				continue;
			}
			rc = send_job(s, j, err, errlen);
			if (rc)
				return rc;
		}
		if (j->failed)
			continue;
		if (s->wait && !is_final_status(j->status))
			*done = false;
		else if (is_final_status(j->status) && strcmp(j->status, "completed"))
			j->failed = true;
	}
	return 0;
}

static void draw_progress(const struct submit *s, bool last)
{
	double total = 0, done = 0;
	unsigned docs = 0, docs_done = 0, sum = 0, sum_done = 0, ans = 0, ans_done = 0;
	unsigned ing = 0, ing_done = 0, failed = 0;
	char bar[41];
	int filled;

	for (size_t i = 0; i < s->n; i++) {
		const struct job *j = &s->jobs[i];
		bool over = is_final_status(j->status) || j->failed;

		failed += j->failed;
		if (j->input && j->kind != K_INGEST) { /* the ingest inside the task */
			docs++;
			docs_done += j->doc_id || over;
			total += 1;
			done += j->doc_id || over;
		}
		switch (j->kind) {
		case K_SUMMARIZE: {
			long exp = j->n_chunks ? ctl_expected_summaries(j->n_chunks,
									PROTO_TASK_SUMMARY_FANIN) : 1;

			sum++;
			sum_done += over;
			total += (double)exp;
			done += over ? (double)exp : (double)(j->summaries < exp ? j->summaries : exp);
			break;
		}
		case K_ANSWER:
			ans++;
			ans_done += over;
			total += 1;
			done += over;
			break;
		case K_INGEST:
			ing++;
			ing_done += over;
			total += 1;
			done += over;
			break;
		}
	}
	filled = total > 0 ? (int)(40 * done / total) : 40;
	for (int i = 0; i < 40; i++)
		bar[i] = i < filled ? '#' : '-';
	bar[40] = '\0';
	printf("\r\033[K[%s] %3.0f%%", bar, total > 0 ? 100 * done / total : 100);
	if (docs)
		printf("  documents %u/%u", docs_done, docs);
	if (ing)
		printf("  ingest %u/%u", ing_done, ing);
	if (sum)
		printf("  summarize %u/%u", sum_done, sum);
	if (ans)
		printf("  answer %u/%u", ans_done, ans);
	if (failed)
		printf("  %u failed", failed);
	printf("  %.0fs%s", (double)(sw_now_ms() - s->t0_ms) / 1000, last ? "\n" : "");
	fflush(stdout);
}

/* --- results ------------------------------------------------------------ */

static bool noise_note(const struct ctl_env *e)
{
	return e->managed && e->builtin_model;
}

/* The result of one task as JSON (task row + what its location names);
 * SW_ENOTFOUND when no worker has recorded the task. */
static int result_json(struct ctl_env *e, PGconn *pg, const char *id, json_t **out, char *err,
		       size_t errlen)
{
	const char *params[3] = { id };
	char dbuf[32], lbuf[32];
	PGresult *r;
	json_t *o, *res = NULL;
	const char *kind, *loc;
	int64_t doc;
	int level, rc;

	*out = NULL;
	rc = ctl_pg_query(pg, &r, err, errlen,
			 "SELECT id, coalesce(kind, ''), status, attempts, coalesce(error, ''), "
			 "coalesce(location, ''), created_at::text, coalesce(finished_at::text, ''), "
			 "extract(epoch from coalesce(finished_at, now()) - "
			 "coalesce(started_at, created_at))::float8, coalesce(document_id, 0) "
			 "FROM tasks WHERE id = $1", 1, params);
	if (rc) {
		if (strstr(err, "does not exist"))
			return sw_seterr(err, errlen, SW_ENOTFOUND, "task %s: not found (no task "
					 "has run yet: agentd creates the tables when it starts)", id);
		return rc;
	}
	if (PQntuples(r) != 1) {
		PQclear(r);
		return sw_seterr(err, errlen, SW_ENOTFOUND, "task %s: not found (still queued, or "
				 "an unknown id; `swarmctl results` lists the latest)", id);
	}
	o = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:s, s:s, s:f}", "id", PQgetvalue(r, 0, 0),
		      "kind", PQgetvalue(r, 0, 1), "status", PQgetvalue(r, 0, 2), "attempts",
		      atoi(PQgetvalue(r, 0, 3)), "error", PQgetvalue(r, 0, 4), "location",
		      PQgetvalue(r, 0, 5), "created_at", PQgetvalue(r, 0, 6), "finished_at",
		      PQgetvalue(r, 0, 7), "seconds", strtod(PQgetvalue(r, 0, 8), NULL));
	doc = strtoll(PQgetvalue(r, 0, 9), NULL, 10);
	PQclear(r);
	if (!o)
		return sw_seterr(err, errlen, -ENOMEM, "out of memory");
	/* the document the task stored or read; null for none */
	json_object_set_new(o, "document_id", doc ? json_integer(doc) : json_null());
	kind = json_string_value(json_object_get(o, "kind"));
	loc = json_string_value(json_object_get(o, "location"));
	if (noise_note(e))
		json_object_set_new(o, "note", json_string("built-in random-weight model: the "
							   "generated text is noise"));
	if (!strcmp(kind, "ingest") && sscanf(loc, "documents/%" SCNd64, &doc) == 1) {
		snprintf(dbuf, sizeof(dbuf), "%" PRId64, doc);
		params[0] = dbuf;
		rc = ctl_pg_query(pg, &r, err, errlen, "SELECT id, source, n_chunks, "
				 "octet_length(text) FROM documents WHERE id = $1", 1, params);
		if (!rc && PQntuples(r) == 1)
			res = json_pack("{s:I, s:s, s:i, s:I}", "document_id", (json_int_t)doc,
					"source", PQgetvalue(r, 0, 1), "chunks",
					atoi(PQgetvalue(r, 0, 2)), "bytes",
					(json_int_t)strtoll(PQgetvalue(r, 0, 3), NULL, 10));
	} else if (!strcmp(kind, "summarize") &&
		   sscanf(loc, "summaries/%" SCNd64 "/%d/0", &doc, &level) == 2) {
		snprintf(dbuf, sizeof(dbuf), "%" PRId64, doc);
		snprintf(lbuf, sizeof(lbuf), "%d", level);
		params[0] = dbuf;
		params[1] = lbuf;
		rc = ctl_pg_query(pg, &r, err, errlen, "SELECT m.text, d.source, d.n_chunks FROM "
				 "summaries m JOIN documents d ON d.id = m.document_id WHERE "
				 "m.document_id = $1 AND m.level = $2 AND m.position = 0", 2, params);
		if (!rc && PQntuples(r) == 1)
			res = json_pack("{s:I, s:s, s:i, s:i, s:s}", "document_id", (json_int_t)doc,
					"source", PQgetvalue(r, 0, 1), "chunks",
					atoi(PQgetvalue(r, 0, 2)), "levels", level + 1, "summary",
					PQgetvalue(r, 0, 0));
	} else if (!strcmp(kind, "answer") && !strncmp(loc, "answers/", 8)) {
		params[0] = id;
		rc = ctl_pg_query(pg, &r, err, errlen, "SELECT question, text, chunk_ids::text "
				 "FROM answers WHERE task_id = $1", 1, params);
		if (!rc && PQntuples(r) == 1)
			res = json_pack("{s:s, s:s, s:s}", "question", PQgetvalue(r, 0, 0), "answer",
					PQgetvalue(r, 0, 1), "chunk_ids", PQgetvalue(r, 0, 2));
	} else {
		r = NULL;
	}
	if (rc) {
		json_decref(o);
		return rc;
	}
	PQclear(r);
	if (res)
		json_object_set_new(o, "result", res);
	*out = o;
	return 0;
}

static void print_result(const json_t *o)
{
	const json_t *res = json_object_get(o, "result");
	const char *st = json_string_value(json_object_get(o, "status"));
	const char *kind = json_string_value(json_object_get(o, "kind"));
	const char *e = json_string_value(json_object_get(o, "error"));

	printf("== %s (%s): %s after %d attempt%s, %.1f s\n",
	       json_string_value(json_object_get(o, "id")), kind, st,
	       (int)json_integer_value(json_object_get(o, "attempts")),
	       json_integer_value(json_object_get(o, "attempts")) == 1 ? "" : "s",
	       json_real_value(json_object_get(o, "seconds")));
	if (e && e[0])
		printf("%s: %s\n", strcmp(st, "completed") ? "error" : "last error", e);
	if (!res) {
		if (!strcmp(st, "completed"))
			printf("(result at %s not found)\n",
			       json_string_value(json_object_get(o, "location")));
		return;
	}
	if (!strcmp(kind, "ingest")) {
		printf("document %lld: %s, %lld bytes, %lld chunks\n",
		       (long long)json_integer_value(json_object_get(res, "document_id")),
		       json_string_value(json_object_get(res, "source")),
		       (long long)json_integer_value(json_object_get(res, "bytes")),
		       (long long)json_integer_value(json_object_get(res, "chunks")));
		return;
	}
	if (json_object_get(o, "note"))
		printf("(%s)\n", json_string_value(json_object_get(o, "note")));
	if (!strcmp(kind, "summarize")) {
		printf("summary of document %lld (%s; %lld chunks, %lld levels):\n",
		       (long long)json_integer_value(json_object_get(res, "document_id")),
		       json_string_value(json_object_get(res, "source")),
		       (long long)json_integer_value(json_object_get(res, "chunks")),
		       (long long)json_integer_value(json_object_get(res, "levels")));
		print_text(json_string_value(json_object_get(res, "summary")));
	} else {
		json_int_t doc = json_integer_value(json_object_get(o, "document_id"));

		printf("question: ");
		print_text(json_string_value(json_object_get(res, "question")));
		printf("\nanswer (");
		if (doc)
			printf("document %lld, ", (long long)doc);
		printf("from chunks %s):\n", json_string_value(json_object_get(res, "chunk_ids")));
		print_text(json_string_value(json_object_get(res, "answer")));
	}
	printf("\n");
}

/* Connects to PostgreSQL with the hint an operator needs on failure. */
static int open_pg(struct ctl_env *e, PGconn **pg)
{
	char err[SW_ERR_MAX];

	if (ctl_pg_open(e->cfg.postgres.url, pg, err, sizeof(err)) == 0)
		return 0;
	fprintf(stderr, "swarmctl: %s\n", err);
	if (e->managed)
		fprintf(stderr, "swarmctl: is the swarm running? (`swarmctl status`; state "
			"directory %s)\n", e->state_dir);
	return 1;
}

static int open_redis(struct ctl_env *e, redisContext **rc)
{
	char err[SW_ERR_MAX];

	if (ctl_redis_open(e->cfg.redis.url, REDIS_TIMEOUT_MS, rc, err, sizeof(err)) == 0)
		return 0;
	fprintf(stderr, "swarmctl: %s\n", err);
	if (e->managed)
		fprintf(stderr, "swarmctl: is the swarm running? (`swarmctl status`; state "
			"directory %s)\n", e->state_dir);
	return 1;
}

/* The results of every task (with --wait), or why one never ran. */
static int print_results(struct submit *s)
{
	char err[SW_ERR_MAX];
	int status = 0;

	printf("\n");
	for (size_t i = 0; i < s->n; i++) {
		struct job *j = &s->jobs[i];
		json_t *o;

		if (!j->sent) {
			printf("== %s (%s): not run: %s\n", j->id, kind_names[j->kind], j->error);
			status = 1;
			continue;
		}
		if (result_json(s->e, s->pg, j->id, &o, err, sizeof(err)) != 0) {
			printf("== %s: %s\n", j->id, err);
			status = 1;
			continue;
		}
		print_result(o);
		if (strcmp(json_string_value(json_object_get(o, "status")), "completed"))
			status = 1;
		json_decref(o);
	}
	return status;
}

void ctl_task_id(char *out, size_t cap, const char *prefix, size_t i)
{
	static uint16_t salt;
	time_t now = time(NULL);
	struct tm tm;

	if (!salt && getrandom(&salt, sizeof(salt), 0) != sizeof(salt))
		salt = (uint16_t)(getpid() ^ now);
	gmtime_r(&now, &tm);
	snprintf(out, cap, "%s-%04d%02d%02d-%02d%02d%02d-%d-%04x-%zu", prefix, tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)getpid(), salt,
		 i + 1);
}

static void submit_usage(FILE *f)
{
	fprintf(f, "usage: swarmctl submit FILE|URL|- ... [--kind summarize|answer|ingest]\n"
		   "                       [--question Q] [--wait] [--timeout SECONDS] "
		   "[--max-tokens N]\n"
		   "  one task per input, which agentd ingests and then works on:\n"
		   "  summarize (default): summarize each input; with --question also one answer\n"
		   "  over every document, queued once the inputs are stored. answer: answer\n"
		   "  --question from each input (no input: from every document). ingest: store\n"
		   "  each input only.\n");
}

/* --- submit, step by step --------------------------------------------------- */

/* What a step returns when the command goes on to the next one; any other
 * value is the command's exit status. */
#define SUBMIT_GO_ON (-1)

/* Reads submit's options into s; the inputs are what follows them. Returns
 * SUBMIT_GO_ON, or the exit status when the command ends here (--help,
 * a usage error). */
static int parse_submit_options(struct submit *s, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "kind", required_argument, NULL, 'k' },
		{ "question", required_argument, NULL, 'q' },
		{ "wait", no_argument, NULL, 'w' },
		{ "timeout", required_argument, NULL, 't' },
		{ "max-tokens", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool kind_set = false;
	char *end;
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "k:q:wt:m:h", opts, NULL)) != -1) {
		switch (c) {
		case 'k':
			kind_set = true;
			if (!strcmp(optarg, "summarize"))
				s->kind = K_SUMMARIZE;
			else if (!strcmp(optarg, "answer"))
				s->kind = K_ANSWER;
			else if (!strcmp(optarg, "ingest"))
				s->kind = K_INGEST;
			else {
				fprintf(stderr, "swarmctl: submit: unknown kind \"%s\" (summarize, "
					"answer, ingest)\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'q':
			s->question = optarg;
			break;
		case 'w':
			s->wait = true;
			break;
		case 't': {
			double t = strtod(optarg, &end);

			if (end == optarg || *end || t <= 0) {
				fprintf(stderr, "swarmctl: submit: --timeout wants seconds > 0\n");
				return EXIT_USAGE;
			}
			s->deadline = sw_deadline_in_ms((uint64_t)(t * 1000));
			break;
		}
		case 'm': {
			unsigned long m = strtoul(optarg, &end, 10);

			if (end == optarg || *end || m == 0 || m > PROTO_TASK_MAX_TOKENS) {
				fprintf(stderr, "swarmctl: submit: --max-tokens wants 1..%d\n",
					PROTO_TASK_MAX_TOKENS);
				return EXIT_USAGE;
			}
			s->max_tokens = (unsigned)m;
			break;
		}
		case 'h':
			submit_usage(stdout);
			return 0;
		default:
			submit_usage(stderr);
			return EXIT_USAGE;
		}
	}
	s->inputs = argv + optind;
	s->n_inputs = (size_t)(argc - optind);
	if (!kind_set && !s->n_inputs && s->question)
		s->kind = K_ANSWER;
	return SUBMIT_GO_ON;
}

/* Refuses the combinations of options and inputs that make no task.
 * Returns SUBMIT_GO_ON or EXIT_USAGE. */
static int check_submit_options(const struct submit *s)
{
	if (!s->n_inputs && !(s->kind == K_ANSWER && s->question)) {
		fprintf(stderr, "swarmctl: submit: nothing to submit: give FILE, URL or - (or "
			"--question Q for an answer over every document)\n");
		submit_usage(stderr);
		return EXIT_USAGE;
	}
	if (s->kind == K_ANSWER && !s->question) {
		fprintf(stderr, "swarmctl: submit: --kind answer needs --question Q\n");
		return EXIT_USAGE;
	}
	if (s->question && s->kind == K_INGEST) {
		fprintf(stderr, "swarmctl: submit: --question does not go with --kind ingest\n");
		return EXIT_USAGE;
	}
	if (s->question && (!s->question[0] || strlen(s->question) > PROTO_TASK_MAX_QUESTION)) {
		fprintf(stderr, "swarmctl: submit: the question must be 1..%d bytes\n",
			PROTO_TASK_MAX_QUESTION);
		return EXIT_USAGE;
	}
	if (s->question) {
		json_t *q = json_string(s->question);

		if (!q) {
			fprintf(stderr, "swarmctl: submit: the question is not UTF-8\n");
			return EXIT_USAGE;
		}
		json_decref(q);
	}
	return SUBMIT_GO_ON;
}

/* Makes a job per input (plus the answer over every document) with its
 * task id and JSON, reading and checking every input, so that nothing is
 * queued when one of them is bad. Returns 0, or 1 after saying why. */
static int make_jobs(struct submit *s)
{
	char err[SW_ERR_MAX];

	s->n = s->n_inputs + (s->question && (s->kind == K_SUMMARIZE || !s->n_inputs));
	s->jobs = calloc(s->n, sizeof(*s->jobs));
	if (!s->jobs) {
		fprintf(stderr, "swarmctl: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < s->n; i++) {
		struct job *j = &s->jobs[i];

		j->input = i < s->n_inputs ? s->inputs[i] : NULL;
		j->kind = j->input ? s->kind : K_ANSWER;
		j->deferred = !j->input && s->n_inputs;
		ctl_task_id(j->id, sizeof(j->id), id_prefix[j->kind], i);
		if (ctl_task_json(j->id, kind_names[j->kind], j->input,
				  j->kind == K_ANSWER ? s->question : NULL, s->max_tokens, &j->json,
				  err, sizeof(err)) != 0) {
			fprintf(stderr, "swarmctl: submit: %s\n", err);
			return 1;
		}
	}
	return 0;
}

/* True when submit stays to queue the answer over every document after
 * the summarizes (it must not run before their documents are stored). */
static bool has_deferred(const struct submit *s)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->jobs[i].deferred)
			return true;
	return false;
}

/* Connects to Redis, and to PostgreSQL when submit will wait for a task;
 * in a managed swarm, refuses to wait on tasks no agentd would run.
 * Returns 0, or 1 after saying why. */
static int open_servers(struct submit *s)
{
	struct ctl_env *e = s->e;
	bool stays = s->wait || has_deferred(s);

	if (open_redis(e, &s->rc))
		return 1;
	if (stays && open_pg(e, &s->pg))
		return 1;
	if (e->managed && !ctl_service_pid(e, CTL_AGENTD)) {
		if (stays) {
			fprintf(stderr, "swarmctl: submit: agentd is not running in %s, so nothing "
				"would run these tasks; nothing queued (`swarmctl status`, `swarmctl "
				"logs agentd`)\n", e->state_dir);
			return 1;
		}
		fprintf(stderr, "swarmctl: warning: agentd is not running in %s: the tasks wait "
			"in the queue until it runs\n", e->state_dir);
	}
	return 0;
}

/* Queues every task but the deferred answer: one XADD per input, each a
 * whole task, so nothing depends on this process from here on. Returns
 * 0, or 1 after saying why. */
static int queue_tasks(struct submit *s)
{
	char err[SW_ERR_MAX];

	for (size_t i = 0; i < s->n; i++) {
		struct job *j = &s->jobs[i];

		if (j->deferred)
			continue;
		if (send_job(s, j, err, sizeof(err)) != 0) {
			fprintf(stderr, "swarmctl: submit: %s\n", err);
			return 1;
		}
	}
	if (has_deferred(s) && !s->tty)
		printf("the answer over every document is queued once the documents are stored\n");
	fflush(stdout);
	return 0;
}

/* Says that agentd stopped with tasks in flight, with the last lines of
 * its log. */
static void report_agentd_gone(const struct submit *s)
{
	char log[PATH_MAX + 32], tail[2048];

	if (s->tty)
		printf("\n");
	ctl_path(s->e, "logs/agentd.log", log, sizeof(log));
	ctl_tail(log, 8, tail, sizeof(tail));
	fprintf(stderr, "swarmctl: submit: agentd stopped while its tasks were in "
		"flight; they stay queued (`swarmctl results`)%s%s%s\n",
		tail[0] ? "\nlast lines of " : "", tail[0] ? log : "", tail[0] ? ":" : "");
	if (tail[0])
		fprintf(stderr, "%s\n", tail);
}

/* What stopping early leaves behind, after the reason. */
static void report_stop(const struct submit *s, const char *why)
{
	if (s->tty)
		printf("\n");
	fprintf(stderr, "swarmctl: submit: %s; what was queued carries on (`swarmctl results` "
		"shows it)%s\n", why, has_deferred(s) && !s->jobs[s->n - 1].sent ?
		"; the answer over every document was not queued" : "");
}

/* Polls PostgreSQL (and queues the deferred answer once it may run)
 * until nothing is left to wait for. Returns SUBMIT_GO_ON then, or the
 * exit status when it stops first: an error, agentd gone, an interrupt
 * (130) or the --timeout. */
static int wait_for_tasks(struct submit *s)
{
	char err[SW_ERR_MAX];

	for (;;) {
		bool done;

		if ((s->pg && poll_state(s, err, sizeof(err)) != 0) ||
		    advance(s, &done, err, sizeof(err)) != 0) {
			if (s->tty)
				printf("\n");
			fprintf(stderr, "swarmctl: submit: %s\n", err);
			return 1;
		}
		if (s->tty)
			draw_progress(s, done);
		fflush(stdout);
		if (done)
			return SUBMIT_GO_ON;
		if (s->e->managed && !ctl_service_pid(s->e, CTL_AGENTD)) {
			report_agentd_gone(s);
			return 1;
		}
		if (interrupted) {
			report_stop(s, "interrupted");
			return 130;
		}
		if (sw_deadline_expired(s->deadline)) {
			report_stop(s, "timed out");
			return 1;
		}
		sw_sleep_ms(POLL_MS);
	}
}

/* The exit status once every task is over: 1 when a job failed (said on
 * stderr, or with --wait by the results printed), else 0. */
static int submit_outcome(struct submit *s)
{
	int status = 0;

	for (size_t i = 0; i < s->n; i++) {
		const struct job *j = &s->jobs[i];

		if (!j->failed)
			continue;
		if (!s->wait)
			fprintf(stderr, "swarmctl: submit: %s %s (%s): %s\n", kind_names[j->kind],
				j->id, j->input ? j->input : "every document",
				j->error[0] ? j->error : j->status);
		status = 1;
	}
	if (s->wait)
		status |= print_results(s);
	return status;
}

static void submit_free(struct submit *s)
{
	if (s->pg)
		PQfinish(s->pg);
	if (s->rc)
		redisFree(s->rc);
	for (size_t i = 0; i < s->n; i++)
		free(s->jobs[i].json);
	free(s->jobs);
}

int ctl_cmd_submit(struct ctl_env *e, int argc, char **argv)
{
	struct submit s = { .e = e, .kind = K_SUMMARIZE,
			    .deadline = sw_deadline_in_ms(UINT64_MAX) };
	int status;

	status = parse_submit_options(&s, argc, argv);
	if (status == SUBMIT_GO_ON)
		status = check_submit_options(&s);
	if (status != SUBMIT_GO_ON)
		return status;

	status = 1;
	if (make_jobs(&s) != 0 || open_servers(&s) != 0)
		goto out;
	s.tty = s.wait && isatty(STDOUT_FILENO);
	signal(SIGINT, on_interrupt);
	signal(SIGTERM, on_interrupt);
	s.t0_ms = sw_now_ms();
	if (queue_tasks(&s) != 0)
		goto out;
	status = 0;
	if (!s.wait && !has_deferred(&s))
		goto out; /* queued: agentd does the rest */
	status = wait_for_tasks(&s);
	if (status == SUBMIT_GO_ON)
		status = submit_outcome(&s);
out:
	submit_free(&s);
	return status;
}

int ctl_cmd_results(struct ctl_env *e, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "limit", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool as_json = false;
	const char *limit = "20";
	char err[SW_ERR_MAX];
	PGconn *pg;
	int c, status = 1;

	optind = 0;
	while ((c = getopt_long(argc, argv, "jn:h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': as_json = true; break;
		case 'n': limit = optarg; break;
		case 'h':
			printf("usage: swarmctl results [TASK_ID] [--json] [--limit N]\n");
			return 0;
		default:
			fprintf(stderr, "usage: swarmctl results [TASK_ID] [--json] [--limit N]\n");
			return EXIT_USAGE;
		}
	}
	if (argc - optind > 1 || atoi(limit) <= 0) {
		fprintf(stderr, "usage: swarmctl results [TASK_ID] [--json] [--limit N]\n");
		return EXIT_USAGE;
	}
	if (open_pg(e, &pg))
		return 1;
	if (optind < argc) {
		json_t *o;

		if (result_json(e, pg, argv[optind], &o, err, sizeof(err)) != 0) {
			fprintf(stderr, "swarmctl: %s\n", err);
			goto out;
		}
		if (as_json) {
			char *t = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);

			puts(t ? t : "{}");
			free(t);
		} else {
			print_result(o);
		}
		status = strcmp(json_string_value(json_object_get(o, "status")), "completed") != 0;
		json_decref(o);
	} else {
		const char *params[1] = { limit };
		PGresult *r;
		json_t *arr;

		if (ctl_pg_query(pg, &r, err, sizeof(err),
				"SELECT id, coalesce(kind, ''), status, attempts, coalesce(location, ''), "
				"coalesce(error, ''), created_at::text FROM tasks ORDER BY created_at "
				"DESC, id LIMIT $1::int", 1, params) != 0) {
			fprintf(stderr, "swarmctl: %s\n", err);
			if (strstr(err, "does not exist"))
				fprintf(stderr, "swarmctl: no task has run yet (agentd creates the "
					"tables when it starts)\n");
			goto out;
		}
		arr = json_array();
		for (int i = 0; i < PQntuples(r); i++)
			json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:s}",
				"id", PQgetvalue(r, i, 0), "kind", PQgetvalue(r, i, 1), "status",
				PQgetvalue(r, i, 2), "attempts", atoi(PQgetvalue(r, i, 3)),
				"location", PQgetvalue(r, i, 4), "error", PQgetvalue(r, i, 5),
				"created_at", PQgetvalue(r, i, 6)));
		PQclear(r);
		if (as_json) {
			char *t = json_dumps(arr, JSON_INDENT(2));

			puts(t ? t : "[]");
			free(t);
		} else if (!json_array_size(arr)) {
			printf("no tasks yet\n");
		} else {
			size_t i;
			json_t *v;

			printf("%-44s %-9s %-9s %4s  %s\n", "TASK", "KIND", "STATUS", "TRY",
			       "RESULT / ERROR");
			json_array_foreach(arr, i, v) {
				const char *er = json_string_value(json_object_get(v, "error"));
				const char *st = json_string_value(json_object_get(v, "status"));

				printf("%-44s %-9s %-9s %4lld  %.70s\n",
				       json_string_value(json_object_get(v, "id")),
				       json_string_value(json_object_get(v, "kind")), st,
				       (long long)json_integer_value(json_object_get(v, "attempts")),
				       strcmp(st, "completed") && er[0] ? er :
				       json_string_value(json_object_get(v, "location")));
			}
		}
		json_decref(arr);
		status = 0;
	}
out:
	PQfinish(pg);
	return status;
}

int ctl_queue_stats(const char *url, struct ctl_queue_stats *q, char *err, size_t errlen)
{
	redisContext *c;
	redisReply *r;
	int rc;

	memset(q, 0, sizeof(*q));
	q->undelivered = -1;
	q->dead = -1;
	rc = ctl_redis_open(url, 2000, &c, err, errlen);
	if (rc)
		return rc;
	rc = ctl_redis_cmd(c, &r, err, errlen, "XLEN %s", PROTO_TASK_STREAM);
	if (rc)
		goto out;
	q->length = r->integer;
	freeReplyObject(r);
	rc = ctl_redis_cmd(c, &r, err, errlen, "XLEN %s", PROTO_TASK_DEAD_STREAM);
	if (rc)
		goto out;
	q->dead_kept = r->integer;
	freeReplyObject(r);
	if (q->length == 0) {
		q->undelivered = 0;
		goto out;
	}
	/* XINFO GROUPS: pending and (Redis 7) lag of our group; none yet =
	 * nothing delivered */
	if (ctl_redis_cmd(c, &r, err, errlen, "XINFO GROUPS %s", PROTO_TASK_STREAM) != 0) {
		rc = 0;
		q->undelivered = q->length;
		goto out;
	}
	q->undelivered = q->length;
	for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
		redisReply *g = r->element[i];
		bool ours = false;

		for (size_t k = 0; g->type == REDIS_REPLY_ARRAY && k + 1 < g->elements; k += 2) {
			const char *key = g->element[k]->str;
			redisReply *v = g->element[k + 1];

			if (!key)
				continue;
			if (!strcmp(key, "name") && v->str && !strcmp(v->str, PROTO_TASK_GROUP))
				ours = true;
			else if (ours && !strcmp(key, "pending") && v->type == REDIS_REPLY_INTEGER)
				q->pending = v->integer;
			else if (ours && !strcmp(key, "lag"))
				q->undelivered = v->type == REDIS_REPLY_INTEGER ? v->integer : -1;
		}
	}
	freeReplyObject(r);
	/* Redis reports no lag once entries were deleted after the group's
	 * last read, which is the rule now that acknowledged entries are
	 * deleted: what the stream holds is then pending or waiting. */
	if (q->undelivered < 0 && q->length >= q->pending)
		q->undelivered = q->length - q->pending;
out:
	redisFree(c);
	return rc;
}

int ctl_dead_count(const char *url, int64_t *n, char *err, size_t errlen)
{
	PGconn *pg = NULL;
	PGresult *r;
	int rc;

	*n = -1;
	rc = ctl_pg_open(url, &pg, err, errlen);
	if (rc)
		return rc;
	rc = ctl_pg_query(pg, &r, err, errlen, "SELECT count(*) FROM tasks WHERE status = 'dead'",
			  0, NULL);
	if (rc && strstr(err, "does not exist")) {
		*n = 0; /* no tasks table yet: nothing died */
		rc = 0;
	} else if (!rc) {
		*n = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
		PQclear(r);
	}
	PQfinish(pg);
	return rc;
}
