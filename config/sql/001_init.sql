-- 001_init.sql - agentd's tables (DESIGN §6).
--
-- Applied once, in one transaction, by agent_db_migrate (agentd/db.c),
-- which records it in schema_migrations. Never edit an applied migration:
-- add 002_*.sql instead.
--
-- The chunk embedding column is NOT created here: its width is the
-- model's, known only once gpud reports it. agent_db_embedding_prepare()
-- adds chunks.embedding as vector(dim) (halfvec(dim) above 2000, the HNSW
-- limit of vector) with an HNSW cosine index at the first ingest, and
-- records the choice in embedding_space.

CREATE EXTENSION IF NOT EXISTS vector;

-- One row per task id. A task without a usable id (malformed JSON) is
-- keyed by its stream entry id, "stream:<id>".
CREATE TABLE tasks (
	id          text PRIMARY KEY,
	kind        text,                 -- NULL when the JSON never said
	status      text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'dead')),
	attempts    integer NOT NULL DEFAULT 0,
	error       text,                 -- the last error, kept after success
	entry_id    text,                 -- Redis stream entry of the last delivery
	location    text,                 -- where the result is ("documents/12")
	created_at  timestamptz NOT NULL DEFAULT now(),
	started_at  timestamptz,
	finished_at timestamptz
);

CREATE TABLE documents (
	id           bigserial PRIMARY KEY,
	task_id      text NOT NULL,       -- the ingest task that stored it
	source       text NOT NULL,       -- URL, or "inline"
	content_hash bytea NOT NULL UNIQUE, -- sha256 of the UTF-8 text
	text         text NOT NULL,
	n_chunks     integer NOT NULL,
	created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chunks (
	id          bigserial PRIMARY KEY,
	document_id bigint NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
	position    integer NOT NULL,
	text        text NOT NULL,
	n_tokens    integer NOT NULL,
	UNIQUE (document_id, position)
);

-- Partial summaries of a document: level 0 summarizes chunk `position`,
-- level L + 1 summarizes a group of level-L rows. The single row of the
-- top level is the final summary. Keyed by position, so a resumed or
-- repeated summarize finds what was already made.
CREATE TABLE summaries (
	document_id bigint NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
	level       integer NOT NULL,
	position    integer NOT NULL,
	text        text NOT NULL,
	is_final    boolean NOT NULL DEFAULT false,
	task_id     text NOT NULL,        -- the task that made it
	created_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (document_id, level, position)
);

CREATE TABLE answers (
	task_id    text PRIMARY KEY,
	question   text NOT NULL,
	text       text NOT NULL,
	chunk_ids  bigint[] NOT NULL,     -- the chunks shown to the model, in order
	created_at timestamptz NOT NULL DEFAULT now()
);

-- At most one row: the embedding width and type chunks.embedding has.
CREATE TABLE embedding_space (
	one  boolean PRIMARY KEY DEFAULT true CHECK (one),
	dim  integer NOT NULL CHECK (dim > 0),
	type text NOT NULL CHECK (type IN ('vector', 'halfvec'))
);
