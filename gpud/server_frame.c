/* server_frame.c - what the loop does with each frame a client sends:
 * HELLO (the region and its memfd), SUBMIT and EMBED (a request slot, the
 * decoder, the service), CANCEL, and the synchronous TOKENIZE, DETOKENIZE, STATS and
 * MEM. Shared state: gpud/server_impl.h.
 */
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/server_impl.h"

static void handle_hello(struct sconn *c, const struct proto_frame *f, int rc, const char *err)
{
	struct gpud_server *s = c->s;
	if (rc == SW_EVERSION && f->type == PROTO_T_HELLO) {
		log_info("conn %llu (pid %d): protocol version %u, we speak %u; closing",
			 (unsigned long long)c->serial, (int)c->pid, f->version, PROTO_VERSION);
		struct proto_frame e;
		proto_frame_init(&e, PROTO_T_ERROR, f->request_id);
		e.aux = (uint32_t)-SW_EVERSION;
		if (gpud__send_frame(c, &e, true))
			gpud__close_conn(c, "version mismatch");
		return;
	}
	if (rc || f->type != PROTO_T_HELLO) {
		log_warn("conn %llu (pid %d): %s before HELLO; closing", (unsigned long long)c->serial,
			 (int)c->pid, rc ? err : proto_type_name(f->type));
		STAT(s, s->st.bad_frames++);
		gpud__close_conn(c, "frame before HELLO");
		return;
	}
	char msg[SW_ERR_MAX];
	struct proto_shm *shm = NULL;
	struct proto_ring *ring = NULL;
	rc = proto_shm_create_in(c->shm_store, sizeof(c->shm_store), &shm, s->p.ring_bytes,
				 s->p.req_bytes, msg, sizeof(msg));
	if (rc == 0)
		rc = proto_shm_ring_in(c->ring_store, sizeof(c->ring_store), shm,
				       PROTO_RING_PRODUCER, &ring, msg, sizeof(msg));
	if (rc) {
		log_error("conn %llu: region: %s", (unsigned long long)c->serial, msg);
		proto_shm_destroy(shm);
		struct proto_frame e;
		proto_frame_init(&e, PROTO_T_ERROR, f->request_id);
		e.aux = (uint32_t)-rc;
		if (gpud__send_frame(c, &e, true))
			gpud__close_conn(c, "region failed");
		return;
	}
	pthread_mutex_lock(&c->lock);
	c->shm = shm;
	c->ring = ring;
	c->lay = *proto_shm_layout(shm);
	c->base = proto_shm_base(shm);
	pthread_mutex_unlock(&c->lock);
	c->hello = true;
	struct proto_frame r;
	proto_frame_init(&r, PROTO_T_HELLO_REPLY, f->request_id);
	r.payload_length = c->lay.size;
	uv_os_fd_t sock = -1;
	uv_fileno((uv_handle_t *)&c->pipe, &sock);
	/* Nothing has been written on this socket yet: 40 bytes fit. */
	rc = proto_send_frame(sock, &r, proto_shm_fd(shm));
	if (rc) {
		log_warn("conn %llu: HELLO_REPLY: %s", (unsigned long long)c->serial,
			 sw_strerror(rc));
		gpud__close_conn(c, "HELLO_REPLY failed");
	}
}

static void bad_frame(struct sconn *c, uint64_t id, int rc, const char *err)
{
	struct gpud_server *s = c->s;
	STAT(s, s->st.bad_frames++);
	log_debug("conn %llu: bad frame: %s", (unsigned long long)c->serial, err);
	gpud__conn_error(c, id, rc, err);
	if (++c->bad_frames >= s->p.max_bad_frames && c->state == CONN_OPEN) {
		log_warn("conn %llu (pid %d): %u bad frames; closing", (unsigned long long)c->serial,
			 (int)c->pid, c->bad_frames);
		gpud__close_conn(c, "too many bad frames");
	}
}

/* Takes a slot for request id on c, or answers why not (returns nonzero
 * after sending the ERROR). The slot is active and linked on return. */
static int take_slot(struct sconn *c, uint64_t id, struct gpud_sreq **out)
{
	struct gpud_server *s = c->s;
	char msg[SW_ERR_MAX];
	int rc = 0;
	uint32_t idx = 0;
	if (s->draining) {
		STAT(s, s->st.refused++);
		gpud__conn_error(c, id, SW_ECLOSED, "gpud is shutting down");
		return SW_ECLOSED;
	}
	pthread_mutex_lock(&c->lock);
	for (struct gpud_sreq *r = c->reqs; r; r = r->next) {
		if (r->client_id == id && (r->active || r->fin_pending || r->stage_len)) {
			rc = sw_seterr(msg, sizeof(msg), SW_EFORMAT,
				       "request id %llu is already in flight on this connection",
				       (unsigned long long)id);
			break;
		}
	}
	/* Slots, not just active requests: one whose final record waits for
	 * a client that does not read still holds its slot, and such a
	 * client must not take the whole pool. */
	if (!rc && c->n_slots >= s->p.max_per_connection)
		rc = sw_seterr(msg, sizeof(msg), SW_EBUSY,
			       "busy: %u requests in flight on this connection (limit %u)",
			       c->n_slots, s->p.max_per_connection);
	if (!rc && atomic_load(&s->in_flight) >= s->p.max_requests)
		rc = sw_seterr(msg, sizeof(msg), SW_EBUSY,
			       "busy: %u requests in flight in gpud (limit %u)",
			       atomic_load(&s->in_flight), s->p.max_requests);
	if (!rc) {
		pthread_mutex_lock(&s->slot_lock);
		rc = sw_pool_alloc_index(s->slots, c->serial, &idx);
		pthread_mutex_unlock(&s->slot_lock);
		if (rc)
			rc = sw_seterr(msg, sizeof(msg), SW_EBUSY,
				       "busy: all %u request slots in use", s->p.max_requests);
	}
	if (rc) {
		pthread_mutex_unlock(&c->lock);
		/* counted before the client can see the refusal: STATS read
		 * after an error frame always include it */
		STAT(s, {
			if (rc == SW_EBUSY)
				s->st.busy++;
			else
				s->st.refused++;
		});
		gpud__conn_error(c, id, rc, msg);
		return rc;
	}
	struct gpud_sreq *r = gpud__slot_at(s, idx);
	r->c = c;
	r->client_id = id;
	r->conn_serial = c->serial;
	r->pid = c->pid;
	r->active = true;
	r->cancelled = r->cancel_pending = r->backlogged = false;
	r->fin_pending = r->fin_in_stage = false;
	r->stage_len = 0;
	r->stage_lp = false;
	if (r->priv)
		memset(r->priv, 0, s->p.priv_bytes);
	r->prev = NULL;
	r->next = c->reqs;
	if (c->reqs)
		c->reqs->prev = r;
	c->reqs = r;
	c->n_slots++;
	c->n_active++;
	uint32_t now = atomic_fetch_add(&s->in_flight, 1) + 1;
	pthread_mutex_unlock(&c->lock);
	STAT(s, {
		if (now > s->st.in_flight_high)
			s->st.in_flight_high = now;
	});
	*out = r;
	return 0;
}

/* Ends a request the service never took (decode error or refusal). */
static void refuse_req(struct gpud_sreq *r, int code, const char *msg)
{
	struct sconn *c = r->c;
	uint64_t id = r->client_id;
	pthread_mutex_lock(&c->lock);
	gpud__end_active_locked(r);
	gpud__maybe_release_locked(r);
	pthread_mutex_unlock(&c->lock);
	STAT(c->s, c->s->st.refused++);
	gpud__conn_error(c, id, code, msg);
}

static void on_submit(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct gpud_sreq *r;
	char err[SW_ERR_MAX] = "";
	if (take_slot(c, f->request_id, &r))
		return;
	int rc = proto_submit_decode(payload, f->payload_length, &s->p.limits, &r->sub, err,
				     sizeof(err));
	if (rc) {
		refuse_req(r, rc, err);
		return;
	}
	rc = s->ops.submit ? s->ops.submit(s->svc, r, &r->sub, err, sizeof(err))
			   : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED, "submit is not served");
	if (rc < 0) {
		refuse_req(r, rc, err);
		return;
	}
	STAT(s, s->st.requests++);
}

static void on_embed(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct proto_text_req req;
	struct gpud_sreq *r;
	char err[SW_ERR_MAX] = "";
	int rc = proto_text_req_decode(PROTO_T_EMBED, payload, f->payload_length, &s->p.limits,
				       &req, err, sizeof(err));
	if (rc) {
		STAT(s, s->st.refused++);
		gpud__conn_error(c, f->request_id, rc, err);
		return;
	}
	if (take_slot(c, f->request_id, &r))
		return;
	rc = s->ops.embed ? s->ops.embed(s->svc, r, &req, err, sizeof(err))
			  : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED, "embed is not served");
	if (rc < 0) {
		refuse_req(r, rc, err);
		return;
	}
	STAT(s, s->st.requests++);
}

static void on_cancel(struct sconn *c, uint64_t id)
{
	struct gpud_sreq *r = NULL;
	pthread_mutex_lock(&c->lock);
	for (struct gpud_sreq *q = c->reqs; q; q = q->next) {
		if (q->client_id == id && q->active && !q->cancelled) {
			r = q;
			r->cancelled = r->cancel_pending = true;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (!r) {
		log_debug("conn %llu: CANCEL of %llu: not in flight", (unsigned long long)c->serial,
			  (unsigned long long)id);
		return;
	}
	gpud__cancel_batch(c->s, &r, 1);
}

/* Writes a synchronous reply (in s->reply, len bytes, already encoded). */
static void sync_reply(struct sconn *c, uint16_t type, uint64_t id, size_t len)
{
	pthread_mutex_lock(&c->lock);
	int rc = c->open ? gpud__ring_push_locked(c, type, id, c->s->reply, len) : 0;
	pthread_mutex_unlock(&c->lock);
	if (rc == SW_EBUSY)
		gpud__conn_error(c, id, SW_EBUSY,
				 "busy: the response ring is full; read it and retry");
	else if (rc)
		gpud__conn_error(c, id, rc, "reply does not fit the response ring");
}

static void on_tokenize(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct proto_text_req req;
	char err[SW_ERR_MAX] = "";
	uint32_t n = 0;
	/* Ids are decoded into the reply buffer past the header, then
	 * rewritten in place as little-endian. */
	int32_t *ids = (int32_t *)(void *)(s->reply + 8);
	uint32_t cap = (uint32_t)((s->reply_cap - 8) / 4);
	int rc = proto_text_req_decode(PROTO_T_TOKENIZE, payload, f->payload_length,
				       &s->p.limits, &req, err, sizeof(err));
	if (!rc) {
		rc = s->ops.tokenize ? s->ops.tokenize(s->svc, &req, ids, cap, &n, err, sizeof(err))
				     : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
						 "tokenize is not served");
		if (!rc && n > cap)
			rc = sw_seterr(err, sizeof(err), -EINVAL, "tokenize: service overran");
	}
	if (rc) {
		gpud__conn_error(c, f->request_id, rc, err);
		return;
	}
	proto_put32(s->reply, n);
	proto_put32(s->reply + 4, 0);
	for (uint32_t i = 0; i < n; i++)
		proto_put32((uint8_t *)&ids[i], (uint32_t)ids[i]);
	sync_reply(c, PROTO_T_TOKENIZE_REPLY, f->request_id, proto_tokens_size(n, 0));
}

static void on_detokenize(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	struct proto_text_req req;
	char err[SW_ERR_MAX] = "";
	size_t len = 0, cap = s->reply_cap - 8;
	/* The text goes into the reply buffer past the TOKENS header. */
	int rc = proto_text_req_decode(PROTO_T_DETOKENIZE, payload, f->payload_length,
				       &s->p.limits, &req, err, sizeof(err));
	if (!rc) {
		rc = s->ops.detokenize ? s->ops.detokenize(s->svc, &req, (char *)s->reply + 8, cap,
							   &len, err, sizeof(err))
				       : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
						   "detokenize is not served");
		if (!rc && len > cap)
			rc = sw_seterr(err, sizeof(err), -EINVAL, "detokenize: service overran");
	}
	if (rc) {
		gpud__conn_error(c, f->request_id, rc, err);
		return;
	}
	proto_put32(s->reply, 0);
	proto_put32(s->reply + 4, (uint32_t)len);
	sync_reply(c, PROTO_T_DETOKENIZE_REPLY, f->request_id, proto_tokens_size(0, (uint32_t)len));
}

static void on_json(struct sconn *c, const struct proto_frame *f, const uint8_t *payload)
{
	struct gpud_server *s = c->s;
	char err[SW_ERR_MAX] = "";
	size_t len = 0;
	size_t cap = s->reply_cap - 4;
	uint16_t reply_type;
	int rc;
	if (f->type == PROTO_T_STATS) {
		reply_type = PROTO_T_STATS_REPLY;
		rc = s->ops.stats ? s->ops.stats(s->svc, (char *)s->reply + 4, cap, &len, err,
						 sizeof(err))
				  : sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
					      "stats is not served");
	} else {
		uint32_t flags = 0;
		reply_type = PROTO_T_MEM_REPLY;
		rc = proto_mem_req_decode(payload, f->payload_length, &flags, err, sizeof(err));
		if (!rc)
			rc = s->ops.mem ? s->ops.mem(s->svc, flags, (char *)s->reply + 4, cap, &len,
						     err, sizeof(err))
					: sw_seterr(err, sizeof(err), SW_EUNSUPPORTED,
						    "mem is not served");
	}
	if (!rc && (len > cap || len > UINT32_MAX))
		rc = sw_seterr(err, sizeof(err), -EINVAL, "%s: service overran",
			       proto_type_name(f->type));
	if (rc) {
		gpud__conn_error(c, f->request_id, rc, err);
		return;
	}
	proto_put32(s->reply, (uint32_t)len);
	sync_reply(c, reply_type, f->request_id, proto_json_size((uint32_t)len));
}

void gpud__handle_frame(struct sconn *c, const uint8_t *raw)
{
	struct gpud_server *s = c->s;
	struct proto_frame f;
	char err[SW_ERR_MAX] = "";
	STAT(s, s->st.frames_in++);
	int rc = proto_frame_decode(raw, PROTO_FRAME_SIZE, &f, err, sizeof(err));
	if (!c->hello) {
		handle_hello(c, &f, rc, err);
		return;
	}
	/* Read from the bytes: a frame that failed to decode may not have
	 * reached its request id. */
	uint64_t id = proto_get64(raw + PROTO_FRAME_OFF_REQUEST_ID);
	if (!rc && f.type == PROTO_T_HELLO) {
		log_warn("conn %llu (pid %d): HELLO twice; closing", (unsigned long long)c->serial,
			 (int)c->pid);
		STAT(s, s->st.bad_frames++);
		gpud__conn_error(c, id, SW_EFORMAT, "frame: HELLO twice");
		gpud__close_conn(c, "HELLO twice");
		return;
	}
	if (!rc && !proto_type_from_client(f.type))
		rc = sw_seterr(err, sizeof(err), SW_EFORMAT, "frame: type %s is not sent by clients",
			       proto_type_name(f.type));
	const void *payload = NULL;
	if (!rc)
		rc = proto_frame_payload(&f, c->base, c->lay.req_off, c->lay.req_size, &payload, err,
					 sizeof(err));
	if (rc) {
		bad_frame(c, id, rc, err);
		return;
	}
	switch (f.type) {
	case PROTO_T_SUBMIT:
		on_submit(c, &f, payload);
		break;
	case PROTO_T_EMBED:
		on_embed(c, &f, payload);
		break;
	case PROTO_T_CANCEL:
		on_cancel(c, f.request_id);
		break;
	case PROTO_T_TOKENIZE:
		on_tokenize(c, &f, payload);
		break;
	case PROTO_T_DETOKENIZE:
		on_detokenize(c, &f, payload);
		break;
	case PROTO_T_STATS:
	case PROTO_T_MEM:
		on_json(c, &f, payload);
		break;
	default:
		bad_frame(c, id, SW_EUNSUPPORTED, "frame: type not served");
		break;
	}
}
