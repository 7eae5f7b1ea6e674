/* privdrop.h - a daemon started as root becomes the configured user
 * (the `user` key of the configuration) once what needs root is open.
 *
 * gpud and agentd call sw_privdrop() after loading the configuration,
 * reading the passwords (common/secret.h) and opening the log file, and
 * before anything reads outside bytes (a model file, a task) or creates
 * a file others use (gpud's socket, agentd's status file): those are then
 * the user's. The switch sets the user's supplementary groups
 * (initgroups), then real, effective and saved gid, then uid, and checks
 * that root cannot be taken back.
 */
#ifndef SW_PRIVDROP_H
#define SW_PRIVDROP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* user: a name from the password database, or a numeric uid; "" or NULL
 * = nothing to do (0). As root: switches to that user and its primary
 * group and groups; 0 when done and verified. Not as root: 0 when the
 * process already runs as that user (a unit's User=, a worker spawned by
 * a supervisor that switched), else -EPERM ("started as uid N, not root:
 * cannot switch to user X"). An unknown user is -ENOENT naming it; a
 * failed or incomplete switch is the negated errno, or -EPERM when root
 * could be regained. On error the caller must exit: the ids may be half
 * switched. *switched (may be NULL) is true when ids were changed. */
int sw_privdrop(const char *user, bool *switched, char *err, size_t errlen);

#endif
