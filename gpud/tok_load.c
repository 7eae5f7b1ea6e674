/* tok_load.c - building a tokenizer from GGUF metadata.
 *
 * Everything the tokenizer needs is copied out of the GGUF here into the
 * flat tables of tokenizer_impl.h: token entries and their decoded pieces
 * in one blob, the vocab hash, the merge-rank hash (BPE, with synthetic
 * ids for merge parts that are not tokens), the special-token index, the
 * GPT-2 byte map, and the configuration (pre-tokenizer, BOS/EOS/unknown,
 * end-of-generation marks, chat template). Only load allocates; the
 * tables are read-only afterwards.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/tokenizer_impl.h"
#include "gpud/unicode.h"

/* --- GPT-2 byte <-> code point map --------------------------------------- */

/* Printable bytes map to themselves; the others to U+0100 onwards, in order. */
static uint32_t byte_to_cp(uint8_t b)
{
	if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
		return b;
	uint32_t n = 0;
	for (unsigned c = 0; c < b; c++)
		if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
			n++;
	return 0x100 + n;
}

static void build_byte_map(struct gpud_tokenizer *t)
{
	for (int i = 0; i < 0x144; i++)
		t->cp_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		uint8_t u[4];
		uint32_t cp = byte_to_cp((uint8_t)b);
		t->bmap_len[b] = (uint8_t)gpud_utf8_encode(cp, u);
		memcpy(t->bmap[b], u, 2); /* all map code points are below U+0800 */
		t->cp_byte[cp] = (int16_t)b;
	}
}

/* Inverse of byte_to_cp, -1 when cp is not in the map. */
static int cp_to_byte(const struct gpud_tokenizer *t, uint32_t cp)
{
	return cp < 0x144 ? t->cp_byte[cp] : -1;
}

/* --- hash tables --------------------------------------------------------- */

static uint32_t pow2_at_least(uint64_t n)
{
	uint32_t c = 16;
	while (c < n)
		c <<= 1;
	return c;
}

/* Inserts id under its text; a later duplicate text wins, as in llama.cpp. */
static void vocab_insert(struct gpud_tokenizer *t, int32_t id)
{
	const struct tok_entry *e = &t->tok[id];
	uint64_t h = str_hash(t->blob + e->off, e->len);
	uint32_t tag = (uint32_t)(h >> 32);
	uint32_t i = (uint32_t)h & t->vh_mask;

	for (;; i = (i + 1) & t->vh_mask) {
		uint32_t v = t->vh[i].id1;
		if (v == 0)
			break;
		const struct tok_entry *o = &t->tok[v - 1];
		if (t->vh[i].tag == tag && o->len == e->len &&
		    memcmp(t->blob + o->off, t->blob + e->off, e->len) == 0)
			break;
	}
	t->vh[i].id1 = (uint32_t)id + 1;
	t->vh[i].tag = tag;
}

/* --- load ------------------------------------------------------------------- */

static int blob_add(struct gpud_tokenizer *t, const void *p, size_t len, uint32_t *off)
{
	if (t->blob_len + len > UINT32_MAX)
		return SW_ETOOLONG;
	if (t->blob_len + len > t->blob_cap) {
		size_t cap = t->blob_cap ? t->blob_cap : 4096;
		while (cap < t->blob_len + len)
			cap *= 2;
		char *nb = realloc(t->blob, cap);
		if (!nb)
			return -ENOMEM;
		t->blob = nb;
		t->blob_cap = cap;
	}
	memcpy(t->blob + t->blob_len, p, len);
	*off = (uint32_t)t->blob_len;
	t->blob_len += len;
	return 0;
}

static int parse_byte_token(const char *s, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	const char *a = memchr(hex, s[3], 16), *b = memchr(hex, s[4], 16);
	if (!a || !b || !s[3] || !s[4])
		return -1;
	return (int)((a - hex) * 16 + (b - hex));
}

/* Writes the decoded form of token id (normal and byte tokens) into the blob. */
static int make_piece(struct gpud_tokenizer *t, int32_t id)
{
	struct tok_entry *e = &t->tok[id];
	const uint8_t *s;
	uint8_t buf[256];
	size_t n = 0, i = 0;
	uint32_t start = (uint32_t)t->blob_len;
	int rc;

	e->dec_off = start;
	e->dec_len = 0;
	if (e->type == TT_BYTE) {
		int b = parse_byte_token(t->blob + e->off, e->len);
		if (b >= 0) {
			uint8_t c = (uint8_t)b;
			e->dec_len = 1;
			return blob_add(t, &c, 1, &e->dec_off);
		}
	}
	if (e->type != TT_NORMAL && e->type != TT_BYTE) {
		e->dec_off = e->off; /* shown as is (user-defined, special) */
		e->dec_len = e->len;
		return 0;
	}
	/* Work in chunks: the blob may move while we append. */
	while (i < e->len) {
		s = (const uint8_t *)t->blob + e->off;
		n = 0;
		while (i < e->len && n + 4 <= sizeof(buf)) {
			if (t->kind == KIND_SPM) {
				if (e->len - i >= 3 && s[i] == 0xE2 && s[i + 1] == 0x96 &&
				    s[i + 2] == 0x81) {
					buf[n++] = ' ';
					i += 3;
				} else {
					buf[n++] = s[i++];
				}
			} else {
				uint32_t cp;
				size_t k = gpud_utf8_decode(s + i, e->len - i, &cp);
				int b = cp_to_byte(t, cp);
				if (b >= 0 && !(k == 1 && cp == GPUD_UC_REPLACEMENT)) {
					buf[n++] = (uint8_t)b;
				} else {
					memcpy(buf + n, s + i, k);
					n += k;
				}
				i += k;
			}
		}
		uint32_t off;
		rc = blob_add(t, buf, n, &off);
		if (rc)
			return rc;
	}
	e->dec_off = start;
	e->dec_len = (uint32_t)(t->blob_len - start);
	return 0;
}

/* Doubles the vocab hash when synthetic ids would push it past half full. */
static int vocab_reserve(struct gpud_tokenizer *t, uint64_t n_ids)
{
	uint64_t cap = (uint64_t)t->vh_mask + 1;
	if (2 * n_ids + 2 <= cap)
		return 0;
	if (cap >= (1ULL << 31))
		return SW_ETOOLONG;
	struct vslot *nv = calloc(2 * cap, sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	free(t->vh);
	t->vh = nv;
	t->vh_mask = (uint32_t)(2 * cap - 1);
	for (int32_t id = 0; id < t->n_ids; id++)
		vocab_insert(t, id);
	return 0;
}

/* Adds a synthetic id for a merge part or result that is not a token. */
static int synth_add(struct gpud_tokenizer *t, const char *s, size_t len, int32_t *id,
		     int32_t *cap_ids)
{
	int rc;

	if (t->n_ids == *cap_ids) {
		if (*cap_ids > INT32_MAX / 2)
			return SW_ETOOLONG;
		int32_t nc = *cap_ids * 2;
		struct tok_entry *ne = realloc(t->tok, (size_t)nc * sizeof(*ne));
		if (!ne)
			return -ENOMEM;
		t->tok = ne;
		*cap_ids = nc;
	}
	rc = vocab_reserve(t, (uint64_t)t->n_ids + 1);
	if (rc)
		return rc;
	struct tok_entry *e = &t->tok[t->n_ids];
	memset(e, 0, sizeof(*e));
	e->type = TT_SYNTH;
	e->len = (uint32_t)len;
	rc = blob_add(t, s, len, &e->off);
	if (rc)
		return rc;
	*id = t->n_ids++;
	vocab_insert(t, *id);
	return 0;
}

static int intern(struct gpud_tokenizer *t, const char *s, size_t len, int32_t *id,
		  int32_t *cap_ids)
{
	*id = vocab_lookup(t, s, len);
	if (*id >= 0)
		return 0;
	return synth_add(t, s, len, id, cap_ids);
}

static int load_merges(struct gpud_tokenizer *t, const struct gpud_gguf *g, char *err,
		       size_t errlen)
{
	static const char key[] = "tokenizer.ggml.merges";
	enum gpud_gguf_vtype et;
	uint64_t n;
	int32_t cap_ids = t->n_vocab > 0 ? t->n_vocab : 1;
	char *tmp = NULL;
	int rc;

	rc = gpud_gguf_get_arr(g, key, &et, &n);
	if (rc)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: missing or not an array", key);
	if (et != GPUD_GGUF_STRING)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: not a string array", key);
	if (n > (uint64_t)INT32_MAX / 4)
		return sw_seterr(err, errlen, SW_ETOOLONG, "%s: %llu merges", key,
				 (unsigned long long)n);

	/* Load factor at most 2/3 keeps probes short. */
	t->mh_mask = pow2_at_least(n + n / 2 + 2) - 1;
	t->mh = malloc(((size_t)t->mh_mask + 1) * sizeof(*t->mh));
	tmp = malloc(2 * MAX_TOKEN_BYTES);
	if (!t->mh || !tmp) {
		rc = sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", key);
		goto out_tmp;
	}
	for (size_t i = 0; i <= t->mh_mask; i++)
		t->mh[i].key = MERGE_EMPTY;

	for (uint64_t r = 0; r < n; r++) {
		struct gpud_gguf_str m;
		int32_t l, rr, res;

		rc = gpud_gguf_arr_str(g, key, r, &m);
		if (rc) {
			rc = sw_seterr(err, errlen, SW_EFORMAT, "%s[%llu]: unreadable", key,
				       (unsigned long long)r);
			goto out_tmp;
		}
		const char *sp = m.len > 1 ? memchr(m.s + 1, ' ', m.len - 1) : NULL;
		if (!sp || sp + 1 == m.s + m.len || m.len > 2 * MAX_TOKEN_BYTES) {
			rc = sw_seterr(err, errlen, SW_EFORMAT, "%s[%llu]: not \"left right\"",
				       key, (unsigned long long)r);
			goto out_tmp;
		}
		size_t ll = (size_t)(sp - m.s), rl = m.len - ll - 1;
		rc = intern(t, m.s, ll, &l, &cap_ids);
		if (!rc)
			rc = intern(t, sp + 1, rl, &rr, &cap_ids);
		if (!rc) {
			memcpy(tmp, m.s, ll);
			memcpy(tmp + ll, sp + 1, rl);
			rc = intern(t, tmp, ll + rl, &res, &cap_ids);
		}
		if (rc) {
			rc = sw_seterr(err, errlen, rc, "%s: %s", key, sw_strerror(rc));
			goto out_tmp;
		}

		uint64_t k = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr;
		uint32_t i = (uint32_t)mix64(k) & t->mh_mask;
		while (t->mh[i].key != MERGE_EMPTY && t->mh[i].key != k)
			i = (i + 1) & t->mh_mask;
		if (t->mh[i].key == k)
			continue; /* duplicate merge: the first (lower rank) stays */
		t->mh[i].key = k;
		t->mh[i].rank = (uint32_t)r;
		t->mh[i].result = res;
	}
	rc = 0;
out_tmp:
	free(tmp);
	return rc;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
	const struct gpud_tokenizer *t = arg;
	const struct tok_entry *x = &t->tok[*(const int32_t *)a], *y = &t->tok[*(const int32_t *)b];
	uint8_t fx = (uint8_t)t->blob[x->off], fy = (uint8_t)t->blob[y->off];

	if (fx != fy)
		return fx < fy ? -1 : 1;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

static int build_special(struct gpud_tokenizer *t)
{
	uint32_t n = 0;

	for (int32_t id = 0; id < t->n_vocab; id++) {
		uint8_t ty = t->tok[id].type;
		if ((ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN) && t->tok[id].len > 0)
			n++;
	}
	t->special = malloc((n ? n : 1) * sizeof(*t->special));
	if (!t->special)
		return -ENOMEM;
	n = 0;
	for (int32_t id = 0; id < t->n_vocab; id++) {
		uint8_t ty = t->tok[id].type;
		if ((ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN) && t->tok[id].len > 0)
			t->special[n++] = id;
	}
	t->n_special = n;
	qsort_r(t->special, n, sizeof(*t->special), cmp_special, t);
	uint32_t i = 0;
	for (unsigned b = 0; b < 256; b++) {
		t->special_start[b] = i;
		while (i < n && (uint8_t)t->blob[t->tok[t->special[i]].off] == b)
			i++;
	}
	t->special_start[256] = n;
	return 0;
}

static bool str_is(const struct gpud_gguf_str *s, const char *lit)
{
	size_t n = strlen(lit);
	return s->len == n && memcmp(s->s, lit, n) == 0;
}

static int32_t get_id(const struct gpud_gguf *g, const struct gpud_tokenizer *t, const char *key)
{
	uint32_t v;

	if (gpud_gguf_get_u32(g, key, &v) != 0 || v >= (uint32_t)t->n_vocab)
		return -1;
	return (int32_t)v;
}

static int load_tokens(struct gpud_tokenizer *t, const struct gpud_gguf *g, char *err,
		       size_t errlen)
{
	static const char k_tok[] = "tokenizer.ggml.tokens";
	static const char k_score[] = "tokenizer.ggml.scores";
	static const char k_type[] = "tokenizer.ggml.token_type";
	enum gpud_gguf_vtype et;
	uint64_t n, ns = 0, nt = 0;
	bool has_scores, has_types;
	int rc;

	rc = gpud_gguf_get_arr(g, k_tok, &et, &n);
	if (rc || et != GPUD_GGUF_STRING)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: missing or not a string array",
				 k_tok);
	if (n == 0 || n > (uint64_t)INT32_MAX / 4)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: bad count %llu", k_tok,
				 (unsigned long long)n);
	has_scores = gpud_gguf_get_arr(g, k_score, &et, &ns) == 0;
	if (has_scores && ns != n)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: %llu entries for %llu tokens",
				 k_score, (unsigned long long)ns, (unsigned long long)n);
	has_types = gpud_gguf_get_arr(g, k_type, &et, &nt) == 0;
	if (has_types && nt != n)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: %llu entries for %llu tokens",
				 k_type, (unsigned long long)nt, (unsigned long long)n);

	t->n_vocab = t->n_ids = (int32_t)n;
	t->tok = calloc(n, sizeof(*t->tok));
	uint32_t vcap = pow2_at_least(2 * n + 2);
	t->vh = calloc(vcap, sizeof(*t->vh));
	if (!t->tok || !t->vh)
		return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", k_tok);
	t->vh_mask = vcap - 1;

	for (uint64_t i = 0; i < n; i++) {
		struct tok_entry *e = &t->tok[i];
		struct gpud_gguf_str s;
		int32_t ty = TT_NORMAL;

		if (gpud_gguf_arr_str(g, k_tok, i, &s) != 0)
			return sw_seterr(err, errlen, SW_EFORMAT, "%s[%llu]: unreadable", k_tok,
					 (unsigned long long)i);
		if (s.len > MAX_TOKEN_BYTES)
			return sw_seterr(err, errlen, SW_ETOOLONG, "%s[%llu]: %llu bytes", k_tok,
					 (unsigned long long)i, (unsigned long long)s.len);
		rc = blob_add(t, s.s, s.len, &e->off);
		if (rc)
			return sw_seterr(err, errlen, rc, "%s: %s", k_tok, sw_strerror(rc));
		e->len = (uint32_t)s.len;
		if (has_scores && gpud_gguf_arr_f32(g, k_score, i, &e->score) != 0)
			return sw_seterr(err, errlen, SW_EFORMAT, "%s[%llu]: not a number", k_score,
					 (unsigned long long)i);
		if (has_types && gpud_gguf_arr_i32(g, k_type, i, &ty) != 0)
			return sw_seterr(err, errlen, SW_EFORMAT, "%s[%llu]: not an integer",
					 k_type, (unsigned long long)i);
		if (ty < TT_NORMAL || ty > TT_BYTE)
			return sw_seterr(err, errlen, SW_EFORMAT, "%s[%llu]: unknown type %d",
					 k_type, (unsigned long long)i, ty);
		e->type = (uint8_t)ty;
		vocab_insert(t, (int32_t)i);
	}
	return 0;
}

static int load_config(struct gpud_tokenizer *t, const struct gpud_gguf *g, char *err,
		       size_t errlen)
{
	struct gpud_gguf_str s;
	bool b;

	if (gpud_gguf_get_str(g, "tokenizer.ggml.model", &s) != 0)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "tokenizer.ggml.model: missing");
	if (str_is(&s, "llama")) {
		t->kind = KIND_SPM;
	} else if (str_is(&s, "gpt2")) {
		t->kind = KIND_BPE;
	} else {
		int n = s.len > 64 ? 64 : (int)s.len;
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "tokenizer.ggml.model \"%.*s\" is not supported (llama, gpt2)",
				 n, s.s);
	}

	/* No tokenizer.ggml.pre (files converted before it existed): llama.cpp's
	 * default expressions, as llama.cpp reads such a file. */
	bool ignore_merges = false, bpe_bos = false;
	t->pre = PRE_DEFAULT;
	if (t->kind == KIND_BPE && gpud_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0 &&
	    gpud__tok_pre_lookup(s.s, s.len, &t->pre, &ignore_merges, &bpe_bos) != 0) {
		int n = s.len > 64 ? 64 : (int)s.len;
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "tokenizer.ggml.pre \"%.*s\" is not supported (llama-bpe, "
				 "qwen2, tekken, smollm, gpt-2, starcoder, default and their "
				 "aliases: README, \"Pre-tokenizers\")",
				 n, s.s);
	}
	/* Llama 3 and Tekken (HF ignore_merges): a pre-token that is a whole
	 * token is emitted as is, without running the merges. */
	t->ignore_merges = t->kind == KIND_BPE && ignore_merges;

	t->add_bos = t->kind == KIND_SPM || (t->kind == KIND_BPE && bpe_bos);
	if (gpud_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0)
		t->add_bos = b;
	if (gpud_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) == 0)
		t->add_eos = b;
	t->add_space_prefix = t->kind == KIND_SPM;
	if (gpud_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0)
		t->add_space_prefix = b;
	return 0;
}

static void mark_eog(struct gpud_tokenizer *t, const struct gpud_gguf *g)
{
	/* Turn and text ends: Llama 3 (eot, eom, end_of_text), SentencePiece
	 * (</s>), GPT-2 (endoftext), ChatML (im_end), Phi-3 (<|end|>). */
	static const char *const names[] = {
		"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<|endoftext|>",
		"<|im_end|>", "<|end|>",
	};
	int32_t eot = get_id(g, t, "tokenizer.ggml.eot_token_id");
	int32_t eom = get_id(g, t, "tokenizer.ggml.eom_token_id");

	if (t->eos >= 0)
		t->tok[t->eos].flags |= TF_EOG;
	if (eot >= 0)
		t->tok[eot].flags |= TF_EOG;
	if (eom >= 0)
		t->tok[eom].flags |= TF_EOG;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		int32_t id = vocab_lookup(t, names[i], strlen(names[i]));
		/* only marker tokens: a normal token spelled "</s>" is text */
		if (id >= 0 && id < t->n_vocab && t->tok[id].type != TT_NORMAL)
			t->tok[id].flags |= TF_EOG;
	}
}

/* True when no token a merge may build contains "▁" right after another
 * character: then no merge crosses such a point in the text, and the
 * pieces between them can be merged one at a time with the same result. */
static bool spm_can_split(const struct gpud_tokenizer *t)
{
	for (int32_t id = 0; id < t->n_vocab; id++) {
		const struct tok_entry *e = &t->tok[id];
		const uint8_t *p = (const uint8_t *)t->blob + e->off;
		if (!mergeable(t, id))
			continue;
		for (uint32_t k = 1; k + 3 <= e->len; k++)
			if (p[k] == 0xE2 && p[k + 1] == 0x96 && p[k + 2] == 0x81 &&
			    !(k >= 3 && p[k - 3] == 0xE2 && p[k - 2] == 0x96 && p[k - 1] == 0x81))
				return false;
	}
	return true;
}

/* The family the template text names; without the key, Llama 3 when the
 * vocab has its header tokens (files converted before templates were
 * stored). chat_text records whether there was a text, for the error
 * gpud_tokenizer_chat_resolve writes. */
static void detect_chat(struct gpud_tokenizer *t, const struct gpud_gguf *g)
{
	struct gpud_gguf_str s;

	t->chat = GPUD_CHAT_NONE;
	t->chat_text = gpud_gguf_get_str(g, "tokenizer.chat_template", &s) == 0;
	if (t->chat_text) {
		t->chat = gpud_chat_detect(s.s, s.len);
		return;
	}
	if (gpud_tokenizer_find(t, "<|start_header_id|>", 19) >= 0)
		t->chat = GPUD_CHAT_LLAMA3;
}

/* Special tokens' lstrip/rstrip (whitespace next to them is dropped when
 * they are matched in text). GGUF has no key for these attributes; as
 * llama.cpp does, they come from the model: Phi-3 files (general.name
 * "phi3"/"phi-3", or a Phi-3 chat template) have rstrip on their special
 * tokens and "</s>", except <unk>, <s> and <|endoftext|> (its HF added
 * tokens carry rstrip). */
static void mark_strip(struct gpud_tokenizer *t, const struct gpud_gguf *g)
{
	static const char *const keep[] = { "<unk>", "<s>", "<|endoftext|>" };
	struct gpud_gguf_str s;
	char name[64];
	bool phi3 = t->chat == GPUD_CHAT_PHI3;

	if (gpud_gguf_get_str(g, "general.name", &s) == 0) {
		size_t n = s.len < sizeof(name) - 1 ? s.len : sizeof(name) - 1;
		for (size_t i = 0; i < n; i++)
			name[i] = (char)(s.s[i] >= 'A' && s.s[i] <= 'Z' ? s.s[i] + 32 : s.s[i]);
		name[n] = '\0';
		phi3 = phi3 || strstr(name, "phi3") || strstr(name, "phi-3");
	}
	if (!phi3)
		return;
	for (uint32_t k = 0; k < t->n_special; k++)
		t->tok[t->special[k]].flags |= TF_RSTRIP;
	int32_t id = vocab_lookup(t, "</s>", 4);
	if (id >= 0 && id < t->n_vocab)
		t->tok[id].flags |= TF_RSTRIP;
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
		id = vocab_lookup(t, keep[i], strlen(keep[i]));
		if (id >= 0 && id < t->n_vocab)
			t->tok[id].flags &= (uint8_t)~TF_RSTRIP;
	}
}

int gpud_tokenizer_load(struct gpud_tokenizer **out, const struct gpud_gguf *g, char *err,
			size_t errlen)
{
	struct gpud_tokenizer *t;
	int rc;

	*out = NULL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return sw_seterr(err, errlen, -ENOMEM, "tokenizer: out of memory");
	rc = load_config(t, g, err, errlen);
	if (rc)
		goto out_free;
	rc = load_tokens(t, g, err, errlen);
	if (rc)
		goto out_free;
	build_byte_map(t);

	for (int b = 0; b < 256; b++) {
		char buf[8];
		size_t n;
		if (t->kind == KIND_SPM) {
			n = (size_t)snprintf(buf, sizeof(buf), "<0x%02X>", b);
		} else {
			n = t->bmap_len[b];
			memcpy(buf, t->bmap[b], n);
		}
		t->byte_tok[b] = vocab_lookup(t, buf, n);
	}
	if (t->kind == KIND_BPE) {
		rc = load_merges(t, g, err, errlen);
		if (rc)
			goto out_free;
		/* Initial BPE symbols that only exist as merge parts. */
		for (int b = 0; b < 256; b++)
			t->byte_tok[b] = vocab_lookup(t, t->bmap[b], t->bmap_len[b]);
	}
	for (int32_t id = 0; id < t->n_vocab; id++) {
		rc = make_piece(t, id);
		if (rc) {
			sw_seterr(err, errlen, rc, "tokenizer: %s", sw_strerror(rc));
			goto out_free;
		}
	}
	rc = build_special(t);
	if (rc) {
		sw_seterr(err, errlen, rc, "tokenizer: out of memory");
		goto out_free;
	}

	t->bos = get_id(g, t, "tokenizer.ggml.bos_token_id");
	t->eos = get_id(g, t, "tokenizer.ggml.eos_token_id");
	t->unk = get_id(g, t, "tokenizer.ggml.unknown_token_id");
	/* Bytes without a token become the unknown token only when it is one:
	 * StarCoder names <|endoftext|> (control, EOS) as unknown_token_id,
	 * and EOS must never come out of plain text. Otherwise such bytes
	 * are dropped, as llama.cpp does. */
	if (t->unk >= 0 && t->tok[t->unk].type != TT_UNKNOWN)
		t->unk = -1;
	for (int32_t id = 0; t->unk < 0 && id < t->n_vocab; id++)
		if (t->tok[id].type == TT_UNKNOWN)
			t->unk = id; /* no key: the vocab's own unknown token */
	mark_eog(t, g);
	for (uint32_t k = 0; k < t->n_special; k++) {
		const struct tok_entry *e = &t->tok[t->special[k]];
		if (e->type == TT_USER && mergeable(t, t->special[k])) {
			t->plain_user = true;
			t->plain_first[(uint8_t)t->blob[e->off]] = true;
		}
	}
	t->spm_split = t->kind == KIND_SPM && spm_can_split(t);
	detect_chat(t, g);
	mark_strip(t, g);
	*out = t;
	return 0;

out_free:
	gpud_tokenizer_free(t);
	return rc;
}

void gpud_tokenizer_free(struct gpud_tokenizer *t)
{
	if (!t)
		return;
	free(t->tok);
	free(t->blob);
	free(t->vh);
	free(t->mh);
	free(t->special);
	free(t);
}
