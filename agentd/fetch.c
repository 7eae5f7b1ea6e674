/* fetch.c - http, https and file fetches with limits (libcurl). */
#include "agentd/fetch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/err.h"

#define DEFAULT_MAX_BYTES (8u << 20)

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

static int check_scheme(const char *url, char *err, size_t errlen)
{
	const char *sep = url ? strstr(url, "://") : NULL;
	size_t n = sep ? (size_t)(sep - url) : 0;

	if (!sep || n == 0)
		return sw_seterr(err, errlen, -EINVAL, "fetch: not a URL: \"%.64s\"", url ? url : "");
	if ((n == 4 && !strncasecmp(url, "http", 4)) || (n == 5 && !strncasecmp(url, "https", 5)) ||
	    (n == 4 && !strncasecmp(url, "file", 4)))
		return 0;
	return sw_seterr(err, errlen, -EINVAL,
			 "fetch: %.64s: unsupported scheme \"%.*s\" (expected http, https, file)",
			 url, (int)(n > 16 ? 16 : n), url);
}

/* Maps a finished transfer to 0 or an error code with a message. */
static int result(CURL *h, CURLcode cc, const struct sink *s, const char *url,
		  const char *curl_msg, const struct agent_fetch_opts *o, char *err, size_t errlen)
{
	long status = 0;

	if (s->over || cc == CURLE_FILESIZE_EXCEEDED)
		return sw_seterr(err, errlen, SW_ETOOLONG, "fetch: %s: larger than the limit of %zu bytes",
				 url, s->max);
	switch (cc) {
	case CURLE_OK:
		break;
	case CURLE_OPERATION_TIMEDOUT:
		return sw_seterr(err, errlen, -ETIMEDOUT, "fetch: %s: timed out: %s", url, curl_msg);
	case CURLE_COULDNT_CONNECT:
		return sw_seterr(err, errlen, -ECONNREFUSED, "fetch: %s: cannot connect: %s", url,
				 curl_msg);
	case CURLE_COULDNT_RESOLVE_HOST:
		return sw_seterr(err, errlen, -EHOSTUNREACH, "fetch: %s: cannot resolve host: %s",
				 url, curl_msg);
	case CURLE_TOO_MANY_REDIRECTS:
		return sw_seterr(err, errlen, -ELOOP, "fetch: %s: more than %u redirects", url,
				 o->no_redirects ? 0 : o->max_redirects);
	case CURLE_FILE_COULDNT_READ_FILE:
		return sw_seterr(err, errlen, SW_ENOTFOUND, "fetch: %s: cannot read file: %s", url,
				 curl_msg);
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
	CURLcode cc;
	CURL *h;
	int rc;

	if (body)
		*body = NULL;
	if (len)
		*len = 0;
	rc = check_scheme(url, err, errlen);
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

	h = curl_easy_init();
	if (!h)
		return sw_seterr(err, errlen, -ENOMEM, "fetch: cannot create a curl handle");
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, post ? "http,https" : "http,https,file");
	curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
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
	rc = result(h, cc, &s, url, curl_msg, &o, err, errlen);
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
