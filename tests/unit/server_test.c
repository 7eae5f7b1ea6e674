/* server_test.c - gpud's server (gpud/server.h) against a fake service and
 * raw clients written with proto/ (frame, shm, msg), not proto/client.c.
 * Each test runs its own server on its own libuv loop thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <grp.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "common/err.h"
#include "common/time.h"
#include "gpud/alloc.h"
#include "gpud/server.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/shm.h"

#define WAIT_MS 20000 /* a test that waits longer than this has failed */

/* --- fake service -------------------------------------------------------- */

enum fake_mode {
	FAKE_STREAM,    /* n_tokens tokens then DONE */
	FAKE_HOLD,      /* park until cancelled or released */
	FAKE_STREAM_LP, /* FAKE_STREAM as TOKENS_LP, two alternatives a token
			 * (id + 1 and id + 2), the last token flagged EOG */
};

struct fake_priv { /* per request, in the slot's priv area */
	atomic_int cancelled;
	uint32_t sent;
	bool is_embed;
};

#define FAKE_MAX 1024

struct fake {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	bool stop;
	struct gpud_sreq *act[FAKE_MAX]; /* requests the worker owns */
	uint32_t n_act;
	/* settings (under mu) */
	enum fake_mode mode;
	uint32_t n_tokens;
	bool release;
	int refuse; /* nonzero: submit refuses with it */
	/* counters */
	atomic_uint submits, cancels, embeds, busy_seen, closed_seen, ended;
};

static struct fake_priv *fpriv(struct gpud_sreq *r)
{
	return gpud_sreq_priv(r);
}

static void *fake_worker(void *arg)
{
	struct fake *f = arg;
	pthread_mutex_lock(&f->mu);
	while (!f->stop) {
		bool progress = false;
		for (uint32_t i = 0; i < f->n_act;) {
			struct gpud_sreq *r = f->act[i];
			struct fake_priv *p = fpriv(r);
			bool end = false;
			if (atomic_load(&p->cancelled)) {
				gpud_sreq_error(r, SW_ECANCELED, "canceled");
				end = true;
			} else if (f->mode == FAKE_HOLD && !f->release) {
				i++;
				continue;
			} else if (p->sent < f->n_tokens) {
				int32_t id = (int32_t)p->sent;
				int rc;
				if (f->mode == FAKE_STREAM_LP) {
					const int32_t ids[3] = { id, id + 1, id + 2 };
					const float lps[3] = { -0.5f, -0.5f, -1.0f };
					const uint16_t plen[3] = { 2, 2, 1 };
					rc = gpud_sreq_tokens_lp(r, 2, ids, lps, plen, "ababc", 5, "ab",
								 2, p->sent + 1 == f->n_tokens ?
									    PROTO_LP_EOG : 0);
				} else {
					rc = gpud_sreq_tokens(r, &id, 1, "ab", 2);
				}
				if (rc == SW_EBUSY) {
					atomic_fetch_add(&f->busy_seen, 1);
					gpud_sreq_error(r, SW_EBUSY, "client is not reading its ring");
					end = true;
				} else if (rc == SW_ECLOSED) {
					atomic_fetch_add(&f->closed_seen, 1);
					gpud_sreq_error(r, SW_ECLOSED, NULL);
					end = true;
				} else {
					assert_int_equal(rc, 0);
					p->sent++;
				}
			} else {
				struct proto_done d = { .prompt_tokens = 3,
							.generated_tokens = p->sent,
							.stop_reason = 3 };
				gpud_sreq_done(r, &d);
				end = true;
			}
			progress = true;
			if (end) {
				atomic_fetch_add(&f->ended, 1);
				f->act[i] = f->act[--f->n_act];
			} else {
				i++;
			}
		}
		if (!progress) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			if (f->n_act)
				pthread_cond_timedwait(&f->cv, &f->mu, &ts);
			else
				pthread_cond_wait(&f->cv, &f->mu);
		}
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

static int fake_submit(void *svc, struct gpud_sreq *r, const struct proto_submit *req, char *err,
		       size_t errlen)
{
	struct fake *f = svc;
	/* The decoded request is usable during the call. */
	assert_true(req->req.n_segments >= 1);
	assert_non_null(req->req.segments[0].text);
	assert_non_null(fpriv(r));
	assert_int_equal(atomic_load(&fpriv(r)->cancelled), 0); /* zeroed */
	assert_true(gpud_sreq_conn_id(r) >= 1);
	assert_int_equal(gpud_sreq_peer_pid(r), getpid());
	pthread_mutex_lock(&f->mu);
	int refuse = f->refuse;
	if (!refuse) {
		assert_true(f->n_act < FAKE_MAX);
		f->act[f->n_act++] = r;
		pthread_cond_signal(&f->cv);
	}
	pthread_mutex_unlock(&f->mu);
	if (refuse)
		return sw_seterr(err, errlen, refuse, "fake refuses");
	atomic_fetch_add(&f->submits, 1);
	return 0;
}

static int fake_embed(void *svc, struct gpud_sreq *r, const struct proto_text_req *req,
		      char *err, size_t errlen)
{
	struct fake *f = svc;
	float v[64];
	uint32_t dim = req->len < 64 ? req->len : 64;
	for (uint32_t i = 0; i < dim; i++)
		v[i] = (float)i * 0.5f;
	atomic_fetch_add(&f->embeds, 1);
	gpud_sreq_embedding(r, v, dim); /* ends it during the call: allowed */
	return 0;
}

static void fake_cancel(void *svc, struct gpud_sreq *r)
{
	struct fake *f = svc;
	atomic_fetch_add(&f->cancels, 1);
	atomic_store(&fpriv(r)->cancelled, 1);
	pthread_mutex_lock(&f->mu);
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

static int fake_tokenize(void *svc, const struct proto_text_req *req, int32_t *ids, uint32_t cap,
			 uint32_t *n, char *err, size_t errlen)
{
	if (req->len > cap)
		return sw_seterr(err, errlen, SW_ETOOLONG, "too many ids");
	for (uint32_t i = 0; i < req->len; i++)
		ids[i] = (unsigned char)req->text[i];
	*n = req->len;
	return 0;
}

static int fake_stats(void *svc, char *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
	const char *j = "{\"fake\":1}";
	if (strlen(j) > cap)
		return SW_ETOOLONG;
	memcpy(buf, j, strlen(j));
	*len = strlen(j);
	return 0;
}

static int fake_mem(void *svc, uint32_t flags, char *buf, size_t cap, size_t *len, char *err,
		    size_t errlen)
{
	int n = snprintf(buf, cap, "{\"flags\":%u}", flags);
	*len = (size_t)n;
	return 0;
}

static const struct gpud_service_ops fake_ops = {
	.submit = fake_submit,
	.embed = fake_embed,
	.cancel = fake_cancel,
	.tokenize = fake_tokenize,
	.stats = fake_stats,
	.mem = fake_mem,
};

static void fake_set(struct fake *f, enum fake_mode mode, uint32_t n_tokens)
{
	pthread_mutex_lock(&f->mu);
	f->mode = mode;
	f->n_tokens = n_tokens;
	f->release = false;
	pthread_mutex_unlock(&f->mu);
}

static void fake_release(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	f->release = true;
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* --- the server on its loop thread --------------------------------------- */

struct env {
	uv_loop_t loop;
	uv_async_t call;
	pthread_t th;
	struct gpud_server *s;
	struct gpud_server_params p;
	char path[108];
	struct fake fk;
	/* a function to run on the loop (env_call) */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	void (*fn)(struct env *);
	bool fn_done;
};

static char g_err[SW_ERR_MAX];
static int g_serial;

static void on_call(uv_async_t *h)
{
	struct env *e = h->data;
	pthread_mutex_lock(&e->mu);
	void (*fn)(struct env *) = e->fn;
	pthread_mutex_unlock(&e->mu);
	if (!fn)
		return;
	fn(e);
	pthread_mutex_lock(&e->mu);
	e->fn = NULL;
	e->fn_done = true;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

/* Runs fn on the loop thread and waits for it. */
static void env_call(struct env *e, void (*fn)(struct env *))
{
	pthread_mutex_lock(&e->mu);
	e->fn = fn;
	e->fn_done = false;
	uv_async_send(&e->call);
	while (!e->fn_done)
		pthread_cond_wait(&e->cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
}

static void *loop_main(void *arg)
{
	struct env *e = arg;
	uv_run(&e->loop, UV_RUN_DEFAULT);
	return NULL;
}

static void env_params(struct gpud_server_params *p)
{
	gpud_server_params_default(p);
	p->max_connections = 8;
	p->max_requests = 32;
	p->max_per_connection = 8;
	p->ring_bytes = 16384;
	p->req_bytes = 16384;
	p->stage_bytes = 1024;
	p->priv_bytes = sizeof(struct fake_priv);
	p->stall_ms = 300;
}

static void env_path(char *path, size_t n)
{
	snprintf(path, n, "/tmp/sw-server-test-%d-%d.sock", (int)getpid(), ++g_serial);
}

/* Starts a server with params p (socket_path filled in here). */
static struct env *env_start(const struct gpud_server_params *p)
{
	struct env *e = calloc(1, sizeof(*e));
	assert_non_null(e);
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	pthread_mutex_init(&e->fk.mu, NULL);
	pthread_cond_init(&e->fk.cv, NULL);
	assert_int_equal(pthread_create(&e->fk.th, NULL, fake_worker, &e->fk), 0);
	env_path(e->path, sizeof(e->path));
	unlink(e->path);
	e->p = *p;
	e->p.socket_path = e->path;
	assert_int_equal(uv_loop_init(&e->loop), 0);
	assert_int_equal(uv_async_init(&e->loop, &e->call, on_call), 0);
	e->call.data = e;
	int rc = gpud_server_create(&e->s, &e->loop, &e->p, &fake_ops, &e->fk, g_err,
				    sizeof(g_err));
	assert_int_equal(rc, 0);
	rc = gpud_server_listen(e->s, g_err, sizeof(g_err));
	if (rc)
		fail_msg("listen: %s", g_err);
	assert_int_equal(pthread_create(&e->th, NULL, loop_main, e), 0);
	return e;
}

static struct gpud_server_stats env_stats(struct env *e)
{
	struct gpud_server_stats st;
	gpud_server_stats(e->s, &st);
	return st;
}

/* Waits (bounded) until cond(e) holds. */
#define WAIT_FOR(e, cond)                                                          \
	do {                                                                       \
		uint64_t until_ = sw_now_ms() + WAIT_MS;                           \
		while (!(cond)) {                                                  \
			if (sw_now_ms() > until_)                                  \
				fail_msg("timed out waiting for %s", #cond);       \
			sw_sleep_ms(1);                                            \
		}                                                                  \
	} while (0)

static void call_close(struct env *e)
{
	gpud_server_close(e->s);
	uv_close((uv_handle_t *)&e->call, NULL);
}

static void call_drain(struct env *e)
{
	gpud_server_drain(e->s);
}

static void call_cancel_all(struct env *e)
{
	gpud_server_cancel_all(e->s);
}

static void env_stop(struct env *e)
{
	env_call(e, call_close);
	/* Every request cancelled by the close ends through the worker. */
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 0);
	assert_int_equal(pthread_join(e->th, NULL), 0);
	/* The service stops before destroy, as gpud's devices do (daemon.c):
	 * in_flight reaches 0 inside the worker's last gpud_sreq_error, which
	 * still releases the request's slot after it (TSan saw destroy read
	 * the connection's slot count while the worker wrote it). */
	pthread_mutex_lock(&e->fk.mu);
	e->fk.stop = true;
	pthread_cond_signal(&e->fk.cv);
	pthread_mutex_unlock(&e->fk.mu);
	pthread_join(e->fk.th, NULL);
	gpud_server_destroy(e->s);
	assert_int_equal(uv_loop_close(&e->loop), 0);
	struct stat st;
	assert_int_equal(stat(e->path, &st), -1); /* unlinked at close */
	pthread_mutex_destroy(&e->fk.mu);
	pthread_cond_destroy(&e->fk.cv);
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e);
}

/* --- raw client ------------------------------------------------------------ */

struct cl {
	int fd;
	struct proto_shm *shm;
	struct proto_ring *ring;
	uint8_t *req;      /* request area */
	uint64_t req_off;
	uint64_t req_size;
	bool closed;       /* EOF seen */
	uint8_t buf[16384]; /* one record */
};

struct result {
	uint16_t type;      /* final record type, 0 none */
	int32_t code;       /* ERROR */
	char msg[PROTO_MAX_ERROR_MSG];
	uint32_t n_ids;     /* TOKENS in all */
	uint32_t n_batches;
	uint32_t n_lp;      /* TOKENS_LP records */
	int eog_at;         /* the id flagged EOG, else -1 (memset: 0) */
	bool eog;
	char text[4096];
	size_t text_len;
	struct proto_done done;
	uint32_t dim;       /* EMBED_REPLY */
	float v1;           /* its value 1 */
};

static int cl_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		fail_msg("connect %s: %s", path, strerror(errno));
	return fd;
}

static void send_hello(int fd, uint16_t version)
{
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_HELLO, 0);
	f.version = version;
	assert_int_equal(proto_send_frame(fd, &f, -1), 0);
}

/* Waits up to WAIT_MS for fd to be readable. */
static void wait_readable(int fd)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	int n = poll(&pfd, 1, WAIT_MS);
	if (n != 1)
		fail_msg("nothing to read within %d ms", WAIT_MS);
}

/* Finishes the handshake started by send_hello on fd. */
static void cl_attach(struct cl *c, int fd)
{
	uint8_t raw[PROTO_FRAME_SIZE];
	struct proto_frame f;
	int mfd = -1;
	wait_readable(fd);
	assert_int_equal(proto_recv_frame(fd, raw, &mfd), 0);
	assert_int_equal(proto_frame_decode(raw, sizeof(raw), &f, g_err, sizeof(g_err)), 0);
	assert_int_equal(f.type, PROTO_T_HELLO_REPLY);
	assert_true(mfd >= 0);
	c->fd = fd;
	assert_int_equal(proto_shm_attach(&c->shm, mfd, 64u << 20, g_err, sizeof(g_err)), 0);
	assert_int_equal(f.payload_length, proto_shm_layout(c->shm)->size);
	assert_int_equal(proto_shm_ring(c->shm, PROTO_RING_CONSUMER, &c->ring, g_err,
					sizeof(g_err)),
			 0);
	c->req = proto_shm_req_area(c->shm);
	c->req_off = proto_shm_layout(c->shm)->req_off;
	c->req_size = proto_shm_layout(c->shm)->req_size;
	c->closed = false;
}

static struct cl *cl_open(struct env *e)
{
	struct cl *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	int fd = cl_connect(e->path);
	send_hello(fd, PROTO_VERSION);
	cl_attach(c, fd);
	return c;
}

static void cl_close(struct cl *c)
{
	if (!c)
		return;
	proto_ring_close(c->ring);
	proto_shm_destroy(c->shm);
	close(c->fd);
	free(c);
}

static void cl_frame(struct cl *c, uint16_t type, uint64_t id, uint64_t off, uint64_t len)
{
	struct proto_frame f;
	proto_frame_init(&f, (enum proto_type)type, id);
	f.payload_offset = off;
	f.payload_length = len;
	assert_int_equal(proto_send_frame(c->fd, &f, -1), 0);
}

/* Writes a one-segment SUBMIT at byte `at` of the request area and sends it. */
static void cl_submit(struct cl *c, uint64_t id, size_t at, const char *text)
{
	struct proto_segment seg = { .text = text, .len = (uint32_t)strlen(text) };
	struct proto_submit_req req = { .n_segments = 1, .segments = &seg, .max_tokens = 16 };
	proto_sampling_default(&req.sampling);
	size_t len;
	assert_int_equal(proto_submit_encode(&req, c->req + at, c->req_size - at, &len, g_err,
					     sizeof(g_err)),
			 0);
	cl_frame(c, PROTO_T_SUBMIT, id, c->req_off + at, len);
}

static void cl_text_req(struct cl *c, uint16_t type, uint64_t id, size_t at, const char *text)
{
	size_t len;
	assert_int_equal(proto_text_req_encode(type, c->req + at, c->req_size - at, 0, text,
					       (uint32_t)strlen(text), &len),
			 0);
	cl_frame(c, type, id, c->req_off + at, len);
}

/* Next record into c->buf: 0, or SW_ECLOSED when the socket ends first.
 * Doorbells are consumed as they come; the ring is the truth. */
static int cl_next(struct cl *c, struct proto_record *rec)
{
	for (;;) {
		int rc = proto_ring_pop(c->ring, rec, c->buf, sizeof(c->buf));
		if (rc == 0)
			return 0;
		assert_int_equal(rc, -EAGAIN);
		if (c->closed)
			return SW_ECLOSED;
		wait_readable(c->fd);
		uint8_t raw[PROTO_FRAME_SIZE];
		struct proto_frame f;
		rc = proto_recv_frame(c->fd, raw, NULL);
		if (rc == SW_ECLOSED || rc == -ECONNRESET) {
			c->closed = true;
			continue; /* records may still be in the ring */
		}
		assert_int_equal(rc, 0);
		assert_int_equal(proto_frame_decode(raw, sizeof(raw), &f, g_err, sizeof(g_err)), 0);
		assert_true(f.flags & PROTO_F_RING);
	}
}

/* Applies one record to res; returns true when it ended request id. */
static bool cl_apply(struct cl *c, const struct proto_record *rec, struct result *res)
{
	switch (rec->type) {
	case PROTO_T_TOKENS: {
		struct proto_tokens t;
		assert_int_equal(proto_tokens_decode(rec->payload, rec->len, NULL, &t, g_err,
						     sizeof(g_err)),
				 0);
		for (uint32_t i = 0; i < t.n_ids; i++)
			assert_int_equal(proto_tokens_id(&t, i), (int32_t)(res->n_ids + i));
		res->n_ids += t.n_ids;
		res->n_batches++;
		assert_true(res->text_len + t.text_len <= sizeof(res->text));
		memcpy(res->text + res->text_len, t.text, t.text_len);
		res->text_len += t.text_len;
		return false;
	}
	case PROTO_T_TOKENS_LP: {
		/* FAKE_STREAM_LP's: one token a record, even staged */
		struct proto_tokens t;
		struct proto_lp_iter it;
		struct proto_lp_entry le;
		assert_int_equal(proto_tokens_lp_decode(rec->payload, rec->len, NULL, &t, g_err,
							sizeof(g_err)),
				 0);
		assert_int_equal(t.n_ids, 1);
		assert_int_equal(t.n_top, 2);
		assert_int_equal(proto_tokens_id(&t, 0), (int32_t)res->n_ids);
		proto_lp_iter_init(&it, &t);
		for (uint32_t k = 0; k < 3; k++) {
			assert_true(proto_lp_next(&it, &le));
			assert_int_equal(le.id, (int32_t)res->n_ids + (int32_t)k);
			assert_memory_equal(le.piece, k == 2 ? "c" : "ab", le.piece_len);
		}
		assert_false(proto_lp_next(&it, &le));
		if (t.eog) {
			assert_false(res->eog);
			res->eog = true;
			res->eog_at = (int)res->n_ids;
		}
		res->n_ids++;
		res->n_lp++;
		res->n_batches++;
		assert_true(res->text_len + t.text_len <= sizeof(res->text));
		memcpy(res->text + res->text_len, t.text, t.text_len);
		res->text_len += t.text_len;
		return false;
	}
	case PROTO_T_DONE:
		assert_int_equal(proto_done_decode(rec->payload, rec->len, &res->done, g_err,
						   sizeof(g_err)),
				 0);
		res->type = rec->type;
		return true;
	case PROTO_T_ERROR: {
		struct proto_error er;
		assert_int_equal(proto_error_decode(rec->payload, rec->len, &er, g_err,
						    sizeof(g_err)),
				 0);
		res->code = er.code;
		memcpy(res->msg, er.msg, sizeof(res->msg));
		res->type = rec->type;
		return true;
	}
	case PROTO_T_EMBED_REPLY: {
		struct proto_embedding em;
		assert_int_equal(proto_embedding_decode(rec->payload, rec->len, NULL, &em, g_err,
							sizeof(g_err)),
				 0);
		res->dim = em.dim;
		res->v1 = em.dim > 1 ? proto_embedding_value(&em, 1) : 0;
		res->type = rec->type;
		return true;
	}
	case PROTO_T_TOKENIZE_REPLY:
	case PROTO_T_STATS_REPLY:
	case PROTO_T_MEM_REPLY:
		assert_true(rec->len <= sizeof(res->text));
		memcpy(res->text, rec->payload, rec->len);
		res->text_len = rec->len;
		res->type = rec->type;
		return true;
	default:
		fail_msg("unexpected record type %u", rec->type);
		return true;
	}
}

/* Reads records until id ends; records of other ids are a failure. */
static void cl_wait(struct cl *c, uint64_t id, struct result *res)
{
	memset(res, 0, sizeof(*res));
	for (;;) {
		struct proto_record rec;
		int rc = cl_next(c, &rec);
		if (rc)
			fail_msg("connection closed before request %llu ended",
				 (unsigned long long)id);
		assert_int_equal(rec.request_id, id);
		if (cl_apply(c, &rec, res))
			return;
	}
}

static void cl_expect_error(struct cl *c, uint64_t id, int code, const char *substr)
{
	struct result res;
	cl_wait(c, id, &res);
	assert_int_equal(res.type, PROTO_T_ERROR);
	if (res.code != code)
		fail_msg("request %llu: code %s (%s), expected %s", (unsigned long long)id,
			 sw_errname(res.code), res.msg, sw_errname(code));
	if (substr && !strstr(res.msg, substr))
		fail_msg("message '%s' lacks '%s'", res.msg, substr);
}

/* True when the server has closed c's socket (reads EOF within WAIT_MS,
 * after any doorbells). */
static bool socket_closed(int fd)
{
	for (;;) {
		wait_readable(fd);
		uint8_t raw[PROTO_FRAME_SIZE];
		int rc = proto_recv_frame(fd, raw, NULL);
		if (rc == SW_ECLOSED || rc == -ECONNRESET)
			return true;
		if (rc)
			return false;
	}
}

/* --- tests ------------------------------------------------------------------ */

static void test_stream_and_quick_requests(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 5);
	struct cl *c = cl_open(e);
	struct result res;

	struct stat st;
	assert_int_equal(stat(e->path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);

	cl_submit(c, 11, 0, "hello world");
	cl_wait(c, 11, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	assert_int_equal(res.n_ids, 5);
	assert_int_equal(res.text_len, 10);
	assert_memory_equal(res.text, "ababababab", 10);
	assert_int_equal(res.done.generated_tokens, 5);
	assert_int_equal(res.done.prompt_tokens, 3);

	cl_text_req(c, PROTO_T_TOKENIZE, 12, 0, "xyz");
	cl_wait(c, 12, &res);
	assert_int_equal(res.type, PROTO_T_TOKENIZE_REPLY);
	struct proto_tokens t;
	assert_int_equal(proto_tokens_decode((uint8_t *)res.text, res.text_len, NULL, &t, g_err,
					     sizeof(g_err)),
			 0);
	assert_int_equal(t.n_ids, 3);
	assert_int_equal(proto_tokens_id(&t, 0), 'x');
	assert_int_equal(proto_tokens_id(&t, 2), 'z');

	cl_frame(c, PROTO_T_STATS, 13, 0, 0);
	cl_wait(c, 13, &res);
	assert_int_equal(res.type, PROTO_T_STATS_REPLY);
	struct proto_text j;
	assert_int_equal(proto_json_decode((uint8_t *)res.text, res.text_len, NULL, &j, g_err,
					   sizeof(g_err)),
			 0);
	assert_int_equal(j.len, strlen("{\"fake\":1}"));
	assert_memory_equal(j.p, "{\"fake\":1}", j.len);

	size_t len;
	assert_int_equal(proto_mem_req_encode(c->req, 64, PROTO_MEM_DUMP_OWNERS, &len), 0);
	cl_frame(c, PROTO_T_MEM, 14, c->req_off, len);
	cl_wait(c, 14, &res);
	assert_int_equal(res.type, PROTO_T_MEM_REPLY);
	assert_int_equal(proto_json_decode((uint8_t *)res.text, res.text_len, NULL, &j, g_err,
					   sizeof(g_err)),
			 0);
	assert_memory_equal(j.p, "{\"flags\":1}", j.len);

	cl_text_req(c, PROTO_T_EMBED, 15, 0, "abcd");
	cl_wait(c, 15, &res);
	assert_int_equal(res.type, PROTO_T_EMBED_REPLY);
	assert_int_equal(res.dim, 4);
	assert_true(res.v1 == 0.5f);

	/* CANCEL of an id not in flight is ignored; the connection serves on. */
	cl_frame(c, PROTO_T_CANCEL, 999, 0, 0);
	cl_submit(c, 16, 256, "again");
	cl_wait(c, 16, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	assert_int_equal(atomic_load(&e->fk.cancels), 0);

	/* A service refusal is an ERROR with its code and message. */
	pthread_mutex_lock(&e->fk.mu);
	e->fk.refuse = SW_ETOOLONG;
	pthread_mutex_unlock(&e->fk.mu);
	cl_submit(c, 17, 0, "refused");
	cl_expect_error(c, 17, SW_ETOOLONG, "fake refuses");

	struct gpud_server_stats s = env_stats(e);
	assert_int_equal(s.accepted, 1);
	assert_int_equal(s.connections, 1);
	assert_int_equal(s.requests, 3); /* two submits, one embed */
	assert_int_equal(s.refused, 1);
	assert_int_equal(s.in_flight, 0);
	assert_true(s.in_flight_high >= 1);
	/* Doorbells coalesce: at least one, at most one per record. */
	assert_true(s.doorbells_out >= 1 && s.doorbells_out <= 17);
	assert_int_equal(s.frames_in, 9);
	assert_int_equal(s.bad_frames, 0);
	cl_close(c);
	WAIT_FOR(e, env_stats(e).connections == 0);
	env_stop(e);
}

static void test_version_mismatch(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	int fd = cl_connect(e->path);
	send_hello(fd, PROTO_VERSION + 1);
	uint8_t raw[PROTO_FRAME_SIZE];
	int mfd = -1;
	wait_readable(fd);
	assert_int_equal(proto_recv_frame(fd, raw, &mfd), 0);
	assert_int_equal(mfd, -1);
	struct proto_frame f;
	assert_int_equal(proto_frame_decode(raw, sizeof(raw), &f, g_err, sizeof(g_err)), 0);
	assert_int_equal(f.type, PROTO_T_ERROR);
	assert_int_equal(f.aux, (uint32_t)-SW_EVERSION);
	assert_int_equal(f.payload_length, 0);
	assert_true(socket_closed(fd));
	close(fd);

	/* A frame other than HELLO first: closed without a word. */
	fd = cl_connect(e->path);
	struct proto_frame g;
	proto_frame_init(&g, PROTO_T_STATS, 1);
	assert_int_equal(proto_send_frame(fd, &g, -1), 0);
	assert_true(socket_closed(fd));
	close(fd);

	/* HELLO twice: an error, then closed. */
	struct cl *c = cl_open(e);
	send_hello(c->fd, PROTO_VERSION);
	struct proto_record rec;
	struct result res = { 0 };
	assert_int_equal(cl_next(c, &rec), 0);
	assert_true(cl_apply(c, &rec, &res));
	assert_int_equal(res.code, SW_EFORMAT);
	assert_non_null(strstr(res.msg, "HELLO twice"));
	assert_int_equal(cl_next(c, &rec), SW_ECLOSED);
	cl_close(c);
	WAIT_FOR(e, env_stats(e).connections == 0);
	env_stop(e);
}

static void test_bad_frames(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	p.max_bad_frames = 6;
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 2);
	struct cl *c = cl_open(e);
	struct result res;
	uint8_t raw[PROTO_FRAME_SIZE];
	struct proto_frame f;

	/* Wrong magic: ERROR for its id; the stream stays in step. */
	proto_frame_init(&f, PROTO_T_SUBMIT, 7);
	f.magic = 0x12345678;
	proto_frame_encode(&f, raw);
	assert_int_equal(send(c->fd, raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
	cl_expect_error(c, 7, SW_EFORMAT, "magic");

	/* A type from the future. */
	proto_frame_init(&f, PROTO_T_STATS, 8);
	proto_frame_encode(&f, raw);
	proto_put16(raw + PROTO_FRAME_OFF_TYPE, 99);
	assert_int_equal(send(c->fd, raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
	cl_expect_error(c, 8, SW_EUNSUPPORTED, NULL);

	/* A type only gpud sends. */
	cl_frame(c, PROTO_T_TOKENS, 9, 0, 0);
	cl_expect_error(c, 9, SW_EFORMAT, "TOKENS");

	/* Payload outside the request area: the header, then past the end. */
	cl_frame(c, PROTO_T_SUBMIT, 10, 0, 64);
	cl_expect_error(c, 10, SW_EFORMAT, "outside the area");
	cl_frame(c, PROTO_T_SUBMIT, 11, c->req_off + c->req_size - 8, 64);
	cl_expect_error(c, 11, SW_EFORMAT, "outside the area");

	/* A payload that fails its decoder: not counted as a bad frame. */
	cl_submit(c, 12, 0, "ok");
	cl_wait(c, 12, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	size_t good_len;
	{
		struct proto_segment seg = { .text = "ok", .len = 2 };
		struct proto_submit_req rq = { .n_segments = 1, .segments = &seg };
		proto_sampling_default(&rq.sampling);
		assert_int_equal(proto_submit_encode(&rq, c->req, c->req_size, &good_len, g_err,
						     sizeof(g_err)),
				 0);
	}
	proto_put32(c->req, 1000); /* n_segments over the limit */
	cl_frame(c, PROTO_T_SUBMIT, 13, c->req_off, good_len);
	cl_expect_error(c, 13, SW_ETOOLONG, "segments");
	proto_put32(c->req, 1);
	cl_frame(c, PROTO_T_SUBMIT, 14, c->req_off, good_len + 3); /* trailing bytes */
	cl_expect_error(c, 14, SW_EFORMAT, "submit");
	size_t elen;
	assert_int_equal(proto_text_req_encode(PROTO_T_EMBED, c->req, 64, 0, "x", 1, &elen), 0);
	proto_put32(c->req, 7); /* embed flags must be 0 */
	cl_frame(c, PROTO_T_EMBED, 15, c->req_off, 9);
	cl_expect_error(c, 15, SW_EFORMAT, NULL);

	/* Still served. */
	cl_submit(c, 16, 0, "still here");
	cl_wait(c, 16, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	assert_int_equal(res.n_ids, 2);

	struct gpud_server_stats s = env_stats(e);
	assert_int_equal(s.bad_frames, 5);
	assert_int_equal(s.refused, 3);

	/* The sixth bad frame closes the connection. */
	cl_frame(c, PROTO_T_DONE, 17, 0, 0);
	cl_expect_error(c, 17, SW_EFORMAT, NULL);
	struct proto_record rec;
	assert_int_equal(cl_next(c, &rec), SW_ECLOSED);
	cl_close(c);
	WAIT_FOR(e, env_stats(e).connections == 0);
	env_stop(e);
}

static void test_duplicate_id_and_cancel(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_HOLD, 3);
	struct cl *c = cl_open(e);
	cl_submit(c, 5, 0, "first");
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 1);
	cl_submit(c, 5, 256, "second");
	cl_expect_error(c, 5, SW_EFORMAT, "already in flight");
	assert_int_equal(gpud_server_in_flight(e->s), 1); /* the first goes on */
	cl_frame(c, PROTO_T_CANCEL, 5, 0, 0);
	cl_frame(c, PROTO_T_CANCEL, 5, 0, 0); /* twice: ops.cancel once */
	cl_expect_error(c, 5, SW_ECANCELED, "canceled");
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 0);
	assert_int_equal(atomic_load(&e->fk.cancels), 1);
	cl_close(c);
	env_stop(e);
}

static void test_limits_and_close_cancels(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	p.max_per_connection = 4;
	p.max_requests = 6;
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_HOLD, 1);
	struct cl *a = cl_open(e), *b = cl_open(e);
	for (uint64_t id = 1; id <= 4; id++)
		cl_submit(a, id, 256 * id, "held");
	cl_submit(a, 5, 0, "one too many");
	cl_expect_error(a, 5, SW_EBUSY, "on this connection (limit 4)");
	cl_submit(b, 1, 0, "b1");
	cl_submit(b, 2, 256, "b2");
	cl_submit(b, 3, 512, "b3");
	cl_expect_error(b, 3, SW_EBUSY, "in gpud (limit 6)");
	WAIT_FOR(e, atomic_load(&e->fk.submits) == 6);
	struct gpud_server_stats s = env_stats(e);
	assert_int_equal(s.in_flight, 6);
	assert_int_equal(s.busy, 2);

	/* A closes with 4 in flight: each cancelled once, slots come back. */
	cl_close(a);
	WAIT_FOR(e, atomic_load(&e->fk.cancels) == 4);
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 2);
	WAIT_FOR(e, env_stats(e).connections == 1);

	/* B is not disturbed: cancel_all ends its two; new requests work. */
	env_call(e, call_cancel_all);
	for (int k = 0; k < 2; k++) { /* in either order */
		struct proto_record rec;
		struct result r = { 0 };
		assert_int_equal(cl_next(b, &rec), 0);
		assert_true(rec.request_id == 1 || rec.request_id == 2);
		assert_true(cl_apply(b, &rec, &r));
		assert_int_equal(r.code, SW_ECANCELED);
	}
	assert_int_equal(atomic_load(&e->fk.cancels), 6);
	fake_set(&e->fk, FAKE_STREAM, 1);
	struct result res;
	cl_submit(b, 4, 0, "after");
	cl_wait(b, 4, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	assert_int_equal(gpud_server_in_flight(e->s), 0);
	cl_close(b);
	env_stop(e);
}

static void test_slow_client(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	p.ring_bytes = 4096;
	p.stage_bytes = 512;
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 100000);
	struct cl *slow = cl_open(e), *ok = cl_open(e);
	cl_submit(slow, 1, 0, "flood me");
	/* The slow client never reads its ring: ring, then staging, fill;
	 * the service is told (SW_EBUSY) and ends the request. */
	WAIT_FOR(e, atomic_load(&e->fk.busy_seen) == 1);
	struct gpud_server_stats s = env_stats(e);
	assert_true(s.staged > 0);
	assert_true(s.stage_high > 0 && s.stage_high <= 512);
	assert_int_equal(s.in_flight, 0);

	/* The other client is served meanwhile. */
	fake_set(&e->fk, FAKE_STREAM, 3);
	struct result res;
	cl_submit(ok, 1, 0, "me too");
	cl_wait(ok, 1, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	assert_int_equal(res.n_ids, 3);

	/* Its final record waits past stall_ms: the connection is closed. */
	WAIT_FOR(e, env_stats(e).stalled == 1);
	assert_true(socket_closed(slow->fd));
	WAIT_FOR(e, env_stats(e).connections == 1);
	cl_close(slow);

	cl_submit(ok, 2, 0, "still");
	cl_wait(ok, 2, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	cl_close(ok);
	env_stop(e);
}

/* A client that reads only after n tokens of mode were sent, through a
 * 4 KiB ring: some waited in staging; *res is what it then read. */
static void staged_stream(enum fake_mode mode, uint32_t n, struct result *res)
{
	struct gpud_server_params p;
	env_params(&p);
	p.ring_bytes = 4096;
	p.stage_bytes = 4096;
	p.stall_ms = 60000;
	struct env *e = env_start(&p);
	fake_set(&e->fk, mode, n);
	struct cl *c = cl_open(e);
	cl_submit(c, 1, 0, "fill");
	WAIT_FOR(e, atomic_load(&e->fk.ended) == 1);
	assert_int_equal(atomic_load(&e->fk.busy_seen), 0);
	cl_wait(c, 1, res);
	assert_int_equal(res->type, PROTO_T_DONE);
	assert_int_equal(res->n_ids, n);
	struct gpud_server_stats s = env_stats(e);
	assert_true(s.staged > 0);
	cl_close(c);
	env_stop(e);
}

/* A client that reads late gets everything, in order, staged batches
 * coalesced (32-byte records: the ring takes 128, staging the rest). */
static void test_staging_delivers_in_order(void **state)
{
	(void)state;
	struct result res;
	staged_stream(FAKE_STREAM, 200, &res);
	assert_int_equal(res.done.generated_tokens, 200);
	assert_true(res.n_batches < 200); /* some were coalesced */
}

/* The same with log probabilities: staged TOKENS_LP records are written
 * one a record, in order, and the EOG flag travels with the last
 * (57-byte payloads: the ring takes about 50 records, staging, at most
 * half the ring, 35). */
static void test_staging_lp_in_order(void **state)
{
	(void)state;
	struct result res;
	staged_stream(FAKE_STREAM_LP, 70, &res);
	assert_int_equal(res.n_lp, 70);
	assert_true(res.eog);
	assert_int_equal(res.eog_at, 69);
	assert_int_equal(res.text_len, 140);
}

static void test_drain(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_HOLD, 2);
	struct cl *c = cl_open(e);
	cl_submit(c, 1, 0, "old one");
	cl_submit(c, 2, 256, "old two");
	WAIT_FOR(e, atomic_load(&e->fk.submits) == 2);
	env_call(e, call_drain);
	env_call(e, call_drain); /* idempotent */
	cl_submit(c, 3, 512, "new");
	cl_expect_error(c, 3, SW_ECLOSED, "shutting down");
	cl_text_req(c, PROTO_T_EMBED, 4, 768, "new");
	cl_expect_error(c, 4, SW_ECLOSED, "shutting down");
	struct result res;
	cl_text_req(c, PROTO_T_TOKENIZE, 5, 1024, "ab");
	cl_wait(c, 5, &res);
	assert_int_equal(res.type, PROTO_T_TOKENIZE_REPLY);
	fake_release(&e->fk);
	struct result r1 = { 0 }, r2 = { 0 };
	int ended = 0;
	while (ended < 2) {
		struct proto_record rec;
		assert_int_equal(cl_next(c, &rec), 0);
		struct result *r = rec.request_id == 1 ? &r1 : &r2;
		assert_true(rec.request_id == 1 || rec.request_id == 2);
		ended += cl_apply(c, &rec, r);
	}
	assert_int_equal(r1.type, PROTO_T_DONE);
	assert_int_equal(r2.type, PROTO_T_DONE);
	assert_int_equal(r1.n_ids, 2);
	assert_int_equal(gpud_server_in_flight(e->s), 0);
	cl_close(c);
	env_stop(e);
}

/* 256 connections at once, each with one request, served from one
 * poll loop here. */
static void test_many_connections(void **state)
{
	(void)state;
	enum { N = 256 };
	struct gpud_server_params p;
	env_params(&p);
	p.max_connections = N;
	p.max_requests = N;
	p.ring_bytes = 4096;
	p.req_bytes = 4096;
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 3);
	struct cl **cs = calloc(N, sizeof(*cs));
	struct result *res = calloc(N, sizeof(*res));
	struct pollfd *pfd = calloc(N, sizeof(*pfd));
	assert_non_null(cs);
	assert_non_null(res);
	assert_non_null(pfd);
	int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = cl_connect(e->path);
		send_hello(fds[i], PROTO_VERSION);
	}
	for (int i = 0; i < N; i++) {
		cs[i] = calloc(1, sizeof(*cs[i]));
		assert_non_null(cs[i]);
		cl_attach(cs[i], fds[i]);
	}
	for (int i = 0; i < N; i++)
		cl_submit(cs[i], (uint64_t)i + 1, 0, "one of many");
	WAIT_FOR(e, env_stats(e).connections == N);
	int done = 0;
	uint64_t until = sw_now_ms() + WAIT_MS;
	while (done < N) {
		int n = 0;
		for (int i = 0; i < N; i++) {
			pfd[i].fd = res[i].type ? -1 : cs[i]->fd;
			pfd[i].events = POLLIN;
			n += !res[i].type;
		}
		assert_true(poll(pfd, N, 1000) >= 0);
		assert_true(sw_now_ms() < until);
		for (int i = 0; i < N; i++) {
			if (res[i].type || !(pfd[i].revents & POLLIN))
				continue;
			uint8_t raw[PROTO_FRAME_SIZE];
			assert_int_equal(proto_recv_frame(cs[i]->fd, raw, NULL), 0);
			struct proto_record rec;
			while (!res[i].type &&
			       proto_ring_pop(cs[i]->ring, &rec, cs[i]->buf, sizeof(cs[i]->buf)) == 0) {
				assert_int_equal(rec.request_id, (uint64_t)i + 1);
				done += cl_apply(cs[i], &rec, &res[i]);
			}
		}
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(res[i].type, PROTO_T_DONE);
		assert_int_equal(res[i].n_ids, 3);
	}
	struct gpud_server_stats s = env_stats(e);
	assert_int_equal(s.accepted, N);
	assert_int_equal(s.connections_high, N);
	assert_int_equal(s.requests, N);
	assert_int_equal(s.busy, 0);

	/* One over the limit is accepted and closed at once. */
	int extra = cl_connect(e->path);
	uint8_t hello[PROTO_FRAME_SIZE];
	struct proto_frame hf;
	proto_frame_init(&hf, PROTO_T_HELLO, 0);
	proto_frame_encode(&hf, hello);
	(void)!send(extra, hello, sizeof(hello), MSG_NOSIGNAL); /* may already be closed */
	assert_true(socket_closed(extra));
	close(extra);
	WAIT_FOR(e, env_stats(e).refused_conns == 1);

	for (int i = 0; i < N; i++)
		cl_close(cs[i]);
	WAIT_FOR(e, env_stats(e).connections == 0);
	free(cs);
	free(res);
	free(pfd);
	env_stop(e);
}

static void test_socket_file(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	char path[108];
	env_path(path, sizeof(path));
	unlink(path);

	/* A stale socket file (bound, nobody listening) is replaced. */
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(fd);
	uv_loop_t loop;
	assert_int_equal(uv_loop_init(&loop), 0);
	struct gpud_server *s1, *s2;
	p.socket_path = path;
	mode_t old = umask(0077); /* the mode does not depend on it */
	assert_int_equal(gpud_server_create(&s1, &loop, &p, &fake_ops, NULL, g_err, sizeof(g_err)),
			 0);
	assert_int_equal(gpud_server_listen(s1, g_err, sizeof(g_err)), 0);
	umask(old);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0660);

	/* A live one is refused. */
	assert_int_equal(gpud_server_create(&s2, &loop, &p, &fake_ops, NULL, g_err, sizeof(g_err)),
			 0);
	assert_int_equal(gpud_server_listen(s2, g_err, sizeof(g_err)), -EADDRINUSE);
	assert_non_null(strstr(g_err, "another gpud is listening"));
	/* s2 never bound: closing it leaves s1's file. */
	gpud_server_close(s2);
	uv_run(&loop, UV_RUN_NOWAIT);
	gpud_server_destroy(s2);
	assert_int_equal(stat(path, &st), 0);
	gpud_server_close(s1);
	uv_run(&loop, UV_RUN_DEFAULT);
	gpud_server_destroy(s1);
	assert_int_equal(uv_loop_close(&loop), 0);

	/* Not a socket: left alone. */
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(gpud_server_create(&s1, &loop, &p, &fake_ops, NULL, g_err, sizeof(g_err)),
			 0);
	assert_int_equal(gpud_server_listen(s1, g_err, sizeof(g_err)), -EEXIST);
	gpud_server_destroy(s1); /* destroy without close: closes for us */
	assert_int_equal(uv_loop_close(&loop), 0);
	unlink(path);

	/* Bad parameters. */
	struct gpud_server_params q = p;
	q.ring_bytes = 1000;
	assert_int_equal(gpud_server_create(&s1, &loop, &q, &fake_ops, NULL, g_err, sizeof(g_err)),
			 -EINVAL);
	assert_null(s1);
	q = p;
	q.socket_path = NULL;
	assert_int_equal(gpud_server_create(&s1, &loop, &q, &fake_ops, NULL, g_err, sizeof(g_err)),
			 -EINVAL);
	gpud_server_destroy(NULL);
}

static void test_descriptor_closes(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	struct cl *c = cl_open(e);
	int pp[2];
	assert_int_equal(pipe(pp), 0);
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_STATS, 3);
	assert_int_equal(proto_send_frame(c->fd, &f, pp[0]), 0);
	close(pp[0]);
	assert_true(socket_closed(c->fd));
	/* The server closed its copy: the pipe's read end is gone. */
	WAIT_FOR(e, env_stats(e).connections == 0);
	WAIT_FOR(e, write(pp[1], "x", 1) < 0 && errno == EPIPE);
	close(pp[1]);
	cl_close(c);
	env_stop(e);
}

static void test_no_malloc_on_requests(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 4);
	struct cl *c = cl_open(e);
	struct result res;
	for (uint64_t id = 1; id <= 3; id++) { /* warm-up */
		cl_submit(c, id, 0, "warm");
		cl_wait(c, id, &res);
	}
	assert_true(gpud_alloc_hook_linked());
	uint64_t allocs = gpud_alloc_host_allocs();
	for (uint64_t id = 10; id < 60; id++) {
		cl_submit(c, id, 0, "counted");
		cl_wait(c, id, &res);
		assert_int_equal(res.type, PROTO_T_DONE);
		cl_text_req(c, PROTO_T_TOKENIZE, id + 1000, 512, "tok");
		cl_wait(c, id + 1000, &res);
		cl_text_req(c, PROTO_T_EMBED, id + 2000, 512, "emb");
		cl_wait(c, id + 2000, &res);
		cl_frame(c, PROTO_T_STATS, id + 3000, 0, 0);
		cl_wait(c, id + 3000, &res);
	}
	uint64_t n = gpud_alloc_host_allocs() - allocs;
	assert_int_equal(n, 0);

	/* New connections after warm-up: accept, HELLO (region), a request,
	 * close and reap. Only this client's own attach is left uncounted
	 * (the server is idle then, waiting for the next frame). */
	for (int k = 0; k < 3; k++) {
		struct cl *c2 = calloc(1, sizeof(*c2));
		assert_non_null(c2);
		allocs = gpud_alloc_host_allocs();
		int fd = cl_connect(e->path);
		send_hello(fd, PROTO_VERSION);
		wait_readable(fd);
		n = gpud_alloc_host_allocs() - allocs;
		cl_attach(c2, fd);
		allocs = gpud_alloc_host_allocs();
		cl_submit(c2, 1, 0, "new connection");
		cl_wait(c2, 1, &res);
		assert_int_equal(res.type, PROTO_T_DONE);
		cl_close(c2);
		WAIT_FOR(e, env_stats(e).connections == 1);
		WAIT_FOR(e, env_stats(e).accepted == 2 + (uint64_t)k);
		n += gpud_alloc_host_allocs() - allocs;
		assert_int_equal(n, 0);
	}
	cl_close(c);
	env_stop(e);
}

/* A full ring: a quick reply becomes ERROR SW_EBUSY, an embedding waits
 * in its slot, both arrive once the client reads; a client that lets the
 * error queue overflow is closed. */
static void test_ring_full_paths(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	p.ring_bytes = 4096;
	p.stage_bytes = 512;
	p.stall_ms = 60000;
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 100000);
	struct cl *c = cl_open(e);
	cl_submit(c, 1, 0, "flood");
	WAIT_FOR(e, atomic_load(&e->fk.busy_seen) == 1);
	cl_text_req(c, PROTO_T_TOKENIZE, 50, 256, "ab");
	cl_text_req(c, PROTO_T_EMBED, 51, 512, "abcd");
	WAIT_FOR(e, atomic_load(&e->fk.embeds) == 1);
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 0);

	struct result r1 = { 0 }, r50 = { 0 }, r51 = { 0 };
	int ended = 0;
	while (ended < 3) {
		struct proto_record rec;
		assert_int_equal(cl_next(c, &rec), 0);
		struct result *r = rec.request_id == 1 ? &r1 : rec.request_id == 50 ? &r50 : &r51;
		assert_true(rec.request_id == 1 || rec.request_id == 50 || rec.request_id == 51);
		ended += cl_apply(c, &rec, r);
	}
	assert_int_equal(r1.type, PROTO_T_ERROR);
	assert_int_equal(r1.code, SW_EBUSY);
	assert_true(r1.n_ids > 100); /* ring + staging, in order (cl_apply checks) */
	assert_int_equal(r50.type, PROTO_T_ERROR);
	assert_int_equal(r50.code, SW_EBUSY);
	assert_non_null(strstr(r50.msg, "ring is full"));
	assert_int_equal(r51.type, PROTO_T_EMBED_REPLY);
	assert_int_equal(r51.dim, 4);

	/* Full again; nine errors the server makes itself overflow the
	 * queue of eight: closed. */
	cl_submit(c, 2, 0, "flood again");
	WAIT_FOR(e, atomic_load(&e->fk.busy_seen) == 2);
	for (uint64_t id = 60; id < 69; id++)
		cl_frame(c, PROTO_T_TOKENS, id, 0, 0);
	assert_true(socket_closed(c->fd));
	WAIT_FOR(e, env_stats(e).connections == 0);
	assert_int_equal(env_stats(e).bad_frames, 9);
	assert_int_equal(env_stats(e).stalled, 0);
	cl_close(c);
	env_stop(e);
}

/* Closing the server with requests in flight cancels them; destroy
 * unmaps what the connections left once the service has ended them. */
static void test_close_with_requests(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_HOLD, 1);
	struct cl *a = cl_open(e), *b = cl_open(e);
	cl_submit(a, 1, 0, "a1");
	cl_submit(a, 2, 256, "a2");
	cl_submit(b, 1, 0, "b1");
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 3);
	env_stop(e); /* waits for in_flight 0 */
	struct proto_record rec;
	/* The clients see their sockets close; nothing more arrives. */
	assert_true(socket_closed(a->fd));
	assert_true(socket_closed(b->fd));
	assert_int_equal(proto_ring_pop(a->ring, &rec, a->buf, sizeof(a->buf)), -EAGAIN);
	cl_close(a);
	cl_close(b);
}

/* A client that corrupts the ring's tail is closed; the service is told
 * SW_ECLOSED and the other connections are untouched. */
static void test_corrupt_tail(void **state)
{
	(void)state;
	struct gpud_server_params p;
	env_params(&p);
	struct env *e = env_start(&p);
	fake_set(&e->fk, FAKE_STREAM, 3);
	struct cl *c = cl_open(e), *ok = cl_open(e);
	const struct proto_shm_layout *l = proto_shm_layout(c->shm);
	_Atomic uint64_t *tail =
		(_Atomic uint64_t *)(void *)(proto_shm_base(c->shm) + l->ring_off + 64);
	atomic_store(tail, 12345); /* past head, not a multiple of 16 */
	cl_submit(c, 1, 0, "doomed");
	assert_true(socket_closed(c->fd));
	WAIT_FOR(e, atomic_load(&e->fk.closed_seen) == 1);
	WAIT_FOR(e, gpud_server_in_flight(e->s) == 0);
	struct result res;
	cl_submit(ok, 1, 0, "fine");
	cl_wait(ok, 1, &res);
	assert_int_equal(res.type, PROTO_T_DONE);
	cl_close(c);
	cl_close(ok);
	env_stop(e);
}

/* Child: becomes uid/gid 65534 (with supplementary group extra_gid when
 * not 0), connects, says HELLO. Exit 10 when closed without a reply, 11
 * on HELLO_REPLY, 13 on ERROR aux = EACCES (refused by the peer check),
 * 12 on anything else. */
static int peer_child(const char *path, gid_t extra_gid)
{
	gid_t extra[1] = { extra_gid };
	if (setgroups(extra_gid ? 1 : 0, extra) || setgid(65534) || setuid(65534))
		return 12;
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		return 12;
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_HELLO, 0);
	(void)proto_send_frame(fd, &f, -1);
	uint8_t raw[PROTO_FRAME_SIZE];
	int mfd = -1;
	int rc = proto_recv_frame(fd, raw, &mfd);
	if (rc == SW_ECLOSED || rc == -ECONNRESET)
		return 10;
	if (rc == 0 && proto_frame_decode(raw, sizeof(raw), &f, NULL, 0) == 0 &&
	    f.type == PROTO_T_HELLO_REPLY && mfd >= 0)
		return 11;
	if (rc == 0 && f.type == PROTO_T_ERROR && f.aux == EACCES && mfd < 0)
		return 13;
	return 12;
}

static int run_peer_child(const char *path, gid_t extra_gid)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(peer_child(path, extra_gid));
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* One server with params p; a 65534 child (supplementary group
 * extra_gid) connects. chmod_all: open the file to everyone, so that
 * only the peer check decides. Returns the child's exit code; the
 * counters are checked against it. */
static int peer_case(struct gpud_server_params *p, gid_t extra_gid, bool chmod_all)
{
	struct env *e = env_start(p);
	if (chmod_all)
		assert_int_equal(chmod(e->path, 0666), 0);
	int rc = run_peer_child(e->path, extra_gid);
	if (rc == 13) {
		WAIT_FOR(e, env_stats(e).refused_peer == 1);
		assert_int_equal(env_stats(e).accepted, 0);
	} else if (rc == 11) {
		WAIT_FOR(e, env_stats(e).accepted == 1);
		assert_int_equal(env_stats(e).refused_peer, 0);
	}
	env_stop(e);
	return rc;
}

/* The peer check (server.h): another uid is refused with ERROR EACCES
 * unless its uid or gid is listed, one of its supplementary groups is
 * listed, or it is in the socket's group and the mode gives that group
 * rw. Needs root (to become someone else). */
static void test_peer_policy(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	/* The peer is a fork of this process, whose server threads it does
	 * not have: valgrind counts their stacks as lost at its exit and
	 * makes that its exit code. The ASan run and the plain one cover it. */
	if (getenv("SWARM_UNDER_VALGRIND"))
		skip();
	struct gpud_server_params p;
	env_params(&p);
	assert_int_equal(peer_case(&p, 0, true), 13);

	p.allowed_gids[p.n_allowed_gids++] = 65534;
	assert_int_equal(peer_case(&p, 0, true), 11);
	p.n_allowed_gids = 0;

	p.allowed_uids[p.n_allowed_uids++] = 12345;
	p.allowed_uids[p.n_allowed_uids++] = 65534;
	assert_int_equal(peer_case(&p, 0, true), 11);
	p.n_allowed_uids = 0;

	/* A supplementary group counts (SO_PEERGROUPS). */
	p.allowed_gids[p.n_allowed_gids++] = 4242;
	assert_int_equal(peer_case(&p, 4242, true), 11);
	assert_int_equal(peer_case(&p, 4243, true), 13);
	p.n_allowed_gids = 0;

	/* The socket's group: the file (0660, group 65534) lets the child
	 * in without a chmod, and the check admits what the file grants... */
	p.socket_gid = 65534;
	assert_int_equal(peer_case(&p, 0, false), 11);
	/* ... but not when the mode gives the group nothing. */
	p.socket_mode = 0600;
	assert_int_equal(peer_case(&p, 0, true), 13);
}

/* The socket file is born with socket_mode whatever the umask, and with
 * socket_gid as its group; the server refuses modes without owner rw. */
static void test_socket_mode_group(void **state)
{
	(void)state;
	static const struct {
		uint32_t mode;
		mode_t umask;
	} cases[] = { { 0600, 0 }, { 0660, 0077 }, { 0666, 0777 }, { 0770, 0022 } };
	struct gpud_server_params p;
	struct stat st;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		env_params(&p);
		p.socket_mode = cases[i].mode;
		if (geteuid() == 0)
			p.socket_gid = 4242 + (gid_t)i; /* root may give it any group */
		mode_t old = umask(cases[i].umask);
		struct env *e = env_start(&p);
		assert_int_equal(umask(old), cases[i].umask); /* listen restored it */
		assert_int_equal(lstat(e->path, &st), 0);
		assert_true(S_ISSOCK(st.st_mode));
		if ((st.st_mode & 07777) != cases[i].mode)
			fail_msg("mode %04o under umask %04o, want %04o", st.st_mode & 07777,
				 cases[i].umask, cases[i].mode);
		assert_int_equal(st.st_gid, geteuid() == 0 ? 4242 + (gid_t)i : getegid());
		env_stop(e);
	}

	uv_loop_t loop;
	struct gpud_server *s;
	assert_int_equal(uv_loop_init(&loop), 0);

	/* In a set-group-ID directory the file would take the directory's
	 * group: the default is still the server's own. */
	if (geteuid() == 0) {
		char dir[64], path[108];
		snprintf(dir, sizeof(dir), "/tmp/sw-server-test-%d-sgid", (int)getpid());
		assert_int_equal(mkdir(dir, 0700), 0);
		assert_int_equal(chown(dir, (uid_t)-1, 4343), 0);
		assert_int_equal(chmod(dir, 02770), 0);
		snprintf(path, sizeof(path), "%s/s.sock", dir);
		env_params(&p);
		p.socket_path = path;
		assert_int_equal(gpud_server_create(&s, &loop, &p, &fake_ops, NULL, g_err,
						    sizeof(g_err)), 0);
		assert_int_equal(gpud_server_listen(s, g_err, sizeof(g_err)), 0);
		assert_int_equal(lstat(path, &st), 0);
		assert_int_equal(st.st_gid, getegid());
		assert_int_equal(st.st_mode & 07777, 0660);
		gpud_server_close(s);
		uv_run(&loop, UV_RUN_DEFAULT);
		gpud_server_destroy(s);
		assert_int_equal(rmdir(dir), 0);
	}

	/* Modes the server refuses. */
	env_params(&p);
	p.socket_path = "/tmp/sw-server-test-never.sock";
	static const uint32_t bad[] = { 0400, 0200, 01660, 0066 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		p.socket_mode = bad[i];
		assert_int_equal(gpud_server_create(&s, &loop, &p, &fake_ops, NULL, g_err,
						    sizeof(g_err)), -EINVAL);
		assert_non_null(strstr(g_err, "socket_mode"));
	}
	p.socket_mode = 0660;
	p.n_allowed_uids = GPUD_SERVER_MAX_IDS + 1;
	assert_int_equal(gpud_server_create(&s, &loop, &p, &fake_ops, NULL, g_err, sizeof(g_err)),
			 -EINVAL);

	/* A group the server may not give the file: a clear error, no file
	 * left behind. Only a non-root user can be refused: the child
	 * becomes 65534 and asks for group 4242. */
	if (geteuid() == 0) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			char path[108], msg[SW_ERR_MAX];
			uv_loop_t cl; /* not the parent's (its epoll is shared) */
			if (setgroups(0, NULL) || setgid(65534) || setuid(65534) || uv_loop_init(&cl))
				_exit(2);
			snprintf(path, sizeof(path), "/tmp/sw-server-test-%d-grp.sock", (int)getpid());
			env_params(&p);
			p.socket_path = path;
			p.socket_gid = 4242;
			if (gpud_server_create(&s, &cl, &p, &fake_ops, NULL, msg, sizeof(msg)))
				_exit(3);
			int rc = gpud_server_listen(s, msg, sizeof(msg));
			bool gone = access(path, F_OK) != 0;
			if (rc == -EPERM && strstr(msg, "group 4242") &&
			    strstr(msg, "gpud.socket_group") && gone)
				_exit(0);
			fprintf(stderr, "listen: %d %s (file %s)\n", rc, msg, gone ? "gone" : "left");
			_exit(4);
		}
		int wst;
		assert_int_equal(waitpid(pid, &wst, 0), pid);
		assert_true(WIFEXITED(wst));
		assert_int_equal(WEXITSTATUS(wst), 0);
	}
	assert_int_equal(uv_loop_close(&loop), 0);
}

/* The handle-in-storage region calls the server relies on (proto/shm.h). */
static void test_shm_in_storage(void **state)
{
	(void)state;
	_Alignas(16) uint8_t hs[PROTO_SHM_STORAGE + 16], rs[PROTO_RING_STORAGE + 16];
	struct proto_shm *shm = (void *)1;
	struct proto_ring *r = (void *)1;
	assert_int_equal(proto_shm_create_in(NULL, sizeof(hs), &shm, 4096, 4096, g_err,
					     sizeof(g_err)),
			 -EINVAL);
	assert_null(shm);
	assert_int_equal(proto_shm_create_in(hs, PROTO_SHM_STORAGE - 1, &shm, 4096, 4096, g_err,
					     sizeof(g_err)),
			 -EINVAL);
	assert_int_equal(proto_shm_create_in(hs + 8, sizeof(hs) - 8, &shm, 4096, 4096, g_err,
					     sizeof(g_err)),
			 -EINVAL);
	assert_int_equal(proto_shm_create_in(hs, sizeof(hs), &shm, 1000, 4096, g_err,
					     sizeof(g_err)),
			 -EINVAL); /* the old checks still apply */
	assert_int_equal(proto_shm_create_in(hs, sizeof(hs), &shm, 4096, 4096, g_err,
					     sizeof(g_err)),
			 0);
	assert_ptr_equal(shm, (void *)hs);
	assert_int_equal(proto_shm_ring_in(rs + 4, sizeof(rs) - 4, shm, PROTO_RING_PRODUCER, &r,
					   g_err, sizeof(g_err)),
			 -EINVAL);
	assert_null(r);
	assert_int_equal(proto_shm_ring_in(rs, sizeof(rs), NULL, PROTO_RING_PRODUCER, &r, g_err,
					   sizeof(g_err)),
			 -EINVAL);
	assert_int_equal(proto_shm_ring_in(rs, sizeof(rs), shm, PROTO_RING_PRODUCER, &r, g_err,
					   sizeof(g_err)),
			 0);
	assert_ptr_equal(r, (void *)rs);
	assert_int_equal(proto_ring_push(r, PROTO_T_DONE, 7, "x", 1), 0);
	/* A consumer on a second, malloc'd handle sees the record. */
	struct proto_ring *cons;
	assert_int_equal(proto_shm_ring(shm, PROTO_RING_CONSUMER, &cons, g_err, sizeof(g_err)), 0);
	struct proto_record rec;
	uint8_t buf[16];
	assert_int_equal(proto_ring_pop(cons, &rec, buf, sizeof(buf)), 0);
	assert_int_equal(rec.request_id, 7);
	proto_ring_close(cons);
	proto_ring_close(r);     /* frees nothing (ASan/valgrind would see it) */
	proto_shm_destroy(shm);  /* unmaps and closes, frees nothing */
}

int main(void)
{
	/* As in gpud: writes to a socket whose peer left must not kill us. */
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream_and_quick_requests),
		cmocka_unit_test(test_version_mismatch),
		cmocka_unit_test(test_bad_frames),
		cmocka_unit_test(test_duplicate_id_and_cancel),
		cmocka_unit_test(test_limits_and_close_cancels),
		cmocka_unit_test(test_slow_client),
		cmocka_unit_test(test_staging_delivers_in_order),
		cmocka_unit_test(test_staging_lp_in_order),
		cmocka_unit_test(test_drain),
		cmocka_unit_test(test_many_connections),
		cmocka_unit_test(test_socket_file),
		cmocka_unit_test(test_socket_mode_group),
		cmocka_unit_test(test_descriptor_closes),
		cmocka_unit_test(test_no_malloc_on_requests),
		cmocka_unit_test(test_ring_full_paths),
		cmocka_unit_test(test_close_with_requests),
		cmocka_unit_test(test_corrupt_tail),
		cmocka_unit_test(test_peer_policy),
		cmocka_unit_test(test_shm_in_storage),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
