/* kernels.h - the CPU backend's matrix kernels.
 *
 * The weight formats themselves (traits, block layouts, quantize,
 * dequantize) are gpud/quant.h's; this file multiplies them. Quantized
 * weights are used in place, or in a packed copy made once at load
 * ("packed layouts" below; the CPU backend packs what it can). Float-type
 * weights (f32/f16/bf16) are multiplied as fp32 with fp32 activations. q8_0/q4_0 weights use an
 * int8 path at every batch size: each activation row is quantized once per
 * gpud_matmul call to blocks of 32 int8 (fp32 scale d = max|x| / 127,
 * q = round(x / d), into the caller's scratch), each (row, column) pair
 * sums exact integer block dot products, and one fp32 accumulator per pair
 * adds fma(d_w * d_x, isum, acc) block by block in order. The relative
 * error against fp32 activations is ~1e-2 of sum|w*x| at worst (measured
 * in reference_test/kernels_test); a column's result never depends on its
 * batch, tile or thread. A block of x holding NaN/Inf makes its outputs
 * NaN. K-quant weights (q2_k..q6_k) take the same road, the same
 * activation blocks, with one fp32 accumulator per pair fed super-block by
 * super-block, chunk of 32 by chunk (kernels_kq.c states the operations).
 *
 * Every kernel has a portable C version; AVX2/FMA/F16C versions (plus
 * AVX-VNNI for the int8 path, AVX-512 where it pays) are chosen at run
 * time (gpud_cpu_features()).
 * The portable versions are the reference the tests check the vector ones
 * against; for q8_0/q4_0 all paths give identical bits, and rows expanded
 * by gpud_get_row() are those of gpud_dequantize_row() on every path.
 *
 * None of these functions allocates, takes a lock or fails: arguments are
 * the caller's responsibility (types must be supported with the matmul
 * trait, sizes multiples of the block). They are safe to call from any
 * thread.
 */
#ifndef GPUD_KERNELS_H
#define GPUD_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/quant.h"

struct gpud_tp;

enum {
	GPUD_CPU_AVX2 = 1 << 0,
	GPUD_CPU_FMA = 1 << 1,
	GPUD_CPU_F16C = 1 << 2,
	GPUD_CPU_AVXVNNI = 1 << 3, /* VEX vpdpbusd; only used with the three above */
	/* AVX-512 F, BW, VL and DQ with the ZMM state saved by the OS; only
	 * used with the first three. */
	GPUD_CPU_AVX512 = 1 << 4,
	GPUD_CPU_AVX512VNNI = 1 << 5, /* EVEX vpdpbusd; only used with AVX512 */
	GPUD_CPU_GFNI = 1 << 6,	      /* vgf2p8affineqb; only used with AVX512VNNI */
};
/* Features detected on this CPU (and usable by the OS), masked by the last
 * gpud_cpu_set_features(). The vector kernels run only when all three of
 * AVX2, FMA and F16C are present. */
unsigned gpud_cpu_features(void);
/* Restricts the features used from now on to mask & detected; 0 forces the
 * portable kernels (tests compare both paths), ~0u restores everything.
 * Process-wide; do not call while kernels run on other threads. */
void gpud_cpu_set_features(unsigned mask);

/* Scratch bytes gpud_matmul needs for a weight type, width and batch:
 * 0 for f32/f16/bf16; for q8_0/q4_0 the quantized activations,
 * batch * (cols + 8 * cols / 32) rounded up to a multiple of 64 (the
 * K-quants alike). */
size_t gpud_matmul_scratch_bytes(enum gpud_type wtype, int64_t cols, int64_t batch);

/* y[b*rows + r] = sum_c W[r, c] * x[b*cols + c]  for b < batch, r < rows.
 * W is rows x cols in type wtype, row-major (a GGUF tensor with
 * ne[0] = cols, ne[1] = rows). Weights are streamed once per call whatever
 * the batch: each thread takes a slice of rows and walks the batch inside.
 * cols must be a multiple of 32 for q8_0/q4_0, of 256 for the K-quants
 * (any value for f32/f16/bf16).
 * tp may be NULL (runs on the caller). scratch must hold
 * gpud_matmul_scratch_bytes() bytes, 4-byte aligned (may be NULL when
 * that is 0); nothing is allocated. y must not overlap x, W or scratch.
 * Uses about 10 KiB of stack per thread.
 * Deterministic, bit for bit: the result does not depend on the pool's
 * thread count (each y element is computed by one thread in a fixed order)
 * nor on the batch size or the other columns of the batch. For float types
 * it does depend on the kernels in use (portable or AVX2: the summation
 * order differs); for q8_0/q4_0 and the K-quants it does not. */
void gpud_matmul(struct gpud_tp *tp, enum gpud_type wtype, const void *W,
		 int64_t rows, int64_t cols, const float *x, int64_t batch,
		 float *y, void *scratch);

/* ---- a matmul in pieces ------------------------------------------------
 * gpud_matmul_prepare() sets *mc up for gpud_matmul()'s product (on the
 * packed layout when `packed`: gpud_matmul_packed()'s) and quantizes x
 * into scratch as that does; gpud_matmul_rows() then computes rows
 * [r0, r1) of y on the calling thread, r0 a multiple of 16 and r1 too or
 * rows. Threads may run disjoint pieces at once, in any split: every y
 * element gets gpud_matmul()'s bits. W, x, y, scratch and *mc must stay
 * as they are until the last piece. gpud_matmul() is the two, its pool
 * taking the rows with gpud_tp_claim() (threadpool.h). */
struct gpud__mm { /* private to kernels*.c */
	enum gpud_type wtype;
	const uint8_t *W;                /* (rows, cols) in wtype */
	size_t wrow;                     /* bytes per row of W */
	int64_t rows, cols, batch;
	const float *x;                  /* (batch, cols) */
	float *y;                        /* (batch, rows) */
	/* q8_0/q4_0 and the K-quants: x quantized once per call (see
	 * kernels.h; the K-quants' xc is the plain quant sum, off -1) */
	const int8_t *xq;                /* (batch, cols) quants */
	const float *xd;                 /* (batch, cols / 32) block scales */
	const int32_t *xc;               /* (batch, cols / 32) -off * sum(q), or
					  * with GPUD__ACT_HALVES the two 16-quant
					  * half sums as i16 (low: first half) */
	bool vnni;                       /* use AVX-VNNI (else AVX2) */
	bool avx512;                     /* use the AVX-512 kernels where there are */
	bool avx512vnni;                 /* and the AVX-512 VNNI ones */
	bool gfni;                       /* and those with GFNI too */
	bool packed;                     /* W in the packed layout (pack.c) */
};

struct gpud_mm_call {
	struct gpud__mm m;
	void (*rows)(const struct gpud__mm *m, int64_t r0, int64_t r1);
};

void gpud_matmul_prepare(struct gpud_mm_call *mc, enum gpud_type wtype, bool packed,
			 const void *W, int64_t rows, int64_t cols, const float *x,
			 int64_t batch, float *y, void *scratch);
static inline void gpud_matmul_rows(const struct gpud_mm_call *mc, int64_t r0, int64_t r1)
{
	if (r0 < r1)
		mc->rows(&mc->m, r0, r1);
}

/* ---- packed layouts ---------------------------------------------------
 * A load-time reordering of a q4_0, q8_0, q2_k .. q6_k, f16, bf16 or f32
 * matrix that the vector kernels read without transposing (pack.c gives
 * the layouts): rows in groups of 8 (the float types: 16), and inside a
 * group each block i of the rows interleaved so that one 32-byte load
 * holds 4 bytes of every row (the float types: one column of the 16
 * rows). A group takes exactly the
 * bytes of its plain rows, in the same place, so a slice of rows starting
 * at a multiple of the group is found as in the plain matrix. For the
 * quantized types the arithmetic, and so every bit of the result, is
 * gpud_matmul's on the plain matrix, on every path (the portable one reads
 * the layouts too). Packed f16, bf16 and f32 sum each element as one fma
 * chain in column order, on both paths alike (the same bits), which is
 * not the plain kernels' order: their results differ from those within
 * the float bound. The plain layout costs the int8 kernels an 8x8 transpose
 * of every block group on every call, which bounds batch-1 decode well
 * below the memory's speed (q4_0: 2.5x faster packed, bench_matmul); f16
 * packed reads each weight once per 6 batch columns and x once per 16
 * rows (prefill).
 *
 * gpud_matmul_packable(): true when packing pays and is possible: one of
 * those types, rows a multiple of the group, whole blocks, and the AVX2
 * kernels in use (the portable kernels gain nothing from it).
 * gpud_matmul_pack(): writes the packed copy of W (rows x cols, plain) to
 * dst, gpud_type_row_bytes(t, cols) * rows bytes, not overlapping; on tp
 * (may be NULL). gpud_matmul_packed(): gpud_matmul() on a packed W. */
bool gpud_matmul_packable(enum gpud_type t, int64_t rows, int64_t cols);
/* Rows per packed group of type t: 8, or 16 for the float types. A slice
 * of a packed matrix must start on a whole group. */
int gpud_matmul_pack_rows(enum gpud_type t);
void gpud_matmul_pack(struct gpud_tp *tp, enum gpud_type t, const void *W, void *dst,
		      int64_t rows, int64_t cols);
void gpud_matmul_packed(struct gpud_tp *tp, enum gpud_type wtype, const void *W,
			int64_t rows, int64_t cols, const float *x, int64_t batch,
			float *y, void *scratch);

/* Row r of an embedding table (type t, width cols) into floats: the bits
 * of gpud_dequantize_row() on that row, vectorized where the CPU can.
 * gpud_get_row_packed(): the same row of the table's packed copy (a tied
 * embedding shares its matrix with the output). */
void gpud_get_row(enum gpud_type t, const void *W, int64_t cols, int64_t r, float *out);
void gpud_get_row_packed(enum gpud_type t, const void *W, int64_t cols, int64_t r, float *out);

#endif
