/* client.c - the gpud client library (proto/client.h; wire format and the
 * lending rule in proto/README.md).
 *
 * One connection = a non-blocking Unix socket, the attached region, a
 * consumer handle on its response ring and one reader thread. Shared state
 * (request table, request-area spans, counters) sits under c->mu; the
 * socket's send side under c->send_mu, which is never taken while c->mu is
 * held. Callbacks run with neither held.
 *
 * Request table: max_inflight entries allocated at connect, with a stack
 * of free indices; a request is looked up by id with a linear scan (the
 * table is small and the scan is cheap next to a token's compute).
 *
 * Request area: first-fit over [0, req_size) with the used spans kept in an
 * array sorted by offset (at most one span per entry, so max_inflight
 * slots). Spans start on 16-byte boundaries.
 *
 * Life of an entry: begin() reserves it (and a span) and marks it
 * `sending`; the caller encodes into the span and finish() sends the frame
 * and clears `sending`. Replies can arrive before finish() runs: the
 * reader then completes the request but leaves the slot to finish()
 * (ENTRY_ENDED). The connection's failure path waits until no entry is
 * `sending`, so that a submit either fails without a callback or is owned
 * by the failure path, never both.
 */
#include "proto/client.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/time.h"
#include "proto/frame.h"
#include "proto/shm.h"

#define SPAN_ALIGN 16u
#define DEFAULT_MAX_INFLIGHT 256u
#define DEFAULT_MAX_REGION ((size_t)1 << 30)

/* What a blocking call collects; lives on the caller's stack. The reader
 * writes it (under c->mu) until `done`, or until the caller detaches it
 * after a timeout. */
struct waiter {
	pthread_cond_t cv;  /* signalled when done */
	bool done;
	int status;
	char *text;         /* generated text or JSON, NUL-terminated */
	size_t text_len;
	size_t text_cap;
	int32_t *ids;       /* (n_ids) generated or tokenized ids */
	uint32_t n_ids;
	uint32_t ids_cap;
	float *vec;         /* (dim) embedding */
	uint32_t dim;
	struct proto_done usage;
	char msg[PROTO_MAX_ERROR_MSG];
};

enum entry_kind {
	ENTRY_FREE = 0,
	ENTRY_CALLBACK, /* submit with events */
	ENTRY_WAITER,   /* a blocking call waiting on w */
	ENTRY_ORPHAN,   /* a blocking call that timed out: replies dropped */
	ENTRY_ENDED,    /* ended while its sender was still in finish() */
};

struct entry {
	uint64_t id;
	enum entry_kind kind;
	uint16_t req_type;  /* PROTO_T_SUBMIT, _TOKENIZE, ... */
	bool sending;
	bool replied;       /* a record came while `sending`: finish()
			     * frees the span */
	bool has_span;
	uint64_t span_off;  /* in the request area */
	struct proto_client_events ev;
	struct waiter *w;
};

struct span {
	uint64_t off;
	uint64_t len;
};

struct proto_client {
	int sock;                /* non-blocking */
	int wake_fd;             /* eventfd: close() -> reader */
	int server_pid;
	struct proto_shm *shm;
	struct proto_ring *ring; /* consumer; used by the reader thread only */
	uint8_t *req_area;
	uint64_t req_off;
	uint64_t req_size;
	uint32_t timeout_ms;
	uint32_t max_inflight;
	struct proto_limits lim;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];

	pthread_t reader;
	bool reader_started;
	bool mu_init;

	pthread_mutex_t mu;
	pthread_cond_t room;     /* an entry or span freed; the connection died */
	pthread_cond_t reply;    /* a sender finished, a caller left */
	pthread_condattr_t cattr; /* CLOCK_MONOTONIC, for every condvar */
	pthread_mutex_t send_mu;

	atomic_bool dead;
	bool closing;
	char dead_msg[SW_ERR_MAX];
	uint64_t next_id;
	uint32_t n_sending;
	uint32_t n_callers;

	struct entry *entries;   /* (max_inflight) */
	uint32_t *free_idx;      /* (max_inflight) stack of free entries */
	uint32_t n_free;
	struct span *spans;      /* (max_inflight) used spans, sorted by off */
	uint32_t n_spans;
};

/* Arguments of one request, by type. */
struct req_args {
	const struct proto_submit_req *req; /* SUBMIT */
	uint32_t flags;                     /* TOKENIZE, MEM */
	const char *text;                   /* TOKENIZE, EMBED */
	uint32_t len;
};

void proto_client_opts_default(struct proto_client_opts *o)
{
	*o = (struct proto_client_opts){
		.timeout_ms = 0,
		.max_inflight = DEFAULT_MAX_INFLIGHT,
		.max_region = DEFAULT_MAX_REGION,
	};
}

/* --- deadlines ----------------------------------------------------------- */

/* An absolute CLOCK_MONOTONIC time timeout_ms from now; false (no
 * deadline) when timeout_ms is 0. */
static bool deadline_in(uint32_t timeout_ms, struct timespec *ts)
{
	if (!timeout_ms)
		return false;
	uint64_t at = sw_now_ns() + (uint64_t)timeout_ms * SW_NS_PER_MS;
	ts->tv_sec = (time_t)(at / SW_NS_PER_S);
	ts->tv_nsec = (long)(at % SW_NS_PER_S);
	return true;
}

/* Milliseconds left before ts (for poll), -1 without a deadline. */
static int ms_left(const struct timespec *ts)
{
	if (!ts)
		return -1;
	uint64_t at = (uint64_t)ts->tv_sec * SW_NS_PER_S + (uint64_t)ts->tv_nsec;
	uint64_t now = sw_now_ns();
	if (now >= at)
		return 0;
	uint64_t ms = (at - now + SW_NS_PER_MS - 1) / SW_NS_PER_MS;
	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* Waits on cv; SW_EBUSY once the deadline (NULL: none) passes. */
static int cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *ts)
{
	if (!ts) {
		pthread_cond_wait(cv, mu);
		return 0;
	}
	return pthread_cond_timedwait(cv, mu, ts) == ETIMEDOUT ? SW_EBUSY : 0;
}

/* --- request table and request area (c->mu held) ------------------------- */

static uint64_t align_up(uint64_t v)
{
	return (v + SPAN_ALIGN - 1) & ~(uint64_t)(SPAN_ALIGN - 1);
}

/* First fit for len bytes: the offset in *off and the sorted position the
 * span goes to in *pos. False when no gap is large enough. */
static bool span_find(const struct proto_client *c, uint64_t len, uint64_t *off, uint32_t *pos)
{
	uint64_t at = 0;
	uint32_t i;
	for (i = 0; i < c->n_spans; i++) {
		if (c->spans[i].off >= at && c->spans[i].off - at >= len)
			break;
		at = align_up(c->spans[i].off + c->spans[i].len);
	}
	if (i == c->n_spans && (at > c->req_size || c->req_size - at < len))
		return false;
	*off = at;
	*pos = i;
	return true;
}

static void span_insert(struct proto_client *c, uint32_t pos, uint64_t off, uint64_t len)
{
	memmove(&c->spans[pos + 1], &c->spans[pos], (c->n_spans - pos) * sizeof(c->spans[0]));
	c->spans[pos] = (struct span){ .off = off, .len = len };
	c->n_spans++;
}

static void span_release(struct proto_client *c, struct entry *e)
{
	if (!e->has_span)
		return;
	e->has_span = false;
	for (uint32_t i = 0; i < c->n_spans; i++) {
		if (c->spans[i].off == e->span_off) {
			memmove(&c->spans[i], &c->spans[i + 1],
				(c->n_spans - i - 1) * sizeof(c->spans[0]));
			c->n_spans--;
			break;
		}
	}
	pthread_cond_broadcast(&c->room);
}

static void entry_release(struct proto_client *c, uint32_t idx)
{
	struct entry *e = &c->entries[idx];
	span_release(c, e);
	*e = (struct entry){ .kind = ENTRY_FREE };
	c->free_idx[c->n_free++] = idx;
	pthread_cond_broadcast(&c->room);
}

/* The live entry of request id (not free, not ended), or -1. */
static int entry_find(const struct proto_client *c, uint64_t id)
{
	for (uint32_t i = 0; i < c->max_inflight; i++) {
		const struct entry *e = &c->entries[i];
		if (e->kind != ENTRY_FREE && e->kind != ENTRY_ENDED && e->id == id)
			return (int)i;
	}
	return -1;
}

static int closed_err(const struct proto_client *c, char *err, size_t errlen)
{
	return sw_seterr(err, errlen, SW_ECLOSED, "connection to gpud is closed: %s", c->dead_msg);
}

/* --- callers ------------------------------------------------------------- */

/* Every public call on a live connection is counted, so that close() can
 * wait until every thread woken with SW_ECLOSED has left. */
static int caller_enter(struct proto_client *c, char *err, size_t errlen)
{
	pthread_mutex_lock(&c->mu);
	if (atomic_load(&c->dead)) {
		int rc = closed_err(c, err, errlen);
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	c->n_callers++;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

static void caller_leave(struct proto_client *c)
{
	pthread_mutex_lock(&c->mu);
	c->n_callers--;
	if (c->closing)
		pthread_cond_broadcast(&c->reply);
	pthread_mutex_unlock(&c->mu);
}

/* --- sending ------------------------------------------------------------- */

/* Sends one frame (waiting for socket room up to the connection's timeout:
 * SW_EBUSY). Never called with c->mu held. */
static int send_frame(struct proto_client *c, const struct proto_frame *f)
{
	struct timespec ts = { 0 };
	bool has_dl = deadline_in(c->timeout_ms, &ts);
	int rc;
	pthread_mutex_lock(&c->send_mu);
	for (;;) {
		rc = proto_send_frame(c->sock, f, -1);
		if (rc != -EAGAIN)
			break;
		struct pollfd p = { .fd = c->sock, .events = POLLOUT };
		int n = poll(&p, 1, ms_left(has_dl ? &ts : NULL));
		if (n == 0) {
			rc = SW_EBUSY;
			break;
		}
		if (n < 0 && errno != EINTR) {
			rc = -errno;
			break;
		}
	}
	pthread_mutex_unlock(&c->send_mu);
	return rc;
}

static int send_cancel(struct proto_client *c, uint64_t id)
{
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_CANCEL, id);
	return send_frame(c, &f);
}

/* --- requests ------------------------------------------------------------ */

static int request_size(uint16_t type, const struct req_args *a, size_t *size, char *err,
			size_t errlen)
{
	switch (type) {
	case PROTO_T_SUBMIT:
		return proto_submit_size(a->req, size, err, errlen);
	case PROTO_T_TOKENIZE:
	case PROTO_T_EMBED:
	case PROTO_T_DETOKENIZE:
		*size = proto_text_req_size(a->len);
		return 0;
	case PROTO_T_MEM:
		*size = PROTO_MEM_REQ_SIZE;
		return 0;
	default: /* STATS */
		*size = 0;
		return 0;
	}
}

static int request_encode(uint16_t type, const struct req_args *a, uint8_t *buf, size_t cap,
			  char *err, size_t errlen)
{
	size_t len = 0;
	int rc;
	switch (type) {
	case PROTO_T_SUBMIT:
		return proto_submit_encode(a->req, buf, cap, &len, err, errlen);
	case PROTO_T_TOKENIZE:
	case PROTO_T_EMBED:
	case PROTO_T_DETOKENIZE:
		rc = proto_text_req_encode(type, buf, cap, a->flags, a->text, a->len, &len);
		break;
	case PROTO_T_MEM:
		rc = proto_mem_req_encode(buf, cap, a->flags, &len);
		break;
	default:
		return 0;
	}
	if (rc)
		return sw_seterr(err, errlen, rc, "encode %s: %s", proto_type_name(type),
				 sw_strerror(rc));
	return 0;
}

/* Reserves an entry and a span of len bytes (waiting for room up to ts
 * unless called from the reader thread, which must never wait for
 * itself), assigns the request id and marks the entry `sending`. */
static int begin(struct proto_client *c, uint16_t type, size_t len,
		 const struct proto_client_events *ev, struct waiter *w, uint32_t *idx_out,
		 uint64_t *id_out, char *err, size_t errlen)
{
	if (len > c->req_size)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "%s request of %zu bytes is larger than the request area (%llu bytes)",
				 proto_type_name(type), len, (unsigned long long)c->req_size);
	struct timespec ts = { 0 };
	bool has_dl = deadline_in(c->timeout_ms, &ts);
	bool may_wait = !pthread_equal(pthread_self(), c->reader);
	uint64_t off = 0;
	uint32_t pos = 0;
	int rc = 0;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		if (atomic_load(&c->dead)) {
			rc = closed_err(c, err, errlen);
			goto out_unlock;
		}
		if (c->n_free > 0 && (len == 0 || span_find(c, len, &off, &pos)))
			break;
		if (!may_wait) {
			rc = sw_seterr(err, errlen, SW_EBUSY,
				       "no room for a %zu-byte request (callbacks cannot wait for room)",
				       len);
			goto out_unlock;
		}
		if (cond_wait_until(&c->room, &c->mu, has_dl ? &ts : NULL) == SW_EBUSY) {
			rc = sw_seterr(err, errlen, SW_EBUSY,
				       "no room for a %zu-byte request within %u ms (%u requests in flight)",
				       len, c->timeout_ms, c->max_inflight - c->n_free);
			goto out_unlock;
		}
	}
	uint32_t idx = c->free_idx[--c->n_free];
	struct entry *e = &c->entries[idx];
	*e = (struct entry){
		.id = c->next_id++,
		.kind = ev ? ENTRY_CALLBACK : ENTRY_WAITER,
		.req_type = type,
		.sending = true,
	};
	if (ev)
		e->ev = *ev;
	e->w = w;
	if (len) {
		span_insert(c, pos, off, len);
		e->has_span = true;
		e->span_off = off;
	}
	c->n_sending++;
	*idx_out = idx;
	*id_out = e->id;
out_unlock:
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* Sends the request's frame (unless rc already says it failed) and hands
 * the entry over to the reader. On failure the entry and span are freed
 * and no reply will ever be delivered. Returns 0 or the error. */
static int finish(struct proto_client *c, uint32_t idx, uint64_t id, uint16_t type, size_t len,
		  int rc, char *err, size_t errlen)
{
	if (!rc) {
		struct proto_frame f;
		proto_frame_init(&f, type, id);
		if (len) {
			f.payload_offset = c->req_off + c->entries[idx].span_off;
			f.payload_length = len;
		}
		rc = send_frame(c, &f);
		if (rc)
			sw_seterr(err, errlen, rc, "send %s: %s", proto_type_name(type),
				  sw_strerror(rc));
	}
	pthread_mutex_lock(&c->mu);
	struct entry *e = &c->entries[idx];
	e->sending = false;
	c->n_sending--;
	if (e->replied)
		span_release(c, e);
	if (e->kind == ENTRY_ENDED) {
		/* Its replies all came in already (and were delivered). */
		entry_release(c, idx);
		rc = 0;
	} else if (rc) {
		entry_release(c, idx);
	}
	pthread_cond_broadcast(&c->reply);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* size + begin + encode + finish. */
static int start(struct proto_client *c, uint16_t type, const struct req_args *a,
		 const struct proto_client_events *ev, struct waiter *w, uint32_t *idx,
		 uint64_t *id, char *err, size_t errlen)
{
	size_t len;
	int rc = request_size(type, a, &len, err, errlen);
	if (rc)
		return rc;
	rc = begin(c, type, len, ev, w, idx, id, err, errlen);
	if (rc)
		return rc;
	if (len)
		rc = request_encode(type, a, c->req_area + c->entries[*idx].span_off, len, err,
				    errlen);
	return finish(c, *idx, *id, type, len, rc, err, errlen);
}

/* --- the reader side ------------------------------------------------------ */

/* Ends the request in entry idx with status (usage for DONE, msg for an
 * error). Called with c->mu held; returns with it released. A callback's
 * on_done runs after the entry is freed, without the lock. */
static void end_request(struct proto_client *c, uint32_t idx, int status,
			const struct proto_done *usage, const char *msg)
{
	struct entry *e = &c->entries[idx];
	struct proto_client_events ev = e->ev;
	uint64_t id = e->id;
	enum entry_kind kind = e->kind;
	char buf[PROTO_MAX_ERROR_MSG];
	snprintf(buf, sizeof(buf), "%s", msg ? msg : "");

	if (kind == ENTRY_WAITER) {
		struct waiter *w = e->w;
		if (!w->status)
			w->status = status;
		if (usage)
			w->usage = *usage;
		if (w->status && !w->msg[0])
			snprintf(w->msg, sizeof(w->msg), "%s",
				 buf[0] ? buf : sw_strerror(w->status));
		w->done = true;
		pthread_cond_signal(&w->cv);
	}
	if (e->sending) {
		e->kind = ENTRY_ENDED;
	} else {
		entry_release(c, idx);
	}
	pthread_mutex_unlock(&c->mu);
	if (kind == ENTRY_CALLBACK)
		ev.on_done(ev.arg, id, status, status ? NULL : usage, status ? buf : "");
}

static int waiter_append(struct waiter *w, const struct proto_tokens *t)
{
	if (t->n_ids) {
		size_t need = (size_t)w->n_ids + t->n_ids;
		if (need > UINT32_MAX)
			return -ENOMEM;
		if (need > w->ids_cap) {
			size_t cap = w->ids_cap ? (size_t)w->ids_cap * 2 : 64;
			while (cap < need)
				cap *= 2;
			if (cap > UINT32_MAX)
				cap = UINT32_MAX;
			int32_t *p = realloc(w->ids, cap * sizeof(*p));
			if (!p)
				return -ENOMEM;
			w->ids = p;
			w->ids_cap = (uint32_t)cap;
		}
		for (uint32_t i = 0; i < t->n_ids; i++)
			w->ids[w->n_ids++] = proto_tokens_id(t, i);
	}
	size_t need = w->text_len + t->text_len + 1;
	if (need > w->text_cap) {
		size_t cap = w->text_cap ? w->text_cap * 2 : 256;
		while (cap < need)
			cap *= 2;
		char *p = realloc(w->text, cap);
		if (!p)
			return -ENOMEM;
		w->text = p;
		w->text_cap = cap;
	}
	memcpy(w->text + w->text_len, t->text, t->text_len);
	w->text_len += t->text_len;
	w->text[w->text_len] = '\0';
	return 0;
}

/* Stores a *_REPLY payload into the waiter (malloc'd copies). */
static int waiter_take_reply(const struct proto_client *c, struct waiter *w,
			     const struct proto_record *rec, char *err, size_t errlen)
{
	int rc;
	switch (rec->type) {
	case PROTO_T_TOKENIZE_REPLY: {
		struct proto_tokens t;
		rc = proto_tokens_decode(rec->payload, rec->len, &c->lim, &t, err, errlen);
		if (rc)
			return rc;
		if (!t.n_ids)
			return 0;
		w->ids = malloc((size_t)t.n_ids * sizeof(*w->ids));
		if (!w->ids)
			return -ENOMEM;
		for (uint32_t i = 0; i < t.n_ids; i++)
			w->ids[i] = proto_tokens_id(&t, i);
		w->n_ids = t.n_ids;
		return 0;
	}
	case PROTO_T_DETOKENIZE_REPLY: {
		struct proto_tokens t;
		rc = proto_tokens_decode(rec->payload, rec->len, &c->lim, &t, err, errlen);
		if (rc)
			return rc;
		if (t.n_ids)
			return sw_seterr(err, errlen, SW_EFORMAT, "DETOKENIZE_REPLY: %u ids (none "
					 "expected)", t.n_ids);
		w->text = malloc((size_t)t.text_len + 1);
		if (!w->text)
			return -ENOMEM;
		memcpy(w->text, t.text, t.text_len);
		w->text[t.text_len] = '\0';
		w->text_len = t.text_len;
		return 0;
	}
	case PROTO_T_EMBED_REPLY: {
		struct proto_embedding e;
		rc = proto_embedding_decode(rec->payload, rec->len, &c->lim, &e, err, errlen);
		if (rc)
			return rc;
		w->vec = malloc((size_t)(e.dim ? e.dim : 1) * sizeof(*w->vec));
		if (!w->vec)
			return -ENOMEM;
		for (uint32_t i = 0; i < e.dim; i++)
			w->vec[i] = proto_embedding_value(&e, i);
		w->dim = e.dim;
		return 0;
	}
	default: { /* STATS_REPLY, MEM_REPLY */
		struct proto_text j;
		rc = proto_json_decode(rec->payload, rec->len, &c->lim, &j, err, errlen);
		if (rc)
			return rc;
		w->text = malloc((size_t)j.len + 1);
		if (!w->text)
			return -ENOMEM;
		memcpy(w->text, j.p, j.len);
		w->text[j.len] = '\0';
		w->text_len = j.len;
		return 0;
	}
	}
}

/* The reply type that completes a request of type req_type. */
static uint16_t reply_type_of(uint16_t req_type)
{
	switch (req_type) {
	case PROTO_T_SUBMIT:
		return PROTO_T_DONE;
	case PROTO_T_TOKENIZE:
		return PROTO_T_TOKENIZE_REPLY;
	case PROTO_T_DETOKENIZE:
		return PROTO_T_DETOKENIZE_REPLY;
	case PROTO_T_EMBED:
		return PROTO_T_EMBED_REPLY;
	case PROTO_T_STATS:
		return PROTO_T_STATS_REPLY;
	default:
		return PROTO_T_MEM_REPLY;
	}
}

/* Delivers one ring record (its payload is a view, valid until the caller
 * consumes the record). */
static void dispatch(struct proto_client *c, const struct proto_record *rec)
{
	char msg[PROTO_MAX_ERROR_MSG];
	int rc;

	pthread_mutex_lock(&c->mu);
	int found = entry_find(c, rec->request_id);
	if (found < 0) {
		/* A late record for a request that already ended: dropped. */
		pthread_mutex_unlock(&c->mu);
		return;
	}
	uint32_t idx = (uint32_t)found;
	struct entry *e = &c->entries[idx];
	/* The first reply ends the loan of the request's bytes. While the
	 * submitter is still in finish() the span is freed there, so that
	 * its writes are ordered before the next owner's under c->mu (the
	 * real order goes through gpud, which no race detector sees). */
	if (e->sending)
		e->replied = true;
	else
		span_release(c, e);

	switch (rec->type) {
	case PROTO_T_TOKENS:
	case PROTO_T_TOKENS_LP: {
		struct proto_tokens t;
		if (e->req_type != PROTO_T_SUBMIT) {
			rc = SW_EFORMAT;
			snprintf(msg, sizeof(msg), "gpud sent %s for a %s request",
				 proto_type_name(rec->type), proto_type_name(e->req_type));
			goto fail;
		}
		rc = rec->type == PROTO_T_TOKENS ?
			     proto_tokens_decode(rec->payload, rec->len, &c->lim, &t, msg,
						 sizeof(msg)) :
			     proto_tokens_lp_decode(rec->payload, rec->len, &c->lim, &t, msg,
						    sizeof(msg));
		if (rc)
			goto fail;
		if (e->kind == ENTRY_WAITER) {
			if (!e->w->status && waiter_append(e->w, &t)) {
				e->w->status = -ENOMEM;
				snprintf(e->w->msg, sizeof(e->w->msg),
					 "out of memory collecting the result");
				pthread_mutex_unlock(&c->mu);
				send_cancel(c, rec->request_id);
				return;
			}
		} else if (e->kind == ENTRY_CALLBACK && e->ev.on_tokens) {
			struct proto_client_events ev = e->ev;
			pthread_mutex_unlock(&c->mu);
			if (ev.on_tokens(ev.arg, rec->request_id, &t))
				send_cancel(c, rec->request_id);
			return;
		}
		pthread_mutex_unlock(&c->mu);
		return;
	}
	case PROTO_T_DONE: {
		struct proto_done d;
		if (e->req_type != PROTO_T_SUBMIT) {
			rc = SW_EFORMAT;
			snprintf(msg, sizeof(msg), "gpud sent DONE for a %s request",
				 proto_type_name(e->req_type));
			goto fail;
		}
		rc = proto_done_decode(rec->payload, rec->len, &d, msg, sizeof(msg));
		if (rc)
			goto fail_ended;
		end_request(c, idx, 0, &d, NULL);
		return;
	}
	case PROTO_T_ERROR: {
		struct proto_error pe;
		rc = proto_error_decode(rec->payload, rec->len, &pe, msg, sizeof(msg));
		if (rc)
			goto fail_ended;
		end_request(c, idx, pe.code, NULL, pe.msg);
		return;
	}
	case PROTO_T_TOKENIZE_REPLY:
	case PROTO_T_EMBED_REPLY:
	case PROTO_T_STATS_REPLY:
	case PROTO_T_MEM_REPLY:
	case PROTO_T_DETOKENIZE_REPLY:
		if (reply_type_of(e->req_type) != rec->type) {
			rc = SW_EFORMAT;
			snprintf(msg, sizeof(msg), "gpud sent %s for a %s request",
				 proto_type_name(rec->type), proto_type_name(e->req_type));
			goto fail;
		}
		if (e->kind == ENTRY_WAITER) {
			rc = waiter_take_reply(c, e->w, rec, msg, sizeof(msg));
			if (rc)
				goto fail_ended;
		}
		end_request(c, idx, 0, NULL, NULL);
		return;
	default:
		/* A record type from a newer gpud: not ours to interpret. */
		pthread_mutex_unlock(&c->mu);
		return;
	}

fail:
	/* The request cannot go on: end it here and tell gpud to stop it. */
	end_request(c, idx, rc, NULL, msg);
	send_cancel(c, rec->request_id);
	return;
fail_ended:
	/* A final record we could not read: the request is over either way. */
	end_request(c, idx, rc, NULL, msg);
}

/* Reads every record the ring holds now. SW_EFORMAT (message in why) when
 * the ring is corrupt. */
static int drain(struct proto_client *c, char *why, size_t whylen)
{
	for (;;) {
		struct proto_record rec;
		int rc = proto_ring_peek(c->ring, &rec);
		if (rc == -EAGAIN)
			return 0;
		if (rc)
			return sw_seterr(why, whylen, rc, "corrupt response ring (%s)",
					 sw_strerror(rc));
		dispatch(c, &rec);
		proto_ring_consume(c->ring);
	}
}

/* A frame-level ERROR (no ring record) for one request. */
static void frame_error(struct proto_client *c, const struct proto_frame *f)
{
	int code = f->aux ? -(int)f->aux : SW_EFORMAT;
	pthread_mutex_lock(&c->mu);
	int idx = entry_find(c, f->request_id);
	if (idx < 0) {
		pthread_mutex_unlock(&c->mu);
		return;
	}
	end_request(c, (uint32_t)idx, code, NULL, sw_strerror(code));
}

/* Reads every frame the socket holds now. Returns 0, or an error with the
 * reason in why once the connection is unusable. */
static int read_frames(struct proto_client *c, char *why, size_t whylen)
{
	for (;;) {
		uint8_t buf[PROTO_FRAME_SIZE];
		struct proto_frame f;
		char ferr[SW_ERR_MAX];
		int rc = proto_recv_frame(c->sock, buf, NULL);
		if (rc == -EAGAIN)
			return 0;
		if (rc == SW_ECLOSED)
			return sw_seterr(why, whylen, rc, "gpud closed the connection");
		if (rc)
			return sw_seterr(why, whylen, rc, "receive from gpud: %s", sw_strerror(rc));
		rc = proto_frame_decode(buf, sizeof(buf), &f, ferr, sizeof(ferr));
		if (rc == SW_EUNSUPPORTED)
			continue; /* a frame type from a newer gpud */
		if (rc)
			return sw_seterr(why, whylen, rc, "bad frame from gpud: %s", ferr);
		if (f.flags & PROTO_F_RING) {
			rc = drain(c, why, whylen);
			if (rc)
				return rc;
		} else if (f.type == PROTO_T_ERROR) {
			if (!f.request_id)
				return sw_seterr(why, whylen, SW_ECLOSED,
						 "gpud ended the connection: %s",
						 sw_strerror(f.aux ? -(int)f.aux : SW_EFORMAT));
			frame_error(c, &f);
		}
		/* Other frames without a ring payload carry nothing for us. */
	}
}

/* Ends every request still in the table with SW_ECLOSED, once. Waits
 * until no submitter is between begin() and finish(), so each entry is
 * either failed by its submitter (no callback) or here. */
static void fail_all(struct proto_client *c)
{
	char msg[SW_ERR_MAX + 32]; /* a prefix, then dead_msg */
	pthread_mutex_lock(&c->mu);
	while (c->n_sending)
		pthread_cond_wait(&c->reply, &c->mu);
	snprintf(msg, sizeof(msg), "connection to gpud closed: %s", c->dead_msg);
	for (uint32_t i = 0; i < c->max_inflight; i++) {
		struct entry *e = &c->entries[i];
		if (e->kind == ENTRY_FREE)
			continue;
		end_request(c, i, SW_ECLOSED, NULL, msg);
		pthread_mutex_lock(&c->mu);
	}
	pthread_cond_broadcast(&c->room);
	pthread_cond_broadcast(&c->reply);
	pthread_mutex_unlock(&c->mu);
}

/* Marks the connection dead with a reason (the first one wins). */
static void mark_dead(struct proto_client *c, const char *why)
{
	pthread_mutex_lock(&c->mu);
	if (!atomic_load(&c->dead)) {
		snprintf(c->dead_msg, sizeof(c->dead_msg), "%s", why);
		atomic_store(&c->dead, true);
	}
	pthread_cond_broadcast(&c->room);
	pthread_cond_broadcast(&c->reply);
	pthread_mutex_unlock(&c->mu);
}

static void *reader_main(void *arg)
{
	struct proto_client *c = arg;
	char why[SW_ERR_MAX] = "";
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = c->sock, .events = POLLIN },
			{ .fd = c->wake_fd, .events = POLLIN },
		};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			snprintf(why, sizeof(why), "poll: %s", strerror(errno));
			break;
		}
		if (p[1].revents)
			break;
		if (!p[0].revents)
			continue;
		if (read_frames(c, why, sizeof(why)))
			break;
	}
	pthread_mutex_lock(&c->mu);
	bool closing = c->closing;
	pthread_mutex_unlock(&c->mu);
	if (!closing) {
		/* gpud went away (or broke the protocol): stop the senders,
		 * then end everything in flight. */
		mark_dead(c, why[0] ? why : "connection lost");
		shutdown(c->sock, SHUT_RDWR);
		fail_all(c);
	}
	return NULL;
}

/* --- connect / close ------------------------------------------------------ */

static void client_free(struct proto_client *c)
{
	if (!c)
		return;
	proto_ring_close(c->ring);
	proto_shm_destroy(c->shm);
	if (c->sock >= 0)
		close(c->sock);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	if (c->mu_init) {
		pthread_mutex_destroy(&c->mu);
		pthread_mutex_destroy(&c->send_mu);
		pthread_cond_destroy(&c->room);
		pthread_cond_destroy(&c->reply);
		pthread_condattr_destroy(&c->cattr);
	}
	free(c->entries);
	free(c->free_idx);
	free(c->spans);
	free(c);
}

static int client_alloc(struct proto_client **out, const struct proto_client_opts *o)
{
	struct proto_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->sock = -1;
	c->wake_fd = -1;
	c->timeout_ms = o->timeout_ms;
	c->max_inflight = o->max_inflight;
	c->next_id = 1;
	proto_limits_default(&c->lim);
	/* gpud sizes its replies; the ring bounds them. */
	c->lim.max_text_bytes = UINT32_MAX;
	c->lim.max_ids = UINT32_MAX;
	c->lim.max_embed_dim = UINT32_MAX;
	c->lim.max_json_bytes = UINT32_MAX;
	c->entries = calloc(o->max_inflight, sizeof(*c->entries));
	c->free_idx = calloc(o->max_inflight, sizeof(*c->free_idx));
	c->spans = calloc(o->max_inflight, sizeof(*c->spans));
	if (!c->entries || !c->free_idx || !c->spans)
		goto out_free;
	for (uint32_t i = 0; i < o->max_inflight; i++)
		c->free_idx[i] = o->max_inflight - 1 - i;
	c->n_free = o->max_inflight;

	if (pthread_condattr_init(&c->cattr))
		goto out_free;
	pthread_condattr_setclock(&c->cattr, CLOCK_MONOTONIC);
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->send_mu, NULL);
	pthread_cond_init(&c->room, &c->cattr);
	pthread_cond_init(&c->reply, &c->cattr);
	c->mu_init = true;
	*out = c;
	return 0;

out_free:
	client_free(c);
	return -ENOMEM;
}

/* connect() on the non-blocking socket, retrying while the listen backlog
 * is full (EAGAIN on Unix sockets) until the deadline. */
static int connect_socket(struct proto_client *c, const char *path, const struct timespec *ts,
			  char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, path, strlen(path) + 1);
	c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->sock < 0)
		return sw_seterr(err, errlen, -errno, "socket: %s", strerror(errno));
	for (;;) {
		if (connect(c->sock, (const struct sockaddr *)&sa, sizeof(sa)) == 0)
			return 0;
		int e = errno;
		if (e == EINTR)
			continue;
		if (e == EAGAIN) {
			if (ts && ms_left(ts) == 0)
				return sw_seterr(err, errlen, SW_EBUSY,
						 "connect %s: listen backlog full for %u ms",
						 path, c->timeout_ms);
			sw_sleep_ms(1);
			continue;
		}
		if (e == EINPROGRESS) {
			struct pollfd p = { .fd = c->sock, .events = POLLOUT };
			int n = poll(&p, 1, ms_left(ts));
			if (n == 0)
				return sw_seterr(err, errlen, SW_EBUSY, "connect %s: timed out",
						 path);
			int soerr = 0;
			socklen_t sl = sizeof(soerr);
			if (n < 0 || getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
				soerr = errno;
			if (!soerr)
				return 0;
			e = soerr;
		}
		if (e == ENOENT || e == ECONNREFUSED)
			return sw_seterr(err, errlen, -e, "connect %s: %s (gpud not running?)",
					 path, strerror(e));
		return sw_seterr(err, errlen, -e, "connect %s: %s", path, strerror(e));
	}
}

/* HELLO / HELLO_REPLY; on success *fd is the region's descriptor and
 * *size the size gpud announced. */
static int hello(struct proto_client *c, const char *path, const struct timespec *ts, int *fd,
		 uint64_t *size, char *err, size_t errlen)
{
	struct proto_frame f;
	uint8_t buf[PROTO_FRAME_SIZE];
	char ferr[SW_ERR_MAX];
	int rc;

	*fd = -1;
	proto_frame_init(&f, PROTO_T_HELLO, 0);
	rc = send_frame(c, &f);
	/* A peer gpud refuses is told so at once and closed: its ERROR may
	 * wait to be read even when the HELLO could not be sent. */
	if (rc && rc != SW_ECLOSED)
		return sw_seterr(err, errlen, rc, "send HELLO to %s: %s", path, sw_strerror(rc));
	for (;;) {
		struct pollfd p = { .fd = c->sock, .events = POLLIN };
		int n = poll(&p, 1, ms_left(ts));
		if (n == 0)
			return sw_seterr(err, errlen, SW_EBUSY, "no HELLO reply from gpud at %s within %u ms",
					 path, c->timeout_ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return sw_seterr(err, errlen, -errno, "poll: %s", strerror(errno));
		}
		rc = proto_recv_frame(c->sock, buf, fd);
		if (rc == -EAGAIN)
			continue;
		break;
	}
	if (rc == SW_ECLOSED)
		return sw_seterr(err, errlen, rc, "gpud at %s closed the connection after HELLO",
				 path);
	if (rc)
		return sw_seterr(err, errlen, rc, "receive HELLO reply from %s: %s", path,
				 sw_strerror(rc));
	rc = proto_frame_decode(buf, sizeof(buf), &f, ferr, sizeof(ferr));
	if (rc == SW_EVERSION)
		rc = sw_seterr(err, errlen, SW_EVERSION,
			       "gpud at %s speaks protocol version %u, this client version %u",
			       path, f.version, PROTO_VERSION);
	else if (rc)
		rc = sw_seterr(err, errlen, SW_EFORMAT, "bad HELLO reply from %s: %s", path, ferr);
	else if (f.type == PROTO_T_ERROR && f.aux == (uint32_t)-SW_EVERSION)
		rc = sw_seterr(err, errlen, SW_EVERSION,
			       "gpud at %s refused protocol version %u (this client's)", path,
			       PROTO_VERSION);
	else if (f.type == PROTO_T_ERROR && f.aux == EACCES)
		rc = sw_seterr(err, errlen, -EACCES, "gpud at %s refused this client (uid %u, gid "
			       "%u): not admitted by gpud.allowed_uids / gpud.allowed_gids",
			       path, (unsigned)geteuid(), (unsigned)getegid());
	else if (f.type == PROTO_T_ERROR && f.aux)
		rc = sw_seterr(err, errlen, -(int)f.aux, "gpud at %s refused the connection: %s",
			       path, sw_strerror(-(int)f.aux));
	else if (f.type != PROTO_T_HELLO_REPLY || *fd < 0)
		rc = sw_seterr(err, errlen, SW_EFORMAT,
			       "expected HELLO_REPLY with a descriptor from %s, got %s%s", path,
			       proto_type_name(f.type), *fd < 0 ? " without one" : "");
	if (rc) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return rc;
	}
	*size = f.payload_length;
	return 0;
}

int proto_client_connect(struct proto_client **out, const char *socket_path,
			 const struct proto_client_opts *opts, char *err, size_t errlen)
{
	struct proto_client_opts o;
	struct proto_client *c = NULL;
	struct timespec ts = { 0 };
	char aerr[SW_ERR_MAX];
	uint64_t size = 0;
	int fd = -1;
	int rc;

	if (out)
		*out = NULL;
	if (!out || !socket_path)
		return sw_seterr(err, errlen, -EINVAL, "connect: NULL argument");
	if (strlen(socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return sw_seterr(err, errlen, -ENAMETOOLONG, "socket path too long: %s",
				 socket_path);
	proto_client_opts_default(&o);
	if (opts) {
		o.timeout_ms = opts->timeout_ms;
		if (opts->max_inflight)
			o.max_inflight = opts->max_inflight;
		if (opts->max_region)
			o.max_region = opts->max_region;
	}
	bool has_dl = deadline_in(o.timeout_ms, &ts);

	rc = client_alloc(&c, &o);
	if (rc)
		return sw_seterr(err, errlen, rc, "connect: out of memory");
	snprintf(c->path, sizeof(c->path), "%s", socket_path);
	rc = connect_socket(c, socket_path, has_dl ? &ts : NULL, err, errlen);
	if (rc)
		goto out_free;
	rc = hello(c, socket_path, has_dl ? &ts : NULL, &fd, &size, err, errlen);
	if (rc)
		goto out_free;
	rc = proto_shm_attach(&c->shm, fd, o.max_region, aerr, sizeof(aerr));
	if (rc) {
		close(fd);
		sw_seterr(err, errlen, rc, "region from gpud at %s: %s", socket_path, aerr);
		goto out_free;
	}
	const struct proto_shm_layout *l = proto_shm_layout(c->shm);
	if (l->size != size) {
		rc = sw_seterr(err, errlen, SW_EFORMAT,
			       "region from gpud at %s: HELLO_REPLY says %llu bytes, the file has %llu",
			       socket_path, (unsigned long long)size, (unsigned long long)l->size);
		goto out_free;
	}
	c->req_area = proto_shm_req_area(c->shm);
	c->req_off = l->req_off;
	c->req_size = l->req_size;
	rc = proto_shm_ring(c->shm, PROTO_RING_CONSUMER, &c->ring, aerr, sizeof(aerr));
	if (rc) {
		sw_seterr(err, errlen, rc, "ring from gpud at %s: %s", socket_path, aerr);
		goto out_free;
	}
	pid_t pid = 0;
	if (proto_peercred(c->sock, NULL, NULL, &pid) == 0)
		c->server_pid = (int)pid;
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake_fd < 0) {
		rc = sw_seterr(err, errlen, -errno, "eventfd: %s", strerror(errno));
		goto out_free;
	}
	int prc = pthread_create(&c->reader, NULL, reader_main, c);
	if (prc) {
		rc = sw_seterr(err, errlen, -prc, "reader thread: %s", strerror(prc));
		goto out_free;
	}
	c->reader_started = true;
	*out = c;
	return 0;

out_free:
	client_free(c);
	return rc;
}

void proto_client_close(struct proto_client *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->closing = true;
	pthread_mutex_unlock(&c->mu);
	mark_dead(c, "closed by the client");
	uint64_t one = 1;
	if (write(c->wake_fd, &one, sizeof(one)) < 0) {
		/* The eventfd cannot overflow at 1; shutdown below wakes the
		 * reader anyway. */
	}
	shutdown(c->sock, SHUT_RDWR);
	if (c->reader_started)
		pthread_join(c->reader, NULL);
	fail_all(c);
	pthread_mutex_lock(&c->mu);
	while (c->n_callers)
		pthread_cond_wait(&c->reply, &c->mu);
	pthread_mutex_unlock(&c->mu);
	client_free(c);
}

bool proto_client_alive(const struct proto_client *c)
{
	return c && !atomic_load(&((struct proto_client *)c)->dead);
}

int proto_client_server_pid(const struct proto_client *c)
{
	return c ? c->server_pid : 0;
}

/* --- public requests ------------------------------------------------------- */

int proto_client_submit(struct proto_client *c, const struct proto_submit_req *req,
			const struct proto_client_events *ev, uint64_t *request_id,
			char *err, size_t errlen)
{
	uint32_t idx;
	uint64_t id = 0;
	if (request_id)
		*request_id = 0;
	if (!c || !req || !ev || !ev->on_done)
		return sw_seterr(err, errlen, -EINVAL, "submit: NULL argument or no on_done");
	int rc = caller_enter(c, err, errlen);
	if (rc)
		return rc;
	struct req_args a = { .req = req };
	rc = start(c, PROTO_T_SUBMIT, &a, ev, NULL, &idx, &id, err, errlen);
	if (!rc && request_id)
		*request_id = id;
	caller_leave(c);
	return rc;
}

int proto_client_cancel(struct proto_client *c, uint64_t request_id)
{
	if (!c)
		return -EINVAL;
	int rc = caller_enter(c, NULL, 0);
	if (rc)
		return rc;
	pthread_mutex_lock(&c->mu);
	int idx = entry_find(c, request_id);
	bool ours = idx >= 0 && c->entries[idx].kind != ENTRY_ORPHAN;
	pthread_mutex_unlock(&c->mu);
	rc = ours ? send_cancel(c, request_id) : SW_ENOTFOUND;
	caller_leave(c);
	return rc;
}

/* Waits for the waiter's request to end. On timeout the entry is detached
 * (its later replies are dropped), a generation is cancelled, and the
 * waiter gets SW_EBUSY. */
static void wait_done(struct proto_client *c, uint32_t idx, uint64_t id, uint16_t type,
		      struct waiter *w)
{
	struct timespec ts = { 0 };
	bool has_dl = deadline_in(c->timeout_ms, &ts);
	bool timed_out = false;
	pthread_mutex_lock(&c->mu);
	while (!w->done) {
		if (cond_wait_until(&w->cv, &c->mu, has_dl ? &ts : NULL) == SW_EBUSY &&
		    !w->done) {
			struct entry *e = &c->entries[idx];
			e->kind = ENTRY_ORPHAN;
			e->w = NULL;
			w->status = SW_EBUSY;
			snprintf(w->msg, sizeof(w->msg), "no reply from gpud within %u ms%s",
				 c->timeout_ms, type == PROTO_T_SUBMIT ? " (request cancelled)" : "");
			timed_out = true;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (timed_out && type == PROTO_T_SUBMIT)
		send_cancel(c, id);
}

static void waiter_free(struct waiter *w)
{
	free(w->text);
	free(w->ids);
	free(w->vec);
}

/* A blocking request: start, wait, and the status (message in err). */
static int call(struct proto_client *c, uint16_t type, const struct req_args *a,
		struct waiter *w, char *err, size_t errlen)
{
	uint32_t idx;
	uint64_t id;
	/* The reader thread would wait for itself. */
	if (pthread_equal(pthread_self(), c->reader))
		return sw_seterr(err, errlen, -EDEADLK,
				 "%s: blocking call from a callback of the same connection",
				 proto_type_name(type));
	int rc = caller_enter(c, err, errlen);
	if (rc)
		return rc;
	pthread_cond_init(&w->cv, &c->cattr);
	rc = start(c, type, a, NULL, w, &idx, &id, err, errlen);
	if (!rc) {
		wait_done(c, idx, id, type, w);
		rc = w->status;
		if (rc)
			sw_seterr(err, errlen, rc, "%s", w->msg[0] ? w->msg : sw_strerror(rc));
	}
	/* Whoever signalled did so holding c->mu, which wait_done took
	 * after it: nobody touches cv any more. */
	pthread_cond_destroy(&w->cv);
	caller_leave(c);
	return rc;
}

int proto_client_generate(struct proto_client *c, const struct proto_submit_req *req,
			  struct proto_client_result *res, char *err, size_t errlen)
{
	if (!res)
		return sw_seterr(err, errlen, -EINVAL, "generate: NULL result");
	memset(res, 0, sizeof(*res));
	if (!c || !req)
		return sw_seterr(err, errlen, -EINVAL, "generate: NULL argument");
	struct waiter w = { 0 };
	struct req_args a = { .req = req };
	int rc = call(c, PROTO_T_SUBMIT, &a, &w, err, errlen);
	if (!w.text) {
		w.text = calloc(1, 1);
		if (!w.text && !rc)
			rc = sw_seterr(err, errlen, -ENOMEM, "generate: out of memory");
	}
	res->text = w.text;
	res->text_len = w.text_len;
	res->ids = w.ids;
	res->n_ids = w.n_ids;
	res->usage = w.usage;
	return rc;
}

void proto_client_result_free(struct proto_client_result *res)
{
	if (!res)
		return;
	free(res->text);
	free(res->ids);
	memset(res, 0, sizeof(*res));
}

int proto_client_tokenize(struct proto_client *c, const char *text, size_t len, uint32_t flags,
			  int32_t **ids, uint32_t *n, char *err, size_t errlen)
{
	if (ids)
		*ids = NULL;
	if (n)
		*n = 0;
	if (!c || !ids || !n || (!text && len))
		return sw_seterr(err, errlen, -EINVAL, "tokenize: NULL argument");
	if (flags & ~PROTO_TOK_FLAGS_KNOWN)
		return sw_seterr(err, errlen, -EINVAL, "tokenize: unknown flags 0x%x", flags);
	if (len > UINT32_MAX - 8)
		return sw_seterr(err, errlen, SW_ETOOLONG, "tokenize: %zu bytes of text", len);
	struct waiter w = { 0 };
	struct req_args a = { .flags = flags, .text = text, .len = (uint32_t)len };
	int rc = call(c, PROTO_T_TOKENIZE, &a, &w, err, errlen);
	if (!rc) {
		*ids = w.ids;
		*n = w.n_ids;
		w.ids = NULL;
	}
	waiter_free(&w);
	return rc;
}

int proto_client_detokenize(struct proto_client *c, const int32_t *ids, uint32_t n,
			    uint32_t flags, char **text, size_t *len, char *err, size_t errlen)
{
	if (text)
		*text = NULL;
	if (len)
		*len = 0;
	if (!c || !text || !len || (!ids && n))
		return sw_seterr(err, errlen, -EINVAL, "detokenize: NULL argument");
	if (flags & ~PROTO_DETOK_FLAGS_KNOWN)
		return sw_seterr(err, errlen, -EINVAL, "detokenize: unknown flags 0x%x", flags);
	if (n > (UINT32_MAX - 8) / 4)
		return sw_seterr(err, errlen, SW_ETOOLONG, "detokenize: %u ids", n);
	uint8_t *le = malloc(n ? (size_t)n * 4 : 1);
	if (!le)
		return sw_seterr(err, errlen, -ENOMEM, "detokenize: out of memory");
	for (uint32_t i = 0; i < n; i++)
		proto_put32(le + 4 * (size_t)i, (uint32_t)ids[i]);
	struct waiter w = { 0 };
	struct req_args a = { .flags = flags, .text = (const char *)le, .len = n * 4 };
	int rc = call(c, PROTO_T_DETOKENIZE, &a, &w, err, errlen);
	free(le);
	if (!rc) {
		*text = w.text ? w.text : strdup("");
		*len = w.text_len;
		w.text = NULL;
		if (!*text)
			rc = sw_seterr(err, errlen, -ENOMEM, "detokenize: out of memory");
	}
	waiter_free(&w);
	return rc;
}

int proto_client_embed(struct proto_client *c, const char *text, size_t len,
		       float **vec, uint32_t *dim, char *err, size_t errlen)
{
	if (vec)
		*vec = NULL;
	if (dim)
		*dim = 0;
	if (!c || !vec || !dim || (!text && len))
		return sw_seterr(err, errlen, -EINVAL, "embed: NULL argument");
	if (len > UINT32_MAX - 8)
		return sw_seterr(err, errlen, SW_ETOOLONG, "embed: %zu bytes of text", len);
	struct waiter w = { 0 };
	struct req_args a = { .text = text, .len = (uint32_t)len };
	int rc = call(c, PROTO_T_EMBED, &a, &w, err, errlen);
	if (!rc) {
		*vec = w.vec;
		*dim = w.dim;
		w.vec = NULL;
	}
	waiter_free(&w);
	return rc;
}

static int json_call(struct proto_client *c, uint16_t type, uint32_t flags, char **json,
		     char *err, size_t errlen)
{
	struct waiter w = { 0 };
	struct req_args a = { .flags = flags };
	int rc = call(c, type, &a, &w, err, errlen);
	if (!rc) {
		*json = w.text;
		w.text = NULL;
	}
	waiter_free(&w);
	return rc;
}

int proto_client_stats(struct proto_client *c, char **json, char *err, size_t errlen)
{
	if (json)
		*json = NULL;
	if (!c || !json)
		return sw_seterr(err, errlen, -EINVAL, "stats: NULL argument");
	return json_call(c, PROTO_T_STATS, 0, json, err, errlen);
}

int proto_client_mem(struct proto_client *c, uint32_t flags, char **json,
		     char *err, size_t errlen)
{
	if (json)
		*json = NULL;
	if (!c || !json)
		return sw_seterr(err, errlen, -EINVAL, "mem: NULL argument");
	if (flags & ~PROTO_MEM_FLAGS_KNOWN)
		return sw_seterr(err, errlen, -EINVAL, "mem: unknown flags 0x%x", flags);
	return json_call(c, PROTO_T_MEM, flags, json, err, errlen);
}
