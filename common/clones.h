/* clones.h - SW_CLONES("avx2", "default"): the function compiled once per
 * listed target and chosen at load time (GCC's target_clones, an ifunc).
 *
 * Under ThreadSanitizer it is one default version: an ifunc's resolver
 * runs while the dynamic linker relocates the program, before the
 * sanitizer's runtime is up, and its instrumented entry crashes there
 * (before main). The sanitized build is for races, not for speed.
 */
#ifndef SW_CLONES_H
#define SW_CLONES_H

#if defined(__SANITIZE_THREAD__)
#define SW_CLONES(...)
#else
#define SW_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#endif

#endif
