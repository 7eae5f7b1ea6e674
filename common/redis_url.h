/* redis_url.h - parses a Redis address into a plain struct (no hiredis). */
#ifndef SW_REDIS_URL_H
#define SW_REDIS_URL_H

#include <stdbool.h>
#include <stddef.h>

#define SW_REDIS_URL_HOST_MAX 256
#define SW_REDIS_URL_USER_MAX 256
#define SW_REDIS_URL_PASSWORD_MAX 256
#define SW_REDIS_URL_PATH_MAX 1024
#define SW_REDIS_URL_DEFAULT_PORT 6379
#define SW_REDIS_URL_DB_MAX 1000000

/* One Redis address. Either unix_path is set (unix://) or host is. */
struct sw_redis_url {
	bool tls;                                  /* rediss:// */
	char host[SW_REDIS_URL_HOST_MAX];          /* "" for unix:// */
	int port;                                  /* 1..65535, 6379 by default */
	int db;                                    /* 0..SW_REDIS_URL_DB_MAX, 0 by default */
	char user[SW_REDIS_URL_USER_MAX];          /* ACL user, "" when none */
	char password[SW_REDIS_URL_PASSWORD_MAX];  /* "" when none */
	char unix_path[SW_REDIS_URL_PATH_MAX];     /* "" unless unix:// */
};

/*
 * Parses redis://[[user][:password]@]host[:port][/db], the same with
 * rediss:// (sets tls), or unix:///absolute/path into *out. host is a name,
 * an IPv4 address or an IPv6 one in brackets ([::1]); an empty "/"
 * database means 0. The user name and the password are percent-decoded
 * (RFC 3986: %40 is '@', %2F '/'); a '%' not followed by two hex digits
 * stays a '%', so a password written without encoding keeps working. The
 * userinfo ends at the last '@' before the path, so an unencoded password
 * may hold '@' and ':' but not '/'. A user name is Redis 6's ACL user:
 * clients send AUTH user password (AUTH password without one; no AUTH
 * without a password). Returns 0, or -EINVAL with a message in err naming
 * what is wrong: no URL, another scheme, an empty or too long socket path,
 * a too long user name or password or one with %00, a missing, bad or too
 * long host, a bad port, a bad database number, a query or fragment
 * (?, #: not supported). The message never echoes the URL (it may hold a
 * password). On error *out is zeroed except for the default port; url is
 * only read.
 */
int sw_redis_url_parse(const char *url, struct sw_redis_url *out, char *err, size_t errlen);

#endif
