/* server_conn.c - a connection's life cycle on the loop thread: accept (or
 * refuse) and the peer check (SO_PEERCRED, SO_PEERGROUPS; who is admitted
 * is in server.h), reading frames, closing (every
 * request in flight cancelled) and reaping the slot once its requests are
 * gone. Shared state: gpud/server_impl.h.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/time.h"
#include "gpud/server_impl.h"

#define REFUSE_LOG_NS 1000000000ull /* at most one refused-peer line a second */

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

static bool id_listed(const uint32_t *ids, uint32_t n, uint32_t id)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

static bool gid_admitted(const struct gpud_server *s, gid_t g)
{
	return (s->group_rw && g == s->sock_gid) ||
	       id_listed(s->p.allowed_gids, s->p.n_allowed_gids, (uint32_t)g);
}

/* The rules in server.h. The supplementary groups are asked for only
 * when the uid and gid did not settle it; more than PEER_GROUPS_MAX of
 * them (or a kernel without SO_PEERGROUPS) leaves the gid alone to
 * decide. */
static bool peer_allowed(struct gpud_server *s, int fd, uid_t uid, gid_t gid)
{
	if (uid == 0 || uid == geteuid() ||
	    id_listed(s->p.allowed_uids, s->p.n_allowed_uids, (uint32_t)uid) ||
	    gid_admitted(s, gid))
		return true;
	if (!s->group_rw && !s->p.n_allowed_gids)
		return false;
	socklen_t len = sizeof(s->peer_groups);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, s->peer_groups, &len) != 0) {
		log_debug("SO_PEERGROUPS: %s", strerror(errno));
		return false;
	}
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (gid_admitted(s, s->peer_groups[i]))
			return true;
	return false;
}

/* A warn line per refused peer, but at most one a second: a peer that
 * retries in a loop must not flood the log. */
static void log_refused(struct gpud_server *s, const struct sconn *c)
{
	uint64_t now = sw_now_ns();
	if (s->refuse_log_ns && now - s->refuse_log_ns < REFUSE_LOG_NS) {
		s->refuse_unlogged++;
		return;
	}
	char more[64] = "";
	if (s->refuse_unlogged)
		snprintf(more, sizeof(more), " (and %llu more since the last such line)",
			 (unsigned long long)s->refuse_unlogged);
	log_warn("refused peer pid %d uid %u gid %u: not root, not uid %u, not in the socket's "
		 "group or gpud.allowed_uids / gpud.allowed_gids%s", (int)c->pid,
		 (unsigned)c->uid, (unsigned)c->gid, (unsigned)geteuid(), more);
	s->refuse_log_ns = now;
	s->refuse_unlogged = 0;
}

/* Tells a refused peer why (ERROR, aux = EACCES, before any HELLO: the
 * client library reports it as such) and closes once that is out. */
static void refuse_peer(struct sconn *c)
{
	struct gpud_server *s = c->s;
	log_refused(s, c);
	STAT(s, s->st.refused_peer++);
	struct proto_frame e;
	proto_frame_init(&e, PROTO_T_ERROR, 0);
	e.aux = EACCES;
	if (gpud__send_frame(c, &e, true))
		gpud__close_conn(c, "peer refused");
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
		STAT(s, s->st.refused_conns++); /* before the peer sees the close */
		uv_close((uv_handle_t *)&s->refuse, on_refuse_close);
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
	if (!peer_allowed(s, fd, c->uid, c->gid)) {
		refuse_peer(c);
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
