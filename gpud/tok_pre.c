/* tok_pre.c - BPE pre-tokenizers: tokenizer.ggml.pre's names and the
 * expressions they stand for, as hand-made matchers over code points.
 *
 * A pre-tokenizer is one or more stages. A stage cuts a piece of text into
 * smaller pieces: what its expression matches, and the runs between
 * matches, each become a piece (regex splitting as llama.cpp does it); the
 * next stage cuts each of those again, and the last stage's pieces are the
 * pre-tokens BPE merges one by one. Every matcher below returns where the
 * piece starting at i ends, always past i, so a stage is one loop.
 *
 * The expressions are the models' own (their tokenizer.json), matched as
 * llama.cpp matches them, since that is the engine whose token ids a GGUF
 * file's users compare against: \p{L}, \p{N}, \p{P} and \s are the Unicode
 * classes (unicode.h), and Tekken's case classes are llama.cpp's reading of
 * them - a letter that is not ASCII a-z counts as upper case, one that is
 * not ASCII A-Z as lower case, so every non-ASCII letter is both.
 */
#include <string.h>

#include "gpud/tokenizer_impl.h"
#include "gpud/unicode.h"

static inline bool is_l(const struct tok_cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_CLASS_MASK) == GPUD_UC_LETTER;
}

static inline bool is_n(const struct tok_cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_CLASS_MASK) == GPUD_UC_NUMBER;
}

static inline bool is_s(const struct tok_cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_WS) != 0;
}

/* [^\s\p{L}\p{N}] */
static inline bool is_o(const struct tok_cps *c, size_t i)
{
	return !is_s(c, i) && !is_l(c, i) && !is_n(c, i);
}

static inline bool is_crlf(const struct tok_cps *c, size_t i)
{
	return c->cp[i] == '\r' || c->cp[i] == '\n';
}

static inline uint32_t ascii_lower(uint32_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d (case-insensitive when ci); returns the end or 0. */
static size_t match_contraction(const struct tok_cps *c, size_t i, size_t end, bool ci)
{
	if (c->cp[i] != '\'' || i + 1 >= end)
		return 0;
	uint32_t a = ci ? ascii_lower(c->cp[i + 1]) : c->cp[i + 1];
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return i + 2;
	if (i + 2 >= end)
		return 0;
	uint32_t b = ci ? ascii_lower(c->cp[i + 2]) : c->cp[i + 2];
	if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
		return i + 3;
	return 0;
}

/* \s+(?!\S)|\s+ : a whitespace run, less its last character when a
 * non-space follows (that space then leads the next pre-token); a
 * character no alternative takes stands alone. */
static size_t match_spaces(const struct tok_cps *c, size_t i, size_t end)
{
	size_t j = i;
	while (j < end && is_s(c, j))
		j++;
	if (j - i > 1 && j < end)
		return j - 1;
	return j > i ? j : i + 1;
}

/* \s*[\r\n]+ : a whitespace run up to its last line break; 0 if it has none. */
static size_t match_newlines(const struct tok_cps *c, size_t i, size_t end)
{
	size_t last_nl = 0;
	for (size_t j = i; j < end && is_s(c, j); j++)
		if (is_crlf(c, j))
			last_nl = j + 1;
	return last_nl;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const struct tok_cps *c, size_t i, size_t end)
{
	size_t j = match_contraction(c, i, end, false);
	if (j)
		return j;
	size_t k = i;
	if (c->cp[i] == ' ') {
		if (i + 1 >= end)
			return match_spaces(c, i, end);
		k = i + 1;
	}
	if (is_l(c, k)) {
		for (j = k + 1; j < end && is_l(c, j); j++)
			;
		return j;
	}
	if (is_n(c, k)) {
		for (j = k + 1; j < end && is_n(c, j); j++)
			;
		return j;
	}
	if (is_o(c, k)) {
		for (j = k + 1; j < end && is_o(c, j); j++)
			;
		return j;
	}
	return match_spaces(c, i, end);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Llama 3 takes digits three at a time (D = 3), Qwen2 one by one; Seed-Coder
 * is Qwen2's without the line breaks after punctuation (nl false). */
static inline size_t match_llama3_like(const struct tok_cps *c, size_t i, size_t end,
				       size_t max_digits, bool nl)
{
	size_t j = match_contraction(c, i, end, true);
	if (j)
		return j;
	if (!is_crlf(c, i) && !is_n(c, i) &&
	    (is_l(c, i) || (i + 1 < end && is_l(c, i + 1)))) {
		for (j = i + 1; j < end && is_l(c, j); j++)
			;
		return j;
	}
	if (is_n(c, i)) {
		for (j = i + 1; j < end && j - i < max_digits && is_n(c, j); j++)
			;
		return j;
	}
	size_t k = i;
	if (c->cp[i] == ' ' && i + 1 < end)
		k = i + 1;
	if (is_o(c, k) && !(c->cp[i] == ' ' && k == i)) {
		for (j = k + 1; j < end && is_o(c, j); j++)
			;
		while (nl && j < end && is_crlf(c, j))
			j++;
		return j;
	}
	if ((j = match_newlines(c, i, end)))
		return j;
	return match_spaces(c, i, end);
}

static size_t match_llama3(const struct tok_cps *c, size_t i, size_t end)
{
	return match_llama3_like(c, i, end, 3, true);
}

static size_t match_qwen2(const struct tok_cps *c, size_t i, size_t end)
{
	return match_llama3_like(c, i, end, 1, true);
}

static size_t match_seed_coder(const struct tok_cps *c, size_t i, size_t end)
{
	return match_llama3_like(c, i, end, 1, false);
}

/* Tekken's case classes as llama.cpp reads them: (?=\p{L})[^a-z] and
 * (?=\p{L})[^A-Z]. */
static inline bool tk_up(const struct tok_cps *c, size_t i)
{
	return is_l(c, i) && !(c->cp[i] >= 'a' && c->cp[i] <= 'z');
}

static inline bool tk_lo(const struct tok_cps *c, size_t i)
{
	return is_l(c, i) && !(c->cp[i] >= 'A' && c->cp[i] <= 'Z');
}

/* UP*LO+ at k, backtracking as a regex engine does: UP* first takes all
 * it can; if LO+ cannot start where it stops, UP* gives back characters
 * until one it gave back is also LO (a non-ASCII letter). 0: no match. */
static size_t tekken_up_lo(const struct tok_cps *c, size_t k, size_t end)
{
	size_t a = k, j;
	while (a < end && tk_up(c, a))
		a++;
	if (a < end && tk_lo(c, a)) {
		for (j = a + 1; j < end && tk_lo(c, j); j++)
			;
		return j;
	}
	/* [k, a) are UP; the last of them that is also LO ends the match:
	 * everything after it up to a is ASCII upper case. */
	for (j = a; j > k; j--)
		if (tk_lo(c, j - 1))
			return j;
	return 0;
}

/* UP+LO* at k; 0: no match. */
static size_t tekken_up_plus(const struct tok_cps *c, size_t k, size_t end)
{
	size_t a = k;
	while (a < end && tk_up(c, a))
		a++;
	if (a == k)
		return 0;
	while (a < end && tk_lo(c, a))
		a++;
	return a;
}

/* [^\r\n\p{L}\p{N}]?UP*LO+|[^\r\n\p{L}\p{N}]?UP+LO*|\p{N}|
 *  ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (Mistral's Tekken: words split before an upper-case letter that follows
 * lower case, digits one by one, no contractions.) */
static size_t match_tekken(const struct tok_cps *c, size_t i, size_t end)
{
	size_t j;
	bool prefix = !is_crlf(c, i) && !is_l(c, i) && !is_n(c, i) && i + 1 < end;

	/* Each alternative tries the optional prefix first; without it, a
	 * word must start at i itself. */
	if (prefix && (j = tekken_up_lo(c, i + 1, end)))
		return j;
	if ((j = tekken_up_lo(c, i, end)))
		return j;
	if (prefix && (j = tekken_up_plus(c, i + 1, end)))
		return j;
	if ((j = tekken_up_plus(c, i, end)))
		return j;
	if (is_n(c, i))
		return i + 1;
	size_t k = i;
	if (c->cp[i] == ' ' && i + 1 < end && is_o(c, i + 1))
		k = i + 1;
	if (is_o(c, k)) {
		for (j = k + 1; j < end && is_o(c, j); j++)
			;
		while (j < end && (is_crlf(c, j) || c->cp[j] == '/'))
			j++;
		return j;
	}
	if ((j = match_newlines(c, i, end)))
		return j;
	return match_spaces(c, i, end);
}

/* Stages that cut out one class: X+ (a run of X, or of what is not X),
 * or X (each X alone, and the runs between). */
typedef bool (*class_fn)(const struct tok_cps *c, size_t i);

static inline size_t run_of(const struct tok_cps *c, size_t i, size_t end, class_fn x)
{
	bool in = x(c, i);
	while (++i < end && x(c, i) == in)
		;
	return i;
}

static inline size_t one_of(const struct tok_cps *c, size_t i, size_t end, class_fn x)
{
	if (x(c, i))
		return i + 1;
	while (++i < end && !x(c, i))
		;
	return i;
}

/* \p{N} */
static size_t split_digit(const struct tok_cps *c, size_t i, size_t end)
{
	return one_of(c, i, end, is_n);
}

static inline bool is_p(const struct tok_cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_CLASS_MASK) == GPUD_UC_PUNCT;
}

/* [\p{P}\$\+<=>\^~\|]+ (llama.cpp's default stage 1) */
static inline bool is_punct_default(const struct tok_cps *c, size_t i)
{
	uint32_t cp = c->cp[i];
	return is_p(c, i) || cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' ||
	       cp == '^' || cp == '~' || cp == '|';
}

static size_t split_punct_run(const struct tok_cps *c, size_t i, size_t end)
{
	return run_of(c, i, end, is_punct_default);
}

/* \p{N}+ */
static size_t split_number_run(const struct tok_cps *c, size_t i, size_t end)
{
	return run_of(c, i, end, is_n);
}

/* [0-9][0-9][0-9], matched left to right */
static inline bool ascii3(const struct tok_cps *c, size_t i, size_t end)
{
	for (size_t k = i; k < i + 3; k++)
		if (k >= end || c->cp[k] < '0' || c->cp[k] > '9')
			return false;
	return true;
}

static size_t split_ascii3(const struct tok_cps *c, size_t i, size_t end)
{
	if (ascii3(c, i, end))
		return i + 3;
	while (++i < end && !ascii3(c, i, end))
		;
	return i;
}

/* DeepSeek-Coder's stages: [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+
 * (CJK ideographs U+4E00-U+9FA5, U+0800-U+4E00, Hangul U+AC00-U+D7FF)
 * and \p{N}, each a run of what it matches or of what lies between. */
static size_t split_crlf(const struct tok_cps *c, size_t i, size_t end)
{
	return one_of(c, i, end, is_crlf);
}

/* \s?X+ : the match at i, or the run up to the next one */
static inline size_t split_space_run(const struct tok_cps *c, size_t i, size_t end, class_fn x)
{
	for (size_t k = i; k < end; k++) {
		size_t s = k;
		if (is_s(c, k) && k + 1 < end && x(c, k + 1))
			s = k + 1;
		else if (!x(c, k))
			continue;
		if (k > i)
			return k; /* the run before the match */
		while (++s < end && x(c, s))
			;
		return s;
	}
	return end;
}

static size_t split_space_letters(const struct tok_cps *c, size_t i, size_t end)
{
	return split_space_run(c, i, end, is_l);
}

static size_t split_space_punct(const struct tok_cps *c, size_t i, size_t end)
{
	return split_space_run(c, i, end, is_p);
}

/* White space inside those ranges (U+2003, U+3000, ...) is not taken:
 * llama.cpp matches this expression with every white space character
 * outside ASCII replaced by \v. */
static inline bool is_cjk(const struct tok_cps *c, size_t i)
{
	uint32_t cp = c->cp[i];
	return ((cp >= 0x0800 && cp <= 0x9FA5) || (cp >= 0xAC00 && cp <= 0xD7FF)) && !is_s(c, i);
}

static size_t split_cjk(const struct tok_cps *c, size_t i, size_t end)
{
	return run_of(c, i, end, is_cjk);
}

typedef size_t (*stage_fn)(const struct tok_cps *c, size_t i, size_t end);

#define MAX_STAGES 5

struct pre_def {
	stage_fn stage[MAX_STAGES];
	int n;
};

static const struct pre_def pre_defs[] = {
	/* llama.cpp's own default: punctuation runs apart, then GPT-2's
	 * expression, then number runs, then ASCII digits in threes */
	[PRE_DEFAULT] = { { split_punct_run, match_gpt2, split_number_run, split_ascii3 }, 4 },
	[PRE_GPT2] = { { match_gpt2 }, 1 },
	[PRE_LLAMA3] = { { match_llama3 }, 1 },
	[PRE_STARCODER] = { { split_digit, match_gpt2 }, 2 },
	[PRE_QWEN2] = { { match_qwen2 }, 1 },
	[PRE_TEKKEN] = { { match_tekken }, 1 },
	[PRE_SEED_CODER] = { { match_seed_coder }, 1 },
	[PRE_DEEPSEEK_CODER] = { { split_crlf, split_space_letters, split_space_punct, split_cjk,
				   split_digit }, 5 },
};

size_t gpud__tok_cps_fill(const uint8_t *s, size_t len, uint32_t *cp, uint8_t *cl, uint32_t *off)
{
	size_t n = 0;

	for (size_t i = 0; i < len;) {
		uint32_t c;
		size_t k = gpud_utf8_decode(s + i, len - i, &c);
		cp[n] = c;
		cl[n] = gpud_uc_bits(c);
		off[n++] = (uint32_t)i;
		i += k;
	}
	off[n] = (uint32_t)len;
	return n;
}

static int split(const stage_fn *st, int ns, const struct tok_cps *c, size_t i, size_t end,
		 tok_piece_fn fn, void *arg)
{
	while (i < end) {
		size_t j = st[0](c, i, end);
		int rc = ns == 1 ? fn(arg, i, j) : split(st + 1, ns - 1, c, i, j, fn, arg);
		if (rc)
			return rc;
		i = j;
	}
	return 0;
}

int gpud__tok_pre_split(enum tok_pre pre, const struct tok_cps *c, size_t n, tok_piece_fn fn,
			void *arg)
{
	const struct pre_def *d = &pre_defs[pre];
	return split(d->stage, d->n, c, 0, n, fn, arg);
}

/* tokenizer.ggml.pre names (llama.cpp's, which the converters write) of
 * the expressions above, with the defaults each family brings. */
static const struct {
	const char *name;
	enum tok_pre pre;
	bool ignore_merges; /* a pre-token that is a whole token skips merging */
	bool add_bos;       /* BOS by default (add_bos_token overrides) */
} pre_names[] = {
	{ "default", PRE_DEFAULT, false, false },
	{ "llama3", PRE_LLAMA3, true, true },
	{ "llama-v3", PRE_LLAMA3, true, true },
	{ "llama-bpe", PRE_LLAMA3, true, true },
	{ "falcon3", PRE_LLAMA3, true, true },
	{ "falcon-h1", PRE_LLAMA3, true, true },
	{ "pixtral", PRE_LLAMA3, true, true },
	{ "midm-2.0", PRE_LLAMA3, true, true },
	{ "lfm2", PRE_LLAMA3, true, true },
	{ "smaug-bpe", PRE_LLAMA3, false, false },
	{ "gpt-2", PRE_GPT2, false, false },
	{ "phi-2", PRE_GPT2, false, false },
	{ "mpt", PRE_GPT2, false, false },
	{ "olmo", PRE_GPT2, false, false },
	{ "jais", PRE_GPT2, false, false },
	{ "trillion", PRE_GPT2, false, false },
	{ "granite-docling", PRE_GPT2, false, false },
	{ "gigachat", PRE_GPT2, false, false },
	{ "a.x-4.0", PRE_GPT2, false, false },
	{ "mellum", PRE_GPT2, false, false },
	{ "exaone4", PRE_GPT2, false, false },
	{ "starcoder", PRE_STARCODER, false, false },
	{ "smollm", PRE_STARCODER, false, false },
	{ "refact", PRE_STARCODER, false, false },
	{ "command-r", PRE_STARCODER, false, false },
	{ "codeshell", PRE_STARCODER, false, false },
	{ "exaone", PRE_STARCODER, false, false },
	{ "minerva-7b", PRE_STARCODER, false, false },
	{ "qwen2", PRE_QWEN2, false, false },
	{ "deepseek-r1-qwen", PRE_QWEN2, false, false },
	{ "megrez", PRE_QWEN2, false, false },
	{ "kormo", PRE_QWEN2, false, false },
	{ "stablelm2", PRE_QWEN2, false, false },
	{ "hunyuan", PRE_QWEN2, false, false },
	{ "grok-2", PRE_QWEN2, false, false },
	{ "tekken", PRE_TEKKEN, true, true },
	{ "seed-coder", PRE_SEED_CODER, false, false },
	{ "deepseek-coder", PRE_DEEPSEEK_CODER, false, false },
};

int gpud__tok_pre_lookup(const char *name, size_t len, enum tok_pre *pre, bool *ignore_merges,
			 bool *add_bos)
{
	for (size_t i = 0; i < sizeof(pre_names) / sizeof(pre_names[0]); i++) {
		if (strlen(pre_names[i].name) == len && !memcmp(pre_names[i].name, name, len)) {
			*pre = pre_names[i].pre;
			*ignore_merges = pre_names[i].ignore_merges;
			*add_bos = pre_names[i].add_bos;
			return 0;
		}
	}
	return -1;
}
