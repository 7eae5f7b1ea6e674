/* time_test.c - clocks, sleeps (lower bounds only) and deadlines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <cmocka.h>

#include "common/time.h"

static void test_monotonic(void **state)
{
	(void)state;
	uint64_t prev = sw_now_ns();
	for (int i = 0; i < 1000; i++) {
		uint64_t now = sw_now_ns();
		assert_true(now >= prev);
		prev = now;
	}
	uint64_t ns = sw_now_ns();
	uint64_t ms = sw_now_ms();
	assert_true(ms >= ns / SW_NS_PER_MS);
	assert_true(sw_now_ns() / SW_NS_PER_MS >= ms);
}

/* Bounds from CLOCK_REALTIME itself: time(NULL) reads the coarse clock,
 * which can lag a few ms behind, so a read just past a second boundary
 * fell outside [time(NULL), time(NULL) + 1) now and then. */
static uint64_t realtime_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void test_realtime(void **state)
{
	(void)state;
	uint64_t before = realtime_ms();
	uint64_t rt = sw_realtime_ms();
	uint64_t after = realtime_ms();
	assert_true(rt >= before && rt <= after);
}

/* A sleep must last at least as long as asked (no upper bound: the
 * machine may be loaded). */
static void test_sleep_lower_bound(void **state)
{
	(void)state;
	uint64_t t0 = sw_now_ns();
	sw_sleep_ms(5);
	assert_true(sw_now_ns() - t0 >= 5 * SW_NS_PER_MS);

	t0 = sw_now_ns();
	sw_sleep_ns(1000000);
	assert_true(sw_now_ns() - t0 >= 1000000);

	/* A target in the past returns at once, and so does 0. */
	sw_sleep_until_ns(0);
	sw_sleep_ns(0);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/* Signals (EINTR) must not cut a sleep short. */
static void test_sleep_survives_signals(void **state)
{
	(void)state;
	struct sigaction sa, old;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm; /* no SA_RESTART: the sleep sees EINTR */
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);

	struct itimerval it = { .it_interval = { 0, 2000 }, .it_value = { 0, 2000 } };
	assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
	alarms = 0;
	uint64_t t0 = sw_now_ns();
	sw_sleep_ms(30);
	uint64_t took = sw_now_ns() - t0;
	struct itimerval off = { 0 };
	setitimer(ITIMER_REAL, &off, NULL);
	sigaction(SIGALRM, &old, NULL);

	assert_true(took >= 30 * SW_NS_PER_MS);
	assert_true(alarms > 0); /* the signals really arrived */
}

static void test_deadline_basic(void **state)
{
	(void)state;
	struct sw_deadline past = sw_deadline_in_ms(0);
	assert_true(sw_deadline_expired(past));
	assert_int_equal(sw_deadline_remaining_ns(past), 0);
	assert_int_equal(sw_deadline_remaining_ms(past), 0);
	assert_int_equal(sw_deadline_poll_ms(past), 0);

	struct sw_deadline soon = sw_deadline_in_ms(60000);
	assert_false(sw_deadline_expired(soon));
	assert_false(sw_deadline_is_never(soon));
	uint64_t left = sw_deadline_remaining_ms(soon);
	assert_true(left > 0 && left <= 60000);
	int p = sw_deadline_poll_ms(soon);
	assert_true(p > 0 && p <= 60000);

	struct sw_deadline d = sw_deadline_in_ms(3);
	sw_sleep_ms(3);
	assert_true(sw_deadline_expired(d));
}

static void test_deadline_never(void **state)
{
	(void)state;
	struct sw_deadline n = SW_DEADLINE_NEVER;
	assert_true(sw_deadline_is_never(n));
	assert_false(sw_deadline_expired(n));
	assert_true(sw_deadline_remaining_ns(n) == UINT64_MAX);
	assert_true(sw_deadline_remaining_ms(n) == UINT64_MAX);
	assert_int_equal(sw_deadline_poll_ms(n), -1);

	/* Huge timeouts saturate to NEVER instead of wrapping into the past. */
	assert_true(sw_deadline_is_never(sw_deadline_in_ms(UINT64_MAX)));
	assert_true(sw_deadline_is_never(sw_deadline_in_ns(UINT64_MAX)));
	assert_true(sw_deadline_is_never(sw_deadline_in_ms(UINT64_MAX / 1000)));

	/* Far but finite: poll timeout clamps to INT32_MAX. */
	struct sw_deadline far = sw_deadline_in_ms((uint64_t)INT32_MAX * 4);
	assert_false(sw_deadline_is_never(far));
	assert_int_equal(sw_deadline_poll_ms(far), INT32_MAX);
}

static void test_deadline_min_and_timespec(void **state)
{
	(void)state;
	struct sw_deadline a = { .at_ns = 5 * SW_NS_PER_S + 7 };
	struct sw_deadline b = { .at_ns = 9 * SW_NS_PER_S };
	assert_true(sw_deadline_min(a, b).at_ns == a.at_ns);
	assert_true(sw_deadline_min(b, a).at_ns == a.at_ns);
	assert_true(sw_deadline_min(SW_DEADLINE_NEVER, b).at_ns == b.at_ns);

	struct timespec ts = sw_deadline_timespec(a);
	assert_int_equal(ts.tv_sec, 5);
	assert_int_equal(ts.tv_nsec, 7);
	ts = sw_deadline_timespec(SW_DEADLINE_NEVER);
	assert_true(ts.tv_sec > 0); /* far future, not negative */
	assert_true(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);

	/* remaining_ms rounds up: a caller never wakes before the deadline. */
	struct sw_deadline d = sw_deadline_in_ns(SW_NS_PER_S + 1);
	assert_true(sw_deadline_remaining_ms(d) * SW_NS_PER_MS >= sw_deadline_remaining_ns(d));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_monotonic),
		cmocka_unit_test(test_realtime),
		cmocka_unit_test(test_sleep_lower_bound),
		cmocka_unit_test(test_sleep_survives_signals),
		cmocka_unit_test(test_deadline_basic),
		cmocka_unit_test(test_deadline_never),
		cmocka_unit_test(test_deadline_min_and_timespec),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
