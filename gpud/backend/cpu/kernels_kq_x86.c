/* kernels_kq_x86.c - AVX2/FMA versions of the K-quant matmul (Q2_K..Q6_K),
 * and of Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS's (the last section).
 *
 * Same operations as kernels_kq.c, so the same bits: 8 weight rows ride in
 * the 8 lanes of one accumulator per batch column. Per super-block and
 * 32-chunk c, the 8 rows' chunk quants are unpacked and transposed once
 * (T[g] lane r = quants 4g..4g+3 of row r, as the q8_0/q4_0 kernel keeps
 * its blocks), so each column costs 8 vpmaddubsw against 4 broadcast
 * activation bytes and 8 vpmaddwd by the rows' sub-block scales, with no
 * horizontal sums: lane r holds row r's exact integer t. Then, lane by
 * lane, the portable fp32 steps:
 *     acc = fma(dw * dx[c], (float)t, acc); acc = fma(-(dmin * dx[c]),
 *     (float)mt, acc).
 * Q3_K/Q6_K quants are multiplied as stored (+4/+32, unsigned), and the
 * offset comes off the integer once per chunk: off * (sa * X_a + sb * X_b)
 * with X the activations' 16-quant half sums (the quantizer's
 * GPUD__ACT_HALVES), one vpmaddwd. Q2_K's mins multiply the 16-wide
 * activation sums.
 *
 * With AVX-512 VNNI, the packed K-quants take the 16-lane kernels of
 * kernels_avx512.c (the same integers t, so the same bits).
 *
 * Compiled with target attributes: call only once gpud_cpu_features()
 * reported AVX2+FMA+F16C.
 */
#include "gpud/backend/cpu/kernels_impl.h"

#ifdef GPUD_HAVE_X86

#include <immintrin.h>
#include "gpud/backend/cpu/x86_inline.h"
#include <stddef.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#define KQ_ROWS 8
#define KQ_BC 8 /* batch columns per pass over a row group */
#ifndef PK_PF
#define PK_PF 2 /* packed: units (8 rows x a super-block) prefetched ahead */
#endif



/* Chunk c (32 quants, u8) of one super-block of row type QT. */
TGT_INLINE __m256i unpack_chunk(enum gpud_type QT, const uint8_t *blk, int c)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	if (QT == GPUD_TYPE_Q2_K || QT == GPUD_TYPE_Q3_K) {
		const int h = c / 4, j = c % 4;
		const uint8_t *qs = QT == GPUD_TYPE_Q2_K ? ((const struct gpud_block_q2_k *)blk)->qs
							 : ((const struct gpud_block_q3_k *)blk)->qs;
		__m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));

		q = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)),
				     _mm256_set1_epi8(3));
		if (QT == GPUD_TYPE_Q3_K) {
			__m256i hb = _mm256_loadu_si256(
				(const __m256i *)((const struct gpud_block_q3_k *)blk)->hmask);

			hb = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(c)),
					      _mm256_set1_epi8(1));
			q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 2));
		}
		return q;
	}
	if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) {
		const uint8_t *qs = QT == GPUD_TYPE_Q4_K ? ((const struct gpud_block_q4_k *)blk)->qs
							 : ((const struct gpud_block_q5_k *)blk)->qs;
		__m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2)));
		__m256i q = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(v, 4) : v, m4);

		if (QT == GPUD_TYPE_Q5_K) {
			__m256i h = _mm256_loadu_si256(
				(const __m256i *)((const struct gpud_block_q5_k *)blk)->qh);

			h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(c)),
					     _mm256_set1_epi8(1));
			q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
		}
		return q;
	} else {
		const struct gpud_block_q6_k *b = (const struct gpud_block_q6_k *)blk;
		int h = c / 4, k = c % 4;
		__m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (k & 1)));
		__m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));

		l = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), m4);
		hb = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)),
				      _mm256_set1_epi8(3));
		return _mm256_or_si256(l, _mm256_slli_epi16(hb, 4));
	}
}

/* Q4_K/Q5_K: the 8 6-bit scales and 8 mins of one block's 12 packed
 * bytes, four at a time in 32-bit words (quant.h's layout: sub-blocks
 * 0-3 in the low 6 bits of bytes 0-3 / 4-7, sub-blocks 4-7 in the nibbles
 * of bytes 8-11 plus the top 2 bits of bytes 0-3 / 4-7). */
static inline void unpack_scale_min(const uint8_t *q, uint8_t sc[8], uint8_t mn[8])
{
	uint32_t u0, u1, u2, v;

	memcpy(&u0, q, 4);
	memcpy(&u1, q + 4, 4);
	memcpy(&u2, q + 8, 4);
	v = u0 & 0x3f3f3f3f;
	memcpy(sc, &v, 4);
	v = (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4;
	memcpy(sc + 4, &v, 4);
	v = u1 & 0x3f3f3f3f;
	memcpy(mn, &v, 4);
	v = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4;
	memcpy(mn + 4, &v, 4);
}

/* i16 pairs (s, s) in each 32-bit lane, for vpmaddwd. */
TGT_INLINE __m256i pair16(__m256i s)
{
	return _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xffff)),
			       _mm256_slli_epi32(s, 16));
}

/* Eight int32 as one vector: a load, or (load false) built from the
 * scalars, which beats a load of just-stored scalars (store forwarding). */
TGT_INLINE __m256i lanes8(const int32_t v[8], bool load)
{
	if (load)
		return _mm256_loadu_si256((const __m256i *)v);
	return _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

/* Packed Q4_K (pack.c): the 8 rows' 6-bit scales and mins, unpacked on all
 * 8 rows at once (lane r = row r): sm[0] scales 0-3, sm[1] scales 4-7,
 * sm[2] mins 0-3, sm[3] mins 4-7, one byte each, as unpack_scale_min(). */
TGT_INLINE void pk_q4k_scales(const uint8_t *u, __m256i sm[4])
{
	const __m256i w0 = _mm256_loadu_si256((const __m256i *)(u + 32));
	const __m256i w1 = _mm256_loadu_si256((const __m256i *)(u + 64));
	const __m256i w2 = _mm256_loadu_si256((const __m256i *)(u + 96));
	const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f);
	const __m256i m2 = _mm256_set1_epi8(0x03);

	sm[0] = _mm256_and_si256(w0, m6);
	sm[1] = _mm256_or_si256(_mm256_and_si256(w2, m4),
				_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m2), 4));
	sm[2] = _mm256_and_si256(w1, m6);
	sm[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m4),
				_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m2), 4));
}

/* Packed Q3_K: the signed 6-bit scale s (0..15) of the 8 rows, lane r =
 * row r, from the scale words at u + 16 (gpud_q3k_scale()'s bits: the
 * low nibble from byte s % 8, the high or low half by s / 8, the top two
 * bits from byte 8 + s % 4). */
TGT_INLINE __m256i pk_q3k_scale(const uint8_t *u, int s)
{
	const __m256i lo = _mm256_loadu_si256((const __m256i *)(u + 16 + 32 * ((s / 4) % 2)));
	const __m256i hi = _mm256_loadu_si256((const __m256i *)(u + 16 + 64));
	__m256i v = _mm256_and_si256(_mm256_srli_epi32(lo, 8 * (s % 4) + 4 * (s / 8)),
				     _mm256_set1_epi32(15));

	v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(
									  hi, 8 * (s % 4) + 2 * (s / 4)),
								  _mm256_set1_epi32(3)),
						 4));
	return _mm256_sub_epi32(v, _mm256_set1_epi32(32));
}

/* Chunk c of a packed unit u (8 rows x one super-block, pack.c): the
 * scales of its two 16-quant halves as i16 pairs (sa, sb) and, for Q3_K
 * and Q6_K, as one pair (sa, sb) in sab; for Q2_K, Q4_K and Q5_K its mins
 * (mv), exactly as the plain path builds them. */
TGT_INLINE void pk_scales(enum gpud_type QT, const uint8_t *u, int c, const __m256i sm[4],
			  __m256i *sa, __m256i *sb, __m256i *mv, __m256i *sab)
{
	if (QT == GPUD_TYPE_Q2_K) {
		/* bytes 2c, 2c + 1: scale in the low nibble, min in the high */
		const __m256i v = _mm256_loadu_si256((const __m256i *)(u + 32 + 32 * (c / 2)));
		const __m256i m = _mm256_set1_epi32(15);
		const int b = 16 * (c % 2);

		*sa = pair16(_mm256_and_si256(_mm256_srli_epi32(v, b), m));
		*sb = pair16(_mm256_and_si256(_mm256_srli_epi32(v, b + 8), m));
		*mv = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(v, b + 4), m),
				      _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(v, b + 12), m),
							16));
		return;
	}
	if (QT == GPUD_TYPE_Q3_K) {
		const __m256i a = pk_q3k_scale(u, 2 * c), b = pk_q3k_scale(u, 2 * c + 1);

		*sab = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0xffff)),
				       _mm256_slli_epi32(b, 16));
		*sa = pair16(a);
		*sb = pair16(b);
		return;
	}
	if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) {
		const int byte = c % 4;
		__m256i s = _mm256_and_si256(_mm256_srli_epi32(sm[c / 4], 8 * byte),
					     _mm256_set1_epi32(0xff));

		*sa = *sb = pair16(s);
		*mv = _mm256_and_si256(_mm256_srli_epi32(sm[2 + c / 4], 8 * byte),
				       _mm256_set1_epi32(0xff));
		return;
	}
	/* Q6_K */
	const __m128i sc = _mm_loadu_si128((const __m128i *)(u + 16 + 16 * c));
	const __m128i s16 = _mm_cvtepi8_epi16(sc), t16 = _mm_cvtepi8_epi16(_mm_srli_si128(sc, 8));

	*sa = pair16(_mm256_cvtepi8_epi32(sc));
	*sb = pair16(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));
	*sab = _mm256_setr_m128i(_mm_unpacklo_epi16(s16, t16), _mm_unpackhi_epi16(s16, t16));
}

/* Quants 4g..4g+3 of chunk c of the 8 rows of a packed unit u, lane r =
 * row r (Q6_K: as stored, +32). The 16-bit shifts move each bit inside
 * its byte's place (the masks drop what comes in from the neighbour
 * byte); with c a constant (unrolled) each is one instruction. */
TGT_INLINE __m256i pk_quant(enum gpud_type QT, const uint8_t *u, int c, int g)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	if (QT == GPUD_TYPE_Q2_K || QT == GPUD_TYPE_Q3_K) {
		/* bits 2j, 2j + 1 (j = c % 4) of bytes 32h.. (h = c / 4); Q3_K
		 * adds bit c of each high-bit byte as bit 2 */
		const size_t qs = QT == GPUD_TYPE_Q2_K ? 160 : 368;
		__m256i q = _mm256_loadu_si256((const __m256i *)(u + qs + 256 * (c / 4) + 32 * g));

		q = _mm256_and_si256(_mm256_srli_epi16(q, 2 * (c % 4)), _mm256_set1_epi8(3));
		if (QT == GPUD_TYPE_Q3_K) {
			__m256i hb = _mm256_loadu_si256((const __m256i *)(u + 112 + 32 * g));

			hb = c < 2 ? _mm256_slli_epi16(hb, 2 - c)
				   : c == 2 ? hb : _mm256_srli_epi16(hb, c - 2);
			q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
		}
		return q;
	}

	if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K) {
		const size_t qs = QT == GPUD_TYPE_Q4_K ? 128 : 384;
		__m256i v = _mm256_loadu_si256((const __m256i *)(u + qs + 256 * (c / 2) + 32 * g));
		__m256i q = _mm256_and_si256(c & 1 ? _mm256_srli_epi16(v, 4) : v, m4);

		if (QT == GPUD_TYPE_Q5_K) {
			/* bit c of each high-bit byte straight to bit 4 */
			__m256i hb = _mm256_loadu_si256((const __m256i *)(u + 128 + 32 * g));

			hb = c < 4 ? _mm256_slli_epi16(hb, 4 - c)
				   : c == 4 ? hb : _mm256_srli_epi16(hb, c - 4);
			q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
		}
		return q;
	}
	/* Q6_K: bits 2k, 2k + 1 of each high-bit byte straight to bits 4, 5 */
	const int h = c / 4, k = c % 4;
	__m256i l = _mm256_loadu_si256(
		(const __m256i *)(u + 144 + 512 * h + 256 * (k & 1) + 32 * g));
	__m256i hb = _mm256_loadu_si256((const __m256i *)(u + 1168 + 256 * h + 32 * g));

	l = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), m4);
	hb = k < 2 ? _mm256_slli_epi16(hb, 4 - 2 * k) : k == 2 ? hb : _mm256_srli_epi16(hb, 2);
	return _mm256_or_si256(l, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
}

/* The 8 rows of the group at r (nr of them before r1): rows past r1
 * repeat the last one; their lanes are dropped by group_store(). */
TGT_INLINE void group_rows(const struct gpud__mm *m, int64_t r, int64_t nr,
			   const uint8_t *w[KQ_ROWS])
{
	for (int k = 0; k < KQ_ROWS; k++)
		w[k] = m->W + (size_t)(r + (k < nr ? k : nr - 1)) * m->wrow;
}

/* Lanes 0..nr-1 of acc (row r.. of column col) into y. */
TGT_INLINE void group_store(const struct gpud__mm *m, int64_t col, int64_t r, int64_t nr,
			    __m256 acc)
{
	float *y = m->y + col * m->rows + r;

	if (nr == KQ_ROWS) {
		_mm256_storeu_ps(y, acc);
	} else {
		float tmp[KQ_ROWS];

		_mm256_storeu_ps(tmp, acc);
		memcpy(y, tmp, sizeof(float) * (size_t)nr);
	}
}

/* bcmax: columns per pass, a constant at each call (1 keeps batch 1's
 * accumulator in a register). PK: W is packed (Q2_K .. Q6_K). */
TGT_INLINE void kq_rows(const struct gpud__mm *m, enum gpud_type QT, bool PK, int64_t bcmax,
			int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK_K, nb32 = m->cols / GPUD_QK;
	const bool mins = QT != GPUD_TYPE_Q6_K && QT != GPUD_TYPE_Q3_K;
	/* the quants' storage offset (Q3_K +4, Q6_K +32) as a shift, taken
	 * back once per chunk */
	const int qsh = QT == GPUD_TYPE_Q6_K ? 5 : QT == GPUD_TYPE_Q3_K ? 2 : 0;
	/* maddubs results added in i16 before each vpmaddwd: a pair is at
	 * most 2 * 63 * 127 (Q6_K, unsigned), 2 * 31 * 127 (Q5_K), less for
	 * the others, and the sum must stay <= 32767 */
	const int n16 = QT == GPUD_TYPE_Q6_K ? 2 : 4;
	/* Packed, batch 1: each quant vector is unpacked where it is used
	 * (fewer live registers) and the 8 chunks are unrolled, so that their
	 * bit shifts are constants (bench/kernel_mca.sh, znver3, cycles a
	 * chunk: Q5_K ~30 -> 23, Q6_K ~29 -> 23, Q4_K ~19 -> 16). */
	const bool fuse = PK && bcmax == 1;
	const int unroll = fuse ? 8 : 1;
	const size_t bsz = gpud__kq_block_bytes(QT);

	for (int64_t r = r0; r < r1; r += KQ_ROWS) {
		const int64_t nr = r1 - r < KQ_ROWS ? r1 - r : KQ_ROWS;
		const uint8_t *w[KQ_ROWS];

		group_rows(m, r, nr, w);
		for (int64_t b0 = 0; b0 < m->batch; b0 += bcmax) {
			const int64_t bc = m->batch - b0 < bcmax ? m->batch - b0 : bcmax;
			__m256 acc[KQ_BC];

			for (int64_t b = 0; b < bc; b++)
				acc[b] = _mm256_setzero_ps();
			for (int64_t i = 0; i < nb; i++) {
				uint8_t sc[KQ_ROWS][8], mn[KQ_ROWS][8];
				float dv[KQ_ROWS], dmv[KQ_ROWS];
				__m256 dw, dmin = _mm256_setzero_ps();
				const uint8_t *u = w[0] + (size_t)i * KQ_ROWS * bsz;
				__m256i sm[4];

				if (PK) {
					for (size_t o = 0; o < KQ_ROWS * bsz; o += 64)
						_mm_prefetch((const char *)u + PK_PF * KQ_ROWS * bsz + o,
							     _MM_HINT_T0);
					dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u));
					if (mins)
						dmin = _mm256_cvtph_ps(
							_mm_loadu_si128((const __m128i *)(u + 16)));
					if (QT == GPUD_TYPE_Q4_K || QT == GPUD_TYPE_Q5_K)
						pk_q4k_scales(u, sm);
				}
				_Pragma("GCC unroll 8")
				for (int k = 0; k < KQ_ROWS && !PK; k++) {
					const uint8_t *blk = w[k] + (size_t)i * bsz;
					uint16_t h[2];

					/* The same block of the next row group, read one
					 * group later (as the q8_0/q4_0 kernel does); past
					 * the slice or the matrix it is a harmless hint. */
					for (size_t o = 0; o < bsz; o += 64)
						_mm_prefetch((const char *)blk + KQ_ROWS * m->wrow + o,
							     _MM_HINT_T0);

					if (QT == GPUD_TYPE_Q6_K) {
						memcpy(h, blk + offsetof(struct gpud_block_q6_k, d), 2);
						dv[k] = _cvtsh_ss(h[0]);
						continue;
					}
					if (QT == GPUD_TYPE_Q3_K) {
						memcpy(h, blk + offsetof(struct gpud_block_q3_k, d), 2);
						dv[k] = _cvtsh_ss(h[0]);
						continue;
					}
					if (QT == GPUD_TYPE_Q2_K) {
						memcpy(h, blk + offsetof(struct gpud_block_q2_k, d), 4);
						dv[k] = _cvtsh_ss(h[0]);
						dmv[k] = _cvtsh_ss(h[1]);
						continue;
					}
					memcpy(h, blk, 4); /* d, dmin */
					dv[k] = _cvtsh_ss(h[0]);
					dmv[k] = _cvtsh_ss(h[1]);
					unpack_scale_min(blk + 4, sc[k], mn[k]);
				}
				if (!PK) {
					dw = _mm256_loadu_ps(dv);
					if (mins)
						dmin = _mm256_loadu_ps(dmv);
				}
				const __m256 ndmin = _mm256_xor_ps(dmin, _mm256_set1_ps(-0.0f));

				/* The chunks in runs of unroll, each run unrolled: with
				 * unroll 8 one run (c a constant in each copy), with 1
				 * a plain loop. The two loops share one indent. */
				for (int c0 = 0; c0 < 8; c0 += unroll)
				_Pragma("GCC unroll 8")
				for (int c = c0; c < c0 + unroll; c++) {
					__m256i W[KQ_ROWS], T[8], sa, sb, mv = _mm256_setzero_si256(),
						sab = _mm256_setzero_si256();
					int32_t s32a[KQ_ROWS], s32b[KQ_ROWS], m32a[KQ_ROWS], m32b[KQ_ROWS];

					if (PK) {
						pk_scales(QT, u, c, sm, &sa, &sb, &mv, &sab);
						_Pragma("GCC unroll 8")
						for (int g = 0; g < 8 && !fuse; g++)
							T[g] = pk_quant(QT, u, c, g);
					} else {
						_Pragma("GCC unroll 8")
						for (int k = 0; k < KQ_ROWS; k++) {
							const uint8_t *blk = w[k] + (size_t)i * bsz;

							W[k] = unpack_chunk(QT, blk, c);
							if (QT == GPUD_TYPE_Q6_K) {
								const int8_t *s6 = ((const struct gpud_block_q6_k *)blk)->scales;

								s32a[k] = s6[2 * c];
								s32b[k] = s6[2 * c + 1];
							} else if (QT == GPUD_TYPE_Q3_K) {
								const uint8_t *s3 = ((const struct gpud_block_q3_k *)blk)->scales;

								s32a[k] = gpud_q3k_scale(s3, 2 * c);
								s32b[k] = gpud_q3k_scale(s3, 2 * c + 1);
							} else if (QT == GPUD_TYPE_Q2_K) {
								const uint8_t *s2 = ((const struct gpud_block_q2_k *)blk)->scales;

								s32a[k] = s2[2 * c] & 15;
								s32b[k] = s2[2 * c + 1] & 15;
								m32a[k] = s2[2 * c] >> 4;
								m32b[k] = s2[2 * c + 1] >> 4;
							} else {
								s32a[k] = s32b[k] = sc[k][c];
							}
						}
						/* T[g] lane r: quants 4g..4g+3 of row r */
						transpose8(W, T);
						/* i16 pairs of lane r: the row's scale (vpmaddwd) */
						/* Q4_K/Q5_K: built from scalars (a vector load of
						 * just-stored scalars stalled on store forwarding:
						 * 2x slower); Q6_K measured faster loading them. */
						sa = lanes8(s32a, QT == GPUD_TYPE_Q6_K);
						sb = lanes8(s32b, QT == GPUD_TYPE_Q6_K);
						if (qsh)
							sab = _mm256_or_si256(
								_mm256_and_si256(sa, _mm256_set1_epi32(0xffff)),
								_mm256_slli_epi32(sb, 16));
						sa = pair16(sa);
						sb = pair16(sb);
						if (QT == GPUD_TYPE_Q2_K) {
							mv = _mm256_or_si256(lanes8(m32a, false),
									     _mm256_slli_epi32(lanes8(m32b, false), 16));
						} else if (mins) {
							mv = _mm256_setr_epi32(mn[0][c], mn[1][c], mn[2][c], mn[3][c],
									       mn[4][c], mn[5][c], mn[6][c], mn[7][c]);
						}
					}
					for (int64_t b = 0; b < bc; b++) {
						const int64_t col = b0 + b, xi = col * nb32 + i * 8 + c;
						const int8_t *xq = m->xq + col * m->cols + i * GPUD_QK_K + 32 * c;
						__m256i p16[4], t;
						__m256 xd = _mm256_set1_ps(m->xd[xi]);

						/* n16 products add up in i16 before the scale
						 * (bounds above): one vpmaddwd per n16 instead of
						 * per product, the same exact integer t. */
						_Pragma("GCC unroll 8")
						for (int g = 0; g < 8; g++) {
							__m256i q = fuse ? pk_quant(QT, u, c, g) : T[g];
							__m256i p = _mm256_maddubs_epi16(q, bcast4(xq + 4 * g));

							p16[g / n16] = g % n16 ? _mm256_add_epi16(p16[g / n16], p) : p;
						}
						/* Q4_K's halves share their scale, and 8 nibble
						 * products stay <= 8 * 3810 in i16: one vpmaddwd. */
						if (QT == GPUD_TYPE_Q4_K)
							t = _mm256_madd_epi16(_mm256_add_epi16(p16[0], p16[1]),
									      sa);
						else if (n16 == 4)
							t = _mm256_add_epi32(_mm256_madd_epi16(p16[0], sa),
									     _mm256_madd_epi16(p16[1], sb));
						else
							t = _mm256_add_epi32(
								_mm256_add_epi32(_mm256_madd_epi16(p16[0], sa),
										 _mm256_madd_epi16(p16[1], sa)),
								_mm256_add_epi32(_mm256_madd_epi16(p16[2], sb),
										 _mm256_madd_epi16(p16[3], sb)));
						/* the storage offset: off * (sa * X_a + sb * X_b) */
						if (qsh)
							t = _mm256_sub_epi32(
								t, _mm256_slli_epi32(
									   _mm256_madd_epi16(
										   sab, _mm256_set1_epi32(m->xc[xi])),
									   qsh));
						acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xd),
									 _mm256_cvtepi32_ps(t), acc[b]);
						if (mins) {
							/* Q2_K: ma * X_a + mb * X_b from the half
							 * sums (mv holds the (ma, mb) pairs); the
							 * others: mv * X, mv <= 63 in the low i16
							 * of each lane and |X| <= 32 * 127, so one
							 * vpmaddwd is the exact product */
							__m256i mt = _mm256_madd_epi16(
								mv, _mm256_set1_epi32(m->xc[xi]));

							/* -(dmin * xd), exactly */
							acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(ndmin, xd),
										 _mm256_cvtepi32_ps(mt), acc[b]);
						}
					}
				}
			}
			for (int64_t b = 0; b < bc; b++)
				group_store(m, b0 + b, r, nr, acc[b]);
		}
	}
}

/* Rows [r0, r1) in pairs of 8-row groups by an AVX-512 kernel; returns
 * where the rest (a last single group, or nothing: r1) starts. */
static inline int64_t in_pairs(const struct gpud__mm *m, int64_t r0, int64_t r1,
			       void (*pairs)(const struct gpud__mm *, int64_t, int64_t))
{
	int64_t r16 = r0 + (r1 - r0) / 16 * 16;

	pairs(m, r0, r16);
	return r16;
}

/* One copy of kq_rows per type, layout and batch-1-or-not. */
#define KQ_CASE(QT)                                                     \
	case QT:                                                        \
		if (m->packed && one)                                   \
			kq_rows(m, QT, true, 1, r0, r1);                \
		else if (m->packed)                                     \
			kq_rows(m, QT, true, KQ_BC, r0, r1);            \
		else if (one)                                           \
			kq_rows(m, QT, false, 1, r0, r1);               \
		else                                                    \
			kq_rows(m, QT, false, KQ_BC, r0, r1);           \
		break;

TGT void gpud__x86_kq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	const bool one = m->batch == 1;

	/* Packed with AVX-512 VNNI: at batch 1 the kernels of
	 * kernels_avx512.c (Q2_K, and Q3_K with GFNI, pairs of row groups,
	 * the others one group at a time); from batch 2 on pairs of row groups there,
	 * a last single group here. (The batch kernel's pairs at batch 1
	 * were 1.3-1.7x faster on cached weights but 0.8-1.2x from DRAM in
	 * interleaved bench_matmul 3b runs, and the engine's Q4_K_M decode
	 * median 0.96x: their prefetch then missed a pair's second group,
	 * see pf_pair() there.) */
	if (m->packed && m->avx512vnni && one) {
		gpud__avx512_rows_kqp1(m, r0, r1); /* Q2_K..Q6_K */
		return;
	}
	if (m->packed && m->avx512vnni && (r0 = in_pairs(m, r0, r1, gpud__avx512_rows_kqp)) == r1)
		return;
	switch (m->wtype) {
	KQ_CASE(GPUD_TYPE_Q4_K)
	KQ_CASE(GPUD_TYPE_Q5_K)
	KQ_CASE(GPUD_TYPE_Q6_K)
	KQ_CASE(GPUD_TYPE_Q2_K)
	KQ_CASE(GPUD_TYPE_Q3_K)
	default:
		gpud__kq_mm_rows(m, r0, r1);
		break;
	}
}

/* ---- Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS (kernels_kq.c states the operations)
 * As above, 8 rows in the 8 lanes: plain, each row's block unpacked to 32
 * bytes and the 8 transposed (T[g] lane r = quants 4g..4g+3 of row r);
 * packed (pack.c), T[g] straight from the unit's vectors. Then per batch
 * column 8 vpmaddubsw (or with VNNI 8 vpdpbusd) against broadcast
 * activation bytes. Q4_1, Q5_0 and Q5_1 multiply their unsigned quants
 * (Q5_0's offset of 16 comes back through xc = -16 X); IQ4_NL's (and
 * IQ4_XS's, chunk by chunk) signed table values multiply as |q| times x
 * with q's sign (vpsignb), a pair at most 2 * 127 * 127. */

/* IQ4_NL's 16 values (quant.h) in both 128-bit halves, for vpshufb. */
TGT_INLINE __m256i iq4nl_table(void)
{
	static const int8_t nl[16] = GPUD_IQ4NL_VALUES;

	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nl));
}

/* Block blk's 32 quants (unsigned; IQ4_NL's signed table values); for
 * IQ4_XS those of chunk c of the super-block blk. */
TGT_INLINE __m256i lq_unpack(enum gpud_type QT, const uint8_t *blk, int c)
{
	const size_t qso = QT == GPUD_TYPE_Q4_1	  ? offsetof(struct gpud_block_q4_1, qs)
			   : QT == GPUD_TYPE_Q5_0 ? offsetof(struct gpud_block_q5_0, qs)
			   : QT == GPUD_TYPE_Q5_1 ? offsetof(struct gpud_block_q5_1, qs)
			   : QT == GPUD_TYPE_IQ4_XS
				   ? offsetof(struct gpud_block_iq4_xs, qs) + 16 * (size_t)c
				   : offsetof(struct gpud_block_iq4_nl, qs);
	const __m128i v = _mm_loadu_si128((const __m128i *)(blk + qso));
	__m256i q = _mm256_and_si256(_mm256_setr_m128i(v, _mm_srli_epi16(v, 4)),
				     _mm256_set1_epi8(0x0f));

	if (QT == GPUD_TYPE_Q5_0 || QT == GPUD_TYPE_Q5_1) {
		/* bit j of qh to byte j: byte j takes qh byte j / 8, then its
		 * bit j % 8 */
		const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
						     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
		const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
		int32_t qh;
		__m256i h;

		memcpy(&qh,
		       blk + (QT == GPUD_TYPE_Q5_0 ? offsetof(struct gpud_block_q5_0, qh)
						   : offsetof(struct gpud_block_q5_1, qh)),
		       sizeof(qh));
		h = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), sel);
		h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
		q = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
	}
	if (QT == GPUD_TYPE_IQ4_NL || QT == GPUD_TYPE_IQ4_XS)
		q = _mm256_shuffle_epi8(iq4nl_table(), q);
	return q;
}

/* Packed (pack.c): a unit u's T[g] straight from its nibble vectors (lane
 * r = row r, no transpose); Q5's fifth bits from the qh vector at qh (lane
 * r = row r's word): quants 4g..4g+3 take bits 4g..4g+3, all in qh byte
 * g / 2, bits 4 (g % 2) + b for byte b. */
TGT_INLINE void lq_pk_quants(enum gpud_type QT, const uint8_t *nib, const uint8_t *qh,
			     __m256i T[8])
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);

	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++) {
		const __m256i v = _mm256_loadu_si256((const __m256i *)(nib + 32 * k));

		T[k] = _mm256_and_si256(v, m4);
		T[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
	}
	if (QT == GPUD_TYPE_Q5_0 || QT == GPUD_TYPE_Q5_1) {
		const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
		const __m256i lo = _mm256_set1_epi32(0x08040201), hi = _mm256_set1_epi32((int)0x80402010u);

		_Pragma("GCC unroll 8")
		for (int g = 0; g < 8; g++) {
			/* byte g / 2 of each lane into the lane's 4 bytes */
			const __m256i sel = _mm256_setr_epi8(
				g / 2, g / 2, g / 2, g / 2, 4 + g / 2, 4 + g / 2, 4 + g / 2, 4 + g / 2,
				8 + g / 2, 8 + g / 2, 8 + g / 2, 8 + g / 2, 12 + g / 2, 12 + g / 2,
				12 + g / 2, 12 + g / 2, g / 2, g / 2, g / 2, g / 2, 4 + g / 2, 4 + g / 2,
				4 + g / 2, 4 + g / 2, 8 + g / 2, 8 + g / 2, 8 + g / 2, 8 + g / 2,
				12 + g / 2, 12 + g / 2, 12 + g / 2, 12 + g / 2);
			const __m256i bit = g % 2 ? hi : lo;
			__m256i b = _mm256_and_si256(_mm256_shuffle_epi8(h, sel), bit);

			b = _mm256_cmpeq_epi8(b, bit);
			T[g] = _mm256_or_si256(T[g], _mm256_and_si256(b, _mm256_set1_epi8(0x10)));
		}
	}
	if (QT == GPUD_TYPE_IQ4_NL) {
		const __m256i nl = iq4nl_table();

		_Pragma("GCC unroll 8")
		for (int g = 0; g < 8; g++)
			T[g] = _mm256_shuffle_epi8(nl, T[g]);
	}
}

/* VNNI: vpdpbusd takes the u8 quants as they are (IQ4_NL's as q + 128,
 * whose 128 X comes off t), 4 products a lane in one instruction. PK: W
 * is packed. */
TGT_INLINE void lq_rows(const struct gpud__mm *m, enum gpud_type QT, bool PK, int64_t bcmax,
			bool VNNI, int64_t r0, int64_t r1)
{
	const int64_t nb = m->cols / GPUD_QK;
	const bool mins = QT == GPUD_TYPE_Q4_1 || QT == GPUD_TYPE_Q5_1;
	const bool xs = QT == GPUD_TYPE_IQ4_XS, nl = QT == GPUD_TYPE_IQ4_NL || xs;
	/* vpmaddubsw results added in i16 before each vpmaddwd: a pair is at
	 * most 2 * 31 * 127 (Q5), 2 * 127 * 127 (IQ4_NL) */
	const int n16 = nl ? 1 : 4;
	const size_t bsz = QT == GPUD_TYPE_Q4_1	  ? sizeof(struct gpud_block_q4_1)
			   : QT == GPUD_TYPE_Q5_0 ? sizeof(struct gpud_block_q5_0)
			   : QT == GPUD_TYPE_Q5_1 ? sizeof(struct gpud_block_q5_1)
			   : xs			  ? sizeof(struct gpud_block_iq4_xs)
						  : sizeof(struct gpud_block_iq4_nl);
	/* IQ4_XS: block i is chunk i % 8 of super-block i / 8 */
	const int64_t per = xs ? GPUD_QK_K / GPUD_QK : 1;
	const __m256i ones = _mm256_set1_epi16(1);

	for (int64_t r = r0; r < r1; r += KQ_ROWS) {
		const int64_t nr = r1 - r < KQ_ROWS ? r1 - r : KQ_ROWS;
		const uint8_t *w[KQ_ROWS];

		group_rows(m, r, nr, w);
		for (int64_t b0 = 0; b0 < m->batch; b0 += bcmax) {
			const int64_t bc = m->batch - b0 < bcmax ? m->batch - b0 : bcmax;
			__m256 acc[KQ_BC];

			for (int64_t b = 0; b < bc; b++)
				acc[b] = _mm256_setzero_ps();
			for (int64_t i = 0; i < nb; i++) {
				__m256i W[KQ_ROWS], T[8];
				float dv[KQ_ROWS], mv[KQ_ROWS];
				__m256 dw, mw = _mm256_setzero_ps();

				if (PK) {
					/* the unit: 8 d, [8 m], [8 qh words], nibbles;
					 * IQ4_XS: 8 d, 8 scales_h, 8 scales_l words,
					 * each chunk's nibbles */
					const size_t nf = mins ? 2 : 1;
					const bool q5 = QT == GPUD_TYPE_Q5_0 || QT == GPUD_TYPE_Q5_1;
					const uint8_t *u = w[0] + (size_t)(i / per) * KQ_ROWS * bsz;

					if (i % per == 0)
						for (size_t o = 0; o < KQ_ROWS * bsz; o += 64)
							_mm_prefetch((const char *)u + PK_PF * KQ_ROWS * bsz + o,
								     _MM_HINT_T0);
					dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u));
					if (mins)
						mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(u + 16)));
					if (xs) {
						const int c = (int)(i % per);
						const __m256i sh = _mm256_cvtepu16_epi32(
							_mm_loadu_si128((const __m128i *)(u + 16)));
						const __m256i sl = _mm256_loadu_si256((const __m256i *)(u + 32));
						__m256i ls = _mm256_or_si256(
							_mm256_and_si256(_mm256_srli_epi32(sl, 8 * (c / 2) + 4 * (c % 2)),
									 _mm256_set1_epi32(15)),
							_mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * c),
											   _mm256_set1_epi32(3)),
									  4));

						/* dl = d * (ls - 32), one fp32 product a lane */
						dw = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(_mm256_sub_epi32(
									       ls, _mm256_set1_epi32(32))));
						lq_pk_quants(GPUD_TYPE_IQ4_NL, u + 64 + 128 * c, NULL, T);
					} else {
						lq_pk_quants(QT, u + 16 * nf + (q5 ? 32 : 0), u + 16 * nf, T);
					}
				}
				_Pragma("GCC unroll 8")
				for (int k = 0; k < KQ_ROWS && !PK; k++) {
					const uint8_t *blk = w[k] + (size_t)(i / per) * bsz;
					uint16_t h[2];

					/* the same block of the next row group (a hint) */
					if (i % per == 0)
						_mm_prefetch((const char *)blk + KQ_ROWS * m->wrow, _MM_HINT_T0);
					memcpy(h, blk, sizeof(h));
					dv[k] = _cvtsh_ss(h[0]);
					mv[k] = mins ? _cvtsh_ss(h[1]) : 0.0f;
					if (xs)
						dv[k] *= (float)(gpud_iq4xs_ls(
								 (const struct gpud_block_iq4_xs *)blk,
								 (int)(i % per)) - 32);
					W[k] = lq_unpack(QT, blk, (int)(i % per));
				}
				if (!PK) {
					dw = _mm256_loadu_ps(dv);
					if (mins)
						mw = _mm256_loadu_ps(mv);
					transpose8(W, T);
				}
				if (nl) /* |q| (the signs go onto x), or q + 128 */
					_Pragma("GCC unroll 8")
					for (int g = 0; g < 8; g++)
						W[g] = VNNI ? _mm256_xor_si256(T[g], _mm256_set1_epi8(-128))
							    : _mm256_sign_epi8(T[g], T[g]);
				for (int64_t b = 0; b < bc; b++) {
					const int64_t col = b0 + b, xi = col * nb + i;
					const int8_t *xq = m->xq + col * m->cols + GPUD_QK * i;
					const __m256 xd = _mm256_set1_ps(m->xd[xi]);
					__m256i p16[8], t;

					if (VNNI) {
						/* two chains of 4 (the instruction's latency) */
						__m256i s0 = _mm256_setzero_si256(), s1 = s0;

						_Pragma("GCC unroll 4")
						for (int g = 0; g < 8; g += 2) {
							s0 = dpbusd_vex(s0, nl ? W[g] : T[g], bcast4(xq + 4 * g));
							s1 = dpbusd_vex(s1, nl ? W[g + 1] : T[g + 1],
									bcast4(xq + 4 * g + 4));
						}
						t = _mm256_add_epi32(s0, s1);
						if (nl) /* xc = X */
							t = _mm256_sub_epi32(t, _mm256_slli_epi32(
										     _mm256_set1_epi32(m->xc[xi]), 7));
					} else {
						_Pragma("GCC unroll 8")
						for (int g = 0; g < 8; g++) {
							__m256i x = bcast4(xq + 4 * g), p;

							p = nl ? _mm256_maddubs_epi16(W[g],
										      _mm256_sign_epi8(x, T[g]))
							       : _mm256_maddubs_epi16(T[g], x);
							p16[g / n16] = g % n16 ? _mm256_add_epi16(p16[g / n16], p)
									       : p;
						}
						t = _mm256_madd_epi16(p16[0], ones);
						for (int k = 1; k < 8 / n16; k++)
							t = _mm256_add_epi32(t, _mm256_madd_epi16(p16[k], ones));
					}
					if (QT == GPUD_TYPE_Q5_0) /* xc = -16 X */
						t = _mm256_add_epi32(t, _mm256_set1_epi32(m->xc[xi]));
					acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dw, xd), _mm256_cvtepi32_ps(t),
								 acc[b]);
					if (mins)
						acc[b] = _mm256_fmadd_ps(
							_mm256_mul_ps(mw, xd),
							_mm256_cvtepi32_ps(_mm256_set1_epi32(m->xc[xi])),
							acc[b]);
				}
			}
			for (int64_t b = 0; b < bc; b++)
				group_store(m, b0 + b, r, nr, acc[b]);
		}
	}
}

#define LQ_VARIANTS(QT, PK)                                         \
	do {                                                        \
		if (m->batch == 1 && m->vnni)                       \
			lq_rows(m, QT, PK, 1, true, r0, r1);        \
		else if (m->vnni)                                   \
			lq_rows(m, QT, PK, KQ_BC, true, r0, r1);    \
		else if (m->batch == 1)                             \
			lq_rows(m, QT, PK, 1, false, r0, r1);       \
		else                                                \
			lq_rows(m, QT, PK, KQ_BC, false, r0, r1);   \
	} while (0)
#define LQ_CASE(QT)                                                 \
	case QT:                                                    \
		if (m->packed)                                      \
			LQ_VARIANTS(QT, true);                      \
		else                                                \
			LQ_VARIANTS(QT, false);                     \
		break;

TGT void gpud__x86_lq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1)
{
	/* Packed with AVX-512 VNNI: pairs of row groups there, a last single
	 * group here. */
	if (m->packed && m->avx512vnni && (r0 = in_pairs(m, r0, r1, gpud__avx512_rows_lqp)) == r1)
		return;
	switch (m->wtype) {
	LQ_CASE(GPUD_TYPE_Q4_1)
	LQ_CASE(GPUD_TYPE_Q5_0)
	LQ_CASE(GPUD_TYPE_Q5_1)
	LQ_CASE(GPUD_TYPE_IQ4_NL)
	LQ_CASE(GPUD_TYPE_IQ4_XS)
	default:
		gpud__lq_mm_rows(m, r0, r1);
		break;
	}
}

#endif /* GPUD_HAVE_X86 */
