/* daemon_dump.c - the block owner dump of `gpud serve` (MEM with
 * PROTO_MEM_DUMP_OWNERS): every KV block of every device and who holds it,
 * as JSON in a file under state_dir, written through a buffer reserved at
 * start (loop thread; open(2), no malloc). The files take GPUD_DUMPS_KEPT
 * names in turn (the time is inside), so dumps never pile up.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/daemon_impl.h"
#include "gpud/scheduler.h"

static void dump_flush(struct gpud_daemon *d)
{
	size_t off = 0;

	while (off < d->dump_len && !d->dump_failed) {
		ssize_t w = write(d->dump_fd, d->dump_buf + off, d->dump_len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			d->dump_failed = true;
		else
			off += (size_t)w;
	}
	d->dump_len = 0;
}

static void dump_put(struct gpud_daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void dump_put(struct gpud_daemon *d, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (DUMP_BUF - d->dump_len < 256)
		dump_flush(d);
	va_start(ap, fmt);
	n = vsnprintf(d->dump_buf + d->dump_len, DUMP_BUF - d->dump_len, fmt, ap);
	va_end(ap);
	if (n > 0)
		d->dump_len += (size_t)n < DUMP_BUF - d->dump_len ? (size_t)n : 0;
}

struct dump_ctx {
	struct gpud_daemon *d;
	bool first;
};

static void dump_block(void *arg, uint32_t block, const char *kind, uint64_t id)
{
	struct dump_ctx *c = arg;

	if (!strcmp(kind, "free"))
		dump_put(c->d, "%s{\"block\":%u,\"owner\":\"free\"}", c->first ? "" : ",", block);
	else
		dump_put(c->d, "%s{\"block\":%u,\"owner\":\"%s\",\"id\":%" PRIu64 "}",
			 c->first ? "" : ",", block, kind, id);
	c->first = false;
}

/* mkdir -p (0750); 0 or a negated errno. */
static int make_dirs(const char *path)
{
	char p[SW_CONFIG_PATH_MAX];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(p))
		return -ENAMETOOLONG;
	memcpy(p, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (p[i] != '/' && p[i] != '\0')
			continue;
		p[i] = '\0';
		if (mkdir(p, 0750) < 0 && errno != EEXIST)
			return -errno;
		p[i] = i < n ? '/' : '\0';
	}
	return 0;
}

int gpud__dump_owners(struct gpud_daemon *d, char *err, size_t errlen)
{
	time_t t = time(NULL);
	int rc = make_dirs(d->cfg.state_dir);

	if (rc)
		return sw_seterr(err, errlen, rc, "mem: cannot create %s: %s", d->cfg.state_dir,
				 strerror(-rc));
	snprintf(d->dump_path, sizeof(d->dump_path), "%s/gpud-blocks-%u.json", d->cfg.state_dir,
		 d->dumps++ % GPUD_DUMPS_KEPT);
	d->dump_fd = open(d->dump_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (d->dump_fd < 0)
		return sw_seterr(err, errlen, -errno, "mem: cannot write %s: %s", d->dump_path,
				 strerror(errno));
	d->dump_len = 0;
	d->dump_failed = false;
	dump_put(d, "{\"time\":%lld,\"block_bytes\":%" PRIu64 ",\"devices\":[", (long long)t,
		 d->kv_block_bytes);
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct dump_ctx c = { .d = d, .first = true };
		struct device *dv = &d->dev[i];

		dump_put(d, "%s{\"name\":\"%s\",\"kv\":[", i ? "," : "", dv->name);
		gpud_sched_block_owners(d->sched, i, dump_block, &c);
		pthread_mutex_lock(&dv->lock);
		uint32_t nj = dv->n_jobs;
		pthread_mutex_unlock(&dv->lock);
		dump_put(d, "],\"embeddings_queued\":%u}", nj);
	}
	dump_put(d, "]}\n");
	dump_flush(d);
	close(d->dump_fd);
	d->dump_fd = -1;
	if (d->dump_failed)
		return sw_seterr(err, errlen, -EIO, "mem: writing %s failed", d->dump_path);
	log_info("block owners written to %s", d->dump_path);
	return 0;
}
