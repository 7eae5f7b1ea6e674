/* server.c - gpud-http: HTTP/1.1 on one libuv loop, bridged to gpud.
 *
 * Why libuv and not libmicrohttpd: libuv is already a dependency (the
 * supervisor), and one event loop serves every connection and also
 * receives gpud's replies (through a uv_async the client library's reader
 * thread signals), with no thread per connection. Backpressure is ours:
 * we decide when to read a socket, how much of a slow reader's output to
 * hold, and when to cancel its request in gpud - libmicrohttpd's
 * response callbacks would own those decisions and its threads.
 *
 * Shape:
 *   - connections: read into a per-connection buffer (head limit 16 KiB,
 *     then grown once to the announced body, at most http.max_body_bytes),
 *     parsed by http/parse.c; one request at a time per connection
 *     (keep-alive; a pipelined request waits in the buffer); a header
 *     timeout from the first byte of a request to its last, an idle
 *     timeout between requests; at most http.max_connections (more are
 *     answered 503 and closed).
 *   - gpud: two proto_client connections. `gen` carries generation
 *     requests submitted from the loop (its timeout is short: a submit
 *     that cannot get request-area room quickly is a 429, never a stalled
 *     loop); `blk` carries the blocking calls (embed, stats) made from
 *     libuv's worker threads (uv_queue_work). Both are reopened by a 500 ms
 *     timer while gpud is away; meanwhile requests get 503.
 *   - a generation is a `job`: the reader thread's callbacks append the
 *     released text to the job's buffer under one mutex and wake the loop,
 *     which turns it into a response or server-sent events. The buffer is
 *     bounded (JOB_STREAM_MAX for a stream, JOB_WHOLE_MAX for a whole
 *     answer); while a connection's socket has unsent bytes beyond
 *     CONN_WQ_MAX the loop leaves the text in the buffer, and a reader so
 *     slow that the buffer fills has its request cancelled in gpud (the
 *     stream ends with an error event): memory per request is bounded and
 *     one slow reader never holds up the others sharing gpud's ring.
 *   - a client that disconnects (EOF, reset, a failed write) has its
 *     gpud request cancelled at once; the job lives on, detached, until
 *     gpud's DONE for it arrives.
 */
#include "http/server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/addr.h"
#include "common/err.h"
#include "common/log.h"
#include "common/privdrop.h"
#include "http/api.h"
#include "http/parse.h"
#include "http/think.h"
#include "proto/client.h"

#define HEAD_MAX (16u << 10)            /* request line + headers */
#define JOB_STREAM_MAX (256u << 10)     /* text held for a stream's slow reader */
#define JOB_WHOLE_MAX (16u << 20)       /* text of a whole (non-streamed) answer */
#define JOB_LP_FACTOR 4                 /* log probabilities held: 4x the text's bound */
#define CONN_WQ_MAX (64u << 10)         /* unsent bytes before we hold text back */
#define KEYS_MAX 256
#define KEY_LEN_MAX 255
#define GEN_TIMEOUT_MS 250              /* connect / request-area room on `gen` */
#define BLK_TIMEOUT_MS 60000            /* embed / stats replies on `blk` */
#define RECONNECT_MS 500
#define N_BUCKETS 12

static const double bucket_s[N_BUCKETS] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
					    0.5, 1, 2.5, 5, 10, 30 };

enum route {
	R_CHAT, R_COMPLETIONS, R_EMBEDDINGS, R_TOKENIZE, R_DETOKENIZE, R_MODELS, R_HEALTH,
	R_METRICS, R_OTHER, R_N
};
static const char *const route_name[R_N] = { "chat_completions", "completions", "embeddings",
					     "tokenize", "detokenize", "models", "health",
					     "metrics", "other" };

struct srv;
struct conn;

struct job {
	struct srv *s;
	struct conn *c;                 /* NULL once the client left (loop only) */
	struct http_gen *g;             /* the request; a choice's is its lead's */
	char id[40];
	char model[128];
	long created;
	uint64_t rid;
	uint64_t t0_ns;
	bool headers_sent, finished, cancel_sent, in_pump;
	bool oom;                       /* a choice could not be made (loop only) */
	char *out;                      /* loop's buffer of taken text (streams) */
	size_t out_cap;
	/* Shared with the reader thread, under s->mu. */
	char *buf;
	size_t len, cap, max;
	bool done, overflow, queued;
	int status;
	struct proto_done usage;
	char msg[PROTO_MAX_ERROR_MSG];
	struct job *next;
	/* a reasoning model's text sorted (loop only): its splitter, and a
	 * piece's reasoning and content */
	struct http_think think;
	struct tbuf { char *p; size_t n, cap; bool oom; } rsn, cnt;
	/* an echoed prompt of token ids: its tokens' text (reader thread,
	 * under s->mu, until done) */
	struct tbuf ep;
	/* log probabilities (g.logprobs): the reader thread's, under s->mu,
	 * and those the loop took but has not sent (a stream sends them with
	 * the next text, or at the end); lp_off: a completion's next
	 * text_offset */
	struct http_lpbuf lp, lpo;
	size_t lp_off;
	/* n > 1 (not streamed): the lead job (c->job) holds choice 0 and the
	 * other choices' jobs, each its own gpud request; their records
	 * queue the lead, which answers when every one is done */
	struct job *lead;               /* a choice's lead, NULL for a lead */
	struct job **kids;              /* (n_kids) choices 1.. */
	uint32_t n_kids;
	struct proto_submit_req kreq;   /* a choice's request: the lead's, its seed + index */
};

/* Whether the job and every choice of it are done (s->mu held). */
static bool job_all_done(const struct job *j)
{
	if (!j->done)
		return false;
	for (uint32_t i = 0; i < j->n_kids; i++)
		if (!j->kids[i]->done)
			return false;
	return true;
}

enum cstate { C_HEAD, C_BODY, C_BUSY, C_CLOSING };

struct conn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	struct srv *s;
	struct conn *prev, *next;
	enum cstate state;
	char *in;
	size_t in_len, in_cap;
	long head_len;
	struct http_head head;
	size_t req_len;                 /* head + body of the current request */
	bool keep_alive, reading, chunked_out, draining;
	uv_shutdown_t sreq;
	struct job *job;
	enum route route;
	uint64_t t0_ns;
	int pending_work;               /* uv_work items holding this conn */
};

struct srv {
	uv_loop_t loop;
	uv_tcp_t listener;
	uv_signal_t sigterm, sigint;
	uv_timer_t tick;
	uv_async_t wake;
	const struct http_server_opts *o;
	const struct sw_config *cfg;
	char model_id[128];
	char **keys;
	struct proto_client *gen, *blk;
	bool connecting, stopping;
	bool think_opened;              /* gpud's chat format opens a <think> (STATS) */
	int blk_users;
	pthread_mutex_t mu;
	struct job *ready;
	struct conn *conns;
	uint32_t n_conns;
	/* counters (loop only) */
	uint64_t requests[R_N][6];      /* by class: 2xx 4xx 429 5xx 503 other */
	uint64_t lat_bucket[R_N][N_BUCKETS + 1];
	double lat_sum[R_N];
	uint64_t lat_count[R_N];
	uint64_t refused_conns, slow_cancels, disconnect_cancels, tokens_out;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- keys --------------------------------------------------------------- */

int http_keys_load(const char *path, uid_t also_uid, char ***keys, size_t *n, char *err,
		   size_t errlen)
{
	struct stat st;
	char line[KEY_LEN_MAX + 3];
	char **k = NULL;
	size_t nk = 0;
	int rc = 0;
	FILE *f;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	*keys = NULL;
	*n = 0;
	if (fd < 0)
		return sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return sw_seterr(err, errlen, -EINVAL, "%s: not a regular file", path);
	}
	if ((st.st_mode & 077) ||
	    (st.st_uid != geteuid() && st.st_uid != 0 && st.st_uid != also_uid)) {
		close(fd);
		return sw_seterr(err, errlen, -EPERM,
				 "%s: must be mode 0600 or stricter and owned by this user or root "
				 "(chmod 600 %s)", path, path);
	}
	f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	}
	k = calloc(KEYS_MAX + 1, sizeof(*k));
	if (!k) {
		rc = -ENOMEM;
		goto out;
	}
	while (fgets(line, sizeof(line), f)) {
		size_t l = strlen(line);
		char *p = line;
		if (l == sizeof(line) - 1 && line[l - 1] != '\n') {
			rc = sw_seterr(err, errlen, SW_ETOOLONG, "%s: a key longer than %d bytes",
				       path, KEY_LEN_MAX);
			goto out;
		}
		while (l && (line[l - 1] == '\n' || line[l - 1] == '\r' || line[l - 1] == ' ' ||
			     line[l - 1] == '\t'))
			line[--l] = '\0';
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p || *p == '#')
			continue;
		if (nk == KEYS_MAX) {
			rc = sw_seterr(err, errlen, SW_ETOOLONG, "%s: more than %d keys", path, KEYS_MAX);
			goto out;
		}
		k[nk] = strdup(p);
		if (!k[nk]) {
			rc = -ENOMEM;
			goto out;
		}
		nk++;
	}
	if (!nk)
		rc = sw_seterr(err, errlen, -EINVAL, "%s: no key in the file", path);
out:
	explicit_bzero(line, sizeof(line));
	fclose(f);
	if (rc) {
		http_keys_free(k);
		return rc == -ENOMEM ? sw_seterr(err, errlen, rc, "%s: out of memory", path) : rc;
	}
	*keys = k;
	*n = nk;
	return 0;
}

void http_keys_free(char **keys)
{
	if (!keys)
		return;
	for (char **p = keys; *p; p++) {
		explicit_bzero(*p, strlen(*p));
		free(*p);
	}
	free(keys);
}

int http_keys_check(char *const *keys, const char *a, size_t alen)
{
	int ok = 0;

	if (!a || alen < 8 || strncasecmp(a, "Bearer ", 7) != 0)
		return 0;
	a += 7;
	alen -= 7;
	while (alen && *a == ' ') {
		a++;
		alen--;
	}
	for (; *keys; keys++) {
		size_t kl = strlen(*keys);
		unsigned char d = (unsigned char)(kl != alen);
		for (size_t i = 0; i < kl; i++)
			d |= (unsigned char)((*keys)[i] ^ (i < alen ? a[i] : 0));
		ok |= d == 0;
	}
	return ok;
}

/* ---- writing ------------------------------------------------------------ */

struct wreq {
	uv_write_t req;
	struct conn *c;
	size_t len;
	char data[];
};

static void conn_close(struct conn *c);
static void conn_next(struct conn *c);
static void on_closed(uv_handle_t *h);
static void job_pump(struct job *j);

static void on_written(uv_write_t *req, int status)
{
	struct wreq *w = (struct wreq *)req;
	struct conn *c = w->c;

	free(w);
	if (c->state == C_CLOSING)
		return;
	if (status < 0) {
		conn_close(c);
		return;
	}
	if (c->job)
		job_pump(c->job); /* room again for text held back */
}

/* Queues n bytes (copied). Returns 0 or -1 (the connection is closing). */
static int conn_write(struct conn *c, const char *data, size_t n)
{
	struct wreq *w;
	uv_buf_t b;

	if (c->state == C_CLOSING)
		return -1;
	w = malloc(sizeof(*w) + n);
	if (!w) {
		conn_close(c);
		return -1;
	}
	memcpy(w->data, data, n);
	w->c = c;
	w->len = n;
	b = uv_buf_init(w->data, (unsigned)n);
	if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0) {
		free(w);
		conn_close(c);
		return -1;
	}
	return 0;
}

static int conn_printf(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int conn_printf(struct conn *c, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return conn_write(c, buf, (size_t)(n < (int)sizeof(buf) ? n : (int)sizeof(buf) - 1));
}

static const char *reason(int st)
{
	switch (st) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 411: return "Length Required";
	case 413: return "Content Too Large";
	case 417: return "Expectation Failed";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: return "Status";
	}
}

static void count(struct srv *s, enum route r, int st, uint64_t t0)
{
	int k = st < 300 ? 0 : st == 429 ? 2 : st == 503 ? 4 : st < 500 ? 1 : 3;
	double sec = (double)(now_ns() - t0) / 1e9;
	int b = 0;

	s->requests[r][k]++;
	while (b < N_BUCKETS && sec > bucket_s[b])
		b++;
	s->lat_bucket[r][b]++;
	s->lat_sum[r] += sec;
	s->lat_count[r]++;
}

/* A whole response; then the connection goes on (keep-alive) or closes. */
static void respond(struct conn *c, int st, const char *ctype, const char *extra,
		    const char *body, size_t len)
{
	char head[512];
	int n;

	if (c->state == C_CLOSING)
		return;
	n = snprintf(head, sizeof(head),
		     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n", st,
		     reason(st), ctype, len, extra ? extra : "",
		     c->keep_alive ? "" : "Connection: close\r\n");
	count(c->s, c->route, st, c->t0_ns);
	if (conn_write(c, head, (size_t)n) || (len && conn_write(c, body, len)))
		return;
	conn_next(c);
}

static void respond_err(struct conn *c, const struct http_err *e, const char *extra)
{
	char *body = http_error_json(e);

	if (!body) {
		conn_close(c);
		return;
	}
	respond(c, e->status, "application/json", extra, body, strlen(body));
	free(body);
}

static void fail_conn(struct conn *c, int st, const char *param, const char *code,
		      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void fail_conn(struct conn *c, int st, const char *param, const char *code,
		      const char *fmt, ...)
{
	struct http_err e;
	va_list ap;
	char m[HTTP_MSG_MAX];

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	http_fail(&e, st, param, code, "%s", m);
	respond_err(c, &e, st == 429 ? "Retry-After: 1\r\n" : st == 401 ?
			   "WWW-Authenticate: Bearer\r\n" : NULL);
}

/* gpud's error code for a request -> the HTTP answer. */
static void gpud_err(struct http_err *e, int code, const char *msg)
{
	if (code == SW_EBUSY)
		http_fail(e, 429, NULL, "gpud_busy", "gpud is busy: %s", msg);
	else if (code == SW_ECLOSED)
		http_fail(e, 503, NULL, "gpud_unavailable", "gpud is not available: %s", msg);
	else if (code == SW_EDEVICE) /* gpud restarts: worth a retry */
		http_fail(e, 503, NULL, "gpud_device_failed", "a gpud device failed: %s", msg);
	else if (code == SW_ETOOLONG)
		http_fail(e, 400, NULL, "context_length_exceeded", "%s", msg);
	else if (code == SW_EFORMAT || code == -EINVAL || code == SW_EUNSUPPORTED)
		http_fail(e, 400, NULL, "invalid_request", "%s", msg);
	else
		http_fail(e, 500, NULL, "gpud_error", "gpud: %s (%s)", msg, sw_errname(code));
}

/* ---- jobs (generation) -------------------------------------------------- */

static void tbuf_put(struct tbuf *b, const char *s, size_t n)
{
	if (b->n + n > b->cap) {
		size_t nc = b->cap ? b->cap : 1024;
		while (nc < b->n + n)
			nc *= 2;
		char *p = realloc(b->p, nc);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = nc;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

/* An echoed prompt of token ids: the text of its tokens (their pieces,
 * from the prompt's records) in j->ep, bounded like the answer's text.
 * False when over the bound or out of memory. */
static bool echo_collect(struct job *j, const struct proto_tokens *t)
{
	struct proto_lp_iter it;
	struct proto_lp_entry le;

	if (!t->logprobs || !t->prompt)
		return true;
	proto_lp_iter_init(&it, t);
	while (proto_lp_next(&it, &le)) {
		if (le.rank)
			continue;
		if (j->ep.n + le.piece_len > j->max)
			return false;
		tbuf_put(&j->ep, le.piece, le.piece_len);
	}
	return !j->ep.oom;
}

static int on_tokens(void *arg, uint64_t rid, const struct proto_tokens *t)
{
	struct job *j = arg, *q = j->lead ? j->lead : j; /* q: what the loop pumps */
	struct srv *s = j->s;
	int stop = 0;

	(void)rid;
	pthread_mutex_lock(&s->mu);
	if (j->len + t->text_len > j->max || (j->g->logprobs && http_lp_collect(&j->lp, t)) ||
	    (j->g->echo && j->g->ids && !echo_collect(j, t))) {
		j->overflow = true;
		stop = 1;
	} else if (t->text_len) {
		if (j->len + t->text_len > j->cap) {
			size_t nc = j->cap ? j->cap : 4096;
			while (nc < j->len + t->text_len)
				nc *= 2;
			char *nb = realloc(j->buf, nc);
			if (!nb) {
				j->overflow = true;
				stop = 1;
				goto out;
			}
			j->buf = nb;
			j->cap = nc;
		}
		memcpy(j->buf + j->len, t->text, t->text_len);
		j->len += t->text_len;
	}
	if (!q->queued && (j->g->stream || stop)) {
		q->queued = true;
		q->next = s->ready;
		s->ready = q;
		uv_async_send(&s->wake);
	}
out:
	pthread_mutex_unlock(&s->mu);
	return stop;
}

static void on_done(void *arg, uint64_t rid, int status, const struct proto_done *u,
		    const char *msg)
{
	struct job *j = arg, *q = j->lead ? j->lead : j; /* q: what the loop pumps */
	struct srv *s = j->s;

	(void)rid;
	pthread_mutex_lock(&s->mu);
	j->done = true;
	j->status = status;
	if (u)
		j->usage = *u;
	snprintf(j->msg, sizeof(j->msg), "%s", msg ? msg : "");
	if (!q->queued) {
		q->queued = true;
		q->next = s->ready;
		s->ready = q;
	}
	pthread_mutex_unlock(&s->mu);
	uv_async_send(&s->wake);
}

static void job_free(struct job *j)
{
	for (uint32_t i = 0; i < j->n_kids; i++)
		job_free(j->kids[i]);
	free(j->kids);
	if (!j->lead) { /* a choice shares its lead's */
		http_gen_free(j->g);
		free(j->g);
	}
	free(j->buf);
	free(j->out);
	free(j->rsn.p);
	free(j->cnt.p);
	free(j->ep.p);
	free(j->lp.p);
	free(j->lpo.p);
	free(j);
}

/* ---- reasoning and content (http/think.h) --------------------------------- */

static void to_reason(void *arg, const char *s, size_t n)
{
	tbuf_put(&((struct job *)arg)->rsn, s, n);
}

static void to_content(void *arg, const char *s, size_t n)
{
	tbuf_put(&((struct job *)arg)->cnt, s, n);
}

/* Sorts n bytes of the answer (and, at its end, what the splitter kept
 * back) into j->rsn and j->cnt, emptied first. False when out of memory. */
static bool job_sort(struct job *j, const char *text, size_t n, bool end)
{
	const struct http_think_sink k = { to_reason, to_content, j };

	j->rsn.n = j->cnt.n = 0;
	http_think_feed(&j->think, text, n, &k);
	if (end)
		http_think_end(&j->think, &k);
	return !j->rsn.oom && !j->cnt.oom;
}

/* Whether a choice failed (over the bound, or ended with an error). */
static bool job_failed(struct job *j)
{
	bool failed = false;

	pthread_mutex_lock(&j->s->mu);
	for (uint32_t i = 0; i <= j->n_kids; i++) {
		const struct job *x = i ? j->kids[i - 1] : j;
		failed |= x->overflow || (x->done && x->status);
	}
	pthread_mutex_unlock(&j->s->mu);
	return failed;
}

/* Cancels in gpud every request of the job not cancelled yet (one that
 * ended meanwhile: gpud ignores it). Returns how many were sent. */
static uint32_t job_cancel(struct job *j)
{
	struct srv *s = j->s;
	uint32_t n = 0;

	for (uint32_t i = 0; s->gen && i <= j->n_kids; i++) {
		struct job *x = i ? j->kids[i - 1] : j;
		if (!x->cancel_sent) {
			x->cancel_sent = true;
			n += proto_client_cancel(s->gen, x->rid) == 0;
		}
	}
	return n;
}

/* The client went away: cancel in gpud (once); the job is freed at DONE
 * (or now, when DONE came and only the write queue held it back). */
static void job_detach(struct job *j)
{
	struct srv *s = j->s;
	bool gone;

	j->c = NULL;
	s->disconnect_cancels += job_cancel(j);
	if (j->in_pump)
		return; /* job_pump decides */
	pthread_mutex_lock(&s->mu);
	gone = job_all_done(j) && !j->queued;
	pthread_mutex_unlock(&s->mu);
	if (gone)
		job_free(j);
}

/* One SSE event (chunked when the connection is HTTP/1.1). */
static int sse_send(struct conn *c, const char *data, size_t len)
{
	size_t need = http_sse_event(NULL, 0, data, len);
	char *b = malloc(need + 32);
	size_t off = 0;
	int rc;

	if (!b) {
		conn_close(c);
		return -1;
	}
	if (c->chunked_out)
		off = (size_t)snprintf(b, 32, "%zx\r\n", need);
	http_sse_event(b + off, need, data, len);
	off += need;
	if (c->chunked_out) {
		memcpy(b + off, "\r\n", 2);
		off += 2;
	}
	rc = conn_write(c, b, off);
	free(b);
	return rc;
}

static int sse_json(struct conn *c, char *json)
{
	int rc;

	if (!json) {
		conn_close(c);
		return -1;
	}
	rc = sse_send(c, json, strlen(json));
	free(json);
	return rc;
}

static void stream_end(struct conn *c)
{
	if (sse_send(c, "[DONE]", 6))
		return;
	if (c->chunked_out && conn_write(c, "0\r\n\r\n", 5))
		return;
	if (!c->chunked_out) {
		c->keep_alive = false;
	}
	conn_next(c);
}

/* A completion's echo: the prompt (its segments as sent, or with token
 * ids the text of its tokens) before the answer in j->cnt. False when out
 * of memory. */
static bool job_echo(struct job *j)
{
	const struct http_gen *g = j->g;
	struct tbuf t = { 0 };

	if (g->ids)
		tbuf_put(&t, j->ep.p ? j->ep.p : "", j->ep.n);
	else
		for (uint32_t i = 0; i < g->req.n_segments; i++)
			tbuf_put(&t, g->seg[i].text, g->seg[i].len);
	tbuf_put(&t, j->cnt.p ? j->cnt.p : "", j->cnt.n);
	if (t.oom) {
		free(t.p);
		return false;
	}
	free(j->cnt.p);
	j->cnt = t;
	return true;
}

/* One choice of a whole answer (choice index of its lead's request):
 * its text sorted, echoed, with its log probabilities. NULL when out of
 * memory. */
static json_t *job_choice(struct job *j, uint32_t index)
{
	const struct http_gen *g = j->g;
	json_t *lp = g->logprobs ? http_logprobs_json(g->kind, j->lp.p, j->lp.n, &j->lp_off)
				 : NULL;

	if ((!lp && g->logprobs) || !job_sort(j, j->buf ? j->buf : "", j->len, true) ||
	    (g->echo && !job_echo(j))) {
		json_decref(lp);
		return NULL;
	}
	return http_choice_json(g->kind, index, j->cnt.p ? j->cnt.p : "", j->cnt.n,
				j->think.reasoned ? (j->rsn.p ? j->rsn.p : "") : NULL, j->rsn.n, lp,
				j->usage.stop_reason);
}

/* A whole answer, every choice done: the first failure's error (a
 * choice over the bound; else the first error that is not a cancel, ours
 * after another failed), or the choices with the request's usage (the
 * prompt once, the generated tokens of all). */
static void finish_whole(struct job *j, struct conn *c)
{
	struct srv *s = j->s;
	const struct job *bad = NULL;
	bool overflow = false;
	struct http_err e;

	for (uint32_t i = 0; i <= j->n_kids; i++) {
		const struct job *x = i ? j->kids[i - 1] : j;
		overflow |= x->overflow;
		if (x->status && (!bad || bad->status == SW_ECANCELED))
			bad = x;
	}
	if (j->oom) {
		fail_conn(c, 503, NULL, "out_of_memory", "out of memory for %u choices", j->g->n);
		return;
	}
	if (overflow) {
		http_fail(&e, 400, "max_tokens", "response_too_large",
			  "the answer exceeds %u bytes; lower max_tokens or stream it", JOB_WHOLE_MAX);
		respond_err(c, &e, NULL);
		return;
	}
	if (bad) {
		gpud_err(&e, bad->status, bad->msg);
		respond_err(c, &e, e.status == 429 ? "Retry-After: 1\r\n" : NULL);
		return;
	}
	struct proto_done u = j->usage;
	json_t *choices = json_array();
	u.generated_tokens = 0;
	for (uint32_t i = 0; choices && i <= j->n_kids; i++) {
		struct job *x = i ? j->kids[i - 1] : j;
		json_t *ch = job_choice(x, i);
		if (!ch || json_array_append_new(choices, ch)) {
			json_decref(choices);
			choices = NULL;
		}
		u.generated_tokens += x->usage.generated_tokens;
	}
	char *body = http_completion_choices_json(j->g->kind, j->id, j->created, j->model, choices,
						  &u);
	s->tokens_out += u.generated_tokens;
	if (body)
		respond(c, 200, "application/json", NULL, body, strlen(body));
	else
		conn_close(c);
	free(body);
}

/* The log probabilities the loop holds for a stream, as the next chunk's
 * "logprobs" (NULL: null, when none were asked for or none wait). */
static json_t *job_lp_take(struct job *j)
{
	json_t *lp;

	if (!j->g->logprobs || !j->lpo.n)
		return NULL;
	lp = http_logprobs_json(j->g->kind, j->lpo.p, j->lpo.n, &j->lp_off);
	j->lpo.n = 0;
	return lp;
}

/* Moves what the reader thread collected to the loop's (s->mu held). */
static bool job_lp_move(struct job *j)
{
	struct http_lpbuf *a = &j->lpo, *b = &j->lp;

	if (!b->n)
		return true;
	if (!a->n) { /* the common case: swap, no copy */
		struct http_lpbuf t = *a;
		*a = *b;
		*b = t;
		b->n = 0;
		return true;
	}
	/* entries waiting for text: bounded like the reader's */
	if (http_lpbuf_append(a, b->p, b->n))
		return false;
	b->n = 0;
	return true;
}

static void finish_stream(struct job *j, struct conn *c, bool overflow, int status)
{
	struct srv *s = j->s;

	count(s, c->route, overflow || status ? 500 : 200, c->t0_ns);
	if (overflow || status) {
		struct http_err e;
		if (overflow) {
			http_fail(&e, 400, NULL, "slow_reader",
				  "the client read too slowly: more than %u bytes were waiting; the "
				  "request was cancelled", JOB_STREAM_MAX);
			s->slow_cancels++;
		} else {
			gpud_err(&e, status, j->msg);
		}
		if (sse_json(c, http_error_json(&e)))
			return;
	} else {
		s->tokens_out += j->usage.generated_tokens;
		if (sse_json(c, http_chunk_json(j->g->kind, j->id, j->created, j->model, "", 0, NULL,
						0, false, http_finish_reason(j->usage.stop_reason),
						job_lp_take(j), NULL)))
			return;
		if (j->g->include_usage &&
		    sse_json(c, http_chunk_json(j->g->kind, j->id, j->created, j->model, "", 0, NULL,
						0, false, NULL, NULL, &j->usage)))
			return;
	}
	stream_end(c);
}

/* Moves what the reader thread delivered into the response. Sets
 * j->finished once the response is complete (or the job may go). */
static void job_pump_inner(struct job *j)
{
	struct srv *s = j->s;
	struct conn *c = j->c;
	size_t n = 0;
	bool done, overflow;
	int status;


	if (!c) {
		pthread_mutex_lock(&s->mu);
		j->finished = job_all_done(j) && !j->queued;
		pthread_mutex_unlock(&s->mu);
		return;
	}
	/* Hold text back while the socket has unsent bytes beyond the bound;
	 * on_written pumps again. */
	if (j->g->stream && j->headers_sent &&
	    uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > CONN_WQ_MAX)
		return;
	pthread_mutex_lock(&s->mu);
	done = job_all_done(j);
	overflow = j->overflow;
	status = j->status;
	if (j->g->stream && j->len) {
		char *t = j->out;
		size_t tc = j->out_cap;
		n = j->len;
		j->out = j->buf;
		j->out_cap = j->cap;
		j->buf = t;
		j->cap = tc;
		j->len = 0;
	}
	if (j->g->stream && !job_lp_move(j))
		j->overflow = overflow = true; /* over the bound or out of memory:
						* an error at the end */
	pthread_mutex_unlock(&s->mu);

	if (!j->g->stream) {
		if (!done) {
			/* the whole answer collects in j->buf until DONE; a
			 * choice that failed fails them all: stop the others */
			if (j->n_kids && job_failed(j))
				job_cancel(j);
			return;
		}
		j->finished = true;
		c->job = NULL;
		finish_whole(j, c);
		return;
	}
	if (!j->headers_sent) {
		/* An error before anything was sent is a plain error reply. */
		if (done && (status || overflow) && !n) {
			struct http_err e;
			j->finished = true;
			c->job = NULL;
			gpud_err(&e, status, j->msg);
			respond_err(c, &e, e.status == 429 ? "Retry-After: 1\r\n" : NULL);
			return;
		}
		if (!n && !done)
			return;
		c->chunked_out = c->head.minor == 1;
		if (!c->chunked_out)
			c->keep_alive = false;
		j->headers_sent = true;
		if (conn_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
				"Cache-Control: no-cache\r\n%s%s\r\n",
				c->chunked_out ? "Transfer-Encoding: chunked\r\n" : "",
				c->keep_alive ? "" : "Connection: close\r\n"))
			return;
		if (j->g->kind == HTTP_CHAT &&
		    sse_json(c, http_chunk_json(HTTP_CHAT, j->id, j->created, j->model, "", 0, NULL,
						0, true, NULL, NULL, NULL)))
			return;
	}
	/* the piece sorted into reasoning and content (at the end, with what
	 * the splitter kept back); nothing new, nothing to send */
	j->rsn.n = j->cnt.n = 0;
	if ((n || done) && !job_sort(j, j->out, n, done)) {
		j->finished = true;
		c->job = NULL;
		conn_close(c);
		return;
	}
	if ((j->rsn.n || j->cnt.n) &&
	    sse_json(c, http_chunk_json(j->g->kind, j->id, j->created, j->model, j->cnt.p,
					j->cnt.n, j->rsn.p, j->rsn.n, false, NULL, job_lp_take(j),
					NULL)))
		return;
	if (!done)
		return;
	j->finished = true;
	c->job = NULL;
	finish_stream(j, c, overflow, status && status != SW_ECANCELED ? status : 0);
}

static void job_pump(struct job *j)
{
	j->in_pump = true;
	job_pump_inner(j);
	j->in_pump = false;
	if (!j->finished && !j->c) {
		/* the connection closed under us */
		pthread_mutex_lock(&j->s->mu);
		j->finished = job_all_done(j) && !j->queued;
		pthread_mutex_unlock(&j->s->mu);
	}
	if (j->finished) {
		/* DONE may have queued it again while we pumped: then on_wake
		 * frees it when it takes it off the list. */
		pthread_mutex_lock(&j->s->mu);
		bool queued = j->queued;
		pthread_mutex_unlock(&j->s->mu);
		if (!queued)
			job_free(j);
	}
}

static void on_wake(uv_async_t *a)
{
	struct srv *s = a->data;

	/* One at a time: the reader thread may queue a job again (its
	 * next pointer) as soon as it is off the list. */
	for (;;) {
		pthread_mutex_lock(&s->mu);
		struct job *j = s->ready;
		if (j) {
			s->ready = j->next;
			j->queued = false;
		}
		pthread_mutex_unlock(&s->mu);
		if (!j)
			break;
		if (j->finished)
			job_free(j); /* finished while it was queued */
		else
			job_pump(j);
	}
}

/* Whether model is the one served; otherwise c gets the 404. */
static bool model_served(struct conn *c, const char *model)
{
	struct http_err e;

	if (strcmp(model, c->s->model_id) == 0)
		return true;
	http_fail(&e, 404, "model", "model_not_found",
		  "model \"%.100s\" does not exist (this server serves \"%s\")", model,
		  c->s->model_id);
	respond_err(c, &e, NULL);
	return false;
}

/* Choices 1..n-1 of a lead already submitted: each its own gpud request,
 * the lead's with seed + index. One that cannot start ends at once with
 * its error (out of memory: the lead's oom), and the others are
 * cancelled: the answer is that error. */
static void start_choices(struct job *j)
{
	struct srv *s = j->s;
	struct proto_client_events ev = { on_tokens, on_done, NULL };
	char err[SW_ERR_MAX];
	int rc = 0;

	j->kids = calloc(j->g->n - 1, sizeof(*j->kids));
	j->oom = !j->kids;
	for (uint32_t i = 1; !j->oom && !rc && i < j->g->n; i++) {
		struct job *k = calloc(1, sizeof(*k));
		if (!k) {
			j->oom = true;
			break;
		}
		k->s = s;
		k->lead = j;
		k->g = j->g;
		k->max = JOB_WHOLE_MAX;
		k->lp.max = k->lpo.max = JOB_LP_FACTOR * k->max;
		k->think = j->think; /* as the lead's starts: nothing fed yet */
		k->kreq = j->g->req;
		k->kreq.sampling.seed = j->g->req.sampling.seed + i;
		ev.arg = k;
		j->kids[j->n_kids++] = k;
		rc = proto_client_submit(s->gen, &k->kreq, &ev, &k->rid, err, sizeof(err));
		if (rc) {
			k->cancel_sent = true; /* nothing in gpud to cancel */
			pthread_mutex_lock(&s->mu);
			k->done = true;
			k->status = rc;
			snprintf(k->msg, sizeof(k->msg), "%.*s", (int)sizeof(k->msg) - 1, err);
			pthread_mutex_unlock(&s->mu);
		}
	}
	if (j->oom || rc)
		job_cancel(j);
}

static void start_generation(struct conn *c, enum http_kind kind)
{
	struct srv *s = c->s;
	const char *body = c->in + c->head_len;
	size_t blen = c->head.content_length;
	struct proto_client_events ev = { on_tokens, on_done, NULL };
	struct http_err e;
	char err[SW_ERR_MAX];
	struct job *j = calloc(1, sizeof(*j));
	int rc;

	if (j)
		j->g = calloc(1, sizeof(*j->g));
	if (!j || !j->g) {
		free(j);
		fail_conn(c, 503, NULL, "out_of_memory", "out of memory");
		return;
	}
	if (http_gen_decode(kind, body, blen, s->cfg->gpud.max_segments, j->g, &e)) {
		free(j->g);
		free(j);
		respond_err(c, &e, NULL);
		return;
	}
	if (!model_served(c, j->g->model)) {
		job_free(j);
		return;
	}
	if (!s->gen || !proto_client_alive(s->gen)) {
		job_free(j);
		fail_conn(c, 503, NULL, "gpud_unavailable", "gpud is not available; retry later");
		return;
	}
	j->s = s;
	j->c = c;
	j->max = j->g->stream ? JOB_STREAM_MAX : JOB_WHOLE_MAX;
	j->lp.max = j->lpo.max = JOB_LP_FACTOR * j->max;
	j->created = (long)time(NULL);
	snprintf(j->model, sizeof(j->model), "%s", s->model_id);
	/* chat: a reasoning model's <think> text apart from its answer, unless
	 * asked not to; opened when gpud's format ends the prompt inside one */
	http_think_init(&j->think, kind == HTTP_CHAT && !j->g->no_reasoning && s->think_opened,
			kind == HTTP_CHAT && !j->g->no_reasoning);
	ev.arg = j;
	c->job = j;
	rc = proto_client_submit(s->gen, &j->g->req, &ev, &j->rid, err, sizeof(err));
	snprintf(j->id, sizeof(j->id), "%s-%016" PRIx64 "%08" PRIx64,
		 kind == HTTP_CHAT ? "chatcmpl" : "cmpl", now_ns(), j->rid);
	if (rc) {
		c->job = NULL;
		job_free(j);
		gpud_err(&e, rc, err);
		respond_err(c, &e, e.status == 429 ? "Retry-After: 1\r\n" : NULL);
		return;
	}
	/* on_done will come (perhaps it already queued the job); the loop
	 * pumps it only after we return, when its choices are all here */
	if (j->g->n > 1)
		start_choices(j);
}

/* ---- blocking calls on worker threads (embed, stats, metrics) ---------- */

struct work {
	uv_work_t w;
	struct conn *c;                 /* NULL once the client left */
	struct srv *s;
	struct proto_client *pc;
	enum route route;
	struct http_embed x;
	struct http_tok t;
	struct http_detok dt;
	int status;                     /* HTTP status */
	char *body;                     /* response (malloc'd) */
	const char *ctype;
	struct http_err e;
	char extra[64];
};

static void work_done(uv_work_t *w, int status);

/* A worker's JSON answer (o: the reference is taken; NULL when it could
 * not be made): 200 with its compact text, or 503 out of memory. */
static void work_reply(struct work *k, json_t *o, size_t flags)
{
	k->body = o ? json_dumps(o, JSON_COMPACT | flags) : NULL;
	json_decref(o);
	if (!k->body) {
		http_fail(&k->e, 503, NULL, "out_of_memory", "out of memory");
		k->status = 503;
		return;
	}
	k->status = 200;
	k->ctype = "application/json";
}

static void embed_work(uv_work_t *w)
{
	struct work *k = (struct work *)w;
	char err[SW_ERR_MAX];
	json_t *data = json_array();
	uint64_t prompt_tokens = 0;

	for (uint32_t i = 0; data && i < k->x.n; i++) {
		float *vec = NULL;
		uint32_t dim = 0;
		int rc = proto_client_embed(k->pc, k->x.text[i], k->x.len[i], &vec, &dim, err,
					    sizeof(err));
		if (rc) {
			gpud_err(&k->e, rc, err);
			k->status = k->e.status;
			json_decref(data);
			return;
		}
		json_t *emb;
		if (k->x.base64) {
			char *b = malloc(4 * ((size_t)dim * 4 / 3 + 2) + 1);
			uint8_t *le = malloc((size_t)dim * 4 + 1);
			for (uint32_t d = 0; b && le && d < dim; d++)
				proto_putf32(le + 4 * d, vec[d]);
			emb = b && le ? (http_base64(le, (size_t)dim * 4, b), json_string(b)) : NULL;
			free(b);
			free(le);
		} else {
			emb = json_array();
			for (uint32_t d = 0; emb && d < dim; d++)
				json_array_append_new(emb, json_real(vec[d]));
		}
		free(vec);
		/* gpud's EMBED reply carries no token count: count them. */
		int32_t *ids = NULL;
		uint32_t nids = 0;
		if (!proto_client_tokenize(k->pc, k->x.text[i], k->x.len[i], PROTO_TOK_ADD_BOS, &ids,
					   &nids, err, sizeof(err)))
			prompt_tokens += nids;
		free(ids);
		if (!emb || json_array_append_new(data, json_pack("{s:s, s:i, s:o}", "object",
								  "embedding", "index", (int)i,
								  "embedding", emb))) {
			json_decref(data);
			data = NULL;
		}
	}
	json_t *o = data ? json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data",
				     data, "model", k->s->model_id, "usage", "prompt_tokens",
				     (json_int_t)prompt_tokens, "total_tokens",
				     (json_int_t)prompt_tokens) : NULL;
	work_reply(k, o, JSON_REAL_PRECISION(9));
}

static void health_work(uv_work_t *w)
{
	struct work *k = (struct work *)w;
	char err[SW_ERR_MAX], *json = NULL;
	int rc = proto_client_stats(k->pc, &json, err, sizeof(err));

	free(json);
	if (rc) {
		http_fail(&k->e, 503, NULL, "gpud_unavailable", "gpud does not answer: %s", err);
		k->status = 503;
		return;
	}
	k->body = strdup("{\"status\":\"ok\"}");
	k->status = k->body ? 200 : 500;
	k->ctype = "application/json";
}

/* gpud's own Prometheus text from gpud.metrics ("127.0.0.1:PORT" or
 * "unix:/path"), bounded; NULL when off or unreachable. */
static char *fetch_gpud_metrics(const char *where)
{
	int fd = -1;
	char *buf = NULL;
	size_t len = 0, cap = 1u << 20;
	struct timeval tv = { 2, 0 };

	if (!where[0])
		return NULL;
	if (strncmp(where, "unix:", 5) == 0) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", where + 5);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			goto fail;
	} else {
		struct sockaddr_in sa = { .sin_family = AF_INET };
		sa.sin_addr.s_addr = htonl(0x7f000001);
		sa.sin_port = htons((uint16_t)atoi(strchr(where, ':') + 1));
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			goto fail;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	if (write(fd, req, sizeof(req) - 1) != (ssize_t)sizeof(req) - 1)
		goto fail;
	buf = malloc(cap + 1);
	if (!buf)
		goto fail;
	for (;;) {
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0)
			goto fail;
		if (r == 0 || len + (size_t)r == cap) {
			len += (size_t)r;
			break;
		}
		len += (size_t)r;
	}
	buf[len] = '\0';
	close(fd);
	char *body = strstr(buf, "\r\n\r\n");
	if (!body || strncmp(buf, "HTTP/1.", 7) || strncmp(buf + 9, "200", 3)) {
		free(buf);
		return NULL;
	}
	memmove(buf, body + 4, strlen(body + 4) + 1);
	return buf;
fail:
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

/* The snapshot of our counters the worker renders (taken on the loop). */
struct msnap {
	uint64_t requests[R_N][6];
	uint64_t lat_bucket[R_N][N_BUCKETS + 1];
	double lat_sum[R_N];
	uint64_t lat_count[R_N];
	uint64_t refused_conns, slow_cancels, disconnect_cancels, tokens_out;
	uint32_t n_conns;
	int gpud_up;
};

static struct msnap g_snap; /* written on the loop, read by one worker at a time */
static pthread_mutex_t g_snap_mu = PTHREAD_MUTEX_INITIALIZER;

static void metrics_work(uv_work_t *w)
{
	struct work *k = (struct work *)w;
	static const char *const cls[6] = { "2xx", "4xx", "429", "5xx", "503", "other" };
	char *gm = fetch_gpud_metrics(k->s->cfg->gpud.metrics);
	size_t cap = (gm ? strlen(gm) : 0) + 64 * 1024, n = 0;
	char *out = malloc(cap);
	struct msnap m;

	pthread_mutex_lock(&g_snap_mu);
	m = g_snap;
	pthread_mutex_unlock(&g_snap_mu);
	if (!out) {
		free(gm);
		k->status = 500;
		http_fail(&k->e, 500, NULL, NULL, "out of memory");
		return;
	}
#define P(...) (n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__))
	if (gm)
		P("%s", gm);
	else
		P("# gpud's own metrics: set gpud.metrics to have them here\n");
	free(gm);
	P("# HELP gpud_http_requests_total HTTP requests answered, by route and status class.\n"
	  "# TYPE gpud_http_requests_total counter\n");
	for (int r = 0; r < R_N; r++)
		for (int c = 0; c < 5; c++)
			P("gpud_http_requests_total{route=\"%s\",status=\"%s\"} %" PRIu64 "\n",
			  route_name[r], cls[c], m.requests[r][c]);
	P("# HELP gpud_http_request_seconds Time from a request's head to its response's end.\n"
	  "# TYPE gpud_http_request_seconds histogram\n");
	for (int r = 0; r < R_N; r++) {
		uint64_t cum = 0;
		for (int b = 0; b <= N_BUCKETS; b++) {
			cum += m.lat_bucket[r][b];
			if (b < N_BUCKETS)
				P("gpud_http_request_seconds_bucket{route=\"%s\",le=\"%g\"} %" PRIu64 "\n",
				  route_name[r], bucket_s[b], cum);
			else
				P("gpud_http_request_seconds_bucket{route=\"%s\",le=\"+Inf\"} %" PRIu64
				  "\n", route_name[r], cum);
		}
		P("gpud_http_request_seconds_sum{route=\"%s\"} %.6f\n", route_name[r], m.lat_sum[r]);
		P("gpud_http_request_seconds_count{route=\"%s\"} %" PRIu64 "\n", route_name[r],
		  m.lat_count[r]);
	}
	P("# TYPE gpud_http_connections gauge\ngpud_http_connections %u\n", m.n_conns);
	P("# TYPE gpud_http_connections_refused_total counter\n"
	  "gpud_http_connections_refused_total %" PRIu64 "\n", m.refused_conns);
	P("# TYPE gpud_http_slow_reader_cancels_total counter\n"
	  "gpud_http_slow_reader_cancels_total %" PRIu64 "\n", m.slow_cancels);
	P("# TYPE gpud_http_disconnect_cancels_total counter\n"
	  "gpud_http_disconnect_cancels_total %" PRIu64 "\n", m.disconnect_cancels);
	P("# TYPE gpud_http_completion_tokens_total counter\n"
	  "gpud_http_completion_tokens_total %" PRIu64 "\n", m.tokens_out);
	P("# TYPE gpud_http_gpud_up gauge\ngpud_http_gpud_up %d\n", m.gpud_up);
#undef P
	if (n >= cap)
		n = cap - 1;
	out[n] = '\0';
	k->body = out;
	k->status = 200;
	k->ctype = "text/plain; version=0.0.4";
}

/* gpud's ids for a text: {"tokens": [...], "count": n}. */
static void tokenize_work(uv_work_t *w)
{
	struct work *k = (struct work *)w;
	char err[SW_ERR_MAX];
	int32_t *ids = NULL;
	uint32_t n = 0;
	int rc = proto_client_tokenize(k->pc, k->t.text, k->t.len,
				       k->t.add_special ? PROTO_TOK_ADD_BOS : 0, &ids, &n, err,
				       sizeof(err));
	json_t *a = rc ? NULL : json_array();

	if (rc) {
		gpud_err(&k->e, rc, err);
		k->status = k->e.status;
		return;
	}
	for (uint32_t i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_integer(ids[i]))) {
			json_decref(a);
			a = NULL;
		}
	free(ids);
	work_reply(k, a ? json_pack("{s:o, s:I}", "tokens", a, "count", (json_int_t)n) : NULL, 0);
}

/* gpud's text for ids: {"prompt": text, "content": text} (vLLM's name
 * and llama.cpp's). */
static void detokenize_work(uv_work_t *w)
{
	struct work *k = (struct work *)w;
	char err[SW_ERR_MAX], *text = NULL;
	size_t len = 0;
	int rc = proto_client_detokenize(k->pc, k->dt.ids, k->dt.n,
					 k->dt.special ? PROTO_DETOK_SPECIAL : 0, &text, &len, err,
					 sizeof(err));

	if (rc) {
		gpud_err(&k->e, rc, err);
		k->status = k->e.status;
		return;
	}
	json_t *o = json_pack("{s:s%, s:s%}", "prompt", text, len, "content", text, len);
	free(text);
	work_reply(k, o, 0);
}

/* Frees what a work item's decoded request holds. */
static void work_free_req(struct work *k)
{
	http_embed_free(&k->x);
	http_tok_free(&k->t);
	http_detok_free(&k->dt);
}

/* Runs fn on a worker thread for c; req (or NULL) carries the decoded
 * request in its x, t or dt, owned from here on. */
static void start_work(struct conn *c, enum route r, uv_work_cb fn, struct work *req)
{
	struct srv *s = c->s;
	struct work *k = calloc(1, sizeof(*k));

	if (!k) {
		if (req)
			work_free_req(req);
		fail_conn(c, 503, NULL, "out_of_memory", "out of memory");
		return;
	}
	if (req) {
		k->x = req->x;
		k->t = req->t;
		k->dt = req->dt;
	}
	k->c = c;
	k->s = s;
	k->route = r;
	if (fn != metrics_work) {
		if (!s->blk || !proto_client_alive(s->blk)) {
			work_free_req(k);
			free(k);
			fail_conn(c, 503, NULL, "gpud_unavailable", "gpud is not available; retry later");
			return;
		}
		k->pc = s->blk;
		s->blk_users++;
	} else {
		pthread_mutex_lock(&g_snap_mu);
		memcpy(g_snap.requests, s->requests, sizeof(s->requests));
		memcpy(g_snap.lat_bucket, s->lat_bucket, sizeof(s->lat_bucket));
		memcpy(g_snap.lat_sum, s->lat_sum, sizeof(s->lat_sum));
		memcpy(g_snap.lat_count, s->lat_count, sizeof(s->lat_count));
		g_snap.refused_conns = s->refused_conns;
		g_snap.slow_cancels = s->slow_cancels;
		g_snap.disconnect_cancels = s->disconnect_cancels;
		g_snap.tokens_out = s->tokens_out;
		g_snap.n_conns = s->n_conns;
		g_snap.gpud_up = s->gen && proto_client_alive(s->gen);
		pthread_mutex_unlock(&g_snap_mu);
	}
	c->pending_work++;
	if (uv_queue_work(&s->loop, &k->w, fn, work_done)) {
		c->pending_work--;
		if (k->pc)
			s->blk_users--;
		work_free_req(k);
		free(k);
		fail_conn(c, 503, NULL, NULL, "cannot queue the request");
	}
}

static void work_done(uv_work_t *w, int status)
{
	struct work *k = (struct work *)w;
	struct conn *c = k->c;

	(void)status;
	if (k->pc)
		k->s->blk_users--;
	work_free_req(k);
	c->pending_work--;
	if (c->state == C_CLOSING) {
		if (c->pending_work == 0 && !uv_is_closing((uv_handle_t *)&c->tcp)) {
			if (c->prev || c->next || c->s->conns == c) {
				conn_close(c); /* finishes the close deferred for us */
			} else {
				uv_timer_stop(&c->timer); /* taken out of the list at SIGTERM */
				uv_close((uv_handle_t *)&c->tcp, on_closed);
			}
		}
	} else if (k->status == 200) {
		respond(c, 200, k->ctype, NULL, k->body, strlen(k->body));
	} else {
		respond_err(c, &k->e, k->e.status == 429 ? "Retry-After: 1\r\n" : NULL);
	}
	free(k->body);
	free(k);
}

/* ---- requests ------------------------------------------------------------ */

static void models(struct conn *c)
{
	char body[512];
	int n = snprintf(body, sizeof(body),
			 "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
			 "\"created\":0,\"owned_by\":\"swarm\"}]}", c->s->model_id);
	respond(c, 200, "application/json", NULL, body, (size_t)n);
}

static void dispatch(struct conn *c)
{
	struct srv *s = c->s;
	struct http_head *h = &c->head;
	bool post = strcmp(h->method, "POST") == 0, get = strcmp(h->method, "GET") == 0;
	enum route r = R_OTHER;

	if (http_path_is(h, "/v1/chat/completions"))
		r = R_CHAT;
	else if (http_path_is(h, "/v1/completions"))
		r = R_COMPLETIONS;
	else if (http_path_is(h, "/v1/embeddings"))
		r = R_EMBEDDINGS;
	else if (http_path_is(h, "/tokenize") || http_path_is(h, "/v1/tokenize"))
		r = R_TOKENIZE;
	else if (http_path_is(h, "/detokenize") || http_path_is(h, "/v1/detokenize"))
		r = R_DETOKENIZE;
	else if (http_path_is(h, "/v1/models"))
		r = R_MODELS;
	else if (http_path_is(h, "/health"))
		r = R_HEALTH;
	else if (http_path_is(h, "/metrics"))
		r = R_METRICS;
	c->route = r;
	if (r == R_OTHER) {
		fail_conn(c, 404, NULL, "unknown_url", "unknown path %.*s %.*s", 16, h->method,
			  (int)(h->path_len > 200 ? 200 : h->path_len), h->path);
		return;
	}
	if (r != R_HEALTH && s->keys && !http_keys_check(s->keys, h->auth, h->auth_len)) {
		fail_conn(c, 401, NULL, "invalid_api_key",
			  h->auth ? "invalid API key" : "missing API key: send Authorization: Bearer KEY");
		return;
	}
	bool want_post = r == R_CHAT || r == R_COMPLETIONS || r == R_EMBEDDINGS ||
			 r == R_TOKENIZE || r == R_DETOKENIZE;
	if ((want_post && !post) || (!want_post && !get)) {
		c->keep_alive = c->keep_alive && !h->has_length;
		fail_conn(c, 405, NULL, "method_not_allowed", "%s is not allowed on this path (%s)",
			  h->method, want_post ? "POST" : "GET");
		return;
	}
	switch (r) {
	case R_CHAT:
		start_generation(c, HTTP_CHAT);
		break;
	case R_COMPLETIONS:
		start_generation(c, HTTP_COMPLETION);
		break;
	case R_EMBEDDINGS: {
		struct http_embed x;
		struct http_err e;
		if (http_embed_decode(c->in + c->head_len, h->content_length, &x, &e)) {
			respond_err(c, &e, NULL);
			return;
		}
		if (!model_served(c, x.model)) {
			http_embed_free(&x);
			return;
		}
		start_work(c, r, embed_work, &(struct work){ .x = x });
		break;
	}
	case R_TOKENIZE: {
		struct http_tok t;
		struct http_err e;
		if (http_tok_decode(c->in + c->head_len, h->content_length, &t, &e)) {
			respond_err(c, &e, NULL);
			return;
		}
		if (t.model && !model_served(c, t.model)) {
			http_tok_free(&t);
			return;
		}
		start_work(c, r, tokenize_work, &(struct work){ .t = t });
		break;
	}
	case R_DETOKENIZE: {
		struct http_detok dt;
		struct http_err e;
		if (http_detok_decode(c->in + c->head_len, h->content_length, &dt, &e)) {
			respond_err(c, &e, NULL);
			return;
		}
		if (dt.model && !model_served(c, dt.model)) {
			http_detok_free(&dt);
			return;
		}
		start_work(c, r, detokenize_work, &(struct work){ .dt = dt });
		break;
	}
	case R_MODELS:
		models(c);
		break;
	case R_HEALTH:
		start_work(c, r, health_work, NULL);
		break;
	case R_METRICS:
		start_work(c, r, metrics_work, NULL);
		break;
	default:
		break;
	}
}

static void on_timer(uv_timer_t *t);

/* Looks at the buffer: a complete request is dispatched. */
static void conn_parse(struct conn *c)
{
	struct srv *s = c->s;
	int st;
	const char *why;

	if (c->state == C_HEAD) {
		if (!c->in_len)
			return;
		long hl = http_parse_head(c->in, c->in_len, &c->head, &st, &why);
		if (hl < 0) {
			c->keep_alive = false;
			c->route = R_OTHER;
			c->t0_ns = now_ns();
			fail_conn(c, st, NULL, "bad_request", "%s", why);
			return;
		}
		if (hl == 0) {
			if (c->in_len >= HEAD_MAX) {
				c->keep_alive = false;
				c->route = R_OTHER;
				c->t0_ns = now_ns();
				fail_conn(c, 431, NULL, "headers_too_large",
					  "the request head exceeds %u bytes", HEAD_MAX);
			}
			return;
		}
		c->head_len = hl;
		c->keep_alive = c->head.keep_alive;
		c->t0_ns = now_ns();
		if (c->head.content_length > s->cfg->http.max_body_bytes) {
			c->keep_alive = false;
			c->route = R_OTHER;
			fail_conn(c, 413, NULL, "request_too_large",
				  "the body (%" PRIu64 " bytes) exceeds http.max_body_bytes (%" PRIu64 ")",
				  c->head.content_length, s->cfg->http.max_body_bytes);
			return;
		}
		bool post = strcmp(c->head.method, "POST") == 0;
		if (post && !c->head.has_length) {
			c->keep_alive = false;
			c->route = R_OTHER;
			fail_conn(c, 411, NULL, "length_required", "a POST needs Content-Length");
			return;
		}
		c->req_len = (size_t)hl + c->head.content_length;
		/* room for the body and a little more: reading goes on while the
		 * request runs, so a client's EOF is seen (and its request
		 * cancelled); a pipelined request waits in the spare room */
		if (c->req_len + 4096 > c->in_cap) {
			size_t po = (size_t)(c->head.path - c->in);
			size_t ao = c->head.auth ? (size_t)(c->head.auth - c->in) : 0;
			char *nb = realloc(c->in, c->req_len + 4096);
			if (!nb) {
				conn_close(c);
				return;
			}
			/* the head's views move with the buffer */
			c->head.path = nb + po;
			if (c->head.auth)
				c->head.auth = nb + ao;
			c->in = nb;
			c->in_cap = c->req_len + 4096;
		}
		c->state = C_BODY;
		if (c->head.expect_continue && c->in_len < c->req_len &&
		    conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25))
			return;
	}
	if (c->state == C_BODY && c->in_len >= c->req_len) {
		c->state = C_BUSY;
		uv_timer_stop(&c->timer);
		dispatch(c);
	}
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b);

static void on_linger_timer(uv_timer_t *t)
{
	conn_close(t->data);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
	struct conn *c = req->data;

	(void)status;
	if (uv_is_closing((uv_handle_t *)&c->tcp))
		return;
	/* Read and drop what the client still sends for a moment, so that
	 * closing with unread bytes does not reset the connection before the
	 * client has read our answer (a 413 sent before its body). */
	c->draining = true;
	c->in_len = 0;
	if (!c->reading) {
		c->reading = true;
		uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
	}
	uv_timer_start(&c->timer, on_linger_timer, 1000, 0);
}

/* Closes after the queued writes: shutdown, a short drain, close. */
static void conn_linger(struct conn *c)
{
	if (c->state == C_CLOSING)
		return;
	if (c->job) {
		job_detach(c->job);
		c->job = NULL;
	}
	c->state = C_CLOSING;
	uv_timer_stop(&c->timer);
	c->sreq.data = c;
	if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown))
		conn_close(c);
}

/* The response is out: next request or close. */
static void conn_next(struct conn *c)
{
	if (c->state == C_CLOSING)
		return;
	if (!c->keep_alive || c->s->stopping) {
		conn_linger(c);
		return;
	}
	memmove(c->in, c->in + c->req_len, c->in_len - c->req_len);
	c->in_len -= c->req_len;
	c->req_len = 0;
	c->head_len = 0;
	c->state = C_HEAD;
	if (c->in_cap > HEAD_MAX && c->in_len <= HEAD_MAX) {
		char *nb = realloc(c->in, HEAD_MAX);
		if (nb) {
			c->in = nb;
			c->in_cap = HEAD_MAX;
		}
	}
	uv_timer_start(&c->timer, on_timer,
		       c->in_len ? c->s->cfg->http.header_timeout_ms : c->s->cfg->http.idle_timeout_ms,
		       0);
	if (!c->reading) {
		c->reading = true;
		uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
	}
	conn_parse(c);
}

static void on_closed(uv_handle_t *h)
{
	struct conn *c = h->data;

	if (h == (uv_handle_t *)&c->tcp) {
		uv_close((uv_handle_t *)&c->timer, on_closed);
		return;
	}
	free(c->in);
	free(c);
}

static void conn_close(struct conn *c)
{
	struct srv *s = c->s;

	if (c->job) {
		job_detach(c->job);
		c->job = NULL;
	}
	if (uv_is_closing((uv_handle_t *)&c->tcp))
		return;
	c->state = C_CLOSING;
	if (c->pending_work)
		return; /* work_done calls us again */
	if (c->prev)
		c->prev->next = c->next;
	else if (s->conns == c)
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	s->n_conns--;
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
	struct conn *c = h->data;

	(void)hint;
	if (c->draining)
		c->in_len = 0;
	if (c->state == C_HEAD && c->in_cap < HEAD_MAX) {
		char *nb = realloc(c->in, HEAD_MAX);
		if (nb) {
			c->in = nb;
			c->in_cap = HEAD_MAX;
		}
	}
	if (c->in_len >= c->in_cap) {
		*b = uv_buf_init(NULL, 0); /* full: on_read gets UV_ENOBUFS */
		return;
	}
	*b = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
	struct conn *c = st->data;

	(void)b;
	if (n == UV_ENOBUFS) {
		/* a pipelined request filled the buffer: wait for this one */
		uv_read_stop(st);
		c->reading = false;
		return;
	}
	if (c->draining) {
		if (n < 0)
			conn_close(c);
		return;
	}
	if (n < 0) {
		/* EOF or error: the client is gone; a request in flight is
		 * cancelled in gpud by conn_close. */
		conn_close(c);
		return;
	}
	if (n == 0)
		return;
	if (c->state == C_CLOSING)
		return;
	bool first = c->in_len == 0 && c->state == C_HEAD;
	c->in_len += (size_t)n;
	if (first)
		uv_timer_start(&c->timer, on_timer, c->s->cfg->http.header_timeout_ms, 0);
	if (c->state == C_HEAD || c->state == C_BODY)
		conn_parse(c);
}

static void on_timer(uv_timer_t *t)
{
	struct conn *c = t->data;

	if (c->state == C_HEAD && c->in_len == 0) {
		conn_close(c); /* idle keep-alive connection */
		return;
	}
	if (c->state == C_HEAD || c->state == C_BODY) {
		c->keep_alive = false;
		c->route = R_OTHER;
		c->t0_ns = now_ns();
		fail_conn(c, 408, NULL, "request_timeout",
			  "the request did not arrive within http.header_timeout_ms (%u ms)",
			  c->s->cfg->http.header_timeout_ms);
	}
}

static void on_connection(uv_stream_t *l, int status)
{
	struct srv *s = l->data;
	struct conn *c;

	if (status < 0) {
		log_warn("accept: %s", uv_strerror(status));
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return;
	c->s = s;
	uv_tcp_init(&s->loop, &c->tcp);
	uv_timer_init(&s->loop, &c->timer);
	c->tcp.data = c->timer.data = c;
	if (uv_accept(l, (uv_stream_t *)&c->tcp)) {
		c->state = C_CLOSING;
		uv_close((uv_handle_t *)&c->tcp, on_closed);
		return;
	}
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	uv_tcp_nodelay(&c->tcp, 1);
	if (s->n_conns > s->cfg->http.max_connections) {
		s->refused_conns++;
		c->keep_alive = false;
		c->route = R_OTHER;
		c->t0_ns = now_ns();
		fail_conn(c, 503, NULL, "too_many_connections",
			  "the server has http.max_connections (%u) connections open; retry later",
			  s->cfg->http.max_connections);
		return;
	}
	c->reading = true;
	uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
	uv_timer_start(&c->timer, on_timer, s->cfg->http.idle_timeout_ms, 0);
}

/* ---- gpud connections ---------------------------------------------------- */

struct connect_work {
	uv_work_t w;
	struct srv *s;
	struct proto_client *gen, *blk;
	bool think_opened;
	char err[SW_ERR_MAX];
};

static void connect_run(uv_work_t *w)
{
	struct connect_work *k = (struct connect_work *)w;
	struct proto_client_opts o;
	int rc;

	proto_client_opts_default(&o);
	/* connect + HELLO, and later the most a submit waits on the loop for
	 * request-area room before it is a 429 */
	o.timeout_ms = GEN_TIMEOUT_MS;
	o.max_inflight = k->s->cfg->http.max_connections + 16;
	rc = proto_client_connect(&k->gen, k->s->o->socket, &o, k->err, sizeof(k->err));
	if (rc)
		return;
	o.timeout_ms = BLK_TIMEOUT_MS;
	o.max_inflight = k->s->cfg->http.max_connections + 16;
	rc = proto_client_connect(&k->blk, k->s->o->socket, &o, k->err, sizeof(k->err));
	if (rc) {
		proto_client_close(k->gen);
		k->gen = NULL;
		return;
	}
	/* gpud's chat format: one whose prompt opens a <think> (DeepSeek R1)
	 * makes every chat answer reasoning until </think> (http/think.h) */
	char *stats = NULL, err[SW_ERR_MAX];
	if (proto_client_stats(k->blk, &stats, err, sizeof(err)) == 0) {
		json_t *j = json_loads(stats, 0, NULL);
		const char *f = json_string_value(json_object_get(j, "chat_format"));
		k->think_opened = f && !strcmp(f, "deepseek-r1");
		json_decref(j);
		free(stats);
	} else {
		log_warn("gpud STATS: %s (a reasoning model's answers are split only where they "
			 "open <think>)", err);
	}
}

static void connect_done(uv_work_t *w, int status)
{
	struct connect_work *k = (struct connect_work *)w;
	struct srv *s = k->s;
	static bool warned;

	(void)status;
	s->connecting = false;
	if (s->stopping) {
		proto_client_close(k->gen);
		proto_client_close(k->blk);
	} else if (k->gen) {
		s->gen = k->gen;
		s->blk = k->blk;
		s->think_opened = k->think_opened;
		warned = false;
		log_info("connected to gpud at %s (pid %d)", s->o->socket,
			 proto_client_server_pid(s->gen));
	} else if (!warned) {
		warned = true;
		log_warn("gpud: %s; answering 503 and retrying every %d ms", k->err, RECONNECT_MS);
	}
	free(k);
}

static void on_tick(uv_timer_t *t)
{
	struct srv *s = t->data;

	if (s->stopping || s->connecting)
		return;
	if (s->gen && proto_client_alive(s->gen) && s->blk && proto_client_alive(s->blk))
		return;
	if (s->blk_users)
		return; /* workers still use blk: their calls fail fast (SW_ECLOSED) */
	if (s->gen) {
		log_warn("lost gpud at %s; reconnecting", s->o->socket);
		/* In-flight jobs end with SW_ECLOSED through on_done (called on
		 * this thread by close). */
		proto_client_close(s->gen);
		s->gen = NULL;
		on_wake(&s->wake);
	}
	proto_client_close(s->blk);
	s->blk = NULL;
	struct connect_work *k = calloc(1, sizeof(*k));
	if (!k)
		return;
	k->s = s;
	s->connecting = true;
	if (uv_queue_work(&s->loop, &k->w, connect_run, connect_done)) {
		s->connecting = false;
		free(k);
	}
}

/* ---- start and stop ------------------------------------------------------ */

static void close_walk(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

static void on_signal(uv_signal_t *sig, int signum)
{
	struct srv *s = sig->data;
	struct proto_client *g = s->gen;

	if (s->stopping)
		return;
	log_info("%s: closing connections and exiting", signum == SIGTERM ? "SIGTERM" : "SIGINT");
	s->stopping = true;
	uv_close((uv_handle_t *)&s->listener, NULL);
	uv_close((uv_handle_t *)&s->tick, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	uv_close((uv_handle_t *)&s->sigint, NULL);
	while (s->conns) {
		struct conn *c = s->conns;
		if (c->pending_work) {
			/* out of the list now; closed when its work ends */
			s->conns = c->next;
			if (s->conns)
				s->conns->prev = NULL;
			c->next = c->prev = NULL;
			s->n_conns--;
			if (c->job) {
				job_detach(c->job);
				c->job = NULL;
			}
			c->state = C_CLOSING;
			uv_read_stop((uv_stream_t *)&c->tcp);
			continue;
		}
		conn_close(c);
	}
	/* gpud cancels what this connection had in flight; the detached jobs
	 * end here (SW_ECLOSED through on_done, on this thread). */
	s->gen = NULL;
	proto_client_close(g);
	on_wake(&s->wake);
	uv_close((uv_handle_t *)&s->wake, NULL);
}

/* Resolves host:port and binds the first address that works. */
static int bind_listen(struct srv *s, const char *listen, char *err, size_t errlen)
{
	char host[SW_CONFIG_HOSTPORT_MAX], portstr[8];
	uint16_t port;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res, *ai;
	int rc;

	rc = sw_config_split_hostport(listen, host, sizeof(host), &port, err, errlen);
	if (rc)
		return sw_seterr(err, errlen, rc, "listen \"%s\": expected \"HOST:PORT\" (an IPv4 "
				 "address, [IPv6] or a host name; port 1..65535)", listen);
	snprintf(portstr, sizeof(portstr), "%u", port);
	rc = getaddrinfo(host, portstr, &hints, &res);
	if (rc)
		return sw_seterr(err, errlen, -EINVAL, "listen \"%s\": %s", listen, gai_strerror(rc));
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		enum sw_addr_class cl = sw_addr_classify(ai->ai_addr, ai->ai_addrlen);
		if (!s->keys && cl != SW_ADDR_LOOPBACK) {
			rc = sw_seterr(err, errlen, -EPERM,
				       "listen \"%s\": not a loopback address, and http.api_key_file is "
				       "not set: without keys the API may only listen on 127.0.0.1 or "
				       "[::1]", listen);
			freeaddrinfo(res);
			return rc;
		}
		uv_tcp_init(&s->loop, &s->listener);
		rc = uv_tcp_bind(&s->listener, ai->ai_addr, 0);
		if (!rc)
			rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
		if (!rc)
			break;
		sw_seterr(err, errlen, rc, "listen \"%s\": %s", listen, uv_strerror(rc));
		uv_close((uv_handle_t *)&s->listener, NULL);
		uv_run(&s->loop, UV_RUN_NOWAIT);
	}
	freeaddrinfo(res);
	if (!ai && rc == -EADDRNOTAVAIL)
		sw_seterr(err, errlen, rc, "listen \"%s\": no usable address", listen);
	return ai ? 0 : rc;
}

int http_serve(const struct http_server_opts *o, char *err, size_t errlen)
{
	struct srv *s = calloc(1, sizeof(*s));
	const char *slash;
	size_t n_keys = 0;
	int rc;

	if (!s)
		return sw_seterr(err, errlen, -ENOMEM, "out of memory");
	s->o = o;
	s->cfg = &o->cfg;
	pthread_mutex_init(&s->mu, NULL);
	/* The model's id: its file name without .gguf ("swarm" without one). */
	slash = strrchr(o->cfg.gpud.model, '/');
	snprintf(s->model_id, sizeof(s->model_id), "%.*s", (int)sizeof(s->model_id) - 1,
		 o->cfg.gpud.model[0] ? (slash ? slash + 1 : o->cfg.gpud.model) : "swarm");
	size_t ml = strlen(s->model_id);
	if (ml > 5 && strcmp(s->model_id + ml - 5, ".gguf") == 0)
		s->model_id[ml - 5] = '\0';
	if (o->cfg.http.api_key_file[0]) {
		/* root may read a file of the service's user (a unit's User=) */
		uid_t also = geteuid();
		struct passwd pw, *res = NULL;
		char pwbuf[4096];
		if (geteuid() == 0 && o->cfg.user[0] &&
		    getpwnam_r(o->cfg.user, &pw, pwbuf, sizeof(pwbuf), &res) == 0 && res)
			also = pw.pw_uid;
		rc = http_keys_load(o->cfg.http.api_key_file, also, &s->keys, &n_keys, err, errlen);
		if (rc) {
			char m[SW_ERR_MAX];
			snprintf(m, sizeof(m), "%s", err);
			sw_seterr(err, errlen, rc, "http.api_key_file: %s", m);
			goto out_free;
		}
	}
	if (!o->cfg.http.listen[0]) {
		rc = sw_seterr(err, errlen, -EINVAL,
			       "http.listen is empty (the front is off): set it or pass --listen");
		goto out_free;
	}
	uv_loop_init(&s->loop);
	rc = bind_listen(s, o->cfg.http.listen, err, errlen);
	if (rc)
		goto out_loop;
	s->listener.data = s;
	{
		bool switched;
		rc = sw_privdrop(o->cfg.user, &switched, err, errlen);
		if (rc)
			goto out_loop;
	}
	uv_async_init(&s->loop, &s->wake, on_wake);
	s->wake.data = s;
	uv_timer_init(&s->loop, &s->tick);
	s->tick.data = s;
	uv_timer_start(&s->tick, on_tick, 0, RECONNECT_MS);
	uv_signal_init(&s->loop, &s->sigterm);
	uv_signal_init(&s->loop, &s->sigint);
	s->sigterm.data = s->sigint.data = s;
	uv_signal_start(&s->sigterm, on_signal, SIGTERM);
	uv_signal_start(&s->sigint, on_signal, SIGINT);
	log_info("gpud-http listening on %s (model \"%s\", gpud %s, %s, max %u connections, "
		 "body <= %" PRIu64 " bytes)", o->cfg.http.listen, s->model_id, o->socket,
		 s->keys ? "API keys required" : "no API keys (loopback only)",
		 o->cfg.http.max_connections, o->cfg.http.max_body_bytes);

	/* Runs until the signal handler has closed every handle and the
	 * worker threads' calls have ended. */
	uv_run(&s->loop, UV_RUN_DEFAULT);
	proto_client_close(s->gen);
	proto_client_close(s->blk);
	s->gen = s->blk = NULL;
	uv_walk(&s->loop, close_walk, NULL);
	uv_run(&s->loop, UV_RUN_DEFAULT);
	rc = 0;
	log_info("gpud-http stopped");
out_loop:
	uv_loop_close(&s->loop);
out_free:
	http_keys_free(s->keys);
	pthread_mutex_destroy(&s->mu);
	free(s);
	return rc;
}
