/* fuzz.h - what every fuzz target shares: the libFuzzer entry point each
 * defines, and CHECK, which stops the run at a broken invariant (a trap,
 * so that libFuzzer and the corpus replay both report the input). */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                          \
	do {                              \
		if (!(c))                 \
			__builtin_trap(); \
	} while (0)

#endif
