/* server.c - gpud's socket front end (contract in server.h, wire format
 * in proto/README.md): creating the server and reserving everything it
 * uses, listening, draining, closing and destroying it, its counters.
 * The rest of it, and the threads and locks they share, are described in
 * gpud/server_impl.h.
 */
#include "gpud/server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/mem.h"
#include "gpud/server_impl.h"

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
	p->socket_mode = 0660;
	p->socket_gid = (gid_t)-1;
}

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
	if (!q.socket_mode)
		q.socket_mode = d.socket_mode;
	if (q.socket_mode > 0777 || (q.socket_mode & 0600) != 0600)
		return sw_seterr(err, errlen, -EINVAL, "server: socket_mode %04o: expected owner "
				 "rw and nothing beyond 0777", q.socket_mode);
	if (q.n_allowed_uids > GPUD_SERVER_MAX_IDS || q.n_allowed_gids > GPUD_SERVER_MAX_IDS)
		return sw_seterr(err, errlen, -EINVAL, "server: more than %d allowed uids or gids",
				 GPUD_SERVER_MAX_IDS);
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
	/* Backed now, not as requests and connections first use them. */
	if ((rc = sw_mem_prefault(s->slot_mem, (size_t)q.max_requests * s->slot_size)) ||
	    (rc = sw_mem_prefault(s->conns, q.max_connections * sizeof(*s->conns))) ||
	    (rc = sw_mem_prefault(s->pend, q.max_connections * sizeof(*s->pend))) ||
	    (rc = sw_mem_prefault(s->work, q.max_connections * sizeof(*s->work))) ||
	    (rc = sw_mem_prefault(s->scratch, q.max_requests * sizeof(*s->scratch))) ||
	    (rc = sw_mem_prefault(s->reply, s->reply_cap)))
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
		struct gpud_sreq *r = gpud__slot_at(s, i);
		uint8_t *extra = (uint8_t *)r + align16(sizeof(*r));
		r->idx = i;
		r->priv = priv ? extra : NULL;
		r->stage = extra + priv;
	}
	uv_pipe_init(loop, &s->listener, 0);
	uv_async_init(loop, &s->async, gpud__on_async);
	uv_timer_init(loop, &s->timer);
	s->listener.data = s->async.data = s->timer.data = s;
	s->handles = 3;
	s->async_live = true;
	reserve_watchers(s);
	log_info("server: reserved %u connection slots of %zu bytes, %u request slots of %zu "
		 "bytes (%zu MiB, backed now); per connection: ring %zu, request area %zu",
		 q.max_connections, sizeof(struct sconn), q.max_requests, s->slot_size,
		 (size_t)q.max_requests * s->slot_size >> 20, q.ring_bytes, q.req_bytes);
	*out = s;
	return 0;

out_free:
	free_server(s);
	size_t slot = align16(sizeof(struct gpud_sreq)) + priv + stage;
	return sw_seterr(err, errlen, rc, "server: cannot reserve %u request slots of %zu bytes "
			 "(%.1f MiB) and %u connection slots: %s", q.max_requests, slot,
			 (double)q.max_requests * (double)slot / (1 << 20), q.max_connections,
			 sw_strerror(rc));
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

/* Gives the freshly bound (not yet listening) socket file its group,
 * then checks that path is still that file: a socket of ours, with the
 * mode and group asked for. A default ACL on the directory can override
 * the umask: then the mode is set by chmod, still before listen. */
static int finish_socket_file(struct gpud_server *s, char *err, size_t errlen)
{
	struct stat st;
	mode_t mode = (mode_t)s->p.socket_mode;

	if (lstat(s->path, &st) != 0)
		return sw_seterr(err, errlen, -errno, "%s: %s", s->path, strerror(errno));
	if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
		s->bound = false; /* not ours to remove */
		return sw_seterr(err, errlen, -EPERM, "%s changed under gpud after bind (not a "
				 "socket owned by uid %u)", s->path, (unsigned)geteuid());
	}
	/* Our own group by default, even in a set-group-ID directory (whose
	 * group a new file takes). */
	gid_t gid = s->p.socket_gid != (gid_t)-1 ? s->p.socket_gid : getegid();
	if (st.st_gid != gid) {
		/* lchown: never follows a link someone put in its place. */
		if (lchown(s->path, (uid_t)-1, gid) != 0) {
			int e = errno;
			return sw_seterr(err, errlen, -e, "cannot give %s to group %u (gpud.socket_group):"
					 " %s%s", s->path, (unsigned)gid, strerror(e),
					 e == EPERM ? " (gpud must be root or a member of that group)"
						    : "");
		}
		st.st_gid = gid;
	}
	if ((st.st_mode & 07777) != mode) {
		log_info("%s: bound with mode %04o (a default ACL?); setting %04o before listening",
			 s->path, (unsigned)(st.st_mode & 07777), (unsigned)mode);
		if (chmod(s->path, mode) != 0)
			return sw_seterr(err, errlen, -errno, "chmod %s: %s", s->path, strerror(errno));
	}
	s->sock_gid = st.st_gid;
	s->group_rw = (mode & 0060) == 0060;
	return 0;
}

int gpud_server_listen(struct gpud_server *s, char *err, size_t errlen)
{
	if (!s || s->closed || s->listening)
		return sw_seterr(err, errlen, -EINVAL, "server: not in a state to listen");
	int rc = clear_stale(s->path, err, errlen);
	if (rc)
		return rc;
	/* The file is born with its final mode: bind applies the umask, so
	 * for the length of this one call the umask is the complement of
	 * socket_mode. (A umask is per process: a file another thread
	 * created meanwhile could only get fewer permissions, and none does
	 * at this point of start-up. The alternative, bind in a private 0700
	 * directory and rename into place, needs a longer path than the
	 * 107 bytes a socket name may have, and leaves the directory behind
	 * when gpud dies in between.) Nothing can connect before listen, so
	 * the group is set after bind and before listen. */
	mode_t old = umask(~(mode_t)s->p.socket_mode & 0777);
	rc = uv_pipe_bind(&s->listener, s->path);
	umask(old);
	if (rc)
		return sw_seterr(err, errlen, rc, "bind %s: %s", s->path, uv_strerror(rc));
	s->bound = true;
	rc = finish_socket_file(s, err, errlen);
	if (rc)
		goto out_unlink;
	rc = uv_listen((uv_stream_t *)&s->listener, (int)s->p.max_connections, gpud__on_connection);
	if (rc) {
		rc = sw_seterr(err, errlen, rc, "listen %s: %s", s->path, uv_strerror(rc));
		goto out_unlink;
	}
	s->listening = true;
	char grp[48] = "";
	if (s->group_rw)
		snprintf(grp, sizeof(grp), ", group %u", (unsigned)s->sock_gid);
	log_info("listening on %s (mode %04o, group %u; admits root, uid %u%s, %u allowed_uids, "
		 "%u allowed_gids; %u connections, %u requests, %u per connection)", s->path,
		 s->p.socket_mode, (unsigned)s->sock_gid, (unsigned)geteuid(), grp,
		 s->p.n_allowed_uids, s->p.n_allowed_gids, s->p.max_connections,
		 s->p.max_requests, s->p.max_per_connection);
	return 0;

out_unlink:
	if (s->bound) /* ours: finish_socket_file checked it */
		unlink(s->path);
	s->bound = false;
	return rc;
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
		gpud__collect_cancels_locked(c, &n);
		pthread_mutex_unlock(&c->lock);
	}
	gpud__cancel_batch(s, s->scratch, n);
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
		gpud__close_conn(&s->conns[i], "server closing");
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
				gpud__reap_conn(c);
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
