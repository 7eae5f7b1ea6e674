/* server_sreq.c - the request handle: how the service, from any thread,
 * streams tokens and ends a request (gpud_sreq_* in gpud/server.h).
 * Replies go into the ring under the connection's lock, or wait in the
 * slot's staging buffer while the ring is full. Shared state:
 * gpud/server_impl.h.
 */
#include <errno.h>
#include <stdio.h>

#include "common/err.h"
#include "common/time.h"
#include "gpud/server_impl.h"

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

/* A token batch as either record type carries it. */
struct batch {
	bool lp; /* TOKENS_LP (one token), else TOKENS */
	const int32_t *ids;
	uint32_t n_ids, n_top, pieces_len;
	const float *lps;
	const uint16_t *plen;
	const char *pieces, *text;
	uint32_t len;
	uint32_t lp_flags; /* PROTO_LP_* */
	size_t need; /* its encoded size */
};

/* Encodes b into dst (b->need bytes, checked already); returns the length. */
static size_t batch_encode(const struct batch *b, uint8_t *dst)
{
	size_t l = 0;

	if (b->lp)
		proto_tokens_lp_encode(dst, b->need, 1, b->n_top, b->ids, b->lps, b->plen,
				       b->pieces, b->pieces_len, b->text, b->len, b->lp_flags,
				       &l);
	else
		proto_tokens_encode(dst, b->need, b->ids, b->n_ids, b->text, b->len, &l);
	return l;
}

/* Writes b into the ring after what r has staged, or stages it while the
 * ring is full (TOKENS batches are coalesced at the flush, TOKENS_LP
 * records written one by one). */
static int put_batch(struct gpud_sreq *r, const struct batch *b)
{
	struct sconn *c = r->c;
	struct gpud_server *s = c->s;
	uint16_t type = b->lp ? PROTO_T_TOKENS_LP : PROTO_T_TOKENS;
	uint8_t *dst;
	int rc;

	if (!b->need || b->need > s->ring_max)
		return SW_ETOOLONG;
	pthread_mutex_lock(&c->lock);
	if (!c->open) {
		pthread_mutex_unlock(&c->lock);
		return SW_ECLOSED;
	}
	rc = r->stage_len ? gpud__flush_req_locked(c, r) : 0;
	if (rc == 0) {
		rc = proto_ring_reserve(c->ring, b->need, &dst);
		if (rc == 0) {
			proto_ring_commit(c->ring, type, r->client_id, batch_encode(b, dst));
			gpud__doorbell_locked(c, type, r->client_id);
			pthread_mutex_unlock(&c->lock);
			return 0;
		}
		gpud__ring_fail_locked(c, rc);
	}
	if (rc != SW_EBUSY) {
		pthread_mutex_unlock(&c->lock);
		return SW_ECLOSED;
	}
	if (r->stage_len + b->need > s->stage_cap) {
		pthread_mutex_unlock(&c->lock);
		return SW_EBUSY;
	}
	r->stage_len += batch_encode(b, r->stage + r->stage_len);
	r->stage_lp = b->lp;
	size_t used = r->stage_len;
	gpud__update_backlog_locked(r);
	pthread_mutex_unlock(&c->lock);
	STAT(s, {
		s->st.staged++;
		if (used > s->st.stage_high)
			s->st.stage_high = used;
	});
	return 0;
}

int gpud_sreq_tokens(struct gpud_sreq *r, const int32_t *ids, uint32_t n_ids, const char *text,
		     size_t len)
{
	if (len > UINT32_MAX || (n_ids && !ids) || (len && !text))
		return -EINVAL;
	struct batch b = { .ids = ids, .n_ids = n_ids, .text = text, .len = (uint32_t)len,
			   .need = proto_tokens_size(n_ids, (uint32_t)len) };
	return put_batch(r, &b);
}

int gpud_sreq_tokens_lp(struct gpud_sreq *r, uint32_t n_top, const int32_t *ids,
			const float *lps, const uint16_t *plen, const char *pieces,
			uint32_t pieces_len, const char *text, size_t len, uint32_t lp_flags)
{
	uint32_t sum = 0;

	if (len > UINT32_MAX || (len && !text) || n_top > PROTO_MAX_TOP_LOGPROBS || !ids ||
	    !lps || !plen || (pieces_len && !pieces) || (lp_flags & ~PROTO_LP_KNOWN) ||
	    lp_flags == (PROTO_LP_EOG | PROTO_LP_PROMPT))
		return -EINVAL;
	for (uint32_t e = 0; e <= n_top; e++)
		sum += plen[e];
	if (sum != pieces_len)
		return -EINVAL; /* so that the encoding cannot fail */
	struct batch b = { .lp = true, .ids = ids, .n_ids = 1, .n_top = n_top,
			   .pieces_len = pieces_len, .lps = lps, .plen = plen, .pieces = pieces,
			   .text = text, .len = (uint32_t)len, .lp_flags = lp_flags,
			   .need = proto_tokens_lp_size(1, n_top, (uint32_t)len, pieces_len) };
	return put_batch(r, &b);
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
	if (gpud__flush_req_locked(c, r) == SW_EBUSY)
		STAT(c->s, c->s->st.staged++);
}

void gpud_sreq_done(struct gpud_sreq *r, const struct proto_done *usage)
{
	struct sconn *c = r->c;
	pthread_mutex_lock(&c->lock);
	gpud__end_active_locked(r);
	size_t len;
	if (c->open && proto_done_encode(r->fin, sizeof(r->fin), usage, &len) == 0)
		finish_locked(c, r, PROTO_T_DONE, len, false);
	gpud__maybe_release_locked(r);
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
	gpud__end_active_locked(r);
	if (c->open)
		error_locked(c, r, code, msg);
	gpud__maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
}

void gpud_sreq_embedding(struct gpud_sreq *r, const float *v, uint32_t dim)
{
	struct sconn *c = r->c;
	struct gpud_server *s = c->s;
	size_t need = proto_embedding_size(dim);
	pthread_mutex_lock(&c->lock);
	gpud__end_active_locked(r);
	if (!c->open)
		goto out;
	if (!need || need > s->ring_max || (dim && !v)) {
		char msg[SW_ERR_MAX];
		snprintf(msg, sizeof(msg), "embedding of dim %u does not fit the response ring", dim);
		error_locked(c, r, SW_ETOOLONG, msg);
		goto out;
	}
	int rc = r->stage_len ? gpud__flush_req_locked(c, r) : 0;
	size_t len;
	if (rc == 0) {
		uint8_t *dst;
		rc = proto_ring_reserve(c->ring, need, &dst);
		if (rc == 0) {
			proto_embedding_encode(dst, need, v, dim, &len);
			proto_ring_commit(c->ring, PROTO_T_EMBED_REPLY, r->client_id, len);
			gpud__doorbell_locked(c, PROTO_T_EMBED_REPLY, r->client_id);
			goto out;
		}
		gpud__ring_fail_locked(c, rc);
	}
	if (rc == SW_EBUSY && r->stage_len == 0 && need <= s->p.stage_bytes) {
		proto_embedding_encode(r->stage, need, v, dim, &len);
		finish_locked(c, r, PROTO_T_EMBED_REPLY, len, true);
	} else {
		error_locked(c, r, SW_EBUSY, "client is not reading its ring");
	}
out:
	gpud__maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
}
