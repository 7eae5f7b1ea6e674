/* tok_pre_dump - the pre-tokenizers' splits, for tok_pre_ref.py.
 *
 * Reads lines "NAME HEX" (a tokenizer.ggml.pre name, UTF-8 text in hex)
 * and writes, for each, the byte offsets where its pre-tokens end, one
 * line, space-separated; "unknown" for a name gpud does not know.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpud/tokenizer_impl.h"

#define MAX_TEXT 65536

static uint8_t text[MAX_TEXT];
static uint32_t cp[MAX_TEXT], off[MAX_TEXT + 1];
static uint8_t cl[MAX_TEXT];
static char line[2 * MAX_TEXT + 256];

static int put(void *arg, size_t i, size_t j)
{
	(void)arg;
	(void)i;
	printf(" %u", off[j]);
	return 0;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int main(void)
{
	while (fgets(line, sizeof(line), stdin)) {
		char *sp = strchr(line, ' ');
		enum tok_pre pre;
		bool im, bos;
		size_t len = 0, n;

		if (!sp) {
			fprintf(stderr, "tok_pre_dump: bad line\n");
			return 2;
		}
		*sp = '\0';
		for (char *h = sp + 1; hexval(h[0]) >= 0 && hexval(h[1]) >= 0; h += 2) {
			if (len == MAX_TEXT) {
				fprintf(stderr, "tok_pre_dump: text too long\n");
				return 2;
			}
			text[len++] = (uint8_t)(hexval(h[0]) << 4 | hexval(h[1]));
		}
		if (gpud__tok_pre_lookup(line, strlen(line), &pre, &im, &bos) != 0) {
			printf("unknown\n");
			continue;
		}
		n = gpud__tok_cps_fill(text, len, cp, cl, off);
		struct tok_cps c = { cp, cl, off };
		printf("ok");
		gpud__tok_pre_split(pre, &c, n, put, NULL);
		printf("\n");
	}
	return 0;
}
