/* gguf_test.c - GGUF reader on real files, hand-built and corrupted headers,
 * the writer round trip, and the streaming fill path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/quant.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"

static char errbuf[SW_ERR_MAX];

/* --- helpers ---------------------------------------------------------------- */

static bool str_eq(struct gpud_gguf_str s, const char *c)
{
	return s.len == strlen(c) && memcmp(s.s, c, s.len) == 0;
}

static void *read_file(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	long n = ftell(f);
	assert_true(n > 0);
	rewind(f);
	void *p = malloc((size_t)n);
	assert_non_null(p);
	assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*size = (size_t)n;
	return p;
}

/* Opens an exact-size heap copy of buf[0..len) so ASan sees any over-read. */
static int open_copy(const uint8_t *buf, size_t len, const char *name)
{
	uint8_t *p = malloc(len ? len : 1);
	assert_non_null(p);
	memcpy(p, buf, len);
	struct gpud_gguf *g = NULL;
	errbuf[0] = 0;
	int rc = gpud_gguf_open_mem(&g, p, len, name, errbuf, sizeof(errbuf));
	if (rc == 0) {
		assert_non_null(g);
		gpud_gguf_close(g);
	} else {
		assert_null(g);
		assert_true(rc < 0);
		assert_true(strlen(errbuf) > 0);
	}
	free(p);
	return rc;
}

/* Raw header builder: lets tests write any bytes, valid or not, and remember
 * where each field went. */
struct raw {
	uint8_t *p;
	size_t len, cap;
};

static size_t raw_put(struct raw *r, const void *v, size_t n)
{
	if (r->len + n > r->cap) {
		r->cap = (r->len + n) * 2 + 64;
		r->p = realloc(r->p, r->cap);
		assert_non_null(r->p);
	}
	size_t at = r->len;
	memcpy(r->p + r->len, v, n);
	r->len += n;
	return at;
}

static size_t raw_u32(struct raw *r, uint32_t v) { return raw_put(r, &v, 4); }
static size_t raw_u64(struct raw *r, uint64_t v) { return raw_put(r, &v, 8); }
static size_t raw_u8(struct raw *r, uint8_t v) { return raw_put(r, &v, 1); }
static size_t raw_str(struct raw *r, const char *s)
{
	size_t at = raw_u64(r, strlen(s));
	raw_put(r, s, strlen(s));
	return at;
}
static void raw_pad(struct raw *r, size_t align)
{
	while (r->len % align)
		raw_u8(r, 0);
}

static void patch_u32(uint8_t *p, size_t at, uint32_t v) { memcpy(p + at, &v, 4); }
static void patch_u64(uint8_t *p, size_t at, uint64_t v) { memcpy(p + at, &v, 8); }

/* Where each field of the hand-built file sits. */
struct layout {
	size_t version, n_tensors, n_kv;
	size_t k_arch, v_arch_len;      /* key length field, string value length */
	size_t k_align, t_align, v_align;
	size_t t_arr, arr_elem, arr_n, arr_s1;
	size_t k_flag, v_flag;
	size_t w_name, w_ndims, w_ne0, w_ne1, w_type, w_off;
	size_t v_name, v_ndims, v_ne0, v_type, v_off;
	size_t data;
};

/* A valid v3 file: 4 keys, tensor "w" [32, 2] f32 at 0 and "v" [32] q8_0
 * at 256, alignment 32. */
static struct raw build_small(struct layout *L)
{
	struct raw r = { 0 };
	raw_u32(&r, GPUD_GGUF_MAGIC);
	L->version = raw_u32(&r, 3);
	L->n_tensors = raw_u64(&r, 2);
	L->n_kv = raw_u64(&r, 4);

	L->k_arch = raw_str(&r, "general.architecture");
	raw_u32(&r, GPUD_GGUF_STRING);
	L->v_arch_len = raw_str(&r, "llama");

	L->k_align = raw_str(&r, "general.alignment");
	L->t_align = raw_u32(&r, GPUD_GGUF_U32);
	L->v_align = raw_u32(&r, 32);

	raw_str(&r, "test.strs");
	L->t_arr = raw_u32(&r, GPUD_GGUF_ARRAY);
	L->arr_elem = raw_u32(&r, GPUD_GGUF_STRING);
	L->arr_n = raw_u64(&r, 2);
	raw_str(&r, "x");
	L->arr_s1 = raw_str(&r, "yy");

	L->k_flag = raw_str(&r, "test.flag");
	raw_u32(&r, GPUD_GGUF_BOOL);
	L->v_flag = raw_u8(&r, 1);

	L->w_name = raw_str(&r, "w");
	L->w_ndims = raw_u32(&r, 2);
	L->w_ne0 = raw_u64(&r, 32);
	L->w_ne1 = raw_u64(&r, 2);
	L->w_type = raw_u32(&r, GPUD_TYPE_F32);
	L->w_off = raw_u64(&r, 0);

	L->v_name = raw_str(&r, "v");
	L->v_ndims = raw_u32(&r, 1);
	L->v_ne0 = raw_u64(&r, 32);
	L->v_type = raw_u32(&r, GPUD_TYPE_Q8_0);
	L->v_off = raw_u64(&r, 256);

	raw_pad(&r, 32);
	L->data = r.len;
	for (int i = 0; i < 64; i++) {
		float f = (float)i;
		raw_put(&r, &f, 4);
	}
	uint8_t q[34] = { 0 };
	raw_put(&r, q, sizeof(q));
	return r;
}

/* --- real files --------------------------------------------------------------- */

static void test_stories260k(void **state)
{
	(void)state;
	struct gpud_gguf *g = NULL;
	int rc = gpud_gguf_open(&g, STORIES, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("open: %s", errbuf);
	assert_int_equal(gpud_gguf_version(g), 3);
	assert_int_equal(gpud_gguf_n_kv(g), 19);
	assert_int_equal(gpud_gguf_n_tensors(g), 48);
	assert_int_equal(gpud_gguf_alignment(g), 32);
	assert_int_equal(gpud_gguf_data_offset(g), 14176);

	struct gpud_gguf_str s;
	assert_int_equal(gpud_gguf_get_str(g, "general.architecture", &s), 0);
	assert_true(str_eq(s, "llama"));
	uint32_t u;
	assert_int_equal(gpud_gguf_get_u32(g, "llama.embedding_length", &u), 0);
	assert_int_equal(u, 64);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.block_count", &u), 0);
	assert_int_equal(u, 5);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.attention.head_count", &u), 0);
	assert_int_equal(u, 8);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.attention.head_count_kv", &u), 0);
	assert_int_equal(u, 4);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.feed_forward_length", &u), 0);
	assert_int_equal(u, 172);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.context_length", &u), 0);
	assert_int_equal(u, 2048);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.rope.dimension_count", &u), 0);
	assert_int_equal(u, 8);
	uint64_t u64;
	assert_int_equal(gpud_gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &u64), 0);
	assert_int_equal(u64, 1);
	int32_t i32;
	assert_int_equal(gpud_gguf_get_i32(g, "tokenizer.ggml.eos_token_id", &i32), 0);
	assert_int_equal(i32, 2);
	/* 0xffffffff fits u32 but not i32. */
	assert_int_equal(gpud_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &u), 0);
	assert_int_equal(u, UINT32_MAX);
	assert_int_equal(gpud_gguf_get_i32(g, "tokenizer.ggml.padding_token_id", &i32), SW_ETYPE);
	float f;
	assert_int_equal(gpud_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
	assert_float_equal(f, 1e-5f, 1e-9f);

	/* Wrong types and missing keys. */
	assert_int_equal(gpud_gguf_get_u32(g, "general.architecture", &u), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_f32(g, "llama.block_count", &f), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_str(g, "llama.block_count", &s), SW_ETYPE);
	bool b;
	assert_int_equal(gpud_gguf_get_bool(g, "llama.block_count", &b), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_u32(g, "llama.nope", &u), SW_ENOTFOUND);
	assert_int_equal(gpud_gguf_get_str(g, "", &s), SW_ENOTFOUND);
	assert_false(gpud_gguf_has(g, "zzz"));
	assert_true(gpud_gguf_has(g, "general.name"));
	enum gpud_gguf_vtype vt;
	assert_int_equal(gpud_gguf_key_type(g, "llama.block_count", &vt), 0);
	assert_int_equal(vt, GPUD_GGUF_U32);
	assert_int_equal(gpud_gguf_key_type(g, "nope", &vt), SW_ENOTFOUND);
	assert_string_equal(gpud_gguf_key(g, 0), "tokenizer.ggml.tokens");
	assert_null(gpud_gguf_key(g, 19));

	/* Vocabulary arrays. */
	uint64_t n;
	assert_int_equal(gpud_gguf_get_arr(g, "tokenizer.ggml.tokens", &vt, &n), 0);
	assert_int_equal(vt, GPUD_GGUF_STRING);
	assert_int_equal(n, 512);
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s), 0);
	assert_true(str_eq(s, "<unk>"));
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 2, &s), 0);
	assert_true(str_eq(s, "</s>"));
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 3, &s), 0);
	assert_true(str_eq(s, "<0x00>"));
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 512, &s), -ERANGE);
	assert_int_equal(gpud_gguf_arr_i32(g, "tokenizer.ggml.tokens", 0, &i32), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_i32(g, "tokenizer.ggml.token_type", 3, &i32), 0);
	assert_int_equal(i32, 6);
	assert_int_equal(gpud_gguf_arr_i32(g, "tokenizer.ggml.token_type", 0, &i32), 0);
	assert_int_equal(i32, 2);
	assert_int_equal(gpud_gguf_arr_f32(g, "tokenizer.ggml.scores", 0, &f), 0);
	assert_int_equal(gpud_gguf_arr_f32(g, "tokenizer.ggml.scores", 511, &f), 0);
	assert_true(isfinite(f));
	assert_int_equal(gpud_gguf_arr_f32(g, "tokenizer.ggml.token_type", 0, &f), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.scores", 0, &s), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_str(g, "general.name", 0, &s), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_str(g, "nope", 0, &s), SW_ENOTFOUND);
	assert_int_equal(gpud_gguf_get_arr(g, "general.name", &vt, &n), SW_ETYPE);
	const void *data;
	assert_int_equal(gpud_gguf_arr_data(g, "tokenizer.ggml.scores", &vt, &data, &n), 0);
	assert_int_equal(vt, GPUD_GGUF_F32);
	assert_int_equal(n, 512);
	assert_int_equal(gpud_gguf_arr_data(g, "tokenizer.ggml.tokens", &vt, &data, &n), SW_ETYPE);

	/* Tensors. */
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "token_embd.weight");
	assert_non_null(t);
	assert_ptr_equal(t, gpud_gguf_tensor(g, 0));
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->ne[0], 64);
	assert_int_equal(t->ne[1], 512);
	assert_int_equal(t->ne[2], 1);
	assert_int_equal(t->type, GPUD_TYPE_F32);
	assert_int_equal(t->nbytes, 64 * 512 * 4);
	assert_int_equal(t->offset, 0);
	t = gpud_gguf_find_tensor(g, "blk.4.ffn_norm.weight");
	assert_non_null(t);
	assert_ptr_equal(t, gpud_gguf_tensor(g, 47));
	assert_int_equal(t->n_dims, 1);
	assert_int_equal(t->ne[0], 64);
	assert_int_equal(t->offset + t->nbytes + 14176, 1185376);
	t = gpud_gguf_find_tensor(g, "blk.0.ffn_down.weight");
	assert_non_null(t);
	assert_int_equal(t->ne[0], 172);
	assert_int_equal(t->ne[1], 64);
	assert_non_null(gpud_gguf_find_tensor(g, "output.weight"));
	assert_null(gpud_gguf_find_tensor(g, "blk.5.ffn_norm.weight"));
	assert_null(gpud_gguf_find_tensor(g, ""));
	assert_null(gpud_gguf_tensor(g, 48));
	/* Norm weights of a trained model are finite and mostly positive. */
	t = gpud_gguf_find_tensor(g, "output_norm.weight");
	float w[64];
	memcpy(w, t->data, sizeof(w));
	int pos = 0;
	for (int i = 0; i < 64; i++) {
		assert_true(isfinite(w[i]));
		pos += w[i] > 0;
	}
	assert_true(pos > 48);
	/* Every tensor lies in the file, in order, aligned. */
	for (uint64_t i = 0; i < 48; i++) {
		t = gpud_gguf_tensor(g, i);
		assert_int_equal(t->offset % 32, 0);
		assert_ptr_equal(gpud_gguf_find_tensor(g, t->name), t);
	}
	gpud_gguf_close(g);
	gpud_gguf_close(NULL);
}

static void test_tokenizer_files(void **state)
{
	(void)state;
	glob_t gl;
	assert_int_equal(glob(SW_SHARED_DIR "/tokenizer/*.gguf", 0, NULL, &gl), 0);
	assert_true(gl.gl_pathc >= 5);
	for (size_t k = 0; k < gl.gl_pathc; k++) {
		struct gpud_gguf *g = NULL;
		int rc = gpud_gguf_open(&g, gl.gl_pathv[k], errbuf, sizeof(errbuf));
		if (rc)
			fail_msg("%s", errbuf);
		assert_int_equal(gpud_gguf_n_tensors(g), 0);
		enum gpud_gguf_vtype vt;
		uint64_t n;
		assert_int_equal(gpud_gguf_get_arr(g, "tokenizer.ggml.tokens", &vt, &n), 0);
		assert_int_equal(vt, GPUD_GGUF_STRING);
		assert_true(n >= 32000);
		/* Every string reachable, non-empty, and inside the mapping. */
		uint64_t total = 0;
		for (uint64_t i = 0; i < n; i++) {
			struct gpud_gguf_str s;
			assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s), 0);
			assert_true(s.len > 0);
			total += s.len;
		}
		assert_true(total >= n);
		int32_t tt;
		assert_int_equal(gpud_gguf_arr_i32(g, "tokenizer.ggml.token_type", n - 1, &tt), 0);
		uint32_t vs;
		if (gpud_gguf_get_u32(g, "llama.vocab_size", &vs) == 0)
			assert_int_equal(vs, n);
		struct gpud_gguf_str s;
		assert_int_equal(gpud_gguf_get_str(g, "tokenizer.ggml.model", &s), 0);
		if (strstr(gl.gl_pathv[k], "llama-bpe")) {
			assert_int_equal(n, 128256);
			assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 128000, &s), 0);
			assert_true(str_eq(s, "<|begin_of_text|>"));
			assert_int_equal(gpud_gguf_get_arr(g, "tokenizer.ggml.merges", &vt, &n), 0);
			assert_int_equal(n, 280147);
			assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.merges", 0, &s), 0);
			assert_true(str_eq(s, "\xc4\xa0 \xc4\xa0")); /* "Ġ Ġ" */
			bool b;
			assert_int_equal(gpud_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b), 0);
			assert_true(b);
			float base;
			assert_int_equal(gpud_gguf_get_f32(g, "llama.rope.freq_base", &base), 0);
			assert_float_equal(base, 500000.0f, 0.0f);
		}
		if (strstr(gl.gl_pathv[k], "llama-spm")) {
			assert_int_equal(n, 32000);
			assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s), 0);
			assert_true(str_eq(s, "<s>"));
		}
		gpud_gguf_close(g);
	}
	globfree(&gl);
}

static void test_open_errors(void **state)
{
	(void)state;
	struct gpud_gguf *g = (struct gpud_gguf *)1;
	assert_int_equal(gpud_gguf_open(&g, "/nonexistent/x.gguf", errbuf, sizeof(errbuf)), -ENOENT);
	assert_null(g);
	assert_non_null(strstr(errbuf, "/nonexistent/x.gguf"));
	assert_int_equal(gpud_gguf_open(&g, "/tmp", errbuf, sizeof(errbuf)), -EINVAL);
	/* Empty file. */
	char path[] = "/tmp/gguf_test_XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "shorter than"));
	/* err may be NULL. */
	assert_int_equal(gpud_gguf_open(&g, path, NULL, 0), SW_EFORMAT);
	unlink(path);
	assert_int_equal(gpud_gguf_open_mem(&g, NULL, 0, NULL, errbuf, sizeof(errbuf)), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "<memory>"));
}

/* Integer getters convert any integer type whose value fits; float getters
 * take f32 and f64. */
static void test_conversions(void **state)
{
	(void)state;
	struct raw r = { 0 };
	raw_u32(&r, GPUD_GGUF_MAGIC);
	raw_u32(&r, 3);
	raw_u64(&r, 0);
	raw_u64(&r, 12);
	raw_str(&r, "u8");
	raw_u32(&r, GPUD_GGUF_U8);
	raw_u8(&r, 200);
	raw_str(&r, "i8");
	raw_u32(&r, GPUD_GGUF_I8);
	raw_u8(&r, 0xfb); /* -5 */
	raw_str(&r, "u16");
	raw_u32(&r, GPUD_GGUF_U16);
	uint16_t u16 = 60000;
	raw_put(&r, &u16, 2);
	raw_str(&r, "i16");
	raw_u32(&r, GPUD_GGUF_I16);
	int16_t i16 = -3000;
	raw_put(&r, &i16, 2);
	raw_str(&r, "u64");
	raw_u32(&r, GPUD_GGUF_U64);
	raw_u64(&r, 1ull << 40);
	raw_str(&r, "i64");
	raw_u32(&r, GPUD_GGUF_I64);
	raw_u64(&r, (uint64_t)-7);
	raw_str(&r, "i64big");
	raw_u32(&r, GPUD_GGUF_I64);
	raw_u64(&r, 1ull << 35);
	raw_str(&r, "f64");
	raw_u32(&r, GPUD_GGUF_F64);
	double d = 0.125;
	raw_put(&r, &d, 8);
	raw_str(&r, "arr_u32");
	raw_u32(&r, GPUD_GGUF_ARRAY);
	raw_u32(&r, GPUD_GGUF_U32);
	raw_u64(&r, 2);
	raw_u32(&r, 7);
	raw_u32(&r, 3000000000u);
	raw_str(&r, "arr_i16");
	raw_u32(&r, GPUD_GGUF_ARRAY);
	raw_u32(&r, GPUD_GGUF_I16);
	raw_u64(&r, 1);
	raw_put(&r, &i16, 2);
	raw_str(&r, "arr_f64");
	raw_u32(&r, GPUD_GGUF_ARRAY);
	raw_u32(&r, GPUD_GGUF_F64);
	raw_u64(&r, 1);
	raw_put(&r, &d, 8);
	raw_str(&r, "arr_bool");
	raw_u32(&r, GPUD_GGUF_ARRAY);
	raw_u32(&r, GPUD_GGUF_BOOL);
	raw_u64(&r, 2);
	raw_u8(&r, 0);
	raw_u8(&r, 1);

	struct gpud_gguf *g;
	int rc = gpud_gguf_open_mem(&g, r.p, r.len, "conv.gguf", errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	uint32_t u;
	int32_t i;
	uint64_t u64;
	float f;
	bool b;
	assert_int_equal(gpud_gguf_get_u32(g, "u8", &u), 0);
	assert_int_equal(u, 200);
	assert_int_equal(gpud_gguf_get_i32(g, "u8", &i), 0);
	assert_int_equal(i, 200);
	assert_int_equal(gpud_gguf_get_i32(g, "i8", &i), 0);
	assert_int_equal(i, -5);
	assert_int_equal(gpud_gguf_get_u32(g, "i8", &u), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_u64(g, "i8", &u64), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_u32(g, "u16", &u), 0);
	assert_int_equal(u, 60000);
	assert_int_equal(gpud_gguf_get_i32(g, "i16", &i), 0);
	assert_int_equal(i, -3000);
	assert_int_equal(gpud_gguf_get_u64(g, "u64", &u64), 0);
	assert_int_equal(u64, 1ull << 40);
	assert_int_equal(gpud_gguf_get_u32(g, "u64", &u), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_i32(g, "i64", &i), 0);
	assert_int_equal(i, -7);
	assert_int_equal(gpud_gguf_get_i32(g, "i64big", &i), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_u64(g, "i64big", &u64), 0);
	assert_int_equal(u64, 1ull << 35);
	assert_int_equal(gpud_gguf_get_f32(g, "f64", &f), 0);
	assert_float_equal(f, 0.125f, 0.0f);
	assert_int_equal(gpud_gguf_get_u32(g, "f64", &u), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_f32(g, "u8", &f), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_bool(g, "u8", &b), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_i32(g, "arr_u32", 0, &i), 0);
	assert_int_equal(i, 7);
	assert_int_equal(gpud_gguf_arr_i32(g, "arr_u32", 1, &i), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_i32(g, "arr_u32", 2, &i), -ERANGE);
	assert_int_equal(gpud_gguf_arr_i32(g, "arr_i16", 0, &i), 0);
	assert_int_equal(i, -3000);
	assert_int_equal(gpud_gguf_arr_f32(g, "arr_f64", 0, &f), 0);
	assert_float_equal(f, 0.125f, 0.0f);
	assert_int_equal(gpud_gguf_arr_f32(g, "arr_i16", 0, &f), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_i32(g, "arr_bool", 1, &i), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_i32(g, "u8", 0, &i), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_f32(g, "nope", 0, &f), SW_ENOTFOUND);
	enum gpud_gguf_vtype vt;
	const void *data;
	uint64_t n;
	assert_int_equal(gpud_gguf_arr_data(g, "arr_bool", &vt, &data, &n), 0);
	assert_int_equal(vt, GPUD_GGUF_BOOL);
	assert_int_equal(n, 2);
	assert_int_equal(((const uint8_t *)data)[1], 1);
	assert_int_equal(gpud_gguf_arr_data(g, "u8", &vt, &data, &n), SW_ETYPE);
	assert_int_equal(gpud_gguf_arr_data(g, "nope", &vt, &data, &n), SW_ENOTFOUND);
	/* No tensors and no padding: the data section is the file's end. */
	assert_int_equal(gpud_gguf_data_offset(g), r.len);
	gpud_gguf_close(g);
	free(r.p);

	/* Metadata value type names (weight types: quant_test). */
	assert_string_equal(gpud_gguf_vtype_name(GPUD_GGUF_STRING), "string");
	assert_string_equal(gpud_gguf_vtype_name((enum gpud_gguf_vtype)13), "?");
}

/* --- corruption ----------------------------------------------------------------- */

static void test_small_valid(void **state)
{
	(void)state;
	struct layout L;
	struct raw r = build_small(&L);
	struct gpud_gguf *g;
	int rc = gpud_gguf_open_mem(&g, r.p, r.len, "t.gguf", errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	assert_int_equal(gpud_gguf_n_kv(g), 4);
	struct gpud_gguf_str s;
	assert_int_equal(gpud_gguf_arr_str(g, "test.strs", 1, &s), 0);
	assert_true(str_eq(s, "yy"));
	bool b = false;
	assert_int_equal(gpud_gguf_get_bool(g, "test.flag", &b), 0);
	assert_true(b);
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "v");
	assert_non_null(t);
	assert_int_equal(t->type, GPUD_TYPE_Q8_0);
	assert_int_equal(t->nbytes, 34);
	t = gpud_gguf_find_tensor(g, "w");
	assert_int_equal(t->nbytes, 256);
	float f;
	memcpy(&f, (const uint8_t *)t->data + 4 * 63, 4);
	assert_float_equal(f, 63.0f, 0.0f);
	gpud_gguf_close(g);

	/* Counts the file could hold but past the caps. */
	uint8_t *big = calloc(1, 40u << 20);
	assert_non_null(big);
	memcpy(big, r.p, 24);
	patch_u64(big, L.n_kv, (1u << 20) + 1);
	patch_u64(big, L.n_tensors, 0);
	assert_int_equal(open_copy(big, 40u << 20, "t.gguf"), SW_ETOOLONG);
	assert_non_null(strstr(errbuf, "t.gguf: 1048577 keys / 0 tensors exceed the limits"));
	free(big);

	/* Version 2 has the same layout and is accepted. */
	patch_u32(r.p, L.version, 2);
	assert_int_equal(open_copy(r.p, r.len, "t.gguf"), 0);
	free(r.p);
}

struct corruption {
	const char *what;
	void (*apply)(uint8_t *p, const struct layout *L);
	int code;
	const char *msg; /* substring of the message */
};

#define C(name, body) \
	static void name(uint8_t *p, const struct layout *L) { (void)L; body; }
C(c_magic, patch_u32(p, 0, 0x46554746))
C(c_version1, patch_u32(p, L->version, 1))
C(c_version4, patch_u32(p, L->version, 4))
C(c_version_be, patch_u32(p, L->version, 0x03000000))
C(c_ntensors_huge, patch_u64(p, L->n_tensors, UINT64_MAX))
C(c_ntensors_more, patch_u64(p, L->n_tensors, 3))
C(c_nkv_huge, patch_u64(p, L->n_kv, 1ull << 40))
C(c_nkv_more, patch_u64(p, L->n_kv, 5))
C(c_key_len_huge, patch_u64(p, L->k_arch, UINT64_MAX))
C(c_key_len_past, patch_u64(p, L->k_arch, 100000))
C(c_key_len_zero, patch_u64(p, L->k_arch, 0))
C(c_key_nul, p[L->k_arch + 8 + 3] = 0)
C(c_vtype_unknown, patch_u32(p, L->t_align, 13))
C(c_vtype_huge, patch_u32(p, L->t_align, 0xffffffff))
C(c_str_len_huge, patch_u64(p, L->v_arch_len, UINT64_MAX - 3))
C(c_arr_elem_unknown, patch_u32(p, L->arr_elem, 99))
C(c_arr_nested, patch_u32(p, L->arr_elem, GPUD_GGUF_ARRAY))
C(c_arr_len_huge, patch_u64(p, L->arr_n, UINT64_MAX / 8 + 1))
C(c_arr_len_past, patch_u64(p, L->arr_n, 1000))
C(c_arr_elem_len, patch_u64(p, L->arr_s1, 1ull << 62))
C(c_arr_as_u64, patch_u32(p, L->arr_elem, GPUD_GGUF_U64))
C(c_bool, p[L->v_flag] = 2)
C(c_dup_key, memcpy(p + L->k_flag + 8, "test.strs", 9))
C(c_align_zero, patch_u32(p, L->v_align, 0))
C(c_align_three, patch_u32(p, L->v_align, 3))
C(c_align_type, patch_u32(p, L->t_align, GPUD_GGUF_I32))
C(c_align_1g, patch_u32(p, L->v_align, 1u << 30))
C(c_align_1, patch_u32(p, L->v_align, 1))
C(c_ndims0, patch_u32(p, L->w_ndims, 0))
C(c_ndims5, patch_u32(p, L->w_ndims, 5))
C(c_ndims_huge, patch_u32(p, L->w_ndims, 0x7fffffff))
C(c_dim0, patch_u64(p, L->w_ne1, 0))
C(c_dim_neg, patch_u64(p, L->w_ne0, 1ull << 63))
C(c_dim_overflow, patch_u64(p, L->w_ne0, 1ull << 62); patch_u64(p, L->w_ne1, 4))
/* 2^62 f32 elements: the count fits, its 2^64 bytes do not (found by fuzz_gguf:
 * the size wrapped to 0 and passed the bounds check) */
C(c_bytes_overflow, patch_u64(p, L->w_ne0, 1ull << 61); patch_u64(p, L->w_ne1, 2))
C(c_type_unknown, patch_u32(p, L->w_type, 99))
C(c_type_gap, patch_u32(p, L->w_type, 40))
C(c_type_iq2xxs, patch_u32(p, L->w_type, 16))
C(c_type_removed, patch_u32(p, L->w_type, 4))
C(c_block, patch_u64(p, L->v_ne0, 33))
C(c_off_unaligned, patch_u64(p, L->v_off, 257))
C(c_off_past, patch_u64(p, L->v_off, 288))
C(c_off_huge, patch_u64(p, L->v_off, UINT64_MAX - 31))
C(c_overlap, patch_u64(p, L->v_off, 224))
C(c_dup_tensor, p[L->v_name + 8] = 'w')
C(c_tname_empty, patch_u64(p, L->v_name, 0))
C(c_size_grow, patch_u64(p, L->w_ne1, 3))
#undef C

static const struct corruption corruptions[] = {
	{ "magic", c_magic, SW_EFORMAT, "t.gguf: bad magic 0x46554746 (not a GGUF file) at offset 0" },
	{ "version 1", c_version1, SW_EVERSION, "version 1 (GGUF v1 is obsolete)" },
	{ "version 4", c_version4, SW_EVERSION, "unsupported GGUF version 4" },
	{ "big-endian", c_version_be, SW_EVERSION, "big-endian" },
	{ "n_tensors huge", c_ntensors_huge, SW_EFORMAT, "tensor count 18446744073709551615 cannot fit" },
	{ "n_tensors +1", c_ntensors_more, SW_EFORMAT, "tensor 2" },
	{ "n_kv huge", c_nkv_huge, SW_EFORMAT, "kv count 1099511627776 cannot fit in a" },
	{ "n_kv +1", c_nkv_more, SW_EFORMAT, "runs past end of file" },
	{ "key len huge", c_key_len_huge, SW_EFORMAT, "kv 0 key length 18446744073709551615 runs past end of file" },
	{ "key len past", c_key_len_past, SW_EFORMAT, "at offset 24" },
	{ "key len 0", c_key_len_zero, SW_EFORMAT, "kv 0: key of length 0 is empty" },
	{ "key nul", c_key_nul, SW_EFORMAT, "holds a NUL at offset 24" },
	{ "vtype 13", c_vtype_unknown, SW_EFORMAT, "'general.alignment': unknown value type 13 at offset" },
	{ "vtype huge", c_vtype_huge, SW_EFORMAT, "unknown value type 4294967295" },
	{ "string len", c_str_len_huge, SW_EFORMAT, "'general.architecture': string length 18446744073709551612 runs past end of file" },
	{ "array elem type", c_arr_elem_unknown, SW_EFORMAT, "'test.strs': unknown array element type 99" },
	{ "nested array", c_arr_nested, SW_EUNSUPPORTED, "nested arrays" },
	{ "array len huge", c_arr_len_huge, SW_EFORMAT, "array of 2305843009213693952 strings runs past end of file" },
	{ "array len past", c_arr_len_past, SW_EFORMAT, "array of 1000 strings" },
	{ "array string len", c_arr_elem_len, SW_EFORMAT, "element 1 of 2: string length 4611686018427387904 runs past end of file" },
	{ "array elem retyped", c_arr_as_u64, SW_EFORMAT, NULL },
	{ "bool 2", c_bool, SW_EFORMAT, "'test.flag': bool value 2 is not 0 or 1" },
	{ "duplicate key", c_dup_key, SW_EFORMAT, "duplicate key 'test.strs' (first at offset 102) at offset 154" },
	{ "alignment 0", c_align_zero, SW_EFORMAT, "general.alignment 0 is not a power of two" },
	{ "alignment 3", c_align_three, SW_EFORMAT, "general.alignment 3 is not a power of two" },
	{ "alignment i32", c_align_type, SW_EFORMAT, "general.alignment has type i32, expected u32" },
	{ "alignment 2^30", c_align_1g, SW_EFORMAT, "general.alignment 1073741824" },
	{ "alignment 1", c_align_1, 0, NULL }, /* legal: everything is 1-aligned */
	{ "n_dims 0", c_ndims0, SW_EFORMAT, "tensor 0 'w': n_dims 0 not in 1..4" },
	{ "n_dims 5", c_ndims5, SW_EFORMAT, "tensor 0 'w': n_dims 5 not in 1..4" },
	{ "n_dims huge", c_ndims_huge, SW_EFORMAT, "n_dims 2147483647" },
	{ "dim 0", c_dim0, SW_EFORMAT, "tensor 0 'w': dimension 1 is 0" },
	{ "dim 2^63", c_dim_neg, SW_EFORMAT, "dimension 0 is 9223372036854775808" },
	{ "dims overflow", c_dim_overflow, SW_EFORMAT, "'w': element count overflows at dimension 1" },
	{ "bytes overflow", c_bytes_overflow, SW_EFORMAT, "tensor 0 'w': 4611686018427387904 elements of f32 overflow 64-bit sizes" },
	{ "type 99", c_type_unknown, SW_EFORMAT, "tensor 0 'w': unknown ggml type 99" },
	{ "type 40", c_type_gap, SW_EFORMAT, "unknown ggml type 40" },
	{ "type iq2_xxs", c_type_iq2xxs, SW_EUNSUPPORTED, "tensor 0 'w': type iq2_xxs (16) is not supported" },
	{ "type q4_2", c_type_removed, SW_EUNSUPPORTED, "q4_2 (removed)" },
	{ "block", c_block, SW_EFORMAT, "tensor 1 'v': ne[0] = 33 is not a multiple of the q8_0 block size 32" },
	{ "offset unaligned", c_off_unaligned, SW_EFORMAT, "tensor 1 'v': data offset 257 is not a multiple of the alignment 32" },
	{ "offset past", c_off_past, SW_EFORMAT, "tensor 1 'v': data [" },
	{ "offset huge", c_off_huge, SW_EFORMAT, "runs past end of file" },
	{ "overlap", c_overlap, SW_EFORMAT, "tensor 1 'v': data [224, 258) overlaps tensor 0 'w' [0, 256)" },
	{ "duplicate tensor", c_dup_tensor, SW_EFORMAT, "tensor 1 'w': duplicate name (also tensor 0)" },
	{ "tensor name empty", c_tname_empty, SW_EFORMAT, "tensor 1: name of length 0" },
	{ "tensor grows", c_size_grow, SW_EFORMAT, "tensor 0 'w': data [256, 640) runs past end of file (546 bytes)" },
};

static void test_corruptions(void **state)
{
	(void)state;
	struct layout L;
	struct raw r = build_small(&L);
	for (size_t i = 0; i < sizeof(corruptions) / sizeof(corruptions[0]); i++) {
		const struct corruption *c = &corruptions[i];
		uint8_t *p = malloc(r.len);
		assert_non_null(p);
		memcpy(p, r.p, r.len);
		c->apply(p, &L);
		int rc = open_copy(p, r.len, "t.gguf");
		if (rc != c->code)
			fail_msg("%s: got %s (%s), want %s", c->what, sw_errname(rc), errbuf,
				 sw_errname(c->code));
		if (c->code) {
			if (!strstr(errbuf, "t.gguf: ") || !strstr(errbuf, " at offset "))
				fail_msg("%s: message lacks file or offset: %s", c->what, errbuf);
			if (c->msg && !strstr(errbuf, c->msg))
				fail_msg("%s: message '%s' lacks '%s'", c->what, errbuf, c->msg);
		}
		free(p);
	}
	free(r.p);
}

/* Every prefix of the small file shorter than the whole fails cleanly; so does
 * every single-byte change of the header either open or fail cleanly. */
static void test_small_truncate_and_flip(void **state)
{
	(void)state;
	struct layout L;
	struct raw r = build_small(&L);
	for (size_t len = 0; len < r.len; len++) {
		int rc = open_copy(r.p, len, "t.gguf");
		if (rc == 0)
			fail_msg("prefix of %zu bytes opened", len);
		assert_non_null(strstr(errbuf, "t.gguf: "));
	}
	assert_int_equal(open_copy(r.p, r.len, "t.gguf"), 0);
	size_t opened = 0;
	for (size_t i = 0; i < L.data; i++) {
		static const uint8_t vals[] = { 0x00, 0x01, 0x02, 0x7f, 0x80, 0xff };
		for (size_t k = 0; k < sizeof(vals); k++) {
			uint8_t old = r.p[i];
			r.p[i] = vals[k];
			opened += open_copy(r.p, r.len, "t.gguf") == 0;
			r.p[i] = old;
		}
		for (int bit = 0; bit < 8; bit++) {
			r.p[i] ^= (uint8_t)(1u << bit);
			opened += open_copy(r.p, r.len, "t.gguf") == 0;
			r.p[i] ^= (uint8_t)(1u << bit);
		}
	}
	/* Some changes are harmless (string contents, padding, flag 1 -> 0). */
	assert_true(opened > 0);
	free(r.p);
}

/* stories260K in memory: every prefix up to (and past) the data section
 * fails with a message, never a crash; so do field overwrites. */
static void test_stories_truncate(void **state)
{
	(void)state;
	size_t size;
	uint8_t *buf = read_file(STORIES, &size);
	assert_int_equal(size, 1185376);
	for (size_t len = 0; len <= 14176; len++) {
		int rc = open_copy(buf, len, "stories.gguf");
		if (rc != SW_EFORMAT)
			fail_msg("prefix %zu: %s (%s)", len, sw_errname(rc), errbuf);
		if (!strstr(errbuf, "stories.gguf: ") || !strstr(errbuf, "at offset"))
			fail_msg("prefix %zu: %s", len, errbuf);
	}
	/* Past the header: the last tensor's data is cut. */
	assert_int_equal(open_copy(buf, size - 1, "stories.gguf"), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "tensor 47 'blk.4.ffn_norm.weight': data [1185120, 1185376) runs past end of file (1185375 bytes)"));
	assert_int_equal(open_copy(buf, size, "stories.gguf"), 0);
	free(buf);
}

static void test_stories_fields(void **state)
{
	(void)state;
	size_t size;
	uint8_t *buf = read_file(STORIES, &size);
	/* First key "tokenizer.ggml.tokens" at 24: its string array's length
	 * is at 24 + 8 + 21 + 4 + 4. */
	size_t arr_n = 24 + 8 + 21 + 4 + 4;
	uint64_t old;
	memcpy(&old, buf + arr_n, 8);
	assert_int_equal(old, 512);
	patch_u64(buf, arr_n, 513);
	assert_int_equal(open_copy(buf, size, "stories.gguf"), SW_EFORMAT);
	patch_u64(buf, arr_n, 1ull << 61);
	assert_int_equal(open_copy(buf, size, "stories.gguf"), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "'tokenizer.ggml.tokens': array of 2305843009213693952 strings"));
	patch_u64(buf, arr_n, 512);
	/* First string "<unk>" length at arr_n + 8. */
	patch_u64(buf, arr_n + 8, 1u << 30);
	assert_int_equal(open_copy(buf, size, "stories.gguf"), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "element 0 of 512"));
	patch_u64(buf, arr_n + 8, 5);
	assert_int_equal(open_copy(buf, size, "stories.gguf"), 0);
	/* The last tensor info's offset is the last 8 header bytes. */
	patch_u64(buf, 14152 - 8, 1170944 - 32);
	assert_int_equal(open_copy(buf, size, "stories.gguf"), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "overlaps tensor 46 'blk.4.ffn_up.weight'"));
	patch_u64(buf, 14152 - 8, 1170944 + 32);
	assert_int_equal(open_copy(buf, size, "stories.gguf"), SW_EFORMAT);
	assert_non_null(strstr(errbuf, "runs past end of file"));
	free(buf);
}

/* --- writer ----------------------------------------------------------------- */

static char tmpdir[64];

static void tmp_path(char *buf, size_t n, const char *name)
{
	if (!tmpdir[0]) {
		strcpy(tmpdir, "/tmp/gguf_test_XXXXXX");
		assert_non_null(mkdtemp(tmpdir));
	}
	snprintf(buf, n, "%s/%s", tmpdir, name);
}

/* Deterministic rows: value depends on (tensor tag, row, col). */
static int fill_rows(void *arg, uint64_t row, float *out, uint64_t cols)
{
	int tag = *(int *)arg;
	for (uint64_t c = 0; c < cols; c++)
		out[c] = sinf((float)(tag * 1000 + row * 37 + c) * 0.01f) * 0.5f;
	return 0;
}

static int fill_fail_at;
static int fill_failing(void *arg, uint64_t row, float *out, uint64_t cols)
{
	if ((int)row == fill_fail_at)
		return -EIO;
	return fill_rows(arg, row, out, cols);
}

/* Bytes of the file at path (malloc'd), its size in *n. */
static uint8_t *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b;
	long sz;

	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	sz = ftell(f);
	assert_true(sz > 0);
	rewind(f);
	b = malloc((size_t)sz);
	assert_non_null(b);
	assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
	fclose(f);
	*n = (size_t)sz;
	return b;
}

/* Fill tensors made by several threads (gpud_gguf_w_set_threads): the
 * bytes of one thread's file, for tensors of several 8 MiB batches, of
 * fewer rows than threads and of one row; a failing row is named as with
 * one thread. */
static void test_writer_threads(void **state)
{
	static const int counts[] = { 1, 3, 16, 0 };
	int tags[4] = { 1, 2, 3, 4 };
	/* F32 rows of 32 KiB: 256 a batch */
	const uint64_t ne_f32[2] = { 8192, 600 }, ne_q8[2] = { 1024, 40 };
	const uint64_t ne_k[2] = { 256, 7 }, ne_one[2] = { 64, 1 };
	uint8_t *want = NULL;
	size_t nwant = 0;
	char path[128];

	(void)state;
	tmp_path(path, sizeof(path), "threads.gguf");
	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		struct gpud_gguf_writer *w;
		uint8_t *got;
		size_t n;

		assert_int_equal(gpud_gguf_writer_new(&w), 0);
		gpud_gguf_w_set_threads(w, counts[i]);
		assert_int_equal(gpud_gguf_w_u32(w, "k", 7), 0);
		assert_int_equal(gpud_gguf_w_tensor_fill(w, "f32", GPUD_TYPE_F32, 2, ne_f32,
							 fill_rows, &tags[0]), 0);
		assert_int_equal(gpud_gguf_w_tensor_fill(w, "q8", GPUD_TYPE_Q8_0, 2, ne_q8,
							 fill_rows, &tags[1]), 0);
		assert_int_equal(gpud_gguf_w_tensor_fill(w, "q4k", GPUD_TYPE_Q4_K, 2, ne_k,
							 fill_rows, &tags[2]), 0);
		assert_int_equal(gpud_gguf_w_tensor_fill(w, "one", GPUD_TYPE_Q4_0, 2, ne_one,
							 fill_rows, &tags[3]), 0);
		assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), 0);
		got = slurp(path, &n);
		if (!want) {
			want = got;
			nwant = n;
			assert_true(n > 2 * (8u << 20)); /* three batches of F32 */
		} else {
			assert_int_equal(n, nwant);
			assert_memory_equal(got, want, n);
			free(got);
		}
		if (counts[i] == 3) { /* a failing row, in the second batch */
			struct gpud_gguf_writer *wf;

			assert_int_equal(gpud_gguf_writer_new(&wf), 0);
			gpud_gguf_w_set_threads(wf, 3);
			assert_int_equal(gpud_gguf_w_tensor_fill(wf, "f", GPUD_TYPE_F32, 2, ne_f32,
								 fill_failing, &tags[1]), 0);
			fill_fail_at = 300;
			assert_int_equal(gpud_gguf_w_write(wf, path, errbuf, sizeof(errbuf)), -EIO);
			assert_non_null(strstr(errbuf, "fill callback failed for 'f' row 300"));
			fill_fail_at = -1;
			gpud_gguf_writer_free(wf);
		}
		gpud_gguf_writer_free(w);
	}
	free(want);
}

static void test_writer_round_trip(void **state)
{
	(void)state;
	char path[128];
	tmp_path(path, sizeof(path), "rt.gguf");
	struct gpud_gguf_writer *w;
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "general.architecture", "llama"), 0);
	assert_int_equal(gpud_gguf_w_u32(w, "a.u32", 4000000000u), 0);
	assert_int_equal(gpud_gguf_w_i32(w, "a.i32", -7), 0);
	assert_int_equal(gpud_gguf_w_u64(w, "a.u64", 1ull << 40), 0);
	assert_int_equal(gpud_gguf_w_f32(w, "a.f32", 0.25f), 0);
	assert_int_equal(gpud_gguf_w_bool(w, "a.bool", true), 0);
	assert_int_equal(gpud_gguf_w_str(w, "a.empty", ""), 0);
	int32_t ints[5] = { -1, 0, 1, INT32_MAX, INT32_MIN };
	assert_int_equal(gpud_gguf_w_arr(w, "a.ints", GPUD_GGUF_I32, ints, 5), 0);
	float fl[3] = { 1.5f, -2.0f, 1e-3f };
	assert_int_equal(gpud_gguf_w_arr(w, "a.floats", GPUD_GGUF_F32, fl, 3), 0);
	assert_int_equal(gpud_gguf_w_arr(w, "a.none", GPUD_GGUF_U8, NULL, 0), 0);
	struct gpud_gguf_str strs[3] = { { "abc", 3 }, { "", 0 }, { "x\0y", 3 } };
	assert_int_equal(gpud_gguf_w_arr_str(w, "a.strs", strs, 3), 0);

	/* Tensors: copied F32, streamed in every type. */
	float d[64 * 3];
	for (int i = 0; i < 64 * 3; i++)
		d[i] = (float)i - 10.0f;
	uint64_t ne2[2] = { 64, 3 };
	assert_int_equal(gpud_gguf_w_tensor(w, "copied", GPUD_TYPE_F32, 2, ne2, d, sizeof(d)), 0);
	static int tags[5] = { 1, 2, 3, 4, 5 };
	static const enum gpud_type types[5] = {
		GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,
	};
	uint64_t ne3[3] = { 96, 5, 2 };
	for (int k = 0; k < 5; k++) {
		char name[32];
		snprintf(name, sizeof(name), "fill.%s", gpud_type_name(types[k]));
		assert_int_equal(gpud_gguf_w_tensor_fill(w, name, types[k], 3, ne3, fill_rows, &tags[k]), 0);
	}
	uint64_t ne1[1] = { 7 };
	assert_int_equal(gpud_gguf_w_tensor(w, "odd", GPUD_TYPE_F32, 1, ne1, d, 28), 0);
	uint64_t size;
	assert_int_equal(gpud_gguf_w_size(w, &size), 0);
	int rc = gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	gpud_gguf_writer_free(w);
	gpud_gguf_writer_free(NULL);

	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal((uint64_t)st.st_size, size);
	assert_int_equal(st.st_mode & 0777, 0644);

	struct gpud_gguf *g;
	rc = gpud_gguf_open(&g, path, errbuf, sizeof(errbuf));
	if (rc)
		fail_msg("%s", errbuf);
	assert_int_equal(gpud_gguf_version(g), 3);
	assert_int_equal(gpud_gguf_n_kv(g), 11);
	assert_int_equal(gpud_gguf_n_tensors(g), 7);
	assert_string_equal(gpud_gguf_key(g, 0), "general.architecture");
	assert_string_equal(gpud_gguf_key(g, 10), "a.strs");
	uint32_t u;
	assert_int_equal(gpud_gguf_get_u32(g, "a.u32", &u), 0);
	assert_int_equal(u, 4000000000u);
	int32_t i;
	assert_int_equal(gpud_gguf_get_i32(g, "a.u32", &i), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_i32(g, "a.i32", &i), 0);
	assert_int_equal(i, -7);
	assert_int_equal(gpud_gguf_get_u32(g, "a.i32", &u), SW_ETYPE);
	uint64_t u64;
	assert_int_equal(gpud_gguf_get_u64(g, "a.i32", &u64), SW_ETYPE);
	assert_int_equal(gpud_gguf_get_u64(g, "a.u64", &u64), 0);
	assert_int_equal(u64, 1ull << 40);
	assert_int_equal(gpud_gguf_get_u32(g, "a.u64", &u), SW_ETYPE);
	float f;
	assert_int_equal(gpud_gguf_get_f32(g, "a.f32", &f), 0);
	assert_float_equal(f, 0.25f, 0.0f);
	bool b = false;
	assert_int_equal(gpud_gguf_get_bool(g, "a.bool", &b), 0);
	assert_true(b);
	struct gpud_gguf_str s;
	assert_int_equal(gpud_gguf_get_str(g, "a.empty", &s), 0);
	assert_int_equal(s.len, 0);
	for (int k = 0; k < 5; k++) {
		assert_int_equal(gpud_gguf_arr_i32(g, "a.ints", k, &i), 0);
		assert_int_equal(i, ints[k]);
	}
	assert_int_equal(gpud_gguf_arr_i32(g, "a.ints", 5, &i), -ERANGE);
	assert_int_equal(gpud_gguf_arr_f32(g, "a.floats", 2, &f), 0);
	assert_float_equal(f, 1e-3f, 0.0f);
	enum gpud_gguf_vtype vt;
	uint64_t n;
	assert_int_equal(gpud_gguf_get_arr(g, "a.none", &vt, &n), 0);
	assert_int_equal(vt, GPUD_GGUF_U8);
	assert_int_equal(n, 0);
	assert_int_equal(gpud_gguf_arr_str(g, "a.strs", 1, &s), 0);
	assert_int_equal(s.len, 0);
	assert_int_equal(gpud_gguf_arr_str(g, "a.strs", 2, &s), 0);
	assert_int_equal(s.len, 3);
	assert_memory_equal(s.s, "x\0y", 3);

	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "copied");
	assert_non_null(t);
	assert_memory_equal(t->data, d, sizeof(d));
	float row[96], back[96];
	for (int k = 0; k < 5; k++) {
		char name[32];
		snprintf(name, sizeof(name), "fill.%s", gpud_type_name(types[k]));
		t = gpud_gguf_find_tensor(g, name);
		assert_non_null(t);
		assert_int_equal(t->type, types[k]);
		assert_int_equal(t->n_dims, 3);
		assert_int_equal(t->ne[0], 96);
		assert_int_equal(t->ne[1], 5);
		assert_int_equal(t->ne[2], 2);
		assert_int_equal(t->ne[3], 1);
		assert_int_equal(t->offset % 32, 0);
		assert_int_equal((uintptr_t)t->data % 32, 0);
		size_t rb = gpud_type_row_bytes(types[k], 96);
		assert_int_equal(t->nbytes, rb * 10);
		/* Tolerance: exact for f32, fp16 ~1e-3, bf16 ~4e-3, q8 ~ d/2,
		 * q4 ~ d/2 with d = max/8. */
		static const float tol[5] = { 0.0f, 1e-3f, 4e-3f, 5e-3f, 0.04f };
		for (uint64_t r = 0; r < 10; r++) {
			fill_rows(&tags[k], r, row, 96);
			gpud_dequantize_row(types[k], (const uint8_t *)t->data + r * rb, back, 96);
			for (int c = 0; c < 96; c++)
				if (fabsf(back[c] - row[c]) > tol[k])
					fail_msg("%s row %d col %d: %f vs %f", name, (int)r, c,
						 back[c], row[c]);
		}
	}
	t = gpud_gguf_find_tensor(g, "odd");
	assert_memory_equal(t->data, d, 28);
	assert_ptr_equal(gpud_gguf_tensor(g, 6), t);
	gpud_gguf_close(g);

	/* The writer's file survives the reader's truncation test too, and
	 * every byte of its header overwritten with a few values either opens
	 * or fails with a message. */
	size_t fsize;
	uint8_t *buf = read_file(path, &fsize);
	for (size_t len = 0; len < fsize; len++)
		if (open_copy(buf, len, "rt.gguf") != SW_EFORMAT)
			fail_msg("prefix %zu: %s", len, errbuf);
	struct gpud_gguf *h;
	assert_int_equal(gpud_gguf_open_mem(&h, buf, fsize, "rt.gguf", errbuf, sizeof(errbuf)), 0);
	size_t data_off = (size_t)gpud_gguf_data_offset(h);
	gpud_gguf_close(h);
	size_t failed = 0;
	for (size_t at = 0; at < data_off; at++) {
		static const uint8_t vals[] = { 0x00, 0x01, 0x09, 0x80, 0xff };
		uint8_t old = buf[at];
		for (size_t k = 0; k < sizeof(vals); k++) {
			if (vals[k] == old)
				continue;
			buf[at] = vals[k];
			int frc = open_copy(buf, fsize, "rt.gguf");
			if (frc && !strstr(errbuf, "rt.gguf: "))
				fail_msg("byte %zu = %u: %s", at, vals[k], errbuf);
			failed += frc != 0;
		}
		buf[at] = old;
	}
	assert_true(failed > data_off); /* most header bytes matter */
	free(buf);
	unlink(path);
}

static void test_writer_errors(void **state)
{
	(void)state;
	struct gpud_gguf_writer *w;
	uint64_t ne[4] = { 32, 2, 1, 1 };
	float d[64] = { 0 };
	static int tag = 1;
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_u32(w, "k", 1), 0);
	assert_int_equal(gpud_gguf_w_u32(w, "k", 2), -EEXIST);
	assert_int_equal(gpud_gguf_w_str(w, "k", "x"), -EEXIST);
	assert_int_equal(gpud_gguf_w_u32(w, "", 2), -EINVAL);
	assert_int_equal(gpud_gguf_w_u32(w, NULL, 2), -EINVAL);
	assert_int_equal(gpud_gguf_w_str(w, "s", NULL), -EINVAL);
	assert_int_equal(gpud_gguf_w_arr(w, "arr", GPUD_GGUF_STRING, d, 1), -EINVAL);
	assert_int_equal(gpud_gguf_w_arr(w, "arr", GPUD_GGUF_ARRAY, d, 1), -EINVAL);
	assert_int_equal(gpud_gguf_w_arr(w, "arr", GPUD_GGUF_U32, NULL, 1), -EINVAL);
	uint8_t bad_bool = 2;
	assert_int_equal(gpud_gguf_w_arr(w, "arr", GPUD_GGUF_BOOL, &bad_bool, 1), -EINVAL);
	assert_int_equal(gpud_gguf_w_arr_str(w, "arr", NULL, 1), -EINVAL);
	assert_int_equal(gpud_gguf_w_u32(w, "general.alignment", 48), -EINVAL);
	assert_int_equal(gpud_gguf_w_u32(w, "general.alignment", 0), -EINVAL);
	assert_int_equal(gpud_gguf_w_i32(w, "general.alignment", 64), SW_ETYPE);

	assert_int_equal(gpud_gguf_w_tensor(w, "t", GPUD_TYPE_F32, 2, ne, d, sizeof(d)), 0);
	assert_int_equal(gpud_gguf_w_tensor(w, "t", GPUD_TYPE_F32, 2, ne, d, sizeof(d)), -EEXIST);
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "t", GPUD_TYPE_F32, 2, ne, fill_rows, &tag), -EEXIST);
	assert_int_equal(gpud_gguf_w_tensor(w, "u", GPUD_TYPE_F32, 2, ne, d, sizeof(d) - 4), -EINVAL);
	assert_int_equal(gpud_gguf_w_tensor(w, "u", GPUD_TYPE_F32, 2, ne, NULL, sizeof(d)), -EINVAL);
	assert_int_equal(gpud_gguf_w_tensor(w, "u", GPUD_TYPE_F32, 0, ne, d, sizeof(d)), -EINVAL);
	assert_int_equal(gpud_gguf_w_tensor(w, "u", GPUD_TYPE_F32, 5, ne, d, sizeof(d)), -EINVAL);
	assert_int_equal(gpud_gguf_w_tensor(w, "", GPUD_TYPE_F32, 2, ne, d, sizeof(d)), -EINVAL);
	assert_int_equal(gpud_gguf_w_tensor(w, "u", (enum gpud_type)16, 2, ne, d, sizeof(d)), SW_EUNSUPPORTED);
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "u", GPUD_TYPE_Q8_0, 2, ne, NULL, NULL), -EINVAL);
	uint64_t ne_bad[2] = { 48, 2 };
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "u", GPUD_TYPE_Q4_0, 2, ne_bad, fill_rows, &tag), -EINVAL);
	uint64_t ne_zero[2] = { 32, 0 };
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "u", GPUD_TYPE_F32, 2, ne_zero, fill_rows, &tag), -EINVAL);
	uint64_t ne_ovf[4] = { 1ull << 32, 1ull << 32, 1, 1 };
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "u", GPUD_TYPE_F32, 2, ne_ovf, fill_rows, &tag), -EINVAL);

	/* A failing fill aborts the write; the existing file stays intact and
	 * no temp file is left behind. */
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "f", GPUD_TYPE_Q8_0, 2, ne, fill_failing, &tag), 0);
	char path[128];
	tmp_path(path, sizeof(path), "err.gguf");
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("old", f);
	fclose(f);
	fill_fail_at = 1;
	assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), -EIO);
	assert_non_null(strstr(errbuf, "fill callback failed for 'f' row 1"));
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 3);
	glob_t gl;
	char pat[160];
	snprintf(pat, sizeof(pat), "%s.tmp.*", path);
	assert_int_equal(glob(pat, 0, NULL, &gl), GLOB_NOMATCH);
	/* The same writer can then write successfully. */
	fill_fail_at = -1;
	assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), 0);
	struct gpud_gguf *g;
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_n_tensors(g), 2);
	gpud_gguf_close(g);
	unlink(path);

	assert_true(gpud_gguf_w_write(w, "/nonexistent-dir/x.gguf", errbuf, sizeof(errbuf)) < 0);
	assert_non_null(strstr(errbuf, "/nonexistent-dir/x.gguf"));
	gpud_gguf_writer_free(w);
}

/* A write that fails part way (file size limit: EFBIG) is reported, leaves
 * no temp file and does not create the target. */
static void test_writer_write_failure(void **state)
{
	(void)state;
	char path[128];
	tmp_path(path, sizeof(path), "big.gguf");
	struct gpud_gguf_writer *w;
	static int tag = 3;
	uint64_t ne[2] = { 256, 64 };
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "t", GPUD_TYPE_F32, 2, ne, fill_rows, &tag), 0);
	struct rlimit old, lim;
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 4096;
	void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	int rc = gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf));
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, oldsig);
	assert_int_equal(rc, -EFBIG);
	assert_non_null(strstr(errbuf, path));
	assert_int_equal(access(path, F_OK), -1);
	glob_t gl;
	char pat[160];
	snprintf(pat, sizeof(pat), "%s.tmp.*", path);
	assert_int_equal(glob(pat, 0, NULL, &gl), GLOB_NOMATCH);
	/* Without the limit the same writer succeeds. */
	assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), 0);
	gpud_gguf_writer_free(w);
	unlink(path);
}

static void test_writer_alignment_and_empty(void **state)
{
	(void)state;
	char path[128];
	tmp_path(path, sizeof(path), "al.gguf");
	struct gpud_gguf_writer *w;
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_u32(w, "general.alignment", 256), 0);
	uint64_t ne[1] = { 32 };
	static int tag = 9;
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "a", GPUD_TYPE_Q4_0, 1, ne, fill_rows, &tag), 0);
	assert_int_equal(gpud_gguf_w_tensor_fill(w, "b", GPUD_TYPE_F16, 1, ne, fill_rows, &tag), 0);
	assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), 0);
	gpud_gguf_writer_free(w);
	struct gpud_gguf *g;
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_alignment(g), 256);
	assert_int_equal(gpud_gguf_data_offset(g) % 256, 0);
	assert_int_equal(gpud_gguf_find_tensor(g, "b")->offset, 256);
	gpud_gguf_close(g);

	/* No tensors: the file ends at the header, as vocab-only files do. */
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "k", "v"), 0);
	uint64_t size;
	assert_int_equal(gpud_gguf_w_size(w, &size), 0);
	assert_int_equal(size, 24 + 8 + 1 + 4 + 8 + 1);
	assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), 0);
	gpud_gguf_writer_free(w);
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_n_tensors(g), 0);
	gpud_gguf_close(g);
	unlink(path);
}

static bool skip_non_tokenizer(const char *key, void *arg)
{
	(*(int *)arg)++;
	return strncmp(key, "tokenizer.", 10) != 0;
}

static void test_writer_copy_kv(void **state)
{
	(void)state;
	char path[128];
	tmp_path(path, sizeof(path), "copy.gguf");
	struct gpud_gguf *src;
	assert_int_equal(gpud_gguf_open(&src, SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-bpe.gguf",
					errbuf, sizeof(errbuf)), 0);
	struct gpud_gguf_writer *w;
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "general.architecture", "llama"), 0);
	int calls = 0;
	assert_int_equal(gpud_gguf_w_copy_kv(w, src, skip_non_tokenizer, &calls), 0);
	assert_int_equal(calls, 22);
	/* Copying again collides. */
	assert_int_equal(gpud_gguf_w_copy_kv(w, src, skip_non_tokenizer, &calls), -EEXIST);
	assert_int_equal(gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)), 0);
	gpud_gguf_writer_free(w);

	struct gpud_gguf *g;
	assert_int_equal(gpud_gguf_open(&g, path, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(gpud_gguf_n_kv(g), 1 + 9);
	assert_false(gpud_gguf_has(g, "llama.block_count"));
	enum gpud_gguf_vtype vt;
	uint64_t n, n2;
	assert_int_equal(gpud_gguf_get_arr(g, "tokenizer.ggml.merges", &vt, &n), 0);
	assert_int_equal(gpud_gguf_get_arr(src, "tokenizer.ggml.merges", &vt, &n2), 0);
	assert_int_equal(n, n2);
	for (uint64_t i = 0; i < n; i += 997) {
		struct gpud_gguf_str a, b;
		assert_int_equal(gpud_gguf_arr_str(g, "tokenizer.ggml.merges", i, &a), 0);
		assert_int_equal(gpud_gguf_arr_str(src, "tokenizer.ggml.merges", i, &b), 0);
		assert_int_equal(a.len, b.len);
		assert_memory_equal(a.s, b.s, a.len);
	}
	struct gpud_gguf_str a, b;
	assert_int_equal(gpud_gguf_get_str(g, "tokenizer.chat_template", &a), 0);
	assert_int_equal(gpud_gguf_get_str(src, "tokenizer.chat_template", &b), 0);
	assert_int_equal(a.len, b.len);
	assert_memory_equal(a.s, b.s, a.len);
	uint32_t bos;
	assert_int_equal(gpud_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos), 0);
	assert_int_equal(bos, 128000);
	gpud_gguf_close(g);

	/* Without skip everything is copied: the copy of a vocab-only file has
	 * the same size as the original. */
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_copy_kv(w, src, NULL, NULL), 0);
	uint64_t size;
	assert_int_equal(gpud_gguf_w_size(w, &size), 0);
	assert_int_equal(size, 7818572);
	gpud_gguf_writer_free(w);
	gpud_gguf_close(src);
	unlink(path);
	rmdir(tmpdir);
}

/* K-quant tensors: good data passes the data check; a non-finite d or
 * dmin in any super-block, a width off the 256 block, data past the end
 * of the file or at an odd address are clear errors. */
static void test_kquant_checks(void **state)
{
	static const enum gpud_type kt[] = { GPUD_TYPE_Q2_K, GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K,
					     GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K };
	/* byte offsets of d and dmin (-1: none) in each block */
	static const int doff[5][2] = { { 80, 82 }, { 108, -1 }, { 0, 2 }, { 0, 2 }, { 208, -1 } };
	char path[128];
	float x[256 * 3];
	_Alignas(4) uint8_t q[3 * 210];
	uint64_t ne[2] = { 256, 3 };
	struct gpud_gguf_writer *w;
	struct gpud_gguf *g;
	size_t fsize;
	uint8_t *buf, *odd;

	(void)state;
	for (int i = 0; i < 256 * 3; i++)
		x[i] = (float)((i * 37) % 101 - 50) / 100.0f;
	tmp_path(path, sizeof(path), "kq.gguf");
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "general.architecture", "llama"), 0);
	for (int k = 0; k < 5; k++) {
		gpud_quantize_row(kt[k], x, q, 256 * 3);
		assert_int_equal(gpud_gguf_w_tensor(w, gpud_type_name(kt[k]), kt[k], 2, ne, q,
						    gpud_type_row_bytes(kt[k], 256) * 3),
				 0);
	}
	if (gpud_gguf_w_write(w, path, errbuf, sizeof(errbuf)))
		fail_msg("%s", errbuf);
	gpud_gguf_writer_free(w);
	buf = read_file(path, &fsize);
	unlink(path);

	assert_int_equal(gpud_gguf_open_mem(&g, buf, fsize, "kq.gguf", errbuf, sizeof(errbuf)), 0);
	for (int k = 0; k < 5; k++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, gpud_type_name(kt[k]));

		assert_non_null(t);
		assert_int_equal(t->type, kt[k]);
		assert_int_equal(t->nbytes, 3 * gpud_type_block_bytes(kt[k]));
		assert_int_equal(gpud_gguf_tensor_check_data(g, t, "kq.gguf", errbuf, sizeof(errbuf)), 0);
	}
	/* F32 data is not read */
	gpud_gguf_close(g);

	/* NaN / Inf factors, block 2 (row 2) of each tensor */
	for (int k = 0; k < 5; k++)
		for (int f = 0; f < 2 && doff[k][f] >= 0; f++)
			for (int v = 0; v < 2; v++) {
				static const uint16_t bad[2] = { 0x7e00, 0xfc00 };
				const struct gpud_gguf_tensor *t;
				size_t at;
				uint16_t keep;
				char want[96];

				assert_int_equal(gpud_gguf_open_mem(&g, buf, fsize, "kq.gguf", errbuf,
								    sizeof(errbuf)), 0);
				t = gpud_gguf_find_tensor(g, gpud_type_name(kt[k]));
				at = (size_t)((const uint8_t *)t->data - buf) +
				     2 * gpud_type_block_bytes(kt[k]) + (size_t)doff[k][f];
				gpud_gguf_close(g);
				memcpy(&keep, buf + at, 2);
				memcpy(buf + at, &bad[v], 2);
				assert_int_equal(gpud_gguf_open_mem(&g, buf, fsize, "kq.gguf", errbuf,
								    sizeof(errbuf)), 0);
				t = gpud_gguf_find_tensor(g, gpud_type_name(kt[k]));
				assert_int_equal(gpud_gguf_tensor_check_data(g, t, "kq.gguf", errbuf,
									     sizeof(errbuf)),
						 SW_EFORMAT);
				snprintf(want, sizeof(want), "kq.gguf: tensor '%s': %s block 2 (row 2) has a non-finite %s 0x%04x",
					 gpud_type_name(kt[k]), gpud_type_name(kt[k]), f ? "dmin" : "d",
					 (unsigned)bad[v]);
				if (!strstr(errbuf, want))
					fail_msg("got \"%s\", want \"%s\"", errbuf, want);
				gpud_gguf_close(g);
				memcpy(buf + at, &keep, 2);
			}

	/* cut short: the last tensor's data runs past the end */
	assert_int_equal(gpud_gguf_open_mem(&g, buf, fsize - 1, "kq.gguf", errbuf, sizeof(errbuf)),
			 SW_EFORMAT);
	assert_non_null(strstr(errbuf, "runs past end of file"));

	/* at an odd address */
	odd = malloc(fsize + 1);
	assert_non_null(odd);
	memcpy(odd + 1, buf, fsize);
	assert_int_equal(gpud_gguf_open_mem(&g, odd + 1, fsize, "kq.gguf", errbuf, sizeof(errbuf)),
			 SW_EFORMAT);
	assert_non_null(strstr(errbuf, "tensor 0 'q2_k': q2_k data at file offset"));
	assert_non_null(strstr(errbuf, "is misaligned (its blocks need an address multiple of 2)"));
	free(odd);

	/* a width off the block: ne[0] 256 -> 255 of the first tensor */
	for (size_t i = 0; i + 8 + 4 + 4 + 8 <= fsize; i++) {
		static const uint8_t name[] = { 4, 0, 0, 0, 0, 0, 0, 0, 'q', '2', '_', 'k', 2, 0, 0, 0 };

		if (memcmp(buf + i, name, sizeof(name)) == 0) {
			buf[i + sizeof(name)] = 255;
			buf[i + sizeof(name) + 1] = 0;
			break;
		}
	}
	assert_int_equal(gpud_gguf_open_mem(&g, buf, fsize, "kq.gguf", errbuf, sizeof(errbuf)),
			 SW_EFORMAT);
	assert_non_null(strstr(errbuf, "tensor 0 'q2_k': ne[0] = 255 is not a multiple of the q2_k block size 256"));
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kquant_checks),
		cmocka_unit_test(test_stories260k),
		cmocka_unit_test(test_tokenizer_files),
		cmocka_unit_test(test_open_errors),
		cmocka_unit_test(test_conversions),
		cmocka_unit_test(test_small_valid),
		cmocka_unit_test(test_corruptions),
		cmocka_unit_test(test_small_truncate_and_flip),
		cmocka_unit_test(test_stories_truncate),
		cmocka_unit_test(test_stories_fields),
		cmocka_unit_test(test_writer_round_trip),
		cmocka_unit_test(test_writer_threads),
		cmocka_unit_test(test_writer_errors),
		cmocka_unit_test(test_writer_write_failure),
		cmocka_unit_test(test_writer_alignment_and_empty),
		cmocka_unit_test(test_writer_copy_kv),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
