/* time.c - clock reads, sleeps and deadline arithmetic. */
#include "common/time.h"

#include <errno.h>
#include <limits.h>

static uint64_t ts_to_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * SW_NS_PER_S + (uint64_t)ts->tv_nsec;
}

static struct timespec ns_to_ts(uint64_t ns)
{
	struct timespec ts;
	uint64_t sec = ns / SW_NS_PER_S;

	/* time_t is 64-bit on every target we build for; clamp regardless. */
	if (sec > (uint64_t)INT64_MAX)
		sec = (uint64_t)INT64_MAX;
	ts.tv_sec = (time_t)sec;
	ts.tv_nsec = (long)(ns % SW_NS_PER_S);
	return ts;
}

uint64_t sw_now_ns(void)
{
	struct timespec ts;

	/* CLOCK_MONOTONIC cannot fail with a valid pointer. */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts_to_ns(&ts);
}

uint64_t sw_now_ms(void)
{
	return sw_now_ns() / SW_NS_PER_MS;
}

uint64_t sw_realtime_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts_to_ns(&ts) / SW_NS_PER_MS;
}

void sw_sleep_until_ns(uint64_t at_ns)
{
	struct timespec ts = ns_to_ts(at_ns);

	/* Absolute sleeps resume correctly after EINTR with the same target. */
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

void sw_sleep_ns(uint64_t ns)
{
	uint64_t now = sw_now_ns();

	sw_sleep_until_ns(ns > UINT64_MAX - now ? UINT64_MAX : now + ns);
}

void sw_sleep_ms(uint64_t ms)
{
	sw_sleep_ns(ms > UINT64_MAX / SW_NS_PER_MS ? UINT64_MAX : ms * SW_NS_PER_MS);
}

struct sw_deadline sw_deadline_in_ns(uint64_t ns)
{
	uint64_t now = sw_now_ns();

	if (ns >= UINT64_MAX - now)
		return SW_DEADLINE_NEVER;
	return (struct sw_deadline){ .at_ns = now + ns };
}

struct sw_deadline sw_deadline_in_ms(uint64_t ms)
{
	if (ms > UINT64_MAX / SW_NS_PER_MS)
		return SW_DEADLINE_NEVER;
	return sw_deadline_in_ns(ms * SW_NS_PER_MS);
}

bool sw_deadline_expired(struct sw_deadline d)
{
	if (sw_deadline_is_never(d))
		return false;
	return sw_now_ns() >= d.at_ns;
}

uint64_t sw_deadline_remaining_ns(struct sw_deadline d)
{
	if (sw_deadline_is_never(d))
		return UINT64_MAX;
	uint64_t now = sw_now_ns();
	return now >= d.at_ns ? 0 : d.at_ns - now;
}

uint64_t sw_deadline_remaining_ms(struct sw_deadline d)
{
	uint64_t ns = sw_deadline_remaining_ns(d);

	if (ns == UINT64_MAX)
		return UINT64_MAX;
	return (ns + SW_NS_PER_MS - 1) / SW_NS_PER_MS;
}

int sw_deadline_poll_ms(struct sw_deadline d)
{
	if (sw_deadline_is_never(d))
		return -1;
	uint64_t ms = sw_deadline_remaining_ms(d);
	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

struct timespec sw_deadline_timespec(struct sw_deadline d)
{
	return ns_to_ts(d.at_ns);
}
