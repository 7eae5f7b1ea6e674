/* daemon_service.c - the service `gpud serve` gives the server
 * (gpud/server.h), on the loop thread: admission of submit (tokenize the
 * segments, compile or find the mask, queue on a device), embed, cancel
 * and tokenize; and the scheduler events that end a submitted request.
 * stats and mem are in daemon_stats.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common/err.h"
#include "gpud/daemon_impl.h"
#include "gpud/engine.h"
#include "gpud/mask.h"
#include "gpud/maskcache.h"
#include "gpud/sampler.h"
#include "gpud/scheduler.h"
#include "gpud/server.h"
#include "gpud/tokenizer.h"

/* --- scheduler events of a submitted request -------------------------------- */

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

/* A token with its log probabilities: the token's and its alternatives'
 * ids, numbers and raw pieces (control tokens by their text, but a prompt
 * token's own; a piece over LP_PIECE_MAX bytes is sent empty; the
 * prompt's pieces spell its text, as a decoder would). The prompt's first token, which has
 * none, gets the request's count of alternatives as id -1 and NaN. On the
 * device thread's stack. */
#define LP_PIECE_MAX 256
static int tokens_lp(struct gpud_daemon *d, struct req_priv *p,
		     const struct gpud_sched_event *ev)
{
	const struct gpud_logprobs *lp = ev->logprobs;
	bool prompt = ev->kind == GPUD_SCHED_PROMPT_TOKEN;
	uint32_t n_top = prompt && ev->prompt_pos == 0 ? p->top_logprobs : lp->n_top;
	int32_t ids[1 + GPUD_LOGPROBS_TOP_MAX];
	float lps[1 + GPUD_LOGPROBS_TOP_MAX];
	uint16_t plen[1 + GPUD_LOGPROBS_TOP_MAX];
	char pieces[(1 + GPUD_LOGPROBS_TOP_MAX) * LP_PIECE_MAX];
	uint32_t off = 0;

	ids[0] = ev->token;
	lps[0] = lp->logprob;
	for (uint32_t k = 0; k < n_top; k++) {
		ids[1 + k] = k < lp->n_top ? lp->top_id[k] : -1;
		lps[1 + k] = k < lp->n_top ? lp->top_lp[k] : NAN;
	}
	for (uint32_t k = 0; k <= n_top; k++) {
		/* a prompt token's own piece as the prompt's text has it (BOS:
		 * none); control tokens elsewhere by their text */
		int n = ids[k] < 0 ? 0 :
			gpud_tokenizer_piece(d->tok, ids[k], !(prompt && k == 0), pieces + off,
					     LP_PIECE_MAX);
		plen[k] = n > 0 ? (uint16_t)n : 0;
		/* the prompt's first text loses the space a SentencePiece
		 * encoder put before it, so its pieces spell the prompt */
		if (prompt && k == 0 && plen[0] && !p->prompt_text) {
			p->prompt_text = true;
			if (pieces[0] == ' ' && gpud_tokenizer_strips_first_space(d->tok))
				memmove(pieces, pieces + 1, --plen[0]);
		}
		off += plen[k];
	}
	return gpud_sreq_tokens_lp(p->r, n_top, ids, lps, plen, pieces, off, ev->text, ev->len,
				   prompt ? PROTO_LP_PROMPT :
				   gpud_tokenizer_is_eog(d->tok, ev->token) ? PROTO_LP_EOG : 0);
}

/* Device thread (or the canceller), scheduler lock held. */
static int on_event(void *arg, const struct gpud_sched_event *ev)
{
	struct req_priv *p = arg;
	struct gpud_daemon *d = p->d;
	struct gpud_sreq *r = p->r;

	if (ev->kind == GPUD_SCHED_TOKEN || ev->kind == GPUD_SCHED_PROMPT_TOKEN) {
		/* SW_EBUSY (the client stopped reading) or SW_ECLOSED: stop it. */
		p->reply_err = ev->logprobs ? tokens_lp(d, p, ev) :
					      gpud_sreq_tokens(r, &ev->token, 1, ev->text, ev->len);
		return p->reply_err ? 1 : 0;
	}

	/* leak_masks: the planted leak (daemon_impl.h) */
	if (p->mask && (!d->leak_masks || (atomic_fetch_add(&d->mask_ends, 1) + 1) %
					  d->leak_masks)) {
		struct device *dv = &d->dev[p->dev];
		pthread_mutex_lock(&dv->lock);
		gpud_maskcache_release(p->mask);
		pthread_mutex_unlock(&dv->lock);
	}
	p->mask = NULL;
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

/* --- service ops (loop thread) ---------------------------------------------- */

/* The device for a submit (loop thread): the scheduler's choice, with the
 * prompt in d->ids for the prefix probe. The probe needs the request's
 * attention pattern, so a request with a descriptor has its mask compiled
 * (or found) in device 0's cache first; when device 0 is chosen that
 * handle is kept in *mask, otherwise released. A failed probe compile
 * leaves the choice to load (the real compile then reports the error).
 * With the prefix cache off there is nothing to probe: by load. Returns
 * the device; *placed says why. */
static uint32_t pick_device(struct gpud_daemon *d, const struct proto_mask_desc *desc,
			    uint32_t n, uint32_t max_tokens, enum gpud_sched_placed *placed,
			    struct gpud_maskcache_entry **mask)
{
	struct gpud_maskcache_entry *probe = NULL;
	const int32_t *ids = d->ids;
	uint32_t dev;

	*mask = NULL;
	if (!d->cfg.gpud.prefix_cache_bytes)
		ids = NULL; /* nothing to probe: placement by load */
	else if (desc && d->n_dev > 1) {
		pthread_mutex_lock(&d->dev[0].lock);
		if (gpud_maskcache_get_or_compile(d->dev[0].masks, desc, d->seg_tokens,
						  d->block_tokens, &probe))
			probe = NULL;
		pthread_mutex_unlock(&d->dev[0].lock);
		if (!probe)
			ids = NULL;
	}
	dev = gpud_sched_pick_device(d->sched, ids, n, max_tokens,
				     probe ? gpud_maskcache_mask(probe) : NULL, placed);
	if (dev >= d->n_dev)
		dev = 0;
	if (probe && dev == 0) {
		*mask = probe;
	} else if (probe) {
		pthread_mutex_lock(&d->dev[0].lock);
		gpud_maskcache_release(probe);
		pthread_mutex_unlock(&d->dev[0].lock);
	}
	return dev;
}

static int svc_submit(void *svc, struct gpud_sreq *r, const struct proto_submit *ps, char *err,
		      size_t errlen)
{
	struct gpud_daemon *d = svc;
	const struct proto_submit_req *q = &ps->req;
	struct gpud_admit *a = &d->admit;
	const struct proto_mask_desc *desc;
	struct req_priv *p = gpud_sreq_priv(r);
	struct gpud_sched_req sr;
	struct device *dv;
	uint32_t n = 0;
	int rc;

	rc = gpud_admit_submit(q, d->cfg.gpud.max_segments, a, err, errlen);
	if (rc)
		return rc;
	desc = a->mask;
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
	p->top_logprobs = PROTO_SUBMIT_TOP(q->flags);
	p->t0 = now_s();
	p->dev = pick_device(d, desc, n, q->max_tokens, &p->placed, &p->mask);
	dv = &d->dev[p->dev];
	if (desc && !p->mask) {
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
	sr = (struct gpud_sched_req){
		.tokens = d->ids,
		.n_tokens = n,
		.mask = p->mask ? gpud_maskcache_mask(p->mask) : NULL,
		.sampling = a->sampling,
		/* prompt-only generates nothing: no KV planned for an answer */
		.max_tokens = q->flags & PROTO_SUBMIT_PROMPT_ONLY ? 1 : a->max_tokens,
		.stop = a->n_stop ? a->stop : NULL,
		.n_stop = a->n_stop,
		.bias_id = a->bias_id,
		.bias = a->bias,
		.n_bias = a->n_bias,
		.logprobs = q->flags & PROTO_SUBMIT_LOGPROBS,
		.top_logprobs = PROTO_SUBMIT_TOP(q->flags),
		.prompt_logprobs = q->flags & PROTO_SUBMIT_PROMPT_LOGPROBS,
		.prompt_only = q->flags & PROTO_SUBMIT_PROMPT_ONLY,
		.cb = on_event,
		.arg = p,
		.pin_device = true,
		.device = p->dev,
		.placed = p->placed,
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

/* A private copy of a TOKENIZE or EMBED text, taken once: the text is a
 * view into the client's request area, which the client may rewrite
 * while the tokenizer reads it more than once (see
 * gpud_segments_tokenize). NULL when it is longer than the scratch (the
 * decoder's limit keeps it shorter). */
static const char *private_text(struct gpud_daemon *d, const struct proto_text_req *req)
{
	if (req->len > d->segtok.copy_cap)
		return NULL;
	memcpy(d->segtok.copy, req->text, req->len);
	return d->segtok.copy;
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

	di = gpud__embed_device(d);
	if (di < 0 && gpud__all_failed(d))
		return sw_seterr(err, errlen, SW_EDEVICE, "no device left: %s",
				 d->dev[0].fail_msg);
	if (di < 0)
		return sw_seterr(err, errlen, SW_EBUSY,
				 "busy: %u embeddings queued on every device", EMBED_SLOTS);
	dv = &d->dev[di];
	j = gpud__job_take(dv, &slot);
	if (!j)
		return sw_seterr(err, errlen, SW_EBUSY, "busy: no embedding slot on %s", dv->name);
	const char *text = private_text(d, req);
	rc = text ? gpud_tokenizer_encode(d->tok, text, req->len, GPUD_TOK_ADD_BOS, j->tokens,
					  d->n_ctx, &n, &d->tok_arena) : -ENOMEM;
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
		gpud__job_drop(dv, j);
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
	gpud__job_queue(dv, j, r, false);
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
		if (j->r != r) {
			/* answered already, or being answered: by its device
			 * thread, or by gpud__device_fail */
		} else if (j->queued && !j->running) {
			j->r = NULL;
			j->busy = j->queued = false;
			dv->n_jobs--;
			drop = true;
		} else {
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
	const char *text = private_text(d, req);
	rc = text ? gpud_tokenizer_encode(d->tok, text, req->len, flags, ids, cap, &got,
					  &d->tok_arena) : -ENOMEM;
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

/* The text of req's ids (a view: each read once), decoded as a sequence
 * from its start. */
static int svc_detokenize(void *svc, const struct proto_text_req *req, char *buf, size_t cap,
			  size_t *len, char *err, size_t errlen)
{
	struct gpud_daemon *d = svc;
	struct gpud_detok dt;
	uint32_t n = req->len / 4;
	size_t at = 0;
	int r;

	gpud_detok_init(&dt);
	dt.special = req->flags & PROTO_DETOK_SPECIAL;
	for (uint32_t i = 0; i < n; i++) {
		int32_t id = (int32_t)proto_get32((const uint8_t *)req->text + 4 * (size_t)i);
		r = gpud_detok_push(d->tok, &dt, id, buf + at, cap - at);
		if (r == -EINVAL)
			return sw_seterr(err, errlen, -EINVAL, "detokenize: token %u: id %d is not "
					 "in the vocabulary of %d", i, id,
					 gpud_tokenizer_n_vocab(d->tok));
		if (r < 0)
			goto too_long;
		at += (size_t)r;
	}
	r = gpud_detok_flush(&dt, buf + at, cap - at);
	if (r < 0)
		goto too_long;
	*len = at + (size_t)r;
	return 0;
too_long:
	return sw_seterr(err, errlen, SW_ETOOLONG, "detokenize: the text of %u ids is longer "
			 "than the %zu bytes a reply may have", n, cap);
}

const struct gpud_service_ops gpud__service_ops = {
	.submit = svc_submit,
	.embed = svc_embed,
	.cancel = svc_cancel,
	.tokenize = svc_tokenize,
	.detokenize = svc_detokenize,
	.stats = gpud__svc_stats,
	.mem = gpud__svc_mem,
};
