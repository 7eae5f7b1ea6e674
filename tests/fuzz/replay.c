/* replay.c - runs a libFuzzer target over files without libFuzzer.
 *
 * Linked with every tests/fuzz/fuzz_<name>.c into replay_<name>, which the
 * normal build registers as a test (suite "fuzz"): each argument is a file
 * or a directory whose regular files are fed, in name order, once each, to
 * LLVMFuzzerTestOneInput. Each input sits in an exact-size heap buffer so a
 * sanitizer build catches over-reads. Exits 1 when an argument cannot be
 * read or a directory holds no file, so a lost corpus is noticed.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fileno(f), &st) < 0 || st.st_size < 0) {
		fprintf(stderr, "replay: %s: fstat: %s\n", path, strerror(errno));
		fclose(f);
		return -1;
	}
	size_t n = (size_t)st.st_size;
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf || fread(buf, 1, n, f) != n) {
		fprintf(stderr, "replay: %s: read failed\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(n ? buf : NULL, n);
	free(buf);
	return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static int run_dir(const char *dir, int *count)
{
	struct dirent **ents;
	int n = scandir(dir, &ents, NULL, by_name);
	int rc = 0, files = 0;
	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
		if (ents[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (run_file(path) < 0)
				rc = -1;
			files++;
		}
		free(ents[i]);
	}
	free(ents);
	if (files == 0) {
		fprintf(stderr, "replay: %s: no input files\n", dir);
		return -1;
	}
	*count += files;
	return rc;
}

int main(int argc, char **argv)
{
	int count = 0, rc = 0;
	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR|FILE...\n", argv[0]);
		return 2;
	}
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			rc = 1;
		} else if (S_ISDIR(st.st_mode)) {
			rc |= run_dir(argv[i], &count) < 0;
		} else {
			rc |= run_file(argv[i]) < 0;
			count++;
		}
	}
	printf("replay: %d inputs\n", count);
	return rc;
}
