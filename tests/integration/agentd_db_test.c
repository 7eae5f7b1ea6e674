/* agentd_db_test.c - agentd/db.c against a real PostgreSQL + pgvector:
 * migrations (twice, and four connections at once), idempotent task,
 * document, chunk, summary and answer writes, the embedding column made
 * at first use (vector and halfvec), top-k, SQL errors and a connection
 * killed under the worker.
 *
 * Each test gets a database of its own (CREATE DATABASE agentd_it_...),
 * dropped at the end, so the tables never meet another test's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "agentd/db.h"
#include "common/err.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

#define SQL_DIR "config/sql"

struct fx {
	char name[64];
	char url[1024];
	struct agent_db *db;
};

static int db_counter;

/* The harness URL with its database replaced by name. */
static void url_with_db(const char *base, const char *name, char *out, size_t len)
{
	const char *slash = strstr(base, "://");
	const char *path = slash ? strchr(slash + 3, '/') : NULL;
	const char *query = path ? strchr(path, '?') : NULL;

	assert_non_null(path);
	snprintf(out, len, "%.*s/%s%s", (int)(path - base), base, name, query ? query : "");
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char sql[128], err[SW_ERR_MAX];

	snprintf(f->name, sizeof(f->name), "agentd_it_%d_%d", (int)getpid(), db_counter++);
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", f->name);
	at_admin(sql);
	url_with_db(it_pg_url(), f->name, f->url, sizeof(f->url));
	if (agent_db_open(&f->db, f->url, err, sizeof(err)) != 0) {
		fprintf(stderr, "open: %s\n", err);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char sql[128];

	agent_db_close(f->db);
	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", f->name);
	at_admin(sql);
	free(f);
	return 0;
}

static void migrate_ok(struct agent_db *db)
{
	char err[SW_ERR_MAX];
	int rc = agent_db_migrate(db, SQL_DIR, NULL, err, sizeof(err));

	if (rc)
		fail_msg("migrate: %s", err);
}

static long long scalar(struct agent_db *db, const char *sql)
{
	char err[SW_ERR_MAX];
	PGresult *r;
	long long v;

	if (agent_db_exec(db, sql, 0, NULL, &r, err, sizeof(err)) != 0)
		fail_msg("%s: %s", sql, err);
	assert_int_equal(PQntuples(r), 1);
	v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return v;
}

static void test_migrate_twice(void **state)
{
	struct fx *f = *state;
	char err[SW_ERR_MAX];
	int applied = -1;

	assert_int_equal(agent_db_migrate(f->db, SQL_DIR, &applied, err, sizeof(err)), 0);
	assert_true(applied >= 1);
	assert_int_equal(scalar(f->db, "SELECT count(*) FROM schema_migrations"), applied);
	assert_int_equal(agent_db_migrate(f->db, SQL_DIR, &applied, err, sizeof(err)), 0);
	assert_int_equal(applied, 0);
	assert_int_equal(scalar(f->db,
				"SELECT count(*) FROM information_schema.tables WHERE table_name IN"
				" ('tasks','documents','chunks','summaries','answers','embedding_space')"),
			 6);
}

struct racer {
	const char *url;
	int applied;
	int rc;
	char err[SW_ERR_MAX];
	pthread_barrier_t *go;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	struct agent_db *db;

	r->rc = agent_db_open(&db, r->url, r->err, sizeof(r->err));
	pthread_barrier_wait(r->go);
	if (r->rc == 0) {
		r->rc = agent_db_migrate(db, SQL_DIR, &r->applied, r->err, sizeof(r->err));
		agent_db_close(db);
	}
	return NULL;
}

static void test_migrate_concurrently(void **state)
{
	struct fx *f = *state;
	struct racer r[4];
	pthread_t t[4];
	pthread_barrier_t go;
	int total = 0;

	pthread_barrier_init(&go, NULL, 4);
	for (int i = 0; i < 4; i++) {
		r[i] = (struct racer){ .url = f->url, .go = &go };
		assert_int_equal(pthread_create(&t[i], NULL, race, &r[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		if (r[i].rc)
			fail_msg("racer %d: %s", i, r[i].err);
		total += r[i].applied;
	}
	pthread_barrier_destroy(&go);
	/* Every file applied exactly once, by whichever racer got there. */
	assert_int_equal(total, scalar(f->db, "SELECT count(*) FROM schema_migrations"));
	assert_true(total >= 1);
}

static void write_file(const char *path, const char *text)
{
	FILE *fp = fopen(path, "w");

	assert_non_null(fp);
	fputs(text, fp);
	fclose(fp);
}

static void test_migrate_errors(void **state)
{
	struct fx *f = *state;
	char dir[] = "/tmp/agentd_mig_XXXXXX", path[256], err[SW_ERR_MAX];
	int applied = -1;

	assert_int_equal(agent_db_migrate(f->db, "/nonexistent/sql", NULL, err, sizeof(err)),
			 -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/sql"));

	assert_non_null(mkdtemp(dir));
	assert_int_equal(agent_db_migrate(f->db, dir, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "no migration"));

	snprintf(path, sizeof(path), "%s/001_a.sql", dir);
	write_file(path, "CREATE TABLE mig_a (x int);");
	snprintf(path, sizeof(path), "%s/002_bad.sql", dir);
	write_file(path, "CREATE TABLE mig_b (x int); SELEC 1;");
	snprintf(path, sizeof(path), "%s/README", dir);
	write_file(path, "not a migration");
	assert_int_equal(agent_db_migrate(f->db, dir, &applied, err, sizeof(err)), -EIO);
	assert_non_null(strstr(err, "002_bad.sql: postgres: SQLSTATE 42601"));
	/* 001 stays applied; 002 rolled back entirely (mig_b is gone too). */
	assert_int_equal(scalar(f->db, "SELECT count(*) FROM schema_migrations"), 1);
	assert_int_equal(scalar(f->db, "SELECT count(*) FROM pg_tables WHERE tablename = 'mig_b'"),
			 0);

	snprintf(path, sizeof(path), "%s/02_dup.sql", dir);
	write_file(path, "SELECT 1;");
	assert_int_equal(agent_db_migrate(f->db, dir, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "same number 2"));

	snprintf(path, sizeof(path), "rm -rf %s", dir);
	assert_int_equal(system(path), 0);
}

static void test_tasks(void **state)
{
	struct fx *f = *state;
	enum agent_task_status st, prev;
	char err[SW_ERR_MAX], error[64], loc[64];
	int attempts;

	migrate_ok(f->db);
	assert_int_equal(agent_db_task_start(f->db, "t1", "ingest", "1-0", &prev, &attempts, err,
					     sizeof(err)),
			 0);
	assert_int_equal(prev, AGENT_TASK_RUNNING);
	assert_int_equal(attempts, 1);
	assert_int_equal(agent_db_task_finish(f->db, "t1", AGENT_TASK_RUNNING, "gpud down", NULL,
					      err, sizeof(err)),
			 0);
	assert_int_equal(agent_db_task_start(f->db, "t1", NULL, "1-0", &prev, &attempts, err,
					     sizeof(err)),
			 0);
	assert_int_equal(prev, AGENT_TASK_RUNNING);
	assert_int_equal(attempts, 2);
	assert_int_equal(agent_db_task_finish(f->db, "t1", AGENT_TASK_COMPLETED, NULL,
					      "documents/7", err, sizeof(err)),
			 0);
	/* A redelivery of finished work keeps the final status. */
	assert_int_equal(agent_db_task_start(f->db, "t1", "ingest", "1-0", &prev, &attempts, err,
					     sizeof(err)),
			 0);
	assert_int_equal(prev, AGENT_TASK_COMPLETED);
	assert_int_equal(attempts, 3);
	assert_int_equal(agent_db_task_get(f->db, "t1", &st, &attempts, error, sizeof(error), loc,
					   sizeof(loc), err, sizeof(err)),
			 0);
	assert_int_equal(st, AGENT_TASK_COMPLETED);
	assert_string_equal(error, "gpud down"); /* the last error stays */
	assert_string_equal(loc, "documents/7");
	assert_string_equal(agent_task_status_name(AGENT_TASK_DEAD), "dead");

	assert_int_equal(agent_db_task_get(f->db, "nope", &st, NULL, NULL, 0, NULL, 0, err,
					   sizeof(err)),
			 SW_ENOTFOUND);
	assert_int_equal(agent_db_task_finish(f->db, "nope", AGENT_TASK_FAILED, "x", NULL, err,
					      sizeof(err)),
			 SW_ENOTFOUND);
	assert_int_equal(scalar(f->db, "SELECT count(*) FROM tasks"), 1);
}

static void test_documents_chunks_topk(void **state)
{
	struct fx *f = *state;
	static const char text[] = "the quick brown fox";
	float e[3][8] = { { 1, 0, 0, 0, 0, 0, 0, 0 },
			  { 0, 1, 0, 0, 0, 0, 0, 0 },
			  { 0.9f, 0.1f, 0, 0, 0, 0, 0, 0 } };
	float q[8] = { 1, 0.05f, 0, 0, 0, 0, 0, 0 };
	char err[SW_ERR_MAX];
	int64_t id, id2;
	uint32_t dim;
	bool created;
	PGresult *r;

	migrate_ok(f->db);
	assert_int_equal(agent_db_doc_find(f->db, text, strlen(text), &id, err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_int_equal(agent_db_doc_insert(f->db, "t1", "inline", text, strlen(text), 3, &id,
					     &created, err, sizeof(err)),
			 0);
	assert_true(created);
	assert_int_equal(agent_db_doc_insert(f->db, "t2", "inline", text, strlen(text), 3, &id2,
					     &created, err, sizeof(err)),
			 0);
	assert_false(created);
	assert_int_equal(id2, id);
	assert_int_equal(agent_db_doc_find(f->db, text, strlen(text), &id2, err, sizeof(err)), 0);
	assert_int_equal(id2, id);
	assert_int_equal(agent_db_doc_insert(f->db, "t3", "inline", "a\0b", 3, 1, &id2, &created,
					     err, sizeof(err)),
			 -EINVAL);

	/* No width yet: embeddings are refused, plain chunks are fine. */
	assert_int_equal(agent_db_embedding_dim(f->db, &dim, err, sizeof(err)), 0);
	assert_int_equal(dim, 0);
	assert_int_equal(agent_db_topk(f->db, q, 8, 2, 0, &r, err, sizeof(err)), SW_ENOTFOUND);
	assert_int_equal(agent_db_embedding_prepare(f->db, 0, err, sizeof(err)), -EINVAL);
	assert_int_equal(agent_db_embedding_prepare(f->db, 5000, err, sizeof(err)), SW_EUNSUPPORTED);
	assert_int_equal(agent_db_embedding_prepare(f->db, 8, err, sizeof(err)), 0);
	assert_int_equal(agent_db_embedding_prepare(f->db, 8, err, sizeof(err)), 0);
	assert_int_equal(agent_db_embedding_prepare(f->db, 16, err, sizeof(err)), SW_EUNSUPPORTED);
	assert_non_null(strstr(err, "holds width 8, gpud reports 16"));
	assert_int_equal(scalar(f->db,
				"SELECT count(*) FROM pg_indexes WHERE indexname = 'chunks_embedding_hnsw'"),
			 1);

	for (int i = 0; i < 3; i++) {
		char t[24];

		snprintf(t, sizeof(t), "chunk %d", i);
		assert_int_equal(agent_db_chunk_insert(f->db, id, i, t, 4, e[i], 8, err,
						       sizeof(err)),
				 0);
		/* Redelivered: the same (document, position) is not stored twice. */
		assert_int_equal(agent_db_chunk_insert(f->db, id, i, "other", 4, e[i], 8, err,
						       sizeof(err)),
				 0);
	}
	assert_int_equal(agent_db_chunk_insert(f->db, id, 9, "x", 1, e[0], 4, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(scalar(f->db, "SELECT count(*) FROM chunks"), 3);

	assert_int_equal(agent_db_topk(f->db, q, 8, 2, 0, &r, err, sizeof(err)), 0);
	assert_int_equal(PQntuples(r), 2);
	assert_string_equal(PQgetvalue(r, 0, 2), "chunk 0");
	assert_string_equal(PQgetvalue(r, 1, 2), "chunk 2");
	PQclear(r);
	assert_int_equal(agent_db_topk(f->db, q, 8, 5, id + 1000, &r, err, sizeof(err)), 0);
	assert_int_equal(PQntuples(r), 0);
	PQclear(r);
	assert_int_equal(agent_db_topk(f->db, q, 4, 2, 0, &r, err, sizeof(err)), -EINVAL);
	assert_null(r);

	assert_int_equal(agent_db_chunks(f->db, id, &r, err, sizeof(err)), 0);
	assert_int_equal(PQntuples(r), 3);
	assert_string_equal(PQgetvalue(r, 2, 2), "chunk 2");
	PQclear(r);
	assert_int_equal(agent_db_chunks(f->db, id + 1000, &r, err, sizeof(err)), SW_ENOTFOUND);
}

/* The k nearest of one document are found however far that document is
 * from the question. With a far document of 2000 chunks beside 19 near
 * ones of 100, the planner read "nearest of the far document" through the
 * HNSW index, filtering afterwards, and the index's ef_search (40)
 * nearest are all of the near documents: that search found none (what
 * the soak found: "answer: no chunk to retrieve in that document"). */
static void test_topk_far_document(void **state)
{
	struct fx *f = *state;
	enum { DOCS = 20, N = 100, N_FAR = 2000 };
	float e[8], q[8] = { 1, 0, 0, 0, 0, 0, 0, 0 };
	char err[SW_ERR_MAX], t[32];
	int64_t doc = 0, far = 0;
	bool created;
	PGresult *r;

	migrate_ok(f->db);
	assert_int_equal(agent_db_embedding_prepare(f->db, 8, err, sizeof(err)), 0);
	assert_int_equal(agent_db_exec(f->db, "BEGIN", 0, NULL, NULL, err, sizeof(err)), 0);
	for (int d = 0; d < DOCS; d++) {
		snprintf(t, sizeof(t), "document %d", d);
		assert_int_equal(agent_db_doc_insert(f->db, t, "inline", t, strlen(t), N, &doc,
						     &created, err, sizeof(err)),
				 0);
		for (int i = 0; i < (d == DOCS - 1 ? N_FAR : N); i++) {
			memset(e, 0, sizeof(e));
			if (d == DOCS - 1) {
				/* cosine distance 0.9 and more, rising with i */
				e[0] = 0.1f - 0.00004f * (float)i;
				e[2] = 1;
				snprintf(t, sizeof(t), "far %d", i);
			} else {
				e[0] = 1;
				e[1] = 0.001f * (float)(d * N + i);
				snprintf(t, sizeof(t), "near %d.%d", d, i);
			}
			assert_int_equal(agent_db_chunk_insert(f->db, doc, i, t, 2, e, 8, err,
							       sizeof(err)),
					 0);
		}
		far = doc;
	}
	assert_int_equal(agent_db_exec(f->db, "COMMIT", 0, NULL, NULL, err, sizeof(err)), 0);
	assert_int_equal(agent_db_exec(f->db, "ANALYZE chunks", 0, NULL, NULL, err, sizeof(err)), 0);

	assert_int_equal(agent_db_topk(f->db, q, 8, 3, far, &r, err, sizeof(err)), 0);
	assert_int_equal(PQntuples(r), 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(strtoll(PQgetvalue(r, i, 1), NULL, 10), far);
	assert_string_equal(PQgetvalue(r, 0, 2), "far 0"); /* the nearest of them */
	PQclear(r);
	/* Over every document the near ones' chunks come first. */
	assert_int_equal(agent_db_topk(f->db, q, 8, 3, 0, &r, err, sizeof(err)), 0);
	assert_int_equal(PQntuples(r), 3);
	assert_string_equal(PQgetvalue(r, 0, 2), "near 0.0");
	PQclear(r);
}

static void test_halfvec(void **state)
{
	struct fx *f = *state;
	enum { D = 2048 };
	static float v[D], q[D];
	char err[SW_ERR_MAX];
	int64_t id;
	bool created;
	PGresult *r;

	migrate_ok(f->db);
	assert_int_equal(agent_db_embedding_prepare(f->db, D, err, sizeof(err)), 0);
	assert_int_equal(scalar(f->db,
				"SELECT count(*) FROM information_schema.columns WHERE table_name ="
				" 'chunks' AND column_name = 'embedding' AND udt_name = 'halfvec'"),
			 1);
	assert_int_equal(agent_db_doc_insert(f->db, "h", "inline", "wide", 4, 1, &id, &created, err,
					     sizeof(err)),
			 0);
	v[3] = 1;
	q[3] = 0.5f;
	q[4] = 0.1f;
	assert_int_equal(agent_db_chunk_insert(f->db, id, 0, "wide", 1, v, D, err, sizeof(err)), 0);
	assert_int_equal(agent_db_topk(f->db, q, D, 1, id, &r, err, sizeof(err)), 0);
	assert_int_equal(PQntuples(r), 1);
	assert_string_equal(PQgetvalue(r, 0, 2), "wide");
	PQclear(r);
}

static void test_summaries_answers(void **state)
{
	struct fx *f = *state;
	const int64_t ids[3] = { 5, 3, 9 };
	char err[SW_ERR_MAX], *text;
	int64_t id;
	bool created;
	PGresult *r;

	migrate_ok(f->db);
	assert_int_equal(agent_db_doc_insert(f->db, "t", "inline", "doc", 3, 1, &id, &created, err,
					     sizeof(err)),
			 0);
	assert_int_equal(agent_db_summary_get(f->db, id, 0, 0, &text, err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_null(text);
	assert_int_equal(agent_db_summary_put(f->db, id, 0, 0, "first", false, "s1", err,
					      sizeof(err)),
			 0);
	assert_int_equal(agent_db_summary_put(f->db, id, 0, 0, "second", false, "s2", err,
					      sizeof(err)),
			 0);
	assert_int_equal(agent_db_summary_get(f->db, id, 0, 0, &text, err, sizeof(err)), 0);
	assert_string_equal(text, "first");
	free(text);
	assert_int_equal(scalar(f->db, "SELECT count(*) FROM summaries"), 1);

	assert_int_equal(agent_db_answer_put(f->db, "a1", "why?", "because", ids, 3, err,
					     sizeof(err)),
			 0);
	assert_int_equal(agent_db_answer_put(f->db, "a1", "why?", "again", ids, 1, err,
					     sizeof(err)),
			 0);
	assert_int_equal(agent_db_exec(f->db, "SELECT text, chunk_ids FROM answers", 0, NULL, &r,
				       err, sizeof(err)),
			 0);
	assert_int_equal(PQntuples(r), 1);
	assert_string_equal(PQgetvalue(r, 0, 0), "because");
	assert_string_equal(PQgetvalue(r, 0, 1), "{5,3,9}");
	PQclear(r);
	assert_int_equal(agent_db_answer_put(f->db, "a2", "none?", "no chunks", NULL, 0, err,
					     sizeof(err)),
			 0);
}

static void test_errors_and_reconnect(void **state)
{
	struct fx *f = *state;
	struct agent_db *bad;
	char err[SW_ERR_MAX], sql[256];
	PGresult *r;

	assert_int_equal(agent_db_exec(f->db, "SELEC 1", 0, NULL, &r, err, sizeof(err)), -EIO);
	assert_null(r);
	assert_non_null(strstr(err, "SQLSTATE 42601"));
	/* A failed transaction rolls back; the connection stays usable. */
	assert_int_equal(agent_db_begin(f->db, err, sizeof(err)), 0);
	assert_int_equal(agent_db_exec(f->db, "SELECT 1/0", 0, NULL, NULL, err, sizeof(err)), -EIO);
	agent_db_rollback(f->db);
	assert_int_equal(scalar(f->db, "SELECT 41 + 1"), 42);

	/* The server ends our backend: SW_ECLOSED, then a reconnect works. */
	snprintf(sql, sizeof(sql),
		 "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '%s'",
		 f->name);
	{
		PGconn *c = PQconnectdb(it_pg_url());

		PQclear(PQexec(c, sql));
		PQfinish(c);
	}
	assert_int_equal(agent_db_exec(f->db, "SELECT 1", 0, NULL, NULL, err, sizeof(err)),
			 SW_ECLOSED);
	assert_non_null(strstr(err, "postgres: "));
	assert_false(agent_db_ok(f->db));
	assert_int_equal(agent_db_exec(f->db, "SELECT 1", 0, NULL, NULL, err, sizeof(err)),
			 SW_ECLOSED);
	assert_int_equal(agent_db_reconnect(f->db, err, sizeof(err)), 0);
	assert_int_equal(scalar(f->db, "SELECT 2"), 2);

	assert_int_equal(agent_db_open(&bad, "postgresql://nobody:secret@127.0.0.1:1/x", err,
				       sizeof(err)),
			 SW_ECLOSED);
	assert_null(bad);
	assert_null(strstr(err, "secret"));
	assert_non_null(strstr(err, "cannot connect"));
	agent_db_close(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_migrate_twice, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_concurrently, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tasks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_documents_chunks_topk, setup, teardown),
		cmocka_unit_test_setup_teardown(test_topk_far_document, setup, teardown),
		cmocka_unit_test_setup_teardown(test_halfvec, setup, teardown),
		cmocka_unit_test_setup_teardown(test_summaries_answers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_errors_and_reconnect, setup, teardown),
	};
	int rc = it_start(IT_PG);

	if (rc)
		return rc;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
