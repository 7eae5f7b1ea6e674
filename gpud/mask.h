/* mask.h - attention mask descriptors (DESIGN §3).
 *
 * A request is segments s0..s(S-1) followed by the implicit generation
 * segment G, which has index S. vis[i] is the set of segments that tokens
 * of segment i may attend to. Token q may attend to token k iff k <= q and
 * seg(k) is in vis[seg(q)]. A segment always sees itself. Positions past
 * the prompt belong to G. BOS, when present, belongs to s0.
 *
 * The descriptor is proto's wire type (struct proto_mask_desc,
 * proto/mask.h): gpud compiles what the client sent, so there is one
 * descriptor type and one statement of its rules.
 *
 * Lifecycle: a descriptor arrives with the request and is validated at
 * admission (proto_mask_validate, against gpud.max_segments). After
 * tokenization it is compiled once
 * (gpud_mask_compile) into caller-provided memory of gpud_mask_bytes();
 * every prefill chunk and decode step then only reads the compiled mask.
 * Nothing here allocates. No dense mask exists: memory is
 * O(prompt tokens + S^2 + blocks).
 */
#ifndef GPUD_MASK_H
#define GPUD_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/mask.h"

/* Hard limit of the bitset width: 127 segments plus G. The configured
 * maximum (gpud.max_segments, default 64) may be lower. */
#define GPUD_MASK_MAX_SEGMENTS 127
_Static_assert(PROTO_MAX_SEGMENTS <= GPUD_MASK_MAX_SEGMENTS,
	       "every descriptor the wire can carry fits the bitsets");

typedef struct {
	uint64_t w[2];
} gpud_segset;

static inline bool gpud_segset_has(const gpud_segset *s, unsigned i)
{
	return (s->w[i >> 6] >> (i & 63)) & 1;
}
static inline void gpud_segset_add(gpud_segset *s, unsigned i)
{
	s->w[i >> 6] |= 1ULL << (i & 63);
}
static inline bool gpud_segset_meets(const gpud_segset *a, const gpud_segset *b)
{
	return ((a->w[0] & b->w[0]) | (a->w[1] & b->w[1])) != 0;
}
/* True when every member of b is in a. */
static inline bool gpud_segset_covers(const gpud_segset *a, const gpud_segset *b)
{
	return ((b->w[0] & ~a->w[0]) | (b->w[1] & ~a->w[1])) == 0;
}

/* The compiled form. All arrays point into the memory given to compile. */
struct gpud_mask {
	uint32_t n_segments;      /* S; G is S */
	uint32_t n_prompt;        /* prompt tokens */
	uint32_t block_tokens;    /* KV block size the block sets were built for */
	uint32_t n_prompt_blocks; /* ceil(n_prompt / block_tokens) */
	bool causal;              /* no descriptor, or one that hides no
				   * non-empty earlier segment from any row
				   * that has tokens (G always has) */
	uint64_t hash;            /* of (segment token lengths, vis rows) */
	const uint8_t *seg;       /* (n_prompt) segment of each prompt token */
	const gpud_segset *vis;   /* (S + 1) visible sets, self included */
	const gpud_segset *block_segs; /* (n_prompt_blocks) segments present per
					* KV block; a block reaching past the
					* prompt also contains G */
};

/* Bytes compile needs for S segments and n_prompt tokens; 0 when
 * block_tokens is 0. */
size_t gpud_mask_bytes(uint32_t n_segments, uint32_t n_prompt, uint32_t block_tokens);

/* Compiles desc with seg_tokens[i] = tokens of segment i (i < S; may be 0;
 * seg_tokens may be NULL when S == 0) into mem (gpud_mask_bytes() bytes,
 * 16-byte aligned). Fills *out, whose arrays point into mem (the caller
 * owns mem; the mask is valid while mem is). Identical (seg_tokens, vis
 * rows) give identical hashes; rows == NULL and an explicit all-visible
 * descriptor compile to the same mask and hash. desc is validated again
 * against the hard limit. Returns 0; what proto_mask_validate returns for
 * an invalid desc; SW_ETOOLONG when the token total overflows u32;
 * -EINVAL for NULL arguments, block_tokens 0, misaligned or too small
 * mem. On error *out and mem are unspecified but nothing else changes. */
int gpud_mask_compile(const struct proto_mask_desc *desc, const uint32_t *seg_tokens,
		      uint32_t block_tokens, void *mem, size_t memlen, struct gpud_mask *out);

/* Segment of absolute position pos (G past the prompt). */
static inline unsigned gpud_mask_seg(const struct gpud_mask *m, uint32_t pos)
{
	return pos < m->n_prompt ? m->seg[pos] : m->n_segments;
}

/* Visibility of KV block b (positions [b*B, (b+1)*B)) for a query of
 * segment qs: 0 = skip the block, 1 = every token visible (causality
 * aside), 2 = test per token. */
static inline int gpud_mask_block_vis(const struct gpud_mask *m, unsigned qs, uint32_t b)
{
	const gpud_segset *v = &m->vis[qs];
	gpud_segset g = { { 0, 0 } };
	const gpud_segset *bs = &g;
	if (b < m->n_prompt_blocks)
		bs = &m->block_segs[b];
	else
		gpud_segset_add(&g, m->n_segments);
	if (!gpud_segset_meets(v, bs))
		return 0;
	return gpud_segset_covers(v, bs) ? 1 : 2;
}

/* Per-token test inside a partially visible block. */
static inline bool gpud_mask_visible(const struct gpud_mask *m, unsigned qs, uint32_t kpos)
{
	return gpud_segset_has(&m->vis[qs], gpud_mask_seg(m, kpos));
}

#endif
