/* bench_mask.c - compiled mask descriptors vs dense masks.
 *
 * For 1k/4k/16k prompt tokens x 8/64 segments and three descriptor shapes,
 * measures gpud_mask_compile (time, and gpud_mask_bytes per request) next
 * to a dense n x n mask built from the same descriptor: its size as bits,
 * as u8 and as an fp16 additive mask, and the time to fill a u8 and a bit
 * mask. Both fills write each row segment-run by segment-run (memset / word
 * stores), the fastest honest way to build a dense mask, so the comparison
 * does not favour the descriptor by a naive per-element loop.
 *
 * Shapes:
 *   causal  no descriptor (rows NULL): every segment sees all earlier ones;
 *   block   s0 = system prompt, s1..s(S-2) context chunks that see only s0
 *           and themselves, s(S-1) = the query and G see everything;
 *   no-s0   causal except that G does not see s0.
 *
 * Segments split the prompt evenly (the first ones take the remainder).
 * KV block size 16. Times are the best of repeated runs (the machine is
 * shared), with the median beside the compile time. Nothing is asserted.
 *
 * usage: bench_mask [--seconds S] [--out FILE.md]
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "gpud/mask.h"

#define BLOCK_TOKENS 16
#define MAX_ROWS (GPUD_MASK_MAX_SEGMENTS + 1)
#define MAX_SAMPLES 4096

enum shape { SHAPE_CAUSAL, SHAPE_BLOCK, SHAPE_NO_S0, N_SHAPES };
static const char *const shape_name[N_SHAPES] = { "causal", "block", "no-s0" };

struct desc_store {
	struct proto_mask_desc desc;
	struct proto_mask_row rows[MAX_ROWS];
	uint16_t idx[MAX_ROWS * MAX_ROWS];
	uint32_t seg_tokens[GPUD_MASK_MAX_SEGMENTS];
};

struct cell {
	uint32_t n, s;
	enum shape shape;
	size_t compiled_bytes;
	double compile_best_us, compile_median_us;
	double fill_u8_us, fill_bits_us;
	uint64_t visible; /* visible (q, k) pairs, a check both builds agree on */
};

/* Row i lists the segments it sees; i always sees itself. */
static void build_desc(struct desc_store *d, enum shape shape, uint32_t n, uint32_t s)
{
	uint32_t at = 0;

	for (uint32_t i = 0; i < s; i++)
		d->seg_tokens[i] = n / s + (i < n % s ? 1 : 0);
	d->desc.n_segments = s;
	if (shape == SHAPE_CAUSAL) {
		d->desc.rows = NULL;
		return;
	}
	for (uint32_t i = 0; i <= s; i++) {
		uint16_t *row = &d->idx[at];
		uint32_t k = 0;
		bool is_chunk = shape == SHAPE_BLOCK && i > 0 && i + 1 < s;

		for (uint32_t j = 0; j <= i; j++) {
			if (is_chunk && j != 0 && j != i)
				continue;
			if (shape == SHAPE_NO_S0 && i == s && j == 0)
				continue;
			row[k++] = (uint16_t)j;
		}
		d->rows[i].idx = row;
		d->rows[i].n = k;
		at += k;
	}
	d->desc.rows = d->rows;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Dense u8 mask (n x n, row q = query), built the fastest honest way:
 * each row is written segment run by segment run (memset) from the
 * segment boundaries (seg_tokens) and the compiled vis sets, so both forms
 * come from the same descriptor. Returns the visible (q, k) pairs. */
static uint64_t fill_u8(const struct gpud_mask *m, const uint32_t *seg_tokens, uint8_t *dense,
			uint32_t n)
{
	uint64_t visible = 0;
	uint32_t sq = 0, sq_end = seg_tokens[0];

	for (uint32_t q = 0; q < n; q++) {
		uint8_t *row = dense + (size_t)q * n;

		while (q >= sq_end)
			sq_end += seg_tokens[++sq];
		const gpud_segset *v = &m->vis[sq];
		uint32_t k = 0;
		for (uint32_t j = 0; k <= q; j++) {
			uint32_t end = k + seg_tokens[j];
			if (end > q + 1)
				end = q + 1;
			bool on = gpud_segset_has(v, j);
			memset(row + k, on, end - k);
			if (on)
				visible += end - k;
			k = end;
		}
		memset(row + q + 1, 0, n - q - 1);
	}
	return visible;
}

static void set_bits(uint64_t *row, uint32_t from, uint32_t to)
{
	while (from < to) {
		uint32_t w = from >> 6, b = from & 63;
		uint32_t take = 64 - b < to - from ? 64 - b : to - from;

		row[w] |= take == 64 ? ~0ULL : ((1ULL << take) - 1) << b;
		from += take;
	}
}

/* Dense bit mask: n rows of ceil(n / 64) words, built like fill_u8. */
static uint64_t fill_bits(const struct gpud_mask *m, const uint32_t *seg_tokens,
			  uint64_t *dense, uint32_t n)
{
	size_t words = (n + 63) / 64;
	uint64_t visible = 0;
	uint32_t sq = 0, sq_end = seg_tokens[0];

	for (uint32_t q = 0; q < n; q++) {
		uint64_t *row = dense + (size_t)q * words;

		while (q >= sq_end)
			sq_end += seg_tokens[++sq];
		const gpud_segset *v = &m->vis[sq];
		uint32_t k = 0;
		memset(row, 0, words * sizeof(*row));
		for (uint32_t j = 0; k <= q; j++) {
			uint32_t end = k + seg_tokens[j];
			if (end > q + 1)
				end = q + 1;
			if (gpud_segset_has(v, j)) {
				set_bits(row, k, end);
				visible += end - k;
			}
			k = end;
		}
	}
	return visible;
}

/* The same count straight from the definition, on a few rows, to check the
 * fills (and the compiled mask) against DESIGN §3. */
static int check_rows(const struct gpud_mask *m, const uint8_t *dense, const uint64_t *bits,
		      uint32_t n, const struct desc_store *d)
{
	size_t words = (n + 63) / 64;

	uint32_t rows[] = { 0, n / 3, n / 2, n - 1 };

	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		uint32_t q = rows[r];
		for (uint32_t k = 0; k < n; k++) {
			bool want = false;
			if (k <= q) {
				unsigned sq = m->seg[q], sk = m->seg[k];
				if (!d->desc.rows) {
					want = true;
				} else {
					for (uint32_t j = 0; j < d->rows[sq].n; j++)
						want |= d->rows[sq].idx[j] == sk;
					want |= sk == sq;
				}
			}
			bool bit = (bits[(size_t)q * words + k / 64] >> (k % 64)) & 1;
			if (dense[(size_t)q * n + k] != want || bit != want) {
				fprintf(stderr, "bench_mask: dense mask wrong at (%u, %u)\n", q, k);
				return -1;
			}
		}
	}
	return 0;
}

static int bench_cell(struct cell *c, double seconds)
{
	static struct desc_store d;
	static double samples[MAX_SAMPLES];
	struct gpud_mask m;
	uint32_t n = c->n, s = c->s;
	size_t bytes = gpud_mask_bytes(s, n, BLOCK_TOKENS);
	size_t words = (n + 63) / 64;
	void *mem = aligned_alloc(16, (bytes + 15) & ~(size_t)15);
	uint8_t *dense = malloc((size_t)n * n);
	uint64_t *bits = malloc((size_t)n * words * sizeof(uint64_t));
	int rc = -1, k = 0;

	if (!mem || !dense || !bits) {
		fprintf(stderr, "bench_mask: out of memory at n=%u\n", n);
		goto out_free;
	}
	build_desc(&d, c->shape, n, s);
	c->compiled_bytes = bytes;

	double t_end = bench_now() + seconds;
	do {
		double t0 = bench_now();
		rc = gpud_mask_compile(&d.desc, d.seg_tokens, BLOCK_TOKENS, mem, bytes, &m);
		samples[k++] = (bench_now() - t0) * 1e6;
		if (rc) {
			fprintf(stderr, "bench_mask: compile failed (%d)\n", rc);
			goto out_free;
		}
	} while (k < MAX_SAMPLES && (k < 5 || bench_now() < t_end));
	qsort(samples, k, sizeof(samples[0]), cmp_double);
	c->compile_best_us = samples[0];
	c->compile_median_us = samples[k / 2];

	/* Dense fills are slow: at least 3 runs, best kept. */
	c->fill_u8_us = c->fill_bits_us = 1e30;
	t_end = bench_now() + seconds;
	for (int i = 0; i < 3 || (i < 50 && bench_now() < t_end); i++) {
		double t0 = bench_now();
		uint64_t v8 = fill_u8(&m, d.seg_tokens, dense, n);
		double t1 = bench_now();
		uint64_t vb = fill_bits(&m, d.seg_tokens, bits, n);
		double t2 = bench_now();
		if (v8 != vb) {
			fprintf(stderr, "bench_mask: u8 and bit masks disagree\n");
			rc = -1;
			goto out_free;
		}
		c->visible = v8;
		if ((t1 - t0) * 1e6 < c->fill_u8_us)
			c->fill_u8_us = (t1 - t0) * 1e6;
		if ((t2 - t1) * 1e6 < c->fill_bits_us)
			c->fill_bits_us = (t2 - t1) * 1e6;
	}
	rc = check_rows(&m, dense, bits, n, &d);
out_free:
	free(bits);
	free(dense);
	free(mem);
	return rc;
}

static void fmt_bytes(char *buf, size_t len, double b)
{
	if (b >= 1024.0 * 1024 * 1024)
		snprintf(buf, len, "%.2f GiB", b / (1024.0 * 1024 * 1024));
	else if (b >= 1024.0 * 1024)
		snprintf(buf, len, "%.1f MiB", b / (1024.0 * 1024));
	else if (b >= 1024.0)
		snprintf(buf, len, "%.1f KiB", b / 1024.0);
	else
		snprintf(buf, len, "%.0f B", b);
}

static void print_table(FILE *f, const struct cell *cells, int n)
{
	fprintf(f, "| tokens | segs | shape | compiled bytes | compile µs best (median) "
		   "| dense bits | dense u8 | dense fp16 | fill u8 µs | fill bits µs "
		   "| u8 / compiled (bytes) | fill u8 / compile (time) |\n"
		   "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (int i = 0; i < n; i++) {
		const struct cell *c = &cells[i];
		double nn = (double)c->n * c->n;
		char cb[32], db[32], du[32], dh[32];

		fmt_bytes(cb, sizeof(cb), (double)c->compiled_bytes);
		fmt_bytes(db, sizeof(db), (double)c->n * ((c->n + 63) / 64) * 8);
		fmt_bytes(du, sizeof(du), nn);
		fmt_bytes(dh, sizeof(dh), 2 * nn);
		fprintf(f, "| %u | %u | %s | %s | %.2f (%.2f) | %s | %s | %s | %.0f | %.0f "
			   "| %.0fx | %.0fx |\n",
			c->n, c->s, shape_name[c->shape], cb, c->compile_best_us,
			c->compile_median_us, db, du, dh, c->fill_u8_us, c->fill_bits_us,
			nn / (double)c->compiled_bytes, c->fill_u8_us / c->compile_best_us);
	}
}

int main(int argc, char **argv)
{
	static const uint32_t tokens[] = { 1024, 4096, 16384 };
	static const uint32_t segs[] = { 8, 64 };
	struct cell cells[3 * 2 * N_SHAPES];
	double seconds = 0.3;
	const char *out = NULL;
	char machine[256], date[64];
	int n = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
			seconds = atof(argv[++i]);
		} else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
			out = argv[++i];
		} else {
			fprintf(stderr, "usage: %s [--seconds S] [--out FILE.md]\n", argv[0]);
			return 2;
		}
	}
	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	for (size_t t = 0; t < 3; t++) {
		for (size_t g = 0; g < 2; g++) {
			for (int sh = 0; sh < N_SHAPES; sh++) {
				struct cell *c = &cells[n];
				memset(c, 0, sizeof(*c));
				c->n = tokens[t];
				c->s = segs[g];
				c->shape = sh;
				if (bench_cell(c, seconds))
					return 1;
				fprintf(stderr, "bench_mask: %u tokens, %u segments, %s: "
						"compile %.2f us, fill u8 %.0f us\n",
					c->n, c->s, shape_name[sh], c->compile_best_us,
					c->fill_u8_us);
				n++;
			}
		}
	}
	printf("machine: %s\ndate: %s\nKV block %d tokens; times best of repeated runs\n\n",
	       machine, date, BLOCK_TOKENS);
	print_table(stdout, cells, n);
	if (out) {
		FILE *f = fopen(out, "w");
		if (!f) {
			fprintf(stderr, "bench_mask: %s: %s\n", out, strerror(errno));
			return 1;
		}
		fprintf(f, "- machine: %s\n- date: %s\n- KV block %d tokens\n\n", machine, date,
			BLOCK_TOKENS);
		print_table(f, cells, n);
		fclose(f);
	}
	return 0;
}
