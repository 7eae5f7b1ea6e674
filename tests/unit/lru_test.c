/* lru_test.c - bounded LRU: byte and entry bounds, LRU order, pinning,
 * refused inserts that change nothing, eq-checked collisions, counters,
 * evicting one entry on demand, the consistency check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/lru.h"

/* Records evictions so tests can see exactly what left and in what order. */
struct evlog {
	int n;
	uint64_t keys[64];
	size_t bytes[64];
	void *values[64];
};

static void on_evict(void *ctx, uint64_t key, void *value, size_t bytes)
{
	struct evlog *ev = ctx;
	if (ev->n < 64) {
		ev->keys[ev->n] = key;
		ev->values[ev->n] = value;
		ev->bytes[ev->n] = bytes;
	}
	ev->n++;
}

static struct sw_lru *make(size_t max_bytes, uint32_t max_entries, struct evlog *ev)
{
	struct sw_lru *l = NULL;
	struct sw_lru_params prm = {
		.name = "test", .max_bytes = max_bytes, .max_entries = max_entries,
		.evict = on_evict, .ctx = ev,
	};
	assert_int_equal(sw_lru_create(&l, &prm), 0);
	return l;
}

static int vals[64];
#define V(i) ((void *)&vals[i])

static void check(const struct sw_lru *l)
{
	char err[SW_ERR_MAX] = "";

	if (sw_lru_check(l, err, sizeof(err)))
		fail_msg("%s", err);
}

static void test_create_errors(void **state)
{
	(void)state;
	struct sw_lru *l = (struct sw_lru *)0x1;
	struct sw_lru_params prm = { .max_bytes = 0, .max_entries = 4 };
	assert_int_equal(sw_lru_create(&l, &prm), -EINVAL);
	prm.max_bytes = 10;
	prm.max_entries = 0;
	assert_int_equal(sw_lru_create(&l, &prm), -EINVAL);
	prm.max_entries = (1u << 30) + 1;
	assert_int_equal(sw_lru_create(&l, &prm), -EINVAL);
	assert_int_equal(sw_lru_create(&l, NULL), -EINVAL);
	assert_ptr_equal(l, (struct sw_lru *)0x1);
	sw_lru_destroy(NULL);
}

static void test_hit_miss_and_entry_bound(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	struct sw_lru *l = make(1000, 3, &ev);
	struct sw_lru_entry *e;

	assert_null(sw_lru_get(l, 1, NULL));
	for (uint64_t k = 1; k <= 3; k++)
		assert_int_equal(sw_lru_insert(l, k, NULL, V(k), 10, false, NULL), 0);
	e = sw_lru_get(l, 1, NULL); /* 1 becomes most recent */
	assert_non_null(e);
	assert_ptr_equal(sw_lru_value(e), V(1));
	assert_int_equal(sw_lru_key(e), 1);
	assert_int_equal(sw_lru_bytes(e), 10);
	assert_int_equal(sw_lru_refs(e), 1);
	assert_int_equal(sw_lru_unpin(l, e), 0);

	/* A fourth entry pushes out the least recently used: 2. */
	assert_int_equal(sw_lru_insert(l, 4, NULL, V(4), 10, false, NULL), 0);
	assert_int_equal(ev.n, 1);
	assert_int_equal(ev.keys[0], 2);
	assert_ptr_equal(ev.values[0], V(2));
	assert_int_equal(ev.bytes[0], 10);
	assert_null(sw_lru_peek(l, 2, NULL));
	assert_non_null(sw_lru_peek(l, 1, NULL));
	assert_non_null(sw_lru_peek(l, 3, NULL));

	struct sw_lru_stats st;
	sw_lru_stats(l, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.inserts, 4);
	assert_int_equal(st.evictions, 1);
	assert_int_equal(st.entries, 3);
	assert_int_equal(st.bytes, 30);
	assert_int_equal(st.pinned, 0);
	assert_int_equal(st.max_entries, 3);
	assert_int_equal(st.max_bytes, 1000);
	sw_lru_destroy(l);
	assert_int_equal(ev.n, 4); /* destroy hands every value back */
}

static void test_byte_bound(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	struct sw_lru *l = make(100, 50, &ev);

	assert_int_equal(sw_lru_insert(l, 1, NULL, V(1), 40, false, NULL), 0);
	assert_int_equal(sw_lru_insert(l, 2, NULL, V(2), 40, false, NULL), 0);
	assert_int_equal(sw_lru_insert(l, 3, NULL, V(3), 20, false, NULL), 0);
	assert_int_equal(ev.n, 0); /* exactly full is fine */
	/* 50 bytes more: 1 (40) and 2 (40) must both go; 3 stays. */
	assert_int_equal(sw_lru_insert(l, 4, NULL, V(4), 50, false, NULL), 0);
	assert_int_equal(ev.n, 2);
	assert_int_equal(ev.keys[0], 1);
	assert_int_equal(ev.keys[1], 2);
	struct sw_lru_stats st;
	sw_lru_stats(l, &st);
	assert_int_equal(st.bytes, 70);
	assert_int_equal(st.entries, 2);

	/* Bigger than the whole cache: refused, nothing evicted. */
	assert_int_equal(sw_lru_insert(l, 5, NULL, V(5), 101, false, NULL), SW_ETOOLONG);
	assert_int_equal(ev.n, 2);
	/* Zero-byte entries are allowed. */
	assert_int_equal(sw_lru_insert(l, 6, NULL, V(6), 0, false, NULL), 0);
	sw_lru_stats(l, &st);
	assert_int_equal(st.insert_fails, 1);
	assert_int_equal(st.entries, 3);
	sw_lru_destroy(l);
}

static void test_pinned_never_evicted(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	struct sw_lru *l = make(100, 3, &ev);
	struct sw_lru_entry *e1, *e2, *e3, *e;

	assert_int_equal(sw_lru_insert(l, 1, NULL, V(1), 30, true, &e1), 0);
	assert_int_equal(sw_lru_insert(l, 2, NULL, V(2), 30, false, &e2), 0);
	assert_int_equal(sw_lru_insert(l, 3, NULL, V(3), 30, true, &e3), 0);
	assert_int_equal(sw_lru_refs(e1), 1);
	assert_int_equal(sw_lru_refs(e2), 0);

	/* 1 is the oldest but pinned: 2 goes instead. */
	assert_int_equal(sw_lru_insert(l, 4, NULL, V(4), 30, true, &e), 0);
	assert_int_equal(ev.n, 1);
	assert_int_equal(ev.keys[0], 2);

	/* Full of pinned entries: refused, and nothing at all changes. */
	struct sw_lru_stats before, after;
	sw_lru_stats(l, &before);
	assert_int_equal(sw_lru_insert(l, 5, NULL, V(5), 1, false, NULL), SW_EPINNED);
	sw_lru_stats(l, &after);
	assert_int_equal(ev.n, 1);
	assert_int_equal(after.entries, before.entries);
	assert_int_equal(after.bytes, before.bytes);
	assert_int_equal(after.insert_fails, before.insert_fails + 1);
	assert_int_equal(after.pinned, 3);
	assert_int_equal(after.pinned_bytes, 90);
	assert_null(sw_lru_peek(l, 5, NULL));

	/* Unpin 3: now 3 can go. Pins nest: 1 pinned twice needs two unpins. */
	sw_lru_pin(l, e1);
	assert_int_equal(sw_lru_refs(e1), 2);
	assert_int_equal(sw_lru_unpin(l, e3), 0);
	assert_int_equal(sw_lru_unpin(l, e3), -EINVAL); /* not pinned any more */
	assert_int_equal(sw_lru_erase(l, e1), SW_EPINNED);
	assert_int_equal(sw_lru_insert(l, 5, NULL, V(5), 1, false, NULL), 0);
	assert_int_equal(ev.n, 2);
	assert_int_equal(ev.keys[1], 3);
	assert_int_equal(sw_lru_unpin(l, e1), 0);
	assert_int_equal(sw_lru_refs(e1), 1);
	assert_int_equal(sw_lru_insert(l, 6, NULL, V(6), 1, false, NULL), 0);
	assert_int_equal(ev.keys[2], 5); /* 1 still pinned, 4 pinned: 5 goes */

	/* Bytes, not entries: pinned bytes alone block a big insert. */
	assert_int_equal(sw_lru_insert(l, 7, NULL, V(7), 50, false, NULL), SW_EPINNED);
	assert_int_equal(ev.n, 3); /* 6 was not evicted in vain */
	check(l);
	sw_lru_destroy(l);
	assert_int_equal(ev.n, 6); /* 1, 4 (pinned) and 6 leave on destroy */
}

static void test_unpin_makes_most_recent(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	struct sw_lru *l = make(1000, 3, &ev);
	struct sw_lru_entry *e;

	assert_int_equal(sw_lru_insert(l, 1, NULL, V(1), 1, false, NULL), 0);
	assert_int_equal(sw_lru_insert(l, 2, NULL, V(2), 1, false, NULL), 0);
	assert_int_equal(sw_lru_insert(l, 3, NULL, V(3), 1, false, NULL), 0);
	e = sw_lru_get(l, 1, NULL);
	assert_non_null(e);
	assert_int_equal(sw_lru_unpin(l, e), 0);
	e = sw_lru_get(l, 2, NULL);
	assert_int_equal(sw_lru_unpin(l, e), 0);
	/* Order now (old -> new): 3, 1, 2. */
	assert_int_equal(sw_lru_insert(l, 4, NULL, V(4), 1, false, NULL), 0);
	assert_int_equal(sw_lru_insert(l, 5, NULL, V(5), 1, false, NULL), 0);
	assert_int_equal(ev.n, 2);
	assert_int_equal(ev.keys[0], 3);
	assert_int_equal(ev.keys[1], 1);
	sw_lru_destroy(l);
}

static void test_erase_clear_dup(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	struct sw_lru *l = make(1000, 8, &ev);
	struct sw_lru_entry *e, *p;

	assert_int_equal(sw_lru_insert(l, 1, NULL, V(1), 5, false, &e), 0);
	assert_int_equal(sw_lru_insert(l, 1, NULL, V(9), 5, false, NULL), -EEXIST);
	assert_int_equal(sw_lru_insert(l, 2, NULL, V(2), 5, true, &p), 0);
	assert_int_equal(sw_lru_insert(l, 3, NULL, V(3), 5, false, NULL), 0);
	assert_int_equal(sw_lru_erase(l, e), 0);
	assert_int_equal(ev.n, 1);
	assert_ptr_equal(ev.values[0], V(1));
	assert_null(sw_lru_peek(l, 1, NULL));

	sw_lru_clear(l); /* 3 goes; pinned 2 stays */
	assert_int_equal(ev.n, 2);
	assert_int_equal(ev.keys[1], 3);
	assert_non_null(sw_lru_peek(l, 2, NULL));

	struct sw_lru_stats st;
	sw_lru_stats(l, &st);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.bytes, 5);
	assert_int_equal(st.evictions, 1); /* clear counts, erase does not */
	assert_int_equal(st.insert_fails, 1);
	assert_int_equal(sw_lru_unpin(l, p), 0);
	sw_lru_destroy(l);
	assert_int_equal(ev.n, 3);
}

/* Mask-cache style: u64 is a hash, eq compares the real key, so two
 * different real keys that collide are kept apart. */
struct item {
	char name[16];
};

static bool item_eq(void *ctx, const void *value, const void *probe)
{
	(void)ctx;
	return strcmp(((const struct item *)value)->name, probe) == 0;
}

static void test_eq_collisions(void **state)
{
	(void)state;
	struct sw_lru *l;
	struct sw_lru_params prm = { .max_bytes = 100, .max_entries = 4, .eq = item_eq };
	struct item a = { "alpha" }, b = { "beta" };
	struct sw_lru_entry *e;

	assert_int_equal(sw_lru_create(&l, &prm), 0);
	assert_int_equal(sw_lru_insert(l, 42, "alpha", &a, 1, false, NULL), 0);
	/* Same hash, different real key: a separate entry. */
	assert_int_equal(sw_lru_insert(l, 42, "beta", &b, 1, false, NULL), 0);
	assert_int_equal(sw_lru_insert(l, 42, "beta", &b, 1, false, NULL), -EEXIST);
	e = sw_lru_get(l, 42, "beta");
	assert_non_null(e);
	assert_ptr_equal(sw_lru_value(e), &b);
	sw_lru_unpin(l, e);
	e = sw_lru_get(l, 42, "alpha");
	assert_ptr_equal(sw_lru_value(e), &a);
	sw_lru_unpin(l, e);
	assert_null(sw_lru_get(l, 42, "gamma"));
	assert_null(sw_lru_get(l, 43, "alpha"));
	check(l); /* two entries chained under one key */
	sw_lru_destroy(l); /* no evict callback: fine */
}

/* sw_lru_evict_one takes the least recently used unpinned entry, through
 * the callback and counted; pinned entries are stepped over; with none
 * unpinned it is SW_ENOTFOUND and nothing changes. */
static void test_evict_one(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	struct sw_lru *l = make(1000, 8, &ev);
	struct sw_lru_entry *e[4];
	struct sw_lru_stats st;

	assert_int_equal(sw_lru_evict_one(l), SW_ENOTFOUND);
	for (int i = 0; i < 4; i++)
		assert_int_equal(sw_lru_insert(l, 10 + (uint64_t)i, NULL, V(i), 10, false, &e[i]),
				 0);
	check(l);
	sw_lru_pin(l, e[0]);            /* oldest, but pinned */
	assert_non_null(sw_lru_get(l, 11, NULL)); /* e[1] pinned, then... */
	assert_int_equal(sw_lru_unpin(l, e[1]), 0); /* ...most recent */
	check(l);
	/* unpinned, least recent first: 12, 13, 11 */
	assert_int_equal(sw_lru_evict_one(l), 0);
	assert_int_equal(ev.n, 1);
	assert_int_equal(ev.keys[0], 12);
	assert_ptr_equal(ev.values[0], V(2));
	assert_int_equal(ev.bytes[0], 10);
	check(l);
	assert_int_equal(sw_lru_evict_one(l), 0);
	assert_int_equal(sw_lru_evict_one(l), 0);
	assert_int_equal(ev.n, 3);
	assert_int_equal(ev.keys[1], 13);
	assert_int_equal(ev.keys[2], 11);
	/* only the pinned entry is left */
	assert_int_equal(sw_lru_evict_one(l), SW_ENOTFOUND);
	assert_int_equal(ev.n, 3);
	sw_lru_stats(l, &st);
	assert_int_equal(st.evictions, 3);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.pinned, 1);
	assert_int_equal(st.bytes, 10);
	check(l);
	assert_int_equal(sw_lru_unpin(l, e[0]), 0);
	assert_int_equal(sw_lru_evict_one(l), 0);
	assert_int_equal(ev.keys[3], 10);
	sw_lru_stats(l, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.bytes, 0);
	check(l);
	/* the freed entries are reused */
	for (int i = 0; i < 8; i++)
		assert_int_equal(sw_lru_insert(l, 100 + (uint64_t)i, NULL, V(i), 1, false, NULL),
				 0);
	check(l);
	sw_lru_destroy(l);
	assert_int_equal(ev.n, 12);
}

/* Many keys through a small cache: bounds hold at every step and every
 * value handed in comes back out exactly once. */
static void test_churn(void **state)
{
	(void)state;
	struct evlog ev = { 0 };
	enum { N = 5000 };
	struct sw_lru *l = make(4096, 37, &ev);
	uint64_t x = 12345;
	int inserted = 0;
	struct sw_lru_entry *held = NULL;

	for (int i = 0; i < N; i++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		uint64_t key = (x >> 33) % 200;
		struct sw_lru_entry *e = sw_lru_get(l, key, NULL);
		if (e) {
			assert_int_equal(sw_lru_key(e), key);
			if (!held && (x & 0x100)) {
				held = e; /* keep one pinned across many steps */
				continue;
			}
			sw_lru_unpin(l, e);
		} else {
			size_t bytes = (size_t)((x >> 45) % 300);
			int rc = sw_lru_insert(l, key, NULL, NULL, bytes, false, NULL);
			assert_int_equal(rc, 0);
			inserted++;
		}
		if (held && (x & 0xf000) == 0) {
			sw_lru_unpin(l, held);
			held = NULL;
		}
		struct sw_lru_stats st;
		sw_lru_stats(l, &st);
		assert_true(st.entries <= 37);
		assert_true(st.bytes <= 4096);
		assert_int_equal(st.pinned, held ? 1 : 0);
		if (i % 97 == 0)
			check(l);
	}
	check(l);
	if (held)
		sw_lru_unpin(l, held);
	struct sw_lru_stats st;
	sw_lru_stats(l, &st);
	assert_int_equal(st.inserts, inserted);
	assert_int_equal(st.hits + st.misses, N); /* every step did one get */
	assert_true(st.evictions > 0);
	sw_lru_destroy(l);
	assert_int_equal(ev.n, inserted); /* every entry left exactly once */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_hit_miss_and_entry_bound),
		cmocka_unit_test(test_byte_bound),
		cmocka_unit_test(test_pinned_never_evicted),
		cmocka_unit_test(test_unpin_makes_most_recent),
		cmocka_unit_test(test_erase_clear_dup),
		cmocka_unit_test(test_eq_collisions),
		cmocka_unit_test(test_evict_one),
		cmocka_unit_test(test_churn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
