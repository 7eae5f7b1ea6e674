/* bench_ipc.c - round trip of a no-op request to a running gpud.
 *
 * The no-op is a TOKENIZE of an empty text (--stats: a STATS request
 * instead, which also renders the stats JSON): one frame and an 8-byte
 * payload in the request area out, one doorbell frame and a ring record
 * back, through the client library's reader thread. It never reaches a
 * device thread, so it measures the socket + shared memory path and the
 * daemon's loop.
 *
 * Runs 1 thread on one connection, 8 threads sharing one connection, and
 * 8 threads with a connection each; prints p50/p99/max round trip in µs
 * (each thread's calls timed one by one, merged) and messages/s (all
 * round trips / wall time). Target reported against, never asserted:
 * p50 <= 30 µs.
 *
 * usage: bench_ipc --socket PATH [--seconds S] [--stats] [--out FILE.md]
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "common/err.h"
#include "proto/client.h"

#define MAX_THREADS 8
#define MAX_SAMPLES (1u << 20)
#define WARMUP 200

struct run {
	const char *label;
	int threads;
	bool conn_per_thread;
	double p50, p99, max, msgs_per_s;
	size_t n;
	int errors;
};

struct thread_arg {
	struct proto_client *c;
	bool stats;
	double seconds;
	float *samples; /* (MAX_SAMPLES) µs */
	size_t n;
	int errors;
	pthread_barrier_t *start;
};

static int noop(struct proto_client *c, bool stats, char *err, size_t errlen)
{
	if (stats) {
		char *json = NULL;
		int rc = proto_client_stats(c, &json, err, errlen);
		free(json);
		return rc;
	}
	int32_t *ids = NULL;
	uint32_t n = 0;
	int rc = proto_client_tokenize(c, "", 0, 0, &ids, &n, err, errlen);
	free(ids);
	return rc;
}

static void *thread_main(void *p)
{
	struct thread_arg *a = p;
	char err[SW_ERR_MAX];

	for (int i = 0; i < WARMUP; i++)
		if (noop(a->c, a->stats, err, sizeof(err)))
			a->errors++;
	pthread_barrier_wait(a->start);
	double end = bench_now() + a->seconds;
	while (a->n < MAX_SAMPLES) {
		double t0 = bench_now();
		int rc = noop(a->c, a->stats, err, sizeof(err));
		double t1 = bench_now();
		if (rc) {
			if (a->errors++ == 0)
				fprintf(stderr, "bench_ipc: %s\n", err);
			if (rc == SW_ECLOSED)
				break;
			continue;
		}
		a->samples[a->n++] = (float)((t1 - t0) * 1e6);
		if (t1 >= end)
			break;
	}
	return NULL;
}

static int do_run(const char *socket, struct run *r, bool stats, double seconds)
{
	struct proto_client *conns[MAX_THREADS] = { 0 };
	struct thread_arg args[MAX_THREADS];
	pthread_t tids[MAX_THREADS];
	pthread_barrier_t start;
	float *all = NULL;
	int n_conns = r->conn_per_thread ? r->threads : 1, rc = 0;
	char err[SW_ERR_MAX];

	memset(args, 0, sizeof(args));
	for (int i = 0; i < n_conns; i++) {
		rc = proto_client_connect(&conns[i], socket, NULL, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "bench_ipc: connect %s: %s\n", socket, err);
			goto out_close;
		}
	}
	pthread_barrier_init(&start, NULL, (unsigned)r->threads + 1);
	for (int i = 0; i < r->threads; i++) {
		args[i].c = conns[r->conn_per_thread ? i : 0];
		args[i].stats = stats;
		args[i].seconds = seconds;
		args[i].start = &start;
		args[i].samples = malloc(MAX_SAMPLES * sizeof(float));
		if (!args[i].samples) {
			rc = -ENOMEM;
			goto out_barrier;
		}
	}
	for (int i = 0; i < r->threads; i++) {
		/* Threads already started wait on the barrier: nothing to undo
		 * short of exiting. */
		if (pthread_create(&tids[i], NULL, thread_main, &args[i])) {
			fprintf(stderr, "bench_ipc: cannot start a thread\n");
			exit(1);
		}
	}
	pthread_barrier_wait(&start);
	double t0 = bench_now();
	for (int i = 0; i < r->threads; i++)
		pthread_join(tids[i], NULL);
	double wall = bench_now() - t0;

	size_t total = 0;
	for (int i = 0; i < r->threads; i++) {
		total += args[i].n;
		r->errors += args[i].errors;
	}
	all = malloc((total ? total : 1) * sizeof(float));
	if (!all) {
		rc = -ENOMEM;
		goto out_barrier;
	}
	size_t k = 0;
	for (int i = 0; i < r->threads; i++) {
		memcpy(all + k, args[i].samples, args[i].n * sizeof(float));
		k += args[i].n;
	}
	bench_sort_floats(all, total);
	r->n = total;
	if (total) {
		r->p50 = bench_pct(all, total, 50);
		r->p99 = bench_pct(all, total, 99);
		r->max = all[total - 1];
	}
	r->msgs_per_s = wall > 0 ? total / wall : 0;
out_barrier:
	pthread_barrier_destroy(&start);
	for (int i = 0; i < r->threads; i++)
		free(args[i].samples);
	free(all);
out_close:
	for (int i = 0; i < n_conns; i++)
		proto_client_close(conns[i]);
	return rc;
}

static void print_table(FILE *f, const struct run *runs, int n, bool stats)
{
	fprintf(f, "| no-op | clients | p50 µs | p99 µs | max µs | messages/s | round trips "
		   "| errors | p50 ≤ 30 µs |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n");
	for (int i = 0; i < n; i++)
		fprintf(f, "| %s | %s | %.1f | %.1f | %.0f | %.0f | %zu | %d | %s |\n",
			stats ? "STATS" : "TOKENIZE \"\"", runs[i].label, runs[i].p50,
			runs[i].p99, runs[i].max, runs[i].msgs_per_s, runs[i].n, runs[i].errors,
			runs[i].p50 <= 30.0 ? "met" : "not met");
}

int main(int argc, char **argv)
{
	struct run runs[] = {
		{ .label = "1 thread, 1 connection", .threads = 1 },
		{ .label = "8 threads, 1 connection", .threads = 8 },
		{ .label = "8 threads, 8 connections", .threads = 8, .conn_per_thread = true },
	};
	const int n_runs = (int)(sizeof(runs) / sizeof(runs[0]));
	const char *socket = NULL, *out = NULL;
	double seconds = 2.0;
	bool stats = false;
	char machine[256], date[64];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
			socket = argv[++i];
		} else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
			seconds = atof(argv[++i]);
		} else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
			out = argv[++i];
		} else if (!strcmp(argv[i], "--stats")) {
			stats = true;
		} else {
			socket = NULL;
			break;
		}
	}
	if (!socket) {
		fprintf(stderr, "usage: %s --socket PATH [--seconds S] [--stats] [--out FILE.md]\n",
			argv[0]);
		return 2;
	}
	bench_machine(machine, sizeof(machine));
	bench_date(date, sizeof(date));
	for (int i = 0; i < n_runs; i++) {
		if (do_run(socket, &runs[i], stats, seconds))
			return 1;
		fprintf(stderr, "bench_ipc: %s: p50 %.1f us, %.0f msg/s\n", runs[i].label,
			runs[i].p50, runs[i].msgs_per_s);
	}
	printf("machine: %s\ndate: %s\n%.1f s per run\n\n", machine, date, seconds);
	print_table(stdout, runs, n_runs, stats);
	if (out) {
		FILE *f = fopen(out, "w");
		if (!f) {
			fprintf(stderr, "bench_ipc: %s: %s\n", out, strerror(errno));
			return 1;
		}
		fprintf(f, "- machine: %s\n- date: %s\n- %.1f s per run\n\n", machine, date,
			seconds);
		print_table(f, runs, n_runs, stats);
		fclose(f);
	}
	int errors = 0;
	for (int i = 0; i < n_runs; i++)
		errors += runs[i].errors;
	return errors ? 1 : 0;
}
