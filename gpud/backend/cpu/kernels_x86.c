/* kernels_x86.c - AVX2/FMA/F16C kernels, chosen at run time.
 *
 * Every function carries a target attribute, so this file builds without
 * -mavx2 and nothing here runs unless kernels.c saw the features. The one
 * AVX-VNNI instruction is inline asm (see dpbusd_vex()), run only when
 * CPUID reports AVX-VNNI.
 *
 * Matmul, float types (f32/f16/bf16): multiplied as fp32. Each output
 * element owns one 8-lane fp32 accumulator that walks its row 8 columns at
 * a time, fma(w[c..c+8], x[c..c+8], acc), and is reduced by hsum8() at the
 * end. The tile shape only decides how many elements are in flight at
 * once, never the order of operations inside one element, so results do
 * not depend on the tiling, the batch or the thread count.
 *   batch 1:   tiles of 4 rows (4 weight streams in flight, prefetched);
 *   batch > 1: 3 rows x 4 columns (12 accumulators in registers, each
 *              weight converted once for 4 columns); bf16 from batch 8 on
 *              converts rows once per chunk into an L1 buffer shared by up
 *              to 32 columns, then runs 3x4 FMA tiles.
 * Matmul, q8_0/q4_0: the int8 path (8-row tiles, vpdpbusd with AVX-VNNI,
 * maddubs/madd without), see "int8 path" below; same bits as portable.
 * Float types may have a width that is not a multiple of 8: the last
 * columns are added after hsum8(), in order, by tail_dot() in every path.
 * With AVX-512 (kernels_avx512.c) packed f16, and with AVX-512 VNNI packed
 * q8_0/q4_0 (whole pairs of 8-row groups, at every batch), take 16-lane
 * versions of these kernels, the same bits.
 */
#include "gpud/backend/cpu/kernels_impl.h"

#ifdef GPUD_HAVE_X86

#include <immintrin.h>
#include "gpud/backend/cpu/x86_inline.h"
#include <string.h>

/* Every entry point starts on a 64-byte line: a kernel's speed then does
 * not depend on the size of unrelated code linked before it (a 48-byte
 * shift of the q4_0 kernel cost 3% at batch 4 in bench_matmul). */
#define TGT __attribute__((target("avx2,fma,f16c"), aligned(64)))
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

/* ---- buffered path: bf16 from batch 8 on ------------------------------
 * Three rows are converted to fp32 into a small buffer, QB_KC columns at a
 * time, and every batch column runs fp32 FMAs against it: the conversion
 * is paid once per row chunk for up to QB_BC columns.
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
	for (int64_t c = 0; c < kc; c += 8)
		_mm256_store_ps(out + c, row ? load8(T, row, k0 + c) : _mm256_setzero_ps());
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

/* ---- packed f16 and bf16 (pack.c: 16-row groups stored column by column)
 * Lane = row: the 16 rows' weights of column k are one 32-byte load, two
 * vectors of 8 after conversion, multiplied by column b's x[k] broadcast.
 * Each element is one fma chain in column order from 0,
 *     acc = fma(w[r][k], x[b][k], acc),   k = 0, 1, ..., cols - 1,
 * whatever the tile, so a column's result does not depend on its batch,
 * and the portable reader (kernels.c, fmaf in the same order) gives the
 * same bits. Tiles: 16 rows x 6 columns (12 accumulators; per column of
 * W, 2 conversions, 6 broadcasts, 12 fmas: the weights are read once per
 * 6 columns and x once per 16 rows, against 3 x 4 tiles' 8-lane x loads
 * of the plain layout), remainders of 1..5 columns; batch 1 takes 32 rows
 * (two groups) at a time. bf16 is the same kernel with its conversion (a
 * 16-bit shift: exact, as the portable reader's). */
#ifndef F16P_KC
#define F16P_KC 512 /* columns of W per pass: 16 KiB of a group, in L1 for every tile */
#endif

/* 8 weights of panel type T (f16; bf16: a 16-bit shift; f32) at p as
 * fp32 */
TGT_INLINE __m256 h8_ps(enum gpud_type T, const uint8_t *p)
{
	if (T == GPUD_TYPE_F32)
		return _mm256_loadu_ps((const float *)p);
	__m128i h = _mm_loadu_si128((const __m128i *)p);

	if (T == GPUD_TYPE_BF16)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	return _mm256_cvtph_ps(h);
}

/* Columns [k0, k1) of W into the tile's elements: from 0 at k0 == 0, else
 * from the partial sums left in y (stored and reloaded exactly, so the
 * chain is the same). */
TGT_INLINE void f16p_tile(const struct gpud__mm *m, enum gpud_type T, int64_t r, int G, int64_t b0,
			  int BT, int64_t k0, int64_t k1)
{
	const int64_t cols = m->cols;
	const size_t es = T == GPUD_TYPE_F32 ? 4 : 2;
	const uint8_t *g = m->W + (size_t)r * m->wrow;
	const float *x[6];
	__m256 acc[6][4];

#pragma GCC unroll 6
	for (int b = 0; b < BT; b++)
		x[b] = m->x + (b0 + b) * cols;
#pragma GCC unroll 6
	for (int b = 0; b < BT; b++)
#pragma GCC unroll 4
		for (int v = 0; v < 2 * G; v++)
			acc[b][v] = k0 ? _mm256_loadu_ps(m->y + (b0 + b) * m->rows + r + 8 * v)
				       : _mm256_setzero_ps();
	for (int64_t k = k0; k < k1; k++) {
		__m256 w[4];

#pragma GCC unroll 2
		for (int q = 0; q < G; q++) {
			const uint8_t *p = g + ((size_t)q * GPUD__PK_ROWS_F16 * (size_t)cols +
						GPUD__PK_ROWS_F16 * (size_t)k) * es;

			_mm_prefetch((const char *)p + PF_DIST, _MM_HINT_T0);
			w[2 * q] = h8_ps(T, p);
			w[2 * q + 1] = h8_ps(T, p + 8 * es);
		}
#pragma GCC unroll 6
		for (int b = 0; b < BT; b++) {
			__m256 xb = _mm256_broadcast_ss(x[b] + k);

#pragma GCC unroll 4
			for (int v = 0; v < 2 * G; v++)
				acc[b][v] = _mm256_fmadd_ps(w[v], xb, acc[b][v]);
		}
	}
#pragma GCC unroll 6
	for (int b = 0; b < BT; b++)
#pragma GCC unroll 4
		for (int v = 0; v < 2 * G; v++)
			_mm256_storeu_ps(m->y + (b0 + b) * m->rows + r + 8 * v, acc[b][v]);
}

/* Rows [r0, r1) of a packed f16, bf16 or f32 (T) matrix (r0, r1
 * multiples of 16). */
TGT_INLINE void rows_h16p(const struct gpud__mm *m, enum gpud_type T, int64_t r0, int64_t r1)
{
	int64_t r = r0;

	const int64_t cols = m->cols;
	/* the same bytes of W per pass: half the columns of f32 */
	const int64_t kc = T == GPUD_TYPE_F32 ? F16P_KC / 2 : F16P_KC;

	if (m->batch == 1) {
		for (; r + 32 <= r1; r += 32)
			f16p_tile(m, T, r, 2, 0, 1, 0, cols);
		for (; r < r1; r += 16)
			f16p_tile(m, T, r, 1, 0, 1, 0, cols);
		return;
	}
	for (; r < r1; r += 16) {
		for (int64_t k0 = 0; k0 < cols; k0 += kc) {
			int64_t k1 = cols - k0 < kc ? cols : k0 + kc, b = 0;

			for (; b + 6 <= m->batch; b += 6)
				f16p_tile(m, T, r, 1, b, 6, k0, k1);
			switch (m->batch - b) {
			case 5: f16p_tile(m, T, r, 1, b, 5, k0, k1); break;
			case 4: f16p_tile(m, T, r, 1, b, 4, k0, k1); break;
			case 3: f16p_tile(m, T, r, 1, b, 3, k0, k1); break;
			case 2: f16p_tile(m, T, r, 1, b, 2, k0, k1); break;
			case 1: f16p_tile(m, T, r, 1, b, 1, k0, k1); break;
			default: break;
			}
		}
	}
}

/* A packed f16, bf16 or f32 matrix: AVX-512 where it runs, else AVX2. */
TGT static void rows_panel(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	if (m->avx512)
		gpud__avx512_rows_f16p(m, r0, r1);
	else if (m->wtype == GPUD_TYPE_F16)
		rows_h16p(m, GPUD_TYPE_F16, r0, r1);
	else if (m->wtype == GPUD_TYPE_BF16)
		rows_h16p(m, GPUD_TYPE_BF16, r0, r1);
	else
		rows_h16p(m, GPUD_TYPE_F32, r0, r1);
}

DEFINE_ROWS_F(rows_f32, GPUD_TYPE_F32)
DEFINE_ROWS_F(rows_f16, GPUD_TYPE_F16)
DEFINE_ROWS_F(rows_bf16, GPUD_TYPE_BF16)

/* ---- int8 path: q8_0/q4_0 weights, quantized activations ---------------
 * The contract is in kernels.c ("int8 path"): per (row, column) pair and
 * weight block i, acc = fma(d_w * d_x, (float)isum, acc) in block order,
 * isum the exact integer dot product of the 32 quants.
 *
 * Tiles are 8 rows x the batch: the 8 rows' blocks i are loaded and
 * transposed (8x8 dwords) so that T[g] holds, in lane r, the 4 weight
 * bytes 4g..4g+3 of row r. A column's 4 quants 4g..4g+3 are broadcast to
 * every lane, so one vpdpbusd adds 4 products of each of the 8 rows: 8
 * instructions per block and column leave the 8 rows' isums in 8 lanes,
 * and the fp32 work (cvt, mul, fma) is one instruction each per 8 pairs.
 * Lane r of the column's accumulator is element (b, row r) itself: no
 * horizontal sum, and the tile only decides which lanes are computed
 * together, never the order of operations.
 *
 * vpdpbusd multiplies u8 by s8. VNNI: weights are the u8 operand, offset
 * to be non-negative (q8_0: w ^ 0x80 = w + 128; q4_0: the raw nibble,
 * w + 8) and the x quants (s8, |q| <= 127) the other; the offset is taken
 * back by starting the integer sum at c = -off * sum(x_q) of the block,
 * computed when x is quantized. AVX2 (no VNNI): maddubs + madd(1) give
 * the same sums but maddubs saturates its 16-bit pair sums, so q8_0 uses
 * |w| (u8, <= 128) times x with w's sign (|pair| <= 2 * 128 * 127 <
 * 32767), q4_0 the nibble times x plus c as above (<= 2 * 15 * 128).
 * Either way isum is exact, so every path gives the same bits. */

#define I8_ROWS 8
#define I8_BC 16 /* columns per pass over a row group (accumulators on stack) */




/* Block i of the 8 rows w[]: transposed weight bytes (see above; for q8_0
 * on VNNI offset by 128, for q4_0 the nibbles) and the 8 scales. pfrow is
 * the matrix's row stride in bytes. */
TGT_INLINE void i8_load(enum gpud_type QT, bool vnni, const uint8_t *const w[I8_ROWS],
			int64_t i, __m256i T[8], __m256 *dw, size_t pfrow)
{
	const size_t bsz = QT == GPUD_TYPE_Q8_0 ? sizeof(struct gpud_block_q8_0)
					       : sizeof(struct gpud_block_q4_0);
	__m256i R[I8_ROWS];
	uint16_t h[I8_ROWS];

#pragma GCC unroll 8
	for (int r = 0; r < I8_ROWS; r++) {
		const uint8_t *blk = w[r] + (size_t)i * bsz;

		/* The same block of the next row group (rows r + 8..r + 15),
		 * read one group later: a whole group (8 rows) ahead. This beat
		 * PF_DIST bytes along the row on cold batch-1 calls (768-column
		 * rows are shorter than PF_DIST, so that landed in the current
		 * group). Past the slice or the matrix it is a harmless hint. */
		_mm_prefetch((const char *)blk + I8_ROWS * pfrow, _MM_HINT_T0);
		memcpy(&h[r], blk, sizeof(h[r]));
		if (QT == GPUD_TYPE_Q8_0) {
			R[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
			if (vnni)
				R[r] = _mm256_xor_si256(R[r], _mm256_set1_epi8((char)0x80));
		} else {
			__m128i b = _mm_loadu_si128((const __m128i *)(blk + 2));
			__m128i mask = _mm_set1_epi8(0xf);

			R[r] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask),
						_mm_and_si128(b, mask));
		}
	}
	transpose8(R, T);
	*dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* Block i of a packed row group g (pack.c): the same T[] and scales as
 * i8_load() gives for the plain rows, without the transpose. */
TGT_INLINE void i8_load_packed(enum gpud_type QT, bool vnni, const uint8_t *g, int64_t i,
			       __m256i T[8], __m256 *dw)
{
	const size_t unit = QT == GPUD_TYPE_Q8_0 ? 8 * sizeof(struct gpud_block_q8_0)
						: 8 * sizeof(struct gpud_block_q4_0);
	const uint8_t *u = g + (size_t)i * unit;
	const __m256i mask = _mm256_set1_epi8(0xf);

	for (size_t o = 0; o < unit; o += 64)
		_mm_prefetch((const char *)u + PF_DIST + o, _MM_HINT_T0);
	*dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u));
	if (QT == GPUD_TYPE_Q8_0) {
#pragma GCC unroll 8
		for (int q = 0; q < 8; q++) {
			T[q] = _mm256_loadu_si256((const __m256i *)(u + 16 + 32 * q));
			if (vnni)
				T[q] = _mm256_xor_si256(T[q], _mm256_set1_epi8((char)0x80));
		}
		return;
	}
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(u + 16 + 32 * q));

		T[q] = _mm256_and_si256(v, mask);
		T[q + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
	}
}

/* isum of the 8 rows (lanes) against one column's block xq[0..32). */
TGT_INLINE __m256i i8_isum(enum gpud_type QT, bool vnni, const __m256i T[8], const int8_t *xq,
			   int32_t c)
{
	if (vnni) {
		/* two chains of 4 to halve the dependency on vpdpbusd latency */
		__m256i s0 = _mm256_set1_epi32(c), s1 = _mm256_setzero_si256();

#pragma GCC unroll 4
		for (int g = 0; g < 8; g += 2) {
			s0 = dpbusd_vex(s0, T[g], bcast4(xq + 4 * g));
			s1 = dpbusd_vex(s1, T[g + 1], bcast4(xq + 4 * g + 4));
		}
		return _mm256_add_epi32(s0, s1);
	}
	const __m256i ones = _mm256_set1_epi16(1);

	if (QT == GPUD_TYPE_Q4_0) {
		/* A nibble pair times x is at most 2 * 15 * 127 = 3810 per i16
		 * lane, so the 8 products of a block add up in i16 without
		 * overflow (<= 30480): one widening vpmaddwd per block instead
		 * of 8, the same exact sum. Two chains for latency. */
		__m256i p0 = _mm256_maddubs_epi16(T[0], bcast4(xq));
		__m256i p1 = _mm256_maddubs_epi16(T[1], bcast4(xq + 4));

#pragma GCC unroll 4
		for (int g = 2; g < 8; g += 2) {
			p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(T[g], bcast4(xq + 4 * g)));
			p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(T[g + 1], bcast4(xq + 4 * g + 4)));
		}
		return _mm256_add_epi32(_mm256_set1_epi32(c),
					_mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
	}
	/* q8_0: |pair| <= 2 * 128 * 127 leaves no room to add in i16. */
	__m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();

#pragma GCC unroll 8
	for (int g = 0; g < 8; g++) {
		__m256i xb = bcast4(xq + 4 * g);
		__m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(T[g]), _mm256_sign_epi8(xb, T[g]));

		if (g & 1)
			s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, ones));
		else
			s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p, ones));
	}
	return _mm256_add_epi32(s0, s1);
}

TGT_INLINE void rows_i8(const struct gpud__mm *m, enum gpud_type QT, bool vnni, bool PK,
			int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK;

	for (int64_t r = r0; r < r1; r += I8_ROWS) {
		const int64_t nr = r1 - r < I8_ROWS ? r1 - r : I8_ROWS;
		const uint8_t *w[I8_ROWS];

		/* Rows past r1 repeat the last one; their lanes are dropped. */
		for (int k = 0; k < I8_ROWS; k++)
			w[k] = m->W + (size_t)(r + (k < nr ? k : nr - 1)) * m->wrow;
		for (int64_t b0 = 0; b0 < m->batch; b0 += I8_BC) {
			const int64_t bc = m->batch - b0 < I8_BC ? m->batch - b0 : I8_BC;
			__m256 acc[I8_BC];

			for (int64_t b = 0; b < bc; b++)
				acc[b] = _mm256_setzero_ps();
			for (int64_t i = 0; i < nb; i++) {
				__m256i T[8];
				__m256 dw;

				if (PK)
					i8_load_packed(QT, vnni, w[0], i, T, &dw);
				else
					i8_load(QT, vnni, w, i, T, &dw, m->wrow);
				for (int64_t b = 0; b < bc; b++) {
					const int64_t col = b0 + b;
					__m256i is = i8_isum(QT, vnni, T, m->xq + col * m->cols + i * GPUD_QK,
							     m->xc[col * nb + i]);
					__m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(m->xd[col * nb + i]));

					acc[b] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(is), acc[b]);
				}
			}
			for (int64_t b = 0; b < bc; b++) {
				float *y = m->y + (b0 + b) * m->rows + r;

				if (nr == I8_ROWS) {
					_mm256_storeu_ps(y, acc[b]);
				} else {
					float tmp[I8_ROWS];

					_mm256_storeu_ps(tmp, acc[b]);
					memcpy(y, tmp, sizeof(float) * (size_t)nr);
				}
			}
		}
	}
}

/* The int8 row functions: type x VNNI x packed (rows a multiple of 8, r0
 * on a group boundary), each its own copy of rows_i8. */
#define DEFINE_ROWS_I8(name, QT, VNNI, PK)                                      \
	TGT static void name(const struct gpud__mm *m, int64_t r0, int64_t r1) \
	{                                                                      \
		rows_i8(m, QT, VNNI, PK, r0, r1);                              \
	}

DEFINE_ROWS_I8(rows_i8_q8_vnni, GPUD_TYPE_Q8_0, true, false)
DEFINE_ROWS_I8(rows_i8_q8_avx2, GPUD_TYPE_Q8_0, false, false)
DEFINE_ROWS_I8(rows_i8_q4_vnni, GPUD_TYPE_Q4_0, true, false)
DEFINE_ROWS_I8(rows_i8_q4_avx2, GPUD_TYPE_Q4_0, false, false)
DEFINE_ROWS_I8(rows_i8_q8p_vnni, GPUD_TYPE_Q8_0, true, true)
DEFINE_ROWS_I8(rows_i8_q8p_avx2, GPUD_TYPE_Q8_0, false, true)
DEFINE_ROWS_I8(rows_i8_q4p_vnni, GPUD_TYPE_Q4_0, true, true)
DEFINE_ROWS_I8(rows_i8_q4p_avx2, GPUD_TYPE_Q4_0, false, true)

TGT void gpud__x86_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	/* Packed q8_0/q4_0 with AVX-512 VNNI: pairs of row groups there, a
	 * last single group here. (At batch 1 this kernel once read slower
	 * from DRAM than one 8-row stream, 44-50 against 55 GB/s on 3B q4_0:
	 * its prefetch missed every pair's second group, kernels_avx512.c's
	 * pf_pair(). Prefetched in read order it reads 62-68 against 49-54
	 * GB/s, and 1.7x faster on cached weights; q8_0 66-69 against
	 * 62-65. From batch 4 it is 1.2-1.6x, at 32 1.6-1.8x.) */
	if (m->packed && m->avx512vnni &&
	    (m->wtype == GPUD_TYPE_Q8_0 || m->wtype == GPUD_TYPE_Q4_0)) {
		int64_t r16 = r0 + (r1 - r0) / 16 * 16;

		gpud__avx512_rows_i8p(m, r0, r16);
		r0 = r16;
		if (r0 == r1)
			return;
	}
	switch (m->wtype) {
	case GPUD_TYPE_Q8_0:
		if (m->packed && m->vnni)
			rows_i8_q8p_vnni(m, r0, r1);
		else if (m->packed)
			rows_i8_q8p_avx2(m, r0, r1);
		else if (m->vnni)
			rows_i8_q8_vnni(m, r0, r1);
		else
			rows_i8_q8_avx2(m, r0, r1);
		break;
	case GPUD_TYPE_Q4_0:
		if (m->packed && m->vnni)
			rows_i8_q4p_vnni(m, r0, r1);
		else if (m->packed)
			rows_i8_q4p_avx2(m, r0, r1);
		else if (m->vnni)
			rows_i8_q4_vnni(m, r0, r1);
		else
			rows_i8_q4_avx2(m, r0, r1);
		break;
	case GPUD_TYPE_F32:
		if (m->packed)
			rows_panel(m, r0, r1);
		else
			rows_f32(m, r0, r1);
		break;
	case GPUD_TYPE_F16:
		if (m->packed)
			rows_panel(m, r0, r1);
		else
			rows_f16(m, r0, r1);
		break;
	case GPUD_TYPE_BF16:
		if (m->packed)
			rows_panel(m, r0, r1);
		else
			rows_bf16(m, r0, r1);
		break;
	default:
		break;
	}
}

/* ---- activation quantization (int8 path) ------------------------------ */

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

/* Same bytes as quantize_act_ref() in kernels.c: the same scale, the same
 * round-to-nearest-even of x * (1/d), the same special cases. */
TGT void gpud__x86_quantize_act(const float *x, int64_t n, int32_t off, int8_t *q, float *d,
				int32_t *c)
{
	const __m256 inf = _mm256_set1_ps(__builtin_inff()), sign = _mm256_set1_ps(-0.0f);

	for (int64_t i = 0; i < n / GPUD_QK; i++, x += GPUD_QK, q += GPUD_QK) {
		__m256 v[4], bad = _mm256_setzero_ps();
		float amax = amax32(x, v), id;
		__m256i s;
		__m128i s4;

		for (int k = 0; k < 4; k++)
			bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, v[k]), inf,
							      _CMP_NLT_UQ));
		if (_mm256_movemask_ps(bad) || !(amax >= GPUD__ACT_TINY)) {
			memset(q, 0, GPUD_QK);
			d[i] = _mm256_movemask_ps(bad) ? __builtin_nanf("") : 0.0f;
			c[i] = 0;
			continue;
		}
		d[i] = gpud__q8_scale(amax, &id);
		round_store32(v, id, q);
		s = _mm256_loadu_si256((const __m256i *)q);
		s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), s),
				      _mm256_set1_epi16(1));
		if (off == GPUD__ACT_HALVES) {
			/* lanes 0-3 sum the first 16 quants, 4-7 the second */
			s = _mm256_hadd_epi32(s, s);
			s = _mm256_hadd_epi32(s, s);
			c[i] = (int32_t)((uint32_t)(uint16_t)_mm256_cvtsi256_si32(s) |
					 (uint32_t)_mm256_extract_epi32(s, 4) << 16);
			continue;
		}
		s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
		s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
		s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
		c[i] = -off * _mm_cvtsi128_si32(s4);
	}
}

/* ---- rows: gpud_dequantize_row()'s bits ------------------------------- */

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
