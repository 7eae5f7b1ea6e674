/* bench_util.h - helpers shared by the benchmarks in bench/.
 *
 * Wall clock, a measured memory bandwidth to compare kernels against, and
 * the machine and date lines every recorded result carries. Benchmarks
 * print tables; nothing here asserts on a time.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stddef.h>

/* Monotonic wall clock in seconds. */
double bench_now(void);

/* Size of the last-level cache in bytes (from sysfs), or 32 MiB when it
 * cannot be read. */
size_t bench_llc_bytes(void);

/* Copies a buffer of `bytes` (use several times the LLC) with `threads`
 * threads, each copying a contiguous slice with memcpy in 8 MiB chunks
 * timed one by one, and returns in GB/s (1e9 bytes copied per second; each
 * copied byte is one read and one write) the sum over threads of each
 * thread's fastest chunk, best of 5 runs. Fastest chunks keep the figure
 * meaningful on a shared machine (a slightly optimistic sustained rate on
 * a quiet one). The buffers are allocated, touched and freed inside.
 * Returns a negative value when memory or threads are lacking. */
double bench_memcpy_gbs(size_t bytes, int threads);
/* The same, reading only (no stores): GB/s of bytes read. A burst
 * figure: the threads' fastest chunks need not have run at the same
 * time, so on a shared machine it can exceed what the threads read
 * together. */
double bench_read_gbs(size_t bytes, int threads);

/* Sustained reads, the limit of a decode step (which reads all its
 * weights once): a buffer of `bytes` (use many times the LLC; in huge
 * pages where the kernel gives them, as the engine keeps its weights)
 * that `threads` threads read in one pass, each its slice as one stream
 * prefetched ahead, as the kernels read. A pass's GB/s is all the bytes
 * over the time from the first thread's start to the last one's end.
 * bench_stream_new() returns NULL when memory or threads are lacking;
 * bench_stream_pass() a negative value when threads are. */
struct bench_stream;
struct bench_stream *bench_stream_new(size_t bytes, int threads);
double bench_stream_pass(struct bench_stream *s);
void bench_stream_free(struct bench_stream *s);
/* The best of 5 passes over a new buffer. */
double bench_stream_gbs(size_t bytes, int threads);

/* "<cpu model>, <n> CPUs, LLC <k> KiB, <uname -srm>" into buf (always
 * NUL-terminated). */
void bench_machine(char *buf, size_t len);

/* Sorts n floats ascending in place (qsort). */
void bench_sort_floats(float *v, size_t n);

/* Nearest-rank percentile p (0..100) of v sorted ascending, n > 0. */
double bench_pct(const float *v, size_t n, double p);

/* Current UTC date and time, "YYYY-MM-DD HH:MM:SS UTC", into buf. */
void bench_date(char *buf, size_t len);

#endif
