/* par.h - a loop's iterations split among threads made for the call.
 *
 * For work done once (a model's rows converted at start-up or by a tool),
 * not for the step path: threads are created and joined per call (tens of
 * microseconds each), nothing else is allocated.
 */
#ifndef SW_PAR_H
#define SW_PAR_H

#include <stdint.h>

#define SW_PAR_MAX 64 /* parts at most */

/* Called once per non-empty part with its half-open range of iterations. */
typedef void (*sw_par_fn)(void *arg, int part, uint64_t begin, uint64_t end);

/* Splits [0, n) into nparts contiguous ranges of ceil(n / nparts)
 * iterations (the last ones shorter or empty) and calls fn for each
 * non-empty one: part 0 on the caller, every other on a thread of its own;
 * returns when all have returned. A thread that cannot be made leaves its
 * part to the caller. nparts is clamped to 1 .. SW_PAR_MAX. */
void sw_par_ranges(uint64_t n, int nparts, sw_par_fn fn, void *arg);

/* The CPUs this process may run on (its affinity mask; the online CPUs
 * when that cannot be read), at least 1 and at most max (when max > 0). */
int sw_par_cpus(int max);

#endif
