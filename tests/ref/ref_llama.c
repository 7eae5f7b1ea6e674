/* ref_llama.c - the double-precision reference Llama (see ref_llama.h).
 *
 * Everything is a plain loop over doubles. Weight matrices are stored
 * dequantized as W[r * cols + c] (row r = output element r).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "tests/ref/ref_llama.h"

struct ref_mat {
	uint64_t rows, cols;
	double *w; /* (rows, cols) */
};

struct ref_layer {
	double *attn_norm; /* (dim) */
	struct ref_mat wq, wk, wv, wo;
	double *bq, *bk, *bv; /* (q dim), (kv dim), (kv dim); NULL without biases */
	double *q_norm, *k_norm; /* (head_dim) each; NULL without (not qwen3) */
	double *ffn_norm;  /* (dim) */
	struct ref_mat gate, up, down;
};

struct ref_llama {
	struct ref_llama_info info;
	struct ref_mat embd;   /* (n_vocab, dim) */
	struct ref_layer *layers;
	double *out_norm;      /* (dim) */
	struct ref_mat output; /* (n_vocab, dim); a copy of embd when tied */
	double *inv_freq;      /* (head_dim / 2) */
	double mscale;         /* YaRN's magnitude on cos and sin (1 without) */
	bool kv_half;          /* K (after RoPE) and V rounded to IEEE half */
};

/* --- the reference's own decoders (ggml block formats) ----------------- */

static uint16_t rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static double half_to_double(uint16_t h)
{
	int sign = h >> 15, e = (h >> 10) & 31, mant = h & 1023;
	double v;

	if (e == 0)
		v = ldexp(mant, -24); /* subnormal */
	else if (e == 31)
		v = mant ? NAN : INFINITY;
	else
		v = ldexp(mant + 1024, e - 25);
	return sign ? -v : v;
}

/* x rounded to the nearest IEEE half (ties to even: nearbyint in the
 * default rounding mode), as a double: 11 significant bits down to 2^-14,
 * then a fixed step of 2^-24 (subnormals); past 65504 + half a step, inf. */
static double round_half(double x)
{
	double a = fabs(x), step;
	int e;

	if (!(a < INFINITY))
		return x; /* NaN, inf */
	if (a >= 65520.0)
		return copysign(INFINITY, x);
	frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
	step = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
	return copysign(nearbyint(a / step) * step, x);
}

static double bf16_to_double(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, sizeof(f));
	return f;
}

/* K-quant super-blocks of 256 (Q2_K 10 .. Q6_K 14), in double: their
 * bytes per block, then one block's weights, walking the bytes in
 * the file's order (GGUF/ggml layouts). */
static uint64_t kq_bytes(int type)
{
	static const uint64_t b[] = { 84, 110, 144, 176, 210 };

	return b[type - 10];
}

/* Q4_K/Q5_K: 6-bit scale and min j of the 12 packed bytes. */
static void kq_sm(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
		*m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
	}
}

static void kq_block(int type, const uint8_t *blk, double *y)
{
	switch (type) {
	case 10: { /* scales[16] qs[64] d dmin */
		double d = half_to_double(rd16(blk + 80)), dm = half_to_double(rd16(blk + 82));

		for (int half = 0; half < 2; half++)
			for (int sh = 0; sh < 4; sh++)
				for (int l = 0; l < 32; l++) {
					int sc = blk[8 * half + 2 * sh + l / 16];
					int q = (blk[16 + 32 * half + l] >> (2 * sh)) & 3;

					*y++ = d * (sc & 15) * q - dm * (sc >> 4);
				}
		break;
	}
	case 11: { /* hmask[32] qs[64] scales[12] d */
		double d = half_to_double(rd16(blk + 108));
		const uint8_t *s = blk + 96;

		for (int half = 0; half < 2; half++)
			for (int sh = 0; sh < 4; sh++)
				for (int l = 0; l < 32; l++) {
					int j = 8 * half + 2 * sh + l / 16;
					int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
					int sc = (lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
					int q = (blk[32 + 32 * half + l] >> (2 * sh)) & 3;
					int hb = (blk[l] >> (4 * half + sh)) & 1;

					*y++ = d * sc * (q + 4 * hb - 4);
				}
		break;
	}
	case 12: case 13: { /* d dmin scales[12] [qh[32]] qs[128] */
		double d = half_to_double(rd16(blk)), dm = half_to_double(rd16(blk + 2));
		const uint8_t *qh = blk + 16, *qs = blk + (type == 13 ? 48 : 16);

		for (int j = 0; j < 8; j++) {
			int sc, m;

			kq_sm(blk + 4, j, &sc, &m);
			for (int l = 0; l < 32; l++) {
				int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;

				if (type == 13)
					q |= ((qh[l] >> j) & 1) << 4;
				*y++ = d * sc * q - dm * m;
			}
		}
		break;
	}
	case 14: { /* ql[128] qh[64] scales[16] d */
		double d = half_to_double(rd16(blk + 208));
		const int8_t *sc = (const int8_t *)(blk + 192);

		for (int half = 0; half < 2; half++)
			for (int k = 0; k < 4; k++)
				for (int l = 0; l < 32; l++) {
					int lo = (blk[64 * half + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
					int hi = (blk[128 + 32 * half + l] >> (2 * k)) & 3;

					*y++ = d * sc[8 * half + 2 * k + l / 16] * ((lo | hi << 4) - 32);
				}
		break;
	}
	}
}

/* Q4_1 3, Q5_0 6, Q5_1 7, IQ4_NL 20: bytes per 32-weight block */
static uint64_t lq_bytes(int type)
{
	return type == 3 ? 20 : type == 6 ? 22 : type == 7 ? 24 : 18;
}

int ref_dequant_row(int type, const void *src, uint64_t n, double *dst)
{
	const uint8_t *p = src;
	uint64_t i, b;

	switch (type) {
	case 0: /* F32 */
		for (i = 0; i < n; i++) {
			float f;
			memcpy(&f, p + 4 * i, 4);
			dst[i] = f;
		}
		return 0;
	case 1: /* F16 */
		for (i = 0; i < n; i++)
			dst[i] = half_to_double(rd16(p + 2 * i));
		return 0;
	case 30: /* BF16 */
		for (i = 0; i < n; i++)
			dst[i] = bf16_to_double(rd16(p + 2 * i));
		return 0;
	case 8: /* Q8_0: f16 d, int8 q[32] */
		for (b = 0; b < n / 32; b++) {
			const uint8_t *blk = p + 34 * b;
			double d = half_to_double(rd16(blk));
			for (i = 0; i < 32; i++)
				dst[32 * b + i] = d * (int8_t)blk[2 + i];
		}
		return 0;
	case 2: /* Q4_0: f16 d, 16 bytes: low nibbles weights 0..15, high 16..31 */
		for (b = 0; b < n / 32; b++) {
			const uint8_t *blk = p + 18 * b;
			double d = half_to_double(rd16(blk));
			for (i = 0; i < 16; i++) {
				dst[32 * b + i] = d * ((blk[2 + i] & 15) - 8);
				dst[32 * b + 16 + i] = d * ((blk[2 + i] >> 4) - 8);
			}
		}
		return 0;
	case 3: case 6: case 7: case 20:
		/* Q4_1 (f16 d, f16 m, nibbles), Q5_0 (f16 d, 32 high bits,
		 * nibbles), Q5_1 (d, m, high bits, nibbles), IQ4_NL (f16 d,
		 * nibbles indexing a table): weight i's nibble is the low one
		 * of byte i (i < 16) or the high one of byte i - 16 */
		for (b = 0; b < n / 32; b++) {
			static const int nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
						    1, 13, 25, 38, 53, 69, 89, 113 };
			const uint8_t *blk = p + lq_bytes(type) * b;
			const int hm = type == 3 || type == 7; /* has m */
			const uint8_t *qh = blk + (hm ? 4 : 2), *qs = qh + (type == 6 || type == 7 ? 4 : 0);
			double d = half_to_double(rd16(blk)), m = hm ? half_to_double(rd16(blk + 2)) : 0;
			uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
				     (uint32_t)qh[3] << 24;

			for (i = 0; i < 32; i++) {
				int q = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;

				if (type == 6 || type == 7)
					q |= (int)((h >> i) & 1) << 4;
				dst[32 * b + i] = type == 20 ? d * nl[q] : type == 6 ? d * (q - 16) : d * q + m;
			}
		}
		return 0;
	case 23: /* IQ4_XS: f16 d, u16 scales_h, scales_l[4], qs[128]; chunk c's
		  * 6-bit scale: nibble c % 2 of scales_l[c / 2], bits 2c, 2c + 1 of
		  * scales_h on top; w = d (ls - 32) value[nibble] */
		for (b = 0; b < n / 256; b++) {
			static const int nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
						    1, 13, 25, 38, 53, 69, 89, 113 };
			const uint8_t *blk = p + 136 * b;
			double d = half_to_double(rd16(blk));
			unsigned sh = rd16(blk + 2);

			for (int c = 0; c < 8; c++) {
				int ls = ((blk[4 + c / 2] >> (4 * (c % 2))) & 15) | ((sh >> (2 * c)) & 3) << 4;
				const uint8_t *qs = blk + 8 + 16 * c;

				for (i = 0; i < 32; i++)
					dst[256 * b + 32 * (uint64_t)c + i] =
						d * (ls - 32) * nl[i < 16 ? qs[i] & 15 : qs[i - 16] >> 4];
			}
		}
		return 0;
	case 10: case 11: case 12: case 13: case 14:
		for (b = 0; b < n / 256; b++)
			kq_block(type, p + kq_bytes(type) * b, dst + 256 * b);
		return 0;
	}
	return -EINVAL;
}

static uint64_t row_bytes(int type, uint64_t n)
{
	switch (type) {
	case 0: return 4 * n;
	case 1: case 30: return 2 * n;
	case 8: return n / 32 * 34;
	case 2: return n / 32 * 18;
	case 3: case 6: case 7: case 20: return n / 32 * lq_bytes(type);
	case 23: return n / 256 * 136;
	case 10: case 11: case 12: case 13: case 14: return n / 256 * kq_bytes(type);
	}
	return 0;
}

/* --- loading ---------------------------------------------------------- */

static int load_mat(const struct gpud_gguf *g, const char *name, uint64_t rows, uint64_t cols,
		    struct ref_mat *m, char *err, size_t errlen)
{
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, name);
	const uint8_t *p;
	uint64_t r, rb;

	if (!t)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "ref: tensor %s missing", name);
	if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "ref: tensor %s is [%llu, %llu], expected [%llu, %llu]", name,
				 (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
				 (unsigned long long)cols, (unsigned long long)rows);
	rb = row_bytes((int)t->type, cols);
	if (!rb || rb * rows > t->nbytes)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED, "ref: tensor %s: type %d", name,
				 (int)t->type);
	m->rows = rows;
	m->cols = cols;
	m->w = malloc(rows * cols * sizeof(double));
	if (!m->w)
		return -ENOMEM;
	p = t->data;
	for (r = 0; r < rows; r++)
		ref_dequant_row((int)t->type, p + r * rb, cols, m->w + r * cols);
	return 0;
}

static int load_vec(const struct gpud_gguf *g, const char *name, uint64_t n, double **out,
		    char *err, size_t errlen)
{
	struct ref_mat m;
	int rc = load_mat(g, name, 1, n, &m, err, errlen);
	*out = m.w;
	if (rc)
		*out = NULL;
	return rc;
}

static int meta_u32(const struct gpud_gguf *g, const char *key, uint32_t *v, bool required,
		    char *err, size_t errlen)
{
	int rc = gpud_gguf_get_u32(g, key, v);
	if (rc == SW_ENOTFOUND && !required)
		return 0;
	if (rc)
		return sw_seterr(err, errlen, rc, "ref: %s: %s", key, sw_strerror(rc));
	return 0;
}

static int meta_f64(const struct gpud_gguf *g, const char *key, double *v, char *err,
		    size_t errlen)
{
	float f;
	int rc = gpud_gguf_get_f32(g, key, &f);
	if (rc == SW_ENOTFOUND)
		return 0;
	if (rc)
		return sw_seterr(err, errlen, rc, "ref: %s: %s", key, sw_strerror(rc));
	*v = f;
	return 0;
}

/* YaRN, as the paper writes it: each pair's frequency blended between its
 * own (extrapolated) and its own over factor (interpolated) by a ramp
 * over the pairs whose period fits between beta_fast and beta_slow turns
 * of the original context, and cos and sin multiplied by
 * 0.1 ln(factor) + 1. */
static int load_yarn(struct ref_llama *m, const struct gpud_gguf *g, const char *arch,
		     char *err, size_t errlen)
{
	struct ref_llama_info *in = &m->info;
	double factor = 1, ext = 1, attn = 1, fast = 32, slow = 1, orig, d = in->head_dim;
	uint32_t orig_u = 0;
	char key[96];
	int rc;

#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, arch), key)
	if ((rc = meta_f64(g, KEY("rope.scaling.factor"), &factor, err, errlen)) ||
	    (rc = meta_u32(g, KEY("rope.scaling.original_context_length"), &orig_u, false, err,
			   errlen)) ||
	    (rc = meta_f64(g, KEY("rope.scaling.yarn_ext_factor"), &ext, err, errlen)) ||
	    (rc = meta_f64(g, KEY("rope.scaling.yarn_attn_factor"), &attn, err, errlen)) ||
	    (rc = meta_f64(g, KEY("rope.scaling.yarn_beta_fast"), &fast, err, errlen)) ||
	    (rc = meta_f64(g, KEY("rope.scaling.yarn_beta_slow"), &slow, err, errlen)))
		return rc;
#undef KEY
	orig = orig_u ? orig_u : in->n_ctx / factor;
	/* the pair index whose period is orig / turns */
	double low = floor(d * log(orig / (fast * 2 * M_PI)) / (2 * log(in->rope_base)));
	double high = ceil(d * log(orig / (slow * 2 * M_PI)) / (2 * log(in->rope_base)));
	low = fmax(low, 0);
	high = fmin(high, d - 1);
	for (uint32_t i = 0; i < in->head_dim / 2; i++) {
		double extrap = pow(in->rope_base, -2.0 * i / d), interp = extrap / factor;
		double ramp = fmin(1, fmax(0, (i - low) / fmax(high - low, 0.001)));
		double keep = (1 - ramp) * ext; /* the extrapolated frequency's share */
		m->inv_freq[i] = interp * (1 - keep) + extrap * keep;
	}
	m->mscale = attn * (ext != 0 ? 0.1 * log(factor) + 1 : 1);
	in->rope_scaled = true;
	return 0;
}

/* RoPE frequencies: base^(-2i/d), divided per pair by the Llama 3 factor
 * (from rope_freqs.weight, or computed from llama.rope.scaling.*). */
static int load_rope(struct ref_llama *m, const struct gpud_gguf *g, const char *arch,
		     char *err, size_t errlen)
{
	struct ref_llama_info *in = &m->info;
	uint32_t half = in->head_dim / 2, i;
	struct gpud_gguf_str type;
	double *factors = NULL;
	char key[96];
	int rc;

#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, arch), key)
	m->inv_freq = calloc(half, sizeof(double));
	if (!m->inv_freq)
		return -ENOMEM;
	if (gpud_gguf_find_tensor(g, "rope_freqs.weight")) {
		rc = load_vec(g, "rope_freqs.weight", half, &factors, err, errlen);
		if (rc)
			return rc;
	} else if (gpud_gguf_get_str(g, KEY("rope.scaling.type"), &type) == 0 &&
		   !(type.len == 4 && !memcmp(type.s, "none", 4))) {
		double factor = 8, lo = 1, hi = 4, orig = 8192;
		uint32_t orig_u = 0;

		if (type.len == 4 && !memcmp(type.s, "yarn", 4))
			return load_yarn(m, g, arch, err, errlen);
		if (!(type.len == 6 && !memcmp(type.s, "llama3", 6)))
			return sw_seterr(err, errlen, SW_EUNSUPPORTED, "ref: rope scaling type");
		if ((rc = meta_f64(g, KEY("rope.scaling.factor"), &factor, err, errlen)) ||
		    (rc = meta_f64(g, KEY("rope.scaling.low_freq_factor"), &lo, err, errlen)) ||
		    (rc = meta_f64(g, KEY("rope.scaling.high_freq_factor"), &hi, err, errlen)) ||
		    (rc = meta_u32(g, KEY("rope.scaling.original_context_length"), &orig_u,
				   false, err, errlen)))
			return rc;
		if (orig_u)
			orig = orig_u;
		factors = calloc(half, sizeof(double));
		if (!factors)
			return -ENOMEM;
		for (i = 0; i < half; i++) {
			/* Llama 3: keep short wavelengths, divide long ones by
			 * factor, interpolate in between */
			double f = pow(in->rope_base, -2.0 * i / in->head_dim);
			double wavelen = 2 * M_PI / f, nf;
			if (wavelen < orig / hi) {
				nf = f;
			} else if (wavelen > orig / lo) {
				nf = f / factor;
			} else {
				double s = (orig / wavelen - lo) / (hi - lo);
				nf = (1 - s) * f / factor + s * f;
			}
			factors[i] = f / nf;
		}
	}
	for (i = 0; i < half; i++) {
		m->inv_freq[i] = pow(in->rope_base, -2.0 * i / in->head_dim);
		if (factors)
			m->inv_freq[i] /= factors[i];
	}
	in->rope_scaled = factors != NULL;
	free(factors);
	return 0;
#undef KEY
}

static int load_all(struct ref_llama *m, const struct gpud_gguf *g, char *err, size_t errlen)
{
	struct ref_llama_info *in = &m->info;
	const struct gpud_gguf_tensor *emb;
	struct gpud_gguf_str arch;
	const char *a;
	char name[96], key[96];
	uint64_t qd, kvd;
	int rc;

	if (gpud_gguf_get_str(g, "general.architecture", &arch))
		return sw_seterr(err, errlen, SW_EUNSUPPORTED, "ref: no architecture");
	if (arch.len == 5 && !memcmp(arch.s, "llama", 5))
		a = "llama";
	else if (arch.len == 5 && !memcmp(arch.s, "qwen2", 5))
		a = "qwen2";
	else if (arch.len == 5 && !memcmp(arch.s, "qwen3", 5))
		a = "qwen3";
	else
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "ref: not a llama, qwen2 or qwen3 model");
	in->neox = a[0] == 'q';
	in->qk_norm = a[4] == '3';
	in->norm_eps = 1e-5;
	in->rope_base = 10000;
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
	if ((rc = meta_u32(g, KEY("embedding_length"), &in->dim, true, err, errlen)) ||
	    (rc = meta_u32(g, KEY("block_count"), &in->n_layers, true, err, errlen)) ||
	    (rc = meta_u32(g, KEY("feed_forward_length"), &in->ffn_dim, true, err, errlen)) ||
	    (rc = meta_u32(g, KEY("attention.head_count"), &in->n_heads, true, err, errlen)) ||
	    (rc = meta_u32(g, KEY("context_length"), &in->n_ctx, true, err, errlen)) ||
	    (rc = meta_f64(g, KEY("attention.layer_norm_rms_epsilon"), &in->norm_eps, err,
			   errlen)) ||
	    (rc = meta_f64(g, KEY("rope.freq_base"), &in->rope_base, err, errlen)))
		return rc;
	in->n_kv_heads = in->n_heads;
	in->head_dim = 0;
	if ((rc = meta_u32(g, KEY("attention.head_count_kv"), &in->n_kv_heads, false, err,
			   errlen)) ||
	    (rc = meta_u32(g, KEY("attention.key_length"), &in->head_dim, false, err, errlen)))
		return rc;
#undef KEY
	in->qkv_bias = a[4] == '2' || gpud_gguf_find_tensor(g, "blk.0.attn_q.bias");
	if (!in->n_heads || !in->n_kv_heads || (!in->head_dim && in->dim % in->n_heads) ||
	    in->n_heads % in->n_kv_heads)
		return sw_seterr(err, errlen, SW_EFORMAT, "ref: bad head counts");
	if (!in->head_dim) /* heads as wide as dim / heads unless said */
		in->head_dim = in->dim / in->n_heads;
	emb = gpud_gguf_find_tensor(g, "token_embd.weight");
	if (!emb)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "ref: token_embd.weight missing");
	in->n_vocab = (uint32_t)emb->ne[1];
	qd = (uint64_t)in->n_heads * in->head_dim;
	kvd = (uint64_t)in->n_kv_heads * in->head_dim;

	if ((rc = load_mat(g, "token_embd.weight", in->n_vocab, in->dim, &m->embd, err, errlen)))
		return rc;
	m->layers = calloc(in->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	for (uint32_t l = 0; l < in->n_layers; l++) {
		struct ref_layer *L = &m->layers[l];
#define W(field, suffix, rows, cols)                                                        \
	do {                                                                                \
		snprintf(name, sizeof(name), "blk.%u.%s.weight", l, suffix);               \
		if ((rc = load_mat(g, name, rows, cols, &L->field, err, errlen)))           \
			return rc;                                                          \
	} while (0)
		snprintf(name, sizeof(name), "blk.%u.attn_norm.weight", l);
		if ((rc = load_vec(g, name, in->dim, &L->attn_norm, err, errlen)))
			return rc;
		snprintf(name, sizeof(name), "blk.%u.ffn_norm.weight", l);
		if ((rc = load_vec(g, name, in->dim, &L->ffn_norm, err, errlen)))
			return rc;
		W(wq, "attn_q", qd, in->dim);
		W(wk, "attn_k", kvd, in->dim);
		W(wv, "attn_v", kvd, in->dim);
		W(wo, "attn_output", in->dim, qd);
		W(gate, "ffn_gate", in->ffn_dim, in->dim);
		W(up, "ffn_up", in->ffn_dim, in->dim);
		W(down, "ffn_down", in->dim, in->ffn_dim);
#undef W
		if (in->qkv_bias) {
			snprintf(name, sizeof(name), "blk.%u.attn_q.bias", l);
			if ((rc = load_vec(g, name, qd, &L->bq, err, errlen)))
				return rc;
			snprintf(name, sizeof(name), "blk.%u.attn_k.bias", l);
			if ((rc = load_vec(g, name, kvd, &L->bk, err, errlen)))
				return rc;
			snprintf(name, sizeof(name), "blk.%u.attn_v.bias", l);
			if ((rc = load_vec(g, name, kvd, &L->bv, err, errlen)))
				return rc;
		}
		if (in->qk_norm) {
			snprintf(name, sizeof(name), "blk.%u.attn_q_norm.weight", l);
			if ((rc = load_vec(g, name, in->head_dim, &L->q_norm, err, errlen)))
				return rc;
			snprintf(name, sizeof(name), "blk.%u.attn_k_norm.weight", l);
			if ((rc = load_vec(g, name, in->head_dim, &L->k_norm, err, errlen)))
				return rc;
		}
	}
	if ((rc = load_vec(g, "output_norm.weight", in->dim, &m->out_norm, err, errlen)))
		return rc;
	in->tied_output = gpud_gguf_find_tensor(g, "output.weight") == NULL;
	if (in->tied_output) {
		m->output.rows = m->embd.rows;
		m->output.cols = m->embd.cols;
		m->output.w = malloc(m->embd.rows * m->embd.cols * sizeof(double));
		if (!m->output.w)
			return -ENOMEM;
		memcpy(m->output.w, m->embd.w, m->embd.rows * m->embd.cols * sizeof(double));
	} else if ((rc = load_mat(g, "output.weight", in->n_vocab, in->dim, &m->output, err,
				  errlen))) {
		return rc;
	}
	return load_rope(m, g, a, err, errlen);
}

int ref_llama_load(struct ref_llama **out, const char *path, char *err, size_t errlen)
{
	struct gpud_gguf *g = NULL;
	struct ref_llama *m;
	int rc;

	*out = NULL;
	rc = gpud_gguf_open(&g, path, err, errlen);
	if (rc)
		return rc;
	m = calloc(1, sizeof(*m));
	if (!m) {
		gpud_gguf_close(g);
		return -ENOMEM;
	}
	m->mscale = 1;
	rc = load_all(m, g, err, errlen);
	gpud_gguf_close(g);
	if (rc) {
		ref_llama_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

void ref_llama_free(struct ref_llama *m)
{
	if (!m)
		return;
	if (m->layers) {
		for (uint32_t l = 0; l < m->info.n_layers; l++) {
			struct ref_layer *L = &m->layers[l];
			free(L->attn_norm);
			free(L->ffn_norm);
			free(L->wq.w);
			free(L->wk.w);
			free(L->wv.w);
			free(L->wo.w);
			free(L->bq);
			free(L->bk);
			free(L->bv);
			free(L->q_norm);
			free(L->k_norm);
			free(L->gate.w);
			free(L->up.w);
			free(L->down.w);
		}
	}
	free(m->layers);
	free(m->embd.w);
	free(m->out_norm);
	free(m->output.w);
	free(m->inv_freq);
	free(m);
}

const struct ref_llama_info *ref_llama_info(const struct ref_llama *m)
{
	return &m->info;
}

/* --- the forward pass ------------------------------------------------- */

void ref_mask_dense(const struct proto_mask_desc *desc, const uint32_t *seg_tokens, uint32_t n,
		    bool *vis)
{
	uint32_t s = desc ? desc->n_segments : 0, q, k, i, pos = 0;
	uint32_t *seg = malloc((n ? n : 1) * sizeof(*seg));

	/* seg(p): the segment whose range holds p, G (= S) past the prompt */
	for (q = 0; q < n; q++)
		seg[q] = s;
	for (i = 0; i < s; i++)
		for (k = 0; k < seg_tokens[i]; k++, pos++)
			if (pos < n)
				seg[pos] = i;
	for (q = 0; q < n; q++) {
		for (k = 0; k < n; k++) {
			bool v = false;
			if (k <= q) {
				if (!desc || !desc->rows || seg[k] == seg[q]) {
					v = true;
				} else {
					const struct proto_mask_row *r = &desc->rows[seg[q]];
					for (i = 0; i < r->n; i++)
						v |= r->idx[i] == seg[k];
				}
			}
			vis[(size_t)q * n + k] = v;
		}
	}
	free(seg);
}

static void matvec(const struct ref_mat *m, const double *x, double *y)
{
	for (uint64_t r = 0; r < m->rows; r++) {
		double acc = 0;
		for (uint64_t c = 0; c < m->cols; c++)
			acc += m->w[r * m->cols + c] * x[c];
		y[r] = acc;
	}
}

static void rmsnorm(const double *x, const double *w, uint32_t n, double eps, double *y)
{
	double ss = 0;
	for (uint32_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss = 1.0 / sqrt(ss / n + eps);
	for (uint32_t i = 0; i < n; i++)
		y[i] = x[i] * ss * w[i];
}

/* Rotates pair i of each head of vec by pos * inv_freq[i]: elements
 * (2i, 2i+1) for llama, (i, i + hd/2) for qwen2 (NEOX). */
static void rope(const struct ref_llama *m, double *vec, uint32_t n_heads, uint32_t pos)
{
	uint32_t hd = m->info.head_dim;
	for (uint32_t h = 0; h < n_heads; h++) {
		double *v = vec + (size_t)h * hd;
		for (uint32_t i = 0; i < hd / 2; i++) {
			double th = pos * m->inv_freq[i], c = cos(th) * m->mscale,
			       s = sin(th) * m->mscale;
			uint32_t i0 = m->info.neox ? i : 2 * i, i1 = m->info.neox ? i + hd / 2 : 2 * i + 1;
			double a = v[i0], b = v[i1];
			v[i0] = a * c - b * s;
			v[i1] = a * s + b * c;
		}
	}
}

static void add_vec(double *y, const double *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += b[i];
}

int ref_llama_forward(const struct ref_llama *m, const int32_t *tokens, uint32_t n,
		      const struct proto_mask_desc *desc, const uint32_t *seg_tokens,
		      double *logits, double *hidden)
{
	const struct ref_llama_info *in = &m->info;
	uint32_t dim = in->dim, hd = in->head_dim, nh = in->n_heads, nkv = in->n_kv_heads;
	size_t qd = (size_t)nh * hd, kvd = (size_t)nkv * hd;
	double *x, *xb, *q, *k, *v, *att, *sc, *hb, *hb2, *tmp;
	bool *vis;
	int rc = -ENOMEM;

	for (uint32_t t = 0; t < n; t++)
		if (tokens[t] < 0 || (uint32_t)tokens[t] >= in->n_vocab)
			return -EINVAL;
	x = malloc((size_t)n * dim * sizeof(double));
	xb = malloc((size_t)dim * sizeof(double));
	q = malloc((size_t)n * qd * sizeof(double));
	k = malloc((size_t)n * kvd * sizeof(double));
	v = malloc((size_t)n * kvd * sizeof(double));
	att = malloc((size_t)n * qd * sizeof(double));
	sc = malloc((size_t)(n ? n : 1) * sizeof(double));
	hb = malloc((size_t)in->ffn_dim * sizeof(double));
	hb2 = malloc((size_t)in->ffn_dim * sizeof(double));
	tmp = malloc((size_t)dim * sizeof(double));
	vis = malloc((size_t)n * n + 1);
	if (!x || !xb || !q || !k || !v || !att || !sc || !hb || !hb2 || !tmp || !vis)
		goto out_free;

	ref_mask_dense(desc, seg_tokens, n, vis);
	for (uint32_t t = 0; t < n; t++)
		memcpy(x + (size_t)t * dim, m->embd.w + (size_t)tokens[t] * dim,
		       dim * sizeof(double));

	for (uint32_t l = 0; l < in->n_layers; l++) {
		const struct ref_layer *L = &m->layers[l];

		for (uint32_t t = 0; t < n; t++) {
			rmsnorm(x + (size_t)t * dim, L->attn_norm, dim, in->norm_eps, xb);
			matvec(&L->wq, xb, q + t * qd);
			matvec(&L->wk, xb, k + t * kvd);
			matvec(&L->wv, xb, v + t * kvd);
			if (L->bq) {
				add_vec(q + t * qd, L->bq, qd);
				add_vec(k + t * kvd, L->bk, kvd);
				add_vec(v + t * kvd, L->bv, kvd);
			}
			for (uint32_t h = 0; L->q_norm && h < nh; h++)
				rmsnorm(q + t * qd + (size_t)h * hd, L->q_norm, hd, in->norm_eps,
					q + t * qd + (size_t)h * hd);
			for (uint32_t h = 0; L->k_norm && h < nkv; h++)
				rmsnorm(k + t * kvd + (size_t)h * hd, L->k_norm, hd, in->norm_eps,
					k + t * kvd + (size_t)h * hd);
			rope(m, q + t * qd, nh, t);
			rope(m, k + t * kvd, nkv, t);
			for (size_t e = 0; m->kv_half && e < kvd; e++) {
				k[t * kvd + e] = round_half(k[t * kvd + e]);
				v[t * kvd + e] = round_half(v[t * kvd + e]);
			}
		}
		for (uint32_t t = 0; t < n; t++) {
			for (uint32_t h = 0; h < nh; h++) {
				uint32_t kh = h / (nh / nkv);
				const double *qv = q + t * qd + (size_t)h * hd;
				double *o = att + t * qd + (size_t)h * hd, mx = -INFINITY, sum = 0;

				for (uint32_t j = 0; j <= t; j++) {
					if (!vis[(size_t)t * n + j])
						continue;
					double d = 0;
					for (uint32_t e = 0; e < hd; e++)
						d += qv[e] * k[j * kvd + (size_t)kh * hd + e];
					sc[j] = d / sqrt((double)hd);
					if (sc[j] > mx)
						mx = sc[j];
				}
				for (uint32_t j = 0; j <= t; j++)
					if (vis[(size_t)t * n + j])
						sum += sc[j] = exp(sc[j] - mx);
				memset(o, 0, hd * sizeof(double));
				for (uint32_t j = 0; j <= t; j++) {
					if (!vis[(size_t)t * n + j])
						continue;
					for (uint32_t e = 0; e < hd; e++)
						o[e] += sc[j] / sum * v[j * kvd + (size_t)kh * hd + e];
				}
			}
		}
		for (uint32_t t = 0; t < n; t++) {
			double *xt = x + (size_t)t * dim;

			matvec(&L->wo, att + t * qd, tmp);
			for (uint32_t i = 0; i < dim; i++)
				xt[i] += tmp[i];
			rmsnorm(xt, L->ffn_norm, dim, in->norm_eps, xb);
			matvec(&L->gate, xb, hb);
			matvec(&L->up, xb, hb2);
			for (uint32_t i = 0; i < in->ffn_dim; i++)
				hb[i] = hb[i] / (1.0 + exp(-hb[i])) * hb2[i]; /* SiLU(gate) * up */
			matvec(&L->down, hb, tmp);
			for (uint32_t i = 0; i < dim; i++)
				xt[i] += tmp[i];
		}
	}
	for (uint32_t t = 0; t < n; t++) {
		rmsnorm(x + (size_t)t * dim, m->out_norm, dim, in->norm_eps, xb);
		if (hidden)
			memcpy(hidden + (size_t)t * dim, xb, dim * sizeof(double));
		matvec(&m->output, xb, logits + (size_t)t * in->n_vocab);
	}
	rc = 0;

out_free:
	free(x);
	free(xb);
	free(q);
	free(k);
	free(v);
	free(att);
	free(sc);
	free(hb);
	free(hb2);
	free(tmp);
	free(vis);
	return rc;
}

void ref_llama_set_kv_half(struct ref_llama *m, bool on)
{
	m->kv_half = on;
}
