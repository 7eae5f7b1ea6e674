/* tokenizer.c - SentencePiece-style and byte-level BPE tokenizers from GGUF.
 *
 * Everything the tokenizer needs is copied out of the GGUF at load into a
 * few flat arrays: token entries, one text blob, an open-addressing hash of
 * token texts and (BPE) a hash of merge ranks keyed by the (left, right)
 * token-id pair. Encoding then only reads those tables and takes its
 * working memory from the caller's arena.
 *
 * Behaviour follows llama.cpp's tokenizer (the reference the shared test
 * vectors come from): SentencePiece merges pick the highest score, leftmost
 * on ties; BPE merges pick the lowest rank, leftmost on ties; pre-tokenizer
 * regexes are hand-written matchers over code points.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/tokenizer.h"
#include "gpud/unicode.h"

/* tokenizer.ggml.token_type values. */
enum {
	TT_SYNTH = 0, /* not in the vocabulary: an intermediate BPE merge result */
	TT_NORMAL = 1,
	TT_UNKNOWN = 2,
	TT_CONTROL = 3,
	TT_USER = 4,
	TT_UNUSED = 5,
	TT_BYTE = 6,
};

enum tok_kind { KIND_SPM, KIND_BPE };
enum tok_pre { PRE_GPT2, PRE_LLAMA3, PRE_STARCODER };

#define TF_EOG 0x01

#define MAX_TOKEN_BYTES (1u << 16)

struct tok_entry {
	uint32_t off;     /* text in blob */
	uint32_t len;
	uint32_t dec_off; /* decoded piece in blob (normal and byte tokens) */
	uint32_t dec_len;
	float score;      /* SentencePiece merge priority */
	uint8_t type;     /* TT_* */
	uint8_t flags;    /* TF_* */
};

/* Vocab hash slot: one probe reads one 8-byte slot. */
struct vslot {
	uint32_t id1; /* id + 1; 0 = empty */
	uint32_t tag; /* high bits of the text's hash */
};

struct merge_slot {
	uint64_t key;   /* (left << 32) | right; MERGE_EMPTY when free */
	uint32_t rank;  /* index in tokenizer.ggml.merges */
	int32_t result; /* id of left+right (maybe synthetic) */
};
#define MERGE_EMPTY UINT64_MAX

struct gpud_tokenizer {
	enum tok_kind kind;
	enum tok_pre pre;
	int32_t n_vocab;
	int32_t n_ids;            /* n_vocab + synthetic merge results */
	struct tok_entry *tok;    /* (n_ids) */
	char *blob;               /* token texts and decoded pieces */
	size_t blob_len, blob_cap;

	struct vslot *vh;         /* (vh_mask + 1) */
	uint32_t vh_mask;

	struct merge_slot *mh;    /* (mh_mask + 1) */
	uint32_t mh_mask;

	int32_t byte_tok[256];    /* SPM: <0xXX>; BPE: the mapped byte's id; -1 */
	uint8_t bmap[256][2];     /* BPE: UTF-8 of each byte's code point */
	uint8_t bmap_len[256];
	int16_t cp_byte[0x144];   /* BPE: inverse map, -1 outside it */

	int32_t *special;         /* (n_special) ids, by first byte then length desc */
	uint32_t n_special;
	uint32_t special_start[257]; /* special[special_start[b] .. special_start[b + 1]) */

	int32_t bos, eos, unk;
	bool add_bos, add_space_prefix, ignore_merges;
	bool spm_split;           /* no mergeable token has "▁" after another character */
	enum gpud_chat_template chat;
};

/* Tokens plain text may turn into through merges: normal and user-defined
 * ones, but never control, unknown, byte, unused or end-of-generation
 * tokens (Phi-3 has "</s>" as user-defined). */
static inline bool mergeable(const struct gpud_tokenizer *t, int32_t id)
{
	uint8_t ty = t->tok[id].type;
	return ty == TT_NORMAL || (ty == TT_USER && !(t->tok[id].flags & TF_EOG));
}

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

/* --- hashing ---------------------------------------------------------------- */

static uint64_t mix64(uint64_t h)
{
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ULL;
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ULL;
	h ^= h >> 32;
	return h;
}

static uint64_t str_hash(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);

	while (n >= 8) {
		uint64_t w;
		memcpy(&w, s, 8);
		h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
		h ^= h >> 29;
		s += 8;
		n -= 8;
	}
	uint64_t w = 0;
	for (size_t i = 0; i < n; i++) /* short tails: cheaper than memcpy */
		w |= (uint64_t)s[i] << (8 * i);
	return mix64(h ^ w);
}

static uint32_t pow2_at_least(uint64_t n)
{
	uint32_t c = 16;
	while (c < n)
		c <<= 1;
	return c;
}

/* Tokens are short: a byte loop beats a call to memcmp. */
static inline bool bytes_eq(const void *a, const void *b, size_t n)
{
	const uint8_t *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			return false;
	return true;
}

/* Id of text or -1; synthetic ids (>= n_vocab) included. */
static int32_t vocab_lookup(const struct gpud_tokenizer *t, const void *text, size_t len)
{
	uint64_t h = str_hash(text, len);
	uint32_t tag = (uint32_t)(h >> 32);
	uint32_t i = (uint32_t)h & t->vh_mask;

	for (;; i = (i + 1) & t->vh_mask) {
		uint32_t v = t->vh[i].id1;
		if (v == 0)
			return -1;
		if (t->vh[i].tag != tag)
			continue;
		const struct tok_entry *e = &t->tok[v - 1];
		if (e->len == len && bytes_eq(t->blob + e->off, text, len))
			return (int32_t)(v - 1);
	}
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

static const struct merge_slot *merge_find(const struct gpud_tokenizer *t, int32_t l, int32_t r)
{
	uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
	uint32_t i = (uint32_t)mix64(key) & t->mh_mask;

	for (;; i = (i + 1) & t->mh_mask) {
		const struct merge_slot *s = &t->mh[i];
		if (s->key == key)
			return s;
		if (s->key == MERGE_EMPTY)
			return NULL;
	}
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

static bool mem_has(const char *s, size_t len, const char *lit)
{
	return memmem(s, len, lit, strlen(lit)) != NULL;
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

	t->pre = PRE_GPT2;
	if (t->kind == KIND_BPE && gpud_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0) {
		if (str_is(&s, "default") || str_is(&s, "gpt-2")) {
			t->pre = PRE_GPT2;
		} else if (str_is(&s, "llama-bpe") || str_is(&s, "llama3") ||
			   str_is(&s, "llama-v3")) {
			t->pre = PRE_LLAMA3;
		} else if (str_is(&s, "starcoder")) {
			t->pre = PRE_STARCODER;
		} else {
			int n = s.len > 64 ? 64 : (int)s.len;
			return sw_seterr(err, errlen, SW_EUNSUPPORTED,
					 "tokenizer.ggml.pre \"%.*s\" is not supported "
					 "(default, gpt-2, llama-bpe, starcoder)", n, s.s);
		}
	}
	/* Llama 3 (HF ignore_merges): a pre-token that is a whole token is
	 * emitted as is, without running the merges. */
	t->ignore_merges = t->kind == KIND_BPE && t->pre == PRE_LLAMA3;

	t->add_bos = t->kind == KIND_SPM || t->pre == PRE_LLAMA3;
	if (gpud_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0)
		t->add_bos = b;
	t->add_space_prefix = t->kind == KIND_SPM;
	if (gpud_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0)
		t->add_space_prefix = b;
	return 0;
}

static void mark_eog(struct gpud_tokenizer *t, const struct gpud_gguf *g)
{
	/* <|end|> ends a Phi-3 turn; the others are from the issue. */
	static const char *const names[] = {
		"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<|endoftext|>",
		"<|im_end|>", "<|end|>",
	};
	int32_t eot = get_id(g, t, "tokenizer.ggml.eot_token_id");

	if (t->eos >= 0)
		t->tok[t->eos].flags |= TF_EOG;
	if (eot >= 0)
		t->tok[eot].flags |= TF_EOG;
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

static void detect_chat(struct gpud_tokenizer *t, const struct gpud_gguf *g)
{
	struct gpud_gguf_str s;

	t->chat = GPUD_CHAT_NONE;
	if (gpud_gguf_get_str(g, "tokenizer.chat_template", &s) == 0) {
		if (mem_has(s.s, s.len, "<|start_header_id|>"))
			t->chat = GPUD_CHAT_LLAMA3;
		else if (mem_has(s.s, s.len, "[INST]"))
			t->chat = GPUD_CHAT_LLAMA2;
		if (t->chat != GPUD_CHAT_NONE)
			return;
	}
	if (gpud_tokenizer_find(t, "<|start_header_id|>", 19) >= 0)
		t->chat = GPUD_CHAT_LLAMA3;
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
	t->spm_split = t->kind == KIND_SPM && spm_can_split(t);
	detect_chat(t, g);
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

int32_t gpud_tokenizer_n_vocab(const struct gpud_tokenizer *t) { return t->n_vocab; }
int32_t gpud_tokenizer_bos(const struct gpud_tokenizer *t) { return t->bos; }
int32_t gpud_tokenizer_eos(const struct gpud_tokenizer *t) { return t->eos; }
bool gpud_tokenizer_add_bos(const struct gpud_tokenizer *t) { return t->add_bos && t->bos >= 0; }

bool gpud_tokenizer_is_eog(const struct gpud_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && (t->tok[id].flags & TF_EOG);
}

int32_t gpud_tokenizer_find(const struct gpud_tokenizer *t, const char *text, size_t len)
{
	int32_t id = vocab_lookup(t, text, len);
	return id < t->n_vocab ? id : -1;
}

enum gpud_chat_template gpud_tokenizer_chat_template(const struct gpud_tokenizer *t)
{
	return t->chat;
}

/* --- encoding: shared ------------------------------------------------------- */

struct emit {
	int32_t *ids;
	size_t cap;
	size_t n;
};

static inline void emit(struct emit *o, int32_t id)
{
	if (o->n < o->cap)
		o->ids[o->n] = id;
	o->n++;
}

/* A merge candidate. key orders the heap, smallest first: the high half is
 * the priority (BPE rank; SentencePiece score mapped so that higher scores
 * come first), the low half the left symbol's index, so ties go leftmost. */
struct cand {
	uint64_t key;
	uint32_t size; /* SPM: bytes of left+right when queued (staleness check) */
	int32_t res;   /* SPM: id of the merged pair */
};

static inline uint64_t cand_key(uint32_t prio, int32_t left)
{
	return ((uint64_t)prio << 32) | (uint32_t)left;
}

static inline int32_t cand_left(const struct cand *c)
{
	return (int32_t)(uint32_t)c->key;
}

/* Order-reversing map of a float score to an unsigned priority. */
static inline uint32_t score_prio(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending order */
	return ~u;
}

struct heap {
	struct cand *a;
	size_t n;
};

static void heap_push(struct heap *h, const struct cand *c)
{
	size_t i = h->n++;

	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (c->key >= h->a[p].key)
			break;
		h->a[i] = h->a[p];
		i = p;
	}
	h->a[i] = *c;
}

static struct cand heap_pop(struct heap *h)
{
	struct cand top = h->a[0], last = h->a[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && h->a[c + 1].key < h->a[c].key)
			c++;
		if (h->a[c].key >= last.key)
			break;
		h->a[i] = h->a[c];
		i = c;
	}
	if (h->n > 0)
		h->a[i] = last;
	return top;
}

struct sym {
	uint32_t start; /* byte offset of the symbol's text */
	uint32_t len;   /* 0 once merged away */
	int32_t prev, next;
	int32_t id;     /* BPE: current token id (maybe synthetic) */
};

/* --- SentencePiece ---------------------------------------------------------- */

static void spm_try(const struct gpud_tokenizer *t, const char *buf, const struct sym *sy,
		    int32_t l, int32_t r, struct heap *h)
{
	if (l < 0 || r < 0)
		return;
	uint32_t n = sy[l].len + sy[r].len;
	int32_t id = vocab_lookup(t, buf + sy[l].start, n);
	if (id < 0 || id >= t->n_vocab || !mergeable(t, id))
		return;
	struct cand c = { .key = cand_key(score_prio(t->tok[id].score), l), .size = n, .res = id };
	heap_push(h, &c);
}

/* Runs up to this many symbols merge with a linear scan over a small
 * array of candidate pairs instead of the heap: same order (best first,
 * leftmost on ties), no heap traffic. */
#define SMALL_RUN 32

/* Token formed by symbol i and its right neighbour, or -1. */
static int32_t spm_pair(const struct gpud_tokenizer *t, const char *buf, const struct sym *sy,
			int32_t i)
{
	int32_t r = sy[i].next;
	if (r < 0)
		return -1;
	int32_t id = vocab_lookup(t, buf + sy[i].start, sy[i].len + sy[r].len);
	if (id < 0 || id >= t->n_vocab || !mergeable(t, id))
		return -1;
	return id;
}

static void spm_merge_small(const struct gpud_tokenizer *t, const char *buf, struct sym *sy,
			    int32_t a, int32_t b)
{
	int32_t pid[SMALL_RUN]; /* pair token of symbol a + k and its neighbour */

	for (int32_t i = a; i < b; i++)
		pid[i - a] = spm_pair(t, buf, sy, i);
	for (;;) {
		int32_t best = -1;
		float bs = 0;
		for (int32_t i = a; i >= 0; i = sy[i].next) {
			int32_t id = pid[i - a];
			if (id >= 0 && (best < 0 || t->tok[id].score > bs)) {
				best = i;
				bs = t->tok[id].score;
			}
		}
		if (best < 0)
			return;
		struct sym *l = &sy[best], *r = &sy[l->next];
		l->id = pid[best - a];
		l->len += r->len;
		r->len = 0;
		l->next = r->next;
		if (r->next >= 0)
			sy[r->next].prev = best;
		pid[best - a] = spm_pair(t, buf, sy, best);
		if (l->prev >= 0)
			pid[l->prev - a] = spm_pair(t, buf, sy, l->prev);
	}
}

static inline bool is_sp(const char *buf, const struct sym *y)
{
	const uint8_t *p = (const uint8_t *)buf + y->start;
	return y->len == 3 && p[0] == 0xE2 && p[1] == 0x96 && p[2] == 0x81;
}

/* End of the independently mergeable piece of symbols starting at a. */
static size_t spm_piece_end(const struct gpud_tokenizer *t, const char *buf,
			    const struct sym *sy, size_t a, size_t nsym)
{
	size_t b = a + 1;

	if (!t->spm_split)
		return nsym;
	while (b < nsym && !(is_sp(buf, &sy[b]) && !is_sp(buf, &sy[b - 1])))
		b++;
	return b;
}

/* Tokenizes one run of plain text (no special tokens inside). */
static int spm_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
		      bool space_prefix, struct emit *o, struct sw_arena *ar)
{
	size_t spaces = 0, n = 0, nsym = 0, longest = 0;
	for (size_t i = 0; i < len; i++)
		spaces += text[i] == ' ';
	char *buf = sw_arena_alloc(ar, len + 2 * spaces + 3, 1);
	struct sym *sy = sw_arena_alloc(ar, (len + 1) * sizeof(*sy), _Alignof(struct sym));
	struct heap h = { 0 };
	if (!buf || !sy)
		return -ENOMEM;

	if (space_prefix) {
		memcpy(buf, "\xE2\x96\x81", 3);
		n = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(buf + n, "\xE2\x96\x81", 3);
			n += 3;
		} else {
			buf[n++] = text[i];
		}
	}
	for (size_t i = 0; i < n;) {
		size_t k = gpud_utf8_lead_len((uint8_t)buf[i]);
		if (k > n - i)
			k = n - i;
		sy[nsym].start = (uint32_t)i;
		sy[nsym].len = (uint32_t)k;
		sy[nsym].prev = (int32_t)nsym - 1;
		sy[nsym].next = i + k == n ? -1 : (int32_t)nsym + 1;
		sy[nsym].id = -1;
		nsym++;
		i += k;
	}
	/* When no token can span a "x▁" boundary (see spm_split), the pieces
	 * between such boundaries merge independently: same result, small
	 * heaps that stay in cache, and a heap only as large as the longest
	 * piece needs. */
	for (size_t a = 0, b; a < nsym; a = b) {
		b = spm_piece_end(t, buf, sy, a, nsym);
		if (b - a > longest)
			longest = b - a;
	}
	if (longest > SMALL_RUN) {
		h.a = sw_arena_alloc(ar, 3 * longest * sizeof(*h.a), _Alignof(struct cand));
		if (!h.a)
			return -ENOMEM;
	}
	for (size_t a = 0, b; a < nsym; a = b) {
		b = spm_piece_end(t, buf, sy, a, nsym);
		sy[a].prev = -1;
		sy[b - 1].next = -1;
		h.n = 0;
		if (b - a <= SMALL_RUN)
			spm_merge_small(t, buf, sy, (int32_t)a, (int32_t)b);
		else
			for (size_t i = a + 1; i < b; i++)
				spm_try(t, buf, sy, (int32_t)i - 1, (int32_t)i, &h);
		while (h.n > 0) {
			struct cand c = heap_pop(&h);
			int32_t li = cand_left(&c);
			struct sym *l = &sy[li];
			if (l->len == 0 || l->next < 0 || l->len + sy[l->next].len != c.size)
				continue;
			struct sym *r = &sy[l->next];
			l->len += r->len;
			l->id = c.res;
			r->len = 0;
			l->next = r->next;
			if (r->next >= 0)
				sy[r->next].prev = li;
			spm_try(t, buf, sy, l->prev, li, &h);
			spm_try(t, buf, sy, li, l->next, &h);
		}
		for (int32_t i = (int32_t)a; i >= 0; i = sy[i].next) {
			int32_t id = sy[i].id;
			if (id < 0) /* never merged: a single character */
				id = vocab_lookup(t, buf + sy[i].start, sy[i].len);
			if (id >= 0 && id < t->n_vocab) {
				emit(o, id);
				continue;
			}
			for (uint32_t j = 0; j < sy[i].len; j++) {
				int32_t bt = t->byte_tok[(uint8_t)buf[sy[i].start + j]];
				if (bt < 0)
					bt = t->unk;
				if (bt >= 0)
					emit(o, bt);
			}
		}
	}
	return 0;
}

/* --- byte-level BPE ------------------------------------------------------- */

static void bpe_try(const struct gpud_tokenizer *t, const struct sym *sy, int32_t l, int32_t r,
		    struct heap *h)
{
	if (l < 0 || r < 0 || sy[l].id < 0 || sy[r].id < 0)
		return;
	const struct merge_slot *m = merge_find(t, sy[l].id, sy[r].id);
	if (!m)
		return;
	struct cand c = { .key = cand_key(m->rank, l) };
	heap_push(h, &c);
}

/* The merge of symbol i and its right neighbour, or NULL. */
static const struct merge_slot *bpe_pair(const struct gpud_tokenizer *t, const struct sym *sy,
					 int32_t i)
{
	int32_t r = sy[i].next;
	if (r < 0 || sy[i].id < 0 || sy[r].id < 0)
		return NULL;
	return merge_find(t, sy[i].id, sy[r].id);
}

static void bpe_merge_small(const struct gpud_tokenizer *t, struct sym *sy, int32_t n)
{
	const struct merge_slot *pm[SMALL_RUN];

	for (int32_t i = 0; i < n; i++)
		pm[i] = bpe_pair(t, sy, i);
	for (;;) {
		int32_t best = -1;
		uint32_t br = UINT32_MAX;
		for (int32_t i = 0; i >= 0; i = sy[i].next) {
			if (pm[i] && pm[i]->rank < br) {
				best = i;
				br = pm[i]->rank;
			}
		}
		if (best < 0)
			return;
		struct sym *l = &sy[best], *r = &sy[l->next];
		l->id = pm[best]->result;
		l->len += r->len;
		r->len = 0;
		l->next = r->next;
		if (r->next >= 0)
			sy[r->next].prev = best;
		pm[best] = bpe_pair(t, sy, best);
		if (l->prev >= 0)
			pm[l->prev] = bpe_pair(t, sy, l->prev);
	}
}

/* Merges one pre-token (raw bytes) and emits its ids. */
static int bpe_word(const struct gpud_tokenizer *t, const uint8_t *w, size_t len, struct emit *o,
		    struct sw_arena *ar)
{
	size_t mark = sw_arena_mark(ar);

	if (len == 1 && t->byte_tok[w[0]] >= 0 && t->byte_tok[w[0]] < t->n_vocab &&
	    mergeable(t, t->byte_tok[w[0]])) {
		emit(o, t->byte_tok[w[0]]);
		return 0;
	}
	if (t->ignore_merges) {
		uint8_t *m = sw_arena_alloc(ar, 2 * len, 1);
		size_t n = 0;
		if (!m)
			return -ENOMEM;
		for (size_t i = 0; i < len; i++) {
			memcpy(m + n, t->bmap[w[i]], 2);
			n += t->bmap_len[w[i]];
		}
		int32_t id = vocab_lookup(t, m, n);
		sw_arena_rewind(ar, mark);
		if (id >= 0 && id < t->n_vocab && t->tok[id].type == TT_NORMAL) {
			emit(o, id);
			return 0;
		}
	}

	struct sym small[SMALL_RUN];
	struct sym *sy = len <= SMALL_RUN ? small
			 : sw_arena_alloc(ar, len * sizeof(*sy), _Alignof(struct sym));
	struct heap h = { 0 };
	h.a = len <= SMALL_RUN ? NULL
	      : sw_arena_alloc(ar, 3 * len * sizeof(*h.a), _Alignof(struct cand));
	if (!sy || (len > SMALL_RUN && !h.a))
		return -ENOMEM;
	for (size_t i = 0; i < len; i++) {
		sy[i].start = (uint32_t)i;
		sy[i].len = 1;
		sy[i].prev = (int32_t)i - 1;
		sy[i].next = i + 1 == len ? -1 : (int32_t)i + 1;
		sy[i].id = t->byte_tok[w[i]];
	}
	if (len <= SMALL_RUN)
		bpe_merge_small(t, sy, (int32_t)len);
	for (size_t i = 1; i < len && len > SMALL_RUN; i++)
		bpe_try(t, sy, (int32_t)i - 1, (int32_t)i, &h);
	while (h.n > 0) {
		struct cand c = heap_pop(&h);
		int32_t li = cand_left(&c);
		struct sym *l = &sy[li];
		/* Still the queued pair? Ranks are unique per pair, so the pair
		 * now at li is the same one exactly when its rank matches. */
		const struct merge_slot *m = l->len ? bpe_pair(t, sy, li) : NULL;
		if (!m || m->rank != (uint32_t)(c.key >> 32))
			continue;
		struct sym *r = &sy[l->next];
		l->id = m->result;
		l->len += r->len;
		r->len = 0;
		l->next = r->next;
		if (r->next >= 0)
			sy[r->next].prev = li;
		bpe_try(t, sy, l->prev, li, &h);
		bpe_try(t, sy, li, l->next, &h);
	}
	for (int32_t i = 0; i >= 0; i = sy[i].next) {
		/* a merge result that is not a token, or is a marker, is spelled
		 * with its bytes */
		if (sy[i].id >= 0 && sy[i].id < t->n_vocab && mergeable(t, sy[i].id)) {
			emit(o, sy[i].id);
			continue;
		}
		for (uint32_t j = 0; j < sy[i].len; j++) {
			int32_t b = t->byte_tok[w[sy[i].start + j]];
			if (b >= t->n_vocab || (b >= 0 && !mergeable(t, b)))
				b = -1;
			if (b < 0)
				b = t->unk;
			if (b >= 0)
				emit(o, b);
		}
	}
	sw_arena_rewind(ar, mark);
	return 0;
}

/* Code points of a text run, their class bits and byte offsets. */
struct cps {
	const uint32_t *cp;  /* (n) */
	const uint8_t *cl;   /* (n) gpud_uc_bits() */
	const uint32_t *off; /* (n + 1) byte offset of each code point */
};

static inline bool is_l(const struct cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_CLASS_MASK) == GPUD_UC_LETTER;
}

static inline bool is_n(const struct cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_CLASS_MASK) == GPUD_UC_NUMBER;
}

static inline bool is_s(const struct cps *c, size_t i)
{
	return (c->cl[i] & GPUD_UC_WS) != 0;
}

/* [^\s\p{L}\p{N}] */
static inline bool is_o(const struct cps *c, size_t i)
{
	return !is_s(c, i) && !is_l(c, i) && !is_n(c, i);
}

static inline bool is_crlf(const struct cps *c, size_t i)
{
	return c->cp[i] == '\r' || c->cp[i] == '\n';
}

static inline uint32_t ascii_lower(uint32_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d (case-insensitive when ci); returns the end or 0. */
static size_t match_contraction(const struct cps *c, size_t i, size_t end, bool ci)
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
 * non-space follows (that space then leads the next pre-token). */
static size_t match_spaces(const struct cps *c, size_t i, size_t end)
{
	size_t j = i;
	while (j < end && is_s(c, j))
		j++;
	if (j - i > 1 && j < end)
		return j - 1;
	return j > i ? j : i + 1;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const struct cps *c, size_t i, size_t end)
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

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const struct cps *c, size_t i, size_t end)
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
		for (j = i + 1; j < end && j - i < 3 && is_n(c, j); j++)
			;
		return j;
	}
	size_t k = i;
	if (c->cp[i] == ' ' && i + 1 < end)
		k = i + 1;
	if (is_o(c, k) && !(c->cp[i] == ' ' && k == i)) {
		for (j = k + 1; j < end && is_o(c, j); j++)
			;
		while (j < end && is_crlf(c, j))
			j++;
		return j;
	}
	size_t last_nl = 0;
	for (j = i; j < end && is_s(c, j); j++)
		if (is_crlf(c, j))
			last_nl = j + 1;
	if (last_nl)
		return last_nl;
	return match_spaces(c, i, end);
}

/* Pre-tokenizes text[0..len) and merges each pre-token. */
static int bpe_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
		      struct emit *o, struct sw_arena *ar)
{
	const uint8_t *s = (const uint8_t *)text;
	uint32_t *cp = sw_arena_alloc(ar, len * sizeof(*cp), _Alignof(uint32_t));
	uint32_t *off = sw_arena_alloc(ar, (len + 1) * sizeof(*off), _Alignof(uint32_t));
	uint8_t *cl = sw_arena_alloc(ar, len, 1);
	size_t n = 0;
	int rc;

	if (!cp || !off || !cl)
		return -ENOMEM;
	for (size_t i = 0; i < len;) {
		uint32_t c;
		size_t k = gpud_utf8_decode(s + i, len - i, &c);
		cp[n] = c;
		cl[n] = gpud_uc_bits(c);
		off[n++] = (uint32_t)i;
		i += k;
	}
	off[n] = (uint32_t)len;

	struct cps c = { cp, cl, off };
	for (size_t i = 0; i < n;) {
		size_t end = n;
		if (t->pre == PRE_STARCODER) {
			/* \p{N} splits first: each digit alone, the runs between
			 * go through the GPT-2 expression on their own. */
			if (is_n(&c, i)) {
				end = i + 1;
			} else {
				for (end = i + 1; end < n && !is_n(&c, end); end++)
					;
			}
		}
		while (i < end) {
			size_t j = t->pre == PRE_LLAMA3 ? match_llama3(&c, i, end)
							: match_gpt2(&c, i, end);
			rc = bpe_word(t, s + off[i], off[j] - off[i], o, ar);
			if (rc)
				return rc;
			i = j;
		}
	}
	return 0;
}

/* --- encoding: entry point ------------------------------------------------- */

/* Longest special token whose text starts at text[i], or -1. */
static int32_t match_special(const struct gpud_tokenizer *t, const char *text, size_t len,
			     size_t i)
{
	uint8_t b = (uint8_t)text[i];
	for (uint32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
		const struct tok_entry *e = &t->tok[t->special[k]];
		if (e->len <= len - i && memcmp(t->blob + e->off, text + i, e->len) == 0)
			return t->special[k];
	}
	return -1;
}

/* Encodes text between special tokens. As in llama.cpp, every such run
 * starts a new SentencePiece "sentence" and gets the space prefix. */
static int encode_run(const struct gpud_tokenizer *t, const char *text, size_t len,
		      struct emit *o, struct sw_arena *ar)
{
	size_t mark = sw_arena_mark(ar);
	int rc;

	if (len == 0)
		return 0;
	if (t->kind == KIND_SPM)
		rc = spm_encode(t, text, len, t->add_space_prefix, o, ar);
	else
		rc = bpe_encode(t, text, len, o, ar);
	sw_arena_rewind(ar, mark);
	return rc;
}

size_t gpud_tokenizer_scratch_bytes(const struct gpud_tokenizer *t, size_t len)
{
	size_t slack = 8 * 64;
	if (t->kind == KIND_SPM)
		return 3 * (len + 1) + (len + 1) * sizeof(struct sym) +
		       3 * (len + 1) * sizeof(struct cand) + slack;
	return len * (2 * sizeof(uint32_t) + 1) + sizeof(uint32_t) + 2 * len +
	       len * sizeof(struct sym) + 3 * len * sizeof(struct cand) + slack;
}

int gpud_tokenizer_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			  unsigned flags, int32_t *ids, size_t cap, size_t *n_out,
			  struct sw_arena *scratch)
{
	struct emit o = { .ids = ids, .cap = cap, .n = 0 };
	size_t mark = sw_arena_mark(scratch);
	size_t run = 0;
	int rc = 0;

	if (len > UINT32_MAX / 4) {
		*n_out = 0;
		return SW_ETOOLONG;
	}
	if ((flags & GPUD_TOK_ADD_BOS) && gpud_tokenizer_add_bos(t))
		emit(&o, t->bos);
	if (flags & GPUD_TOK_PARSE_SPECIAL) {
		for (size_t i = 0; i < len;) {
			int32_t id = match_special(t, text, len, i);
			if (id < 0) {
				i++;
				continue;
			}
			rc = encode_run(t, text + run, i - run, &o, scratch);
			if (rc)
				goto out;
			emit(&o, id);
			i += t->tok[id].len;
			run = i;
		}
	}
	rc = encode_run(t, text + run, len - run, &o, scratch);
out:
	sw_arena_rewind(scratch, mark);
	if (rc) {
		*n_out = 0;
		return rc;
	}
	*n_out = o.n;
	return o.n > cap ? SW_ETOOLONG : 0;
}

/* --- decoding --------------------------------------------------------------- */

int gpud_tokenizer_piece(const struct gpud_tokenizer *t, int32_t id, bool special, char *out,
			 size_t cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	const struct tok_entry *e = &t->tok[id];
	uint32_t off = e->dec_off, len = e->dec_len;

	if (e->type == TT_UNUSED || ((e->type == TT_CONTROL || e->type == TT_UNKNOWN) && !special))
		len = 0;
	if (len > cap)
		return SW_ETOOLONG;
	memcpy(out, t->blob + off, len);
	return (int)len;
}

void gpud_detok_init(struct gpud_detok *d)
{
	memset(d, 0, sizeof(*d));
}

void gpud_detok_init_continuation(struct gpud_detok *d)
{
	memset(d, 0, sizeof(*d));
	d->started = true;
}

struct outbuf {
	char *p;
	size_t cap, n;
	bool full;
};

static void out_put(struct outbuf *o, const void *p, size_t n)
{
	if (o->n + n > o->cap) {
		o->full = true;
		return;
	}
	memcpy(o->p + o->n, p, n);
	o->n += n;
}

/* Feeds one byte through the UTF-8 assembler in d. */
static void detok_byte(struct gpud_detok *d, uint8_t b, struct outbuf *o)
{
	static const char fffd[] = "\xEF\xBF\xBD";

	for (;;) {
		if (d->n_pending == 0) {
			size_t n = gpud_utf8_seq_len(b);
			if (n == 1)
				out_put(o, &b, 1);
			else if (n == 0)
				out_put(o, fffd, 3);
			else
				d->pending[d->n_pending++] = b;
			return;
		}
		d->pending[d->n_pending] = b;
		size_t n = d->n_pending + 1;
		uint32_t cp;
		if (gpud_utf8_decode(d->pending, n, &cp) == n) {
			out_put(o, d->pending, n);
			d->n_pending = 0;
			return;
		}
		if (gpud_utf8_is_partial(d->pending, n)) {
			d->n_pending++;
			return;
		}
		/* b cannot continue what is held: that part is one bad
		 * character, and b starts afresh. */
		out_put(o, fffd, 3);
		d->n_pending = 0;
	}
}

int gpud_detok_push(const struct gpud_tokenizer *t, struct gpud_detok *d, int32_t id, char *out,
		    size_t cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	const struct tok_entry *e = &t->tok[id];
	const uint8_t *p = (const uint8_t *)t->blob + e->dec_off;
	size_t len = e->dec_len;
	struct gpud_detok nd = *d;
	struct outbuf o = { .p = out, .cap = cap };

	if (e->type == TT_UNUSED || e->type == TT_CONTROL || e->type == TT_UNKNOWN)
		len = 0;
	if (len > 0 && !nd.started) {
		nd.started = true;
		if (t->kind == KIND_SPM && t->add_space_prefix && p[0] == ' ') {
			p++;
			len--;
		}
	}
	for (size_t i = 0; i < len; i++)
		detok_byte(&nd, p[i], &o);
	if (o.full)
		return SW_ETOOLONG; /* d unchanged: retry with more room */
	*d = nd;
	return (int)o.n;
}

int gpud_detok_flush(struct gpud_detok *d, char *out, size_t cap)
{
	if (d->n_pending == 0)
		return 0;
	if (cap < 3)
		return SW_ETOOLONG;
	memcpy(out, "\xEF\xBF\xBD", 3);
	d->n_pending = 0;
	return 3;
}

/* --- chat templates --------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t cap, n;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->n < b->cap) {
		size_t k = b->cap - b->n < n ? b->cap - b->n : n;
		memcpy(b->p + b->n, s, k);
	}
	b->n += n;
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static bool ascii_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Content with leading and trailing whitespace removed, as both official
 * templates do (Jinja trim / Python strip; ASCII whitespace only here). */
static void sb_trimmed(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	while (n > 0 && ascii_space(*s)) {
		s++;
		n--;
	}
	while (n > 0 && ascii_space(s[n - 1]))
		n--;
	sb_put(b, s, n);
}

long gpud_chat_format(enum gpud_chat_template tmpl, const struct gpud_chat_msg *msgs, size_t n,
		      bool add_assistant_header, char *out, size_t cap)
{
	struct sbuf b = { .p = out, .cap = cap };

	for (size_t i = 0; i < n; i++) {
		const char *r = msgs[i].role;
		if (!r || !msgs[i].content ||
		    (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
			return -EINVAL;
	}
	switch (tmpl) {
	case GPUD_CHAT_LLAMA3:
		sb_str(&b, "<|begin_of_text|>");
		for (size_t i = 0; i < n; i++) {
			sb_str(&b, "<|start_header_id|>");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "<|end_header_id|>\n\n");
			sb_trimmed(&b, msgs[i].content);
			sb_str(&b, "<|eot_id|>");
		}
		if (add_assistant_header)
			sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case GPUD_CHAT_LLAMA2: {
		const char *sys = NULL;
		for (size_t i = 0; i < n; i++) {
			const char *r = msgs[i].role;
			if (!strcmp(r, "system")) {
				sys = msgs[i].content;
			} else if (!strcmp(r, "user")) {
				sb_str(&b, "<s>[INST] ");
				if (sys) {
					sb_str(&b, "<<SYS>>\n");
					sb_trimmed(&b, sys);
					sb_str(&b, "\n<</SYS>>\n\n");
					sys = NULL;
				}
				sb_trimmed(&b, msgs[i].content);
				sb_str(&b, " [/INST]");
			} else {
				sb_str(&b, " ");
				sb_trimmed(&b, msgs[i].content);
				sb_str(&b, " </s>");
			}
		}
		break;
	}
	default:
		return SW_EUNSUPPORTED;
	}
	if (cap > 0)
		out[b.n < cap ? b.n : cap - 1] = '\0';
	return (long)b.n;
}
