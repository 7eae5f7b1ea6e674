/* backend_cmp.c - the CUDA backend against the CPU backend, through the
 * ops tables of gpud/backend.h (tests/gpu/run; built only with CUDA).
 *
 *   backend_cmp --model PATH [--rounds N] [--bound B] [--seed S] [--max-prompt N]
 *               [--device cuda:0|cpu] [--kv-type f32|f16]
 *   backend_cmp --model PATH --bench [--label NAME] [--out FILE.md] [--long-context N]
 *               [--quick] [--long-f16]
 *   backend_cmp --model PATH --profile [--label NAME] [--out FILE.md] [--quick]
 *   backend_cmp --model PATH --stages [--label NAME] [--out FILE.md] [--quick] [--copy-gbs G]
 *
 * The device under test is cuda:0 (the registry's table for "cuda",
 * gpud/backend.h); --device cpu puts a second CPU instance there instead,
 * which checks this harness itself in any build (meson test
 * backend_cmp_harness: the error must be 0 and nothing allocated).
 *
 * Compare (default): one CPU and one cuda:0 instance of the model, each
 * with its own KV; N rounds of random ragged batches - up to 8 sequences,
 * some in prefill (a random chunk of their prompt), the others decoding
 * one token, each with a random compiled mask (random segments, each row
 * seeing itself and each earlier segment with probability 1/2) or plain
 * causal - run on both; every logits row is compared:
 * max |cuda - cpu| / max |cpu| over the row, worst over the run. Prints
 * the worst error and exits 1 when it passes the bound, 0 else. Default
 * bounds: 1e-3 for F32 models, 1e-2 for F16/BF16, 2e-2 for Q8_0/Q4_0, the
 * int8 path's bound against the reference (reference_test), 4e-2 for the
 * types the device holds as Q8_0 (K-quants, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * IQ4_XS: gpud_cuda_pack_rows requantizes them at upload, a second int8
 * rounding the CPU does not make; on cuemu, 10 rounds: tiny q4_k_m 0.027,
 * iq4_xs 0.019, q5_0 0.015, against q8_0 0.011 on the same shape). That path
 * quantizes every matmul's activations; once the two backends' sums, equal
 * but for their fp32 order, round one activation to another int8 step, the
 * two runs are two draws of that quantization noise (on cuemu: 1.2e-2 for
 * a 2-layer, dim-768 model shaped like Llama-3.2-3B, where the same model
 * in F32 agrees to 1.4e-6).
 * A third of the sequences with one logits row want only its arg max
 * (greedy decoding, gpud_fwd_seq.argmax): the device's arg max (ops
 * argmax) must be gpud_argmax of every row it downloads, and on the
 * others pick a logit within twice the bound of the CPU's greatest.
 * alloc.device of the cuda instance (stats allocs_after_init) must stay 0
 * over the run too. Then, on the device alone: hiding s0 from G changes
 * only G's logits, and a prompt prefilled one KV block per step matches
 * one whole prefill step (mask_props). It prints a digest of every logits
 * row and id the device returned: two runs that must compute the same
 * bits (GPUD_CUDA_FUSE_NORM=0 and not) print the same digest. The first
 * two rounds are one and two sequences, each prompt in one step, then
 * decode steps (batches of 1 and 2 tokens). --kv-type f16 runs both backends
 * with f16 KV storage (gpud.kv_type): both round the same K and V, so the
 * same bounds hold.
 *
 * Bench: cuda:0 only. Decode tokens/s at batch 1, 16 and 64 (each sequence
 * first prefilled with 32 tokens; median of the timed steps; greedy: the
 * arg max comes back, and at batch 1 and 64 also with every logits row
 * downloaded, as sampling needs), prefill
 * tokens/s (one 512-token chunk), and the cost of a compiled mask on a
 * decode step (batch 16, the same cached mask every step, against plain
 * causal): what a mask-cache hit costs on the device; with --long-f16,
 * the long-context decode rows again on an instance with f16 KV (half the
 * bytes the attention reads). Appends a markdown
 * table row per figure to --out (stdout when absent).
 *
 * Profile: cuda:0 only. An instance with the kernel profile on
 * (GPUD_CUDA_PROFILE=1, cuda.h: eager steps, an event before each launch)
 * runs the bench's decode steps at batch 1, 16 and 64 and a 512-token
 * prefill (--quick: batch 1 and 16, 128 tokens); appends a table per case
 * to --out: each (stage, launch) with its launches and microseconds per
 * step and its share, the largest first.
 *
 * Stages: cuda:0 only. An instance with the stage profile on
 * (GPUD_CUDA_PROFILE=graph, cuda.h: steps as usual) runs the bench's
 * decode steps at batch 1, 16, 2 and 64 (--quick: 1 and 16), and after
 * each times every (stage, launch) pair of that step captured alone into
 * a graph (every layer's launches of it), the step's own graph, and
 * graphs of empty kernels (what replays and launches cost alone); appends
 * a table per batch: the pairs in the step's order with microseconds per
 * step, share of the step's graph, weight bytes read and GB/s (and the
 * share of --copy-gbs, gpu_bw's copy bandwidth). The eager profile's rows
 * carry the host's launch gaps; these carry only what a graph has.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "gpud/backend.h"
#include "gpud/backend/cpu/cpu.h"
#include "gpud/backend/cuda/cuda.h"
#include "gpud/draw.h"
#include "sw_config.h"
#if SW_CUEMU
#include "tests/cuemu/cuemu.h"
#endif
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/quant.h"
#include "gpud/sampler.h"
#include "proto/mask.h"

#define MAX_SEQS 64
#define BLOCK_TOKENS 16
#define SEQ_BLOCKS 64  /* 1024 positions per sequence */
#define LONG_CTX 960   /* the bench's long context: + 40 decode steps < 1024 */
#define MAX_BATCH 1024
#define MAX_SEGS 8

struct inst {
	const struct gpud_backend_ops *ops;
	void *ctx;
};

struct seq {
	uint32_t blocks[SEQ_BLOCKS];
	uint32_t len;      /* positions in KV */
	uint32_t prompt;   /* prompt tokens (the mask's n_prompt) */
	struct gpud_mask mask;
	bool masked;
	_Alignas(16) unsigned char mask_mem[8192];
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t max_prompt = 200; /* --max-prompt: tokens of a sequence's prompt */
static uint32_t long_ctx = LONG_CTX; /* --long-context: the bench's long decode context */
static bool bench_quick;             /* --quick: fewer timed steps (an emulator's bench) */
static bool bench_long_f16;          /* --long-f16: long-context rows with f16 KV too */
static const struct gpud_backend_ops *dut; /* the backend under test */
#if SW_HAVE_CUDA
static bool profiling; /* --profile: instances keep a kernel profile */
/* --ncu: the decode step of decode_step_s marked as a profiler range */
static uint32_t ncu_mark = UINT32_MAX;
static int ncu_rc;
#endif
static enum gpud_type kv_type = GPUD_TYPE_F32; /* --kv-type */

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int inst_init_kv(struct inst *in, const struct gpud_backend_ops *ops,
			const struct gpud_model *m, uint32_t n_seqs, enum gpud_type kt)
{
	struct gpud_backend_config bc = {
		.model = m,
		.ordinal = 0,
		.n_threads = 0,
		.n_blocks = n_seqs * SEQ_BLOCKS,
		.block_tokens = BLOCK_TOKENS,
		.max_batch_tokens = MAX_BATCH,
		.max_seqs = n_seqs,
		.max_logits = MAX_BATCH,
		.kv_type = kt,
	};
	char err[SW_ERR_MAX] = "";
	int rc;

	in->ops = ops;
	rc = ops->init(&in->ctx, &bc, err, sizeof(err));
	if (rc)
		fprintf(stderr, "backend_cmp: %s: init: %s\n", ops->name, err);
	return rc;
}

static int inst_init(struct inst *in, const struct gpud_backend_ops *ops,
		     const struct gpud_model *m, uint32_t n_seqs)
{
	return inst_init_kv(in, ops, m, n_seqs, kv_type);
}

static uint64_t allocs(const struct inst *in)
{
	struct gpud_backend_stats st = { 0 };

	if (in->ops->stats)
		in->ops->stats(in->ctx, &st);
	return st.allocs_after_init;
}

/* A random mask over s's prompt: up to MAX_SEGS segments. */
static void random_mask(struct seq *s)
{
	uint16_t idx[MAX_SEGS + 1][MAX_SEGS + 1];
	struct proto_mask_row rows[MAX_SEGS + 1];
	uint32_t seg_tokens[MAX_SEGS], n = 1 + rnd(MAX_SEGS), left = s->prompt;
	struct proto_mask_desc d = { .n_segments = n, .rows = rows };

	s->masked = rnd(4) != 0 && s->prompt >= n;
	if (!s->masked)
		return;
	for (uint32_t i = 0; i < n; i++) {
		seg_tokens[i] = i + 1 == n ? left : rnd(left - (n - 1 - i)) + 1;
		if (seg_tokens[i] > left - (n - 1 - i))
			seg_tokens[i] = left - (n - 1 - i);
		left -= seg_tokens[i];
	}
	for (uint32_t i = 0; i <= n; i++) {
		rows[i].idx = idx[i];
		rows[i].n = 0;
		for (uint32_t j = 0; j < i; j++)
			if (rnd(2))
				idx[i][rows[i].n++] = (uint16_t)j;
		idx[i][rows[i].n++] = (uint16_t)i;
	}
	if (gpud_mask_compile(&d, seg_tokens, BLOCK_TOKENS, s->mask_mem, sizeof(s->mask_mem),
			      &s->mask)) {
		s->masked = false;
		return;
	}
}

static const char *type_of(const struct gpud_model *m)
{
	return gpud_type_name(gpud_model_weights(m)->layers[0].wq.type);
}

static int forward(struct inst *in, const struct gpud_fwd_batch *b)
{
	char err[SW_ERR_MAX] = "";
	int rc = in->ops->forward(in->ctx, b, err, sizeof(err));

	if (rc)
		fprintf(stderr, "backend_cmp: %s: forward: %s\n", in->ops->name, err);
	return rc;
}

/* Worst relative difference (max |a - b| / max |a| per row) of rows
 * [r0, r1) of two (rows, nv) logits arrays. */
static double rows_diff(const float *a, const float *b, uint32_t r0, uint32_t r1, uint32_t nv)
{
	double worst = 0;

	for (uint32_t r = r0; r < r1; r++) {
		double dmax = 0, amax = 0;

		for (uint32_t v = 0; v < nv; v++) {
			double d = fabs((double)a[(size_t)r * nv + v] - b[(size_t)r * nv + v]);

			if (!(d == d))
				d = INFINITY;
			dmax = d > dmax ? d : dmax;
			amax = fabs(a[(size_t)r * nv + v]) > amax ? fabs(a[(size_t)r * nv + v]) : amax;
		}
		if (amax > 0 && dmax / amax > worst)
			worst = dmax / amax;
	}
	return worst;
}

#define PROP_SEG 16 /* tokens of each of the 3 segments */
#define PROP_ROWS (3 * PROP_SEG + 1)

/* The prompt (3 segments; s1 hides s0) then one G token, on region's KV
 * blocks, in one prefill step or one step per segment; every row's logits
 * into out (PROP_ROWS rows). G sees s0 unless hide. */
static int prop_run(struct inst *g, const struct gpud_model *m, const int32_t *prompt,
		    uint32_t region, bool hide, bool chunked, float *out)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	uint16_t r0[1] = { 0 }, r1[1] = { 1 }, r2[3] = { 0, 1, 2 }, ga[4] = { 0, 1, 2, 3 };
	uint16_t gh[3] = { 1, 2, 3 };
	struct proto_mask_row rows[4] = { { r0, 1 }, { r1, 1 }, { r2, 3 },
					  { hide ? gh : ga, hide ? 3 : 4 } };
	struct proto_mask_desc d = { .n_segments = 3, .rows = rows };
	uint32_t st[3] = { PROP_SEG, PROP_SEG, PROP_SEG }, done = 0;
	static struct seq s;
	struct gpud_fwd_seq fs;

	for (uint32_t k = 0; k < SEQ_BLOCKS; k++)
		s.blocks[k] = region * SEQ_BLOCKS + k;
	if (gpud_mask_compile(&d, st, BLOCK_TOKENS, s.mask_mem, sizeof(s.mask_mem), &s.mask))
		return -1;
	while (done < PROP_ROWS) {
		uint32_t n = done == 3 * PROP_SEG ? 1 : chunked ? PROP_SEG : 3 * PROP_SEG;
		struct gpud_fwd_batch b = { .tokens = prompt + done, .seqs = &fs, .n_seqs = 1,
					    .n_tokens = n, .n_logits = n };

		fs = (struct gpud_fwd_seq){ .blocks = s.blocks, .mask = &s.mask, .pos0 = done,
					    .n_tokens = n, .n_logits = n };
		if (forward(g, &b))
			return -1;
		memcpy(out + (size_t)done * hp->n_vocab, g->ops->logits(g->ctx),
		       (size_t)n * hp->n_vocab * sizeof(float));
		done += n;
	}
	return 0;
}

/* Mask properties on the device under test: hiding s0 from G changes G's
 * logits and nothing else (the prompt rows agree within 1e-5: the same
 * kernels on the same data); the prompt prefilled one segment (one KV
 * block) per step gives the logits of one whole prefill step within
 * bound. */
static int mask_props(struct inst *g, const struct gpud_model *m, double bound)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	size_t n = (size_t)PROP_ROWS * hp->n_vocab;
	float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
	float *c = malloc(n * sizeof(float));
	int32_t prompt[PROP_ROWS];
	double same = 0, g_moved = 0, chunks = 0;
	int rc = 1;

	for (uint32_t i = 0; i < PROP_ROWS; i++)
		prompt[i] = (int32_t)rnd(hp->n_vocab);
	if (!a || !b || !c || prop_run(g, m, prompt, 0, false, false, a) ||
	    prop_run(g, m, prompt, 1, true, false, b) || prop_run(g, m, prompt, 2, false, true, c))
		goto out;
	same = rows_diff(a, b, 0, 3 * PROP_SEG, hp->n_vocab);
	g_moved = rows_diff(a, b, 3 * PROP_SEG, PROP_ROWS, hp->n_vocab);
	chunks = rows_diff(a, c, 0, PROP_ROWS, hp->n_vocab);
	printf("backend_cmp: %s: hiding s0 from G: prompt rows moved %.3g (<= 1e-5), G moved "
	       "%.3g (> 1e-4); prefill one block per step against one step: %.3g (<= %.3g)\n",
	       g->ops->name, same, g_moved, chunks, bound);
	rc = same <= 1e-5 && g_moved > 1e-4 && chunks <= bound ? 0 : 1;
out:
	free(a);
	free(b);
	free(c);
	return rc;
}

/* FNV-1a of n bytes at p, continuing h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static int compare(const struct gpud_model *m, uint32_t rounds, double bound)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	static struct seq seqs[8];
	static int32_t toks[MAX_BATCH];
	struct gpud_fwd_seq fs[8];
	struct inst cpu, gpu;
	static bool row_argmax[MAX_BATCH];
	double worst = 0;
	uint64_t a0, id_rows = 0, id_bad = 0, digest = 0xcbf29ce484222325ull;
	int rc = 1;

	if (inst_init(&cpu, &gpud_cpu_backend, m, 8) ||
	    inst_init(&gpu, dut, m, 8))
		return 2;
	a0 = allocs(&gpu);
#if SW_CUEMU
	struct cuemu_stats e0 = cuemu_get_stats();
#endif
	for (uint32_t r = 0; r < rounds; r++) {
		/* rounds 0 and 1: one and two sequences, each prompt in one step,
		 * then 3 decode steps: batches of 1 and 2 tokens (where the CUDA
		 * backend makes the norms inside its GEMVs) */
		bool few = r < 2;
		uint32_t n_seqs = few ? r + 1 : 1 + rnd(8), steps = few ? 4 : 2 + rnd(6);

		for (uint32_t i = 0; i < n_seqs; i++) {
			for (uint32_t b = 0; b < SEQ_BLOCKS; b++)
				seqs[i].blocks[b] = i * SEQ_BLOCKS + b;
			seqs[i].len = 0;
			seqs[i].prompt = 1 + rnd(max_prompt);
			random_mask(&seqs[i]);
		}
		for (uint32_t st = 0; st < steps; st++) {
			struct gpud_fwd_batch b = { .tokens = toks, .seqs = fs };
			const float *lc, *lg;

			for (uint32_t i = 0; i < n_seqs; i++) {
				struct seq *s = &seqs[i];
				uint32_t n = s->len >= s->prompt ? 1
					     : few		 ? s->prompt - s->len
								 : 1 + rnd(s->prompt - s->len);

				if (b.n_tokens + n > MAX_BATCH)
					n = 1;
				fs[b.n_seqs] = (struct gpud_fwd_seq){
					.blocks = s->blocks,
					.mask = s->masked ? &s->mask : NULL,
					.pos0 = s->len,
					.n_tokens = n,
					.tok0 = b.n_tokens,
					.logit0 = b.n_logits,
					.n_logits = rnd(3) == 0 ? n : 1,
				};
				fs[b.n_seqs].argmax = fs[b.n_seqs].n_logits == 1 && rnd(3) == 0;
				for (uint32_t k = 0; k < fs[b.n_seqs].n_logits; k++)
					row_argmax[b.n_logits + k] = fs[b.n_seqs].argmax;
				for (uint32_t t = 0; t < n; t++)
					toks[b.n_tokens + t] = (int32_t)rnd(hp->n_vocab);
				b.n_tokens += n;
				b.n_logits += fs[b.n_seqs].n_logits;
				b.n_seqs++;
				s->len += n;
			}
			if (forward(&cpu, &b) || forward(&gpu, &b))
				goto out;
			lc = cpu.ops->logits(cpu.ctx);
			lg = gpu.ops->logits(gpu.ctx);
			for (uint32_t row = 0; row < b.n_logits; row++) {
				const float *x = lc + (size_t)row * hp->n_vocab;
				const float *y = lg + (size_t)row * hp->n_vocab;
				double dmax = 0, xmax = 0;

				if (gpu.ops->argmax) {
					digest = fnv(digest, &gpu.ops->argmax(gpu.ctx)[row], 4);
					/* the device's arg max: gpud_argmax of the row
					 * it downloaded; else within twice the bound of
					 * the CPU's greatest logit */
					int32_t id = gpu.ops->argmax(gpu.ctx)[row];
					int32_t c = gpud_argmax(x, (int32_t)hp->n_vocab);

					id_rows++;
					if (!row_argmax[row]) {
						int32_t g = gpud_argmax(y, (int32_t)hp->n_vocab);
						id_bad += id != (g < 0 ? -1 : g);
					} else {
						double xm = 0;
						for (uint32_t v = 0; v < hp->n_vocab; v++)
							xm = fabs(x[v]) > xm ? fabs(x[v]) : xm;
						id_bad += id < 0 || c < 0 ||
							  x[c] - x[id] > 2 * bound * xm;
						continue; /* the row itself is not downloaded */
					}
				}
				digest = fnv(digest, y, hp->n_vocab * sizeof(float));
				for (uint32_t v = 0; v < hp->n_vocab; v++) {
					double d = fabs((double)x[v] - y[v]);

					if (!(d == d) || !isfinite(y[v]))
						d = INFINITY;
					if (d > dmax)
						dmax = d;
					if (fabs(x[v]) > xmax)
						xmax = fabs(x[v]);
				}
				if (xmax > 0 && dmax / xmax > worst)
					worst = dmax / xmax;
			}
		}
	}
	printf("backend_cmp: %s (%s), %s against cpu: %u rounds of ragged masked batches: "
	       "worst relative logits error %.3g (bound %.3g); device arg max wrong in %llu of "
	       "%llu rows; allocations after init %llu\n",
	       gpud_model_path(m), type_of(m), dut->name, rounds, worst, bound,
	       (unsigned long long)id_bad, (unsigned long long)id_rows,
	       (unsigned long long)(allocs(&gpu) - a0));
	/* two instances that must compute the same bits (a fusion on and
	 * off) print the same digest: tests/cuemu/run compares them */
	printf("backend_cmp: device logits and ids digest %016llx\n", (unsigned long long)digest);
	rc = worst <= bound && !id_bad && allocs(&gpu) == a0 ? 0 : 1;
#if SW_CUEMU
	{
		/* the emulator's own counts: every cudaMalloc/cudaHostAlloc the
		 * process made, not only the backend's wrapped ones */
		struct cuemu_stats e1 = cuemu_get_stats();
		uint64_t dev = e1.device_allocs - e0.device_allocs;
		uint64_t host = e1.host_allocs - e0.host_allocs;

		printf("backend_cmp: cuemu: %llu kernels, %llu graph replays; cudaMalloc %llu, "
		       "cudaHostAlloc %llu, faults %llu after init\n",
		       (unsigned long long)(e1.launches - e0.launches),
		       (unsigned long long)(e1.graph_launches - e0.graph_launches),
		       (unsigned long long)dev, (unsigned long long)host,
		       (unsigned long long)(e1.faults - e0.faults));
		if (dev || host || e1.faults != e0.faults)
			rc = 1;
	}
#endif
	if (mask_props(&gpu, m, bound))
		rc = 1;
out:
	cpu.ops->destroy(cpu.ctx);
	gpu.ops->destroy(gpu.ctx);
	return rc;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

enum { ROWS_ARGMAX = 0, ROWS_DOWNLOAD = 1, ROWS_DRAW = 2, ROWS_DRAW_P = 3 };

/* Clears the kernel profile of an instance that keeps one (--profile). */
static void profile_reset(struct inst *g)
{
#if SW_HAVE_CUDA
	if (profiling && g->ops == &gpud_cuda_backend)
		gpud_cuda_profile(g->ctx, NULL, true);
#else
	(void)g;
#endif
}

/* Median seconds of a decode step of n_seqs sequences prefilled with ctx
 * tokens (32 .. SEQ_BLOCKS * BLOCK_TOKENS - 40), each with mask (or
 * causal); mode: each sequence's logits row comes back to the host (for
 * sampling on the host), or a draw is made where the row is (temperature
 * 0.8, top-k 40, top-p 0.95: sampling on the device), or only its arg max
 * (greedy decoding). */
static double decode_step_s(struct inst *g, const struct gpud_model *m, uint32_t n_seqs,
			    uint32_t ctx, bool masked, int mode)
{
	static struct gpud_draw draws[MAX_SEQS];
	bool want_rows = mode == ROWS_DOWNLOAD;

	static struct seq seqs[MAX_SEQS];
	static struct gpud_fwd_seq fs[MAX_SEQS];
	static int32_t toks[MAX_BATCH];
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	double t[64];
	uint32_t n_t = 0;

	for (uint32_t i = 0; i < n_seqs; i++) {
		struct gpud_fwd_batch b = { .tokens = toks, .seqs = fs, .n_seqs = 1,
					    .n_tokens = ctx, .n_logits = 1 };

		for (uint32_t k = 0; k < SEQ_BLOCKS; k++)
			seqs[i].blocks[k] = i * SEQ_BLOCKS + k;
		seqs[i].prompt = ctx;
		seqs[i].len = 0;
		seqs[i].masked = false;
		if (masked) {
			/* s0 10 tokens, s1 the rest; G hides s0: block 0 is mixed. */
			uint16_t r0[1] = { 0 }, r1[2] = { 0, 1 }, rg[2] = { 1, 2 };
			struct proto_mask_row rows[3] = { { r0, 1 }, { r1, 2 }, { rg, 2 } };
			struct proto_mask_desc d = { .n_segments = 2, .rows = rows };
			uint32_t st[2] = { 10, ctx - 10 };

			seqs[i].masked = gpud_mask_compile(&d, st, BLOCK_TOKENS, seqs[i].mask_mem,
							   sizeof(seqs[i].mask_mem),
							   &seqs[i].mask) == 0;
		}
		fs[0] = (struct gpud_fwd_seq){ .blocks = seqs[i].blocks,
					       .mask = seqs[i].masked ? &seqs[i].mask : NULL,
					       .n_tokens = ctx, .n_logits = 1 };
		for (uint32_t k = 0; k < ctx; k++)
			toks[k] = (int32_t)rnd(hp->n_vocab);
		if (forward(g, &b))
			return -1;
		seqs[i].len = ctx;
	}
	for (uint32_t step = 0; step < (bench_quick ? 14u : 40u); step++) {
		struct gpud_fwd_batch b = { .tokens = toks, .seqs = fs, .n_seqs = n_seqs,
					    .n_tokens = n_seqs, .n_logits = n_seqs };
		double t0;

		for (uint32_t i = 0; i < n_seqs; i++) {
			fs[i] = (struct gpud_fwd_seq){ .blocks = seqs[i].blocks,
						       .mask = seqs[i].masked ? &seqs[i].mask : NULL,
						       .pos0 = seqs[i].len, .n_tokens = 1,
						       .tok0 = i, .logit0 = i, .n_logits = 1,
						       .argmax = !want_rows };
			draws[i] = (struct gpud_draw){ .temperature = 0.8f, .top_k = 40,
						       .top_p = 0.95f, .min_p = 0.0f,
						       .rand = (uint64_t)rnd(1u << 30) << 34 ^ step };
			if (mode == ROWS_DRAW_P) {
				draws[i].temperature = 1.0f;
				draws[i].top_k = 0;
			}
			if (mode == ROWS_DRAW || mode == ROWS_DRAW_P)
				fs[i].draw = &draws[i];
			toks[i] = (int32_t)rnd(hp->n_vocab);
			seqs[i].len++;
		}
		t0 = now_s();
#if SW_HAVE_CUDA
		if (step == ncu_mark && (ncu_rc = gpud_cuda_profiler_range(true)))
			return -1;
#endif
		if (forward(g, &b))
			return -1;
#if SW_HAVE_CUDA
		if (step == ncu_mark && (ncu_rc = gpud_cuda_profiler_range(false)))
			return -1;
#endif
		if (step >= (bench_quick ? 4u : 8u)) /* warm: graphs captured, caches filled */
			t[n_t++] = now_s() - t0;
		if (step + 1 == (bench_quick ? 4u : 8u))
			profile_reset(g); /* the profile covers the timed steps */
	}
	qsort(t, n_t, sizeof(t[0]), cmp_dbl);
	return t[n_t / 2];
}

/* A long context: the attention's share (split-K at small batches), at
 * batch 1 and 16. Returns 0 or 1 (a step failed). */
static int long_rows(struct inst *g, const struct gpud_model *m, const char *label,
		     const char *what, FILE *out)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	static const uint32_t batches[] = { 1, 16 };

	for (size_t i = 0; i < 2; i++) {
		uint32_t n = batches[i], ctx = long_ctx;
		double step;

		if (hp->n_ctx && hp->n_ctx < ctx + 40)
			ctx = hp->n_ctx - 40; /* within the model's context */
		if (hp->n_ctx && hp->n_ctx < 40 + 64)
			break; /* no long context to speak of */
		step = decode_step_s(g, m, n, ctx, false, ROWS_ARGMAX);
		if (step < 0)
			return 1;
		fprintf(out, "| %s | decode batch %u at context %u%s | %.1f tok/s | %.3f ms/step |\n",
			label, n, ctx, what, n / step, step * 1e3);
	}
	return 0;
}

/* Seconds of one prefill step: n random tokens (n <= 512) of one sequence
 * from position 0 in blocks 0.., one logits row; -1 when it fails. */
static double prefill_s(struct inst *g, const struct gpud_model *m, uint32_t n)
{
	static int32_t toks[512];
	static struct seq s;
	struct gpud_fwd_seq fs = { .blocks = s.blocks, .n_tokens = n, .n_logits = 1 };
	struct gpud_fwd_batch b = { .tokens = toks, .seqs = &fs, .n_seqs = 1, .n_tokens = n,
				    .n_logits = 1 };
	double t0;

	for (uint32_t k = 0; k < SEQ_BLOCKS; k++)
		s.blocks[k] = k;
	for (uint32_t k = 0; k < n; k++)
		toks[k] = (int32_t)rnd(gpud_model_hparams(m)->n_vocab);
	t0 = now_s();
	return forward(g, &b) ? -1 : now_s() - t0;
}

/* An instance of the device under test made with the environment
 * variable name set to value (as it was after). */
static int inst_init_env(struct inst *g, const struct gpud_model *m, uint32_t seqs,
			 const char *name, const char *value)
{
	const char *was = getenv(name);
	char keep[64] = "";
	int rc;

	if (was)
		snprintf(keep, sizeof(keep), "%s", was);
	setenv(name, value, 1);
	rc = inst_init(g, dut, m, seqs);
	if (was)
		setenv(name, keep, 1);
	else
		unsetenv(name);
	return rc;
}

static int bench(const struct gpud_model *m, const char *label, const char *out_path)
{
	static const uint32_t batches[] = { 1, 16, 64 };
	FILE *out = out_path ? fopen(out_path, "a") : stdout;
	struct inst g;
	double best = 1e30, plain, masked;
	uint64_t a0;

	if (!out || inst_init(&g, dut, m, MAX_SEQS))
		return 2;
	a0 = allocs(&g);
	for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]); i++) {
		double step = decode_step_s(&g, m, batches[i], 32, false, ROWS_ARGMAX);

		if (step < 0)
			return 1;
		fprintf(out, "| %s | decode batch %u | %.1f tok/s | %.3f ms/step |\n", label,
			batches[i], batches[i] / step, step * 1e3);
		if (batches[i] == 1 && dut != &gpud_cpu_backend) {
			/* 2: the largest batch whose norms may fuse (GPUD_CUDA_FUSE_NORM=2) */
			if ((step = decode_step_s(&g, m, 2, 32, false, ROWS_ARGMAX)) < 0)
				return 1;
			fprintf(out, "| %s | decode batch 2 | %.1f tok/s | %.3f ms/step |\n", label,
				2 / step, step * 1e3);
		}
	}
	/* the same with every logits row downloaded, as sampling needs */
	for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]); i += 2) {
		double step = decode_step_s(&g, m, batches[i], 32, false, ROWS_DOWNLOAD);

		if (step < 0)
			return 1;
		fprintf(out, "| %s | decode batch %u, logits rows downloaded | %.1f tok/s | "
			"%.3f ms/step |\n", label, batches[i], batches[i] / step, step * 1e3);
	}
	/* and with a draw made where the row is, when the backend draws */
	for (size_t i = 0; g.ops->draws && i < sizeof(batches) / sizeof(batches[0]); i += 2) {
		double step = decode_step_s(&g, m, batches[i], 32, false, ROWS_DRAW);

		if (step < 0)
			return 1;
		fprintf(out, "| %s | decode batch %u, drawn on the device (T 0.8, top-k 40, "
			"top-p 0.95) | %.1f tok/s | %.3f ms/step |\n", label, batches[i],
			batches[i] / step, step * 1e3);
		/* and as an OpenAI client asks: no top-k, so the whole row counts */
		step = decode_step_s(&g, m, batches[i], 32, false, ROWS_DRAW_P);
		if (step < 0)
			return 1;
		fprintf(out, "| %s | decode batch %u, drawn on the device (T 1, top-p 0.95, "
			"no top-k) | %.1f tok/s | %.3f ms/step |\n", label, batches[i],
			batches[i] / step, step * 1e3);
	}
	if (long_rows(&g, m, label, "", out))
		return 1;
	/* prefill: one 512-token chunk (--quick, an emulator's: 128, whose
	 * tensor-core products take it minutes at 512) */
	uint32_t n_pre = bench_quick ? 128u : 512u;
	for (uint32_t r = 0; r < (bench_quick ? 2u : 5u); r++) {
		double t = prefill_s(&g, m, n_pre);

		if (t < 0)
			return 1;
		if (r && t < best) /* the first one warms */
			best = t;
	}
	fprintf(out, "| %s | prefill %u tokens | %.1f tok/s | %.3f ms |\n", label, n_pre,
		n_pre / best, best * 1e3);
	plain = decode_step_s(&g, m, 16, 32, false, ROWS_ARGMAX);
	masked = decode_step_s(&g, m, 16, 32, true, ROWS_ARGMAX);
	fprintf(out, "| %s | decode batch 16, cached compiled mask vs causal | %+.3f ms/step "
		"| %.3f vs %.3f ms |\n", label, (masked - plain) * 1e3, masked * 1e3,
		plain * 1e3);
	a0 = allocs(&g) - a0;
	g.ops->destroy(g.ctx);
	if (bench_long_f16 && kv_type == GPUD_TYPE_F32) {
		/* the long context with f16 KV: the attention reads half the bytes */
		struct inst g2;
		uint64_t a1;

		if (inst_init_kv(&g2, dut, m, MAX_SEQS, GPUD_TYPE_F16))
			return 2;
		a1 = allocs(&g2);
		if (long_rows(&g2, m, label, ", f16 KV", out))
			return 1;
		a0 += allocs(&g2) - a1;
		g2.ops->destroy(g2.ctx);
	}
	if (dut != &gpud_cpu_backend) {
		/* batch 1 again on an instance made with GPUD_CUDA_PDL=1: what
		 * programmatic dependent launch is worth (the same where the
		 * device has none) */
		struct inst g2;
		double step = -1;

		if (!inst_init_env(&g2, m, 1, "GPUD_CUDA_PDL", "1")) {
			step = decode_step_s(&g2, m, 1, 32, false, ROWS_ARGMAX);
			g2.ops->destroy(g2.ctx);
		}
		if (step < 0)
			return 1;
		fprintf(out, "| %s | decode batch 1, GPUD_CUDA_PDL=1 | %.1f tok/s | %.3f ms/step |\n",
			label, 1 / step, step * 1e3);
		/* and the other way about the RMSNorms: batch 1, which fuses
		 * them into the GEMVs after them by default, with each its own
		 * launch (GPUD_CUDA_FUSE_NORM=0); batch 2, which does not, with
		 * them fused (GPUD_CUDA_FUSE_NORM=2) */
		for (uint32_t n = 1; n <= 2; n++) {
			const char *v = n == 1 ? "0" : "2";

			step = -1;
			if (!inst_init_env(&g2, m, 2, "GPUD_CUDA_FUSE_NORM", v)) {
				step = decode_step_s(&g2, m, n, 32, false, ROWS_ARGMAX);
				g2.ops->destroy(g2.ctx);
			}
			if (step < 0)
				return 1;
			fprintf(out, "| %s | decode batch %u, GPUD_CUDA_FUSE_NORM=%s | %.1f tok/s | "
				"%.3f ms/step |\n", label, n, v, n / step, step * 1e3);
		}
	}
	if (dut != &gpud_cpu_backend && (gpud_model_weights(m)->layers[0].wq.type == GPUD_TYPE_Q8_0 ||
					  gpud_model_weights(m)->layers[0].wq.type == GPUD_TYPE_Q4_0)) {
		/* the int8 matmuls by the single-buffered kernel (GPUD_CUDA_MM=
		 * single): the pipelined kernel's gain, where the decode batches
		 * past 8 tokens and prefill take the tensor-core path */
		struct inst g2;
		int rc = 1;

		if (!inst_init_env(&g2, m, MAX_SEQS, "GPUD_CUDA_MM", "single")) {
			rc = 0;
			/* --quick (an emulator's dry run): batch 16 only */
			size_t nb = bench_quick ? 2 : sizeof(batches) / sizeof(batches[0]);

			for (size_t i = 1; !rc && i < nb; i++) {
				double step = decode_step_s(&g2, m, batches[i], 32, false, ROWS_ARGMAX);

				if (step < 0)
					rc = 1;
				else
					fprintf(out, "| %s | decode batch %u, GPUD_CUDA_MM=single | %.1f tok/s "
						"| %.3f ms/step |\n", label, batches[i], batches[i] / step,
						step * 1e3);
			}
			best = 1e30;
			for (uint32_t r = 0; !rc && r < (bench_quick ? 0u : 4u); r++) {
				double t = prefill_s(&g2, m, 512);

				if (t < 0)
					rc = 1;
				else if (r && t < best)
					best = t;
			}
			if (!rc && !bench_quick)
				fprintf(out, "| %s | prefill 512 tokens, GPUD_CUDA_MM=single | %.1f tok/s | "
					"%.3f ms |\n", label, 512 / best, best * 1e3);
			g2.ops->destroy(g2.ctx);
		}
		if (rc)
			return 1;
	}
	fprintf(out, "| %s | device allocations after init over the bench | %llu | |\n", label,
		(unsigned long long)a0);
	if (out != stdout)
		fclose(out);
	return a0 == 0 ? 0 : 1;
}

#if SW_HAVE_CUDA
static int cmp_prof_row(const void *a, const void *b)
{
	double x = ((const struct gpud_cuda_prof_row *)a)->ms;
	double y = ((const struct gpud_cuda_prof_row *)b)->ms;

	return x > y ? -1 : x < y;
}

/* The profile since the last reset as a table: the rows by time. */
static void profile_table(struct inst *g, const char *label, const char *what, FILE *out)
{
	static struct gpud_cuda_prof p;
	double kernels = 0;

	if (gpud_cuda_profile(g->ctx, &p, true) || !p.steps)
		return;
	qsort(p.rows, p.n_rows, sizeof(p.rows[0]), cmp_prof_row);
	for (uint32_t i = 0; i < p.n_rows; i++)
		kernels += p.rows[i].ms;
	fprintf(out, "\n### %s, %s: %llu steps\n\n", label, what, (unsigned long long)p.steps);
	fprintf(out, "Per step: %.1f us from its first launch to its end, of which %.1f us in "
		"the intervals below (each launch's kernels and the gap before them)%s.\n\n",
		p.span_ms * 1e3 / (double)p.steps, kernels * 1e3 / (double)p.steps,
		p.dropped ? "; some launches went untimed" : "");
	fprintf(out, "| stage | launch | launches/step | us/step | share |\n|---|---|---:|---:|---:|\n");
	for (uint32_t i = 0; i < p.n_rows; i++)
		fprintf(out, "| %s | %s | %.1f | %.1f | %.1f%% |\n", p.rows[i].stage, p.rows[i].op,
			(double)p.rows[i].launches / (double)p.steps,
			p.rows[i].ms * 1e3 / (double)p.steps,
			kernels > 0 ? 100.0 * p.rows[i].ms / kernels : 0.0);
}
#endif

#if SW_HAVE_CUDA
/* An instance of the device under test made with GPUD_CUDA_PROFILE=mode,
 * and the table's file opened for appending (stdout without one). Returns
 * 0, or 2 (told on stderr; nothing left open). */
static int prof_open(struct inst *g, const struct gpud_model *m, const char *mode,
		     const char *out_path, FILE **out)
{
	int rc;

	setenv("GPUD_CUDA_PROFILE", mode, 1);
	rc = inst_init(g, dut, m, MAX_SEQS);
	unsetenv("GPUD_CUDA_PROFILE");
	if (rc)
		return 2;
	*out = out_path ? fopen(out_path, "a") : stdout;
	if (!*out) {
		fprintf(stderr, "backend_cmp: %s: %s\n", out_path, strerror(errno));
		g->ops->destroy(g->ctx);
		return 2;
	}
	return 0;
}

/* What prof_open opened, closed. */
static void prof_close(struct inst *g, FILE *out)
{
	if (out != stdout)
		fclose(out);
	g->ops->destroy(g->ctx);
}
#endif

/* --profile: where a step's time goes, launch by launch (cuda.h's kernel
 * profile: an instance made with GPUD_CUDA_PROFILE=1 runs eagerly, an
 * event between launches): decode at batch 1, 16 and 64 and a 512-token
 * prefill. The bench's step times are the real ones (graphs, programmatic
 * dependent launch); this says which kernels they are made of. */
#if SW_HAVE_CUDA
static int profile(const struct gpud_model *m, const char *label, const char *out_path)
{
	static const uint32_t batches[] = { 1, 2, 16, 64 };
	/* --quick (an emulator): batch 1 and 16, a 128-token prefill */
	size_t n_batches = bench_quick ? 2 : 3;
	uint32_t n_pre = bench_quick ? 128 : 512;
	FILE *out;
	struct inst g;
	char what[64];
	int rc = 0;

	if (dut != &gpud_cuda_backend) {
		fprintf(stderr, "backend_cmp: --profile is for cuda:0\n");
		return 2;
	}
	profiling = true;
	if ((rc = prof_open(&g, m, "1", out_path, &out)))
		return rc;
	if (gpud_cuda_profile(g.ctx, NULL, true)) {
		fprintf(stderr, "backend_cmp: the instance keeps no profile\n");
		rc = 1;
	} else {
		/* an eager profile's instance has no stage profile */
		static struct gpud_cuda_stage_prof sp;
		char err[SW_ERR_MAX];

		rc = gpud_cuda_stage_profile(g.ctx, 1, 1, &sp, err, sizeof(err)) == -ENOENT ? 0 : 1;
		fprintf(stderr, "backend_cmp: %s\n",
			rc ? "an eager profile's instance took a stage profile" : err);
	}
	for (size_t i = 0; !rc && i < n_batches; i++) {
		if (decode_step_s(&g, m, batches[i], 32, false, ROWS_ARGMAX) < 0) {
			rc = 1;
			break;
		}
		snprintf(what, sizeof(what), "decode batch %u at context 32", batches[i]);
		profile_table(&g, label, what, out);
	}
	for (uint32_t r = 0; !rc && r < (bench_quick ? 2u : 4u); r++) {
		if (prefill_s(&g, m, n_pre) < 0)
			rc = 1;
		else if (r == 0)
			gpud_cuda_profile(g.ctx, NULL, true); /* the first one warms */
	}
	snprintf(what, sizeof(what), "prefill of %u tokens", n_pre);
	if (!rc)
		profile_table(&g, label, what, out);
	prof_close(&g, out);
	return rc;
}

/* The weight bytes a (stage, op) pair of a step reads: its matrices over
 * every layer for the matmul launches, 0 for the others. */
static double stage_weight_bytes(const struct gpud_model *m, const char *stage, const char *op)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const struct gpud_model_weights *w = gpud_model_weights(m);
	const struct gpud_weight *ws[3] = { NULL, NULL, NULL };
	double n = 0;

	if (strncmp(op, "matmul", 6))
		return 0;
	if (!strcmp(stage, "output"))
		return (double)w->output.rows * gpud_type_row_bytes(w->output.type,
								    (uint64_t)w->output.cols);
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const struct gpud_layer_weights *L = &w->layers[l];

		if (!strcmp(stage, "q, k, v"))
			ws[0] = &L->wq, ws[1] = &L->wk, ws[2] = &L->wv;
		else if (!strcmp(stage, "o"))
			ws[0] = &L->wo;
		else if (!strcmp(stage, "gate, up"))
			ws[0] = &L->w_gate, ws[1] = &L->w_up;
		else if (!strcmp(stage, "down"))
			ws[0] = &L->w_down;
		else
			return 0;
		for (int i = 0; i < 3 && ws[i]; i++)
			n += (double)ws[i]->rows * gpud_type_row_bytes(ws[i]->type,
								       (uint64_t)ws[i]->cols);
	}
	return n;
}

/* One stage profile as a table: the rows in the step's order. */
static void stages_table(const struct gpud_model *m, const struct gpud_cuda_stage_prof *p,
			 const char *label, double copy_gbs, FILE *out)
{
	double sum = 0, bytes_all = 0;

	fprintf(out, "\n### %s, decode batch %u at context 32, each launch in a graph of its own\n\n",
		label, p->T);
	fprintf(out, "The step's decode graph, replayed alone: **%.1f us** (%llu launch calls). "
		"A graph of one empty kernel: %.1f us a replay; of %llu empty kernels: %.1f us "
		"(%.2f us a launch). Each row: its launches, every layer's, captured alone "
		"into a graph and replayed; its time less the one-kernel graph's.\n\n",
		p->step_us, (unsigned long long)p->launches, p->graph_us,
		(unsigned long long)p->launches, p->floor_us,
		p->launches ? (p->floor_us - p->graph_us) / (double)p->launches : 0.0);
	fprintf(out, "| stage | launch | launches/step | us/step | share of the step | weights MB | GB/s%s |\n"
		"|---|---|---:|---:|---:|---:|---:%s|\n",
		copy_gbs > 0 ? " | of copy bw" : "", copy_gbs > 0 ? "|---:" : "");
	for (uint32_t i = 0; i < p->n_rows; i++) {
		const struct gpud_cuda_prof_row *r = &p->rows[i];
		double us = r->ms * 1e3 - p->graph_us, by = stage_weight_bytes(m, r->stage, r->op);

		if (us < 0)
			us = 0;
		sum += us;
		bytes_all += by;
		fprintf(out, "| %s | %s | %llu | %.1f | %.1f%% |", r->stage, r->op,
			(unsigned long long)r->launches, us, 100.0 * us / p->step_us);
		if (by > 0 && us > 0) {
			fprintf(out, " %.1f | %.0f |", by / 1e6, by / (us * 1e3));
			if (copy_gbs > 0)
				fprintf(out, " %.0f%% |", 100.0 * by / (us * 1e3) / copy_gbs);
		} else {
			fprintf(out, " | |%s", copy_gbs > 0 ? " |" : "");
		}
		fputc('\n', out);
	}
	fprintf(out, "| all rows | | %llu | %.1f | %.1f%% | %.1f | %.0f |",
		(unsigned long long)p->launches, sum, 100.0 * sum / p->step_us, bytes_all / 1e6,
		p->step_us > 0 ? bytes_all / (p->step_us * 1e3) : 0.0);
	if (copy_gbs > 0)
		fprintf(out, " %.0f%% (the step's) |", 100.0 * bytes_all / (p->step_us * 1e3) / copy_gbs);
	fputc('\n', out);
}

/* --stages: the decode steps' (stage, op) pairs each timed in a graph of
 * its own (cuda.h's gpud_cuda_stage_profile: an instance made with
 * GPUD_CUDA_PROFILE=graph), at batch 1, 2, 16 and 64 (--quick: 1 and 16,
 * fewer replays): where the graphs' step time goes, and each matmul's
 * share of the device's bandwidth (--copy-gbs: gpu_bw's figure). */
static int stages(const struct gpud_model *m, const char *label, const char *out_path,
		  double copy_gbs)
{
	static const uint32_t batches[] = { 1, 16, 2, 64 };
	static struct gpud_cuda_stage_prof p;
	size_t n_batches = bench_quick ? 2 : 4;
	char err[SW_ERR_MAX];
	FILE *out;
	struct inst g;
	int rc = 0;

	if (dut != &gpud_cuda_backend) {
		fprintf(stderr, "backend_cmp: --stages is for cuda:0\n");
		return 2;
	}
	if ((rc = prof_open(&g, m, "graph", out_path, &out)))
		return rc;
	/* what the call refuses: a batch it has no decode graph for (0 tokens,
	 * and 1000: decode graphs go up to 64) */
	if (gpud_cuda_stage_profile(g.ctx, 0, 1, &p, err, sizeof(err)) != -EINVAL ||
	    gpud_cuda_stage_profile(g.ctx, 1000, 1, &p, err, sizeof(err)) != -EINVAL) {
		fprintf(stderr, "backend_cmp: the stage profile took a batch it has no graph for\n");
		rc = 1;
	} else {
		fprintf(stderr, "backend_cmp: refused as it must: %s\n", err);
	}
	for (size_t i = 0; !rc && i < n_batches; i++) {
		uint32_t T = batches[i];

		if (decode_step_s(&g, m, T, 32, false, ROWS_ARGMAX) < 0) {
			rc = 1;
			break;
		}
		if (gpud_cuda_stage_profile(g.ctx, T, bench_quick ? 2 : 50, &p, err, sizeof(err))) {
			fprintf(stderr, "backend_cmp: %s\n", err);
			rc = 1;
			break;
		}
		stages_table(m, &p, label, copy_gbs, out);
	}
	prof_close(&g, out);
	return rc;
}
#endif

#if SW_HAVE_CUDA
/* --ncu T: the first decode step of T tokens (at a 32-token context) after
 * the bench's warm-up, alone in a profiler range: what `ncu
 * --profile-from-start off` profiles (tests/gpu/run). The instance holds T
 * sequences, its KV no more than they need: a profiler that saves and
 * restores device memory around each kernel it replays saves less. */
static int ncu_step(const struct gpud_model *m, uint32_t T)
{
	struct inst g;
	double t;

	if (T < 1 || T > MAX_SEQS) {
		fprintf(stderr, "backend_cmp: --ncu takes 1..%u tokens\n", MAX_SEQS);
		return 2;
	}
	if (inst_init(&g, dut, m, T))
		return 1;
	ncu_mark = bench_quick ? 4u : 8u;
	t = decode_step_s(&g, m, T, 32, false, ROWS_ARGMAX);
	g.ops->destroy(g.ctx);
	if (t < 0) {
		fprintf(stderr, "backend_cmp: --ncu: %s\n",
			ncu_rc ? "the profiler range failed" : "a step failed");
		return 1;
	}
	printf("backend_cmp: --ncu: decode step %u of %u tokens in a profiler range "
	       "(median step %.3f ms)\n", ncu_mark, T, t * 1e3);
	return 0;
}
#endif

int main(int argc, char **argv)
{
	const char *path = NULL, *label = NULL, *out = NULL, *device = "cuda:0";
	uint32_t rounds = 20;
	double bound = -1;
	bool do_bench = false, do_profile = false, do_stages = false;
	uint32_t ncu_t = 0;
	double copy_gbs = 0;
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX] = "";
	int rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc)
			path = argv[++i];
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--bound") && i + 1 < argc)
			bound = atof(argv[++i]);
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			rng = strtoull(argv[++i], NULL, 10) | 1;
		else if (!strcmp(argv[i], "--max-prompt") && i + 1 < argc)
			max_prompt = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--long-context") && i + 1 < argc)
			long_ctx = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--quick"))
			bench_quick = true;
		else if (!strcmp(argv[i], "--long-f16"))
			bench_long_f16 = true;
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = argv[++i];
		else if (!strcmp(argv[i], "--kv-type") && i + 1 < argc) {
			i++;
			if (strcmp(argv[i], "f32") && strcmp(argv[i], "f16")) {
				fprintf(stderr, "backend_cmp: --kv-type is f32 or f16\n");
				return 2;
			}
			kv_type = strcmp(argv[i], "f16") ? GPUD_TYPE_F32 : GPUD_TYPE_F16;
		} else if (!strcmp(argv[i], "--bench"))
			do_bench = true;
		else if (!strcmp(argv[i], "--profile"))
			do_profile = true;
		else if (!strcmp(argv[i], "--stages"))
			do_stages = true;
		else if (!strcmp(argv[i], "--ncu") && i + 1 < argc)
			ncu_t = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--copy-gbs") && i + 1 < argc)
			copy_gbs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--label") && i + 1 < argc)
			label = argv[++i];
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out = argv[++i];
		else {
			fprintf(stderr, "usage: %s --model PATH [--rounds N] [--bound B] "
				"[--seed S] [--max-prompt N] [--device cuda:0|cpu] [--kv-type f32|f16] | --model PATH --bench [--label NAME] [--out FILE] [--long-context N] [--quick] [--long-f16] | --model PATH --profile [--label NAME] [--out FILE] [--quick] | --model PATH --stages [--label NAME] [--out FILE] [--quick] [--copy-gbs G] | --model PATH --ncu TOKENS [--quick]\n",
				argv[0]);
			return 2;
		}
	}
	if (!path || max_prompt < 1 || max_prompt > 900 || long_ctx < 32 || long_ctx > LONG_CTX) {
		fprintf(stderr, "backend_cmp: --model is required; --max-prompt is 1..900, "
				"--long-context 32..%u\n", LONG_CTX);
		return 2;
	}
	(void)copy_gbs; /* --stages' only */
	if (!SW_HAVE_CUDA && (do_profile || do_stages || ncu_t)) {
		fprintf(stderr, "backend_cmp: --%s needs the CUDA backend (meson setup "
			"-Dgpu=enabled)\n", do_stages ? "stages" : do_profile ? "profile" : "ncu");
		return 2;
	}
	if (!strcmp(device, "cpu")) {
		dut = &gpud_cpu_backend;
	} else if (!strcmp(device, "cuda:0")) {
		dut = gpud_backend_for(SW_DEVICE_CUDA);
		if (!dut) {
			fprintf(stderr, "backend_cmp: this build has no CUDA backend "
				"(meson setup -Dgpu=enabled)\n");
			return 2;
		}
#if SW_HAVE_CUDA
		if (gpud_cuda_device_count() < 1) {
			fprintf(stderr, "backend_cmp: no CUDA device (0 visible)\n");
			return 2;
		}
#endif
	} else {
		fprintf(stderr, "backend_cmp: --device is cuda:0 or cpu\n");
		return 2;
	}
	rc = gpud_model_load(&m, path, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "backend_cmp: %s\n", err);
		return 2;
	}
	if (bound < 0)
		bound = !strcmp(type_of(m), "f32")                                       ? 1e-3
			: !strcmp(type_of(m), "f16") || !strcmp(type_of(m), "bf16") ? 1e-2
			: !strcmp(type_of(m), "q8_0") || !strcmp(type_of(m), "q4_0") ? 2e-2
										    : 4e-2;
#if SW_HAVE_CUDA
	if (ncu_t && dut == &gpud_cpu_backend) {
		fprintf(stderr, "backend_cmp: --ncu is for cuda:0\n");
		rc = 2;
	} else if (ncu_t)
		rc = ncu_step(m, ncu_t);
	else if (do_stages)
		rc = stages(m, label ? label : type_of(m), out, copy_gbs);
	else if (do_profile)
		rc = profile(m, label ? label : type_of(m), out);
	else
#endif
		rc = do_bench ? bench(m, label ? label : type_of(m), out) : compare(m, rounds, bound);
	gpud_model_free(m);
	return rc;
}
