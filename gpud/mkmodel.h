/* mkmodel.h - write a Llama or Qwen2 GGUF with deterministic random weights.
 *
 * For tests and benchmarks that need a model of a given shape (up to
 * Llama-3.2-3B, Qwen2.5-3B and beyond) without downloading one. Weights come from a
 * seeded counter-based PRNG (splitmix64 of seed, tensor and row), so the
 * same parameters always give byte-identical files, and each row is
 * produced on its own: the file is streamed through the GGUF writer's fill
 * callback and the model is never held in memory.
 *
 * Weights are uniform with standard deviation 0.02 (residual output
 * projections attn_output and ffn_down scaled by 1/sqrt(2 * n_layers)),
 * norms are 1, so activations of a random model stay in range. Qwen2
 * files (and llama files asking for them) also get F32 Q/K/V biases (blk.N.attn_{q,k,v}.bias), uniform with
 * standard deviation 0.1 so that they matter next to the projections.
 * Qwen3 files get no biases and F32 per-head Q and K norms
 * (blk.N.attn_{q,k}_norm.weight, head_dim each), uniform in [0.5, 1.5).
 * The bytes of every tensor depend on its index in the file, not on the
 * architecture: a qwen2 file and a llama file with biases of the same
 * parameters hold the same tensors.
 */
#ifndef GPUD_MKMODEL_H
#define GPUD_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/model.h"
#include "gpud/quant.h"

/* Per-tensor type choice. PURE: every matrix in `type`. The K mixes
 * follow llama.cpp's recipes of the same names (type is their base, Q4_K
 * or Q5_K): Q6_K for output.weight (token_embd.weight when the embeddings
 * are tied, as it then serves as the output), and for attn_v and ffn_down
 * in layers i where i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2 (n layers);
 * the base type everywhere else. */
enum gpud_mkmodel_mix {
	GPUD_MKMODEL_PURE = 0,
	GPUD_MKMODEL_Q4_K_M,
	GPUD_MKMODEL_Q5_K_M,
};

struct gpud_mkmodel_params {
	const char *out;        /* output path (written atomically) */
	const char *name;       /* general.name; NULL = "mkmodel" */
	enum gpud_arch arch;    /* general.architecture; keys below are "<arch>.*" */
	uint32_t dim;           /* embedding_length */
	uint32_t n_layers;      /* block_count */
	uint32_t n_heads;       /* attention.head_count; dim % n_heads == 0
				 * unless head_dim is set */
	uint32_t head_dim;      /* attention.key_length and value_length (Mistral
				 * NeMo's 128 where dim / heads is 160); 0: dim /
				 * n_heads, and the keys are not written */
	uint32_t n_kv_heads;    /* attention.head_count_kv; divides n_heads */
	uint32_t ffn_dim;       /* feed_forward_length */
	uint32_t n_ctx;         /* context_length */
	float rope_base;        /* rope.freq_base */
	float norm_eps;         /* attention.layer_norm_rms_epsilon */
	enum gpud_type type;    /* token_embd, output and the layer matrices;
				 * norms and rope_freqs are always F32 */
	enum gpud_mkmodel_mix mix; /* PURE, or a K mix with its base type */
	uint64_t seed;
	bool tied;              /* omit output.weight (tied embeddings) */
	bool qkv_bias;          /* write Q/K/V biases on a llama file too
				 * (always written for qwen2) */
	/* Vocabulary: all tokenizer.* keys of this GGUF, or when NULL the
	 * built-in SentencePiece-style byte vocabulary ("<unk>", "<s>", "</s>",
	 * "<0x00>".."<0xFF>", then common pieces; bos 1, eos 2). */
	const char *vocab_from;
	/* Llama 3 rope scaling (llama only); factor 0 = none. When set, a
	 * rope_freqs.weight tensor (F32, head_dim/2 per-pair divisors, as
	 * llama.cpp converts Llama 3.1+) is written. */
	float rope_scale_factor;      /* Llama 3.2: 32 */
	float rope_low_freq_factor;   /* 1 */
	float rope_high_freq_factor;  /* 4 */
	uint32_t rope_orig_ctx;       /* 8192 */
	/* YaRN (any architecture; not with the above); factor 0 = none. When
	 * set, <arch>.rope.scaling.type "yarn", its factor and
	 * original_context_length (the context over the factor, as Qwen2.5's
	 * 4 x 32768 = 131072) are written. */
	float rope_yarn_factor;
};

/* What gpud_mkmodel_plan() computes without writing anything. */
struct gpud_mkmodel_plan {
	uint64_t n_vocab;
	uint32_t head_dim;
	uint64_t n_tensors;
	uint64_t n_params;      /* elements in all tensors */
	uint64_t file_bytes;    /* exact size of the file gpud_mkmodel writes */
};

/* A tiny default model: llama, dim 64, 2 layers, 4 heads, 2 kv heads,
 * ffn 128, context 512, rope base 10000, eps 1e-5, F32, seed 1, byte
 * vocabulary, no output path. */
void gpud_mkmodel_params_default(struct gpud_mkmodel_params *p);

/* Fills p with a named shape: "tiny" (the default shape; the architecture
 * is kept), "llama-3.2-3b" (llama, dim 3072, 28 layers, 24 heads, 8 kv
 * heads, ffn 8192, context 131072, rope base 500000 with Llama 3 scaling,
 * eps 1e-5, tied embeddings; its vocabulary must come from vocab_from, e.g.
 * the 128256-token llama-bpe GGUF) or "qwen2.5-3b" (qwen2, dim 2048, 36
 * layers, 16 heads, 2 kv heads, ffn 11008, context 32768, rope base 1e6,
 * eps 1e-6, tied embeddings, as Qwen2.5-3B's config; vocabulary from
 * vocab_from, e.g. the qwen2 vocabulary GGUF), or "qwen2.5-0.5b" (qwen2,
 * dim 896, 24 layers, 14 heads, 2 kv heads, ffn 4864, the rest as
 * qwen2.5-3b: rows of 896 that no K-quant block fits). The type, seed,
 * name and paths keep their values. Returns 0 or SW_ENOTFOUND. */
int gpud_mkmodel_preset(struct gpud_mkmodel_params *p, const char *name);

/* Parses a --type value: any weight type's name (gpud_type_parse; not
 * q8_k, an activation format) or "q4_k_m" / "q5_k_m", any case, into
 * *type and *mix. Returns 0, or -EINVAL (nothing changed). */
#define GPUD_MKMODEL_TYPE_NAMES \
	"f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, " \
	"q6_k, q4_k_m, q5_k_m"
int gpud_mkmodel_parse_type(const char *s, enum gpud_type *type, enum gpud_mkmodel_mix *mix);

/* The type p gives tensor `name` (a llama.cpp tensor name such as
 * "blk.3.attn_v.weight"), matrices only: the mix rules above; then, as
 * llama.cpp does, a K-quant whose rows (dim long; ffn_down's ffn_dim) are
 * not a multiple of 256 takes a 32-weight type instead: Q4_K -> Q5_0,
 * Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS -> IQ4_NL (so dim and ffn_dim need
 * only be multiples of 32 with a K type). */
enum gpud_type gpud_mkmodel_tensor_type(const struct gpud_mkmodel_params *p, const char *name);

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) for p's type and mix:
 * 7 Q8_0, 15 Q4_K_M, 0 all F32, ... */
uint32_t gpud_mkmodel_file_type(const struct gpud_mkmodel_params *p);

/* Validates p (shape divisibility, block sizes of the chosen type, ranges),
 * opens vocab_from when set, and computes the plan. Writes nothing. On
 * error returns a negative code and err names the bad parameter. */
int gpud_mkmodel_plan(const struct gpud_mkmodel_params *p, struct gpud_mkmodel_plan *plan,
		      char *err, size_t errlen);

/* Validates p and writes the model to p->out. Memory use is a batch of
 * rows (8 MiB of output) plus the vocabulary, whatever the model size. On error nothing is left
 * at p->out (an existing file there is kept), a negative code is returned
 * and err says why. */
int gpud_mkmodel(const struct gpud_mkmodel_params *p, char *err, size_t errlen);

#endif
