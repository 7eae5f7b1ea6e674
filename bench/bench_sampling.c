/* bench_sampling.c - what sampling a logits row costs on the host, and
 * what sharing a step's rows among sampling threads gives the scheduler.
 *
 * 1. Per row: gpud_sampler_sample on one core, for vocabularies of 32000
 *    (Llama 2) and 128256 (Llama 3) tokens: greedy (gpud_argmax), a
 *    temperature alone, with top-p, with top-k + top-p + min-p, and with a
 *    repeat penalty. Logits are normal-ish (a sum of uniforms, sd ~2) with
 *    a few peaks, like a trained model's. Median over the draws.
 *    Beside them, the log probabilities a request may ask for
 *    (gpud_logprobs_row: the log softmax's two passes, with 0, 5 and 20
 *    alternatives), which come on top of its sampling.
 * 2. The scheduler: one CPU device stepping a model whose forward pass is
 *    cheap next to its sampling (dim 64, one layer, F32, the 128256-token
 *    Llama 3 vocabulary: a step's logits matmul reads 33 MB), 64 requests
 *    decoding at once with a temperature and top-p; generated tokens per
 *    second with gpud.sample_threads 1, 2 and 0 (one per CPU), and the same
 *    load greedy (arg max rows) beside them, and greedy with the log
 *    probabilities of 5 alternatives.
 *
 * usage: bench_sampling [--vocab-from GGUF] [--tokens N] [--out FILE.md]
 * The vocabulary defaults to ../shared/tokenizer/ggml-vocab-llama-bpe.gguf;
 * times are wall clock on a possibly shared machine (medians and best of
 * three runs). Nothing is asserted.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/sampler.h"
#include "gpud/scheduler.h"

#define N_REQ 64

static uint64_t rng = 0x2545f4914f6cdd1dull;

static double unif(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

static void fill_logits(float *l, uint32_t nv)
{
	for (uint32_t i = 0; i < nv; i++)
		l[i] = (float)((unif() + unif() + unif() + unif() - 2.0) * 3.5);
	for (int k = 0; k < 8; k++)
		l[(uint32_t)(unif() * nv)] += (float)(6.0 + 4.0 * unif());
}

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* Median microseconds of one gpud_sampler_sample over draws rows. */
static double row_us(uint32_t nv, const struct gpud_sampler_params *p, int draws)
{
	static float t[256];
	float *l = malloc(sizeof(float) * nv);
	struct gpud_sampler *s = NULL;
	char err[SW_ERR_MAX];
	volatile int32_t sink = 0;

	if (!l || gpud_sampler_create(&s, (int32_t)nv, p, err, sizeof(err))) {
		free(l);
		return -1;
	}
	for (int i = 0; i < 16; i++) /* a history for the penalties */
		gpud_sampler_accept(s, (int32_t)(unif() * nv));
	for (int d = 0; d < draws; d++) {
		double t0;
		fill_logits(l, nv);
		t0 = bench_now();
		sink += gpud_sampler_sample(s, l);
		t[d] = (float)((bench_now() - t0) * 1e6);
	}
	(void)sink;
	qsort(t, (size_t)draws, sizeof(t[0]), cmp_f);
	gpud_sampler_free(s);
	free(l);
	return t[draws / 2];
}

/* Median microseconds of one gpud_logprobs_row with top alternatives. */
static double lp_us(uint32_t nv, uint32_t top, int draws)
{
	static float t[256];
	float *l = malloc(sizeof(float) * nv);
	struct gpud_logprobs lp;
	volatile float sink = 0;

	if (!l)
		return -1;
	for (int d = 0; d < draws; d++) {
		double t0;
		fill_logits(l, nv);
		t0 = bench_now();
		gpud_logprobs_row(l, (int32_t)nv, (int32_t)(unif() * nv), top, &lp);
		t[d] = (float)((bench_now() - t0) * 1e6);
		sink += lp.logprob;
	}
	(void)sink;
	qsort(t, (size_t)draws, sizeof(t[0]), cmp_f);
	free(l);
	return t[draws / 2];
}

static atomic_int n_done;
static atomic_long n_gen;

static int on_event(void *arg, const struct gpud_sched_event *ev)
{
	(void)arg;
	if (ev->kind == GPUD_SCHED_TOKEN)
		atomic_fetch_add(&n_gen, 1);
	else
		atomic_fetch_add(&n_done, 1);
	return 0;
}

/* Generated tokens per second: N_REQ requests of `tokens` tokens each on
 * one CPU device, sampled by `threads` threads (temperature or greedy).
 * Best of three runs. */
static double sched_rate(struct gpud_engine *e, uint32_t threads, bool greedy, uint32_t tokens,
			 uint32_t lp_top)
{
	double best = 0;

	for (int run = 0; run < 3; run++) {
		struct gpud_sched_params sp;
		struct gpud_sched *s = NULL;
		char err[SW_ERR_MAX];
		int32_t prompt[8];
		double t0;
		long g0;

		gpud_sched_params_default(&sp);
		sp.max_requests = N_REQ;
		sp.sample_threads = threads;
		if (gpud_sched_create(&s, &e, 1, &sp, err, sizeof(err))) {
			fprintf(stderr, "bench_sampling: sched: %s\n", err);
			return -1;
		}
		atomic_store(&n_done, 0);
		for (uint32_t i = 0; i < N_REQ; i++) {
			struct gpud_sched_req r = { .tokens = prompt, .n_tokens = 8, .cb = on_event,
						    .max_tokens = tokens, .logprobs = lp_top > 0,
						    .top_logprobs = lp_top };
			uint64_t id;

			for (int k = 0; k < 8; k++)
				prompt[k] = (int32_t)(1000 + 37 * i + 11 * k);
			gpud_sampler_params_default(&r.sampling);
			if (!greedy) {
				r.sampling.temperature = 0.8f;
				r.sampling.top_p = 0.95f;
				r.sampling.seed = i + 1;
			}
			if (gpud_sched_submit(s, &r, &id, err, sizeof(err))) {
				fprintf(stderr, "bench_sampling: submit: %s\n", err);
				gpud_sched_destroy(s);
				return -1;
			}
		}
		/* prefill (all prompts) first, then time decode steps only */
		while (atomic_load(&n_gen) < N_REQ)
			if (gpud_sched_step(s, 0, err, sizeof(err)) < 0)
				break;
		g0 = atomic_load(&n_gen);
		t0 = bench_now();
		while (atomic_load(&n_done) < N_REQ)
			if (gpud_sched_step(s, 0, err, sizeof(err)) < 0) {
				fprintf(stderr, "bench_sampling: step: %s\n", err);
				break;
			}
		double rate = (double)(atomic_load(&n_gen) - g0) / (bench_now() - t0);
		best = rate > best ? rate : best;
		atomic_store(&n_gen, 0);
		gpud_sched_destroy(s);
	}
	return best;
}

int main(int argc, char **argv)
{
	const char *vocab = "../shared/tokenizer/ggml-vocab-llama-bpe.gguf", *out_path = NULL;
	static const uint32_t sizes[] = { 32000, 128256 };
	uint32_t tokens = 24;
	char machine[256], date[64], err[SW_ERR_MAX], path[] = "/tmp/bench_sampling.XXXXXX";
	struct gpud_sampler_params ps[5];
	static const char *const names[5] = {
		"greedy (gpud_argmax)", "temperature 0.8", "temperature 0.8, top-p 0.95",
		"temperature 0.8, top-k 40, top-p 0.95, min-p 0.05",
		"temperature 0.8, repeat penalty 1.1 over 64",
	};
	struct gpud_mkmodel_params mp;
	struct gpud_engine_params ep;
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	FILE *out;
	int fd;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--vocab-from") && i + 1 < argc)
			vocab = argv[++i];
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out_path = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--vocab-from GGUF] [--tokens N] [--out FILE.md]\n",
				argv[0]);
			return 2;
		}
	}
	out = out_path ? fopen(out_path, "w") : stdout;
	if (!out)
		return 2;
	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	fprintf(out, "# Sampling on the host (bench_sampling)\n\n%s; %s\n\n", date, machine);

	for (int k = 0; k < 5; k++)
		gpud_sampler_params_default(&ps[k]);
	for (int k = 1; k < 5; k++)
		ps[k].temperature = 0.8f;
	ps[2].top_p = 0.95f;
	ps[3].top_k = 40;
	ps[3].top_p = 0.95f;
	ps[3].min_p = 0.05f;
	ps[4].penalty_last_n = 64;
	ps[4].repeat_penalty = 1.1f;
	fprintf(out, "## One row, one core (median of 64 draws)\n\n");
	fprintf(out, "| sampler | 32000 tokens | 128256 tokens |\n|---|---:|---:|\n");
	for (int k = 0; k < 5; k++) {
		fprintf(out, "| %s |", names[k]);
		for (int v = 0; v < 2; v++)
			fprintf(out, " %.0f us |", row_us(sizes[v], &ps[k], 64));
		fprintf(out, "\n");
		fflush(out);
	}
	for (uint32_t top = 0; top <= 20; top += top ? 15 : 5) {
		fprintf(out, "| log probabilities, %u alternatives (gpud_logprobs_row) |", top);
		for (int v = 0; v < 2; v++)
			fprintf(out, " %.0f us |", lp_us(sizes[v], top, 64));
		fprintf(out, "\n");
		fflush(out);
	}

	fd = mkstemp(path);
	if (fd < 0)
		return 2;
	close(fd);
	gpud_mkmodel_params_default(&mp);
	mp.out = path;
	mp.dim = 64;
	mp.n_layers = 1;
	mp.n_heads = 4;
	mp.n_kv_heads = 4;
	mp.ffn_dim = 128;
	mp.n_ctx = 256;
	mp.type = GPUD_TYPE_F32;
	mp.tied = true;
	mp.vocab_from = vocab;
	if (gpud_mkmodel(&mp, err, sizeof(err)) || gpud_model_load(&m, path, err, sizeof(err))) {
		fprintf(stderr, "bench_sampling: model: %s\n", err);
		unlink(path);
		return 2;
	}
	gpud_engine_params_default(&ep);
	ep.max_seqs = N_REQ;
	ep.max_batch_tokens = N_REQ * 8;
	if (gpud_engine_create(&e, m, &ep, err, sizeof(err))) {
		fprintf(stderr, "bench_sampling: engine: %s\n", err);
		return 2;
	}
	fprintf(out, "\n## The scheduler: %d requests decoding at once, one CPU device\n\n"
		"dim 64, 1 layer, F32, %u-token vocabulary; %u tokens each; decode tokens/s, "
		"best of 3 runs.\n\n| rows | sample_threads | tokens/s |\n|---|---:|---:|\n",
		N_REQ, gpud_engine_n_vocab(e), tokens);
	for (int g = 0; g < 3; g++) {
		static const uint32_t th[3] = { 1, 2, 0 };
		static const char *const rows[3] = {
			"temperature 0.8, top-p 0.95", "greedy (arg max)",
			"greedy, log probabilities of 5 alternatives",
		};
		for (int k = 0; k < 3; k++) {
			fprintf(out, "| %s | %u%s | %.0f |\n", rows[g], th[k],
				th[k] ? "" : " (one per CPU)",
				sched_rate(e, th[k], g > 0, tokens, g == 2 ? 5 : 0));
			fflush(out);
		}
	}
	gpud_engine_destroy(e);
	gpud_model_free(m);
	unlink(path);
	if (out != stdout)
		fclose(out);
	return 0;
}
