/* client_test.c - the gpud client library (proto/client.h) against a fake
 * gpud: a thread that listens on a temporary Unix socket, answers HELLO
 * with a real region (proto_shm_create), decodes requests from the
 * request area with the proto codecs and answers through the response
 * ring and doorbell frames. What the fake does with a generation request
 * is chosen by its first segment's text:
 *
 *   anything else  max_tokens tokens (ids 1000+i, text "t<i> ") in
 *                  batches of two, then DONE with fixed usage
 *   "error"        ERROR -EINVAL "fake: bad sampling"
 *   "hold"         one TOKENS batch (id 42, "held "), then nothing until
 *                  CANCEL, answered with ERROR SW_ECANCELED
 *   "slow"         nothing until CANCEL
 *   "close"        one TOKENS batch, then the fake shuts the socket
 *   "corrupt"      the fake writes a corrupt ring head and rings
 *   "badtokens"    a TOKENS record that does not decode, then as "slow"
 *   "frameerr"     an ERROR frame (aux SW_EBUSY) with no ring record
 *   "odd"          a record of an unknown type, one for an unknown id,
 *                  then the normal answer
 *   "garbage"      eight records of random reply types and bytes, then
 *                  the normal answer
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/err.h"
#include "common/time.h"
#include "proto/client.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/shm.h"

#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

static bool slow_host(void)
{
	return RUNNING_ON_VALGRIND || getenv("SWARM_UNDER_VALGRIND");
}

/* --- the fake gpud -------------------------------------------------------- */

enum hello_mode {
	HELLO_OK = 0,
	HELLO_BAD_FRAME_VERSION, /* ERROR frame written in protocol version 2 */
	HELLO_ERROR_AUX,         /* version-1 ERROR frame with aux SW_EVERSION */
	HELLO_SILENT,            /* never answers */
};

/* The fake runs on its own thread, where a cmocka assertion must not
 * fire: it counts what went wrong and the test checks the count. */
#define FAKE_OK(fk, expr)                   \
	do {                                \
		if ((expr) != 0)            \
			(fk)->bad++;        \
	} while (0)

#define FAKE_MAX_HELD 64
#define FAKE_MAX_SEEN 4096

struct fake {
	char path[108];
	int lsock;
	atomic_int csock;
	pthread_t th;
	enum hello_mode hello;
	size_t ring_cap;
	size_t req_size;
	struct proto_shm *shm;
	struct proto_ring *ring;
	struct proto_submit *sub; /* decode storage */

	atomic_int n_submit;
	atomic_int n_cancel;
	atomic_uint_fast64_t last_cancel_id;
	/* Written by the fake thread; read after it is joined (or, for the
	 * last submit's fields, after the client saw its reply). */
	uint64_t held[FAKE_MAX_HELD];
	int n_held;
	uint64_t seen[FAKE_MAX_SEEN];
	int n_seen;
	int bad;
	uint32_t last_n_segments;
	uint32_t last_max_tokens;
	uint32_t last_n_stop;
	uint32_t last_flags;
	bool last_has_mask;
	char last_seg0[32];
};

static void fake_push(struct fake *fk, uint16_t type, uint64_t id, const void *p, size_t len)
{
	int rc;
	for (int tries = 0; (rc = proto_ring_push(fk->ring, type, id, p, len)) == SW_EBUSY;
	     tries++) {
		if (tries > 20000) {
			fk->bad++;
			return;
		}
		sw_sleep_ms(1);
	}
	if (rc) {
		fk->bad++;
		return;
	}
	struct proto_frame f;
	proto_frame_init(&f, type, id);
	f.flags = PROTO_F_RING;
	proto_send_frame(atomic_load(&fk->csock), &f, -1);
}

static void fake_error(struct fake *fk, uint64_t id, int code, const char *msg)
{
	uint8_t buf[512];
	size_t len;
	FAKE_OK(fk, proto_error_encode(buf, sizeof(buf), code, msg, &len));
	fake_push(fk, PROTO_T_ERROR, id, buf, len);
}

static void fake_tokens(struct fake *fk, uint64_t id, const int32_t *ids, uint32_t n,
			const char *text)
{
	uint8_t buf[512];
	size_t len;
	FAKE_OK(fk, proto_tokens_encode(buf, sizeof(buf), ids, n, text,
					     (uint32_t)strlen(text), &len));
	fake_push(fk, PROTO_T_TOKENS, id, buf, len);
}

static void fake_json(struct fake *fk, uint16_t type, uint64_t id, const char *json)
{
	uint8_t buf[512];
	size_t len;
	FAKE_OK(fk, proto_json_encode(buf, sizeof(buf), json, (uint32_t)strlen(json),
					   &len));
	fake_push(fk, type, id, buf, len);
}

static bool text_is(const struct proto_segment *s, const char *word)
{
	return s->len == strlen(word) && memcmp(s->text, word, s->len) == 0;
}

static void fake_generate(struct fake *fk, uint64_t id, const struct proto_submit_req *req)
{
	uint32_t prompt = 0;
	for (uint32_t i = 0; i < req->n_segments; i++)
		prompt += req->segments[i].len;
	for (uint32_t i = 0; i < req->max_tokens; i += 2) {
		int32_t ids[2];
		char text[64] = "";
		uint32_t n = req->max_tokens - i < 2 ? 1 : 2;
		for (uint32_t k = 0; k < n; k++) {
			ids[k] = (int32_t)(1000 + i + k);
			size_t at = strlen(text);
			snprintf(text + at, sizeof(text) - at, "t%u ", i + k);
		}
		fake_tokens(fk, id, ids, n, text);
	}
	struct proto_done d = {
		.prompt_tokens = prompt,
		.cached_prompt_tokens = prompt / 2,
		.generated_tokens = req->max_tokens,
		.stop_reason = 3,
		.queue_us = 11,
		.prefill_us = 22,
		.decode_us = 33,
		.total_us = 66,
	};
	uint8_t buf[PROTO_DONE_SIZE];
	size_t len;
	FAKE_OK(fk, proto_done_encode(buf, sizeof(buf), &d, &len));
	fake_push(fk, PROTO_T_DONE, id, buf, len);
}

/* Returns false when the fake should stop serving. */
static bool fake_submit(struct fake *fk, const struct proto_frame *f, const uint8_t *payload)
{
	char err[SW_ERR_MAX];
	if (proto_submit_decode(payload, f->payload_length, NULL, fk->sub, err, sizeof(err))) {
		fake_error(fk, f->request_id, SW_EFORMAT, err);
		fk->bad++;
		return true;
	}
	const struct proto_submit_req *req = &fk->sub->req;
	fk->last_n_segments = req->n_segments;
	fk->last_max_tokens = req->max_tokens;
	fk->last_n_stop = req->n_stop;
	fk->last_flags = req->flags;
	fk->last_has_mask = req->mask && req->mask->rows;
	memset(fk->last_seg0, 0, sizeof(fk->last_seg0));
	if (req->n_segments)
		memcpy(fk->last_seg0, req->segments[0].text,
		       req->segments[0].len < 31 ? req->segments[0].len : 31);
	if (fk->n_seen < FAKE_MAX_SEEN)
		fk->seen[fk->n_seen++] = f->request_id;
	atomic_fetch_add(&fk->n_submit, 1);

	const struct proto_segment *s0 = &req->segments[0];
	if (text_is(s0, "error")) {
		fake_error(fk, f->request_id, -EINVAL, "fake: bad sampling");
	} else if (text_is(s0, "hold") || text_is(s0, "slow")) {
		if (text_is(s0, "hold")) {
			int32_t id42 = 42;
			fake_tokens(fk, f->request_id, &id42, 1, "held ");
		}
		if (fk->n_held < FAKE_MAX_HELD)
			fk->held[fk->n_held++] = f->request_id;
	} else if (text_is(s0, "close")) {
		int32_t id7 = 7;
		fake_tokens(fk, f->request_id, &id7, 1, "bye ");
		shutdown(atomic_load(&fk->csock), SHUT_RDWR);
		return false;
	} else if (text_is(s0, "badtokens")) {
		/* A TOKENS record too short to decode; then wait for the
		 * client's CANCEL (answered, and dropped by the client). */
		uint8_t junk[3] = { 1, 2, 3 };
		fake_push(fk, PROTO_T_TOKENS, f->request_id, junk, sizeof(junk));
		if (fk->n_held < FAKE_MAX_HELD)
			fk->held[fk->n_held++] = f->request_id;
	} else if (text_is(s0, "frameerr")) {
		/* An ERROR frame without a ring record. */
		struct proto_frame e;
		proto_frame_init(&e, PROTO_T_ERROR, f->request_id);
		e.aux = (uint32_t)-SW_EBUSY;
		FAKE_OK(fk, proto_send_frame(atomic_load(&fk->csock), &e, -1));
	} else if (text_is(s0, "odd")) {
		/* A record type from the future and a record for an id that
		 * does not exist, then a normal answer. */
		uint8_t x[8] = { 0 };
		fake_push(fk, 200, f->request_id, x, sizeof(x));
		int32_t id9 = 9;
		fake_tokens(fk, f->request_id + 100000, &id9, 1, "stray ");
		fake_generate(fk, f->request_id, req);
	} else if (text_is(s0, "garbage")) {
		/* Records of every reply type with random payloads (the ring
		 * stays well-formed): whatever the client makes of the first
		 * one, it must end the request once and drop the rest. */
		static const uint16_t types[] = {
			PROTO_T_TOKENS, PROTO_T_DONE, PROTO_T_ERROR, PROTO_T_TOKENIZE_REPLY,
			PROTO_T_EMBED_REPLY, PROTO_T_STATS_REPLY, PROTO_T_MEM_REPLY,
			PROTO_T_DETOKENIZE_REPLY,
		};
		uint64_t x = f->request_id * 0x9e3779b97f4a7c15ull + 1;
		for (int k = 0; k < 8; k++) {
			uint8_t junk[64];
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			size_t len = (size_t)(x % sizeof(junk));
			for (size_t b = 0; b < len; b++) {
				x ^= x << 13, x ^= x >> 7, x ^= x << 17;
				junk[b] = (uint8_t)(x >> 24);
			}
			if (len >= 8 && (x & 1)) /* plausible counts now and then */
				memset(junk, 0, 8);
			fake_push(fk, types[(x >> 8) % 7], f->request_id, junk, len);
		}
		fake_generate(fk, f->request_id, req);
	} else if (text_is(s0, "corrupt")) {
		/* A head that is not a multiple of 16: the consumer must
		 * refuse it. */
		uint8_t *ctl = proto_shm_base(fk->shm) + proto_shm_layout(fk->shm)->ring_off;
		_Atomic uint64_t *head = (_Atomic uint64_t *)ctl;
		atomic_store(head, atomic_load(head) + 7);
		struct proto_frame d;
		proto_frame_init(&d, PROTO_T_TOKENS, f->request_id);
		d.flags = PROTO_F_RING;
		proto_send_frame(atomic_load(&fk->csock), &d, -1);
	} else {
		fake_generate(fk, f->request_id, req);
	}
	return true;
}

static void fake_cancel(struct fake *fk, uint64_t id)
{
	atomic_store(&fk->last_cancel_id, id);
	atomic_fetch_add(&fk->n_cancel, 1);
	for (int i = 0; i < fk->n_held; i++) {
		if (fk->held[i] == id) {
			fk->held[i] = fk->held[--fk->n_held];
			fake_error(fk, id, SW_ECANCELED, "cancelled");
			return;
		}
	}
}

static void fake_text_req(struct fake *fk, const struct proto_frame *f, const uint8_t *payload)
{
	struct proto_text_req tr;
	char err[SW_ERR_MAX];
	if (proto_text_req_decode(f->type, payload, f->payload_length, NULL, &tr, err,
				  sizeof(err))) {
		fk->bad++;
		fake_error(fk, f->request_id, SW_EFORMAT, err);
		return;
	}
	uint8_t buf[2048];
	size_t len;
	if (f->type == PROTO_T_TOKENIZE) {
		/* One id per byte, BOS (1) first when asked. */
		int32_t ids[256];
		uint32_t n = 0;
		if (tr.flags & PROTO_TOK_ADD_BOS)
			ids[n++] = 1;
		for (uint32_t i = 0; i < tr.len && n < 256; i++)
			ids[n++] = (uint8_t)tr.text[i];
		FAKE_OK(fk, proto_tokens_encode(buf, sizeof(buf), ids, n, NULL, 0, &len));
		fake_push(fk, PROTO_T_TOKENIZE_REPLY, f->request_id, buf, len);
	} else if (f->type == PROTO_T_DETOKENIZE) {
		/* The inverse: each id's low byte, "<S>" for 1 when asked. */
		char text[1024];
		uint32_t n = 0;
		for (uint32_t i = 0; i < tr.len / 4 && n + 3 < sizeof(text); i++) {
			uint32_t id = proto_get32((const uint8_t *)tr.text + 4 * i);
			if (id == 1 && (tr.flags & PROTO_DETOK_SPECIAL)) {
				memcpy(text + n, "<S>", 3);
				n += 3;
			} else if (id != 1) {
				text[n++] = (char)(id & 0xff);
			}
		}
		FAKE_OK(fk, proto_tokens_encode(buf, sizeof(buf), NULL, 0, text, n, &len));
		fake_push(fk, PROTO_T_DETOKENIZE_REPLY, f->request_id, buf, len);
	} else {
		float v[3] = { (float)tr.len, tr.len ? (float)(uint8_t)tr.text[0] : 0.0f, -0.5f };
		FAKE_OK(fk, proto_embedding_encode(buf, sizeof(buf), v, 3, &len));
		fake_push(fk, PROTO_T_EMBED_REPLY, f->request_id, buf, len);
	}
}

static bool fake_hello(struct fake *fk, int cs)
{
	uint8_t buf[PROTO_FRAME_SIZE];
	struct proto_frame f;
	char err[SW_ERR_MAX];
	if (proto_recv_frame(cs, buf, NULL) ||
	    proto_frame_decode(buf, sizeof(buf), &f, err, sizeof(err)) ||
	    f.type != PROTO_T_HELLO) {
		fk->bad++;
		return false;
	}
	if (fk->hello == HELLO_SILENT)
		return true; /* keep reading until the client gives up */
	if (fk->hello != HELLO_OK) {
		proto_frame_init(&f, PROTO_T_ERROR, 0);
		f.aux = (uint32_t)-SW_EVERSION;
		if (fk->hello == HELLO_BAD_FRAME_VERSION)
			f.version = 2;
		proto_send_frame(cs, &f, -1);
		return false;
	}
	if (proto_shm_create(&fk->shm, fk->ring_cap, fk->req_size, err, sizeof(err)) ||
	    proto_shm_ring(fk->shm, PROTO_RING_PRODUCER, &fk->ring, err, sizeof(err))) {
		fk->bad++;
		return false;
	}
	proto_frame_init(&f, PROTO_T_HELLO_REPLY, 0);
	f.payload_length = proto_shm_layout(fk->shm)->size;
	FAKE_OK(fk, proto_send_frame(cs, &f, proto_shm_fd(fk->shm)));
	return true;
}

static void *fake_main(void *arg)
{
	struct fake *fk = arg;
	int cs = accept4(fk->lsock, NULL, NULL, SOCK_CLOEXEC);
	if (cs < 0)
		return NULL;
	atomic_store(&fk->csock, cs);
	if (!fake_hello(fk, cs))
		goto out_drain;
	const struct proto_shm_layout *l = fk->shm ? proto_shm_layout(fk->shm) : NULL;
	for (;;) {
		uint8_t buf[PROTO_FRAME_SIZE];
		struct proto_frame f;
		char err[SW_ERR_MAX];
		if (proto_recv_frame(cs, buf, NULL))
			break;
		if (proto_frame_decode(buf, sizeof(buf), &f, err, sizeof(err))) {
			fk->bad++;
			continue;
		}
		if (!l)
			continue; /* silent HELLO: read until EOF */
		const void *payload = NULL;
		if (proto_frame_payload(&f, proto_shm_base(fk->shm), l->req_off, l->req_size,
					&payload, err, sizeof(err))) {
			fk->bad++;
			fake_error(fk, f.request_id, SW_EFORMAT, err);
			continue;
		}
		switch (f.type) {
		case PROTO_T_SUBMIT:
			if (!fake_submit(fk, &f, payload))
				goto out_drain;
			break;
		case PROTO_T_CANCEL:
			fake_cancel(fk, f.request_id);
			break;
		case PROTO_T_TOKENIZE:
		case PROTO_T_EMBED:
		case PROTO_T_DETOKENIZE:
			fake_text_req(fk, &f, payload);
			break;
		case PROTO_T_STATS:
			fake_json(fk, PROTO_T_STATS_REPLY, f.request_id, "{\"requests\":7}");
			break;
		case PROTO_T_MEM: {
			uint32_t flags = 0;
			char json[64];
			if (proto_mem_req_decode(payload, f.payload_length, &flags, err,
						 sizeof(err)))
				fk->bad++;
			snprintf(json, sizeof(json), "{\"flags\":%u}", flags);
			fake_json(fk, PROTO_T_MEM_REPLY, f.request_id, json);
			break;
		}
		default:
			fk->bad++;
		}
	}
	return NULL;
out_drain:
	/* Wait for the client to go (EOF or our own shutdown). */
	for (;;) {
		uint8_t buf[PROTO_FRAME_SIZE];
		if (proto_recv_frame(cs, buf, NULL))
			break;
	}
	return NULL;
}

static int g_fake_seq;

static struct fake *fake_start(enum hello_mode hello, size_t ring_cap, size_t req_size)
{
	struct fake *fk = calloc(1, sizeof(*fk));
	assert_non_null(fk);
	fk->sub = malloc(sizeof(*fk->sub));
	assert_non_null(fk->sub);
	fk->hello = hello;
	fk->ring_cap = ring_cap;
	fk->req_size = req_size;
	atomic_store(&fk->csock, -1);
	snprintf(fk->path, sizeof(fk->path), "/tmp/swarm-client-test-%d-%d.sock", (int)getpid(),
		 g_fake_seq++);
	unlink(fk->path);
	fk->lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fk->lsock >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", fk->path);
	assert_int_equal(bind(fk->lsock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fk->lsock, 8), 0);
	assert_int_equal(pthread_create(&fk->th, NULL, fake_main, fk), 0);
	return fk;
}

/* Stops the fake (shutting its sockets unblocks accept and recv), joins
 * it and returns how many unexpected things it saw. */
static int fake_stop(struct fake *fk)
{
	shutdown(fk->lsock, SHUT_RDWR);
	int cs = atomic_load(&fk->csock);
	if (cs >= 0)
		shutdown(cs, SHUT_RDWR);
	pthread_join(fk->th, NULL);
	int bad = fk->bad;
	cs = atomic_load(&fk->csock);
	if (cs >= 0)
		close(cs);
	close(fk->lsock);
	unlink(fk->path);
	proto_ring_close(fk->ring);
	proto_shm_destroy(fk->shm);
	free(fk->sub);
	free(fk);
	return bad;
}

/* --- client-side helpers ---------------------------------------------------- */

static char g_err[SW_ERR_MAX];

static struct proto_client *connect_ok(struct fake *fk, const struct proto_client_opts *o)
{
	struct proto_client *c = NULL;
	int rc = proto_client_connect(&c, fk->path, o, g_err, sizeof(g_err));
	if (rc)
		fail_msg("connect: %s (%s)", sw_errname(rc), g_err);
	assert_non_null(c);
	return c;
}

static void one_segment(struct proto_submit_req *req, struct proto_segment *seg,
			const char *text, size_t len, uint32_t max_tokens)
{
	memset(req, 0, sizeof(*req));
	seg->text = text;
	seg->len = (uint32_t)len;
	seg->role = PROTO_ROLE_NONE;
	seg->flags = 0;
	req->n_segments = 1;
	req->segments = seg;
	req->max_tokens = max_tokens;
	req->sampling.top_p = 1.0f;
	req->sampling.repeat_penalty = 1.0f;
}

/* The text the fake generates for n tokens. */
static void expected_text(uint32_t n, char *out, size_t cap)
{
	out[0] = '\0';
	for (uint32_t i = 0; i < n; i++) {
		size_t at = strlen(out);
		snprintf(out + at, cap - at, "t%u ", i);
	}
}

/* What one streamed request saw. */
struct stream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t id;
	int n_batches;
	int32_t ids[64];
	uint32_t n_ids;
	char text[512];
	int n_done;
	int status;
	bool had_usage;
	struct proto_done usage;
	char msg[PROTO_MAX_ERROR_MSG];
	int cancel_on_tokens; /* on_tokens returns this */
	pthread_t done_thread;
};

static void stream_init(struct stream *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
}

static void stream_fini(struct stream *s)
{
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
}

static int on_tokens(void *arg, uint64_t id, const struct proto_tokens *t)
{
	struct stream *s = arg;
	pthread_mutex_lock(&s->mu);
	s->id = id;
	s->n_batches++;
	for (uint32_t i = 0; i < t->n_ids && s->n_ids < 64; i++)
		s->ids[s->n_ids++] = proto_tokens_id(t, i);
	size_t at = strlen(s->text);
	if (at + t->text_len < sizeof(s->text)) {
		memcpy(s->text + at, t->text, t->text_len);
		s->text[at + t->text_len] = '\0';
	}
	pthread_cond_broadcast(&s->cv);
	int r = s->cancel_on_tokens;
	pthread_mutex_unlock(&s->mu);
	return r;
}

static void on_done(void *arg, uint64_t id, int status, const struct proto_done *usage,
		    const char *msg)
{
	struct stream *s = arg;
	pthread_mutex_lock(&s->mu);
	s->id = id;
	s->n_done++;
	s->status = status;
	s->had_usage = usage != NULL;
	if (usage)
		s->usage = *usage;
	snprintf(s->msg, sizeof(s->msg), "%s", msg ? msg : "(null)");
	s->done_thread = pthread_self();
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Waits (a hang guard of a minute, not a timing assertion) until the
 * stream has ended, or has seen its first batch. */
static void stream_wait(struct stream *s, bool for_done)
{
	uint64_t give_up = sw_now_ms() + 60000;
	pthread_mutex_lock(&s->mu);
	while (for_done ? s->n_done == 0 : s->n_batches == 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		if (sw_now_ms() > give_up) {
			pthread_mutex_unlock(&s->mu);
			fail_msg("stream %llu never %s", (unsigned long long)s->id,
				 for_done ? "ended" : "started");
		}
	}
	pthread_mutex_unlock(&s->mu);
}

static int submit_stream(struct proto_client *c, const char *text, uint32_t max_tokens,
			 struct stream *s, uint64_t *id)
{
	struct proto_submit_req req;
	struct proto_segment seg;
	one_segment(&req, &seg, text, strlen(text), max_tokens);
	struct proto_client_events ev = { .on_tokens = on_tokens, .on_done = on_done, .arg = s };
	return proto_client_submit(c, &req, &ev, id, g_err, sizeof(g_err));
}

/* Polls an atomic counter of the fake until it reaches n (hang guard). */
static void wait_count(atomic_int *v, int n)
{
	uint64_t give_up = sw_now_ms() + 60000;
	while (atomic_load(v) < n) {
		if (sw_now_ms() > give_up)
			fail_msg("counter stuck at %d, want %d", atomic_load(v), n);
		sw_sleep_ms(1);
	}
}

/* Waits until the fake has accepted its connection (hang guard). */
static void wait_count_fd(struct fake *fk)
{
	uint64_t give_up = sw_now_ms() + 60000;
	while (atomic_load(&fk->csock) < 0) {
		if (sw_now_ms() > give_up)
			fail_msg("the fake never accepted");
		sw_sleep_ms(1);
	}
}

/* --- tests ------------------------------------------------------------------ */

static void test_connect_generate_stream(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	assert_true(proto_client_alive(c));
	assert_int_equal(proto_client_server_pid(c), getpid());

	/* Two chat segments, a descriptor where G does not see segment 0,
	 * a stop string. */
	struct proto_segment seg[2] = {
		{ .text = "system text", .len = 11, .role = PROTO_ROLE_SYSTEM },
		{ .text = "question", .len = 8, .role = PROTO_ROLE_USER },
	};
	uint16_t r0[] = { 0 }, r1[] = { 0, 1 }, rg[] = { 1 };
	struct proto_mask_row rows[3] = { { r0, 1 }, { r1, 2 }, { rg, 1 } };
	struct proto_mask_desc mask = { .n_segments = 2, .rows = rows };
	struct proto_text stop = { .p = "END", .len = 3 };
	struct proto_submit_req req = {
		.n_segments = 2,
		.segments = seg,
		.mask = &mask,
		.max_tokens = 5,
		.flags = PROTO_SUBMIT_CHAT,
		.n_stop = 1,
		.stop = &stop,
	};
	req.sampling.top_p = 1.0f;
	req.sampling.repeat_penalty = 1.0f;

	struct stream s;
	stream_init(&s);
	struct proto_client_events ev = { .on_tokens = on_tokens, .on_done = on_done, .arg = &s };
	uint64_t id = 0;
	assert_int_equal(proto_client_submit(c, &req, &ev, &id, g_err, sizeof(g_err)), 0);
	assert_int_equal(id, 1);
	stream_wait(&s, true);

	assert_int_equal(s.n_done, 1);
	assert_int_equal(s.status, 0);
	assert_int_equal(s.id, 1);
	assert_string_equal(s.msg, "");
	assert_int_equal(s.n_batches, 3); /* 2 + 2 + 1 */
	assert_int_equal(s.n_ids, 5);
	for (uint32_t i = 0; i < 5; i++)
		assert_int_equal(s.ids[i], 1000 + (int32_t)i);
	assert_string_equal(s.text, "t0 t1 t2 t3 t4 ");
	assert_true(s.had_usage);
	assert_int_equal(s.usage.prompt_tokens, 19);
	assert_int_equal(s.usage.cached_prompt_tokens, 9);
	assert_int_equal(s.usage.generated_tokens, 5);
	assert_int_equal(s.usage.stop_reason, 3);
	assert_int_equal(s.usage.queue_us, 11);
	assert_int_equal(s.usage.prefill_us, 22);
	assert_int_equal(s.usage.decode_us, 33);
	assert_int_equal(s.usage.total_us, 66);

	/* What the fake decoded from the request area. */
	assert_int_equal(fk->last_n_segments, 2);
	assert_int_equal(fk->last_max_tokens, 5);
	assert_int_equal(fk->last_n_stop, 1);
	assert_int_equal(fk->last_flags, PROTO_SUBMIT_CHAT);
	assert_true(fk->last_has_mask);
	assert_string_equal(fk->last_seg0, "system text");

	/* The finished id is gone. */
	assert_int_equal(proto_client_cancel(c, id), SW_ENOTFOUND);

	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&s);
}

static void test_generate_blocking(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct proto_submit_req req;
	struct proto_segment seg;
	struct proto_client_result res;
	char want[256];

	for (uint32_t n = 0; n < 4; n++) {
		one_segment(&req, &seg, "hello world", 11, n * 3);
		assert_int_equal(proto_client_generate(c, &req, &res, g_err, sizeof(g_err)), 0);
		expected_text(n * 3, want, sizeof(want));
		assert_non_null(res.text);
		assert_string_equal(res.text, want);
		assert_int_equal(res.text_len, strlen(want));
		assert_int_equal(res.n_ids, n * 3);
		for (uint32_t i = 0; i < res.n_ids; i++)
			assert_int_equal(res.ids[i], 1000 + (int32_t)i);
		assert_int_equal(res.usage.prompt_tokens, 11);
		assert_int_equal(res.usage.generated_tokens, n * 3);
		proto_client_result_free(&res);
		assert_null(res.text);
		assert_null(res.ids);
	}
	proto_client_result_free(NULL);

	/* Bad arguments never reach gpud. */
	assert_int_equal(proto_client_generate(c, NULL, &res, g_err, sizeof(g_err)), -EINVAL);
	assert_int_equal(proto_client_generate(NULL, &req, &res, g_err, sizeof(g_err)), -EINVAL);
	assert_int_equal(proto_client_generate(c, &req, NULL, g_err, sizeof(g_err)), -EINVAL);
	struct proto_client_events no_done = { 0 };
	assert_int_equal(proto_client_submit(c, &req, &no_done, NULL, g_err, sizeof(g_err)),
			 -EINVAL);
	/* A request the codec refuses (a role without the chat flag). */
	seg.role = PROTO_ROLE_USER;
	int rc = proto_client_generate(c, &req, &res, g_err, sizeof(g_err));
	assert_int_equal(rc, SW_EFORMAT);
	proto_client_result_free(&res);
	assert_int_equal(atomic_load(&fk->n_submit), 4);

	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_tokenize_embed_stats_mem(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	int32_t *ids = NULL;
	uint32_t n = 0;

	assert_int_equal(proto_client_tokenize(c, "abc", 3, PROTO_TOK_ADD_BOS, &ids, &n, g_err,
					       sizeof(g_err)), 0);
	assert_int_equal(n, 4);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 'a');
	assert_int_equal(ids[3], 'c');
	free(ids);
	assert_int_equal(proto_client_tokenize(c, "", 0, 0, &ids, &n, g_err, sizeof(g_err)), 0);
	assert_int_equal(n, 0);
	assert_null(ids);
	assert_int_equal(proto_client_tokenize(c, "x", 1, 0x80, &ids, &n, g_err, sizeof(g_err)),
			 -EINVAL);

	/* detokenize: the ids travel little-endian, the text comes back */
	const int32_t back[] = { 1, 'a', 'b', 'c' };
	char *text = NULL;
	size_t tlen = 0;
	assert_int_equal(proto_client_detokenize(c, back, 4, 0, &text, &tlen, g_err,
						 sizeof(g_err)), 0);
	assert_int_equal(tlen, 3);
	assert_string_equal(text, "abc");
	free(text);
	assert_int_equal(proto_client_detokenize(c, back, 4, PROTO_DETOK_SPECIAL, &text, &tlen,
						 g_err, sizeof(g_err)), 0);
	assert_string_equal(text, "<S>abc");
	free(text);
	assert_int_equal(proto_client_detokenize(c, NULL, 0, 0, &text, &tlen, g_err,
						 sizeof(g_err)), 0);
	assert_string_equal(text, "");
	assert_int_equal(tlen, 0);
	free(text);
	assert_int_equal(proto_client_detokenize(c, back, 1, 0x2, &text, &tlen, g_err,
						 sizeof(g_err)), -EINVAL);
	assert_null(text);
	assert_int_equal(proto_client_detokenize(c, NULL, 1, 0, &text, &tlen, g_err,
						 sizeof(g_err)), -EINVAL);

	float *vec = NULL;
	uint32_t dim = 0;
	assert_int_equal(proto_client_embed(c, "zebra", 5, &vec, &dim, g_err, sizeof(g_err)), 0);
	assert_int_equal(dim, 3);
	assert_true(vec[0] == 5.0f);
	assert_true(vec[1] == (float)'z');
	assert_true(vec[2] == -0.5f);
	free(vec);

	char *json = NULL;
	assert_int_equal(proto_client_stats(c, &json, g_err, sizeof(g_err)), 0);
	assert_string_equal(json, "{\"requests\":7}");
	free(json);
	assert_int_equal(proto_client_mem(c, PROTO_MEM_DUMP_OWNERS, &json, g_err, sizeof(g_err)),
			 0);
	assert_string_equal(json, "{\"flags\":1}");
	free(json);
	assert_int_equal(proto_client_mem(c, 0, &json, g_err, sizeof(g_err)), 0);
	assert_string_equal(json, "{\"flags\":0}");
	free(json);
	assert_int_equal(proto_client_mem(c, 0x10, &json, g_err, sizeof(g_err)), -EINVAL);
	assert_null(json);
	assert_int_equal(proto_client_stats(c, NULL, g_err, sizeof(g_err)), -EINVAL);

	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_error_reply(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct proto_submit_req req;
	struct proto_segment seg;
	struct proto_client_result res;

	one_segment(&req, &seg, "error", 5, 4);
	g_err[0] = '\0';
	assert_int_equal(proto_client_generate(c, &req, &res, g_err, sizeof(g_err)), -EINVAL);
	assert_non_null(strstr(g_err, "fake: bad sampling"));
	assert_int_equal(res.n_ids, 0);
	proto_client_result_free(&res);

	struct stream s;
	stream_init(&s);
	uint64_t id;
	assert_int_equal(submit_stream(c, "error", 4, &s, &id), 0);
	stream_wait(&s, true);
	assert_int_equal(s.n_done, 1);
	assert_int_equal(s.status, -EINVAL);
	assert_false(s.had_usage);
	assert_string_equal(s.msg, "fake: bad sampling");
	assert_int_equal(s.id, id);
	assert_true(proto_client_alive(c));

	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&s);
}

static void test_version_mismatch(void **state)
{
	enum hello_mode modes[2] = { HELLO_BAD_FRAME_VERSION, HELLO_ERROR_AUX };
	for (int i = 0; i < 2; i++) {
		struct fake *fk = fake_start(modes[i], 4096, 4096);
		struct proto_client *c = (struct proto_client *)&c; /* must be reset */
		g_err[0] = '\0';
		assert_int_equal(proto_client_connect(&c, fk->path, NULL, g_err, sizeof(g_err)),
				 SW_EVERSION);
		assert_null(c);
		assert_non_null(strstr(g_err, "version"));
		if (modes[i] == HELLO_BAD_FRAME_VERSION)
			assert_non_null(strstr(g_err, "version 2, this client version 1"));
		else
			assert_non_null(strstr(g_err, "refused protocol version 1"));
		assert_int_equal(fake_stop(fk), 0);
	}
}

static void test_not_listening(void **state)
{
	struct proto_client *c = NULL;
	char path[108];
	snprintf(path, sizeof(path), "/tmp/swarm-client-test-%d-none.sock", (int)getpid());
	unlink(path);
	assert_int_equal(proto_client_connect(&c, path, NULL, g_err, sizeof(g_err)), -ENOENT);
	assert_null(c);
	assert_non_null(strstr(g_err, "gpud not running?"));
	assert_non_null(strstr(g_err, path));

	/* A socket file nobody listens on. */
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(proto_client_connect(&c, path, NULL, g_err, sizeof(g_err)),
			 -ECONNREFUSED);
	assert_null(c);
	assert_non_null(strstr(g_err, "gpud not running?"));
	close(s);
	unlink(path);

	assert_int_equal(proto_client_connect(&c, NULL, NULL, g_err, sizeof(g_err)), -EINVAL);
	char longpath[200];
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = '\0';
	assert_int_equal(proto_client_connect(&c, longpath, NULL, g_err, sizeof(g_err)),
			 -ENAMETOOLONG);
	proto_client_close(NULL);
	assert_false(proto_client_alive(NULL));
}

/* Open descriptors of this process (to prove a failed connect leaks none). */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void test_region_too_large(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client_opts o;
	proto_client_opts_default(&o);
	o.max_region = 4096;
	struct proto_client *c = NULL;
	int before = count_fds();
	assert_int_equal(proto_client_connect(&c, fk->path, &o, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	assert_null(c);
	assert_non_null(strstr(g_err, "region"));
	/* The fake's accepted socket and its own memfd are the only new
	 * descriptors: the client closed its socket and its copy of the
	 * region's memfd. */
	wait_count_fd(fk);
	assert_int_equal(count_fds(), before + 2);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_connect_timeout(void **state)
{
	struct fake *fk = fake_start(HELLO_SILENT, 4096, 4096);
	struct proto_client_opts o;
	proto_client_opts_default(&o);
	o.timeout_ms = 100;
	struct proto_client *c = NULL;
	assert_int_equal(proto_client_connect(&c, fk->path, &o, g_err, sizeof(g_err)), SW_EBUSY);
	assert_null(c);
	assert_non_null(strstr(g_err, "HELLO"));
	assert_int_equal(fake_stop(fk), 0);
}

static void test_server_closes_midstream(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct stream s[4];
	uint64_t ids[4];
	for (int i = 0; i < 4; i++) {
		stream_init(&s[i]);
		assert_int_equal(submit_stream(c, i < 3 ? "hold" : "close", 8, &s[i], &ids[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		stream_wait(&s[i], true);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(s[i].n_done, 1);
		assert_int_equal(s[i].status, SW_ECLOSED);
		assert_false(s[i].had_usage);
		assert_int_equal(s[i].n_batches, 1);
		assert_int_equal(s[i].id, ids[i]);
		assert_non_null(strstr(s[i].msg, "closed"));
	}
	assert_false(proto_client_alive(c));

	/* Everything later fails at once. */
	struct proto_submit_req req;
	struct proto_segment seg;
	struct proto_client_result res;
	one_segment(&req, &seg, "x", 1, 1);
	assert_int_equal(proto_client_generate(c, &req, &res, g_err, sizeof(g_err)), SW_ECLOSED);
	proto_client_result_free(&res);
	struct stream late;
	stream_init(&late);
	uint64_t id = 99;
	assert_int_equal(submit_stream(c, "x", 1, &late, &id), SW_ECLOSED);
	assert_int_equal(id, 0);
	char *json = NULL;
	assert_int_equal(proto_client_stats(c, &json, g_err, sizeof(g_err)), SW_ECLOSED);
	assert_int_equal(proto_client_cancel(c, ids[0]), SW_ECLOSED);

	proto_client_close(c);
	/* No callback ran twice, none for the refused submit. */
	for (int i = 0; i < 4; i++) {
		assert_int_equal(s[i].n_done, 1);
		stream_fini(&s[i]);
	}
	assert_int_equal(late.n_done, 0);
	stream_fini(&late);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_cancel(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct stream s;
	stream_init(&s);
	uint64_t id;
	assert_int_equal(submit_stream(c, "hold", 8, &s, &id), 0);
	stream_wait(&s, false);
	assert_int_equal(proto_client_cancel(c, id), 0);
	stream_wait(&s, true);
	assert_int_equal(s.status, SW_ECANCELED);
	assert_string_equal(s.msg, "cancelled");
	assert_int_equal(s.n_ids, 1);
	assert_int_equal(s.ids[0], 42);
	assert_int_equal(atomic_load(&fk->n_cancel), 1);
	assert_int_equal(atomic_load(&fk->last_cancel_id), id);

	assert_int_equal(proto_client_cancel(c, id), SW_ENOTFOUND);
	assert_int_equal(proto_client_cancel(c, 12345), SW_ENOTFOUND);
	assert_int_equal(proto_client_cancel(NULL, 1), -EINVAL);
	assert_int_equal(atomic_load(&fk->n_cancel), 1);

	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
	assert_int_equal(s.n_done, 1);
	stream_fini(&s);
}

/* A callback that tries a blocking call and a submit on its own
 * connection. */
struct reentrant {
	struct proto_client *c;
	int blocking_rc;
	int submit_rc;
	struct stream inner;
	struct stream outer;
};

static void on_done_reentrant(void *arg, uint64_t id, int status,
			      const struct proto_done *usage, const char *msg)
{
	struct reentrant *r = arg;
	char *json = NULL;
	char err[SW_ERR_MAX];
	r->blocking_rc = proto_client_stats(r->c, &json, err, sizeof(err));
	free(json);
	struct proto_submit_req req;
	struct proto_segment seg;
	one_segment(&req, &seg, "inner", 5, 2);
	struct proto_client_events ev = { .on_tokens = on_tokens, .on_done = on_done,
					  .arg = &r->inner };
	r->submit_rc = proto_client_submit(r->c, &req, &ev, NULL, err, sizeof(err));
	on_done(&r->outer, id, status, usage, msg);
}

static void test_callback_reentry(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct reentrant r = { .c = c, .blocking_rc = 1, .submit_rc = 1 };
	stream_init(&r.inner);
	stream_init(&r.outer);
	struct proto_submit_req req;
	struct proto_segment seg;
	one_segment(&req, &seg, "outer", 5, 1);
	struct proto_client_events ev = { .on_done = on_done_reentrant, .arg = &r };
	assert_int_equal(proto_client_submit(c, &req, &ev, NULL, g_err, sizeof(g_err)), 0);
	stream_wait(&r.outer, true);
	assert_int_equal(r.outer.status, 0);
	assert_int_equal(r.blocking_rc, -EDEADLK);
	/* A submit from a callback works when there is room. */
	assert_int_equal(r.submit_rc, 0);
	stream_wait(&r.inner, true);
	assert_int_equal(r.inner.status, 0);
	assert_string_equal(r.inner.text, "t0 t1 ");
	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&r.inner);
	stream_fini(&r.outer);
}

static int on_tokens_submit(void *arg, uint64_t id, const struct proto_tokens *t)
{
	struct reentrant *r = arg;
	struct proto_submit_req req;
	struct proto_segment seg;
	char err[SW_ERR_MAX];
	one_segment(&req, &seg, "inner", 5, 2);
	struct proto_client_events ev = { .on_done = on_done, .arg = &r->inner };
	r->submit_rc = proto_client_submit(r->c, &req, &ev, NULL, err, sizeof(err));
	return 1; /* and cancel the held request */
}

static void on_done_outer(void *arg, uint64_t id, int status, const struct proto_done *usage,
			  const char *msg)
{
	struct reentrant *r = arg;
	on_done(&r->outer, id, status, usage, msg);
}

static void test_callback_submit_no_room(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client_opts o;
	proto_client_opts_default(&o);
	o.max_inflight = 1;
	struct proto_client *c = connect_ok(fk, &o);
	struct reentrant r = { .c = c, .submit_rc = 1 };
	stream_init(&r.inner);
	stream_init(&r.outer);
	struct proto_submit_req req;
	struct proto_segment seg;
	one_segment(&req, &seg, "hold", 4, 8);
	struct proto_client_events ev = { .on_tokens = on_tokens_submit, .on_done = on_done_outer,
					  .arg = &r };
	assert_int_equal(proto_client_submit(c, &req, &ev, NULL, g_err, sizeof(g_err)), 0);
	stream_wait(&r.outer, true);
	/* The only table entry was the running request's: no waiting on
	 * the reader thread, SW_EBUSY at once. */
	assert_int_equal(r.submit_rc, SW_EBUSY);
	assert_int_equal(r.outer.status, SW_ECANCELED);
	proto_client_close(c);
	assert_int_equal(r.inner.n_done, 0);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&r.inner);
	stream_fini(&r.outer);
}

static void test_on_tokens_cancels(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct stream s;
	stream_init(&s);
	s.cancel_on_tokens = 1;
	uint64_t id;
	assert_int_equal(submit_stream(c, "hold", 8, &s, &id), 0);
	stream_wait(&s, true);
	assert_int_equal(s.n_done, 1);
	assert_int_equal(s.status, SW_ECANCELED);
	assert_int_equal(s.n_batches, 1);
	assert_int_equal(atomic_load(&fk->n_cancel), 1);
	assert_int_equal(atomic_load(&fk->last_cancel_id), id);
	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&s);
}

static void test_too_long(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 1024, 1);
	struct proto_client *c = connect_ok(fk, NULL);
	size_t big = 8192;
	char *text = malloc(big);
	assert_non_null(text);
	memset(text, 'a', big);
	struct proto_submit_req req;
	struct proto_segment seg;
	one_segment(&req, &seg, text, big, 4);
	struct stream s;
	stream_init(&s);
	struct proto_client_events ev = { .on_tokens = on_tokens, .on_done = on_done, .arg = &s };
	uint64_t id = 5;
	assert_int_equal(proto_client_submit(c, &req, &ev, &id, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	assert_int_equal(id, 0);
	assert_non_null(strstr(g_err, "request area"));
	int32_t *ids;
	uint32_t n;
	assert_int_equal(proto_client_tokenize(c, text, big, 0, &ids, &n, g_err, sizeof(g_err)),
			 SW_ETOOLONG);

	/* The connection is fine afterwards. */
	struct proto_client_result res;
	one_segment(&req, &seg, text, 100, 2);
	assert_int_equal(proto_client_generate(c, &req, &res, g_err, sizeof(g_err)), 0);
	assert_string_equal(res.text, "t0 t1 ");
	proto_client_result_free(&res);

	proto_client_close(c);
	assert_int_equal(s.n_done, 0);
	assert_int_equal(atomic_load(&fk->n_submit), 1);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&s);
	free(text);
}

/* --- many threads on one connection ------------------------------------------ */

struct worker {
	struct proto_client *c;
	int thread;
	int n;
	int failures;
	uint64_t ids[64];
	int n_ids;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char text[700];
	char want[256];
	for (int j = 0; j < w->n; j++) {
		/* 300..640 bytes: a few fit in the small request area at once. */
		size_t len = 300 + (size_t)((w->thread * 37 + j * 11) % 341);
		memset(text, 'a' + w->thread, len);
		uint32_t max_tokens = (uint32_t)((w->thread + j) % 5 + 1);
		struct proto_submit_req req;
		struct proto_segment seg;
		one_segment(&req, &seg, text, len, max_tokens);
		expected_text(max_tokens, want, sizeof(want));
		char err[SW_ERR_MAX];
		if (j % 2 == 0) {
			struct proto_client_result res;
			int rc = proto_client_generate(w->c, &req, &res, err, sizeof(err));
			if (rc || strcmp(res.text, want) || res.usage.prompt_tokens != len ||
			    res.n_ids != max_tokens)
				w->failures++;
			proto_client_result_free(&res);
		} else {
			struct stream s;
			stream_init(&s);
			struct proto_client_events ev = { .on_tokens = on_tokens,
							  .on_done = on_done, .arg = &s };
			uint64_t id = 0;
			if (proto_client_submit(w->c, &req, &ev, &id, err, sizeof(err))) {
				w->failures++;
			} else {
				stream_wait(&s, true);
				if (s.status || s.n_done != 1 || strcmp(s.text, want) ||
				    s.usage.prompt_tokens != len || s.id != id)
					w->failures++;
				if (w->n_ids < 64)
					w->ids[w->n_ids++] = id;
			}
			stream_fini(&s);
		}
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void test_concurrent_submits(void **state)
{
	/* Ring of 1 KiB and the smallest request area (the rest of one page,
	 * about 2.8 KiB): requests wait for area room, the table of 4
	 * entries, and the fake waits for ring room. */
	struct fake *fk = fake_start(HELLO_OK, 1024, 1);
	struct proto_client_opts o;
	proto_client_opts_default(&o);
	o.max_inflight = 4;
	struct proto_client *c = connect_ok(fk, &o);

	enum { THREADS = 8 };
	int per = slow_host() ? 4 : 12;
	struct worker w[THREADS];
	pthread_t th[THREADS];
	for (int i = 0; i < THREADS; i++) {
		w[i] = (struct worker){ .c = c, .thread = i, .n = per };
		assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(w[i].failures, 0);
	}
	assert_true(proto_client_alive(c));
	proto_client_close(c);
	assert_int_equal(atomic_load(&fk->n_submit), THREADS * per);

	/* Ids unique over the connection, 1..N. */
	int n = fk->n_seen;
	assert_int_equal(n, THREADS * per);
	uint64_t *seen = malloc((size_t)n * sizeof(*seen));
	assert_non_null(seen);
	memcpy(seen, fk->seen, (size_t)n * sizeof(*seen));
	qsort(seen, (size_t)n, sizeof(*seen), cmp_u64);
	for (int i = 0; i < n; i++)
		assert_int_equal(seen[i], (uint64_t)i + 1);
	free(seen);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_corrupt_ring(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct stream s[2];
	uint64_t ids[2];
	stream_init(&s[0]);
	stream_init(&s[1]);
	assert_int_equal(submit_stream(c, "hold", 8, &s[0], &ids[0]), 0);
	stream_wait(&s[0], false);
	assert_int_equal(submit_stream(c, "corrupt", 8, &s[1], &ids[1]), 0);
	stream_wait(&s[0], true);
	stream_wait(&s[1], true);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(s[i].n_done, 1);
		assert_int_equal(s[i].status, SW_ECLOSED);
		assert_non_null(strstr(s[i].msg, "corrupt response ring"));
	}
	assert_false(proto_client_alive(c));
	int32_t *tids;
	uint32_t n;
	assert_int_equal(proto_client_tokenize(c, "a", 1, 0, &tids, &n, g_err, sizeof(g_err)),
			 SW_ECLOSED);
	assert_non_null(strstr(g_err, "corrupt"));
	proto_client_close(c);
	assert_int_equal(s[0].n_done, 1);
	assert_int_equal(s[1].n_done, 1);
	assert_int_equal(fake_stop(fk), 0);
	stream_fini(&s[0]);
	stream_fini(&s[1]);
}

static void test_odd_replies(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct stream s[3];
	uint64_t ids[3];
	const char *modes[3] = { "badtokens", "frameerr", "odd" };
	for (int i = 0; i < 3; i++) {
		stream_init(&s[i]);
		assert_int_equal(submit_stream(c, modes[i], 3, &s[i], &ids[i]), 0);
		stream_wait(&s[i], true);
		assert_int_equal(s[i].n_done, 1);
		assert_int_equal(s[i].id, ids[i]);
	}
	/* An undecodable record ends its request and cancels it at gpud. */
	assert_int_equal(s[0].status, SW_EFORMAT);
	assert_int_equal(s[0].n_batches, 0);
	wait_count(&fk->n_cancel, 1);
	assert_int_equal(atomic_load(&fk->last_cancel_id), ids[0]);
	/* A frame-level ERROR carries its code in aux. */
	assert_int_equal(s[1].status, SW_EBUSY);
	/* Unknown record types and ids are skipped. */
	assert_int_equal(s[2].status, 0);
	assert_string_equal(s[2].text, "t0 t1 t2 ");
	assert_true(proto_client_alive(c));

	/* The connection still works. */
	char *json = NULL;
	assert_int_equal(proto_client_stats(c, &json, g_err, sizeof(g_err)), 0);
	free(json);
	proto_client_close(c);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(s[i].n_done, 1);
		stream_fini(&s[i]);
	}
	assert_int_equal(fake_stop(fk), 0);
}

static void test_garbage_records(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	enum { N = 40 };
	struct stream *s = calloc(N, sizeof(*s));
	assert_non_null(s);
	for (int i = 0; i < N; i++) {
		stream_init(&s[i]);
		assert_int_equal(submit_stream(c, "garbage", 2, &s[i], NULL), 0);
	}
	for (int i = 0; i < N; i++)
		stream_wait(&s[i], true);
	/* A blocking call of each kind through the same noise. */
	struct proto_submit_req req;
	struct proto_segment seg;
	struct proto_client_result res;
	one_segment(&req, &seg, "garbage", 7, 2);
	int rc = proto_client_generate(c, &req, &res, g_err, sizeof(g_err));
	assert_true(rc <= 0);
	proto_client_result_free(&res);
	assert_true(proto_client_alive(c));
	char *json = NULL;
	assert_int_equal(proto_client_stats(c, &json, g_err, sizeof(g_err)), 0);
	assert_string_equal(json, "{\"requests\":7}");
	free(json);
	proto_client_close(c);
	int n_format = 0;
	for (int i = 0; i < N; i++) {
		assert_int_equal(s[i].n_done, 1);
		assert_true(s[i].status <= 0);
		n_format += s[i].status == SW_EFORMAT;
		stream_fini(&s[i]);
	}
	free(s);
	/* The bytes are fixed (seeded by request id): most records do not
	 * decode, or are the wrong reply type for a generation. */
	assert_true(n_format > 0);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_generate_timeout(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client_opts o;
	proto_client_opts_default(&o);
	o.timeout_ms = 100;
	struct proto_client *c = connect_ok(fk, &o);
	struct proto_submit_req req;
	struct proto_segment seg;
	struct proto_client_result res;
	one_segment(&req, &seg, "slow", 4, 4);
	assert_int_equal(proto_client_generate(c, &req, &res, g_err, sizeof(g_err)), SW_EBUSY);
	assert_non_null(strstr(g_err, "cancelled"));
	proto_client_result_free(&res);
	/* The fake sees the cancel and ends the request; the client drops
	 * that late reply, and the connection goes on. */
	wait_count(&fk->n_cancel, 1);
	one_segment(&req, &seg, "fast", 4, 1);
	assert_int_equal(proto_client_generate(c, &req, &res, g_err, sizeof(g_err)), 0);
	assert_string_equal(res.text, "t0 ");
	proto_client_result_free(&res);
	proto_client_close(c);
	assert_int_equal(fake_stop(fk), 0);
}

static void test_close_with_inflight(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct stream s[2];
	for (int i = 0; i < 2; i++) {
		stream_init(&s[i]);
		assert_int_equal(submit_stream(c, "hold", 8, &s[i], NULL), 0);
		stream_wait(&s[i], false);
	}
	proto_client_close(c);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(s[i].n_done, 1);
		assert_int_equal(s[i].status, SW_ECLOSED);
		assert_true(pthread_equal(s[i].done_thread, pthread_self()));
		stream_fini(&s[i]);
	}
	assert_int_equal(fake_stop(fk), 0);
}

struct blocked {
	struct proto_client *c;
	int rc;
};

static void *blocked_main(void *arg)
{
	struct blocked *b = arg;
	struct proto_submit_req req;
	struct proto_segment seg;
	struct proto_client_result res;
	char err[SW_ERR_MAX];
	one_segment(&req, &seg, "slow", 4, 4);
	b->rc = proto_client_generate(b->c, &req, &res, err, sizeof(err));
	proto_client_result_free(&res);
	return NULL;
}

static void test_close_wakes_blocked_caller(void **state)
{
	struct fake *fk = fake_start(HELLO_OK, 4096, 65536);
	struct proto_client *c = connect_ok(fk, NULL);
	struct blocked b = { .c = c, .rc = 1 };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, blocked_main, &b), 0);
	wait_count(&fk->n_submit, 1);
	proto_client_close(c);
	pthread_join(th, NULL);
	assert_int_equal(b.rc, SW_ECLOSED);
	assert_int_equal(fake_stop(fk), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connect_generate_stream),
		cmocka_unit_test(test_generate_blocking),
		cmocka_unit_test(test_tokenize_embed_stats_mem),
		cmocka_unit_test(test_error_reply),
		cmocka_unit_test(test_version_mismatch),
		cmocka_unit_test(test_not_listening),
		cmocka_unit_test(test_region_too_large),
		cmocka_unit_test(test_connect_timeout),
		cmocka_unit_test(test_server_closes_midstream),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_on_tokens_cancels),
		cmocka_unit_test(test_callback_reentry),
		cmocka_unit_test(test_callback_submit_no_room),
		cmocka_unit_test(test_too_long),
		cmocka_unit_test(test_concurrent_submits),
		cmocka_unit_test(test_corrupt_ring),
		cmocka_unit_test(test_odd_replies),
		cmocka_unit_test(test_garbage_records),
		cmocka_unit_test(test_generate_timeout),
		cmocka_unit_test(test_close_with_inflight),
		cmocka_unit_test(test_close_wakes_blocked_caller),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
