/* tok_spm.c - SentencePiece-style encoding ("llama" vocabularies).
 *
 * Spaces become "▁" (U+2581), the text splits into UTF-8 characters,
 * and adjacent pairs merge by the score of the token they form, highest
 * first and leftmost on ties, as in llama.cpp; what no token spells falls
 * back to <0xXX> byte tokens. Working memory comes from the caller's arena.
 */
#include <errno.h>
#include <string.h>

#include "common/arena.h"
#include "gpud/tokenizer_impl.h"
#include "gpud/unicode.h"

/* Order-reversing map of a float score to an unsigned priority. */
static inline uint32_t score_prio(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending order */
	return ~u;
}

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

int gpud__tok_spm_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			 bool space_prefix, struct emit *o, struct sw_arena *ar)
{
	size_t n = 0, nsym = 0, longest = 0;
	/* Every byte may become a "▁" (3 bytes): sized for that, the text is
	 * read once (what gpud__tok_spm_scratch budgets), so even text that
	 * changed under the call could not overrun the buffer. */
	char *buf = sw_arena_alloc(ar, 3 * len + 3, 1);
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
		/* A character takes only the continuation bytes its lead byte
		 * announces: an invalid lead must not swallow the start of the
		 * next character (a "▁" after a stray 0xC3 would fall back to
		 * its three bytes and decode as "▁", not a space). Valid UTF-8
		 * splits as SentencePiece splits it. */
		size_t k = 1;
		if ((uint8_t)buf[i] >= 0xC0) {
			size_t want = gpud_utf8_lead_len((uint8_t)buf[i]);
			while (k < want && i + k < n && ((uint8_t)buf[i + k] & 0xC0) == 0x80)
				k++;
		}
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

size_t gpud__tok_spm_scratch(size_t len)
{
	return 3 * (len + 1) + (len + 1) * sizeof(struct sym) + 3 * (len + 1) * sizeof(struct cand);
}
