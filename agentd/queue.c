/* queue.c - Redis Streams consumer for agentd (hiredis). */
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
	bool nogroup;             /* the last error reply was NOGROUP */
};

static struct timeval ms_tv(uint32_t ms)
{
	return (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
}

/* Runs a command (printf-style, hiredis %s/%b); a NULL reply means the
 * connection broke: SW_ECLOSED, and the context is dropped. An error
 * reply is -EIO unless allow_error. *out gets the reply. */
static int vrun(struct agent_queue *q, redisReply **out, bool allow_error, char *err,
		size_t errlen, const char *fmt, va_list ap)
{
	redisReply *r;

	*out = NULL;
	if (!q->c)
		return sw_seterr(err, errlen, SW_ECLOSED, "redis: not connected");
	r = redisvCommand(q->c, fmt, ap);
	if (!r) {
		sw_seterr(err, errlen, SW_ECLOSED, "redis: connection lost: %s",
			  q->c->errstr[0] ? q->c->errstr : "no reply");
		redisFree(q->c);
		q->c = NULL;
		return SW_ECLOSED;
	}
	q->nogroup = r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOGROUP", 7) == 0;
	if (r->type == REDIS_REPLY_ERROR && !allow_error) {
		int rc = sw_seterr(err, errlen, -EIO, "redis: %s", r->str);

		freeReplyObject(r);
		return rc;
	}
	*out = r;
	return 0;
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

static int ensure_group(struct agent_queue *q, char *err, size_t errlen)
{
	redisReply *r;
	int rc;

	/* From 0: tasks added before the first worker ever ran are work too. */
	rc = run_allow_error(q, &r, err, errlen, "XGROUP CREATE %s %s 0 MKSTREAM", q->stream,
			     q->group);
	if (rc)
		return rc;
	if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9) != 0)
		rc = sw_seterr(err, errlen, -EIO, "redis: XGROUP CREATE %s %s: %s", q->stream,
			       q->group, r->str);
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
		rc = run(q, &r, err, errlen, "AUTH %s", q->addr.password);
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
	redisReply *r;
	int rc = run(q, &r, err, errlen, "XACK %s %s %s", q->stream, q->group, id);

	if (rc)
		return rc;
	freeReplyObject(r);
	return 0;
}

int agent_queue_dead(struct agent_queue *q, const struct agent_msg *m, const char *task_id,
		     const char *error, char *err, size_t errlen)
{
	redisReply *r;
	char n[16];
	int rc;

	snprintf(n, sizeof(n), "%u", m->deliveries);
	rc = run(q, &r, err, errlen, "MULTI");
	if (rc)
		return rc;
	freeReplyObject(r);
	rc = run(q, &r, err, errlen, "XADD %s * task_id %s entry %s deliveries %s error %s task %b",
		 q->dead, task_id ? task_id : "", m->id, n, error ? error : "",
		 m->payload ? m->payload : "", m->payload ? m->len : (size_t)0);
	if (rc)
		goto out_discard;
	freeReplyObject(r);
	rc = run(q, &r, err, errlen, "XACK %s %s %s", q->stream, q->group, m->id);
	if (rc)
		goto out_discard;
	freeReplyObject(r);
	rc = run(q, &r, err, errlen, "EXEC");
	if (rc)
		return rc;
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
	    r->element[0]->type == REDIS_REPLY_ERROR || r->element[1]->type == REDIS_REPLY_ERROR)
		rc = sw_seterr(err, errlen, -EIO, "redis: dead-letter transaction failed");
	freeReplyObject(r);
	return rc;
out_discard:
	if (q->c && run(q, &r, NULL, 0, "DISCARD") == 0)
		freeReplyObject(r);
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
	rc = run(q, &r, err, errlen,
		 "XADD %s * task_id %s status %s location %s error %s document_id %s", q->results,
		 task_id, status, location ? location : "", error ? error : "", doc);
	if (rc)
		return rc;
	freeReplyObject(r);
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
	rc = run(q, &r, err, errlen, "XPENDING %s %s %s %s 1 %s", q->stream, q->group, id, id,
		 q->consumer);
	if (rc)
		return rc;
	rc = r->type == REDIS_REPLY_ARRAY && r->elements == 1 ? 0 : SW_ENOTFOUND;
	freeReplyObject(r);
	if (rc)
		return sw_seterr(err, errlen, rc, "entry %s: no longer held by %s", id, q->consumer);
	rc = run(q, &r, err, errlen, "XCLAIM %s %s %s 0 %s JUSTID", q->stream, q->group,
		 q->consumer, id);
	if (rc)
		return rc;
	freeReplyObject(r);
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
		const char *name = NULL;
		long long pending = -1, idle = -1;

		/* A flat list of field, value pairs: name, pending, idle, ... */
		for (size_t k = 0; c->type == REDIS_REPLY_ARRAY && k + 1 < c->elements; k += 2) {
			const redisReply *key = c->element[k], *val = c->element[k + 1];

			if (key->type != REDIS_REPLY_STRING)
				continue;
			if (!strcmp(key->str, "name") && val->type == REDIS_REPLY_STRING)
				name = val->str;
			else if (!strcmp(key->str, "pending") && val->type == REDIS_REPLY_INTEGER)
				pending = val->integer;
			else if (!strcmp(key->str, "idle") && val->type == REDIS_REPLY_INTEGER)
				idle = val->integer;
		}
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
