/* bench_upload.c - the host side of a CUDA device's weight upload: every
 * matrix of a GGUF model put into the device layout by
 * gpud_cuda_pack_rows_par (Q8_0/Q4_0 split into quants and scales; the
 * types without CUDA kernels decoded and requantized to Q8_0) in chunks of
 * 8 MiB, as one device's init does it with --threads N (a device's init
 * uses one thread a CPU, at most 8; each device of gpud serve packs its
 * own replica, side by side). No device is touched: the figure is what a
 * start-up spends before its copies.
 *
 * usage: bench_upload --model PATH [--rounds N] [--threads N]
 *
 * Prints, per file type, the matrices' file bytes, their device bytes and
 * the best of N rounds (default 3) in seconds and file MB/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "common/err.h"
#include "gpud/backend/cuda/cuda_impl.h"
#include "gpud/model.h"
#include "gpud/quant.h"

struct per_type {
	uint64_t file, dev, mats;
	double best;
};

static double pack_one(const struct gpud_weight *w, uint8_t *q, uint8_t *d, uint8_t *tmp,
		       uint64_t chunk, int nt)
{
	double t0 = bench_now();

	for (uint64_t r0 = 0; r0 < (uint64_t)w->rows; r0 += chunk) {
		uint64_t n = (uint64_t)w->rows - r0 < chunk ? (uint64_t)w->rows - r0 : chunk;

		gpud_cuda_pack_rows_par(w, r0, n, q, d, tmp, nt);
	}
	return bench_now() - t0;
}

int main(int argc, char **argv)
{
	const char *path = NULL;
	int rounds = 3, nt = 1;
	struct gpud_model *m = NULL;
	char err[SW_ERR_MAX];
	static struct per_type pt[GPUD_TYPE_COUNT];
	const struct gpud_weight **ws;
	size_t nw;
	uint64_t chunk_bytes = 8u << 20, max_cols = 0;
	uint8_t *q, *d, *tmp;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc)
			path = argv[++i];
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			nt = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s --model PATH [--rounds N] [--threads N]\n",
				argv[0]);
			return 2;
		}
	}
	if (!path || rounds < 1 || nt < 1 || nt > GPUD_CUDA_PACK_THREADS) {
		fprintf(stderr, "usage: %s --model PATH [--rounds N] [--threads 1..%d]\n", argv[0],
			GPUD_CUDA_PACK_THREADS);
		return 2;
	}
	if (gpud_model_load(&m, path, err, sizeof(err))) {
		fprintf(stderr, "bench_upload: %s\n", err);
		return 1;
	}
	nw = gpud_model_matrices(m, NULL, 0);
	ws = calloc(nw, sizeof(*ws));
	if (!ws) {
		fprintf(stderr, "bench_upload: out of memory\n");
		return 1;
	}
	gpud_model_matrices(m, ws, nw);
	for (size_t i = 0; i < nw; i++)
		if ((uint64_t)ws[i]->cols > max_cols)
			max_cols = (uint64_t)ws[i]->cols;
	/* staging as upload_mat splits it: the requantization's row, then
	 * a chunk of rows' quants and scales */
	q = malloc(chunk_bytes);
	d = malloc(chunk_bytes);
	tmp = malloc((max_cols * 4 + max_cols / 32 * 34 + 16) * (size_t)nt);
	if (!q || !d || !tmp) {
		fprintf(stderr, "bench_upload: out of memory\n");
		return 1;
	}
	for (int r = 0; r < rounds; r++) {
		double sum[GPUD_TYPE_COUNT] = { 0 };

		for (size_t i = 0; i < nw; i++) {
			const struct gpud_weight *w = ws[i];
			enum gpud_type dt = gpud_cuda_dev_type(w->type);
			uint64_t rowb;

			if (dt != GPUD_TYPE_Q8_0 && dt != GPUD_TYPE_Q4_0)
				continue; /* float types: one copy, nothing to pack */
			rowb = (uint64_t)w->cols + (uint64_t)w->cols / 32 * 2;
			sum[w->type] += pack_one(w, q, d, tmp, chunk_bytes / rowb, nt);
			if (!r) {
				pt[w->type].file += gpud_type_row_bytes(w->type, (uint64_t)w->cols) *
						    (uint64_t)w->rows;
				pt[w->type].dev += gpud_cuda_tensor_bytes(w->type, w->rows, w->cols);
				pt[w->type].mats++;
			}
		}
		for (int t = 0; t < GPUD_TYPE_COUNT; t++)
			if (pt[t].mats && (!r || sum[t] < pt[t].best))
				pt[t].best = sum[t];
	}
	{
		double all = 0;
		uint64_t file = 0, dev = 0;

		printf("%d thread(s)\n\n| file type | matrices | file MiB | device MiB | held as | "
		       "pack s (best of %d) | file MB/s |\n|---|---:|---:|---:|---|---:|---:|\n", nt,
		       rounds);
		for (int t = 0; t < GPUD_TYPE_COUNT; t++) {
			if (!pt[t].mats)
				continue;
			printf("| %s | %llu | %.1f | %.1f | %s | %.2f | %.0f |\n",
			       gpud_type_name((enum gpud_type)t), (unsigned long long)pt[t].mats,
			       pt[t].file / 1048576.0, pt[t].dev / 1048576.0,
			       gpud_type_name(gpud_cuda_dev_type((enum gpud_type)t)), pt[t].best,
			       pt[t].file / 1e6 / pt[t].best);
			all += pt[t].best;
			file += pt[t].file;
			dev += pt[t].dev;
		}
		printf("| all | %zu | %.1f | %.1f | | %.2f | %.0f |\n", nw, file / 1048576.0,
		       dev / 1048576.0, all, file / 1e6 / all);
	}
	free(q);
	free(d);
	free(tmp);
	free(ws);
	gpud_model_free(m);
	return 0;
}
