/* fetch.c - http, https and file fetches with limits (libcurl), inside
 * the policy of agentd.fetch: file:// below file_dirs only (read here,
 * not by libcurl, so the file opened is the file checked), and every
 * address libcurl connects to checked by its open-socket callback. */
#include "agentd/fetch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/config.h"
#include "common/err.h"

#define DEFAULT_MAX_BYTES (8u << 20)
#define ALLOW_HINT "allow it with agentd.fetch.allow_cidrs"

static const struct agent_fetch_policy default_policy; /* zeroed: deny */

struct sink {
	char *buf;
	size_t len, cap, max;
	bool over;
};

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
	struct sink *s = arg;
	size_t add = size * n;

	if (add > s->max - s->len) {
		s->over = true;
		return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
	}
	if (s->len + add + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 16384;
		char *b;

		while (cap < s->len + add + 1)
			cap *= 2;
		if (cap > s->max + 1)
			cap = s->max + 1;
		b = realloc(s->buf, cap);
		if (!b)
			return 0;
		s->buf = b;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, p, add);
	s->len += add;
	s->buf[s->len] = '\0';
	return add;
}

int agent_fetch_global_init(char *err, size_t errlen)
{
	CURLcode cc = curl_global_init(CURL_GLOBAL_DEFAULT);

	if (cc != CURLE_OK)
		return sw_seterr(err, errlen, -EIO, "fetch: libcurl initialization failed: %s",
				 curl_easy_strerror(cc));
	return 0;
}

bool agent_fetch_transient(int code)
{
	return code == -ETIMEDOUT || code == -ECONNREFUSED || code == -EHOSTUNREACH ||
	       code == -EAGAIN;
}

int agent_fetch_policy_init(struct agent_fetch_policy *p, const struct sw_config *cfg,
			    char *err, size_t errlen)
{
	const typeof(cfg->agentd.fetch) *f = &cfg->agentd.fetch;
	char msg[SW_ERR_MAX];

	memset(p, 0, sizeof(*p));
	for (uint32_t i = 0; i < f->n_file_dirs && i < SW_CONFIG_FETCH_DIRS_MAX; i++) {
		if (f->file_dirs[i][0] != '/')
			return sw_seterr(err, errlen, -EINVAL,
					 "agentd.fetch.file_dirs[%u]: expected an absolute path", i);
		snprintf(p->file_dirs[i], sizeof(p->file_dirs[i]), "%s", f->file_dirs[i]);
		p->n_file_dirs = i + 1;
	}
	for (uint32_t i = 0; i < f->n_allow_cidrs && i < SW_CONFIG_FETCH_CIDRS_MAX; i++) {
		if (sw_cidr_parse(f->allow_cidrs[i], &p->allow[i], msg, sizeof(msg)))
			return sw_seterr(err, errlen, -EINVAL, "agentd.fetch.allow_cidrs[%u]: %s", i,
					 msg);
		p->n_allow = i + 1;
	}
	return 0;
}

enum scheme { SCHEME_HTTP, SCHEME_FILE };

static int check_scheme(const char *url, bool post, enum scheme *kind, char *err, size_t errlen)
{
	const char *sep = url ? strstr(url, "://") : NULL;
	size_t n = sep ? (size_t)(sep - url) : 0;

	if (!sep || n == 0)
		return sw_seterr(err, errlen, -EINVAL, "fetch: not a URL: \"%.64s\"", url ? url : "");
	if ((n == 4 && !strncasecmp(url, "http", 4)) || (n == 5 && !strncasecmp(url, "https", 5))) {
		*kind = SCHEME_HTTP;
		return 0;
	}
	if (n == 4 && !strncasecmp(url, "file", 4)) {
		if (post)
			return sw_seterr(err, errlen, -EINVAL,
					 "fetch: %.64s: scheme not allowed here (expected http, https)",
					 url);
		*kind = SCHEME_FILE;
		return 0;
	}
	return sw_seterr(err, errlen, -EINVAL,
			 "fetch: %.64s: unsupported scheme \"%.*s\" (expected http, https, file)",
			 url, (int)(n > 16 ? 16 : n), url);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Refuses a host written as an IPv4 number in another form than a.b.c.d
 * (0x7f000001, 2130706433, 0177.0.0.1, 127.1): libcurl and the resolver
 * read it as an address, people never write it on purpose, and it is
 * the classic disguise of an internal address. The address rule below
 * would catch the address anyway; this names the trick. */
static int check_host(const char *url, char *err, size_t errlen)
{
	const char *h = strstr(url, "://") + 3, *end, *at;
	char host[256];
	struct in_addr a, b;
	size_t n;

	end = h + strcspn(h, "/?#");
	at = memchr(h, '@', (size_t)(end - h));
	while (at) { /* userinfo ends at the last '@' of the authority */
		h = at + 1;
		at = memchr(h, '@', (size_t)(end - h));
	}
	if (*h == '[')
		return 0; /* an IPv6 literal: one form only */
	n = strcspn(h, ":/?#");
	if (n == 0 || n >= sizeof(host))
		return 0;
	/* libcurl decodes %-escapes in a host name: so does this check. */
	for (size_t i = 0, o = 0;; i++) {
		int hi = i + 2 < n && h[i] == '%' ? hexval(h[i + 1]) : -1;
		int lo = hi < 0 ? -1 : hexval(h[i + 2]);

		if (i >= n) {
			host[o] = '\0';
			break;
		}
		if (lo >= 0) {
			host[o++] = (char)(hi * 16 + lo);
			i += 2;
		} else {
			host[o++] = h[i];
		}
	}
	if (inet_aton(host, &a) && inet_pton(AF_INET, host, &b) != 1) {
		char canon[INET_ADDRSTRLEN];

		inet_ntop(AF_INET, &a, canon, sizeof(canon)); /* not inet_ntoa: threads */
		return sw_seterr(err, errlen, -EINVAL,
				 "fetch: %s: host \"%s\" is an IPv4 address in a non-standard form "
				 "(write it as a.b.c.d: %s)",
				 url, host, canon);
	}
	return 0;
}

/* ---- file:// ------------------------------------------------------- */

/* The local path of a file URL, percent-decoded, into out[PATH_MAX]:
 * file:///p or file://localhost/p; the query and fragment are not part
 * of it. */
static int file_path(const char *url, char *out, char *err, size_t errlen)
{
	const char *p = url + 7, *slash = strchr(p, '/');
	size_t n = 0;

	if (!slash || (slash != p && !((size_t)(slash - p) == 9 && !strncasecmp(p, "localhost", 9))))
		return sw_seterr(err, errlen, -EINVAL,
				 "fetch: %s: a file URL names no host (file:///path)", url);
	for (p = slash; *p && *p != '?' && *p != '#'; p++) {
		int c = (unsigned char)*p;

		if (c == '%') {
			int hi = hexval(p[1]), lo = hi < 0 ? -1 : hexval(p[2]);

			if (lo < 0 || (hi == 0 && lo == 0))
				return sw_seterr(err, errlen, -EINVAL,
						 "fetch: %s: bad %%-escape in the path", url);
			c = hi * 16 + lo;
			p += 2;
		}
		if (n + 1 >= PATH_MAX)
			return sw_seterr(err, errlen, -EINVAL, "fetch: %.64s...: path too long", url);
		out[n++] = (char)c;
	}
	out[n] = '\0';
	return 0;
}

/* path lies in dir or below it, on whole components. */
static bool under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (n == 1 && dir[0] == '/')
		return path[0] == '/';
	return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* Collapses ".", ".." and repeated slashes of an absolute path, in place,
 * without touching the file system (to name a missing file's place). */
static void lexical_clean(char *path)
{
	char *out = path, *p = path;

	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		char *seg = p;
		size_t len = strcspn(seg, "/");

		p += len;
		if (len == 1 && seg[0] == '.')
			continue;
		if (len == 2 && seg[0] == '.' && seg[1] == '.') {
			while (out > path && *--out != '/')
				;
			continue;
		}
		*out++ = '/';
		memmove(out, seg, len);
		out += len;
	}
	if (out == path)
		*out++ = '/';
	*out = '\0';
}

/* The index of the directory of p that holds path (resolved), or -1.
 * Directories that do not exist (now) hold nothing. */
static int holding_dir(const struct agent_fetch_policy *p, const char *path)
{
	char dir[PATH_MAX];

	for (uint32_t i = 0; i < p->n_file_dirs; i++)
		if (realpath(p->file_dirs[i], dir) && under(path, dir))
			return (int)i;
	return -1;
}

static int refuse_file(const char *url, const char *path, char *err, size_t errlen)
{
	return sw_seterr(err, errlen, -EACCES,
			 "fetch: %s: %s is not under a directory of agentd.fetch.file_dirs", url,
			 path);
}

static int fetch_file(const char *url, const struct agent_fetch_policy *p, size_t max,
		      char **body, size_t *len, char *err, size_t errlen)
{
	char path[PATH_MAX], real[PATH_MAX], link[64], opened[PATH_MAX];
	struct stat st;
	size_t got = 0;
	char *buf;
	ssize_t r;
	int fd, rc;

	rc = file_path(url, path, err, errlen);
	if (rc)
		return rc;
	if (p->n_file_dirs == 0)
		return sw_seterr(err, errlen, -EACCES,
				 "fetch: %s: file:// is off (list the directories it may read in "
				 "agentd.fetch.file_dirs)",
				 url);
	if (!realpath(path, real)) {
		int e = errno;

		/* Where the file would be decides what may be said about it:
		 * outside the directories, not even whether it exists. */
		lexical_clean(path);
		if (holding_dir(p, path) < 0)
			return refuse_file(url, path, err, errlen);
		return sw_seterr(err, errlen, e == ENOENT || e == ENOTDIR ? SW_ENOTFOUND : -EIO,
				 "fetch: %s: cannot read file: %s", url, strerror(e));
	}
	if (holding_dir(p, real) < 0)
		return refuse_file(url, real, err, errlen);
	/* O_NONBLOCK: a FIFO must not hang the worker before it is refused. */
	fd = open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return sw_seterr(err, errlen, errno == ENOENT ? SW_ENOTFOUND : -EIO,
				 "fetch: %s: cannot read file: %s", url, strerror(errno));
	/* The file opened, not the name checked: a symlink swapped into
	 * the path since realpath() gains nothing. */
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	r = readlink(link, opened, sizeof(opened) - 1);
	if (r > 0) {
		opened[r] = '\0';
		if (holding_dir(p, opened) < 0) {
			rc = refuse_file(url, opened, err, errlen);
			goto out_close;
		}
	}
	if (fstat(fd, &st) < 0) {
		rc = sw_seterr(err, errlen, -EIO, "fetch: %s: %s", url, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = sw_seterr(err, errlen, -EINVAL, "fetch: %s: not a regular file", url);
		goto out_close;
	}
	if ((uint64_t)st.st_size > max) {
		rc = sw_seterr(err, errlen, SW_ETOOLONG,
			       "fetch: %s: larger than the limit of %zu bytes", url, max);
		goto out_close;
	}
	buf = malloc((size_t)st.st_size + 2);
	if (!buf) {
		rc = sw_seterr(err, errlen, -ENOMEM, "fetch: out of memory");
		goto out_close;
	}
	/* Up to one byte past the size: a file that grew is caught. */
	while (got < (size_t)st.st_size + 1) {
		r = read(fd, buf + got, (size_t)st.st_size + 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = sw_seterr(err, errlen, -EIO, "fetch: %s: cannot read file: %s", url,
				       strerror(errno));
			goto out_free;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	if (got > max) {
		rc = sw_seterr(err, errlen, SW_ETOOLONG,
			       "fetch: %s: larger than the limit of %zu bytes", url, max);
		goto out_free;
	}
	buf[got] = '\0';
	*body = buf;
	*len = got;
	close(fd);
	return 0;

out_free:
	free(buf);
out_close:
	close(fd);
	return rc;
}

/* ---- http(s): the address check ------------------------------------ */

/* The connection attempts since the last established connection: a hop
 * whose every attempt was refused failed for the policy, not the net. */
struct guard {
	const struct agent_fetch_policy *p;
	unsigned refused, allowed;
	char addr[SW_ADDR_STR_MAX];      /* the first refused one */
	enum sw_addr_class cls;
};

static curl_socket_t open_checked(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
	struct guard *g = arg;
	enum sw_addr_class cls = SW_ADDR_NOT_IP;

	if (purpose != CURLSOCKTYPE_IPCXN ||
	    !sw_addr_allowed(&a->addr, a->addrlen, g->p->allow, g->p->n_allow, &cls)) {
		if (g->refused++ == 0) {
			sw_addr_format(&a->addr, a->addrlen, g->addr, sizeof(g->addr));
			g->cls = cls;
		}
		return CURL_SOCKET_BAD; /* libcurl tries the next address, if any */
	}
	g->allowed++;
	return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* Called once a connection stands, before each request on it. */
static int connected(void *arg, char *primary_ip, char *local_ip, int primary_port,
		     int local_port)
{
	struct guard *g = arg;

	(void)primary_ip;
	(void)local_ip;
	(void)primary_port;
	(void)local_port;
	g->refused = g->allowed = 0;
	return CURL_PREREQFUNC_OK;
}

/* Maps a finished transfer to 0 or an error code with a message. */
static int result(CURL *h, CURLcode cc, const struct sink *s, const struct guard *g,
		  const char *url, const char *curl_msg, const struct agent_fetch_opts *o, char *err,
		  size_t errlen)
{
	char shown[SW_ERR_MAX / 2]; /* the URL without its password: errors reach logs and rows */
	long status = 0;

	const char *raw = url;

	sw_config_redact_url(raw, shown, sizeof(shown));
	url = shown;
	if (cc != CURLE_OK && g->refused && !g->allowed) {
		char *last = NULL, last_shown[SW_ERR_MAX / 4];

		curl_easy_getinfo(h, CURLINFO_EFFECTIVE_URL, &last);
		if (last && strcmp(last, raw)) {
			sw_config_redact_url(last, last_shown, sizeof(last_shown));
			return sw_seterr(err, errlen, -EACCES,
					 "fetch: %s: redirected to %s: %s is %s; " ALLOW_HINT, url,
					 last_shown, g->addr, sw_addr_class_name(g->cls));
		}
		return sw_seterr(err, errlen, -EACCES, "fetch: %s: %s is %s; " ALLOW_HINT, url,
				 g->addr, sw_addr_class_name(g->cls));
	}
	if (s->over || cc == CURLE_FILESIZE_EXCEEDED)
		return sw_seterr(err, errlen, SW_ETOOLONG, "fetch: %s: larger than the limit of %zu bytes",
				 url, s->max);
	switch (cc) {
	case CURLE_OK:
		break;
	case CURLE_OPERATION_TIMEDOUT:
		return sw_seterr(err, errlen, -ETIMEDOUT, "fetch: %s: timed out: %s", url, curl_msg);
	case CURLE_COULDNT_CONNECT:
		if (g->refused) /* some addresses refused, the allowed ones down */
			return sw_seterr(err, errlen, -ECONNREFUSED,
					 "fetch: %s: cannot connect: %s (%s not tried: %s)", url,
					 curl_msg, g->addr, sw_addr_class_name(g->cls));
		return sw_seterr(err, errlen, -ECONNREFUSED, "fetch: %s: cannot connect: %s", url,
				 curl_msg);
	case CURLE_COULDNT_RESOLVE_HOST:
		return sw_seterr(err, errlen, -EHOSTUNREACH, "fetch: %s: cannot resolve host: %s",
				 url, curl_msg);
	case CURLE_TOO_MANY_REDIRECTS:
		return sw_seterr(err, errlen, -ELOOP, "fetch: %s: more than %u redirects", url,
				 o->no_redirects ? 0 : o->max_redirects);
	case CURLE_UNSUPPORTED_PROTOCOL:
		return sw_seterr(err, errlen, -EINVAL, "fetch: %s: scheme not allowed here: %s", url,
				 curl_msg);
	case CURLE_OUT_OF_MEMORY:
		return sw_seterr(err, errlen, -ENOMEM, "fetch: %s: out of memory", url);
	default:
		return sw_seterr(err, errlen, -EIO, "fetch: %s: %s", url, curl_msg);
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	if (status == 404 || status == 410)
		return sw_seterr(err, errlen, SW_ENOTFOUND, "fetch: %s: HTTP %ld", url, status);
	if (status == 429 || status >= 500)
		return sw_seterr(err, errlen, -EAGAIN, "fetch: %s: HTTP %ld", url, status);
	if (status >= 300 && status < 400)
		return sw_seterr(err, errlen, -ELOOP, "fetch: %s: HTTP %ld redirect not followed", url,
				 status);
	if (status >= 400)
		return sw_seterr(err, errlen, -EIO, "fetch: %s: HTTP %ld", url, status);
	return 0;
}

static int transfer(const char *url, const struct agent_fetch_opts *opts, const char *post,
		    size_t post_len, char **body, size_t *len, char *err, size_t errlen)
{
	struct agent_fetch_opts o = opts ? *opts : (struct agent_fetch_opts){ 0 };
	char curl_msg[CURL_ERROR_SIZE] = "";
	struct curl_slist *hdrs = NULL;
	struct sink s = { 0 };
	struct guard g = { 0 };
	enum scheme kind = SCHEME_HTTP;
	CURLcode cc;
	CURL *h;
	int rc;

	if (body)
		*body = NULL;
	if (len)
		*len = 0;
	if (!o.policy)
		o.policy = &default_policy;
	g.p = o.policy;
	rc = check_scheme(url, post != NULL, &kind, err, errlen);
	if (rc)
		return rc;
	if (!o.max_bytes)
		o.max_bytes = DEFAULT_MAX_BYTES;
	if (!o.connect_timeout_ms)
		o.connect_timeout_ms = 5000;
	if (!o.timeout_ms)
		o.timeout_ms = 30000;
	if (!o.max_redirects && !o.no_redirects)
		o.max_redirects = 5;
	s.max = o.max_bytes;
	if (kind == SCHEME_FILE)
		return fetch_file(url, o.policy, o.max_bytes, body, len, err, errlen);
	rc = check_host(url, err, errlen);
	if (rc)
		return rc;

	h = curl_easy_init();
	if (!h)
		return sw_seterr(err, errlen, -ENOMEM, "fetch: cannot create a curl handle");
	/* The boundary fails closed: a libcurl that refuses one of these
	 * options (too old at run time) fetches nothing. */
	if (curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
	    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK ||
	    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_checked) != CURLE_OK ||
	    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, &g) != CURLE_OK ||
	    curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, connected) != CURLE_OK ||
	    curl_easy_setopt(h, CURLOPT_PREREQDATA, &g) != CURLE_OK ||
	    curl_easy_setopt(h, CURLOPT_PROXY, "") != CURLE_OK) { /* no proxy from the env */
		curl_easy_cleanup(h);
		return sw_seterr(err, errlen, -EIO,
				 "fetch: %s: libcurl %s lacks an option the address check needs "
				 "(7.85 or later is required)",
				 url, curl_version_info(CURLVERSION_NOW)->version);
	}
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, o.no_redirects ? 0L : 1L);
	curl_easy_setopt(h, CURLOPT_MAXREDIRS, (long)o.max_redirects);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)o.connect_timeout_ms);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)o.timeout_ms);
	curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)o.max_bytes);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_USERAGENT, "swarm-agentd/1");
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_msg);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
	if (post) {
		hdrs = curl_slist_append(NULL, "Content-Type: application/json");
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, post);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)post_len);
	}
	cc = curl_easy_perform(h);
	if (!curl_msg[0])
		snprintf(curl_msg, sizeof(curl_msg), "%s", curl_easy_strerror(cc));
	rc = result(h, cc, &s, &g, url, curl_msg, &o, err, errlen);
	curl_easy_cleanup(h);
	curl_slist_free_all(hdrs);
	if (rc == 0 && body) {
		if (!s.buf) /* an empty body is still a string */
			s.buf = calloc(1, 1);
		if (!s.buf)
			return sw_seterr(err, errlen, -ENOMEM, "fetch: out of memory");
		*body = s.buf;
		*len = s.len;
		return 0;
	}
	free(s.buf);
	return rc;
}

int agent_fetch(const char *url, const struct agent_fetch_opts *opts, char **body, size_t *len,
		char *err, size_t errlen)
{
	return transfer(url, opts, NULL, 0, body, len, err, errlen);
}

int agent_fetch_post_json(const char *url, const char *json, size_t len,
			  const struct agent_fetch_opts *opts, char *err, size_t errlen)
{
	return transfer(url, opts, json, len, NULL, NULL, err, errlen);
}
