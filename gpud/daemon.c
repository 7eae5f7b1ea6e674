/* daemon.c - `gpud serve` (gpud/daemon.h): start-up, device workers, the
 * service the server calls, signals and shutdown.
 *
 * Threads:
 *   loop    the libuv loop: server, signals, timers, and every service op
 *           (submit, embed, cancel, tokenize, stats, mem). Single-threaded,
 *           so its scratch (token buffer, tokenizer arena, chat buffers,
 *           stats snapshot) is one set on the daemon.
 *   device  one per device: steps the scheduler, runs queued embeddings
 *           inside gpud_sched_device_exec, samples its pools for the
 *           watchdog, and sleeps in gpud_sched_wait when idle.
 * Locks: the scheduler's (taken inside gpud_sched_*; its callbacks run
 * under it), one mutex per device (its mask cache, embed queue and pool
 * sample), one for the watchdog. Order: scheduler before device before
 * watchdog; nothing calls gpud_sched_* while holding a device mutex.
 *
 * Memory: everything is reserved before warm-up; the request path uses the
 * server's slots (struct req_priv in each slot's priv area), the device's
 * embed job slots and the loop scratch. Nothing here allocates after
 * warm-up except the owner dump's file (open(2), no malloc).
 */
#include "gpud/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/arena.h"
#include "common/err.h"
#include "common/log.h"
#include "gpud/alloc.h"
#include "gpud/backend.h"
#include "gpud/engine.h"
#include "gpud/mask.h"
#include "gpud/maskcache.h"
#include "gpud/memwatch.h"
#include "gpud/metrics.h"
#include "gpud/model.h"
#include "gpud/scheduler.h"
#include "gpud/server.h"
#include "gpud/stats.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define EMBED_SLOTS 8          /* queued + running embeddings per device */
#define IDLE_WAIT_MS 100       /* device thread sleep when idle */
#define POLL_MS 50             /* shutdown: in-flight check period */
#define WARMUP_TIMEOUT_S 120
#define DUMP_BUF (64u << 10)
#define MAX_TEXT_CAP (1u << 20) /* text of one request at most */

enum req_kind { REQ_SUBMIT = 1, REQ_EMBED = 2 };

/* Per-request service state, in the server slot's priv area (zeroed at
 * accept). Written by the loop before the request reaches a device. */
struct req_priv {
	struct gpud_daemon *d;
	struct gpud_sreq *r;
	struct gpud_maskcache_entry *mask; /* pinned in dev's cache, or NULL (causal) */
	uint64_t sched_id;
	double t0;
	uint32_t dev;
	uint32_t job;                      /* REQ_EMBED: slot in dev's jobs */
	enum req_kind kind;
	int reply_err;                     /* a token batch the server refused */
};

struct embed_job {
	struct gpud_sreq *r;   /* owner; NULL with !warmup: the slot is free */
	bool busy;             /* taken (being filled, queued or running) */
	bool queued;           /* ready for the device thread */
	bool running;
	bool cancelled;
	bool warmup;
	uint64_t seq;          /* FIFO order */
	uint32_t n_tokens;
	int32_t *tokens;       /* (n_ctx) */
	float *out;            /* (dim) */
	int rc;
	char err[160];
};

struct device {
	struct gpud_daemon *d;
	uint32_t idx;
	char name[16];         /* "cpu0" */
	struct gpud_engine *engine;
	pthread_mutex_t lock;  /* masks, jobs, n_jobs, job_seq, sample */
	struct gpud_maskcache *masks;
	struct embed_job jobs[EMBED_SLOTS];
	uint32_t n_jobs;
	uint64_t job_seq;
	pthread_t thread;
	bool started;
	int wd_kv, wd_mask;    /* watchdog pool ids */
	/* Last sample taken by the device thread (under lock). */
	struct gpud_engine_stats est;
	struct gpud_maskcache_stats mst;
	uint32_t mask_high;
	uint64_t step_errors;
	uint64_t embeds;
};

struct gpud_daemon {
	struct sw_config cfg;
	struct gpud_model *model;
	const struct gpud_tokenizer *tok;
	enum gpud_chat_template tmpl;
	uint32_t n_ctx, dim, n_dev, block_tokens;
	uint64_t kv_block_bytes;
	struct gpud_plan plan;
	struct device dev[SW_CONFIG_MAX_DEVICES];
	struct gpud_sched *sched;
	struct gpud_memwatch *watch;
	pthread_mutex_t watch_lock;
	atomic_bool stopping;

	uv_loop_t loop;
	bool loop_ok;
	struct gpud_server *server;
	uv_signal_t sig_term, sig_int, sig_usr1;
	uv_timer_t poll_timer, deadline_timer;
	uv_timer_t sample_timer;   /* the server's pools, for the watchdog */
	int wd_req, wd_conn;       /* watchdog ids of server.requests / .connections */
	bool handles_ok;
	atomic_bool draining;  /* SIGTERM seen (read by device threads) */
	bool finishing;
	struct gpud_metrics *metrics;

	/* Loop-thread scratch. */
	int32_t *ids;                       /* (n_ctx) */
	uint32_t seg_tokens[PROTO_MAX_SEGMENTS];
	struct sw_arena tok_arena;
	char *fmt, *copy;
	struct gpud_segtok_scratch segtok;
	uint32_t max_text;
	char stop_buf[PROTO_MAX_STOP][PROTO_MAX_STOP_LEN + 1];
	const char *stop_ptr[PROTO_MAX_STOP];
	struct gpud_stats_snapshot snap;
	char *dump_buf;
	size_t dump_len;
	int dump_fd;
	bool dump_failed;
	char dump_path[SW_CONFIG_PATH_MAX + 64];
	double last_rate_t;
	uint64_t last_rate_gen;
	double rate;

	/* Counters (device threads and loop). */
	atomic_uint_fast64_t completed, errors, cancelled, embeds;
	atomic_uint_fast64_t tok_prompt, tok_cached, tok_generated;
	atomic_uint warm_left;
	double t_start;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t now_ms(void)
{
	return (uint64_t)(now_s() * 1000.0);
}

/* --- device workers --------------------------------------------------------- */

static int embed_fn(struct gpud_engine *e, void *arg)
{
	struct embed_job *j = arg;

	return gpud_engine_embed_tokens(e, j->tokens, j->n_tokens, j->out, j->err, sizeof(j->err));
}

/* Runs every queued embedding of dv, oldest first. Returns how many ran. */
static int run_jobs(struct device *dv)
{
	struct gpud_daemon *d = dv->d;
	int ran = 0;

	for (;;) {
		struct embed_job *j = NULL;
		struct gpud_sreq *r;
		bool cancelled, warmup;
		int rc;

		pthread_mutex_lock(&dv->lock);
		for (uint32_t i = 0; i < EMBED_SLOTS; i++) {
			struct embed_job *c = &dv->jobs[i];
			if (c->queued && !c->running && (!j || c->seq < j->seq))
				j = c;
		}
		if (j)
			j->running = true;
		pthread_mutex_unlock(&dv->lock);
		if (!j)
			return ran;

		j->err[0] = '\0';
		/* The pool may be full of prefix-cache blocks: make room first. */
		rc = gpud_sched_device_exec_blocks(d->sched, dv->idx,
						   (j->n_tokens + d->block_tokens - 1) /
						   d->block_tokens, embed_fn, j);
		pthread_mutex_lock(&dv->lock);
		r = j->r;
		cancelled = j->cancelled;
		warmup = j->warmup;
		pthread_mutex_unlock(&dv->lock);
		if (warmup) {
			if (rc)
				log_error("%s: warm-up embedding: %s", dv->name,
					  j->err[0] ? j->err : sw_strerror(rc));
			atomic_fetch_sub(&d->warm_left, 1);
		} else if (cancelled) {
			atomic_fetch_add(&d->cancelled, 1);
			gpud_sreq_error(r, SW_ECANCELED, atomic_load(&d->draining) ?
					"cancelled: gpud is shutting down" : "cancelled");
		} else if (rc) {
			atomic_fetch_add(&d->errors, 1);
			gpud_sreq_error(r, rc, j->err[0] ? j->err : sw_strerror(rc));
		} else {
			atomic_fetch_add(&d->embeds, 1);
			gpud_sreq_embedding(r, j->out, d->dim);
		}
		pthread_mutex_lock(&dv->lock);
		j->r = NULL;
		j->busy = j->queued = j->running = j->cancelled = j->warmup = false;
		dv->n_jobs--;
		dv->embeds++;
		pthread_mutex_unlock(&dv->lock);
		ran++;
	}
}

/* Inside gpud_sched_device_exec: the engine is ours, its numbers steady. */
static int sample_fn(struct gpud_engine *e, void *arg)
{
	struct device *dv = arg;
	struct gpud_daemon *d = dv->d;
	struct gpud_engine_stats st;
	struct gpud_maskcache_stats ms;
	uint64_t t = now_ms();

	gpud_engine_stats(e, &st);
#ifdef SW_DEBUG
	/* O(1) per-step accounting check (DESIGN §2); the full check is
	 * gpud_engine_check / gpud_maskcache_check. */
	if (st.kv.used + st.kv.free != st.kv.n_blocks) {
		log_error("%s: KV pool accounting broken: used %u + free %u != %u", dv->name,
			  st.kv.used, st.kv.free, st.kv.n_blocks);
		abort();
	}
#endif
	pthread_mutex_lock(&dv->lock);
	gpud_maskcache_stats(dv->masks, &ms);
#ifdef SW_DEBUG
	if (ms.pool_used + ms.pool_free != ms.pool_capacity) {
		log_error("%s: mask pool accounting broken: used %u + free %u != %u", dv->name,
			  ms.pool_used, ms.pool_free, ms.pool_capacity);
		abort();
	}
#endif
	dv->est = st;
	dv->mst = ms;
	if (ms.pool_used > dv->mask_high)
		dv->mask_high = ms.pool_used;
	pthread_mutex_unlock(&dv->lock);
	pthread_mutex_lock(&d->watch_lock);
	gpud_memwatch_sample(d->watch, dv->wd_kv, t, st.kv.used);
	gpud_memwatch_sample(d->watch, dv->wd_mask, t, ms.pool_used);
	pthread_mutex_unlock(&d->watch_lock);
	return 0;
}

static void *device_main(void *arg)
{
	struct device *dv = arg;
	struct gpud_daemon *d = dv->d;
	double last_err = 0, last_sample = 0;
	char err[256];

	gpud_alloc_set_role(GPUD_ALLOC_DEVICE);
	while (!atomic_load(&d->stopping)) {
		int n = gpud_sched_step(d->sched, dv->idx, err, sizeof(err));
		int jobs = run_jobs(dv);
		double t = now_s();

		if (n < 0) {
			dv->step_errors++;
			if (t - last_err > 1.0) { /* one line a second at most */
				log_error("%s: step failed: %s (%" PRIu64 " failures so far)", dv->name,
					  err[0] ? err : sw_strerror(n), dv->step_errors);
				last_err = t;
			}
		}
		/* Every step while busy (the debug check is per step), and at
		 * least every idle wait so the watchdog sees the quiet times. */
		if (n > 0 || jobs > 0 || t - last_sample >= IDLE_WAIT_MS / 1000.0) {
			gpud_sched_device_exec(d->sched, dv->idx, sample_fn, dv);
			last_sample = t;
		}
		if (n <= 0 && jobs == 0)
			gpud_sched_wait(d->sched, dv->idx, IDLE_WAIT_MS);
	}
	return NULL;
}

/* --- scheduler callbacks ------------------------------------------------------ */

static uint32_t stop_reason(const struct gpud_sched_event *ev)
{
	if (ev->reason == GPUD_GEN_STOP_CONTEXT)
		return GPUD_STOP_MAX_TOKENS; /* the context ran out: a token limit */
	if (ev->reason == GPUD_GEN_STOP_CALLER)
		return PROTO_STOP_CANCELED;
	return (uint32_t)ev->reason;
}

static uint64_t us(double s)
{
	return s > 0 ? (uint64_t)(s * 1e6) : 0;
}

/* Device thread (or the canceller), scheduler lock held. */
static int on_event(void *arg, const struct gpud_sched_event *ev)
{
	struct req_priv *p = arg;
	struct gpud_daemon *d = p->d;
	struct gpud_sreq *r = p->r;

	if (ev->kind == GPUD_SCHED_TOKEN) {
		/* SW_EBUSY (the client stopped reading) or SW_ECLOSED: stop it. */
		p->reply_err = gpud_sreq_tokens(r, &ev->token, 1, ev->text, ev->len);
		return p->reply_err ? 1 : 0;
	}

	if (p->mask) {
		struct device *dv = &d->dev[p->dev];
		pthread_mutex_lock(&dv->lock);
		gpud_maskcache_release(p->mask);
		pthread_mutex_unlock(&dv->lock);
		p->mask = NULL;
	}
	atomic_fetch_add(&d->tok_prompt, ev->usage.n_prompt);
	atomic_fetch_add(&d->tok_cached, ev->usage.n_cached);
	atomic_fetch_add(&d->tok_generated, ev->usage.n_gen);
	if (ev->status == 0 && p->reply_err) {
		atomic_fetch_add(&d->errors, 1);
		gpud_sreq_error(r, p->reply_err, p->reply_err == SW_EBUSY ?
				"client is not reading its ring" : "connection closed");
	} else if (ev->status == 0) {
		struct proto_done u = {
			.prompt_tokens = ev->usage.n_prompt,
			.cached_prompt_tokens = ev->usage.n_cached <= ev->usage.n_prompt ?
						ev->usage.n_cached : ev->usage.n_prompt,
			.generated_tokens = ev->usage.n_gen,
			.stop_reason = stop_reason(ev),
			.queue_us = us(ev->usage.queue_s),
			.prefill_us = us(ev->usage.prefill_s),
			.decode_us = us(ev->usage.decode_s),
			.total_us = us(now_s() - p->t0),
		};
		atomic_fetch_add(&d->completed, 1);
		gpud_sreq_done(r, &u); /* p is gone after this */
	} else if (ev->status == SW_ECANCELED) {
		atomic_fetch_add(&d->cancelled, 1);
		gpud_sreq_error(r, SW_ECANCELED, atomic_load(&d->draining) ?
				"cancelled: gpud is shutting down" : "cancelled");
	} else {
		atomic_fetch_add(&d->errors, 1);
		gpud_sreq_error(r, ev->status,
				ev->message && ev->message[0] ? ev->message : sw_strerror(ev->status));
	}
	return 0;
}

static int on_warmup_event(void *arg, const struct gpud_sched_event *ev)
{
	struct gpud_daemon *d = arg;

	if (ev->kind == GPUD_SCHED_DONE) {
		if (ev->status)
			log_error("warm-up request failed: %s",
				  ev->message && ev->message[0] ? ev->message : sw_strerror(ev->status));
		atomic_fetch_sub(&d->warm_left, 1);
	}
	return 0;
}

/* --- service ops (loop thread) ---------------------------------------------- */

static int svc_submit(void *svc, struct gpud_sreq *r, const struct proto_submit *ps, char *err,
		      size_t errlen)
{
	struct gpud_daemon *d = svc;
	const struct proto_submit_req *q = &ps->req;
	const struct gpud_mask_desc *desc = q->mask && q->mask->rows ? q->mask : NULL;
	struct req_priv *p = gpud_sreq_priv(r);
	struct gpud_sched_req sr;
	struct device *dv;
	uint32_t n = 0;
	int rc;

	rc = gpud_sampler_params_check(&q->sampling, err, errlen);
	if (rc)
		return rc;
	if (q->n_segments == 0)
		return sw_seterr(err, errlen, -EINVAL, "submit: no segments");
	if (q->n_segments > d->cfg.gpud.max_segments)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "submit: %u segments, at most %u (gpud.max_segments)", q->n_segments,
				 d->cfg.gpud.max_segments);
	if (desc) {
		if (desc->n_segments != q->n_segments)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "mask: descriptor for %u segments, request has %u",
					 desc->n_segments, q->n_segments);
		rc = gpud_mask_validate(desc, d->cfg.gpud.max_segments, err, errlen);
		if (rc)
			return rc;
	}
	if (q->n_stop > PROTO_MAX_STOP)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %u stop strings, at most %d",
				 q->n_stop, PROTO_MAX_STOP);
	rc = gpud_segments_tokenize(d->tok, d->tmpl, q->flags & PROTO_SUBMIT_CHAT, q->segments,
				    q->n_segments, &d->segtok, d->ids, d->n_ctx, d->seg_tokens, &n,
				    err, errlen);
	if (rc == SW_ETOOLONG)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "prompt of %u tokens does not fit the context of %u positions", n,
				 d->n_ctx);
	if (rc)
		return rc;
	if (n == 0)
		return sw_seterr(err, errlen, -EINVAL, "submit: the prompt has no tokens");
	if (n >= d->n_ctx || (uint64_t)n + q->max_tokens > d->n_ctx)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "prompt of %u tokens + max_tokens %u exceeds the context of %u "
				 "positions", n, q->max_tokens, d->n_ctx);

	memset(p, 0, sizeof(*p));
	p->d = d;
	p->r = r;
	p->kind = REQ_SUBMIT;
	p->t0 = now_s();
	p->dev = gpud_sched_pick_device(d->sched, n, q->max_tokens);
	if (p->dev >= d->n_dev)
		p->dev = 0;
	dv = &d->dev[p->dev];
	if (desc) {
		pthread_mutex_lock(&dv->lock);
		rc = gpud_maskcache_get_or_compile(dv->masks, desc, d->seg_tokens, d->block_tokens,
						   &p->mask);
		pthread_mutex_unlock(&dv->lock);
		if (rc == SW_EEXHAUSTED)
			return sw_seterr(err, errlen, SW_EBUSY,
					 "busy: the mask cache of %s is full of masks in use", dv->name);
		if (rc)
			return sw_seterr(err, errlen, rc, "mask: %s", sw_strerror(rc));
	}
	for (uint32_t i = 0; i < q->n_stop; i++) {
		uint32_t len = q->stop[i].len;
		if (len > PROTO_MAX_STOP_LEN)
			len = PROTO_MAX_STOP_LEN;
		memcpy(d->stop_buf[i], q->stop[i].p, len);
		d->stop_buf[i][len] = '\0';
		d->stop_ptr[i] = d->stop_buf[i];
	}
	sr = (struct gpud_sched_req){
		.tokens = d->ids,
		.n_tokens = n,
		.mask = p->mask ? gpud_maskcache_mask(p->mask) : NULL,
		.sampling = q->sampling,
		.max_tokens = q->max_tokens,
		.stop = q->n_stop ? d->stop_ptr : NULL,
		.n_stop = q->n_stop,
		.cb = on_event,
		.arg = p,
		.pin_device = true,
		.device = p->dev,
	};
	/* A fast device may end the request before submit returns; p stays
	 * valid for us since only this thread hands out slots. */
	rc = gpud_sched_submit(d->sched, &sr, &p->sched_id, err, errlen);
	if (rc && p->mask) {
		pthread_mutex_lock(&dv->lock);
		gpud_maskcache_release(p->mask);
		pthread_mutex_unlock(&dv->lock);
		p->mask = NULL;
	}
	return rc;
}

/* The device with a free embed slot and the shortest queue; -1 if none. */
static int embed_device(struct gpud_daemon *d)
{
	int best = -1;
	uint64_t best_load = UINT64_MAX;

	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		uint64_t load;
		uint32_t nj;

		pthread_mutex_lock(&dv->lock);
		nj = dv->n_jobs;
		pthread_mutex_unlock(&dv->lock);
		if (nj >= EMBED_SLOTS)
			continue;
		load = (uint64_t)gpud_sched_queue_depth(d->sched, i) + nj;
		if (load < best_load) {
			best_load = load;
			best = (int)i;
		}
	}
	return best;
}

/* Takes a free job slot of dv (busy, not queued); NULL when full. */
static struct embed_job *job_take(struct device *dv, uint32_t *slot)
{
	struct embed_job *j = NULL;

	pthread_mutex_lock(&dv->lock);
	for (uint32_t i = 0; i < EMBED_SLOTS; i++) {
		if (!dv->jobs[i].busy) {
			j = &dv->jobs[i];
			j->busy = true;
			dv->n_jobs++;
			*slot = i;
			break;
		}
	}
	pthread_mutex_unlock(&dv->lock);
	return j;
}

static void job_queue(struct device *dv, struct embed_job *j, struct gpud_sreq *r, bool warmup)
{
	pthread_mutex_lock(&dv->lock);
	j->r = r;
	j->warmup = warmup;
	j->queued = true;
	j->seq = ++dv->job_seq;
	pthread_mutex_unlock(&dv->lock);
	gpud_sched_wake(dv->d->sched);
}

static void job_drop(struct device *dv, struct embed_job *j)
{
	pthread_mutex_lock(&dv->lock);
	j->r = NULL;
	j->busy = j->queued = j->running = j->cancelled = j->warmup = false;
	dv->n_jobs--;
	pthread_mutex_unlock(&dv->lock);
}

static int svc_embed(void *svc, struct gpud_sreq *r, const struct proto_text_req *req, char *err,
		     size_t errlen)
{
	struct gpud_daemon *d = svc;
	struct req_priv *p = gpud_sreq_priv(r);
	struct embed_job *j;
	struct device *dv;
	size_t n = 0;
	uint32_t slot = 0;
	int di, rc;

	di = embed_device(d);
	if (di < 0)
		return sw_seterr(err, errlen, SW_EBUSY,
				 "busy: %u embeddings queued on every device", EMBED_SLOTS);
	dv = &d->dev[di];
	j = job_take(dv, &slot);
	if (!j)
		return sw_seterr(err, errlen, SW_EBUSY, "busy: no embedding slot on %s", dv->name);
	rc = gpud_tokenizer_encode(d->tok, req->text, req->len, GPUD_TOK_ADD_BOS, j->tokens,
				   d->n_ctx, &n, &d->tok_arena);
	if (rc == SW_ETOOLONG)
		rc = sw_seterr(err, errlen, SW_ETOOLONG,
			       "embed: text of %zu tokens does not fit the context of %u positions",
			       n, d->n_ctx);
	else if (rc == -ENOMEM)
		rc = sw_seterr(err, errlen, SW_ETOOLONG, "embed: text of %u bytes is too long",
			       req->len);
	else if (!rc && n == 0)
		rc = sw_seterr(err, errlen, -EINVAL, "embed: the text has no tokens");
	if (rc) {
		job_drop(dv, j);
		return rc;
	}
	j->n_tokens = (uint32_t)n;
	memset(p, 0, sizeof(*p));
	p->d = d;
	p->r = r;
	p->kind = REQ_EMBED;
	p->dev = (uint32_t)di;
	p->job = slot;
	p->t0 = now_s();
	job_queue(dv, j, r, false);
	return 0;
}

static void svc_cancel(void *svc, struct gpud_sreq *r)
{
	struct gpud_daemon *d = svc;
	struct req_priv *p = gpud_sreq_priv(r);

	if (p->kind == REQ_SUBMIT) {
		/* SW_ENOTFOUND: it ended meanwhile; its end is on its way. */
		gpud_sched_cancel(d->sched, p->sched_id);
	} else if (p->kind == REQ_EMBED) {
		struct device *dv = &d->dev[p->dev];
		struct embed_job *j = &dv->jobs[p->job];
		bool drop = false;

		pthread_mutex_lock(&dv->lock);
		if (j->r == r && j->queued && !j->running) {
			j->r = NULL;
			j->busy = j->queued = false;
			dv->n_jobs--;
			drop = true;
		} else if (j->r == r) {
			j->cancelled = true; /* running: ended by the device thread */
		}
		pthread_mutex_unlock(&dv->lock);
		if (drop) {
			atomic_fetch_add(&d->cancelled, 1);
			gpud_sreq_error(r, SW_ECANCELED, "cancelled");
		}
	}
}

static int svc_tokenize(void *svc, const struct proto_text_req *req, int32_t *ids, uint32_t cap,
			uint32_t *n, char *err, size_t errlen)
{
	struct gpud_daemon *d = svc;
	unsigned flags = 0;
	size_t got = 0;
	int rc;

	if (req->flags & PROTO_TOK_ADD_BOS)
		flags |= GPUD_TOK_ADD_BOS;
	if (req->flags & PROTO_TOK_PARSE_SPECIAL)
		flags |= GPUD_TOK_PARSE_SPECIAL;
	rc = gpud_tokenizer_encode(d->tok, req->text, req->len, flags, ids, cap, &got,
				   &d->tok_arena);
	*n = got > UINT32_MAX ? UINT32_MAX : (uint32_t)got;
	if (rc == SW_ETOOLONG)
		return sw_seterr(err, errlen, SW_ETOOLONG, "tokenize: %zu tokens, room for %u", got,
				 cap);
	if (rc == -ENOMEM)
		return sw_seterr(err, errlen, SW_ETOOLONG, "tokenize: text of %u bytes is too long",
				 req->len);
	if (rc)
		return sw_seterr(err, errlen, rc, "tokenize: %s", sw_strerror(rc));
	return 0;
}

/* --- stats -------------------------------------------------------------------- */

static void server_pool(struct gpud_daemon *d, struct gpud_stats_snapshot *s, const char *name,
			int wid, uint64_t cap, uint64_t used, uint64_t high, uint64_t unit_bytes)
{
	struct gpud_memwatch_status ws;
	struct gpud_stats_pool *p;

	if (s->n_pools >= GPUD_STATS_MAX_POOLS)
		return;
	p = &s->pools[s->n_pools++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->unit = "slots";
	p->unit_bytes = unit_bytes;
	p->capacity = cap;
	p->used = used <= cap ? used : cap;
	p->free = cap - p->used;
	p->high = high;
	p->largest_free_run = p->free;
	p->trough = p->trough_k_ago = p->used;
	pthread_mutex_lock(&d->watch_lock);
	if (gpud_memwatch_status(d->watch, wid, &ws) == 0) {
		p->trough = ws.trough;
		p->trough_k_ago = ws.trough_k_ago;
		p->rising = ws.rising;
		snprintf(p->warning, sizeof(p->warning), "%s", ws.warning ? ws.warning : "");
	}
	pthread_mutex_unlock(&d->watch_lock);
}

static void fill_snapshot(struct gpud_daemon *d, bool mem)
{
	struct gpud_stats_snapshot *s = &d->snap;
	struct gpud_server_stats ss;
	struct gpud_sched_stats sch;
	double t = now_s();
	uint64_t gen;

	memset(s, 0, sizeof(*s));
	s->version = SW_VERSION;
	s->uptime_s = t - d->t_start;
	s->draining = atomic_load(&d->draining);
	gpud_server_stats(d->server, &ss);
	gpud_sched_stats(d->sched, &sch);
	s->requests.admitted = ss.requests;
	s->requests.completed = atomic_load(&d->completed) + atomic_load(&d->embeds);
	s->requests.errors = atomic_load(&d->errors);
	s->requests.cancelled = atomic_load(&d->cancelled);
	s->requests.busy = ss.busy;
	s->requests.refused = ss.refused;
	s->requests.in_flight = ss.in_flight;
	gen = atomic_load(&d->tok_generated);
	s->tokens.prompt = atomic_load(&d->tok_prompt);
	s->tokens.cached_prompt = atomic_load(&d->tok_cached);
	s->tokens.generated = gen;
	if (t - d->last_rate_t >= 1.0) { /* a rate over at least a second */
		d->rate = (double)(gen - d->last_rate_gen) / (t - d->last_rate_t);
		d->last_rate_t = t;
		d->last_rate_gen = gen;
	}
	s->tokens.per_s = d->rate;
	s->connections.open = ss.connections;
	s->connections.high = ss.connections_high;
	s->connections.accepted = ss.accepted;
	s->connections.bad_frames = ss.bad_frames;
	s->connections.stalled = ss.stalled;
	s->alloc_counted = gpud_alloc_hooked();
	s->alloc_warm = gpud_alloc_warm();
	gpud_alloc_counts(&s->alloc_total);
	gpud_alloc_since_warmup(&s->alloc_since_warmup);

	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		struct gpud_dev_numbers n = { .name = dv->name, .kv_block_bytes = d->kv_block_bytes };

		gpud_sched_device_stats(d->sched, i, &n.sched);
		pthread_mutex_lock(&dv->lock);
		n.engine = dv->est;
		gpud_maskcache_stats(dv->masks, &n.mask);
		n.mask_high = dv->mask_high > n.mask.pool_used ? dv->mask_high : n.mask.pool_used;
		pthread_mutex_unlock(&dv->lock);
		pthread_mutex_lock(&d->watch_lock);
		n.have_watch = gpud_memwatch_status(d->watch, dv->wd_kv, &n.kv_watch) == 0 &&
			       gpud_memwatch_status(d->watch, dv->wd_mask, &n.mask_watch) == 0;
		gpud_snapshot_add_device(s, &n); /* copies the warnings while locked */
		pthread_mutex_unlock(&d->watch_lock);
	}
	server_pool(d, s, "server.requests", d->wd_req, d->cfg.gpud.queue.global, ss.in_flight,
		    ss.in_flight_high,
		    sizeof(struct proto_submit) + d->cfg.gpud.stage_bytes +
		    (sizeof(struct req_priv) + 15) / 16 * 16);
	server_pool(d, s, "server.connections", d->wd_conn, d->cfg.gpud.max_connections,
		    ss.connections, ss.connections_high,
		    d->cfg.gpud.ring_bytes + d->cfg.gpud.request_bytes);
	(void)mem;
}

static int svc_stats(void *svc, char *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
	struct gpud_daemon *d = svc;
	int rc;

	fill_snapshot(d, false);
	rc = gpud_stats_json(&d->snap, false, buf, cap, len);
	if (rc)
		return sw_seterr(err, errlen, rc, "stats: %s", sw_strerror(rc));
	return 0;
}

/* --- the owner dump (MEM with PROTO_MEM_DUMP_OWNERS) ----------------------- */

static void dump_flush(struct gpud_daemon *d)
{
	size_t off = 0;

	while (off < d->dump_len && !d->dump_failed) {
		ssize_t w = write(d->dump_fd, d->dump_buf + off, d->dump_len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			d->dump_failed = true;
		else
			off += (size_t)w;
	}
	d->dump_len = 0;
}

static void dump_put(struct gpud_daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void dump_put(struct gpud_daemon *d, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (DUMP_BUF - d->dump_len < 256)
		dump_flush(d);
	va_start(ap, fmt);
	n = vsnprintf(d->dump_buf + d->dump_len, DUMP_BUF - d->dump_len, fmt, ap);
	va_end(ap);
	if (n > 0)
		d->dump_len += (size_t)n < DUMP_BUF - d->dump_len ? (size_t)n : 0;
}

struct dump_ctx {
	struct gpud_daemon *d;
	bool first;
};

static void dump_block(void *arg, uint32_t block, const char *kind, uint64_t id)
{
	struct dump_ctx *c = arg;

	if (!strcmp(kind, "free"))
		dump_put(c->d, "%s{\"block\":%u,\"owner\":\"free\"}", c->first ? "" : ",", block);
	else
		dump_put(c->d, "%s{\"block\":%u,\"owner\":\"%s\",\"id\":%" PRIu64 "}",
			 c->first ? "" : ",", block, kind, id);
	c->first = false;
}

/* mkdir -p (0750); 0 or a negated errno. */
static int make_dirs(const char *path)
{
	char p[SW_CONFIG_PATH_MAX];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(p))
		return -ENAMETOOLONG;
	memcpy(p, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (p[i] != '/' && p[i] != '\0')
			continue;
		p[i] = '\0';
		if (mkdir(p, 0750) < 0 && errno != EEXIST)
			return -errno;
		p[i] = i < n ? '/' : '\0';
	}
	return 0;
}

static int dump_owners(struct gpud_daemon *d, char *err, size_t errlen)
{
	time_t t = time(NULL);
	int rc = make_dirs(d->cfg.state_dir);

	if (rc)
		return sw_seterr(err, errlen, rc, "mem: cannot create %s: %s", d->cfg.state_dir,
				 strerror(-rc));
	snprintf(d->dump_path, sizeof(d->dump_path), "%s/gpud-blocks-%lld.json", d->cfg.state_dir,
		 (long long)t);
	d->dump_fd = open(d->dump_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (d->dump_fd < 0)
		return sw_seterr(err, errlen, -errno, "mem: cannot write %s: %s", d->dump_path,
				 strerror(errno));
	d->dump_len = 0;
	d->dump_failed = false;
	dump_put(d, "{\"time\":%lld,\"block_bytes\":%" PRIu64 ",\"devices\":[", (long long)t,
		 d->kv_block_bytes);
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct dump_ctx c = { .d = d, .first = true };
		struct device *dv = &d->dev[i];

		dump_put(d, "%s{\"name\":\"%s\",\"kv\":[", i ? "," : "", dv->name);
		gpud_sched_block_owners(d->sched, i, dump_block, &c);
		pthread_mutex_lock(&dv->lock);
		uint32_t nj = dv->n_jobs;
		pthread_mutex_unlock(&dv->lock);
		dump_put(d, "],\"embeddings_queued\":%u}", nj);
	}
	dump_put(d, "]}\n");
	dump_flush(d);
	close(d->dump_fd);
	d->dump_fd = -1;
	if (d->dump_failed)
		return sw_seterr(err, errlen, -EIO, "mem: writing %s failed", d->dump_path);
	log_info("block owners written to %s", d->dump_path);
	return 0;
}

static int svc_mem(void *svc, uint32_t flags, char *buf, size_t cap, size_t *len, char *err,
		   size_t errlen)
{
	struct gpud_daemon *d = svc;
	int rc;

	fill_snapshot(d, true);
	if (flags & PROTO_MEM_DUMP_OWNERS) {
		rc = dump_owners(d, err, errlen);
		if (rc)
			return rc;
		d->snap.dump_path = d->dump_path;
	}
	rc = gpud_stats_json(&d->snap, true, buf, cap, len);
	if (rc)
		return sw_seterr(err, errlen, rc, "mem: %s", sw_strerror(rc));
	return 0;
}

/* GET /metrics, on the loop thread. */
static int metrics_render(void *arg, char *buf, size_t cap, size_t *len)
{
	struct gpud_daemon *d = arg;

	fill_snapshot(d, false);
	return gpud_stats_prometheus(&d->snap, buf, cap, len);
}

static const struct gpud_service_ops service_ops = {
	.submit = svc_submit,
	.embed = svc_embed,
	.cancel = svc_cancel,
	.tokenize = svc_tokenize,
	.stats = svc_stats,
	.mem = svc_mem,
};

/* --- signals and shutdown ------------------------------------------------------ */

static void on_close_noop(uv_handle_t *h)
{
	(void)h;
}

/* Closes every handle on the loop (the server's too); uv_run then returns. */
static void finish(struct gpud_daemon *d)
{
	if (d->finishing)
		return;
	d->finishing = true;
	if (d->server)
		gpud_server_close(d->server);
	if (d->handles_ok) {
		uv_timer_stop(&d->poll_timer);
		uv_timer_stop(&d->deadline_timer);
		uv_timer_stop(&d->sample_timer);
		uv_close((uv_handle_t *)&d->sample_timer, on_close_noop);
		uv_close((uv_handle_t *)&d->sig_term, on_close_noop);
		uv_close((uv_handle_t *)&d->sig_int, on_close_noop);
		uv_close((uv_handle_t *)&d->sig_usr1, on_close_noop);
		uv_close((uv_handle_t *)&d->poll_timer, on_close_noop);
		uv_close((uv_handle_t *)&d->deadline_timer, on_close_noop);
	}
	if (d->metrics)
		gpud_metrics_close(d->metrics);
}

/* The server's slot pools feed the watchdog like the devices' pools do:
 * a request or connection slot that never comes back shows as a rising
 * trough. */
static void on_sample(uv_timer_t *t)
{
	struct gpud_daemon *d = t->data;
	struct gpud_server_stats ss;
	uint64_t now = now_ms();

	gpud_server_stats(d->server, &ss);
	pthread_mutex_lock(&d->watch_lock);
	gpud_memwatch_sample(d->watch, d->wd_req, now, ss.in_flight);
	gpud_memwatch_sample(d->watch, d->wd_conn, now, ss.connections);
	pthread_mutex_unlock(&d->watch_lock);
}

static void on_poll(uv_timer_t *t)
{
	struct gpud_daemon *d = t->data;

	if (gpud_server_in_flight(d->server) == 0) {
		log_info("no request in flight: closing the server");
		finish(d);
	}
}

static void on_deadline(uv_timer_t *t)
{
	struct gpud_daemon *d = t->data;
	uint32_t n = gpud_server_in_flight(d->server);

	if (n) {
		log_warn("shutdown deadline (%u ms) passed: cancelling %u requests",
			 d->cfg.gpud.shutdown_deadline_ms, n);
		gpud_server_cancel_all(d->server);
	}
}

static const char *sig_name(int signum)
{
	return signum == SIGTERM ? "SIGTERM" : signum == SIGINT ? "SIGINT" : "signal";
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct gpud_daemon *d = h->data;

	if (signum == SIGUSR1) {
		int rc = sw_log_reopen();
		if (rc)
			log_error("SIGUSR1: cannot reopen the log: %s", sw_strerror(rc));
		else
			log_info("SIGUSR1: log reopened");
		return;
	}
	if (atomic_load(&d->draining)) {
		log_warn("%s again: cancelling the %u requests in flight", sig_name(signum),
			 gpud_server_in_flight(d->server));
		gpud_server_cancel_all(d->server);
		return;
	}
	atomic_store(&d->draining, true);
	log_info("%s: draining (%u requests in flight, deadline %u ms)", sig_name(signum),
		 gpud_server_in_flight(d->server), d->cfg.gpud.shutdown_deadline_ms);
	gpud_server_drain(d->server);
	uv_timer_start(&d->deadline_timer, on_deadline, d->cfg.gpud.shutdown_deadline_ms, 0);
	uv_timer_start(&d->poll_timer, on_poll, 0, POLL_MS);
}

/* --- start-up --------------------------------------------------------------------- */

static uint64_t host_ram(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

static void model_desc(const struct gpud_model *m, char *name, size_t namelen, uint64_t *params,
		       const char **type)
{
	const struct gpud_gguf *g = gpud_model_gguf(m);
	struct gpud_gguf_str s;
	uint64_t n = 0;

	if (gpud_gguf_get_str(g, "general.name", &s) == 0)
		snprintf(name, namelen, "%.*s", (int)(s.len < 200 ? s.len : 200), s.s);
	else
		snprintf(name, namelen, "(unnamed)");
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(g); i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(g, i);
		uint64_t e = 1;
		for (uint32_t k = 0; k < t->n_dims; k++)
			e *= t->ne[k];
		n += e;
	}
	*params = n;
	*type = gpud_type_name(gpud_model_weights(m)->layers[0].wq.type);
}

/* Step scratch per device: the most any configured device's backend asks
 * for with the engine parameters daemon_build will give it. A device
 * without a backend counts nothing (the plan refuses it). */
static uint64_t scratch_bytes(const struct sw_config *cfg, const struct gpud_model *m,
			      uint32_t threads_per_dev)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;
	uint64_t most = 0;

	for (uint32_t i = 0; i < g->n_devices; i++) {
		const struct gpud_backend_ops *ops = gpud_backend_for(g->devices[i].kind);
		struct gpud_backend_config bc = {
			.model = m,
			.ordinal = g->devices[i].index,
			.n_threads = (int)threads_per_dev,
			.block_tokens = g->kv_block_tokens,
			.max_batch_tokens = g->max_batch_tokens,
			.max_seqs = g->max_seqs + 1,   /* as daemon_build's engines */
			.max_logits = g->max_seqs + 1, /* the engine's default: max_seqs */
		};
		uint64_t s = ops ? ops->scratch_bytes(&bc) : 0;

		if (s > most)
			most = s;
	}
	return most;
}

/* Everything the plan needs that depends on the model and the config. */
struct sizing {
	uint32_t n_ctx, threads_per_dev, mask_entries, max_text;
	uint64_t scratch, mask_slot, mask_pool, server, tok_scratch, host;
};

static void size_pools(const struct sw_config *cfg, const struct gpud_model *m, struct sizing *z)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const typeof(cfg->gpud) *g = &cfg->gpud;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t threads = g->threads ? g->threads : (uint32_t)(online > 0 ? online : 1);
	uint64_t priv = (sizeof(struct req_priv) + 15) / 16 * 16;

	memset(z, 0, sizeof(*z));
	z->n_ctx = g->context && g->context < hp->n_ctx ? g->context : hp->n_ctx;
	z->threads_per_dev = threads / g->n_devices ? threads / g->n_devices : 1;
	z->scratch = scratch_bytes(cfg, m, z->threads_per_dev);
	z->mask_slot = (gpud_mask_bytes(g->max_segments, z->n_ctx, g->kv_block_tokens) +
			4ull * g->max_segments + 63) / 64 * 64;
	/* Slots are sized for the largest mask; the cache also bounds the
	 * bytes of the masks it holds (most are far smaller). Every running
	 * sequence may pin a mask of its own: at least max_seqs slots. Waiting
	 * requests pin too; beyond the slots a submit gets SW_EBUSY. */
	z->mask_entries = (uint32_t)(g->mask_cache_bytes / z->mask_slot);
	if (z->mask_entries < g->max_seqs)
		z->mask_entries = g->max_seqs;
	if (z->mask_entries > 65536)
		z->mask_entries = 65536;
	z->mask_pool = z->mask_slot * (z->mask_entries + 1ull);
	z->max_text = g->request_bytes < MAX_TEXT_CAP ? (uint32_t)g->request_bytes : MAX_TEXT_CAP;
	z->tok_scratch = gpud_tokenizer_scratch_bytes(gpud_model_tokenizer(m), z->max_text + 512);
	z->server = (uint64_t)g->max_connections * (g->ring_bytes + g->request_bytes) +
		    (uint64_t)g->queue.global * (sizeof(struct proto_submit) + g->stage_bytes + priv);
	z->host = z->server + z->tok_scratch + 2ull * (2 * z->max_text + 512) +
		  (uint64_t)g->n_devices * EMBED_SLOTS * ((uint64_t)z->n_ctx * 4 + hp->dim * 4);
}

static int make_plan(const struct sw_config *cfg, const struct gpud_model *m,
		     const struct sizing *z, struct gpud_plan *plan, uint64_t *kv_block_bytes,
		     char *err, size_t errlen)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	struct gpud_plan_in in = {
		.n_devices = cfg->gpud.n_devices,
		.devices = cfg->gpud.devices,
		.host_ram = host_ram(),
		.memory_fraction = cfg->gpud.memory_fraction,
		.weight_bytes = gpud_model_weight_bytes(m),
		.kv_block_bytes = (uint64_t)hp->n_layers * 2 * hp->n_kv_heads *
				  cfg->gpud.kv_block_tokens * hp->head_dim * sizeof(float),
		.kv_blocks = cfg->gpud.kv_blocks,
		.max_seqs = cfg->gpud.max_seqs,
		.n_ctx = z->n_ctx,
		.block_tokens = cfg->gpud.kv_block_tokens,
		.scratch_bytes = z->scratch,
		.mask_bytes = z->mask_pool,
		.host_bytes = z->host,
	};

	*kv_block_bytes = in.kv_block_bytes;
	return gpud_plan_compute(&in, plan, err, errlen);
}

static void print_plan(FILE *out, const struct sw_config *cfg, const struct sizing *z,
		       const struct gpud_plan *p, uint64_t bb, uint64_t weights)
{
	char a[32], b[32], c[32];

	gpud_fmt_bytes(p->total, a, sizeof(a));
	gpud_fmt_bytes(p->used, b, sizeof(b));
	fprintf(out, "memory plan: %s of %s budget (gpud.memory_fraction %g)\n", b, a,
		cfg->gpud.memory_fraction);
	gpud_fmt_bytes(weights, a, sizeof(a));
	fprintf(out, "  weights: %s (mapped once, shared by the devices)\n", a);
	for (uint32_t i = 0; i < cfg->gpud.n_devices; i++) {
		gpud_fmt_bytes(p->kv_bytes, a, sizeof(a));
		fprintf(out, "  cpu%u.kv: %u blocks x %" PRIu64 " bytes = %s (%u tokens/block; "
			"%u blocks hold max_seqs %u full contexts)\n", i, p->kv_blocks, bb, a,
			cfg->gpud.kv_block_tokens, p->kv_blocks_full, cfg->gpud.max_seqs);
		gpud_fmt_bytes(z->scratch, a, sizeof(a));
		fprintf(out, "  cpu%u.scratch: %s (max_batch_tokens %u, estimate)\n", i, a,
			cfg->gpud.max_batch_tokens);
		gpud_fmt_bytes(z->mask_pool, a, sizeof(a));
		fprintf(out, "  cpu%u.mask: %u + 1 slots x %" PRIu64 " bytes = %s\n", i,
			z->mask_entries, z->mask_slot, a);
		gpud_fmt_bytes(cfg->gpud.prefix_cache_bytes, a, sizeof(a));
		fprintf(out, "  cpu%u.prefix: at most %s of unreferenced KV (inside cpu%u.kv)\n", i,
			a, i);
	}
	gpud_fmt_bytes(z->server, a, sizeof(a));
	gpud_fmt_bytes(cfg->gpud.ring_bytes, b, sizeof(b));
	gpud_fmt_bytes(cfg->gpud.request_bytes, c, sizeof(c));
	fprintf(out, "  server: %s (%u connections x (%s ring + %s request area), %u request "
		"slots)\n", a, cfg->gpud.max_connections, b, c, cfg->gpud.queue.global);
	gpud_fmt_bytes(z->tok_scratch, a, sizeof(a));
	fprintf(out, "  tokenizer scratch: %s (requests up to %u bytes of text)\n", a, z->max_text);
}

static void log_plan(const struct sw_config *cfg, const struct sizing *z,
		     const struct gpud_plan *p, uint64_t bb, uint64_t weights)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return;
	print_plan(f, cfg, z, p, bb, weights);
	fclose(f);
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
		log_info("%s", line);
	free(buf);
}

static void daemon_free(struct gpud_daemon *d)
{
	if (!d)
		return;
	atomic_store(&d->stopping, true);
	if (d->sched)
		gpud_sched_wake(d->sched);
	for (uint32_t i = 0; i < d->n_dev; i++)
		if (d->dev[i].started)
			pthread_join(d->dev[i].thread, NULL);
	gpud_server_destroy(d->server);
	gpud_metrics_destroy(d->metrics);
	if (d->loop_ok) {
		uv_run(&d->loop, UV_RUN_DEFAULT); /* run pending closes */
		if (uv_loop_close(&d->loop))
			log_warn("libuv loop still has handles at exit");
	}
	gpud_sched_destroy(d->sched);
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		gpud_engine_destroy(dv->engine);
		gpud_maskcache_destroy(dv->masks);
		for (uint32_t j = 0; j < EMBED_SLOTS; j++) {
			free(dv->jobs[j].tokens);
			free(dv->jobs[j].out);
		}
		pthread_mutex_destroy(&dv->lock);
	}
	gpud_memwatch_destroy(d->watch);
	pthread_mutex_destroy(&d->watch_lock);
	sw_arena_destroy(&d->tok_arena);
	free(d->ids);
	free(d->fmt);
	free(d->copy);
	free(d->dump_buf);
	gpud_model_free(d->model);
	free(d);
}

/* Builds every part after the plan. Returns 0 or logs why not. */
static int daemon_build(struct gpud_daemon *d, const struct sizing *z)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_engine *engines[SW_CONFIG_MAX_DEVICES];
	struct gpud_sched_params sp;
	struct gpud_memwatch_params wp = {
		.max_pools = 2 * SW_CONFIG_MAX_DEVICES + 2,
		.window_ms = g->watchdog.window_ms,
		.k = g->watchdog.k,
		.min_rise = 1,
		.rise_fraction = 0,
	};
	char err[512] = "", a[32], b[32];
	int rc;

	rc = gpud_memwatch_create(&d->watch, &wp);
	if (rc) {
		log_error("watchdog: %s", sw_strerror(rc));
		return rc;
	}
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		struct gpud_engine_params ep;
		struct gpud_maskcache_params mp;
		struct gpud_engine_stats st;
		struct gpud_maskcache_stats ms;
		char wname[GPUD_STATS_NAME_MAX + 8];

		gpud_engine_params_default(&ep);
		ep.n_threads = (int)z->threads_per_dev;
		ep.n_ctx = d->n_ctx;
		ep.max_batch_tokens = g->max_batch_tokens;
		ep.max_seqs = g->max_seqs + 1; /* + the embedding's temporary slot */
		ep.block_tokens = g->kv_block_tokens;
		ep.n_blocks = d->plan.kv_blocks;
		ep.device = (int)i;
		ep.kind = g->devices[i].kind;
		ep.ordinal = g->devices[i].index;
		rc = gpud_engine_create(&dv->engine, d->model, &ep, err, sizeof(err));
		if (rc) {
			log_error("%s: engine: %s", dv->name, err);
			return rc;
		}
		engines[i] = dv->engine;
		gpud_engine_stats(dv->engine, &st);
		dv->est = st;
		gpud_fmt_bytes(st.kv_bytes, a, sizeof(a));
		gpud_fmt_bytes(st.scratch_bytes, b, sizeof(b));
		log_info("%s: reserved KV %u blocks x %" PRIu64 " bytes = %s, scratch %s, %d threads",
			 dv->name, st.kv.n_blocks, d->kv_block_bytes, a, b, ep.n_threads);

		snprintf(wname, sizeof(wname), "%s.mask", dv->name);
		mp = (struct gpud_maskcache_params){
			.name = wname,
			.max_segments = g->max_segments,
			.max_prompt_tokens = d->n_ctx,
			.block_tokens = g->kv_block_tokens,
			.max_entries = z->mask_entries,
			.max_bytes = g->mask_cache_bytes,
		};
		rc = gpud_maskcache_create(&dv->masks, &mp);
		if (rc) {
			log_error("%s: mask cache of %u entries: %s", dv->name, z->mask_entries,
				  sw_strerror(rc));
			return rc;
		}
		gpud_maskcache_stats(dv->masks, &ms);
		dv->mst = ms;
		gpud_fmt_bytes(ms.reserved_bytes, a, sizeof(a));
		gpud_fmt_bytes(ms.max_bytes, b, sizeof(b));
		log_info("%s: reserved mask pool %u slots x %zu bytes = %s (cache bound %u entries, "
			 "%s)", dv->name, ms.pool_capacity, ms.slot_bytes, a, ms.max_entries, b);
		for (uint32_t j = 0; j < EMBED_SLOTS; j++) {
			dv->jobs[j].tokens = malloc((size_t)d->n_ctx * sizeof(int32_t));
			dv->jobs[j].out = malloc((size_t)d->dim * sizeof(float));
			if (!dv->jobs[j].tokens || !dv->jobs[j].out) {
				log_error("%s: out of memory for embedding slots", dv->name);
				return -ENOMEM;
			}
		}
		snprintf(wname, sizeof(wname), "%s.kv", dv->name);
		dv->wd_kv = gpud_memwatch_register(d->watch, wname, st.kv.n_blocks);
		snprintf(wname, sizeof(wname), "%s.mask", dv->name);
		dv->wd_mask = gpud_memwatch_register(d->watch, wname, ms.pool_capacity);
		if (dv->wd_kv < 0 || dv->wd_mask < 0) {
			log_error("%s: watchdog registration failed", dv->name);
			return -EINVAL;
		}
	}

	{
		/* The plan used estimates; hold the engines' real figures to it. */
		uint64_t real = gpud_model_weight_bytes(d->model) + z->host;
		for (uint32_t i = 0; i < d->n_dev; i++) {
			real += d->dev[i].est.kv_bytes + d->dev[i].est.scratch_bytes +
				d->dev[i].mst.reserved_bytes;
		}
		gpud_fmt_bytes(real, a, sizeof(a));
		gpud_fmt_bytes(d->plan.used, b, sizeof(b));
		if (real > d->plan.total) {
			char c[32];
			gpud_fmt_bytes(d->plan.total, c, sizeof(c));
			log_error("reserved %s in all, more than the budget of %s (plan %s): lower "
				  "gpud.kv_blocks or gpud.memory_fraction's share", a, c, b);
			return SW_EEXHAUSTED;
		}
		log_info("reserved %s in all (plan %s)", a, b);
	}

	d->wd_req = gpud_memwatch_register(d->watch, "server.requests", g->queue.global);
	d->wd_conn = gpud_memwatch_register(d->watch, "server.connections", g->max_connections);
	if (d->wd_req < 0 || d->wd_conn < 0) {
		log_error("watchdog registration failed");
		return -EINVAL;
	}

	gpud_sched_params_default(&sp);
	sp.max_requests = g->queue.global + d->n_dev; /* + the warm-up requests */
	sp.max_batch_tokens = g->max_batch_tokens;
	sp.max_seqs = g->max_seqs;
	sp.prefix_cache_bytes = g->prefix_cache_bytes;
	rc = gpud_sched_create(&d->sched, engines, d->n_dev, &sp, err, sizeof(err));
	if (rc) {
		log_error("scheduler: %s", err);
		return rc;
	}
	log_info("scheduler: %u request slots, max_batch_tokens %u, max_seqs %u, prefix cache "
		 "%" PRIu64 " bytes per device", sp.max_requests, sp.max_batch_tokens, sp.max_seqs,
		 (uint64_t)sp.prefix_cache_bytes);

	/* Loop scratch. */
	d->max_text = z->max_text;
	d->ids = malloc((size_t)d->n_ctx * sizeof(int32_t));
	d->segtok.fmt_cap = 2 * (size_t)z->max_text + 512;
	d->segtok.copy_cap = 2 * ((size_t)z->max_text + 1);
	d->fmt = malloc(d->segtok.fmt_cap);
	d->copy = malloc(d->segtok.copy_cap);
	d->dump_buf = malloc(DUMP_BUF);
	if (!d->ids || !d->fmt || !d->copy || !d->dump_buf ||
	    sw_arena_init(&d->tok_arena, z->tok_scratch)) {
		log_error("out of memory for the request scratch");
		return -ENOMEM;
	}
	d->segtok.fmt = d->fmt;
	d->segtok.copy = d->copy;
	d->segtok.arena = &d->tok_arena;
	gpud_fmt_bytes(z->tok_scratch, a, sizeof(a));
	log_info("loop: reserved tokenizer scratch %s, %u-token prompt buffer", a, d->n_ctx);
	return 0;
}

static int server_build(struct gpud_daemon *d)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_server_params sp;
	char err[512] = "", a[32], b[32];
	int rc;

	gpud_server_params_default(&sp);
	sp.socket_path = g->socket;
	sp.max_connections = g->max_connections;
	sp.max_requests = g->queue.global;
	sp.max_per_connection = g->queue.per_connection;
	sp.ring_bytes = g->ring_bytes;
	sp.req_bytes = g->request_bytes;
	sp.stage_bytes = g->stage_bytes;
	sp.priv_bytes = (sizeof(struct req_priv) + 15) / 16 * 16;
	sp.stall_ms = g->stall_ms;
	proto_limits_default(&sp.limits);
	sp.limits.max_segments = g->max_segments;
	sp.limits.max_text_bytes = d->max_text;
	rc = gpud_server_create(&d->server, &d->loop, &sp, &service_ops, d, err, sizeof(err));
	if (rc) {
		log_error("server: %s", err);
		return rc;
	}
	gpud_fmt_bytes(g->ring_bytes, a, sizeof(a));
	gpud_fmt_bytes(g->request_bytes, b, sizeof(b));
	log_info("server: %u connection slots (region per connection: %s ring + %s request "
		 "area, made at accept), %u request slots x (%zu + %" PRIu64 " staging + %zu) bytes",
		 sp.max_connections, a, b, sp.max_requests, sizeof(struct proto_submit),
		 (uint64_t)sp.stage_bytes, sp.priv_bytes);
	if (g->metrics[0]) {
		rc = gpud_metrics_create(&d->metrics, &d->loop, g->metrics, metrics_render, d, err,
					 sizeof(err));
		if (rc) {
			log_error("metrics: %s", err);
			return rc;
		}
		log_info("metrics: Prometheus text on %s (GET /metrics)", g->metrics);
	}
	return 0;
}

/* One tiny request and one embedding per device, through the real paths. */
static int warm_up(struct gpud_daemon *d)
{
	int32_t tok[2] = { gpud_tokenizer_bos(d->tok), 1 };
	double t0 = now_s();
	char err[256];

	if (tok[0] < 0)
		tok[0] = 1;
	atomic_store(&d->warm_left, 2 * d->n_dev);
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct gpud_sched_req r = {
			.tokens = tok,
			.n_tokens = 2,
			.max_tokens = 2,
			.cb = on_warmup_event,
			.arg = d,
			.pin_device = true,
			.device = i,
		};
		struct embed_job *j;
		uint64_t id;
		uint32_t slot;
		int rc;

		gpud_sampler_params_default(&r.sampling);
		rc = gpud_sched_submit(d->sched, &r, &id, err, sizeof(err));
		if (rc) {
			log_error("%s: warm-up request: %s", d->dev[i].name, err);
			return rc;
		}
		j = job_take(&d->dev[i], &slot);
		if (!j)
			return -EBUSY;
		j->tokens[0] = tok[0];
		j->tokens[1] = tok[1];
		j->n_tokens = 2;
		job_queue(&d->dev[i], j, NULL, true);
	}
	while (atomic_load(&d->warm_left) > 0) {
		struct timespec ts = { 0, 1000000 };
		if (now_s() - t0 > WARMUP_TIMEOUT_S) {
			log_error("warm-up did not finish in %d s", WARMUP_TIMEOUT_S);
			return -ETIMEDOUT;
		}
		nanosleep(&ts, NULL);
	}
	log_info("warm-up done in %.1f ms (one request and one embedding per device)",
		 (now_s() - t0) * 1e3);
	return 0;
}

int gpud_serve(const struct sw_config *cfg, bool check_only, FILE *out)
{
	struct gpud_daemon *d;
	struct sizing z;
	char err[1024] = "", name[256];
	const char *type;
	uint64_t params, bb;
	double t0 = now_s();
	char *js;
	int rc;

	d = calloc(1, sizeof(*d));
	if (!d) {
		fprintf(out, "gpud: out of memory\n");
		return 1;
	}
	d->cfg = *cfg;
	d->t_start = t0;
	d->dump_fd = -1;
	pthread_mutex_init(&d->watch_lock, NULL);

	if (!check_only) {
		log_info("gpud %s starting (pid %d)", SW_VERSION, (int)getpid());
		log_info("libraries: libuv %s, jansson %s, glibc %s", uv_version_string(),
			 JANSSON_VERSION, gnu_get_libc_version());
		js = sw_config_to_json(cfg);
		log_info("config: %s", js ? js : "(out of memory)");
		free(js);
	}
	rc = gpud_model_load(&d->model, cfg->gpud.model, err, sizeof(err));
	if (rc) {
		if (check_only)
			fprintf(out, "gpud.model: %s\n", err);
		else
			log_error("gpud.model: %s", err);
		goto out_fail;
	}
	d->tok = gpud_model_tokenizer(d->model);
	d->tmpl = gpud_tokenizer_chat_template(d->tok);
	model_desc(d->model, name, sizeof(name), &params, &type);
	size_pools(cfg, d->model, &z);
	rc = make_plan(cfg, d->model, &z, &d->plan, &bb, err, sizeof(err));
	if (rc) {
		if (check_only)
			fprintf(out, "%s\n", err);
		else
			log_error("%s", err);
		goto out_fail;
	}
	if (check_only) {
		const struct gpud_model_hparams *hp = gpud_model_hparams(d->model);
		fprintf(out, "configuration OK\n");
		fprintf(out, "model: %s (%s): %" PRIu64 " parameters, %s, %u layers, dim %u, "
			"n_ctx %u (using %u)\n", name, cfg->gpud.model, params, type, hp->n_layers,
			hp->dim, hp->n_ctx, z.n_ctx);
		print_plan(out, cfg, &z, &d->plan, bb, gpud_model_weight_bytes(d->model));
		daemon_free(d);
		return 0;
	}
	{
		const struct gpud_model_hparams *hp = gpud_model_hparams(d->model);
		log_info("model: %s (%s): %" PRIu64 " parameters, %s, %u layers, dim %u, heads "
			 "%u/%u, vocab %u, n_ctx %u (using %u), chat template %s", name,
			 cfg->gpud.model, params, type, hp->n_layers, hp->dim, hp->n_heads,
			 hp->n_kv_heads, hp->n_vocab, hp->n_ctx, z.n_ctx,
			 d->tmpl == GPUD_CHAT_LLAMA3 ? "llama3" :
			 d->tmpl == GPUD_CHAT_LLAMA2 ? "llama2" : "none");
		d->dim = hp->dim;
	}
	log_plan(cfg, &z, &d->plan, bb, gpud_model_weight_bytes(d->model));
	d->n_ctx = z.n_ctx;
	d->n_dev = cfg->gpud.n_devices;
	d->block_tokens = cfg->gpud.kv_block_tokens;
	d->kv_block_bytes = bb;
	for (uint32_t i = 0; i < d->n_dev; i++) {
		d->dev[i].d = d;
		d->dev[i].idx = i;
		snprintf(d->dev[i].name, sizeof(d->dev[i].name), "cpu%u", i);
		pthread_mutex_init(&d->dev[i].lock, NULL);
	}
	rc = daemon_build(d, &z);
	if (rc)
		goto out_fail;

	rc = uv_loop_init(&d->loop);
	if (rc) {
		log_error("libuv: %s", uv_strerror(rc));
		goto out_fail;
	}
	d->loop_ok = true;
	rc = server_build(d);
	if (rc)
		goto out_fail;

	for (uint32_t i = 0; i < d->n_dev; i++) {
		rc = -pthread_create(&d->dev[i].thread, NULL, device_main, &d->dev[i]);
		if (rc) {
			log_error("%s: cannot start the device thread: %s", d->dev[i].name,
				  strerror(-rc));
			goto out_fail;
		}
		d->dev[i].started = true;
	}
	rc = warm_up(d);
	if (rc)
		goto out_fail;

	uv_signal_init(&d->loop, &d->sig_term);
	uv_signal_init(&d->loop, &d->sig_int);
	uv_signal_init(&d->loop, &d->sig_usr1);
	uv_timer_init(&d->loop, &d->poll_timer);
	uv_timer_init(&d->loop, &d->deadline_timer);
	uv_timer_init(&d->loop, &d->sample_timer);
	d->sig_term.data = d->sig_int.data = d->sig_usr1.data = d;
	d->poll_timer.data = d->deadline_timer.data = d->sample_timer.data = d;
	d->handles_ok = true;
	uv_signal_start(&d->sig_term, on_signal, SIGTERM);
	uv_signal_start(&d->sig_int, on_signal, SIGINT);
	uv_signal_start(&d->sig_usr1, on_signal, SIGUSR1);

	rc = gpud_server_listen(d->server, err, sizeof(err));
	if (rc) {
		log_error("server: %s", err);
		goto out_fail;
	}
	d->last_rate_t = now_s();
	uv_timer_start(&d->sample_timer, on_sample, IDLE_WAIT_MS, IDLE_WAIT_MS);
	gpud_alloc_warmup_done();
	log_info("listening on %s (%u device%s) after %.2f s of start-up", cfg->gpud.socket,
		 d->n_dev, d->n_dev == 1 ? "" : "s", now_s() - t0);

	gpud_alloc_set_role(GPUD_ALLOC_LOOP);
	uv_run(&d->loop, UV_RUN_DEFAULT);
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);

	{
		struct gpud_alloc_counts c;
		gpud_alloc_since_warmup(&c);
		log_info("stopped: %" PRIu64 " requests completed, %" PRIu64 " errors, %" PRIu64
			 " cancelled; host allocations since warm-up: loop %" PRIu64 ", device %"
			 PRIu64 "%s", (uint64_t)atomic_load(&d->completed) +
			 atomic_load(&d->embeds), (uint64_t)atomic_load(&d->errors),
			 (uint64_t)atomic_load(&d->cancelled), c.host_allocs[GPUD_ALLOC_LOOP],
			 c.host_allocs[GPUD_ALLOC_DEVICE],
			 gpud_alloc_hooked() ? "" : " (not counted in this build)");
	}
	daemon_free(d);
	log_info("gpud exits");
	return 0;

out_fail:
	if (d->loop_ok && !d->finishing) {
		finish(d);
		uv_run(&d->loop, UV_RUN_DEFAULT);
	}
	daemon_free(d);
	return 1;
}
