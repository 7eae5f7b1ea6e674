/* alloc_count.c - counting wrappers around glibc's allocator (tests only). */
#include "alloc_count.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_int counting;
static atomic_long n_allocs;

#if ALLOC_COUNT_ENABLED
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static inline void count(void)
{
	if (atomic_load_explicit(&counting, memory_order_relaxed))
		atomic_fetch_add(&n_allocs, 1);
}

void *malloc(size_t n)
{
	count();
	return __libc_malloc(n);
}

void *calloc(size_t a, size_t b)
{
	count();
	return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
	count();
	return __libc_realloc(p, n);
}

void *aligned_alloc(size_t al, size_t n)
{
	count();
	return __libc_memalign(al, n);
}

int posix_memalign(void **p, size_t al, size_t n)
{
	count();
	*p = __libc_memalign(al, n);
	return *p ? 0 : ENOMEM;
}
#endif

int alloc_count_start(void)
{
	atomic_store(&n_allocs, 0);
	atomic_store(&counting, 1);
	if (ALLOC_COUNT_ENABLED) { /* the counter works */
		void *volatile probe = malloc(16);
		free(probe);
		if (atomic_load(&n_allocs) != 1)
			return -1;
		atomic_store(&n_allocs, 0);
	}
	return 0;
}

long alloc_count_stop(void)
{
	atomic_store(&counting, 0);
	return atomic_load(&n_allocs);
}
