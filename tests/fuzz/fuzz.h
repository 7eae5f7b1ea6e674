/* fuzz.h - what every fuzz target shares: the libFuzzer entry point each
 * defines, and CHECK, which stops the run at a broken invariant (a trap,
 * so that libFuzzer and the corpus replay both report the input). */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The condition and its line go to stderr first, so that a log alone
 * (a CI run's) says which invariant broke. */
#define CHECK(c)                                                                       \
	do {                                                                           \
		if (!(c)) {                                                            \
			fprintf(stderr, "CHECK failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); \
			__builtin_trap();                                              \
		}                                                                      \
	} while (0)

#endif
