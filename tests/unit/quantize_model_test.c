/* quantize_model_test.c - gpud quantize (gpud/quantize_model.h): a model's
 * matrices in another type hold the bits mkmodel writes from the same
 * floats; requantizing is refused unless allowed, and then gives the bits
 * of gpud_quantize_row over gpud_dequantize_row (the CUDA backend's
 * upload of the types it has no kernels for); everything else is copied
 * byte for byte; bad input leaves nothing behind.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/quant.h"
#include "gpud/quantize_model.h"

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/quantize_model_test.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static const char *path(const char *name)
{
	static char bufs[4][128];
	static int k;
	char *b = bufs[k++ % 4];

	snprintf(b, 128, "%s/%s", dir, name);
	return b;
}

/* mkmodel's model of dim x ffn in type (a --type value), seed 7, heads
 * head_dim wide (0: dim / heads). */
static void mk_heads(const char *out, const char *type, uint32_t dim, uint32_t ffn,
		     enum gpud_arch arch, uint32_t head_dim)
{
	struct gpud_mkmodel_params p;
	char err[SW_ERR_MAX];

	gpud_mkmodel_params_default(&p);
	p.out = out;
	p.dim = dim;
	p.ffn_dim = ffn;
	p.seed = 7;
	p.arch = arch;
	p.head_dim = head_dim;
	assert_int_equal(gpud_mkmodel_parse_type(type, &p.type, &p.mix), 0);
	assert_int_equal(gpud_mkmodel(&p, err, sizeof(err)), 0);
}

static void mk(const char *out, const char *type, uint32_t dim, uint32_t ffn, enum gpud_arch arch)
{
	mk_heads(out, type, dim, ffn, arch, 0);
}

static int quantize(const char *in, const char *out, const char *type, bool allow, char *err,
		    size_t errlen, struct gpud_quantize_report *r)
{
	struct gpud_quantize_params p = { .in = in, .out = out, .allow_requantize = allow };

	assert_int_equal(gpud_mkmodel_parse_type(type, &p.type, &p.mix), 0);
	return gpud_quantize_model(&p, r, err, errlen);
}

/* Every tensor of a and b: the same names in the same order, types, shapes
 * and bytes; and general.file_type. */
static void same_tensors(const char *a, const char *b)
{
	struct gpud_gguf *ga, *gb;
	char err[SW_ERR_MAX];
	uint32_t fa, fb;

	assert_int_equal(gpud_gguf_open(&ga, a, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_open(&gb, b, err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_n_tensors(ga), gpud_gguf_n_tensors(gb));
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(ga); i++) {
		const struct gpud_gguf_tensor *x = gpud_gguf_tensor(ga, i), *y = gpud_gguf_tensor(gb, i);

		assert_string_equal(x->name, y->name);
		assert_int_equal(x->type, y->type);
		assert_int_equal(x->n_dims, y->n_dims);
		assert_memory_equal(x->ne, y->ne, sizeof(x->ne));
		assert_int_equal(x->nbytes, y->nbytes);
		assert_memory_equal(x->data, y->data, x->nbytes);
	}
	assert_int_equal(gpud_gguf_get_u32(ga, "general.file_type", &fa), 0);
	assert_int_equal(gpud_gguf_get_u32(gb, "general.file_type", &fb), 0);
	assert_int_equal(fa, fb);
	/* every key of one is in the other */
	assert_int_equal(gpud_gguf_n_kv(ga), gpud_gguf_n_kv(gb));
	for (uint64_t i = 0; i < gpud_gguf_n_kv(ga); i++)
		assert_true(gpud_gguf_has(gb, gpud_gguf_key(ga, i)));
	gpud_gguf_close(ga);
	gpud_gguf_close(gb);
}

/* From an F32 model, each type (the K mixes, the fallbacks of rows no
 * 256-weight block fits, a float type) holds mkmodel's bits for the same
 * seed: the same floats through the same quantizer. */
static void test_from_f32(void **state)
{
	static const char *const types[] = { "q8_0", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs",
					     "q4_0", "f16", "bf16" };
	struct gpud_quantize_report r;
	char err[SW_ERR_MAX];

	(void)state;
	for (int shape = 0; shape < 2; shape++) {
		/* dim 256: the K-quants' own blocks; dim 64: their fallbacks */
		uint32_t dim = shape ? 64 : 256, ffn = shape ? 128 : 512;

		mk(path("f32.gguf"), "f32", dim, ffn, GPUD_ARCH_LLAMA);
		for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
			assert_int_equal(quantize(path("f32.gguf"), path("out.gguf"), types[t], false,
						  err, sizeof(err), &r), 0);
			mk(path("want.gguf"), types[t], dim, ffn, GPUD_ARCH_LLAMA);
			same_tensors(path("out.gguf"), path("want.gguf"));
			assert_true(r.converted > 0 && r.converted < r.tensors);
		}
	}
}

/* Qwen2: the Q/K/V biases (F32) are copied, the matrices converted. */
static void test_qwen2(void **state)
{
	char err[SW_ERR_MAX];

	(void)state;
	mk(path("qf32.gguf"), "f32", 256, 512, GPUD_ARCH_QWEN2);
	assert_int_equal(quantize(path("qf32.gguf"), path("qout.gguf"), "q4_k_m", false, err,
				  sizeof(err), NULL), 0);
	mk(path("qwant.gguf"), "q4_k_m", 256, 512, GPUD_ARCH_QWEN2);
	same_tensors(path("qout.gguf"), path("qwant.gguf"));
}

/* Heads of their own width: attn_output's rows are heads * head_dim long
 * (384 here, which no 256-weight block fits: Q5_0 in a Q4_K_M mix, as
 * mkmodel writes it), not dim. */
static void test_head_dim(void **state)
{
	struct gpud_gguf *g;
	char err[SW_ERR_MAX];

	(void)state;
	mk_heads(path("hf32.gguf"), "f32", 256, 512, GPUD_ARCH_LLAMA, 96);
	assert_int_equal(quantize(path("hf32.gguf"), path("hout.gguf"), "q4_k_m", false, err,
				  sizeof(err), NULL), 0);
	mk_heads(path("hwant.gguf"), "q4_k_m", 256, 512, GPUD_ARCH_LLAMA, 96);
	same_tensors(path("hout.gguf"), path("hwant.gguf"));
	assert_int_equal(gpud_gguf_open(&g, path("hout.gguf"), err, sizeof(err)), 0);
	const struct gpud_gguf_tensor *t = gpud_gguf_find_tensor(g, "blk.0.attn_output.weight");
	assert_non_null(t);
	assert_int_equal(t->ne[0], 384);
	assert_int_equal(t->type, GPUD_TYPE_Q5_0);
	assert_int_equal(gpud_gguf_find_tensor(g, "blk.0.attn_q.weight")->type, GPUD_TYPE_Q4_K);
	gpud_gguf_close(g);
}

/* A quantized matrix into another quantized type: refused, naming the
 * tensor, and nothing written; allowed, each row is gpud_quantize_row of
 * gpud_dequantize_row, and the tensors that stay (norms) are the bytes. A
 * type into itself is a copy. */
static void test_requantize(void **state)
{
	struct gpud_quantize_report r;
	struct gpud_gguf *gs, *go;
	char err[SW_ERR_MAX];
	float *x;
	uint8_t *want;

	(void)state;
	mk(path("q4km.gguf"), "q4_k_m", 256, 512, GPUD_ARCH_LLAMA);
	assert_int_equal(quantize(path("q4km.gguf"), path("r.gguf"), "q8_0", false, err,
				  sizeof(err), NULL), -EINVAL);
	assert_non_null(strstr(err, "is q4_k already"));
	assert_non_null(strstr(err, "--allow-requantize"));
	assert_int_equal(access(path("r.gguf"), F_OK), -1);

	assert_int_equal(quantize(path("q4km.gguf"), path("r.gguf"), "q8_0", true, err,
				  sizeof(err), &r), 0);
	assert_int_equal(gpud_gguf_open(&gs, path("q4km.gguf"), err, sizeof(err)), 0);
	assert_int_equal(gpud_gguf_open(&go, path("r.gguf"), err, sizeof(err)), 0);
	x = malloc(512 * sizeof(float));
	want = malloc(gpud_type_row_bytes(GPUD_TYPE_Q8_0, 512));
	assert_non_null(x);
	assert_non_null(want);
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(gs); i++) {
		const struct gpud_gguf_tensor *s = gpud_gguf_tensor(gs, i), *o = gpud_gguf_tensor(go, i);
		size_t srow = gpud_type_row_bytes(s->type, s->ne[0]);
		size_t orow = gpud_type_row_bytes(o->type, o->ne[0]);

		assert_string_equal(s->name, o->name);
		if (s->n_dims == 1) { /* norms */
			assert_int_equal(o->type, s->type);
			assert_memory_equal(o->data, s->data, s->nbytes);
			continue;
		}
		assert_int_equal(o->type, GPUD_TYPE_Q8_0);
		for (uint64_t row = 0; row < s->ne[1]; row++) {
			gpud_dequantize_row(s->type, (const uint8_t *)s->data + row * srow, x,
					    (int64_t)s->ne[0]);
			gpud_quantize_row(GPUD_TYPE_Q8_0, x, want, (int64_t)s->ne[0]);
			assert_memory_equal((const uint8_t *)o->data + row * orow, want, orow);
		}
	}
	free(x);
	free(want);
	gpud_gguf_close(gs);
	gpud_gguf_close(go);
	/* the output loads as a model */
	{
		struct gpud_model *m;

		assert_int_equal(gpud_model_load(&m, path("r.gguf"), err, sizeof(err)), 0);
		assert_int_equal(gpud_model_weights(m)->layers[0].wq.type, GPUD_TYPE_Q8_0);
		gpud_model_free(m);
	}

	/* a type into itself: nothing converted, the same tensors */
	assert_int_equal(quantize(path("r.gguf"), path("r2.gguf"), "q8_0", false, err,
				  sizeof(err), &r), 0);
	assert_int_equal(r.converted, 0);
	assert_int_equal(r.in_bytes, r.out_bytes);
	same_tensors(path("r.gguf"), path("r2.gguf"));
}

/* Bad input: a clear error, and no output file (nor a temporary one). */
static void test_errors(void **state)
{
	struct gpud_quantize_params p = { .type = GPUD_TYPE_Q8_0 };
	char err[SW_ERR_MAX], cmd[256];

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s/e", dir);
	assert_int_equal(mkdir(cmd, 0700), 0);
	mk(path("e/src.gguf"), "f32", 64, 128, GPUD_ARCH_LLAMA);

	/* the model itself as the output */
	p.in = path("e/src.gguf");
	p.out = path("e/src.gguf");
	assert_int_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "another file"));
	/* ... also through another name */
	assert_int_equal(symlink(path("e/src.gguf"), path("e/link.gguf")), 0);
	p.out = path("e/link.gguf");
	assert_int_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), -EINVAL);

	/* no such model */
	p.in = path("e/missing.gguf");
	p.out = path("e/o.gguf");
	assert_int_not_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "missing.gguf"));

	/* a truncated model */
	snprintf(cmd, sizeof(cmd), "head -c 3000 '%s' > '%s'", path("e/src.gguf"), path("e/cut.gguf"));
	assert_int_equal(system(cmd), 0);
	p.in = path("e/cut.gguf");
	assert_int_not_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), 0);
	assert_int_equal(access(path("e/o.gguf"), F_OK), -1);

	/* not a weight type */
	p.in = path("e/src.gguf");
	p.type = GPUD_TYPE_Q8_K;
	assert_int_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "q8_k is not a weight type"));
	p.type = (enum gpud_type)16;
	assert_int_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), -EINVAL);

	/* rows a type cannot hold: 48 wide, not a whole Q8_0 block */
	{
		struct gpud_mkmodel_params mp;

		gpud_mkmodel_params_default(&mp);
		mp.out = path("e/w48.gguf");
		mp.dim = 48;
		mp.n_heads = 2;
		mp.n_kv_heads = 2;
		mp.ffn_dim = 96;
		assert_int_equal(gpud_mkmodel(&mp, err, sizeof(err)), 0);
		p.in = path("e/w48.gguf");
		p.type = GPUD_TYPE_Q8_0;
		assert_int_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "which q8_0 cannot hold"));
		assert_int_equal(access(path("e/o.gguf"), F_OK), -1);
	}

	/* an output directory that does not exist: the write fails, the
	 * message names it */
	p.in = path("e/src.gguf");
	p.out = path("e/nodir/o.gguf");
	assert_int_not_equal(gpud_quantize_model(&p, NULL, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "nodir"));

	/* nothing left behind in the directory but the inputs */
	snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A '%s' | grep -v -e '^src.gguf$' -e "
		 "'^link.gguf$' -e '^cut.gguf$' -e '^w48.gguf$')\"", path("e"));
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_from_f32),
		cmocka_unit_test(test_qwen2),
		cmocka_unit_test(test_head_dim),
		cmocka_unit_test(test_requantize),
		cmocka_unit_test(test_errors),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
