/* rope.h - rotary position embedding on the CPU, in either pairing style.
 *
 * The forward pass builds one table of (cos, sin) per token position
 * (gpud_rope_table) and rotates that token's Q and K heads with it
 * (gpud_rope_apply). gpud_rope_shift rotates rows already stored (cached
 * K) by a position delta, for re-using KV computed at other positions: the
 * angle is delta * inv_freq[i], so a K row roped at position p and shifted
 * by d equals, up to float rounding, the row roped at p + d; a negative d
 * rotates back.
 *
 * Styles (enum gpud_rope_style, gpud/model.h; the model's hparams say
 * which): NORM rotates adjacent pairs (x[2i], x[2i+1]) (llama), NEOX the
 * halves (x[i], x[i + head_dim/2]) (qwen2); pair i turns by
 * pos * inv_freq[i] in both, inv_freq being the model's
 * (gpud_model_weights.rope_inv_freq, scaling applied).
 *
 * Angles are computed in double and their cos/sin rounded to float once, so
 * the rotation of a row depends only on its values, the position and the
 * model: never on the batch or the thread. Nothing allocates or fails; any
 * thread may call these.
 */
#ifndef GPUD_BACKEND_CPU_ROPE_H
#define GPUD_BACKEND_CPU_ROPE_H

#include <stdint.h>

#include "gpud/model.h"

/* cs[2i] = cos(pos * inv_freq[i]), cs[2i + 1] = sin(...) for i < half
 * (half = head_dim / 2). pos may be negative (a shift back). */
void gpud_rope_table(float *cs, const float *inv_freq, uint32_t half, int64_t pos);

/* Rotates the n_heads consecutive heads of head_dim floats at x by the
 * angles of cs (gpud_rope_table), pairing elements per style. */
void gpud_rope_apply(float *x, const float *cs, uint32_t n_heads, uint32_t head_dim,
		     enum gpud_rope_style style);

/* Rotates the n_heads heads at x by delta positions (negative: back):
 * gpud_rope_apply with the table of delta, computed on the fly (no
 * scratch). For a cached K row of a model m: n_heads = n_kv_heads,
 * style = gpud_model_hparams(m)->rope_style,
 * inv_freq = gpud_model_weights(m)->rope_inv_freq. */
void gpud_rope_shift(float *x, uint32_t n_heads, uint32_t head_dim,
		     enum gpud_rope_style style, const float *inv_freq, int64_t delta);

#endif
