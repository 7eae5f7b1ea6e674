/* fuzz_tokenizer.c - libFuzzer target: bytes -> gpud_tokenizer_encode ->
 * gpud_tokenizer_piece / the streaming detokenizer, for every vocabulary
 * in ../shared/tokenizer/ (read at start-up through SW_SHARED_DIR; a
 * missing file is skipped, one gpud refuses stops the target: all six
 * load) and the built-in byte vocabulary gpud_mkmodel writes (always
 * there, so the target runs without ../shared).
 *
 * Input: byte 0 picks the vocabulary (low 6 bits, modulo their number),
 * GPUD_TOK_ADD_BOS (bit 6) and GPUD_TOK_PARSE_SPECIAL (bit 7); the rest
 * is the text (any bytes).
 *
 * The round trip: the concatenated pieces (gpud_tokenizer_piece, special
 * texts included exactly when the text was parsed for them, the BOS that
 * ADD_BOS adds left out) are
 *   - byte-level BPE vocabularies (gpt-2, starcoder, llama-bpe, qwen2):
 *     the text, byte for byte;
 *   - SentencePiece vocabularies (llama-spm, phi-3, the built-in one):
 *     " " + the text with every U+2581 "▁" turned into a space (the
 *     leading space is the dummy prefix SentencePiece adds to non-empty
 *     text, and "▁" is its space: both are undone only by the streaming
 *     detokenizer and by the caller, respectively). All of them spell all
 *     256 bytes (byte fallback), so nothing is lost.
 * Except: a byte the vocabulary cannot spell is dropped (tokenizer.h: no
 * unknown token to stand for it), so it is missing from the pieces. Of
 * the shared vocabularies only starcoder has such bytes: the 14 that no
 * UTF-8 text holds outside plane 4+ (0xc0 0xc1 0xf1 0xf5..0xff); every
 * other one is byte-complete and round-trips exactly as above.
 * With GPUD_TOK_PARSE_SPECIAL (special texts decoded as their text) the
 * byte-level rule still holds; a SentencePiece vocabulary then adds the
 * prefix space to every run of text after a special token, which this
 * target does not model: there only ids, counts and determinism are
 * checked.
 * Which rule a vocabulary follows, and which bytes it cannot spell, is
 * established at start-up by encoding probes (a SentencePiece vocabulary
 * must spell every byte) and must agree with the kind the table below
 * gives each shared file; then it is checked on every input.
 * Qwen2's user-defined tokens (<tool_call>) are matched in plain text too;
 * their pieces are their text, so the byte-level rule covers them.
 *
 * Also checked (a violation traps): encode returns 0 and only ids inside
 * the vocabulary; the scratch arena comes back as it was; a smaller id
 * buffer gives SW_ETOOLONG, the same count and the same first ids;
 * encoding is deterministic; the streaming detokenizer's output is valid
 * UTF-8 and, when the decoded text is valid UTF-8, equals it minus the
 * SentencePiece prefix space.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/mkmodel.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"
#include "tests/fuzz/fuzz.h"

#define MAX_TEXT 4096 /* longer inputs are cut: time goes to variety */

struct vocab {
	const char *name;
	struct gpud_tokenizer *t;
	bool spm; /* dummy prefix space and "▁" -> " " */
	bool dropped[256]; /* bytes the vocabulary cannot spell (dropped) */
	int n_dropped;
};

static const struct {
	const char *name;
	bool spm; /* the rule the probe must find */
} shared_files[] = {
	{ "ggml-vocab-gpt-2.gguf", false }, { "ggml-vocab-llama-bpe.gguf", false },
	{ "ggml-vocab-llama-spm.gguf", true }, { "ggml-vocab-phi-3.gguf", true },
	{ "ggml-vocab-qwen2.gguf", false }, { "ggml-vocab-starcoder.gguf", false },
};

static struct vocab vocabs[8];
static int n_vocabs;
static struct sw_arena arena;
static int32_t ids[4 * MAX_TEXT + 8], ids2[4 * MAX_TEXT + 8];
static char dec[64 * (MAX_TEXT + 8)], want[3 * MAX_TEXT + 8], det[3 * (64 * (MAX_TEXT + 8))];

static void fail_init(const char *what, const char *err)
{
	fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, err);
	abort();
}

static int add_vocab(const char *name, const char *path)
{
	struct gpud_gguf *g;
	char err[SW_ERR_MAX];
	int rc;

	rc = gpud_gguf_open(&g, path, err, sizeof(err));
	if (rc)
		return rc;
	rc = gpud_tokenizer_load(&vocabs[n_vocabs].t, g, err, sizeof(err));
	gpud_gguf_close(g);
	if (rc)
		fail_init(name, err);
	vocabs[n_vocabs++].name = name;
	return 0;
}

/* The built-in vocabulary: a tiny model written to a temporary file. */
static void add_builtin(void)
{
	struct gpud_mkmodel_params p;
	char path[] = "/tmp/fuzz_tokenizer_XXXXXX";
	char err[SW_ERR_MAX];
	int fd = mkstemp(path);

	if (fd < 0)
		fail_init("mkstemp", strerror(errno));
	close(fd);
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.n_layers = 1;
	if (gpud_mkmodel(&p, err, sizeof(err)))
		fail_init("mkmodel", err);
	if (add_vocab("built-in", path))
		fail_init("built-in", "cannot open the model mkmodel wrote");
	unlink(path);
}

/* Encodes and concatenates the pieces; returns the decoded length. */
static size_t round_trip(const struct gpud_tokenizer *t, const char *text, size_t len,
			 unsigned flags, size_t *n_ids)
{
	size_t n = 0, out = 0, first = 0;
	size_t mark = sw_arena_mark(&arena);

	CHECK(gpud_tokenizer_encode(t, text, len, flags, ids, sizeof(ids) / sizeof(ids[0]), &n,
				    &arena) == 0);
	CHECK(sw_arena_mark(&arena) == mark);
	if ((flags & GPUD_TOK_ADD_BOS) && gpud_tokenizer_add_bos(t)) {
		CHECK(n >= 1 && ids[0] == gpud_tokenizer_bos(t));
		first = 1;
	}
	for (size_t i = 0; i < n; i++)
		CHECK(ids[i] >= 0 && ids[i] < gpud_tokenizer_n_vocab(t));
	for (size_t i = first; i < n; i++) {
		int k = gpud_tokenizer_piece(t, ids[i], flags & GPUD_TOK_PARSE_SPECIAL, dec + out,
					     sizeof(dec) - out);
		CHECK(k >= 0);
		out += (size_t)k;
	}
	*n_ids = n;
	return out;
}

/* What the pieces of text give back under v's rule (see the top). */
static size_t expected(const struct vocab *v, const char *text, size_t len)
{
	size_t o = 0;

	if (!v->spm) {
		for (size_t i = 0; i < len; i++)
			if (!v->dropped[(unsigned char)text[i]])
				want[o++] = text[i];
		return o;
	}
	if (len)
		want[o++] = ' ';
	for (size_t i = 0; i < len; i++) {
		if (i + 3 <= len && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
			want[o++] = ' ';
			i += 2;
		} else {
			want[o++] = text[i];
		}
	}
	return o;
}

/* Finds each vocabulary's rule and checks that it spells every byte. */
static void probe(struct vocab *v)
{
	size_t n, got;
	char b;

	got = round_trip(v->t, "a", 1, 0, &n);
	if (got == 2 && memcmp(dec, " a", 2) == 0)
		v->spm = true;
	else if (!(got == 1 && dec[0] == 'a'))
		fail_init(v->name, "\"a\" does not come back as \"a\" or \" a\"");
	for (int c = 0; c < 256; c++) {
		b = (char)c;
		got = round_trip(v->t, &b, 1, 0, &n);
		if (!v->spm && n == 0) {
			v->dropped[c] = true;
			v->n_dropped++;
			continue;
		}
		if (got != expected(v, &b, 1) || memcmp(dec, want, got) != 0) {
			char msg[64];

			snprintf(msg, sizeof(msg), "byte 0x%02x does not come back", c);
			fail_init(v->name, msg);
		}
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char path[4096];

	(void)argc;
	(void)argv;
	if (sw_arena_init(&arena, 256u << 20))
		fail_init("arena", "out of memory");
	add_builtin();
	for (size_t i = 0; i < sizeof(shared_files) / sizeof(shared_files[0]); i++) {
		snprintf(path, sizeof(path), "%s/tokenizer/%s", SW_SHARED_DIR,
			 shared_files[i].name);
		if (access(path, R_OK) == 0 && add_vocab(shared_files[i].name, path))
			fail_init(path, "cannot open");
		else if (access(path, R_OK) != 0)
			fprintf(stderr, "fuzz_tokenizer: %s absent, skipped\n", path);
	}
	for (int i = 0; i < n_vocabs; i++) {
		probe(&vocabs[i]);
		for (size_t k = 0; k < sizeof(shared_files) / sizeof(shared_files[0]); k++)
			if (strcmp(vocabs[i].name, shared_files[k].name) == 0 &&
			    vocabs[i].spm != shared_files[k].spm)
				fail_init(vocabs[i].name, "probe found the other round-trip rule");
		if (vocabs[i].n_dropped)
			fprintf(stderr, "fuzz_tokenizer: %s cannot spell %d bytes (dropped)\n",
				vocabs[i].name, vocabs[i].n_dropped);
	}
	fprintf(stderr, "fuzz_tokenizer: %d vocabularies\n", n_vocabs);
	return 0;
}

static bool valid_utf8(const char *s, size_t n);

static void check_detok(const struct vocab *v, const char *raw, size_t raw_len, size_t n_ids,
			size_t first)
{
	struct gpud_detok d;
	size_t out = 0;
	int k;

	gpud_detok_init(&d);
	for (size_t i = first; i < n_ids; i++) {
		k = gpud_detok_push(v->t, &d, ids[i], det + out, sizeof(det) - out);
		CHECK(k >= 0);
		out += (size_t)k;
	}
	k = gpud_detok_flush(&d, det + out, sizeof(det) - out);
	CHECK(k >= 0);
	out += (size_t)k;
	CHECK(valid_utf8(det, out));
	if (valid_utf8(raw, raw_len)) {
		if (v->spm && raw_len && raw[0] == ' ') {
			raw++;
			raw_len--;
		}
		CHECK(out == raw_len && memcmp(det, raw, out) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct vocab *v;
	unsigned flags = 0;
	size_t len, got, n, n2 = 0, first;
	const char *text;

	if (size < 1 || n_vocabs == 0)
		return 0;
	v = &vocabs[(data[0] & 63) % n_vocabs];
	if (data[0] & 64)
		flags |= GPUD_TOK_ADD_BOS;
	if (data[0] & 128)
		flags |= GPUD_TOK_PARSE_SPECIAL;
	text = (const char *)data + 1;
	len = size - 1 > MAX_TEXT ? MAX_TEXT : size - 1;

	got = round_trip(v->t, text, len, flags, &n);
	first = (flags & GPUD_TOK_ADD_BOS) && gpud_tokenizer_add_bos(v->t);
	/* With special parsing a SentencePiece vocabulary puts the prefix
	 * space before each run of text after a special token, so only the
	 * byte-level ones keep the rule there (special texts decode as
	 * themselves). */
	if (!(flags & GPUD_TOK_PARSE_SPECIAL) || !v->spm) {
		size_t w = expected(v, text, len);

		CHECK(got == w && memcmp(dec, want, w) == 0);
	}
	/* Deterministic, and a short id buffer keeps count and prefix. */
	CHECK(gpud_tokenizer_encode(v->t, text, len, flags, ids2, sizeof(ids2) / sizeof(ids2[0]),
				    &n2, &arena) == 0);
	CHECK(n2 == n && memcmp(ids, ids2, n * sizeof(ids[0])) == 0);
	if (n >= 2) {
		CHECK(gpud_tokenizer_encode(v->t, text, len, flags, ids2, n / 2, &n2, &arena) ==
		      SW_ETOOLONG);
		CHECK(n2 == n && memcmp(ids, ids2, (n / 2) * sizeof(ids[0])) == 0);
	}
	if (!(flags & GPUD_TOK_PARSE_SPECIAL))
		check_detok(v, dec, got, n, first);
	return 0;
}

/* Strict UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
static bool valid_utf8(const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	while (i < n) {
		unsigned char c = s[i];
		size_t len;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xe0) == 0xc0) {
			len = 2;
			cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			len = 3;
			cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			len = 4;
			cp = c & 0x07;
		} else {
			return false;
		}
		if (n - i < len)
			return false;
		for (size_t j = 1; j < len; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
		    (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += len;
	}
	return true;
}
