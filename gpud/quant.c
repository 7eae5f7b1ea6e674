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
	[GPUD_TYPE_Q8_0] = {
		.name = "q8_0", .block_elems = GPUD_QK,
		.block_bytes = sizeof(struct gpud_block_q8_0), .quantized = true, .matmul = true,
		.quantize = quantize_q8_0, .dequantize = dequantize_q8_0,
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
