/* kernels_kq.c - K-quant weights (Q2_K..Q6_K) times Q8_K activations.
 *
 * The portable reference of the K-quant matmul; kernels.c dispatches here
 * for those types. Each activation row is quantized once per gpud_matmul
 * call to Q8_K blocks (gpud_quantize_row(GPUD_TYPE_Q8_K): 256 int8 quants,
 * an fp32 scale dx and the 16 sums of each 16 quants). For every
 * (row, column) pair, super-block by super-block in order, exact integer
 * sums are formed and folded into one fp32 accumulator:
 *     sumi = sum over sub-blocks s of  sc[s] * (sum_j q_w[j] * q_x[j])
 *     summ = sum over sub-blocks s of  m[s] * (sum of q_x over s)
 *     acc  = fma(d * dx, (float)sumi, acc)
 *     acc  = fma(-(dmin * dx), (float)summ, acc)   (Q2_K, Q4_K, Q5_K)
 * with q_w the stored quant as quant.h decodes it (Q3_K -4..3, Q6_K
 * -32..31, the others unsigned), d and dmin the fp16 factors in fp32 and
 * acc starting at 0. All sums fit int32 (worst, Q6_K: 16 * 128 * 32 * 127
 * * 16 < 2^31), so any exact integer method gives the same sumi and summ:
 * vector versions give the same bits. A column's result never depends on
 * its batch, tile or thread.
 */
#include <math.h>
#include <string.h>

#include "gpud/backend/cpu/kernels_impl.h"

bool gpud__kq_type(enum gpud_type t)
{
	return t == GPUD_TYPE_Q2_K || t == GPUD_TYPE_Q3_K || t == GPUD_TYPE_Q4_K ||
	       t == GPUD_TYPE_Q5_K || t == GPUD_TYPE_Q6_K;
}

static float dot_q2_k(const void *vw, const struct gpud_block_q8_k *x, int64_t nb)
{
	const struct gpud_block_q2_k *w = vw;
	float acc = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		int32_t sumi = 0, summ = 0;

		for (int s = 0; s < 16; s++) {
			int h = s / 8, j = (s % 8) / 2, l0 = (s & 1) * 16;
			int32_t is = 0;

			for (int l = l0; l < l0 + 16; l++)
				is += ((w[i].qs[32 * h + l] >> (2 * j)) & 3) *
				      x[i].qs[128 * h + 32 * j + l];
			sumi += (w[i].scales[s] & 15) * is;
			summ += (w[i].scales[s] >> 4) * x[i].bsums[s];
		}
		acc = fmaf(gpud_fp16_to_fp32(w[i].d) * x[i].d, (float)sumi, acc);
		acc = fmaf(-(gpud_fp16_to_fp32(w[i].dmin) * x[i].d), (float)summ, acc);
	}
	return acc;
}

static float dot_q3_k(const void *vw, const struct gpud_block_q8_k *x, int64_t nb)
{
	const struct gpud_block_q3_k *w = vw;
	float acc = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		int32_t sumi = 0;

		for (int s = 0; s < 16; s++) {
			int h = s / 8, j = (s % 8) / 2, l0 = (s & 1) * 16;
			int32_t is = 0;

			for (int l = l0; l < l0 + 16; l++) {
				int q = ((w[i].qs[32 * h + l] >> (2 * j)) & 3) |
					((w[i].hmask[l] >> (4 * h + j)) & 1) << 2;

				is += (q - 4) * x[i].qs[128 * h + 32 * j + l];
			}
			sumi += gpud_q3k_scale(w[i].scales, s) * is;
		}
		acc = fmaf(gpud_fp16_to_fp32(w[i].d) * x[i].d, (float)sumi, acc);
	}
	return acc;
}

static float dot_q4_k(const void *vw, const struct gpud_block_q8_k *x, int64_t nb)
{
	const struct gpud_block_q4_k *w = vw;
	float acc = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		int32_t sumi = 0, summ = 0;

		for (int s = 0; s < 8; s++) {
			int c = s / 2, sh = (s & 1) * 4;
			uint8_t sc, m;
			int32_t is = 0;

			for (int l = 0; l < 32; l++)
				is += ((w[i].qs[32 * c + l] >> sh) & 15) * x[i].qs[32 * s + l];
			gpud_kq_scale_min(w[i].scales, s, &sc, &m);
			sumi += sc * is;
			summ += m * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1]);
		}
		acc = fmaf(gpud_fp16_to_fp32(w[i].d) * x[i].d, (float)sumi, acc);
		acc = fmaf(-(gpud_fp16_to_fp32(w[i].dmin) * x[i].d), (float)summ, acc);
	}
	return acc;
}

static float dot_q5_k(const void *vw, const struct gpud_block_q8_k *x, int64_t nb)
{
	const struct gpud_block_q5_k *w = vw;
	float acc = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		int32_t sumi = 0, summ = 0;

		for (int s = 0; s < 8; s++) {
			int c = s / 2, sh = (s & 1) * 4;
			uint8_t sc, m;
			int32_t is = 0;

			for (int l = 0; l < 32; l++) {
				int q = ((w[i].qs[32 * c + l] >> sh) & 15) | ((w[i].qh[l] >> s) & 1) << 4;

				is += q * x[i].qs[32 * s + l];
			}
			gpud_kq_scale_min(w[i].scales, s, &sc, &m);
			sumi += sc * is;
			summ += m * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1]);
		}
		acc = fmaf(gpud_fp16_to_fp32(w[i].d) * x[i].d, (float)sumi, acc);
		acc = fmaf(-(gpud_fp16_to_fp32(w[i].dmin) * x[i].d), (float)summ, acc);
	}
	return acc;
}

static float dot_q6_k(const void *vw, const struct gpud_block_q8_k *x, int64_t nb)
{
	const struct gpud_block_q6_k *w = vw;
	float acc = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		int32_t sumi = 0;

		for (int s = 0; s < 16; s++) {
			int h = s / 8, k = (s % 8) / 2, l0 = (s & 1) * 16;
			int32_t is = 0;

			for (int l = l0; l < l0 + 16; l++) {
				int lo = (w[i].ql[64 * h + l + 32 * (k & 1)] >> (k < 2 ? 0 : 4)) & 15;
				int hi = (w[i].qh[32 * h + l] >> (2 * k)) & 3;

				is += ((lo | hi << 4) - 32) * x[i].qs[128 * h + 32 * k + l];
			}
			sumi += w[i].scales[s] * is;
		}
		acc = fmaf(gpud_fp16_to_fp32(w[i].d) * x[i].d, (float)sumi, acc);
	}
	return acc;
}

void gpud__kq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK_K;
	float (*dot)(const void *, const struct gpud_block_q8_k *, int64_t);

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

		/* The row stays in L1 while the batch walks over it. */
		for (int64_t b = 0; b < m->batch; b++)
			m->y[b * m->rows + r] = dot(w, m->xk + b * nb, nb);
	}
}
