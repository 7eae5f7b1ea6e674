/* alloc_count.h - counts real heap allocations of the test process.
 *
 * Linking alloc_count.c into a test replaces malloc, calloc, realloc,
 * aligned_alloc and posix_memalign with wrappers around glibc's that count
 * calls between alloc_count_start() and alloc_count_stop(), so "no
 * allocation on the step path" is checked on the whole process, not on a
 * module's own counter. Under AddressSanitizer (which owns malloc) nothing
 * is replaced, ALLOC_COUNT_ENABLED is 0 and the count stays 0.
 */
#ifndef SW_TEST_ALLOC_COUNT_H
#define SW_TEST_ALLOC_COUNT_H

#if defined(__SANITIZE_ADDRESS__)
#define ALLOC_COUNT_ENABLED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ALLOC_COUNT_ENABLED 0
#endif
#endif
#ifndef ALLOC_COUNT_ENABLED
#define ALLOC_COUNT_ENABLED 1
#endif

/* Resets the count to 0 and starts counting (all threads). Returns 0, or
 * -1 when the wrappers are enabled but failed to count a probe malloc. */
int alloc_count_start(void);

/* Stops counting and returns the allocations made since the start. */
long alloc_count_stop(void);

#endif
