/* mkmodel_test.c - random Llama models: read-back, determinism, vocabulary
 * copy, validation, and the Llama-3.2-3B shape (planned, not written). */
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
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/quant.h"
#include "sw_config.h"

static char errbuf[SW_ERR_MAX];
static char dir[64];

static void path_in_tmp(char *buf, size_t n, const char *name)
{
	if (!dir[0]) {
		strcpy(dir, "/tmp/mkmodel_test_XXXXXX");
		assert_non_null(mkdtemp(dir));
	}
	snprintf(buf, n, "%s/%s", dir, name);
}

static bool str_eq(struct gpud_gguf_str s, const char *c)
{
	return s.len == strlen(c) && memcmp(s.s, c, s.len) == 0;
}

static uint8_t *slurp(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	*size = (size_t)ftell(f);
	rewind(f);
	uint8_t *p = malloc(*size);
	assert_non_null(p);
	assert_int_equal(fread(p, 1, *size, f), *size);
	fclose(f);
	return p;
}

static void expect_tensor(struct gpud_gguf *g, const char *name, enum gpud_type type,
			  uint32_t n_dims, uint64_t ne0, uint64_t ne1)
{
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, name);
	if (!t)
		fail_msg("missing tensor %s", name);
	if (t->type != type || t->n_dims != n_dims || t->ne[0] != ne0 ||
	    (n_dims > 1 && t->ne[1] != ne1))
		fail_msg("%s: type %s dims %u [%llu, %llu], want %s %u [%llu, %llu]", name,
			 gpud_type_name(t->type), t->n_dims, (unsigned long long)t->ne[0],
			 (unsigned long long)t->ne[1], gpud_type_name(type), n_dims,
			 (unsigned long long)ne0, (unsigned long long)ne1);
}

/* Streaming: writing a 17 MB model raises the peak RSS by far less than
 * the model's size. Runs first, before other tests raise the peak. */
static void test_streaming_memory(void **state)
{
	(void)state;
	char path[128];
	path_in_tmp(path, sizeof(path), "stream.gguf");
	struct gpud_mkmodel_params p;
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.dim = 256;
	p.n_heads = 4;
	p.n_kv_heads = 4;
	p.ffn_dim = 1024;
	p.n_layers = 4;
	struct gpud_mkmodel_plan plan;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), 0);
	assert_true(plan.file_bytes > 17000000);
	struct rusage before, after;
	assert_int_equal(getrusage(RUSAGE_SELF, &before), 0);
	int rc = gpud_mkmodel(&p, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	assert_int_equal(getrusage(RUSAGE_SELF, &after), 0);
	long grew_kb = after.ru_maxrss - before.ru_maxrss;
	if (grew_kb * 1024 > (long)plan.file_bytes / 3)
		fail_msg("peak RSS grew by %ld KB writing a %llu-byte model", grew_kb,
			 (unsigned long long)plan.file_bytes);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal((uint64_t)st.st_size, plan.file_bytes);
	unlink(path);
}

static void test_default_round_trip(void **state)
{
	(void)state;
	char path[128];
	path_in_tmp(path, sizeof(path), "tiny.gguf");
	struct gpud_mkmodel_params p;
	gpud_mkmodel_params_default(&p);
	p.out = path;
	struct gpud_mkmodel_plan plan;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), 0);
	int rc = gpud_mkmodel(&p, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal((uint64_t)st.st_size, plan.file_bytes);
	assert_int_equal(plan.head_dim, 16);
	assert_int_equal(plan.n_tensors, 3 + 2 * 9);

	struct gpud_gguf *g;
	rc = gpud_gguf_open(&g, path, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	assert_int_equal(gpud_gguf_n_tensors(g), plan.n_tensors);
	struct gpud_gguf_str s;
	assert_int_equal(gpud_gguf_get_str(g, "general.architecture", &s), 0);
	assert_true(str_eq(s, "llama"));
	static const struct {
		const char *key;
		uint32_t v;
	} u32s[] = {
		{ "llama.context_length", 512 }, { "llama.embedding_length", 64 },
		{ "llama.block_count", 2 }, { "llama.feed_forward_length", 128 },
		{ "llama.attention.head_count", 4 }, { "llama.attention.head_count_kv", 2 },
		{ "llama.rope.dimension_count", 16 }, { "general.file_type", 0 },
		{ "tokenizer.ggml.bos_token_id", 1 }, { "tokenizer.ggml.eos_token_id", 2 },
		{ "tokenizer.ggml.unknown_token_id", 0 },
	};
	for (size_t i = 0; i < sizeof(u32s) / sizeof(u32s[0]); i++) {
		uint32_t v;
		assert_int_equal(gpud_gguf_get_u32(g, u32s[i].key, &v), 0);
		if (v != u32s[i].v)
			fail_msg("%s = %u, want %u", u32s[i].key, v, u32s[i].v);
	}
	float f;
	assert_int_equal(gpud_gguf_get_f32(g, "llama.rope.freq_base", &f), 0);
	assert_float_equal(f, 10000.0f, 0.0f);
	assert_int_equal(gpud_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
	assert_float_equal(f, 1e-5f, 0.0f);

	/* Byte vocabulary. */
	uint32_t n_vocab;
	assert_int_equal(gpud_gguf_get_u32(g, "llama.vocab_size", &n_vocab), 0);
	assert_int_equal(n_vocab, plan.n_vocab);
	assert_true(n_vocab > 259 + 94);
	enum gpud_gguf_vtype vt;
	uint64_t n;
	assert_int_equal(gpud_gguf_get_arr(g, "tokenizer.ggml.tokens", &vt, &n), 0);
	assert_int_equal(n, n_vocab);
	assert_int_equal(gpud_gguf_get_str(g, "tokenizer.ggml.model", &s), 0);
	assert_true(str_eq(s, "llama"));
	static const char *const first[] = { "<unk>", "<s>", "</s>", "<0x00>" };
	static const int32_t first_type[] = { 2, 3, 3, 6 };
	for (int i = 0; i < 4; i++) {
		int32_t tt;
		assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i, &s), 0);
		assert_true(str_eq(s, first[i]));
		assert_int_equal(gpud_gguf_arr_i32(g, "tokenizer.ggml.token_type", (uint64_t)i, &tt), 0);
		assert_int_equal(tt, first_type[i]);
	}
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 3 + 0x41, &s), 0);
	assert_true(str_eq(s, "<0x41>"));
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 258, &s), 0);
	assert_true(str_eq(s, "<0xFF>"));
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 259, &s), 0);
	assert_true(str_eq(s, "\xe2\x96\x81"));
	/* Every piece is unique, and every word piece's prefix is a piece. */
	for (uint64_t i = 0; i < n; i++) {
		struct gpud_gguf_str a;
		assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &a), 0);
		for (uint64_t j = i + 1; j < n; j++) {
			struct gpud_gguf_str b;
			assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", j, &b), 0);
			assert_false(a.len == b.len && memcmp(a.s, b.s, a.len) == 0);
		}
	}
	bool found_the = false;
	for (uint64_t i = 0; i < n; i++) {
		assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s), 0);
		found_the |= str_eq(s, "\xe2\x96\x81the");
	}
	assert_true(found_the);

	/* Tensors. */
	expect_tensor(g, "token_embd.weight", GPUD_TYPE_F32, 2, 64, n_vocab);
	expect_tensor(g, "output.weight", GPUD_TYPE_F32, 2, 64, n_vocab);
	expect_tensor(g, "output_norm.weight", GPUD_TYPE_F32, 1, 64, 1);
	assert_null(gpud_gguf_find_tensor(g, "rope_freqs.weight"));
	for (int l = 0; l < 2; l++) {
		char name[64];
#define T(part, ty, nd, a, b) \
	snprintf(name, sizeof(name), "blk.%d." part ".weight", l); \
	expect_tensor(g, name, ty, nd, a, b)
		T("attn_norm", GPUD_TYPE_F32, 1, 64, 1);
		T("attn_q", GPUD_TYPE_F32, 2, 64, 64);
		T("attn_k", GPUD_TYPE_F32, 2, 64, 32);
		T("attn_v", GPUD_TYPE_F32, 2, 64, 32);
		T("attn_output", GPUD_TYPE_F32, 2, 64, 64);
		T("ffn_norm", GPUD_TYPE_F32, 1, 64, 1);
		T("ffn_gate", GPUD_TYPE_F32, 2, 64, 128);
		T("ffn_up", GPUD_TYPE_F32, 2, 64, 128);
		T("ffn_down", GPUD_TYPE_F32, 2, 128, 64);
#undef T
	}
	assert_null(gpud_gguf_find_tensor(g, "blk.2.attn_q.weight"));

	/* Norms are 1; weights have std ~0.02 and mean ~0; residual outputs
	 * are smaller. */
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "blk.1.ffn_norm.weight");
	for (int i = 0; i < 64; i++) {
		float v;
		memcpy(&v, (const float *)t->data + i, 4);
		assert_float_equal(v, 1.0f, 0.0f);
	}
	t = gpud_gguf_find_tensor(g, "token_embd.weight");
	double sum = 0, sq = 0;
	uint64_t cnt = t->ne[0] * t->ne[1];
	for (uint64_t i = 0; i < cnt; i++) {
		float v;
		memcpy(&v, (const float *)t->data + i, 4);
		assert_true(fabsf(v) <= 0.0347f);
		sum += v;
		sq += (double)v * v;
	}
	double mean = sum / (double)cnt, sd = sqrt(sq / (double)cnt - mean * mean);
	assert_true(fabs(mean) < 0.001);
	assert_true(sd > 0.019 && sd < 0.021);
	t = gpud_gguf_find_tensor(g, "blk.0.ffn_down.weight");
	sq = 0;
	for (uint64_t i = 0; i < 128 * 64; i++) {
		float v;
		memcpy(&v, (const float *)t->data + i, 4);
		sq += (double)v * v;
	}
	sd = sqrt(sq / (128 * 64));
	assert_true(sd > 0.009 && sd < 0.011); /* 0.02 / sqrt(2 * 2) */
	gpud_gguf_close(g);
	unlink(path);
}

static void test_types_and_rope(void **state)
{
	(void)state;
	static const enum gpud_type types[] = {
		GPUD_TYPE_F16, GPUD_TYPE_BF16, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,
	};
	static const uint32_t ftypes[] = { 1, 32, 7, 2 };
	for (size_t k = 0; k < 4; k++) {
		char path[128];
		path_in_tmp(path, sizeof(path), "typed.gguf");
		struct gpud_mkmodel_params p;
		gpud_mkmodel_params_default(&p);
		p.out = path;
		p.type = types[k];
		p.n_layers = 1;
		p.tied = true;
		p.rope_base = 500000.0f;
		p.rope_scale_factor = 32.0f;
		p.rope_low_freq_factor = 1.0f;
		p.rope_high_freq_factor = 4.0f;
		p.rope_orig_ctx = 8192;
		struct gpud_mkmodel_plan plan;
		assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), 0);
		int rc = gpud_mkmodel(&p, errbuf, sizeof(errbuf));
		if (rc)
			fail_msg("%s", errbuf);
		struct gpud_gguf *g;
		assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
		assert_int_equal(gpud_gguf_n_tensors(g), plan.n_tensors);
		assert_int_equal(plan.n_tensors, 3 + 9);
		uint32_t ft;
		assert_int_equal(gpud_gguf_get_u32(g, "general.file_type", &ft), 0);
		assert_int_equal(ft, ftypes[k]);
		assert_null(gpud_gguf_find_tensor(g, "output.weight"));
		expect_tensor(g, "token_embd.weight", types[k], 2, 64, plan.n_vocab);
		expect_tensor(g, "blk.0.ffn_down.weight", types[k], 2, 128, 64);
		expect_tensor(g, "blk.0.attn_norm.weight", GPUD_TYPE_F32, 1, 64, 1);
		expect_tensor(g, "rope_freqs.weight", GPUD_TYPE_F32, 1, 8, 1);

		/* Dequantized weights keep the distribution. */
		const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "blk.0.attn_q.weight");
		float row[64];
		double sq = 0;
		for (int r = 0; r < 64; r++) {
			gpud_dequantize_row(types[k],
					    (const uint8_t *)t->data + r * gpud_type_row_bytes(types[k], 64),
					    row, 64);
			for (int c = 0; c < 64; c++) {
				assert_true(fabsf(row[c]) < 0.036f);
				sq += (double)row[c] * row[c];
			}
		}
		double sd = sqrt(sq / (64 * 64));
		assert_true(sd > 0.018 && sd < 0.022);

		/* Llama 3 factors: 1 for the highest frequency, 32 for the lowest. */
		t = gpud_gguf_find_tensor(g, "rope_freqs.weight");
		float fr[8];
		memcpy(fr, t->data, sizeof(fr));
		assert_float_equal(fr[0], 1.0f, 0.0f);
		assert_float_equal(fr[7], 32.0f, 0.0f);
		for (int i = 1; i < 8; i++)
			assert_true(fr[i] >= fr[i - 1]);
		gpud_gguf_close(g);
		unlink(path);
	}
}

static void test_determinism(void **state)
{
	(void)state;
	char a[128], b[128], c[128];
	path_in_tmp(a, sizeof(a), "a.gguf");
	path_in_tmp(b, sizeof(b), "b.gguf");
	path_in_tmp(c, sizeof(c), "c.gguf");
	struct gpud_mkmodel_params p;
	gpud_mkmodel_params_default(&p);
	p.type = GPUD_TYPE_Q8_0;
	p.seed = 42;
	p.out = a;
	assert_int_equal(gpud_mkmodel(&p, errbuf, sizeof(errbuf)), 0);
	p.out = b;
	assert_int_equal(gpud_mkmodel(&p, errbuf, sizeof(errbuf)), 0);
	p.out = c;
	p.seed = 43;
	assert_int_equal(gpud_mkmodel(&p, errbuf, sizeof(errbuf)), 0);
	size_t na, nb, nc;
	uint8_t *da = slurp(a, &na), *db = slurp(b, &nb), *dc = slurp(c, &nc);
	assert_int_equal(na, nb);
	assert_memory_equal(da, db, na);
	assert_int_equal(na, nc);
	assert_memory_not_equal(da, dc, na);
	/* Different tensors of one file differ too (no shared stream). */
	struct gpud_gguf *g;
	assert_int_equal(gpud_gguf_open(&g, a, errbuf, sizeof(errbuf)), 0);
	const struct gpud_gguf_tensor *q0 = gpud_gguf_find_tensor(g, "blk.0.attn_q.weight");
	const struct gpud_gguf_tensor *q1 = gpud_gguf_find_tensor(g, "blk.1.attn_q.weight");
	assert_memory_not_equal(q0->data, q1->data, q0->nbytes);
	/* Rows differ from each other. */
	size_t rb = gpud_type_row_bytes(GPUD_TYPE_Q8_0, 64);
	assert_memory_not_equal(q0->data, (const uint8_t *)q0->data + rb, rb);
	gpud_gguf_close(g);
	free(da);
	free(db);
	free(dc);
	unlink(a);
	unlink(b);
	unlink(c);
}

static void test_vocab_from(void **state)
{
	(void)state;
	char path[128];
	path_in_tmp(path, sizeof(path), "spm.gguf");
	const char *src_path = SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-spm.gguf";
	struct gpud_mkmodel_params p;
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.dim = 32;
	p.n_heads = 2;
	p.n_kv_heads = 1;
	p.ffn_dim = 64;
	p.n_layers = 1;
	p.tied = true;
	p.type = GPUD_TYPE_Q4_0;
	p.vocab_from = src_path;
	int rc = gpud_mkmodel(&p, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	struct gpud_gguf *g, *src;
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_open(&src, src_path, errbuf, sizeof(errbuf)), 0);
	uint32_t v;
	assert_int_equal(gpud_gguf_get_u32(g, "llama.vocab_size", &v), 0);
	assert_int_equal(v, 32000);
	expect_tensor(g, "token_embd.weight", GPUD_TYPE_Q4_0, 2, 32, 32000);
	/* Every tokenizer.* key came across with the same value. */
	size_t copied = 0;
	for (uint64_t i = 0; i < gpud_gguf_n_kv(src); i++) {
		const char *key = gpud_gguf_key(src, i);
		if (strncmp(key, "tokenizer.", 10))
			continue;
		copied++;
		enum gpud_gguf_vtype ta, tb;
		assert_int_equal(gpud_gguf_key_type(g, key, &ta), 0);
		assert_int_equal(gpud_gguf_key_type(src, key, &tb), 0);
		assert_int_equal(ta, tb);
	}
	assert_int_equal(copied, 10);
	for (uint64_t i = 0; i < 32000; i += 101) {
		struct gpud_gguf_str a, b;
		float fa, fb;
		assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &a), 0);
		assert_int_equal(gpud_gguf_arr_str(src, "tokenizer.ggml.tokens", i, &b), 0);
		assert_int_equal(a.len, b.len);
		assert_memory_equal(a.s, b.s, a.len);
		assert_int_equal(gpud_gguf_arr_f32(g, "tokenizer.ggml.scores", i, &fa), 0);
		assert_int_equal(gpud_gguf_arr_f32(src, "tokenizer.ggml.scores", i, &fb), 0);
		assert_float_equal(fa, fb, 0.0f);
	}
	/* Model keys are ours, not the source's. */
	assert_int_equal(gpud_gguf_get_u32(g, "llama.block_count", &v), 0);
	assert_int_equal(v, 1);
	gpud_gguf_close(src);
	gpud_gguf_close(g);
	unlink(path);

	/* A source without a vocabulary is refused. */
	p.vocab_from = SW_SHARED_DIR "/models/README.md";
	assert_true(gpud_mkmodel(&p, errbuf, sizeof(errbuf)) < 0);
	assert_non_null(strstr(errbuf, "README.md"));
	assert_int_equal(access(path, F_OK), -1);
}

static void test_validation(void **state)
{
	(void)state;
	struct gpud_mkmodel_params p;
	struct gpud_mkmodel_plan plan;

	gpud_mkmodel_params_default(&p);
	p.n_heads = 3;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "heads 3 must divide dim 64"));
	gpud_mkmodel_params_default(&p);
	p.n_kv_heads = 3;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "kv-heads 3 must divide heads 4"));
	gpud_mkmodel_params_default(&p);
	p.n_kv_heads = 0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.dim = 60;
	p.n_heads = 4; /* head dim 15 */
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "head dim 15"));
	gpud_mkmodel_params_default(&p);
	p.dim = 48;
	p.n_heads = 3;
	p.n_kv_heads = 1;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), 0);
	p.type = GPUD_TYPE_Q8_0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "q8_0 block size 32"));
	gpud_mkmodel_params_default(&p);
	p.ffn_dim = 100;
	p.type = GPUD_TYPE_Q4_0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.type = (enum gpud_type)16;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), SW_EUNSUPPORTED);
	assert_non_null(strstr(errbuf, "iq2_xxs"));
	gpud_mkmodel_params_default(&p);
	p.n_layers = 0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.dim = 0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.rope_base = 1.0f;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.norm_eps = NAN;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.n_ctx = 0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	gpud_mkmodel_params_default(&p);
	p.rope_scale_factor = 8.0f;
	p.rope_low_freq_factor = 4.0f;
	p.rope_high_freq_factor = 1.0f;
	p.rope_orig_ctx = 8192;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "rope scaling"));
	gpud_mkmodel_params_default(&p);
	p.rope_yarn_factor = 0.5f;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "bad yarn rope scaling"));
	gpud_mkmodel_params_default(&p);
	p.vocab_from = "/nonexistent.gguf";
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -ENOENT);
	gpud_mkmodel_params_default(&p);
	assert_int_equal(gpud_mkmodel(&p, errbuf, sizeof(errbuf)), -EINVAL); /* no out */
	assert_int_equal(gpud_mkmodel(NULL, errbuf, sizeof(errbuf)), -EINVAL);
	assert_int_equal(gpud_mkmodel_plan(NULL, &plan, NULL, 0), -EINVAL);
	p.out = "/nonexistent-dir/m.gguf";
	assert_true(gpud_mkmodel(&p, errbuf, sizeof(errbuf)) < 0);
	assert_non_null(strstr(errbuf, "/nonexistent-dir/m.gguf"));
	assert_int_equal(gpud_mkmodel_preset(&p, "nope"), SW_ENOTFOUND);
	p.dim = 8;
	assert_int_equal(gpud_mkmodel_preset(&p, "tiny"), 0);
	assert_int_equal(p.dim, 64);
	assert_string_equal(p.out, "/nonexistent-dir/m.gguf"); /* kept */
}

/* Llama-3.2-3B: 3.21 B parameters. Planned only: the F32 file is 12.9 GB. */
static void test_llama32_3b_plan(void **state)
{
	(void)state;
	struct gpud_mkmodel_params p;
	struct gpud_mkmodel_plan plan;
	gpud_mkmodel_params_default(&p);
	assert_int_equal(gpud_mkmodel_preset(&p, "llama-3.2-3b"), 0);
	p.vocab_from = SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-bpe.gguf";
	int rc = gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	assert_int_equal(plan.n_vocab, 128256);
	assert_int_equal(plan.head_dim, 128);
	assert_int_equal(plan.n_tensors, 1 + 1 + 1 + 28 * 9);
	uint64_t per_layer = 3072ull * 3072 * 2 + 3072ull * 1024 * 2 + 3ull * 3072 * 8192 + 2 * 3072;
	uint64_t params = 3072ull * 128256 + 28 * per_layer + 3072 + 64;
	/* Meta lists 3,212,749,824 parameters; + 64 rope factors. */
	assert_int_equal(params, 3212749824ull + 64);
	assert_int_equal(plan.n_params, params);
	/* F32 data plus a header holding the 7.8 MB vocabulary and padding. */
	assert_true(plan.file_bytes > params * 4 + 7800000);
	assert_true(plan.file_bytes < params * 4 + 7900000);

	p.type = GPUD_TYPE_Q8_0;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), 0);
	/* Matrices at 34/32 bytes per weight, norms and rope factors F32. */
	uint64_t f32_elems = 3072 + 64 + 28 * 2 * 3072;
	uint64_t q_bytes = (params - f32_elems) / 32 * 34;
	assert_true(plan.file_bytes > q_bytes + f32_elems * 4 + 7800000);
	assert_true(plan.file_bytes < q_bytes + f32_elems * 4 + 7900000);
}

/* --arch qwen2: qwen2.* keys, F32 Q/K/V biases of the right shapes, no
 * rope_freqs; the same tensors as a llama file with biases of the same
 * parameters; Llama 3 scaling refused. */
static void test_qwen2_round_trip(void **state)
{
	(void)state;
	char path[128], lpath[128];
	struct gpud_mkmodel_params p;
	struct gpud_mkmodel_plan plan;
	struct gpud_gguf *g, *lg;
	struct gpud_gguf_str s;
	uint32_t v;
	float f;

	path_in_tmp(path, sizeof(path), "qwen2.gguf");
	path_in_tmp(lpath, sizeof(lpath), "llama-bias.gguf");
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.arch = GPUD_ARCH_QWEN2;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(plan.n_tensors, 3 + 2 * 12); /* embd, out norm, output; 9 + 3 biases */
	if (gpud_mkmodel(&p, errbuf, sizeof(errbuf)))
		fail_msg("%s", errbuf);
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_get_str(g, "general.architecture", &s), 0);
	assert_true(str_eq(s, "qwen2"));
	assert_int_equal(gpud_gguf_get_u32(g, "qwen2.block_count", &v), 0);
	assert_int_equal(v, 2);
	assert_int_equal(gpud_gguf_get_u32(g, "qwen2.attention.head_count_kv", &v), 0);
	assert_int_equal(v, 2);
	assert_int_equal(gpud_gguf_get_f32(g, "qwen2.rope.freq_base", &f), 0);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.block_count", &v), SW_ENOTFOUND);
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "blk.1.attn_q.bias");
	assert_non_null(t);
	assert_int_equal(t->type, GPUD_TYPE_F32);
	assert_int_equal(t->n_dims, 1);
	assert_int_equal(t->ne[0], 64);
	t = gpud_gguf_find_tensor(g, "blk.0.attn_k.bias");
	assert_non_null(t);
	assert_int_equal(t->ne[0], 32); /* 2 kv heads of 16 */
	assert_non_null(gpud_gguf_find_tensor(g, "blk.0.attn_v.bias"));
	assert_null(gpud_gguf_find_tensor(g, "rope_freqs.weight"));
	/* biases are random, not zero */
	const float *b = t->data;
	assert_true(b[0] != 0 || b[1] != 0);

	p.out = lpath;
	p.arch = GPUD_ARCH_LLAMA;
	p.qkv_bias = true;
	if (gpud_mkmodel(&p, errbuf, sizeof(errbuf)))
		fail_msg("%s", errbuf);
	assert_int_equal(gpud_gguf_open(&lg, lpath, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_n_tensors(lg), gpud_gguf_n_tensors(g));
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(g); i++) {
		const struct gpud_gguf_tensor *a = gpud_gguf_tensor(g, i);
		const struct gpud_gguf_tensor *c = gpud_gguf_find_tensor(lg, a->name);
		assert_non_null(c);
		assert_int_equal(a->nbytes, c->nbytes);
		assert_memory_equal(a->data, c->data, a->nbytes);
	}
	gpud_gguf_close(lg);
	gpud_gguf_close(g);
	unlink(path);
	unlink(lpath);

	p.arch = GPUD_ARCH_QWEN2;
	p.rope_scale_factor = 8;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "qwen2"));
	p.rope_scale_factor = 0;
	p.arch = (enum gpud_arch)7;
	assert_int_equal(gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf)), -EINVAL);
	assert_non_null(strstr(errbuf, "architecture"));
}

/* Qwen2.5-3B (Qwen's config.json: hidden 2048, 36 layers, 16 heads, 2 KV
 * heads, intermediate 11008, vocab 151936, rope theta 1e6, rms eps 1e-6,
 * tied embeddings): 3.09 B parameters. Planned only. */
static void test_qwen25_3b_plan(void **state)
{
	(void)state;
	struct gpud_mkmodel_params p;
	struct gpud_mkmodel_plan plan;
	gpud_mkmodel_params_default(&p);
	p.arch = GPUD_ARCH_LLAMA;
	assert_int_equal(gpud_mkmodel_preset(&p, "qwen2.5-3b"), 0);
	assert_int_equal(p.arch, GPUD_ARCH_QWEN2);
	assert_true(p.tied);
	assert_float_equal(p.rope_base, 1e6f, 0);
	assert_float_equal(p.norm_eps, 1e-6f, 0);
	assert_int_equal(p.n_ctx, 32768);
	p.vocab_from = SW_SHARED_DIR "/tokenizer/ggml-vocab-qwen2.gguf";
	int rc = gpud_mkmodel_plan(&p, &plan, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	print_message("qwen2 vocabulary: %llu tokens\n", (unsigned long long)plan.n_vocab);
	assert_int_equal(plan.head_dim, 128);
	assert_int_equal(plan.n_tensors, 1 + 1 + 36 * 12);
	uint64_t per_layer = 2048ull * 2048 * 2 + 2048ull * 256 * 2 + 3ull * 2048 * 11008 +
			     2 * 2048 + 2048 + 2 * 256;
	assert_int_equal(plan.n_params, plan.n_vocab * 2048 + 36 * per_layer + 2048);
	/* with Qwen2.5's 151936 embedding rows: 3,085,938,688 parameters */
	assert_int_equal(151936ull * 2048 + 36 * per_layer + 2048, 3085938688ull);
	/* the llama preset switches the architecture back */
	assert_int_equal(gpud_mkmodel_preset(&p, "llama-3.2-3b"), 0);
	assert_int_equal(p.arch, GPUD_ARCH_LLAMA);
	/* tiny keeps it */
	p.arch = GPUD_ARCH_QWEN2;
	assert_int_equal(gpud_mkmodel_preset(&p, "tiny"), 0);
	assert_int_equal(p.arch, GPUD_ARCH_QWEN2);
}

/* --type parsing and the K mixes' per-tensor choice (llama.cpp's recipe:
 * for 28 layers, attn_v and ffn_down of layers 0-2, 5, 8, ..., 23 and
 * 24-27 get Q6_K), then a written Q4_K_M model: its tensors' types, its
 * file type, a clean load, and a load refused once a block's d is NaN. */
static void test_kquant_mix(void **state)
{
	static const int more[] = { 0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27 };
	struct gpud_mkmodel_params p;
	enum gpud_type t = GPUD_TYPE_F32;
	enum gpud_mkmodel_mix mix = GPUD_MKMODEL_PURE;
	char path[128], name[64], err[SW_ERR_MAX];
	struct gpud_gguf *g;
	struct gpud_model *m = NULL;
	uint32_t ft;

	(void)state;
	assert_int_equal(gpud_mkmodel_parse_type("q4_k_m", &t, &mix), 0);
	assert_int_equal(t, GPUD_TYPE_Q4_K);
	assert_int_equal(mix, GPUD_MKMODEL_Q4_K_M);
	assert_int_equal(gpud_mkmodel_parse_type("Q5_K_M", &t, &mix), 0);
	assert_int_equal(t, GPUD_TYPE_Q5_K);
	assert_int_equal(mix, GPUD_MKMODEL_Q5_K_M);
	assert_int_equal(gpud_mkmodel_parse_type("q6_k", &t, &mix), 0);
	assert_int_equal(t, GPUD_TYPE_Q6_K);
	assert_int_equal(mix, GPUD_MKMODEL_PURE);
	assert_int_equal(gpud_mkmodel_parse_type("q8_k", &t, &mix), -EINVAL);
	assert_int_equal(gpud_mkmodel_parse_type("q4_k_s", &t, &mix), -EINVAL);
	assert_int_equal(gpud_mkmodel_parse_type(NULL, &t, &mix), -EINVAL);
	assert_int_equal(t, GPUD_TYPE_Q6_K); /* unchanged on failure */

	gpud_mkmodel_params_default(&p);
	p.n_layers = 28;
	p.dim = 256;
	p.ffn_dim = 512;
	p.type = GPUD_TYPE_Q4_K;
	p.mix = GPUD_MKMODEL_Q4_K_M;
	for (uint32_t l = 0, k = 0; l < 28; l++) {
		bool up = k < sizeof(more) / sizeof(more[0]) && more[k] == (int)l;
		enum gpud_type want = up ? GPUD_TYPE_Q6_K : GPUD_TYPE_Q4_K;

		k += up;
		snprintf(name, sizeof(name), "blk.%u.attn_v.weight", l);
		assert_int_equal(gpud_mkmodel_tensor_type(&p, name), want);
		snprintf(name, sizeof(name), "blk.%u.ffn_down.weight", l);
		assert_int_equal(gpud_mkmodel_tensor_type(&p, name), want);
		snprintf(name, sizeof(name), "blk.%u.attn_k.weight", l);
		assert_int_equal(gpud_mkmodel_tensor_type(&p, name), GPUD_TYPE_Q4_K);
		snprintf(name, sizeof(name), "blk.%u.ffn_up.weight", l);
		assert_int_equal(gpud_mkmodel_tensor_type(&p, name), GPUD_TYPE_Q4_K);
	}
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "output.weight"), GPUD_TYPE_Q6_K);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "token_embd.weight"), GPUD_TYPE_Q4_K);
	p.tied = true;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "token_embd.weight"), GPUD_TYPE_Q6_K);
	p.mix = GPUD_MKMODEL_PURE;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "output.weight"), GPUD_TYPE_Q4_K);

	/* Rows no 256-weight block fits take llama.cpp's 32-weight types
	 * (Qwen2.5-0.5B: dim 896, ffn 4864): dim 160, ffn 512 */
	p.mix = GPUD_MKMODEL_Q4_K_M;
	p.tied = false;
	p.dim = 160;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.3.attn_q.weight"), GPUD_TYPE_Q5_0);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.0.attn_v.weight"), GPUD_TYPE_Q8_0);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.3.attn_v.weight"), GPUD_TYPE_Q5_0);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.0.ffn_down.weight"), GPUD_TYPE_Q6_K);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.3.ffn_down.weight"), GPUD_TYPE_Q4_K);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "output.weight"), GPUD_TYPE_Q8_0);
	p.type = GPUD_TYPE_Q5_K;
	p.mix = GPUD_MKMODEL_Q5_K_M;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.3.ffn_up.weight"), GPUD_TYPE_Q5_1);
	p.mix = GPUD_MKMODEL_PURE;
	p.type = GPUD_TYPE_Q2_K;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.3.ffn_up.weight"), GPUD_TYPE_IQ4_NL);
	p.type = GPUD_TYPE_Q3_K;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "token_embd.weight"), GPUD_TYPE_IQ4_NL);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.1.ffn_down.weight"), GPUD_TYPE_Q3_K);
	p.type = GPUD_TYPE_Q6_K;
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.1.ffn_gate.weight"), GPUD_TYPE_Q8_0);
	p.type = GPUD_TYPE_IQ4_XS; /* 256-weight too: IQ4_NL where it does not fit */
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.1.ffn_gate.weight"), GPUD_TYPE_IQ4_NL);
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.1.ffn_down.weight"), GPUD_TYPE_IQ4_XS);
	p.type = GPUD_TYPE_Q5_0; /* not a K-quant: as asked */
	assert_int_equal(gpud_mkmodel_tensor_type(&p, "blk.1.ffn_gate.weight"), GPUD_TYPE_Q5_0);

	/* mix and base must agree; K widths need 32 (the fallbacks' block) */
	gpud_mkmodel_params_default(&p);
	p.dim = 256;
	p.ffn_dim = 512;
	p.type = GPUD_TYPE_Q5_K;
	p.mix = GPUD_MKMODEL_Q4_K_M;
	assert_int_equal(gpud_mkmodel_plan(&p, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "q4_k_m is q4_k"));
	p.type = GPUD_TYPE_Q4_K;
	p.dim = 128;
	assert_int_equal(gpud_mkmodel_plan(&p, NULL, err, sizeof(err)), 0);
	p.dim = 144;
	assert_int_equal(gpud_mkmodel_plan(&p, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "must be multiples of 32 for q4_k"));

	/* a tied Q4_K_M model, 2 layers (layer 1 gets more bits: 1 >= 7 * 2 / 8) */
	path_in_tmp(path, sizeof(path), "q4km.gguf");
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.dim = 256;
	p.ffn_dim = 512;
	p.type = GPUD_TYPE_Q4_K;
	p.mix = GPUD_MKMODEL_Q4_K_M;
	p.tied = true;
	if (gpud_mkmodel(&p, err, sizeof(err)))
		fail_msg("%s", err);
	assert_int_equal(gpud_gguf_open(&g, path, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_get_u32(g, "general.file_type", &ft), 0);
	assert_int_equal(ft, 15);
	assert_null(gpud_gguf_find_tensor(g, "output.weight"));
	expect_tensor(g, "token_embd.weight", GPUD_TYPE_Q6_K, 2, 256, gpud_gguf_find_tensor(g, "token_embd.weight")->ne[1]);
	expect_tensor(g, "blk.0.attn_q.weight", GPUD_TYPE_Q4_K, 2, 256, 256);
	expect_tensor(g, "blk.0.attn_v.weight", GPUD_TYPE_Q4_K, 2, 256, 128);
	expect_tensor(g, "blk.1.attn_v.weight", GPUD_TYPE_Q6_K, 2, 256, 128);
	expect_tensor(g, "blk.0.ffn_down.weight", GPUD_TYPE_Q4_K, 2, 512, 256);
	expect_tensor(g, "blk.1.ffn_down.weight", GPUD_TYPE_Q6_K, 2, 512, 256);
	expect_tensor(g, "blk.1.ffn_gate.weight", GPUD_TYPE_Q4_K, 2, 256, 512);
	expect_tensor(g, "blk.1.ffn_norm.weight", GPUD_TYPE_F32, 1, 256, 1);
	{
		const struct gpud_gguf_tensor *tt = gpud_gguf_find_tensor(g, "blk.1.ffn_up.weight");
		long at = (long)gpud_gguf_data_offset(g) + (long)tt->offset + 5 * 144; /* block 5's d */
		uint16_t nan = 0x7e00;
		FILE *f;

		gpud_gguf_close(g);
		assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
		gpud_model_free(m);
		m = NULL;
		f = fopen(path, "r+b");
		assert_non_null(f);
		assert_int_equal(fseek(f, at, SEEK_SET), 0);
		assert_int_equal(fwrite(&nan, 2, 1, f), 1);
		fclose(f);
		assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), SW_EFORMAT);
		assert_null(m);
		if (!strstr(err, "tensor 'blk.1.ffn_up.weight': q4_k block 5 (row 5) has a non-finite d 0x7e00"))
			fail_msg("%s", err);
	}
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_streaming_memory),
		cmocka_unit_test(test_default_round_trip),
		cmocka_unit_test(test_types_and_rope),
		cmocka_unit_test(test_determinism),
		cmocka_unit_test(test_vocab_from),
		cmocka_unit_test(test_validation),
		cmocka_unit_test(test_llama32_3b_plan),
		cmocka_unit_test(test_qwen2_round_trip),
		cmocka_unit_test(test_qwen25_3b_plan),
		cmocka_unit_test(test_kquant_mix),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	if (dir[0])
		rmdir(dir);
	return rc;
}
