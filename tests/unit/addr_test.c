/* addr_test.c - common/addr.c: the class of every denied range and its
 * edges (the address just inside and just outside), the IPv6 forms that
 * carry an IPv4 address, CIDR parsing (good, bad, host bits, mapped) and
 * the allow rule. Addresses are built from text with inet_pton: no
 * socket is opened and nothing is sent anywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "common/addr.h"
#include "common/err.h"

static char err[SW_ERR_MAX];

/* A sockaddr for the address text (IPv4 if it parses as such). */
static const struct sockaddr *sa(const char *text, size_t *len)
{
	static struct sockaddr_storage ss;

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, text, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		ss.ss_family = AF_INET;
		*len = sizeof(struct sockaddr_in);
	} else if (inet_pton(AF_INET6, text, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		ss.ss_family = AF_INET6;
		*len = sizeof(struct sockaddr_in6);
	} else {
		fail_msg("bad test address %s", text);
	}
	return (const struct sockaddr *)&ss;
}

static enum sw_addr_class cls(const char *text)
{
	size_t len;
	const struct sockaddr *a = sa(text, &len);

	return sw_addr_classify(a, len);
}

#define EXPECT_CLASS(text, c)                                                            \
	do {                                                                             \
		if (cls(text) != (c))                                                    \
			fail_msg("%s: class %d (%s), expected %d (%s)", text, cls(text), \
				 sw_addr_class_name(cls(text)), c, sw_addr_class_name(c));  \
	} while (0)

static void test_ipv4_ranges(void **state)
{
	(void)state;
	static const struct {
		const char *addr;
		enum sw_addr_class c;
	} cases[] = {
		{ "0.0.0.0", SW_ADDR_UNSPECIFIED },
		{ "0.0.0.1", SW_ADDR_RESERVED },
		{ "0.255.255.255", SW_ADDR_RESERVED },
		{ "1.0.0.0", SW_ADDR_PUBLIC },
		{ "9.255.255.255", SW_ADDR_PUBLIC },
		{ "10.0.0.0", SW_ADDR_PRIVATE },
		{ "10.0.0.5", SW_ADDR_PRIVATE },
		{ "10.255.255.255", SW_ADDR_PRIVATE },
		{ "11.0.0.0", SW_ADDR_PUBLIC },
		{ "100.63.255.255", SW_ADDR_PUBLIC },
		{ "100.64.0.0", SW_ADDR_SHARED },
		{ "100.127.255.255", SW_ADDR_SHARED },
		{ "100.128.0.0", SW_ADDR_PUBLIC },
		{ "126.255.255.255", SW_ADDR_PUBLIC },
		{ "127.0.0.0", SW_ADDR_LOOPBACK },
		{ "127.0.0.1", SW_ADDR_LOOPBACK },
		{ "127.0.0.2", SW_ADDR_LOOPBACK },
		{ "127.255.255.255", SW_ADDR_LOOPBACK },
		{ "128.0.0.0", SW_ADDR_PUBLIC },
		{ "169.253.255.255", SW_ADDR_PUBLIC },
		{ "169.254.0.0", SW_ADDR_LINK_LOCAL },
		{ "169.254.169.254", SW_ADDR_LINK_LOCAL },
		{ "169.254.255.255", SW_ADDR_LINK_LOCAL },
		{ "169.255.0.0", SW_ADDR_PUBLIC },
		{ "172.15.255.255", SW_ADDR_PUBLIC },
		{ "172.16.0.0", SW_ADDR_PRIVATE },
		{ "172.31.255.255", SW_ADDR_PRIVATE },
		{ "172.32.0.0", SW_ADDR_PUBLIC },
		{ "192.0.0.0", SW_ADDR_RESERVED },
		{ "192.0.0.255", SW_ADDR_RESERVED },
		{ "192.0.1.0", SW_ADDR_PUBLIC },
		{ "192.0.2.1", SW_ADDR_RESERVED },
		{ "192.0.3.0", SW_ADDR_PUBLIC },
		{ "192.167.255.255", SW_ADDR_PUBLIC },
		{ "192.168.0.0", SW_ADDR_PRIVATE },
		{ "192.168.255.255", SW_ADDR_PRIVATE },
		{ "192.169.0.0", SW_ADDR_PUBLIC },
		{ "198.17.255.255", SW_ADDR_PUBLIC },
		{ "198.18.0.0", SW_ADDR_RESERVED },
		{ "198.19.255.255", SW_ADDR_RESERVED },
		{ "198.20.0.0", SW_ADDR_PUBLIC },
		{ "198.51.100.7", SW_ADDR_RESERVED },
		{ "203.0.113.7", SW_ADDR_RESERVED },
		{ "203.0.114.0", SW_ADDR_PUBLIC },
		{ "8.8.8.8", SW_ADDR_PUBLIC },
		{ "223.255.255.255", SW_ADDR_PUBLIC },
		{ "224.0.0.0", SW_ADDR_MULTICAST },
		{ "239.255.255.255", SW_ADDR_MULTICAST },
		{ "240.0.0.0", SW_ADDR_RESERVED },
		{ "255.255.255.254", SW_ADDR_RESERVED },
		{ "255.255.255.255", SW_ADDR_BROADCAST },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		EXPECT_CLASS(cases[i].addr, cases[i].c);
}

static void test_ipv6_ranges(void **state)
{
	(void)state;
	static const struct {
		const char *addr;
		enum sw_addr_class c;
	} cases[] = {
		{ "::", SW_ADDR_UNSPECIFIED },
		{ "::1", SW_ADDR_LOOPBACK },
		{ "::1:0:0:0", SW_ADDR_RESERVED },
		{ "ff:ffff::", SW_ADDR_RESERVED },
		{ "100::", SW_ADDR_RESERVED },
		{ "100::ffff:ffff:ffff:ffff", SW_ADDR_RESERVED },
		{ "100:0:0:1::", SW_ADDR_PUBLIC },
		{ "2001:db8::1", SW_ADDR_RESERVED },
		{ "2001:db9::1", SW_ADDR_PUBLIC },
		{ "2606:4700::1111", SW_ADDR_PUBLIC },
		{ "64:ff9b:1::1", SW_ADDR_RESERVED },
		{ "fbff:ffff::", SW_ADDR_PUBLIC },
		{ "fc00::", SW_ADDR_UNIQUE_LOCAL },
		{ "fd12:3456::1", SW_ADDR_UNIQUE_LOCAL },
		{ "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", SW_ADDR_UNIQUE_LOCAL },
		{ "fe00::", SW_ADDR_PUBLIC },
		{ "fe7f:ffff::", SW_ADDR_PUBLIC },
		{ "fe80::", SW_ADDR_LINK_LOCAL },
		{ "fe80::1", SW_ADDR_LINK_LOCAL },
		{ "febf:ffff::", SW_ADDR_LINK_LOCAL },
		{ "fec0::", SW_ADDR_PRIVATE },
		{ "feff:ffff::", SW_ADDR_PRIVATE },
		{ "ff00::", SW_ADDR_MULTICAST },
		{ "ff02::1", SW_ADDR_MULTICAST },
		{ "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", SW_ADDR_MULTICAST },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		EXPECT_CLASS(cases[i].addr, cases[i].c);
}

/* Every IPv6 spelling of an IPv4 address is that address. */
static void test_embedded_ipv4(void **state)
{
	(void)state;
	EXPECT_CLASS("::ffff:127.0.0.1", SW_ADDR_LOOPBACK);
	EXPECT_CLASS("::ffff:7f00:2", SW_ADDR_LOOPBACK);
	EXPECT_CLASS("::ffff:10.0.0.5", SW_ADDR_PRIVATE);
	EXPECT_CLASS("::ffff:169.254.169.254", SW_ADDR_LINK_LOCAL);
	EXPECT_CLASS("::ffff:0.0.0.0", SW_ADDR_UNSPECIFIED);
	EXPECT_CLASS("::ffff:255.255.255.255", SW_ADDR_BROADCAST);
	EXPECT_CLASS("::ffff:8.8.8.8", SW_ADDR_PUBLIC);
	EXPECT_CLASS("::ffff:0:192.168.1.1", SW_ADDR_PRIVATE);   /* translated */
	EXPECT_CLASS("::127.0.0.1", SW_ADDR_LOOPBACK);           /* compatible */
	EXPECT_CLASS("::172.16.0.1", SW_ADDR_PRIVATE);
	EXPECT_CLASS("::0.0.0.2", SW_ADDR_RESERVED);
	EXPECT_CLASS("64:ff9b::127.0.0.1", SW_ADDR_LOOPBACK);    /* NAT64 */
	EXPECT_CLASS("64:ff9b::100.64.0.1", SW_ADDR_SHARED);
	EXPECT_CLASS("64:ff9b::8.8.4.4", SW_ADDR_PUBLIC);
	/* Not embedding forms: the IPv6 rules apply. */
	EXPECT_CLASS("::fffe:127.0.0.1", SW_ADDR_RESERVED);
	EXPECT_CLASS("2400::ffff:127.0.0.1", SW_ADDR_PUBLIC);
}

static void test_not_ip(void **state)
{
	(void)state;
	struct sockaddr_un_like {
		sa_family_t family;
		char path[108];
	} un = { .family = AF_UNIX };
	struct sockaddr_in in = { .sin_family = AF_INET };

	assert_int_equal(sw_addr_classify((const struct sockaddr *)&un, sizeof(un)),
			 SW_ADDR_NOT_IP);
	assert_int_equal(sw_addr_classify(NULL, 0), SW_ADDR_NOT_IP);
	/* too short for its family */
	assert_int_equal(sw_addr_classify((const struct sockaddr *)&in, sizeof(in) - 1),
			 SW_ADDR_NOT_IP);
	assert_false(sw_addr_allowed((const struct sockaddr *)&un, sizeof(un), NULL, 0, NULL));
	assert_string_equal(sw_addr_class_name(SW_ADDR_NOT_IP), "not an IP address");
	assert_string_equal(sw_addr_class_name(SW_ADDR_PRIVATE), "a private address");
	assert_string_equal(sw_addr_class_name(SW_ADDR_LOOPBACK), "a loopback address");
}

static void parse_ok(const char *text, int family, const char *net, unsigned prefix)
{
	struct sw_cidr c;
	uint8_t want[16] = { 0 };
	int rc = sw_cidr_parse(text, &c, err, sizeof(err));

	if (rc)
		fail_msg("%s: %s", text, err);
	assert_int_equal(c.family, family);
	assert_int_equal(c.prefix, prefix);
	assert_int_equal(inet_pton(family, net, want), 1);
	assert_memory_equal(c.addr, want, family == AF_INET ? 4 : 16);
}

static void parse_bad(const char *text, const char *msg)
{
	struct sw_cidr c = { .family = 77 };

	assert_int_equal(sw_cidr_parse(text, &c, err, sizeof(err)), -EINVAL);
	if (strcmp(err, msg))
		fail_msg("%s: got \"%s\", expected \"%s\"", text, err, msg);
	assert_int_equal(c.family, 77); /* unchanged */
}

static void test_cidr_parse(void **state)
{
	(void)state;
	parse_ok("127.0.0.1/32", AF_INET, "127.0.0.1", 32);
	parse_ok("127.0.0.1", AF_INET, "127.0.0.1", 32);
	parse_ok("10.0.0.0/8", AF_INET, "10.0.0.0", 8);
	parse_ok("0.0.0.0/0", AF_INET, "0.0.0.0", 0);
	parse_ok("172.16.0.0/12", AF_INET, "172.16.0.0", 12);
	parse_ok("::1/128", AF_INET6, "::1", 128);
	parse_ok("::1", AF_INET6, "::1", 128);
	parse_ok("fd00::/8", AF_INET6, "fd00::", 8);
	parse_ok("::/0", AF_INET6, "::", 0);
	/* IPv4 inside IPv6 notation is an IPv4 network */
	parse_ok("::ffff:10.0.0.0/104", AF_INET, "10.0.0.0", 8);
	parse_ok("::ffff:127.0.0.1", AF_INET, "127.0.0.1", 32);
	parse_ok("64:ff9b::a00:0/120", AF_INET, "10.0.0.0", 24);
	parse_ok("::ffff:0:0/96", AF_INET, "0.0.0.0", 0);
	parse_ok("64:ff9b::/96", AF_INET, "0.0.0.0", 0);
	parse_ok("::fffe:0:0/95", AF_INET6, "::fffe:0:0", 95); /* shorter: stays IPv6 */

	parse_bad("", "\"\": expected an address or ADDRESS/PREFIX (10.0.0.0/8, fd00::/8)");
	parse_bad(NULL, "\"\": expected an address or ADDRESS/PREFIX (10.0.0.0/8, fd00::/8)");
	parse_bad("localhost", "\"localhost\": \"localhost\" is not an IPv4 address (a.b.c.d) or "
			       "an IPv6 address");
	parse_bad("0x7f000001/32",
		  "\"0x7f000001/32\": \"0x7f000001\" is not an IPv4 address (a.b.c.d) or an IPv6 "
		  "address");
	parse_bad("127.1", "\"127.1\": \"127.1\" is not an IPv4 address (a.b.c.d) or an IPv6 "
			   "address");
	parse_bad("010.0.0.0/8", "\"010.0.0.0/8\": \"010.0.0.0\" is not an IPv4 address "
				 "(a.b.c.d) or an IPv6 address");
	parse_bad("256.0.0.0/8", "\"256.0.0.0/8\": \"256.0.0.0\" is not an IPv4 address "
				 "(a.b.c.d) or an IPv6 address");
	parse_bad("1::2::3", "\"1::2::3\": \"1::2::3\" is not an IPv4 address (a.b.c.d) or an "
			     "IPv6 address");
	parse_bad("/8", "\"/8\": \"\" is not an IPv4 address (a.b.c.d) or an IPv6 address");
	parse_bad("10.0.0.0/", "\"10.0.0.0/\": expected a prefix length 0..32 after '/'");
	parse_bad("10.0.0.0/x", "\"10.0.0.0/x\": expected a prefix length 0..32 after '/'");
	parse_bad("10.0.0.0/-1", "\"10.0.0.0/-1\": expected a prefix length 0..32 after '/'");
	parse_bad("10.0.0.0/08", "\"10.0.0.0/08\": expected a prefix length 0..32 after '/'");
	parse_bad("10.0.0.0/8/8", "\"10.0.0.0/8/8\": expected a prefix length 0..32 after '/'");
	parse_bad("10.0.0.0/1000", "\"10.0.0.0/1000\": expected a prefix length 0..32 after '/'");
	parse_bad("10.0.0.0/33", "\"10.0.0.0/33\": prefix length 33 is above 32");
	parse_bad("::/129", "\"::/129\": prefix length 129 is above 128");
	parse_bad("10.0.0.1/8", "\"10.0.0.1/8\": host bits are set (did you mean 10.0.0.0/8?)");
	parse_bad("172.31.0.0/12",
		  "\"172.31.0.0/12\": host bits are set (did you mean 172.16.0.0/12?)");
	parse_bad("fd00::1/8", "\"fd00::1/8\": host bits are set (did you mean fd00::/8?)");
	parse_bad("10.0.0.0 /8", "\"10.0.0.0 /8\": \"10.0.0.0 \" is not an IPv4 address "
				 "(a.b.c.d) or an IPv6 address");
	parse_bad("1111:2222:3333:4444:5555:6666:7777:8888:9999:0000:aaaa:bbbb:cccc/128",
		  "\"1111:2222:3333:4444:5555:6666:7777:8888:...\": longer than 63 bytes");
}

static bool allowed(const char *text, const struct sw_cidr *allow, size_t n,
		    enum sw_addr_class *c)
{
	size_t len;
	const struct sockaddr *a = sa(text, &len);

	return sw_addr_allowed(a, len, allow, n, c);
}

static void test_allow(void **state)
{
	(void)state;
	struct sw_cidr list[3];
	enum sw_addr_class c;

	/* Default: only public addresses. */
	assert_true(allowed("8.8.8.8", NULL, 0, &c));
	assert_int_equal(c, SW_ADDR_PUBLIC);
	assert_true(allowed("2606:4700::1111", NULL, 0, NULL));
	assert_false(allowed("127.0.0.1", NULL, 0, &c));
	assert_int_equal(c, SW_ADDR_LOOPBACK);
	assert_false(allowed("10.0.0.5", NULL, 0, &c));
	assert_int_equal(c, SW_ADDR_PRIVATE);
	assert_false(allowed("::ffff:169.254.169.254", NULL, 0, &c));
	assert_int_equal(c, SW_ADDR_LINK_LOCAL);

	/* 127.0.0.1/32 opens exactly that address, in any spelling. */
	assert_int_equal(sw_cidr_parse("127.0.0.1/32", &list[0], err, sizeof(err)), 0);
	assert_true(allowed("127.0.0.1", list, 1, &c));
	assert_int_equal(c, SW_ADDR_LOOPBACK); /* still its class */
	assert_true(allowed("::ffff:127.0.0.1", list, 1, NULL));
	assert_true(allowed("::127.0.0.1", list, 1, NULL));
	assert_false(allowed("127.0.0.2", list, 1, NULL));
	assert_false(allowed("::1", list, 1, NULL));
	assert_false(allowed("10.0.0.5", list, 1, NULL));

	/* Networks, IPv4 and IPv6, edges included. */
	assert_int_equal(sw_cidr_parse("10.1.0.0/16", &list[1], err, sizeof(err)), 0);
	assert_int_equal(sw_cidr_parse("fd00:1::/32", &list[2], err, sizeof(err)), 0);
	assert_true(allowed("10.1.0.0", list, 3, NULL));
	assert_true(allowed("10.1.255.255", list, 3, NULL));
	assert_false(allowed("10.2.0.0", list, 3, NULL));
	assert_false(allowed("10.0.255.255", list, 3, NULL));
	assert_true(allowed("fd00:1::1", list, 3, NULL));
	assert_true(allowed("fd00:1:ffff::1", list, 3, NULL));
	assert_false(allowed("fd00:2::1", list, 3, NULL));
	/* An IPv6 network never matches an IPv4 address, nor the reverse. */
	assert_int_equal(sw_cidr_parse("::/0", &list[0], err, sizeof(err)), 0);
	assert_false(allowed("10.0.0.5", list, 1, NULL));
	assert_true(allowed("::1", list, 1, NULL));
	assert_int_equal(sw_cidr_parse("0.0.0.0/0", &list[0], err, sizeof(err)), 0);
	assert_true(allowed("::ffff:10.0.0.5", list, 1, NULL));
	assert_false(allowed("fe80::1", list, 1, NULL));
}

static void test_format(void **state)
{
	(void)state;
	char out[SW_ADDR_STR_MAX], small[4];
	size_t len;
	const struct sockaddr *a = sa("10.0.0.5", &len);

	sw_addr_format(a, len, out, sizeof(out));
	assert_string_equal(out, "10.0.0.5");
	a = sa("::ffff:10.0.0.5", &len);
	sw_addr_format(a, len, out, sizeof(out));
	assert_string_equal(out, "::ffff:10.0.0.5");
	a = sa("fe80::1", &len);
	sw_addr_format(a, len, out, sizeof(out));
	assert_string_equal(out, "fe80::1");
	sw_addr_format(a, len, small, sizeof(small));
	assert_string_equal(small, "fe8");
	sw_addr_format(NULL, 0, out, sizeof(out));
	assert_string_equal(out, "?");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ipv4_ranges),
		cmocka_unit_test(test_ipv6_ranges),
		cmocka_unit_test(test_embedded_ipv4),
		cmocka_unit_test(test_not_ip),
		cmocka_unit_test(test_cidr_parse),
		cmocka_unit_test(test_allow),
		cmocka_unit_test(test_format),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
