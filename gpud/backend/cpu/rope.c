/* rope.c - rotary position embedding, NORM and NEOX pairings (rope.h). */
#include "gpud/backend/cpu/rope.h"

#include <math.h>

void gpud_rope_table(float *cs, const float *inv_freq, uint32_t half, int64_t pos)
{
	for (uint32_t i = 0; i < half; i++) {
		double a = (double)pos * (double)inv_freq[i];
		cs[2 * i] = (float)cos(a);
		cs[2 * i + 1] = (float)sin(a);
	}
}

/* (a, b) -> (a c - b s, a s + b c) on elements i0 and i1 of each head. */
static inline void turn(float *v, uint32_t i0, uint32_t i1, float c, float s)
{
	float a = v[i0], b = v[i1];
	v[i0] = a * c - b * s;
	v[i1] = a * s + b * c;
}

void gpud_rope_apply(float *x, const float *cs, uint32_t n_heads, uint32_t head_dim,
		     enum gpud_rope_style style)
{
	uint32_t half = head_dim / 2;

	for (uint32_t h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * head_dim;
		if (style == GPUD_ROPE_NEOX)
			for (uint32_t i = 0; i < half; i++)
				turn(v, i, i + half, cs[2 * i], cs[2 * i + 1]);
		else
			for (uint32_t i = 0; i < half; i++)
				turn(v, 2 * i, 2 * i + 1, cs[2 * i], cs[2 * i + 1]);
	}
}

void gpud_rope_shift(float *x, uint32_t n_heads, uint32_t head_dim,
		     enum gpud_rope_style style, const float *inv_freq, int64_t delta)
{
	uint32_t half = head_dim / 2;

	for (uint32_t i = 0; i < half; i++) {
		double a = (double)delta * (double)inv_freq[i];
		float c = (float)cos(a), s = (float)sin(a);
		for (uint32_t h = 0; h < n_heads; h++) {
			float *v = x + (size_t)h * head_dim;
			if (style == GPUD_ROPE_NEOX)
				turn(v, i, i + half, c, s);
			else
				turn(v, 2 * i, 2 * i + 1, c, s);
		}
	}
}
