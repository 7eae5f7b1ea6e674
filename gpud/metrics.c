/* metrics.c - the Prometheus endpoint: a bounded HTTP/1.0 responder on
 * libuv (gpud/metrics.h).
 *
 * A connection goes READING (request head into its slot's buffer) ->
 * WRITING (status line, headers and body in one uv_write) -> DRAINING
 * (our side shut down; read and discard until the client closes, so that
 * closing with unread input does not turn into a RST that destroys the
 * response) -> CLOSING (stream and timer closing) -> FREE.
 */
#include "gpud/metrics.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/err.h"

#define DRAIN_MS 2000
#define BACKLOG 64

enum conn_state { C_FREE, C_READING, C_WRITING, C_DRAINING, C_CLOSING };

union stream {
	uv_handle_t h;
	uv_stream_t s;
	uv_tcp_t tcp;
	uv_pipe_t pipe;
};

struct conn {
	struct gpud_metrics *m;
	union stream st;
	uv_timer_t timer;
	uv_write_t wr;
	uv_shutdown_t sd;
	enum conn_state state;
	int open_handles;
	bool body_ref;     /* holds the shared body while writing it */
	size_t req_len;
	char head[192];
	char req[GPUD_METRICS_HEAD_MAX];
};

struct gpud_metrics {
	uv_loop_t *loop;
	bool is_unix;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int port;
	union stream lsn;
	bool lsn_open;
	bool closing;
	bool pending_accept; /* a connection waits in the listener for a slot */
	union stream reject; /* accepts and closes one connection over the limit */
	bool reject_busy;
	unsigned idle_ms;
	int n_open;          /* handles not yet closed */
	gpud_metrics_render_fn render;
	void *arg;
	struct gpud_metrics_counts counts;
	char *body;          /* GPUD_METRICS_BODY_MAX: the shared rendering */
	size_t body_len;
	int body_refs;
	char discard[4096];  /* what DRAINING reads */
	struct conn conns[GPUD_METRICS_MAX_CONNS];
};

static void try_accept(struct gpud_metrics *m);

static void release_body(struct conn *c)
{
	if (c->body_ref) {
		c->body_ref = false;
		c->m->body_refs--;
	}
}

static void on_conn_closed(uv_handle_t *h)
{
	struct conn *c = h->data;
	struct gpud_metrics *m = c->m;

	m->n_open--;
	if (--c->open_handles > 0)
		return;
	c->state = C_FREE;
	if (m->pending_accept && !m->closing) {
		m->pending_accept = false;
		try_accept(m);
	}
}

static void close_conn(struct conn *c)
{
	if (c->state == C_FREE || c->state == C_CLOSING)
		return;
	release_body(c);
	c->state = C_CLOSING;
	uv_timer_stop(&c->timer);
	uv_read_stop(&c->st.s);
	uv_close((uv_handle_t *)&c->timer, on_conn_closed);
	uv_close(&c->st.h, on_conn_closed);
}

static void on_timeout(uv_timer_t *t)
{
	close_conn(t->data);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct conn *c = h->data;

	(void)hint;
	if (c->state == C_DRAINING) {
		*buf = uv_buf_init(c->m->discard, sizeof(c->m->discard));
		return;
	}
	*buf = uv_buf_init(c->req + c->req_len, (unsigned)(sizeof(c->req) - c->req_len));
}

static void on_shutdown(uv_shutdown_t *sd, int status)
{
	struct conn *c = sd->data;

	if (c->state != C_WRITING)
		return; /* closing: cancelled */
	if (status < 0 || uv_read_start(&c->st.s, on_alloc, NULL) < 0) {
		close_conn(c);
		return;
	}
	c->state = C_DRAINING;
	uv_timer_start(&c->timer, on_timeout, DRAIN_MS, 0);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void on_written(uv_write_t *wr, int status)
{
	struct conn *c = wr->data;

	release_body(c);
	if (c->state != C_WRITING)
		return;
	if (status < 0 || uv_shutdown(&c->sd, &c->st.s, on_shutdown) < 0)
		close_conn(c);
}

static void respond(struct conn *c, int code, const char *reason, const char *type,
		    const char *body, size_t len)
{
	uv_buf_t bufs[2];
	int n;

	uv_read_stop(&c->st.s);
	n = snprintf(c->head, sizeof(c->head),
		     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		     "Connection: close\r\n\r\n",
		     code, reason, type, len);
	bufs[0] = uv_buf_init(c->head, (unsigned)n);
	bufs[1] = uv_buf_init((char *)body, (unsigned)len);
	c->state = C_WRITING;
	c->wr.data = c;
	c->sd.data = c;
	if (uv_write(&c->wr, &c->st.s, bufs, len ? 2 : 1, on_written) < 0) {
		release_body(c);
		close_conn(c);
	}
}

static void respond_text(struct conn *c, int code, const char *reason, const char *text)
{
	respond(c, code, reason, "text/plain; charset=utf-8", text, strlen(text));
}

/* The request line: METHOD SP TARGET SP HTTP/1.x */
static void handle(struct conn *c, size_t head_len)
{
	struct gpud_metrics *m = c->m;
	const char *p = c->req, *end = c->req + head_len;
	const char *meth, *target, *ver;
	size_t lm, lt;

	meth = p;
	while (p < end && *p != ' ' && *p != '\r' && *p != '\n')
		p++;
	lm = (size_t)(p - meth);
	if (p == end || *p != ' ' || lm == 0)
		goto out_bad;
	target = ++p;
	while (p < end && *p != ' ' && *p != '\r' && *p != '\n')
		p++;
	lt = (size_t)(p - target);
	if (p == end || *p != ' ' || lt == 0)
		goto out_bad;
	ver = ++p;
	if (end - ver < 8 || memcmp(ver, "HTTP/1.", 7) != 0)
		goto out_bad;

	if (lm == 3 && memcmp(meth, "GET", 3) == 0 && lt >= 8 &&
	    memcmp(target, "/metrics", 8) == 0 && (lt == 8 || target[8] == '?')) {
		if (m->body_refs == 0) { /* nobody is writing the last one: render anew */
			int rc = m->render(m->arg, m->body, GPUD_METRICS_BODY_MAX, &m->body_len);

			if (rc < 0 || m->body_len > GPUD_METRICS_BODY_MAX) {
				m->body_len = 0;
				m->counts.failed++;
				respond_text(c, 500, "Internal Server Error", "render failed\n");
				return;
			}
		}
		m->body_refs++;
		c->body_ref = true;
		m->counts.ok++;
		respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", m->body,
			m->body_len);
		return;
	}
	m->counts.not_found++;
	respond_text(c, 404, "Not Found", "not found: try GET /metrics\n");
	return;

out_bad:
	m->counts.bad_request++;
	respond_text(c, 400, "Bad Request", "bad request\n");
}

/* The end of the head: an empty line (CRLF CRLF, or bare LF LF). */
static size_t head_end(const char *b, size_t from, size_t len)
{
	for (size_t i = from; i < len; i++) {
		if (b[i] != '\n')
			continue;
		if (i >= 1 && b[i - 1] == '\n')
			return i + 1;
		if (i >= 2 && b[i - 1] == '\r' && b[i - 2] == '\n')
			return i + 1;
	}
	return 0;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct conn *c = s->data;
	size_t from, end;

	(void)buf;
	if (nread == 0)
		return;
	if (c->state == C_DRAINING) {
		if (nread < 0) /* the client closed: done */
			close_conn(c);
		return;
	}
	if (c->state != C_READING)
		return;
	if (nread < 0) {
		close_conn(c);
		return;
	}
	from = c->req_len;
	c->req_len += (size_t)nread;
	end = head_end(c->req, from, c->req_len);
	if (end) {
		handle(c, end);
	} else if (c->req_len == sizeof(c->req)) {
		c->m->counts.too_large++;
		respond_text(c, 431, "Request Header Fields Too Large", "request head too large\n");
	}
}

static int stream_init(struct gpud_metrics *m, union stream *st)
{
	if (m->is_unix)
		return uv_pipe_init(m->loop, &st->pipe, 0);
	return uv_tcp_init(m->loop, &st->tcp);
}

static void on_reject_closed(uv_handle_t *h)
{
	struct gpud_metrics *m = h->data;

	m->n_open--;
	m->reject_busy = false;
	if (m->pending_accept && !m->closing) {
		m->pending_accept = false;
		try_accept(m);
	}
}

static void try_accept(struct gpud_metrics *m)
{
	struct conn *c = NULL;

	for (int i = 0; i < GPUD_METRICS_MAX_CONNS; i++) {
		if (m->conns[i].state == C_FREE) {
			c = &m->conns[i];
			break;
		}
	}
	if (!c) {
		if (m->reject_busy) { /* libuv keeps it until we accept */
			m->pending_accept = true;
			return;
		}
		if (stream_init(m, &m->reject) < 0)
			return;
		m->reject.h.data = m;
		m->reject_busy = true;
		m->n_open++;
		uv_accept(&m->lsn.s, &m->reject.s);
		m->counts.refused++;
		uv_close(&m->reject.h, on_reject_closed);
		return;
	}
	memset(c, 0, offsetof(struct conn, head));
	c->m = m;
	if (stream_init(m, &c->st) < 0)
		return;
	c->st.h.data = c;
	uv_timer_init(m->loop, &c->timer);
	c->timer.data = c;
	c->open_handles = 2;
	m->n_open += 2;
	c->state = C_READING;
	if (uv_accept(&m->lsn.s, &c->st.s) < 0 || uv_read_start(&c->st.s, on_alloc, on_read) < 0) {
		close_conn(c);
		return;
	}
	uv_timer_start(&c->timer, on_timeout, m->idle_ms, 0);
}

static void on_connection(uv_stream_t *lsn, int status)
{
	struct gpud_metrics *m = lsn->data;

	if (status < 0 || m->closing)
		return;
	try_accept(m);
}

/* "127.0.0.1:PORT" -> port; -1 when it is not exactly that. */
static int parse_loopback(const char *s)
{
	const char *pfx = "127.0.0.1:";
	long port = 0;
	const char *p;

	if (strncmp(s, pfx, strlen(pfx)) != 0)
		return -1;
	p = s + strlen(pfx);
	if (*p == 0 || strlen(p) > 5)
		return -1;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		port = port * 10 + (*p - '0');
	}
	return port <= 65535 ? (int)port : -1;
}

/* A socket file at path that nobody accepts on is left over from an
 * earlier run: remove it. One that answers is in use. */
static int clear_stale(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, rc;

	if (lstat(path, &st) < 0)
		return 0;
	if (!S_ISSOCK(st.st_mode))
		return sw_seterr(err, errlen, -EEXIST, "metrics: %s exists and is not a socket",
				 path);
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return sw_seterr(err, errlen, -errno, "metrics: socket: %s", strerror(errno));
	rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	if (rc == 0)
		return sw_seterr(err, errlen, -EADDRINUSE, "metrics: %s is in use", path);
	if (unlink(path) < 0 && errno != ENOENT)
		return sw_seterr(err, errlen, -errno, "metrics: unlink %s: %s", path,
				 strerror(errno));
	return 0;
}

/* Binds and listens with plain system calls, so that every failure is
 * known before libuv holds anything. Returns the fd or a negative code. */
static int open_listener(struct gpud_metrics *m, char *err, size_t errlen)
{
	int fd, rc;

	if (m->is_unix) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };

		rc = clear_stale(m->path, err, errlen);
		if (rc < 0)
			return rc;
		strcpy(sa.sun_path, m->path);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return sw_seterr(err, errlen, -errno, "metrics: socket: %s",
					 strerror(errno));
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			rc = sw_seterr(err, errlen, -errno, "metrics: bind %s: %s", m->path,
				       strerror(errno));
			goto out_close;
		}
		if (chmod(m->path, 0660) < 0 || listen(fd, BACKLOG) < 0) {
			rc = sw_seterr(err, errlen, -errno, "metrics: listen %s: %s", m->path,
				       strerror(errno));
			unlink(m->path);
			goto out_close;
		}
	} else {
		struct sockaddr_in sa = {
			.sin_family = AF_INET,
			.sin_port = htons((uint16_t)m->port),
			.sin_addr.s_addr = htonl(INADDR_LOOPBACK),
		};
		socklen_t sl = sizeof(sa);
		int one = 1;

		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return sw_seterr(err, errlen, -errno, "metrics: socket: %s",
					 strerror(errno));
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, BACKLOG) < 0 ||
		    getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
			rc = sw_seterr(err, errlen, -errno, "metrics: 127.0.0.1:%d: %s", m->port,
				       strerror(errno));
			goto out_close;
		}
		m->port = ntohs(sa.sin_port);
	}
	return fd;

out_close:
	close(fd);
	return rc;
}

static void on_lsn_closed(uv_handle_t *h)
{
	struct gpud_metrics *m = h->data;

	m->n_open--;
	m->lsn_open = false;
}

static void free_self(uv_handle_t *h)
{
	struct gpud_metrics *m = h->data;

	free(m->body);
	free(m);
}

int gpud_metrics_create(struct gpud_metrics **out, uv_loop_t *loop, const char *listen_addr,
			gpud_metrics_render_fn render, void *arg, char *err, size_t errlen)
{
	struct gpud_metrics *m;
	int fd, rc, port = -1;
	size_t plen = 0;

	if (out)
		*out = NULL;
	if (!out || !loop || !listen_addr || !render)
		return sw_seterr(err, errlen, -EINVAL, "metrics: missing argument");
	if (strncmp(listen_addr, "unix:", 5) == 0) {
		plen = strlen(listen_addr + 5);
		if (plen == 0 || plen >= sizeof(m->path))
			return sw_seterr(err, errlen, -EINVAL,
					 "metrics: unix socket path empty or longer than %zu",
					 sizeof(m->path) - 1);
	} else {
		port = parse_loopback(listen_addr);
		if (port < 0)
			return sw_seterr(err, errlen, -EINVAL,
					 "metrics: listen \"%s\": want 127.0.0.1:PORT or unix:PATH "
					 "(the endpoint is unauthenticated: no other addresses)",
					 listen_addr);
	}

	m = calloc(1, sizeof(*m));
	if (!m)
		return sw_seterr(err, errlen, -ENOMEM, "metrics: out of memory");
	m->body = malloc(GPUD_METRICS_BODY_MAX);
	if (!m->body) {
		rc = sw_seterr(err, errlen, -ENOMEM, "metrics: out of memory");
		goto out_free;
	}
	m->loop = loop;
	m->render = render;
	m->arg = arg;
	m->idle_ms = GPUD_METRICS_IDLE_MS;
	m->is_unix = port < 0;
	if (m->is_unix)
		memcpy(m->path, listen_addr + 5, plen + 1);
	else
		m->port = port;

	fd = open_listener(m, err, errlen);
	if (fd < 0) {
		rc = fd;
		goto out_free;
	}
	rc = m->is_unix ? uv_pipe_init(loop, &m->lsn.pipe, 0) : uv_tcp_init(loop, &m->lsn.tcp);
	if (rc < 0) {
		close(fd);
		rc = sw_seterr(err, errlen, rc, "metrics: %s", uv_strerror(rc));
		goto out_free;
	}
	/* from here the handle is the loop's: failures hand m to its close
	 * callback, which frees it */
	m->lsn.h.data = m;
	rc = m->is_unix ? uv_pipe_open(&m->lsn.pipe, fd) : uv_tcp_open(&m->lsn.tcp, fd);
	if (rc == 0)
		rc = uv_listen(&m->lsn.s, BACKLOG, on_connection);
	if (rc < 0) {
		sw_seterr(err, errlen, rc, "metrics: %s", uv_strerror(rc));
		if (m->is_unix)
			unlink(m->path);
		uv_close(&m->lsn.h, free_self); /* closes fd */
		return rc;
	}
	m->lsn_open = true;
	m->n_open = 1;
	*out = m;
	return 0;

out_free:
	free(m->body);
	free(m);
	return rc;
}

int gpud_metrics_port(const struct gpud_metrics *m)
{
	return m->is_unix ? 0 : m->port;
}

void gpud_metrics_set_idle_timeout(struct gpud_metrics *m, unsigned ms)
{
	if (ms > 0)
		m->idle_ms = ms;
}

void gpud_metrics_counts(const struct gpud_metrics *m, struct gpud_metrics_counts *c)
{
	*c = m->counts;
}

void gpud_metrics_close(struct gpud_metrics *m)
{
	if (!m || m->closing)
		return;
	m->closing = true;
	m->pending_accept = false;
	if (m->lsn_open) {
		uv_close(&m->lsn.h, on_lsn_closed);
		if (m->is_unix)
			unlink(m->path);
	}
	for (int i = 0; i < GPUD_METRICS_MAX_CONNS; i++)
		close_conn(&m->conns[i]);
}

bool gpud_metrics_closed(const struct gpud_metrics *m)
{
	return m->closing && m->n_open == 0;
}

void gpud_metrics_destroy(struct gpud_metrics *m)
{
	if (!m)
		return;
	if (m->n_open > 0)
		return; /* the loop still points into m: leave it (see metrics.h) */
	free(m->body);
	free(m);
}
