/* quant.c - the weight types' traits table and reference conversions.
 *
 * Plain C, one element or one block at a time: this is the definition of
 * every format, which backends' vector code must match bit for bit. It is
 * also what the GGUF writer quantizes with, so it avoids libm calls in its
 * loops (nearbyintf() and fmaxf() are calls at -O2 on x86-64).
 */
#include "gpud/quant.h"

#include <float.h>
#include <math.h>
#include <strings.h>

/* ---- row formats ------------------------------------------------------- */

/* v rounded to an integer, ties to even, as nearbyintf() in the default
 * rounding mode: adding and taking back 1.5 * 2^23 leaves no fraction bit
 * when |v| < 2^22; larger values come out larger than 127 in magnitude,
 * which is all the callers need to know of them. */
static inline float round_even(float v)
{
#if FLT_EVAL_METHOD == 0
	const float magic = 12582912.0f;

	return (v + magic) - magic;
#else
	return nearbyintf(v);
#endif
}

/* A Q8_0/Q4_0 block holding a NaN or an Inf: scale NaN, quants 0. */
#define FP16_NAN 0x7e00

static void quantize_f32(const float *x, void *y, int64_t n)
{
	memcpy(y, x, (size_t)n * sizeof(float));
}

static void dequantize_f32(const void *x, float *y, int64_t n)
{
	memcpy(y, x, (size_t)n * sizeof(float));
}

static void quantize_f16(const float *x, void *vy, int64_t n)
{
	uint16_t *y = vy;

	for (int64_t i = 0; i < n; i++)
		y[i] = gpud_fp32_to_fp16(x[i]);
}

static void dequantize_f16(const void *vx, float *y, int64_t n)
{
	const uint16_t *x = vx;

	for (int64_t i = 0; i < n; i++)
		y[i] = gpud_fp16_to_fp32(x[i]);
}

static void quantize_bf16(const float *x, void *vy, int64_t n)
{
	uint16_t *y = vy;

	for (int64_t i = 0; i < n; i++)
		y[i] = gpud_fp32_to_bf16(x[i]);
}

static void dequantize_bf16(const void *vx, float *y, int64_t n)
{
	const uint16_t *x = vx;

	for (int64_t i = 0; i < n; i++)
		y[i] = gpud_bf16_to_fp32(x[i]);
}

static void quantize_q8_0(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q8_0 *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
		float amax = 0.0f, d, id;
		bool finite = true;

		for (int j = 0; j < GPUD_QK; j++) {
			float a = fabsf(x[j]);

			finite &= a <= FLT_MAX;
			amax = a > amax ? a : amax;
		}
		if (!finite) {
			y[i].d = FP16_NAN;
			memset(y[i].qs, 0, sizeof(y[i].qs));
			continue;
		}
		d = amax / 127.0f;
		id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = gpud_fp32_to_fp16(d);
		for (int j = 0; j < GPUD_QK; j++) {
			float v = round_even(x[j] * id);

			/* In range, except in blocks so tiny (max |x| < 127 *
			 * 2^-128) that 1/d overflows: their fp16 d is 0, so the
			 * quants do not matter; -128, never an undefined cast. */
			y[i].qs[j] = v >= -128.0f && v <= 127.0f ? (int8_t)v : -128;
		}
	}
}

static void dequantize_q8_0(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q8_0 *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK; i++, y += GPUD_QK) {
		float d = gpud_fp16_to_fp32(x[i].d);

		for (int j = 0; j < GPUD_QK; j++)
			y[j] = d * (float)x[i].qs[j];
	}
}

static void quantize_q4_0(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q4_0 *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
		float amax = 0.0f, m = 0.0f, d, id;
		bool finite = true;

		for (int j = 0; j < GPUD_QK; j++) {
			float a = fabsf(x[j]);

			finite &= a <= FLT_MAX;
			if (a > amax) {
				amax = a;
				m = x[j];
			}
		}
		if (!finite) {
			y[i].d = FP16_NAN;
			memset(y[i].qs, 0x88, sizeof(y[i].qs));
			continue;
		}
		d = m / -8.0f;
		id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = gpud_fp32_to_fp16(d);
		for (int j = 0; j < GPUD_QK / 2; j++) {
			float va = x[j] * id + 8.5f, vb = x[j + GPUD_QK / 2] * id + 8.5f;
			/* min(15, trunc(v)), never an undefined cast: in blocks
			 * so tiny (max |x| < 8 * 2^-128) that 1/d overflows, v is
			 * +-Inf or NaN (0 * Inf), giving 15 or 0; their fp16 d is
			 * 0, so the quants do not matter. */
			int a = va >= 15.0f ? 15 : va > 0.0f ? (int)va : 0;
			int b = vb >= 15.0f ? 15 : vb > 0.0f ? (int)vb : 0;

			y[i].qs[j] = (uint8_t)(a | b << 4);
		}
	}
}

static void dequantize_q4_0(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q4_0 *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK; i++, y += GPUD_QK) {
		float d = gpud_fp16_to_fp32(x[i].d);

		for (int j = 0; j < GPUD_QK / 2; j++) {
			y[j] = d * (float)((x[i].qs[j] & 0xf) - 8);
			y[j + GPUD_QK / 2] = d * (float)((x[i].qs[j] >> 4) - 8);
		}
	}
}

/* ---- K-quants ----------------------------------------------------------
 * The formats are in quant.h. The quantizer is this file's own: each
 * sub-block's scale (and min) comes from a small search over candidate
 * scales around the range-based one, each refined by a least-squares fit
 * of the scale (and min) to the quants it gives; the best by squared
 * error wins. Quants are then chosen against the stored scales. */

#define KQ_TRIES 3 /* candidates each side of the range-based scale */

/* round(v) clamped to lo..hi; NaN (0 * Inf in degenerate blocks) gives lo. */
static inline int qround(float v, int lo, int hi)
{
	if (!(v >= (float)lo))
		return lo;
	if (v >= (float)hi)
		return hi;
	return (int)round_even(v);
}

static bool all_finite(const float *x, int n)
{
	bool ok = true;

	for (int j = 0; j < n; j++)
		ok &= fabsf(x[j]) <= FLT_MAX;
	return ok;
}

/* ---- the other 32-weight types: Q4_1, Q5_0, Q5_1, IQ4_NL --------------
 * Formats in quant.h. Q5_0 is quantized as Q4_0 (d = m / -16 from the first
 * x of largest |x|); Q4_1/Q5_1 from the block's range, x ~ d * q + min; the
 * quants are chosen against the stored (fp16) d and m. */

static void q5_put(uint8_t *qh, uint8_t *qs, int j, int q)
{
	if (j < GPUD_QK / 2)
		qs[j] = (uint8_t)((qs[j] & 0xf0) | (q & 15));
	else
		qs[j - GPUD_QK / 2] = (uint8_t)((qs[j - GPUD_QK / 2] & 0x0f) | (q & 15) << 4);
	if (q & 16)
		qh[j >> 3] |= (uint8_t)(1u << (j & 7));
}

static int nib_get(const uint8_t *qs, int j)
{
	return j < GPUD_QK / 2 ? qs[j] & 15 : qs[j - GPUD_QK / 2] >> 4;
}

/* One asymmetric block, x ~ d * q + m with q in 0..top: fp16 d and m,
 * quants into q[32]. */
static void quant_range(const float *x, int top, uint16_t *d16, uint16_t *m16, int *q)
{
	float lo = x[0], hi = x[0], d, m, id;

	for (int j = 1; j < GPUD_QK; j++) {
		lo = x[j] < lo ? x[j] : lo;
		hi = x[j] > hi ? x[j] : hi;
	}
	*d16 = gpud_fp32_to_fp16((hi - lo) / (float)top);
	*m16 = gpud_fp32_to_fp16(lo);
	d = gpud_fp16_to_fp32(*d16);
	m = gpud_fp16_to_fp32(*m16);
	id = d > 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < GPUD_QK; j++)
		q[j] = qround((x[j] - m) * id, 0, top);
}

static void quantize_q4_1(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q4_1 *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
		int q[GPUD_QK];

		memset(y[i].qs, 0, sizeof(y[i].qs));
		if (!all_finite(x, GPUD_QK)) {
			y[i].d = FP16_NAN;
			y[i].m = 0;
			continue;
		}
		quant_range(x, 15, &y[i].d, &y[i].m, q);
		for (int j = 0; j < GPUD_QK / 2; j++)
			y[i].qs[j] = (uint8_t)(q[j] | q[j + GPUD_QK / 2] << 4);
	}
}

static void dequantize_q4_1(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q4_1 *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK; i++, y += GPUD_QK) {
		float d = gpud_fp16_to_fp32(x[i].d), m = gpud_fp16_to_fp32(x[i].m);

		for (int j = 0; j < GPUD_QK; j++)
			y[j] = d * (float)nib_get(x[i].qs, j) + m;
	}
}

static void quantize_q5_0(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q5_0 *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
		float amax = 0.0f, mx = 0.0f, d, id;

		memset(y[i].qh, 0, sizeof(y[i].qh));
		memset(y[i].qs, 0, sizeof(y[i].qs));
		if (!all_finite(x, GPUD_QK)) {
			y[i].d = FP16_NAN;
			memset(y[i].qh, 0xff, sizeof(y[i].qh)); /* q = 16 - 16 = 0 */
			continue;
		}
		for (int j = 0; j < GPUD_QK; j++)
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				mx = x[j];
			}
		y[i].d = gpud_fp32_to_fp16(mx / -16.0f);
		d = gpud_fp16_to_fp32(y[i].d);
		id = d != 0.0f ? 1.0f / d : 0.0f;
		for (int j = 0; j < GPUD_QK; j++)
			q5_put(y[i].qh, y[i].qs, j, qround(x[j] * id, -16, 15) + 16);
	}
}

static void dequantize_q5_0(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q5_0 *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK; i++, y += GPUD_QK) {
		float d = gpud_fp16_to_fp32(x[i].d);

		for (int j = 0; j < GPUD_QK; j++)
			y[j] = d * (float)((nib_get(x[i].qs, j) | gpud_q5_hbit(x[i].qh, j) << 4) - 16);
	}
}

static void quantize_q5_1(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q5_1 *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
		int q[GPUD_QK];

		memset(y[i].qh, 0, sizeof(y[i].qh));
		memset(y[i].qs, 0, sizeof(y[i].qs));
		if (!all_finite(x, GPUD_QK)) {
			y[i].d = FP16_NAN;
			y[i].m = 0;
			continue;
		}
		quant_range(x, 31, &y[i].d, &y[i].m, q);
		for (int j = 0; j < GPUD_QK; j++)
			q5_put(y[i].qh, y[i].qs, j, q[j]);
	}
}

static void dequantize_q5_1(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q5_1 *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK; i++, y += GPUD_QK) {
		float d = gpud_fp16_to_fp32(x[i].d), m = gpud_fp16_to_fp32(x[i].m);

		for (int j = 0; j < GPUD_QK; j++)
			y[j] = d * (float)(nib_get(x[i].qs, j) | gpud_q5_hbit(x[i].qh, j) << 4) + m;
	}
}

static const int8_t iq4nl_values[16] = GPUD_IQ4NL_VALUES;

/* The index of the IQ4_NL value nearest v (the lower one on a tie). */
static int iq4nl_nearest(float v)
{
	int k = 0;

	if (!(v == v)) /* NaN: degenerate blocks only */
		return 8;
	while (k < 15 && v > 0.5f * (float)(iq4nl_values[k] + iq4nl_values[k + 1]))
		k++;
	return k;
}

/* The scale s for 32 finite values x ~ s * IQ4NL_VALUES[k]: candidates
 * around the one that puts the largest |x| on -127, each refined by least
 * squares over the values it picks (rounded to fp16 when half); the best
 * by squared error wins. 0 for an all-zero x. */
static float iq4nl_fit(const float *x, bool half)
{
	float amax = 0.0f, mx = 0.0f, best = FLT_MAX, bd = 0.0f;

	for (int j = 0; j < GPUD_QK; j++)
		if (fabsf(x[j]) > amax) {
			amax = fabsf(x[j]);
			mx = x[j];
		}
	if (amax == 0.0f)
		return 0.0f;
	for (int k = -KQ_TRIES; k <= KQ_TRIES; k++) {
		float s = mx / (-127.0f + 8.0f * (float)k), is = 1.0f / s, sv = 0, sv2 = 0;
		float err = 0, r;

		for (int j = 0; j < GPUD_QK; j++) {
			float v = (float)iq4nl_values[iq4nl_nearest(x[j] * is)];

			sv += v * x[j];
			sv2 += v * v;
		}
		if (!(sv2 > 0.0f))
			continue;
		r = sv / sv2;
		if (half)
			r = gpud_fp16_to_fp32(gpud_fp32_to_fp16(r));
		if (!(r != 0.0f))
			continue;
		for (int j = 0; j < GPUD_QK; j++) {
			float e = r * (float)iq4nl_values[iq4nl_nearest(x[j] / r)] - x[j];

			err += e * e;
		}
		if (err < best) {
			best = err;
			bd = r;
		}
	}
	return bd;
}

/* 16 bytes of nibbles: the indices of the values nearest x / dl (weight j
 * low, j + 16 high); all 8 (value 1, times 0) when dl is 0. */
static void iq4nl_put(const float *x, float dl, uint8_t *qs)
{
	float id = dl != 0.0f ? 1.0f / dl : 0.0f;

	for (int j = 0; j < GPUD_QK / 2; j++)
		qs[j] = (uint8_t)(iq4nl_nearest(x[j] * id) | iq4nl_nearest(x[j + GPUD_QK / 2] * id) << 4);
}

/* IQ4_NL: iq4nl_fit() with the fp16 rounding of the stored scale, then
 * the indices chosen against it. */
static void quantize_iq4_nl(const float *x, void *vy, int64_t n)
{
	struct gpud_block_iq4_nl *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
		memset(y[i].qs, 0x88, sizeof(y[i].qs));
		if (!all_finite(x, GPUD_QK)) {
			y[i].d = FP16_NAN;
			continue;
		}
		y[i].d = gpud_fp32_to_fp16(iq4nl_fit(x, true));
		iq4nl_put(x, gpud_fp16_to_fp32(y[i].d), y[i].qs);
	}
}

static void dequantize_iq4_nl(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_iq4_nl *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK; i++, y += GPUD_QK) {
		float d = gpud_fp16_to_fp32(x[i].d);

		for (int j = 0; j < GPUD_QK; j++)
			y[j] = d * (float)iq4nl_values[nib_get(x[i].qs, j)];
	}
}

/* IQ4_XS: each chunk's scale by iq4nl_fit(); the super-block's fp16 d
 * puts the largest |scale| on -32, the chunks' 6-bit ls = round(s / d) +
 * 32, and each chunk's indices are chosen against its dl = d * (ls - 32). */
static void quantize_iq4_xs(const float *x, void *vy, int64_t n)
{
	struct gpud_block_iq4_xs *y = vy;

	for (int64_t i = 0; i < n / GPUD_QK_K; i++, x += GPUD_QK_K) {
		float sc[8], smax = 0.0f, d, id;

		memset(&y[i], 0, sizeof(y[i]));
		if (!all_finite(x, GPUD_QK_K)) {
			y[i].d = FP16_NAN;
			continue;
		}
		for (int c = 0; c < 8; c++) {
			sc[c] = iq4nl_fit(x + GPUD_QK * c, false);
			smax = fabsf(sc[c]) > fabsf(smax) ? sc[c] : smax;
		}
		y[i].d = gpud_fp32_to_fp16(smax / -32.0f);
		d = gpud_fp16_to_fp32(y[i].d);
		id = d != 0.0f ? 1.0f / d : 0.0f;
		for (int c = 0; c < 8; c++) {
			int ls = qround(sc[c] * id, -32, 31) + 32;

			y[i].scales_l[c / 2] |= (uint8_t)((ls & 15) << (4 * (c % 2)));
			y[i].scales_h |= (uint16_t)(((ls >> 4) & 3) << (2 * c));
			iq4nl_put(x + GPUD_QK * c, d * (float)(ls - 32), y[i].qs + 16 * c);
		}
	}
}

static void dequantize_iq4_xs(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_iq4_xs *x = vx;

	for (int64_t i = 0; i < n / GPUD_QK_K; i++) {
		float d = gpud_fp16_to_fp32(x[i].d);

		for (int c = 0; c < 8; c++, y += GPUD_QK) {
			float dl = d * (float)(gpud_iq4xs_ls(&x[i], c) - 32);

			for (int j = 0; j < GPUD_QK; j++)
				y[j] = dl * (float)iq4nl_values[nib_get(x[i].qs + 16 * c, j)];
		}
	}
}

/* x ~ s * q - m, q in 0..nmax, s >= 0, m >= 0: the best scale and min
 * found for the n values of one sub-block. */
static void fit_asym(const float *x, int n, int nmax, float *s_out, float *m_out)
{
	float xmin = 0.0f, xmax = x[0], best = FLT_MAX;

	for (int j = 0; j < n; j++) {
		xmin = x[j] < xmin ? x[j] : xmin;
		xmax = x[j] > xmax ? x[j] : xmax;
	}
	*s_out = 0.0f;
	*m_out = -xmin;
	if (!(xmax > xmin))
		return;
	*s_out = (xmax - xmin) / (float)nmax;
	for (int k = -KQ_TRIES; k <= KQ_TRIES; k++) {
		float is = ((float)nmax + 0.15f * (float)k) / (xmax - xmin);
		float sq = 0, sq2 = 0, sx = 0, sxq = 0, s, m, err = 0;
		int q[32];

		for (int j = 0; j < n; j++) {
			q[j] = qround((x[j] - xmin) * is, 0, nmax);
			sq += (float)q[j];
			sq2 += (float)(q[j] * q[j]);
			sx += x[j];
			sxq += x[j] * (float)q[j];
		}
		/* Least squares x ~ s * q + b; b = -m must be <= 0. */
		{
			float den = (float)n * sq2 - sq * sq;

			if (den <= 0.0f)
				continue;
			s = ((float)n * sxq - sq * sx) / den;
			m = -(sx - s * sq) / (float)n;
			if (m < 0.0f) {
				m = 0.0f;
				s = sq2 > 0.0f ? sxq / sq2 : 0.0f;
			}
		}
		if (!(s > 0.0f))
			continue;
		for (int j = 0; j < n; j++) {
			float e = s * (float)q[j] - m - x[j];

			err += e * e;
		}
		if (err < best) {
			best = err;
			*s_out = s;
			*m_out = m;
		}
	}
}

/* x ~ s * q, q in -nneg..nneg-1 (s signed): the best scale found. */
static float fit_sym(const float *x, int n, int nneg)
{
	float amax = 0.0f, mx = 0.0f, best = FLT_MAX, bs = 0.0f;

	for (int j = 0; j < n; j++) {
		float a = fabsf(x[j]);

		if (a > amax) {
			amax = a;
			mx = x[j];
		}
	}
	if (amax == 0.0f)
		return 0.0f;
	bs = mx / -(float)nneg;
	for (int k = -KQ_TRIES; k <= KQ_TRIES; k++) {
		float is = -((float)nneg + 0.15f * (float)k) / mx;
		float sxq = 0, sq2 = 0, s, err = 0;
		int q[32];

		for (int j = 0; j < n; j++) {
			q[j] = qround(x[j] * is, -nneg, nneg - 1);
			sxq += x[j] * (float)q[j];
			sq2 += (float)(q[j] * q[j]);
		}
		if (sq2 <= 0.0f)
			continue;
		s = sxq / sq2;
		for (int j = 0; j < n; j++) {
			float e = s * (float)q[j] - x[j];

			err += e * e;
		}
		if (err < best) {
			best = err;
			bs = s;
		}
	}
	return bs;
}

/* Super-block factor for unsigned sub-block values v[n] quantized to
 * 0..top: stores fp16 d in *d16 and the integers in out[]. */
static void quant_unsigned(const float *v, int n, int top, uint16_t *d16, uint8_t *out)
{
	float vmax = 0.0f, d, id;

	for (int i = 0; i < n; i++)
		vmax = v[i] > vmax ? v[i] : vmax;
	*d16 = gpud_fp32_to_fp16(vmax / (float)top);
	d = gpud_fp16_to_fp32(*d16);
	id = d > 0.0f ? 1.0f / d : 0.0f;
	for (int i = 0; i < n; i++)
		out[i] = (uint8_t)qround(v[i] * id, 0, top);
}

/* Same for signed values to -nneg..nneg-1: d's sign makes the largest |v|
 * land on -nneg. */
static void quant_signed(const float *v, int n, int nneg, uint16_t *d16, int *out)
{
	float amax = 0.0f, mx = 0.0f, d, id;

	for (int i = 0; i < n; i++)
		if (fabsf(v[i]) > amax) {
			amax = fabsf(v[i]);
			mx = v[i];
		}
	*d16 = gpud_fp32_to_fp16(mx / -(float)nneg);
	d = gpud_fp16_to_fp32(*d16);
	id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int i = 0; i < n; i++)
		out[i] = qround(v[i] * id, -nneg, nneg - 1);
}

/* One asymmetric super-block (Q2_K/Q4_K/Q5_K): nsub sub-blocks of 256 /
 * nsub; 6-bit (top 63) or 4-bit (15) scales and mins; quants 0..nmax into
 * q[256]. */
static void kq_asym(const float *x, int nsub, int top, int nmax, uint16_t *d16,
		    uint16_t *dmin16, uint8_t *sc, uint8_t *mn, uint8_t *q)
{
	const int n = GPUD_QK_K / nsub;
	float s[16], m[16], d, dmin;

	for (int i = 0; i < nsub; i++)
		fit_asym(x + i * n, n, nmax, &s[i], &m[i]);
	quant_unsigned(s, nsub, top, d16, sc);
	quant_unsigned(m, nsub, top, dmin16, mn);
	d = gpud_fp16_to_fp32(*d16);
	dmin = gpud_fp16_to_fp32(*dmin16);
	for (int i = 0; i < nsub; i++) {
		float ds = d * (float)sc[i], dm = dmin * (float)mn[i];
		float id = ds > 0.0f ? 1.0f / ds : 0.0f;

		for (int j = 0; j < n; j++)
			q[i * n + j] = (uint8_t)qround((x[i * n + j] + dm) * id, 0, nmax);
	}
}

/* One symmetric super-block (Q3_K/Q6_K): 16 sub-blocks of 16, signed
 * scales -snneg..snneg-1, quants -nneg..nneg-1 into q[256]. */
static void kq_sym(const float *x, int snneg, int nneg, uint16_t *d16, int *sc, int *q)
{
	float s[16], d;

	for (int i = 0; i < 16; i++)
		s[i] = fit_sym(x + i * 16, 16, nneg);
	quant_signed(s, 16, snneg, d16, sc);
	d = gpud_fp16_to_fp32(*d16);
	for (int i = 0; i < 16; i++) {
		float ds = d * (float)sc[i];
		float id = ds != 0.0f ? 1.0f / ds : 0.0f;

		for (int j = 0; j < 16; j++)
			q[i * 16 + j] = qround(x[i * 16 + j] * id, -nneg, nneg - 1);
	}
}

static void quantize_q2_k(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q2_k *y = vy;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, x += GPUD_QK_K) {
		uint8_t sc[16], mn[16], q[GPUD_QK_K];

		memset(&y[b], 0, sizeof(y[b]));
		if (!all_finite(x, GPUD_QK_K)) {
			y[b].d = FP16_NAN;
			continue;
		}
		kq_asym(x, 16, 15, 3, &y[b].d, &y[b].dmin, sc, mn, q);
		for (int s = 0; s < 16; s++)
			y[b].scales[s] = (uint8_t)(sc[s] | mn[s] << 4);
		for (int e = 0; e < GPUD_QK_K; e++) {
			int h = e / 128, j = (e % 128) / 32, l = e % 32;

			y[b].qs[32 * h + l] |= (uint8_t)(q[e] << (2 * j));
		}
	}
}

static void dequantize_q2_k(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q2_k *x = vx;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, y += GPUD_QK_K) {
		float d = gpud_fp16_to_fp32(x[b].d), dmin = gpud_fp16_to_fp32(x[b].dmin);

		for (int e = 0; e < GPUD_QK_K; e++) {
			int h = e / 128, j = (e % 128) / 32, l = e % 32;
			int s = 8 * h + 2 * j + l / 16;
			int q = (x[b].qs[32 * h + l] >> (2 * j)) & 3;
			float dl = d * (float)(x[b].scales[s] & 15);
			float ml = dmin * (float)(x[b].scales[s] >> 4);

			y[e] = dl * (float)q - ml;
		}
	}
}

static void quantize_q3_k(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q3_k *y = vy;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, x += GPUD_QK_K) {
		int sc[16], q[GPUD_QK_K];

		memset(&y[b], 0, sizeof(y[b]));
		if (!all_finite(x, GPUD_QK_K)) {
			/* scales decoding to 0 (stored 32), quants 0 (stored 4) */
			for (int s = 0; s < 16; s++)
				sc[s] = 0;
			for (int e = 0; e < GPUD_QK_K; e++)
				q[e] = 0;
			y[b].d = FP16_NAN;
		} else {
			kq_sym(x, 32, 4, &y[b].d, sc, q);
		}
		for (int s = 0; s < 16; s++) {
			int v = sc[s] + 32;

			if (s < 8)
				y[b].scales[s] |= (uint8_t)(v & 15);
			else
				y[b].scales[s - 8] |= (uint8_t)((v & 15) << 4);
			y[b].scales[8 + s % 4] |= (uint8_t)((v >> 4) << (2 * (s / 4)));
		}
		for (int e = 0; e < GPUD_QK_K; e++) {
			int h = e / 128, j = (e % 128) / 32, l = e % 32, v = q[e] + 4;

			y[b].qs[32 * h + l] |= (uint8_t)((v & 3) << (2 * j));
			y[b].hmask[l] |= (uint8_t)((v >> 2) << (4 * h + j));
		}
	}
}

static void dequantize_q3_k(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q3_k *x = vx;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, y += GPUD_QK_K) {
		float d = gpud_fp16_to_fp32(x[b].d);

		for (int e = 0; e < GPUD_QK_K; e++) {
			int h = e / 128, j = (e % 128) / 32, l = e % 32;
			int s = 8 * h + 2 * j + l / 16;
			int q = ((x[b].qs[32 * h + l] >> (2 * j)) & 3) |
				((x[b].hmask[l] >> (4 * h + j)) & 1) << 2;
			float dl = d * (float)gpud_q3k_scale(x[b].scales, s);

			y[e] = dl * (float)(q - 4);
		}
	}
}

/* Packs 8 6-bit scales and 8 6-bit mins into Q4_K/Q5_K's 12 bytes. */
static void pack_scale_min(const uint8_t *sc, const uint8_t *mn, uint8_t *p)
{
	memset(p, 0, 12);
	for (int s = 0; s < 8; s++) {
		if (s < 4) {
			p[s] |= sc[s];
			p[s + 4] |= mn[s];
		} else {
			p[s + 4] = (uint8_t)((sc[s] & 15) | (mn[s] & 15) << 4);
			p[s - 4] |= (uint8_t)((sc[s] >> 4) << 6);
			p[s] |= (uint8_t)((mn[s] >> 4) << 6);
		}
	}
}

static void quantize_q4_k(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q4_k *y = vy;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, x += GPUD_QK_K) {
		uint8_t sc[8], mn[8], q[GPUD_QK_K];

		memset(&y[b], 0, sizeof(y[b]));
		if (!all_finite(x, GPUD_QK_K)) {
			y[b].d = FP16_NAN;
			continue;
		}
		kq_asym(x, 8, 63, 15, &y[b].d, &y[b].dmin, sc, mn, q);
		pack_scale_min(sc, mn, y[b].scales);
		for (int e = 0; e < GPUD_QK_K; e++) {
			int c = e / 64, l = e % 32;

			y[b].qs[32 * c + l] |= (uint8_t)(q[e] << (e % 64 < 32 ? 0 : 4));
		}
	}
}

static void dequantize_q4_k(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q4_k *x = vx;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, y += GPUD_QK_K) {
		float d = gpud_fp16_to_fp32(x[b].d), dmin = gpud_fp16_to_fp32(x[b].dmin);

		/* sub-block s (32 weights): nibbles of qs[32 * (s / 2) ..], low
		 * for even s, high for odd; its scale and min hoisted */
		for (int s = 0; s < 8; s++) {
			const uint8_t *qs = x[b].qs + 32 * (s / 2);
			int sh = s % 2 ? 4 : 0;
			uint8_t sc, m;
			float d1, m1;

			gpud_kq_scale_min(x[b].scales, s, &sc, &m);
			d1 = d * (float)sc;
			m1 = dmin * (float)m;
			for (int l = 0; l < 32; l++)
				y[32 * s + l] = d1 * (float)((qs[l] >> sh) & 15) - m1;
		}
	}
}

static void quantize_q5_k(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q5_k *y = vy;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, x += GPUD_QK_K) {
		uint8_t sc[8], mn[8], q[GPUD_QK_K];

		memset(&y[b], 0, sizeof(y[b]));
		if (!all_finite(x, GPUD_QK_K)) {
			y[b].d = FP16_NAN;
			continue;
		}
		kq_asym(x, 8, 63, 31, &y[b].d, &y[b].dmin, sc, mn, q);
		pack_scale_min(sc, mn, y[b].scales);
		for (int e = 0; e < GPUD_QK_K; e++) {
			int c = e / 64, l = e % 32, s = e / 32;

			y[b].qs[32 * c + l] |= (uint8_t)((q[e] & 15) << (e % 64 < 32 ? 0 : 4));
			y[b].qh[l] |= (uint8_t)((q[e] >> 4) << s);
		}
	}
}

static void dequantize_q5_k(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q5_k *x = vx;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, y += GPUD_QK_K) {
		float d = gpud_fp16_to_fp32(x[b].d), dmin = gpud_fp16_to_fp32(x[b].dmin);

		for (int s = 0; s < 8; s++) {
			const uint8_t *qs = x[b].qs + 32 * (s / 2);
			int sh = s % 2 ? 4 : 0;
			uint8_t sc, m;
			float d1, m1;

			gpud_kq_scale_min(x[b].scales, s, &sc, &m);
			d1 = d * (float)sc;
			m1 = dmin * (float)m;
			for (int l = 0; l < 32; l++)
				y[32 * s + l] = d1 * (float)(((qs[l] >> sh) & 15) |
							     ((x[b].qh[l] >> s) & 1) << 4) - m1;
		}
	}
}

static void quantize_q6_k(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q6_k *y = vy;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, x += GPUD_QK_K) {
		int sc[16], q[GPUD_QK_K];

		memset(&y[b], 0, sizeof(y[b]));
		if (!all_finite(x, GPUD_QK_K)) {
			for (int e = 0; e < GPUD_QK_K; e++)
				q[e] = 0;
			for (int s = 0; s < 16; s++)
				sc[s] = 0;
			y[b].d = FP16_NAN;
		} else {
			kq_sym(x, 128, 32, &y[b].d, sc, q);
		}
		for (int s = 0; s < 16; s++)
			y[b].scales[s] = (int8_t)sc[s];
		for (int e = 0; e < GPUD_QK_K; e++) {
			int h = e / 128, k = (e % 128) / 32, l = e % 32, v = q[e] + 32;

			y[b].ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((v & 15) << (k < 2 ? 0 : 4));
			y[b].qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * k));
		}
	}
}

static void dequantize_q6_k(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q6_k *x = vx;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, y += GPUD_QK_K) {
		float d = gpud_fp16_to_fp32(x[b].d);

		/* 32 weights at a time: half h, quarter k; scales of 16 */
		for (int g = 0; g < 8; g++) {
			int h = g / 4, k = g % 4, sh = k < 2 ? 0 : 4;
			const uint8_t *ql = x[b].ql + 64 * h + 32 * (k & 1), *qh = x[b].qh + 32 * h;
			float d0 = d * (float)x[b].scales[8 * h + 2 * k];
			float d1 = d * (float)x[b].scales[8 * h + 2 * k + 1];

			for (int l = 0; l < 32; l++) {
				int q = (((ql[l] >> sh) & 15) | ((qh[l] >> (2 * k)) & 3) << 4) - 32;

				y[32 * g + l] = (l < 16 ? d0 : d1) * (float)q;
			}
		}
	}
}

static void quantize_q8_k(const float *x, void *vy, int64_t n)
{
	struct gpud_block_q8_k *y = vy;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, x += GPUD_QK_K) {
		float amax = 0.0f, id;

		memset(&y[b], 0, sizeof(y[b]));
		if (!all_finite(x, GPUD_QK_K)) {
			y[b].d = NAN;
			continue;
		}
		for (int j = 0; j < GPUD_QK_K; j++)
			amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
		if (amax < 1e-30f) /* 1/d would overflow: an all-zero block */
			continue;
		y[b].d = amax / 127.0f;
		id = y[b].d != 0.0f ? 1.0f / y[b].d : 0.0f;
		for (int j = 0; j < GPUD_QK_K; j++) {
			y[b].qs[j] = (int8_t)qround(x[j] * id, -127, 127);
			y[b].bsums[j / 16] = (int16_t)(y[b].bsums[j / 16] + y[b].qs[j]);
		}
	}
}

static void dequantize_q8_k(const void *vx, float *y, int64_t n)
{
	const struct gpud_block_q8_k *x = vx;

	for (int64_t b = 0; b < n / GPUD_QK_K; b++, y += GPUD_QK_K)
		for (int j = 0; j < GPUD_QK_K; j++)
			y[j] = x[b].d * (float)x[b].qs[j];
}

/* ---- traits ------------------------------------------------------------ */

static const struct gpud_type_traits traits[GPUD_TYPE_COUNT] = {
	[GPUD_TYPE_F32] = {
		.name = "f32", .block_elems = 1, .block_bytes = 4, .matmul = true,
		.quantize = quantize_f32, .dequantize = dequantize_f32,
	},
	[GPUD_TYPE_F16] = {
		.name = "f16", .block_elems = 1, .block_bytes = 2, .matmul = true,
		.quantize = quantize_f16, .dequantize = dequantize_f16,
	},
	[GPUD_TYPE_Q4_0] = {
		.name = "q4_0", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_q4_0), .quantized = true, .matmul = true,
		.quantize = quantize_q4_0, .dequantize = dequantize_q4_0,
	},
	[GPUD_TYPE_Q4_1] = {
		.name = "q4_1", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_q4_1), .quantized = true, .matmul = true,
		.quantize = quantize_q4_1, .dequantize = dequantize_q4_1,
	},
	[GPUD_TYPE_Q5_0] = {
		.name = "q5_0", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_q5_0), .quantized = true, .matmul = true,
		.quantize = quantize_q5_0, .dequantize = dequantize_q5_0,
	},
	[GPUD_TYPE_Q5_1] = {
		.name = "q5_1", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_q5_1), .quantized = true, .matmul = true,
		.quantize = quantize_q5_1, .dequantize = dequantize_q5_1,
	},
	[GPUD_TYPE_IQ4_NL] = {
		.name = "iq4_nl", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_iq4_nl), .quantized = true, .matmul = true,
		.quantize = quantize_iq4_nl, .dequantize = dequantize_iq4_nl,
	},
	[GPUD_TYPE_IQ4_XS] = {
		.name = "iq4_xs", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_iq4_xs), .quantized = true, .matmul = true,
		.quantize = quantize_iq4_xs, .dequantize = dequantize_iq4_xs,
	},
	[GPUD_TYPE_Q8_0] = {
		.name = "q8_0", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_q8_0), .quantized = true, .matmul = true,
		.quantize = quantize_q8_0, .dequantize = dequantize_q8_0,
	},
	[GPUD_TYPE_Q2_K] = {
		.name = "q2_k", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_q2_k), .quantized = true, .matmul = true,
		.quantize = quantize_q2_k, .dequantize = dequantize_q2_k,
	},
	[GPUD_TYPE_Q3_K] = {
		.name = "q3_k", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_q3_k), .quantized = true, .matmul = true,
		.quantize = quantize_q3_k, .dequantize = dequantize_q3_k,
	},
	[GPUD_TYPE_Q4_K] = {
		.name = "q4_k", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_q4_k), .quantized = true, .matmul = true,
		.quantize = quantize_q4_k, .dequantize = dequantize_q4_k,
	},
	[GPUD_TYPE_Q5_K] = {
		.name = "q5_k", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_q5_k), .quantized = true, .matmul = true,
		.quantize = quantize_q5_k, .dequantize = dequantize_q5_k,
	},
	[GPUD_TYPE_Q6_K] = {
		.name = "q6_k", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_q6_k), .quantized = true, .matmul = true,
		.quantize = quantize_q6_k, .dequantize = dequantize_q6_k,
	},
	[GPUD_TYPE_Q8_K] = {
		.name = "q8_k", .block_elems = GPUD_QK_K,
		.block_bytes = sizeof(struct gpud_block_q8_k), .quantized = true, .matmul = false,
		.quantize = quantize_q8_k, .dequantize = dequantize_q8_k,
	},
	[GPUD_TYPE_BF16] = {
		.name = "bf16", .block_elems = 1, .block_bytes = 2, .matmul = true,
		.quantize = quantize_bf16, .dequantize = dequantize_bf16,
	},
};

/* ggml type names by id, including types this engine cannot run, so that a
 * rejection names what the file holds. NULL = id never assigned. */
static const char *const ggml_type_names[] = {
	[0] = "f32", [1] = "f16", [2] = "q4_0", [3] = "q4_1",
	[4] = "q4_2 (removed)", [5] = "q4_3 (removed)", [6] = "q5_0",
	[7] = "q5_1", [8] = "q8_0", [9] = "q8_1", [10] = "q2_k",
	[11] = "q3_k", [12] = "q4_k", [13] = "q5_k", [14] = "q6_k",
	[15] = "q8_k", [16] = "iq2_xxs", [17] = "iq2_xs", [18] = "iq3_xxs",
	[19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s", [22] = "iq2_s",
	[23] = "iq4_xs", [24] = "i8", [25] = "i16", [26] = "i32",
	[27] = "i64", [28] = "f64", [29] = "iq1_m", [30] = "bf16",
	[31] = "q4_0_4_4 (removed)", [32] = "q4_0_4_8 (removed)",
	[33] = "q4_0_8_8 (removed)", [34] = "tq1_0", [35] = "tq2_0",
	[36] = "iq4_nl_4_4 (removed)", [37] = "iq4_nl_4_8 (removed)",
	[38] = "iq4_nl_8_8 (removed)", [39] = "mxfp4",
};
#define GGML_N_TYPES (sizeof(ggml_type_names) / sizeof(ggml_type_names[0]))

const struct gpud_type_traits *gpud_type_traits(enum gpud_type t)
{
	if ((unsigned)t < GPUD_TYPE_COUNT && traits[t].name)
		return &traits[t];
	return NULL;
}

uint32_t gpud_type_block_elems(enum gpud_type t)
{
	const struct gpud_type_traits *tt = gpud_type_traits(t);

	return tt ? tt->block_elems : 0;
}

uint32_t gpud_type_block_bytes(enum gpud_type t)
{
	const struct gpud_type_traits *tt = gpud_type_traits(t);

	return tt ? tt->block_bytes : 0;
}

bool gpud_type_supported(enum gpud_type t)
{
	return gpud_type_traits(t) != NULL;
}

bool gpud_type_known(enum gpud_type t)
{
	return (unsigned)t < GGML_N_TYPES && ggml_type_names[t];
}

const char *gpud_type_name(enum gpud_type t)
{
	return gpud_type_known(t) ? ggml_type_names[t] : "?";
}

int gpud_type_parse(const char *s)
{
	if (!s)
		return -1;
	for (unsigned t = 0; t < GPUD_TYPE_COUNT; t++)
		if (traits[t].name && strcasecmp(s, traits[t].name) == 0)
			return (int)t;
	return -1;
}

size_t gpud_type_row_bytes(enum gpud_type t, uint64_t n)
{
	const struct gpud_type_traits *tt = gpud_type_traits(t);

	if (!tt)
		return 0;
	return (size_t)(n / tt->block_elems) * tt->block_bytes;
}

void gpud_quantize_row(enum gpud_type t, const float *x, void *y, int64_t n)
{
	const struct gpud_type_traits *tt = gpud_type_traits(t);

	if (tt)
		tt->quantize(x, y, n);
}

void gpud_dequantize_row(enum gpud_type t, const void *x, float *y, int64_t n)
{
	const struct gpud_type_traits *tt = gpud_type_traits(t);

	if (tt)
		tt->dequantize(x, y, n);
}
