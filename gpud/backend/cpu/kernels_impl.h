/* kernels_impl.h - private to kernels.c and kernels_x86.c.
 *
 * The matmul job description, a helper both paths share and the entry
 * points of the x86 file. The x86 functions are compiled with target
 * attributes and may only be called once gpud_cpu_features() reported
 * AVX2+FMA+F16C.
 */
#ifndef GPUD_KERNELS_IMPL_H
#define GPUD_KERNELS_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/backend/cpu/kernels.h"

/* struct gpud__mm, the matmul job description: kernels.h */

/* pack.c: the packed layouts. A unit is block i of a group of 8 rows. */
#define GPUD__PK_ROWS 8
#define GPUD__PK_ROWS_F16 16 /* f16's groups (pack.c), and bf16's and f32's */
/* The float types, packed in column-major panels of 16 rows (pack.c) */
static inline bool gpud__pk_panel(enum gpud_type t)
{
	return t == GPUD_TYPE_F16 || t == GPUD_TYPE_BF16 || t == GPUD_TYPE_F32;
}
bool gpud__pk_type(enum gpud_type t);
int gpud__pk_rows(enum gpud_type t); /* rows per group */
/* Row r's (0..7) block i of a packed group, back in the plain layout
 * (block types only). */
void gpud__pk_unpack_block(enum gpud_type t, const uint8_t *group, int64_t r, int64_t i,
			   uint8_t *out);
/* Packs row groups [g0, g1) of plain W (cols wide) into dst (the whole
 * matrix's packed copy). */
void gpud__pk_pack_rows(enum gpud_type t, const void *W, void *dst, int64_t g0, int64_t g1,
			int64_t cols);

/* Bytes of a K-quant block, a constant wherever QT is one (the kernels'
 * unrolled loops need it so: gpud_type_block_bytes() is a call). */
static inline size_t gpud__kq_block_bytes(enum gpud_type QT)
{
	switch (QT) {
	case GPUD_TYPE_Q2_K: return sizeof(struct gpud_block_q2_k);
	case GPUD_TYPE_Q3_K: return sizeof(struct gpud_block_q3_k);
	case GPUD_TYPE_Q4_K: return sizeof(struct gpud_block_q4_k);
	case GPUD_TYPE_Q5_K: return sizeof(struct gpud_block_q5_k);
	default: return sizeof(struct gpud_block_q6_k);
	}
}

/* kernels_kq.c: true for the K-quant weight types it multiplies; their
 * rows (x already in m->xq/xd/xc), portable. */
bool gpud__kq_type(enum gpud_type t);
void gpud__kq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* kernels_kq.c: Q4_1, Q5_0, Q5_1 and IQ4_NL (the 32-weight types besides
 * Q8_0/Q4_0), their activation quantizer's off and their rows, portable. */
bool gpud__lq_type(enum gpud_type t);
int32_t gpud__lq_act_off(enum gpud_type t);
void gpud__lq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1);

/* Activation block scale from its max |x| (as Q8_0's, kept in fp32); *id
 * is 1/d or 0. Shared so that both paths produce bit-identical quants. */
static inline float gpud__q8_scale(float amax, float *id)
{
	float d = amax / 127.0f;

	*id = d != 0.0f ? 1.0f / d : 0.0f;
	return d;
}

/* Activation quantization for the int8 path, identical in both files:
 * blocks whose max |x| is below this are all zero; a block holding a NaN
 * or Inf gets d = NaN (so the outputs it feeds are NaN, as in fp32). */
#define GPUD__ACT_TINY 1e-30f

/* The quantizer's off for Q2_K/Q3_K/Q6_K: each block's xc holds its two
 * 16-quant half sums (|sum| <= 16 * 127, so i16) in one int32, first half
 * in the low 16 bits: one vpmaddwd against the rows' (a, b) pairs gives
 * Q2_K's min term and Q3_K/Q6_K's offset correction in the x86 kernel. */
#define GPUD__ACT_HALVES INT32_MIN

/* -DGPUD_FORCE_PORTABLE_BUILD builds as on a non-x86 CPU (checks that the
 * portable build stays warning-free and correct). */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(GPUD_FORCE_PORTABLE_BUILD)
#define GPUD_HAVE_X86 1
void gpud__x86_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* kernels_kq_x86.c: the K-quant rows, the bits of the portable ones. */
void gpud__x86_kq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* and the Q4_1, Q5_0, Q5_1, IQ4_NL rows, the bits of gpud__lq_mm_rows() */
void gpud__x86_lq_mm_rows(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* kernels_avx512.c (only with GPUD_CPU_AVX512): packed f16 rows, the bits
 * of kernels_x86.c's. */
void gpud__avx512_rows_f16p(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* (only with GPUD_CPU_AVX512VNNI too) packed q8_0/q4_0 rows, r1 - r0 a
 * multiple of 16: the bits of kernels_x86.c's. */
void gpud__avx512_rows_i8p(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* packed Q4_1, Q5_0, Q5_1, IQ4_NL rows, r1 - r0 a multiple of 16: the bits
 * of kernels_kq_x86.c's. */
void gpud__avx512_rows_lqp(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* packed K-quant (Q2_K..Q6_K) rows at batch > 1, r1 - r0 a multiple of 16: the
 * bits of kernels_kq_x86.c's. */
void gpud__avx512_rows_kqp(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* the same types at batch 1 (r0, r1 multiples of 8): Q2_K (and Q3_K,
 * below) two 8-row groups at a time while two remain, the others one
 * group at a time; the bits of kernels_kq_x86.c's. */
void gpud__avx512_rows_kqp1(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* (only with GPUD_CPU_GFNI too) Q3_K's rows there, the same bits */
void gpud__avx512g_rows_q3kp1(const struct gpud__mm *m, int64_t r0, int64_t r1);
/* gpud_dequantize_row()'s bits, vectorized; false when the type has no
 * vector version (the caller falls back to gpud_dequantize_row()). */
bool gpud__x86_dequantize_row(enum gpud_type t, const void *x, float *y, int64_t n);
/* One activation row of n (multiple of 32) floats to int8 blocks: q[n],
 * d[n/32], c[n/32] = -off * sum of the block's quants. */
void gpud__x86_quantize_act(const float *x, int64_t n, int32_t off, int8_t *q, float *d,
			    int32_t *c);
#endif

#endif
