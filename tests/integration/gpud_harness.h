/* gpud_harness.h - a real `gpud serve` for an integration test.
 *
 * gpud_it_start() writes a JSON configuration into a fresh temporary
 * directory (socket, state_dir and log file inside it; the model
 * ../shared/models/stories260K.gguf resolved to an absolute path; devices
 * ["cpu", "cpu"], threads 2, plus whatever JSON members the test adds to
 * the "gpud" object), spawns the binary built by meson (GPUD_BIN) in its
 * own process group with its stdout and stderr in that directory, and
 * waits until a client STATS succeeds (bounded; on timeout or an early
 * exit it prints the tail of the daemon's log and output and fails).
 * gpud_it_stop() sends SIGTERM and collects the exit status, gpud_it_free()
 * kills whatever is left and removes the directory. The child also gets
 * PR_SET_PDEATHSIG(SIGKILL): a test that dies takes its daemons along.
 *
 * JSON helpers read the STATS / MEM replies (gpud/stats.h schema) with
 * jansson: gpud_it_jget(root, "alloc.since_warmup.host") follows dotted
 * keys and "[N]" array indices.
 *
 * Everything reports failures on stderr and returns a negative code (the
 * tests turn that into a cmocka failure); nothing here calls cmocka.
 */
#ifndef GPUD_IT_HARNESS_H
#define GPUD_IT_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/client.h"
#include "sw_config.h"

#define GPUD_IT_PATH_MAX 256
#define GPUD_IT_MODEL SW_SHARED_DIR "/models/stories260K.gguf"

/* What the configuration says beyond the defaults above. */
struct gpud_it_opts {
	const char *model;      /* NULL: GPUD_IT_MODEL; used as given when it
				 * does not resolve (a test of a bad path) */
	const char *devices;    /* JSON array text; NULL: ["cpu", "cpu"] */
	int threads;            /* 0: 2 */
	const char *gpud_extra; /* extra members of the "gpud" object, JSON
				 * text without braces ("\"kv_blocks\": 64"),
				 * or NULL */
	const char *raw_config; /* the whole file as given instead (the
				 * socket etc. are then the test's business;
				 * "%s" is NOT expanded) or NULL */
	uint32_t ready_ms;      /* wait for STATS at most this long; 0: 30 s */
	bool no_wait;           /* spawn only: do not wait for readiness */
};

/* One daemon under test. Plain data: zero it (or let gpud_it_start fill
 * it) and pass it to gpud_it_free at the end. */
struct gpud_it {
	char dir[64];                  /* temporary directory (/tmp/gpud-it-XXXXXX) */
	char config[GPUD_IT_PATH_MAX]; /* dir/gpud.json */
	char socket[GPUD_IT_PATH_MAX]; /* dir/gpud.sock */
	char log[GPUD_IT_PATH_MAX];    /* dir/gpud.log (log.file) */
	char out[GPUD_IT_PATH_MAX];    /* dir/gpud.out (stdout + stderr) */
	char state[GPUD_IT_PATH_MAX];  /* dir/state */
	pid_t pid;                     /* 0 when not running */
	int status;                    /* wait status once reaped, else -1 */
	double ready_s;                /* spawn to first STATS reply */
};

/* Creates the directory and writes the configuration (no daemon yet).
 * Returns 0 or a negated errno (message on stderr). */
int gpud_it_prepare(struct gpud_it *d, const struct gpud_it_opts *o);

/* Spawns `GPUD_BIN serve --config d->config` plus the extra arguments
 * (NULL-terminated, may be NULL). Returns 0 or a negated errno. */
int gpud_it_spawn(struct gpud_it *d, const char *const *extra_args);

/* Waits until a client connects and STATS answers, at most timeout_ms.
 * Returns 0; -ECHILD when the daemon exited first (d->status set);
 * -ETIMEDOUT. Prints the log tail on failure. */
int gpud_it_wait_ready(struct gpud_it *d, uint32_t timeout_ms);

/* prepare + spawn + wait_ready (unless o->no_wait). Returns 0 or the
 * first error; on error the daemon is killed (the directory stays for
 * gpud_it_free, so its log can still be printed). */
int gpud_it_start(struct gpud_it *d, const struct gpud_it_opts *o);

/* Sends sig (SIGTERM normally) and waits up to timeout_ms for the exit;
 * then SIGKILLs the process group. Returns the exit code (0..255), 128 +
 * signal when killed by one, or -ETIMEDOUT (it had to be killed; message
 * and log tail on stderr). */
int gpud_it_stop(struct gpud_it *d, int sig, uint32_t timeout_ms);

/* Waits up to timeout_ms for the daemon to exit on its own (no signal).
 * Returns as gpud_it_stop, -ETIMEDOUT while it still runs (not killed). */
int gpud_it_wait_exit(struct gpud_it *d, uint32_t timeout_ms);

/* True while the process runs (reaps it when it has exited). */
bool gpud_it_running(struct gpud_it *d);

/* Prints the last `lines` lines of the log file and of the output file
 * to stderr, headed by what. */
void gpud_it_print_tail(const struct gpud_it *d, const char *what, int lines);

/* Kills a daemon still running (SIGKILL to its group), removes the
 * directory. Accepts NULL and a zeroed struct. */
void gpud_it_free(struct gpud_it *d);

/* Runs GPUD_BIN with args (argv[0] excluded, NULL-terminated) to the end,
 * at most timeout_ms, capturing stdout and stderr together into out
 * (NUL-terminated, truncated to outlen). Returns the exit code, 128 +
 * signal, or a negated errno. */
int gpud_it_run_cmd(const char *const *args, char *out, size_t outlen, uint32_t timeout_ms);

/* True when file contains needle (read fully; small files). */
bool gpud_it_file_has(const char *path, const char *needle);

/* --- client helpers --------------------------------------------------- */

/* Connects with a 120 s timeout (so a hung daemon fails a test instead of
 * hanging it). Returns NULL with a message on stderr on failure. */
struct proto_client *gpud_it_connect(const struct gpud_it *d);

/* STATS (mem false) or MEM as parsed JSON (json_decref it). NULL with a
 * message on stderr on failure. */
json_t *gpud_it_stats(struct proto_client *c, bool mem);

/* The value at path: dotted keys with optional [N] indices
 * ("pools[0].used", "alloc.since_warmup.host"). NULL when absent. */
json_t *gpud_it_jget(json_t *root, const char *path);

/* Integer at path into *v. Returns 0, -ENOENT (absent) or -EINVAL (not
 * an integer; a JSON real with an integral value is accepted). */
int gpud_it_jint(json_t *root, const char *path, int64_t *v);

/* The element of array arr whose "name" is name, or NULL. */
json_t *gpud_it_named(json_t *arr, const char *name);

/* Monotonic seconds. */
double gpud_it_now(void);


/* A cmocka fixture of two daemon slots shared by the gpud tests. */
struct gpud_it_fix {
	struct gpud_it d[2];
	bool done; /* the test reached its end: no log tails at teardown */
};

/* cmocka setup: *state gets a zeroed struct gpud_it_fix (no daemon
 * started). Returns 0, or -1 when out of memory. */
int gpud_it_fix_setup(void **state);

/* cmocka teardown: prints each slot's log tail unless done was set,
 * stops and frees both slots, frees the fixture. Returns 0. */
int gpud_it_fix_teardown(void **state);

/* A cmocka test entry run with the fixture above. */
#define GPUD_IT_FIX_TEST(fn) \
	cmocka_unit_test_setup_teardown(fn, gpud_it_fix_setup, gpud_it_fix_teardown)

#endif
