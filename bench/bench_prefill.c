/* bench_prefill.c - long prompts on the CPU backend: where attention, not
 * the matmuls, is the cost.
 *
 * One sequence of N prompt tokens is prefilled in chunks of C tokens (as
 * gpud's scheduler feeds a long prompt: each chunk attends to everything
 * before it), the logits of its last token only; the sequence is then
 * freed and the prefill repeated until `seconds` pass (at least twice).
 * Rates come from the best repetition (the machine is shared).
 *
 * A length past a model's context is skipped. Models: the real
 * stories260K (context 2048, head_dim 8: per key, one 8-wide dot, one
 * exponential, one 8-wide update, so the softmax's bookkeeping is the
 * cost), and generated Q8_0 Llama shapes with head_dim 64 (dim 512, 8
 * heads, 2 KV heads) and 128 (dim 1024, 8 heads, 2 KV heads), 4 layers
 * each, written once into --models-dir.
 *
 * usage: bench_prefill [--seconds S] [--threads N] [--models-dir DIR]
 *                      [--tokens N1,N2,...] [--chunk C] [--out FILE.md]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "sw_config.h"

#define STORIES SW_SHARED_DIR "/models/stories260K.gguf"
#define MAX_N 16
#define MAX_TOKENS 16384

struct opts {
	double seconds;
	int threads;
	const char *models_dir;
	uint32_t tokens[MAX_N];
	int n_tokens;
	uint32_t chunk;
	const char *out;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static int32_t rnd_tok(uint32_t nv)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (int32_t)(3 + rng % (nv - 3));
}

/* Writes a generated Q8_0 model of dim `dim` (8 heads, 2 KV heads, 4
 * layers) into dir unless it is there. */
static int make_model(const char *dir, uint32_t dim, char *path, size_t cap)
{
	struct gpud_mkmodel_params p;
	struct stat sb;
	char err[SW_ERR_MAX];
	int rc;

	snprintf(path, cap, "%s/bench-prefill-d%u-q8_0.gguf", dir, dim);
	if (stat(path, &sb) == 0)
		return 0;
	gpud_mkmodel_params_default(&p);
	p.out = path;
	p.name = "bench-prefill";
	p.dim = dim;
	p.n_layers = 4;
	p.n_heads = 8;
	p.n_kv_heads = 2;
	p.ffn_dim = dim * 8 / 3 / 32 * 32;
	p.n_ctx = MAX_TOKENS;
	p.type = GPUD_TYPE_Q8_0;
	p.seed = dim;
	fprintf(stderr, "bench_prefill: writing %s ...\n", path);
	if ((rc = gpud_mkmodel(&p, err, sizeof(err))))
		fprintf(stderr, "bench_prefill: mkmodel: %s\n", err);
	return rc;
}

struct row {
	char model[48];
	uint32_t head_dim, n;
	double best, mean; /* s per prefill */
};

static int prefill_once(struct gpud_engine *e, const int32_t *toks, uint32_t n, uint32_t chunk,
			double *secs)
{
	struct gpud_batch_entry b;
	char err[SW_ERR_MAX];
	uint32_t seq;
	double t0;
	int rc;

	if ((rc = gpud_engine_seq_add(e, NULL, &seq)))
		return rc;
	t0 = bench_now();
	for (uint32_t off = 0; off < n && !rc; off += chunk) {
		uint32_t k = n - off < chunk ? n - off : chunk;

		b = (struct gpud_batch_entry){ seq, toks + off, k,
					       off + k == n ? GPUD_LOGITS_LAST : GPUD_LOGITS_NONE };
		if ((rc = gpud_engine_step(e, &b, 1, err, sizeof(err))))
			fprintf(stderr, "bench_prefill: step: %s\n", err);
	}
	*secs = bench_now() - t0;
	gpud_engine_seq_free(e, seq);
	return rc;
}

static int bench_model(const char *path, const char *label, const struct opts *o,
		       struct row *rows, int *n_rows)
{
	static int32_t toks[MAX_TOKENS];
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	struct gpud_engine_params ep;
	char err[SW_ERR_MAX];
	uint32_t max_n = 0;
	int rc;

	if ((rc = gpud_model_load(&m, path, err, sizeof(err)))) {
		fprintf(stderr, "bench_prefill: %s\n", err);
		return rc;
	}
	for (int i = 0; i < o->n_tokens; i++)
		if (o->tokens[i] <= gpud_model_hparams(m)->n_ctx && o->tokens[i] > max_n)
			max_n = o->tokens[i];
	gpud_engine_params_default(&ep);
	ep.n_threads = o->threads;
	ep.max_batch_tokens = o->chunk;
	ep.max_seqs = 1;
	ep.max_logits = 1;
	ep.block_tokens = 16;
	ep.n_ctx = max_n;
	if ((rc = gpud_engine_create(&e, m, &ep, err, sizeof(err)))) {
		fprintf(stderr, "bench_prefill: %s\n", err);
		gpud_model_free(m);
		return rc;
	}
	for (uint32_t j = 0; j < max_n; j++)
		toks[j] = j == 0 ? 1 : rnd_tok(gpud_engine_n_vocab(e));
	for (int i = 0; i < o->n_tokens && !rc; i++) {
		struct row *r;
		double total = 0, t;
		uint32_t reps = 0;

		if (o->tokens[i] > max_n) {
			printf("%-28s %u tokens: past the model's context of %u, skipped\n", label,
			       o->tokens[i], gpud_model_hparams(m)->n_ctx);
			continue;
		}
		r = &rows[(*n_rows)++];
		memset(r, 0, sizeof(*r));
		snprintf(r->model, sizeof(r->model), "%s", label);
		r->head_dim = gpud_model_hparams(m)->head_dim;
		r->n = o->tokens[i];
		r->best = 1e30;
		while (!(rc = prefill_once(e, toks, r->n, o->chunk, &t))) {
			r->best = t < r->best ? t : r->best;
			total += t;
			if (++reps >= 2 && total >= o->seconds)
				break;
		}
		r->mean = reps ? total / reps : 0;
		printf("%-28s head_dim %3u  %5u tokens: best %8.1f ms (%8.1f tok/s), mean %8.1f ms\n",
		       label, r->head_dim, r->n, r->best * 1e3, r->n / r->best, r->mean * 1e3);
	}
	gpud_engine_destroy(e);
	gpud_model_free(m);
	return rc;
}

static void usage(const char *argv0)
{
	fprintf(stderr,
		"usage: %s [--seconds S] [--threads N] [--models-dir DIR] [--tokens N1,N2,...] "
		"[--chunk C] [--out FILE.md]\n",
		argv0);
	exit(2);
}

static int parse_tokens(struct opts *o, const char *s)
{
	char *end;

	o->n_tokens = 0;
	for (;;) {
		unsigned long v = strtoul(s, &end, 10);

		if (end == s || v < 1 || v > MAX_TOKENS || o->n_tokens == MAX_N)
			return -1;
		o->tokens[o->n_tokens++] = (uint32_t)v;
		if (*end == '\0')
			return 0;
		if (*end != ',')
			return -1;
		s = end + 1;
	}
}

int main(int argc, char **argv)
{
	struct opts o = { .seconds = 3, .threads = 0, .models_dir = "/tmp", .chunk = 512,
			  .tokens = { 256, 1024, 4096 }, .n_tokens = 3 };
	struct row rows[3 * MAX_N];
	int n_rows = 0, rc = 0;
	char path[512];

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--seconds") && v)
			o.seconds = atof(v);
		else if (!strcmp(a, "--threads") && v)
			o.threads = atoi(v);
		else if (!strcmp(a, "--models-dir") && v)
			o.models_dir = v;
		else if (!strcmp(a, "--chunk") && v)
			o.chunk = (uint32_t)strtoul(v, NULL, 10);
		else if (!strcmp(a, "--out") && v)
			o.out = v;
		else if (!strcmp(a, "--tokens") && v) {
			if (parse_tokens(&o, v))
				usage(argv[0]);
		} else
			usage(argv[0]);
		i++;
	}
	if (o.chunk < 1 || o.chunk > MAX_TOKENS)
		usage(argv[0]);
	if (o.threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		o.threads = n > 0 ? (int)n : 1;
	}
	printf("bench_prefill: %d threads, chunks of %u tokens, %.1f s per figure\n", o.threads,
	       o.chunk, o.seconds);
	rc = bench_model(STORIES, "stories260K (f32)", &o, rows, &n_rows);
	for (uint32_t dim = 512; dim <= 1024 && !rc; dim *= 2) {
		char label[48];

		if ((rc = make_model(o.models_dir, dim, path, sizeof(path))))
			break;
		snprintf(label, sizeof(label), "generated dim %u (q8_0)", dim);
		rc = bench_model(path, label, &o, rows, &n_rows);
	}
	if (!rc && o.out) {
		FILE *f = fopen(o.out, "w");

		if (!f) {
			fprintf(stderr, "bench_prefill: %s: %s\n", o.out, strerror(errno));
			return 1;
		}
		fprintf(f, "| model | head_dim | prompt tokens | best ms | tok/s | mean ms |\n"
			   "|---|---:|---:|---:|---:|---:|\n");
		for (int i = 0; i < n_rows; i++)
			fprintf(f, "| %s | %u | %u | %.1f | %.1f | %.1f |\n", rows[i].model,
				rows[i].head_dim, rows[i].n, rows[i].best * 1e3,
				rows[i].n / rows[i].best, rows[i].mean * 1e3);
		fclose(f);
	}
	return rc ? 1 : 0;
}
