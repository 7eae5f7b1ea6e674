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
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define VOCAB_DIR SW_SHARED_DIR "/tokenizer/"
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
	char err[SW_ERR_MAX] = "";

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

/* Runs every case of one vocabulary (n_cases of them); returns the number
 * of mismatches (each printed) and checks that decoding gives the text back. */
static int run_vectors_file(const char *file, const char *name, const char *out_name,
			    int n_cases, bool verbose)
{
	char path[256], pinp[256], pout[256];
	size_t linp = 0, lout = 0;
	int bad = 0, cases = 0;

	if (file)
		snprintf(path, sizeof(path), "%s", file);
	else
		snprintf(path, sizeof(path), VOCAB_DIR "%s", name);
	snprintf(pinp, sizeof(pinp), VOCAB_DIR "%s.inp", name);
	snprintf(pout, sizeof(pout), VOCAB_DIR "%s.out", out_name);
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
			bad++;
			if (!verbose)
				goto next;
			fprintf(stderr, "  %s case %d mismatch: \"%.*s\"\n", name, cases, (int)tl,
				ip);
			print_ids("want", want, nw);
			print_ids("got ", ids, n);
		}
		size_t bl = detok_all(t, ids, n, back, 65536);
		if (bl != tl || memcmp(back, ip, tl) != 0) {
			fprintf(stderr, "  %s case %d: detok gives \"%.*s\"\n", name, cases,
				(int)bl, back);
			bad++;
		}
next:
		cases++;
		ip = end + strlen(SEP);
		op = nl + 1;
	}
	assert_int_equal(cases, n_cases);
	assert_int_equal(*ip, '\0'); /* the last case ends the file */
	if (verbose)
		fprintf(stderr, "  %s: %d cases, %d mismatches\n", name, cases, bad);
	free(back);
	free(ids);
	free(want);
	free(inp);
	free(out);
	gpud_tokenizer_free(t);
	return bad;
}

static int run_vectors_out(const char *name, const char *out_name, int n_cases, bool verbose)
{
	return run_vectors_file(NULL, name, out_name, n_cases, verbose);
}

static int run_vectors(const char *name)
{
	return run_vectors_out(name, name, 46, true);
}

static bool skip_pre(const char *key, void *arg)
{
	(void)arg;
	return strcmp(key, "tokenizer.ggml.pre") == 0;
}

/* tokenizer.ggml.pre "smollm" (SmolLM/SmolLM2 files) splits as
 * "starcoder": the StarCoder vocabulary relabelled gives its vectors'
 * ids. */
static void test_vectors_smollm_alias(void **state)
{
	struct gpud_gguf_writer *w = NULL;
	struct gpud_gguf *g = NULL;
	char path[64], err[SW_ERR_MAX];

	(void)state;
	assert_int_equal(gpud_gguf_open(&g, VOCAB_DIR "ggml-vocab-starcoder.gguf", err,
					sizeof(err)), 0);
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_copy_kv(w, g, skip_pre, NULL), 0);
	assert_int_equal(gpud_gguf_w_str(w, "tokenizer.ggml.pre", "smollm"), 0);
	snprintf(path, sizeof(path), "/tmp/tokenizer_test.smollm.%d.gguf", (int)getpid());
	assert_int_equal(gpud_gguf_w_write(w, path, err, sizeof(err)), 0);
	gpud_gguf_writer_free(w);
	gpud_gguf_close(g);
	assert_int_equal(run_vectors_file(path, "ggml-vocab-starcoder.gguf",
					  "ggml-vocab-starcoder.gguf", 46, true), 0);
	unlink(path);
}

/* The harness itself must see a difference: GPT-2 ids are not StarCoder's. */
static void test_vectors_harness_detects_mismatch(void **state)
{
	(void)state;
	int bad = run_vectors_out("ggml-vocab-gpt-2.gguf", "ggml-vocab-starcoder.gguf", 46, false);
	assert_true(bad > 20);
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

/* Qwen2/2.5: the 46 cases plus CJK, Arabic, long numbers (one digit per
 * pre-token), code with tabs, ChatML text and a user-defined <tool_call>
 * token, which plain text matches too. */
static void test_vectors_qwen2(void **state)
{
	(void)state;
	assert_int_equal(run_vectors_out("ggml-vocab-qwen2.gguf", "ggml-vocab-qwen2.gguf", 56,
					  true),
			 0);
}


/* --- the real model ----------------------------------------------------- */

static void test_stories260k(void **state)
{
	(void)state;
	struct gpud_tokenizer *t = load_path(SW_SHARED_DIR "/models/stories260K.gguf");
	const int32_t want[] = { 1, 403, 407, 261, 378 };
	int32_t ids[16];
	char back[64];

	assert_int_equal(gpud_tokenizer_n_vocab(t), 512);
	assert_int_equal(gpud_tokenizer_bos(t), 1);
	assert_int_equal(gpud_tokenizer_eos(t), 2);
	assert_true(gpud_tokenizer_add_bos(t)); /* no key: llama default */
	assert_true(gpud_tokenizer_is_eog(t, 2));
	assert_false(gpud_tokenizer_is_eog(t, 1));
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_NONE);
	size_t n = enc(t, "Once upon a time", 16, GPUD_TOK_ADD_BOS, ids, 16);
	assert_int_equal(n, 5);
	assert_memory_equal(ids, want, sizeof(want));
	n = enc(t, "Once upon a time", 16, 0, ids, 16);
	assert_int_equal(n, 4);
	assert_memory_equal(ids, want + 1, 4 * sizeof(int32_t));
	size_t bl = detok_all(t, want, 5, back, sizeof(back));
	assert_int_equal(bl, 16);
	assert_memory_equal(back, "Once upon a time", 16);
	gpud_tokenizer_free(t);
}

/* --- special tokens, EOG, pieces ----------------------------------------- */

static bool contains(const int32_t *ids, size_t n, int32_t id)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

static void test_special_llama_bpe(void **state)
{
	(void)state;
	struct gpud_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-llama-bpe.gguf");
	const char *txt = "<|begin_of_text|>Hello<|eot_id|>";
	int32_t ids[64];
	char buf[64];

	assert_int_equal(gpud_tokenizer_n_vocab(t), 128256);
	assert_int_equal(gpud_tokenizer_bos(t), 128000);
	assert_int_equal(gpud_tokenizer_eos(t), 128001);
	assert_true(gpud_tokenizer_add_bos(t));
	assert_int_equal(gpud_tokenizer_find(t, "<|eot_id|>", 10), 128009);
	assert_int_equal(gpud_tokenizer_find(t, "Hello", 5), 9906);
	assert_int_equal(gpud_tokenizer_find(t, "no such token!", 14), -1);

	size_t n = enc(t, txt, strlen(txt), GPUD_TOK_PARSE_SPECIAL, ids, 64);
	assert_int_equal(n, 3);
	assert_int_equal(ids[0], 128000);
	assert_int_equal(ids[1], 9906);
	assert_int_equal(ids[2], 128009);
	/* ADD_BOS adds one more BOS even when the text has one (as asked). */
	n = enc(t, txt, strlen(txt), GPUD_TOK_PARSE_SPECIAL | GPUD_TOK_ADD_BOS, ids, 64);
	assert_int_equal(n, 4);
	assert_int_equal(ids[0], 128000);
	/* Without PARSE_SPECIAL the markers are plain text: no injection. */
	n = enc(t, txt, strlen(txt), 0, ids, 64);
	assert_true(n > 6);
	assert_false(contains(ids, n, 128000));
	assert_false(contains(ids, n, 128009));
	size_t bl = detok_all(t, ids, n, buf, sizeof(buf));
	assert_int_equal(bl, strlen(txt));
	assert_memory_equal(buf, txt, bl);
	/* Adjacent specials and specials at both ends. */
	n = enc(t, "<|eot_id|><|eot_id|>", 20, GPUD_TOK_PARSE_SPECIAL, ids, 64);
	assert_int_equal(n, 2);
	assert_int_equal(ids[0], 128009);
	assert_int_equal(ids[1], 128009);
	/* A truncated marker is text. */
	n = enc(t, "<|eot_id|", 9, GPUD_TOK_PARSE_SPECIAL, ids, 64);
	assert_false(contains(ids, n, 128009));

	/* EOG: EOS and <|eot_id|>; this vocab has no <|eom_id|>. */
	assert_true(gpud_tokenizer_is_eog(t, 128001));
	assert_true(gpud_tokenizer_is_eog(t, 128009));
	assert_false(gpud_tokenizer_is_eog(t, 128000));
	assert_false(gpud_tokenizer_is_eog(t, 128008));
	assert_false(gpud_tokenizer_is_eog(t, 9906));
	assert_false(gpud_tokenizer_is_eog(t, -1));
	assert_false(gpud_tokenizer_is_eog(t, 128256));

	/* Pieces: control tokens only with special; BPE bytes unmapped. */
	assert_int_equal(gpud_tokenizer_piece(t, 128009, false, buf, sizeof(buf)), 0);
	assert_int_equal(gpud_tokenizer_piece(t, 128009, true, buf, sizeof(buf)), 10);
	assert_memory_equal(buf, "<|eot_id|>", 10);
	assert_int_equal(gpud_tokenizer_piece(t, 271, false, buf, sizeof(buf)), 2); /* "ĊĊ" */
	assert_memory_equal(buf, "\n\n", 2);
	assert_int_equal(gpud_tokenizer_piece(t, 128009, true, buf, 3), SW_ETOOLONG);
	assert_int_equal(gpud_tokenizer_piece(t, 128256, false, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(gpud_tokenizer_piece(t, -5, false, buf, sizeof(buf)), -EINVAL);
	gpud_tokenizer_free(t);
}

static void test_spm_invalid_lead(void **state)
{
	/* A stray lead byte takes no byte that is not a continuation byte:
	 * the "▁" a space becomes right after it stays one token and decodes
	 * as a space (it used to be split into byte tokens and come back as
	 * the raw "▁"; found by tests/fuzz/fuzz_tokenizer.c). */
	(void)state;
	struct gpud_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf");
	static const char text[] = "a\xc3 b\xe2\x82 c\xf0 d";
	int32_t ids[64];
	char buf[64], piece[64];
	size_t n, len = 0;

	n = enc(t, text, sizeof(text) - 1, 0, ids, 64);
	for (size_t i = 0; i < n; i++) {
		int k = gpud_tokenizer_piece(t, ids[i], false, piece, sizeof(piece));
		assert_true(k >= 0 && len + (size_t)k <= sizeof(buf));
		memcpy(buf + len, piece, (size_t)k);
		len += (size_t)k;
	}
	assert_int_equal(len, sizeof(text)); /* the prefix space, then the text */
	assert_memory_equal(buf, " a\xc3 b\xe2\x82 c\xf0 d", len);
	gpud_tokenizer_free(t);
}

static void test_special_spm(void **state)
{
	(void)state;
	struct gpud_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf");
	int32_t ids[64];
	char buf[64];

	/* Each run of text after a special token starts with the space prefix. */
	size_t n = enc(t, "Hello<s>world", 13, GPUD_TOK_PARSE_SPECIAL, ids, 64);
	assert_int_equal(n, 3);
	assert_int_equal(ids[0], 15043);
	assert_int_equal(ids[1], 1);
	assert_int_equal(ids[2], 3186);
	n = enc(t, "Hello world", 11, GPUD_TOK_ADD_BOS, ids, 64);
	assert_int_equal(n, 3);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 15043);
	assert_int_equal(ids[2], 3186);
	/* Without PARSE_SPECIAL, "<s>" and "</s>" never become control ids. */
	n = enc(t, "<s></s><unk><0x0A>", 18, 0, ids, 64);
	assert_false(contains(ids, n, 0));
	assert_false(contains(ids, n, 1));
	assert_false(contains(ids, n, 2));
	assert_false(contains(ids, n, 13));
	assert_true(gpud_tokenizer_is_eog(t, 2));
	assert_false(gpud_tokenizer_is_eog(t, 1));
	assert_false(gpud_tokenizer_is_eog(t, 0));

	assert_int_equal(gpud_tokenizer_piece(t, 15043, false, buf, sizeof(buf)), 6);
	assert_memory_equal(buf, " Hello", 6);
	assert_int_equal(gpud_tokenizer_piece(t, 13, false, buf, sizeof(buf)), 1); /* <0x0A> */
	assert_int_equal(buf[0], '\n');
	assert_int_equal(gpud_tokenizer_piece(t, 1, false, buf, sizeof(buf)), 0);
	assert_int_equal(gpud_tokenizer_piece(t, 1, true, buf, sizeof(buf)), 3);
	assert_memory_equal(buf, "<s>", 3);
	assert_int_equal(gpud_tokenizer_piece(t, 0, false, buf, sizeof(buf)), 0);  /* <unk> */
	assert_int_equal(gpud_tokenizer_piece(t, 32000, false, buf, sizeof(buf)), -EINVAL);
	gpud_tokenizer_free(t);
}

/* --- streaming detokenizer ------------------------------------------------- */

static void test_detok_stream(void **state)
{
	(void)state;
	struct gpud_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf");
	struct gpud_detok d;
	char out[32];

	/* Leading space of the first piece dropped, later ones kept. */
	gpud_detok_init(&d);
	assert_int_equal(gpud_detok_push(t, &d, 1, out, sizeof(out)), 0); /* BOS: "" */
	assert_int_equal(gpud_detok_push(t, &d, 15043, out, sizeof(out)), 5);
	assert_memory_equal(out, "Hello", 5);
	assert_int_equal(gpud_detok_push(t, &d, 15043, out, sizeof(out)), 6);
	assert_memory_equal(out, " Hello", 6);

	/* A continuation keeps the first piece's space. */
	struct gpud_detok dc;
	gpud_detok_init_continuation(&dc);
	assert_int_equal(gpud_detok_push(t, &dc, 15043, out, sizeof(out)), 6);
	assert_memory_equal(out, " Hello", 6);

	/* 🦙 = F0 9F A6 99 arrives as four byte tokens (<0xXX> = 3 + byte):
	 * nothing is emitted until the character is complete. */
	const uint8_t llama[4] = { 0xF0, 0x9F, 0xA6, 0x99 };
	for (int i = 0; i < 3; i++)
		assert_int_equal(gpud_detok_push(t, &d, 3 + llama[i], out, sizeof(out)), 0);
	assert_int_equal(d.n_pending, 3);
	/* Too little room: refused and nothing changes. */
	assert_int_equal(gpud_detok_push(t, &d, 3 + llama[3], out, 3), SW_ETOOLONG);
	assert_int_equal(d.n_pending, 3);
	assert_int_equal(gpud_detok_push(t, &d, 3 + llama[3], out, sizeof(out)), 4);
	assert_memory_equal(out, llama, 4);
	assert_int_equal(d.n_pending, 0);

	/* An invalid byte becomes U+FFFD; a broken sequence is one U+FFFD
	 * and the byte that broke it is kept. */
	assert_int_equal(gpud_detok_push(t, &d, 3 + 0xFF, out, sizeof(out)), 3);
	assert_memory_equal(out, "\xEF\xBF\xBD", 3);
	assert_int_equal(gpud_detok_push(t, &d, 3 + 0xE2, out, sizeof(out)), 0);
	assert_int_equal(gpud_detok_push(t, &d, 3 + 'A', out, sizeof(out)), 4);
	assert_memory_equal(out, "\xEF\xBF\xBD" "A", 4);
	/* Held bytes at the end come out as U+FFFD on flush. */
	assert_int_equal(gpud_detok_push(t, &d, 3 + 0xE2, out, sizeof(out)), 0);
	assert_int_equal(gpud_detok_push(t, &d, 3 + 0x96, out, sizeof(out)), 0);
	assert_int_equal(gpud_detok_flush(&d, out, 2), SW_ETOOLONG);
	assert_int_equal(gpud_detok_flush(&d, out, sizeof(out)), 3);
	assert_memory_equal(out, "\xEF\xBF\xBD", 3);
	assert_int_equal(gpud_detok_flush(&d, out, sizeof(out)), 0);
	assert_int_equal(gpud_detok_push(t, &d, -1, out, sizeof(out)), -EINVAL);
	assert_int_equal(gpud_detok_push(t, &d, 32000, out, sizeof(out)), -EINVAL);
	gpud_tokenizer_free(t);

	/* Byte-level BPE keeps the leading space: it is part of the text. */
	t = load_path(VOCAB_DIR "ggml-vocab-gpt-2.gguf");
	int32_t ids[8];
	size_t n = enc(t, " Hello", 6, 0, ids, 8);
	assert_int_equal(n, 1);
	gpud_detok_init(&d);
	assert_int_equal(gpud_detok_push(t, &d, ids[0], out, sizeof(out)), 6);
	assert_memory_equal(out, " Hello", 6);
	/* 🦙 is split over byte-level tokens; streaming still never splits it. */
	n = enc(t, "\xF0\x9F\xA6\x99", 4, 0, ids, 8);
	assert_true(n >= 2);
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		int k = gpud_detok_push(t, &d, ids[i], out + total, sizeof(out) - total);
		assert_true(k == 0 || (k == 4 && i == n - 1));
		total += (size_t)k;
	}
	assert_int_equal(total, 4);
	assert_memory_equal(out, "\xF0\x9F\xA6\x99", 4);
	gpud_tokenizer_free(t);
}

/* --- limits: output capacity and scratch ---------------------------------- */

static void test_limits(void **state)
{
	(void)state;
	const char *names[] = { "ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf" };

	for (int v = 0; v < 2; v++) {
		char path[128];
		snprintf(path, sizeof(path), VOCAB_DIR "%s", names[v]);
		struct gpud_tokenizer *t = load_path(path);
		int32_t ids[4] = { -7, -7, -7, -7 };
		size_t n = 99;

		/* Too small an output: the first cap ids and the full count. */
		int rc = gpud_tokenizer_encode(t, "Hello world", 11, 0, ids, 1, &n, &arena);
		assert_int_equal(rc, SW_ETOOLONG);
		assert_int_equal(n, 2);
		assert_int_equal(ids[0], v == 0 ? 15043 : 9906);
		assert_int_equal(ids[1], -7);
		rc = gpud_tokenizer_encode(t, "Hello world", 11, 0, NULL, 0, &n, &arena);
		assert_int_equal(rc, SW_ETOOLONG);
		assert_int_equal(n, 2);
		rc = gpud_tokenizer_encode(t, "", 0, 0, ids, 4, &n, &arena);
		assert_int_equal(rc, 0);
		assert_int_equal(n, 0);

		/* Too small an arena: -ENOMEM, nothing kept. */
		char small[64];
		struct sw_arena a;
		sw_arena_init_static(&a, small, sizeof(small));
		rc = gpud_tokenizer_encode(t, "Hello world", 11, 0, ids, 4, &n, &a);
		assert_int_equal(rc, -ENOMEM);
		assert_int_equal(n, 0);
		assert_int_equal(a.used, 0);

		/* An arena of exactly scratch_bytes(len) is enough, for text
		 * that is one long word, one long run of spaces, or mixed. */
		size_t len = 20000;
		char *text = malloc(len);
		int32_t *out = malloc(len * sizeof(*out));
		assert_non_null(text);
		assert_non_null(out);
		for (int kind = 0; kind < 3; kind++) {
			for (size_t i = 0; i < len; i++)
				text[i] = kind == 0 ? 'a' + (char)(i % 7) : kind == 1 ? ' '
					: "ab \n1\xC3\xA4,"[i % 8];
			size_t need = gpud_tokenizer_scratch_bytes(t, len);
			struct sw_arena b;
			assert_int_equal(sw_arena_init(&b, need), 0);
			rc = gpud_tokenizer_encode(t, text, len, 0, out, len, &n, &b);
			assert_int_equal(rc, 0);
			assert_true(n > 0 && n <= len);
			assert_int_equal(b.used, 0);
			assert_true(b.high <= need);
			sw_arena_destroy(&b);
		}
		free(text);
		free(out);
		gpud_tokenizer_free(t);
	}
}

/* --- synthetic vocabularies ------------------------------------------------- */

struct vspec {
	const char *model;           /* NULL: no tokenizer.ggml.model key */
	const char *pre;             /* NULL: no key */
	const char *const *tokens;   /* NULL: no tokens key */
	size_t n;
	const float *scores;
	size_t n_scores;
	const int32_t *types;
	size_t n_types;
	const char *const *merges;   /* NULL: no merges key */
	size_t n_merges;
	const char *chat_template;
	int add_bos;                 /* -1: no key */
	int add_space_prefix;        /* -1: no key */
	int32_t bos, eos, eot;       /* -1: no key */
};

static char tmp_path[64];

/* Writes spec as a GGUF file and loads a tokenizer from it; returns the
 * load's code (*out set on success) with its message in err. */
static int build(const struct vspec *v, struct gpud_tokenizer **out, char *err, size_t errlen)
{
	struct gpud_gguf_writer *w = NULL;
	struct gpud_gguf *g = NULL;
	struct gpud_gguf_str strs[600];
	int rc;

	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "general.architecture", "llama"), 0);
	if (v->model)
		assert_int_equal(gpud_gguf_w_str(w, "tokenizer.ggml.model", v->model), 0);
	if (v->pre)
		assert_int_equal(gpud_gguf_w_str(w, "tokenizer.ggml.pre", v->pre), 0);
	if (v->tokens) {
		assert_true(v->n <= 600);
		for (size_t i = 0; i < v->n; i++)
			strs[i] = (struct gpud_gguf_str){ v->tokens[i], strlen(v->tokens[i]) };
		assert_int_equal(gpud_gguf_w_arr_str(w, "tokenizer.ggml.tokens", strs, v->n), 0);
	}
	if (v->scores)
		assert_int_equal(gpud_gguf_w_arr(w, "tokenizer.ggml.scores", GPUD_GGUF_F32,
						 v->scores, v->n_scores), 0);
	if (v->types)
		assert_int_equal(gpud_gguf_w_arr(w, "tokenizer.ggml.token_type", GPUD_GGUF_I32,
						 v->types, v->n_types), 0);
	if (v->merges) {
		for (size_t i = 0; i < v->n_merges; i++)
			strs[i] = (struct gpud_gguf_str){ v->merges[i], strlen(v->merges[i]) };
		assert_int_equal(gpud_gguf_w_arr_str(w, "tokenizer.ggml.merges", strs,
						     v->n_merges), 0);
	}
	if (v->chat_template)
		assert_int_equal(gpud_gguf_w_str(w, "tokenizer.chat_template", v->chat_template),
				 0);
	if (v->add_bos >= 0)
		assert_int_equal(gpud_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos),
				 0);
	if (v->add_space_prefix >= 0)
		assert_int_equal(gpud_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix",
						  v->add_space_prefix), 0);
	if (v->bos >= 0)
		assert_int_equal(gpud_gguf_w_u32(w, "tokenizer.ggml.bos_token_id",
						 (uint32_t)v->bos), 0);
	if (v->eos >= 0)
		assert_int_equal(gpud_gguf_w_u32(w, "tokenizer.ggml.eos_token_id",
						 (uint32_t)v->eos), 0);
	if (v->eot >= 0)
		assert_int_equal(gpud_gguf_w_u32(w, "tokenizer.ggml.eot_token_id",
						 (uint32_t)v->eot), 0);
	snprintf(tmp_path, sizeof(tmp_path), "/tmp/tokenizer_test.%d.gguf", (int)getpid());
	assert_int_equal(gpud_gguf_w_write(w, tmp_path, err, errlen), 0);
	gpud_gguf_writer_free(w);
	assert_int_equal(gpud_gguf_open(&g, tmp_path, err, errlen), 0);
	unlink(tmp_path);
	err[0] = '\0';
	*out = NULL;
	rc = gpud_tokenizer_load(out, g, err, errlen);
	gpud_gguf_close(g);
	if (rc)
		assert_null(*out);
	return rc;
}

#define VSPEC_DEFAULTS .add_bos = -1, .add_space_prefix = -1, .bos = -1, .eos = -1, .eot = -1

/* GPT-2 byte map: the 256 single-character tokens, in byte order. */
static char byte_chars[256][4];
static void fill_byte_chars(const char **toks)
{
	int extra = 0;
	for (int b = 0; b < 256; b++) {
		unsigned cp = (unsigned)b;
		if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE))
			cp = 0x100 + (unsigned)extra++;
		if (cp < 0x80) {
			byte_chars[b][0] = (char)cp;
			byte_chars[b][1] = 0;
		} else {
			byte_chars[b][0] = (char)(0xC0 | (cp >> 6));
			byte_chars[b][1] = (char)(0x80 | (cp & 0x3F));
			byte_chars[b][2] = 0;
		}
		toks[b] = byte_chars[b];
	}
}

static void test_synthetic_bpe(void **state)
{
	(void)state;
	const char *toks[270];
	fill_byte_chars(toks);
	size_t n = 256;
	toks[n++] = "bc";          /* 256 */
	toks[n++] = "ab";          /* 257 */
	toks[n++] = "aa";          /* 258 */
	toks[n++] = "xyz";         /* 259: its left part "xy" is no token */
	toks[n++] = "<|eot_id|>";  /* 260 */
	toks[n++] = "<a>";         /* 261 */
	toks[n++] = "<a>b";        /* 262 */
	int32_t types[270];
	for (size_t i = 0; i < n; i++)
		types[i] = i >= 260 ? 3 : 1;
	const char *merges[] = { "b c", "a b", "a a", "x y", "xy z" };
	struct vspec v = { VSPEC_DEFAULTS, .model = "gpt2", .tokens = toks, .n = n,
			   .types = types, .n_types = n, .merges = merges, .n_merges = 5 };
	struct gpud_tokenizer *t;
	char err[SW_ERR_MAX];
	int32_t ids[16];

	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_false(gpud_tokenizer_add_bos(t)); /* gpt2 default */
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_NONE);
	/* Lower rank first: b+c (rank 0) beats a+b (rank 1). */
	size_t k = enc(t, "abc", 3, 0, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 'a');
	assert_int_equal(ids[1], 256);
	/* Equal ranks: leftmost first. */
	k = enc(t, "aaa", 3, 0, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 258);
	assert_int_equal(ids[1], 'a');
	/* Merges through an intermediate that is not a token. */
	k = enc(t, "xyz", 3, 0, ids, 16);
	assert_int_equal(k, 1);
	assert_int_equal(ids[0], 259);
	/* ...which, left alone, falls back to its bytes. */
	k = enc(t, "xy", 2, 0, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 'x');
	assert_int_equal(ids[1], 'y');
	/* Longest special token wins; <|eot_id|> is EOG by name. */
	k = enc(t, "<a>bc<a>", 8, GPUD_TOK_PARSE_SPECIAL, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[0], 262);
	assert_int_equal(ids[1], 'c');
	assert_int_equal(ids[2], 261);
	assert_true(gpud_tokenizer_is_eog(t, 260));
	assert_false(gpud_tokenizer_is_eog(t, 261));
	/* Invalid UTF-8 is kept byte for byte. */
	k = enc(t, "a\xFF\xC3", 3, 0, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[1], 0xFF); /* token i is byte i here */
	assert_int_equal(ids[2], 0xC3);
	char back[8];
	assert_int_equal(detok_all(t, ids, k, back, sizeof(back)), 1 + 3 + 3);
	assert_memory_equal(back, "a\xEF\xBF\xBD\xEF\xBF\xBD", 7);
	gpud_tokenizer_free(t);

	/* "default" (llama.cpp's default expressions; a missing key too);
	 * add_bos_token is honoured; eot_token_id joins the EOG set; unknown
	 * names fail clearly. */
	v.pre = "default";
	v.add_bos = 1;
	v.bos = 257;
	v.eot = 261;
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_true(gpud_tokenizer_add_bos(t));
	assert_true(gpud_tokenizer_is_eog(t, 261));
	k = enc(t, "bc", 2, GPUD_TOK_ADD_BOS, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 257);
	gpud_tokenizer_free(t);
	v.pre = "deepseek-llm";
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EUNSUPPORTED);
	assert_non_null(strstr(err, "deepseek-llm"));
	assert_non_null(strstr(err, "tekken")); /* the names it knows */
	v.pre = NULL;

	/* Broken merges. */
	const char *bad1[] = { "a b", "ab" };
	v.merges = bad1;
	v.n_merges = 2;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	assert_non_null(strstr(err, "merges[1]"));
	const char *bad2[] = { "a " };
	v.merges = bad2;
	v.n_merges = 1;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	v.merges = NULL;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	assert_non_null(strstr(err, "merges"));
}

/* Qwen2: digits one per pre-token (Llama 3 takes up to three); its
 * user-defined tokens are matched in plain text, but not one that ends
 * generation, and control tokens only with PARSE_SPECIAL. */
static void test_synthetic_qwen2(void **state)
{
	(void)state;
	const char *toks[262];
	fill_byte_chars(toks);
	size_t n = 256;
	toks[n++] = "12";          /* 256 */
	toks[n++] = "<t>";         /* 257: user-defined */
	toks[n++] = "</s>";        /* 258: user-defined, EOG by name */
	toks[n++] = "<|c|>";       /* 259: control */
	int32_t types[262];
	for (size_t i = 0; i < n; i++)
		types[i] = 1;
	types[257] = types[258] = 4;
	types[259] = 3;
	const char *merges[] = { "1 2" };
	struct vspec v = { VSPEC_DEFAULTS, .model = "gpt2", .pre = "qwen2", .tokens = toks,
			   .n = n, .types = types, .n_types = n, .merges = merges,
			   .n_merges = 1 };
	struct gpud_tokenizer *t;
	char err[SW_ERR_MAX];
	int32_t ids[16];

	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_false(gpud_tokenizer_add_bos(t));
	size_t k = enc(t, "a12", 3, 0, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[1], '1');
	assert_int_equal(ids[2], '2');
	k = enc(t, "x<t>y", 5, 0, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[1], 257);
	k = enc(t, "</s>", 4, 0, ids, 16);
	assert_false(contains(ids, k, 258));
	k = enc(t, "<|c|>", 5, 0, ids, 16);
	assert_false(contains(ids, k, 259));
	k = enc(t, "<|c|></s>", 9, GPUD_TOK_PARSE_SPECIAL, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 259);
	assert_int_equal(ids[1], 258);
	gpud_tokenizer_free(t);

	v.pre = "deepseek-r1-qwen"; /* the same expression */
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	k = enc(t, "12", 2, 0, ids, 16);
	assert_int_equal(k, 2);
	gpud_tokenizer_free(t);
	v.pre = "llama-bpe";
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	k = enc(t, "12<t>", 5, 0, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 256);
	assert_int_equal(ids[1], 257);
	gpud_tokenizer_free(t);
}

/* Pre-tokenizers end to end (their splits alone: tok_pre_ref.py):
 * Tekken splits words at case changes and whole-token pre-tokens skip the
 * merges; llama.cpp's default (and a file without the key) cuts digit runs
 * into threes where GPT-2 keeps them whole. */
static void test_synthetic_pre(void **state)
{
	(void)state;
	const char *toks[264];
	fill_byte_chars(toks);
	size_t n = 256;
	toks[n++] = "Hello";       /* 256 */
	toks[n++] = "World";       /* 257 */
	toks[n++] = "12";          /* 258 */
	toks[n++] = "34";          /* 259 */
	toks[n++] = "1234";        /* 260 */
	toks[n++] = "<s>";         /* 261 */
	int32_t types[264];
	for (size_t i = 0; i < n; i++)
		types[i] = i == 261 ? 3 : 1;
	const char *merges[] = { "1 2", "3 4", "12 34" };
	struct vspec v = { VSPEC_DEFAULTS, .model = "gpt2", .pre = "tekken", .tokens = toks,
			   .n = n, .types = types, .n_types = n, .merges = merges,
			   .n_merges = 3 };
	struct gpud_tokenizer *t;
	char err[SW_ERR_MAX];
	int32_t ids[16];

	v.bos = 261;
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_true(gpud_tokenizer_add_bos(t)); /* Tekken's default */
	size_t k = enc(t, "HelloWorld", 10, GPUD_TOK_ADD_BOS, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[0], 261);
	assert_int_equal(ids[1], 256); /* no merge builds "Hello": */
	assert_int_equal(ids[2], 257); /* whole-token pre-tokens */
	k = enc(t, "12", 2, 0, ids, 16); /* digits one by one */
	assert_int_equal(k, 2);
	gpud_tokenizer_free(t);

	v.pre = "gpt-2";
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_false(gpud_tokenizer_add_bos(t));
	k = enc(t, "HelloWorld", 10, 0, ids, 16);
	assert_int_equal(k, 10); /* one pre-token, no merges: bytes */
	k = enc(t, "x1234", 5, 0, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[1], 260);
	gpud_tokenizer_free(t);

	for (int missing = 0; missing < 2; missing++) {
		v.pre = missing ? NULL : "default";
		assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
		k = enc(t, "x1234", 5, 0, ids, 16); /* "x" "123" "4" */
		assert_int_equal(k, 4);
		assert_int_equal(ids[0], 'x');
		assert_int_equal(ids[1], 258);
		assert_int_equal(ids[2], '3');
		assert_int_equal(ids[3], '4');
		gpud_tokenizer_free(t);
	}
}

static void test_synthetic_spm(void **state)
{
	(void)state;
	const char *toks[] = { "<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab",
			       "<0x63>", "<", "s", ">", "<s", "\u2581ab" };
	const float scores[] = { 0, 0, 0, -1, -2, -2, -1, 0, -5, -5, -5, -1, -3 };
	const int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 6, 1, 1, 1, 1, 1 };
	struct vspec v = { .model = "llama", .tokens = toks, .n = 13,
			   .scores = scores, .n_scores = 13, .types = types, .n_types = 13,
			   .add_bos = -1, .add_space_prefix = -1, .bos = 1, .eos = 2, .eot = -1 };
	struct gpud_tokenizer *t;
	char err[SW_ERR_MAX];
	int32_t ids[16];

	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	/* "▁ab▁c": "ab" merges first, then "▁ab";
	 * c has no piece and falls back to <0x63>; d has no byte token: <unk>. */
	size_t k = enc(t, "ab c", 4, 0, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[0], 12);
	assert_int_equal(ids[1], 3);
	assert_int_equal(ids[2], 7);
	k = enc(t, "d", 1, 0, ids, 16);
	assert_int_equal(k, 2);
	assert_int_equal(ids[0], 3);
	assert_int_equal(ids[1], 0);
	/* Merges never build a control token from text. */
	k = enc(t, "<s>", 3, 0, ids, 16);
	assert_false(contains(ids, k, 1));
	assert_int_equal(ids[k - 2], 11);
	assert_int_equal(ids[k - 1], 10);
	gpud_tokenizer_free(t);

	v.add_space_prefix = 0;
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	k = enc(t, "ab c", 4, 0, ids, 16);
	assert_int_equal(k, 3);
	assert_int_equal(ids[0], 6);
	assert_int_equal(ids[1], 3);
	assert_int_equal(ids[2], 7);
	gpud_tokenizer_free(t);
	v.add_space_prefix = -1;

	/* Load errors, each with a message naming the problem. */
	v.n_scores = 12;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	assert_non_null(strstr(err, "scores"));
	v.n_scores = 13;
	int32_t bad_types[13];
	memcpy(bad_types, types, sizeof(types));
	bad_types[5] = 9;
	v.types = bad_types;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	assert_non_null(strstr(err, "token_type[5]"));
	v.types = types;
	v.n_types = 3;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	v.n_types = 13;
	v.model = "bert";
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EUNSUPPORTED);
	assert_non_null(strstr(err, "bert"));
	v.model = NULL;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_ENOTFOUND);
	assert_non_null(strstr(err, "tokenizer.ggml.model"));
	v.model = "llama";
	v.tokens = NULL;
	assert_int_equal(build(&v, &t, err, sizeof(err)), SW_EFORMAT);
	assert_non_null(strstr(err, "tokens"));
	gpud_tokenizer_free(NULL);
}

/* --- SentencePiece against a naive reference ------------------------------ */

/* The textbook O(n^2) loop: merge the best-scoring adjacent pair (leftmost
 * on ties) until none is a token; leftovers become <0xXX> bytes. */
static size_t naive_spm(const struct gpud_tokenizer *t, const struct gpud_gguf *g,
			const char *text, int32_t *out)
{
	char buf[512];
	size_t st[512], ln[512], n = 0, len = 0, k = 0;

	memcpy(buf, "\xE2\x96\x81", 3);
	len = 3;
	for (const char *p = text; *p; p++) {
		if (*p == ' ') {
			memcpy(buf + len, "\xE2\x96\x81", 3);
			len += 3;
		} else {
			buf[len++] = *p;
		}
	}
	for (size_t i = 0; i < len;) {
		uint8_t c = (uint8_t)buf[i];
		size_t l = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
		st[n] = i;
		ln[n++] = l;
		i += l;
	}
	for (;;) {
		long best = -1;
		float bs = 0;
		for (size_t i = 0; i + 1 < n; i++) {
			int32_t id = gpud_tokenizer_find(t, buf + st[i], ln[i] + ln[i + 1]);
			int32_t ty = 1;
			float sc = 0;
			if (id < 0)
				continue;
			if (gpud_gguf_has(g, "tokenizer.ggml.token_type"))
				assert_int_equal(gpud_gguf_arr_i32(g, "tokenizer.ggml.token_type",
								   (uint64_t)id, &ty), 0);
			if (ty != 1 && ty != 4)
				continue;
			assert_int_equal(gpud_gguf_arr_f32(g, "tokenizer.ggml.scores", (uint64_t)id,
							   &sc), 0);
			if (best < 0 || sc > bs) {
				best = (long)i;
				bs = sc;
			}
		}
		if (best < 0)
			break;
		ln[best] += ln[best + 1];
		memmove(st + best + 1, st + best + 2, (n - (size_t)best - 2) * sizeof(*st));
		memmove(ln + best + 1, ln + best + 2, (n - (size_t)best - 2) * sizeof(*ln));
		n--;
	}
	for (size_t i = 0; i < n; i++) {
		int32_t id = gpud_tokenizer_find(t, buf + st[i], ln[i]);
		if (id >= 0) {
			out[k++] = id;
			continue;
		}
		for (size_t j = 0; j < ln[i]; j++) {
			char hex[8];
			snprintf(hex, sizeof(hex), "<0x%02X>", (uint8_t)buf[st[i] + j]);
			id = gpud_tokenizer_find(t, hex, 6);
			out[k++] = id;
		}
	}
	return k;
}

static void random_vs_naive(const char *path, const char *const *alphabet, size_t na, int rounds)
{
	struct gpud_gguf *g = NULL;
	struct gpud_tokenizer *t = NULL;
	char err[SW_ERR_MAX], text[200];
	int32_t a[600], b[600];
	uint64_t x = 88172645463325252ULL;

	assert_int_equal(gpud_gguf_open(&g, path, err, sizeof(err)), 0);
	assert_int_equal(gpud_tokenizer_load(&t, g, err, sizeof(err)), 0);
	for (int r = 0; r < rounds; r++) {
		size_t len = 0;
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		int parts = 1 + (int)(x % 30);
		for (int p = 0; p < parts; p++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			const char *s = alphabet[x % na];
			if (len + strlen(s) >= sizeof(text))
				break;
			memcpy(text + len, s, strlen(s));
			len += strlen(s);
		}
		text[len] = '\0';
		size_t nb = naive_spm(t, g, text, b);
		size_t na2 = enc(t, text, len, 0, a, 600);
		if (na2 != nb || memcmp(a, b, nb * sizeof(*a)) != 0) {
			fprintf(stderr, "  \"%s\"\n", text);
			print_ids("naive", b, nb);
			print_ids("got  ", a, na2);
			fail();
		}
	}
	gpud_tokenizer_free(t);
	gpud_gguf_close(g);
}

static void test_spm_random_vs_naive(void **state)
{
	(void)state;
	static const char *const alpha[] = {
		"a", "b", "e", "t", "h", "the", "ing", " ", "  ", "\n", "1", "23", "x", "q",
		"\xC3\xA9", "\xF0\x9F\xA6\x99", "\xE4\xBD\xA0", "Hello", ".", "'", "\t", "z",
	};
	random_vs_naive(VOCAB_DIR "ggml-vocab-llama-spm.gguf", alpha, 22, 400);

	/* A vocab where a token spans "x▁" so runs cannot be split. */
	const char *toks[] = { "<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b",
			       "a\u2581b", "\u2581a", "ab", "<0x63>",
			       "b\xE2\x96\x81", "\xE2\x96\x81\xE2\x96\x81" };
	const float scores[] = { 0, 0, 0, -1, -2, -2, -0.5f, -1.5f, -1, 0, -0.7f, -3 };
	const int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 1, 1 };
	struct vspec v = { .model = "llama", .tokens = toks, .n = 12,
			   .scores = scores, .n_scores = 12, .types = types, .n_types = 12,
			   .add_bos = -1, .add_space_prefix = -1, .bos = 1, .eos = 2, .eot = -1 };
	struct gpud_gguf_writer *w = NULL;
	struct gpud_gguf_str strs[12];
	char err[SW_ERR_MAX];
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "tokenizer.ggml.model", v.model), 0);
	for (size_t i = 0; i < v.n; i++)
		strs[i] = (struct gpud_gguf_str){ toks[i], strlen(toks[i]) };
	assert_int_equal(gpud_gguf_w_arr_str(w, "tokenizer.ggml.tokens", strs, v.n), 0);
	assert_int_equal(gpud_gguf_w_arr(w, "tokenizer.ggml.scores", GPUD_GGUF_F32, scores, 12), 0);
	assert_int_equal(gpud_gguf_w_arr(w, "tokenizer.ggml.token_type", GPUD_GGUF_I32, types, 12),
			 0);
	snprintf(tmp_path, sizeof(tmp_path), "/tmp/tokenizer_test.%d.gguf", (int)getpid());
	assert_int_equal(gpud_gguf_w_write(w, tmp_path, err, sizeof(err)), 0);
	gpud_gguf_writer_free(w);
	static const char *const ab[] = { "a", "b", " ", "c", "ab", "  " };
	random_vs_naive(tmp_path, ab, 6, 400);
	unlink(tmp_path);
}

/* --- random text: properties every vocabulary must keep ------------------- */

static uint64_t rng_next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* True when s[0..n) is valid UTF-8 (strict). */
static bool valid_utf8(const char *s, size_t n)
{
	const uint8_t *p = (const uint8_t *)s;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k;
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		if (p[i] >= 0xC2 && p[i] <= 0xDF)
			k = 2, cp = p[i] & 0x1F;
		else if (p[i] >= 0xE0 && p[i] <= 0xEF)
			k = 3, cp = p[i] & 0x0F;
		else if (p[i] >= 0xF0 && p[i] <= 0xF4)
			k = 4, cp = p[i] & 0x07;
		else
			return false;
		if (i + k > n)
			return false;
		for (size_t j = 1; j < k; j++) {
			if ((p[i + j] & 0xC0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i + j] & 0x3F);
		}
		if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
		    (cp >= 0xD800 && cp <= 0xDFFF))
			return false;
		i += k;
	}
	return true;
}

static size_t put_cp(char *s, uint32_t cp)
{
	if (cp < 0x80) {
		s[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		s[0] = (char)(0xC0 | (cp >> 6));
		s[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		s[0] = (char)(0xE0 | (cp >> 12));
		s[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		s[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	s[0] = (char)(0xF0 | (cp >> 18));
	s[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	s[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	s[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Valid UTF-8 text round-trips exactly through encode and the streaming
 * detokenizer; arbitrary bytes never crash, give in-range ids and decode
 * to valid UTF-8; without PARSE_SPECIAL no control id appears. */
static void test_random_text_properties(void **state)
{
	(void)state;
	static const char *const names[] = {
		"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf",
		"ggml-vocab-starcoder.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
	};
	static const uint32_t pool[] = { ' ', ' ', ' ', '\n', '\t', '\r', 'a', 'Z', '0', '7', '\'',
					 's', '!', 0xA0, 0x3000, 0x2581, 0xBD, 0x0301, 0x200D,
					 0x1F999, 0xFFFD, 0x10FFFF, 0xE000, 0x0085 };
	uint64_t x = 0x9E3779B97F4A7C15ULL;
	char text[512], back[4096];
	int32_t ids[1024];

	for (size_t v = 0; v < sizeof(names) / sizeof(names[0]); v++) {
		char path[128];
		snprintf(path, sizeof(path), VOCAB_DIR "%s", names[v]);
		struct gpud_tokenizer *t = load_path(path);
		int32_t nv = gpud_tokenizer_n_vocab(t);
		if (v == 3) {
			/* StarCoder has no token for byte F1 and its unknown_token_id
			 * is <|endoftext|> (control, EOS): the byte is dropped, EOS
			 * never comes out of text. */
			size_t n = enc(t, "a\xF1\x8F\xB2\x95", 5, 0, ids, 1024);
			assert_true(n >= 1);
			assert_false(contains(ids, n, 0));
		}
		for (int r = 0; r < 150; r++) {
			size_t len = 0, want = rng_next(&x) % 120;
			while (len < want) {
				uint64_t z = rng_next(&x);
				uint32_t cp;
				switch (z % 4) {
				case 0:
					cp = pool[(z >> 8) % (sizeof(pool) / sizeof(pool[0]))];
					break;
				case 1:
					cp = 0x20 + (uint32_t)((z >> 8) % 0x5F);
					break;
				case 2:
					cp = (uint32_t)((z >> 8) % 0x3000);
					break;
				default:
					cp = (uint32_t)((z >> 8) % 0x110000);
					break;
				}
				if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0)
					cp = 'x';
				/* Planes 4-7 (unassigned) start with byte F1, which
				 * StarCoder's vocabulary cannot represent. */
				if (cp >= 0x40000 && cp < 0x80000)
					cp = 0x10000 + (cp & 0xFFFF);
				len += put_cp(text + len, cp);
			}
			size_t n = enc(t, text, len, 0, ids, 1024);
			for (size_t i = 0; i < n; i++) {
				char pc[1024];
				assert_true(ids[i] >= 0 && ids[i] < nv);
				/* control ids give "" as plain pieces: none may appear */
				int pl = gpud_tokenizer_piece(t, ids[i], false, pc, sizeof(pc));
				if (pl <= 0)
					fail_msg("%s: id %d has piece %d", names[v], ids[i], pl);
			}
			size_t bl = detok_all(t, ids, n, back, sizeof(back));
			if (v < 2) {
				/* SentencePiece cannot tell a literal "▁" from a space. */
				char *q;
				while ((q = memmem(text, len, "\xE2\x96\x81", 3)) != NULL) {
					*q = ' ';
					memmove(q + 1, q + 3, len - (size_t)(q + 3 - text));
					len -= 2;
				}
			}
			if (bl != len || memcmp(back, text, len) != 0) {
				fprintf(stderr, "  %s: round trip failed for %zu bytes\n  in: ",
					names[v], len);
				for (size_t i = 0; i < len; i++)
					fprintf(stderr, "%02x", (uint8_t)text[i]);
				fprintf(stderr, "\n  out:");
				for (size_t i = 0; i < bl; i++)
					fprintf(stderr, "%02x", (uint8_t)back[i]);
				fprintf(stderr, "\n");
				fail();
			}
			/* arbitrary bytes */
			for (size_t i = 0; i < 64; i++)
				text[i] = (char)rng_next(&x);
			n = enc(t, text, 64, GPUD_TOK_PARSE_SPECIAL, ids, 1024);
			for (size_t i = 0; i < n; i++)
				assert_true(ids[i] >= 0 && ids[i] < nv);
			bl = detok_all(t, ids, n, back, sizeof(back));
			assert_true(valid_utf8(back, bl));
		}
		gpud_tokenizer_free(t);
	}
}

/* --- one tokenizer, many threads ------------------------------------------ */

struct worker {
	const struct gpud_tokenizer *t;
	const char *text;
	size_t len;
	const int32_t *want;
	size_t n_want;
	int bad;
};

static void *encode_worker(void *arg)
{
	struct worker *w = arg;
	struct sw_arena a;
	int32_t *ids = malloc(w->n_want * sizeof(*ids));

	if (!ids || sw_arena_init(&a, gpud_tokenizer_scratch_bytes(w->t, w->len)) != 0) {
		w->bad = 1;
		free(ids);
		return NULL;
	}
	for (int r = 0; r < 20; r++) {
		size_t n = 0;
		int rc = gpud_tokenizer_encode(w->t, w->text, w->len, GPUD_TOK_PARSE_SPECIAL, ids,
					       w->n_want, &n, &a);
		if (rc || n != w->n_want || memcmp(ids, w->want, n * sizeof(*ids)) != 0)
			w->bad++;
	}
	sw_arena_destroy(&a);
	free(ids);
	return NULL;
}

/* The tokenizer is immutable after load: threads with their own arenas
 * get the same ids as one thread. */
static void test_concurrent_encode(void **state)
{
	(void)state;
	static const char *const names[] = { "ggml-vocab-llama-spm.gguf",
					     "ggml-vocab-llama-bpe.gguf" };
	size_t len = 0;
	char *text = read_file(VOCAB_DIR "ggml-vocab-llama-spm.gguf.inp", &len);
	assert_non_null(text);

	for (int v = 0; v < 2; v++) {
		char path[128];
		snprintf(path, sizeof(path), VOCAB_DIR "%s", names[v]);
		struct gpud_tokenizer *t = load_path(path);
		int32_t *want = malloc(4 * len * sizeof(*want));
		assert_non_null(want);
		size_t n = enc(t, text, len, GPUD_TOK_PARSE_SPECIAL, want, 4 * len);
		struct worker w[4];
		pthread_t th[4];
		for (int i = 0; i < 4; i++) {
			w[i] = (struct worker){ t, text, len, want, n, 0 };
			assert_int_equal(pthread_create(&th[i], NULL, encode_worker, &w[i]), 0);
		}
		for (int i = 0; i < 4; i++) {
			assert_int_equal(pthread_join(th[i], NULL), 0);
			assert_int_equal(w[i].bad, 0);
		}
		free(want);
		gpud_tokenizer_free(t);
	}
	free(text);
}

/* --- chat templates ----------------------------------------------------------- */

static void test_chat_format(void **state)
{
	(void)state;
	const struct gpud_chat_msg msgs[] = {
		{ "system", "Be brief." },
		{ "user", " Hi!\n" },
		{ "assistant", "Hello." },
		{ "user", "Bye" },
	};
	char out[512];

	const char *l3 = "<|begin_of_text|>"
		"<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
		"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
		"<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
		"<|start_header_id|>assistant<|end_header_id|>\n\n";
	long n = gpud_chat_format(GPUD_CHAT_LLAMA3, msgs, 4, true, out, sizeof(out));
	assert_int_equal(n, (long)strlen(l3));
	assert_string_equal(out, l3);
	n = gpud_chat_format(GPUD_CHAT_LLAMA3, msgs, 4, false, out, sizeof(out));
	assert_int_equal(n, (long)strlen(l3) - 47);

	const char *l2 = "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
		"<s>[INST] Bye [/INST]";
	n = gpud_chat_format(GPUD_CHAT_LLAMA2, msgs, 4, true, out, sizeof(out));
	assert_int_equal(n, (long)strlen(l2));
	assert_string_equal(out, l2);
	n = gpud_chat_format(GPUD_CHAT_LLAMA2, msgs + 1, 1, true, out, sizeof(out));
	assert_string_equal(out, "<s>[INST] Hi! [/INST]");

	/* Short buffer: the full length is returned, the text is cut and
	 * NUL-terminated; cap 0 writes nothing. */
	memset(out, 'x', sizeof(out));
	n = gpud_chat_format(GPUD_CHAT_LLAMA2, msgs, 4, true, out, 10);
	assert_int_equal(n, (long)strlen(l2));
	assert_string_equal(out, "<s>[INST]");
	n = gpud_chat_format(GPUD_CHAT_LLAMA3, msgs, 4, true, NULL, 0);
	assert_int_equal(n, (long)strlen(l3));

	const struct gpud_chat_msg bad[] = { { "user", "x" }, { "robot", "y" } };
	assert_true(gpud_chat_format(GPUD_CHAT_LLAMA3, bad, 2, true, out, sizeof(out)) < 0);
	assert_true(gpud_chat_format(GPUD_CHAT_NONE, msgs, 1, true, out, sizeof(out)) < 0);

	/* Llama 3 prompt encodes to its special ids. */
	struct gpud_tokenizer *t = load_path(VOCAB_DIR "ggml-vocab-llama-bpe.gguf");
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_LLAMA3);
	n = gpud_chat_format(gpud_tokenizer_chat_template(t), msgs, 2, true, out, sizeof(out));
	int32_t ids[64];
	size_t k = enc(t, out, (size_t)n, GPUD_TOK_PARSE_SPECIAL, ids, 64);
	const int32_t head[] = { 128000, 128006, 9125, 128007, 271 };
	assert_memory_equal(ids, head, sizeof(head));
	assert_int_equal(ids[k - 1], 271);
	assert_int_equal(ids[k - 2], 128007);
	assert_int_equal(ids[k - 3], 78191);
	assert_int_equal(ids[k - 4], 128006);
	gpud_tokenizer_free(t);

	t = load_path(VOCAB_DIR "ggml-vocab-llama-spm.gguf");
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_NONE);
	gpud_tokenizer_free(t);
	t = load_path(VOCAB_DIR "ggml-vocab-phi-3.gguf"); /* Phi-3's template */
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_PHI3);
	assert_true(gpud_tokenizer_is_eog(t, 32000));  /* EOS <|endoftext|> */
	assert_true(gpud_tokenizer_is_eog(t, 32007));  /* <|end|> */
	assert_true(gpud_tokenizer_is_eog(t, 2));      /* </s> (user-defined here) */
	assert_false(gpud_tokenizer_is_eog(t, 32001)); /* <|assistant|> */
	gpud_tokenizer_free(t);
}

static void test_chat_detect(void **state)
{
	(void)state;
	const char *toks[] = { "<unk>", "<s>", "</s>", "a", "<|im_end|>" };
	const int32_t types[] = { 2, 3, 3, 1, 1 };
	struct vspec v = { VSPEC_DEFAULTS, .model = "llama", .tokens = toks, .n = 5,
			   .types = types, .n_types = 5,
			   .chat_template = "{% for m in messages %}[INST] {{ m }} [/INST]"
					    "{% endfor %}" };
	struct gpud_tokenizer *t;
	char err[SW_ERR_MAX];

	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_MISTRAL); /* no <<SYS>> */
	assert_true(gpud_tokenizer_is_eog(t, 2)); /* "</s>" by name, no eos key */
	assert_false(gpud_tokenizer_is_eog(t, 4)); /* a normal token is only text */
	assert_int_equal(gpud_tokenizer_bos(t), -1);
	assert_false(gpud_tokenizer_add_bos(t)); /* nothing to add */
	gpud_tokenizer_free(t);

	const char *toks3[] = { "a", "<|start_header_id|>", "<|end_header_id|>" };
	v.tokens = toks3;
	v.n = 3;
	v.types = NULL;
	v.chat_template = NULL;
	assert_int_equal(build(&v, &t, err, sizeof(err)), 0);
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_LLAMA3);
	gpud_tokenizer_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors_harness_detects_mismatch),
		cmocka_unit_test(test_vectors_llama_spm),
		cmocka_unit_test(test_vectors_phi3),
		cmocka_unit_test(test_vectors_gpt2),
		cmocka_unit_test(test_vectors_starcoder),
		cmocka_unit_test(test_vectors_smollm_alias),
		cmocka_unit_test(test_vectors_llama_bpe),
		cmocka_unit_test(test_vectors_qwen2),
		cmocka_unit_test(test_stories260k),
		cmocka_unit_test(test_special_llama_bpe),
		cmocka_unit_test(test_special_spm),
		cmocka_unit_test(test_detok_stream),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_synthetic_bpe),
		cmocka_unit_test(test_synthetic_qwen2),
		cmocka_unit_test(test_synthetic_pre),
		cmocka_unit_test(test_synthetic_spm),
		cmocka_unit_test(test_spm_random_vs_naive),
		cmocka_unit_test(test_spm_invalid_lead),
		cmocka_unit_test(test_random_text_properties),
		cmocka_unit_test(test_concurrent_encode),
		cmocka_unit_test(test_chat_format),
		cmocka_unit_test(test_chat_detect),
	};
	return cmocka_run_group_tests(tests, setup_arena, teardown_arena);
}
