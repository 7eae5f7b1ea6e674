/* mask.c - compilation of attention mask descriptors (the descriptor and
 * its validation are proto's: proto/mask.h).
 *
 * The compiled mask lives in one caller-provided block, laid out as
 *   vis        (S + 1) gpud_segset
 *   block_segs (n_prompt_blocks) gpud_segset
 *   seg        (n_prompt) uint8_t
 * so the 16-byte sets come first and need no padding. Nothing here
 * allocates and nothing is ever O(tokens^2).
 */
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "gpud/mask.h"

#define MASK_HASH_SEED 0x6d61736b2d763031ULL /* "mask-v01" */

static size_t n_blocks_for(uint32_t n_prompt, uint32_t block_tokens)
{
	return ((size_t)n_prompt + block_tokens - 1) / block_tokens;
}

size_t gpud_mask_bytes(uint32_t n_segments, uint32_t n_prompt, uint32_t block_tokens)
{
	size_t nb;

	if (block_tokens == 0)
		return 0;
	nb = n_blocks_for(n_prompt, block_tokens);
	return ((size_t)n_segments + 1 + nb) * sizeof(gpud_segset) + n_prompt;
}

/* True when the rows hide nothing that exists: every non-empty segment j
 * before i (and before G) is in vis[i]. Rows of empty segments have no
 * queries and do not count. */
static bool hides_nothing(const gpud_segset *vis, const uint32_t *seg_tokens, uint32_t s)
{
	uint32_t i, j;

	for (i = 0; i <= s; i++) {
		if (i < s && seg_tokens[i] == 0)
			continue;
		for (j = 0; j < i; j++)
			if (seg_tokens[j] > 0 && !gpud_segset_has(&vis[i], j))
				return false;
	}
	return true;
}

int gpud_mask_compile(const struct proto_mask_desc *desc, const uint32_t *seg_tokens,
		      uint32_t block_tokens, void *mem, size_t memlen, struct gpud_mask *out)
{
	gpud_segset *vis, *bsegs;
	uint8_t *seg;
	uint64_t total = 0;
	uint32_t s, i, j, n_prompt, nb, pos;
	size_t need;
	int rc;

	if (!desc || !out || !mem || block_tokens == 0 || ((uintptr_t)mem & 15))
		return -EINVAL;
	rc = proto_mask_validate(desc, 0, NULL, 0); /* 0: the wire's hard limit, within ours */
	if (rc)
		return rc;
	s = desc->n_segments;
	if (s > 0 && !seg_tokens)
		return -EINVAL;
	for (i = 0; i < s; i++)
		total += seg_tokens[i];
	if (total > UINT32_MAX)
		return SW_ETOOLONG;
	n_prompt = (uint32_t)total;
	need = gpud_mask_bytes(s, n_prompt, block_tokens);
	if (memlen < need)
		return -EINVAL;
	nb = (uint32_t)n_blocks_for(n_prompt, block_tokens);

	vis = mem;
	bsegs = vis + s + 1;
	seg = (uint8_t *)(bsegs + nb);
	memset(vis, 0, ((size_t)s + 1 + nb) * sizeof(*vis));

	for (i = 0; i <= s; i++) {
		if (desc->rows) {
			const struct proto_mask_row *r = &desc->rows[i];

			for (j = 0; j < r->n; j++)
				gpud_segset_add(&vis[i], r->idx[j]);
		} else {
			for (j = 0; j < i; j++)
				gpud_segset_add(&vis[i], j);
		}
		gpud_segset_add(&vis[i], i); /* a segment always sees itself */
	}

	pos = 0;
	for (i = 0; i < s; i++) {
		memset(seg + pos, (int)i, seg_tokens[i]);
		pos += seg_tokens[i];
	}
	for (pos = 0; pos < n_prompt; pos++)
		gpud_segset_add(&bsegs[pos / block_tokens], seg[pos]);
	if (nb > 0 && (uint64_t)nb * block_tokens > n_prompt)
		gpud_segset_add(&bsegs[nb - 1], s); /* the tail of the last block is G */

	out->n_segments = s;
	out->n_prompt = n_prompt;
	out->block_tokens = block_tokens;
	out->n_prompt_blocks = nb;
	out->causal = hides_nothing(vis, seg_tokens, s);
	out->hash = sw_hash_combine(sw_hash64(s ? (const void *)seg_tokens : (const void *)vis,
					      (size_t)s * sizeof(*seg_tokens), MASK_HASH_SEED ^ s),
				    sw_hash64(vis, ((size_t)s + 1) * sizeof(*vis), MASK_HASH_SEED));
	out->seg = seg;
	out->vis = vis;
	out->block_segs = bsegs;
	return 0;
}
