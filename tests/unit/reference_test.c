/* reference_test.c - the fast path (engine) against the double-precision
 * reference (tests/ref/ref_llama.c) on logits.
 *
 * Error measure, per logits row: rel = max_i |fast_i - ref_i| / max_i |ref_i|
 * (max-abs difference over max-abs reference). A test reports the worst
 * row over everything it ran and asserts it is below the type's bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/mask.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/quant.h"
#include "gpud/backend/cpu/kernels.h"
#include "tests/ref/ref_llama.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"

/* Decodes ids with the file's own vocabulary strings: "▁" is a space,
 * "<0xXX>" a byte. Enough for the stories260K check, independent of
 * gpud/tokenizer. */
static size_t decode_ids(const struct gpud_gguf *g, const int32_t *ids, size_t n, char *out,
			 size_t cap)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		struct gpud_gguf_str s;
		assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)ids[i], &s),
				 0);
		if (s.len == 6 && s.s[0] == '<' && s.s[1] == '0' && s.s[2] == 'x') {
			unsigned b;
			assert_int_equal(sscanf(s.s + 3, "%2x", &b), 1);
			out[o++] = (char)b;
			continue;
		}
		for (uint64_t j = 0; j < s.len; j++) {
			if (j + 2 < s.len && (uint8_t)s.s[j] == 0xe2 && (uint8_t)s.s[j + 1] == 0x96 &&
			    (uint8_t)s.s[j + 2] == 0x81) {
				out[o++] = ' ';
				j += 2;
			} else {
				out[o++] = s.s[j];
			}
			assert_true(o < cap);
		}
	}
	out[o] = 0;
	return o;
}

static int argmax_d(const double *l, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return (int)b;
}

/* The reference alone reproduces the documented greedy continuation of the
 * real model: it validates RoPE pairing, GQA, norms and tied weights. */
static void test_reference_stories_greedy(void **state)
{
	(void)state;
	const char *want = ", there was a little girl named Lily. She loved to play outside in "
			   "the park.";
	struct ref_llama *m = NULL;
	struct gpud_gguf *g = NULL;
	char err[SW_ERR_MAX] = "";
	int32_t ids[64] = { 1, 403, 407, 261, 378 };
	uint32_t n = 5;
	char text[1024];

	if (access(STORIES, R_OK) != 0)
		fail_msg("missing %s (run from the project root)", STORIES);
	assert_int_equal(ref_llama_load(&m, STORIES, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_open(&g, STORIES, err, sizeof(err)), 0);
	const struct ref_llama_info *in = ref_llama_info(m);
	assert_int_equal(in->dim, 64);
	assert_int_equal(in->n_layers, 5);
	assert_int_equal(in->n_heads, 8);
	assert_int_equal(in->n_kv_heads, 4);
	assert_int_equal(in->n_vocab, 512);
	double *logits = malloc(sizeof(double) * 64 * in->n_vocab);
	for (;;) {
		assert_int_equal(ref_llama_forward(m, ids, n, NULL, NULL, logits, NULL), 0);
		ids[n] = argmax_d(logits + (size_t)(n - 1) * in->n_vocab, in->n_vocab);
		n++;
		decode_ids(g, ids + 5, n - 5, text, sizeof(text));
		if (strlen(text) >= strlen(want) || n == 64)
			break;
	}
	assert_memory_equal(text, want, strlen(want));
	free(logits);
	gpud_gguf_close(g);
	ref_llama_free(m);
}

/* The reference's own block decoders agree with known values. */
static void test_reference_dequant(void **state)
{
	(void)state;
	double out[32];
	uint8_t f16[6] = { 0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00 }; /* 1, -2, 2^-24 */
	assert_int_equal(ref_dequant_row(1, f16, 3, out), 0);
	assert_true(out[0] == 1.0 && out[1] == -2.0 && out[2] == ldexp(1, -24));
	uint8_t bf[4] = { 0x80, 0x3f, 0x40, 0xc0 }; /* 1, -3 */
	assert_int_equal(ref_dequant_row(30, bf, 2, out), 0);
	assert_true(out[0] == 1.0 && out[1] == -3.0);
	uint8_t q8[34] = { 0x00, 0x38 }; /* d = 0.5 */
	for (int i = 0; i < 32; i++)
		q8[2 + i] = (uint8_t)(int8_t)(i - 16);
	assert_int_equal(ref_dequant_row(8, q8, 32, out), 0);
	for (int i = 0; i < 32; i++)
		assert_true(out[i] == 0.5 * (i - 16));
	uint8_t q4[18] = { 0x00, 0x40 }; /* d = 2 */
	for (int i = 0; i < 16; i++)
		q4[2 + i] = (uint8_t)(i | ((15 - i) << 4));
	assert_int_equal(ref_dequant_row(2, q4, 32, out), 0);
	for (int i = 0; i < 16; i++) {
		assert_true(out[i] == 2.0 * (i - 8));
		assert_true(out[16 + i] == 2.0 * (15 - i - 8));
	}
	assert_int_equal(ref_dequant_row(9, q4, 32, out), -EINVAL); /* q8_1: not a weight type */
	assert_int_equal(ref_dequant_row(16, q4, 32, out), -EINVAL); /* iq2_xxs */
}

/* The dense reference mask follows the definition on a hand example. */
static void test_reference_mask_dense(void **state)
{
	(void)state;
	/* s0 = 2 tokens, s1 = 2 tokens sees nothing but itself, G sees s1 only */
	uint16_t r2[] = { 1 };
	struct proto_mask_row rows[3] = { { NULL, 0 }, { NULL, 0 }, { r2, 1 } };
	struct proto_mask_desc d = { .n_segments = 2, .rows = rows };
	uint32_t lens[2] = { 2, 2 };
	bool vis[36];
	static const bool want[36] = {
		1, 0, 0, 0, 0, 0,
		1, 1, 0, 0, 0, 0,
		0, 0, 1, 0, 0, 0,
		0, 0, 1, 1, 0, 0,
		0, 0, 1, 1, 1, 0,
		0, 0, 1, 1, 1, 1,
	};
	ref_mask_dense(&d, lens, 6, vis);
	assert_memory_equal(vis, want, sizeof(want));
	ref_mask_dense(NULL, NULL, 6, vis);
	for (int q = 0; q < 6; q++)
		for (int k = 0; k < 6; k++)
			assert_int_equal(vis[q * 6 + k], k <= q);
}

/* --- engine vs reference scenarios ------------------------------------- */

#define MAX_TOK 160
#define MAX_SEG 8
#define BLOCK 8

/* One sequence of a scenario: a prompt with an optional random mask
 * descriptor, then teacher-forced "decode" tokens fed one per step. */
struct plan {
	uint32_t n_prompt, n_decode, fed;
	int32_t tok[MAX_TOK];
	bool masked;
	struct proto_mask_row rows[MAX_SEG + 1];
	uint16_t idx[MAX_SEG + 1][MAX_SEG + 1];
	uint32_t lens[MAX_SEG];
	struct proto_mask_desc desc;
	void *mem;
	struct gpud_mask mask;
	uint32_t seq;
	float *logits; /* (n_prompt + n_decode, n_vocab) */
};

static uint64_t rng_state = 1;
static uint32_t rnd(uint32_t n)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(rng_state >> 33) % n;
}

/* A random descriptor over n_prompt tokens: S in 1..MAX_SEG, lengths
 * summing to n_prompt (some empty), each row a random subset. */
static void random_desc(struct plan *p)
{
	uint32_t s = 1 + rnd(MAX_SEG), left = p->n_prompt;
	p->desc.n_segments = s;
	p->desc.rows = p->rows;
	for (uint32_t i = 0; i < s; i++) {
		p->lens[i] = i + 1 == s ? left : rnd(left + 1);
		left -= p->lens[i];
	}
	for (uint32_t i = 0; i <= s; i++) {
		p->rows[i].idx = p->idx[i];
		p->rows[i].n = 0;
		for (uint32_t j = 0; j < i; j++)
			if (rnd(2))
				p->idx[i][p->rows[i].n++] = (uint16_t)j;
	}
}

static void plan_init(struct plan *p, uint32_t n_vocab, uint32_t n_prompt, uint32_t n_decode,
		      bool masked)
{
	memset(p, 0, sizeof(*p));
	p->n_prompt = n_prompt;
	p->n_decode = n_decode;
	p->tok[0] = 1;
	for (uint32_t i = 1; i < n_prompt + n_decode; i++)
		p->tok[i] = (int32_t)rnd(n_vocab);
	p->masked = masked;
	if (masked) {
		random_desc(p);
		size_t need = gpud_mask_bytes(p->desc.n_segments, n_prompt, BLOCK);
		p->mem = aligned_alloc(16, (need + 15) & ~(size_t)15);
		assert_non_null(p->mem);
		assert_int_equal(proto_mask_validate(&p->desc, 64, NULL, 0), 0);
		assert_int_equal(gpud_mask_compile(&p->desc, p->lens, BLOCK, p->mem, need, &p->mask),
				 0);
	}
	p->logits = malloc(sizeof(float) * (n_prompt + n_decode) * n_vocab);
	assert_non_null(p->logits);
}

static void plan_free(struct plan *p)
{
	free(p->mem);
	free(p->logits);
}

/* Drives the engine over all plans together: every step, each unfinished
 * sequence contributes a prefill chunk of random size (up to max_chunk) or
 * one decode token, so steps mix chunk sizes and prefill with decode. */
static void run_engine(struct gpud_engine *e, struct plan *ps, uint32_t n, uint32_t max_chunk,
		       uint32_t max_batch)
{
	struct gpud_batch_entry ents[16];
	uint32_t map[16], nv = gpud_engine_n_vocab(e);
	char err[SW_ERR_MAX];

	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(gpud_engine_seq_add(e, ps[i].masked ? &ps[i].mask : NULL, &ps[i].seq),
				 0);
	for (;;) {
		uint32_t ne = 0, budget = max_batch;
		for (uint32_t i = 0; i < n && budget > 0; i++) {
			struct plan *p = &ps[i];
			uint32_t total = p->n_prompt + p->n_decode, c;
			if (p->fed == total)
				continue;
			if (p->fed < p->n_prompt) {
				c = 1 + rnd(max_chunk);
				if (c > p->n_prompt - p->fed)
					c = p->n_prompt - p->fed;
			} else {
				c = 1;
			}
			if (c > budget)
				c = budget;
			ents[ne] = (struct gpud_batch_entry){ .seq = p->seq, .tokens = p->tok + p->fed,
							      .n_tokens = c,
							      .logits = GPUD_LOGITS_ALL };
			map[ne++] = i;
			budget -= c;
		}
		if (ne == 0)
			break;
		int rc = gpud_engine_step(e, ents, ne, err, sizeof(err));
		if (rc)
			fail_msg("step: %s", err);
		for (uint32_t j = 0; j < ne; j++) {
			struct plan *p = &ps[map[j]];
			const float *l = gpud_engine_logits(e, j);
			assert_non_null(l);
			memcpy(p->logits + (size_t)p->fed * nv, l, sizeof(float) * ents[j].n_tokens * nv);
			p->fed += ents[j].n_tokens;
			assert_int_equal(gpud_engine_seq_len(e, p->seq), p->fed);
		}
	}
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(gpud_engine_seq_free(e, ps[i].seq), 0);
}

/* Worst per-row relative error (max-abs diff / max-abs ref) of a plan's
 * engine logits against the reference. */
static double compare_ref(const struct ref_llama *ref, const struct plan *p)
{
	uint32_t nv = ref_llama_info(ref)->n_vocab, n = p->n_prompt + p->n_decode;
	double *rl = malloc(sizeof(double) * n * nv), worst = 0;

	assert_non_null(rl);
	assert_int_equal(ref_llama_forward(ref, p->tok, n, p->masked ? &p->desc : NULL,
					   p->masked ? p->lens : NULL, rl, NULL),
			 0);
	for (uint32_t t = 0; t < n; t++) {
		double md = 0, mr = 0;
		for (uint32_t v = 0; v < nv; v++) {
			double d = fabs((double)p->logits[(size_t)t * nv + v] - rl[(size_t)t * nv + v]);
			if (d > md)
				md = d;
			if (fabs(rl[(size_t)t * nv + v]) > mr)
				mr = fabs(rl[(size_t)t * nv + v]);
		}
		if (md / mr > worst)
			worst = md / mr;
	}
	free(rl);
	return worst;
}

/* Loads path in both implementations and runs: (1) one sequence, plain
 * causal, prefill in one chunk then decode; (2) a ragged batch of several
 * sequences with random masks and random chunk sizes. Returns the worst
 * relative error seen. */
static double engine_vs_ref_kv(const char *path, uint64_t seed, enum gpud_type kv_type,
			       bool ref_half)
{
	struct gpud_model *model = NULL;
	struct gpud_engine *e = NULL;
	struct ref_llama *ref = NULL;
	struct gpud_engine_params ep;
	char err[SW_ERR_MAX] = "";
	double worst = 0, r;
	struct plan *ps = calloc(6, sizeof(*ps));

	rng_state = seed;
	if (gpud_model_load(&model, path, err, sizeof(err)))
		fail_msg("model %s: %s", path, err);
	if (ref_llama_load(&ref, path, err, sizeof(err)))
		fail_msg("ref %s: %s", path, err);
	ref_llama_set_kv_half(ref, ref_half);
	gpud_engine_params_default(&ep);
	ep.kv_type = kv_type;
	ep.n_threads = 2;
	ep.max_batch_tokens = 64;
	ep.max_seqs = 8;
	ep.max_logits = 64;
	ep.block_tokens = BLOCK;
	ep.n_ctx = 256;
	if (gpud_engine_create(&e, model, &ep, err, sizeof(err)))
		fail_msg("engine: %s", err);
	uint32_t nv = gpud_engine_n_vocab(e);
	assert_int_equal(nv, ref_llama_info(ref)->n_vocab);

	/* one sequence, one prefill chunk, then decode */
	plan_init(&ps[0], nv, 21, 6, false);
	run_engine(e, ps, 1, 64, 64);
	r = compare_ref(ref, &ps[0]);
	worst = r > worst ? r : worst;
	plan_free(&ps[0]);

	/* ragged: 6 sequences, different lengths, masks, chunk sizes */
	for (uint32_t i = 0; i < 6; i++)
		plan_init(&ps[i], nv, 5 + rnd(40), 1 + rnd(6), i % 3 != 0);
	run_engine(e, ps, 6, 13, 48);
	for (uint32_t i = 0; i < 6; i++) {
		r = compare_ref(ref, &ps[i]);
		worst = r > worst ? r : worst;
		plan_free(&ps[i]);
	}
	struct gpud_engine_stats st;
	gpud_engine_stats(e, &st);
	assert_int_equal(st.allocs_after_warmup, 0);
	assert_int_equal(st.kv.used, 0);
	gpud_engine_destroy(e);
	gpud_model_free(model);
	ref_llama_free(ref);
	free(ps);
	return worst;
}

static double engine_vs_ref(const char *path, uint64_t seed)
{
	return engine_vs_ref_kv(path, seed, GPUD_TYPE_F32, false);
}

static void test_engine_vs_ref_stories(void **state)
{
	(void)state;
	double w = engine_vs_ref(STORIES, 42);
	print_message("stories260K (F32): worst relative logits error %.3g\n", w);
	assert_true(w < 1e-4);
}

/* Generated models: 4 heads over 2 KV heads (GQA), byte vocabulary; dim
 * 128, 3 layers, ffn 256 for F32, dim 64, 2 layers, ffn 128 for the other
 * types and variants (to keep valgrind runs short); one file per model in
 * a temp dir. */
static char g_tmpdir[64];

static void make_model(const char *file, enum gpud_type type, bool tied, float rope_scale,
		       char *path, size_t cap)
{
	struct gpud_mkmodel_params mp;
	char err[SW_ERR_MAX] = "";

	if (!g_tmpdir[0]) {
		strcpy(g_tmpdir, "/tmp/swarm-ref-XXXXXX");
		assert_non_null(mkdtemp(g_tmpdir));
	}
	snprintf(path, cap, "%s/%s", g_tmpdir, file);
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	bool big = type == GPUD_TYPE_F32 && !tied && rope_scale == 0;
	mp.dim = big ? 128 : 64;
	mp.n_layers = big ? 3 : 2;
	mp.n_heads = 4;
	mp.n_kv_heads = 2;
	mp.ffn_dim = big ? 256 : 128;
	mp.n_ctx = 256;
	mp.type = type;
	mp.seed = 1000 + (uint64_t)type;
	mp.tied = tied;
	if (rope_scale > 0) {
		mp.rope_base = 500000.0f;
		mp.rope_scale_factor = rope_scale;
		mp.rope_low_freq_factor = 1.0f;
		mp.rope_high_freq_factor = 4.0f;
		/* a short original context so the tiny head's frequencies fall
		 * in all three bands of the Llama 3 rule */
		mp.rope_orig_ctx = 64;
	}
	if (gpud_mkmodel(&mp, err, sizeof(err)))
		fail_msg("mkmodel %s: %s", path, err);
}

static void check_type(enum gpud_type type, double bound)
{
	char path[128], name[32];
	snprintf(name, sizeof(name), "%s.gguf", gpud_type_name(type));
	make_model(name, type, false, 0, path, sizeof(path));
	double w = engine_vs_ref(path, 7 + (uint64_t)type);
	print_message("generated %s: worst relative logits error %.3g (bound %.0e)\n",
		      gpud_type_name(type), w, bound);
	assert_true(w < bound);
	unlink(path);
}

static void test_engine_vs_ref_f32(void **state)
{
	(void)state;
	check_type(GPUD_TYPE_F32, 1e-4);
}

/* F16/BF16 weights are exact in f32 once unpacked, and gpud_matmul does
 * not quantize activations for them, so only f32 arithmetic separates the
 * paths: the same 1e-4 bound holds. (Q8_0/Q4_0: see below.) */
static void test_engine_vs_ref_f16(void **state)
{
	(void)state;
	check_type(GPUD_TYPE_F16, 1e-4);
}

/* gpud.kv_type "f16": K and V rounded to half when written. Against a
 * reference that rounds them too, the error is the f32 path's plus the
 * elements whose fp32 and double values fall on two sides of a half's
 * rounding midpoint (one in a few thousand), each then a half ulp off:
 * tiny on a generated model, visible on stories260K, whose trained
 * attention is peaked (bound). Against a reference that does not round,
 * the error is the rounding's: it must show (else nothing was rounded),
 * be several times the first, and stay small. */
static void kv_f16_check(const char *path, const char *what, uint64_t seed, double bound)
{
	double w = engine_vs_ref_kv(path, seed, GPUD_TYPE_F16, true);
	double u = engine_vs_ref_kv(path, seed, GPUD_TYPE_F16, false);
	double f = engine_vs_ref_kv(path, seed, GPUD_TYPE_F32, true);

	print_message("%s, f16 KV: worst relative logits error %.3g against a reference with "
		      "half K/V, %.3g against one without; f32 KV against half K/V %.3g\n",
		      what, w, u, f);
	assert_true(w < bound);
	assert_true(u > 2 * w); /* the rounding is there, and is the difference */
	assert_true(f > 2 * w);
	assert_true(u < 1e-2);
}

static void test_engine_vs_ref_kv_f16(void **state)
{
	char path[128];

	(void)state;
	kv_f16_check(STORIES, "stories260K", 42, 1e-3);
	make_model("kvf16.gguf", GPUD_TYPE_F32, false, 0, path, sizeof(path));
	kv_f16_check(path, "generated f32 (GQA)", 11, 1e-4);
	unlink(path);
}

static void test_engine_vs_ref_bf16(void **state)
{
	(void)state;
	check_type(GPUD_TYPE_BF16, 1e-4);
}

/* Q8_0/Q4_0 weights go through the int8 kernels, which quantize the
 * activations to Q8_0-like blocks (fp32 scale): measured worst relative
 * logits error 7.9e-3 (q8_0) and 9.0e-3 (q4_0) on these models (int8
 * kernels, 2026-11-29); bound 2e-2. */
static void test_engine_vs_ref_q8_0(void **state)
{
	(void)state;
	check_type(GPUD_TYPE_Q8_0, 2e-2);
}

static void test_engine_vs_ref_q4_0(void **state)
{
	(void)state;
	check_type(GPUD_TYPE_Q4_0, 2e-2);
}

/* K-quants go through the int8 path (activations in 32-blocks, as for
 * Q8_0/Q4_0), so the same 2e-2 bound applies. Models: dim 256 (the
 * super-block), 4 heads over 2 KV heads, ffn 512, 2 layers, untied;
 * Q4_K_M/Q5_K_M mix Q6_K in as llama.cpp's recipes do (here: attn_v and
 * ffn_down of layer 1, output). Measured worst relative logits error
 * (2026-12-01): q2_k 0.0159, q3_k 0.0145, q4_k 0.0135, q5_k 0.0146, q6_k
 * 0.0153, q4_k_m 0.0144, q5_k_m 0.0149; on this same shape q8_0 gives
 * 0.0127 and q4_0 0.0181. (Activations in 256-wide Q8_K blocks gave
 * 0.018-0.022: past the bound.) */
static void check_kq_dims(enum gpud_type type, enum gpud_mkmodel_mix mix, const char *file,
			  uint32_t dim, uint32_t ffn)
{
	struct gpud_mkmodel_params mp;
	char path[128], err[SW_ERR_MAX] = "";

	if (!g_tmpdir[0]) {
		strcpy(g_tmpdir, "/tmp/swarm-ref-XXXXXX");
		assert_non_null(mkdtemp(g_tmpdir));
	}
	snprintf(path, sizeof(path), "%s/%s", g_tmpdir, file);
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	mp.dim = dim;
	mp.n_layers = 2;
	mp.n_heads = 4;
	mp.n_kv_heads = 2;
	mp.ffn_dim = ffn;
	mp.n_ctx = 256;
	mp.type = type;
	mp.mix = mix;
	mp.seed = 2000 + (uint64_t)type + 100 * (uint64_t)mix;
	if (gpud_mkmodel(&mp, err, sizeof(err)))
		fail_msg("mkmodel %s: %s", path, err);
	double w = engine_vs_ref(path, 17 + (uint64_t)type);
	print_message("generated %s: worst relative logits error %.3g (bound 2e-02)\n", file, w);
	assert_true(w < 2e-2);
	unlink(path);
}

static void check_kq(enum gpud_type type, enum gpud_mkmodel_mix mix, const char *file)
{
	check_kq_dims(type, mix, file, 256, 512);
}

static void test_engine_vs_ref_kquants(void **state)
{
	(void)state;
	check_kq(GPUD_TYPE_Q2_K, GPUD_MKMODEL_PURE, "q2_k.gguf");
	check_kq(GPUD_TYPE_Q3_K, GPUD_MKMODEL_PURE, "q3_k.gguf");
	check_kq(GPUD_TYPE_Q4_K, GPUD_MKMODEL_PURE, "q4_k.gguf");
	check_kq(GPUD_TYPE_Q5_K, GPUD_MKMODEL_PURE, "q5_k.gguf");
	check_kq(GPUD_TYPE_Q6_K, GPUD_MKMODEL_PURE, "q6_k.gguf");
	check_kq(GPUD_TYPE_Q4_K, GPUD_MKMODEL_Q4_K_M, "q4_k_m.gguf");
	check_kq(GPUD_TYPE_Q5_K, GPUD_MKMODEL_Q5_K_M, "q5_k_m.gguf");
}

/* Q4_1, Q5_0, Q5_1 and IQ4_NL take the int8 path too (kernels_kq.c): the
 * same 2e-2 bound. Then the files llama.cpp writes for rows that no
 * 256-weight block fits (Qwen2.5-0.5B's 896): a Q4_K_M and a Q5_K_M model
 * of dim 160 (every matrix but ffn_down in Q5_0 / Q5_1, Q6_K's in Q8_0,
 * ffn_down's rows of 512 in Q4_K/Q5_K/Q6_K), and Q3_K's IQ4_NL.
 * Measured worst relative logits error (2026-12-06): q4_1 0.0099, q5_0
 * 0.0092, q5_1 0.0079, iq4_nl 0.0078, q4_k_m at dim 160 0.0151, q5_k_m
 * 0.0145, q3_k (IQ4_NL where Q3_K does not fit) 0.0112. */
static void test_engine_vs_ref_legacy32(void **state)
{
	(void)state;
	check_type(GPUD_TYPE_Q4_1, 2e-2);
	check_type(GPUD_TYPE_Q5_0, 2e-2);
	check_type(GPUD_TYPE_Q5_1, 2e-2);
	check_type(GPUD_TYPE_IQ4_NL, 2e-2);
	check_kq_dims(GPUD_TYPE_Q4_K, GPUD_MKMODEL_Q4_K_M, "q4_k_m-160.gguf", 160, 512);
	check_kq_dims(GPUD_TYPE_Q5_K, GPUD_MKMODEL_Q5_K_M, "q5_k_m-160.gguf", 160, 512);
	check_kq_dims(GPUD_TYPE_Q3_K, GPUD_MKMODEL_PURE, "q3_k-160.gguf", 160, 512);
	check_kq_dims(GPUD_TYPE_IQ4_XS, GPUD_MKMODEL_PURE, "iq4_xs.gguf", 256, 512);
	check_kq_dims(GPUD_TYPE_IQ4_XS, GPUD_MKMODEL_PURE, "iq4_xs-160.gguf", 160, 512);
}

/* The reference's own K-quant decoding agrees with quant.c's (which
 * rounds (d * sc) * q - dmin * m in fp32) on random quantized rows. */
static void test_reference_dequant_kq(void **state)
{
	static const enum gpud_type ts[] = { GPUD_TYPE_Q2_K, GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K,
					     GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K, GPUD_TYPE_Q4_1,
					     GPUD_TYPE_Q5_0, GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL,
					     GPUD_TYPE_IQ4_XS };
	float x[1024], y[1024];
	double r[1024];
	_Alignas(4) uint8_t q[4 * 210];

	(void)state;
	rng_state = 5;
	for (int i = 0; i < 1024; i++)
		x[i] = (float)((int)rnd(2001) - 1000) / 1000.0f;
	for (size_t k = 0; k < sizeof(ts) / sizeof(ts[0]); k++) {
		gpud_quantize_row(ts[k], x, q, 1024);
		gpud_dequantize_row(ts[k], q, y, 1024);
		assert_int_equal(ref_dequant_row((int)ts[k], q, 1024, r), 0);
		for (int i = 0; i < 1024; i++)
			assert_true(fabs(r[i] - y[i]) <= 1e-6 * (fabs(r[i]) + 1e-3));
	}
}

/* Tied output and Llama 3 rope scaling (rope_freqs.weight), F32. */
static void test_engine_vs_ref_tied_scaled(void **state)
{
	(void)state;
	char path[128];
	make_model("tied-scaled.gguf", GPUD_TYPE_F32, true, 8.0f, path, sizeof(path));
	struct ref_llama *ref = NULL;
	char err[SW_ERR_MAX];
	assert_int_equal(ref_llama_load(&ref, path, err, sizeof(err)), 0);
	assert_true(ref_llama_info(ref)->tied_output);
	assert_true(ref_llama_info(ref)->rope_scaled);
	ref_llama_free(ref);
	double w = engine_vs_ref(path, 99);
	print_message("generated f32 tied + llama3 rope scaling: worst relative error %.3g\n", w);
	assert_true(w < 1e-4);
	unlink(path);
}

/* Llama 3 scaling given as llama.rope.scaling.* metadata (no rope_freqs
 * tensor): the engine and the reference each compute the factors from the
 * rule. The file is a generated model rewritten with the extra keys. */
static void test_engine_vs_ref_scaling_metadata(void **state)
{
	(void)state;
	char src[128], dst[160], err[SW_ERR_MAX];
	struct gpud_gguf *g = NULL;
	struct gpud_gguf_writer *w = NULL;

	make_model("plain.gguf", GPUD_TYPE_F32, false, 0, src, sizeof(src));
	snprintf(dst, sizeof(dst), "%s/scaled-meta.gguf", g_tmpdir);
	assert_int_equal(gpud_gguf_open(&g, src, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_copy_kv(w, g, NULL, NULL), 0);
	assert_int_equal(gpud_gguf_w_str(w, "llama.rope.scaling.type", "llama3"), 0);
	assert_int_equal(gpud_gguf_w_f32(w, "llama.rope.scaling.factor", 8.0f), 0);
	assert_int_equal(gpud_gguf_w_f32(w, "llama.rope.scaling.low_freq_factor", 1.0f), 0);
	assert_int_equal(gpud_gguf_w_f32(w, "llama.rope.scaling.high_freq_factor", 4.0f), 0);
	/* the F32 model has head_dim 32, base 10000: wavelengths 6.3 .. 5.6e4
	 * span all three bands of the rule for an original context of 256 */
	assert_int_equal(gpud_gguf_w_u32(w, "llama.rope.scaling.original_context_length", 256), 0);
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(g); i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(g, i);
		assert_int_equal(gpud_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
						    t->nbytes),
				 0);
	}
	if (gpud_gguf_w_write(w, dst, err, sizeof(err)))
		fail_msg("write: %s", err);
	gpud_gguf_writer_free(w);
	gpud_gguf_close(g);

	/* the scaling must matter at the positions tested: the reference
	 * with and without it differs clearly */
	struct ref_llama *ref = NULL, *plain = NULL;
	assert_int_equal(ref_llama_load(&ref, dst, err, sizeof(err)), 0);
	assert_int_equal(ref_llama_load(&plain, src, err, sizeof(err)), 0);
	assert_true(ref_llama_info(ref)->rope_scaled);
	assert_false(ref_llama_info(plain)->rope_scaled);
	uint32_t nv = ref_llama_info(ref)->n_vocab, n = 40;
	int32_t tok[40];
	double *a = malloc(sizeof(double) * n * nv), *b = malloc(sizeof(double) * n * nv);
	double md = 0, mr = 0;
	for (uint32_t i = 0; i < n; i++)
		tok[i] = (int32_t)(3 + (i * 7919) % (nv - 3));
	assert_int_equal(ref_llama_forward(ref, tok, n, NULL, NULL, a, NULL), 0);
	assert_int_equal(ref_llama_forward(plain, tok, n, NULL, NULL, b, NULL), 0);
	for (size_t i = (size_t)(n - 1) * nv; i < (size_t)n * nv; i++) {
		md = fmax(md, fabs(a[i] - b[i]));
		mr = fmax(mr, fabs(b[i]));
	}
	print_message("llama3 scaling changes the last row by %.3g (relative)\n", md / mr);
	assert_true(md / mr > 1e-3);
	free(a);
	free(b);
	ref_llama_free(ref);
	ref_llama_free(plain);
	unlink(src);
	double wst = engine_vs_ref(dst, 31);
	print_message("generated f32, llama3 scaling from metadata: worst relative error %.3g\n",
		      wst);
	assert_true(wst < 1e-4);
	unlink(dst);
}

/* A qwen2-style model (Q/K/V biases) of the default small shape: arch
 * qwen2, or llama with biases, same seed: the two files hold the same
 * tensors and differ only in the architecture, hence the RoPE style. */
static void make_biased(const char *file, enum gpud_arch arch, enum gpud_type type, bool tied,
			char *path, size_t cap)
{
	struct gpud_mkmodel_params mp;
	char err[SW_ERR_MAX] = "";

	if (!g_tmpdir[0]) {
		strcpy(g_tmpdir, "/tmp/swarm-ref-XXXXXX");
		assert_non_null(mkdtemp(g_tmpdir));
	}
	snprintf(path, cap, "%s/%s", g_tmpdir, file);
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	mp.arch = arch;
	mp.qkv_bias = true;
	mp.n_ctx = 256;
	mp.type = type;
	mp.tied = tied;
	mp.seed = 2000 + (uint64_t)type;
	if (gpud_mkmodel(&mp, err, sizeof(err)))
		fail_msg("mkmodel %s: %s", path, err);
}

/* Worst relative difference between the last logits rows of two
 * reference models on the same 40 tokens. */
static double ref_vs_ref(const char *pa, const char *pb)
{
	struct ref_llama *ra = NULL, *rb = NULL;
	char err[SW_ERR_MAX];
	assert_int_equal(ref_llama_load(&ra, pa, err, sizeof(err)), 0);
	assert_int_equal(ref_llama_load(&rb, pb, err, sizeof(err)), 0);
	uint32_t nv = ref_llama_info(ra)->n_vocab, n = 40;
	int32_t tok[40];
	double *a = malloc(sizeof(double) * n * nv), *b = malloc(sizeof(double) * n * nv);
	double md = 0, mr = 0;
	for (uint32_t i = 0; i < n; i++)
		tok[i] = (int32_t)(3 + (i * 7919) % (nv - 3));
	assert_int_equal(ref_llama_forward(ra, tok, n, NULL, NULL, a, NULL), 0);
	assert_int_equal(ref_llama_forward(rb, tok, n, NULL, NULL, b, NULL), 0);
	for (size_t i = (size_t)(n - 1) * nv; i < (size_t)n * nv; i++) {
		md = fmax(md, fabs(a[i] - b[i]));
		mr = fmax(mr, fabs(b[i]));
	}
	free(a);
	free(b);
	ref_llama_free(ra);
	ref_llama_free(rb);
	return md / mr;
}

/* YaRN (rope.scaling.type "yarn", as Qwen2.5's long-context GGUFs carry
 * it), written by gpud mkmodel: the engine divides each pair's frequency
 * by its YaRN factor and scales the logits by mscale^2; the reference
 * blends the frequencies as the paper writes it and multiplies cos and
 * sin by mscale. Both architectures' RoPE styles; f32 and Q8_0. The
 * scaling must matter: the reference with it differs clearly from the
 * same weights without it (mkmodel's seed fixes the weights). */
static void test_engine_vs_ref_yarn(void **state)
{
	static const struct {
		enum gpud_arch arch;
		enum gpud_type type;
		double bound;
	} cases[] = {
		{ GPUD_ARCH_LLAMA, GPUD_TYPE_F32, 1e-4 },
		{ GPUD_ARCH_QWEN2, GPUD_TYPE_F32, 1e-4 },
		{ GPUD_ARCH_LLAMA, GPUD_TYPE_Q8_0, 2e-2 },
	};
	(void)state;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct gpud_mkmodel_params mp;
		char yarn[160], plain[160], err[SW_ERR_MAX];

		gpud_mkmodel_params_default(&mp);
		mp.arch = cases[c].arch;
		mp.type = cases[c].type;
		mp.seed = 41;
		/* head_dim 16, base 10000: for an original context of 256 / 4 =
		 * 64 the ramp runs from pair 0 to pair 3 of 8 */
		mp.n_ctx = 256;
		snprintf(plain, sizeof(plain), "%s/yarn-plain-%zu.gguf", g_tmpdir, c);
		snprintf(yarn, sizeof(yarn), "%s/yarn-%zu.gguf", g_tmpdir, c);
		mp.out = plain;
		if (gpud_mkmodel(&mp, err, sizeof(err)))
			fail_msg("mkmodel: %s", err);
		mp.rope_yarn_factor = 4.0f;
		mp.out = yarn;
		if (gpud_mkmodel(&mp, err, sizeof(err)))
			fail_msg("mkmodel: %s", err);

		double moved = ref_vs_ref(yarn, plain);
		double w = engine_vs_ref(yarn, 57);
		print_message("%s %s, yarn factor 4: the scaling moves the last row by %.3g, "
			      "the engine is within %.3g of the reference\n",
			      gpud_arch_name(cases[c].arch), gpud_type_name(cases[c].type),
			      moved, w);
		assert_true(moved > 1e-3);
		assert_true(w < cases[c].bound);
		unlink(plain);
		unlink(yarn);
	}
}

/* Both RoPE styles against the reference on the same weights: the qwen2
 * file (NEOX pairs, biases) and the llama file with the same tensors
 * (adjacent pairs, biases). The styles must matter at the positions tested:
 * the two references differ by more than ten times the engine's bound
 * (measured 3.9e-3 against 1e-4), so a style mix-up could not pass. */
static void test_engine_vs_ref_qwen2_f32(void **state)
{
	(void)state;
	char pq[128], pl[128], err[SW_ERR_MAX];
	struct ref_llama *ref = NULL;
	struct gpud_model *m = NULL;

	make_biased("qwen2.gguf", GPUD_ARCH_QWEN2, GPUD_TYPE_F32, false, pq, sizeof(pq));
	make_biased("llama-bias.gguf", GPUD_ARCH_LLAMA, GPUD_TYPE_F32, false, pl, sizeof(pl));
	assert_int_equal(ref_llama_load(&ref, pq, err, sizeof(err)), 0);
	assert_true(ref_llama_info(ref)->neox);
	assert_true(ref_llama_info(ref)->qkv_bias);
	assert_false(ref_llama_info(ref)->tied_output);
	ref_llama_free(ref);
	assert_int_equal(gpud_model_load(&m, pq, err, sizeof(err)), 0);
	assert_int_equal(gpud_model_hparams(m)->arch, GPUD_ARCH_QWEN2);
	assert_int_equal(gpud_model_hparams(m)->rope_style, GPUD_ROPE_NEOX);
	assert_true(gpud_model_hparams(m)->qkv_bias);
	gpud_model_free(m);
	assert_int_equal(gpud_model_load(&m, pl, err, sizeof(err)), 0);
	assert_int_equal(gpud_model_hparams(m)->rope_style, GPUD_ROPE_NORM);
	assert_true(gpud_model_hparams(m)->qkv_bias);
	gpud_model_free(m);

	double d = ref_vs_ref(pq, pl);
	print_message("NEOX vs adjacent-pair RoPE on the same weights: last row differs by %.3g\n",
		      d);
	assert_true(d > 1e-3);
	double wq = engine_vs_ref(pq, 61), wl = engine_vs_ref(pl, 62);
	print_message("generated qwen2 f32 (NEOX, biases): worst relative error %.3g\n", wq);
	print_message("generated llama f32 with biases (adjacent pairs): worst relative error %.3g\n",
		      wl);
	assert_true(wq < 1e-4);
	assert_true(wl < 1e-4);
	unlink(pq);
	unlink(pl);
}

/* Qwen2 with tied output in a quantized type: the int8 kernels' bound. */
static void test_engine_vs_ref_qwen2_q8_0_tied(void **state)
{
	(void)state;
	char path[128], err[SW_ERR_MAX];
	struct ref_llama *ref = NULL;

	make_biased("qwen2-q8.gguf", GPUD_ARCH_QWEN2, GPUD_TYPE_Q8_0, true, path, sizeof(path));
	assert_int_equal(ref_llama_load(&ref, path, err, sizeof(err)), 0);
	assert_true(ref_llama_info(ref)->tied_output);
	ref_llama_free(ref);
	double w = engine_vs_ref(path, 63);
	print_message("generated qwen2 q8_0 tied: worst relative error %.3g (bound 2e-2)\n", w);
	assert_true(w < 2e-2);
	unlink(path);
}

/* Heads of their own width (attention.key_length; Mistral NeMo: 32 heads
 * of 128 on a 5120-wide model): Q, the attention output and the Q bias
 * are heads * head_dim wide, not dim. Wider than dim in F32 (llama), and
 * narrower in Q8_0 with biases and NEOX pairs (qwen2). And qwen3: each Q
 * and K head RMS-normed (weights around 1, Q's and K's apart) before NEOX
 * RoPE, no biases, heads wider than dim / heads as Qwen3's (128 at dim
 * 1024 with 16 heads), in F32 and Q8_0. All on dim 64 with 4 heads. */
static void test_engine_vs_ref_heads(void **state)
{
	(void)state;
	static const struct {
		enum gpud_arch arch;
		enum gpud_type type;
		uint32_t head_dim;
		double bound;
	} cases[] = {
		{ GPUD_ARCH_LLAMA, GPUD_TYPE_F32, 32, 1e-4 },
		{ GPUD_ARCH_QWEN2, GPUD_TYPE_Q8_0, 8, 2e-2 },
		{ GPUD_ARCH_QWEN3, GPUD_TYPE_F32, 32, 1e-4 },
		{ GPUD_ARCH_QWEN3, GPUD_TYPE_Q8_0, 32, 2e-2 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct gpud_mkmodel_params mp;
		struct ref_llama *ref = NULL;
		char path[128], err[SW_ERR_MAX] = "";
		bool qwen3 = cases[i].arch == GPUD_ARCH_QWEN3;

		if (!g_tmpdir[0]) {
			strcpy(g_tmpdir, "/tmp/swarm-ref-XXXXXX");
			assert_non_null(mkdtemp(g_tmpdir));
		}
		snprintf(path, sizeof(path), "%s/heads%zu.gguf", g_tmpdir, i);
		gpud_mkmodel_params_default(&mp);
		mp.out = path;
		mp.arch = cases[i].arch;
		mp.dim = 64;
		mp.n_heads = 4;
		mp.n_kv_heads = 2;
		mp.head_dim = cases[i].head_dim;
		mp.n_ctx = 256;
		mp.rope_base = 1e6f;
		mp.norm_eps = 1e-6f;
		mp.tied = qwen3;
		mp.type = cases[i].type;
		mp.seed = 3000 + i;
		if (gpud_mkmodel(&mp, err, sizeof(err)))
			fail_msg("mkmodel %s: %s", path, err);
		assert_int_equal(ref_llama_load(&ref, path, err, sizeof(err)), 0);
		assert_int_equal(ref_llama_info(ref)->head_dim, cases[i].head_dim);
		assert_int_equal(ref_llama_info(ref)->qk_norm, qwen3);
		assert_int_equal(ref_llama_info(ref)->neox, cases[i].arch != GPUD_ARCH_LLAMA);
		assert_int_equal(ref_llama_info(ref)->qkv_bias, cases[i].arch == GPUD_ARCH_QWEN2);
		ref_llama_free(ref);
		double w = engine_vs_ref(path, 70 + i);
		print_message("generated %s %s, 4 heads of %u on dim 64: worst relative error "
			      "%.3g (bound %.0e)\n", gpud_arch_name(cases[i].arch),
			      gpud_type_name(cases[i].type), cases[i].head_dim, w, cases[i].bound);
		assert_true(w < cases[i].bound);
		unlink(path);
	}
}

/* Embeddings: the engine's mean-pooled, L2-normalized final hidden states
 * against the same computed from the reference's hidden states. */
static void test_embed_vs_ref(void **state)
{
	(void)state;
	struct gpud_model *model = NULL;
	struct gpud_engine *e = NULL;
	struct ref_llama *ref = NULL;
	struct gpud_engine_params ep;
	char err[SW_ERR_MAX];
	int32_t tok[37];
	uint32_t n = 37;

	assert_int_equal(gpud_model_load(&model, STORIES, err, sizeof(err)), 0);
	assert_int_equal(ref_llama_load(&ref, STORIES, err, sizeof(err)), 0);
	gpud_engine_params_default(&ep);
	ep.n_threads = 2;
	ep.max_batch_tokens = 16; /* forces chunked prefill inside embed */
	ep.n_ctx = 128;
	assert_int_equal(gpud_engine_create(&e, model, &ep, err, sizeof(err)), 0);
	uint32_t dim = gpud_engine_dim(e);
	assert_int_equal(dim, ref_llama_info(ref)->dim);
	rng_state = 77;
	tok[0] = 1;
	for (uint32_t i = 1; i < n; i++)
		tok[i] = (int32_t)rnd(ref_llama_info(ref)->n_vocab);
	float *emb = malloc(sizeof(float) * dim);
	double *hid = malloc(sizeof(double) * n * dim), *mean = calloc(dim, sizeof(double));
	double *lg = malloc(sizeof(double) * n * ref_llama_info(ref)->n_vocab), norm = 0, md = 0;
	if (gpud_engine_embed_tokens(e, tok, n, emb, err, sizeof(err)))
		fail_msg("embed: %s", err);
	assert_int_equal(ref_llama_forward(ref, tok, n, NULL, NULL, lg, hid), 0);
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t i = 0; i < dim; i++)
			mean[i] += hid[(size_t)t * dim + i] / n;
	for (uint32_t i = 0; i < dim; i++)
		norm += mean[i] * mean[i];
	norm = sqrt(norm);
	for (uint32_t i = 0; i < dim; i++)
		md = fmax(md, fabs(emb[i] - mean[i] / norm));
	print_message("embedding: max abs difference of unit vectors %.3g\n", md);
	assert_true(md < 1e-5);
	free(emb);
	free(hid);
	free(mean);
	free(lg);
	gpud_engine_destroy(e);
	gpud_model_free(model);
	ref_llama_free(ref);
}

/* Removes the temp dir with whatever a failed test left in it. */
static int teardown_tmpdir(void **state)
{
	(void)state;
	if (!g_tmpdir[0])
		return 0;
	DIR *d = opendir(g_tmpdir);
	struct dirent *de;
	char path[64 + 256 + 2];
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", g_tmpdir, de->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(g_tmpdir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference_dequant),
		cmocka_unit_test(test_reference_mask_dense),
		cmocka_unit_test(test_reference_stories_greedy),
		cmocka_unit_test(test_engine_vs_ref_stories),
		cmocka_unit_test(test_engine_vs_ref_f32),
		cmocka_unit_test(test_engine_vs_ref_f16),
		cmocka_unit_test(test_engine_vs_ref_bf16),
		cmocka_unit_test(test_engine_vs_ref_kv_f16),
		cmocka_unit_test(test_engine_vs_ref_q8_0),
		cmocka_unit_test(test_engine_vs_ref_q4_0),
		cmocka_unit_test(test_reference_dequant_kq),
		cmocka_unit_test(test_engine_vs_ref_kquants),
		cmocka_unit_test(test_engine_vs_ref_legacy32),
		cmocka_unit_test(test_engine_vs_ref_tied_scaled),
		cmocka_unit_test(test_engine_vs_ref_scaling_metadata),
		cmocka_unit_test(test_engine_vs_ref_yarn),
		cmocka_unit_test(test_engine_vs_ref_qwen2_f32),
		cmocka_unit_test(test_engine_vs_ref_qwen2_q8_0_tied),
		cmocka_unit_test(test_engine_vs_ref_heads),
		cmocka_unit_test(test_embed_vs_ref),
	};
	return cmocka_run_group_tests(tests, NULL, teardown_tmpdir);
}
