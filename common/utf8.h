/* utf8.h - UTF-8 validation: the one decoder of "is this a character"
 * that the front's JSON, agentd's ingest and the fuzz targets share.
 *
 * Valid means RFC 3629: one to four bytes, no overlong forms, no UTF-16
 * surrogates (U+D800..U+DFFF), nothing past U+10FFFF. Pure functions.
 */
#ifndef SW_UTF8_H
#define SW_UTF8_H

#include <stddef.h>

/* Length (1..4) of the valid UTF-8 character that starts s[0, n), or 0
 * when s[0] does not start one or it does not fit in n. n >= 1. A NUL
 * byte is a valid one-byte character here; callers that refuse NULs
 * check for them. */
size_t sw_utf8_char(const unsigned char *s, size_t n);

/* Offset of the first byte of s[0, n) that is not part of a valid
 * character (NUL counts as valid), or n when all of it is valid. */
size_t sw_utf8_invalid_at(const unsigned char *s, size_t n);

#endif
