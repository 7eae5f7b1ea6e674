/* db.c - PostgreSQL for agentd: connection, migrations, statements.
 *
 * Only parameterized statements. The two places that build SQL text
 * (a migration file; the embedding column whose width is a type
 * modifier) paste no value from a task: a file from config/sql/, and an
 * integer width checked against the limits.
 */
#include "agentd/db.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/secret.h"

/* Advisory lock keys (any constant; "swarm" in ASCII, then 1, 2). */
#define LOCK_MIGRATE 0x737761726d01LL
#define LOCK_EMBEDDING 0x737761726d02LL

#define MAX_MIGRATIONS 256
#define MIGRATION_MAX_BYTES (4u << 20)

struct agent_db {
	PGconn *conn;
	char *url;
	uint32_t dim;       /* embedding width, 0 = not known yet */
	bool vec_half;      /* embedding is halfvec */
	bool dim_checked;   /* embedding_space read at least once */
};

const char *agent_task_status_name(enum agent_task_status s)
{
	static const char *const names[] = { "running", "completed", "failed", "dead" };

	return (unsigned)s < 4 ? names[s] : "unknown";
}

static int status_parse(const char *s, enum agent_task_status *out)
{
	for (int i = 0; i < 4; i++)
		if (strcmp(s, agent_task_status_name((enum agent_task_status)i)) == 0) {
			*out = (enum agent_task_status)i;
			return 0;
		}
	return -EINVAL;
}

/* Server notices ("relation exists, skipping") go to the debug log. */
static void notice_to_log(void *arg, const char *msg)
{
	log_debug("postgres: %s", msg);
}

/* libpq messages end with a newline; drop it for ours. */
static const char *pq_msg(PGconn *c)
{
	static __thread char buf[SW_ERR_MAX];
	size_t n;

	snprintf(buf, sizeof(buf), "%s", c ? PQerrorMessage(c) : "no connection");
	n = strlen(buf);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return buf;
}

static int connect_now(struct agent_db *db, char *err, size_t errlen)
{
	/* a stored password (common/secret.h) follows dbname, so it wins
	 * over the URL's; libpq ignores a NULL value */
	static const char *const keys[] = { "dbname", "connect_timeout", "application_name",
					    "password", NULL };
	const char *vals[] = { db->url, "5", "agentd", sw_secret_pg()[0] ? sw_secret_pg() : NULL,
			       NULL };
	char red[256];

	PQfinish(db->conn);
	db->conn = PQconnectdbParams(keys, vals, 1);
	if (!db->conn)
		return sw_seterr(err, errlen, -ENOMEM, "postgres: out of memory");
	if (PQstatus(db->conn) != CONNECTION_OK) {
		sw_config_redact_url(db->url, red, sizeof(red));
		return sw_seterr(err, errlen, SW_ECLOSED, "postgres: cannot connect to %s: %s",
				 red, pq_msg(db->conn));
	}
	PQsetNoticeProcessor(db->conn, notice_to_log, NULL);
	return 0;
}

int agent_db_open(struct agent_db **out, const char *url, char *err, size_t errlen)
{
	struct agent_db *db;
	int rc;

	*out = NULL;
	if (!url)
		return sw_seterr(err, errlen, -EINVAL, "postgres: no URL");
	db = calloc(1, sizeof(*db));
	if (!db)
		return sw_seterr(err, errlen, -ENOMEM, "postgres: out of memory");
	db->url = strdup(url);
	if (!db->url) {
		free(db);
		return sw_seterr(err, errlen, -ENOMEM, "postgres: out of memory");
	}
	rc = connect_now(db, err, errlen);
	if (rc) {
		agent_db_close(db);
		return rc;
	}
	*out = db;
	return 0;
}

void agent_db_close(struct agent_db *db)
{
	if (!db)
		return;
	PQfinish(db->conn);
	free(db->url);
	free(db);
}

bool agent_db_ok(const struct agent_db *db)
{
	return db && db->conn && PQstatus(db->conn) == CONNECTION_OK;
}

int agent_db_reconnect(struct agent_db *db, char *err, size_t errlen)
{
	if (agent_db_ok(db))
		return 0;
	return connect_now(db, err, errlen);
}

/* Turns a failed result into SW_ECLOSED (connection gone: status BAD, or
 * SQLSTATE class 08 / 57P0x) or -EIO with the SQLSTATE. */
static int result_error(struct agent_db *db, PGresult *r, char *err, size_t errlen)
{
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;

	if (PQstatus(db->conn) != CONNECTION_OK || !state || strncmp(state, "08", 2) == 0 ||
	    strncmp(state, "57P0", 4) == 0)
		return sw_seterr(err, errlen, SW_ECLOSED, "postgres: connection lost: %s",
				 msg ? msg : pq_msg(db->conn));
	return sw_seterr(err, errlen, -EIO, "postgres: SQLSTATE %s: %s", state,
			 msg ? msg : pq_msg(db->conn));
}

int agent_db_exec(struct agent_db *db, const char *sql, int n_params, const char *const *params,
		  PGresult **res, char *err, size_t errlen)
{
	ExecStatusType st;
	PGresult *r;
	int rc;

	if (res)
		*res = NULL;
	if (!agent_db_ok(db))
		return sw_seterr(err, errlen, SW_ECLOSED, "postgres: not connected");
	r = PQexecParams(db->conn, sql, n_params, NULL, params, NULL, NULL, 0);
	st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		rc = result_error(db, r, err, errlen);
		PQclear(r);
		return rc;
	}
	if (res)
		*res = r;
	else
		PQclear(r);
	return 0;
}

/* A statement without parameters, possibly several (PQexec). */
static int exec_simple(struct agent_db *db, const char *sql, char *err, size_t errlen)
{
	ExecStatusType st;
	PGresult *r;
	int rc = 0;

	if (!agent_db_ok(db))
		return sw_seterr(err, errlen, SW_ECLOSED, "postgres: not connected");
	r = PQexec(db->conn, sql);
	st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
		rc = result_error(db, r, err, errlen);
	PQclear(r);
	return rc;
}

int agent_db_begin(struct agent_db *db, char *err, size_t errlen)
{
	return exec_simple(db, "BEGIN", err, errlen);
}

int agent_db_commit(struct agent_db *db, char *err, size_t errlen)
{
	return exec_simple(db, "COMMIT", err, errlen);
}

void agent_db_rollback(struct agent_db *db)
{
	if (agent_db_ok(db) && PQtransactionStatus(db->conn) != PQTRANS_IDLE)
		PQclear(PQexec(db->conn, "ROLLBACK"));
}

/* --- migrations ------------------------------------------------------------- */

struct migration {
	long version;
	char name[256];
};

static int migration_cmp(const void *a, const void *b)
{
	const struct migration *x = a, *y = b;

	return (x->version > y->version) - (x->version < y->version);
}

/* "<digits>_<anything>.sql" -> version; -1 when the name does not match. */
static long migration_version(const char *name)
{
	size_t n = strlen(name), d = strspn(name, "0123456789");

	if (d == 0 || d > 9 || name[d] != '_' || n < d + 5 || strcmp(name + n - 4, ".sql") != 0)
		return -1;
	return strtol(name, NULL, 10);
}

static int read_file(const char *path, char **out, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;
	int rc;

	if (!f)
		return sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
		rc = -errno;
		fclose(f);
		return sw_seterr(err, errlen, rc, "%s: %s", path, strerror(-rc));
	}
	if ((unsigned long)len > MIGRATION_MAX_BYTES) {
		fclose(f);
		return sw_seterr(err, errlen, SW_ETOOLONG, "%s: larger than %u bytes", path,
				 MIGRATION_MAX_BYTES);
	}
	buf = malloc((size_t)len + 1);
	if (!buf) {
		fclose(f);
		return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", path);
	}
	if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
		free(buf);
		fclose(f);
		return sw_seterr(err, errlen, -EIO, "%s: short read", path);
	}
	fclose(f);
	buf[len] = '\0';
	*out = buf;
	return 0;
}

/* Applies one migration in its own transaction unless recorded. Sets
 * *done when this call applied it. */
static int migrate_one(struct agent_db *db, const char *dir, const struct migration *m,
		       bool *done, char *err, size_t errlen)
{
	char path[4096], ver[32], lock[32], e[SW_ERR_MAX];
	const char *params[2] = { ver, m->name };
	const char *lockp[1] = { lock };
	char *sql = NULL;
	PGresult *r;
	int rc;

	*done = false;
	snprintf(path, sizeof(path), "%s/%s", dir, m->name);
	snprintf(ver, sizeof(ver), "%ld", m->version);
	snprintf(lock, sizeof(lock), "%lld", LOCK_MIGRATE);
	rc = read_file(path, &sql, err, errlen);
	if (rc)
		return rc;
	rc = agent_db_begin(db, err, errlen);
	if (rc)
		goto out_free;
	rc = agent_db_exec(db, "SELECT pg_advisory_xact_lock($1::bigint)", 1, lockp, NULL, err,
			   errlen);
	if (rc)
		goto out_rollback;
	rc = exec_simple(db,
			 "CREATE TABLE IF NOT EXISTS schema_migrations ("
			 " version integer PRIMARY KEY, name text NOT NULL,"
			 " applied_at timestamptz NOT NULL DEFAULT now())",
			 err, errlen);
	if (rc)
		goto out_rollback;
	rc = agent_db_exec(db, "SELECT 1 FROM schema_migrations WHERE version = $1", 1, params,
			   &r, err, errlen);
	if (rc)
		goto out_rollback;
	if (PQntuples(r) > 0) {
		PQclear(r);
		rc = agent_db_commit(db, err, errlen);
		goto out_free;
	}
	PQclear(r);
	rc = exec_simple(db, sql, e, sizeof(e));
	if (rc) {
		sw_seterr(err, errlen, rc, "%s: %s", m->name, e);
		goto out_rollback;
	}
	rc = agent_db_exec(db, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", 2,
			   params, NULL, err, errlen);
	if (rc)
		goto out_rollback;
	rc = agent_db_commit(db, err, errlen);
	if (rc == 0) {
		*done = true;
		log_info("applied migration %s", m->name);
	}
	goto out_free;
out_rollback:
	agent_db_rollback(db);
out_free:
	free(sql);
	return rc;
}

int agent_db_migrate(struct agent_db *db, const char *dir, int *applied, char *err,
		     size_t errlen)
{
	struct migration *list;
	struct dirent *de;
	int n = 0, count = 0, rc = 0;
	DIR *d;

	if (applied)
		*applied = 0;
	d = opendir(dir);
	if (!d)
		return sw_seterr(err, errlen, -errno, "%s: %s", dir, strerror(errno));
	list = calloc(MAX_MIGRATIONS, sizeof(*list));
	if (!list) {
		closedir(d);
		return sw_seterr(err, errlen, -ENOMEM, "migrations: out of memory");
	}
	while ((de = readdir(d))) {
		long v = migration_version(de->d_name);

		if (v < 0)
			continue;
		if (n == MAX_MIGRATIONS || strlen(de->d_name) >= sizeof(list[0].name)) {
			rc = sw_seterr(err, errlen, SW_ETOOLONG, "%s: too many migrations or name too long",
				       dir);
			goto out;
		}
		list[n].version = v;
		snprintf(list[n].name, sizeof(list[n].name), "%s", de->d_name);
		n++;
	}
	if (n == 0) {
		rc = sw_seterr(err, errlen, -EINVAL, "%s: no migration (<number>_<name>.sql)", dir);
		goto out;
	}
	qsort(list, (size_t)n, sizeof(*list), migration_cmp);
	for (int i = 1; i < n; i++)
		if (list[i].version == list[i - 1].version) {
			rc = sw_seterr(err, errlen, -EINVAL, "%s: %s and %s have the same number %ld",
				       dir, list[i - 1].name, list[i].name, list[i].version);
			goto out;
		}
	for (int i = 0; i < n; i++) {
		bool done;

		rc = migrate_one(db, dir, &list[i], &done, err, errlen);
		if (rc)
			goto out;
		count += done;
	}
	if (applied)
		*applied = count;
out:
	free(list);
	closedir(d);
	return rc;
}

/* --- tasks ------------------------------------------------------------------ */

int agent_db_task_start(struct agent_db *db, const char *id, const char *kind,
			const char *entry_id, enum agent_task_status *prev, int *attempts,
			char *err, size_t errlen)
{
	/* The update never changes the status, so RETURNING status is the
	 * status the task had before this delivery ('running' when new). */
	static const char sql[] =
		"INSERT INTO tasks AS t (id, kind, status, attempts, entry_id, started_at)"
		" VALUES ($1, $2, 'running', 1, $3, now())"
		" ON CONFLICT (id) DO UPDATE SET attempts = t.attempts + 1,"
		"  kind = COALESCE(EXCLUDED.kind, t.kind), entry_id = EXCLUDED.entry_id,"
		"  started_at = CASE WHEN t.status = 'running' THEN now() ELSE t.started_at END"
		" RETURNING status, attempts";
	const char *params[3] = { id, kind, entry_id };
	PGresult *r;
	int rc;

	rc = agent_db_exec(db, sql, 3, params, &r, err, errlen);
	if (rc)
		return rc;
	if (prev && status_parse(PQgetvalue(r, 0, 0), prev) != 0)
		*prev = AGENT_TASK_RUNNING;
	if (attempts)
		*attempts = atoi(PQgetvalue(r, 0, 1));
	PQclear(r);
	return 0;
}

/* An UPDATE of the task whose id is params[0]: SW_ENOTFOUND (with the
 * message) when no row has that id. */
static int task_update(struct agent_db *db, const char *sql, int n_params,
		       const char *const *params, char *err, size_t errlen)
{
	PGresult *r;
	int rc;

	rc = agent_db_exec(db, sql, n_params, params, &r, err, errlen);
	if (rc)
		return rc;
	rc = strcmp(PQcmdTuples(r), "0") == 0 ? SW_ENOTFOUND : 0;
	PQclear(r);
	if (rc)
		return sw_seterr(err, errlen, rc, "task %s: no such task", params[0]);
	return 0;
}

int agent_db_task_finish(struct agent_db *db, const char *id, enum agent_task_status status,
			 const char *error, const char *location, char *err, size_t errlen)
{
	static const char sql[] =
		"UPDATE tasks SET status = $2, error = COALESCE($3, error),"
		" location = COALESCE($4, location),"
		" finished_at = CASE WHEN $2 = 'running' THEN NULL ELSE now() END"
		" WHERE id = $1";
	const char *params[4] = { id, agent_task_status_name(status), error, location };

	return task_update(db, sql, 4, params, err, errlen);
}

int agent_db_task_complete(struct agent_db *db, const char *id, const char *location,
			   int64_t doc_id, char *err, size_t errlen)
{
	static const char sql[] =
		"UPDATE tasks SET status = 'completed', location = $2,"
		" document_id = COALESCE($3::bigint, document_id), finished_at = now()"
		" WHERE id = $1";
	char dbuf[24];
	const char *params[3] = { id, location, NULL };

	if (doc_id > 0) {
		snprintf(dbuf, sizeof(dbuf), "%" PRId64, doc_id);
		params[2] = dbuf;
	}
	return task_update(db, sql, 3, params, err, errlen);
}

int agent_db_task_document(struct agent_db *db, const char *id, int64_t *doc_id, char *err,
			   size_t errlen)
{
	const char *params[1] = { id };
	PGresult *r;
	int rc;

	*doc_id = 0;
	rc = agent_db_exec(db, "SELECT document_id FROM tasks WHERE id = $1", 1, params, &r, err,
			   errlen);
	if (rc)
		return rc;
	rc = PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) ? 0 : SW_ENOTFOUND;
	if (rc == 0)
		*doc_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return rc;
}

int agent_db_task_set_document(struct agent_db *db, const char *id, int64_t doc_id, char *err,
			       size_t errlen)
{
	char dbuf[24];
	const char *params[2] = { id, dbuf };

	snprintf(dbuf, sizeof(dbuf), "%" PRId64, doc_id);
	return agent_db_exec(db, "UPDATE tasks SET document_id = $2 WHERE id = $1", 2, params, NULL,
			     err, errlen);
}

static void copy_field(PGresult *r, int col, char *dst, size_t len)
{
	if (dst && len)
		snprintf(dst, len, "%s", PQgetisnull(r, 0, col) ? "" : PQgetvalue(r, 0, col));
}

int agent_db_task_get(struct agent_db *db, const char *id, enum agent_task_status *status,
		      int *attempts, char *error, size_t error_len, char *location,
		      size_t location_len, char *err, size_t errlen)
{
	const char *params[1] = { id };
	PGresult *r;
	int rc;

	rc = agent_db_exec(db, "SELECT status, attempts, error, location FROM tasks WHERE id = $1",
			   1, params, &r, err, errlen);
	if (rc)
		return rc;
	if (PQntuples(r) == 0) {
		PQclear(r);
		return sw_seterr(err, errlen, SW_ENOTFOUND, "task %s: no such task", id);
	}
	if (status && status_parse(PQgetvalue(r, 0, 0), status) != 0)
		*status = AGENT_TASK_RUNNING;
	if (attempts)
		*attempts = atoi(PQgetvalue(r, 0, 1));
	copy_field(r, 2, error, error_len);
	copy_field(r, 3, location, location_len);
	PQclear(r);
	return 0;
}

/* --- documents and chunks --------------------------------------------------- */

/* Text parameters must be NUL-terminated; a text with an embedded NUL is
 * refused (PostgreSQL text cannot hold one anyway). */
static int check_text(const char *text, size_t len, char *err, size_t errlen)
{
	if (strlen(text) != len)
		return sw_seterr(err, errlen, -EINVAL, "text contains a NUL byte");
	return 0;
}

int agent_db_doc_find(struct agent_db *db, const char *text, size_t len, int64_t *doc_id,
		      char *err, size_t errlen)
{
	const char *params[1] = { text };
	PGresult *r;
	int rc;

	rc = check_text(text, len, err, errlen);
	if (rc)
		return rc;
	rc = agent_db_exec(db,
			   "SELECT id FROM documents WHERE content_hash = sha256(convert_to($1, 'UTF8'))",
			   1, params, &r, err, errlen);
	if (rc)
		return rc;
	rc = PQntuples(r) ? 0 : SW_ENOTFOUND;
	if (rc == 0)
		*doc_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return rc;
}

int agent_db_doc_insert(struct agent_db *db, const char *task_id, const char *source,
			const char *text, size_t len, int n_chunks, int64_t *doc_id,
			bool *created, char *err, size_t errlen)
{
	char nc[16];
	const char *params[4] = { task_id, source, text, nc };
	PGresult *r;
	int rc;

	rc = check_text(text, len, err, errlen);
	if (rc)
		return rc;
	snprintf(nc, sizeof(nc), "%d", n_chunks);
	rc = agent_db_exec(db,
			   "INSERT INTO documents (task_id, source, content_hash, text, n_chunks)"
			   " VALUES ($1, $2, sha256(convert_to($3, 'UTF8')), $3, $4)"
			   " ON CONFLICT (content_hash) DO NOTHING RETURNING id",
			   4, params, &r, err, errlen);
	if (rc)
		return rc;
	*created = PQntuples(r) > 0;
	if (*created)
		*doc_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	if (*created)
		return 0;
	return agent_db_doc_find(db, text, len, doc_id, err, errlen);
}

int agent_db_embedding_dim(struct agent_db *db, uint32_t *dim, char *err, size_t errlen)
{
	PGresult *r;
	int rc;

	if (!db->dim_checked) {
		rc = agent_db_exec(db, "SELECT dim, type FROM embedding_space", 0, NULL, &r, err,
				   errlen);
		if (rc)
			return rc;
		if (PQntuples(r) > 0) {
			db->dim = (uint32_t)strtoul(PQgetvalue(r, 0, 0), NULL, 10);
			db->vec_half = strcmp(PQgetvalue(r, 0, 1), "halfvec") == 0;
			db->dim_checked = true;
		}
		PQclear(r);
	}
	*dim = db->dim;
	return 0;
}

int agent_db_embedding_prepare(struct agent_db *db, uint32_t dim, char *err, size_t errlen)
{
	char lock[32], sql[512], dims[16];
	const char *lockp[1] = { lock };
	const char *params[2] = { dims, NULL };
	const char *type;
	uint32_t have;
	PGresult *r;
	int rc;

	if (dim == 0)
		return sw_seterr(err, errlen, -EINVAL, "embedding: width 0");
	if (dim > AGENT_DB_MAX_DIM)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "embedding: width %u exceeds %d (halfvec's HNSW limit)", dim,
				 AGENT_DB_MAX_DIM);
	rc = agent_db_embedding_dim(db, &have, err, errlen);
	if (rc)
		return rc;
	if (have == dim)
		return 0;
	if (have)
		goto mismatch;

	type = dim > AGENT_DB_VECTOR_MAX_DIM ? "halfvec" : "vector";
	snprintf(lock, sizeof(lock), "%lld", LOCK_EMBEDDING);
	snprintf(dims, sizeof(dims), "%u", dim);
	params[1] = type;
	rc = agent_db_begin(db, err, errlen);
	if (rc)
		return rc;
	rc = agent_db_exec(db, "SELECT pg_advisory_xact_lock($1::bigint)", 1, lockp, NULL, err,
			   errlen);
	if (rc)
		goto out_rollback;
	rc = agent_db_exec(db, "SELECT dim FROM embedding_space", 0, NULL, &r, err, errlen);
	if (rc)
		goto out_rollback;
	if (PQntuples(r) > 0) { /* another process won the race */
		have = (uint32_t)strtoul(PQgetvalue(r, 0, 0), NULL, 10);
		PQclear(r);
		agent_db_rollback(db);
		db->dim_checked = false;
		if (have != dim)
			goto mismatch;
		return agent_db_embedding_dim(db, &have, err, errlen);
	}
	PQclear(r);
	/* The width is a type modifier: it cannot be a parameter. It is an
	 * integer checked above, not text from a task. */
	snprintf(sql, sizeof(sql),
		 "ALTER TABLE chunks ADD COLUMN embedding %s(%u);"
		 "CREATE INDEX chunks_embedding_hnsw ON chunks USING hnsw (embedding %s_cosine_ops)",
		 type, dim, type);
	rc = exec_simple(db, sql, err, errlen);
	if (rc)
		goto out_rollback;
	rc = agent_db_exec(db, "INSERT INTO embedding_space (dim, type) VALUES ($1, $2)", 2,
			   params, NULL, err, errlen);
	if (rc)
		goto out_rollback;
	rc = agent_db_commit(db, err, errlen);
	if (rc)
		return rc;
	db->dim = dim;
	db->vec_half = dim > AGENT_DB_VECTOR_MAX_DIM;
	db->dim_checked = true;
	log_info("chunks.embedding created as %s(%u) with an HNSW cosine index", type, dim);
	return 0;

mismatch:
	return sw_seterr(err, errlen, SW_EUNSUPPORTED,
			 "embedding: the database holds width %u, gpud reports %u (re-ingest into a "
			 "fresh database to change models)",
			 have, dim);
out_rollback:
	agent_db_rollback(db);
	return rc;
}

char *agent_db_vector_text(const float *v, uint32_t dim)
{
	size_t cap = (size_t)dim * 18 + 3, off = 0;
	char *s = malloc(cap);

	if (!s)
		return NULL;
	s[off++] = '[';
	for (uint32_t i = 0; i < dim; i++)
		off += (size_t)snprintf(s + off, cap - off, "%s%.9g", i ? "," : "", (double)v[i]);
	snprintf(s + off, cap - off, "]");
	return s;
}

/* Checks emb's width against the prepared one. */
static int check_dim(struct agent_db *db, uint32_t dim, char *err, size_t errlen)
{
	uint32_t have;
	int rc = agent_db_embedding_dim(db, &have, err, errlen);

	if (rc)
		return rc;
	if (have == 0)
		return sw_seterr(err, errlen, SW_ENOTFOUND,
				 "embedding: no width prepared yet (nothing ingested)");
	if (have != dim)
		return sw_seterr(err, errlen, -EINVAL, "embedding: width %u, the database holds %u",
				 dim, have);
	return 0;
}

int agent_db_chunk_insert(struct agent_db *db, int64_t doc_id, int position, const char *text,
			  int n_tokens, const float *emb, uint32_t dim, char *err, size_t errlen)
{
	char ids[24], pos[16], nt[16];
	const char *params[5] = { ids, pos, text, nt, NULL };
	char *vec = NULL;
	int rc;

	if (emb) {
		rc = check_dim(db, dim, err, errlen);
		if (rc)
			return rc;
		vec = agent_db_vector_text(emb, dim);
		if (!vec)
			return sw_seterr(err, errlen, -ENOMEM, "chunk: out of memory");
	}
	params[4] = vec;
	snprintf(ids, sizeof(ids), "%" PRId64, doc_id);
	snprintf(pos, sizeof(pos), "%d", position);
	snprintf(nt, sizeof(nt), "%d", n_tokens);
	if (!emb)
		rc = agent_db_exec(db,
				   "INSERT INTO chunks (document_id, position, text, n_tokens)"
				   " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
				   4, params, NULL, err, errlen);
	else if (db->vec_half)
		rc = agent_db_exec(db,
				   "INSERT INTO chunks (document_id, position, text, n_tokens, embedding)"
				   " VALUES ($1, $2, $3, $4, $5::halfvec) ON CONFLICT DO NOTHING",
				   5, params, NULL, err, errlen);
	else
		rc = agent_db_exec(db,
				   "INSERT INTO chunks (document_id, position, text, n_tokens, embedding)"
				   " VALUES ($1, $2, $3, $4, $5::vector) ON CONFLICT DO NOTHING",
				   5, params, NULL, err, errlen);
	free(vec);
	return rc;
}

int agent_db_chunks(struct agent_db *db, int64_t doc_id, PGresult **res, char *err,
		    size_t errlen)
{
	char ids[24];
	const char *params[1] = { ids };
	PGresult *r;
	int rc;

	*res = NULL;
	snprintf(ids, sizeof(ids), "%" PRId64, doc_id);
	rc = agent_db_exec(db, "SELECT 1 FROM documents WHERE id = $1", 1, params, &r, err, errlen);
	if (rc)
		return rc;
	rc = PQntuples(r) ? 0 : SW_ENOTFOUND;
	PQclear(r);
	if (rc)
		return sw_seterr(err, errlen, rc, "document %" PRId64 ": no such document", doc_id);
	return agent_db_exec(db,
			     "SELECT id, position, text FROM chunks WHERE document_id = $1"
			     " ORDER BY position",
			     1, params, res, err, errlen);
}

int agent_db_topk(struct agent_db *db, const float *q, uint32_t dim, int k, int64_t doc_id,
		  PGresult **res, char *err, size_t errlen)
{
	char ks[16], ids[24];
	const char *params[3] = { NULL, ks, ids };
	char *vec;
	int rc;

	*res = NULL;
	if (k <= 0)
		return sw_seterr(err, errlen, -EINVAL, "topk: k must be positive, got %d", k);
	rc = check_dim(db, dim, err, errlen);
	if (rc)
		return rc;
	vec = agent_db_vector_text(q, dim);
	if (!vec)
		return sw_seterr(err, errlen, -ENOMEM, "topk: out of memory");
	params[0] = vec;
	snprintf(ks, sizeof(ks), "%d", k);
	snprintf(ids, sizeof(ids), "%" PRId64, doc_id);
	if (doc_id > 0)
		/* Within one document the search is exact: the subquery (fenced
		 * by OFFSET 0, so the ORDER BY stays outside it) reads the
		 * document's chunks through their (document_id, position)
		 * index. Through the HNSW index the planner would take the
		 * ef_search chunks nearest of all documents and then filter,
		 * which finds nothing of a document far from the question. */
		rc = agent_db_exec(db,
				   db->vec_half ?
				   "SELECT id, document_id, text, embedding <=> $1::halfvec AS d"
				   " FROM (SELECT id, document_id, text, embedding FROM chunks"
				   " WHERE document_id = $3 AND embedding IS NOT NULL OFFSET 0) c"
				   " ORDER BY d LIMIT $2" :
				   "SELECT id, document_id, text, embedding <=> $1::vector AS d"
				   " FROM (SELECT id, document_id, text, embedding FROM chunks"
				   " WHERE document_id = $3 AND embedding IS NOT NULL OFFSET 0) c"
				   " ORDER BY d LIMIT $2",
				   3, params, res, err, errlen);
	else if (db->vec_half)
		rc = agent_db_exec(db,
				   "SELECT id, document_id, text, embedding <=> $1::halfvec AS d"
				   " FROM chunks WHERE embedding IS NOT NULL"
				   " AND ($3::bigint <= 0 OR document_id = $3)"
				   " ORDER BY embedding <=> $1::halfvec LIMIT $2",
				   3, params, res, err, errlen);
	else
		rc = agent_db_exec(db,
				   "SELECT id, document_id, text, embedding <=> $1::vector AS d"
				   " FROM chunks WHERE embedding IS NOT NULL"
				   " AND ($3::bigint <= 0 OR document_id = $3)"
				   " ORDER BY embedding <=> $1::vector LIMIT $2",
				   3, params, res, err, errlen);
	free(vec);
	return rc;
}

/* --- summaries and answers --------------------------------------------------- */

int agent_db_summary_get(struct agent_db *db, int64_t doc_id, int level, int position,
			 char **text, char *err, size_t errlen)
{
	char ids[24], lv[16], pos[16];
	const char *params[3] = { ids, lv, pos };
	PGresult *r;
	int rc;

	*text = NULL;
	snprintf(ids, sizeof(ids), "%" PRId64, doc_id);
	snprintf(lv, sizeof(lv), "%d", level);
	snprintf(pos, sizeof(pos), "%d", position);
	rc = agent_db_exec(db,
			   "SELECT text FROM summaries WHERE document_id = $1 AND level = $2"
			   " AND position = $3",
			   3, params, &r, err, errlen);
	if (rc)
		return rc;
	if (PQntuples(r) == 0) {
		PQclear(r);
		return SW_ENOTFOUND;
	}
	*text = strdup(PQgetvalue(r, 0, 0));
	PQclear(r);
	if (!*text)
		return sw_seterr(err, errlen, -ENOMEM, "summary: out of memory");
	return 0;
}

int agent_db_summary_put(struct agent_db *db, int64_t doc_id, int level, int position,
			 const char *text, bool is_final, const char *task_id, char *err,
			 size_t errlen)
{
	char ids[24], lv[16], pos[16];
	const char *params[6] = { ids, lv, pos, text, is_final ? "true" : "false", task_id };

	snprintf(ids, sizeof(ids), "%" PRId64, doc_id);
	snprintf(lv, sizeof(lv), "%d", level);
	snprintf(pos, sizeof(pos), "%d", position);
	return agent_db_exec(db,
			     "INSERT INTO summaries (document_id, level, position, text, is_final, task_id)"
			     " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
			     6, params, NULL, err, errlen);
}

int agent_db_answer_put(struct agent_db *db, const char *task_id, const char *question,
			const char *text, const int64_t *chunk_ids, int n_chunks, char *err,
			size_t errlen)
{
	const char *params[4] = { task_id, question, text, NULL };
	size_t cap = (size_t)n_chunks * 21 + 3, off = 0;
	char *arr;
	int rc;

	arr = malloc(cap);
	if (!arr)
		return sw_seterr(err, errlen, -ENOMEM, "answer: out of memory");
	arr[off++] = '{';
	for (int i = 0; i < n_chunks; i++)
		off += (size_t)snprintf(arr + off, cap - off, "%s%" PRId64, i ? "," : "",
					chunk_ids[i]);
	snprintf(arr + off, cap - off, "}");
	params[3] = arr;
	rc = agent_db_exec(db,
			   "INSERT INTO answers (task_id, question, text, chunk_ids)"
			   " VALUES ($1, $2, $3, $4::bigint[]) ON CONFLICT (task_id) DO NOTHING",
			   4, params, NULL, err, errlen);
	free(arr);
	return rc;
}
