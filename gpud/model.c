/* model.c - Llama / Qwen2 hyper-parameters and weights from a GGUF file.
 *
 * Weights stay in the reader's mapping; the model only records typed
 * pointers and shapes after checking every tensor it will read. The two
 * architectures share the block; metadata keys are "<arch>.*".
 */
#include "gpud/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/quant.h"
#include "gpud/tokenizer.h"

struct gpud_model {
	char *path;
	const char *arch;                  /* key prefix: gpud_arch_name(hp.arch) */
	char key[96];                      /* the last key() built */
	struct gpud_gguf *g;
	struct gpud_tokenizer *tok;
	struct gpud_model_hparams hp;
	struct gpud_model_weights w;
	struct gpud_layer_weights *layers; /* (n_layers) */
	float *rope_inv_freq;              /* (head_dim/2) */
	size_t weight_bytes;
};

/* Llama 3 RoPE scaling defaults (Meta's reference for Llama 3.1/3.2). */
#define LLAMA3_FACTOR 8.0f
#define LLAMA3_LOW_FREQ_FACTOR 1.0f
#define LLAMA3_HIGH_FREQ_FACTOR 4.0f
#define LLAMA3_ORIG_CTX 8192.0f

const char *gpud_arch_name(enum gpud_arch a)
{
	switch (a) {
	case GPUD_ARCH_LLAMA: return "llama";
	case GPUD_ARCH_QWEN2: return "qwen2";
	case GPUD_ARCH_QWEN3: return "qwen3";
	}
	return "?";
}

int gpud_arch_parse(const char *s, size_t len, enum gpud_arch *out)
{
	if (len == 5 && !memcmp(s, "llama", 5)) {
		*out = GPUD_ARCH_LLAMA;
		return 0;
	}
	if (len == 5 && !memcmp(s, "qwen2", 5)) {
		*out = GPUD_ARCH_QWEN2;
		return 0;
	}
	if (len == 5 && !memcmp(s, "qwen3", 5)) {
		*out = GPUD_ARCH_QWEN3;
		return 0;
	}
	return SW_EUNSUPPORTED;
}

enum gpud_rope_style gpud_arch_rope_style(enum gpud_arch a)
{
	return a == GPUD_ARCH_QWEN2 || a == GPUD_ARCH_QWEN3 ? GPUD_ROPE_NEOX : GPUD_ROPE_NORM;
}

/* "<arch>.<suffix>" in m->key (valid until the next call). */
static const char *key(struct gpud_model *m, const char *suffix)
{
	snprintf(m->key, sizeof(m->key), "%s.%s", m->arch, suffix);
	return m->key;
}

void gpud_rope_inv_freq(float *inv_freq, uint32_t head_dim, float base, const float *factors)
{
	for (uint32_t i = 0; i < head_dim / 2; i++) {
		double f = pow((double)base, -2.0 * (double)i / (double)head_dim);
		if (factors)
			f /= (double)factors[i];
		inv_freq[i] = (float)f;
	}
}

/* YaRN's pair index at which a frequency turns rot times over the
 * original context (the YaRN paper's d(r)). */
static double yarn_dim(uint32_t head_dim, double orig_ctx, double rot, double base)
{
	return head_dim * log(orig_ctx / (rot * 2.0 * M_PI)) / (2.0 * log(base));
}

/* Per-pair divisors of YaRN ("NTK-by-parts"): pairs that turn more than
 * beta_fast times over the original context keep their frequency, those
 * that turn fewer than beta_slow times are divided by factor, a linear
 * ramp between (scaled by ext, the extrapolation's share), as llama.cpp's
 * rope_yarn and Hugging Face's _compute_yarn_parameters have it. */
static void yarn_factors(float *out, uint32_t head_dim, float base, float factor, float orig_ctx,
			 float beta_fast, float beta_slow, float ext)
{
	double lo = floor(yarn_dim(head_dim, orig_ctx, beta_fast, base));
	double hi = ceil(yarn_dim(head_dim, orig_ctx, beta_slow, base));

	lo = lo > 0 ? lo : 0;
	hi = hi < head_dim - 1 ? hi : head_dim - 1;
	for (uint32_t i = 0; i < head_dim / 2; i++) {
		double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
		double mix = (1.0 - (y < 0 ? 0 : y > 1 ? 1 : y)) * ext;
		out[i] = (float)(1.0 / ((1.0 - mix) / factor + mix));
	}
}

/* Per-pair divisors of Llama 3 scaling: 1 for high frequencies, factor for
 * low ones, a smooth blend between. */
static void llama3_factors(float *out, uint32_t head_dim, float base, float factor,
			   float lo_ff, float hi_ff, float orig_ctx)
{
	double lo_wavelen = orig_ctx / lo_ff, hi_wavelen = orig_ctx / hi_ff;

	for (uint32_t i = 0; i < head_dim / 2; i++) {
		double freq = pow((double)base, -2.0 * (double)i / (double)head_dim);
		double wavelen = 2.0 * M_PI / freq, nf;
		if (wavelen < hi_wavelen) {
			nf = freq;
		} else if (wavelen > lo_wavelen) {
			nf = freq / factor;
		} else {
			double smooth = (orig_ctx / wavelen - lo_ff) / (hi_ff - lo_ff);
			nf = (1.0 - smooth) * freq / factor + smooth * freq;
		}
		out[i] = (float)(freq / nf);
	}
}

static int meta_u32(struct gpud_model *m, const char *key, uint32_t *out, bool required,
		    char *err, size_t errlen)
{
	int rc = gpud_gguf_get_u32(m->g, key, out);

	if (rc == SW_ENOTFOUND && !required)
		return 0;
	if (rc == SW_ENOTFOUND)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "%s: missing metadata key %s",
				 m->path, key);
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: metadata key %s: %s", m->path, key,
				 sw_strerror(rc));
	return 0;
}

static int meta_f32(struct gpud_model *m, const char *key, float *out, char *err, size_t errlen)
{
	int rc = gpud_gguf_get_f32(m->g, key, out);

	if (rc == SW_ENOTFOUND)
		return 0;
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: metadata key %s: %s", m->path, key,
				 sw_strerror(rc));
	return 0;
}

/* Finds name and checks it is (rows, cols) in a supported matrix type. */
static int get_matrix(struct gpud_model *m, const char *name, int64_t rows, int64_t cols,
		      struct gpud_weight *w, char *err, size_t errlen)
{
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(m->g, name);
	int rc;

	if (!t)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "%s: missing tensor %s", m->path, name);
	if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: tensor %s has shape [%llu, %llu] (%u dims), expected [%lld, %lld]",
				 m->path, name, (unsigned long long)t->ne[0],
				 (unsigned long long)t->ne[1], t->n_dims, (long long)cols,
				 (long long)rows);
	if (!gpud_type_traits(t->type) || !gpud_type_traits(t->type)->matmul)
		return sw_seterr(err, errlen, SW_ETYPE, "%s: tensor %s has unsupported type %s",
				 m->path, name, gpud_type_name(t->type));
	if (gpud_type_block_elems(t->type) > 1 && cols % gpud_type_block_elems(t->type))
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: tensor %s: %lld columns not a multiple of the %s block",
				 m->path, name, (long long)cols, gpud_type_name(t->type));
	if ((rc = gpud_gguf_tensor_check_data(m->g, t, m->path, err, errlen)))
		return rc;
	*w = (struct gpud_weight){ .type = t->type, .rows = rows, .cols = cols, .data = t->data };
	m->weight_bytes += t->nbytes;
	return 0;
}

/* Finds name and checks it is an F32 vector of n elements. */
static int get_vector(struct gpud_model *m, const char *name, int64_t n, const float **out,
		      char *err, size_t errlen)
{
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(m->g, name);

	if (!t)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "%s: missing tensor %s", m->path, name);
	if (t->n_dims != 1 || (int64_t)t->ne[0] != n)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: tensor %s has shape [%llu] (%u dims), expected [%lld]",
				 m->path, name, (unsigned long long)t->ne[0], t->n_dims,
				 (long long)n);
	if (t->type != GPUD_TYPE_F32)
		return sw_seterr(err, errlen, SW_ETYPE, "%s: tensor %s has type %s, expected f32",
				 m->path, name, gpud_type_name(t->type));
	if ((uintptr_t)t->data % sizeof(float))
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: tensor %s is misaligned",
				 m->path, name);
	*out = t->data;
	m->weight_bytes += t->nbytes;
	return 0;
}

static int read_hparams(struct gpud_model *m, char *err, size_t errlen)
{
	struct gpud_model_hparams *hp = &m->hp;
	struct gpud_gguf_str arch;
	uint32_t rope_dims = 0, key_len = 0, value_len = 0, experts = 0;
	int rc;

	rc = gpud_gguf_get_str(m->g, "general.architecture", &arch);
	if (rc)
		return sw_seterr(err, errlen, rc == SW_ENOTFOUND ? SW_EUNSUPPORTED : rc,
				 "%s: no general.architecture (not a model file?)", m->path);
	if (gpud_arch_parse(arch.s, arch.len, &hp->arch))
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "%s: unsupported architecture \"%.*s\" (supported: llama, qwen2, qwen3)",
				 m->path, (int)(arch.len > 64 ? 64 : arch.len), arch.s);
	m->arch = gpud_arch_name(hp->arch);
	hp->rope_style = gpud_arch_rope_style(hp->arch);
	if ((rc = meta_u32(m, key(m, "embedding_length"), &hp->dim, true, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "block_count"), &hp->n_layers, true, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "feed_forward_length"), &hp->ffn_dim, true, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "attention.head_count"), &hp->n_heads, true, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "context_length"), &hp->n_ctx, true, err, errlen)))
		return rc;
	hp->n_kv_heads = hp->n_heads;
	hp->norm_eps = 1e-5f;
	hp->rope_base = 10000.0f;
	if ((rc = meta_u32(m, key(m, "attention.head_count_kv"), &hp->n_kv_heads, false, err,
			   errlen)) ||
	    (rc = meta_u32(m, key(m, "rope.dimension_count"), &rope_dims, false, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "attention.key_length"), &key_len, false, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "attention.value_length"), &value_len, false, err, errlen)) ||
	    (rc = meta_f32(m, key(m, "attention.layer_norm_rms_epsilon"), &hp->norm_eps, err,
			   errlen)) ||
	    (rc = meta_f32(m, key(m, "rope.freq_base"), &hp->rope_base, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "expert_count"), &experts, false, err, errlen)))
		return rc;
	/* Mixtral is written as "llama" with experts in place of each
	 * layer's one feed-forward network */
	if (experts)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "%s: a mixture of %u experts (%s.expert_count): mixture-of-experts "
				 "models (Mixtral) are not supported", m->path, experts, m->arch);
	if (!hp->dim || !hp->n_layers || !hp->ffn_dim || !hp->n_heads || !hp->n_kv_heads ||
	    !hp->n_ctx || (!key_len && hp->dim % hp->n_heads) || hp->n_heads % hp->n_kv_heads ||
	    hp->n_layers > 4096 || hp->dim > (1u << 20) || hp->ffn_dim > (1u << 22) ||
	    hp->n_heads > 4096 || key_len > 4096)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: inconsistent hyper-parameters (dim %u, layers %u, heads %u, "
				 "kv heads %u, ffn %u, context %u, key length %u)", m->path, hp->dim,
				 hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim, hp->n_ctx,
				 key_len);
	/* Heads are dim / heads wide unless the file says otherwise
	 * (Mistral NeMo and Small 3: 128 where 5120 / 32 = 160): Q and the
	 * attention output are then heads * key_length wide, not dim. Keys and
	 * values of different widths (multi-head latent attention) are another
	 * architecture. */
	hp->head_dim = key_len ? key_len : hp->dim / hp->n_heads;
	if (value_len && value_len != hp->head_dim)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "%s: attention.value_length %u differs from the key length %u: "
				 "values and keys of different widths are not supported",
				 m->path, value_len, hp->head_dim);
	if (hp->head_dim % 2)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: odd head dimension %u", m->path,
				 hp->head_dim);
	if (rope_dims && rope_dims != hp->head_dim)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "%s: partial rotary embedding (rope.dimension_count %u, head dim %u)",
				 m->path, rope_dims, hp->head_dim);
	if (!(hp->norm_eps > 0) || !(hp->rope_base > 1) || !isfinite(hp->rope_base))
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: bad rms epsilon %g or rope base %g",
				 m->path, hp->norm_eps, hp->rope_base);
	return 0;
}

/* YaRN (<arch>.rope.scaling.type "yarn"): the per-pair divisors, and
 * mscale = attn_factor * (1 + 0.1 ln factor) on cos and sin, which
 * scales the attention logits by its square (hp->attn_scale). The
 * original context is rope.scaling.original_context_length, else the
 * context length over the factor; beta_fast 32, beta_slow 1, ext_factor
 * 1 and attn_factor 1 unless the file's rope.scaling.yarn_* say else. */
static int setup_yarn(struct gpud_model *m, char *err, size_t errlen)
{
	struct gpud_model_hparams *hp = &m->hp;
	float factor = 0, ext = 1, attn = 1, fast = 32, slow = 1, orig;
	uint32_t orig_u = 0;
	float *factors;
	int rc;

	if ((rc = meta_f32(m, key(m, "rope.scaling.factor"), &factor, err, errlen)) ||
	    (rc = meta_u32(m, key(m, "rope.scaling.original_context_length"), &orig_u, false, err,
			   errlen)) ||
	    (rc = meta_f32(m, key(m, "rope.scaling.yarn_ext_factor"), &ext, err, errlen)) ||
	    (rc = meta_f32(m, key(m, "rope.scaling.yarn_attn_factor"), &attn, err, errlen)) ||
	    (rc = meta_f32(m, key(m, "rope.scaling.yarn_beta_fast"), &fast, err, errlen)) ||
	    (rc = meta_f32(m, key(m, "rope.scaling.yarn_beta_slow"), &slow, err, errlen)))
		return rc;
	orig = orig_u ? (float)orig_u : (float)hp->n_ctx / (factor > 0 ? factor : 1);
	if (!(factor >= 1) || !isfinite(factor) || !(orig >= 1) || !(ext >= 0 && ext <= 1) ||
	    !(attn > 0) || !isfinite(attn) || !(fast > slow) || !(slow > 0) || !isfinite(fast))
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: bad yarn rope scaling (factor %g, original context %g, "
				 "ext_factor %g, attn_factor %g, beta_fast %g, beta_slow %g)",
				 m->path, factor, orig, ext, attn, fast, slow);
	factors = malloc(hp->head_dim / 2 * sizeof(float));
	if (!factors)
		return -ENOMEM;
	yarn_factors(factors, hp->head_dim, hp->rope_base, factor, orig, fast, slow, ext);
	gpud_rope_inv_freq(m->rope_inv_freq, hp->head_dim, hp->rope_base, factors);
	free(factors);
	double ms = attn * (ext != 0 ? 1.0 + 0.1 * log(factor) : 1.0);
	hp->attn_scale = (float)(ms * ms) / sqrtf((float)hp->head_dim);
	hp->rope_scaled = factor != 1 || ms != 1;
	return 0;
}

/* Llama 3 scaling: a rope_freqs.weight tensor of per-pair factors wins;
 * otherwise <arch>.rope.scaling.type "llama3", "linear" or "yarn" with
 * its parameters. */
static int setup_rope(struct gpud_model *m, char *err, size_t errlen)
{
	struct gpud_model_hparams *hp = &m->hp;
	uint32_t half = hp->head_dim / 2;
	const struct gpud_gguf_tensor *t;
	struct gpud_gguf_str type;
	float *factors = NULL;
	int rc = 0;

	m->rope_inv_freq = calloc(half, sizeof(float));
	if (!m->rope_inv_freq)
		return -ENOMEM;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	t = gpud_gguf_find_tensor(m->g, "rope_freqs.weight");
	if (t) {
		const float *f;
		if ((rc = get_vector(m, "rope_freqs.weight", half, &f, err, errlen)))
			return rc;
		for (uint32_t i = 0; i < half; i++)
			if (!(f[i] > 0) || !isfinite(f[i]))
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "%s: rope_freqs.weight[%u] = %g", m->path, i, f[i]);
		gpud_rope_inv_freq(m->rope_inv_freq, hp->head_dim, hp->rope_base, f);
		hp->rope_scaled = true;
		return 0;
	}
	rc = gpud_gguf_get_str(m->g, key(m, "rope.scaling.type"), &type);
	if (rc == 0 && !(type.len == 4 && !memcmp(type.s, "none", 4))) {
		float factor = LLAMA3_FACTOR, lo = LLAMA3_LOW_FREQ_FACTOR;
		float hi = LLAMA3_HIGH_FREQ_FACTOR, orig = LLAMA3_ORIG_CTX;
		uint32_t orig_u = 0;

		if (type.len == 6 && !memcmp(type.s, "linear", 6)) {
			/* Positions interpolated: every frequency divided by factor. */
			factor = 1;
			if ((rc = meta_f32(m, key(m, "rope.scaling.factor"), &factor, err, errlen)))
				return rc;
			if (!(factor >= 1) || !isfinite(factor))
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "%s: bad linear rope scaling factor %g", m->path, factor);
			factors = malloc(half * sizeof(float));
			if (!factors)
				return -ENOMEM;
			for (uint32_t i = 0; i < half; i++)
				factors[i] = factor;
			gpud_rope_inv_freq(m->rope_inv_freq, hp->head_dim, hp->rope_base, factors);
			hp->rope_scaled = factor != 1;
			free(factors);
			return 0;
		}
		if (type.len == 4 && !memcmp(type.s, "yarn", 4))
			return setup_yarn(m, err, errlen);
		if (!(type.len == 6 && !memcmp(type.s, "llama3", 6)))
			return sw_seterr(err, errlen, SW_EUNSUPPORTED,
					 "%s: unsupported rope scaling type \"%.*s\"", m->path,
					 (int)(type.len > 32 ? 32 : type.len), type.s);
		if ((rc = meta_f32(m, key(m, "rope.scaling.factor"), &factor, err, errlen)) ||
		    (rc = meta_f32(m, key(m, "rope.scaling.low_freq_factor"), &lo, err, errlen)) ||
		    (rc = meta_f32(m, key(m, "rope.scaling.high_freq_factor"), &hi, err, errlen)) ||
		    (rc = meta_u32(m, key(m, "rope.scaling.original_context_length"), &orig_u,
				   false, err, errlen)))
			return rc;
		if (orig_u)
			orig = (float)orig_u;
		if (!(factor >= 1) || !(lo > 0) || !(hi > lo) || !(orig > 0))
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: bad llama3 rope scaling (factor %g, low %g, high %g, "
					 "original context %g)", m->path, factor, lo, hi, orig);
		factors = calloc(half, sizeof(float));
		if (!factors)
			return -ENOMEM;
		llama3_factors(factors, hp->head_dim, hp->rope_base, factor, lo, hi, orig);
		gpud_rope_inv_freq(m->rope_inv_freq, hp->head_dim, hp->rope_base, factors);
		hp->rope_scaled = true;
		free(factors);
		return 0;
	}
	if (rc && rc != SW_ENOTFOUND)
		return sw_seterr(err, errlen, rc, "%s: %s.rope.scaling.type: %s", m->path,
				 m->arch, sw_strerror(rc));
	gpud_rope_inv_freq(m->rope_inv_freq, hp->head_dim, hp->rope_base, NULL);
	return 0;
}

/* The Q/K/V biases of layer l: required for qwen2; for llama all three
 * or none (a file with only some of them is refused). */
static int bind_biases(struct gpud_model *m, uint32_t l, struct gpud_layer_weights *L,
		       char *err, size_t errlen)
{
	struct gpud_model_hparams *hp = &m->hp;
	int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim;
	int64_t kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
	char name[96];
	int rc;

	if (l == 0) {
		snprintf(name, sizeof(name), "blk.0.attn_q.bias");
		hp->qkv_bias = hp->arch == GPUD_ARCH_QWEN2 || gpud_gguf_find_tensor(m->g, name);
	}
	if (!hp->qkv_bias) {
		static const char *const parts[] = { "attn_q", "attn_k", "attn_v" };
		for (size_t i = 0; i < 3; i++) {
			snprintf(name, sizeof(name), "blk.%u.%s.bias", l, parts[i]);
			if (gpud_gguf_find_tensor(m->g, name))
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "%s: tensor %s present but blk.0.attn_q.bias absent "
						 "(Q/K/V biases must be on every layer or none)",
						 m->path, name);
		}
		return 0;
	}
#define BIAS(suffix) (snprintf(name, sizeof(name), "blk.%u." suffix, l), name)
	if ((rc = get_vector(m, BIAS("attn_q.bias"), q_dim, &L->bq, err, errlen)) ||
	    (rc = get_vector(m, BIAS("attn_k.bias"), kv_dim, &L->bk, err, errlen)) ||
	    (rc = get_vector(m, BIAS("attn_v.bias"), kv_dim, &L->bv, err, errlen)))
		return rc;
#undef BIAS
	return 0;
}

static int bind_weights(struct gpud_model *m, char *err, size_t errlen)
{
	struct gpud_model_hparams *hp = &m->hp;
	const struct gpud_gguf_tensor *emb;
	int64_t dim = hp->dim, q_dim = (int64_t)hp->n_heads * hp->head_dim;
	int64_t kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim, ffn = hp->ffn_dim;
	char name[96];
	int rc;

	emb = gpud_gguf_find_tensor(m->g, "token_embd.weight");
	if (!emb)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "%s: missing tensor token_embd.weight",
				 m->path);
	if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > INT32_MAX)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: tensor token_embd.weight has %u dims / %llu rows", m->path,
				 emb->n_dims, (unsigned long long)emb->ne[1]);
	hp->n_vocab = (uint32_t)emb->ne[1];
	if ((rc = get_matrix(m, "token_embd.weight", hp->n_vocab, dim, &m->w.tok_embd, err, errlen)))
		return rc;
	m->layers = calloc(hp->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		struct gpud_layer_weights *L = &m->layers[l];
#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%u." suffix, l), name)
		if ((rc = get_vector(m, BLK("attn_norm.weight"), dim, &L->attn_norm, err, errlen)) ||
		    (rc = get_matrix(m, BLK("attn_q.weight"), q_dim, dim, &L->wq, err, errlen)) ||
		    (rc = get_matrix(m, BLK("attn_k.weight"), kv_dim, dim, &L->wk, err, errlen)) ||
		    (rc = get_matrix(m, BLK("attn_v.weight"), kv_dim, dim, &L->wv, err, errlen)) ||
		    (rc = get_matrix(m, BLK("attn_output.weight"), dim, q_dim, &L->wo, err, errlen)) ||
		    (rc = get_vector(m, BLK("ffn_norm.weight"), dim, &L->ffn_norm, err, errlen)) ||
		    (rc = get_matrix(m, BLK("ffn_gate.weight"), ffn, dim, &L->w_gate, err, errlen)) ||
		    (rc = get_matrix(m, BLK("ffn_up.weight"), ffn, dim, &L->w_up, err, errlen)) ||
		    (rc = get_matrix(m, BLK("ffn_down.weight"), dim, ffn, &L->w_down, err, errlen)))
			return rc;
		if ((rc = bind_biases(m, l, L, err, errlen)))
			return rc;
		/* qwen3: each Q and K head RMS-normed (weights of head_dim)
		 * before RoPE */
		if (hp->arch == GPUD_ARCH_QWEN3 &&
		    ((rc = get_vector(m, BLK("attn_q_norm.weight"), hp->head_dim, &L->q_norm, err,
				      errlen)) ||
		     (rc = get_vector(m, BLK("attn_k_norm.weight"), hp->head_dim, &L->k_norm, err,
				      errlen))))
			return rc;
#undef BLK
	}
	m->w.layers = m->layers;
	if ((rc = get_vector(m, "output_norm.weight", dim, &m->w.out_norm, err, errlen)))
		return rc;
	if (gpud_gguf_find_tensor(m->g, "output.weight")) {
		if ((rc = get_matrix(m, "output.weight", hp->n_vocab, dim, &m->w.output, err, errlen)))
			return rc;
	} else {
		m->w.output = m->w.tok_embd;
		hp->tied_output = true;
	}
	return 0;
}

int gpud_model_load(struct gpud_model **out, const char *path, char *err, size_t errlen)
{
	struct gpud_model *m;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->path = strdup(path);
	if (!m->path) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = gpud_gguf_open(&m->g, path, err, errlen);
	if (rc)
		goto out_free;
	if ((rc = read_hparams(m, err, errlen)) || (rc = bind_weights(m, err, errlen)) ||
	    (rc = setup_rope(m, err, errlen)))
		goto out_free;
	m->w.rope_inv_freq = m->rope_inv_freq;
	rc = gpud_tokenizer_load(&m->tok, m->g, err, errlen);
	if (rc)
		goto out_free;
	if (gpud_tokenizer_n_vocab(m->tok) > (int32_t)m->hp.n_vocab) {
		rc = sw_seterr(err, errlen, SW_EFORMAT,
			       "%s: tokenizer has %d tokens but token_embd.weight only %u rows",
			       path, gpud_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
		goto out_free;
	}
	*out = m;
	return 0;

out_free:
	if (rc == -ENOMEM)
		sw_seterr(err, errlen, rc, "%s: out of memory", path);
	gpud_model_free(m);
	return rc;
}

void gpud_model_free(struct gpud_model *m)
{
	if (!m)
		return;
	gpud_tokenizer_free(m->tok);
	gpud_gguf_close(m->g);
	free(m->layers);
	free(m->rope_inv_freq);
	free(m->path);
	free(m);
}

const struct gpud_model_hparams *gpud_model_hparams(const struct gpud_model *m) { return &m->hp; }
const struct gpud_model_weights *gpud_model_weights(const struct gpud_model *m) { return &m->w; }
const struct gpud_tokenizer *gpud_model_tokenizer(const struct gpud_model *m) { return m->tok; }
const struct gpud_gguf *gpud_model_gguf(const struct gpud_model *m) { return m->g; }
const char *gpud_model_path(const struct gpud_model *m) { return m->path; }
size_t gpud_model_weight_bytes(const struct gpud_model *m) { return m->weight_bytes; }

size_t gpud_model_matrices(const struct gpud_model *m, const struct gpud_weight **out,
			   size_t cap)
{
	const struct gpud_model_weights *w = &m->w;
	size_t n = 0;

#define PUT(x)                   \
	do {                     \
		if (n < cap)     \
			out[n] = (x); \
		n++;             \
	} while (0)
	PUT(&w->tok_embd);
	if (w->output.data != w->tok_embd.data)
		PUT(&w->output);
	for (uint32_t i = 0; i < m->hp.n_layers; i++) {
		const struct gpud_layer_weights *L = &w->layers[i];

		PUT(&L->wq);
		PUT(&L->wk);
		PUT(&L->wv);
		PUT(&L->wo);
		PUT(&L->w_gate);
		PUT(&L->w_up);
		PUT(&L->w_down);
	}
#undef PUT
	return n;
}
