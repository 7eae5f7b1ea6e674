/* bench_matmul.c - gpud_matmul throughput per weight type, batch, threads.
 *
 * For each type (f32, f16, bf16, q8_0, q4_0, q2_k .. q6_k), shape (768x768, 2048x768,
 * 32000x768: rows x cols) and batch (1, 4, 16) with 1 and 2 threads:
 *   cold: every call reads a different copy of W from an arena of several
 *         times the LLC, so weights come from DRAM (the decode case for a
 *         model larger than the cache);
 *   hot:  the same copy every call (weights in L2/L3).
 * GB/s counts weight bytes read once per call; GFLOP/s is 2*rows*cols*batch
 * per call; "x b1" is the aggregate speed-up over batch 1 (batch * t1 / tb).
 * Timings are the fastest single call out of 0.2 s of calls (0.05 s with
 * "quick"). "3b" measures the llama-3.2-3b preset's matrices instead
 * (3072x3072: attn_q/attn_output, 8192x3072: ffn_gate/ffn_up, 3072x8192:
 * ffn_down) at batch 1 (decode) and 32 (bench_engine's prefill step).
 * Usage: bench_matmul [quick|full|3b] [type [batch]]   (type: f32 ... q6_k,
 * or q4_0p, q8_0p, q4_kp, q5_kp, q6_kp, f16p: the type in the CPU
 * backend's packed layout, gpud_matmul_packed(); batch: only that one of
 * the mode's batches, as bench/kernel_mca.sh profiles one loop).
 * BENCH_CPU_FEATURES=MASK (the printed bits) runs only those kernel paths.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "gpud/backend/cpu/kernels.h"
#include "gpud/backend/cpu/threadpool.h"
#include "gpud/quant.h"

static const enum gpud_type types[] = {
	GPUD_TYPE_F32, GPUD_TYPE_F16, GPUD_TYPE_BF16, GPUD_TYPE_Q8_0, GPUD_TYPE_Q4_0,
	GPUD_TYPE_Q2_K, GPUD_TYPE_Q3_K, GPUD_TYPE_Q4_K, GPUD_TYPE_Q5_K, GPUD_TYPE_Q6_K,
	GPUD_TYPE_Q4_1, GPUD_TYPE_Q5_0, GPUD_TYPE_Q5_1, GPUD_TYPE_IQ4_NL, GPUD_TYPE_IQ4_XS,
};
static const long shapes_110m[][2] = { { 768, 768 }, { 2048, 768 }, { 32000, 768 } };
static const long shapes_3b[][2] = { { 3072, 3072 }, { 8192, 3072 }, { 3072, 8192 } };
static const int batches_110m[] = { 1, 4, 16 };
static const int batches_3b[] = { 1, 4, 32 };
#define MAX_COLS 8192
#define MAX_ROWS 32000
#define MAX_BATCH 32

static uint64_t rng = 88172645463325252ull;

static float rndf(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

struct setup {
	struct gpud_tp *tp;
	enum gpud_type t;
	long rows, cols;
	int batch;
	const unsigned char *arena;
	size_t wbytes;
	long ncopies;
	const float *x;
	float *y;
	void *scratch;
	int packed;
};

/* Seconds of the fastest single call over min_s of calls: on a shared
 * machine the fastest call is the one that had the cores to itself. Cold
 * calls walk the copies, hot calls reuse copy 0. */
static double time_calls(const struct setup *s, int cold, double min_s)
{
	/* The cursor keeps walking across calls, so a cold call never reads
	 * a copy that was read recently. */
	static long cursor;
	double best = 1e30, start = bench_now(), t0, t;

	do {
		const unsigned char *W = s->arena;

		if (cold)
			W += (size_t)(cursor++ % s->ncopies) * s->wbytes;
		t0 = bench_now();
		if (s->packed)
			gpud_matmul_packed(s->tp, s->t, W, s->rows, s->cols, s->x, s->batch, s->y,
					   s->scratch);
		else
			gpud_matmul(s->tp, s->t, W, s->rows, s->cols, s->x, s->batch, s->y,
				    s->scratch);
		t = bench_now() - t0;
		if (t < best)
			best = t;
	} while (bench_now() - start < min_s);
	return best;
}

int main(int argc, char **argv)
{
	int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
	int big = argc > 1 && strcmp(argv[1], "3b") == 0;
	const long(*shapes)[2] = big ? shapes_3b : shapes_110m;
	const int *batches = big ? batches_3b : batches_110m;
	const char *only = argc > 2 ? argv[2] : NULL;
	const int only_batch = argc > 3 ? atoi(argv[3]) : 0;
	char base_type[16] = "";
	int packed = only && strlen(only) > 1 && strlen(only) < sizeof(base_type) &&
		     only[strlen(only) - 1] == 'p';

	if (packed) {
		memcpy(base_type, only, strlen(only) - 1);
		only = base_type;
	}
	double min_s = quick ? 0.05 : 0.2;
	size_t llc = bench_llc_bytes(), arena_bytes = 4 * llc;
	char machine[512], date[64];
	double mc[3];
	struct gpud_tp *tps[3] = { NULL };
	unsigned char *arena, *plain;
	float *x, *y, *wf;
	void *scratch;

	if (arena_bytes < ((size_t)1 << 30))
		arena_bytes = (size_t)1 << 30;
	if (getenv("BENCH_CPU_FEATURES")) /* a mask: A/B of one build's kernel paths */
		gpud_cpu_set_features((unsigned)strtoul(getenv("BENCH_CPU_FEATURES"), NULL, 0));
	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	printf("# bench_matmul %s\n# machine: %s\n# cpu features: 0x%x (1 avx2, 2 fma, 4 f16c, 8 avx-vnni, 16 avx-512, 32 avx-512 vnni, 64 gfni)\n",
	       date, machine, gpud_cpu_features());
	for (int th = 1; th <= 2; th++) {
		mc[th] = bench_memcpy_gbs(arena_bytes / 2, th);
		printf("# memcpy %zu MiB, %d thread(s): %.2f GB/s\n", (arena_bytes / 2) >> 20, th, mc[th]);
	}
	printf("# weight arena for cold runs: %zu MiB (LLC %zu KiB)\n\n", arena_bytes >> 20, llc >> 10);

	arena = aligned_alloc(4096, arena_bytes);
	plain = malloc((size_t)MAX_ROWS * MAX_COLS);
	x = malloc(sizeof(float) * MAX_BATCH * MAX_COLS);
	y = malloc(sizeof(float) * MAX_BATCH * MAX_ROWS);
	wf = malloc(sizeof(float) * MAX_COLS);
	scratch = aligned_alloc(64, gpud_matmul_scratch_bytes(GPUD_TYPE_Q8_0, MAX_COLS, MAX_BATCH) + 64);
	if (!arena || !plain || !x || !y || !wf || !scratch) {
		fprintf(stderr, "bench_matmul: out of memory\n");
		return 1;
	}
	for (int i = 0; i < MAX_BATCH * MAX_COLS; i++)
		x[i] = rndf();
	for (int th = 1; th <= 2; th++) {
		if (gpud_tp_create(&tps[th], th) != 0) {
			fprintf(stderr, "bench_matmul: cannot create a %d-thread pool\n", th);
			return 1;
		}
	}

	printf("| type | rows x cols | thr | batch | cold GB/s | cold GFLOP/s | %% memcpy | x b1 | hot GB/s | hot GFLOP/s |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|\n");
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		if (only && strcmp(only, gpud_type_name(types[ti])) != 0)
			continue;
		for (size_t si = 0; si < 3; si++) {
			long rows = shapes[si][0], cols = shapes[si][1];
			size_t rb = gpud_type_row_bytes(types[ti], (uint64_t)cols), wbytes = rb * (size_t)rows;
			long ncopies = (long)(arena_bytes / wbytes);

			/* One real matrix, then copies of it across the arena. */
			for (long r = 0; r < rows; r++) {
				for (long c = 0; c < cols; c++)
					wf[c] = rndf() * 0.05f;
				gpud_quantize_row(types[ti], wf, (packed ? plain : arena) + (size_t)r * rb,
						  cols);
			}
			if (packed) {
				if (!gpud_matmul_packable(types[ti], rows, cols)) {
					fprintf(stderr, "bench_matmul: %sp: no packed kernels here\n",
						only);
					return 1;
				}
				double t0 = bench_now();

				gpud_matmul_pack(tps[2], types[ti], plain, arena, rows, cols);
				printf("| %sp | %ldx%ld | pack: %.2f GB/s, 2 threads (load time) |\n",
				       gpud_type_name(types[ti]), rows, cols, wbytes / (bench_now() - t0) * 1e-9);
			}
			for (long k = 1; k < ncopies; k++)
				memcpy(arena + (size_t)k * wbytes, arena, wbytes);

			for (int th = 1; th <= 2; th++) {
				double t1 = 0.0;

				for (size_t bi = 0; bi < 3; bi++) {
					if (only_batch > 0 && batches[bi] != only_batch)
						continue; /* (then "x b1" reads 0) */
					struct setup s = {
						.tp = tps[th], .t = types[ti], .rows = rows, .cols = cols,
						.batch = batches[bi], .arena = arena, .wbytes = wbytes,
						.ncopies = ncopies, .x = x, .y = y, .scratch = scratch,
						.packed = packed,
					};
					double tc = time_calls(&s, 1, min_s);
					double th_ = time_calls(&s, 0, min_s);
					double flop = 2.0 * rows * cols * batches[bi];

					if (bi == 0)
						t1 = tc;
					printf("| %s%s | %ldx%ld | %d | %d | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.2f |\n",
					       gpud_type_name(types[ti]), packed ? "p" : "", rows, cols, th, batches[bi],
					       wbytes / tc * 1e-9, flop / tc * 1e-9,
					       100.0 * (wbytes / tc * 1e-9) / mc[th],
					       t1 > 0.0 ? batches[bi] * t1 / tc : 0.0,
					       wbytes / th_ * 1e-9, flop / th_ * 1e-9);
					fflush(stdout);
				}
			}
		}
	}
	for (int th = 1; th <= 2; th++)
		gpud_tp_destroy(tps[th]);
	free(arena);
	free(plain);
	free(x);
	free(y);
	free(wf);
	free(scratch);
	return 0;
}
