/* step.c - the CUDA backend's per-step host logic: the step metadata the
 * kernels read (one pinned buffer, one copy per step), the LRU of
 * device mask slots and the host's half of the arg max. Pure (no CUDA call, nothing allocated): unit-tested
 * without a device (tests/unit/cuda_host_test.c).
 */
#include "gpud/backend/cuda/cuda_impl.h"
#include "gpud/draw.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/mask.h"

static bool slot_is(const struct gpud_cuda_slot *s, const struct gpud_mask *m)
{
	return s->stamp && s->id == (const void *)m && s->seg == (const void *)m->seg &&
	       s->vis == (const void *)m->vis && s->hash == m->hash &&
	       s->n_prompt == m->n_prompt && s->n_segments == m->n_segments &&
	       s->n_blocks == m->n_prompt_blocks;
}

int gpud_cuda_slot_get(struct gpud_cuda_slot *slots, uint32_t n, const struct gpud_mask *m,
		       uint64_t stamp, bool *miss)
{
	int lru = -1;

	for (uint32_t i = 0; i < n; i++) {
		if (slot_is(&slots[i], m)) {
			slots[i].stamp = stamp;
			*miss = false;
			return (int)i;
		}
		if (slots[i].stamp < stamp && (lru < 0 || slots[i].stamp < slots[lru].stamp))
			lru = (int)i;
	}
	*miss = true;
	if (lru < 0)
		return -1;
	slots[lru] = (struct gpud_cuda_slot){
		.id = m, .seg = m->seg, .vis = m->vis, .hash = m->hash,
		.n_prompt = m->n_prompt, .n_segments = m->n_segments,
		.n_blocks = m->n_prompt_blocks, .stamp = stamp,
	};
	return lru;
}

size_t gpud_cuda_mask_image(const struct gpud_cuda_layout *l, uint32_t block_tokens,
			    const struct gpud_mask *m, uint8_t *img)
{
	size_t segs_at = GPUD_CUDA_VIS_SETS * 16, seg_at = segs_at + l->max_prompt_blocks * 16;

	if (m->n_prompt > l->max_prompt || m->n_prompt_blocks > l->max_prompt_blocks ||
	    m->n_segments >= GPUD_CUDA_VIS_SETS || m->block_tokens != block_tokens)
		return 0;
	memcpy(img, m->vis, ((size_t)m->n_segments + 1) * sizeof(gpud_segset));
	if (m->n_prompt_blocks)
		memcpy(img + segs_at, m->block_segs, (size_t)m->n_prompt_blocks * sizeof(gpud_segset));
	if (m->n_prompt)
		memcpy(img + seg_at, m->seg, m->n_prompt);
	return seg_at + m->n_prompt;
}

int gpud_cuda_meta_fill(const struct gpud_cuda_layout *l, uint32_t block_tokens,
			const struct gpud_fwd_batch *b, struct gpud_cuda_slot *slots,
			uint64_t stamp, uint32_t *meta, uint64_t *n_words, uint32_t *up_seq,
			uint32_t *n_up, uint32_t *n_tiles, char *err, size_t errlen)
{
	uint32_t *tokens = meta + l->m_tokens, *pos = meta + l->m_pos, *seq = meta + l->m_seq;
	uint32_t *logit = meta + l->m_logit, *btab = meta + l->m_btab;
	uint32_t *tiles = meta + l->m_tiles;
	uint64_t bt_used = 0;

	*n_up = 0;
	*n_words = 0;
	*n_tiles = 0;
	if (!b->n_tokens || b->n_tokens > l->T || b->n_seqs > l->S || b->n_logits > l->NL)
		return sw_seterr(err, errlen, -EINVAL, "cuda forward: batch exceeds the limits");
	memcpy(tokens, b->tokens, (size_t)b->n_tokens * sizeof(uint32_t));
	meta[l->m_ndraw] = 0;
	if (gpud_cuda_draw_words(b))
		memset(meta + l->m_draw, 0,
		       (size_t)b->n_logits * GPUD_CUDA_DRAW_WORDS * sizeof(uint32_t));
	for (uint32_t i = 0; i < b->n_seqs; i++) {
		const struct gpud_fwd_seq *s = &b->seqs[i];
		const struct gpud_mask *m = s->mask;
		uint32_t *si = meta + l->m_seqinfo + (size_t)i * GPUD_CUDA_SEQ_WORDS;
		uint64_t end = (uint64_t)s->pos0 + s->n_tokens;
		uint64_t nb = (end + block_tokens - 1) / block_tokens;

		if (end > l->max_pos || bt_used + nb > l->max_btab ||
		    (uint64_t)s->tok0 + s->n_tokens > b->n_tokens ||
		    (uint64_t)s->logit0 + s->n_logits > b->n_logits || s->n_logits > s->n_tokens)
			return sw_seterr(err, errlen, -EINVAL,
					 "cuda forward: sequence %u (positions %u..%llu) exceeds "
					 "the limits (%llu positions per sequence: the model's "
					 "context or the KV)", i, s->pos0,
					 (unsigned long long)end, (unsigned long long)l->max_pos);
		memset(si, 0, GPUD_CUDA_SEQ_WORDS * sizeof(uint32_t));
		si[GPUD_CUDA_SI_BTAB] = (uint32_t)bt_used;
		memcpy(btab + bt_used, s->blocks, (size_t)nb * sizeof(uint32_t));
		bt_used += nb;
		si[GPUD_CUDA_SI_SLOT] = GPUD_CUDA_NO_MASK;
		if (m && !m->causal) {
			bool miss;
			int k;

			if (m->n_prompt > l->max_prompt || m->n_segments >= GPUD_CUDA_VIS_SETS ||
			    m->block_tokens != block_tokens)
				return sw_seterr(err, errlen, SW_ETOOLONG,
						 "cuda forward: sequence %u's mask (%u prompt tokens, "
						 "block size %u) does not fit a mask slot (%llu "
						 "tokens, block size %u)", i, m->n_prompt,
						 m->block_tokens, (unsigned long long)l->max_prompt,
						 block_tokens);
			k = gpud_cuda_slot_get(slots, l->mask_slots, m, stamp, &miss);
			if (k < 0)
				return sw_seterr(err, errlen, SW_EEXHAUSTED,
						 "cuda forward: no free mask slot (%u)", l->mask_slots);
			if (miss)
				up_seq[(*n_up)++] = i;
			si[GPUD_CUDA_SI_SLOT] = (uint32_t)k;
			si[GPUD_CUDA_SI_NPROMPT] = m->n_prompt;
			si[GPUD_CUDA_SI_NSEG] = m->n_segments;
			si[GPUD_CUDA_SI_NPB] = m->n_prompt_blocks;
		}
		for (uint32_t j = 0; j < s->n_tokens; j++) {
			seq[s->tok0 + j] = i;
			pos[s->tok0 + j] = s->pos0 + j;
		}
		/* at most n_tokens / att_tile + 1 per sequence: within max_tiles */
		for (uint32_t j = 0; j < s->n_tokens; j += l->att_tile) {
			uint32_t n = s->n_tokens - j < l->att_tile ? s->n_tokens - j : l->att_tile;

			tiles[(*n_tiles)++] = (s->tok0 + j) | (n - 1) << 16;
		}
		for (uint32_t j = 0; j < s->n_logits; j++)
			logit[s->logit0 + j] = s->tok0 + s->n_tokens - s->n_logits + j;
		if (s->draw && s->argmax && s->n_logits == 1) {
			uint32_t *dw = meta + l->m_draw + (size_t)s->logit0 * GPUD_CUDA_DRAW_WORDS;

			dw[GPUD_CUDA_DW_ON] = 1;
			meta[l->m_ndraw]++;
			memcpy(&dw[GPUD_CUDA_DW_TEMP], &s->draw->temperature, 4);
			memcpy(&dw[GPUD_CUDA_DW_TOPK], &s->draw->top_k, 4);
			memcpy(&dw[GPUD_CUDA_DW_TOPP], &s->draw->top_p, 4);
			memcpy(&dw[GPUD_CUDA_DW_MINP], &s->draw->min_p, 4);
			dw[GPUD_CUDA_DW_RAND_LO] = (uint32_t)s->draw->rand;
			dw[GPUD_CUDA_DW_RAND_HI] = (uint32_t)(s->draw->rand >> 32);
			if (s->draw->n_pen > GPUD_DRAW_MAX_PEN)
				return sw_seterr(err, errlen, -EINVAL,
						 "cuda forward: a draw with %u penalized tokens",
						 s->draw->n_pen);
			dw[GPUD_CUDA_DW_NPEN] = s->draw->n_pen;
			memcpy(&dw[GPUD_CUDA_DW_REPEAT], &s->draw->repeat_penalty, 4);
			memcpy(&dw[GPUD_CUDA_DW_FREQ], &s->draw->frequency_penalty, 4);
			memcpy(&dw[GPUD_CUDA_DW_PRES], &s->draw->presence_penalty, 4);
			memcpy(&dw[GPUD_CUDA_DW_PEN_ID], s->draw->pen_id, s->draw->n_pen * 4);
			memcpy(&dw[GPUD_CUDA_DW_PEN_N], s->draw->pen_n, s->draw->n_pen * 4);
		}
	}
	*n_words = l->m_btab + bt_used;
	return 0;
}

uint64_t gpud_cuda_draw_words(const struct gpud_fwd_batch *b)
{
	for (uint32_t i = 0; i < b->n_seqs; i++)
		if (b->seqs[i].draw && b->seqs[i].argmax && b->seqs[i].n_logits == 1)
			return (uint64_t)b->n_logits * GPUD_CUDA_DRAW_WORDS;
	return 0;
}

void gpud_cuda_argmax_pick(const uint64_t *keys, uint32_t n, int32_t *ids)
{
	for (uint32_t r = 0; r < n; r++) {
		const uint64_t *k = keys + (uint64_t)r * GPUD_CUDA_ARGMAX_PARTS;
		uint64_t best = 0;

		for (uint32_t p = 0; p < GPUD_CUDA_ARGMAX_PARTS; p++)
			best = k[p] > best ? k[p] : best;
		ids[r] = best ? (int32_t)(0xffffffffu - (uint32_t)best) : -1;
	}
}
