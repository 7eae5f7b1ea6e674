/* alloc_hook.c - feeds the allocation counters (gpud/alloc.h) with every
 * host allocation of the process.
 *
 * Normal builds: this file defines the malloc family. Linked (whole) into
 * an executable, the definitions interpose on glibc's for the whole
 * process, libraries included (glibc calls malloc through the PLT); each
 * wrapper counts in the calling thread's role and forwards to glibc's
 * __libc_* entry points. The wrappers take no lock and never allocate.
 *
 * Sanitizer builds (ASan, TSan): the sanitizer owns malloc; defining it
 * here would hide allocations from it. Instead a constructor installs
 * __sanitizer_install_malloc_and_free_hooks, which the sanitizer calls on
 * every user allocation and free (realloc shows as a malloc and a free).
 * GCC 12's TSan runs no hook for posix_memalign/aligned_alloc/memalign:
 * under TSan those are not counted.
 *
 * valgrind (3.19, checked with --trace-redir=yes): memcheck redirects
 * malloc in libc *and* in the main executable ("REDIR: (NONE:malloc)
 * redirected to ... (malloc)"), so by default these wrappers are never
 * called. The constructor's probe sees that and gpud_alloc_hooked() stays
 * false: "not counted", not "0". With
 * --soname-synonyms=somalloc=nouserintercepts memcheck leaves the
 * executable's malloc alone: the wrappers run, forward to memcheck's
 * __libc_* replacements, and counting works under valgrind too (memcheck's
 * realloc always moves, so it counts as a free and an allocation).
 *
 * In both variants the constructor makes one probe allocation and sets
 * the hooked flag only if the counters moved.
 */
#include "gpud/alloc.h"

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GPUD_ALLOC_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
	__has_feature(memory_sanitizer)
#define GPUD_ALLOC_SANITIZER 1
#endif
#endif

#ifdef GPUD_ALLOC_SANITIZER

/* <sanitizer/allocator_interface.h> is missing from GCC 12's headers;
 * the function is exported by libasan and libtsan. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
					      void (*free_hook)(const volatile void *));

static void on_malloc(const volatile void *p, size_t n)
{
	(void)p;
	gpud_alloc__host_alloc(n);
}

static void on_free(const volatile void *p)
{
	if (p)
		gpud_alloc__host_free();
}

/* The sanitizer returns the hook's slot (1..5), 0 when all are taken. */
static int install(void)
{
	return __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) > 0 ? 0 : -1;
}

#else /* the wrappers */

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

void *malloc(size_t n)
{
	void *p = __libc_malloc(n);

	if (p)
		gpud_alloc__host_alloc(n);
	return p;
}

void *calloc(size_t n, size_t size)
{
	void *p = __libc_calloc(n, size);

	if (p)
		gpud_alloc__host_alloc(n * size); /* no overflow: it succeeded */
	return p;
}

/* Counts when the block moves or grows past its chunk, as a free of the
 * old block and an allocation of the new one, so allocs - frees stays the
 * number of live blocks. Shrinking in place counts nothing. */
void *realloc(void *p, size_t n)
{
	size_t old = p ? malloc_usable_size(p) : 0;
	void *q = __libc_realloc(p, n);

	if (p && n == 0 && !q) { /* glibc: realloc(p, 0) frees p */
		gpud_alloc__host_free();
		return q;
	}
	if (!q)
		return q;
	if (!p) {
		gpud_alloc__host_alloc(n);
	} else if (q != p || n > old) {
		gpud_alloc__host_free();
		gpud_alloc__host_alloc(n);
	}
	return q;
}

void *reallocarray(void *p, size_t n, size_t size)
{
	size_t total;

	if (__builtin_mul_overflow(n, size, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, total);
}

void free(void *p)
{
	if (p)
		gpud_alloc__host_free();
	__libc_free(p);
}

static void *aligned(size_t align, size_t n)
{
	void *p = __libc_memalign(align, n);

	if (p)
		gpud_alloc__host_alloc(n);
	return p;
}

void *memalign(size_t align, size_t n)
{
	return aligned(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
	if (align == 0 || (align & (align - 1))) {
		errno = EINVAL;
		return NULL;
	}
	return aligned(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
	void *p;

	if (align < sizeof(void *) || (align & (align - 1)))
		return EINVAL;
	p = aligned(align, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *valloc(size_t n)
{
	return aligned((size_t)sysconf(_SC_PAGESIZE), n);
}

void *pvalloc(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t r;

	if (__builtin_add_overflow(n, pg - 1, &r)) {
		errno = ENOMEM;
		return NULL;
	}
	return aligned(pg, r & ~(pg - 1));
}

static int install(void)
{
	return 0;
}

#endif

/* Runs before main (and before other constructors: priority 101), so
 * gpud_alloc_hooked() is settled before anyone reads it. */
__attribute__((constructor(101))) static void alloc_hook_init(void)
{
	void *(*volatile get)(size_t) = malloc; /* keep the probe from being elided */
	void (*volatile put)(void *) = free;
	struct gpud_alloc_counts before, after;
	uint64_t a = 0, b = 0;
	void *p;

	/* the main thread is gpud's own (every thread gpud starts names its
	 * role; one that never did is a library's: GPUD_ALLOC_FOREIGN) */
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	if (install() != 0)
		return;
	gpud_alloc_counts(&before);
	p = get(24);
	put(p);
	gpud_alloc_counts(&after);
	for (int i = 0; i < GPUD_ALLOC_ROLES; i++) {
		a += before.host_allocs[i] + before.host_frees[i];
		b += after.host_allocs[i] + after.host_frees[i];
	}
	gpud_alloc__set_hooked(p && b >= a + 2);
}
