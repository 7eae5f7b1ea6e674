/* unicode.c - UTF-8 decoding and encoding (classes are in unicode_data.c). */
#include "gpud/unicode.h"

/* Valid range of the second byte for each lead byte (RFC 3629 table);
 * later continuation bytes are always 0x80..0xBF. */
static bool second_ok(uint8_t lead, uint8_t c)
{
	switch (lead) {
	case 0xE0:
		return c >= 0xA0 && c <= 0xBF;
	case 0xED:
		return c >= 0x80 && c <= 0x9F;
	case 0xF0:
		return c >= 0x90 && c <= 0xBF;
	case 0xF4:
		return c >= 0x80 && c <= 0x8F;
	default:
		return c >= 0x80 && c <= 0xBF;
	}
}

size_t gpud_utf8_seq_len(uint8_t c)
{
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		return 2;
	if (c >= 0xE0 && c <= 0xEF)
		return 3;
	if (c >= 0xF0 && c <= 0xF4)
		return 4;
	return 0;
}

size_t gpud_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp)
{
	size_t n = gpud_utf8_seq_len(s[0]);

	if (n == 1) {
		*cp = s[0];
		return 1;
	}
	if (n == 0 || n > len || !second_ok(s[0], s[1]))
		goto bad;
	for (size_t i = 2; i < n; i++)
		if ((s[i] & 0xC0) != 0x80)
			goto bad;
	switch (n) {
	case 2:
		*cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
		break;
	case 3:
		*cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) |
		      (s[2] & 0x3F);
		break;
	default:
		*cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
		      ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
		break;
	}
	return n;
bad:
	*cp = GPUD_UC_REPLACEMENT;
	return 1;
}

size_t gpud_utf8_encode(uint32_t cp, uint8_t out[4])
{
	if (cp > GPUD_UC_MAX || (cp >= 0xD800 && cp <= 0xDFFF))
		cp = GPUD_UC_REPLACEMENT;
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xC0 | (cp >> 6));
		out[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t)(0xE0 | (cp >> 12));
		out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		out[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	out[0] = (uint8_t)(0xF0 | (cp >> 18));
	out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
	out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
	out[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}

bool gpud_utf8_is_partial(const uint8_t *s, size_t len)
{
	size_t n = gpud_utf8_seq_len(s[0]);

	if (n < 2 || len >= n)
		return false;
	if (len >= 2 && !second_ok(s[0], s[1]))
		return false;
	for (size_t i = 2; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return false;
	return true;
}
