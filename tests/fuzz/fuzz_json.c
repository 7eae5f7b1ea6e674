/* fuzz_json.c - libFuzzer target for gpud's hand-written JSON writer
 * (gpud/jsonw.h) and the stats writers built on it (gpud/stats.h: the
 * STATS and MEM replies, the Prometheus text), fed arbitrary strings:
 * UTF-8, invalid UTF-8, control bytes, NULs, quotes and backslashes.
 * (gpud has no other JSON writer of outside strings: agentd, swarmctl and
 * the config use jansson; memwatch and the block dump print only names
 * gpud itself makes.)
 *
 * Input: byte 0 picks where the key ends, byte 1 a short buffer's size
 * (low 7 bits) and whether the stats writers run too (bit 7); the rest is split there into the key (up to its first NUL, a C
 * string) and the value (any bytes, written with its length).
 *
 * Checked invariants (a violation traps):
 *  - the writer's output for [{KEY: VALUE}, VALUE, [VALUE, null], CVALUE]
 *    parses with jansson (JSON_ALLOW_NUL), and every string reads back as
 *    the bytes written with each byte that does not start a valid UTF-8
 *    sequence replaced by U+FFFD (for valid UTF-8: byte for byte); the
 *    reference for that is this file's own decoder, not gpud_utf8_seq;
 *  - into a shorter buffer it returns SW_ETOOLONG with a prefix of the
 *    full output;
 *  - gpud_stats_json with the value as the version, a device's, a pool's
 *    and a cache's name, a pool's warning and the dump path (MEM) parses
 *    with jansson and gives each back as above (names cut to their
 *    fields);
 *  - gpud_stats_prometheus writes valid UTF-8 with as many lines as the
 *    same snapshot with plain names (no name can add or break a line).
 */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/utf8.h"
#include "gpud/jsonw.h"
#include "gpud/stats.h"
#include "tests/fuzz/fuzz.h"

static bool valid_utf8(const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;

	for (size_t i = 0, k; i < n; i += k)
		if ((k = sw_utf8_char(s + i, n - i)) == 0)
			return false;
	return true;
}

/* s[0, n) with each invalid byte replaced by U+FFFD, into out (3n bytes). */
static size_t fix_utf8(const char *str, size_t n, char *out)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0, o = 0, k;

	while (i < n) {
		if ((k = sw_utf8_char(s + i, n - i)) == 0) {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		} else {
			memcpy(out + o, s + i, k);
			o += k;
			i += k;
		}
	}
	return o;
}

/* v is a JSON string holding exactly fix_utf8(s, n). */
static void check_string(const json_t *v, const char *s, size_t n)
{
	char *want = malloc(3 * n + 1);
	size_t wn;

	CHECK(want != NULL);
	wn = fix_utf8(s, n, want);
	CHECK(json_is_string(v));
	CHECK(json_string_length(v) == wn);
	CHECK(memcmp(json_string_value(v), want, wn) == 0);
	free(want);
}

static json_t *parse(const char *buf, size_t len)
{
	json_error_t jerr;
	json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL, &jerr);

	CHECK(root != NULL);
	return root;
}

static void write_doc(struct gpud_jsonw *w, const char *key, const char *val, size_t n,
		      const char *cval)
{
	gpud_jsonw_arr_begin(w, NULL);
	gpud_jsonw_obj_begin(w, NULL);
	gpud_jsonw_strn(w, key, val, n);
	gpud_jsonw_obj_end(w);
	gpud_jsonw_strn(w, NULL, val, n);
	gpud_jsonw_arr_begin(w, NULL);
	gpud_jsonw_strn(w, NULL, val, n);
	gpud_jsonw_str(w, NULL, NULL);
	gpud_jsonw_arr_end(w);
	gpud_jsonw_str(w, NULL, cval);
	gpud_jsonw_arr_end(w);
}

static void check_writer(const char *key, const char *val, size_t n, const char *cval,
			 size_t small_cap)
{
	size_t cap = 6 * (4 * n + strlen(key)) + 64, len, slen; /* 6 bytes each at most */
	char *buf = malloc(cap), *sbuf;
	struct gpud_jsonw w;
	json_t *root, *obj;
	char *fkey;

	CHECK(buf != NULL);
	gpud_jsonw_init(&w, buf, cap);
	write_doc(&w, key, val, n, cval);
	CHECK(gpud_jsonw_finish(&w, &len) == 0);
	root = parse(buf, len);
	CHECK(json_is_array(root) && json_array_size(root) == 4);
	obj = json_array_get(root, 0);
	CHECK(json_is_object(obj) && json_object_size(obj) == 1);
	fkey = malloc(3 * strlen(key) + 1);
	CHECK(fkey != NULL);
	fkey[fix_utf8(key, strlen(key), fkey)] = '\0';
	check_string(json_object_get(obj, fkey), val, n);
	check_string(json_array_get(root, 1), val, n);
	check_string(json_array_get(json_array_get(root, 2), 0), val, n);
	CHECK(json_is_null(json_array_get(json_array_get(root, 2), 1)));
	check_string(json_array_get(root, 3), cval, strlen(cval));
	json_decref(root);
	free(fkey);

	/* Too small: SW_ETOOLONG and a prefix of the full output. */
	if (small_cap < len) {
		sbuf = malloc(small_cap ? small_cap : 1);
		CHECK(sbuf != NULL);
		gpud_jsonw_init(&w, sbuf, small_cap);
		write_doc(&w, key, val, n, cval);
		CHECK(gpud_jsonw_finish(&w, &slen) == SW_ETOOLONG);
		CHECK(slen <= small_cap && slen < len);
		CHECK(memcmp(sbuf, buf, slen) == 0);
		free(sbuf);
	}
	free(buf);
}

static void set_name(char *dst, size_t cap, const char *s, size_t n)
{
	memset(dst, 0, cap);
	memcpy(dst, s, n < cap ? n : cap);
}

static void fill(struct gpud_stats_snapshot *s, const char *cval, const char *val, size_t n)
{
	memset(s, 0, sizeof(*s));
	s->version = cval;
	s->uptime_s = 1.5;
	s->n_devices = 1;
	set_name(s->devices[0].name, sizeof(s->devices[0].name), val, n);
	s->n_pools = 1;
	set_name(s->pools[0].name, sizeof(s->pools[0].name), val, n);
	s->pools[0].unit = "bytes";
	set_name(s->pools[0].cache, sizeof(s->pools[0].cache), val, n);
	set_name(s->pools[0].warning, sizeof(s->pools[0].warning), val, n);
	s->pools[0].rising = true;
	s->n_caches = 1;
	set_name(s->caches[0].name, sizeof(s->caches[0].name), val, n);
	s->dump_path = cval;
}

static size_t name_len(const char *field, size_t cap)
{
	return strnlen(field, cap);
}

/* Newlines in buf (memchr: libc is not instrumented, so this stays cheap). */
static size_t lines(const char *buf, size_t len)
{
	const char *p = buf, *end = buf + len;
	size_t k = 0;

	while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
		k++;
		p++;
	}
	return k;
}

static void check_stats(const char *val, size_t n, const char *cval)
{
	static char buf[1 << 20], plain_buf[1 << 20];
	static struct gpud_stats_snapshot snap, plain_snap; /* large: not per run */
	struct gpud_stats_snapshot *s = &snap, *plain = &plain_snap;
	const struct gpud_stats_pool *p;
	json_t *root, *v;
	size_t len, plen;

	fill(s, cval, val, n);
	p = &s->pools[0];
	for (int mem = 0; mem <= 1; mem++) {
		CHECK(gpud_stats_json(s, mem, buf, sizeof(buf), &len) == 0);
		root = parse(buf, len);
		check_string(json_object_get(root, "version"), cval, strlen(cval));
		v = json_array_get(json_object_get(root, "pools"), 0);
		check_string(json_object_get(v, "name"), p->name, name_len(p->name, sizeof(p->name)));
		check_string(json_object_get(v, "cache"), p->cache,
			     name_len(p->cache, sizeof(p->cache)));
		v = json_array_get(json_object_get(root, "caches"), 0);
		check_string(json_object_get(v, "name"), s->caches[0].name,
			     name_len(s->caches[0].name, sizeof(s->caches[0].name)));
		v = json_object_get(json_object_get(root, "watchdog"), "warnings");
		if (p->warning[0])
			check_string(json_array_get(v, 0), p->warning,
				     name_len(p->warning, sizeof(p->warning)));
		else
			CHECK(json_array_size(v) == 0);
		if (mem) {
			check_string(json_object_get(root, "dump"), cval, strlen(cval));
		} else {
			v = json_array_get(json_object_get(root, "devices"), 0);
			check_string(json_object_get(v, "name"), s->devices[0].name,
				     name_len(s->devices[0].name, sizeof(s->devices[0].name)));
		}
		json_decref(root);
	}

	CHECK(gpud_stats_prometheus(s, buf, sizeof(buf), &len) == 0);
	CHECK(valid_utf8(buf, len));
	/* The plain snapshot's line count, with and without a warning: the
	 * same for every input, so counted once. */
	static size_t plain_lines[2];
	bool warn = p->warning[0] != '\0';

	if (!plain_lines[warn]) {
		fill(plain, "v", "x", 1);
		if (!warn)
			plain->pools[0].warning[0] = '\0';
		CHECK(gpud_stats_prometheus(plain, plain_buf, sizeof(plain_buf), &plen) == 0);
		plain_lines[warn] = lines(plain_buf, plen);
	}
	CHECK(lines(buf, len) == plain_lines[warn]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t split, n, small_cap;
	char *key, *val, *cval;

	if (size < 2 || size > 65536)
		return 0;
	n = size - 2;
	split = data[0] % (n + 1);
	small_cap = data[1] & 0x7f;
	key = malloc(split + 1);
	val = malloc(n - split + 1);
	CHECK(key != NULL && val != NULL);
	memcpy(key, data + 2, split);
	key[split] = '\0';
	memcpy(val, data + 2 + split, n - split);
	val[n - split] = '\0';
	cval = val; /* up to its first NUL */
	check_writer(key, val, n - split, cval, small_cap);
	if (data[1] & 0x80) /* the stats writers' output is large: half the runs */
		check_stats(val, n - split, cval);
	free(key);
	free(val);
	return 0;
}
