/* bench_kv.c - CPU decode speed against context length, f32 vs f16 KV.
 *
 * gpud.kv_type f16 halves the KV cache's bytes per token; the CPU backend
 * pays for it by widening each block's K and V to fp32 once per KV head
 * before the attention math (forward.c, attend()). Whether that is a win
 * depends on how much of a decode step is spent reading KV: little at a
 * short context, most of it at a long one. This bench measures where the
 * line is on this machine.
 *
 * The model is Llama-3.2-3B's attention (dim 3072, 24 query heads, 8 KV
 * heads of head_dim 128: 8 KiB of K+V per token and layer in f32) with
 * only 2 layers, an ffn of 1024 and the built-in byte vocabulary, in Q8_0
 * (75 MB), written once with gpud_mkmodel into --models-dir. A real 3B
 * step in Q8_0 reads 3.4 GB of weights (28 layers with an ffn of 8192, a
 * 128256-token output) next to 224 KiB of f32 KV per token; here the
 * weights are so few that KV weighs about 3.2 times as much per token
 * against them: context L here stands for a 3B model at ~3.2 L, and L
 * 8192 for one past 26k. Absolute tokens/s say nothing about a real
 * model; the f16 / f32 ratio at a given share of KV in the step does.
 *
 * For each context length L (ascending) the sequences are prefilled to L
 * (in chunks, only the positions past the previous L: the prefill figure
 * is the tokens/s of that increment), then for each batch B the first B
 * sequences of both engines (one per KV type) decode one random token per
 * step, the engines' steps in turn, for --seconds each after a warm-up
 * step, and are truncated back to L. Rates are aggregate decode tokens/s
 * (B tokens per step) from the best step and over all timed steps; "KV
 * MB/step" is the K and V a step reads (every visible position of every
 * sequence, each layer and KV head once: the query heads of a group share
 * the read).
 *
 * Prefill costs far more than decode here: a prefilled token's attention
 * grows with its position, so filling 8 sequences to 8192 positions would
 * take over five minutes a KV type on a 2-core machine. Points with B x L
 * above --max-kv-tokens (default 32768) are skipped, and only the
 * sequences a remaining point needs are prefilled: by default B = 8 stops
 * at 4096, B = 1 goes on to 8192.
 *
 * usage: bench_kv [--seconds S] [--threads N] [--models-dir DIR]
 *                 [--lengths 256,1024,...] [--batches 1,8]
 *                 [--max-kv-tokens N] [--out FILE.md] [--dat FILE.dat]
 * --dat writes the gnuplot data (bench/results/kv-*.gp reads it): one
 * block per batch size, rows L and the four rates. Nothing is asserted.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "common/err.h"
#include "gpud/engine.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"

#define MAX_LENS 8
#define MAX_BATCHES 4
#define MAXB 16
#define CHUNK 512       /* prefill tokens per step */
#define MAX_DECODE 256  /* timed decode steps per point, at most */
#define BLOCK_TOKENS 16
#define N_KV 2
#define STREAM_BYTES ((size_t)2 << 30) /* read bandwidth pass: 4x the LLC here */

static const enum gpud_type kv_types[N_KV] = { GPUD_TYPE_F32, GPUD_TYPE_F16 };

struct opts {
	double seconds;
	int threads;
	const char *models_dir;
	uint32_t lens[MAX_LENS];
	int n_lens;
	uint32_t batches[MAX_BATCHES];
	int n_batches;
	uint64_t max_kv_tokens; /* B * L above it: point skipped */
	const char *out;
	const char *dat;
};

/* One (L, B, KV type) measurement. */
struct point {
	double prefill;     /* tok/s of the prefill increment up to L (all sequences) */
	double best;        /* aggregate decode tok/s, best step */
	double mean;        /* the same over all timed steps */
	double step_ms;     /* mean step */
	double kv_mb;       /* KV read per timed step, mean, MB */
	uint32_t steps;
};

static struct point pts[MAX_LENS][MAX_BATCHES][N_KV];

static uint64_t rs = 0x9e3779b97f4a7c15ull;

static int32_t rnd_tok(uint32_t nv)
{
	rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
	return 3 + (int32_t)((rs >> 33) % (nv - 3));
}

static int parse_list(const char *s, uint32_t *v, int max, int *n)
{
	char *end;

	*n = 0;
	while (*s) {
		unsigned long x = strtoul(s, &end, 10);
		if (end == s || x == 0 || x > UINT32_MAX || *n == max)
			return -EINVAL;
		v[(*n)++] = (uint32_t)x;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -EINVAL;
	}
	return *n ? 0 : -EINVAL;
}

static int step_or_die(struct gpud_engine *e, const struct gpud_batch_entry *b, uint32_t n)
{
	char err[SW_ERR_MAX];
	int rc = gpud_engine_step(e, b, n, err, sizeof(err));

	if (rc)
		fprintf(stderr, "bench_kv: step: %s\n", err);
	return rc;
}

/* Writes the model into dir unless a file of that name is there. The name
 * carries the shape, so a changed shape never reuses an old file. */
static int make_model(const char *dir, uint32_t n_ctx, char *path, size_t cap)
{
	struct gpud_mkmodel_params p;
	struct stat sb;
	char err[SW_ERR_MAX];
	int rc;

	snprintf(path, cap, "%s/bench-kv-3b-attn-2l-ffn1024-ctx%u-q8_0.gguf", dir, n_ctx);
	if (stat(path, &sb) == 0)
		return 0;
	if (mkdir(dir, 0755) && errno != EEXIST) {
		fprintf(stderr, "bench_kv: %s: %s\n", dir, strerror(errno));
		return -errno;
	}
	gpud_mkmodel_params_default(&p);
	/* the 3B preset's rope and norms; its geometry below, kept explicit */
	gpud_mkmodel_preset(&p, "llama-3.2-3b");
	p.out = path;
	p.name = "bench-kv";
	p.dim = 3072;
	p.n_heads = 24;
	p.n_kv_heads = 8;
	p.n_layers = 2;
	p.ffn_dim = 1024;
	p.n_ctx = n_ctx;
	p.type = GPUD_TYPE_Q8_0;
	p.mix = GPUD_MKMODEL_PURE;
	p.seed = 32;
	p.tied = true;
	p.vocab_from = NULL; /* the byte vocabulary: a cheap logits row */
	fprintf(stderr, "bench_kv: writing %s ...\n", path);
	if ((rc = gpud_mkmodel(&p, err, sizeof(err))))
		fprintf(stderr, "bench_kv: mkmodel: %s\n", err);
	return rc;
}

/* Appends random tokens to seqs[0..n) until each holds len positions,
 * CHUNK tokens a step, logits only for a sequence's last chunk. Returns
 * the tokens/s of the whole, or a negative value on error. */
static double prefill_to(struct gpud_engine *e, const uint32_t *seqs, uint32_t n, uint32_t len)
{
	static int32_t toks[CHUNK];
	uint32_t nv = gpud_engine_n_vocab(e);
	uint64_t done = 0;
	double t0 = bench_now();

	for (uint32_t i = 0; i < n; i++) {
		uint32_t have;

		while ((have = gpud_engine_seq_len(e, seqs[i])) < len) {
			uint32_t k = len - have < CHUNK ? len - have : CHUNK;
			struct gpud_batch_entry b = { seqs[i], toks, k,
						      have + k == len ? GPUD_LOGITS_LAST
								      : GPUD_LOGITS_NONE };

			for (uint32_t j = 0; j < k; j++)
				toks[j] = have + j == 0 ? 1 : rnd_tok(nv);
			if (step_or_die(e, &b, 1))
				return -1;
			done += k;
		}
	}
	return done ? (double)done / (bench_now() - t0) : 0;
}

/* Decode on the first batch sequences of each engine (each at length
 * len): one warm-up step each, then steps taken in turn, f32 then f16,
 * until each engine has run `seconds` or MAX_DECODE steps. Interleaved
 * steps see the same machine: on a shared host its speed moves by 2x
 * within minutes, and a point measured type after type would compare
 * two different machines. The sequences are truncated back to len. */
static int decode_pair(struct gpud_engine *const *e, uint32_t (*seqs)[MAXB],
		       uint32_t batch, uint32_t len, double seconds, struct point *pt)
{
	static int32_t next[N_KV][MAXB];
	struct gpud_batch_entry b[N_KV][MAXB];
	double total[N_KV] = { 0 }, best[N_KV], kv[N_KV] = { 0 }, bpt[N_KV];
	uint32_t s, t;

	for (t = 0; t < N_KV; t++) {
		uint32_t nv = gpud_engine_n_vocab(e[t]);

		bpt[t] = (double)gpud_engine_block_bytes(e[t]) / BLOCK_TOKENS;
		best[t] = 1e30;
		for (uint32_t i = 0; i < batch; i++) {
			next[t][i] = rnd_tok(nv);
			b[t][i] = (struct gpud_batch_entry){ seqs[t][i], &next[t][i], 1,
							     GPUD_LOGITS_LAST };
		}
		if (step_or_die(e[t], b[t], batch))
			return -1;
	}
	for (s = 0; s < MAX_DECODE; s++) {
		for (t = 0; t < N_KV; t++) {
			uint32_t nv = gpud_engine_n_vocab(e[t]);
			double t0, dt;

			for (uint32_t i = 0; i < batch; i++) {
				next[t][i] = rnd_tok(nv);
				/* the new token sees every position before it and itself */
				kv[t] += bpt[t] * (gpud_engine_seq_len(e[t], seqs[t][i]) + 1);
			}
			t0 = bench_now();
			if (step_or_die(e[t], b[t], batch))
				return -1;
			dt = bench_now() - t0;
			best[t] = dt < best[t] ? dt : best[t];
			total[t] += dt;
		}
		if (s >= 2 && total[0] >= seconds && total[1] >= seconds) {
			s++;
			break;
		}
	}
	for (t = 0; t < N_KV; t++) {
		pt[t].steps = s;
		pt[t].best = batch / best[t];
		pt[t].mean = (double)s * batch / total[t];
		pt[t].step_ms = total[t] / s * 1e3;
		pt[t].kv_mb = kv[t] / s / 1e6;
		for (uint32_t i = 0; i < batch; i++)
			if (gpud_engine_seq_truncate(e[t], seqs[t][i], len))
				return -1;
	}
	return 0;
}

static void print_table(FILE *f, const struct opts *o, const double *bpt)
{
	fprintf(f, "KV bytes per token: f32 %.0f, f16 %.0f (gpud_engine_block_bytes / %d).\n"
		   "Decode tok/s are aggregate (B tokens a step): best step / mean over "
		   "the timed steps; f16/f32 compares the means. Points with B x L above "
		   "%llu cached positions are not measured (--max-kv-tokens).\n\n",
		bpt[0], bpt[1], BLOCK_TOKENS, (unsigned long long)o->max_kv_tokens);
	fprintf(f, "| L | B | KV MB/step f32 | KV MB/step f16 | decode tok/s f32 | "
		   "decode tok/s f16 | ms/step f32 | ms/step f16 | f16/f32 | "
		   "prefill tok/s f32 | prefill tok/s f16 |\n");
	fprintf(f, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (int l = 0; l < o->n_lens; l++)
		for (int k = 0, first = 1; k < o->n_batches; k++) {
			const struct point *a = &pts[l][k][0], *h = &pts[l][k][1];

			if (!a->steps || !h->steps)
				continue;
			fprintf(f, "| %u | %u | %.1f | %.1f | %.1f / %.1f | %.1f / %.1f | "
				   "%.1f | %.1f | %.2f | ",
				o->lens[l], o->batches[k], a->kv_mb, h->kv_mb, a->best, a->mean,
				h->best, h->mean, a->step_ms, h->step_ms, h->mean / a->mean);
			/* the prefill increment belongs to L, shown on its first row */
			if (first)
				fprintf(f, "%.0f | %.0f |\n", a->prefill, h->prefill);
			else
				fprintf(f, "- | - |\n");
			first = 0;
		}
}

static int write_dat(const char *path, const struct opts *o)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "bench_kv: %s: %s\n", path, strerror(errno));
		return -errno;
	}
	fprintf(f, "# bench_kv: aggregate decode tokens/s by context length L.\n"
		   "# One block (gnuplot index) per batch size B; its first line is\n"
		   "# the column headers.\n");
	for (int k = 0; k < o->n_batches; k++) {
		fprintf(f, "%s\"L\" \"f32 best\" \"f16 best\" \"f32 mean\" \"f16 mean\" "
			   "\"B=%u\"\n",
			k ? "\n\n" : "", o->batches[k]);
		for (int l = 0; l < o->n_lens; l++) {
			const struct point *a = &pts[l][k][0], *h = &pts[l][k][1];

			if (a->steps && h->steps)
				fprintf(f, "%u %.2f %.2f %.2f %.2f %u\n", o->lens[l], a->best,
					h->best, a->mean, h->mean, o->batches[k]);
		}
	}
	fclose(f);
	return 0;
}

/* Whether the point (lens[l], batches[k]) is measured. */
static bool fits(const struct opts *o, int l, int k)
{
	return (uint64_t)o->lens[l] * o->batches[k] <= o->max_kv_tokens;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct opts o = { .seconds = 2.0, .threads = (int)sysconf(_SC_NPROCESSORS_ONLN),
			  .models_dir = "/tmp/swarm-bench-models",
			  .lens = { 256, 1024, 2048, 4096, 8192 }, .n_lens = 5,
			  .batches = { 1, 8 }, .n_batches = 2, .max_kv_tokens = 32768 };
	struct gpud_engine *eng[N_KV] = { NULL, NULL };
	struct gpud_model *m = NULL;
	uint32_t seqs[N_KV][MAXB], max_b = 0, n_ctx;
	char machine[256], date[64], path[512], err[SW_ERR_MAX], cmd[1024];
	double bpt[N_KV], read_gbs[2], t_start = bench_now();
	size_t cl = 0;
	int rc = 1;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			o.seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			o.threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--models-dir") && i + 1 < argc)
			o.models_dir = argv[++i];
		else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) {
			if (parse_list(argv[++i], o.lens, MAX_LENS, &o.n_lens))
				goto usage;
		} else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
			if (parse_list(argv[++i], o.batches, MAX_BATCHES, &o.n_batches))
				goto usage;
		} else if (!strcmp(argv[i], "--max-kv-tokens") && i + 1 < argc)
			o.max_kv_tokens = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			o.out = argv[++i];
		else if (!strcmp(argv[i], "--dat") && i + 1 < argc)
			o.dat = argv[++i];
		else
			goto usage;
	}
	/* ascending: each length extends the sequences of the one before */
	qsort(o.lens, (size_t)o.n_lens, sizeof(o.lens[0]), cmp_u32);
	for (int k = 0; k < o.n_batches; k++) {
		if (o.batches[k] > MAXB)
			goto usage;
		max_b = o.batches[k] > max_b ? o.batches[k] : max_b;
	}
	for (int i = 0; i < argc; i++)
		cl += (size_t)snprintf(cmd + cl, cl < sizeof(cmd) ? sizeof(cmd) - cl : 0, "%s%s",
				       i ? " " : "", argv[i]);
	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	/* what the machine reads now, to read the step times against (it moves) */
	read_gbs[0] = bench_stream_gbs(STREAM_BYTES, o.threads);

	/* room for the longest context, its warm-up step and timed steps */
	n_ctx = (o.lens[o.n_lens - 1] + MAX_DECODE + 2 + BLOCK_TOKENS - 1) / BLOCK_TOKENS *
		BLOCK_TOKENS;
	if (make_model(o.models_dir, n_ctx, path, sizeof(path)))
		return 1;
	if (gpud_model_load(&m, path, err, sizeof(err))) {
		fprintf(stderr, "bench_kv: %s\n", err);
		return 1;
	}
	for (int t = 0; t < N_KV; t++) {
		struct gpud_engine_params ep;

		gpud_engine_params_default(&ep);
		ep.n_threads = o.threads;
		ep.n_ctx = n_ctx;
		ep.max_batch_tokens = CHUNK;
		ep.max_seqs = max_b;
		ep.max_logits = max_b;
		ep.block_tokens = BLOCK_TOKENS;
		ep.kv_type = kv_types[t];
		if (gpud_engine_create(&eng[t], m, &ep, err, sizeof(err))) {
			fprintf(stderr, "bench_kv: engine (%s KV): %s\n", gpud_type_name(kv_types[t]),
				err);
			goto out;
		}
		for (uint32_t i = 0; i < max_b; i++)
			if (gpud_engine_seq_add(eng[t], NULL, &seqs[t][i]))
				goto out;
		bpt[t] = (double)gpud_engine_block_bytes(eng[t]) / BLOCK_TOKENS;
	}
	fprintf(stderr, "bench_kv: %s, %.1f MB of weights, %d threads\n", path,
		gpud_model_weight_bytes(m) / 1e6, o.threads);

	for (int l = 0; l < o.n_lens; l++) {
		uint32_t need = 0; /* sequences the points at this L decode */

		for (int k = 0; k < o.n_batches; k++)
			if (fits(&o, l, k) && o.batches[k] > need)
				need = o.batches[k];
		if (!need)
			break; /* longer lengths fit no better */
		for (int t = 0; t < N_KV; t++) {
			double r = prefill_to(eng[t], seqs[t], need, o.lens[l]);

			if (r < 0)
				goto out;
			for (int k = 0; k < o.n_batches; k++)
				pts[l][k][t].prefill = r;
		}
		for (int k = 0; k < o.n_batches; k++) {
			struct point *pt = pts[l][k];

			if (!fits(&o, l, k))
				continue;
			if (decode_pair(eng, seqs, o.batches[k], o.lens[l], o.seconds, pt))
				goto out;
			fprintf(stderr, "bench_kv: L %5u B %2u: tok/s f32 %7.1f best %7.1f mean, "
					"f16 %7.1f best %7.1f mean, %u steps each (%.0f s)\n",
				o.lens[l], o.batches[k], pt[0].best, pt[0].mean, pt[1].best,
				pt[1].mean, pt[0].steps, bench_now() - t_start);
		}
	}
	for (int t = 0; t < N_KV; t++) {
		struct gpud_engine_stats st;

		gpud_engine_stats(eng[t], &st);
		if (st.allocs_after_warmup)
			fprintf(stderr, "bench_kv: %s KV: %llu allocations after warm-up\n",
				gpud_type_name(kv_types[t]),
				(unsigned long long)st.allocs_after_warmup);
	}

	read_gbs[1] = bench_stream_gbs(STREAM_BYTES, o.threads);
	printf("machine: %s\ndate: %s\ncommand: %s\nmodel: %s (%.1f MB of weights)\n"
	       "threads: %d, %.1f s per point and KV type, %.0f s in all\n"
	       "read bandwidth: %.1f GB/s before, %.1f GB/s after\n\n",
	       machine, date, cmd, path, gpud_model_weight_bytes(m) / 1e6, o.threads, o.seconds,
	       bench_now() - t_start, read_gbs[0], read_gbs[1]);
	print_table(stdout, &o, bpt);
	if (o.out) {
		FILE *f = fopen(o.out, "w");

		if (!f) {
			fprintf(stderr, "bench_kv: %s: %s\n", o.out, strerror(errno));
			goto out;
		}
		fprintf(f, "# bench_kv - decode speed against context length, f32 vs f16 KV\n\n"
			   "- machine: %s\n- date: %s\n- command: `%s`\n"
			   "- model: Llama-3.2-3B attention (dim 3072, 24 heads, 8 KV heads, "
			   "head_dim 128), 2 layers, ffn 1024, byte vocabulary, Q8_0: "
			   "%.1f MB of weights\n- threads: %d; %.1f s (at most %d steps) of decode "
			   "per point and KV type, the two types' steps in turn\n"
			   "- read bandwidth (bench_stream_gbs, %zu MiB, best of 5 passes): "
			   "%.1f GB/s before the sweep, %.1f GB/s after\n\n",
			machine, date, cmd, gpud_model_weight_bytes(m) / 1e6, o.threads, o.seconds,
			MAX_DECODE, STREAM_BYTES >> 20, read_gbs[0], read_gbs[1]);
		print_table(f, &o, bpt);
		fclose(f);
	}
	if (o.dat && write_dat(o.dat, &o))
		goto out;
	rc = 0;
out:
	for (int t = 0; t < N_KV; t++)
		gpud_engine_destroy(eng[t]);
	gpud_model_free(m);
	return rc;
usage:
	fprintf(stderr, "usage: %s [--seconds S] [--threads N] [--models-dir DIR] "
			"[--lengths 256,1024,...] [--batches 1,8] [--max-kv-tokens N] "
			"[--out FILE.md] [--dat FILE.dat]\n",
		argv[0]);
	return 2;
}
