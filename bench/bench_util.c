/* bench_util.c - wall clock, memcpy bandwidth, machine and date lines. */
#include "bench/bench_util.h"

#include "common/mem.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

double bench_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t bench_llc_bytes(void)
{
	size_t best = 0;

	for (int i = 0; i < 8; i++) {
		char path[96], unit = 0;
		unsigned long v;
		FILE *f;

		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fscanf(f, "%lu%c", &v, &unit) >= 1) {
			size_t b = v;

			if (unit == 'K')
				b <<= 10;
			else if (unit == 'M')
				b <<= 20;
			if (b > best)
				best = b;
		}
		fclose(f);
	}
	return best ? best : (size_t)32 << 20;
}

#define BENCH_MEMCPY_RUNS 5
#define BENCH_MEMCPY_CHUNK ((size_t)8 << 20)

struct copy_job {
	char *dst;               /* NULL: read only (bench_read_gbs) */
	const char *src;
	size_t n;
	double best_gbs; /* this thread's fastest chunk */
	uint64_t sink;   /* the reads' checksum, so they are not optimized away */
	pthread_barrier_t *start;
};

/* Reads n bytes (a multiple of 64) with 16-byte loads into 4 independent
 * xor chains: the loads, not the arithmetic, set the pace. prefetch: each
 * line prefetched 2 KiB ahead, as the decode kernels read their weights
 * (bench_stream_pass). */
static uint64_t read_bytes(const char *p, size_t n, bool prefetch)
{
	typedef unsigned long long v2 __attribute__((vector_size(16)));
	v2 a = { 0, 0 }, b = a, c = a, d = a, t;

	for (size_t off = 0; off + 64 <= n; off += 64) {
		if (prefetch)
			__builtin_prefetch(p + off + 2048, 0, 3);
		memcpy(&t, p + off, 16);
		a ^= t;
		memcpy(&t, p + off + 16, 16);
		b ^= t;
		memcpy(&t, p + off + 32, 16);
		c ^= t;
		memcpy(&t, p + off + 48, 16);
		d ^= t;
	}
	a ^= b ^ c ^ d;
	return a[0] ^ a[1];
}

/* Copies the slice chunk by chunk, timing each: on a shared machine the
 * fastest chunk is the one copied while the thread had a core. */
static void *copy_main(void *p)
{
	struct copy_job *j = p;

	pthread_barrier_wait(j->start);
	for (size_t off = 0; off < j->n; off += BENCH_MEMCPY_CHUNK) {
		size_t n = j->n - off < BENCH_MEMCPY_CHUNK ? j->n - off : BENCH_MEMCPY_CHUNK;
		double t0 = bench_now(), t;

		if (j->dst)
			memcpy(j->dst + off, j->src + off, n);
		else
			j->sink ^= read_bytes(j->src + off, n, false);
		t = bench_now() - t0;
		if (t > 0 && (double)n / t * 1e-9 > j->best_gbs)
			j->best_gbs = (double)n / t * 1e-9;
	}
	return NULL;
}

/* Runs fn(job 0) here and fn(job i) on threads 1..n-1, all released
 * together by the barrier each job's "start" points at; returns when all
 * are done. -1 (nothing run) when a thread cannot be started. */
static int run_together(void *(*fn)(void *), void *jobs, size_t job_size, int n,
			pthread_barrier_t *start)
{
	pthread_t tid[64];
	int started = 0;

	for (int i = 1; i < n; i++) {
		if (pthread_create(&tid[i], NULL, fn, (char *)jobs + job_size * (size_t)i))
			break;
		started++;
	}
	if (started != n - 1) {
		/* Cannot reach the barrier count: release the started ones. */
		for (int i = started + 1; i < n; i++)
			pthread_barrier_wait(start);
		for (int i = 1; i <= started; i++)
			pthread_join(tid[i], NULL);
		return -1;
	}
	fn(jobs);
	for (int i = 1; i < n; i++)
		pthread_join(tid[i], NULL);
	return 0;
}

static double mem_gbs(size_t bytes, int threads, bool read_only)
{
	struct copy_job jobs[64];
	pthread_barrier_t start;
	char *src, *dst;
	double best = 0.0;

	if (threads < 1 || threads > 64)
		return -1.0;
	src = malloc(bytes);
	dst = read_only ? NULL : malloc(bytes);
	if (!src || (!dst && !read_only)) {
		free(src);
		free(dst);
		return -1.0;
	}
	/* Fault every page in before timing. */
	memset(src, 1, bytes);
	if (dst)
		memset(dst, 2, bytes);
	for (int run = 0; run < BENCH_MEMCPY_RUNS; run++) {
		size_t per = (bytes / (size_t)threads) & ~(size_t)4095;
		double sum = 0.0;
		int rc;

		pthread_barrier_init(&start, NULL, (unsigned)threads);
		for (int i = 0; i < threads; i++) {
			jobs[i].dst = dst ? dst + per * (size_t)i : NULL;
			jobs[i].src = src + per * (size_t)i;
			jobs[i].n = i == threads - 1 ? bytes - per * (size_t)i : per;
			jobs[i].best_gbs = 0.0;
			jobs[i].sink = 0;
			jobs[i].start = &start;
		}
		rc = run_together(copy_main, jobs, sizeof(jobs[0]), threads, &start);
		pthread_barrier_destroy(&start);
		if (rc) {
			best = -1.0;
			break;
		}
		for (int i = 0; i < threads; i++)
			sum += jobs[i].best_gbs;
		if (sum > best)
			best = sum;
	}
	free(src);
	free(dst);
	return best;
}

double bench_memcpy_gbs(size_t bytes, int threads)
{
	return mem_gbs(bytes, threads, false);
}

double bench_read_gbs(size_t bytes, int threads)
{
	return mem_gbs(bytes, threads, true);
}

/* ---- sustained reads: the limit of a decode step ---------------------- */

struct bench_stream {
	char *buf;
	size_t bytes;
	int threads;
};

struct stream_job {
	const char *p;
	size_t n;
	double t0, t1;
	uint64_t sink;
	pthread_barrier_t *start;
};

static void *stream_main(void *p)
{
	struct stream_job *j = p;

	pthread_barrier_wait(j->start);
	j->t0 = bench_now();
	j->sink ^= read_bytes(j->p, j->n, true);
	j->t1 = bench_now();
	return NULL;
}

struct bench_stream *bench_stream_new(size_t bytes, int threads)
{
	struct bench_stream *s;

	if (threads < 1 || threads > 64 || bytes < 64 * (size_t)threads)
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->bytes = bytes & ~(size_t)63;
	s->threads = threads;
	/* huge pages, as the engine keeps its packed weights */
	s->buf = sw_mem_map_big(s->bytes);
	if (!s->buf) {
		free(s);
		return NULL;
	}
	memset(s->buf, 1, s->bytes);
	return s;
}

double bench_stream_pass(struct bench_stream *s)
{
	struct stream_job jobs[64];
	pthread_barrier_t start;
	size_t per = (s->bytes / (size_t)s->threads) & ~(size_t)63;
	double t0, t1;
	int rc;

	pthread_barrier_init(&start, NULL, (unsigned)s->threads);
	for (int i = 0; i < s->threads; i++) {
		jobs[i].p = s->buf + per * (size_t)i;
		jobs[i].n = i == s->threads - 1 ? s->bytes - per * (size_t)i : per;
		jobs[i].sink = 0;
		jobs[i].start = &start;
	}
	rc = run_together(stream_main, jobs, sizeof(jobs[0]), s->threads, &start);
	pthread_barrier_destroy(&start);
	if (rc)
		return -1.0;
	/* all the bytes over the first start to the last end */
	t0 = jobs[0].t0;
	t1 = jobs[0].t1;
	for (int i = 1; i < s->threads; i++) {
		t0 = jobs[i].t0 < t0 ? jobs[i].t0 : t0;
		t1 = jobs[i].t1 > t1 ? jobs[i].t1 : t1;
		jobs[0].sink ^= jobs[i].sink;
	}
	if (jobs[0].sink == 0x5eed) /* keeps the reads; never true for a fill of 1s */
		fprintf(stderr, "bench_stream: %llx\n", (unsigned long long)jobs[0].sink);
	return t1 > t0 ? (double)s->bytes / (t1 - t0) * 1e-9 : -1.0;
}

void bench_stream_free(struct bench_stream *s)
{
	if (!s)
		return;
	sw_mem_unmap_big(s->buf, s->bytes);
	free(s);
}

double bench_stream_gbs(size_t bytes, int threads)
{
	struct bench_stream *s = bench_stream_new(bytes, threads);
	double best = -1.0;

	if (!s)
		return -1.0;
	for (int run = 0; run < BENCH_MEMCPY_RUNS; run++) {
		double g = bench_stream_pass(s);

		best = g > best ? g : best;
	}
	bench_stream_free(s);
	return best;
}

void bench_machine(char *buf, size_t len)
{
	char model[256] = "unknown CPU", line[512];
	struct utsname u;
	FILE *f = fopen("/proc/cpuinfo", "r");

	if (f) {
		while (fgets(line, sizeof(line), f)) {
			char *colon = strchr(line, ':');

			if (strncmp(line, "model name", 10) == 0 && colon) {
				colon++;
				while (*colon == ' ' || *colon == '\t')
					colon++;
				snprintf(model, sizeof(model), "%s", colon);
				model[strcspn(model, "\n")] = 0;
				break;
			}
		}
		fclose(f);
	}
	if (uname(&u) != 0)
		memset(&u, 0, sizeof(u));
	snprintf(buf, len, "%s, %ld CPUs, LLC %zu KiB, %s %s %s", model,
		 sysconf(_SC_NPROCESSORS_ONLN), bench_llc_bytes() >> 10, u.sysname,
		 u.release, u.machine);
}

void bench_date(char *buf, size_t len)
{
	time_t now = time(NULL);
	struct tm tm;

	gmtime_r(&now, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x > y) - (x < y);
}

void bench_sort_floats(float *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_float);
}

double bench_pct(const float *v, size_t n, double p)
{
	double x = p / 100.0 * (double)n;
	size_t r = (size_t)x;

	if ((double)r < x) /* ceil without libm */
		r++;
	return v[r > 0 ? r - 1 : 0];
}
