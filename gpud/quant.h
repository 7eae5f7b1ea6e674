/* quant.h - weight types: traits, scalar conversions, quantize, dequantize.
 *
 * The one definition of every weight format gpud knows, free of any
 * backend: the GGUF reader and writer, mkmodel and every backend (cpu
 * today, cuda later) share it. Backends keep only their fast kernels
 * (matmul, dot products, their own vector row conversions, which must give
 * the bits of the functions here).
 *
 * Type ids are ggml's, which the GGUF file stores: a value never changes
 * and new types only add enumerators. Adding a type is one row of the
 * traits table in quant.c, its quantize and dequantize functions (and, for
 * the messages, its name in GPUD_TYPE_SUPPORTED_NAMES); quant_test checks
 * the table against the functions. A type whose `matmul` trait is false
 * can be read and written but no backend multiplies it yet.
 *
 * Block formats (facts of the file format, as ggml lays them out):
 *   F32, F16, BF16: one element per block.
 *   Q8_0: 32 weights per block: fp16 scale d, int8 q[32];        w = d * q
 *   Q4_0: 32 weights per block: fp16 scale d, uint8 qs[16];      w = d * q
 *         q = nibble - 8, weight j in the low nibble of qs[j], j+16 in the
 *         high one.
 *   Q4_1: fp16 d, fp16 m, qs[16]: q = the nibble (0..15), as Q4_0's;
 *         w = d * q + m.
 *   Q5_0: fp16 d, uint8 qh[4], qs[16]: q = (nibble | bit j of qh << 4) -
 *         16 for weight j (qh read as a little-endian uint32);  w = d * q.
 *   Q5_1: fp16 d, fp16 m, qh[4], qs[16]: q = nibble | bit j of qh << 4
 *         (0..31);  w = d * q + m.
 *   IQ4_NL: fp16 d, qs[16]: q = GPUD_IQ4NL_VALUES[nibble] (a fixed
 *         non-linear table, -127..113);  w = d * q.
 *   IQ4_XS (136 bytes a 256-weight super-block): fp16 d, uint16 scales_h,
 *         uint8 scales_l[4], qs[128]. Chunk c = e / 32 (0..7): 6-bit ls =
 *         (scales_l[c / 2] >> 4 (c % 2)) & 15 | ((scales_h >> 2c) & 3) << 4,
 *         dl = d * (ls - 32) (one fp32 product); nibble of weight e: the
 *         low one of qs[16c + e % 32] for e % 32 < 16, else the high one of
 *         qs[16c + e % 32 - 16];  w = dl * GPUD_IQ4NL_VALUES[nibble].
 *   Q4_1, Q5_0, Q5_1, IQ4_NL (the "legacy" 32-weight types besides Q4_0/Q8_0) are what
 *   llama.cpp writes where a K-quant does not fit a row (its length not a
 *   multiple of 256: Qwen2.5-0.5B's 896): Q4_K falls back to Q5_0, Q5_K
 *   to Q5_1, Q6_K to Q8_0, Q2_K/Q3_K to IQ4_NL.
 *   K-quants: 256 weights per super-block (GPUD_QK_K), in sub-blocks of 16
 *   or 32 with small integer scales (and mins) under fp16 super-block
 *   factors d (and dmin). Weight e of a super-block:
 *   Q2_K (84 bytes): scales[16], qs[64], d, dmin. Half h = e / 128, shift
 *         j = (e % 128) / 32, l = e % 32: q = (qs[32h + l] >> 2j) & 3 in 0..3,
 *         sub-block s = 8h + 2j + l / 16; sc = scales[s] & 15,
 *         m = scales[s] >> 4;  w = (d * sc) * q - (dmin * m).
 *   Q3_K (110 bytes): hmask[32], qs[64], scales[12], d. h, j, l, s as for
 *         Q2_K; q = ((qs[32h + l] >> 2j) & 3) | (hmask[l] bit 4h + j) << 2,
 *         minus 4: -4..3. 6-bit scale s: low 4 bits scales[s] & 15 (s < 8)
 *         or scales[s - 8] >> 4, high 2 bits (scales[8 + s % 4] >> 2(s / 4))
 *         & 3; sc = that - 32;  w = (d * sc) * q.
 *   Q4_K (144 bytes): d, dmin, scales[12], qs[128]. Chunk c = e / 64, l =
 *         e % 32: q = low nibble of qs[32c + l] for e % 64 < 32 (sub-block
 *         2c), else the high nibble (sub-block 2c + 1). 6-bit scale and min
 *         of sub-block s: s < 4: sc = scales[s] & 63, m = scales[s + 4] & 63;
 *         s >= 4: sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4,
 *         m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
 *         w = (d * sc) * q - (dmin * m).
 *   Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]: Q4_K plus a
 *         fifth bit, bit s of qh[l] (q in 0..31).
 *   Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], d. Half h = e / 128,
 *         quarter k = (e % 128) / 32, l = e % 32: low 4 bits from
 *         ql[64h + l + 32(k & 1)] (low nibble for k < 2, high for k >= 2),
 *         high 2 bits (qh[32h + l] >> 2k) & 3; q = that - 32 (-32..31);
 *         sub-block s = 8h + 2k + l / 16;  w = (d * scales[s]) * q.
 *   Q8_K (292 bytes): fp32 d, int8 qs[256], int16 bsums[16] (sums of each
 *         16 quants); w = d * q. ggml's activation format for K-quants,
 *         read and written here but never a weight (matmul false); gpud's
 *         CPU K-quant matmul keeps 32-wide activation blocks, which are
 *         finer (backend/cpu/kernels_kq.c).
 *
 * Nothing here allocates, takes a lock or fails; every function is safe
 * from any thread. Row functions trust their sizes (n a multiple of the
 * block, buffers of the row's size); for an unsupported type they do
 * nothing.
 */
#ifndef GPUD_QUANT_H
#define GPUD_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Tensor element types, numbered as in ggml. Only those listed are
 * supported; gpud_type_name() also names the other ggml ids ("q4_k") so
 * that messages can say what a file holds. */
enum gpud_type {
	GPUD_TYPE_F32 = 0,
	GPUD_TYPE_F16 = 1,
	GPUD_TYPE_Q4_0 = 2,  /* 32 weights = f16 d + 16 bytes of nibbles */
	GPUD_TYPE_Q4_1 = 3,  /* 32 weights = f16 d, f16 m + 16 bytes of nibbles */
	GPUD_TYPE_Q5_0 = 6,  /* 32 weights = f16 d + 4 bytes of 5th bits + nibbles */
	GPUD_TYPE_Q5_1 = 7,  /* 32 weights = f16 d, f16 m + 5th bits + nibbles */
	GPUD_TYPE_Q8_0 = 8,  /* 32 weights = f16 d + 32 int8 */
	GPUD_TYPE_Q2_K = 10, /* 256 weights in 84 bytes */
	GPUD_TYPE_Q3_K = 11, /* 256 weights in 110 bytes */
	GPUD_TYPE_Q4_K = 12, /* 256 weights in 144 bytes */
	GPUD_TYPE_Q5_K = 13, /* 256 weights in 176 bytes */
	GPUD_TYPE_Q6_K = 14, /* 256 weights in 210 bytes */
	GPUD_TYPE_Q8_K = 15, /* 256 weights in 292 bytes (activations) */
	GPUD_TYPE_IQ4_NL = 20, /* 32 weights = f16 d + 16 bytes of table indices */
	GPUD_TYPE_IQ4_XS = 23, /* 256 weights in 136 bytes: IQ4_NL's table, 6-bit scales */
	GPUD_TYPE_BF16 = 30,
	GPUD_TYPE_COUNT = 31, /* one past the largest supported id (sizes the table) */
};

/* The supported types, in the order messages list them. */
#define GPUD_TYPE_SUPPORTED_NAMES \
	"f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, " \
	"q6_k, q8_k"

#define GPUD_QK 32 /* weights per Q8_0/Q4_0 block */

struct gpud_block_q8_0 {
	uint16_t d; /* fp16 */
	int8_t qs[GPUD_QK];
};

struct gpud_block_q4_0 {
	uint16_t d; /* fp16 */
	uint8_t qs[GPUD_QK / 2];
};

struct gpud_block_q4_1 {
	uint16_t d; /* fp16 */
	uint16_t m; /* fp16 */
	uint8_t qs[GPUD_QK / 2];
};

struct gpud_block_q5_0 {
	uint16_t d;		 /* fp16 */
	uint8_t qh[4];		 /* bit 4 of each quant, weight j's at bit j */
	uint8_t qs[GPUD_QK / 2]; /* bits 0-3, as Q4_0's nibbles */
};

struct gpud_block_q5_1 {
	uint16_t d; /* fp16 */
	uint16_t m; /* fp16 */
	uint8_t qh[4];
	uint8_t qs[GPUD_QK / 2];
};

struct gpud_block_iq4_nl {
	uint16_t d; /* fp16 */
	uint8_t qs[GPUD_QK / 2];
};

struct gpud_block_iq4_xs {
	uint16_t d;		       /* fp16 */
	uint16_t scales_h;	       /* bits 4-5 of each chunk's 6-bit scale */
	uint8_t scales_l[4];	       /* bits 0-3, two chunks a byte */
	uint8_t qs[256 / 2];	       /* table indices, 16 bytes a chunk */
};

/* The 6-bit scale (0..63; the factor is ls - 32) of chunk c (0..7) of an
 * IQ4_XS block. */
static inline int gpud_iq4xs_ls(const struct gpud_block_iq4_xs *b, int c)
{
	return ((b->scales_l[c / 2] >> (4 * (c % 2))) & 15) | ((b->scales_h >> (2 * c)) & 3) << 4;
}

/* IQ4_NL's quant values by nibble (a fact of the format). */
#define GPUD_IQ4NL_VALUES \
	{ -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 }

/* Bit 4 of quant j (0..31) of a Q5_0/Q5_1 block's qh. */
static inline int gpud_q5_hbit(const uint8_t *qh, int j)
{
	return (qh[j >> 3] >> (j & 7)) & 1;
}

#define GPUD_QK_K 256 /* weights per K-quant super-block */

struct gpud_block_q2_k {
	uint8_t scales[GPUD_QK_K / 16]; /* scale (low nibble), min (high) */
	uint8_t qs[GPUD_QK_K / 4];      /* 2-bit quants */
	uint16_t d;                     /* fp16, of the scales */
	uint16_t dmin;                  /* fp16, of the mins */
};

struct gpud_block_q3_k {
	uint8_t hmask[GPUD_QK_K / 8];   /* bit 2 of each quant */
	uint8_t qs[GPUD_QK_K / 4];      /* bits 0-1 */
	uint8_t scales[12];             /* 16 6-bit scales */
	uint16_t d;                     /* fp16 */
};

struct gpud_block_q4_k {
	uint16_t d;                     /* fp16, of the scales */
	uint16_t dmin;                  /* fp16, of the mins */
	uint8_t scales[12];             /* 8 6-bit scales and 8 6-bit mins */
	uint8_t qs[GPUD_QK_K / 2];      /* 4-bit quants */
};

struct gpud_block_q5_k {
	uint16_t d;
	uint16_t dmin;
	uint8_t scales[12];
	uint8_t qh[GPUD_QK_K / 8];      /* bit 4 of each quant */
	uint8_t qs[GPUD_QK_K / 2];      /* bits 0-3 */
};

struct gpud_block_q6_k {
	uint8_t ql[GPUD_QK_K / 2];      /* bits 0-3 */
	uint8_t qh[GPUD_QK_K / 4];      /* bits 4-5 */
	int8_t scales[GPUD_QK_K / 16];
	uint16_t d;                     /* fp16 */
};

struct gpud_block_q8_k {
	float d;
	int8_t qs[GPUD_QK_K];
	int16_t bsums[GPUD_QK_K / 16];
};

#ifndef __cplusplus /* C11's spelling; the CUDA sources (C++) include this too */
_Static_assert(sizeof(struct gpud_block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(struct gpud_block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(struct gpud_block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(struct gpud_block_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(struct gpud_block_iq4_xs) == 136, "iq4_xs block");
_Static_assert(sizeof(struct gpud_block_q2_k) == 84, "q2_k block");
_Static_assert(sizeof(struct gpud_block_q3_k) == 110, "q3_k block");
_Static_assert(sizeof(struct gpud_block_q4_k) == 144, "q4_k block");
_Static_assert(sizeof(struct gpud_block_q5_k) == 176, "q5_k block");
_Static_assert(sizeof(struct gpud_block_q6_k) == 210, "q6_k block");
_Static_assert(sizeof(struct gpud_block_q8_k) == 292, "q8_k block");
#endif

/* The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block's
 * 12 packed bytes (layout in the header comment). */
static inline void gpud_kq_scale_min(const uint8_t *q, int s, uint8_t *sc, uint8_t *m)
{
	if (s < 4) {
		*sc = q[s] & 63;
		*m = q[s + 4] & 63;
	} else {
		*sc = (uint8_t)((q[s + 4] & 15) | (q[s - 4] >> 6) << 4);
		*m = (uint8_t)((q[s + 4] >> 4) | (q[s] >> 6) << 4);
	}
}

/* The signed 6-bit scale (-32..31) of sub-block s (0..15) of a Q3_K block's
 * 12 packed bytes. */
static inline int gpud_q3k_scale(const uint8_t *q, int s)
{
	int lo = s < 8 ? q[s] & 15 : q[s - 8] >> 4;
	int hi = (q[8 + s % 4] >> (2 * (s / 4))) & 3;

	return (lo | hi << 4) - 32;
}

/* Quantize n floats x into y / expand n elements x into floats y, n a
 * multiple of the block. */
typedef void (*gpud_quantize_fn)(const float *x, void *y, int64_t n);
typedef void (*gpud_dequantize_fn)(const void *x, float *y, int64_t n);

struct gpud_type_traits {
	const char *name;          /* "q8_0", as ggml names it */
	uint32_t block_elems;      /* elements per block: 1 for float types */
	uint32_t block_bytes;      /* bytes per block */
	bool quantized;            /* integer quants with a per-block scale */
	bool matmul;               /* backends multiply it in place (model matrices) */
	gpud_quantize_fn quantize; /* from fp32: the reference, bit for bit */
	gpud_dequantize_fn dequantize;
};

/* Traits of a supported type; NULL for any other value (unknown or
 * unsupported ids, out-of-range values from a file). */
const struct gpud_type_traits *gpud_type_traits(enum gpud_type t);

/* Shorthands over the traits. Elements and bytes per block: 0 when the
 * type is not supported. */
uint32_t gpud_type_block_elems(enum gpud_type t);
uint32_t gpud_type_block_bytes(enum gpud_type t);
bool gpud_type_supported(enum gpud_type t);
/* True for every id ggml has assigned, supported or not (gguf tells
 * "unknown type" from "unsupported type" with it). */
bool gpud_type_known(enum gpud_type t);
const char *gpud_type_name(enum gpud_type t); /* "q8_0"; "?" when unknown */
/* Parses a supported type's name, any case ("F16"); -1 when unknown,
 * unsupported or NULL. */
int gpud_type_parse(const char *s);
/* Bytes of one row of n elements (n must be a multiple of the block); 0
 * for an unsupported type. */
size_t gpud_type_row_bytes(enum gpud_type t, uint64_t n);

/* Converts n floats into type t (n a multiple of its block; y holds
 * gpud_type_row_bytes(t, n) bytes). Used by the GGUF writer and
 * mkmodel; every backend's results are checked against it.
 *   F32: copied. F16, BF16: gpud_fp32_to_fp16/bf16() per element.
 *   Q8_0: d = max|x| / 127, q = x * (1/d) rounded to nearest even.
 *   Q4_0: d = m / -8 where m is the first x of largest |x|,
 *         q = min(15, trunc(x * (1/d) + 8.5)).
 *   Both store d as fp16 (the quants use the fp32 d) and give an all-zero
 *   block d = 0 and quants 0. A block whose scale overflows fp16 (max |x|
 *   above about 65504 * 127 for Q8_0, 65504 * 8 for Q4_0) stores d = +-Inf:
 *   it dequantizes to +-Inf, and to NaN where q = 0.
 *   K-quants (Q2_K..Q6_K): gpud's own quantizer. Per sub-block a scale
 *   (and for Q2_K/Q4_K/Q5_K a min, x ~ sc * q - m with m >= 0) is chosen
 *   by a small search minimizing the squared error; the sub-block scales
 *   (mins) are quantized against fp16 super-block factors, and the quants
 *   are then chosen against the stored (rounded) scales. Q8_K: d = max|x|
 *   / 127 in fp32, q = round(x / d), bsums the sums of each 16 quants; a
 *   block with max|x| < 1e-30 is all zero (d = 0).
 *   Non-finite input: a Q8_0/Q4_0 block holding a NaN or an Inf is stored
 *   as d = NaN (0x7e00) with quants 0 (Q4_0 nibbles 8), so all of it
 *   dequantizes to NaN: a NaN or Inf weight is never turned into a finite
 *   one, and it never reaches another block. A K-quant super-block
 *   holding a NaN or Inf likewise gets d = NaN (Q8_K: fp32 NaN) with
 *   scales and quants 0 (Q3_K/Q6_K: the scale bytes and quants that decode
 *   to 0). F16/BF16 keep NaN (quiet) and
 *   +-Inf; F32 is copied bit for bit. */
void gpud_quantize_row(enum gpud_type t, const float *x, void *y, int64_t n);
/* Inverse: expands n elements of type t into floats, w = d * q for the
 * block types (an fp32 product of the fp16 scale and the integer quant). */
void gpud_dequantize_row(enum gpud_type t, const void *x, float *y, int64_t n);

/* ---- scalar conversions ------------------------------------------------
 * Round to nearest even. Subnormals are kept, overflow gives Inf, NaN stays
 * NaN (made quiet, sign and top payload bits kept). Inline so that every
 * backend's scalar loops compile them in place. */

static inline uint32_t gpud__f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float gpud__u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline float gpud_fp16_to_fp32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;

	if (e == 0) {
		if (m == 0)
			return gpud__u2f(sign);
		/* Subnormal: m * 2^-24, renormalized (2^-14 is fp32 exponent 113). */
		e = 113;
		while (!(m & 0x400)) {
			m <<= 1;
			e--;
		}
		return gpud__u2f(sign | e << 23 | (m & 0x3ff) << 13);
	}
	if (e == 31)
		return gpud__u2f(sign | 0x7f800000 | m << 13 | (m ? 0x400000 : 0));
	return gpud__u2f(sign | (e + 112) << 23 | m << 13);
}

static inline uint16_t gpud_fp32_to_fp16(float f)
{
	uint32_t u = gpud__f2u(f);
	uint32_t sign = (u >> 16) & 0x8000, e, r, rem, half;

	u &= 0x7fffffff;
	if (u >= 0x7f800000) {
		if (u > 0x7f800000)
			return (uint16_t)(sign | 0x7e00 | ((u >> 13) & 0x3ff));
		return (uint16_t)(sign | 0x7c00);
	}
	if (u >= 0x47800000) /* >= 2^16: beyond rounding range of 65504 */
		return (uint16_t)(sign | 0x7c00);
	e = u >> 23;
	if (e < 113) {
		/* Result is subnormal (or rounds up to the smallest normal):
		 * value / 2^-24 = mant * 2^(e - 126). */
		uint32_t mant = (u & 0x7fffff) | 0x800000, shift = 126 - e;

		if (shift > 24)
			return (uint16_t)sign;
		r = mant >> shift;
		rem = mant & ((1u << shift) - 1);
		half = 1u << (shift - 1);
		r += rem + (r & 1) > half; /* rem > half, or a tie and r odd */
		return (uint16_t)(sign | r);
	}
	r = (e - 112) << 10 | (u & 0x7fffff) >> 13;
	rem = u & 0x1fff;
	/* Up when rem > half, or a tie and r odd (branch-free: rounding is
	 * random data's coin toss); a carry into the exponent is right, up to
	 * Inf. */
	r += rem + (r & 1) > 0x1000;
	return (uint16_t)(sign | r);
}

static inline float gpud_bf16_to_fp32(uint16_t h)
{
	return gpud__u2f((uint32_t)h << 16);
}

static inline uint16_t gpud_fp32_to_bf16(float f)
{
	uint32_t u = gpud__f2u(f);

	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

#endif
