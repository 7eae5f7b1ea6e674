/* kernels_kq.c - K-quant weights (Q2_K..Q6_K), and Q4_1, Q5_0, Q5_1,
 * IQ4_NL, IQ4_XS (the last section), times int8 activations.
 *
 * The portable reference of the K-quant matmul; kernels.c dispatches here
 * for those types. Activations are quantized once per gpud_matmul call
 * exactly as for q8_0/q4_0 (kernels.c: blocks of 32, fp32 scale dx =
 * max|x| / 127, q = round(x / dx)), plus each block's quant sum xs
 * (Q2_K/Q3_K/Q6_K: its two 16-quant half sums, GPUD__ACT_HALVES, which
 * only the x86 kernel reads; the functions here sum what they need). The
 * 256-wide Q8_K format (one scale per super-block) would fold fewer floats
 * but is ~1.4x coarser on real activations (the logits error against the
 * double reference went from Q4_0's level to past its bound): 32-wide
 * blocks keep the K-quants within the other quantized types' bound.
 *
 * Every (row, column) pair is one fp32 accumulator, fed super-block by
 * super-block and, inside one, 32-chunk c = 0..7 in order:
 *     t    = sum over c's sub-blocks s of  sc[s] * (sum_j q_w[j] * q_x[j])
 *     mt   = sum over c's sub-blocks s of  m[s] * (sum of q_x over s)
 *     acc  = fma(d * dx[c], (float)t, acc)
 *     acc  = fma(-(dmin * dx[c]), (float)mt, acc)   (Q2_K, Q4_K, Q5_K)
 * with q_w the stored quant as quant.h decodes it (Q3_K -4..3, Q6_K
 * -32..31, the others unsigned), sc/m the sub-block integers, d and dmin
 * the fp16 factors in fp32, acc starting at 0. t and mt are exact int32
 * (worst, Q6_K: 2 * 128 * 32 * 127 * 16 < 2^25), so any exact integer
 * method gives the same t and mt and vector versions give the same bits.
 * A column's result never depends on its batch, tile or thread.
 */
#include <math.h>
#include <string.h>

#include "gpud/backend/cpu/kernels_impl.h"

bool gpud__kq_type(enum gpud_type t)
{
	return t == GPUD_TYPE_Q2_K || t == GPUD_TYPE_Q3_K || t == GPUD_TYPE_Q4_K ||
	       t == GPUD_TYPE_Q5_K || t == GPUD_TYPE_Q6_K;
}

/* Per 32-chunk c of a super-block: t = the chunk's scaled integer sum
 * (sum over its sub-blocks of sc * isum), mt = its min term (sum over its
 * sub-blocks of m * the sum of their x quants; 0 for Q3_K/Q6_K). */
struct kq_chunk {
	int32_t t, mt;
};

/* Folds the 8 chunks of one super-block into acc in order. */
static inline float kq_fold(float acc, float dw, float dmin, const float *xd,
			    const struct kq_chunk *ch, bool mins)
{
	for (int c = 0; c < 8; c++) {
		acc = fmaf(dw * xd[c], (float)ch[c].t, acc);
		if (mins)
			acc = fmaf(-(dmin * xd[c]), (float)ch[c].mt, acc);
	}
	return acc;
}

static float dot_q2_k(const void *vw, const int8_t *xq, const float *xd, const int32_t *xs,
		      int64_t nb, float acc)
{
	const struct gpud_block_q2_k *w = vw;

	(void)xs;
	for (int64_t i = 0; i < nb; i++, xq += GPUD_QK_K, xd += 8) {
		struct kq_chunk ch[8];

		for (int c = 0; c < 8; c++) {
			int h = c / 4, j = c % 4;

			ch[c].t = ch[c].mt = 0;
			for (int half = 0; half < 2; half++) {
				int s = 8 * h + 2 * j + half;
				int32_t is = 0, xsum = 0;

				for (int l = 16 * half; l < 16 * half + 16; l++) {
					is += ((w[i].qs[32 * h + l] >> (2 * j)) & 3) * xq[32 * c + l];
					xsum += xq[32 * c + l];
				}
				ch[c].t += (w[i].scales[s] & 15) * is;
				ch[c].mt += (w[i].scales[s] >> 4) * xsum;
			}
		}
		acc = kq_fold(acc, gpud_fp16_to_fp32(w[i].d), gpud_fp16_to_fp32(w[i].dmin), xd, ch,
			      true);
	}
	return acc;
}

static float dot_q3_k(const void *vw, const int8_t *xq, const float *xd, const int32_t *xs,
		      int64_t nb, float acc)
{
	const struct gpud_block_q3_k *w = vw;

	(void)xs;
	for (int64_t i = 0; i < nb; i++, xq += GPUD_QK_K, xd += 8) {
		struct kq_chunk ch[8];

		for (int c = 0; c < 8; c++) {
			int h = c / 4, j = c % 4;

			ch[c].t = ch[c].mt = 0;
			for (int half = 0; half < 2; half++) {
				int32_t is = 0;

				for (int l = 16 * half; l < 16 * half + 16; l++) {
					int q = ((w[i].qs[32 * h + l] >> (2 * j)) & 3) |
						((w[i].hmask[l] >> c) & 1) << 2;

					is += (q - 4) * xq[32 * c + l];
				}
				ch[c].t += gpud_q3k_scale(w[i].scales, 2 * c + half) * is;
			}
		}
		acc = kq_fold(acc, gpud_fp16_to_fp32(w[i].d), 0.0f, xd, ch, false);
	}
	return acc;
}

static float dot_q4_k(const void *vw, const int8_t *xq, const float *xd, const int32_t *xs,
		      int64_t nb, float acc)
{
	const struct gpud_block_q4_k *w = vw;

	for (int64_t i = 0; i < nb; i++, xq += GPUD_QK_K, xd += 8, xs += 8) {
		struct kq_chunk ch[8];

		for (int c = 0; c < 8; c++) {
			int sh = (c & 1) * 4;
			uint8_t sc, m;
			int32_t is = 0;

			for (int l = 0; l < 32; l++)
				is += ((w[i].qs[32 * (c / 2) + l] >> sh) & 15) * xq[32 * c + l];
			gpud_kq_scale_min(w[i].scales, c, &sc, &m);
			ch[c].t = sc * is;
			ch[c].mt = m * xs[c];
		}
		acc = kq_fold(acc, gpud_fp16_to_fp32(w[i].d), gpud_fp16_to_fp32(w[i].dmin), xd, ch,
			      true);
	}
	return acc;
}

static float dot_q5_k(const void *vw, const int8_t *xq, const float *xd, const int32_t *xs,
		      int64_t nb, float acc)
{
	const struct gpud_block_q5_k *w = vw;

	for (int64_t i = 0; i < nb; i++, xq += GPUD_QK_K, xd += 8, xs += 8) {
		struct kq_chunk ch[8];

		for (int c = 0; c < 8; c++) {
			int sh = (c & 1) * 4;
			uint8_t sc, m;
			int32_t is = 0;

			for (int l = 0; l < 32; l++) {
				int q = ((w[i].qs[32 * (c / 2) + l] >> sh) & 15) |
					((w[i].qh[l] >> c) & 1) << 4;

				is += q * xq[32 * c + l];
			}
			gpud_kq_scale_min(w[i].scales, c, &sc, &m);
			ch[c].t = sc * is;
			ch[c].mt = m * xs[c];
		}
		acc = kq_fold(acc, gpud_fp16_to_fp32(w[i].d), gpud_fp16_to_fp32(w[i].dmin), xd, ch,
			      true);
	}
	return acc;
}

static float dot_q6_k(const void *vw, const int8_t *xq, const float *xd, const int32_t *xs,
		      int64_t nb, float acc)
{
	const struct gpud_block_q6_k *w = vw;

	(void)xs;
	for (int64_t i = 0; i < nb; i++, xq += GPUD_QK_K, xd += 8) {
		struct kq_chunk ch[8];

		for (int c = 0; c < 8; c++) {
			int h = c / 4, k = c % 4;

			ch[c].t = ch[c].mt = 0;
			for (int half = 0; half < 2; half++) {
				int32_t is = 0;

				for (int l = 16 * half; l < 16 * half + 16; l++) {
					int lo = (w[i].ql[64 * h + l + 32 * (k & 1)] >> (k < 2 ? 0 : 4)) & 15;
					int hi = (w[i].qh[32 * h + l] >> (2 * k)) & 3;

					is += ((lo | hi << 4) - 32) * xq[32 * c + l];
				}
				ch[c].t += w[i].scales[2 * c + half] * is;
			}
		}
		acc = kq_fold(acc, gpud_fp16_to_fp32(w[i].d), 0.0f, xd, ch, false);
	}
	return acc;
}

void gpud__kq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK_K;
	float (*dot)(const void *, const int8_t *, const float *, const int32_t *, int64_t, float);

	switch (m->wtype) {
	case GPUD_TYPE_Q2_K: dot = dot_q2_k; break;
	case GPUD_TYPE_Q3_K: dot = dot_q3_k; break;
	case GPUD_TYPE_Q4_K: dot = dot_q4_k; break;
	case GPUD_TYPE_Q5_K: dot = dot_q5_k; break;
	case GPUD_TYPE_Q6_K: dot = dot_q6_k; break;
	default: return;
	}
	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *w = m->W + (size_t)r * m->wrow;
		const uint8_t *group = m->W + (size_t)(r & ~(int64_t)(GPUD__PK_ROWS - 1)) * m->wrow;

		for (int64_t b = 0; b < m->batch; b++) {
			const int8_t *xq = m->xq + b * m->cols;
			const float *xd = m->xd + b * nb * 8;
			const int32_t *xc = m->xc + b * nb * 8;
			uint8_t blk[sizeof(struct gpud_block_q6_k)];
			float acc = 0.0f;

			if (!m->packed) {
				/* The row stays in L1 while the batch walks over it. */
				m->y[b * m->rows + r] = dot(w, xq, xd, xc, nb, 0.0f);
				continue;
			}
			/* Packed: block by block, each unpacked to the plain
			 * layout, the same fold in the same order. */
			for (int64_t i = 0; i < nb; i++) {
				gpud__pk_unpack_block(m->wtype, group, r % GPUD__PK_ROWS, i, blk);
				acc = dot(blk, xq + i * GPUD_QK_K, xd + i * 8, xc + i * 8, 1, acc);
			}
			m->y[b * m->rows + r] = acc;
		}
	}
}

/* ---- the other 32-weight types: Q4_1, Q5_0, Q5_1, IQ4_NL, and IQ4_XS --
 * (quant.h's formats; llama.cpp writes the first four where a K-quant does
 * not fit a row. IQ4_XS is IQ4_NL's table in 256-weight super-blocks: each
 * 32-weight chunk is a block here, its d the chunk's dl = d * (ls - 32).)
 * The same activation blocks as every int8 path, with xc the blocks'
 * plain quant sums X (off -1), or -16 X for Q5_0 (off 16). Every (row,
 * column) pair is one fp32 accumulator fed block by block in order:
 *     t   = sum_j q_w[j] * q_x[j]          (exact int32)
 *     acc = fma(d * dx, (float)t, acc)
 *     acc = fma(m * dx, (float)X, acc)     (Q4_1, Q5_1: w = d * q + m)
 * with q_w the quant as stored for Q4_1/Q5_1 (0..15, 0..31), the signed
 * quant for Q5_0 (-16..15; the x86 kernel multiplies q + 16 and adds xc)
 * and IQ4_NL's table value (-127..113); d and m the fp16 factors in fp32.
 * |t| <= 32 * 127 * 127 < 2^24 and |X| <= 32 * 127: (float) is exact, so
 * vector versions give the same bits. */

bool gpud__lq_type(enum gpud_type t)
{
	return t == GPUD_TYPE_Q4_1 || t == GPUD_TYPE_Q5_0 || t == GPUD_TYPE_Q5_1 ||
	       t == GPUD_TYPE_IQ4_NL || t == GPUD_TYPE_IQ4_XS;
}

int32_t gpud__lq_act_off(enum gpud_type t)
{
	return t == GPUD_TYPE_Q5_0 ? 16 : -1;
}

/* Block blk of type t (IQ4_XS: chunk c of the super-block blk): its 32
 * quants as the fold multiplies them (above), d (IQ4_XS: the chunk's dl =
 * d * (ls - 32), one fp32 product) and m (0 for the types without one). */
static void lq_unpack(enum gpud_type t, const uint8_t *blk, int c, int32_t q[GPUD_QK], float *d,
		      float *m)
{
	static const int8_t nl[16] = GPUD_IQ4NL_VALUES;
	const uint8_t *qs, *qh = NULL;
	uint16_t h[2];

	memcpy(h, blk, sizeof(h));
	*d = gpud_fp16_to_fp32(h[0]);
	*m = 0.0f;
	switch (t) {
	case GPUD_TYPE_IQ4_XS: {
		struct gpud_block_iq4_xs b;

		memcpy(&b, blk, sizeof(b));
		*d *= (float)(gpud_iq4xs_ls(&b, c) - 32);
		qs = ((const struct gpud_block_iq4_xs *)blk)->qs + 16 * c;
		t = GPUD_TYPE_IQ4_NL; /* the same table from here */
		break;
	}
	case GPUD_TYPE_Q4_1:
		*m = gpud_fp16_to_fp32(h[1]);
		qs = ((const struct gpud_block_q4_1 *)blk)->qs;
		break;
	case GPUD_TYPE_Q5_0:
		qh = ((const struct gpud_block_q5_0 *)blk)->qh;
		qs = ((const struct gpud_block_q5_0 *)blk)->qs;
		break;
	case GPUD_TYPE_Q5_1:
		*m = gpud_fp16_to_fp32(h[1]);
		qh = ((const struct gpud_block_q5_1 *)blk)->qh;
		qs = ((const struct gpud_block_q5_1 *)blk)->qs;
		break;
	default: /* IQ4_NL */
		qs = ((const struct gpud_block_iq4_nl *)blk)->qs;
		break;
	}
	for (int j = 0; j < GPUD_QK; j++) {
		int v = j < GPUD_QK / 2 ? qs[j] & 15 : qs[j - GPUD_QK / 2] >> 4;

		if (qh)
			v |= gpud_q5_hbit(qh, j) << 4;
		q[j] = t == GPUD_TYPE_IQ4_NL ? nl[v] : t == GPUD_TYPE_Q5_0 ? v - 16 : v;
	}
}

void gpud__lq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK;
	const size_t bsz = gpud_type_block_bytes(m->wtype);
	const bool mins = m->wtype == GPUD_TYPE_Q4_1 || m->wtype == GPUD_TYPE_Q5_1;
	/* 32-weight blocks per stored block: IQ4_XS's chunks */
	const int64_t per = m->wtype == GPUD_TYPE_IQ4_XS ? GPUD_QK_K / GPUD_QK : 1;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *w = m->W + (size_t)r * m->wrow;
		const uint8_t *group = m->W + (size_t)(r & ~(int64_t)(GPUD__PK_ROWS - 1)) * m->wrow;

		for (int64_t b = 0; b < m->batch; b++) {
			const int8_t *xq = m->xq + b * m->cols;
			const float *xd = m->xd + b * nb;
			const int32_t *xc = m->xc + b * nb;
			float acc = 0.0f;

			for (int64_t i = 0; i < nb; i++) {
				int32_t q[GPUD_QK], t = 0;
				uint8_t blk[sizeof(struct gpud_block_iq4_xs)];
				float d, mn;

				if (m->packed) /* the block back in the plain layout */
					gpud__pk_unpack_block(m->wtype, group, r % GPUD__PK_ROWS,
							      i / per, blk);
				lq_unpack(m->wtype, m->packed ? blk : w + (size_t)(i / per) * bsz,
					  (int)(i % per), q, &d, &mn);
				for (int j = 0; j < GPUD_QK; j++)
					t += q[j] * xq[GPUD_QK * i + j];
				acc = fmaf(d * xd[i], (float)t, acc);
				if (mins)
					acc = fmaf(mn * xd[i], (float)xc[i], acc);
			}
			m->y[b * m->rows + r] = acc;
		}
	}
}
