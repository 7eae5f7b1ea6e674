/* fuzz_frame.c - libFuzzer target: random bytes as a frame plus a random
 * region -> frame validation, payload bounds, every payload decoder and
 * the ring consumer never crash and never read outside their input.
 *
 * Input layout:
 *   [0, 40)   the frame, as it would arrive on the socket
 *   [40, end) the region (the frame's payload_offset counts from here); it
 *             sits at the end of the input buffer, so any read past a
 *             payload that runs to the end is an ASan error
 * Inputs shorter than 40 bytes go to proto_frame_decode as they are.
 *
 * Checked invariants (a violation traps):
 *  - a payload the frame check accepts lies inside the region;
 *  - every view a decoder returns lies inside the payload it was given;
 *  - a decoded SUBMIT re-encodes to exactly the bytes it came from, and
 *    its mask passes proto_mask_validate at the hard limit (so gpud could
 *    never index a bitset out of range with it); TOKENS re-encode
 *    identically too;
 *  - ring records the consumer returns lie inside the ring's data area.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/shm.h"
#include "tests/fuzz/fuzz.h"

static struct proto_submit g_sub;
static uint8_t g_enc[1 << 16];

static bool inside(const void *p, size_t n, const uint8_t *base, size_t len)
{
	const uint8_t *q = p;
	return (n == 0 && !p) || (q >= base && q <= base + len && n <= (size_t)(base + len - q));
}

static void decode_submit(const uint8_t *p, size_t n, const struct proto_limits *lim)
{
	char err[SW_ERR_MAX];
	if (proto_submit_decode(p, n, lim, &g_sub, err, sizeof(err)) != 0)
		return;
	const struct proto_submit_req *r = &g_sub.req;
	for (uint32_t i = 0; i < r->n_segments; i++)
		CHECK(inside(r->segments[i].text, r->segments[i].len, p, n));
	if (r->mask)
		CHECK(proto_mask_validate(r->mask, 0, NULL, 0) == 0);
	/* Decoding is the exact inverse of encoding. The copies were taken
	 * once; the payload is not shared here, so it has not moved. */
	size_t len;
	if (n <= sizeof(g_enc)) {
		CHECK(proto_submit_encode(r, g_enc, sizeof(g_enc), &len, NULL, 0) == 0);
		CHECK(len == n && memcmp(g_enc, p, n) == 0);
	}
}

static void decode_all(uint16_t type, const uint8_t *p, size_t n, const struct proto_limits *lim)
{
	char err[SW_ERR_MAX];
	struct proto_tokens t;
	struct proto_done d;
	struct proto_error e;
	struct proto_text_req tr;
	struct proto_embedding em;
	struct proto_text js;
	uint32_t flags;

	switch (type) {
	case PROTO_T_SUBMIT:
		decode_submit(p, n, lim);
		break;
	case PROTO_T_TOKENS:
	case PROTO_T_TOKENIZE_REPLY:
	case PROTO_T_DETOKENIZE_REPLY:
		if (proto_tokens_decode(p, n, lim, &t, err, sizeof(err)) == 0) {
			CHECK(inside(t.ids_le, (size_t)t.n_ids * 4, p, n));
			CHECK(inside(t.text, t.text_len, p, n));
			int64_t sum = 0;
			for (uint32_t i = 0; i < t.n_ids; i++)
				sum += proto_tokens_id(&t, i);
			(void)sum;
		}
		break;
	case PROTO_T_TOKENS_LP:
		if (proto_tokens_lp_decode(p, n, lim, &t, err, sizeof(err)) == 0) {
			size_t ne = (size_t)t.n_ids * (1 + t.n_top);
			struct proto_lp_iter it;
			struct proto_lp_entry le;
			size_t walked = 0;
			CHECK(t.n_top <= PROTO_MAX_TOP_LOGPROBS);
			CHECK(inside(t.lp_le, ne * 8, p, n));
			CHECK(inside(t.plen_le, ne * 2, p, n));
			CHECK(inside(t.text, t.text_len, p, n));
			CHECK(inside(t.pieces, t.pieces_len, p, n));
			proto_lp_iter_init(&it, &t);
			while (proto_lp_next(&it, &le)) {
				CHECK(inside(le.piece, le.piece_len, p, n));
				walked++;
			}
			CHECK(walked == ne);
			for (uint32_t i = 0; i < t.n_ids; i++)
				(void)proto_tokens_id(&t, i);
		}
		break;
	case PROTO_T_DONE:
		if (proto_done_decode(p, n, &d, err, sizeof(err)) == 0)
			CHECK(d.cached_prompt_tokens <= d.prompt_tokens);
		break;
	case PROTO_T_ERROR:
		if (proto_error_decode(p, n, &e, err, sizeof(err)) == 0)
			CHECK(e.code < 0 && strlen(e.msg) < PROTO_MAX_ERROR_MSG);
		break;
	case PROTO_T_TOKENIZE:
	case PROTO_T_EMBED:
	case PROTO_T_DETOKENIZE:
		if (proto_text_req_decode(type, p, n, lim, &tr, err, sizeof(err)) == 0) {
			CHECK(inside(tr.text, tr.len, p, n));
			CHECK(type != PROTO_T_DETOKENIZE || tr.len % 4 == 0);
		}
		break;
	case PROTO_T_EMBED_REPLY:
		if (proto_embedding_decode(p, n, lim, &em, err, sizeof(err)) == 0) {
			CHECK(inside(em.values_le, (size_t)em.dim * 4, p, n));
			float s = 0;
			for (uint32_t i = 0; i < em.dim; i++)
				s += proto_embedding_value(&em, i);
			(void)s;
		}
		break;
	case PROTO_T_MEM:
		(void)proto_mem_req_decode(p, n, &flags, err, sizeof(err));
		break;
	case PROTO_T_STATS_REPLY:
	case PROTO_T_MEM_REPLY:
		if (proto_json_decode(p, n, lim, &js, err, sizeof(err)) == 0)
			CHECK(inside(js.p, js.len, p, n));
		break;
	default:
		break;
	}
}

/* The region as a ring block seen by a consumer: indices and record
 * headers are whatever the input says. */
static void consume_ring(const uint8_t *region, size_t len)
{
	if (len < PROTO_RING_CTL + PROTO_RING_MIN_CAP)
		return;
	size_t cap = PROTO_RING_MIN_CAP;
	while (cap * 2 <= len - PROTO_RING_CTL && cap < 4096)
		cap *= 2;
	size_t total = PROTO_RING_CTL + cap;
	uint8_t *mem = aligned_alloc(64, total);
	if (!mem)
		return;
	memcpy(mem, region, total);
	struct proto_ring *r;
	if (proto_ring_open(&r, mem, total, PROTO_RING_CONSUMER, NULL, 0) == 0) {
		const uint8_t *data = mem + PROTO_RING_CTL;
		for (int i = 0; i < 64; i++) {
			struct proto_record rec;
			if (proto_ring_peek(r, &rec) != 0)
				break;
			CHECK(rec.type != 0);
			CHECK(inside(rec.payload, rec.len, data, cap));
			decode_all(rec.type, rec.payload, rec.len, NULL);
			CHECK(proto_ring_consume(r) == 0);
		}
		proto_ring_close(r);
	}
	free(mem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_frame f;
	char err[SW_ERR_MAX];
	if (size < PROTO_FRAME_SIZE) {
		CHECK(proto_frame_decode(data, size, &f, err, sizeof(err)) == SW_EFORMAT);
		return 0;
	}
	const uint8_t *region = data + PROTO_FRAME_SIZE;
	size_t rlen = size - PROTO_FRAME_SIZE;
	struct proto_limits lim;
	proto_limits_default(&lim);
	/* Tight limits from the last region byte, to reach the SW_ETOOLONG
	 * branches with small inputs. */
	if (rlen && (region[rlen - 1] & 1)) {
		lim.max_segments = 1 + region[rlen - 1] % 8;
		lim.max_stop = 1 + region[rlen - 1] % 3;
		lim.max_text_bytes = 16;
		lim.max_ids = 4;
		lim.max_embed_dim = 4;
		lim.max_json_bytes = 16;
	}

	int rc = proto_frame_decode(data, PROTO_FRAME_SIZE, &f, err, sizeof(err));
	if (rc == 0) {
		CHECK(f.type > 0 && f.type < PROTO_T_LAST);
		/* The request area is the whole region, then all but its first
		 * 64 bytes (the header and ring are never payload). */
		for (int pass = 0; pass < 2; pass++) {
			uint64_t off = pass ? (rlen < 64 ? rlen : 64) : 0;
			const void *p;
			if (proto_frame_payload(&f, region, off, rlen - off, &p, err, sizeof(err)))
				continue;
			if (!p)
				continue;
			CHECK(inside(p, f.payload_length, region + off, rlen - off));
			decode_all(f.type, p, f.payload_length, &lim);
		}
	} else {
		CHECK(rc == SW_EFORMAT || rc == SW_EVERSION || rc == SW_EUNSUPPORTED);
	}

	/* Whatever the frame said, every decoder sees the raw region too. */
	for (uint16_t t = 1; t < PROTO_T_LAST; t++)
		decode_all(t, rlen ? region : NULL, rlen, &lim);
	consume_ring(region, rlen);
	return 0;
}
