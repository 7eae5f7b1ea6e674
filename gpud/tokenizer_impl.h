/* tokenizer_impl.h - private to the tokenizer's files (tokenizer.c,
 * tok_load.c, tok_spm.c, tok_bpe.c, tok_pre.c, tok_decode.c).
 *
 * The loaded tokenizer is a few flat arrays copied out of the GGUF at load
 * (tok_load.c): token entries, one text blob, an open-addressing hash of
 * token texts and (BPE) a hash of merge ranks keyed by the (left, right)
 * token-id pair. Encoding only reads those tables. This header holds their
 * layout, the lookups every file needs (inline: they sit in the merge
 * loops), the working structures both merge loops share (symbols, the
 * candidate heap, the id sink) and the entry points between the files.
 * Internal names need no prefix here; functions one file exports to
 * another are gpud__tok_*.
 */
#ifndef GPUD_TOKENIZER_IMPL_H
#define GPUD_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpud/tokenizer.h"

struct sw_arena;

/* --- vocabulary tables ---------------------------------------------------- */

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
/* BPE pre-tokenizers (tok_pre.c): llama.cpp's default, GPT-2, Llama 3,
 * StarCoder, Qwen2, Mistral's Tekken, Seed-Coder, DeepSeek-Coder. */
enum tok_pre {
	PRE_DEFAULT,
	PRE_GPT2,
	PRE_LLAMA3,
	PRE_STARCODER,
	PRE_QWEN2,
	PRE_TEKKEN,
	PRE_SEED_CODER,
	PRE_DEEPSEEK_CODER,
};

#define TF_EOG 0x01
#define TF_LSTRIP 0x02 /* whitespace before it is dropped when matched as special */
#define TF_RSTRIP 0x04 /* whitespace after it likewise */

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
	bool plain_user;          /* some user-defined token is matched in plain text */
	bool plain_first[256];    /* first bytes of those tokens */

	int32_t bos, eos, unk;
	bool add_bos, add_eos, add_space_prefix, ignore_merges;
	bool spm_split;           /* no mergeable token has "▁" after another character */
	enum gpud_chat_template chat; /* detected (gpud_chat_detect) */
	bool chat_text;           /* the file has tokenizer.chat_template */
};

/* Tokens plain text may turn into through merges: normal and user-defined
 * ones, but never control, unknown, byte, unused or end-of-generation
 * tokens (Phi-3 has "</s>" as user-defined). */
static inline bool mergeable(const struct gpud_tokenizer *t, int32_t id)
{
	uint8_t ty = t->tok[id].type;
	return ty == TT_NORMAL || (ty == TT_USER && !(t->tok[id].flags & TF_EOG));
}

/* --- lookups ---------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t h)
{
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ULL;
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ULL;
	h ^= h >> 32;
	return h;
}

static inline uint64_t str_hash(const void *p, size_t n)
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
static inline int32_t vocab_lookup(const struct gpud_tokenizer *t, const void *text, size_t len)
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

static inline const struct merge_slot *merge_find(const struct gpud_tokenizer *t, int32_t l,
						  int32_t r)
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

/* --- merge loops: shared working structures ------------------------------ */

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

struct heap {
	struct cand *a;
	size_t n;
};

static inline void heap_push(struct heap *h, const struct cand *c)
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

static inline struct cand heap_pop(struct heap *h)
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

/* Runs up to this many symbols merge with a linear scan over a small
 * array of candidate pairs instead of the heap: same order (best first,
 * leftmost on ties), no heap traffic. */
#define SMALL_RUN 32

/* --- entry points between the files --------------------------------------- */

/* tok_spm.c: tokenizes one run of plain text (no special tokens inside)
 * with SentencePiece merges, the space prefix added when space_prefix.
 * Working memory from ar (not rewound); 0 or -ENOMEM. */
int gpud__tok_spm_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			 bool space_prefix, struct emit *o, struct sw_arena *ar);
/* Upper bound of what gpud__tok_spm_encode takes from the arena for len
 * bytes, without the caller's slack. */
size_t gpud__tok_spm_scratch(size_t len);

/* tok_pre.c: a run of text as code points, their class bits
 * (gpud_uc_bits) and the byte offset of each (off has n + 1 entries). */
struct tok_cps {
	const uint32_t *cp;
	const uint8_t *cl;
	const uint32_t *off;
};

/* Decodes s[0..len) into code points (malformed UTF-8 a U+FFFD a byte),
 * their class bits and byte offsets: cp and cl hold len entries, off
 * len + 1. Returns the number of code points. */
size_t gpud__tok_cps_fill(const uint8_t *s, size_t len, uint32_t *cp, uint8_t *cl, uint32_t *off);

/* Called with each pre-token [i, j) (code point indexes), in order; a
 * nonzero return stops the split and is returned by it. */
typedef int (*tok_piece_fn)(void *arg, size_t i, size_t j);

/* Cuts code points [0, n) into pre-tokens as pre's expressions do. */
int gpud__tok_pre_split(enum tok_pre pre, const struct tok_cps *c, size_t n, tok_piece_fn fn,
			void *arg);

/* tokenizer.ggml.pre name -> pre-tokenizer and the family's defaults for
 * ignore_merges and add_bos; -1 for a name it does not know. */
int gpud__tok_pre_lookup(const char *name, size_t len, enum tok_pre *pre, bool *ignore_merges,
			 bool *add_bos);

/* tok_bpe.c: pre-tokenizes one run of plain text and merges each
 * pre-token with the byte-level BPE ranks. Working memory from ar (not
 * rewound); 0 or -ENOMEM. */
int gpud__tok_bpe_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			 struct emit *o, struct sw_arena *ar);
/* Upper bound of what gpud__tok_bpe_encode takes from the arena for len
 * bytes, without the caller's slack. */
size_t gpud__tok_bpe_scratch(size_t len);

#endif
