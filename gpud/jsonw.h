/* jsonw.h - a small JSON writer into a caller buffer: no allocation,
 * proper string escaping, commas handled, overflow remembered.
 *
 * Every call appends one value (with its key inside an object, key NULL
 * at the top level and inside arrays). Once the buffer is full further
 * calls do nothing and gpud_jsonw_finish() returns SW_ETOOLONG. Nesting
 * deeper than GPUD_JSONW_DEPTH is an error reported the same way
 * (-EINVAL from finish).
 */
#ifndef GPUD_JSONW_H
#define GPUD_JSONW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPUD_JSONW_DEPTH 16

struct gpud_jsonw {
	char *buf;
	size_t cap, len;
	bool overflow;  /* something did not fit */
	bool bad;       /* nesting misuse */
	int depth;
	bool first[GPUD_JSONW_DEPTH + 1]; /* the next value at this depth is the first */
};

/* Starts writing into buf (cap bytes; may be 0). */
void gpud_jsonw_init(struct gpud_jsonw *w, char *buf, size_t cap);

void gpud_jsonw_obj_begin(struct gpud_jsonw *w, const char *key);
void gpud_jsonw_obj_end(struct gpud_jsonw *w);
void gpud_jsonw_arr_begin(struct gpud_jsonw *w, const char *key);
void gpud_jsonw_arr_end(struct gpud_jsonw *w);

void gpud_jsonw_u64(struct gpud_jsonw *w, const char *key, uint64_t v);
/* %.9g; NaN and infinities are written as null (JSON has neither). */
void gpud_jsonw_f64(struct gpud_jsonw *w, const char *key, double v);
void gpud_jsonw_bool(struct gpud_jsonw *w, const char *key, bool v);
void gpud_jsonw_null(struct gpud_jsonw *w, const char *key);
/* s NULL writes null. Escapes quotes, backslashes and control characters;
 * invalid UTF-8 bytes become U+FFFD so the output is always valid JSON. */
void gpud_jsonw_str(struct gpud_jsonw *w, const char *key, const char *s);
void gpud_jsonw_strn(struct gpud_jsonw *w, const char *key, const char *s, size_t n);

/* Returns 0 and the length written (not NUL-terminated), SW_ETOOLONG when
 * cap was too small (buf then holds a truncated prefix), -EINVAL when
 * objects/arrays were not balanced. */
int gpud_jsonw_finish(struct gpud_jsonw *w, size_t *len);

/* Length of the longest valid UTF-8 sequence at s (n bytes left): 1-4,
 * or 0 when the byte at s does not start a valid sequence. Shared with
 * the Prometheus writer. */
size_t gpud_utf8_seq(const unsigned char *s, size_t n);

/* Decimal digits of v into out (at least 20 bytes); returns the count. */
size_t gpud_u64_dec(char *out, uint64_t v);

#endif
