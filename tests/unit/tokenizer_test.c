/* tokenizer_test.c - SentencePiece and byte-level BPE tokenizers against the
 * shared llama.cpp vectors, special tokens, streaming detokenizer, chat
 * templates and the error paths of loading. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/tokenizer.h"

#define VOCAB_DIR "../shared/tokenizer/"
#define SEP "\n__ggml_vocab_test__\n"

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		if (buf) {
			buf[n] = '\0';
			*len = (size_t)n;
		}
	}
	fclose(f);
	return buf;
}

static struct gpud_tokenizer *load_path(const char *path)
{
	struct gpud_gguf *g = NULL;
	struct gpud_tokenizer *t = NULL;
	char err[256] = "";

	if (gpud_gguf_open(&g, path, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	if (gpud_tokenizer_load(&t, g, err, sizeof(err)) != 0)
		fail_msg("%s: %s", path, err);
	gpud_gguf_close(g); /* the tokenizer must not keep pointers into it */
	return t;
}

static struct sw_arena arena;

static int setup_arena(void **state)
{
	(void)state;
	return sw_arena_init(&arena, 8u << 20);
}

static int teardown_arena(void **state)
{
	(void)state;
	sw_arena_destroy(&arena);
	return 0;
}

/* Encodes text; returns the id count (ids holds up to cap). */
static size_t enc(const struct gpud_tokenizer *t, const char *text, size_t len, unsigned flags,
		  int32_t *ids, size_t cap)
{
	size_t n = 0;
	size_t used = arena.used;
	int rc = gpud_tokenizer_encode(t, text, len, flags, ids, cap, &n, &arena);
	assert_int_equal(rc, 0);
	assert_int_equal(arena.used, used); /* scratch released */
	return n;
}

/* Detokenizes ids with the streaming API into out; returns the length. */
static size_t detok_all(const struct gpud_tokenizer *t, const int32_t *ids, size_t n, char *out,
			size_t cap)
{
	struct gpud_detok d;
	size_t len = 0;

	gpud_detok_init(&d);
	for (size_t i = 0; i < n; i++) {
		int k = gpud_detok_push(t, &d, ids[i], out + len, cap - len);
		assert_true(k >= 0);
		len += (size_t)k;
	}
	int k = gpud_detok_flush(&d, out + len, cap - len);
	assert_true(k >= 0);
	return len + (size_t)k;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
	fprintf(stderr, "    %s:", what);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, " %d", ids[i]);
	fprintf(stderr, "\n");
}

/* Runs every case of one vocabulary; returns the number of mismatches
 * (each printed) and checks that decoding gives the text back. */
static int run_vectors(const char *name)
{
	char path[256], pinp[256], pout[256];
	size_t linp = 0, lout = 0;
	int bad = 0, cases = 0;

	snprintf(path, sizeof(path), VOCAB_DIR "%s", name);
	snprintf(pinp, sizeof(pinp), VOCAB_DIR "%s.inp", name);
	snprintf(pout, sizeof(pout), VOCAB_DIR "%s.out", name);
	char *inp = read_file(pinp, &linp), *out = read_file(pout, &lout);
	assert_non_null(inp);
	assert_non_null(out);
	struct gpud_tokenizer *t = load_path(path);

	int32_t *ids = malloc(4096 * sizeof(*ids)), *want = malloc(4096 * sizeof(*want));
	char *back = malloc(65536);
	assert_non_null(ids);
	assert_non_null(want);
	assert_non_null(back);

	/* .inp: cases each followed by SEP; .out: one line of ids per case. */
	char *ip = inp, *op = out;
	for (;;) {
		char *end = strstr(ip, SEP);
		if (!end)
			break;
		size_t tl = (size_t)(end - ip);
		char *nl = strchr(op, '\n');
		assert_non_null(nl);
		size_t nw = 0;
		for (char *q = op; q < nl;) {
			char *e;
			long v = strtol(q, &e, 10);
			if (e == q)
				break;
			want[nw++] = (int32_t)v;
			q = e;
		}
		size_t n = enc(t, ip, tl, 0, ids, 4096);
		if (n != nw || memcmp(ids, want, n * sizeof(*ids)) != 0) {
			fprintf(stderr, "  %s case %d mismatch: \"%.*s\"\n", name, cases, (int)tl, ip);
			print_ids("want", want, nw);
			print_ids("got ", ids, n);
			bad++;
		}
		size_t bl = detok_all(t, ids, n, back, 65536);
		if (bl != tl || memcmp(back, ip, tl) != 0) {
			fprintf(stderr, "  %s case %d: detok gives \"%.*s\"\n", name, cases, (int)bl,
				back);
			bad++;
		}
		cases++;
		ip = end + strlen(SEP);
		op = nl + 1;
	}
	assert_int_equal(cases, 46);
	assert_int_equal(*ip, '\0'); /* the last case ends the file */
	fprintf(stderr, "  %s: %d cases, %d mismatches\n", name, cases, bad);
	free(back);
	free(ids);
	free(want);
	free(inp);
	free(out);
	gpud_tokenizer_free(t);
	return bad;
}

static void test_vectors_llama_spm(void **state)
{
	(void)state;
	assert_int_equal(run_vectors("ggml-vocab-llama-spm.gguf"), 0);
}

static void test_vectors_phi3(void **state)
{
	(void)state;
	assert_int_equal(run_vectors("ggml-vocab-phi-3.gguf"), 0);
}

static void test_vectors_gpt2(void **state)
{
	(void)state;
	assert_int_equal(run_vectors("ggml-vocab-gpt-2.gguf"), 0);
}

static void test_vectors_starcoder(void **state)
{
	(void)state;
	assert_int_equal(run_vectors("ggml-vocab-starcoder.gguf"), 0);
}

static void test_vectors_llama_bpe(void **state)
{
	(void)state;
	assert_int_equal(run_vectors("ggml-vocab-llama-bpe.gguf"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors_llama_spm),
		cmocka_unit_test(test_vectors_phi3),
		cmocka_unit_test(test_vectors_gpt2),
		cmocka_unit_test(test_vectors_starcoder),
		cmocka_unit_test(test_vectors_llama_bpe),
	};
	return cmocka_run_group_tests(tests, setup_arena, teardown_arena);
}
