/* maskattn_test.c - mask semantics through the real engine (DESIGN §3):
 * hiding a segment changes what sees it, a descriptor that hides nothing
 * is plain causal bit for bit, block attention matches the reference and
 * makes chunks independent of each other, invalid descriptors are refused
 * with clear errors at admission. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "tests/ref/ref_llama.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"
#define BT 4 /* small KV blocks: segments straddle blocks, mixed blocks abound */
#define MAXT 64

struct fix {
	struct gpud_model *m;
	struct gpud_engine *e;
	struct ref_llama *ref;
	uint32_t nv;
};

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct gpud_engine_params ep;
	char err[SW_ERR_MAX];

	if (gpud_model_load(&f->m, STORIES, err, sizeof(err)) ||
	    ref_llama_load(&f->ref, STORIES, err, sizeof(err))) {
		print_error("%s\n", err);
		return -1;
	}
	gpud_engine_params_default(&ep);
	ep.n_threads = 2;
	ep.max_batch_tokens = 128;
	ep.max_seqs = 4;
	ep.max_logits = 128;
	ep.block_tokens = BT;
	ep.n_ctx = 128;
	if (gpud_engine_create(&f->e, f->m, &ep, err, sizeof(err))) {
		print_error("%s\n", err);
		return -1;
	}
	f->nv = gpud_engine_n_vocab(f->e);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;
	gpud_engine_destroy(f->e);
	gpud_model_free(f->m);
	ref_llama_free(f->ref);
	free(f);
	return 0;
}

/* A descriptor with its storage. */
struct desc {
	struct proto_mask_desc d;
	struct proto_mask_row rows[GPUD_MASK_MAX_SEGMENTS + 2];
	uint16_t idx[GPUD_MASK_MAX_SEGMENTS + 2][8];
	uint32_t lens[GPUD_MASK_MAX_SEGMENTS + 1];
	_Alignas(16) uint8_t mem[4096];
	struct gpud_mask mask;
};

static void desc_init(struct desc *d, uint32_t s, const uint32_t *lens)
{
	memset(d, 0, sizeof(*d));
	d->d.n_segments = s;
	d->d.rows = d->rows;
	for (uint32_t i = 0; i <= s; i++)
		d->rows[i].idx = d->idx[i];
	if (lens)
		memcpy(d->lens, lens, s * sizeof(*lens));
}

static void see(struct desc *d, uint32_t row, uint16_t seg)
{
	d->idx[row][d->rows[row].n++] = seg;
}

static void compile(struct desc *d)
{
	uint32_t n = 0;
	char err[SW_ERR_MAX];
	for (uint32_t i = 0; i < d->d.n_segments; i++)
		n += d->lens[i];
	if (proto_mask_validate(&d->d, 64, err, sizeof(err)))
		fail_msg("validate: %s", err);
	assert_int_equal(gpud_mask_compile(&d->d, d->lens, BT, d->mem,
					   gpud_mask_bytes(d->d.n_segments, n, BT), &d->mask),
			 0);
}

/* Runs tokens[0..n) (prompt then teacher-forced generated tokens) through
 * the engine under mask: the prompt (n_prompt) in one step, then one token
 * per step. Writes every position's logits to out (n, n_vocab). */
static void run(struct fix *f, const struct gpud_mask *mask, const int32_t *tokens, uint32_t n,
		uint32_t n_prompt, float *out)
{
	uint32_t seq;
	char err[SW_ERR_MAX];

	assert_int_equal(gpud_engine_seq_add(f->e, mask, &seq), 0);
	for (uint32_t at = 0; at < n;) {
		uint32_t c = at == 0 ? n_prompt : 1;
		struct gpud_batch_entry b = { seq, tokens + at, c, GPUD_LOGITS_ALL };
		if (gpud_engine_step(f->e, &b, 1, err, sizeof(err)))
			fail_msg("step: %s", err);
		memcpy(out + (size_t)at * f->nv, gpud_engine_logits(f->e, 0),
		       (size_t)c * f->nv * sizeof(float));
		at += c;
	}
	assert_int_equal(gpud_engine_seq_free(f->e, seq), 0);
}

static double rel_err_rows(const float *a, const double *ref, uint32_t from, uint32_t to,
			   uint32_t nv)
{
	double worst = 0;
	for (uint32_t t = from; t < to; t++) {
		double md = 0, mr = 0;
		for (uint32_t v = 0; v < nv; v++) {
			md = fmax(md, fabs(a[(size_t)t * nv + v] - ref[(size_t)t * nv + v]));
			mr = fmax(mr, fabs(ref[(size_t)t * nv + v]));
		}
		worst = fmax(worst, md / mr);
	}
	return worst;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
	double md = 0;
	for (size_t i = 0; i < n; i++)
		md = fmax(md, fabs(a[i] - b[i]));
	return md;
}

static void make_tokens(int32_t *t, uint32_t n, uint32_t nv, unsigned seed)
{
	srand(seed);
	t[0] = 1;
	for (uint32_t i = 1; i < n; i++)
		t[i] = 3 + rand() % (int)(nv - 3);
}

/* G does not see s0: G's logits change, the prompt's do not, and the
 * engine matches the reference under the mask. */
static void test_hidden_segment_changes_g(void **state)
{
	struct fix *f = *state;
	uint32_t lens[2] = { 9, 7 }, n = 20, np = 16;
	int32_t tok[MAXT];
	float *causal = malloc(sizeof(float) * n * f->nv), *masked = malloc(sizeof(float) * n * f->nv);
	double *ref = malloc(sizeof(double) * n * f->nv);
	struct desc *d = malloc(sizeof(*d));

	make_tokens(tok, n, f->nv, 1);
	desc_init(d, 2, lens);
	see(d, 1, 0);
	see(d, 2, 1); /* G: s1 and itself, not s0 */
	compile(d);
	assert_false(d->mask.causal);
	run(f, NULL, tok, n, np, causal);
	run(f, &d->mask, tok, n, np, masked);
	/* prompt rows: identical computation, identical bits */
	assert_memory_equal(causal, masked, sizeof(float) * np * f->nv);
	/* every G row differs clearly */
	for (uint32_t t = np; t < n; t++) {
		double md = max_abs_diff(causal + (size_t)t * f->nv, masked + (size_t)t * f->nv, f->nv);
		assert_true(md > 1e-2);
	}
	assert_int_equal(ref_llama_forward(f->ref, tok, n, &d->d, lens, ref, NULL), 0);
	double r = rel_err_rows(masked, ref, 0, n, f->nv);
	print_message("G hides s0: worst relative error vs reference %.3g\n", r);
	assert_true(r < 1e-4);
	/* the causal run does not match the masked reference on G rows */
	assert_true(rel_err_rows(causal, ref, np, n, f->nv) > 1e-3);
	free(causal);
	free(masked);
	free(ref);
	free(d);
}

/* A descriptor that hides nothing (all rows full; or hiding only an empty
 * segment) is plain causal attention bit for bit. */
static void test_hides_nothing_is_causal(void **state)
{
	struct fix *f = *state;
	uint32_t lens[4] = { 5, 6, 0, 7 }, n = 24, np = 18;
	int32_t tok[MAXT];
	float *causal = malloc(sizeof(float) * n * f->nv), *masked = malloc(sizeof(float) * n * f->nv);
	struct desc *d = malloc(sizeof(*d));

	make_tokens(tok, n, f->nv, 2);
	run(f, NULL, tok, n, np, causal);

	desc_init(d, 4, lens);
	for (uint32_t i = 0; i <= 4; i++)
		for (uint32_t j = 0; j < i; j++)
			see(d, i, (uint16_t)j);
	compile(d);
	assert_true(d->mask.causal);
	run(f, &d->mask, tok, n, np, masked);
	assert_memory_equal(causal, masked, sizeof(float) * n * f->nv);

	/* hide only the empty segment 2 from everyone after it */
	desc_init(d, 4, lens);
	for (uint32_t i = 0; i <= 4; i++)
		for (uint32_t j = 0; j < i; j++)
			if (j != 2)
				see(d, i, (uint16_t)j);
	compile(d);
	assert_true(d->mask.causal);
	run(f, &d->mask, tok, n, np, masked);
	assert_memory_equal(causal, masked, sizeof(float) * n * f->nv);
	free(causal);
	free(masked);
	free(d);
}

/* Block attention: s0 system, chunks s1..s3 see only s0 and themselves,
 * the query s4 and G see everything. Matches the reference, and a chunk's
 * logits do not depend on another chunk's tokens. */
static void test_block_attention(void **state)
{
	struct fix *f = *state;
	uint32_t lens[5] = { 6, 7, 5, 9, 4 }, np = 31, n = 36;
	int32_t tok[MAXT], tok2[MAXT];
	float *a = malloc(sizeof(float) * n * f->nv), *b = malloc(sizeof(float) * n * f->nv);
	double *ref = malloc(sizeof(double) * n * f->nv);
	struct desc *d = malloc(sizeof(*d));

	make_tokens(tok, n, f->nv, 3);
	desc_init(d, 5, lens);
	for (uint32_t c = 1; c <= 3; c++)
		see(d, c, 0);
	for (uint32_t j = 0; j < 4; j++) {
		see(d, 4, (uint16_t)j);
		see(d, 5, (uint16_t)j);
	}
	see(d, 5, 4);
	compile(d);
	assert_false(d->mask.causal);
	run(f, &d->mask, tok, n, np, a);
	assert_int_equal(ref_llama_forward(f->ref, tok, n, &d->d, lens, ref, NULL), 0);
	double r = rel_err_rows(a, ref, 0, n, f->nv);
	print_message("block attention: worst relative error vs reference %.3g\n", r);
	assert_true(r < 1e-4);

	/* change chunk s1's tokens (positions 6..12): s2 (13..17) and s3
	 * (18..26) are unchanged; s4 and G change */
	memcpy(tok2, tok, sizeof(tok));
	for (uint32_t p = 6; p < 13; p++)
		tok2[p] = 3 + (tok[p] + 17) % (int32_t)(f->nv - 3);
	run(f, &d->mask, tok2, n, np, b);
	double same = max_abs_diff(a + (size_t)13 * f->nv, b + (size_t)13 * f->nv,
				   (size_t)(27 - 13) * f->nv);
	assert_true(same == 0.0);
	assert_memory_equal(a, b, (size_t)6 * f->nv * sizeof(float)); /* s0 */
	assert_true(max_abs_diff(a + (size_t)27 * f->nv, b + (size_t)27 * f->nv,
				 (size_t)(n - 27) * f->nv) > 1e-3);
	free(a);
	free(b);
	free(ref);
	free(d);
}

/* Invalid descriptors are refused at admission with a message naming the
 * row and entry; a mask compiled for another KV block size is refused by
 * the engine. The engine takes compiled masks only, so admission is
 * proto_mask_validate against the configured maximum, then compile. */
static void test_invalid_descriptors(void **state)
{
	struct fix *f = *state;
	struct desc *d = malloc(sizeof(*d));
	uint32_t lens[3] = { 2, 2, 2 }, seq;
	char err[SW_ERR_MAX];

	/* forward reference */
	desc_init(d, 3, lens);
	see(d, 1, 2);
	assert_int_equal(proto_mask_validate(&d->d, 64, err, sizeof(err)), SW_EFORMAT);
	assert_string_equal(err, "mask: row 1, entry 0: forward reference to segment 2");
	assert_int_equal(gpud_mask_compile(&d->d, lens, BT, d->mem, sizeof(d->mem), &d->mask),
			 SW_EFORMAT);
	/* index out of range */
	desc_init(d, 3, lens);
	see(d, 3, 0);
	see(d, 3, 7);
	assert_int_equal(proto_mask_validate(&d->d, 64, err, sizeof(err)), SW_EFORMAT);
	assert_string_equal(err, "mask: row 3, entry 1: segment 7 out of range (0..3)");
	/* too many segments for the configured maximum */
	uint32_t many[70] = { 0 };
	desc_init(d, 70, many);
	assert_int_equal(proto_mask_validate(&d->d, 64, err, sizeof(err)), SW_ETOOLONG);
	assert_string_equal(err, "mask: 70 segments exceed the maximum of 64");
	/* beyond the hard limit even when configured higher */
	d->d.n_segments = GPUD_MASK_MAX_SEGMENTS + 1;
	d->d.rows = NULL;
	assert_int_equal(proto_mask_validate(&d->d, 500, err, sizeof(err)), SW_ETOOLONG);

	/* a mask for another block size */
	desc_init(d, 3, lens);
	assert_int_equal(gpud_mask_compile(&d->d, lens, BT * 2, d->mem, sizeof(d->mem), &d->mask),
			 0);
	assert_int_equal(gpud_engine_seq_add(f->e, &d->mask, &seq), -EINVAL);
	struct gpud_engine_stats st;
	gpud_engine_stats(f->e, &st);
	assert_int_equal(st.kv.seqs, 0); /* nothing claimed */
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hidden_segment_changes_g),
		cmocka_unit_test(test_hides_nothing_is_causal),
		cmocka_unit_test(test_block_attention),
		cmocka_unit_test(test_invalid_descriptors),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
