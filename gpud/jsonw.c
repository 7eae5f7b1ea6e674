/* jsonw.c - the no-allocation JSON writer (gpud/jsonw.h). */
#include "gpud/jsonw.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"

void gpud_jsonw_init(struct gpud_jsonw *w, char *buf, size_t cap)
{
	memset(w, 0, sizeof(*w));
	w->buf = buf;
	w->cap = buf ? cap : 0;
	w->first[0] = true;
}

static void put(struct gpud_jsonw *w, const char *s, size_t n)
{
	if (w->overflow)
		return;
	if (n > w->cap - w->len) {
		w->overflow = true;
		return;
	}
	memcpy(w->buf + w->len, s, n);
	w->len += n;
}

static void putc_(struct gpud_jsonw *w, char c)
{
	put(w, &c, 1);
}

size_t gpud_u64_dec(char *out, uint64_t v)
{
	char tmp[20];
	size_t n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (size_t i = 0; i < n; i++)
		out[i] = tmp[n - 1 - i];
	return n;
}

size_t gpud_utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	unsigned char lo = 0x80, hi = 0xbf;
	size_t len;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4;
	else
		return 0;
	/* second-byte ranges that exclude overlongs, surrogates and > U+10FFFF */
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return len;
}

static void put_escaped(struct gpud_jsonw *w, const char *str, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	putc_(w, '"');
	while (i < n) {
		unsigned char c = s[i];
		size_t run = i;

		/* copy the longest plain run in one go */
		while (run < n && s[run] >= 0x20 && s[run] < 0x80 && s[run] != '"' &&
		       s[run] != '\\')
			run++;
		if (run > i) {
			put(w, (const char *)s + i, run - i);
			i = run;
			continue;
		}
		if (c == '"' || c == '\\') {
			char e[2] = { '\\', (char)c };
			put(w, e, 2);
			i++;
		} else if (c < 0x20) {
			char e[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };

			switch (c) {
			case '\n':
				put(w, "\\n", 2);
				break;
			case '\r':
				put(w, "\\r", 2);
				break;
			case '\t':
				put(w, "\\t", 2);
				break;
			case '\b':
				put(w, "\\b", 2);
				break;
			case '\f':
				put(w, "\\f", 2);
				break;
			default:
				put(w, e, 6);
			}
			i++;
		} else {
			size_t len = gpud_utf8_seq(s + i, n - i);

			if (len == 0) {
				put(w, "\\ufffd", 6);
				i++;
			} else {
				put(w, (const char *)s + i, len);
				i += len;
			}
		}
	}
	putc_(w, '"');
}

/* The comma and the key before a value. */
static void lead(struct gpud_jsonw *w, const char *key)
{
	if (!w->first[w->depth])
		putc_(w, ',');
	w->first[w->depth] = false;
	if (key) {
		put_escaped(w, key, strlen(key));
		putc_(w, ':');
	}
}

static void open_(struct gpud_jsonw *w, const char *key, char c)
{
	lead(w, key);
	putc_(w, c);
	if (w->depth == GPUD_JSONW_DEPTH) {
		w->bad = true;
		return;
	}
	w->first[++w->depth] = true;
}

static void close_(struct gpud_jsonw *w, char c)
{
	if (w->depth == 0) {
		w->bad = true;
		return;
	}
	w->depth--;
	putc_(w, c);
}

void gpud_jsonw_obj_begin(struct gpud_jsonw *w, const char *key)
{
	open_(w, key, '{');
}

void gpud_jsonw_obj_end(struct gpud_jsonw *w)
{
	close_(w, '}');
}

void gpud_jsonw_arr_begin(struct gpud_jsonw *w, const char *key)
{
	open_(w, key, '[');
}

void gpud_jsonw_arr_end(struct gpud_jsonw *w)
{
	close_(w, ']');
}

void gpud_jsonw_u64(struct gpud_jsonw *w, const char *key, uint64_t v)
{
	char d[20];

	lead(w, key);
	put(w, d, gpud_u64_dec(d, v));
}

void gpud_jsonw_f64(struct gpud_jsonw *w, const char *key, double v)
{
	char d[32];
	int n;

	if (!isfinite(v)) {
		gpud_jsonw_null(w, key);
		return;
	}
	lead(w, key);
	n = snprintf(d, sizeof(d), "%.9g", v);
	for (int i = 0; i < n; i++) /* a locale's decimal comma */
		if (d[i] == ',')
			d[i] = '.';
	put(w, d, (size_t)n);
}

void gpud_jsonw_bool(struct gpud_jsonw *w, const char *key, bool v)
{
	lead(w, key);
	if (v)
		put(w, "true", 4);
	else
		put(w, "false", 5);
}

void gpud_jsonw_null(struct gpud_jsonw *w, const char *key)
{
	lead(w, key);
	put(w, "null", 4);
}

void gpud_jsonw_strn(struct gpud_jsonw *w, const char *key, const char *s, size_t n)
{
	if (!s) {
		gpud_jsonw_null(w, key);
		return;
	}
	lead(w, key);
	put_escaped(w, s, n);
}

void gpud_jsonw_str(struct gpud_jsonw *w, const char *key, const char *s)
{
	gpud_jsonw_strn(w, key, s, s ? strlen(s) : 0);
}

int gpud_jsonw_finish(struct gpud_jsonw *w, size_t *len)
{
	*len = w->len;
	if (w->bad || w->depth != 0)
		return -EINVAL;
	if (w->overflow)
		return SW_ETOOLONG;
	return 0;
}
