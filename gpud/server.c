/* server.c - gpud's socket front end: connections, regions, rings, frame
 * dispatch and the reply path (contract in server.h, wire format in
 * proto/README.md).
 *
 * Threads. The loop thread owns the libuv handles and everything marked
 * "loop" below. Device threads call gpud_sreq_*; they touch only what the
 * connection lock guards, then ask the loop for work (a doorbell to send, a
 * connection to reap or close, the staging timer) through the pend list
 * and one uv_async.
 *
 * Locks, in the only order they are ever nested:
 *   1. sconn.lock     one connection: its ring (production), request list,
 *                     staging, error queue, doorbell and state flags
 *   2. slot_lock      the pool of request slots
 *   3. pend_lock      the loop's work list, timer request, backlog count,
 *                     and the right to uv_async_send (cleared at close)
 *   4. stat_lock      counters
 * No service op is called with any lock held: ops.cancel takes the
 * scheduler's lock, whose callbacks call gpud_sreq_*, which take sconn.lock.
 *
 * Slot lifetime. A request slot belongs to its connection from acceptance
 * until it has ended (gpud_sreq_done/...), its records are in the ring or
 * dropped, and no ops.cancel call is running on it (cancel_pending). Slots
 * are reused only by the loop thread, so a slot the loop is cancelling
 * stays valid for that call even when the service ends it meanwhile. A
 * connection slot is reused only when its handle is closed and it holds no
 * request slot; its mutex lives as long as the server.
 */
#include "gpud/server.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "common/err.h"
#include "common/log.h"
#include "common/pool.h"
#include "common/time.h"
#include "proto/frame.h"
#include "proto/shm.h"

#define RBUF_FRAMES 32 /* frames one read can take */
#define ERRQ_LEN 8     /* loop-made errors waiting for ring room, per connection */
#define ERR_REC_MAX (8 + PROTO_MAX_ERROR_MSG) /* largest ERROR payload */
#define FIN_MAX ERR_REC_MAX                   /* DONE (48) or ERROR */
#define TIMER_MS 2                            /* staging retry period */
#define ERRLEN 256

static_assert(FIN_MAX >= PROTO_DONE_SIZE, "a DONE fits the final record");

enum conn_state {
	CONN_FREE = 0, /* slot unused */
	CONN_OPEN,     /* accepted, serving */
	CONN_CLOSING,  /* uv_close called */
	CONN_CLOSED,   /* handle closed; waiting for its request slots */
};

struct errrec {
	uint64_t id;
	uint32_t len;
	uint8_t buf[ERR_REC_MAX];
};

struct sconn {
	uv_pipe_t pipe; /* ipc mode: received descriptors become visible */
	uv_write_t wreq;
	struct gpud_server *s;
	uint32_t idx;
	/* loop */
	enum conn_state state;
	bool hello;
	bool wbusy;        /* wreq in flight */
	bool close_after;  /* close once wreq completes */
	bool db_deferred;  /* a doorbell waits for wreq */
	uint16_t dd_type;
	uint64_t dd_id;
	uint32_t bad_frames;
	size_t rlen;
	uint8_t rbuf[RBUF_FRAMES * PROTO_FRAME_SIZE];
	uint8_t wbuf[PROTO_FRAME_SIZE];
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t serial;
	/* handle storage: a region and its ring cost no malloc */
	_Alignas(16) uint8_t shm_store[PROTO_SHM_STORAGE];
	_Alignas(16) uint8_t ring_store[PROTO_RING_STORAGE];
	/* under lock */
	pthread_mutex_t lock;
	bool open;          /* replies accepted */
	bool handle_closed; /* state == CONN_CLOSED, for other threads */
	bool broken;        /* ring corrupt: the loop closes it */
	struct proto_shm *shm;
	struct proto_ring *ring; /* producer */
	struct proto_shm_layout lay;
	uint8_t *base;
	struct gpud_sreq *reqs; /* slots of this connection */
	uint32_t n_active;      /* accepted, not ended */
	uint32_t n_slots;
	bool db_pending;
	uint16_t db_type;
	uint64_t db_id;
	struct errrec errq[ERRQ_LEN];
	uint32_t errq_head, errq_len;
	/* under pend_lock */
	bool queued;
};

struct gpud_sreq {
	struct sconn *c;
	struct gpud_sreq *prev, *next;
	uint32_t idx;
	uint64_t client_id;
	uint64_t conn_serial;
	pid_t pid;
	/* under c->lock */
	bool active;         /* accepted, not ended */
	bool cancelled;      /* ops.cancel called or being called */
	bool cancel_pending; /* ops.cancel running: slot pinned */
	bool backlogged;     /* counted in s->backlog */
	bool fin_pending;    /* a final record waits for ring room */
	bool fin_in_stage;   /* that record is an embedding in stage */
	uint16_t fin_type;
	uint32_t fin_len;
	uint64_t fin_since_ns;
	size_t stage_len;    /* staged token batches, encoded back to back */
	uint8_t *stage;      /* (stage_bytes) */
	void *priv;          /* (priv_bytes) or NULL */
	uint8_t fin[FIN_MAX];
	struct proto_submit sub; /* decode storage (loop) */
};

struct gpud_server {
	uv_loop_t *loop;
	struct gpud_server_params p;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct gpud_service_ops ops;
	void *svc;
	/* loop */
	uv_pipe_t listener;
	uv_pipe_t refuse; /* accepts and closes a connection over the limit */
	uv_async_t async;
	uv_timer_t timer;
	uv_poll_t widen;  /* see reserve_watchers */
	int handles;      /* handles of ours not yet closed */
	bool bound, listening, closed, draining;
	bool refuse_busy, accept_pending;
	uint32_t next_conn; /* where the free-slot search starts */
	uint64_t next_serial;
	struct sconn *conns;          /* (max_connections) */
	struct gpud_sreq **scratch;   /* (max_requests): cancel batches */
	uint32_t *work;               /* (max_connections): pend list copy */
	uint8_t *reply;               /* (reply_cap): sync replies */
	size_t reply_cap;
	size_t ring_max;              /* largest record payload in a ring */
	size_t stage_cap;             /* token staging bound per request */
	/* request slots */
	uint8_t *slot_mem;
	size_t slot_size;
	pthread_mutex_t slot_lock;
	struct sw_pool *slots;
	atomic_uint in_flight;
	/* under pend_lock */
	pthread_mutex_t pend_lock;
	uint32_t *pend; /* (max_connections) */
	uint32_t n_pend;
	uint64_t backlog; /* staged/pending items in all */
	bool timer_wanted, timer_on;
	bool async_live;
	/* under stat_lock */
	pthread_mutex_t stat_lock;
	struct gpud_server_stats st;
};

#define STAT(s, stmt)                              \
	do {                                       \
		pthread_mutex_lock(&(s)->stat_lock);   \
		stmt;                              \
		pthread_mutex_unlock(&(s)->stat_lock); \
	} while (0)

static size_t align16(size_t v)
{
	return (v + 15) & ~(size_t)15;
}

static bool is_pow2(size_t v)
{
	return v && !(v & (v - 1));
}

void gpud_server_params_default(struct gpud_server_params *p)
{
	memset(p, 0, sizeof(*p));
	p->max_connections = 512;
	p->max_requests = 1024;
	p->max_per_connection = 64;
	p->ring_bytes = 8u << 20;
	p->req_bytes = 4u << 20;
	p->stage_bytes = 64u << 10;
	p->priv_bytes = 0;
	p->stall_ms = 10000;
	p->max_bad_frames = 16;
	proto_limits_default(&p->limits);
	p->allowed_gid = (gid_t)-1;
}

/* --- the loop's work list -------------------------------------------------- */

/* Asks the loop to look at c (doorbell, reap, close). Any thread; c->lock
 * may be held (pend_lock nests inside it). */
static void queue_conn(struct sconn *c)
{
	struct gpud_server *s = c->s;
	pthread_mutex_lock(&s->pend_lock);
	if (!c->queued && s->async_live) {
		c->queued = true;
		s->pend[s->n_pend++] = c->idx;
		uv_async_send(&s->async);
	}
	pthread_mutex_unlock(&s->pend_lock);
}

static void backlog_add(struct gpud_server *s, int d)
{
	pthread_mutex_lock(&s->pend_lock);
	s->backlog = (uint64_t)((int64_t)s->backlog + d);
	if (d > 0 && !s->timer_wanted && s->async_live) {
		s->timer_wanted = true;
		uv_async_send(&s->async);
	}
	pthread_mutex_unlock(&s->pend_lock);
}

/* c->lock held. */
static void doorbell_locked(struct sconn *c, uint16_t type, uint64_t id)
{
	c->db_pending = true;
	c->db_type = type;
	c->db_id = id;
	queue_conn(c);
}

/* c->lock held: keeps r->backlogged and the counts in step with what r
 * has waiting. */
static void update_backlog_locked(struct gpud_sreq *r)
{
	bool want = r->stage_len || r->fin_pending;
	if (want == r->backlogged)
		return;
	r->backlogged = want;
	backlog_add(r->c->s, want ? 1 : -1);
}

/* --- request slots ------------------------------------------------------- */

static struct gpud_sreq *slot_at(struct gpud_server *s, uint32_t i)
{
	return (struct gpud_sreq *)(s->slot_mem + (size_t)i * s->slot_size);
}

/* c->lock held: the slot goes back to the pool when nothing needs it any
 * more (ended, records out or dropped, no cancel running). */
static void maybe_release_locked(struct gpud_sreq *r)
{
	struct sconn *c = r->c;
	struct gpud_server *s = c->s;
	if (r->active || r->cancel_pending)
		return;
	if (c->open && (r->fin_pending || r->stage_len))
		return;
	r->fin_pending = false;
	r->stage_len = 0;
	update_backlog_locked(r);
	if (r->prev)
		r->prev->next = r->next;
	else
		c->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	r->prev = r->next = NULL;
	r->c = NULL;
	c->n_slots--;
	pthread_mutex_lock(&s->slot_lock);
	sw_pool_free_index(s->slots, r->idx);
	pthread_mutex_unlock(&s->slot_lock);
	if (c->n_slots == 0 && c->handle_closed)
		queue_conn(c);
}

/* c->lock held: r has ended. */
static void end_active_locked(struct gpud_sreq *r)
{
	r->active = false;
	r->c->n_active--;
	atomic_fetch_sub(&r->c->s->in_flight, 1);
}

/* --- ring writes (c->lock held) ------------------------------------------- */

/* Ring errors other than "full" mean the client corrupted its tail: the
 * loop closes the connection. */
static int ring_fail_locked(struct sconn *c, int rc)
{
	if (rc != SW_EBUSY && rc != SW_ETOOLONG) {
		c->broken = true;
		queue_conn(c);
	}
	return rc;
}

static int ring_push_locked(struct sconn *c, uint16_t type, uint64_t id, const void *p,
			    size_t len)
{
	int rc = proto_ring_push(c->ring, type, id, p, len);
	if (rc)
		return ring_fail_locked(c, rc);
	doorbell_locked(c, type, id);
	return 0;
}

/* Writes r's staged token batches as one coalesced TOKENS record, then its
 * final record. Returns 0 when nothing is left waiting, SW_EBUSY when the
 * ring is still too full, or a ring error. */
static int flush_req_locked(struct sconn *c, struct gpud_sreq *r)
{
	int rc = 0;
	if (r->stage_len) {
		uint32_t n_ids = 0, text_len = 0;
		for (size_t off = 0; off < r->stage_len;) {
			uint32_t n = proto_get32(r->stage + off), t = proto_get32(r->stage + off + 4);
			n_ids += n;
			text_len += t;
			off += 8 + 4 * (size_t)n + t;
		}
		size_t need = proto_tokens_size(n_ids, text_len);
		uint8_t *dst;
		rc = proto_ring_reserve(c->ring, need, &dst);
		if (rc)
			return ring_fail_locked(c, rc);
		proto_put32(dst, n_ids);
		proto_put32(dst + 4, text_len);
		uint8_t *ids = dst + 8, *text = dst + 8 + 4 * (size_t)n_ids;
		for (size_t off = 0; off < r->stage_len;) {
			uint32_t n = proto_get32(r->stage + off), t = proto_get32(r->stage + off + 4);
			memcpy(ids, r->stage + off + 8, 4 * (size_t)n);
			memcpy(text, r->stage + off + 8 + 4 * (size_t)n, t);
			ids += 4 * (size_t)n;
			text += t;
			off += 8 + 4 * (size_t)n + t;
		}
		proto_ring_commit(c->ring, PROTO_T_TOKENS, r->client_id, need);
		doorbell_locked(c, PROTO_T_TOKENS, r->client_id);
		r->stage_len = 0;
	}
	if (r->fin_pending) {
		const uint8_t *src = r->fin_in_stage ? r->stage : r->fin;
		rc = ring_push_locked(c, r->fin_type, r->client_id, src, r->fin_len);
		if (rc == 0)
			r->fin_pending = false;
	}
	update_backlog_locked(r);
	return rc;
}

static int flush_errq_locked(struct sconn *c)
{
	while (c->errq_len) {
		struct errrec *e = &c->errq[c->errq_head];
		int rc = ring_push_locked(c, PROTO_T_ERROR, e->id, e->buf, e->len);
		if (rc)
			return rc;
		c->errq_head = (c->errq_head + 1) % ERRQ_LEN;
		c->errq_len--;
		backlog_add(c->s, -1);
	}
	return 0;
}

/* Flushes everything waiting on c; returns how many final records have
 * waited longer than stall_ms (0 when now_ns is 0). */
static uint32_t flush_conn_locked(struct sconn *c, uint64_t now_ns)
{
	uint32_t stalled = 0;
	uint64_t limit = (uint64_t)c->s->p.stall_ms * 1000000u;
	flush_errq_locked(c);
	for (struct gpud_sreq *r = c->reqs, *next; r; r = next) {
		next = r->next;
		if (!r->backlogged)
			continue;
		flush_req_locked(c, r);
		if (r->fin_pending && now_ns && now_ns - r->fin_since_ns >= limit)
			stalled++;
		maybe_release_locked(r);
	}
	return stalled;
}

/* --- loop-made replies -------------------------------------------------- */

static void close_conn(struct sconn *c, const char *why);

/* An ERROR record for request id (loop thread, no slot): into the ring, or
 * the connection's small error queue while the ring is full; a client that
 * lets that fill too is closed. */
static void conn_error(struct sconn *c, uint64_t id, int code, const char *msg)
{
	struct errrec e;
	size_t len;
	if (code >= 0)
		code = -EIO;
	if (!msg || !*msg)
		msg = sw_strerror(code);
	proto_error_encode(e.buf, sizeof(e.buf), code, msg, &len);
	e.id = id;
	e.len = (uint32_t)len;
	log_debug("conn %llu: request %llu: %s", (unsigned long long)c->serial,
		  (unsigned long long)id, msg);
	bool overflow = false;
	pthread_mutex_lock(&c->lock);
	if (c->open) {
		int rc = c->errq_len ? SW_EBUSY : ring_push_locked(c, PROTO_T_ERROR, id, e.buf, len);
		if (rc == SW_EBUSY) {
			if (c->errq_len < ERRQ_LEN) {
				c->errq[(c->errq_head + c->errq_len) % ERRQ_LEN] = e;
				c->errq_len++;
				backlog_add(c->s, 1);
			} else {
				overflow = true;
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (overflow)
		close_conn(c, "client is not reading its ring (error queue full)");
}

/* Sends one frame on the socket (loop). A frame that cannot go out at
 * once waits in wbuf (one write in flight per connection; doorbells that
 * come meanwhile are coalesced into one). */
static void on_write(uv_write_t *req, int status);

static int send_frame(struct sconn *c, const struct proto_frame *f, bool close_after)
{
	uint8_t buf[PROTO_FRAME_SIZE];
	proto_frame_encode(f, buf);
	uv_buf_t b = uv_buf_init((char *)buf, sizeof(buf));
	int n = uv_try_write((uv_stream_t *)&c->pipe, &b, 1);
	if (n == (int)sizeof(buf)) {
		if (close_after)
			close_conn(c, "closed after error");
		return 0;
	}
	if (n < 0 && n != UV_EAGAIN)
		return n;
	size_t done = n > 0 ? (size_t)n : 0;
	memcpy(c->wbuf, buf + done, sizeof(buf) - done);
	b = uv_buf_init((char *)c->wbuf, (unsigned)(sizeof(buf) - done));
	int rc = uv_write(&c->wreq, (uv_stream_t *)&c->pipe, &b, 1, on_write);
	if (rc)
		return rc;
	c->wbusy = true;
	c->close_after = close_after;
	return 0;
}

static void send_doorbell(struct sconn *c, uint16_t type, uint64_t id)
{
	if (c->wbusy) {
		c->db_deferred = true;
		c->dd_type = type;
		c->dd_id = id;
		return;
	}
	struct proto_frame f;
	proto_frame_init(&f, (enum proto_type)type, id);
	f.flags = PROTO_F_RING;
	int rc = send_frame(c, &f, false);
	if (rc) {
		close_conn(c, "socket write failed");
		return;
	}
	STAT(c->s, c->s->st.doorbells_out++);
}

static void on_write(uv_write_t *req, int status)
{
	struct sconn *c = req->data;
	c->wbusy = false;
	if (c->state != CONN_OPEN)
		return;
	if (status < 0) {
		close_conn(c, "socket write failed");
		return;
	}
	if (c->close_after) {
		close_conn(c, "closed after error");
		return;
	}
	if (c->db_deferred) {
		c->db_deferred = false;
		send_doorbell(c, c->dd_type, c->dd_id);
	}
}

/* --- connection life cycle ------------------------------------------------ */

/* Calls ops.cancel on each of n pinned requests, then lets their slots go. */
static void cancel_batch(struct gpud_server *s, struct gpud_sreq **reqs, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (s->ops.cancel)
			s->ops.cancel(s->svc, reqs[i]);
	for (uint32_t i = 0; i < n; i++) {
		struct gpud_sreq *r = reqs[i];
		struct sconn *c = r->c;
		pthread_mutex_lock(&c->lock);
		r->cancel_pending = false;
		maybe_release_locked(r);
		pthread_mutex_unlock(&c->lock);
	}
}

/* c->lock held: pins every active request not yet cancelled into
 * s->scratch from *n on. */
static void collect_cancels_locked(struct sconn *c, uint32_t *n)
{
	for (struct gpud_sreq *r = c->reqs; r; r = r->next) {
		if (r->active && !r->cancelled) {
			r->cancelled = true;
			r->cancel_pending = true;
			c->s->scratch[(*n)++] = r;
		}
	}
}

static void reap_conn(struct sconn *c)
{
	struct gpud_server *s = c->s;
	proto_ring_close(c->ring);
	proto_shm_destroy(c->shm);
	pthread_mutex_lock(&c->lock);
	c->ring = NULL;
	c->shm = NULL;
	c->base = NULL;
	c->handle_closed = false;
	c->broken = false;
	c->db_pending = false;
	c->errq_head = c->errq_len = 0;
	pthread_mutex_unlock(&c->lock);
	c->state = CONN_FREE;
	c->hello = false;
	c->rlen = 0;
	c->bad_frames = 0;
	c->wbusy = c->close_after = c->db_deferred = false;
	s->handles--;
}

static void accept_one(struct gpud_server *s);

static void on_conn_close(uv_handle_t *h)
{
	struct sconn *c = h->data;
	struct gpud_server *s = c->s;
	c->state = CONN_CLOSED;
	pthread_mutex_lock(&c->lock);
	c->handle_closed = true;
	bool reap = c->n_slots == 0;
	pthread_mutex_unlock(&c->lock);
	if (reap) {
		reap_conn(c);
		if (s->accept_pending && s->listening) {
			s->accept_pending = false;
			accept_one(s);
		}
	}
}

/* Closes c (loop): no more replies, every request in flight cancelled,
 * waiting records dropped. The region goes when the last slot does. */
static void close_conn(struct sconn *c, const char *why)
{
	struct gpud_server *s = c->s;
	if (c->state != CONN_OPEN)
		return;
	log_debug("conn %llu (pid %d): closing: %s", (unsigned long long)c->serial, (int)c->pid,
		  why);
	c->state = CONN_CLOSING;
	uv_close((uv_handle_t *)&c->pipe, on_conn_close);
	uint32_t n = 0;
	pthread_mutex_lock(&c->lock);
	c->open = false;
	collect_cancels_locked(c, &n);
	if (c->errq_len)
		backlog_add(s, -(int)c->errq_len);
	c->errq_len = 0;
	for (struct gpud_sreq *r = c->reqs, *next; r; r = next) {
		next = r->next;
		maybe_release_locked(r);
	}
	pthread_mutex_unlock(&c->lock);
	STAT(s, s->st.connections--);
	cancel_batch(s, s->scratch, n);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct sconn *c = h->data;
	(void)suggested;
	*buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(sizeof(c->rbuf) - c->rlen));
}

static void handle_frame(struct sconn *c, const uint8_t *raw);

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct sconn *c = st->data;
	(void)buf;
	if (c->state != CONN_OPEN)
		return;
	if (uv_pipe_pending_count(&c->pipe) > 0) {
		/* uv_close closes the received descriptors. */
		log_warn("conn %llu (pid %d): sent a descriptor; closing",
			 (unsigned long long)c->serial, (int)c->pid);
		close_conn(c, "client sent a descriptor");
		return;
	}
	if (nread < 0) {
		close_conn(c, nread == UV_EOF ? "end of file" : uv_strerror((int)nread));
		return;
	}
	c->rlen += (size_t)nread;
	size_t off = 0;
	while (c->rlen - off >= PROTO_FRAME_SIZE && c->state == CONN_OPEN) {
		handle_frame(c, c->rbuf + off);
		off += PROTO_FRAME_SIZE;
	}
	if (c->state != CONN_OPEN)
		return;
	memmove(c->rbuf, c->rbuf + off, c->rlen - off);
	c->rlen -= off;
}

static bool peer_allowed(const struct gpud_server *s, uid_t uid, gid_t gid)
{
	return uid == 0 || uid == geteuid() ||
	       (s->p.allowed_gid != (gid_t)-1 && gid == s->p.allowed_gid);
}

static void on_refuse_close(uv_handle_t *h)
{
	struct gpud_server *s = h->data;
	s->refuse_busy = false;
	s->handles--;
	if (s->accept_pending && s->listening) {
		s->accept_pending = false;
		accept_one(s);
	}
}

static void accept_one(struct gpud_server *s)
{
	struct sconn *c = NULL;
	for (uint32_t k = 0; k < s->p.max_connections; k++) {
		uint32_t i = (s->next_conn + k) % s->p.max_connections;
		if (s->conns[i].state == CONN_FREE) {
			c = &s->conns[i];
			s->next_conn = (i + 1) % s->p.max_connections;
			break;
		}
	}
	if (!c) {
		/* libuv stops watching the listener until we accept; the
		 * refuse handle takes it when free, else it waits. */
		if (s->refuse_busy) {
			s->accept_pending = true;
			return;
		}
		uv_pipe_init(s->loop, &s->refuse, 0);
		s->refuse.data = s;
		s->handles++;
		s->refuse_busy = true;
		if (uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&s->refuse) == 0)
			log_warn("refused a connection: %u connections open (limit)",
				 s->p.max_connections);
		uv_close((uv_handle_t *)&s->refuse, on_refuse_close);
		STAT(s, s->st.refused_conns++);
		return;
	}
	uv_pipe_init(s->loop, &c->pipe, 1);
	c->pipe.data = c;
	c->wreq.data = c;
	s->handles++;
	c->state = CONN_OPEN;
	c->serial = ++s->next_serial;
	c->pid = 0;
	STAT(s, {
		s->st.connections++;
		if (s->st.connections > s->st.connections_high)
			s->st.connections_high = s->st.connections;
	});
	int rc = uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&c->pipe);
	uv_os_fd_t fd = -1;
	if (rc == 0)
		rc = uv_fileno((uv_handle_t *)&c->pipe, &fd);
	if (rc == 0)
		rc = proto_peercred(fd, &c->uid, &c->gid, &c->pid);
	if (rc) {
		log_warn("accept failed: %s", uv_strerror(rc));
		close_conn(c, "accept failed");
		return;
	}
	if (!peer_allowed(s, c->uid, c->gid)) {
		log_warn("refused peer pid %d uid %u gid %u: not root, not uid %u, not gid %d",
			 (int)c->pid, (unsigned)c->uid, (unsigned)c->gid, (unsigned)geteuid(),
			 s->p.allowed_gid == (gid_t)-1 ? -1 : (int)s->p.allowed_gid);
		STAT(s, s->st.refused_peer++);
		close_conn(c, "peer refused");
		return;
	}
	pthread_mutex_lock(&c->lock);
	c->open = true;
	pthread_mutex_unlock(&c->lock);
	log_debug("conn %llu: peer pid %d uid %u gid %u", (unsigned long long)c->serial,
		  (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
	STAT(s, s->st.accepted++);
	rc = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
	if (rc)
		close_conn(c, uv_strerror(rc));
}

static void on_connection(uv_stream_t *server, int status)
{
	struct gpud_server *s = server->data;
	if (status < 0) {
		log_warn("listen: %s", uv_strerror(status));
		return;
	}
	if (!s->listening)
		return;
	accept_one(s);
}

/* --- frames ----------------------------------------------------------------- */

static void handle_hello(struct sconn *c, const struct proto_frame *f, int rc, const char *err)
{
	struct gpud_server *s = c->s;
	if (rc == SW_EVERSION && f->type == PROTO_T_HELLO) {
		log_info("conn %llu (pid %d): protocol version %u, we speak %u; closing",
			 (unsigned long long)c->serial, (int)c->pid, f->version, PROTO_VERSION);
		struct proto_frame e;
		proto_frame_init(&e, PROTO_T_ERROR, f->request_id);
		e.aux = (uint32_t)-SW_EVERSION;
		if (send_frame(c, &e, true))
			close_conn(c, "version mismatch");
		return;
	}
	if (rc || f->type != PROTO_T_HELLO) {
		log_warn("conn %llu (pid %d): %s before HELLO; closing", (unsigned long long)c->serial,
			 (int)c->pid, rc ? err : proto_type_name(f->type));
		STAT(s, s->st.bad_frames++);
		close_conn(c, "frame before HELLO");
		return;
	}
	char msg[ERRLEN];
	struct proto_shm *shm = NULL;
	struct proto_ring *ring = NULL;
	rc = proto_shm_create_in(c->shm_store, sizeof(c->shm_store), &shm, s->p.ring_bytes,
				 s->p.req_bytes, msg, sizeof(msg));
	if (rc == 0)
		rc = proto_shm_ring_in(c->ring_store, sizeof(c->ring_store), shm,
				       PROTO_RING_PRODUCER, &ring, msg, sizeof(msg));
	if (rc) {
		log_error("conn %llu: region: %s", (unsigned long long)c->serial, msg);
		proto_shm_destroy(shm);
		struct proto_frame e;
		proto_frame_init(&e, PROTO_T_ERROR, f->request_id);
		e.aux = (uint32_t)-rc;
		if (send_frame(c, &e, true))
			close_conn(c, "region failed");
		return;
	}
	pthread_mutex_lock(&c->lock);
	c->shm = shm;
	c->ring = ring;
	c->lay = *proto_shm_layout(shm);
	c->base = proto_shm_base(shm);
	pthread_mutex_unlock(&c->lock);
	c->hello = true;
	struct proto_frame r;
	proto_frame_init(&r, PROTO_T_HELLO_REPLY, f->request_id);
	r.payload_length = c->lay.size;
	uv_os_fd_t sock = -1;
	uv_fileno((uv_handle_t *)&c->pipe, &sock);
	/* Nothing has been written on this socket yet: 40 bytes fit. */
	rc = proto_send_frame(sock, &r, proto_shm_fd(shm));
	if (rc) {
		log_warn("conn %llu: HELLO_REPLY: %s", (unsigned long long)c->serial,
			 sw_strerror(rc));
		close_conn(c, "HELLO_REPLY failed");
	}
}

static void bad_frame(struct sconn *c, uint64_t id, int rc, const char *err)
{
	struct gpud_server *s = c->s;
	STAT(s, s->st.bad_frames++);
	log_debug("conn %llu: bad frame: %s", (unsigned long long)c->serial, err);
	conn_error(c, id, rc, err);
	if (++c->bad_frames >= s->p.max_bad_frames && c->state == CONN_OPEN) {
		log_warn("conn %llu (pid %d): %u bad frames; closing", (unsigned long long)c->serial,
			 (int)c->pid, c->bad_frames);
		close_conn(c, "too many bad frames");
	}
}

/* Takes a slot for request id on c, or answers why not (returns nonzero
 * after sending the ERROR). The slot is active and linked on return. */
static int take_slot(struct sconn *c, uint64_t id, struct gpud_sreq **out)
{
	struct gpud_server *s = c->s;
	char msg[ERRLEN];
	int rc = 0;
	uint32_t idx = 0;
	if (s->draining) {
		conn_error(c, id, SW_ECLOSED, "gpud is shutting down");
		STAT(s, s->st.refused++);
		return SW_ECLOSED;
	}
	pthread_mutex_lock(&c->lock);
	for (struct gpud_sreq *r = c->reqs; r; r = r->next) {
		if (r->client_id == id && (r->active || r->fin_pending || r->stage_len)) {
			rc = sw_seterr(msg, sizeof(msg), SW_EFORMAT,
				       "request id %llu is already in flight on this connection",
				       (unsigned long long)id);
			break;
		}
	}
	/* Slots, not just active requests: one whose final record waits for
	 * a client that does not read still holds its slot, and such a
	 * client must not take the whole pool. */
	if (!rc && c->n_slots >= s->p.max_per_connection)
		rc = sw_seterr(msg, sizeof(msg), SW_EBUSY,
			       "busy: %u requests in flight on this connection (limit %u)",
			       c->n_slots, s->p.max_per_connection);
	if (!rc && atomic_load(&s->in_flight) >= s->p.max_requests)
		rc = sw_seterr(msg, sizeof(msg), SW_EBUSY,
			       "busy: %u requests in flight in gpud (limit %u)",
			       atomic_load(&s->in_flight), s->p.max_requests);
	if (!rc) {
		pthread_mutex_lock(&s->slot_lock);
		rc = sw_pool_alloc_index(s->slots, c->serial, &idx);
		pthread_mutex_unlock(&s->slot_lock);
		if (rc)
			rc = sw_seterr(msg, sizeof(msg), SW_EBUSY,
				       "busy: all %u request slots in use", s->p.max_requests);
	}
	if (rc) {
		pthread_mutex_unlock(&c->lock);
		conn_error(c, id, rc, msg);
		STAT(s, {
			if (rc == SW_EBUSY)
				s->st.busy++;
			else
				s->st.refused++;
		});
		return rc;
	}
	struct gpud_sreq *r = slot_at(s, idx);
	r->c = c;
	r->client_id = id;
	r->conn_serial = c->serial;
	r->pid = c->pid;
	r->active = true;
	r->cancelled = r->cancel_pending = r->backlogged = false;
	r->fin_pending = r->fin_in_stage = false;
	r->stage_len = 0;
	if (r->priv)
		memset(r->priv, 0, s->p.priv_bytes);
	r->prev = NULL;
	r->next = c->reqs;
	if (c->reqs)
		c->reqs->prev = r;
	c->reqs = r;
	c->n_slots++;
	c->n_active++;
	uint32_t now = atomic_fetch_add(&s->in_flight, 1) + 1;
	pthread_mutex_unlock(&c->lock);
	STAT(s, {
		if (now > s->st.in_flight_high)
			s->st.in_flight_high = now;
	});
	*out = r;
	return 0;
}

/* Ends a request the service never took (decode error or refusal). */
static void refuse_req(struct gpud_sreq *r, int code, const char *msg)
{
	struct sconn *c = r->c;
	uint64_t id = r->client_id;
	pthread_mutex_lock(&c->lock);
	end_active_locked(r);
	maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
	STAT(c->s, c->s->st.refused++);
	conn_error(c, id, code, msg);
}

static void on_submit(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct gpud_sreq *r;
	char err[ERRLEN] = "";
	if (take_slot(c, f->request_id, &r))
		return;
	int rc = proto_submit_decode(payload, f->payload_length, &s->p.limits, &r->sub, err,
				     sizeof(err));
	if (rc) {
		refuse_req(r, rc, err);
		return;
	}
	rc = s->ops.submit ? s->ops.submit(s->svc, r, &r->sub, err, sizeof(err))
			   : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED, "submit is not served");
	if (rc < 0) {
		refuse_req(r, rc, err);
		return;
	}
	STAT(s, s->st.requests++);
}

static void on_embed(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct proto_text_req req;
	struct gpud_sreq *r;
	char err[ERRLEN] = "";
	int rc = proto_text_req_decode(PROTO_T_EMBED, payload, f->payload_length, &s->p.limits,
				       &req, err, sizeof(err));
	if (rc) {
		conn_error(c, f->request_id, rc, err);
		STAT(s, s->st.refused++);
		return;
	}
	if (take_slot(c, f->request_id, &r))
		return;
	rc = s->ops.embed ? s->ops.embed(s->svc, r, &req, err, sizeof(err))
			  : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED, "embed is not served");
	if (rc < 0) {
		refuse_req(r, rc, err);
		return;
	}
	STAT(s, s->st.requests++);
}

static void on_cancel(struct sconn *c, uint64_t id)
{
	struct gpud_sreq *r = NULL;
	pthread_mutex_lock(&c->lock);
	for (struct gpud_sreq *q = c->reqs; q; q = q->next) {
		if (q->client_id == id && q->active && !q->cancelled) {
			r = q;
			r->cancelled = r->cancel_pending = true;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (!r) {
		log_debug("conn %llu: CANCEL of %llu: not in flight", (unsigned long long)c->serial,
			  (unsigned long long)id);
		return;
	}
	cancel_batch(c->s, &r, 1);
}

/* Writes a synchronous reply (in s->reply, len bytes, already encoded). */
static void sync_reply(struct sconn *c, uint16_t type, uint64_t id, size_t len)
{
	pthread_mutex_lock(&c->lock);
	int rc = c->open ? ring_push_locked(c, type, id, c->s->reply, len) : 0;
	pthread_mutex_unlock(&c->lock);
	if (rc == SW_EBUSY)
		conn_error(c, id, SW_EBUSY, "busy: the response ring is full; read it and retry");
	else if (rc)
		conn_error(c, id, rc, "reply does not fit the response ring");
}

static void on_tokenize(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct proto_text_req req;
	char err[ERRLEN] = "";
	uint32_t n = 0;
	/* Ids are decoded into the reply buffer past the header, then
	 * rewritten in place as little-endian. */
	int32_t *ids = (int32_t *)(void *)(s->reply + 8);
	uint32_t cap = (uint32_t)((s->reply_cap - 8) / 4);
	int rc = proto_text_req_decode(PROTO_T_TOKENIZE, payload, f->payload_length,
				       &s->p.limits, &req, err, sizeof(err));
	if (!rc) {
		rc = s->ops.tokenize ? s->ops.tokenize(s->svc, &req, ids, cap, &n, err, sizeof(err))
				     : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
						 "tokenize is not served");
		if (!rc && n > cap)
			rc = sw_seterr(err, sizeof(err), -EINVAL, "tokenize: service overran");
	}
	if (rc) {
		conn_error(c, f->request_id, rc, err);
		return;
	}
	proto_put32(s->reply, n);
	proto_put32(s->reply + 4, 0);
	for (uint32_t i = 0; i < n; i++)
		proto_put32((uint8_t *)&ids[i], (uint32_t)ids[i]);
	sync_reply(c, PROTO_T_TOKENIZE_REPLY, f->request_id, proto_tokens_size(n, 0));
}

static void on_json(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	char err[ERRLEN] = "";
	size_t len = 0;
	size_t cap = s->reply_cap - 4;
	uint16_t reply_type;
	int rc;
	if (f->type == PROTO_T_STATS) {
		reply_type = PROTO_T_STATS_REPLY;
		rc = s->ops.stats ? s->ops.stats(s->svc, (char *)s->reply + 4, cap, &len, err,
						 sizeof(err))
				  : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
					      "stats is not served");
	} else {
		uint32_t flags = 0;
		reply_type = PROTO_T_MEM_REPLY;
		rc = proto_mem_req_decode(payload, f->payload_length, &flags, err, sizeof(err));
		if (!rc)
			rc = s->ops.mem ? s->ops.mem(s->svc, flags, (char *)s->reply + 4, cap, &len,
						     err, sizeof(err))
					: sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
						    "mem is not served");
	}
	if (!rc && (len > cap || len > UINT32_MAX))
		rc = sw_seterr(err, sizeof(err), -EINVAL, "%s: service overran",
			       proto_type_name(f->type));
	if (rc) {
		conn_error(c, f->request_id, rc, err);
		return;
	}
	proto_put32(s->reply, (uint32_t)len);
	sync_reply(c, reply_type, f->request_id, proto_json_size((uint32_t)len));
}

static void handle_frame(struct sconn *c, const uint8_t *raw)
{
	struct gpud_server *s = c->s;
	struct proto_frame f;
	char err[ERRLEN] = "";
	STAT(s, s->st.frames_in++);
	int rc = proto_frame_decode(raw, PROTO_FRAME_SIZE, &f, err, sizeof(err));
	if (!c->hello) {
		handle_hello(c, &f, rc, err);
		return;
	}
	/* Read from the bytes: a frame that failed to decode may not have
	 * reached its request id. */
	uint64_t id = proto_get64(raw + PROTO_FRAME_OFF_REQUEST_ID);
	if (!rc && f.type == PROTO_T_HELLO) {
		log_warn("conn %llu (pid %d): HELLO twice; closing", (unsigned long long)c->serial,
			 (int)c->pid);
		STAT(s, s->st.bad_frames++);
		conn_error(c, id, SW_EFORMAT, "frame: HELLO twice");
		close_conn(c, "HELLO twice");
		return;
	}
	if (!rc && !proto_type_from_client(f.type))
		rc = sw_seterr(err, sizeof(err), SW_EFORMAT, "frame: type %s is not sent by clients",
			       proto_type_name(f.type));
	const void *payload = NULL;
	if (!rc)
		rc = proto_frame_payload(&f, c->base, c->lay.req_off, c->lay.req_size, &payload, err,
					 sizeof(err));
	if (rc) {
		bad_frame(c, id, rc, err);
		return;
	}
	switch (f.type) {
	case PROTO_T_SUBMIT:
		on_submit(c, &f, payload);
		break;
	case PROTO_T_EMBED:
		on_embed(c, &f, payload);
		break;
	case PROTO_T_CANCEL:
		on_cancel(c, f.request_id);
		break;
	case PROTO_T_TOKENIZE:
		on_tokenize(c, &f, payload);
		break;
	case PROTO_T_STATS:
	case PROTO_T_MEM:
		on_json(c, &f, payload);
		break;
	default:
		bad_frame(c, id, SW_EUNSUPPORTED, "frame: type not served");
		break;
	}
}

/* --- loop wake-ups ------------------------------------------------------------ */

static void on_timer(uv_timer_t *h);

static void on_async(uv_async_t *h)
{
	struct gpud_server *s = h->data;
	pthread_mutex_lock(&s->pend_lock);
	uint32_t n = s->n_pend;
	memcpy(s->work, s->pend, n * sizeof(*s->work));
	for (uint32_t i = 0; i < n; i++)
		s->conns[s->work[i]].queued = false;
	s->n_pend = 0;
	bool start = s->timer_wanted && !s->timer_on && !s->closed;
	if (start)
		s->timer_on = true;
	pthread_mutex_unlock(&s->pend_lock);
	if (start)
		uv_timer_start(&s->timer, on_timer, TIMER_MS, TIMER_MS);
	for (uint32_t i = 0; i < n; i++) {
		struct sconn *c = &s->conns[s->work[i]];
		pthread_mutex_lock(&c->lock);
		bool db = c->db_pending, broken = c->broken;
		uint16_t type = c->db_type;
		uint64_t id = c->db_id;
		c->db_pending = false;
		bool reap = c->handle_closed && c->n_slots == 0;
		pthread_mutex_unlock(&c->lock);
		if (broken) {
			log_warn("conn %llu (pid %d): corrupt ring tail; closing",
				 (unsigned long long)c->serial, (int)c->pid);
			close_conn(c, "corrupt ring");
		} else if (db && c->state == CONN_OPEN) {
			send_doorbell(c, type, id);
		}
		if (reap && c->state == CONN_CLOSED) {
			reap_conn(c);
			if (s->accept_pending && s->listening) {
				s->accept_pending = false;
				accept_one(s);
			}
		}
	}
}

static void on_timer(uv_timer_t *h)
{
	struct gpud_server *s = h->data;
	uint64_t now = sw_now_ns();
	for (uint32_t i = 0; i < s->p.max_connections; i++) {
		struct sconn *c = &s->conns[i];
		if (c->state != CONN_OPEN || !c->hello)
			continue;
		pthread_mutex_lock(&c->lock);
		uint32_t stalled = flush_conn_locked(c, now);
		pthread_mutex_unlock(&c->lock);
		if (stalled) {
			log_warn("conn %llu (pid %d): %u requests waited %u ms for ring room; closing",
				 (unsigned long long)c->serial, (int)c->pid, stalled,
				 s->p.stall_ms);
			STAT(s, s->st.stalled += stalled);
			close_conn(c, "client is not reading its ring");
		}
	}
	pthread_mutex_lock(&s->pend_lock);
	if (s->backlog == 0) {
		s->timer_wanted = false;
		s->timer_on = false;
		uv_timer_stop(&s->timer);
	}
	pthread_mutex_unlock(&s->pend_lock);
}

/* --- create / listen / close ------------------------------------------------ */

static void on_server_handle_close(uv_handle_t *h)
{
	struct gpud_server *s = h->data;
	s->handles--;
}

static void on_widen(uv_poll_t *h, int status, int events)
{
	(void)h;
	(void)status;
	(void)events;
}

/* libuv grows its loop's watcher table (realloc) the first time it sees a
 * descriptor number above any before, so connections accepted after
 * warm-up would allocate there. Show it now the highest number they can
 * take: a socket and a memfd per connection, plus slack, within
 * RLIMIT_NOFILE. */
static void reserve_watchers(struct gpud_server *s)
{
	long want = 3L * s->p.max_connections + 64;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (long)rl.rlim_cur - 1 < want)
		want = (long)rl.rlim_cur - 1;
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (efd < 0)
		return;
	int hi = fcntl(efd, F_DUPFD_CLOEXEC, (int)want);
	close(efd);
	if (hi < 0)
		return;
	if (uv_poll_init(s->loop, &s->widen, hi) == 0) {
		s->widen.data = s;
		s->handles++;
		uv_poll_start(&s->widen, UV_READABLE, on_widen);
		uv_poll_stop(&s->widen);
		uv_close((uv_handle_t *)&s->widen, on_server_handle_close);
	}
	close(hi);
}

/* Frees what gpud_server_create reserved, and s itself (shared by its
 * failure path and gpud_server_destroy). */
static void free_server(struct gpud_server *s)
{
	sw_pool_destroy(s->slots);
	free(s->slot_mem);
	free(s->reply);
	free(s->scratch);
	free(s->work);
	free(s->pend);
	free(s->conns);
	pthread_mutex_destroy(&s->stat_lock);
	pthread_mutex_destroy(&s->pend_lock);
	pthread_mutex_destroy(&s->slot_lock);
	free(s);
}

int gpud_server_create(struct gpud_server **out, struct uv_loop_s *loop,
		       const struct gpud_server_params *p, const struct gpud_service_ops *ops,
		       void *svc, char *err, size_t errlen)
{
	if (!out)
		return sw_seterr(err, errlen, -EINVAL, "server: out is NULL");
	*out = NULL;
	if (!loop || !p || !ops)
		return sw_seterr(err, errlen, -EINVAL, "server: loop, params and ops are required");
	if (!p->socket_path || !*p->socket_path)
		return sw_seterr(err, errlen, -EINVAL, "server: socket_path is required");
	struct gpud_server_params d;
	gpud_server_params_default(&d);
	struct gpud_server_params q = *p;
	if (!q.max_connections)
		q.max_connections = d.max_connections;
	if (!q.max_requests)
		q.max_requests = d.max_requests;
	if (!q.max_per_connection)
		q.max_per_connection = d.max_per_connection;
	if (!q.ring_bytes)
		q.ring_bytes = d.ring_bytes;
	if (!q.req_bytes)
		q.req_bytes = d.req_bytes;
	if (!q.stall_ms)
		q.stall_ms = d.stall_ms;
	if (!q.max_bad_frames)
		q.max_bad_frames = d.max_bad_frames;
	if (strlen(q.socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return sw_seterr(err, errlen, -ENAMETOOLONG, "server: socket path too long: %s",
				 q.socket_path);
	if (!is_pow2(q.ring_bytes) || q.ring_bytes < PROTO_RING_MIN_CAP ||
	    q.ring_bytes > PROTO_RING_MAX_CAP)
		return sw_seterr(err, errlen, -EINVAL,
				 "server: ring_bytes %zu is not a power of two in [%u, %u]",
				 q.ring_bytes, PROTO_RING_MIN_CAP, PROTO_RING_MAX_CAP);
	if (q.req_bytes > PROTO_SHM_MAX_REQ)
		return sw_seterr(err, errlen, -EINVAL, "server: req_bytes %zu over %u",
				 q.req_bytes, PROTO_SHM_MAX_REQ);
	if (q.max_connections > (1u << 20) || q.max_requests > (1u << 24))
		return sw_seterr(err, errlen, -EINVAL,
				 "server: max_connections / max_requests out of range");

	struct gpud_server *s = calloc(1, sizeof(*s));
	if (!s)
		return sw_seterr(err, errlen, -ENOMEM, "server: out of memory");
	s->loop = loop;
	s->p = q;
	snprintf(s->path, sizeof(s->path), "%s", q.socket_path);
	s->p.socket_path = s->path;
	s->ops = *ops;
	s->svc = svc;
	s->ring_max = q.ring_bytes / 2 - PROTO_RING_HDR;
	s->stage_cap = q.stage_bytes < s->ring_max ? q.stage_bytes : s->ring_max;
	s->reply_cap = s->ring_max;
	size_t priv = align16(q.priv_bytes);
	size_t stage = align16(q.stage_bytes);
	s->slot_size = align16(sizeof(struct gpud_sreq)) + priv + stage;
	pthread_mutex_init(&s->slot_lock, NULL);
	pthread_mutex_init(&s->pend_lock, NULL);
	pthread_mutex_init(&s->stat_lock, NULL);

	int rc = -ENOMEM;
	s->conns = calloc(q.max_connections, sizeof(*s->conns));
	s->pend = calloc(q.max_connections, sizeof(*s->pend));
	s->work = calloc(q.max_connections, sizeof(*s->work));
	s->scratch = calloc(q.max_requests, sizeof(*s->scratch));
	s->reply = aligned_alloc(16, align16(s->reply_cap));
	s->slot_mem = calloc(q.max_requests, s->slot_size);
	if (!s->conns || !s->pend || !s->work || !s->scratch || !s->reply || !s->slot_mem)
		goto out_free;
	rc = sw_pool_create_index(&s->slots, "server requests", q.max_requests);
	if (rc)
		goto out_free;
	for (uint32_t i = 0; i < q.max_connections; i++) {
		s->conns[i].s = s;
		s->conns[i].idx = i;
		pthread_mutex_init(&s->conns[i].lock, NULL);
	}
	for (uint32_t i = 0; i < q.max_requests; i++) {
		struct gpud_sreq *r = slot_at(s, i);
		uint8_t *extra = (uint8_t *)r + align16(sizeof(*r));
		r->idx = i;
		r->priv = priv ? extra : NULL;
		r->stage = extra + priv;
	}
	uv_pipe_init(loop, &s->listener, 0);
	uv_async_init(loop, &s->async, on_async);
	uv_timer_init(loop, &s->timer);
	s->listener.data = s->async.data = s->timer.data = s;
	s->handles = 3;
	s->async_live = true;
	reserve_watchers(s);
	log_info("server: reserved %u connection slots of %zu bytes, %u request slots of %zu "
		 "bytes (%zu MiB, touched as used); per connection: ring %zu, request area %zu",
		 q.max_connections, sizeof(struct sconn), q.max_requests, s->slot_size,
		 (size_t)q.max_requests * s->slot_size >> 20, q.ring_bytes, q.req_bytes);
	*out = s;
	return 0;

out_free:
	free_server(s);
	return sw_seterr(err, errlen, rc, "server: cannot reserve %u request slots of %zu bytes",
			 q.max_requests, align16(sizeof(struct gpud_sreq)) + priv + stage);
}

/* Replaces a stale socket file; refuses a live one. */
static int clear_stale(const char *path, char *err, size_t errlen)
{
	struct stat st;
	if (lstat(path, &st) != 0) {
		if (errno == ENOENT)
			return 0;
		return sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	}
	if (!S_ISSOCK(st.st_mode))
		return sw_seterr(err, errlen, -EEXIST, "%s exists and is not a socket", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sw_seterr(err, errlen, -errno, "socket: %s", strerror(errno));
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	close(fd);
	if (rc == 0)
		return sw_seterr(err, errlen, -EADDRINUSE, "another gpud is listening on %s", path);
	if (e != ECONNREFUSED)
		return sw_seterr(err, errlen, -e, "probing %s: %s", path, strerror(e));
	if (unlink(path) != 0 && errno != ENOENT)
		return sw_seterr(err, errlen, -errno, "removing stale %s: %s", path,
				 strerror(errno));
	log_info("replaced stale socket %s", path);
	return 0;
}

int gpud_server_listen(struct gpud_server *s, char *err, size_t errlen)
{
	if (!s || s->closed || s->listening)
		return sw_seterr(err, errlen, -EINVAL, "server: not in a state to listen");
	int rc = clear_stale(s->path, err, errlen);
	if (rc)
		return rc;
	rc = uv_pipe_bind(&s->listener, s->path);
	if (rc)
		return sw_seterr(err, errlen, rc, "bind %s: %s", s->path, uv_strerror(rc));
	s->bound = true;
	/* After bind, whatever the umask made of it. */
	if (chmod(s->path, 0660) != 0)
		return sw_seterr(err, errlen, -errno, "chmod %s: %s", s->path, strerror(errno));
	rc = uv_listen((uv_stream_t *)&s->listener, (int)s->p.max_connections, on_connection);
	if (rc)
		return sw_seterr(err, errlen, rc, "listen %s: %s", s->path, uv_strerror(rc));
	s->listening = true;
	log_info("listening on %s (%u connections, %u requests, %u per connection)", s->path,
		 s->p.max_connections, s->p.max_requests, s->p.max_per_connection);
	return 0;
}

void gpud_server_drain(struct gpud_server *s)
{
	if (s && !s->draining) {
		s->draining = true;
		log_info("draining: new requests are refused");
	}
}

void gpud_server_cancel_all(struct gpud_server *s)
{
	if (!s)
		return;
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->p.max_connections; i++) {
		struct sconn *c = &s->conns[i];
		if (c->state == CONN_FREE)
			continue;
		pthread_mutex_lock(&c->lock);
		collect_cancels_locked(c, &n);
		pthread_mutex_unlock(&c->lock);
	}
	cancel_batch(s, s->scratch, n);
}

uint32_t gpud_server_in_flight(const struct gpud_server *s)
{
	return s ? atomic_load(&((struct gpud_server *)s)->in_flight) : 0;
}

void gpud_server_close(struct gpud_server *s)
{
	if (!s || s->closed)
		return;
	s->closed = true;
	s->draining = true;
	s->listening = false;
	s->accept_pending = false;
	uv_close((uv_handle_t *)&s->listener, on_server_handle_close);
	if (s->bound)
		unlink(s->path);
	for (uint32_t i = 0; i < s->p.max_connections; i++)
		close_conn(&s->conns[i], "server closing");
	pthread_mutex_lock(&s->pend_lock);
	s->async_live = false; /* no uv_async_send from now on */
	pthread_mutex_unlock(&s->pend_lock);
	uv_close((uv_handle_t *)&s->async, on_server_handle_close);
	uv_close((uv_handle_t *)&s->timer, on_server_handle_close);
}

void gpud_server_destroy(struct gpud_server *s)
{
	if (!s)
		return;
	gpud_server_close(s);
	/* Handles must be closed before their memory goes; normally the
	 * caller's uv_run did it already. */
	while (s->handles > 0) {
		bool reaped = false;
		for (uint32_t i = 0; i < s->p.max_connections; i++) {
			struct sconn *c = &s->conns[i];
			if (c->state == CONN_CLOSED) {
				if (c->n_slots)
					log_error("server: conn %llu still has %u requests",
						  (unsigned long long)c->serial, c->n_slots);
				reap_conn(c);
				reaped = true;
			}
		}
		if (!reaped && s->handles > 0)
			uv_run(s->loop, UV_RUN_NOWAIT);
	}
	for (uint32_t i = 0; i < s->p.max_connections; i++)
		pthread_mutex_destroy(&s->conns[i].lock);
	free_server(s);
}

void gpud_server_stats(const struct gpud_server *s, struct gpud_server_stats *st)
{
	struct gpud_server *m = (struct gpud_server *)s;
	pthread_mutex_lock(&m->stat_lock);
	*st = m->st;
	pthread_mutex_unlock(&m->stat_lock);
	st->in_flight = atomic_load(&m->in_flight);
}

/* --- the request handle ------------------------------------------------------ */

uint64_t gpud_sreq_client_id(const struct gpud_sreq *r)
{
	return r->client_id;
}

uint64_t gpud_sreq_conn_id(const struct gpud_sreq *r)
{
	return r->conn_serial;
}

pid_t gpud_sreq_peer_pid(const struct gpud_sreq *r)
{
	return r->pid;
}

void *gpud_sreq_priv(struct gpud_sreq *r)
{
	return r->priv;
}

int gpud_sreq_tokens(struct gpud_sreq *r, const int32_t *ids, uint32_t n_ids, const char *text,
		     size_t len)
{
	struct sconn *c = r->c;
	struct gpud_server *s = c->s;
	if (len > UINT32_MAX || (n_ids && !ids) || (len && !text))
		return -EINVAL;
	size_t need = proto_tokens_size(n_ids, (uint32_t)len);
	if (!need || need > s->ring_max)
		return SW_ETOOLONG;
	pthread_mutex_lock(&c->lock);
	if (!c->open) {
		pthread_mutex_unlock(&c->lock);
		return SW_ECLOSED;
	}
	int rc = r->stage_len ? flush_req_locked(c, r) : 0;
	if (rc == 0) {
		uint8_t *dst;
		rc = proto_ring_reserve(c->ring, need, &dst);
		if (rc == 0) {
			size_t l;
			proto_tokens_encode(dst, need, ids, n_ids, text, (uint32_t)len, &l);
			proto_ring_commit(c->ring, PROTO_T_TOKENS, r->client_id, l);
			doorbell_locked(c, PROTO_T_TOKENS, r->client_id);
			pthread_mutex_unlock(&c->lock);
			return 0;
		}
		ring_fail_locked(c, rc);
	}
	if (rc != SW_EBUSY) {
		pthread_mutex_unlock(&c->lock);
		return SW_ECLOSED;
	}
	if (r->stage_len + need > s->stage_cap) {
		pthread_mutex_unlock(&c->lock);
		return SW_EBUSY;
	}
	size_t l;
	proto_tokens_encode(r->stage + r->stage_len, need, ids, n_ids, text, (uint32_t)len, &l);
	r->stage_len += l;
	size_t used = r->stage_len;
	update_backlog_locked(r);
	pthread_mutex_unlock(&c->lock);
	STAT(s, {
		s->st.staged++;
		if (used > s->st.stage_high)
			s->st.stage_high = used;
	});
	return 0;
}

/* c->lock held, r ended, r->fin (or the stage) holds the final record:
 * write it now, or leave it waiting for the timer. */
static void finish_locked(struct sconn *c, struct gpud_sreq *r, uint16_t type, size_t len,
			  bool in_stage)
{
	r->fin_type = type;
	r->fin_len = (uint32_t)len;
	r->fin_in_stage = in_stage;
	r->fin_pending = true;
	r->fin_since_ns = sw_now_ns();
	if (flush_req_locked(c, r) == SW_EBUSY)
		STAT(c->s, c->s->st.staged++);
}

void gpud_sreq_done(struct gpud_sreq *r, const struct proto_done *usage)
{
	struct sconn *c = r->c;
	pthread_mutex_lock(&c->lock);
	end_active_locked(r);
	size_t len;
	if (c->open && proto_done_encode(r->fin, sizeof(r->fin), usage, &len) == 0)
		finish_locked(c, r, PROTO_T_DONE, len, false);
	maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
}

/* c->lock held. */
static void error_locked(struct sconn *c, struct gpud_sreq *r, int code, const char *msg)
{
	size_t len;
	if (code >= 0)
		code = -EIO;
	if (!msg)
		msg = sw_strerror(code);
	proto_error_encode(r->fin, sizeof(r->fin), code, msg, &len);
	finish_locked(c, r, PROTO_T_ERROR, len, false);
}

void gpud_sreq_error(struct gpud_sreq *r, int code, const char *msg)
{
	struct sconn *c = r->c;
	pthread_mutex_lock(&c->lock);
	end_active_locked(r);
	if (c->open)
		error_locked(c, r, code, msg);
	maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
}

void gpud_sreq_embedding(struct gpud_sreq *r, const float *v, uint32_t dim)
{
	struct sconn *c = r->c;
	struct gpud_server *s = c->s;
	size_t need = proto_embedding_size(dim);
	pthread_mutex_lock(&c->lock);
	end_active_locked(r);
	if (!c->open)
		goto out;
	if (!need || need > s->ring_max || (dim && !v)) {
		char msg[ERRLEN];
		snprintf(msg, sizeof(msg), "embedding of dim %u does not fit the response ring", dim);
		error_locked(c, r, SW_ETOOLONG, msg);
		goto out;
	}
	int rc = r->stage_len ? flush_req_locked(c, r) : 0;
	size_t len;
	if (rc == 0) {
		uint8_t *dst;
		rc = proto_ring_reserve(c->ring, need, &dst);
		if (rc == 0) {
			proto_embedding_encode(dst, need, v, dim, &len);
			proto_ring_commit(c->ring, PROTO_T_EMBED_REPLY, r->client_id, len);
			doorbell_locked(c, PROTO_T_EMBED_REPLY, r->client_id);
			goto out;
		}
		ring_fail_locked(c, rc);
	}
	if (rc == SW_EBUSY && r->stage_len == 0 && need <= s->p.stage_bytes) {
		proto_embedding_encode(r->stage, need, v, dim, &len);
		finish_locked(c, r, PROTO_T_EMBED_REPLY, len, true);
	} else {
		error_locked(c, r, SW_EBUSY, "client is not reading its ring");
	}
out:
	maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
}
