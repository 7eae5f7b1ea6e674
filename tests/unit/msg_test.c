/* msg_test.c - payload encoding and decoding (proto/msg.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/msg.h"

static char g_err[SW_ERR_MAX];
static uint8_t g_buf[64 * 1024];
static struct proto_submit g_sub; /* about 23 KiB: not on the stack */

/* A request with everything in it: chat roles, a block-attention mask
 * (chunks 1 and 2 see only s0 and themselves; G sees all but s0),
 * non-default sampling, two stop strings. */
struct full_req {
	struct proto_segment seg[3];
	uint16_t idx[4][4];
	struct proto_mask_row rows[4];
	struct proto_mask_desc mask;
	struct proto_text stop[2];
	struct proto_submit_req req;
};

static void full_req_init(struct full_req *f)
{
	memset(f, 0, sizeof(*f));
	f->seg[0] = (struct proto_segment){ "You are terse.", 14, PROTO_ROLE_SYSTEM, 0 };
	f->seg[1] = (struct proto_segment){ "chunk one", 9, PROTO_ROLE_USER, 0 };
	f->seg[2] = (struct proto_segment){ "chunk two, longer", 17, PROTO_ROLE_USER, 0 };
	static const uint16_t vis[4][4] = { { 0 }, { 0, 1 }, { 0, 2 }, { 1, 2, 3 } };
	static const uint32_t nvis[4] = { 1, 2, 2, 3 };
	for (int i = 0; i < 4; i++) {
		memcpy(f->idx[i], vis[i], sizeof(vis[i]));
		f->rows[i] = (struct proto_mask_row){ f->idx[i], nvis[i] };
	}
	f->mask = (struct proto_mask_desc){ 3, f->rows };
	f->stop[0] = (struct proto_text){ "\n\n", 2 };
	f->stop[1] = (struct proto_text){ "User:", 5 };
	f->req = (struct proto_submit_req){
		.n_segments = 3,
		.segments = f->seg,
		.mask = &f->mask,
		.max_tokens = 200,
		.flags = PROTO_SUBMIT_CHAT,
		.n_stop = 2,
		.stop = f->stop,
	};
	proto_sampling_default(&f->req.sampling);
	f->req.sampling.temperature = 0.7f;
	f->req.sampling.top_k = 40;
	f->req.sampling.top_p = 0.9f;
	f->req.sampling.min_p = 0.05f;
	f->req.sampling.seed = 0xDEADBEEFCAFEull;
	f->req.sampling.penalty_last_n = 64;
	f->req.sampling.repeat_penalty = 1.1f;
	f->req.sampling.frequency_penalty = 0.25f;
	f->req.sampling.presence_penalty = -0.5f;
}

static size_t encode_ok(const struct proto_submit_req *req)
{
	size_t len = 0, size = 0;
	assert_int_equal(proto_submit_size(req, &size, g_err, sizeof(g_err)), 0);
	assert_int_equal(proto_submit_encode(req, g_buf, sizeof(g_buf), &len, g_err,
					     sizeof(g_err)), 0);
	assert_int_equal(len, size);
	return len;
}

static void assert_req_equal(const struct proto_submit_req *a, const struct proto_submit_req *b)
{
	assert_int_equal(a->n_segments, b->n_segments);
	for (uint32_t i = 0; i < a->n_segments; i++) {
		assert_int_equal(a->segments[i].len, b->segments[i].len);
		assert_int_equal(a->segments[i].role, b->segments[i].role);
		assert_int_equal(a->segments[i].flags, b->segments[i].flags);
		assert_memory_equal(a->segments[i].text, b->segments[i].text, a->segments[i].len);
	}
	assert_int_equal(!a->mask, !b->mask);
	if (a->mask) {
		assert_int_equal(a->mask->n_segments, b->mask->n_segments);
		for (uint32_t i = 0; i <= a->mask->n_segments; i++) {
			assert_int_equal(a->mask->rows[i].n, b->mask->rows[i].n);
			for (uint32_t j = 0; j < a->mask->rows[i].n; j++)
				assert_int_equal(a->mask->rows[i].idx[j], b->mask->rows[i].idx[j]);
		}
	}
	assert_memory_equal(&a->sampling, &b->sampling, sizeof(a->sampling));
	assert_int_equal(a->max_tokens, b->max_tokens);
	assert_int_equal(a->flags, b->flags);
	assert_int_equal(a->n_stop, b->n_stop);
	for (uint32_t i = 0; i < a->n_stop; i++) {
		assert_int_equal(a->stop[i].len, b->stop[i].len);
		assert_memory_equal(a->stop[i].p, b->stop[i].p, a->stop[i].len);
	}
	assert_int_equal(a->n_bias, b->n_bias);
	for (uint32_t i = 0; i < a->n_bias; i++) {
		assert_int_equal(a->bias[i].id, b->bias[i].id);
		assert_true(a->bias[i].bias == b->bias[i].bias);
	}
}

static void test_submit_roundtrip(void **state)
{
	(void)state;
	struct full_req f;
	full_req_init(&f);
	size_t len = encode_ok(&f.req);
	assert_int_equal(len, 64 + 3 * 8 + 4 * 4 + 8 * 2 + 2 * 4 + 14 + 9 + 17 + 2 + 5);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	assert_req_equal(&f.req, &g_sub.req);

	/* Text is a view into the payload; mask and stop strings are copies. */
	const char *text = (const char *)g_buf;
	assert_true(g_sub.req.segments[0].text >= text &&
		    g_sub.req.segments[2].text + 17 <= text + len);
	assert_ptr_equal(g_sub.req.mask, &g_sub.mask);
	assert_ptr_equal(g_sub.req.stop[1].p, g_sub.stop_buf[1]);
	/* a peer rewriting the payload afterwards: copies keep their values */
	size_t idx_at = 64 + 3 * 8 + 4 * 4;
	for (size_t i = idx_at; i < idx_at + 16; i++)
		g_buf[i] = 0xFF; /* every index now 0xFFFF */
	memset(g_buf + len - 7, 'X', 7); /* both stop strings */
	assert_int_equal(g_sub.req.mask->rows[3].idx[2], 3);
	assert_memory_equal(g_sub.req.stop[1].p, "User:", 5);
	/* ...and the views see the change, as documented */
	g_buf[64 + 3 * 8 + 16 + 16 + 8] = 'y';
	assert_int_equal(g_sub.req.segments[0].text[0], 'y');
}

static void test_submit_minimal(void **state)
{
	(void)state;
	/* no segments, no mask, no stop strings */
	struct proto_submit_req req = { 0 };
	proto_sampling_default(&req.sampling);
	size_t len = encode_ok(&req);
	assert_int_equal(len, 64);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	assert_null(g_sub.req.mask);
	assert_null(g_sub.req.segments);
	assert_null(g_sub.req.stop);
	assert_req_equal(&req, &g_sub.req);

	/* empty segments, mask with rows NULL (= none), plain text */
	struct proto_segment seg[2] = { { NULL, 0, 0, 0 }, { "x", 1, 0, 0 } };
	struct proto_mask_desc none = { 2, NULL };
	req.n_segments = 2;
	req.segments = seg;
	req.mask = &none;
	len = encode_ok(&req);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	assert_null(g_sub.req.mask);
	assert_int_equal(g_sub.req.segments[0].len, 0);
	assert_int_equal(g_sub.req.segments[1].text[0], 'x');

	/* zero segments with a mask: one row, G sees itself */
	uint16_t g0 = 0;
	struct proto_mask_row row = { &g0, 1 };
	struct proto_mask_desc m0 = { 0, &row };
	req.n_segments = 0;
	req.segments = NULL;
	req.mask = &m0;
	len = encode_ok(&req);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	assert_non_null(g_sub.req.mask);
	assert_int_equal(g_sub.req.mask->rows[0].n, 1);
}

/* 127 segments with every row written out: the largest descriptor. */
static void test_submit_largest(void **state)
{
	(void)state;
	static struct proto_segment seg[PROTO_MAX_SEGMENTS];
	static uint16_t idx[PROTO_MAX_MASK_IDX];
	static struct proto_mask_row rows[PROTO_MAX_SEGMENTS + 1];
	uint32_t at = 0;
	for (uint32_t i = 0; i <= PROTO_MAX_SEGMENTS; i++) {
		rows[i].idx = idx + at;
		rows[i].n = i + 1;
		for (uint32_t j = 0; j <= i; j++)
			idx[at++] = (uint16_t)j;
		if (i < PROTO_MAX_SEGMENTS)
			seg[i] = (struct proto_segment){ "seg", 3, 0, 0 };
	}
	assert_int_equal(at, PROTO_MAX_MASK_IDX);
	struct proto_mask_desc m = { PROTO_MAX_SEGMENTS, rows };
	struct proto_submit_req req = { .n_segments = PROTO_MAX_SEGMENTS, .segments = seg,
					.mask = &m };
	size_t len = encode_ok(&req);
	struct proto_limits lim;
	proto_limits_default(&lim);
	assert_int_equal(lim.max_segments, 64);
	assert_int_equal(proto_submit_decode(g_buf, len, &lim, &g_sub, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	assert_non_null(strstr(g_err, "n_segments 127 over the limit 64"));
	lim.max_segments = PROTO_MAX_SEGMENTS;
	assert_int_equal(proto_submit_decode(g_buf, len, &lim, &g_sub, g_err, sizeof(g_err)), 0);
	assert_req_equal(&req, &g_sub.req);
	assert_int_equal(proto_mask_validate(g_sub.req.mask, 0, g_err, sizeof(g_err)), 0);
	/* a limit above the hard limit means the hard limit */
	lim.max_segments = 1000;
	assert_int_equal(proto_submit_decode(g_buf, len, &lim, &g_sub, NULL, 0), 0);

	/* one index more than the storage holds cannot be encoded */
	static uint16_t idx2[PROTO_MAX_MASK_IDX + 1];
	memcpy(idx2, idx, sizeof(idx));
	static struct proto_mask_row rows2[PROTO_MAX_SEGMENTS + 1];
	memcpy(rows2, rows, sizeof(rows));
	rows2[PROTO_MAX_SEGMENTS].idx = idx2 + (at - (PROTO_MAX_SEGMENTS + 1));
	rows2[PROTO_MAX_SEGMENTS].n++;
	struct proto_mask_desc m2 = { PROTO_MAX_SEGMENTS, rows2 };
	req.mask = &m2;
	size_t size;
	assert_int_equal(proto_submit_size(&req, &size, g_err, sizeof(g_err)), SW_ETOOLONG);
	assert_non_null(strstr(g_err, "indices"));
}

/* Field offsets in the encoding of full_req (see README). */
enum {
	O_NSEG = 0, O_FLAGS = 4, O_NSTOP = 12, O_NIDX = 16, O_NROWS = 60,
	O_SEGTAB = 64, O_ROWS = 64 + 24, O_IDX = O_ROWS + 16, O_STOPLEN = O_IDX + 16,
	O_TEXT = O_STOPLEN + 8,
};

struct bad_case {
	const char *name;
	size_t at;   /* byte offset to patch */
	int width;   /* 1, 2 or 4 bytes */
	uint32_t v;
	int rc;
	const char *msg;
};

static void test_submit_decode_errors(void **state)
{
	(void)state;
	struct full_req f;
	full_req_init(&f);
	size_t len = encode_ok(&f.req);
	static uint8_t good[4096];
	memcpy(good, g_buf, len);

	const struct bad_case cases[] = {
		{ "flags", O_FLAGS, 4, 0x20, SW_EFORMAT, "flags: unknown bits" },
		{ "bias flag, no table", O_FLAGS, 4, PROTO_SUBMIT_CHAT | PROTO_SUBMIT_LOGIT_BIAS,
		  SW_EFORMAT, "logit-bias count runs past" },
		{ "n_segments", O_NSEG, 4, 65, SW_ETOOLONG, "n_segments 65 over" },
		{ "n_segments huge", O_NSEG, 4, UINT32_MAX, SW_ETOOLONG, "n_segments" },
		{ "n_segments shape", O_NSEG, 4, 4, SW_EFORMAT, "n_mask_rows 4" },
		{ "n_stop", O_NSTOP, 4, 9, SW_ETOOLONG, "n_stop 9" },
		{ "n_rows", O_NROWS, 4, 3, SW_EFORMAT, "n_mask_rows 3" },
		{ "idx without rows", O_NROWS, 4, 0, SW_EFORMAT, "without mask rows" },
		{ "n_idx huge", O_NIDX, 4, 0x7FFFFFFF, SW_ETOOLONG, "n_mask_idx" },
		{ "n_idx short", O_NIDX, 4, 7, SW_EFORMAT, "mask row 3" },
		{ "n_idx long", O_NIDX, 4, 9, SW_EFORMAT, "mask rows hold 8" },
		{ "seg reserved", O_SEGTAB + 8 + 6, 1, 1, SW_EFORMAT, "segment 1: reserved" },
		{ "seg flags", O_SEGTAB + 8 + 5, 1, 2, SW_EFORMAT, "segment 1: flags: unknown bits 0x2" },
		{ "seg ids chat", O_SEGTAB + 8 + 5, 1, PROTO_SEG_IDS, SW_EFORMAT,
		  "segment 1: token ids with the chat flag" },
		{ "seg role", O_SEGTAB + 8 + 4, 1, PROTO_ROLE_LAST, SW_EFORMAT, "segment 1: role" },
		{ "seg role none", O_SEGTAB + 4, 1, 0, SW_EFORMAT, "segment 0: role 0" },
		{ "seg text over", O_SEGTAB + 16, 4, 2u << 20, SW_ETOOLONG, "segment text" },
		{ "seg text past", O_SEGTAB + 16, 4, 100, SW_EFORMAT, "segment 2: text of 100" },
		{ "row count", O_ROWS + 4, 4, 9, SW_EFORMAT, "mask row 1: 9 entries" },
		{ "forward ref", O_IDX + 4, 2, 2, SW_EFORMAT,
		  "submit: mask: row 1, entry 1: forward reference to segment 2" },
		{ "index huge", O_IDX, 2, 0xFFFF, SW_EFORMAT,
		  "submit: mask: row 0, entry 0: segment 65535 out of range" },
		{ "stop empty", O_STOPLEN, 4, 0, SW_EFORMAT, "stop string 0 is empty" },
		{ "stop long", O_STOPLEN + 4, 4, 65, SW_ETOOLONG, "stop string 1: 65 bytes" },
		{ "stop past", O_STOPLEN + 4, 4, 64, SW_EFORMAT, "stop string 1: 64 bytes run past" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bad_case *c = &cases[i];
		memcpy(g_buf, good, len);
		if (c->width == 1)
			g_buf[c->at] = (uint8_t)c->v;
		else if (c->width == 2)
			proto_put16(g_buf + c->at, (uint16_t)c->v);
		else
			proto_put32(g_buf + c->at, c->v);
		g_err[0] = '\0';
		int rc = proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err));
		if (rc != c->rc || !strstr(g_err, c->msg))
			fail_msg("%s: rc %s, '%s' (wanted %s, '%s')", c->name, sw_errname(rc),
				 g_err, sw_errname(c->rc), c->msg);
	}

	/* a chat request without the chat flag has roles it may not have */
	memcpy(g_buf, good, len);
	proto_put32(g_buf + O_FLAGS, 0);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "without the chat flag"));

	/* every truncation is malformed, never a crash or an over-read (the
	 * copy sits at the end of a heap block so ASan sees one byte past) */
	for (size_t n = 0; n < len; n++) {
		uint8_t *p = malloc(n ? n : 1);
		assert_non_null(p);
		memcpy(p, good, n);
		assert_int_equal(proto_submit_decode(p, n, NULL, &g_sub, NULL, 0), SW_EFORMAT);
		free(p);
	}
	/* one byte too many */
	memcpy(g_buf, good, len);
	assert_int_equal(proto_submit_decode(g_buf, len + 1, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "1 trailing bytes"));
	/* a tighter text limit */
	struct proto_limits lim = { .max_text_bytes = 39 };
	assert_int_equal(proto_submit_decode(good, len, &lim, &g_sub, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	lim.max_text_bytes = 40;
	assert_int_equal(proto_submit_decode(good, len, &lim, &g_sub, g_err, sizeof(g_err)), 0);
	lim.max_stop = 1;
	assert_int_equal(proto_submit_decode(good, len, &lim, &g_sub, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	assert_int_equal(proto_submit_decode(NULL, 1, NULL, &g_sub, NULL, 0), -EINVAL);
	assert_int_equal(proto_submit_decode(good, len, NULL, NULL, NULL, 0), -EINVAL);
}

static int encode_rc(const struct proto_submit_req *req, size_t cap)
{
	size_t len;
	g_err[0] = '\0';
	return proto_submit_encode(req, g_buf, cap, &len, g_err, sizeof(g_err));
}

static void test_submit_encode_errors(void **state)
{
	(void)state;
	struct full_req f;
	full_req_init(&f);
	size_t size;
	assert_int_equal(proto_submit_size(&f.req, &size, NULL, 0), 0);
	assert_int_equal(encode_rc(&f.req, size - 1), -ENOSPC);
	assert_int_equal(encode_rc(&f.req, size), 0);
	assert_int_equal(encode_rc(NULL, size), -EINVAL);
	assert_int_equal(proto_submit_size(&f.req, NULL, NULL, 0), -EINVAL);
	size_t len;
	assert_int_equal(proto_submit_encode(&f.req, NULL, 10, &len, NULL, 0), -EINVAL);

	f.mask.n_segments = 2;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), -EINVAL);
	assert_non_null(strstr(g_err, "mask has 2 segments"));
	full_req_init(&f);
	f.idx[1][1] = 2;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	assert_string_equal(g_err, "submit: mask: row 1, entry 1: forward reference to segment 2");
	full_req_init(&f);
	f.idx[3][2] = 4;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "segment 4 out of range (0..3)"));
	full_req_init(&f);
	f.rows[2].idx = NULL;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), -EINVAL);
	assert_non_null(strstr(g_err, "row 2: 2 indices but no index array"));
	full_req_init(&f);
	f.req.n_segments = PROTO_MAX_SEGMENTS + 1;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_ETOOLONG);
	full_req_init(&f);
	f.seg[1].role = PROTO_ROLE_NONE;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	full_req_init(&f);
	f.req.flags = 0;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "without the chat flag"));
	full_req_init(&f);
	f.req.flags = 0x80;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	full_req_init(&f);
	f.seg[0].text = NULL;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), -EINVAL);
	full_req_init(&f);
	f.req.segments = NULL;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), -EINVAL);
	full_req_init(&f);
	f.stop[0].len = 0;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	full_req_init(&f);
	f.stop[1].len = PROTO_MAX_STOP_LEN + 1;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_ETOOLONG);
	full_req_init(&f);
	f.req.n_stop = PROTO_MAX_STOP + 1;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_ETOOLONG);
	full_req_init(&f);
	f.req.stop = NULL;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), -EINVAL);
	full_req_init(&f);
	f.seg[2].len = UINT32_MAX; /* the sum no longer fits u32 */
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_ETOOLONG);
}

static void test_tokens(void **state)
{
	(void)state;
	const int32_t ids[] = { 1, -1, 0x7FFFFFFF, 31999, 0 };
	size_t len;
	assert_int_equal(proto_tokens_size(5, 6), 8 + 20 + 6);
	assert_int_equal(proto_tokens_encode(g_buf, sizeof(g_buf), ids, 5, "héllo", 6, &len), 0);
	assert_int_equal(len, 34);
	struct proto_tokens t;
	assert_int_equal(proto_tokens_decode(g_buf, len, NULL, &t, g_err, sizeof(g_err)), 0);
	assert_int_equal(t.n_ids, 5);
	for (uint32_t i = 0; i < 5; i++)
		assert_int_equal(proto_tokens_id(&t, i), ids[i]);
	assert_int_equal(t.text_len, 6);
	assert_memory_equal(t.text, "héllo", 6);
	/* empty batch */
	assert_int_equal(proto_tokens_encode(g_buf, 8, NULL, 0, NULL, 0, &len), 0);
	assert_int_equal(proto_tokens_decode(g_buf, len, NULL, &t, NULL, 0), 0);
	assert_int_equal(t.n_ids + t.text_len, 0);

	assert_int_equal(proto_tokens_encode(g_buf, 33, ids, 5, "héllo", 6, &len), -ENOSPC);
	assert_int_equal(proto_tokens_encode(g_buf, 64, NULL, 5, "héllo", 6, &len), -EINVAL);
	assert_int_equal(proto_tokens_encode(g_buf, 64, ids, 5, NULL, 6, &len), -EINVAL);
	assert_int_equal(proto_tokens_size(UINT32_MAX, UINT32_MAX), 0);
	assert_int_equal(proto_tokens_encode(g_buf, 64, ids, UINT32_MAX, "x", 1, &len),
			 SW_ETOOLONG);

	proto_tokens_encode(g_buf, sizeof(g_buf), ids, 5, "héllo", 6, &len);
	assert_int_equal(proto_tokens_decode(g_buf, 7, NULL, &t, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_tokens_decode(g_buf, len - 1, NULL, &t, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "do not add up"));
	assert_int_equal(proto_tokens_decode(g_buf, len + 1, NULL, &t, NULL, 0), SW_EFORMAT);
	struct proto_limits lim = { .max_ids = 4 };
	assert_int_equal(proto_tokens_decode(g_buf, len, &lim, &t, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	assert_non_null(strstr(g_err, "n_ids 5"));
	lim = (struct proto_limits){ .max_text_bytes = 5 };
	assert_int_equal(proto_tokens_decode(g_buf, len, &lim, &t, NULL, 0), SW_ETOOLONG);
	/* a count whose byte size would wrap 32-bit arithmetic */
	proto_put32(g_buf, 0x40000001u);
	lim = (struct proto_limits){ .max_ids = UINT32_MAX };
	assert_int_equal(proto_tokens_decode(g_buf, len, &lim, &t, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_tokens_decode(NULL, 8, NULL, &t, NULL, 0), -EINVAL);
}

/* TOKENS_LP: two tokens with two alternatives each; the walk gives every
 * entry back in order, pieces and all; lengths that disagree fail. */
static void test_tokens_lp(void **state)
{
	(void)state;
	const int32_t ids[6] = { 7, 7, 9, 3, 2, 3 };
	const float lps[6] = { -0.25f, -0.25f, -1.5f, -0.5f, -0.125f, -0.5f };
	const uint16_t plen[6] = { 2, 2, 0, 3, 1, 3 };
	const char pieces[] = "hihi\xe2\x80\xa6x\xe2\x80\xa6";
	size_t len;
	struct proto_tokens t;
	struct proto_lp_iter it;
	struct proto_lp_entry e;

	assert_int_equal(proto_tokens_lp_size(2, 2, 3, 11), 20 + 6 * 10 + 3 + 11);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 2, 2, ids, NULL, plen, pieces,
						11, "hi.", 3, 0, &len), -EINVAL);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 2, 2, ids, lps, plen, pieces,
						10, "hi.", 3, 0, &len), -EINVAL); /* pieces 11 */
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 2, 21, ids, lps, plen, pieces,
						11, "hi.", 3, 0, &len), -EINVAL);
	assert_int_equal(proto_tokens_lp_encode(g_buf, 93, 2, 2, ids, lps, plen, pieces, 11, "hi.",
						3, 0, &len), -ENOSPC);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 2, 2, ids, lps, plen, pieces,
						11, "hi.", 3, 0, &len), 0);
	assert_int_equal(len, 94);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, g_err, sizeof(g_err)), 0);
	assert_true(t.logprobs);
	assert_false(t.eog);
	assert_int_equal(t.n_ids, 2);
	assert_int_equal(t.n_top, 2);
	assert_int_equal(proto_tokens_id(&t, 0), 7);
	assert_int_equal(proto_tokens_id(&t, 1), 3);
	assert_memory_equal(t.text, "hi.", 3);
	proto_lp_iter_init(&it, &t);
	uint32_t off = 0;
	for (uint32_t k = 0; k < 6; k++) {
		assert_true(proto_lp_next(&it, &e));
		assert_int_equal(e.token, k / 3);
		assert_int_equal(e.rank, k % 3);
		assert_int_equal(e.id, ids[k]);
		assert_true(e.logprob == lps[k]);
		assert_int_equal(e.piece_len, plen[k]);
		assert_memory_equal(e.piece, pieces + off, plen[k]);
		off += plen[k];
	}
	assert_false(proto_lp_next(&it, &e));
	/* a plain TOKENS batch has no entries to walk */
	struct proto_tokens plain = { 0 };
	proto_lp_iter_init(&it, &plain);
	assert_false(proto_lp_next(&it, &e));

	assert_int_equal(proto_tokens_lp_decode(g_buf, len - 1, NULL, &t, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "do not add up"));
	assert_int_equal(proto_tokens_lp_decode(g_buf, 19, NULL, &t, NULL, 0), SW_EFORMAT);
	/* the first piece one byte longer: the sizes add up, the lengths do not */
	proto_put16(g_buf + 20 + 48, 3);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "piece lengths add up to 12"));
	proto_tokens_lp_encode(g_buf, sizeof(g_buf), 2, 2, ids, lps, plen, pieces, 11, "hi.", 3, 0,
			       &len);
	proto_put32(g_buf + 8, 21);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "at most 20"));
	proto_put32(g_buf + 8, 2);
	struct proto_limits lim = { .max_ids = 1 };
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, &lim, &t, NULL, 0), SW_ETOOLONG);
	lim = (struct proto_limits){ .max_text_bytes = 2 };
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, &lim, &t, NULL, 0), SW_ETOOLONG);
	/* counts whose byte sizes would wrap 32-bit arithmetic */
	proto_put32(g_buf, 0x40000001u);
	lim = (struct proto_limits){ .max_ids = UINT32_MAX };
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, &lim, &t, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_tokens_lp_decode(NULL, 20, NULL, &t, NULL, 0), -EINVAL);
	/* no alternatives: one entry a token */
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 1, 0, ids, lps, plen, "hi", 2,
						NULL, 0, 0, &len), 0);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, NULL, 0), 0);
	assert_int_equal(proto_tokens_id(&t, 0), 7);
	proto_lp_iter_init(&it, &t);
	assert_true(proto_lp_next(&it, &e) && e.rank == 0 && e.piece_len == 2);
	assert_false(proto_lp_next(&it, &e));
	/* the end-of-generation flag: only with a token, not on the prompt's;
	 * no other bits */
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 1, 0, ids, lps, plen, "hi", 2,
						NULL, 0, PROTO_LP_EOG, &len), 0);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, NULL, 0), 0);
	assert_true(t.eog);
	assert_false(t.prompt);
	proto_put32(g_buf + 16, 4);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "flags 0x4"));
	proto_put32(g_buf + 16, PROTO_LP_EOG | PROTO_LP_PROMPT);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, NULL, 0), SW_EFORMAT);
	proto_put32(g_buf + 16, PROTO_LP_PROMPT);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, NULL, 0), 0);
	assert_true(t.prompt);
	assert_false(t.eog);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 1, 0, ids, lps, plen, "hi", 2,
						NULL, 0, 4, &len), -EINVAL);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 1, 0, ids, lps, plen, "hi", 2,
						NULL, 0, PROTO_LP_EOG | PROTO_LP_PROMPT, &len),
			 -EINVAL);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 0, 0, ids, lps, plen, NULL, 0,
						NULL, 0, PROTO_LP_EOG, &len), -EINVAL);
	assert_int_equal(proto_tokens_lp_encode(g_buf, sizeof(g_buf), 0, 0, NULL, NULL, NULL, NULL,
						0, NULL, 0, 0, &len), 0);
	proto_put32(g_buf + 16, PROTO_LP_EOG);
	assert_int_equal(proto_tokens_lp_decode(g_buf, len, NULL, &t, NULL, 0), SW_EFORMAT);
}

/* The logprobs flag and its count of alternatives. */
static void test_submit_logprobs_flags(void **state)
{
	(void)state;
	struct full_req f;
	size_t len;
	full_req_init(&f);
	f.req.flags |= PROTO_SUBMIT_LOGPROBS | (20u << PROTO_SUBMIT_TOP_SHIFT);
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), 0);
	assert_int_equal(proto_submit_encode(&f.req, g_buf, sizeof(g_buf), &len, NULL, 0), 0);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	assert_int_equal(PROTO_SUBMIT_TOP(g_sub.req.flags), 20);
	assert_true(g_sub.req.flags & PROTO_SUBMIT_LOGPROBS);

	f.req.flags = PROTO_SUBMIT_CHAT | PROTO_SUBMIT_LOGPROBS | (21u << PROTO_SUBMIT_TOP_SHIFT);
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "at most 20"));
	f.req.flags = PROTO_SUBMIT_CHAT | (3u << PROTO_SUBMIT_TOP_SHIFT);
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "without the logprobs bit"));
	/* the same checks on the wire: patch the encoded flags */
	f.req.flags = PROTO_SUBMIT_CHAT;
	assert_int_equal(proto_submit_encode(&f.req, g_buf, sizeof(g_buf), &len, NULL, 0), 0);
	uint8_t keep[4];
	memcpy(keep, g_buf + 4, 4);
	assert_int_equal(proto_get32(g_buf + 4), PROTO_SUBMIT_CHAT);
	proto_put32(g_buf + 4, PROTO_SUBMIT_CHAT | (4u << PROTO_SUBMIT_TOP_SHIFT));
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "without the logprobs bit"));
	proto_put32(g_buf + 4, PROTO_SUBMIT_CHAT | PROTO_SUBMIT_PROMPT_LOGPROBS);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "prompt's log probabilities without"));
	proto_put32(g_buf + 4, PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_ONLY);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "prompt-only without"));
	proto_put32(g_buf + 4, PROTO_SUBMIT_CHAT | PROTO_SUBMIT_LOGPROBS |
				       PROTO_SUBMIT_PROMPT_LOGPROBS | PROTO_SUBMIT_PROMPT_ONLY);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, NULL, 0), 0);
	proto_put32(g_buf + 4, PROTO_SUBMIT_CHAT | 0x10000u);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "unknown bits 0x10000"));
	memcpy(g_buf + 4, keep, 4);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, NULL, 0), 0);
}

/* Segments of token ids: flags travel, mix with text, and the codec
 * refuses a length that is not whole ids and ids with the chat flag. */
static void test_submit_ids(void **state)
{
	(void)state;
	uint8_t ids[12];
	proto_put32(ids, 1);
	proto_put32(ids + 4, 15043);
	proto_put32(ids + 8, 0x7fffffff); /* in range or not is gpud's to say */
	struct proto_segment seg[2] = { { (const char *)ids, 12, 0, PROTO_SEG_IDS },
					{ " world", 6, 0, 0 } };
	struct proto_submit_req req = { .n_segments = 2, .segments = seg, .max_tokens = 4 };
	size_t len = encode_ok(&req);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	assert_req_equal(&req, &g_sub.req);
	assert_int_equal(g_sub.req.segments[0].flags, PROTO_SEG_IDS);
	assert_int_equal(g_sub.req.segments[1].flags, 0);
	assert_int_equal(proto_get32((const uint8_t *)g_sub.req.segments[0].text + 4), 15043);

	/* on the wire: a length of 10 bytes is not whole ids (the text
	 * total shrinks with it, so the payload is re-encoded) */
	seg[0].len = 10;
	assert_int_equal(encode_rc(&req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "segment 0: token ids: 10 bytes, not a multiple of 4"));
	seg[0].flags = 0;
	len = encode_ok(&req);
	g_buf[64 + 5] = PROTO_SEG_IDS;
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "segment 0: token ids: 10 bytes"));
	seg[0] = (struct proto_segment){ (const char *)ids, 12, 0, 0x80 };
	assert_int_equal(encode_rc(&req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "segment 0: flags: unknown bits 0x80"));
	/* chat messages are text */
	seg[0] = (struct proto_segment){ (const char *)ids, 12, PROTO_ROLE_USER, PROTO_SEG_IDS };
	seg[1].role = PROTO_ROLE_USER;
	req.flags = PROTO_SUBMIT_CHAT;
	assert_int_equal(encode_rc(&req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "segment 0: token ids with the chat flag"));
}

/* A logit-bias table: after the stop strings, flagged by the encoder;
 * every malformed table refused. */
static void test_submit_bias(void **state)
{
	(void)state;
	struct full_req f;
	struct proto_bias b[3] = { { 5, -100.0f }, { 0x7fffffff, 2.5f }, { -1, 0.0f } };
	size_t len, plain;
	full_req_init(&f);
	plain = encode_ok(&f.req);
	f.req.n_bias = 3;
	f.req.bias = b;
	len = encode_ok(&f.req);
	assert_int_equal(len, plain + 4 + 3 * 8);
	assert_int_equal(proto_get32(g_buf + O_FLAGS), PROTO_SUBMIT_CHAT | PROTO_SUBMIT_LOGIT_BIAS);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	f.req.flags |= PROTO_SUBMIT_LOGIT_BIAS; /* as decoded */
	assert_req_equal(&f.req, &g_sub.req);
	/* the decoded request encodes to the same bytes */
	static uint8_t again[4096];
	size_t len2;
	memcpy(again, g_buf, len);
	assert_int_equal(proto_submit_encode(&g_sub.req, g_buf, sizeof(g_buf), &len2, NULL, 0), 0);
	assert_int_equal(len2, len);
	assert_memory_equal(again, g_buf, len);

	/* malformed on the wire: a count of 0 or over the limit, a table
	 * running past the payload, the flag without a table */
	memcpy(g_buf, again, len);
	proto_put32(g_buf + plain, 0);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "0 logit biases"));
	proto_put32(g_buf + plain, PROTO_MAX_LOGIT_BIAS + 1);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	proto_put32(g_buf + plain, 4);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "logit-bias table (4 entries) runs past"));
	assert_int_equal(proto_submit_decode(again, plain + 2, NULL, &g_sub, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "logit-bias count runs past"));
	/* encoder: the flag alone, and too many entries */
	f.req.n_bias = 0;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "logit-bias bit without a table"));
	f.req.flags &= ~PROTO_SUBMIT_LOGIT_BIAS;
	f.req.n_bias = PROTO_MAX_LOGIT_BIAS + 1;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), SW_ETOOLONG);
	f.req.bias = NULL;
	f.req.n_bias = 1;
	assert_int_equal(encode_rc(&f.req, sizeof(g_buf)), -EINVAL);
}

static void test_done(void **state)
{
	(void)state;
	struct proto_done d = { 120, 64, 33, PROTO_STOP_STRING, 11, 2200, 30000, 32500 }, e;
	size_t len;
	assert_int_equal(proto_done_encode(g_buf, sizeof(g_buf), &d, &len), 0);
	assert_int_equal(len, PROTO_DONE_SIZE);
	assert_int_equal(proto_done_decode(g_buf, len, &e, NULL, 0), 0);
	assert_memory_equal(&d, &e, sizeof(d));
	assert_int_equal(proto_done_encode(g_buf, PROTO_DONE_SIZE - 1, &d, &len), -ENOSPC);
	assert_int_equal(proto_done_decode(g_buf, len - 1, &e, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_done_decode(g_buf, len + 1, &e, NULL, 0), SW_EFORMAT);
	d.cached_prompt_tokens = 121;
	proto_done_encode(g_buf, sizeof(g_buf), &d, &len);
	assert_int_equal(proto_done_decode(g_buf, len, &e, g_err, sizeof(g_err)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "cached_prompt_tokens 121"));
	assert_int_equal(proto_done_encode(NULL, 64, &d, &len), -EINVAL);
}

static void test_error(void **state)
{
	(void)state;
	struct proto_error e;
	size_t len;
	assert_int_equal(proto_error_encode(g_buf, sizeof(g_buf), SW_EVERSION,
					    "protocol version 2, server speaks 1", &len), 0);
	assert_int_equal(len, proto_error_size(35));
	assert_int_equal(proto_error_decode(g_buf, len, &e, NULL, 0), 0);
	assert_int_equal(e.code, SW_EVERSION);
	assert_string_equal(e.msg, "protocol version 2, server speaks 1");
	/* no message */
	assert_int_equal(proto_error_encode(g_buf, 8, -ENOMEM, NULL, &len), 0);
	assert_int_equal(proto_error_decode(g_buf, len, &e, NULL, 0), 0);
	assert_int_equal(e.code, -ENOMEM);
	assert_string_equal(e.msg, "");
	/* long messages are cut so they always fit the limit */
	char big[1000];
	memset(big, 'm', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(proto_error_encode(g_buf, sizeof(g_buf), SW_EBUSY, big, &len), 0);
	assert_int_equal(len, 8 + PROTO_MAX_ERROR_MSG - 1);
	assert_int_equal(proto_error_decode(g_buf, len, &e, NULL, 0), 0);
	assert_int_equal(strlen(e.msg), PROTO_MAX_ERROR_MSG - 1);

	assert_int_equal(proto_error_encode(g_buf, sizeof(g_buf), 0, "x", &len), -EINVAL);
	assert_int_equal(proto_error_encode(g_buf, 8, -1, "x", &len), -ENOSPC);
	proto_error_encode(g_buf, sizeof(g_buf), -1, "abc", &len);
	proto_put32(g_buf, 5);
	assert_int_equal(proto_error_decode(g_buf, len, &e, g_err, sizeof(g_err)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "not negative"));
	proto_put32(g_buf, (uint32_t)-1);
	assert_int_equal(proto_error_decode(g_buf, len - 1, &e, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_error_decode(g_buf, 7, &e, NULL, 0), SW_EFORMAT);
	proto_put32(g_buf + 4, PROTO_MAX_ERROR_MSG);
	assert_int_equal(proto_error_decode(g_buf, 8 + PROTO_MAX_ERROR_MSG, &e, NULL, 0),
			 SW_ETOOLONG);
}

static void test_text_requests(void **state)
{
	(void)state;
	struct proto_text_req r;
	size_t len;
	uint32_t fl = PROTO_TOK_ADD_BOS | PROTO_TOK_PARSE_SPECIAL;
	assert_int_equal(proto_text_req_encode(PROTO_T_TOKENIZE, g_buf, sizeof(g_buf), fl,
					       "<s>hi", 5, &len), 0);
	assert_int_equal(len, proto_text_req_size(5));
	assert_int_equal(proto_text_req_decode(PROTO_T_TOKENIZE, g_buf, len, NULL, &r, NULL, 0),
			 0);
	assert_int_equal(r.flags, fl);
	assert_int_equal(r.len, 5);
	assert_ptr_equal(r.text, (const char *)g_buf + 8);
	/* embed has no flags */
	assert_int_equal(proto_text_req_decode(PROTO_T_EMBED, g_buf, len, NULL, &r, g_err,
					       sizeof(g_err)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "EMBED: flags"));
	assert_int_equal(proto_text_req_encode(PROTO_T_EMBED, g_buf, 64, 1, "x", 1, &len),
			 -EINVAL);
	assert_int_equal(proto_text_req_encode(PROTO_T_EMBED, g_buf, 64, 0, "x", 1, &len), 0);
	assert_int_equal(proto_text_req_decode(PROTO_T_EMBED, g_buf, len, NULL, &r, NULL, 0), 0);
	assert_int_equal(r.flags, 0);

	assert_int_equal(proto_text_req_encode(PROTO_T_STATS, g_buf, 64, 0, "x", 1, &len), -EINVAL);
	assert_int_equal(proto_text_req_encode(PROTO_T_EMBED, g_buf, 8, 0, "x", 1, &len), -ENOSPC);
	assert_int_equal(proto_text_req_decode(PROTO_T_EMBED, g_buf, 7, NULL, &r, NULL, 0),
			 SW_EFORMAT);
	assert_int_equal(proto_text_req_decode(PROTO_T_EMBED, g_buf, 10, NULL, &r, NULL, 0),
			 SW_EFORMAT);
	assert_int_equal(proto_text_req_decode(PROTO_T_DONE, g_buf, 9, NULL, &r, NULL, 0),
			 -EINVAL);
	proto_put32(g_buf + 4, 0xFFFFFFF0u);
	assert_int_equal(proto_text_req_decode(PROTO_T_EMBED, g_buf, 9, NULL, &r, g_err,
					       sizeof(g_err)), SW_ETOOLONG);
	assert_non_null(strstr(g_err, "text_len"));
	proto_put32(g_buf, 4);
	assert_int_equal(proto_text_req_decode(PROTO_T_TOKENIZE, g_buf, 9, NULL, &r, NULL, 0),
			 SW_EFORMAT);

	/* detokenize: ids as the text, whole ids only, max_ids of them */
	uint8_t ids[12];
	proto_put32(ids, 1);
	proto_put32(ids + 4, 400);
	proto_put32(ids + 8, 7);
	assert_int_equal(proto_text_req_encode(PROTO_T_DETOKENIZE, g_buf, sizeof(g_buf),
					       PROTO_DETOK_SPECIAL, (const char *)ids, 12, &len), 0);
	assert_int_equal(proto_text_req_decode(PROTO_T_DETOKENIZE, g_buf, len, NULL, &r, NULL, 0),
			 0);
	assert_int_equal(r.flags, PROTO_DETOK_SPECIAL);
	assert_int_equal(r.len, 12);
	assert_int_equal(proto_get32((const uint8_t *)r.text + 4), 400);
	struct proto_limits lim = { .max_ids = 2 };
	assert_int_equal(proto_text_req_decode(PROTO_T_DETOKENIZE, g_buf, len, &lim, &r, g_err,
					       sizeof(g_err)), SW_ETOOLONG);
	assert_non_null(strstr(g_err, "DETOKENIZE: 3 ids over the limit 2"));
	assert_int_equal(proto_text_req_encode(PROTO_T_DETOKENIZE, g_buf, 64, 0,
					       (const char *)ids, 10, &len), -EINVAL);
	assert_int_equal(proto_text_req_encode(PROTO_T_DETOKENIZE, g_buf, 64, 2,
					       (const char *)ids, 12, &len), -EINVAL);
	assert_int_equal(proto_text_req_encode(PROTO_T_DETOKENIZE, g_buf, 64, 0,
					       (const char *)ids, 12, &len), 0);
	proto_put32(g_buf + 4, 10);
	assert_int_equal(proto_text_req_decode(PROTO_T_DETOKENIZE, g_buf, 18, NULL, &r, g_err,
					       sizeof(g_err)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "10 bytes of ids, not a multiple of 4"));
	proto_put32(g_buf + 4, 12);
	proto_put32(g_buf, 2);
	assert_int_equal(proto_text_req_decode(PROTO_T_DETOKENIZE, g_buf, 20, NULL, &r, g_err,
					       sizeof(g_err)), SW_EFORMAT);
	assert_non_null(strstr(g_err, "DETOKENIZE: flags: unknown bits 0x2"));
}

static void test_embedding(void **state)
{
	(void)state;
	const float v[4] = { 0.5f, -0.25f, 1e-7f, 3.0f };
	size_t len;
	assert_int_equal(proto_embedding_encode(g_buf, sizeof(g_buf), v, 4, &len), 0);
	assert_int_equal(len, proto_embedding_size(4));
	struct proto_embedding e;
	assert_int_equal(proto_embedding_decode(g_buf, len, NULL, &e, NULL, 0), 0);
	assert_int_equal(e.dim, 4);
	for (uint32_t i = 0; i < 4; i++)
		assert_true(proto_embedding_value(&e, i) == v[i]);
	struct proto_limits lim = { .max_embed_dim = 3 };
	assert_int_equal(proto_embedding_decode(g_buf, len, &lim, &e, g_err, sizeof(g_err)),
			 SW_ETOOLONG);
	assert_int_equal(proto_embedding_decode(g_buf, len - 1, NULL, &e, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_embedding_decode(g_buf, len + 4, NULL, &e, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_embedding_decode(g_buf, 4, NULL, &e, NULL, 0), SW_EFORMAT);
	proto_put32(g_buf + 4, 1);
	assert_int_equal(proto_embedding_decode(g_buf, len, NULL, &e, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "reserved"));
	assert_int_equal(proto_embedding_encode(g_buf, len - 1, v, 4, &len), -ENOSPC);
	assert_int_equal(proto_embedding_encode(g_buf, 64, NULL, 4, &len), -EINVAL);
	assert_int_equal(proto_embedding_size(UINT32_MAX), 0);
}

static void test_mem_and_json(void **state)
{
	(void)state;
	size_t len;
	uint32_t fl = 7;
	assert_int_equal(proto_mem_req_encode(g_buf, 4, PROTO_MEM_DUMP_OWNERS, &len), 0);
	assert_int_equal(proto_mem_req_decode(g_buf, len, &fl, NULL, 0), 0);
	assert_int_equal(fl, PROTO_MEM_DUMP_OWNERS);
	assert_int_equal(proto_mem_req_encode(g_buf, 4, 2, &len), -EINVAL);
	assert_int_equal(proto_mem_req_encode(g_buf, 3, 0, &len), -ENOSPC);
	proto_put32(g_buf, 2);
	assert_int_equal(proto_mem_req_decode(g_buf, 4, &fl, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_mem_req_decode(g_buf, 5, &fl, NULL, 0), SW_EFORMAT);

	const char *js = "{\"kv\":{\"used\":3,\"free\":61}}";
	uint32_t jl = (uint32_t)strlen(js);
	assert_int_equal(proto_json_encode(g_buf, sizeof(g_buf), js, jl, &len), 0);
	assert_int_equal(len, proto_json_size(jl));
	struct proto_text t;
	assert_int_equal(proto_json_decode(g_buf, len, NULL, &t, NULL, 0), 0);
	assert_int_equal(t.len, jl);
	assert_memory_equal(t.p, js, jl);
	struct proto_limits lim = { .max_json_bytes = jl - 1 };
	assert_int_equal(proto_json_decode(g_buf, len, &lim, &t, NULL, 0), SW_ETOOLONG);
	assert_int_equal(proto_json_decode(g_buf, len - 1, NULL, &t, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_json_decode(g_buf, 3, NULL, &t, NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_json_encode(g_buf, len - 1, js, jl, &len), -ENOSPC);
}

static void test_limits_and_roles(void **state)
{
	(void)state;
	struct proto_limits lim;
	proto_limits_default(&lim);
	assert_int_equal(lim.max_segments, 64);
	assert_int_equal(lim.max_stop, PROTO_MAX_STOP);
	assert_true(lim.max_text_bytes > 0 && lim.max_ids > 0 && lim.max_json_bytes > 0);
	assert_string_equal(proto_role_name(PROTO_ROLE_SYSTEM), "system");
	assert_string_equal(proto_role_name(PROTO_ROLE_USER), "user");
	assert_string_equal(proto_role_name(PROTO_ROLE_ASSISTANT), "assistant");
	assert_null(proto_role_name(PROTO_ROLE_NONE));
	assert_null(proto_role_name(PROTO_ROLE_LAST));
	/* the hard limits the README documents */
	assert_int_equal(PROTO_MAX_SEGMENTS, 127);
	assert_int_equal(PROTO_MAX_STOP, 8);
	assert_int_equal(PROTO_MAX_STOP_LEN, 64);
	/* the default sampling is greedy with every filter off */
	struct proto_sampling sp;
	memset(&sp, 0xAB, sizeof(sp));
	proto_sampling_default(&sp);
	assert_true(sp.temperature == 0.0f && sp.top_k == 0 && sp.top_p == 1.0f &&
		    sp.min_p == 0.0f && sp.seed == 0 && sp.penalty_last_n == 0 &&
		    sp.repeat_penalty == 1.0f && sp.frequency_penalty == 0.0f &&
		    sp.presence_penalty == 0.0f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_submit_roundtrip),
		cmocka_unit_test(test_submit_minimal),
		cmocka_unit_test(test_submit_largest),
		cmocka_unit_test(test_submit_decode_errors),
		cmocka_unit_test(test_submit_encode_errors),
		cmocka_unit_test(test_tokens),
		cmocka_unit_test(test_tokens_lp),
		cmocka_unit_test(test_submit_logprobs_flags),
		cmocka_unit_test(test_submit_ids),
		cmocka_unit_test(test_submit_bias),
		cmocka_unit_test(test_done),
		cmocka_unit_test(test_error),
		cmocka_unit_test(test_text_requests),
		cmocka_unit_test(test_embedding),
		cmocka_unit_test(test_mem_and_json),
		cmocka_unit_test(test_limits_and_roles),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
