/* bench_tokenizer.c - tokenizer load time and encode/decode throughput.
 *
 * Usage: bench_tokenizer [vocab.gguf ...]   (run from the project root;
 * defaults to the shared llama-spm, llama-bpe and gpt-2 vocabularies).
 *
 * Texts (deterministic, ~400 KB each):
 *   prose  - English-like words, punctuation and newlines from a fixed LCG
 *   mixed  - the shared tokenizer test inputs repeated (many scripts, emoji,
 *            digits, whitespace runs)
 *   oneword- 64 KB of letters without a space: the worst case for the merge
 *            loop, one pre-token / one SentencePiece run
 * Each encode is repeated until 0.5 s have passed; the best rate is kept,
 * by wall clock and by thread CPU time (the machine may be shared). "dec"
 * is one pass of the streaming detokenizer over all ids; "rt" says whether
 * it gave the text back; "scratch" is the arena high-water mark, bytes.
 * Prints a table; asserts nothing about time.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/alloc.h"
#include "gpud/gguf.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

/* Linked with gpud/alloc_hook.c (see bench/meson.build): heap allocations
 * inside encode and detokenize, where there must be none. */
static uint64_t n_allocs;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of this thread: the machine running the benchmark may be
 * shared, and wall time then measures the neighbours too. */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *make_prose(size_t len)
{
	static const char *const words[] = {
		"the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for",
		"on", "are", "as", "with", "his", "they", "I", "at", "be", "this", "have", "from",
		"or", "one", "had", "by", "word", "but", "not", "what", "all", "were", "we", "when",
		"your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how",
		"their", "if", "will", "up", "other", "about", "out", "many", "then", "them",
		"these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has",
		"look", "two", "more", "write", "go", "see", "number", "no", "way", "could",
		"people", "my", "than", "first", "water", "been", "call", "who", "oil", "its",
		"now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part",
		"scheduler", "allocation", "fragmentation", "tokenizer", "GPU", "2024", "42",
		"don't", "it's", "we'll", "Hello", "World", "Once", "upon", "Lily",
	};
	const size_t nw = sizeof(words) / sizeof(words[0]);
	char *s = malloc(len + 32);
	uint64_t x = 0x2545F4914F6CDD1DULL;
	size_t n = 0;
	int sentence = 0;

	if (!s)
		return NULL;
	while (n < len) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		const char *w = words[(x >> 33) % nw];
		size_t wl = strlen(w);
		if (n + wl + 3 > len)
			break;
		memcpy(s + n, w, wl);
		n += wl;
		sentence++;
		unsigned r = (unsigned)(x >> 20) % 100;
		if (sentence > 8 && r < 15) {
			s[n++] = '.';
			sentence = 0;
			if (r < 3)
				s[n++] = '\n';
			else
				s[n++] = ' ';
		} else if (r < 20) {
			s[n++] = ',';
			s[n++] = ' ';
		} else {
			s[n++] = ' ';
		}
	}
	s[n] = '\0';
	return s;
}

static char *make_mixed(size_t len)
{
	FILE *f = fopen(SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-spm.gguf.inp", "rb");
	char src[8192];
	size_t sl;
	char *s;

	if (!f)
		return NULL;
	sl = fread(src, 1, sizeof(src), f);
	fclose(f);
	if (sl == 0)
		return NULL;
	s = malloc(len + 1);
	if (!s)
		return NULL;
	for (size_t n = 0; n < len; n += sl)
		memcpy(s + n, src, n + sl <= len ? sl : len - n);
	/* Do not end inside a UTF-8 sequence. */
	while (len > 0 && ((unsigned char)s[len - 1] & 0xC0) == 0x80)
		len--;
	if (len > 0 && ((unsigned char)s[len - 1] & 0xC0) == 0xC0)
		len--;
	s[len] = '\0';
	return s;
}

static char *make_oneword(size_t len)
{
	char *s = malloc(len + 1);
	uint64_t x = 7;
	if (!s)
		return NULL;
	for (size_t i = 0; i < len; i++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		s[i] = "etaoinshrdlucmfw"[(x >> 40) & 15];
	}
	s[len] = '\0';
	return s;
}

static void bench_text(const struct gpud_tokenizer *t, const char *vname, const char *tname,
		       const char *text)
{
	size_t len = strlen(text), n = 0;
	int32_t *ids = malloc((len + 2) * sizeof(*ids));
	struct sw_arena a;
	double best = 1e30, best_cpu = 1e30, t_end;
	int rc = 0;

	if (!ids || sw_arena_init(&a, gpud_tokenizer_scratch_bytes(t, len)) != 0) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	t_end = now() + 0.5;
	do {
		double t0 = now(), c0 = cpu_now();
		uint64_t a0 = gpud_alloc_host_allocs();
		rc = gpud_tokenizer_encode(t, text, len, 0, ids, len + 2, &n, &a);
		n_allocs += gpud_alloc_host_allocs() - a0;
		double dt = now() - t0, dc = cpu_now() - c0;
		if (dc < best_cpu)
			best_cpu = dc;
		if (rc) {
			fprintf(stderr, "%s %s: %s\n", vname, tname, sw_strerror(rc));
			exit(1);
		}
		if (dt < best)
			best = dt;
	} while (now() < t_end);

	/* Detokenize everything with the streaming API. */
	char *out = malloc(4 * len + 64);
	struct gpud_detok d;
	double d0 = now();
	size_t ol = 0;
	gpud_detok_init(&d);
	uint64_t a0 = gpud_alloc_host_allocs();
	for (size_t i = 0; i < n; i++) {
		int k = gpud_detok_push(t, &d, ids[i], out + ol, 4 * len + 64 - ol);
		if (k < 0) {
			fprintf(stderr, "detok: %s\n", sw_strerror(k));
			exit(1);
		}
		ol += (size_t)k;
	}
	n_allocs += gpud_alloc_host_allocs() - a0;
	double ddt = now() - d0;
	bool same = ol == len && memcmp(out, text, len) == 0;

	printf("| %-26s | %-7s | %7zu | %7zu | %5.2f | %8.1f | %7.2f | %7.2f | %7.1f "
	       "| %-4s | %8zu |\n",
	       vname, tname, len, n, (double)len / (double)n, best * 1e3, (double)len / best / 1e6,
	       (double)len / best_cpu / 1e6, (double)len / ddt / 1e6, same ? "yes" : "NO", a.high);
	free(out);
	free(ids);
	sw_arena_destroy(&a);
}

int main(int argc, char **argv)
{
	static const char *const defaults[] = {
		SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-spm.gguf",
		SW_SHARED_DIR "/tokenizer/ggml-vocab-llama-bpe.gguf",
		SW_SHARED_DIR "/tokenizer/ggml-vocab-gpt-2.gguf",
	};
	const char *const *paths = argc > 1 ? (const char *const *)argv + 1 : defaults;
	int np = argc > 1 ? argc - 1 : 3;
	char *prose = make_prose(400000), *mixed = make_mixed(400000), *one = make_oneword(65536);
	struct utsname u;
	char date[64];
	time_t tt = time(NULL);

	if (!prose || !mixed || !one) {
		fprintf(stderr, "cannot build texts (run from the project root)\n");
		return 1;
	}
	strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", gmtime(&tt));
	uname(&u);
	printf("bench_tokenizer  %s  %s %s %s\n\n", date, u.sysname, u.release, u.machine);
	printf("| vocab                      | load s  | cpu s   | tokens  | merges  |\n");
	printf("|----------------------------|---------|---------|---------|---------|\n");

	struct gpud_tokenizer *toks[16] = { 0 };
	for (int i = 0; i < np && i < 16; i++) {
		struct gpud_gguf *g = NULL;
		char err[SW_ERR_MAX];
		double best = 1e30, best_cpu = 1e30;
		for (int rep = 0; rep < 3; rep++) {
			double t0 = now(), c0 = cpu_now();
			if (gpud_gguf_open(&g, paths[i], err, sizeof(err)) != 0 ||
			    gpud_tokenizer_load(&toks[i], g, err, sizeof(err)) != 0) {
				fprintf(stderr, "%s\n", err);
				return 1;
			}
			double dt = now() - t0; /* open + load: what start-up pays */
			double dc = cpu_now() - c0;
			if (dt < best)
				best = dt;
			if (dc < best_cpu)
				best_cpu = dc;
			gpud_gguf_close(g);
			if (rep < 2) {
				gpud_tokenizer_free(toks[i]);
				toks[i] = NULL;
			}
		}
		const char *b = strrchr(paths[i], '/');
		uint64_t nm = 0;
		enum gpud_gguf_vtype et;
		if (gpud_gguf_open(&g, paths[i], err, sizeof(err)) == 0) {
			if (gpud_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nm) != 0)
				nm = 0;
			gpud_gguf_close(g);
		}
		printf("| %-26s | %7.3f | %7.3f | %7d | %7llu |\n", b ? b + 1 : paths[i], best,
		       best_cpu,
		       gpud_tokenizer_n_vocab(toks[i]), (unsigned long long)nm);
	}
	printf("\n| vocab                      | text    | bytes   | ids     | B/id  | enc ms   "
	       "| enc MB/s| cpu MB/s| dec MB/s| rt   | scratch  |\n");
	printf("|----------------------------|---------|---------|---------|-------|----------"
	       "|---------|---------|---------|------|----------|\n");
	for (int i = 0; i < np && i < 16; i++) {
		const char *b = strrchr(paths[i], '/');
		b = b ? b + 1 : paths[i];
		bench_text(toks[i], b, "prose", prose);
		bench_text(toks[i], b, "mixed", mixed);
		bench_text(toks[i], b, "oneword", one);
		gpud_tokenizer_free(toks[i]);
	}
	if (gpud_alloc_hooked())
		printf("\nheap allocations inside encode and detokenize: %" PRIu64 "\n", n_allocs);
	else
		printf("\nheap allocations inside encode and detokenize: not counted "
		       "(malloc redirected past the hook, e.g. by valgrind)\n");
	free(prose);
	free(mixed);
	free(one);
	return 0;
}
