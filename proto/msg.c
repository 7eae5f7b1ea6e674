/* msg.c - payload encoding and decoding (layouts in proto/README.md). */
#include "proto/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "common/err.h"

/* SUBMIT header: offsets of its fields. */
enum {
	SUB_N_SEGMENTS = 0,
	SUB_FLAGS = 4,
	SUB_MAX_TOKENS = 8,
	SUB_N_STOP = 12,
	SUB_N_MASK_IDX = 16,
	SUB_TEMPERATURE = 20,
	SUB_TOP_K = 24,
	SUB_TOP_P = 28,
	SUB_MIN_P = 32,
	SUB_PENALTY_LAST_N = 36,
	SUB_SEED = 40,
	SUB_REPEAT = 48,
	SUB_FREQUENCY = 52,
	SUB_PRESENCE = 56,
	SUB_N_MASK_ROWS = 60,
	SUB_HEADER = 64,
};
#define SUB_SEG_ENTRY 8 /* u32 length, u8 role, u8 flags, u8[2] zero */

#define DEFAULT_SEGMENTS 64
#define DEFAULT_TEXT (1u << 20)
#define DEFAULT_IDS (1u << 20)
#define DEFAULT_EMBED_DIM 65536
#define DEFAULT_JSON (4u << 20)

void proto_limits_default(struct proto_limits *lim)
{
	*lim = (struct proto_limits){
		.max_segments = DEFAULT_SEGMENTS,
		.max_stop = PROTO_MAX_STOP,
		.max_text_bytes = DEFAULT_TEXT,
		.max_ids = DEFAULT_IDS,
		.max_embed_dim = DEFAULT_EMBED_DIM,
		.max_json_bytes = DEFAULT_JSON,
	};
}

/* The limits to check against: lim with zeroes and out-of-range values
 * replaced by the defaults / hard limits. */
static struct proto_limits effective(const struct proto_limits *lim)
{
	struct proto_limits d;
	proto_limits_default(&d);
	if (!lim)
		return d;
	struct proto_limits e = *lim;
	if (!e.max_segments || e.max_segments > PROTO_MAX_SEGMENTS)
		e.max_segments = e.max_segments ? PROTO_MAX_SEGMENTS : d.max_segments;
	if (!e.max_stop || e.max_stop > PROTO_MAX_STOP)
		e.max_stop = PROTO_MAX_STOP;
	if (!e.max_text_bytes)
		e.max_text_bytes = d.max_text_bytes;
	if (!e.max_ids)
		e.max_ids = d.max_ids;
	if (!e.max_embed_dim)
		e.max_embed_dim = d.max_embed_dim;
	if (!e.max_json_bytes)
		e.max_json_bytes = d.max_json_bytes;
	return e;
}

void proto_sampling_default(struct proto_sampling *p)
{
	*p = (struct proto_sampling){ .top_p = 1.0f, .repeat_penalty = 1.0f };
}

const char *proto_role_name(uint8_t role)
{
	switch (role) {
	case PROTO_ROLE_SYSTEM:
		return "system";
	case PROTO_ROLE_USER:
		return "user";
	case PROTO_ROLE_ASSISTANT:
		return "assistant";
	default:
		return NULL;
	}
}

/* A bounded reader over a payload: take() hands out the next n bytes or
 * NULL when fewer remain (overflow-safe for any n). */
struct cursor {
	const uint8_t *p;
	size_t len, at;
};

static const uint8_t *take(struct cursor *c, uint64_t n)
{
	if (n > c->len - c->at)
		return NULL;
	const uint8_t *r = c->p + c->at;
	c->at += (size_t)n;
	return r;
}

/* --- submit -------------------------------------------------------------- */

/* The descriptor's rules (proto_mask_validate), reported as a submit
 * error: "submit: mask: row 1, entry 0: forward reference to segment 2". */
static int submit_mask_check(const struct proto_mask_desc *m, uint32_t max_segments,
			     char *err, size_t errlen)
{
	char why[SW_ERR_MAX];
	int rc = proto_mask_validate(m, max_segments, why, sizeof(why));
	return rc ? sw_seterr(err, errlen, rc, "submit: %s", why) : 0;
}

/* Unknown bits, or alternatives beyond the limit or without LOGPROBS. */
static int submit_flags_check(uint32_t flags, char *err, size_t errlen)
{
	uint32_t top = PROTO_SUBMIT_TOP(flags);

	if (flags & ~PROTO_SUBMIT_FLAGS_KNOWN)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: flags: unknown bits 0x%" PRIx32,
				 flags & ~PROTO_SUBMIT_FLAGS_KNOWN);
	if (top > PROTO_MAX_TOP_LOGPROBS)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: flags: %" PRIu32
				 " top log probabilities, at most %d", top, PROTO_MAX_TOP_LOGPROBS);
	if (top && !(flags & PROTO_SUBMIT_LOGPROBS))
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: flags: top log probabilities "
				 "without the logprobs bit");
	if ((flags & PROTO_SUBMIT_PROMPT_LOGPROBS) && !(flags & PROTO_SUBMIT_LOGPROBS))
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: flags: the prompt's log "
				 "probabilities without the logprobs bit");
	if ((flags & PROTO_SUBMIT_PROMPT_ONLY) && !(flags & PROTO_SUBMIT_PROMPT_LOGPROBS))
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: flags: prompt-only without the "
				 "prompt's log probabilities");
	return 0;
}

/* A segment's role and flags, for the chat flag or not; an ids segment's
 * length. */
static int seg_check(uint32_t i, uint8_t role, uint8_t flags, uint32_t len, bool chat,
		     char *err, size_t errlen)
{
	if (role >= PROTO_ROLE_LAST || (chat && role == PROTO_ROLE_NONE) ||
	    (!chat && role != PROTO_ROLE_NONE))
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment %" PRIu32 ": role %u %s",
				 i, role, chat ? "is not a chat role" : "without the chat flag");
	if (flags & ~PROTO_SEG_FLAGS_KNOWN)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment %" PRIu32
				 ": flags: unknown bits 0x%x", i, flags & ~PROTO_SEG_FLAGS_KNOWN);
	if ((flags & PROTO_SEG_IDS) && chat)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment %" PRIu32
				 ": token ids with the chat flag (a chat message is text)", i);
	if ((flags & PROTO_SEG_IDS) && len % 4)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment %" PRIu32
				 ": token ids: %" PRIu32 " bytes, not a multiple of 4", i, len);
	return 0;
}

/* Checks req against the hard limits and computes its encoded size. */
static int submit_check(const struct proto_submit_req *req, uint64_t *size, uint32_t *n_idx,
			uint64_t *text_total, char *err, size_t errlen)
{
	if (!req)
		return sw_seterr(err, errlen, -EINVAL, "submit: NULL request");
	if (req->n_segments > PROTO_MAX_SEGMENTS)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %" PRIu32
				 " segments, at most %d", req->n_segments, PROTO_MAX_SEGMENTS);
	if (req->n_segments && !req->segments)
		return sw_seterr(err, errlen, -EINVAL, "submit: segments NULL");
	int rc = submit_flags_check(req->flags, err, errlen);
	if (rc)
		return rc;
	bool chat = req->flags & PROTO_SUBMIT_CHAT;
	uint64_t text = 0;
	for (uint32_t i = 0; i < req->n_segments; i++) {
		const struct proto_segment *s = &req->segments[i];
		if (s->len && !s->text)
			return sw_seterr(err, errlen, -EINVAL, "submit: segment %" PRIu32
					 ": text NULL", i);
		rc = seg_check(i, s->role, s->flags, s->len, chat, err, errlen);
		if (rc)
			return rc;
		text += s->len;
	}
	if (req->n_stop > PROTO_MAX_STOP)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %" PRIu32
				 " stop strings, at most %d", req->n_stop, PROTO_MAX_STOP);
	if (req->n_stop && !req->stop)
		return sw_seterr(err, errlen, -EINVAL, "submit: stop NULL");
	uint64_t stop = 0;
	for (uint32_t i = 0; i < req->n_stop; i++) {
		uint32_t l = req->stop[i].len;
		if (l == 0 || !req->stop[i].p)
			return sw_seterr(err, errlen, SW_EFORMAT, "submit: stop string %" PRIu32
					 " is empty", i);
		if (l > PROTO_MAX_STOP_LEN)
			return sw_seterr(err, errlen, SW_ETOOLONG, "submit: stop string %" PRIu32
					 ": %" PRIu32 " bytes, at most %d", i, l,
					 PROTO_MAX_STOP_LEN);
		stop += l;
	}
	if (req->flags & PROTO_SUBMIT_LOGIT_BIAS && !req->n_bias)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: flags: the logit-bias bit "
				 "without a table (n_bias 0)");
	if (req->n_bias > PROTO_MAX_LOGIT_BIAS)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %" PRIu32 " logit biases, at "
				 "most %d", req->n_bias, PROTO_MAX_LOGIT_BIAS);
	if (req->n_bias && !req->bias)
		return sw_seterr(err, errlen, -EINVAL, "submit: bias NULL");
	uint32_t rows = 0;
	uint64_t idx = 0;
	const struct proto_mask_desc *m = req->mask;
	if (m && m->rows) {
		if (m->n_segments != req->n_segments)
			return sw_seterr(err, errlen, -EINVAL, "submit: mask has %" PRIu32
					 " segments, the request %" PRIu32, m->n_segments,
					 req->n_segments);
		rc = submit_mask_check(m, PROTO_MAX_SEGMENTS, err, errlen);
		if (rc)
			return rc;
		rows = m->n_segments + 1;
		for (uint32_t i = 0; i < rows; i++)
			idx += m->rows[i].n;
		if (idx > PROTO_MAX_MASK_IDX)
			return sw_seterr(err, errlen, SW_ETOOLONG, "submit: mask has %" PRIu64
					 " indices, at most %d", idx, PROTO_MAX_MASK_IDX);
	}
	uint64_t total = SUB_HEADER + (uint64_t)req->n_segments * SUB_SEG_ENTRY +
			 (uint64_t)rows * 4 + idx * 2 + (uint64_t)req->n_stop * 4 + text + stop +
			 (req->n_bias ? 4 + (uint64_t)req->n_bias * 8 : 0);
	if (total > UINT32_MAX)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %" PRIu64
				 " bytes encoded, over 4 GiB", total);
	*size = total;
	*n_idx = (uint32_t)idx;
	*text_total = text;
	return 0;
}

int proto_submit_size(const struct proto_submit_req *req, size_t *size, char *err,
		      size_t errlen)
{
	uint64_t total, text;
	uint32_t n_idx;
	if (!size)
		return sw_seterr(err, errlen, -EINVAL, "submit: NULL size");
	int rc = submit_check(req, &total, &n_idx, &text, err, errlen);
	if (rc)
		return rc;
	*size = (size_t)total;
	return 0;
}

int proto_submit_encode(const struct proto_submit_req *req, uint8_t *buf, size_t cap,
			size_t *len, char *err, size_t errlen)
{
	uint64_t total, text;
	uint32_t n_idx;
	if (!len || !buf)
		return sw_seterr(err, errlen, -EINVAL, "submit: NULL argument");
	int rc = submit_check(req, &total, &n_idx, &text, err, errlen);
	if (rc)
		return rc;
	if (total > cap)
		return sw_seterr(err, errlen, -ENOSPC, "submit: needs %" PRIu64
				 " bytes, buffer has %zu", total, cap);
	const struct proto_mask_desc *m = req->mask && req->mask->rows ? req->mask : NULL;
	const struct proto_sampling *sp = &req->sampling;
	uint8_t *h = buf;
	memset(h, 0, SUB_HEADER);
	proto_put32(h + SUB_N_SEGMENTS, req->n_segments);
	proto_put32(h + SUB_FLAGS, req->flags | (req->n_bias ? PROTO_SUBMIT_LOGIT_BIAS : 0));
	proto_put32(h + SUB_MAX_TOKENS, req->max_tokens);
	proto_put32(h + SUB_N_STOP, req->n_stop);
	proto_put32(h + SUB_N_MASK_IDX, n_idx);
	proto_putf32(h + SUB_TEMPERATURE, sp->temperature);
	proto_put32(h + SUB_TOP_K, (uint32_t)sp->top_k);
	proto_putf32(h + SUB_TOP_P, sp->top_p);
	proto_putf32(h + SUB_MIN_P, sp->min_p);
	proto_put32(h + SUB_PENALTY_LAST_N, (uint32_t)sp->penalty_last_n);
	proto_put64(h + SUB_SEED, sp->seed);
	proto_putf32(h + SUB_REPEAT, sp->repeat_penalty);
	proto_putf32(h + SUB_FREQUENCY, sp->frequency_penalty);
	proto_putf32(h + SUB_PRESENCE, sp->presence_penalty);
	proto_put32(h + SUB_N_MASK_ROWS, m ? m->n_segments + 1 : 0);
	uint8_t *p = buf + SUB_HEADER;
	for (uint32_t i = 0; i < req->n_segments; i++) {
		proto_put32(p, req->segments[i].len);
		p[4] = req->segments[i].role;
		p[5] = req->segments[i].flags;
		p[6] = p[7] = 0;
		p += SUB_SEG_ENTRY;
	}
	if (m) {
		for (uint32_t i = 0; i <= m->n_segments; i++, p += 4)
			proto_put32(p, m->rows[i].n);
		for (uint32_t i = 0; i <= m->n_segments; i++)
			for (uint32_t j = 0; j < m->rows[i].n; j++, p += 2)
				proto_put16(p, m->rows[i].idx[j]);
	}
	for (uint32_t i = 0; i < req->n_stop; i++, p += 4)
		proto_put32(p, req->stop[i].len);
	for (uint32_t i = 0; i < req->n_segments; i++) {
		if (req->segments[i].len)
			memcpy(p, req->segments[i].text, req->segments[i].len);
		p += req->segments[i].len;
	}
	for (uint32_t i = 0; i < req->n_stop; i++) {
		memcpy(p, req->stop[i].p, req->stop[i].len);
		p += req->stop[i].len;
	}
	if (req->n_bias) {
		proto_put32(p, req->n_bias);
		p += 4;
		for (uint32_t i = 0; i < req->n_bias; i++, p += 8) {
			proto_put32(p, (uint32_t)req->bias[i].id);
			proto_putf32(p + 4, req->bias[i].bias);
		}
	}
	*len = (size_t)(p - buf);
	return 0;
}

/* Decoding a SUBMIT, one step per part of the payload in the order of
 * the README (§4.1). Each step takes its part from the cursor, copies
 * what must be private, checks it and fills its share of *out. */

/* The header's counts, which size every later part. */
struct sub_counts {
	uint32_t n_seg, flags, n_stop, n_idx, n_rows;
};

/* The sampling fields of a header copy. */
static void sub_sampling(const uint8_t *h, struct proto_sampling *sp)
{
	sp->temperature = proto_getf32(h + SUB_TEMPERATURE);
	sp->top_k = (int32_t)proto_get32(h + SUB_TOP_K);
	sp->top_p = proto_getf32(h + SUB_TOP_P);
	sp->min_p = proto_getf32(h + SUB_MIN_P);
	sp->penalty_last_n = (int32_t)proto_get32(h + SUB_PENALTY_LAST_N);
	sp->seed = proto_get64(h + SUB_SEED);
	sp->repeat_penalty = proto_getf32(h + SUB_REPEAT);
	sp->frequency_penalty = proto_getf32(h + SUB_FREQUENCY);
	sp->presence_penalty = proto_getf32(h + SUB_PRESENCE);
}

/* Header: flags, counts against the limits and the mask's shape; fills
 * req's fixed fields (req is cleared first). */
static int sub_header(struct cursor *c, const struct proto_limits *L, struct sub_counts *k,
		      struct proto_submit_req *req, char *err, size_t errlen)
{
	const uint8_t *src = take(c, SUB_HEADER);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: payload of %zu bytes, the "
				 "header alone takes %d", c->len, SUB_HEADER);
	uint8_t h[SUB_HEADER];
	proto_copy_in(h, src, sizeof(h));
	*k = (struct sub_counts){
		.n_seg = proto_get32(h + SUB_N_SEGMENTS),
		.flags = proto_get32(h + SUB_FLAGS),
		.n_stop = proto_get32(h + SUB_N_STOP),
		.n_idx = proto_get32(h + SUB_N_MASK_IDX),
		.n_rows = proto_get32(h + SUB_N_MASK_ROWS),
	};
	int rc = submit_flags_check(k->flags, err, errlen);
	if (rc)
		return rc;
	if (k->n_seg > L->max_segments)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: n_segments %" PRIu32
				 " over the limit %" PRIu32, k->n_seg, L->max_segments);
	if (k->n_stop > L->max_stop)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: n_stop %" PRIu32
				 " over the limit %" PRIu32, k->n_stop, L->max_stop);
	if (k->n_rows != 0 && k->n_rows != k->n_seg + 1)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: n_mask_rows %" PRIu32
				 ", must be 0 or n_segments + 1 = %" PRIu32, k->n_rows,
				 k->n_seg + 1);
	if (k->n_rows == 0 && k->n_idx != 0)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: n_mask_idx %" PRIu32
				 " without mask rows", k->n_idx);
	if (k->n_idx > PROTO_MAX_MASK_IDX)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: n_mask_idx %" PRIu32
				 " over the limit %d", k->n_idx, PROTO_MAX_MASK_IDX);

	memset(req, 0, sizeof(*req));
	req->n_segments = k->n_seg;
	req->flags = k->flags;
	req->max_tokens = proto_get32(h + SUB_MAX_TOKENS);
	req->n_stop = k->n_stop;
	sub_sampling(h, &req->sampling);
	return 0;
}

/* Segment table: lengths and roles, copied; the text total against the
 * limit. */
static int sub_segment_table(struct cursor *c, const struct proto_limits *L,
			     const struct sub_counts *k, struct proto_submit *out, char *err,
			     size_t errlen)
{
	const uint8_t *src = take(c, (uint64_t)k->n_seg * SUB_SEG_ENTRY);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment table (%" PRIu32
				 " entries) runs past the payload", k->n_seg);
	uint8_t segtab[PROTO_MAX_SEGMENTS * SUB_SEG_ENTRY];
	proto_copy_in(segtab, src, (size_t)k->n_seg * SUB_SEG_ENTRY);
	bool chat = k->flags & PROTO_SUBMIT_CHAT;
	uint64_t text_total = 0;
	for (uint32_t i = 0; i < k->n_seg; i++) {
		const uint8_t *e = segtab + (size_t)i * SUB_SEG_ENTRY;
		uint8_t role = e[4];
		int rc;
		if (e[6] || e[7])
			return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment %" PRIu32
					 ": reserved bytes not zero", i);
		rc = seg_check(i, role, e[5], proto_get32(e), chat, err, errlen);
		if (rc)
			return rc;
		out->seg[i].len = proto_get32(e);
		out->seg[i].role = role;
		out->seg[i].flags = e[5];
		text_total += out->seg[i].len;
	}
	if (text_total > L->max_text_bytes)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %" PRIu64
				 " bytes of segment text over the limit %" PRIu32, text_total,
				 L->max_text_bytes);
	return 0;
}

/* Mask row counts and indices, copied; the rows carved from the copy
 * must use up n_mask_idx exactly, then the descriptor's rules are
 * checked on the copy. No rows: no descriptor (req->mask stays NULL). */
static int sub_mask(struct cursor *c, const struct proto_limits *L, const struct sub_counts *k,
		    struct proto_submit *out, char *err, size_t errlen)
{
	if (!k->n_rows)
		return 0;
	const uint8_t *src = take(c, (uint64_t)k->n_rows * 4);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: mask row counts (%"
				 PRIu32 ") run past the payload", k->n_rows);
	uint8_t counts[(PROTO_MAX_SEGMENTS + 1) * 4];
	proto_copy_in(counts, src, (size_t)k->n_rows * 4);
	const uint8_t *isrc = take(c, (uint64_t)k->n_idx * 2);
	if (!isrc)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: mask indices (%" PRIu32
				 ") run past the payload", k->n_idx);
	proto_copy_in(out->idx, isrc, (size_t)k->n_idx * 2);
	uint64_t at = 0;
	for (uint32_t i = 0; i < k->n_rows; i++) {
		uint32_t n = proto_get32(counts + 4 * (size_t)i);
		if (n > k->n_idx - at)
			return sw_seterr(err, errlen, SW_EFORMAT, "submit: mask row %" PRIu32
					 ": %" PRIu32 " entries, only %" PRIu64
					 " of n_mask_idx left", i, n, k->n_idx - at);
		uint16_t *row = out->idx + at;
		for (uint32_t j = 0; j < n; j++)
			row[j] = proto_get16((const uint8_t *)&row[j]);
		out->rows[i].idx = row;
		out->rows[i].n = n;
		at += n;
	}
	if (at != k->n_idx)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: mask rows hold %" PRIu64
				 " indices, n_mask_idx says %" PRIu32, at, k->n_idx);
	out->mask.n_segments = k->n_seg;
	out->mask.rows = out->rows;
	int rc = submit_mask_check(&out->mask, L->max_segments, err, errlen);
	if (rc)
		return rc;
	out->req.mask = &out->mask;
	return 0;
}

/* Stop string lengths, copied: each 1..PROTO_MAX_STOP_LEN. */
static int sub_stop_lengths(struct cursor *c, const struct sub_counts *k,
			    struct proto_submit *out, char *err, size_t errlen)
{
	const uint8_t *src = take(c, (uint64_t)k->n_stop * 4);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: stop lengths (%" PRIu32
				 ") run past the payload", k->n_stop);
	uint8_t stoplen[PROTO_MAX_STOP * 4];
	proto_copy_in(stoplen, src, (size_t)k->n_stop * 4);
	for (uint32_t i = 0; i < k->n_stop; i++) {
		uint32_t l = proto_get32(stoplen + 4 * (size_t)i);
		if (l == 0)
			return sw_seterr(err, errlen, SW_EFORMAT, "submit: stop string %" PRIu32
					 " is empty", i);
		if (l > PROTO_MAX_STOP_LEN)
			return sw_seterr(err, errlen, SW_ETOOLONG, "submit: stop string %" PRIu32
					 ": %" PRIu32 " bytes over the limit %d", i, l,
					 PROTO_MAX_STOP_LEN);
		out->stop[i].len = l;
	}
	return 0;
}

/* Segment text: views into the payload. */
static int sub_segment_text(struct cursor *c, const struct sub_counts *k,
			    struct proto_submit *out, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < k->n_seg; i++) {
		const uint8_t *src = take(c, out->seg[i].len);
		if (!src)
			return sw_seterr(err, errlen, SW_EFORMAT, "submit: segment %" PRIu32
					 ": text of %" PRIu32 " bytes runs past the payload", i,
					 out->seg[i].len);
		out->seg[i].text = (const char *)src;
	}
	out->req.segments = k->n_seg ? out->seg : NULL;
	return 0;
}

/* Stop strings: copies. */
static int sub_stop_strings(struct cursor *c, const struct sub_counts *k,
			    struct proto_submit *out, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < k->n_stop; i++) {
		const uint8_t *src = take(c, out->stop[i].len);
		if (!src)
			return sw_seterr(err, errlen, SW_EFORMAT, "submit: stop string %" PRIu32
					 ": %" PRIu32 " bytes run past the payload", i,
					 out->stop[i].len);
		proto_copy_in(out->stop_buf[i], src, out->stop[i].len);
		out->stop[i].p = out->stop_buf[i];
	}
	out->req.stop = k->n_stop ? out->stop : NULL;
	return 0;
}

/* The logit-bias table, when the flag says one follows: its count
 * (1..PROTO_MAX_LOGIT_BIAS), then the entries, copied (ids and values are
 * gpud's to check). */
static int sub_bias(struct cursor *c, const struct sub_counts *k, struct proto_submit *out,
		    char *err, size_t errlen)
{
	const uint8_t *src;
	uint32_t n;

	out->req.n_bias = 0;
	out->req.bias = NULL;
	if (!(k->flags & PROTO_SUBMIT_LOGIT_BIAS))
		return 0;
	src = take(c, 4);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: logit-bias count runs past the "
				 "payload");
	n = proto_get32(src);
	if (n == 0 || n > PROTO_MAX_LOGIT_BIAS)
		return sw_seterr(err, errlen, n ? SW_ETOOLONG : SW_EFORMAT, "submit: %" PRIu32
				 " logit biases (1..%d with the flag)", n, PROTO_MAX_LOGIT_BIAS);
	src = take(c, (uint64_t)n * 8);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: logit-bias table (%" PRIu32
				 " entries) runs past the payload", n);
	uint8_t copy[8];
	for (uint32_t i = 0; i < n; i++) {
		proto_copy_in(copy, src + 8 * (size_t)i, 8);
		out->bias[i].id = (int32_t)proto_get32(copy);
		out->bias[i].bias = proto_getf32(copy + 4);
	}
	out->req.n_bias = n;
	out->req.bias = out->bias;
	return 0;
}

int proto_submit_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			struct proto_submit *out, char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "submit: NULL argument");
	struct proto_limits L = effective(lim);
	struct cursor c = { payload, len, 0 };
	struct sub_counts k;
	int rc;

	rc = sub_header(&c, &L, &k, &out->req, err, errlen);
	if (rc)
		return rc;
	rc = sub_segment_table(&c, &L, &k, out, err, errlen);
	if (rc)
		return rc;
	rc = sub_mask(&c, &L, &k, out, err, errlen);
	if (rc)
		return rc;
	rc = sub_stop_lengths(&c, &k, out, err, errlen);
	if (rc)
		return rc;
	rc = sub_segment_text(&c, &k, out, err, errlen);
	if (rc)
		return rc;
	rc = sub_stop_strings(&c, &k, out, err, errlen);
	if (rc)
		return rc;
	rc = sub_bias(&c, &k, out, err, errlen);
	if (rc)
		return rc;
	if (c.at != c.len)
		return sw_seterr(err, errlen, SW_EFORMAT, "submit: %zu trailing bytes after the "
				 "last field", c.len - c.at);
	return 0;
}

/* --- token batch ----------------------------------------------------------- */

size_t proto_tokens_size(uint32_t n_ids, uint32_t text_len)
{
	uint64_t t = 8 + (uint64_t)n_ids * 4 + text_len;
	return t > UINT32_MAX ? 0 : (size_t)t;
}

int proto_tokens_encode(uint8_t *buf, size_t cap, const int32_t *ids, uint32_t n_ids,
			const char *text, uint32_t text_len, size_t *len)
{
	if (!buf || !len || (n_ids && !ids) || (text_len && !text))
		return -EINVAL;
	size_t need = proto_tokens_size(n_ids, text_len);
	if (!need)
		return SW_ETOOLONG;
	if (need > cap)
		return -ENOSPC;
	proto_put32(buf, n_ids);
	proto_put32(buf + 4, text_len);
	for (uint32_t i = 0; i < n_ids; i++)
		proto_put32(buf + 8 + 4 * (size_t)i, (uint32_t)ids[i]);
	if (text_len)
		memcpy(buf + 8 + 4 * (size_t)n_ids, text, text_len);
	*len = need;
	return 0;
}

/* A token batch's counts against the limits (TOKENS and TOKENS_LP). */
static int batch_limits(const char *what, uint32_t n, uint32_t tl, const struct proto_limits *L,
			char *err, size_t errlen)
{
	if (n > L->max_ids)
		return sw_seterr(err, errlen, SW_ETOOLONG, "%s: n_ids %" PRIu32
				 " over the limit %" PRIu32, what, n, L->max_ids);
	if (tl > L->max_text_bytes)
		return sw_seterr(err, errlen, SW_ETOOLONG, "%s: text_len %" PRIu32
				 " over the limit %" PRIu32, what, tl, L->max_text_bytes);
	return 0;
}

int proto_tokens_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			struct proto_tokens *out, char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "tokens: NULL argument");
	struct proto_limits L = effective(lim);
	struct cursor c = { payload, len, 0 };
	const uint8_t *src = take(&c, 8);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens: payload of %zu bytes, the "
				 "header takes 8", len);
	uint8_t h[8];
	proto_copy_in(h, src, sizeof(h));
	uint32_t n = proto_get32(h), tl = proto_get32(h + 4);
	int rc = batch_limits("tokens", n, tl, &L, err, errlen);
	if (rc)
		return rc;
	const uint8_t *ids = take(&c, (uint64_t)n * 4);
	const uint8_t *text = ids ? take(&c, tl) : NULL;
	if (!ids || !text || c.at != c.len)
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens: n_ids %" PRIu32 " and text_len %"
				 PRIu32 " do not add up to the payload of %zu bytes", n, tl, len);
	*out = (struct proto_tokens){ .n_ids = n, .ids_le = ids, .text_len = tl,
				      .text = (const char *)text };
	return 0;
}

/* --- token batch with log probabilities (TOKENS_LP) ---------------------- */

/* Header: n_ids, text_len, n_top, pieces_len, flags; then the (id,
 * logprob) entries, the u16 piece lengths, the text, the pieces. */
#define LP_HEADER PROTO_TOKENS_LP_HEADER

static uint64_t lp_entries(uint32_t n_ids, uint32_t n_top)
{
	return (uint64_t)n_ids * (1 + (uint64_t)n_top);
}

size_t proto_tokens_lp_size(uint32_t n_ids, uint32_t n_top, uint32_t text_len,
			    uint32_t pieces_len)
{
	uint64_t t = LP_HEADER + lp_entries(n_ids, n_top) * 10 + (uint64_t)text_len + pieces_len;
	return t > UINT32_MAX ? 0 : (size_t)t;
}

int proto_tokens_lp_encode(uint8_t *buf, size_t cap, uint32_t n_ids, uint32_t n_top,
			   const int32_t *ids, const float *lps, const uint16_t *plen,
			   const char *pieces, uint32_t pieces_len, const char *text,
			   uint32_t text_len, uint32_t flags, size_t *len)
{
	if (!buf || !len || n_top > PROTO_MAX_TOP_LOGPROBS || (flags & ~PROTO_LP_KNOWN) ||
	    ((flags & PROTO_LP_EOG) && !n_ids) ||
	    (flags & (PROTO_LP_EOG | PROTO_LP_PROMPT)) == (PROTO_LP_EOG | PROTO_LP_PROMPT) ||
	    (n_ids && (!ids || !lps || !plen)) || (text_len && !text) || (pieces_len && !pieces))
		return -EINVAL;
	uint64_t n = lp_entries(n_ids, n_top), sum = 0;
	for (uint64_t e = 0; e < n; e++)
		sum += plen[e];
	if (sum != pieces_len)
		return -EINVAL;
	size_t need = proto_tokens_lp_size(n_ids, n_top, text_len, pieces_len);
	if (!need)
		return SW_ETOOLONG;
	if (need > cap)
		return -ENOSPC;
	proto_put32(buf, n_ids);
	proto_put32(buf + 4, text_len);
	proto_put32(buf + 8, n_top);
	proto_put32(buf + 12, pieces_len);
	proto_put32(buf + 16, flags);
	uint8_t *p = buf + LP_HEADER;
	for (uint64_t e = 0; e < n; e++, p += 8) {
		proto_put32(p, (uint32_t)ids[e]);
		proto_putf32(p + 4, lps[e]);
	}
	for (uint64_t e = 0; e < n; e++, p += 2)
		proto_put16(p, plen[e]);
	if (text_len)
		memcpy(p, text, text_len);
	if (pieces_len)
		memcpy(p + text_len, pieces, pieces_len);
	*len = need;
	return 0;
}

int proto_tokens_lp_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			   struct proto_tokens *out, char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "tokens_lp: NULL argument");
	struct proto_limits L = effective(lim);
	struct cursor c = { payload, len, 0 };
	const uint8_t *src = take(&c, LP_HEADER);
	if (!src)
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens_lp: payload of %zu bytes, the "
				 "header takes %d", len, LP_HEADER);
	uint8_t h[LP_HEADER];
	proto_copy_in(h, src, sizeof(h));
	uint32_t n = proto_get32(h), tl = proto_get32(h + 4), top = proto_get32(h + 8),
		 pl = proto_get32(h + 12), fl = proto_get32(h + 16);
	int rc = batch_limits("tokens_lp", n, tl, &L, err, errlen);
	if (rc)
		return rc;
	if (top > PROTO_MAX_TOP_LOGPROBS)
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens_lp: n_top %" PRIu32
				 ", at most %d", top, PROTO_MAX_TOP_LOGPROBS);
	if ((fl & ~PROTO_LP_KNOWN) || ((fl & PROTO_LP_EOG) && !n) ||
	    (fl & (PROTO_LP_EOG | PROTO_LP_PROMPT)) == (PROTO_LP_EOG | PROTO_LP_PROMPT))
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens_lp: flags 0x%" PRIx32
				 " (unknown bits, EOG without a token or on the prompt's)", fl);
	uint64_t ne = lp_entries(n, top);
	const uint8_t *lp = take(&c, ne * 8);
	const uint8_t *plen = lp ? take(&c, ne * 2) : NULL;
	const uint8_t *text = plen ? take(&c, tl) : NULL;
	const uint8_t *pieces = text ? take(&c, pl) : NULL;
	if (!pieces || c.at != c.len)
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens_lp: n_ids %" PRIu32 ", n_top %"
				 PRIu32 ", text_len %" PRIu32 " and pieces_len %" PRIu32
				 " do not add up to the payload of %zu bytes", n, top, tl, pl, len);
	uint64_t sum = 0;
	for (uint64_t e = 0; e < ne; e++)
		sum += proto_get16(plen + 2 * e);
	if (sum != pl)
		return sw_seterr(err, errlen, SW_EFORMAT, "tokens_lp: piece lengths add up to %"
				 PRIu64 " bytes, pieces_len is %" PRIu32, sum, pl);
	*out = (struct proto_tokens){
		.n_ids = n, .ids_le = NULL, .text_len = tl, .text = (const char *)text,
		.logprobs = true, .eog = fl & PROTO_LP_EOG, .prompt = fl & PROTO_LP_PROMPT,
		.n_top = top, .lp_le = lp,
		.plen_le = plen,
		.pieces = (const char *)pieces, .pieces_len = pl,
	};
	return 0;
}

bool proto_lp_next(struct proto_lp_iter *it, struct proto_lp_entry *out)
{
	const struct proto_tokens *t = it->t;
	uint32_t per = 1 + t->n_top;

	if (!t->logprobs || it->e >= lp_entries(t->n_ids, t->n_top))
		return false;
	uint32_t pl = proto_get16(t->plen_le + 2 * (size_t)it->e);
	if (pl > t->pieces_len - it->off)
		return false;
	out->token = it->e / per;
	out->rank = it->e % per;
	out->id = (int32_t)proto_get32(t->lp_le + 8 * (size_t)it->e);
	out->logprob = proto_getf32(t->lp_le + 8 * (size_t)it->e + 4);
	out->piece = t->pieces + it->off;
	out->piece_len = pl;
	it->e++;
	it->off += pl;
	return true;
}

/* --- done ------------------------------------------------------------------ */

int proto_done_encode(uint8_t *buf, size_t cap, const struct proto_done *d, size_t *len)
{
	if (!buf || !d || !len)
		return -EINVAL;
	if (cap < PROTO_DONE_SIZE)
		return -ENOSPC;
	proto_put32(buf, d->prompt_tokens);
	proto_put32(buf + 4, d->cached_prompt_tokens);
	proto_put32(buf + 8, d->generated_tokens);
	proto_put32(buf + 12, d->stop_reason);
	proto_put64(buf + 16, d->queue_us);
	proto_put64(buf + 24, d->prefill_us);
	proto_put64(buf + 32, d->decode_us);
	proto_put64(buf + 40, d->total_us);
	*len = PROTO_DONE_SIZE;
	return 0;
}

int proto_done_decode(const uint8_t *payload, size_t len, struct proto_done *out,
		      char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "done: NULL argument");
	if (len != PROTO_DONE_SIZE)
		return sw_seterr(err, errlen, SW_EFORMAT, "done: payload of %zu bytes, expected %d",
				 len, PROTO_DONE_SIZE);
	uint8_t b[PROTO_DONE_SIZE];
	proto_copy_in(b, payload, sizeof(b));
	out->prompt_tokens = proto_get32(b);
	out->cached_prompt_tokens = proto_get32(b + 4);
	out->generated_tokens = proto_get32(b + 8);
	out->stop_reason = proto_get32(b + 12);
	out->queue_us = proto_get64(b + 16);
	out->prefill_us = proto_get64(b + 24);
	out->decode_us = proto_get64(b + 32);
	out->total_us = proto_get64(b + 40);
	if (out->cached_prompt_tokens > out->prompt_tokens)
		return sw_seterr(err, errlen, SW_EFORMAT, "done: cached_prompt_tokens %" PRIu32
				 " > prompt_tokens %" PRIu32, out->cached_prompt_tokens,
				 out->prompt_tokens);
	return 0;
}

/* --- error ----------------------------------------------------------------- */

size_t proto_error_size(size_t msg_len)
{
	if (msg_len > PROTO_MAX_ERROR_MSG - 1)
		msg_len = PROTO_MAX_ERROR_MSG - 1;
	return 8 + msg_len;
}

int proto_error_encode(uint8_t *buf, size_t cap, int32_t code, const char *msg, size_t *len)
{
	if (!buf || !len || code >= 0)
		return -EINVAL;
	size_t ml = msg ? strnlen(msg, PROTO_MAX_ERROR_MSG - 1) : 0;
	if (8 + ml > cap)
		return -ENOSPC;
	proto_put32(buf, (uint32_t)code);
	proto_put32(buf + 4, (uint32_t)ml);
	if (ml)
		memcpy(buf + 8, msg, ml);
	*len = 8 + ml;
	return 0;
}

int proto_error_decode(const uint8_t *payload, size_t len, struct proto_error *out,
		       char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "error: NULL argument");
	if (len < 8)
		return sw_seterr(err, errlen, SW_EFORMAT, "error: payload of %zu bytes, the "
				 "header takes 8", len);
	uint8_t h[8];
	proto_copy_in(h, payload, sizeof(h));
	int32_t code = (int32_t)proto_get32(h);
	uint32_t ml = proto_get32(h + 4);
	if (code >= 0)
		return sw_seterr(err, errlen, SW_EFORMAT, "error: code %" PRId32
				 " is not negative", code);
	if (ml > PROTO_MAX_ERROR_MSG - 1)
		return sw_seterr(err, errlen, SW_ETOOLONG, "error: message of %" PRIu32
				 " bytes over the limit %d", ml, PROTO_MAX_ERROR_MSG - 1);
	if (len - 8 != ml)
		return sw_seterr(err, errlen, SW_EFORMAT, "error: msg_len %" PRIu32
				 " but %zu bytes follow", ml, len - 8);
	out->code = code;
	proto_copy_in(out->msg, payload + 8, ml);
	out->msg[ml] = '\0';
	return 0;
}

/* --- tokenize / embed requests ------------------------------------------------ */

size_t proto_text_req_size(uint32_t len)
{
	return (size_t)8 + len; /* never over u32 + 8, which size_t holds */
}

static uint32_t text_req_known(uint16_t type)
{
	return type == PROTO_T_TOKENIZE ? PROTO_TOK_FLAGS_KNOWN :
	       type == PROTO_T_DETOKENIZE ? PROTO_DETOK_FLAGS_KNOWN : 0;
}

static bool text_req_type(uint16_t type)
{
	return type == PROTO_T_TOKENIZE || type == PROTO_T_EMBED || type == PROTO_T_DETOKENIZE;
}

int proto_text_req_encode(uint16_t type, uint8_t *buf, size_t cap, uint32_t flags,
			  const char *text, uint32_t len, size_t *out_len)
{
	if (!buf || !out_len || (len && !text) || !text_req_type(type) ||
	    (flags & ~text_req_known(type)) || (type == PROTO_T_DETOKENIZE && len % 4))
		return -EINVAL;
	if (proto_text_req_size(len) > cap)
		return -ENOSPC;
	proto_put32(buf, flags);
	proto_put32(buf + 4, len);
	if (len)
		memcpy(buf + 8, text, len);
	*out_len = proto_text_req_size(len);
	return 0;
}

int proto_text_req_decode(uint16_t type, const uint8_t *payload, size_t len,
			  const struct proto_limits *lim, struct proto_text_req *out,
			  char *err, size_t errlen)
{
	if (!out || (!payload && len) || !text_req_type(type))
		return sw_seterr(err, errlen, -EINVAL, "text request: bad argument");
	const char *tn = proto_type_name(type);
	struct proto_limits L = effective(lim);
	if (len < 8)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: payload of %zu bytes, the header "
				 "takes 8", tn, len);
	uint8_t h[8];
	proto_copy_in(h, payload, sizeof(h));
	uint32_t flags = proto_get32(h), tl = proto_get32(h + 4);
	if (flags & ~text_req_known(type))
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: flags: unknown bits 0x%" PRIx32, tn,
				 flags & ~text_req_known(type));
	if (type == PROTO_T_DETOKENIZE) {
		if (tl % 4)
			return sw_seterr(err, errlen, SW_EFORMAT, "%s: %" PRIu32 " bytes of ids, "
					 "not a multiple of 4", tn, tl);
		if (tl / 4 > L.max_ids)
			return sw_seterr(err, errlen, SW_ETOOLONG, "%s: %" PRIu32 " ids over the "
					 "limit %" PRIu32, tn, tl / 4, L.max_ids);
	} else if (tl > L.max_text_bytes) {
		return sw_seterr(err, errlen, SW_ETOOLONG, "%s: text_len %" PRIu32
				 " over the limit %" PRIu32, tn, tl, L.max_text_bytes);
	}
	if (len - 8 != tl)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: text_len %" PRIu32
				 " but %zu bytes follow", tn, tl, len - 8);
	*out = (struct proto_text_req){ flags, (const char *)payload + 8, tl };
	return 0;
}

/* --- embed reply --------------------------------------------------------------- */

size_t proto_embedding_size(uint32_t dim)
{
	uint64_t t = 8 + (uint64_t)dim * 4;
	return t > UINT32_MAX ? 0 : (size_t)t;
}

int proto_embedding_encode(uint8_t *buf, size_t cap, const float *values, uint32_t dim,
			   size_t *len)
{
	if (!buf || !len || (dim && !values))
		return -EINVAL;
	size_t need = proto_embedding_size(dim);
	if (!need)
		return SW_ETOOLONG;
	if (need > cap)
		return -ENOSPC;
	proto_put32(buf, dim);
	proto_put32(buf + 4, 0);
	for (uint32_t i = 0; i < dim; i++)
		proto_putf32(buf + 8 + 4 * (size_t)i, values[i]);
	*len = need;
	return 0;
}

int proto_embedding_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			   struct proto_embedding *out, char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "embedding: NULL argument");
	struct proto_limits L = effective(lim);
	if (len < 8)
		return sw_seterr(err, errlen, SW_EFORMAT, "embedding: payload of %zu bytes, the "
				 "header takes 8", len);
	uint8_t h[8];
	proto_copy_in(h, payload, sizeof(h));
	uint32_t dim = proto_get32(h);
	if (proto_get32(h + 4))
		return sw_seterr(err, errlen, SW_EFORMAT, "embedding: reserved word not zero");
	if (dim > L.max_embed_dim)
		return sw_seterr(err, errlen, SW_ETOOLONG, "embedding: dim %" PRIu32
				 " over the limit %" PRIu32, dim, L.max_embed_dim);
	if ((len - 8) / 4 != dim || (len - 8) % 4)
		return sw_seterr(err, errlen, SW_EFORMAT, "embedding: dim %" PRIu32
				 " but %zu bytes follow", dim, len - 8);
	*out = (struct proto_embedding){ dim, payload + 8 };
	return 0;
}

/* --- mem request, JSON replies ---------------------------------------------------- */

int proto_mem_req_encode(uint8_t *buf, size_t cap, uint32_t flags, size_t *len)
{
	if (!buf || !len || (flags & ~PROTO_MEM_FLAGS_KNOWN))
		return -EINVAL;
	if (cap < PROTO_MEM_REQ_SIZE)
		return -ENOSPC;
	proto_put32(buf, flags);
	*len = PROTO_MEM_REQ_SIZE;
	return 0;
}

int proto_mem_req_decode(const uint8_t *payload, size_t len, uint32_t *flags,
			 char *err, size_t errlen)
{
	if (!flags || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "mem: NULL argument");
	if (len != PROTO_MEM_REQ_SIZE)
		return sw_seterr(err, errlen, SW_EFORMAT, "mem: payload of %zu bytes, expected %d",
				 len, PROTO_MEM_REQ_SIZE);
	uint8_t b[PROTO_MEM_REQ_SIZE];
	proto_copy_in(b, payload, sizeof(b));
	uint32_t f = proto_get32(b);
	if (f & ~PROTO_MEM_FLAGS_KNOWN)
		return sw_seterr(err, errlen, SW_EFORMAT, "mem: flags: unknown bits 0x%" PRIx32,
				 f & ~PROTO_MEM_FLAGS_KNOWN);
	*flags = f;
	return 0;
}

size_t proto_json_size(uint32_t len)
{
	return (size_t)4 + len;
}

int proto_json_encode(uint8_t *buf, size_t cap, const char *json, uint32_t len,
		      size_t *out_len)
{
	if (!buf || !out_len || (len && !json))
		return -EINVAL;
	if (proto_json_size(len) > cap)
		return -ENOSPC;
	proto_put32(buf, len);
	if (len)
		memcpy(buf + 4, json, len);
	*out_len = proto_json_size(len);
	return 0;
}

int proto_json_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
		      struct proto_text *out, char *err, size_t errlen)
{
	if (!out || (!payload && len))
		return sw_seterr(err, errlen, -EINVAL, "json: NULL argument");
	struct proto_limits L = effective(lim);
	if (len < 4)
		return sw_seterr(err, errlen, SW_EFORMAT, "json: payload of %zu bytes, the "
				 "length takes 4", len);
	uint8_t h[4];
	proto_copy_in(h, payload, sizeof(h));
	uint32_t jl = proto_get32(h);
	if (jl > L.max_json_bytes)
		return sw_seterr(err, errlen, SW_ETOOLONG, "json: %" PRIu32
				 " bytes over the limit %" PRIu32, jl, L.max_json_bytes);
	if (len - 4 != jl)
		return sw_seterr(err, errlen, SW_EFORMAT, "json: length %" PRIu32
				 " but %zu bytes follow", jl, len - 4);
	*out = (struct proto_text){ (const char *)payload + 4, jl };
	return 0;
}
