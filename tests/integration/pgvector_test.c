/* pgvector_test.c - PostgreSQL + pgvector as agentd uses them (DESIGN §6,
 * "answer": top-k chunks by embedding distance), against a real server:
 * the extension, a vector(64) column with an HNSW index, parameterized
 * inserts, nearest-neighbour queries checked against a brute-force search
 * done here, and clear errors for bad SQL and bad vectors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <libpq-fe.h>

#include "tests/integration/harness.h"

#define DIM 64
#define ROWS 300
#define K 5

static float vecs[ROWS][DIM];

/* Deterministic data: splitmix64 mapped to [-1, 1). */
static uint64_t rng_state = 0x5eed5eed5eedULL;

static float rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	z ^= z >> 31;
	return (float)((double)(z >> 11) / (double)(1ULL << 53) * 2.0 - 1.0);
}

/* pgvector's text form: "[x,y,...]". */
static void vec_text(const float *v, int dim, char *buf, size_t len)
{
	size_t off = 0;

	off += (size_t)snprintf(buf + off, len - off, "[");
	for (int i = 0; i < dim && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%.9g",
					i ? "," : "", (double)v[i]);
	if (off < len)
		snprintf(buf + off, len - off, "]");
}

static double l2(const float *a, const float *b)
{
	double s = 0;

	for (int i = 0; i < DIM; i++) {
		double d = (double)a[i] - (double)b[i];
		s += d * d;
	}
	return sqrt(s);
}

/* The ids (1-based) of the K rows nearest to q, nearest first. */
static void brute_force(const float *q, int ids[K])
{
	double best[K];

	for (int k = 0; k < K; k++) {
		best[k] = INFINITY;
		ids[k] = 0;
	}
	for (int r = 0; r < ROWS; r++) {
		double d = l2(vecs[r], q);
		int k = K;

		while (k > 0 && d < best[k - 1])
			k--;
		if (k == K)
			continue;
		memmove(best + k + 1, best + k, (size_t)(K - 1 - k) * sizeof(*best));
		memmove(ids + k + 1, ids + k, (size_t)(K - 1 - k) * sizeof(*ids));
		best[k] = d;
		ids[k] = r + 1;
	}
}

static void exec_ok(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
		fail_msg("%s: %s", sql, PQerrorMessage(c));
	PQclear(r);
}

static int conn_setup(void **state)
{
	PGconn *c = PQconnectdb(it_pg_url());

	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "connect: %s", PQerrorMessage(c));
		PQfinish(c);
		return -1;
	}
	PQclear(PQexec(c, "SET client_min_messages = warning"));
	*state = c;
	return 0;
}

static int conn_teardown(void **state)
{
	PQfinish(*state);
	return 0;
}

/* Creates the extension and a temporary table (gone with the session),
 * filled through a parameterized INSERT. */
static void make_table(PGconn *c)
{
	char text[DIM * 20];
	char idbuf[16];
	const char *params[2] = { idbuf, text };
	PGresult *r;

	exec_ok(c, "CREATE EXTENSION IF NOT EXISTS vector");
	exec_ok(c, "CREATE TEMP TABLE chunks (id int PRIMARY KEY, "
		   "embedding vector(64) NOT NULL)");
	for (int i = 0; i < ROWS; i++) {
		snprintf(idbuf, sizeof(idbuf), "%d", i + 1);
		vec_text(vecs[i], DIM, text, sizeof(text));
		r = PQexecParams(c, "INSERT INTO chunks (id, embedding) "
				    "VALUES ($1::int, $2::vector)",
				 2, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(r) != PGRES_COMMAND_OK)
			fail_msg("insert %d: %s", i + 1, PQerrorMessage(c));
		assert_string_equal(PQcmdTuples(r), "1");
		PQclear(r);
	}
	exec_ok(c, "CREATE INDEX chunks_hnsw ON chunks "
		   "USING hnsw (embedding vector_l2_ops)");
}

/* Runs the top-K query for q; writes the ids and the first distance. */
static void query_topk(PGconn *c, const float *q, int ids[K], double *d0)
{
	char text[DIM * 20], kbuf[8];
	const char *params[2] = { text, kbuf };
	PGresult *r;

	vec_text(q, DIM, text, sizeof(text));
	snprintf(kbuf, sizeof(kbuf), "%d", K);
	r = PQexecParams(c, "SELECT id, embedding <-> $1::vector AS dist "
			    "FROM chunks ORDER BY embedding <-> $1::vector LIMIT $2::int",
			 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		fail_msg("top-k: %s", PQerrorMessage(c));
	assert_int_equal(PQntuples(r), K);
	for (int k = 0; k < K; k++)
		ids[k] = atoi(PQgetvalue(r, k, 0));
	*d0 = strtod(PQgetvalue(r, 0, 1), NULL);
	PQclear(r);
}

static void test_extension_version(void **state)
{
	PGconn *c = *state;
	PGresult *r;

	exec_ok(c, "CREATE EXTENSION IF NOT EXISTS vector");
	r = PQexec(c, "SELECT extversion FROM pg_extension WHERE extname = 'vector'");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	assert_int_equal(PQntuples(r), 1);
	/* HNSW needs pgvector >= 0.5; setup installs 0.8.x. */
	printf("pgvector %s\n", PQgetvalue(r, 0, 0));
	assert_true(strncmp(PQgetvalue(r, 0, 0), "0.", 2) == 0);
	assert_true(atoi(PQgetvalue(r, 0, 0) + 2) >= 5);
	PQclear(r);
}

static void test_nearest_neighbours(void **state)
{
	PGconn *c = *state;
	float q[DIM];
	int want[K], got[K];
	double d0;
	PGresult *r;

	make_table(c);

	/* The plan must really use the HNSW index. ef_search >= ROWS makes
	 * the graph search exhaustive, so its answer is exact. */
	exec_ok(c, "SET enable_seqscan = off");
	exec_ok(c, "SET hnsw.ef_search = 400");
	r = PQexec(c, "EXPLAIN SELECT id FROM chunks ORDER BY embedding <-> "
		      "(SELECT embedding FROM chunks WHERE id = 1) LIMIT 5");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	bool uses_index = false;
	for (int i = 0; i < PQntuples(r); i++)
		uses_index |= strstr(PQgetvalue(r, i, 0), "chunks_hnsw") != NULL;
	PQclear(r);
	assert_true(uses_index);

	/* Queries near a stored row, and one far from all. */
	for (int t = 0; t < 8; t++) {
		const float *base = vecs[(t * 37) % ROWS];

		for (int i = 0; i < DIM; i++)
			q[i] = t == 7 ? 3.0f * rnd() : base[i] + 0.05f * rnd();
		brute_force(q, want);
		query_topk(c, q, got, &d0);
		for (int k = 0; k < K; k++)
			assert_int_equal(got[k], want[k]);
		assert_true(fabs(d0 - l2(vecs[want[0] - 1], q)) < 1e-4);
	}

	/* A stored vector is its own nearest neighbour, at distance 0. */
	query_topk(c, vecs[41], got, &d0);
	assert_int_equal(got[0], 42);
	assert_true(d0 < 1e-6);
}

static void test_bad_sql(void **state)
{
	PGconn *c = *state;
	PGresult *r = PQexec(c, "SELEC id FROM chunks");

	assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
	assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42601");
	assert_non_null(strstr(PQresultErrorMessage(r), "syntax error"));
	PQclear(r);

	/* The connection survives a failed statement. */
	exec_ok(c, "SELECT 1");
}

static void test_bad_vectors(void **state)
{
	PGconn *c = *state;
	const char *params[1];
	PGresult *r;

	exec_ok(c, "CREATE EXTENSION IF NOT EXISTS vector");
	exec_ok(c, "CREATE TEMP TABLE v (e vector(64))");

	/* Wrong dimension: refused, and the message says why. */
	params[0] = "[1,2,3]";
	r = PQexecParams(c, "INSERT INTO v VALUES ($1::vector)", 1, NULL, params,
			 NULL, NULL, 0);
	assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
	assert_non_null(strstr(PQresultErrorMessage(r), "expected 64 dimensions, not 3"));
	PQclear(r);

	/* Malformed text. */
	params[0] = "[1,,2]";
	r = PQexecParams(c, "SELECT $1::vector", 1, NULL, params, NULL, NULL, 0);
	assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
	assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22P02");
	PQclear(r);

	r = PQexec(c, "SELECT count(*) FROM v");
	assert_string_equal(PQgetvalue(r, 0, 0), "0");
	PQclear(r);
}

static void test_unreachable_server(void **state)
{
	(void)state;
	/* Port 1 on loopback: connection refused, with a message. */
	PGconn *c = PQconnectdb("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2");

	assert_int_equal(PQstatus(c), CONNECTION_BAD);
	assert_true(strlen(PQerrorMessage(c)) > 0);
	PQfinish(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_extension_version,
						conn_setup, conn_teardown),
		cmocka_unit_test_setup_teardown(test_nearest_neighbours,
						conn_setup, conn_teardown),
		cmocka_unit_test_setup_teardown(test_bad_sql,
						conn_setup, conn_teardown),
		cmocka_unit_test_setup_teardown(test_bad_vectors,
						conn_setup, conn_teardown),
		cmocka_unit_test(test_unreachable_server),
	};
	int rc = it_start(IT_PG);

	if (rc != 0)
		return rc;
	for (int r = 0; r < ROWS; r++)
		for (int i = 0; i < DIM; i++)
			vecs[r][i] = rnd();
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	it_stop();
	return rc;
}
