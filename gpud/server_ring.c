/* server_ring.c - writing to a connection's response ring (replies,
 * coalesced staging flushes, the error queue) and the replies the loop
 * makes itself: ERROR records for requests it refuses, and frames on the
 * socket (doorbells, HELLO errors). Shared state: gpud/server_impl.h.
 */
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/server_impl.h"

static void on_write(uv_write_t *req, int status);

/* Ring errors other than "full" mean the client corrupted its tail: the
 * loop closes the connection. */
int gpud__ring_fail_locked(struct sconn *c, int rc)
{
	if (rc != SW_EBUSY && rc != SW_ETOOLONG) {
		c->broken = true;
		gpud__queue_conn(c);
	}
	return rc;
}

int gpud__ring_push_locked(struct sconn *c, uint16_t type, uint64_t id, const void *p,
			   size_t len)
{
	int rc = proto_ring_push(c->ring, type, id, p, len);
	if (rc)
		return gpud__ring_fail_locked(c, rc);
	gpud__doorbell_locked(c, type, id);
	return 0;
}

/* Writes r's staged token batches as one coalesced TOKENS record (or its
 * staged TOKENS_LP records one by one, as many as fit), then its final
 * record. Returns 0 when nothing is left waiting, SW_EBUSY when the ring
 * is still too full, or a ring error. */
int gpud__flush_req_locked(struct sconn *c, struct gpud_sreq *r)
{
	int rc = 0;
	if (r->stage_len && r->stage_lp) {
		/* TOKENS_LP records one by one (each sized by its header); what
		 * the ring cannot take yet moves to the stage's front */
		size_t off = 0;
		while (off < r->stage_len) {
			const uint8_t *h = r->stage + off;
			size_t n = PROTO_TOKENS_LP_HEADER +
				   (size_t)proto_get32(h) * (1 + proto_get32(h + 8)) * 10 +
				   proto_get32(h + 4) + proto_get32(h + 12);
			rc = gpud__ring_push_locked(c, PROTO_T_TOKENS_LP, r->client_id, h, n);
			if (rc)
				break;
			off += n;
		}
		memmove(r->stage, r->stage + off, r->stage_len - off);
		r->stage_len -= off;
		if (!r->stage_len)
			r->stage_lp = false;
		if (rc) {
			gpud__update_backlog_locked(r);
			return rc;
		}
	} else if (r->stage_len) {
		uint32_t n_ids = 0, text_len = 0;
		for (size_t off = 0; off < r->stage_len;) {
			uint32_t n = proto_get32(r->stage + off), t = proto_get32(r->stage + off + 4);
			n_ids += n;
			text_len += t;
			off += 8 + 4 * (size_t)n + t;
		}
		size_t need = proto_tokens_size(n_ids, text_len);
		uint8_t *dst;
		rc = proto_ring_reserve(c->ring, need, &dst);
		if (rc)
			return gpud__ring_fail_locked(c, rc);
		proto_put32(dst, n_ids);
		proto_put32(dst + 4, text_len);
		uint8_t *ids = dst + 8, *text = dst + 8 + 4 * (size_t)n_ids;
		for (size_t off = 0; off < r->stage_len;) {
			uint32_t n = proto_get32(r->stage + off), t = proto_get32(r->stage + off + 4);
			memcpy(ids, r->stage + off + 8, 4 * (size_t)n);
			memcpy(text, r->stage + off + 8 + 4 * (size_t)n, t);
			ids += 4 * (size_t)n;
			text += t;
			off += 8 + 4 * (size_t)n + t;
		}
		proto_ring_commit(c->ring, PROTO_T_TOKENS, r->client_id, need);
		gpud__doorbell_locked(c, PROTO_T_TOKENS, r->client_id);
		r->stage_len = 0;
	}
	if (r->fin_pending) {
		const uint8_t *src = r->fin_in_stage ? r->stage : r->fin;
		rc = gpud__ring_push_locked(c, r->fin_type, r->client_id, src, r->fin_len);
		if (rc == 0)
			r->fin_pending = false;
	}
	gpud__update_backlog_locked(r);
	return rc;
}

static int flush_errq_locked(struct sconn *c)
{
	while (c->errq_len) {
		struct errrec *e = &c->errq[c->errq_head];
		int rc = gpud__ring_push_locked(c, PROTO_T_ERROR, e->id, e->buf, e->len);
		if (rc)
			return rc;
		c->errq_head = (c->errq_head + 1) % ERRQ_LEN;
		c->errq_len--;
		gpud__backlog_add(c->s, -1);
	}
	return 0;
}

/* Flushes everything waiting on c; returns how many final records have
 * waited longer than stall_ms (0 when now_ns is 0). */
uint32_t gpud__flush_conn_locked(struct sconn *c, uint64_t now_ns)
{
	uint32_t stalled = 0;
	uint64_t limit = (uint64_t)c->s->p.stall_ms * 1000000u;
	flush_errq_locked(c);
	for (struct gpud_sreq *r = c->reqs, *next; r; r = next) {
		next = r->next;
		if (!r->backlogged)
			continue;
		gpud__flush_req_locked(c, r);
		if (r->fin_pending && now_ns && now_ns - r->fin_since_ns >= limit)
			stalled++;
		gpud__maybe_release_locked(r);
	}
	return stalled;
}

/* An ERROR record for request id (loop thread, no slot): into the ring, or
 * the connection's small error queue while the ring is full; a client that
 * lets that fill too is closed. */
void gpud__conn_error(struct sconn *c, uint64_t id, int code, const char *msg)
{
	struct errrec e;
	size_t len;
	if (code >= 0)
		code = -EIO;
	if (!msg || !*msg)
		msg = sw_strerror(code);
	proto_error_encode(e.buf, sizeof(e.buf), code, msg, &len);
	e.id = id;
	e.len = (uint32_t)len;
	log_debug("conn %llu: request %llu: %s", (unsigned long long)c->serial,
		  (unsigned long long)id, msg);
	bool overflow = false;
	pthread_mutex_lock(&c->lock);
	if (c->open) {
		int rc = c->errq_len ? SW_EBUSY
				     : gpud__ring_push_locked(c, PROTO_T_ERROR, id, e.buf, len);
		if (rc == SW_EBUSY) {
			if (c->errq_len < ERRQ_LEN) {
				c->errq[(c->errq_head + c->errq_len) % ERRQ_LEN] = e;
				c->errq_len++;
				gpud__backlog_add(c->s, 1);
			} else {
				overflow = true;
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (overflow)
		gpud__close_conn(c, "client is not reading its ring (error queue full)");
}

int gpud__send_frame(struct sconn *c, const struct proto_frame *f, bool close_after)
{
	uint8_t buf[PROTO_FRAME_SIZE];
	proto_frame_encode(f, buf);
	uv_buf_t b = uv_buf_init((char *)buf, sizeof(buf));
	int n = uv_try_write((uv_stream_t *)&c->pipe, &b, 1);
	if (n == (int)sizeof(buf)) {
		if (close_after)
			gpud__close_conn(c, "closed after error");
		return 0;
	}
	if (n < 0 && n != UV_EAGAIN)
		return n;
	size_t done = n > 0 ? (size_t)n : 0;
	memcpy(c->wbuf, buf + done, sizeof(buf) - done);
	b = uv_buf_init((char *)c->wbuf, (unsigned)(sizeof(buf) - done));
	int rc = uv_write(&c->wreq, (uv_stream_t *)&c->pipe, &b, 1, on_write);
	if (rc)
		return rc;
	c->wbusy = true;
	c->close_after = close_after;
	return 0;
}

void gpud__send_doorbell(struct sconn *c, uint16_t type, uint64_t id)
{
	if (c->wbusy) {
		c->db_deferred = true;
		c->dd_type = type;
		c->dd_id = id;
		return;
	}
	struct proto_frame f;
	proto_frame_init(&f, (enum proto_type)type, id);
	f.flags = PROTO_F_RING;
	int rc = gpud__send_frame(c, &f, false);
	if (rc) {
		gpud__close_conn(c, "socket write failed");
		return;
	}
	STAT(c->s, c->s->st.doorbells_out++);
}

static void on_write(uv_write_t *req, int status)
{
	struct sconn *c = req->data;
	c->wbusy = false;
	if (c->state != CONN_OPEN)
		return;
	if (status < 0) {
		gpud__close_conn(c, "socket write failed");
		return;
	}
	if (c->close_after) {
		gpud__close_conn(c, "closed after error");
		return;
	}
	if (c->db_deferred) {
		c->db_deferred = false;
		gpud__send_doorbell(c, c->dd_type, c->dd_id);
	}
}
