/* pack.c - the packed weight layouts of the CPU kernels (kernels.h).
 *
 * A packed matrix keeps every byte of the plain one and every group of 8
 * rows in the place of those 8 rows; inside a group, block i of the 8 rows
 * (one "unit", 8 x the type's block bytes) is reordered so that the vector
 * kernels load, in one 32-byte load, 4 bytes of each of the 8 rows side by
 * side: lane r of the load is row r. That is the layout the int8 kernels
 * otherwise build per call with an 8x8 transpose of every block group.
 *
 * Each layout is a byte permutation of the unit, given by pk_pos() (where
 * byte o of row r's block goes); pack and unpack walk a table made from it
 * once per type. Layouts (offsets in the unit; r = row 0..7, "4-byte
 * column" k = 0..3 inside a 4-byte group):
 *
 * q4_0 (8 x 18 = 144): d[r] at 2r; nibble byte j (0..15), group q = j/4,
 *     at 16 + 32q + 4r + j%4.
 * q8_0 (8 x 34 = 272): d[r] at 2r; quant j (0..31), group g = j/4, at
 *     16 + 32g + 4r + j%4.
 * q4_k (8 x 144 = 1152): d[r] at 2r, dmin[r] at 16 + 2r; scale byte j
 *     (0..11), word w = j/4, at 32 + 32w + 4r + j%4 (so word w of the 8
 *     rows is one vector and the 6-bit unpacking runs on 8 rows at once);
 *     quant byte j (0..127), pair h = j/32, group g = j%32/4, at
 *     128 + 256h + 32g + 4r + j%4.
 * q5_k (8 x 176 = 1408): d, dmin and the scales as q4_k; high-bit byte j
 *     (0..31), group g = j/4, at 128 + 32g + 4r + j%4; quant byte j
 *     (0..127) as q4_k's, 256 bytes further (384 + ...).
 * q4_1, q5_0, q5_1, iq4_nl (8 x 20, 22, 24, 18): fp16 factor f (d 0, then
 *     m 1 for q4_1/q5_1) of row r at 16f + 2r; the qh word (q5_0/q5_1) of
 *     row r at F + 4r (F = 16 x the factors): the 8 rows' words one
 *     vector; nibble byte j (0..15), group q = j/4, at F (+ 32 with qh) +
 *     32q + 4r + j%4 (iq4_nl is thus q4_0's layout).
 * iq4_xs (8 x 136 = 1088): d[r] at 2r, scales_h[r] at 16 + 2r, the
 *     scales_l word of row r at 32 + 4r; qs byte j (0..127), chunk c =
 *     j/16, group q = j%16/4, at 64 + 128c + 32q + 4r + j%4 (each chunk
 *     as an iq4_nl unit's nibbles).
 * f16, bf16 and f32 (16 rows, not 8): no blocks; a group of 16 rows is
 *     stored column by column, element k of row r at es * (16k + r) (es:
 *     the element's 2 or 4 bytes): the 16 rows' weights of one column
 *     are contiguous, a vector of 16 lanes = rows (kernels_x86.c,
 *     rows_f16p()).
 * q2_k (8 x 84 = 672): d[r] at 2r, dmin[r] at 16 + 2r; scale byte j
 *     (0..15), word w = j/4, at 32 + 32w + 4r + j%4; quant byte j (0..63),
 *     h = j/32, group g = j%32/4, at 160 + 256h + 32g + 4r + j%4.
 * q3_k (8 x 110 = 880): d[r] at 2r; scale byte j (0..11), word w = j/4,
 *     at 16 + 32w + 4r + j%4 (the 6-bit unpacking on 8 rows at once, as
 *     q4_k); high-bit byte j (0..31), g = j/4, at 112 + 32g + 4r + j%4;
 *     quant byte j (0..63) as q2_k's, at 368 + 256h + 32g + 4r + j%4.
 * q6_k (8 x 210 = 1680): d[r] at 2r; scale j (0..15), chunk c = j/2, half
 *     s = j%2, at 16 + 16c + 8s + r; ql byte j (0..127), h = j/64,
 *     half kk = j%64/32, group g = j%32/4, at 144 + 512h + 256kk + 32g +
 *     4r + j%4; qh byte j (0..63), h = j/32, g = j%32/4, at 1168 + 256h +
 *     32g + 4r + j%4.
 */
#include <assert.h>
#include <pthread.h>
#include <string.h>

#include "gpud/backend/cpu/kernels_impl.h"

/* Where byte o of row r's block goes in the unit (layouts above). */
static size_t pk_pos(enum gpud_type t, size_t r, size_t o)
{
	switch (t) {
	case GPUD_TYPE_Q4_0: /* 16 nibble bytes */
	case GPUD_TYPE_Q8_0: /* 32 quants */
		if (o < 2)
			return 2 * r + o;
		o -= 2;
		return 16 + 32 * (o / 4) + 4 * r + o % 4;
	case GPUD_TYPE_Q4_K:
	case GPUD_TYPE_Q5_K:
		if (o < 4) /* d, dmin */
			return 16 * (o / 2) + 2 * r + o % 2;
		if (o < 16) { /* the 12 scale bytes */
			o -= 4;
			return 32 + 32 * (o / 4) + 4 * r + o % 4;
		}
		if (t == GPUD_TYPE_Q4_K) {
			o -= 16;
			return 128 + 256 * (o / 32) + 32 * (o % 32 / 4) + 4 * r + o % 4;
		}
		if (o < 48) { /* q5_k's qh */
			o -= 16;
			return 128 + 32 * (o / 4) + 4 * r + o % 4;
		}
		o -= 48;
		return 384 + 256 * (o / 32) + 32 * (o % 32 / 4) + 4 * r + o % 4;
	case GPUD_TYPE_Q2_K:
		if (o >= 80) /* d, dmin */
			return 16 * ((o - 80) / 2) + 2 * r + (o - 80) % 2;
		if (o < 16) /* scales */
			return 32 + 32 * (o / 4) + 4 * r + o % 4;
		o -= 16;
		return 160 + 256 * (o / 32) + 32 * (o % 32 / 4) + 4 * r + o % 4;
	case GPUD_TYPE_Q3_K:
		if (o >= 108) /* d */
			return 2 * r + (o - 108);
		if (o >= 96) { /* scales */
			o -= 96;
			return 16 + 32 * (o / 4) + 4 * r + o % 4;
		}
		if (o < 32) /* hmask */
			return 112 + 32 * (o / 4) + 4 * r + o % 4;
		o -= 32;
		return 368 + 256 * (o / 32) + 32 * (o % 32 / 4) + 4 * r + o % 4;
	case GPUD_TYPE_Q6_K:
		if (o >= 208) /* d */
			return 2 * r + (o - 208);
		if (o >= 192) { /* scales */
			o -= 192;
			return 16 + 16 * (o / 2) + 8 * (o % 2) + r;
		}
		if (o >= 128) { /* qh */
			o -= 128;
			return 1168 + 256 * (o / 32) + 32 * (o % 32 / 4) + 4 * r + o % 4;
		}
		return 144 + 512 * (o / 64) + 256 * (o % 64 / 32) + 32 * (o % 32 / 4) + 4 * r + o % 4;
	case GPUD_TYPE_Q4_1:
	case GPUD_TYPE_Q5_0:
	case GPUD_TYPE_Q5_1:
	case GPUD_TYPE_IQ4_NL: {
		const size_t nf = t == GPUD_TYPE_Q4_1 || t == GPUD_TYPE_Q5_1 ? 2 : 1;
		const size_t nqh = t == GPUD_TYPE_Q5_0 || t == GPUD_TYPE_Q5_1 ? 4 : 0;

		if (o < 2 * nf) /* d, m */
			return 16 * (o / 2) + 2 * r + o % 2;
		o -= 2 * nf;
		if (o < nqh) /* the qh word */
			return 16 * nf + 4 * r + o;
		o -= nqh;
		return 16 * nf + 8 * nqh + 32 * (o / 4) + 4 * r + o % 4;
	}
	case GPUD_TYPE_IQ4_XS:
		if (o < 4) /* d, scales_h */
			return 16 * (o / 2) + 2 * r + o % 2;
		if (o < 8) /* scales_l */
			return 32 + 4 * r + (o - 4);
		o -= 8;
		return 64 + 128 * (o / 16) + 32 * (o % 16 / 4) + 4 * r + o % 4;
	default:
		return 0;
	}
}

bool gpud__pk_type(enum gpud_type t)
{
	return t == GPUD_TYPE_Q4_0 || t == GPUD_TYPE_Q8_0 || t == GPUD_TYPE_Q2_K ||
	       t == GPUD_TYPE_Q3_K || t == GPUD_TYPE_Q4_K || t == GPUD_TYPE_Q5_K ||
	       t == GPUD_TYPE_Q6_K || gpud__lq_type(t) || gpud__pk_panel(t);
}

int gpud__pk_rows(enum gpud_type t)
{
	return gpud__pk_panel(t) ? GPUD__PK_ROWS_F16 : GPUD__PK_ROWS;
}

/* f16/bf16 (E uint16_t) and f32 (uint32_t): one group of 16 rows,
 * column by column. */
#define PACK_PANEL(name, E)                                                            \
	static void name(const E *src, E *dst, int64_t cols)                          \
	{                                                                              \
		for (int64_t k0 = 0; k0 < cols; k0 += 64) {                            \
			int64_t k1 = k0 + 64 < cols ? k0 + 64 : cols;                  \
                                                                                       \
			/* 64 columns of the 16 rows at a time: reads stay in     \
			 * 16 (f32: 32) lines */                                       \
			for (int r = 0; r < GPUD__PK_ROWS_F16; r++)                    \
				for (int64_t k = k0; k < k1; k++)                      \
					dst[GPUD__PK_ROWS_F16 * k + r] = src[r * cols + k]; \
		}                                                                      \
	}
PACK_PANEL(pack_f16, uint16_t)
PACK_PANEL(pack_f32, uint32_t)

/* Per packed type, the unit's permutation, perm[r * bsz + o] = pk_pos(),
 * and the same as runs of bytes contiguous on both sides (4-byte groups,
 * fp16 scales: about 4 bytes a run), which pack copies. */
#define PK_MAX_UNIT (GPUD__PK_ROWS * 210)
#define PK_MAX_RUNS (GPUD__PK_ROWS * 65) /* q6_k: 1 + 16 + 32 + 16 per row */
struct pk_run {
	uint16_t src;      /* offset in the 8 rows' blocks back to back, r * bsz + o */
	uint16_t dst, len; /* offset in the unit, bytes */
	uint16_t row, off; /* src as row r and offset o in its block */
};
static struct {
	uint16_t perm[PK_MAX_UNIT];
	struct pk_run runs[PK_MAX_RUNS];
	size_t n_runs;
} g_tab[12];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int tab_index(enum gpud_type t)
{
	switch (t) {
	case GPUD_TYPE_Q4_0: return 0;
	case GPUD_TYPE_Q8_0: return 1;
	case GPUD_TYPE_Q4_K: return 2;
	case GPUD_TYPE_Q5_K: return 3;
	case GPUD_TYPE_Q2_K: return 5;
	case GPUD_TYPE_Q3_K: return 6;
	case GPUD_TYPE_Q4_1: return 7;
	case GPUD_TYPE_Q5_0: return 8;
	case GPUD_TYPE_Q5_1: return 9;
	case GPUD_TYPE_IQ4_NL: return 10;
	case GPUD_TYPE_IQ4_XS: return 11;
	default: return 4; /* q6_k */
	}
}

static void tab_init(void)
{
	static const enum gpud_type ts[] = { GPUD_TYPE_Q4_0, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_K,
					     GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K, GPUD_TYPE_Q2_K,
					     GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_1, GPUD_TYPE_Q5_0,
					     GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL, GPUD_TYPE_IQ4_XS };

	for (size_t k = 0; k < sizeof(ts) / sizeof(ts[0]); k++) {
		size_t bsz = gpud_type_block_bytes(ts[k]);
		__typeof__(g_tab[0]) *tb = &g_tab[tab_index(ts[k])];

		for (size_t r = 0; r < GPUD__PK_ROWS; r++) {
			for (size_t o = 0; o < bsz; o++) {
				size_t i = r * bsz + o, d = pk_pos(ts[k], r, o);
				struct pk_run *last = tb->n_runs ? &tb->runs[tb->n_runs - 1] : NULL;

				tb->perm[i] = (uint16_t)d;
				if (o && last && last->src + last->len == i && last->dst + last->len == d) {
					last->len++;
					continue;
				}
				assert(tb->n_runs < PK_MAX_RUNS);
				tb->runs[tb->n_runs++] = (struct pk_run){
					.src = (uint16_t)i, .dst = (uint16_t)d, .len = 1,
					.row = (uint16_t)r, .off = (uint16_t)o,
				};
			}
		}
	}
}

static const __typeof__(g_tab[0]) *tab_of(enum gpud_type t)
{
	pthread_once(&g_once, tab_init);
	return &g_tab[tab_index(t)];
}

void gpud__pk_unpack_block(enum gpud_type t, const uint8_t *group, int64_t r, int64_t i,
			   uint8_t *out)
{
	const size_t bsz = gpud_type_block_bytes(t);
	const uint8_t *u = group + (size_t)i * GPUD__PK_ROWS * bsz;
	const uint16_t *perm = tab_of(t)->perm + (size_t)r * bsz;

	for (size_t o = 0; o < bsz; o++)
		out[o] = u[perm[o]];
}

void gpud__pk_pack_rows(enum gpud_type t, const void *W, void *dst, int64_t g0, int64_t g1,
			int64_t cols)
{
	const size_t bsz = gpud_type_block_bytes(t), wrow = gpud_type_row_bytes(t, (uint64_t)cols);
	const int64_t nb = cols / (int64_t)gpud_type_block_elems(t);
	const __typeof__(g_tab[0]) *tb;

	assert(gpud__pk_type(t));
	if (gpud__pk_panel(t)) {
		for (int64_t g = g0; g < g1; g++) {
			const size_t off = (size_t)g * GPUD__PK_ROWS_F16 * wrow;

			if (t == GPUD_TYPE_F32)
				pack_f32((const void *)((const uint8_t *)W + off),
					 (void *)((uint8_t *)dst + off), cols);
			else
				pack_f16((const void *)((const uint8_t *)W + off),
					 (void *)((uint8_t *)dst + off), cols);
		}
		return;
	}
	tb = tab_of(t);
	for (int64_t g = g0; g < g1; g++) {
		const uint8_t *src = (const uint8_t *)W + (size_t)g * GPUD__PK_ROWS * wrow;
		uint8_t *u = (uint8_t *)dst + (size_t)g * GPUD__PK_ROWS * wrow;

		for (int64_t i = 0; i < nb; i++, u += GPUD__PK_ROWS * bsz) {
			const uint8_t *blk = src + (size_t)i * bsz;

			for (size_t k = 0; k < tb->n_runs; k++) {
				const struct pk_run *rn = &tb->runs[k];
				const uint8_t *from = blk + rn->row * wrow + rn->off;

				if (rn->len == 4)
					memcpy(u + rn->dst, from, 4);
				else
					memcpy(u + rn->dst, from, rn->len);
			}
		}
	}
}
