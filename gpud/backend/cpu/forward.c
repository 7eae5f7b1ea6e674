/* forward.c - the CPU backend: Llama / Qwen2 / Qwen3 forward pass over a
 * ragged batch.
 *
 * One step runs every weight matrix once over all T tokens of the batch
 * (gpud_matmul), so weights are streamed once per step whatever the number
 * of sequences. Everything between the matmuls is done per token (norms,
 * RoPE, KV writes) or per (token, KV head) (attention) on the thread pool;
 * sections too small to pay for waking the pool run on the caller, and a
 * batch of one token fuses Q/K/V and gate/up into one section each.
 *
 * KV elements are fp32 or fp16 (cfg.kv_type). fp16 K and V are rounded
 * once, when written; attention widens a block's K and V of one KV head to
 * fp32 once for all the query heads that share it, then runs the fp32 code.
 *
 * Memory: KV storage for n_blocks blocks and one scratch reservation sized
 * for max_batch_tokens / max_logits are made in cpu_init, backed there
 * (sw_mem_prefault: the RSS is the plan from the start, not as blocks
 * fill) and carved once; a step allocates nothing.
 */
#include "gpud/backend/cpu/cpu.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arena.h"
#include "common/clones.h"
#include "common/err.h"
#include "common/mem.h"
#include "gpud/backend/cpu/kernels.h"
#include "gpud/backend/cpu/rope.h"
#include "gpud/backend/cpu/threadpool.h"
#include "gpud/backend/cpu/vec8.h"
#include "gpud/mask.h"
#include "gpud/model.h"

#define FUSE_JOBS 3 /* at most: Q, K, V */

struct cpu_ctx {
	struct gpud_backend_config cfg;
	const struct gpud_model_hparams *hp;
	const struct gpud_model_weights *w; /* the model's, or &pw */
	/* The weights as this instance reads them: the model's, except the
	 * layer matrices the kernels read faster in their packed layout,
	 * copied and packed at init (pack_weights()). */
	struct gpud_model_weights pw;
	struct gpud_layer_weights *players;
	uint8_t *packed;
	size_t packed_bytes;
	struct gpud_tp *tp;
	int nth;
	uint32_t q_dim, kv_dim;
	/* KV geometry in elements of cfg.kv_type (esz bytes each) */
	size_t head_elems;   /* block_tokens * head_dim: one KV head of one block */
	size_t layer_elems;  /* 2 * n_kv_heads * head_elems: K then V */
	size_t block_elems;  /* n_layers * layer_elems */
	size_t esz;          /* 4 (f32) or 2 (f16) */
	bool kv16;           /* cfg.kv_type is GPUD_TYPE_F16 */
	uint8_t *kv;         /* (n_blocks, n_layers, 2, n_kv_heads, block_tokens, head_dim) */
	size_t kv_bytes;

	struct sw_arena arena; /* the one scratch reservation, carved at init */
	float *x;        /* (T, dim) residual stream */
	float *xb;       /* (T, dim) normed input / projection output / final hidden */
	float *q;        /* (T, n_heads*head_dim) */
	float *k;        /* (T, n_kv_heads*head_dim) */
	float *v;        /* (T, n_kv_heads*head_dim) */
	float *att;      /* (T, n_heads*head_dim) attention output */
	float *hb;       /* (T, ffn_dim) gate, then silu(gate)*up */
	float *hb2;      /* (T, ffn_dim) up */
	float *rope_cs;  /* (T, head_dim/2, 2) cos, sin at each token's position */
	float *shift_cs; /* (head_dim/2, 2) kv_copy_shift's rotation, then (with
			  * f16 KV) a row of head_dim widened keys */
	float *xl;       /* (max_logits, dim) final-normed rows that need logits */
	float *logits;   /* (max_logits, n_vocab) */
	float *att_tmp;  /* (nth, att_tmp_stride) per-thread softmax state and scores */
	size_t att_tmp_stride; /* g * (block_tokens + 2 * ATT_TILE), g = heads per KV head,
				* + 2 * block_tokens * head_dim with f16 KV
				* (one KV head's K and V of a block, widened) */
	uint32_t *tok_seq; /* (T) batch entry of each token */
	uint32_t *tiles;   /* (T) the step's attention tiles: first token << 4 | (tokens - 1) */
	uint32_t n_tiles;
	uint32_t *tok_pos; /* (T) position of each token */
	uint32_t *logit_tok; /* (max_logits) token index of each logits row */
	void *mm;        /* matmul scratch */
	/* Fused sections (steps of at most fuse_max_t tokens): per thread,
	 * each job's quantized activations. */
	uint32_t fuse_max_t;
	uint8_t *mm1;    /* (nth, FUSE_JOBS, mm1_stride) */
	size_t mm1_stride;

	/* The step being run, read by the workers. */
	const struct gpud_fwd_batch *b;
	uint32_t layer;
	uint64_t attn_work;  /* multiply-adds of this step's attention (upper bound) */
	struct mm_job {
		const struct gpud_weight *w;
		const float *x;  /* (cols) */
		float *y;        /* (rows) */
	} jobs[FUSE_JOBS];
	uint32_t n_jobs;
	bool jobs_swiglu;    /* jobs are gate, up: finish with silu(gate) * up */
	const float *norm_w; /* add_norm: weight, or NULL for add only */
	bool add;            /* add_norm: x += xb first */

	struct gpud_backend_stats st;
};

/* --- small vector helpers (plain loops the compiler vectorizes) --------- */

/* The sum of v8f a's lanes, then t: in one order wherever a dot product
 * ends (dot, dot4, dot8's vector form), so that a key's score has the
 * same bits whichever of them computed it. */
#define HSUM8(a, t) \
	(((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7]))) + (t))

static inline float dot(const float *a, const float *b, uint32_t n)
{
	v8f acc = { 0 };
	float t = 0;
	uint32_t i = 0;

	for (; i + 8 <= n; i += 8)
		acc += load8(a + i) * load8(b + i);
	for (; i < n; i++)
		t += a[i] * b[i];
	return HSUM8(acc, t);
}

/* Inlined always: attend()'s clones must compile them for their target
 * (not inlined, dot4() ran as SSE code). */
#define ATT_INLINE static inline __attribute__((always_inline))

/* dot() of q with the 4 rows k, k + stride, k + 2 * stride, k + 3 *
 * stride into out[0..3]: each is dot()'s sum in dot()'s order, so the same
 * bits; the four chains side by side keep the adder busy where one chain
 * waits on its own latency, and q is read once for the four. */
ATT_INLINE void dot4(const float *q, const float *k, size_t stride, uint32_t n, float *out)
{
	v8f a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
	float t[4] = { 0, 0, 0, 0 };
	uint32_t i = 0;

	for (; i + 8 <= n; i += 8) {
		v8f qv = load8(q + i);

		a0 += qv * load8(k + i);
		a1 += qv * load8(k + stride + i);
		a2 += qv * load8(k + 2 * stride + i);
		a3 += qv * load8(k + 3 * stride + i);
	}
	for (; i < n; i++)
		for (int r = 0; r < 4; r++)
			t[r] += q[i] * k[(size_t)r * stride + i];
	out[0] = HSUM8(a0, t[0]);
	out[1] = HSUM8(a1, t[1]);
	out[2] = HSUM8(a2, t[2]);
	out[3] = HSUM8(a3, t[3]);
}

/* Lanes i of a and b, pairwise summed: [a0+a1, b0+b1, a2+a3, b2+b3, ...]
 * (level 1 of dot8's reduction), and the two later levels. */
#define PAIR_EVEN(a, b) __builtin_shufflevector(a, b, 0, 8, 2, 10, 4, 12, 6, 14)
#define PAIR_ODD(a, b) __builtin_shufflevector(a, b, 1, 9, 3, 11, 5, 13, 7, 15)
#define QUAD_LO(a, b) __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13)
#define QUAD_HI(a, b) __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15)
#define HALF_LO(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11)
#define HALF_HI(a, b) __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15)

/* dot4() of 8 rows: eight chains side by side, as many as an adder's
 * latency times its throughput wants; then the eight sums at once, lanes
 * moved across the eight vectors (7 adds where one row at a time took 56
 * scalar ones), in HSUM8's order: the same bits again. */
ATT_INLINE void dot8(const float *q, const float *k, size_t stride, uint32_t n, float *out)
{
	/* named, not an array: an array of accumulators stays in memory */
	v8f a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 }, a4 = { 0 }, a5 = { 0 }, a6 = { 0 },
	    a7 = { 0 };
	float t[8] = { 0 };
	uint32_t i = 0;

	for (; i + 8 <= n; i += 8) {
		v8f qv = load8(q + i);

		a0 += qv * load8(k + i);
		a1 += qv * load8(k + stride + i);
		a2 += qv * load8(k + 2 * stride + i);
		a3 += qv * load8(k + 3 * stride + i);
		a4 += qv * load8(k + 4 * stride + i);
		a5 += qv * load8(k + 5 * stride + i);
		a6 += qv * load8(k + 6 * stride + i);
		a7 += qv * load8(k + 7 * stride + i);
	}
	for (; i < n; i++)
		for (int r = 0; r < 8; r++)
			t[r] += q[i] * k[(size_t)r * stride + i];
	/* [x01 of rows 0, 1, x23 of 0, 1, ...], xAB = lane A + lane B */
	v8f p01 = PAIR_EVEN(a0, a1) + PAIR_ODD(a0, a1), p23 = PAIR_EVEN(a2, a3) + PAIR_ODD(a2, a3);
	v8f p45 = PAIR_EVEN(a4, a5) + PAIR_ODD(a4, a5), p67 = PAIR_EVEN(a6, a7) + PAIR_ODD(a6, a7);
	/* [x01 + x23 of rows 0-3, x45 + x67 of rows 0-3], the same of 4-7 */
	v8f q03 = QUAD_LO(p01, p23) + QUAD_HI(p01, p23);
	v8f q47 = QUAD_LO(p45, p67) + QUAD_HI(p45, p67);
	v8f sum = (HALF_LO(q03, q47) + HALF_HI(q03, q47)) + load8(t);

	memcpy(out, &sum, sizeof(sum));
}

/* sc[j] = e^(sc[j] - m) for j < n: 0 where sc[j] is -inf (hidden) or
 * below e^-87. Returns their sum (lane k adds sc[k], sc[k + 8], ... ,
 * then HSUM8: an order fixed by n) and *zeros, how many are 0. */
ATT_INLINE float exp_shifted(float *sc, uint32_t n, float m, uint32_t *zeros)
{
	v8f acc = { 0 };
	v8i nz = { 0 }; /* -1 in a lane per 0 */
	const v8f zero = { 0 };
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8) {
		v8f v = load8(sc + j) - m;

		exp8(&v);
		acc += v;
		nz += v == zero;
		memcpy(sc + j, &v, sizeof(v));
	}
	if (j < n) {
		float t[8];
		v8f v;

		for (uint32_t k = 0; k < 8; k++)
			t[k] = j + k < n ? sc[j + k] - m : -INFINITY;
		v = load8(t);
		exp8(&v);
		acc += v;
		nz += v == zero;
		memcpy(t, &v, sizeof(v));
		memcpy(sc + j, t, (n - j) * sizeof(float));
	}
	/* the padding lanes past n are zeros too */
	*zeros = (uint32_t)-(nz[0] + nz[1] + nz[2] + nz[3] + nz[4] + nz[5] + nz[6] + nz[7]) -
		 (n % 8 ? 8 - n % 8 : 0);
	return HSUM8(acc, 0.0f);
}

/* sc[j] *= scale for j < n; returns their maximum (-inf when every one
 * is -inf; a NaN is passed over, as by a scalar `if (x > max)`). */
ATT_INLINE float scale_max(float *sc, uint32_t n, float scale)
{
	v8f mv = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
		   -INFINITY, -INFINITY, -INFINITY, -INFINITY };
	float mb = -INFINITY;
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8) {
		v8f v = load8(sc + j) * scale;
		v8i gt = v > mv;

		mv = (v8f)(((v8i)v & gt) | ((v8i)mv & ~gt));
		memcpy(sc + j, &v, sizeof(v));
	}
	for (; j < n; j++) {
		sc[j] *= scale;
		if (sc[j] > mb)
			mb = sc[j];
	}
	/* lanes by constant subscripts: a loop over them went through memory */
	float m01 = mv[0] > mv[1] ? mv[0] : mv[1], m23 = mv[2] > mv[3] ? mv[2] : mv[3];
	float m45 = mv[4] > mv[5] ? mv[4] : mv[5], m67 = mv[6] > mv[7] ? mv[6] : mv[7];
	float m03 = m01 > m23 ? m01 : m23, m47 = m45 > m67 ? m45 : m67;
	float m07 = m03 > m47 ? m03 : m47;

	return m07 > mb ? m07 : mb;
}

/* e^x of one float, by exp8's arithmetic. */
ATT_INLINE float exp1(float x)
{
	v8f v = { x, x, x, x, x, x, x, x };

	exp8(&v);
	return v[0];
}

/* y = y * s + p[0] * x[0], then y = y + p[u] * x[u] for u = 1..nv-1
 * (x[u] = v + idx[u] * n), over n floats: up to ATT_RUN values of a KV
 * block folded into the output. Each element takes the steps of nv
 * updates y = y * s + p * x one by one (s = 1 after the first: y * 1 is
 * y), with y in a register across them instead of a load and a store
 * per value. An element's updates are a chain, each waiting on the last:
 * eight or four vectors of elements go side by side (as many chains in
 * flight), with
 * the rows' addresses and the broadcast p[u] made once, not per vector.
 * Each element's arithmetic is the same, so the same bits. */
#define ATT_RUN 16
/* Tokens of one sequence whose attention shares each K/V block read. */
#define ATT_TILE 8
/* scale_axpy_n's update of the W vectors at y (column i of the rows x):
 * W chains side by side. W is a constant where inlined: the loops unroll
 * and the accumulators stay in registers. */
ATT_INLINE void axpy_cols(float *y, float s, const float *const *x, const v8f *pb, uint32_t nv,
			  uint32_t i, const int W)
{
	v8f a[8];

#pragma GCC unroll 8
	for (int w = 0; w < W; w++)
		a[w] = load8(y + 8 * w) * s + load8(x[0] + i + 8 * w) * pb[0];
	for (uint32_t u = 1; u < nv; u++)
#pragma GCC unroll 8
		for (int w = 0; w < W; w++)
			a[w] = a[w] + load8(x[u] + i + 8 * w) * pb[u];
#pragma GCC unroll 8
	for (int w = 0; w < W; w++)
		memcpy(y + 8 * w, &a[w], sizeof(a[w]));
}

ATT_INLINE void scale_axpy_n(float *y, float s, const float *p, const float *v,
			     const uint16_t *idx, uint32_t nv, uint32_t n)
{
	const float *x[ATT_RUN];
	v8f pb[ATT_RUN];
	uint32_t i = 0;

	for (uint32_t u = 0; u < nv; u++) {
		x[u] = v + (size_t)(idx ? idx[u] : u) * n;
		pb[u] = (v8f){ p[u], p[u], p[u], p[u], p[u], p[u], p[u], p[u] };
	}
	for (; i + 64 <= n; i += 64)
		axpy_cols(y + i, s, x, pb, nv, i, 8);
	for (; i + 32 <= n; i += 32)
		axpy_cols(y + i, s, x, pb, nv, i, 4);
	for (; i + 8 <= n; i += 8) {
		/* one vector: its chain in two, even and odd values (a short
		 * head's update would otherwise wait on the adder's latency
		 * at every value) */
		v8f acc = load8(y + i) * s + load8(x[0] + i) * pb[0], acc1 = { 0 };
		uint32_t u = 1;

		for (; u + 2 <= nv; u += 2) {
			acc1 = acc1 + load8(x[u] + i) * pb[u];
			acc = acc + load8(x[u + 1] + i) * pb[u + 1];
		}
		if (u < nv)
			acc1 = acc1 + load8(x[u] + i) * pb[u];
		acc = acc + acc1;
		memcpy(y + i, &acc, sizeof(acc));
	}
	for (; i < n; i++) {
		float acc = y[i] * s + p[0] * x[0][i];

		for (uint32_t u = 1; u < nv; u++)
			acc = acc + p[u] * x[u][i];
		y[i] = acc;
	}
}

static void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
	double ss = 0;

	for (uint32_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	float scale = (float)(1.0 / sqrt(ss / n + eps));
	for (uint32_t i = 0; i < n; i++)
		out[i] = x[i] * scale * w[i];
}

/* y += b over n floats. */
static void add_bias(float *y, const float *b, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		y[i] += b[i];
}

/* --- parallel sections --------------------------------------------------- */

/* x[t] += xb[t] (when add), then xb[t] = rmsnorm(x[t]) * norm_w (when set). */
static void add_norm_run(void *arg, int ith, int nth)
{
	struct cpu_ctx *c = arg;
	uint32_t dim = c->hp->dim;
	long lo, hi;

	gpud_tp_range(c->b->n_tokens, ith, nth, 1, &lo, &hi);
	for (long t = lo; t < hi; t++) {
		float *x = c->x + (size_t)t * dim, *xb = c->xb + (size_t)t * dim;
		if (c->add)
			for (uint32_t i = 0; i < dim; i++)
				x[i] += xb[i];
		if (c->norm_w)
			rmsnorm(xb, x, c->norm_w, dim, c->hp->norm_eps);
	}
}

/* Element off of block blk's KV storage. */
static inline uint8_t *kv_at(const struct cpu_ctx *c, uint32_t blk, size_t off)
{
	return c->kv + ((size_t)blk * c->block_elems + off) * c->esz;
}

/* n floats into KV storage at d: copied, or rounded to fp16 (nearest
 * even, the rounding of a device's __float2half_rn). */
static void kv_put(const struct cpu_ctx *c, uint8_t *d, const float *x, uint32_t n)
{
	if (!c->kv16) {
		memcpy(d, x, (size_t)n * sizeof(float));
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint16_t h = gpud_fp32_to_fp16(x[i]);
		memcpy(d + 2 * (size_t)i, &h, 2);
	}
}

/* n elements of KV storage at s as floats in out (exact). */
static void kv_get(const struct cpu_ctx *c, const uint8_t *s, float *out, uint32_t n)
{
	if (c->kv16)
		gpud_get_row(GPUD_TYPE_F16, s, n, 0, out);
	else
		memcpy(out, s, (size_t)n * sizeof(float));
}

/* Prefetches the n bytes at k and at k + voff (a block's K and V of one
 * KV head). Blocks are scattered and a KV head's rows of one block span
 * page boundaries, where the hardware's stream prefetchers stop: without
 * this, attention over a long context waits on memory at each block. */
static inline void kv_prefetch(const struct cpu_ctx *c, const uint8_t *k, size_t voff, size_t n)
{
	(void)c;
	for (size_t o = 0; o < n; o += 64) {
		__builtin_prefetch(k + o, 0, 3);
		__builtin_prefetch(k + voff + o, 0, 3);
	}
}

/* Q/K/V biases (when the model has them) and RoPE on q and k of each
 * token, then its k and v into its KV block. */
static void rope_store_run(void *arg, int ith, int nth)
{
	struct cpu_ctx *c = arg;
	const struct gpud_model_hparams *hp = c->hp;
	uint32_t hd = hp->head_dim, bt = c->cfg.block_tokens;
	long lo, hi;

	gpud_tp_range(c->b->n_tokens, ith, nth, 1, &lo, &hi);
	for (long t = lo; t < hi; t++) {
		const struct gpud_fwd_seq *s = &c->b->seqs[c->tok_seq[t]];
		const float *cs = c->rope_cs + (size_t)t * hd;
		uint32_t pos = c->tok_pos[t];
		float *q = c->q + (size_t)t * c->q_dim, *k = c->k + (size_t)t * c->kv_dim;
		float *v = c->v + (size_t)t * c->kv_dim;
		const struct gpud_layer_weights *L = &c->w->layers[c->layer];
		uint8_t *blk = kv_at(c, s->blocks[pos / bt], (size_t)c->layer * c->layer_elems);

		if (L->bq) {
			add_bias(q, L->bq, c->q_dim);
			add_bias(k, L->bk, c->kv_dim);
			add_bias(v, L->bv, c->kv_dim);
		}
		if (L->q_norm) { /* qwen3: each head normed before RoPE */
			for (uint32_t h = 0; h < hp->n_heads; h++)
				rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd,
					hp->norm_eps);
			for (uint32_t h = 0; h < hp->n_kv_heads; h++)
				rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd,
					hp->norm_eps);
		}
		gpud_rope_apply(q, cs, hp->n_heads, hd, hp->rope_style);
		gpud_rope_apply(k, cs, hp->n_kv_heads, hd, hp->rope_style);
		for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
			size_t ko = h * c->head_elems + (size_t)(pos % bt) * hd;
			size_t vo = ko + (size_t)hp->n_kv_heads * c->head_elems;
			kv_put(c, blk + ko * c->esz, k + (size_t)h * hd, hd);
			kv_put(c, blk + vo * c->esz, v + (size_t)h * hd, hd);
		}
	}
}

/* Attention of nt consecutive tokens t0.. of one sequence (a tile) for
 * query heads [h0, h1), which share KV head kh: an online softmax per
 * (token, head) over the visible positions of the sequence, block by
 * block, each K/V block read once for the whole tile while it is in L1
 * (with f16 KV, widened once into tmp for all of them: a prefill no
 * longer widens a block for every token). Each (token, head) does what
 * it would do alone, in the same order, so the bits do not depend on the
 * tile. tmp holds att_tmp_stride floats. */
SW_CLONES("avx2", "default")
static void attend(struct cpu_ctx *c, uint32_t t0, uint32_t nt, uint32_t kh, uint32_t h0,
		   uint32_t h1, float *tmp)
{
	const struct gpud_model_hparams *hp = c->hp;
	const struct gpud_fwd_seq *s = &c->b->seqs[c->tok_seq[t0]];
	const struct gpud_mask *mask = s->mask;
	uint32_t hd = hp->head_dim, bt = c->cfg.block_tokens;
	uint32_t g = h1 - h0, last = c->tok_pos[t0 + nt - 1];
	float *m = tmp, *l = tmp + ATT_TILE * g, *scores = tmp + 2 * ATT_TILE * g;
	float *kw = scores + (size_t)g * bt, *vw = kw + (size_t)bt * hd; /* f16 KV */
	float scale = hp->attn_scale;
	size_t voff = (size_t)hp->n_kv_heads * c->head_elems * c->esz;
	unsigned qs[ATT_TILE];

	for (uint32_t i = 0; i < nt; i++) {
		memset(c->att + (size_t)(t0 + i) * c->q_dim + (size_t)h0 * hd, 0,
		       (size_t)g * hd * sizeof(float));
		qs[i] = mask ? gpud_mask_seg(mask, c->tok_pos[t0 + i]) : 0;
		for (uint32_t h = 0; h < g; h++) {
			m[i * g + h] = -INFINITY;
			l[i * g + h] = 0;
		}
	}
	for (uint32_t b = 0; b <= last / bt; b++) {
		const uint8_t *kraw = kv_at(c, s->blocks[b],
					    (size_t)c->layer * c->layer_elems + kh * c->head_elems);
		const float *kb = (const float *)kraw, *vb = (const float *)(kraw + voff);
		uint32_t nmax = last - b * bt + 1 < bt ? last - b * bt + 1 : bt;
		bool kwide = !c->kv16, vwide = !c->kv16;

		if (b < last / bt) /* the next block's K and V, while this one is worked on */
			kv_prefetch(c, kv_at(c, s->blocks[b + 1],
					     (size_t)c->layer * c->layer_elems + kh * c->head_elems),
				    voff, bt * hd * c->esz);
		if (c->kv16) {
			kb = kw;
			vb = vw; /* each widened when a token first needs it */
		}
		for (uint32_t i = 0; i < nt; i++) {
			uint32_t pos = c->tok_pos[t0 + i], n;
			int vis;
			const float *q0 = c->q + (size_t)(t0 + i) * c->q_dim + (size_t)h0 * hd;
			float *out0 = c->att + (size_t)(t0 + i) * c->q_dim + (size_t)h0 * hd;
			float *mi = m + i * g, *li = l + i * g;

			if (b > pos / bt) /* causal: past this token */
				continue;
			vis = mask ? gpud_mask_block_vis(mask, qs[i], b) : 1;
			if (!vis)
				continue;
			n = pos - b * bt + 1 < bt ? pos - b * bt + 1 : bt; /* causal: k <= q */
			if (!kwide) {
				kv_get(c, kraw, kw, nmax * hd);
				kwide = true;
			}
			for (uint32_t h = 0; h < g; h++) {
				const float *q = q0 + (size_t)h * hd;
				float *out = out0 + (size_t)h * hd, *sc = scores + (size_t)h * bt;
				float mb = -INFINITY, pr[ATT_RUN];
				uint16_t idx[ATT_RUN];
				uint32_t j = 0, nr = 0, zeros;

				for (; j + 8 <= n; j += 8)
					dot8(q, kb + (size_t)j * hd, hd, hd, sc + j);
				for (; j + 4 <= n; j += 4)
					dot4(q, kb + (size_t)j * hd, hd, hd, sc + j);
				for (; j < n; j++)
					sc[j] = dot(q, kb + (size_t)j * hd, hd);
				if (vis == 2)
					for (j = 0; j < n; j++)
						if (!gpud_mask_visible(mask, qs[i], b * bt + j))
							sc[j] = -INFINITY;
				mb = scale_max(sc, n, scale);
				if (mb == -INFINITY)
					continue;
				if (!vwide) {
					kv_get(c, kraw + voff, vw, nmax * hd);
					vwide = true;
				}
				float corr = 1, lsum = li[h];
				if (mb > mi[h]) {
					corr = exp1(mi[h] - mb); /* 0 on the first visible block */
					lsum *= corr;
					mi[h] = mb;
				}
				lsum += exp_shifted(sc, n, mi[h], &zeros);
				/* the rescale by corr rides along with the first value */
				if (!zeros) { /* the rows in order, in runs */
					for (j = 0; j < n; j += ATT_RUN) {
						nr = n - j < ATT_RUN ? n - j : ATT_RUN;
						scale_axpy_n(out, corr, sc + j, vb + (size_t)j * hd,
							     NULL, nr, hd);
						corr = 1;
					}
					nr = 0;
				}
				for (j = 0; zeros && j < n; j++) {
					if (sc[j] == 0) /* hidden, or below e^-87 */
						continue;
					pr[nr] = sc[j];
					idx[nr++] = (uint16_t)j;
					if (nr == ATT_RUN) {
						scale_axpy_n(out, corr, pr, vb, idx, nr, hd);
						corr = 1;
						nr = 0;
					}
				}
				if (nr)
					scale_axpy_n(out, corr, pr, vb, idx, nr, hd);
				li[h] = lsum;
			}
		}
	}
	/* l > 0: a token always sees itself. */
	for (uint32_t i = 0; i < nt; i++)
		for (uint32_t h = 0; h < g; h++) {
			float inv = 1.0f / l[i * g + h];
			float *out = c->att + (size_t)(t0 + i) * c->q_dim + (size_t)(h0 + h) * hd;

			for (uint32_t k = 0; k < hd; k++)
				out[k] *= inv;
		}
}

/* y[i] = silu(y[i]) * u[i] for i < n, silu(g) = g / (1 + e^-g) with
 * exp8's e^: 8 elements at a time (libm's expf, one call an element, was
 * a few percent of a decode step), each element's value the same
 * whatever the range it is in. */
SW_CLONES("avx2", "default")
static void swiglu_rows(float *y, const float *u, long n)
{
	long i = 0;

	for (; i + 8 <= n; i += 8) {
		v8f g = load8(y + i), e = -g, r;

		exp8(&e);
		r = g / (1.0f + e) * load8(u + i);
		memcpy(y + i, &r, sizeof(r));
	}
	if (i < n) {
		float yt[8] = { 0 }, ut[8] = { 0 };

		memcpy(yt, y + i, (size_t)(n - i) * sizeof(float));
		memcpy(ut, u + i, (size_t)(n - i) * sizeof(float));
		swiglu_rows(yt, ut, 8);
		memcpy(y + i, yt, (size_t)(n - i) * sizeof(float));
	}
}

static void swiglu_run(void *arg, int ith, int nth)
{
	struct cpu_ctx *c = arg;
	long lo, hi;

	gpud_tp_range((long)c->b->n_tokens * c->hp->ffn_dim, ith, nth, 16, &lo, &hi);
	swiglu_rows(c->hb + lo, c->hb2 + lo, hi - lo);
}

/* Final norm of the rows that need logits, gathered into xl. */
static void logits_norm_run(void *arg, int ith, int nth)
{
	struct cpu_ctx *c = arg;
	uint32_t dim = c->hp->dim;
	long lo, hi;

	gpud_tp_range(c->b->n_logits, ith, nth, 1, &lo, &hi);
	for (long r = lo; r < hi; r++)
		rmsnorm(c->xl + (size_t)r * dim, c->x + (size_t)c->logit_tok[r] * dim,
			c->w->out_norm, dim, c->hp->norm_eps);
}

/* --- the step ------------------------------------------------------------ */

/* Below this many multiply-adds a section runs on the calling thread: waking
 * the pool costs more than it saves, and much more when the machine is
 * oversubscribed and a worker has to wait for a time slice. */
#define PAR_MIN_WORK 65536

/* Steps of at most this many tokens (decode batches) run Q/K/V and
 * gate/up as one parallel section each, every thread taking a slice of
 * rows; larger steps (prefill) are compute-bound and use one matmul each. */
#define FUSE_MAX_T 64

static void par(struct cpu_ctx *c, gpud_tp_fn fn, uint64_t work)
{
	if (work < PAR_MIN_WORK || c->nth == 1)
		fn(c, 0, 1);
	else
		gpud_tp_run(c->tp, fn, c);
}

/* gpud_matmul on rows of w starting at W (a slice of w's data starting on
 * a multiple of 8 rows), in w's layout. */
static void mm_call(struct gpud_tp *tp, const struct gpud_weight *w, const void *W, int64_t rows,
		    const float *x, int64_t n, float *y, void *scratch)
{
	if (w->packed)
		gpud_matmul_packed(tp, w->type, W, rows, w->cols, x, n, y, scratch);
	else
		gpud_matmul(tp, w->type, W, rows, w->cols, x, n, y, scratch);
}

/* Batch-1 fusion: several matrices over the same input in one parallel
 * section (decode steps thus wake the pool 4 times per layer instead of
 * 7+), their rows stacked, each matrix's padded to a multiple of 16 (a
 * piece then starts on a multiple of 16 of its matrix). The threads take
 * pieces with gpud_tp_claim(): the one that runs ahead helps the other at
 * the end instead of waiting for it. */
#define FUSE_ALIGN 16

/* Job j's prepared call for thread ith: its activations quantized into
 * the thread's slot j the first time the thread takes rows of it. */
static const struct gpud_mm_call *fuse_call(struct cpu_ctx *c, int ith, uint32_t j,
					    struct gpud_mm_call *calls, unsigned *ready)
{
	const struct mm_job *jb = &c->jobs[j];
	const struct gpud_weight *w = jb->w;

	if (!(*ready & 1u << j)) {
		gpud_matmul_prepare(&calls[j], w->type, w->packed, w->data, w->rows, w->cols, jb->x,
				    c->b->n_tokens, jb->y,
				    c->mm1 + ((size_t)ith * FUSE_JOBS + j) * c->mm1_stride);
		*ready |= 1u << j;
	}
	return &calls[j];
}

/* The next piece [*lo, *hi) of a fused section's `total` rows: all of
 * them at once on one thread (*taken says so after), else a claim. */
static bool fuse_piece(struct cpu_ctx *c, int ith, int nth, long total, bool *taken, long *lo,
		       long *hi)
{
	if (nth > 1)
		return gpud_tp_claim(c->tp, ith, lo, hi);
	if (*taken)
		return false;
	*taken = true;
	*lo = 0;
	*hi = total;
	return true;
}

/* The attention's work items: (tile, KV head) groups, or single (token,
 * head) pairs when there are too few groups to keep the threads busy. */
static bool attn_by_group(const struct cpu_ctx *c)
{
	uint32_t g = c->hp->n_heads / c->hp->n_kv_heads;

	return (long)c->n_tiles * c->hp->n_kv_heads >= 2L * c->nth || g == 1;
}

static long attn_items(const struct cpu_ctx *c)
{
	return attn_by_group(c) ? (long)c->n_tiles * c->hp->n_kv_heads :
				  (long)c->b->n_tokens * c->hp->n_heads;
}

/* A causal prefill's late tokens cost more than its early ones, so the
 * items are claimed (gpud_tp_claim): a thread done with its share takes
 * pieces from the back of the others'. */
static void attn_run(void *arg, int ith, int nth)
{
	struct cpu_ctx *c = arg;
	uint32_t nkv = c->hp->n_kv_heads, nh = c->hp->n_heads, g = nh / nkv;
	float *tmp = c->att_tmp + (size_t)ith * c->att_tmp_stride;
	bool grouped = attn_by_group(c), taken = false;
	long lo, hi;

	while (fuse_piece(c, ith, nth, attn_items(c), &taken, &lo, &hi))
		for (long i = lo; i < hi; i++) {
			if (grouped) {
				uint32_t tile = c->tiles[i / nkv], kh = (uint32_t)(i % nkv);

				attend(c, tile >> 4, (tile & 15) + 1, kh, kh * g, (kh + 1) * g, tmp);
			} else {
				uint32_t h = (uint32_t)(i % nh);

				attend(c, (uint32_t)(i / nh), 1, h / g, h, h + 1, tmp);
			}
		}
}

static void attn(struct cpu_ctx *c)
{
	if (c->attn_work < PAR_MIN_WORK || c->nth == 1) {
		attn_run(c, 0, 1);
		return;
	}
	gpud_tp_split(c->tp, attn_items(c), 1);
	gpud_tp_run(c->tp, attn_run, c);
}

static long fuse_rows(const struct cpu_ctx *c, uint32_t j)
{
	return ((long)c->jobs[j].w->rows + FUSE_ALIGN - 1) / FUSE_ALIGN * FUSE_ALIGN;
}

static void fused_mm_run(void *arg, int ith, int nth)
{
	struct cpu_ctx *c = arg;
	struct gpud_mm_call calls[FUSE_JOBS];
	uint32_t T = c->b->n_tokens;
	unsigned ready = 0;
	bool taken = false;
	long total = 0, lo, hi;

	if (c->jobs_swiglu) {
		/* gate and up share their rows: a piece of both, then
		 * silu(gate) * up on it, in place of gate */
		long rows = c->jobs[0].w->rows;

		while (fuse_piece(c, ith, nth, rows, &taken, &lo, &hi)) {
			gpud_matmul_rows(fuse_call(c, ith, 0, calls, &ready), lo, hi);
			gpud_matmul_rows(fuse_call(c, ith, 1, calls, &ready), lo, hi);
			for (uint32_t b = 0; b < T; b++) {
				float *y = c->jobs[0].y + (size_t)b * rows;
				const float *u = c->jobs[1].y + (size_t)b * rows;

				swiglu_rows(y + lo, u + lo, hi - lo);
			}
		}
		return;
	}
	for (uint32_t j = 0; j < c->n_jobs; j++)
		total += fuse_rows(c, j);
	while (fuse_piece(c, ith, nth, total, &taken, &lo, &hi)) {
		long base = 0;

		for (uint32_t j = 0; j < c->n_jobs; base += fuse_rows(c, j), j++) {
			long rows = c->jobs[j].w->rows, r0 = lo - base, r1 = hi - base;

			if (r0 < 0)
				r0 = 0;
			if (r1 > rows)
				r1 = rows;
			if (r0 < r1)
				gpud_matmul_rows(fuse_call(c, ith, j, calls, &ready), r0, r1);
		}
	}
}

static void mm_fused(struct cpu_ctx *c, uint32_t n_jobs)
{
	uint64_t work = 0;

	c->n_jobs = n_jobs;
	for (uint32_t j = 0; j < n_jobs; j++)
		work += (uint64_t)c->jobs[j].w->rows * (uint64_t)c->jobs[j].w->cols *
			c->b->n_tokens;
	if (work < 4 * PAR_MIN_WORK || c->nth == 1) {
		fused_mm_run(c, 0, 1);
		return;
	}
	if (c->jobs_swiglu) {
		gpud_tp_split(c->tp, (long)c->jobs[0].w->rows, FUSE_ALIGN);
	} else {
		long total = 0;

		for (uint32_t j = 0; j < n_jobs; j++)
			total += fuse_rows(c, j);
		gpud_tp_split(c->tp, total, FUSE_ALIGN);
	}
	gpud_tp_run(c->tp, fused_mm_run, c);
}

static void matmul(struct cpu_ctx *c, const struct gpud_weight *w, const float *x, uint32_t n,
		   float *y)
{
	uint64_t work = (uint64_t)w->rows * (uint64_t)w->cols * n;

	mm_call(work < 4 * PAR_MIN_WORK ? NULL : c->tp, w, w->data, w->rows, x, n, y, c->mm);
}

static void run_add_norm(struct cpu_ctx *c, bool add, const float *norm_w)
{
	c->add = add;
	c->norm_w = norm_w;
	par(c, add_norm_run, (uint64_t)c->b->n_tokens * c->hp->dim * 4);
}

/* Per-token bookkeeping and the RoPE table, once per step. */
static void prepare(struct cpu_ctx *c, const struct gpud_fwd_batch *b)
{
	const float *inv = c->w->rope_inv_freq;
	uint32_t half = c->hp->head_dim / 2;

	c->n_tiles = 0;
	for (uint32_t i = 0; i < b->n_seqs; i++) {
		const struct gpud_fwd_seq *s = &b->seqs[i];
		for (uint32_t j = 0; j < s->n_tokens; j++) {
			uint32_t t = s->tok0 + j;
			c->tok_seq[t] = i;
			c->tok_pos[t] = s->pos0 + j;
		}
		for (uint32_t j = 0; j < s->n_logits; j++)
			c->logit_tok[s->logit0 + j] = s->tok0 + s->n_tokens - s->n_logits + j;
		for (uint32_t j = 0; j < s->n_tokens; j += ATT_TILE) {
			uint32_t n = s->n_tokens - j < ATT_TILE ? s->n_tokens - j : ATT_TILE;

			c->tiles[c->n_tiles++] = (s->tok0 + j) << 4 | (n - 1);
		}
	}
	c->attn_work = 0;
	for (uint32_t t = 0; t < b->n_tokens; t++)
		c->attn_work += (uint64_t)(c->tok_pos[t] + 1) * c->hp->n_heads * c->hp->head_dim * 2;
	for (uint32_t t = 0; t < b->n_tokens; t++)
		gpud_rope_table(c->rope_cs + (size_t)t * 2 * half, inv, half, c->tok_pos[t]);
}

static int cpu_forward(void *ctx, const struct gpud_fwd_batch *b, char *err, size_t errlen)
{
	struct cpu_ctx *c = ctx;
	const struct gpud_model_hparams *hp = c->hp;
	const struct gpud_model_weights *w = c->w;
	uint32_t T = b->n_tokens, dim = hp->dim;

	if (!T || T > c->cfg.max_batch_tokens || b->n_seqs > c->cfg.max_seqs ||
	    b->n_logits > c->cfg.max_logits)
		return sw_seterr(err, errlen, -EINVAL, "cpu forward: batch exceeds the limits");
	c->b = b;
	prepare(c, b);
	for (uint32_t t = 0; t < T; t++)
		(w->tok_embd.packed ? gpud_get_row_packed : gpud_get_row)(
			w->tok_embd.type, w->tok_embd.data, dim, b->tokens[t],
			     c->x + (size_t)t * dim);
	run_add_norm(c, false, w->layers[0].attn_norm);
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const struct gpud_layer_weights *L = &w->layers[l];

		c->layer = l;
		if (T <= c->fuse_max_t) {
			c->jobs[0] = (struct mm_job){ &L->wq, c->xb, c->q };
			c->jobs[1] = (struct mm_job){ &L->wk, c->xb, c->k };
			c->jobs[2] = (struct mm_job){ &L->wv, c->xb, c->v };
			c->jobs_swiglu = false;
			mm_fused(c, 3);
		} else {
			matmul(c, &L->wq, c->xb, T, c->q);
			matmul(c, &L->wk, c->xb, T, c->k);
			matmul(c, &L->wv, c->xb, T, c->v);
		}
		par(c, rope_store_run, (uint64_t)T * (c->q_dim + 2 * c->kv_dim) * 2);
		attn(c);
		matmul(c, &L->wo, c->att, T, c->xb);
		run_add_norm(c, true, L->ffn_norm);
		if (T <= c->fuse_max_t) {
			c->jobs[0] = (struct mm_job){ &L->w_gate, c->xb, c->hb };
			c->jobs[1] = (struct mm_job){ &L->w_up, c->xb, c->hb2 };
			c->jobs_swiglu = true;
			mm_fused(c, 2);
		} else {
			matmul(c, &L->w_gate, c->xb, T, c->hb);
			matmul(c, &L->w_up, c->xb, T, c->hb2);
			par(c, swiglu_run, (uint64_t)T * hp->ffn_dim * 8);
		}
		matmul(c, &L->w_down, c->hb, T, c->xb);
		run_add_norm(c, true, l + 1 < hp->n_layers ? w->layers[l + 1].attn_norm : NULL);
	}
	if (b->want_hidden)
		run_add_norm(c, false, w->out_norm);
	if (b->n_logits) {
		par(c, logits_norm_run, (uint64_t)b->n_logits * dim * 4);
		matmul(c, &w->output, c->xl, b->n_logits, c->logits);
	}
	c->st.steps++;
	c->st.tokens += T;
	return 0;
}

/* --- lifetime -------------------------------------------------------------- */

static size_t mm_scratch(const struct gpud_weight *w, uint32_t batch, size_t cur)
{
	size_t n = gpud_matmul_scratch_bytes(w->type, w->cols, batch);
	return n > cur ? n : cur;
}

/* Floats of one thread's attention scratch (attend()'s tmp). */
static size_t att_tmp_floats(const struct gpud_model_hparams *hp,
			     const struct gpud_backend_config *cfg)
{
	size_t n = (size_t)(hp->n_heads / hp->n_kv_heads) * (cfg->block_tokens + 2 * ATT_TILE);

	if (cfg->kv_type == GPUD_TYPE_F16)
		n += 2 * (size_t)cfg->block_tokens * hp->head_dim;
	return n;
}

/* Bytes of w's packed copy, 0 when it stays plain. L: w's layer (NULL for
 * the output). The fused decode sections split the stacked rows of q, k,
 * v (and of gate, up) on multiples of 16 counted from the stack's start,
 * so a matrix of a layer is packed only where every stacked matrix is
 * whole groups of its type (8 rows, the float types 16): then each slice
 * starts on a group. */
static uint64_t packed_size(const struct gpud_layer_weights *L, const struct gpud_weight *w)
{
	const int64_t G = gpud_matmul_pack_rows(w->type);

	if (!gpud_matmul_packable(w->type, w->rows, w->cols))
		return 0;
	if (L && (L->wq.rows % G || L->wk.rows % G || L->wv.rows % G || L->w_gate.rows % G))
		return 0;
	return (gpud_type_row_bytes(w->type, (uint64_t)w->cols) * (uint64_t)w->rows + 63) / 64 * 64;
}

/* own_weight_bytes: what pack_weights() copies for an instance. */
static uint64_t cpu_own_weight_bytes(const struct gpud_backend_config *cfg)
{
	const struct gpud_model_weights *w = gpud_model_weights(cfg->model);
	uint64_t total = packed_size(NULL, &w->output);

	for (uint32_t l = 0; l < gpud_model_hparams(cfg->model)->n_layers; l++) {
		const struct gpud_layer_weights *L = &w->layers[l];

		total += packed_size(L, &L->wq) + packed_size(L, &L->wk) + packed_size(L, &L->wv) +
			 packed_size(L, &L->wo) + packed_size(L, &L->w_gate) +
			 packed_size(L, &L->w_up) + packed_size(L, &L->w_down);
	}
	return total;
}

/* The plan's figure (gpud_backend_ops.scratch_bytes): the packed weight
 * copies plus the carve of cpu_init below with the per-thread attention and fused-section buffers
 * estimated, since the thread pool does not exist yet. Within a small
 * factor of cpu_init's exact total (tests/unit/backend_test.c). */
static uint64_t cpu_scratch_bytes(const struct gpud_backend_config *cfg)
{
#define SZ64(n) (((uint64_t)(n) + 63) / 64 * 64)
	const struct gpud_model_hparams *hp = gpud_model_hparams(cfg->model);
	const struct gpud_model_weights *w = gpud_model_weights(cfg->model);
	uint64_t q = (uint64_t)hp->n_heads * hp->head_dim, kv = (uint64_t)hp->n_kv_heads * hp->head_dim;
	uint64_t T = cfg->max_batch_tokens, NL = cfg->max_logits ? cfg->max_logits : 1;
	uint64_t nth = 1, mm = 0, f = 4, total;

	if (cfg->n_threads > 0) {
		nth = (uint64_t)cfg->n_threads;
	} else {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nth = n > 0 ? (uint64_t)n : 1;
	}
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const struct gpud_weight *ws[] = { &w->layers[l].wq, &w->layers[l].wk,
						   &w->layers[l].wv, &w->layers[l].wo,
						   &w->layers[l].w_gate, &w->layers[l].w_up,
						   &w->layers[l].w_down };
		for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
			uint64_t s = gpud_matmul_scratch_bytes(ws[i]->type, ws[i]->cols,
							       (uint32_t)T);
			if (s > mm)
				mm = s;
		}
	}
	total = 2 * SZ64(T * hp->dim * f) + 2 * SZ64(T * q * f) + 2 * SZ64(T * kv * f) +
		2 * SZ64(T * hp->ffn_dim * f) + SZ64(T * hp->head_dim * f) +
		SZ64(NL * hp->dim * f) + SZ64(NL * hp->n_vocab * f) + 4 * SZ64(T * 4) + SZ64(mm);
	/* Per thread: the fused sections' quantized activations (as many
	 * bytes as floats of the input, a fifth more for the scales) and
	 * the attention's scores, small next to the above. */
	total += nth * (FUSE_JOBS * SZ64(FUSE_MAX_T * hp->dim * 5 / 4) +
			SZ64(att_tmp_floats(hp, cfg) * f));
	/* The instance's packed weight copies (pack_weights()). */
	return total + cpu_own_weight_bytes(cfg);
#undef SZ64
}

/* The matrices the kernels read faster packed (every weight type where
 * the AVX2 kernels run: backend/cpu/kernels.h) are copied into one
 * reservation in that layout, and c->w becomes a copy of the model's
 * table that points at them: the layer matrices and the output (with a
 * tied embedding table, the embedding too, gathered from the packed copy). The copy is made
 * once, here, on the pool; the model's mapping of those tensors is then
 * never read again by this instance, so its pages stay in the page cache
 * only (the resident cost is about the packed bytes, not twice them).
 * Returns 0 (also when nothing is packable) or -ENOMEM. */
/* The model's mapping of w, now copied: its whole pages leave this
 * process's RSS (the page cache keeps them; a later read maps them again,
 * as another instance packing the same model or a device upload does). */
static void drop_mapped(const struct gpud_weight *w)
{
	(void)sw_mem_drop_file_pages(w->data,
				     gpud_type_row_bytes(w->type, (uint64_t)w->cols) * (size_t)w->rows);
}

static int pack_weights(struct cpu_ctx *c, const struct gpud_model_weights *w)
{
	const uint32_t nl = c->hp->n_layers;
	size_t total = 0, off = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t l = 0; l < nl; l++) {
			struct gpud_layer_weights *L = pass ? &c->players[l] : NULL;
			const struct gpud_layer_weights *M = &w->layers[l];
			const struct gpud_weight *ws[] = { &M->wq, &M->wk, &M->wv, &M->wo,
							   &M->w_gate, &M->w_up, &M->w_down };
			struct gpud_weight *ds[7];

			if (L) {
				*L = *M;
				ds[0] = &L->wq, ds[1] = &L->wk, ds[2] = &L->wv, ds[3] = &L->wo;
				ds[4] = &L->w_gate, ds[5] = &L->w_up, ds[6] = &L->w_down;
			}
			for (size_t i = 0; i < 7; i++) {
				const struct gpud_weight *s = ws[i];
				size_t n = packed_size(M, s);

				if (!n)
					continue;
				if (!L) {
					total += n;
					continue;
				}
				gpud_matmul_pack(c->tp, s->type, s->data, c->packed + off, s->rows, s->cols);
				drop_mapped(s);
				ds[i]->data = c->packed + off;
				ds[i]->packed = true;
				off += n;
			}
		}
		/* The output matrix; a tied embedding table is the same matrix,
		 * gathered from the packed copy (gpud_get_row_packed()). */
		if (packed_size(NULL, &w->output)) {
			const struct gpud_weight *s = &w->output;
			size_t n = packed_size(NULL, s);

			if (pass == 1) {
				gpud_matmul_pack(c->tp, s->type, s->data, c->packed + off, s->rows, s->cols);
				drop_mapped(s);
				c->pw.output.data = c->packed + off;
				c->pw.output.packed = true;
				if (w->tok_embd.data == w->output.data)
					c->pw.tok_embd = c->pw.output;
				off += n;
			} else {
				total += n;
			}
		}
		if (pass == 0) {
			if (!total)
				return 0;
			c->packed_bytes = total;
			c->packed = sw_mem_map_big(total);
			c->players = calloc(nl, sizeof(*c->players));
			if (!c->packed || !c->players)
				return -ENOMEM;
			c->pw = *w;
			c->pw.layers = c->players;
		}
	}
	c->w = &c->pw;
	return 0;
}

static void cpu_destroy(void *ctx)
{
	struct cpu_ctx *c = ctx;

	if (!c)
		return;
	sw_mem_unmap_big(c->packed, c->packed_bytes);
	free(c->players);
	gpud_tp_destroy(c->tp);
	sw_arena_destroy(&c->arena);
	free(c->kv);
	free(c->shift_cs);
	free(c);
}

#define CARVE(ptr, count)                                                              \
	do {                                                                           \
		(ptr) = sw_arena_alloc(&c->arena, sizeof(*(ptr)) * (size_t)(count), 64); \
		if (!(ptr))                                                            \
			goto out_sizing;                                               \
	} while (0)

static int cpu_init(void **out, const struct gpud_backend_config *cfg, char *err, size_t errlen)
{
	struct cpu_ctx *c;
	const struct gpud_model_hparams *hp = gpud_model_hparams(cfg->model);
	const struct gpud_model_weights *w = gpud_model_weights(cfg->model);
	uint32_t T = cfg->max_batch_tokens, NL = cfg->max_logits ? cfg->max_logits : 1;
	size_t mm = 0, total;
	int rc;

	*out = NULL;
	if (!T || !cfg->n_blocks || !cfg->block_tokens || !cfg->max_seqs)
		return sw_seterr(err, errlen, -EINVAL, "cpu backend: zero size in config");
	c = calloc(1, sizeof(*c));
	if (!c)
		return sw_seterr(err, errlen, -ENOMEM, "cpu backend: out of memory");
	c->cfg = *cfg;
	c->cfg.max_logits = NL;
	c->hp = hp;
	c->w = w;
	c->q_dim = hp->n_heads * hp->head_dim;
	c->kv_dim = hp->n_kv_heads * hp->head_dim;
	if (!gpud_kv_type_ok(cfg->kv_type)) {
		rc = sw_seterr(err, errlen, -EINVAL, "cpu backend: KV type %s: f32 or f16 only",
			       gpud_type_name(cfg->kv_type));
		goto out_free;
	}
	c->kv16 = cfg->kv_type == GPUD_TYPE_F16;
	c->esz = c->kv16 ? 2 : 4;
	c->head_elems = (size_t)cfg->block_tokens * hp->head_dim;
	c->layer_elems = 2 * (size_t)hp->n_kv_heads * c->head_elems;
	c->block_elems = hp->n_layers * c->layer_elems;
	c->kv_bytes = (size_t)cfg->n_blocks * c->block_elems * c->esz;
	c->att_tmp_stride = att_tmp_floats(hp, cfg);
	rc = gpud_tp_create(&c->tp, cfg->n_threads);
	if (rc) {
		sw_seterr(err, errlen, rc, "cpu backend: thread pool: %s", sw_strerror(rc));
		goto out_free;
	}
	c->nth = gpud_tp_size(c->tp);
	rc = pack_weights(c, w);
	if (rc) {
		sw_seterr(err, errlen, rc, "cpu backend: cannot reserve %zu bytes (%.1f MiB) for "
			  "the packed weights: %s", c->packed_bytes, (double)c->packed_bytes / (1 << 20),
			  sw_strerror(rc));
		goto out_free;
	}
	c->shift_cs = calloc(2 * (size_t)hp->head_dim, sizeof(float));
	if (!c->shift_cs) {
		rc = sw_seterr(err, errlen, -ENOMEM, "cpu backend: out of memory");
		goto out_free;
	}
	c->kv = aligned_alloc(64, (c->kv_bytes + 63) / 64 * 64);
	rc = c->kv ? sw_mem_prefault(c->kv, c->kv_bytes) : -ENOMEM;
	if (rc) {
		rc = sw_seterr(err, errlen, rc, "cpu backend: cannot %s %zu bytes (%.1f MiB) of KV "
			       "storage: %s", c->kv ? "back" : "reserve", c->kv_bytes,
			       (double)c->kv_bytes / (1 << 20), sw_strerror(rc));
		goto out_free;
	}
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const struct gpud_layer_weights *L = &w->layers[l];
		mm = mm_scratch(&L->wq, T, mm);
		mm = mm_scratch(&L->wk, T, mm);
		mm = mm_scratch(&L->wv, T, mm);
		mm = mm_scratch(&L->wo, T, mm);
		mm = mm_scratch(&L->w_gate, T, mm);
		mm = mm_scratch(&L->w_up, T, mm);
		mm = mm_scratch(&L->w_down, T, mm);
	}
	mm = mm_scratch(&w->output, NL, mm);
	c->fuse_max_t = T < FUSE_MAX_T ? T : FUSE_MAX_T;
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const struct gpud_layer_weights *L = &w->layers[l];
		c->mm1_stride = mm_scratch(&L->wq, c->fuse_max_t, c->mm1_stride);
		c->mm1_stride = mm_scratch(&L->wk, c->fuse_max_t, c->mm1_stride);
		c->mm1_stride = mm_scratch(&L->wv, c->fuse_max_t, c->mm1_stride);
		c->mm1_stride = mm_scratch(&L->w_gate, c->fuse_max_t, c->mm1_stride);
		c->mm1_stride = mm_scratch(&L->w_up, c->fuse_max_t, c->mm1_stride);
	}
	c->mm1_stride = (c->mm1_stride + 63) / 64 * 64;
	/* Exact sum of the carves below, each rounded up to 64 bytes. */
#define SZ(n, type) (((size_t)(n) * sizeof(type) + 63) / 64 * 64)
	total = 2 * SZ((size_t)T * hp->dim, float) + 2 * SZ((size_t)T * c->q_dim, float) +
		2 * SZ((size_t)T * c->kv_dim, float) + 2 * SZ((size_t)T * hp->ffn_dim, float) +
		SZ((size_t)T * hp->head_dim, float) + SZ((size_t)NL * hp->dim, float) +
		SZ((size_t)NL * hp->n_vocab, float) +
		SZ((size_t)c->nth * c->att_tmp_stride, float) + 3 * SZ(T, uint32_t) +
		SZ(NL, uint32_t) + SZ(mm ? mm : 1, char) +
		SZ((size_t)c->nth * FUSE_JOBS * c->mm1_stride + 1, char);
#undef SZ
	rc = sw_arena_init(&c->arena, total);
	if (!rc)
		rc = sw_mem_prefault(c->arena.base, c->arena.cap);
	if (rc) {
		sw_seterr(err, errlen, rc, "cpu backend: cannot %s %zu bytes (%.1f MiB) of step "
			  "scratch: %s", c->arena.base ? "back" : "reserve", total,
			  (double)total / (1 << 20), sw_strerror(rc));
		goto out_free;
	}
	CARVE(c->x, (size_t)T * hp->dim);
	CARVE(c->xb, (size_t)T * hp->dim);
	CARVE(c->q, (size_t)T * c->q_dim);
	CARVE(c->att, (size_t)T * c->q_dim);
	CARVE(c->k, (size_t)T * c->kv_dim);
	CARVE(c->v, (size_t)T * c->kv_dim);
	CARVE(c->hb, (size_t)T * hp->ffn_dim);
	CARVE(c->hb2, (size_t)T * hp->ffn_dim);
	CARVE(c->rope_cs, (size_t)T * hp->head_dim);
	CARVE(c->xl, (size_t)NL * hp->dim);
	CARVE(c->logits, (size_t)NL * hp->n_vocab);
	CARVE(c->att_tmp, (size_t)c->nth * c->att_tmp_stride);
	CARVE(c->tok_seq, T);
	CARVE(c->tiles, T);
	CARVE(c->tok_pos, T);
	CARVE(c->logit_tok, NL);
	c->mm = sw_arena_alloc(&c->arena, mm ? mm : 1, 64);
	CARVE(c->mm1, (size_t)c->nth * FUSE_JOBS * c->mm1_stride + 1);
	if (!c->mm)
		goto out_sizing;
	c->st.kv_bytes = c->kv_bytes;
	c->st.scratch_bytes = total;
	c->st.scratch_high = c->arena.used; /* carved once: the step uses all of it */
	c->st.weight_bytes = c->packed_bytes;
	*out = c;
	return 0;

out_sizing:
	rc = sw_seterr(err, errlen, -EINVAL, "cpu backend: scratch sizing error");
out_free:
	cpu_destroy(c);
	return rc;
}
#undef CARVE

static const float *cpu_logits(void *ctx)
{
	return ((struct cpu_ctx *)ctx)->logits;
}

static const float *cpu_hidden(void *ctx)
{
	return ((struct cpu_ctx *)ctx)->xb;
}

static int cpu_kv_copy(void *ctx, uint32_t dst, uint32_t src)
{
	struct cpu_ctx *c = ctx;

	if (dst >= c->cfg.n_blocks || src >= c->cfg.n_blocks)
		return -EINVAL;
	if (dst != src)
		memcpy(kv_at(c, dst, 0), kv_at(c, src, 0), c->block_elems * c->esz);
	return 0;
}

/* K rotated by delta with the forward pass's own RoPE (the model's pairing
 * style and frequencies): rotations compose, R(p + d) =
 * R(d) R(p), whatever the pairing and the frequencies. */
static int cpu_kv_copy_shift(void *ctx, uint32_t dst, uint32_t dst_off, uint32_t src,
			     uint32_t src_off, uint32_t n, int32_t delta)
{
	struct cpu_ctx *c = ctx;
	uint32_t hd = c->hp->head_dim, bt = c->cfg.block_tokens;
	float *cs = c->shift_cs, *row = c->shift_cs + hd;

	if (dst >= c->cfg.n_blocks || src >= c->cfg.n_blocks || dst == src || src_off > bt ||
	    dst_off > bt || n > bt - src_off || n > bt - dst_off)
		return -EINVAL;
	gpud_rope_table(cs, c->w->rope_inv_freq, hd / 2, delta);
	for (uint32_t l = 0; l < c->hp->n_layers; l++) {
		for (uint32_t h = 0; h < 2 * c->hp->n_kv_heads; h++) {
			size_t o = (size_t)l * c->layer_elems + h * c->head_elems;
			const uint8_t *s = kv_at(c, src, o + (size_t)src_off * hd);
			uint8_t *d = kv_at(c, dst, o + (size_t)dst_off * hd);

			memcpy(d, s, (size_t)n * hd * c->esz);
			if (h >= c->hp->n_kv_heads || !delta)
				continue; /* V, or K that stays where it was */
			for (uint32_t t = 0; t < n; t++) {
				uint8_t *dt = d + (size_t)t * hd * c->esz;
				if (!c->kv16) {
					gpud_rope_apply((float *)dt, cs, 1, hd, c->hp->rope_style);
					continue;
				}
				kv_get(c, dt, row, hd); /* rotated in fp32, rounded once */
				gpud_rope_apply(row, cs, 1, hd, c->hp->rope_style);
				kv_put(c, dt, row, hd);
			}
		}
	}
	return 0;
}

static void cpu_stats(void *ctx, struct gpud_backend_stats *st)
{
	*st = ((struct cpu_ctx *)ctx)->st;
}

const struct gpud_backend_ops gpud_cpu_backend = {
	.name = "cpu",
	.scratch_bytes = cpu_scratch_bytes,
	.own_weight_bytes = cpu_own_weight_bytes,
	.init = cpu_init,
	.destroy = cpu_destroy,
	.forward = cpu_forward,
	.logits = cpu_logits,
	.hidden = cpu_hidden,
	.kv_copy = cpu_kv_copy,
	.kv_copy_shift = cpu_kv_copy_shift,
	.stats = cpu_stats,
};
