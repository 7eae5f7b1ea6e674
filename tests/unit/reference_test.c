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

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/backend/cpu/kernels.h"
#include "tests/ref/ref_llama.h"

#define STORIES "../shared/models/stories260K.gguf"

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
	char err[256] = "";
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
	assert_int_equal(ref_dequant_row(3, q4, 32, out), -EINVAL);
}

/* The dense reference mask follows the definition on a hand example. */
static void test_reference_mask_dense(void **state)
{
	(void)state;
	/* s0 = 2 tokens, s1 = 2 tokens sees nothing but itself, G sees s1 only */
	uint16_t r2[] = { 1 };
	struct gpud_mask_row rows[3] = { { NULL, 0 }, { NULL, 0 }, { r2, 1 } };
	struct gpud_mask_desc d = { .n_segments = 2, .rows = rows };
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference_dequant),
		cmocka_unit_test(test_reference_mask_dense),
		cmocka_unit_test(test_reference_stories_greedy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
