/* bench_engine.c - prefill and decode throughput of the engine.
 *
 * For each model: prefill tokens/s and decode tokens/s at batch 1 and
 * batch 16 (16 sequences per step), with the achieved weight-read
 * bandwidth of decode (weight bytes per step / step time) next to the
 * memory's read bandwidth measured beside it: a decode step reads all its
 * weights once, so its limit is what the threads read together in one
 * sustained pass over a buffer far larger than the LLC (bench_stream_pass).
 * The machine is shared and its bandwidth moves, so one such pass follows
 * every timed batch-1 decode step, and the step's best and mean GB/s are
 * compared with the passes' best and mean over the same seconds. The
 * figures of bench_stream_gbs before and after the models, the burst
 * figure of bench_read_gbs and memcpy's (each byte one read and one
 * write) are printed too. Models: the real
 * stories260K and generated ~110M Llama models (dim 768, 12 layers, 12
 * heads, ffn 2048, the 32000-token Llama 2 vocabulary, tied output) in
 * F32, F16 and Q8_0, written once with gpud_mkmodel into --models-dir.
 *
 * Targets reported against (never asserted): batch-1 decode of the 3B
 * preset >= 80% of read bandwidth for the quantized types; batch-16 aggregate decode >= 4x batch-1.
 * The machine is shared: rates come from the best step of each
 * measurement, with the mean decode rate in the last column.
 *
 * --3b benches the llama-3.2-3b preset (gpud_mkmodel_preset: dim 3072, 28
 * layers, tied, the 128256-token llama-bpe vocabulary) instead of the
 * 110M shape; --batch1-only skips the batch-16 measurements (minutes per
 * step on a 3B model). Types are mkmodel's: any weight type, or the
 * q4_k_m / q5_k_m mixes.
 *
 * usage: bench_engine [--seconds S] [--threads N] [--models-dir DIR]
 *                     [--types f32,f16,q8_0] [--no-110m] [--3b]
 *                     [--batch1-only] [--out FILE.md]
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
#define VOCAB32K SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-spm.gguf"
#define VOCAB128K SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-bpe.gguf"
#define MAXB 16
#define PROMPT 32   /* prefill tokens per sequence */
#define MAX_DECODE 96

struct opts {
	double seconds;
	int threads;
	const char *models_dir;
	const char *types;
	int no_110m;
	int preset_3b;
	int batch1_only;
	const char *out;
};

struct cell {
	char model[48];
	char type[8];
	double weight_mb;
	double prefill[2];     /* tok/s at batch 1, 16 (best step) */
	double decode[2];      /* aggregate tok/s at batch 1, 16 (best step) */
	double decode_mean[2]; /* the same over all timed steps */
	double decode_gbs;     /* batch-1 weight-read GB/s (best step) */
	double decode_mean_gbs; /* the same over all timed steps */
	double read_gbs;       /* best read pass beside the batch-1 steps */
	double read_mean_gbs;  /* their mean */
};

static uint64_t rs = 12345;
static int32_t rnd_tok(uint32_t nv)
{
	rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
	return 3 + (int32_t)((rs >> 33) % (nv - 3));
}

static int step_or_die(struct gpud_engine *e, struct gpud_batch_entry *b, uint32_t n)
{
	char err[SW_ERR_MAX];
	int rc = gpud_engine_step(e, b, n, err, sizeof(err));
	if (rc)
		fprintf(stderr, "bench_engine: step: %s\n", err);
	return rc;
}

/* Prefill: `batch` sequences of PROMPT tokens in one step, repeated
 * (freeing and re-adding the sequences) until `seconds` pass (at least
 * twice). Decode: from there, `batch` tokens per step until `seconds`
 * pass or MAX_DECODE steps. The machine is shared, so rates come from the
 * best (shortest) step, as bench_memcpy_gbs takes its best run; the mean
 * decode rate is returned too. */
struct rates {
	double prefill;      /* tok/s, best step */
	double decode;       /* tok/s, best step */
	double decode_mean;  /* tok/s over all timed steps */
	double step_best;    /* s, best decode step */
	double step_mean;    /* s */
	double read_best;    /* GB/s, best read pass beside the decode steps */
	double read_mean;    /* GB/s, all the passes' bytes over their time */
	uint32_t steps;
};

/* One pass of rd (n bytes) after a decode step: the better GB/s into
 * *best, its time added to *secs and its bytes to *bytes. The engine's
 * workers spin a little after a step before they sleep (threadpool.c,
 * 0.1 ms): the pass starts after that. */
static void read_beside(struct bench_stream *rd, double *best, double *secs, double *bytes,
			size_t n)
{
	struct timespec pause = { 0, 300000 };
	double g;

	nanosleep(&pause, NULL);
	g = bench_stream_pass(rd);
	if (g <= 0)
		return;
	*best = g > *best ? g : *best;
	*secs += (double)n / (g * 1e9);
	*bytes += (double)n;
}

/* rd: when not NULL, read passes beside the decode steps (rates). */
static int measure(struct gpud_engine *e, uint32_t batch, double seconds,
		   struct bench_stream *rd, size_t rd_bytes, struct rates *r)
{
	static int32_t prompt[MAXB][PROMPT];
	static int32_t next[MAXB];
	struct gpud_batch_entry b[MAXB];
	uint32_t seq[MAXB], nv = gpud_engine_n_vocab(e);
	double t0, t, total = 0, best = 1e30;
	uint32_t rounds = 0, i, s;

	for (i = 0; i < batch; i++)
		for (uint32_t j = 0; j < PROMPT; j++)
			prompt[i][j] = j == 0 ? 1 : rnd_tok(nv);
	for (;;) {
		for (i = 0; i < batch; i++) {
			if (gpud_engine_seq_add(e, NULL, &seq[i]))
				return -1;
			b[i] = (struct gpud_batch_entry){ seq[i], prompt[i], PROMPT, GPUD_LOGITS_LAST };
		}
		t0 = bench_now();
		if (step_or_die(e, b, batch))
			return -1;
		t = bench_now() - t0;
		best = t < best ? t : best;
		total += t;
		rounds++;
		if (rounds >= 2 && total >= seconds)
			break;
		for (i = 0; i < batch; i++)
			gpud_engine_seq_free(e, seq[i]);
	}
	r->prefill = (double)batch * PROMPT / best;

	/* one warm-up decode step, then timed steps */
	for (i = 0; i < batch; i++) {
		next[i] = rnd_tok(nv);
		b[i] = (struct gpud_batch_entry){ seq[i], &next[i], 1, GPUD_LOGITS_LAST };
	}
	if (step_or_die(e, b, batch))
		return -1;
	total = 0;
	best = 1e30;
	r->read_best = 0;
	double rd_secs = 0, rd_total = 0;

	for (s = 0; s < MAX_DECODE; s++) {
		for (i = 0; i < batch; i++)
			next[i] = rnd_tok(nv);
		t0 = bench_now();
		if (step_or_die(e, b, batch))
			return -1;
		t = bench_now() - t0;
		best = t < best ? t : best;
		total += t;
		if (rd)
			read_beside(rd, &r->read_best, &rd_secs, &rd_total, rd_bytes);
		if (s >= 2 && total >= seconds) {
			s++;
			break;
		}
	}
	r->steps = s;
	r->decode = batch / best;
	r->decode_mean = (double)s * batch / total;
	r->step_best = best;
	r->step_mean = total / s;
	r->read_mean = rd_secs > 0 ? rd_total / rd_secs * 1e-9 : 0;
	for (i = 0; i < batch; i++)
		gpud_engine_seq_free(e, seq[i]);
	return 0;
}

static int bench_model(const char *path, const char *label, const char *type,
		       const struct opts *o, struct bench_stream *rd, size_t rd_bytes,
		       struct cell *c)
{
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	struct gpud_engine_params ep;
	char err[SW_ERR_MAX];
	int rc;

	if ((rc = gpud_model_load(&m, path, err, sizeof(err)))) {
		fprintf(stderr, "bench_engine: %s\n", err);
		return rc;
	}
	gpud_engine_params_default(&ep);
	ep.n_threads = o->threads;
	ep.max_batch_tokens = MAXB * PROMPT;
	ep.max_seqs = MAXB;
	ep.max_logits = MAXB;
	ep.block_tokens = 16;
	ep.n_ctx = PROMPT + MAX_DECODE + 16;
	if ((rc = gpud_engine_create(&e, m, &ep, err, sizeof(err)))) {
		fprintf(stderr, "bench_engine: %s\n", err);
		gpud_model_free(m);
		return rc;
	}
	memset(c, 0, sizeof(*c));
	snprintf(c->model, sizeof(c->model), "%s", label);
	snprintf(c->type, sizeof(c->type), "%s", type);
	c->weight_mb = gpud_model_weight_bytes(m) / 1e6;
	for (int k = 0; k < (o->batch1_only ? 1 : 2) && !rc; k++) {
		struct rates r;
		/* read passes only beside a model that cannot stay in the LLC */
		rc = measure(e, k ? MAXB : 1, o->seconds,
			     k || gpud_model_weight_bytes(m) < 2.0 * bench_llc_bytes() ? NULL : rd,
			     rd_bytes, &r);
		if (rc)
			break;
		c->prefill[k] = r.prefill;
		c->decode[k] = r.decode;
		c->decode_mean[k] = r.decode_mean;
		if (k == 0) {
			c->decode_gbs = gpud_model_weight_bytes(m) / r.step_best / 1e9;
			c->decode_mean_gbs = gpud_model_weight_bytes(m) / r.step_mean / 1e9;
			c->read_gbs = r.read_best;
			c->read_mean_gbs = r.read_mean;
		}
	}
	struct gpud_engine_stats st;
	gpud_engine_stats(e, &st);
	if (st.allocs_after_warmup)
		fprintf(stderr, "bench_engine: %s: %llu allocations after warm-up\n", label,
			(unsigned long long)st.allocs_after_warmup);
	gpud_engine_destroy(e);
	gpud_model_free(m);
	return rc;
}

/* Writes the 110M (or 3B preset) model of type t into dir unless it is
 * already there. */
static int make_110m(const char *dir, const char *tname, int preset_3b, char *path, size_t cap)
{
	struct gpud_mkmodel_params p;
	struct stat sb;
	char err[SW_ERR_MAX];
	enum gpud_type t;
	enum gpud_mkmodel_mix mix;
	int rc;

	if (gpud_mkmodel_parse_type(tname, &t, &mix)) {
		fprintf(stderr, "bench_engine: unknown type %s\n", tname);
		return -EINVAL;
	}
	snprintf(path, cap, "%s/bench-%s-%s.gguf", dir, preset_3b ? "3b" : "110m", tname);
	if (stat(path, &sb) == 0)
		return 0;
	gpud_mkmodel_params_default(&p);
	if (preset_3b) {
		gpud_mkmodel_preset(&p, "llama-3.2-3b");
		p.out = path;
		p.name = "bench-3b";
		p.type = t;
		p.mix = mix;
		p.seed = 3;
		p.vocab_from = VOCAB128K;
		fprintf(stderr, "bench_engine: writing %s ...\n", path);
		if ((rc = gpud_mkmodel(&p, err, sizeof(err))))
			fprintf(stderr, "bench_engine: mkmodel: %s\n", err);
		return rc;
	}
	p.out = path;
	p.name = "bench-110m";
	p.dim = 768;
	p.n_layers = 12;
	p.n_heads = 12;
	p.n_kv_heads = 12;
	p.ffn_dim = 2048;
	p.n_ctx = 1024;
	p.type = t;
	p.mix = mix;
	p.seed = 110;
	p.tied = true;
	p.vocab_from = VOCAB32K;
	fprintf(stderr, "bench_engine: writing %s ...\n", path);
	if ((rc = gpud_mkmodel(&p, err, sizeof(err))))
		fprintf(stderr, "bench_engine: mkmodel: %s\n", err);
	return rc;
}

/* Columns: ... | decode b1 weight GB/s | read GB/s beside | % of read bw
 * (best step / best pass) | the same of the means | ... (engine_ab.sh
 * reads them by position). */
static void print_table(FILE *f, const struct cell *c, int n)
{
	fprintf(f, "| model | type | weights MB | prefill b1 tok/s | prefill b16 tok/s | "
		   "decode b1 tok/s | decode b1 weight GB/s | read GB/s beside | %% of read bw | "
		   "%% of read bw, means | decode b16 tok/s (aggregate) | b16 / b1 | "
		   "decode b1 / b16 mean tok/s |\n");
	fprintf(f, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (int i = 0; i < n; i++) {
		double pct = c[i].read_gbs > 0 ? 100.0 * c[i].decode_gbs / c[i].read_gbs : 0;
		double pct_mean = c[i].read_mean_gbs > 0
					  ? 100.0 * c[i].decode_mean_gbs / c[i].read_mean_gbs
					  : 0;

		fprintf(f, "| %s | %s | %.1f | %.1f | ", c[i].model, c[i].type, c[i].weight_mb,
			c[i].prefill[0]);
		if (c[i].prefill[1] == 0) /* --batch1-only */
			fprintf(f, "- | ");
		else
			fprintf(f, "%.1f | ", c[i].prefill[1]);
		if (c[i].read_gbs > 0)
			fprintf(f, "%.1f | %.2f | %.2f | %.0f%% | %.0f%% | ", c[i].decode[0],
				c[i].decode_gbs, c[i].read_gbs, pct, pct_mean);
		else /* in the LLC: no read passes */
			fprintf(f, "%.1f | %.2f | - | - | - | ", c[i].decode[0], c[i].decode_gbs);
		if (c[i].prefill[1] == 0)
			fprintf(f, "- | - | %.1f / - |\n", c[i].decode_mean[0]);
		else
			fprintf(f, "%.1f | %.2fx | %.1f / %.1f |\n", c[i].decode[1],
				c[i].decode[1] / c[i].decode[0], c[i].decode_mean[0],
				c[i].decode_mean[1]);
	}
}

int main(int argc, char **argv)
{
	struct opts o = { 2.0, 2, "/tmp/swarm-bench-models", "f32,f16,q8_0", 0, 0, 0, NULL };
	struct cell cells[8];
	int n = 0;
	char machine[256], date[64], path[512], types[64];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			o.seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			o.threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--models-dir") && i + 1 < argc)
			o.models_dir = argv[++i];
		else if (!strcmp(argv[i], "--types") && i + 1 < argc)
			o.types = argv[++i];
		else if (!strcmp(argv[i], "--no-110m"))
			o.no_110m = 1;
		else if (!strcmp(argv[i], "--3b"))
			o.preset_3b = 1;
		else if (!strcmp(argv[i], "--batch1-only"))
			o.batch1_only = 1;
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			o.out = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--seconds S] [--threads N] [--models-dir DIR] "
					"[--types f32,f16,q8_0] [--no-110m] [--3b] [--batch1-only] "
					"[--out FILE.md]\n",
				argv[0]);
			return 2;
		}
	}
	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	/* a pass over as many bytes as a 3B model's step reads, or more */
	size_t stream_bytes = 16 * bench_llc_bytes() > ((size_t)512 << 20)
				      ? 16 * bench_llc_bytes()
				      : (size_t)512 << 20;
	double memcpy_gbs = bench_memcpy_gbs(4 * bench_llc_bytes(), o.threads);
	double burst_gbs = bench_read_gbs(4 * bench_llc_bytes(), o.threads);
	double read0 = bench_stream_gbs(stream_bytes, o.threads);
	struct bench_stream *rd = bench_stream_new(stream_bytes, o.threads);

	if (!rd) {
		fprintf(stderr, "bench_engine: no memory for a %zu MiB read buffer\n",
			stream_bytes >> 20);
		return 1;
	}
	fprintf(stderr, "bench_engine: memcpy %.2f GB/s, read %.2f GB/s sustained (%.2f burst) "
			"with %d threads\n",
		memcpy_gbs, read0, burst_gbs, o.threads);

	if (bench_model(STORIES, "stories260K", "f32", &o, rd, stream_bytes, &cells[n]) == 0)
		n++;
	if (!o.no_110m) {
		if (mkdir(o.models_dir, 0755) && errno != EEXIST) {
			fprintf(stderr, "bench_engine: %s: %s\n", o.models_dir, strerror(errno));
			return 1;
		}
		snprintf(types, sizeof(types), "%s", o.types);
		for (char *save = NULL, *t = strtok_r(types, ",", &save); t && n < 8;
		     t = strtok_r(NULL, ",", &save)) {
			if (make_110m(o.models_dir, t, o.preset_3b, path, sizeof(path)))
				continue;
			if (bench_model(path, o.preset_3b ? "gen-3B" : "gen-110M", t, &o, rd, stream_bytes,
					&cells[n]) == 0)
				n++;
		}
	}

	/* Read bandwidth before and after the models (the machine is
	 * shared): the better figure is the limit a weight stream had. */
	bench_stream_free(rd);
	double read1 = bench_stream_gbs(stream_bytes, o.threads);
	double read_gbs = read1 > read0 ? read1 : read0;

	printf("machine: %s\ndate: %s\nthreads: %d, %.1f s per measurement, prefill %d tokens "
	       "per sequence, batch 16 = 16 sequences per step, rates from the best step\n"
	       "memcpy: %.2f GB/s; read bandwidth: %.2f GB/s sustained (before %.2f, after "
	       "%.2f; burst %.2f)\n\n",
	       machine, date, o.threads, o.seconds, PROMPT, memcpy_gbs, read_gbs, read0, read1,
	       burst_gbs);
	print_table(stdout, cells, n);
	if (o.out) {
		FILE *f = fopen(o.out, "w");
		if (!f) {
			fprintf(stderr, "bench_engine: %s: %s\n", o.out, strerror(errno));
			return 1;
		}
		fprintf(f, "# bench_engine\n\n- machine: %s\n- date: %s\n- threads: %d\n"
			   "- memcpy bandwidth: %.2f GB/s (bench_memcpy_gbs, %d threads)\n"
			   "- read bandwidth: %.2f GB/s sustained (bench_stream_gbs over %zu MiB, "
			   "%d threads, better of %.2f before and %.2f after the models; the "
			   "burst figure of bench_read_gbs: %.2f GB/s)\n\n",
			machine, date, o.threads, memcpy_gbs, o.threads, read_gbs, stream_bytes >> 20,
			o.threads, read0, read1, burst_gbs);
		print_table(f, cells, n);
		fclose(f);
	}
	return n > 0 ? 0 : 1;
}
