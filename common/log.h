/* log.h - leveled logging to stderr or a file.
 *
 * The level is tested before the arguments are evaluated, so
 * `log_debug("%s", expensive())` costs one branch when debug is off.
 * Every line carries a timestamp, the level, the process tag and the
 * calling function: "2026-11-29T08:00:00.123Z I gpud[42] serve: listening".
 * Thread-safe; each line is one write(2).
 */
#ifndef SW_LOG_H
#define SW_LOG_H

#include <stdbool.h>

enum sw_log_level {
	SW_LOG_ERROR = 0,
	SW_LOG_WARN = 1,
	SW_LOG_INFO = 2,
	SW_LOG_DEBUG = 3,
};

extern int sw_log_level; /* lines above this level are dropped */

/* Sets the process tag ("gpud") shown on each line. tag is copied. */
void sw_log_init(const char *tag, enum sw_log_level level);

/* Sends output to path (appended, created 0640) or to stderr when path is
 * NULL. Returns 0 or a negative errno; on error the old target stays. */
int sw_log_open(const char *path);

/* Reopens the current file (after logrotate moved it). Async-signal-safe
 * callers should use sw_log_install_sigusr1() instead of calling this from
 * a handler. Returns 0 or a negative errno. */
int sw_log_reopen(void);

/* The fd lines go to now (the log file's, or 2 for stderr): for writers
 * that must not allocate, such as backtrace_symbols_fd. */
int sw_log_fd(void);

/* Installs a SIGUSR1 handler that makes the next log line reopen the file. */
int sw_log_install_sigusr1(void);

/* Parses "error", "warn" (or "warning"), "info", "debug", in any case;
 * returns the level or -1 if unknown or NULL. */
int sw_log_level_parse(const char *s);

/* "error", "warn", "info", "debug"; "unknown" for anything else. Static. */
const char *sw_log_level_name(int level);

/* Formats and writes one line; use the log_* macros instead, which skip
 * the call (and the argument evaluation) when the level is filtered.
 * Lines longer than 4 KiB are cut and end in "...". errno is preserved, and
 * %m works. Never fails visibly: if the target cannot be written the line
 * is lost. A reopen requested by SIGUSR1 happens here, before the write. */
void sw_log_write(enum sw_log_level level, const char *func, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define sw_log_at(lvl, ...)                                        \
	do {                                                       \
		if ((int)(lvl) <= sw_log_level)                    \
			sw_log_write((lvl), __func__, __VA_ARGS__); \
	} while (0)

#define log_error(...) sw_log_at(SW_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) sw_log_at(SW_LOG_WARN, __VA_ARGS__)
#define log_info(...) sw_log_at(SW_LOG_INFO, __VA_ARGS__)
#define log_debug(...) sw_log_at(SW_LOG_DEBUG, __VA_ARGS__)

#endif
