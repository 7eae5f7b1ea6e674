/* time.h - monotonic clock helpers, sleeps and deadlines.
 *
 * Everything that measures an interval or a timeout uses CLOCK_MONOTONIC,
 * which never jumps when the wall clock is set; realtime is only for
 * timestamps shown to people or stored in databases.
 */
#ifndef SW_TIME_H
#define SW_TIME_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define SW_NS_PER_MS 1000000ULL
#define SW_NS_PER_S 1000000000ULL

/* Monotonic time in nanoseconds / milliseconds since an arbitrary origin
 * (boot). Never fails, never goes backwards. */
uint64_t sw_now_ns(void);
uint64_t sw_now_ms(void);

/* Wall-clock time in milliseconds since the Unix epoch. */
uint64_t sw_realtime_ms(void);

/* Sleep for at least ns / ms, resuming after signals. */
void sw_sleep_ns(uint64_t ns);
void sw_sleep_ms(uint64_t ms);

/* Sleep until the monotonic clock reads at least at_ns; returns at once if
 * that time has passed. Resumes after signals. */
void sw_sleep_until_ns(uint64_t at_ns);

/* A point on the monotonic clock after which an operation gives up.
 * SW_DEADLINE_NEVER (at_ns == UINT64_MAX) never expires. Plain value type:
 * copy it freely. */
struct sw_deadline {
	uint64_t at_ns;
};

#define SW_DEADLINE_NEVER ((struct sw_deadline){ .at_ns = UINT64_MAX })

/* A deadline ms (or ns) from now; saturates at NEVER instead of wrapping. */
struct sw_deadline sw_deadline_in_ms(uint64_t ms);
struct sw_deadline sw_deadline_in_ns(uint64_t ns);

static inline bool sw_deadline_is_never(struct sw_deadline d)
{
	return d.at_ns == UINT64_MAX;
}

/* True once the monotonic clock has reached the deadline. */
bool sw_deadline_expired(struct sw_deadline d);

/* Time left: 0 once expired, UINT64_MAX for NEVER. The ms variant rounds
 * up, so a caller that waits the returned time never wakes early. */
uint64_t sw_deadline_remaining_ns(struct sw_deadline d);
uint64_t sw_deadline_remaining_ms(struct sw_deadline d);

/* Timeout argument for poll(2)/epoll_wait(2): -1 for NEVER, else the
 * remaining ms rounded up and clamped to INT32_MAX. */
int sw_deadline_poll_ms(struct sw_deadline d);

/* The deadline as an absolute CLOCK_MONOTONIC timespec, for
 * pthread_cond_timedwait on a condition whose attr uses CLOCK_MONOTONIC
 * or for clock_nanosleep(TIMER_ABSTIME). NEVER maps to the largest
 * representable time. */
struct timespec sw_deadline_timespec(struct sw_deadline d);

/* Earlier of two deadlines. */
static inline struct sw_deadline sw_deadline_min(struct sw_deadline a, struct sw_deadline b)
{
	return a.at_ns <= b.at_ns ? a : b;
}

#endif
