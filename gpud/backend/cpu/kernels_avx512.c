/* kernels_avx512.c - AVX-512 kernels, chosen at run time.
 *
 * Like kernels_x86.c, every function carries its target attribute, so the
 * file builds without -mavx512f and nothing here runs unless kernels.c saw
 * AVX-512 F/BW/VL/DQ with the OS saving the ZMM state (GPUD_CPU_AVX512).
 * Each kernel gives the bits of the AVX2 kernel it stands in for: the
 * wider registers compute more elements at once, never another order of
 * operations inside one element.
 */
#include "gpud/backend/cpu/kernels_impl.h"

#ifdef GPUD_HAVE_X86

#include <immintrin.h>

#define TGT512_ATTR target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#define TGT512 __attribute__((TGT512_ATTR, aligned(64)))
#define TGT512_INLINE static inline __attribute__((always_inline, TGT512_ATTR))

#ifndef PF_DIST
#define PF_DIST 2048
#endif

/* ---- packed f16 and bf16 (pack.c: 16-row groups stored column by column)
 * A group's 16 weights of column k are one 32-byte load and, converted,
 * one ZMM: lane = row, as in kernels_x86.c's rows_f16p (two YMM there).
 * Each element is the same fma chain in column order from 0,
 *     acc = fma(w[r][k], x[b][k], acc),   k = 0, 1, ..., cols - 1,
 * so the bits are those of the AVX2 and portable readers of the layout.
 * With 32 ZMM registers a tile is 2 groups (32 rows) x 12 columns: 24
 * accumulators; per column k of W, 2 conversions, 12 broadcasts and 24
 * fmas, against the AVX2 tile's 2 conversions, 6 broadcasts and 12 fmas
 * of half the width. Prefill is compute-bound, so this is where the
 * doubled width shows. Batch 1 reads 4 groups at a time (4 independent
 * chains, 4 weight streams). */
#ifndef F16P512_KC
#define F16P512_KC 256 /* columns of W per pass: 16 KiB of 2 groups, in L1 for every tile */
#endif
#define F16P512_BT 12

/* 16 weights of panel type T (f16; bf16: a 16-bit shift; f32) at p as
 * fp32 */
TGT512_INLINE __m512 h16_ps(enum gpud_type T, const uint8_t *p)
{
	if (T == GPUD_TYPE_F32)
		return _mm512_loadu_ps((const float *)p);
	__m256i h = _mm256_loadu_si256((const __m256i *)p);

	if (T == GPUD_TYPE_BF16)
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
	return _mm512_cvtph_ps(h);
}

/* The next pass, fetched while the current one computes (not in
 * kernels_x86.c: the AVX2 kernel's passes hold twice the activations, and
 * there this was slower; bench/results/kernels-2026-12-02.md).
 * A batched pass over a panel streams its W columns (16 KiB) from DRAM
 * in its first tile only and then works from L1: left to the hardware,
 * the first tile asks for the bytes at several times the rate the memory
 * gives (f32 at batch 32: ~37 GB/s per core in bursts) and the later
 * tiles leave it idle. So every k of every batched tile asks for `per`
 * lines of the pass after, in order over its one or two group streams,
 * until all `n` are asked for. Prefetches only: no effect on the bits. */
struct h16_pf {
	const uint8_t *p[2]; /* line i is p[i & 1] + (i >> 1) * st */
	int64_t st, i, n;    /* the stride, lines asked for, lines of the pass */
	int per;	     /* lines per k */
};

/* The pass after (r, k0) in h16p512_rows's order over rows [r, r1) (kc
 * columns of two groups, or the last one, per pass, then the next 32 rows
 * from column 0) into *pf; `tiles` is the number of batched tiles per
 * pass, each one k step per column. */
TGT512_INLINE void h16_pf_next(struct h16_pf *pf, const struct gpud__mm *m, size_t es,
			       int64_t r, int64_t r1, int64_t k0, int64_t kc, int64_t tiles)
{
	const int64_t cols = m->cols;
	const int64_t steps = tiles * (cols - k0 < kc ? cols - k0 : kc);
	int64_t kn = k0 + kc, rn = r;

	pf->i = pf->n = 0;
	if (kn >= cols) {
		kn = 0;
		rn = r + 32;
	}
	if (rn >= r1 || steps <= 0)
		return;

	const int64_t kk = cols - kn < kc ? cols - kn : kc;
	const uint8_t *g = m->W + (size_t)rn * m->wrow + (size_t)GPUD__PK_ROWS_F16 * (size_t)kn * es;
	const int64_t lines = ((int64_t)GPUD__PK_ROWS_F16 * kk * (int64_t)es + 63) / 64;

	if (r1 - rn >= 32) { /* two groups: alternate their streams */
		pf->p[0] = g;
		pf->p[1] = g + (size_t)GPUD__PK_ROWS_F16 * (size_t)cols * es;
		pf->st = 64;
		pf->n = 2 * lines;
	} else { /* one: even lines from p[0], odd from p[1] */
		pf->p[0] = g;
		pf->p[1] = g + 64;
		pf->st = 128;
		pf->n = lines;
	}
	pf->per = (int)((pf->n + steps - 1) / steps);
}

/* One k step's share of the prefetches in *pf (hint T0: on this
 * machine's cores the lines go to L1 either way). */
#define H16_PF_STEP(pf)                                                                   \
	for (int pf_j_ = 0; pf_j_ < (pf)->per && (pf)->i < (pf)->n; pf_j_++, (pf)->i++)    \
	_mm_prefetch((const char *)(pf)->p[(pf)->i & 1] + ((pf)->i >> 1) * (pf)->st, _MM_HINT_T0)

/* Columns [k0, k1) of W into G groups x BT columns of elements: from 0 at
 * k0 == 0, else from the partial sums left in y (stored and reloaded
 * exactly, so the chain is the same). */
TGT512_INLINE void f16p512_tile(const struct gpud__mm *m, enum gpud_type T, int64_t r, int G,
				int64_t b0, int BT, int64_t k0, int64_t k1, struct h16_pf *pf)
{
	const int64_t cols = m->cols;
	const size_t es = T == GPUD_TYPE_F32 ? 4 : 2;
	const uint8_t *g = m->W + (size_t)r * m->wrow;
	const float *x[F16P512_BT];
	__m512 acc[F16P512_BT][4];

#pragma GCC unroll 12
	for (int b = 0; b < BT; b++)
		x[b] = m->x + (b0 + b) * cols;
#pragma GCC unroll 12
	for (int b = 0; b < BT; b++)
#pragma GCC unroll 4
		for (int q = 0; q < G; q++)
			acc[b][q] = k0 ? _mm512_loadu_ps(m->y + (b0 + b) * m->rows + r + 16 * q)
				       : _mm512_setzero_ps();
	for (int64_t k = k0; k < k1; k++) {
		__m512 w[4];

		if (BT > 1)
			H16_PF_STEP(pf);
#pragma GCC unroll 4
		for (int q = 0; q < G; q++) {
			const uint8_t *p = g + ((size_t)q * GPUD__PK_ROWS_F16 * (size_t)cols +
						GPUD__PK_ROWS_F16 * (size_t)k) * es;

			if (BT == 1)
				_mm_prefetch((const char *)p + PF_DIST, _MM_HINT_T0);
			w[q] = h16_ps(T, p);
		}
#pragma GCC unroll 12
		for (int b = 0; b < BT; b++) {
			__m512 xb = _mm512_set1_ps(x[b][k]);

#pragma GCC unroll 4
			for (int q = 0; q < G; q++)
				acc[b][q] = _mm512_fmadd_ps(w[q], xb, acc[b][q]);
		}
	}
#pragma GCC unroll 12
	for (int b = 0; b < BT; b++)
#pragma GCC unroll 4
		for (int q = 0; q < G; q++)
			_mm512_storeu_ps(m->y + (b0 + b) * m->rows + r + 16 * q, acc[b][q]);
}

/* All columns of the batch for G groups at r over W's columns [k0, k1):
 * tiles of 12, the rest as 8, 4, 2, 1. */
TGT512_INLINE void f16p512_cols(const struct gpud__mm *m, enum gpud_type T, int64_t r, int G,
				int64_t k0, int64_t k1, struct h16_pf *pf)
{
	int64_t b = 0;

	for (; b + F16P512_BT <= m->batch; b += F16P512_BT)
		f16p512_tile(m, T, r, G, b, F16P512_BT, k0, k1, pf);
	if (m->batch - b >= 8) {
		f16p512_tile(m, T, r, G, b, 8, k0, k1, pf);
		b += 8;
	}
	if (m->batch - b >= 4) {
		f16p512_tile(m, T, r, G, b, 4, k0, k1, pf);
		b += 4;
	}
	if (m->batch - b >= 2) {
		f16p512_tile(m, T, r, G, b, 2, k0, k1, pf);
		b += 2;
	}
	if (m->batch - b >= 1)
		f16p512_tile(m, T, r, G, b, 1, k0, k1, pf);
}

/* f16p512_cols's batched tiles (BT > 1) for a batch of b */
static inline int64_t f16p512_tiles(int64_t b)
{
	int64_t t = b / F16P512_BT;

	b %= F16P512_BT;
	t += b >= 8;
	b %= 8;
	t += b >= 4;
	b %= 4;
	return t + (b >= 2);
}

/* Rows [r0, r1) of a packed f16, bf16 or f32 (T) matrix (r0, r1
 * multiples of 16). */
TGT512_INLINE void h16p512_rows(const struct gpud__mm *m, enum gpud_type T, int64_t r0, int64_t r1)
{
	const int64_t cols = m->cols;
	/* the same bytes of W per pass: half the columns of f32 */
	const int64_t kc = T == GPUD_TYPE_F32 ? F16P512_KC / 2 : F16P512_KC;
	int64_t r = r0;

	const size_t es = T == GPUD_TYPE_F32 ? 4 : 2;
	const int64_t tiles = f16p512_tiles(m->batch);
	struct h16_pf pf = { 0 };

	if (m->batch == 1) {
		for (; r + 64 <= r1; r += 64)
			f16p512_tile(m, T, r, 4, 0, 1, 0, cols, &pf);
		for (; r < r1; r += 16)
			f16p512_tile(m, T, r, 1, 0, 1, 0, cols, &pf);
		return;
	}
	for (; r < r1; r += 32) {
		const int G = r1 - r >= 32 ? 2 : 1;

		for (int64_t k0 = 0; k0 < cols; k0 += kc) {
			int64_t k1 = cols - k0 < kc ? cols : k0 + kc;

			h16_pf_next(&pf, m, es, r, r1, k0, kc, tiles);
			if (G == 2)
				f16p512_cols(m, T, r, 2, k0, k1, &pf);
			else
				f16p512_cols(m, T, r, 1, k0, k1, &pf);
		}
	}
}

TGT512 void gpud__avx512_rows_f16p(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	if (m->wtype == GPUD_TYPE_BF16)
		h16p512_rows(m, GPUD_TYPE_BF16, r0, r1);
	else if (m->wtype == GPUD_TYPE_F32)
		h16p512_rows(m, GPUD_TYPE_F32, r0, r1);
	else
		h16p512_rows(m, GPUD_TYPE_F16, r0, r1);
}

/* ---- packed q8_0/q4_0 with AVX-512 VNNI ---------------------------------
 * kernels_x86.c's int8 path ("int8 path" there) on 16 lanes: two packed
 * 8-row groups side by side, group A's rows in lanes 0..7 and group B's in
 * 8..15, so each vpdpbusd adds 4 products of 16 rows. Per (row, column)
 * the operations are the VNNI kernel's: isum = c + the exact 32-product
 * dot product, acc = fma(d_w * d_x, (float)isum, acc) block by block, so
 * the bits are the same. */
#define TGT512V_ATTR target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define TGT512V __attribute__((TGT512V_ATTR, aligned(64)))
#define TGT512V_INLINE static inline __attribute__((always_inline, TGT512V_ATTR))
#define I8_BC512 16 /* columns per pass over a row pair (accumulators) */

/* Bytes prefetched ahead in each group, rounded up to whole units (6
 * of Q2_K: 2 lost the gain from DRAM, 6 and 8 were level). */
#define Q16_PF_BYTES 4032

/* The units pfu on from unit i of the pair of groups at a (the second
 * gstride bytes on) in the order they are read: past the end of a row,
 * the next pair's first ones. (Prefetched per group instead, group A's
 * overrun lands on group B's start, already read, and the next pair's
 * group B is never prefetched: the two streams then read ~10% slower
 * from DRAM than one on the 3B preset's 3072-column rows.) */
TGT512V_INLINE void pf_pair(const uint8_t *a, int64_t i, int64_t nb, size_t unit, size_t gstride,
			    int64_t pfu)
{
	const int64_t ip = i + pfu;
	const uint8_t *p = ip < nb ? a + (size_t)ip * unit : a + 2 * gstride + (size_t)(ip - nb) * unit;

#pragma GCC unroll 16
	for (size_t o = 0; o < unit; o += 64) {
		_mm_prefetch((const char *)p + o, _MM_HINT_T0);
		_mm_prefetch((const char *)p + gstride + o, _MM_HINT_T0);
	}
}

/* Block i of the packed groups at a and b = a + one group: T[g] lane r the
 * weight bytes 4g..4g+3 of row r (q8_0 offset by 128, q4_0 the nibbles),
 * *dw the 16 scales. */
TGT512V_INLINE void i8p512_load(enum gpud_type QT, const uint8_t *a, size_t gstride, int64_t i,
				int64_t nb, __m512i T[8], __m512 *dw)
{
	const size_t unit = QT == GPUD_TYPE_Q8_0 ? 8 * sizeof(struct gpud_block_q8_0)
						: 8 * sizeof(struct gpud_block_q4_0);
	const uint8_t *u = a + (size_t)i * unit, *v = u + gstride;

	pf_pair(a, i, nb, unit, gstride, (Q16_PF_BYTES + (int64_t)unit - 1) / (int64_t)unit);
	*dw = _mm512_cvtph_ps(_mm256_inserti128_si256(
		_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)u)),
		_mm_loadu_si128((const __m128i *)v), 1));
	if (QT == GPUD_TYPE_Q8_0) {
#pragma GCC unroll 8
		for (int q = 0; q < 8; q++) {
			__m512i t = _mm512_inserti64x4(
				_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(u + 16 + 32 * q))),
				_mm256_loadu_si256((const __m256i *)(v + 16 + 32 * q)), 1);

			T[q] = _mm512_xor_si512(t, _mm512_set1_epi8((char)0x80));
		}
		return;
	}
	const __m512i mask = _mm512_set1_epi8(0xf);

#pragma GCC unroll 4
	for (int q = 0; q < 4; q++) {
		__m512i t = _mm512_inserti64x4(
			_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(u + 16 + 32 * q))),
			_mm256_loadu_si256((const __m256i *)(v + 16 + 32 * q)), 1);

		T[q] = _mm512_and_si512(t, mask);
		T[q + 4] = _mm512_and_si512(_mm512_srli_epi16(t, 4), mask);
	}
}

TGT512V_INLINE __m512i bcast4_512(const int8_t *p)
{
	int32_t v;

	__builtin_memcpy(&v, p, sizeof(v));
	return _mm512_set1_epi32(v);
}

/* Rows [r, r + 16) x all columns. */
TGT512V_INLINE void i8p512_rows16(const struct gpud__mm *m, enum gpud_type QT, int64_t r)
{
	const int64_t nb = m->cols / GPUD_QK;
	const uint8_t *a = m->W + (size_t)r * m->wrow;
	const size_t gstride = 8 * m->wrow;

	for (int64_t b0 = 0; b0 < m->batch; b0 += I8_BC512) {
		const int64_t bc = m->batch - b0 < I8_BC512 ? m->batch - b0 : I8_BC512;
		__m512 acc[I8_BC512];

		for (int64_t b = 0; b < bc; b++)
			acc[b] = _mm512_setzero_ps();
		for (int64_t i = 0; i < nb; i++) {
			__m512i T[8];
			__m512 dw;

			i8p512_load(QT, a, gstride, i, nb, T, &dw);
			for (int64_t b = 0; b < bc; b++) {
				const int64_t col = b0 + b;
				const int8_t *xq = m->xq + col * m->cols + i * GPUD_QK;
				/* two chains of 4, as the VNNI kernel */
				__m512i s0 = _mm512_set1_epi32(m->xc[col * nb + i]);
				__m512i s1 = _mm512_setzero_si512();

#pragma GCC unroll 4
				for (int g = 0; g < 8; g += 2) {
					s0 = _mm512_dpbusd_epi32(s0, T[g], bcast4_512(xq + 4 * g));
					s1 = _mm512_dpbusd_epi32(s1, T[g + 1], bcast4_512(xq + 4 * g + 4));
				}
				__m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(m->xd[col * nb + i]));

				acc[b] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
							 acc[b]);
			}
		}
		for (int64_t b = 0; b < bc; b++)
			_mm512_storeu_ps(m->y + (b0 + b) * m->rows + r, acc[b]);
	}
}

TGT512V void gpud__avx512_rows_i8p(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	for (int64_t r = r0; r < r1; r += 16) {
		if (m->wtype == GPUD_TYPE_Q8_0)
			i8p512_rows16(m, GPUD_TYPE_Q8_0, r);
		else
			i8p512_rows16(m, GPUD_TYPE_Q4_0, r);
	}
}

/* ---- packed K-quants (Q2_K..Q6_K) with AVX-512 VNNI, batch > 1 -----------
 * kernels_kq_x86.c's packed kernel on 16 lanes: two 8-row units (pack.c)
 * side by side, group A's rows in lanes 0..7 and group B's in 8..15. Per
 * (row, column) and 32-quant chunk the integer t is the same exact value:
 * vpdpbusd sums the chunk's (or each 16-quant half's: Q2_K, Q3_K, Q6_K) 32-bit dot
 * product of the unsigned quants and the activations, times the sub-block
 * scale by vpmulld (|t| < 2^25), then the offset and min terms and the
 * fp32 steps of the AVX2 kernel in its order:
 *     acc = fma(dw * dx[c], (float)t, acc); acc = fma(-(dmin * dx[c]),
 *     (float)mt, acc).
 * So the bits are those of the AVX2 and portable kernels. */
#define KQ_BC512 8 /* columns per pass over a pair of units */
#define KQ_PF 2    /* units prefetched ahead (pf_pair()), as kernels_kq_x86.c */

/* 32 bytes at off of unit u (lanes 0..7) and of unit v (lanes 8..15). */
TGT512V_INLINE __m512i ld2(const uint8_t *u, const uint8_t *v, size_t off)
{
	return _mm512_inserti64x4(
		_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(u + off))),
		_mm256_loadu_si256((const __m256i *)(v + off)), 1);
}

/* The 8 f16 at off of u and of v as 16 fp32. */
TGT512V_INLINE __m512 ld2h(const uint8_t *u, const uint8_t *v, size_t off)
{
	return _mm512_cvtph_ps(_mm256_inserti128_si256(
		_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(u + off))),
		_mm_loadu_si128((const __m128i *)(v + off)), 1));
}

/* ---- packed Q4_1, Q5_0, Q5_1, IQ4_NL with AVX-512 VNNI -------------------
 * kernels_kq_x86.c's packed kernel for these types ("Q4_1, Q5_0, Q5_1,
 * IQ4_NL" there) on 16 lanes, two 8-row units side by side as above: the
 * same exact t (vpdpbusd of the unsigned quants, Q5_0's -16 X and
 * IQ4_NL's -128 X added to it), then acc = fma(d * dx, (float)t, acc) and
 * for Q4_1/Q5_1 acc = fma(m * dx, (float)X, acc): the same bits. */
#define LQ_BC512 16 /* columns per pass over a pair of units */

TGT512V_INLINE void lq512_rows16(const struct gpud__mm *m, enum gpud_type QT, int64_t r)
{
	const bool mins = QT == GPUD_TYPE_Q4_1 || QT == GPUD_TYPE_Q5_1;
	const bool xs = QT == GPUD_TYPE_IQ4_XS;
	const bool q5 = QT == GPUD_TYPE_Q5_0 || QT == GPUD_TYPE_Q5_1;
	const bool nl = QT == GPUD_TYPE_IQ4_NL || xs;
	const size_t unit = 8 * (QT == GPUD_TYPE_Q4_1	? sizeof(struct gpud_block_q4_1)
				 : QT == GPUD_TYPE_Q5_0 ? sizeof(struct gpud_block_q5_0)
				 : QT == GPUD_TYPE_Q5_1 ? sizeof(struct gpud_block_q5_1)
				 : xs			? sizeof(struct gpud_block_iq4_xs)
							: sizeof(struct gpud_block_iq4_nl));
	/* pack.c: 8 d, [8 m], [8 qh words], the nibbles; IQ4_XS: 8 d, 8
	 * scales_h, 8 scales_l words, each chunk's nibbles (block i is chunk
	 * i % 8 of unit i / 8) */
	const size_t qh_off = mins ? 32 : 16, nib_off = qh_off + (q5 ? 32 : 0);
	const int64_t per = xs ? GPUD_QK_K / GPUD_QK : 1;
	const int64_t nb = m->cols / GPUD_QK;
	const uint8_t *a = m->W + (size_t)r * m->wrow;
	const size_t gstride = 8 * m->wrow;
	const __m512i m4 = _mm512_set1_epi8(0xf);

	for (int64_t b0 = 0; b0 < m->batch; b0 += LQ_BC512) {
		const int64_t bc = m->batch - b0 < LQ_BC512 ? m->batch - b0 : LQ_BC512;
		__m512 acc[LQ_BC512];

		for (int64_t b = 0; b < bc; b++)
			acc[b] = _mm512_setzero_ps();
		for (int64_t i = 0; i < nb; i++) {
			const int64_t ui = i / per;
			const uint8_t *u = a + (size_t)ui * unit, *v = u + gstride;
			const size_t nib = xs ? 64 + 128 * (size_t)(i % per) : nib_off;
			__m512i T[8];
			__m512 dw = ld2h(u, v, 0), mw = mins ? ld2h(u, v, 16) : _mm512_setzero_ps();

			if (i % per == 0)
				pf_pair(a, ui, nb / per, unit, gstride,
					(Q16_PF_BYTES + (int64_t)unit - 1) / (int64_t)unit);
			if (xs) {
				/* dl = d * (ls - 32), one fp32 product a lane */
				const int c = (int)(i % per);
				const __m512i sh = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(
					_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(u + 16))),
					_mm_loadu_si128((const __m128i *)(v + 16)), 1));
				const __m512i sl = ld2(u, v, 32);
				const __m512i ls = _mm512_or_si512(
					_mm512_and_si512(_mm512_srli_epi32(sl, 8 * (c / 2) + 4 * (c % 2)),
							 _mm512_set1_epi32(15)),
					_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * c),
									   _mm512_set1_epi32(3)),
							  4));

				dw = _mm512_mul_ps(dw, _mm512_cvtepi32_ps(
							       _mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
			}
#pragma GCC unroll 4
			for (int k = 0; k < 4; k++) {
				const __m512i t = ld2(u, v, nib + 32 * (size_t)k);

				T[k] = _mm512_and_si512(t, m4);
				T[k + 4] = _mm512_and_si512(_mm512_srli_epi16(t, 4), m4);
			}
			if (q5) {
				/* quants 4g..4g+3 take bits 4 (g % 2) + b of qh byte g / 2 */
				const __m512i h = ld2(u, v, qh_off);

#pragma GCC unroll 8
				for (int g = 0; g < 8; g++) {
					/* byte g / 2 of each 32-bit lane into its 4 bytes */
					const __m512i sel = _mm512_add_epi8(
						_mm512_set1_epi8((char)(g / 2)),
						_mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0));
					const __m512i bit = _mm512_set1_epi32(g % 2 ? (int)0x80402010u
										    : 0x08040201);
					__mmask64 k = _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, sel), bit);

					T[g] = _mm512_mask_add_epi8(T[g], k, T[g], _mm512_set1_epi8(0x10));
				}
			}
			if (nl) {
				/* the table's values (quant.h) + 128, u8 */
				static const int8_t vals[16] = GPUD_IQ4NL_VALUES;
				const __m512i tab = _mm512_xor_si512(
					_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)vals)),
					_mm512_set1_epi8((char)0x80));

#pragma GCC unroll 8
				for (int g = 0; g < 8; g++)
					T[g] = _mm512_shuffle_epi8(tab, T[g]);
			}
			for (int64_t b = 0; b < bc; b++) {
				const int64_t col = b0 + b, xi = col * nb + i;
				const int8_t *xq = m->xq + col * m->cols + i * GPUD_QK;
				/* the offsets: Q5_0's xc = -16 X, IQ4_NL's -128 X (xc = X) */
				__m512i s0 = _mm512_set1_epi32(QT == GPUD_TYPE_Q5_0 ? m->xc[xi]
							       : nl		    ? -128 * m->xc[xi]
										    : 0);
				__m512i s1 = _mm512_setzero_si512();

#pragma GCC unroll 4
				for (int g = 0; g < 8; g += 2) {
					s0 = _mm512_dpbusd_epi32(s0, T[g], bcast4_512(xq + 4 * g));
					s1 = _mm512_dpbusd_epi32(s1, T[g + 1], bcast4_512(xq + 4 * g + 4));
				}
				const __m512 xd = _mm512_set1_ps(m->xd[xi]);

				acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xd),
							 _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), acc[b]);
				if (mins)
					acc[b] = _mm512_fmadd_ps(
						_mm512_mul_ps(mw, xd),
						_mm512_cvtepi32_ps(_mm512_set1_epi32(m->xc[xi])), acc[b]);
			}
		}
		for (int64_t b = 0; b < bc; b++)
			_mm512_storeu_ps(m->y + (b0 + b) * m->rows + r, acc[b]);
	}
}

TGT512V void gpud__avx512_rows_lqp(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	for (int64_t r = r0; r < r1; r += 16) {
		switch (m->wtype) {
		case GPUD_TYPE_Q4_1: lq512_rows16(m, GPUD_TYPE_Q4_1, r); break;
		case GPUD_TYPE_Q5_0: lq512_rows16(m, GPUD_TYPE_Q5_0, r); break;
		case GPUD_TYPE_Q5_1: lq512_rows16(m, GPUD_TYPE_Q5_1, r); break;
		case GPUD_TYPE_IQ4_XS: lq512_rows16(m, GPUD_TYPE_IQ4_XS, r); break;
		default: lq512_rows16(m, GPUD_TYPE_IQ4_NL, r); break;
		}
	}
}

/* Quants 4g..4g+3 of chunk c, lane = row (Q6_K as stored, +32): the bit
 * moves of kernels_kq_x86.c's pk_quant(). */
TGT512V_INLINE __m512i kq512_quant(enum gpud_type QT, const uint8_t *u, const uint8_t *v, int c,
				   int g)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);

	if (QT == GPUD_TYPE_Q2_K || QT == GPUD_TYPE_Q3_K) {
		/* kernels_kq_x86.c's pk_quant() */
		const size_t qs = QT == GPUD_TYPE_Q2_K ? 160 : 368;
		__m512i q = _mm512_and_si512(
			_mm512_srli_epi16(ld2(u, v, qs + 256 * (size_t)(c / 4) + 32 * (size_t)g),
					  (unsigned)(2 * (c % 4))),
			_mm512_set1_epi8(3));

		if (QT == GPUD_TYPE_Q3_K) {
			__m512i hb = ld2(u, v, 112 + 32 * (size_t)g);

			hb = c < 2 ? _mm512_slli_epi16(hb, (unsigned)(2 - c))
				   : c == 2 ? hb : _mm512_srli_epi16(hb, (unsigned)(c - 2));
			q = _mm512_or_si512(q, _mm512_and_si512(hb, _mm512_set1_epi8(4)));
		}
		return q;
	}
	if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) {
		const size_t qs = QT == GPUD_TYPE_Q4_K ? 128 : 384;
		__m512i x = ld2(u, v, qs + 256 * (size_t)(c / 2) + 32 * (size_t)g);
		__m512i q = _mm512_and_si512(c & 1 ? _mm512_srli_epi16(x, 4) : x, m4);

		if (QT == GPUD_TYPE_Q5_K) {
			__m512i hb = ld2(u, v, 128 + 32 * (size_t)g);

			hb = c < 4 ? _mm512_slli_epi16(hb, (unsigned)(4 - c))
				   : c == 4 ? hb : _mm512_srli_epi16(hb, (unsigned)(c - 4));
			q = _mm512_or_si512(q, _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
		}
		return q;
	}
	const int h = c / 4, k = c % 4;
	__m512i l = ld2(u, v, 144 + 512 * (size_t)h + 256 * (size_t)(k & 1) + 32 * (size_t)g);
	__m512i hb = ld2(u, v, 1168 + 256 * (size_t)h + 32 * (size_t)g);

	l = _mm512_and_si512(k < 2 ? l : _mm512_srli_epi16(l, 4), m4);
	hb = k < 2 ? _mm512_slli_epi16(hb, (unsigned)(4 - 2 * k))
		   : k == 2 ? hb : _mm512_srli_epi16(hb, 2);
	return _mm512_or_si512(l, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
}

/* The 6-bit scales and mins of Q4_K/Q5_K units, lane = row, from the
 * scale words w0, w1, w2 (kernels_kq_x86.c's pk_q4k_scales()): sm[0]
 * scales 0-3, sm[1] scales 4-7, sm[2] mins 0-3, sm[3] mins 4-7. */
TGT512V_INLINE void kq512_scales(__m512i w0, __m512i w1, __m512i w2, __m512i sm[4])
{
	const __m512i m6 = _mm512_set1_epi8(0x3f), m4 = _mm512_set1_epi8(0x0f);
	const __m512i m2 = _mm512_set1_epi8(0x03);

	sm[0] = _mm512_and_si512(w0, m6);
	sm[1] = _mm512_or_si512(_mm512_and_si512(w2, m4),
				_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m2), 4));
	sm[2] = _mm512_and_si512(w1, m6);
	sm[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
				_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m2), 4));
}

/* -x, exactly (the sign bit flipped) */
TGT512V_INLINE __m512 neg512(__m512 x)
{
	return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),
						    _mm512_set1_epi32(INT32_MIN)));
}

/* Packed Q3_K: the signed 6-bit scale s (0..15) of units u (lanes 0..7)
 * and v (8..15), kernels_kq_x86.c's pk_q3k_scale(). */
TGT512V_INLINE __m512i kq512_q3k_scale(const uint8_t *u, const uint8_t *v, int s)
{
	const __m512i lo = ld2(u, v, 16 + 32 * (size_t)((s / 4) % 2)), hi = ld2(u, v, 16 + 64);
	__m512i x = _mm512_and_si512(_mm512_srli_epi32(lo, (unsigned)(8 * (s % 4) + 4 * (s / 8))),
				     _mm512_set1_epi32(15));

	x = _mm512_or_si512(x, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(
									  hi, (unsigned)(8 * (s % 4) +
											 2 * (s / 4))),
								  _mm512_set1_epi32(3)),
						 4));
	return _mm512_sub_epi32(x, _mm512_set1_epi32(32));
}

/* Rows [r, r + 16) x all columns (two packed groups). */
TGT512V_INLINE void kq512_rows16(const struct gpud__mm *m, enum gpud_type QT, int64_t r)
{
	const int64_t nb = m->cols / GPUD_QK_K, nb32 = m->cols / GPUD_QK;
	const bool mins = QT != GPUD_TYPE_Q6_K && QT != GPUD_TYPE_Q3_K;
	/* a scale per 16-quant half (else one per chunk: Q4_K, Q5_K), and
	 * the quants' storage offset as a shift (Q6_K +32, Q3_K +4) */
	const bool halves = QT == GPUD_TYPE_Q2_K || QT == GPUD_TYPE_Q3_K || QT == GPUD_TYPE_Q6_K;
	const unsigned qsh = QT == GPUD_TYPE_Q6_K ? 5 : QT == GPUD_TYPE_Q3_K ? 2 : 0;
	const size_t unit = 8 * gpud__kq_block_bytes(QT), gstride = 8 * m->wrow;
	const uint8_t *a = m->W + (size_t)r * m->wrow;

	for (int64_t b0 = 0; b0 < m->batch; b0 += KQ_BC512) {
		const int64_t bc = m->batch - b0 < KQ_BC512 ? m->batch - b0 : KQ_BC512;
		__m512 acc[KQ_BC512];

		for (int64_t b = 0; b < bc; b++)
			acc[b] = _mm512_setzero_ps();
		for (int64_t i = 0; i < nb; i++) {
			const uint8_t *u = a + (size_t)i * unit, *v = u + gstride;
			const __m512 dw = ld2h(u, v, 0);
			__m512 ndmin = _mm512_setzero_ps();
			__m512i sm[4] = { _mm512_setzero_si512(), _mm512_setzero_si512(),
					  _mm512_setzero_si512(), _mm512_setzero_si512() };

			pf_pair(a, i, nb, unit, gstride, KQ_PF);
			if (mins)
				ndmin = neg512(ld2h(u, v, 16));
			if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) /* the 6-bit scales and mins */
				kq512_scales(ld2(u, v, 32), ld2(u, v, 64), ld2(u, v, 96), sm);
			for (int c = 0; c < 8; c++) {
				__m512i T[8], sa, sb = _mm512_setzero_si512(), mv = _mm512_setzero_si512(),
							   sab = _mm512_setzero_si512();

				if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) {
					const unsigned sh = 8 * (unsigned)(c % 4);
					const __m512i ff = _mm512_set1_epi32(0xff);

					sa = _mm512_and_si512(_mm512_srli_epi32(sm[c / 4], sh), ff);
					mv = _mm512_and_si512(_mm512_srli_epi32(sm[2 + c / 4], sh), ff);
				} else if (QT == GPUD_TYPE_Q2_K) {
					/* bytes 2c, 2c + 1: scale low nibble, min high */
					const __m512i x = ld2(u, v, 32 + 32 * (size_t)(c / 2));
					const __m512i m15 = _mm512_set1_epi32(15);
					const unsigned sh = 16 * (unsigned)(c % 2);

					sa = _mm512_and_si512(_mm512_srli_epi32(x, sh), m15);
					sb = _mm512_and_si512(_mm512_srli_epi32(x, sh + 8), m15);
					mv = _mm512_or_si512(
						_mm512_and_si512(_mm512_srli_epi32(x, sh + 4), m15),
						_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(x, sh + 12), m15),
								  16));
				} else if (QT == GPUD_TYPE_Q3_K) {
					sa = kq512_q3k_scale(u, v, 2 * c);
					sb = kq512_q3k_scale(u, v, 2 * c + 1);
					sab = _mm512_or_si512(_mm512_and_si512(sa, _mm512_set1_epi32(0xffff)),
							      _mm512_slli_epi32(sb, 16));
				} else {
					/* Q6_K: 8 rows' scale a then b, 16 bytes a unit */
					const __m128i sca = _mm_loadu_si128((const __m128i *)(u + 16 + 16 * c));
					const __m128i scb = _mm_loadu_si128((const __m128i *)(v + 16 + 16 * c));

					sa = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(sca, scb));
					sb = _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(sca, scb));
					sab = _mm512_or_si512(_mm512_and_si512(sa, _mm512_set1_epi32(0xffff)),
							      _mm512_slli_epi32(sb, 16));
				}
#pragma GCC unroll 8
				for (int g = 0; g < 8; g++)
					T[g] = kq512_quant(QT, u, v, c, g);
				for (int64_t b = 0; b < bc; b++) {
					const int64_t col = b0 + b, xi = col * nb32 + i * 8 + c;
					const int8_t *xq = m->xq + col * m->cols + i * GPUD_QK_K + 32 * c;
					const __m512i xc = _mm512_set1_epi32(m->xc[xi]);
					const __m512 xd = _mm512_set1_ps(m->xd[xi]);
					__m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), t;

					if (!halves) {
						/* one scale for the chunk: two chains, one product */
#pragma GCC unroll 4
						for (int g = 0; g < 8; g += 2) {
							d0 = _mm512_dpbusd_epi32(d0, T[g], bcast4_512(xq + 4 * g));
							d1 = _mm512_dpbusd_epi32(d1, T[g + 1],
										 bcast4_512(xq + 4 * g + 4));
						}
						t = _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), sa);
					} else {
						/* the halves' scales, then (Q3_K, Q6_K) the
						 * storage offset off * (sa * X_a + sb * X_b) */
#pragma GCC unroll 4
						for (int g = 0; g < 4; g++) {
							d0 = _mm512_dpbusd_epi32(d0, T[g], bcast4_512(xq + 4 * g));
							d1 = _mm512_dpbusd_epi32(d1, T[g + 4],
										 bcast4_512(xq + 4 * g + 16));
						}
						t = _mm512_add_epi32(_mm512_mullo_epi32(d0, sa),
								     _mm512_mullo_epi32(d1, sb));
						if (qsh)
							t = _mm512_sub_epi32(
								t, _mm512_slli_epi32(_mm512_madd_epi16(sab, xc),
										     qsh));
					}
					acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(dw, xd), _mm512_cvtepi32_ps(t),
								 acc[b]);
					if (mins)
						acc[b] = _mm512_fmadd_ps(_mm512_mul_ps(ndmin, xd),
									 _mm512_cvtepi32_ps(_mm512_madd_epi16(mv, xc)),
									 acc[b]);
				}
			}
		}
		for (int64_t b = 0; b < bc; b++)
			_mm512_storeu_ps(m->y + (b0 + b) * m->rows + r, acc[b]);
	}
}

/* ---- packed Q4_K/Q5_K/Q6_K with AVX-512 VNNI, batch 1 ----------------------
 * (Q2_K, and Q3_K with GFNI: q2k1_rows16() and q3k1_rows16() below;
 * these kernels take their last single group.) Decode reads the weights
 * from DRAM, where the kernel above, which pairs two units, once read
 * slower than one stream: its prefetch misses the second group of each
 * pair (pf_pair()). Prefetched in read order it is still slower for
 * these three types on cached weights (q4_kp 33 against 48 GB/s a
 * thread, q6_kp 22-28 against 51-55) and no faster from DRAM, so here
 * the 16 lanes hold ONE unit's 8 rows twice: lanes 0..7 chunk clo and
 * lanes 8..15 chunk chi of the same super-block, with (clo, chi) =
 * (2p, 2p + 1) for Q4_K/Q5_K (the low and high nibbles of the same
 * bytes, and bits clo, chi of the same high-bit bytes) and (c, c + 2)
 * for Q6_K (the same ql bytes' two nibbles and the
 * same qh bytes). One broadcast load fills both halves; a per-half shift
 * or rotation of the 32-bit lanes brings each chunk's bits into place (a
 * bit that wraps around never lands under the mask). The activations'
 * bytes of each chunk reach their half by a permute. vpdpbusd gives the
 * exact integer dot products, so every (row, chunk) gets the integer t of
 * the AVX2 kernel; the fp32 steps then run on 8 lanes, the low half's
 * chunk before the high half's, in chunk order:
 *     acc = fma(dw * dx[c], (float)t, acc); acc = fma(-(dmin * dx[c]),
 *     (float)mt, acc),
 * the AVX2 kernel's chain, so the same bits. */
/* Prefetched ahead: the whole units that cover this many bytes, 2 units
 * of Q4_K as in the AVX2 kernel (so 2 of Q5_K and Q6_K as there too, 3 of
 * Q3_K, 4 of Q2_K: the small units need more of them to keep as many
 * bytes in flight; Q2_K, and Q3_K with GFNI, come here only for a last
 * single group). */
#define KQ1_PF_BYTES 2304
#define KQ1_OR_AND 0xf8 /* vpternlogd's A | (B & C) */

/* lanes 0..7 a, lanes 8..15 b */
TGT512V_INLINE __m512i idx2(int a, int b)
{
	return _mm512_inserti64x4(_mm512_set1_epi32(a), _mm256_set1_epi32(b), 1);
}

/* The 32 bytes at p in both halves. */
TGT512V_INLINE __m512i bc256(const uint8_t *p)
{
	return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* Quants 4g..4g+3 of the 8 rows of unit u, chunk clo in lanes 0..7 and
 * chi in 8..15 (Q6_K as stored, +32). */
TGT512V_INLINE __m512i kq1_quant(enum gpud_type QT, const uint8_t *u, int clo, int chi, int g)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f);

	if (QT == GPUD_TYPE_Q2_K) {
		/* clo = 2p: bits 2j, 2j + 1 (j = clo % 4) and 2j + 2, 2j + 3 of
		 * the same bytes, left in place: the quant times 4^j (at most
		 * 192, still a u8); kq1_q23_t() divides the dot products */
		const int j = clo % 4;

		return _mm512_and_si512(bc256(u + 160 + 256 * (size_t)(clo / 4) + 32 * (size_t)g),
					idx2((int)(0x03030303u << 2 * j), (int)(0x0c0c0c0cu << 2 * j)));
	}
	if (QT == GPUD_TYPE_Q3_K) {
		/* as Q2_K, shifted down; the high bit c to bit 2: rotate left
		 * by 2 - c */
		const size_t qs = 368;
		const int j = clo % 4;
		__m512i q = _mm512_and_si512(
			_mm512_srlv_epi32(bc256(u + qs + 256 * (size_t)(clo / 4) + 32 * (size_t)g),
					  idx2(2 * j, 2 * j + 2)),
			_mm512_set1_epi8(3));

		if (QT == GPUD_TYPE_Q3_K) {
			__m512i hb = _mm512_rolv_epi32(bc256(u + 112 + 32 * (size_t)g),
						       idx2((2 - clo) & 31, (2 - chi) & 31));

			q = _mm512_ternarylogic_epi32(q, hb, _mm512_set1_epi8(4), KQ1_OR_AND);
		}
		return q;
	}
	if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) {
		const size_t qs = QT == GPUD_TYPE_Q4_K ? 128 : 384;
		__m512i q = _mm512_and_si512(
			_mm512_srlv_epi32(bc256(u + qs + 256 * (size_t)(clo / 2) + 32 * (size_t)g),
					  idx2(0, 4)),
			m4);

		if (QT == GPUD_TYPE_Q5_K) {
			/* bit c of each byte to bit 4: rotate left by 4 - c */
			__m512i hb = _mm512_rolv_epi32(bc256(u + 128 + 32 * (size_t)g),
						       idx2((4 - clo) & 31, (4 - chi) & 31));

			q = _mm512_ternarylogic_epi32(q, hb, _mm512_set1_epi8(0x10), KQ1_OR_AND);
		}
		return q;
	}
	/* Q6_K, clo = c with k = c % 4 < 2, chi = c + 2: bits 2k, 2k + 1 of
	 * each qh byte to bits 4, 5 (rotate left by 4 - 2k), then 2k + 4 */
	const int h = clo / 4, k = clo % 4;
	__m512i l = _mm512_and_si512(
		_mm512_srlv_epi32(bc256(u + 144 + 512 * (size_t)h + 256 * (size_t)k + 32 * (size_t)g),
				  idx2(0, 4)),
		m4);
	__m512i hb = _mm512_rolv_epi32(bc256(u + 1168 + 256 * (size_t)h + 32 * (size_t)g),
				       idx2(4 - 2 * k, (32 - 2 * k) & 31));

	return _mm512_ternarylogic_epi32(l, hb, _mm512_set1_epi8(0x30), KQ1_OR_AND);
}

/* The activations of chunks clo (lanes 0..7) and chi (8..15), from X[p]
 * = chunks 2p and 2p + 1, arranged for kq1_act(): Y[h] holds the 128-bit
 * lanes of dwords 4h..4h+3 of chunk clo twice, then those of chi twice.
 * Two 128-bit lane shuffles per chunk pair, against a vpermd per dword
 * (and its index vector, one of 16 that 32 registers do not all hold):
 * on hot weights Q3_K's kernel ran 1.15x faster so. */
/* 128-bit lanes (l, l) of a, then (r, r) of b (the immediate spelled out:
 * clang wants a literal, not a constant that inlining makes) */
TGT512V_INLINE __m512i lanes_llrr(__m512i a, __m512i b, int l, int r)
{
#define LLRR(L, R)                                                                         \
	case 4 * (L) + (R):                                                                \
		return _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(R, R, L, L))
	switch (4 * l + r) {
		LLRR(0, 0); LLRR(0, 1); LLRR(0, 2); LLRR(0, 3);
		LLRR(1, 0); LLRR(1, 1); LLRR(1, 2); LLRR(1, 3);
		LLRR(2, 0); LLRR(2, 1); LLRR(2, 2); LLRR(2, 3);
		LLRR(3, 0); LLRR(3, 1); LLRR(3, 2);
	default: LLRR(3, 3);
	}
#undef LLRR
}

TGT512V_INLINE void kq1_acty(const __m512i X[4], int clo, int chi, __m512i Y[2])
{
	Y[0] = lanes_llrr(X[clo / 2], X[chi / 2], 2 * (clo % 2), 2 * (chi % 2));
	Y[1] = lanes_llrr(X[clo / 2], X[chi / 2], 2 * (clo % 2) + 1, 2 * (chi % 2) + 1);
}

/* Activation bytes 4g..4g+3 of the pair kq1_acty() arranged, in every
 * lane of its half: one in-lane dword broadcast */
TGT512V_INLINE __m512i kq1_act(const __m512i Y[2], int g)
{
	switch (g % 4) {
	case 0: return _mm512_shuffle_epi32(Y[g / 4], _MM_PERM_AAAA);
	case 1: return _mm512_shuffle_epi32(Y[g / 4], _MM_PERM_BBBB);
	case 2: return _mm512_shuffle_epi32(Y[g / 4], _MM_PERM_CCCC);
	default: return _mm512_shuffle_epi32(Y[g / 4], _MM_PERM_DDDD);
	}
}

/* acc = fma(lo(s), lo(f), acc), the low half's step */
TGT512V_INLINE __m256 fma_lo(__m512 s, __m512 f, __m256 acc)
{
	return _mm256_fmadd_ps(_mm512_castps512_ps256(s), _mm512_castps512_ps256(f), acc);
}

TGT512V_INLINE __m256 fma_hi(__m512 s, __m512 f, __m256 acc)
{
	return _mm256_fmadd_ps(_mm512_extractf32x8_ps(s, 1), _mm512_extractf32x8_ps(f, 1), acc);
}

/* Q6_K's t of chunks (c, c + 2), c % 4 < 2: the halves' scales, then the
 * storage offset 32 * (sa * X_a + sb * X_b), as the kernel above. */
TGT512V_INLINE __m512i kq1_q6_t(const uint8_t *u, const __m512i X[4], __m512i XC, int c)
{
	const __m128i s0 = _mm_loadu_si128((const __m128i *)(u + 16 + 16 * c));
	const __m128i s2 = _mm_loadu_si128((const __m128i *)(u + 16 + 16 * (c + 2)));
	const __m512i sa = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(s0, s2));
	const __m512i sb = _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(s0, s2));
	const __m512i sab = _mm512_or_si512(_mm512_and_si512(sa, _mm512_set1_epi32(0xffff)),
					    _mm512_slli_epi32(sb, 16));
	const __m512i xc = _mm512_permutexvar_epi32(idx2(c, c + 2), XC);
	__m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), t, Y[2];

	kq1_acty(X, c, c + 2, Y);
#pragma GCC unroll 4
	for (int g = 0; g < 4; g++) {
		d0 = _mm512_dpbusd_epi32(d0, kq1_quant(GPUD_TYPE_Q6_K, u, c, c + 2, g), kq1_act(Y, g));
		d1 = _mm512_dpbusd_epi32(d1, kq1_quant(GPUD_TYPE_Q6_K, u, c, c + 2, g + 4),
					 kq1_act(Y, g + 4));
	}
	t = _mm512_add_epi32(_mm512_mullo_epi32(d0, sa), _mm512_mullo_epi32(d1, sb));
	return _mm512_sub_epi32(t, _mm512_slli_epi32(_mm512_madd_epi16(sab, xc), 5));
}

/* Q3_K's scales of chunk pair p, 4p, 4p + 1 (*sa: low half, *sb: high)
 * and 4p + 2, 4p + 3, less 32, as kernels_kq_x86.c's pk_q3k_scale() */
TGT512V_INLINE void kq1_q3_scales(const uint8_t *u, int p, __m512i *sa, __m512i *sb)
{
	const __m512i lo = bc256(u + 16 + 32 * (size_t)(p % 2)), hi = bc256(u + 16 + 64);
	const __m512i m = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
	const __m512i k32 = _mm512_set1_epi32(32);
	const int n = 4 * (p / 2);

	*sa = _mm512_or_si512(
		_mm512_and_si512(_mm512_srlv_epi32(lo, idx2(n, 16 + n)), m),
		_mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(hi, idx2(2 * p, 16 + 2 * p)), m2),
				  4));
	*sb = _mm512_or_si512(
		_mm512_and_si512(_mm512_srlv_epi32(lo, idx2(8 + n, 24 + n)), m),
		_mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(hi, idx2(8 + 2 * p, 24 + 2 * p)), m2),
				  4));
	*sa = _mm512_sub_epi32(*sa, k32);
	*sb = _mm512_sub_epi32(*sb, k32);
}

/* Q3_K's t from the halves' exact dot products d0, d1 and scales sa, sb:
 * sa * d0 + sb * d1 less the storage offset 4 * (sa * X_a + sb * X_b) */
TGT512V_INLINE __m512i kq1_q3_t(__m512i d0, __m512i d1, __m512i sa, __m512i sb, __m512i xc)
{
	const __m512i sab = _mm512_or_si512(_mm512_and_si512(sa, _mm512_set1_epi32(0xffff)),
					    _mm512_slli_epi32(sb, 16));
	const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(d0, sa), _mm512_mullo_epi32(d1, sb));

	return _mm512_sub_epi32(t, _mm512_slli_epi32(_mm512_madd_epi16(sab, xc), 2));
}

/* Q2_K/Q3_K: chunks (c, c + 1), c = 2p, of unit u. The 16-quant halves'
 * scales (Q2_K: the nibbles of bytes 2c.., Q3_K: the 6-bit scales 2c..)
 * times the halves' dot products, Q3_K less the storage offset
 * 4 * (sa * X_a + sb * X_b); Q2_K's min term mt = ma * X_a + mb * X_b
 * in *mt. The AVX2 kernel's integers. */
TGT512V_INLINE __m512i kq1_q23_t(enum gpud_type QT, const uint8_t *u, const __m512i X[4],
				 __m512i XC, int c, __m512i *mt)
{
	const int p = c / 2;
	const __m512i xc = _mm512_permutexvar_epi32(idx2(c, c + 1), XC);
	__m512i sa, sb, d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), Y[2];

	if (QT == GPUD_TYPE_Q2_K) {
		/* bytes 2c, 2c + 1 (low half) and 2c + 2, 2c + 3 (high) of
		 * word p: scale in the low nibble, min in the high */
		const __m512i v = bc256(u + 32 + 32 * (size_t)p), m = _mm512_set1_epi32(15);
		const __m512i ma = _mm512_and_si512(_mm512_srlv_epi32(v, idx2(4, 20)), m);
		const __m512i mb = _mm512_and_si512(_mm512_srlv_epi32(v, idx2(12, 28)), m);

		sa = _mm512_and_si512(_mm512_srlv_epi32(v, idx2(0, 16)), m);
		sb = _mm512_and_si512(_mm512_srlv_epi32(v, idx2(8, 24)), m);
		*mt = _mm512_madd_epi16(_mm512_or_si512(ma, _mm512_slli_epi32(mb, 16)), xc);
	} else {
		kq1_q3_scales(u, p, &sa, &sb);
	}
	kq1_acty(X, c, c + 1, Y);
#pragma GCC unroll 4
	for (int g = 0; g < 4; g++) {
		d0 = _mm512_dpbusd_epi32(d0, kq1_quant(QT, u, c, c + 1, g), kq1_act(Y, g));
		d1 = _mm512_dpbusd_epi32(d1, kq1_quant(QT, u, c, c + 1, g + 4), kq1_act(Y, g + 4));
	}
	if (QT == GPUD_TYPE_Q2_K) {
		/* exact multiples of 4^j: an exact division */
		const __m512i sh = idx2(2 * (c % 4), 2 * (c % 4) + 2);

		d0 = _mm512_srav_epi32(d0, sh);
		d1 = _mm512_srav_epi32(d1, sh);
	}
	if (QT == GPUD_TYPE_Q3_K)
		return kq1_q3_t(d0, d1, sa, sb, xc);
	return _mm512_add_epi32(_mm512_mullo_epi32(d0, sa), _mm512_mullo_epi32(d1, sb));
}

/* What every unit u (super-block i of a group) starts with: the units
 * pf bytes on prefetched, the activations' quants X, sums XC and scales
 * XD of super-block i, the 8 rows' scales dw in both halves. */
TGT512V_INLINE void kq1_unit(const struct gpud__mm *m, const uint8_t *u, int64_t i, size_t unit,
			     size_t pf, __m512i X[4], __m512i *XC, __m512 *XD, __m512 *dw)
{
	const int8_t *xq = m->xq + i * GPUD_QK_K;

#pragma GCC unroll 32
	for (size_t o = 0; o < unit; o += 64)
		_mm_prefetch((const char *)u + pf + o, _MM_HINT_T0);
	*XD = _mm512_castps256_ps512(_mm256_loadu_ps(m->xd + i * 8));
	*XC = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(m->xc + i * 8)));
	*dw = _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)u)));
#pragma GCC unroll 4
	for (int p = 0; p < 4; p++)
		X[p] = _mm512_loadu_si512(xq + 64 * p);
}

/* Rows [r, r + 8) (one packed group), batch 1. */
TGT512V_INLINE void kq1_rows8(const struct gpud__mm *m, enum gpud_type QT, int64_t r)
{
	const int64_t nb = m->cols / GPUD_QK_K;
	const size_t unit = 8 * gpud__kq_block_bytes(QT);
	const size_t pf = (KQ1_PF_BYTES + unit - 1) / unit * unit;
	const uint8_t *a = m->W + (size_t)r * m->wrow;
	__m256 acc = _mm256_setzero_ps();

	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *u = a + (size_t)i * unit;
		__m512 XD, dw;
		__m512i XC, X[4];

		kq1_unit(m, u, i, unit, pf, X, &XC, &XD, &dw);
		if (QT == GPUD_TYPE_Q6_K) {
#pragma GCC unroll 2
			for (int q = 0; q < 8; q += 4) {
				/* chunks (q, q + 2) and (q + 1, q + 3), stepped in
				 * the order q, q + 1, q + 2, q + 3 */
				__m512 fa = _mm512_cvtepi32_ps(kq1_q6_t(u, X, XC, q));
				__m512 fb = _mm512_cvtepi32_ps(kq1_q6_t(u, X, XC, q + 1));
				__m512 sa = _mm512_mul_ps(dw, _mm512_permutexvar_ps(idx2(q, q + 2), XD));
				__m512 sb = _mm512_mul_ps(dw,
							  _mm512_permutexvar_ps(idx2(q + 1, q + 3), XD));

				acc = fma_lo(sa, fa, acc);
				acc = fma_lo(sb, fb, acc);
				acc = fma_hi(sa, fa, acc);
				acc = fma_hi(sb, fb, acc);
			}
			continue;
		}
		/* -dmin of the 8 rows in both halves (Q2_K, Q4_K, Q5_K) */
		const __m512 ndmin = neg512(_mm512_cvtph_ps(
			_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(u + 16)))));

		if (QT == GPUD_TYPE_Q2_K || QT == GPUD_TYPE_Q3_K) {

#pragma GCC unroll 4
			for (int c = 0; c < 8; c += 2) {
				__m512i mt = _mm512_setzero_si512();
				const __m512 ft = _mm512_cvtepi32_ps(kq1_q23_t(QT, u, X, XC, c, &mt));
				const __m512 xd = _mm512_permutexvar_ps(idx2(c, c + 1), XD);
				const __m512 sc = _mm512_mul_ps(dw, xd);

				if (QT == GPUD_TYPE_Q3_K) {
					acc = fma_lo(sc, ft, acc);
					acc = fma_hi(sc, ft, acc);
					continue;
				}
				const __m512 ns = _mm512_mul_ps(ndmin, xd), fm = _mm512_cvtepi32_ps(mt);

				acc = fma_lo(sc, ft, acc);
				acc = fma_lo(ns, fm, acc);
				acc = fma_hi(sc, ft, acc);
				acc = fma_hi(ns, fm, acc);
			}
			continue;
		}
		/* Q4_K/Q5_K: the 6-bit scales and mins of the 8 rows, the same
		 * in both halves (the kernel above's unpacking) */
		const __m512i ff = _mm512_set1_epi32(0xff);
		__m512i sm[4];

		kq512_scales(bc256(u + 32), bc256(u + 64), bc256(u + 96), sm);
#pragma GCC unroll 4
		for (int p = 0; p < 4; p++) {
			const int clo = 2 * p, chi = 2 * p + 1;
			/* the scale (and min) of chunk c: byte c % 4 of sm[c / 4] */
			const __m512i sh = idx2(8 * (clo % 4), 8 * (chi % 4));
			const __m512i sa = _mm512_and_si512(_mm512_srlv_epi32(sm[clo / 4], sh), ff);
			const __m512i mv = _mm512_and_si512(_mm512_srlv_epi32(sm[2 + clo / 4], sh), ff);
			const __m512i xc = _mm512_permutexvar_epi32(idx2(clo, chi), XC);
			const __m512 xd = _mm512_permutexvar_ps(idx2(clo, chi), XD);
			__m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), Y[2];

			kq1_acty(X, clo, chi, Y);
#pragma GCC unroll 4
			for (int g = 0; g < 8; g += 2) {
				d0 = _mm512_dpbusd_epi32(d0, kq1_quant(QT, u, clo, chi, g), kq1_act(Y, g));
				d1 = _mm512_dpbusd_epi32(d1, kq1_quant(QT, u, clo, chi, g + 1),
							 kq1_act(Y, g + 1));
			}
			const __m512 s = _mm512_mul_ps(dw, xd), ns = _mm512_mul_ps(ndmin, xd);
			const __m512 ft = _mm512_cvtepi32_ps(
				_mm512_mullo_epi32(_mm512_add_epi32(d0, d1), sa));
			const __m512 fm = _mm512_cvtepi32_ps(_mm512_madd_epi16(mv, xc));

			acc = fma_lo(s, ft, acc);
			acc = fma_lo(ns, fm, acc);
			acc = fma_hi(s, ft, acc);
			acc = fma_hi(ns, fm, acc);
		}
	}
	_mm256_storeu_ps(m->y + r, acc);
}

/* The super-blocks of a pair of packed K-quant groups in the order the
 * batch-1 pair kernels read them: sb16_next() steps to the next one
 * (false past the row's end), sets its two units u (rows r..r + 7) and
 * v (r + 8..r + 15) and the activations' quants, scales and half sums,
 * and prefetches the units Q16_PF_BYTES on (pf_pair()). */
struct sb16 {
	const struct gpud__mm *m;
	const uint8_t *a, *u, *v;
	const int8_t *xq;
	const float *xd;
	const int32_t *xc;
	size_t unit, gstride;
	int64_t i, nb, pfu;
};

TGT512V_INLINE void sb16_init(struct sb16 *b, const struct gpud__mm *m, enum gpud_type QT,
			      int64_t r)
{
	b->m = m;
	b->a = m->W + (size_t)r * m->wrow;
	b->unit = 8 * gpud__kq_block_bytes(QT);
	b->gstride = 8 * m->wrow;
	b->i = -1;
	b->nb = m->cols / GPUD_QK_K;
	b->pfu = (Q16_PF_BYTES + (int64_t)b->unit - 1) / (int64_t)b->unit;
}

TGT512V_INLINE bool sb16_next(struct sb16 *b)
{
	const int64_t i = ++b->i;

	if (i >= b->nb)
		return false;
	b->u = b->a + (size_t)i * b->unit;
	b->v = b->u + b->gstride;
	b->xq = b->m->xq + i * GPUD_QK_K;
	b->xd = b->m->xd + i * 8;
	b->xc = b->m->xc + i * 8;
	pf_pair(b->a, i, b->nb, b->unit, b->gstride, b->pfu);
	return true;
}

/* ld2() of the 8 groups of 4 bytes (32 bytes each) from off on. */
TGT512V_INLINE void ld2x8(const uint8_t *u, const uint8_t *v, size_t off, __m512i T[8])
{
#pragma GCC unroll 8
	for (int g = 0; g < 8; g++)
		T[g] = ld2(u, v, off + 32 * (size_t)g);
}

/* Bytes 2k, 2k + 1 (k = 0, 1) of each dword of x to its two 16-bit
 * halves, zero-extended: one vpshufb. */
TGT512V_INLINE __m512i pair_words(__m512i x, int k)
{
	return _mm512_shuffle_epi8(
		x, k ? _mm512_broadcast_i32x4(_mm_setr_epi8(2, -1, 3, -1, 6, -1, 7, -1, 10, -1, 11, -1,
							    14, -1, 15, -1))
		     : _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1,
							    12, -1, 13, -1)));
}

/* Q2_K, rows [r, r + 16) (two packed groups), batch 1. Lane = row, as
 * the batch kernel above: a 2-bit quant is one vpandd of bytes that hold
 * four chunks' quants, left in place (times 4^j for chunk 4h + j) and
 * summed by vpdpbusd against a broadcast dword of the activations; the
 * lane-per-row layout needs no activation shuffles and no half-vector
 * fp32 steps, so a super-block of 16 rows costs about half the vector
 * operations of two kq1_rows8() units. The exact integers t and mt and
 * the fp32 chain per row are those of the kernels above. */
TGT512V_INLINE void q2k1_rows16(const struct gpud__mm *m, int64_t r)
{
	const __m512i m15 = _mm512_set1_epi32(15);
	__m512 acc = _mm512_setzero_ps();
	struct sb16 b;

	for (sb16_init(&b, m, GPUD_TYPE_Q2_K, r); sb16_next(&b);) {
		const uint8_t *u = b.u, *v = b.v;
		const int8_t *xq = b.xq;
		const __m512 dw = ld2h(u, v, 0), ndmin = neg512(ld2h(u, v, 16));
		__m512i Q[8];

#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			const int j = c % 4;

			if (j == 0) /* the next 32 qs bytes: chunks c..c + 3 */
				ld2x8(u, v, 160 + 256 * (size_t)(c / 4), Q);
			const __m512i mq = _mm512_set1_epi8((char)(3 << 2 * j));
			/* (scale | min << 4) of the chunk's halves a, b */
			const __m512i sw = pair_words(ld2(u, v, 32 + 32 * (size_t)(c / 2)), c % 2);
			const __m512i sa = _mm512_and_si512(sw, m15);
			const __m512i sb = _mm512_and_si512(_mm512_srli_epi32(sw, 16), m15);
			const __m512i mv = _mm512_srli_epi16(sw, 4);
			const __m512 x = _mm512_set1_ps(b.xd[c]);
			__m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), t;

#pragma GCC unroll 4
			for (int g = 0; g < 4; g++) {
				d0 = _mm512_dpbusd_epi32(d0, _mm512_and_si512(Q[g], mq),
							 bcast4_512(xq + 32 * c + 4 * g));
				d1 = _mm512_dpbusd_epi32(d1, _mm512_and_si512(Q[g + 4], mq),
							 bcast4_512(xq + 32 * c + 16 + 4 * g));
			}
			/* 4^j t, an exact multiple: shifted back exactly */
			t = _mm512_add_epi32(_mm512_mullo_epi32(d0, sa), _mm512_mullo_epi32(d1, sb));
			if (j)
				t = _mm512_srai_epi32(t, (unsigned)(2 * j));
			acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, x), _mm512_cvtepi32_ps(t), acc);
			acc = _mm512_fmadd_ps(
				_mm512_mul_ps(ndmin, x),
				_mm512_cvtepi32_ps(_mm512_madd_epi16(mv, _mm512_set1_epi32(b.xc[c]))), acc);
		}
	}
	_mm512_storeu_ps(m->y + r, acc);
}

TGT512V void gpud__avx512_rows_kqp1(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	if (m->wtype == GPUD_TYPE_Q3_K && m->gfni) {
		gpud__avx512g_rows_q3kp1(m, r0, r1);
		return;
	}
	if (m->wtype == GPUD_TYPE_Q2_K) {
		for (; r0 + 16 <= r1; r0 += 16)
			q2k1_rows16(m, r0);
	}
	for (int64_t r = r0; r < r1; r += 8) {
		switch (m->wtype) {
		case GPUD_TYPE_Q2_K: kq1_rows8(m, GPUD_TYPE_Q2_K, r); break;
		case GPUD_TYPE_Q3_K: kq1_rows8(m, GPUD_TYPE_Q3_K, r); break;
		case GPUD_TYPE_Q4_K: kq1_rows8(m, GPUD_TYPE_Q4_K, r); break;
		case GPUD_TYPE_Q5_K: kq1_rows8(m, GPUD_TYPE_Q5_K, r); break;
		case GPUD_TYPE_Q6_K: kq1_rows8(m, GPUD_TYPE_Q6_K, r); break;
		default: break;
		}
	}
}

TGT512V void gpud__avx512_rows_kqp(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	for (int64_t r = r0; r < r1; r += 16) {
		switch (m->wtype) {
		case GPUD_TYPE_Q2_K: kq512_rows16(m, GPUD_TYPE_Q2_K, r); break;
		case GPUD_TYPE_Q3_K: kq512_rows16(m, GPUD_TYPE_Q3_K, r); break;
		case GPUD_TYPE_Q4_K: kq512_rows16(m, GPUD_TYPE_Q4_K, r); break;
		case GPUD_TYPE_Q5_K: kq512_rows16(m, GPUD_TYPE_Q5_K, r); break;
		case GPUD_TYPE_Q6_K: kq512_rows16(m, GPUD_TYPE_Q6_K, r); break;
		default: break;
		}
	}
}

/* ---- Q3_K at batch 1 with GFNI ------------------------------------------
 * The kernel above builds each 3-bit quant in 4 operations: the 2 bits
 * shifted down and masked, the high bit rotated into bit 2 and merged
 * under a mask (a rotation leaves the other 7 bits of the hmask byte
 * around it). vgf2p8affineqb moves one bit of every byte to any place
 * and clears the rest, with a matrix per 64-bit lane, so each half gets
 * its own chunk's bit. With the high bit clean, the quant's 2 bits can
 * stay where they are, as Q2_K's do: one vpternlogd, (qs & M) | hb,
 * gives the quant times 2^s, s its 2 bits' place. Chunk pairs (c, c + 1)
 * with c % 4 == 0 sit at bits (0, 2) of the qs bytes: s = 0 and 2 as
 * stored, 2 operations. With c % 4 == 2 at bits (4, 6): the high half
 * shifted down by 2 to share s = 4 (a high bit at 8 would not fit the
 * byte), 3 operations. The dot products are then exact multiples of 2^s,
 * and one arithmetic shift per half divides them back: the same
 * integers, so the same bits as the kernel above. */
#define TGT512G_ATTR target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,gfni")
#define TGT512G __attribute__((TGT512G_ATTR, aligned(64)))
#define TGT512G_INLINE static inline __attribute__((always_inline, TGT512G_ATTR))
#define KQ1_AND_OR 0xec /* vpternlogd's (A & C) | B */

/* The affine matrix that moves bit blo of every byte to bit plo in lanes
 * 0..7 and bit bhi to bit phi in lanes 8..15, the other bits 0 (bit k of
 * a result byte is the parity of the source byte and the matrix's byte
 * 7 - k). */
TGT512G_INLINE __m512i gf_move(int blo, int plo, int bhi, int phi)
{
	const long long a = (long long)((uint64_t)(1u << blo) << (8 * (7 - plo)));
	const long long b = (long long)((uint64_t)(1u << bhi) << (8 * (7 - phi)));

	return _mm512_inserti64x4(_mm512_set1_epi64(a), _mm256_set1_epi64x(b), 1);
}

/* Quants 4g..4g+3 of chunks c (lanes 0..7) and c + 1 (8..15), c even,
 * times 2^s: s = 0 and 2 (c % 4 == 0), 4 and 4 (c % 4 == 2). */
TGT512G_INLINE __m512i kq1_q3g_quant(const uint8_t *u, int c, int g)
{
	__m512i q = bc256(u + 368 + 256 * (size_t)(c / 4) + 32 * (size_t)g);
	const __m512i hm = bc256(u + 112 + 32 * (size_t)g);

	if (c % 4 == 0)
		return _mm512_ternarylogic_epi32(q, _mm512_gf2p8affine_epi64_epi8(hm, gf_move(c, 2, c + 1, 4), 0),
						 idx2(0x03030303, 0x0c0c0c0c), KQ1_AND_OR);
	q = _mm512_srlv_epi32(q, idx2(0, 2));
	return _mm512_ternarylogic_epi32(q, _mm512_gf2p8affine_epi64_epi8(hm, gf_move(c, 6, c + 1, 6), 0),
					 _mm512_set1_epi8(0x30), KQ1_AND_OR);
}

/* kq1_q23_t() for Q3_K */
TGT512G_INLINE __m512i kq1_q3g_t(const uint8_t *u, const __m512i X[4], __m512i XC, int c)
{
	const __m512i xc = _mm512_permutexvar_epi32(idx2(c, c + 1), XC);
	const __m512i sh = c % 4 == 0 ? idx2(0, 2) : _mm512_set1_epi32(4);
	__m512i sa, sb, d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), Y[2];

	kq1_q3_scales(u, c / 2, &sa, &sb);
	kq1_acty(X, c, c + 1, Y);
#pragma GCC unroll 4
	for (int g = 0; g < 4; g++) {
		d0 = _mm512_dpbusd_epi32(d0, kq1_q3g_quant(u, c, g), kq1_act(Y, g));
		d1 = _mm512_dpbusd_epi32(d1, kq1_q3g_quant(u, c, g + 4), kq1_act(Y, g + 4));
	}
	return kq1_q3_t(_mm512_srav_epi32(d0, sh), _mm512_srav_epi32(d1, sh), sa, sb, xc);
}

/* kq1_rows8() for Q3_K */
TGT512G_INLINE void kq1_q3g_rows8(const struct gpud__mm *m, int64_t r)
{
	const int64_t nb = m->cols / GPUD_QK_K;
	const size_t unit = 8 * gpud__kq_block_bytes(GPUD_TYPE_Q3_K);
	const size_t pf = (KQ1_PF_BYTES + unit - 1) / unit * unit;
	const uint8_t *a = m->W + (size_t)r * m->wrow;
	__m256 acc = _mm256_setzero_ps();

	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *u = a + (size_t)i * unit;
		__m512 XD, dw;
		__m512i XC, X[4];

		kq1_unit(m, u, i, unit, pf, X, &XC, &XD, &dw);
#pragma GCC unroll 4
		for (int c = 0; c < 8; c += 2) {
			const __m512 ft = _mm512_cvtepi32_ps(kq1_q3g_t(u, X, XC, c));
			const __m512 sc = _mm512_mul_ps(dw, _mm512_permutexvar_ps(idx2(c, c + 1), XD));

			acc = fma_lo(sc, ft, acc);
			acc = fma_hi(sc, ft, acc);
		}
	}
	_mm256_storeu_ps(m->y + r, acc);
}

/* Q3_K, rows [r, r + 16) (two packed groups), batch 1, lane = row, as
 * q2k1_rows16(): the 2 bits of chunk 4h + j stay in place and the high
 * bit joins them just above (one vgf2p8affineqb, one vpternlogd), the
 * quant times 4^j; for j = 3 the 2 bits are first shifted down to 4, 5
 * (a high bit at 8 would not fit the byte). The 16 scales of each row
 * are unpacked once per super-block into bytes (the 6-bit values, before
 * the -32), and each chunk's pair by one vpshufb. The integers t and the
 * fp32 chain per row are those of kq1_q3g_rows8(). */
TGT512G_INLINE void q3k1_rows16(const struct gpud__mm *m, int64_t r)
{
	const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
	__m512 acc = _mm512_setzero_ps();
	struct sb16 b;

	for (sb16_init(&b, m, GPUD_TYPE_Q3_K, r); sb16_next(&b);) {
		const uint8_t *u = b.u, *v = b.v;
		const int8_t *xq = b.xq;
		const __m512 dw = ld2h(u, v, 0);
		const __m512i l0 = ld2(u, v, 16), l1 = ld2(u, v, 48), hh = ld2(u, v, 80);
		__m512i S[4], H[8], Q[8];

		/* byte k of S[q]'s dwords: scale 4q + k of the row, 0..63 */
		S[0] = _mm512_ternarylogic_epi32(l0, _mm512_and_si512(_mm512_slli_epi32(hh, 4), m30), m0f,
						 KQ1_AND_OR);
		S[1] = _mm512_ternarylogic_epi32(l1, _mm512_and_si512(_mm512_slli_epi32(hh, 2), m30), m0f,
						 KQ1_AND_OR);
		S[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(l0, 4), _mm512_and_si512(hh, m30), m0f,
						 KQ1_AND_OR);
		S[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(l1, 4),
						 _mm512_and_si512(_mm512_srli_epi32(hh, 2), m30), m0f,
						 KQ1_AND_OR);
		ld2x8(u, v, 112, H);
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			const int j = c % 4, s = j < 3 ? 2 * j : 4;

			if (j == 0) /* the next 32 qs bytes: chunks c..c + 3 */
				ld2x8(u, v, 368 + 256 * (size_t)(c / 4), Q);
			/* bit c of the hmask bytes to bit s + 2 */
			const __m512i mv = _mm512_set1_epi64(
				(long long)((uint64_t)(1u << c) << (8 * (7 - (s + 2)))));
			const __m512i mq = _mm512_set1_epi8((char)(3 << s));
			/* (sa, sb) as 16-bit halves, -32 */
			const __m512i sab = _mm512_sub_epi16(pair_words(S[c / 2], c % 2),
							     _mm512_set1_epi16(32));
			const __m512i sa = _mm512_srai_epi32(_mm512_slli_epi32(sab, 16), 16);
			const __m512i sb = _mm512_srai_epi32(sab, 16);
			__m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512(), t;

#pragma GCC unroll 8
			for (int g = 0; g < 8; g++) {
				const __m512i qs = j < 3 ? Q[g] : _mm512_srli_epi32(Q[g], 2);
				const __m512i q = _mm512_ternarylogic_epi32(
					qs, _mm512_gf2p8affine_epi64_epi8(H[g], mv, 0), mq, KQ1_AND_OR);

				if (g < 4)
					d0 = _mm512_dpbusd_epi32(d0, q, bcast4_512(xq + 32 * c + 4 * g));
				else
					d1 = _mm512_dpbusd_epi32(d1, q, bcast4_512(xq + 32 * c + 4 * g));
			}
			/* 2^s t', exact: shifted back, less the storage
			 * offset 4 * (sa * X_a + sb * X_b) */
			t = _mm512_add_epi32(_mm512_mullo_epi32(d0, sa), _mm512_mullo_epi32(d1, sb));
			if (s)
				t = _mm512_srai_epi32(t, (unsigned)s);
			t = _mm512_sub_epi32(
				t, _mm512_slli_epi32(_mm512_madd_epi16(sab, _mm512_set1_epi32(b.xc[c])), 2));
			acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(b.xd[c])),
					      _mm512_cvtepi32_ps(t), acc);
		}
	}
	_mm512_storeu_ps(m->y + r, acc);
}

TGT512G void gpud__avx512g_rows_q3kp1(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	for (; r0 + 16 <= r1; r0 += 16)
		q3k1_rows16(m, r0);
	for (int64_t r = r0; r < r1; r += 8)
		kq1_q3g_rows8(m, r);
}

#endif
