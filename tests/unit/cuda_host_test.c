/* cuda_host_test.c - the CUDA backend's host-side logic, without a device:
 * the pool plan (gpud_cuda_plan_for and the layout behind it), the rows
 * of a matrix as uploaded (gpud_cuda_pack_rows: split, or requantized to
 * Q8_0), the mask
 * slot LRU, the mask slot image, the step metadata, the arg max keys and
 * the CUDA error mapping (gpud/backend/cuda/plan.c, step.c). Built only with the backend
 * (-Dgpu=enabled); nothing here calls CUDA.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <driver_types.h>

#include "common/err.h"
#include "gpud/backend/cuda/cuda.h"
#include "gpud/backend/cuda/cuda_impl.h"
#include "gpud/mask.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/sampler.h"
#include "test_desc.h"

static char tmpdir[64];

static int setup_dir(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/cuda_host_test.XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* The tiny preset in type t (tied or not), loaded. */
static struct gpud_model *tiny(enum gpud_type t, bool tied)
{
	struct gpud_mkmodel_params p;
	struct gpud_model *m = NULL;
	char path[128], err[SW_ERR_MAX];

	gpud_mkmodel_params_default(&p);
	snprintf(path, sizeof(path), "%s/tiny-%d-%d.gguf", tmpdir, (int)t, (int)tied);
	p.out = path;
	p.type = t;
	p.tied = tied;
	assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
	assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
	return m;
}

static struct gpud_backend_config cfg_for(const struct gpud_model *m)
{
	return (struct gpud_backend_config){
		.model = m, .n_blocks = 32, .block_tokens = 16, .max_batch_tokens = 64,
		.max_seqs = 4, .max_logits = 8,
	};
}

static uint64_t up256(uint64_t n)
{
	return (n + 255) / 256 * 256;
}

static void test_tensor_bytes(void **state)
{
	(void)state;
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_F32, 3, 64), 768);
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_F16, 3, 64), 512);
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_BF16, 4, 64), 512);
	/* Q8_0: 2048 quants + 64 scales of 2 bytes, each region aligned */
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_Q8_0, 32, 64), 2048 + 256);
	assert_int_equal(gpud_cuda_quants_bytes(GPUD_TYPE_Q8_0, 32, 64), 2048);
	/* Q4_0: 1024 bytes of nibbles + 128 bytes of scales */
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_Q4_0, 32, 64), 1024 + 256);
	assert_int_equal(gpud_cuda_quants_bytes(GPUD_TYPE_Q4_0, 32, 64), 1024);
	assert_int_equal(gpud_cuda_quants_bytes(GPUD_TYPE_F32, 3, 64), 768);
	/* the types held as Q8_0 take Q8_0's bytes; Q8_K and unknown ids none */
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_Q4_K, 32, 256), 8192 + 512);
	assert_int_equal(gpud_cuda_quants_bytes(GPUD_TYPE_Q5_0, 32, 64), 2048);
	assert_int_equal(gpud_cuda_tensor_bytes(GPUD_TYPE_Q8_K, 32, 256), 0);
	assert_int_equal(gpud_cuda_tensor_bytes((enum gpud_type)16, 32, 256), 0);
}

/* The rows upload_mat copies to the device: Q8_0 and Q4_0 split into
 * quants and scales as they are; every type without kernels here decoded
 * and quantized to Q8_0 - the bits of gpud_quantize_row(Q8_0) of the
 * decoded row, each weight within half a Q8_0 step (its 32-block's
 * largest magnitude / 254) and the fp16 rounding of the step (up to 127
 * steps of 2^-11 relative) of the file's value. */
static void test_pack_rows(void **state)
{
	static const enum gpud_type types[] = {
		GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,	 GPUD_TYPE_Q4_1, GPUD_TYPE_Q5_0,
		GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL, GPUD_TYPE_IQ4_XS, GPUD_TYPE_Q2_K,
		GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K, GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K,
	};
	enum { ROWS = 5, COLS = 512, NB = COLS / 32 };
	static float x[ROWS * COLS], dec[COLS], back[COLS];
	static uint8_t file[ROWS * COLS * 2], q[ROWS * COLS], d[ROWS * NB * 2];
	static uint8_t tmp[COLS * 4 + NB * 34 + 16], want[NB * 34];
	uint64_t seed = 0x9e3779b97f4a7c15ull;

	(void)state;
	for (int i = 0; i < ROWS * COLS; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		/* a spread of magnitudes, some blocks all one sign */
		x[i] = ((float)(seed >> 40) / (float)(1 << 24) - (i / 64 % 3 ? 0.5f : 0.1f)) *
		       (1.0f + (float)(i % 97) / 8);
	}
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		enum gpud_type ft = types[t], dt = gpud_cuda_dev_type(ft);
		size_t srow = gpud_type_row_bytes(ft, COLS);
		struct gpud_weight w = { .type = ft, .rows = ROWS, .cols = COLS, .data = file };
		uint64_t qrow = dt == GPUD_TYPE_Q4_0 ? 16 : 32;

		for (int r = 0; r < ROWS; r++)
			gpud_quantize_row(ft, x + r * COLS, file + r * srow, COLS);
		assert_int_equal(gpud_cuda_pack_tmp_bytes(&w), dt == ft ? 0 : sizeof(tmp) - 16);
		memset(q, 0xa5, sizeof(q));
		/* rows 1..4, as a chunk that does not start at row 0 */
		gpud_cuda_pack_rows(&w, 1, ROWS - 1, q, d, tmp);
		for (int r = 1; r < ROWS; r++) {
			const uint8_t *src = file + r * srow, *bq = q + (r - 1) * NB * qrow;
			const uint8_t *bd = d + (r - 1) * NB * 2;
			size_t bsz = gpud_type_block_bytes(dt);

			if (dt != ft) {
				gpud_dequantize_row(ft, src, dec, COLS);
				gpud_quantize_row(GPUD_TYPE_Q8_0, dec, want, COLS);
				src = want;
			}
			for (int b = 0; b < NB; b++) {
				assert_memory_equal(bd + b * 2, src + b * bsz, 2);
				assert_memory_equal(bq + b * qrow, src + b * bsz + 2, qrow);
			}
			if (dt == ft)
				continue;
			/* the device's weights against the file's */
			for (int b = 0; b < NB; b++) {
				float amax = 0, scale;
				uint16_t h;

				memcpy(&h, bd + b * 2, 2);
				scale = gpud_fp16_to_fp32(h);
				for (int j = 0; j < 32; j++) {
					back[b * 32 + j] = scale * (float)(int8_t)bq[b * 32 + j];
					if (fabsf(dec[b * 32 + j]) > amax)
						amax = fabsf(dec[b * 32 + j]);
				}
				for (int j = 0; j < 32; j++)
					assert_true(fabsf(back[b * 32 + j] - dec[b * 32 + j]) <=
						    amax / 254 + amax / 2048 + 1e-7f);
			}
		}
	}
}

/* Weights: the sum of every tensor as uploaded, counted here the long way. */
static void test_plan_weights(void **state)
{
	const enum gpud_type types[] = { GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16,
					 GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0 };

	(void)state;
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		for (int tied = 0; tied < 2; tied++) {
			struct gpud_model *m = tiny(types[i], tied);
			const struct gpud_model_hparams *hp = gpud_model_hparams(m);
			const struct gpud_model_weights *w = gpud_model_weights(m);
			struct gpud_backend_config cfg = cfg_for(m);
			struct gpud_cuda_plan p;
			uint64_t want = 0;

#define MAT(x) gpud_cuda_tensor_bytes((x).type, (x).rows, (x).cols)
			want += MAT(w->tok_embd);
			if (!tied)
				want += MAT(w->output);
			for (uint32_t l = 0; l < hp->n_layers; l++) {
				const struct gpud_layer_weights *L = &w->layers[l];
				want += MAT(L->wq) + MAT(L->wk) + MAT(L->wv) + MAT(L->wo) +
					MAT(L->w_gate) + MAT(L->w_up) + MAT(L->w_down) +
					2 * up256(hp->dim * 4);
			}
#undef MAT
			want += up256(hp->dim * 4) + up256(hp->head_dim / 2 * 4);
			gpud_cuda_plan_for(&cfg, &p);
			assert_int_equal(p.weights, want);
			/* the quantized forms are smaller than the file's blocks
			 * only by alignment: never more than F32 */
			assert_true(p.weights <= 4 * gpud_model_weight_bytes(m) + 64 * 256);
			gpud_model_free(m);
		}
	}
}

/* n bytes as the weight pool carves them. */
static uint64_t align_up(uint64_t n)
{
	return (n + GPUD_CUDA_ALIGN - 1) / GPUD_CUDA_ALIGN * GPUD_CUDA_ALIGN;
}

/* What the backend cannot run is refused with its reason, the same one
 * for gpud serve --check (gpud_cuda_plan_check) and init: a weight type
 * it cannot hold; a model it runs passes (qwen2, K-quants held as Q8_0),
 * and the plan is zero exactly when the check fails. */
static void test_plan_check(void **state)
{
	struct gpud_mkmodel_params p;
	struct gpud_model *m = NULL;
	struct gpud_backend_config cfg;
	struct gpud_cuda_plan pl;
	char path[128], err[SW_ERR_MAX];

	(void)state;
	m = tiny(GPUD_TYPE_Q8_0, false);
	cfg = cfg_for(m);
	assert_int_equal(gpud_cuda_plan_check(&cfg, err, sizeof(err)), 0);
	gpud_model_free(m);

	/* Qwen2 (Q/K/V biases, NEOX RoPE) runs too: its plan holds a llama
	 * twin's weights (the same shapes) and its biases */
	{
		const struct gpud_model_hparams *hp;
		uint64_t llama, bias;

		gpud_mkmodel_params_default(&p);
		snprintf(path, sizeof(path), "%s/llama-twin.gguf", tmpdir);
		p.out = path;
		assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
		assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
		cfg = cfg_for(m);
		gpud_cuda_plan_for(&cfg, &pl);
		llama = pl.weights;
		gpud_model_free(m);

		snprintf(path, sizeof(path), "%s/qwen2.gguf", tmpdir);
		p.arch = GPUD_ARCH_QWEN2;
		assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
		assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
		cfg = cfg_for(m);
		assert_int_equal(gpud_cuda_plan_check(&cfg, err, sizeof(err)), 0);
		gpud_cuda_plan_for(&cfg, &pl);
		hp = gpud_model_hparams(m);
		bias = (uint64_t)hp->n_layers *
		       (align_up((uint64_t)hp->n_heads * hp->head_dim * 4) +
			2 * align_up((uint64_t)hp->n_kv_heads * hp->head_dim * 4));
		assert_true(llama > 0);
		assert_int_equal(pl.weights, llama + bias);
		gpud_model_free(m);
	}

	/* K-quants and the 32-weight types without kernels here are held as
	 * Q8_0 (requantized at upload): the plan of a Q4_K_M file is its Q8_0
	 * twin's, and says how much of it is requantized */
	{
		uint64_t q8, norms;
		struct gpud_model *q8m;
		const struct gpud_model_hparams *hp;

		gpud_mkmodel_params_default(&p);
		snprintf(path, sizeof(path), "%s/q8twin.gguf", tmpdir);
		p.out = path;
		p.dim = 256;
		p.ffn_dim = 512;
		p.type = GPUD_TYPE_Q8_0;
		assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
		assert_int_equal(gpud_model_load(&q8m, path, err, sizeof(err)), 0);
		cfg = cfg_for(q8m);
		gpud_cuda_plan_for(&cfg, &pl);
		q8 = pl.weights;
		assert_true(q8 > 0);
		assert_int_equal(pl.weights_q8, 0);
		hp = gpud_model_hparams(q8m);
		norms = (2ull * hp->n_layers + 1) * align_up((uint64_t)hp->dim * 4) +
			align_up((uint64_t)hp->head_dim / 2 * 4);

		snprintf(path, sizeof(path), "%s/q4k.gguf", tmpdir);
		assert_int_equal(gpud_mkmodel_parse_type("q4_k_m", &p.type, &p.mix), 0);
		assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
		assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
		assert_int_equal(gpud_model_weights(m)->layers[0].wq.type, GPUD_TYPE_Q4_K);
		cfg = cfg_for(m);
		assert_int_equal(gpud_cuda_plan_check(&cfg, err, sizeof(err)), 0);
		gpud_cuda_plan_for(&cfg, &pl);
		assert_int_equal(pl.weights, q8);
		/* every matrix but those the mix writes in Q8_0 */
		assert_true(pl.weights_q8 > 0 && pl.weights_q8 <= q8 - norms);
		gpud_model_free(m);

		/* llama.cpp's 32-weight fallbacks: every matrix requantized */
		for (int t = 0; t < 4; t++) {
			static const enum gpud_type ts[] = { GPUD_TYPE_Q5_0, GPUD_TYPE_Q4_1,
							     GPUD_TYPE_IQ4_NL, GPUD_TYPE_Q6_K };

			p.type = ts[t];
			p.mix = GPUD_MKMODEL_PURE;
			assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
			assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
			cfg = cfg_for(m);
			assert_int_equal(gpud_cuda_plan_check(&cfg, err, sizeof(err)), 0);
			gpud_cuda_plan_for(&cfg, &pl);
			assert_int_equal(pl.weights, q8);
			assert_int_equal(pl.weights_q8, q8 - norms);
			gpud_model_free(m);
		}
		assert_int_equal(gpud_cuda_dev_type(GPUD_TYPE_Q4_0), GPUD_TYPE_Q4_0);
		assert_int_equal(gpud_cuda_dev_type(GPUD_TYPE_IQ4_XS), GPUD_TYPE_Q8_0);
		assert_int_equal(gpud_cuda_dev_type(GPUD_TYPE_Q2_K), GPUD_TYPE_Q8_0);
		/* Q8_K is the K-quants' activation type, never a weight here:
		 * a tensor claiming it is refused by name */
		assert_int_equal(gpud_cuda_dev_type(GPUD_TYPE_Q8_K), GPUD_TYPE_COUNT);
		((struct gpud_weight *)&gpud_model_weights(q8m)->layers[0].w_up)->type =
			GPUD_TYPE_Q8_K;
		cfg = cfg_for(q8m);
		assert_int_equal(gpud_cuda_plan_check(&cfg, err, sizeof(err)), SW_EUNSUPPORTED);
		assert_non_null(strstr(err, "type q8_k, which the CUDA backend cannot hold"));
		gpud_cuda_plan_for(&cfg, &pl);
		assert_int_equal(pl.weights, 0);
		gpud_model_free(q8m);
	}
}

static void test_plan_pools(void **state)
{
	struct gpud_model *m = tiny(GPUD_TYPE_Q8_0, false);
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	struct gpud_backend_config cfg = cfg_for(m);
	struct gpud_cuda_plan p, p2;
	struct gpud_cuda_layout l;
	char err[SW_ERR_MAX];
	uint64_t kv_block;

	(void)state;
	gpud_cuda_plan_for(&cfg, &p);
	kv_block = (uint64_t)hp->n_layers * 2 * hp->n_kv_heads * 16 * hp->head_dim * 4;
	assert_int_equal(p.kv, up256(32 * kv_block));
	assert_true(p.staging >= GPUD_CUDA_STAGING_MIN);
	assert_true(p.masks > 0 && p.scratch > 0);
	/* the ops table's figure is the plan's */
	assert_int_equal(gpud_cuda_backend.scratch_bytes(&cfg), p.scratch);

	/* KV grows with the blocks, scratch with the batch, masks with seqs */
	cfg.n_blocks = 64;
	gpud_cuda_plan_for(&cfg, &p2);
	assert_int_equal(p2.kv, up256(64 * kv_block));
	cfg = cfg_for(m);
	cfg.max_batch_tokens = 128;
	gpud_cuda_plan_for(&cfg, &p2);
	assert_true(p2.scratch > p.scratch);
	cfg = cfg_for(m);
	cfg.max_seqs = 8;
	gpud_cuda_plan_for(&cfg, &p2);
	assert_true(p2.masks > p.masks);

	/* layout: regions aligned, in order, inside the totals */
	cfg = cfg_for(m);
	assert_int_equal(gpud_cuda_layout_for(&cfg, &l, err, sizeof(err)), 0);
	{
		const uint64_t offs[] = { l.x, l.xb, l.q, l.k, l.v, l.att, l.attp, l.attc,
					  l.hb, l.hb2, l.xl, l.logits, l.actq, l.actd, l.actq2, l.actd2, l.mmp, l.mmc, l.acth,
					  l.actl, l.ascale, l.meta };
		for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
			assert_int_equal(offs[i] % 256, 0);
			if (i)
				assert_true(offs[i] > offs[i - 1]);
		}
		assert_true(l.meta + l.meta_words * 4 <= l.scratch_bytes);
		assert_int_equal(l.xb - l.x, up256(64ull * hp->dim * 4));
		assert_int_equal(l.logits - l.xl, up256(8ull * hp->dim * 4));
		/* the split activations' halves: a step's tokens each, apart */
		assert_true(l.actl - l.acth >= 64ull * l.max_cols * 2);
		assert_true(l.ascale - l.actl >= 64ull * l.max_cols * 2);
	}
	assert_true(l.st_mask + l.mask_slot_bytes <= l.staging_bytes);
	assert_true(l.st_logits < l.st_hidden && l.st_hidden < l.st_meta && l.st_meta < l.st_mask);
	assert_int_equal(l.mask_slots, 8);
	assert_int_equal(l.max_pos, hp->n_ctx < 32 * 16 ? hp->n_ctx : 32 * 16);
	assert_int_equal(l.max_btab, 4 * ((l.max_pos + 15) / 16));
	assert_int_equal(l.max_prompt, l.max_pos);
	assert_int_equal(l.max_prompt_blocks, (l.max_prompt + 15) / 16);
	/* a context shorter than the KV bounds the block tables */
	cfg.n_blocks = 4096;
	assert_int_equal(gpud_cuda_layout_for(&cfg, &l, err, sizeof(err)), 0);
	assert_int_equal(l.max_pos, hp->n_ctx);
	assert_int_equal(l.max_btab, 4 * ((hp->n_ctx + 15) / 16));
	cfg.n_blocks = 32;
	assert_int_equal(l.masks_bytes, l.mask_slots * l.mask_slot_bytes);
	assert_int_equal(l.m_tiles, 3 * 64 + 8 + 4 * GPUD_CUDA_SEQ_WORDS);
	assert_int_equal(l.m_ndraw, l.m_tiles + l.max_tiles);
	assert_int_equal(l.m_btab, l.m_ndraw + 1);
	assert_int_equal(l.m_draw, l.m_btab + l.max_btab);
	assert_int_equal(l.meta_words, l.m_draw + l.NL * GPUD_CUDA_DRAW_WORDS);
	assert_int_equal(l.max_tiles, 64 / l.att_tile + 4);

	/* a config it cannot run: zeros, and init's message from layout_for */
	cfg.n_blocks = 0;
	gpud_cuda_plan_for(&cfg, &p2);
	assert_int_equal(p2.weights + p2.kv + p2.scratch + p2.staging, 0);
	assert_int_equal(gpud_cuda_layout_for(&cfg, &l, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "zero size"));
	gpud_model_free(m);

	/* qwen3: the llama file of the same tensors plus each layer's two
	 * per-head norms (head_dim floats each) */
	struct gpud_mkmodel_params mp;
	struct gpud_model *m3;
	char path[128];
	for (int a = 0; a < 2; a++) {
		gpud_mkmodel_params_default(&mp);
		snprintf(path, sizeof(path), "%s/arch%d.gguf", tmpdir, a);
		mp.out = path;
		mp.arch = a ? GPUD_ARCH_QWEN3 : GPUD_ARCH_LLAMA;
		mp.head_dim = 32;
		assert_int_equal(gpud_mkmodel(&mp, err, sizeof(err)), 0);
		assert_int_equal(gpud_model_load(a ? &m3 : &m, path, err, sizeof(err)), 0);
	}
	cfg = cfg_for(m);
	gpud_cuda_plan_for(&cfg, &p);
	cfg = cfg_for(m3);
	gpud_cuda_plan_for(&cfg, &p2);
	hp = gpud_model_hparams(m3);
	assert_int_equal(p2.weights, p.weights + hp->n_layers * 2 * up256(32 * 4));
	assert_int_equal(gpud_cuda_layout_for(&cfg, &l, err, sizeof(err)), 0);
	gpud_model_free(m);
	gpud_model_free(m3);
}

/* Decode graphs: every batch size up to the smallest of 64 and the step's
 * tokens, sequences and logits rows. */
static void test_graph_sizes(void **state)
{
	struct gpud_cuda_layout l = { 0 };

	(void)state;
	l.T = 2048;
	l.S = 256;
	l.NL = 256;
	assert_int_equal(gpud_cuda_graph_max_t(&l), GPUD_CUDA_GRAPH_MAX_T);
	l.S = 16;
	assert_int_equal(gpud_cuda_graph_max_t(&l), 16);
	l.NL = 8;
	assert_int_equal(gpud_cuda_graph_max_t(&l), 8);
	l.T = 1;
	assert_int_equal(gpud_cuda_graph_max_t(&l), 1);
}

/* Split-K attention: about two CTAs per multiprocessor for small decode
 * batches, none for prefill-sized steps, within the partials' room. */
static void test_att_splits(void **state)
{
	struct gpud_cuda_layout l = { 0 };

	(void)state;
	l.head_dim = 128;
	l.kv_dim = 8 * 128; /* Llama-3.2-3B: 8 KV heads */
	assert_int_equal(gpud_cuda_att_splits(&l, 1, 132, 0), GPUD_CUDA_ATT_MAX_SPLITS);
	assert_int_equal(gpud_cuda_att_splits(&l, 4, 132, 0), 9);   /* 264 / 32 CTAs */
	assert_int_equal(gpud_cuda_att_splits(&l, 16, 128, 0), 2);  /* 256 / 128 */
	assert_int_equal(gpud_cuda_att_splits(&l, 16, 132, 0), 3);  /* rounded up */
	assert_int_equal(gpud_cuda_att_splits(&l, 64, 132, 0), 1);
	assert_int_equal(gpud_cuda_att_splits(&l, 65, 132, 0), 1);  /* past the graphs: prefill */
	assert_int_equal(gpud_cuda_att_splits(&l, 0, 132, 0), 1);
	assert_int_equal(gpud_cuda_att_splits(&l, 1, 0, 0), 1);     /* 2 CTAs wanted: 8 per split */
	/* one wave of what the device holds: an RTX 4090 (128 SMs, 2 CTAs
	 * each) at batch 3 (24 CTAs a split) takes 10 splits, not 11 (264
	 * CTAs: 8 past the wave would double the launch); where 2 a
	 * multiprocessor is a wave already, as at batch 16, nothing changes;
	 * an H100 holding 6 is not bounded */
	assert_int_equal(gpud_cuda_att_splits(&l, 3, 128, 0), 11);
	assert_int_equal(gpud_cuda_att_splits(&l, 3, 128, 2), 10);
	assert_int_equal(gpud_cuda_att_splits(&l, 16, 128, 2), 2);
	assert_int_equal(gpud_cuda_att_splits(&l, 16, 132, 6), 3);
	assert_int_equal(gpud_cuda_att_splits(&l, 4, 132, 6), 9);
	assert_int_equal(gpud_cuda_att_splits(&l, 64, 128, 1), 1); /* 512 CTAs: at least 1 */
	l.kv_dim = 128; /* one KV head: bounded by the partials too */
	assert_int_equal(gpud_cuda_att_splits(&l, 1, 1024, 0), GPUD_CUDA_ATT_MAX_SPLITS);
	assert_int_equal(gpud_cuda_att_splits(&l, 40, 1024, 0), GPUD_CUDA_ATT_PARTS / 40);
	for (uint32_t T = 1; T <= GPUD_CUDA_GRAPH_MAX_T; T++) {
		uint32_t n = gpud_cuda_att_splits(&l, T, 1u << 20, 0);

		assert_true(n >= 1 && n <= GPUD_CUDA_ATT_MAX_SPLITS);
		assert_true((uint64_t)n * T <= GPUD_CUDA_ATT_PARTS);
	}
}

/* One case of gpud_cuda_mm_splits: the kernel, the matrix, the step's
 * tokens, the scratch (partial floats, counter words), the device (SMs,
 * CTAs a multiprocessor holds, 0: unknown) and the splits wanted. */
struct mm_case {
	enum gpud_cuda_mm_kernel k;
	uint64_t rows, cols;
	uint32_t T;
	uint64_t part;
	uint32_t cnt, n_sm, per_sm, want;
};

static void test_mm_splits(void **state)
{
	const uint64_t part = 8ull * 64 * 8192; /* the 3B plan's: 8 x 64 tokens x 8192 rows */
	const uint64_t part3 = 3ull * 64 * 1024;
	const enum gpud_cuda_mm_kernel P = GPUD_CUDA_MM_PIPE, S = GPUD_CUDA_MM_SINGLE,
				       H = GPUD_CUDA_MM_HALF;
	const struct mm_case c[] = {
		/* Llama-3.2-3B on 132 SMs, the pipelined kernel (64-row tiles,
		 * about 3 CTAs per SM): q/o (3072 rows, 48 tiles) 8 splits, k/v
		 * (1024 rows) 8, gate/up (8192 rows, 128 tiles) 4, down (3072 x
		 * 8192) 8 */
		{ P, 3072, 3072, 16, part, 257, 132, 0, 8 },
		{ P, 1024, 3072, 64, part, 257, 132, 0, 8 },
		{ P, 8192, 3072, 64, part, 257, 132, 0, 4 },
		{ P, 3072, 8192, 40, part, 257, 132, 0, 8 },
		/* the single-buffered one (32-row tiles, about 2 CTAs per SM):
		 * q/o 3, k/v 8, gate/up 2, down 3 */
		{ S, 3072, 3072, 16, part, 257, 132, 0, 3 },
		{ S, 1024, 3072, 64, part, 257, 132, 0, 8 },
		{ S, 8192, 3072, 64, part, 257, 132, 0, 2 },
		{ S, 3072, 8192, 40, part, 257, 132, 0, 3 },
		/* the GEMV's batches, prefill, and a matrix of many tiles: none */
		{ P, 3072, 3072, 8, part, 257, 132, 0, 1 },
		{ P, 3072, 3072, 65, part, 257, 132, 0, 1 },
		{ P, 128256, 3072, 64, part, 257, 132, 0, 1 },
		{ S, 3072, 3072, 8, part, 257, 132, 0, 1 },
		{ S, 3072, 3072, 65, part, 257, 132, 0, 1 },
		{ S, 128256, 3072, 64, part, 257, 132, 0, 1 },
		/* a stage of blocks per split at least: 64 columns are 1 stage of
		 * either kernel, 320 columns 5 of the pipelined's and 3 of the
		 * other's */
		{ P, 64, 64, 16, part, 257, 132, 0, 1 },
		{ S, 64, 64, 16, part, 257, 132, 0, 1 },
		{ P, 64, 320, 16, part, 257, 132, 0, 5 },
		{ S, 64, 320, 16, part, 257, 132, 0, 3 },
		/* the F16/BF16 kernel: the pipelined one's tiles and CTAs, stages
		 * of 32 columns (320 columns are 10; 40 columns round up to 2) */
		{ H, 3072, 3072, 16, part, 257, 132, 0, 8 },
		{ H, 8192, 3072, 64, part, 257, 132, 0, 4 },
		{ H, 64, 320, 16, part, 257, 132, 0, 8 },
		{ H, 64, 40, 16, part, 257, 132, 0, 2 },
		{ H, 64, 8, 16, part, 257, 132, 0, 1 },
		{ H, 3072, 3072, 8, part, 257, 132, 0, 1 },
		{ H, 3072, 3072, 65, part, 257, 132, 0, 1 },
		/* one wave of what the device holds: an RTX 4090 (128 SMs, 2
		 * pipelined CTAs each: 256) cuts q/o to 5 splits (240 CTAs where
		 * 8 made 384), a Q/K/V set (5120 rows, 80 tiles) to 3, gate/up to
		 * 2, k/v stays 8 (128 CTAs); an H100 holding 4 a multiprocessor
		 * (528) keeps every figure above, holding 3 (396) gate/up's 4
		 * (512 CTAs) becomes 3; fewer CTAs a wave than tiles (200 of 64
		 * rows, 128 CTAs): no split */
		{ P, 3072, 3072, 16, part, 257, 128, 2, 5 },
		{ P, 5120, 3072, 64, part, 257, 128, 2, 3 },
		{ P, 8192, 3072, 64, part, 257, 128, 2, 2 },
		{ P, 1024, 3072, 64, part, 257, 128, 2, 8 },
		{ P, 3072, 3072, 16, part, 257, 132, 4, 8 },
		{ P, 5120, 3072, 64, part, 257, 132, 4, 5 },
		{ P, 8192, 3072, 64, part, 257, 132, 4, 4 },
		{ P, 8192, 3072, 64, part, 257, 132, 3, 3 },
		{ H, 8192, 3072, 64, part, 257, 128, 2, 2 },
		{ P, 12800, 3072, 16, part, 257, 128, 0, 2 },
		{ P, 12800, 3072, 16, part, 257, 128, 1, 1 },
		/* the scratch bounds them: partials, then counters */
		{ P, 1024, 3072, 64, part3, 257, 132, 0, 3 },
		{ S, 1024, 3072, 64, part3, 257, 132, 0, 3 },
		{ P, 1024, 3072, 64, part, 15, 132, 0, 1 },
		{ P, 1024, 3072, 64, part, 16, 132, 0, 8 },
		{ S, 1024, 3072, 64, part, 31, 132, 0, 1 },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		uint32_t n = gpud_cuda_mm_splits(c[i].k, c[i].rows, c[i].cols, c[i].T, c[i].part,
						 c[i].cnt, c[i].n_sm, c[i].per_sm);

		if (n != c[i].want)
			fail_msg("case %zu (kernel %d, %" PRIu64 " x %" PRIu64 ", T %u, %u SMs x %u): "
				 "%u splits, want %u",
				 i, (int)c[i].k, c[i].rows, c[i].cols, c[i].T, c[i].n_sm, c[i].per_sm, n,
				 c[i].want);
	}
	for (int k = 0; k < 2; k++)
		for (uint32_t T = 1; T <= 80; T++) {
			uint32_t n = gpud_cuda_mm_splits(k ? S : P, 3072, 3072, T, part, 257, 1u << 20, 0);

			assert_true(n >= 1 && n <= GPUD_CUDA_MM_MAX_SPLITS);
			assert_true((uint64_t)n * T * 3072 <= part || n == 1);
		}
}

static void test_errcode(void **state)
{
	(void)state;
	assert_int_equal(gpud_cuda_errcode(cudaSuccess), 0);
	assert_int_equal(gpud_cuda_errcode(cudaErrorMemoryAllocation), -ENOMEM);
	assert_int_equal(gpud_cuda_errcode(cudaErrorNoDevice), -ENODEV);
	assert_int_equal(gpud_cuda_errcode(cudaErrorInvalidDevice), -ENODEV);
	assert_int_equal(gpud_cuda_errcode(cudaErrorInsufficientDriver), -ENODEV);
	/* sticky: the device is lost to the process (gpud fails it, exits) */
	assert_int_equal(gpud_cuda_errcode(cudaErrorIllegalAddress), SW_EDEVICE);
	assert_int_equal(gpud_cuda_errcode(cudaErrorLaunchFailure), SW_EDEVICE);
	assert_int_equal(gpud_cuda_errcode(cudaErrorMisalignedAddress), SW_EDEVICE);
	assert_int_equal(gpud_cuda_errcode(cudaErrorECCUncorrectable), SW_EDEVICE);
	assert_int_equal(gpud_cuda_errcode(cudaErrorUnknown), SW_EDEVICE);
	/* not sticky: a refused call, the context goes on */
	assert_int_equal(gpud_cuda_errcode(cudaErrorInvalidValue), -EIO);
	assert_int_equal(gpud_cuda_errcode(cudaErrorLaunchOutOfResources), -EIO);
}

/* A compiled mask: s0 (3 tokens), s1 (5 tokens); s1 sees s0 and itself,
 * G sees s1 and itself only. Blocks of 4. */
struct cmask {
	_Alignas(16) uint8_t mem[4096];
	struct gpud_mask m;
};

static void compile_mask(struct cmask *cm, bool g_sees_s0)
{
	static struct desc_buf b;
	const uint32_t seg_tokens[2] = { 3, 5 };

	desc_init(&b, 2);
	desc_add(&b, 0, 0);
	desc_add(&b, 1, 0);
	desc_add(&b, 1, 1);
	if (g_sees_s0)
		desc_add(&b, 2, 0);
	desc_add(&b, 2, 1);
	desc_add(&b, 2, 2);
	assert_true(gpud_mask_bytes(2, 8, 4) <= sizeof(cm->mem));
	assert_int_equal(gpud_mask_compile(&b.d, seg_tokens, 4, cm->mem, sizeof(cm->mem), &cm->m), 0);
}

static void test_slots(void **state)
{
	struct gpud_cuda_slot slots[3];
	struct cmask a, b, c, d;
	bool miss;

	(void)state;
	memset(slots, 0, sizeof(slots));
	compile_mask(&a, false);
	compile_mask(&b, false);
	compile_mask(&c, false);
	compile_mask(&d, true);

	/* step 1: a and b miss, a again hits */
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &a.m, 1, &miss), 0);
	assert_true(miss);
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &b.m, 1, &miss), 1);
	assert_true(miss);
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &a.m, 1, &miss), 0);
	assert_false(miss);
	/* step 2: c takes the empty slot; a hits */
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &c.m, 2, &miss), 2);
	assert_true(miss);
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &a.m, 2, &miss), 0);
	assert_false(miss);
	/* step 3: d evicts the least recently used (b, last used in step 1) */
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &d.m, 3, &miss), 1);
	assert_true(miss);
	/* b back: a and c were both last used in step 2, the lower slot goes */
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &b.m, 3, &miss), 0);
	assert_true(miss);
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &c.m, 3, &miss), 2);
	assert_false(miss);
	/* every slot used by step 3: none to take */
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &a.m, 3, &miss), -1);
	assert_true(miss);
	/* a mask recompiled in place with other content is a different key:
	 * a miss (all slots last used in step 3: the lowest is taken) */
	compile_mask(&d, false);
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &d.m, 4, &miss), 0);
	assert_true(miss);
	assert_int_equal(gpud_cuda_slot_get(slots, 3, &d.m, 4, &miss), 0);
	assert_false(miss);
}

static void test_mask_image(void **state)
{
	struct gpud_model *m = tiny(GPUD_TYPE_F32, false);
	struct gpud_backend_config cfg = cfg_for(m);
	struct gpud_cuda_layout l;
	struct cmask cm;
	char err[SW_ERR_MAX];
	uint8_t *img;
	size_t n, segs_at = GPUD_CUDA_VIS_SETS * 16, seg_at;

	(void)state;
	cfg.block_tokens = 4;
	assert_int_equal(gpud_cuda_layout_for(&cfg, &l, err, sizeof(err)), 0);
	img = calloc(1, l.mask_slot_bytes);
	assert_non_null(img);
	compile_mask(&cm, false);
	seg_at = segs_at + l.max_prompt_blocks * 16;
	n = gpud_cuda_mask_image(&l, 4, &cm.m, img);
	assert_int_equal(n, seg_at + 8);
	assert_true(n <= l.mask_slot_bytes);
	assert_memory_equal(img, cm.m.vis, 3 * 16);
	assert_memory_equal(img + segs_at, cm.m.block_segs, 2 * 16);
	assert_memory_equal(img + seg_at, cm.m.seg, 8);
	assert_int_equal(img[seg_at + 2], 0);
	assert_int_equal(img[seg_at + 3], 1);
	/* compiled for another block size: refused */
	assert_int_equal(gpud_cuda_mask_image(&l, 8, &cm.m, img), 0);
	free(img);
	gpud_model_free(m);
}

/* The arg max keys (gpud_cuda_argmax_key) reduced as the device does (a
 * key per range of GPUD_CUDA_ARGMAX_PARTS, the ranges in any order) and
 * picked on the host give gpud_argmax's pick: rows with ties, signed
 * zeros, NaN, infinities and fewer logits than ranges. */
static void test_argmax(void **state)
{
	static const uint32_t sizes[] = { 1, 5, 64, 65, 1000, 4099 };
	static float row[4 * 4099];
	static uint64_t keys[4 * GPUD_CUDA_ARGMAX_PARTS];
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	int32_t ids[4];

	(void)state;
	for (int round = 0; round < 200; round++) {
		uint32_t nv = sizes[round % 6], per = (nv + GPUD_CUDA_ARGMAX_PARTS - 1) /
						    GPUD_CUDA_ARGMAX_PARTS;

		for (uint32_t i = 0; i < 4 * nv; i++) {
			uint32_t r;
			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
			r = (uint32_t)(rng >> 40);
			switch (r % 16) { /* few distinct values: ties everywhere */
			case 0: row[i] = NAN; break;
			case 1: row[i] = INFINITY * (round % 5 ? -1.0f : 1.0f); break;
			case 2: row[i] = -0.0f; break;
			case 3: row[i] = 0.0f; break;
			case 4: row[i] = -INFINITY; break;
			default: row[i] = (float)((int)(r >> 4) % 7 - (round % 3 ? 6 : 3)); break;
			}
			if (round % 7 == 0) /* rows with nothing above -inf */
				row[i] = r % 2 ? NAN : -INFINITY;
		}
		for (uint32_t r = 0; r < 4; r++)
			for (uint32_t p = 0; p < GPUD_CUDA_ARGMAX_PARTS; p++) {
				/* the range backwards: the order must not matter */
				uint64_t best = 0;
				for (uint32_t i = (p + 1) * per; i-- > p * per;) {
					uint64_t k = i < nv ? gpud_cuda_argmax_key(row[r * nv + i], i) : 0;
					best = k > best ? k : best;
				}
				keys[r * GPUD_CUDA_ARGMAX_PARTS + p] = best;
			}
		gpud_cuda_argmax_pick(keys, 4, ids);
		for (uint32_t r = 0; r < 4; r++) {
			int32_t want = gpud_argmax(row + r * nv, (int32_t)nv);
			assert_int_equal(ids[r], want < 0 ? -1 : want);
		}
	}
}

static void test_meta(void **state)
{
	struct gpud_model *m = tiny(GPUD_TYPE_F32, false);
	struct gpud_backend_config cfg = cfg_for(m);
	struct gpud_cuda_layout l;
	struct gpud_cuda_slot slots[8];
	struct cmask cm;
	char err[SW_ERR_MAX];
	uint32_t *meta, up[4], n_up, n_tiles;
	uint64_t n_words;
	const uint32_t bt0[] = { 7 }, bt1[] = { 3, 9, 5 };
	const int32_t tokens[] = { 11, 12, 13, 14, 15 };
	const struct gpud_draw dr = { .temperature = 0.7f, .top_k = 40, .top_p = 0.9f,
				      .min_p = 0.05f, .rand = 0x0123456789abcdefull,
				      .repeat_penalty = 1.1f, .frequency_penalty = 0.5f,
				      .presence_penalty = 0.25f, .n_pen = 2,
				      .pen_id = { 17, 3 }, .pen_n = { 4, 1 } };
	struct gpud_fwd_seq seqs[2] = {
		/* a 4-token prefill from 0, masked, all logits */
		{ .blocks = bt0, .mask = NULL, .pos0 = 0, .n_tokens = 4, .tok0 = 0,
		  .logit0 = 0, .n_logits = 4 },
		/* one decode token at position 9 (its third block), last logit */
		{ .blocks = bt1, .mask = NULL, .pos0 = 9, .n_tokens = 1, .tok0 = 4,
		  .logit0 = 4, .n_logits = 1, .argmax = true, .draw = &dr },
	};
	struct gpud_fwd_batch b = { .tokens = tokens, .n_tokens = 5, .seqs = seqs, .n_seqs = 2,
				    .n_logits = 5 };

	(void)state;
	cfg.block_tokens = 4;
	memset(slots, 0, sizeof(slots));
	assert_int_equal(gpud_cuda_layout_for(&cfg, &l, err, sizeof(err)), 0);
	meta = calloc(l.meta_words, 4);
	assert_non_null(meta);
	compile_mask(&cm, false);
	seqs[1].mask = &cm.m;

	assert_int_equal(gpud_cuda_meta_fill(&l, 4, &b, slots, 1, meta, &n_words, up, &n_up, &n_tiles, err,
					     sizeof(err)), 0);
	for (uint32_t t = 0; t < 5; t++) {
		assert_int_equal(meta[l.m_tokens + t], (uint32_t)tokens[t]);
		assert_int_equal(meta[l.m_seq + t], t < 4 ? 0 : 1);
		assert_int_equal(meta[l.m_pos + t], t < 4 ? t : 9);
		assert_int_equal(meta[l.m_logit + t], t);
	}
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SI_BTAB], 0);
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SI_SLOT], GPUD_CUDA_NO_MASK);
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_BTAB], 1);
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_SLOT], 0);
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_NPROMPT], 8);
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_NSEG], 2);
	assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_NPB], 2);
	/* the second sequence's row draws, with its words; the others do not;
	 * the draw words are copied separately, n_logits rows of them */
	assert_int_equal(meta[l.m_ndraw], 1);
	assert_int_equal(gpud_cuda_draw_words(&b), 5 * GPUD_CUDA_DRAW_WORDS);
	for (uint32_t r = 0; r < 4; r++)
		assert_int_equal(meta[l.m_draw + r * GPUD_CUDA_DRAW_WORDS + GPUD_CUDA_DW_ON], 0);
	{
		const uint32_t *dw = meta + l.m_draw + 4 * GPUD_CUDA_DRAW_WORDS;
		float f;

		assert_int_equal(dw[GPUD_CUDA_DW_ON], 1);
		memcpy(&f, &dw[GPUD_CUDA_DW_TEMP], 4);
		assert_true(f == 0.7f);
		assert_int_equal(dw[GPUD_CUDA_DW_TOPK], 40);
		memcpy(&f, &dw[GPUD_CUDA_DW_TOPP], 4);
		assert_true(f == 0.9f);
		memcpy(&f, &dw[GPUD_CUDA_DW_MINP], 4);
		assert_true(f == 0.05f);
		assert_int_equal(dw[GPUD_CUDA_DW_RAND_LO], 0x89abcdefu);
		assert_int_equal(dw[GPUD_CUDA_DW_RAND_HI], 0x01234567u);
		assert_int_equal(dw[GPUD_CUDA_DW_NPEN], 2);
		memcpy(&f, &dw[GPUD_CUDA_DW_REPEAT], 4);
		assert_true(f == 1.1f);
		memcpy(&f, &dw[GPUD_CUDA_DW_FREQ], 4);
		assert_true(f == 0.5f);
		memcpy(&f, &dw[GPUD_CUDA_DW_PRES], 4);
		assert_true(f == 0.25f);
		assert_int_equal(dw[GPUD_CUDA_DW_PEN_ID], 17);
		assert_int_equal(dw[GPUD_CUDA_DW_PEN_ID + 1], 3);
		assert_int_equal(dw[GPUD_CUDA_DW_PEN_N], 4);
		assert_int_equal(dw[GPUD_CUDA_DW_PEN_N + 1], 1);
	}
	assert_int_equal(meta[l.m_btab + 0], 7);
	assert_int_equal(meta[l.m_btab + 1], 3);
	assert_int_equal(meta[l.m_btab + 2], 9);
	assert_int_equal(meta[l.m_btab + 3], 5);
	assert_int_equal(n_up, 1);
	assert_int_equal(up[0], 1);
	assert_int_equal(n_words, l.m_btab + 4);
	/* attention tiles: each sequence's tokens in runs of att_tile */
	assert_true(l.att_tile >= 1 && l.att_tile <= GPUD_CUDA_ATT_MAX_TILE);
	assert_true(l.max_tiles >= l.T / l.att_tile + l.S);
	{
		uint32_t want = 0, covered[5] = { 0 };

		for (uint32_t i = 0; i < 2; i++)
			want += (seqs[i].n_tokens + l.att_tile - 1) / l.att_tile;
		assert_int_equal(n_tiles, want);
		for (uint32_t k = 0; k < n_tiles; k++) {
			uint32_t w = meta[l.m_tiles + k], t0 = w & 0xffff, n = (w >> 16) + 1;

			assert_true(n <= l.att_tile && t0 + n <= 5);
			for (uint32_t t = t0; t < t0 + n; t++) {
				assert_int_equal(meta[l.m_seq + t], meta[l.m_seq + t0]);
				covered[t]++;
			}
		}
		for (uint32_t t = 0; t < 5; t++)
			assert_int_equal(covered[t], 1);
	}

	/* the next step hits: nothing to upload */
	assert_int_equal(gpud_cuda_meta_fill(&l, 4, &b, slots, 2, meta, &n_words, up, &n_up, &n_tiles, err,
					     sizeof(err)), 0);
	assert_int_equal(n_up, 0);

	/* a causal mask takes no slot */
	{
		struct gpud_mask causal = cm.m;
		causal.causal = true;
		seqs[1].mask = &causal;
		assert_int_equal(gpud_cuda_meta_fill(&l, 4, &b, slots, 3, meta, &n_words, up, &n_up, &n_tiles, err,
						     sizeof(err)), 0);
		assert_int_equal(meta[l.m_seqinfo + GPUD_CUDA_SEQ_WORDS + GPUD_CUDA_SI_SLOT],
				 GPUD_CUDA_NO_MASK);
		assert_int_equal(n_up, 0);
	}

	/* a mask compiled for another block size is refused with a message */
	seqs[1].mask = &cm.m;
	assert_int_equal(gpud_cuda_meta_fill(&l, 8, &b, slots, 4, meta, &n_words, up, &n_up, &n_tiles, err,
					     sizeof(err)), SW_ETOOLONG);
	assert_non_null(strstr(err, "mask slot"));

	/* too many tokens, positions past the limit */
	b.n_tokens = l.T + 1;
	assert_int_equal(gpud_cuda_meta_fill(&l, 4, &b, slots, 5, meta, &n_words, up, &n_up, &n_tiles, err,
					     sizeof(err)), -EINVAL);
	b.n_tokens = 5;
	seqs[1].pos0 = (uint32_t)l.max_pos;
	assert_int_equal(gpud_cuda_meta_fill(&l, 4, &b, slots, 6, meta, &n_words, up, &n_up, &n_tiles, err,
					     sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "exceeds"));
	free(meta);
	gpud_model_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensor_bytes),
		cmocka_unit_test(test_pack_rows),
		cmocka_unit_test(test_plan_weights),
		cmocka_unit_test(test_plan_check),
		cmocka_unit_test(test_plan_pools),
		cmocka_unit_test(test_graph_sizes),
		cmocka_unit_test(test_att_splits),
		cmocka_unit_test(test_mm_splits),
		cmocka_unit_test(test_errcode),
		cmocka_unit_test(test_slots),
		cmocka_unit_test(test_mask_image),
		cmocka_unit_test(test_meta),
		cmocka_unit_test(test_argmax),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
