/* fuzz_config.c - libFuzzer target: bytes -> sw_config_load_string, the
 * configuration file every daemon and swarmctl read (common/config.h).
 * The input up to its first NUL is the file's text (sw_config_load_file
 * refuses a file holding a NUL before it gets here), so the seeds are
 * plain JSON files.
 *
 * Checked invariants (a violation traps):
 *  - the result is 0 or one of the codes config.h lists; an error comes
 *    with a NUL-terminated, non-empty message and leaves the caller's
 *    struct byte for byte as it was;
 *  - a smaller error buffer changes nothing but the message's length: same
 *    code, the message cut at the buffer's end;
 *  - an accepted configuration passes sw_config_validate, its strings are
 *    NUL-terminated inside their fields, it has 1..SW_CONFIG_MAX_DEVICES
 *    devices, and sw_config_to_json writes it as JSON that loads back to
 *    the same struct (a URL whose password it redacts excepted; the
 *    memory fraction to the 15 significant digits the writer keeps) and,
 *    when it redacted nothing, writes back the same text (a fixed point);
 *    a redacted URL reads back as exactly its redacted text, with "***";
 *  - nothing is left allocated (LeakSanitizer in the libFuzzer build).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "tests/fuzz/fuzz.h"

static bool code_listed(int rc)
{
	return rc == SW_EFORMAT || rc == SW_ETYPE || rc == -EINVAL || rc == -ENOMEM;
}

static void terminated(const char *s, size_t cap)
{
	CHECK(memchr(s, '\0', cap) != NULL);
}

static void check_ok(const struct sw_config *cfg)
{
	char err[SW_ERR_MAX];

	CHECK(sw_config_validate(cfg, 0, err, sizeof(err)) == 0);
	terminated(cfg->state_dir, sizeof(cfg->state_dir));
	terminated(cfg->log.file, sizeof(cfg->log.file));
	terminated(cfg->redis.url, sizeof(cfg->redis.url));
	terminated(cfg->postgres.url, sizeof(cfg->postgres.url));
	terminated(cfg->gpud.socket, sizeof(cfg->gpud.socket));
	terminated(cfg->gpud.model, sizeof(cfg->gpud.model));
	terminated(cfg->gpud.metrics, sizeof(cfg->gpud.metrics));
	CHECK(cfg->gpud.n_devices >= 1 && cfg->gpud.n_devices <= SW_CONFIG_MAX_DEVICES);
	CHECK(cfg->gpud.memory_fraction > 0 && cfg->gpud.memory_fraction <= 1);
}

/* a, loaded from the text b was written as: equal but for what the writer
 * redacts or rounds. Returns whether a URL was redacted. */
static bool check_same(const struct sw_config *a, struct sw_config *b)
{
	char red[SW_CONFIG_URL_MAX];
	double fa = a->gpud.memory_fraction, fb = b->gpud.memory_fraction;
	bool redacted = false;

	CHECK(fabs(fa - fb) <= 1e-14 * fa);
	b->gpud.memory_fraction = fa;
	sw_config_redact_url(a->redis.url, red, sizeof(red));
	if (strcmp(red, a->redis.url) != 0) {
		CHECK(strcmp(b->redis.url, red) == 0 && strstr(red, "***") != NULL);
		memcpy(b->redis.url, a->redis.url, sizeof(b->redis.url));
		redacted = true;
	}
	sw_config_redact_url(a->postgres.url, red, sizeof(red));
	if (strcmp(red, a->postgres.url) != 0) {
		CHECK(strcmp(b->postgres.url, red) == 0 && strstr(red, "***") != NULL);
		memcpy(b->postgres.url, a->postgres.url, sizeof(b->postgres.url));
		redacted = true;
	}
	CHECK(memcmp(a, b, sizeof(*a)) == 0);
	return redacted;
}

static bool redacts(const char *url)
{
	static char red[2 * SW_CONFIG_URL_MAX];

	sw_config_redact_url(url, red, sizeof(red));
	return strcmp(red, url) != 0;
}

static void check_round_trip(const struct sw_config *cfg)
{
	struct sw_config back;
	char err[SW_ERR_MAX];
	char *j1, *j2;

	j1 = sw_config_to_json(cfg);
	CHECK(j1 != NULL);
	sw_config_defaults(&back);
	if (sw_config_load_string(j1, &back, err, sizeof(err)) != 0) {
		/* The one allowed failure: a redacted URL is for reading,
		 * not a copy. "***" for a shorter password can push it or
		 * one of its parts (a 255-byte Redis host, where a stray
		 * "?password=x" lands) past a length limit. */
		if (redacts(cfg->redis.url) || redacts(cfg->postgres.url)) {
			free(j1);
			return;
		}
		fprintf(stderr, "fuzz_config: the JSON of a loaded config does not load: %s\n%s\n",
			err, j1);
		CHECK(0);
	}
	j2 = sw_config_to_json(&back);
	CHECK(j2 != NULL);
	/* Redaction is not always a fixed point: it over-redacts a quoted
	 * conninfo password holding "\\'" and whatever follows a closing
	 * quote, and the second pass sees "***..." unquoted. */
	if (!check_same(cfg, &back))
		CHECK(strcmp(j1, j2) == 0);
	free(j1);
	free(j2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sw_config cfg, before;
	char err[SW_ERR_MAX], small[16];
	char *text = malloc(size + 1);
	int rc, rc2;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	/* A pattern no load writes, so any change on failure is seen. */
	memset(&cfg, 0xa5, sizeof(cfg));
	before = cfg;
	memset(err, 0x5a, sizeof(err));
	memset(small, 0x5a, sizeof(small));
	rc = sw_config_load_string(text, &cfg, err, sizeof(err));
	if (rc == 0) {
		check_ok(&cfg);
		check_round_trip(&cfg);
	} else {
		CHECK(code_listed(rc));
		terminated(err, sizeof(err));
		CHECK(err[0] != '\0');
		CHECK(memcmp(&cfg, &before, sizeof(cfg)) == 0);
	}
	memset(&cfg, 0xa5, sizeof(cfg));
	rc2 = sw_config_load_string(text, &cfg, small, sizeof(small));
	CHECK(rc2 == rc);
	if (rc) {
		terminated(small, sizeof(small));
		CHECK(strncmp(small, err, strlen(small)) == 0);
		CHECK(strlen(small) == strlen(err) || strlen(small) == sizeof(small) - 1);
	}
	free(text);
	return 0;
}
