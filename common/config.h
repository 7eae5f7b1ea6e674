/* config.h - the whole swarm configuration: one struct, defaults, a JSON
 * file, environment overrides, validation.
 *
 * Layering: sw_config_defaults() < the JSON file < SWARM_* environment
 * variables. Every value has a default except gpud.model. Unknown keys are
 * errors, so a typo never passes silently; every error names the exact key
 * path and what was expected:
 *
 *   gpud.devices[2]: expected "cpu" or "cuda:N", got "gpu0"
 *   gpud.thread: unknown key (did you mean "threads"?)
 *
 * Byte sizes accept an integer or a string with a binary unit ("64MiB",
 * "2GiB"; units B, KiB, MiB, GiB, TiB). JSON has no comments, so keys
 * starting with "//" are ignored at any level. config/swarm.json documents
 * every key. The struct is plain data (no pointers): copy it freely, and
 * there is nothing to free.
 */
#ifndef SW_CONFIG_H
#define SW_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define SW_CONFIG_PATH_MAX 1024
#define SW_CONFIG_URL_MAX 1024
#define SW_CONFIG_SOCKET_MAX 108   /* sizeof(sockaddr_un.sun_path) */
#define SW_CONFIG_MAX_DEVICES 16
#define SW_CONFIG_USER_MAX 64
#define SW_CONFIG_METRICS_MAX (SW_CONFIG_SOCKET_MAX + 5) /* "unix:" + a socket path */
#define SW_CONFIG_FETCH_DIRS_MAX 16
#define SW_CONFIG_FETCH_CIDRS_MAX 64
#define SW_CONFIG_CIDR_MAX 64      /* = SW_CIDR_STR_MAX (common/addr.h) */
#define SW_CONFIG_NAME_MAX 64      /* a user or group name */
#define SW_CONFIG_MAX_IDS 64       /* gpud.allowed_uids, gpud.allowed_gids */
#define SW_CONFIG_HOSTPORT_MAX 262 /* http.listen: "[" host(<=253) "]:" 5 digits */

enum sw_device_kind {
	SW_DEVICE_CPU = 0,
	SW_DEVICE_CUDA = 1,
};

/* gpud.kv_type: the element type of the KV cache. */
enum sw_config_kv_type {
	SW_KV_F32 = 0, /* "f32": the reference */
	SW_KV_F16 = 1, /* "f16": half the bytes, so twice the tokens */
};

struct sw_config_device {
	enum sw_device_kind kind;
	int index;                              /* CUDA ordinal; 0 for cpu */
	/* Its place in gpud.devices as configured: gpud numbers it in every
	 * name and message with this (gpud sets it at start), so that a
	 * device left out (gpud.min_devices) renames none of the others. */
	uint32_t pos;
};

/* A list of numeric user or group ids (names are resolved at load). */
struct sw_config_ids {
	uint32_t n;
	uint32_t id[SW_CONFIG_MAX_IDS];
};

struct sw_config {
	char state_dir[SW_CONFIG_PATH_MAX];     /* status file, dumps; managed: everything */
	/* gpud and agentd started as root switch to this user (its groups
	 * too) once what needs root is open; "" = stay (common/privdrop.h) */
	char user[SW_CONFIG_USER_MAX];

	struct {
		int level;                      /* enum sw_log_level */
		char file[SW_CONFIG_PATH_MAX];  /* "" = stderr */
	} log;

	struct {
		char url[SW_CONFIG_URL_MAX];    /* redis://, rediss:// or unix:// */
		char password_file[SW_CONFIG_PATH_MAX]; /* mode 0600; "" = none (common/secret.h) */
		uint64_t maxmemory;             /* managed Redis only; 0 = no limit */
	} redis;

	struct {
		char url[SW_CONFIG_URL_MAX];    /* postgres[ql]:// URL or key=value conninfo */
		char password_file[SW_CONFIG_PATH_MAX]; /* mode 0600; "" = none (common/secret.h) */
	} postgres;

	struct {
		char socket[SW_CONFIG_SOCKET_MAX];
		/* Who may use the socket (DESIGN §6a). The file is created with
		 * socket_mode and owned by socket_group; gpud then admits, by
		 * SO_PEERCRED: root, its own uid, the socket's group when the
		 * mode gives the group rw, and the ids listed here (a peer's
		 * gid or one of its supplementary groups). */
		uint32_t socket_mode;           /* permission bits: owner rw, <= 0777 */
		char socket_group[SW_CONFIG_NAME_MAX]; /* name or gid; "" = gpud's own */
		struct sw_config_ids allowed_uids; /* user names or uids, resolved */
		struct sw_config_ids allowed_gids; /* group names or gids, resolved */
		char model[SW_CONFIG_PATH_MAX]; /* GGUF file; required by gpud */
		/* Chat format of chat requests: "auto" (from the model's
		 * tokenizer.chat_template) or a name gpud_chat_parse knows
		 * (gpud/chat.h; gpud checks it at start). */
		char chat_format[32];
		struct sw_config_device devices[SW_CONFIG_MAX_DEVICES];
		uint32_t n_devices;             /* >= 1 */
		/* The fewest devices gpud starts on: a device that cannot
		 * start (absent, its query or its engine fails) is left out
		 * while at least this many remain; 0 = every configured device
		 * must start (<= n_devices). */
		uint32_t min_devices;
		uint32_t threads;               /* cpu backend threads; 0 = online CPUs */
		double memory_fraction;         /* of each device, 0 < x <= 1 */
		uint32_t kv_block_tokens;       /* power of two, 1..1024 */
		uint32_t kv_blocks;             /* per device; 0 = derive from memory */
		uint32_t kv_type;               /* enum sw_config_kv_type: how K
						 * and V are stored */
		uint32_t max_batch_tokens;      /* tokens per forward step */
		uint32_t max_seqs;              /* sequences in flight per device */
		uint32_t logprob_rows;          /* logits rows a step keeps beyond
						 * one a sequence, for the prompt's
						 * log probabilities */
		uint32_t max_segments;          /* 64..127 mask segments per request */
		uint32_t context;               /* 0 = the model's trained context */
		uint64_t mask_cache_bytes;
		uint64_t prefix_cache_bytes;    /* 0 = prefix cache off */
		uint64_t chunk_cache_bytes;     /* KV bytes of self-only segments
						 * kept for reuse at any offset;
						 * 0 = chunk-KV cache off */
		uint32_t placement_margin;      /* requests a device caching a
						 * prompt's prefix may queue beyond
						 * the least-loaded one's */
		uint32_t sample_threads;        /* threads sampling a step's rows;
						 * 0 = one per online CPU (<= 16) */
		struct {
			uint32_t per_connection; /* queued requests per client */
			uint32_t global;         /* queued requests in all */
		} queue;
		uint32_t shutdown_deadline_ms;
		/* A GPU's step (a forward pass, an embedding) running longer
		 * is a hung device: its requests fail with SW_EDEVICE and gpud
		 * exits for a restart. 0 = never. CPU devices are not watched. */
		uint32_t step_timeout_ms;
		/* The server's reservations (gpud/server.h). */
		uint32_t max_connections;       /* client connections open at once */
		uint64_t ring_bytes;            /* response ring per connection, a power of two */
		uint64_t request_bytes;         /* request area per connection */
		uint64_t stage_bytes;           /* staging per request slot (slow clients) */
		uint32_t stall_ms;              /* a client not reading this long is dropped */
		/* Prometheus text endpoint: "" (off), "127.0.0.1:PORT" or
		 * "unix:/path/to.sock". */
		char metrics[SW_CONFIG_METRICS_MAX];
		struct {
			uint32_t window_ms;     /* trough window */
			uint32_t k;             /* troughs compared, 2..256 */
		} watchdog;
	} gpud;

	struct {
		uint32_t workers;
		uint32_t max_attempts;          /* deliveries before dead-letter */
		uint32_t lease_ms;              /* XAUTOCLAIM idle threshold */
		uint32_t max_tasks_per_worker;  /* then recycle; 0 = never */
		uint32_t heartbeat_ms;          /* < lease_ms */
		uint32_t restart_backoff_min_ms;
		uint32_t restart_backoff_max_ms;
		uint32_t crash_window_ms;
		uint32_t crash_limit;           /* crashes per window before failed */
		uint32_t results_maxlen;        /* swarm:results cap (XADD MAXLEN ~) */
		uint32_t dead_maxlen;           /* swarm:dead cap (XADD MAXLEN ~) */
		/* What an answer task's chunk segments see besides themselves
		 * when the task does not say (task field "chunk_mask"):
		 * "system" (the system prompt) or "self" (nothing: gpud's
		 * chunk-KV cache reuses them at any position). */
		char answer_chunk_mask[16];
		/* What a task's URL or callback may reach (agentd/fetch.h). */
		struct {
			/* file:// only below these (absolute) directories;
			 * none = file:// refused. */
			char file_dirs[SW_CONFIG_FETCH_DIRS_MAX][SW_CONFIG_PATH_MAX];
			uint32_t n_file_dirs;
			/* Networks opened despite the default deny list
			 * (loopback, private, ...), each a valid CIDR text. */
			char allow_cidrs[SW_CONFIG_FETCH_CIDRS_MAX][SW_CONFIG_CIDR_MAX];
			uint32_t n_allow_cidrs;
		} fetch;
	} agentd;

	/* gpud-http, the OpenAI-compatible HTTP front (http/). */
	struct {
		/* "HOST:PORT" (an IPv4 literal, "[IPv6]" or a host name;
		 * PORT 1..65535); "" = off. */
		char listen[SW_CONFIG_HOSTPORT_MAX];
		/* Bearer keys, one a line, mode 0600 or stricter; "" = no
		 * auth, which gpud-http allows only on a loopback listener. */
		char api_key_file[SW_CONFIG_PATH_MAX];
		uint32_t max_connections;       /* HTTP connections open at once */
		uint64_t max_body_bytes;        /* a larger request body gets 413 */
		uint32_t header_timeout_ms;     /* a request's head must arrive within this */
		uint32_t idle_timeout_ms;       /* a kept-alive connection idle this long is closed */
	} http;

	/* swarmctl's managed-mode supervisor (Redis, PostgreSQL, gpud,
	 * agentd); systemd's job in external mode. */
	struct {
		uint32_t restart_backoff_min_ms;
		uint32_t restart_backoff_max_ms;
		uint32_t crash_window_ms;
		uint32_t crash_limit;           /* crashes per window before failed */
		uint32_t hang_ms;               /* not answering this long: killed; 0 = off */
		uint64_t log_max_bytes;         /* a service's log is rotated past this */
		uint32_t log_keep;              /* rotated copies kept (NAME.log.1 ..) */
	} supervisor;
};

/* Flags for sw_config_validate. */
enum {
	SW_CONFIG_NEED_MODEL = 1u << 0, /* gpud: gpud.model must be set */
};

/* Fills cfg with the defaults (gpud.model empty). Never fails. */
void sw_config_defaults(struct sw_config *cfg);

/* Parses JSON text: cfg becomes the defaults overlaid with its keys, then
 * cross-checked (sw_config_validate without flags). Returns 0, SW_EFORMAT
 * (bad JSON: "line L, column C: ..."), SW_ETYPE or -EINVAL (a value or
 * key is wrong: "<key path>: ..."), or -ENOMEM. On error err holds the
 * message and cfg is unchanged. */
int sw_config_load_string(const char *json, struct sw_config *cfg, char *err, size_t errlen);

/* As sw_config_load_string on the file's contents; messages start with
 * "<path>: ". A missing or unreadable file returns the negated errno. A
 * password inside redis.url or postgres.url is refused (-EPERM) unless
 * the file itself is private (mode 0600 or stricter): a config file is
 * usually world-readable, so the password belongs in a password_file or
 * the environment (common/secret.h). */
int sw_config_load_file(const char *path, struct sw_config *cfg, char *err, size_t errlen);

/* Applies the SWARM_* overrides present in the environment (an unset
 * variable is ignored; a set one, even empty, must be valid):
 *   SWARM_STATE_DIR SWARM_LOG_LEVEL SWARM_LOG_FILE SWARM_REDIS_URL
 *   SWARM_PG_URL SWARM_MODEL SWARM_GPUD_SOCKET SWARM_DEVICES ("cpu, cuda:0")
 *   SWARM_THREADS SWARM_WORKERS SWARM_REDIS_MAXMEMORY SWARM_LOG_MAX_BYTES
 *   SWARM_SUPERVISOR_HANG_MS SWARM_GPUD_METRICS SWARM_USER
 *   SWARM_REDIS_PASSWORD_FILE SWARM_PG_PASSWORD_FILE
 *   SWARM_FETCH_FILE_DIRS SWARM_FETCH_ALLOW_CIDRS (comma-separated lists;
 *   "" = none) SWARM_HTTP_LISTEN SWARM_HTTP_API_KEY_FILE
 * (the passwords themselves, SWARM_REDIS_PASSWORD and SWARM_PG_PASSWORD,
 * are read by common/secret.h, never stored here).
 * Errors name the variable ("SWARM_WORKERS: expected an integer in
 * [1, 4096], got \"lots\""); then cfg is unchanged. Returns as load. */
int sw_config_apply_env(struct sw_config *cfg, char *err, size_t errlen);

/* Cross-field checks (queue.per_connection <= queue.global, backoff
 * min <= max (agentd and supervisor), heartbeat < lease, no duplicate
 * device) and, with
 * SW_CONFIG_NEED_MODEL, that gpud.model is set. Returns 0 or -EINVAL. */
int sw_config_validate(const struct sw_config *cfg, unsigned flags, char *err, size_t errlen);

/* The effective configuration as compact JSON with sorted keys, passwords
 * in URLs replaced by "***". It loads back with sw_config_load_string
 * (redacted URLs aside). Returns a malloc'd string the caller frees, or
 * NULL when out of memory. */
char *sw_config_to_json(const struct sw_config *cfg);

/* Copies url to out with any password replaced by "***": the userinfo
 * password of a URL (scheme://user:secret@host) and any password=value
 * (conninfo keyword or query parameter). Always NUL-terminates (when
 * outlen > 0); truncates to fit. */
void sw_config_redact_url(const char *url, char *out, size_t outlen);

/* A group given by name or as a decimal gid (gpud.socket_group): 0 and
 * *gid, or -ENOENT ("no group named \"x\"") / -EINVAL (empty) with a
 * message. A number is taken as is, whether or not a group has it. Looks
 * names up with getgrnam_r (NSS: may consult a directory service). */
int sw_config_group_id(const char *s, uint32_t *gid, char *err, size_t errlen);

/* Splits an http.listen value "HOST:PORT" (HOST an IPv4 literal, a
 * bracketed IPv6 literal "[::1]" or a host name of letters, digits, '-'
 * and '.'; PORT a decimal in 1..65535 without a leading zero) into host
 * (brackets removed, NUL-terminated, hostlen >= SW_CONFIG_HOSTPORT_MAX
 * always fits) and *port. Returns 0, or -EINVAL with a message saying what
 * was expected. "" is an error here (off is the caller's business). */
int sw_config_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port,
			     char *err, size_t errlen);

/* "cpu" or "cuda:N" into out. */
void sw_config_device_name(const struct sw_config_device *d, char *out, size_t outlen);

#endif
