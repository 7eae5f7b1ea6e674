/* alloc_test.c - allocation accounting with the hook linked in: every
 * malloc-family call counted in the calling thread's role, sizes, frees,
 * realloc's rules, per-thread roles, the warm-up mark, device notes, the
 * all-threads total that tests and benchmarks read around a region.
 * Under valgrind the wrappers are bypassed (see gpud/alloc_hook.c): the
 * test then checks that hooked() says so and that nothing is counted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpud/alloc.h"

/* The compiler may elide a malloc/free pair it can see; call through
 * volatile pointers so every call reaches the allocator. */
static void *(*volatile v_malloc)(size_t) = malloc;
static void *(*volatile v_calloc)(size_t, size_t) = calloc;
static void *(*volatile v_realloc)(void *, size_t) = realloc;
static void (*volatile v_free)(void *) = free;
static int (*volatile v_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static void *(*volatile v_aligned_alloc)(size_t, size_t) = aligned_alloc;
static void *(*volatile v_memalign)(size_t, size_t) = memalign;
static void *(*volatile v_valloc)(size_t) = valloc;

/* ASan aborts on invalid alignments and absurd sizes instead of failing
 * the call: those error paths are checked in the other builds only. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
/* GCC 12's TSan runs no malloc hook for the aligned family and answers
 * realloc(p, 0) with a new block: those counts are not asserted there. */
#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#else
#define TSAN 0
#endif

static bool under_valgrind(void)
{
	const char *p = getenv("LD_PRELOAD");

	return p && strstr(p, "valgrind");
}

static struct gpud_alloc_counts counts(void)
{
	struct gpud_alloc_counts c;

	gpud_alloc_counts(&c);
	return c;
}

#define D_ALLOCS(a, b, r) ((b).host_allocs[r] - (a).host_allocs[r])
#define D_FREES(a, b, r) ((b).host_frees[r] - (a).host_frees[r])
#define D_BYTES(a, b, r) ((b).host_bytes[r] - (a).host_bytes[r])

/* hooked() says exactly whether allocations move the counters. Under
 * valgrind that depends on the command line: memcheck redirects the
 * executable's malloc to its own by default (hooked false, nothing
 * counted); with --soname-synonyms=somalloc=nouserintercepts our wrappers
 * run and forward to memcheck's __libc_* (hooked true, counted). */
static void test_hooked(void **state)
{
	struct gpud_alloc_counts a, b;
	uint64_t sa = 0, sb = 0;
	void *p;

	(void)state;
	gpud_alloc_counts(&a);
	p = v_malloc(8);
	v_free(p);
	gpud_alloc_counts(&b);
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++) {
		sa += a.host_allocs[r] + a.host_frees[r];
		sb += b.host_allocs[r] + b.host_frees[r];
	}
	if (gpud_alloc_hooked())
		assert_int_equal(sb - sa, 2);
	else
		assert_int_equal(sb, 0); /* never counted anything */
	if (!under_valgrind())
		assert_true(gpud_alloc_hooked());
}

static void test_each_call_counted(void **state)
{
	struct gpud_alloc_counts a, b;
	void *p, *q;
	int r = GPUD_ALLOC_OTHER;

	(void)state;
	if (!gpud_alloc_hooked())
		skip();
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);

	a = counts();
	p = v_malloc(100);
	b = counts();
	assert_non_null(p);
	assert_int_equal(D_ALLOCS(a, b, r), 1);
	assert_int_equal(D_BYTES(a, b, r), 100);
	assert_int_equal(D_FREES(a, b, r), 0);
	a = counts();
	v_free(p);
	b = counts();
	assert_int_equal(D_ALLOCS(a, b, r), 0);
	assert_int_equal(D_FREES(a, b, r), 1);

	a = counts();
	v_free(NULL);
	b = counts();
	assert_int_equal(D_FREES(a, b, r), 0);

	a = counts();
	p = v_calloc(7, 9);
	b = counts();
	assert_non_null(p);
	assert_int_equal(D_ALLOCS(a, b, r), 1);
	assert_int_equal(D_BYTES(a, b, r), 63);
	v_free(p);

	if (TSAN)
		return;
	a = counts();
	assert_int_equal(v_posix_memalign(&p, 64, 200), 0);
	b = counts();
	assert_int_equal((uintptr_t)p % 64, 0);
	assert_int_equal(D_ALLOCS(a, b, r), 1);
	assert_int_equal(D_BYTES(a, b, r), 200);
	v_free(p);

	if (!SANITIZED) {
		a = counts();
		q = (void *)0x1;
		assert_int_equal(v_posix_memalign(&q, 3, 200), EINVAL);
		errno = 0;
		assert_null(v_aligned_alloc(24, 48));
		assert_int_equal(errno, EINVAL);
		b = counts();
		assert_ptr_equal(q, (void *)0x1); /* untouched on error */
		assert_int_equal(D_ALLOCS(a, b, r), 0);
	}

	a = counts();
	p = v_aligned_alloc(128, 256);
	b = counts();
	assert_non_null(p);
	assert_int_equal((uintptr_t)p % 128, 0);
	assert_int_equal(D_ALLOCS(a, b, r), 1);
	assert_int_equal(D_BYTES(a, b, r), 256);
	v_free(p);

	a = counts();
	p = v_memalign(32, 40);
	q = v_valloc(10);
	b = counts();
	assert_non_null(p);
	assert_non_null(q);
	assert_int_equal((uintptr_t)q % 4096, 0);
	assert_int_equal(D_ALLOCS(a, b, r), 2);
	assert_int_equal(D_BYTES(a, b, r), 50);
	v_free(p);
	v_free(q);

	/* a failed allocation counts nothing */
	if (!SANITIZED) {
		a = counts();
		p = v_malloc(SIZE_MAX / 2);
		q = v_calloc(SIZE_MAX / 4, 8);
		b = counts();
		assert_null(p);
		assert_null(q);
		assert_int_equal(D_ALLOCS(a, b, r), 0);
	}
}

static void test_realloc_rules(void **state)
{
	struct gpud_alloc_counts a, b;
	int r = GPUD_ALLOC_OTHER;
	char *p, *q;

	(void)state;
	if (!gpud_alloc_hooked())
		skip();
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);

	a = counts();
	p = v_realloc(NULL, 64); /* = malloc */
	b = counts();
	assert_non_null(p);
	assert_int_equal(D_ALLOCS(a, b, r), 1);
	assert_int_equal(D_BYTES(a, b, r), 64);
	assert_int_equal(D_FREES(a, b, r), 0);
	memset(p, 'x', 64);

	a = counts();
	q = v_realloc(p, 16);
	b = counts();
	assert_non_null(q);
	if (!SANITIZED && !under_valgrind()) /* glibc shrinks in place */
		assert_ptr_equal(q, p);
	if (q != p) { /* ASan's and memcheck's realloc always move: a malloc and a free */
		assert_int_equal(D_ALLOCS(a, b, r), 1);
		assert_int_equal(D_FREES(a, b, r), 1);
	} else { /* in place: nothing counted */
		assert_int_equal(D_ALLOCS(a, b, r), 0);
		assert_int_equal(D_FREES(a, b, r), 0);
	}
	p = q;

	a = counts();
	q = v_realloc(p, 1 << 20); /* grows past the chunk: free + alloc */
	b = counts();
	assert_non_null(q);
	assert_int_equal(q[0], 'x');
	assert_int_equal(D_ALLOCS(a, b, r), 1);
	assert_int_equal(D_FREES(a, b, r), 1);
	assert_int_equal(D_BYTES(a, b, r), 1 << 20);
	p = q;

	a = counts();
	q = v_realloc(p, 0); /* glibc frees */
	b = counts();
	if (q) { /* TSan (and other libcs) return a minimal block */
		assert_true(D_ALLOCS(a, b, r) <= 1);
		v_free(q);
	} else {
		assert_int_equal(D_FREES(a, b, r), 1);
		if (!TSAN)
			assert_int_equal(D_ALLOCS(a, b, r), 0);
	}
}

struct role_job {
	enum gpud_alloc_role role;
	int n;
	enum gpud_alloc_role seen;
};

static void *role_thread(void *arg)
{
	struct role_job *j = arg;

	j->seen = gpud_alloc_role(); /* a new thread starts as FOREIGN */
	if (j->role != GPUD_ALLOC_FOREIGN) /* a library's thread names none */
		gpud_alloc_set_role(j->role);
	for (int i = 0; i < j->n; i++)
		v_free(v_malloc(32));
	return NULL;
}

static void test_roles_per_thread(void **state)
{
	struct role_job jobs[3] = {
		{ .role = GPUD_ALLOC_DEVICE, .n = 1000, .seen = GPUD_ALLOC_ROLES },
		{ .role = GPUD_ALLOC_LOOP, .n = 300, .seen = GPUD_ALLOC_ROLES },
		{ .role = GPUD_ALLOC_FOREIGN, .n = 50, .seen = GPUD_ALLOC_ROLES },
	};
	struct gpud_alloc_counts a, b;
	pthread_t t[3];

	(void)state;
	if (!gpud_alloc_hooked())
		skip();
	gpud_alloc_set_role(GPUD_ALLOC_LOOP);
	assert_int_equal(gpud_alloc_role(), GPUD_ALLOC_LOOP);
	/* pthread_create allocates (the stack, in the creator's role); count
	 * from after both threads exist, the jobs wait for nothing else */
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	a = counts();
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&t[i], NULL, role_thread, &jobs[i]), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	b = counts();
	for (int i = 0; i < 3; i++)
		assert_int_equal(jobs[i].seen, GPUD_ALLOC_FOREIGN);
	/* the thread that never named a role (as the CUDA driver's own do):
	 * foreign, and not in the count gpud answers for */
	assert_true(D_ALLOCS(a, b, GPUD_ALLOC_FOREIGN) >= 50);
	assert_true(D_ALLOCS(a, b, GPUD_ALLOC_FOREIGN) <= 60);
	assert_int_equal(gpud_alloc_own_host(&b) - gpud_alloc_own_host(&a),
			 D_ALLOCS(a, b, GPUD_ALLOC_OTHER) + D_ALLOCS(a, b, GPUD_ALLOC_LOOP) +
			 D_ALLOCS(a, b, GPUD_ALLOC_DEVICE));
	assert_int_equal(D_ALLOCS(a, b, GPUD_ALLOC_DEVICE), 1000);
	assert_int_equal(D_FREES(a, b, GPUD_ALLOC_DEVICE), 1000);
	assert_int_equal(D_BYTES(a, b, GPUD_ALLOC_DEVICE), 32000);
	/* the loop thread allocated 300 blocks (and maybe its TLS/exit
	 * bookkeeping in libc, which runs in its role: at least 300) */
	assert_true(D_ALLOCS(a, b, GPUD_ALLOC_LOOP) >= 300);
	assert_true(D_ALLOCS(a, b, GPUD_ALLOC_LOOP) <= 310);
	assert_int_equal(gpud_alloc_role(), GPUD_ALLOC_OTHER); /* ours untouched */

	/* an out-of-range role falls back to OTHER, and so does FOREIGN: a
	 * thread that names a role is gpud's */
	gpud_alloc_set_role((enum gpud_alloc_role)7);
	assert_int_equal(gpud_alloc_role(), GPUD_ALLOC_OTHER);
	gpud_alloc_set_role(GPUD_ALLOC_FOREIGN);
	assert_int_equal(gpud_alloc_role(), GPUD_ALLOC_OTHER);
}

static void test_warmup_and_device(void **state)
{
	struct gpud_alloc_counts s, t0, t1;
	void *p;

	(void)state;
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	/* before the mark: all zero even though the process allocated */
	assert_false(gpud_alloc_warm());
	memset(&s, 0xff, sizeof(s));
	gpud_alloc_since_warmup(&s);
	for (int i = 0; i < GPUD_ALLOC_ROLES; i++) {
		assert_int_equal(s.host_allocs[i], 0);
		assert_int_equal(s.host_frees[i], 0);
		assert_int_equal(s.host_bytes[i], 0);
	}
	assert_int_equal(s.device_allocs, 0);

	gpud_alloc_device_note(0, 1000);
	gpud_alloc_warmup_done();
	assert_true(gpud_alloc_warm());
	gpud_alloc_since_warmup(&s);
	assert_int_equal(s.device_allocs, 0);
	assert_int_equal(s.host_allocs[GPUD_ALLOC_DEVICE], 0);

	gpud_alloc_device_note(1, 4096);
	gpud_alloc_device_note(0, 10);
	gpud_alloc_counts(&t0);
	assert_true(t0.device_allocs >= 3);
	gpud_alloc_set_role(GPUD_ALLOC_DEVICE);
	p = v_malloc(77);
	v_free(p);
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	gpud_alloc_since_warmup(&s);
	assert_int_equal(s.device_allocs, 2);
	assert_int_equal(s.device_bytes, 4106);
	if (gpud_alloc_hooked()) {
		assert_int_equal(s.host_allocs[GPUD_ALLOC_DEVICE], 1);
		assert_int_equal(s.host_frees[GPUD_ALLOC_DEVICE], 1);
		assert_int_equal(s.host_bytes[GPUD_ALLOC_DEVICE], 77);
	} else {
		assert_int_equal(s.host_allocs[GPUD_ALLOC_DEVICE], 0);
	}

	/* moving the mark starts over */
	gpud_alloc_warmup_done();
	gpud_alloc_since_warmup(&s);
	assert_int_equal(s.device_allocs, 0);
	assert_int_equal(s.host_allocs[GPUD_ALLOC_DEVICE], 0);
	gpud_alloc_counts(&t1);
	assert_int_equal(t1.device_allocs, t0.device_allocs);
}

static void *alloc_in_thread(void *arg)
{
	gpud_alloc_set_role(*(enum gpud_alloc_role *)arg);
	return v_malloc(40);
}

/* What the zero-allocation tests and bench_tokenizer read around a
 * region: allocations of every role and thread, frees not included. */
static void test_host_allocs_region(void **state)
{
	enum gpud_alloc_role roles[2] = { GPUD_ALLOC_LOOP, GPUD_ALLOC_DEVICE };
	struct gpud_alloc_counts c;
	uint64_t a, b, sum = 0;
	void *p[3];

	(void)state;
	assert_true(gpud_alloc_hook_linked());
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	a = gpud_alloc_host_allocs();
	gpud_alloc_counts(&c);
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++)
		sum += c.host_allocs[r];
	assert_true(sum >= a); /* read after it */
	if (gpud_alloc_hooked())
		assert_true(a > 0); /* at least the probe */
	b = gpud_alloc_host_allocs();
	assert_int_equal(b - a, 0); /* a region that allocates nothing */

	p[0] = v_malloc(8);
	for (int i = 0; i < 2; i++) {
		pthread_t th;

		assert_int_equal(pthread_create(&th, NULL, alloc_in_thread, &roles[i]), 0);
		assert_int_equal(pthread_join(th, &p[1 + i]), 0);
	}
	b = gpud_alloc_host_allocs();
	for (int i = 0; i < 3; i++)
		v_free(p[i]);
	assert_int_equal(gpud_alloc_host_allocs(), b); /* frees are not allocations */
	if (gpud_alloc_hooked())
		assert_true(b - a >= 3); /* ours, the threads' (and pthread's own) */
	else
		assert_int_equal(b, 0);
}

static void *foreign_thread(void *arg)
{
	(void)arg;
	free(v_malloc(55)); /* names no role: a library's thread */
	return NULL;
}

/* After warm-up, armed: an allocation by one of gpud's threads keeps its
 * stack, written (without allocating) at exit; a foreign thread's does
 * not. */
static void test_traces(void **state)
{
	char text[8192];
	pthread_t t;
	FILE *f;
	size_t n;
	void *p;

	(void)state;
	if (!gpud_alloc_hooked())
		skip();
	if (!gpud_alloc_warm())
		gpud_alloc_warmup_done();
	gpud_alloc_traces_arm();
	gpud_alloc_set_role(GPUD_ALLOC_DEVICE);
	p = v_malloc(77); /* the first after arming */
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	free(p);
	assert_int_equal(pthread_create(&t, NULL, foreign_thread, NULL), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	f = tmpfile(); /* allocates too (a trace of its own, up to 4) */
	assert_non_null(f);
	assert_true(gpud_alloc_traces_write(fileno(f)) >= 1);
	rewind(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = 0;
	fclose(f);
	assert_non_null(strstr(text, "host allocation 1 after warm-up on a device thread "
				     "(77 bytes), from:\n"));
	assert_non_null(strstr(text, "alloc_test")); /* the frames: this executable's */
	assert_null(strstr(text, "(55 bytes)"));
}

static void test_role_names(void **state)
{
	(void)state;
	assert_string_equal(gpud_alloc_role_name(GPUD_ALLOC_FOREIGN), "foreign");
	assert_string_equal(gpud_alloc_role_name(GPUD_ALLOC_OTHER), "other");
	assert_string_equal(gpud_alloc_role_name(GPUD_ALLOC_LOOP), "loop");
	assert_string_equal(gpud_alloc_role_name(GPUD_ALLOC_DEVICE), "device");
	assert_string_equal(gpud_alloc_role_name(GPUD_ALLOC_ROLES), "?");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hooked),
		cmocka_unit_test(test_each_call_counted),
		cmocka_unit_test(test_realloc_rules),
		cmocka_unit_test(test_roles_per_thread),
		cmocka_unit_test(test_warmup_and_device),
		cmocka_unit_test(test_host_allocs_region),
		cmocka_unit_test(test_traces),
		cmocka_unit_test(test_role_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
