/* alloc.c - allocation counters (gpud/alloc.h).
 *
 * The counters live here, in the daemon library; gpud/alloc_hook.c (the
 * malloc wrappers or the sanitizer hooks) feeds them through
 * gpud_alloc__host_alloc() / gpud_alloc__host_free(). A binary without the
 * hook links this file alone: nothing feeds the counters and
 * gpud_alloc_hooked() stays false.
 */
#include "gpud/alloc.h"

#include <execinfo.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One cache line per role so device threads and the loop thread do not
 * bounce each other's line on every malloc. */
struct role_counts {
	_Atomic uint64_t allocs;
	_Atomic uint64_t frees;
	_Atomic uint64_t bytes;
} __attribute__((aligned(64)));

static struct role_counts host[GPUD_ALLOC_ROLES];
static _Atomic uint64_t dev_allocs;
static _Atomic uint64_t dev_bytes;
static atomic_bool hooked;
static atomic_bool linked;
static atomic_bool warm;

/* The warm-up mark. Written under a sequence counter so a reader never
 * mixes two marks; the writer (gpud_alloc_warmup_done) is rare. */
static _Atomic uint64_t mark_seq;
static _Atomic uint64_t mark[3 * GPUD_ALLOC_ROLES + 2];

/* initial-exec: reading the role never calls __tls_get_addr (which may
 * allocate) from inside malloc. */
static __thread enum gpud_alloc_role cur_role __attribute__((tls_model("initial-exec")));

void gpud_alloc_set_role(enum gpud_alloc_role role)
{
	if ((unsigned)role >= GPUD_ALLOC_ROLES || role == GPUD_ALLOC_FOREIGN)
		role = GPUD_ALLOC_OTHER; /* a thread that names a role is gpud's */
	cur_role = role;
}

enum gpud_alloc_role gpud_alloc_role(void)
{
	return cur_role;
}

const char *gpud_alloc_role_name(enum gpud_alloc_role role)
{
	switch (role) {
	case GPUD_ALLOC_FOREIGN:
		return "foreign";
	case GPUD_ALLOC_OTHER:
		return "other";
	case GPUD_ALLOC_LOOP:
		return "loop";
	case GPUD_ALLOC_DEVICE:
		return "device";
	default:
		return "?";
	}
}

#define TRACE_DEPTH 32
static atomic_bool traces_armed;
static _Atomic int n_traces;
static struct {
	void *pc[TRACE_DEPTH];
	int depth;
	enum gpud_alloc_role role;
	size_t bytes;
	_Atomic bool done;
} traces[GPUD_ALLOC_TRACES];
static __thread bool in_trace __attribute__((tls_model("initial-exec")));

void gpud_alloc_traces_arm(void)
{
	void *pc[2];

	backtrace(pc, 2); /* loads the unwinder now: it allocates once */
	atomic_store(&traces_armed, true);
}

/* An allocation by one of gpud's threads after warm-up: its stack into the
 * next free record (never allocates: armed, and not re-entered). */
static void trace(enum gpud_alloc_role role, size_t bytes)
{
	int i;

	if (in_trace || !atomic_load_explicit(&traces_armed, memory_order_relaxed) ||
	    atomic_load_explicit(&n_traces, memory_order_relaxed) >= GPUD_ALLOC_TRACES)
		return;
	i = atomic_fetch_add(&n_traces, 1);
	if (i >= GPUD_ALLOC_TRACES)
		return;
	in_trace = true;
	traces[i].depth = backtrace(traces[i].pc, TRACE_DEPTH);
	traces[i].role = role;
	traces[i].bytes = bytes;
	atomic_store(&traces[i].done, true);
	in_trace = false;
}

int gpud_alloc_traces_write(int fd)
{
	int n = atomic_load(&n_traces);

	if (n > GPUD_ALLOC_TRACES)
		n = GPUD_ALLOC_TRACES;
	for (int i = 0; i < n; i++) {
		if (!atomic_load(&traces[i].done))
			continue;
		dprintf(fd, "host allocation %d after warm-up on a %s thread (%zu bytes), from:\n",
			i + 1, gpud_alloc_role_name(traces[i].role), traces[i].bytes);
		backtrace_symbols_fd(traces[i].pc, traces[i].depth, fd);
	}
	return n;
}

void gpud_alloc__host_alloc(size_t bytes)
{
	enum gpud_alloc_role role = cur_role;
	struct role_counts *r = &host[role];

	atomic_fetch_add_explicit(&r->allocs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->bytes, bytes, memory_order_relaxed);
	if (role != GPUD_ALLOC_FOREIGN && atomic_load_explicit(&warm, memory_order_relaxed))
		trace(role, bytes);
}

void gpud_alloc__host_free(void)
{
	atomic_fetch_add_explicit(&host[cur_role].frees, 1, memory_order_relaxed);
}

void gpud_alloc__set_hooked(bool on)
{
	atomic_store(&hooked, on);
	atomic_store(&linked, true);
}

bool gpud_alloc_hook_linked(void)
{
	return atomic_load(&linked);
}

bool gpud_alloc_hooked(void)
{
	return atomic_load(&hooked);
}

void gpud_alloc_device_note(int dev, size_t bytes)
{
	(void)dev; /* one total for now; per-device counts would grow the struct */
	atomic_fetch_add_explicit(&dev_allocs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&dev_bytes, bytes, memory_order_relaxed);
}

void gpud_alloc_counts(struct gpud_alloc_counts *c)
{
	for (int i = 0; i < GPUD_ALLOC_ROLES; i++) {
		c->host_allocs[i] = atomic_load_explicit(&host[i].allocs, memory_order_relaxed);
		c->host_frees[i] = atomic_load_explicit(&host[i].frees, memory_order_relaxed);
		c->host_bytes[i] = atomic_load_explicit(&host[i].bytes, memory_order_relaxed);
	}
	c->device_allocs = atomic_load_explicit(&dev_allocs, memory_order_relaxed);
	c->device_bytes = atomic_load_explicit(&dev_bytes, memory_order_relaxed);
}

uint64_t gpud_alloc_own_host(const struct gpud_alloc_counts *c)
{
	uint64_t n = 0;

	for (int i = GPUD_ALLOC_OTHER; i < GPUD_ALLOC_ROLES; i++)
		n += c->host_allocs[i];
	return n;
}

uint64_t gpud_alloc_host_allocs(void)
{
	uint64_t n = 0;

	for (int i = 0; i < GPUD_ALLOC_ROLES; i++)
		n += atomic_load_explicit(&host[i].allocs, memory_order_relaxed);
	return n;
}

static void counts_to_array(const struct gpud_alloc_counts *c, uint64_t *a)
{
	for (int i = 0; i < GPUD_ALLOC_ROLES; i++) {
		a[3 * i] = c->host_allocs[i];
		a[3 * i + 1] = c->host_frees[i];
		a[3 * i + 2] = c->host_bytes[i];
	}
	a[3 * GPUD_ALLOC_ROLES] = c->device_allocs;
	a[3 * GPUD_ALLOC_ROLES + 1] = c->device_bytes;
}

void gpud_alloc_warmup_done(void)
{
	struct gpud_alloc_counts c;
	uint64_t a[3 * GPUD_ALLOC_ROLES + 2];

	gpud_alloc_counts(&c);
	counts_to_array(&c, a);
	atomic_fetch_add(&mark_seq, 1); /* odd: being written */
	for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
		atomic_store(&mark[i], a[i]);
	atomic_fetch_add(&mark_seq, 1);
	atomic_store(&warm, true);
}

bool gpud_alloc_warm(void)
{
	return atomic_load(&warm);
}

void gpud_alloc_since_warmup(struct gpud_alloc_counts *c)
{
	uint64_t m[3 * GPUD_ALLOC_ROLES + 2];
	uint64_t now[3 * GPUD_ALLOC_ROLES + 2];
	struct gpud_alloc_counts cur;
	uint64_t seq;

	if (!gpud_alloc_warm()) {
		memset(c, 0, sizeof(*c));
		return;
	}
	do {
		seq = atomic_load(&mark_seq);
		for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
			m[i] = atomic_load(&mark[i]);
	} while ((seq & 1) || seq != atomic_load(&mark_seq));
	gpud_alloc_counts(&cur);
	counts_to_array(&cur, now);
	for (int i = 0; i < GPUD_ALLOC_ROLES; i++) {
		c->host_allocs[i] = now[3 * i] - m[3 * i];
		c->host_frees[i] = now[3 * i + 1] - m[3 * i + 1];
		c->host_bytes[i] = now[3 * i + 2] - m[3 * i + 2];
	}
	c->device_allocs = now[3 * GPUD_ALLOC_ROLES] - m[3 * GPUD_ALLOC_ROLES];
	c->device_bytes = now[3 * GPUD_ALLOC_ROLES + 1] - m[3 * GPUD_ALLOC_ROLES + 1];
}
