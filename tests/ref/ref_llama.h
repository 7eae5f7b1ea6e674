/* ref_llama.h - a plain double-precision Llama / Qwen2 / Qwen3 forward pass
 * for tests.
 *
 * The reference shares no code with the fast path (gpud/model.c,
 * gpud/backend/cpu/): it uses the GGUF reader only to find metadata and
 * tensor bytes, then dequantizes F32/F16/BF16/Q8_0/Q4_0/Q2_K..Q6_K itself
 * into doubles, and runs straightforward loops: RMSNorm, Q/K/V (plus their
 * biases when the file has them: always for qwen2; for qwen3 an RMSNorm of
 * each Q and K head with attn_{q,k}_norm), RoPE (with Llama 3
 * frequency scaling when the file asks for it) on adjacent pairs for
 * general.architecture "llama" and on halves (NEOX style: element i with
 * i + head_dim/2) for "qwen2" and "qwen3", metadata keys "<arch>.*"; attention under a dense T x T mask built directly from the
 * descriptor semantics of DESIGN §3, SwiGLU, tied output when output.weight
 * is absent. Clarity over speed: it recomputes the whole sequence.
 */
#ifndef REF_LLAMA_H
#define REF_LLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/mask.h"

struct ref_llama;

struct ref_llama_info {
	uint32_t n_vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, n_ctx;
	double norm_eps, rope_base;
	bool rope_scaled, tied_output;
	bool neox;     /* qwen2, qwen3: RoPE pairs (i, i + head_dim/2) */
	bool qkv_bias; /* attn_{q,k,v}.bias loaded */
	bool qk_norm;  /* qwen3: each Q and K head RMS-normed before RoPE */
};

/* Loads and dequantizes every weight of path into doubles. Returns 0 or a
 * negative code with a message; *out is NULL on failure. */
int ref_llama_load(struct ref_llama **out, const char *path, char *err, size_t errlen);
void ref_llama_free(struct ref_llama *m); /* accepts NULL */
const struct ref_llama_info *ref_llama_info(const struct ref_llama *m);

/* Dense visibility: vis[q * n + k] = k <= q and seg(k) in vis-row of
 * seg(q) (self always), where segment i covers seg_tokens[i] positions in
 * order and every position past them belongs to G (index S). desc NULL or
 * desc->rows NULL: plain causal. desc must be valid (proto_mask_validate). */
void ref_mask_dense(const struct proto_mask_desc *desc, const uint32_t *seg_tokens, uint32_t n,
		    bool *vis);

/* Runs tokens[0..n) at positions 0..n-1 and writes n rows of n_vocab
 * logits to logits (caller memory). desc/seg_tokens as for
 * ref_mask_dense. hidden, when not NULL, receives the n rows of dim final
 * (normed) hidden states. Returns 0, -EINVAL for a token out of range, or
 * -ENOMEM. */
int ref_llama_forward(const struct ref_llama *m, const int32_t *tokens, uint32_t n,
		      const struct proto_mask_desc *desc, const uint32_t *seg_tokens,
		      double *logits, double *hidden);

/* With on, the forward pass rounds each K (after RoPE) and V to the
 * nearest IEEE half before attention reads it, as a KV cache of f16 does
 * (gpud.kv_type "f16"); default off. */
void ref_llama_set_kv_half(struct ref_llama *m, bool on);

/* Dequantizes one tensor row of n elements of ggml type `type` (the
 * reference's own decoder; exposed for its self-test). Returns 0 or
 * -EINVAL for an unsupported type. */
int ref_dequant_row(int type, const void *src, uint64_t n, double *dst);

#endif
