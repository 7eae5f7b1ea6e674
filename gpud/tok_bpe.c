/* tok_bpe.c - byte-level BPE encoding ("gpt2" vocabularies).
 *
 * The text is cut into pre-tokens by the expressions tokenizer.ggml.pre
 * names (tok_pre.c: hand-made matchers over code points and their Unicode
 * classes); each pre-token's bytes map to
 * GPT-2's printable code points and merge by rank, lowest first and
 * leftmost on ties, as in llama.cpp. Working memory comes from the
 * caller's arena.
 */
#include <errno.h>
#include <string.h>

#include "common/arena.h"
#include "gpud/tokenizer_impl.h"

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

/* The merge of symbol i and its right neighbour, or NULL. Inline: it sits
 * in the small-run loop that most pre-tokens (short words) take. */
static inline const struct merge_slot *bpe_pair(const struct gpud_tokenizer *t,
						const struct sym *sy, int32_t i)
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

/* One pre-token to bpe_word. */
struct bpe_ctx {
	const struct gpud_tokenizer *t;
	const uint8_t *s;
	const uint32_t *off;
	struct emit *o;
	struct sw_arena *ar;
};

static int bpe_piece(void *arg, size_t i, size_t j)
{
	struct bpe_ctx *x = arg;
	return bpe_word(x->t, x->s + x->off[i], x->off[j] - x->off[i], x->o, x->ar);
}

int gpud__tok_bpe_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			 struct emit *o, struct sw_arena *ar)
{
	const uint8_t *s = (const uint8_t *)text;
	uint32_t *cp = sw_arena_alloc(ar, len * sizeof(*cp), _Alignof(uint32_t));
	uint32_t *off = sw_arena_alloc(ar, (len + 1) * sizeof(*off), _Alignof(uint32_t));
	uint8_t *cl = sw_arena_alloc(ar, len, 1);

	if (!cp || !off || !cl)
		return -ENOMEM;
	size_t n = gpud__tok_cps_fill(s, len, cp, cl, off);
	struct tok_cps c = { cp, cl, off };
	struct bpe_ctx x = { t, s, off, o, ar };
	return gpud__tok_pre_split(t->pre, &c, n, bpe_piece, &x);
}

size_t gpud__tok_bpe_scratch(size_t len)
{
	return len * (2 * sizeof(uint32_t) + 1) + sizeof(uint32_t) + 2 * len +
	       len * sizeof(struct sym) + 3 * len * sizeof(struct cand);
}
