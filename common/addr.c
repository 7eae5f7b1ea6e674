/* addr.c - IP address classes and CIDR matching (see addr.h).
 *
 * Every address is first normalized: an IPv6 address that carries an
 * IPv4 one (mapped, translated, compatible, NAT64) becomes that IPv4
 * address, so each rule is written once, for IPv4, and no spelling of
 * 127.0.0.1 escapes it.
 */
#include "common/addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"

/* An address reduced to its family and bytes (IPv4 in the first 4). */
struct norm {
	int family;
	uint8_t b[16];
};

static const uint8_t zero12[12];

/* True when the first 96 bits of b are a prefix that carries an IPv4
 * address in the last 32: mapped, translated or NAT64 (not the
 * IPv4-compatible ::/96, which also holds :: and ::1). */
static bool v4_prefix(const uint8_t *b)
{
	static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	static const uint8_t translated[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0 };
	static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0 };

	return !memcmp(b, mapped, 12) || !memcmp(b, translated, 12) || !memcmp(b, nat64, 12);
}

/* The IPv4 address an IPv6 one carries, if any: true and b4 filled. */
static bool embedded_v4(const uint8_t *b, uint8_t *b4)
{
	bool compat = !memcmp(b, zero12, 12) &&
		      (b[12] | b[13] | b[14] | (b[15] & 0xfe)) != 0; /* not :: or ::1 */

	if (compat || v4_prefix(b)) {
		memcpy(b4, b + 12, 4);
		return true;
	}
	return false;
}

static bool normalize(const struct sockaddr *sa, size_t len, struct norm *n)
{
	memset(n, 0, sizeof(*n));
	if (!sa)
		return false;
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		n->family = AF_INET;
		memcpy(n->b, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return true;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;

		if (embedded_v4(b, n->b)) {
			n->family = AF_INET;
		} else {
			n->family = AF_INET6;
			memcpy(n->b, b, 16);
		}
		return true;
	}
	return false;
}

/* True when the first bits of a and b agree. */
static bool prefix_eq(const uint8_t *a, const uint8_t *b, unsigned bits)
{
	unsigned full = bits / 8, rest = bits % 8;

	if (memcmp(a, b, full))
		return false;
	if (!rest)
		return true;
	return ((a[full] ^ b[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

struct range {
	uint8_t net[16];
	unsigned prefix;
	enum sw_addr_class cls;
};

/* First match wins: the narrow ranges come before the wide ones. */
static const struct range v4_ranges[] = {
	{ { 0, 0, 0, 0 }, 32, SW_ADDR_UNSPECIFIED },
	{ { 255, 255, 255, 255 }, 32, SW_ADDR_BROADCAST },
	{ { 0 }, 8, SW_ADDR_RESERVED },              /* "this network" */
	{ { 10 }, 8, SW_ADDR_PRIVATE },
	{ { 100, 64 }, 10, SW_ADDR_SHARED },
	{ { 127 }, 8, SW_ADDR_LOOPBACK },
	{ { 169, 254 }, 16, SW_ADDR_LINK_LOCAL },
	{ { 172, 16 }, 12, SW_ADDR_PRIVATE },
	{ { 192, 0, 0 }, 24, SW_ADDR_RESERVED },     /* IETF protocol assignments */
	{ { 192, 0, 2 }, 24, SW_ADDR_RESERVED },     /* documentation */
	{ { 192, 168 }, 16, SW_ADDR_PRIVATE },
	{ { 198, 18 }, 15, SW_ADDR_RESERVED },       /* benchmarking */
	{ { 198, 51, 100 }, 24, SW_ADDR_RESERVED },  /* documentation */
	{ { 203, 0, 113 }, 24, SW_ADDR_RESERVED },   /* documentation */
	{ { 224 }, 4, SW_ADDR_MULTICAST },
	{ { 240 }, 4, SW_ADDR_RESERVED },
};

static const struct range v6_ranges[] = {
	{ { 0 }, 128, SW_ADDR_UNSPECIFIED },
	{ { [15] = 1 }, 128, SW_ADDR_LOOPBACK },
	{ { 0 }, 8, SW_ADDR_RESERVED },                          /* the rest of ::/8 */
	{ { 0, 0x64, 0xff, 0x9b, 0, 1 }, 48, SW_ADDR_RESERVED },  /* local-use NAT64 */
	{ { 0x01 }, 64, SW_ADDR_RESERVED },                      /* 100::/64 discard */
	{ { 0x20, 0x01, 0x0d, 0xb8 }, 32, SW_ADDR_RESERVED },     /* documentation */
	{ { 0xfc }, 7, SW_ADDR_UNIQUE_LOCAL },
	{ { 0xfe, 0x80 }, 10, SW_ADDR_LINK_LOCAL },
	{ { 0xfe, 0xc0 }, 10, SW_ADDR_PRIVATE },                  /* site-local */
	{ { 0xff }, 8, SW_ADDR_MULTICAST },
};

enum sw_addr_class sw_addr_classify(const struct sockaddr *sa, size_t len)
{
	const struct range *r, *end;
	struct norm n;

	if (!normalize(sa, len, &n))
		return SW_ADDR_NOT_IP;
	if (n.family == AF_INET) {
		r = v4_ranges;
		end = r + sizeof(v4_ranges) / sizeof(v4_ranges[0]);
	} else {
		r = v6_ranges;
		end = r + sizeof(v6_ranges) / sizeof(v6_ranges[0]);
	}
	for (; r < end; r++)
		if (prefix_eq(n.b, r->net, r->prefix))
			return r->cls;
	return SW_ADDR_PUBLIC;
}

const char *sw_addr_class_name(enum sw_addr_class c)
{
	switch (c) {
	case SW_ADDR_PUBLIC:
		return "a public address";
	case SW_ADDR_UNSPECIFIED:
		return "the unspecified address";
	case SW_ADDR_LOOPBACK:
		return "a loopback address";
	case SW_ADDR_LINK_LOCAL:
		return "a link-local address";
	case SW_ADDR_PRIVATE:
		return "a private address";
	case SW_ADDR_SHARED:
		return "a private (carrier-grade NAT) address";
	case SW_ADDR_UNIQUE_LOCAL:
		return "a unique-local address";
	case SW_ADDR_MULTICAST:
		return "a multicast address";
	case SW_ADDR_BROADCAST:
		return "the broadcast address";
	case SW_ADDR_RESERVED:
		return "a reserved address";
	case SW_ADDR_NOT_IP:
		break;
	}
	return "not an IP address";
}

bool sw_cidr_contains(const struct sw_cidr *c, const struct sockaddr *sa, size_t len)
{
	struct norm n;

	if (!c || !normalize(sa, len, &n) || n.family != c->family)
		return false;
	return prefix_eq(n.b, c->addr, c->prefix);
}

bool sw_addr_allowed(const struct sockaddr *sa, size_t len, const struct sw_cidr *allow,
		     size_t n, enum sw_addr_class *cls)
{
	enum sw_addr_class c = sw_addr_classify(sa, len);

	if (cls)
		*cls = c;
	if (c == SW_ADDR_NOT_IP)
		return false;
	if (c == SW_ADDR_PUBLIC)
		return true;
	for (size_t i = 0; i < n; i++)
		if (sw_cidr_contains(&allow[i], sa, len))
			return true;
	return false;
}

void sw_addr_format(const struct sockaddr *sa, size_t len, char *out, size_t outlen)
{
	char buf[INET6_ADDRSTRLEN] = "?";

	if (outlen == 0)
		return;
	if (sa && sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in))
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, sizeof(buf));
	else if (sa && sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6))
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, sizeof(buf));
	snprintf(out, outlen, "%s", buf);
}

int sw_cidr_parse(const char *s, struct sw_cidr *out, char *err, size_t errlen)
{
	char text[SW_CIDR_STR_MAX], fix[SW_CIDR_STR_MAX + 8];
	struct sw_cidr c = { 0 };
	const char *slash;
	unsigned max, prefix = 0;
	size_t alen;

	if (!s || !*s)
		return sw_seterr(err, errlen, -EINVAL,
				 "\"\": expected an address or ADDRESS/PREFIX (10.0.0.0/8, fd00::/8)");
	if (strlen(s) >= sizeof(text))
		return sw_seterr(err, errlen, -EINVAL, "\"%.40s...\": longer than %d bytes", s,
				 SW_CIDR_STR_MAX - 1);
	slash = strchr(s, '/');
	alen = slash ? (size_t)(slash - s) : strlen(s);
	memcpy(text, s, alen);
	text[alen] = '\0';
	if (inet_pton(AF_INET, text, c.addr) == 1) {
		c.family = AF_INET;
		max = 32;
	} else if (strchr(text, ':') && inet_pton(AF_INET6, text, c.addr) == 1) {
		c.family = AF_INET6;
		max = 128;
	} else {
		return sw_seterr(err, errlen, -EINVAL,
				 "\"%s\": \"%s\" is not an IPv4 address (a.b.c.d) or an IPv6 address",
				 s, text);
	}
	if (!slash) {
		prefix = max;
	} else {
		const char *p = slash + 1;

		if (!*p || strlen(p) > 3 || (p[0] == '0' && p[1]))
			return sw_seterr(err, errlen, -EINVAL,
					 "\"%s\": expected a prefix length 0..%u after '/'", s, max);
		for (; *p; p++) {
			if (*p < '0' || *p > '9')
				return sw_seterr(err, errlen, -EINVAL,
						 "\"%s\": expected a prefix length 0..%u after '/'", s,
						 max);
			prefix = prefix * 10 + (unsigned)(*p - '0');
		}
		if (prefix > max)
			return sw_seterr(err, errlen, -EINVAL,
					 "\"%s\": prefix length %u is above %u", s, prefix, max);
	}
	c.prefix = prefix;
	{
		uint8_t net[16] = { 0 };
		unsigned full = prefix / 8, rest = prefix % 8;

		memcpy(net, c.addr, full);
		if (rest)
			net[full] = c.addr[full] & (uint8_t)(0xff << (8 - rest));
		if (memcmp(net, c.addr, 16)) {
			char a[INET6_ADDRSTRLEN];

			inet_ntop(c.family, net, a, sizeof(a));
			snprintf(fix, sizeof(fix), "%s/%u", a, prefix);
			return sw_seterr(err, errlen, -EINVAL,
					 "\"%s\": host bits are set (did you mean %s?)", s, fix);
		}
	}
	/* ::ffff:a.b.c.d/N (N >= 96; also the translated and NAT64 forms)
	 * is an IPv4 network: addresses are matched in their IPv4 form. */
	if (c.family == AF_INET6 && prefix >= 96 && v4_prefix(c.addr)) {
		memmove(c.addr, c.addr + 12, 4);
		memset(c.addr + 4, 0, 12);
		c.family = AF_INET;
		c.prefix = prefix - 96;
	}
	*out = c;
	return 0;
}
