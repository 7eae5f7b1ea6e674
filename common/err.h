/* err.h - error codes shared by every swarm module.
 *
 * Functions return 0 on success or a negative code: either a negated errno
 * value (-ENOMEM, -EINVAL, ...) or one of the SW_E* codes below, which live
 * below SW_EBASE so they never collide with errno. sw_strerror() names both.
 *
 * Where a caller needs to know *what* was wrong (a file offset, a JSON key
 * path), the function also takes `char *err, size_t errlen` and writes a
 * NUL-terminated message there; err may be NULL.
 */
#ifndef SW_ERR_H
#define SW_ERR_H

#include <stddef.h>

#define SW_EBASE (-4096)

/* The size of every error-message buffer a caller passes as (err, errlen).
 * The longest messages name a file (a model, a config, a socket: paths are
 * at most a few hundred bytes in practice) and wrap an inner message with
 * a line of context, so 1024 holds them whole; a longer one is cut short
 * by snprintf, never overflowed. A buffer that composes two messages is
 * sized as an expression of this one (2 * SW_ERR_MAX), not a new number. */
#define SW_ERR_MAX 1024

enum sw_err {
	SW_OK = 0,
	SW_EFORMAT = SW_EBASE - 1,      /* malformed input (file, frame, JSON) */
	SW_EUNSUPPORTED = SW_EBASE - 2, /* well-formed but not supported */
	SW_ETOOLONG = SW_EBASE - 3,     /* exceeds a configured limit */
	SW_EEXHAUSTED = SW_EBASE - 4,   /* fixed pool has no free block */
	SW_ENOTFOUND = SW_EBASE - 5,    /* key, tensor or entry absent */
	SW_ETYPE = SW_EBASE - 6,        /* present but of the wrong type */
	SW_EVERSION = SW_EBASE - 7,     /* protocol or file version mismatch */
	SW_EBUSY = SW_EBASE - 8,        /* queue limit reached; retry later */
	SW_ECANCELED = SW_EBASE - 9,    /* request was cancelled */
	SW_ECLOSED = SW_EBASE - 10,     /* peer or server went away */
	SW_EPINNED = SW_EBASE - 11,     /* entry is in use and cannot go */
	SW_EDEVICE = SW_EBASE - 12,     /* a device failed (a fault, a hang):
					 * what ran on it is lost, gpud exits
					 * for a restart; retry after it */
	/* New codes go here, at the end; never renumber. */
	SW_ELAST = SW_EBASE - 13,
};

/* Returns a static string for any code returned by a swarm function:
 * 0, a negated errno or an SW_E* value. Never NULL. */
const char *sw_strerror(int code);

/* Returns the symbolic name ("SW_EFORMAT", "ENOMEM") of a code; never NULL. */
const char *sw_errname(int code);

/* snprintf into err (when err is not NULL and errlen > 0) and return code,
 * so a failure path reads `return sw_seterr(err, errlen, SW_EFORMAT, ...)`. */
int sw_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
