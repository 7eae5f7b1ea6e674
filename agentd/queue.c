/* queue.c - Redis Streams consumer for agentd (hiredis): claims, the
 * acknowledgement that deletes, capped result and dead-letter streams,
 * and the sweep of entries an older agentd acknowledged without deleting. */
#include "agentd/queue.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "common/err.h"
#include "common/log.h"
#include "common/redis_url.h"
#include "common/secret.h"
#include "proto/task.h"

struct agent_queue {
	redisContext *c;
	struct sw_redis_url addr;
	char stream[AGENT_QUEUE_NAME_MAX];
	char group[AGENT_QUEUE_NAME_MAX];
	char dead[AGENT_QUEUE_NAME_MAX];
	char results[AGENT_QUEUE_NAME_MAX];
	char consumer[AGENT_QUEUE_NAME_MAX];
	char own_cursor[64];      /* own pending entries read up to here */
	bool own_done;            /* own pending list fully read */
	char claim_cursor[64];    /* XAUTOCLAIM scan position */
	uint32_t lease_ms, block_ms, timeout_ms;
	uint32_t results_maxlen, dead_maxlen; /* 0 = not capped */
	bool nogroup;             /* the last error reply was NOGROUP */
};

/* An id of a stream entry, "<ms>-<seq>". */
struct entry_id {
	uint64_t ms, seq;
};

static struct timeval ms_tv(uint32_t ms)
{
	return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
}

/* The connection broke: drop it. Returns SW_ECLOSED with the reason. */
static int conn_lost(struct agent_queue *q, char *err, size_t errlen)
{
	sw_seterr(err, errlen, SW_ECLOSED, "redis: connection lost: %s",
		  q->c->errstr[0] ? q->c->errstr : "no reply");
	redisFree(q->c);
	q->c = NULL;
	return SW_ECLOSED;
}

static bool is_oom(const redisReply *r)
{
	return r->type == REDIS_REPLY_ERROR && strncmp(r->str, "OOM ", 4) == 0;
}

/* The code of an error reply: SW_EBUSY for a write refused at the
 * maxmemory limit (noeviction), else -EIO; the message has Redis's text. */
static int reply_error(const redisReply *r, char *err, size_t errlen)
{
	if (is_oom(r))
		return sw_seterr(err, errlen, SW_EBUSY, "redis: %s (Redis is at its maxmemory "
				 "limit and refuses writes; retried)", r->str);
	return sw_seterr(err, errlen, -EIO, "redis: %s", r->str);
}

/* Runs a command (printf-style, hiredis %s/%b); a NULL reply means the
 * connection broke: SW_ECLOSED, and the context is dropped. An error
 * reply is reply_error()'s code unless allow_error. *out gets the reply. */
static int vrun(struct agent_queue *q, redisReply **out, bool allow_error, char *err,
		size_t errlen, const char *fmt, va_list ap)
{
	redisReply *r;

	*out = NULL;
	if (!q->c)
		return sw_seterr(err, errlen, SW_ECLOSED, "redis: not connected");
	r = redisvCommand(q->c, fmt, ap);
	if (!r)
		return conn_lost(q, err, errlen);
	q->nogroup = r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOGROUP", 7) == 0;
	if (r->type == REDIS_REPLY_ERROR && !allow_error) {
		int rc = reply_error(r, err, errlen);

		freeReplyObject(r);
		return rc;
	}
	*out = r;
	return 0;
}

/* Appends one command to the pipeline of q (sent by pipe_replies). A
 * failed append (out of memory) leaves commands half queued: the
 * connection is dropped. */
static int pipe_add(struct agent_queue *q, char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	int ok;

	if (!q->c)
		return sw_seterr(err, errlen, SW_ECLOSED, "redis: not connected");
	va_start(ap, fmt);
	ok = redisvAppendCommand(q->c, fmt, ap) == REDIS_OK;
	va_end(ap);
	if (ok)
		return 0;
	redisFree(q->c);
	q->c = NULL;
	return sw_seterr(err, errlen, -ENOMEM, "redis: out of memory");
}

/* Sends what pipe_add queued and reads its n replies into r, all of them
 * so the connection stays in step. Returns 0, the code of the first
 * error reply (every reply is still in r: free them with pipe_free), or
 * SW_ECLOSED (the connection dropped, r all NULL). */
static int pipe_replies(struct agent_queue *q, redisReply **r, size_t n, char *err,
			size_t errlen)
{
	int rc = 0;

	for (size_t i = 0; i < n; i++)
		r[i] = NULL;
	if (!q->c)
		return sw_seterr(err, errlen, SW_ECLOSED, "redis: not connected");
	for (size_t i = 0; i < n; i++) {
		void *reply;

		if (redisGetReply(q->c, &reply) != REDIS_OK || !reply) {
			for (size_t k = 0; k < i; k++) {
				freeReplyObject(r[k]);
				r[k] = NULL;
			}
			return conn_lost(q, err, errlen);
		}
		r[i] = reply;
		if (!rc && r[i]->type == REDIS_REPLY_ERROR)
			rc = reply_error(r[i], err, errlen);
	}
	return rc;
}

static void pipe_free(redisReply **r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (r[i])
			freeReplyObject(r[i]);
}

static int run(struct agent_queue *q, redisReply **out, char *err, size_t errlen,
	       const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vrun(q, out, false, err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

static int run_allow_error(struct agent_queue *q, redisReply **out, char *err, size_t errlen,
			   const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vrun(q, out, true, err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

/* True when group exists on the stream (XINFO GROUPS, which needs no
 * memory). */
static bool group_exists(struct agent_queue *q)
{
	redisReply *r;
	bool found = false;

	if (run_allow_error(q, &r, NULL, 0, "XINFO GROUPS %s", q->stream) != 0)
		return false;
	for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
		const redisReply *g = r->element[i];

		for (size_t k = 0; g->type == REDIS_REPLY_ARRAY && k + 1 < g->elements; k += 2)
			if (g->element[k]->type == REDIS_REPLY_STRING &&
			    !strcmp(g->element[k]->str, "name") &&
			    g->element[k + 1]->type == REDIS_REPLY_STRING &&
			    !strcmp(g->element[k + 1]->str, q->group))
				found = true;
	}
	freeReplyObject(r);
	return found;
}

static int ensure_group(struct agent_queue *q, char *err, size_t errlen)
{
	redisReply *r;
	int rc;

	/* From 0: tasks added before the first worker ever ran are work too. */
	rc = run_allow_error(q, &r, err, errlen, "XGROUP CREATE %s %s 0 MKSTREAM", q->stream,
			     q->group);
	if (rc)
		return rc;
	/* At maxmemory Redis refuses XGROUP CREATE before looking: an
	 * existing group is all a worker needs, and workers that cannot
	 * start cannot acknowledge, which is what frees memory. */
	if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0 &&
	    !(is_oom(r) && group_exists(q)))
		rc = is_oom(r) ? reply_error(r, err, errlen) :
				 sw_seterr(err, errlen, -EIO, "redis: XGROUP CREATE %s %s: %s",
					   q->stream, q->group, r->str);
	freeReplyObject(r);
	return rc;
}

static int connect_now(struct agent_queue *q, char *err, size_t errlen)
{
	const struct sw_redis_url *a = &q->addr;
	struct timeval tv = ms_tv(q->timeout_ms);
	redisReply *r;
	int rc;

	if (q->c)
		redisFree(q->c);
	q->c = a->unix_path[0] ? redisConnectUnixWithTimeout(a->unix_path, tv) :
				 redisConnectWithTimeout(a->host, a->port, tv);
	if (!q->c)
		return sw_seterr(err, errlen, -ENOMEM, "redis: out of memory");
	if (q->c->err) {
		rc = sw_seterr(err, errlen, SW_ECLOSED, "redis: cannot connect to %s%s%.0d: %s",
			       a->unix_path[0] ? a->unix_path : a->host, a->unix_path[0] ? "" : ":",
			       a->unix_path[0] ? 0 : a->port, q->c->errstr);
		redisFree(q->c);
		q->c = NULL;
		return rc;
	}
	redisSetTimeout(q->c, tv);
	if (q->addr.password[0]) {
		/* Redis 6 ACLs: the URL's user, else the default one */
		rc = q->addr.user[0] ? run(q, &r, err, errlen, "AUTH %s %s", q->addr.user,
					   q->addr.password) :
				       run(q, &r, err, errlen, "AUTH %s", q->addr.password);
		if (rc)
			return rc;
		freeReplyObject(r);
	}
	if (q->addr.db) {
		rc = run(q, &r, err, errlen, "SELECT %d", q->addr.db);
		if (rc)
			return rc;
		freeReplyObject(r);
	}
	/* Named after the consumer so CLIENT LIST shows which worker is which. */
	rc = run_allow_error(q, &r, err, errlen, "CLIENT SETNAME agentd:%s", q->consumer);
	if (rc)
		return rc;
	freeReplyObject(r);
	return ensure_group(q, err, errlen);
}

static void copy_name(char *dst, const char *src, const char *def)
{
	snprintf(dst, AGENT_QUEUE_NAME_MAX, "%s", src ? src : def);
}

int agent_queue_open(struct agent_queue **out, const struct agent_queue_opts *o, char *err,
		     size_t errlen)
{
	struct agent_queue *q;
	char host[200];
	int rc;

	*out = NULL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return sw_seterr(err, errlen, -ENOMEM, "redis: out of memory");
	rc = sw_redis_url_parse(o->url, &q->addr, err, errlen);
	if (rc)
		goto out_free;
	if (sw_secret_redis()[0]) /* common/secret.h: wins over the URL's */
		snprintf(q->addr.password, sizeof(q->addr.password), "%s", sw_secret_redis());
	if (q->addr.tls) {
		rc = sw_seterr(err, errlen, -EINVAL, "redis: rediss:// (TLS) is not supported");
		goto out_free;
	}
	copy_name(q->stream, o->stream, PROTO_TASK_STREAM);
	copy_name(q->group, o->group, PROTO_TASK_GROUP);
	copy_name(q->dead, o->dead_stream, PROTO_TASK_DEAD_STREAM);
	copy_name(q->results, o->results_stream, PROTO_TASK_RESULTS_STREAM);
	if (o->consumer) {
		copy_name(q->consumer, o->consumer, NULL);
	} else {
		if (gethostname(host, sizeof(host)) != 0)
			snprintf(host, sizeof(host), "localhost");
		host[sizeof(host) - 1] = '\0';
		snprintf(q->consumer, sizeof(q->consumer), "%s:%d", host, (int)getpid());
	}
	q->lease_ms = o->lease_ms ? o->lease_ms : 300000;
	q->block_ms = o->block_ms ? o->block_ms : 1000;
	q->timeout_ms = o->timeout_ms ? o->timeout_ms : 5000;
	q->results_maxlen = o->results_maxlen;
	q->dead_maxlen = o->dead_maxlen;
	snprintf(q->own_cursor, sizeof(q->own_cursor), "0");
	snprintf(q->claim_cursor, sizeof(q->claim_cursor), "0-0");
	rc = connect_now(q, err, errlen);
	if (rc)
		goto out_free;
	*out = q;
	return 0;
out_free:
	agent_queue_close(q);
	return rc;
}

void agent_queue_close(struct agent_queue *q)
{
	if (!q)
		return;
	if (q->c)
		redisFree(q->c);
	free(q);
}

const char *agent_queue_consumer(const struct agent_queue *q)
{
	return q->consumer;
}

int agent_queue_reconnect(struct agent_queue *q, char *err, size_t errlen)
{
	if (q->c && !q->c->err)
		return 0;
	return connect_now(q, err, errlen);
}

void agent_msg_free(struct agent_msg *m)
{
	if (!m)
		return;
	free(m->payload);
	memset(m, 0, sizeof(*m));
}

/* Fills m from one entry reply [id, [field, value, ...] or nil]. Returns
 * 0, or SW_ENOTFOUND for an entry without data (deleted from the stream;
 * m->id is still set), -ENOMEM. */
static int entry_to_msg(const redisReply *e, struct agent_msg *m)
{
	const redisReply *f;

	if (e->type != REDIS_REPLY_ARRAY || e->elements < 1 ||
	    e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= sizeof(m->id))
		return SW_EFORMAT;
	memcpy(m->id, e->element[0]->str, e->element[0]->len + 1);
	if (e->elements < 2 || e->element[1]->type != REDIS_REPLY_ARRAY)
		return SW_ENOTFOUND;
	f = e->element[1];
	for (size_t i = 0; i + 1 < f->elements; i += 2) {
		if (f->element[i]->type != REDIS_REPLY_STRING ||
		    strcmp(f->element[i]->str, PROTO_TASK_FIELD) != 0 ||
		    f->element[i + 1]->type != REDIS_REPLY_STRING)
			continue;
		m->payload = malloc(f->element[i + 1]->len + 1);
		if (!m->payload)
			return -ENOMEM;
		memcpy(m->payload, f->element[i + 1]->str, f->element[i + 1]->len + 1);
		m->len = f->element[i + 1]->len;
		break;
	}
	return 0;
}

/* XREADGROUP reply: [[stream, [entry...]]] or nil. *entry is the first
 * entry or NULL. */
static const redisReply *first_read_entry(const redisReply *r)
{
	const redisReply *s;

	if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
		return NULL;
	s = r->element[0];
	if (s->type != REDIS_REPLY_ARRAY || s->elements < 2 ||
	    s->element[1]->type != REDIS_REPLY_ARRAY || s->element[1]->elements < 1)
		return NULL;
	return s->element[1]->element[0];
}

static int deliveries(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen)
{
	redisReply *r;
	int rc;

	rc = run(q, &r, err, errlen, "XPENDING %s %s %s %s 1 %s", q->stream, q->group, m->id,
		 m->id, q->consumer);
	if (rc)
		return rc;
	m->deliveries = 1;
	if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
	    r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements >= 4 &&
	    r->element[0]->element[3]->type == REDIS_REPLY_INTEGER)
		m->deliveries = (uint32_t)r->element[0]->element[3]->integer;
	freeReplyObject(r);
	return 0;
}

/* Takes entry e into m; an entry without data is acknowledged and
 * reported as SW_ENOTFOUND so the caller looks further. */
static int take(struct agent_queue *q, const redisReply *e, enum agent_msg_source src,
		struct agent_msg *m, char *err, size_t errlen)
{
	int rc = entry_to_msg(e, m);

	if (rc == SW_ENOTFOUND) {
		log_warn("entry %s of %s has no data (deleted?): acknowledged", m->id, q->stream);
		rc = agent_queue_ack(q, m->id, err, errlen);
		agent_msg_free(m);
		return rc ? rc : SW_ENOTFOUND;
	}
	if (rc) {
		agent_msg_free(m);
		return sw_seterr(err, errlen, rc == -ENOMEM ? rc : -EIO, "redis: unexpected entry reply");
	}
	m->source = src;
	rc = deliveries(q, m, err, errlen);
	if (rc)
		agent_msg_free(m);
	return rc;
}

/* 1. Our own pending entries, read once in id order. */
static int claim_own(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen)
{
	const redisReply *e;
	redisReply *r;
	int rc;

	while (!q->own_done) {
		rc = run(q, &r, err, errlen, "XREADGROUP GROUP %s %s COUNT 1 STREAMS %s %s", q->group,
			 q->consumer, q->stream, q->own_cursor);
		if (rc)
			return rc;
		e = first_read_entry(r);
		if (!e) {
			q->own_done = true;
			freeReplyObject(r);
			break;
		}
		rc = take(q, e, AGENT_MSG_OWN_PENDING, m, err, errlen);
		if (e->element[0]->type == REDIS_REPLY_STRING)
			snprintf(q->own_cursor, sizeof(q->own_cursor), "%s", e->element[0]->str);
		freeReplyObject(r);
		if (rc != SW_ENOTFOUND)
			return rc;
	}
	return SW_ENOTFOUND;
}

/* 2. Entries idle past the lease, from anyone (XAUTOCLAIM, COUNT 1). */
static int claim_idle(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen)
{
	redisReply *r;
	int rc;

	for (int round = 0; round < 4; round++) {
		const redisReply *list;

		rc = run(q, &r, err, errlen, "XAUTOCLAIM %s %s %s %u %s COUNT 1", q->stream, q->group,
			 q->consumer, q->lease_ms, q->claim_cursor);
		if (rc)
			return rc;
		if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
		    r->element[0]->type != REDIS_REPLY_STRING ||
		    r->element[1]->type != REDIS_REPLY_ARRAY) {
			freeReplyObject(r);
			return sw_seterr(err, errlen, -EIO, "redis: unexpected XAUTOCLAIM reply");
		}
		snprintf(q->claim_cursor, sizeof(q->claim_cursor), "%s", r->element[0]->str);
		list = r->element[1];
		if (list->elements > 0) {
			rc = take(q, list->element[0], AGENT_MSG_RECLAIMED, m, err, errlen);
			freeReplyObject(r);
			if (rc != SW_ENOTFOUND)
				return rc;
			continue;
		}
		freeReplyObject(r);
		if (strcmp(q->claim_cursor, "0-0") == 0)
			break; /* a whole scan found nothing */
	}
	return SW_ENOTFOUND;
}

/* 3. New entries, blocking up to block_ms. */
static int claim_new(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen)
{
	const redisReply *e;
	redisReply *r;
	int rc;

	redisSetTimeout(q->c, ms_tv(q->block_ms + q->timeout_ms));
	rc = run(q, &r, err, errlen, "XREADGROUP GROUP %s %s COUNT 1 BLOCK %u STREAMS %s >",
		 q->group, q->consumer, q->block_ms, q->stream);
	if (q->c)
		redisSetTimeout(q->c, ms_tv(q->timeout_ms));
	if (rc)
		return rc;
	e = first_read_entry(r);
	rc = e ? take(q, e, AGENT_MSG_NEW, m, err, errlen) : SW_ENOTFOUND;
	freeReplyObject(r);
	return rc;
}

int agent_queue_claim(struct agent_queue *q, struct agent_msg *m, char *err, size_t errlen)
{
	int rc;

	memset(m, 0, sizeof(*m));
	rc = claim_own(q, m, err, errlen);
	if (rc == SW_ENOTFOUND)
		rc = claim_idle(q, m, err, errlen);
	if (rc == SW_ENOTFOUND)
		rc = claim_new(q, m, err, errlen);
	/* The group vanished (Redis restarted without persistence, or an
	 * operator deleted it): make it again; the caller claims again. */
	if (rc == -EIO && q->nogroup) {
		log_warn("group %s of %s is gone: creating it again", q->group, q->stream);
		rc = ensure_group(q, err, errlen);
		return rc ? rc : SW_ENOTFOUND;
	}
	return rc;
}

int agent_queue_ack(struct agent_queue *q, const char *id, char *err, size_t errlen)
{
	redisReply *r[2];
	int rc;

	/* XDEL first: a break between the two leaves a deleted entry that is
	 * still pending, which XAUTOCLAIM and the own-pending read clean up;
	 * the other order would leave an acknowledged entry nobody deletes. */
	rc = pipe_add(q, err, errlen, "XDEL %s %s", q->stream, id);
	if (!rc)
		rc = pipe_add(q, err, errlen, "XACK %s %s %s", q->stream, q->group, id);
	if (rc)
		return rc;
	rc = pipe_replies(q, r, 2, err, errlen);
	pipe_free(r, 2);
	return rc;
}

/* Appends the XADD of m to the dead-letter stream, capped when asked. */
static int dead_xadd(struct agent_queue *q, const struct agent_msg *m, const char *task_id,
		     const char *error, char *err, size_t errlen)
{
	const char *payload = m->payload ? m->payload : "";
	size_t len = m->payload ? m->len : 0;
	char n[16];

	snprintf(n, sizeof(n), "%u", m->deliveries);
	if (q->dead_maxlen)
		return pipe_add(q, err, errlen,
				"XADD %s MAXLEN ~ %u * task_id %s entry %s deliveries %s error %s "
				"task %b",
				q->dead, q->dead_maxlen, task_id ? task_id : "", m->id, n,
				error ? error : "", payload, len);
	return pipe_add(q, err, errlen,
			"XADD %s * task_id %s entry %s deliveries %s error %s task %b", q->dead,
			task_id ? task_id : "", m->id, n, error ? error : "", payload, len);
}

int agent_queue_dead(struct agent_queue *q, const struct agent_msg *m, const char *task_id,
		     const char *error, char *err, size_t errlen)
{
	redisReply *r[5];
	int rc;

	/* A transaction, unlike the plain acknowledgement: the dead entry and
	 * the deletion of the original happen together or not at all. At
	 * maxmemory Redis refuses it whole (EXECABORT), and the entry stays. */
	rc = pipe_add(q, err, errlen, "MULTI");
	if (!rc)
		rc = dead_xadd(q, m, task_id, error, err, errlen);
	if (!rc)
		rc = pipe_add(q, err, errlen, "XDEL %s %s", q->stream, m->id);
	if (!rc)
		rc = pipe_add(q, err, errlen, "XACK %s %s %s", q->stream, q->group, m->id);
	if (!rc)
		rc = pipe_add(q, err, errlen, "EXEC");
	if (rc)
		return rc;
	rc = pipe_replies(q, r, 5, err, errlen);
	if (rc == SW_ECLOSED)
		return rc;
	/* The first error is the one to report: an OOM refusal of a queued
	 * command comes before the EXECABORT it causes. */
	if (!rc && (r[4]->type != REDIS_REPLY_ARRAY || r[4]->elements != 3))
		rc = sw_seterr(err, errlen, -EIO, "redis: dead-letter transaction failed");
	for (size_t i = 0; !rc && i < 3; i++)
		if (r[4]->element[i]->type == REDIS_REPLY_ERROR)
			rc = sw_seterr(err, errlen, -EIO, "redis: dead-letter transaction: %s",
				       r[4]->element[i]->str);
	pipe_free(r, 5);
	return rc;
}

int agent_queue_result(struct agent_queue *q, const char *task_id, const char *status,
		       const char *location, int64_t document_id, const char *error, char *err,
		       size_t errlen)
{
	char doc[24] = "";
	redisReply *r;
	int rc;

	if (document_id > 0)
		snprintf(doc, sizeof(doc), "%" PRId64, document_id);
	if (q->results_maxlen)
		rc = run(q, &r, err, errlen,
			 "XADD %s MAXLEN ~ %u * task_id %s status %s location %s error %s "
			 "document_id %s",
			 q->results, q->results_maxlen, task_id, status, location ? location : "",
			 error ? error : "", doc);
	else
		rc = run(q, &r, err, errlen,
			 "XADD %s * task_id %s status %s location %s error %s document_id %s",
			 q->results, task_id, status, location ? location : "", error ? error : "",
			 doc);
	if (rc)
		return rc;
	freeReplyObject(r);
	return 0;
}

int agent_queue_holds(struct agent_queue *q, const char *id, char *err, size_t errlen)
{
	redisReply *r;
	int rc;

	rc = run(q, &r, err, errlen, "XPENDING %s %s %s %s 1 %s", q->stream, q->group, id, id,
		 q->consumer);
	if (rc)
		return rc;
	rc = r->type == REDIS_REPLY_ARRAY && r->elements == 1 ? 0 : SW_ENOTFOUND;
	freeReplyObject(r);
	if (rc)
		return sw_seterr(err, errlen, rc, "entry %s: no longer held by %s", id, q->consumer);
	return 0;
}

int agent_queue_touch(struct agent_queue *q, const char *id, char *err, size_t errlen)
{
	redisReply *r;
	int rc;

	/* XCLAIM with min-idle 0 to ourselves; JUSTID leaves the delivery
	 * count alone. Only an entry still in the group's PEL is claimed;
	 * one another consumer took is taken back only if we still list it,
	 * so check the owner first. */
	rc = agent_queue_holds(q, id, err, errlen);
	if (rc)
		return rc;
	rc = run(q, &r, err, errlen, "XCLAIM %s %s %s 0 %s JUSTID", q->stream, q->group,
		 q->consumer, id);
	if (rc)
		return rc;
	freeReplyObject(r);
	return 0;
}

/* The value of "field:" in INFO text into out ("" when absent). */
static void info_value(const char *info, const char *field, char *out, size_t cap)
{
	size_t n = strlen(field);

	out[0] = '\0';
	for (const char *p = info; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, field, n) && p[n] == ':') {
			snprintf(out, cap, "%.*s", (int)strcspn(p + n + 1, "\r\n"), p + n + 1);
			return;
		}
}

int agent_queue_memory_policy(struct agent_queue *q, uint64_t *maxmemory, char *policy,
			      size_t cap, char *err, size_t errlen)
{
	char max[32];
	redisReply *r;
	int rc;

	rc = run(q, &r, err, errlen, "INFO memory");
	if (rc)
		return rc;
	if (r->type != REDIS_REPLY_STRING) {
		freeReplyObject(r);
		return sw_seterr(err, errlen, -EIO, "redis: unexpected INFO reply");
	}
	info_value(r->str, "maxmemory", max, sizeof(max));
	info_value(r->str, "maxmemory_policy", policy, cap);
	*maxmemory = strtoull(max, NULL, 10);
	freeReplyObject(r);
	return 0;
}

/* The value of field name in a flat list of field, value pairs (an
 * element of XINFO GROUPS or XINFO CONSUMERS) if it has the given type;
 * NULL when absent or of another type. */
static const redisReply *pair_value(const redisReply *pairs, const char *name, int type)
{
	for (size_t k = 0; pairs->type == REDIS_REPLY_ARRAY && k + 1 < pairs->elements; k += 2) {
		const redisReply *key = pairs->element[k], *val = pairs->element[k + 1];

		if (key->type == REDIS_REPLY_STRING && !strcmp(key->str, name))
			return val->type == type ? val : NULL;
	}
	return NULL;
}

static const char *pair_str(const redisReply *pairs, const char *name)
{
	const redisReply *v = pair_value(pairs, name, REDIS_REPLY_STRING);

	return v ? v->str : NULL;
}

/* -1 when absent (the integers read are counts and times). */
static long long pair_int(const redisReply *pairs, const char *name)
{
	const redisReply *v = pair_value(pairs, name, REDIS_REPLY_INTEGER);

	return v ? v->integer : -1;
}

/* --- the sweep -------------------------------------------------------------- */

static bool parse_id(const char *s, struct entry_id *id)
{
	char *end;

	if (!s)
		return false;
	errno = 0;
	id->ms = strtoull(s, &end, 10);
	if (errno || end == s || *end != '-')
		return false;
	s = end + 1;
	id->seq = strtoull(s, &end, 10);
	return !errno && end != s && *end == '\0';
}

static bool id_less(struct entry_id a, struct entry_id b)
{
	return a.ms < b.ms || (a.ms == b.ms && a.seq < b.seq);
}

/* The id right after a (ids are ordered by ms, then seq). */
static struct entry_id id_next(struct entry_id a)
{
	if (a.seq == UINT64_MAX)
		return (struct entry_id){ a.ms + 1, 0 };
	return (struct entry_id){ a.ms, a.seq + 1 };
}

/* The oldest entry some group still wants: per group the oldest pending
 * entry, else the one after the last delivered. *found is false when the
 * stream has no group (then nothing may be trimmed). */
static int sweep_bound(struct agent_queue *q, struct entry_id *bound, bool *found, char *err,
		       size_t errlen)
{
	redisReply *r, *p;
	int rc;

	*found = false;
	rc = run(q, &r, err, errlen, "XINFO GROUPS %s", q->stream);
	if (rc)
		return rc;
	for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
		const redisReply *g = r->element[i];
		const char *name = pair_str(g, "name"), *last = pair_str(g, "last-delivered-id");
		long long pending = pair_int(g, "pending");
		struct entry_id want, oldest;

		if (!name || !parse_id(last, &want) || pending < 0) {
			rc = sw_seterr(err, errlen, -EIO, "redis: unexpected XINFO GROUPS reply");
			break;
		}
		want = id_next(want);
		if (pending > 0) {
			/* summary form: [count, smallest id, greatest id, consumers] */
			rc = run(q, &p, err, errlen, "XPENDING %s %s", q->stream, name);
			if (rc)
				break;
			if (p->type == REDIS_REPLY_ARRAY && p->elements >= 2 &&
			    p->element[1]->type == REDIS_REPLY_STRING &&
			    parse_id(p->element[1]->str, &oldest) && id_less(oldest, want))
				want = oldest;
			freeReplyObject(p);
		}
		if (!*found || id_less(want, *bound))
			*bound = want;
		*found = true;
	}
	freeReplyObject(r);
	return rc;
}

int agent_queue_sweep(struct agent_queue *q, uint64_t *removed, char *err, size_t errlen)
{
	struct entry_id bound = { 0, 0 };
	uint64_t n = 0;
	char id[48];
	bool found;
	int rc;

	if (removed)
		*removed = 0;
	rc = sweep_bound(q, &bound, &found, err, errlen);
	if (rc || !found)
		return rc;
	snprintf(id, sizeof(id), "%" PRIu64 "-%" PRIu64, bound.ms, bound.seq);
	/* Whole nodes first, a slice at a time (~ with LIMIT), so a stream of
	 * millions of old entries does not stall Redis; then the exact trim
	 * of what is left below the bound. */
	for (;;) {
		redisReply *r;

		rc = run(q, &r, err, errlen, "XTRIM %s MINID ~ %s LIMIT 1000", q->stream, id);
		if (rc)
			return rc;
		n += r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? (uint64_t)r->integer : 0;
		if (r->type != REDIS_REPLY_INTEGER || r->integer <= 0) {
			freeReplyObject(r);
			break;
		}
		freeReplyObject(r);
	}
	{
		redisReply *r;

		rc = run(q, &r, err, errlen, "XTRIM %s MINID %s", q->stream, id);
		if (rc)
			return rc;
		n += r->type == REDIS_REPLY_INTEGER && r->integer > 0 ? (uint64_t)r->integer : 0;
		freeReplyObject(r);
	}
	if (removed)
		*removed = n;
	if (n)
		log_info("removed %" PRIu64 " acknowledged entries from %s (left by an older agentd "
			 "or a client that acknowledges without deleting)",
			 n, q->stream);
	return 0;
}

int agent_queue_prune(struct agent_queue *q, uint32_t min_idle_ms, unsigned *removed, char *err,
		      size_t errlen)
{
	redisReply *r, *d;
	unsigned n = 0;
	int rc;

	if (removed)
		*removed = 0;
	rc = run(q, &r, err, errlen, "XINFO CONSUMERS %s %s", q->stream, q->group);
	if (rc)
		return rc;
	for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
		const redisReply *c = r->element[i];
		const char *name = pair_str(c, "name");
		long long pending = pair_int(c, "pending"), idle = pair_int(c, "idle");

		if (!name || pending != 0 || idle < (long long)min_idle_ms ||
		    !strcmp(name, q->consumer))
			continue;
		rc = run(q, &d, err, errlen, "XGROUP DELCONSUMER %s %s %s", q->stream, q->group, name);
		if (rc)
			break;
		/* The reply is the pending count it had. Redis drops those
		 * entries from the pending list, so a consumer that claimed
		 * something between XINFO and here would orphan it: that is
		 * why only consumers silent for min_idle_ms (a live worker
		 * reads every block_ms) are candidates. Say so if it happens. */
		if (d->type == REDIS_REPLY_INTEGER && d->integer > 0)
			log_error("consumer %s claimed %lld entries while being removed; they are no "
				  "longer pending (re-add them from swarm:tasks)",
				  name, d->integer);
		freeReplyObject(d);
		n++;
	}
	freeReplyObject(r);
	if (removed)
		*removed = n;
	if (n)
		log_info("removed %u idle consumers without pending entries from %s", n, q->group);
	return rc;
}
