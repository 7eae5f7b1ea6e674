/* server_conn.c - a connection's life cycle on the loop thread: accept (or
 * refuse) and the SO_PEERCRED check, reading frames, closing (every
 * request in flight cancelled) and reaping the slot once its requests are
 * gone. Shared state: gpud/server_impl.h.
 */
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "gpud/server_impl.h"

/* Calls ops.cancel on each of n pinned requests, then lets their slots go. */
void gpud__cancel_batch(struct gpud_server *s, struct gpud_sreq **reqs, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (s->ops.cancel)
			s->ops.cancel(s->svc, reqs[i]);
	for (uint32_t i = 0; i < n; i++) {
		struct gpud_sreq *r = reqs[i];
		struct sconn *c = r->c;
		pthread_mutex_lock(&c->lock);
		r->cancel_pending = false;
		gpud__maybe_release_locked(r);
		pthread_mutex_unlock(&c->lock);
	}
}

/* c->lock held: pins every active request not yet cancelled into
 * s->scratch from *n on. */
void gpud__collect_cancels_locked(struct sconn *c, uint32_t *n)
{
	for (struct gpud_sreq *r = c->reqs; r; r = r->next) {
		if (r->active && !r->cancelled) {
			r->cancelled = true;
			r->cancel_pending = true;
			c->s->scratch[(*n)++] = r;
		}
	}
}

void gpud__reap_conn(struct sconn *c)
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
		gpud__reap_conn(c);
		if (s->accept_pending && s->listening) {
			s->accept_pending = false;
			gpud__accept_one(s);
		}
	}
}

/* Closes c (loop): no more replies, every request in flight cancelled,
 * waiting records dropped. The region goes when the last slot does. */
void gpud__close_conn(struct sconn *c, const char *why)
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
	gpud__collect_cancels_locked(c, &n);
	if (c->errq_len)
		gpud__backlog_add(s, -(int)c->errq_len);
	c->errq_len = 0;
	for (struct gpud_sreq *r = c->reqs, *next; r; r = next) {
		next = r->next;
		gpud__maybe_release_locked(r);
	}
	pthread_mutex_unlock(&c->lock);
	STAT(s, s->st.connections--);
	gpud__cancel_batch(s, s->scratch, n);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct sconn *c = h->data;
	(void)suggested;
	*buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(sizeof(c->rbuf) - c->rlen));
}

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
		gpud__close_conn(c, "client sent a descriptor");
		return;
	}
	if (nread < 0) {
		gpud__close_conn(c, nread == UV_EOF ? "end of file" : uv_strerror((int)nread));
		return;
	}
	c->rlen += (size_t)nread;
	size_t off = 0;
	while (c->rlen - off >= PROTO_FRAME_SIZE && c->state == CONN_OPEN) {
		gpud__handle_frame(c, c->rbuf + off);
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
		gpud__accept_one(s);
	}
}

void gpud__accept_one(struct gpud_server *s)
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
		gpud__close_conn(c, "accept failed");
		return;
	}
	if (!peer_allowed(s, c->uid, c->gid)) {
		log_warn("refused peer pid %d uid %u gid %u: not root, not uid %u, not gid %d",
			 (int)c->pid, (unsigned)c->uid, (unsigned)c->gid, (unsigned)geteuid(),
			 s->p.allowed_gid == (gid_t)-1 ? -1 : (int)s->p.allowed_gid);
		STAT(s, s->st.refused_peer++);
		gpud__close_conn(c, "peer refused");
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
		gpud__close_conn(c, uv_strerror(rc));
}

void gpud__on_connection(uv_stream_t *server, int status)
{
	struct gpud_server *s = server->data;
	if (status < 0) {
		log_warn("listen: %s", uv_strerror(status));
		return;
	}
	if (!s->listening)
		return;
	gpud__accept_one(s);
}
