/* err.c - error code names and messages. */
#include "common/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
	int code;
	const char *name;
	const char *msg;
} sw_errs[] = {
	{ SW_OK, "SW_OK", "success" },
	{ SW_EFORMAT, "SW_EFORMAT", "malformed input" },
	{ SW_EUNSUPPORTED, "SW_EUNSUPPORTED", "not supported" },
	{ SW_ETOOLONG, "SW_ETOOLONG", "exceeds a configured limit" },
	{ SW_EEXHAUSTED, "SW_EEXHAUSTED", "pool exhausted" },
	{ SW_ENOTFOUND, "SW_ENOTFOUND", "not found" },
	{ SW_ETYPE, "SW_ETYPE", "wrong type" },
	{ SW_EVERSION, "SW_EVERSION", "version mismatch" },
	{ SW_EBUSY, "SW_EBUSY", "busy, retry later" },
	{ SW_ECANCELED, "SW_ECANCELED", "canceled" },
	{ SW_ECLOSED, "SW_ECLOSED", "connection closed" },
	{ SW_EPINNED, "SW_EPINNED", "entry is pinned" },
	{ SW_EDEVICE, "SW_EDEVICE", "device failed" },
};

const char *sw_strerror(int code)
{
	for (size_t i = 0; i < sizeof(sw_errs) / sizeof(sw_errs[0]); i++)
		if (sw_errs[i].code == code)
			return sw_errs[i].msg;
	if (code < 0 && code > SW_EBASE)
		return strerror(-code); /* glibc: static for known codes */
	return "unknown error";
}

const char *sw_errname(int code)
{
	for (size_t i = 0; i < sizeof(sw_errs) / sizeof(sw_errs[0]); i++)
		if (sw_errs[i].code == code)
			return sw_errs[i].name;
	if (code < 0 && code > SW_EBASE) {
		const char *n = strerrorname_np(-code);
		if (n)
			return n;
	}
	return "SW_EUNKNOWN";
}

int sw_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}
