/* kernels_x86.c - AVX2/FMA/F16C kernels, chosen at run time.
 *
 * Every function carries a target attribute, so this file builds without
 * -mavx2 and nothing here runs unless kernels.c saw the features.
 *
 * Matmul: every weight type is multiplied as fp32. Each output element
 * owns one 8-lane fp32 accumulator that walks its row 8 columns at a time,
 * fma(w[c..c+8], x[c..c+8], acc), and is reduced by hsum8() at the end;
 * w is the exact fp32 value of the weight (for q8_0/q4_0 d * q, the value
 * gpud_dequantize_row gives). The tile shape only decides how many
 * elements are in flight at once, never the order of operations inside
 * one element, so results do not depend on the tiling, the batch or the
 * thread count.
 *   batch 1:   tiles of 4 rows (4 weight streams in flight, prefetched:
 *              the decode case, bound by memory or by unpacking);
 *   batch > 1: f32/f16/bf16 in 3 rows x 4 columns (12 accumulators in
 *              registers, each weight converted once for 4 columns); q8_0/
 *              q4_0 batches of 2 and 3 unpack in registers for 4x2 and 3x3
 *              tiles; q8_0/q4_0 from batch 4 on and bf16 from 8 on unpack
 *              rows once per chunk into an L1 buffer shared by up to 32
 *              columns, then run 3x4 FMA tiles (FMA-bound).
 * Float types may have a width that is not a multiple of 8: the last
 * columns are added after hsum8(), in order, by tail_dot() in every path.
 */
#include "gpud/backend/cpu/kernels_impl.h"

#ifdef GPUD_HAVE_X86

#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Bytes ahead of the current weight block to prefetch, per row stream:
 * about a DRAM latency's worth at batch-1 speed. 2048 beat 768 on 32000x768
 * q8_0 cold reads in bench_matmul (noisy, shared machine). */
#ifndef PF_DIST
#define PF_DIST 2048
#endif

TGT_INLINE float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

TGT_INLINE float h2f(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* Q4_0 block -> 32 signed bytes in [-8, 7], weight order. */
TGT_INLINE __m256i unpack_q4(const uint8_t *qs)
{
	__m128i b = _mm_loadu_si128((const __m128i *)qs);
	__m128i mask = _mm_set1_epi8(0xf);
	__m128i lo = _mm_and_si128(b, mask);
	__m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
	__m256i v = _mm256_set_m128i(hi, lo);

	return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* One 32-weight block as four vectors of fp32 d * q (weight order). */
TGT_INLINE void deq32(enum gpud_type QT, const uint8_t *blk, __m256 w[4])
{
	uint16_t h;
	__m256 d;

	memcpy(&h, blk, sizeof(h));
	d = _mm256_set1_ps(h2f(h));
	if (QT == GPUD_TYPE_Q8_0) {
#pragma GCC unroll 4
		for (int s = 0; s < 4; s++) {
			__m128i q8 = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * s));

			w[s] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
		}
	} else {
		/* Bytes 0-7 and 8-15 widened to 32 bits: low nibbles are
		 * weights 0-15, high nibbles 16-31. n * d - 8 * d is exactly
		 * (n - 8) * d (both fit in 24 bits), so one fma does the
		 * offset and the scale, and only two shuffles are needed. */
		const __m256 m8d = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
		const __m256i mask = _mm256_set1_epi32(0xf);
		__m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2)));
		__m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 10)));

		w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), d, m8d);
		w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, mask)), d, m8d);
		w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, m8d);
		w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), d, m8d);
	}
}

/* Small batches (1 to 3), quantized weights: RT rows unpacked block by
 * block in registers, each unpacked block used by the BT columns. */
TGT_INLINE void tile_qr(const struct gpud__mm *m, enum gpud_type QT, int64_t r0, int RT,
			int BT)
{
	const int64_t nb = m->cols / GPUD_QK;
	const size_t bsz = QT == GPUD_TYPE_Q8_0 ? sizeof(struct gpud_block_q8_0)
					       : sizeof(struct gpud_block_q4_0);
	const uint8_t *w[4];
	__m256 acc[4][3];

#pragma GCC unroll 4
	for (int r = 0; r < RT; r++) {
		w[r] = m->W + (size_t)(r0 + r) * m->wrow;
#pragma GCC unroll 4
		for (int b = 0; b < BT; b++)
			acc[r][b] = _mm256_setzero_ps();
	}
	for (int64_t i = 0; i < nb; i++) {
#pragma GCC unroll 4
		for (int r = 0; r < RT; r++) {
			const uint8_t *blk = w[r] + (size_t)i * bsz;
			__m256 wv[4];

			_mm_prefetch((const char *)blk + PF_DIST, _MM_HINT_T0);
			deq32(QT, blk, wv);
#pragma GCC unroll 4
			for (int b = 0; b < BT; b++) {
				const float *x = m->x + b * m->cols + i * GPUD_QK;

#pragma GCC unroll 4
				for (int s = 0; s < 4; s++)
					acc[r][b] = _mm256_fmadd_ps(wv[s], _mm256_loadu_ps(x + 8 * s),
								    acc[r][b]);
			}
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
		for (int b = 0; b < BT; b++)
			m->y[b * m->rows + r0 + r] = hsum8(acc[r][b]);
}

/* Eight weights of a float-type row as fp32. */
TGT_INLINE __m256 load8(enum gpud_type FT, const uint8_t *row, int64_t c)
{
	if (FT == GPUD_TYPE_F32)
		return _mm256_loadu_ps((const float *)row + c);
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + c));
	if (FT == GPUD_TYPE_F16)
		return _mm256_cvtph_ps(h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

TGT_INLINE float load1(enum gpud_type FT, const uint8_t *row, int64_t c)
{
	uint16_t h;

	if (FT == GPUD_TYPE_F32) {
		float f;

		memcpy(&f, row + c * 4, sizeof(f));
		return f;
	}
	memcpy(&h, row + c * 2, sizeof(h));
	if (FT == GPUD_TYPE_F16)
		return h2f(h);
	return gpud_bf16_to_fp32(h);
}

/* Columns past the last multiple of 8 (float types only), added after the
 * vector sum in column order with explicit fmas, the same in every path. */
TGT_INLINE float tail_dot(enum gpud_type FT, const uint8_t *row, const float *x, int64_t c8,
			  int64_t cols, float s)
{
	for (int64_t c = c8; c < cols; c++)
		s = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(load1(FT, row, c)), _mm_set_ss(x[c]),
					       _mm_set_ss(s)));
	return s;
}

TGT_INLINE void tile_f(const struct gpud__mm *m, enum gpud_type FT, int64_t r0, int RT,
		       int64_t b0, int BT)
{
	const int64_t cols = m->cols, c8 = cols & ~(int64_t)7;
	const int esz = FT == GPUD_TYPE_F32 ? 4 : 2;
	const uint8_t *w[4];
	const float *x[4];
	__m256 acc[4][4];

	#pragma GCC unroll 4
	for (int r = 0; r < RT; r++)
		w[r] = m->W + (size_t)(r0 + r) * m->wrow;
	#pragma GCC unroll 4
	for (int b = 0; b < BT; b++)
		x[b] = m->x + (b0 + b) * cols;
	#pragma GCC unroll 4
	for (int r = 0; r < RT; r++)
		#pragma GCC unroll 4
		for (int b = 0; b < BT; b++)
			acc[r][b] = _mm256_setzero_ps();

	for (int64_t c = 0; c < c8; c += 8) {
		__m256 wv[4];

		#pragma GCC unroll 4
		for (int r = 0; r < RT; r++) {
			_mm_prefetch((const char *)w[r] + c * esz + PF_DIST, _MM_HINT_T0);
			wv[r] = load8(FT, w[r], c);
		}
		#pragma GCC unroll 4
		for (int b = 0; b < BT; b++) {
			__m256 xv = _mm256_loadu_ps(x[b] + c);

			#pragma GCC unroll 4
			for (int r = 0; r < RT; r++)
				acc[r][b] = _mm256_fmadd_ps(wv[r], xv, acc[r][b]);
		}
	}
	#pragma GCC unroll 4
	for (int r = 0; r < RT; r++) {
		#pragma GCC unroll 4
		for (int b = 0; b < BT; b++) {
			m->y[(b0 + b) * m->rows + r0 + r] =
				tail_dot(FT, w[r], x[b], c8, cols, hsum8(acc[r][b]));
		}
	}
}

/* ---- buffered path: q8_0/q4_0 from batch 4 on, bf16 from 8 on ----------
 * Three rows are converted to fp32 (for q8_0/q4_0 w = d * q, the
 * dequantize_row values) into a small buffer, QB_KC columns at a time, and
 * every batch column runs fp32 FMAs against it: 4 FMAs per 32 weights and
 * column, the unpacking paid once per row chunk for up to QB_BC columns.
 * Partial accumulators wait in st.acc[] between column chunks, so each
 * element still sums its row in one fixed order. */
#define QB_ROWS 3
#ifndef QB_KC
#define QB_KC 512
#endif
#define QB_BC 32

struct qb_state {
	float w[QB_ROWS][QB_KC] __attribute__((aligned(32))); /* (3, QB_KC) */
	__m256 acc[QB_ROWS][QB_BC];                           /* (3, QB_BC) */
};

TGT_INLINE void qb_tile(const struct gpud__mm *m, struct qb_state *st, int64_t k0,
			int64_t kc, int64_t b0, int bi, int BT)
{
	const float *x[4];
	__m256 acc[QB_ROWS][4];

	for (int b = 0; b < BT; b++)
		x[b] = m->x + (b0 + bi + b) * m->cols + k0;
#pragma GCC unroll 4
	for (int r = 0; r < QB_ROWS; r++)
#pragma GCC unroll 4
		for (int b = 0; b < BT; b++)
			acc[r][b] = st->acc[r][bi + b];
	for (int64_t c = 0; c < kc; c += 8) {
		__m256 wv[QB_ROWS];

#pragma GCC unroll 4
		for (int r = 0; r < QB_ROWS; r++)
			wv[r] = _mm256_load_ps(&st->w[r][c]);
#pragma GCC unroll 4
		for (int b = 0; b < BT; b++) {
			__m256 xv = _mm256_loadu_ps(x[b] + c);

#pragma GCC unroll 4
			for (int r = 0; r < QB_ROWS; r++)
				acc[r][b] = _mm256_fmadd_ps(wv[r], xv, acc[r][b]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < QB_ROWS; r++)
#pragma GCC unroll 4
		for (int b = 0; b < BT; b++)
			st->acc[r][bi + b] = acc[r][b];
}

/* Columns [k0, k0 + kc) of one row as fp32; zeros when row is NULL
 * (padding rows past the end of the matrix). */
TGT_INLINE void buf_fill(enum gpud_type T, const uint8_t *row, int64_t k0, int64_t kc,
			 float *out)
{
	const size_t bsz = T == GPUD_TYPE_Q8_0 ? sizeof(struct gpud_block_q8_0)
					      : sizeof(struct gpud_block_q4_0);

	if (!row) {
		for (int64_t c = 0; c < kc; c += 8)
			_mm256_store_ps(out + c, _mm256_setzero_ps());
		return;
	}
	if (T != GPUD_TYPE_Q8_0 && T != GPUD_TYPE_Q4_0) {
		for (int64_t c = 0; c < kc; c += 8)
			_mm256_store_ps(out + c, load8(T, row, k0 + c));
		return;
	}
	for (int64_t i = 0; i < kc / GPUD_QK; i++) {
		__m256 wv[4];

		deq32(T, row + (size_t)(k0 / GPUD_QK + i) * bsz, wv);
#pragma GCC unroll 4
		for (int k = 0; k < 4; k++)
			_mm256_store_ps(out + 32 * i + 8 * k, wv[k]);
	}
}

TGT_INLINE void rows_buf(const struct gpud__mm *m, enum gpud_type T, int64_t r0, int64_t r1)
{
	const int64_t cols = m->cols, c8 = cols & ~(int64_t)7;
	struct qb_state st;

	for (int64_t r = r0; r < r1; r += QB_ROWS) {
		int64_t rt = r1 - r < QB_ROWS ? r1 - r : QB_ROWS;

		for (int64_t b0 = 0; b0 < m->batch; b0 += QB_BC) {
			int64_t bc = m->batch - b0 < QB_BC ? m->batch - b0 : QB_BC;
			int64_t bi;

			for (int i = 0; i < QB_ROWS; i++)
				for (int64_t b = 0; b < bc; b++)
					st.acc[i][b] = _mm256_setzero_ps();
			for (int64_t k0 = 0; k0 < c8; k0 += QB_KC) {
				int64_t kc = c8 - k0 < QB_KC ? c8 - k0 : QB_KC;

				for (int i = 0; i < QB_ROWS; i++)
					buf_fill(T, i < rt ? m->W + (size_t)(r + i) * m->wrow : NULL,
						 k0, kc, st.w[i]);
				for (bi = 0; bi + 4 <= bc; bi += 4)
					qb_tile(m, &st, k0, kc, b0, (int)bi, 4);
				for (; bi < bc; bi++)
					qb_tile(m, &st, k0, kc, b0, (int)bi, 1);
			}
			for (int i = 0; i < rt; i++)
				for (int64_t b = 0; b < bc; b++)
					m->y[(b0 + b) * m->rows + r + i] =
						tail_dot(T, m->W + (size_t)(r + i) * m->wrow,
							 m->x + (b0 + b) * cols, c8, cols,
							 hsum8(st.acc[i][b]));
		}
	}
}

/* Float-type rows [r0, r1): 4 x 1 tiles for batch 1, else 3 x 4 tiles and
 * single columns for the batch tail (and single rows for the row tail);
 * bf16 from batch 8 on through the buffered path (one conversion for up to
 * 32 columns instead of 4; measured faster from 8 on, while F16C's
 * conversion is cheap enough that f16 never gains). */
#define DEFINE_ROWS_F(name, T)                                                 \
	TGT static void name(const struct gpud__mm *m, int64_t r0, int64_t r1) \
	{                                                                      \
		const int64_t nbt = m->batch;                                  \
		int64_t r = r0, b;                                             \
                                                                               \
		if (T == GPUD_TYPE_BF16 && nbt >= 8) {                         \
			rows_buf(m, T, r0, r1);                                \
			return;                                                \
		}                                                              \
		if (nbt == 1) {                                                \
			for (; r + 4 <= r1; r += 4)                            \
				tile_f(m, T, r, 4, 0, 1);                      \
		} else {                                                       \
			for (; r + 3 <= r1; r += 3) {                          \
				for (b = 0; b + 4 <= nbt; b += 4)              \
					tile_f(m, T, r, 3, b, 4);              \
				for (; b < nbt; b++)                           \
					tile_f(m, T, r, 3, b, 1);              \
			}                                                      \
		}                                                              \
		for (; r < r1; r++) {                                          \
			for (b = 0; b + 4 <= nbt; b += 4)                      \
				tile_f(m, T, r, 1, b, 4);                      \
			for (; b < nbt; b++)                                   \
				tile_f(m, T, r, 1, b, 1);                      \
		}                                                              \
	}

DEFINE_ROWS_F(rows_f32, GPUD_TYPE_F32)
DEFINE_ROWS_F(rows_f16, GPUD_TYPE_F16)
DEFINE_ROWS_F(rows_bf16, GPUD_TYPE_BF16)

/* Quantized rows [r0, r1): batches of 1 to 3 in register tiles (4x1, 4x2,
 * 3x3), larger ones through the dequantized buffer. */
#define ROWS_QR(RT, BT)                                 \
	do {                                            \
		for (; r + RT <= r1; r += RT)           \
			tile_qr(m, QT, r, RT, BT);      \
		for (; r < r1; r++)                     \
			tile_qr(m, QT, r, 1, BT);       \
	} while (0)

TGT_INLINE void rows_q(const struct gpud__mm *m, enum gpud_type QT, int64_t r0, int64_t r1)
{
	int64_t r = r0;

	switch (m->batch) {
	case 1:
		ROWS_QR(4, 1);
		break;
	case 2:
		ROWS_QR(4, 2);
		break;
	case 3:
		ROWS_QR(3, 3);
		break;
	default:
		rows_buf(m, QT, r0, r1);
		break;
	}
}

TGT void gpud__x86_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	switch (m->wtype) {
	case GPUD_TYPE_Q8_0:
		rows_q(m, GPUD_TYPE_Q8_0, r0, r1);
		break;
	case GPUD_TYPE_Q4_0:
		rows_q(m, GPUD_TYPE_Q4_0, r0, r1);
		break;
	case GPUD_TYPE_F32:
		rows_f32(m, r0, r1);
		break;
	case GPUD_TYPE_F16:
		rows_f16(m, r0, r1);
		break;
	case GPUD_TYPE_BF16:
		rows_bf16(m, r0, r1);
		break;
	default:
		break;
	}
}

/* ---- quantization ------------------------------------------------------ */

/* max |x| over 32 floats; exact, so equal to the scalar loop's result. */
TGT_INLINE float amax32(const float *x, __m256 v[4])
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	__m256 a;
	__m128 s;

	for (int k = 0; k < 4; k++)
		v[k] = _mm256_loadu_ps(x + 8 * k);
	a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
			  _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
	s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* round(v * id) to 32 int8, ties to even like nearbyintf(). */
TGT_INLINE void round_store32(const __m256 v[4], float id, int8_t *out)
{
	const __m256 vid = _mm256_set1_ps(id);
	__m256i q[4], p;

	for (int k = 0; k < 4; k++)
		q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], vid),
							  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
	/* The packs interleave 128-bit lanes: put the dwords back in order. */
	p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)out, p);
}

TGT bool gpud__x86_quantize_row(enum gpud_type t, const float *x, void *vy, int64_t n)
{
	int64_t i = 0;

	switch (t) {
	case GPUD_TYPE_F16: {
		uint16_t *y = vy;

		for (; i + 8 <= n; i += 8)
			_mm_storeu_si128((__m128i *)(y + i),
					 _mm256_cvtps_ph(_mm256_loadu_ps(x + i),
							 _MM_FROUND_TO_NEAREST_INT));
		for (; i < n; i++)
			y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
		return true;
	}
	case GPUD_TYPE_Q8_0: {
		struct gpud_block_q8_0 *y = vy;

		for (i = 0; i < n / GPUD_QK; i++, x += GPUD_QK) {
			__m256 v[4];
			float id, d = gpud__q8_scale(amax32(x, v), &id);
			uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);

			memcpy(&y[i].d, &h, sizeof(h));
			round_store32(v, id, y[i].qs);
		}
		return true;
	}
	default:
		return false; /* f32 is a copy; bf16 and q4_0 stay portable */
	}
}

TGT bool gpud__x86_dequantize_row(enum gpud_type t, const void *vx, float *y, int64_t n)
{
	int64_t i = 0;

	switch (t) {
	case GPUD_TYPE_F16:
	case GPUD_TYPE_BF16: {
		const uint16_t *x = vx;

		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps(y + i, t == GPUD_TYPE_F16
				? load8(GPUD_TYPE_F16, vx, i) : load8(GPUD_TYPE_BF16, vx, i));
		for (; i < n; i++)
			y[i] = t == GPUD_TYPE_F16 ? h2f(x[i]) : gpud_bf16_to_fp32(x[i]);
		return true;
	}
	case GPUD_TYPE_Q8_0:
	case GPUD_TYPE_Q4_0: {
		const size_t bsz = t == GPUD_TYPE_Q8_0 ? sizeof(struct gpud_block_q8_0)
						       : sizeof(struct gpud_block_q4_0);
		const uint8_t *blk = vx;

		for (i = 0; i < n / GPUD_QK; i++, blk += bsz, y += GPUD_QK) {
			uint16_t h;
			__m256i q;
			__m256 d;

			memcpy(&h, blk, sizeof(h));
			d = _mm256_set1_ps(h2f(h));
			if (t == GPUD_TYPE_Q8_0)
				q = _mm256_loadu_si256((const __m256i *)(blk + 2));
			else
				q = unpack_q4(blk + 2);
			for (int k = 0; k < 4; k++) {
				__m128i b8 = k < 2 ? _mm256_castsi256_si128(q)
						   : _mm256_extracti128_si256(q, 1);

				if (k & 1)
					b8 = _mm_srli_si128(b8, 8);
				_mm256_storeu_ps(y + 8 * k,
						 _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8))));
			}
		}
		return true;
	}
	default:
		return false;
	}
}

#endif /* GPUD_HAVE_X86 */
