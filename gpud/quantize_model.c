/* quantize_model.c - gpud quantize (quantize_model.h). */
#include "gpud/quantize_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/model.h"

/* One converted matrix: its source rows, decoded one at a time. */
struct qm_src {
	const uint8_t *data;
	enum gpud_type type;
	size_t row_bytes;
};

static int qm_fill(void *arg, uint64_t row, float *out, uint64_t cols)
{
	const struct qm_src *s = arg;

	gpud_dequantize_row(s->type, s->data + row * s->row_bytes, out, (int64_t)cols);
	return 0;
}

/* Whether the type holds integer quants (gpud/quant.h's traits). */
static bool qm_quantized(enum gpud_type t)
{
	return gpud_type_traits(t)->quantized;
}

/* Whether tensor data is one of the model's matrices (mats: n of them). */
static bool qm_matrix(const void *data, const struct gpud_weight *const *mats, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (mats[i]->data == data)
			return true;
	return false;
}

static bool skip_file_type(const char *key, void *arg)
{
	(void)arg;
	return !strcmp(key, "general.file_type");
}

static bool same_file(const char *a, const char *b)
{
	struct stat sa, sb;

	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

int gpud_quantize_model(const struct gpud_quantize_params *p, struct gpud_quantize_report *rep,
			char *err, size_t errlen)
{
	struct gpud_model *m = NULL;
	struct gpud_gguf_writer *w = NULL;
	struct qm_src *srcs = NULL;
	const struct gpud_weight **mats = NULL;
	size_t n_mats;
	struct gpud_mkmodel_params mp;
	struct gpud_quantize_report r = { 0 };
	const struct gpud_gguf *g;
	const struct gpud_model_hparams *hp;
	char why[SW_ERR_MAX];
	int rc;

	if (!p || !p->in || !p->out || !*p->in || !*p->out)
		return sw_seterr(err, errlen, -EINVAL, "quantize: an input and an output path");
	if (p->type == GPUD_TYPE_Q8_K || !gpud_type_supported(p->type))
		return sw_seterr(err, errlen, -EINVAL, "quantize: type %s is not a weight type",
				 gpud_type_name(p->type));
	if (!strcmp(p->in, p->out) || same_file(p->in, p->out))
		return sw_seterr(err, errlen, -EINVAL,
				 "quantize: %s: the output must be another file than the model", p->out);
	rc = gpud_model_load(&m, p->in, why, sizeof(why));
	if (rc)
		return sw_seterr(err, errlen, rc, "quantize: %s", why);
	g = gpud_model_gguf(m);
	hp = gpud_model_hparams(m);
	gpud_mkmodel_params_default(&mp);
	mp.type = p->type;
	mp.mix = p->mix;
	mp.dim = hp->dim;
	mp.n_heads = hp->n_heads;
	mp.head_dim = hp->head_dim;
	mp.ffn_dim = hp->ffn_dim;
	mp.n_layers = hp->n_layers;
	mp.tied = !gpud_gguf_find_tensor(g, "output.weight");
	r.tensors = gpud_gguf_n_tensors(g);
	n_mats = gpud_model_matrices(m, NULL, 0);
	srcs = calloc(r.tensors ? r.tensors : 1, sizeof(*srcs));
	mats = calloc(n_mats, sizeof(*mats));
	if (!srcs || !mats) {
		rc = sw_seterr(err, errlen, -ENOMEM, "quantize: out of memory");
		goto out;
	}
	gpud_model_matrices(m, mats, n_mats);
	if ((rc = gpud_gguf_writer_new(&w)) == 0)
		gpud_gguf_w_set_threads(w, 0); /* qm_fill only reads: rows on every CPU */
	if (rc || (rc = gpud_gguf_w_copy_kv(w, g, skip_file_type, NULL)) ||
	    (rc = gpud_gguf_w_u32(w, "general.file_type", gpud_mkmodel_file_type(&mp)))) {
		sw_seterr(err, errlen, rc, "quantize: %s: metadata: %s", p->in, sw_strerror(rc));
		goto out;
	}
	for (uint64_t i = 0; i < r.tensors; i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(g, i);
		enum gpud_type to = t->type;

		if (qm_matrix(t->data, mats, n_mats))
			to = gpud_mkmodel_tensor_type(&mp, t->name);
		r.in_bytes += t->nbytes;
		if (to == t->type) {
			rc = gpud_gguf_w_tensor_ref(w, t->name, t->type, t->n_dims, t->ne, t->data,
						    t->nbytes);
			if (rc) {
				sw_seterr(err, errlen, rc, "quantize: tensor %s: %s", t->name,
					  sw_strerror(rc));
				goto out;
			}
			r.out_bytes += t->nbytes;
			continue;
		}
		if (qm_quantized(t->type) && qm_quantized(to) && !p->allow_requantize) {
			rc = sw_seterr(err, errlen, -EINVAL,
				       "quantize: tensor %s is %s already: writing it as %s rounds "
				       "rounded weights (quantize the F16/BF16/F32 original, or "
				       "pass --allow-requantize)", t->name, gpud_type_name(t->type),
				       gpud_type_name(to));
			goto out;
		}
		if (t->ne[0] % gpud_type_block_elems(to)) {
			rc = sw_seterr(err, errlen, -EINVAL,
				       "quantize: tensor %s has rows of %llu, which %s cannot hold "
				       "(blocks of %u)", t->name, (unsigned long long)t->ne[0],
				       gpud_type_name(to), gpud_type_block_elems(to));
			goto out;
		}
		srcs[i] = (struct qm_src){ t->data, t->type, gpud_type_row_bytes(t->type, t->ne[0]) };
		rc = gpud_gguf_w_tensor_fill(w, t->name, to, t->n_dims, t->ne, qm_fill, &srcs[i]);
		if (rc) {
			sw_seterr(err, errlen, rc, "quantize: tensor %s: %s", t->name, sw_strerror(rc));
			goto out;
		}
		r.converted++;
		r.out_bytes += gpud_type_row_bytes(to, t->ne[0]) * t->ne[1];
	}
	rc = gpud_gguf_w_write(w, p->out, why, sizeof(why));
	if (rc) {
		sw_seterr(err, errlen, rc, "quantize: %s", why);
		goto out;
	}
	if (rep)
		*rep = r;
out:
	gpud_gguf_writer_free(w);
	free(mats);
	free(srcs);
	gpud_model_free(m);
	return rc;
}
