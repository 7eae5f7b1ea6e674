/* mkmodel.c - random-weight Llama / Qwen2 GGUF files of any shape.
 *
 * Every tensor is a fill tensor of the GGUF writer: rows are generated at
 * write time from (seed, tensor index, row) so the model never exists in
 * memory and the bytes depend on nothing but the parameters.
 */
#include "gpud/mkmodel.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"

#define MK_MAX_LAYERS 4096
#define MK_MAX_DIM (1u << 20)
#define MK_WEIGHT_STD 0.02f
#define MK_BIAS_STD 0.1f
#define MK_UNIFORM_AMP 1.7320508f /* sqrt(3): uniform [-a, a] has std a/sqrt(3) */

void gpud_mkmodel_params_default(struct gpud_mkmodel_params *p)
{
	memset(p, 0, sizeof(*p));
	p->dim = 64;
	p->n_layers = 2;
	p->n_heads = 4;
	p->n_kv_heads = 2;
	p->ffn_dim = 128;
	p->n_ctx = 512;
	p->rope_base = 10000.0f;
	p->norm_eps = 1e-5f;
	p->type = GPUD_TYPE_F32;
	p->seed = 1;
}

/* Qwen2.5's shape of a given size (2 KV heads, context 32768, rope base
 * 1e6, eps 1e-6, tied embeddings). */
static void qwen25(struct gpud_mkmodel_params *p, uint32_t dim, uint32_t layers, uint32_t heads,
		   uint32_t ffn)
{
	p->arch = GPUD_ARCH_QWEN2;
	p->dim = dim;
	p->n_layers = layers;
	p->n_heads = heads;
	p->n_kv_heads = 2;
	p->ffn_dim = ffn;
	p->n_ctx = 32768;
	p->rope_base = 1000000.0f;
	p->norm_eps = 1e-6f;
	p->tied = true;
	p->rope_scale_factor = 0;
}

int gpud_mkmodel_preset(struct gpud_mkmodel_params *p, const char *name)
{
	if (name && strcmp(name, "tiny") == 0) {
		const char *out = p->out, *vocab = p->vocab_from;
		enum gpud_arch arch = p->arch;
		gpud_mkmodel_params_default(p);
		p->out = out;
		p->vocab_from = vocab;
		p->arch = arch;
		return 0;
	}
	if (name && strcmp(name, "qwen2.5-3b") == 0) {
		qwen25(p, 2048, 36, 16, 11008);
		return 0;
	}
	if (name && strcmp(name, "qwen2.5-0.5b") == 0) {
		/* rows of 896: its K-quant files hold Q5_0/Q5_1/Q8_0/IQ4_NL
		 * (gpud_mkmodel_tensor_type) */
		qwen25(p, 896, 24, 14, 4864);
		return 0;
	}
	if (name && strcmp(name, "llama-3.2-3b") == 0) {
		p->arch = GPUD_ARCH_LLAMA;
		p->dim = 3072;
		p->n_layers = 28;
		p->n_heads = 24;
		p->n_kv_heads = 8;
		p->ffn_dim = 8192;
		p->n_ctx = 131072;
		p->rope_base = 500000.0f;
		p->norm_eps = 1e-5f;
		p->tied = true;
		p->rope_scale_factor = 32.0f;
		p->rope_low_freq_factor = 1.0f;
		p->rope_high_freq_factor = 4.0f;
		p->rope_orig_ctx = 8192;
		return 0;
	}
	return SW_ENOTFOUND;
}

/* --- deterministic weights ------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

enum fill_kind {
	FILL_UNIFORM,   /* uniform, std = amp / sqrt(3) */
	FILL_ONES,      /* norms */
	FILL_ROPE,      /* Llama 3 rope factors */
	FILL_NEAR_ONE,  /* per-head norms (qwen3): 1 + uniform, amp */
};

struct fill_arg {
	enum fill_kind kind;
	uint64_t key;   /* seed mixed with the tensor index */
	float amp;
	const struct gpud_mkmodel_params *p;
	uint32_t head_dim;
};

/* Llama 3 per-pair divisors of the rope frequency (llama.cpp's
 * rope_freqs.weight): 1 for high frequencies, factor for low ones, a smooth
 * blend between. */
static void llama3_rope_factors(const struct gpud_mkmodel_params *p, uint32_t head_dim,
				float *out)
{
	double lo_wavelen = p->rope_orig_ctx / p->rope_low_freq_factor;
	double hi_wavelen = p->rope_orig_ctx / p->rope_high_freq_factor;
	for (uint32_t i = 0; i < head_dim / 2; i++) {
		double freq = pow(p->rope_base, -(double)(2 * i) / head_dim);
		double wavelen = 2 * M_PI / freq;
		double f;
		if (wavelen < hi_wavelen) {
			f = 1.0;
		} else if (wavelen > lo_wavelen) {
			f = p->rope_scale_factor;
		} else {
			double smooth = (p->rope_orig_ctx / wavelen - p->rope_low_freq_factor) /
					(p->rope_high_freq_factor - p->rope_low_freq_factor);
			f = 1.0 / ((1.0 - smooth) / p->rope_scale_factor + smooth);
		}
		out[i] = (float)f;
	}
}

static int fill(void *argp, uint64_t row, float *out, uint64_t cols)
{
	const struct fill_arg *a = argp;
	switch (a->kind) {
	case FILL_ONES:
		for (uint64_t c = 0; c < cols; c++)
			out[c] = 1.0f;
		return 0;
	case FILL_ROPE:
		if (cols != a->head_dim / 2)
			return -EINVAL;
		llama3_rope_factors(a->p, a->head_dim, out);
		return 0;
	case FILL_UNIFORM:
	case FILL_NEAR_ONE: {
		uint64_t s = a->key ^ (row * 0xd1342543de82ef95ull);
		splitmix64(&s);
		for (uint64_t c = 0; c < cols; c++) {
			/* 24 random bits -> [-1, 1) */
			float u = (float)(splitmix64(&s) >> 40) * (1.0f / 8388608.0f) - 1.0f;
			out[c] = u * a->amp + (a->kind == FILL_NEAR_ONE ? 1.0f : 0.0f);
		}
		return 0;
	}
	}
	return -EINVAL;
}

/* --- built-in vocabulary --------------------------------------------------- */

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's word marker */

/* Common English words; each is added with all its prefixes so the
 * SentencePiece merge loop can reach it from single characters. */
static const char *const mk_words[] = {
	"the", "and", "was", "to", "a", "he", "she", "it", "of", "in", "on",
	"is", "you", "that", "with", "for", "his", "her", "they", "had", "at",
	"be", "this", "day", "one", "time", "upon", "once", "there", "little",
	"big", "said", "so", "but", "not", "we", "play", "happy", "friend",
	"saw", "went", "were", "very", "all", "what", "can", "have", "mom",
	"dog", "cat", "tree", "ball", "girl", "boy", "named", "loved",
};

enum {
	TOK_NORMAL = 1,
	TOK_UNKNOWN = 2,
	TOK_CONTROL = 3,
	TOK_BYTE = 6,
};

struct vocab {
	char (*tok)[32];   /* (n) NUL-terminated pieces */
	float *score;      /* (n) */
	int32_t *type;     /* (n) */
	size_t n, cap;
};

static int vocab_add(struct vocab *v, const char *s, float score, int32_t type)
{
	for (size_t i = 0; i < v->n; i++)
		if (strcmp(v->tok[i], s) == 0)
			return 0;
	if (v->n == v->cap)
		return -ENOSPC;
	snprintf(v->tok[v->n], sizeof(v->tok[v->n]), "%s", s);
	v->score[v->n] = score;
	v->type[v->n] = type;
	v->n++;
	return 0;
}

static void vocab_free(struct vocab *v)
{
	free(v->tok);
	free(v->score);
	free(v->type);
}

static int vocab_build(struct vocab *v)
{
	char buf[32];
	int rc = 0;

	v->cap = 1024;
	v->tok = calloc(v->cap, sizeof(*v->tok));
	v->score = calloc(v->cap, sizeof(*v->score));
	v->type = calloc(v->cap, sizeof(*v->type));
	if (!v->tok || !v->score || !v->type)
		return -ENOMEM;
	rc = rc ? rc : vocab_add(v, "<unk>", 0.0f, TOK_UNKNOWN);
	rc = rc ? rc : vocab_add(v, "<s>", 0.0f, TOK_CONTROL);
	rc = rc ? rc : vocab_add(v, "</s>", 0.0f, TOK_CONTROL);
	for (int b = 0; b < 256 && !rc; b++) {
		snprintf(buf, sizeof(buf), "<0x%02X>", b);
		rc = vocab_add(v, buf, 0.0f, TOK_BYTE);
	}
	/* Scores fall with position so earlier pieces merge first. */
	float score = -1.0f;
	rc = rc ? rc : vocab_add(v, SPM_SPACE, score--, TOK_NORMAL);
	for (int c = 0x21; c < 0x7f && !rc; c++) {
		buf[0] = (char)c;
		buf[1] = 0;
		rc = vocab_add(v, buf, score--, TOK_NORMAL);
	}
	for (size_t w = 0; w < sizeof(mk_words) / sizeof(mk_words[0]) && !rc; w++) {
		size_t len = strlen(mk_words[w]);
		for (size_t k = 1; k <= len && !rc; k++) {
			snprintf(buf, sizeof(buf), SPM_SPACE "%.*s", (int)k, mk_words[w]);
			rc = vocab_add(v, buf, score--, TOK_NORMAL);
		}
	}
	return rc;
}

static int write_byte_vocab(struct gpud_gguf_writer *w, uint64_t *n_vocab)
{
	struct vocab v = { 0 };
	struct gpud_gguf_str *strs = NULL;
	int rc = vocab_build(&v);
	if (rc)
		goto out_free;
	strs = calloc(v.n, sizeof(*strs));
	if (!strs) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < v.n; i++)
		strs[i] = (struct gpud_gguf_str){ v.tok[i], strlen(v.tok[i]) };
	if ((rc = gpud_gguf_w_str(w, "tokenizer.ggml.model", "llama")) ||
	    (rc = gpud_gguf_w_str(w, "tokenizer.ggml.pre", "default")) ||
	    (rc = gpud_gguf_w_arr_str(w, "tokenizer.ggml.tokens", strs, v.n)) ||
	    (rc = gpud_gguf_w_arr(w, "tokenizer.ggml.scores", GPUD_GGUF_F32, v.score, v.n)) ||
	    (rc = gpud_gguf_w_arr(w, "tokenizer.ggml.token_type", GPUD_GGUF_I32, v.type, v.n)) ||
	    (rc = gpud_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0)) ||
	    (rc = gpud_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
	    (rc = gpud_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
	    (rc = gpud_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true)) ||
	    (rc = gpud_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false)))
		goto out_free;
	*n_vocab = v.n;
out_free:
	free(strs);
	vocab_free(&v);
	return rc;
}

static bool skip_non_tokenizer(const char *key, void *arg)
{
	(void)arg;
	return strncmp(key, "tokenizer.", 10) != 0;
}

/* --- model ----------------------------------------------------------------- */

static int validate(const struct gpud_mkmodel_params *p, char *err, size_t errlen)
{
	uint32_t be = gpud_type_block_elems(p->type);
	if (be == 0 || !gpud_type_traits(p->type)->matmul)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "mkmodel: type %s (%d) is not one of " GPUD_TYPE_SUPPORTED_NAMES,
				 gpud_type_name(p->type), (int)p->type);
	if ((p->mix == GPUD_MKMODEL_Q4_K_M && p->type != GPUD_TYPE_Q4_K) ||
	    (p->mix == GPUD_MKMODEL_Q5_K_M && p->type != GPUD_TYPE_Q5_K) ||
	    (unsigned)p->mix > GPUD_MKMODEL_Q5_K_M)
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: mix %d does not go with base type %s (q4_k_m is q4_k, q5_k_m q5_k)",
				 (int)p->mix, gpud_type_name(p->type));
	if (p->dim == 0 || p->dim > MK_MAX_DIM)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: dim %" PRIu32 " not in 1..%u",
				 p->dim, MK_MAX_DIM);
	if (p->n_layers == 0 || p->n_layers > MK_MAX_LAYERS)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: layers %" PRIu32 " not in 1..%d",
				 p->n_layers, MK_MAX_LAYERS);
	if (p->n_heads == 0 || p->n_heads > 4096 || (!p->head_dim && p->dim % p->n_heads))
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: heads %" PRIu32 " must divide dim %" PRIu32
				 " (or give --head-dim)", p->n_heads, p->dim);
	uint32_t hd = p->head_dim ? p->head_dim : p->dim / p->n_heads;
	if (hd % 2 || hd > 1024)
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: head dim %" PRIu32 " must be even (rope) and at most 1024",
				 hd);
	if ((uint64_t)p->n_heads * hd > MK_MAX_DIM * 4)
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: heads * head dim %" PRIu64 " is over %u",
				 (uint64_t)p->n_heads * hd, MK_MAX_DIM * 4);
	if (p->n_kv_heads == 0 || p->n_heads % p->n_kv_heads)
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: kv-heads %" PRIu32 " must divide heads %" PRIu32,
				 p->n_kv_heads, p->n_heads);
	if (p->ffn_dim == 0 || p->ffn_dim > MK_MAX_DIM * 4)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: ffn %" PRIu32 " not in 1..%u",
				 p->ffn_dim, MK_MAX_DIM * 4);
	if (be == GPUD_QK_K && (p->dim % GPUD_QK || p->ffn_dim % GPUD_QK))
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: dim %" PRIu32 " and ffn %" PRIu32 " must be multiples of 32 for %s "
				 "(a row that no 256-weight block fits takes a 32-weight type, as llama.cpp's files do)",
				 p->dim, p->ffn_dim, gpud_type_name(p->type));
	if (be == GPUD_QK_K)
		be = GPUD_QK;
	if (p->dim % be || p->ffn_dim % be || (p->n_heads * hd) % be)
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: dim %" PRIu32 ", ffn %" PRIu32 " and heads * head dim %" PRIu32
				 " must be multiples of the %s block size %" PRIu32,
				 p->dim, p->ffn_dim, p->n_heads * hd, gpud_type_name(p->type), be);
	if (p->n_ctx == 0)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: context must be at least 1");
	if (!(p->rope_base > 1.0f) || !isfinite(p->rope_base))
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: rope base %g must be > 1",
				 (double)p->rope_base);
	if (!(p->norm_eps > 0.0f) || !isfinite(p->norm_eps))
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: rms epsilon %g must be > 0",
				 (double)p->norm_eps);
	if (p->arch != GPUD_ARCH_LLAMA && p->arch != GPUD_ARCH_QWEN2 && p->arch != GPUD_ARCH_QWEN3)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: unknown architecture %d",
				 (int)p->arch);
	if (p->rope_scale_factor != 0.0f && p->arch != GPUD_ARCH_LLAMA)
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: Llama 3 rope scaling is for the llama architecture, not %s",
				 gpud_arch_name(p->arch));
	if (p->rope_yarn_factor != 0.0f &&
	    (p->rope_scale_factor != 0.0f || !(p->rope_yarn_factor >= 1.0f) ||
	     !isfinite(p->rope_yarn_factor) || p->n_ctx / p->rope_yarn_factor < 1.0f))
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: bad yarn rope scaling (factor %g, context %" PRIu32
				 "; not with Llama 3 scaling)", (double)p->rope_yarn_factor, p->n_ctx);
	if (p->rope_scale_factor != 0.0f &&
	    (!(p->rope_scale_factor >= 1.0f) || !isfinite(p->rope_scale_factor) ||
	     !(p->rope_low_freq_factor > 0.0f) ||
	     !(p->rope_high_freq_factor > p->rope_low_freq_factor) ||
	     !isfinite(p->rope_high_freq_factor) || p->rope_orig_ctx == 0))
		return sw_seterr(err, errlen, -EINVAL,
				 "mkmodel: bad Llama 3 rope scaling (factor %g, low %g, high %g, original context %" PRIu32 ")",
				 (double)p->rope_scale_factor, (double)p->rope_low_freq_factor,
				 (double)p->rope_high_freq_factor, p->rope_orig_ctx);
	return 0;
}

uint32_t gpud_mkmodel_file_type(const struct gpud_mkmodel_params *p)
{
	if (p->mix == GPUD_MKMODEL_Q4_K_M)
		return 15;              /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
	if (p->mix == GPUD_MKMODEL_Q5_K_M)
		return 17;
	switch (p->type) {
	case GPUD_TYPE_F16: return 1;   /* llama.cpp LLAMA_FTYPE_MOSTLY_F16 */
	case GPUD_TYPE_Q4_0: return 2;
	case GPUD_TYPE_Q4_1: return 3;
	case GPUD_TYPE_Q8_0: return 7;
	case GPUD_TYPE_Q5_0: return 8;
	case GPUD_TYPE_Q5_1: return 9;
	case GPUD_TYPE_IQ4_NL: return 25;
	case GPUD_TYPE_IQ4_XS: return 30;
	case GPUD_TYPE_Q2_K: return 10;
	case GPUD_TYPE_Q3_K: return 11; /* the nearest: Q3_K_S */
	case GPUD_TYPE_Q4_K: return 14; /* Q4_K_S */
	case GPUD_TYPE_Q5_K: return 16; /* Q5_K_S */
	case GPUD_TYPE_Q6_K: return 18;
	case GPUD_TYPE_BF16: return 32;
	default: return 0;              /* ALL_F32 */
	}
}

int gpud_mkmodel_parse_type(const char *s, enum gpud_type *type, enum gpud_mkmodel_mix *mix)
{
	int t;

	if (s && strcasecmp(s, "q4_k_m") == 0) {
		*type = GPUD_TYPE_Q4_K;
		*mix = GPUD_MKMODEL_Q4_K_M;
		return 0;
	}
	if (s && strcasecmp(s, "q5_k_m") == 0) {
		*type = GPUD_TYPE_Q5_K;
		*mix = GPUD_MKMODEL_Q5_K_M;
		return 0;
	}
	t = gpud_type_parse(s);
	if (t < 0 || !gpud_type_traits((enum gpud_type)t)->matmul)
		return -EINVAL;
	*type = (enum gpud_type)t;
	*mix = GPUD_MKMODEL_PURE;
	return 0;
}

/* llama.cpp's layers that get more bits in its _M mixes. */
static bool use_more_bits(uint32_t i, uint32_t n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2);
}

/* llama.cpp's type for a 256-weight type whose block does not fit a row
 * of `row` weights: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K, Q3_K
 * and IQ4_XS -> IQ4_NL (Qwen2.5-0.5B's rows of 896 in its Q4_K_M file). */
static enum gpud_type fit_row(enum gpud_type t, uint32_t row)
{
	if (gpud_type_block_elems(t) != GPUD_QK_K || row % GPUD_QK_K == 0)
		return t;
	switch (t) {
	case GPUD_TYPE_Q4_K: return GPUD_TYPE_Q5_0;
	case GPUD_TYPE_Q5_K: return GPUD_TYPE_Q5_1;
	case GPUD_TYPE_Q6_K: return GPUD_TYPE_Q8_0;
	default: return GPUD_TYPE_IQ4_NL;
	}
}

static enum gpud_type mix_type(const struct gpud_mkmodel_params *p, const char *name)
{
	unsigned layer;
	int end = 0;

	if (p->mix == GPUD_MKMODEL_PURE)
		return p->type;
	if (strcmp(name, "output.weight") == 0 ||
	    (p->tied && strcmp(name, "token_embd.weight") == 0))
		return GPUD_TYPE_Q6_K;
	if (sscanf(name, "blk.%u.%n", &layer, &end) == 1 && end > 0 &&
	    (strcmp(name + end, "attn_v.weight") == 0 || strcmp(name + end, "ffn_down.weight") == 0) &&
	    use_more_bits(layer, p->n_layers))
		return GPUD_TYPE_Q6_K;
	return p->type;
}

enum gpud_type gpud_mkmodel_tensor_type(const struct gpud_mkmodel_params *p, const char *name)
{
	size_t n = strlen(name), k = strlen("ffn_down.weight"), ko = strlen("attn_output.weight");
	/* rows of ffn_down are ffn_dim long, attn_output's heads * head_dim,
	 * every other matrix's dim */
	uint32_t row = p->dim;
	if (n >= k && strcmp(name + n - k, "ffn_down.weight") == 0)
		row = p->ffn_dim;
	else if (n >= ko && strcmp(name + n - ko, "attn_output.weight") == 0 && p->head_dim)
		row = p->n_heads * p->head_dim;

	return fit_row(mix_type(p, name), row);
}

struct build {
	struct gpud_gguf_writer *w;
	struct fill_arg *args;  /* (cap) one per tensor, alive until the write */
	size_t n, cap;
	uint64_t n_params;
};

static int add(struct build *b, const struct gpud_mkmodel_params *p, const char *name,
	       enum gpud_type type, uint32_t n_dims, uint64_t ne0, uint64_t ne1,
	       enum fill_kind kind, float std, uint32_t head_dim)
{
	uint64_t ne[2] = { ne0, ne1 };
	if (b->n == b->cap)
		return -ENOSPC;
	struct fill_arg *a = &b->args[b->n];
	uint64_t s = p->seed ^ ((uint64_t)(b->n + 1) * 0xa0761d6478bd642full);
	a->kind = kind;
	a->key = splitmix64(&s);
	a->amp = std * MK_UNIFORM_AMP;
	a->p = p;
	a->head_dim = head_dim;
	int rc = gpud_gguf_w_tensor_fill(b->w, name, type, n_dims, ne, fill, a);
	if (rc)
		return rc;
	b->n++;
	b->n_params += ne0 * (n_dims > 1 ? ne1 : 1);
	return 0;
}

/* Builds the whole writer (metadata and fill tensors) for p. */
static int build(struct build *b, const struct gpud_mkmodel_params *p,
		 struct gpud_mkmodel_plan *plan, char *err, size_t errlen)
{
	struct gpud_gguf *src = NULL;
	uint64_t n_vocab = 0;
	uint32_t hd = p->head_dim ? p->head_dim : p->dim / p->n_heads;
	uint32_t q_dim = p->n_heads * hd, kv_dim = p->n_kv_heads * hd;
	const char *arch = gpud_arch_name(p->arch);
	bool bias = p->arch == GPUD_ARCH_QWEN2 || p->qkv_bias;
	char name[64], key[64];
	int rc;

	memset(b, 0, sizeof(*b));
	if ((rc = validate(p, err, errlen)))
		return rc;
	b->cap = 4 + 14 * (size_t)p->n_layers;
	b->args = calloc(b->cap, sizeof(*b->args));
	if (!b->args || gpud_gguf_writer_new(&b->w))
		return sw_seterr(err, errlen, -ENOMEM, "mkmodel: out of memory");
	gpud_gguf_w_set_threads(b->w, 0); /* fill() is pure: rows on every CPU */

#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, arch), key)
	if ((rc = gpud_gguf_w_str(b->w, "general.architecture", arch)) ||
	    (rc = gpud_gguf_w_str(b->w, "general.name", p->name ? p->name : "mkmodel")) ||
	    (rc = gpud_gguf_w_u32(b->w, "general.file_type", gpud_mkmodel_file_type(p))) ||
	    (rc = gpud_gguf_w_u32(b->w, "general.quantization_version", 2)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("context_length"), p->n_ctx)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("embedding_length"), p->dim)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("block_count"), p->n_layers)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("feed_forward_length"), p->ffn_dim)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("attention.head_count"), p->n_heads)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("attention.head_count_kv"), p->n_kv_heads)) ||
	    (rc = gpud_gguf_w_f32(b->w, KEY("rope.freq_base"), p->rope_base)) ||
	    (rc = gpud_gguf_w_u32(b->w, KEY("rope.dimension_count"), hd)) ||
	    (rc = gpud_gguf_w_f32(b->w, KEY("attention.layer_norm_rms_epsilon"), p->norm_eps)) ||
	    (p->head_dim && ((rc = gpud_gguf_w_u32(b->w, KEY("attention.key_length"), hd)) ||
			     (rc = gpud_gguf_w_u32(b->w, KEY("attention.value_length"), hd)))))
		return sw_seterr(err, errlen, rc, "mkmodel: metadata: %s", sw_strerror(rc));
	if (p->rope_yarn_factor != 0.0f &&
	    ((rc = gpud_gguf_w_str(b->w, KEY("rope.scaling.type"), "yarn")) ||
	     (rc = gpud_gguf_w_f32(b->w, KEY("rope.scaling.factor"), p->rope_yarn_factor)) ||
	     (rc = gpud_gguf_w_u32(b->w, KEY("rope.scaling.original_context_length"),
				   (uint32_t)(p->n_ctx / p->rope_yarn_factor)))))
		return sw_seterr(err, errlen, rc, "mkmodel: metadata: %s", sw_strerror(rc));

	if (p->vocab_from) {
		enum gpud_gguf_vtype et;
		if ((rc = gpud_gguf_open(&src, p->vocab_from, err, errlen)))
			return rc;
		rc = gpud_gguf_get_arr(src, "tokenizer.ggml.tokens", &et, &n_vocab);
		if (rc || et != GPUD_GGUF_STRING || n_vocab == 0 || n_vocab > INT32_MAX) {
			gpud_gguf_close(src);
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "mkmodel: %s: no usable tokenizer.ggml.tokens string array",
					 p->vocab_from);
		}
		rc = gpud_gguf_w_copy_kv(b->w, src, skip_non_tokenizer, NULL);
		gpud_gguf_close(src);
		if (rc)
			return sw_seterr(err, errlen, rc, "mkmodel: copying the vocabulary of %s: %s",
					 p->vocab_from, sw_strerror(rc));
	} else if ((rc = write_byte_vocab(b->w, &n_vocab))) {
		return sw_seterr(err, errlen, rc, "mkmodel: byte vocabulary: %s", sw_strerror(rc));
	}
	if ((rc = gpud_gguf_w_u32(b->w, KEY("vocab_size"), (uint32_t)n_vocab)))
		return sw_seterr(err, errlen, rc, "mkmodel: metadata: %s", sw_strerror(rc));

	float out_std = MK_WEIGHT_STD / sqrtf(2.0f * (float)p->n_layers);
	rc = add(b, p, "token_embd.weight", gpud_mkmodel_tensor_type(p, "token_embd.weight"), 2,
		 p->dim, n_vocab, FILL_UNIFORM,
		 MK_WEIGHT_STD, hd);
	if (!rc && p->rope_scale_factor != 0.0f)
		rc = add(b, p, "rope_freqs.weight", GPUD_TYPE_F32, 1, hd / 2, 1, FILL_ROPE, 0, hd);
	if (!rc)
		rc = add(b, p, "output_norm.weight", GPUD_TYPE_F32, 1, p->dim, 1, FILL_ONES, 0, hd);
	if (!rc && !p->tied)
		rc = add(b, p, "output.weight", gpud_mkmodel_tensor_type(p, "output.weight"), 2,
			 p->dim, n_vocab, FILL_UNIFORM,
			 MK_WEIGHT_STD, hd);
	for (uint32_t l = 0; l < p->n_layers && !rc; l++) {
		static const struct {
			const char *name;
			int shape;  /* 0 norm, 1 [dim,q], 2 [dim,kv], 3 [dim,ffn], 4 [ffn,dim],
				     * 5 bias [q], 6 bias [kv], 7 [q,dim], 8 head norm [hd] */
			bool residual_out;
		} parts[] = {
			{ "attn_norm", 0, false }, { "attn_q", 1, false },
			{ "attn_k", 2, false }, { "attn_v", 2, false },
			{ "attn_q", 5, false }, { "attn_k", 6, false }, { "attn_v", 6, false },
			{ "attn_q_norm", 8, false }, { "attn_k_norm", 8, false },
			{ "attn_output", 7, true }, { "ffn_norm", 0, false },
			{ "ffn_gate", 3, false }, { "ffn_up", 3, false },
			{ "ffn_down", 4, true },
		};
		for (size_t k = 0; k < sizeof(parts) / sizeof(parts[0]) && !rc; k++) {
			bool is_bias = parts[k].shape == 5 || parts[k].shape == 6;
			if ((is_bias && !bias) || (parts[k].shape == 8 && p->arch != GPUD_ARCH_QWEN3))
				continue;
			snprintf(name, sizeof(name), "blk.%" PRIu32 ".%s.%s", l, parts[k].name,
				 is_bias ? "bias" : "weight");
			float std = parts[k].residual_out ? out_std : MK_WEIGHT_STD;
			enum gpud_type mt = gpud_mkmodel_tensor_type(p, name);
			switch (parts[k].shape) {
			case 0:
				rc = add(b, p, name, GPUD_TYPE_F32, 1, p->dim, 1, FILL_ONES, 0, hd);
				break;
			case 1:
				rc = add(b, p, name, mt, 2, p->dim, q_dim, FILL_UNIFORM, std, hd);
				break;
			case 7:
				rc = add(b, p, name, mt, 2, q_dim, p->dim, FILL_UNIFORM, std, hd);
				break;
			case 8: /* around 1, so that Q's and K's weights differ */
				rc = add(b, p, name, GPUD_TYPE_F32, 1, hd, 1, FILL_NEAR_ONE, 0.5f, hd);
				break;
			case 2:
				rc = add(b, p, name, mt, 2, p->dim, kv_dim, FILL_UNIFORM, std, hd);
				break;
			case 3:
				rc = add(b, p, name, mt, 2, p->dim, p->ffn_dim, FILL_UNIFORM, std, hd);
				break;
			case 4:
				rc = add(b, p, name, mt, 2, p->ffn_dim, p->dim, FILL_UNIFORM, std, hd);
				break;
			case 5:
				rc = add(b, p, name, GPUD_TYPE_F32, 1, q_dim, 1, FILL_UNIFORM,
					 MK_BIAS_STD, hd);
				break;
			default:
				rc = add(b, p, name, GPUD_TYPE_F32, 1, kv_dim, 1, FILL_UNIFORM,
					 MK_BIAS_STD, hd);
				break;
			}
		}
	}
#undef KEY
	if (rc)
		return sw_seterr(err, errlen, rc, "mkmodel: tensor: %s", sw_strerror(rc));
	if (plan) {
		plan->n_vocab = n_vocab;
		plan->head_dim = hd;
		plan->n_tensors = b->n;
		plan->n_params = b->n_params;
		gpud_gguf_w_size(b->w, &plan->file_bytes);
	}
	return 0;
}

static void build_free(struct build *b)
{
	gpud_gguf_writer_free(b->w);
	free(b->args);
}

int gpud_mkmodel_plan(const struct gpud_mkmodel_params *p, struct gpud_mkmodel_plan *plan,
		      char *err, size_t errlen)
{
	struct build b;
	struct gpud_mkmodel_plan tmp;
	if (!p)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: no parameters");
	int rc = build(&b, p, plan ? plan : &tmp, err, errlen);
	build_free(&b);
	return rc;
}

int gpud_mkmodel(const struct gpud_mkmodel_params *p, char *err, size_t errlen)
{
	struct build b;
	if (!p || !p->out)
		return sw_seterr(err, errlen, -EINVAL, "mkmodel: no output path");
	int rc = build(&b, p, NULL, err, errlen);
	if (!rc)
		rc = gpud_gguf_w_write(b.w, p->out, err, errlen);
	build_free(&b);
	return rc;
}
