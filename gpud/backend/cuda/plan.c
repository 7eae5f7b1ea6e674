/* plan.c - the CUDA backend's host-side sizing: the device layout of an
 * instance (cuda_impl.h), gpud_cuda_plan_for (cuda.h) and the mapping of
 * CUDA errors to swarm codes. Pure: no CUDA call, nothing allocated, so
 * the memory plan runs before any device is touched and the unit tests run
 * on machines without one.
 */
#include "gpud/backend/cuda/cuda.h"
#include "gpud/backend/cuda/cuda_impl.h"

#include <driver_types.h>
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/par.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/quant.h"

_Static_assert(GPUD_CUDA_VIS_SETS == GPUD_MASK_MAX_SEGMENTS + 1, "one vis row per segment and G");
_Static_assert(sizeof(gpud_segset) == 16, "segsets are two words on the device too");

static uint64_t up(uint64_t n)
{
	return (n + GPUD_CUDA_ALIGN - 1) / GPUD_CUDA_ALIGN * GPUD_CUDA_ALIGN;
}

enum gpud_type gpud_cuda_dev_type(enum gpud_type t)
{
	switch (t) {
	case GPUD_TYPE_F32:
	case GPUD_TYPE_F16:
	case GPUD_TYPE_BF16:
	case GPUD_TYPE_Q8_0:
	case GPUD_TYPE_Q4_0:
		return t;
	case GPUD_TYPE_Q4_1:
	case GPUD_TYPE_Q5_0:
	case GPUD_TYPE_Q5_1:
	case GPUD_TYPE_IQ4_NL:
	case GPUD_TYPE_IQ4_XS:
	case GPUD_TYPE_Q2_K:
	case GPUD_TYPE_Q3_K:
	case GPUD_TYPE_Q4_K:
	case GPUD_TYPE_Q5_K:
	case GPUD_TYPE_Q6_K:
		return GPUD_TYPE_Q8_0;
	default: /* Q8_K (activations only), unknown ids */
		return GPUD_TYPE_COUNT;
	}
}

uint64_t gpud_cuda_quants_bytes(enum gpud_type t, int64_t rows, int64_t cols)
{
	uint64_t n = (uint64_t)rows * (uint64_t)cols;

	switch (gpud_cuda_dev_type(t)) {
	case GPUD_TYPE_F32:
		return up(n * 4);
	case GPUD_TYPE_F16:
	case GPUD_TYPE_BF16:
		return up(n * 2);
	case GPUD_TYPE_Q8_0:
		return up(n);
	case GPUD_TYPE_Q4_0:
		return up(n / 2);
	default:
		return 0;
	}
}

uint64_t gpud_cuda_tensor_bytes(enum gpud_type t, int64_t rows, int64_t cols)
{
	enum gpud_type d = gpud_cuda_dev_type(t);
	uint64_t q = gpud_cuda_quants_bytes(t, rows, cols);

	if (d == GPUD_TYPE_Q8_0 || d == GPUD_TYPE_Q4_0)
		return q + up((uint64_t)rows * (uint64_t)(cols / GPUD_QK) * 2);
	return q;
}

uint64_t gpud_cuda_pack_tmp_bytes(const struct gpud_weight *w)
{
	enum gpud_type d = gpud_cuda_dev_type(w->type);

	if (d == w->type || d != GPUD_TYPE_Q8_0)
		return 0;
	return ((uint64_t)w->cols * 4 + (uint64_t)w->cols / GPUD_QK * sizeof(struct gpud_block_q8_0) +
		15) / 16 * 16;
}

void gpud_cuda_pack_rows(const struct gpud_weight *w, uint64_t r0, uint64_t n, uint8_t *q,
			 uint8_t *d, void *tmp)
{
	enum gpud_type ft = w->type, dt = gpud_cuda_dev_type(ft);
	uint64_t nb = (uint64_t)w->cols / GPUD_QK, qrow = dt == GPUD_TYPE_Q8_0 ? 32 : 16;
	uint64_t bsz = gpud_type_block_bytes(dt), srow = gpud_type_row_bytes(ft, (uint64_t)w->cols);
	float *xf = (float *)tmp;
	uint8_t *xq = (uint8_t *)tmp + (uint64_t)w->cols * 4;

	for (uint64_t r = 0; r < n; r++) {
		const uint8_t *row = (const uint8_t *)w->data + (r0 + r) * srow;

		if (dt != ft) {
			gpud_dequantize_row(ft, row, xf, w->cols);
			gpud_quantize_row(GPUD_TYPE_Q8_0, xf, xq, w->cols);
			row = xq;
		}
		for (uint64_t i = 0; i < nb; i++) {
			memcpy(d + (r * nb + i) * 2, row + i * bsz, 2);
			memcpy(q + r * nb * qrow + i * qrow, row + i * bsz + 2, qrow);
		}
	}
}

struct pack_par {
	const struct gpud_weight *w;
	uint64_t r0, rowq, rowd, tb;
	uint8_t *q, *d, *tmp;
};

static void pack_part(void *arg, int part, uint64_t a, uint64_t e)
{
	struct pack_par *p = arg;

	gpud_cuda_pack_rows(p->w, p->r0 + a, e - a, p->q + a * p->rowq, p->d + a * p->rowd,
			    p->tmp + (uint64_t)part * p->tb);
}

void gpud_cuda_pack_rows_par(const struct gpud_weight *w, uint64_t r0, uint64_t n, uint8_t *q,
			     uint8_t *d, uint8_t *tmp, int nt)
{
	uint64_t nb = (uint64_t)w->cols / GPUD_QK;
	struct pack_par p = { w, r0, nb * (gpud_cuda_dev_type(w->type) == GPUD_TYPE_Q4_0 ? 16 : 32),
			      nb * 2, gpud_cuda_pack_tmp_bytes(w), q, d, tmp };

	if (nt > GPUD_CUDA_PACK_THREADS)
		nt = GPUD_CUDA_PACK_THREADS;
	if (!p.tb || nt < 2 || n < (uint64_t)nt * 4) /* splits only copy: one thread */
		nt = 1;
	sw_par_ranges(n, nt, pack_part, &p);
}

static int check_weight(const struct gpud_weight *w, const char *name, uint64_t *sum,
			uint64_t *requant, char *err, size_t errlen)
{
	enum gpud_type d = gpud_cuda_dev_type(w->type);
	uint64_t n = gpud_cuda_tensor_bytes(w->type, w->rows, w->cols);

	if (!n)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "%s has type %s, which the CUDA backend cannot hold (F32, F16, "
				 "BF16, Q8_0 and Q4_0 it multiplies, and the other 32- and "
				 "256-weight types it holds as Q8_0); this model runs on \"cpu\"",
				 name, gpud_type_name(w->type));
	if ((d == GPUD_TYPE_Q8_0 || d == GPUD_TYPE_Q4_0) && w->cols % GPUD_QK)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "the CUDA backend: %s has %lld columns, not a multiple of %d", name,
				 (long long)w->cols, GPUD_QK);
	*sum += n;
	if (d != w->type)
		*requant += n;
	return 0;
}

static int weights_bytes(const struct gpud_model *m, uint64_t *out, uint64_t *requant, char *err,
			size_t errlen)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const struct gpud_model_weights *w = gpud_model_weights(m);
	uint64_t sum = 0, norm = up((uint64_t)hp->dim * 4);
	int rc;

	*requant = 0;
	rc = check_weight(&w->tok_embd, "token_embd", &sum, requant, err, errlen);
	if (!rc && w->output.data != w->tok_embd.data)
		rc = check_weight(&w->output, "output", &sum, requant, err, errlen);
	for (uint32_t i = 0; !rc && i < hp->n_layers; i++) {
		const struct gpud_layer_weights *L = &w->layers[i];
		const struct gpud_weight *ws[] = { &L->wq, &L->wk, &L->wv, &L->wo,
						   &L->w_gate, &L->w_up, &L->w_down };

		for (size_t j = 0; !rc && j < sizeof(ws) / sizeof(ws[0]); j++)
			rc = check_weight(ws[j], "a layer matrix", &sum, requant, err, errlen);
		sum += 2 * norm;
		if (L->bq) /* Q/K/V biases (Qwen2) */
			sum += up((uint64_t)hp->n_heads * hp->head_dim * 4) +
			       2 * up((uint64_t)hp->n_kv_heads * hp->head_dim * 4);
		if (L->q_norm) /* per-head Q/K norms (Qwen3) */
			sum += 2 * up((uint64_t)hp->head_dim * 4);
	}
	if (rc)
		return rc;
	sum += norm + up((uint64_t)hp->head_dim / 2 * 4); /* out_norm, rope_inv_freq */
	*out = sum;
	return 0;
}

int gpud_cuda_layout_for(const struct gpud_backend_config *cfg, struct gpud_cuda_layout *l,
			 char *err, size_t errlen)
{
	const struct gpud_model_hparams *hp;
	uint64_t T, NL, S, bt, off;
	int rc;

	*l = (struct gpud_cuda_layout){ 0 };
	if (!cfg || !cfg->model || !cfg->max_batch_tokens || !cfg->n_blocks ||
	    !cfg->block_tokens || !cfg->max_seqs)
		return sw_seterr(err, errlen, -EINVAL, "the CUDA backend: zero size in config");
	if (cfg->max_batch_tokens > GPUD_CUDA_MAX_STEP_TOKENS ||
	    cfg->max_logits > GPUD_CUDA_MAX_STEP_TOKENS)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "the CUDA backend: %u tokens / %u logits rows per step (at most %u)",
				 cfg->max_batch_tokens, cfg->max_logits, GPUD_CUDA_MAX_STEP_TOKENS);
	if (!gpud_kv_type_ok(cfg->kv_type))
		return sw_seterr(err, errlen, -EINVAL, "the CUDA backend: KV type %s (f32 or f16)",
				 gpud_type_name(cfg->kv_type));
	hp = gpud_model_hparams(cfg->model);
	if (!hp->head_dim || hp->head_dim > GPUD_CUDA_MAX_HEAD_DIM || hp->head_dim % 2 || !hp->n_kv_heads ||
	    hp->n_heads % hp->n_kv_heads)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "the CUDA backend: head_dim %u (at most %u, even) with %u heads over "
				 "%u KV heads is not supported", hp->head_dim,
				 GPUD_CUDA_MAX_HEAD_DIM, hp->n_heads, hp->n_kv_heads);
	rc = weights_bytes(cfg->model, &l->weights_bytes, &l->weights_q8_bytes, err, errlen);
	if (rc)
		return rc;
	l->dim = hp->dim;
	l->q_dim = hp->n_heads * hp->head_dim;
	l->kv_dim = hp->n_kv_heads * hp->head_dim;
	l->ffn_dim = hp->ffn_dim;
	l->n_vocab = hp->n_vocab;
	l->head_dim = hp->head_dim;
	l->max_cols = l->dim;
	if (l->q_dim > l->max_cols)
		l->max_cols = l->q_dim;
	if (l->ffn_dim > l->max_cols)
		l->max_cols = l->ffn_dim;
	T = l->T = cfg->max_batch_tokens;
	NL = l->NL = cfg->max_logits ? cfg->max_logits : 1;
	S = l->S = cfg->max_seqs;
	bt = cfg->block_tokens;

	/* kv */
	l->kv_esz = cfg->kv_type == GPUD_TYPE_F16 ? 2 : 4;
	l->head_elems = bt * hp->head_dim;
	l->layer_elems = 2 * (uint64_t)hp->n_kv_heads * l->head_elems;
	l->block_elems = (uint64_t)hp->n_layers * l->layer_elems;
	l->kv_bytes = up((uint64_t)cfg->n_blocks * l->block_elems * l->kv_esz);

	/* A sequence has at most every block and at most n_ctx positions
	 * (the engine's limit too; forward refuses a step past it). */
	l->max_pos = (uint64_t)cfg->n_blocks * bt;
	if (hp->n_ctx && hp->n_ctx < l->max_pos)
		l->max_pos = hp->n_ctx;
	l->max_btab = S * ((l->max_pos + bt - 1) / bt);

	/* attention CTAs: a chunk of K, then a head_dim of q per warp, in
	 * GPUD_CUDA_ATT_SMEM; at most 32 warps */
	{
		uint64_t k_bytes = (uint64_t)GPUD_CUDA_ATT_CHUNK * (hp->head_dim + 1) * 4;
		uint64_t warps = (GPUD_CUDA_ATT_SMEM - k_bytes) / ((uint64_t)hp->head_dim * 4);
		uint32_t G = hp->n_heads / hp->n_kv_heads;

		if (warps > 32)
			warps = 32;
		l->att_heads = G < warps ? G : (uint32_t)warps;
		l->att_tile = (uint32_t)(warps / l->att_heads);
		if (l->att_tile > GPUD_CUDA_ATT_MAX_TILE)
			l->att_tile = GPUD_CUDA_ATT_MAX_TILE;
		l->max_tiles = (uint32_t)(T / l->att_tile + S);
	}

	/* masks: every sequence of a step holds one slot; as many again cache */
	l->mask_slots = (uint32_t)(2 * S < 4 ? 4 : 2 * S);
	l->max_prompt = l->max_pos;
	l->max_prompt_blocks = (l->max_prompt + bt - 1) / bt;
	l->mask_slot_bytes = up(GPUD_CUDA_VIS_SETS * 16 + l->max_prompt_blocks * 16 + l->max_prompt);
	l->masks_bytes = (uint64_t)l->mask_slots * l->mask_slot_bytes;

	/* step metadata */
	l->m_tokens = 0;
	l->m_pos = T;
	l->m_seq = 2 * T;
	l->m_logit = 3 * T;
	l->m_seqinfo = 3 * T + NL;
	l->m_tiles = l->m_seqinfo + S * GPUD_CUDA_SEQ_WORDS;
	l->m_ndraw = l->m_tiles + l->max_tiles;
	l->m_btab = l->m_ndraw + 1;
	l->m_draw = l->m_btab + l->max_btab;
	l->meta_words = l->m_draw + (uint64_t)NL * GPUD_CUDA_DRAW_WORDS;

	/* scratch */
	off = 0;
#define CARVE(field, bytes)          \
	do {                         \
		l->field = off;      \
		off += up(bytes);    \
	} while (0)
	CARVE(x, T * l->dim * 4);
	CARVE(xb, T * l->dim * 4);
	CARVE(q, T * l->q_dim * 4);
	CARVE(k, T * l->kv_dim * 4);
	CARVE(v, T * l->kv_dim * 4);
	CARVE(att, T * l->q_dim * 4);
	/* split-K attention: partials (o, max, sum) of up to ATT_PARTS
	 * (token, split) pairs per head, and one arrival counter per (token,
	 * head) of a decode-sized step, which the last CTA resets */
	CARVE(attp, (uint64_t)GPUD_CUDA_ATT_PARTS * (l->q_dim / l->head_dim) * (l->head_dim + 2) * 4);
	CARVE(attc, (uint64_t)GPUD_CUDA_GRAPH_MAX_T * (l->q_dim / l->head_dim) * 4);
	CARVE(hb, T * l->ffn_dim * 4);
	CARVE(hb2, T * l->ffn_dim * 4);
	CARVE(xl, NL * l->dim * 4);
	CARVE(logits, NL * l->n_vocab * 4);
	CARVE(amax, NL * GPUD_CUDA_ARGMAX_PARTS * 8); /* arg max keys of each row's ranges */
	CARVE(dscr, NL * GPUD_CUDA_DRAW_SCRATCH * 8); /* a draw's scratch (gpud_k_draw) */
	/* prepared activations: a step's tokens, or its logits rows */
	CARVE(actq, (T > NL ? T : NL) * l->max_cols);
	CARVE(actd, (T > NL ? T : NL) * (l->max_cols / GPUD_QK + 1) * 4);
	/* decode: gate/up's output quantized for down while actq still holds
	 * their input */
	CARVE(actq2, (uint64_t)GPUD_CUDA_GEMV_MAX_T * l->ffn_dim);
	CARVE(actd2, (uint64_t)GPUD_CUDA_GEMV_MAX_T * (l->ffn_dim / GPUD_QK + 1) * 4);
	/* int8 matmuls of a decode batch (up to 64 tokens) split their columns:
	 * partials of a layer's matrices (rows <= max_cols), a counter per 32
	 * rows, which the last CTA resets */
	l->mmp_floats = (uint64_t)GPUD_CUDA_MM_MAX_SPLITS * (T < 64 ? T : 64) * l->max_cols;
	l->mmc_words = (uint32_t)(l->max_cols / 32 + 1);
	CARVE(mmp, l->mmp_floats * 4);
	CARVE(mmc, (uint64_t)l->mmc_words * 4);
	/* F16/BF16 activations split in two halves for the tensor cores */
	CARVE(acth, (T > NL ? T : NL) * l->max_cols * 2);
	CARVE(actl, (T > NL ? T : NL) * l->max_cols * 2);
	CARVE(ascale, (T > NL ? T : NL) * 4);
	CARVE(meta, l->meta_words * 4);
#undef CARVE
	l->scratch_bytes = off;

	/* staging (host, pinned) */
	off = 0;
	l->st_logits = off;
	off += up(NL * l->n_vocab * 4);
	l->st_amax = off;
	off += up(NL * GPUD_CUDA_ARGMAX_PARTS * 8);
	l->st_hidden = off;
	off += up(T * l->dim * 4);
	l->st_meta = off;
	off += up(l->meta_words * 4);
	l->st_mask = off;
	off += l->mask_slot_bytes;
	l->staging_bytes = off < GPUD_CUDA_STAGING_MIN ? GPUD_CUDA_STAGING_MIN : off;

	return 0;
}

int gpud_cuda_plan_check(const struct gpud_backend_config *cfg, char *err, size_t errlen)
{
	struct gpud_cuda_layout l;

	return gpud_cuda_layout_for(cfg, &l, err, errlen);
}

void gpud_cuda_plan_for(const struct gpud_backend_config *cfg, struct gpud_cuda_plan *p)
{
	struct gpud_cuda_layout l;
	char err[SW_ERR_MAX];

	*p = (struct gpud_cuda_plan){ 0 };
	if (gpud_cuda_layout_for(cfg, &l, err, sizeof(err)))
		return; /* gpud_cuda_plan_check and init give the reason */
	p->weights = l.weights_bytes;
	p->weights_q8 = l.weights_q8_bytes;
	p->kv = l.kv_bytes;
	p->masks = l.masks_bytes;
	p->scratch = l.scratch_bytes;
	p->staging = l.staging_bytes;
}

uint32_t gpud_cuda_graph_max_t(const struct gpud_cuda_layout *l)
{
	uint32_t n = GPUD_CUDA_GRAPH_MAX_T;

	if (l->T < n)
		n = l->T;
	if (l->S < n)
		n = l->S;
	if (l->NL < n)
		n = l->NL;
	return n;
}

uint32_t gpud_cuda_att_splits(const struct gpud_cuda_layout *l, uint32_t T, uint32_t n_sm,
			      uint32_t per_sm_max)
{
	uint64_t ctas, want;

	if (!T || T > GPUD_CUDA_GRAPH_MAX_T || !l->head_dim)
		return 1;
	ctas = (uint64_t)T * (l->kv_dim / l->head_dim); /* CTAs of one split */
	want = (2ull * (n_sm ? n_sm : 1) + ctas - 1) / ctas;
	/* one wave (gpud_cuda_mm_splits): a long context's splits are equal
	 * work, and the CTAs past a wave would double the launch's time */
	if (per_sm_max) {
		uint64_t wave = (uint64_t)per_sm_max * (n_sm ? n_sm : 1) / ctas;
		if (want > wave)
			want = wave ? wave : 1;
	}
	if (want > GPUD_CUDA_ATT_MAX_SPLITS)
		want = GPUD_CUDA_ATT_MAX_SPLITS;
	if (want > GPUD_CUDA_ATT_PARTS / T)
		want = GPUD_CUDA_ATT_PARTS / T;
	return want ? (uint32_t)want : 1;
}

uint32_t gpud_cuda_mm_splits(enum gpud_cuda_mm_kernel k, uint64_t rows, uint64_t cols, uint32_t T,
			     uint64_t part_floats, uint32_t cnt_words, uint32_t n_sm,
			     uint32_t per_sm_max)
{
	bool pipe = k != GPUD_CUDA_MM_SINGLE; /* the half kernel: the pipelined one's tiles */
	uint64_t tile = pipe ? GPUD_CUDA_MMP_TILE_ROWS : GPUD_CUDA_MM1_TILE_ROWS;
	uint64_t step = pipe ? GPUD_CUDA_MMP_STEP_BLOCKS : GPUD_CUDA_MM1_STEP_BLOCKS;
	uint64_t per_sm = pipe ? GPUD_CUDA_MMP_PER_SM : 2;
	uint64_t tiles = (rows + tile - 1) / tile;
	uint64_t steps = k == GPUD_CUDA_MM_HALF
				 ? (cols + GPUD_CUDA_MMH_STEP_COLS - 1) / GPUD_CUDA_MMH_STEP_COLS
				 : (cols / GPUD_QK + step - 1) / step;
	uint64_t n;

	if (T <= GPUD_CUDA_GEMV_MAX_T || T > GPUD_CUDA_MM_TILE_TOKENS || !tiles)
		return 1;
	n = (per_sm * (n_sm ? n_sm : 1) + tiles - 1) / tiles;
	/* and one wave: no more CTAs than the device holds at once (an RTX
	 * 4090's 100 KB of shared memory a multiprocessor holds 2 pipelined
	 * CTAs, an H100's 228 KB 4): a wave and a bit would leave most of the
	 * device idle for the last CTAs' whole time */
	if (per_sm_max) {
		uint64_t wave = (uint64_t)per_sm_max * (n_sm ? n_sm : 1) / tiles;
		if (n > wave)
			n = wave ? wave : 1;
	}
	if (n > GPUD_CUDA_MM_MAX_SPLITS)
		n = GPUD_CUDA_MM_MAX_SPLITS;
	if (n > steps)
		n = steps;
	while (n > 1 && (n * T * rows > part_floats || tiles > cnt_words))
		n--;
	return n ? (uint32_t)n : 1;
}

int gpud_cuda_errcode(int cuda_err)
{
	switch (cuda_err) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorCallRequiresNewerDriver:
	case cudaErrorDevicesUnavailable:
	case cudaErrorSystemDriverMismatch:
		return -ENODEV;
	/* Sticky: the context is unusable, every later call fails the same
	 * way, and only a new process gets a working device (CUDA's runtime
	 * documentation says so of each). Unknown: what a device that fell
	 * off the bus or hit an Xid error reports. */
	case cudaErrorECCUncorrectable:
	case cudaErrorNvlinkUncorrectable:
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchTimeout:
	case cudaErrorAssert:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorLaunchFailure:
	case cudaErrorExternalDevice:
	case cudaErrorUnknown:
		return SW_EDEVICE;
	default:
		return -EIO;
	}
}
