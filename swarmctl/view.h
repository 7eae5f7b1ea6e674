/* view.h - what `swarmctl status` and `swarmctl top` show: gpud's stats
 * (per-device memory, pools with their troughs, caches), the task queue
 * and task throughput.
 */
#ifndef SWARMCTL_VIEW_H
#define SWARMCTL_VIEW_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "swarmctl/services.h"
#include "swarmctl/tasks.h"

/* The process table of status and top: an object keyed by service name
 * ("supervisor" first in managed mode, then redis, postgres, gpud,
 * agentd, and gpud-http while http.listen is set or it runs, with its
 * "listen"). Each: "up" (a live pid; for an external service, whether it
 * answers), "pid", "uptime_s", "external" and "error" (why an external
 * one does not answer); in managed mode, from the supervisor's status
 * while it runs: "state" (starting|running|backoff|waiting|failed),
 * "restarts", "crashes", "last_exit", "last_exit_ago_s", "adopted", and
 * for a service that failed or could not start "start_error" and
 * "last_lines" (the end of its log at its last death) with "log".
 * *all_up: every entry up (the supervisor included); *any_up: any
 * service up. A new reference; NULL when out of memory. */
json_t *ctl_processes_json(const struct ctl_env *e, bool *all_up, bool *any_up);

/* Prints the table of ctl_processes_json: SERVICE STATE PID UPTIME
 * RESTARTS LAST EXIT, then what is wrong: a failed service's reason and
 * last log lines, a supervisor that does not run. STATE is "up" or
 * "down", or the supervisor's word for a service on its way up or down
 * (starting, backoff, waiting, failed). */
void ctl_print_processes(FILE *f, const struct ctl_env *e, const json_t *procs);

/* gpud's STATS (mem false) or MEM reply (flags: PROTO_MEM_*), parsed.
 * NULL with a message in err when gpud cannot be reached or answers
 * nonsense. The caller json_decref()s the result. */
json_t *ctl_gpud_json(const struct ctl_env *e, bool mem, uint32_t flags, char *err,
		     size_t errlen);

/* Per-device memory from a STATS object: pools grouped by the device
 * prefix of their name ("cpu0.kv" -> cpu0), pools of no device in
 * "devices" ("server.requests", "mask") under "host"; in bytes. Returns a JSON array of {device, used_bytes, high_bytes,
 * capacity_bytes, trough_bytes, live_bytes, cached_bytes} (new
 * reference; empty when stats has no pools; live is used for a gpud that
 * does not report it). */
json_t *ctl_device_memory(const json_t *stats);

/* Prints the gpud part of status/top: requests, tokens/s, per-device
 * memory, pools (live and cached parts, cache bound, trough and RISING),
 * caches with hit rates and occupancy against their bounds. */
void ctl_print_gpud(FILE *f, const json_t *stats);

/* Prints the queue line: waiting, pending, entries in swarm:tasks, and
 * the dead-lettered count, PostgreSQL's (q->dead; swarm:dead is capped,
 * what it keeps is shown beside it), or only what swarm:dead keeps when
 * q->dead is -1 (PostgreSQL unreachable). */
void ctl_print_queue(FILE *f, const struct ctl_queue_stats *q);

/* agentd's supervisor status file (<state_dir>/agentd.status.json,
 * agentd/supervisor.h), parsed; NULL when absent or unreadable. The
 * caller json_decref()s it. */
json_t *ctl_agentd_status(const struct ctl_env *e);

/* Prints one line about the workers in an agentd status object:
 * "agentd workers: 2 running, 1 backoff; 14 tasks done, 1 crash (...)". */
void ctl_print_agentd(FILE *f, const json_t *st);

/* `swarmctl top [--interval S] [--iterations N]`: refreshes in place on a
 * terminal until q (or N iterations); plain successive reports
 * otherwise. argv[0] is "top". Returns the exit status. */
int ctl_cmd_top(struct ctl_env *e, int argc, char **argv);

#endif
