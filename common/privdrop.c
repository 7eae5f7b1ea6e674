/* privdrop.c - from root to the configured user (see privdrop.h). */
#include "common/privdrop.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

/* The password database entry for a name or a numeric uid. */
static int lookup(const char *user, uid_t *uid, gid_t *gid, char *name, size_t namelen,
		  char *err, size_t errlen)
{
	char buf[4096], *end;
	struct passwd pw, *res = NULL;
	unsigned long n;
	int rc;

	errno = 0;
	n = strtoul(user, &end, 10);
	if (*user >= '0' && *user <= '9' && !*end && n <= (unsigned long)(uid_t)-2)
		rc = getpwuid_r((uid_t)n, &pw, buf, sizeof(buf), &res);
	else
		rc = getpwnam_r(user, &pw, buf, sizeof(buf), &res);
	if (rc)
		return sw_seterr(err, errlen, -rc, "user %s: %s", user, strerror(rc));
	if (!res)
		return sw_seterr(err, errlen, -ENOENT, "user %s: no such user (create it, e.g. "
				 "useradd --system --no-create-home --shell /usr/sbin/nologin %s, "
				 "or change `user` in the configuration)", user, user);
	*uid = pw.pw_uid;
	*gid = pw.pw_gid;
	snprintf(name, namelen, "%s", pw.pw_name);
	return 0;
}

int sw_privdrop(const char *user, bool *switched, char *err, size_t errlen)
{
	char name[256];
	uid_t uid, ruid, euid, suid;
	gid_t gid, rgid, egid, sgid;
	int rc;

	if (switched)
		*switched = false;
	if (!user || !*user)
		return 0;
	rc = lookup(user, &uid, &gid, name, sizeof(name), err, errlen);
	if (rc)
		return rc;
	if (geteuid() != 0 || getuid() != 0) {
		if (getuid() == uid && geteuid() == uid)
			return 0;
		return sw_seterr(err, errlen, -EPERM, "started as uid %u, not root: cannot switch "
				 "to user %s (uid %u); start as root or as that user",
				 (unsigned)geteuid(), name, (unsigned)uid);
	}
	if (uid == 0)
		return 0; /* user root: nothing to give up */
	if (initgroups(name, gid) != 0)
		return sw_seterr(err, errlen, -errno, "initgroups(%s): %s", name, strerror(errno));
	if (setresgid(gid, gid, gid) != 0)
		return sw_seterr(err, errlen, -errno, "setresgid(%u): %s", (unsigned)gid,
				 strerror(errno));
	if (setresuid(uid, uid, uid) != 0)
		return sw_seterr(err, errlen, -errno, "setresuid(%u): %s", (unsigned)uid,
				 strerror(errno));
	if (switched)
		*switched = true;
	/* verify: every id switched, and root cannot be taken back */
	if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0 ||
	    ruid != uid || euid != uid || suid != uid || rgid != gid || egid != gid ||
	    sgid != gid)
		return sw_seterr(err, errlen, -EPERM, "switching to user %s: ids not all "
				 "switched", name);
	if (setuid(0) == 0 || seteuid(0) == 0 || setgid(0) == 0)
		return sw_seterr(err, errlen, -EPERM, "switching to user %s: root could be "
				 "regained", name);
	return 0;
}
