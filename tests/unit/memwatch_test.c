/* memwatch_test.c - trough watchdog: flat use, sawtooth back to the same
 * low, a slowly rising trough under a sawtooth, recovery and a second
 * episode, the threshold rule, one load step against a leak (min_steps),
 * a pool's own min_steps (a population that joins in steps),
 * clock steps back, gaps, many pools, the
 * JSON report and its truncation; pools a cache shares: a cache filling
 * to its bound raises nothing, a leak behind a full cache is reported.
 * Time is simulated: no sleeping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/memwatch.h"

#define WIN 1000 /* ms */
#define K 4

static struct gpud_memwatch *make(uint32_t max_pools, double frac)
{
	struct gpud_memwatch_params p = {
		.max_pools = max_pools, .window_ms = WIN, .k = K, .min_rise = 0,
		.rise_fraction = frac,
	};
	struct gpud_memwatch *w = NULL;

	assert_int_equal(gpud_memwatch_create(&w, &p), 0);
	assert_non_null(w);
	return w;
}

static struct gpud_memwatch_status status(struct gpud_memwatch *w, int id)
{
	struct gpud_memwatch_status st;

	assert_int_equal(gpud_memwatch_status(w, id, &st), 0);
	return st;
}

/* Ten samples per window: a sawtooth from low up to peak and back. */
static void saw_window(struct gpud_memwatch *w, int id, uint64_t win, uint64_t low,
		       uint64_t peak)
{
	for (uint64_t i = 0; i < 10; i++) {
		uint64_t tooth = i < 5 ? i : 10 - i; /* 0 1 2 3 4 5 4 3 2 1 */
		uint64_t used = low + (peak - low) * tooth / 5;

		if (i == 0)
			used = low;
		assert_int_equal(gpud_memwatch_sample(w, id, win * WIN + i * 100, used), 0);
	}
}

static void test_params_and_register(void **state)
{
	(void)state;
	struct gpud_memwatch_params ok = { .max_pools = 2, .window_ms = 10, .k = 2 };
	struct gpud_memwatch_params p;
	struct gpud_memwatch *w = (struct gpud_memwatch *)0x1;
	struct gpud_memwatch_status st;
	char name[64];

	assert_int_equal(gpud_memwatch_create(NULL, &ok), -EINVAL);
	assert_int_equal(gpud_memwatch_create(&w, NULL), -EINVAL);
	p = ok; p.max_pools = 0;
	assert_int_equal(gpud_memwatch_create(&w, &p), -EINVAL);
	p = ok; p.window_ms = 0;
	assert_int_equal(gpud_memwatch_create(&w, &p), -EINVAL);
	p = ok; p.k = 1;
	assert_int_equal(gpud_memwatch_create(&w, &p), -EINVAL);
	p = ok; p.k = GPUD_MEMWATCH_MAX_K + 1;
	assert_int_equal(gpud_memwatch_create(&w, &p), -EINVAL);
	p = ok; p.rise_fraction = -0.1;
	assert_int_equal(gpud_memwatch_create(&w, &p), -EINVAL);
	p = ok; p.rise_fraction = 1.5;
	assert_int_equal(gpud_memwatch_create(&w, &p), -EINVAL);
	assert_ptr_equal(w, (struct gpud_memwatch *)0x1);
	gpud_memwatch_destroy(NULL);

	assert_int_equal(gpud_memwatch_create(&w, &ok), 0);
	assert_int_equal(gpud_memwatch_register(w, "", 10), -EINVAL);
	assert_int_equal(gpud_memwatch_register(w, NULL, 10), -EINVAL);
	assert_int_equal(gpud_memwatch_register(w, "a\"b", 10), -EINVAL);
	assert_int_equal(gpud_memwatch_register(w, "a b", 10), -EINVAL);
	memset(name, 'x', sizeof(name));
	name[GPUD_MEMWATCH_NAME_MAX + 1] = '\0';
	assert_int_equal(gpud_memwatch_register(w, name, 10), -EINVAL);
	name[GPUD_MEMWATCH_NAME_MAX] = '\0';
	assert_int_equal(gpud_memwatch_register(w, "kv", 0), -EINVAL);
	assert_int_equal(gpud_memwatch_register(w, "kv", 10), 0);
	assert_int_equal(gpud_memwatch_register(w, "kv", 10), -EEXIST);
	assert_int_equal(gpud_memwatch_register(w, name, 10), 1); /* longest name */
	assert_int_equal(gpud_memwatch_register(w, "mask", 10), SW_EEXHAUSTED);
	assert_int_equal(gpud_memwatch_count(w), 2);

	assert_int_equal(gpud_memwatch_sample(w, 2, 0, 1), -EINVAL);
	assert_int_equal(gpud_memwatch_sample(w, -1, 0, 1), -EINVAL);
	assert_int_equal(gpud_memwatch_sample(w, 0, 0, 11), -EINVAL); /* over capacity */
	assert_int_equal(gpud_memwatch_status(w, 2, &st), -EINVAL);
	assert_int_equal(gpud_memwatch_status(w, 0, NULL), -EINVAL);
	st = status(w, 0);
	assert_string_equal(st.name, "kv");
	assert_int_equal(st.samples, 0);
	assert_false(st.rising);
	assert_string_equal(st.warning, "");
	assert_int_equal(gpud_memwatch_report(w, NULL, 10), -EINVAL);
	gpud_memwatch_destroy(w);
}

static void test_flat(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(1, 0.05);
	int id = gpud_memwatch_register(w, "kv", 1000);
	struct gpud_memwatch_status st;

	for (uint64_t t = 0; t < 30 * WIN; t += 50)
		assert_int_equal(gpud_memwatch_sample(w, id, t, 300), 0);
	st = status(w, id);
	assert_false(st.rising);
	assert_int_equal(st.episodes, 0);
	assert_int_equal(st.current, 300);
	assert_int_equal(st.high, 300);
	assert_int_equal(st.trough, 300);
	assert_int_equal(st.trough_k_ago, 300);
	assert_int_equal(st.windows, K);
	assert_int_equal(st.samples, 30 * WIN / 50);
	assert_false(gpud_memwatch_any_rising(w));
	gpud_memwatch_destroy(w);
}

static void test_sawtooth_same_low(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(1, 0.05);
	int id = gpud_memwatch_register(w, "kv", 1000);
	struct gpud_memwatch_status st;

	/* Peaks grow to nearly the whole pool, but every window returns to 10. */
	for (uint64_t win = 0; win < 20; win++)
		saw_window(w, id, win, 10, 100 + 40 * win);
	st = status(w, id);
	assert_false(st.rising);
	assert_int_equal(st.episodes, 0);
	assert_int_equal(st.high, 100 + 40 * 19);
	assert_int_equal(st.trough_k_ago, 10);
	assert_int_equal(st.trough, 10);
	gpud_memwatch_destroy(w);
}

static void test_rising_then_recovery(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(1, 0); /* monotonic rule only */
	int id = gpud_memwatch_register(w, "kv", 1000);
	struct gpud_memwatch_status st;
	uint64_t win = 0;

	/* The low creeps up by 5 per window under a large sawtooth. Windows
	 * 0..K-1 fill the ring; the close of window K-1 (at the first sample
	 * of window K) is the first moment K troughs exist. */
	for (; win < K; win++) {
		saw_window(w, id, win, 10 + 5 * win, 900);
		st = status(w, id);
		assert_false(st.rising);
		assert_int_equal(st.windows, win);
	}
	saw_window(w, id, win, 10 + 5 * win, 900);
	st = status(w, id);
	assert_true(st.rising);
	assert_int_equal(st.episodes, 1);
	assert_int_equal(st.trough_k_ago, 10);
	assert_non_null(strstr(st.warning, "pool kv: trough rose from 10 to 25 of 1000"));
	assert_true(gpud_memwatch_any_rising(w));

	/* Still rising: the same episode, no second warning. */
	for (win++; win < 10; win++)
		saw_window(w, id, win, 10 + 5 * win, 900);
	st = status(w, id);
	assert_true(st.rising);
	assert_int_equal(st.episodes, 1);

	/* The low returns to 10: the next window close clears the flag. */
	saw_window(w, id, win++, 10, 900);
	saw_window(w, id, win++, 10, 900);
	st = status(w, id);
	assert_false(st.rising);
	assert_string_equal(st.warning, "");
	assert_int_equal(st.episodes, 1);

	/* A new creep is a new episode. */
	for (uint64_t i = 1; i <= K + 1; i++)
		saw_window(w, id, win++, 10 + 3 * i, 900);
	st = status(w, id);
	assert_true(st.rising);
	assert_int_equal(st.episodes, 2);
	gpud_memwatch_destroy(w);
}

/* A pool a cache shares: the cache's part is recorded beside the live
 * part, bounded only by the pool; the arguments are checked. */
static void test_split_params(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(3, 0);
	struct gpud_memwatch_status st;
	char buf[1024];

	assert_int_equal(gpud_memwatch_register_cached(w, "kv", 100, 101), -EINVAL);
	assert_int_equal(gpud_memwatch_register_cached(w, "kv", 0, 0), -EINVAL);
	assert_int_equal(gpud_memwatch_register_cached(NULL, "kv", 100, 10), -EINVAL);
	assert_int_equal(gpud_memwatch_register_cached(w, "kv", 100, 60), 0);
	assert_int_equal(gpud_memwatch_register_cached(w, "kv", 100, 60), -EEXIST);
	assert_int_equal(gpud_memwatch_register_cached(w, "plain", 100, 0), 1);
	st = status(w, 0);
	assert_int_equal(st.cache_bound, 60);
	assert_int_equal(st.cached, 0);
	assert_int_equal(status(w, 1).cache_bound, 0);

	/* live + cached may fill the pool, not pass it; cached may pass its
	 * bound (an owner trims after the fact). Refused samples change
	 * nothing. */
	assert_int_equal(gpud_memwatch_sample_split(w, 0, 0, 30, 70), 0);
	assert_int_equal(gpud_memwatch_sample_split(w, 0, 10, 31, 70), -EINVAL);
	assert_int_equal(gpud_memwatch_sample_split(w, 0, 10, 101, 0), -EINVAL);
	assert_int_equal(gpud_memwatch_sample_split(w, 0, 10, 0, UINT64_MAX), -EINVAL);
	assert_int_equal(gpud_memwatch_sample_split(w, 2, 10, 0, 0), -EINVAL);
	st = status(w, 0);
	assert_int_equal(st.samples, 1);
	assert_int_equal(st.current, 30);
	assert_int_equal(st.cached, 70);
	assert_int_equal(gpud_memwatch_sample_split(w, 0, 20, 5, 10), 0);
	st = status(w, 0);
	assert_int_equal(st.current, 5);
	assert_int_equal(st.high, 30);
	assert_int_equal(st.trough, 5);
	assert_int_equal(st.cached, 10);
	assert_int_equal(st.cached_high, 70);

	/* A plain sample is a split one with nothing cached. */
	assert_int_equal(gpud_memwatch_sample(w, 0, 30, 7), 0);
	assert_int_equal(status(w, 0).cached, 0);
	assert_int_equal(status(w, 0).cached_high, 70);

	assert_true(gpud_memwatch_report(w, buf, sizeof(buf)) < (int)sizeof(buf));
	assert_non_null(strstr(buf, "\"name\":\"kv\",\"capacity\":100,\"current\":7,"));
	assert_non_null(strstr(buf, "\"cached\":0,\"cached_high\":70,\"cache_bound\":60,"));
	gpud_memwatch_destroy(w);
}

/* The same pool fed two ways, window after window: live requests come
 * and go (their part returns to 0 in every window) while the cache fills
 * to its bound and then stays full, evicting. Watching the sum, as the
 * watchdog once did, reads the filling as a rising trough; watching the
 * live part raises nothing. */
static void test_cache_filling_is_no_leak(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(2, 0);
	int sum = gpud_memwatch_register(w, "sum", 200);
	int split = gpud_memwatch_register_cached(w, "split", 200, 150);
	struct gpud_memwatch_status st;

	for (uint64_t win = 0; win < 40; win++) {
		uint64_t cached = win * 10 < 150 ? win * 10 : 150;

		for (uint64_t i = 0; i < 10; i++) {
			uint64_t t = win * WIN + i * 100;
			uint64_t live = i % 5 == 0 ? 0 : 10 + 5 * (i % 5); /* 0 .. 30 */

			assert_int_equal(gpud_memwatch_sample(w, sum, t, live + cached), 0);
			assert_int_equal(gpud_memwatch_sample_split(w, split, t, live, cached), 0);
			st = status(w, split);
			assert_false(st.rising);
			assert_string_equal(st.warning, "");
		}
	}
	st = status(w, split);
	assert_int_equal(st.episodes, 0);
	assert_int_equal(st.trough_k_ago, 0);
	assert_int_equal(st.cached, 150);
	assert_int_equal(st.cached_high, 150);
	assert_int_equal(st.high, 30);
	/* the sum rose while the cache filled, then the flag cleared */
	st = status(w, sum);
	assert_int_equal(st.episodes, 1);
	assert_false(st.rising);
	gpud_memwatch_destroy(w);
}

/* A leak behind a full cache: the pool stays full (the cache gives up one
 * unit for every unit that leaks), so the sum never moves, but the live
 * part's trough rises and the warning says what the cache keeps. */
static void test_full_cache_hides_no_leak(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(2, 0);
	int sum = gpud_memwatch_register(w, "sum", 100);
	int split = gpud_memwatch_register_cached(w, "cpu0.mask", 100, 100);
	struct gpud_memwatch_status st;
	uint64_t win;

	for (win = 0; win <= K; win++) {
		uint64_t leaked = 2 * win;

		for (uint64_t i = 0; i < 10; i++) {
			uint64_t t = win * WIN + i * 100;
			uint64_t live = leaked + (i % 3); /* requests come and go */

			assert_int_equal(gpud_memwatch_sample(w, sum, t, 100), 0);
			assert_int_equal(gpud_memwatch_sample_split(w, split, t, live, 100 - live), 0);
		}
		st = status(w, split);
		assert_int_equal(st.rising, win == K); /* the first full ring */
	}
	assert_false(status(w, sum).rising);
	st = status(w, split);
	assert_int_equal(st.episodes, 1);
	assert_int_equal(st.trough_k_ago, 0);
	assert_string_equal(st.warning,
			    "pool cpu0.mask: trough held by live requests rose from 0 to 6 of 100 "
			    "over the last 4 windows of 1000 ms (its cache keeps 92 more, bound "
			    "100)");
	gpud_memwatch_destroy(w);
}

/* Lines of path containing needle. */
static int count_lines(const char *path, const char *needle)
{
	char line[1024];
	int n = 0;
	FILE *f = fopen(path, "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* One log_warn per rising episode, not one per window. */
static void test_warns_once_per_episode(void **state)
{
	(void)state;
	char path[] = "/tmp/memwatch_test_XXXXXX";
	int fd = mkstemp(path);
	struct gpud_memwatch *w = make(1, 0);
	int id = gpud_memwatch_register(w, "kv", 1000);
	uint64_t win = 0;

	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sw_log_open(path), 0);
	sw_log_level = SW_LOG_WARN;
	for (; win < 12; win++) /* rising from window K on */
		saw_window(w, id, win, 10 + 5 * win, 900);
	saw_window(w, id, win++, 10, 900);
	saw_window(w, id, win++, 10, 900); /* recovered */
	for (uint64_t i = 1; i <= K + 3; i++)
		saw_window(w, id, win++, 10 + 3 * i, 900);
	sw_log_level = SW_LOG_ERROR;
	assert_int_equal(sw_log_open(NULL), 0);
	assert_int_equal(status(w, id).episodes, 2);
	assert_int_equal(count_lines(path, "pool kv: trough rose"), 2);
	assert_int_equal(count_lines(path, "no longer rising"), 0); /* info: filtered */
	unlink(path);
	gpud_memwatch_destroy(w);
}

static void test_min_rise_and_threshold(void **state)
{
	(void)state;
	struct gpud_memwatch_params p = {
		.max_pools = 3, .window_ms = WIN, .k = K, .min_rise = 50, .rise_fraction = 0.1,
	};
	struct gpud_memwatch *w;
	/* Troughs per window: a tiny monotonic creep, a big non-monotonic
	 * jump, and the same jump spread out below the threshold. */
	static const uint64_t creep[] = { 100, 110, 120, 130, 140, 140 };
	static const uint64_t jump[] = { 100, 50, 300, 310, 320, 320 };
	static const uint64_t wobble[] = { 100, 90, 150, 140, 190, 190 };

	assert_int_equal(gpud_memwatch_create(&w, &p), 0);
	assert_int_equal(gpud_memwatch_register(w, "creep", 1000), 0);
	assert_int_equal(gpud_memwatch_register(w, "jump", 1000), 1);
	assert_int_equal(gpud_memwatch_register(w, "wobble", 1000), 2);
	for (uint64_t win = 0; win < 6; win++) {
		saw_window(w, 0, win, creep[win], 800);
		saw_window(w, 1, win, jump[win], 800);
		saw_window(w, 2, win, wobble[win], 800);
	}
	/* creep: 100 -> 130 over the first K troughs is below min_rise 50 and
	 * below 10% of 1000; then 110 -> 140 likewise. */
	assert_false(status(w, 0).rising);
	/* jump: 50 -> 320 > 100 units although the troughs fell once. */
	assert_true(status(w, 1).rising);
	/* wobble: 90 -> 190 is not above 100, and it is not monotonic. */
	assert_false(status(w, 2).rising);
	gpud_memwatch_destroy(w);
}

/* min_steps 2: a load that steps up once and stays lifts the trough once
 * (no warning, however high); a leak rises again (a warning). Clamped to
 * the k - 1 transitions a ring has. */
static void test_min_steps(void **state)
{
	(void)state;
	struct gpud_memwatch_params p = {
		.max_pools = 2, .window_ms = WIN, .k = K, .min_steps = 2,
	};
	struct gpud_memwatch *w;
	static const uint64_t step[] = { 0, 0, 0, 0, 40, 40, 40, 40, 40, 40 };
	static const uint64_t leak[] = { 0, 0, 0, 0, 1, 1, 2, 2, 2, 2 };
	bool step_rose = false;

	assert_int_equal(gpud_memwatch_create(&w, &p), 0);
	assert_int_equal(gpud_memwatch_register(w, "step", 100), 0);
	assert_int_equal(gpud_memwatch_register(w, "leak", 100), 1);
	for (uint64_t win = 0; win < 10; win++) {
		saw_window(w, 0, win, step[win], 90);
		saw_window(w, 1, win, leak[win], 90);
		step_rose |= status(w, 0).rising;
		/* troughs 0 1 1 2 close at window 7: two rises; one window
		 * later 1 1 2 2 has one left, and the episode ends (a leak
		 * that goes on starts the next) */
		assert_int_equal(status(w, 1).rising, win == 7);
	}
	assert_false(step_rose);
	assert_int_equal(status(w, 0).episodes, 0);
	assert_int_equal(status(w, 1).episodes, 1);
	gpud_memwatch_destroy(w);

	/* k 2 has one transition: min_steps 5 means 1 */
	p.k = 2;
	p.min_steps = 5;
	assert_int_equal(gpud_memwatch_create(&w, &p), 0);
	assert_int_equal(gpud_memwatch_register(w, "x", 100), 0);
	saw_window(w, 0, 0, 0, 50);
	saw_window(w, 0, 1, 3, 50);
	saw_window(w, 0, 2, 3, 50);
	assert_true(status(w, 0).rising);
	gpud_memwatch_destroy(w);
}

/* A pool's own min_steps (gpud's connection slots: k - 1): clients that
 * reconnect in two steps after a start lift its trough twice, a warning
 * under the watchdog's min_steps 2 and none under its own 3; slots that
 * leak rise in every window and warn under both. */
static void test_min_steps_per_pool(void **state)
{
	(void)state;
	struct gpud_memwatch_params p = {
		.max_pools = 3, .window_ms = WIN, .k = K, .min_steps = 2,
	};
	struct gpud_memwatch *w;
	static const uint64_t ramp[] = { 0, 0, 0, 3, 4, 4, 4, 4, 4, 4 };
	static const uint64_t leak[] = { 0, 0, 0, 1, 2, 3, 4, 5, 6, 7 };
	bool ramp_rose = false, pop_rose = false, leak_rose = false;

	assert_int_equal(gpud_memwatch_create(&w, &p), 0);
	assert_int_equal(gpud_memwatch_register(w, "ramp", 100), 0);
	assert_int_equal(gpud_memwatch_register(w, "population", 100), 1);
	assert_int_equal(gpud_memwatch_register(w, "leak", 100), 2);
	assert_int_equal(gpud_memwatch_set_min_steps(w, 1, K - 1), 0);
	assert_int_equal(gpud_memwatch_set_min_steps(w, 2, K - 1), 0);
	assert_int_equal(gpud_memwatch_set_min_steps(w, 3, 1), -EINVAL);
	assert_int_equal(gpud_memwatch_set_min_steps(w, -1, 1), -EINVAL);
	assert_int_equal(gpud_memwatch_set_min_steps(NULL, 0, 1), -EINVAL);
	for (uint64_t win = 0; win < 10; win++) {
		/* samples never below the trough: the clients stay connected */
		saw_window(w, 0, win, ramp[win], ramp[win] + 2);
		saw_window(w, 1, win, ramp[win], ramp[win] + 2);
		saw_window(w, 2, win, leak[win], leak[win] + 2);
		ramp_rose |= status(w, 0).rising;
		pop_rose |= status(w, 1).rising;
		leak_rose |= status(w, 2).rising;
	}
	assert_true(ramp_rose);  /* troughs 0 0 3 4: two steps */
	assert_false(pop_rose);  /* the same under min_steps 3 */
	assert_true(leak_rose);  /* 0 1 2 3 and on: three steps, every window */
	assert_int_equal(status(w, 1).episodes, 0);
	gpud_memwatch_destroy(w);

	/* clamped like the watchdog's: 0 means 1, past k - 1 means k - 1 */
	p.min_steps = 1;
	assert_int_equal(gpud_memwatch_create(&w, &p), 0);
	assert_int_equal(gpud_memwatch_register(w, "one", 100), 0);
	assert_int_equal(gpud_memwatch_register(w, "many", 100), 1);
	assert_int_equal(gpud_memwatch_set_min_steps(w, 0, 0), 0);
	assert_int_equal(gpud_memwatch_set_min_steps(w, 1, 1000), 0);
	for (uint64_t win = 0; win <= K; win++) { /* window K's samples close K - 1 */
		saw_window(w, 0, win, win < K - 1 ? 0 : 5, 50); /* one step: 0 0 0 5 */
		saw_window(w, 1, win, win, 50);                /* every window: 0 1 2 3 */
	}
	assert_true(status(w, 0).rising);
	assert_true(status(w, 1).rising);
	gpud_memwatch_destroy(w);
}

static void test_clock_and_gaps(void **state)
{
	(void)state;
	struct gpud_memwatch *w = make(1, 0);
	int id = gpud_memwatch_register(w, "kv", 1000);
	struct gpud_memwatch_status st;

	assert_int_equal(gpud_memwatch_sample(w, id, 5 * WIN + 500, 40), 0);
	/* Back in time, even to an earlier window: counts in the open one. */
	assert_int_equal(gpud_memwatch_sample(w, id, 5 * WIN + 100, 30), 0);
	assert_int_equal(gpud_memwatch_sample(w, id, 2 * WIN, 20), 0);
	st = status(w, id);
	assert_int_equal(st.clock_backwards, 2);
	assert_int_equal(st.windows, 0);
	assert_int_equal(st.trough, 20);
	assert_int_equal(st.current, 20);
	assert_int_equal(st.high, 40);

	/* A gap of 100 windows closes one window, not 100. */
	assert_int_equal(gpud_memwatch_sample(w, id, 105 * WIN, 60), 0);
	st = status(w, id);
	assert_int_equal(st.windows, 1);
	assert_int_equal(st.trough_k_ago, 20);
	assert_int_equal(st.trough, 60);

	/* Time 0 and the largest time both work. */
	struct gpud_memwatch *w2 = make(1, 0);
	int id2 = gpud_memwatch_register(w2, "x", 10);
	assert_int_equal(gpud_memwatch_sample(w2, id2, 0, 1), 0);
	assert_int_equal(gpud_memwatch_sample(w2, id2, UINT64_MAX, 2), 0);
	assert_int_equal(status(w2, id2).windows, 1);
	gpud_memwatch_destroy(w2);
	gpud_memwatch_destroy(w);
}

static void test_many_pools_and_report(void **state)
{
	(void)state;
	enum { N = 300 };
	struct gpud_memwatch *w = make(N, 0);
	char name[32];
	static char buf[N * 400];
	char small[64];

	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "dev%d.kv", i);
		assert_int_equal(gpud_memwatch_register(w, name, 10000), i);
	}
	/* Even pools creep, odd pools return to their low. */
	for (uint64_t win = 0; win <= K; win++)
		for (int i = 0; i < N; i++)
			saw_window(w, i, win, 100 + (i % 2 ? 0 : 10 * win), 5000);
	for (int i = 0; i < N; i++)
		assert_int_equal(status(w, i).rising, i % 2 == 0);
	assert_true(gpud_memwatch_any_rising(w));

	int n = gpud_memwatch_report(w, buf, sizeof(buf));
	assert_true(n > 0 && (size_t)n < sizeof(buf));
	assert_int_equal(strlen(buf), n);
	const char *head = "{\"window_ms\":1000,\"k\":4,\"pools\":[{\"name\":\"dev0.kv\"";
	assert_int_equal(strncmp(buf, head, strlen(head)), 0);
	assert_non_null(strstr(buf, "{\"name\":\"dev1.kv\",\"capacity\":10000,\"current\":1080,"
				    "\"high\":5000,\"trough\":100,\"trough_k_ago\":100,\"windows\":4,"
				    "\"rising\":false,\"episodes\":0,\"samples\":50,"
				    "\"clock_backwards\":0,\"cached\":0,\"cached_high\":0,"
				    "\"cache_bound\":0,\"warning\":\"\"}"));
	assert_non_null(strstr(buf, "\"name\":\"dev298.kv\""));
	assert_non_null(strstr(buf, "\"rising\":true,\"episodes\":1"));
	assert_string_equal(buf + n - 2, "]}");

	/* Cut reports still say the full length and stay terminated. */
	assert_int_equal(gpud_memwatch_report(w, small, sizeof(small)), n);
	assert_int_equal(strlen(small), sizeof(small) - 1);
	assert_memory_equal(small, buf, sizeof(small) - 1);
	assert_int_equal(gpud_memwatch_report(w, NULL, 0), n);

	/* An empty watchdog reports an empty list. */
	struct gpud_memwatch *e = make(1, 0);
	assert_int_equal(gpud_memwatch_report(e, small, sizeof(small)),
			 (int)strlen("{\"window_ms\":1000,\"k\":4,\"pools\":[]}"));
	assert_string_equal(small, "{\"window_ms\":1000,\"k\":4,\"pools\":[]}");
	gpud_memwatch_destroy(e);
	gpud_memwatch_destroy(w);
}

int main(void)
{
	/* The rising tests warn on purpose; keep the test log readable. */
	sw_log_init("memwatch_test", SW_LOG_ERROR);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_params_and_register),
		cmocka_unit_test(test_flat),
		cmocka_unit_test(test_sawtooth_same_low),
		cmocka_unit_test(test_rising_then_recovery),
		cmocka_unit_test(test_warns_once_per_episode),
		cmocka_unit_test(test_min_rise_and_threshold),
		cmocka_unit_test(test_min_steps),
		cmocka_unit_test(test_min_steps_per_pool),
		cmocka_unit_test(test_clock_and_gaps),
		cmocka_unit_test(test_many_pools_and_report),
		cmocka_unit_test(test_split_params),
		cmocka_unit_test(test_cache_filling_is_no_leak),
		cmocka_unit_test(test_full_cache_hides_no_leak),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
