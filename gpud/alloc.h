/* alloc.h - allocation accounting for gpud (DESIGN §2: "device/host
 * allocations since warm-up must stay 0", counted for real).
 *
 * Host: gpud/alloc_hook.c replaces the process's malloc family (malloc,
 * calloc, realloc, free, posix_memalign, aligned_alloc, memalign, valloc)
 * with wrappers that count and forward to glibc (__libc_malloc etc.). It
 * is linked (link_whole) into the gpud executable, the tests that count
 * allocations and bench_tokenizer (the one counting mechanism of the
 * project); every allocation of the process is seen - ours, libuv's,
 * jansson's, libc's own. Under AddressSanitizer the wrappers are not
 * compiled (ASan owns malloc); the counts come from
 * __sanitizer_install_malloc_and_free_hooks instead. Without either,
 * gpud_alloc_hooked() is false and every count stays 0 (reports say
 * "not counted", never "0"). Under valgrind memcheck bypasses the
 * wrappers unless run with --soname-synonyms=somalloc=nouserintercepts
 * (see alloc_hook.c); hooked() tells which, from a probe allocation made
 * before main.
 *
 * Every thread has a role (thread-local, default OTHER). Counts are kept
 * per role, lock-free (relaxed atomics; the wrappers never allocate and
 * never take a lock), so the report can say *where* an allocation
 * happened: DEVICE threads run the step path, the LOOP thread the request
 * path (frames, decoding, tokenizing, replies).
 *
 * Device: backends report every device allocation they make
 * (gpud_alloc_device_note: cudaMalloc in the CUDA backend, the KV and
 * scratch reservations of the CPU backend), so "device allocations since
 * warm-up" is counted at the single place that allocates.
 *
 * Warm-up: gpud_alloc_warmup_done() takes a snapshot; "since warm-up"
 * counts are the differences. The daemon calls it once start-up has
 * reserved every pool and each device has run one warm-up step.
 */
#ifndef GPUD_ALLOC_H
#define GPUD_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A thread's role. Every thread gpud starts names one (the main thread
 * through alloc_hook.c's constructor); a thread that never did was started
 * by a library for itself - the CUDA driver's own threads, which allocate
 * now and then on a real GPU - and counts as foreign: reported on its own,
 * never part of the host counts that gpud answers for (GPUD_ALLOC_ROLES
 * from GPUD_ALLOC_OTHER on). */
enum gpud_alloc_role {
	GPUD_ALLOC_FOREIGN = 0, /* threads gpud did not start (a library's own) */
	GPUD_ALLOC_OTHER = 1,   /* start-up, sampling and helper threads */
	GPUD_ALLOC_LOOP = 2,    /* the server's event loop (request path) */
	GPUD_ALLOC_DEVICE = 3,  /* device workers and their compute threads (step path) */
	GPUD_ALLOC_ROLES = 4,
};

/* Sets the calling thread's role (thread-local). */
void gpud_alloc_set_role(enum gpud_alloc_role role);
enum gpud_alloc_role gpud_alloc_role(void);

/* True when host allocations are being counted (wrappers or ASan hooks
 * installed). */
bool gpud_alloc_hooked(void);

/* Backends: one device allocation of bytes on device dev (0-based). */
void gpud_alloc_device_note(int dev, size_t bytes);

struct gpud_alloc_counts {
	uint64_t host_allocs[GPUD_ALLOC_ROLES]; /* malloc-family calls that allocated
						 * (realloc counts when it moves or grows) */
	uint64_t host_frees[GPUD_ALLOC_ROLES];
	uint64_t host_bytes[GPUD_ALLOC_ROLES];  /* bytes requested */
	uint64_t device_allocs;
	uint64_t device_bytes;
};

/* Counts since process start. Any thread; never allocates. */
void gpud_alloc_counts(struct gpud_alloc_counts *c);

/* Host allocations of every role, i.e. of every thread (foreign ones
 * too), since process start (the sum of gpud_alloc_counts' host_allocs). Tests and
 * benchmarks that check that a region allocates nothing read it before
 * and after the region. Stays 0 while gpud_alloc_hooked() is false. Any
 * thread; never allocates. */
uint64_t gpud_alloc_host_allocs(void);

/* True when gpud/alloc_hook.c is linked into the process and installed
 * itself (its probe ran before main), whether or not the probe was
 * counted: with the hook linked, gpud_alloc_hooked() is false only when
 * something else redirects malloc past it (valgrind's memcheck by
 * default). A test that counts asserts this, so that a count of 0 can
 * never come from a missing hook. */
bool gpud_alloc_hook_linked(void);

/* Marks the end of warm-up (snapshot). Calling it again moves the mark. */
void gpud_alloc_warmup_done(void);
bool gpud_alloc_warm(void);

/* Counts since the warm-up mark (all zero before the mark). */
void gpud_alloc_since_warmup(struct gpud_alloc_counts *c);

/* Where an allocation that should not happen came from: the stacks of the
 * first GPUD_ALLOC_TRACES host allocations made after warm-up by gpud's
 * own threads (every role but the foreign one), taken inside the
 * counting hook once gpud_alloc_traces_arm() has loaded the unwinder (it
 * allocates the first time). gpud_alloc_traces_write(fd) writes them with
 * backtrace_symbols_fd (no allocation: shared libraries' exported names,
 * the executable's as offsets) and returns how many there were. */
#define GPUD_ALLOC_TRACES 4
void gpud_alloc_traces_arm(void);
int gpud_alloc_traces_write(int fd);

/* "foreign", "other", "loop", "device" */
const char *gpud_alloc_role_name(enum gpud_alloc_role role);

/* The host allocations of gpud's own threads in c (every role but
 * GPUD_ALLOC_FOREIGN): what must stay 0 after warm-up. */
uint64_t gpud_alloc_own_host(const struct gpud_alloc_counts *c);

/* For gpud/alloc_hook.c only: feed the counters (the calling thread's
 * role; lock-free, never allocate) and report the probe: called once,
 * with whether the probe allocation was seen (this also marks the hook
 * linked). */
void gpud_alloc__host_alloc(size_t bytes);
void gpud_alloc__host_free(void);
void gpud_alloc__set_hooked(bool on);

#endif
