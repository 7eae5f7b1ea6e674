/* model.h - Llama, Qwen2 and Qwen3 architecture models from GGUF files.
 *
 * gpud_model_load() maps the file (through the GGUF reader), checks the
 * architecture ("llama", "qwen2" or "qwen3"), reads the hyper-parameters (keys
 * "<arch>.*") and resolves every weight tensor by its llama.cpp name,
 * checking type and shape. Weights are used in place inside the mapping:
 * nothing is copied. Supported weight types are those of gguf.h (F32, F16,
 * BF16, Q8_0, Q4_0, Q2_K..Q6_K, so Q4_K_M and the other llama.cpp mixes);
 * norms and biases must be F32. K-quant matrices are scanned once at load
 * for non-finite block factors.
 *
 * Covered: Llama 2 and Llama 3.x (grouped-query attention via
 * head_count_kv, rope.freq_base, Llama 3 RoPE frequency scaling from a
 * rope_freqs.weight tensor or <arch>.rope.scaling.* metadata with type
 * "llama3", linear scaling (type "linear", <arch>.rope.scaling.factor),
 * YaRN (type "yarn": factor, original_context_length, the yarn_* keys;
 * Qwen2.5's long-context setting), output projection tied to
 * token_embd.weight when output.weight is absent). Other scaling types
 * (longrope) are refused.
 * Qwen2 / Qwen2.5 ("qwen2"): the same block with F32 biases on the Q, K and
 * V projections (blk.N.attn_{q,k,v}.bias, required) and NEOX-style RoPE;
 * rope base, context, rms epsilon and tied output come from the file as for
 * llama. A llama file may carry the same biases (used when present).
 * Qwen3 ("qwen3"): no biases; each head of Q and of K RMS-normed with its
 * own weights (blk.N.attn_{q,k}_norm.weight, head_dim long, required)
 * before NEOX RoPE. Heads are attention.key_length wide when the file says
 * so (Qwen3, Mistral NeMo), else dim / heads.
 *
 * RoPE: pair i of each head is rotated by pos * inv_freq[i],
 * inv_freq[i] = base^(-2i/head_dim) divided by the scaling factor of pair i
 * where scaling applies. Which elements form pair i is the model's
 * rope_style (llama.cpp's rope types): llama uses NORM, adjacent pairs
 * (x[2i], x[2i+1]) in GGUF's permuted Q/K layout; qwen2 and qwen3 use NEOX, the
 * halves (x[i], x[i + head_dim/2]) as the Hugging Face weights are.
 *
 * A loaded model is immutable and may be shared by several engines and
 * threads.
 */
#ifndef GPUD_MODEL_H
#define GPUD_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/gguf.h"

struct gpud_tokenizer;

/* The architectures gpud_model_load() accepts (general.architecture). */
enum gpud_arch {
	GPUD_ARCH_LLAMA = 0, /* "llama" */
	GPUD_ARCH_QWEN2 = 1, /* "qwen2" */
	GPUD_ARCH_QWEN3 = 2, /* "qwen3": qwen2 without the Q/K/V biases, with
			      * an RMSNorm of each Q and K head before RoPE */
};

/* Which elements of a head RoPE rotates together (llama.cpp's rope type). */
enum gpud_rope_style {
	GPUD_ROPE_NORM = 0, /* adjacent pairs (x[2i], x[2i+1]): llama */
	GPUD_ROPE_NEOX = 1, /* halves (x[i], x[i + head_dim/2]): qwen2, qwen3 */
};

struct gpud_model_hparams {
	enum gpud_arch arch;
	enum gpud_rope_style rope_style; /* fixed by the architecture */
	bool qkv_bias;       /* layers carry attn_{q,k,v}.bias */
	uint32_t n_vocab;    /* rows of token_embd */
	uint32_t dim;        /* embedding_length */
	uint32_t n_layers;   /* block_count */
	uint32_t n_heads;    /* attention.head_count */
	uint32_t n_kv_heads; /* attention.head_count_kv (defaults to n_heads) */
	uint32_t head_dim;   /* attention.key_length, else dim / n_heads */
	uint32_t ffn_dim;    /* feed_forward_length */
	uint32_t n_ctx;      /* context_length: the hard limit on positions */
	float norm_eps;      /* attention.layer_norm_rms_epsilon (1e-5 if absent) */
	float rope_base;     /* rope.freq_base (10000 if absent) */
	bool rope_scaled;    /* Llama 3, linear or YaRN frequency factors were applied */
	float attn_scale;    /* attention logits' scale: 1/sqrt(head_dim), times YaRN's
			      * mscale^2 (its cos and sin scaled by mscale) */
	bool tied_output;    /* output.weight absent: logits use token_embd */
};

/* One weight matrix in the mapping: rows x cols, row-major, in `type`
 * (a GGUF tensor with ne[0] = cols, ne[1] = rows). */
struct gpud_weight {
	enum gpud_type type;
	int64_t rows;
	int64_t cols;
	const void *data; /* into the mapping; owned by the model */
	bool packed;      /* data is in the CPU kernels' packed layout
			   * (backend/cpu/kernels.h); set only on the CPU
			   * backend's own copies, never by the model */
};

struct gpud_layer_weights {
	const float *attn_norm;   /* (dim) F32 */
	struct gpud_weight wq;    /* (n_heads*head_dim, dim) */
	struct gpud_weight wk;    /* (n_kv_heads*head_dim, dim) */
	struct gpud_weight wv;    /* (n_kv_heads*head_dim, dim) */
	const float *bq;          /* (n_heads*head_dim) F32, or NULL: no biases */
	const float *bk;          /* (n_kv_heads*head_dim) F32; NULL iff bq is */
	const float *bv;          /* (n_kv_heads*head_dim) F32; NULL iff bq is */
	const float *q_norm;      /* (head_dim) F32: RMSNorm weights of each Q head
				   * before RoPE (qwen3), or NULL */
	const float *k_norm;      /* (head_dim) F32, the same for K; NULL iff q_norm is */
	struct gpud_weight wo;    /* (dim, n_heads*head_dim) */
	const float *ffn_norm;    /* (dim) F32 */
	struct gpud_weight w_gate; /* (ffn_dim, dim) */
	struct gpud_weight w_up;   /* (ffn_dim, dim) */
	struct gpud_weight w_down; /* (dim, ffn_dim) */
};

struct gpud_model_weights {
	struct gpud_weight tok_embd;       /* (n_vocab, dim) */
	const struct gpud_layer_weights *layers; /* (n_layers) */
	const float *out_norm;             /* (dim) F32 */
	struct gpud_weight output;         /* (n_vocab, dim); == tok_embd when tied */
	const float *rope_inv_freq;        /* (head_dim/2) scaling applied; owned by the model */
};

struct gpud_model;

/* Loads path. On success *out owns the mapping and the tokenizer and 0 is
 * returned. On failure *out is NULL, nothing stays mapped, and err holds
 * "<path>: <cause>" (unsupported architecture, missing tensor "name",
 * tensor "name" has shape [..] expected [..], unsupported type, ...).
 * Codes: the reader's, SW_EUNSUPPORTED, SW_ENOTFOUND, SW_EFORMAT, SW_ETYPE,
 * -ENOMEM. */
int gpud_model_load(struct gpud_model **out, const char *path, char *err, size_t errlen);

void gpud_model_free(struct gpud_model *m); /* accepts NULL */

/* Hyper-parameters and weights; owned by the model, valid until it is freed. */
const struct gpud_model_hparams *gpud_model_hparams(const struct gpud_model *m);
const struct gpud_model_weights *gpud_model_weights(const struct gpud_model *m);
/* The tokenizer built from the file's metadata; owned by the model. */
const struct gpud_tokenizer *gpud_model_tokenizer(const struct gpud_model *m);
/* The underlying reader (metadata lookups); owned by the model. */
const struct gpud_gguf *gpud_model_gguf(const struct gpud_model *m);
/* The path given to gpud_model_load (a copy owned by the model). */
const char *gpud_model_path(const struct gpud_model *m);
/* The weight matrices, in file-independent order: token_embd, output
 * (unless tied), then each layer's wq, wk, wv, wo, w_gate, w_up, w_down.
 * Writes the first cap of them to out (out may be NULL when cap is 0) and
 * returns how many there are. */
size_t gpud_model_matrices(const struct gpud_model *m, const struct gpud_weight **out,
			   size_t cap);
/* Bytes of all weight tensors the forward pass reads once per step. */
size_t gpud_model_weight_bytes(const struct gpud_model *m);

/* "llama", "qwen2"; "?" for a value out of range. */
const char *gpud_arch_name(enum gpud_arch a);
/* The architecture named s (len bytes, not terminated): 0 and *out set,
 * or SW_EUNSUPPORTED. */
int gpud_arch_parse(const char *s, size_t len, enum gpud_arch *out);
/* The RoPE style architecture a uses. */
enum gpud_rope_style gpud_arch_rope_style(enum gpud_arch a);

/* Fills inv_freq[head_dim/2] for base, applying Llama 3 scaling when
 * factors is not NULL (per-pair divisors). Exposed for the reference. */
void gpud_rope_inv_freq(float *inv_freq, uint32_t head_dim, float base, const float *factors);

#endif
