/* addr.h - IP address classes and CIDR allow lists: which addresses an
 * outgoing connection of the swarm may reach (DESIGN §6a).
 *
 * agentd's fetches and callbacks refuse, by default, every address that
 * is not a public unicast one: a task must not make a worker reach the
 * node itself, the cloud metadata service or the private network.
 * sw_addr_classify() names the class of an address; a configured list of
 * CIDRs (agentd.fetch.allow_cidrs) opens specific ranges again.
 *
 * IPv6 forms that carry an IPv4 address are classified (and matched
 * against the allow list) as that IPv4 address: IPv4-mapped
 * ::ffff:a.b.c.d, IPv4-translated ::ffff:0:a.b.c.d, the deprecated
 * IPv4-compatible ::a.b.c.d and the NAT64 well-known prefix
 * 64:ff9b::a.b.c.d. So ::ffff:127.0.0.1 is loopback and 127.0.0.1/32
 * allows it.
 *
 * Nothing here opens a socket or resolves a name; the functions are pure
 * and thread-safe.
 */
#ifndef SW_ADDR_H
#define SW_ADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define SW_CIDR_STR_MAX 64 /* longest CIDR text accepted, with its NUL */
#define SW_ADDR_STR_MAX 64 /* sw_addr_format's output, with its NUL */

/* Address classes; every one but SW_ADDR_PUBLIC is denied by default. */
enum sw_addr_class {
	SW_ADDR_PUBLIC = 0,    /* global unicast */
	SW_ADDR_UNSPECIFIED,   /* 0.0.0.0, :: */
	SW_ADDR_LOOPBACK,      /* 127/8, ::1 */
	SW_ADDR_LINK_LOCAL,    /* 169.254/16 (cloud metadata), fe80::/10 */
	SW_ADDR_PRIVATE,       /* 10/8, 172.16/12, 192.168/16, fec0::/10 */
	SW_ADDR_SHARED,        /* 100.64/10, carrier-grade NAT */
	SW_ADDR_UNIQUE_LOCAL,  /* fc00::/7 */
	SW_ADDR_MULTICAST,     /* 224/4, ff00::/8 */
	SW_ADDR_BROADCAST,     /* 255.255.255.255 */
	SW_ADDR_RESERVED,      /* 0/8, 192.0.0/24, documentation, 198.18/15
				* benchmarking, 240/4, 100::/64, 2001:db8::/32,
				* other ::/96 and ::ffff:0:0/96 forms */
	SW_ADDR_NOT_IP,        /* not AF_INET or AF_INET6, or too short */
};

/* An IPv4 or IPv6 network. IPv4 is kept in the first 4 bytes of addr. */
struct sw_cidr {
	int family;            /* AF_INET or AF_INET6 */
	uint8_t addr[16];      /* network address, host bits zero */
	unsigned prefix;       /* 0..32 or 0..128 */
};

/* Parses "a.b.c.d/N", "x:y::z/N" or a bare address (a host: /32 or
 * /128) into *out. IPv4 must be dotted quad (no 0x7f000001, 127.1 or
 * leading zeros); an IPv4-mapped IPv6 network with a prefix of at least
 * 96 (::ffff:10.0.0.0/104) becomes the IPv4 network. Host bits must be
 * zero ("10.0.0.1/8" is an error that names 10.0.0.0/8). Returns 0, or
 * -EINVAL with a message in err naming the text and what is wrong; *out
 * is unchanged on error. err may be NULL. */
int sw_cidr_parse(const char *s, struct sw_cidr *out, char *err, size_t errlen);

/* The class of the address in sa (len bytes: a struct sockaddr_in or
 * sockaddr_in6); SW_ADDR_NOT_IP for anything else. */
enum sw_addr_class sw_addr_classify(const struct sockaddr *sa, size_t len);

/* "a private address", "a loopback address", ... for messages; "a public
 * address" for SW_ADDR_PUBLIC. Never NULL. */
const char *sw_addr_class_name(enum sw_addr_class c);

/* True when the address lies inside c (embedded IPv4 forms as IPv4). */
bool sw_cidr_contains(const struct sw_cidr *c, const struct sockaddr *sa, size_t len);

/* The connection rule: true when sa is public, or inside one of the n
 * allow entries. *cls (may be NULL) receives the class either way. */
bool sw_addr_allowed(const struct sockaddr *sa, size_t len, const struct sw_cidr *allow,
		     size_t n, enum sw_addr_class *cls);

/* The address as text (no port): "10.0.0.5", "::1", "::ffff:10.0.0.5";
 * "?" when it is not IP. Always NUL-terminates when outlen > 0. */
void sw_addr_format(const struct sockaddr *sa, size_t len, char *out, size_t outlen);

#endif
