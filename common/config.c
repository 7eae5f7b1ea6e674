/* config.c - table-driven JSON configuration with env overrides.
 *
 * One table per JSON object describes each key: its kind, where it lives in
 * struct sw_config, its bounds and its environment variable. Loading, env
 * overrides, error messages and sw_config_to_json all walk the same tables,
 * so a key added to a table is parsed, overridable, validated and logged.
 */
#include "common/config.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <jansson.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/addr.h"
#include "common/err.h"
#include "common/log.h"
#include "common/redis_url.h"

#define CONFIG_FILE_MAX (16u << 20) /* a config is kilobytes; refuse monsters */
#define PATH_BUF 256                 /* longest key path in an error message */

enum kind {
	K_STR,          /* char[size] */
	K_REDIS_URL,    /* char[size], never echoed back (may hold a password) */
	K_PG_URL,
	K_U32,          /* uint32_t in [min, max] */
	K_BYTES,        /* uint64_t in [min, max], integer or "64MiB" */
	K_FRAC,         /* double in (0, 1] */
	K_LEVEL,        /* int, enum sw_log_level, as a name */
	K_NAME,         /* uint32_t: the index of one of names[] */
	K_DEVICES,      /* devices[] + n_devices */
	K_LISTEN,       /* char[size]: "", "127.0.0.1:PORT" or "unix:/path" */
	K_HOSTPORT,     /* char[size]: "" or "HOST:PORT" (sw_config_split_hostport) */
	K_LIST,         /* char[max][size] strings + a uint32_t count at off_n */
	K_MODE,         /* uint32_t permission bits, as an octal string "0660" */
	K_GROUP,        /* char[size]: "" or a group that exists (name or gid) */
	K_IDS,          /* struct sw_config_ids: user (or, F_GROUP, group) names or ids */
	K_OBJ,          /* nested table */
};

enum {
	F_NONEMPTY = 1u << 0,
	F_POW2 = 1u << 1,
	F_ABSPATH = 1u << 2,            /* K_LIST: absolute paths */
	F_CIDR = 1u << 3,               /* K_LIST: sw_cidr_parse accepts each */
	F_GROUP = 1u << 4,              /* K_IDS: groups, not users */
};

struct field {
	const char *key;
	enum kind kind;
	size_t off;                     /* offsetof(struct sw_config, ...) */
	size_t off_n;                   /* K_LIST: offset of its count */
	size_t size;                    /* K_STR / URL buffer size */
	uint64_t min, max;
	unsigned flags;
	const struct field *sub;        /* K_OBJ: table ending in { NULL } */
	const char *const *names;       /* K_NAME: the choices, NULL-terminated */
	const char *env;                /* SWARM_* override, or NULL */
};

#define OFF(m) offsetof(struct sw_config, m)
#define STR(k, m, fl, e) { .key = k, .kind = K_STR, .off = OFF(m), \
	.size = sizeof(((struct sw_config *)0)->m), .flags = fl, .env = e }
#define U32(k, m, lo, hi, fl, e) { .key = k, .kind = K_U32, .off = OFF(m), \
	.min = lo, .max = hi, .flags = fl, .env = e }
#define BYTES(k, m, lo, hi) { .key = k, .kind = K_BYTES, .off = OFF(m), .min = lo, .max = hi }
#define BYTES_POW2(k, m, lo, hi) { .key = k, .kind = K_BYTES, .off = OFF(m), .min = lo, \
	.max = hi, .flags = F_POW2 }
#define OBJ(k, t) { .key = k, .kind = K_OBJ, .sub = t }
#define NAME(k, m, n) { .key = k, .kind = K_NAME, .off = OFF(m), .names = n }
#define LIST(k, m, mn, fl, e) { .key = k, .kind = K_LIST, .off = OFF(m), .off_n = OFF(mn), \
	.size = sizeof(((struct sw_config *)0)->m[0]), \
	.max = sizeof(((struct sw_config *)0)->m) / sizeof(((struct sw_config *)0)->m[0]), \
	.flags = fl, .env = e }

#define MS_HOUR 3600000u
#define MS_DAY 86400000u

static const struct field log_fields[] = {
	{ .key = "level", .kind = K_LEVEL, .off = OFF(log.level), .env = "SWARM_LOG_LEVEL" },
	STR("file", log.file, 0, "SWARM_LOG_FILE"),
	{ .key = NULL },
};

static const struct field redis_fields[] = {
	{ .key = "url", .kind = K_REDIS_URL, .off = OFF(redis.url),
	  .size = sizeof(((struct sw_config *)0)->redis.url), .env = "SWARM_REDIS_URL" },
	STR("password_file", redis.password_file, 0, "SWARM_REDIS_PASSWORD_FILE"),
	{ .key = "maxmemory", .kind = K_BYTES, .off = OFF(redis.maxmemory), .min = 0,
	  .max = 1ull << 40, .env = "SWARM_REDIS_MAXMEMORY" },
	{ .key = NULL },
};

static const struct field postgres_fields[] = {
	{ .key = "url", .kind = K_PG_URL, .off = OFF(postgres.url),
	  .size = sizeof(((struct sw_config *)0)->postgres.url), .env = "SWARM_PG_URL" },
	STR("password_file", postgres.password_file, 0, "SWARM_PG_PASSWORD_FILE"),
	{ .key = NULL },
};

static const struct field queue_fields[] = {
	U32("per_connection", gpud.queue.per_connection, 1, 1u << 20, 0, NULL),
	U32("global", gpud.queue.global, 1, 1u << 24, 0, NULL),
	{ .key = NULL },
};

static const struct field watchdog_fields[] = {
	U32("window_ms", gpud.watchdog.window_ms, 100, MS_DAY, 0, NULL),
	U32("k", gpud.watchdog.k, 2, 256, 0, NULL),
	{ .key = NULL },
};

/* gpud.kv_type, in enum sw_config_kv_type's order */
static const char *const kv_type_names[] = { "f32", "f16", NULL };

static const struct field gpud_fields[] = {
	STR("socket", gpud.socket, F_NONEMPTY, "SWARM_GPUD_SOCKET"),
	{ .key = "socket_mode", .kind = K_MODE, .off = OFF(gpud.socket_mode) },
	{ .key = "socket_group", .kind = K_GROUP, .off = OFF(gpud.socket_group),
	  .size = sizeof(((struct sw_config *)0)->gpud.socket_group) },
	{ .key = "allowed_uids", .kind = K_IDS, .off = OFF(gpud.allowed_uids) },
	{ .key = "allowed_gids", .kind = K_IDS, .off = OFF(gpud.allowed_gids), .flags = F_GROUP },
	STR("model", gpud.model, 0, "SWARM_MODEL"),
	STR("chat_format", gpud.chat_format, F_NONEMPTY, "SWARM_CHAT_FORMAT"),
	{ .key = "devices", .kind = K_DEVICES, .off = OFF(gpud.devices), .env = "SWARM_DEVICES" },
	U32("min_devices", gpud.min_devices, 0, SW_CONFIG_MAX_DEVICES, 0, "SWARM_GPUD_MIN_DEVICES"),
	U32("threads", gpud.threads, 0, 1024, 0, "SWARM_THREADS"),
	{ .key = "memory_fraction", .kind = K_FRAC, .off = OFF(gpud.memory_fraction) },
	U32("kv_block_tokens", gpud.kv_block_tokens, 1, 1024, F_POW2, NULL),
	U32("kv_blocks", gpud.kv_blocks, 0, 1u << 24, 0, NULL),
	NAME("kv_type", gpud.kv_type, kv_type_names),
	U32("max_batch_tokens", gpud.max_batch_tokens, 1, 1u << 20, 0, NULL),
	U32("max_seqs", gpud.max_seqs, 1, 65536, 0, NULL),
	U32("logprob_rows", gpud.logprob_rows, 0, 4096, 0, NULL),
	U32("max_segments", gpud.max_segments, 64, 127, 0, NULL),
	U32("context", gpud.context, 0, 1u << 24, 0, NULL),
	BYTES("mask_cache_bytes", gpud.mask_cache_bytes, 4096, 1ull << 40),
	BYTES("prefix_cache_bytes", gpud.prefix_cache_bytes, 0, 1ull << 44),
	BYTES("chunk_cache_bytes", gpud.chunk_cache_bytes, 0, 1ull << 44),
	U32("placement_margin", gpud.placement_margin, 0, 65536, 0, NULL),
	U32("sample_threads", gpud.sample_threads, 0, 64, 0, NULL),
	OBJ("queue", queue_fields),
	U32("shutdown_deadline_ms", gpud.shutdown_deadline_ms, 0, MS_HOUR, 0, NULL),
	U32("step_timeout_ms", gpud.step_timeout_ms, 0, MS_DAY, 0, "SWARM_GPUD_STEP_TIMEOUT_MS"),
	U32("max_connections", gpud.max_connections, 1, 65536, 0, NULL),
	BYTES_POW2("ring_bytes", gpud.ring_bytes, 64u << 10, 1u << 30),
	BYTES("request_bytes", gpud.request_bytes, 64u << 10, 1u << 30),
	BYTES("stage_bytes", gpud.stage_bytes, 4u << 10, 64u << 20),
	U32("stall_ms", gpud.stall_ms, 100, MS_HOUR, 0, NULL),
	{ .key = "metrics", .kind = K_LISTEN, .off = OFF(gpud.metrics),
	  .size = sizeof(((struct sw_config *)0)->gpud.metrics), .env = "SWARM_GPUD_METRICS" },
	OBJ("watchdog", watchdog_fields),
	{ .key = NULL },
};

static const struct field fetch_fields[] = {
	LIST("file_dirs", agentd.fetch.file_dirs, agentd.fetch.n_file_dirs, F_ABSPATH,
	     "SWARM_FETCH_FILE_DIRS"),
	LIST("allow_cidrs", agentd.fetch.allow_cidrs, agentd.fetch.n_allow_cidrs, F_CIDR,
	     "SWARM_FETCH_ALLOW_CIDRS"),
	{ .key = NULL },
};

static const struct field agentd_fields[] = {
	U32("workers", agentd.workers, 1, 4096, 0, "SWARM_WORKERS"),
	U32("max_attempts", agentd.max_attempts, 1, 1000, 0, NULL),
	U32("lease_ms", agentd.lease_ms, 1000, MS_DAY, 0, "SWARM_LEASE_MS"),
	U32("max_tasks_per_worker", agentd.max_tasks_per_worker, 0, UINT32_MAX, 0, NULL),
	U32("heartbeat_ms", agentd.heartbeat_ms, 100, MS_HOUR, 0, NULL),
	U32("restart_backoff_min_ms", agentd.restart_backoff_min_ms, 1, MS_HOUR, 0, NULL),
	U32("restart_backoff_max_ms", agentd.restart_backoff_max_ms, 1, MS_DAY, 0, NULL),
	U32("crash_window_ms", agentd.crash_window_ms, 1000, MS_DAY, 0, NULL),
	U32("crash_limit", agentd.crash_limit, 1, 1000, 0, NULL),
	U32("results_maxlen", agentd.results_maxlen, 1, 1u << 30, 0, NULL),
	U32("dead_maxlen", agentd.dead_maxlen, 1, 1u << 30, 0, NULL),
	STR("answer_chunk_mask", agentd.answer_chunk_mask, F_NONEMPTY, NULL),
	OBJ("fetch", fetch_fields),
	{ .key = NULL },
};

static const struct field supervisor_fields[] = {
	U32("restart_backoff_min_ms", supervisor.restart_backoff_min_ms, 1, MS_HOUR, 0, NULL),
	U32("restart_backoff_max_ms", supervisor.restart_backoff_max_ms, 1, MS_DAY, 0, NULL),
	U32("crash_window_ms", supervisor.crash_window_ms, 1000, MS_DAY, 0, NULL),
	U32("crash_limit", supervisor.crash_limit, 1, 1000, 0, NULL),
	U32("hang_ms", supervisor.hang_ms, 0, MS_DAY, 0, "SWARM_SUPERVISOR_HANG_MS"),
	{ .key = "log_max_bytes", .kind = K_BYTES, .off = OFF(supervisor.log_max_bytes),
	  .min = 64u << 10, .max = 1ull << 40, .env = "SWARM_LOG_MAX_BYTES" },
	U32("log_keep", supervisor.log_keep, 0, 100, 0, NULL),
	{ .key = NULL },
};

static const struct field http_fields[] = {
	{ .key = "listen", .kind = K_HOSTPORT, .off = OFF(http.listen),
	  .size = sizeof(((struct sw_config *)0)->http.listen), .env = "SWARM_HTTP_LISTEN" },
	STR("api_key_file", http.api_key_file, 0, "SWARM_HTTP_API_KEY_FILE"),
	U32("max_connections", http.max_connections, 1, 65536, 0, NULL),
	BYTES("max_body_bytes", http.max_body_bytes, 1024, 1ull << 30),
	U32("header_timeout_ms", http.header_timeout_ms, 100, MS_HOUR, 0, NULL),
	U32("idle_timeout_ms", http.idle_timeout_ms, 100, MS_DAY, 0, NULL),
	{ .key = NULL },
};

static const struct field root_fields[] = {
	STR("state_dir", state_dir, F_NONEMPTY, "SWARM_STATE_DIR"),
	STR("user", user, 0, "SWARM_USER"),
	OBJ("log", log_fields),
	OBJ("redis", redis_fields),
	OBJ("postgres", postgres_fields),
	OBJ("gpud", gpud_fields),
	OBJ("agentd", agentd_fields),
	OBJ("supervisor", supervisor_fields),
	OBJ("http", http_fields),
	{ .key = NULL },
};

void sw_config_defaults(struct sw_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->state_dir, sizeof(cfg->state_dir), "/var/lib/swarm");
	cfg->log.level = SW_LOG_INFO;
	snprintf(cfg->redis.url, sizeof(cfg->redis.url), "redis://127.0.0.1:6379/0");
	snprintf(cfg->postgres.url, sizeof(cfg->postgres.url),
		 "postgresql://swarm@127.0.0.1:5432/swarm");

	snprintf(cfg->gpud.socket, sizeof(cfg->gpud.socket), "/run/swarm/gpud.sock");
	cfg->gpud.socket_mode = 0660; /* socket_group "", no ids: gpud's own uid and group */
	snprintf(cfg->gpud.chat_format, sizeof(cfg->gpud.chat_format), "auto");
	cfg->gpud.devices[0] = (struct sw_config_device){ SW_DEVICE_CPU, 0, 0 };
	cfg->gpud.n_devices = 1;
	cfg->gpud.threads = 0;
	cfg->gpud.memory_fraction = 0.9;
	cfg->gpud.kv_block_tokens = 16;
	cfg->gpud.kv_blocks = 0;
	cfg->gpud.kv_type = SW_KV_F32;
	cfg->gpud.max_batch_tokens = 2048;
	cfg->gpud.max_seqs = 64;
	cfg->gpud.logprob_rows = 32;
	cfg->gpud.max_segments = 64;
	cfg->gpud.context = 0;
	cfg->gpud.mask_cache_bytes = 64ull << 20;
	cfg->gpud.prefix_cache_bytes = 4ull << 30;
	cfg->gpud.chunk_cache_bytes = 1ull << 30;
	cfg->gpud.placement_margin = 8; /* as gpud_sched_params_default */
	cfg->gpud.sample_threads = 0;
	cfg->gpud.queue.per_connection = 64;
	cfg->gpud.queue.global = 1024;
	cfg->gpud.shutdown_deadline_ms = 30000;
	cfg->gpud.step_timeout_ms = 120000;
	cfg->gpud.max_connections = 512;
	cfg->gpud.ring_bytes = 1ull << 20;
	cfg->gpud.request_bytes = 2ull << 20;
	cfg->gpud.stage_bytes = 64ull << 10;
	cfg->gpud.stall_ms = 10000;
	cfg->gpud.metrics[0] = '\0';
	cfg->gpud.watchdog.window_ms = 60000;
	cfg->gpud.watchdog.k = 10;

	cfg->http.listen[0] = '\0';      /* off unless configured */
	cfg->http.api_key_file[0] = '\0';
	cfg->http.max_connections = 256;
	cfg->http.max_body_bytes = 1ull << 20;
	cfg->http.header_timeout_ms = 10000;
	cfg->http.idle_timeout_ms = 60000;

	cfg->agentd.workers = 4;
	cfg->agentd.max_attempts = 5;
	cfg->agentd.lease_ms = 300000;
	cfg->agentd.max_tasks_per_worker = 1000;
	cfg->agentd.heartbeat_ms = 10000;
	cfg->agentd.restart_backoff_min_ms = 100;
	cfg->agentd.restart_backoff_max_ms = 30000;
	cfg->agentd.crash_window_ms = 60000;
	cfg->agentd.crash_limit = 5;
	/* An event is ~100-250 bytes (1 KiB with a long error): 10-25 MB, and
	 * minutes of events at the fastest measured rate, days of summaries. */
	cfg->agentd.results_maxlen = 100000;
	/* A dead entry carries its whole task (up to 16 MiB of JSON); dead
	 * tasks are rare, and PostgreSQL keeps every one's id and error. */
	cfg->agentd.dead_maxlen = 1000;
	snprintf(cfg->agentd.answer_chunk_mask, sizeof(cfg->agentd.answer_chunk_mask), "system");

	/* A service restarts after 0.25 s, 0.5 s, 1 s ... 30 s; six quick
	 * deaths in a minute (about 8 s of backoff) mark it failed. The
	 * minimum is above agentd's 0.1 s: a killed postmaster's backends
	 * need a moment to go before a new one may start. */
	cfg->supervisor.restart_backoff_min_ms = 250;
	cfg->supervisor.restart_backoff_max_ms = 30000;
	cfg->supervisor.crash_window_ms = 60000;
	cfg->supervisor.crash_limit = 5;
	/* A minute without an answer (Redis PING, PostgreSQL accepting or
	 * refusing connections, gpud stats; probed every 5 s) is a hang,
	 * not load: each answers from its event loop, not its work. */
	cfg->supervisor.hang_ms = 60000;
	cfg->supervisor.log_max_bytes = 8ull << 20;
	cfg->supervisor.log_keep = 2;
	/* Managed Redis holds only work in flight (acknowledged entries are
	 * deleted, results and dead letters capped): 256 MiB is tens of
	 * thousands of queued documents, hours of work for one node, yet
	 * small beside the model and PostgreSQL; past it a submit is refused
	 * (noeviction), which is back-pressure, not loss. */
	cfg->redis.maxmemory = 256ull << 20;
}

/* ---- messages ------------------------------------------------------- */

/* A short rendering of a JSON value for "got ..." in messages. */
static void describe(const json_t *v, char *out, size_t outlen)
{
	switch (json_typeof(v)) {
	case JSON_STRING: {
		const char *s = json_string_value(v);
		size_t n = json_string_length(v);
		if (n > 40)
			snprintf(out, outlen, "\"%.37s...\"", s);
		else
			snprintf(out, outlen, "\"%s\"", s);
		break;
	}
	case JSON_INTEGER:
		snprintf(out, outlen, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		break;
	case JSON_REAL:
		snprintf(out, outlen, "%g", json_real_value(v));
		break;
	case JSON_TRUE:
		snprintf(out, outlen, "true");
		break;
	case JSON_FALSE:
		snprintf(out, outlen, "false");
		break;
	case JSON_NULL:
		snprintf(out, outlen, "null");
		break;
	case JSON_OBJECT:
		snprintf(out, outlen, "an object");
		break;
	case JSON_ARRAY:
		snprintf(out, outlen, "an array");
		break;
	}
}

static int expected(char *err, size_t errlen, int code, const char *path,
		    const char *what, const json_t *got)
{
	char g[64];

	if (!got)
		return sw_seterr(err, errlen, code, "%s: expected %s", path, what);
	describe(got, g, sizeof(g));
	return sw_seterr(err, errlen, code, "%s: expected %s, got %s", path, what, g);
}

/* Edit distance, for "did you mean" on unknown keys. Keys are short. */
static unsigned edit_distance(const char *a, const char *b)
{
	unsigned row[64];
	size_t la = strlen(a), lb = strlen(b);

	if (la >= 63 || lb >= 63)
		return 99;
	for (size_t j = 0; j <= lb; j++)
		row[j] = (unsigned)j;
	for (size_t i = 1; i <= la; i++) {
		unsigned diag = row[0];
		row[0] = (unsigned)i;
		for (size_t j = 1; j <= lb; j++) {
			unsigned up = row[j];
			unsigned best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

static int unknown_key(char *err, size_t errlen, const char *path, const char *key,
		       const struct field *table)
{
	const char *best = NULL;
	unsigned best_d = 3; /* suggest only close matches */

	for (const struct field *f = table; f->key; f++) {
		unsigned d = edit_distance(key, f->key);
		if (d < best_d) {
			best_d = d;
			best = f->key;
		}
	}
	if (best)
		return sw_seterr(err, errlen, -EINVAL, "%s: unknown key (did you mean \"%s\"?)",
				 path, best);
	return sw_seterr(err, errlen, -EINVAL, "%s: unknown key", path);
}

/* ---- value parsers -------------------------------------------------- */

static bool parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*out = v;
	return true;
}

/* "123", "64MiB", "2 GiB", "512KiB", "10B". */
static bool parse_size(const char *s, uint64_t *out)
{
	static const struct {
		const char *unit;
		unsigned shift;
	} units[] = { { "", 0 }, { "B", 0 }, { "KiB", 10 }, { "MiB", 20 },
		      { "GiB", 30 }, { "TiB", 40 } };
	char num[32];
	size_t n = 0;

	while (s[n] >= '0' && s[n] <= '9')
		n++;
	if (n == 0 || n >= sizeof(num))
		return false;
	memcpy(num, s, n);
	num[n] = '\0';
	const char *unit = s + n;
	if (*unit == ' ')
		unit++;
	uint64_t v;
	if (!parse_u64(num, &v))
		return false;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(unit, units[i].unit) != 0)
			continue;
		if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
			return false;
		*out = v << units[i].shift;
		return true;
	}
	return false;
}

static int parse_device(const char *s, struct sw_config_device *d)
{
	uint64_t n;

	if (strcmp(s, "cpu") == 0) {
		*d = (struct sw_config_device){ SW_DEVICE_CPU, 0, 0 };
		return 0;
	}
	if (strncmp(s, "cuda:", 5) == 0 && parse_u64(s + 5, &n) && n < 256 &&
	    (s[5] != '0' || s[6] == '\0')) {
		*d = (struct sw_config_device){ SW_DEVICE_CUDA, (int)n, 0 };
		return 0;
	}
	return -EINVAL;
}

void sw_config_device_name(const struct sw_config_device *d, char *out, size_t outlen)
{
	if (d->kind == SW_DEVICE_CUDA)
		snprintf(out, outlen, "cuda:%d", d->index);
	else
		snprintf(out, outlen, "cpu");
}

/* The full parse, so a bad host, port or database fails at load time. */
static bool redis_url_ok(const char *s)
{
	struct sw_redis_url u;

	return sw_redis_url_parse(s, &u, NULL, 0) == 0;
}

/* "" (off), "127.0.0.1:PORT" (PORT 1..65535) or "unix:/absolute/path". */
static bool listen_ok(const char *s)
{
	uint64_t port;

	if (!*s)
		return true;
	if (strncmp(s, "unix:/", 6) == 0)
		return strlen(s + 5) < SW_CONFIG_SOCKET_MAX;
	return strncmp(s, "127.0.0.1:", 10) == 0 && parse_u64(s + 10, &port) && port >= 1 &&
	       port <= 65535 && s[10] != '0';
}

int sw_config_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port,
			     char *err, size_t errlen)
{
	static const char what[] =
		"\"HOST:PORT\" (an IPv4 address, [IPv6] or a host name; port 1..65535)";
	const char *colon = strrchr(s, ':');
	const char *h = s, *hend;
	uint64_t p;

	if (!colon || colon == s)
		return sw_seterr(err, errlen, -EINVAL, "expected %s", what);
	hend = colon;
	if (s[0] == '[') {
		if (colon[-1] != ']' || colon - s < 3)
			return sw_seterr(err, errlen, -EINVAL, "expected %s", what);
		h = s + 1;
		hend = colon - 1;
		for (const char *c = h; c < hend; c++)
			if (!(strchr("0123456789abcdefABCDEF:.", *c)))
				return sw_seterr(err, errlen, -EINVAL, "expected %s", what);
	} else {
		for (const char *c = h; c < hend; c++)
			if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
			      (*c >= '0' && *c <= '9') || *c == '-' || *c == '.'))
				return sw_seterr(err, errlen, -EINVAL, "expected %s", what);
	}
	if ((size_t)(hend - h) > 253 || (size_t)(hend - h) >= hostlen)
		return sw_seterr(err, errlen, -EINVAL, "expected %s (host too long)", what);
	if (!parse_u64(colon + 1, &p) || p < 1 || p > 65535 || colon[1] == '0')
		return sw_seterr(err, errlen, -EINVAL, "expected %s", what);
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = '\0';
	*port = (uint16_t)p;
	return 0;
}

static bool pg_url_ok(const char *s)
{
	return strncmp(s, "postgres://", 11) == 0 || strncmp(s, "postgresql://", 13) == 0 ||
	       (s[0] && strchr(s, '=') && !strstr(s, "://"));
}

/* "0660", "660", "0600": octal permission bits that give the owner rw
 * (gpud's own clients must reach it) and nothing beyond 0777. */
static bool parse_mode(const char *s, uint32_t *out)
{
	uint32_t v = 0;
	size_t n = strlen(s);

	if (n < 3 || n > 4)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '7')
			return false;
		v = v * 8 + (uint32_t)(s[i] - '0');
	}
	if (v > 0777 || (v & 0600) != 0600)
		return false;
	*out = v;
	return true;
}

/* Runs getpwnam_r (user) or getgrnam_r (group) with a buffer that grows
 * on ERANGE. Returns 0 and *id, -ENOENT when no such name, or a negated
 * errno from the lookup. */
static int lookup_name(const char *name, bool group, uint32_t *id)
{
	size_t cap = 16384;
	int rc;

	for (;;) {
		char *buf = malloc(cap);
		if (!buf)
			return -ENOMEM;
		if (group) {
			struct group gr, *res = NULL;
			rc = getgrnam_r(name, &gr, buf, cap, &res);
			if (rc == 0 && res)
				*id = (uint32_t)res->gr_gid;
			else if (rc == 0)
				rc = ENOENT;
		} else {
			struct passwd pw, *res = NULL;
			rc = getpwnam_r(name, &pw, buf, cap, &res);
			if (rc == 0 && res)
				*id = (uint32_t)res->pw_uid;
			else if (rc == 0)
				rc = ENOENT;
		}
		free(buf);
		if (rc != ERANGE || cap >= (1u << 24))
			break;
		cap *= 4;
	}
	/* Some NSS modules say "not found" with these. */
	if (rc == ESRCH || rc == EBADF || rc == EPERM)
		rc = ENOENT;
	return -rc;
}

/* A decimal id, or a name looked up; (uint32_t)-1 is not an id (chown's
 * "leave it"). */
static int resolve_id(const char *s, bool group, uint32_t *id, char *err, size_t errlen)
{
	const char *what = group ? "group" : "user";
	uint64_t v;

	if (!*s)
		return sw_seterr(err, errlen, -EINVAL, "an empty %s name", what);
	if (parse_u64(s, &v)) {
		if (v >= UINT32_MAX)
			return sw_seterr(err, errlen, -EINVAL, "%s id %s out of range", what, s);
		*id = (uint32_t)v;
		return 0;
	}
	int rc = lookup_name(s, group, id);
	if (rc == -ENOENT)
		return sw_seterr(err, errlen, -ENOENT, "no %s named \"%s\"", what, s);
	if (rc)
		return sw_seterr(err, errlen, rc, "looking up %s \"%s\": %s", what, s,
				 strerror(-rc));
	return 0;
}

int sw_config_group_id(const char *s, uint32_t *gid, char *err, size_t errlen)
{
	return resolve_id(s ? s : "", true, gid, err, errlen);
}

/* ---- setting one field ---------------------------------------------- */

static int set_string(const struct field *f, char *dst, const json_t *v, const char *path,
		      char *err, size_t errlen)
{
	char what[64];

	if (!json_is_string(v)) {
		const char *w = f->kind == K_REDIS_URL ? "a redis://, rediss:// or unix:// URL" :
				f->kind == K_PG_URL ? "a postgres:// URL or a key=value conninfo string" :
				(f->flags & F_NONEMPTY) ? "a non-empty string" : "a string";
		return expected(err, errlen, SW_ETYPE, path, w, v);
	}
	/* No embedded NULs: json_loads refuses \u0000 without JSON_ALLOW_NUL,
	 * and environment strings cannot hold one. */
	const char *s = json_string_value(v);
	size_t n = strlen(s);
	if (n >= f->size) {
		snprintf(what, sizeof(what), "a string of at most %zu bytes", f->size - 1);
		return expected(err, errlen, -EINVAL, path, what, NULL);
	}
	/* URLs may carry passwords: never echo them into a log. */
	if (f->kind == K_REDIS_URL && !redis_url_ok(s))
		return expected(err, errlen, -EINVAL, path, "a redis://, rediss:// or unix:// URL",
				NULL);
	if (f->kind == K_PG_URL && !pg_url_ok(s))
		return expected(err, errlen, -EINVAL, path,
				"a postgres:// URL or a key=value conninfo string", NULL);
	if ((f->flags & F_NONEMPTY) && n == 0)
		return expected(err, errlen, -EINVAL, path, "a non-empty string", NULL);
	memcpy(dst, s, n + 1);
	return 0;
}

static int set_devices(struct sw_config *cfg, const json_t *v, const char *path,
		       char *err, size_t errlen)
{
	struct sw_config_device devs[SW_CONFIG_MAX_DEVICES];
	char what[64], ipath[PATH_BUF];
	size_t i;
	json_t *item;

	if (!json_is_array(v))
		return expected(err, errlen, SW_ETYPE, path,
				"an array of \"cpu\" or \"cuda:N\"", v);
	if (json_array_size(v) == 0)
		return expected(err, errlen, -EINVAL, path, "at least one device", NULL);
	if (json_array_size(v) > SW_CONFIG_MAX_DEVICES) {
		snprintf(what, sizeof(what), "at most %d devices", SW_CONFIG_MAX_DEVICES);
		return expected(err, errlen, -EINVAL, path, what, NULL);
	}
	json_array_foreach(v, i, item) {
		snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
		if (!json_is_string(item))
			return expected(err, errlen, SW_ETYPE, ipath, "\"cpu\" or \"cuda:N\"", item);
		if (parse_device(json_string_value(item), &devs[i]))
			return expected(err, errlen, -EINVAL, ipath, "\"cpu\" or \"cuda:N\"", item);
		devs[i].pos = (uint32_t)i;
	}
	memcpy(cfg->gpud.devices, devs, i * sizeof(devs[0]));
	cfg->gpud.n_devices = (uint32_t)i;
	return 0;
}

/* An array of strings into char[max][size] and its count; all or
 * nothing. */
static int set_list(struct sw_config *cfg, const struct field *f, const json_t *v,
		    const char *path, char *err, size_t errlen)
{
	const char *w = (f->flags & F_ABSPATH) ? "an array of absolute paths" :
			(f->flags & F_CIDR) ? "an array of CIDRs (\"10.0.0.0/8\", \"::1/128\")" :
			"an array of strings";
	char *base = (char *)cfg, ipath[PATH_BUF], what[64], msg[SW_ERR_MAX];
	size_t i;
	json_t *item;

	if (!json_is_array(v))
		return expected(err, errlen, SW_ETYPE, path, w, v);
	if (json_array_size(v) > f->max) {
		snprintf(what, sizeof(what), "at most %" PRIu64 " entries", f->max);
		return expected(err, errlen, -EINVAL, path, what, NULL);
	}
	json_array_foreach(v, i, item) {
		const char *s = json_string_value(item);

		snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
		if (!json_is_string(item))
			return expected(err, errlen, SW_ETYPE, ipath, "a string", item);
		if (strlen(s) >= f->size) {
			snprintf(what, sizeof(what), "a string of at most %zu bytes", f->size - 1);
			return expected(err, errlen, -EINVAL, ipath, what, NULL);
		}
		if ((f->flags & F_ABSPATH) && s[0] != '/')
			return expected(err, errlen, -EINVAL, ipath, "an absolute path", item);
		if (f->flags & F_CIDR) {
			struct sw_cidr c;

			if (sw_cidr_parse(s, &c, msg, sizeof(msg)))
				return sw_seterr(err, errlen, -EINVAL, "%s: %s", ipath, msg);
		}
	}
	memset(base + f->off, 0, f->max * f->size); /* a replaced list leaves nothing behind */
	json_array_foreach(v, i, item)
		memcpy(base + f->off + i * f->size, json_string_value(item),
		       strlen(json_string_value(item)) + 1);
	*(uint32_t *)(base + f->off_n) = (uint32_t)json_array_size(v);
	return 0;
}

static int set_field(struct sw_config *cfg, const struct field *f, const json_t *v,
		     const char *path, char *err, size_t errlen);

static int set_object(struct sw_config *cfg, const struct field *table, const json_t *obj,
		      const char *path, char *err, size_t errlen)
{
	char kpath[PATH_BUF];
	const char *key;
	json_t *v;

	if (!json_is_object(obj))
		return expected(err, errlen, SW_ETYPE, path[0] ? path : "(root)", "an object", obj);
	json_object_foreach((json_t *)obj, key, v) {
		snprintf(kpath, sizeof(kpath), "%s%s%s", path, path[0] ? "." : "", key);
		/* Keys starting with "//" are comments (JSON has none). */
		if (strncmp(key, "//", 2) == 0)
			continue;
		const struct field *f = table;
		while (f->key && strcmp(f->key, key) != 0)
			f++;
		if (!f->key)
			return unknown_key(err, errlen, kpath, key, table);
		int rc = set_field(cfg, f, v, kpath, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

static int set_field(struct sw_config *cfg, const struct field *f, const json_t *v,
		     const char *path, char *err, size_t errlen)
{
	char *base = (char *)cfg;
	char what[128];
	uint64_t u;

	switch (f->kind) {
	case K_STR:
	case K_REDIS_URL:
	case K_PG_URL:
		return set_string(f, base + f->off, v, path, err, errlen);

	case K_LISTEN: {
		static const char w[] =
			"\"\" (off), \"127.0.0.1:PORT\" or \"unix:/path\" (at most 107 bytes of path)";
		if (!json_is_string(v) || !listen_ok(json_string_value(v)))
			return expected(err, errlen, json_is_string(v) ? -EINVAL : SW_ETYPE, path, w,
					v);
		return set_string(f, base + f->off, v, path, err, errlen);
	}

	case K_HOSTPORT: {
		static const char w[] =
			"\"\" (off) or \"HOST:PORT\" (an IPv4 address, [IPv6] or a host name; port 1..65535)";
		char host[SW_CONFIG_HOSTPORT_MAX];
		uint16_t port;

		if (!json_is_string(v))
			return expected(err, errlen, SW_ETYPE, path, w, v);
		if (json_string_value(v)[0] &&
		    (strlen(json_string_value(v)) >= f->size ||
		     sw_config_split_hostport(json_string_value(v), host, sizeof(host), &port,
					      NULL, 0)))
			return expected(err, errlen, -EINVAL, path, w, v);
		return set_string(f, base + f->off, v, path, err, errlen);
	}

	case K_U32:
		if (f->flags & F_POW2)
			snprintf(what, sizeof(what), "a power of two in [%" PRIu64 ", %" PRIu64 "]",
				 f->min, f->max);
		else
			snprintf(what, sizeof(what), "an integer in [%" PRIu64 ", %" PRIu64 "]",
				 f->min, f->max);
		if (!json_is_integer(v))
			return expected(err, errlen, SW_ETYPE, path, what, v);
		if (json_integer_value(v) < 0)
			return expected(err, errlen, -EINVAL, path, what, v);
		u = (uint64_t)json_integer_value(v);
		if (u < f->min || u > f->max || ((f->flags & F_POW2) && (u & (u - 1))))
			return expected(err, errlen, -EINVAL, path, what, v);
		*(uint32_t *)(base + f->off) = (uint32_t)u;
		return 0;

	case K_BYTES:
		snprintf(what, sizeof(what),
			 "a %sbyte size in [%" PRIu64 ", %" PRIu64 "] (an integer or \"64MiB\")",
			 (f->flags & F_POW2) ? "power-of-two " : "", f->min, f->max);
		if (json_is_integer(v)) {
			if (json_integer_value(v) < 0)
				return expected(err, errlen, -EINVAL, path, what, v);
			u = (uint64_t)json_integer_value(v);
		} else if (json_is_string(v)) {
			if (!parse_size(json_string_value(v), &u))
				return expected(err, errlen, -EINVAL, path, what, v);
		} else {
			return expected(err, errlen, SW_ETYPE, path, what, v);
		}
		if (u < f->min || u > f->max || ((f->flags & F_POW2) && (u & (u - 1))))
			return expected(err, errlen, -EINVAL, path, what, v);
		*(uint64_t *)(base + f->off) = u;
		return 0;

	case K_FRAC: {
		if (!json_is_number(v))
			return expected(err, errlen, SW_ETYPE, path, "a number in (0, 1]", v);
		double d = json_number_value(v);
		if (!(d > 0.0 && d <= 1.0))
			return expected(err, errlen, -EINVAL, path, "a number in (0, 1]", v);
		*(double *)(base + f->off) = d;
		return 0;
	}

	case K_LEVEL: {
		static const char w[] = "\"error\", \"warn\", \"info\" or \"debug\"";
		if (!json_is_string(v))
			return expected(err, errlen, SW_ETYPE, path, w, v);
		int lvl = sw_log_level_parse(json_string_value(v));
		if (lvl < 0)
			return expected(err, errlen, -EINVAL, path, w, v);
		*(int *)(base + f->off) = lvl;
		return 0;
	}

	case K_NAME: {
		char w[128];
		size_t o = 0;
		for (uint32_t i = 0; f->names[i] && o < sizeof(w); i++)
			o += (size_t)snprintf(w + o, sizeof(w) - o, "%s\"%s\"",
					      !i ? "" : f->names[i + 1] ? ", " : " or ", f->names[i]);
		if (!json_is_string(v))
			return expected(err, errlen, SW_ETYPE, path, w, v);
		for (uint32_t i = 0; f->names[i]; i++) {
			if (!strcmp(json_string_value(v), f->names[i])) {
				*(uint32_t *)(base + f->off) = i;
				return 0;
			}
		}
		return expected(err, errlen, -EINVAL, path, w, v);
	}

	case K_DEVICES:
		return set_devices(cfg, v, path, err, errlen);

	case K_LIST:
		return set_list(cfg, f, v, path, err, errlen);

	case K_MODE: {
		static const char w[] = "an octal mode string from \"0600\" to \"0777\" that "
					"gives the owner rw, such as \"0660\"";
		uint32_t m;
		if (!json_is_string(v))
			return expected(err, errlen, SW_ETYPE, path, w, v);
		if (!parse_mode(json_string_value(v), &m))
			return expected(err, errlen, -EINVAL, path, w, v);
		*(uint32_t *)(base + f->off) = m;
		return 0;
	}

	case K_GROUP: {
		char why[SW_ERR_MAX];
		uint32_t gid;
		if (!json_is_string(v))
			return expected(err, errlen, SW_ETYPE, path,
					"a group name or gid as a string (\"\" = gpud's own group)", v);
		const char *g = json_string_value(v);
		if (*g) {
			int rc = resolve_id(g, true, &gid, why, sizeof(why));
			if (rc)
				return sw_seterr(err, errlen, rc == -ENOENT ? -EINVAL : rc, "%s: %s",
						 path, why);
		}
		return set_string(f, base + f->off, v, path, err, errlen);
	}

	case K_IDS: {
		bool group = f->flags & F_GROUP;
		struct sw_config_ids ids = { 0 };
		char ipath[PATH_BUF], why[SW_ERR_MAX];
		size_t i;
		json_t *item;
		snprintf(what, sizeof(what), "an array of at most %d %s names or %s", SW_CONFIG_MAX_IDS,
			 group ? "group" : "user", group ? "gids" : "uids");
		if (!json_is_array(v))
			return expected(err, errlen, SW_ETYPE, path, what, v);
		if (json_array_size(v) > SW_CONFIG_MAX_IDS)
			return expected(err, errlen, -EINVAL, path, what, NULL);
		json_array_foreach(v, i, item) {
			int rc;
			snprintf(ipath, sizeof(ipath), "%s[%zu]", path, i);
			if (json_is_integer(item)) {
				json_int_t n = json_integer_value(item);
				if (n < 0 || n >= (json_int_t)UINT32_MAX)
					return expected(err, errlen, -EINVAL, ipath,
							group ? "a gid in [0, 4294967294]"
							      : "a uid in [0, 4294967294]", item);
				ids.id[i] = (uint32_t)n;
				continue;
			}
			if (!json_is_string(item))
				return expected(err, errlen, SW_ETYPE, ipath,
						group ? "a group name or gid" : "a user name or uid", item);
			rc = resolve_id(json_string_value(item), group, &ids.id[i], why, sizeof(why));
			if (rc)
				return sw_seterr(err, errlen, rc == -ENOENT ? -EINVAL : rc, "%s: %s",
						 ipath, why);
		}
		ids.n = (uint32_t)i;
		*(struct sw_config_ids *)(base + f->off) = ids;
		return 0;
	}

	case K_OBJ:
		return set_object(cfg, f->sub, v, path, err, errlen);
	}
	return sw_seterr(err, errlen, -EINVAL, "%s: internal error: bad field kind", path);
}

/* ---- cross-field checks --------------------------------------------- */

int sw_config_validate(const struct sw_config *cfg, unsigned flags, char *err, size_t errlen)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;
	const typeof(cfg->agentd) *a = &cfg->agentd;

	if (g->queue.per_connection > g->queue.global)
		return sw_seterr(err, errlen, -EINVAL,
				 "gpud.queue.per_connection: expected at most gpud.queue.global (%u), got %u",
				 g->queue.global, g->queue.per_connection);
	if (g->min_devices > g->n_devices)
		return sw_seterr(err, errlen, -EINVAL,
				 "gpud.min_devices: expected at most the %u device%s of gpud.devices, got %u",
				 g->n_devices, g->n_devices == 1 ? "" : "s", g->min_devices);
	for (uint32_t i = 0; i < g->n_devices; i++) {
		if (g->devices[i].kind != SW_DEVICE_CUDA)
			continue; /* several cpu devices are allowed (scheduler tests) */
		for (uint32_t j = 0; j < i; j++)
			if (g->devices[j].kind == SW_DEVICE_CUDA &&
			    g->devices[j].index == g->devices[i].index)
				return sw_seterr(err, errlen, -EINVAL,
						 "gpud.devices[%u]: \"cuda:%d\" duplicates gpud.devices[%u]",
						 i, g->devices[i].index, j);
	}
	if (a->restart_backoff_min_ms > a->restart_backoff_max_ms)
		return sw_seterr(err, errlen, -EINVAL,
				 "agentd.restart_backoff_min_ms: expected at most agentd.restart_backoff_max_ms (%u), got %u",
				 a->restart_backoff_max_ms, a->restart_backoff_min_ms);
	if (cfg->supervisor.restart_backoff_min_ms > cfg->supervisor.restart_backoff_max_ms)
		return sw_seterr(err, errlen, -EINVAL,
				 "supervisor.restart_backoff_min_ms: expected at most supervisor.restart_backoff_max_ms (%u), got %u",
				 cfg->supervisor.restart_backoff_max_ms,
				 cfg->supervisor.restart_backoff_min_ms);
	if (strcmp(a->answer_chunk_mask, "system") && strcmp(a->answer_chunk_mask, "self"))
		return sw_seterr(err, errlen, -EINVAL,
				 "agentd.answer_chunk_mask: expected \"system\" or \"self\", got \"%s\"",
				 a->answer_chunk_mask);
	if (a->heartbeat_ms >= a->lease_ms)
		return sw_seterr(err, errlen, -EINVAL,
				 "agentd.heartbeat_ms: expected less than agentd.lease_ms (%u), got %u",
				 a->lease_ms, a->heartbeat_ms);
	if ((flags & SW_CONFIG_NEED_MODEL) && !g->model[0])
		return sw_seterr(err, errlen, -EINVAL,
				 "gpud.model: required (set it in the config file or SWARM_MODEL)");
	return 0;
}

/* ---- loading -------------------------------------------------------- */

int sw_config_load_string(const char *json, struct sw_config *cfg, char *err, size_t errlen)
{
	struct sw_config tmp;
	json_error_t jerr;
	json_t *root;
	int rc;

	root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sw_seterr(err, errlen, SW_EFORMAT, "line %d, column %d: %s",
				 jerr.line, jerr.column, jerr.text);
	sw_config_defaults(&tmp);
	rc = set_object(&tmp, root_fields, root, "", err, errlen);
	json_decref(root);
	if (rc)
		return rc;
	rc = sw_config_validate(&tmp, 0, err, errlen);
	if (rc)
		return rc;
	*cfg = tmp;
	return 0;
}

/* Whether url carries a password (the redaction would change it). */
static bool url_has_password(const char *url)
{
	char red[SW_CONFIG_URL_MAX + 8];

	sw_config_redact_url(url, red, sizeof(red));
	return strcmp(red, url) != 0;
}

int sw_config_load_file(const char *path, struct sw_config *cfg, char *err, size_t errlen)
{
	struct sw_config tmp;
	char msg[SW_ERR_MAX];
	struct stat st;
	char *buf;
	size_t n;
	long size;
	int rc;
	FILE *fp = fopen(path, "re");

	if (!fp)
		return sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fileno(fp), &st) < 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
		goto out_close;
	}
	if (S_ISDIR(st.st_mode)) {
		rc = sw_seterr(err, errlen, -EISDIR, "%s: %s", path, strerror(EISDIR));
		goto out_close;
	}
	if (fseek(fp, 0, SEEK_END) < 0 || (size = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) < 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
		goto out_close;
	}
	if ((unsigned long)size > CONFIG_FILE_MAX) {
		rc = sw_seterr(err, errlen, SW_ETOOLONG, "%s: larger than %u bytes", path,
			       CONFIG_FILE_MAX);
		goto out_close;
	}
	buf = malloc((size_t)size + 1);
	if (!buf) {
		rc = sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", path);
		goto out_close;
	}
	n = fread(buf, 1, (size_t)size, fp);
	if (ferror(fp)) {
		rc = sw_seterr(err, errlen, -EIO, "%s: read error", path);
		goto out_free_buf;
	}
	buf[n] = '\0';
	if (strlen(buf) != n) {
		rc = sw_seterr(err, errlen, SW_EFORMAT, "%s: contains a NUL byte", path);
		goto out_free_buf;
	}
	rc = sw_config_load_string(buf, &tmp, msg, sizeof(msg));
	if (rc)
		sw_seterr(err, errlen, rc, "%s: %s", path, msg);
	else if ((st.st_mode & 077) && (url_has_password(tmp.redis.url) ||
					url_has_password(tmp.postgres.url)))
		rc = sw_seterr(err, errlen, -EPERM, "%s: %s holds a password, but the file's mode "
			       "%04o lets group or others read it: put the password in %s "
			       "(mode 0600) or %s, or chmod 600 %s", path,
			       url_has_password(tmp.redis.url) ? "redis.url" : "postgres.url",
			       (unsigned)(st.st_mode & 07777),
			       url_has_password(tmp.redis.url) ? "redis.password_file"
							       : "postgres.password_file",
			       url_has_password(tmp.redis.url) ? "SWARM_REDIS_PASSWORD"
							       : "SWARM_PG_PASSWORD", path);
	else
		*cfg = tmp;

out_free_buf:
	free(buf);
out_close:
	fclose(fp);
	return rc;
}

/* ---- environment ---------------------------------------------------- */

/* The env string as the JSON value a config file would hold, so one set of
 * checks and messages serves both. NULL when out of memory. */
static json_t *env_value(const struct field *f, const char *s)
{
	uint64_t u;

	switch (f->kind) {
	case K_U32:
	case K_BYTES:
		if (parse_u64(s, &u) && u <= INT64_MAX)
			return json_integer((json_int_t)u);
		return json_string(s);
	case K_DEVICES:
	case K_LIST: {
		json_t *arr = json_array();
		const char *p = s;
		if (!arr || !*s)
			return arr; /* "" -> []: no device (an error), an empty list */
		for (;;) {
			const char *comma = strchr(p, ',');
			size_t len = comma ? (size_t)(comma - p) : strlen(p);
			/* "cpu, cuda:0" is what people type: trim blanks. */
			while (len && *p == ' ') {
				p++;
				len--;
			}
			while (len && p[len - 1] == ' ')
				len--;
			if (json_array_append_new(arr, json_stringn(p, len))) {
				json_decref(arr);
				return NULL;
			}
			if (!comma)
				return arr;
			p = comma + 1;
		}
	}
	default:
		return json_string(s);
	}
}

static int apply_env_table(struct sw_config *cfg, const struct field *table, char *err,
			   size_t errlen)
{
	for (const struct field *f = table; f->key; f++) {
		int rc;

		if (f->kind == K_OBJ) {
			rc = apply_env_table(cfg, f->sub, err, errlen);
			if (rc)
				return rc;
			continue;
		}
		if (!f->env)
			continue;
		const char *s = getenv(f->env);
		if (!s)
			continue;
		json_t *v = env_value(f, s);
		if (!v)
			return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", f->env);
		rc = set_field(cfg, f, v, f->env, err, errlen);
		json_decref(v);
		if (rc)
			return rc;
	}
	return 0;
}

int sw_config_apply_env(struct sw_config *cfg, char *err, size_t errlen)
{
	struct sw_config tmp = *cfg;
	int rc;

	rc = apply_env_table(&tmp, root_fields, err, errlen);
	if (rc)
		return rc;
	rc = sw_config_validate(&tmp, 0, err, errlen);
	if (rc)
		return rc;
	*cfg = tmp;
	return 0;
}

/* ---- output --------------------------------------------------------- */

/* Appends "***" (or as much as fits) to out[0, len); returns the new len. */
static size_t redact_span(char *out, size_t len, size_t outlen)
{
	size_t room = outlen - 1 - len;
	size_t n = room < 3 ? room : 3;

	memcpy(out + len, "***", n);
	return len + n;
}

void sw_config_redact_url(const char *url, char *out, size_t outlen)
{
	size_t len = 0;
	const char *p = url;
	const char *scheme_end = strstr(url, "://");
	const char *user_end = NULL; /* the ':' before a userinfo password */
	const char *at = NULL;

	if (outlen == 0)
		return;
	if (scheme_end) {
		const char *auth = scheme_end + 3;
		/* The userinfo ends at the last '@': an unencoded password may
		 * hold '/', '?' or '#', and over-redacting a log line is harmless. */
		at = strrchr(auth, '@');
		if (at) {
			const char *colon = memchr(auth, ':', (size_t)(at - auth));
			if (colon)
				user_end = colon;
		}
	}
	while (*p && len + 1 < outlen) {
		if (p == user_end) {
			out[len++] = ':';
			len = redact_span(out, len, outlen);
			p = at;
			continue;
		}
		/* password=value as a conninfo keyword or a query parameter. */
		if (strncasecmp(p, "password=", 9) == 0 &&
		    (p == url || p[-1] == ' ' || p[-1] == '?' || p[-1] == '&')) {
			size_t n = 9 < outlen - 1 - len ? 9 : outlen - 1 - len;
			memcpy(out + len, p, n);
			len += n;
			if (n < 9)
				break;
			len = redact_span(out, len, outlen);
			p += 9;
			if (*p == '\'') { /* conninfo quoting, \' escapes a quote */
				p++;
				while (*p && !(*p == '\'' && p[-1] != '\\'))
					p++;
				if (*p)
					p++;
			} else {
				p += strcspn(p, " &#");
			}
			continue;
		}
		out[len++] = *p++;
	}
	out[len] = '\0';
}

static json_t *table_to_json(const struct sw_config *cfg, const struct field *table)
{
	const char *base = (const char *)cfg;
	json_t *obj = json_object();
	/* Redaction can lengthen a URL ("password=x" -> "password=***"): room
	 * for all of it, so a long URL is shown whole, never cut mid-escape. */
	char buf[2 * SW_CONFIG_URL_MAX];

	if (!obj)
		return NULL;
	for (const struct field *f = table; f->key; f++) {
		json_t *v = NULL;

		switch (f->kind) {
		case K_STR:
		case K_LISTEN:
		case K_HOSTPORT:
		case K_GROUP:
			v = json_string(base + f->off);
			break;
		case K_MODE:
			snprintf(buf, sizeof(buf), "%04" PRIo32, *(const uint32_t *)(base + f->off));
			v = json_string(buf);
			break;
		case K_IDS: {
			const struct sw_config_ids *ids = (const void *)(base + f->off);
			v = json_array();
			for (uint32_t i = 0; v && i < ids->n; i++) {
				if (json_array_append_new(v, json_integer(ids->id[i]))) {
					json_decref(v);
					v = NULL;
				}
			}
			break;
		}
		case K_REDIS_URL:
		case K_PG_URL:
			sw_config_redact_url(base + f->off, buf, sizeof(buf));
			v = json_string(buf);
			break;
		case K_U32:
			v = json_integer(*(const uint32_t *)(base + f->off));
			break;
		case K_BYTES:
			v = json_integer((json_int_t)*(const uint64_t *)(base + f->off));
			break;
		case K_FRAC:
			v = json_real(*(const double *)(base + f->off));
			break;
		case K_LEVEL:
			v = json_string(sw_log_level_name(*(const int *)(base + f->off)));
			break;
		case K_NAME:
			v = json_string(f->names[*(const uint32_t *)(base + f->off)]);
			break;
		case K_DEVICES:
			v = json_array();
			for (uint32_t i = 0; v && i < cfg->gpud.n_devices; i++) {
				sw_config_device_name(&cfg->gpud.devices[i], buf, sizeof(buf));
				if (json_array_append_new(v, json_string(buf))) {
					json_decref(v);
					v = NULL;
				}
			}
			break;
		case K_LIST:
			v = json_array();
			for (uint32_t i = 0; v && i < *(const uint32_t *)(base + f->off_n); i++)
				if (json_array_append_new(v, json_string(base + f->off + i * f->size))) {
					json_decref(v);
					v = NULL;
				}
			break;
		case K_OBJ:
			v = table_to_json(cfg, f->sub);
			break;
		}
		if (!v || json_object_set_new(obj, f->key, v)) {
			json_decref(obj);
			return NULL;
		}
	}
	return obj;
}

char *sw_config_to_json(const struct sw_config *cfg)
{
	json_t *root = table_to_json(cfg, root_fields);
	char *s;

	if (!root)
		return NULL;
	s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
	json_decref(root);
	return s;
}
