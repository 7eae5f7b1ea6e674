/* model_test.c - loading Llama and Qwen2 GGUF files: hyper-parameters of
 * the real stories260K model and of generated qwen2 files, tied
 * embeddings, RoPE frequencies (plain, Llama 3 metadata, rope_freqs
 * tensor) and style, Q/K/V biases, and clear errors for broken files made
 * by rewriting stories260K or a generated file with the GGUF writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/backend/cpu/kernels.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"

static char tmpdir[64];

/* What to change when rewriting stories260K. */
struct mod {
	const char *src;          /* the file to rewrite; NULL = stories260K */
	const char *drop_tensor;  /* omit it */
	const char *short_tensor; /* 1-D F32: keep only its first half */
	const char *swap_tensor;  /* 2-D: write with ne[0] and ne[1] swapped */
	const char *f16_tensor;   /* F32 tensor written as F16 */
	const char *arch;         /* general.architecture value */
	const char *drop_key;     /* omit this metadata key */
	const char *rope_scaling; /* llama.rope.scaling.type value */
	float rope_factor;        /* llama.rope.scaling.factor, when not 0 */
	bool rope_freqs;          /* add rope_freqs.weight = 1, 2, 3, 4 */
	uint32_t key_length;      /* llama.attention.key_length, when not 0 */
	uint32_t value_length;    /* llama.attention.value_length, when not 0 */
	uint32_t expert_count;    /* llama.expert_count, when not 0 */
};

static bool skip_key(const char *key, void *arg)
{
	const struct mod *m = arg;

	if (m->arch && !strcmp(key, "general.architecture"))
		return true;
	return m->drop_key && !strcmp(key, m->drop_key);
}

/* Writes tmpdir/name from stories260K with m applied; returns the path. */
static char *derive(const char *name, const struct mod *m)
{
	static char path[256];
	struct gpud_gguf *src = NULL;
	struct gpud_gguf_writer *w = NULL;
	char err[SW_ERR_MAX] = "";

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	assert_int_equal(gpud_gguf_open(&src, m->src ? m->src : STORIES, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	if (m->arch)
		assert_int_equal(gpud_gguf_w_str(w, "general.architecture", m->arch), 0);
	assert_int_equal(gpud_gguf_w_copy_kv(w, src, skip_key, (void *)m), 0);
	if (m->rope_scaling)
		assert_int_equal(gpud_gguf_w_str(w, "llama.rope.scaling.type", m->rope_scaling), 0);
	if (m->rope_factor)
		assert_int_equal(gpud_gguf_w_f32(w, "llama.rope.scaling.factor", m->rope_factor), 0);
	if (m->key_length)
		assert_int_equal(gpud_gguf_w_u32(w, "llama.attention.key_length", m->key_length), 0);
	if (m->value_length)
		assert_int_equal(gpud_gguf_w_u32(w, "llama.attention.value_length", m->value_length),
				 0);
	if (m->expert_count)
		assert_int_equal(gpud_gguf_w_u32(w, "llama.expert_count", m->expert_count), 0);
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(src); i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(src, i);
		uint64_t ne[4] = { t->ne[0], t->ne[1], t->ne[2], t->ne[3] };

		if (m->drop_tensor && !strcmp(t->name, m->drop_tensor))
			continue;
		if (m->short_tensor && !strcmp(t->name, m->short_tensor)) {
			ne[0] /= 2;
			assert_int_equal(gpud_gguf_w_tensor(w, t->name, t->type, t->n_dims, ne,
							    t->data, t->nbytes / 2), 0);
			continue;
		}
		if (m->swap_tensor && !strcmp(t->name, m->swap_tensor)) {
			ne[0] = t->ne[1];
			ne[1] = t->ne[0];
		}
		if (m->f16_tensor && !strcmp(t->name, m->f16_tensor)) {
			size_t n = t->nbytes / 4;
			uint16_t *h = malloc(n * 2);
			for (size_t j = 0; j < n; j++)
				h[j] = gpud_fp32_to_fp16(((const float *)t->data)[j]);
			assert_int_equal(gpud_gguf_w_tensor(w, t->name, GPUD_TYPE_F16, t->n_dims, ne,
							    h, n * 2), 0);
			free(h);
			continue;
		}
		assert_int_equal(gpud_gguf_w_tensor(w, t->name, t->type, t->n_dims, ne, t->data,
						    t->nbytes), 0);
	}
	if (m->rope_freqs) {
		float f[4] = { 1, 2, 3, 4 };
		uint64_t ne[4] = { 4, 1, 1, 1 };
		assert_int_equal(gpud_gguf_w_tensor(w, "rope_freqs.weight", GPUD_TYPE_F32, 1, ne, f,
						    sizeof(f)), 0);
	}
	if (gpud_gguf_w_write(w, path, err, sizeof(err)))
		fail_msg("write %s: %s", path, err);
	gpud_gguf_writer_free(w);
	gpud_gguf_close(src);
	return path;
}

static int setup(void **state)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/model_test.XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_stories_hparams(void **state)
{
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "";
	const struct gpud_model_hparams *hp;
	const struct gpud_model_weights *w;

	if (gpud_model_load(&m, STORIES, err, sizeof(err)))
		fail_msg("%s", err);
	hp = gpud_model_hparams(m);
	assert_int_equal(hp->dim, 64);
	assert_int_equal(hp->n_layers, 5);
	assert_int_equal(hp->n_heads, 8);
	assert_int_equal(hp->n_kv_heads, 4);
	assert_int_equal(hp->head_dim, 8);
	assert_int_equal(hp->ffn_dim, 172);
	assert_int_equal(hp->n_vocab, 512);
	assert_true(hp->n_ctx > 0);
	assert_true(hp->norm_eps > 0 && hp->norm_eps < 1e-3);
	assert_false(hp->rope_scaled);
	w = gpud_model_weights(m);
	assert_non_null(w->tok_embd.data);
	assert_int_equal(w->tok_embd.rows, 512);
	assert_int_equal(w->tok_embd.cols, 64);
	assert_int_equal(w->layers[4].w_down.rows, 64);
	assert_int_equal(w->layers[4].w_down.cols, 172);
	assert_int_equal(w->layers[0].wk.rows, 32);
	assert_non_null(w->out_norm);
	assert_non_null(gpud_model_tokenizer(m));
	assert_int_equal(gpud_tokenizer_n_vocab(gpud_model_tokenizer(m)), 512);
	/* Plain RoPE: base^(-2i/8). */
	for (int i = 0; i < 4; i++)
		assert_float_equal(w->rope_inv_freq[i], pow(hp->rope_base, -2.0 * i / 8), 1e-7);
	assert_true(gpud_model_weight_bytes(m) > 200000 && gpud_model_weight_bytes(m) < 1200000);
	assert_string_equal(gpud_model_path(m), STORIES);
	gpud_model_free(m);
	gpud_model_free(NULL);
}

static void expect_error(const char *path, int code, const char *needle)
{
	struct gpud_model *m = (void *)1;
	char err[SW_ERR_MAX] = "";
	int rc = gpud_model_load(&m, path, err, sizeof(err));

	assert_int_equal(rc, code);
	assert_null(m);
	if (!strstr(err, needle) || !strstr(err, path))
		fail_msg("error \"%s\" should name \"%s\" and the file", err, needle);
}

static void test_missing_file(void **state)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/nope.gguf", tmpdir);
	struct gpud_model *m = (void *)1;
	char err[SW_ERR_MAX] = "";
	assert_true(gpud_model_load(&m, path, err, sizeof(err)) < 0);
	assert_null(m);
	assert_non_null(strstr(err, path));
}

static void test_unsupported_arch(void **state)
{
	struct mod m = { .arch = "gpt2" };
	expect_error(derive("gpt2.gguf", &m), SW_EUNSUPPORTED, "gpt2");
}

static void test_missing_tensor(void **state)
{
	struct mod m = { .drop_tensor = "blk.3.ffn_up.weight" };
	expect_error(derive("missing.gguf", &m), SW_ENOTFOUND, "blk.3.ffn_up.weight");
}

static void test_missing_norm(void **state)
{
	struct mod m = { .drop_tensor = "output_norm.weight" };
	expect_error(derive("nonorm.gguf", &m), SW_ENOTFOUND, "output_norm.weight");
}

static void test_wrong_shape(void **state)
{
	struct mod m = { .swap_tensor = "blk.1.attn_k.weight" };
	expect_error(derive("shape.gguf", &m), SW_EFORMAT, "blk.1.attn_k.weight");
}

static void test_wrong_norm_type(void **state)
{
	struct mod m = { .f16_tensor = "blk.0.attn_norm.weight" };
	expect_error(derive("normtype.gguf", &m), SW_ETYPE, "blk.0.attn_norm.weight");
}

static void test_missing_key(void **state)
{
	struct mod m = { .drop_key = "llama.block_count" };
	expect_error(derive("nokey.gguf", &m), SW_ENOTFOUND, "llama.block_count");
}

static void test_f16_matrix_loads(void **state)
{
	struct mod mo = { .f16_tensor = "blk.2.attn_q.weight" };
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "";

	if (gpud_model_load(&m, derive("f16q.gguf", &mo), err, sizeof(err)))
		fail_msg("%s", err);
	assert_int_equal(gpud_model_weights(m)->layers[2].wq.type, GPUD_TYPE_F16);
	gpud_model_free(m);
}

static void test_tied_output(void **state)
{
	struct mod mo = { .drop_tensor = "output.weight" };
	struct gpud_model *m = NULL;
	const struct gpud_model_weights *w;
	char err[SW_ERR_MAX] = "";

	if (gpud_model_load(&m, derive("tied.gguf", &mo), err, sizeof(err)))
		fail_msg("%s", err);
	w = gpud_model_weights(m);
	assert_true(gpud_model_hparams(m)->tied_output);
	assert_ptr_equal(w->output.data, w->tok_embd.data);
	assert_int_equal(w->output.rows, 512);
	gpud_model_free(m);
}

static void test_rope_llama3_metadata(void **state)
{
	struct mod mo = { .rope_scaling = "llama3" };
	struct gpud_model *m = NULL;
	const struct gpud_model_hparams *hp;
	const float *inv;
	char err[SW_ERR_MAX] = "";

	if (gpud_model_load(&m, derive("llama3.gguf", &mo), err, sizeof(err)))
		fail_msg("%s", err);
	hp = gpud_model_hparams(m);
	inv = gpud_model_weights(m)->rope_inv_freq;
	assert_true(hp->rope_scaled);
	/* Defaults: factor 8, low 1, high 4, original context 8192. With
	 * head_dim 8 the wavelengths are 2*pi*base^(i/4): pairs whose
	 * wavelength is under 2048 keep their frequency, over 8192 divide it
	 * by 8, in between blend. */
	for (int i = 0; i < 4; i++) {
		double f = pow(hp->rope_base, -2.0 * i / 8), wl = 2 * M_PI / f, want;
		if (wl < 2048)
			want = f;
		else if (wl > 8192)
			want = f / 8;
		else {
			double s = (8192 / wl - 1) / (4 - 1);
			want = (1 - s) * f / 8 + s * f;
		}
		assert_float_equal(inv[i], want, 1e-6 * fabs(want) + 1e-12);
	}
	gpud_model_free(m);
}

static void test_rope_freqs_tensor(void **state)
{
	struct mod mo = { .rope_freqs = true };
	struct gpud_model *m = NULL;
	const float *inv;
	char err[SW_ERR_MAX] = "";

	if (gpud_model_load(&m, derive("ropefreqs.gguf", &mo), err, sizeof(err)))
		fail_msg("%s", err);
	assert_true(gpud_model_hparams(m)->rope_scaled);
	inv = gpud_model_weights(m)->rope_inv_freq;
	for (int i = 0; i < 4; i++) {
		double want = pow(gpud_model_hparams(m)->rope_base, -2.0 * i / 8) / (i + 1);
		assert_float_equal(inv[i], want, 1e-6 * want);
	}
	gpud_model_free(m);
}

static void test_rope_linear(void **state)
{
	struct mod mo = { .rope_scaling = "linear", .rope_factor = 4 };
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "";

	if (gpud_model_load(&m, derive("linear.gguf", &mo), err, sizeof(err)))
		fail_msg("%s", err);
	assert_true(gpud_model_hparams(m)->rope_scaled);
	for (int i = 0; i < 4; i++)
		assert_float_equal(gpud_model_weights(m)->rope_inv_freq[i],
				   pow(gpud_model_hparams(m)->rope_base, -2.0 * i / 8) / 4, 1e-7);
	gpud_model_free(m);
	mo.rope_factor = 0.5f;
	expect_error(derive("linear_bad.gguf", &mo), SW_EFORMAT, "linear");
}

/* YaRN: pairs past the ramp divided by the factor, those before it kept,
 * a blend between; the logits scaled by mscale^2. stories260K: head_dim
 * 8, base 10000, context 2048, so the original context 512 puts the ramp
 * over pairs 0 to 2 (d(32 turns) = 0.41, d(1 turn) = 1.91). */
static void test_rope_yarn(void **state)
{
	struct mod mo = { .rope_scaling = "yarn", .rope_factor = 4 };
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "";
	double ms = 1 + 0.1 * log(4.0);

	(void)state;
	if (gpud_model_load(&m, derive("yarn.gguf", &mo), err, sizeof(err)))
		fail_msg("%s", err);
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const float *inv = gpud_model_weights(m)->rope_inv_freq;
	assert_int_equal(hp->n_ctx, 2048);
	assert_true(hp->rope_scaled);
	assert_float_equal(inv[0], 1.0, 1e-7);
	assert_float_equal(inv[1], pow(hp->rope_base, -2.0 / 8) / (1 / (0.5 / 4 + 0.5)), 1e-7);
	assert_float_equal(inv[3], pow(hp->rope_base, -6.0 / 8) / 4, 1e-9);
	assert_float_equal(hp->attn_scale, ms * ms / sqrt(8.0), 1e-7);
	gpud_model_free(m);
	mo.rope_factor = 0; /* no factor */
	expect_error(derive("yarn_bad.gguf", &mo), SW_EFORMAT, "bad yarn rope scaling");
}

static void test_rope_bad_scaling(void **state)
{
	struct mod m = { .rope_scaling = "longrope" };
	expect_error(derive("longrope.gguf", &m), SW_EUNSUPPORTED, "longrope");
}

/* A Mixtral-style file (llama with expert_count) is refused by name, not
 * with a missing tensor. */
static void test_experts_refused(void **state)
{
	struct mod m = { .expert_count = 8 };
	expect_error(derive("moe.gguf", &m), SW_EUNSUPPORTED, "mixture of 8 experts");
}

/* attention.key_length: dim / heads (stories260K: 8) is accepted; another
 * width makes Q and the attention output heads * key_length wide (Mistral
 * NeMo's 32 * 128 at dim 5120): a file whose tensors are not is refused
 * by the tensor's shape (here the rope width first), one whose values
 * differ from its keys by name; mkmodel --head-dim writes such heads. */
static void test_head_width(void **state)
{
	struct mod ok = { .key_length = 8 }, other = { .key_length = 16 },
		   values = { .key_length = 8, .value_length = 16 };
	struct gpud_mkmodel_params p;
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "", path[256];

	(void)state;
	assert_int_equal(gpud_model_load(&m, derive("kl8.gguf", &ok), err, sizeof(err)), 0);
	gpud_model_free(m);
	expect_error(derive("kl16.gguf", &other), SW_EUNSUPPORTED,
		     "rope.dimension_count 8, head dim 16");
	expect_error(derive("vl16.gguf", &values), SW_EUNSUPPORTED,
		     "attention.value_length 16 differs from the key length 8");

	snprintf(path, sizeof(path), "%s/hd.gguf", tmpdir);
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.dim = 64;
	p.n_heads = 4;
	p.n_kv_heads = 2;
	p.head_dim = 24; /* 96-wide Q on a 64-wide model */
	p.type = GPUD_TYPE_F32;
	assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
	assert_int_equal(gpud_model_load(&m, path, err, sizeof(err)), 0);
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	assert_int_equal(hp->head_dim, 24);
	assert_int_equal(hp->dim, 64);
	const struct gpud_layer_weights *L = &gpud_model_weights(m)->layers[0];
	assert_int_equal(L->wq.rows, 96);
	assert_int_equal(L->wq.cols, 64);
	assert_int_equal(L->wk.rows, 48);
	assert_int_equal(L->wo.rows, 64);
	assert_int_equal(L->wo.cols, 96);
	gpud_model_free(m);
	p.head_dim = 23;
	assert_int_not_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "must be even"));
}

static void test_rope_inv_freq_helper(void **state)
{
	float inv[3], f[3] = { 1, 4, 0.5f };

	gpud_rope_inv_freq(inv, 6, 100.0f, NULL);
	assert_float_equal(inv[0], 1.0, 1e-7);
	assert_float_equal(inv[1], pow(100, -2.0 / 6), 1e-7);
	assert_float_equal(inv[2], pow(100, -4.0 / 6), 1e-7);
	gpud_rope_inv_freq(inv, 6, 100.0f, f);
	assert_float_equal(inv[1], pow(100, -2.0 / 6) / 4, 1e-7);
	assert_float_equal(inv[2], pow(100, -4.0 / 6) * 2, 1e-7);
}

/* Writes tmpdir/name with mkmodel: the small default shape in arch, with
 * Qwen2.5's rope base and epsilon; returns the path (static). */
static const char *gen(const char *name, enum gpud_arch arch, bool bias, bool tied)
{
	static char path[256];
	struct gpud_mkmodel_params p;
	char err[SW_ERR_MAX] = "";

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.arch = arch;
	p.qkv_bias = bias;
	p.tied = tied;
	p.rope_base = 1e6f;
	p.norm_eps = 1e-6f;
	p.n_ctx = 32768;
	if (gpud_mkmodel(&p, err, sizeof(err)))
		fail_msg("mkmodel: %s", err);
	return path;
}

/* gpud_model_matrices: token_embd, output unless tied, each layer's seven
 * in order; a short buffer gets the first ones and the full count. */
static void test_matrices(void **state)
{
	(void)state;
	for (int tied = 0; tied < 2; tied++) {
		struct gpud_model *m = NULL;
		const struct gpud_weight *ws[32], *few[3] = { NULL, NULL, NULL };
		const struct gpud_model_weights *w;
		char err[SW_ERR_MAX] = "";
		size_t n, k = 0;

		if (gpud_model_load(&m, gen(tied ? "mt.gguf" : "mu.gguf", GPUD_ARCH_LLAMA, false,
					    tied), err, sizeof(err)))
			fail_msg("%s", err);
		w = gpud_model_weights(m);
		n = gpud_model_matrices(m, ws, 32);
		assert_int_equal(n, (tied ? 1 : 2) + 7 * gpud_model_hparams(m)->n_layers);
		assert_ptr_equal(ws[k++], &w->tok_embd);
		if (!tied)
			assert_ptr_equal(ws[k++], &w->output);
		for (uint32_t i = 0; i < gpud_model_hparams(m)->n_layers; i++) {
			const struct gpud_layer_weights *L = &w->layers[i];
			const struct gpud_weight *want[] = { &L->wq, &L->wk, &L->wv, &L->wo,
							     &L->w_gate, &L->w_up, &L->w_down };

			for (int j = 0; j < 7; j++)
				assert_ptr_equal(ws[k++], want[j]);
		}
		assert_int_equal(gpud_model_matrices(m, NULL, 0), n);
		assert_int_equal(gpud_model_matrices(m, few, 2), n);
		assert_ptr_equal(few[0], ws[0]);
		assert_ptr_equal(few[1], ws[1]);
		assert_null(few[2]);
		gpud_model_free(m);
	}
}

static void test_qwen2_hparams(void **state)
{
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "";

	if (gpud_model_load(&m, gen("qwen2.gguf", GPUD_ARCH_QWEN2, false, true), err, sizeof(err)))
		fail_msg("%s", err);
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const struct gpud_model_weights *w = gpud_model_weights(m);
	assert_int_equal(hp->arch, GPUD_ARCH_QWEN2);
	assert_int_equal(hp->rope_style, GPUD_ROPE_NEOX);
	assert_true(hp->qkv_bias);
	assert_true(hp->tied_output);
	assert_ptr_equal(w->output.data, w->tok_embd.data);
	assert_int_equal(hp->n_ctx, 32768);
	assert_float_equal(hp->rope_base, 1e6, 1e-3);
	assert_float_equal(hp->norm_eps, 1e-6, 1e-12);
	assert_int_equal(hp->head_dim, 16);
	for (int i = 0; i < 8; i++)
		assert_float_equal(w->rope_inv_freq[i], pow(1e6, -2.0 * i / 16), 1e-7);
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		assert_non_null(w->layers[l].bq);
		assert_non_null(w->layers[l].bk);
		assert_non_null(w->layers[l].bv);
	}
	gpud_model_free(m);
	assert_string_equal(gpud_arch_name(GPUD_ARCH_QWEN2), "qwen2");
	assert_string_equal(gpud_arch_name(GPUD_ARCH_LLAMA), "llama");
	assert_int_equal(gpud_arch_rope_style(GPUD_ARCH_LLAMA), GPUD_ROPE_NORM);
	enum gpud_arch a;
	assert_int_equal(gpud_arch_parse("qwen2", 5, &a), 0);
	assert_int_equal(a, GPUD_ARCH_QWEN2);
	assert_int_equal(gpud_arch_parse("qwen", 4, &a), SW_EUNSUPPORTED);

	/* llama: no biases, adjacent pairs; with biases when the file has them */
	assert_int_equal(gpud_model_load(&m, gen("llama.gguf", GPUD_ARCH_LLAMA, false, false),
					 err, sizeof(err)), 0);
	assert_int_equal(gpud_model_hparams(m)->rope_style, GPUD_ROPE_NORM);
	assert_false(gpud_model_hparams(m)->qkv_bias);
	assert_null(gpud_model_weights(m)->layers[0].bq);
	gpud_model_free(m);
	assert_int_equal(gpud_model_load(&m, gen("llamab.gguf", GPUD_ARCH_LLAMA, true, false),
					 err, sizeof(err)), 0);
	assert_true(gpud_model_hparams(m)->qkv_bias);
	assert_non_null(gpud_model_weights(m)->layers[1].bv);
	gpud_model_free(m);
}

/* A qwen2 file without one of its biases, or with a bias of the wrong
 * shape or type, or without a qwen2.* key: clear errors naming it. */
static void test_qwen2_bad_bias(void **state)
{
	char src[256];
	snprintf(src, sizeof(src), "%s", gen("qsrc.gguf", GPUD_ARCH_QWEN2, false, false));
	struct mod m1 = { .src = src, .drop_tensor = "blk.1.attn_k.bias" };
	expect_error(derive("q-nobias.gguf", &m1), SW_ENOTFOUND, "blk.1.attn_k.bias");
	struct mod m2 = { .src = src, .short_tensor = "blk.0.attn_v.bias" };
	expect_error(derive("q-shortbias.gguf", &m2), SW_EFORMAT, "blk.0.attn_v.bias");
	struct mod m4 = { .src = src, .f16_tensor = "blk.1.attn_q.bias" };
	expect_error(derive("q-f16bias.gguf", &m4), SW_ETYPE, "blk.1.attn_q.bias");
	struct mod m5 = { .src = src, .drop_key = "qwen2.embedding_length" };
	expect_error(derive("q-nokey.gguf", &m5), SW_ENOTFOUND, "qwen2.embedding_length");
	/* a llama file with some biases but not blk.0.attn_q.bias */
	snprintf(src, sizeof(src), "%s", gen("lsrc.gguf", GPUD_ARCH_LLAMA, true, false));
	struct mod m6 = { .src = src, .drop_tensor = "blk.0.attn_q.bias" };
	expect_error(derive("l-partial.gguf", &m6), SW_EFORMAT, "blk.0.attn_k.bias");
	/* the unknown architecture error names the supported ones */
	struct mod m7 = { .src = src, .arch = "gemma2" };
	expect_error(derive("gemma2.gguf", &m7), SW_EUNSUPPORTED, "supported: llama, qwen2, qwen3");
}

/* qwen3: NEOX pairs, no biases, each layer's per-head Q and K norms
 * (head_dim long) required; a missing or short one is named. */
static void test_qwen3(void **state)
{
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "", src[256];

	(void)state;
	snprintf(src, sizeof(src), "%s", gen("qwen3.gguf", GPUD_ARCH_QWEN3, false, true));
	if (gpud_model_load(&m, src, err, sizeof(err)))
		fail_msg("%s", err);
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const struct gpud_model_weights *w = gpud_model_weights(m);
	assert_int_equal(hp->arch, GPUD_ARCH_QWEN3);
	assert_int_equal(hp->rope_style, GPUD_ROPE_NEOX);
	assert_false(hp->qkv_bias);
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		assert_null(w->layers[l].bq);
		assert_non_null(w->layers[l].q_norm);
		assert_non_null(w->layers[l].k_norm);
		assert_true(w->layers[l].q_norm[0] != w->layers[l].k_norm[0]);
	}
	gpud_model_free(m);
	assert_string_equal(gpud_arch_name(GPUD_ARCH_QWEN3), "qwen3");
	assert_int_equal(gpud_arch_rope_style(GPUD_ARCH_QWEN3), GPUD_ROPE_NEOX);

	struct mod m1 = { .src = src, .drop_tensor = "blk.1.attn_k_norm.weight" };
	expect_error(derive("q3-nonorm.gguf", &m1), SW_ENOTFOUND, "blk.1.attn_k_norm.weight");
	struct mod m2 = { .src = src, .short_tensor = "blk.0.attn_q_norm.weight" };
	expect_error(derive("q3-short.gguf", &m2), SW_EFORMAT, "blk.0.attn_q_norm.weight");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stories_hparams),
		cmocka_unit_test(test_matrices),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_unsupported_arch),
		cmocka_unit_test(test_missing_tensor),
		cmocka_unit_test(test_missing_norm),
		cmocka_unit_test(test_wrong_shape),
		cmocka_unit_test(test_wrong_norm_type),
		cmocka_unit_test(test_missing_key),
		cmocka_unit_test(test_f16_matrix_loads),
		cmocka_unit_test(test_tied_output),
		cmocka_unit_test(test_rope_llama3_metadata),
		cmocka_unit_test(test_rope_freqs_tensor),
		cmocka_unit_test(test_rope_linear),
		cmocka_unit_test(test_rope_yarn),
		cmocka_unit_test(test_rope_bad_scaling),
		cmocka_unit_test(test_experts_refused),
		cmocka_unit_test(test_head_width),
		cmocka_unit_test(test_rope_inv_freq_helper),
		cmocka_unit_test(test_qwen2_hparams),
		cmocka_unit_test(test_qwen2_bad_bias),
		cmocka_unit_test(test_qwen3),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
